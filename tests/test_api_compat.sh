#!/bin/sh
# The API's compatibility promise (CHANGELOG.md): a program on the 0.1 names
# still builds (with deprecation warnings naming the new names) and runs; a
# program on the 0.2 names builds with DPAR_NO_DEPRECATED, as C and as C++,
# and the old names are gone under that define.
BUILD=${BUILD:-build}
CC=${CC:-cc}
CXX=${CXX:-c++}
DIR=tests/api_compat
if [ ! -f "$BUILD/dpar.o" ]; then echo "FAIL api_compat: $BUILD/dpar.o not built (make test-build)"; exit 1; fi
export LC_ALL=C # plain quotes in compiler messages
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
LIBS="-lpthread -lm -ldl"
# link against a sanitizer build of dpar.o with its runtime (make SAN=address|thread test)
SANFLAGS=
if nm "$BUILD/dpar.o" 2>/dev/null | grep -q __asan_init; then SANFLAGS=-fsanitize=address,undefined; fi
if nm "$BUILD/dpar.o" 2>/dev/null | grep -q __tsan_init; then SANFLAGS=-fsanitize=thread; fi
FLAGS="-std=c99 -D_GNU_SOURCE -I. -Wall -Wextra -Wshadow -Wconversion -Wpedantic -Werror"

if $CC $FLAGS -Wno-error=deprecated-declarations $SANFLAGS "$DIR/old_names.c" "$BUILD/dpar.o" -o "$tmp/old" $LIBS 2>"$tmp/old.log" &&
   "$tmp/old" >/dev/null; then echo "PASS api_compat: old names build and run"
else cat "$tmp/old.log"; echo "FAIL api_compat: old names do not build or run"; fi

want=$(grep -c '^DPAR_DEPRECATED(' dpar.h)
got=$(grep -o "dpar_[a-z_]*' is deprecated" "$tmp/old.log" | sort -u | wc -l)
if [ "$got" -eq "$want" ]; then echo "PASS api_compat: each of the $want old names warns as deprecated"
else cat "$tmp/old.log"; echo "FAIL api_compat: $got of $want old names warned as deprecated"; fi

if $CC $FLAGS -DDPAR_NO_DEPRECATED $SANFLAGS "$DIR/new_names.c" "$BUILD/dpar.o" -o "$tmp/new" $LIBS 2>"$tmp/new.log" &&
   "$tmp/new" >/dev/null; then echo "PASS api_compat: new names build with DPAR_NO_DEPRECATED and run"
else cat "$tmp/new.log"; echo "FAIL api_compat: new names do not build or run"; fi

if $CXX -std=c++11 -D_GNU_SOURCE -I. -Wall -Wextra -Wshadow -Wconversion -Wpedantic -Werror -DDPAR_NO_DEPRECATED -x c++ -fsyntax-only \
       "$DIR/new_names.c" 2>"$tmp/cxx.log"; then echo "PASS api_compat: new names compile as C++"
else cat "$tmp/cxx.log"; echo "FAIL api_compat: new names do not compile as C++"; fi

if $CC $FLAGS -DDPAR_NO_DEPRECATED -fsyntax-only "$DIR/old_names.c" 2>/dev/null; then
    echo "FAIL api_compat: old names still compile under DPAR_NO_DEPRECATED"
else echo "PASS api_compat: DPAR_NO_DEPRECATED removes the old names"; fi

# tools/rename_api.sh: a missing file fails naming it, and rewrites nothing (not even the files given with it)
printf 'int n = dpar_device_count(rt);\n' >"$tmp/app.c"
if sh tools/rename_api.sh "$tmp/app.c" "$tmp/none.c" >"$tmp/ren.log" 2>&1; then
    echo "FAIL api_compat: rename_api.sh with a missing file exited 0"
elif ! grep -q "$tmp/none.c: no such regular file" "$tmp/ren.log"; then
    echo "FAIL api_compat: rename_api.sh with a missing file said: $(cat "$tmp/ren.log")"
elif ! grep -q 'dpar_device_count(rt)' "$tmp/app.c"; then
    echo "FAIL api_compat: rename_api.sh rewrote $tmp/app.c although another argument was missing"
elif sh tools/rename_api.sh "$tmp/app.c" >/dev/null && grep -q 'dpar_runtime_device_count(rt)' "$tmp/app.c"; then
    echo "PASS api_compat: rename_api.sh refuses a missing file, naming it, and renames a real one"
else echo "FAIL api_compat: rename_api.sh did not rename $tmp/app.c: $(cat "$tmp/app.c")"; fi

# tools/rename_api.sh on the 0.1 program: the result builds with DPAR_NO_DEPRECATED (functions and the moved
# field renamed) and runs; mpi_comm (a program's own struct may have one) and the 0-based
# vulkan_physical_device are listed for a change by hand, not rewritten
cp "$DIR/old_names.c" "$tmp/renamed.c"
printf 'void f(dpar_runtime_desc *d) { d->vulkan_physical_device = 1; }\nstruct mine { int mpi_comm; } mm = { 0 };\nint g(void) { return mm.mpi_comm; }\n' >"$tmp/vkdev.c"
sh tools/rename_api.sh "$tmp/renamed.c" "$tmp/vkdev.c" >/dev/null 2>"$tmp/ren2.log"
if ! $CC $FLAGS -DDPAR_NO_DEPRECATED $SANFLAGS "$tmp/renamed.c" "$BUILD/dpar.o" -o "$tmp/renamed" $LIBS 2>"$tmp/renamed.log" ||
   ! "$tmp/renamed" >/dev/null; then
    cat "$tmp/renamed.log"; echo "FAIL api_compat: old_names.c after rename_api.sh does not build with DPAR_NO_DEPRECATED or run"
elif ! grep -q "vkdev.c:1: not rewritten" "$tmp/ren2.log" || ! grep -q "vkdev.c:3: not rewritten" "$tmp/ren2.log" ||
     ! grep -q 'vulkan_physical_device = 1' "$tmp/vkdev.c" || ! grep -q 'mm.mpi_comm' "$tmp/vkdev.c"; then
    echo "FAIL api_compat: rename_api.sh rewrote vulkan_physical_device or mpi_comm, or did not list them: $(cat "$tmp/ren2.log")"
else echo "PASS api_compat: rename_api.sh brings the 0.1 program to 0.2 (functions, moved fields; mpi_comm, vulkan_physical_device listed)"; fi
