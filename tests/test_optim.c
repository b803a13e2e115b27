/* Optimizers and training ops of issue 13: AdamW against the formula computed
   by hand in double (three steps), clipping and bitwise-identical replicas;
   learning-rate schedules at known steps; dynamic loss scaling skipping exactly
   the overflowing steps; cross-entropy with an ignore label and label
   smoothing (values, finite-difference gradients in double, bad labels named);
   embedding and its scatter-add gradient (repeated indices); dropout with
   Philox-4x32-10 (known-answer vectors, p = 0, p = 1, keep rate of 1e6). */
#include "testutil.h"

T_CPU_FIXTURE(4)

/* ---- AdamW ---------------------------------------------------------------- */

/* optax.adamw, in double */
static void adamw_ref(int n, double *p, double *m, double *v, const double *g, double lr, double b1, double b2,
                      double eps, double wd, double clip, int t) {
    for (int i = 0; i < n; i++) {
        double gi = g[i] * clip;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
        p[i] -= lr * (mh / (sqrt(vh) + eps) + wd * p[i]);
    }
}
static void test_adamw_three_steps(void **st) {
    (void)st;
    enum { N = 13 };
    struct {
        float lr, b1, b2, eps, wd, clip;
    } cases[] = { { 1e-3f, 0, 0, 0, 0, 1 },
                  { 0.05f, 0.8f, 0.99f, 1e-6f, 0.1f, 0.5f },
                  { 0.3f, 0.5f, 0.9f, 1e-3f, 0.01f, 1 } };
    for (int c = 0; c < 3; c++) {
        float p0[N], g0[N];
        double p[N], m[N] = { 0 }, v[N] = { 0 }, g[N];
        for (int i = 0; i < N; i++) p[i] = p0[i] = (float)((i % 5) - 2) * 0.3f;
        dpar_buffer *bp = t_buf1(RT, DPAR_F32, N, p0), *bg = t_buf1(RT, DPAR_F32, N, NULL),
                    *bm = t_buf1(RT, DPAR_F32, N, NULL), *bv = t_buf1(RT, DPAR_F32, N, NULL);
        dpar_adamw_desc d = { .learning_rate = cases[c].lr,
                              .b1 = cases[c].b1,
                              .b2 = cases[c].b2,
                              .eps = cases[c].eps,
                              .weight_decay = cases[c].wd };
        double b1 = d.b1 != 0.0f ? d.b1 : 0.9f, b2 = d.b2 != 0.0f ? d.b2 : 0.999f,
               eps = d.eps != 0.0f ? d.eps : 1e-8f; /* as f32 */
        for (int t = 1; t <= 3; t++) {
            for (int i = 0; i < N; i++) g[i] = g0[i] = (float)(((i * 7 + t * 3) % 11) - 5) * 0.125f;
            T_OK(dpar_buffer_write(bg, 0, g0, sizeof g0));
            T_OK(dpar_adamw_update(&d, bp, bg, bm, bv, t, cases[c].clip));
            adamw_ref(N, p, m, v, g, d.learning_rate, b1, b2, eps, d.weight_decay, cases[c].clip, t);
            float got[N], gm[N], gv[N];
            t_read(bp, got);
            t_read(bm, gm);
            t_read(bv, gv);
            for (int i = 0; i < N; i++) {
                if (fabs(got[i] - p[i]) > 1e-6 * (fabs(p[i]) + d.learning_rate) + 1e-9 ||
                    /* a few f32 ulps of p's terms */ fabs(gm[i] - m[i]) > 1e-6 * (fabs(m[i]) + 1e-6) ||
                    fabs(gv[i] - v[i]) > 1e-6 * (fabs(v[i]) + 1e-9))
                    fail_msg("adamw case %d step %d [%d]: p %.9g m %.9g v %.9g, want %.9g %.9g %.9g", c, t, i, got[i],
                             gm[i], gv[i], p[i], m[i], v[i]);
            }
        }
        dpar_buffer_destroy(bp);
        dpar_buffer_destroy(bg);
        dpar_buffer_destroy(bm);
        dpar_buffer_destroy(bv);
    }
}
static void test_adamw_rejects(void **st) {
    (void)st;
    float p0[4] = { 1, 2, 3, 4 };
    dpar_buffer *p = t_buf1(RT, DPAR_F32, 4, p0), *g = t_buf1(RT, DPAR_F32, 4, NULL),
                *m = t_buf1(RT, DPAR_F32, 4, NULL), *v = t_buf1(RT, DPAR_F32, 4, NULL),
                *v3 = t_buf1(RT, DPAR_F32, 3, NULL);
    int64_t four = 4;
    dpar_buffer *vi = t_buf(RT, 0, DPAR_I32, 1, &four, NULL);
    dpar_adamw_desc d = { .learning_rate = 0.1f };
    T_OK(dpar_adamw_check(&d));
    d.learning_rate = -0.1f;
    T_ERR(dpar_adamw_update(&d, p, g, m, v, 1, 1), DPAR_ERR_INVALID_ARGUMENT, "learning_rate");
    d.learning_rate = NAN;
    T_ERR(dpar_adamw_check(&d), DPAR_ERR_INVALID_ARGUMENT, "learning_rate");
    d.learning_rate = INFINITY;
    T_ERR(dpar_adamw_check(&d), DPAR_ERR_INVALID_ARGUMENT, "learning_rate");
    d.learning_rate = 0; /* allowed: a warm-up's first step */
    T_OK(dpar_adamw_check(&d));
    d.learning_rate = 0.1f;
    d.b1 = 1.0f;
    T_ERR(dpar_adamw_check(&d), DPAR_ERR_INVALID_ARGUMENT, "b1 = 1");
    d.b1 = 0;
    d.weight_decay = -1;
    T_ERR(dpar_adamw_check(&d), DPAR_ERR_INVALID_ARGUMENT, "weight_decay");
    d.weight_decay = 0;
    T_ERR(dpar_adamw_update(&d, p, g, m, v, 0, 1), DPAR_ERR_INVALID_ARGUMENT, "step = 0");
    T_ERR(dpar_adamw_update(&d, p, g, m, v, 1, NAN), DPAR_ERR_INVALID_ARGUMENT, "clip_scale");
    T_ERR(dpar_adamw_update(&d, p, g, m, v3, 1, 1), DPAR_ERR_SHAPE, "[3]");
    T_ERR(dpar_adamw_update(&d, p, g, m, vi, 1, 1), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_adamw_update(&d, p, g, m, m, 1, 1), DPAR_ERR_INVALID_ARGUMENT, "distinct");
    T_ERR(dpar_adamw_update(NULL, p, g, m, v, 1, 1), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    /* a step with one bad buffer changes nothing */
    dpar_buffer *ps[2] = { p, p }, *gs[2] = { g, g }, *ms[2] = { m, m }, *vs[2] = { v, v3 };
    T_ERR(dpar_adamw_step(NULL, &d, ps, gs, ms, vs, 2, 1), DPAR_ERR_SHAPE, "dpar_adamw_step");
    float got[4];
    t_read(p, got);
    assert_memory_equal(got, p0, sizeof p0);
    dpar_buffer *all[6] = { p, g, m, v, v3, vi };
    for (int i = 0; i < 6; i++) dpar_buffer_destroy(all[i]);
}

/* data-parallel AdamW with clipping on 4 devices: replicas bitwise identical,
   and equal to one update with the clip factor computed by hand */
typedef struct rep {
    float params[4][48];
    float expect[48];
} rep;
static dpar_status rep_fn(dpar_ctx *ctx, void *user) {
    rep *w = (rep *)user;
    int d = dpar_ctx_device(ctx);
    int64_t n1 = 30, n2 = 18;
    dpar_buffer *b[8];
    dpar_status s = DPAR_OK;
    for (int i = 0; i < 8 && !s; i++) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, (i % 2) ? &n2 : &n1, &b[i]);
    if (s) return s;
    float init[30], g[30];
    for (int i = 0; i < 30; i++) init[i] = sinf((float)i) * 0.3f;
    if ((s = dpar_buffer_write(b[0], 0, init, 120)) || (s = dpar_buffer_write(b[1], 0, init, 72))) return s;
    dpar_adamw_desc ad = { .learning_rate = 0.01f, .weight_decay = 0.1f, .clip_norm = 0.25f };
    dpar_buffer *ps[2] = { b[0], b[1] }, *gs[2] = { b[2], b[3] }, *ms[2] = { b[4], b[5] }, *vs[2] = { b[6], b[7] };
    for (int step = 1; step <= 3; step++) {
        for (int i = 0; i < 30; i++) g[i] = cosf((float)(i * 3 + d * 17 + step)) * 0.77f / (float)(d + 1);
        if ((s = dpar_buffer_write(b[2], 0, g, 120)) || (s = dpar_buffer_write(b[3], 0, g, 72))) return s;
        if ((s = dpar_pmean(ctx, b[2], b[2], "data")) || (s = dpar_pmean(ctx, b[3], b[3], "data"))) return s;
        if ((s = dpar_adamw_step(ctx, &ad, ps, gs, ms, vs, 2, step))) return s;
    }
    if ((s = dpar_buffer_read(b[0], 0, w->params[d], 120)) || (s = dpar_buffer_read(b[1], 0, w->params[d] + 30, 72)))
        return s;
    for (int i = 0; i < 8; i++) dpar_buffer_destroy(b[i]);
    return DPAR_OK;
}
static void test_adamw_replicas_clip(void **st) {
    (void)st;
    dpar_mesh *m = t_mesh1(RT, 4, "data");
    rep *a = (rep *)calloc(1, sizeof *a);
    dpar_shard_map_desc sd = { .fn = rep_fn, .user = a };
    T_OK(dpar_shard_map(m, &sd));
    for (int d = 1; d < 4; d++) assert_memory_equal(a->params[d], a->params[0], sizeof a->params[0]);
    /* the reference in double: mean gradient, global norm over both buffers, clip, AdamW */
    double p[48], mo[48] = { 0 }, v[48] = { 0 }, g[48];
    for (int i = 0; i < 48; i++) p[i] = sinf((float)(i < 30 ? i : i - 30)) * 0.3f;
    for (int t = 1; t <= 3; t++) {
        double nrm = 0;
        for (int i = 0; i < 48; i++) {
            int j = i < 30 ? i : i - 30;
            g[i] = 0;
            for (int d = 0; d < 4; d++) g[i] += (double)(cosf((float)(j * 3 + d * 17 + t)) * 0.77f / (float)(d + 1));
            g[i] /= 4;
            nrm += g[i] * g[i];
        }
        nrm = sqrt(nrm);
        adamw_ref(48, p, mo, v, g, 0.01, 0.9f, 0.999f, 1e-8f, 0.1, nrm < 0.25 ? 1 : 0.25 / nrm, t);
    }
    for (int i = 0; i < 48; i++)
        if (fabs(a->params[0][i] - p[i]) > 1e-5 * (fabs(p[i]) + 1e-2))
            fail_msg("adamw replica [%d] = %.9g, want %.9g", i, a->params[0][i], p[i]);
    free(a);
    dpar_mesh_destroy(m);
}

/* ---- learning-rate schedules ------------------------------------------------ */

static double lr_of(const dpar_lr_schedule_desc *d, int64_t step) {
    float lr = -1;
    T_OK(dpar_lr_at(d, step, &lr));
    return lr;
}
static void test_lr_schedules(void **st) {
    (void)st;
    dpar_lr_schedule_desc c = { .kind = DPAR_LR_CONSTANT, .peak_lr = 0.5f };
    assert_true(lr_of(&c, 0) == 0.5 && lr_of(&c, 1000000) == 0.5);
    /* linear warm-up from 0 to 1 over 4 steps, then cosine to 0.1 at step 14 */
    dpar_lr_schedule_desc w = {
        .kind = DPAR_LR_COSINE, .peak_lr = 1, .warmup_steps = 4, .decay_steps = 14, .end_lr = 0.1f
    };
    assert_true(lr_of(&w, 0) == 0 && lr_of(&w, 1) == 0.25 && lr_of(&w, 2) == 0.5 && lr_of(&w, 4) == 1);
    assert_true(fabs(lr_of(&w, 9) - (0.1 + 0.9 * 0.5)) < 1e-7); /* half way: cos(pi/2) */
    assert_true(fabs(lr_of(&w, 14) - 0.1) < 1e-7 && fabs(lr_of(&w, 99) - 0.1) < 1e-7);
    double prev = 2;
    for (int64_t s = 4; s <= 14; s++) { /* falls monotonically */
        double x = lr_of(&w, s);
        assert_true(x <= prev);
        prev = x;
    }
    dpar_lr_schedule_desc sd = { .kind = DPAR_LR_STEP, .peak_lr = 0.8f, .step_every = 10, .gamma = 0.5f };
    assert_true(lr_of(&sd, 0) == (double)0.8f && lr_of(&sd, 9) == (double)0.8f);
    assert_true(lr_of(&sd, 10) == (double)0.4f && lr_of(&sd, 25) == (double)0.2f);
    float lr;
    w.decay_steps = 4;
    T_ERR(dpar_lr_at(&w, 0, &lr), DPAR_ERR_INVALID_ARGUMENT, "decay_steps");
    sd.gamma = 0;
    T_ERR(dpar_lr_at(&sd, 0, &lr), DPAR_ERR_INVALID_ARGUMENT, "gamma");
    T_ERR(dpar_lr_at(&c, -1, &lr), DPAR_ERR_INVALID_ARGUMENT, "step = -1");
    c.peak_lr = 0;
    T_ERR(dpar_lr_at(&c, 0, &lr), DPAR_ERR_INVALID_ARGUMENT, "peak_lr");
}

/* ---- dynamic loss scaling --------------------------------------------------- */

/* f16 gradients of (scale * loss) overflow on steps 2, 3 and 7: exactly those
   are skipped, the scale halves on each and doubles after 2 clean steps; the
   f32 master weights never see an Inf */
static void test_loss_scaling_skips_overflow(void **st) {
    (void)st;
    enum { N = 5, STEPS = 10 };
    dpar_loss_scaler ls;
    T_OK(dpar_loss_scaler_init(&ls, &(dpar_loss_scale_desc){ .init_scale = 1024, .growth_interval = 2 }));
    int64_t n = N;
    dpar_buffer *g16 = t_buf(RT, 0, DPAR_F16, 1, &n, NULL), *g = t_buf1(RT, DPAR_F32, N, NULL),
                *p = t_buf1(RT, DPAR_F32, N, NULL), *m = t_buf1(RT, DPAR_F32, N, NULL),
                *v = t_buf1(RT, DPAR_F32, N, NULL);
    dpar_adamw_desc ad = { .learning_rate = 0.01f };
    int skipped[STEPS], want_skip[STEPS] = { 0, 0, 1, 1, 0, 0, 0, 1, 0, 0 };
    float scales[STEPS + 1], want_scale = 1024;
    int64_t t = 0;
    scales[0] = ls.scale;
    for (int s = 0; s < STEPS; s++) {
        float gh[N];
        for (int i = 0; i < N; i++) gh[i] = (want_skip[s] && i == 3 ? 1000.0f : 0.01f * (float)(i + 1)) * ls.scale;
        uint16_t h[N];
        for (int i = 0; i < N; i++) h[i] = dpar_f32_to_f16(gh[i]); /* the f16 backward pass */
        T_OK(dpar_buffer_write(g16, 0, h, sizeof h));
        T_OK(dpar_cast(g, g16));
        bool finite = false;
        T_OK(dpar_loss_scaler_unscale(NULL, &ls, &g, 1, NULL, &finite));
        skipped[s] = !finite;
        if (finite) T_OK(dpar_adamw_update(&ad, p, g, m, v, ++t, 1));
        scales[s + 1] = ls.scale;
        float pw[N];
        t_read(p, pw);
        for (int i = 0; i < N; i++) assert_true(isfinite(pw[i]));
    }
    int good = 0;
    for (int s = 0; s < STEPS; s++) {
        if (skipped[s] != want_skip[s]) fail_msg("step %d: skipped %d, want %d", s, skipped[s], want_skip[s]);
        if (want_skip[s]) {
            want_scale /= 2;
            good = 0;
        } else if (++good == 2) {
            want_scale *= 2;
            good = 0;
        }
        if (scales[s + 1] != want_scale) fail_msg("scale after step %d: %g, want %g", s, scales[s + 1], want_scale);
    }
    assert_int_equal(ls.skipped_steps, 3);
    assert_int_equal(t, 7);
    /* each bad field is named alone, with its value and its rule */
    T_ERR(dpar_loss_scaler_init(&ls, &(dpar_loss_scale_desc){ .backoff_factor = 2 }), DPAR_ERR_INVALID_ARGUMENT,
          "dpar_loss_scaler_init: d->backoff_factor is 2; it must be in (0, 1)");
    T_ERR(dpar_loss_scaler_init(&ls, &(dpar_loss_scale_desc){ .init_scale = -1 }), DPAR_ERR_INVALID_ARGUMENT,
          "d->init_scale is -1; it must be finite and > 0");
    T_ERR(dpar_loss_scaler_init(&ls, &(dpar_loss_scale_desc){ .growth_interval = -3 }), DPAR_ERR_INVALID_ARGUMENT,
          "d->growth_interval is -3; it must be > 0");
    T_ERR(dpar_loss_scaler_init(&ls, &(dpar_loss_scale_desc){ .growth_factor = 0.5f }), DPAR_ERR_INVALID_ARGUMENT,
          "d->growth_factor is 0.5; it must be finite and > 1");
    T_ERR(dpar_loss_scaler_init(&ls, &(dpar_loss_scale_desc){ .min_scale = INFINITY }), DPAR_ERR_INVALID_ARGUMENT,
          "d->min_scale is inf; it must be finite and > 0");
    assert_null(strstr(dpar_last_error(), "backoff_factor"));
    dpar_buffer *all[5] = { g16, g, p, m, v };
    for (int i = 0; i < 5; i++) dpar_buffer_destroy(all[i]);
}

/* ---- cross-entropy with an ignore label and label smoothing --------------------- */

static double xent_ref(int M, int C, const double *z, const int32_t *lab, int ign, int32_t ignore, double a) {
    double tot = 0;
    int cnt = 0;
    for (int i = 0; i < M; i++) {
        if (ign && lab[i] == ignore) continue;
        double mx = -INFINITY, se = 0, q = 0;
        for (int j = 0; j < C; j++) mx = fmax(mx, z[i * C + j]);
        for (int j = 0; j < C; j++) se += exp(z[i * C + j] - mx);
        for (int j = 0; j < C; j++) q += ((j == lab[i] ? 1 - a : 0) + a / C) * z[i * C + j];
        tot += mx + log(se) - q;
        cnt++;
    }
    return cnt ? tot / cnt : 0;
}
static void check_xent(dpar_runtime *rt, int M, int C, int ign, int32_t ignore, float a, const int32_t *lab) {
    int64_t zs[2] = { M, C }, ms = M, one = 1;
    float *z = (float *)malloc((size_t)(M * C) * 4), *g = (float *)malloc((size_t)(M * C) * 4), loss;
    double *zd = (double *)malloc((size_t)(M * C) * 8);
    for (int i = 0; i < M * C; i++) zd[i] = z[i] = sinf((float)i * 1.3f) * 3.0f;
    dpar_buffer *bz = t_buf(rt, 0, DPAR_F32, 2, zs, z), *bl = t_buf(rt, 0, DPAR_I32, 1, &ms, lab),
                *bg = t_buf(rt, 0, DPAR_F32, 2, zs, NULL), *blo = t_buf(rt, 0, DPAR_F32, 1, &one, NULL);
    dpar_xent_desc d = { .use_ignore = ign != 0, .ignore_label = ignore, .label_smoothing = a };
    T_OK(dpar_cross_entropy(blo, bg, bz, bl, &d));
    t_read(blo, &loss);
    t_read(bg, g);
    double want = xent_ref(M, C, zd, lab, ign, ignore, a);
    if (fabs(loss - want) > 1e-5 * (fabs(want) + 1e-3))
        fail_msg("xent %dx%d ignore %d smoothing %g: loss %.9g, want %.9g", M, C, ign, a, loss, want);
    for (int i = 0; i < M * C; i++) { /* central differences of the double reference */
        double h = 1e-5, keep = zd[i];
        zd[i] = keep + h;
        double up = xent_ref(M, C, zd, lab, ign, ignore, a);
        zd[i] = keep - h;
        double dn = xent_ref(M, C, zd, lab, ign, ignore, a);
        zd[i] = keep;
        double fd = (up - dn) / (2 * h);
        if (fabs(g[i] - fd) > 1e-5 + 1e-4 * fabs(fd))
            fail_msg("xent %dx%d ignore %d smoothing %g: dlogits[%d] %.9g, finite differences %.9g", M, C, ign, a, i,
                     g[i], fd);
    }
    T_OK(dpar_cross_entropy(blo, NULL, bz, bl, &d)); /* without the gradient: the same loss */
    float l2;
    t_read(blo, &l2);
    assert_true(l2 == loss);
    dpar_buffer_destroy(bz);
    dpar_buffer_destroy(bl);
    dpar_buffer_destroy(bg);
    dpar_buffer_destroy(blo);
    free(z);
    free(g);
    free(zd);
}
static void test_xent_ignore_smoothing(void **st) {
    (void)st;
    int32_t lab[7] = { 2, -100, 0, 4, -100, 1, 3 };
    check_xent(RT, 7, 5, 1, -100, 0.0f, lab);
    check_xent(RT, 7, 5, 1, -100, 0.1f, lab);
    int32_t lab2[7] = { 2, 4, 0, 4, 3, 1, 3 };
    check_xent(RT, 7, 5, 0, 0, 0.25f, lab2);
    check_xent(RT, 7, 5, 1, 4, 0.0f, lab2); /* a valid class used as the ignore label */
    int32_t all[3] = { -1, -1, -1 };        /* every row ignored: loss 0, zero gradient */
    check_xent(RT, 3, 2, 1, -1, 0.0f, all);
    int32_t one[1] = { 0 };
    check_xent(RT, 1, 1, 0, 0, 0.0f, one);
    /* plain settings give dpar_softmax_xent bit for bit */
    int64_t zs[2] = { 7, 5 }, ms = 7, o = 1;
    float z[35], l1, l2, g1[35], g2[35];
    for (int i = 0; i < 35; i++) z[i] = cosf((float)i) * 4;
    dpar_buffer *bz = t_buf(RT, 0, DPAR_F32, 2, zs, z), *bl = t_buf(RT, 0, DPAR_I32, 1, &ms, lab2),
                *ga = t_buf(RT, 0, DPAR_F32, 2, zs, NULL), *gb = t_buf(RT, 0, DPAR_F32, 2, zs, NULL),
                *la = t_buf(RT, 0, DPAR_F32, 1, &o, NULL), *lb = t_buf(RT, 0, DPAR_F32, 1, &o, NULL);
    T_OK(dpar_softmax_xent(la, ga, bz, bl));
    T_OK(dpar_cross_entropy(lb, gb, bz, bl, NULL));
    t_read(la, &l1);
    t_read(lb, &l2);
    t_read(ga, g1);
    t_read(gb, g2);
    assert_true(l1 == l2);
    assert_memory_equal(g1, g2, sizeof g1);
    /* a bad label (not the ignore label) names the first bad row and its value */
    int32_t bad[7] = { 2, -100, 0, 9, -7, 1, 3 };
    T_OK(dpar_buffer_write(bl, 0, bad, sizeof bad));
    dpar_xent_desc d = { .use_ignore = true, .ignore_label = -100 };
    T_ERR(dpar_cross_entropy(lb, gb, bz, bl, &d), DPAR_ERR_INVALID_ARGUMENT, "dpar_cross_entropy", "labels[3] = 9",
          "0..4", "ignore");
    T_ERR(dpar_softmax_xent(la, ga, bz, bl), DPAR_ERR_INVALID_ARGUMENT, "labels[1] = -100");
    int64_t zc[2] = { 7, 0 };
    dpar_buffer *bz0 = t_buf(RT, 0, DPAR_F32, 2, zc, NULL);
    T_ERR(dpar_cross_entropy(lb, NULL, bz0, bl, &d), DPAR_ERR_INVALID_ARGUMENT, "labels[0] = 2", "0 classes",
          "ignore_label");
    dpar_buffer_destroy(bz0);
    d.label_smoothing = 1;
    T_ERR(dpar_cross_entropy(lb, gb, bz, bl, &d), DPAR_ERR_INVALID_ARGUMENT, "label_smoothing");
    dpar_buffer *b6[6] = { bz, bl, ga, gb, la, lb };
    for (int i = 0; i < 6; i++) dpar_buffer_destroy(b6[i]);
}

/* ---- embedding ------------------------------------------------------------ */

static void test_embedding(void **st) {
    (void)st;
    enum { V = 5, D = 3, K = 6 };
    float table[V * D], out[K * D], dt[V * D];
    for (int i = 0; i < V * D; i++) table[i] = (float)i * 0.5f - 1;
    int32_t idx[K] = { 4, 0, 4, 2, 4, 1 }; /* row 4 three times, row 3 never */
    int64_t ts[2] = { V, D }, os[3] = { 2, 3, D }, is[2] = { 2, 3 };
    dpar_buffer *bt = t_buf(RT, 0, DPAR_F32, 2, ts, table), *bo = t_buf(RT, 0, DPAR_F32, 3, os, NULL),
                *bi = t_buf(RT, 0, DPAR_I32, 2, is, idx), *bd = t_buf(RT, 0, DPAR_F32, 2, ts, NULL);
    T_OK(dpar_embedding(bo, bt, bi));
    t_read(bo, out);
    for (int i = 0; i < K; i++)
        for (int d = 0; d < D; d++) assert_true(out[i * D + d] == table[idx[i] * D + d]);
    /* gradient: dout = i + d/10 at position i; repeated rows sum in position order */
    float dout[K * D];
    for (int i = 0; i < K * D; i++) dout[i] = (float)(i / D) + (float)(i % D) * 0.1f;
    T_OK(dpar_buffer_write(bo, 0, dout, sizeof dout));
    T_OK(dpar_fill(bd, 7)); /* beta 0 ignores it */
    T_OK(dpar_embedding_backward(bd, bo, bi, 0));
    t_read(bd, dt);
    for (int v = 0; v < V; v++)
        for (int d = 0; d < D; d++) {
            float want = 0;
            for (int i = 0; i < K; i++)
                if (idx[i] == v) want += dout[i * D + d];
            if (dt[v * D + d] != want) fail_msg("dtable[%d][%d] = %g, want %g", v, d, dt[v * D + d], want);
        }
    /* finite differences in double of L = sum(w * embedding(table)) agree: dL/dtable = scatter of w */
    T_OK(dpar_embedding_backward(bd, bo, bi, 1)); /* beta 1 accumulates: twice the sum */
    float dt2[V * D];
    t_read(bd, dt2);
    for (int v = 0; v < V; v++)
        for (int d = 0; d < D; d++) {
            float want = dt[v * D + d]; /* the old value, then the rows in position order */
            for (int i = 0; i < K; i++)
                if (idx[i] == v) want += dout[i * D + d];
            assert_true(dt2[v * D + d] == want);
        }
    for (int v = 0; v < V; v++)
        for (int d = 0; d < D; d++) {
            double h = 1e-3, up = 0, dn = 0;
            for (int i = 0; i < K; i++) {
                double base = table[idx[i] * D + d], bump = idx[i] == v ? h : 0;
                up += dout[i * D + d] * (base + bump);
                dn += dout[i * D + d] * (base - bump);
            }
            assert_true(fabs((up - dn) / (2 * h) - dt[v * D + d]) < 1e-5);
        }
    int32_t bad[K] = { 4, 0, 5, 2, -1, 1 };
    T_OK(dpar_buffer_write(bi, 0, bad, sizeof bad));
    T_ERR(dpar_embedding(bo, bt, bi), DPAR_ERR_INVALID_ARGUMENT, "dpar_embedding", "idx[2] = 5", "0..4");
    T_ERR(dpar_embedding_backward(bd, bo, bi, 1), DPAR_ERR_INVALID_ARGUMENT, "dpar_embedding_backward", "idx[2] = 5");
    int64_t n4 = 4;
    dpar_buffer *b4 = t_buf(RT, 0, DPAR_F32, 1, &n4, NULL);
    T_ERR(dpar_embedding(b4, bt, bi), DPAR_ERR_SHAPE, "[5, 3]");
    T_ERR(dpar_embedding(bo, bt, bt), DPAR_ERR_DTYPE, "i32");
    int64_t z0 = 0, zs2[2] = { 0, D };
    dpar_buffer *i0 = t_buf(RT, 0, DPAR_I32, 1, &z0, NULL), *o0 = t_buf(RT, 0, DPAR_F32, 2, zs2, NULL);
    T_OK(dpar_embedding(o0, bt, i0)); /* size 0 */
    T_OK(dpar_embedding_backward(bd, o0, i0, 1));
    /* an empty table: the text names it, not a range "0..-1" and "fix the data" */
    int64_t e0[2] = { 0, D };
    dpar_buffer *te = t_buf(RT, 0, DPAR_F32, 2, e0, NULL);
    T_ERR(dpar_embedding(bo, te, bi), DPAR_ERR_INVALID_ARGUMENT, "idx[0] = 4", "a table of 0 rows");
    T_ERR(dpar_embedding_backward(te, bo, bi, 1), DPAR_ERR_INVALID_ARGUMENT, "a table of 0 rows");
    dpar_buffer *all[8] = { bt, bo, bi, bd, b4, i0, o0, te };
    for (int i = 0; i < 8; i++) dpar_buffer_destroy(all[i]);
}

/* ---- dropout ------------------------------------------------------------------ */

static void test_philox_known_answers(void **st) {
    (void)st;
    /* Random123's kat_vectors for philox4x32_10 */
    const uint32_t ctr[3][4] = { { 0, 0, 0, 0 },
                                 { 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu },
                                 { 0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u } };
    const uint32_t key[3][2] = { { 0, 0 }, { 0xffffffffu, 0xffffffffu }, { 0xa4093822u, 0x299f31d0u } };
    const uint32_t want[3][4] = { { 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u },
                                  { 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu },
                                  { 0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u } };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        dpar_philox4x32(ctr[i], key[i], out);
        for (int j = 0; j < 4; j++)
            if (out[j] != want[i][j]) fail_msg("philox vector %d word %d: %08x, want %08x", i, j, out[j], want[i][j]);
    }
}
static void test_dropout(void **st) {
    (void)st;
    enum { N = 1000000 };
    float *x = (float *)malloc(N * 4), *y = (float *)malloc(N * 4), *y2 = (float *)malloc(N * 4);
    for (int i = 0; i < N; i++) x[i] = (float)(i % 1000) * 0.01f + 0.5f;
    dpar_buffer *bx = t_buf1(RT, DPAR_F32, N, x), *by = t_buf1(RT, DPAR_F32, N, NULL);
    T_OK(dpar_dropout(by, bx, 0.0f, 42, 7, 0)); /* p = 0: the identity */
    t_read(by, y);
    assert_memory_equal(x, y, (size_t)N * 4);
    T_OK(dpar_dropout(by, bx, 1.0f, 42, 7, 0)); /* p = 1: zeros */
    t_read(by, y);
    for (int i = 0; i < N; i++) assert_true(y[i] == 0.0f);
    const float rates[3] = { 0.1f, 0.5f, 0.9f };
    for (int r = 0; r < 3; r++) {
        T_OK(dpar_dropout(by, bx, rates[r], 1234, 5, 2));
        t_read(by, y);
        int kept = 0;
        float sc = (float)(1.0 / (1.0 - (double)rates[r]));
        for (int i = 0; i < N; i++) {
            if (y[i] != 0.0f) {
                kept++;
                if (y[i] != x[i] * sc)
                    fail_msg("rate %g: y[%d] = %.9g, want x / (1 - rate) = %.9g", rates[r], i, y[i], x[i] * sc);
            }
        }
        double frac = kept / (double)N, want = 1.0 - rates[r];
        if (fabs(frac - want) > 0.01 * want)
            fail_msg("rate %g keeps %.5f of 1e6, want %.5f within 1%%", rates[r], frac, want);
        /* the mask is a pure function of (seed, step, stream, element): a repeat and the reference agree */
        T_OK(dpar_dropout(by, bx, rates[r], 1234, 5, 2));
        t_read(by, y2);
        assert_memory_equal(y, y2, (size_t)N * 4);
        uint32_t thr = (uint32_t)llround((double)rates[r] * 16777216.0);
        for (int i = 0; i < 4096; i++) {
            uint32_t c[4] = { (uint32_t)(i / 4), 2, 5, 0 }, k[2] = { 1234, 0 }, w[4];
            dpar_philox4x32(c, k, w);
            assert_true(((w[i % 4] >> 8) >= thr) == (y[i] != 0.0f));
        }
    }
    /* another step, stream or seed: another mask */
    T_OK(dpar_dropout(by, bx, 0.5f, 1234, 6, 2));
    t_read(by, y2);
    assert_true(memcmp(y, y2, (size_t)N * 4) != 0);
    /* the gradient is the same call on dy; in place works */
    T_OK(dpar_dropout(bx, bx, 0.5f, 1234, 5, 2));
    t_read(bx, y2);
    T_OK(dpar_dropout(by, by, 0.0f, 0, 0, 0));
    T_ERR(dpar_dropout(by, bx, 1.5f, 0, 0, 0), DPAR_ERR_INVALID_ARGUMENT, "rate");
    T_ERR(dpar_dropout(by, bx, NAN, 0, 0, 0), DPAR_ERR_INVALID_ARGUMENT, "rate");
    dpar_buffer_destroy(bx);
    dpar_buffer_destroy(by);
    free(x);
    free(y);
    free(y2);
}

/* ---- graphs: cross-entropy with ignore, embedding, dropout (with the AdamW node) ---- */

/* the graph of embedding -> dropout -> matmul -> cross-entropy (ignore label,
   smoothing) with AdamW on 1 device gives the eager ops' results bit for bit,
   step after step (the same ops in the same order per element) */
static void test_graph_optim_matches_eager(void **st) {
    (void)st;
    enum { V = 6, D = 5, C = 4, B = 7, STEPS = 4 };
    const uint64_t seed = 99;
    float table0[V * D], w0[D * C];
    int32_t idx[B] = { 1, 5, 1, 0, 3, 5, 2 }, lab[B] = { 0, 3, -1, 2, 1, -1, 3 };
    for (int i = 0; i < V * D; i++) table0[i] = sinf((float)i) * 0.5f;
    for (int i = 0; i < D * C; i++) w0[i] = cosf((float)i * 0.7f) * 0.5f;
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_array *at, *aw;
    dpar_array_desc td = { .dtype = DPAR_F32, .ndim = 2, .shape = { V, D } }, wd = td;
    wd.shape[0] = D;
    wd.shape[1] = C;
    T_OK(dpar_array_create(m, &td, &at));
    T_OK(dpar_array_create(m, &wd, &aw));
    T_OK(dpar_array_put(at, table0));
    T_OK(dpar_array_put(aw, w0));
    dpar_graph *g;
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc fd = { .dtype = DPAR_I32, .ndim = 1, .shape = { B } };
    dpar_value fi = dpar_g_feed(g, "idx", &fd), fl = dpar_g_feed(g, "labels", &fd);
    dpar_value pt = dpar_g_param(g, "table", at), pw = dpar_g_param(g, "w", aw);
    dpar_value h = dpar_g_dropout(g, dpar_g_embedding(g, pt, fi), 0.5f, seed);
    dpar_xent_desc xd = { .use_ignore = true, .ignore_label = -1, .label_smoothing = 0.1f };
    dpar_value loss = dpar_g_cross_entropy(g, dpar_g_matmul(g, h, pw, false, false), fl, &xd);
    dpar_value params[2] = { pt, pw }, grads[2];
    T_OK(dpar_graph_value_and_grad(g, loss, params, 2, grads));
    dpar_adamw_desc ad = { .learning_rate = 0.05f, .weight_decay = 0.01f };
    T_OK(dpar_graph_adamw(g, &ad, params, grads, 2));
    /* the eager reference on device 0 */
    int64_t ts[2] = { V, D }, ws[2] = { D, C }, hs[2] = { B, D }, ls[2] = { B, C }, bs = B, one = 1;
    dpar_buffer *et = t_buf(RT, 0, DPAR_F32, 2, ts, table0), *ew = t_buf(RT, 0, DPAR_F32, 2, ws, w0);
    dpar_buffer *ei = t_buf(RT, 0, DPAR_I32, 1, &bs, idx), *el = t_buf(RT, 0, DPAR_I32, 1, &bs, lab);
    dpar_buffer *x = t_buf(RT, 0, DPAR_F32, 2, hs, NULL), *hh = t_buf(RT, 0, DPAR_F32, 2, hs, NULL),
                *z = t_buf(RT, 0, DPAR_F32, 2, ls, NULL);
    dpar_buffer *dz = t_buf(RT, 0, DPAR_F32, 2, ls, NULL), *dh = t_buf(RT, 0, DPAR_F32, 2, hs, NULL),
                *lo = t_buf(RT, 0, DPAR_F32, 1, &one, NULL);
    dpar_buffer *dt = t_buf(RT, 0, DPAR_F32, 2, ts, NULL), *dw = t_buf(RT, 0, DPAR_F32, 2, ws, NULL);
    dpar_buffer *mt = t_buf(RT, 0, DPAR_F32, 2, ts, NULL), *vt = t_buf(RT, 0, DPAR_F32, 2, ts, NULL);
    dpar_buffer *mw = t_buf(RT, 0, DPAR_F32, 2, ws, NULL), *vw = t_buf(RT, 0, DPAR_F32, 2, ws, NULL);
    float before[V * D];
    for (int t = 1; t <= STEPS; t++) {
        dpar_graph_feed feeds[2] = { { .value = fi, .host = idx }, { .value = fl, .host = lab } };
        float gl, el1, gt[V * D], gw[D * C], xt[V * D], xw[D * C];
        if (t == STEPS) { /* lr 0, a warm-up's first rate: m and v move, the params stay bit for bit */
            T_ERR(dpar_graph_set_lr(g, -1e-3f), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_set_lr", ">= 0");
            T_ERR(dpar_graph_set_lr(g, NAN), DPAR_ERR_INVALID_ARGUMENT, "learning rate");
            T_ERR(dpar_graph_set_lr(g, INFINITY), DPAR_ERR_INVALID_ARGUMENT, "learning rate");
            T_OK(dpar_graph_set_lr(g, 0.0f));
            ad.learning_rate = 0.0f;
            T_OK(dpar_array_get(at, before));
        }
        T_OK(dpar_graph_run(g, feeds, 2, &gl));
        T_OK(dpar_embedding(x, et, ei));
        T_OK(dpar_dropout(hh, x, 0.5f, seed, (uint64_t)(t - 1), 0));
        T_OK(dpar_matmul(z, hh, ew, false, false, 1, 0));
        T_OK(dpar_cross_entropy(lo, dz, z, el, &xd));
        T_OK(dpar_matmul(dw, hh, dz, true, false, 1, 0));
        T_OK(dpar_matmul(dh, dz, ew, false, true, 1, 0));
        T_OK(dpar_dropout(dh, dh, 0.5f, seed, (uint64_t)(t - 1), 0));
        T_OK(dpar_embedding_backward(dt, dh, ei, 0));
        T_OK(dpar_adamw_update(&ad, et, dt, mt, vt, t, 1));
        T_OK(dpar_adamw_update(&ad, ew, dw, mw, vw, t, 1));
        t_read(lo, &el1);
        T_OK(dpar_array_get(at, gt));
        T_OK(dpar_array_get(aw, gw));
        t_read(et, xt);
        t_read(ew, xw);
        if (gl != el1) fail_msg("step %d: graph loss %.9g, eager %.9g", t, gl, el1);
        assert_memory_equal(gt, xt, sizeof gt);
        assert_memory_equal(gw, xw, sizeof gw);
        assert_true(memcmp(gt, table0, sizeof gt) != 0);
        if (t == STEPS) assert_memory_equal(gt, before, sizeof gt);
    }
    dpar_buffer *all[15] = { et, ew, ei, el, x, hh, z, dz, dh, lo, dt, dw, mt, vt, mw };
    for (int i = 0; i < 15; i++) dpar_buffer_destroy(all[i]);
    dpar_buffer_destroy(vw);
    T_OK(dpar_graph_destroy(g));
    dpar_array_destroy(at);
    dpar_array_destroy(aw);
    dpar_mesh_destroy(m);
}
static void test_graph_optim_rejects(void **st) {
    (void)st;
    dpar_mesh *m = t_mesh1(RT, 1, "data");
    dpar_graph *g;
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc fd = { .dtype = DPAR_F32, .ndim = 2, .shape = { 3, 2 } };
    dpar_value f = dpar_g_feed(g, "x", &fd);
    assert_int_equal(dpar_g_embedding(g, f, f).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_DTYPE, "dpar_g_embedding", "i32");
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g));
    f = dpar_g_feed(g, "x", &fd);
    assert_int_equal(dpar_g_dropout(g, f, 2.0f, 1).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_INVALID_ARGUMENT, "dpar_g_dropout", "rate");
    T_OK(dpar_graph_destroy(g));
    dpar_mesh_destroy(m);
}

/* ---- every backend against the CPU reference ---------------------------------- */

static void rdb(const dpar_buffer *b, void *out) {
    T_OK(dpar_buffer_read(b, 0, out, dpar_buffer_nbytes(b)));
}
static void close_enough(const char *what, const float *got, const float *want, int n, double rtol, double atol) {
    for (int i = 0; i < n; i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= atol + rtol * fabs((double)want[i])))
            fail_msg("%s [%d]: %.9g, cpu %.9g", what, i, got[i], want[i]);
}
/* AdamW, three steps, n elements (not a multiple of the workgroup) */
static void parity_adamw(dpar_runtime *rt, int n) {
    float *p = (float *)calloc((size_t)n + 1, 4), *g = (float *)calloc((size_t)n + 1, 4);
    float *a = (float *)calloc((size_t)n + 1, 4), *b = (float *)calloc((size_t)n + 1, 4);
    int64_t sh = n;
    dpar_runtime *rts[2] = { RT, rt };
    dpar_buffer *B[2][4];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) B[r][j] = t_buf(rts[r], 0, DPAR_F32, 1, &sh, NULL);
    for (int i = 0; i < n; i++) p[i] = sinf((float)i) * 0.5f;
    dpar_adamw_desc d = { .learning_rate = 0.01f, .weight_decay = 0.05f };
    for (int r = 0; r < 2; r++) T_OK(dpar_buffer_write(B[r][0], 0, p, (size_t)n * 4));
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < n; i++) g[i] = cosf((float)(i * t)) * 0.1f;
        for (int r = 0; r < 2; r++) {
            T_OK(dpar_buffer_write(B[r][1], 0, g, (size_t)n * 4));
            T_OK(dpar_adamw_update(&d, B[r][0], B[r][1], B[r][2], B[r][3], t, 0.75f));
        }
    }
    rdb(B[0][0], a);
    rdb(B[1][0], b);
    close_enough("adamw param", b, a, n, 1e-6, 1e-7);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) dpar_buffer_destroy(B[r][j]);
    free(p);
    free(g);
    free(a);
    free(b);
}
static void parity_xent(dpar_runtime *rt, int M, int C, float a) {
    int64_t zs[2] = { M, C }, ms = M, one = 1;
    float *z = (float *)malloc((size_t)(M * C) * 4 + 4), *g0 = (float *)malloc((size_t)(M * C) * 4 + 4),
          *g1 = (float *)malloc((size_t)(M * C) * 4 + 4), l0, l1;
    int32_t *lab = (int32_t *)malloc((size_t)M * 4 + 4);
    for (int i = 0; i < M * C; i++) z[i] = sinf((float)i * 0.7f) * 5;
    for (int i = 0; i < M; i++) lab[i] = i % 3 == 1 ? -100 : (i * 7) % C;
    dpar_xent_desc d = { .use_ignore = true, .ignore_label = -100, .label_smoothing = a };
    dpar_runtime *rts[2] = { RT, rt };
    float *gs[2] = { g0, g1 }, *ls[2] = { &l0, &l1 };
    for (int r = 0; r < 2; r++) {
        dpar_buffer *bz = t_buf(rts[r], 0, DPAR_F32, 2, zs, z), *bl = t_buf(rts[r], 0, DPAR_I32, 1, &ms, lab),
                    *bg = t_buf(rts[r], 0, DPAR_F32, 2, zs, NULL), *bo = t_buf(rts[r], 0, DPAR_F32, 1, &one, NULL);
        T_OK(dpar_cross_entropy(bo, bg, bz, bl, &d));
        rdb(bo, ls[r]);
        rdb(bg, gs[r]);
        dpar_buffer_destroy(bz);
        dpar_buffer_destroy(bl);
        dpar_buffer_destroy(bg);
        dpar_buffer_destroy(bo);
    }
    close_enough("xent loss", &l1, &l0, 1, 1e-5, 1e-6);
    close_enough("xent dlogits", g1, g0, M * C, 1e-4, 1e-6);
    free(z);
    free(g0);
    free(g1);
    free(lab);
}
/* embedding and its gradient (bit for bit: same order), dropout (bit for bit) */
static void parity_embed_dropout(dpar_runtime *rt, int V, int D, int K, int n) {
    int64_t ts[2] = { V, D }, os[2] = { K, D }, ks = K, ns = n;
    float *tab = (float *)malloc((size_t)(V * D) * 4 + 4), *x = (float *)malloc((size_t)n * 4 + 4);
    float *o[2], *dt[2], *y[2];
    int32_t *idx = (int32_t *)malloc((size_t)K * 4 + 4);
    for (int i = 0; i < V * D; i++) tab[i] = cosf((float)i) * 0.3f;
    for (int i = 0; i < K; i++) idx[i] = (i * i + 3) % V; /* repeats */
    for (int i = 0; i < n; i++) x[i] = (float)i * 0.001f - 3;
    dpar_runtime *rts[2] = { RT, rt };
    for (int r = 0; r < 2; r++) {
        o[r] = (float *)malloc((size_t)(K * D) * 4 + 4);
        dt[r] = (float *)malloc((size_t)(V * D) * 4 + 4);
        y[r] = (float *)malloc((size_t)n * 4 + 4);
        dpar_buffer *bt = t_buf(rts[r], 0, DPAR_F32, 2, ts, tab), *bo = t_buf(rts[r], 0, DPAR_F32, 2, os, NULL),
                    *bi = t_buf(rts[r], 0, DPAR_I32, 1, &ks, idx), *bd = t_buf(rts[r], 0, DPAR_F32, 2, ts, tab),
                    *bx = t_buf(rts[r], 0, DPAR_F32, 1, &ns, x), *by = t_buf(rts[r], 0, DPAR_F32, 1, &ns, NULL);
        T_OK(dpar_embedding(bo, bt, bi));
        T_OK(dpar_embedding_backward(bd, bo, bi, 0.5f));
        T_OK(dpar_dropout(by, bx, 0.3f, 0x123456789abcULL, 77, 3));
        rdb(bo, o[r]);
        rdb(bd, dt[r]);
        rdb(by, y[r]);
        dpar_buffer *all[6] = { bt, bo, bi, bd, bx, by };
        for (int j = 0; j < 6; j++) dpar_buffer_destroy(all[j]);
    }
    assert_memory_equal(o[1], o[0], (size_t)(K * D) * 4);
    assert_memory_equal(dt[1], dt[0], (size_t)(V * D) * 4);
    assert_memory_equal(y[1], y[0], (size_t)n * 4);
    for (int r = 0; r < 2; r++) {
        free(o[r]);
        free(dt[r]);
        free(y[r]);
    }
    free(tab);
    free(x);
    free(idx);
}
/* a bad label or index: the op returns, the next read of the device names it once */
static void parity_bad_index(dpar_runtime *rt) {
    int64_t zs[2] = { 3, 4 }, ms = 3, one = 1, ts[2] = { 4, 2 }, os[2] = { 3, 2 };
    float z[12] = { 0 }, l;
    int32_t lab[3] = { 1, -100, 9 };
    dpar_buffer *bz = t_buf(rt, 0, DPAR_F32, 2, zs, z), *bl = t_buf(rt, 0, DPAR_I32, 1, &ms, lab),
                *bo = t_buf(rt, 0, DPAR_F32, 1, &one, NULL), *bt = t_buf(rt, 0, DPAR_F32, 2, ts, NULL),
                *be = t_buf(rt, 0, DPAR_F32, 2, os, NULL);
    dpar_xent_desc d = { .use_ignore = true, .ignore_label = -100 };
    dpar_status s = dpar_cross_entropy(bo, NULL, bz, bl, &d);
    if (s == DPAR_OK) s = dpar_buffer_read(bo, 0, &l, 4);
    T_ERR(s, DPAR_ERR_INVALID_ARGUMENT, "dpar_cross_entropy", "labels[2] = 9", "0..3");
    T_OK(dpar_buffer_read(bo, 0, &l, 4)); /* reported once */
    s = dpar_embedding(be, bt, bl);
    if (s == DPAR_OK) s = dpar_buffer_read(be, 0, z, 24);
    T_ERR(s, DPAR_ERR_INVALID_ARGUMENT, "dpar_embedding", "idx[1] = -100");
    dpar_buffer *all[5] = { bz, bl, bo, bt, be };
    for (int j = 0; j < 5; j++) dpar_buffer_destroy(all[j]);
}
/* SGD with momentum and AdamW queued behind a bad label on the same device skip their update until the read
   that reports it: param, momentum, m and v stay bit for bit; the next update applies */
static void parity_bad_index_keeps(dpar_runtime *rt) {
    int64_t zs[2] = { 3, 4 }, ms = 3, one = 1, ps = 5;
    float z[12] = { 0 }, l, init[5] = { 1, -2, 3, -4, 5 }, g[5] = { 0.5f, -1, 2, 0.25f, 1 }, got[5];
    int32_t lab[3] = { 1, 9, 2 };
    dpar_buffer *bz = t_buf(rt, 0, DPAR_F32, 2, zs, z), *bl = t_buf(rt, 0, DPAR_I32, 1, &ms, lab),
                *bo = t_buf(rt, 0, DPAR_F32, 1, &one, NULL), *bg = t_buf(rt, 0, DPAR_F32, 1, &ps, g), *b[4];
    for (int j = 0; j < 4; j++) b[j] = t_buf(rt, 0, DPAR_F32, 1, &ps, init); /* param, momentum, m, v */
    dpar_sgd_desc sd = { .learning_rate = 0.1f, .momentum = 0.9f };
    dpar_adamw_desc ad = { .learning_rate = 0.1f, .weight_decay = 0.01f };
    dpar_status s = dpar_softmax_xent(bo, NULL, bz, bl);
    if (s == DPAR_OK) s = dpar_sgd_update(&sd, b[0], bg, b[1], 1.0f);
    if (s == DPAR_OK) s = dpar_adamw_update(&ad, b[0], bg, b[2], b[3], 1, 1.0f);
    if (s == DPAR_OK) s = dpar_buffer_read(bo, 0, &l, 4);
    T_ERR(s, DPAR_ERR_INVALID_ARGUMENT, "dpar_softmax_xent", "labels[1] = 9");
    for (int j = 0; j < 4; j++) {
        rdb(b[j], got);
        if (memcmp(got, init, sizeof got)) fail_msg("buffer %d changed behind the bad label: %.9g", j, got[0]);
    }
    T_OK(dpar_sgd_update(&sd, b[0], bg, b[1], 1.0f));
    rdb(b[0], got);
    assert_true(got[0] != init[0]);
    dpar_buffer *all[8] = { bz, bl, bo, bg, b[0], b[1], b[2], b[3] };
    for (int j = 0; j < 8; j++) dpar_buffer_destroy(all[j]);
}
/* CUDA adds the good indices' rows and reports the bad ones at the next read (the CPU refuses the op
   before adding anything): afterwards dtable holds the rows of the good positions, added in order. */
static void parity_embed_bad_cuda(dpar_runtime *rt) {
    enum { V = 6, D = 5, K = 2100 }; /* two sort tiles */
    int64_t ts[2] = { V, D }, os[2] = { K, D }, ks = K;
    static float dout[K * D], want[V * D], got[V * D];
    static int32_t idx[K];
    for (int i = 0; i < K * D; i++) dout[i] = sinf((float)i * 0.37f) * 3;
    for (int i = 0; i < V * D; i++) want[i] = (float)i * 0.25f;
    for (int i = 0; i < K; i++) idx[i] = i % 7 == 3 ? V + i % 3 : i % 11 == 5 ? -1 - i : (i * 5 + i / 9) % V;
    dpar_buffer *bd = t_buf(rt, 0, DPAR_F32, 2, ts, want), *bo = t_buf(rt, 0, DPAR_F32, 2, os, dout),
                *bi = t_buf(rt, 0, DPAR_I32, 1, &ks, idx);
    for (int i = 0; i < K; i++)
        for (int j = 0; idx[i] >= 0 && idx[i] < V && j < D; j++) want[idx[i] * D + j] += dout[i * D + j];
    dpar_status s = dpar_embedding_backward(bd, bo, bi, 1);
    if (s == DPAR_OK) s = dpar_buffer_read(bd, 0, got, sizeof got);
    T_ERR(s, DPAR_ERR_INVALID_ARGUMENT, "dpar_embedding_backward", "idx[3] = 6", "0..5");
    rdb(bd, got);
    assert_memory_equal(got, want, sizeof got);
    dpar_buffer_destroy(bd);
    dpar_buffer_destroy(bo);
    dpar_buffer_destroy(bi);
}
static void run_parity(dpar_backend_kind k) {
    dpar_runtime *rt = t_runtime_or_skip(k, 1);
    if (!rt) return;
    parity_adamw(rt, 1);
    parity_adamw(rt, 1000);
    parity_xent(rt, 1, 1, 0.0f);
    parity_xent(rt, 37, 11, 0.0f);
    parity_xent(rt, 300, 5, 0.1f);
    parity_xent(rt, 3000, 300, 0.1f); /* Vulkan's wide passes (dpar__vk_xent): a workgroup a row */
    if (k == DPAR_BACKEND_VULKAN) parity_xent(rt, 70000, 3, 0.0f); /* two rows a workgroup past 65,535 */
    parity_embed_dropout(rt, 1, 1, 1, 1);
    parity_embed_dropout(rt, 50, 7, 333, 100003);
    parity_embed_dropout(rt, 3, 300, 5, 5);
    /* the sorted gradient (>>cuda optim): rows of ~1700 tokens across three sort tiles, many rows over
       tiles, k one past a tile, no token at all */
    parity_embed_dropout(rt, 3, 5, 5000, 1);
    parity_embed_dropout(rt, 1000, 3, 4099, 1);
    parity_embed_dropout(rt, 20, 4, 2049, 1);
    parity_embed_dropout(rt, 4, 3, 0, 1);
    parity_bad_index(rt);
    parity_bad_index_keeps(rt);
    if (k == DPAR_BACKEND_CUDA) parity_embed_bad_cuda(rt);
    T_OK(dpar_runtime_destroy(rt));
}
static void test_parity_vulkan(void **st) {
    (void)st;
    run_parity(DPAR_BACKEND_VULKAN);
}
static void test_parity_cuda(void **st) {
    (void)st;
    run_parity(DPAR_BACKEND_CUDA);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_three_steps),
        cmocka_unit_test(test_adamw_rejects),
        cmocka_unit_test(test_adamw_replicas_clip),
        cmocka_unit_test(test_lr_schedules),
        cmocka_unit_test(test_loss_scaling_skips_overflow),
        cmocka_unit_test(test_xent_ignore_smoothing),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_graph_optim_matches_eager),
        cmocka_unit_test(test_graph_optim_rejects),
        cmocka_unit_test(test_parity_vulkan),
        cmocka_unit_test(test_parity_cuda),
    };
    return cmocka_run_group_tests(tests, t_setup, t_teardown);
}
