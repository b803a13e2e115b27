/* Remat (dpar_graph_remat_begin/_end, gradient checkpointing) and the
   graph's memory: an MLP, the CNN of examples/train_cnn.c (its shapes:
   global batch 64 on 4 devices) and the GPT of examples/train_gpt.c (batch
   32 on a 2 x 2 data x model mesh) built twice, plain and with remat
   segments; the loss, every gradient and the parameters after SGD steps
   bit-identical (CPU; Vulkan the same); the planned bytes (dpar_graph_stats)
   and the measured peak (dpar_device_stats.memory_peak after
   dpar_runtime_stats_reset) both lower with remat; the measured peak at
   least the graph's planned live set (live_bytes + resident_bytes +
   opt_bytes) and within 1.1x of it (the issue 17 target); misuse of the
   segment calls. Memory is counted in bytes, so the figures are exact. */
#include "testutil.h"

static uint64_t rng_state = 777;
static float rnd(void) {
    return (float)t_splitmix(&rng_state);
} /* [-1, 1) */

enum { MLP, CNN, GPT, MAXP = 72 };
enum { MLP_D = 256, MLP_H = 512, MLP_L = 4, MLP_C = 10, MLP_B = 128 }; /* per-device batch MLP_B */
enum { CNN_B = 64, CNN_DEV = 4, SIDE = 28, NCLASS = 10 };              /* train_cnn's defaults */
enum { G_L = 4, G_H = 4, G_C = 128, G_T = 64, G_V = 65, G_B = 32 };    /* train_gpt's defaults, dp 2 x tp 2 */
enum { G_BLK = 16, G_NP = G_L * G_BLK + 6 };
static const char *const KIND[] = { "mlp", "cnn", "gpt" };

typedef struct model {
    int kind, ndev, np;
    int64_t batch;       /* global */
    int64_t count[MAXP]; /* each param's global element count */
    dpar_runtime *rt;
    dpar_graph *g;
    dpar_array *w[MAXP];
    dpar_value x, y, p[MAXP], gr[MAXP];
    dpar_graph_stats st;
    uint64_t base; /* device 0's memory in use before the graph (the params) */
} model;

static dpar_array *arr(dpar_mesh *m, int ndim, const int64_t *shape, const char *const *spec) {
    dpar_array_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DPAR_F32;
    d.ndim = ndim;
    for (int i = 0; i < ndim; i++) d.shape[i] = shape[i], d.spec[i] = spec[i];
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &d, &a));
    return a;
}
/* train_gpt's params: wte, wpe, per block LN1, Q, K, V (column-parallel: split over "model" by columns),
   proj (row-parallel: by rows), LN2, fc1 (column), fc2 (row), each weight then bias; LN_f and the head. */
static int gpt_shapes(int *ndim, int64_t sh[MAXP][4], const char *spec[MAXP][2]) {
    static const char *const M = "model";
    static const struct {
        int64_t r, c; /* c 0: a vector */
        const char *s0, *s1;
    } blk[G_BLK] = { { G_C, 0, 0, 0 },       { G_C, 0, 0, 0 },     { G_C, G_C, 0, M },     { G_C, 0, M, 0 },
                     { G_C, G_C, 0, M },     { G_C, 0, M, 0 },     { G_C, G_C, 0, M },     { G_C, 0, M, 0 },
                     { G_C, G_C, M, 0 },     { G_C, 0, 0, 0 },     { G_C, 0, 0, 0 },       { G_C, 0, 0, 0 },
                     { G_C, 4 * G_C, 0, M }, { 4 * G_C, 0, M, 0 }, { 4 * G_C, G_C, M, 0 }, { G_C, 0, 0, 0 } };
    int n = 0;
    ndim[n] = 2, sh[n][0] = G_V, sh[n++][1] = G_C;
    ndim[n] = 2, sh[n][0] = G_T, sh[n++][1] = G_C;
    for (int l = 0; l < G_L; l++)
        for (int k = 0; k < G_BLK; k++, n++) {
            ndim[n] = blk[k].c ? 2 : 1, sh[n][0] = blk[k].r, sh[n][1] = blk[k].c;
            spec[n][0] = blk[k].s0, spec[n][1] = blk[k].s1;
        }
    for (int k = 0; k < 4; k++, n++) /* LN_f gain, bias; head weight [C, V], bias [V] */
        ndim[n] = k == 2 ? 2 : 1, sh[n][0] = k == 3 ? G_V : G_C, sh[n][1] = G_V;
    return n;
}
/* The parameters' shapes: MLP (W, b) per layer; CNN as train_cnn (HWIO convs, then two dense layers). */
static int param_shapes(int kind, int *ndim, int64_t sh[MAXP][4]) {
    static const int64_t cnn[8][4] = { { 3, 3, 1, 32 },     { 32 },  { 3, 3, 32, 64 }, { 64 },
                                       { 7 * 7 * 64, 256 }, { 256 }, { 256, NCLASS },  { NCLASS } };
    static const int cnn_nd[8] = { 4, 1, 4, 1, 2, 1, 2, 1 };
    if (kind == CNN) {
        for (int i = 0; i < 8; i++) ndim[i] = cnn_nd[i], memcpy(sh[i], cnn[i], sizeof cnn[i]);
        return 8;
    }
    for (int l = 0; l <= MLP_L; l++) {
        int64_t in = l ? MLP_H : MLP_D, out = l == MLP_L ? MLP_C : MLP_H;
        ndim[2 * l] = 2, sh[2 * l][0] = in, sh[2 * l][1] = out;
        ndim[2 * l + 1] = 1, sh[2 * l + 1][0] = out;
    }
    return 2 * (MLP_L + 1);
}
static dpar_value dense(dpar_graph *g, dpar_value h, const dpar_value *p, bool relu) {
    dpar_value z = dpar_g_bias_add(g, dpar_g_matmul(g, h, p[0], false, false), p[1]);
    return relu ? dpar_g_relu(g, z) : z;
}
/* train_gpt's pre-LN block on x [b*T, C]: attention over this device's heads (Q, K, V column-parallel, proj
   row-parallel), then the GELU MLP (fc1 column-, fc2 row-parallel); one psum over "model" per sublayer. */
static dpar_value gpt_block(dpar_graph *g, const dpar_value *p, dpar_value x, int64_t b) {
    const int64_t hl = G_H / 2, hd = G_C / G_H; /* heads per device (tp 2), head width */
    const int swap[4] = { 0, 2, 1, 3 };
    dpar_value h = dpar_g_pcast(g, dpar_g_layer_norm(g, x, p[0], p[1], 1e-5f), "model"), qkv[3];
    for (int j = 0; j < 3; j++) { /* [b*T, hl*hd] -> [b, hl, T, hd] */
        dpar_value z = dpar_g_bias_add(g, dpar_g_matmul(g, h, p[2 + 2 * j], false, false), p[3 + 2 * j]);
        qkv[j] = dpar_g_transpose(g, dpar_g_reshape(g, z, 4, (int64_t[]){ b, G_T, hl, hd }), swap);
    }
    dpar_value a = dpar_g_transpose(g, dpar_g_attention(g, qkv[0], qkv[1], qkv[2], 0.0f, true), swap);
    a = dpar_g_reshape(g, a, 2, (int64_t[]){ b * G_T, hl * hd });
    dpar_value o = dpar_g_psum(g, dpar_g_matmul(g, a, p[8], false, false), "model");
    x = dpar_g_add(g, x, dpar_g_bias_add(g, o, p[9]));
    h = dpar_g_pcast(g, dpar_g_layer_norm(g, x, p[10], p[11], 1e-5f), "model");
    h = dpar_g_bias_add(g, dpar_g_matmul(g, h, p[12], false, false), p[13]);
    o = dpar_g_psum(g, dpar_g_matmul(g, dpar_g_unary(g, h, DPAR_UNARY_GELU_TANH, 0.0f), p[14], false, false), "model");
    return dpar_g_add(g, x, dpar_g_bias_add(g, o, p[15]));
}
/* train_gpt's logits [b*T, V] of the tokens x [b, T] of this "data" shard; remat: each block a segment. */
static dpar_value gpt_forward(model *t, bool remat) {
    dpar_graph *g = t->g;
    int64_t b = t->batch / 2;
    dpar_value x = dpar_g_binary(g, dpar_g_embedding(g, t->p[0], t->x), t->p[1], DPAR_BINARY_ADD);
    x = dpar_g_reshape(g, x, 2, (int64_t[]){ b * G_T, G_C });
    for (int l = 0; l < G_L; l++) {
        if (remat) T_OK(dpar_graph_remat_begin(g));
        x = gpt_block(g, t->p + 2 + l * G_BLK, x, b);
        if (remat) T_OK(dpar_graph_remat_end(g));
    }
    const dpar_value *f = t->p + 2 + G_L * G_BLK;
    x = dpar_g_layer_norm(g, x, f[0], f[1], 1e-5f);
    return dpar_g_bias_add(g, dpar_g_matmul(g, x, f[2], false, false), f[3]);
}
/* The forward pass; remat: every two hidden layers (MLP: the square-root
   checkpointing of Chen et al. 2016), each conv block (CNN) or each block (GPT) a segment. */
static dpar_value forward(model *t, bool remat) {
    dpar_graph *g = t->g;
    dpar_value h = t->x;
    if (t->kind == GPT) return gpt_forward(t, remat);
    if (t->kind == MLP) {
        for (int l = 0; l < MLP_L; l++) {
            if (remat && l % 2 == 0) T_OK(dpar_graph_remat_begin(g));
            h = dense(g, h, t->p + 2 * l, true);
            if (remat && l % 2 == 1) T_OK(dpar_graph_remat_end(g));
        }
        return dense(g, h, t->p + 2 * MLP_L, false);
    }
    const dpar_pool2d_desc pool = { .window = { 2, 2 }, .stride = { 2, 2 } };
    for (int c = 0; c < 2; c++) {
        if (remat) T_OK(dpar_graph_remat_begin(g));
        h = dpar_g_avg_pool2d(g, dpar_g_relu(g, dpar_g_conv2d(g, h, t->p[2 * c], t->p[2 * c + 1], NULL)), &pool);
        if (remat) T_OK(dpar_graph_remat_end(g));
    }
    h = dpar_g_reshape(g, h, 2, (int64_t[]){ t->batch / t->ndev, 7 * 7 * 64 });
    return dense(g, dense(g, h, t->p + 4, true), t->p + 6, false);
}
/* Params from the same seed, then (after a stats reset) the graph: feeds,
   forward, value_and_grad, SGD when sgd, compile (t->st). */
static void build(model *t, dpar_runtime *rt, int kind, bool remat, bool sgd) {
    memset(t, 0, sizeof *t);
    t->kind = kind, t->rt = rt;
    int first;
    dpar_runtime_local_devices(rt, &first, &t->ndev);
    t->batch = kind == MLP ? (int64_t)MLP_B * t->ndev : kind == CNN ? CNN_B : G_B;
    dpar_mesh *m = kind == GPT ? t_mesh(rt, 2, (const int[]){ 2, 2 }, (const char *const[]){ "data", "model" })
                               : t_mesh1(rt, t->ndev, "data");
    int nd[MAXP];
    int64_t sh[MAXP][4];
    const char *spec[MAXP][2];
    memset(spec, 0, sizeof spec);
    t->np = kind == GPT ? gpt_shapes(nd, sh, spec) : param_shapes(kind, nd, sh);
    rng_state = 777;
    for (int i = 0; i < t->np; i++) {
        t->w[i] = arr(m, nd[i], sh[i], spec[i]);
        int64_t n = 1;
        for (int d = 0; d < nd[i]; d++) n *= sh[i][d];
        t->count[i] = n;
        float *h = malloc((size_t)n * sizeof(float));
        float sc = nd[i] == 1 ? 0.1f : 1.0f / sqrtf((float)(n / sh[i][nd[i] - 1])); /* 1 / sqrt(fan-in) */
        for (int64_t k = 0; k < n; k++) h[k] = sc * rnd();
        T_OK(dpar_array_put(t->w[i], h));
        free(h);
    }
    dpar_runtime_stats_reset(rt);
    dpar_device_stats ds;
    T_OK(dpar_runtime_device_stats(rt, 0, &ds));
    t->base = ds.memory_in_use;
    T_OK(dpar_graph_create(m, &t->g));
    dpar_graph *g = t->g;
    dpar_array_desc xd = { DPAR_F32, 2, { t->batch, MLP_D }, { "data" } };
    if (kind == CNN) xd = (dpar_array_desc){ DPAR_F32, 4, { t->batch, SIDE, SIDE, 1 }, { "data" } };
    dpar_array_desc yd = { DPAR_I32, 1, { t->batch }, { "data" } };
    if (kind == GPT) /* token ids and their next tokens */
        xd = (dpar_array_desc){ DPAR_I32, 2, { t->batch, G_T }, { "data" } },
        yd = (dpar_array_desc){ DPAR_I32, 1, { t->batch * G_T }, { "data" } };
    t->x = dpar_g_feed(g, "x", &xd), t->y = dpar_g_feed(g, "y", &yd);
    for (int i = 0; i < t->np; i++) t->p[i] = dpar_g_param(g, "w", t->w[i]);
    dpar_value loss = dpar_g_softmax_xent(g, forward(t, remat), t->y);
    T_OK(dpar_graph_value_and_grad(g, loss, t->p, t->np, t->gr));
    if (sgd) {
        dpar_sgd_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.learning_rate = 0.05f, sd.momentum = 0.9f;
        T_OK(dpar_graph_sgd(g, &sd, t->p, t->gr, t->np));
    }
    T_OK(dpar_graph_compile(g, &t->st));
}
/* The same batch for every model: step s of the data stream (GPT: tokens x [B, T], targets y [B*T]). */
static void batch_data(const model *t, int s, void **x, int32_t **y) {
    int64_t per = t->kind == MLP   ? MLP_D
                  : t->kind == CNN ? SIDE * SIDE
                                   : G_T,
            rows = t->batch * (t->kind == GPT ? G_T : 1);
    *x = malloc((size_t)(t->batch * per) * 4);
    *y = malloc((size_t)rows * sizeof(int32_t));
    rng_state = 1000u + (uint64_t)s;
    for (int64_t i = 0; i < t->batch * per; i++)
        if (t->kind == GPT)
            ((int32_t *)*x)[i] = (int32_t)((rnd() + 1.0f) * 0.5f * (G_V - 1));
        else
            ((float *)*x)[i] = rnd();
    int ncls = t->kind == MLP ? MLP_C : t->kind == CNN ? NCLASS : G_V;
    for (int64_t i = 0; i < rows; i++) (*y)[i] = (int32_t)((i * 7 + s) % ncls);
}
static float step(model *t, int s) {
    void *x;
    float loss = 0;
    int32_t *y;
    batch_data(t, s, &x, &y);
    dpar_graph_feed f[2] = { { t->x, x, NULL }, { t->y, y, NULL } };
    T_OK(dpar_graph_run(t->g, f, 2, &loss));
    free(x);
    free(y);
    return loss;
}
/* Device 0's peak since the reset in build, above what the params held. */
static uint64_t measured(const model *t) {
    dpar_device_stats ds;
    T_OK(dpar_runtime_device_stats(t->rt, 0, &ds));
    return ds.memory_peak - t->base;
}
/* The graph's planned live set on a device: the largest sum of node buffers
   live at one point of the schedule, its feeds and its optimizer state. */
static uint64_t planned_live(const model *t) {
    return t->st.live_bytes + t->st.resident_bytes + t->st.opt_bytes;
}
static void destroy(model *t) {
    T_OK(dpar_graph_destroy(t->g));
    for (int i = 0; i < t->np; i++) T_OK(dpar_array_destroy(t->w[i]));
}
/* Plain against remat on one backend: losses and gradients bitwise over 3 SGD steps, then the params. */
static void compare(dpar_backend_kind bk, int kind, int ndev, uint64_t *peak_plain, uint64_t *peak_remat,
                    uint64_t *plan_plain, uint64_t *plan_remat) {
    dpar_runtime *rt = t_runtime_or_skip(bk, ndev), *rt2 = t_runtime_or_skip(bk, ndev);
    model a, b;
    build(&a, rt, kind, false, true);
    build(&b, rt2, kind, true, true);
    for (int s = 0; s < 3; s++) {
        float la = step(&a, s), lb = step(&b, s);
        if (memcmp(&la, &lb, sizeof la))
            fail_msg("step %d: loss %.9g plain, %.9g with remat", s, (double)la, (double)lb);
        for (int i = 0; i < a.np; i++) {
            int64_t n = a.count[i]; /* a gradient reads back as its global array */
            float *ga = malloc((size_t)n * sizeof(float)), *gb = malloc((size_t)n * sizeof(float));
            T_OK(dpar_graph_get(a.g, a.gr[i], ga));
            T_OK(dpar_graph_get(b.g, b.gr[i], gb));
            for (int64_t k = 0; k < n; k++)
                if (memcmp(&ga[k], &gb[k], sizeof(float)))
                    fail_msg("step %d: gradient %d [%lld]: %.9g plain, %.9g with remat", s, i, (long long)k,
                             (double)ga[k], (double)gb[k]);
            free(ga);
            free(gb);
        }
    }
    *peak_plain = measured(&a), *peak_remat = measured(&b);
    *plan_plain = planned_live(&a), *plan_remat = planned_live(&b);
    printf("%s %s %d dev, plain -> remat: planned %llu -> %llu bytes (%.1f%%), live %llu -> %llu, measured peak "
           "%llu -> %llu (%.1f%%); measured / planned live set %.3f -> %.3f\n",
           dpar_backend_name(bk), KIND[kind], ndev, (unsigned long long)a.st.planned_bytes,
           (unsigned long long)b.st.planned_bytes, 100.0 * (double)b.st.planned_bytes / (double)a.st.planned_bytes,
           (unsigned long long)a.st.live_bytes, (unsigned long long)b.st.live_bytes, (unsigned long long)*peak_plain,
           (unsigned long long)*peak_remat, 100.0 * (double)*peak_remat / (double)*peak_plain,
           (double)*peak_plain / (double)*plan_plain, (double)*peak_remat / (double)*plan_remat);
    assert_true(b.st.planned_bytes < a.st.planned_bytes);
    assert_true(*peak_remat < *peak_plain);
    assert_true(a.st.live_bytes <= a.st.planned_bytes && a.st.planned_bytes <= a.st.naive_bytes);
    assert_true(b.st.live_bytes <= b.st.planned_bytes);
    /* the live set is a lower bound; slots are reused whole (no offsets into a buffer), so some bytes stay idle */
    const double lim = 1.1;
    if (*peak_plain < *plan_plain || *peak_remat < *plan_remat || (double)*peak_plain > lim * (double)*plan_plain ||
        (double)*peak_remat > lim * (double)*plan_remat)
        fail_msg("measured peak %llu / %llu bytes against a planned live set of %llu / %llu (plain / remat): "
                 "outside [1, %.1f]x",
                 (unsigned long long)*peak_plain, (unsigned long long)*peak_remat, (unsigned long long)*plan_plain,
                 (unsigned long long)*plan_remat, lim);
    for (int i = 0; i < a.np; i++) { /* the params after 3 SGD steps */
        int64_t n = a.count[i];      /* a gradient reads back as its global array */
        float *wa = malloc((size_t)n * sizeof(float)), *wb = malloc((size_t)n * sizeof(float));
        T_OK(dpar_array_get(a.w[i], wa));
        T_OK(dpar_array_get(b.w[i], wb));
        if (memcmp(wa, wb, (size_t)n * sizeof(float))) fail_msg("param %d differs after 3 steps", i);
        free(wa);
        free(wb);
    }
    destroy(&a);
    destroy(&b);
    T_OK(dpar_runtime_destroy(rt));
    T_OK(dpar_runtime_destroy(rt2));
}

static void test_mlp_cpu(void **st) {
    (void)st;
    uint64_t pp, pr, lp, lr;
    compare(DPAR_BACKEND_CPU, MLP, 1, &pp, &pr, &lp, &lr);
    compare(DPAR_BACKEND_CPU, MLP, 2, &pp, &pr, &lp, &lr);
}
/* The CNN at train_cnn's shapes: remat lowers both peaks, and the measured
   peak stays within 1.1x of the planned live set (the issue 17 memory target). */
static void test_cnn_cpu(void **st) {
    (void)st;
    uint64_t pp, pr, lp, lr;
    compare(DPAR_BACKEND_CPU, CNN, CNN_DEV, &pp, &pr, &lp, &lr);
}
/* The GPT at train_gpt's shapes on a 2 x 2 (data, model) mesh, each block a
   segment: the same, and its remat segments recompute psums too. */
static void test_gpt_cpu(void **st) {
    (void)st;
    uint64_t pp, pr, lp, lr;
    compare(DPAR_BACKEND_CPU, GPT, 4, &pp, &pr, &lp, &lr);
}
static void test_mlp_vulkan(void **st) {
    (void)st;
    uint64_t pp, pr, lp, lr;
    compare(DPAR_BACKEND_VULKAN, MLP, 2, &pp, &pr, &lp, &lr);
}

/* The graph print marks segments and copies; misuse of the segment calls. */
static void test_segments(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    model t;
    build(&t, rt, MLP, true, false);
    char text[1 << 16];
    t_graph_text(t.g, "test_remat", text, sizeof text);
    assert_non_null(strstr(text, " remat1"));
    assert_non_null(strstr(text, " remat2"));
    assert_null(strstr(text, " remat3"));
    assert_non_null(strstr(text, "recomputes("));
    T_ERR(dpar_graph_remat_begin(t.g), DPAR_ERR_STATE, "dpar_graph_remat_begin", "compiled");
    destroy(&t);

    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_graph *g;
    T_OK(dpar_graph_create(m, &g));
    T_ERR(dpar_graph_remat_end(g), DPAR_ERR_STATE, "no remat segment is open");
    dpar_graph *g2;
    T_OK(dpar_graph_create(m, &g2));
    T_OK(dpar_graph_remat_begin(g2));
    T_ERR(dpar_graph_remat_begin(g2), DPAR_ERR_STATE, "do not nest");
    T_OK(dpar_graph_destroy(g2));
    T_OK(dpar_graph_create(m, &g2));
    dpar_array_desc xd = { DPAR_F32, 1, { 4 }, { NULL } };
    dpar_value x = dpar_g_feed(g2, "x", &xd);
    T_OK(dpar_graph_remat_begin(g2));
    dpar_value l = dpar_g_sum_squares(g2, dpar_g_relu(g2, x)), gx;
    T_ERR(dpar_graph_value_and_grad(g2, l, &x, 1, &gx), DPAR_ERR_STATE, "still open", "dpar_graph_remat_end");
    T_OK(dpar_graph_destroy(g2));
    T_ERR(dpar_graph_remat_begin(NULL), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_runtime_destroy(rt));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_cpu),    cmocka_unit_test(test_cnn_cpu),  cmocka_unit_test(test_gpt_cpu),
        cmocka_unit_test(test_mlp_vulkan), cmocka_unit_test(test_segments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
