#!/bin/sh
# Packaging for C and C++ projects: every consumer (tests/consumers/) runs a
# psum over 4 CPU devices and checks it exactly.
#  - `make install PREFIX=P` and `cmake --install --prefix P` write the same
#    tree; DESTDIR stages it and `make uninstall` removes it again; each
#    installed util/*.h compiles from P;
#  - CMake add_subdirectory: the C++17 and C programs, with DPAR_VULKAN and DPAR_CUDA on;
#  - CMake find_package(dpar 0.1 CONFIG) from P: the same two programs, and
#    the C one again with DPAR_MPI on (MPI found through CMake); older and
#    newer version requests are refused;
#  - pkg-config: the C99 program built with `pkg-config --cflags --libs dpar`,
#    on dpar.h and on the installed amalgamated dpar_single.h.
# A missing cmake or pkg-config is SKIPPED, or a FAIL when DPAR_REQUIRE_TOOLS
# (comma separated) lists it: CI sets DPAR_REQUIRE_TOOLS=cmake,pkg-config.
BUILD=${BUILD:-build}
case "$BUILD" in *address*|*thread*)
    echo "SKIPPED packaging under $BUILD: the consumers build without sanitizers (the plain run covers them)"; exit 0;;
esac
root=$(pwd)
mkdir -p "$BUILD/packaging" && work=$(cd "$BUILD/packaging" && pwd) && rm -rf "${work:?}"/* || exit 1
CONSUMER="$root/tests/consumers"

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
# tool NAME CHECKS: is NAME on PATH? Otherwise SKIPPED (FAIL if required) for CHECKS.
tool() {
    command -v "$1" >/dev/null 2>&1 && return 0
    if echo ",${DPAR_REQUIRE_TOOLS:-}," | grep -q ",$1,"; then
        fail "$2" "$1 not found and DPAR_REQUIRE_TOOLS lists it (apt-get install $1, or sh tools/deps.sh test)"
    else
        echo "SKIPPED $2: $1 not found (apt-get install $1, or sh tools/deps.sh test)"
    fi
    return 1
}
# step NAME LOG CMD...: runs CMD into LOG; on failure a FAIL line with the log's tail.
step() {
    name=$1; log=$2; shift 2
    "$@" >"$log" 2>&1 && return 0
    fail "$name" "'$*' failed:"; tail -25 "$log" | sed 's/^/    /'; return 1
}
# runs NAME BIN: BIN exits 0 and prints "psum4 ok".
runs() {
    out=$("$2" 2>&1); rc=$?
    if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -q '^psum4 ok'; then pass "$1: $out"
    else fail "$1" "exit status $rc"; printf '%s\n' "$out" | sed 's/^/    /'; fi
}
# The install's own make, not the one that runs this suite (its jobserver is closed here).
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory BUILD="$BUILD" "$@"; }

# >>install: make install, DESTDIR, uninstall
prefix="$work/prefix"
installed=0
if step "make install" "$work/install.log" mk install PREFIX="$prefix"; then
    installed=1
    if [ -f "$prefix/include/dpar/dpar.h" ] && [ -f "$prefix/share/cmake/dpar/dparConfig.cmake" ] &&
       grep -qx "prefix=$prefix" "$prefix/share/pkgconfig/dpar.pc"; then
        pass "make install PREFIX=P: headers in P/include/dpar, dpar.pc (prefix=P), dparConfig.cmake"
    else
        fail "make install PREFIX=P" "missing files or a wrong prefix in dpar.pc:"
        find "$prefix" -type f | sed 's/^/    /'
    fi
fi
# Every installed util/ header compiles on its own from the prefix (C99 and C++17).
if [ "$installed" -eq 1 ]; then
    for h in "$prefix"/include/dpar/util/*.h; do
        [ -f "$h" ] || continue
        u="util/$(basename "$h")"
        if printf '#include "dpar.h"\n#include "%s"\n' "$u" | ${CC:-cc} -std=c99 -Wall -Wextra -Werror \
               -I"$prefix/include/dpar" -fsyntax-only -x c - >"$work/util.log" 2>&1 &&
           printf '#include "%s"\n' "$u" | ${CXX:-c++} -std=c++17 -Wall -Wextra -Werror \
               -I"$prefix/include/dpar" -fsyntax-only -x c++ - >>"$work/util.log" 2>&1; then
            pass "installed $u compiles from the prefix (C99, C++17)"
        else fail "installed $u" "does not compile from the prefix:"; sed 's/^/    /' "$work/util.log"; fi
    done
fi
stage="$work/stage"
if step "make install DESTDIR" "$work/destdir.log" mk install PREFIX=/usr/local DESTDIR="$stage"; then
    if [ -f "$stage/usr/local/include/dpar/dpar.h" ] &&
       grep -qx "prefix=/usr/local" "$stage/usr/local/share/pkgconfig/dpar.pc"; then
        pass "make install DESTDIR=D PREFIX=/usr/local: files under D, dpar.pc says /usr/local"
    else fail "make install DESTDIR=D PREFIX=/usr/local" "files not under D or dpar.pc does not say /usr/local"; fi
    if step "make uninstall" "$work/uninstall.log" mk uninstall PREFIX=/usr/local DESTDIR="$stage"; then
        left=$(find "$stage" -type f)
        if [ -z "$left" ]; then pass "make uninstall DESTDIR=D PREFIX=/usr/local: removes every file"
        else fail "make uninstall" "left $left"; fi
    fi
fi

# >>cmake: cmake --install, add_subdirectory, find_package
if tool cmake "CMake packaging (cmake --install, add_subdirectory, find_package)"; then
    cprefix="$work/prefix-cmake"
    if step "cmake --install" "$work/cmake-install.log" sh -c \
        "cmake -S '$root' -B '$work/self' && cmake --install '$work/self' --prefix '$cprefix'"; then
        sed -i "s|^prefix=.*|prefix=$prefix|" "$cprefix/share/pkgconfig/dpar.pc"
        if [ "$installed" -eq 1 ] && diff -r "$prefix" "$cprefix" >"$work/diff.log" 2>&1; then
            pass "cmake --install --prefix P writes the same files as make install PREFIX=P"
        else fail "cmake --install vs make install" "the trees differ:"; sed 's/^/    /' "$work/diff.log"; fi
    fi
    # Backends that this machine can compile in (the programs still run on the CPU backend).
    subopts=""; [ -f /usr/include/vulkan/vulkan.h ] && subopts="-DDPAR_VULKAN=ON"
    if step "CMake add_subdirectory" "$work/subdir.log" sh -c "cmake -S '$CONSUMER/cmake' -B '$work/subdir' \
        -DDPAR_FROM=subdirectory -DDPAR_SOURCE_DIR='$root' -DDPAR_CUDA=ON $subopts &&
        cmake --build '$work/subdir'"; then
        runs "CMake add_subdirectory, C++17 ($subopts -DDPAR_CUDA=ON)" "$work/subdir/psum4"
        runs "CMake add_subdirectory, C99 ($subopts -DDPAR_CUDA=ON)" "$work/subdir/psum4_c"
    fi
    if [ "$installed" -eq 1 ] && step "CMake find_package" "$work/package.log" sh -c "cmake -S '$CONSUMER/cmake' \
        -B '$work/package' -DDPAR_FROM=package -DCMAKE_PREFIX_PATH='$prefix' && cmake --build '$work/package'"; then
        if grep -qx "dpar_DIR:PATH=$prefix/share/cmake/dpar" "$work/package/CMakeCache.txt"; then
            runs "CMake find_package(dpar 0.1 CONFIG), C++17" "$work/package/psum4"
            runs "CMake find_package(dpar 0.1 CONFIG), C99" "$work/package/psum4_c"
        else fail "CMake find_package" "dpar_DIR is not $prefix/share/cmake/dpar"; fi
    fi
    if [ "$installed" -eq 1 ] && command -v mpicc >/dev/null 2>&1 && step "CMake find_package with DPAR_MPI" \
        "$work/mpi.log" sh -c "cmake -S '$CONSUMER/cmake' -B '$work/mpi' -DDPAR_FROM=package -DDPAR_MPI=ON \
        -DCMAKE_PREFIX_PATH='$prefix' && cmake --build '$work/mpi' --target psum4_c"; then
        runs "CMake find_package(dpar CONFIG) -DDPAR_MPI=ON, C99, one process" "$work/mpi/psum4_c"
    fi
    if [ "$installed" -eq 1 ]; then
        mkdir -p "$work/version"
        cat >"$work/version/CMakeLists.txt" <<'CMK'
cmake_minimum_required(VERSION 3.16)
project(dpar_version LANGUAGES NONE)
foreach(v 0.2 1.0 0.0.9)
    find_package(dpar ${v} CONFIG QUIET)
    if(dpar_FOUND)
        message(FATAL_ERROR "find_package(dpar ${v}) accepted dpar ${dpar_VERSION}")
    elseif(NOT dpar_CONSIDERED_VERSIONS MATCHES "^0\\.1\\.")
        message(FATAL_ERROR "find_package(dpar ${v}) did not see the installed dpar 0.1")
    endif()
endforeach()
CMK
        step "find_package refuses other versions" "$work/version.log" \
            cmake -S "$work/version" -B "$work/version/b" -DCMAKE_PREFIX_PATH="$prefix" &&
            pass "find_package(dpar 0.2 / 1.0 / 0.0.9 CONFIG) refuses dpar 0.1"
    fi
fi

# >>pkg-config: the C99 program against the installed prefix
if [ "$installed" -eq 1 ] && tool pkg-config "pkg-config consumer"; then
    export PKG_CONFIG_PATH="$prefix/share/pkgconfig"
    flags=$(pkg-config --cflags dpar) && libs=$(pkg-config --libs dpar) || { fail "pkg-config" "dpar.pc not found"; }
    if [ -n "$libs" ] && step "pkg-config consumer" "$work/pkgconfig.log" sh -c \
        "${CC:-cc} -std=c99 -Wall -Wextra -Werror $flags '$CONSUMER/pkgconfig/main.c' -o '$work/psum4_pc' $libs"; then
        runs "pkg-config consumer, C99 (cc $flags ... $libs)" "$work/psum4_pc"
    fi
    if [ -n "$libs" ] && step "pkg-config consumer, dpar_single.h" "$work/single.log" sh -c "${CC:-cc} -std=c99 \
        -Wall -Wextra -Werror -DPSUM4_SINGLE $flags '$CONSUMER/pkgconfig/main.c' -o '$work/psum4_single' $libs"; then
        runs "pkg-config consumer, C99, the installed amalgamated dpar_single.h" "$work/psum4_single"
    fi
fi
exit 0
