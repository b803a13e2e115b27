#!/bin/sh
# The GPT of examples/train_gpt.c side by side: dpar (1x1 and 2x2 meshes of CPU
# devices), JAX + flax + optax and PyTorch (1 device each), same data, initial
# weights, batches, AdamW and schedule (bench/peers/gpt_common.py).
#   1. step time, interleaved: GPT_ALTS rounds (default 5), each running
#      dpar 1x1, jax, dpar 2x2, torch in turn for GPT_TIME_STEPS steps (the
#      first of 3 logging blocks holds compilation and is dropped; the step time
#      is the median of the other two). Ratio dpar/peer per round; median, min-max.
#   2. validation loss after GPT_STEPS (1000) steps, for every seed of GPT_SEEDS,
#      of dpar (the example's 2x2 mesh) and of each peer (skipped with GPT_QUALITY=0).
# Rows go to bench/results/gpt_raw.csv (and to $GPT_RAW when set: bench/run.sh);
# bench/report.py --gpt turns them into bench/results/gpt.md and gpt.csv.
#   sh bench/peers/run_gpt.sh [BUILD_DIR]
#   GPT_ALTS=5 GPT_TIME_STEPS=15 GPT_STEPS=1000 GPT_SEEDS="42" GPT_PEERS="jax torch" GPT_QUALITY=1
#   GPT_TORCH_THREADS=1 (as a dpar device: one thread)   GPT_NO_PEERS=1 (dpar only: no venv)   GPT_REPORT_ONLY=1 (the tables again from gpt_raw.csv)
#   GPT_OWN_RAW=file (instead of gpt_raw.csv)   GPT_MD=0 (no gpt.md / gpt.csv: BENCH_QUICK)
# The peers come from PyPI into bench/.venv (bench/peers/venv.sh, once).
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/bench/results"
mkdir -p "$out"
cd "$root" || exit 1
log() { echo "bench/gpt: $*" >&2; }
raw=${GPT_OWN_RAW:-$out/gpt_raw.csv}
ALTS=${GPT_ALTS:-5}
TS=${GPT_TIME_STEPS:-15}
LE=$(((TS + 2) / 3)) # 3 logging blocks
STEPS=${GPT_STEPS:-1000}
py=""
if [ "${GPT_NO_PEERS:-0}" != 1 ]; then
    py=$(sh "$here/venv.sh" 2>>"$out/venv.log") || { log "no bench/.venv (see bench/results/venv.log): peers skipped"; py=""; }
fi
peers=${GPT_PEERS:-jax torch}
[ -n "$py" ] || peers=""
load1() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0; }
emit() { echo "$1" >> "$raw"; [ -n "${GPT_RAW:-}" ] && echo "$1" >> "$GPT_RAW"; return 0; }
# median ms/step of the logging blocks after the first, from train_gpt.c's (and the peers') progress lines
block_ms() { grep 'train_loss .* ms/step' "$1" | sed -n '2,$s/.*ms\/step \([0-9.]*\).*/\1/p' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
run() { # system mesh steps log_every seed eval_every val_batches logfile
    case $1 in
    dpar) dp=${2%x*}; tp=${2#*x}
        nice "$BUILD/train_gpt" --dp "$dp" --tp "$tp" --steps "$3" --log-every "$4" --seed "$5" --eval-every "$6" \
            --val-batches "$7" --gen 0 > "$8" 2>&1 ;;
    torch) nice timeout "${GPT_TIMEOUT_S:-3600}" "$py" bench/peers/gpt_torch.py --steps "$3" --log-every "$4" --seed "$5" \
            --eval-every "$6" --val-batches "$7" --threads "${GPT_TORCH_THREADS:-1}" > "$8" 2>&1 ;;
    *) nice timeout "${GPT_TIMEOUT_S:-3600}" "$py" "bench/peers/gpt_$1.py" --steps "$3" --log-every "$4" --seed "$5" \
            --eval-every "$6" --val-batches "$7" > "$8" 2>&1 ;;
    esac
}
val_row() { # system mesh seed logfile: a gptval row from the log's final line
    f=$(grep '^final:' "$4" 2>/dev/null | tail -1)
    n=$(echo "$f" | sed -n 's/.* steps=\([0-9]*\).*/\1/p')
    tl=$(echo "$f" | sed -n 's/.*train_loss=\([0-9.eE+-]*\).*/\1/p')
    vl=$(echo "$f" | sed -n 's/.*val_loss=\([0-9.eE+-]*\).*/\1/p')
    if [ -n "$vl" ]; then emit "gptval,$1,$2,$3,$n,$tl,$vl,$(block_ms "$4"),$(load1)"
    else log "$1 seed $3: no final line (see $4)"; emit "skip,gpt,$1 seed $3: no final line"; fi
}
mesh_of() { if [ "$1" = dpar ]; then echo 2x2; else echo 1; fi; }

if [ "${GPT_REPORT_ONLY:-0}" != 1 ]; then
    [ -x "$BUILD/train_gpt" ] || { log "$BUILD/train_gpt not built (make $BUILD/train_gpt)"; exit 1; }
    : > "$raw"
    emit "load,start,$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null | tr ' ' '/')"
    k=1
    while [ "$k" -le "$ALTS" ]; do
        for sys in dpar:1x1 $(echo "$peers" | cut -d' ' -f1) dpar:2x2 $(echo "$peers" | cut -s -d' ' -f2-); do
            s=${sys%%:*}; mesh=${sys#*:}; [ "$s" = dpar ] || mesh=1
            lf="$out/gpt_time.log"
            log "step time, round $k/$ALTS: $s $mesh, $TS steps (load $(load1))"
            l=$(load1)
            if run "$s" "$mesh" "$TS" "$LE" 42 0 1 "$lf" && ms=$(block_ms "$lf") && [ -n "$ms" ]; then
                emit "gptstep,$k,$s,$mesh,$ms,$l"
            else
                log "$s $mesh failed: $(tail -2 "$lf")"; emit "skip,gpt,$s $mesh step time failed"
            fi
        done
        k=$((k + 1))
    done
    if [ "${GPT_QUALITY:-1}" = 1 ]; then
        for seed in ${GPT_SEEDS:-42}; do
            for sys in dpar $peers; do
                mesh=$(mesh_of "$sys")
                lf="$out/gpt_${sys}_$seed.log"
                log "validation loss: $sys $mesh, seed $seed, $STEPS steps (load $(load1); long: see $lf)"
                run "$sys" "$mesh" "$STEPS" 50 "$seed" 250 20 "$lf"
                val_row "$sys" "$mesh" "$seed" "$lf"
            done
        done
    fi
    emit "load,end,$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null | tr ' ' '/')"
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
