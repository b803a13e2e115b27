#!/bin/sh
# The GPT of examples/train_gpt.c side by side: dpar (1x1 and 2x2 meshes of CPU
# devices), JAX + flax + optax and PyTorch (1 device each), same data, initial
# weights, batches, AdamW and schedule (bench/peers/gpt_common.py).
#   1. step time, interleaved: GPT_ALTS rounds (default 5), each running
#      dpar 1x1, jax, dpar 2x2, torch in turn for GPT_TIME_STEPS steps (the
#      first of 3 logging blocks holds compilation and is dropped; the step time
#      is the median of the other two; the CPU time of the second block, every thread, beside it).
#      Ratio dpar/peer per round, of wall and of CPU time; median, min-max.
#   2. validation loss after GPT_STEPS (1000) steps, for every seed of GPT_SEEDS,
#      of dpar (the example's 2x2 mesh) and of each peer (skipped with GPT_QUALITY=0).
# Rows go to bench/results/gpt_raw.csv (and to $GPT_RAW when set: bench/run.sh);
# bench/report.py --gpt turns them into bench/results/gpt.md and gpt.csv.
#   sh bench/peers/run_gpt.sh [BUILD_DIR]
#   GPT_ALTS=5 GPT_TIME_STEPS=15 GPT_STEPS=1000 GPT_SEEDS="42 43 44" GPT_PEERS="jax torch" GPT_QUALITY=1
#   GPT_TORCH_THREADS=1 (as a dpar device: one thread)   GPT_NO_PEERS=1 (dpar only: no venv)   GPT_REPORT_ONLY=1 (the tables again from gpt_raw.csv)
#   GPT_APPEND=1 GPT_ROUND_FROM=6 (more rounds added to the rows there)   GPT_NOTE="text" (a paragraph at the end of gpt.md)   GPT_OWN_RAW=file (instead of gpt_raw.csv)   GPT_MD=0 (no gpt.md / gpt.csv: BENCH_QUICK)
# The peers come from PyPI into bench/.venv (bench/peers/venv.sh, once).
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/bench/results"
mkdir -p "$out"
cd "$root" || exit 1
tag=gpt
. "$here/common.sh"
raw=${GPT_OWN_RAW:-$out/gpt_raw.csv}
ALTS=${GPT_ALTS:-5}
TS=${GPT_TIME_STEPS:-15}
LE=$(((TS + 2) / 3)) # 3 logging blocks
STEPS=${GPT_STEPS:-1000}
py=""
[ "${GPT_NO_PEERS:-0}" = 1 ] || peers_python
peers=${GPT_PEERS:-jax torch}
[ -n "$py" ] || peers=""
emit() { echo "$1" >> "$raw"; [ -n "${GPT_RAW:-}" ] && echo "$1" >> "$GPT_RAW"; return 0; }
# median ms/step of the logging blocks after the first, from train_gpt.c's (and the peers') progress lines
block_ms() { grep 'train_loss .* ms/step' "$1" | sed -n '2,$s/.*ms\/step \([0-9.]*\).*/\1/p' | median; }
run() { # system mesh steps log_every seed eval_every val_batches (output: stdout)
    case $1 in
    dpar) dp=${2%x*}; tp=${2#*x}
        nice "$BUILD/train_gpt" --dp "$dp" --tp "$tp" --steps "$3" --log-every "$4" --seed "$5" --eval-every "$6" \
            --val-batches "$7" --gen 0 ;;
    torch) nice timeout "${GPT_TIMEOUT_S:-3600}" "$py" bench/peers/gpt_torch.py --steps "$3" --log-every "$4" --seed "$5" \
            --eval-every "$6" --val-batches "$7" --threads "${GPT_TORCH_THREADS:-1}" ;;
    *) nice timeout "${GPT_TIMEOUT_S:-3600}" "$py" "bench/peers/gpt_$1.py" --steps "$3" --log-every "$4" --seed "$5" \
            --eval-every "$6" --val-batches "$7" ;;
    esac
}
val_row() { # system mesh seed logfile: a gptval row from the log's final line (a run cut short:
    # from its last evaluation, the steps column says where it stopped)
    f=$(grep '^final:' "$4" 2>/dev/null | tail -1)
    n=$(echo "$f" | sed -n 's/.* steps=\([0-9]*\).*/\1/p')
    tl=$(echo "$f" | sed -n 's/.*train_loss=\([0-9.eE+-]*\).*/\1/p')
    vl=$(echo "$f" | sed -n 's/.*val_loss=\([0-9.eE+-]*\).*/\1/p')
    if [ -z "$vl" ] && grep -q 'val_loss' "$4" 2>/dev/null; then
        e=$(grep '^step .* val_loss ' "$4" | tail -1)
        n=$(echo "$e" | awk '{ print $2 }'); vl=$(echo "$e" | awk '{ print $4 }')
        tl=$(grep "^step *$n  train_loss " "$4" | awk '{ print $4 }' | tail -1)
        log "$1 seed $3: no final line, its last evaluation is at step $n (see $4)"
    fi
    if [ -n "$vl" ]; then emit "gptval,$1,$2,$3,$n,${tl:-nan},$vl,$(block_ms "$4"),$(load1)"
    else log "$1 seed $3: no final line (see $4)"; emit "skip,gpt,$1 seed $3: no final line"; fi
}
mesh_of() { if [ "$1" = dpar ]; then echo 2x2; else echo 1; fi; }

if [ "${GPT_REPORT_ONLY:-0}" != 1 ]; then
    [ -x "$BUILD/train_gpt" ] || { log "$BUILD/train_gpt not built (make $BUILD/train_gpt)"; exit 1; }
    [ "${GPT_APPEND:-0}" = 1 ] || : > "$raw"
    emit "load,start,$(loadavg)"
    k=${GPT_ROUND_FROM:-1}
    while [ "$k" -lt "$((${GPT_ROUND_FROM:-1} + ALTS))" ]; do
        for sys in dpar:1x1 $(echo "$peers" | cut -d' ' -f1) dpar:2x2 $(echo "$peers" | cut -s -d' ' -f2-); do
            s=${sys%%:*}; mesh=${sys#*:}; [ "$s" = dpar ] || mesh=1
            lf="$raw.log" # beside the rows: two runs with their own rows never share it
            log "step time, round $k/$ALTS: $s $mesh, $TS steps (load $(load1))"
            l=$(load1)
            # the CPU time of the second logging block
            if timed 'train_loss .* ms/step' 1 2 "$LE" "$lf" run "$s" "$mesh" "$TS" "$LE" 42 0 1 &&
                ms=$(block_ms "$lf") && [ -n "$ms" ]; then
                emit "gptstep,$k,$s,$mesh,$ms,$l,$cpu"
            else
                log "$s $mesh failed: $(tail -2 "$lf")"; emit "skip,gpt,$s $mesh step time failed"
            fi
        done
        k=$((k + 1))
    done
    if [ "${GPT_QUALITY:-1}" = 1 ]; then
        for seed in ${GPT_SEEDS:-42 43 44}; do
            for sys in dpar $peers; do
                mesh=$(mesh_of "$sys")
                lf="$out/gpt_${sys}_$seed.log"
                log "validation loss: $sys $mesh, seed $seed, $STEPS steps (load $(load1); long: see $lf)"
                run "$sys" "$mesh" "$STEPS" 50 "$seed" 250 20 > "$lf" 2>&1
                val_row "$sys" "$mesh" "$seed" "$lf"
            done
        done
    fi
    emit "load,end,$(loadavg)"
else # the step rows kept, the validation rows again from the logs gpt_<system>_<seed>.log
    [ -f "$raw" ] && grep -v '^gptval,' "$raw" > "$raw.tmp"; mv -f "$raw.tmp" "$raw" 2>/dev/null || : > "$raw"
    for lf in "$out"/gpt_*_*.log; do
        [ -f "$lf" ] || continue
        b=$(basename "$lf" .log); sys=$(echo "$b" | cut -d_ -f2); seed=$(echo "$b" | cut -d_ -f3)
        val_row "$sys" "$(mesh_of "$sys")" "$seed" "$lf"
    done
fi
rpy=${py:-python3}
[ -z "$py" ] && [ -x "$root/bench/.venv/bin/python" ] && rpy="$root/bench/.venv/bin/python"
[ "${GPT_MD:-1}" = 1 ] && "$rpy" bench/report.py --gpt "$raw" "$out"
exit 0
