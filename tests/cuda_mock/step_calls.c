/* Run by tests/test_cuda_mock.sh against the mock driver (1 mock GPU): what
   one recorded training step of a small CNN asks of the driver, counted by
   the mock (mock_cuda_calls, found with dlsym on libcuda.so.1) over 10
   steps after the first ones recorded the graph. A steady step must not
   allocate or free device memory, must not touch NCCL or poll (a 1-device
   group is a copy, its gradients' reductions run nothing), puts its two
   feeds, reads its loss once (one blocking device-to-host copy, which also
   completes the index check's fetch, and no other synchronization) and
   replays its CUDA Graphs. DPAR_GRAPH_ASYNC_BYTES=1024
   makes every gradient big enough for the asynchronous reduction, so a
   1-device graph that handed one to the communication thread would show.
   The same step clipped by the global gradient norm (clip_norm, run op by op)
   then reads twice a step: the loss and every gradient's squared norm at once
   (a read each was a sync each), into the device's kept scratch: no
   allocation, no free (a cuMemFree waits for the whole device) and no stream
   synchronization beyond the reads themselves. Prints a "step calls:" line
   per graph and exits 0 when every count is within its limit, else names
   each count over it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"

enum { B = 8, S = 8, C = 4, NCLASS = 10, WARM = 3, STEPS = 10 };

typedef unsigned long (*calls_fn)(const char *name);
/* the entry points counted and the most one step may call each (-1: printed, any count); the 4
   kernels launched outside the CUDA Graph are the AdamW step's, one a parameter (not recorded); max_clip:
   the same with clip_norm, whose optimizer runs op by op */
static const struct {
    const char *name;
    long max, max_clip;
} counted[] = {
    { "cuMemAlloc_v2", 0, 0 },      { "cuMemFree_v2", 0, 0 },           { "cuStreamSynchronize", 0, 0 },
    { "cuStreamQuery", 0, -1 },     { "cuEventQuery", 0, -1 },          { "cuEventRecord", 0, -1 },
    { "cuStreamWaitEvent", 0, -1 }, { "cuMemcpyHtoDAsync_v2", 2, -1 },  { "cuMemcpyDtoHAsync_v2:pageable", 1, 2 },
    { "ncclAllReduce", 0, 0 },      { "cuGraphLaunch", -1, -1 },        { "cuLaunchKernel", 4, -1 },
    { "cublasSgemm_v2", -1, -1 },   { "cuMemcpyDtoDAsync_v2", -1, -1 },
};
enum { NCOUNTED = (int)(sizeof counted / sizeof counted[0]) };

static int fail(const char *what) {
    fprintf(stderr, "step_calls: %s: %s\n", what, dpar_last_error());
    return 1;
}

/* Parameters (conv w, conv b, dense w, dense b) with small fixed values. */
static dpar_status make_params(dpar_mesh *mesh, dpar_array *p[4]) {
    static const int64_t shape[4][4] = { { 3, 3, 1, C }, { C }, { (S / 2) * (S / 2) * C, NCLASS }, { NCLASS } };
    static const int ndim[4] = { 4, 1, 2, 1 };
    float v[(S / 2) * (S / 2) * C * NCLASS];
    for (int i = 0; i < 4; i++) {
        dpar_array_desc d = { .dtype = DPAR_F32, .ndim = ndim[i] };
        int64_t n = 1;
        for (int k = 0; k < d.ndim; k++) n *= d.shape[k] = shape[i][k];
        for (int64_t k = 0; k < n; k++) v[k] = (float)((k * 7 + i * 3) % 11 - 5) * 0.05f;
        dpar_status s = dpar_array_create(mesh, &d, &p[i]);
        if (!s) s = dpar_array_put(p[i], v);
        if (s) return s;
    }
    return DPAR_OK;
}

/* Feeds x [B, S, S, 1] and y [B]; conv 3x3 SAME + relu, 2x2 average pool, dense, cross-entropy, AdamW. */
static dpar_status make_graph(dpar_mesh *mesh, dpar_array *const param[4], float clip_norm, dpar_graph **out,
                              dpar_value *x, dpar_value *y) {
    const dpar_pool2d_desc pool = { .window = { 2, 2 }, .stride = { 2, 2 } };
    static const char *const names[4] = { "conv.w", "conv.b", "dense.w", "dense.b" };
    dpar_graph *g;
    dpar_status s = dpar_graph_create(mesh, &g);
    if (s) return s;
    *out = g;
    *x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 4, { B, S, S, 1 }, { "data" } });
    *y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { B }, { "data" } });
    dpar_value p[4], grad[4];
    for (int i = 0; i < 4; i++) p[i] = dpar_g_param(g, names[i], param[i]);
    dpar_value h = dpar_g_avg_pool2d(g, dpar_g_relu(g, dpar_g_conv2d(g, *x, p[0], p[1], NULL)), &pool);
    h = dpar_g_reshape(g, h, 2, (int64_t[]){ B, (S / 2) * (S / 2) * C });
    dpar_value loss = dpar_g_softmax_xent(g, dpar_g_bias_add(g, dpar_g_matmul(g, h, p[2], false, false), p[3]), *y);
    if ((s = dpar_graph_value_and_grad(g, loss, p, 4, grad))) return s;
    dpar_adamw_desc ad = { .learning_rate = 1e-3f, .weight_decay = 1e-4f, .clip_norm = clip_norm };
    if ((s = dpar_graph_adamw(g, &ad, p, grad, 4))) return s;
    return dpar_graph_compile(g, NULL);
}

/* WARM steps, then STEPS counted: prints the counts, returns how many exceed their limit (clip: max_clip) */
static int count_steps(dpar_graph *g, dpar_value x, dpar_value y, calls_fn calls, int clip) {
    float xb[B * S * S], loss = 0.0f;
    int32_t yb[B];
    unsigned long before[NCOUNTED];
    for (int step = 0; step < WARM + STEPS; step++) {
        if (step == WARM)
            for (int k = 0; k < NCOUNTED; k++) before[k] = calls(counted[k].name);
        for (int i = 0; i < B * S * S; i++) xb[i] = (float)((i * 13 + step) % 17) / 16.0f;
        for (int i = 0; i < B; i++) yb[i] = (i + step) % NCLASS;
        dpar_graph_feed f[2] = { { .value = x, .host = xb }, { .value = y, .host = yb } };
        if (dpar_graph_run(g, f, 2, &loss)) return fail("step");
    }
    int segments = 0, bad = 0;
    dpar_graph_recorded(g, &segments, NULL);
    printf("step calls (per step%s, %d recorded segment(s)):", clip ? ", clip_norm 1" : "", segments);
    for (int k = 0; k < NCOUNTED; k++) {
        unsigned long d = calls(counted[k].name) - before[k];
        long max = clip ? counted[k].max_clip : counted[k].max;
        printf(" %s %g", counted[k].name, (double)d / STEPS);
        if (max >= 0 && d > (unsigned long)max * STEPS) bad++;
    }
    printf("; loss %.6f\n", (double)loss);
    for (int k = 0; k < NCOUNTED; k++) {
        unsigned long d = calls(counted[k].name) - before[k];
        long max = clip ? counted[k].max_clip : counted[k].max;
        if (max >= 0 && d > (unsigned long)max * STEPS)
            fprintf(stderr, "step_calls: %s: %g per step, at most %ld expected\n", counted[k].name, (double)d / STEPS,
                    max);
    }
    if (!segments) fprintf(stderr, "step_calls: the step was not recorded as CUDA Graphs\n"), bad++;
    return bad;
}

int main(void) {
    setenv("DPAR_GRAPH_ASYNC_BYTES", "1024", 1); /* before the runtime reads it */
    dpar_runtime *rt;
    dpar_mesh *mesh;
    dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CUDA, .num_devices = 1 };
    if (dpar_runtime_create(&rd, &rt)) return fail("runtime");
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    calls_fn calls = lib ? (calls_fn)(size_t)dlsym(lib, "mock_cuda_calls") : NULL;
    if (!calls) {
        fprintf(stderr, "step_calls: libcuda.so.1 is not the mock driver (no mock_cuda_calls)\n");
        return 1;
    }
    if (dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { 1 }, .axis_names = { "data" } }, &mesh))
        return fail("mesh");
    dpar_array *param[4];
    dpar_value x, y;
    int bad = 0;
    if (make_params(mesh, param)) return fail("parameters");
    for (int clip = 0; clip < 2; clip++) {
        dpar_graph *g;
        if (make_graph(mesh, param, clip ? 1.0f : 0.0f, &g, &x, &y)) return fail("graph");
        bad += count_steps(g, x, y, calls, clip);
        dpar_graph_destroy(g);
    }
    dpar_runtime_destroy(rt);
    dlclose(lib);
    return bad ? 1 : 0;
}
