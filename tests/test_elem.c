/* Elementwise, reduction, softmax and shape ops (issue 13): exact small cases,
   broadcasting shapes (size 0 and size 1 dims included) against a host
   reference, finite-difference gradient checks in double for every backward
   (the forward formulas are re-derived here in double, independent of dpar.h),
   clear errors for bad shapes, and every GPU backend against the CPU
   reference (skipped backends print SKIPPED). */
#include "testutil.h"

static dpar_runtime *g_rt; /* CPU, 1 device */

/* ---- buffers ------------------------------------------------------------------- */
static dpar_buffer *mk(dpar_runtime *rt, dpar_dtype t, int nd, const int64_t *sh) {
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(rt, 0, t, nd, sh, &b));
    return b;
}
static int64_t cnt(int nd, const int64_t *sh) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= sh[i];
    return n;
}
static void put(dpar_buffer *b, const void *v) {
    T_OK(dpar_buffer_write(b, 0, v, (size_t)dpar_buffer_count(b) * 4));
}
static void get(const dpar_buffer *b, void *v) {
    T_OK(dpar_buffer_read(b, 0, v, (size_t)dpar_buffer_count(b) * 4));
}
static uint32_t g_seed = 12345u;
static float rnd(void) { /* uniform in [-1, 1) */
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)((double)(g_seed >> 8) / 8388608.0 - 1.0);
}
static void fill_rnd(float *v, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * 0.5f * (rnd() + 1.0f);
}
static int close_to(double got, double want, double rtol, double atol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}
#define CHECK_CLOSE(got, want, rtol, atol, ...)                                                              \
    do {                                                                                                     \
        if (!close_to((double)(got), (double)(want), rtol, atol)) {                                          \
            printf(__VA_ARGS__);                                                                             \
            fail_msg(" got %.9g want %.9g (rtol %g atol %g)", (double)(got), (double)(want), (double)(rtol), \
                     (double)(atol));                                                                        \
        }                                                                                                    \
    } while (0)

/* flat index into an operand of shape xs broadcast to shape ys, for flat y index i */
static int64_t bidx(int ynd, const int64_t *ys, int xnd, const int64_t *xs, int64_t i) {
    int64_t o = 0, st = 1;
    for (int d = ynd - 1; d >= 0; d--) {
        int64_t c = i % ys[d];
        i /= ys[d];
        int xd = d - (ynd - xnd);
        if (xd < 0) continue;
        if (xs[xd] != 1) o += c * st;
        st *= xs[xd];
    }
    return o;
}

/* ---- the forward formulas in double (independent of dpar.h) --------------- */
static double ref_unary(dpar_unary_op u, double x, double s) {
    switch (u) {
    case DPAR_UNARY_NEG: return -x;
    case DPAR_UNARY_EXP: return exp(x);
    case DPAR_UNARY_LOG: return log(x);
    case DPAR_UNARY_SQRT: return sqrt(x);
    case DPAR_UNARY_RSQRT: return pow(x, -0.5);
    case DPAR_UNARY_TANH: return (exp(2 * x) - 1) / (exp(2 * x) + 1);
    case DPAR_UNARY_SIGMOID: return exp(x) / (1 + exp(x));
    case DPAR_UNARY_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * pow(x, 3))));
    case DPAR_UNARY_GELU_ERF: return x * 0.5 * erfc(-x / sqrt(2.0));
    case DPAR_UNARY_SILU: return x * exp(x) / (1 + exp(x));
    case DPAR_UNARY_SQUARE: return x * x;
    case DPAR_UNARY_ADD_SCALAR: return x + s;
    case DPAR_UNARY_MUL_SCALAR: return x * s;
    case DPAR_UNARY_RSUB_SCALAR: return s - x;
    case DPAR_UNARY_DIV_SCALAR: return x / s;
    case DPAR_UNARY_RDIV_SCALAR: return s / x;
    case DPAR_UNARY_POW_SCALAR: return exp(s * log(x));
    default: return NAN;
    }
}
static double ref_binary(dpar_binary_op o, double a, double b) {
    return o == DPAR_BINARY_ADD ? a + b : o == DPAR_BINARY_SUB ? a - b : o == DPAR_BINARY_MUL ? a * b : a / b;
}
/* inputs of a unary op inside its domain */
static void unary_domain(dpar_unary_op u, float *lo, float *hi) {
    int pos = u == DPAR_UNARY_LOG || u == DPAR_UNARY_SQRT || u == DPAR_UNARY_RSQRT || u == DPAR_UNARY_RDIV_SCALAR ||
              u == DPAR_UNARY_POW_SCALAR;
    *lo = pos ? 0.3f : -3.0f;
    *hi = 3.0f;
}

/* ---- exact cases ------------------------------------------------------------ */
static void test_softmax_overflow(void **state) {
    (void)state;
    int64_t sh[2] = { 2, 2 };
    dpar_buffer *x = mk(g_rt, DPAR_F32, 2, sh), *y = mk(g_rt, DPAR_F32, 2, sh);
    float in[4] = { 1000.0f, 1000.0f, -1000.0f, 1000.0f }, out[4];
    put(x, in);
    T_OK(dpar_softmax(y, x, false));
    get(y, out);
    assert_true(out[0] == 0.5f && out[1] == 0.5f && out[2] == 0.0f && out[3] == 1.0f);
    T_OK(dpar_softmax(y, x, true));
    get(y, out);
    assert_true(out[0] == (float)-log(2.0) && out[1] == (float)-log(2.0) && out[2] == -2000.0f && out[3] == 0.0f);
    T_OK(dpar_softmax(x, x, false)); /* in place */
    get(x, out);
    assert_true(out[0] == 0.5f && out[3] == 1.0f);
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
}
static void test_log_softmax_masked(void **state) {
    (void)state;
    int64_t sh[2] = { 2, 3 };
    dpar_buffer *x = mk(g_rt, DPAR_F32, 2, sh), *y = mk(g_rt, DPAR_F32, 2, sh);
    float in[6] = { 0.0f, -INFINITY, 0.0f, -INFINITY, -INFINITY, -INFINITY }, out[6];
    put(x, in);
    T_OK(dpar_softmax(y, x, true));
    get(y, out);
    assert_true(out[0] == (float)-log(2.0) && out[1] == -INFINITY && out[2] == (float)-log(2.0));
    assert_true(isnan(out[3]) && isnan(out[4]) && isnan(out[5])); /* fully masked row: NaN, as JAX */
    T_OK(dpar_softmax(y, x, false));
    get(y, out);
    assert_true(out[0] == 0.5f && out[1] == 0.0f && out[2] == 0.5f);
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
}
static void test_unary_exact(void **state) {
    (void)state;
    struct {
        dpar_unary_op u;
        float s, x, y;
    } rows[] = {
        { DPAR_UNARY_NEG, 0, 2, -2 },
        { DPAR_UNARY_EXP, 0, 0, 1 },
        { DPAR_UNARY_LOG, 0, 1, 0 },
        { DPAR_UNARY_SQRT, 0, 4, 2 },
        { DPAR_UNARY_RSQRT, 0, 4, 0.5f },
        { DPAR_UNARY_TANH, 0, 0, 0 },
        { DPAR_UNARY_TANH, 0, 100, 1 },
        { DPAR_UNARY_SIGMOID, 0, 0, 0.5f },
        { DPAR_UNARY_SIGMOID, 0, -200, 0 },
        { DPAR_UNARY_GELU_TANH, 0, 0, 0 },
        { DPAR_UNARY_GELU_ERF, 0, 0, 0 },
        { DPAR_UNARY_GELU_ERF, 0, 40, 40 },
        { DPAR_UNARY_SILU, 0, 0, 0 },
        { DPAR_UNARY_SQUARE, 0, -3, 9 },
        { DPAR_UNARY_ADD_SCALAR, 2, 1, 3 },
        { DPAR_UNARY_MUL_SCALAR, 3, 2, 6 },
        { DPAR_UNARY_RSUB_SCALAR, 1, 3, -2 },
        { DPAR_UNARY_DIV_SCALAR, 4, 2, 0.5f },
        { DPAR_UNARY_RDIV_SCALAR, 1, 4, 0.25f },
        { DPAR_UNARY_POW_SCALAR, 3, 2, 8 },
    };
    int64_t one = 1;
    dpar_buffer *x = mk(g_rt, DPAR_F32, 1, &one), *y = mk(g_rt, DPAR_F32, 1, &one);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        float out;
        put(x, &rows[i].x);
        T_OK(dpar_unary(y, x, rows[i].u, rows[i].s));
        get(y, &out);
        if (out != rows[i].y)
            fail_msg("unary op %d of %g: got %.9g want %g", (int)rows[i].u, rows[i].x, out, rows[i].y);
    }
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
}

/* ---- unary: values and finite-difference gradients ---------------------------------- */
static void test_unary_grad(void **state) {
    (void)state;
    enum { N = 37 };
    int64_t n = N;
    dpar_buffer *x = mk(g_rt, DPAR_F32, 1, &n), *y = mk(g_rt, DPAR_F32, 1, &n), *dy = mk(g_rt, DPAR_F32, 1, &n);
    float xv[N], yv[N], wv[N], dxv[N];
    const float scal = 1.7f;
    for (int u = 0; u < DPAR_UNARY_COUNT; u++) {
        float lo, hi;
        unary_domain((dpar_unary_op)u, &lo, &hi);
        fill_rnd(xv, N, lo, hi);
        fill_rnd(wv, N, -1, 1);
        put(x, xv);
        put(dy, wv);
        T_OK(dpar_unary(y, x, (dpar_unary_op)u, scal));
        get(y, yv);
        T_OK(dpar_unary_backward(y, dy, x, (dpar_unary_op)u, scal)); /* dx into y: aliasing nothing read later */
        get(y, dxv);
        for (int i = 0; i < N; i++) {
            double xd = xv[i], h = 1e-6 * (fabs(xd) + 1.0);
            double fp = ref_unary((dpar_unary_op)u, xd + h, scal), fm = ref_unary((dpar_unary_op)u, xd - h, scal);
            double fd = (fp - fm) / (2 * h);
            CHECK_CLOSE(yv[i], ref_unary((dpar_unary_op)u, xd, scal), 2e-7, 1e-7, "unary %d forward at x=%g:", u, xd);
            CHECK_CLOSE(dxv[i], wv[i] * fd, 1e-5, 1e-6, "unary %d backward at x=%g:", u, xd);
        }
    }
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(dy);
}

/* ---- unary: the CPU kernels' bits ------------------------------------------------------ */
/* dpar.h's formulas for the kinds not built on exp (dpar__unary_f, dpar__unary_d, dpar__unary_grad1),
   copied: the kernels compute them in double, vector lanes or not, and must give these bits for every
   input (NaN payloads and signs included: where both operands of x + s, x * s or dy * f'(x) are NaN,
   x's and f'(x)'s come out) */
static double bits_f(int u, double x, double s) {
    switch (u) {
    case DPAR_UNARY_NEG: return -x;
    case DPAR_UNARY_LOG: return log(x);
    case DPAR_UNARY_SQRT: return sqrt(x);
    case DPAR_UNARY_RSQRT: return 1.0 / sqrt(x);
    case DPAR_UNARY_TANH: return tanh(x);
    case DPAR_UNARY_GELU_ERF: return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
    case DPAR_UNARY_SQUARE: return x * x;
    case DPAR_UNARY_ADD_SCALAR: return x != x ? x + x : x + s;
    case DPAR_UNARY_MUL_SCALAR: return x != x ? x + x : x * s;
    case DPAR_UNARY_RSUB_SCALAR: return s - x;
    case DPAR_UNARY_DIV_SCALAR: return x / s;
    case DPAR_UNARY_RDIV_SCALAR: return s / x;
    default: return pow(x, s); /* POW_SCALAR */
    }
}
static double bits_d(int u, double x, double s) {
    switch (u) {
    case DPAR_UNARY_NEG: return -1.0;
    case DPAR_UNARY_LOG: return 1.0 / x;
    case DPAR_UNARY_SQRT: return 0.5 / sqrt(x);
    case DPAR_UNARY_RSQRT: return -0.5 / (x * sqrt(x));
    case DPAR_UNARY_TANH: {
        double t = tanh(x);
        return 1.0 - t * t;
    }
    case DPAR_UNARY_GELU_ERF:
        return 0.5 * (1.0 + erf(x * 0.7071067811865476)) + x * exp(-0.5 * x * x) * 0.3989422804014327;
    case DPAR_UNARY_SQUARE: return 2.0 * x;
    case DPAR_UNARY_ADD_SCALAR: return 1.0;
    case DPAR_UNARY_MUL_SCALAR: return s;
    case DPAR_UNARY_RSUB_SCALAR: return -1.0;
    case DPAR_UNARY_DIV_SCALAR: return 1.0 / s;
    case DPAR_UNARY_RDIV_SCALAR: return -s / (x * x);
    default: return s == 0.0 ? 0.0 : s * pow(x, s - 1.0); /* POW_SCALAR */
    }
}
static double bits_grad(double dy, double d) {
    return d != d ? d : dy * d;
}
/* input i of a bits case: a special value (+-0, subnormals, the extremes, +-inf, quiet and signalling
   NaNs with payloads) or random bits */
static uint64_t bits_input(int f64, int64_t i, int64_t salt, uint64_t *rng) {
    static const uint32_t s32[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00400000u, 0x00800000u,
                                    0x3f800000u, 0xbf800000u, 0x40000000u, 0x3e99999au, 0x7f7fffffu, 0xff7fffffu,
                                    0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc54321u, 0x7f800001u, 0xffa00000u,
                                    0x0d000000u, 0x71000000u, 0x1f800000u, 0x5f800000u, 0x4b800001u };
    static const uint64_t s64[] = { 0x0ull,
                                    0x8000000000000000ull,
                                    0x1ull,
                                    0x800fffffffffffffull,
                                    0x0010000000000000ull,
                                    0x3ff0000000000000ull,
                                    0xbff0000000000000ull,
                                    0x4000000000000000ull,
                                    0x3fd3333333333333ull,
                                    0x7fefffffffffffffull,
                                    0xffefffffffffffffull,
                                    0x7ff0000000000000ull,
                                    0xfff0000000000000ull,
                                    0x7ff8000000000000ull,
                                    0xfff8000000054321ull,
                                    0x7ff0000000000001ull,
                                    0xfff4000000000000ull,
                                    0x3810000000000000ull,
                                    0x47e0000000000000ull,
                                    0x1ff0000000000000ull,
                                    0x5ff0000000000000ull,
                                    0x36a0000000000000ull,
                                    0x4170000000000001ull };
    enum { NS = sizeof s32 / sizeof s32[0] };
    uint64_t r = (uint64_t)((t_splitmix(rng) + 1.0) * 4503599627370496.0);
    r ^= r << 12;
    if ((i + salt) % 3 == 2) return f64 ? r : (uint32_t)r;
    return f64 ? s64[(i * 7 + salt) % NS] : s32[(i * 7 + salt) % NS];
}
/* where only "a NaN" is checked, the compiler's and the CPU's choice: x and s both NaN where the formula
   combines them in an operation whose operand order dpar.h does not fix (all but x + s and x * s
   forward; aarch64 gave pow's gradient s's NaN where x86 gives x's), and a signalling NaN x or dy, which
   gcc's default -fno-signaling-nans may pass on unquieted (aarch64 folded -(double)x to a float negation) */
static int is_nan_bits(int f64, uint64_t b) {
    return f64 ? (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (b & 0xfffffffffffffull)
               : (b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu);
}
static int is_snan_bits(int f64, const unsigned char *p) {
    uint64_t b = 0;
    memcpy(&b, p, f64 ? 8 : 4);
    return is_nan_bits(f64, b) && !(f64 ? b >> 51 & 1 : b >> 22 & 1);
}
static int two_nans(int f64, const unsigned char *xp, const unsigned char *dp, uint32_t s, int u, int bwd) {
    double x;
    if (f64) {
        memcpy(&x, xp, 8);
    } else {
        float xf;
        memcpy(&xf, xp, 4);
        x = (double)xf;
    }
    float sf = t_u2f(s);
    return (x != x && sf != sf && (bwd || (u != DPAR_UNARY_ADD_SCALAR && u != DPAR_UNARY_MUL_SCALAR))) ||
           is_snan_bits(f64, xp) || (bwd && is_snan_bits(f64, dp));
}
/* every kind not built on exp, forward and backward, f32 and f64, at lengths that leave every vector
   tail (and, 5003 on 3 threads, ranges starting off the vector width), against bits_f / bits_d */
static void test_unary_bits(void **state) {
    (void)state;
    static const int kinds[] = { DPAR_UNARY_NEG,         DPAR_UNARY_LOG,        DPAR_UNARY_SQRT,
                                 DPAR_UNARY_RSQRT,       DPAR_UNARY_TANH,       DPAR_UNARY_GELU_ERF,
                                 DPAR_UNARY_SQUARE,      DPAR_UNARY_ADD_SCALAR, DPAR_UNARY_MUL_SCALAR,
                                 DPAR_UNARY_RSUB_SCALAR, DPAR_UNARY_DIV_SCALAR, DPAR_UNARY_RDIV_SCALAR,
                                 DPAR_UNARY_POW_SCALAR };
    static const uint32_t scal[] = { 0x3fd9999au, 0x40000000u, 0x80000000u, 0x000116c2u,
                                     0x7f61b1e6u, 0x7f800000u, 0x7fc12345u };
    static const int64_t lens[] = { 1, 7, 8, 9, 15, 17, 1000, 5003 };
    dpar_runtime *rt = t_cpu_runtime_threads("3");
    uint64_t rng = 77;
    for (int f64 = 0; f64 < 2; f64++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            size_t es = f64 ? 8 : 4;
            dpar_dtype t = f64 ? DPAR_F64 : DPAR_F32;
            dpar_buffer *x = mk(rt, t, 1, &n), *dy = mk(rt, t, 1, &n), *y = mk(rt, t, 1, &n);
            unsigned char *xv = malloc((size_t)n * es), *dv = malloc((size_t)n * es), *yv = malloc((size_t)n * es);
            assert_true(xv && dv && yv);
            for (int64_t i = 0; i < n; i++) {
                uint64_t a = bits_input(f64, i, (int64_t)li, &rng), b = bits_input(f64, i, (int64_t)li + 1, &rng);
                uint32_t a32 = (uint32_t)a, b32 = (uint32_t)b;
                memcpy(xv + (size_t)i * es, f64 ? (void *)&a : (void *)&a32, es);
                memcpy(dv + (size_t)i * es, f64 ? (void *)&b : (void *)&b32, es);
            }
            T_OK(dpar_buffer_write(x, 0, xv, (size_t)n * es));
            T_OK(dpar_buffer_write(dy, 0, dv, (size_t)n * es));
            for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
                for (size_t si = 0; si < sizeof scal / sizeof scal[0]; si++)
                    for (int bwd = 0; bwd < 2; bwd++) {
                        int u = kinds[k];
                        float s = t_u2f(scal[si]);
                        if (bwd)
                            T_OK(dpar_unary_backward(y, dy, x, (dpar_unary_op)u, s));
                        else
                            T_OK(dpar_unary(y, x, (dpar_unary_op)u, s));
                        T_OK(dpar_buffer_read(y, 0, yv, (size_t)n * es));
                        for (int64_t i = 0; i < n; i++) {
                            uint64_t got = 0, want;
                            memcpy(&got, yv + (size_t)i * es, es);
                            if (f64) {
                                double xd, dd;
                                memcpy(&xd, xv + (size_t)i * 8, 8);
                                memcpy(&dd, dv + (size_t)i * 8, 8);
                                double w = bwd ? bits_grad(dd, bits_d(u, xd, (double)s)) : bits_f(u, xd, (double)s);
                                memcpy(&want, &w, 8);
                            } else {
                                float xf, df;
                                memcpy(&xf, xv + (size_t)i * 4, 4);
                                memcpy(&df, dv + (size_t)i * 4, 4);
                                double w = bwd ? bits_grad((double)df, bits_d(u, (double)xf, (double)s))
                                               : bits_f(u, (double)xf, (double)s);
                                want = t_f2u((float)w);
                            }
                            if (got != want &&
                                !(two_nans(f64, xv + (size_t)i * es, dv + (size_t)i * es, scal[si], u, bwd) &&
                                  is_nan_bits(f64, got)))
                                fail_msg("%s unary %d%s s=0x%08x, %lld elements, [%lld]: got 0x%llx want 0x%llx",
                                         f64 ? "f64" : "f32", u, bwd ? " backward" : "", scal[si], (long long)n,
                                         (long long)i, (unsigned long long)got, (unsigned long long)want);
                        }
                    }
            free(xv);
            free(dv);
            free(yv);
            dpar_buffer_destroy(x);
            dpar_buffer_destroy(dy);
            dpar_buffer_destroy(y);
        }
    dpar_runtime_destroy(rt);
}

/* a op b as the CPU kernels give it, in the operands' type: a's NaN where both are NaN */
#define BITS_BINARY(o, a, b)              \
    ((a) != (a)               ? (a) + (a) \
     : (o) == DPAR_BINARY_ADD ? (a) + (b) \
     : (o) == DPAR_BINARY_SUB ? (a) - (b) \
     : (o) == DPAR_BINARY_MUL ? (a) * (b) \
                              : (a) / (b))
/* every binary op, f32 and f64, on specials and random bits: dense rows of every vector tail, b
   broadcast along rows, down columns (one value per row) and a broadcast, bit for bit */
static void test_binary_bits(void **state) {
    (void)state;
    static const struct {
        int na, nb;
        int64_t a[2], b[2];
    } shapes[] = { { 2, 2, { 1, 1 }, { 1, 1 } },       { 2, 2, { 3, 7 }, { 3, 7 } }, { 2, 2, { 2, 17 }, { 2, 17 } },
                   { 2, 2, { 3, 1000 }, { 3, 1000 } }, { 2, 1, { 5, 33 }, { 33 } },  { 2, 2, { 4, 31 }, { 4, 1 } },
                   { 2, 2, { 3, 16 }, { 3, 1 } },      { 2, 2, { 6, 1 }, { 6, 15 } } };
    uint64_t rng = 99;
    for (int f64 = 0; f64 < 2; f64++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            int na = shapes[k].na, nb = shapes[k].nb;
            const int64_t *as = shapes[k].a, *bs = shapes[k].b;
            int64_t bl = bs[nb - 1], ys[2] = { as[0], as[1] > bl ? as[1] : bl };
            int64_t nA = cnt(na, as), nB = cnt(nb, bs), nY = ys[0] * ys[1];
            size_t es = f64 ? 8 : 4;
            dpar_dtype t = f64 ? DPAR_F64 : DPAR_F32;
            dpar_buffer *a = mk(g_rt, t, na, as), *b = mk(g_rt, t, nb, bs), *y = mk(g_rt, t, 2, ys);
            unsigned char *av = malloc((size_t)nA * es), *bv = malloc((size_t)nB * es), *yv = malloc((size_t)nY * es);
            assert_true(av && bv && yv);
            for (int64_t i = 0; i < nA; i++) {
                uint64_t v = bits_input(f64, i, (int64_t)k, &rng);
                memcpy(av + (size_t)i * es, f64 ? (void *)&v : (void *)&(uint32_t){ (uint32_t)v }, es);
            }
            for (int64_t i = 0; i < nB; i++) {
                uint64_t v = bits_input(f64, i, (int64_t)k + 1, &rng);
                memcpy(bv + (size_t)i * es, f64 ? (void *)&v : (void *)&(uint32_t){ (uint32_t)v }, es);
            }
            T_OK(dpar_buffer_write(a, 0, av, (size_t)nA * es));
            T_OK(dpar_buffer_write(b, 0, bv, (size_t)nB * es));
            for (int o = 0; o < 4; o++) {
                T_OK(dpar_binary(y, a, b, (dpar_binary_op)o));
                T_OK(dpar_buffer_read(y, 0, yv, (size_t)nY * es));
                for (int64_t i = 0; i < nY; i++) {
                    int64_t ia = bidx(2, ys, na, as, i), ib = bidx(2, ys, nb, bs, i);
                    uint64_t got = 0, want = 0;
                    memcpy(&got, yv + (size_t)i * es, es);
                    if (f64) {
                        double x0, x1, w;
                        memcpy(&x0, av + (size_t)ia * 8, 8);
                        memcpy(&x1, bv + (size_t)ib * 8, 8);
                        w = BITS_BINARY(o, x0, x1);
                        memcpy(&want, &w, 8);
                    } else {
                        float x0, x1, w;
                        memcpy(&x0, av + (size_t)ia * 4, 4);
                        memcpy(&x1, bv + (size_t)ib * 4, 4);
                        w = BITS_BINARY(o, x0, x1);
                        want = t_f2u(w);
                    }
                    uint64_t ua = 0, ub = 0;
                    memcpy(&ua, av + (size_t)ia * es, es);
                    memcpy(&ub, bv + (size_t)ib * es, es);
                    if (got != want)
                        fail_msg("%s binary %d, shape case %zu, [%lld] = a 0x%llx op b 0x%llx: got 0x%llx want 0x%llx",
                                 f64 ? "f64" : "f32", o, k, (long long)i, (unsigned long long)ua,
                                 (unsigned long long)ub, (unsigned long long)got, (unsigned long long)want);
                }
            }
            free(av);
            free(bv);
            free(yv);
            dpar_buffer_destroy(a);
            dpar_buffer_destroy(b);
            dpar_buffer_destroy(y);
        }
}

/* ---- binary with broadcasting -------------------------------------------------------- */
typedef struct bshape {
    int na, nb, ny;
    int64_t a[4], b[4], y[4];
} bshape;
static const bshape g_bshapes[] = {
    { 2, 2, 2, { 3, 4 }, { 3, 4 }, { 3, 4 } },                /* same shape */
    { 2, 1, 2, { 3, 4 }, { 4 }, { 3, 4 } },                   /* bias-like */
    { 2, 2, 2, { 3, 1 }, { 1, 4 }, { 3, 4 } },                /* outer */
    { 3, 0, 3, { 2, 3, 5 }, { 0 }, { 2, 3, 5 } },             /* scalar b */
    { 4, 3, 4, { 2, 1, 3, 1 }, { 5, 1, 2 }, { 2, 5, 3, 2 } }, /* alternating */
    { 2, 2, 2, { 0, 3 }, { 1, 3 }, { 0, 3 } },                /* size 0 */
    { 2, 2, 2, { 3, 1 }, { 1, 0 }, { 3, 0 } },                /* size 1 stretched to 0 */
    { 1, 1, 1, { 1 }, { 1 }, { 1 } },
    { 3, 3, 3, { 1, 1, 7 }, { 6, 1, 1 }, { 6, 1, 7 } },
};
static double bin_loss(dpar_binary_op o, const bshape *s, const double *a, const double *b, const float *w) {
    double f = 0;
    int64_t ny = cnt(s->ny, s->y);
    for (int64_t i = 0; i < ny; i++)
        f += (double)w[i] * ref_binary(o, a[bidx(s->ny, s->y, s->na, s->a, i)], b[bidx(s->ny, s->y, s->nb, s->b, i)]);
    return f;
}
static void test_binary_broadcast_and_grad(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_bshapes / sizeof g_bshapes[0]; k++) {
        const bshape *s = &g_bshapes[k];
        int64_t na = cnt(s->na, s->a), nb = cnt(s->nb, s->b), ny = cnt(s->ny, s->y);
        dpar_buffer *a = mk(g_rt, DPAR_F32, s->na, s->a), *b = mk(g_rt, DPAR_F32, s->nb, s->b);
        dpar_buffer *y = mk(g_rt, DPAR_F32, s->ny, s->y), *dy = mk(g_rt, DPAR_F32, s->ny, s->y);
        dpar_buffer *da = mk(g_rt, DPAR_F32, s->na, s->a), *db = mk(g_rt, DPAR_F32, s->nb, s->b);
        float av[256], bv[256], yv[256], wv[256], dav[256], dbv[256];
        double ad[256], bd[256];
        fill_rnd(av, na, 0.5f, 2.0f);
        fill_rnd(bv, nb, 0.5f, 2.0f);
        fill_rnd(wv, ny, -1, 1);
        for (int64_t i = 0; i < na; i++) ad[i] = av[i];
        for (int64_t i = 0; i < nb; i++) bd[i] = bv[i];
        put(a, av);
        put(b, bv);
        put(dy, wv);
        for (int o = 0; o < DPAR_BINARY_COUNT; o++) {
            T_OK(dpar_binary(y, a, b, (dpar_binary_op)o));
            get(y, yv);
            for (int64_t i = 0; i < ny; i++)
                CHECK_CLOSE(yv[i],
                            (float)ref_binary((dpar_binary_op)o, av[bidx(s->ny, s->y, s->na, s->a, i)],
                                              bv[bidx(s->ny, s->y, s->nb, s->b, i)]),
                            0, 0, "shape case %zu op %d element %lld:", k, o, (long long)i);
            T_OK(dpar_binary_backward(da, db, dy, a, b, (dpar_binary_op)o));
            get(da, dav);
            get(db, dbv);
            for (int side = 0; side < 2; side++) {
                double *v = side ? bd : ad;
                for (int64_t j = 0; j < (side ? nb : na); j++) {
                    double keep = v[j], h = 1e-6;
                    v[j] = keep + h;
                    double fp = bin_loss((dpar_binary_op)o, s, ad, bd, wv);
                    v[j] = keep - h;
                    double fm = bin_loss((dpar_binary_op)o, s, ad, bd, wv);
                    v[j] = keep;
                    CHECK_CLOSE(side ? dbv[j] : dav[j], (fp - fm) / (2 * h), 1e-5, 1e-5,
                                "shape case %zu op %d d%c[%lld]:", k, o, side ? 'b' : 'a', (long long)j);
                }
            }
        }
        dpar_buffer *all[6] = { a, b, y, dy, da, db };
        for (int i = 0; i < 6; i++) dpar_buffer_destroy(all[i]);
    }
}

/* add without broadcast: da = db = 0 + dy exactly (as the sum over one element: -0 gives +0, NaN stays) */
static void test_binary_add_grad_exact(void **state) {
    (void)state;
    int64_t sh[2] = { 3, 7 };
    float w[21], da[21], db[21];
    for (int i = 0; i < 21; i++) w[i] = (float)(i - 10) * 0.37f;
    w[3] = -0.0f, w[4] = NAN, w[5] = -INFINITY;
    dpar_buffer *a = mk(g_rt, DPAR_F32, 2, sh), *b = mk(g_rt, DPAR_F32, 2, sh), *dy = mk(g_rt, DPAR_F32, 2, sh);
    dpar_buffer *ga = mk(g_rt, DPAR_F32, 2, sh), *gb = mk(g_rt, DPAR_F32, 2, sh);
    put(dy, w);
    T_OK(dpar_binary_backward(ga, gb, dy, a, b, DPAR_BINARY_ADD));
    get(ga, da);
    get(gb, db);
    for (int i = 0; i < 21; i++) {
        float e = 0.0f + w[i];
        assert_true(i == 4 ? isnan(da[i]) && isnan(db[i])
                           : memcmp(&da[i], &e, sizeof e) == 0 && memcmp(&db[i], &e, sizeof e) == 0);
    }
    assert_true(!signbit(da[3]) && !signbit(db[3]));
    dpar_buffer *all[5] = { a, b, dy, ga, gb };
    for (int i = 0; i < 5; i++) dpar_buffer_destroy(all[i]);
}

/* binary_backward bit for bit against its double formulas (0.0 plus each term of an output, in dy's order,
   rounded once to f32: -dy, dy b, dy a, dy / b, -dy a / (b b)): every op; rows of lengths 1..1000 (the vector
   lanes' tails); an operand broadcast along leading dims or the last one, on both sides of the gradient (one
   element per output, or a sum over the broadcast dims); +-0, subnormals, +-inf, NaN, huge and tiny values;
   1 and 3 threads (splits inside a row and inside 8 outputs). A NaN result is checked as a NaN: which NaN an
   op keeps when both operands are NaN is the compiler's order of them. */
static float bits_value(int dense) { /* dense: half of them special (the vector tails' few elements) */
    static const uint32_t sp[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00400000u, 0x7f800000u,
                                   0xff800000u, 0x7fc00000u, 0xffc12345u, 0x7f7fffffu, 0xff7fffffu, 0x1f800000u,
                                   0x5f800000u, 0x0f000000u, 0x3f800000u, 0xbf800000u };
    g_seed = g_seed * 1664525u + 1013904223u;
    uint32_t r = g_seed >> 8;
    if (r % 16 == 0 || (dense && r % 2)) return t_u2f(sp[(r >> 4) % (sizeof sp / sizeof sp[0])]);
    if (r % 16 == 1) return t_u2f(g_seed * 2654435761u); /* any bits: every exponent, NaN payloads */
    return 4.0f * rnd();
}
static void test_binary_grad_bits(void **state) {
    (void)state;
    uint32_t keep = g_seed; /* the later tests' data as before */
    typedef struct {
        int64_t y[3], a[3], b[3];
    } bcase;
    static const int64_t lens[] = { 1, 7, 8, 9, 17, 1000 };
    bcase cs[6 * 4 + 3];
    int nc = 0;
    for (int l = 0; l < 6; l++) {
        int64_t n = lens[l];
        bcase same = { { 1, 1, n }, { 1, 1, n }, { 1, 1, n } }, lead = { { 1, 5, n }, { 1, 5, n }, { 1, 1, n } };
        bcase last = { { 1, 5, n }, { 1, 5, 1 }, { 1, 5, n } }, both = { { 3, 4, n }, { 3, 1, n }, { 1, 4, 1 } };
        cs[nc++] = same, cs[nc++] = lead, cs[nc++] = last, cs[nc++] = both;
    }
    bcase big1 = { { 1, 66, 1000 }, { 1, 66, 1000 }, { 1, 66, 1000 } }; /* 3 threads: 66,000 elements */
    bcase big2 = { { 1, 66, 1000 }, { 1, 66, 1000 }, { 1, 1, 1000 } },
          big3 = { { 1, 66, 1000 }, { 1, 66, 1 }, { 1, 66, 1000 } };
    cs[nc++] = big1, cs[nc++] = big2, cs[nc++] = big3;
    dpar_runtime *rts[2] = { g_rt, t_cpu_runtime_threads("3") };
    for (int ri = 0; ri < 2; ri++)
        for (int k = 0; k < nc; k++) {
            const bcase *c = &cs[k];
            int64_t ny = cnt(3, c->y), na = cnt(3, c->a), nb = cnt(3, c->b);
            dpar_buffer *dy = mk(rts[ri], DPAR_F32, 3, c->y), *a = mk(rts[ri], DPAR_F32, 3, c->a);
            dpar_buffer *b = mk(rts[ri], DPAR_F32, 3, c->b), *da = mk(rts[ri], DPAR_F32, 3, c->a);
            dpar_buffer *db = mk(rts[ri], DPAR_F32, 3, c->b);
            float *v = (float *)malloc((size_t)(ny + na + nb) * 2 * sizeof(float)), *av = v + ny, *bv = av + na;
            float *got = bv + nb;
            double *acc = (double *)malloc((size_t)(na + nb) * sizeof(double));
            assert_non_null(v);
            assert_non_null(acc);
            for (int f = 0; f < 2 * DPAR_BINARY_COUNT; f++) { /* each op on two fills */
                int o = f % DPAR_BINARY_COUNT;
                if (o == 0) {
                    for (int64_t i = 0; i < ny + na + nb; i++) v[i] = bits_value(f > 0);
                    put(dy, v);
                    put(a, av);
                    put(b, bv);
                }
                T_OK(dpar_binary_backward(da, db, dy, a, b, (dpar_binary_op)o));
                get(da, got);
                get(db, got + na);
                for (int64_t i = 0; i < na + nb; i++) acc[i] = 0.0;
                for (int64_t i = 0; i < ny; i++) {
                    int64_t ia = bidx(3, c->y, 3, c->a, i), ib = bidx(3, c->y, 3, c->b, i);
                    double w = (double)v[i], x = (double)av[ia], z = (double)bv[ib];
                    acc[ia] += o == DPAR_BINARY_MUL ? w * z : o == DPAR_BINARY_DIV ? w / z : w;
                    if (o == DPAR_BINARY_SUB)
                        acc[na + ib] -= w;
                    else
                        acc[na + ib] += o == DPAR_BINARY_MUL ? w * x : o == DPAR_BINARY_DIV ? -w * x / (z * z) : w;
                }
                for (int64_t i = 0; i < na + nb; i++) {
                    float want = (float)acc[i];
                    if (isnan(want) ? !isnan(got[i]) : t_f2u(got[i]) != t_f2u(want))
                        fail_msg(
                            "%d threads, fill %d, case %d (dy %lldx%lldx%lld), op %d, d%c[%lld]: 0x%08x, want 0x%08x",
                            ri ? 3 : 1, f / DPAR_BINARY_COUNT, k, (long long)c->y[0], (long long)c->y[1],
                            (long long)c->y[2], o, i < na ? 'a' : 'b', (long long)(i < na ? i : i - na), t_f2u(got[i]),
                            t_f2u(want));
                }
            }
            free(v);
            free(acc);
            dpar_buffer *all[5] = { dy, a, b, da, db };
            for (int i = 0; i < 5; i++) dpar_buffer_destroy(all[i]);
        }
    dpar_runtime_destroy(rts[1]);
    g_seed = keep;
}

/* ---- reductions ---------------------------------------------------------------------- */
typedef struct rcase {
    int nd;
    int64_t x[4];
    int naxes, axes[4];
    int keep;
} rcase;
static const rcase g_rcases[] = {
    { 2, { 3, 4 }, 1, { 1 }, 0 },
    { 2, { 3, 4 }, 1, { 0 }, 1 },
    { 3, { 2, 3, 4 }, 2, { 0, 2 }, 0 },
    { 3, { 2, 3, 4 }, 1, { -2 }, 1 },
    { 4, { 2, 3, 2, 3 }, 2, { 1, 3 }, 0 },
    { 3, { 2, 0, 3 }, 1, { 1 }, 0 },
    { 2, { 1, 5 }, 1, { 0 }, 0 },
    { 3, { 2, 3, 4 }, -1, { 0 }, 0 },
    { 1, { 9 }, 1, { 0 }, 1 },
    { 3, { 2, 3, 4 }, 2, { 2, 0 }, 1 }, /* axes out of order: argmax still counts in x's order */
    /* a kept last dim of 8 or more: sums of 8 neighbours at a time (AVX-512), the rest one by one */
    { 2, { 3, 11 }, 1, { 0 }, 0 },
    { 3, { 2, 3, 9 }, 2, { 0, 1 }, 0 },
    { 3, { 2, 2, 17 }, 1, { 1 }, 1 },
};
/* y shape (keepdims or not) and, per x element, the y element it falls into and its index in the reduced set */
static int rc_shape(const rcase *c, unsigned mask, int64_t *ysh) {
    int ny = 0;
    for (int i = 0; i < c->nd; i++)
        if (!(mask >> i & 1u))
            ysh[ny++] = c->x[i];
        else if (c->keep)
            ysh[ny++] = 1;
    return ny;
}
static void rc_map(const rcase *c, unsigned mask, int64_t i, int64_t *yo, int64_t *ro) {
    int64_t y = 0, ys = 1, r = 0, rs = 1;
    for (int d = c->nd - 1; d >= 0; d--) {
        int64_t cd = i % c->x[d];
        i /= c->x[d];
        if (mask >> d & 1u) {
            r += cd * rs;
            rs *= c->x[d];
        } else {
            y += cd * ys;
            ys *= c->x[d];
        }
    }
    *yo = y;
    *ro = r;
}
static void test_reduce(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof g_rcases / sizeof g_rcases[0]; k++) {
        const rcase *c = &g_rcases[k];
        unsigned mask = 0;
        for (int i = 0; i < (c->naxes < 0 ? c->nd : c->naxes); i++)
            mask |= 1u << (c->naxes < 0 ? i : (c->axes[i] + c->nd) % c->nd);
        int64_t ysh[4], nx = cnt(c->nd, c->x);
        int ny_d = rc_shape(c, mask, ysh);
        int64_t ny = cnt(ny_d, ysh);
        dpar_buffer *x = mk(g_rt, DPAR_F32, c->nd, c->x), *y = mk(g_rt, DPAR_F32, ny_d, ysh);
        dpar_buffer *yi = mk(g_rt, DPAR_I32, ny_d, ysh), *dx = mk(g_rt, DPAR_F32, c->nd, c->x);
        float xv[128], yv[128], dxv[128], wv[128];
        int32_t iv[128];
        double sum[128], mx[128];
        int64_t am[128], rcount = ny ? nx / ny : 0;
        fill_rnd(xv, nx, -2, 2);
        if (nx > 3) xv[3] = xv[2]; /* a tie */
        put(x, xv);
        for (int64_t j = 0; j < ny; j++) sum[j] = 0, mx[j] = -INFINITY, am[j] = -1;
        for (int64_t i = 0; i < nx; i++) {
            int64_t yo, ro;
            rc_map(c, mask, i, &yo, &ro);
            sum[yo] += xv[i];
            if (xv[i] > mx[yo]) mx[yo] = xv[i], am[yo] = ro;
        }
        const int *axes = c->naxes < 0 ? NULL : c->axes;
        int naxes = c->naxes < 0 ? 0 : c->naxes;
        for (int kind = 0; kind < DPAR_REDUCE_KIND_COUNT; kind++) {
            if ((kind == DPAR_REDUCE_MAX || kind == DPAR_REDUCE_ARGMAX) && nx == 0) {
                dpar_status want = ny ? DPAR_ERR_SHAPE : DPAR_OK;
                assert_int_equal(dpar_reduce(kind == DPAR_REDUCE_MAX ? y : yi, x, (dpar_reduce_kind)kind, axes, naxes),
                                 want);
                continue;
            }
            T_OK(dpar_reduce(kind == DPAR_REDUCE_ARGMAX ? yi : y, x, (dpar_reduce_kind)kind, axes, naxes));
            get(y, yv);
            get(yi, iv);
            for (int64_t j = 0; j < ny; j++) {
                if (kind == DPAR_REDUCE_ARGMAX) {
                    if (iv[j] != am[j])
                        fail_msg("case %zu argmax[%lld] = %d want %lld", k, (long long)j, iv[j], (long long)am[j]);
                    continue;
                }
                double want = kind == DPAR_REDUCE_SUM    ? sum[j]
                              : kind == DPAR_REDUCE_MEAN ? sum[j] / (double)rcount
                                                         : mx[j];
                CHECK_CLOSE(yv[j], (float)want, 0, 0, "case %zu kind %d y[%lld]:", k, kind, (long long)j);
            }
        }
        /* gradients of sum, mean (the loss sum_j w_j reduce(x)_j is linear in x) and max: central
           differences of the max in double where the slice's maximum is unique, else the first maximum */
        fill_rnd(wv, ny, -1, 1);
        put(y, wv);
        for (int kind = 0; kind < 3; kind++) {
            T_OK(dpar_reduce_backward(dx, y, kind == DPAR_REDUCE_MAX ? x : NULL, (dpar_reduce_kind)kind, axes, naxes));
            get(dx, dxv);
            for (int64_t i = 0; i < nx; i++) {
                int64_t yo, ro, ties = 0;
                rc_map(c, mask, i, &yo, &ro);
                double want = (double)wv[yo] * (kind ? 1.0 / (double)rcount : 1.0);
                if (kind == DPAR_REDUCE_MAX) {
                    for (int64_t j = 0; j < nx; j++) {
                        int64_t yj, rj;
                        rc_map(c, mask, j, &yj, &rj);
                        ties += yj == yo && xv[j] == mx[yo];
                    }
                    double h = 1e-3, fp = fmax(mx[yo], (double)xv[i] + h), fm = xv[i] - h;
                    if (xv[i] == mx[yo]) /* moving the maximum down: the slice's max follows until the next */
                        for (int64_t j = 0; j < nx; j++) {
                            int64_t yj, rj;
                            rc_map(c, mask, j, &yj, &rj);
                            if (yj == yo && j != i) fm = fmax(fm, (double)xv[j]);
                        }
                    else
                        fm = mx[yo];
                    want = ties > 1 ? (ro == am[yo] ? wv[yo] : 0.0) : (double)wv[yo] * (fp - fm) / (2 * h);
                }
                CHECK_CLOSE(dxv[i], want, 1e-5, 1e-7, "case %zu kind %d dx[%lld]:", k, kind, (long long)i);
            }
        }
        dpar_buffer_destroy(x);
        dpar_buffer_destroy(y);
        dpar_buffer_destroy(yi);
        dpar_buffer_destroy(dx);
    }
}
static void test_reduce_nan_and_ties(void **state) {
    (void)state;
    int64_t sh[2] = { 2, 4 }, two = 2;
    dpar_buffer *x = mk(g_rt, DPAR_F32, 2, sh), *y = mk(g_rt, DPAR_F32, 1, &two), *yi = mk(g_rt, DPAR_I32, 1, &two);
    float in[8] = { 1, 3, 3, 2, 1, NAN, 5, NAN }, out[2];
    int32_t io[2];
    int ax = 1;
    put(x, in);
    T_OK(dpar_reduce(y, x, DPAR_REDUCE_MAX, &ax, 1));
    T_OK(dpar_reduce(yi, x, DPAR_REDUCE_ARGMAX, &ax, 1));
    get(y, out);
    get(yi, io);
    assert_true(out[0] == 3.0f && isnan(out[1]) && io[0] == 1 && io[1] == 1);
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(yi);
}

/* ---- softmax gradients ----------------------------------------------------------------- */
static double sm_loss(const double *x, const float *w, int64_t m, int64_t n, int lg) {
    double f = 0;
    for (int64_t r = 0; r < m; r++) {
        double mx = -INFINITY, se = 0;
        for (int64_t j = 0; j < n; j++) mx = fmax(mx, x[r * n + j]);
        for (int64_t j = 0; j < n; j++) se += exp(x[r * n + j] - mx);
        for (int64_t j = 0; j < n; j++) {
            double z = x[r * n + j] - mx;
            f += (double)w[r * n + j] * (lg ? z - log(se) : exp(z) / se);
        }
    }
    return f;
}
static void test_softmax_grad(void **state) {
    (void)state;
    enum { M = 3, N = 7 };
    int64_t sh[2] = { M, N };
    dpar_buffer *x = mk(g_rt, DPAR_F32, 2, sh), *y = mk(g_rt, DPAR_F32, 2, sh), *dy = mk(g_rt, DPAR_F32, 2, sh);
    float xv[M * N], yv[M * N], wv[M * N], dxv[M * N];
    double xd[M * N];
    fill_rnd(xv, M * N, -3, 3);
    fill_rnd(wv, M * N, -1, 1);
    for (int i = 0; i < M * N; i++) xd[i] = xv[i];
    put(x, xv);
    put(dy, wv);
    for (int lg = 0; lg < 2; lg++) {
        T_OK(dpar_softmax(y, x, lg));
        get(y, yv);
        T_OK(dpar_softmax_backward(dy, dy, y, lg)); /* dx in place of dy */
        get(dy, dxv);
        put(dy, wv);
        for (int i = 0; i < M * N; i++) {
            double keep = xd[i], h = 1e-6;
            xd[i] = keep + h;
            double fp = sm_loss(xd, wv, M, N, lg);
            xd[i] = keep - h;
            double fm = sm_loss(xd, wv, M, N, lg);
            xd[i] = keep;
            CHECK_CLOSE(dxv[i], (fp - fm) / (2 * h), 1e-5, 1e-6, "softmax log=%d dx[%d]:", lg, i);
        }
    }
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(dy);
}

/* ---- where ---------------------------------------------------------------------------------- */
static void test_where(void **state) {
    (void)state;
    int64_t ysh[2] = { 3, 4 }, csh[2] = { 3, 1 }, ash[1] = { 4 };
    dpar_buffer *y = mk(g_rt, DPAR_F32, 2, ysh), *cf = mk(g_rt, DPAR_F32, 2, csh), *ci = mk(g_rt, DPAR_I32, 2, csh);
    dpar_buffer *a = mk(g_rt, DPAR_F32, 1, ash), *b = mk(g_rt, DPAR_F32, 2, ysh), *da = mk(g_rt, DPAR_F32, 1, ash);
    float cv[3] = { 1, 0, NAN }, av[4] = { 1, 2, 3, 4 }, bv[12], out[12];
    int32_t iv[3] = { 7, 0, -1 };
    for (int i = 0; i < 12; i++) bv[i] = (float)(100 + i);
    put(cf, cv);
    put(ci, iv);
    put(a, av);
    put(b, bv);
    for (int t = 0; t < 2; t++) {
        T_OK(dpar_where(y, t ? ci : cf, a, b, 0, 0));
        get(y, out);
        for (int i = 0; i < 12; i++) assert_true(out[i] == (i / 4 == 1 ? bv[i] : av[i % 4]));
    }
    T_OK(dpar_where(y, cf, NULL, b, 0, -INFINITY)); /* scalar a */
    get(y, out);
    assert_true(out[0] == 0.0f && out[4] == 104.0f && out[11] == 0.0f);
    T_OK(dpar_where(y, cf, a, NULL, 0, -INFINITY)); /* mask to -inf */
    get(y, out);
    assert_true(out[1] == 2.0f && out[5] == -INFINITY);
    /* gradient wrt a: where(cond, dy, 0) reduced over the broadcast rows */
    float ones[12];
    for (int i = 0; i < 12; i++) ones[i] = (float)(i + 1);
    put(b, ones);
    T_OK(dpar_where(y, cf, b, NULL, 0, 0));
    int ax = 0;
    T_OK(dpar_reduce(da, y, DPAR_REDUCE_SUM, &ax, 1));
    get(da, out);
    assert_true(out[0] == 1.0f + 9.0f && out[3] == 4.0f + 12.0f);
    dpar_buffer *all[6] = { y, cf, ci, a, b, da };
    for (int i = 0; i < 6; i++) dpar_buffer_destroy(all[i]);
}

/* ---- shape ops ------------------------------------------------------------------------------- */
static void test_transpose(void **state) {
    (void)state;
    int64_t xs[5] = { 2, 3, 2, 2, 3 }, ys[5];
    int perm[5] = { 4, 2, 0, 3, 1 }, inv[5];
    for (int i = 0; i < 5; i++) ys[i] = xs[perm[i]], inv[perm[i]] = i;
    dpar_buffer *x = mk(g_rt, DPAR_F32, 5, xs), *y = mk(g_rt, DPAR_F32, 5, ys), *z = mk(g_rt, DPAR_F32, 5, xs);
    float xv[72], yv[72], zv[72];
    for (int i = 0; i < 72; i++) xv[i] = (float)i;
    put(x, xv);
    T_OK(dpar_transpose(y, x, perm));
    get(y, yv);
    for (int64_t i = 0; i < 72; i++) { /* y[c] = x[c permuted back] */
        int64_t c[5], r = i, xi = 0;
        for (int d = 4; d >= 0; d--) c[d] = r % ys[d], r /= ys[d];
        for (int d = 0; d < 5; d++) xi = xi * xs[d] + c[inv[d]];
        assert_true(yv[i] == xv[xi]);
    }
    T_OK(dpar_transpose(z, y, inv)); /* the backward: the inverse permutation */
    get(z, zv);
    assert_memory_equal(zv, xv, sizeof xv);
    int64_t s2[2] = { 3, 5 }, s2t[2] = { 5, 3 };
    dpar_buffer *m = mk(g_rt, DPAR_I32, 2, s2), *mt = mk(g_rt, DPAR_I32, 2, s2t);
    int32_t mv[15], mtv[15];
    for (int i = 0; i < 15; i++) mv[i] = i;
    put(m, mv);
    T_OK(dpar_transpose(mt, m, NULL));
    get(mt, mtv);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) assert_int_equal(mtv[j * 3 + i], mv[i * 5 + j]);
    dpar_buffer *all[5] = { x, y, z, m, mt };
    for (int i = 0; i < 5; i++) dpar_buffer_destroy(all[i]);
}
static void test_slice_pad_concat_broadcast(void **state) {
    (void)state;
    int64_t xs[2] = { 5, 6 }, ys[2] = { 2, 3 }, start[2] = { 1, 0 }, step[2] = { 3, 2 };
    dpar_buffer *x = mk(g_rt, DPAR_F32, 2, xs), *y = mk(g_rt, DPAR_F32, 2, ys), *dx = mk(g_rt, DPAR_F32, 2, xs);
    float xv[30], yv[6], dxv[30];
    for (int i = 0; i < 30; i++) xv[i] = (float)i;
    put(x, xv);
    T_OK(dpar_slice(y, x, start, step));
    get(y, yv);
    float want[6] = { 6, 8, 10, 24, 26, 28 };
    assert_memory_equal(yv, want, sizeof want);
    T_OK(dpar_slice_backward(dx, y, start, step)); /* the transpose: <slice(x), w> = <x, slice_backward(w)> */
    get(dx, dxv);
    for (int i = 0; i < 30; i++) {
        int r = i / 6, c = i % 6, hit = (r == 1 || r == 4) && c % 2 == 0;
        assert_true(dxv[i] == (hit ? xv[i] : 0.0f));
    }
    /* pad: y[1:3, 2:5] = x, rest -1; its backward is the slice */
    int64_t ps[2] = { 4, 6 }, lo[2] = { 1, 2 }, s23[2] = { 2, 3 };
    dpar_buffer *p = mk(g_rt, DPAR_F32, 2, ps), *q = mk(g_rt, DPAR_F32, 2, s23);
    float pv[24], qv[6];
    T_OK(dpar_pad(p, y, lo, -1.0f));
    get(p, pv);
    for (int i = 0; i < 24; i++) {
        int r = i / 6, c = i % 6, in = r >= 1 && r < 3 && c >= 2 && c < 5;
        assert_true(pv[i] == (in ? yv[(r - 1) * 3 + c - 2] : -1.0f));
    }
    T_OK(dpar_slice(q, p, lo, NULL));
    get(q, qv);
    assert_memory_equal(qv, yv, sizeof yv);
    /* concat along axis 1 and axis -2 */
    int64_t c1[2] = { 2, 6 }, c0[2] = { 4, 3 };
    dpar_buffer *cc1 = mk(g_rt, DPAR_F32, 2, c1), *cc0 = mk(g_rt, DPAR_F32, 2, c0);
    const dpar_buffer *two[2] = { y, q };
    float cv[12];
    T_OK(dpar_concat(cc1, two, 2, 1));
    get(cc1, cv);
    for (int i = 0; i < 12; i++) assert_true(cv[i] == yv[(i / 6) * 3 + (i % 6) % 3]);
    T_OK(dpar_concat(cc0, two, 2, -2));
    get(cc0, cv);
    for (int i = 0; i < 12; i++) assert_true(cv[i] == yv[i % 6]);
    /* broadcast_to [3] -> [2, 0, 3] (empty) and -> [4, 3]; its backward is the sum */
    int64_t b1[1] = { 3 }, b0[3] = { 2, 0, 3 }, b2[2] = { 4, 3 };
    dpar_buffer *bx = mk(g_rt, DPAR_F32, 1, b1), *be = mk(g_rt, DPAR_F32, 3, b0), *bb = mk(g_rt, DPAR_F32, 2, b2);
    float bxv[3] = { 1, 2, 3 }, bbv[12];
    put(bx, bxv);
    T_OK(dpar_broadcast_to(be, bx));
    T_OK(dpar_broadcast_to(bb, bx));
    get(bb, bbv);
    for (int i = 0; i < 12; i++) assert_true(bbv[i] == bxv[i % 3]);
    int ax = 0;
    T_OK(dpar_reduce(bx, bb, DPAR_REDUCE_SUM, &ax, 1));
    get(bx, bxv);
    assert_true(bxv[0] == 4.0f && bxv[2] == 12.0f);
    dpar_buffer *all[11] = { x, y, dx, p, q, cc1, cc0, bx, be, bb, NULL };
    for (int i = 0; all[i]; i++) dpar_buffer_destroy(all[i]);
}

/* ---- errors --------------------------------------------------------------------------------- */
static void test_errors(void **state) {
    (void)state;
    int64_t s34[2] = { 3, 4 }, s3[1] = { 3 }, s43[2] = { 4, 3 }, s6[6] = { 2, 1, 2, 1, 2, 1 };
    int64_t s6b[6] = { 1, 2, 1, 2, 1, 2 }, s6y[6] = { 2, 2, 2, 2, 2, 2 };
    dpar_buffer *a = mk(g_rt, DPAR_F32, 2, s34), *b = mk(g_rt, DPAR_F32, 1, s3), *y = mk(g_rt, DPAR_F32, 2, s34);
    dpar_buffer *t = mk(g_rt, DPAR_F32, 2, s43), *i = mk(g_rt, DPAR_I32, 2, s34);
    dpar_buffer *c6 = mk(g_rt, DPAR_F32, 6, s6), *c6b = mk(g_rt, DPAR_F32, 6, s6b), *y6 = mk(g_rt, DPAR_F32, 6, s6y);
    T_ERR(dpar_binary(y, a, b, DPAR_BINARY_ADD), DPAR_ERR_SHAPE, "dpar_binary", "b [3]", "[3, 4]");
    T_ERR(dpar_binary(y, a, a, DPAR_BINARY_COUNT), DPAR_ERR_INVALID_ARGUMENT, "dpar_binary_op");
    T_ERR(dpar_binary(i, a, a, DPAR_BINARY_ADD), DPAR_ERR_DTYPE, "dpar_binary", "i32");
    T_ERR(dpar_unary(t, a, DPAR_UNARY_EXP, 0), DPAR_ERR_SHAPE, "dpar_unary");
    T_ERR(dpar_unary(y, a, (dpar_unary_op)99, 0), DPAR_ERR_INVALID_ARGUMENT, "dpar_unary_op");
    int ax = 1, bad = 2, dup[2] = { 0, -2 };
    T_ERR(dpar_reduce(y, a, DPAR_REDUCE_SUM, &ax, 1), DPAR_ERR_SHAPE, "dpar_reduce", "[3] or [3, 1]");
    T_ERR(dpar_reduce(b, a, DPAR_REDUCE_SUM, &ax, 0), DPAR_ERR_SHAPE, "reducing no axis", "needs that shape");
    T_ERR(dpar_reduce(b, a, DPAR_REDUCE_SUM, &bad, 1), DPAR_ERR_INVALID_ARGUMENT, "axes[0] = 2");
    T_ERR(dpar_reduce(b, a, DPAR_REDUCE_SUM, dup, 2), DPAR_ERR_INVALID_ARGUMENT, "repeated");
    T_ERR(dpar_reduce(b, a, DPAR_REDUCE_ARGMAX, &ax, 1), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_reduce_backward(a, b, a, DPAR_REDUCE_ARGMAX, &ax, 1), DPAR_ERR_INVALID_ARGUMENT, "SUM, MEAN and MAX");
    T_ERR(dpar_reduce_backward(y, b, NULL, DPAR_REDUCE_MAX, &ax, 1), DPAR_ERR_INVALID_ARGUMENT, "needs the forward");
    int perm[2] = { 0, 0 };
    T_ERR(dpar_transpose(t, a, perm), DPAR_ERR_INVALID_ARGUMENT, "perm[1] = 0");
    T_ERR(dpar_transpose(y, a, NULL), DPAR_ERR_SHAPE, "dpar_transpose");
    T_ERR(dpar_transpose(t, i, NULL), DPAR_ERR_DTYPE, "dpar_transpose");
    int64_t st[2] = { 2, 0 };
    T_ERR(dpar_slice(t, a, st, NULL), DPAR_ERR_SHAPE, "axis 0", "do not fit");
    /* starts and steps near INT64_MAX: (n - 1) * step used to wrap to a small number and pass */
    int64_t z2[2] = { 0, 0 }, huge_step[2] = { INT64_MAX, 1 }, huge_start[2] = { 0, INT64_MAX };
    T_ERR(dpar_slice(y, a, z2, huge_step), DPAR_ERR_SHAPE, "axis 0", "do not fit");
    T_ERR(dpar_slice_backward(a, y, z2, huge_step), DPAR_ERR_SHAPE, "axis 0", "do not fit");
    T_ERR(dpar_slice(y, a, huge_start, NULL), DPAR_ERR_SHAPE, "axis 1", "do not fit");
    T_ERR(dpar_pad(y, a, huge_start, 0.0f), DPAR_ERR_SHAPE, "lo[1] = 9223372036854775807", "axis 1", "lo[1] = 0..0");
    const dpar_buffer *two[2] = { a, t };
    T_ERR(dpar_concat(y, two, 2, 0), DPAR_ERR_SHAPE, "input 1 is [4, 3]", "y is [3, 4]");
    T_ERR(dpar_softmax(t, a, false), DPAR_ERR_SHAPE, "dpar_softmax");
    T_ERR(dpar_where(y6, c6, c6b, NULL, 0, 0), DPAR_ERR_SHAPE, "dpar_where", "at most 4");
    T_OK(dpar_binary(y6, c6, c6b, DPAR_BINARY_MUL)); /* 6 merged dims: the core loops over the outer two */
    float v6[64];
    for (int k = 0; k < 8; k++) v6[k] = (float)k;
    put(c6, v6);
    put(c6b, v6);
    T_OK(dpar_binary(y6, c6, c6b, DPAR_BINARY_ADD));
    get(y6, v6);
    assert_true(v6[0] == 0.0f && v6[63] == 14.0f && v6[21] == 1.0f + 6.0f); /* [1,0,1,0,1,0] -> a 5, b 2 */
    dpar_buffer *all[8] = { a, b, y, t, i, c6, c6b, y6 };
    for (int k = 0; k < 8; k++) dpar_buffer_destroy(all[k]);
}

/* ---- every backend against the CPU reference ------------------------------------------ */
/* Runs a fixed program of every op on rt and appends each result to out (floats). */
static int64_t run_program(dpar_runtime *rt, float *out) {
    int64_t at = 0;
    uint32_t keep = g_seed;
    g_seed = 777u;
#define OUT(buf)                      \
    do {                              \
        get(buf, out + at);           \
        at += dpar_buffer_count(buf); \
    } while (0)
    int64_t sx[3] = { 3, 5, 67 }, sb[2] = { 1, 67 }, sr[2] = { 3, 67 }, s1[3] = { 3, 1, 67 };
    dpar_buffer *x = mk(rt, DPAR_F32, 3, sx), *y = mk(rt, DPAR_F32, 3, sx), *dy = mk(rt, DPAR_F32, 3, sx);
    dpar_buffer *xp = mk(rt, DPAR_F32, 3, sx), *b = mk(rt, DPAR_F32, 2, sb), *db = mk(rt, DPAR_F32, 2, sb);
    dpar_buffer *r = mk(rt, DPAR_F32, 2, sr), *ri = mk(rt, DPAR_I32, 2, sr), *c = mk(rt, DPAR_F32, 3, s1);
    float v[3 * 5 * 67];
    fill_rnd(v, 3 * 5 * 67, -3, 3);
    put(x, v);
    fill_rnd(v, 3 * 5 * 67, 0.2f, 3);
    put(xp, v);
    fill_rnd(v, 3 * 5 * 67, -1, 1);
    put(dy, v);
    fill_rnd(v, 67, 0.5f, 2);
    put(b, v);
    fill_rnd(v, 3 * 67, -1, 1);
    put(c, v);
    for (int u = 0; u < DPAR_UNARY_COUNT; u++) {
        float lo, hi;
        unary_domain((dpar_unary_op)u, &lo, &hi);
        const dpar_buffer *in = lo > 0 ? xp : x;
        T_OK(dpar_unary(y, in, (dpar_unary_op)u, 1.5f));
        OUT(y);
        T_OK(dpar_unary_backward(y, dy, in, (dpar_unary_op)u, 1.5f));
        OUT(y);
    }
    /* integer exponents of negative x: C's pow, (-1)^s |x|^s (GLSL's pow is undefined there) */
    static const float pexp[3] = { 3.0f, 2.0f, -1.0f };
    for (int k = 0; k < 3; k++) {
        T_OK(dpar_unary(y, x, DPAR_UNARY_POW_SCALAR, pexp[k]));
        OUT(y);
        T_OK(dpar_unary_backward(y, dy, x, DPAR_UNARY_POW_SCALAR, pexp[k]));
        OUT(y);
    }
    for (int o = 0; o < DPAR_BINARY_COUNT; o++) {
        T_OK(dpar_binary(y, x, b, (dpar_binary_op)o));
        OUT(y);
        T_OK(dpar_binary_backward(y, db, dy, x, b, (dpar_binary_op)o));
        OUT(y);
        OUT(db);
    }
    int ax = 1;
    for (int k = 0; k < DPAR_REDUCE_KIND_COUNT; k++) {
        T_OK(dpar_reduce(k == DPAR_REDUCE_ARGMAX ? ri : r, x, (dpar_reduce_kind)k, &ax, 1));
        if (k == DPAR_REDUCE_ARGMAX) {
            int32_t iv[3 * 67];
            get(ri, iv);
            for (int i = 0; i < 3 * 67; i++) out[at++] = (float)iv[i];
        } else {
            OUT(r);
        }
    }
    T_OK(dpar_reduce_backward(y, r, NULL, DPAR_REDUCE_MEAN, &ax, 1));
    OUT(y);
    T_OK(dpar_reduce_backward(y, r, x, DPAR_REDUCE_MAX, &ax, 1));
    OUT(y);
    for (int lg = 0; lg < 2; lg++) {
        T_OK(dpar_softmax(y, x, lg));
        OUT(y);
        T_OK(dpar_softmax_backward(xp, dy, y, lg));
        OUT(xp);
    }
    T_OK(dpar_where(y, c, x, b, 0, 0));
    OUT(y);
    T_OK(dpar_where(y, c, NULL, x, 2.5f, 0));
    OUT(y);
    int perm[3] = { 2, 0, 1 };
    int64_t st[3] = { 67, 3, 5 }, ss[3] = { 2, 2, 33 }, s0[3] = { 1, 1, 1 }, s2[3] = { 1, 2, 2 }, pp[3] = { 5, 8, 70 };
    int64_t lo[3] = { 1, 2, 3 };
    dpar_buffer *t = mk(rt, DPAR_F32, 3, st), *sl = mk(rt, DPAR_F32, 3, ss), *pd = mk(rt, DPAR_F32, 3, pp);
    T_OK(dpar_transpose(t, x, perm));
    OUT(t);
    T_OK(dpar_slice(sl, x, s0, s2));
    OUT(sl);
    T_OK(dpar_slice_backward(y, sl, s0, s2));
    OUT(y);
    T_OK(dpar_pad(pd, x, lo, -1.0f));
    OUT(pd);
    T_OK(dpar_broadcast_to(y, b));
    OUT(y);
    int64_t cs[3] = { 3, 10, 67 };
    dpar_buffer *cc = mk(rt, DPAR_F32, 3, cs);
    const dpar_buffer *two[2] = { x, y };
    T_OK(dpar_concat(cc, two, 2, 1));
    OUT(cc);
    /* along axis 0 each part is one contiguous run at an offset (on Vulkan a buffer copy, not a shader) */
    int64_t cs0[3] = { 6, 5, 67 }, s1r[3] = { 1, 0, 0 };
    dpar_buffer *cc0 = mk(rt, DPAR_F32, 3, cs0), *sr0 = mk(rt, DPAR_F32, 3, (int64_t[3]){ 2, 5, 67 });
    T_OK(dpar_concat(cc0, two, 2, 0));
    OUT(cc0);
    T_OK(dpar_slice(sr0, x, s1r, NULL)); /* rows 1..2: one run from an offset */
    OUT(sr0);
    dpar_buffer_destroy(cc0);
    dpar_buffer_destroy(sr0);
    /* 6 dims that do not merge: the core issues the op once per outer index (offsets p[12..14]) */
    int64_t s6a[6] = { 2, 1, 3, 1, 2, 5 }, s6b[6] = { 1, 4, 1, 2, 1, 5 }, s6y[6] = { 2, 4, 3, 2, 2, 5 };
    int64_t s2d[3] = { 4, 2, 5 };
    dpar_buffer *a6 = mk(rt, DPAR_F32, 6, s6a), *b6 = mk(rt, DPAR_F32, 6, s6b), *y6 = mk(rt, DPAR_F32, 6, s6y);
    dpar_buffer *r6 = mk(rt, DPAR_F32, 3, s2d);
    fill_rnd(v, 60, -2, 2);
    put(a6, v);
    put(b6, v + 20);
    T_OK(dpar_binary(y6, a6, b6, DPAR_BINARY_SUB));
    OUT(y6);
    int ax6[3] = { 0, 2, -3 };
    T_OK(dpar_reduce(r6, y6, DPAR_REDUCE_SUM, ax6, 3));
    OUT(r6);
    /* few outputs of many elements: the CUDA backend sums them in tiles of 32 outputs over chunks of the rows
       (600 rows: 3 chunks; 40 columns: a ragged second tile), the mean of all 24,000 in 94 chunks; the binary
       gradients of a broadcast row cover the other sum kinds (-dy, dy b, dy a, dy / b, -dy a / b^2) */
    int64_t sg[2] = { 600, 40 }, sgr[2] = { 1, 40 }, sg1[2] = { 1, 1 };
    dpar_buffer *gx = mk(rt, DPAR_F32, 2, sg), *gdy = mk(rt, DPAR_F32, 2, sg), *gd = mk(rt, DPAR_F32, 2, sg);
    dpar_buffer *gb = mk(rt, DPAR_F32, 2, sgr), *gdb = mk(rt, DPAR_F32, 2, sgr), *g1 = mk(rt, DPAR_F32, 2, sg1);
    float *gv = (float *)malloc(600 * 40 * sizeof(float));
    fill_rnd(gv, 600 * 40, 0.5f, 2);
    put(gx, gv);
    fill_rnd(gv, 600 * 40, -1, 1);
    put(gdy, gv);
    fill_rnd(gv, 40, 0.5f, 2);
    put(gb, gv);
    free(gv);
    int gax[2] = { 0, 1 };
    for (int k = 0; k < 2; k++) {
        T_OK(dpar_reduce(gdb, gx, (dpar_reduce_kind)k, gax, 1));
        OUT(gdb);
    }
    T_OK(dpar_reduce(g1, gdy, DPAR_REDUCE_MEAN, gax, 2));
    OUT(g1);
    for (int o = 0; o < DPAR_BINARY_COUNT; o++) {
        T_OK(dpar_binary_backward(gd, gdb, gdy, gx, gb, (dpar_binary_op)o)); /* db: -dy, dy a, -dy a / b^2 */
        OUT(gdb);
        T_OK(dpar_binary_backward(gdb, gd, gdy, gb, gx, (dpar_binary_op)o)); /* da: dy b, dy / b */
        OUT(gdb);
    }
    dpar_buffer *gall[6] = { gx, gdy, gd, gb, gdb, g1 };
    for (int i = 0; i < 6; i++) dpar_buffer_destroy(gall[i]);
#undef OUT
    dpar_buffer *all[17] = { x, y, dy, xp, b, db, r, ri, c, t, sl, pd, cc, a6, b6, y6, r6 };
    for (int i = 0; i < 17; i++) dpar_buffer_destroy(all[i]);
    g_seed = keep;
    return at;
}
enum { PROG_MAX = 200000 };
static void parity(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    float *want = (float *)malloc(PROG_MAX * sizeof(float)), *got = (float *)malloc(PROG_MAX * sizeof(float));
    int64_t n = run_program(g_rt, want), m = run_program(rt, got);
    assert_int_equal(n, m);
    assert_true(n < PROG_MAX);
    for (int64_t i = 0; i < n; i++)
        CHECK_CLOSE(got[i], want[i], 2e-5, 2e-5, "%s: result %lld of the program:", dpar_backend_name(k), (long long)i);
    printf("%s: %lld results within 2e-5 of the cpu backend\n", dpar_backend_name(k), (long long)n);
    free(want);
    free(got);
    dpar_runtime_destroy(rt);
}
static void test_parity_vulkan(void **state) {
    (void)state;
    parity(DPAR_BACKEND_VULKAN);
}
static void test_parity_cuda(void **state) {
    (void)state;
    parity(DPAR_BACKEND_CUDA);
}

/* ---- graph nodes: loss = dot(op(inputs), W), gradients against central differences ---------------- */
typedef struct gcase {
    const char *name;
    int nin; /* f32 inputs, differentiated; cond (i32) of WHERE comes extra */
    int nd[3];
    int64_t sh[3][4];
    int op; /* the case's dpar_*_op / kind / flag */
} gcase;
enum { GC_UNARY, GC_BINARY, GC_WHERE, GC_REDUCE, GC_SOFTMAX, GC_TRANSPOSE, GC_BCAST, GC_SLICE, GC_PAD, GC_CONCAT };
static const int32_t g_cond[3] = { 1, 0, 1 };
static const int g_rax[3][2] = { { 1, 0 }, { 0, 2 }, { -1, 0 } }; /* reduce axes of op 0 (sum), 1 (mean), 2 (max) */
static const int g_perm[3] = { 2, 0, 1 };
static const int64_t g_start[2] = { 1, 0 }, g_step[2] = { 2, 1 }, g_sizes[2] = { 2, 3 }, g_lo[2] = { 1, 0 },
                     g_hi[2] = { 0, 2 }, g_b3[2] = { 2, 3 };
/* the graph of case kind k (op: c->op); x: the inputs */
static dpar_value g_build(dpar_graph *g, int k, const gcase *c, const dpar_value *x, dpar_value cond) {
    switch (k) {
    case GC_UNARY: return dpar_g_unary(g, x[0], (dpar_unary_op)c->op, 1.5f);
    case GC_BINARY: return dpar_g_binary(g, x[0], x[1], (dpar_binary_op)c->op);
    case GC_WHERE: return dpar_g_where(g, cond, x[0], x[1]);
    case GC_REDUCE:
        return dpar_g_reduce(g, x[0], (dpar_reduce_kind)c->op, g_rax[c->op], c->op == 1 ? 2 : 1, c->op == 1);
    case GC_SOFTMAX: return dpar_g_softmax(g, x[0], c->op);
    case GC_TRANSPOSE: return dpar_g_transpose(g, x[0], g_perm);
    case GC_BCAST: return dpar_g_broadcast_to(g, x[0], 2, g_b3);
    case GC_SLICE: return dpar_g_slice(g, x[0], g_start, g_step, g_sizes);
    case GC_PAD: return dpar_g_pad(g, x[0], g_lo, g_hi, -1.0f);
    default: return dpar_g_concat(g, x, 2, 1);
    }
}
/* out in double, row-major (the same as the graph's), its element count into *n */
static void g_ref(int k, const gcase *c, double *const *x, double *out, int64_t *n) {
    const int64_t *s0 = c->sh[0], *s1 = c->sh[1];
    int64_t n0 = cnt(c->nd[0], s0);
    switch (k) {
    case GC_UNARY:
        for (int64_t i = 0; i < n0; i++) out[i] = ref_unary((dpar_unary_op)c->op, x[0][i], 1.5);
        *n = n0;
        return;
    case GC_BINARY:
    case GC_WHERE: { /* shapes [3,1,4] op [2,1] -> [3,2,4]; where: cond [3,1], a [3,4], b [4] -> [3,4] */
        int64_t ys[3] = { 3, 2, 4 }, yw[2] = { 3, 4 }, cs[2] = { 3, 1 };
        int ynd = k == GC_BINARY ? 3 : 2;
        const int64_t *yy = k == GC_BINARY ? ys : yw;
        *n = cnt(ynd, yy);
        for (int64_t i = 0; i < *n; i++) {
            double a = x[0][bidx(ynd, yy, c->nd[0], s0, i)], b = x[1][bidx(ynd, yy, c->nd[1], s1, i)];
            out[i] = k == GC_BINARY ? ref_binary((dpar_binary_op)c->op, a, b) : (g_cond[bidx(2, yw, 2, cs, i)] ? a : b);
        }
        return;
    }
    case GC_REDUCE: { /* x [2,3,4]: sum axis 1 -> [2,4]; mean axes 0,2 keepdims -> [1,3,1]; max axis -1 -> [2,3] */
        int64_t cnt3[3] = { 8, 3, 6 };
        *n = cnt3[c->op];
        for (int64_t j = 0; j < *n; j++) out[j] = c->op == 2 ? -INFINITY : 0.0;
        for (int64_t i = 0; i < 24; i++) {
            int64_t a0 = i / 12, a1 = i / 4 % 3, a2 = i % 4;
            int64_t j = c->op == 0 ? a0 * 4 + a2 : c->op == 1 ? a1 : a0 * 3 + a1;
            out[j] = c->op == 2 ? fmax(out[j], x[0][i]) : out[j] + x[0][i] / (c->op == 1 ? 8.0 : 1.0);
        }
        return;
    }
    case GC_SOFTMAX: { /* [3,5] */
        for (int r = 0; r < 3; r++) {
            double mx = -INFINITY, se = 0;
            for (int j = 0; j < 5; j++) mx = fmax(mx, x[0][r * 5 + j]);
            for (int j = 0; j < 5; j++) se += exp(x[0][r * 5 + j] - mx);
            for (int j = 0; j < 5; j++)
                out[r * 5 + j] = c->op ? x[0][r * 5 + j] - mx - log(se) : exp(x[0][r * 5 + j] - mx) / se;
        }
        *n = 15;
        return;
    }
    case GC_TRANSPOSE: /* [2,3,4] -> [4,2,3] */
        for (int64_t i = 0; i < 24; i++) out[(i % 4) * 6 + (i / 12) * 3 + (i / 4 % 3)] = x[0][i];
        *n = 24;
        return;
    case GC_BCAST: /* [3] -> [2,3] */
        for (int64_t i = 0; i < 6; i++) out[i] = x[0][i % 3];
        *n = 6;
        return;
    case GC_SLICE: /* [5,4][1::2, 0:3] */
        for (int64_t i = 0; i < 6; i++) out[i] = x[0][(1 + 2 * (i / 3)) * 4 + i % 3];
        *n = 6;
        return;
    case GC_PAD: /* [2,3] -> [3,5], x at [1:3, 0:3] */
        for (int64_t i = 0; i < 15; i++) {
            int64_t r = i / 5, q = i % 5;
            out[i] = r >= 1 && q < 3 ? x[0][(r - 1) * 3 + q] : -1.0;
        }
        *n = 15;
        return;
    default: /* [2,3] ++ [2,1] along 1 */
        for (int64_t i = 0; i < 8; i++) out[i] = i % 4 < 3 ? x[0][(i / 4) * 3 + i % 4] : x[1][i / 4];
        *n = 8;
        return;
    }
}
static const struct {
    int kind;
    gcase c;
} g_cases[] = {
    { GC_BINARY, { "binary add", 2, { 3, 2 }, { { 3, 1, 4 }, { 2, 1 } }, DPAR_BINARY_ADD } },
    { GC_BINARY, { "binary sub", 2, { 3, 2 }, { { 3, 1, 4 }, { 2, 1 } }, DPAR_BINARY_SUB } },
    { GC_BINARY, { "binary mul", 2, { 3, 2 }, { { 3, 1, 4 }, { 2, 1 } }, DPAR_BINARY_MUL } },
    { GC_BINARY, { "binary div", 2, { 3, 2 }, { { 3, 1, 4 }, { 2, 1 } }, DPAR_BINARY_DIV } },
    { GC_WHERE, { "where", 2, { 2, 1 }, { { 3, 4 }, { 4 } }, 0 } },
    { GC_REDUCE, { "reduce sum axis 1", 1, { 3 }, { { 2, 3, 4 } }, DPAR_REDUCE_SUM } },
    { GC_REDUCE, { "reduce mean axes 0,2 keepdims", 1, { 3 }, { { 2, 3, 4 } }, DPAR_REDUCE_MEAN } },
    { GC_REDUCE, { "reduce max axis -1", 1, { 3 }, { { 2, 3, 4 } }, DPAR_REDUCE_MAX } },
    { GC_SOFTMAX, { "softmax", 1, { 2 }, { { 3, 5 } }, 0 } },
    { GC_SOFTMAX, { "log_softmax", 1, { 2 }, { { 3, 5 } }, 1 } },
    { GC_TRANSPOSE, { "transpose", 1, { 3 }, { { 2, 3, 4 } }, 0 } },
    { GC_BCAST, { "broadcast_to", 1, { 1 }, { { 3 } }, 0 } },
    { GC_SLICE, { "slice", 1, { 2 }, { { 5, 4 } }, 0 } },
    { GC_PAD, { "pad", 1, { 2 }, { { 2, 3 } }, 0 } },
    { GC_CONCAT, { "concat", 2, { 2, 2 }, { { 2, 3 }, { 2, 1 } }, 0 } },
};
static double g_loss_ref(int k, const gcase *c, double *const *x, const float *w) {
    double out[64], s = 0;
    int64_t n;
    g_ref(k, c, x, out, &n);
    for (int64_t i = 0; i < n; i++) s += out[i] * (double)w[i];
    return s;
}
/* Builds, differentiates and runs one case on backend bk; checks the loss and every gradient. */
static void g_run(dpar_backend_kind bk, int k, const gcase *c) {
    dpar_runtime *rt = t_runtime_or_skip(bk, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_value x[3], gr[3], cond = { 0 }, w;
    double *xd[3];
    float xf[3][64], wv[64];
    dpar_graph_feed f[5];
    int nf = c->nin;
    memset(f, 0, sizeof f);
    for (int i = 0; i < c->nin; i++) {
        dpar_array_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DPAR_F32, d.ndim = c->nd[i];
        for (int q = 0; q < d.ndim; q++) d.shape[q] = c->sh[i][q];
        x[i] = dpar_g_feed(g, "x", &d);
        xd[i] = (double *)malloc(64 * sizeof(double));
        int64_t n = cnt(c->nd[i], c->sh[i]);
        fill_rnd(xf[i], n, 0.5f, 2.0f);
        if (k != GC_BINARY || c->op != DPAR_BINARY_DIV || i == 0) fill_rnd(xf[i], n, -2.0f, 2.0f);
        for (int64_t q = 0; q < n; q++) xd[i][q] = xf[i][q];
        f[i].value = x[i], f[i].host = xf[i];
    }
    if (k == GC_WHERE) {
        dpar_array_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DPAR_I32, d.ndim = 2, d.shape[0] = 3, d.shape[1] = 1;
        cond = dpar_g_feed(g, "cond", &d);
        f[nf].value = cond, f[nf++].host = g_cond;
    }
    dpar_value out = g_build(g, k, c, x, cond);
    T_OK(dpar_graph_status(g));
    dpar_array_desc wd;
    memset(&wd, 0, sizeof wd);
    wd.dtype = DPAR_F32;
    T_OK(dpar_graph_value_shape(g, out, NULL, &wd.ndim, wd.shape));
    w = dpar_g_feed(g, "w", &wd);
    fill_rnd(wv, cnt(wd.ndim, wd.shape), -1, 1);
    f[nf].value = w, f[nf++].host = wv;
    dpar_value loss = dpar_g_dot(g, out, w);
    T_OK(dpar_graph_value_and_grad(g, loss, x, c->nin, gr));
    float lossv = 0;
    T_OK(dpar_graph_run(g, f, nf, &lossv));
    double want = g_loss_ref(k, c, xd, wv);
    if (fabs(lossv - want) > 1e-5 * fmax(1.0, fabs(want)))
        fail_msg("%s (%s): loss %.9g, reference %.9g", c->name, dpar_backend_name(bk), (double)lossv, want);
    for (int i = 0; i < c->nin; i++) {
        float an[64];
        T_OK(dpar_graph_get(g, gr[i], an));
        for (int64_t q = 0; q < cnt(c->nd[i], c->sh[i]); q++) {
            double h = 1e-5, keep = xd[i][q];
            xd[i][q] = keep + h;
            double lp = g_loss_ref(k, c, xd, wv);
            xd[i][q] = keep - h;
            double lm = g_loss_ref(k, c, xd, wv);
            xd[i][q] = keep;
            double fd = (lp - lm) / (2 * h);
            if (fabs(an[q] - fd) > 1e-4 * fmax(fabs(fd), 1e-1))
                fail_msg("%s (%s): d loss / d input %d [%lld]: graph %.7g, finite differences %.7g", c->name,
                         dpar_backend_name(bk), i, (long long)q, (double)an[q], fd);
        }
    }
    for (int i = 0; i < c->nin; i++) free(xd[i]);
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}
static void g_all(dpar_backend_kind bk) {
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++) g_run(bk, g_cases[i].kind, &g_cases[i].c);
    for (int u = 0; u < DPAR_UNARY_COUNT; u++) {
        gcase c = { "unary", 1, { 2 }, { { 3, 4 } }, u };
        float lo, hi;
        unary_domain((dpar_unary_op)u, &lo, &hi);
        if (lo > 0) continue; /* positive-domain ops: the FD inputs of g_run span [-2, 2]; checked eagerly above */
        g_run(bk, GC_UNARY, &c);
    }
}
static void test_graph_grads(void **state) {
    (void)state;
    g_all(DPAR_BACKEND_CPU);
}
static void test_graph_grads_vulkan(void **state) {
    (void)state;
    g_all(DPAR_BACKEND_VULKAN);
}
static void test_graph_errors(void **state) {
    (void)state;
    dpar_mesh *m = t_mesh1(g_rt, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DPAR_F32, d.ndim = 2, d.shape[0] = 3, d.shape[1] = 4;
    dpar_value a = dpar_g_feed(g, "a", &d);
    d.shape[0] = 3, d.shape[1] = 2;
    dpar_value b = dpar_g_feed(g, "b", &d);
    dpar_value r = dpar_g_binary(g, a, b, DPAR_BINARY_ADD);
    assert_int_equal(r.id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "dpar_g_binary", "'a'", "[3, 4]", "'b'", "[3, 2]");
    T_OK(dpar_graph_destroy(g));
    /* slice steps and pads near INT64_MAX are refused, not wrapped into a small or negative size */
    const int64_t z2[2] = { 0, 0 }, huge_step[2] = { INT64_MAX, 1 }, sizes[2] = { 3, 4 };
    const int64_t huge_pad[2] = { 0, INT64_MAX }, pad_lo[2] = { 1, 0 };
    for (int c = 0; c < 3; c++) {
        T_OK(dpar_graph_create(m, &g));
        d.shape[0] = 3, d.shape[1] = 4;
        a = dpar_g_feed(g, "a", &d);
        if (c == 0) r = dpar_g_slice(g, a, z2, huge_step, sizes);
        if (c == 1) r = dpar_g_pad(g, a, z2, huge_pad, 0.0f);
        if (c == 2) r = dpar_g_pad(g, a, huge_pad, pad_lo, 0.0f);
        assert_int_equal(r.id, 0);
        if (c == 0) T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "dpar_g_slice", "axis 0", "do not fit");
        if (c > 0) T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "dpar_g_pad", "axis 1", "0..2^40");
        T_OK(dpar_graph_destroy(g));
    }
    T_OK(dpar_mesh_destroy(m));
}

/* ---- the CPU backend's intra-op threads split large ops without changing a bit ---- */
static void threads_program(dpar_runtime *rt, float *out) {
    int64_t s1[1] = { 1 << 16 }, s2[2] = { 256, 256 }, r0[1] = { 256 };
    dpar_buffer *x = mk(rt, DPAR_F32, 1, s1), *y = mk(rt, DPAR_F32, 1, s1), *m = mk(rt, DPAR_F32, 2, s2);
    dpar_buffer *sm = mk(rt, DPAR_F32, 2, s2), *r = mk(rt, DPAR_F32, 1, r0);
    float *v = (float *)malloc(sizeof(float) * ((1 << 16) + 8)); /* 8 more: b and dy start at v + 7, v + 3 */
    uint32_t keep = g_seed;
    g_seed = 99u;
    fill_rnd(v, (1 << 16) + 8, -3, 3);
    put(x, v);
    put(m, v);
    T_OK(dpar_unary(y, x, DPAR_UNARY_GELU_ERF, 0));
    get(y, out);
    T_OK(dpar_unary_backward(y, x, x, DPAR_UNARY_TANH, 0));
    get(y, out + (1 << 16));
    T_OK(dpar_softmax(sm, m, false));
    get(sm, out + (2 << 16));
    for (int ax = 0; ax < 2; ax++) {
        T_OK(dpar_reduce(r, m, DPAR_REDUCE_SUM, &ax, 1));
        get(r, out + (3 << 16) + ax * 256);
    }
    /* the exp-based unaries in blocks, and binary_backward's carried coordinates from a split's first
       output: a [64,4,256] times b [64,1,256] (db sums over the middle axis, two kept axes around it) */
    int64_t sa[3] = { 64, 4, 256 }, sb[3] = { 64, 1, 256 };
    dpar_buffer *a = mk(rt, DPAR_F32, 3, sa), *b = mk(rt, DPAR_F32, 3, sb), *da = mk(rt, DPAR_F32, 3, sa);
    dpar_buffer *db = mk(rt, DPAR_F32, 3, sb), *dy = mk(rt, DPAR_F32, 3, sa);
    put(a, v);
    put(b, v + 7);
    put(dy, v + 3);
    T_OK(dpar_unary(y, x, DPAR_UNARY_GELU_TANH, 0));
    get(y, out + (3 << 16) + 512);
    T_OK(dpar_unary_backward(y, x, x, DPAR_UNARY_SILU, 0));
    get(y, out + (4 << 16) + 512);
    T_OK(dpar_binary_backward(da, db, dy, a, b, DPAR_BINARY_MUL));
    get(da, out + (5 << 16) + 512);
    get(db, out + (6 << 16) + 512);
    g_seed = keep;
    free(v);
    dpar_buffer *all[10] = { x, y, m, sm, r, a, b, da, db, dy };
    for (int i = 0; i < 10; i++) dpar_buffer_destroy(all[i]);
}
static void test_threads_bitwise(void **state) {
    (void)state;
    enum { N = (6 << 16) + 512 + (64 * 256) };
    float *a = (float *)malloc(N * sizeof(float)), *b = (float *)malloc(N * sizeof(float));
    dpar_runtime *r1 = t_cpu_runtime_threads("1"), *r3 = t_cpu_runtime_threads("3");
    threads_program(r1, a);
    threads_program(r3, b);
    assert_memory_equal(a, b, N * sizeof(float));
    dpar_runtime_destroy(r1);
    dpar_runtime_destroy(r3);
    free(a);
    free(b);
}

/* The exp-based unaries' gradient dy f'(x) with both dy and x NaN keeps f'(x)'s NaN, whose payload is x's,
   wherever the element falls: in the vector lanes or the scalar tail of a thread's range. The lanes
   used to keep dy's, so the bits changed with the thread count. 5,003 elements: 1 and 3 threads split
   them at different places. */
static void test_exp_grad_nan_threads(void **state) {
    (void)state;
    enum { N = 5003 };
    static const dpar_unary_op kinds[4] = { DPAR_UNARY_EXP, DPAR_UNARY_SIGMOID, DPAR_UNARY_SILU, DPAR_UNARY_GELU_TANH };
    uint32_t *x = (uint32_t *)malloc(N * 4), *dy = (uint32_t *)malloc(N * 4), *out[2];
    for (int i = 0; i < N; i++) {
        x[i] = 0x7fc00000u | (uint32_t)(i * 977 % 0x3fffff + 1);            /* quiet NaNs, payloads 1.. */
        dy[i] = (i % 2 ? 0xffa00000u : 0x7fd00000u) | (uint32_t)(i % 4093); /* NaNs of other payloads */
    }
    int64_t sh[1] = { N };
    const char *threads[2] = { "1", "3" };
    for (int k = 0; k < 4; k++) {
        for (int t = 0; t < 2; t++) {
            dpar_runtime *rt = t_cpu_runtime_threads(threads[t]);
            dpar_buffer *bx = mk(rt, DPAR_F32, 1, sh), *bdy = mk(rt, DPAR_F32, 1, sh), *by = mk(rt, DPAR_F32, 1, sh);
            put(bx, x);
            put(bdy, dy);
            T_OK(dpar_unary_backward(by, bdy, bx, kinds[k], 0));
            out[t] = (uint32_t *)malloc(N * 4);
            get(by, out[t]);
            dpar_buffer_destroy(bx), dpar_buffer_destroy(bdy), dpar_buffer_destroy(by);
            dpar_runtime_destroy(rt);
        }
        for (int i = 0; i < N; i++)
            if ((out[0][i] & 0x7fffffu) != (x[i] & 0x7fffffu) || out[0][i] != out[1][i])
                fail_msg("kind %d, element %d: %08x (1 thread), %08x (3 threads); want x's payload %06x", (int)kinds[k],
                         i, out[0][i], out[1][i], x[i] & 0x7fffffu);
        free(out[0]), free(out[1]);
    }
    free(x);
    free(dy);
}

/* A broadcast operand's gradient sums dy over the rows: of two NaNs a sum keeps the first it met, on the
   vector lanes and the scalar columns alike, so the bits do not depend on where a thread's range of columns
   starts (at e3cb6db 1, 2, 3 and 7 threads gave four results). db of a + b and a * b, b [1000] against
   [300, 1000], quiet NaNs of their own payloads in dy. */
static void test_reduce_nan_threads(void **state) {
    (void)state;
    enum { R = 300, C = 1000 };
    uint32_t *dy = (uint32_t *)malloc(R * C * 4), *av = (uint32_t *)malloc(R * C * 4), bv[C], *out[2][2];
    for (int i = 0; i < R * C; i++) {
        float f = (float)(i % 97) * 0.25f - 3.0f, g = (float)(i % 89) * 0.125f + 0.5f;
        memcpy(&dy[i], &f, 4);
        memcpy(&av[i], &g, 4);
        if (i % 53 == 7) dy[i] = 0x7fc00000u | (uint32_t)(i % 0x3fffff + 1);
    }
    for (int c = 0; c < C; c++) {
        float g = 1.0f + (float)(c % 7);
        memcpy(&bv[c], &g, 4);
    }
    int64_t sa[2] = { R, C }, sb[1] = { C };
    const char *threads[2] = { "1", "3" };
    const dpar_binary_op ops[2] = { DPAR_BINARY_ADD, DPAR_BINARY_MUL };
    for (int t = 0; t < 2; t++) {
        dpar_runtime *rt = t_cpu_runtime_threads(threads[t]);
        dpar_buffer *a = mk(rt, DPAR_F32, 2, sa), *b = mk(rt, DPAR_F32, 1, sb), *g = mk(rt, DPAR_F32, 2, sa);
        dpar_buffer *da = mk(rt, DPAR_F32, 2, sa), *db = mk(rt, DPAR_F32, 1, sb);
        put(a, av), put(b, bv), put(g, dy);
        for (int k = 0; k < 2; k++) {
            T_OK(dpar_binary_backward(da, db, g, a, b, ops[k]));
            out[t][k] = (uint32_t *)malloc(C * 4);
            get(db, out[t][k]);
        }
        dpar_buffer *all[5] = { a, b, g, da, db };
        for (int i = 0; i < 5; i++) dpar_buffer_destroy(all[i]);
        dpar_runtime_destroy(rt);
    }
    for (int c = 0; c < C; c++) {
        uint32_t first = 0;
        for (int r = 0; r < R && !first; r++)
            if ((dy[r * C + c] & 0x7fc00000u) == 0x7fc00000u) first = dy[r * C + c];
        for (int k = 0; k < 2; k++)
            if (out[0][k][c] != out[1][k][c] || (first && out[0][k][c] != first))
                fail_msg("op %d, db[%d]: %08x (1 thread), %08x (3 threads); want the first NaN's %08x", k, c,
                         out[0][k][c], out[1][k][c], first);
    }
    for (int t = 0; t < 2; t++) free(out[t][0]), free(out[t][1]);
    free(dy), free(av);
}

/* Sum, mean, max and argmax over the last dim of [1003, 67] bit for bit against the loops written here:
   acc = 0 + each element in order in double, keeping the first NaN; the first maximum, NaN beating numbers
   (ties: one element in 5 is 0.5; quiet NaNs of their own payloads, one in 11 of every 4th row; -0). 1 and
   3 threads: the rows go 8 at a time in vector lanes wherever a thread's range starts, the rest one by one. */
static void test_reduce_rows_bits(void **state) {
    (void)state;
    enum { N = 1003, C = 67 };
    float *x = (float *)malloc(N * C * sizeof(float)), *got = (float *)malloc(N * sizeof(float));
    uint32_t s = 12345u;
    for (int i = 0; i < N * C; i++) {
        s = s * 1664525u + 1013904223u;
        uint32_t u = 0x7fc00000u | (s >> 9 & 0x3fffffu);
        x[i] = (float)(int)(s >> 16 & 0xff) * 0.125f - 16.0f;
        if (s % 11 == 3 && i / C % 4 == 0) memcpy(&x[i], &u, 4); /* NaNs in one row in 4: ties matter elsewhere */
        if (s % 5 == 1) x[i] = 0.5f;
        if (s % 37 == 2) x[i] = -0.0f;
    }
    int64_t xs[2] = { N, C }, ys[1] = { N };
    const int axis = -1;
    const char *threads[2] = { "1", "3" };
    for (int t = 0; t < 2; t++) {
        dpar_runtime *rt = t_cpu_runtime_threads(threads[t]);
        dpar_buffer *xb = mk(rt, DPAR_F32, 2, xs), *yb = mk(rt, DPAR_F32, 1, ys), *ib = mk(rt, DPAR_I32, 1, ys);
        put(xb, x);
        for (int k = DPAR_REDUCE_SUM; k <= DPAR_REDUCE_ARGMAX; k++) {
            T_OK(dpar_reduce(k == DPAR_REDUCE_ARGMAX ? ib : yb, xb, (dpar_reduce_kind)k, &axis, 1));
            get(k == DPAR_REDUCE_ARGMAX ? ib : yb, got);
            for (int r = 0; r < N; r++) {
                const float *row = x + (size_t)r * C;
                double acc = 0.0;
                int arg = 0;
                for (int c = 0; c < C; c++) {
                    acc = acc != acc ? acc : acc + (double)row[c];
                    if (c && (row[c] > row[arg] || (row[c] != row[c] && row[arg] == row[arg]))) arg = c;
                }
                float w = k == DPAR_REDUCE_SUM ? (float)acc : k == DPAR_REDUCE_MEAN ? (float)(acc / C) : row[arg];
                uint32_t gu, wu;
                memcpy(&gu, &got[r], 4);
                memcpy(&wu, &w, 4);
                if (k == DPAR_REDUCE_ARGMAX) wu = (uint32_t)arg;
                if (gu != wu) fail_msg("kind %d, %s threads, row %d: got %08x, want %08x", k, threads[t], r, gu, wu);
            }
        }
        dpar_buffer_destroy(xb), dpar_buffer_destroy(yb), dpar_buffer_destroy(ib);
        dpar_runtime_destroy(rt);
    }
    free(x), free(got);
}

static int setup(void **state) {
    (void)state;
    g_rt = t_runtime(DPAR_BACKEND_CPU, 1);
    return 0;
}
static int teardown(void **state) {
    (void)state;
    dpar_runtime_destroy(g_rt);
    return 0;
}
int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_overflow),
        cmocka_unit_test(test_log_softmax_masked),
        cmocka_unit_test(test_unary_exact),
        cmocka_unit_test(test_unary_grad),
        cmocka_unit_test(test_unary_bits),
        cmocka_unit_test(test_binary_bits),
        cmocka_unit_test(test_binary_broadcast_and_grad),
        cmocka_unit_test(test_binary_add_grad_exact),
        cmocka_unit_test(test_binary_grad_bits),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_reduce_nan_and_ties),
        cmocka_unit_test(test_softmax_grad),
        cmocka_unit_test(test_where),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_slice_pad_concat_broadcast),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_parity_vulkan),
        cmocka_unit_test(test_parity_cuda),
        cmocka_unit_test(test_graph_grads),
        cmocka_unit_test(test_graph_grads_vulkan),
        cmocka_unit_test(test_graph_errors),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_exp_grad_nan_threads),
        cmocka_unit_test(test_reduce_nan_threads),
        cmocka_unit_test(test_reduce_rows_bits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
