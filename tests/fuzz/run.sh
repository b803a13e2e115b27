#!/bin/sh
# Runs each libFuzzer harness for $1 seconds (default 60): build-fuzz/fuzz_<name>
# on a scratch copy of its seed corpus tests/fuzz/corpus/<name>/ (the seeds
# stay as committed). The harnesses run side by side (each is one thread), so
# the wall clock is $1 seconds, not $1 per harness. Prints "PASS fuzz_<name>: ..."
# or "FAIL fuzz_<name>: ..." per harness (a crash leaves its input in
# build-fuzz/crash-*) and exits 1 on any failure.
# Usage: sh tests/fuzz/run.sh SECONDS NAME...  (or `make fuzz`).
secs=${1:-60}
shift
fail=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for n in "$@"; do
    mkdir "$work/$n"
    ( build-fuzz/fuzz_$n -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix=build-fuzz/ "$work/$n" "tests/fuzz/corpus/$n" >"build-fuzz/fuzz_$n.log" 2>&1
      echo $? >"$work/$n.rc" ) &
done
wait
for n in "$@"; do
    log=build-fuzz/fuzz_$n.log
    rc=$(cat "$work/$n.rc")
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ "$rc" -eq 0 ]; then
        echo "PASS fuzz_$n: ${runs:-?} inputs in ${secs} s, no crash, leak or undefined behaviour"
    else
        echo "FAIL fuzz_$n: exit status $rc after ${runs:-?} inputs; see $log"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -20
        fail=1
    fi
done
exit $fail
