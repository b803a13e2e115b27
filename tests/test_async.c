/* Async collectives: every dpar_X_start + dpar_wait gives bit for bit what the
   blocking dpar_X gives, on the CPU backend, on a 2x2 mesh over one axis and
   over both. Each case is one row of `cases`; run_case issues the async form,
   then the blocking form while the async one may still be pending (so issue
   order is exercised too), waits, and compares the two outputs byte for byte. */
#include "testutil.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_equals_blocking),
        cmocka_unit_test(test_async_argument_errors),
    };
    return cmocka_run_group_tests_name("async", tests, NULL, NULL);
}
