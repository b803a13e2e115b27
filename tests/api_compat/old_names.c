/* A program written against the 0.1 API: every renamed function under its old
   name, destroys used as statements. It must keep compiling (with deprecation
   warnings) and running for one release; tests/test_api_compat.sh builds it. */
#include <stdio.h>
#include <string.h>
#include "dpar.h"

static dpar_status fn(dpar_ctx *ctx, void *user) {
    int *out = (int *)user;
    int idx = -1, size = -1;
    dpar_status s = dpar_axis_index(ctx, "data", &idx);
    if (!s) s = dpar_axis_size(ctx, "data", &size);
    if (!s) out[dpar_ctx_device(ctx)] = idx * 10 + size;
    return s;
}

int main(void) {
    dpar_runtime_desc rd;
    memset(&rd, 0, sizeof rd);
    rd.backend = DPAR_BACKEND_CPU;
    rd.num_devices = 2;
    rd.vulkan_force_noncoherent = 0; /* a moved field: tools/rename_api.sh rewrites it as a member */
    dpar_runtime *rt = NULL;
    if (dpar_runtime_create(&rd, &rt)) {
        fprintf(stderr, "%s\n", dpar_last_error());
        return 1;
    }
    int first = -1, count = -1;
    dpar_local_devices(rt, &first, &count);
    dpar_device_info info;
    dpar_device_stats st;
    int bad = dpar_device_count(rt) != 2 || dpar_process_index(rt) != 0 || dpar_process_count(rt) != 1 || first != 0 ||
              count != 2 || dpar_device_info_get(rt, 1, &info) != DPAR_OK || dpar_device_sync(rt, 0) != DPAR_OK ||
              dpar_device_stats_get(rt, 0, &st) != DPAR_OK;
    dpar_stats_reset(rt);
    dpar_mesh_desc md;
    memset(&md, 0, sizeof md);
    md.ndim = 1;
    md.shape[0] = 2;
    md.axis_names[0] = "data";
    dpar_mesh *m = NULL;
    int got[2] = { 0, 0 };
    dpar_shard_map_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.fn = fn;
    sd.user = got;
    bad = bad || dpar_mesh_create(rt, &md, &m) || dpar_shard_map(m, &sd) || got[0] != 2 || got[1] != 12;
    dpar_buffer *b = NULL;
    int64_t shape[1] = { 4 };
    if (dpar_buffer_create(rt, 0, DPAR_F32, 1, shape, &b) == DPAR_OK) dpar_buffer_destroy(b);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
    if (bad) {
        fprintf(stderr, "old names: wrong result: %s\n", dpar_last_error());
        return 1;
    }
    printf("old names: ok\n");
    return 0;
}
