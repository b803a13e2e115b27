/* Graphs and gradients (dpar_graph_*): every node kind's gradient against
   central finite differences of a double-precision host reference (h = 1e-4;
   the f32 analytic gradient to 2e-3 relative, the loss to 1e-5), the
   collectives on 1, 2 and 4 devices, on the CPU backend and on Vulkan
   (skipped when unavailable). */
#include "testutil.h"

static uint64_t rng_state = 12345;
static double rnd(void) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

/* ---- finite-difference cases: one row each ---- */
enum { MAXIN = 4 };
typedef struct fd_in {
    int ndim;
    int64_t shape[3];
    const char *spec[3];
} fd_in;
typedef struct fd_case fd_case;
struct fd_case {
    const char *name;
    int ndev;          /* 1-d mesh "data" of ndev devices */
    int nin;           /* f32 feeds, all differentiated */
    fd_in in[MAXIN];
    int labels;        /* > 0: an i32 feed of that many labels (classes = last dim of in[0] @ in[1]) */
    const char *lspec; /* labels' spec */
    dpar_value (*build)(dpar_graph *g, const dpar_value *x, dpar_value labels, const fd_case *c);
    double (*ref)(double *const *x, const int32_t *labels, const fd_case *c);
    int p0, p1;        /* case parameters (transposes, dims, roots) */
};

static int64_t fd_count(const fd_in *in) {
    int64_t n = 1;
    for (int d = 0; d < in->ndim; d++) n *= in->shape[d];
    return n;
}
static double mse_d(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (a[i] - b[i]) * (a[i] - b[i]);
    return n ? s / (double)n : 0.0;
}
/* C[M,N] = op(A) op(B); A stored [ta ? K : M, ta ? M : K]. */
static void matmul_d(double *C, const double *A, const double *B, int64_t M, int64_t K, int64_t N, int ta, int tb) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
            C[i * N + j] = s;
        }
}

/* matmul: mse(op(a) @ op(b), t), rows of a (or t) split when ndev > 1 and not transposed */
static dpar_value b_matmul(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l;
    return dpar_g_mse(g, dpar_g_matmul(g, x[0], x[1], c->p0, c->p1), x[2]);
}
static double r_matmul(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t M = c->in[2].shape[0] / c->ndev, N = c->in[2].shape[1];
    int64_t K = c->p0 ? c->in[0].shape[0] : c->in[0].shape[1];
    double *C = malloc((size_t)(M * N) * sizeof(double)), s = 0;
    for (int d = 0; d < c->ndev; d++) { /* device d: its rows of a (not transposed) and of t */
        matmul_d(C, x[0] + (c->ndev > 1 ? d * M * K : 0), x[1], M, K, N, c->p0, c->p1);
        s += mse_d(C, x[2] + d * M * N, M * N);
    }
    free(C);
    return s / c->ndev;
}
/* mse(relu(bias_add(x, b)), t), rows split */
static dpar_value b_mlp(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l, (void)c;
    return dpar_g_mse(g, dpar_g_relu(g, dpar_g_bias_add(g, x[0], x[1])), x[2]);
}
static double r_mlp(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t n = fd_count(&c->in[0]), N = c->in[1].shape[0];
    double *y = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) y[i] = fmax(x[0][i] + x[1][i % N], 0.0);
    double s = mse_d(y, x[2], n);
    free(y);
    return s;
}
/* softmax_xent(bias_add(x @ w, b), labels), rows split */
static dpar_value b_xent(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)c;
    return dpar_g_softmax_xent(g, dpar_g_bias_add(g, dpar_g_matmul(g, x[0], x[1], false, false), x[2]), l);
}
static double r_xent(double *const *x, const int32_t *l, const fd_case *c) {
    int64_t M = c->in[0].shape[0], K = c->in[0].shape[1], C = c->in[1].shape[1];
    double *z = malloc((size_t)(M * C) * sizeof(double)), s = 0;
    matmul_d(z, x[0], x[1], M, K, C, 0, 0);
    for (int64_t i = 0; i < M; i++) {
        double mx = -1e300, se = 0;
        for (int64_t j = 0; j < C; j++) mx = fmax(mx, z[i * C + j] += x[2][j]);
        for (int64_t j = 0; j < C; j++) se += exp(z[i * C + j] - mx);
        s += mx + log(se) - z[i * C + l[i]];
    }
    free(z);
    return s / (double)M;
}
/* mse(scale(add(a, b), 0.7), t) + reshape */
static dpar_value b_add(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l;
    dpar_value y = dpar_g_scale(g, dpar_g_add(g, x[0], x[1]), 0.7f);
    int64_t sh[1] = { c->in[0].shape[0] * c->in[0].shape[1] / c->ndev };
    return dpar_g_mse(g, dpar_g_reshape(g, y, 1, sh), dpar_g_reshape(g, x[2], 1, sh));
}
static double r_add(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t n = fd_count(&c->in[0]);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (0.7 * (x[0][i] + x[1][i]) - x[2][i]) * (0.7 * (x[0][i] + x[1][i]) - x[2][i]);
    return s / (double)n;
}
/* scalars: dot(a, b) + sum(a) * sum(b) + sum_squares(a) */
static dpar_value b_scalars(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l, (void)c;
    dpar_value sa = dpar_g_sum(g, x[0]), sb = dpar_g_sum(g, dpar_g_mul_scalar(g, sa, x[1]));
    return dpar_g_add(g, dpar_g_add(g, dpar_g_dot(g, x[0], x[1]), sb), dpar_g_sum_squares(g, x[0]));
}
static double r_scalars(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t n = fd_count(&c->in[0]) / c->ndev;
    double s = 0;
    for (int d = 0; d < c->ndev; d++) {
        const double *a = x[0] + d * n, *b = x[1] + d * n;
        double dot = 0, sa = 0, sb = 0, ss = 0;
        for (int64_t i = 0; i < n; i++) dot += a[i] * b[i], sa += a[i], sb += b[i], ss += a[i] * a[i];
        s += dot + sa * sb + ss;
    }
    return s / c->ndev;
}

/* ---- collectives: x split over "data" in n blocks of [r, cols] ---- */
#define NB(c)    ((c)->ndev)
#define ROWS(c)  ((c)->in[0].shape[0] / NB(c))
#define COLS0(c) ((c)->in[0].shape[1])
static dpar_value b_psum(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l;
    return dpar_g_mse(g, c->p0 ? dpar_g_pmean(g, x[0], "data") : dpar_g_psum(g, x[0], "data"), x[1]);
}
static double r_psum(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t m = ROWS(c) * COLS0(c);
    double *y = calloc((size_t)m, sizeof(double));
    for (int d = 0; d < NB(c); d++)
        for (int64_t i = 0; i < m; i++) y[i] += x[0][d * m + i] / (c->p0 ? NB(c) : 1);
    double s = mse_d(y, x[1], m);
    free(y);
    return s;
}
/* psum of a replicated value (n x) and pcast: mse(psum(w) + pcast(w), t_split) */
static dpar_value b_pcast(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l, (void)c;
    dpar_value w = x[0];
    return dpar_g_mse(g, dpar_g_add(g, dpar_g_psum(g, w, "data"), dpar_g_pcast(g, w, "data")), x[1]);
}
static double r_pcast(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t m = fd_count(&c->in[0]);
    double s = 0;
    for (int d = 0; d < NB(c); d++)
        for (int64_t i = 0; i < m; i++) {
            double e = (NB(c) + 1) * x[0][i] - x[1][d * m + i];
            s += e * e;
        }
    return s / (double)m / NB(c);
}
/* all_gather over data (dim p0, tiled p1): mse(gathered, t replicated) */
static dpar_value b_gather(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l;
    return dpar_g_mse(g, dpar_g_reshape(g, dpar_g_all_gather(g, x[0], "data", c->p0, c->p1), 2, c->in[1].shape),
                      x[1]);
}
static double r_gather(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l; /* gathering the row blocks along dim 0 restores x; untiled stacking too (row-major) */
    return mse_d(x[0], x[1], fd_count(&c->in[0]));
}
/* psum_scatter over data along dim 1 (tiled): x [n r, n c] rows split, t [r, n c] cols split */
static dpar_value b_scatter(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l, (void)c;
    return dpar_g_mse(g, dpar_g_psum_scatter(g, x[0], "data", 1, true), x[1]);
}
static double r_scatter(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t r = ROWS(c), C = COLS0(c);
    double *y = calloc((size_t)(r * C), sizeof(double));
    for (int d = 0; d < NB(c); d++)
        for (int64_t i = 0; i < r * C; i++) y[i] += x[0][d * r * C + i];
    double s = mse_d(y, x[1], r * C);
    free(y);
    return s;
}
/* ppermute shift by one: device d gets block d-1 */
static const int shift4[] = { 0, 1, 1, 2, 2, 3, 3, 0 }, shift2[] = { 0, 1, 1, 0 };
static dpar_value b_ppermute(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l;
    return dpar_g_mse(g, dpar_g_ppermute(g, x[0], "data", c->ndev == 4 ? shift4 : shift2, c->ndev), x[1]);
}
static double r_ppermute(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t m = ROWS(c) * COLS0(c);
    double s = 0;
    for (int d = 0; d < NB(c); d++) s += mse_d(x[0] + ((d + NB(c) - 1) % NB(c)) * m, x[1] + d * m, m);
    return s / NB(c);
}
/* all_to_all: x [n r, n c] rows split -> [n r, c] cols split; t cols split */
static dpar_value b_a2a(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l, (void)c;
    return dpar_g_mse(g, dpar_g_all_to_all(g, x[0], "data", 1, 0), x[1]);
}
static double r_a2a(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    return mse_d(x[0], x[1], fd_count(&c->in[0]));
}
/* pbroadcast from root p0: every device gets the root's block */
static dpar_value b_bcast(dpar_graph *g, const dpar_value *x, dpar_value l, const fd_case *c) {
    (void)l;
    return dpar_g_mse(g, dpar_g_pbroadcast(g, x[0], "data", c->p0), x[1]);
}
static double r_bcast(double *const *x, const int32_t *l, const fd_case *c) {
    (void)l;
    int64_t m = ROWS(c) * COLS0(c);
    return mse_d(x[0] + c->p0 * m, x[1], m);
}

#define M2(a, b) { 2, { a, b }, { NULL } }         /* replicated */
#define S2(a, b) { 2, { a, b }, { "data" } }       /* rows split over "data" */
#define C2(a, b) { 2, { a, b }, { NULL, "data" } } /* columns split */
#define M1(a)    { 1, { a }, { NULL } }
#define S1(a)    { 1, { a }, { "data" } }
static const fd_case fd_cases[] = {
    { "matmul", 1, 3, { M2(5, 3), M2(3, 4), M2(5, 4) }, 0, NULL, b_matmul, r_matmul, 0, 0 },
    { "matmul a^T", 1, 3, { M2(3, 5), M2(3, 4), M2(5, 4) }, 0, NULL, b_matmul, r_matmul, 1, 0 },
    { "matmul b^T", 1, 3, { M2(5, 3), M2(4, 3), M2(5, 4) }, 0, NULL, b_matmul, r_matmul, 0, 1 },
    { "matmul a^T b^T", 1, 3, { M2(3, 5), M2(4, 3), M2(5, 4) }, 0, NULL, b_matmul, r_matmul, 1, 1 },
    { "matmul size 1", 1, 3, { M2(1, 1), M2(1, 1), M2(1, 1) }, 0, NULL, b_matmul, r_matmul, 0, 0 },
    { "matmul rows split 4", 4, 3, { S2(8, 3), M2(3, 17), S2(8, 17) }, 0, NULL,
      b_matmul, r_matmul, 0, 0 },
    { "bias_add relu 2", 2, 3, { S2(6, 5), M1(5), S2(6, 5) }, 0, NULL, b_mlp,
      r_mlp, 0, 0 },
    { "softmax_xent", 1, 3, { M2(7, 4), M2(4, 3), M1(3) }, 7, NULL, b_xent, r_xent, 0, 0 },
    { "add scale reshape 4", 4, 3, { S2(4, 3), S2(4, 3), S2(4, 3) },
      0, NULL, b_add, r_add, 0, 0 },
    { "sum dot mul_scalar sum_squares", 1, 2, { M2(3, 2), M2(3, 2) }, 0, NULL, b_scalars, r_scalars, 0, 0 },
    { "scalars split 2", 2, 2, { S1(6), S1(6) }, 0, NULL, b_scalars, r_scalars, 0, 0 },
    { "psum 2", 2, 2, { S2(4, 3), M2(2, 3) }, 0, NULL, b_psum, r_psum, 0, 0 },
    { "psum 4", 4, 2, { S2(4, 3), M2(1, 3) }, 0, NULL, b_psum, r_psum, 0, 0 },
    { "pmean 4", 4, 2, { S2(8, 3), M2(2, 3) }, 0, NULL, b_psum, r_psum, 1, 0 },
    { "psum 1", 1, 2, { S2(2, 3), M2(2, 3) }, 0, NULL, b_psum, r_psum, 0, 0 },
    { "psum + pcast of replicated 4", 4, 2, { M2(2, 3), S2(8, 3) }, 0, NULL, b_pcast, r_pcast, 0,
      0 },
    { "all_gather tiled 4", 4, 2, { S2(8, 3), M2(8, 3) }, 0, NULL, b_gather, r_gather, 0, 1 },
    { "all_gather stacked 2", 2, 2, { S2(4, 3), M2(4, 3) }, 0, NULL, b_gather, r_gather, 0, 0 },
    { "psum_scatter 4", 4, 2, { S2(8, 8), C2(2, 8) }, 0, NULL, b_scatter,
      r_scatter, 0, 0 },
    { "ppermute 4", 4, 2, { S2(8, 3), S2(8, 3) }, 0, NULL, b_ppermute, r_ppermute, 0,
      0 },
    { "ppermute 2", 2, 2, { S2(2, 3), S2(2, 3) }, 0, NULL, b_ppermute, r_ppermute, 0,
      0 },
    { "all_to_all 4", 4, 2, { S2(8, 4), C2(8, 4) }, 0, NULL, b_a2a, r_a2a, 0,
      0 },
    { "pbroadcast root 1 of 4", 4, 2, { S2(8, 3), M2(2, 3) }, 0, NULL, b_bcast, r_bcast, 1, 0 },
    { "pbroadcast root 0 of 2", 2, 2, { S2(4, 3), M2(2, 3) }, 0, NULL, b_bcast, r_bcast, 0, 0 },
};

static dpar_backend_kind BK = DPAR_BACKEND_CPU;

static void to_f32(float *f, const double *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) f[i] = (float)d[i];
}
/* Runs one case: graph loss vs the reference, analytic gradients vs central differences. */
static void run_fd_case(const fd_case *c) {
    dpar_runtime *rt = t_runtime_or_skip(BK, c->ndev);
    dpar_mesh *m = t_mesh1(rt, c->ndev, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_value x[MAXIN], gr[MAXIN], lab = { 0 };
    double *xd[MAXIN];
    float *xf[MAXIN];
    int32_t lv[64];
    for (int i = 0; i < c->nin; i++) {
        dpar_array_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DPAR_F32;
        d.ndim = c->in[i].ndim;
        for (int k = 0; k < d.ndim; k++) d.shape[k] = c->in[i].shape[k], d.spec[k] = c->in[i].spec[k];
        x[i] = dpar_g_feed(g, "x", &d);
        int64_t n = fd_count(&c->in[i]);
        xd[i] = malloc((size_t)(n + 1) * sizeof(double));
        xf[i] = malloc((size_t)(n + 1) * sizeof(float));
        for (int64_t k = 0; k < n; k++) xd[i][k] = rnd();
        to_f32(xf[i], xd[i], n);
        for (int64_t k = 0; k < n; k++) xd[i][k] = xf[i][k]; /* the reference sees the f32 inputs */
    }
    if (c->labels) {
        dpar_array_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DPAR_I32, d.ndim = 1, d.shape[0] = c->labels, d.spec[0] = c->lspec;
        lab = dpar_g_feed(g, "labels", &d);
        for (int k = 0; k < c->labels; k++) lv[k] = (int32_t)(k * 7 % c->in[1].shape[1]);
    }
    dpar_value loss = c->build(g, x, lab, c);
    T_OK(dpar_graph_status(g));
    T_OK(dpar_graph_value_and_grad(g, loss, x, c->nin, gr));
    T_OK(dpar_graph_compile(g, NULL));
    dpar_graph_feed f[MAXIN + 1];
    memset(f, 0, sizeof f);
    for (int i = 0; i < c->nin; i++) f[i].value = x[i], f[i].host = xf[i];
    f[c->nin].value = lab, f[c->nin].host = lv;
    float lossv = 0;
    T_OK(dpar_graph_run(g, f, c->nin + (c->labels > 0), &lossv));
    double want = c->ref(xd, lv, c);
    if (fabs(lossv - want) > 1e-5 * fmax(1.0, fabs(want)))
        fail_msg("%s: loss %.9g, reference %.9g", c->name, (double)lossv, want);
    for (int i = 0; i < c->nin; i++) {
        int64_t n = fd_count(&c->in[i]);
        float *an = malloc((size_t)(n + 1) * sizeof(float));
        T_OK(dpar_graph_get(g, gr[i], an));
        for (int64_t k = 0; k < n; k++) {
            double h = 1e-4, keep = xd[i][k];
            xd[i][k] = keep + h;
            double lp = c->ref(xd, lv, c);
            xd[i][k] = keep - h;
            double lm = c->ref(xd, lv, c);
            xd[i][k] = keep;
            double fd = (lp - lm) / (2 * h);
            if (fabs(an[k] - fd) > 2e-3 * fmax(fabs(fd), 1e-2))
                fail_msg("%s: d loss / d input %d [%lld]: graph %.7g, finite differences %.7g", c->name, i,
                         (long long)k, (double)an[k], fd);
        }
        free(an);
    }
    for (int i = 0; i < c->nin; i++) free(xd[i]), free(xf[i]);
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_runtime_destroy(rt));
}
static void test_fd_all(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof fd_cases / sizeof fd_cases[0]; i++) run_fd_case(&fd_cases[i]);
}
static void test_fd_vulkan(void **st) {
    (void)st;
    BK = DPAR_BACKEND_VULKAN;
    dpar_runtime *probe = t_runtime_or_skip(BK, 1);
    dpar_runtime_destroy(probe);
    for (size_t i = 0; i < sizeof fd_cases / sizeof fd_cases[0]; i++) run_fd_case(&fd_cases[i]);
    BK = DPAR_BACKEND_CPU;
}

int main(void) {
    const char *b = getenv("DPAR_GRAPH_BACKEND");
    if (b && !strcmp(b, "vulkan")) BK = DPAR_BACKEND_VULKAN;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_all),
        cmocka_unit_test(test_fd_vulkan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
