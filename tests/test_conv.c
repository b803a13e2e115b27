/* conv2d (NHWC input, HWIO kernel) and 2-D avg / max pools with their
   gradients: exact small cases (a 3x3 image and a known kernel, SAME and
   VALID; max pool with ties), every op against a double-precision reference
   computed here (geometry derived here too, from XLA's padding formulas),
   gradients against central finite differences of that reference in double,
   the GPU backends (Vulkan, CUDA) against the CPU backend, graph nodes'
   gradients against finite differences (CPU and Vulkan), and the errors of
   bad shapes and desc fields. A backend that is missing prints SKIPPED. */
#include "testutil.h"

/* ---- cases: one row each ------------------------------------------------- */
typedef struct ccase {
    const char *name;
    int64_t x[4];      /* N H W C */
    int64_t kh, kw, o; /* kernel [kh, kw, C, o] */
    dpar_conv2d_desc d;
    int bias, fd; /* fd: also check the gradients by finite differences (small cases) */
} ccase;
static const ccase CONV[] = {
    { "3x3 SAME", { 2, 5, 6, 3 }, 3, 3, 4, { { 0, 0 }, { 0, 0 }, DPAR_PADDING_DEFAULT, { { 0, 0 }, { 0, 0 } } }, 1, 1 },
    { "3x3 VALID stride 2", { 2, 7, 6, 3 }, 3, 3, 5, { { 2, 2 }, { 0, 0 }, DPAR_PADDING_VALID, { { 0 } } }, 1, 1 },
    { "dilation 2 SAME", { 1, 7, 7, 2 }, 3, 3, 3, { { 0, 0 }, { 2, 2 }, DPAR_PADDING_SAME, { { 0 } } }, 0, 1 },
    { "explicit pads, stride (2,1), dilation (1,2)",
      { 2, 6, 5, 3 },
      2,
      3,
      7,
      { { 2, 1 }, { 1, 2 }, DPAR_PADDING_EXPLICIT, { { 1, 2 }, { 0, 3 } } },
      1,
      1 },
    { "size-1 dims", { 1, 1, 1, 1 }, 1, 1, 1, { { 0 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } } }, 1, 1 },
    { "1x1 conv (x read in place)", { 2, 4, 3, 5 }, 1, 1, 6, { { 0 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } } }, 1, 1 },
    { "1x1 stride 2", { 2, 5, 5, 3 }, 1, 1, 2, { { 2, 2 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } } }, 0, 1 },
    { "kernel wider than the image, SAME",
      { 1, 2, 3, 2 },
      5,
      5,
      3,
      { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } },
      1,
      1 },
    { "SAME stride 2 on an even size",
      { 1, 6, 6, 2 },
      3,
      3,
      2,
      { { 2, 2 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } },
      1,
      1 },
    { "5x2 kernel, stride (3,1), C 7, O 13",
      { 1, 9, 4, 7 },
      5,
      2,
      13,
      { { 3, 1 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } },
      1,
      1 },
    { "batch 0", { 0, 4, 4, 2 }, 3, 3, 2, { { 0 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } } }, 1, 0 },
    /* more im2col rows than one scratch block (K = 576: 906 rows a block) */
    { "blocked im2col, 2x28x28x64 -> 8",
      { 2, 28, 28, 64 },
      3,
      3,
      8,
      { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } },
      1,
      0 },
    { "seed CNN conv 2", { 2, 14, 14, 32 }, 3, 3, 64, { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } }, 1, 0 },
    /* one channel: the kernel gradient builds im2col's transpose, a span of x's row per tap and output row
       (k blocks of 256 output pixels starting inside an image, taps off every edge, strides, dilations) */
    { "C 1, two k blocks", { 3, 12, 12, 1 }, 3, 3, 4, { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } }, 1, 1 },
    { "one channel, explicit pads, stride (2,3), dilation (2,2)",
      { 2, 9, 8, 1 },
      3,
      2,
      3,
      { { 2, 3 }, { 2, 2 }, DPAR_PADDING_EXPLICIT, { { 1, 2 }, { 2, 1 } } },
      1,
      1 },
    { "one channel, kernel wider than the image, SAME",
      { 1, 2, 3, 1 },
      5,
      5,
      3,
      { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } },
      0,
      1 },
};
typedef struct pcase {
    const char *name;
    int64_t x[4];
    dpar_pool2d_desc d;
} pcase;
static const pcase POOL[] = {
    { "2x2 (defaults)", { 2, 4, 6, 3 }, { { 0 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } }, false } },
    { "3x3 stride 2 SAME", { 1, 5, 5, 2 }, { { 3, 3 }, { 2, 2 }, DPAR_PADDING_SAME, { { 0 } }, false } },
    { "3x3 stride 2 SAME, exclude pad", { 1, 5, 5, 2 }, { { 3, 3 }, { 2, 2 }, DPAR_PADDING_SAME, { { 0 } }, true } },
    { "3x2 stride 1 overlapping", { 2, 5, 4, 3 }, { { 3, 2 }, { 1, 1 }, DPAR_PADDING_VALID, { { 0 } }, false } },
    { "explicit pads, exclude pad",
      { 1, 4, 5, 5 },
      { { 2, 3 }, { 1, 2 }, DPAR_PADDING_EXPLICIT, { { 1, 2 }, { 2, 1 } }, true } },
    { "size-1 dims", { 1, 1, 1, 1 }, { { 1, 1 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } }, false } },
    { "batch 0", { 0, 4, 4, 2 }, { { 0 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } }, false } },
    { "seed CNN pool", { 2, 28, 28, 32 }, { { 2, 2 }, { 2, 2 }, DPAR_PADDING_VALID, { { 0 } }, false } },
};
#define NCONV (sizeof CONV / sizeof CONV[0])
#define NPOOL (sizeof POOL / sizeof POOL[0])

/* ---- reference geometry, written from the formulas in lax / XLA ---------- */
typedef struct geom {
    int64_t n, h, w, c, oh, ow, o, kh, kw, sh, sw, dh, dw, pt, pl;
    int excl;
} geom;
static void ref_dim(int64_t in, int64_t k, int64_t s, int64_t d, dpar_padding mode, const int *pads, int64_t *out,
                    int64_t *lo) {
    int64_t ek = (k - 1) * d + 1;
    if (mode == DPAR_PADDING_SAME) {
        *out = (in + s - 1) / s;
        int64_t tot = (*out - 1) * s + ek - in;
        *lo = tot > 0 ? tot / 2 : 0;
    } else if (mode == DPAR_PADDING_VALID) {
        *out = (in - ek) / s + 1;
        *lo = 0;
    } else {
        *out = (in + pads[0] + pads[1] - ek) / s + 1;
        *lo = pads[0];
    }
}
static geom conv_geom(const ccase *c) {
    geom g = { c->x[0], c->x[1], c->x[2], c->x[3], 0, 0, c->o, c->kh, c->kw, 1, 1, 1, 1, 0, 0, 0 };
    if (c->d.stride[0]) g.sh = c->d.stride[0], g.sw = c->d.stride[1];
    if (c->d.dilation[0]) g.dh = c->d.dilation[0], g.dw = c->d.dilation[1];
    dpar_padding m = c->d.padding ? c->d.padding : DPAR_PADDING_SAME;
    ref_dim(g.h, g.kh, g.sh, g.dh, m, c->d.pad[0], &g.oh, &g.pt);
    ref_dim(g.w, g.kw, g.sw, g.dw, m, c->d.pad[1], &g.ow, &g.pl);
    return g;
}
static geom pool_geom(const pcase *c) {
    geom g = { c->x[0], c->x[1], c->x[2], c->x[3], 0, 0, c->x[3], 2, 2, 2, 2, 1, 1, 0, 0, c->d.count_exclude_pad };
    if (c->d.window[0]) g.kh = c->d.window[0], g.kw = c->d.window[1];
    g.sh = c->d.stride[0] ? c->d.stride[0] : g.kh;
    g.sw = c->d.stride[1] ? c->d.stride[1] : g.kw;
    dpar_padding m = c->d.padding ? c->d.padding : DPAR_PADDING_VALID;
    ref_dim(g.h, g.kh, g.sh, 1, m, c->d.pad[0], &g.oh, &g.pt);
    ref_dim(g.w, g.kw, g.sw, 1, m, c->d.pad[1], &g.ow, &g.pl);
    return g;
}
static int64_t nx(const geom *g) {
    return g->n * g->h * g->w * g->c;
}
static int64_t ny(const geom *g) {
    return g->n * g->oh * g->ow * g->o;
}
static int64_t nw(const geom *g) {
    return g->kh * g->kw * g->c * g->o;
}
/* x index of window position (p, q) of output (n, i, j), channel ch; -1 in the padding */
static int64_t xat(const geom *g, int64_t n, int64_t i, int64_t j, int64_t p, int64_t q, int64_t ch) {
    int64_t ih = i * g->sh - g->pt + p * g->dh, iw = j * g->sw - g->pl + q * g->dw;
    if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w) return -1;
    return ((n * g->h + ih) * g->w + iw) * g->c + ch;
}

/* ---- references in double ------------------------------------------------ */
static void ref_conv(const geom *g, const double *x, const double *w, const double *b, double *y) {
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t i = 0; i < g->oh; i++)
            for (int64_t j = 0; j < g->ow; j++)
                for (int64_t o = 0; o < g->o; o++) {
                    double acc = b ? b[o] : 0.0;
                    for (int64_t p = 0; p < g->kh; p++)
                        for (int64_t q = 0; q < g->kw; q++)
                            for (int64_t ch = 0; ch < g->c; ch++) {
                                int64_t a = xat(g, n, i, j, p, q, ch);
                                if (a >= 0) acc += x[a] * w[((p * g->kw + q) * g->c + ch) * g->o + o];
                            }
                    y[((n * g->oh + i) * g->ow + j) * g->o + o] = acc;
                }
}
/* dx, dw, db of sum(y * dy), by direct scatter */
static void ref_conv_bwd(const geom *g, const double *x, const double *w, const double *dy, double *dx, double *dw,
                         double *db) {
    memset(dx, 0, (size_t)nx(g) * sizeof(double));
    memset(dw, 0, (size_t)nw(g) * sizeof(double));
    memset(db, 0, (size_t)g->o * sizeof(double));
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t i = 0; i < g->oh; i++)
            for (int64_t j = 0; j < g->ow; j++)
                for (int64_t o = 0; o < g->o; o++) {
                    double gy = dy[((n * g->oh + i) * g->ow + j) * g->o + o];
                    db[o] += gy;
                    for (int64_t p = 0; p < g->kh; p++)
                        for (int64_t q = 0; q < g->kw; q++)
                            for (int64_t ch = 0; ch < g->c; ch++) {
                                int64_t a = xat(g, n, i, j, p, q, ch), k = ((p * g->kw + q) * g->c + ch) * g->o + o;
                                if (a < 0) continue;
                                dx[a] += w[k] * gy;
                                dw[k] += x[a] * gy;
                            }
                }
}
/* avg (is_max 0) or max pool; argmax (may be NULL) gets the first maximum's x index per output */
static void ref_pool(const geom *g, int is_max, const double *x, double *y, int64_t *argmax) {
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t i = 0; i < g->oh; i++)
            for (int64_t j = 0; j < g->ow; j++)
                for (int64_t ch = 0; ch < g->c; ch++) {
                    double acc = 0.0, best = -INFINITY;
                    int64_t cnt = 0, arg = -1;
                    for (int64_t p = 0; p < g->kh; p++)
                        for (int64_t q = 0; q < g->kw; q++) {
                            int64_t a = xat(g, n, i, j, p, q, ch);
                            if (a < 0) continue;
                            cnt++;
                            acc += x[a];
                            if (arg < 0 || x[a] > best) best = x[a], arg = a;
                        }
                    int64_t yi = ((n * g->oh + i) * g->ow + j) * g->c + ch, div = g->excl ? cnt : g->kh * g->kw;
                    y[yi] = is_max ? best : div ? acc / (double)div : NAN;
                    if (argmax) argmax[yi] = arg;
                }
}

/* ---- data and buffers ---------------------------------------------------- */
static float rnd(uint32_t *s) { /* [-1, 1) */
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 8388608.0f - 1.0f;
}
static float *rnd_vec(int64_t n, uint32_t seed) {
    float *v = malloc((size_t)(n + 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = rnd(&seed);
    return v;
}
static double *dbl(const float *v, int64_t n) {
    double *d = malloc((size_t)(n + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = v[i];
    return d;
}
static dpar_buffer *mk(dpar_runtime *rt, int ndim, const int64_t *shape, const float *data) {
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, ndim, shape, &b));
    if (data && dpar_buffer_nbytes(b)) T_OK(dpar_buffer_write(b, 0, data, dpar_buffer_nbytes(b)));
    return b;
}
static float *rd(const dpar_buffer *b) {
    size_t nb = dpar_buffer_nbytes(b);
    float *v = malloc(nb + sizeof(float));
    if (nb) T_OK(dpar_buffer_read(b, 0, v, nb));
    return v;
}
/* |got - want| <= tol * (1 + |want|) for all, else fail naming the first */
static void near(const char *what, const char *name, const float *got, const double *want, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        if ((double)got[i] != want[i] && !(isnan(got[i]) && isnan(want[i])) &&
            !(fabs((double)got[i] - want[i]) <= tol * (1.0 + fabs(want[i]))))
            fail_msg("%s %s: element %lld is %.9g, expected %.9g", name, what, (long long)i, (double)got[i], want[i]);
}

static void near_f(const char *what, const char *name, const float *got, const float *want, int64_t n, double tol) {
    double *w = dbl(want, n);
    near(what, name, got, w, n, tol);
    free(w);
}

/* ---- running the ops on a runtime ---------------------------------------- */
typedef struct conv_out {
    float *y, *dx, *dw, *db;
} conv_out;
static void conv_run(dpar_runtime *rt, const ccase *c, const geom *g, const float *x, const float *w, const float *b,
                     const float *dy, conv_out *r) {
    int64_t ys[4] = { g->n, g->oh, g->ow, g->o }, ws[4] = { g->kh, g->kw, g->c, g->o }, bs = g->o, got[4];
    T_OK(dpar_conv2d_output_shape(c->x, ws, &c->d, got));
    if (memcmp(got, ys, sizeof ys)) fail_msg("%s: dpar_conv2d_output_shape disagrees with the reference", c->name);
    dpar_buffer *X = mk(rt, 4, c->x, x), *W = mk(rt, 4, ws, w), *B = mk(rt, 1, &bs, b), *Y = mk(rt, 4, ys, NULL);
    dpar_buffer *DY = mk(rt, 4, ys, dy), *DX = mk(rt, 4, c->x, NULL), *DW = mk(rt, 4, ws, NULL),
                *DB = mk(rt, 1, &bs, NULL);
    T_OK(dpar_conv2d(Y, X, W, c->bias ? B : NULL, &c->d));
    T_OK(dpar_conv2d_backward_input(DX, DY, W, &c->d));
    T_OK(dpar_conv2d_backward_kernel(DW, DB, X, DY, &c->d));
    r->y = rd(Y), r->dx = rd(DX), r->dw = rd(DW), r->db = rd(DB);
    dpar_buffer *all[] = { X, W, B, Y, DY, DX, DW, DB };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dpar_buffer_destroy(all[i]);
}
static void conv_free(conv_out *r) {
    free(r->y), free(r->dx), free(r->dw), free(r->db);
}
typedef struct conv_data {
    geom g;
    float *x, *w, *b, *dy;
} conv_data;
static conv_data conv_data_make(const ccase *c, uint32_t seed) {
    conv_data d;
    d.g = conv_geom(c);
    d.x = rnd_vec(nx(&d.g), seed), d.w = rnd_vec(nw(&d.g), seed + 1);
    d.b = rnd_vec(d.g.o, seed + 2), d.dy = rnd_vec(ny(&d.g), seed + 3);
    return d;
}
static void conv_data_free(conv_data *d) {
    free(d->x), free(d->w), free(d->b), free(d->dy);
}
typedef struct pool_out {
    float *ya, *dxa, *ym, *dxm; /* avg, max */
} pool_out;
static void pool_run(dpar_runtime *rt, const pcase *c, const geom *g, const float *x, const float *dy, pool_out *r) {
    int64_t ys[4] = { g->n, g->oh, g->ow, g->c }, got[4];
    T_OK(dpar_pool2d_output_shape(c->x, &c->d, got));
    if (memcmp(got, ys, sizeof ys)) fail_msg("%s: dpar_pool2d_output_shape disagrees with the reference", c->name);
    dpar_buffer *X = mk(rt, 4, c->x, x), *Y = mk(rt, 4, ys, NULL), *DY = mk(rt, 4, ys, dy), *DX = mk(rt, 4, c->x, NULL);
    T_OK(dpar_avg_pool2d(Y, X, &c->d));
    r->ya = rd(Y);
    T_OK(dpar_avg_pool2d_backward(DX, DY, &c->d));
    r->dxa = rd(DX);
    T_OK(dpar_max_pool2d(Y, X, &c->d));
    r->ym = rd(Y);
    T_OK(dpar_max_pool2d_backward(DX, DY, X, &c->d));
    r->dxm = rd(DX);
    dpar_buffer_destroy(X), dpar_buffer_destroy(Y), dpar_buffer_destroy(DY), dpar_buffer_destroy(DX);
}
static void pool_free(pool_out *r) {
    free(r->ya), free(r->dxa), free(r->ym), free(r->dxm);
}
/* distinct values (spaced 1/64, exact in f32) so that argmaxes survive finite differences */
static float *distinct_vec(int64_t n, uint32_t seed) {
    float *v = malloc((size_t)(n + 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 7919 + seed) % (n ? n : 1)) / 64.0f - 2.0f;
    return v;
}

static dpar_runtime *CPU;
static int setup(void **st) {
    (void)st;
    CPU = t_runtime(DPAR_BACKEND_CPU, 1);
    return CPU ? 0 : -1;
}
static int teardown(void **st) {
    (void)st;
    dpar_runtime_destroy(CPU);
    return 0;
}

/* ---- exact small cases --------------------------------------------------- */
static void test_conv_exact_3x3(void **st) {
    (void)st;
    const float img[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, ker[9] = { 1, 0, 2, 0, 1, 0, -1, 0, 0 };
    const float same[9] = { 1, -2, -2, 8, 5, 0, 17, 24, 14 }, bias = 0.5f;
    int64_t xs[4] = { 1, 3, 3, 1 }, ws[4] = { 3, 3, 1, 1 }, vs[4] = { 1, 1, 1, 1 }, one = 1;
    dpar_buffer *X = mk(CPU, 4, xs, img), *W = mk(CPU, 4, ws, ker), *Y = mk(CPU, 4, xs, NULL),
                *V = mk(CPU, 4, vs, NULL);
    dpar_buffer *B = mk(CPU, 1, &one, &bias);
    T_OK(dpar_conv2d(Y, X, W, NULL, NULL)); /* NULL desc: SAME, stride 1 */
    float *y = rd(Y);
    for (int i = 0; i < 9; i++) assert_true(y[i] == same[i]);
    free(y);
    dpar_conv2d_desc valid = { { 0 }, { 0 }, DPAR_PADDING_VALID, { { 0 } } };
    T_OK(dpar_conv2d(V, X, W, B, &valid));
    y = rd(V);
    assert_true(y[0] == 5.5f); /* 1*1 + 3*2 + 5*1 - 7 + 0.5 */
    free(y);
    dpar_buffer_destroy(X), dpar_buffer_destroy(W), dpar_buffer_destroy(Y), dpar_buffer_destroy(V);
    dpar_buffer_destroy(B);
}
static void test_pool_exact(void **st) {
    (void)st;
    /* overlapping 2x2 windows, stride 1, with ties: the gradient goes to the first maximum only */
    const float img[9] = { 1, 5, 5, 5, 2, 5, 0, 5, 1 }, dy[4] = { 1, 2, 3, 4 };
    const float want_dx[9] = { 0, 3, 0, 3, 0, 4, 0, 0, 0 }, want_avg[4] = { 13 / 4.f, 17 / 4.f, 12 / 4.f, 13 / 4.f };
    int64_t xs[4] = { 1, 3, 3, 1 }, ys[4] = { 1, 2, 2, 1 };
    dpar_pool2d_desc d = { { 2, 2 }, { 1, 1 }, DPAR_PADDING_VALID, { { 0 } }, false };
    dpar_buffer *X = mk(CPU, 4, xs, img), *Y = mk(CPU, 4, ys, NULL), *DY = mk(CPU, 4, ys, dy),
                *DX = mk(CPU, 4, xs, NULL);
    T_OK(dpar_max_pool2d(Y, X, &d));
    float *y = rd(Y);
    for (int i = 0; i < 4; i++) assert_true(y[i] == 5.0f);
    free(y);
    T_OK(dpar_max_pool2d_backward(DX, DY, X, &d));
    float *dx = rd(DX);
    for (int i = 0; i < 9; i++)
        if (dx[i] != want_dx[i]) fail_msg("max pool dx[%d] = %g, expected %g", i, (double)dx[i], (double)want_dx[i]);
    free(dx);
    T_OK(dpar_avg_pool2d(Y, X, &d));
    y = rd(Y);
    for (int i = 0; i < 4; i++) assert_true(y[i] == want_avg[i]);
    free(y);
    /* all four equal, 2x2 window, default stride 2: one output, the gradient to element 0 */
    const float flat[4] = { 3, 3, 3, 3 }, g1 = 7;
    int64_t x2[4] = { 1, 2, 2, 1 }, y2[4] = { 1, 1, 1, 1 };
    dpar_buffer *X2 = mk(CPU, 4, x2, flat), *DY2 = mk(CPU, 4, y2, &g1), *DX2 = mk(CPU, 4, x2, NULL);
    T_OK(dpar_max_pool2d_backward(DX2, DY2, X2, NULL));
    dx = rd(DX2);
    assert_true(dx[0] == 7.0f && dx[1] == 0.0f && dx[2] == 0.0f && dx[3] == 0.0f);
    free(dx);
    dpar_buffer *all[] = { X, Y, DY, DX, X2, DY2, DX2 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dpar_buffer_destroy(all[i]);
}

/* ---- CPU against the double reference, gradients by finite differences ---- */
/* d(sum y*dy)/dv[i] by central differences of the double reference (f: which operand) */
/* The average pools bit for bit, NaN payloads included, against sums written here in their order: forward 0 +
   the window's pixels in row-major order, then / cnt (NaN for an empty window); backward each window pixel of
   dx += dy / cnt, output pixels in order. Of two NaNs a sum keeps the pixel's (the added term's). 17 and 33
   channels: AVX-512 lanes and the channels past them, which used to keep the running sum's NaN instead;
   1 and 3 threads. The max pools likewise: the first maximum in row-major window order (NaN beats numbers,
   the first NaN later ones; ties, one x in 3 set to 0.5, go to the first), -inf for a window wholly in the
   padding, and dx += dy at each window's winner, keeping dy's NaN of two. */
static float nan_add(float acc, float v) {
    return v != v ? v + v : acc + v;
}
static void same_bits(const char *name, const char *threads, const char *what, const float *got, const float *want,
                      int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (t_f2u(got[i]) != t_f2u(want[i]))
            fail_msg("%s, %s threads: %s[%lld] = %08x, want %08x", name, threads, what, (long long)i, t_f2u(got[i]),
                     t_f2u(want[i]));
}
static void test_pool_bits(void **st) {
    (void)st;
    static const pcase cases[4] = {
        { "3x3 stride 1 SAME, 17 channels",
          { 2, 6, 5, 17 },
          { { 3, 3 }, { 1, 1 }, DPAR_PADDING_SAME, { { 0 } }, false } },
        { "2x3 stride 2 SAME exclude pad, 33 channels",
          { 1, 7, 6, 33 },
          { { 2, 3 }, { 2, 2 }, DPAR_PADDING_SAME, { { 0 } }, true } },
        { "2x2, 16 channels", { 2, 4, 4, 16 }, { { 2, 2 }, { 2, 2 }, DPAR_PADDING_VALID, { { 0 } }, false } },
        { "2x2 stride 1, pads (3, 0) (0, 3): windows wholly in the padding, 20 channels",
          { 1, 3, 3, 20 },
          { { 2, 2 }, { 1, 1 }, DPAR_PADDING_EXPLICIT, { { 3, 0 }, { 0, 3 } }, false } },
    };
    const char *threads[2] = { "1", "3" };
    for (int k = 0; k < 4; k++) {
        const pcase *c = &cases[k];
        geom g = pool_geom(c);
        int64_t n_x = nx(&g), n_y = g.n * g.oh * g.ow * g.c;
        float *x = rnd_vec(n_x, 7u + (uint32_t)k), *dy = rnd_vec(n_y, 11u + (uint32_t)k);
        uint32_t s = 99u;
        for (int64_t i = 0; i < n_x + n_y; i++) { /* a NaN of its own payload in one element of 4 */
            float *e = i < n_x ? &x[i] : &dy[i - n_x];
            s = s * 1664525u + 1013904223u;
            uint32_t u = (s >> 9 & 1 ? 0xffc00000u : 0x7fc00000u) | (s >> 10 & 0x3fffffu);
            if ((s >> 28) < 4)
                memcpy(e, &u, sizeof u);
            else if (i < n_x && (s >> 28) < 9)
                *e = 0.5f;
        }
        float *ya = calloc((size_t)n_y + 1, sizeof(float)), *dxa = calloc((size_t)n_x + 1, sizeof(float));
        float *ym = calloc((size_t)n_y + 1, sizeof(float)), *dxm = calloc((size_t)n_x + 1, sizeof(float));
        for (int64_t n = 0; n < g.n; n++)
            for (int64_t i = 0; i < g.oh; i++)
                for (int64_t j = 0; j < g.ow; j++)
                    for (int64_t ch = 0; ch < g.c; ch++) {
                        int64_t cnt = 0, o = ((n * g.oh + i) * g.ow + j) * g.c + ch;
                        float acc = 0.0f;
                        for (int64_t p = 0; p < g.kh; p++)
                            for (int64_t q = 0; q < g.kw; q++) {
                                int64_t xi = xat(&g, n, i, j, p, q, ch);
                                if (xi >= 0) acc = nan_add(acc, x[xi]), cnt++;
                            }
                        if (!g.excl) cnt = g.kh * g.kw;
                        ya[o] = cnt ? acc / (float)cnt : NAN;
                        for (int64_t p = 0; p < g.kh; p++)
                            for (int64_t q = 0; q < g.kw; q++) {
                                int64_t xi = xat(&g, n, i, j, p, q, ch);
                                if (xi >= 0) dxa[xi] = nan_add(dxa[xi], dy[o] / (float)cnt);
                            }
                        int64_t arg = -1;
                        for (int64_t p = 0; p < g.kh; p++)
                            for (int64_t q = 0; q < g.kw; q++) {
                                int64_t xi = xat(&g, n, i, j, p, q, ch);
                                if (xi >= 0 && (arg < 0 || x[xi] > x[arg] || (x[xi] != x[xi] && x[arg] == x[arg])))
                                    arg = xi;
                            }
                        ym[o] = arg < 0 ? -INFINITY : x[arg];
                        if (arg >= 0) dxm[arg] = nan_add(dxm[arg], dy[o]);
                    }
        for (int t = 0; t < 2; t++) {
            dpar_runtime *rt = t_cpu_runtime_threads(threads[t]);
            pool_out r;
            pool_run(rt, c, &g, x, dy, &r);
            same_bits(c->name, threads[t], "avg y", r.ya, ya, n_y);
            same_bits(c->name, threads[t], "avg dx", r.dxa, dxa, n_x);
            same_bits(c->name, threads[t], "max y", r.ym, ym, n_y);
            same_bits(c->name, threads[t], "max dx", r.dxm, dxm, n_x);
            pool_free(&r);
            dpar_runtime_destroy(rt);
        }
        free(x), free(dy), free(ya), free(dxa), free(ym), free(dxm);
    }
}
static double fd_conv(const geom *g, double *x, double *w, const double *dy, double *v, int64_t i, double *ybuf) {
    const double h = 1e-3, v0 = v[i];
    double lp = 0, lm = 0;
    v[i] = v0 + h;
    ref_conv(g, x, w, NULL, ybuf);
    for (int64_t k = 0; k < ny(g); k++) lp += ybuf[k] * dy[k];
    v[i] = v0 - h;
    ref_conv(g, x, w, NULL, ybuf);
    for (int64_t k = 0; k < ny(g); k++) lm += ybuf[k] * dy[k];
    v[i] = v0;
    return (lp - lm) / (2 * h);
}
static void test_conv_cpu(void **st) {
    (void)st;
    for (size_t ci = 0; ci < NCONV; ci++) {
        const ccase *c = &CONV[ci];
        conv_data d = conv_data_make(c, (uint32_t)(100 + ci));
        const geom *g = &d.g;
        double *x = dbl(d.x, nx(g)), *w = dbl(d.w, nw(g)), *b = dbl(d.b, g->o), *dy = dbl(d.dy, ny(g));
        double *y = malloc((size_t)(ny(g) + 1) * 8), *dx = malloc((size_t)(nx(g) + 1) * 8);
        double *dw = malloc((size_t)(nw(g) + 1) * 8), *db = malloc((size_t)(g->o + 1) * 8);
        conv_out r;
        conv_run(CPU, c, g, d.x, d.w, d.b, d.dy, &r);
        ref_conv(g, x, w, c->bias ? b : NULL, y);
        ref_conv_bwd(g, x, w, dy, dx, dw, db);
        near("y", c->name, r.y, y, ny(g), 1e-5);
        near("dx", c->name, r.dx, dx, nx(g), 1e-5);
        near("dw", c->name, r.dw, dw, nw(g), 1e-5);
        near("db", c->name, r.db, db, g->o, 1e-5);
        if (c->fd) { /* the op's gradients against finite differences (the loss is bilinear: tight) */
            double *fdx = malloc((size_t)(nx(g) + 1) * 8), *fdw = malloc((size_t)(nw(g) + 1) * 8);
            for (int64_t i = 0; i < nx(g); i++) fdx[i] = fd_conv(g, x, w, dy, x, i, y);
            for (int64_t i = 0; i < nw(g); i++) fdw[i] = fd_conv(g, x, w, dy, w, i, y);
            near("dx vs finite differences", c->name, r.dx, fdx, nx(g), 1e-5);
            near("dw vs finite differences", c->name, r.dw, fdw, nw(g), 1e-5);
            free(fdx), free(fdw);
        }
        conv_free(&r);
        conv_data_free(&d);
        free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
    }
}
static void test_pool_cpu(void **st) {
    (void)st;
    for (size_t pi = 0; pi < NPOOL; pi++) {
        const pcase *c = &POOL[pi];
        geom g = pool_geom(c);
        float *xf = distinct_vec(nx(&g), (uint32_t)(3 + pi)), *dyf = rnd_vec(ny(&g), (uint32_t)(7 + pi));
        double *x = dbl(xf, nx(&g)), *ya = malloc((size_t)(ny(&g) + 1) * 8), *ym = malloc((size_t)(ny(&g) + 1) * 8);
        double *fda = malloc((size_t)(nx(&g) + 1) * 8), *fdm = malloc((size_t)(nx(&g) + 1) * 8);
        pool_out r;
        pool_run(CPU, c, &g, xf, dyf, &r);
        ref_pool(&g, 0, x, ya, NULL);
        ref_pool(&g, 1, x, ym, NULL);
        near("avg y", c->name, r.ya, ya, ny(&g), 1e-6);
        near("max y", c->name, r.ym, ym, ny(&g), 0);
        if (!strcmp(c->name, "explicit pads, exclude pad")) { /* its last output row lies in the bottom pad */
            int64_t nan = 0;
            for (int64_t k = 0; k < ny(&g); k++) nan += isnan(r.ya[k]);
            if (nan != g.ow * g.c)
                fail_msg("%s: %lld NaN averages, expected %lld", c->name, (long long)nan, (long long)(g.ow * g.c));
        }
        for (int64_t i = 0; i < nx(&g) && nx(&g) <= 4096; i++) { /* central differences, both pools */
            const double h = 1e-4, x0 = x[i];
            double l[2][2] = { { 0, 0 }, { 0, 0 } };
            for (int side = 0; side < 2; side++) {
                x[i] = x0 + (side ? -h : h);
                for (int m = 0; m < 2; m++) {
                    ref_pool(&g, m, x, m ? ym : ya, NULL);
                    for (int64_t k = 0; k < ny(&g); k++) /* a window wholly in the padding: -inf or NaN, no gradient */
                        if (isfinite((m ? ym : ya)[k])) l[m][side] += (m ? ym : ya)[k] * dyf[k];
                }
            }
            x[i] = x0;
            fda[i] = (l[0][0] - l[0][1]) / (2 * h);
            fdm[i] = (l[1][0] - l[1][1]) / (2 * h);
        }
        if (nx(&g) <= 4096) {
            near("avg dx vs finite differences", c->name, r.dxa, fda, nx(&g), 1e-5);
            near("max dx vs finite differences", c->name, r.dxm, fdm, nx(&g), 1e-5);
        }
        pool_free(&r);
        free(xf), free(dyf), free(x), free(ya), free(ym), free(fda), free(fdm);
    }
}

/* ---- GPU backends against the CPU backend -------------------------------- */
/* Long sums: each of dw's elements 8 x 30 x 30 = 7,200 terms. llvmpipe ends an invocation's loops after
   65,535 iterations, all loops together: 16 such sums an invocation came out wrong (elements of dw left
   unwritten), with no error. Tolerance 1e-3: f32 sums of 7,200 terms in two orders. */
static const ccase LONG_SUMS = {
    "long sums, 8x30x30x32 -> 64", { 8, 30, 30, 32 }, 3, 3, 64, { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } }, 1, 0
};
/* conv tolerance 1e-4: the GPU kernels sum each output in one sequence, the CPU in GEMM blocks */
static void backend_parity(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    if (!rt) return;
    for (size_t ci = 0; ci <= NCONV; ci++) {
        const ccase *c = ci < NCONV ? &CONV[ci] : &LONG_SUMS;
        double tol = ci < NCONV ? 1e-4 : 1e-3;
        conv_data d = conv_data_make(c, (uint32_t)(300 + ci));
        conv_out a, b;
        conv_run(CPU, c, &d.g, d.x, d.w, d.b, d.dy, &a);
        conv_run(rt, c, &d.g, d.x, d.w, d.b, d.dy, &b);
        near_f("y", c->name, b.y, a.y, ny(&d.g), tol);
        near_f("dx", c->name, b.dx, a.dx, nx(&d.g), tol);
        near_f("dw", c->name, b.dw, a.dw, nw(&d.g), tol);
        near_f("db", c->name, b.db, a.db, d.g.o, tol);
        conv_free(&a), conv_free(&b);
        conv_data_free(&d);
    }
    for (size_t pi = 0; pi < NPOOL; pi++) {
        const pcase *c = &POOL[pi];
        geom g = pool_geom(c);
        float *x = rnd_vec(nx(&g), (uint32_t)(5 + pi)), *dy = rnd_vec(ny(&g), (uint32_t)(9 + pi));
        if (nx(&g) > 1) x[1] = x[0]; /* a tie */
        pool_out a, b;
        pool_run(CPU, c, &g, x, dy, &a);
        pool_run(rt, c, &g, x, dy, &b);
        near_f("avg y", c->name, b.ya, a.ya, ny(&g), 1e-6);
        near_f("avg dx", c->name, b.dxa, a.dxa, nx(&g), 1e-6);
        near_f("max y", c->name, b.ym, a.ym, ny(&g), 0);
        near_f("max dx", c->name, b.dxm, a.dxm, nx(&g), 0);
        pool_free(&a), pool_free(&b);
        free(x), free(dy);
    }
    dpar_runtime_destroy(rt);
}
static void test_vulkan_vs_cpu(void **st) {
    (void)st;
    backend_parity(DPAR_BACKEND_VULKAN);
}
static void test_cuda_vs_cpu(void **st) {
    (void)st;
    backend_parity(DPAR_BACKEND_CUDA);
}

/* ---- errors -------------------------------------------------------------- */
/* ---- the CPU backend's intra-op threads split the CNN's ops without changing a bit ----
   Sizes above the split threshold; each op's output is read back into out (when given) as it is made.
   Returns the floats read. */
static void keep(const dpar_buffer *b, float *out, int64_t *at) {
    float *r = rd(b);
    int64_t n = (int64_t)(dpar_buffer_nbytes(b) / sizeof(float));
    if (out) memcpy(out + *at, r, (size_t)n * sizeof(float));
    *at += n;
    free(r);
}
static int64_t threads_program(dpar_runtime *rt, float *out) {
    enum { NB = 16, H = 14, W = 14, C = 32, O = 16 };
    const int64_t xs[4] = { NB, H, W, C }, ws[4] = { 3, 3, C, O }, ys[4] = { NB, H, W, O }, os[1] = { O };
    const int64_t ps[4] = { NB, H / 2, W / 2, C }, flat[1] = { NB * H * W * C }, rows[2] = { NB * H * W * C / O, O };
    float *v = rnd_vec(NB * H * W * C, 7u), *dv = rnd_vec(NB * H * W * C + 1, 8u); /* mo reads dv + 1 */
    dpar_buffer *x = mk(rt, 4, xs, v), *w = mk(rt, 4, ws, v + 5), *b = mk(rt, 1, os, v + 9), *y = mk(rt, 4, ys, NULL);
    dpar_buffer *dy = mk(rt, 4, ys, dv), *dx = mk(rt, 4, xs, NULL), *dw = mk(rt, 4, ws, NULL), *db = mk(rt, 1, os, v);
    dpar_buffer *p = mk(rt, 4, ps, NULL), *dp = mk(rt, 4, ps, dv + 3), *e = mk(rt, 1, flat, NULL);
    dpar_buffer *prm = mk(rt, 1, flat, v), *grd = mk(rt, 1, flat, dv), *mo = mk(rt, 1, flat, dv + 1);
    dpar_buffer *vv = mk(rt, 1, flat, NULL), *ba = mk(rt, 2, rows, dv);
    int64_t at = 0;
    dpar_conv2d_desc cd = { .padding = DPAR_PADDING_SAME };
    dpar_pool2d_desc pd = { .window = { 2, 2 } };
    T_OK(dpar_conv2d(y, x, w, b, &cd)); /* blocks of im2col rows */
    keep(y, out, &at);
    T_OK(dpar_conv2d_backward_kernel(dw, NULL, x, dy, &cd)); /* strips of dw's rows, each its im2col columns */
    keep(dw, out, &at);
    T_OK(dpar_conv2d_backward_input(dx, dy, w, &cd)); /* images, col2im block by block */
    keep(dx, out, &at);
    /* conv1's shapes (one input channel, 32 outputs): the forward's blocks of rows; the kernel gradient's
       9 rows of dw in strips of 5 + 4 (16 x 32 x 32 pixels put 9 x 32 x 16384 above the split) */
    enum { S1 = 32, O1 = 32 };
    const int64_t x1s[4] = { NB, S1, S1, 1 }, w1s[4] = { 3, 3, 1, O1 }, y1s[4] = { NB, S1, S1, O1 };
    float *v1 = rnd_vec(NB * S1 * S1 * O1, 9u);
    dpar_buffer *x1 = mk(rt, 4, x1s, v1 + 2), *w1 = mk(rt, 4, w1s, v1 + 11), *y1 = mk(rt, 4, y1s, NULL);
    dpar_buffer *dy1 = mk(rt, 4, y1s, v1), *dw1 = mk(rt, 4, w1s, NULL);
    T_OK(dpar_conv2d(y1, x1, w1, NULL, &cd));
    keep(y1, out, &at);
    T_OK(dpar_conv2d_backward_kernel(dw1, NULL, x1, dy1, &cd));
    keep(dw1, out, &at);
    T_OK(dpar_bias_grad(db, ba, 0.5f)); /* blocks of 8 columns */
    keep(db, out, &at);
    T_OK(dpar_bias_add(ba, b)); /* rows */
    keep(ba, out, &at);
    T_OK(dpar_relu(e, grd)); /* elements */
    keep(e, out, &at);
    T_OK(dpar_relu_backward(e, grd, prm));
    keep(e, out, &at);
    T_OK(dpar_avg_pool2d(p, x, &pd)); /* images */
    keep(p, out, &at);
    T_OK(dpar_avg_pool2d_backward(dx, dp, &pd));
    keep(dx, out, &at);
    T_OK(dpar_max_pool2d(p, x, &pd));
    keep(p, out, &at);
    T_OK(dpar_max_pool2d_backward(dx, dp, x, &pd));
    keep(dx, out, &at);
    const dpar_sgd_desc sg = { .learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-4f };
    T_OK(dpar_sgd_update(&sg, prm, grd, mo, 1.0f)); /* blocks of 64 */
    keep(prm, out, &at);
    keep(mo, out, &at);
    const dpar_adamw_desc ad = { .learning_rate = 1e-3f, .weight_decay = 1e-4f };
    T_OK(dpar_adamw_update(&ad, prm, grd, mo, vv, 3, 1.0f)); /* elements */
    keep(prm, out, &at);
    keep(vv, out, &at);
    dpar_buffer *all[] = { x, w, b, y, dy, dx, dw, db, p, dp, e, prm, grd, mo, vv, ba, x1, w1, y1, dy1, dw1 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) T_OK(dpar_buffer_destroy(all[i]));
    free(v);
    free(dv);
    free(v1);
    return at;
}
static void test_threads_bitwise(void **st) {
    (void)st;
    /* 3 threads split the kernel gradient's 288 rows of dw at kernel rows (96, 192), 2 threads inside
       one (144: each thread builds part of a kernel row's span of im2col columns) */
    dpar_runtime *r1 = t_cpu_runtime_threads("1"), *r2 = t_cpu_runtime_threads("2"), *r3 = t_cpu_runtime_threads("3");
    int64_t n = threads_program(r1, NULL);
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    threads_program(r1, a);
    threads_program(r2, b);
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    threads_program(r3, b);
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    free(a);
    free(b);
    T_OK(dpar_runtime_destroy(r1));
    T_OK(dpar_runtime_destroy(r2));
    T_OK(dpar_runtime_destroy(r3));
}

/* The bits of the GEMM on im2col's matrix (built here: exact copies, +0 in the padding). The forward:
   dpar_matmul(im2col(x), w) into C = 0 (beta 0) or, with a bias, b's rows (beta 1): y = b (or 0) + each k
   block's sum in turn, as the GEMM's C. The input
   gradient: dpar_matmul(dy, w^T) added back into dx pixel by pixel in output pixel order, each tap's
   channels, as col2im. The kernel gradient: dpar_matmul(im2col(x)^T, dy) (fewer output pixels than one
   block of dpar__conv_rows: k blocks of 256 from the first). On AVX-512 these cases take the passes that
   read x and write dx in place (channels a multiple of 8 dividing 256, or of 32 for dx; 32-column strips
   of y): one to three k blocks, part tiles of rows, strides, dilations, explicit pads, taps off every
   edge. */
static void test_im2col_bits(void **st) {
    (void)st;
    static const ccase cases[] = {
        { "seed CNN conv 2", { 2, 14, 14, 32 }, 3, 3, 64, { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } }, 0, 0 },
        { "C 16, stride (2,1), dilation (1,2), explicit pads",
          { 1, 9, 7, 16 },
          3,
          2,
          32,
          { { 2, 1 }, { 1, 2 }, DPAR_PADDING_EXPLICIT, { { 1, 2 }, { 2, 1 } } },
          0,
          0 },
        { "C 32, stride (1,2), dilation (2,1), explicit pads",
          { 2, 9, 8, 32 },
          2,
          3,
          32,
          { { 1, 2 }, { 2, 1 }, DPAR_PADDING_EXPLICIT, { { 2, 1 }, { 1, 2 } } },
          0,
          0 },
        { "C 32, 380 pixels (blocks of 16 tiles, a part tile), dilation 2, explicit pads",
          { 1, 20, 19, 32 },
          3,
          3,
          32,
          { { 1, 1 }, { 2, 2 }, DPAR_PADDING_EXPLICIT, { { 2, 2 }, { 1, 3 } } },
          0,
          0 },
        { "C 64, three k blocks, O 96",
          { 1, 5, 6, 64 },
          3,
          3,
          96,
          { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } },
          0,
          0 },
        { "C 8, kernel wider than the image",
          { 1, 4, 5, 8 },
          5,
          5,
          32,
          { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } },
          0,
          0 },
    };
    /* the last case twice more, where the forward may not skip a tile's taps in the padding (their
       products 0 * w would change bits): an inf in w (0 * inf: NaN), and a bias of -0 with x and w so
       small that every product rounds to +-0 (-0 + (-0 + +0) is +0, -0 + -0 is -0; one k block, so no
       later block's write-back adds +0 to the -0) */
    const size_t ncase = sizeof cases / sizeof cases[0];
    for (size_t run = 0; run < ncase + 2; run++) {
        const size_t ci = run < ncase ? run : ncase - 1, v = run < ncase ? 0 : run - ncase + 1; /* v: variant */
        const ccase *c = &cases[ci];
        conv_data d = conv_data_make(c, (uint32_t)(300 + ci));
        const geom *g = &d.g;
        if (v == 1) d.w[3 * g->o + 5] = INFINITY; /* tap 0 */
        for (int64_t q = 0; v == 2 && q < nx(g); q++) d.x[q] = 1e-30f;
        for (int64_t q = 0; v == 2 && q < nw(g); q++) d.w[q] = d.w[q] < 0.0f ? -1e-30f : 1e-30f;
        for (int64_t q = 0; v == 2 && q < g->o; q++) d.b[q] = -0.0f;
        int64_t K = g->kh * g->kw * g->c, M = g->n * g->oh * g->ow, cs[2] = { M, K }, ws[2] = { K, g->o },
                ys[2] = { M, g->o }, y4[4] = { g->n, g->oh, g->ow, g->o }, w4[4] = { g->kh, g->kw, g->c, g->o };
        float *col = calloc((size_t)(M * K + 1), sizeof(float)), *dx = calloc((size_t)(nx(g) + 1), sizeof(float));
        for (int64_t r = 0; r < M; r++)
            for (int64_t t = 0; t < g->kh * g->kw; t++)
                for (int64_t ch = 0; ch < g->c; ch++) {
                    int64_t a = xat(g, r / (g->oh * g->ow), r / g->ow % g->oh, r % g->ow, t / g->kw, t % g->kw, ch);
                    if (a >= 0) col[r * K + t * g->c + ch] = d.x[a];
                }
        dpar_buffer *X = mk(CPU, 4, c->x, d.x), *W = mk(CPU, 4, w4, d.w), *Y = mk(CPU, 4, y4, NULL);
        float *yb = malloc((size_t)(M * g->o + 1) * sizeof(float)); /* every other case: y starts from b */
        for (int64_t r = 0; r < M * g->o; r++) yb[r] = ci % 2 == 0 ? d.b[r % g->o] : 0.0f;
        int64_t bs = g->o;
        dpar_buffer *A = mk(CPU, 2, cs, col), *B = mk(CPU, 2, ws, d.w), *C = mk(CPU, 2, ys, yb);
        dpar_buffer *BIAS = mk(CPU, 1, &bs, d.b);
        dpar_buffer *DY = mk(CPU, 4, y4, d.dy), *DY2 = mk(CPU, 2, ys, d.dy), *DX = mk(CPU, 4, c->x, NULL);
        dpar_buffer *DW = mk(CPU, 4, w4, NULL), *CW = mk(CPU, 2, ws, NULL);
        T_OK(dpar_conv2d(Y, X, W, ci % 2 == 0 ? BIAS : NULL, &c->d));
        T_OK(dpar_matmul(C, A, B, false, false, 1.0f, ci % 2 == 0 ? 1.0f : 0.0f));
        T_OK(dpar_conv2d_backward_kernel(DW, NULL, X, DY, &c->d));
        T_OK(dpar_matmul(CW, A, DY2, true, false, 1.0f, 0.0f)); /* im2col^T dy [K, O] */
        T_OK(dpar_conv2d_backward_input(DX, DY, W, &c->d));
        T_OK(dpar_matmul(A, DY2, B, false, true, 1.0f, 0.0f)); /* dy w^T [M, K], then col2im */
        float *y = rd(Y), *want = rd(C), *got = rd(DX), *dcol = rd(A), *dw = rd(DW), *dww = rd(CW);
        for (int64_t r = 0; r < M; r++)
            for (int64_t t = 0; t < g->kh * g->kw; t++)
                for (int64_t ch = 0; ch < g->c; ch++) {
                    int64_t a = xat(g, r / (g->oh * g->ow), r / g->ow % g->oh, r % g->ow, t / g->kw, t % g->kw, ch);
                    if (a >= 0) dx[a] += dcol[r * K + t * g->c + ch];
                }
        if (memcmp(y, want, (size_t)ny(g) * sizeof(float)))
            fail_msg("%s (variant %zu): conv2d's forward differs from the GEMM on im2col's matrix", c->name, v);
        if (memcmp(got, dx, (size_t)nx(g) * sizeof(float)))
            fail_msg("%s: conv2d's input gradient differs from the GEMM and col2im", c->name);
        if (memcmp(dw, dww, (size_t)nw(g) * sizeof(float)))
            fail_msg("%s: conv2d's kernel gradient differs from the GEMM on im2col's matrix", c->name);
        dpar_buffer *all[] = { X, W, Y, A, B, C, DY, DY2, DX, DW, CW, BIAS };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dpar_buffer_destroy(all[i]);
        free(col), free(dx), free(y), free(want), free(got), free(dcol), free(dw), free(dww), free(yb);
        conv_data_free(&d);
    }
}

static void test_errors(void **st) {
    (void)st;
    int64_t xs[4] = { 2, 5, 5, 3 }, ws[4] = { 3, 3, 3, 4 }, ys[4] = { 2, 5, 5, 4 }, w2[4] = { 3, 3, 2, 4 };
    int64_t bad[4] = { 2, 4, 5, 4 }, x3[3] = { 2, 5, 3 }, four = 4, five = 5, big[4] = { 7, 7, 3, 4 }, out[4];
    dpar_buffer *X = mk(CPU, 4, xs, NULL), *W = mk(CPU, 4, ws, NULL), *Y = mk(CPU, 4, ys, NULL);
    dpar_buffer *W2 = mk(CPU, 4, w2, NULL), *YB = mk(CPU, 4, bad, NULL), *X3 = mk(CPU, 3, x3, NULL);
    dpar_buffer *B = mk(CPU, 1, &four, NULL), *B5 = mk(CPU, 1, &five, NULL), *WB = mk(CPU, 4, big, NULL);
    int64_t w33[4] = { 3, 3, 3, 3 };
    dpar_buffer *H = NULL, *W33 = mk(CPU, 4, w33, NULL);
    T_OK(dpar_buffer_create(CPU, 0, DPAR_F16, 4, xs, &H));
    T_ERR(dpar_conv2d(Y, X, W2, NULL, NULL), DPAR_ERR_SHAPE, "dpar_conv2d", "3 channels", "HWIO");
    T_ERR(dpar_conv2d(YB, X, W, NULL, NULL), DPAR_ERR_SHAPE, "y is [2, 4, 5, 4]", "[2, 5, 5, 4]");
    T_ERR(dpar_conv2d(Y, X3, W, NULL, NULL), DPAR_ERR_SHAPE, "x must be 4-d NHWC");
    T_ERR(dpar_conv2d(Y, X, W, B5, NULL), DPAR_ERR_SHAPE, "bias", "[4]");
    T_ERR(dpar_conv2d(Y, H, W, NULL, NULL), DPAR_ERR_DTYPE, "f16");
    T_ERR(dpar_conv2d(Y, X, NULL, NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_conv2d(X, X, W33, NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "alias");
    dpar_conv2d_desc d = { { -1, 1 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } } };
    T_ERR(dpar_conv2d(Y, X, W, NULL, &d), DPAR_ERR_INVALID_ARGUMENT, "stride[0] = -1");
    dpar_conv2d_desc v = { { 0 }, { 0 }, DPAR_PADDING_VALID, { { 0 } } };
    T_ERR(dpar_conv2d_output_shape(xs, big, &v, out), DPAR_ERR_SHAPE, "window spans 7", "padded input is 5");
    T_ERR(dpar_conv2d(Y, X, WB, NULL, &v), DPAR_ERR_SHAPE, "window spans 7");
    dpar_conv2d_desc e = { { 0 }, { 0 }, DPAR_PADDING_EXPLICIT, { { -1, 0 }, { 0, 0 } } };
    T_ERR(dpar_conv2d(Y, X, W, NULL, &e), DPAR_ERR_INVALID_ARGUMENT, "pad[0] = {-1, 0}");
    dpar_conv2d_desc m = { { 0 }, { 0 }, (dpar_padding)9, { { 0 } } };
    T_ERR(dpar_conv2d(Y, X, W, NULL, &m), DPAR_ERR_INVALID_ARGUMENT, "not a dpar_padding");
    T_ERR(dpar_conv2d_backward_input(X, YB, W, NULL), DPAR_ERR_SHAPE, "dpar_conv2d_backward_input", "dy is");
    T_ERR(dpar_conv2d_backward_kernel(W, B5, X, Y, NULL), DPAR_ERR_SHAPE, "db is [5]");
    T_ERR(dpar_conv2d_backward_kernel(W, B, X, YB, NULL), DPAR_ERR_SHAPE, "dpar_conv2d_backward_kernel");
    dpar_pool2d_desc p = { { 7, 7 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } }, false };
    T_ERR(dpar_avg_pool2d(Y, X, &p), DPAR_ERR_SHAPE, "dpar_avg_pool2d", "window spans 7");
    T_ERR(dpar_max_pool2d(YB, X, NULL), DPAR_ERR_SHAPE, "dpar_max_pool2d", "y is [2, 4, 5, 4]", "[2, 2, 2, 3]",
          "x and d give", "dpar_pool2d_output_shape gives the shape");
    T_ERR(dpar_conv2d(YB, X, W, NULL, NULL), DPAR_ERR_SHAPE, "x, w and d give", "dpar_conv2d_output_shape gives");
    dpar_pool2d_desc pst = { { 2, 2 }, { 1, -2 }, DPAR_PADDING_DEFAULT, { { 0 } }, false };
    T_ERR(dpar_max_pool2d(YB, X, &pst), DPAR_ERR_INVALID_ARGUMENT,
          "stride[1] = -2; use 0 (default: the window)"); /* no dilation */
    T_ERR(dpar_max_pool2d_backward(X, Y, YB, NULL), DPAR_ERR_SHAPE, "dpar_max_pool2d_backward");
    int64_t pooled[4] = { 2, 2, 2, 3 };
    dpar_buffer *P = mk(CPU, 4, pooled, NULL), *DXP = mk(CPU, 4, xs, NULL);
    T_OK(dpar_max_pool2d_backward(DXP, P, X, NULL));
    T_ERR(dpar_max_pool2d_backward(DXP, P, NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_max_pool2d_backward",
          "x is NULL"); /* it read dy as x: a wrong dx, or past dy's end */
    dpar_buffer_destroy(P), dpar_buffer_destroy(DXP);
    dpar_pool2d_desc pw = { { -2, 2 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } }, false };
    T_ERR(dpar_pool2d_output_shape(xs, &pw, out), DPAR_ERR_INVALID_ARGUMENT, "window = (-2, 2)");
    /* sizes near INT64_MAX are refused: (k - 1) * dilation and in + pads used to wrap into a "valid" shape */
    int64_t kmax[4] = { INT64_MAX, 3, 3, 4 }, klong[4] = { (int64_t)1 << 40, 1, 3, 4 },
            xmax[4] = { 2, INT64_MAX, 5, 3 };
    dpar_conv2d_desc dil = { { 0 }, { 1 << 30, 0 }, DPAR_PADDING_SAME, { { 0 } } };
    T_ERR(dpar_conv2d_output_shape(xs, kmax, NULL, out), DPAR_ERR_SHAPE, "window is", "1..2^40");
    T_ERR(dpar_conv2d_output_shape(xs, klong, &dil, out), DPAR_ERR_SHAPE, "spans more than 2^40", "height");
    dpar_conv2d_desc e5 = { { 0 }, { 0 }, DPAR_PADDING_EXPLICIT, { { 5, 0 }, { 0, 0 } } };
    T_ERR(dpar_conv2d_output_shape(xmax, ws, &e5, out), DPAR_ERR_SHAPE, "dimension 1 of x", "0..2^40");
    dpar_pool2d_desc ps = { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } }, false };
    T_ERR(dpar_pool2d_output_shape(xmax, &ps, out), DPAR_ERR_SHAPE, "dimension 1 of x", "0..2^40");
    dpar_buffer *all[] = { X, W, Y, W2, YB, X3, B, B5, WB, H, W33 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dpar_buffer_destroy(all[i]);
}

/* ---- graph nodes: a small CNN's gradients against finite differences ---- */
/* mse(max_pool(conv(avg_pool(conv(x, w1) + b1), w2)), t), batch split over "data" on ndev devices */
enum { GX, GW1, GB1, GW2, GT, GN };
static const int64_t GSHAPE[GN][4] = { { 4, 6, 6, 2 }, { 3, 3, 2, 3 }, { 3 }, { 2, 2, 3, 4 }, { 4, 2, 2, 4 } };
static const int GNDIM[GN] = { 4, 4, 1, 4, 4 };
static const ccase G_C1 = {
    "graph conv 1", { 0, 6, 6, 2 }, 3, 3, 3, { { 0 }, { 0 }, DPAR_PADDING_SAME, { { 0 } } }, 1, 0
};
static const ccase G_C2 = {
    "graph conv 2", { 0, 3, 3, 3 }, 2, 2, 4, { { 0 }, { 0 }, DPAR_PADDING_VALID, { { 0 } } }, 0, 0
};
static const pcase G_P1 = { "graph avg", { 0, 6, 6, 3 }, { { 0 }, { 0 }, DPAR_PADDING_DEFAULT, { { 0 } }, false } };
static const pcase G_P2 = { "graph max", { 0, 2, 2, 4 }, { { 2, 2 }, { 1, 1 }, DPAR_PADDING_SAME, { { 0 } }, false } };
static int64_t gcount(int i) {
    int64_t n = 1;
    for (int d = 0; d < GNDIM[i]; d++) n *= GSHAPE[i][d];
    return n;
}
static double g_ref(double *const *in, int ndev) {
    int64_t per = GSHAPE[GX][0] / ndev;
    ccase c1 = G_C1, c2 = G_C2;
    pcase p1 = G_P1, p2 = G_P2;
    c1.x[0] = c2.x[0] = p1.x[0] = p2.x[0] = per;
    geom g1 = conv_geom(&c1), q1 = pool_geom(&p1), g2 = conv_geom(&c2), q2 = pool_geom(&p2);
    double *y1 = malloc((size_t)ny(&g1) * 8), *a1 = malloc((size_t)ny(&q1) * 8), *y2 = malloc((size_t)ny(&g2) * 8);
    double *m = malloc((size_t)ny(&q2) * 8), total = 0;
    for (int d = 0; d < ndev; d++) {
        ref_conv(&g1, in[GX] + d * nx(&g1), in[GW1], in[GB1], y1);
        ref_pool(&q1, 0, y1, a1, NULL);
        ref_conv(&g2, a1, in[GW2], NULL, y2);
        ref_pool(&q2, 1, y2, m, NULL);
        double s = 0;
        const double *t = in[GT] + d * ny(&q2);
        for (int64_t k = 0; k < ny(&q2); k++) s += (m[k] - t[k]) * (m[k] - t[k]);
        total += s / (double)ny(&q2);
    }
    free(y1), free(a1), free(y2), free(m);
    return total / ndev;
}
static void run_graph_cnn(dpar_backend_kind k, int ndev) {
    dpar_runtime *rt = t_runtime_or_skip(k, ndev);
    if (!rt) return;
    dpar_mesh *mesh = t_mesh1(rt, ndev, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(mesh, &g));
    dpar_value v[GN], gr[GN];
    double *xd[GN];
    float *xf[GN];
    for (int i = 0; i < GN; i++) {
        dpar_array_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DPAR_F32, d.ndim = GNDIM[i];
        for (int k2 = 0; k2 < d.ndim; k2++) d.shape[k2] = GSHAPE[i][k2];
        if (i == GX || i == GT) d.spec[0] = "data";
        v[i] = dpar_g_feed(g, "in", &d);
        xf[i] = rnd_vec(gcount(i), (uint32_t)(77 + i));
        xd[i] = dbl(xf[i], gcount(i));
    }
    dpar_value h = dpar_g_conv2d(g, v[GX], v[GW1], v[GB1], &G_C1.d);
    h = dpar_g_avg_pool2d(g, h, &G_P1.d);
    h = dpar_g_conv2d(g, h, v[GW2], (dpar_value){ 0 }, &G_C2.d);
    dpar_value loss = dpar_g_mse(g, dpar_g_max_pool2d(g, h, &G_P2.d), v[GT]);
    T_OK(dpar_graph_status(g));
    T_OK(dpar_graph_value_and_grad(g, loss, v, GN, gr));
    T_OK(dpar_graph_compile(g, NULL));
    dpar_graph_feed f[GN];
    memset(f, 0, sizeof f);
    for (int i = 0; i < GN; i++) f[i].value = v[i], f[i].host = xf[i];
    float lossv = 0;
    T_OK(dpar_graph_run(g, f, GN, &lossv));
    double want = g_ref(xd, ndev);
    if (fabs(lossv - want) > 1e-5 * fmax(1.0, fabs(want)))
        fail_msg("graph CNN on %d devices: loss %.9g, reference %.9g", ndev, (double)lossv, want);
    for (int i = 0; i < GN; i++) {
        float *an = malloc((size_t)gcount(i) * sizeof(float));
        T_OK(dpar_graph_get(g, gr[i], an));
        for (int64_t e = 0; e < gcount(i); e++) {
            double hh = 1e-4, keep = xd[i][e];
            xd[i][e] = keep + hh;
            double lp = g_ref(xd, ndev);
            xd[i][e] = keep - hh;
            double lm = g_ref(xd, ndev);
            xd[i][e] = keep;
            double fd = (lp - lm) / (2 * hh);
            if (fabs(an[e] - fd) > 2e-3 * fmax(fabs(fd), 1e-2))
                fail_msg("graph CNN on %d devices: d loss / d input %d [%lld]: graph %.7g, finite differences %.7g",
                         ndev, i, (long long)e, (double)an[e], fd);
        }
        free(an);
    }
    for (int i = 0; i < GN; i++) free(xd[i]), free(xf[i]);
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_runtime_destroy(rt));
}
static void test_graph_cnn(void **st) {
    (void)st;
    run_graph_cnn(DPAR_BACKEND_CPU, 1);
    run_graph_cnn(DPAR_BACKEND_CPU, 2);
}
static void test_graph_cnn_vulkan(void **st) {
    (void)st;
    run_graph_cnn(DPAR_BACKEND_VULKAN, 2);
}
static void test_graph_errors(void **st) {
    (void)st;
    dpar_mesh *mesh = t_mesh1(CPU, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(mesh, &g));
    dpar_array_desc d = { DPAR_F32, 4, { 1, 5, 5, 3 }, { NULL } }, dw = { DPAR_F32, 4, { 3, 3, 2, 4 }, { NULL } };
    dpar_value x = dpar_g_feed(g, "x", &d), w = dpar_g_feed(g, "w", &dw);
    assert_int_equal(dpar_g_conv2d(g, x, w, (dpar_value){ 0 }, NULL).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "dpar_g_conv2d", "'x'", "'w'", "3 channels");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(mesh, &g));
    x = dpar_g_feed(g, "x", &d);
    dpar_pool2d_desc p = { { 6, 6 }, { 0 }, DPAR_PADDING_VALID, { { 0 } }, false };
    assert_int_equal(dpar_g_max_pool2d(g, x, &p).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "dpar_g_max_pool2d", "window spans 6");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_mesh_destroy(mesh));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_exact_3x3),   cmocka_unit_test(test_pool_exact),
        cmocka_unit_test(test_pool_bits),        cmocka_unit_test(test_conv_cpu),
        cmocka_unit_test(test_pool_cpu),         cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_im2col_bits),      cmocka_unit_test(test_errors),
        cmocka_unit_test(test_graph_cnn),        cmocka_unit_test(test_graph_errors),
        cmocka_unit_test(test_vulkan_vs_cpu),    cmocka_unit_test(test_cuda_vs_cpu),
        cmocka_unit_test(test_graph_cnn_vulkan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
