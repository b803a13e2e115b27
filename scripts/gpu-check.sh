#!/usr/bin/env bash
# GPU check for the CUDA backend, on a machine with NVIDIA GPUs:
#   scripts/gpu-check.sh DIR
# builds with CUDA=1 (and Vulkan when its headers exist), runs the CUDA suite
# and the backend-parity suites with DPAR_REQUIRE_BACKENDS=cuda (a missing
# backend fails instead of skipping), trains the digits MLP, the CNN and the
# GPT with --backend cuda on 1 device and on 4 (virtual on a 1-GPU machine),
# and runs the CUDA benchmark. Every step's output is saved under DIR
# (DIR/<step>.log, teed to the terminal); a failing step does not stop the
# others; DIR/summary.txt lists each step's status and time and the key
# figures. Total under 6 minutes (each step has a timeout, and steps are
# skipped once the budget is spent). Exit status: 0 when every step passed.
#
# The lent machine is bare and offline. Before the device call, here:
#   bash scripts/gpu-prep.sh   # downloads cmocka, zlib and Vulkan .debs into .gpu-debs/
# then the device call (the `device` tool's run), exactly:
#   command:   bash scripts/gpu-check.sh /tmp/gpu; s=$?; tar czf $OUT/gpu.tgz -C /tmp gpu; cp /tmp/gpu/summary.txt $OUT/; exit $s
#   carry:     [".gpu-debs"]
#   timeout_s: 420
# (the tool brings back at most 8 files from $OUT, so the step logs travel as
# one archive). On an H200 (2026-12-04) the whole check took 63 to 133 s.
# This script unpacks .gpu-debs/*.deb into a private prefix (GPU_CHECK_PREFIX,
# default /tmp/dpar-gpu-deps; never into /), and finds libcuda, cuBLAS and
# NCCL wherever they are (the loader's cache, the driver's and the toolkit's
# folders, or the nvidia-* Python packages) and says which it used (env.txt).
# Proven up to the first GPU call in a chroot without those packages:
#   bash scripts/gpu-check-dryrun.sh
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR   (DIR receives the logs and summary.txt)" >&2
    exit 2
fi
DIR=$1
mkdir -p "$DIR" || { echo "cannot create $DIR" >&2; exit 2; }
DIR=$(cd "$DIR" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2

BUDGET=${GPU_CHECK_BUDGET_S:-345}   # seconds for everything
B=${GPU_CHECK_BUILD:-build}         # build folder (make BUILD=...)
JOBS=$(nproc 2>/dev/null || echo 4)
START=$(date +%s)
SUMMARY="$DIR/summary.txt"
: >"$SUMMARY"
FAILED=0

# step NAME MAX_SECONDS COMMAND...: runs with a timeout, tees to DIR/NAME.log
step() {
    local name=$1 max=$2
    shift 2
    local now left t0 rc secs
    now=$(date +%s)
    left=$((BUDGET - (now - START)))
    if [ "$left" -le 5 ]; then
        echo "SKIPPED  $name (time budget of ${BUDGET}s spent)" | tee -a "$SUMMARY"
        FAILED=1
        return 0
    fi
    [ "$max" -gt "$left" ] && max=$left
    echo "=== $name (timeout ${max}s): $*" | tee "$DIR/$name.log"
    t0=$(date +%s)
    timeout --kill-after=5 "$max" "$@" 2>&1 | tee -a "$DIR/$name.log"
    rc=${PIPESTATUS[0]}
    secs=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then
        printf 'PASS     %-22s %4ss\n' "$name" "$secs" | tee -a "$SUMMARY"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        printf 'TIMEOUT  %-22s %4ss (limit %ss)\n' "$name" "$secs" "$max" | tee -a "$SUMMARY"
        FAILED=1
    elif [ "${SOFT:-0}" = 1 ]; then
        printf 'WARN     %-22s %4ss (exit %s; informational, not counted)\n' "$name" "$secs" "$rc" | tee -a "$SUMMARY"
    else
        printf 'FAIL     %-22s %4ss (exit %s)\n' "$name" "$secs" "$rc" | tee -a "$SUMMARY"
        FAILED=1
    fi
    return 0
}

# the carried build dependencies, and where the NVIDIA libraries are
. "$ROOT/scripts/gpu-deps.sh"

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -a)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed file(s)"
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2
    ls /usr/local/cuda/bin/nvcc 2>/dev/null && /usr/local/cuda/bin/nvcc --version | tail -1
} >"$DIR/env.txt" 2>&1
cat "$DIR/env.txt"

export DPAR_REQUIRE_BACKENDS=cuda

step build          "${GPU_CHECK_BUILD_S:-200}" make -j"$JOBS" BUILD="$B" CUDA=1 $MAKEVARS all
# the embedded PTX matches kernels/*.cu (only meaningful with the same nvcc as committed)
SOFT=1 step check-ptx 30 make BUILD="$B" CUDA=1 $MAKEVARS check-ptx
step test_cuda      100 "$B"/test_cuda
if [ -f tests/test_parity.c ]; then
    step test_parity 100 "$B"/test_parity
else
    echo "SKIPPED  test_parity (tests/test_parity.c not in this tree)" | tee -a "$SUMMARY"
fi
DPAR_REQUIRE_BACKENDS=cuda step test_elem 60 "$B"/test_elem
step test_conv       60 "$B"/test_conv
step test_norm_attn  60 "$B"/test_norm_attn
step test_optim      60 "$B"/test_optim
# recorded graph programs as CUDA Graphs, bit for bit against op by op (their Vulkan cases skip here)
step test_graph_record 60 "$B"/test_graph_record
step digits_cuda_1   60 "$B"/train_digits --backend cuda --devices 1
step digits_cuda_4   60 "$B"/train_digits --backend cuda --devices 4
step cnn_cuda_1      60 "$B"/train_cnn --backend cuda --devices 1 --epochs 2 --monitor 1
# the same without CUDA Graphs: the step-time difference is what recording saves
DPAR_GRAPH_RECORD=0 step cnn_cuda_1_oplist 60 "$B"/train_cnn --backend cuda --devices 1 --epochs 2
step cnn_cuda_4      60 "$B"/train_cnn --backend cuda --devices 4 --epochs 2
if [ -f examples/train_gpt.c ]; then
    step gpt_cuda_1x1 60 "$B"/train_gpt --backend cuda --devices 1 --dp 1 --tp 1 --steps 200 --monitor 1
    step gpt_cuda_2x2 60 "$B"/train_gpt --backend cuda --devices 4 --dp 2 --tp 2 --steps 200
fi
step bench_cuda     100 "$B"/bench_cuda
# MPI on the real driver (where mpirun exists): with 2+ GPUs, 2 processes x 1
# GPU with NCCL across processes (the mock tests this path in CI); with one GPU,
# the two ranks must share it, so the host-staged MPI path runs on it.
if command -v mpirun >/dev/null 2>&1 && [ -x "$B"/mpi_collectives ]; then
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    if [ "${NGPU:-0}" -ge 4 ]; then
        DPAR_BACKEND=cuda step mpi_cuda_nccl 120 mpirun --oversubscribe -np 2 "$B"/mpi_collectives
    else
        echo "NOTE     mpi_cuda_nccl needs 4 GPUs (2 processes x 2 devices); this machine has ${NGPU:-0}" | tee -a "$SUMMARY"
        DPAR_BACKEND=cuda DPAR_DEVICES=2 DPAR_ALLOW_SHARED_DEVICE=1 step mpi_cuda_shared 120 \
            mpirun --oversubscribe -np 2 "$B"/mpi_collectives
    fi
else
    echo "SKIPPED  mpi_cuda (no mpirun or $B/mpi_collectives on this machine)" | tee -a "$SUMMARY"
fi
# PyTorch's CUDA step time for the CNN and the GPT next to dpar's above (informational: SOFT, last, and each only
# where python3's torch sees the GPU and 65 s of the budget are left, so they never fail the check)
torch_step() {
    if [ $((BUDGET - ($(date +%s) - START))) -gt 65 ]; then SOFT=1 step "$@"
    else echo "SKIPPED  $1 (informational; under 65 s of the budget left)" | tee -a "$SUMMARY"; fi
}
if python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    torch_step torch_cnn_cuda 60 python3 bench/peers/cnn_torch.py --device cuda --epochs 2
    torch_step torch_gpt_cuda 60 python3 bench/peers/gpt_torch.py --device cuda --steps 200
else
    echo "SKIPPED  torch_cuda (informational; python3 has no torch that sees the GPU)" | tee -a "$SUMMARY"
fi

{
    echo
    echo "--- key figures"
    grep -h '^final:' "$DIR"/digits_cuda_*.log "$DIR"/cnn_cuda_*.log "$DIR"/gpt_cuda_*.log 2>/dev/null
    grep -h '^lib:' "$DIR/deps.txt"
    grep -h '^mpi_collectives np=' "$DIR"/mpi_cuda_*.log 2>/dev/null
    for t in test_cuda test_parity test_elem test_conv test_norm_attn test_optim; do
        [ -f "$DIR/$t.log" ] && grep -HE '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]|^parity |^cuda: [0-9]* results' "$DIR/$t.log" | sed "s|^$DIR/||"
    done
    grep -hE '^(device|matmul|all-reduce|sgd|axpy|scale|relu|cast|conv2d|SKIPPED)' "$DIR"/bench_cuda.log 2>/dev/null
    for t in torch_cnn_cuda torch_gpt_cuda; do # PyTorch on the GPU: its final line, step_ms= the step time
        [ -f "$DIR/$t.log" ] && grep -H '^final:' "$DIR/$t.log" | sed "s|^$DIR/||"
    done
    echo "total: $(($(date +%s) - START))s of ${BUDGET}s"
} >>"$SUMMARY"
echo
echo "=== summary ($SUMMARY)"
cat "$SUMMARY"
exit "$FAILED"
