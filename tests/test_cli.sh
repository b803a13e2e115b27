#!/bin/sh
# Every built benchmark and example answers its command line before it runs anything: --help and -h print
# the usage, naming the program, to stdout and exit 0; an unknown flag, and a flag with its value missing,
# print what is wrong and the usage to stderr and exit non-zero; a bad value (each `refuse` below) prints
# what is wrong to stderr, nothing to stdout, and exits 2 (not killed, not run). Nothing is measured or
# trained here: a program that starts its work instead is stopped by the timeout and fails. A program not
# built is SKIPPED.
BUILD=${BUILD:-build}
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
# try BIN ARGS...: runs it (at most 20 s), stdout in $out, stderr in $err, exit status in $rc
try() {
    timeout 20 ${DPAR_TEST_WRAPPER:-} "$@" >"$out" 2>"$err" </dev/null
    rc=$?
}
# check NAME WHAT COND: one PASS or FAIL line, the program's output under a FAIL
check() {
    if [ "$3" = 1 ]; then
        echo "PASS cli $1 $2"
    else
        echo "FAIL cli $1 $2: exit status $rc"
        sed 's/^/    /' "$out" "$err" | head -8
    fi
}
# refuse NAME PATTERN ARGS...: $BUILD/NAME given ARGS exits 2, prints PATTERN (grep) to stderr and
# nothing to stdout (it checked its whole command line before any output)
refuse() {
    n=$1; pat=$2; shift 2
    if [ ! -x "$BUILD/$n" ]; then
        echo "SKIPPED cli $n $*: $BUILD/$n is not built"
        return
    fi
    try "$BUILD/$n" "$@"
    ok=0; [ "$rc" -eq 2 ] && [ ! -s "$out" ] && grep -q -e "$pat" "$err" && ok=1
    check "$n" "$* (exit 2, '$pat' on stderr, nothing on stdout)" $ok
}
case "$BUILD" in *address*|*thread*) # CI's 45 minutes: the sanitizer suites run the library's own tests
    echo "SKIPPED cli under $BUILD: the command lines (the plain run covers them)"
    exit 0;;
esac
# every benchmark make builds (the examples come with make test); the MPI peer with mpicc, as bench/run.sh does
benches=$(ls bench/*.c | grep -v bench_mpi_allreduce | sed "s#bench/\(.*\)\.c#$BUILD/\1#")
# shellcheck disable=SC2086 # a list of targets
make -s BUILD="$BUILD" $benches >/dev/null || echo "FAIL cli: make $benches"
if command -v mpicc >/dev/null 2>&1; then
    mpicc -I. -O2 -Wall -Wextra -Werror bench/bench_mpi_allreduce.c -o "$BUILD/bench_mpi_allreduce" ||
        echo "FAIL cli: mpicc bench/bench_mpi_allreduce.c"
fi
# train_digits_mpi: train_digits.c built with mpicc (make test, where mpicc is)
for src in bench/*.c examples/*.c examples/*.cpp train_digits_mpi; do
    name=$(basename "$src"); name=${name%.*}
    bin="$BUILD/$name"
    if [ ! -x "$bin" ]; then
        echo "SKIPPED cli $name: $bin is not built (bench_mpi_allreduce, train_digits_mpi: no mpicc; the rest: make test builds them)"
        continue
    fi
    for h in --help -h; do
        try "$bin" $h
        ok=0; [ "$rc" -eq 0 ] && grep -q "^usage: $name " "$out" && [ ! -s "$err" ] && ok=1
        check "$name" "$h (usage naming $name on stdout, exit 0)" $ok
    done
    try "$bin" --no-such-flag 1
    ok=0
    [ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] && grep -q -- '--no-such-flag' "$err" && grep -q "usage: $name " "$err" && ok=1
    check "$name" "--no-such-flag 1 (named, usage on stderr, exit non-zero)" $ok
    # the first flag --help lists, given without its value
    try "$bin" --help
    help=$(cat "$out")
    flag=$(echo "$help" | sed -n 's/^  \(--[a-z0-9-]*\) .*/\1/p' | head -1)
    [ -n "$flag" ] || continue
    try "$bin" "$flag"
    ok=0
    [ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] && grep -q -- "missing after $flag" "$err" && grep -q 'usage: ' "$err" && ok=1
    check "$name" "$flag without its value (named, usage on stderr, exit non-zero)" $ok
    # the first string flag followed by a flag: refused, not taken as its value (the unknown flag after it
    # stops a parser that takes it before anything runs)
    sflag=$(echo "$help" | sed -n 's/^  \(--[a-z0-9-]*\) S .*/\1/p' | head -1)
    [ -z "$sflag" ] || refuse "$name" "$sflag needs a value; got the flag --help" "$sflag" --help --no-such-flag 1
    if echo "$help" | grep -q '^  --time '; then
        for t in inf nan -1 0 86400; do refuse "$name" "--time $t" --time $t; done
    fi
    if echo "$help" | grep -q '^  --min ' && echo "$help" | grep -q '^  --max '; then
        refuse "$name" "--max 4096 is below --min 8192" --min 8192 --max 4096
    fi
    if echo "$help" | grep -q '^  --backend '; then refuse "$name" "bogus" --backend bogus; fi
done
# the lists of the benchmarks, each item checked before the CSV header
refuse bench_collectives "'bogus' is not a collective; use allreduce" --ops allreduce,bogus
refuse bench_collectives "'0' is not a device count" --devices 2,0
refuse bench_matmul "'bogus' is not a shape; want MxNxK\\[:tn|:nt|:tt\\]" --shapes bogus
refuse bench_matmul "'64x64x64:xx' is not a shape" --shapes 64x64x64:xx
refuse bench_ops "'bogus' is not a dtype; use f32, f16" --dtypes bogus
refuse bench_ops "--only zzz: no op name contains it; the ops: .*matmul" --only zzz
refuse bench_ops "no op that --only takes has a row of those dtypes" --only attention --dtypes i32
# a path flag followed by a flag writes no file named "--help"
rm -f ./--help
refuse train_cnn "--checkpoint needs a value; got the flag --help" --checkpoint --help
ok=1; [ -e ./--help ] && ok=0 && rm -f ./--help
check train_cnn "--checkpoint --help wrote no file named --help" $ok
# a negative number is a value, not a flag: --seed -1 is taken (the unknown flag after it is what stops
# the run), --lr -1 reaches --lr's own check
refuse train_digits "unknown flag --no-such-flag" --seed -1 --no-such-flag 1
refuse train_digits "--lr -1: must be a finite number > 0" --lr -1
# more devices than a runtime takes (DPAR_MAX_DEVICES) is the flag's own error, not the batch's or the runtime's
refuse train_digits "--devices 300: must be <= 256" --devices 300 --batch 600
refuse train_gpt "--devices 257: must be <= 256" --devices 257
