#!/bin/sh
# The CUDA backend across MPI processes, without a GPU (called by
# tests/test_cuda_mock.sh for CUDA=1 builds): the mock driver /
# cuBLAS / NCCL (tests/cuda_mock/mock_cuda.cc, built by tests/test_cuda_mock.sh,
# which calls this script) under mpirun on this machine. NCCL communicators
# span the processes (ncclGetUniqueId on the process holding member 0, the id
# sent by MPI_Bcast, ncclCommInitRank per local rank); the mock moves the
# data through shared memory and reports how many of its ranks spanned
# processes, so a silent fallback to the host-staged path is a FAIL.
# Checks:
#  - tests/mpi/collectives.c on the cuda backend, np 2 (4 mock GPUs) and np 4
#    (8 mock GPUs), 2 devices per process: every collective over axes inside
#    and across processes with exact data, mismatch / uneven steps / timeout;
#  - the same with DPAR_MPI_BACKEND_COLLECTIVES=0 (the host-staged MPI path);
#  - each rank sees only its GPUs (CUDA_VISIBLE_DEVICES per rank): no false
#    "same device" error, NCCL across processes still used;
#  - two ranks resolving to one GPU: an error on both ranks naming them; with
#    DPAR_ALLOW_SHARED_DEVICE=1 the run works and takes the host path;
#  - a bad label on rank 1 (tests/mpi/badlabel.c; 2 devices a process over
#    NCCL and over the host path, 1 over NCCL): both ranks fail naming it,
#    nothing updated;
#  - the digits run under mpirun -np 2 x 2 devices matches 4 devices in one
#    process (NCCL in one process) per epoch within 1e-5 relative.
# Prints PASS / FAIL / SKIPPED lines for tests/run.sh.
BUILD=${BUILD:-build}
MOCK=$BUILD/cuda_mock
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if ! command -v mpirun >/dev/null 2>&1; then echo "FAIL mpi_cuda_mock: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 0; fi
if [ ! -x "$BUILD/mpi_collectives" ] || ! grep -q dpar_k_vreduce "$BUILD/mpi_collectives" 2>/dev/null ||
   [ ! -x "$BUILD/train_digits_mpi" ]; then
    echo "FAIL mpi_cuda_mock: $BUILD/mpi_collectives / train_digits_mpi are not CUDA=1 MPI builds (run: make CUDA=1 BUILD=$BUILD all)"; exit 0
fi
if [ ! -f "$MOCK/libnccl.so.2" ]; then echo "FAIL mpi_cuda_mock: the mock driver is not built (tests/test_cuda_mock.sh builds it)"; exit 0; fi
case "$BUILD" in *thread*)
    echo "SKIPPED mpi_cuda_mock under TSan: Open MPI's own threads are not instrumented"; exit 0;;
esac
OVER=""
mpirun --version 2>&1 | grep -q "Open MPI" && OVER="--oversubscribe"
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
unset DPAR_REQUIRE_BACKENDS DPAR_DEVICES CUDA_VISIBLE_DEVICES
LIBS="$MOCK${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log=$(mktemp)

# spanning LOG: the number of mock NCCL ranks that spanned processes (summed over ranks)
spanning() { sed -n 's/^mock nccl: \([0-9]*\) communicator rank(s) spanning processes.*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }'; }

run_coll() { # name np gpus extra-env...
    name=$1; np=$2; gpus=$3; shift 3
    env LD_LIBRARY_PATH="$LIBS" MOCK_CUDA_GPUS=$gpus MOCK_CUDA_REPORT=1 MOCK_CUDA_JITTER_US=5 DPAR_BACKEND=cuda "$@" \
        timeout 600 mpirun $OVER -np "$np" ${DPAR_TEST_WRAPPER:-} "$BUILD/mpi_collectives" >"$log" 2>&1
    rc=$?
    n=$(spanning "$log")
    if grep -q "^mpi_collectives np=$np: 0 failed checks" "$log"; then
        echo "$n"
        return 0
    fi
    grep -E '^(FAIL|rank)' "$log" | head -20
    echo "FAIL $name: mpi_collectives on the cuda backend, np $np (exit status $rc)"
    tail -n 20 "$log"
    return 1
}

for np in 2 4; do
    gpus=$((np * 2))
    if n=$(run_coll "mpi_cuda_mock_nccl_np$np" $np $gpus); then
        if [ "$n" -gt 0 ]; then
            echo "PASS mpi_cuda_mock_nccl_across_processes_np$np (every collective check passes; $n mock NCCL ranks spanned processes)"
        else
            echo "FAIL mpi_cuda_mock_nccl_across_processes_np$np: the checks pass but no NCCL communicator spanned processes (host path taken)"
        fi
    else
        echo "$n"
    fi
done

if n=$(run_coll mpi_cuda_mock_host_path 2 4 DPAR_MPI_BACKEND_COLLECTIVES=0); then
    if [ "$n" -eq 0 ]; then echo "PASS mpi_cuda_mock_host_path (DPAR_MPI_BACKEND_COLLECTIVES=0: every check passes over host-staged MPI, no NCCL across processes)"
    else echo "FAIL mpi_cuda_mock_host_path: $n NCCL ranks spanned processes although DPAR_MPI_BACKEND_COLLECTIVES=0"; fi
else
    echo "$n"
fi

# each rank sees only its own two GPUs, numbered 0 and 1 in both processes: the UUIDs differ
vis=$MOCK/visible.sh
cat >"$vis" <<'EOF'
#!/bin/sh
r=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}}
CUDA_VISIBLE_DEVICES=$((r * 2)),$((r * 2 + 1)) exec "$@"
EOF
chmod +x "$vis"
if n=$(DPAR_TEST_WRAPPER="$vis ${DPAR_TEST_WRAPPER:-}" run_coll mpi_cuda_mock_visible_devices 2 4); then
    if [ "$n" -gt 0 ]; then echo "PASS mpi_cuda_mock_visible_devices (CUDA_VISIBLE_DEVICES per rank: both see GPUs 0,1, told apart by UUID; $n NCCL ranks spanned processes)"
    else echo "FAIL mpi_cuda_mock_visible_devices: no NCCL communicator spanned processes"; fi
else
    echo "$n"
fi

# a group across processes in 6 meshes, one after another: one NCCL unique id in all, not one per mesh
env LD_LIBRARY_PATH="$LIBS" MOCK_CUDA_GPUS=4 MOCK_CUDA_REPORT=1 DPAR_BACKEND=cuda timeout 300 mpirun $OVER -np 2 "$BUILD/mpi_remesh" >"$log" 2>&1
ids=$(sed -n 's/^mock nccl: \([0-9]*\) unique id(s) made/\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
if grep -q '^remesh: ok, 4 devices' "$log" && [ "$ids" -eq 1 ]; then
    echo "PASS mpi_cuda_mock_remesh (6 meshes over the same devices: every psum right, 1 NCCL unique id made in all)"
else
    cat "$log"; echo "FAIL mpi_cuda_mock_remesh: $ids NCCL unique ids for one group of devices (want 1), or not 4 devices"
fi
# the default device count with CUDA_VISIBLE_DEVICES per rank: each rank opens both GPUs it sees (not half)
env LD_LIBRARY_PATH="$LIBS" MOCK_CUDA_GPUS=4 DPAR_BACKEND=cuda timeout 300 mpirun $OVER -np 2 "$vis" "$BUILD/mpi_remesh" >"$log" 2>&1
if grep -q '^remesh: ok, 4 devices' "$log"; then
    echo "PASS mpi_cuda_mock_visible_default_count (CUDA_VISIBLE_DEVICES per rank, num_devices 0: 2 GPUs per rank, 4 in all)"
else
    cat "$log"; echo "FAIL mpi_cuda_mock_visible_default_count: want 4 devices in all"
fi

# two ranks, 2 devices each, 2 GPUs on the node: they would share both GPUs
env LD_LIBRARY_PATH="$LIBS" MOCK_CUDA_GPUS=2 timeout 300 mpirun $OVER -np 2 "$BUILD/train_digits_mpi" --backend cuda --devices 4 --epochs 1 >"$log" 2>&1
n=$(grep -c "ranks 0 and 1 both resolve to physical cuda device .* (UUID " "$log")
if [ "$n" -eq 2 ]; then echo "PASS mpi_cuda_mock_shared_gpu_error (both ranks name ranks 0 and 1, the GPU and its UUID)"
else cat "$log"; echo "FAIL mpi_cuda_mock_shared_gpu_error: $n of 2 ranks reported the shared GPU"; fi
if n=$(run_coll mpi_cuda_mock_shared_gpu_allowed 2 2 DPAR_ALLOW_SHARED_DEVICE=1); then
    if [ "$n" -eq 0 ]; then echo "PASS mpi_cuda_mock_shared_gpu_allowed (DPAR_ALLOW_SHARED_DEVICE=1: every check passes on the host path; NCCL is not used across a shared GPU)"
    else echo "FAIL mpi_cuda_mock_shared_gpu_allowed: NCCL spanned processes on a shared GPU"; fi
else
    echo "$n"
fi

# a bad label on rank 1: both ranks' runs fail naming it, params and optimizer state kept on both
for c in 2:1 1:1 2:0; do # devices a process : backend collectives
    k=${c%:*} bc=${c#*:}
    if env LD_LIBRARY_PATH="$LIBS" MOCK_CUDA_GPUS=$((k * 2)) DPAR_BACKEND=cuda DPAR_MPI_BACKEND_COLLECTIVES=$bc \
            timeout 300 mpirun $OVER -np 2 ${DPAR_TEST_WRAPPER:-} "$BUILD/mpi_badlabel" $k >"$log" 2>&1 &&
       [ "$(grep -c '^rank [01]: ok$' "$log")" -eq 2 ]; then
        echo "PASS mpi_cuda_mock_bad_label ($k mock GPU(s) a process, backend collectives $bc: both ranks fail naming rank 1's device, nothing updated)"
    else
        cat "$log"; echo "FAIL mpi_cuda_mock_bad_label ($k mock GPU(s) a process, backend collectives $bc)"
    fi
done

# digits: 2 processes x 2 GPUs (NCCL across processes) vs 1 process x 4 GPUs (NCCL inside it)
one=$(mktemp); two=$(mktemp)
LD_LIBRARY_PATH="$LIBS" MOCK_CUDA_GPUS=4 MOCK_CUDA_JITTER_US=0 timeout 600 "$BUILD/train_digits" --backend cuda --devices 4 --epochs 3 >"$one" 2>&1
env LD_LIBRARY_PATH="$LIBS" MOCK_CUDA_GPUS=4 MOCK_CUDA_JITTER_US=0 MOCK_CUDA_REPORT=1 \
    timeout 600 mpirun $OVER -np 2 "$BUILD/train_digits_mpi" --backend cuda --devices 4 --epochs 3 >"$two" 2>&1
rc=$?
n=$(spanning "$two")
worst=$(paste "$one" "$two" | awk '/^epoch/ { for (i = 1; i <= NF; i++) if ($i == "loss") { if (!a) a = $(i+1); else b = $(i+1) }
    r = (a - b) / a; if (r < 0) r = -r; if (r > w) w = r; k++; a = ""; b = "" } END { if (k < 3) print "none"; else printf "%.3g\n", w }')
if [ "$rc" -eq 0 ] && [ "$n" -gt 0 ] && awk -v w="$worst" 'BEGIN { exit !(w != "none" && w + 0 <= 1e-5) }'; then
    echo "PASS mpi_cuda_mock_digits (mpirun -np 2 x 2 mock GPUs vs 4 in one process: max relative epoch-loss difference $worst; $n NCCL ranks spanned processes)"
else
    cat "$one" "$two"
    echo "FAIL mpi_cuda_mock_digits: exit status $rc, difference $worst, $n NCCL ranks across processes"
fi
rm -f "$log" "$one" "$two"
