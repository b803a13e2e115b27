#!/bin/sh
# `make bench`: collective bandwidth and training throughput of dpar, side by
# side with the peers (memcpy, Open MPI's MPI_Allreduce, JAX on CPU), in one
# run. Writes bench/results/{collectives.csv,train.csv,results.md,busbw.png}
# and ends with one line "summary: ...".
#   sh bench/run.sh BUILD_DIR
#   BENCH_QUICK=1   a quick run (fewer sizes and device counts, shorter timing)
#   BENCH_NO_JAX=1  skip the JAX peer (and the venv it needs)
#   DPAR_TRACE=f.json is passed through to the dpar benchmarks.
# The JAX peer and matplotlib go into bench/.venv (PyPI, created on first use).
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out="$here/results"
mkdir -p "$out"
raw="$out/raw.tmp"
: > "$raw"
quick=${BENCH_QUICK:-0}
log() { echo "bench: $*" >&2; }
# A process that just freed gigabytes (JAX, the 256 MB collectives) leaves the
# kernel reclaiming for a few seconds, which halves the next measurement on a
# 2-core machine (measured: 620 ms -> 313 ms for the large MLP step after a
# 5 s pause). Every measurement starts after a pause.
settle() { sleep "${BENCH_SETTLE_S:-4}"; }

if [ "$quick" = 1 ]; then
    : "${BENCH_SETTLE_S:=1}"
    CMIN=4096; CMAX=16777216; CF=16; CT=0.05; CDEV=2,4; VMAX=16777216
    TDEV=1,2,4; TTIME=0.5; LARGE=1024,2048,2048,10; LBATCH=256; LSTEPS=3; JSTEPS=30
else
    CMIN=4096; CMAX=268435456; CF=4; CT=0.2; CDEV=2,4,8; VMAX=268435456
    TDEV=1,2,4; TTIME=2; LARGE=1024,4096,4096,10; LBATCH=512; LSTEPS=6; JSTEPS=300
fi
cd "$root" || exit 1

# ---- collectives: memcpy; then per device count dpar CPU (all four collectives)
# and the MPI peer back to back; then dpar Vulkan (all-reduce)
have_mpi=0
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    mpicc -O2 -Wall -Wextra -Werror bench/bench_mpi_allreduce.c -o "$BUILD/bench_mpi_allreduce" && have_mpi=1 || log "mpicc failed"
fi
[ "$have_mpi" = 1 ] || { log "no mpicc/mpirun: the MPI peer is skipped"; echo "skip,mpi,no mpicc/mpirun" >> "$raw"; }
log "memcpy bandwidth, $CMIN..$CMAX bytes"
"$BUILD/bench_collectives" --memcpy --no-dpar --min $CMIN --max $CMAX --factor $CF --time $CT | grep -v '^kind,' >> "$raw" || log "memcpy bench failed"
for n in $(echo "$CDEV" | tr ',' ' '); do
    settle; log "collectives: dpar cpu, $n devices"
    "$BUILD/bench_collectives" --backend cpu --devices "$n" --min $CMIN --max $CMAX --factor $CF --time $CT | grep -v '^kind,' >> "$raw" \
        || log "bench_collectives (cpu, $n) failed"
    if [ "$have_mpi" = 1 ]; then
        settle; log "collectives: MPI_Allreduce, $n ranks"
        timeout 600 mpirun --allow-run-as-root --oversubscribe -np "$n" "$BUILD/bench_mpi_allreduce" \
            --min $CMIN --max $CMAX --factor $CF --time $CT 2>/dev/null | grep '^coll,' >> "$raw" || log "mpirun -np $n failed"
    fi
done
settle; log "collectives: dpar vulkan all-reduce (skipped when no Vulkan device)"
"$BUILD/bench_collectives" --backend vulkan --devices 2,4 --ops allreduce --min $CMIN --max $VMAX --factor $CF --time $CT 2>/dev/null \
    | grep -v '^kind,' >> "$raw" || log "bench_collectives (vulkan) failed"

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
settle; log "trace: large MLP on 2 devices, 8 MB buckets -> bench/results/trace_large_2dev.json (open in ui.perfetto.dev)"
DPAR_TRACE="$out/trace_large_2dev.json" "$BUILD/bench_train" --name large --layers "$LARGE" --batch $LBATCH --devices 2 --steps 3 \
    --bucket-bytes 8388608 >/dev/null 2>&1 || log "traced bench_train failed"

# ---- report: tables, CSV, plot, summary
rpy=${py:-python3}
"$rpy" bench/report.py "$raw" "$out"
