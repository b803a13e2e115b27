/* Recorded graph programs (>>graph program, dpar_graph_recorded): on Vulkan the
   first dpar_graph_run records each device's runs of device ops into command
   buffers, on CUDA into CUDA Graphs (stream capture), and later runs re-submit
   them. Each case builds the same graph twice,
   one with DPAR_GRAPH_RECORD=0 (replayed op by op, as before recording existed)
   and one recorded, runs both on the same feeds and wants every loss, every
   kept value read between steps and every parameter after the last step bit for
   bit equal: a CNN (conv2d, max pool, layer norm, dropout, AdamW; the learning
   rate and the step counter changed mid-run) on 1 and 2 devices, a Megatron column -> row MLP with a psum inside on a 2x2 (data,
   model) mesh with SGD; the recording must be split at the host nodes (more
   than one segment per device) and dpar_device_stats counts the same ops per
   step either way. The same MLP on a 1x1 mesh records its SGD step too, and
   records again without it once dpar_graph_set_lr changes the rate; on a 4x1 mesh its loss and gradients
   share one bucket, whose copies back are recorded with the SGD step. A bad label inside a recorded segment is still
   reported by the step that used it, naming its softmax_xent node word for word as the CPU does (also when
   the clipped SGD step's norm read is where the device's check comes back), and the next good step runs.
   Steps fed by dpar_graph_put_feeds with no loss read queue up behind each other and still give the op-by-op
   values (mixed with plain runs and a staged array; on 1 device and on the 4x1 mesh, whose ops counted match),
   and on Vulkan the host blocks once per six of them (dpar_device_stats.host_waits). The CPU backend records
   nothing; NULL is refused. A 1-device runtime runs fn on the caller's thread
   (DPAR_CALLER_THREAD=1, the default) bit for bit as on its worker (=0), on Vulkan and on the CPU. Every case but the last runs on
   Vulkan and on CUDA; each skips when its backend is absent (tests/
   test_cuda_mock.sh runs the CUDA cases against the mock driver). */
#include "testutil.h"

static uint64_t rng_state = 777;
static double rnd(void) {
    return t_splitmix(&rng_state);
} /* [-1, 1) */
static void fill(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * rnd());
}
static dpar_array *arr(dpar_mesh *m, int nd, const int64_t *shape, const char *const *spec, const float *init) {
    dpar_array_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DPAR_F32, d.ndim = nd;
    for (int i = 0; i < nd; i++) d.shape[i] = shape[i], d.spec[i] = spec ? spec[i] : NULL;
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &d, &a));
    T_OK(dpar_array_put(a, init));
    return a;
}
/* One step with DPAR_GRAPH_RECORD set as wanted (the graph reads it at its first run), spaced as a shell line
   may leave it: " 0" was taken as 1 while dpar_runtime_create read it as 0. */
static void step(dpar_graph *g, bool record, dpar_value x, const void *xs, dpar_value y, const void *ys, float *loss) {
    setenv("DPAR_GRAPH_RECORD", record ? "1 " : " 0", 1);
    T_OK(dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, ys, NULL } }, 2, loss));
}
static void want_same(const void *a, const void *b, size_t n, const char *what, int step) {
    if (memcmp(a, b, n)) fail_msg("%s differs at step %d between the op-by-op and the recorded replay", what, step);
}

/* ---- a small CNN: conv -> relu -> max pool -> layer norm -> dropout -> dense -> xent, AdamW ---- */
enum { CB = 2, CH = 6, CC = 2, CO = 4, CF = 3 * 3 * CO, NCL = 5, STEPS = 6, NP = 6 };
typedef struct cnn {
    dpar_graph *g;
    dpar_array *w[NP];
    dpar_value x, y, kept;
} cnn;
static const int64_t cnn_shape[NP][4] = { { 3, 3, CC, CO }, { CO }, { CF }, { CF }, { CF, NCL }, { NCL } };
static const int cnn_nd[NP] = { 4, 1, 1, 1, 2, 1 };
static void cnn_build(cnn *t, dpar_mesh *m, int n, float *const init[NP]) {
    for (int i = 0; i < NP; i++) t->w[i] = arr(m, cnn_nd[i], cnn_shape[i], NULL, init[i]);
    T_OK(dpar_graph_create(m, &t->g));
    dpar_graph *g = t->g;
    dpar_array_desc xd = { DPAR_F32, 4, { CB * n, CH, CH, CC }, { "data" } };
    dpar_array_desc yd = { DPAR_I32, 1, { CB * n }, { "data" } };
    t->x = dpar_g_feed(g, "x", &xd), t->y = dpar_g_feed(g, "y", &yd);
    dpar_value p[NP], gr[NP];
    for (int i = 0; i < NP; i++) p[i] = dpar_g_param(g, "w", t->w[i]);
    dpar_value h = dpar_g_relu(g, dpar_g_conv2d(g, t->x, p[0], p[1], NULL));
    h = dpar_g_max_pool2d(g, h, NULL);
    int64_t flat[2] = { CB, CF };
    h = dpar_g_reshape(g, h, 2, flat);
    h = dpar_g_layer_norm(g, h, p[2], p[3], 1e-5f);
    t->kept = h;
    h = dpar_g_dropout(g, h, 0.25f, 42); /* a host node: its seed moves with the step */
    dpar_value logits = dpar_g_bias_add(g, dpar_g_matmul(g, h, p[4], false, false), p[5]);
    dpar_value loss = dpar_g_pmean(g, dpar_g_softmax_xent(g, logits, t->y), "data");
    T_OK(dpar_graph_value_and_grad(g, loss, p, NP, gr));
    dpar_adamw_desc ad = { .learning_rate = 0.01f, .weight_decay = 0.01f, .clip_norm = 1.0f };
    T_OK(dpar_graph_adamw(g, &ad, p, gr, NP));
    T_OK(dpar_graph_keep(g, t->kept));
    T_OK(dpar_graph_compile(g, NULL));
}
static const char *be_name(dpar_backend_kind k) {
    return k == DPAR_BACKEND_CUDA ? "CUDA" : "Vulkan";
}
/* async: every gradient reduced asynchronously (DPAR_GRAPH_ASYNC_BYTES=1, read when the gradients are built), so
   the communication thread issues reductions while the device's next segment is being recorded. */
static void cnn_case(dpar_backend_kind be, int n, bool async) {
    dpar_runtime *rt = t_runtime_or_skip(be, n);
    dpar_mesh *m = t_mesh1(rt, n, "data");
    static float init[NP][CF * NCL];
    float *ip[NP];
    rng_state = 5;
    for (int i = 0; i < NP; i++) {
        int64_t c = 1;
        for (int d = 0; d < cnn_nd[i]; d++) c *= cnn_shape[i][d];
        fill(init[i], c, i == 2 ? 0.0 : 0.5);
        if (i == 2)
            for (int64_t k = 0; k < c; k++) init[i][k] = 1.0f; /* layer norm scale */
        ip[i] = init[i];
    }
    cnn plain, rec;
    if (async) setenv("DPAR_GRAPH_ASYNC_BYTES", "1", 1);
    cnn_build(&plain, m, n, ip);
    cnn_build(&rec, m, n, ip);
    unsetenv("DPAR_GRAPH_ASYNC_BYTES");
    static float xs[4 * CB * CH * CH * CC], kp[CB * CF], kr[CB * CF];
    int32_t ys[4 * CB];
    for (int s = 0; s < STEPS; s++) {
        fill(xs, (int64_t)CB * n * CH * CH * CC, 1.0);
        for (int i = 0; i < CB * n; i++) ys[i] = (int32_t)((i * 7 + s) % NCL);
        if (s == 3) { /* read on the host each step: the recordings stay valid */
            T_OK(dpar_graph_set_lr(plain.g, 0.003f));
            T_OK(dpar_graph_set_lr(rec.g, 0.003f));
        }
        if (s == 4) {
            T_OK(dpar_graph_set_step(plain.g, 100));
            T_OK(dpar_graph_set_step(rec.g, 100));
        }
        float lp = 0, lr = 0;
        step(plain.g, false, plain.x, xs, plain.y, ys, &lp);
        step(rec.g, true, rec.x, xs, rec.y, ys, &lr);
        want_same(&lp, &lr, sizeof lp, "the loss", s);
        for (int d = 0; d < n; d++) {
            T_OK(dpar_graph_read_shard(plain.g, plain.kept, d, kp));
            T_OK(dpar_graph_read_shard(rec.g, rec.kept, d, kr));
            want_same(kp, kr, sizeof kp, "the kept layer-norm output", s);
        }
    }
    for (int i = 0; i < NP; i++) {
        static float a[CF * NCL], b[CF * NCL];
        T_OK(dpar_array_get(plain.w[i], a));
        T_OK(dpar_array_get(rec.w[i], b));
        want_same(a, b, sizeof a, "a parameter", STEPS);
    }
    int segp = -1, nodp = -1, segr = 0, nodr = 0;
    T_OK(dpar_graph_recorded(plain.g, &segp, &nodp));
    T_OK(dpar_graph_recorded(rec.g, &segr, &nodr));
    assert_int_equal(segp, 0);
    assert_int_equal(nodp, 0);
    if (segr < 2 * n) fail_msg("%d segments recorded on %d devices; want at least 2 each (split at dropout)", segr, n);
    printf("CNN on %d %s device(s)%s: %d segments holding %d nodes, bit for bit over %d steps\n", n, be_name(be),
           async ? ", gradients reduced asynchronously" : "", segr, nodr, STEPS);
    T_OK(dpar_graph_destroy(plain.g));
    T_OK(dpar_graph_destroy(rec.g));
    for (int i = 0; i < NP; i++) dpar_array_destroy(plain.w[i]), dpar_array_destroy(rec.w[i]);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}
static void test_cnn_1(void **st) {
    (void)st;
    cnn_case(DPAR_BACKEND_VULKAN, 1, false);
}
static void test_cnn_2(void **st) {
    (void)st;
    cnn_case(DPAR_BACKEND_VULKAN, 2, false);
}
static void test_cnn_2_async(void **st) {
    (void)st;
    cnn_case(DPAR_BACKEND_VULKAN, 2, true);
}
static void test_cnn_1_cuda(void **st) {
    (void)st;
    cnn_case(DPAR_BACKEND_CUDA, 1, false);
}
static void test_cnn_2_cuda(void **st) {
    (void)st;
    cnn_case(DPAR_BACKEND_CUDA, 2, false);
}
static void test_cnn_2_async_cuda(void **st) {
    (void)st;
    cnn_case(DPAR_BACKEND_CUDA, 2, true);
}

/* ---- Megatron column -> row MLP on 2x2 (data, model): a psum in the forward, SGD with momentum ---- */
enum { MB = 8, MD = 6, MH = 8, MC = 5, SEG_DP = 4 };
typedef struct mlp {
    dpar_graph *g;
    dpar_array *w[4];
    dpar_value x, y;
} mlp;
static void mlp_build(mlp *t, dpar_mesh *m, float *const init[4]) {
    static const int64_t sh[4][2] = { { MD, MH }, { MH }, { MH, MC }, { MC } };
    static const int nd[4] = { 2, 1, 2, 1 };
    const char *s0[2] = { NULL, "model" }, *s1[1] = { "model" }, *s2[2] = { "model", NULL };
    const char *const *spec[4] = { s0, s1, s2, NULL };
    for (int i = 0; i < 4; i++) t->w[i] = arr(m, nd[i], sh[i], spec[i], init[i]);
    T_OK(dpar_graph_create(m, &t->g));
    dpar_graph *g = t->g;
    dpar_array_desc xd = { DPAR_F32, 2, { MB, MD }, { "data" } }, yd = { DPAR_I32, 1, { MB }, { "data" } };
    t->x = dpar_g_feed(g, "x", &xd), t->y = dpar_g_feed(g, "y", &yd);
    dpar_value p[4], gr[4];
    for (int i = 0; i < 4; i++) p[i] = dpar_g_param(g, "w", t->w[i]);
    dpar_value h = dpar_g_relu(g, dpar_g_bias_add(g, dpar_g_matmul(g, t->x, p[0], false, false), p[1]));
    dpar_value z = dpar_g_psum(g, dpar_g_matmul(g, h, p[2], false, false), "model");
    dpar_value loss = dpar_g_pmean(g, dpar_g_softmax_xent(g, dpar_g_bias_add(g, z, p[3]), t->y), "data");
    T_OK(dpar_graph_value_and_grad(g, loss, p, 4, gr));
    dpar_sgd_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.learning_rate = 0.2f, sd.momentum = 0.9f, sd.weight_decay = 1e-3f;
    T_OK(dpar_graph_sgd(g, &sd, p, gr, 4));
    T_OK(dpar_graph_compile(g, NULL));
}
/* The MLP built twice from the same weights (drawn from seed) on a (data, model) mesh of dp x tp: run op
   by op (plain) and recorded (rec). */
typedef struct mlp_pair {
    dpar_runtime *rt;
    dpar_mesh *m;
    mlp plain, rec;
} mlp_pair;
static void pair_make(mlp_pair *p, dpar_backend_kind k, int dp, int tp, uint64_t seed) {
    p->rt = t_runtime_or_skip(k, dp * tp);
    int shape[2] = { dp, tp };
    const char *names[2] = { "data", "model" };
    p->m = t_mesh(p->rt, 2, shape, names);
    static float w0[MD * MH], w1[MH], w2[MH * MC], w3[MC];
    rng_state = seed;
    fill(w0, MD * MH, 1.0), fill(w1, MH, 0.1), fill(w2, MH * MC, 1.0), fill(w3, MC, 0.1);
    float *init[4] = { w0, w1, w2, w3 };
    mlp_build(&p->plain, p->m, init);
    mlp_build(&p->rec, p->m, init);
}
/* Step s of both on the same batch: the losses bit for bit. With ops: each graph's op count on device dev.
   staged: both fed through dpar_graph_put_feeds (the copies into the feeds count as ops either way). */
static void pair_step(mlp_pair *p, int s, int dev, uint64_t ops[2], bool staged) {
    static float xs[MB * MD];
    int32_t ys[MB];
    fill(xs, MB * MD, 1.0);
    for (int i = 0; i < MB; i++) ys[i] = (int32_t)((i * 3 + s) % MC);
    mlp *t[2] = { &p->plain, &p->rec };
    float l[2] = { 0, 0 };
    for (int r = 0; r < 2; r++) {
        if (ops) dpar_runtime_stats_reset(p->rt);
        if (staged) {
            setenv("DPAR_GRAPH_RECORD", r == 1 ? "1" : "0", 1);
            T_OK(dpar_graph_put_feeds(t[r]->g, (dpar_graph_feed[]){ { t[r]->x, xs, NULL }, { t[r]->y, ys, NULL } }, 2));
            T_OK(dpar_graph_run(t[r]->g, NULL, 0, &l[r]));
        } else {
            step(t[r]->g, r == 1, t[r]->x, xs, t[r]->y, ys, &l[r]);
        }
        if (ops) {
            dpar_device_stats ds;
            T_OK(dpar_runtime_device_stats(p->rt, dev, &ds));
            ops[r] = ds.ops;
        }
    }
    want_same(&l[0], &l[1], sizeof l[0], "the loss", s);
}
/* The parameters of both bit for bit after `steps` steps, then everything freed. */
static void pair_finish(mlp_pair *p, int steps) {
    for (int i = 0; i < 4; i++) {
        float a[MD * MH], b[MD * MH];
        T_OK(dpar_array_get(p->plain.w[i], a));
        T_OK(dpar_array_get(p->rec.w[i], b));
        want_same(a, b, sizeof a, "a parameter", steps);
    }
    T_OK(dpar_graph_destroy(p->plain.g));
    T_OK(dpar_graph_destroy(p->rec.g));
    for (int i = 0; i < 4; i++) dpar_array_destroy(p->plain.w[i]), dpar_array_destroy(p->rec.w[i]);
    T_OK(dpar_mesh_destroy(p->m));
    T_OK(dpar_runtime_destroy(p->rt));
}
static void megatron(dpar_backend_kind k) {
    mlp_pair p;
    pair_make(&p, k, 2, 2, 99);
    uint64_t ops[2] = { 0, 0 };
    for (int s = 0; s < 10; s++) {
        pair_step(&p, s, 3, ops, false);
        if (ops[0] != ops[1] || ops[0] == 0) /* a recorded segment's submit counts its ops */
            fail_msg("step %d: device 3 counted %llu ops op by op, %llu recorded", s, (unsigned long long)ops[0],
                     (unsigned long long)ops[1]);
    }
    int seg = 0, nodes = 0;
    T_OK(dpar_graph_recorded(p.plain.g, &seg, &nodes));
    assert_int_equal(seg, 0);
    T_OK(dpar_graph_recorded(p.rec.g, &seg, &nodes));
    if (seg < 2 * 4) fail_msg("%d segments on 4 devices; want at least 2 each (split at the psum)", seg);
    printf("Megatron MLP on a 2x2 %s mesh: %d segments holding %d nodes, bit for bit over 10 steps, "
           "%llu ops per step on device 3 either way\n",
           be_name(k), seg, nodes, (unsigned long long)ops[1]);
    pair_finish(&p, 10);
}

/* ---- the same MLP on a 1x1 mesh: nothing to wait for before the SGD step, so it is recorded too, until
   dpar_graph_set_lr changes the rate (then recorded again without it); bit for bit op by op either way ---- */
static void sgd_recorded(dpar_backend_kind k) {
    mlp_pair p;
    pair_make(&p, k, 1, 1, 5);
    int nodes[2] = { 0, 0 }, seg = 0;
    for (int s = 0; s < 10; s++) {
        if (s == 5) { /* the recording held the old rate: the next run records again, the SGD step outside */
            T_OK(dpar_graph_recorded(p.rec.g, &seg, &nodes[0]));
            T_OK(dpar_graph_set_lr(p.plain.g, 0.05f));
            T_OK(dpar_graph_set_lr(p.rec.g, 0.05f));
        }
        pair_step(&p, s, 0, NULL, false);
    }
    T_OK(dpar_graph_recorded(p.rec.g, NULL, &nodes[1]));
    int plain_seg = -1;
    T_OK(dpar_graph_recorded(p.plain.g, &plain_seg, NULL));
    if (plain_seg != 0) fail_msg("DPAR_GRAPH_RECORD=' 0': the op-by-op graph recorded %d segments", plain_seg);
    if (seg < 1 || nodes[0] - nodes[1] != 1)
        fail_msg("%d segments holding %d nodes with the SGD step, %d after dpar_graph_set_lr; want one node fewer", seg,
                 nodes[0], nodes[1]);
    printf("MLP on a 1x1 %s mesh: %d segments holding %d nodes (the SGD step among them), %d after a new rate, "
           "bit for bit over 10 steps\n",
           be_name(k), seg, nodes[0], nodes[1]);
    pair_finish(&p, 10);
}

/* ---- the same MLP data-parallel on a 4x1 mesh: the pinned loss's pmean and the gradients' reductions share
   one bucket, reduced blocking where the SGD step waits for it, so a device's recording is split only by
   the two collectives over the model axis and by the bucket's collective, after which the copies back
   from the bucket and the SGD step are one more segment (SEG_DP = 4 segments; 6 before the loss and the
   members' copies joined the recording, 3 while the copies back and the SGD step ran op by op); bit for
   bit op by op, the same ops counted. Most steps are fed through dpar_graph_put_feeds, every fourth by
   dpar_graph_run's own feeds: the recorded graph's staged copies, prerecorded per staged set and device
   and submitted with the first segment, count their ops as the op-by-op copies do ---- */
static void data_parallel(dpar_backend_kind k) {
    mlp_pair p;
    pair_make(&p, k, 4, 1, 17);
    uint64_t ops[2] = { 0, 0 };
    for (int s = 0; s < 10; s++) {
        pair_step(&p, s, 2, ops, s % 4 != 3);
        if (ops[0] != ops[1] || ops[0] == 0)
            fail_msg("step %d: device 2 counted %llu ops op by op, %llu recorded", s, (unsigned long long)ops[0],
                     (unsigned long long)ops[1]);
    }
    int seg = 0, nodes = 0;
    T_OK(dpar_graph_recorded(p.rec.g, &seg, &nodes));
    if (seg != SEG_DP * 4) fail_msg("%d segments on 4 devices; want %d each", seg, SEG_DP);
    printf("MLP on a 4x1 %s mesh: %d segments holding %d nodes, bit for bit over 10 steps\n", be_name(k), seg, nodes);
    pair_finish(&p, 10);
}

/* ---- steps queued while the device runs (>>vulkan program: recordings are SIMULTANEOUS_USE): a 1-device
   softmax regression with SGD momentum (one recording a step, nothing between steps) fed by
   dpar_graph_put_feeds and run with loss = NULL, so no step waits for the one before; a parameter read
   between steps and dpar_graph_loss after them see the last step's values, and destroying the graph right
   after its last run waits for it: bit for bit the op-by-op replay fed and read step by step. A replayed
   step submits its staged set's copies prerecorded (six recordings, taken in turn, each step's batch
   different: a copy from the wrong set shows in the bits); step 5 is a plain run with dpar_graph_run's own
   feeds and step 8 stages the caller's array for x (copied op by op), between the staged ones ---- */
typedef struct softreg {
    dpar_graph *g;
    dpar_array *w[2];
    dpar_value x, y;
} softreg;
static void softreg_build(softreg *t, dpar_mesh *m, float *const init[2]) {
    const int64_t sw[2] = { MD, MC }, sb[1] = { MC };
    t->w[0] = arr(m, 2, sw, NULL, init[0]), t->w[1] = arr(m, 1, sb, NULL, init[1]);
    T_OK(dpar_graph_create(m, &t->g));
    dpar_graph *g = t->g;
    dpar_array_desc xd = { DPAR_F32, 2, { MB, MD }, { "data" } }, yd = { DPAR_I32, 1, { MB }, { "data" } };
    t->x = dpar_g_feed(g, "x", &xd), t->y = dpar_g_feed(g, "y", &yd);
    dpar_value p[2] = { dpar_g_param(g, "w", t->w[0]), dpar_g_param(g, "b", t->w[1]) }, gr[2];
    dpar_value z = dpar_g_bias_add(g, dpar_g_matmul(g, t->x, p[0], false, false), p[1]);
    T_OK(dpar_graph_value_and_grad(g, dpar_g_softmax_xent(g, z, t->y), p, 2, gr));
    T_OK(dpar_graph_sgd(g, &(dpar_sgd_desc){ .learning_rate = 0.3f, .momentum = 0.9f }, p, gr, 2));
    T_OK(dpar_graph_compile(g, NULL));
}
static void softreg_batch(float *xs, int32_t *ys, int s) { /* step s's batch, the same for both graphs */
    rng_state = 1000 + (uint64_t)s;
    fill(xs, MB * MD, 1.0);
    for (int i = 0; i < MB; i++) ys[i] = (int32_t)((i * 5 + s) % MC);
}
static void pipelined(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    static float w0[MD * MC], b0[MC], xs[MB * MD];
    int32_t ys[MB];
    rng_state = 23;
    fill(w0, MD * MC, 1.0), fill(b0, MC, 0.1);
    float *init[2] = { w0, b0 };
    softreg t[2]; /* op by op, recorded */
    for (int r = 0; r < 2; r++) softreg_build(&t[r], m, init);
    const int64_t sx[2] = { MB, MD };
    const char *const dspec[2] = { "data", NULL };
    dpar_array *xa = arr(m, 2, sx, dspec, xs);
    float mid[2][MD * MC], last[2];
    static float w[2][2][MD * MC]; /* zero past each parameter's own elements */
    enum { QSTEPS = 30 };
    uint64_t waits = 0;         /* host waits of steps 16..28, queued after the read at step 15 (Vulkan counts them) */
    for (int r = 0; r < 2; r++) /* the op-by-op graph's steps first: none of them between the queued ones */
        for (int s = 0; s < QSTEPS + 3; s++) {
            softreg_batch(xs, ys, s);
            if (r == 1 && s == QSTEPS / 2 + 1) dpar_runtime_stats_reset(rt);
            if (r == 1 && s == QSTEPS - 1) {
                dpar_device_stats ds;
                T_OK(dpar_runtime_device_stats(rt, 0, &ds));
                waits = ds.host_waits;
            }
            if (r == 0)
                step(t[0].g, false, t[0].x, xs, t[0].y, ys, NULL);
            else if (s == 5) /* a plain run between staged ones: the next put fills the set it would have */
                T_OK(
                    dpar_graph_run(t[1].g, (dpar_graph_feed[]){ { t[1].x, xs, NULL }, { t[1].y, ys, NULL } }, 2, NULL));
            else {
                setenv("DPAR_GRAPH_RECORD", "1", 1); /* read at the graph's first run */
                dpar_graph_feed f[2] = { { t[1].x, xs, NULL }, { t[1].y, ys, NULL } };
                if (s == 8) { /* the caller's array staged for x: not a whole staged set, copied op by op */
                    T_OK(dpar_array_put(xa, xs));
                    f[0].host = NULL, f[0].array = xa;
                }
                T_OK(dpar_graph_put_feeds(t[1].g, f, 2));
                T_OK(dpar_graph_run(t[1].g, NULL, 0, NULL));
            }
            if (s == QSTEPS / 2) T_OK(dpar_array_get(t[r].w[0], mid[r])); /* steps in flight: waits for the last */
            if (s == QSTEPS - 1) T_OK(dpar_graph_loss(t[r].g, &last[r]));
        }
    want_same(mid[0], mid[1], sizeof mid[0], "a parameter read between steps", QSTEPS / 2);
    want_same(&last[0], &last[1], sizeof last[0], "dpar_graph_loss", QSTEPS - 1);
    /* steps 16..28, queued after the read at step 15 waited for everything: the staged sets (six) are taken
       in turn, and a put whose set a queued step still reads waits for every queued step, so the puts of
       steps 22 and 28 wait (for 21 and 27) and the others find their sets free: 2 waits in 13 steps, where
       waiting for the set's own step (s - 6) waited at every put from step 22 on (7; 4 with three sets and
       a ring of three batches). Where host writes go through a staging buffer (a discrete
       GPU, DPAR_VK_FORCE_STAGING) every put drains the device, and the other backends count no waits. */
    dpar_device_info di;
    T_OK(dpar_runtime_device_info(rt, 0, &di));
    bool mapped = k == DPAR_BACKEND_VULKAN && di.runs_on_cpu && !getenv("DPAR_VK_FORCE_STAGING");
    if (mapped && waits != 2) fail_msg("%llu host waits over 13 queued steps; want 2", (unsigned long long)waits);
    if (k != DPAR_BACKEND_VULKAN && waits)
        fail_msg("%llu host waits counted by %s", (unsigned long long)waits, be_name(k));
    if (k == DPAR_BACKEND_VULKAN && !mapped)
        printf("host waits not checked: this device's host writes go through a staging buffer\n");
    int seg = 0;
    T_OK(dpar_graph_recorded(t[1].g, &seg, NULL));
    if (seg != 1) fail_msg("%d segments; want the whole step in one recording", seg);
    T_OK(dpar_graph_destroy(t[1].g)); /* right after its last run: waits for the queued steps */
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 2; i++) T_OK(dpar_array_get(t[r].w[i], w[r][i]));
    want_same(w[0], w[1], sizeof w[0], "the parameters", QSTEPS + 3);
    T_OK(dpar_graph_destroy(t[0].g));
    for (int r = 0; r < 2; r++) dpar_array_destroy(t[r].w[0]), dpar_array_destroy(t[r].w[1]);
    dpar_array_destroy(xa);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
    printf("softmax regression on 1 %s device, staged feeds and no loss read: one recording, bit for bit over %d "
           "queued steps, %llu host waits in 13 of them\n",
           be_name(k), QSTEPS + 3, (unsigned long long)waits);
}
static void test_pipelined(void **st) {
    (void)st;
    pipelined(DPAR_BACKEND_VULKAN);
}
static void test_pipelined_cuda(void **st) {
    (void)st;
    pipelined(DPAR_BACKEND_CUDA);
}

/* ---- a wide cross-entropy (Vulkan's three passes over the device's scratch, dpar__vk_xent): x [128,3] @ w [3,600],
   ignored rows and label smoothing, an SGD step; op by op and recorded, bit for bit over three steps ---- */
static void xent_wide(dpar_backend_kind k) {
    enum { XR = 128, XF = 3, XC = 600 };
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    static float w0[XF * XC], wout[2][XF * XC];
    float xs[XR * XF], loss[2][3];
    int32_t ys[XR];
    rng_state = 11;
    fill(w0, XF * XC, 1.0), fill(xs, XR * XF, 2.0);
    for (int i = 0; i < XR; i++) ys[i] = i % 5 == 3 ? -1 : (i * 37) % XC;
    int64_t sh[2] = { XF, XC };
    for (int r = 0; r < 2; r++) {
        dpar_array *w = arr(m, 2, sh, NULL, w0);
        dpar_graph *g = NULL;
        T_OK(dpar_graph_create(m, &g));
        dpar_array_desc xd = { DPAR_F32, 2, { XR, XF }, { NULL } }, yd = { DPAR_I32, 1, { XR }, { NULL } };
        dpar_value x = dpar_g_feed(g, "x", &xd), y = dpar_g_feed(g, "y", &yd), p = dpar_g_param(g, "w", w), gr;
        dpar_xent_desc d = { .use_ignore = true, .ignore_label = -1, .label_smoothing = 0.1f };
        T_OK(dpar_graph_value_and_grad(g, dpar_g_cross_entropy(g, dpar_g_matmul(g, x, p, false, false), y, &d), &p, 1,
                                       &gr));
        dpar_sgd_desc sd = { .learning_rate = 0.5f };
        T_OK(dpar_graph_sgd(g, &sd, &p, &gr, 1));
        T_OK(dpar_graph_compile(g, NULL));
        for (int i = 0; i < 3; i++) step(g, r, x, xs, y, ys, &loss[r][i]);
        T_OK(dpar_array_get(w, wout[r]));
        int seg = 0;
        T_OK(dpar_graph_recorded(g, &seg, NULL));
        assert_int_equal(seg > 0, r);
        T_OK(dpar_graph_destroy(g));
        dpar_array_destroy(w);
    }
    for (int i = 0; i < 3; i++) want_same(&loss[0][i], &loss[1][i], sizeof(float), "the loss", i);
    want_same(wout[0], wout[1], sizeof wout[0], "the param", 3);
    assert_true(isfinite(loss[0][2]) && loss[0][2] < loss[0][0]);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}
static void test_xent_wide(void **st) {
    (void)st;
    xent_wide(DPAR_BACKEND_VULKAN);
}
static void test_xent_wide_cuda(void **st) {
    (void)st;
    xent_wide(DPAR_BACKEND_CUDA);
}

/* ---- a bad label inside a recorded segment: reported by its step, then the graph runs on ---- */
/* x [4n,3] @ w [3,5] -> softmax_xent with y (n devices: split over "data"); *loss its node. clip: an SGD step clipped by the global norm follows,
   whose norm read on Vulkan and CUDA is where the device's label check comes back (else at the loss read). */
static dpar_value label_w; /* label_graph's param w */
static dpar_graph *label_graph(dpar_mesh *m, dpar_array *w, dpar_value *x, dpar_value *y, dpar_value *loss, bool clip) {
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    int n = dpar_mesh_size(m); /* 4 rows a device, split over "data" */
    const char *split = n > 1 ? "data" : NULL;
    dpar_array_desc xd = { DPAR_F32, 2, { 4 * n, 3 }, { split } }, yd = { DPAR_I32, 1, { 4 * n }, { split } };
    *x = dpar_g_feed(g, "x", &xd), *y = dpar_g_feed(g, "y", &yd);
    dpar_value p = label_w = dpar_g_param(g, "w", w), gr;
    *loss = dpar_g_softmax_xent(g, dpar_g_matmul(g, *x, p, false, false), *y);
    T_OK(dpar_graph_value_and_grad(g, *loss, &p, 1, &gr));
    dpar_sgd_desc sd = { .learning_rate = 0.1f, .clip_norm = 1.0f };
    if (clip) T_OK(dpar_graph_sgd(g, &sd, &p, &gr, 1));
    T_OK(dpar_graph_compile(g, NULL));
    return g;
}
/* Label 9 of 5 classes at row 1, op by op and recorded, read back at the loss or in the clipped SGD step: the
   error reads as the CPU's, naming the softmax_xent node (not the node or the read where it came back). */
static void bad_label_run(dpar_backend_kind k, bool clip) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    float w0[3 * 5], xs[4 * 3];
    rng_state = 3;
    fill(w0, 15, 1.0), fill(xs, 12, 1.0);
    int64_t sh[2] = { 3, 5 };
    dpar_array *w = arr(m, 2, sh, NULL, w0);
    float loss[2][3];
    dpar_status bad[2];
    for (int r = 0; r < 2; r++) {
        setenv("DPAR_GRAPH_RECORD", r ? "1" : "0", 1);
        T_OK(dpar_array_put(w, w0));
        dpar_value x, y, l;
        dpar_graph *g = label_graph(m, w, &x, &y, &l, clip);
        int32_t good[4] = { 0, 1, 2, 4 }, wrong[4] = { 0, 9, 2, 4 };
        T_OK(dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, good, NULL } }, 2, &loss[r][0]));
        bad[r] = dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, wrong, NULL } }, 2, &loss[r][1]);
        char want[320];
        snprintf(want, sizeof want,
                 "device 0: dpar_graph_run: node %d (softmax_xent): dpar_softmax_xent: labels[1] = 9 is outside 0..4 "
                 "(first bad position); fix the data or mark padding with dpar_xent_desc.ignore_label",
                 l.id);
        if (bad[r] != DPAR_ERR_INVALID_ARGUMENT || strcmp(dpar_last_error(), want))
            fail_msg("%s, recorded %d, clip %d: got %s: %s\nwant %s", dpar_backend_name(k), r, clip,
                     dpar_status_string(bad[r]), dpar_last_error(), want);
        T_OK(dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, good, NULL } }, 2, &loss[r][2]));
        if (r && !clip && k != DPAR_BACKEND_CPU) { /* logged losses, each left on the device (the CPU's run, and
                                                      a reduction of several devices' gradients, report at once):
                                                      dpar_graph_losses reports the label */
            float ring[3];
            dpar_graph_feed ok[2] = { { x, xs, NULL }, { y, good, NULL } },
                            f[2] = { { x, xs, NULL }, { y, wrong, NULL } };
            T_OK(dpar_graph_log_losses(g, 4));
            for (int i = 0; i < 3; i++) T_OK(dpar_graph_run(g, i == 1 ? f : ok, 2, NULL));
            T_ERR(dpar_graph_losses(g, ring, 3), DPAR_ERR_INVALID_ARGUMENT, want);
            T_OK(dpar_graph_losses(g, ring, 3));
            assert_true(isfinite(ring[0]) && isnan(ring[1]) && isfinite(ring[2]));
        }
        int seg = 0;
        T_OK(dpar_graph_recorded(g, &seg, NULL));
        assert_int_equal(seg > 0, r && k != DPAR_BACKEND_CPU);
        T_OK(dpar_graph_destroy(g));
    }
    if (!clip) { /* (a clipped step may apply on Vulkan and CUDA before the error comes back) */
        want_same(&loss[0][0], &loss[1][0], sizeof(float), "the loss", 0);
        want_same(&loss[0][2], &loss[1][2], sizeof(float), "the loss", 2);
    }
    dpar_array_destroy(w);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}
/* Data parallel on 2 devices, the bad label on device 1 (its row 1): the loss read waits for device 0, and the
   run still reports device 1's check, read at once or left on the devices and read by dpar_graph_loss, or by
   dpar_graph_get of a feed's shard or of the param (an array: the devices' checks are read before it). Clipped,
   device 0's norm is NaN (the reduced gradients): the run reports device 1's label, not device 0's norm (which
   it did about one run in two, whichever device failed first). */
static void bad_label_dp(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    float w0[3 * 5], xs[8 * 3], loss;
    rng_state = 5;
    fill(w0, 15, 1.0), fill(xs, 24, 1.0);
    int64_t sh[2] = { 3, 5 };
    dpar_array *w = arr(m, 2, sh, NULL, w0);
    for (int r = 0; r < 16; r++) { /* recorded or not; the loss read by the run, dpar_graph_loss, dpar_graph_get;
                                      clipped SGD or none (r & 8) */
        setenv("DPAR_GRAPH_RECORD", r & 1 ? "1" : "0", 1);
        dpar_value x, y, l;
        dpar_graph *g = label_graph(m, w, &x, &y, &l, r & 8);
        int32_t good[8] = { 0, 1, 2, 4, 3, 2, 1, 0 }, wrong[8] = { 0, 1, 2, 4, 3, 9, 1, 0 };
        T_OK(dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, good, NULL } }, 2, &loss));
        dpar_graph_feed f[2] = { { x, xs, NULL }, { y, wrong, NULL } };
        dpar_status s = r & 6 ? dpar_graph_run(g, f, 2, NULL) : dpar_graph_run(g, f, 2, &loss);
        float got[24];
        if (!s && (r & 6) == 2) s = dpar_graph_loss(g, &loss);
        if (!s && (r & 6) == 4) s = dpar_graph_get(g, x, got);
        if (!s && (r & 6) == 6) s = dpar_graph_get(g, label_w, got);
        char want[320];
        snprintf(want, sizeof want,
                 "device 1: dpar_graph_run: node %d (softmax_xent): dpar_softmax_xent: labels[1] = 9 is outside 0..4 "
                 "(first bad position); fix the data or mark padding with dpar_xent_desc.ignore_label",
                 l.id);
        if (s != DPAR_ERR_INVALID_ARGUMENT || strcmp(dpar_last_error(), want))
            fail_msg("%s, 2 devices, case %d: got %s: %s\nwant %s", dpar_backend_name(k), r, dpar_status_string(s),
                     dpar_last_error(), want);
        T_OK(dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, good, NULL } }, 2, &loss));
        T_OK(dpar_graph_destroy(g));
    }
    dpar_array_destroy(w);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}
static void bad_label(dpar_backend_kind k) {
    bad_label_run(k, false);
    bad_label_run(k, true);
    bad_label_dp(k);
}

/* ---- a step with a bad label changes no param and no optimizer state, on every device ---- */
#define KEEP_DEVS 4
/* label_graph with an optimizer: opt bit0 AdamW (else SGD with momentum), bit1 clipped by the global norm, bit2
   its state sharded by ZeRO-1 over "data". tp: a 2x2 "data" x "model" mesh, w [3,4] split over "model" by
   columns (Megatron), the logits all-gathered over "model" */
static dpar_graph *keep_graph(dpar_mesh *m, dpar_array *w, int opt, bool tp, dpar_value *x, dpar_value *y) {
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    int n = tp ? 2 : dpar_mesh_size(m);
    const char *split = n > 1 ? "data" : NULL;
    dpar_array_desc xd = { DPAR_F32, 2, { 4 * n, 3 }, { split } }, yd = { DPAR_I32, 1, { 4 * n }, { split } };
    *x = dpar_g_feed(g, "x", &xd), *y = dpar_g_feed(g, "y", &yd);
    dpar_value p = dpar_g_param(g, "w", w), gr;
    dpar_value z = dpar_g_matmul(g, *x, p, false, false);
    dpar_value l = dpar_g_softmax_xent(g, tp ? dpar_g_all_gather(g, z, "model", 1, true) : z, *y);
    T_OK(dpar_graph_value_and_grad(g, l, &p, 1, &gr));
    if (opt & 4) T_OK(dpar_graph_zero1(g, "data"));
    float clip = opt & 2 ? 1.0f : 0.0f;
    dpar_adamw_desc ad = { .learning_rate = 0.05f, .weight_decay = 0.01f, .clip_norm = clip };
    dpar_sgd_desc sd = { .learning_rate = 0.1f, .momentum = 0.9f, .clip_norm = clip };
    T_OK(opt & 1 ? dpar_graph_adamw(g, &ad, &p, &gr, 1) : dpar_graph_sgd(g, &sd, &p, &gr, 1));
    T_OK(dpar_graph_compile(g, NULL));
    return g;
}
/* the graph's training state: w [3,5], then its momentum or AdamW's m and v (ZeRO-1: [16], padded), 16 floats
   apart */
static void keep_state(dpar_graph *g, float out[3 * 16]) {
    int c = 0;
    memset(out, 0, 3 * 16 * sizeof *out);
    T_OK(dpar_graph_state_count(g, &c));
    for (int i = 0; i < c && i < 3; i++) {
        const char *name = NULL;
        dpar_array *a = NULL;
        T_OK(dpar_graph_state(g, i, &name, &a, NULL));
        T_OK(dpar_array_get(a, out + 16 * i));
    }
}
/* Label 9 at row 1 of the last of n devices: the failing step (loss read by the run; left on the devices and
   read by dpar_graph_loss; or a good step queued behind it before that read) leaves w and the optimizer state
   bit for bit as they were and the step count as it was, SGD with momentum and AdamW, clipped or not, ZeRO-1 or
   not (several devices), recorded or not; the next good step then matches a graph that never saw the bad one. */
static void bad_step_keeps(dpar_backend_kind k, int n, bool tp) {
    dpar_runtime *rt = t_runtime_or_skip(k, n);
    int shape[2] = { 2, 2 }, nd = tp ? 2 : n, classes = tp ? 4 : 5; /* nd: devices along "data" */
    const char *names[2] = { "data", "model" }, *wspec[2] = { NULL, "model" };
    dpar_mesh *m = tp ? t_mesh(rt, 2, shape, names) : t_mesh1(rt, n, "data");
    float w0[15], xs[4 * KEEP_DEVS * 3], loss;
    rng_state = 11;
    fill(w0, 15, 1.0), fill(xs, 12 * nd, 1.0);
    int64_t sh[2] = { 3, classes };
    int32_t good[4 * KEEP_DEVS], wrong[4 * KEEP_DEVS];
    for (int i = 0; i < 4 * nd; i++) good[i] = wrong[i] = i % classes;
    wrong[4 * (nd - 1) + 1] = 9;   /* tp: on devices 2 and 3 */
    for (int c = 0; c < 48; c++) { /* c & 7: keep_graph's opt; c >> 3 & 1: recorded; c >> 4: how the loss is read */
        int opt = c & 7, mode = c >> 4;
        if ((opt & 4) && (n == 1 || tp)) continue;
        /* every case on the CPU; on Vulkan and CUDA, where a case compiles and records two graphs (about 1.2 s on
           the CUDA mock, minutes under TSan for all), the quarter in which each optimizer, recording and read
           still occurs */
        if (k != DPAR_BACKEND_CPU && (opt + 3 * (c >> 3 & 1) + mode) % 4) continue;
        setenv("DPAR_GRAPH_RECORD", c >> 3 & 1 ? "1" : "0", 1);
        dpar_array *w[2];
        dpar_graph *g[2];
        dpar_value x[2], y[2];
        for (int j = 0; j < 2; j++)
            w[j] = arr(m, 2, sh, tp ? wspec : NULL, w0), g[j] = keep_graph(m, w[j], opt, tp, &x[j], &y[j]);
        float before[48], after[48], ref[48];
        for (int j = 0; j < 2; j++)
            T_OK(dpar_graph_run(g[j], (dpar_graph_feed[]){ { x[j], xs, NULL }, { y[j], good, NULL } }, 2, &loss));
        keep_state(g[0], before);
        dpar_graph_feed ok[2] = { { x[0], xs, NULL }, { y[0], good, NULL } },
                        bad[2] = { { x[0], xs, NULL }, { y[0], wrong, NULL } };
        dpar_status s = dpar_graph_run(g[0], bad, 2, mode ? NULL : &loss);
        if (!s && mode == 2) s = dpar_graph_run(g[0], ok, 2, NULL);
        if (!s) s = dpar_graph_loss(g[0], &loss);
        char dev[32], text[64];
        snprintf(dev, sizeof dev, "device %d: ", tp && !strncmp(dpar_last_error(), "device 2: ", 10) ? 2 : n - 1);
        snprintf(text, sizeof text, "labels[1] = 9 is outside 0..%d", classes - 1);
        if (s != DPAR_ERR_INVALID_ARGUMENT || strncmp(dpar_last_error(), dev, strlen(dev)) ||
            !strstr(dpar_last_error(), text))
            fail_msg("%s, %d devices, case %d: got %s: %s", dpar_backend_name(k), n, c, dpar_status_string(s),
                     dpar_last_error());
        keep_state(g[0], after);
        if (memcmp(before, after, sizeof before) || dpar_graph_step(g[0]) != 1)
            fail_msg("%s, %d devices, case %d: the failed step changed the state (w[0] %.9g -> %.9g, state[0] "
                     "%.9g -> %.9g) or the step count (%lld; want 1)",
                     dpar_backend_name(k), n, c, (double)before[0], (double)after[0], (double)before[15],
                     (double)after[15], (long long)dpar_graph_step(g[0]));
        for (int j = 0; j < 2; j++)
            T_OK(dpar_graph_run(g[j], (dpar_graph_feed[]){ { x[j], xs, NULL }, { y[j], good, NULL } }, 2, &loss));
        keep_state(g[0], after), keep_state(g[1], ref);
        if (memcmp(ref, after, sizeof ref))
            fail_msg("%s, %d devices, case %d: the step after the failed one differs from a run without it",
                     dpar_backend_name(k), n, c);
        for (int j = 0; j < 2; j++) {
            T_OK(dpar_graph_destroy(g[j]));
            dpar_array_destroy(w[j]);
        }
    }
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
    printf("%s, %d devices%s: a bad label's step left the params and optimizer state as they were\n",
           dpar_backend_name(k), n, tp ? " (2x2, w split over \"model\")" : "");
}
/* ---- the skipped-step count reaches its own graph, whoever reads the error first ---- */
/* One device, classes 5: runs g on the good (or the bad: label 9) batch; the loss not read */
static dpar_status count_run(dpar_graph *g, dpar_value x, dpar_value y, const float *xs, const int32_t *lab) {
    return dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, lab, NULL } }, 2, NULL);
}
/* The bad batch's step, its loss not read: the CPU fails it at the label, Vulkan and CUDA leave the error on the
   device (the run itself returns DPAR_OK) */
static void count_bad_run(dpar_backend_kind k, dpar_graph *g, dpar_value x, dpar_value y, const float *xs,
                          const int32_t *lab) {
    dpar_status s = count_run(g, x, y, xs, lab);
    if (s != (k == DPAR_BACKEND_CPU ? DPAR_ERR_INVALID_ARGUMENT : DPAR_OK))
        fail_msg("%s: the bad step's run returned %s: %s", dpar_backend_name(k), dpar_status_string(s),
                 dpar_last_error());
}
/* the state of a and b bit for bit the same and their step counts `steps` */
static void count_same(dpar_backend_kind k, const char *what, dpar_graph *a, dpar_graph *b, int64_t steps) {
    float sa[48], sb[48];
    keep_state(a, sa), keep_state(b, sb);
    if (memcmp(sa, sb, sizeof sa) || dpar_graph_step(a) != steps || dpar_graph_step(b) != steps)
        fail_msg("%s, %s: w[0] %.9g, want %.9g (step counts %lld and %lld; want %lld)", dpar_backend_name(k), what,
                 (double)sa[0], (double)sb[0], (long long)dpar_graph_step(a), (long long)dpar_graph_step(b),
                 (long long)steps);
}
/* AdamW (and SGD with momentum, recorded), one device, the bad step's error read first by a plain read (a param's
   dpar_array_get, dpar_runtime_device_sync), by the graph's destroy, or by another graph's read: each graph's step
   count is the steps that ran, its next good step is bit for bit a graph's that never saw the bad one, its logged
   losses hold no skipped step's, and no other graph reports the error or loses a step for it. */
static void count_reads(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    bool dev = k != DPAR_BACKEND_CPU;
    float w0[15], xs[12], lossv[4];
    rng_state = 11;
    fill(w0, 15, 1.0), fill(xs, 12, 1.0);
    int64_t sh[2] = { 3, 5 };
    int32_t good[4] = { 0, 1, 2, 3 }, wrong[4] = { 0, 9, 2, 3 };
    setenv("DPAR_GRAPH_RECORD", "1", 1);
    dpar_array *w[4];
    dpar_graph *g[4];
    dpar_value x[4], y[4];
    /* a plain read takes the error: g[0] goes bad, g[1] never does */
    for (int how = 0; how < 2; how++) {
        for (int j = 0; j < 2; j++) w[j] = arr(m, 2, sh, NULL, w0), g[j] = keep_graph(m, w[j], 1, false, &x[j], &y[j]);
        T_OK(dpar_graph_log_losses(g[0], 4));
        for (int j = 0; j < 2; j++) T_OK(count_run(g[j], x[j], y[j], xs, good));
        count_bad_run(k, g[0], x[0], y[0], xs, wrong);
        float h[15];
        dpar_status s = how ? dpar_runtime_device_sync(rt, 0) : dpar_array_get(w[0], h);
        if (s != (dev ? DPAR_ERR_INVALID_ARGUMENT : DPAR_OK) || (dev && !strstr(dpar_last_error(), "labels[1] = 9")))
            fail_msg("%s: the plain read (%d) returned %s: %s", dpar_backend_name(k), how, dpar_status_string(s),
                     dpar_last_error());
        if (dpar_graph_step(g[0]) != 1)
            fail_msg("%s: after a plain read (%d) took the error the step count is %lld; want 1", dpar_backend_name(k),
                     how, (long long)dpar_graph_step(g[0]));
        s = dpar_graph_losses(g[0], lossv, 2); /* one step ran: one loss logged */
        if (s != DPAR_ERR_INVALID_ARGUMENT)
            fail_msg("%s: dpar_graph_losses of 2 after a plain read (%d) returned %s (loss[1] %g); want 1 logged",
                     dpar_backend_name(k), how, dpar_status_string(s), (double)lossv[1]);
        T_OK(dpar_graph_losses(g[0], lossv, 1));
        for (int j = 0; j < 2; j++) T_OK(count_run(g[j], x[j], y[j], xs, good));
        count_same(k, how ? "after a device sync took the error" : "after an array read took the error", g[0], g[1], 2);
        T_OK(dpar_graph_losses(g[0], lossv, 2));
        if (!isfinite(lossv[0]) || !isfinite(lossv[1]))
            fail_msg("%s: logged losses %g, %g", dpar_backend_name(k), (double)lossv[0], (double)lossv[1]);
        for (int j = 0; j < 2; j++) {
            T_OK(dpar_graph_destroy(g[j]));
            dpar_array_destroy(w[j]);
        }
    }
    /* g[0] goes bad and is destroyed with its error pending; g[2] then runs beside g[1] as if nothing happened */
    for (int j = 0; j < 3; j++) w[j] = arr(m, 2, sh, NULL, w0), g[j] = keep_graph(m, w[j], 1, false, &x[j], &y[j]);
    T_OK(count_run(g[0], x[0], y[0], xs, good));
    count_bad_run(k, g[0], x[0], y[0], xs, wrong);
    dpar_status s = dpar_graph_destroy(g[0]);
    if (s != (dev ? DPAR_ERR_INVALID_ARGUMENT : DPAR_OK) ||
        (dev && (!strstr(dpar_last_error(), "labels[1] = 9") || !strstr(dpar_last_error(), "dpar_graph_destroy"))))
        fail_msg("%s: destroying the bad graph returned %s: %s", dpar_backend_name(k), dpar_status_string(s),
                 dpar_last_error());
    for (int r = 0; r < 2; r++) {
        float l2 = 0.0f;
        T_OK(dpar_graph_run(g[2], (dpar_graph_feed[]){ { x[2], xs, NULL }, { y[2], good, NULL } }, 2, &l2));
        T_OK(count_run(g[1], x[1], y[1], xs, good));
    }
    count_same(k, "a graph made after a bad one was destroyed", g[2], g[1], 2);
    for (int j = 1; j < 3; j++) {
        T_OK(dpar_graph_destroy(g[j]));
        dpar_array_destroy(w[j]);
    }
    /* two graphs on the device, AdamW g[0] and recorded SGD g[1]: g[0] goes bad, g[1]'s step queued behind it
       (skipped on Vulkan and CUDA, which report g[0]'s error at g[1]'s loss read, not naming g[1]'s nodes); g[2]
       and g[3] the same graphs without the bad step */
    for (int j = 0; j < 4; j++)
        w[j] = arr(m, 2, sh, NULL, w0), g[j] = keep_graph(m, w[j], j % 2 ? 0 : 1, false, &x[j], &y[j]);
    for (int j = 0; j < 4; j++) T_OK(count_run(g[j], x[j], y[j], xs, good));
    count_bad_run(k, g[0], x[0], y[0], xs, wrong);
    T_OK(count_run(g[1], x[1], y[1], xs, good));
    float l1 = 0.0f;
    s = dpar_graph_loss(g[1], &l1);
    if (s != (dev ? DPAR_ERR_INVALID_ARGUMENT : DPAR_OK) || (dev && strstr(dpar_last_error(), "dpar_graph_run")))
        fail_msg("%s: the other graph's loss read returned %s: %s", dpar_backend_name(k), dpar_status_string(s),
                 dpar_last_error());
    if (dpar_graph_step(g[0]) != 1 || dpar_graph_step(g[1]) != (dev ? 1 : 2))
        fail_msg("%s: step counts %lld and %lld; want 1 and %d", dpar_backend_name(k), (long long)dpar_graph_step(g[0]),
                 (long long)dpar_graph_step(g[1]), dev ? 1 : 2);
    for (int j = 0; j < 4; j++) T_OK(count_run(g[j], x[j], y[j], xs, good));
    if (!dev) T_OK(count_run(g[3], x[3], y[3], xs, good)); /* g[1]'s second step ran on the CPU */
    count_same(k, "the bad graph, beside another", g[0], g[2], 2);
    count_same(k, "the graph beside the bad one", g[1], g[3], dev ? 2 : 3);
    for (int j = 0; j < 4; j++) {
        T_OK(dpar_graph_destroy(g[j]));
        dpar_array_destroy(w[j]);
    }
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
    printf("%s: the skipped steps reach their own graph, whoever reads the error first\n", dpar_backend_name(k));
}
static void bad_steps_keep(dpar_backend_kind k) {
    for (int n = 1; n <= KEEP_DEVS; n *= 2) bad_step_keeps(k, n, false);
    bad_step_keeps(k, 4, true);
}

static void test_megatron(void **st) {
    (void)st;
    megatron(DPAR_BACKEND_VULKAN);
}
static void test_megatron_cuda(void **st) {
    (void)st;
    megatron(DPAR_BACKEND_CUDA);
}
static void test_sgd_recorded(void **st) {
    (void)st;
    sgd_recorded(DPAR_BACKEND_VULKAN);
}
static void test_sgd_recorded_cuda(void **st) {
    (void)st;
    sgd_recorded(DPAR_BACKEND_CUDA);
}
static void test_data_parallel(void **st) {
    (void)st;
    data_parallel(DPAR_BACKEND_VULKAN);
}
static void test_data_parallel_cuda(void **st) {
    (void)st;
    data_parallel(DPAR_BACKEND_CUDA);
}
static void test_bad_label(void **st) {
    (void)st;
    bad_label(DPAR_BACKEND_VULKAN);
}
static void test_bad_label_cuda(void **st) {
    (void)st;
    bad_label(DPAR_BACKEND_CUDA);
}
static void test_bad_label_cpu(void **st) {
    (void)st;
    bad_label(DPAR_BACKEND_CPU);
}
static void test_bad_step_keeps(void **st) {
    (void)st;
    bad_steps_keep(DPAR_BACKEND_VULKAN);
}
static void test_bad_step_keeps_cuda(void **st) {
    (void)st;
    bad_steps_keep(DPAR_BACKEND_CUDA);
}
static void test_bad_step_keeps_cpu(void **st) {
    (void)st;
    bad_steps_keep(DPAR_BACKEND_CPU);
}
static void test_count_reads(void **st) {
    (void)st;
    count_reads(DPAR_BACKEND_VULKAN);
}
static void test_count_reads_cuda(void **st) {
    (void)st;
    count_reads(DPAR_BACKEND_CUDA);
}
static void test_count_reads_cpu(void **st) {
    (void)st;
    count_reads(DPAR_BACKEND_CPU);
}

/* ---- a 1-device runtime runs fn on the caller's thread (DPAR_CALLER_THREAD) ---- */
static __thread int probe; /* its address tells the threads apart */
static dpar_status where_fn(dpar_ctx *ctx, void *user) {
    (void)ctx;
    *(int **)user = &probe;
    return DPAR_OK;
}
static dpar_status fail_fn(dpar_ctx *ctx, void *user) {
    (void)ctx, (void)user;
    return dpar_array_put(NULL, NULL); /* an error inside fn: reported by the dispatch */
}
/* The recorded CNN on one device with DPAR_CALLER_THREAD=0 (fn on the device's worker) and 1 (on the
   calling thread, the default): every loss and parameter bit for bit the same; a dispatch's fn runs on
   the caller's thread exactly when it is 1 (the CPU and Vulkan backends), and its error comes back. */
static void caller_thread(dpar_backend_kind k) {
    float loss[2][STEPS];
    static float w[2][NP][CF * NCL];
    for (int r = 0; r < 2; r++) {
        setenv("DPAR_CALLER_THREAD", r ? "1" : "0", 1);
        dpar_runtime *rt = t_runtime_or_skip(k, 1);
        dpar_mesh *m = t_mesh1(rt, 1, "data");
        int *seen = NULL;
        T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = where_fn, .user = &seen }));
        if ((seen == &probe) != (r == 1))
            fail_msg("DPAR_CALLER_THREAD=%d: fn ran on the %s thread", r, seen == &probe ? "caller's" : "worker's");
        T_ERR(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = fail_fn }), DPAR_ERR_INVALID_ARGUMENT, "device 0");
        static float init[NP][CF * NCL];
        float *ip[NP];
        rng_state = 11;
        for (int i = 0; i < NP; i++) fill(init[i], CF * NCL, i == 2 ? 0.0 : 0.5), ip[i] = init[i];
        for (int64_t c = 0; c < CF; c++) init[2][c] = 1.0f; /* layer norm scale */
        cnn t;
        cnn_build(&t, m, 1, ip);
        static float xs[CB * CH * CH * CC];
        int32_t ys[CB];
        for (int s = 0; s < STEPS; s++) {
            fill(xs, CB * CH * CH * CC, 1.0);
            for (int i = 0; i < CB; i++) ys[i] = (int32_t)((i * 3 + s) % NCL);
            step(t.g, true, t.x, xs, t.y, ys, &loss[r][s]);
        }
        for (int i = 0; i < NP; i++) T_OK(dpar_array_get(t.w[i], w[r][i]));
        T_OK(dpar_graph_destroy(t.g));
        for (int i = 0; i < NP; i++) dpar_array_destroy(t.w[i]);
        T_OK(dpar_mesh_destroy(m));
        T_OK(dpar_runtime_destroy(rt));
    }
    unsetenv("DPAR_CALLER_THREAD");
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&loss[0][s], &loss[1][s], sizeof(float)))
            fail_msg("the loss of step %d differs between the worker's and the caller's thread", s);
    if (memcmp(w[0], w[1], sizeof w[0]))
        fail_msg("%s", "the parameters differ between the worker's and the caller's thread");
    printf("CNN on 1 %s device: fn on the caller's thread, bit for bit the worker's over %d steps\n",
           k == DPAR_BACKEND_CPU ? "CPU" : "Vulkan", STEPS);
}
static void test_caller_thread(void **st) {
    (void)st;
    caller_thread(DPAR_BACKEND_VULKAN);
}
static void test_caller_thread_cpu(void **st) {
    (void)st;
    caller_thread(DPAR_BACKEND_CPU);
}

/* ---- the CPU backend records nothing; bad input ---- */
static void test_cpu_and_bad_input(void **st) {
    (void)st;
    setenv("DPAR_GRAPH_RECORD", "1", 1);
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    float w0[15], xs[24];
    fill(w0, 15, 1.0), fill(xs, 24, 1.0);
    int64_t sh[2] = { 3, 5 };
    dpar_array *w = arr(m, 2, sh, NULL, w0);
    dpar_value x, y, l;
    dpar_graph *g = label_graph(m, w, &x, &y, &l, false);
    int32_t good[8] = { 0, 1, 2, 4, 4, 2, 1, 0 };
    float loss;
    T_OK(dpar_graph_run(g, (dpar_graph_feed[]){ { x, xs, NULL }, { y, good, NULL } }, 2, &loss));
    int seg = -1, nodes = -1;
    T_OK(dpar_graph_recorded(g, &seg, &nodes));
    assert_int_equal(seg, 0);
    assert_int_equal(nodes, 0);
    T_OK(dpar_graph_recorded(g, NULL, NULL));
    T_ERR(dpar_graph_recorded(NULL, &seg, &nodes), DPAR_ERR_INVALID_ARGUMENT, "g is NULL");
    assert_int_equal(seg, 0);
    T_OK(dpar_graph_destroy(g));
    dpar_array_destroy(w);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cnn_1),
        cmocka_unit_test(test_cnn_2),
        cmocka_unit_test(test_cnn_2_async),
        cmocka_unit_test(test_megatron),
        cmocka_unit_test(test_sgd_recorded),
        cmocka_unit_test(test_data_parallel),
        cmocka_unit_test(test_bad_label),
        cmocka_unit_test(test_xent_wide),
        cmocka_unit_test(test_bad_step_keeps),
        cmocka_unit_test(test_count_reads),
        cmocka_unit_test(test_pipelined),
        cmocka_unit_test(test_caller_thread),
        cmocka_unit_test(test_caller_thread_cpu),
        cmocka_unit_test(test_cnn_1_cuda),
        cmocka_unit_test(test_cnn_2_cuda),
        cmocka_unit_test(test_cnn_2_async_cuda),
        cmocka_unit_test(test_megatron_cuda),
        cmocka_unit_test(test_sgd_recorded_cuda),
        cmocka_unit_test(test_data_parallel_cuda),
        cmocka_unit_test(test_bad_label_cuda),
        cmocka_unit_test(test_xent_wide_cuda),
        cmocka_unit_test(test_bad_label_cpu),
        cmocka_unit_test(test_bad_step_keeps_cuda),
        cmocka_unit_test(test_bad_step_keeps_cpu),
        cmocka_unit_test(test_count_reads_cuda),
        cmocka_unit_test(test_count_reads_cpu),
        cmocka_unit_test(test_pipelined_cuda),
        cmocka_unit_test(test_cpu_and_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
