#!/bin/sh
# Runs each demo of examples/ and checks the values it prints.
# Usage: BUILD=build sh tests/test_examples.sh   (after `make examples`)
# Prints one line per check: "PASS name" or "FAIL name: why"; exits 1 on any failure.
BUILD=${BUILD:-build}
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; failed=1; }

# run NAME ARGS...: runs $BUILD/NAME, output in $out, exit status in $rc
run() {
    bin="$BUILD/$1"; shift
    if [ ! -x "$bin" ]; then out=""; rc=127; return; fi
    out=$(${DPAR_TEST_WRAPPER:-} "$bin" "$@" 2>&1); rc=$?
}
# ran NAME: one check that the last run exited 0 (prints its output otherwise)
ran() {
    if [ "$rc" -eq 0 ]; then pass "$1 runs"; return 0; fi
    if [ "$rc" -eq 127 ] && [ ! -x "$bin" ]; then fail "$1 runs" "$bin is not built (make examples)"; return 1; fi
    if [ "$rc" -gt 128 ]; then why="killed by signal $((rc - 128))"; else why="exit status $rc"; fi
    fail "$1 runs" "$why"; [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/    /'; return 1
}
# has NAME LINE: the last run printed exactly LINE
has() {
    if printf '%s\n' "$out" | grep -qxF -- "$2"; then pass "$1"; else fail "$1" "no line '$2'"; fi
}
# has_all NAME PATTERN WORDS...: some line matches PATTERN and contains every WORD
has_all() {
    name=$1; line=$(printf '%s\n' "$out" | grep -F -- "$2" | head -1); shift 2
    if [ -z "$line" ]; then fail "$name" "no line with '$2'"; return; fi
    for w in "$@"; do
        case "$line" in *"$w"*) ;; *) fail "$name" "'$w' missing from: $line"; return ;; esac
    done
    pass "$name"
}

# ---- pmap_basics ------------------------------------------------------------
run pmap_basics
if ran pmap_basics; then
    has "pmap_basics doubles each device's slice" \
        "pmap(2*x) [4, 3] = [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18, 20, 22]]"
    has_all "pmap_basics error for 8 rows on 4 devices names 8 and 4" "error DPAR_ERR_SHAPE: dpar_pmap:" \
        "input 0" "leading dimension 8" "axis 'data' has 4 devices"
    has "pmap_basics shard_map device 0 gets 2 rows" "device 0: 2 rows, x = [[0, 1, 2], [3, 4, 5]] -> 2*x = [[0, 2, 4], [6, 8, 10]]"
    has "pmap_basics shard_map device 1 gets 2 rows" "device 1: 2 rows, x = [[6, 7, 8], [9, 10, 11]] -> 2*x = [[12, 14, 16], [18, 20, 22]]"
    has "pmap_basics shard_map device 2 gets 2 rows" "device 2: 2 rows, x = [[12, 13, 14], [15, 16, 17]] -> 2*x = [[24, 26, 28], [30, 32, 34]]"
    has "pmap_basics shard_map device 3 gets 2 rows" "device 3: 2 rows, x = [[18, 19, 20], [21, 22, 23]] -> 2*x = [[36, 38, 40], [42, 44, 46]]"
    has "pmap_basics shard_map gathers [8, 3]" \
        "gathered shard_map(2*x) [8, 3] = [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18, 20, 22], [24, 26, 28], [30, 32, 34], [36, 38, 40], [42, 44, 46]]"
fi

# ---- dp_regression: exact values, worked out by hand in examples/dp_regression.c
run dp_regression
if ran dp_regression; then
    has "dp_regression loss before is 63^2" "loss before the update: 3969.00"
    has "dp_regression gradient shape (64, 32)" "gradient shape: (64, 32), grad[0][0] = 3.9375"
    has "dp_regression w after SGD is 1 - 0.01 * 3.9375" "w[0][0] after one SGD step (lr 0.01): 0.960625"
    has "dp_regression loss after is 60.48^2" "loss after the update: 3657.83"
    has "dp_regression replicas identical" "replicas identical after the step: yes"
    has_all "dp_regression (128,) targets vs (128, 32) is a shape error" "error DPAR_ERR_SHAPE: dpar_mse:" "[128, 32]" "[128]"
fi
for n in 1 8; do  # same data on every device: the same step for any device count
    run dp_regression --devices $n
    ran "dp_regression --devices $n" || continue
    has "dp_regression --devices $n loss after is 60.48^2" "loss after the update: 3657.83"
    has "dp_regression --devices $n replicas identical" "replicas identical after the step: yes"
done

# ---- predict_update: ln(10) at zero weights, then the loss goes down every step
run predict_update
if ran predict_update; then
    first=$out
    has "predict_update loss at zero params is ln(10)" "loss before: 2.302585"
    why=$(printf '%s\n' "$out" | awk '
        function bad(why) { print why; failed = 1; exit }
        /^loss before: / { prev = $3 + 0; have = 1 }
        /^step [0-9]+: loss / { n++; v = $4 + 0
            if (n == 1 && v != prev) bad("step 1 loss " v " differs from the loss before " prev)
            if (n > 1 && !(v < prev)) bad("step " n " loss " v " is not below " prev)
            prev = v }
        /^loss after [0-9]+ steps: / { after = $5 + 0; done = 1
            if (!(after < prev)) bad("final loss " after " is not below " prev) }
        END { if (failed) exit
              if (!have) print "no loss before"; else if (n < 2) print "fewer than 2 steps"; else if (!done) print "no loss after" }')
    if [ -z "$why" ]; then pass "predict_update loss goes down every step"; else fail "predict_update loss goes down every step" "$why"; fi
    run predict_update
    if [ "$rc" -eq 0 ] && [ "$out" = "$first" ]; then pass "predict_update is deterministic"
    else fail "predict_update is deterministic" "a second run printed something else"; fi
fi

# ---- collectives_tour: every row of the three tables, against the closed form
run collectives_tour
if ran collectives_tour; then
    for axes in data model data,model; do
        why=$(printf '%s\n' "$out" | awk -v want="$axes" '
            function bad(why) { print why; failed = 1; exit }
            /^== over / { sec = $3; gsub(/\047/, "", sec); next }
            sec == want && /^ *[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ \|/ {
                d = $1; i = $2; m = $3; x = $4; rows++
                if (d != 4 * i + m || x != 10 * i + m) bad("row " d ": bad coordinates or x: " $0)
                if (want == "data")  { s = 10 + 2 * m; a = 5 + m;    mx = 10 + m; g = "[" m ", " 10 + m "]" }
                if (want == "model") { s = 40 * i + 6; a = 10 * i + 1.5; mx = 10 * i + 3
                                       g = "[" 10 * i ", " 10 * i + 1 ", " 10 * i + 2 ", " 10 * i + 3 "]" }
                if (want == "data,model") { s = 52; a = 6.5; mx = 13; g = "[0, 1, 2, 3, 10, 11, 12, 13]" }
                if ($6 != s || $7 != a || $8 != mx) bad("device " d ": psum/pmean/pmax " $6 "/" $7 "/" $8 ", want " s "/" a "/" mx)
                got = $0; sub(/^[^[]*/, "", got)
                if (got != g) bad("device " d ": all_gather " got ", want " g)
            }
            END { if (!failed && rows != 8) print "found " rows + 0 " rows over " want ", want 8" }')
        name="collectives_tour psum/pmean/pmax/all_gather over $axes"
        if [ -z "$why" ]; then pass "$name"; else fail "$name" "$why"; fi
    done
fi

# ---- --monitor: one line per device after each epoch, shares that fit the window
run train_digits --epochs 2 --monitor 1
if ran "train_digits --monitor 1"; then
    why=$(printf '%s\n' "$out" | awk '
        /^monitor: device / { n++; s = 0
            for (i = 1; i <= NF; i++) if ($i ~ /%$/) { v = $i; sub(/%/, "", v); v += 0; if (v < 0 || v > 100) bad = bad " " $0; s += v; sh[$(i - 1)] = v }
            if (s < 99) bad = bad " shares sum to " s ": " $0
            if (sh["compute"] + sh["transfer"] > 102) bad = bad " compute + transfer " sh["compute"] + sh["transfer"] ": " $0 }
        END { if (n != 8) print "want 8 monitor lines (2 epochs x 4 devices), got " n; else if (bad != "") print bad }')
    if [ -z "$why" ]; then pass "train_digits --monitor prints each device's time shares per epoch"
    else fail "train_digits --monitor prints each device's time shares per epoch" "$why"; fi
fi

# ---- bad input: a named error and a non-zero exit, never 0 steps, a NaN or a silent skip
# The refusal checks below end an example at an error exit that returns without freeing the data it
# loaded (as a C program may at exit); under ASan that would turn the expected status into
# LeakSanitizer's. The library's own leaks are checked by the C test binaries and the runs above.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# refused NAME STATUS WORDS...: the last run exited with STATUS, printed every WORD and no final: line
refused() {
    name=$1 want=$2; shift 2
    if [ "$rc" -eq 127 ] && [ ! -x "$bin" ]; then fail "$name" "$bin is not built (make examples)"; return; fi
    if [ "$rc" -ne "$want" ]; then
        fail "$name" "exit status $rc, wanted $want"; printf '%s\n' "$out" | tail -3; return
    fi
    if printf '%s\n' "$out" | grep -q '^final:'; then fail "$name" "printed a final: line"; return; fi
    for w in "$@"; do
        case "$out" in *"$w"*) ;; *) fail "$name" "'$w' missing from: $(printf '%s\n' "$out" | tail -1)"; return ;; esac
    done
    pass "$name"
}
for ex in train_digits train_digits_tp train_digits_zero1 train_digits_pipeline; do
    run $ex --batch 5000
    refused "$ex --batch 5000 (> 1438 training images) is refused" 2 "--batch 5000" "1438 training images"
    run $ex --lr 1e30 --epochs 1
    refused "$ex --lr 1e30 stops at the NaN loss, naming the step" 1 "training loss is" "at step 2 (epoch 1)"
done
# train_digits reads its logged losses every 32 steps: at --batch 8 (179 steps an epoch) the NaN of step 2 is
# found at step 32's read, mid-epoch, and still named by its own step
run train_digits --lr 1e30 --epochs 1 --batch 8
refused "train_digits --lr 1e30 --batch 8 names the first NaN step from a lagged read" 1 "at step 2 (epoch 1)"
run train_digits --lr -0.1
refused "train_digits --lr -0.1 is named with its limit" 2 "--lr -0.1: must be a finite number > 0"
# a number past its type is out of range, named as typed (was "not an integer" / "--lr inf"),
# with the flag's own range (was the whole int range for --epochs too)
run train_digits --epochs 99999999999
refused "train_digits --epochs 99999999999 is out of range, with the flag's range" 2 \
    "--epochs 99999999999: out of range; an integer from 1 to 2147483647"
run train_digits --epochs 0
refused "train_digits --epochs 0 is named with its limit" 2 "--epochs 0: must be >= 1"
run train_digits --seed 99999999999
refused "train_digits --seed 99999999999 is out of range, with the int range" 2 \
    "--seed 99999999999: out of range; an integer from -2147483648 to 2147483647"
run train_digits_tp --dp 2147483647 --tp 2 # dp x tp overflowed an int
refused "train_digits_tp --dp 2147483647 --tp 2 names the mesh's size" 2 "--dp 2147483647 x --tp 2 has 4294967294 devices"
run train_digits --lr 1e-50 # refused as "--lr 0"
refused "train_digits --lr 1e-50 (0 as a float) is named as typed" 2 "--lr 1e-50: too small for a float"
run train_digits --lr 1e40
refused "train_digits --lr 1e40 is too large, named as typed, with the flag's range" 2 \
    "--lr 1e40: too large for a float (at most 3.40282e+38); a finite number > 0"
for ex in dp_regression predict_update; do # they parsed with atoi: "--devices 2x" ran on 2 devices
    run $ex --devices 2x
    refused "$ex --devices 2x is not an integer" 2 "$ex: --devices 2x: not an integer"
    run $ex --devices 99999999999
    refused "$ex --devices 99999999999 is out of range" 2 "--devices 99999999999: must be <= 256"
done
for ex in train_digits train_digits_tp; do # was a crash: the weights' malloc went unchecked
    run $ex --hidden 100000000
    refused "$ex --hidden 100000000 is named with its limit" 2 "--hidden 100000000: must be <= 1048576"
done
run train_digits_zero1 --epochs 3 --checkpoint-epoch 4
refused "train_digits_zero1 --checkpoint-epoch beyond --epochs is refused" 2 "--checkpoint-epoch 4 is outside 0..3"
bad_csv=$(mktemp)
awk 'BEGIN { for (r = 1; r <= 6; r++) { l = ""
    for (j = 1; j <= 65; j++) l = l (j > 1 ? "," : "") (j < 65 ? j % 17 : r == 4 ? "x" : r % 10)
    print l } }' >"$bad_csv"
run train_digits --data "$bad_csv"
refused "train_digits --data with a malformed row names the line and field" 1 "line 4 field 65" "'x' is not a label"
awk 'BEGIN { for (r = 1; r <= 6; r++) { l = ""
    for (j = 1; j <= (r == 5 ? 60 : 65); j++) l = l (j > 1 ? "," : "") 1; print l } }' >"$bad_csv"
run train_digits --data "$bad_csv"
refused "train_digits --data with a short row says how many fields" 1 "line 5 has 60 field(s); want 65"
run engine_vulkan --data "$bad_csv"
refused "engine_vulkan --data with a short row says how many fields" 1 "line 5 has 60 field(s); want 65"
rm -f "$bad_csv"
run train_digits_pipeline --devices 4 # it said "2 stages use 2 devices (--devices 2)", not the value given
refused "train_digits_pipeline --devices 4 is named with the count it takes" 2 \
    "--devices 4: the 2 pipeline stages take 2 devices; use --devices 2"
run engine_vulkan --data "$(dirname "$0")/no-such-file.csv" # it gave no reason, as the C examples do
refused "engine_vulkan --data of a missing file says why" 1 "no-such-file.csv': No such file or directory"
run engine_vulkan --steps 1 # step 1's loss is before its update: it exited 1 with no message
refused "engine_vulkan --steps 1 is named with its limit" 2 "--steps 1: must be >= 2"
run engine_vulkan --devices 3 # was the feed's shape error from inside the graph, after the Vulkan setup
refused "engine_vulkan --devices 3 names the batch it must divide" 2 "--devices 3 must divide the batch of 64 rows"
run engine_vulkan --step 3
refused "engine_vulkan names an unknown flag and lists the flags" 2 "unknown flag --step" "[--steps N]"
for ex in train_digits train_digits_tp train_digits_zero1 train_digits_pipeline; do # train_cnn and train_gpt refused it
    run $ex --lr 0
    refused "$ex --lr 0 is refused as train_gpt refuses it" 2 "$ex: --lr 0: must be a finite number > 0"
done
run train_digits --data "$(dirname "$0")" # zlib called a directory corrupt gzip data
refused "train_digits --data DIR says it is a directory" 1 "--data $(dirname "$0") is a directory"
bad_csv=$(mktemp)
printf '1,2,\037\213\001\377%s,3\n' "$(printf 'x%.0s' 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25)" \
    >"$bad_csv" # binary bytes, then more than the 20 an excerpt shows
run train_digits --data "$bad_csv"
refused "train_digits --data with binary bytes escapes and cuts them" 1 \
    "line 1 field 3: '\x1f\x8b\x01\xffxxxxxxxxxxxxxxxx...' is not a pixel"
if printf '%s\n' "$out" | LC_ALL=C grep -q '[^ -~]'; then fail "train_digits --data binary: the error holds raw bytes" \
    "$(printf '%s\n' "$out" | od -c | head -3)"; fi
printf '1,2\0003\n' >"$bad_csv" # a NUL byte ended the line early: "longer than 8191 characters"
run train_digits --data "$bad_csv"
refused "train_digits --data with a NUL byte says so" 1 "line 1 holds a NUL byte after '1,2'"
rm -f "$bad_csv"
for ex in train_digits train_digits_tp train_digits_zero1 train_digits_pipeline; do # it printed "backend="
    run $ex --backend "" --epochs 1
    if printf '%s\n' "$out" | grep -qE '^final: backend=(cpu|vulkan|cuda) '; then pass "$ex --backend '' names the backend that ran"
    else fail "$ex --backend '' names the backend that ran" "$(printf '%s\n' "$out" | tail -1)"; fi
done
big_csv=$(mktemp) # 3,594 rows: the rows past the 2,048 it reads were dropped without a word
gzip -dc "$(dirname "$0")/../examples/data/digits.csv.gz" "$(dirname "$0")/../examples/data/digits.csv.gz" >"$big_csv"
run train_digits --epochs 1 --data "$big_csv"
has_all "train_digits --data with more rows than it reads says so" "note:" "holds more than 2048 rows" \
    "reads the first 2048"
rm -f "$big_csv"
run dp_regression --devices 1
has_all "dp_regression --devices 1 says 1 device" "backend " "of 1 device"
case "$out" in *"1 devices"*) fail "dp_regression --devices 1 grammar" "printed '1 devices'" ;; esac
# ZeRO-1's checkpoint file: an unwritable $TMPDIR failed after epoch E's training, an empty one wrote into /
out=$(TMPDIR=/nonexistent/dir ${DPAR_TEST_WRAPPER:-} "$BUILD/train_digits_zero1" --epochs 2 --checkpoint-epoch 2 2>&1); rc=$?
refused "train_digits_zero1 --checkpoint-epoch with an unwritable \$TMPDIR is refused before training" 2 \
    "cannot write in directory /nonexistent/dir"
case "$out" in *"epoch   1"*) fail "train_digits_zero1 unwritable \$TMPDIR" "trained before refusing" ;; esac
out=$(TMPDIR='' ${DPAR_TEST_WRAPPER:-} "$BUILD/train_digits_zero1" --epochs 1 --checkpoint-epoch 1 2>&1); rc=$?
has_all "train_digits_zero1 with an empty \$TMPDIR saves in /tmp" "checkpoint: saved" "saved after epoch 1 to /tmp/dpar_zero1_"
# ZeRO-1's checkpoint after epoch 1: its counter is the epoch (it said "step 1")
run train_digits_zero1 --epochs 1 --checkpoint-epoch 1
has_all "train_digits_zero1 labels the checkpoint's counter an epoch" "checkpoint: saved after epoch 1" \
    "restored into wiped state (epoch 1)"

# ---- --help: every example's flags, values and defaults on stdout, exit 0; a bad flag: stderr, exit 2
# help NAME: runs NAME --help; $hout its stdout, $herr its stderr, $rc its status
help() {
    bin="$BUILD/$1"; herr=$(mktemp)
    hout=$(${DPAR_TEST_WRAPPER:-} "$bin" --help 2>"$herr"); rc=$?
    herr_text=$(cat "$herr"); rm -f "$herr"
}
# readme_flags NAME: the flags README.md's example table names in NAME's row, sorted, one a line
readme_flags() {
    grep -F "| \`$1\` |" "$(dirname "$0")/../README.md" | grep -o -- '--[a-z][a-z-]*' | sort -u
}
for ex in pmap_basics dp_regression predict_update collectives_tour train_digits train_digits_zero1 \
    train_digits_tp train_digits_pipeline train_cnn train_gpt engine_vulkan; do
    if [ ! -x "$BUILD/$ex" ]; then
        if [ "$ex" = engine_vulkan ]; then echo "SKIPPED $ex --help: not built (a Vulkan build builds it)"; continue; fi
        fail "$ex --help" "$BUILD/$ex is not built (make examples)"; continue
    fi
    help $ex
    flags=$(printf '%s\n' "$hout" | sed -n 's/^  \(--[a-z-]*\) .*/\1/p')
    nodef=$(printf '%s\n' "$hout" | grep '^  --' | grep -v '(default ')
    if [ "$rc" -eq 0 ] && [ -z "$herr_text" ] && [ -n "$flags" ] && [ -z "$nodef" ] &&
        printf '%s\n' "$hout" | grep -q "^usage: $ex "; then
        pass "$ex --help: every flag with its values and default on stdout, exit 0"
    else fail "$ex --help" "exit status $rc, stderr '$herr_text', lines without a default: '$nodef'"; fi
    hf=$(mktemp); rf=$(mktemp)
    printf '%s\n' "$flags" | sort -u >"$hf"; readme_flags $ex >"$rf"
    diff_out=$(diff "$hf" "$rf" | grep '^[<>]'); rm -f "$hf" "$rf"
    if [ -z "$diff_out" ]; then pass "$ex: README's flag list is its --help's"
    else fail "$ex: README's flag list differs from --help (<: --help only, >: README only)" "$(echo $diff_out)"; fi
    run $ex --no-such-flag 1
    if [ "$rc" -eq 2 ] && printf '%s\n' "$out" | grep -q "unknown flag --no-such-flag" &&
        [ -z "$(${DPAR_TEST_WRAPPER:-} "$BUILD/$ex" --no-such-flag 1 2>/dev/null)" ]; then
        pass "$ex: a bad flag exits 2 with the usage on stderr"
    else fail "$ex: a bad flag" "exit status $rc: $(printf '%s\n' "$out" | tail -1)"; fi
done
help cpp_example # it ignored its arguments: --help ran the program
if [ "$rc" -eq 0 ] && [ -z "$herr_text" ] && printf '%s\n' "$hout" | grep -q "^usage: cpp_example " &&
    ! printf '%s\n' "$hout" | grep -q "^device 0:"; then pass "cpp_example --help: its usage on stdout, exit 0"
else fail "cpp_example --help" "exit status $rc: $(printf '%s\n' "$hout" | head -1)"; fi
run cpp_example --devices 2
refused "cpp_example names a flag it does not take" 2 "cpp_example: unknown flag --devices (it takes no flags)"
run engine_vulkan --budget-ms 0
refused "engine_vulkan --budget-ms 0 is named with its limit" 2 "--budget-ms 0: must be a finite number > 0"

exit $failed
