#!/usr/bin/env bash
# GPU check for the Vulkan backend, on a machine with an NVIDIA GPU:
#   scripts/gpu-check-vulkan.sh DIR
# builds with VULKAN=1, checks that dpar's Vulkan backend picks the NVIDIA
# driver (not llvmpipe: GPUs are ordered before CPU implementations), runs the
# Vulkan suite and the backend-parity suite with DPAR_REQUIRE_BACKENDS=vulkan
# (a missing driver fails), trains the digits with --backend vulkan on 1 and 4
# logical devices (accuracy >= 0.95, per-epoch loss within 1e-3 of the CPU
# backend), and runs the all-reduce benchmark (Vulkan next to the CPU backend,
# 4 KB .. 256 MB, 2 and 4 logical devices). The staged (device-local memory)
# collective path is the one that runs on a discrete GPU.
# Every step's output is saved under DIR (DIR/<step>.log, teed to the
# terminal); a failing step does not stop the others; DIR/summary.txt lists
# each step's status and time. Total under 5 minutes (a timeout per step and
# an overall budget). Exit status: 0 when every step passed.
# Needs the NVIDIA driver's Vulkan ICD; the loader, its headers and cmocka
# come from .gpu-debs (bash scripts/gpu-prep.sh here, then carry it):
#   command: bash scripts/gpu-check-vulkan.sh $OUT/vk   carry: [".gpu-debs"]   timeout_s: 360
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
BUDGET=${GPU_CHECK_BUDGET_S:-290}
JOBS=$(nproc 2>/dev/null || echo 4)
START=$(date +%s)
SUMMARY="$DIR/summary.txt"
: >"$SUMMARY"
FAILED=0
export DPAR_REQUIRE_BACKENDS=vulkan
# the carried build dependencies and the Vulkan loader (scripts/gpu-prep.sh)
. "$ROOT/scripts/gpu-deps.sh"

step() { # step NAME MAX_SECONDS COMMAND...
    local name=$1 max=$2; shift 2
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -le 5 ]; then echo "SKIPPED  $name (time budget spent)" | tee -a "$SUMMARY"; FAILED=1; return 0; fi
    [ "$max" -gt "$left" ] && max=$left
    echo "=== $name (timeout ${max}s): $*" | tee "$DIR/$name.log"
    local t0; t0=$(date +%s)
    timeout --kill-after=5 "$max" "$@" 2>&1 | tee -a "$DIR/$name.log"
    local rc=${PIPESTATUS[0]} secs=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then echo "PASS     $name (${secs}s)" | tee -a "$SUMMARY"
    else echo "FAIL     $name (exit $rc, ${secs}s)" | tee -a "$SUMMARY"; FAILED=1; fi
}

step vulkaninfo 20 sh -c 'vulkaninfo --summary 2>/dev/null | sed -n "/Devices:/,\$p"; ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null; nvidia-smi -L 2>/dev/null; true'
step build 150 make -j"$JOBS" VULKAN=1 build/test_vulkan build/test_parity build/train_digits build/bench_collectives
step device 30 sh -c './build/test_vulkan 2>&1 | grep "vulkan device:" | head -1 | tee /dev/stderr | grep -q "vendor NVIDIA" || { echo "the Vulkan backend did not pick the NVIDIA driver (see vulkaninfo.log)"; exit 1; }'
step test_vulkan 60 ./build/test_vulkan
step test_parity 90 ./build/test_parity
digits() { # digits DEVICES
    ./build/train_digits --backend cpu --devices "$1" >"$DIR/digits_cpu_$1.txt" 2>&1 || return 1
    ./build/train_digits --backend vulkan --devices "$1" | tee "$DIR/digits_vulkan_$1.txt" || return 1
    python3 - "$DIR/digits_cpu_$1.txt" "$DIR/digits_vulkan_$1.txt" <<'PY'
import re, sys
def read(p):
    t = open(p).read()
    return [float(x) for x in re.findall(r"^epoch +\d+ +loss ([0-9.eE+-]+)", t, re.M)], float(re.search(r"test_accuracy=([0-9.]+)", t).group(1))
(lc, ac), (lv, av) = read(sys.argv[1]), read(sys.argv[2])
rel = max(abs(a - b) / abs(a) for a, b in zip(lc, lv))
print("epochs %d, max per-epoch loss rel diff vs cpu %.3g, test accuracy %.4f (cpu %.4f)" % (len(lv), rel, av, ac))
sys.exit(0 if len(lv) == len(lc) and len(lv) > 0 and rel <= 1e-3 and av >= 0.95 else 1)
PY
}
export -f digits; export DIR
step digits_1 60 bash -c 'digits 1'
step digits_4 60 bash -c 'digits 4'
step bench_allreduce 60 ./build/bench_collectives --backend cpu,vulkan --devices 2,4 --ops allreduce --min 4096 --max 268435456 --factor 4 --time 0.05
echo "summary: $(grep -c '^PASS' "$SUMMARY") passed, $(grep -c -v '^PASS' "$SUMMARY") not passed; logs in $DIR" | tee -a "$SUMMARY"
exit $FAILED
