/* pmap basics: run one function per device over a 4-device mesh axis "data".

   1. pmap doubles each device's slice of a host array x [4, 3]: device d gets
      row d (shape [3]) and the outputs are stacked back into [4, 3].
   2. pmap maps the leading dimension one-to-one onto the devices, so x [8, 3]
      on 4 devices is an error (DPAR_ERR_SHAPE), reported before anything runs.
   3. shard_map with the spec ("data", None) splits the same 8 rows over the
      4 devices instead: 2 rows each.

   Usage: pmap_basics [--backend cpu|vulkan|cuda]      (default cpu) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"
#include "example_util.h"

/* On the host: print the failing call and the library's error, then exit. */

enum { NDEV = 4, COLS = 3 };

/* y = 2 * x, whatever shape this device's piece has. */
static dpar_status double_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *x = dpar_ctx_arg(ctx, 0), *y = dpar_ctx_arg(ctx, 1);
    TRY(dpar_copy(y, x));
    return dpar_scale(y, 2.0f);
}

/* Prints a [rows, 3] matrix as [[a, b, c], ...] (no newline). */
static void print_mat(const float *a, int rows) {
    printf("[");
    for (int r = 0; r < rows; r++) {
        printf("%s[", r ? ", " : "");
        for (int c = 0; c < COLS; c++) printf("%s%g", c ? ", " : "", (double)a[r * COLS + c]);
        printf("]");
    }
    printf("]");
}

int main(int argc, char **argv) {
    const char *backend_name = "cpu";
    const ex_flag flags[] = { EX_S("--backend", &backend_name, "cpu|vulkan|cuda") };
    int rc = ex_parse("pmap_basics", argc, argv, flags, 1);
    if (rc) return ex_exit_status(rc);
    dpar_backend_kind backend = parse_backend(backend_name);

    dpar_runtime *rt = NULL;
    dpar_mesh *mesh = NULL;
    CHECK(dpar_runtime_create(&(dpar_runtime_desc){ .backend = backend, .num_devices = NDEV }, &rt));
    CHECK(dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { NDEV }, .axis_names = { "data" } }, &mesh));
    printf("backend %s, mesh 'data' of %d devices\n", dpar_backend_name(dpar_runtime_backend(rt)), NDEV);

    /* 1. pmap: x [4, 3] -> each device doubles its row -> stacked y [4, 3] */
    float x[8 * COLS], y[8 * COLS];
    for (int i = 0; i < 8 * COLS; i++) x[i] = (float)i;
    dpar_pmap_desc pd = {
        .axis = "data",
        .fn = double_fn,
        .num_inputs = 1,
        .num_outputs = 1,
        .inputs = { { .data = x, .dtype = DPAR_F32, .ndim = 2, .shape = { NDEV, COLS }, .in_axis = DPAR_MAPPED } },
        .outputs = { { .data = y, .dtype = DPAR_F32, .ndim = 1, .shape = { COLS } } },
    };
    printf("\n== pmap: each device doubles its slice (row d on device d)\n");
    CHECK(dpar_pmap(mesh, &pd));
    printf("x [4, 3]         = ");
    print_mat(x, NDEV);
    printf("\n");
    printf("pmap(2*x) [4, 3] = ");
    print_mat(y, NDEV);
    printf("\n");

    /* 2. the same call with 8 rows: pmap wants one row per device */
    printf("\n== pmap with 8 rows on 4 devices\n");
    pd.inputs[0].shape[0] = 8;
    dpar_status s = dpar_pmap(mesh, &pd);
    if (s != DPAR_ERR_SHAPE) {
        fprintf(stderr, "expected DPAR_ERR_SHAPE, got %s: %s\n", dpar_status_string(s), dpar_last_error());
        return 1;
    }
    printf("error %s: %s\n", dpar_status_string(s), dpar_last_error());

    /* 3. shard_map: x [8, 3] with spec ("data", None) -> 2 rows per device */
    printf("\n== shard_map: x [8, 3] with spec (\"data\", None) gives each device 2 rows\n");
    dpar_array *xa = NULL, *ya = NULL;
    dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 2, .shape = { 8, COLS }, .spec = { "data", NULL } };
    CHECK(dpar_array_create(mesh, &ad, &xa));
    CHECK(dpar_array_create(mesh, &ad, &ya));
    CHECK(dpar_array_put(xa, x));
    CHECK(dpar_shard_map(mesh, &(dpar_shard_map_desc){ .fn = double_fn, .num_args = 2, .args = { xa, ya } }));
    for (int d = 0; d < NDEV; d++) {
        dpar_buffer *xs = dpar_array_shard(xa, d), *ys = dpar_array_shard(ya, d);
        float xh[8 * COLS], yh[8 * COLS];
        CHECK(dpar_buffer_read(xs, 0, xh, dpar_buffer_nbytes(xs)));
        CHECK(dpar_buffer_read(ys, 0, yh, dpar_buffer_nbytes(ys)));
        int rows = (int)dpar_buffer_dim(xs, 0);
        printf("device %d: %d rows, x = ", d, rows);
        print_mat(xh, rows);
        printf(" -> 2*x = ");
        print_mat(yh, rows);
        printf("\n");
    }
    CHECK(dpar_array_get(ya, y));
    printf("gathered shard_map(2*x) [8, 3] = ");
    print_mat(y, 8);
    printf("\n");

    dpar_array_destroy(ya);
    dpar_array_destroy(xa);
    dpar_mesh_destroy(mesh);
    dpar_runtime_destroy(rt);
    return 0;
}
