#!/bin/sh
# Cross-process all-reduce, dpar's hierarchical path (2 processes x 2 CPU
# devices) next to plain MPI_Allreduce with one rank per device (4 ranks), in
# one run; prints a Markdown table with the busbw ratio per size.
BUILD=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
make -s "$BUILD/mpibench_allreduce" BUILD="$BUILD" >/dev/null || exit 1
d=$(mktemp); m=$(mktemp)
mpirun -np 2 "$BUILD/mpibench_allreduce" dpar 2 >"$d" || exit 1
mpirun -np 4 "$BUILD/mpibench_allreduce" mpi >"$m" || exit 1
echo "| bytes | dpar 2 proc x 2 dev busbw GB/s | MPI_Allreduce 4 ranks busbw GB/s | dpar / MPI |"
echo "|---:|---:|---:|---:|"
paste "$d" "$m" | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "bytes") b = kv[2]; if (kv[1] == "busbw_GBps") { if (i < 10) x = kv[2]; else y = kv[2] } }
    printf "| %d | %.3f | %.3f | %.2f |\n", b, x, y, (y > 0 ? x / y : 0) }'
rm -f "$d" "$m"
