#!/bin/sh
# `make bench`: dpar against the limits of this machine and against its peers,
# measured in one run. Writes bench/results/{collectives.csv,matmul.csv,
# train.csv,results.md,*.png}, the GPT's gpt.md / gpt.csv (bench/peers/run_gpt.sh;
# not in a quick run), conv2d against PyTorch in conv.md (bench/peers/run_conv.sh;
# not in a quick run), the CNN against JAX and PyTorch in cnn.md (bench/peers/run_cnn.sh;
# not in a quick run) and ends with one line "summary: ...".
#   sh bench/run.sh BUILD_DIR
#   BENCH_QUICK=1   a quick run (about a minute: fewer sizes, shapes and device counts),
#                   written to bench/results/quick/ (ignored by git)
#   BENCH_NO_JAX=1  skip the JAX peer, the GPT, conv and CNN peers (and the venv they need)
#   BENCH_ALTS=N    alternations per ratio (default 5)
#   DPAR_TRACE=f.json is passed through to the dpar benchmarks.
# The JAX peer and matplotlib go into bench/.venv (PyPI, created on first use);
# OpenBLAS is Debian's libopenblas0-pthread (the matmul rows are skipped without it).
# Exit status 1 when a figure is above 100% of its limit: the measurement is broken.
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
quick=${BENCH_QUICK:-0}
out="$here/results"
# a quick run's figures are a smoke check: they go beside the committed full run's, not over them
if [ "$quick" = 1 ]; then out="$here/results/quick"; fi
mkdir -p "$out"
raw="$out/raw.tmp"
: > "$raw"
ALTS=${BENCH_ALTS:-5}
broken=0
log() { echo "bench: $*" >&2; }
# A process that just freed gigabytes (JAX, the large collectives) leaves the
# kernel reclaiming for a few seconds, which halves the next measurement on a
# 2-core machine (measured: 620 ms -> 313 ms for the large MLP step after a
# 5 s pause). Every measurement starts after a pause.
settle() { sleep "${BENCH_SETTLE_S:-4}"; }
# runs "$@", appends its rows (header dropped) to $raw; exit status 3 = above the limit
rows() {
    tmp="$out/rows.tmp"
    "$@" > "$tmp"
    st=$?
    grep -v '^kind,' "$tmp" >> "$raw"
    rm -f "$tmp"
    [ "$st" = 3 ] && broken=1
    return $st
}

if [ "$quick" = 1 ]; then
    : "${BENCH_SETTLE_S:=0}"
    : "${BENCH_NO_JAX:=1}" # JAX's start-up alone would take the minute; BENCH_NO_JAX=0 brings it back
    CMIN=4096; CMAX=16777216; CF=16; CT=0.1; CDEV=2,4; VDEV=2; VMAX=1048576; PMIN=1048576; PDEV=2
    MSHAPES=64x128x64,64x128x64:tn,16x256x3136,1818x64x288,16x384x128; LSHAPES=512x1024x1024; MT=0.3
    TDEV=2; TTIME=0.3; LARGE=1024,2048,2048,10; LBATCH=256; LSTEPS=2; JSTEPS=30; GROUNDS=5; GTIME=0.05
    OTIME=0.01; OBACKENDS=cpu; ODTYPES=f32 # the full run adds f16, bf16, i32 and Vulkan
else
    CMIN=4096; CMAX=67108864; CF=4; CT=0.4; CDEV=2,4,8; VDEV=2,4; VMAX=67108864; PMIN=1048576; PDEV=2,4,8
    MSHAPES=64x128x64,64x128x64:tn,64x64x128:nt,64x10x128,16x256x3136,3136x256x16:tn,16x3136x256:nt,1818x64x288
    MSHAPES=$MSHAPES,288x64x1818:tn,1818x288x64:nt,12544x32x9,16x384x128,16x128x384:nt,16x512x128,16x128x512
    LSHAPES=512x4096x4096,512x1024x1024; MT=1
    TDEV=1,2,4; TTIME=2; LARGE=1024,4096,4096,10; LBATCH=512; LSTEPS=6; JSTEPS=300; GROUNDS=11; GTIME=0.3
    OTIME=0.3; OBACKENDS="cpu vulkan"; ODTYPES=""
fi
cd "$root" || exit 1
log "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
echo "load,start,$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null | tr ' ' '/')" >> "$raw"

# ---- collectives against the stream limit (interleaved inside bench_collectives)
log "collectives: dpar cpu, $CDEV devices, $CMIN..$CMAX bytes, $ALTS alternations with the stream kernel per point"
rows "$BUILD/bench_collectives" --backend cpu --devices "$CDEV" --min $CMIN --max $CMAX --factor $CF --time $CT \
    --alts "$ALTS" || log "bench_collectives (cpu) failed or hit the limit"
settle; log "collectives: dpar vulkan all-reduce (skipped when no Vulkan device)"
rows "$BUILD/bench_collectives" --backend vulkan --devices "$VDEV" --ops allreduce --min $CMIN --max $VMAX --factor $CF \
    --time $CT --alts 3 2>/dev/null || log "bench_collectives (vulkan) failed or hit the limit"

# ---- all-reduce: dpar and Open MPI interleaved, ALTS alternations per device count
have_mpi=0
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    mpicc -I. -O2 -Wall -Wextra -Werror bench/bench_mpi_allreduce.c -o "$BUILD/bench_mpi_allreduce" && have_mpi=1 || log "mpicc failed"
fi
[ "$have_mpi" = 1 ] || { log "no mpicc/mpirun: the MPI peer is skipped"; echo "skip,mpi,no mpicc/mpirun" >> "$raw"; }
if [ "$have_mpi" = 1 ]; then
    for n in $(echo "$PDEV" | tr ',' ' '); do
        settle; log "all-reduce: dpar vs MPI_Allreduce, $n devices/ranks, $ALTS alternations"
        k=1
        while [ "$k" -le "$ALTS" ]; do
            "$BUILD/bench_collectives" --backend cpu --devices "$n" --ops allreduce --min $PMIN --max $CMAX --factor $CF \
                --time $CT --alts 1 2>/dev/null | grep '^coll,' | sed "s/^coll,/pair,$k,/" >> "$raw"
            timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$n" "$BUILD/bench_mpi_allreduce" \
                --min $PMIN --max $CMAX --factor $CF --time $CT --trials 1 2>/dev/null | grep '^coll,' \
                | sed "s/^coll,/pair,$k,/" >> "$raw" || log "mpirun -np $n failed"
            k=$((k + 1))
        done
    done
fi

# ---- matmul: dpar against OpenBLAS sgemm, interleaved inside bench_matmul
settle; log "matmul: per-device shapes of the digits/CNN/GPT jobs, 1 thread, vs OpenBLAS"
rows "$BUILD/bench_matmul" --shapes "$MSHAPES" --threads 1 --time $MT --alts "$ALTS" || log "bench_matmul failed"
settle; log "matmul: large shapes, 2 threads, vs OpenBLAS"
rows "$BUILD/bench_matmul" --shapes "$LSHAPES" --threads 2 --time $MT --alts "$ALTS" || log "bench_matmul (large) failed"

# ---- ops: every op at the CNN's and GPT's per-device shapes against its limits
# (stream kernel; OpenBLAS sgemm for matmul, conv, attention), interleaved inside
# bench_ops. Vulkan here is llvmpipe: it computes on the same CPU cores.
for b in $OBACKENDS; do
    settle; log "ops: every op and dtype, $b backend, $ALTS alternations with its limits per row"
    rows "$BUILD/bench_ops" --backend $b --threads 1 --time $OTIME --alts "$ALTS" ${ODTYPES:+--dtypes $ODTYPES} \
        || log "bench_ops ($b) failed or hit the limit"
done

# ---- training: dpar and the JAX peer, interleaved per configuration (so a
# busy spell on this shared machine hits both sides alike)
py=""
if [ "${BENCH_NO_JAX:-0}" != 1 ]; then
    py=$(sh "$here/venv.sh" 2>>"$out/venv.log") || { log "could not set up bench/.venv (see bench/results/venv.log): JAX peer skipped"; py=""; }
fi
[ -n "$py" ] || echo "skip,jax,no venv" >> "$raw"
ncpu=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
jax_run() { # name layers batch devices steps
    # XLA:CPU's collectives stall (its rendezvous times out after 40 s) when
    # there are more devices than cores and dispatch is asynchronous: there,
    # and as a fallback, the peer runs with synchronous dispatch (noted).
    if [ "$4" -gt "$ncpu" ]; then
        line=$(JAX_PEER_SYNC_DISPATCH=1 timeout 300 "$py" bench/jax_peer.py --name "$1" --layers "$2" --batch "$3" --devices "$4" --steps "$5" 2>/dev/null | grep '^train,')
        [ -n "$line" ] && { echo "$line,sync-dispatch" >> "$raw"; return; }
    fi
    line=$(timeout 300 "$py" bench/jax_peer.py --name "$1" --layers "$2" --batch "$3" --devices "$4" --steps "$5" 2>/dev/null | grep '^train,')
    if [ -z "$line" ]; then
        line=$(JAX_PEER_SYNC_DISPATCH=1 timeout 300 "$py" bench/jax_peer.py --name "$1" --layers "$2" --batch "$3" --devices "$4" --steps "$5" 2>/dev/null | grep '^train,')
        [ -n "$line" ] && line="$line,sync-dispatch"
    fi
    if [ -n "$line" ]; then echo "$line" >> "$raw"; else log "JAX $1 on $4 devices failed"; echo "skip,jax,$1 $4 devices failed" >> "$raw"; fi
}
for n in $(echo "$TDEV" | tr ',' ' '); do
    settle; log "training: digits MLP 64-128-10 batch 64, $n device(s): dpar, then JAX"
    "$BUILD/bench_train" --name digits --layers 64,128,10 --batch 64 --devices "$n" --time $TTIME >> "$raw" || log "bench_train digits failed"
    [ -n "$py" ] && { settle; jax_run digits 64,128,10 64 "$n" $JSTEPS; }
    settle; log "training: large MLP $LARGE batch $LBATCH, $n device(s): dpar, then JAX"
    "$BUILD/bench_train" --name large --layers "$LARGE" --batch $LBATCH --devices "$n" --steps $LSTEPS >> "$raw" || log "bench_train large failed"
    [ -n "$py" ] && { settle; jax_run large "$LARGE" $LBATCH "$n" $LSTEPS; }
done
[ "$quick" = 1 ] || { settle; log "trace: large MLP on 2 devices, 8 MB buckets -> bench/results/trace_large_2dev.json (open in ui.perfetto.dev)"
DPAR_TRACE="$out/trace_large_2dev.json" "$BUILD/bench_train" --name large --layers "$LARGE" --batch $LBATCH --devices 2 --steps 3 \
    --bucket-bytes 8388608 >/dev/null 2>&1 || log "traced bench_train failed"; }

# ---- graphs: the digits step replayed as a graph against the eager hand-written
# step, interleaved in one process (bench_graph.c), on the CPU backend and Vulkan
for b in cpu vulkan; do
    settle; log "graph: digits step, replayed graph vs eager, $b backend, 1 and 4 devices"
    "$BUILD/bench_graph" --backend $b --devices 1,4 --rounds $GROUNDS --time $GTIME >> "$raw" || log "bench_graph $b failed"
done

# ---- the GPT of examples/train_gpt.c: dpar (1x1, 2x2 meshes) against JAX and
# PyTorch, interleaved per round, and (full run) the validation loss after
# 1,000 steps of each (bench/peers/run_gpt.sh: bench/results/gpt.md, gpt.csv)
settle
if [ "$quick" = 1 ]; then # dpar alone (peers with BENCH_NO_JAX=0), 1 round of 3 steps, no gpt.md
    log "GPT: step time, dpar 1x1 and 2x2, 1 round of 3 steps"
    GPT_NO_PEERS=${BENCH_NO_JAX:-1} GPT_ALTS=1 GPT_TIME_STEPS=3 GPT_QUALITY=0 GPT_MD=0 GPT_OWN_RAW="$out/gpt_quick.tmp" \
        GPT_RAW="$raw" sh bench/peers/run_gpt.sh "$BUILD" || log "run_gpt.sh failed"
    rm -f "$out/gpt_quick.tmp" "$out/gpt_quick.tmp.log"
else
    log "GPT: step time interleaved with JAX and PyTorch ($ALTS rounds), then 1,000 steps of each (long)"
    GPT_NO_PEERS=${BENCH_NO_JAX:-0} GPT_ALTS=$ALTS GPT_RAW="$raw" sh bench/peers/run_gpt.sh "$BUILD" ||
        log "run_gpt.sh failed"
fi

# ---- conv2d at the CNN's per-device shapes against PyTorch, 1 and 2 threads, interleaved
# (bench/peers/run_conv.sh: bench/results/conv.md, conv_raw.csv; not in a quick run)
if [ "$quick" != 1 ] && [ "${BENCH_NO_JAX:-0}" != 1 ]; then
    settle; log "conv2d: dpar against PyTorch at the CNN's shapes, 1 and 2 threads ($ALTS rounds)"
    CONV_ALTS=$ALTS sh bench/peers/run_conv.sh "$BUILD" >/dev/null || log "run_conv.sh failed"
fi

# ---- the seed CNN of examples/train_cnn.c (`make run`) against JAX + flax + optax and PyTorch on 1, 2 and
# 4 devices, interleaved per round, then 10-epoch runs per seed for the accuracy table
# (bench/peers/run_cnn.sh: bench/results/cnn.md, cnn.csv, cnn_steps.csv; not in a quick run)
if [ "$quick" != 1 ] && [ "${BENCH_NO_JAX:-0}" != 1 ]; then
    settle; log "CNN: step time interleaved with JAX and PyTorch ($ALTS rounds), then 10 epochs per seed (long)"
    CNN_ALTS=$ALTS sh bench/peers/run_cnn.sh "$BUILD" >/dev/null || log "run_cnn.sh failed"
fi

# ---- report: tables, CSV, plots, summary
echo "load,end,$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null | tr ' ' '/')" >> "$raw"
rpy=${py:-python3}
[ -z "$py" ] && [ -x "$here/.venv/bin/python" ] && rpy="$here/.venv/bin/python" # matplotlib, when the venv exists
"$rpy" bench/report.py "$raw" "$out" || broken=1
if [ "$broken" = 1 ]; then
    log "FAIL: a figure is above 100% of its limit (see the lines above): the measurement is broken"
    exit 1
fi
