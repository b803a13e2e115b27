#!/bin/sh
# The single-file distribution (tools/amalgamate.py, `make amalgamate`): the
# amalgamated header alone, copied into an empty folder with the example
# sources, builds every example (every backend compiled in: CPU, Vulkan when its
# headers exist, CUDA, which needs no header), and train_digits built that way
# prints the same `final:` line as the normal build, bit for bit.
# Usage: BUILD=build sh tests/test_amalgamate.sh   (after `make examples`)
BUILD=${BUILD:-build}
case "$BUILD" in *address*|*thread*)
    echo "SKIPPED amalgamate under $BUILD: the single header builds without sanitizers (the plain run covers it)"; exit 0;;
esac
CC=${CC:-cc}
EPOCHS=${DPAR_AMALGAMATE_EPOCHS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! python3 tools/amalgamate.py -o "$tmp/dpar_single.h" 2>"$tmp/log"; then
    echo "FAIL amalgamate: tools/amalgamate.py failed"; cat "$tmp/log"; exit 1
fi
echo "PASS amalgamate writes $(sed 's/^[^:]*: //' "$tmp/log")"
# no include of a library file is left (only system headers; the usage
# comments' indented examples do not count)
left=$(grep -n '^#[ \t]*include[ \t]*"' "$tmp/dpar_single.h" | head -3)
[ -z "$left" ] && echo "PASS amalgamate inlines every local include" || echo "FAIL amalgamate left local includes: $left"

# the example sources next to the single header; their includes of dpar.h and
# util/*.h name it instead
mkdir "$tmp/src"
cp "$tmp/dpar_single.h" "$tmp/src/"
for f in examples/*.c examples/*.h; do
    sed -e 's|^#include "dpar\.h"|#include "dpar_single.h"|' -e 's|^#include "util/[^"]*"|#include "dpar_single.h"|' \
        "$f" >"$tmp/src/${f#examples/}"
done
printf '#define DPAR_IMPLEMENTATION\n#include "dpar_single.h"\n' >"$tmp/src/impl.c"
defs="-DDPAR_CUDA"
[ -f /usr/include/vulkan/vulkan.h ] && defs="$defs -DDPAR_VULKAN"
flags="-std=c99 -O2 -D_GNU_SOURCE -Wall -Wextra -Werror"
# shellcheck disable=SC2086
if ! $CC $flags $defs -c "$tmp/src/impl.c" -o "$tmp/impl.o" >"$tmp/log" 2>&1; then
    echo "FAIL amalgamate: the implementation ($defs) does not compile from dpar_single.h alone"; head -20 "$tmp/log"; exit 1
fi
echo "PASS amalgamate: the implementation ($defs) compiles from dpar_single.h alone"
for src in "$tmp"/src/*.c; do
    name=$(basename "$src" .c)
    [ "$name" = impl ] && continue
    # shellcheck disable=SC2086
    if $CC $flags -I"$tmp/src" "$src" "$tmp/impl.o" -o "$tmp/$name" -lz -lpthread -lm -ldl >"$tmp/log" 2>&1; then
        echo "PASS amalgamate: examples/$name.c builds against dpar_single.h"
    else
        echo "FAIL amalgamate: examples/$name.c does not build against dpar_single.h"; head -20 "$tmp/log"
    fi
done

# the same digits run from both builds: the same final line, bit for bit
if [ ! -x "$BUILD/train_digits" ] || [ ! -x "$tmp/train_digits" ]; then
    echo "FAIL amalgamate train_digits final line: $BUILD/train_digits or the amalgamated build is missing"; exit 0
fi
a=$("$BUILD/train_digits" --devices 4 --epochs "$EPOCHS" 2>&1 | grep '^final:')
b=$("$tmp/train_digits" --devices 4 --epochs "$EPOCHS" 2>&1 | grep '^final:')
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "PASS amalgamate train_digits --devices 4 --epochs $EPOCHS: same final line as the normal build ($a)"
else
    echo "FAIL amalgamate train_digits final line differs: normal '$a', amalgamated '$b'"
fi
