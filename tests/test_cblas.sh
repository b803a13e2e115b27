#!/bin/sh
# The DPAR_USE_CBLAS build (dpar.h's override: the CPU backend's matrix products through cblas_sgemm,
# here OpenBLAS): the implementation compiles with the Makefile's warnings as errors (dpar's own sgemm
# driver is left out of it, and nothing of it may be left unused), and test_ops, linked to OpenBLAS,
# passes: its matmul cases compare with references to a tolerance, not to dpar's own kernels' bits.
BUILD=${BUILD:-build}
case "$BUILD" in *address*|*thread*) # CI's 45 minutes: the plain run covers a build option
    echo "SKIPPED cblas under $BUILD: a build option (the plain run covers it)"
    exit 0;;
esac
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
warn="-Wall -Wextra -Wshadow -Wconversion -Wpedantic -Werror -Wno-error=deprecated-declarations"
if ! $CC -std=c99 -I. -D_GNU_SOURCE -DDPAR_USE_CBLAS -DDPAR_IMPLEMENTATION -O2 $warn -x c -c dpar.h \
    -o "$tmp/dpar.o" 2>"$tmp/err"; then
    cat "$tmp/err"
    echo "FAIL cblas: dpar.h with -DDPAR_USE_CBLAS does not compile with -Werror"
    exit 1
fi
if ! $CC -std=c99 -I. -D_GNU_SOURCE -O2 $warn tests/test_ops.c "$tmp/dpar.o" -o "$tmp/test_ops" -lcmocka \
    -lopenblas -lz -lpthread -lm -ldl 2>"$tmp/err"; then
    cat "$tmp/err"
    echo "FAIL cblas: test_ops does not link against OpenBLAS (libopenblas-dev)"
    exit 1
fi
if DPAR_REQUIRE_BACKENDS=cpu "$tmp/test_ops" >"$tmp/log" 2>&1; then
    echo "PASS cblas: dpar.h builds with DPAR_USE_CBLAS and -Werror; test_ops passes on OpenBLAS"
else
    cat "$tmp/log"
    echo "FAIL cblas: test_ops with DPAR_USE_CBLAS"
fi
