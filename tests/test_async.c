/* Async collectives: every dpar_X_start + dpar_wait gives bit for bit what the
   blocking dpar_X gives, on the CPU backend, on a 2x2 mesh over one axis and
   over both. Each case is one row of `cases`; run_case issues the async form,
   then the blocking form while the async one may still be pending (so issue
   order is exercised too), waits, and compares the two outputs byte for byte. */
#include "testutil.h"
#include <time.h>

enum {
    KIND_PREDUCE,
    KIND_PSUM,
    KIND_PMEAN,
    KIND_PMAX,
    KIND_PMIN,
    KIND_ALL_GATHER,
    KIND_PSUM_SCATTER,
    KIND_PPERMUTE,
    KIND_ALL_TO_ALL,
    KIND_PBROADCAST
};

typedef struct acase {
    const char *name;
    int kind;
    const char *axes;
    dpar_dtype dtype;
    dpar_reduce_op op; /* KIND_PREDUCE */
    int dim;           /* all_gather / psum_scatter */
    bool tiled;
    int root; /* pbroadcast */
} acase;

static const acase cases[] = {
    { .name = "preduce sum f32 data", .kind = KIND_PREDUCE, .axes = "data", .dtype = DPAR_F32, .op = DPAR_SUM },
    { .name = "preduce max f32 both", .kind = KIND_PREDUCE, .axes = "data,model", .dtype = DPAR_F32, .op = DPAR_MAX },
    { .name = "psum f32 both", .kind = KIND_PSUM, .axes = "data,model", .dtype = DPAR_F32 },
    { .name = "psum bf16 model", .kind = KIND_PSUM, .axes = "model", .dtype = DPAR_BF16 },
    { .name = "pmean f32 both", .kind = KIND_PMEAN, .axes = "data,model", .dtype = DPAR_F32 },
    { .name = "pmean bf16 data", .kind = KIND_PMEAN, .axes = "data", .dtype = DPAR_BF16 },
    { .name = "pmax f16 both", .kind = KIND_PMAX, .axes = "data,model", .dtype = DPAR_F16 },
    { .name = "pmin f32 model", .kind = KIND_PMIN, .axes = "model", .dtype = DPAR_F32 },
    { .name = "all_gather stacked dim 0", .kind = KIND_ALL_GATHER, .axes = "data,model", .dtype = DPAR_F32, .dim = 0 },
    { .name = "all_gather tiled dim 1",
      .kind = KIND_ALL_GATHER,
      .axes = "data",
      .dtype = DPAR_F32,
      .dim = 1,
      .tiled = true },
    { .name = "psum_scatter stacked dim 0",
      .kind = KIND_PSUM_SCATTER,
      .axes = "data,model",
      .dtype = DPAR_F32,
      .dim = 0 },
    { .name = "psum_scatter tiled dim 1",
      .kind = KIND_PSUM_SCATTER,
      .axes = "model",
      .dtype = DPAR_F32,
      .dim = 1,
      .tiled = true },
    { .name = "ppermute ring f32 both", .kind = KIND_PPERMUTE, .axes = "data,model", .dtype = DPAR_F32 },
    { .name = "ppermute ring i32 data", .kind = KIND_PPERMUTE, .axes = "data", .dtype = DPAR_I32 },
    { .name = "all_to_all split 0 concat 1", .kind = KIND_ALL_TO_ALL, .axes = "data,model", .dtype = DPAR_F32 },
    { .name = "all_to_all f16 model", .kind = KIND_ALL_TO_ALL, .axes = "model", .dtype = DPAR_F16 },
    { .name = "pbroadcast root 2 both", .kind = KIND_PBROADCAST, .axes = "data,model", .dtype = DPAR_F32, .root = 2 },
    { .name = "pbroadcast root 1 data", .kind = KIND_PBROADCAST, .axes = "data", .dtype = DPAR_I32, .root = 1 },
};
enum { NCASES = (int)(sizeof cases / sizeof cases[0]), NDEV = 4, ROWS = 3, COLS = 5 };

typedef struct job {
    const acase *c;
    int mismatch[NDEV]; /* byte offset + 1 of the first difference, 0 when equal */
} job;

/* Input shape of case c for group size n: [n*ROWS, n*COLS] (divisible along
   both dims for every kind); a stacked psum_scatter needs n along its dim. */
static void in_shape(const acase *c, int n, int64_t *is) {
    is[0] = (int64_t)n * ROWS;
    is[1] = (int64_t)n * COLS;
    if (c->kind == KIND_PSUM_SCATTER && !c->tiled) is[c->dim] = n;
}

/* Output shape (rank returned) of case c for input shape is, group size n. */
static int out_shape(const acase *c, int n, const int64_t *is, int64_t *os) {
    os[0] = is[0];
    os[1] = is[1];
    switch (c->kind) {
    case KIND_ALL_GATHER:
        if (c->tiled) {
            os[c->dim] *= n;
            return 2;
        }
        for (int d = 2; d > c->dim; d--) os[d] = is[d - 1];
        os[c->dim] = n;
        return 3;
    case KIND_PSUM_SCATTER:
        if (c->tiled) {
            os[c->dim] /= n;
            return 2;
        }
        os[0] = is[1 - c->dim];
        return 1;
    case KIND_ALL_TO_ALL:
        os[0] /= n;
        os[1] *= n;
        return 2;
    default: return 2;
    }
}

/* This device's input: values that round differently in each order of addition. */
static dpar_status make_input(dpar_ctx *ctx, const acase *c, const int64_t *shape, dpar_buffer **out) {
    dpar_status s = dpar_ctx_buffer(ctx, c->dtype, 2, shape, out);
    if (s) return s;
    int64_t count = shape[0] * shape[1];
    unsigned char *host = (unsigned char *)calloc((size_t)count, 4);
    if (!host) return DPAR_ERR_OUT_OF_MEMORY;
    int dev = dpar_ctx_device(ctx);
    for (int64_t i = 0; i < count; i++) {
        float v = (float)(sin(0.37 * (double)i + 1.3 * dev) * 1000.0 + 1e-3 * (double)(i % 7));
        if (c->dtype == DPAR_F32)
            memcpy(host + 4 * i, &v, 4);
        else if (c->dtype == DPAR_I32) {
            int32_t k = (int32_t)(v * 1000.0f);
            memcpy(host + 4 * i, &k, 4);
        } else {
            uint16_t h = c->dtype == DPAR_F16 ? dpar_f32_to_f16(v / 16.0f) : dpar_f32_to_bf16(v);
            memcpy(host + 2 * i, &h, 2);
        }
    }
    s = dpar_buffer_write(*out, 0, host, dpar_buffer_nbytes(*out));
    free(host);
    return s;
}

/* Blocking (req == NULL) or async form of case c. */
static dpar_status issue(dpar_ctx *ctx, const acase *c, dpar_buffer *out, const dpar_buffer *in, int n,
                         dpar_request **req) {
    int pairs[2 * NDEV];
    for (int k = 0; k < n; k++) {
        pairs[2 * k] = k;
        pairs[2 * k + 1] = (k + 1) % n;
    }
    switch (c->kind) {
    case KIND_PREDUCE:
        return req ? dpar_preduce_start(ctx, out, in, c->axes, c->op, req) : dpar_preduce(ctx, out, in, c->axes, c->op);
    case KIND_PSUM: return req ? dpar_psum_start(ctx, out, in, c->axes, req) : dpar_psum(ctx, out, in, c->axes);
    case KIND_PMEAN: return req ? dpar_pmean_start(ctx, out, in, c->axes, req) : dpar_pmean(ctx, out, in, c->axes);
    case KIND_PMAX: return req ? dpar_pmax_start(ctx, out, in, c->axes, req) : dpar_pmax(ctx, out, in, c->axes);
    case KIND_PMIN: return req ? dpar_pmin_start(ctx, out, in, c->axes, req) : dpar_pmin(ctx, out, in, c->axes);
    case KIND_ALL_GATHER:
        return req ? dpar_all_gather_start(ctx, out, in, c->axes, c->dim, c->tiled, req)
                   : dpar_all_gather(ctx, out, in, c->axes, c->dim, c->tiled);
    case KIND_PSUM_SCATTER:
        return req ? dpar_psum_scatter_start(ctx, out, in, c->axes, c->dim, c->tiled, req)
                   : dpar_psum_scatter(ctx, out, in, c->axes, c->dim, c->tiled);
    case KIND_PPERMUTE:
        return req ? dpar_ppermute_start(ctx, out, in, c->axes, pairs, n, req)
                   : dpar_ppermute(ctx, out, in, c->axes, pairs, n);
    case KIND_ALL_TO_ALL:
        return req ? dpar_all_to_all_start(ctx, out, in, c->axes, 0, 1, req)
                   : dpar_all_to_all(ctx, out, in, c->axes, 0, 1);
    case KIND_PBROADCAST:
        return req ? dpar_pbroadcast_start(ctx, out, in, c->axes, c->root, req)
                   : dpar_pbroadcast(ctx, out, in, c->axes, c->root);
    }
    return DPAR_ERR_INVALID_ARGUMENT;
}

static dpar_status compare(job *j, int dev, const dpar_buffer *a, const dpar_buffer *b) {
    size_t nb = dpar_buffer_nbytes(a);
    unsigned char *ha = (unsigned char *)malloc(nb + 1), *hb = (unsigned char *)malloc(nb + 1);
    dpar_status s = (ha && hb) ? DPAR_OK : DPAR_ERR_OUT_OF_MEMORY;
    if (!s) s = dpar_buffer_read(a, 0, ha, nb);
    if (!s) s = dpar_buffer_read(b, 0, hb, nb);
    for (size_t i = 0; !s && i < nb && !j->mismatch[dev]; i++)
        if (ha[i] != hb[i]) j->mismatch[dev] = (int)i + 1;
    free(ha);
    free(hb);
    return s;
}

static dpar_status run_case(dpar_ctx *ctx, void *user) {
    job *j = (job *)user;
    const acase *c = j->c;
    int n, dev = dpar_ctx_device(ctx);
    dpar_status s = dpar_ctx_axis_size(ctx, c->axes, &n);
    if (s) return s;
    dpar_buffer *in = NULL, *out_async = NULL, *out_sync = NULL;
    dpar_request *req = NULL;
    int64_t is[2], os[3];
    in_shape(c, n, is);
    int ond = out_shape(c, n, is, os);
    s = make_input(ctx, c, is, &in);
    if (!s) s = dpar_ctx_buffer(ctx, c->dtype, ond, os, &out_async);
    if (!s) s = dpar_ctx_buffer(ctx, c->dtype, ond, os, &out_sync);
    if (!s) s = issue(ctx, c, out_async, in, n, &req);
    if (!s) s = issue(ctx, c, out_sync, in, n, NULL); /* queued behind the async one */
    if (req) {
        dpar_status w = dpar_wait(ctx, req);
        if (!s) s = w;
    }
    if (!s) s = compare(j, dev, out_async, out_sync);
    dpar_buffer_destroy(in);
    dpar_buffer_destroy(out_async);
    dpar_buffer_destroy(out_sync);
    return s;
}

static void test_async_equals_blocking(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, NDEV);
    dpar_mesh *m = t_mesh(rt, 2, (const int[]){ 2, 2 }, (const char *const[]){ "data", "model" });
    for (int i = 0; i < NCASES; i++) {
        job j = { .c = &cases[i] };
        dpar_status s = dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = run_case, .user = &j });
        if (s) fail_msg("%s: %s: %s", cases[i].name, dpar_status_string(s), dpar_last_error());
        for (int d = 0; d < NDEV; d++)
            if (j.mismatch[d])
                fail_msg("%s: device %d: async and blocking results differ at byte %d", cases[i].name, d,
                         j.mismatch[d] - 1);
    }
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

/* Argument errors come back from the start call, with *req NULL. */
static dpar_status run_bad_args(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *b = NULL;
    dpar_request *req = (dpar_request *)&req;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, (const int64_t[]){ 4 }, &b);
    if (s) return s;
    dpar_status e1 = dpar_ppermute_start(ctx, b, b, "data", NULL, 1, &req);
    int ok = e1 == DPAR_ERR_INVALID_ARGUMENT && req == NULL && strstr(dpar_last_error(), "dpar_ppermute_start");
    dpar_status e2 = dpar_preduce_start(ctx, b, b, "data", (dpar_reduce_op)9, &req);
    ok = ok && e2 == DPAR_ERR_INVALID_ARGUMENT && req == NULL;
    dpar_status e3 = dpar_pbroadcast_start(ctx, b, b, "data", 0, NULL);
    ok = ok && e3 == DPAR_ERR_INVALID_ARGUMENT;
    dpar_buffer_destroy(b);
    return ok ? DPAR_OK : DPAR_ERR_STATE;
}

static void test_async_argument_errors(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = run_bad_args }));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- non-blocking dispatch: dpar_pmap_start / dpar_shard_map_start / dpar_graph_run_start ---- */

/* y = 2 x + position, held (when `hold` is set) until the host releases it: proves the start call
   returned while the step still ran. Gives up after 20 s so a blocking start fails instead of hanging. */
typedef struct held {
    int hold, released, entered;
} held;
static dpar_status held_fn(dpar_ctx *ctx, void *user) {
    held *h = (held *)user;
    __atomic_add_fetch(&h->entered, 1, __ATOMIC_ACQ_REL);
    for (int i = 0; h->hold && !__atomic_load_n(&h->released, __ATOMIC_ACQUIRE); i++) {
        if (i > 20000) return dpar_set_last_error(DPAR_ERR_TIMEOUT, "held_fn: never released");
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    dpar_buffer *x = dpar_ctx_arg(ctx, 0), *y = dpar_ctx_arg(ctx, 1);
    dpar_status s = dpar_copy(y, x);
    if (!s) s = dpar_scale(y, 2.0f);
    dpar_buffer *p = NULL;
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, (const int64_t[]){ 3 }, &p);
    if (!s) s = dpar_fill(p, (float)dpar_ctx_position(ctx));
    if (!s) s = dpar_axpy(y, 1.0f, p);
    dpar_buffer_destroy(p);
    return s;
}
static dpar_pmap_desc held_desc(held *h, const float *x, float *y) {
    dpar_pmap_desc d;
    memset(&d, 0, sizeof d);
    d.axis = "data", d.fn = held_fn, d.user = h;
    d.inputs[0].data = x, d.inputs[0].dtype = DPAR_F32, d.inputs[0].ndim = 2;
    d.inputs[0].shape[0] = 4, d.inputs[0].shape[1] = 3;
    d.outputs[0].data = y, d.outputs[0].dtype = DPAR_F32, d.outputs[0].ndim = 1, d.outputs[0].shape[0] = 3;
    return d;
}

/* The step runs while the host goes on; dpar_test says not done until it is; the result is the blocking one's,
   bit for bit; every call that would touch the runtime meanwhile is refused with DPAR_ERR_STATE. */
static void test_pmap_start_nonblocking(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    float x[12], y_sync[12], y_async[12];
    for (int i = 0; i < 12; i++) x[i] = 0.25f * (float)i - 1.0f;
    held hs = { 0, 0, 0 }, ha = { 1, 0, 0 };
    dpar_pmap_desc ds = held_desc(&hs, x, y_sync), da = held_desc(&ha, x, y_async);
    T_OK(dpar_pmap(m, &ds));
    dpar_request *req = NULL;
    T_OK(dpar_pmap_start(m, &da, &req));
    assert_non_null(req);
    bool done = true;
    T_OK(dpar_test(NULL, req, &done));
    assert_false(done); /* held until released below */

    /* the thread-safety rule while the step is in flight */
    dpar_array *a = NULL;
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, (const int64_t[]){ 3 }, &b)); /* made before: allowed */
    dpar_request *req2 = (dpar_request *)&req2;
    T_ERR(dpar_pmap_start(m, &ds, &req2), DPAR_ERR_STATE, "dpar_pmap_start", "in flight", "dpar_wait");
    assert_null(req2);
    T_ERR(dpar_pmap(m, &ds), DPAR_ERR_STATE, "dpar_pmap", "in flight");
    T_ERR(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = held_fn }), DPAR_ERR_STATE, "in flight");
    T_ERR(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 1, { 4 }, { "data" } }, &a), DPAR_ERR_STATE,
          "dpar_array_create", "in flight");
    float tmp[3];
    T_ERR(dpar_buffer_read(b, 0, tmp, sizeof tmp), DPAR_ERR_STATE, "dpar_buffer_read", "in flight");
    T_ERR(dpar_buffer_destroy(b), DPAR_ERR_STATE, "dpar_buffer_destroy");
    T_ERR(dpar_mesh_destroy(m), DPAR_ERR_STATE, "dpar_mesh_destroy");
    T_ERR(dpar_runtime_destroy(rt), DPAR_ERR_STATE, "dpar_runtime_destroy", "in flight");

    __atomic_store_n(&ha.released, 1, __ATOMIC_RELEASE);
    for (int i = 0; !done && i < 20000; i++) { /* poll as a frame loop would */
        T_OK(dpar_test(NULL, req, &done));
        struct timespec ts = { 0, 1000000 };
        if (!done) nanosleep(&ts, NULL);
    }
    assert_true(done);
    T_OK(dpar_wait(NULL, req));
    assert_int_equal(ha.entered, 4);
    assert_memory_equal(y_sync, y_async, sizeof y_sync);
    assert_true(y_async[3 * 3 + 2] == 2.0f * x[3 * 3 + 2] + 3.0f); /* device 3's row, exact */
    /* waited: the handle is gone, the runtime usable again */
    T_ERR(dpar_wait(NULL, req), DPAR_ERR_INVALID_ARGUMENT, "dpar_wait", "not yet waited");
    T_ERR(dpar_test(NULL, req, &done), DPAR_ERR_INVALID_ARGUMENT, "dpar_test");
    T_OK(dpar_buffer_read(b, 0, tmp, sizeof tmp));
    T_OK(dpar_buffer_destroy(b));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

/* Errors of the step come back from dpar_wait (text prefixed as the blocking call's), argument errors from
   the start call; a failed step leaves the runtime free for the next one. */
static void test_step_errors(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    float x[12] = { 0 }, y[12];
    held h = { 0, 0, 0 };
    dpar_pmap_desc d = held_desc(&h, x, y);
    d.inputs[0].shape[0] = 3; /* not the axis size */
    dpar_request *req = NULL;
    T_OK(dpar_pmap_start(m, &d, &req));
    T_ERR(dpar_wait(NULL, req), DPAR_ERR_SHAPE, "dpar_pmap: input 0", "leading dimension 3");
    T_ERR(dpar_pmap_start(m, &d, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_pmap_start", "req");
    T_ERR(dpar_pmap_start(NULL, &d, &req), DPAR_ERR_INVALID_ARGUMENT, "dpar_pmap_start");
    assert_null(req);
    T_ERR(dpar_shard_map_start(m, NULL, &req), DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map_start");
    T_ERR(dpar_graph_run_start(NULL, NULL, 0, NULL, &req), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run_start");
    T_ERR(dpar_wait(NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_wait");
    T_ERR(dpar_test(NULL, NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_test");
    d.inputs[0].shape[0] = 4;
    T_OK(dpar_pmap_start(m, &d, &req)); /* the failed step freed the runtime */
    T_OK(dpar_wait(NULL, req));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

/* A training step of a graph started and waited gives the blocking run's loss and parameters bit for bit,
   over several steps (a frame loop that starts one step per frame). */
typedef struct lin {
    dpar_array *w;
    dpar_graph *g;
    dpar_value x, y;
} lin;
static void lin_build(dpar_mesh *m, lin *l) {
    const float w0[4 * 2] = { 0.1f, -0.2f, 0.3f, 0.05f, -0.1f, 0.2f, 0.0f, 0.4f };
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 2, { 4, 2 }, { NULL } }, &l->w));
    T_OK(dpar_array_put(l->w, w0));
    T_OK(dpar_graph_create(m, &l->g));
    dpar_array_desc xd = { DPAR_F32, 2, { 8, 4 }, { "data" } }, yd = { DPAR_F32, 2, { 8, 2 }, { "data" } };
    l->x = dpar_g_feed(l->g, "x", &xd), l->y = dpar_g_feed(l->g, "y", &yd);
    dpar_value w = dpar_g_param(l->g, "w", l->w), gw;
    dpar_value loss = dpar_g_mse(l->g, dpar_g_matmul(l->g, l->x, w, false, false), l->y);
    T_OK(dpar_graph_value_and_grad(l->g, loss, &w, 1, &gw));
    dpar_sgd_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.learning_rate = 0.05f, sd.momentum = 0.9f;
    T_OK(dpar_graph_sgd(l->g, &sd, &w, &gw, 1));
}
static void test_graph_run_start_equals_blocking(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    lin a, b;
    lin_build(m, &a);
    lin_build(m, &b);
    float x[8 * 4], y[8 * 2], la = 0, lb = 0, wa[8], wb[8];
    for (int i = 0; i < 32; i++) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 16; i++) y[i] = (float)((i * 5) % 7) / 7.0f;
    for (int step = 0; step < 5; step++) {
        dpar_graph_feed fa[2] = { { a.x, x, NULL }, { a.y, y, NULL } }, fb[2] = { { b.x, x, NULL }, { b.y, y, NULL } };
        T_OK(dpar_graph_run(a.g, fa, 2, &la));
        dpar_request *req = NULL;
        T_OK(dpar_graph_run_start(b.g, fb, 2, &lb, &req));
        memset(fb, 0, sizeof fb); /* the feed array was copied: only the data must stay */
        T_OK(dpar_wait(NULL, req));
        assert_memory_equal(&la, &lb, sizeof la);
    }
    T_OK(dpar_array_get(a.w, wa));
    T_OK(dpar_array_get(b.w, wb));
    assert_memory_equal(wa, wb, sizeof wa);
    T_OK(dpar_graph_destroy(a.g));
    T_OK(dpar_graph_destroy(b.g));
    T_OK(dpar_array_destroy(a.w));
    T_OK(dpar_array_destroy(b.w));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_equals_blocking),           cmocka_unit_test(test_async_argument_errors),
        cmocka_unit_test(test_pmap_start_nonblocking),          cmocka_unit_test(test_step_errors),
        cmocka_unit_test(test_graph_run_start_equals_blocking),
    };
    return cmocka_run_group_tests_name("async", tests, NULL, NULL);
}
