/* The same program on the 0.2 names only, built with DPAR_NO_DEPRECATED by
   tests/test_api_compat.sh: destroys return a status, backend names parse
   with dpar_backend_from_name. */
#include <stdio.h>
#include <string.h>
#include "dpar.h"

static dpar_status fn(dpar_ctx *ctx, void *user) {
    int *out = (int *)user;
    int idx = -1, size = -1;
    dpar_status s = dpar_ctx_axis_index(ctx, "data", &idx);
    if (!s) s = dpar_ctx_axis_size(ctx, "data", &size);
    if (!s) out[dpar_ctx_device(ctx)] = idx * 10 + size;
    return s;
}

int main(void) {
    dpar_runtime_desc rd;
    memset(&rd, 0, sizeof rd);
    if (dpar_backend_from_name("cpu", &rd.backend)) {
        fprintf(stderr, "%s\n", dpar_last_error());
        return 1;
    }
    rd.num_devices = 2;
    dpar_runtime *rt = NULL;
    if (dpar_runtime_create(&rd, &rt)) {
        fprintf(stderr, "%s\n", dpar_last_error());
        return 1;
    }
    int first = -1, count = -1;
    dpar_runtime_local_devices(rt, &first, &count);
    dpar_device_info info;
    dpar_device_stats st;
    int bad = dpar_runtime_device_count(rt) != 2 || dpar_runtime_process_index(rt) != 0 ||
              dpar_runtime_process_count(rt) != 1 || first != 0 || count != 2 ||
              dpar_runtime_device_info(rt, 1, &info) != DPAR_OK || !info.runs_on_cpu ||
              dpar_runtime_device_sync(rt, 0) != DPAR_OK || dpar_runtime_device_stats(rt, 0, &st) != DPAR_OK;
    dpar_runtime_stats_reset(rt);
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
    bad = bad || dpar_buffer_create(rt, 0, DPAR_F32, 1, shape, &b) || dpar_buffer_destroy(b);
    bad = bad || dpar_mesh_destroy(m) || dpar_runtime_destroy(rt);
    if (bad) {
        fprintf(stderr, "new names: wrong result: %s\n", dpar_last_error());
        return 1;
    }
    printf("new names: ok\n");
    return 0;
}
