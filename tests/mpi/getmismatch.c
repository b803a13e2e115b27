/* dpar_array_get across processes when the processes disagree (mpirun -np 2, run by
   tests/test_mpi.sh), with a 1 s timeout:
   1. rank 1 reads an array of another global shape, then of another spec: both ranks get
      DPAR_ERR_COLLECTIVE_MISMATCH at once (no MPI abort: the shards' sizes differ), and stay in step
      (a matching get after it reads the right values);
   2. rank 1 skips a get: rank 0 gets DPAR_ERR_TIMEOUT within the timeout plus a margin (no hang), and
      rank 1's next get fails too (DPAR_ERR_STATE or DPAR_ERR_TIMEOUT) instead of waiting forever;
   then both destroy the runtime and finalize MPI. Prints "rank R: ok" per rank after MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "dpar.h"

static int rank, ok = 1;
static void expect(const char *what, dpar_status got, dpar_status want, dpar_status want2, const char *text) {
    const char *e = dpar_last_error();
    if ((got != want && got != want2) || (text && !strstr(e, text))) {
        printf("rank %d: %s: %s (%s)\n", rank, what, dpar_status_string(got), e);
        ok = 0;
    }
}
int main(int argc, char **argv) {
    int prov;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm world = MPI_COMM_WORLD;
    dpar_runtime_desc rd = {
        .backend = DPAR_BACKEND_CPU, .num_devices = 2, .timeout_ms = 1000, .mpi = { .comm = &world }
    };
    dpar_runtime *rt = NULL;
    dpar_mesh *m = NULL;
    if (dpar_runtime_create(&rd, &rt) ||
        dpar_mesh_create(rt, &(dpar_mesh_desc){ .shape = { 4 }, .axis_names = { "x" } }, &m)) {
        fprintf(stderr, "rank %d: %s\n", rank, dpar_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    dpar_array_desc d = { DPAR_F32, 2, { 4, 3 }, { "x" } }, wide = d, repl = d;
    wide.shape[1] = 5;
    repl.spec[0] = NULL;
    dpar_array *a = NULL, *w = NULL, *r = NULL;
    if (dpar_array_create(m, &d, &a) || dpar_array_create(m, rank ? &wide : &d, &w) ||
        dpar_array_create(m, rank ? &repl : &d, &r)) {
        fprintf(stderr, "rank %d: %s\n", rank, dpar_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float v[20], got[20];
    for (int i = 0; i < 20; i++) v[i] = (float)i;
    expect("put", dpar_array_put(a, v), DPAR_OK, DPAR_OK, NULL);
    expect("get of another shape", dpar_array_get(w, got), DPAR_ERR_COLLECTIVE_MISMATCH, DPAR_ERR_COLLECTIVE_MISMATCH,
           "dpar_array_get: the processes read different arrays");
    expect("get of another spec", dpar_array_get(r, got), DPAR_ERR_COLLECTIVE_MISMATCH, DPAR_ERR_COLLECTIVE_MISMATCH,
           "same array");
    memset(got, 0, sizeof got);
    expect("matching get after the mismatches", dpar_array_get(a, got), DPAR_OK, DPAR_OK, NULL);
    if (memcmp(got, v, 12 * sizeof(float)) != 0) printf("rank %d: wrong values after the mismatches\n", rank), ok = 0;
    double t0 = MPI_Wtime();
    if (rank == 0) {
        expect("get that rank 1 skips", dpar_array_get(a, got), DPAR_ERR_TIMEOUT, DPAR_ERR_TIMEOUT,
               "timed out after 1000 ms");
        double waited = MPI_Wtime() - t0;
        if (waited > 2.5) printf("rank 0: the timeout came after %.2f s\n", waited), ok = 0;
        MPI_Send(&ok, 1, MPI_INT, 1, 7, MPI_COMM_WORLD); /* rank 1 calls its next get after this */
    } else {
        int x;
        MPI_Recv(&x, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        expect("get after skipping one", dpar_array_get(a, got), DPAR_ERR_STATE, DPAR_ERR_TIMEOUT, "dpar_array_get");
        if (MPI_Wtime() - t0 > 10.0) printf("rank 1: the late get took %.2f s\n", MPI_Wtime() - t0), ok = 0;
    }
    dpar_array_destroy(a);
    dpar_array_destroy(w);
    dpar_array_destroy(r);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
    MPI_Finalize();
    printf("rank %d: %s\n", rank, ok ? "ok" : "UNEXPECTED ERROR");
    return ok ? 0 : 1;
}
