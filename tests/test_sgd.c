/* SGD: the fused update against a reference (plain, momentum, Nesterov,
   weight decay, clip scale), clipping by global norm (also over sharded
   gradients with norm_axes), rejected hyper-parameters that leave params
   untouched, replicas that stay bitwise identical on 4 devices, and the
   clip's scratch kept on each device (CPU and Vulkan). */
#include "testutil.h"

T_CPU_FIXTURE(4)

static dpar_buffer *mk1(int dev, int64_t n, const float *data) {
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(RT, dev, DPAR_F32, 1, &n, &b));
    if (data) T_OK(dpar_buffer_write(b, 0, data, (size_t)n * 4));
    return b;
}
static void rd(const dpar_buffer *b, float *out) {
    T_OK(dpar_buffer_read(b, 0, out, dpar_buffer_nbytes(b)));
}

/* reference in double: PyTorch SGD with dampening 0 */
static void ref_step(int n, double *p, double *v, const double *grad, double lr, double mu, int nesterov, double wd,
                     double cs) {
    for (int i = 0; i < n; i++) {
        double g = grad[i] * cs + wd * p[i], u = g;
        if (mu != 0) {
            v[i] = mu * v[i] + g;
            u = nesterov ? g + mu * v[i] : v[i];
        }
        p[i] -= lr * u;
    }
}

typedef struct hp {
    float lr, mu, wd, cs;
    int nesterov;
} hp;

static void run_update(hp h, int exact) {
    enum { N = 16, STEPS = 4 };
    float p0[N], g0[N];
    double p[N], v[N], gd[N];
    for (int i = 0; i < N; i++) {
        p0[i] = (float)((i % 7) - 3) * 0.5f;
        p[i] = p0[i];
        v[i] = 0;
    }
    dpar_buffer *bp = mk1(0, N, p0), *bg = mk1(0, N, NULL), *bm = h.mu != 0 ? mk1(0, N, NULL) : NULL;
    dpar_sgd_desc d = { .learning_rate = h.lr, .momentum = h.mu, .nesterov = h.nesterov, .weight_decay = h.wd };
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < N; i++) {
            g0[i] = (float)(((i * 5 + s * 3) % 9) - 4) * 0.25f;
            gd[i] = g0[i];
        }
        T_OK(dpar_buffer_write(bg, 0, g0, sizeof g0));
        T_OK(dpar_sgd_update(&d, bp, bg, bm, h.cs));
        ref_step(N, p, v, gd, h.lr, h.mu, h.nesterov, h.wd, h.cs);
        float got[N], gm[N];
        rd(bp, got);
        if (bm) rd(bm, gm);
        for (int i = 0; i < N; i++) {
            double tol = exact ? 0.0 : 1e-6 * (fabs(p[i]) + 1e-3);
            if (fabs((double)got[i] - p[i]) > tol)
                fail_msg("sgd lr %g mu %g nesterov %d wd %g clip %g, step %d, param %d: %.9g, want %.9g", h.lr, h.mu,
                         h.nesterov, h.wd, h.cs, s, i, got[i], p[i]);
            if (bm && fabs((double)gm[i] - v[i]) > (exact ? 0.0 : 1e-6 * (fabs(v[i]) + 1e-3)))
                fail_msg("sgd momentum buffer step %d [%d]: %.9g, want %.9g", s, i, gm[i], v[i]);
        }
    }
    dpar_buffer_destroy(bp);
    dpar_buffer_destroy(bg);
    dpar_buffer_destroy(bm);
}
static void test_update_formulas(void **st) {
    (void)st;
    /* dyadic hyper-parameters and data: every intermediate is exact, so equality is exact */
    const hp exact[] = {
        { 0.5f, 0, 0, 1, 0 },        /* plain */
        { 0.25f, 0.5f, 0, 1, 0 },    /* momentum */
        { 0.25f, 0.5f, 0, 1, 1 },    /* Nesterov */
        { 0.5f, 0, 0.25f, 1, 0 },    /* weight decay */
        { 0.5f, 0.5f, 0.25f, 0, 0 }, /* clip scale 0: only decay moves params */
    };
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) run_update(exact[i], 1);
    /* usual values: the reference is double, so a relative tolerance */
    const hp usual[] = { { 0.125f, 0.75f, 0.5f, 0.5f, 1 } /* all of it, with a clip scale: bits outgrow f32 */,
                         { 0.01f, 0.9f, 0, 1, 0 },
                         { 0.01f, 0.9f, 1e-4f, 0.37f, 1 },
                         { 0.1f, 0, 5e-4f, 1, 0 } };
    for (size_t i = 0; i < sizeof usual / sizeof usual[0]; i++) run_update(usual[i], 0);
}

/* invalid hyper-parameters are rejected before anything changes */
static void test_invalid_rejected(void **st) {
    (void)st;
    float p0[4] = { 1, 2, 3, 4 }, g0[4] = { 1, 1, 1, 1 }, m0[4] = { 0.5f, 0.5f, 0.5f, 0.5f };
    dpar_buffer *p = mk1(0, 4, p0), *g = mk1(0, 4, g0), *m = mk1(0, 4, m0), *g5 = mk1(0, 5, NULL),
                *pother = mk1(1, 4, NULL);
    dpar_buffer *gi = NULL;
    int64_t four = 4;
    T_OK(dpar_buffer_create(RT, 0, DPAR_I32, 1, &four, &gi));
    dpar_sgd_desc ok = { .learning_rate = 0.1f, .momentum = 0.9f };
    struct {
        dpar_sgd_desc d;
        const char *needle;
    } bad[12];
    int nb = 0;
#define BAD(field, value, text)  \
    do {                         \
        bad[nb].d = ok;          \
        bad[nb].d.field = value; \
        bad[nb].needle = text;   \
        nb++;                    \
    } while (0)
    BAD(learning_rate, -0.1f, "learning_rate");
    BAD(learning_rate, NAN, "learning_rate");
    BAD(learning_rate, INFINITY, "learning_rate");
    BAD(momentum, 1.0f, "momentum");
    BAD(momentum, -0.5f, "momentum");
    BAD(momentum, NAN, "momentum");
    BAD(weight_decay, -1e-4f, "weight_decay");
    BAD(weight_decay, NAN, "weight_decay");
    BAD(clip_norm, -1.0f, "clip_norm");
    BAD(clip_norm, NAN, "clip_norm");
    bad[nb].d = ok;
    bad[nb].d.momentum = 0;
    bad[nb].d.nesterov = true;
    bad[nb].needle = "nesterov";
    nb++;
#undef BAD
    for (int i = 0; i < nb; i++) {
        T_ERR(dpar_sgd_update(&bad[i].d, p, g, m, 1.0f), DPAR_ERR_INVALID_ARGUMENT, bad[i].needle);
        T_ERR(dpar_sgd_step(NULL, &bad[i].d, &p, &g, &m, 1), DPAR_ERR_INVALID_ARGUMENT, bad[i].needle);
    }
    T_ERR(dpar_sgd_update(NULL, p, g, m, 1.0f), DPAR_ERR_INVALID_ARGUMENT, "desc");
    T_ERR(dpar_sgd_update(&ok, p, g, NULL, 1.0f), DPAR_ERR_INVALID_ARGUMENT, "momentum");
    T_ERR(dpar_sgd_update(&ok, p, g, m, NAN), DPAR_ERR_INVALID_ARGUMENT, "clip_scale");
    T_ERR(dpar_sgd_update(&ok, p, g, m, -1.0f), DPAR_ERR_INVALID_ARGUMENT, "clip_scale");
    T_ERR(dpar_sgd_update(&ok, p, g5, m, 1.0f), DPAR_ERR_SHAPE, "[4]", "[5]");
    T_ERR(dpar_sgd_update(&ok, p, gi, m, 1.0f), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_sgd_update(&ok, p, g, p, 1.0f), DPAR_ERR_INVALID_ARGUMENT, "alias");
    T_ERR(dpar_sgd_update(&ok, p, p, m, 1.0f), DPAR_ERR_INVALID_ARGUMENT, "alias");
    T_ERR(dpar_sgd_update(&ok, pother, g, m, 1.0f), DPAR_ERR_INVALID_ARGUMENT, "devices");
    T_ERR(dpar_sgd_update(&ok, NULL, g, m, 1.0f), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    float pv[4], mv[4];
    rd(p, pv);
    rd(m, mv);
    assert_memory_equal(pv, p0, sizeof pv);
    assert_memory_equal(mv, m0, sizeof mv);
    /* lr 0 (a warm-up's first rate): the momentum moves, the params stay bit for bit */
    dpar_sgd_desc zero = ok;
    zero.learning_rate = 0;
    T_OK(dpar_sgd_update(&zero, p, g, m, 1.0f));
    rd(p, pv);
    rd(m, mv);
    assert_memory_equal(pv, p0, sizeof pv);
    for (int i = 0; i < 4; i++) assert_true(fabsf(mv[i] - (0.9f * m0[i] + g0[i])) < 1e-6f);
    T_OK(dpar_buffer_write(m, 0, m0, sizeof m0));
    /* momentum 0: the momentum buffer may be NULL */
    dpar_sgd_desc plain = ok;
    plain.momentum = 0;
    T_OK(dpar_sgd_update(&plain, p, g, NULL, 1.0f));
    rd(p, pv);
    for (int i = 0; i < 4; i++) assert_true(pv[i] == p0[i] - 0.1f);
}

/* clipping by global norm, inside pmap */
typedef struct cl {
    float scale[4], norm[4];
    float params[4][4];
    dpar_status st[4];
    char err[4][256];
    int variant;
    float clip;
    const char *axes;
} cl;
static dpar_status clip_fn(dpar_ctx *ctx, void *user) {
    cl *w = (cl *)user;
    int d = dpar_ctx_device(ctx);
    /* two gradient buffers per device: [3, 4] * (d+1) and [12] * (d+1) (norm 5 (d+1), 13 (d+1)) */
    float g1[2] = { 3.0f * (float)(d + 1), 4.0f * (float)(d + 1) }, g2[1] = { 12.0f * (float)(d + 1) };
    if (w->variant == 1 && d == 2) g2[0] = NAN;
    dpar_buffer *a = NULL, *b = NULL, *p1 = NULL, *p2 = NULL;
    int64_t two = 2, one = 1;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &two, &a);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &b);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &two, &p1);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &p2);
    if (!s) s = dpar_buffer_write(a, 0, g1, sizeof g1);
    if (!s) s = dpar_buffer_write(b, 0, g2, sizeof g2);
    float pinit[3] = { 1, 1, 1 };
    if (!s) s = dpar_buffer_write(p1, 0, pinit, 8);
    if (!s) s = dpar_buffer_write(p2, 0, pinit, 4);
    dpar_sgd_desc sd = { .learning_rate = 1.0f, .clip_norm = w->clip, .norm_axes = w->axes };
    dpar_buffer *gs[2] = { a, b }, *ps[2] = { p1, p2 };
    if (!s) s = dpar_sgd_clip_scale(ctx, &sd, gs, 2, &w->scale[d], &w->norm[d]);
    if (!s || w->variant == 1) {
        dpar_status s2 = dpar_sgd_step(ctx, &sd, ps, gs, NULL, 2);
        if (!s) s = s2;
    }
    w->st[d] = s;
    if (s) snprintf(w->err[d], sizeof w->err[d], "%s", dpar_last_error());
    dpar_buffer_read(p1, 0, &w->params[d][0], 8);
    dpar_buffer_read(p2, 0, &w->params[d][2], 4);
    return DPAR_OK; /* statuses are checked per device */
}
static void run_clip(dpar_mesh *m, cl *w) {
    dpar_shard_map_desc sd = { .fn = clip_fn, .user = w };
    T_OK(dpar_shard_map(m, &sd));
}
static void test_clip_global_norm(void **st) {
    (void)st;
    dpar_mesh *m = t_mesh1(RT, 4, "data");
    /* replicated view (norm_axes NULL): each device's own norm sqrt(25 + 144) (d+1) = 13 (d+1) */
    cl w;
    memset(&w, 0, sizeof w);
    w.clip = 26.0f;
    run_clip(m, &w);
    for (int d = 0; d < 4; d++) {
        assert_int_equal(w.st[d], DPAR_OK);
        assert_true(w.norm[d] == 13.0f * (float)(d + 1));
        float want = d == 0 ? 1.0f : 26.0f / (13.0f * (float)(d + 1)); /* norm 26 == clip -> clip/norm = 1 */
        assert_true(w.scale[d] == want);
        /* param = 1 - lr * scale * grad */
        assert_true(w.params[d][0] == 1.0f - (3.0f * (float)(d + 1)) * want);
        assert_true(w.params[d][1] == 1.0f - (4.0f * (float)(d + 1)) * want);
        assert_true(w.params[d][2] == 1.0f - (12.0f * (float)(d + 1)) * want);
    }
    /* sharded gradients: squared norms psum'd over 'data': 169 (1 + 4 + 9 + 16) = 5070 */
    memset(&w, 0, sizeof w);
    w.clip = 13.0f;
    w.axes = "data";
    run_clip(m, &w);
    float gn = sqrtf(5070.0f);
    for (int d = 0; d < 4; d++) {
        assert_int_equal(w.st[d], DPAR_OK);
        assert_true(fabsf(w.norm[d] - gn) <= 1e-6f * gn);
        assert_memory_equal(&w.norm[d], &w.norm[0], 4); /* the same norm on every device */
        assert_true(fabsf(w.scale[d] - 13.0f / gn) <= 1e-6f);
        assert_memory_equal(&w.scale[d], &w.scale[0], 4);
    }
    /* clip larger than the norm: scale 1 */
    memset(&w, 0, sizeof w);
    w.clip = 1000.0f;
    w.axes = "data";
    run_clip(m, &w);
    for (int d = 0; d < 4; d++) {
        assert_true(w.scale[d] == 1.0f);
        assert_true(w.params[d][0] == 1.0f - 3.0f * (float)(d + 1));
    }
    /* clipping off: scale 1 whatever the norm */
    memset(&w, 0, sizeof w);
    w.clip = 0.0f;
    run_clip(m, &w);
    for (int d = 0; d < 4; d++) assert_true(w.scale[d] == 1.0f);
    /* a NaN gradient on device 2 with a global norm: an error on every device, no parameter changed */
    memset(&w, 0, sizeof w);
    w.clip = 1.0f;
    w.axes = "data";
    w.variant = 1;
    run_clip(m, &w);
    for (int d = 0; d < 4; d++) {
        assert_int_equal(w.st[d], DPAR_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(w.err[d], "NaN"));
        assert_true(w.params[d][0] == 1.0f && w.params[d][1] == 1.0f && w.params[d][2] == 1.0f);
    }
    dpar_mesh_destroy(m);
}

/* The clip keeps its scratch on each device: the first clipped call leaves
   the norms' f32 [n] and the psum'd total's f32 [1] allocated, steady calls
   allocate nothing more, a call with more gradients grows it, one with fewer
   reuses it; the norms stay exact throughout (gradient k of device d: 4
   elements (k + 1) (d + 1), psum'd over 2 devices). */
enum { KEEP_CALLS = 6 };
static const int keep_n[KEEP_CALLS] = { 0, 2, 2, 2, 3, 1 }; /* gradients per call; 0: none yet */
typedef struct keep {
    dpar_runtime *rt;
    uint64_t mem[2][KEEP_CALLS], bufs[2][KEEP_CALLS]; /* the device's stats after each call */
    float norm[2][KEEP_CALLS];
} keep;
static dpar_status keep_fn(dpar_ctx *ctx, void *user) {
    keep *w = (keep *)user;
    int d = dpar_ctx_device(ctx);
    int64_t four = 4;
    dpar_buffer *g[3];
    dpar_status s = DPAR_OK;
    for (int k = 0; k < 3 && !s; k++) {
        float v[4] = { 0 };
        for (int i = 0; i < 4; i++) v[i] = (float)((k + 1) * (d + 1));
        s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &g[k]);
        if (!s) s = dpar_buffer_write(g[k], 0, v, sizeof v);
    }
    dpar_sgd_desc sd = { .learning_rate = 1.0f, .clip_norm = 1.0f, .norm_axes = "data" };
    for (int c = 0; c < KEEP_CALLS && !s; c++) {
        float scale;
        dpar_device_stats st;
        if (keep_n[c]) s = dpar_sgd_clip_scale(ctx, &sd, g, keep_n[c], &scale, &w->norm[d][c]);
        if (!s) s = dpar_runtime_device_stats(w->rt, d, &st);
        w->mem[d][c] = st.memory_in_use;
        w->bufs[d][c] = st.buffers;
    }
    return s;
}
static void clip_scratch_kept(dpar_runtime *rt) {
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    keep w = { .rt = rt };
    dpar_shard_map_desc sd = { .fn = keep_fn, .user = &w };
    T_OK(dpar_shard_map(m, &sd));
    static const double sq[KEEP_CALLS] = { 0, 100, 100, 100, 280, 20 }; /* 4 (1 + 4) sum_k (k + 1)^2 */
    for (int d = 0; d < 2; d++)
        for (int c = 1; c < KEEP_CALLS; c++) {
            int64_t cap = c < 4 ? 2 : 3; /* the norms' elements held */
            if (w.norm[d][c] != (float)sqrt(sq[c]))
                fail_msg("device %d call %d: norm %.9g, want %.9g", d, c, (double)w.norm[d][c], sqrt(sq[c]));
            if (w.mem[d][c] != w.mem[d][0] + (uint64_t)(4 * cap + 4) || w.bufs[d][c] != w.bufs[d][0] + 2)
                fail_msg("device %d after call %d (%d gradients): %llu bytes in %llu buffers, want %llu in %llu", d, c,
                         keep_n[c], (unsigned long long)w.mem[d][c], (unsigned long long)w.bufs[d][c],
                         (unsigned long long)(w.mem[d][0] + (uint64_t)(4 * cap + 4)),
                         (unsigned long long)w.bufs[d][0] + 2);
        }
    dpar_mesh_destroy(m);
}
static void test_clip_scratch_kept(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2); /* RT's devices hold the other tests' scratch */
    clip_scratch_kept(rt);
    T_OK(dpar_runtime_destroy(rt)); /* with the scratch */
}
static void test_clip_scratch_kept_vulkan(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime_or_skip(DPAR_BACKEND_VULKAN, 2);
    clip_scratch_kept(rt);
    T_OK(dpar_runtime_destroy(rt));
}

/* data-parallel steps on 4 devices: gradients pmean'd, SGD with everything on;
   every replica stays bitwise identical */
typedef struct rep {
    float params[4][64], moms[4][64];
    int steps;
} rep;
static dpar_status rep_fn(dpar_ctx *ctx, void *user) {
    rep *w = (rep *)user;
    int d = dpar_ctx_device(ctx);
    int64_t n1 = 40, n2 = 24;
    dpar_buffer *p1, *p2, *g1, *g2, *m1, *m2;
    dpar_status s = DPAR_OK;
    dpar_buffer **all[6] = { &p1, &p2, &g1, &g2, &m1, &m2 };
    for (int i = 0; i < 6 && !s; i++) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, (i % 2) ? &n2 : &n1, all[i]);
    if (s) return s;
    float init[40];
    for (int i = 0; i < 40; i++) init[i] = sinf((float)i) * 0.3f;
    if ((s = dpar_buffer_write(p1, 0, init, 160)) || (s = dpar_buffer_write(p2, 0, init, 96))) return s;
    dpar_sgd_desc sd = {
        .learning_rate = 0.037f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-3f, .clip_norm = 0.5f
    };
    dpar_buffer *ps[2] = { p1, p2 }, *gs[2] = { g1, g2 }, *ms[2] = { m1, m2 };
    for (int step = 0; step < w->steps; step++) {
        float g[40];
        for (int i = 0; i < 40; i++) g[i] = cosf((float)(i * 3 + d * 17 + step)) * 0.77f / (float)(d + 1);
        if ((s = dpar_buffer_write(g1, 0, g, 160)) || (s = dpar_buffer_write(g2, 0, g, 96))) return s;
        if ((s = dpar_pmean(ctx, g1, g1, "data")) || (s = dpar_pmean(ctx, g2, g2, "data"))) return s;
        if ((s = dpar_sgd_step(ctx, &sd, ps, gs, ms, 2))) return s;
    }
    if ((s = dpar_buffer_read(p1, 0, w->params[d], 160)) || (s = dpar_buffer_read(p2, 0, w->params[d] + 40, 96)))
        return s;
    if ((s = dpar_buffer_read(m1, 0, w->moms[d], 160)) || (s = dpar_buffer_read(m2, 0, w->moms[d] + 40, 96))) return s;
    for (int i = 0; i < 6; i++) dpar_buffer_destroy(*all[i]);
    return DPAR_OK;
}
static void test_replicas_identical(void **st) {
    (void)st;
    dpar_mesh *m = t_mesh1(RT, 4, "data");
    rep *a = (rep *)calloc(1, sizeof *a), *b = (rep *)calloc(1, sizeof *b);
    a->steps = b->steps = 5;
    dpar_shard_map_desc sd = { .fn = rep_fn, .user = a };
    T_OK(dpar_shard_map(m, &sd));
    sd.user = b;
    T_OK(dpar_shard_map(m, &sd));
    for (int d = 1; d < 4; d++) {
        assert_memory_equal(a->params[d], a->params[0], sizeof a->params[0]);
        assert_memory_equal(a->moms[d], a->moms[0], sizeof a->moms[0]);
    }
    assert_memory_equal(a->params, b->params, sizeof a->params); /* and run after run */
    /* the params moved */
    int moved = 0;
    for (int i = 0; i < 40; i++) moved += a->params[0][i] != sinf((float)i) * 0.3f;
    assert_true(moved > 30);
    free(a);
    free(b);
    dpar_mesh_destroy(m);
}

/* a step over several parameters either updates all of them or none: a bad
   second buffer must not leave the first one stepped (a half-updated model) */
static void test_step_all_or_nothing(void **st) {
    (void)st;
    float p0[4] = { 1, 2, 3, 4 }, g0[4] = { 1, 1, 1, 1 };
    dpar_buffer *p1 = mk1(0, 4, p0), *g1 = mk1(0, 4, g0), *m1 = mk1(0, 4, NULL);
    dpar_buffer *p2 = mk1(0, 3, p0), *g2 = mk1(0, 4, g0), *m2 = mk1(0, 3, NULL), *g2i = NULL;
    int64_t three = 3;
    T_OK(dpar_buffer_create(RT, 0, DPAR_I32, 1, &three, &g2i));
    dpar_sgd_desc d = { .learning_rate = 0.5f, .momentum = 0.5f };
    dpar_buffer *ps[2] = { p1, p2 }, *gs[2] = { g1, g2 }, *ms[2] = { m1, m2 };
    T_ERR(dpar_sgd_step(NULL, &d, ps, gs, ms, 2), DPAR_ERR_SHAPE, "[3]", "[4]");
    gs[1] = g2i;
    T_ERR(dpar_sgd_step(NULL, &d, ps, gs, ms, 2), DPAR_ERR_DTYPE, "i32");
    dpar_buffer *g2ok = mk1(0, 3, g0);
    gs[1] = g2ok;
    ms[1] = NULL;
    T_ERR(dpar_sgd_step(NULL, &d, ps, gs, ms, 2), DPAR_ERR_INVALID_ARGUMENT, "momentum");
    T_ERR(dpar_sgd_step(NULL, &d, ps, gs, NULL, 2), DPAR_ERR_INVALID_ARGUMENT, "momentum");
    float pv[4], mv[4];
    rd(p1, pv);
    rd(m1, mv);
    assert_memory_equal(pv, p0, sizeof pv);
    for (int i = 0; i < 4; i++) assert_true(mv[i] == 0.0f);
    /* and a good step moves both */
    float p2v[3];
    ms[1] = m2;
    T_OK(dpar_sgd_step(NULL, &d, ps, gs, ms, 2));
    rd(p1, pv);
    rd(p2, p2v);
    for (int i = 0; i < 4; i++) assert_true(pv[i] == p0[i] - 0.5f);
    for (int i = 0; i < 3; i++) assert_true(p2v[i] == p0[i] - 0.5f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_update_formulas),          cmocka_unit_test(test_invalid_rejected),
        cmocka_unit_test(test_step_all_or_nothing),      cmocka_unit_test(test_clip_global_norm),
        cmocka_unit_test(test_replicas_identical),       cmocka_unit_test(test_clip_scratch_kept),
        cmocka_unit_test(test_clip_scratch_kept_vulkan),
    };
    return cmocka_run_group_tests(tests, t_setup, t_teardown);
}
