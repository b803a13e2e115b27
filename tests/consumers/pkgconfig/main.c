/* psum over 4 CPU devices from C99, built with `pkg-config --cflags --libs dpar` (and by ../cmake/):
   row d of x [4, 8] goes to device d, every device sums the rows over the mesh
   axis "data", and each of the 4 stacked results must be exactly
   sum_d x[d][i]. Prints "psum4 ok" or why not. With -DPSUM4_SINGLE it uses
   the installed amalgamated header instead. */
#define DPAR_IMPLEMENTATION
#ifdef PSUM4_SINGLE
#include "dpar_single.h"
#else
#include "dpar.h"
#endif
#include <stdio.h>

enum { NDEV = 4, COLS = 8 };

static dpar_status psum_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    return dpar_psum(ctx, dpar_ctx_arg(ctx, 1), dpar_ctx_arg(ctx, 0), "data");
}

static int fail(const char *what, dpar_status s) {
    fprintf(stderr, "psum4: %s: %s: %s\n", what, dpar_status_string(s), dpar_last_error());
    return 1;
}

int main(void) {
    dpar_runtime *rt = NULL;
    dpar_mesh *mesh = NULL;
    dpar_status s = dpar_runtime_create(&(dpar_runtime_desc){ .backend = DPAR_BACKEND_CPU, .num_devices = NDEV }, &rt);
    if (s) return fail("dpar_runtime_create", s);
    s = dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { NDEV }, .axis_names = { "data" } }, &mesh);
    if (s) return fail("dpar_mesh_create", s);

    float x[NDEV * COLS], y[NDEV * COLS];
    for (int i = 0; i < NDEV * COLS; i++) {
        x[i] = (float)(i / COLS * 100 + i % COLS);
        y[i] = -1.0f;
    }
    s = dpar_pmap(
        mesh,
        &(dpar_pmap_desc){
            .axis = "data",
            .fn = psum_fn,
            .num_inputs = 1,
            .num_outputs = 1,
            .inputs = { { .data = x, .dtype = DPAR_F32, .ndim = 2, .shape = { NDEV, COLS }, .in_axis = DPAR_MAPPED } },
            .outputs = { { .data = y, .dtype = DPAR_F32, .ndim = 1, .shape = { COLS } } },
        });
    if (s) return fail("dpar_pmap", s);

    int bad = 0;
    for (int i = 0; i < NDEV * COLS; i++) {
        float want = (float)(600 + 4 * (i % COLS)); /* (0 + 100 + 200 + 300) + 4 i, exact in f32 */
        if (y[i] != want) {
            fprintf(stderr, "psum4: device %d element %d: got %g, want %g\n", i / COLS, i % COLS, (double)y[i],
                    (double)want);
            bad++;
        }
    }
    dpar_mesh_destroy(mesh);
    dpar_runtime_destroy(rt);
    if (bad) return 1;
#ifdef PSUM4_SINGLE
    printf("psum4 ok: %d devices, C, dpar_single.h\n", NDEV);
#else
    printf("psum4 ok: %d devices, C\n", NDEV);
#endif
    return 0;
}
