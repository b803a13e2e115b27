#!/bin/sh
# Cross-process all-reduce, dpar's hierarchical path (2 processes x 2 CPU
# devices) next to plain MPI_Allreduce with one rank per device (4 ranks), in
# one run: the two alternate REPEAT times (default 3) so that both see the
# same machine, and each size reports the median over the repeats of each
# run's median time. Prints a Markdown table with the busbw ratio per size
# and writes it to bench/results/mpi_allreduce.md.
#   sh bench/mpi_allreduce.sh [BUILD]
BUILD=${1:-build}
REPEAT=${REPEAT:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
make -s "$BUILD/mpibench_allreduce" BUILD="$BUILD" >/dev/null || exit 1
raw=$(mktemp)
i=0
while [ "$i" -lt "$REPEAT" ]; do
    mpirun -np 2 "$BUILD/mpibench_allreduce" dpar 2 >>"$raw" || exit 1
    mpirun -np 4 "$BUILD/mpibench_allreduce" mpi >>"$raw" || exit 1
    i=$((i + 1))
done
out=bench/results/mpi_allreduce.md
mkdir -p bench/results
{
    echo "Cross-process all-reduce (f32 sum), $(date -u +%Y-%m-%d), $(nproc) cores, $(mpirun --version 2>&1 | head -n 1);"
    echo "median of $REPEAT alternating runs per size (each run: the median of its iterations)."
    echo
    echo "| bytes | dpar 2 proc x 2 dev busbw GB/s | MPI_Allreduce 4 ranks busbw GB/s | dpar / MPI |"
    echo "|---:|---:|---:|---:|"
    awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
           k = v["bytes"]; impl = $2; n[impl, k]++; t[impl, k, n[impl, k]] = v["busbw_GBps"]; sizes[k] = 1 }
         function med(impl, k,   m, i, j, x, a) {
             m = n[impl, k]; for (i = 1; i <= m; i++) a[i] = t[impl, k, i]
             for (i = 2; i <= m; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
             return a[int((m + 1) / 2)] }
         END { m = 0; for (k in sizes) ks[++m] = k + 0
               for (i = 2; i <= m; i++) { x = ks[i]; for (j = i - 1; j >= 1 && ks[j] > x; j--) ks[j + 1] = ks[j]; ks[j + 1] = x }
               for (i = 1; i <= m; i++) { k = ks[i]; d = med("dpar", k); p = med("mpi", k)
                   printf "| %d | %.3f | %.3f | %.2f |\n", k, d, p, (p > 0 ? d / p : 0) } }' "$raw"
} | tee "$out"
rm -f "$raw"
