/* A rank that arrives long after the others gave up on it (mpirun -np 2,
   run by tests/test_mpi.sh): rank 1 reaches its psum 3.5 s late with a 1 s
   timeout. Both ranks must get a clear error (rank 1 hears that rank 0 gave
   up on it), and then destroy the runtime and finalize MPI without a crash:
   rank 0's given-up MPI requests complete only when rank 1 arrives, after
   rank 0 destroyed its runtime, so their buffers and communicators must
   outlive it. Rank 0's error must come within the timeout plus 1.5 s (a
   margin for loaded machines), not after the end-of-dispatch agreement waited
   again. Prints "rank R: ok" per rank after MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "dpar.h"

static dpar_status fn(dpar_ctx *ctx, void *u) {
    (void)u;
    int64_t sh[1] = { 8 };
    dpar_buffer *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b);
    if (s) return s;
    if (dpar_ctx_device(ctx) >= 2) usleep(3500 * 1000); /* rank 1's devices */
    s = dpar_psum(ctx, b, b, "x");
    dpar_buffer_destroy(b);
    return s;
}

int main(int argc, char **argv) {
    int prov, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm world = MPI_COMM_WORLD;
    /* .mpi_comm: the deprecated flat name of .mpi.comm still works */
    dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CPU, .num_devices = 2, .timeout_ms = 1000, .mpi_comm = &world };
    dpar_runtime *rt = NULL;
    dpar_mesh *m = NULL;
    if (dpar_runtime_create(&rd, &rt)) {
        fprintf(stderr, "rank %d: %s\n", rank, dpar_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    dpar_mesh_desc md = { .ndim = 1, .shape = { 4 }, .axis_names = { "x" } };
    if (dpar_mesh_create(rt, &md, &m)) {
        fprintf(stderr, "rank %d: %s\n", rank, dpar_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    dpar_shard_map_desc sd = { .fn = fn };
    double t0 = MPI_Wtime();
    dpar_status s = dpar_shard_map(m, &sd);
    double waited = MPI_Wtime() - t0;
    const char *e = dpar_last_error();
    int ok =
        s == DPAR_ERR_TIMEOUT && strstr(e, rank == 1 ? "gave up waiting for this process" : "never called it") != NULL;
    if (rank == 0 && waited > 2.5) ok = 0; /* timeout 1 s + 1.5 s margin (was 3 s: 3x the timeout) */
    printf("rank %d: %s after %.2f s: %s\n", rank, dpar_status_string(s), waited, e);
    fflush(stdout);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
    MPI_Finalize();
    printf("rank %d: %s\n", rank, ok ? "ok" : "UNEXPECTED ERROR");
    return ok ? 0 : 1;
}
