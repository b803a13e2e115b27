/* Meshes made again and again over the same devices (mpirun -np 2, the
   default device count: what each process's share of the node is): every
   new mesh's collectives are right, and a group
   of devices seen before reuses what its first use set up. With the CUDA
   backend on the mock (tests/cuda_mock/mpi.sh) the group across the two
   processes must make one NCCL unique id in all (the mock's report counts
   them): a new id per mesh would leave an NCCL bootstrap thread and socket
   behind each time. Prints "remesh: ok, N devices" on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"

static dpar_status fn(dpar_ctx *ctx, void *u) {
    int *bad = u, k, n;
    int64_t sh[1] = { 5 };
    dpar_buffer *b;
    dpar_status s;
    if ((s = dpar_ctx_axis_index(ctx, "x", &k)) || (s = dpar_ctx_axis_size(ctx, "x", &n))) return s;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b))) return s;
    float v[5];
    for (int i = 0; i < 5; i++) v[i] = (float)((k + 1) * (i + 1));
    dpar_buffer_write(b, 0, v, sizeof v);
    if (!(s = dpar_psum(ctx, b, b, "x"))) {
        dpar_buffer_read(b, 0, v, sizeof v);
        for (int i = 0; i < 5; i++)
            if (v[i] != (float)(n * (n + 1) / 2 * (i + 1))) *bad = 1;
    }
    dpar_buffer_destroy(b);
    return s;
}

int main(int argc, char **argv) {
    int prov, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm world = MPI_COMM_WORLD;
    dpar_runtime_desc rd = { .backend = getenv("DPAR_BACKEND") && *getenv("DPAR_BACKEND") ? DPAR_BACKEND_DEFAULT
                                                                                          : DPAR_BACKEND_CPU };
    rd.num_devices = 0; /* the default: this process's share of the node's devices */
    rd.mpi.comm = &world;
    dpar_runtime *rt = NULL;
    if (dpar_runtime_create(&rd, &rt)) {
        fprintf(stderr, "rank %d: %s\n", rank, dpar_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int bad = 0, failed = 0;
    for (int i = 0; i < 6 && !failed; i++) {
        dpar_mesh_desc md = { .ndim = 1, .shape = { dpar_runtime_device_count(rt) }, .axis_names = { "x" } };
        dpar_mesh *m = NULL;
        if (dpar_mesh_create(rt, &md, &m)) {
            fprintf(stderr, "rank %d: %s\n", rank, dpar_last_error());
            failed = 1;
            break;
        }
        dpar_shard_map_desc sd = { .fn = fn, .user = &bad };
        if (dpar_shard_map(m, &sd)) {
            fprintf(stderr, "rank %d: mesh %d: %s\n", rank, i, dpar_last_error());
            failed = 1;
        }
        if (bad) {
            fprintf(stderr, "rank %d: mesh %d: wrong psum\n", rank, i);
            failed = 1;
        }
        dpar_mesh_destroy(m);
    }
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("remesh: %s, %d devices\n", any ? "FAILED" : "ok", dpar_runtime_device_count(rt));
    dpar_runtime_destroy(rt);
    MPI_Finalize();
    return any;
}
