/* f16 and bf16 storage in the layer ops and dpar_reduce (conv2d and its two
   gradients, avg and max pool with theirs, layer_norm / rms_norm forward and
   backward, softmax / log_softmax and the softmax gradient, causal attention
   forward and backward, bias_grad; reduce sum, mean and max): on the CPU
   backend each case runs in the 16-bit dtype and in f32 on the same rounded
   inputs, and every 16-bit result must equal the f32 result rounded once to
   nearest even, bit for bit (so the 16-bit op accumulates exactly as the f32
   op does); stats buffers (f32) must be identical. Exact small cases show the
   f32 accumulation (an f16 avg pool whose window sum overflows f16 still
   gives the mean). Vulkan and CUDA run every case too: each 16-bit result is
   that backend's f32 result rounded once, bit for bit, and agrees with the
   CPU's (equal, or one 16-bit step apart where the f32 kernels round
   differently); a missing backend prints SKIPPED. Issued back to back with no
   read in between (their temporaries reused in queue order) they give the
   same results. Mixed dtypes give DPAR_ERR_DTYPE naming both operands; i32 is
   refused on every backend, naming the op, the dtype and the backend. dpar_cast
   between f32 and f16 / bf16 equals the host conversions bit for bit on every
   backend, at lengths that leave every tail of the GPU kernels' wide words. */
#include "testutil.h"

T_CPU_FIXTURE(1)
static dpar_runtime *g_rt; /* the runtime the cases run on */

enum { MAXIO = 6 };
/* One case: inputs (data in [lo, hi)) and outputs, each with a shape; f32 marks a stats buffer (always f32). */
typedef struct iospec {
    int ndim;
    int64_t shape[4];
    int f32;
    float lo, hi;
} iospec;
typedef dpar_status (*case_fn)(dpar_buffer **out, dpar_buffer **in);
typedef struct dcase {
    const char *name; /* the public function that must be named in a DPAR_ERR_DTYPE */
    case_fn fn;
    int nin, nout;
    iospec in[MAXIO], out[MAXIO];
} dcase;

static float round_to(dpar_dtype t, float v) {
    if (t == DPAR_F16) return dpar_f16_to_f32(dpar_f32_to_f16(v));
    if (t == DPAR_BF16) return dpar_bf16_to_f32(dpar_f32_to_bf16(v));
    return v;
}
/* n values in [lo, hi) from seed, already representable in t */
static float *gen(int64_t n, unsigned seed, float lo, float hi, dpar_dtype t) {
    float *p = calloc((size_t)(n + 1), sizeof(float));
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = round_to(t, lo + (hi - lo) * (float)(s >> 8) / 16777216.0f);
    }
    return p;
}
static int64_t count_of(const iospec *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
    return n;
}
/* a buffer of dtype t on rt's device 0 holding v (f32 values representable in t) */
static dpar_buffer *buf_of(dpar_runtime *rt, dpar_dtype t, const iospec *s, const float *v) {
    int64_t n = count_of(s);
    dpar_buffer *b = t_buf(rt, 0, t, s->ndim, s->shape, NULL);
    if (!v || n == 0) return b;
    if (t == DPAR_F32) {
        T_OK(dpar_buffer_write(b, 0, v, (size_t)n * 4));
        return b;
    }
    uint16_t *h = calloc((size_t)n, 2);
    for (int64_t i = 0; i < n; i++) h[i] = t == DPAR_F16 ? dpar_f32_to_f16(v[i]) : dpar_f32_to_bf16(v[i]);
    T_OK(dpar_buffer_write(b, 0, h, (size_t)n * 2));
    free(h);
    return b;
}
/* b's values widened to f32 */
static float *read_f32(const dpar_buffer *b) {
    int64_t n = dpar_buffer_count(b);
    float *v = calloc((size_t)(n + 1), sizeof(float));
    if (dpar_buffer_dtype(b) == DPAR_F32) {
        t_read(b, v);
        return v;
    }
    uint16_t *h = calloc((size_t)(n + 1), 2);
    t_read(b, h);
    for (int64_t i = 0; i < n; i++)
        v[i] = dpar_buffer_dtype(b) == DPAR_F16 ? dpar_f16_to_f32(h[i]) : dpar_bf16_to_f32(h[i]);
    free(h);
    return v;
}
static int same_bits(float a, float b) {
    return t_f2u(a) == t_f2u(b) || (a != a && b != b);
}

/* Runs c on rt's device 0 with its float tensors stored in t (stats f32), on inputs representable in data_t; returns
   each output widened to f32 (res[i], to free). */
static void run_case(dpar_runtime *rt, const dcase *c, dpar_dtype t, dpar_dtype data_t, float **res) {
    float *data[MAXIO];
    dpar_buffer *in[MAXIO], *out[MAXIO];
    for (int i = 0; i < c->nin; i++) {
        const iospec *s = &c->in[i];
        data[i] = gen(count_of(s), (unsigned)(i + 1) * 7919u, s->lo, s->hi, s->f32 ? DPAR_F32 : data_t);
        in[i] = buf_of(rt, s->f32 ? DPAR_F32 : t, s, data[i]);
    }
    for (int i = 0; i < c->nout; i++) out[i] = buf_of(rt, c->out[i].f32 ? DPAR_F32 : t, &c->out[i], NULL);
    g_rt = rt;
    dpar_status st = c->fn(out, in);
    if (st)
        fail_msg("%s %s on %s: %s: %s", c->name, dpar_dtype_name(t), dpar_backend_name(dpar_runtime_backend(rt)),
                 dpar_status_string(st), dpar_last_error());
    for (int i = 0; i < c->nout; i++) {
        res[i] = read_f32(out[i]);
        dpar_buffer_destroy(out[i]);
    }
    for (int i = 0; i < c->nin; i++) {
        dpar_buffer_destroy(in[i]);
        free(data[i]);
    }
}

/* Runs c on rt in dtype t and in f32 on the same inputs; every t result must be the f32 result rounded to t, bit for
   bit, every stats value identical. */
static void check_case(dpar_runtime *rt, const dcase *c, dpar_dtype t) {
    float *got[MAXIO], *want[MAXIO];
    run_case(rt, c, t, t, got);
    run_case(rt, c, DPAR_F32, t, want);
    const char *be = dpar_backend_name(dpar_runtime_backend(rt));
    int64_t nonzero = 0;
    for (int i = 0; i < c->nout; i++) {
        int64_t n = count_of(&c->out[i]);
        for (int64_t e = 0; e < n; e++) {
            float w = c->out[i].f32 ? want[i][e] : round_to(t, want[i][e]), g = got[i][e];
            nonzero += g != 0.0f;
            if (!same_bits(g, w))
                fail_msg("%s %s on %s: output %d [%lld] = %.9g, want %.9g (the f32 result %.9g rounded once)", c->name,
                         dpar_dtype_name(t), be, i, (long long)e, (double)g, (double)w, (double)want[i][e]);
            if (!isfinite(g))
                fail_msg("%s %s on %s: output %d [%lld] = %g", c->name, dpar_dtype_name(t), be, i, (long long)e,
                         (double)g);
        }
        free(got[i]);
        free(want[i]);
    }
    if (nonzero == 0) fail_msg("%s %s: every output is 0; the case checks nothing", c->name, dpar_dtype_name(t));
}

/* the spacing of t's values at |v| (f32 for stats) */
static double step_of(dpar_dtype t, double v) {
    int e;
    frexp(fabs(v), &e); /* |v| = m 2^e, m in [0.5, 1) */
    int mant = t == DPAR_F16 ? 10 : t == DPAR_BF16 ? 7 : 23, lo = t == DPAR_F16 ? -24 : -149;
    int p = e - 1 - mant;
    return ldexp(1.0, p < lo ? lo : p);
}

/* Runs c in dtype t on rt and on the CPU (same inputs): each result equals the CPU's, or differs by at most one step
   of its dtype plus the f32 kernels' difference (1e-5 of the output's largest magnitude), where the backend's f32
   kernel rounds differently from the CPU's. Counts the results and those equal bit for bit. */
static void parity_case(dpar_runtime *rt, const dcase *c, dpar_dtype t, int64_t *total, int64_t *exact) {
    float *got[MAXIO], *want[MAXIO];
    run_case(rt, c, t, t, got);
    run_case(RT, c, t, t, want);
    const char *be = dpar_backend_name(dpar_runtime_backend(rt));
    for (int i = 0; i < c->nout; i++) {
        int64_t n = count_of(&c->out[i]);
        dpar_dtype ot = c->out[i].f32 ? DPAR_F32 : t;
        double scale = 0.0;
        for (int64_t e = 0; e < n; e++) scale = fmax(scale, fabs((double)want[i][e]));
        for (int64_t e = 0; e < n; e++) {
            double g = got[i][e], w = want[i][e], lim = step_of(ot, w) + 1e-5 * scale;
            *total += 1;
            *exact += same_bits(got[i][e], want[i][e]);
            if (!(fabs(g - w) <= lim))
                fail_msg("%s %s on %s: output %d [%lld] = %.9g but the cpu gives %.9g (allowed difference %.3g)",
                         c->name, dpar_dtype_name(t), be, i, (long long)e, g, w, lim);
        }
        free(got[i]);
        free(want[i]);
    }
}

/* ---- the cases ------------------------------------------------------------ */
static dpar_buffer *like(const dpar_buffer *b, int ndim, const int64_t *shape) { /* a scratch of b's dtype */
    dpar_buffer *r = NULL;
    T_OK(dpar_buffer_create(g_rt, 0, dpar_buffer_dtype(b), ndim, shape, &r));
    return r;
}
static dpar_status conv_same(dpar_buffer **o, dpar_buffer **i) {
    return dpar_conv2d(o[0], i[0], i[1], i[2], NULL);
}
static dpar_status conv_valid_s2(dpar_buffer **o, dpar_buffer **i) {
    dpar_conv2d_desc d = { { 2, 2 }, { 1, 2 }, DPAR_PADDING_VALID, { { 0, 0 }, { 0, 0 } } };
    return dpar_conv2d(o[0], i[0], i[1], NULL, &d);
}
static dpar_status conv_bwd_input(dpar_buffer **o, dpar_buffer **i) {
    return dpar_conv2d_backward_input(o[0], i[0], i[1], NULL);
}
static dpar_status conv_bwd_kernel(dpar_buffer **o, dpar_buffer **i) {
    return dpar_conv2d_backward_kernel(o[0], o[1], i[0], i[1], NULL);
}
static const dpar_pool2d_desc POOL_PAD = { { 3, 3 }, { 2, 2 }, DPAR_PADDING_SAME, { { 0, 0 }, { 0, 0 } }, false };
static dpar_status avg_pool(dpar_buffer **o, dpar_buffer **i) {
    return dpar_avg_pool2d(o[0], i[0], &POOL_PAD);
}
static dpar_status avg_pool_bwd(dpar_buffer **o, dpar_buffer **i) {
    return dpar_avg_pool2d_backward(o[0], i[0], &POOL_PAD);
}
static dpar_status max_pool(dpar_buffer **o, dpar_buffer **i) {
    return dpar_max_pool2d(o[0], i[0], &POOL_PAD);
}
static dpar_status max_pool_bwd(dpar_buffer **o, dpar_buffer **i) {
    return dpar_max_pool2d_backward(o[0], i[0], i[1], &POOL_PAD);
}
static dpar_status layer_norm(dpar_buffer **o, dpar_buffer **i) {
    return dpar_layer_norm(o[0], o[1], i[0], i[1], i[2], 1e-5f);
}
static dpar_status rms_norm(dpar_buffer **o, dpar_buffer **i) {
    return dpar_rms_norm(o[0], o[1], i[0], i[1], NULL, 1e-5f);
}
/* forward for the stats, then backward: o = stats, dx, dw, db; i = x, w, b, dy */
static dpar_status norm_bwd(dpar_buffer **o, dpar_buffer **i, int rms) {
    dpar_buffer *y = like(i[0], 2, (const int64_t[]){ 5, 9 });
    dpar_status s =
        rms ? dpar_rms_norm(y, o[0], i[0], i[1], NULL, 1e-5f) : dpar_layer_norm(y, o[0], i[0], i[1], i[2], 1e-5f);
    if (!s)
        s = rms ? dpar_rms_norm_backward(o[1], o[2], NULL, i[3], i[0], i[1], o[0])
                : dpar_layer_norm_backward(o[1], o[2], o[3], i[3], i[0], i[1], o[0]);
    dpar_buffer_destroy(y);
    return s;
}
static dpar_status layer_norm_bwd(dpar_buffer **o, dpar_buffer **i) {
    return norm_bwd(o, i, 0);
}
static dpar_status rms_norm_bwd(dpar_buffer **o, dpar_buffer **i) {
    return norm_bwd(o, i, 1);
}
static dpar_status softmax(dpar_buffer **o, dpar_buffer **i) {
    dpar_status s = dpar_softmax(o[0], i[0], false);
    return s ? s : dpar_softmax(o[1], i[0], true);
}
static dpar_status softmax_bwd(dpar_buffer **o, dpar_buffer **i) {
    dpar_status s = dpar_softmax_backward(o[0], i[0], i[1], false);
    return s ? s : dpar_softmax_backward(o[1], i[0], i[1], true);
}
static dpar_status attention(dpar_buffer **o, dpar_buffer **i) {
    return dpar_attention(o[0], o[1], i[0], i[1], i[2], 0.0f, true);
}
/* o = out, stats, dq, dk, dv; i = q, k, v, dout */
static dpar_status attention_bwd(dpar_buffer **o, dpar_buffer **i) {
    dpar_status s = dpar_attention(o[0], o[1], i[0], i[1], i[2], 0.0f, true);
    return s ? s : dpar_attention_backward(o[2], o[3], o[4], o[1], i[3], i[0], i[1], i[2], 0.0f, true);
}
static dpar_status reduce_sum_axis1(dpar_buffer **o, dpar_buffer **i) {
    const int ax = 1;
    return dpar_reduce(o[0], i[0], DPAR_REDUCE_SUM, &ax, 1);
}
static dpar_status reduce_mean_all(dpar_buffer **o, dpar_buffer **i) {
    return dpar_reduce(o[0], i[0], DPAR_REDUCE_MEAN, NULL, 0);
}
static dpar_status reduce_max_last(dpar_buffer **o, dpar_buffer **i) {
    const int ax = -1;
    return dpar_reduce(o[0], i[0], DPAR_REDUCE_MAX, &ax, 1);
}
static dpar_status bias_grad(dpar_buffer **o, dpar_buffer **i) {
    return dpar_bias_grad(o[0], i[0], 0.0f);
}

#define S4(a, b, c, d) \
    { 4, { a, b, c, d }, 0, -1.0f, 1.0f }
#define S2(a, b) \
    { 2, { a, b }, 0, -1.0f, 1.0f }
#define S3(a, b, c) \
    { 3, { a, b, c }, 0, -1.0f, 1.0f }
#define S1(a) \
    { 1, { a }, 0, -1.0f, 1.0f }
#define ST(r) \
    { 2, { r, 2 }, 1, 0.0f, 0.0f }
static const dcase CASES[] = {
    { "dpar_conv2d", conv_same, 3, 1, { S4(2, 5, 6, 3), S4(3, 3, 3, 4), S1(4) }, { S4(2, 5, 6, 4) } },
    { "dpar_conv2d", conv_valid_s2, 2, 1, { S4(1, 9, 8, 2), S4(3, 2, 2, 3) }, { S4(1, 4, 3, 3) } },
    { "dpar_conv2d_backward_input", conv_bwd_input, 2, 1, { S4(2, 5, 6, 4), S4(3, 3, 3, 4) }, { S4(2, 5, 6, 3) } },
    { "dpar_conv2d_backward_kernel",
      conv_bwd_kernel,
      2,
      2,
      { S4(2, 5, 6, 3), S4(2, 5, 6, 4) },
      { S4(3, 3, 3, 4), S1(4) } },
    { "dpar_avg_pool2d", avg_pool, 1, 1, { S4(2, 7, 6, 3) }, { S4(2, 4, 3, 3) } },
    { "dpar_avg_pool2d_backward", avg_pool_bwd, 1, 1, { S4(2, 4, 3, 3) }, { S4(2, 7, 6, 3) } },
    { "dpar_max_pool2d", max_pool, 1, 1, { S4(2, 7, 6, 3) }, { S4(2, 4, 3, 3) } },
    { "dpar_max_pool2d_backward", max_pool_bwd, 2, 1, { S4(2, 4, 3, 3), S4(2, 7, 6, 3) }, { S4(2, 7, 6, 3) } },
    { "dpar_layer_norm", layer_norm, 3, 2, { S2(5, 9), S1(9), S1(9) }, { S2(5, 9), ST(5) } },
    { "dpar_rms_norm", rms_norm, 2, 2, { S2(5, 9), S1(9) }, { S2(5, 9), ST(5) } },
    { "dpar_layer_norm",
      layer_norm_bwd,
      4,
      4,
      { S2(5, 9), S1(9), S1(9), S2(5, 9) },
      { ST(5), S2(5, 9), S1(9), S1(9) } },
    { "dpar_rms_norm", rms_norm_bwd, 4, 3, { S2(5, 9), S1(9), S1(9), S2(5, 9) }, { ST(5), S2(5, 9), S1(9) } },
    { "dpar_softmax", softmax, 1, 2, { { 2, { 6, 11 }, 0, -8.0f, 8.0f } }, { S2(6, 11), S2(6, 11) } },
    { "dpar_softmax_backward",
      softmax_bwd,
      2,
      2,
      { S2(6, 11), { 2, { 6, 11 }, 0, 0.0f, 0.3f } },
      { S2(6, 11), S2(6, 11) } },
    { "dpar_attention", attention, 3, 2, { S3(3, 5, 4), S3(3, 5, 4), S3(3, 5, 3) }, { S3(3, 5, 3), ST(15) } },
    { "dpar_attention",
      attention_bwd,
      4,
      5,
      { S3(3, 5, 4), S3(3, 5, 4), S3(3, 5, 3), S3(3, 5, 3) },
      { S3(3, 5, 3), ST(15), S3(3, 5, 4), S3(3, 5, 4), S3(3, 5, 3) } },
    { "dpar_bias_grad", bias_grad, 1, 1, { S3(4, 3, 7) }, { S1(7) } },
    { "dpar_reduce", reduce_sum_axis1, 1, 1, { S3(3, 37, 5) }, { S2(3, 5) } },
    { "dpar_reduce", reduce_mean_all, 1, 1, { S3(3, 37, 5) }, { S3(1, 1, 1) } },
    { "dpar_reduce", reduce_max_last, 1, 1, { S3(3, 5, 37) }, { S2(3, 5) } },
};
enum { NCASES = (int)(sizeof CASES / sizeof CASES[0]) };

static void test_cpu_f16_is_f32_rounded_once(void **state) {
    (void)state;
    for (int i = 0; i < NCASES; i++) check_case(RT, &CASES[i], DPAR_F16);
}
static void test_cpu_bf16_is_f32_rounded_once(void **state) {
    (void)state;
    for (int i = 0; i < NCASES; i++) check_case(RT, &CASES[i], DPAR_BF16);
}

/* window sums of 4 x 60000 overflow f16 (max 65504); accumulated in f32 the means are exact */
static void test_f16_avg_pool_accumulates_in_f32(void **state) {
    (void)state;
    const int64_t ys[4] = { 1, 1, 1, 2 };
    float x[8] = { 60000, 60000, 60000, -60000, 60000, 60000, 60000, -60000 };
    iospec sx = { 4, { 1, 2, 2, 2 }, 0, 0, 0 };
    dpar_buffer *bx = buf_of(RT, DPAR_F16, &sx, x), *by = t_buf(RT, 0, DPAR_F16, 4, ys, NULL);
    T_OK(dpar_avg_pool2d(by, bx, NULL));
    float *y = read_f32(by);
    assert_true(y[0] == 60000.0f && y[1] == 0.0f);
    free(y);
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(by);
}
/* f16 reduce on every backend: a sum past f16's range is accumulated in f32 (60000 x 4 = 240000, which f16 rounds
   to inf), so the mean is exact; argmax (i32 out) takes the first of tied maxima, on 16-bit input */
static void reduce_exact(dpar_runtime *rt) {
    const int64_t one[1] = { 1 };
    float x[6] = { 60000, 60000, 60000, 60000, -3, 2 };
    iospec sx = { 1, { 4 }, 0, 0, 0 }, st = { 1, { 6 }, 0, 0, 0 };
    float tie[6] = { -1, 7, 3, 7, 7, 0.5f };
    dpar_buffer *bx = buf_of(rt, DPAR_F16, &sx, x), *bt = buf_of(rt, DPAR_BF16, &st, tie);
    dpar_buffer *sum = t_buf(rt, 0, DPAR_F16, 1, one, NULL), *mean = t_buf(rt, 0, DPAR_F16, 1, one, NULL);
    dpar_buffer *am = t_buf(rt, 0, DPAR_I32, 1, one, NULL);
    const int ax = 0;
    T_OK(dpar_reduce(sum, bx, DPAR_REDUCE_SUM, &ax, 1));
    T_OK(dpar_reduce(mean, bx, DPAR_REDUCE_MEAN, &ax, 1));
    T_OK(dpar_reduce(am, bt, DPAR_REDUCE_ARGMAX, &ax, 1));
    float *s = read_f32(sum), *m = read_f32(mean);
    int32_t i = -1;
    t_read(am, &i);
    assert_true(isinf(s[0]) && s[0] > 0); /* 240000 rounded once to f16: past 65504 */
    assert_true(m[0] == 60000.0f);
    assert_int_equal(i, 1);
    free(s);
    free(m);
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(bt);
    dpar_buffer_destroy(sum);
    dpar_buffer_destroy(mean);
    dpar_buffer_destroy(am);
}
static void reduce_exact_on(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    if (!rt) return;
    reduce_exact(rt);
    dpar_runtime_destroy(rt);
}
static void test_f16_reduce_accumulates_in_f32(void **state) {
    (void)state;
    reduce_exact(RT);
}
static void test_vulkan_f16_reduce(void **state) {
    (void)state;
    reduce_exact_on(DPAR_BACKEND_VULKAN);
}
static void test_cuda_f16_reduce(void **state) {
    (void)state;
    reduce_exact_on(DPAR_BACKEND_CUDA);
}
/* a constant row normalizes to 0, so bf16 layer norm returns the bias exactly (no NaN) */
static void test_bf16_layer_norm_constant_row_returns_bias(void **state) {
    (void)state;
    const int64_t xs[2] = { 2, 4 };
    float x[8] = { 3, 3, 3, 3, -250, -250, -250, -250 }, w[4] = { 2, 2, 2, 2 }, b[4] = { 0.5f, -1, 7, 0.25f };
    iospec sx = { 2, { 2, 4 }, 0, 0, 0 }, sv = { 1, { 4 }, 0, 0, 0 };
    dpar_buffer *bx = buf_of(RT, DPAR_BF16, &sx, x), *bw = buf_of(RT, DPAR_BF16, &sv, w);
    dpar_buffer *bb = buf_of(RT, DPAR_BF16, &sv, b), *by = t_buf(RT, 0, DPAR_BF16, 2, xs, NULL);
    T_OK(dpar_layer_norm(by, NULL, bx, bw, bb, 1e-5f));
    float *y = read_f32(by);
    for (int i = 0; i < 8; i++) assert_true(y[i] == b[i % 4]);
    free(y);
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(bw);
    dpar_buffer_destroy(bb);
    dpar_buffer_destroy(by);
}
/* a 3x3 image of 1..9 convolved (SAME) with a 3x3 kernel of ones in f16: the neighbourhood sums, exact */
static void test_f16_conv_exact_sums(void **state) {
    (void)state;
    float x[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, w[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    const float want[9] = { 12, 21, 16, 27, 45, 33, 24, 39, 28 };
    iospec sx = { 4, { 1, 3, 3, 1 }, 0, 0, 0 }, sw = { 4, { 3, 3, 1, 1 }, 0, 0, 0 };
    dpar_buffer *bx = buf_of(RT, DPAR_F16, &sx, x), *bw = buf_of(RT, DPAR_F16, &sw, w);
    dpar_buffer *by = buf_of(RT, DPAR_F16, &sx, NULL);
    T_OK(dpar_conv2d(by, bx, bw, NULL, NULL));
    float *y = read_f32(by);
    for (int i = 0; i < 9; i++)
        if (y[i] != want[i]) fail_msg("y[%d] = %g, want %g", i, (double)y[i], (double)want[i]);
    free(y);
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(bw);
    dpar_buffer_destroy(by);
}

/* mixed and integer dtypes: DPAR_ERR_DTYPE naming both operands */
static void test_dtype_errors(void **state) {
    (void)state;
    const int64_t s4[4] = { 1, 3, 3, 1 }, k4[4] = { 1, 1, 1, 1 }, r2[2] = { 2, 3 };
    dpar_buffer *x16 = t_buf(RT, 0, DPAR_F16, 4, s4, NULL), *xb = t_buf(RT, 0, DPAR_BF16, 4, s4, NULL);
    dpar_buffer *w32 = t_buf(RT, 0, DPAR_F32, 4, k4, NULL), *i2 = t_buf(RT, 0, DPAR_I32, 2, r2, NULL);
    dpar_buffer *y2 = t_buf(RT, 0, DPAR_F32, 2, r2, NULL), *st16 = t_buf(RT, 0, DPAR_F16, 2, r2, NULL);
    T_ERR(dpar_conv2d(xb, x16, w32, NULL, NULL), DPAR_ERR_DTYPE, "dpar_conv2d", "x is f16", "y is bf16");
    T_ERR(dpar_max_pool2d(x16, xb, NULL), DPAR_ERR_DTYPE, "dpar_max_pool2d", "bf16", "f16");
    T_ERR(dpar_softmax(y2, i2, false), DPAR_ERR_DTYPE, "dpar_softmax", "x is i32", "y is f32");
    T_ERR(dpar_softmax(i2, i2, false), DPAR_ERR_DTYPE, "dpar_softmax", "y is i32", "f32, f16 or bf16");
    T_ERR(dpar_layer_norm(y2, st16, y2, NULL, NULL, 1e-5f), DPAR_ERR_DTYPE, "dpar_layer_norm", "stats is f16");
    dpar_buffer_destroy(x16);
    dpar_buffer_destroy(xb);
    dpar_buffer_destroy(w32);
    dpar_buffer_destroy(i2);
    dpar_buffer_destroy(y2);
    dpar_buffer_destroy(st16);
}

/* dpar_cast between f32 and f16 / bf16 on a backend, bit for bit against the host conversions (round to nearest even,
   NaN payloads kept): random f32 bit patterns (NaN, infinities, subnormals) with rounding ties planted in every
   other element, narrowed; then 16-bit patterns (all 65536 in the longest run) widened. The lengths leave every tail
   of the GPU kernels' 8-element words (n % 8 from 0 to 7; n < 8 is all tail); on the CUDA mock, guard bytes after
   each allocation catch a store past the end. */
static void cast_bits(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    if (!rt) return;
    const char *be = dpar_backend_name(k);
    const int64_t lens[] = { 1, 2, 3, 5, 7, 8, 9, 14, 15, 16, 17, 255, 1030, 4099, 65536 + 3 };
    uint32_t s = 2463534242u;
    for (int t = 0; t < 2; t++) {
        dpar_dtype ht = t ? DPAR_BF16 : DPAR_F16;
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            int64_t n = lens[l];
            uint32_t *f = malloc((size_t)n * 4), *wide = malloc((size_t)n * 4);
            uint16_t *h = malloc((size_t)n * 2), *narrow = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) {
                s ^= s << 13, s ^= s >> 17, s ^= s << 5; /* xorshift32 */
                f[i] = s;
                if (i % 4 == 1) f[i] = (s & 0xffff0000u) | 0x8000u; /* a bf16 tie */
                if (i % 4 == 3) f[i] = (s & 0x80000000u) | ((103u + s % 40u) << 23) | (s & 0x7fe000u) | 0x1000u;
                h[i] = (uint16_t)((uint32_t)i * 40503u + 7u); /* odd multiplier: every pattern once in 65536 */
            }
            dpar_buffer *bf = t_buf1(rt, DPAR_F32, n, f), *bh = t_buf1(rt, ht, n, NULL);
            T_OK(dpar_cast(bh, bf));
            t_read(bh, narrow);
            T_OK(dpar_buffer_write(bh, 0, h, (size_t)n * 2));
            T_OK(dpar_cast(bf, bh));
            t_read(bf, wide);
            for (int64_t i = 0; i < n; i++) {
                float v = t_u2f(f[i]);
                uint16_t wn = t ? dpar_f32_to_bf16(v) : dpar_f32_to_f16(v);
                uint32_t ww = t_f2u(t ? dpar_bf16_to_f32(h[i]) : dpar_f16_to_f32(h[i]));
                if (narrow[i] != wn)
                    fail_msg("%s: cast f32 -> %s, n %lld, [%lld] = 0x%08x: 0x%04x, want 0x%04x", be,
                             dpar_dtype_name(ht), (long long)n, (long long)i, f[i], narrow[i], wn);
                if (wide[i] != ww)
                    fail_msg("%s: cast %s -> f32, n %lld, [%lld] = 0x%04x: 0x%08x, want 0x%08x", be,
                             dpar_dtype_name(ht), (long long)n, (long long)i, h[i], wide[i], ww);
            }
            dpar_buffer_destroy(bf);
            dpar_buffer_destroy(bh);
            free(f);
            free(wide);
            free(h);
            free(narrow);
        }
    }
    printf("%s: f32 <-> f16 / bf16 casts equal the host conversions bit for bit at %d lengths\n", be,
           (int)(sizeof lens / sizeof lens[0]));
    dpar_runtime_destroy(rt);
}
static void test_cpu_cast_bits(void **state) {
    (void)state;
    cast_bits(DPAR_BACKEND_CPU);
}
static void test_vulkan_cast_bits(void **state) {
    (void)state;
    cast_bits(DPAR_BACKEND_VULKAN);
}
static void test_cuda_cast_bits(void **state) {
    (void)state;
    cast_bits(DPAR_BACKEND_CUDA);
}

/* On a GPU backend, every case in f16 and bf16: each 16-bit result is that backend's f32 result rounded once (bit for
   bit), and matches the CPU's 16-bit result (parity_case). i32 operands are still refused, naming the op, the dtype
   and the backend. */
static void half_parity(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    if (!rt) return;
    const char *be = dpar_backend_name(k);
    for (int t = 0; t < 2; t++) {
        dpar_dtype dt = t ? DPAR_BF16 : DPAR_F16;
        int64_t total = 0, exact = 0;
        for (int c = 0; c < NCASES; c++) {
            check_case(rt, &CASES[c], dt);
            parity_case(rt, &CASES[c], dt, &total, &exact);
        }
        printf("%s %s: %lld of %lld results equal the cpu's bit for bit, the rest within tolerance\n", be,
               dpar_dtype_name(dt), (long long)exact, (long long)total);
    }
    const int64_t r2[2] = { 2, 3 }, s4[4] = { 1, 3, 3, 1 }, k4[4] = { 1, 1, 1, 1 };
    dpar_buffer *i2 = t_buf(rt, 0, DPAR_I32, 2, r2, NULL), *y2 = t_buf(rt, 0, DPAR_F32, 2, r2, NULL);
    dpar_buffer *xi = t_buf(rt, 0, DPAR_I32, 4, s4, NULL), *wi = t_buf(rt, 0, DPAR_I32, 4, k4, NULL);
    T_ERR(dpar_softmax(i2, i2, false), DPAR_ERR_DTYPE, "dpar_softmax", "is i32", be);
    T_ERR(dpar_softmax(y2, i2, false), DPAR_ERR_DTYPE, "dpar_softmax", "x is i32", "y is f32");
    T_ERR(dpar_conv2d(xi, xi, wi, NULL, NULL), DPAR_ERR_DTYPE, "dpar_conv2d", "i32", be);
    dpar_buffer_destroy(i2);
    dpar_buffer_destroy(y2);
    dpar_buffer_destroy(xi);
    dpar_buffer_destroy(wi);
    dpar_runtime_destroy(rt);
}
static void test_vulkan_half_parity(void **state) {
    (void)state;
    half_parity(DPAR_BACKEND_VULKAN);
}
static void test_cuda_half_parity(void **state) {
    (void)state;
    half_parity(DPAR_BACKEND_CUDA);
}

/* On a GPU backend the 16-bit ops reuse the device's f32 temporaries in queue order, without waiting: every case,
   f16 then bf16, issued back to back with no read in between (the temporaries grow and shrink between cases, the
   next op's casts overwrite what the last one read), then read. Each output equals that case run alone, bit for
   bit. Under tests/vulkan_validation.sh, synchronization validation checks the reuse for hazards. */
static void half_queued(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    if (!rt) return;
    enum { N = 2 * NCASES };
    dpar_buffer *in[N][MAXIO], *out[N][MAXIO];
    g_rt = rt;
    for (int q = 0; q < N; q++) {
        const dcase *c = &CASES[q % NCASES];
        dpar_dtype t = q < NCASES ? DPAR_F16 : DPAR_BF16;
        for (int i = 0; i < c->nin; i++) {
            const iospec *s = &c->in[i];
            float *v = gen(count_of(s), (unsigned)(i + 1) * 7919u, s->lo, s->hi, s->f32 ? DPAR_F32 : t);
            in[q][i] = buf_of(rt, s->f32 ? DPAR_F32 : t, s, v);
            free(v);
        }
        for (int i = 0; i < c->nout; i++) out[q][i] = buf_of(rt, c->out[i].f32 ? DPAR_F32 : t, &c->out[i], NULL);
        T_OK(c->fn(out[q], in[q]));
    }
    for (int q = 0; q < N; q++) {
        const dcase *c = &CASES[q % NCASES];
        dpar_dtype t = q < NCASES ? DPAR_F16 : DPAR_BF16;
        float *alone[MAXIO];
        run_case(rt, c, t, t, alone);
        for (int i = 0; i < c->nout; i++) {
            float *got = read_f32(out[q][i]);
            for (int64_t e = 0; e < count_of(&c->out[i]); e++)
                if (!same_bits(got[e], alone[i][e]))
                    fail_msg("%s %s queued: output %d [%lld] = %.9g, alone %.9g", c->name, dpar_dtype_name(t), i,
                             (long long)e, (double)got[e], (double)alone[i][e]);
            free(got);
            free(alone[i]);
            dpar_buffer_destroy(out[q][i]);
        }
        for (int i = 0; i < c->nin; i++) dpar_buffer_destroy(in[q][i]);
    }
    dpar_runtime_destroy(rt);
}
static void test_vulkan_half_queued(void **state) {
    (void)state;
    half_queued(DPAR_BACKEND_VULKAN);
}
static void test_cuda_half_queued(void **state) {
    (void)state;
    half_queued(DPAR_BACKEND_CUDA);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_f16_is_f32_rounded_once),
        cmocka_unit_test(test_cpu_bf16_is_f32_rounded_once),
        cmocka_unit_test(test_f16_avg_pool_accumulates_in_f32),
        cmocka_unit_test(test_bf16_layer_norm_constant_row_returns_bias),
        cmocka_unit_test(test_f16_reduce_accumulates_in_f32),
        cmocka_unit_test(test_vulkan_f16_reduce),
        cmocka_unit_test(test_cuda_f16_reduce),
        cmocka_unit_test(test_f16_conv_exact_sums),
        cmocka_unit_test(test_dtype_errors),
        cmocka_unit_test(test_cpu_cast_bits),
        cmocka_unit_test(test_vulkan_cast_bits),
        cmocka_unit_test(test_cuda_cast_bits),
        cmocka_unit_test(test_vulkan_half_parity),
        cmocka_unit_test(test_cuda_half_parity),
        cmocka_unit_test(test_vulkan_half_queued),
        cmocka_unit_test(test_cuda_half_queued),
    };
    return cmocka_run_group_tests(tests, t_setup, t_teardown);
}
