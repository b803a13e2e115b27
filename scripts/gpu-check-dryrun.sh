#!/usr/bin/env bash
# Proves, on this machine without a GPU, that scripts/gpu-check.sh works the
# first time on a lent GPU machine that is bare and offline: in a Debian
# bookworm chroot that has only what that machine has for building (a C/C++
# compiler, make, binutils, python3; this machine's CUDA toolkit bind-mounted
# read-only for nvcc) and none of cmocka, zlib headers, Vulkan, Open MPI or
# network, it clones the committed HEAD, adds .gpu-debs/ (scripts/gpu-prep.sh)
# and runs gpu-check.sh. Everything up to the first GPU call must run: the
# dependencies unpack, the CUDA=1 build passes, and the first test stops at
# the driver ("libcuda.so.1 not found"), not at a missing header or library.
#   sudo bash scripts/gpu-check-dryrun.sh [CHROOT]
# CHROOT (default .ci-work/gpu-bookworm) is made with debootstrap when absent
# and reused when it holds a bookworm minbase with build-essential already.
# Exit status 0 when the proof holds; the logs are in CHROOT/out.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
root=${1:-$repo/.ci-work/gpu-bookworm}
cuda=${CUDA_HOME:-/usr/local/cuda}
[ "$(id -u)" = 0 ] || { echo "FAIL gpu-dryrun: needs root (chroot, mounts)"; exit 1; }
[ -d .gpu-debs ] || { echo "FAIL gpu-dryrun: no .gpu-debs (run: bash scripts/gpu-prep.sh)"; exit 1; }

if [ ! -x "$root/usr/bin/gcc" ]; then
    command -v debootstrap >/dev/null || { echo "FAIL gpu-dryrun: debootstrap not installed"; exit 1; }
    rm -rf "$root"
    mkdir -p "$root"
    debootstrap --variant=minbase --include=git,make,ca-certificates,build-essential,python3,binutils \
        bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$root.log" 2>&1 ||
        { tail -20 "$root.log"; echo "FAIL gpu-dryrun: debootstrap"; exit 1; }
fi
for h in cmocka.h zlib.h vulkan/vulkan.h; do
    if [ -e "$root/usr/include/$h" ]; then echo "FAIL gpu-dryrun: the chroot has <$h>; it must lack it"; exit 1; fi
done

mounts=()
cleanup() {
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mnt() {
    mount "$@"
    mounts+=("${*: -1}")
}
mnt -t proc proc "$root/proc"
mnt --rbind /dev "$root/dev"
if [ -d "$cuda" ]; then
    mkdir -p "$root/usr/local/cuda"
    mnt --bind -o ro "$cuda" "$root/usr/local/cuda"
fi

rm -rf "$root/root/dpar" "$root/out"
git clone -q --no-local "$repo" "$root/root/dpar"
cp -r .gpu-debs "$root/root/dpar/"
echo "== gpu-dryrun: scripts/gpu-check.sh in the chroot (no GPU, no network)"
set +e
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/cuda/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-1500} GPU_CHECK_BUILD_S=${GPU_CHECK_BUILD_S:-1200} unshare -n bash /root/dpar/scripts/gpu-check.sh /out \
    >"$root.check.log" 2>&1
set -e
tail -40 "$root.check.log"
ok=1
grep -q '^deps: unpacked [1-9]' "$root/out/deps.txt" || { echo "FAIL gpu-dryrun: nothing unpacked"; ok=0; }
for h in cmocka.h zlib.h vulkan/vulkan.h; do
    grep -q "^header: <$h> found" "$root/out/deps.txt" || { echo "FAIL gpu-dryrun: <$h> not found after unpacking"; ok=0; }
done
grep -q '^PASS *build ' "$root/out/summary.txt" || { echo "FAIL gpu-dryrun: the CUDA=1 build did not pass"; ok=0; }
grep -q 'libcuda.so.1 not found' "$root/out/test_cuda.log" ||
    { echo "FAIL gpu-dryrun: test_cuda did not stop at the missing driver"; ok=0; }
[ "$ok" = 1 ] && echo "PASS gpu-dryrun: deps unpacked, CUDA=1 build passed, the first GPU call is the first failure"
[ "$ok" = 1 ]
