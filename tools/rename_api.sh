#!/bin/sh
# Rewrites sources to the public names of dpar 0.2 (CHANGELOG.md lists every
# rename). Rerunnable: each rename is a whole-word sed substitution (in strings
# and comments too), so a file already on the new names is left as it is. Arguments: files to rewrite;
# none: every tracked C/C++ source, header, script and Markdown file except
# CHANGELOG.md and the old-names compatibility tests. In dpar.h the block
# between "BEGIN DEPRECATED NAMES" and "END DEPRECATED NAMES" (the aliases
# themselves) is left alone.
#   sh tools/rename_api.sh            # whole tree
#   sh tools/rename_api.sh my_app.c   # your program
# A missing or non-regular argument fails (status 1) before any file is rewritten.
set -eu
RENAMES='
dpar_device_count      dpar_runtime_device_count
dpar_process_index     dpar_runtime_process_index
dpar_process_count     dpar_runtime_process_count
dpar_local_devices     dpar_runtime_local_devices
dpar_device_sync       dpar_runtime_device_sync
dpar_device_info_get   dpar_runtime_device_info
dpar_device_stats_get  dpar_runtime_device_stats
dpar_stats_reset       dpar_runtime_stats_reset
dpar_axis_index        dpar_ctx_axis_index
dpar_axis_size         dpar_ctx_axis_size
'
# Fields of dpar_runtime_desc that moved into the backends' settings. vulkan_force_noncoherent, dpar's own
# name, is rewritten in the files given (not in the whole tree, whose compatibility path reads the old fields)
# and only as a member (after . or ->). mpi_comm and vulkan_physical_device are listed for a change by hand:
# a program's own struct may have a member mpi_comm, and vulkan_physical_device counted from 0 where
# .vulkan.physical_device counts from 1.
FIELDS='
vulkan_force_noncoherent vulkan.force_noncoherent
'
script=$(echo "$RENAMES" | awk 'NF == 2 { printf "s/\\<%s\\>/%s/g;", $1, $2 }')
[ $# -eq 0 ] ||
    script=$script$(echo "$FIELDS" | awk 'NF == 2 { printf "s/\\(\\.\\|->\\)\\([[:space:]]*\\)%s\\>/\\1\\2%s/g;", $1, $2 }')
given=$# # files named: the fields too
if [ $# -eq 0 ]; then
    cd "$(dirname "$0")/.."
    set -- $(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.sh' '*.py' '*.md' |
             grep -v -e '^CHANGELOG.md$' -e '^tests/api_compat/old_names.c$' -e '^tools/rename_api.sh$' \
                 -e '^tests/test_api_compat.sh$')
fi
# every argument checked before any file changes: a typo names itself, nothing is rewritten
for f in "$@"; do
    if [ ! -f "$f" ]; then
        echo "rename_api.sh: $f: no such regular file; pass existing source files (none: the whole tree)" >&2
        exit 1
    fi
done
for f in "$@"; do
    # the aliases block keeps the old names; everything else gets the new ones
    sed -e "/BEGIN DEPRECATED NAMES/,/END DEPRECATED NAMES/b" -e "$script" "$f" >"$f.rename.tmp"
    if cmp -s "$f" "$f.rename.tmp"; then rm -f "$f.rename.tmp"; else cat "$f.rename.tmp" >"$f"; rm -f "$f.rename.tmp"; echo "renamed: $f"; fi
    [ "$given" -eq 0 ] || grep -n -e '\(\.\|->\)[[:space:]]*\(vulkan_physical_device\|mpi_comm\)\>' "$f" |
        while IFS=: read -r line _; do
            echo "rename_api.sh: $f:$line: not rewritten: a dpar_runtime_desc's .mpi_comm becomes .mpi.comm;" \
                "its .vulkan_physical_device = k (0-based; -1 or 0: the default) becomes .vulkan.physical_device" \
                "= k + 1 (1-based; 0: the default)" >&2
        done
done
