#!/bin/sh
# The first programs a newcomer copies: the README's (the ```c block after the
# "<!-- first program" line) and the header's (between BEGIN FIRST PROGRAM and
# END FIRST PROGRAM in dpar.h's usage comment). Each is extracted, built as C99
# (cc, and clang when present) and as C++20 (c++, and clang++ when present)
# with -Wall -Wextra -Wpedantic -Werror, and run; its output line is checked.
# In C++ -Wmissing-field-initializers is off: g++ warns about every field a
# designated initializer leaves out, which is how zero-means-default descs are
# meant to be filled (C compilers never warn there).
# Then examples/cpp_example.cpp, the C++17 way to fill descs, is built with
# -std=c++17 -Wall -Wextra -Werror by c++ and clang++ and run.
# Usage: BUILD=build sh tests/test_first_programs.sh   (after make: $BUILD/dpar.o)
BUILD=${BUILD:-build}
CC=${CC:-cc}
CXX=${CXX:-c++}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
warn="-Wall -Wextra -Wpedantic -Werror"
libs="-lpthread -lm -ldl"
cxxwarn="-Wno-missing-field-initializers"

# extract NAME: writes $tmp/NAME.c, fails when the markers are missing
sed -n '/^<!-- first program/,/^<!-- end of first program/p' README.md | sed -n '/^```c$/,/^```$/p' | sed '1d;$d' \
    >"$tmp/readme.c"
sed -n '/^   BEGIN FIRST PROGRAM$/,/^   END FIRST PROGRAM$/p' dpar.h | sed '1d;$d' | sed 's/^       //' >"$tmp/header.c"

# check NAME WANT: builds $tmp/NAME.c with every compiler, runs each binary and
# looks for the line WANT in its output
check() {
    name=$1; want=$2
    if ! grep -q 'int main' "$tmp/$name.c"; then
        echo "FAIL first program ($name): not found between its markers"; return
    fi
    for c in "$CC -std=c99 -x c" "clang -std=c99 -x c" "$CXX -std=c++20 -x c++ $cxxwarn" "clang++ -std=c++20 -x c++ $cxxwarn"; do
        set -- $c
        command -v "$1" >/dev/null 2>&1 || { echo "SKIPPED first program ($name) with $1: not installed"; continue; }
        bin="$tmp/$name-$(basename "$1")"
        # shellcheck disable=SC2086
        if ! $c -D_GNU_SOURCE -I. $warn -O0 "$tmp/$name.c" -x none -o "$bin" $libs >"$tmp/log" 2>&1; then
            echo "FAIL first program ($name) does not build with $c"; head -20 "$tmp/log"; continue
        fi
        out=$("$bin" 2>&1); rc=$?
        if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -qxF "$want"; then
            echo "PASS first program ($name) builds with $c and prints '$want'"
        else
            echo "FAIL first program ($name) built with $c: exit status $rc, output:"; printf '%s\n' "$out" | head -5
        fi
    done
}
case "$BUILD" in
*address*|*thread*) # the first programs build without the sanitizers: the plain run covers them
    echo "SKIPPED first programs under $BUILD: they build without sanitizers (the plain run covers them)" ;;
*) check readme "pmean over 4 devices: ok"
   check header "y[3] = 18 20 22" ;;
esac

# the C++17 example against the library object the build made
if [ ! -f "$BUILD/dpar.o" ]; then echo "FAIL cpp_example: $BUILD/dpar.o is not built (make)"; exit 0; fi
san=$(sed -n 's/.*\(-fsanitize=[^ ]*\).*/\1/p' "$BUILD/.impl-flags" 2>/dev/null | head -1)
for cxx in "$CXX" clang++; do
    command -v "$cxx" >/dev/null 2>&1 || { echo "SKIPPED cpp_example with $cxx: not installed"; continue; }
    bin="$tmp/cpp_example-$(basename "$cxx")"
    # shellcheck disable=SC2086
    if ! "$cxx" -std=c++17 -D_GNU_SOURCE -I. $warn $san examples/cpp_example.cpp "$BUILD/dpar.o" -o "$bin" $libs >"$tmp/log" 2>&1; then
        echo "FAIL cpp_example does not build with $cxx -std=c++17 $warn"; head -20 "$tmp/log"; continue
    fi
    out=$("$bin" 2>&1); rc=$?
    n=$(printf '%s\n' "$out" | grep -c '^device [0-3]: psum = \[18, 22, 26\]$')
    if [ "$rc" -eq 0 ] && [ "$n" -eq 4 ]; then
        echo "PASS cpp_example builds with $cxx -std=c++17 $warn and every device's psum is [18, 22, 26]"
    else
        echo "FAIL cpp_example built with $cxx: exit status $rc, output:"; printf '%s\n' "$out" | head -5
    fi
done
exit 0
