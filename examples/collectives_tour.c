/* A tour of the collectives on a 2x4 mesh (data, model) of 8 devices.

   Device d sits at mesh coordinates (data, model) = (d / 4, d % 4) and starts
   from one number built from its axis indices:

       x = 10 * axis_index("data") + axis_index("model")     (0..3, 10..13)

   Then psum, pmean, pmax and all_gather (tiled) of x, over "data" (groups of
   the 2 devices that share a model index), over "model" (groups of the 4
   devices that share a data index) and over "data,model" (all 8). Expected:

       over data:        psum 10+2m   pmean 5+m     pmax 10+m   gather [m, 10+m]
       over model:       psum 40d+6   pmean 10d+1.5 pmax 10d+3  gather [10d, .., 10d+3]
       over data,model:  psum 52      pmean 6.5     pmax 13     gather [0..3, 10..13]

   Usage: collectives_tour [--backend cpu|vulkan|cuda]     (default cpu) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"
#include "example_util.h"

enum { NDATA = 2, NMODEL = 4, NDEV = NDATA * NMODEL, NSETS = 3 };
static const char *AXES[NSETS] = { "data", "model", "data,model" };

/* What one device saw, filled in by that device only. */
typedef struct {
    float x;
    float sum[NSETS], mean[NSETS], max[NSETS];
    int n[NSETS];              /* group size */
    float gather[NSETS][NDEV]; /* n[k] values */
} result;

/* Reads a 1-element f32 buffer. */
static dpar_status read1(const dpar_buffer *b, float *v) {
    return dpar_buffer_read(b, 0, v, sizeof *v);
}

static dpar_status tour_fn(dpar_ctx *ctx, void *user) {
    result *r = (result *)user + dpar_ctx_device(ctx);
    int di, mi;
    TRY(dpar_ctx_axis_index(ctx, "data", &di));
    TRY(dpar_ctx_axis_index(ctx, "model", &mi));
    r->x = (float)(10 * di + mi);

    const int64_t one[1] = { 1 };
    dpar_buffer *x = NULL, *y = NULL, *g = NULL;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, one, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, one, &y);
    if (!s) s = dpar_buffer_write(x, 0, &r->x, sizeof r->x);
    for (int k = 0; k < NSETS && !s; k++) {
        s = dpar_ctx_axis_size(ctx, AXES[k], &r->n[k]);
        if (!s) s = dpar_psum(ctx, y, x, AXES[k]);
        if (!s) s = read1(y, &r->sum[k]);
        if (!s) s = dpar_pmean(ctx, y, x, AXES[k]);
        if (!s) s = read1(y, &r->mean[k]);
        if (!s) s = dpar_pmax(ctx, y, x, AXES[k]);
        if (!s) s = read1(y, &r->max[k]);
        const int64_t gshape[1] = { r->n[k] }; /* tiled: n * 1 elements */
        if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, gshape, &g);
        if (!s) s = dpar_all_gather(ctx, g, x, AXES[k], 0, true);
        if (!s) s = dpar_buffer_read(g, 0, r->gather[k], (size_t)r->n[k] * sizeof(float));
        dpar_buffer_destroy(g);
        g = NULL;
    }
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(x);
    return s;
}

int main(int argc, char **argv) {
    const char *backend_name = "cpu";
    const ex_flag flags[] = { EX_S("--backend", &backend_name, "cpu|vulkan|cuda") };
    int rc = ex_parse("collectives_tour", argc, argv, flags, 1);
    if (rc) return ex_exit_status(rc);
    dpar_backend_kind backend = parse_backend(backend_name);

    dpar_runtime *rt = NULL;
    dpar_mesh *mesh = NULL;
    CHECK(dpar_runtime_create(&(dpar_runtime_desc){ .backend = backend, .num_devices = NDEV }, &rt));
    CHECK(dpar_mesh_create(
        rt, &(dpar_mesh_desc){ .ndim = 2, .shape = { NDATA, NMODEL }, .axis_names = { "data", "model" } }, &mesh));
    printf("2x4 mesh (data=%d, model=%d) of %d %s devices; x = 10 * axis_index('data') + axis_index('model')\n", NDATA,
           NMODEL, NDEV, dpar_backend_name(dpar_runtime_backend(rt)));

    result res[NDEV];
    memset(res, 0, sizeof res);
    CHECK(dpar_shard_map(mesh, &(dpar_shard_map_desc){ .fn = tour_fn, .user = res }));

    for (int k = 0; k < NSETS; k++) {
        printf("\n== over '%s' (groups of %d devices)\n", AXES[k], res[0].n[k]);
        printf("dev  data model    x |  psum  pmean  pmax | all_gather\n");
        for (int d = 0; d < NDEV; d++) {
            const result *r = &res[d];
            int c[2];
            CHECK(dpar_mesh_coords(mesh, d, c));
            printf("%3d  %4d %5d  %3g | %5g %6g %5g | [", d, c[0], c[1], (double)r->x, (double)r->sum[k],
                   (double)r->mean[k], (double)r->max[k]);
            for (int i = 0; i < r->n[k]; i++) printf("%s%g", i ? ", " : "", (double)r->gather[k][i]);
            printf("]\n");
        }
    }

    dpar_mesh_destroy(mesh);
    dpar_runtime_destroy(rt);
    return 0;
}
