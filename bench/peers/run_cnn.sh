#!/bin/sh
# The seed CNN side by side: dpar (build/train_cnn), JAX + flax + optax and
# PyTorch, same data, split, batches, initial weights and AdamW
# (bench/peers/cnn_common.py = examples/mnist_common.h), global batch 64.
#   1. step time, interleaved: CNN_ALTS rounds (default 5); each runs, for
#      every device count of CNN_DEVICES, dpar, JAX and PyTorch in turn for
#      CNN_STEP_EPOCHS epochs of 62 steps. The first epoch (compilation,
#      warm-up) is dropped: step time = the median of the other epochs'
#      training wall clock / 62; CPU time = user + system of the process tree
#      over the second epoch (from the first epoch line to the second), per
#      step: it holds that epoch's test evaluation too, 1,000 images forward,
#      in every system alike. (With 2 epochs the second line is the last, and
#      a run that exits within the 0.2 s poll after it has no CPU figure.)
#      Ratio dpar/peer per round and device count; median, min-max.
#   2. quality: CNN_EPOCHS epochs on CNN_QUALITY_DEVICES devices for every
#      seed of CNN_SEEDS, one log per run (cnn_<system>_<devices>_<seed>.log);
#      the test accuracy and last-epoch loss of every such log in
#      bench/results go to the table, with their mean over the seeds.
# Rows go to bench/results/cnn_raw.csv; bench/report.py --cnn turns them into
# cnn.md, cnn.csv (quality runs) and cnn_steps.csv (every round).
#   sh bench/peers/run_cnn.sh [BUILD_DIR]
#   CNN_ALTS=5 CNN_STEP_EPOCHS=3 CNN_DEVICES="1 2 4" CNN_PEERS="jax torch" CNN_TIMEOUT_S=1800
#   CNN_QUALITY=1 CNN_EPOCHS=10 CNN_QUALITY_DEVICES=4 CNN_SEEDS="42 43 44"
#   CNN_REPORT_ONLY=1 (no runs: the tables again from cnn_raw.csv's rounds and the logs)
#   CNN_NOTE="text" (a paragraph at the end of cnn.md)   CNN_OWN_RAW=file (instead of cnn_raw.csv)
# The peers come from PyPI into bench/.venv (bench/peers/venv.sh, once).
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/bench/results"
mkdir -p "$out"
cd "$root" || exit 1
tag=cnn
. "$here/common.sh"
raw=${CNN_OWN_RAW:-$out/cnn_raw.csv}
ALTS=${CNN_ALTS:-5}
SE=${CNN_STEP_EPOCHS:-3}
EPOCHS=${CNN_EPOCHS:-10}
SPE=62 # steps per epoch: 4,000 training images / batch 64
py=""
[ "${CNN_REPORT_ONLY:-0}" = 1 ] || peers_python
peers=${CNN_PEERS:-jax torch}
[ -n "$py" ] || peers=""
emit() { echo "$1" >> "$raw"; }
run() { # system devices epochs seed (output: stdout)
    case $1 in
    dpar) nice "$BUILD/train_cnn" --devices "$2" --epochs "$3" --seed "$4" ;;
    *) nice timeout "${CNN_TIMEOUT_S:-1800}" "$py" "bench/peers/cnn_$1.py" --devices "$2" --epochs "$3" --seed "$4" ;;
    esac
}
# ms/step of the epochs after the first (training only: every system times its epoch before evaluating)
epoch_ms() {
    grep '^epoch ' "$1" | sed -n '2,$s/.*samples\/s \([0-9.]*\).*/\1/p' | awk '$1 > 0 { print 64000 / $1 }' | median
}
val_row() { # logfile: a cnnval row from a quality run's final line (or its last epoch, when cut short)
    b=$(basename "$1" .log)
    sys=$(echo "$b" | cut -d_ -f2); n=$(echo "$b" | cut -d_ -f3); seed=$(echo "$b" | cut -d_ -f4)
    e=$(grep -c '^epoch ' "$1"); last=$(grep '^epoch ' "$1" | tail -1)
    if [ -z "$last" ]; then
        log "$sys $n seed $seed: no epoch finished (see $1)"; emit "skip,cnn,$sys $n seed $seed: no epoch"; return
    fi
    grep -q '^final:' "$1" || log "$sys $n seed $seed: no final line, stopped after $e epochs (see $1)"
    emit "cnnval,$sys,$n,$seed,$e,$(echo "$last" | awk '{ print $6 "," $4 }'),$(epoch_ms "$1")"
}

if [ "${CNN_REPORT_ONLY:-0}" != 1 ]; then
    [ -x "$BUILD/train_cnn" ] || { log "$BUILD/train_cnn not built (make $BUILD/train_cnn)"; exit 1; }
    : > "$raw"
    emit "load,start,$(loadavg)"
    k=1
    while [ "$k" -le "$ALTS" ]; do
        for n in ${CNN_DEVICES:-1 2 4}; do
            for s in dpar $peers; do
                lf="$raw.log"
                log "step time, round $k/$ALTS: $s on $n device(s), $SE epochs (load $(load1))"
                l=$(load1)
                if timed '^epoch ' 1 2 "$SPE" "$lf" run "$s" "$n" "$SE" 42 &&
                    ms=$(epoch_ms "$lf") && [ -n "$ms" ]; then
                    emit "cnnstep,$k,$s,$n,$ms,$l,$cpu"
                else
                    log "$s $n failed: $(tail -2 "$lf")"; emit "skip,cnn,$s $n step time failed"
                fi
            done
        done
        k=$((k + 1))
    done
    if [ "${CNN_QUALITY:-1}" = 1 ]; then
        n=${CNN_QUALITY_DEVICES:-4}
        for seed in ${CNN_SEEDS:-42 43 44}; do
            for s in dpar $peers; do
                log "quality: $s on $n device(s), seed $seed, $EPOCHS epochs (load $(load1))"
                run "$s" "$n" "$EPOCHS" "$seed" > "$out/cnn_${s}_${n}_$seed.log" 2>&1
            done
        done
    fi
    emit "load,end,$(loadavg)"
fi
# the quality rows, from every run's log there
[ -f "$raw" ] && grep -v '^cnnval,' "$raw" > "$raw.tmp"; mv -f "$raw.tmp" "$raw" 2>/dev/null || : > "$raw"
for lf in "$out"/cnn_*_*_*.log; do
    [ -f "$lf" ] && val_row "$lf"
done
rpy=${py:-python3}
[ -z "$py" ] && [ -x "$root/bench/.venv/bin/python" ] && rpy="$root/bench/.venv/bin/python"
CNN_EPOCHS=$EPOCHS "$rpy" bench/report.py --cnn "$raw" "$out"
