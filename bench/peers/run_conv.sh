#!/bin/sh
# conv2d at the CNN's per-device shapes, dpar against PyTorch (issue 17: "conv2d
# forward + backward at the CNN's shapes: 1x PyTorch CPU or better, with 1 and 2
# threads"): CONV_ALTS rounds (default 5), each running build/bench_ops' conv2d rows
# (forward with bias, input gradient, kernel gradient; cnn1 28x28x1 -> 32 and cnn2
# 14x14x32 -> 64 on 16 images, 3x3 SAME) and bench/peers/conv_torch.py in turn,
# the order alternating per round, with 1 and with 2 threads. Both sides time
# CPU per working thread (bench_ops --clock cpu; the peer likewise), so a busy
# machine slows neither side's figure by the wait for a core. ratio = torch time
# / dpar time per round (above 1: dpar is faster); median, min-max.
# Writes bench/results/conv_raw.csv and conv.md.
#   sh bench/peers/run_conv.sh [BUILD_DIR]      CONV_ALTS=5 CONV_TIME=0.2 CONV_THREADS="1 2"
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/bench/results"
tag=conv
mkdir -p "$out"
cd "$root" || exit 1
. "$here/common.sh"
[ -x "$BUILD/bench_ops" ] || { log "$BUILD/bench_ops is not built (make bench)"; exit 1; }
peers_python
[ -n "$py" ] || exit 0
ALTS=${CONV_ALTS:-5}
T=${CONV_TIME:-0.2}
raw="$out/conv_raw.csv"
echo "round,threads,op,dpar_us,torch_us,load1" >"$raw"
load0=$(loadavg)
r=1
while [ "$r" -le "$ALTS" ]; do
    for th in ${CONV_THREADS:-1 2}; do
        d=$(mktemp) p=$(mktemp)
        dpar() { nice "$BUILD/bench_ops" --only conv2d --dtypes f32 --threads "$th" --alts 1 --time "$T" --clock cpu >"$d" 2>&1; }
        torch() { nice "$py" bench/peers/conv_torch.py --threads "$th" --time "$T" --clock cpu >"$p" 2>&1; }
        if [ $((r % 2)) = 1 ]; then dpar; torch; else torch; dpar; fi
        l=$(load1)
        # ops,backend,op,dtype,shape,threads,time_us,...  /  torchconv,op,threads,us
        awk -F, -v r="$r" -v th="$th" -v l="$l" 'NR == FNR { if ($1 == "torchconv") t[$2] = $4; next }
            $1 == "ops" && ($3 in t) { printf "%s,%s,%s,%s,%s,%s\n", r, th, $3, $7, t[$3], l }' "$p" "$d" >>"$raw"
        grep -q '^torchconv' "$p" || log "the torch peer printed no row: $(tail -1 "$p")"
        grep -q '^ops,' "$d" || log "bench_ops printed no row: $(tail -1 "$d")"
        rm -f "$d" "$p"
    done
    r=$((r + 1))
done
{
    echo "# conv2d at the CNN's per-device shapes: dpar against PyTorch"
    echo
    echo "\`sh bench/peers/run_conv.sh\`, $ALTS interleaved rounds, $(date -u +%Y-%m-%d\ %H:%M) UTC, load average $load0 at the start"
    echo "and $(loadavg) at the end (2 cores). Time per call, CPU per working thread (bench_ops --clock cpu; the peer"
    echo "likewise), f32, 16 images, 3x3 SAME stride 1: cnn1 28x28x1 -> 32, cnn2 14x14x32 -> 64. Forward with bias;"
    echo "the gradients one at a time (torch: aten.convolution_backward with one output each, NCHW)."
    echo "ratio = torch / dpar per round (above 1: dpar is faster), median (min-max); issue 17's target is 1 or more."
    echo "With 2 threads on a machine loaded beyond its cores, PyTorch's OpenMP workers spin while they wait for"
    echo "each other and the spinning counts as CPU time: the 2-thread ratios then overstate dpar's lead; take"
    echo "them from a run on an idle machine (load average below 1)."
    echo
    echo "| op | threads | dpar us | torch us | ratio (min-max) |"
    echo "|---|---|---|---|---|"
    tail -n +2 "$raw" | sort -t, -k3,3 -k2,2n | awk -F, '
        function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        function flush() { if (!n) return; lo = rr[1]; hi = rr[1]; for (i = 1; i <= n; i++) { if (rr[i] < lo) lo = rr[i]; if (rr[i] > hi) hi = rr[i] }
            printf "| %s | %s | %.1f | %.1f | %.2f (%.2f-%.2f) |\n", key3, key2, med(dd, n), med(tt, n), med(rr, n), lo, hi; n = 0 }
        { if ($3 != key3 || $2 != key2) { flush(); key3 = $3; key2 = $2 }
          n++; dd[n] = $4; tt[n] = $5; rr[n] = $5 / $4 }
        END { flush() }'
} >"$out/conv.md"
cat "$out/conv.md"
