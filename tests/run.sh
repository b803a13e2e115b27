#!/bin/sh
# Runs every test binary in the build folder ($1) and every tests/*.sh script,
# then prints one closing line: "N passed, N failed, N skipped".
# cmocka binaries are counted from their summary lines; a binary that dies
# without a summary counts as one failure. Scripts print "PASS name",
# "FAIL name" or "SKIPPED name: reason" lines.
BUILD=${1:-build}
pass=0; fail=0; skipn=0
log=$(mktemp)
for t in "$BUILD"/test_*; do
    [ -x "$t" ] || continue
    echo "=== $t"
    t0=$(date +%s)
    ${DPAR_TEST_WRAPPER:-} "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    echo "--- $t: $(($(date +%s) - t0)) s"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    if [ -z "$p$f$s" ]; then
        echo "FAIL $t: exited with $rc and printed no cmocka summary"
        fail=$((fail + 1))
        continue
    fi
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0})); skipn=$((skipn + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ -z "$f" ]; then echo "FAIL $t: exit status $rc"; fail=$((fail + 1)); fi
done
for sh in tests/*.sh; do
    [ "$sh" = tests/run.sh ] && continue
    [ -f "$sh" ] || continue
    echo "=== $sh"
    t0=$(date +%s)
    BUILD="$BUILD" sh "$sh" >"$log" 2>&1
    rc=$?
    cat "$log"
    echo "--- $sh: $(($(date +%s) - t0)) s"
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIPPED ' "$log")
    pass=$((pass + p)); fail=$((fail + f)); skipn=$((skipn + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $sh: exit status $rc"; fail=$((fail + 1)); fi
done
rm -f "$log"
echo "$pass passed, $fail failed, $skipn skipped"
[ "$fail" -eq 0 ]
