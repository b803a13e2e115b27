/* Sharded arrays: reshard between specs (all_to_all, all_gather, local
   slices, host fallback), shard_map with in/out specs, ZeRO-1. */
#include "testutil.h"
#include "util/dpar_train.h"

static dpar_array *arr2(dpar_mesh *m, dpar_dtype t, int64_t d0, int64_t d1, const char *s0, const char *s1) {
    dpar_array_desc d = { .dtype = t, .ndim = 2, .shape = { d0, d1 }, .spec = { s0, s1 } };
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &d, &a));
    return a;
}
static void iota(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = (float)i + 0.25f;
}
/* The backend of a test comes from its state (CPU, or Vulkan / CUDA when
   present: skipped, never passed, when missing). */
static dpar_runtime *rt_for(void **st, int n) {
    dpar_backend_kind k = st && *st ? *(const dpar_backend_kind *)*st : DPAR_BACKEND_CPU;
    return k == DPAR_BACKEND_CPU ? t_runtime(k, n) : t_runtime_or_skip(k, n);
}

/* The exact case: 8x4 rows-split over 4 devices -> columns: device d gets column d (8x1). */
static void test_rows_to_columns(void **st) {
    dpar_runtime *rt = rt_for(st, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    dpar_array *rows = arr2(m, DPAR_F32, 8, 4, "data", NULL), *cols = arr2(m, DPAR_F32, 8, 4, NULL, "data");
    float x[32], y[32];
    iota(x, 32);
    T_OK(dpar_array_put(rows, x));
    T_OK(dpar_array_reshard(cols, rows));
    for (int d = 0; d < 4; d++) {
        dpar_buffer *b = dpar_array_shard(cols, d);
        assert_int_equal(dpar_buffer_dim(b, 0), 8);
        assert_int_equal(dpar_buffer_dim(b, 1), 1);
        float col[8];
        T_OK(dpar_buffer_read(b, 0, col, sizeof col));
        for (int r = 0; r < 8; r++) assert_true(col[r] == x[r * 4 + d]);
    }
    T_OK(dpar_array_get(cols, y));
    assert_memory_equal(x, y, sizeof x);
    /* and back: columns -> rows gives device d rows 2d, 2d+1 */
    dpar_array *back = arr2(m, DPAR_F32, 8, 4, "data", NULL);
    T_OK(dpar_array_reshard(back, cols));
    for (int d = 0; d < 4; d++) {
        float blk[8];
        T_OK(dpar_buffer_read(dpar_array_shard(back, d), 0, blk, sizeof blk));
        assert_memory_equal(blk, x + 8 * d, sizeof blk);
    }
    char spec[32];
    T_OK(dpar_array_spec(cols, 1, spec, sizeof spec));
    assert_string_equal(spec, "data");
    T_OK(dpar_array_spec(cols, 0, spec, sizeof spec));
    assert_string_equal(spec, "");
    assert_int_equal(dpar_array_shard_dim(rows, 0), 2);
    assert_int_equal(dpar_array_dtype(rows), DPAR_F32);
    assert_ptr_equal(dpar_array_mesh(rows), m);
    dpar_runtime_destroy(rt);
}

/* split <-> replicated, and the other paths, on a 2x4 mesh (data, model); i32 too */
static void test_reshard_paths(void **st) {
    dpar_runtime *rt = rt_for(st, 8);
    const int shape[2] = { 2, 4 };
    const char *names[2] = { "data", "model" };
    dpar_mesh *m = t_mesh(rt, 2, shape, names);
    enum { R = 8, C = 8 };
    int32_t x[R * C], y[R * C];
    for (int i = 0; i < R * C; i++) x[i] = i * 7 - 3;
    const char *specs[][2] = {
        { NULL, NULL },         { "data", NULL },       { NULL, "model" },
        { "data", "model" },    { "model", "data" },    { "data,model", NULL },
        { NULL, "data,model" }, { "model,data", NULL }, { "model", NULL },
    };
    int ns = (int)(sizeof specs / sizeof specs[0]);
    for (int a = 0; a < ns; a++)
        for (int b = 0; b < ns; b++) {
            dpar_array *src = arr2(m, DPAR_I32, R, C, specs[a][0], specs[a][1]);
            dpar_array *dst = arr2(m, DPAR_I32, R, C, specs[b][0], specs[b][1]);
            T_OK(dpar_array_put(src, x));
            T_OK(dpar_array_reshard(dst, src));
            memset(y, 0, sizeof y);
            T_OK(dpar_array_get(dst, y));
            if (memcmp(x, y, sizeof x))
                fail_msg("reshard (%s,%s) -> (%s,%s) changed the data", specs[a][0] ? specs[a][0] : "-",
                         specs[a][1] ? specs[a][1] : "-", specs[b][0] ? specs[b][0] : "-",
                         specs[b][1] ? specs[b][1] : "-");
            /* every replica holds its block, not just the canonical one */
            for (int dev = 0; dev < 8; dev++) {
                dpar_buffer *sh = dpar_array_shard(dst, dev);
                int64_t r0 = dpar_buffer_dim(sh, 0), c0 = dpar_buffer_dim(sh, 1);
                int32_t blk[R * C];
                T_OK(dpar_buffer_read(sh, 0, blk, (size_t)(r0 * c0) * 4));
                int coords[2];
                T_OK(dpar_mesh_coords(m, dev, coords));
                /* offset of this device's block along each dim */
                int64_t off[2];
                for (int d = 0; d < 2; d++) {
                    const char *sp = specs[b][d];
                    int64_t k = 0;
                    if (sp) {
                        if (!strcmp(sp, "data"))
                            k = coords[0];
                        else if (!strcmp(sp, "model"))
                            k = coords[1];
                        else if (!strcmp(sp, "data,model"))
                            k = coords[0] * 4 + coords[1];
                        else
                            k = coords[1] * 2 + coords[0];
                    }
                    off[d] = k * (d ? c0 : r0);
                }
                for (int i = 0; i < r0; i++)
                    for (int j = 0; j < c0; j++)
                        if (blk[i * c0 + j] != x[(off[0] + i) * C + off[1] + j])
                            fail_msg("reshard to (%s,%s): device %d has a wrong block", specs[b][0] ? specs[b][0] : "-",
                                     specs[b][1] ? specs[b][1] : "-", dev);
            }
            dpar_array_destroy(src);
            dpar_array_destroy(dst);
        }
    dpar_runtime_destroy(rt);
}

static void test_reshard_errors(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data"), *m2 = t_mesh1(rt, 4, "data");
    dpar_array *a = arr2(m, DPAR_F32, 8, 4, "data", NULL);
    dpar_array *b = arr2(m, DPAR_F32, 8, 8, NULL, "data");
    dpar_array *c = arr2(m, DPAR_I32, 8, 4, NULL, "data");
    dpar_array *e = arr2(m2, DPAR_F32, 8, 4, NULL, "data");
    T_ERR(dpar_array_reshard(b, a), DPAR_ERR_SHAPE, "[8, 8]", "[8, 4]");
    T_ERR(dpar_array_reshard(c, a), DPAR_ERR_DTYPE, "i32", "f32");
    T_ERR(dpar_array_reshard(e, a), DPAR_ERR_INVALID_ARGUMENT, "different meshes");
    T_ERR(dpar_array_reshard(NULL, a), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_OK(dpar_array_reshard(a, a));
    char small[2];
    dpar_array *mm = NULL;
    const int sh[2] = { 2, 2 };
    const char *nm[2] = { "data", "model" };
    dpar_runtime_destroy(rt);
    rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m3 = t_mesh(rt, 2, sh, nm);
    mm = arr2(m3, DPAR_F32, 4, 4, "data,model", NULL);
    T_ERR(dpar_array_spec(mm, 0, small, sizeof small), DPAR_ERR_INVALID_ARGUMENT, "too small");
    T_ERR(dpar_array_spec(mm, 5, small, sizeof small), DPAR_ERR_INVALID_ARGUMENT, "out of range");
    dpar_runtime_destroy(rt);
}

/* shard_map with P('batch', None, None): a replicated [4,3,2] array is seen
   as [1,3,2] shards; the output spec assembles the result into a replicated array. */
static dpar_status double_it(dpar_ctx *ctx, void *user) {
    int *bad = (int *)user;
    dpar_buffer *in = dpar_ctx_arg(ctx, 0), *out = dpar_ctx_arg(ctx, 1);
    if (dpar_buffer_dim(in, 0) != 1 || dpar_buffer_dim(in, 1) != 3 || dpar_buffer_dim(in, 2) != 2)
        __atomic_store_n(bad, 1, __ATOMIC_RELAXED);
    dpar_status s = dpar_copy(out, in);
    return s ? s : dpar_scale(out, 2.0f);
}
static void test_shard_map_specs(void **st) {
    dpar_runtime *rt = rt_for(st, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "batch");
    dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 3, .shape = { 4, 3, 2 } };
    dpar_array *x = NULL, *y = NULL, *ys = NULL;
    T_OK(dpar_array_create(m, &d, &x)); /* replicated */
    T_OK(dpar_array_create(m, &d, &y)); /* replicated output */
    d.spec[0] = "batch";
    T_OK(dpar_array_create(m, &d, &ys)); /* output already in the out spec: written in place */
    float h[24], r[24];
    iota(h, 24);
    T_OK(dpar_array_put(x, h));
    int bad = 0;
    dpar_shard_map_specs_desc sd = { .fn = double_it,
                                     .user = &bad,
                                     .num_inputs = 1,
                                     .num_outputs = 1,
                                     .inputs = { x },
                                     .in_specs[0][0] = "batch",
                                     .outputs = { y },
                                     .out_specs[0][0] = "batch" };
    T_OK(dpar_shard_map_specs(m, &sd));
    assert_int_equal(bad, 0);
    T_OK(dpar_array_get(y, r));
    for (int i = 0; i < 24; i++) assert_true(r[i] == 2.0f * h[i]);
    /* every replica of y got the whole result */
    float blk[24];
    T_OK(dpar_buffer_read(dpar_array_shard(y, 3), 0, blk, sizeof blk));
    assert_memory_equal(blk, r, sizeof blk);
    sd.outputs[0] = ys;
    T_OK(dpar_shard_map_specs(m, &sd));
    T_OK(dpar_array_get(ys, r));
    for (int i = 0; i < 24; i++) assert_true(r[i] == 2.0f * h[i]);
    /* errors name the argument */
    sd.in_specs[0][1] = "model";
    T_ERR(dpar_shard_map_specs(m, &sd), DPAR_ERR_UNKNOWN_AXIS, "input 0", "model", "batch");
    sd.in_specs[0][1] = NULL;
    sd.in_specs[0][1] = "batch";
    T_ERR(dpar_shard_map_specs(m, &sd), DPAR_ERR_INVALID_ARGUMENT, "input 0");
    sd.in_specs[0][1] = NULL;
    sd.out_specs[0][1] = "batch";
    sd.out_specs[0][0] = NULL;
    T_ERR(dpar_shard_map_specs(m, &sd), DPAR_ERR_SHAPE, "output 0", "3");
    sd.num_inputs = DPAR_MAX_ARGS;
    T_ERR(dpar_shard_map_specs(m, &sd), DPAR_ERR_INVALID_ARGUMENT, "num_inputs");
    dpar_runtime_destroy(rt);
}

/* ZeRO-1 vs plain data parallelism: same parameters bit for bit (4 devices:
   the mean is a multiply by 1/4 both ways), padded [10] and [8,4] params. */
enum { ZP = 2 };
typedef struct {
    dpar_array *p[ZP], *g[ZP], *v[ZP], *pz[ZP], *gz[ZP];
    dpar_zero1 *z;
    dpar_sgd_desc sgd;
    int step;
    const char *axis;
} zero_case;
static dpar_status fill_grads(dpar_ctx *ctx, dpar_array *const *g, int step) {
    int dev = dpar_ctx_device(ctx);
    for (int i = 0; i < ZP; i++) {
        dpar_buffer *b = dpar_array_shard(g[i], dev);
        int64_t n = dpar_buffer_count(b);
        float v[64];
        for (int64_t k = 0; k < n; k++) v[k] = sinf((float)(k * 3 + dev * 17 + step * 5 + i)) * (float)(dev + 1);
        dpar_status s = dpar_buffer_write(b, 0, v, (size_t)n * 4);
        if (s) return s;
    }
    return DPAR_OK;
}
static dpar_status dp_step(dpar_ctx *ctx, void *user) {
    zero_case *c = (zero_case *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_status s = fill_grads(ctx, c->g, c->step);
    dpar_buffer *p[ZP], *g[ZP], *v[ZP];
    for (int i = 0; i < ZP && !s; i++) {
        p[i] = dpar_array_shard(c->p[i], dev);
        g[i] = dpar_array_shard(c->g[i], dev);
        v[i] = dpar_array_shard(c->v[i], dev);
        s = dpar_pmean(ctx, g[i], g[i], c->axis);
    }
    return s ? s : dpar_sgd_step(ctx, &c->sgd, p, g, v, ZP);
}
static dpar_status z_step(dpar_ctx *ctx, void *user) {
    zero_case *c = (zero_case *)user;
    dpar_status s = fill_grads(ctx, c->gz, c->step);
    dpar_buffer *g[ZP];
    for (int i = 0; i < ZP; i++) g[i] = dpar_array_shard(c->gz[i], dpar_ctx_device(ctx));
    return s ? s : dpar_zero1_step(ctx, c->z, g);
}
/* mode 0: 1-d mesh of 4, ZeRO over "data"; mode 1: 2x2 (data, model), over
   "data,model"; mode 2: 2x2, over "data" only (replicated over "model"). */
static void zero_run(void **st, float clip, int mode) {
    dpar_runtime *rt = rt_for(st, 4);
    int on_cpu = dpar_runtime_backend(rt) == DPAR_BACKEND_CPU;
    const int sh2[2] = { 2, 2 };
    const char *nm2[2] = { "data", "model" };
    dpar_mesh *m = mode ? t_mesh(rt, 2, sh2, nm2) : t_mesh1(rt, 4, "data");
    zero_case c;
    memset(&c, 0, sizeof c);
    c.axis = mode == 1 ? "data,model" : "data";
    int n = mode == 2 ? 2 : 4;
    int64_t shp[ZP][2] = { { 10, 1 }, { 8, 4 } };
    float init[32];
    for (int i = 0; i < ZP; i++) {
        c.p[i] = arr2(m, DPAR_F32, shp[i][0], shp[i][1], NULL, NULL);
        c.g[i] = arr2(m, DPAR_F32, shp[i][0], shp[i][1], NULL, NULL);
        c.v[i] = arr2(m, DPAR_F32, shp[i][0], shp[i][1], NULL, NULL);
        c.pz[i] = arr2(m, DPAR_F32, shp[i][0], shp[i][1], NULL, NULL);
        c.gz[i] = arr2(m, DPAR_F32, shp[i][0], shp[i][1], NULL, NULL);
        for (int k = 0; k < 32; k++) init[k] = cosf((float)(k + i));
        T_OK(dpar_array_put(c.p[i], init));
        T_OK(dpar_array_put(c.pz[i], init));
    }
    c.sgd.learning_rate = 0.05f;
    c.sgd.momentum = 0.9f;
    c.sgd.weight_decay = 0.01f;
    c.sgd.clip_norm = clip;
    c.sgd.norm_axes = NULL;
    dpar_zero1_desc zd = { .sgd = c.sgd, .axis = c.axis, .num_params = ZP, .params = { c.pz[0], c.pz[1] } };
    T_OK(dpar_zero1_create(&zd, &c.z));
    int64_t p0 = (10 + n - 1) / n * n;
    assert_int_equal(dpar_zero1_padded_count(c.z, 0), p0);
    assert_int_equal(dpar_zero1_padded_count(c.z, 1), 32);
    /* momentum per device: (12 + 32) / 4 floats instead of 10 + 32 on 4 devices */
    for (int d = 0; d < 4; d++) assert_int_equal(dpar_zero1_momentum_bytes(c.z, d), (size_t)(p0 + 32) / (size_t)n * 4);
    dpar_shard_map_desc a = { .fn = dp_step, .user = &c }, b = { .fn = z_step, .user = &c };
    for (c.step = 0; c.step < 5; c.step++) {
        T_OK(dpar_shard_map(m, &a));
        T_OK(dpar_shard_map(m, &b));
    }
    for (int i = 0; i < ZP; i++) {
        float x[32], y[32], y0[32];
        int cnt = (int)(shp[i][0] * shp[i][1]);
        for (int d = 0; d < 4; d++) { /* each device's copy (mode 2: differs along "model") */
            T_OK(dpar_buffer_read(dpar_array_shard(c.p[i], d), 0, x, (size_t)cnt * 4));
            T_OK(dpar_buffer_read(dpar_array_shard(c.pz[i], d), 0, y, (size_t)cnt * 4));
            for (int k = 0; k < cnt; k++)
                /* bitwise on the CPU (same reduction order, the mean a multiply by 1/n
                   both ways for n = 2, 4); a GPU library's all-reduce may add in another
                   order than its reduce-scatter */
                if ((clip > 0 || !on_cpu) ? fabsf(x[k] - y[k]) > 1e-6f * (1 + fabsf(x[k])) : x[k] != y[k])
                    fail_msg("device %d param %d[%d]: data parallel %.9g, ZeRO-1 %.9g", d, i, k, (double)x[k],
                             (double)y[k]);
            /* the replicas over the ZeRO axis are bitwise the same */
            if (d == 0)
                memcpy(y0, y, sizeof y0);
            else if (mode != 2)
                assert_memory_equal(y0, y, (size_t)cnt * 4);
        }
        /* the padding stays zero */
        float pm[12];
        if (i == 0 && p0 == 12) {
            T_OK(dpar_array_get(dpar_zero1_master(c.z, 0), pm));
            assert_true(pm[10] == 0.0f && pm[11] == 0.0f);
            T_OK(dpar_array_get(dpar_zero1_momentum(c.z, 0), pm));
            assert_true(pm[10] == 0.0f && pm[11] == 0.0f);
        }
    }
    dpar_zero1_destroy(c.z);
    dpar_runtime_destroy(rt);
}
static void test_zero1_matches_dp(void **st) {
    zero_run(st, 0.0f, 0);
}
static void test_zero1_clipped(void **st) {
    zero_run(st, 0.5f, 0);
}
static void test_zero1_two_axes(void **st) {
    zero_run(st, 0.0f, 1);
}
static void test_zero1_sub_axis(void **st) {
    zero_run(st, 0.0f, 2);
    zero_run(st, 0.5f, 2);
}

typedef struct {
    dpar_zero1 *z;
    dpar_array *g;
} bad_step;
static dpar_status zero_bad_step(dpar_ctx *ctx, void *user) {
    bad_step *b = (bad_step *)user;
    dpar_buffer *g = dpar_array_shard(b->g, dpar_ctx_device(ctx));
    return dpar_zero1_step(ctx, b->z, &g);
}
static void test_zero1_errors(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    dpar_zero1_desc zd = { .sgd.learning_rate = 0.1f, .num_params = 1 };
    dpar_zero1 *z = NULL;
    zd.params[0] = arr2(m, DPAR_F32, 8, 4, "data", NULL);
    T_ERR(dpar_zero1_create(&zd, &z), DPAR_ERR_INVALID_ARGUMENT, "split");
    assert_null(z);
    zd.params[0] = arr2(m, DPAR_I32, 8, 4, NULL, NULL);
    T_ERR(dpar_zero1_create(&zd, &z), DPAR_ERR_DTYPE, "i32");
    zd.params[0] = arr2(m, DPAR_F32, 8, 4, NULL, NULL);
    zd.axis = "model";
    T_ERR(dpar_zero1_create(&zd, &z), DPAR_ERR_UNKNOWN_AXIS, "model", "data");
    zd.axis = NULL;
    zd.num_params = 0;
    T_ERR(dpar_zero1_create(&zd, &z), DPAR_ERR_INVALID_ARGUMENT, "num_params");
    zd.num_params = 1;
    zd.sgd.learning_rate = -1.0f;
    T_ERR(dpar_zero1_create(&zd, &z), DPAR_ERR_INVALID_ARGUMENT, "learning_rate");
    /* a gradient of the wrong size: every device fails, named */
    zd.sgd.learning_rate = 0.1f;
    T_OK(dpar_zero1_create(&zd, &z));
    bad_step b = { z, arr2(m, DPAR_F32, 4, 4, NULL, NULL) };
    dpar_shard_map_desc sd = { .fn = zero_bad_step, .user = &b };
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_SHAPE, "grads[0]", "16", "32");
    dpar_buffer *none[1] = { NULL }; /* named alone: it said "ctx, z or grads is NULL" */
    T_ERR(dpar_zero1_step(NULL, z, none), DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_step: ctx is NULL");
    dpar_zero1_destroy(z);
    dpar_runtime_destroy(rt);
}

/* Megatron tensor parallelism with exact small integers on a 2x2 (data, model)
   mesh: x [4,3] (batch over "data"), W1 [3,4] column-parallel (None, "model"),
   W2 [4,2] row-parallel ("model", None); forward y = relu(x W1) W2 with one
   psum over "model"; backward for dy = given, one psum over "model" for dx;
   weight gradients psum'd over "data". Compared with a host reference. */
enum { TB = 4, TI = 3, TH = 4, TO = 2 };
static dpar_status tp_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *x = dpar_ctx_arg(ctx, 0), *w1 = dpar_ctx_arg(ctx, 1), *w2 = dpar_ctx_arg(ctx, 2),
                *dy = dpar_ctx_arg(ctx, 3);
    dpar_buffer *y = dpar_ctx_arg(ctx, 4), *dx = dpar_ctx_arg(ctx, 5), *dw1 = dpar_ctx_arg(ctx, 6),
                *dw2 = dpar_ctx_arg(ctx, 7);
    int64_t hs[2] = { dpar_buffer_dim(x, 0), dpar_buffer_dim(w1, 1) };
    dpar_buffer *hp = NULL, *h = NULL, *dh = NULL;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 2, hs, &hp);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, hs, &h);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, hs, &dh);
    if (!s) s = dpar_matmul(hp, x, w1, false, false, 1.0f, 0.0f); /* column-parallel: no communication */
    if (!s) s = dpar_relu(h, hp);
    if (!s) s = dpar_matmul(y, h, w2, false, false, 1.0f, 0.0f); /* row-parallel: partial sums */
    if (!s) s = dpar_psum(ctx, y, y, "model");                   /* the forward all-reduce */
    if (!s) s = dpar_matmul(dw2, h, dy, true, false, 1.0f, 0.0f);
    if (!s) s = dpar_matmul(dh, dy, w2, false, true, 1.0f, 0.0f);
    if (!s) s = dpar_relu_backward(dh, dh, hp);
    if (!s) s = dpar_matmul(dw1, x, dh, true, false, 1.0f, 0.0f);
    if (!s) s = dpar_matmul(dx, dh, w1, false, true, 1.0f, 0.0f);
    if (!s) s = dpar_psum(ctx, dx, dx, "model"); /* the backward all-reduce */
    if (!s) s = dpar_psum(ctx, dw1, dw1, "data");
    if (!s) s = dpar_psum(ctx, dw2, dw2, "data");
    dpar_buffer_destroy(hp);
    dpar_buffer_destroy(h);
    dpar_buffer_destroy(dh);
    return s;
}
static void test_megatron_exact(void **st) {
    dpar_runtime *rt = rt_for(st, 4);
    const int sh[2] = { 2, 2 };
    const char *nm[2] = { "data", "model" };
    dpar_mesh *m = t_mesh(rt, 2, sh, nm);
    float x[TB * TI], w1[TI * TH], w2[TH * TO], dy[TB * TO];
    for (int i = 0; i < TB * TI; i++) x[i] = (float)((i * 5) % 7 - 3);
    for (int i = 0; i < TI * TH; i++) w1[i] = (float)((i * 3) % 5 - 2);
    for (int i = 0; i < TH * TO; i++) w2[i] = (float)((i * 7) % 9 - 4);
    for (int i = 0; i < TB * TO; i++) dy[i] = (float)(i % 3 - 1);
    /* host reference */
    double hp[TB * TH], y[TB * TO] = { 0 }, dh[TB * TH] = { 0 }, dx[TB * TI] = { 0 }, dw1[TI * TH] = { 0 },
                               dw2[TH * TO] = { 0 };
    for (int b = 0; b < TB; b++)
        for (int j = 0; j < TH; j++) {
            hp[b * TH + j] = 0;
            for (int i = 0; i < TI; i++) hp[b * TH + j] += x[b * TI + i] * w1[i * TH + j];
        }
    for (int b = 0; b < TB; b++)
        for (int o = 0; o < TO; o++)
            for (int j = 0; j < TH; j++) y[b * TO + o] += (hp[b * TH + j] > 0 ? hp[b * TH + j] : 0) * w2[j * TO + o];
    for (int j = 0; j < TH; j++)
        for (int o = 0; o < TO; o++)
            for (int b = 0; b < TB; b++) dw2[j * TO + o] += (hp[b * TH + j] > 0 ? hp[b * TH + j] : 0) * dy[b * TO + o];
    for (int b = 0; b < TB; b++)
        for (int j = 0; j < TH; j++) {
            for (int o = 0; o < TO; o++) dh[b * TH + j] += dy[b * TO + o] * w2[j * TO + o];
            if (hp[b * TH + j] <= 0) dh[b * TH + j] = 0;
        }
    for (int i = 0; i < TI; i++)
        for (int j = 0; j < TH; j++)
            for (int b = 0; b < TB; b++) dw1[i * TH + j] += x[b * TI + i] * dh[b * TH + j];
    for (int b = 0; b < TB; b++)
        for (int i = 0; i < TI; i++)
            for (int j = 0; j < TH; j++) dx[b * TI + i] += dh[b * TH + j] * w1[i * TH + j];
    /* device arrays: stored replicated, seen through in/out specs */
    dpar_array *ax = arr2(m, DPAR_F32, TB, TI, NULL, NULL), *aw1 = arr2(m, DPAR_F32, TI, TH, NULL, NULL);
    dpar_array *aw2 = arr2(m, DPAR_F32, TH, TO, NULL, NULL), *ady = arr2(m, DPAR_F32, TB, TO, NULL, NULL);
    dpar_array *ay = arr2(m, DPAR_F32, TB, TO, NULL, NULL), *adx = arr2(m, DPAR_F32, TB, TI, NULL, NULL);
    dpar_array *adw1 = arr2(m, DPAR_F32, TI, TH, NULL, NULL), *adw2 = arr2(m, DPAR_F32, TH, TO, NULL, NULL);
    T_OK(dpar_array_put(ax, x));
    T_OK(dpar_array_put(aw1, w1));
    T_OK(dpar_array_put(aw2, w2));
    T_OK(dpar_array_put(ady, dy));
    dpar_shard_map_specs_desc d = { .fn = tp_fn,
                                    .num_inputs = 4,
                                    .num_outputs = 4,
                                    .inputs[0] = ax,
                                    .in_specs[0][0] = "data",
                                    .inputs[1] = aw1,
                                    .in_specs[1][1] = "model",
                                    .inputs[2] = aw2,
                                    .in_specs[2][0] = "model",
                                    .inputs[3] = ady,
                                    .in_specs[3][0] = "data",
                                    .outputs[0] = ay,
                                    .out_specs[0][0] = "data",
                                    .outputs[1] = adx,
                                    .out_specs[1][0] = "data",
                                    .outputs[2] = adw1,
                                    .out_specs[2][1] = "model",
                                    .outputs[3] = adw2,
                                    .out_specs[3][0] = "model" };
    T_OK(dpar_shard_map_specs(m, &d));
    float r[TB * TH];
    const struct {
        dpar_array *a;
        const double *ref;
        int n;
        const char *name;
    } cmp[4] = { { ay, y, TB * TO, "y" },
                 { adx, dx, TB * TI, "dx" },
                 { adw1, dw1, TI * TH, "dW1" },
                 { adw2, dw2, TH * TO, "dW2" } };
    for (int k = 0; k < 4; k++) {
        T_OK(dpar_array_get(cmp[k].a, r));
        for (int i = 0; i < cmp[k].n; i++)
            if ((double)r[i] != cmp[k].ref[i])
                fail_msg("%s[%d] = %g, reference %g", cmp[k].name, i, (double)r[i], cmp[k].ref[i]);
    }
    dpar_runtime_destroy(rt);
}

static dpar_backend_kind cpu = DPAR_BACKEND_CPU, vulkan = DPAR_BACKEND_VULKAN, cuda = DPAR_BACKEND_CUDA;
#define ON(f, k) \
    { #f "/" #k, f, NULL, NULL, &k }
int main(void) {
    const struct CMUnitTest tests[] = {
        ON(test_rows_to_columns, cpu),
        ON(test_reshard_paths, cpu),
        cmocka_unit_test(test_reshard_errors),
        ON(test_shard_map_specs, cpu),
        ON(test_megatron_exact, cpu),
        ON(test_zero1_matches_dp, cpu),
        ON(test_zero1_clipped, cpu),
        ON(test_zero1_two_axes, cpu),
        ON(test_zero1_sub_axis, cpu),
        cmocka_unit_test(test_zero1_errors),
        /* the same on the GPU backends, through the backend interface */
        ON(test_rows_to_columns, vulkan),
        ON(test_reshard_paths, vulkan),
        ON(test_shard_map_specs, vulkan),
        ON(test_megatron_exact, vulkan),
        ON(test_zero1_matches_dp, vulkan),
        ON(test_rows_to_columns, cuda),
        ON(test_reshard_paths, cuda),
        ON(test_shard_map_specs, cuda),
        ON(test_zero1_matches_dp, cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
