#!/bin/sh
# The seed CNN side by side: dpar (build/train_cnn, when built), JAX + flax +
# optax and PyTorch, same data, split, batches, initial weights, AdamW and
# device counts, interleaved per configuration so a busy spell on this shared
# machine hits every side alike. Writes bench/results/cnn.csv and cnn.md.
#   sh bench/peers/run_cnn.sh [BUILD_DIR]
#   CNN_EPOCHS=10  CNN_DEVICES="1 4"  CNN_SEEDS="42"  CNN_PEERS="dpar jax torch"  CNN_TIMEOUT_S=1800
# The peers come from PyPI into bench/.venv (bench/peers/venv.sh, once).
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/bench/results"
mkdir -p "$out"
cd "$root" || exit 1
EPOCHS=${CNN_EPOCHS:-10}
log() { echo "bench/cnn: $*" >&2; }
py=$(sh "$here/venv.sh" 2>>"$out/venv.log") || { log "no bench/.venv (see bench/results/venv.log): peers skipped"; py=""; }
csv="$out/cnn.csv"
echo "system,devices,seed,epochs,step_ms,samples_per_s,test_accuracy,train_loss,note" > "$csv"
row() { # system devices seed note log: one CSV row from the log's final: line (or its last epoch)
    lf=$5
    f=$(sed -n 's/^final: .*test_accuracy=\([0-9.]*\) train_loss=\([0-9.eE+-]*\)\( step_ms=\([0-9.]*\) samples_per_s=\([0-9.]*\)\)\{0,1\}.*/\1 \2 \4 \5/p' "$5" | tail -1)
    if [ -n "$f" ]; then
        set -- "$1" "$2" "$3" "$4" $f
        if [ -z "${8:-}" ]; then # no step time in the final line (dpar): the median epoch of 2..E
            sps=$(grep '^epoch' "$lf" | sed -n '2,$s/.*samples\/s \([0-9.]*\).*/\1/p' | sort -n |
                awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
            [ -n "$sps" ] && set -- "$1" "$2" "$3" "$4" "$5" "$6" "$(awk -v s="$sps" 'BEGIN { printf "%.3f", 64000 / s }')" "$sps"
        fi
        echo "$1,$2,$3,$EPOCHS,$7,$8,$5,$6,$4" >> "$csv"
    else
        e=$(grep -c '^epoch' "$5"); last=$(grep '^epoch' "$5" | tail -1)
        log "$1 on $2 device(s), seed $3: no final line (see $5)"
        echo "$1,$2,$3,$EPOCHS,,,$(echo "$last" | awk '{ print $6 "," $4 }'),no final line: stopped after $e epochs (timeout or error)" >> "$csv"
    fi
}
note() { # system devices
    case $1 in jax) echo "at most 2 steps in flight" ;; torch) [ "$2" -gt 1 ] && echo "DDP over gloo; $2 processes" ;; esac
}
[ "${CNN_REPORT_ONLY:-0}" = 1 ] && CNN_PEERS=none # the CSV and table again from the logs there
for seed in ${CNN_SEEDS:-42}; do
    for n in ${CNN_DEVICES:-1 4}; do
        for sys in ${CNN_PEERS:-dpar jax torch}; do
            log=$out/cnn_${sys}_$n.log
            [ "${CNN_REPORT_ONLY:-0}" = 1 ] && { for k in dpar jax torch; do
                [ -f "$out/cnn_${k}_$n.log" ] && row "$k" "$n" "$seed" "$(note "$k" "$n")" "$out/cnn_${k}_$n.log"; done; continue; }
            sleep "${BENCH_SETTLE_S:-3}"
            case $sys in
            dpar)
                [ -x "$BUILD/train_cnn" ] || { log "$BUILD/train_cnn not built: skipped"; continue; }
                log "dpar, $n device(s), seed $seed"
                "$BUILD/train_cnn" --devices "$n" --epochs "$EPOCHS" --seed "$seed" >"$out/cnn_dpar_$n.log" 2>&1; row dpar "$n" "$seed" "$(note dpar "$n")" "$out/cnn_dpar_$n.log" ;;
            jax)
                [ -n "$py" ] || continue
                log "jax, $n device(s), seed $seed"
                timeout "${CNN_TIMEOUT_S:-1800}" "$py" bench/peers/cnn_jax.py --devices "$n" --epochs "$EPOCHS" --seed "$seed" \
                    >"$out/cnn_jax_$n.log" 2>&1; row jax "$n" "$seed" "$(note jax "$n")" "$out/cnn_jax_$n.log" ;;
            torch)
                [ -n "$py" ] || continue
                log "torch, $n process(es), seed $seed"
                timeout "${CNN_TIMEOUT_S:-1800}" "$py" bench/peers/cnn_torch.py --devices "$n" --epochs "$EPOCHS" --seed "$seed" \
                    >"$out/cnn_torch_$n.log" 2>&1; row torch "$n" "$seed" "$(note torch "$n")" "$out/cnn_torch_$n.log" ;;
            esac
        done
    done
done
# cnn.md: the table, with the machine's load when it was measured (2 cores, shared)
{
    echo "# The seed CNN on 5,000 MNIST images: dpar and its peers"
    echo
    echo "Same data, split, batch order, initial weights (bench/peers/cnn_common.py = examples/mnist_common.h),"
    echo "AdamW lr 1e-3 wd 1e-4, global batch 64, $EPOCHS epochs of 62 steps. Step time: the median epoch of"
    echo "epochs 2..$EPOCHS over its steps (wall clock, feeding included). JAX keeps at most 2 steps in flight"
    echo "(XLA:CPU aborts in its all-reduce rendezvous with more queued on 4 devices / 2 cores)."
    echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(getconf _NPROCESSORS_ONLN) cores, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
    [ -n "${CNN_NOTE:-}" ] && { echo; echo "$CNN_NOTE"; }
    echo
    echo "| system | devices | seed | step ms | samples/s | test accuracy | train loss (last epoch) | note |"
    echo "|---|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $5, $6, $7, $8, $9 }' "$csv"
} > "$out/cnn.md"
cat "$out/cnn.md"
