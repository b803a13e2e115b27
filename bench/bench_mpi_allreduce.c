/* bench_mpi_allreduce.c — the peer: MPI_Allreduce (MPI_FLOAT, MPI_SUM, out of
   place) over the same sizes as bench_collectives, timed like it (warm-up,
   then the median of --trials trials (5 by default; bench/run.sh runs 1 per
   alternation with dpar) of `iters` back to back between two barriers, each
   trial's time the max over ranks).
   Built with mpicc -I. by bench/run.sh, run as
       mpirun --allow-run-as-root --oversubscribe -np N build/bench_mpi_allreduce [--min B] [--max B] [--factor F]
              [--time S] [--trials T]
   Prints rows like bench_collectives:
       coll,mpi,allreduce,N,bytes,time_us,algbw_GBps,busbw_GBps
   with busbw = algbw * 2(N-1)/N (nccl-tests). */
#include <mpi.h>
#include "examples/flags.h" /* ex_parse, ex_check_seconds, ex_check_order */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int lo = 4096, hi = 256 << 20, factor = 4, trials = 5;
    float target = 0.2f;
    const ex_flag flags[] = {
        EX_I("--min", &lo, 4, INT_MAX),     EX_I("--max", &hi, 4, INT_MAX),
        EX_I("--factor", &factor, 2, 1024), EX_F("--time", &target, "seconds per size, > 0 and <= 3600"),
        EX_I("--trials", &trials, 1, 64),
    };
    int rc = ex_parse("bench_mpi_allreduce", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (!rc) rc = ex_check_seconds("bench_mpi_allreduce", "--time", target);
    if (!rc) rc = ex_check_order("bench_mpi_allreduce", "--min", lo, "--max", hi);
    if (rc) return ex_exit_status(rc); /* before MPI_Init: --help and a bad flag need no MPI */
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (long long bytes = lo; bytes <= hi; bytes *= factor) {
        long long count = bytes / 4;
        float *in = (float *)malloc((size_t)count * 4), *out = (float *)malloc((size_t)count * 4);
        if (!in || !out) {
            fprintf(stderr, "out of memory at %lld bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (long long i = 0; i < count; i++) {
            in[i] = (float)(i % 7);
            out[i] = 0.0f;
        }
        MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double one = MPI_Wtime() - t0, worst;
        MPI_Allreduce(&one, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        int iters = (int)(target / (worst > 1e-7 ? worst : 1e-7));
        iters = iters < 2 ? 2 : iters > 2000 ? 2000 : iters;
        iters = iters / trials < 1 ? 1 : iters / trials;
        double tt[64];
        for (int trial = 0; trial < trials; trial++) { /* the median trial, as bench_collectives */
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++) MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
            double t = (MPI_Wtime() - t0) / iters, tw;
            MPI_Allreduce(&t, &tw, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            int k = trial; /* insertion sort: tt[0..trial] ascending */
            for (; k > 0 && tt[k - 1] > tw; k--) tt[k] = tt[k - 1];
            tt[k] = tw;
        }
        double tmed = trials % 2 ? tt[trials / 2] : 0.5 * (tt[trials / 2 - 1] + tt[trials / 2]);
        if (rank == 0) {
            double alg = (double)count * 4.0 / tmed / 1e9;
            printf("coll,mpi,allreduce,%d,%lld,%.2f,%.3f,%.3f\n", n, count * 4, tmed * 1e6, alg,
                   alg * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}
