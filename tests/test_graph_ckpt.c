/* Graph checkpoints (dpar_graph_state*, dpar_graph_save / dpar_graph_restore):
   a Megatron MLP with dropout on a 2x2 (data, model) mesh, its hidden units
   split over "model" (params and optimizer state sharded), trained K steps,
   saved, restored into a freshly built graph whose params start elsewhere,
   and continued: the losses and the final params equal the uninterrupted
   run's bit for bit (AdamW, SGD with momentum, AdamW with ZeRO-1 over 4
   devices; CPU, and Vulkan when present).
   The state's names, specs and count; a restore onto a 1x1 mesh (global
   arrays) gives the same state bit for bit; every mismatch (missing file,
   corrupted file, other optimizer, other shape, other dtype, renamed param)
   is refused with the entry named and the graph left exactly as it was. */
#include "testutil.h"
#include "util/dpar_train.h"
#include <unistd.h>

enum { MB = 8, MD = 6, MC = 4, K = 3, STEPS = 6, NP = 4 };
static dpar_backend_kind BK = DPAR_BACKEND_CPU;

static uint64_t rng_state;
static float rnd(void) {
    return (float)t_splitmix(&rng_state);
} /* [-1, 1) */
static const char *tpath(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    const char *t = getenv("TMPDIR");
    snprintf(p[k], sizeof p[k], "%s/dpar_gckpt_%d_%s", t ? t : "/tmp", (int)getpid(), name);
    return p[k];
}

/* ---- the model: one row of settings each ---- */
typedef struct cfg {
    int hidden;          /* split over "model" */
    bool sgd;            /* SGD with momentum 0.9; else AdamW */
    float dropout;       /* on the hidden layer; 0: none */
    const char *w2_name; /* "w2" unless renamed */
    dpar_dtype b2_dtype; /* f32, or another dtype cast to f32 in the graph (not optimized then) */
    bool zero1;          /* ZeRO-1 over "data" (dpar_graph_zero1): params replicated, no psum over "model" */
    int dp, tp;          /* the mesh (data, model); 0: 2 x 2 */
} cfg;
typedef struct model {
    dpar_graph *g;
    dpar_array *w[NP];
    dpar_value x, y, p[NP];
} model;

/*   h = dropout(relu(x @ w1 + b1))   x [MB, MD] split over data; w1 [MD, H], b1 [H] split over model
     logits = psum(h @ w2, model) + b2   w2 [H, MC] split over model; b2 [MC]
     loss = softmax_xent(logits, y)
   Params drawn from `seed`; w1, b1, w2 optimized (b2 frozen: a param without optimizer state). */
static void build(model *t, dpar_mesh *m, const cfg *c, uint64_t seed) {
    int64_t H = c->hidden;
    const char *split = c->zero1 ? NULL : "model";
    dpar_array_desc d[NP] = { { DPAR_F32, 2, { MD, H }, { NULL, split } },
                              { DPAR_F32, 1, { H }, { split } },
                              { DPAR_F32, 2, { H, MC }, { split, NULL } },
                              { c->b2_dtype, 1, { MC }, { NULL } } };
    rng_state = seed;
    for (int i = 0; i < NP; i++) {
        T_OK(dpar_array_create(m, &d[i], &t->w[i]));
        int64_t n = d[i].ndim == 2 ? d[i].shape[0] * d[i].shape[1] : d[i].shape[0];
        float *v = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) v[k] = 0.5f * rnd();
        if (d[i].dtype == DPAR_F32) T_OK(dpar_array_put(t->w[i], v));
        free(v);
    }
    T_OK(dpar_graph_create(m, &t->g));
    dpar_graph *g = t->g;
    t->x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 2, { MB, MD }, { "data" } });
    t->y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { MB }, { "data" } });
    const char *names[NP] = { "w1", "b1", c->w2_name ? c->w2_name : "w2", "b2" };
    for (int i = 0; i < NP; i++) t->p[i] = dpar_g_param(g, names[i], t->w[i]);
    dpar_value h = dpar_g_relu(g, dpar_g_bias_add(g, dpar_g_matmul(g, t->x, t->p[0], false, false), t->p[1]));
    if (c->dropout > 0) h = dpar_g_dropout(g, h, c->dropout, 7);
    dpar_value z = dpar_g_matmul(g, h, t->p[2], false, false);
    if (!c->zero1) z = dpar_g_psum(g, z, "model");
    dpar_value b2 = c->b2_dtype == DPAR_F32 ? t->p[3] : dpar_g_cast(g, t->p[3], DPAR_F32);
    dpar_value loss = dpar_g_softmax_xent(g, dpar_g_bias_add(g, z, b2), t->y), gr[3];
    T_OK(dpar_graph_value_and_grad(g, loss, t->p, 3, gr));
    if (c->zero1) T_OK(dpar_graph_zero1(g, "data"));
    if (c->sgd)
        T_OK(dpar_graph_sgd(g, &(dpar_sgd_desc){ .learning_rate = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f }, t->p,
                            gr, 3));
    else
        T_OK(dpar_graph_adamw(g, &(dpar_adamw_desc){ .learning_rate = 0.01f, .weight_decay = 1e-2f }, t->p, gr, 3));
    T_OK(dpar_graph_compile(g, NULL));
}
static void destroy(model *t) {
    T_OK(dpar_graph_destroy(t->g));
    for (int i = 0; i < NP; i++) T_OK(dpar_array_destroy(t->w[i]));
}
/* Step s's batch (the same for every run) -> its loss. */
static float step(model *t, int s) {
    float x[MB * MD], loss;
    int32_t y[MB];
    rng_state = 1000 + (uint64_t)s;
    for (int i = 0; i < MB * MD; i++) x[i] = rnd();
    for (int i = 0; i < MB; i++) y[i] = (int32_t)((i * 7 + s) % MC);
    T_OK(dpar_graph_run(t->g, (dpar_graph_feed[]){ { .value = t->x, .host = x }, { .value = t->y, .host = y } }, 2,
                        &loss));
    return loss;
}

/* Every state array of g to host, concatenated as bytes (*n of them), and the step. */
static unsigned char *snapshot(dpar_graph *g, size_t *n, int64_t *stepc) {
    int count;
    T_OK(dpar_graph_state_count(g, &count));
    unsigned char *b = NULL;
    *n = 0;
    for (int i = 0; i < count; i++) {
        const char *name;
        dpar_array *a;
        T_OK(dpar_graph_state(g, i, &name, &a, NULL));
        size_t nb = dpar_dtype_size(dpar_array_dtype(a));
        for (int d = 0; d < dpar_array_ndim(a); d++) nb *= (size_t)dpar_array_dim(a, d);
        b = realloc(b, *n + nb);
        T_OK(dpar_array_get(a, b + *n));
        *n += nb;
    }
    *stepc = dpar_graph_step(g);
    return b;
}
static void same_state(dpar_graph *a, dpar_graph *b, const char *what) {
    size_t na, nb;
    int64_t sa, sb;
    unsigned char *x = snapshot(a, &na, &sa), *y = snapshot(b, &nb, &sb);
    if (na != nb || memcmp(x, y, na) || sa != sb)
        fail_msg("%s: state differs (%zu vs %zu bytes, step %lld vs %lld)", what, na, nb, (long long)sa, (long long)sb);
    free(x);
    free(y);
}

static dpar_mesh *mesh22(dpar_runtime **rt, int dp, int tp) {
    *rt = t_runtime_or_skip(BK, dp * tp);
    return t_mesh(*rt, 2, (int[]){ dp, tp }, (const char *const[]){ "data", "model" });
}

/* Train STEPS steps uninterrupted; train K, save, restore into a fresh graph (other initial params), continue:
   the same losses and the same final state, bit for bit. */
static void resume(const cfg *c, const char *file) {
    dpar_runtime *rt;
    dpar_mesh *m = mesh22(&rt, c->dp ? c->dp : 2, c->tp ? c->tp : 2);
    model a, b;
    float la[STEPS], lb[STEPS];
    build(&a, m, c, 1);
    for (int s = 0; s < STEPS; s++) {
        la[s] = step(&a, s);
        if (s + 1 == K) T_OK(dpar_graph_save(a.g, tpath(file)));
    }
    build(&b, m, c, 2);
    T_OK(dpar_graph_restore(b.g, tpath(file)));
    assert_int_equal(dpar_graph_step(b.g), K);
    int count;
    T_OK(dpar_graph_state_count(b.g, &count));
    for (int i = 0; i < count; i++) { /* the optimizer state is padded exactly with ZeRO-1 */
        const char *name;
        dpar_array *arr;
        bool padded;
        T_OK(dpar_graph_state(b.g, i, &name, &arr, &padded));
        assert_int_equal(padded, i >= NP && c->zero1);
    }
    for (int s = K; s < STEPS; s++) {
        lb[s] = step(&b, s);
        if (t_f2u(lb[s]) != t_f2u(la[s]))
            fail_msg("%s: step %d loss %.9g after the restore, %.9g uninterrupted", file, s, (double)lb[s],
                     (double)la[s]);
    }
    same_state(a.g, b.g, file);
    destroy(&a);
    destroy(&b);
    unlink(tpath(file));
    dpar_runtime_destroy(rt);
}
static const cfg adamw_cfg = { .hidden = 8, .dropout = 0.25f, .b2_dtype = DPAR_F32 };
static const cfg sgd_cfg = { .hidden = 8, .sgd = true, .dropout = 0.25f, .b2_dtype = DPAR_F32 };
static const cfg zero1_cfg = { .hidden = 8, .dropout = 0.25f, .b2_dtype = DPAR_F32, .zero1 = true, .dp = 4, .tp = 1 };

static void test_resume_adamw_cpu(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    resume(&adamw_cfg, "adamw_cpu.ckpt");
}
static void test_resume_sgd_cpu(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    resume(&sgd_cfg, "sgd_cpu.ckpt");
}
static void test_resume_zero1_cpu(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    resume(&zero1_cfg, "zero1_cpu.ckpt");
}
static void test_resume_adamw_vulkan(void **st) {
    (void)st;
    BK = DPAR_BACKEND_VULKAN;
    resume(&adamw_cfg, "adamw_vulkan.ckpt");
}

/* The entries: params in order (once), then m of each optimized param, then v; specs of the params. */
static void test_state_entries(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    dpar_runtime *rt;
    dpar_mesh *m = mesh22(&rt, 2, 2);
    const char *want[2][10] = { { "w1", "b1", "w2", "b2", "w1@adamw.m", "b1@adamw.m", "w2@adamw.m", "w1@adamw.v",
                                  "b1@adamw.v", "w2@adamw.v" },
                                { "w1", "b1", "w2", "b2", "w1@sgd.momentum", "b1@sgd.momentum", "w2@sgd.momentum" } };
    for (int o = 0; o < 2; o++) {
        model t;
        build(&t, m, o ? &sgd_cfg : &adamw_cfg, 1);
        int count;
        T_OK(dpar_graph_state_count(t.g, &count));
        assert_int_equal(count, o ? 7 : 10);
        for (int i = 0; i < count; i++) {
            const char *name;
            dpar_array *a;
            char spec[64];
            bool padded = true;
            T_OK(dpar_graph_state(t.g, i, &name, &a, &padded));
            assert_string_equal(name, want[o][i]);
            assert_false(padded);
            dpar_array *p = t.w[i < NP ? i : (i - NP) % 3]; /* the param it belongs to */
            if (i < NP) assert_ptr_equal(a, p);
            T_OK(dpar_array_spec(a, 0, spec, sizeof spec));
            char pspec[64];
            T_OK(dpar_array_spec(p, 0, pspec, sizeof pspec));
            assert_string_equal(spec, pspec);
            assert_int_equal(dpar_array_ndim(a), dpar_array_ndim(p));
        }
        const char *name;
        dpar_array *a;
        T_ERR(dpar_graph_state(t.g, count, &name, &a, NULL), DPAR_ERR_INVALID_ARGUMENT, "out of range");
        assert_int_equal(dpar_graph_step(t.g), 0);
        T_OK(dpar_graph_set_step(t.g, 5));
        assert_int_equal(dpar_graph_step(t.g), 5);
        T_ERR(dpar_graph_set_step(t.g, -1), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_set_step", ">= 0");
        destroy(&t);
    }
    T_ERR(dpar_graph_set_step(NULL, 1), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_set_step");
    assert_int_equal(dpar_graph_step(NULL), -1);
    dpar_runtime_destroy(rt);
}

/* Saved on a 2x2 mesh, restored on 1x1 and on 4x1: the same global state bit for bit. */
static void test_restore_other_mesh(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    dpar_runtime *rt, *rt1, *rt4;
    dpar_mesh *m = mesh22(&rt, 2, 2), *m1 = mesh22(&rt1, 1, 1), *m4 = mesh22(&rt4, 4, 1);
    model a, b, c;
    build(&a, m, &adamw_cfg, 1);
    for (int s = 0; s < K; s++) step(&a, s);
    T_OK(dpar_graph_save(a.g, tpath("mesh.ckpt")));
    build(&b, m1, &adamw_cfg, 2);
    build(&c, m4, &adamw_cfg, 3);
    T_OK(dpar_graph_restore(b.g, tpath("mesh.ckpt")));
    T_OK(dpar_graph_restore(c.g, tpath("mesh.ckpt")));
    same_state(a.g, b.g, "2x2 -> 1x1");
    same_state(a.g, c.g, "2x2 -> 4x1");
    destroy(&a);
    destroy(&b);
    destroy(&c);
    unlink(tpath("mesh.ckpt"));
    dpar_runtime_destroy(rt);
    dpar_runtime_destroy(rt1);
    dpar_runtime_destroy(rt4);
}

/* dpar_graph_save_extra: the caller's entries ride along; dpar_graph_restore skips them, dpar_checkpoint_restore
   reads them back by name; a name of the state's or one given twice is refused and nothing is written. */
static void test_save_extra(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    dpar_runtime *rt;
    dpar_mesh *m = mesh22(&rt, 2, 2);
    model a, b;
    build(&a, m, &sgd_cfg, 1);
    for (int s = 0; s < K; s++) step(&a, s);
    const int32_t run[3] = { 64, 62, 42 };
    int32_t back[3] = { 0 };
    dpar_array *ra, *rb;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_I32, 1, { 3 }, { NULL } }, &ra));
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_I32, 1, { 3 }, { NULL } }, &rb));
    T_OK(dpar_array_put(ra, run));
    dpar_checkpoint_entry ex = { "run", ra, false }, in = { "run", rb, false };
    T_OK(dpar_graph_save_extra(a.g, tpath("extra.ckpt"), &ex, 1));
    build(&b, m, &sgd_cfg, 2);
    T_OK(dpar_graph_restore(b.g, tpath("extra.ckpt")));
    same_state(a.g, b.g, "with an extra entry");
    uint64_t at = 0;
    T_OK(dpar_checkpoint_restore(tpath("extra.ckpt"), &in, 1, &at));
    T_OK(dpar_array_get(rb, back));
    assert_memory_equal(back, run, sizeof run);
    assert_int_equal(at, K);
    T_OK(dpar_graph_save(a.g, tpath("plain.ckpt")));
    T_ERR(dpar_checkpoint_restore(tpath("plain.ckpt"), &in, 1, NULL), DPAR_ERR_INVALID_ARGUMENT, "run");
    dpar_checkpoint_entry twice[2] = { ex, ex }, state = { "w1", ra, false };
    T_ERR(dpar_graph_save_extra(a.g, tpath("dup.ckpt"), twice, 2), DPAR_ERR_INVALID_ARGUMENT,
          "dpar_graph_save_extra: ", "'run'");
    T_ERR(dpar_graph_save_extra(a.g, tpath("dup.ckpt"), &state, 1), DPAR_ERR_INVALID_ARGUMENT, "'w1'");
    T_ERR(dpar_graph_save_extra(a.g, tpath("dup.ckpt"), NULL, 1), DPAR_ERR_INVALID_ARGUMENT, "n_extra = 1");
    assert_int_equal(access(tpath("dup.ckpt"), F_OK), -1);
    destroy(&a);
    destroy(&b);
    unlink(tpath("extra.ckpt"));
    unlink(tpath("plain.ckpt"));
    dpar_runtime_destroy(rt);
}

/* A restore that must fail: the status, the texts, and the graph exactly as before. */
static void refused(model *t, const char *path, dpar_status want, const char *text1, const char *text2) {
    size_t n0, n1;
    int64_t s0, s1;
    unsigned char *before = snapshot(t->g, &n0, &s0);
    T_ERR(dpar_graph_restore(t->g, path), want, "dpar_graph_restore: ", text1, text2);
    assert_null(strstr(dpar_last_error(), "dpar_checkpoint_restore")); /* the call the user made, alone */
    unsigned char *after = snapshot(t->g, &n1, &s1);
    if (n0 != n1 || memcmp(before, after, n0) || s0 != s1) fail_msg("a refused restore (%s) changed the graph", text1);
    free(before);
    free(after);
}
static void test_mismatch_refused(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    dpar_runtime *rt;
    dpar_mesh *m = mesh22(&rt, 2, 2);
    model a, t;
    build(&a, m, &adamw_cfg, 1);
    for (int s = 0; s < K; s++) step(&a, s);
    const char *good = tpath("good.ckpt"), *bad = tpath("bad.ckpt");
    T_OK(dpar_graph_save(a.g, good));

    build(&t, m, &adamw_cfg, 2); /* a graph that ran: its state and step are not the initial ones */
    step(&t, 0);
    unlink(bad);
    refused(&t, bad, DPAR_ERR_IO, bad, "cannot open");
    FILE *f = fopen(good, "rb"), *g = fopen(bad, "wb"); /* one data byte flipped: the CRC */
    int ch, at = 0;
    while ((ch = fgetc(f)) != EOF) fputc(at++ == 200 ? ch ^ 0x10 : ch, g);
    fclose(f);
    fclose(g);
    refused(&t, bad, DPAR_ERR_IO, bad, "CRC");
    destroy(&t);

    cfg c = adamw_cfg;
    c.sgd = true; /* the other optimizer: its state is not in the file */
    build(&t, m, &c, 2);
    refused(&t, good, DPAR_ERR_INVALID_ARGUMENT, "no entry named", "w1@sgd.momentum");
    destroy(&t);
    c = adamw_cfg;
    c.hidden = 12; /* another shape */
    build(&t, m, &c, 2);
    refused(&t, good, DPAR_ERR_SHAPE, "'w1'", "[6, 8]");
    destroy(&t);
    c = adamw_cfg;
    c.w2_name = "w_out"; /* a renamed param */
    build(&t, m, &c, 2);
    refused(&t, good, DPAR_ERR_INVALID_ARGUMENT, "no entry named", "'w_out'");
    destroy(&t);
    c = adamw_cfg;
    c.b2_dtype = DPAR_F16; /* another dtype */
    build(&t, m, &c, 2);
    refused(&t, good, DPAR_ERR_DTYPE, "'b2'", "f16");
    destroy(&t);

    T_ERR(dpar_graph_save(NULL, good), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_save: g is NULL");
    T_ERR(dpar_graph_restore(NULL, good), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_restore: g is NULL");
    T_ERR(dpar_graph_save(a.g, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_save: ", "path");
    /* a refused save leaves a graph not compiled as it was: it compiled the graph before it read the path */
    dpar_graph *fresh = NULL;
    T_OK(dpar_graph_create(m, &fresh));
    dpar_value fx = dpar_g_feed(fresh, "x", &(dpar_array_desc){ DPAR_F32, 1, { 4 }, { NULL } });
    T_ERR(dpar_graph_save(fresh, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_save: path is NULL");
    T_ERR(dpar_graph_restore(fresh, ""), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_restore: path is NULL or empty");
    assert_true(dpar_g_relu(fresh, fx).id > 0);
    /* a graph that kept a builder error: the save's and restore's texts name them, then the kept error */
    assert_int_equal(dpar_g_psum(fresh, fx, "nope").id, 0);
    T_ERR(dpar_graph_save(fresh, good), DPAR_ERR_UNKNOWN_AXIS, "dpar_graph_save: ", "'nope'");
    assert_null(strstr(dpar_last_error(), "dpar_graph_state_count"));
    T_ERR(dpar_graph_restore(fresh, good), DPAR_ERR_UNKNOWN_AXIS, "dpar_graph_restore: ", "'nope'");
    assert_null(strstr(dpar_last_error(), "dpar_graph_state_count"));
    T_OK(dpar_graph_destroy(fresh));
    destroy(&a);
    unlink(good);
    unlink(bad);
    dpar_runtime_destroy(rt);
}

/* A ZeRO-1 graph's checkpoint into a plain one and back: refused as shape mismatches of the optimizer state,
   and the text says that ZeRO-1 is the difference. */
static void test_zero1_and_plain_refused(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    dpar_runtime *rt;
    dpar_mesh *m = mesh22(&rt, 4, 1);
    cfg plain = zero1_cfg;
    plain.zero1 = false;
    const cfg *c[2] = { &zero1_cfg, &plain };
    const char *file[2] = { tpath("z1.ckpt"), tpath("plain.ckpt") };
    for (int k = 0; k < 2; k++) {
        model a, t;
        build(&a, m, c[k], 1);
        step(&a, 0);
        T_OK(dpar_graph_save(a.g, file[k]));
        build(&t, m, c[1 - k], 2);
        refused(&t, file[k], DPAR_ERR_SHAPE, "@adamw.m' has shape", "a ZeRO-1 graph (dpar_graph_zero1)");
        destroy(&t);
        destroy(&a);
        unlink(file[k]);
    }
    dpar_runtime_destroy(rt);
}

/* Names are the keys: a param without a name, or two of one name, cannot be saved. */
static void test_names_required(void **st) {
    (void)st;
    BK = DPAR_BACKEND_CPU;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *u, *v;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 1, { 4 }, { NULL } }, &u));
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 1, { 4 }, { NULL } }, &v));
    for (int k = 0; k < 2; k++) {
        dpar_graph *g;
        T_OK(dpar_graph_create(m, &g));
        dpar_value a = dpar_g_param(g, k ? "p" : NULL, u), b = dpar_g_param(g, "p", v);
        T_OK(dpar_graph_keep(g, dpar_g_add(g, a, b)));
        if (k)
            T_ERR(dpar_graph_save(g, tpath("names.ckpt")), DPAR_ERR_INVALID_ARGUMENT,
                  "dpar_graph_save: ", "both named 'p'", "node 1", "node 2");
        else
            T_ERR(dpar_graph_save(g, tpath("names.ckpt")), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_save: ", "node 1",
                  "has no name");
        T_OK(dpar_graph_destroy(g));
    }
    assert_int_equal(access(tpath("names.ckpt"), F_OK), -1); /* nothing written */
    dpar_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_adamw_cpu), cmocka_unit_test(test_resume_sgd_cpu),
        cmocka_unit_test(test_resume_zero1_cpu), cmocka_unit_test(test_resume_adamw_vulkan),
        cmocka_unit_test(test_state_entries),    cmocka_unit_test(test_restore_other_mesh),
        cmocka_unit_test(test_mismatch_refused), cmocka_unit_test(test_names_required),
        cmocka_unit_test(test_save_extra),       cmocka_unit_test(test_zero1_and_plain_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
