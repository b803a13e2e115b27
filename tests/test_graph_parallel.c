/* ZeRO-1 and pipeline stages as graph options (dpar_graph_zero1, dpar_graph_pipeline) on 1, 2 and 4
   devices, CPU and Vulkan: losses within 1e-5 relative of the plain graph (ZeRO-1: the data-parallel
   graph on as many devices; pipelines of 1, 3, 4 micro-batches: the graph on one device), params
   within 1e-4, replicas bitwise identical, optimizer memory per device divided by the axis size, the bytes
   compile reports equal to what the devices hold (check_accounting), and the errors of bad input. The model
   is a 4-layer MLP whose widths are no multiple of 2 or 4 (padding). */
#include "testutil.h"
#include <unistd.h>

enum { B = 12, NL = 4, NP = 2 * NL, STEPS = 6 };
static const int64_t dims[NL + 1] = { 5, 7, 6, 9, 3 };
static dpar_backend_kind BK = DPAR_BACKEND_CPU;

static uint64_t rng_state = 99;
static float rnd(void) {
    return (float)t_splitmix(&rng_state);
} /* [-1, 1) */
typedef struct data {
    float x[STEPS][B * 5], init[NP][64];
    int32_t y[STEPS][B];
} data;
static void make_data(data *d) {
    rng_state = 99;
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < B * 5; i++) d->x[s][i] = rnd();
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < B; i++) d->y[s][i] = (int32_t)((rnd() + 1.0f) * 1.5f) % 3;
    for (int k = 0; k < NP; k++)
        for (int i = 0; i < 64; i++) d->init[k][i] = k % 2 ? 0.1f * rnd() : 0.6f * rnd();
}

typedef struct opts {
    const char *zero1; /* ZeRO-1 axes or NULL */
    const char *pipe;  /* pipeline axis or NULL */
    int stages, micro;
    bool adamw;
} opts;
typedef struct model {
    dpar_graph *g;
    dpar_array *w[NP];
    dpar_value x, y, p[NP], gr[NP];
    dpar_graph_stats st;
} model;
static const dpar_sgd_desc SGD = { .learning_rate = 0.2f, .momentum = 0.9f };
static const dpar_adamw_desc ADAMW = { .learning_rate = 0.02f, .weight_decay = 0.01f, .clip_norm = 0.5f };

/* The MLP x [B,5] -> 7 -> 6 -> 9 -> 3 (ReLU between), softmax cross-entropy with y; the batch split over
   "data" unless pipelined; o->stages - 1 stage boundaries spread over the 3 hidden layers. */
static void build(model *t, dpar_mesh *m, const opts *o, const data *d) {
    memset(t, 0, sizeof *t);
    T_OK(dpar_graph_create(m, &t->g));
    dpar_graph *g = t->g;
    if (o->pipe) T_OK(dpar_graph_pipeline(g, o->pipe, o->micro));
    const char *split = o->pipe ? NULL : "data";
    dpar_array_desc xd = { DPAR_F32, 2, { B, 5 }, { split } }, yd = { DPAR_I32, 1, { B }, { split } };
    t->x = dpar_g_feed(g, "x", &xd);
    t->y = dpar_g_feed(g, "y", &yd);
    dpar_value h = t->x;
    for (int l = 0; l < NL; l++) {
        dpar_array_desc wd = { DPAR_F32, 2, { dims[l], dims[l + 1] }, { NULL } };
        dpar_array_desc bd = { DPAR_F32, 1, { dims[l + 1] }, { NULL } };
        T_OK(dpar_array_create(m, &wd, &t->w[2 * l]));
        T_OK(dpar_array_create(m, &bd, &t->w[2 * l + 1]));
        T_OK(dpar_array_put(t->w[2 * l], d->init[2 * l]));
        T_OK(dpar_array_put(t->w[2 * l + 1], d->init[2 * l + 1]));
        t->p[2 * l] = dpar_g_param(g, "w", t->w[2 * l]);
        t->p[2 * l + 1] = dpar_g_param(g, "b", t->w[2 * l + 1]);
        if (o->pipe && l > 0 && (l * o->stages) / NL != ((l - 1) * o->stages) / NL) h = dpar_g_pipe_split(g, h);
        h = dpar_g_bias_add(g, dpar_g_matmul(g, h, t->p[2 * l], false, false), t->p[2 * l + 1]);
        if (l < NL - 1) h = dpar_g_relu(g, h);
    }
    dpar_value loss = dpar_g_softmax_xent(g, h, t->y);
    T_OK(dpar_graph_value_and_grad(g, loss, t->p, NP, t->gr));
    if (o->zero1) T_OK(dpar_graph_zero1(g, o->zero1));
    if (o->adamw)
        T_OK(dpar_graph_adamw(g, &ADAMW, t->p, t->gr, NP));
    else
        T_OK(dpar_graph_sgd(g, &SGD, t->p, t->gr, NP));
    T_OK(dpar_graph_compile(g, &t->st));
}
/* What compile reports is what device 0 holds: the params built with the
   graph plus planned_bytes + resident_bytes + opt_bytes (dpar_graph_stats),
   byte for byte, for the plain, ZeRO-1 and pipeline graphs; and the plan
   needs no more than one buffer per node, nor less than its live set. */
static void check_accounting(const model *t, uint64_t before, uint64_t after, int n, const opts *o) {
    uint64_t params = 0;
    for (int k = 0; k < NP; k++) params += (uint64_t)(dims[k / 2 + 1] * (k % 2 ? 1 : dims[k / 2])) * 4u;
    const dpar_graph_stats *st = &t->st;
    uint64_t graph = st->planned_bytes + st->resident_bytes + st->opt_bytes;
    if (after - before != params + graph)
        fail_msg("%d devices, %s, %d micro-batches: device 0 holds %llu bytes more after compile, the params %llu + "
                 "planned %llu + resident %llu + optimizer %llu",
                 n,
                 o->pipe    ? "pipeline"
                 : o->zero1 ? "ZeRO-1"
                            : "plain",
                 o->micro, (unsigned long long)(after - before), (unsigned long long)params,
                 (unsigned long long)st->planned_bytes, (unsigned long long)st->resident_bytes,
                 (unsigned long long)st->opt_bytes);
    int sets = o->pipe ? o->micro : 1; /* a pipeline plans one buffer set per micro-batch */
    assert_true(st->live_bytes <= st->planned_bytes && st->planned_bytes <= (uint64_t)sets * st->naive_bytes);
}
/* STEPS losses of the model under o on n devices; the params after the last step into params. */
static void train(int n, const opts *o, const data *d, float *loss, float (*params)[64], dpar_graph_stats *st) {
    dpar_runtime *rt = t_runtime_or_skip(BK, n);
    dpar_mesh *m = t_mesh1(rt, n, o->pipe ? o->pipe : "data");
    model t;
    dpar_device_stats before, after;
    T_OK(dpar_runtime_device_stats(rt, 0, &before));
    build(&t, m, o, d);
    T_OK(dpar_runtime_device_stats(rt, 0, &after));
    check_accounting(&t, before.memory_in_use, after.memory_in_use, n, o);
    if (o->pipe && n == 2) { /* the printed graph names each node's stage and the boundary */
        char path[64], line[512];
        snprintf(path, sizeof path, "/tmp/dpar_tgp_%d.txt", (int)getpid());
        T_OK(dpar_graph_print(t.g, path));
        FILE *f = fopen(path, "r");
        int boundaries = 0;
        while (f && fgets(line, sizeof line, f)) boundaries += strstr(line, "ppermute") && strstr(line, "(boundary)");
        if (f) fclose(f);
        remove(path);
        assert_int_equal(boundaries, 2); /* forward and its transpose */
    }
    for (int s = 0; s < STEPS; s++) {
        dpar_graph_feed f[2] = { { t.x, d->x[s % 2], NULL }, { t.y, d->y[s % 2], NULL } };
        T_OK(dpar_graph_run(t.g, f, 2, &loss[s]));
    }
    for (int k = 0; k < NP; k++) { /* every replica of every param bitwise the same */
        T_OK(dpar_array_get(t.w[k], params[k]));
        int64_t c = dims[k / 2 + 1] * (k % 2 ? 1 : dims[k / 2]);
        float other[64];
        for (int dev = 1; dev < n; dev++) {
            T_OK(dpar_buffer_read(dpar_array_shard(t.w[k], dev), 0, other, (size_t)c * 4));
            if (memcmp(other, params[k], (size_t)c * 4)) fail_msg("param %d differs on device %d", k, dev);
        }
    }
    if (st) *st = t.st;
    T_OK(dpar_graph_destroy(t.g));
    T_OK(dpar_runtime_destroy(rt));
}
static void close_rel(const float *a, const float *b, int64_t n, double tol, const char *what, int dev) {
    for (int64_t i = 0; i < n; i++) {
        double r = fabs((double)a[i] - (double)b[i]) / fmax(fabs((double)a[i]), 1e-3);
        if (!(r <= tol))
            fail_msg("%s on %d devices, element %lld: %.9g vs %.9g (relative %.3g > %.1g)", what, dev, (long long)i,
                     (double)a[i], (double)b[i], r, tol);
    }
}

/* ---- ZeRO-1 against the plain data-parallel graph ---- */
static void zero1_vs_plain(void) {
    static data d;
    make_data(&d);
    for (int ad = 0; ad < 2; ad++)
        for (int n = 1; n <= 4; n *= 2) {
            float l0[STEPS], l1[STEPS], p0[NP][64], p1[NP][64];
            dpar_graph_stats s0, s1;
            opts plain = { .adamw = ad != 0 }, z = { .zero1 = "data", .adamw = ad != 0 };
            train(n, &plain, &d, l0, p0, &s0);
            train(n, &z, &d, l1, p1, &s1);
            close_rel(l0, l1, STEPS, 1e-5, ad ? "ZeRO-1 AdamW loss" : "ZeRO-1 SGD loss", n);
            for (int k = 0; k < NP; k++)
                close_rel(p0[k], p1[k], dims[k / 2 + 1] * (k % 2 ? 1 : dims[k / 2]), 1e-4, "ZeRO-1 params", n);
            if (!(l0[STEPS - 2] < l0[0]))
                fail_msg("%d devices: loss %g after %d steps, %g at first", n, (double)l0[STEPS - 2], STEPS - 2,
                         (double)l0[0]);
            /* optimizer state per device: the plain graph's / n, plus at most n - 1 padding floats per state */
            uint64_t pad = (uint64_t)NP * (uint64_t)(n - 1) * 4u * (ad ? 2u : 1u);
            uint64_t per_n = s1.opt_bytes * (uint64_t)n;
            if (per_n > s0.opt_bytes + pad * (uint64_t)n || per_n < s0.opt_bytes)
                fail_msg("%d devices: optimizer bytes %llu with ZeRO-1, %llu plain", n,
                         (unsigned long long)s1.opt_bytes, (unsigned long long)s0.opt_bytes);
            printf("ZeRO-1 %s on %d device(s): losses within 1e-5, optimizer state %llu bytes per device (plain "
                   "%llu)\n",
                   ad ? "AdamW" : "SGD", n, (unsigned long long)s1.opt_bytes, (unsigned long long)s0.opt_bytes);
        }
}

static void zero1_bad_input(void) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    static data d;
    make_data(&d);
    model t;
    opts o = { .zero1 = "data" };
    build(&t, m, &o, &d);
    /* twice, after the optimizer */
    T_ERR(dpar_graph_zero1(t.g, "data"), DPAR_ERR_STATE, "dpar_graph_zero1", "compiled");
    assert_null(dpar_graph_zero1_state(t.g, NP, 0));
    assert_non_null(dpar_graph_zero1_state(t.g, 0, 0));
    assert_null(dpar_graph_zero1_state(t.g, 0, 1)); /* SGD: one state */
    T_OK(dpar_graph_destroy(t.g));

    /* unknown axis */
    dpar_graph *g;
    T_OK(dpar_graph_create(m, &g));
    T_ERR(dpar_graph_zero1(g, "model"), DPAR_ERR_UNKNOWN_AXIS, "dpar_graph_zero1", "model");
    T_OK(dpar_graph_destroy(g));

    /* a loss that does not vary over "data" (replicated batch): its gradients are not all-reduced */
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc xd = { DPAR_F32, 2, { 4, 3 }, { NULL } }, wd = { DPAR_F32, 1, { 3 }, { NULL } };
    dpar_array *w, *ws;
    T_OK(dpar_array_create(m, &wd, &w));
    dpar_value x = dpar_g_feed(g, "x", &xd), p = dpar_g_param(g, "w", w), gr;
    dpar_value loss = dpar_g_sum_squares(g, dpar_g_matmul(g, x, dpar_g_reshape(g, p, 2, (int64_t[]){ 3, 1 }), 0, 0));
    T_OK(dpar_graph_value_and_grad(g, loss, &p, 1, &gr));
    T_OK(dpar_graph_zero1(g, "data"));
    T_ERR(dpar_graph_sgd(g, &SGD, &p, &gr, 1), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_sgd", "all-reduce", "'w'");
    T_OK(dpar_graph_destroy(g));

    /* a param split over the axis */
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc xs = { DPAR_F32, 2, { 4, 4 }, { "data" } }, wsd = { DPAR_F32, 2, { 4, 4 }, { NULL, "data" } };
    T_OK(dpar_array_create(m, &wsd, &ws));
    x = dpar_g_feed(g, "x", &xs);
    p = dpar_g_param(g, "ws", ws);
    loss = dpar_g_sum_squares(g, dpar_g_matmul(g, x, p, 0, 0));
    T_OK(dpar_graph_value_and_grad(g, loss, &p, 1, &gr));
    T_OK(dpar_graph_zero1(g, "data"));
    T_ERR(dpar_graph_sgd(g, &SGD, &p, &gr, 1), DPAR_ERR_INVALID_ARGUMENT, "split over mesh axes", "'ws'");
    T_OK(dpar_graph_destroy(g));

    /* a gradient read by another node */
    T_OK(dpar_graph_create(m, &g));
    x = dpar_g_feed(g, "x", &xs);
    dpar_array_desc w2d = { DPAR_F32, 2, { 4, 4 }, { NULL } };
    T_OK(dpar_array_create(m, &w2d, &ws));
    p = dpar_g_param(g, "w2", ws);
    loss = dpar_g_sum_squares(g, dpar_g_matmul(g, x, p, 0, 0));
    T_OK(dpar_graph_value_and_grad(g, loss, &p, 1, &gr));
    dpar_g_sum_squares(g, gr); /* the gradient's norm, read in the graph */
    T_OK(dpar_graph_zero1(g, "data"));
    T_ERR(dpar_graph_sgd(g, &SGD, &p, &gr, 1), DPAR_ERR_INVALID_ARGUMENT, "is read by", "sum_squares");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- pipeline stages against the plain graph on one device ---- */
static void pipe_vs_plain(void) {
    static data d;
    make_data(&d);
    for (int ad = 0; ad < 2; ad++) {
        float l0[STEPS], p0[NP][64];
        opts plain = { .adamw = ad != 0 };
        train(1, &plain, &d, l0, p0, NULL);
        if (!(l0[STEPS - 2] < l0[0]))
            fail_msg("plain: loss %g after %d steps, %g at first", (double)l0[STEPS - 2], STEPS - 2, (double)l0[0]);
        for (int n = 1; n <= 4; n *= 2)
            for (int mi = 0; mi < 3; mi++) {
                int micro = (int[]){ 1, 3, 4 }[mi];
                float l1[STEPS], p1[NP][64];
                dpar_graph_stats s1;
                opts o = { .pipe = "stage", .stages = n, .micro = micro, .adamw = ad != 0 };
                train(n, &o, &d, l1, p1, &s1);
                char what[96];
                snprintf(what, sizeof what, "pipeline %s loss (%d micro-batches)", ad ? "AdamW" : "SGD", micro);
                close_rel(l0, l1, STEPS, 1e-5, what, n);
                for (int k = 0; k < NP; k++)
                    close_rel(p0[k], p1[k], dims[k / 2 + 1] * (k % 2 ? 1 : dims[k / 2]), 1e-4, "pipeline params", n);
                printf("pipeline %s: %d stage(s), %d micro-batch(es): losses within 1e-5 of 1 device, %llu planned "
                       "bytes\n",
                       ad ? "AdamW" : "SGD", n, micro, (unsigned long long)s1.planned_bytes);
            }
    }
}

static void pipe_bad_input(void) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "stage");
    dpar_array_desc xd = { DPAR_F32, 2, { 12, 4 }, { NULL } }, yd = { DPAR_I32, 1, { 12 }, { NULL } };
    dpar_array_desc wd = { DPAR_F32, 2, { 4, 4 }, { NULL } };
    dpar_array *w, *w2;
    T_OK(dpar_array_create(m, &wd, &w));
    T_OK(dpar_array_create(m, &wd, &w2));
    dpar_graph *g;
    /* micro-batches that do not divide the batch; a count below 1; after nodes; twice; unknown axis */
    T_OK(dpar_graph_create(m, &g));
    T_ERR(dpar_graph_pipeline(g, "stage", 0), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_pipeline", "0 micro-batches");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    T_ERR(dpar_graph_pipeline(g, "data", 2), DPAR_ERR_UNKNOWN_AXIS, "dpar_graph_pipeline", "data");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    T_OK(dpar_graph_pipeline(g, "stage", 5));
    T_ERR(dpar_graph_pipeline(g, "stage", 5), DPAR_ERR_STATE, "dpar_graph_pipeline", "pipeline already");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    T_OK(dpar_graph_pipeline(g, "stage", 5));
    dpar_value x = dpar_g_feed(g, "x", &xd);
    assert_int_equal(x.id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_SHAPE, "feed 'x'", "12 rows", "5 micro-batches");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    x = dpar_g_feed(g, "x", &xd);
    T_ERR(dpar_graph_pipeline(g, "stage", 2), DPAR_ERR_STATE, "right after dpar_graph_create");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    x = dpar_g_feed(g, "x", &xd);
    assert_int_equal(dpar_g_pipe_split(g, x).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_STATE, "dpar_g_pipe_split", "no pipeline");
    T_OK(dpar_graph_destroy(g));

    /* a stage-0 value read in stage 1 without a boundary; too many boundaries */
    T_OK(dpar_graph_create(m, &g));
    T_OK(dpar_graph_pipeline(g, "stage", 2));
    x = dpar_g_feed(g, "x", &xd);
    dpar_value h = dpar_g_matmul(g, x, dpar_g_param(g, "w", w), false, false);
    dpar_value h1 = dpar_g_pipe_split(g, h);
    assert_int_not_equal(h1.id, 0);
    assert_int_equal(dpar_g_add(g, h1, h).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_INVALID_ARGUMENT, "belongs to stage 0", "read in stage 1",
          "dpar_g_pipe_split");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    T_OK(dpar_graph_pipeline(g, "stage", 2));
    x = dpar_g_feed(g, "x", &xd);
    h = dpar_g_pipe_split(g, x);
    assert_int_equal(dpar_g_pipe_split(g, h).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_INVALID_ARGUMENT, "boundary 2", "2 devices");
    T_OK(dpar_graph_destroy(g));

    /* compile: no boundary on 2 devices; a param on two stages; a collective over the stage axis */
    for (int c = 0; c < 3; c++) {
        T_OK(dpar_graph_create(m, &g));
        T_OK(dpar_graph_pipeline(g, "stage", 2));
        x = dpar_g_feed(g, "x", &xd);
        dpar_value y = dpar_g_feed(g, "y", &yd), pw = dpar_g_param(g, "w", w), pw2 = dpar_g_param(g, "w2", w2), gr[2];
        h = dpar_g_matmul(g, x, pw, false, false);
        if (c == 2) h = dpar_g_psum(g, h, "stage");
        if (c > 0) h = dpar_g_pipe_split(g, h);
        h = dpar_g_matmul(g, h, c == 1 ? pw : pw2, false, false);
        dpar_value p2[2] = { pw, pw2 };
        T_OK(dpar_graph_value_and_grad(g, dpar_g_softmax_xent(g, h, y), p2, 2, gr));
        if (c == 0) T_ERR(dpar_graph_compile(g, NULL), DPAR_ERR_INVALID_ARGUMENT, "loss on stage 0", "2 stages");
        if (c == 1) T_ERR(dpar_graph_compile(g, NULL), DPAR_ERR_INVALID_ARGUMENT, "param", "'w'", "stage 0", "stage 1");
        if (c == 2) T_ERR(dpar_graph_compile(g, NULL), DPAR_ERR_INVALID_ARGUMENT, "psum", "pipeline axis");
        T_OK(dpar_graph_destroy(g));
    }
    /* ZeRO-1 and a pipeline in one graph */
    T_OK(dpar_graph_create(m, &g));
    T_OK(dpar_graph_pipeline(g, "stage", 2));
    T_ERR(dpar_graph_zero1(g, "stage"), DPAR_ERR_STATE, "pipeline");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_runtime_destroy(rt));
}

static void test_zero1_cpu(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    zero1_vs_plain();
}
static void test_zero1_vulkan(void **st) {
    (void)st;
    BK = DPAR_BACKEND_VULKAN;
    zero1_vs_plain();
}
static void test_zero1_bad_input(void **st) {
    (void)st;
    zero1_bad_input();
}
static void test_pipeline_cpu(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    pipe_vs_plain();
}
static void test_pipeline_vulkan(void **st) {
    (void)st;
    BK = DPAR_BACKEND_VULKAN;
    pipe_vs_plain();
}
static void test_pipeline_bad_input(void **st) {
    (void)st;
    pipe_bad_input();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero1_cpu),       cmocka_unit_test(test_zero1_vulkan),
        cmocka_unit_test(test_zero1_bad_input), cmocka_unit_test(test_pipeline_cpu),
        cmocka_unit_test(test_pipeline_vulkan), cmocka_unit_test(test_pipeline_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
