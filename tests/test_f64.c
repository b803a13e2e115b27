/* f64 on the CPU backend (issue 13): every op of the f64 table in dpar.h
   (>>f64 api) against a double reference computed here, to 1e-12 relative
   (bit for bit where the op is one rounding); cases where f32 visibly loses
   and f64 does not; gradients (norms, conv2d, avg pool, attention) against
   central finite differences in double (tolerance stated per op); the
   optimizers, embedding, where, dropout and max pool exact against the same
   steps in double; graphs in f64: every node's gradient against central
   differences of the graph's own forward (1e-9), bit for bit the eager f64
   calls, a CNN and an attention block trained with AdamW and SGD in a
   compiled graph; mixed dtypes and ops without an f64 kernel refused with
   DPAR_ERR_DTYPE; Vulkan and CUDA refusing f64 buffers, arrays and graph
   feeds, naming the backend. */
#include "testutil.h"

T_CPU_FIXTURE(1)

static dpar_buffer *mkd(int ndim, const int64_t *shape, const double *data) {
    return t_buf(RT, 0, DPAR_F64, ndim, shape, data);
}
/* deterministic values in [-2, 2) (a 64-bit LCG; no two tests share a stream) */
static double rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 4.0 - 2.0;
}
static double *rnd_n(int64_t n, uint64_t seed) {
    double *v = malloc((size_t)(n + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) v[i] = rnd(&seed);
    return v;
}
/* |got - want| <= tol (|want| + floor); floor: the size of the terms that cancelled */
static void near(const char *what, int64_t i, double got, double want, double tol, double floor_) {
    if (!(fabs(got - want) <= tol * (fabs(want) + floor_)))
        fail_msg("%s[%lld] = %.17g, want %.17g (rel tol %g)", what, (long long)i, got, want, tol);
}

/* ---- fill / copy / axpy / scale / casts: one rounding each, so exact ---- */
static void test_fill_copy_axpy_scale(void **st) {
    (void)st;
    double x[5] = { 1.0 / 3.0, -2.5, 1e300, 4.9e-324, -0.0 }, y[5] = { 0.1, 0.2, 0.3, 0.4, 0.5 }, r[5];
    dpar_buffer *bx = t_buf1(RT, DPAR_F64, 5, x), *by = t_buf1(RT, DPAR_F64, 5, y), *bz = t_buf1(RT, DPAR_F64, 5, NULL);
    T_OK(dpar_fill(bz, 0.1f));
    t_read(bz, r);
    for (int i = 0; i < 5; i++) assert_true(r[i] == (double)0.1f);
    T_OK(dpar_copy(bz, bx));
    t_read(bz, r);
    assert_memory_equal(r, x, sizeof x);
    T_OK(dpar_axpy(by, 0.5f, bx)); /* y += 0.5 x: one rounding of the double result */
    t_read(by, r);
    for (int i = 0; i < 5; i++) assert_true(r[i] == y[i] + 0.5 * x[i]);
    T_OK(dpar_scale(by, -3.0f));
    t_read(by, r);
    for (int i = 0; i < 5; i++) assert_true(r[i] == (y[i] + 0.5 * x[i]) * -3.0);
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(by);
    dpar_buffer_destroy(bz);
}
static void test_casts(void **st) {
    (void)st;
    double x[6] = { 1.0 / 3.0, -2.75, 1e300, 3e9, -3e9, NAN }, r[6];
    float f[6];
    int32_t k[6];
    uint16_t h[6];
    int64_t n = 6;
    dpar_buffer *bx = t_buf1(RT, DPAR_F64, 6, x), *bf = t_buf(RT, 0, DPAR_F32, 1, &n, NULL),
                *bi = t_buf(RT, 0, DPAR_I32, 1, &n, NULL);
    dpar_buffer *bh = t_buf(RT, 0, DPAR_BF16, 1, &n, NULL), *bd = t_buf1(RT, DPAR_F64, 6, NULL);
    T_OK(dpar_cast(bf, bx));
    t_read(bf, f);
    for (int i = 0; i < 5; i++) assert_true(f[i] == (float)x[i]); /* round to nearest; 1e300 -> inf */
    assert_true(isinf(f[2]) && f[5] != f[5]);
    T_OK(dpar_cast(bi, bx));
    t_read(bi, k);
    int32_t want_k[6] = { 0, -2, INT32_MAX, INT32_MAX, INT32_MIN, 0 }; /* truncation, saturating, NaN -> 0 */
    assert_memory_equal(k, want_k, sizeof k);
    T_OK(dpar_cast(bh, bx));
    t_read(bh, h);
    for (int i = 0; i < 5; i++) assert_int_equal(h[i], dpar_f32_to_bf16((float)x[i]));
    T_OK(dpar_cast(bd, bf)); /* f32 -> f64 is exact */
    t_read(bd, r);
    for (int i = 0; i < 5; i++) assert_true(r[i] == (double)f[i]);
    T_OK(dpar_cast(bd, bi));
    t_read(bd, r);
    for (int i = 0; i < 6; i++) assert_true(r[i] == (double)want_k[i]);
    assert_int_equal(dpar_dtype_size(DPAR_F64), 8);
    assert_string_equal(dpar_dtype_name(DPAR_F64), "f64");
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(bf);
    dpar_buffer_destroy(bi);
    dpar_buffer_destroy(bh);
    dpar_buffer_destroy(bd);
}

/* ---- where f32 visibly loses and f64 does not ---- */
static void test_f64_keeps_what_f32_loses(void **st) {
    (void)st;
    enum { N = 1002 };
    double *x = malloc(N * sizeof(double));
    float *xf = malloc(N * sizeof(float));
    x[0] = 1e8; /* then 1001 ones: the exact sum 100001001 is not an f32 (its neighbours are 8 apart) */
    for (int i = 1; i < N; i++) x[i] = 1.0;
    for (int i = 0; i < N; i++) xf[i] = (float)x[i];
    int64_t n = N, one = 1;
    dpar_buffer *bx = t_buf1(RT, DPAR_F64, N, x), *bs = t_buf1(RT, DPAR_F64, 1, NULL),
                *bxf = t_buf(RT, 0, DPAR_F32, 1, &n, xf);
    dpar_buffer *bsf = t_buf(RT, 0, DPAR_F32, 1, &one, NULL);
    T_OK(dpar_sum(bs, bx));
    T_OK(dpar_sum(bsf, bxf));
    float sf;
    t_read(bsf, &sf);
    assert_true(t_value_f64(bs) == 100001001.0);
    assert_true((double)sf != 100001001.0);
    /* a near-cancelling difference: (1 + 2^-40) - 1 */
    double a = 1.0 + ldexp(1.0, -40), b = 1.0, d;
    float af = (float)a, bf = (float)b, df;
    dpar_buffer *ba = t_buf1(RT, DPAR_F64, 1, &a), *bb = t_buf1(RT, DPAR_F64, 1, &b),
                *bd = t_buf1(RT, DPAR_F64, 1, NULL);
    dpar_buffer *baf = t_buf(RT, 0, DPAR_F32, 1, &one, &af), *bbf = t_buf(RT, 0, DPAR_F32, 1, &one, &bf);
    T_OK(dpar_binary(bd, ba, bb, DPAR_BINARY_SUB));
    T_OK(dpar_binary(bsf, baf, bbf, DPAR_BINARY_SUB));
    t_read(bd, &d);
    t_read(bsf, &df);
    assert_true(d == ldexp(1.0, -40));
    assert_true(df == 0.0f);
    dpar_buffer *bufs[] = { bx, bs, bxf, bsf, ba, bb, bd, baf, bbf };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(x);
    free(xf);
}

/* ---- unary ops and their derivatives, against formulas written here ---- */
static double ref_unary(int u, double x, double s, int deriv) {
    double sg = 1.0 / (1.0 + exp(-x)), k = sqrt(2.0 / M_PI), in = k * (x + 0.044715 * x * x * x);
    double t = tanh(in);
    switch (u) {
    case DPAR_UNARY_NEG: return deriv ? -1.0 : -x;
    case DPAR_UNARY_EXP: return exp(x);
    case DPAR_UNARY_LOG: return deriv ? 1.0 / x : log(x);
    case DPAR_UNARY_SQRT: return deriv ? 0.5 / sqrt(x) : sqrt(x);
    case DPAR_UNARY_RSQRT: return deriv ? -0.5 * pow(x, -1.5) : 1.0 / sqrt(x);
    case DPAR_UNARY_TANH: return deriv ? 1.0 / (cosh(x) * cosh(x)) : tanh(x);
    case DPAR_UNARY_SIGMOID: return deriv ? sg * (1.0 - sg) : sg;
    case DPAR_UNARY_GELU_TANH:
        return deriv ? 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
                     : 0.5 * x * (1.0 + t);
    case DPAR_UNARY_GELU_ERF:
        return deriv ? 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-x * x / 2.0) / sqrt(2.0 * M_PI)
                     : 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case DPAR_UNARY_SILU: return deriv ? sg + x * sg * (1.0 - sg) : x * sg;
    case DPAR_UNARY_SQUARE: return deriv ? 2.0 * x : x * x;
    case DPAR_UNARY_ADD_SCALAR: return deriv ? 1.0 : x + s;
    case DPAR_UNARY_MUL_SCALAR: return deriv ? s : x * s;
    case DPAR_UNARY_RSUB_SCALAR: return deriv ? -1.0 : s - x;
    case DPAR_UNARY_DIV_SCALAR: return deriv ? 1.0 / s : x / s;
    case DPAR_UNARY_RDIV_SCALAR: return deriv ? -s / (x * x) : s / x;
    case DPAR_UNARY_POW_SCALAR: return deriv ? s * pow(x, s - 1.0) : pow(x, s);
    default: return NAN;
    }
}
static void test_unary(void **st) {
    (void)st;
    enum { N = 37 };
    double *x = rnd_n(N, 11), *g = rnd_n(N, 12), y[N], dx[N];
    for (int i = 0; i < N; i++) x[i] = fabs(x[i]) + 0.05; /* log, sqrt, rsqrt, pow need x > 0 */
    dpar_buffer *bx = t_buf1(RT, DPAR_F64, N, x), *bg = t_buf1(RT, DPAR_F64, N, g), *by = t_buf1(RT, DPAR_F64, N, NULL);
    const float s = 1.75f;
    for (int u = 0; u < DPAR_UNARY_COUNT; u++) {
        char what[64];
        T_OK(dpar_unary(by, bx, (dpar_unary_op)u, s));
        t_read(by, y);
        snprintf(what, sizeof what, "unary %d", u);
        for (int i = 0; i < N; i++) near(what, i, y[i], ref_unary(u, x[i], (double)s, 0), 1e-12, 1e-300);
        T_OK(dpar_unary_backward(by, bg, bx, (dpar_unary_op)u, s));
        t_read(by, dx);
        snprintf(what, sizeof what, "unary_backward %d", u);
        for (int i = 0; i < N; i++) near(what, i, dx[i], g[i] * ref_unary(u, x[i], (double)s, 1), 1e-12, 1e-300);
    }
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(bg);
    dpar_buffer_destroy(by);
    free(x);
    free(g);
}

/* ---- binary ops with broadcasting and their backward ---- */
static void test_binary_broadcast(void **st) {
    (void)st;
    int64_t ys[3] = { 2, 3, 4 }, as[3] = { 2, 1, 4 }, bs[2] = { 3, 1 };
    double *a = rnd_n(8, 21), *b = rnd_n(3, 22), *dy = rnd_n(24, 23), y[24], da[8], db[3];
    for (int i = 0; i < 3; i++) b[i] += b[i] < 0 ? -0.5 : 0.5; /* no division by ~0 */
    dpar_buffer *ba = mkd(3, as, a), *bb = mkd(2, bs, b), *by = mkd(3, ys, NULL), *bdy = mkd(3, ys, dy);
    dpar_buffer *bda = mkd(3, as, NULL), *bdb = mkd(2, bs, NULL);
    for (int op = 0; op < DPAR_BINARY_COUNT; op++) {
        T_OK(dpar_binary(by, ba, bb, (dpar_binary_op)op));
        t_read(by, y);
        T_OK(dpar_binary_backward(bda, bdb, bdy, ba, bb, (dpar_binary_op)op));
        t_read(bda, da);
        t_read(bdb, db);
        double wa[8] = { 0 }, wb[3] = { 0 }, sa[8] = { 0 }, sb[3] = { 0 };
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                for (int k = 0; k < 4; k++) {
                    double va = a[i * 4 + k], vb = b[j], g = dy[(i * 3 + j) * 4 + k];
                    double w = op == 0 ? va + vb : op == 1 ? va - vb : op == 2 ? va * vb : va / vb;
                    double ga = op < 2 ? g : op == 2 ? g * vb : g / vb;
                    double gb = op == 0 ? g : op == 1 ? -g : op == 2 ? g * va : -g * va / (vb * vb);
                    if (y[(i * 3 + j) * 4 + k] != w) fail_msg("binary %d: y[%d,%d,%d] differs", op, i, j, k);
                    wa[i * 4 + k] += ga, sa[i * 4 + k] += fabs(ga);
                    wb[j] += gb, sb[j] += fabs(gb);
                }
        for (int i = 0; i < 8; i++) near("binary_backward da", i, da[i], wa[i], 1e-12, sa[i]);
        for (int i = 0; i < 3; i++) near("binary_backward db", i, db[i], wb[i], 1e-12, sb[i]);
    }
    dpar_buffer *bufs[] = { ba, bb, by, bdy, bda, bdb };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(a);
    free(b);
    free(dy);
}

/* ---- reductions along axes, their backward, sum / sum of squares ---- */
static void test_reductions(void **st) {
    (void)st;
    int64_t xs[3] = { 3, 5, 4 }, ys[2] = { 3, 4 }, one = 1;
    double *x = rnd_n(60, 31), *dy = rnd_n(12, 32), y[12], dx[60];
    x[1 * 20 + 2 * 4 + 3] = x[1 * 20 + 4 * 4 + 3] = 9.0; /* a tie: argmax and max's gradient take the first */
    dpar_buffer *bx = mkd(3, xs, x), *by = mkd(2, ys, NULL), *bdy = mkd(2, ys, dy), *bdx = mkd(3, xs, NULL);
    dpar_buffer *bi = t_buf(RT, 0, DPAR_I32, 2, ys, NULL), *bs = t_buf1(RT, DPAR_F64, 1, NULL);
    int axis = 1;
    for (int kind = 0; kind < DPAR_REDUCE_KIND_COUNT; kind++) {
        dpar_buffer *out = kind == DPAR_REDUCE_ARGMAX ? bi : by;
        T_OK(dpar_reduce(out, bx, (dpar_reduce_kind)kind, &axis, 1));
        int32_t idx[12];
        if (kind == DPAR_REDUCE_ARGMAX)
            t_read(bi, idx);
        else
            t_read(by, y);
        int back = kind != DPAR_REDUCE_ARGMAX;
        if (back) T_OK(dpar_reduce_backward(bdx, bdy, bx, (dpar_reduce_kind)kind, &axis, 1));
        t_read(bdx, dx);
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 4; k++) {
                double s = 0, sa = 0, mx = -INFINITY;
                int am = -1;
                for (int j = 0; j < 5; j++) {
                    double v = x[i * 20 + j * 4 + k];
                    s += v, sa += fabs(v);
                    if (v > mx) mx = v, am = j;
                }
                if (kind == DPAR_REDUCE_ARGMAX)
                    assert_int_equal(idx[i * 4 + k], am);
                else
                    near("reduce", kind, y[i * 4 + k],
                         kind == DPAR_REDUCE_SUM    ? s
                         : kind == DPAR_REDUCE_MEAN ? s / 5.0
                                                    : mx,
                         1e-12, sa);
                for (int j = 0; j < 5 && back; j++) {
                    double g = dy[i * 4 + k];
                    double want = kind == DPAR_REDUCE_SUM ? g : kind == DPAR_REDUCE_MEAN ? g / 5.0 : j == am ? g : 0;
                    near("reduce_backward", kind, dx[i * 20 + j * 4 + k], want, 1e-15, 0);
                }
            }
    }
    double s = 0, ss = 0, sa = 0;
    for (int i = 0; i < 60; i++) s += x[i], ss += x[i] * x[i], sa += fabs(x[i]);
    T_OK(dpar_sum(bs, bx));
    near("sum", 0, t_value_f64(bs), s, 1e-14, sa);
    T_OK(dpar_sum_squares(bs, bx));
    near("sum_squares", 0, t_value_f64(bs), ss, 1e-14, 0);
    int64_t none = 0;
    dpar_buffer *be = t_buf1(RT, DPAR_F64, none, NULL);
    T_OK(dpar_sum(bs, be)); /* size 0: sum 0 */
    assert_true(t_value_f64(bs) == 0.0);
    dpar_buffer *bf = t_buf(RT, 0, DPAR_F32, 1, &one, NULL);
    T_ERR(dpar_sum(bf, bx), DPAR_ERR_DTYPE, "out is f32", "f64");
    dpar_buffer *bufs[] = { bx, by, bdy, bdx, bi, bs, be, bf };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(x);
    free(dy);
}

/* ---- matmul: every transpose, alpha / beta, shapes across the blocking ---- */
static void matmul_case(int64_t M, int64_t K, int64_t N, int ta, int tb, float alpha, float beta) {
    int64_t as[2] = { ta ? K : M, ta ? M : K }, bs[2] = { tb ? N : K, tb ? K : N }, cs[2] = { M, N };
    double *A = rnd_n(M * K, 41 + (uint64_t)M), *B = rnd_n(K * N, 42 + (uint64_t)N), *C0 = rnd_n(M * N, 43);
    double *C = malloc((size_t)(M * N + 1) * sizeof(double));
    if (beta == 0.0f)
        for (int64_t i = 0; i < M * N; i++) C0[i] = NAN; /* beta = 0 ignores C */
    dpar_buffer *a = mkd(2, as, A), *b = mkd(2, bs, B), *c = mkd(2, cs, C0);
    T_OK(dpar_matmul(c, a, b, ta, tb, alpha, beta));
    t_read(c, C);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double x = ta ? A[k * M + i] : A[i * K + k], y = tb ? B[j * K + k] : B[k * N + j];
                acc += x * y, mag += fabs(x * y);
            }
            double want = alpha * acc + (beta == 0.0f ? 0.0 : beta * C0[i * N + j]);
            char what[96];
            snprintf(what, sizeof what, "matmul M%lld K%lld N%lld ta%d tb%d: C", (long long)M, (long long)K,
                     (long long)N, ta, tb);
            near(what, i * N + j, C[i * N + j], want, 1e-13,
                 fabs(alpha) * mag + (beta == 0.0f ? 0.0 : fabs(beta * C0[i * N + j])));
        }
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
    free(A);
    free(B);
    free(C0);
    free(C);
}
static void test_matmul(void **st) {
    (void)st;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            matmul_case(1, 1, 1, ta, tb, 1.0f, 0.0f);
            matmul_case(5, 7, 3, ta, tb, 2.0f, 0.5f);
            matmul_case(37, 300, 260, ta, tb, -0.75f, 1.0f); /* crosses the 128 x 256 blocks */
            matmul_case(3, 0, 4, ta, tb, 1.0f, 0.0f);        /* K = 0: C = 0 */
        }
}

/* ---- softmax / log_softmax and their backward ---- */
static void test_softmax(void **st) {
    (void)st;
    int64_t sh[2] = { 4, 7 };
    double *x = rnd_n(28, 51), *dy = rnd_n(28, 52), y[28], dx[28];
    x[7] = 1000.0, x[8] = 1000.0; /* row 1 starts with huge values: no overflow */
    dpar_buffer *bx = mkd(2, sh, x), *by = mkd(2, sh, NULL), *bdy = mkd(2, sh, dy), *bdx = mkd(2, sh, NULL);
    for (int lg = 0; lg < 2; lg++) {
        T_OK(dpar_softmax(by, bx, lg));
        t_read(by, y);
        T_OK(dpar_softmax_backward(bdx, bdy, by, lg));
        t_read(bdx, dx);
        for (int r = 0; r < 4; r++) {
            double mx = -INFINITY, se = 0, p[7], gp = 0, gs = 0;
            for (int j = 0; j < 7; j++) mx = fmax(mx, x[r * 7 + j]);
            for (int j = 0; j < 7; j++) se += exp(x[r * 7 + j] - mx);
            for (int j = 0; j < 7; j++) p[j] = exp(x[r * 7 + j] - mx) / se;
            for (int j = 0; j < 7; j++) gp += dy[r * 7 + j] * p[j], gs += dy[r * 7 + j];
            for (int j = 0; j < 7; j++) {
                double want = lg ? x[r * 7 + j] - mx - log(se) : p[j];
                near(lg ? "log_softmax" : "softmax", r * 7 + j, y[r * 7 + j], want, 1e-12, lg ? 1.0 : 0.0);
                double wd = lg ? dy[r * 7 + j] - p[j] * gs : p[j] * (dy[r * 7 + j] - gp);
                near("softmax_backward", r * 7 + j, dx[r * 7 + j], wd, 1e-12, 1.0);
            }
        }
    }
    assert_true(y[7] == y[8]); /* the two 1000s share the row's top probability exactly */
    dpar_buffer *bufs[] = { bx, by, bdy, bdx };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(x);
    free(dy);
}

/* ---- losses: mse, cross-entropy (ignore label, smoothing) ---- */
static void test_losses(void **st) {
    (void)st;
    int64_t sh[2] = { 5, 6 }, m = 5;
    double *p = rnd_n(30, 61), *t = rnd_n(30, 62), g[30];
    dpar_buffer *bp = mkd(2, sh, p), *bt = mkd(2, sh, t), *bg = mkd(2, sh, NULL), *bl = t_buf1(RT, DPAR_F64, 1, NULL);
    T_OK(dpar_mse(bl, bg, bp, bt));
    t_read(bg, g);
    double s = 0;
    for (int i = 0; i < 30; i++) {
        s += (p[i] - t[i]) * (p[i] - t[i]);
        near("mse grad", i, g[i], 2.0 * (p[i] - t[i]) / 30.0, 1e-15, 0);
    }
    near("mse", 0, t_value_f64(bl), s / 30.0, 1e-14, 0);
    int32_t lab[5] = { 2, -100, 0, 5, 3 };
    dpar_buffer *blab = t_buf(RT, 0, DPAR_I32, 1, &m, lab);
    dpar_xent_desc d = { true, -100, 0.1f };
    T_OK(dpar_cross_entropy(bl, bg, bp, blab, &d));
    t_read(bg, g);
    double a = (double)0.1f, total = 0;
    for (int i = 0; i < 5; i++) {
        double mx = -INFINITY, se = 0;
        for (int j = 0; j < 6; j++) mx = fmax(mx, p[i * 6 + j]);
        for (int j = 0; j < 6; j++) se += exp(p[i * 6 + j] - mx);
        double lse = mx + log(se);
        for (int j = 0; j < 6; j++) {
            double q = (j == lab[i] ? 1.0 - a : 0.0) + a / 6.0;
            near("xent grad", i * 6 + j, g[i * 6 + j], lab[i] == -100 ? 0.0 : (exp(p[i * 6 + j] - lse) - q) / 4.0,
                 1e-12, 0.1);
            if (lab[i] != -100) total -= q * (p[i * 6 + j] - lse);
        }
    }
    near("cross_entropy", 0, t_value_f64(bl), total / 4.0, 1e-12, 0);
    T_ERR(dpar_softmax_xent(bl, NULL, bp, blab), DPAR_ERR_INVALID_ARGUMENT, "labels[1] = -100");
    lab[1] = 1;
    T_OK(dpar_buffer_write(blab, 0, lab, sizeof lab));
    T_OK(dpar_softmax_xent(bl, NULL, bp, blab));
    total = 0;
    for (int i = 0; i < 5; i++) {
        double mx = -INFINITY, se = 0;
        for (int j = 0; j < 6; j++) mx = fmax(mx, p[i * 6 + j]);
        for (int j = 0; j < 6; j++) se += exp(p[i * 6 + j] - mx);
        total += mx + log(se) - p[i * 6 + lab[i]];
    }
    near("softmax_xent", 0, t_value_f64(bl), total / 5.0, 1e-12, 0);
    dpar_buffer *bufs[] = { bp, bt, bg, bl, blab };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(p);
    free(t);
}

/* ---- layer_norm / rms_norm: forward against the formula, backward against central differences ---- */
static double norm_loss(int rms, const double *x, const double *w, const double *b, const double *dy, int R, int N,
                        double *y) {
    double L = 0;
    for (int i = 0; i < R; i++) {
        double mu = 0, var = 0;
        for (int j = 0; j < N && !rms; j++) mu += x[i * N + j] / N;
        for (int j = 0; j < N; j++) var += (x[i * N + j] - mu) * (x[i * N + j] - mu) / N;
        for (int j = 0; j < N; j++) {
            double v = (x[i * N + j] - mu) / sqrt(var + (double)1e-5f) * w[j] + b[j];
            if (y) y[i * N + j] = v;
            L += dy[i * N + j] * v;
        }
    }
    return L;
}
static void test_norms(void **st) {
    (void)st;
    enum { R = 3, N = 6 };
    int64_t sh[2] = { R, N }, ss[2] = { R, 2 }, n = N;
    double *x = rnd_n(R * N, 71), *w = rnd_n(N, 72), *b = rnd_n(N, 73), *dy = rnd_n(R * N, 74);
    double y[R * N], yr[R * N], dx[R * N], dw[N], db[N], stt[2 * R];
    for (int j = 0; j < N; j++) x[2 * N + j] = 0.25; /* a constant row: y = b, no NaN */
    dpar_buffer *bx = mkd(2, sh, x), *bw = mkd(1, &n, w), *bb = mkd(1, &n, b), *bdy = mkd(2, sh, dy);
    dpar_buffer *by = mkd(2, sh, NULL), *bst = mkd(2, ss, NULL), *bdx = mkd(2, sh, NULL), *bdw = mkd(1, &n, NULL),
                *bdb = mkd(1, &n, NULL);
    for (int rms = 0; rms < 2; rms++) {
        T_OK((rms ? dpar_rms_norm : dpar_layer_norm)(by, bst, bx, bw, bb, 1e-5f));
        t_read(by, y);
        t_read(bst, stt);
        norm_loss(rms, x, w, b, dy, R, N, yr);
        (void)stt;
        for (int i = 0; i < R * N; i++) near(rms ? "rms_norm" : "layer_norm", i, y[i], yr[i], 1e-12, 1.0);
        T_OK((rms ? dpar_rms_norm_backward : dpar_layer_norm_backward)(bdx, bdw, bdb, bdy, bx, bw, bst));
        t_read(bdx, dx);
        t_read(bdw, dw);
        t_read(bdb, db);
        const double h = 1e-5;
        for (int i = 0; i < R * N; i++) { /* central differences of L = sum(dy * y) */
            double keep = x[i];
            x[i] = keep + h;
            double lp = norm_loss(rms, x, w, b, dy, R, N, NULL);
            x[i] = keep - h;
            double lm = norm_loss(rms, x, w, b, dy, R, N, NULL);
            x[i] = keep;
            /* the constant row's rstd is 1/sqrt(eps): too curved for h; its y = b is checked above */
            if (i / N != 2 || rms) near("norm dx vs central differences", i, dx[i], (lp - lm) / (2 * h), 1e-8, 1.0);
        }
        for (int j = 0; j < N; j++) {
            double keep = w[j];
            w[j] = keep + h;
            double lp = norm_loss(rms, x, w, b, dy, R, N, NULL);
            w[j] = keep - h;
            double lm = norm_loss(rms, x, w, b, dy, R, N, NULL);
            w[j] = keep;
            near("norm dw vs central differences", j, dw[j], (lp - lm) / (2 * h), 1e-8, 1.0);
            double sb = 0;
            for (int i = 0; i < R; i++) sb += dy[i * N + j];
            near("norm db", j, db[j], sb, 1e-14, 1.0);
        }
    }
    dpar_buffer *bufs[] = { bx, bw, bb, bdy, by, bst, bdx, bdw, bdb };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(x);
    free(w);
    free(b);
    free(dy);
}

/* ---- a graph in double: value_and_grad against central differences of its own f64 forward ---- */
enum { GB = 4, GD = 5, GH = 6, GC = 3, GNP = 6 };
static double graph_loss(dpar_graph *g, dpar_value loss, const dpar_graph_feed *f, int nf) {
    double l = 0;
    float lf = 0;
    T_OK(dpar_graph_run(g, f, nf, &lf));
    T_OK(dpar_graph_get(g, loss, &l));
    assert_true(lf == (float)l); /* dpar_graph_run rounds the f64 loss */
    return l;
}
static void test_graph_gradcheck(void **st) {
    (void)st;
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    static const int64_t shapes[GNP][2] = { { GD, GH }, { GH, 0 }, { GH, 0 }, { GH, 0 }, { GH, GC }, { GC, 0 } };
    static const char *const names[GNP] = { "w1", "b1", "gamma", "beta", "w2", "s" };
    dpar_array *pa[GNP];
    dpar_value pv[GNP], gr[GNP];
    double *pd[GNP];
    int64_t pn[GNP];
    for (int k = 0; k < GNP; k++) {
        dpar_array_desc d = { DPAR_F64, shapes[k][1] ? 2 : 1, { shapes[k][0], shapes[k][1] }, { NULL } };
        T_OK(dpar_array_create(m, &d, &pa[k]));
        pn[k] = shapes[k][0] * (shapes[k][1] ? shapes[k][1] : 1);
        pd[k] = rnd_n(pn[k], 90 + (uint64_t)k);
        if (k == 2)
            for (int64_t i = 0; i < pn[k]; i++) pd[k][i] += 1.5; /* gamma near 1 */
        T_OK(dpar_array_put(pa[k], pd[k]));
        pv[k] = dpar_g_param(g, names[k], pa[k]);
    }
    dpar_value x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F64, 2, { GB, GD }, { NULL } });
    dpar_value t = dpar_g_feed(g, "t", &(dpar_array_desc){ DPAR_F64, 2, { GB, GC }, { NULL } });
    dpar_value y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { GB }, { NULL } });
    dpar_value z = dpar_g_bias_add(g, dpar_g_matmul(g, x, pv[0], false, false), pv[1]);
    dpar_value n = dpar_g_layer_norm(g, dpar_g_unary(g, z, DPAR_UNARY_TANH, 0.0f), pv[2], pv[3], 1e-5f);
    dpar_value r = dpar_g_binary(g, dpar_g_matmul(g, n, pv[4], false, false), pv[5], DPAR_BINARY_MUL);
    dpar_xent_desc xd = { true, -1, 0.1f };
    dpar_value l1 = dpar_g_cross_entropy(g, r, y, &xd);
    dpar_value l2 = dpar_g_mse(g, dpar_g_softmax(g, r, false), t);
    dpar_value l3 = dpar_g_reduce(g, dpar_g_unary(g, r, DPAR_UNARY_SQUARE, 0.0f), DPAR_REDUCE_MEAN, NULL, 0, false);
    dpar_value loss = dpar_g_add(g, dpar_g_add(g, l1, l2), dpar_g_scale(g, l3, 0.25f));
    T_OK(dpar_graph_status(g));
    dpar_dtype lt;
    int lnd;
    int64_t lsh[DPAR_MAX_DIMS];
    T_OK(dpar_graph_value_shape(g, loss, &lt, &lnd, lsh));
    assert_int_equal(lt, DPAR_F64);
    T_OK(dpar_graph_value_and_grad(g, loss, pv, GNP, gr));
    T_OK(dpar_graph_compile(g, NULL));
    double *xv = rnd_n(GB * GD, 97), *tv = rnd_n(GB * GC, 98);
    int32_t yv[GB] = { 2, -1, 0, 1 }; /* row 1 is padding */
    dpar_graph_feed f[3] = { { x, xv, NULL }, { t, tv, NULL }, { y, yv, NULL } };
    graph_loss(g, loss, f, 3);
    double *an[GNP];
    for (int k = 0; k < GNP; k++) {
        an[k] = malloc((size_t)pn[k] * sizeof(double));
        T_OK(dpar_graph_get(g, gr[k], an[k]));
    }
    /* fourth-order central differences (error O(h^4) ~ 1e-16, rounding ~ 1e-16 |L| / h ~ 1e-12) */
    const double h = 1e-4, off[4] = { 2 * h, h, -h, -2 * h };
    for (int k = 0; k < GNP; k++)
        for (int64_t i = 0; i < pn[k]; i++) {
            double keep = pd[k][i], l[4];
            for (int j = 0; j < 4; j++) {
                pd[k][i] = keep + off[j];
                T_OK(dpar_array_put(pa[k], pd[k]));
                l[j] = graph_loss(g, loss, f, 3);
            }
            pd[k][i] = keep;
            T_OK(dpar_array_put(pa[k], pd[k]));
            double fd = (8.0 * (l[1] - l[2]) - (l[0] - l[3])) / (12.0 * h);
            if (!(fabs(an[k][i] - fd) <= 1e-8 * fmax(fabs(fd), 1e-2)))
                fail_msg("d loss / d %s[%lld]: graph %.15g, central differences %.15g", names[k], (long long)i,
                         an[k][i], fd);
        }
    for (int k = 0; k < GNP; k++) free(an[k]), free(pd[k]);
    free(xv);
    free(tv);
    T_OK(dpar_graph_destroy(g));
    for (int k = 0; k < GNP; k++) dpar_array_destroy(pa[k]);
    dpar_mesh_destroy(m);
}
/* an f64 graph refuses an f32 input, naming both */
static void test_graph_mixed_refused(void **st) {
    (void)st;
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_value a = dpar_g_feed(g, "a", &(dpar_array_desc){ DPAR_F64, 2, { 2, 2 }, { NULL } });
    dpar_value b = dpar_g_feed(g, "b", &(dpar_array_desc){ DPAR_F32, 2, { 2, 2 }, { NULL } });
    dpar_g_matmul(g, a, b, false, false);
    T_ERR(dpar_graph_status(g), DPAR_ERR_DTYPE, "dpar_g_matmul", "f32", "f64");
    T_OK(dpar_graph_destroy(g));
    dpar_mesh_destroy(m);
}

/* ---- collectives within a process reduce f64 in double ---- */
static dpar_status coll_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_status s = dpar_psum(ctx, dpar_ctx_arg(ctx, 1), dpar_ctx_arg(ctx, 0), "data");
    return s ? s : dpar_pmax(ctx, dpar_ctx_arg(ctx, 2), dpar_ctx_arg(ctx, 0), "data");
}
static void test_collectives(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array_desc d = { DPAR_F64, 2, { 2, 3 }, { "data", NULL } };
    dpar_array *a[3];
    for (int k = 0; k < 3; k++) T_OK(dpar_array_create(m, &d, &a[k]));
    double in[6] = { 1e15, 0.1, 1.0 / 3.0, 1.0, 0.2, -1.0 / 7.0 }, sum[6], mx[6];
    T_OK(dpar_array_put(a[0], in));
    dpar_shard_map_desc sd = { coll_fn, NULL, 3, { a[0], a[1], a[2] } };
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_array_get(a[1], sum));
    T_OK(dpar_array_get(a[2], mx));
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) {
            assert_true(sum[r * 3 + j] == in[j] + in[3 + j]); /* 1e15 + 1 and 0.1 + 0.2 as double adds them */
            assert_true(mx[r * 3 + j] == fmax(in[j], in[3 + j]));
        }
    for (int k = 0; k < 3; k++) dpar_array_destroy(a[k]);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}

/* ---- shape ops move 8-byte elements ---- */
static void test_shape_ops(void **st) {
    (void)st;
    int64_t xs[2] = { 3, 4 }, ts[2] = { 4, 3 }, ss[2] = { 2, 2 }, ps[2] = { 5, 6 }, cs[2] = { 6, 4 };
    double *x = rnd_n(12, 81), t[12], sl[4], p[30], c[24];
    dpar_buffer *bx = mkd(2, xs, x), *bt = mkd(2, ts, NULL), *bs = mkd(2, ss, NULL), *bp = mkd(2, ps, NULL),
                *bc = mkd(2, cs, NULL);
    int perm[2] = { 1, 0 };
    int64_t start[2] = { 1, 1 }, step[2] = { 1, 2 }, lo[2] = { 1, 2 };
    T_OK(dpar_transpose(bt, bx, perm));
    T_OK(dpar_slice(bs, bx, start, step));
    T_OK(dpar_pad(bp, bx, lo, -1.5f));
    const dpar_buffer *two[2] = { bx, bx };
    T_OK(dpar_concat(bc, two, 2, 0));
    t_read(bt, t);
    t_read(bs, sl);
    t_read(bp, p);
    t_read(bc, c);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            assert_true(t[j * 3 + i] == x[i * 4 + j]);
            assert_true(p[(i + 1) * 6 + j + 2] == x[i * 4 + j]);
            assert_true(c[i * 4 + j] == x[i * 4 + j] && c[12 + i * 4 + j] == x[i * 4 + j]);
        }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) assert_true(sl[i * 2 + j] == x[(1 + i) * 4 + 1 + 2 * j]);
    assert_true(p[0] == -1.5 && p[29] == -1.5);
    dpar_buffer *bufs[] = { bx, bt, bs, bp, bc };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(x);
}

/* ---- finite differences of an op's own f64 forward: L(x) = sum(dy * out(x)) ---- */
typedef struct fd_case {
    dpar_status (*fwd)(struct fd_case *c); /* runs the forward into out */
    dpar_buffer *out;
    const double *dy;
    int64_t nout;
    const void *u[6]; /* the op's buffers and descs */
} fd_case;
static double fd_loss(fd_case *c) {
    double *o = malloc((size_t)(c->nout + 1) * sizeof(double)), l = 0;
    T_OK(c->fwd(c));
    t_read(c->out, o);
    for (int64_t i = 0; i < c->nout; i++) l += c->dy[i] * o[i];
    free(o);
    return l;
}
/* grad[i] against (L(x + h e_i) - L(x - h e_i)) / 2h, x written to bx each time; rel tol tol (floor 1) */
static void fd_check(const char *what, fd_case *c, double *x, dpar_buffer *bx, int64_t n, const double *grad, double h,
                     double tol) {
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        T_OK(dpar_buffer_write(bx, 0, x, (size_t)n * sizeof(double)));
        double lp = fd_loss(c);
        x[i] = keep - h;
        T_OK(dpar_buffer_write(bx, 0, x, (size_t)n * sizeof(double)));
        double lm = fd_loss(c);
        x[i] = keep;
        near(what, i, grad[i], (lp - lm) / (2 * h), tol, 1.0);
    }
    T_OK(dpar_buffer_write(bx, 0, x, (size_t)n * sizeof(double)));
}

/* ---- optimizers: SGD and AdamW step by step as a double reference does them (one rounding each) ---- */
static dpar_status sgd_clip_fn(dpar_ctx *ctx, void *user) {
    const dpar_sgd_desc *d = (const dpar_sgd_desc *)user;
    dpar_buffer *p[2] = { dpar_ctx_arg(ctx, 0), dpar_ctx_arg(ctx, 1) },
                *g[2] = { dpar_ctx_arg(ctx, 2), dpar_ctx_arg(ctx, 3) };
    return dpar_sgd_step(ctx, d, p, g, NULL, 2);
}
static void test_optimizers(void **st) {
    (void)st;
    enum { N = 37 };
    double *p = rnd_n(N, 91), *g = rnd_n(N, 92), mo[N] = { 0 }, r[N], rm[N], rv[N];
    dpar_buffer *bp = t_buf1(RT, DPAR_F64, N, p), *bg = t_buf1(RT, DPAR_F64, N, g), *bm = t_buf1(RT, DPAR_F64, N, NULL),
                *bv = t_buf1(RT, DPAR_F64, N, NULL);
    T_OK(dpar_fill(bm, 0.0f));
    for (int nest = 0; nest < 2; nest++) { /* SGD: momentum, weight decay, a clip scale; exact */
        dpar_sgd_desc d = { 0.125f, 0.75f, nest != 0, 0.0625f, 0.0f, NULL };
        for (int step = 0; step < 3; step++) {
            T_OK(dpar_sgd_update(&d, bp, bg, bm, 0.5f));
            for (int i = 0; i < N; i++) {
                double gi = g[i] * 0.5 + 0.0625 * p[i];
                mo[i] = 0.75 * mo[i] + gi;
                p[i] -= 0.125 * (nest ? gi + 0.75 * mo[i] : mo[i]);
            }
        }
        t_read(bp, r);
        t_read(bm, rm);
        for (int i = 0; i < N; i++) assert_true(r[i] == p[i] && rm[i] == mo[i]);
    }
    double m[N] = { 0 }, v[N] = { 0 }; /* AdamW, three steps: exact (bias corrections in double) */
    T_OK(dpar_fill(bm, 0.0f));
    T_OK(dpar_fill(bv, 0.0f));
    dpar_adamw_desc ad = { .learning_rate = 0.01f, .weight_decay = 0.125f };
    for (int t = 1; t <= 3; t++) {
        T_OK(dpar_adamw_update(&ad, bp, bg, bm, bv, t, 0.75f));
        double c1 = 1.0 / (1.0 - pow((double)0.9f, t)), c2 = 1.0 / (1.0 - pow((double)0.999f, t));
        for (int i = 0; i < N; i++) {
            double gi = g[i] * 0.75;
            m[i] = (double)0.9f * m[i] + (1.0 - (double)0.9f) * gi;
            v[i] = (double)0.999f * v[i] + (1.0 - (double)0.999f) * (gi * gi);
            double u = (m[i] * c1) / (sqrt(v[i] * c2) + (double)1e-8f) + 0.125 * p[i];
            p[i] = p[i] - (double)0.01f * u;
        }
    }
    t_read(bp, r);
    t_read(bm, rm);
    t_read(bv, rv);
    for (int i = 0; i < N; i++) assert_true(r[i] == p[i] && rm[i] == m[i] && rv[i] == v[i]);
    /* dpar_sgd_step clipping by the global norm of two f64 gradients (summed in double; the factor is a float) */
    dpar_mesh *mesh = t_mesh1(RT, 1, "data");
    dpar_array_desc a1 = { DPAR_F64, 1, { 5 }, { NULL } }, a2 = { DPAR_F64, 1, { 3 }, { NULL } };
    dpar_array *arr[4];
    for (int k = 0; k < 4; k++) T_OK(dpar_array_create(mesh, k % 2 ? &a2 : &a1, &arr[k]));
    double p8[8], g8[8], out[8];
    for (int i = 0; i < 8; i++) p8[i] = 0.1 * i - 0.3, g8[i] = 1.0 / (i + 3.0);
    T_OK(dpar_array_put(arr[0], p8));
    T_OK(dpar_array_put(arr[1], p8 + 5));
    T_OK(dpar_array_put(arr[2], g8));
    T_OK(dpar_array_put(arr[3], g8 + 5));
    dpar_sgd_desc cd = { 0.5f, 0.0f, false, 0.0f, 0.25f, NULL };
    dpar_shard_map_desc sd = { sgd_clip_fn, &cd, 4, { arr[0], arr[1], arr[2], arr[3] } };
    T_OK(dpar_shard_map(mesh, &sd));
    T_OK(dpar_array_get(arr[0], out));
    T_OK(dpar_array_get(arr[1], out + 5));
    double ss = 0;
    for (int i = 0; i < 5; i++) ss += g8[i] * g8[i];
    double s2 = 0;
    for (int i = 5; i < 8; i++) s2 += g8[i] * g8[i];
    float nf = (float)sqrt(ss + s2), cs = 0.25f / nf;
    for (int i = 0; i < 8; i++) assert_true(out[i] == p8[i] - 0.5 * (g8[i] * (double)cs + 0.0 * p8[i]));
    for (int k = 0; k < 4; k++) dpar_array_destroy(arr[k]);
    dpar_mesh_destroy(mesh);
    /* mixed dtypes: refused naming the op and both dtypes */
    int64_t n = N;
    dpar_buffer *f = t_buf(RT, 0, DPAR_F32, 1, &n, NULL);
    dpar_sgd_desc d0 = { 0.1f, 0.5f, false, 0.0f, 0.0f, NULL };
    T_ERR(dpar_sgd_update(&d0, bp, f, bm, 1.0f), DPAR_ERR_DTYPE, "dpar_sgd_update", "grad is f32", "f64");
    T_ERR(dpar_sgd_update(&d0, bp, bg, f, 1.0f), DPAR_ERR_DTYPE, "dpar_sgd_update", "momentum is f32", "f64");
    T_ERR(dpar_sgd_update(&d0, f, bg, NULL, 1.0f), DPAR_ERR_DTYPE, "dpar_sgd_update", "grad is f64", "f32");
    T_ERR(dpar_adamw_update(&ad, bp, bg, f, bv, 1, 1.0f), DPAR_ERR_DTYPE, "dpar_adamw_update", "m is f32", "f64");
    dpar_buffer *bufs[] = { bp, bg, bm, bv, f };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(p);
    free(g);
}

/* ---- conv2d (+ both gradients) against direct loops and finite differences ---- */
enum { CN = 2, CH = 5, CW = 6, CC = 3, CKH = 3, CKW = 2, CO = 4 };
static const dpar_conv2d_desc conv_d = { { 2, 1 }, { 1, 2 }, DPAR_PADDING_EXPLICIT, { { 1, 1 }, { 2, 0 } } };
static int64_t conv_oh(void) {
    return (CH + 2 - CKH) / 2 + 1;
}
static int64_t conv_ow(void) {
    return CW + 2 - (2 * (CKW - 1) + 1) + 1;
}
static void conv_ref(const double *x, const double *w, const double *b, double *y) {
    int64_t OH = conv_oh(), OW = conv_ow();
    for (int64_t n = 0; n < CN; n++)
        for (int64_t i = 0; i < OH; i++)
            for (int64_t j = 0; j < OW; j++)
                for (int64_t o = 0; o < CO; o++) {
                    double acc = b[o];
                    for (int64_t p = 0; p < CKH; p++)
                        for (int64_t t = 0; t < CKW; t++) {
                            int64_t ih = i * 2 - 1 + p, iw = j - 2 + 2 * t;
                            if (ih < 0 || ih >= CH || iw < 0 || iw >= CW) continue;
                            for (int64_t c = 0; c < CC; c++)
                                acc += x[((n * CH + ih) * CW + iw) * CC + c] * w[((p * CKW + t) * CC + c) * CO + o];
                        }
                    y[((n * OH + i) * OW + j) * CO + o] = acc;
                }
}
static dpar_status conv_fwd(fd_case *c) {
    return dpar_conv2d(c->out, c->u[0], c->u[1], c->u[2], &conv_d);
}
static void test_conv2d(void **st) {
    (void)st;
    int64_t xs[4] = { CN, CH, CW, CC }, ws[4] = { CKH, CKW, CC, CO }, ys[4], bs = CO;
    T_OK(dpar_conv2d_output_shape(xs, ws, &conv_d, ys));
    assert_true(ys[1] == conv_oh() && ys[2] == conv_ow());
    int64_t nx = CN * CH * CW * CC, nw = CKH * CKW * CC * CO, ny = ys[0] * ys[1] * ys[2] * ys[3];
    double *x = rnd_n(nx, 101), *w = rnd_n(nw, 102), *b = rnd_n(CO, 103), *dy = rnd_n(ny, 104);
    double *y = malloc((size_t)ny * 8), *yr = malloc((size_t)ny * 8), *dx = malloc((size_t)nx * 8),
           *dw = malloc((size_t)nw * 8), db[CO];
    dpar_buffer *bx = mkd(4, xs, x), *bw = mkd(4, ws, w), *bb = mkd(1, &bs, b), *by = mkd(4, ys, NULL),
                *bdy = mkd(4, ys, dy), *bdx = mkd(4, xs, NULL), *bdw = mkd(4, ws, NULL), *bdb = mkd(1, &bs, NULL);
    T_OK(dpar_conv2d(by, bx, bw, bb, &conv_d));
    t_read(by, y);
    conv_ref(x, w, b, yr);
    for (int64_t i = 0; i < ny; i++) near("conv2d", i, y[i], yr[i], 1e-12, 1.0);
    T_OK(dpar_conv2d_backward_input(bdx, bdy, bw, &conv_d));
    T_OK(dpar_conv2d_backward_kernel(bdw, bdb, bx, bdy, &conv_d));
    t_read(bdx, dx);
    t_read(bdw, dw);
    t_read(bdb, db);
    /* L = sum(dy * y) is linear in x and in w: central differences are exact but for rounding (h = 1e-3) */
    fd_case c = { conv_fwd, by, dy, ny, { bx, bw, bb } };
    fd_check("conv2d dx vs central differences", &c, x, bx, nx, dx, 1e-3, 1e-9);
    fd_check("conv2d dw vs central differences", &c, w, bw, nw, dw, 1e-3, 1e-9);
    fd_check("conv2d db vs central differences", &c, b, bb, CO, db, 1e-3, 1e-9);
    int64_t s4[4] = { CN, CH, CW, CC };
    dpar_buffer *f = t_buf(RT, 0, DPAR_F32, 4, s4, NULL);
    T_ERR(dpar_conv2d(by, f, bw, bb, &conv_d), DPAR_ERR_DTYPE, "dpar_conv2d", "x is f32", "f64");
    T_ERR(dpar_conv2d_backward_input(f, bdy, bw, &conv_d), DPAR_ERR_DTYPE, "dpar_conv2d_backward_input", "f32", "f64");
    dpar_buffer *bufs[] = { bx, bw, bb, by, bdy, bdx, bdw, bdb, f };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    double *hs[] = { x, w, b, dy, y, yr, dx, dw };
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
}

/* ---- avg / max pool (+ backward): direct loops, finite differences for avg, routing for max ---- */
enum { PN = 2, PH = 5, PW = 4, PC = 3 };
static const dpar_pool2d_desc pool_d[2] = {
    { { 3, 2 }, { 2, 1 }, DPAR_PADDING_EXPLICIT, { { 1, 1 }, { 0, 1 } }, false },
    { { 3, 2 }, { 2, 1 }, DPAR_PADDING_EXPLICIT, { { 1, 1 }, { 0, 1 } }, true }
};
/* y (avg: ex = divide by the in-image count) and, for max, the argmax of each output */
static void pool_ref(const double *x, int is_max, int ex, double *y, int64_t *arg) {
    int64_t OH = (PH + 2 - 3) / 2 + 1, OW = PW + 1 - 2 + 1;
    for (int64_t n = 0; n < PN; n++)
        for (int64_t i = 0; i < OH; i++)
            for (int64_t j = 0; j < OW; j++)
                for (int64_t c = 0; c < PC; c++) {
                    double acc = 0, best = -INFINITY;
                    int64_t cnt = 0, at = -1;
                    for (int64_t p = 0; p < 3; p++)
                        for (int64_t t = 0; t < 2; t++) {
                            int64_t ih = i * 2 - 1 + p, iw = j + t;
                            if (ih < 0 || ih >= PH || iw >= PW) continue;
                            int64_t xi = ((n * PH + ih) * PW + iw) * PC + c;
                            acc += x[xi], cnt++;
                            if (at < 0 || x[xi] > best) best = x[xi], at = xi;
                        }
                    int64_t o = ((n * OH + i) * OW + j) * PC + c;
                    y[o] = is_max ? best : acc / (double)(ex ? cnt : 6);
                    if (arg) arg[o] = at;
                }
}
static dpar_status avg_fwd(fd_case *c) {
    return dpar_avg_pool2d(c->out, c->u[0], c->u[1]);
}
static void test_pools(void **st) {
    (void)st;
    int64_t xs[4] = { PN, PH, PW, PC }, ys[4];
    T_OK(dpar_pool2d_output_shape(xs, &pool_d[0], ys));
    int64_t nx = PN * PH * PW * PC, ny = ys[0] * ys[1] * ys[2] * ys[3], arg[128];
    assert_true(ny <= 128 && ys[1] == 3 && ys[2] == 4);
    double *x = rnd_n(nx, 111), *dy = rnd_n(ny, 112), y[128], yr[128], dx[128], want[128];
    dpar_buffer *bx = mkd(4, xs, x), *by = mkd(4, ys, NULL), *bdy = mkd(4, ys, dy), *bdx = mkd(4, xs, NULL);
    for (int ex = 0; ex < 2; ex++) {
        T_OK(dpar_avg_pool2d(by, bx, &pool_d[ex]));
        t_read(by, y);
        pool_ref(x, 0, ex, yr, NULL);
        for (int64_t i = 0; i < ny; i++) near("avg_pool2d", i, y[i], yr[i], 1e-14, 0.0);
        T_OK(dpar_avg_pool2d_backward(bdx, bdy, &pool_d[ex]));
        t_read(bdx, dx);
        fd_case c = { avg_fwd, by, dy, ny, { bx, &pool_d[ex] } };
        fd_check("avg_pool2d dx vs central differences", &c, x, bx, nx, dx, 1e-3, 1e-10);
    }
    T_OK(dpar_max_pool2d(by, bx, &pool_d[0])); /* max: exact values, dy routed to the (first) maximum */
    t_read(by, y);
    pool_ref(x, 1, 0, yr, arg);
    for (int64_t i = 0; i < ny; i++) assert_true(y[i] == yr[i]);
    T_OK(dpar_max_pool2d_backward(bdx, bdy, bx, &pool_d[0]));
    t_read(bdx, dx);
    for (int64_t i = 0; i < nx; i++) want[i] = 0;
    for (int64_t i = 0; i < ny; i++) want[arg[i]] += dy[i];
    for (int64_t i = 0; i < nx; i++) assert_true(dx[i] == want[i]);
    int64_t fs[4] = { PN, PH, PW, PC };
    dpar_buffer *f = t_buf(RT, 0, DPAR_F32, 4, fs, NULL);
    T_ERR(dpar_max_pool2d_backward(bdx, bdy, f, &pool_d[0]), DPAR_ERR_DTYPE, "dpar_max_pool2d_backward", "f32", "f64");
    T_ERR(dpar_avg_pool2d(by, f, &pool_d[0]), DPAR_ERR_DTYPE, "dpar_avg_pool2d", "f32", "f64");
    dpar_buffer *bufs[] = { bx, by, bdy, bdx, f };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(x);
    free(dy);
}

/* ---- embedding (+ backward), where, dropout, matmul_batched ---- */
static void test_embed_where_dropout(void **st) {
    (void)st;
    enum { V = 5, D = 3, K = 6 };
    int64_t ts[2] = { V, D }, os[2] = { K, D }, k = K;
    int32_t idx[K] = { 4, 0, 4, 2, 1, 4 };
    double *tab = rnd_n(V * D, 121), *dout = rnd_n(K * D, 122), o[K * D], dt[V * D], want[V * D];
    dpar_buffer *bt = mkd(2, ts, tab), *bo = mkd(2, os, NULL), *bdo = mkd(2, os, dout), *bdt = mkd(2, ts, tab);
    dpar_buffer *bi = t_buf(RT, 0, DPAR_I32, 1, &k, idx);
    T_OK(dpar_embedding(bo, bt, bi));
    t_read(bo, o);
    for (int i = 0; i < K; i++)
        for (int d = 0; d < D; d++) assert_true(o[i * D + d] == tab[idx[i] * D + d]);
    T_OK(dpar_embedding_backward(bdt, bdo, bi, 0.5f)); /* dtable = 0.5 dtable + rows, positions in order */
    t_read(bdt, dt);
    for (int i = 0; i < V * D; i++) want[i] = tab[i] * 0.5;
    for (int i = 0; i < K; i++)
        for (int d = 0; d < D; d++) want[idx[i] * D + d] += dout[i * D + d];
    for (int i = 0; i < V * D; i++) assert_true(dt[i] == want[i]);
    int64_t fs[2] = { V, D };
    dpar_buffer *f = t_buf(RT, 0, DPAR_F32, 2, fs, NULL);
    T_ERR(dpar_embedding(bo, f, bi), DPAR_ERR_DTYPE, "dpar_embedding", "table is f32", "f64");
    /* where: cond i32 broadcast over rows, or f64; a scalar for a missing branch */
    int64_t cs[2] = { 1, D }, n18 = K * D;
    int32_t ci[D] = { 1, 0, 7 };
    dpar_buffer *bci = t_buf(RT, 0, DPAR_I32, 2, cs, ci), *bw = mkd(2, os, NULL);
    T_OK(dpar_where(bw, bci, bo, NULL, 0.0f, -2.5f));
    double wv[K * D];
    t_read(bw, wv);
    for (int i = 0; i < K * D; i++) assert_true(wv[i] == (ci[i % D] ? o[i] : -2.5));
    T_OK(dpar_where(bw, bdo, bo, bdo, 0.0f, 0.0f)); /* f64 cond: nonzero picks a */
    t_read(bw, wv);
    for (int i = 0; i < K * D; i++) assert_true(wv[i] == (dout[i] != 0.0 ? o[i] : dout[i]));
    dpar_buffer *fo = t_buf(RT, 0, DPAR_F32, 1, &n18, NULL);
    T_ERR(dpar_where(bw, bci, bo, fo, 0.0f, 0.0f), DPAR_ERR_DTYPE, "dpar_where", "b is f32", "f64");
    dpar_buffer *fc = t_buf(RT, 0, DPAR_F32, 2, os, NULL);
    T_ERR(dpar_where(bw, fc, bo, NULL, 0.0f, 0.0f), DPAR_ERR_DTYPE, "dpar_where", "cond is f32", "y is f64");
    dpar_buffer_destroy(fc);
    /* dropout: the f32 op's mask, x scaled by 1 / (1 - rate) in double */
    double dx[K * D];
    float xf[K * D], yf[K * D];
    for (int i = 0; i < K * D; i++) xf[i] = (float)dout[i] + 3.0f; /* nonzero: kept shows */
    for (int i = 0; i < K * D; i++) dx[i] = xf[i];
    T_OK(dpar_buffer_write(bdo, 0, dx, sizeof dx));
    T_OK(dpar_buffer_write(fo, 0, xf, sizeof xf));
    dpar_buffer *fy = t_buf(RT, 0, DPAR_F32, 1, &n18, NULL), *by = mkd(2, os, NULL);
    T_OK(dpar_dropout(by, bdo, 0.3f, 42, 7, 1));
    T_OK(dpar_dropout(fy, fo, 0.3f, 42, 7, 1));
    t_read(by, wv);
    t_read(fy, yf);
    int kept = 0;
    for (int i = 0; i < K * D; i++) {
        assert_true((yf[i] != 0.0f) == (wv[i] != 0.0));
        assert_true(wv[i] == (yf[i] != 0.0f ? dx[i] * (1.0 / (1.0 - (double)0.3f)) : 0.0));
        kept += wv[i] != 0.0;
    }
    assert_true(kept > 0 && kept < K * D);
    T_ERR(dpar_dropout(by, fo, 0.3f, 42, 7, 1), DPAR_ERR_DTYPE, "dpar_dropout", "x is f32", "f64");
    dpar_buffer *bufs[] = { bt, bo, bdo, bdt, bi, f, bci, bw, fo, fy, by };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(tab);
    free(dout);
}
static void test_matmul_batched(void **st) {
    (void)st;
    enum { NB = 3, M = 5, K = 7, N = 4 };
    int64_t as[3] = { NB, M, K }, ats[3] = { NB, K, M }, bs3[3] = { NB, K, N }, b2[2] = { N, K }, cs[3] = { NB, M, N };
    double *a = rnd_n(NB * M * K, 131), *b = rnd_n(NB * K * N, 132), *c0 = rnd_n(NB * M * N, 133), c[NB * M * N];
    for (int ta = 0; ta < 2; ta++)
        for (int shared = 0; shared < 2; shared++) { /* shared: one 2-d B, transposed */
            dpar_buffer *ba = mkd(3, ta ? ats : as, a), *bb = shared ? mkd(2, b2, b) : mkd(3, bs3, b),
                        *bc = mkd(3, cs, c0);
            T_OK(dpar_matmul_batched(bc, ba, bb, ta != 0, shared != 0, 0.5f, -0.25f));
            t_read(bc, c);
            for (int q = 0; q < NB; q++)
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double acc = 0;
                        for (int p = 0; p < K; p++)
                            acc += a[q * M * K + (ta ? p * M + i : i * K + p)] *
                                   (shared ? b[j * K + p] : b[q * K * N + p * N + j]);
                        int o = (q * M + i) * N + j;
                        near("matmul_batched", o, c[o], 0.5 * acc - 0.25 * c0[o], 1e-12, 1.0);
                    }
            dpar_buffer_destroy(ba);
            dpar_buffer_destroy(bb);
            dpar_buffer_destroy(bc);
        }
    dpar_buffer *ba = mkd(3, as, a), *bc = mkd(3, cs, NULL), *fb = t_buf(RT, 0, DPAR_F32, 3, bs3, NULL);
    T_ERR(dpar_matmul_batched(bc, ba, fb, false, false, 1.0f, 0.0f), DPAR_ERR_DTYPE, "dpar_matmul_batched", "B is f32",
          "f64");
    dpar_buffer_destroy(ba);
    dpar_buffer_destroy(bc);
    dpar_buffer_destroy(fb);
    free(a);
    free(b);
    free(c0);
}

/* ---- attention (+ backward): a double reference, gradients against central differences ---- */
enum { AB = 2, AT = 4, AD = 3, AV = 2 };
static void attn_ref(const double *q, const double *k, const double *v, int causal, double *out) {
    for (int b = 0; b < AB; b++)
        for (int i = 0; i < AT; i++) {
            double s[AT], mx = -INFINITY, se = 0;
            int nj = causal ? i + 1 : AT;
            for (int j = 0; j < nj; j++) {
                s[j] = 0;
                for (int d = 0; d < AD; d++) s[j] += q[(b * AT + i) * AD + d] * k[(b * AT + j) * AD + d];
                s[j] *= 0.5;
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < nj; j++) se += exp(s[j] - mx);
            for (int e = 0; e < AV; e++) {
                double acc = 0;
                for (int j = 0; j < nj; j++) acc += exp(s[j] - mx) / se * v[(b * AT + j) * AV + e];
                out[(b * AT + i) * AV + e] = acc;
            }
        }
}
static dpar_status attn_fwd(fd_case *c) {
    return dpar_attention(c->out, NULL, c->u[0], c->u[1], c->u[2], 0.5f, c->u[3] != NULL);
}
static void test_attention(void **st) {
    (void)st;
    int64_t qs[3] = { AB, AT, AD }, vs[3] = { AB, AT, AV }, ss[3] = { AB, AT, 2 };
    double *q = rnd_n(AB * AT * AD, 141), *k = rnd_n(AB * AT * AD, 142), *v = rnd_n(AB * AT * AV, 143),
           *dout = rnd_n(AB * AT * AV, 144), out[AB * AT * AV], ref[AB * AT * AV], dq[AB * AT * AD], dk[AB * AT * AD],
           dv[AB * AT * AV];
    dpar_buffer *bq = mkd(3, qs, q), *bk = mkd(3, qs, k), *bv = mkd(3, vs, v), *bo = mkd(3, vs, NULL),
                *bst = mkd(3, ss, NULL), *bdo = mkd(3, vs, dout), *bdq = mkd(3, qs, NULL), *bdk = mkd(3, qs, NULL),
                *bdv = mkd(3, vs, NULL);
    for (int causal = 0; causal < 2; causal++) {
        T_OK(dpar_attention(bo, bst, bq, bk, bv, 0.5f, causal != 0));
        t_read(bo, out);
        attn_ref(q, k, v, causal, ref);
        for (int i = 0; i < AB * AT * AV; i++) near("attention", i, out[i], ref[i], 1e-12, 1.0);
        T_OK(dpar_attention_backward(bdq, bdk, bdv, bst, bdo, bq, bk, bv, 0.5f, causal != 0));
        t_read(bdq, dq);
        t_read(bdk, dk);
        t_read(bdv, dv);
        /* h = 1e-5: truncation ~h^2, rounding ~1e-16 / h; both under 1e-8 of the O(1) gradients */
        fd_case c = { attn_fwd, bo, dout, AB * AT * AV, { bq, bk, bv, causal ? bq : NULL } };
        fd_check("attention dq vs central differences", &c, q, bq, AB * AT * AD, dq, 1e-5, 1e-8);
        fd_check("attention dk vs central differences", &c, k, bk, AB * AT * AD, dk, 1e-5, 1e-8);
        fd_check("attention dv vs central differences", &c, v, bv, AB * AT * AV, dv, 1e-5, 1e-8);
    }
    dpar_buffer *fs = t_buf(RT, 0, DPAR_F32, 3, ss, NULL), *fq = t_buf(RT, 0, DPAR_F32, 3, qs, NULL);
    T_ERR(dpar_attention(bo, fs, bq, bk, bv, 0.5f, false), DPAR_ERR_DTYPE, "dpar_attention", "stats is f32", "f64");
    T_ERR(dpar_attention(bo, bst, bq, fq, bv, 0.5f, false), DPAR_ERR_DTYPE, "dpar_attention", "f32", "f64");
    T_ERR(dpar_attention_backward(bdq, NULL, NULL, bst, bdo, fq, bk, bv, 0.5f, false), DPAR_ERR_DTYPE,
          "dpar_attention_backward", "f32", "f64");
    dpar_buffer *bufs[] = { bq, bk, bv, bo, bst, bdo, bdq, bdk, bdv, fs, fq };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    free(q);
    free(k);
    free(v);
    free(dout);
}

/* ---- refusals: mixed dtypes, ops without an f64 kernel ---- */
/* ---- the layer nodes in an f64 graph (issue 13). Each case is one node on params (leaves) and the
   loss L = sum(out * r), r random: the graph's gradient against fourth-order central differences of
   its own f64 forward, and the node's output (and, where the graph runs one eager call per gradient,
   the gradients) bit for bit the eager f64 op on the same buffers. Sizes are odd (5, 7, 11, ...), so
   no tile of the blocked GEMM, im2col or attention is full. Tolerance: |graph - fd| <= 1e-9 max(|fd|,
   1). With h = 1e-3 the truncation error is h^4 L^(5) / 30 ~ 1e-13 (these losses are polynomial in
   each leaf, or exp of O(1) values), and L (|L| < 1e3, summed in double) rounds to ~1e-13, which the
   difference quotient magnifies by 1.5 / h to ~2e-10: 1e-9 leaves a factor of 5, and f32 (rounding
   ~1e-5 relative) would miss it by four orders of magnitude. ---- */
enum { LN = 4 }; /* leaves per case, at most */
typedef struct lcase {
    const char *name;
    int n;             /* leaves */
    dpar_dtype dt[LN]; /* f64, or i32 (indices: values mod imax) */
    int nd[LN];
    int64_t sh[LN][4];
    int imax;        /* i32 leaves: 0 .. imax - 1 */
    unsigned nograd; /* leaves not differentiated (bit k: leaf k) */
    bool no_fd;      /* dropout: each run draws a new mask (the step is the run count), so two runs' losses are not
                   one function; its gradient, linear in the cotangent, is checked exact against the eager op */
    dpar_value (*build)(dpar_graph *g, const dpar_value *p);
    dpar_status (*eager)(dpar_buffer *y, dpar_buffer *const *p);
    /* the gradient of leaf k with cotangent ct, eager (NULL: not one eager call per gradient) */
    dpar_status (*eager_grad)(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p);
} lcase;

static const dpar_conv2d_desc gconv_d = { { 2, 1 }, { 1, 2 }, DPAR_PADDING_EXPLICIT, { { 1, 1 }, { 2, 0 } } };
static dpar_value b_bmm_tb(dpar_graph *g, const dpar_value *p) {
    return dpar_g_matmul_batched(g, p[0], p[1], false, true);
}
static dpar_status e_bmm_tb(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_matmul_batched(y, p[0], p[1], false, true, 1.0f, 0.0f);
}
static dpar_value b_bmm_ta(dpar_graph *g, const dpar_value *p) {
    return dpar_g_matmul_batched(g, p[0], p[1], true, false);
}
static dpar_status e_bmm_ta(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_matmul_batched(y, p[0], p[1], true, false, 1.0f, 0.0f);
}
static dpar_value b_bmm_shared(dpar_graph *g, const dpar_value *p) {
    return dpar_g_matmul_batched(g, p[0], p[1], false, false);
}
static dpar_status e_bmm_shared(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_matmul_batched(y, p[0], p[1], false, false, 1.0f, 0.0f);
}
static dpar_value b_attn(dpar_graph *g, const dpar_value *p) {
    return dpar_g_attention(g, p[0], p[1], p[2], 0.5f, false);
}
static dpar_value b_attn_causal(dpar_graph *g, const dpar_value *p) {
    return dpar_g_attention(g, p[0], p[1], p[2], 0.0f, true);
}
/* the eager attention of the two cases: causal where Tq == Tk, as the second case is */
static bool attn_causal(dpar_buffer *const *p) {
    int nd = dpar_buffer_ndim(p[0]);
    return dpar_buffer_dim(p[0], nd - 2) == dpar_buffer_dim(p[1], nd - 2);
}
static dpar_status e_attn(dpar_buffer *y, dpar_buffer *const *p) {
    bool c = attn_causal(p);
    return dpar_attention(y, NULL, p[0], p[1], p[2], c ? 0.0f : 0.5f, c);
}
static dpar_status eg_attn(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p) {
    bool c = attn_causal(p);
    int nd = dpar_buffer_ndim(ct);
    int64_t ys[DPAR_MAX_DIMS], st[2] = { dpar_buffer_count(ct) / dpar_buffer_dim(ct, nd - 1), 2 };
    for (int d = 0; d < nd; d++) ys[d] = dpar_buffer_dim(ct, d);
    dpar_buffer *y = t_buf(RT, 0, DPAR_F64, nd, ys, NULL), *s = t_buf(RT, 0, DPAR_F64, 2, st, NULL);
    dpar_status r = dpar_attention(y, s, p[0], p[1], p[2], c ? 0.0f : 0.5f, c); /* the stats of the forward */
    if (!r)
        r = dpar_attention_backward(k == 0 ? dx : NULL, k == 1 ? dx : NULL, k == 2 ? dx : NULL, s, ct, p[0], p[1], p[2],
                                    c ? 0.0f : 0.5f, c);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(s);
    return r;
}
static dpar_value b_conv(dpar_graph *g, const dpar_value *p) {
    return dpar_g_conv2d(g, p[0], p[1], p[2], &gconv_d);
}
static dpar_status e_conv(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_conv2d(y, p[0], p[1], p[2], &gconv_d);
}
static dpar_status eg_conv(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p) {
    return k == 0   ? dpar_conv2d_backward_input(dx, ct, p[1], &gconv_d)
           : k == 1 ? dpar_conv2d_backward_kernel(dx, NULL, p[0], ct, &gconv_d)
                    : dpar_bias_grad(dx, ct, 0.0f);
}
static dpar_value b_conv_same(dpar_graph *g, const dpar_value *p) {
    return dpar_g_conv2d(g, p[0], p[1], (dpar_value){ 0 }, NULL); /* SAME, stride 1, no bias */
}
static dpar_status e_conv_same(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_conv2d(y, p[0], p[1], NULL, NULL);
}
static dpar_status eg_conv_same(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p) {
    return k == 0 ? dpar_conv2d_backward_input(dx, ct, p[1], NULL)
                  : dpar_conv2d_backward_kernel(dx, NULL, p[0], ct, NULL);
}
static dpar_value b_avg(dpar_graph *g, const dpar_value *p) {
    return dpar_g_avg_pool2d(g, p[0], &pool_d[1]);
}
static dpar_status e_avg(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_avg_pool2d(y, p[0], &pool_d[1]);
}
static dpar_status eg_avg(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p) {
    (void)k, (void)p;
    return dpar_avg_pool2d_backward(dx, ct, &pool_d[1]);
}
static dpar_value b_max(dpar_graph *g, const dpar_value *p) {
    return dpar_g_max_pool2d(g, p[0], &pool_d[0]);
}
static dpar_status e_max(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_max_pool2d(y, p[0], &pool_d[0]);
}
static dpar_status eg_max(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p) {
    (void)k;
    return dpar_max_pool2d_backward(dx, ct, p[0], &pool_d[0]);
}
static dpar_value b_embed(dpar_graph *g, const dpar_value *p) {
    return dpar_g_embedding(g, p[0], p[1]);
}
static dpar_status e_embed(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_embedding(y, p[0], p[1]);
}
static dpar_status eg_embed(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p) {
    (void)k;
    return dpar_embedding_backward(dx, ct, p[1], 0.0f);
}
static dpar_value b_drop(dpar_graph *g, const dpar_value *p) {
    return dpar_g_dropout(g, p[0], 0.5f, 42);
}
static dpar_status e_drop(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_dropout(y, p[0], 0.5f, 42, 0, 0); /* step 0 (no optimizer: the count stays 0), device 0 */
}
static dpar_status eg_drop(int k, dpar_buffer *dx, dpar_buffer *ct, dpar_buffer *const *p) {
    (void)k, (void)p;
    return dpar_dropout(dx, ct, 0.5f, 42, 0, 0);
}
static dpar_value b_where(dpar_graph *g, const dpar_value *p) {
    return dpar_g_where(g, p[0], p[1], p[2]);
}
static dpar_status e_where(dpar_buffer *y, dpar_buffer *const *p) {
    return dpar_where(y, p[0], p[1], p[2], 0.0f, 0.0f);
}

#define F64 DPAR_F64
static const lcase layer_cases[] = {
    { .name = "matmul_batched [3,5,7] @ [3,6,7]^T",
      .n = 2,
      .dt = { F64, F64 },
      .nd = { 3, 3 },
      .sh = { { 3, 5, 7 }, { 3, 6, 7 } },
      .build = b_bmm_tb,
      .eager = e_bmm_tb },
    { .name = "matmul_batched [2,7,5]^T @ [2,7,6]",
      .n = 2,
      .dt = { F64, F64 },
      .nd = { 3, 3 },
      .sh = { { 2, 7, 5 }, { 2, 7, 6 } },
      .build = b_bmm_ta,
      .eager = e_bmm_ta },
    { .name = "matmul_batched [2,5,7] @ shared [7,6]",
      .n = 2,
      .dt = { F64, F64 },
      .nd = { 3, 2 },
      .sh = { { 2, 5, 7 }, { 7, 6 } },
      .build = b_bmm_shared,
      .eager = e_bmm_shared },
    { .name = "attention q [2,5,4] k [2,7,4] v [2,7,3]",
      .n = 3,
      .dt = { F64, F64, F64 },
      .nd = { 3, 3, 3 },
      .sh = { { 2, 5, 4 }, { 2, 7, 4 }, { 2, 7, 3 } },
      .build = b_attn,
      .eager = e_attn,
      .eager_grad = eg_attn },
    { .name = "attention causal [2,5,4] v [2,5,3]",
      .n = 3,
      .dt = { F64, F64, F64 },
      .nd = { 3, 3, 3 },
      .sh = { { 2, 5, 4 }, { 2, 5, 4 }, { 2, 5, 3 } },
      .build = b_attn_causal,
      .eager = e_attn,
      .eager_grad = eg_attn },
    { .name = "conv2d [2,7,6,3] * [3,2,3,5] + b, strided, dilated",
      .n = 3,
      .dt = { F64, F64, F64 },
      .nd = { 4, 4, 1 },
      .sh = { { 2, 7, 6, 3 }, { 3, 2, 3, 5 }, { 5 } },
      .build = b_conv,
      .eager = e_conv,
      .eager_grad = eg_conv },
    { .name = "conv2d [1,5,5,2] * [3,3,2,3] SAME",
      .n = 2,
      .dt = { F64, F64 },
      .nd = { 4, 4 },
      .sh = { { 1, 5, 5, 2 }, { 3, 3, 2, 3 } },
      .build = b_conv_same,
      .eager = e_conv_same,
      .eager_grad = eg_conv_same },
    { .name = "avg_pool2d [2,7,6,3] 3x2, padded, in-image count",
      .n = 1,
      .dt = { F64 },
      .nd = { 4 },
      .sh = { { 2, 7, 6, 3 } },
      .build = b_avg,
      .eager = e_avg,
      .eager_grad = eg_avg },
    { .name = "max_pool2d [2,7,6,3] 3x2, padded",
      .n = 1,
      .dt = { F64 },
      .nd = { 4 },
      .sh = { { 2, 7, 6, 3 } },
      .build = b_max,
      .eager = e_max,
      .eager_grad = eg_max },
    { .name = "embedding [11,5] at i32 [3,5] (rows repeat)",
      .n = 2,
      .dt = { F64, DPAR_I32 },
      .nd = { 2, 2 },
      .sh = { { 11, 5 }, { 3, 5 } },
      .imax = 11,
      .nograd = 2,
      .build = b_embed,
      .eager = e_embed,
      .eager_grad = eg_embed },
    { .name = "dropout [5,7] rate 0.5",
      .n = 1,
      .dt = { F64 },
      .nd = { 2 },
      .sh = { { 5, 7 } },
      .build = b_drop,
      .eager = e_drop,
      .eager_grad = eg_drop,
      .no_fd = true },
    { .name = "where f64 cond [5,1], a [5,7], b [7]",
      .n = 3,
      .dt = { F64, F64, F64 },
      .nd = { 2, 2, 1 },
      .sh = { { 5, 1 }, { 5, 7 }, { 7 } },
      .nograd = 1,
      .build = b_where,
      .eager = e_where },
    { .name = "where i32 cond [7], a [5,7], b [5,7]",
      .n = 3,
      .dt = { DPAR_I32, F64, F64 },
      .nd = { 1, 2, 2 },
      .sh = { { 7 }, { 5, 7 }, { 5, 7 } },
      .imax = 2,
      .nograd = 1,
      .build = b_where,
      .eager = e_where },
};
#undef F64

static int64_t lcount(int nd, const int64_t *sh) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= sh[d];
    return n;
}
/* the graph's loss read in double (dpar_graph_run rounds it to float) */
static double graph_loss0(dpar_graph *g, dpar_value loss) {
    double l = 0;
    T_OK(dpar_graph_run(g, NULL, 0, NULL));
    T_OK(dpar_graph_get(g, loss, &l));
    return l;
}
static double fd_worst; /* the largest |graph - fd| / max(|fd|, 1) seen, printed */
static int64_t fd_count;
/* fourth-order central differences of the graph's loss in every element of leaf array a (host copy x) */
static void graph_fd(const char *what, dpar_graph *g, dpar_value loss, dpar_array *a, double *x, int64_t n,
                     const double *grad) {
    const double h = 1e-3, off[4] = { 2 * h, h, -h, -2 * h };
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i], l[4];
        for (int j = 0; j < 4; j++) {
            x[i] = keep + off[j];
            T_OK(dpar_array_put(a, x));
            l[j] = graph_loss0(g, loss);
        }
        x[i] = keep;
        T_OK(dpar_array_put(a, x));
        double fd = (8.0 * (l[1] - l[2]) - (l[0] - l[3])) / (12.0 * h);
        fd_worst = fmax(fd_worst, fabs(grad[i] - fd) / fmax(fabs(fd), 1.0)), fd_count++;
        if (!(fabs(grad[i] - fd) <= 1e-9 * fmax(fabs(fd), 1.0)))
            fail_msg("%s: d L / d [%lld]: graph %.17g, central differences %.17g", what, (long long)i, grad[i], fd);
    }
}
static void layer_case(const lcase *c, uint64_t seed) {
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_array *a[LN + 1];
    dpar_value p[LN + 1], wrt[LN], gr[LN];
    void *x[LN + 1];
    dpar_buffer *pb[LN + 1];
    int nw = 0, at[LN];
    for (int k = 0; k < c->n; k++) {
        dpar_array_desc d = { c->dt[k], c->nd[k], { 0 }, { NULL } };
        memcpy(d.shape, c->sh[k], sizeof c->sh[k]);
        int64_t n = lcount(c->nd[k], c->sh[k]);
        T_OK(dpar_array_create(m, &d, &a[k]));
        if (c->dt[k] == DPAR_I32) {
            int32_t *v = malloc((size_t)(n + 1) * sizeof(int32_t));
            for (int64_t i = 0; i < n; i++) v[i] = (int32_t)((i * 7 + 3) % c->imax);
            x[k] = v;
        } else {
            x[k] = rnd_n(n, seed + (uint64_t)k);
        }
        T_OK(dpar_array_put(a[k], x[k]));
        pb[k] = dpar_array_shard(a[k], 0);
        p[k] = dpar_g_param(g, NULL, a[k]);
        if (!(c->nograd >> k & 1u)) at[nw] = k, wrt[nw++] = p[k];
    }
    dpar_value out = c->build(g, p);
    T_OK(dpar_graph_status(g));
    dpar_dtype ot;
    int ond;
    int64_t osh[DPAR_MAX_DIMS];
    T_OK(dpar_graph_value_shape(g, out, &ot, &ond, osh));
    assert_int_equal(ot, DPAR_F64);
    int64_t no = lcount(ond, osh);
    dpar_array_desc rd = { DPAR_F64, ond, { 0 }, { NULL } };
    memcpy(rd.shape, osh, sizeof rd.shape);
    T_OK(dpar_array_create(m, &rd, &a[c->n]));
    x[c->n] = rnd_n(no, seed + 17);
    T_OK(dpar_array_put(a[c->n], x[c->n]));
    pb[c->n] = dpar_array_shard(a[c->n], 0);
    p[c->n] = dpar_g_param(g, "r", a[c->n]);
    dpar_value loss = dpar_g_sum(g, dpar_g_binary(g, out, p[c->n], DPAR_BINARY_MUL));
    T_OK(dpar_graph_keep(g, out));
    T_OK(dpar_graph_value_and_grad(g, loss, wrt, nw, gr));
    T_OK(dpar_graph_compile(g, NULL));
    graph_loss0(g, loss);
    /* the forward and the gradients: bit for bit the eager f64 calls */
    double *got = malloc((size_t)(no + 1) * sizeof(double)), *want = malloc((size_t)(no + 1) * sizeof(double));
    dpar_buffer *y = t_buf(RT, 0, DPAR_F64, ond, osh, NULL);
    T_OK(dpar_graph_get(g, out, got));
    T_OK(c->eager(y, pb));
    t_read(y, want);
    if (memcmp(got, want, (size_t)no * sizeof(double)))
        fail_msg("%s: the graph's forward differs from the eager f64 op", c->name);
    double *an[LN];
    for (int j = 0; j < nw; j++) {
        int k = at[j];
        int64_t n = lcount(c->nd[k], c->sh[k]);
        an[j] = malloc((size_t)(n + 1) * sizeof(double));
        T_OK(dpar_graph_get(g, gr[j], an[j]));
        if (!c->eager_grad) continue;
        dpar_buffer *dx = t_buf(RT, 0, DPAR_F64, c->nd[k], c->sh[k], NULL);
        double *e = malloc((size_t)(n + 1) * sizeof(double));
        T_OK(c->eager_grad(k, dx, pb[c->n], pb)); /* the cotangent of out is r exactly */
        t_read(dx, e);
        if (memcmp(e, an[j], (size_t)n * sizeof(double)))
            fail_msg("%s: the graph's gradient of leaf %d differs from the eager f64 backward", c->name, k);
        free(e);
        dpar_buffer_destroy(dx);
    }
    for (int j = 0; j < nw && !c->no_fd; j++) {
        char what[160];
        snprintf(what, sizeof what, "%s, leaf %d", c->name, at[j]);
        graph_fd(what, g, loss, a[at[j]], x[at[j]], lcount(c->nd[at[j]], c->sh[at[j]]), an[j]);
    }
    for (int j = 0; j < nw; j++) free(an[j]);
    free(got);
    free(want);
    dpar_buffer_destroy(y);
    T_OK(dpar_graph_destroy(g));
    for (int k = 0; k <= c->n; k++) dpar_array_destroy(a[k]), free(x[k]);
    dpar_mesh_destroy(m);
}
static void test_graph_layer_nodes(void **st) {
    (void)st;
    fd_worst = 0, fd_count = 0;
    for (size_t i = 0; i < sizeof layer_cases / sizeof layer_cases[0]; i++) layer_case(&layer_cases[i], 300 + 10 * i);
    print_message("layer nodes: %lld derivatives, worst |graph - fd| / max(|fd|, 1) = %.2g (tolerance 1e-9)\n",
                  (long long)fd_count, fd_worst);
}

/* ---- a tiny CNN and a one-block attention model in f64, end to end: dpar_graph_value_and_grad against
   central differences (as the layer nodes above, tolerance 1e-9), then a compiled graph with an AdamW
   step, and one with SGD (momentum, Nesterov, weight decay, clipping by global norm), whose first step
   moves the params bit for bit as the eager f64 steps do with the gradients of the first graph. The
   inputs and labels are params that are neither differentiated nor updated (so no feeds). ---- */
enum { MP = 10 }; /* leaves per model, at most */
typedef struct mleaf {
    dpar_dtype dt;
    int nd;
    int64_t sh[4];
    int imax;   /* i32: values 0 .. imax - 1 */
    bool input; /* not trained */
    double add; /* added to the random values (a norm's gain near 1) */
} mleaf;
typedef struct mcase {
    const char *name;
    int n;
    mleaf l[MP];
    dpar_value (*build)(dpar_graph *g, const dpar_value *p); /* -> the scalar loss */
} mcase;
/* x [4,7,7,1] -> conv 3x3 SAME (4 channels) + b -> relu -> avg pool 2x2 -> [4,36] -> dense 3 -> xent */
static dpar_value b_cnn(dpar_graph *g, const dpar_value *p) {
    static const dpar_pool2d_desc pd = { { 2, 2 }, { 2, 2 }, DPAR_PADDING_VALID, { { 0, 0 }, { 0, 0 } }, false };
    int64_t flat[2] = { 4, 36 };
    dpar_value h = dpar_g_avg_pool2d(g, dpar_g_relu(g, dpar_g_conv2d(g, p[0], p[2], p[3], NULL)), &pd);
    dpar_value z = dpar_g_bias_add(g, dpar_g_matmul(g, dpar_g_reshape(g, h, 2, flat), p[4], false, false), p[5]);
    return dpar_g_softmax_xent(g, z, p[1]);
}
/* tokens [2,5] -> embedding [7,6] -> causal attention (q, k, v, o projections) + residual -> layer norm ->
   [10,6] @ [6,7] -> xent with labels [10] */
static dpar_value b_attn_block(dpar_graph *g, const dpar_value *p) {
    int64_t flat[2] = { 10, 6 };
    dpar_value h = dpar_g_embedding(g, p[2], p[0]);
    dpar_value q = dpar_g_matmul_batched(g, h, p[3], false, false), k = dpar_g_matmul_batched(g, h, p[4], false, false),
               v = dpar_g_matmul_batched(g, h, p[5], false, false);
    dpar_value o = dpar_g_matmul_batched(g, dpar_g_attention(g, q, k, v, 0.0f, true), p[6], false, false);
    dpar_value n = dpar_g_layer_norm(g, dpar_g_add(g, h, o), p[7], p[8], 1e-5f);
    return dpar_g_softmax_xent(g, dpar_g_matmul(g, dpar_g_reshape(g, n, 2, flat), p[9], false, false), p[1]);
}
#define F64 DPAR_F64
static const mcase model_cases[] = {
    { .name = "cnn",
      .n = 6,
      .build = b_cnn,
      .l = { { F64, 4, { 4, 7, 7, 1 }, 0, true, 0 },
             { DPAR_I32, 1, { 4 }, 3, true, 0 },
             { F64, 4, { 3, 3, 1, 4 }, 0, false, 0 },
             { F64, 1, { 4 }, 0, false, 0 },
             { F64, 2, { 36, 3 }, 0, false, 0 },
             { F64, 1, { 3 }, 0, false, 0 } } },
    { .name = "attention block",
      .n = 10,
      .build = b_attn_block,
      .l = { { DPAR_I32, 2, { 2, 5 }, 7, true, 0 },
             { DPAR_I32, 1, { 10 }, 7, true, 0 },
             { F64, 2, { 7, 6 }, 0, false, 0 },
             { F64, 2, { 6, 6 }, 0, false, 0 },
             { F64, 2, { 6, 6 }, 0, false, 0 },
             { F64, 2, { 6, 6 }, 0, false, 0 },
             { F64, 2, { 6, 6 }, 0, false, 0 },
             { F64, 1, { 6 }, 0, false, 1.5 },
             { F64, 1, { 6 }, 0, false, 0 },
             { F64, 2, { 6, 7 }, 0, false, 0 } } },
};
#undef F64
typedef struct mopt {
    bool adamw;
    dpar_sgd_desc sd;
    dpar_adamw_desc ad;
    int n;
} mopt;
/* the eager step on shards: params, grads, then the state (momentum; AdamW m, v), n of each */
static dpar_status model_opt_fn(dpar_ctx *ctx, void *user) {
    const mopt *o = (const mopt *)user;
    dpar_buffer *b[DPAR_MAX_ARGS];
    int n = o->n;
    for (int i = 0; i < (o->adamw ? 4 : 3) * n; i++) b[i] = dpar_ctx_arg(ctx, i);
    return o->adamw ? dpar_adamw_step(ctx, &o->ad, b, b + n, b + 2 * n, b + 3 * n, n, 1)
                    : dpar_sgd_step(ctx, &o->sd, b, b + n, b + 2 * n, n);
}
/* builds c on the leaves' arrays; with o, adds its optimizer node; returns the graph, compiled */
static dpar_graph *model_graph(dpar_mesh *m, const mcase *c, dpar_array *const *a, const mopt *o, dpar_value *loss,
                               dpar_value *gr, dpar_graph_stats *stats) {
    dpar_graph *g = NULL;
    dpar_value p[MP], wrt[MP];
    int nw = 0;
    T_OK(dpar_graph_create(m, &g));
    for (int k = 0; k < c->n; k++) {
        p[k] = dpar_g_param(g, NULL, a[k]);
        if (!c->l[k].input) wrt[nw++] = p[k];
    }
    *loss = c->build(g, p);
    T_OK(dpar_graph_status(g));
    T_OK(dpar_graph_value_and_grad(g, *loss, wrt, nw, gr));
    if (o && o->adamw) T_OK(dpar_graph_adamw(g, &o->ad, wrt, gr, nw));
    if (o && !o->adamw) T_OK(dpar_graph_sgd(g, &o->sd, wrt, gr, nw));
    T_OK(dpar_graph_compile(g, stats));
    return g;
}
static void model_case(const mcase *c, uint64_t seed) {
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_array *a[MP];
    void *x[MP];
    int64_t cnt[MP], total = 0;
    int nw = 0, at[MP];
    for (int k = 0; k < c->n; k++) {
        const mleaf *l = &c->l[k];
        dpar_array_desc d = { l->dt, l->nd, { 0 }, { NULL } };
        memcpy(d.shape, l->sh, sizeof l->sh);
        cnt[k] = lcount(l->nd, l->sh);
        T_OK(dpar_array_create(m, &d, &a[k]));
        if (l->dt == DPAR_I32) {
            int32_t *v = malloc((size_t)(cnt[k] + 1) * sizeof(int32_t));
            for (int64_t i = 0; i < cnt[k]; i++) v[i] = (int32_t)((i * 5 + 2 + k) % l->imax);
            x[k] = v;
        } else {
            double *v = rnd_n(cnt[k], seed + (uint64_t)k);
            for (int64_t i = 0; i < cnt[k]; i++) v[i] = v[i] * 0.5 + l->add;
            x[k] = v;
        }
        T_OK(dpar_array_put(a[k], x[k]));
        if (!l->input) at[nw++] = k, total += cnt[k];
    }
    /* 1. value_and_grad in double against central differences */
    dpar_value loss, gr[MP];
    dpar_graph *g = model_graph(m, c, a, NULL, &loss, gr, NULL);
    double l0 = graph_loss0(g, loss), *an[MP];
    assert_true(isfinite(l0) && l0 > 0);
    for (int j = 0; j < nw; j++) {
        an[j] = malloc((size_t)(cnt[at[j]] + 1) * sizeof(double));
        T_OK(dpar_graph_get(g, gr[j], an[j]));
    }
    for (int j = 0; j < nw; j++) {
        char what[96];
        snprintf(what, sizeof what, "%s, leaf %d", c->name, at[j]);
        graph_fd(what, g, loss, a[at[j]], x[at[j]], cnt[at[j]], an[j]);
    }
    T_OK(dpar_graph_destroy(g));
    /* 2. one optimizer step in the compiled graph == the eager f64 step on those gradients */
    mopt opts[2] = { { .adamw = true, .ad = { .learning_rate = 0.015625f, .weight_decay = 0.125f } },
                     { .adamw = false, .sd = { 0.125f, 0.75f, true, 0.0625f, 0.25f, NULL } } };
    for (int o = 0; o < 2; o++) {
        mopt *op = &opts[o];
        int ns = op->adamw ? 2 : 1;
        op->n = nw;
        dpar_graph_stats gs;
        g = model_graph(m, c, a, op, &loss, gr, &gs);
        assert_int_equal(gs.opt_bytes, (uint64_t)ns * (uint64_t)total * sizeof(double)); /* f64 state */
        double l1 = graph_loss0(g, loss);
        assert_true(l1 == l0); /* the same forward and backward, then the step */
        dpar_array *e[DPAR_MAX_ARGS];
        dpar_shard_map_desc sd = { model_opt_fn, op, (2 + ns) * nw, { NULL } };
        for (int j = 0; j < nw; j++) {
            dpar_array_desc d = { DPAR_F64, c->l[at[j]].nd, { 0 }, { NULL } };
            memcpy(d.shape, c->l[at[j]].sh, sizeof c->l[at[j]].sh);                          /* sh holds 4 dims */
            for (int r = 0; r < 2 + ns; r++) T_OK(dpar_array_create(m, &d, &e[r * nw + j])); /* state: zero */
            T_OK(dpar_array_put(e[j], x[at[j]]));
            T_OK(dpar_array_put(e[nw + j], an[j]));
        }
        for (int i = 0; i < (2 + ns) * nw; i++) sd.args[i] = e[i];
        T_OK(dpar_shard_map(m, &sd));
        for (int j = 0; j < nw; j++) {
            double *gp = malloc((size_t)(cnt[at[j]] + 1) * sizeof(double)),
                   *ep = malloc((size_t)(cnt[at[j]] + 1) * sizeof(double));
            T_OK(dpar_array_get(a[at[j]], gp));
            T_OK(dpar_array_get(e[j], ep));
            if (memcmp(gp, ep, (size_t)cnt[at[j]] * sizeof(double)) || !memcmp(gp, x[at[j]], sizeof(double)))
                fail_msg("%s, %s: param %d after the graph's step differs from the eager f64 step (or did not move)",
                         c->name, op->adamw ? "adamw" : "sgd", at[j]);
            free(gp);
            free(ep);
        }
        for (int i = 0; i < (2 + ns) * nw; i++) dpar_array_destroy(e[i]);
        double last = l1; /* and it trains: 30 more steps lower the loss */
        for (int s = 0; s < 30; s++) last = graph_loss0(g, loss);
        if (!(last < l1))
            fail_msg("%s, %s: loss %.17g after 31 steps, %.17g at the first", c->name, op->adamw ? "adamw" : "sgd",
                     last, l1);
        T_OK(dpar_graph_destroy(g));
        for (int k = 0; k < c->n; k++) T_OK(dpar_array_put(a[k], x[k])); /* the next optimizer starts here too */
    }
    for (int j = 0; j < nw; j++) free(an[j]);
    for (int k = 0; k < c->n; k++) dpar_array_destroy(a[k]), free(x[k]);
    dpar_mesh_destroy(m);
}
static void test_graph_models(void **st) {
    (void)st;
    fd_worst = 0, fd_count = 0;
    for (size_t i = 0; i < sizeof model_cases / sizeof model_cases[0]; i++) model_case(&model_cases[i], 400 + 10 * i);
    print_message("models: %lld derivatives, worst |graph - fd| / max(|fd|, 1) = %.2g (tolerance 1e-9)\n",
                  (long long)fd_count, fd_worst);
}

/* every newly f64 node, and the optimizer node, with one f32 and one f64 operand (either first):
   DPAR_ERR_DTYPE naming the node, both operands and both dtypes */
static void test_graph_layer_mixed(void **st) {
    (void)st;
    static const char *const fns[] = { "dpar_g_matmul_batched", "dpar_g_attention", "dpar_g_conv2d", "dpar_g_where",
                                       "dpar_graph_adamw" };
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    for (int f64_first = 0; f64_first < 2; f64_first++)
        for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++) {
            dpar_graph *g = NULL;
            dpar_array *pa = NULL;
            T_OK(dpar_graph_create(m, &g));
            dpar_array_desc d = { f64_first ? DPAR_F64 : DPAR_F32, 4, { 2, 3, 3, 2 }, { NULL } };
            dpar_value a = dpar_g_feed(g, "a", &d);
            d.dtype = f64_first ? DPAR_F32 : DPAR_F64;
            dpar_value b = dpar_g_feed(g, "b", &d);
            dpar_status s = DPAR_OK;
            const char *names[2] = { "'a'", "'b'" };
            switch (k) {
            case 0: dpar_g_matmul_batched(g, a, b, false, true); break;
            case 1: dpar_g_attention(g, a, b, b, 0.0f, false); break;
            case 2: dpar_g_conv2d(g, a, b, (dpar_value){ 0 }, NULL); break;
            case 3: dpar_g_where(g, a, b, a); break;
            default: { /* param p of a's dtype, gradient b of the other */
                d.dtype = f64_first ? DPAR_F64 : DPAR_F32;
                T_OK(dpar_array_create(m, &d, &pa));
                dpar_value pv = dpar_g_param(g, "p", pa);
                dpar_adamw_desc ad = { .learning_rate = 0.01f };
                s = dpar_graph_adamw(g, &ad, &pv, &b, 1);
                names[0] = "'p'";
            }
            }
            if (k < 4) s = dpar_graph_status(g);
            const char *e = dpar_last_error();
            if (s != DPAR_ERR_DTYPE || !strstr(e, fns[k]) || !strstr(e, "f32") || !strstr(e, "f64") ||
                !strstr(e, names[0]) || !strstr(e, names[1]))
                fail_msg("%s with f32 and f64 (%s first): %s: %s; want DPAR_ERR_DTYPE naming the node, %s, %s and both "
                         "dtypes",
                         fns[k], f64_first ? "f64" : "f32", dpar_status_string(s), e, names[0], names[1]);
            T_OK(dpar_graph_destroy(g));
            dpar_array_destroy(pa);
        }
    dpar_mesh_destroy(m);
}

static void test_refusals(void **st) {
    (void)st;
    int64_t s4 = 4, s22[2] = { 2, 2 }, s1 = 1;
    dpar_buffer *d = t_buf1(RT, DPAR_F64, 4, NULL), *d2 = t_buf1(RT, DPAR_F64, 4, NULL),
                *f = t_buf(RT, 0, DPAR_F32, 1, &s4, NULL);
    dpar_buffer *md = mkd(2, s22, NULL), *mf = t_buf(RT, 0, DPAR_F32, 2, s22, NULL),
                *ld = t_buf1(RT, DPAR_F64, 1, NULL);
    dpar_buffer *lf = t_buf(RT, 0, DPAR_F32, 1, &s1, NULL);
    T_ERR(dpar_binary(d, d2, f, DPAR_BINARY_ADD), DPAR_ERR_DTYPE, "b is f32", "f64");
    T_ERR(dpar_binary(f, f, d, DPAR_BINARY_ADD), DPAR_ERR_DTYPE, "b is f64", "f32");
    T_ERR(dpar_axpy(d, 1.0f, f), DPAR_ERR_DTYPE, "dpar_axpy", "x is f32");
    T_ERR(dpar_copy(d, f), DPAR_ERR_DTYPE, "dpar_cast");
    T_ERR(dpar_matmul(md, md, mf, false, false, 1.0f, 0.0f), DPAR_ERR_DTYPE, "dpar_matmul", "f64");
    T_ERR(dpar_matmul(mf, md, md, false, false, 1.0f, 0.0f), DPAR_ERR_DTYPE, "dpar_matmul", "all three f64");
    T_ERR(dpar_mse(lf, NULL, d, d2), DPAR_ERR_DTYPE, "loss is f32", "f64");
    T_ERR(dpar_softmax(md, mf, false), DPAR_ERR_DTYPE, "dpar_softmax", "x is f32");
    T_ERR(dpar_reduce(lf, d, DPAR_REDUCE_SUM, NULL, 0), DPAR_ERR_DTYPE, "dpar_reduce", "must be f64");
    dpar_loss_scaler ls; /* the loss scaler (mixed precision) has no f64 */
    T_OK(dpar_loss_scaler_init(&ls, &(dpar_loss_scale_desc){ .init_scale = 1024, .growth_interval = 2 }));
    bool fin = false;
    T_ERR(dpar_loss_scaler_unscale(NULL, &ls, &d, 1, NULL, &fin), DPAR_ERR_DTYPE, "dpar_loss_scaler_unscale", "f64");
    dpar_buffer *bufs[] = { d, d2, f, md, mf, ld, lf };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
}

/* ---- every op of the f64 table, called with f32 and f64 mixed: DPAR_ERR_DTYPE naming both dtypes
   (dpar_sum with an f64 result and an f32 input answered DPAR_ERR_SHAPE; the table finds any other) ---- */
enum { MIX_N = 44 };
static dpar_status mixed_call(int k, const char **name) {
    static dpar_buffer *d4, *f4, *d1, *f1, *d22, *f22, *d2, *f2, *lab, *ds, *fs;
    int64_t s4 = 4, s1 = 1, s22[2] = { 2, 2 }, s2 = 2;
    if (k < 0) { /* -1: create the operands, -2: destroy them */
        dpar_buffer **all[] = { &d4, &f4, &d1, &f1, &d22, &f22, &d2, &f2, &lab, &ds, &fs };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            if (k == -2) dpar_buffer_destroy(*all[i]);
            *all[i] = NULL;
        }
        if (k == -2) return DPAR_OK;
        d4 = t_buf1(RT, DPAR_F64, 4, NULL), f4 = t_buf(RT, 0, DPAR_F32, 1, &s4, NULL),
        d1 = t_buf1(RT, DPAR_F64, 1, NULL);
        f1 = t_buf(RT, 0, DPAR_F32, 1, &s1, NULL), d22 = mkd(2, s22, NULL), f22 = t_buf(RT, 0, DPAR_F32, 2, s22, NULL);
        d2 = t_buf1(RT, DPAR_F64, 2, NULL), f2 = t_buf(RT, 0, DPAR_F32, 1, &s2, NULL),
        lab = t_buf(RT, 0, DPAR_I32, 1, &s2, NULL);
        ds = mkd(2, s22, NULL), fs = t_buf(RT, 0, DPAR_F32, 2, s22, NULL); /* norm stats: [rows, 2] */
        return DPAR_OK;
    }
    static const int perm[2] = { 1, 0 };
    static const int64_t start[2] = { 0, 0 }, step[2] = { 1, 1 }, lo[1] = { 0 };
    const dpar_buffer *xs_fd[2] = { f2, d2 }, *xs_dd[2] = { d2, d2 };
    switch (k) {
    case 0: *name = "dpar_sum f64 <- f32"; return dpar_sum(d1, f4);
    case 1: *name = "dpar_sum f32 <- f64"; return dpar_sum(f1, d4);
    case 2: *name = "dpar_sum_squares f64 <- f32"; return dpar_sum_squares(d1, f4);
    case 3: *name = "dpar_sum_squares f32 <- f64"; return dpar_sum_squares(f1, d4);
    case 4: *name = "dpar_mse f32 loss, f64 pred"; return dpar_mse(f1, NULL, d4, d4);
    case 5: *name = "dpar_mse f64 loss, f32 pred"; return dpar_mse(d1, NULL, f4, f4);
    case 6: *name = "dpar_mse f64 pred, f32 target"; return dpar_mse(d1, NULL, d4, f4);
    case 7: *name = "dpar_mse f32 dpred"; return dpar_mse(d1, f4, d4, d4);
    case 8: *name = "dpar_softmax_xent f32 loss, f64 logits"; return dpar_softmax_xent(f1, NULL, d22, lab);
    case 9: *name = "dpar_softmax_xent f64 loss, f32 logits"; return dpar_softmax_xent(d1, NULL, f22, lab);
    case 10: *name = "dpar_softmax_xent f32 dlogits"; return dpar_softmax_xent(d1, f22, d22, lab);
    case 11: *name = "dpar_cross_entropy f32 loss, f64 logits"; return dpar_cross_entropy(f1, NULL, d22, lab, NULL);
    case 12: *name = "dpar_cross_entropy f64 loss, f32 logits"; return dpar_cross_entropy(d1, NULL, f22, lab, NULL);
    case 13: *name = "dpar_reduce f32 <- f64"; return dpar_reduce(f1, d4, DPAR_REDUCE_SUM, NULL, 0);
    case 14: *name = "dpar_reduce f64 <- f32"; return dpar_reduce(d1, f4, DPAR_REDUCE_MEAN, NULL, 0);
    case 15: *name = "dpar_reduce_backward f32 dy"; return dpar_reduce_backward(d4, f1, d4, DPAR_REDUCE_SUM, NULL, 0);
    case 16: *name = "dpar_reduce_backward f32 dx"; return dpar_reduce_backward(f4, d1, d4, DPAR_REDUCE_SUM, NULL, 0);
    case 17: *name = "dpar_binary f32 b"; return dpar_binary(d4, d4, f4, DPAR_BINARY_ADD);
    case 18: *name = "dpar_binary f64 y"; return dpar_binary(d4, f4, f4, DPAR_BINARY_MUL);
    case 19: *name = "dpar_binary_backward f32 dy"; return dpar_binary_backward(d4, d4, f4, d4, d4, DPAR_BINARY_MUL);
    case 20: *name = "dpar_unary f32 x"; return dpar_unary(d4, f4, DPAR_UNARY_EXP, 0.0f);
    case 21: *name = "dpar_unary f64 x"; return dpar_unary(f4, d4, DPAR_UNARY_EXP, 0.0f);
    case 22: *name = "dpar_unary_backward f32 x"; return dpar_unary_backward(d4, d4, f4, DPAR_UNARY_EXP, 0.0f);
    case 23: *name = "dpar_axpy f32 x"; return dpar_axpy(d4, 1.0f, f4);
    case 24: *name = "dpar_axpy f64 x"; return dpar_axpy(f4, 1.0f, d4);
    case 25: *name = "dpar_copy f32 src"; return dpar_copy(d4, f4);
    case 26: *name = "dpar_matmul f32 C"; return dpar_matmul(f22, d22, d22, false, false, 1.0f, 0.0f);
    case 27: *name = "dpar_matmul f32 B"; return dpar_matmul(d22, d22, f22, false, false, 1.0f, 0.0f);
    case 28: *name = "dpar_relu f32 x"; return dpar_relu(d4, f4);
    case 29: *name = "dpar_relu_backward f32 x"; return dpar_relu_backward(d4, d4, f4);
    case 30: *name = "dpar_bias_add f32 b"; return dpar_bias_add(d22, f2);
    case 31: *name = "dpar_bias_grad f32 db"; return dpar_bias_grad(f2, d22, 0.0f);
    case 32: *name = "dpar_softmax f32 x"; return dpar_softmax(d22, f22, false);
    case 33: *name = "dpar_softmax_backward f32 y"; return dpar_softmax_backward(d22, d22, f22, true);
    case 34: *name = "dpar_layer_norm f32 w"; return dpar_layer_norm(d22, NULL, d22, f2, NULL, 1e-5f);
    case 35: *name = "dpar_layer_norm f32 stats"; return dpar_layer_norm(d22, fs, d22, NULL, NULL, 1e-5f);
    case 36: *name = "dpar_rms_norm f32 x"; return dpar_rms_norm(d22, ds, f22, NULL, NULL, 1e-5f);
    case 37:
        *name = "dpar_layer_norm_backward f32 dy";
        return dpar_layer_norm_backward(d22, NULL, NULL, f22, d22, NULL, ds);
    case 38:
        *name = "dpar_rms_norm_backward f32 stats";
        return dpar_rms_norm_backward(d22, NULL, NULL, d22, d22, NULL, fs);
    case 39: *name = "dpar_transpose f32 x"; return dpar_transpose(d22, f22, perm);
    case 40: *name = "dpar_slice f32 x"; return dpar_slice(d22, f22, start, step);
    case 41: *name = "dpar_pad f32 x"; return dpar_pad(d4, f4, lo, 0.0f);
    case 42: *name = "dpar_concat f32 first input"; return dpar_concat(d4, xs_fd, 2, 0);
    default: *name = "dpar_concat f64 inputs into f32"; return dpar_concat(f4, xs_dd, 2, 0);
    }
}
static void test_mixed_dtypes_table(void **st) {
    (void)st;
    const char *name = NULL;
    mixed_call(-1, &name);
    int bad = 0;
    for (int k = 0; k < MIX_N; k++) {
        dpar_status s = mixed_call(k, &name);
        const char *e = dpar_last_error();
        if (s != DPAR_ERR_DTYPE || !strstr(e, "f32") || !strstr(e, "f64")) {
            print_message("%s: %s: %s (want DPAR_ERR_DTYPE naming f32 and f64)\n", name, dpar_status_string(s), e);
            bad++;
        }
    }
    mixed_call(-2, &name);
    /* graphs: an f64 param with an f32 gradient under an optimizer, and a mixed node */
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_graph *g = NULL;
    dpar_array *pa = NULL;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F64, 1, { 4 }, { NULL } }, &pa));
    T_OK(dpar_graph_create(m, &g));
    dpar_value p = dpar_g_param(g, "p", pa),
               grad = dpar_g_feed(g, "g", &(dpar_array_desc){ DPAR_F32, 1, { 4 }, { NULL } });
    dpar_sgd_desc sd = { 0.1f, 0.0f, false, 0.0f, 0.0f, NULL };
    dpar_status s = dpar_graph_sgd(g, &sd, &p, &grad, 1);
    if (s != DPAR_ERR_DTYPE || !strstr(dpar_last_error(), "f64") || !strstr(dpar_last_error(), "f32")) {
        print_message("dpar_graph_sgd on an f64 param, f32 grad: %s: %s\n", dpar_status_string(s), dpar_last_error());
        bad++;
    }
    T_OK(dpar_graph_destroy(g));
    for (int k = 0; k < 2; k++) { /* k = 1: dpar_g_concat answered DPAR_ERR_SHAPE "(or in dtype)" */
        T_OK(dpar_graph_create(m, &g));
        dpar_value ab[2] = { dpar_g_feed(g, "a", &(dpar_array_desc){ DPAR_F64, 1, { 4 }, { NULL } }),
                             dpar_g_feed(g, "b", &(dpar_array_desc){ DPAR_F32, 1, { 4 }, { NULL } }) };
        if (k == 0)
            dpar_g_add(g, ab[0], ab[1]);
        else
            dpar_g_concat(g, ab, 2, 0);
        s = dpar_graph_status(g);
        if (s != DPAR_ERR_DTYPE || !strstr(dpar_last_error(), "f64") || !strstr(dpar_last_error(), "f32")) {
            print_message("%s f64, f32: %s: %s\n", k ? "dpar_g_concat" : "dpar_g_add", dpar_status_string(s),
                          dpar_last_error());
            bad++;
        }
        T_OK(dpar_graph_destroy(g));
    }
    dpar_array_destroy(pa);
    dpar_mesh_destroy(m);
    if (bad) fail_msg("%d mixed f32/f64 call(s) not answered DPAR_ERR_DTYPE naming both dtypes", bad);
}

/* ---- GPU backends have no f64: the buffer (or array) is refused, naming the backend ---- */
static void gpu_refuses(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    int64_t n = 4;
    dpar_buffer *b = NULL;
    T_ERR(dpar_buffer_create(rt, 0, DPAR_F64, 1, &n, &b), DPAR_ERR_DTYPE, "dpar_buffer_create", dpar_backend_name(k),
          "no f64");
    assert_null(b);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_array_desc d = { DPAR_F64, 1, { 4 }, { NULL } };
    dpar_array *a = NULL;
    T_ERR(dpar_array_create(m, &d, &a), DPAR_ERR_DTYPE, "dpar_array_create", dpar_backend_name(k), "no f64");
    assert_null(a);
    dpar_graph *g = NULL; /* an f64 feed of a graph: refused when it is added, the graph then keeps the error */
    T_OK(dpar_graph_create(m, &g));
    dpar_value f = dpar_g_feed(g, "x", &d);
    assert_int_equal(f.id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_DTYPE, dpar_backend_name(k), "no f64", "cpu");
    T_ERR(dpar_graph_compile(g, NULL), DPAR_ERR_DTYPE, dpar_backend_name(k), "no f64");
    T_OK(dpar_graph_destroy(g));
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}
static void test_vulkan_refuses_f64(void **st) {
    (void)st;
    gpu_refuses(DPAR_BACKEND_VULKAN);
}
static void test_cuda_refuses_f64(void **st) {
    (void)st;
    gpu_refuses(DPAR_BACKEND_CUDA);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_copy_axpy_scale),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_f64_keeps_what_f32_loses),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary_broadcast),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_losses),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_shape_ops),
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_mixed_dtypes_table),
        cmocka_unit_test(test_graph_gradcheck),
        cmocka_unit_test(test_graph_mixed_refused),
        cmocka_unit_test(test_graph_layer_nodes),
        cmocka_unit_test(test_graph_layer_mixed),
        cmocka_unit_test(test_graph_models),
        cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_pools),
        cmocka_unit_test(test_embed_where_dropout),
        cmocka_unit_test(test_matmul_batched),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_vulkan_refuses_f64),
        cmocka_unit_test(test_cuda_refuses_f64),
    };
    return cmocka_run_group_tests(tests, t_setup, t_teardown);
}
