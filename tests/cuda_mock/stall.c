/* Run by tests/test_cuda_mock.sh against the mock driver with
   MOCK_NCCL_STALL set: an NCCL collective that never completes must come
   back as an error (DPAR_ERR_TIMEOUT after DPAR_TIMEOUT_MS, or
   DPAR_ERR_BACKEND naming ncclCommGetAsyncError when NCCL reports an
   asynchronous error), never a hang, and the runtime must still shut down.
   Modes: (none) waits in dpar_runtime_device_sync; "error": NCCL reports an
   asynchronous error; "read": waits in dpar_buffer_read (a device-to-host
   copy, which blocks in the driver until the stream's work is done);
   "none": the function returns without waiting (the pmap's own clean-up
   finds the hang, and the pmap must still return it).
   Prints "ok: <status>: <text>" and exits 0 on the expected outcome. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"

static int read_mode, none_mode;
static dpar_status fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *x = dpar_ctx_arg(ctx, 0);
    dpar_status s;
    for (int i = 0; i < 5; i++)
        if ((s = dpar_psum(ctx, x, x, "data"))) return s;
    if (read_mode) {
        float h[64];
        return dpar_buffer_read(x, 0, h, sizeof h);
    }
    if (none_mode) return DPAR_OK;
    return dpar_runtime_device_sync(dpar_ctx_runtime(ctx), dpar_ctx_device(ctx));
}

int main(int argc, char **argv) {
    dpar_status want = argc > 1 && strcmp(argv[1], "error") == 0 ? DPAR_ERR_BACKEND : DPAR_ERR_TIMEOUT;
    read_mode = argc > 1 && strcmp(argv[1], "read") == 0;
    none_mode = argc > 1 && strcmp(argv[1], "none") == 0;
    const char *needle = want == DPAR_ERR_BACKEND ? "ncclCommGetAsyncError" : "did not complete";
    dpar_runtime_desc rd;
    memset(&rd, 0, sizeof rd);
    rd.backend = DPAR_BACKEND_CUDA;
    rd.num_devices = 2;
    rd.timeout_ms = 1500;
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&rd, &rt);
    if (s) {
        printf("runtime: %s: %s\n", dpar_status_string(s), dpar_last_error());
        return 1;
    }
    dpar_mesh *m = NULL;
    dpar_mesh_desc md;
    memset(&md, 0, sizeof md);
    md.ndim = 1;
    md.shape[0] = 2;
    md.axis_names[0] = "data";
    if ((s = dpar_mesh_create(rt, &md, &m))) {
        printf("mesh: %s\n", dpar_last_error());
        return 1;
    }
    float data[2 * 64] = { 0 };
    dpar_pmap_desc d;
    memset(&d, 0, sizeof d);
    d.axis = "data";
    d.fn = fn;
    d.num_inputs = 1;
    d.inputs[0].data = data;
    d.inputs[0].dtype = DPAR_F32;
    d.inputs[0].ndim = 2;
    d.inputs[0].shape[0] = 2;
    d.inputs[0].shape[1] = 64;
    d.inputs[0].in_axis = DPAR_MAPPED;
    s = dpar_pmap(m, &d);
    int ok = s == want && strstr(dpar_last_error(), needle) != NULL;
    printf("%s: %s: %s\n", ok ? "ok" : "UNEXPECTED", dpar_status_string(s), dpar_last_error());
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
    return ok ? 0 : 1;
}
