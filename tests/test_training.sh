#!/bin/sh
# The main job's promises: with the defaults, test accuracy >= 0.95 and exactly
# one "final:" line; 1 device and 4 devices (same seed and global batch) give
# the same loss after every epoch to within 1e-5 relative.
BUILD=${BUILD:-build}
BIN="$BUILD/train_digits"
EPOCHS=${DPAR_TEST_EPOCHS:-30}
out1=$(mktemp); out4=$(mktemp)
trap 'rm -f "$out1" "$out4"' EXIT
if ! "$BIN" --devices 1 --epochs "$EPOCHS" >"$out1" 2>&1; then echo "FAIL train_digits --devices 1: exit status $?"; cat "$out1"; exit 1; fi
if ! "$BIN" --devices 4 --epochs "$EPOCHS" >"$out4" 2>&1; then echo "FAIL train_digits --devices 4: exit status $?"; cat "$out4"; exit 1; fi
tail -n 2 "$out4"
n=$(grep -c '^final:' "$out4")
[ "$n" -eq 1 ] && echo "PASS train_digits prints exactly one final: line" || echo "FAIL train_digits printed $n final: lines"
acc=$(sed -n 's/^final:.*test_accuracy=\([0-9.]*\).*/\1/p' "$out4")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.95) }' && echo "PASS train_digits test_accuracy $acc >= 0.95" || echo "FAIL train_digits test_accuracy '$acc' < 0.95"
worst=$(paste "$out1" "$out4" | awk '/^epoch/ { for (i = 1; i <= NF; i++) if ($i == "loss") { if (!a) a = $(i+1); else b = $(i+1) }
    r = (a - b) / a; if (r < 0) r = -r; if (r > w) w = r; n++; a = ""; b = "" } END { if (!n) print "none"; else printf "%.3g\n", w }')
echo "max relative loss difference 1 vs 4 devices over $EPOCHS epochs: $worst"
awk -v w="$worst" 'BEGIN { exit !(w != "none" && w + 0 <= 1e-5) }' && echo "PASS train_digits 1 vs 4 devices loss within 1e-5" || echo "FAIL train_digits 1 vs 4 devices loss differs by $worst (> 1e-5)"
