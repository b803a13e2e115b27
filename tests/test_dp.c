/* The data-parallel helper (dpar_dp_*): gradient bucketing keyed by
   parameter, async bucket all-reduce overlapping the backward pass, f16/bf16
   communication with f32 accumulation, and its errors. */
#include "testutil.h"
#include "util/dpar_train.h"

enum { NP = 5 };
static const int64_t shapes[NP][2] = { { 3, 5 }, { 7, 0 }, { 100, 0 }, { 1, 0 }, { 33, 3 } };

typedef struct {
    dpar_dp *dp;
    dpar_array *g[NP];
    int order_by_device; /* odd devices mark gradients ready in reverse order */
    int nparams;
    float value; /* fill value for the f16 test (all devices) */
    int use_value;
    int blocking_calls; /* call grad_ready for only some parameters, finish does the rest */
} dp_job;

static float val(int dev, int p, int64_t i) {
    return (float)((p * 7 + i % 11 + 1) * (dev + 1));
}

static dpar_array *garr(dpar_mesh *m, int p) {
    dpar_array_desc d = { .dtype = DPAR_F32, .ndim = shapes[p][1] ? 2 : 1, .shape = { shapes[p][0], shapes[p][1] } };
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &d, &a));
    return a;
}

static dpar_status step(dpar_ctx *ctx, void *user) {
    dp_job *j = (dp_job *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_status s;
    /* "backward": write this device's gradients */
    for (int p = 0; p < j->nparams; p++) {
        dpar_buffer *b = dpar_array_shard(j->g[p], dev);
        int64_t n = dpar_buffer_count(b);
        float *h = (float *)malloc((size_t)(n ? n : 1) * 4);
        for (int64_t i = 0; i < n; i++) h[i] = j->use_value ? j->value : val(dev, p, i);
        s = dpar_buffer_write(b, 0, h, (size_t)n * 4);
        free(h);
        if (s) return s;
    }
    if ((s = dpar_dp_begin(j->dp, ctx))) return s;
    int last = j->blocking_calls ? j->nparams / 2 : j->nparams;
    for (int k = 0; k < last; k++) {
        int p = (j->order_by_device && dev % 2) ? j->nparams - 1 - k : k;
        if ((s = dpar_dp_grad_ready(j->dp, ctx, p))) return s;
    }
    return dpar_dp_finish(j->dp, ctx);
}

static void check_mean(dp_job *j, dpar_mesh *m, int n, int sum) {
    for (int p = 0; p < j->nparams; p++)
        for (int dev = 0; dev < n; dev++) {
            dpar_buffer *b = dpar_array_shard(j->g[p], dev);
            int64_t cnt = dpar_buffer_count(b);
            float *h = (float *)malloc((size_t)cnt * 4);
            T_OK(dpar_buffer_read(b, 0, h, (size_t)cnt * 4));
            for (int64_t i = 0; i < cnt; i++) {
                double want = 0;
                for (int d = 0; d < n; d++) want += val(d, p, i);
                if (!sum) want /= n;
                if (fabs(h[i] - want) > 1e-6 * fabs(want))
                    fail_msg("param %d device %d element %lld: %g, want %g", p, dev, (long long)i, (double)h[i], want);
            }
            free(h);
        }
    (void)m;
}

static void run_case(int n, size_t cap, int order, int blocking, int sum, int partial, int expect_buckets) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, n);
    dpar_mesh *m = t_mesh1(rt, n, "data");
    dp_job j;
    memset(&j, 0, sizeof j);
    j.nparams = NP;
    j.order_by_device = order;
    j.blocking_calls = partial;
    dpar_dp_desc dd = { .axes = "data", .bucket_bytes = cap, .blocking = blocking, .sum = sum };
    T_OK(dpar_dp_create(m, &dd, &j.dp));
    for (int p = 0; p < NP; p++) {
        int id = -1;
        j.g[p] = garr(m, p);
        T_OK(dpar_dp_add(j.dp, j.g[p], &id));
        assert_int_equal(id, p);
    }
    if (expect_buckets > 0) assert_int_equal(dpar_dp_bucket_count(j.dp), expect_buckets);
    dpar_shard_map_desc sd = { .fn = step, .user = &j };
    for (int rep = 0; rep < 3; rep++) {
        T_OK(dpar_shard_map(m, &sd));
        check_mean(&j, m, n, sum);
    }
    /* one all-reduce per bucket per step */
    dpar_device_stats st;
    T_OK(dpar_runtime_device_stats(rt, 0, &st));
    assert_int_equal((int)st.collectives, 3 * dpar_dp_bucket_count(j.dp));
    dpar_dp_destroy(j.dp);
    dpar_runtime_destroy(rt);
}

/* default 25 MiB: all five gradients in one bucket, one collective a step */
static void test_default_one_bucket(void **state) {
    (void)state;
    run_case(4, 0, 0, 0, 0, 0, 1);
}
/* 200-byte buckets: (33x3) alone, then (1)+(100), (7)+(3x5)... several buckets */
static void test_small_buckets(void **state) {
    (void)state;
    run_case(4, 200, 0, 0, 0, 0, -1);
    run_case(2, 200, 0, 0, 1, 0, -1);
    run_case(8, 64, 0, 0, 0, 0, -1);
}
/* reverse registration order, capacity respected, a big tensor gets its own bucket */
static void test_bucket_assignment(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_dp *dp;
    dpar_dp_desc dd = { .axes = "data", .bucket_bytes = 32 * 4 };
    T_OK(dpar_dp_create(m, &dd, &dp));
    for (int p = 0; p < NP; p++) T_OK(dpar_dp_add(dp, garr(m, p), NULL));
    /* reverse registration order, 32 floats a bucket: [99] [1] [100] [7 + 15] */
    assert_int_equal(dpar_dp_bucket_count(dp), 4);
    dpar_dp_destroy(dp);
    dpar_runtime_destroy(rt);
}
/* devices mark gradients ready in different orders: buckets still pair up */
static void test_arrival_order_independent(void **state) {
    (void)state;
    run_case(4, 200, 1, 0, 0, 0, -1);
    run_case(2, 64, 1, 0, 1, 0, -1);
}
/* blocking (no overlap) mode, and finish launching what was never marked */
static void test_blocking_and_partial(void **state) {
    (void)state;
    run_case(4, 200, 0, 1, 0, 0, -1);
    run_case(4, 200, 1, 0, 0, 1, -1);
}

/* The small input: 8 devices each with gradient 10000.0, f16
   communication, mean: f32 accumulation gives 80000 / 8 = 10000, not inf. */
static void f16_case(dpar_dtype comm, int sum, float want) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    dpar_mesh *m = t_mesh1(rt, 8, "data");
    dp_job j;
    memset(&j, 0, sizeof j);
    j.nparams = 2;
    j.use_value = 1;
    j.value = 10000.0f;
    dpar_dp_desc dd = { .axes = "data", .comm_dtype = comm, .sum = sum };
    T_OK(dpar_dp_create(m, &dd, &j.dp));
    for (int p = 0; p < 2; p++) {
        j.g[p] = garr(m, p);
        T_OK(dpar_dp_add(j.dp, j.g[p], NULL));
    }
    dpar_shard_map_desc sd = { .fn = step, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    for (int dev = 0; dev < 8; dev++)
        for (int p = 0; p < 2; p++) {
            float h[15];
            dpar_buffer *b = dpar_array_shard(j.g[p], dev);
            T_OK(dpar_buffer_read(b, 0, h, (size_t)dpar_buffer_count(b) * 4));
            for (int64_t i = 0; i < dpar_buffer_count(b); i++) {
                if (isinf(want))
                    assert_true(isinf(h[i]) && h[i] > 0);
                else if (h[i] != want)
                    fail_msg("%s dev %d param %d: %g, want %g", dpar_dtype_name(comm), dev, p, (double)h[i],
                             (double)want);
            }
        }
    dpar_dp_destroy(j.dp);
    dpar_runtime_destroy(rt);
}
static void test_f16_mean_no_overflow(void **state) {
    (void)state;
    f16_case(DPAR_F16, 0, 10000.0f);
    f16_case(DPAR_BF16, 0, 9984.0f); /* 10000 rounds to 9984 in bf16 (8 significant bits) */
    f16_case(DPAR_F16, 1, INFINITY); /* the sum, 80000, is beyond f16 (max 65504): inf, as documented */
    f16_case(DPAR_BF16, 1, 79872.0f);
}
/* f16 communication of non-trivial values: within f16 rounding of the f32 mean */
static dpar_status step_vals(dpar_ctx *ctx, void *user) {
    return step(ctx, user);
}
static void test_f16_values(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    dp_job j;
    memset(&j, 0, sizeof j);
    j.nparams = NP;
    dpar_dp_desc dd = { .axes = "data", .comm_dtype = DPAR_F16, .bucket_bytes = 100 };
    T_OK(dpar_dp_create(m, &dd, &j.dp));
    for (int p = 0; p < NP; p++) {
        j.g[p] = garr(m, p);
        T_OK(dpar_dp_add(j.dp, j.g[p], NULL));
    }
    dpar_shard_map_desc sd = { .fn = step_vals, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    for (int p = 0; p < NP; p++) {
        dpar_buffer *b = dpar_array_shard(j.g[p], 3);
        int64_t cnt = dpar_buffer_count(b);
        float *h = (float *)malloc((size_t)cnt * 4);
        T_OK(dpar_buffer_read(b, 0, h, (size_t)cnt * 4));
        for (int64_t i = 0; i < cnt; i++) {
            double want = 0;
            for (int d = 0; d < 4; d++) want += val(d, p, i);
            want /= 4;
            assert_true(fabs(h[i] - want) <= fabs(want) / 1024.0);
        }
        free(h);
    }
    dpar_dp_destroy(j.dp);
    dpar_runtime_destroy(rt);
}

/* buckets of 256 KiB and more go to the communication thread (async): two
   280 KB gradients in two buckets, marked ready in opposite orders */
typedef struct {
    dpar_dp *dp;
    dpar_array *g[2];
} big_job;
static dpar_status big_step(dpar_ctx *ctx, void *user) {
    big_job *j = (big_job *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_status s;
    for (int p = 0; p < 2; p++) {
        dpar_buffer *b = dpar_array_shard(j->g[p], dev);
        if ((s = dpar_fill(b, (float)((p + 1) * (dev + 1))))) return s;
    }
    if ((s = dpar_dp_begin(j->dp, ctx))) return s;
    for (int k = 0; k < 2; k++)
        if ((s = dpar_dp_grad_ready(j->dp, ctx, dev % 2 ? k : 1 - k))) return s;
    return dpar_dp_finish(j->dp, ctx);
}
static void test_async_buckets(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    big_job j;
    dpar_dp_desc dd = { .axes = "data", .bucket_bytes = 300000 };
    T_OK(dpar_dp_create(m, &dd, &j.dp));
    for (int p = 0; p < 2; p++) {
        dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 1, .shape = { 70000 } };
        T_OK(dpar_array_create(m, &d, &j.g[p]));
        T_OK(dpar_dp_add(j.dp, j.g[p], NULL));
    }
    assert_int_equal(dpar_dp_bucket_count(j.dp), 2);
    dpar_shard_map_desc sd = { .fn = big_step, .user = &j };
    for (int rep = 0; rep < 4; rep++) {
        T_OK(dpar_shard_map(m, &sd));
        for (int dev = 0; dev < 4; dev++)
            for (int p = 0; p < 2; p++) {
                float h[3];
                T_OK(dpar_buffer_read(dpar_array_shard(j.g[p], dev), 4 * 69997, h, sizeof h));
                for (int i = 0; i < 3; i++) assert_true(h[i] == (float)(p + 1) * 2.5f); /* mean of (p+1)(1+2+3+4)/4 */
            }
    }
    dpar_device_stats st;
    T_OK(dpar_runtime_device_stats(rt, 3, &st));
    assert_int_equal((int)st.collectives, 8);
    dpar_dp_destroy(j.dp);
    dpar_runtime_destroy(rt);
}

/* The vectorized f16 paths (F16C where the CPU has it) give the same bits as
   the scalar conversions: an f16 psum over every one of the 65536 f16 bit
   patterns (paired with a reversed copy), and f32 -> f16 -> f32 gradient
   packing of special and random values through the helper. */
typedef struct {
    dpar_buffer *in[2], *out[2];
} bits_job;
static dpar_status bits_step(dpar_ctx *ctx, void *user) {
    bits_job *j = (bits_job *)user;
    int d = dpar_ctx_device(ctx);
    return dpar_psum(ctx, j->out[d], j->in[d], "data");
}
static void test_f16_bits_match_scalar(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    enum { N = 65536 };
    int64_t n = N;
    bits_job j;
    uint16_t *a = (uint16_t *)malloc(N * 2), *b = (uint16_t *)malloc(N * 2), *r = (uint16_t *)malloc(N * 2);
    for (int i = 0; i < N; i++) {
        a[i] = (uint16_t)i;
        b[i] = (uint16_t)(N - 1 - i) ^ 0x5a5a;
    }
    for (int d = 0; d < 2; d++) {
        T_OK(dpar_buffer_create(rt, d, DPAR_F16, 1, &n, &j.in[d]));
        T_OK(dpar_buffer_create(rt, d, DPAR_F16, 1, &n, &j.out[d]));
    }
    T_OK(dpar_buffer_write(j.in[0], 0, a, N * 2));
    T_OK(dpar_buffer_write(j.in[1], 0, b, N * 2));
    dpar_shard_map_desc sd = { .fn = bits_step, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_buffer_read(j.out[1], 0, r, N * 2));
    for (int i = 0; i < N; i++) {
        volatile float x = dpar_f16_to_f32(a[i]), y = dpar_f16_to_f32(b[i]);
        uint16_t want = dpar_f32_to_f16(x + y);
        if (r[i] != want) fail_msg("f16 psum of 0x%04x + 0x%04x: 0x%04x, scalar 0x%04x", a[i], b[i], r[i], want);
    }
    /* f32 -> f16 -> f32 through the helper's packing, 1-device groups excluded:
       use the 2-device mesh with zeros on device 1 and sum */
    enum { M = 4099 };
    float *g = (float *)malloc(M * 4), *back = (float *)malloc(M * 4);
    const float specials[] = { 0.0f,     -0.0f,         1.0f,          -1.0f,    65504.0f,         65519.99f,
                               65520.0f, 1e30f,         -1e30f,        INFINITY, -INFINITY,        NAN,
                               5.96e-8f, 2.98e-8f,      2.99e-8f,      6.1e-5f,  6.103515625e-05f, 1e-10f,
                               0.1f,     1.0009765625f, 1.00048828125f };
    uint64_t st = 7;
    for (int i = 0; i < M; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        g[i] =
            i < (int)(sizeof specials / sizeof specials[0]) ? specials[i] : t_u2f((uint32_t)(st >> 32) & 0xc7ffffffu);
    }
    dpar_dp *dp;
    dpar_dp_desc dd = { .axes = "data", .comm_dtype = DPAR_F16, .sum = true };
    T_OK(dpar_dp_create(m, &dd, &dp));
    dp_job dj;
    memset(&dj, 0, sizeof dj);
    dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 1, .shape = { M } };
    T_OK(dpar_array_create(m, &ad, &dj.g[0]));
    T_OK(dpar_dp_add(dp, dj.g[0], NULL));
    T_OK(dpar_buffer_write(dpar_array_shard(dj.g[0], 0), 0, g, M * 4));
    dj.dp = dp;
    dj.nparams = 0; /* the step writes nothing: device 1 keeps zeros */
    sd.fn = step;
    sd.user = &dj;
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_buffer_read(dpar_array_shard(dj.g[0], 1), 0, back, M * 4));
    for (int i = 0; i < M; i++) {
        float want = dpar_f16_to_f32(dpar_f32_to_f16(dpar_f16_to_f32(dpar_f32_to_f16(g[i])) + 0.0f));
        if (t_f2u(back[i]) != t_f2u(want))
            fail_msg("f16 comm of %a (0x%08x): %a, scalar %a", (double)g[i], t_f2u(g[i]), (double)back[i],
                     (double)want);
    }
    dpar_dp_destroy(dp);
    free(a);
    free(b);
    free(r);
    free(g);
    free(back);
    dpar_runtime_destroy(rt);
}

/* The CPU backend's intra-op threads (DPAR_CPU_THREADS) split large matrix
   products by columns and SGD steps by elements, with work taken
   dynamically: the bits must not depend on the thread count. */
typedef struct {
    dpar_buffer *a, *b, *c, *p, *g, *v;
} mt_job;
static dpar_status mt_step(dpar_ctx *ctx, void *user) {
    mt_job *j = (mt_job *)user;
    (void)ctx;
    dpar_sgd_desc sd = { .learning_rate = 0.01f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-4f };
    dpar_status s;
    for (int t = 0; t < 2; t++) {
        if ((s = dpar_matmul(j->c, j->a, j->b, t == 1, false, 0.5f, t ? 1.0f : 0.0f))) return s;
        if ((s = dpar_matmul(j->g, j->a, j->c, true, false, 1.0f, 0.0f))) return s;
        if ((s = dpar_sgd_update(&sd, j->p, j->g, j->v, 1.0f))) return s;
    }
    return DPAR_OK;
}
static void mt_run(const char *threads, float *c_out, float *p_out) {
    dpar_runtime *rt = t_cpu_runtime_threads(threads);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    enum { K = 300, MN = 300, NBIG = 300 * 1000 };
    int64_t sa[2] = { K, MN }, sc[2] = { MN, 1000 }, sg[2] = { MN, 1000 };
    mt_job j;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sa, &j.a));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sc, &j.b));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sc, &j.c));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sg, &j.p));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sg, &j.g));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sg, &j.v));
    float *h = (float *)malloc(NBIG * 4);
    uint64_t st = 1;
    for (int i = 0; i < NBIG; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((int)(st >> 40) % 2001 - 1000) / 997.0f;
    }
    T_OK(dpar_buffer_write(j.a, 0, h, (size_t)K * MN * 4));
    T_OK(dpar_buffer_write(j.b, 0, h + 7, (size_t)NBIG * 4 - 28));
    T_OK(dpar_buffer_write(j.p, 0, h, (size_t)NBIG * 4));
    free(h);
    dpar_shard_map_desc sd = { .fn = mt_step, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_buffer_read(j.c, 0, c_out, (size_t)NBIG * 4));
    T_OK(dpar_buffer_read(j.p, 0, p_out, (size_t)NBIG * 4));
    dpar_runtime_destroy(rt);
}
static void test_threads_bitwise(void **state) {
    (void)state;
    enum { NBIG = 300 * 1000 };
    float *c1 = (float *)malloc(NBIG * 4), *p1 = (float *)malloc(NBIG * 4), *c3 = (float *)malloc(NBIG * 4),
          *p3 = (float *)malloc(NBIG * 4);
    mt_run("1", c1, p1);
    mt_run("3", c3, p3);
    assert_memory_equal(c1, c3, (size_t)NBIG * 4);
    assert_memory_equal(p1, p3, (size_t)NBIG * 4);
    free(c1);
    free(p1);
    free(c3);
    free(p3);
}

static dpar_status bad_calls(dpar_ctx *ctx, void *user) {
    dpar_dp *dp = (dpar_dp *)user;
    T_ERR(dpar_dp_grad_ready(dp, ctx, 0), DPAR_ERR_STATE, "dpar_dp_begin");
    T_ERR(dpar_dp_finish(dp, ctx), DPAR_ERR_STATE, "dpar_dp_begin");
    T_OK(dpar_dp_begin(dp, ctx));
    T_ERR(dpar_dp_begin(dp, ctx), DPAR_ERR_STATE, "dpar_dp_finish");
    T_ERR(dpar_dp_grad_ready(dp, ctx, 7), DPAR_ERR_INVALID_ARGUMENT, "7", "0..0");
    T_OK(dpar_dp_grad_ready(dp, ctx, 0));
    T_ERR(dpar_dp_grad_ready(dp, ctx, 0), DPAR_ERR_INVALID_ARGUMENT, "already");
    return dpar_dp_finish(dp, ctx);
}
static void test_errors(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_dp *dp = NULL;
    dpar_dp_desc dd = { 0 };
    /* each NULL named by its parameter (it said "mesh or desc", "helper or gradient array") */
    T_ERR(dpar_dp_create(NULL, &dd, &dp), DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_create: m is NULL");
    T_ERR(dpar_dp_create(m, NULL, &dp), DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_create: desc is NULL");
    T_ERR(dpar_dp_create(m, &dd, &dp), DPAR_ERR_UNKNOWN_AXIS, "axes: data");
    dd.axes = "batch";
    T_ERR(dpar_dp_create(m, &dd, &dp), DPAR_ERR_UNKNOWN_AXIS, "batch", "data");
    dd.axes = "data";
    dd.comm_dtype = DPAR_I32;
    T_ERR(dpar_dp_create(m, &dd, &dp), DPAR_ERR_INVALID_ARGUMENT, "i32");
    dd.comm_dtype = DPAR_F32;
    T_OK(dpar_dp_create(m, &dd, &dp));
    dpar_array_desc ad = { .dtype = DPAR_I32, .ndim = 1, .shape = { 4 } };
    dpar_array *ia, *split, *g;
    T_OK(dpar_array_create(m, &ad, &ia));
    T_ERR(dpar_dp_add(dp, ia, NULL), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_dp_add(dp, NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_add: grad is NULL");
    T_ERR(dpar_dp_add(NULL, ia, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_add: dp is NULL");
    dpar_array *gone = NULL; /* a destroyed array: it said "created on another mesh" */
    T_OK(dpar_array_create(m, &ad, &gone));
    T_OK(dpar_array_destroy(gone));
    T_ERR(dpar_dp_add(dp, gone, NULL), DPAR_ERR_STATE, "dpar_dp_add: grad is a stale array");
    ad.dtype = DPAR_F32;
    ad.spec[0] = "data";
    T_OK(dpar_array_create(m, &ad, &split));
    T_ERR(dpar_dp_add(dp, split, NULL), DPAR_ERR_INVALID_ARGUMENT, "split");
    ad.spec[0] = NULL;
    T_OK(dpar_array_create(m, &ad, &g));
    T_OK(dpar_dp_add(dp, g, NULL));
    dpar_shard_map_desc sd = { .fn = bad_calls, .user = dp };
    T_OK(dpar_shard_map(m, &sd));
    T_ERR(dpar_dp_add(dp, g, NULL), DPAR_ERR_STATE, "formed");
    dpar_dp_destroy(dp);
    dpar_dp_destroy(NULL);
    dpar_runtime_destroy(rt);
}

/* A dispatch that fails between begin and finish leaves no step open: the
   next dispatch's step works (regression: every later begin used to fail). */
static dpar_status fail_mid_step(dpar_ctx *ctx, void *user) {
    dpar_dp *dp = (dpar_dp *)user;
    dpar_status s = dpar_dp_begin(dp, ctx);
    if (s) return s;
    if (dpar_ctx_device(ctx) == 1) return DPAR_ERR_BACKEND; /* a failure in the middle of the backward pass */
    return dpar_dp_finish(dp, ctx);
}
static dpar_status full_step(dpar_ctx *ctx, void *user) {
    dpar_dp *dp = (dpar_dp *)user;
    dpar_status s = dpar_dp_begin(dp, ctx);
    if (!s) s = dpar_dp_grad_ready(dp, ctx, 0);
    if (!s) s = dpar_dp_finish(dp, ctx);
    return s;
}
static void test_recovers_after_failed_step(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_dp_desc dd = { .axes = "data" };
    dpar_dp *dp = NULL;
    T_OK(dpar_dp_create(m, &dd, &dp));
    dpar_array *g = garr(m, 0);
    T_OK(dpar_dp_add(dp, g, NULL));
    dpar_shard_map_desc sd = { .user = dp, .fn = fail_mid_step };
    assert_int_not_equal(dpar_shard_map(m, &sd), DPAR_OK);
    sd.fn = full_step;
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_shard_map(m, &sd));
    dpar_dp_destroy(dp);
    dpar_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_one_bucket),
        cmocka_unit_test(test_small_buckets),
        cmocka_unit_test(test_bucket_assignment),
        cmocka_unit_test(test_arrival_order_independent),
        cmocka_unit_test(test_blocking_and_partial),
        cmocka_unit_test(test_async_buckets),
        cmocka_unit_test(test_f16_mean_no_overflow),
        cmocka_unit_test(test_f16_values),
        cmocka_unit_test(test_f16_bits_match_scalar),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_recovers_after_failed_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
