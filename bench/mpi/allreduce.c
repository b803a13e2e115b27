/* Cross-process all-reduce: dpar's hierarchical path next to plain MPI.
     mpirun -np P build/mpibench_allreduce dpar L   P processes x L CPU devices each:
                                                    dpar_psum over all P*L devices
     mpirun -np N build/mpibench_allreduce mpi      N ranks, MPI_Allreduce (one rank per device)
   Sizes 4 KB .. 64 MB of f32 (BENCH_MAX_MB caps it). Prints one line per size:
   "allreduce <impl> devices=<n> bytes=<b> time_us=<t> algbw_GBps=<a> busbw_GBps=<b>"
   with busbw = algbw * 2(n-1)/n (nccl-tests). The median of the iterations. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"

static int rank, nprocs;
typedef struct {
    int iters;
    double *times;
} bench_arg;

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp);
    return t[n / 2];
}

static dpar_status psum_loop(dpar_ctx *ctx, void *user) {
    bench_arg *a = user;
    dpar_buffer *b = dpar_ctx_arg(ctx, 0);
    dpar_status s = dpar_psum(ctx, b, b, "data"); /* warm-up */
    for (int i = 0; i < a->iters && !s; i++) {
        double t0 = MPI_Wtime();
        s = dpar_psum(ctx, b, b, "data");
        if (dpar_ctx_device(ctx) == 0) a->times[i] = MPI_Wtime() - t0;
    }
    return s;
}

int main(int argc, char **argv) {
    int prov;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    const char *mode = argc > 1 ? argv[1] : "dpar";
    int local = argc > 2 ? atoi(argv[2]) : 2;
    const char *cap = getenv("BENCH_MAX_MB");
    size_t maxb = (size_t)(cap ? atoi(cap) : 64) << 20;
    dpar_runtime *rt = NULL;
    dpar_mesh *mesh = NULL;
    if (!strcmp(mode, "dpar")) {
        MPI_Comm world = MPI_COMM_WORLD;
        dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CPU, .num_devices = local, .mpi = { .comm = &world } };
        if (dpar_runtime_create(&rd, &rt)) {
            fprintf(stderr, "%s\n", dpar_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        dpar_mesh_desc md = { .ndim = 1, .shape = { dpar_runtime_device_count(rt) }, .axis_names = { "data" } };
        if (dpar_mesh_create(rt, &md, &mesh)) {
            fprintf(stderr, "%s\n", dpar_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    int ndev = rt ? dpar_runtime_device_count(rt) : nprocs;
    for (size_t bytes = 4096; bytes <= maxb; bytes *= 4) {
        int iters = bytes <= (1 << 20) ? 50 : bytes <= (16 << 20) ? 10 : 4;
        double *times = calloc((size_t)iters, sizeof(double));
        int64_t count = (int64_t)(bytes / 4);
        if (rt) {
            dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 2, .shape = { ndev, count }, .spec = { "data" } };
            dpar_array *arr;
            if (dpar_array_create(mesh, &ad, &arr)) {
                fprintf(stderr, "%s\n", dpar_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            bench_arg a = { iters, times };
            dpar_shard_map_desc sd = { .fn = psum_loop, .user = &a, .num_args = 1, .args = { arr } };
            if (dpar_shard_map(mesh, &sd)) {
                fprintf(stderr, "%s\n", dpar_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            dpar_array_destroy(arr);
        } else {
            float *buf = calloc((size_t)count, sizeof(float));
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (int i = 0; i < iters; i++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                times[i] = MPI_Wtime() - t0;
            }
            free(buf);
        }
        double t = median(times, iters);
        MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        double alg = (double)bytes / t / 1e9, bus = alg * 2.0 * (ndev - 1) / ndev;
        if (rank == 0)
            printf("allreduce %s devices=%d processes=%d bytes=%zu time_us=%.1f algbw_GBps=%.3f busbw_GBps=%.3f\n",
                   mode, ndev, nprocs, bytes, t * 1e6, alg, bus);
        fflush(stdout);
        free(times);
    }
    dpar_runtime_destroy(rt);
    MPI_Finalize();
    return 0;
}
