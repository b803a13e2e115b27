#!/bin/sh
# Installs what `make run` (mode "run") or `make test` (mode "test") needs on a
# Debian machine, when it is missing. Does nothing when everything is there.
# Needs root (or password-less sudo) only when something must be installed.
mode=${1:-run}
missing=""
need() { # need <package> <test...>
    pkg=$1; shift
    "$@" >/dev/null 2>&1 || missing="$missing $pkg"
}
need build-essential command -v cc
need make command -v make
need zlib1g-dev test -f /usr/include/zlib.h
if [ "$mode" = test ]; then
    need libcmocka-dev test -f /usr/include/cmocka.h
    need g++ command -v g++
    need clang command -v clang
    need python3 command -v python3
    need libvulkan-dev test -f /usr/include/vulkan/vulkan.h
    need libvulkan1 sh -c 'ls /usr/lib/*/libvulkan.so.1'
    need mesa-vulkan-drivers sh -c 'ls /usr/share/vulkan/icd.d/lvp_icd*.json'
    need glslang-tools command -v glslangValidator
    need vulkan-validationlayers sh -c 'ls /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json'
    need libopenmpi-dev command -v mpicc
    need openmpi-bin command -v mpirun
    need cmake command -v cmake           # tests/test_packaging.sh: CMake and pkg-config consumers
    need pkg-config command -v pkg-config
    # -lopenblas: test_bench_smoke.sh's sgemm peer, test_cblas.sh (a cblas.h alone may be libblas-dev's)
    need libopenblas-dev sh -c 'ls /usr/lib/*/libopenblas.so'
fi
[ -z "$missing" ] && exit 0
echo "deps: installing:$missing"
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"
    else echo "deps: not root; run: sudo apt-get install -y$missing"; exit 1; fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || { echo "deps: apt-get update failed"; exit 1; }
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing || { echo "deps: apt-get install$missing failed"; exit 1; }
