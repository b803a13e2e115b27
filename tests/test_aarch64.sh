#!/bin/sh
# aarch64: cross-builds the library, every CPU test and every example with
# aarch64-linux-gnu-gcc (CPU backend only: VULKAN=0, no MPI) into
# $BUILD-aarch64/ and runs each test binary under qemu-user. Builds in the
# NEON paths (__ARM_NEON), so their results are checked against the same
# expected values as on x86.
# Opt-in (minutes on 2 cores): runs when DPAR_AARCH64=1 (.ci/run sets it),
# else SKIPPED. Missing tools are installed (Debian, root) as tools/deps.sh
# does; if that is impossible it is SKIPPED, or a FAIL when CI is set or
# DPAR_REQUIRE_TOOLS lists aarch64.
BUILD=${BUILD:-build}
case "$BUILD" in *address*|*thread*|*nosimd*|*aarch64*)
    echo "SKIPPED aarch64 under $BUILD: the plain run covers it"; exit 0;;
esac
if [ "${DPAR_AARCH64:-0}" != 1 ]; then
    echo "SKIPPED aarch64: opt-in, set DPAR_AARCH64=1 (CI does)"; exit 0
fi
AB="$BUILD-aarch64"
CROSS=aarch64-linux-gnu-
QEMU=qemu-aarch64-static
# Debian multiarch: the arm64 libc, cmocka and zlib live in /usr/lib/aarch64-linux-gnu,
# where qemu's default interpreter path finds them (no -L: with -L
# /usr/aarch64-linux-gnu, threaded dynamic binaries hang under qemu 7.2).
have() {
    command -v ${CROSS}gcc >/dev/null 2>&1 && command -v ${CROSS}g++ >/dev/null 2>&1 &&
        command -v $QEMU >/dev/null 2>&1 && [ -f /usr/lib/aarch64-linux-gnu/libcmocka.so ] &&
        [ -f /usr/lib/aarch64-linux-gnu/libz.so ] && [ -e /lib/ld-linux-aarch64.so.1 ]
}
install() {
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null || return 1
        SUDO="sudo -n"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO dpkg --add-architecture arm64 && $SUDO apt-get update -qq &&
        $SUDO apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu g++-aarch64-linux-gnu \
            qemu-user-static libc6:arm64 libcmocka-dev:arm64 zlib1g-dev:arm64 >/dev/null
}
if ! have; then
    echo "aarch64: installing the cross compiler, qemu-user-static and arm64 cmocka/zlib"
    install >/dev/null 2>&1
fi
if ! have; then
    msg="aarch64-linux-gnu-gcc/g++, qemu-user-static or arm64 libcmocka-dev/zlib1g-dev missing (as root:"
    msg="$msg dpkg --add-architecture arm64; apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
    msg="$msg qemu-user-static libcmocka-dev:arm64 zlib1g-dev:arm64)"
    if [ -n "${CI:-}" ] || echo ",${DPAR_REQUIRE_TOOLS:-}," | grep -q ",aarch64,"; then
        echo "FAIL aarch64: $msg"
    else
        echo "SKIPPED aarch64: $msg"
    fi
    exit 0
fi
tests=$(ls tests/test_*.c | sed "s#tests/\(.*\)\.c#$AB/\1#")
examples="$(ls examples/*.c | sed "s#examples/\(.*\)\.c#$AB/\1#") $AB/cpp_example"
log=$(mktemp)
# shellcheck disable=SC2086
if nice make -j2 CC=${CROSS}gcc CXX=${CROSS}g++ VULKAN=0 MPICC=none BUILD="$AB" $tests $examples >"$log" 2>&1; then
    echo "PASS aarch64 build (library, tests, examples)"
else
    echo "FAIL aarch64 build:"; tail -25 "$log" | sed 's/^/    /'; rm -f "$log"; exit 0
fi
for t in $tests; do
    n=$(basename "$t")
    # the cross build has the CPU backend only, so only it is required
    if DPAR_REQUIRE_BACKENDS=cpu timeout 600 $QEMU "$t" >"$log" 2>&1 && grep -q '^\[  PASSED  \]' "$log"; then
        echo "PASS aarch64 $n: $(sed -n 's/^\[  PASSED  \] //p' "$log" | tail -1)"
    else
        echo "FAIL aarch64 $n:"; grep -E '^\[  (FAILED|ERROR) |Failure|error' "$log" | head -20 | sed 's/^/    /'
        tail -5 "$log" | sed 's/^/    /'
    fi
done
if timeout 120 $QEMU "$AB/pmap_basics" >"$log" 2>&1; then echo "PASS aarch64 pmap_basics example"
else echo "FAIL aarch64 pmap_basics example:"; tail -5 "$log" | sed 's/^/    /'; fi
rm -f "$log"
