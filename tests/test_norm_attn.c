/* layer_norm, rms_norm, batched matmul and causal attention (dpar_layer_norm ...
   dpar_attention_backward): exact small cases (a constant row gives the bias,
   one token gives V, the causal mask hides later positions), forwards against
   references computed here in double, every backward against central finite
   differences of the double reference (so the check measures the op, not f32
   noise), argument errors, the graph nodes (dpar_g_layer_norm, dpar_g_rms_norm,
   dpar_g_matmul_batched: loss and gradients against the double references, on
   CPU and Vulkan), and every GPU backend (Vulkan, CUDA) against the
   CPU backend on the same inputs, sizes that are not multiples of any tile
   included. A backend that is not there prints SKIPPED (a failure when
   DPAR_REQUIRE_BACKENDS lists it). */
#include "testutil.h"

T_CPU_FIXTURE(1) /* the CPU reference */

static void fill_rand(float *p, int64_t n, unsigned seed, float lo, float hi) {
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = lo + (hi - lo) * (float)(s >> 8) / 16777216.0f;
    }
}
static float *fa(int64_t n) {
    return calloc((size_t)(n + 1), sizeof(float));
}
static double *da(int64_t n) {
    return calloc((size_t)(n + 1), sizeof(double));
}
/* |got - want| <= tol (1 + |want|), no NaN */
static void near(const char *what, const float *got, const double *want, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1.0 + fabs(want[i]))))
            fail_msg("%s[%lld] = %.9g, want %.9g (tol %g)", what, (long long)i, (double)got[i], want[i], tol);
}
static void nearf(const char *what, const float *got, const float *want, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= tol * (1.0 + fabs((double)want[i]))))
            fail_msg("%s[%lld] = %.9g, cpu %.9g (tol %g)", what, (long long)i, (double)got[i], (double)want[i], tol);
}

/* ---- references in double ------------------------------------------------ */
static void ref_norm(double *y, const double *x, const double *w, const double *b, int64_t m, int64_t n, double eps,
                     int rms) {
    for (int64_t i = 0; i < m; i++) {
        const double *xr = x + i * n;
        double mu = 0, v = 0;
        for (int64_t j = 0; j < n && !rms; j++) mu += xr[j] / (double)n;
        for (int64_t j = 0; j < n; j++) v += (xr[j] - mu) * (xr[j] - mu) / (double)n;
        double rs = 1.0 / sqrt(v + eps);
        for (int64_t j = 0; j < n; j++) y[i * n + j] = (xr[j] - mu) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    }
}
typedef struct geo {
    int64_t bh, tq, tk, d, dv;
    int causal;
    float scale;
} geo;
static void ref_attn(double *out, const double *q, const double *k, const double *v, geo g) {
    double *s = da(g.tk);
    for (int64_t b = 0; b < g.bh; b++)
        for (int64_t i = 0; i < g.tq; i++) {
            int64_t nk = g.causal ? i + 1 : g.tk;
            double mx = -INFINITY, se = 0;
            for (int64_t j = 0; j < nk; j++) {
                double a = 0;
                for (int64_t t = 0; t < g.d; t++) a += q[(b * g.tq + i) * g.d + t] * k[(b * g.tk + j) * g.d + t];
                s[j] = a * g.scale;
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = 0; j < nk; j++) se += (s[j] = exp(s[j] - mx));
            for (int64_t t = 0; t < g.dv; t++) {
                double o = 0;
                for (int64_t j = 0; j < nk; j++) o += s[j] * v[(b * g.tk + j) * g.dv + t];
                out[(b * g.tq + i) * g.dv + t] = nk ? o / se : 0.0;
            }
        }
    free(s);
}
static double dot(const double *a, const float *r, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * (double)r[i];
    return s;
}
static void widen(double *d, const float *f, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = (double)f[i];
}

/* ---- runners: one op family on one runtime, host in, host out ------------ */
typedef struct norm_io {
    int rms;
    int64_t m, n;
    float eps;
    float *x, *w, *b, *dy;        /* inputs (w, b may be NULL) */
    float *y, *st, *dx, *dw, *db; /* outputs */
} norm_io;
static void norm_run(dpar_runtime *rt, norm_io *io) {
    int64_t xs[2] = { io->m, io->n }, ss[2] = { io->m, 2 }, n1 = io->n;
    dpar_buffer *x = t_buf(rt, 0, DPAR_F32, 2, xs, io->x), *y = t_buf(rt, 0, DPAR_F32, 2, xs, NULL),
                *st = t_buf(rt, 0, DPAR_F32, 2, ss, NULL);
    dpar_buffer *w = io->w ? t_buf(rt, 0, DPAR_F32, 1, &n1, io->w) : NULL,
                *b = io->b ? t_buf(rt, 0, DPAR_F32, 1, &n1, io->b) : NULL;
    dpar_buffer *dy = t_buf(rt, 0, DPAR_F32, 2, xs, io->dy), *dx = t_buf(rt, 0, DPAR_F32, 2, xs, NULL),
                *dw = t_buf(rt, 0, DPAR_F32, 1, &n1, NULL), *db = t_buf(rt, 0, DPAR_F32, 1, &n1, NULL);
    if (io->rms) {
        T_OK(dpar_rms_norm(y, st, x, w, b, io->eps));
        T_OK(dpar_rms_norm_backward(dx, dw, db, dy, x, w, st));
    } else {
        T_OK(dpar_layer_norm(y, st, x, w, b, io->eps));
        T_OK(dpar_layer_norm_backward(dx, dw, db, dy, x, w, st));
    }
    t_read(y, io->y);
    t_read(st, io->st);
    t_read(dx, io->dx);
    t_read(dw, io->dw);
    t_read(db, io->db);
    dpar_buffer *all[9] = { x, y, st, w, b, dy, dx, dw, db };
    for (int i = 0; i < 9; i++) dpar_buffer_destroy(all[i]);
}
typedef struct attn_io {
    geo g;
    float *q, *k, *v, *dout;
    float *out, *st, *dq, *dk, *dv;
    int kv_only; /* the backward asks for dk and dv alone (dq stays unread) */
    int q_only;  /* the backward asks for dq alone (dk, dv stay unread) */
} attn_io;
static void attn_run(dpar_runtime *rt, attn_io *io) {
    geo g = io->g;
    int64_t qs[3] = { g.bh, g.tq, g.d }, ks[3] = { g.bh, g.tk, g.d }, vs[3] = { g.bh, g.tk, g.dv },
            os[3] = { g.bh, g.tq, g.dv }, ss[3] = { g.bh, g.tq, 2 };
    dpar_buffer *q = t_buf(rt, 0, DPAR_F32, 3, qs, io->q), *k = t_buf(rt, 0, DPAR_F32, 3, ks, io->k),
                *v = t_buf(rt, 0, DPAR_F32, 3, vs, io->v);
    dpar_buffer *o = t_buf(rt, 0, DPAR_F32, 3, os, NULL), *st = t_buf(rt, 0, DPAR_F32, 3, ss, NULL),
                *dout = t_buf(rt, 0, DPAR_F32, 3, os, io->dout);
    dpar_buffer *dq = t_buf(rt, 0, DPAR_F32, 3, qs, NULL), *dk = t_buf(rt, 0, DPAR_F32, 3, ks, NULL),
                *dv = t_buf(rt, 0, DPAR_F32, 3, vs, NULL);
    T_OK(dpar_attention(o, st, q, k, v, g.scale, g.causal));
    t_read(o, io->out);
    if (io->dout) {
        T_OK(dpar_attention_backward(io->kv_only ? NULL : dq, io->q_only ? NULL : dk, io->q_only ? NULL : dv, st, dout,
                                     q, k, v, g.scale, g.causal));
        if (!io->kv_only) t_read(dq, io->dq);
        if (!io->q_only) t_read(dk, io->dk), t_read(dv, io->dv);
    }
    t_read(st, io->st);
    dpar_buffer *all[9] = { q, k, v, o, st, dout, dq, dk, dv };
    for (int i = 0; i < 9; i++) dpar_buffer_destroy(all[i]);
}
typedef struct bmm_io {
    int64_t nb, m, k, n;
    int ta, tb, shared_b;
    float alpha, beta;
    float *a, *b, *c0, *c;
} bmm_io;
static void bmm_run(dpar_runtime *rt, bmm_io *io) {
    int64_t as[3] = { io->nb, io->ta ? io->k : io->m, io->ta ? io->m : io->k };
    int64_t bs[3] = { io->nb, io->tb ? io->n : io->k, io->tb ? io->k : io->n }, cs[3] = { io->nb, io->m, io->n };
    dpar_buffer *a = t_buf(rt, 0, DPAR_F32, 3, as, io->a), *c = t_buf(rt, 0, DPAR_F32, 3, cs, io->c0);
    dpar_buffer *b = io->shared_b ? t_buf(rt, 0, DPAR_F32, 2, bs + 1, io->b) : t_buf(rt, 0, DPAR_F32, 3, bs, io->b);
    T_OK(dpar_matmul_batched(c, a, b, io->ta, io->tb, io->alpha, io->beta));
    t_read(c, io->c);
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
}

/* ---- norms ------------------------------------------------------------------ */
static void norm_alloc(norm_io *io, int rms, int64_t m, int64_t n, unsigned seed, int affine) {
    memset(io, 0, sizeof *io);
    io->rms = rms, io->m = m, io->n = n, io->eps = 1e-5f;
    io->x = fa(m * n), io->dy = fa(m * n), io->y = fa(m * n), io->st = fa(2 * m), io->dx = fa(m * n);
    io->dw = fa(n), io->db = fa(n);
    fill_rand(io->x, m * n, seed, -2.0f, 3.0f);
    fill_rand(io->dy, m * n, seed + 1, -1.0f, 1.0f);
    if (affine) {
        io->w = fa(n), io->b = fa(n);
        fill_rand(io->w, n, seed + 2, 0.5f, 1.5f);
        fill_rand(io->b, n, seed + 3, -1.0f, 1.0f);
    }
}
static void norm_free(norm_io *io) {
    float *p[10] = { io->x, io->w, io->b, io->dy, io->y, io->st, io->dx, io->dw, io->db, NULL };
    for (int i = 0; i < 9; i++) free(p[i]);
}
static void test_layer_norm_constant_row_returns_bias(void **state) {
    (void)state;
    for (int rms = 0; rms < 2; rms++) {
        norm_io io;
        norm_alloc(&io, 0, 4, 7, 11, 1);
        const float c[4] = { 0.1f, -3.3f, 1e6f, 0.0f };
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 7; j++) io.x[i * 7 + j] = c[i];
        io.rms = rms;
        norm_run(RT, &io);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 7; j++) {
                float y = io.y[i * 7 + j];
                if (!rms && y != io.b[j])
                    fail_msg("layer_norm of constant row %g: y[%lld] = %.9g, want the bias %.9g", (double)c[i],
                             (long long)j, (double)y, (double)io.b[j]);
                if (isnan(y) || isnan(io.dx[i * 7 + j])) fail_msg("NaN in a constant row (rms %d)", rms);
            }
        if (!rms)
            for (int64_t i = 0; i < 4; i++) assert_true(io.st[2 * i] == c[i] && io.st[2 * i + 1] > 0.0f);
        norm_free(&io);
    }
}
/* forward against the double reference, then every gradient against central differences of it */
static void norm_check(int rms, int64_t m, int64_t n, int affine, unsigned seed) {
    norm_io io;
    norm_alloc(&io, rms, m, n, seed, affine);
    norm_run(RT, &io);
    int64_t c = m * n;
    double *x = da(c), *w = da(n), *b = da(n), *y = da(c);
    widen(x, io.x, c);
    if (affine) widen(w, io.w, n), widen(b, io.b, n);
    const double *W = affine ? w : NULL, *B = affine ? b : NULL;
    ref_norm(y, x, W, B, m, n, io.eps, rms);
    char what[96];
    snprintf(what, sizeof what, "%s m%lld n%lld y", rms ? "rms_norm" : "layer_norm", (long long)m, (long long)n);
    near(what, io.y, y, c, 1e-5);
    const double h = 1e-6;
    double *gx = da(c), *gw = da(n), *gb = da(n);
    double *params[3] = { x, w, b }, *grads[3] = { gx, gw, gb };
    int64_t sizes[3] = { c, affine ? n : 0, affine ? n : 0 };
    for (int p = 0; p < 3; p++)
        for (int64_t e = 0; e < sizes[p]; e++) {
            double keep = params[p][e], lp, lm;
            params[p][e] = keep + h;
            ref_norm(y, x, W, B, m, n, io.eps, rms);
            lp = dot(y, io.dy, c);
            params[p][e] = keep - h;
            ref_norm(y, x, W, B, m, n, io.eps, rms);
            lm = dot(y, io.dy, c);
            params[p][e] = keep;
            grads[p][e] = (lp - lm) / (2 * h);
        }
    snprintf(what, sizeof what, "%s m%lld n%lld dx", rms ? "rms_norm" : "layer_norm", (long long)m, (long long)n);
    near(what, io.dx, gx, c, 2e-4);
    if (affine) {
        near("norm dw", io.dw, gw, n, 2e-4);
        near("norm db", io.db, gb, n, 2e-4);
    }
    free(x), free(w), free(b), free(y), free(gx), free(gw), free(gb);
    norm_free(&io);
}
static void test_layer_norm_gradients(void **state) {
    (void)state;
    norm_check(0, 3, 5, 1, 1);
    norm_check(0, 4, 33, 1, 2);
    norm_check(0, 2, 6, 0, 3); /* no affine parameters */
    norm_check(0, 3, 1, 1, 4); /* N = 1: y = b, dx = 0 */
    norm_check(0, 1, 300, 1, 5);
}
static void test_rms_norm_gradients(void **state) {
    (void)state;
    norm_check(1, 3, 5, 1, 6);
    norm_check(1, 4, 33, 1, 7);
    norm_check(1, 2, 6, 0, 8);
    norm_check(1, 3, 1, 1, 9);
}
static void test_norm_empty_and_optional(void **state) {
    (void)state;
    int64_t s0[2] = { 0, 5 }, s05[2] = { 0, 2 }, n5 = 5, s1[2] = { 2, 5 };
    dpar_buffer *x = t_buf(RT, 0, DPAR_F32, 2, s0, NULL), *y = t_buf(RT, 0, DPAR_F32, 2, s0, NULL),
                *st = t_buf(RT, 0, DPAR_F32, 2, s05, NULL);
    dpar_buffer *dw = t_buf(RT, 0, DPAR_F32, 1, &n5, NULL), *db = t_buf(RT, 0, DPAR_F32, 1, &n5, NULL);
    T_OK(dpar_layer_norm(y, st, x, NULL, NULL, 1e-5f)); /* M = 0 */
    T_OK(dpar_layer_norm_backward(y, dw, db, x, x, NULL, st));
    float z[5];
    t_read(dw, z);
    for (int i = 0; i < 5; i++) assert_true(z[i] == 0.0f);
    /* N = 0: stats [..., 2] keep x's leading dims (3 rows) and come back zeroed; the backward has
       nothing to compute (it used to ask for stats of 0 elements) */
    int64_t s30[2] = { 3, 0 }, s32[2] = { 3, 2 }, zero = 0;
    float seven[6] = { 7, 7, 7, 7, 7, 7 }, sv[6];
    dpar_buffer *e = t_buf(RT, 0, DPAR_F32, 2, s30, NULL), *est = t_buf(RT, 0, DPAR_F32, 2, s32, seven);
    dpar_buffer *e0 = t_buf(RT, 0, DPAR_F32, 1, &zero, NULL), *ed = t_buf(RT, 0, DPAR_F32, 2, s30, NULL);
    for (int rms = 0; rms < 2; rms++) {
        T_OK((rms ? dpar_rms_norm : dpar_layer_norm)(e, est, e, NULL, NULL, 1e-5f));
        t_read(est, sv);
        for (int i = 0; i < 6; i++) assert_true(sv[i] == 0.0f);
        T_OK((rms ? dpar_rms_norm_backward : dpar_layer_norm_backward)(ed, e0, NULL, e, e, NULL, est));
        T_OK(dpar_buffer_write(est, 0, seven, sizeof seven));
    }
    dpar_buffer_destroy(e), dpar_buffer_destroy(est), dpar_buffer_destroy(e0), dpar_buffer_destroy(ed);
    /* stats optional in the forward; dw, db optional in the backward; y may alias x */
    float xv[10] = { 1, 2, 3, 4, 5, 5, 4, 3, 2, 1 };
    dpar_buffer *x2 = t_buf(RT, 0, DPAR_F32, 2, s1, xv);
    T_OK(dpar_layer_norm(x2, NULL, x2, NULL, NULL, 1e-5f));
    float out[10];
    t_read(x2, out);
    for (int i = 0; i < 10; i++) assert_true(out[i] == out[9 - i] && fabsf(out[i % 5] + out[4 - i % 5]) < 1e-6f);
    assert_true(fabsf(out[0] + 1.41421f) < 1e-4f); /* (1 - 3) / sqrt(2) */
    dpar_buffer_destroy(x), dpar_buffer_destroy(y), dpar_buffer_destroy(st), dpar_buffer_destroy(dw);
    dpar_buffer_destroy(db), dpar_buffer_destroy(x2);
}
static void test_norm_errors(void **state) {
    (void)state;
    int64_t s[2] = { 3, 4 }, s3 = 3, s4 = 4, sst[2] = { 3, 2 }, sbad[2] = { 2, 2 };
    dpar_buffer *x = t_buf(RT, 0, DPAR_F32, 2, s, NULL), *y = t_buf(RT, 0, DPAR_F32, 2, s, NULL),
                *w3 = t_buf(RT, 0, DPAR_F32, 1, &s3, NULL);
    dpar_buffer *w4 = t_buf(RT, 0, DPAR_F32, 1, &s4, NULL), *st = t_buf(RT, 0, DPAR_F32, 2, sst, NULL),
                *stb = t_buf(RT, 0, DPAR_F32, 2, sbad, NULL), *xi = NULL;
    T_OK(dpar_buffer_create(RT, 0, DPAR_I32, 2, s, &xi));
    T_ERR(dpar_layer_norm(y, st, x, w3, NULL, 1e-5f), DPAR_ERR_SHAPE, "dpar_layer_norm", "w [3]", "[3, 4]");
    T_ERR(dpar_layer_norm(y, stb, x, w4, NULL, 1e-5f), DPAR_ERR_SHAPE, "stats", "6");
    T_ERR(dpar_layer_norm(y, st, x, w4, NULL, 0.0f), DPAR_ERR_INVALID_ARGUMENT, "eps");
    T_ERR(dpar_rms_norm(y, st, xi, NULL, NULL, 1e-5f), DPAR_ERR_DTYPE, "dpar_rms_norm", "i32");
    T_ERR(dpar_rms_norm(xi, st, xi, NULL, NULL, 1e-5f), DPAR_ERR_DTYPE, "dpar_rms_norm", "y is i32",
          "or f64 on the cpu backend"); /* the cpu's norms take f64 too: the text said f32, f16 or bf16 alone */
    T_ERR(dpar_layer_norm(NULL, st, x, NULL, NULL, 1e-5f), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_layer_norm_backward(x, NULL, NULL, y, x, NULL, st), DPAR_ERR_INVALID_ARGUMENT, "alias");
    T_ERR(dpar_rms_norm_backward(y, w3, NULL, y, x, NULL, st), DPAR_ERR_SHAPE, "dw");
    dpar_buffer *all[7] = { x, y, w3, w4, st, stb, xi };
    for (int i = 0; i < 7; i++) dpar_buffer_destroy(all[i]);
}

/* ---- batched matmul --------------------------------------------------------- */
static void bmm_alloc(bmm_io *io, int64_t nb, int64_t m, int64_t k, int64_t n, int ta, int tb, int shared, float alpha,
                      float beta) {
    io->nb = nb, io->m = m, io->k = k, io->n = n, io->ta = ta, io->tb = tb, io->shared_b = shared;
    io->alpha = alpha, io->beta = beta;
    int64_t nbb = shared ? 1 : nb; /* a shared B is one [k, n] matrix, even for zero batches */
    io->a = fa(nb * m * k), io->b = fa(nbb * k * n), io->c0 = fa(nb * m * n), io->c = fa(nb * m * n);
    fill_rand(io->a, nb * m * k, 21, -1, 1);
    fill_rand(io->b, nbb * k * n, 22, -1, 1);
    fill_rand(io->c0, nb * m * n, 23, -1, 1);
}
static void bmm_free(bmm_io *io) {
    free(io->a), free(io->b), free(io->c0), free(io->c);
}
static void bmm_check(int64_t nb, int64_t m, int64_t k, int64_t n, int ta, int tb, int shared, float alpha,
                      float beta) {
    bmm_io io;
    bmm_alloc(&io, nb, m, k, n, ta, tb, shared, alpha, beta);
    bmm_run(RT, &io);
    double *want = da(nb * m * n);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                const float *A = io.a + b * m * k, *B = io.b + (shared ? 0 : b * k * n);
                double acc = 0;
                for (int64_t t = 0; t < k; t++)
                    acc += (double)(ta ? A[t * m + i] : A[i * k + t]) * (double)(tb ? B[j * k + t] : B[t * n + j]);
                want[(b * m + i) * n + j] = alpha * acc + beta * (double)io.c0[(b * m + i) * n + j];
            }
    char what[96];
    snprintf(what, sizeof what, "matmul_batched b%lld m%lld k%lld n%lld ta%d tb%d shared%d C", (long long)nb,
             (long long)m, (long long)k, (long long)n, ta, tb, shared);
    near(what, io.c, want, nb * m * n, 1e-5);
    free(want);
    bmm_free(&io);
}
static void test_matmul_batched(void **state) {
    (void)state;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            bmm_check(3, 5, 7, 4, ta, tb, 0, 1.0f, 0.0f);
            bmm_check(2, 33, 17, 35, ta, tb, 0, 0.5f, 1.0f);
            bmm_check(4, 3, 6, 2, ta, tb, 1, 1.0f, 0.0f);
        }
    bmm_check(0, 3, 4, 5, 0, 0, 0, 1.0f, 0.0f);
    bmm_check(2, 1, 1, 1, 0, 0, 0, 1.0f, 0.0f);
    int64_t a[3] = { 2, 3, 4 }, b[3] = { 3, 4, 5 }, c[3] = { 2, 3, 5 };
    dpar_buffer *A = t_buf(RT, 0, DPAR_F32, 3, a, NULL), *B = t_buf(RT, 0, DPAR_F32, 3, b, NULL),
                *C = t_buf(RT, 0, DPAR_F32, 3, c, NULL);
    T_ERR(dpar_matmul_batched(C, A, B, false, false, 1, 0), DPAR_ERR_SHAPE, "dpar_matmul_batched", "[3, 4, 5]");
    T_ERR(dpar_matmul_batched(A, A, A, false, false, 1, 0), DPAR_ERR_SHAPE, "dpar_matmul_batched");
    dpar_buffer_destroy(A), dpar_buffer_destroy(B), dpar_buffer_destroy(C);
}

/* ---- attention -------------------------------------------------------------- */
static void attn_alloc(attn_io *io, geo g, unsigned seed, int grads) {
    memset(io, 0, sizeof *io);
    io->g = g;
    io->q = fa(g.bh * g.tq * g.d), io->k = fa(g.bh * g.tk * g.d), io->v = fa(g.bh * g.tk * g.dv);
    io->out = fa(g.bh * g.tq * g.dv), io->st = fa(g.bh * g.tq * 2);
    fill_rand(io->q, g.bh * g.tq * g.d, seed, -1.5f, 1.5f);
    fill_rand(io->k, g.bh * g.tk * g.d, seed + 1, -1.5f, 1.5f);
    fill_rand(io->v, g.bh * g.tk * g.dv, seed + 2, -1.0f, 1.0f);
    if (grads) {
        io->dout = fa(g.bh * g.tq * g.dv);
        fill_rand(io->dout, g.bh * g.tq * g.dv, seed + 3, -1.0f, 1.0f);
        io->dq = fa(g.bh * g.tq * g.d), io->dk = fa(g.bh * g.tk * g.d), io->dv = fa(g.bh * g.tk * g.dv);
    }
}
static void attn_free(attn_io *io) {
    float *p[10] = { io->q, io->k, io->v, io->dout, io->out, io->st, io->dq, io->dk, io->dv, NULL };
    for (int i = 0; i < 9; i++) free(p[i]);
}
static void test_attention_one_token_returns_v(void **state) {
    (void)state;
    for (int causal = 0; causal < 2; causal++) {
        attn_io io;
        attn_alloc(&io, (geo){ 3, 1, 1, 5, 4, causal, 0.0f }, 31, 0);
        attn_run(RT, &io);
        for (int64_t i = 0; i < 3 * 4; i++)
            if (io.out[i] != io.v[i])
                fail_msg("one token: out[%lld] = %.9g, want v %.9g", (long long)i, io.out[i], io.v[i]);
        attn_free(&io);
    }
}
/* position t ignores t+1..: changing k and v there leaves out_t bit for bit; changing them at t does not */
static void test_attention_causal_mask(void **state) {
    (void)state;
    geo g = { 2, 9, 9, 4, 3, 1, 0.0f };
    attn_io a, b;
    attn_alloc(&a, g, 41, 0);
    attn_alloc(&b, g, 41, 0);
    int64_t t = 4;
    for (int64_t bb = 0; bb < g.bh; bb++)
        for (int64_t j = t + 1; j < g.tk; j++) {
            for (int64_t e = 0; e < g.d; e++) b.k[(bb * g.tk + j) * g.d + e] += 5.0f;
            for (int64_t e = 0; e < g.dv; e++) b.v[(bb * g.tk + j) * g.dv + e] -= 7.0f;
        }
    attn_run(RT, &a);
    attn_run(RT, &b);
    for (int64_t bb = 0; bb < g.bh; bb++)
        for (int64_t i = 0; i < g.tq; i++)
            for (int64_t e = 0; e < g.dv; e++) {
                int64_t x = (bb * g.tq + i) * g.dv + e;
                int same = a.out[x] == b.out[x];
                if (i <= t && !same)
                    fail_msg("causal: row %lld changed when keys after %lld changed", (long long)i, (long long)t);
                if (i > t && same) fail_msg("causal: row %lld ignores keys up to itself", (long long)i);
            }
    attn_free(&a);
    attn_free(&b);
}
/* dk and dv asked for alone, on stats fresh from the forward, equal those of full (the same call with dq)
   bit for bit: a backend whose pass 2 reads the D of pass 1 must still get pass 1 without dq, one that
   computes D itself (the backend's attn_kv_computes_d) must not need it. And dq alone (pass 1 only)
   equals full's: where pass 2 computes dq with dk and dv, it must be pass 1's dq */
static void attn_kv_only(dpar_runtime *rt, const attn_io *full, unsigned seed, const char *what) {
    geo g = full->g;
    attn_io kv;
    attn_alloc(&kv, g, seed, 1);
    kv.kv_only = 1;
    attn_run(rt, &kv);
    char w2[192];
    snprintf(w2, sizeof w2, "%s, dk alone", what);
    nearf(w2, kv.dk, full->dk, g.bh * g.tk * g.d, 0.0);
    snprintf(w2, sizeof w2, "%s, dv alone", what);
    nearf(w2, kv.dv, full->dv, g.bh * g.tk * g.dv, 0.0);
    attn_free(&kv);
    attn_alloc(&kv, g, seed, 1);
    kv.q_only = 1;
    attn_run(rt, &kv);
    snprintf(w2, sizeof w2, "%s, dq alone", what);
    nearf(w2, kv.dq, full->dq, g.bh * g.tq * g.d, 0.0);
    attn_free(&kv);
}
/* every element's gradient when step is 1, else every step-th (long sequences) */
static void attn_check_every(geo g, unsigned seed, int64_t step) {
    attn_io io;
    attn_alloc(&io, g, seed, 1);
    attn_run(RT, &io);
    if (g.scale == 0.0f) g.scale = (float)(1.0 / sqrt((double)g.d));
    int64_t nq = g.bh * g.tq * g.d, nk = g.bh * g.tk * g.d, nv = g.bh * g.tk * g.dv, no = g.bh * g.tq * g.dv;
    double *q = da(nq), *k = da(nk), *v = da(nv), *o = da(no);
    widen(q, io.q, nq), widen(k, io.k, nk), widen(v, io.v, nv);
    ref_attn(o, q, k, v, g);
    char what[128];
    snprintf(what, sizeof what, "attention bh%lld tq%lld tk%lld d%lld dv%lld causal%d", (long long)g.bh,
             (long long)g.tq, (long long)g.tk, (long long)g.d, (long long)g.dv, g.causal);
    near(what, io.out, o, no, 1e-5);
    attn_kv_only(RT, &io, seed, what);
    const double h = 1e-6;
    double *params[3] = { q, k, v };
    const float *got[3] = { io.dq, io.dk, io.dv };
    int64_t sizes[3] = { nq, nk, nv };
    const char *names[3] = { "dq", "dk", "dv" };
    for (int p = 0; p < 3; p++) {
        double *fd = da(sizes[p]);
        for (int64_t e = 0; e < sizes[p]; e++) {
            if (e % step) {
                fd[e] = (double)got[p][e];
                continue;
            }
            double keep = params[p][e], lp, lm;
            params[p][e] = keep + h;
            ref_attn(o, q, k, v, g);
            lp = dot(o, io.dout, no);
            params[p][e] = keep - h;
            ref_attn(o, q, k, v, g);
            lm = dot(o, io.dout, no);
            params[p][e] = keep;
            fd[e] = (lp - lm) / (2 * h);
        }
        char w2[160];
        snprintf(w2, sizeof w2, "%s %s", what, names[p]);
        near(w2, got[p], fd, sizes[p], 2e-4);
        free(fd);
    }
    free(q), free(k), free(v), free(o);
    attn_free(&io);
}
static void attn_check(geo g, unsigned seed) {
    attn_check_every(g, seed, 1);
}
static void test_attention_gradients(void **state) {
    (void)state;
    attn_check((geo){ 2, 5, 5, 4, 3, 1, 0.0f }, 51);
    attn_check((geo){ 1, 7, 7, 3, 3, 1, 0.7f }, 52);
    attn_check((geo){ 2, 4, 6, 3, 2, 0, 0.0f }, 53); /* not causal, Tq != Tk */
    attn_check((geo){ 1, 1, 1, 2, 2, 1, 0.0f }, 54);
    attn_check((geo){ 1, 3, 3, 1, 1, 1, 2.0f }, 55);
    attn_check_every((geo){ 1, 300, 300, 3, 2, 1, 0.0f }, 56, 29); /* the CPU's query-row blocks */
    attn_check_every((geo){ 2, 40, 1000, 2, 2, 0, 0.0f }, 57, 31);
}
static void test_attention_errors(void **state) {
    (void)state;
    int64_t s[3] = { 2, 4, 3 }, s5[3] = { 2, 5, 3 }, st[3] = { 2, 4, 2 }, sd[3] = { 2, 4, 5 };
    dpar_buffer *q = t_buf(RT, 0, DPAR_F32, 3, s, NULL), *k5 = t_buf(RT, 0, DPAR_F32, 3, s5, NULL),
                *o = t_buf(RT, 0, DPAR_F32, 3, s, NULL);
    dpar_buffer *S = t_buf(RT, 0, DPAR_F32, 3, st, NULL), *kd = t_buf(RT, 0, DPAR_F32, 3, sd, NULL),
                *k = t_buf(RT, 0, DPAR_F32, 3, s, NULL);
    T_ERR(dpar_attention(o, S, q, k5, k5, 0.0f, true), DPAR_ERR_SHAPE, "causal", "Tq 4, Tk 5");
    T_ERR(dpar_attention(o, S, q, kd, k, 0.0f, false), DPAR_ERR_SHAPE, "dpar_attention", "k [2, 4, 5]");
    T_ERR(dpar_attention(o, S, q, k, k, -1.0f, true), DPAR_ERR_INVALID_ARGUMENT, "scale");
    T_ERR(dpar_attention(q, S, q, k, k, 0.0f, true), DPAR_ERR_INVALID_ARGUMENT, "alias");
    T_ERR(dpar_attention(o, q, q, k, k, 0.0f, true), DPAR_ERR_SHAPE, "stats");
    T_ERR(dpar_attention_backward(NULL, NULL, NULL, S, o, q, k, k, 0.0f, true), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_attention_backward(q, NULL, NULL, S, o, q, k, k, 0.0f, true), DPAR_ERR_INVALID_ARGUMENT, "alias");
    /* zero rows / zero keys: nothing to do, zeros out */
    int64_t z[3] = { 2, 0, 3 }, zs[3] = { 2, 0, 2 };
    dpar_buffer *qz = t_buf(RT, 0, DPAR_F32, 3, z, NULL), *oz = t_buf(RT, 0, DPAR_F32, 3, z, NULL),
                *sz = t_buf(RT, 0, DPAR_F32, 3, zs, NULL);
    T_OK(dpar_attention(oz, sz, qz, qz, qz, 0.0f, true));
    float ones[24];
    for (int i = 0; i < 24; i++) ones[i] = 1.0f;
    T_OK(dpar_buffer_write(o, 0, ones, sizeof ones));
    T_OK(dpar_attention(o, S, q, qz, qz, 0.0f, false));
    float got[24];
    t_read(o, got);
    for (int i = 0; i < 24; i++) assert_true(got[i] == 0.0f);
    dpar_buffer *all[9] = { q, k5, o, S, kd, k, qz, oz, sz };
    for (int i = 0; i < 9; i++) dpar_buffer_destroy(all[i]);
}

/* ---- graph nodes: dpar_g_layer_norm / rms_norm / matmul_batched -------------- */
typedef struct gcase {
    const char *name;
    int kind; /* 0 layer_norm, 1 rms_norm, 2 matmul_batched, 3 attention (p0: causal) */
    int nin;  /* differentiated feeds (the last feed, r, is the loss weight: loss = dot(out, r)) */
    int ndim[3];
    int64_t shape[3][4];
    int p0, p1; /* trans_a, trans_b */
    int from;   /* the first differentiated feed (attention: a dk node that computes dv too) */
} gcase;
static int64_t gcount(const gcase *c, int i) {
    int64_t n = 1;
    for (int d = 0; d < c->ndim[i]; d++) n *= c->shape[i][d];
    return n;
}
static int64_t gout_count(const gcase *c) {
    if (c->kind < 2) return gcount(c, 0);
    if (c->kind == 3) return gcount(c, 0) / c->shape[0][c->ndim[0] - 1] * c->shape[2][c->ndim[2] - 1];
    const int64_t *a = c->shape[0], *b = c->shape[1];
    int r = c->ndim[0], rb = c->ndim[1];
    return gcount(c, 0) / (a[r - 1] * a[r - 2]) * a[r - (c->p0 ? 1 : 2)] * b[rb - (c->p1 ? 2 : 1)];
}
/* the graph's output in double: out = op(inputs) */
static void gref(const gcase *c, double *const *x, double *out) {
    if (c->kind == 3) {
        int r = c->ndim[0];
        geo g = { gcount(c, 0) / (c->shape[0][r - 1] * c->shape[0][r - 2]),
                  c->shape[0][r - 2],
                  c->shape[1][r - 2],
                  c->shape[0][r - 1],
                  c->shape[2][r - 1],
                  c->p0,
                  (float)(1.0 / sqrt((double)c->shape[0][r - 1])) };
        ref_attn(out, x[0], x[1], x[2], g);
        return;
    }
    if (c->kind < 2) {
        int64_t n = c->shape[0][c->ndim[0] - 1];
        ref_norm(out, x[0], x[1], c->nin > 2 ? x[2] : NULL, gcount(c, 0) / n, n, 1e-5, c->kind);
        return;
    }
    const int64_t *as = c->shape[0], *bs = c->shape[1];
    int r = c->ndim[0], rb = c->ndim[1];
    int64_t M = as[r - (c->p0 ? 1 : 2)], K = as[r - (c->p0 ? 2 : 1)], N = bs[rb - (c->p1 ? 2 : 1)];
    int64_t nb = gcount(c, 0) / (M * K), sb = rb == 2 ? 0 : K * N;
    for (int64_t bb = 0; bb < nb; bb++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                const double *A = x[0] + bb * M * K, *B = x[1] + bb * sb;
                double s = 0;
                for (int64_t t = 0; t < K; t++)
                    s += (c->p0 ? A[t * M + i] : A[i * K + t]) * (c->p1 ? B[j * K + t] : B[t * N + j]);
                out[(bb * M + i) * N + j] = s;
            }
}
static void graph_case(dpar_backend_kind kind, const gcase *c) {
    dpar_runtime *rt = t_runtime_or_skip(kind, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_value x[4], gr[3], none = { 0 };
    double *xd[3] = { NULL, NULL, NULL }, *out = da(gout_count(c));
    float *xf[4];
    int64_t no = gout_count(c);
    for (int i = 0; i <= c->nin; i++) {
        dpar_array_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DPAR_F32;
        if (i < c->nin) {
            d.ndim = c->ndim[i];
            for (int k = 0; k < d.ndim; k++) d.shape[k] = c->shape[i][k];
        } else {
            d.ndim = 1, d.shape[0] = no;
        }
        x[i] = dpar_g_feed(g, i < c->nin ? "x" : "r", &d);
        int64_t n = i < c->nin ? gcount(c, i) : no;
        xf[i] = fa(n);
        fill_rand(xf[i], n, (unsigned)(90 + i), i == 1 && c->kind < 2 ? 0.5f : -1.0f, 1.5f);
        if (i < c->nin) xd[i] = da(n), widen(xd[i], xf[i], n);
    }
    dpar_value y = c->kind == 0   ? dpar_g_layer_norm(g, x[0], x[1], c->nin > 2 ? x[2] : none, 1e-5f)
                   : c->kind == 1 ? dpar_g_rms_norm(g, x[0], x[1], c->nin > 2 ? x[2] : none, 1e-5f)
                   : c->kind == 2 ? dpar_g_matmul_batched(g, x[0], x[1], c->p0, c->p1)
                                  : dpar_g_attention(g, x[0], x[1], x[2], 0.0f, c->p0);
    int64_t flat = no;
    dpar_value loss = dpar_g_dot(g, dpar_g_reshape(g, y, 1, &flat), x[c->nin]);
    T_OK(dpar_graph_status(g));
    T_OK(dpar_graph_value_and_grad(g, loss, x + c->from, c->nin - c->from, gr + c->from));
    T_OK(dpar_graph_compile(g, NULL));
    dpar_graph_feed f[4];
    memset(f, 0, sizeof f);
    for (int i = 0; i <= c->nin; i++) f[i].value = x[i], f[i].host = xf[i];
    float lossv = 0;
    T_OK(dpar_graph_run(g, f, c->nin + 1, &lossv));
    gref(c, xd, out);
    double want = dot(out, xf[c->nin], no);
    char what[128];
    if (fabs((double)lossv - want) > 1e-4 * (1 + fabs(want)))
        fail_msg("%s %s: loss %.9g, reference %.9g", dpar_backend_name(kind), c->name, (double)lossv, want);
    for (int i = c->from; i < c->nin; i++) {
        int64_t n = gcount(c, i);
        float *an = fa(n);
        double *fd = da(n);
        T_OK(dpar_graph_get(g, gr[i], an));
        for (int64_t k = 0; k < n; k++) {
            double h = 1e-6, keep = xd[i][k], lp, lm;
            xd[i][k] = keep + h;
            gref(c, xd, out);
            lp = dot(out, xf[c->nin], no);
            xd[i][k] = keep - h;
            gref(c, xd, out);
            lm = dot(out, xf[c->nin], no);
            xd[i][k] = keep;
            fd[k] = (lp - lm) / (2 * h);
        }
        snprintf(what, sizeof what, "%s graph %s: d loss / d input %d", dpar_backend_name(kind), c->name, i);
        near(what, an, fd, n, 2e-4);
        free(an), free(fd);
    }
    for (int i = 0; i <= c->nin; i++) {
        free(xf[i]);
        if (i < c->nin) free(xd[i]);
    }
    free(out);
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}
static const gcase gcases[] = {
    { "layer_norm x, w, b", 0, 3, { 2, 1, 1 }, { { 3, 5 }, { 5 }, { 5 } }, 0, 0, 0 },
    { "layer_norm 3-d, no bias", 0, 2, { 3, 1 }, { { 2, 2, 7 }, { 7 } }, 0, 0, 0 },
    { "rms_norm x, w, b", 1, 3, { 2, 1, 1 }, { { 4, 6 }, { 6 }, { 6 } }, 0, 0, 0 },
    { "matmul_batched", 2, 2, { 3, 3 }, { { 2, 3, 4 }, { 2, 4, 5 } }, 0, 0, 0 },
    { "matmul_batched ta tb", 2, 2, { 3, 3 }, { { 2, 4, 3 }, { 2, 5, 4 } }, 1, 1, 0 },
    { "matmul_batched shared b", 2, 2, { 3, 2 }, { { 3, 2, 4 }, { 4, 5 } }, 0, 0, 0 },
    { "matmul_batched shared b^T", 2, 2, { 3, 2 }, { { 3, 2, 4 }, { 5, 4 } }, 0, 1, 0 },
    { "attention causal", 3, 3, { 3, 3, 3 }, { { 2, 4, 3 }, { 2, 4, 3 }, { 2, 4, 2 } }, 1, 0, 0 },
    { "attention 4-d causal", 3, 3, { 4, 4, 4 }, { { 2, 2, 3, 2 }, { 2, 2, 3, 2 }, { 2, 2, 3, 3 } }, 1, 0, 0 },
    { "attention Tq != Tk", 3, 3, { 3, 3, 3 }, { { 1, 3, 2 }, { 1, 5, 2 }, { 1, 5, 3 } }, 0, 0, 0 },
    { "attention causal, dk and dv only", 3, 3, { 3, 3, 3 }, { { 2, 4, 3 }, { 2, 4, 3 }, { 2, 4, 2 } }, 1, 0, 1 },
    { "attention, dv only", 3, 3, { 3, 3, 3 }, { { 1, 3, 2 }, { 1, 5, 2 }, { 1, 5, 3 } }, 0, 0, 2 },
};
static void graph_all(dpar_backend_kind kind) {
    for (size_t i = 0; i < sizeof gcases / sizeof gcases[0]; i++) graph_case(kind, &gcases[i]);
}
static void test_graph_layers(void **state) {
    (void)state;
    graph_all(DPAR_BACKEND_CPU);
}
static void test_graph_layers_vulkan(void **state) {
    (void)state;
    dpar_runtime *probe = t_runtime_or_skip(DPAR_BACKEND_VULKAN, 1);
    dpar_runtime_destroy(probe);
    graph_all(DPAR_BACKEND_VULKAN);
}
static void test_graph_layer_errors(void **state) {
    (void)state;
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DPAR_F32, d.ndim = 2, d.shape[0] = 3, d.shape[1] = 4;
    dpar_value x = dpar_g_feed(g, "x", &d), none = { 0 };
    d.ndim = 1, d.shape[0] = 3;
    dpar_value w3 = dpar_g_feed(g, "w", &d);
    assert_int_equal(dpar_g_layer_norm(g, x, w3, none, 1e-5f).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "dpar_g_layer_norm", "[3]", "[3, 4]");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    d.ndim = 3, d.shape[0] = 2, d.shape[1] = 3, d.shape[2] = 4;
    dpar_value a = dpar_g_feed(g, "a", &d);
    d.ndim = 2, d.shape[0] = 3, d.shape[1] = 5;
    dpar_value b = dpar_g_feed(g, "b", &d);
    assert_int_equal(dpar_g_matmul_batched(g, a, b, true, false).id, 0); /* shared b with trans_a: refused */
    T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "dpar_g_matmul_batched");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_mesh_destroy(m));
}

/* ---- every GPU backend against the CPU backend -------------------------------- */
static void parity(dpar_backend_kind kind) {
    dpar_runtime *gpu = t_runtime_or_skip(kind, 1);
    const char *bn = dpar_backend_name(kind);
    char what[160];
    /* small on purpose: the CUDA mock runs every GPU thread as a host thread */
    /* 257 rows: one past the 256 rows of a workgroup of the Vulkan row-per-invocation variants (forward and
       backward), and two chunks of rows for CUDA's dw/db (33 columns: a ragged second tile of 32); 33x128: the
       GPT's row length */
    const int64_t nshape[][2] = { { 3, 5 }, { 7, 300 }, { 1, 1 }, { 0, 4 }, { 5, 64 }, { 257, 33 }, { 33, 128 } };
    for (int rms = 0; rms < 2; rms++)
        for (int c = 0; c < (int)(sizeof nshape / sizeof nshape[0]); c++)
            for (int affine = 0; affine < 2; affine++) {
                norm_io a, b;
                norm_alloc(&a, rms, nshape[c][0], nshape[c][1], (unsigned)(60 + c), affine);
                norm_alloc(&b, rms, nshape[c][0], nshape[c][1], (unsigned)(60 + c), affine);
                norm_run(RT, &a);
                norm_run(gpu, &b);
                int64_t cnt = a.m * a.n;
                snprintf(what, sizeof what, "%s %s m%lld n%lld affine%d", bn, rms ? "rms_norm" : "layer_norm",
                         (long long)a.m, (long long)a.n, affine);
                nearf(what, b.y, a.y, cnt, 1e-5);
                nearf(what, b.st, a.st, 2 * a.m, 1e-5);
                nearf(what, b.dx, a.dx, cnt, 1e-4);
                nearf(what, b.dw, a.dw, a.n, 1e-4);
                nearf(what, b.db, a.db, a.n, 1e-4);
                norm_free(&a);
                norm_free(&b);
            }
    /* rows spread over 1e30 (and one of 300 values at 1e18): their f32 sums of squares overflow, the CPU
       sums in double; y and rstd must still agree (before: the GPU's rstd was 0 and y was the bias) */
    const int64_t big[][2] = { { 5, 64 }, { 2, 300 } };
    const float scale[] = { 1e30f, 1e18f };
    for (int rms = 0; rms < 2; rms++)
        for (int c = 0; c < 2; c++) {
            norm_io a, b;
            norm_alloc(&a, rms, big[c][0], big[c][1], (unsigned)(90 + c), 1);
            norm_alloc(&b, rms, big[c][0], big[c][1], (unsigned)(90 + c), 1);
            for (int64_t i = 0; i < a.m * a.n; i++) a.x[i] *= scale[c], b.x[i] *= scale[c];
            norm_run(RT, &a);
            norm_run(gpu, &b);
            snprintf(what, sizeof what, "%s %s of rows scaled by %g", bn, rms ? "rms_norm" : "layer_norm",
                     (double)scale[c]);
            nearf(what, b.y, a.y, a.m * a.n, 1e-5);
            for (int64_t r = 0; r < a.m; r++) {
                double want = a.st[2 * r + 1], got = b.st[2 * r + 1];
                if (!(fabs(got - want) <= 1e-5 * want))
                    fail_msg("%s: rstd[%lld] %.9g, want %.9g", what, (long long)r, got, want);
            }
            norm_free(&a);
            norm_free(&b);
        }
    const int64_t mm[][4] = { { 3, 5, 7, 4 }, { 2, 33, 17, 35 }, { 1, 1, 1, 1 }, { 0, 2, 2, 2 }, { 5, 64, 32, 64 } };
    for (int c = 0; c < 5; c++)
        for (int t = 0; t < 8; t++) {
            bmm_io a, b;
            int ta = t & 1, tb = (t >> 1) & 1, sh = (t >> 2) & 1;
            bmm_alloc(&a, mm[c][0], mm[c][1], mm[c][2], mm[c][3], ta, tb, sh, 0.5f, c & 1 ? 1.0f : 0.0f);
            bmm_alloc(&b, mm[c][0], mm[c][1], mm[c][2], mm[c][3], ta, tb, sh, 0.5f, c & 1 ? 1.0f : 0.0f);
            bmm_run(RT, &a);
            bmm_run(gpu, &b);
            snprintf(what, sizeof what, "%s matmul_batched case %d ta%d tb%d shared%d", bn, c, ta, tb, sh);
            nearf(what, b.c, a.c, a.nb * a.m * a.n, 1e-5);
            bmm_free(&a);
            bmm_free(&b);
        }
    const geo gs[] = { { 2, 5, 5, 4, 3, 1, 0.0f },
                       { 1, 70, 70, 17, 9, 1, 0.0f },
                       { 2, 4, 6, 3, 2, 0, 0.5f },
                       { 1, 1, 1, 8, 8, 1, 0.0f },
                       { 1, 3, 130, 5, 4, 0, 0.0f } };
    for (size_t c = 0; c < sizeof gs / sizeof gs[0]; c++) {
        attn_io a, b;
        attn_alloc(&a, gs[c], (unsigned)(70 + c), 1);
        attn_alloc(&b, gs[c], (unsigned)(70 + c), 1);
        attn_run(RT, &a);
        attn_run(gpu, &b);
        geo g = gs[c];
        snprintf(what, sizeof what, "%s attention case %zu", bn, c);
        nearf(what, b.out, a.out, g.bh * g.tq * g.dv, 1e-5);
        nearf(what, b.st, a.st, g.bh * g.tq * 2, 1e-4);
        nearf(what, b.dq, a.dq, g.bh * g.tq * g.d, 1e-4);
        nearf(what, b.dk, a.dk, g.bh * g.tk * g.d, 1e-4);
        nearf(what, b.dv, a.dv, g.bh * g.tk * g.dv, 1e-4);
        attn_kv_only(gpu, &b, (unsigned)(70 + c), what);
        attn_free(&a);
        attn_free(&b);
    }
    dpar_runtime_destroy(gpu);
}
static void test_parity_vulkan(void **state) {
    (void)state;
    parity(DPAR_BACKEND_VULKAN);
}
static void test_parity_cuda(void **state) {
    (void)state;
    parity(DPAR_BACKEND_CUDA);
}

int main(void) {
    t_watchdog("test_norm_attn: still running after 300 s: a hang\n", 300);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_norm_constant_row_returns_bias),
        cmocka_unit_test(test_layer_norm_gradients),
        cmocka_unit_test(test_rms_norm_gradients),
        cmocka_unit_test(test_norm_empty_and_optional),
        cmocka_unit_test(test_norm_errors),
        cmocka_unit_test(test_matmul_batched),
        cmocka_unit_test(test_attention_one_token_returns_v),
        cmocka_unit_test(test_attention_causal_mask),
        cmocka_unit_test(test_attention_gradients),
        cmocka_unit_test(test_attention_errors),
        cmocka_unit_test(test_graph_layers),
        cmocka_unit_test(test_graph_layers_vulkan),
        cmocka_unit_test(test_graph_layer_errors),
        cmocka_unit_test(test_parity_vulkan),
        cmocka_unit_test(test_parity_cuda),
    };
    return cmocka_run_group_tests(tests, t_setup, t_teardown);
}
