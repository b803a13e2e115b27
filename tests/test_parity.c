/* Backend parity (in the spirit of ggml's test-backend-ops): every op and
   every collective, in every dtype it takes, on meshes of 1, 2, 4 and 8
   devices, run on a GPU backend (vulkan, cuda) and on the CPU backend in the
   same process with the same inputs; outputs compared with per-op
   tolerances (exact for data movement and integer-valued reductions), with
   NaN/Inf checks and guard buffers allocated around every operand.

   A backend that is not compiled in or has no driver prints
   "SKIPPED: <backend>: <reason>" and is skipped, never passed, unless
   DPAR_REQUIRE_BACKENDS lists it (then it fails).
   DPAR_PARITY_VERBOSE=1 prints every case. */
#include "testutil.h"

/* llvmpipe's unattributable JIT leak under LeakSanitizer: see the hook in testutil.h */

enum { MAXDEV = 8, MAXREC = 16, MAXBUF = 24, GUARD = 29, NCOMPARE_PRINT = 5 };

/* ---- per-device record of one case run -------------------------------- */
typedef struct rec {
    dpar_dtype dt;
    int64_t count;
    void *data;
} rec;
typedef struct devio {
    rec recs[MAXREC];
    int nrec;
    dpar_buffer *bufs[MAXBUF]; /* operands, destroyed after the case */
    dpar_buffer *guards[2 * MAXBUF];
    int nbuf, nguard, nalloc;
    char err[300];
} devio;

struct pcase;
typedef dpar_status (*case_fn)(dpar_ctx *ctx, devio *d, const struct pcase *c, int dev);
typedef struct pcase {
    const char *name;
    case_fn fn;
    dpar_dtype dt;
    int64_t shape[3];  /* matmul: M K N; bias: [B, R, C]; 2-D cases: rows, cols; 1-D cases: n */
    int trans;         /* matmul: bit 0 transposes A, bit 1 B */
    float alpha, beta; /* matmul: alpha, beta; bias: beta of bias_grad; axpy: alpha */
    float scale;       /* axpy: then y *= scale */
    float value;       /* fill: the value */
    int data;          /* cast, sum: the input's values (D_RAND, D_INT, D_SPECIAL) */
    dpar_dtype to;     /* cast: the output dtype */
    dpar_sgd_desc sgd; /* sgd: learning_rate, momentum, nesterov, weight_decay */
    float clip_scale;  /* sgd: the clip scale given to dpar_sgd_update */
    double rtol, atol; /* 0, 0: exact */
    const char *axes;  /* collectives: axis set ("x", "a", "b", "a,b") */
} pcase;

typedef struct run_ctx {
    const pcase *c;
    devio *io;
} run_ctx;

static int g_verbose;
static int g_case_seq; /* data seed of the current case */

/* ---- deterministic data ---------------------------------------------------- */
static uint32_t hash3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ (c + 0x165667B1u) * 0xC2B2AE3Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    return h;
}
enum { D_RAND, D_INT, D_POS, D_LABEL, D_SPECIAL, D_ZERO };
static float gen(int kind, uint32_t seed, int64_t i, int64_t param) {
    uint32_t h = hash3(seed, (uint32_t)i, (uint32_t)(i >> 32));
    float u = (float)(h >> 8) / 16777216.0f; /* [0,1) */
    switch (kind) {
    case D_RAND: return 2.0f * u - 1.0f;
    case D_INT: return (float)((int)(h % 17) - 8);
    case D_POS: return 0.5f + u;
    case D_LABEL: return (float)(h % (uint32_t)param);
    case D_SPECIAL: {
        static const float sp[] = { 0.0f,
                                    -0.0f,
                                    1.0f,
                                    -1.0f,
                                    65504.0f,
                                    65520.0f,
                                    -70000.0f,
                                    1e-8f,
                                    -6.1e-5f,
                                    5.96e-8f,
                                    3.0e38f,
                                    -3.4e38f,
                                    2147483520.0f,
                                    -2147483648.0f,
                                    4.5e9f,
                                    0.5f,
                                    1.5f,
                                    2.5f,
                                    -2.5f,
                                    1.00048828125f /* f16 tie */,
                                    1.0009765625f,
                                    3.14159265f,
                                    1e-40f /* f32 subnormal */,
                                    16777217.0f,
                                    0.0f,
                                    0.0f,
                                    0.0f,
                                    0.0f };
        float v = sp[h % (sizeof sp / sizeof sp[0])];
        if (h % 31 == 0) v = INFINITY;
        if (h % 37 == 0) v = -INFINITY;
        if (h % 41 == 0) v = NAN;
        return v == 0.0f && (h & 64) ? 200.0f * u - 100.0f : v;
    }
    default: return 0.0f;
    }
}
static void store(dpar_dtype dt, void *p, int64_t i, float v) {
    switch (dt) {
    case DPAR_F32: ((float *)p)[i] = v; break;
    case DPAR_F16: ((uint16_t *)p)[i] = dpar_f32_to_f16(v); break;
    case DPAR_BF16: ((uint16_t *)p)[i] = dpar_f32_to_bf16(v); break;
    case DPAR_I32: {
        double x = v;
        ((int32_t *)p)[i] = x != x ? 0 : x >= 2147483647.0 ? INT32_MAX : x <= -2147483648.0 ? INT32_MIN : (int32_t)x;
        break;
    }
    default: break;
    }
}
static double load(dpar_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case DPAR_F32: return ((const float *)p)[i];
    case DPAR_F16: return dpar_f16_to_f32(((const uint16_t *)p)[i]);
    case DPAR_BF16: return dpar_bf16_to_f32(((const uint16_t *)p)[i]);
    case DPAR_I32: return ((const int32_t *)p)[i];
    default: return 0;
    }
}

/* ---- buffers with guards ----------------------------------------------- */
static const unsigned char GUARD_BYTE = 0xA5;
static dpar_status guard_buf(dpar_ctx *ctx, devio *d, dpar_dtype dt) {
    int64_t sh[1] = { GUARD };
    dpar_buffer *g;
    dpar_status s = dpar_ctx_buffer(ctx, dt, 1, sh, &g);
    if (s) return s;
    unsigned char pat[GUARD * 4];
    memset(pat, GUARD_BYTE, sizeof pat);
    if ((s = dpar_buffer_write(g, 0, pat, dpar_buffer_nbytes(g)))) {
        dpar_buffer_destroy(g);
        return s;
    }
    d->guards[d->nguard++] = g;
    return DPAR_OK;
}
/* New operand of dtype dt and shape, filled with `kind` data (guards before
   and after it). */
static dpar_status mk(dpar_ctx *ctx, devio *d, int dev, dpar_dtype dt, int ndim, const int64_t *shape, int kind,
                      int64_t param, dpar_buffer **out) {
    dpar_status s;
    *out = NULL;
    if ((s = guard_buf(ctx, d, dt))) return s;
    if ((s = dpar_ctx_buffer(ctx, dt, ndim, shape, out))) return s;
    d->bufs[d->nbuf++] = *out;
    if ((s = guard_buf(ctx, d, dt))) return s;
    int64_t n = dpar_buffer_count(*out);
    if (kind == D_ZERO || n == 0) return DPAR_OK;
    void *h = malloc((size_t)n * 4 + 4);
    if (!h) return DPAR_ERR_OUT_OF_MEMORY;
    uint32_t seed = hash3((uint32_t)g_case_seq, (uint32_t)dev, (uint32_t)d->nalloc++);
    for (int64_t i = 0; i < n; i++) store(dt, h, i, gen(kind, seed, i, param));
    s = dpar_buffer_write(*out, 0, h, dpar_buffer_nbytes(*out));
    free(h);
    return s;
}
static dpar_status rec_buf(devio *d, const dpar_buffer *b) {
    if (d->nrec >= MAXREC) return DPAR_ERR_STATE;
    rec *r = &d->recs[d->nrec++];
    r->dt = dpar_buffer_dtype(b);
    r->count = dpar_buffer_count(b);
    r->data = malloc(dpar_buffer_nbytes(b) + 4);
    if (!r->data) return DPAR_ERR_OUT_OF_MEMORY;
    return dpar_buffer_read(b, 0, r->data, dpar_buffer_nbytes(b));
}
/* Checks the guards and frees everything of the case. */
static void finish_dev(devio *d) {
    unsigned char got[GUARD * 4];
    for (int i = 0; i < d->nguard; i++) {
        size_t nb = dpar_buffer_nbytes(d->guards[i]);
        if (dpar_buffer_read(d->guards[i], 0, got, nb) == DPAR_OK)
            for (size_t j = 0; j < nb; j++)
                if (got[j] != GUARD_BYTE && !d->err[0])
                    snprintf(d->err, sizeof d->err, "guard buffer %d byte %zu changed to 0x%02x", i, j, got[j]);
        dpar_buffer_destroy(d->guards[i]);
    }
    for (int i = 0; i < d->nbuf; i++) dpar_buffer_destroy(d->bufs[i]);
    d->nguard = d->nbuf = d->nalloc = 0;
}
static void free_io(devio *io) {
    for (int dv = 0; dv < MAXDEV; dv++) {
        for (int i = 0; i < io[dv].nrec; i++) free(io[dv].recs[i].data);
        memset(&io[dv], 0, sizeof io[dv]);
    }
}

#define TRY(x)                 \
    do {                       \
        dpar_status t__ = (x); \
        if (t__) return t__;   \
    } while (0)
#define MK(b, dt, nd, kind, param, ...)                        \
    do {                                                       \
        int64_t sh__[] = { __VA_ARGS__ };                      \
        TRY(mk(ctx, d, dev, dt, nd, sh__, kind, param, &(b))); \
    } while (0)

/* ---- op cases ---------------------------------------------------------- */
static dpar_status c_matmul(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    int64_t M = c->shape[0], K = c->shape[1], N = c->shape[2];
    int ta = c->trans & 1, tb = c->trans >> 1 & 1;
    dpar_buffer *A, *B, *C;
    if (ta)
        MK(A, c->dt, 2, D_RAND, 0, K, M);
    else
        MK(A, c->dt, 2, D_RAND, 0, M, K);
    if (tb)
        MK(B, c->dt, 2, D_RAND, 0, N, K);
    else
        MK(B, c->dt, 2, D_RAND, 0, K, N);
    MK(C, DPAR_F32, 2, D_RAND, 0, M, N);
    TRY(dpar_matmul(C, A, B, ta, tb, c->alpha, c->beta));
    return rec_buf(d, C);
}
static dpar_status c_bias(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *y, *b, *db;
    MK(y, DPAR_F32, 3, D_RAND, 0, c->shape[0], c->shape[1], c->shape[2]);
    MK(b, DPAR_F32, 1, D_RAND, 0, c->shape[2]);
    MK(db, DPAR_F32, 1, D_RAND, 0, c->shape[2]);
    TRY(dpar_bias_add(y, b));
    TRY(rec_buf(d, y));
    int64_t two[2] = { c->shape[0] * c->shape[1], c->shape[2] };
    TRY(dpar_buffer_reshape(y, 2, two));
    TRY(dpar_bias_grad(db, y, c->beta));
    return rec_buf(d, db);
}
static dpar_status c_relu(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *x, *y, *dy, *dx;
    int64_t n = c->shape[0];
    MK(x, DPAR_F32, 1, D_RAND, 0, n);
    MK(y, DPAR_F32, 1, D_ZERO, 0, n);
    MK(dy, DPAR_F32, 1, D_RAND, 0, n);
    MK(dx, DPAR_F32, 1, D_ZERO, 0, n);
    TRY(dpar_relu(y, x));
    TRY(rec_buf(d, y));
    TRY(dpar_relu_backward(dx, dy, x));
    TRY(rec_buf(d, dx));
    TRY(dpar_relu_backward(dy, dy, x)); /* dx aliases dy */
    TRY(rec_buf(d, dy));
    TRY(dpar_relu(x, x)); /* in place */
    return rec_buf(d, x);
}
static dpar_status c_xent(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *z, *lab, *loss, *g;
    int64_t M = c->shape[0], C = c->shape[1];
    MK(z, DPAR_F32, 2, D_RAND, 0, M, C);
    TRY(dpar_scale(z, 4.0f));
    MK(lab, DPAR_I32, 1, D_LABEL, C, M);
    MK(loss, DPAR_F32, 1, D_ZERO, 0, 1);
    MK(g, DPAR_F32, 2, D_ZERO, 0, M, C);
    TRY(dpar_softmax_xent(loss, g, z, lab));
    TRY(rec_buf(d, loss));
    TRY(rec_buf(d, g));
    TRY(dpar_softmax_xent(loss, NULL, z, lab));
    return rec_buf(d, loss);
}
static dpar_status c_mse(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *p, *t, *loss, *g;
    MK(p, DPAR_F32, 2, D_RAND, 0, c->shape[0], c->shape[1]);
    MK(t, DPAR_F32, 2, D_RAND, 0, c->shape[0], c->shape[1]);
    MK(loss, DPAR_F32, 0, D_ZERO, 0, 1);
    MK(g, DPAR_F32, 2, D_ZERO, 0, c->shape[0], c->shape[1]);
    TRY(dpar_mse(loss, g, p, t));
    TRY(rec_buf(d, loss));
    TRY(rec_buf(d, g));
    TRY(dpar_mse(loss, NULL, p, t));
    return rec_buf(d, loss);
}
static dpar_status c_axpy_scale(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *x, *y;
    MK(x, DPAR_F32, 1, D_RAND, 0, c->shape[0]);
    MK(y, DPAR_F32, 1, D_RAND, 0, c->shape[0]);
    TRY(dpar_axpy(y, c->alpha, x));
    TRY(rec_buf(d, y));
    TRY(dpar_scale(y, c->scale));
    TRY(rec_buf(d, y));
    TRY(dpar_axpy(y, -1.0f, y)); /* aliasing: y = 0 */
    return rec_buf(d, y);
}
static dpar_status c_fill_copy(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *x, *y;
    MK(x, c->dt, 2, D_INT, 0, c->shape[0], c->shape[1]);
    MK(y, c->dt, 1, D_ZERO, 0, c->shape[0] * c->shape[1]);
    TRY(dpar_copy(y, x));
    TRY(rec_buf(d, y));
    TRY(dpar_fill(x, c->value));
    TRY(rec_buf(d, x));
    TRY(dpar_copy(x, x));
    return rec_buf(d, x);
}
static dpar_status c_cast(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *x, *y;
    MK(x, c->dt, 1, c->data, 0, c->shape[0]);
    MK(y, c->to, 1, D_ZERO, 0, c->shape[0]);
    TRY(dpar_cast(y, x));
    return rec_buf(d, y);
}
static dpar_status c_sum(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *x, *s;
    MK(x, DPAR_F32, 1, c->data, 0, c->shape[0]);
    MK(s, DPAR_F32, 1, D_ZERO, 0, 1);
    TRY(dpar_sum(s, x));
    TRY(rec_buf(d, s));
    TRY(dpar_sum_squares(s, x));
    return rec_buf(d, s);
}
static dpar_status c_sgd(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *p, *g, *v;
    MK(p, DPAR_F32, 1, D_RAND, 0, c->shape[0]);
    MK(g, DPAR_F32, 1, D_RAND, 0, c->shape[0]);
    MK(v, DPAR_F32, 1, D_RAND, 0, c->shape[0]);
    dpar_sgd_desc sd = c->sgd;
    for (int step = 0; step < 3; step++) TRY(dpar_sgd_update(&sd, p, g, sd.momentum > 0 ? v : NULL, c->clip_scale));
    TRY(rec_buf(d, p));
    if (sd.momentum > 0) TRY(rec_buf(d, v));
    /* the full step with clipping by the global norm over the mesh */
    sd.clip_norm = 0.5f;
    sd.norm_axes = c->axes;
    dpar_buffer *ps[1] = { p }, *gs[1] = { g }, *vs[1] = { v };
    TRY(dpar_sgd_step(ctx, &sd, ps, gs, sd.momentum > 0 ? vs : NULL, 1));
    return rec_buf(d, p);
}

/* ---- collective cases (c->dt, c->axes) ------------------------------------ */
static dpar_status c_reduce(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    dpar_buffer *in, *out;
    MK(in, c->dt, 2, D_INT, 0, c->shape[0], c->shape[1]);
    MK(out, c->dt, 2, D_ZERO, 0, c->shape[0], c->shape[1]);
    for (int op = DPAR_SUM; op <= DPAR_MIN; op++) {
        if (op == DPAR_MEAN && c->dt == DPAR_I32) continue; /* refused: see test_collectives */
        TRY(dpar_preduce(ctx, out, in, c->axes, (dpar_reduce_op)op));
        TRY(rec_buf(d, out));
    }
    dpar_request *r;
    TRY(dpar_preduce_start(ctx, in, in, c->axes, DPAR_SUM, &r)); /* async, in place */
    TRY(dpar_wait(ctx, r));
    return rec_buf(d, in);
}
static dpar_status c_gather(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    int g;
    TRY(dpar_ctx_axis_size(ctx, c->axes, &g));
    int64_t R = c->shape[0], C = c->shape[1];
    dpar_buffer *in, *st, *t0, *t1;
    MK(in, c->dt, 2, D_INT, 0, R, C);
    MK(st, c->dt, 3, D_ZERO, 0, g, R, C);
    MK(t0, c->dt, 2, D_ZERO, 0, g * R, C);
    MK(t1, c->dt, 2, D_ZERO, 0, R, g * C);
    TRY(dpar_all_gather(ctx, st, in, c->axes, 0, false));
    TRY(rec_buf(d, st));
    TRY(dpar_all_gather(ctx, t0, in, c->axes, 0, true));
    TRY(rec_buf(d, t0));
    dpar_request *r;
    TRY(dpar_all_gather_start(ctx, t1, in, c->axes, 1, true, &r));
    TRY(dpar_wait(ctx, r));
    return rec_buf(d, t1);
}
static dpar_status c_scatter(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    int g;
    TRY(dpar_ctx_axis_size(ctx, c->axes, &g));
    int64_t R = c->shape[0], C = c->shape[1];
    dpar_buffer *in, *in3, *o0, *o1, *o2;
    MK(in, c->dt, 2, D_INT, 0, g * R, C);
    MK(in3, c->dt, 3, D_INT, 0, R, g, C);
    MK(o0, c->dt, 2, D_ZERO, 0, R, C);
    MK(o1, c->dt, 2, D_ZERO, 0, R, C);
    MK(o2, c->dt, 2, D_ZERO, 0, R, C);
    TRY(dpar_psum_scatter(ctx, o0, in, c->axes, 0, true));
    TRY(rec_buf(d, o0));
    TRY(dpar_psum_scatter(ctx, o1, in3, c->axes, 1, false));
    TRY(rec_buf(d, o1));
    dpar_request *r;
    TRY(dpar_psum_scatter_start(ctx, o2, in, c->axes, 0, true, &r));
    TRY(dpar_wait(ctx, r));
    return rec_buf(d, o2);
}
static dpar_status c_permute(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    int g;
    TRY(dpar_ctx_axis_size(ctx, c->axes, &g));
    dpar_buffer *in, *out;
    MK(in, c->dt, 2, D_INT, 0, c->shape[0], c->shape[1]);
    MK(out, c->dt, 2, D_RAND, 0, c->shape[0], c->shape[1]);
    int pairs[2 * MAXDEV], np = 0;
    for (int i = 0; i < g; i++) {
        pairs[2 * np] = i;
        pairs[2 * np + 1] = (i + 1) % g;
        np++;
    }
    TRY(dpar_ppermute(ctx, out, in, c->axes, pairs, np)); /* ring shift */
    TRY(rec_buf(d, out));
    int half[2] = { 0, g - 1 };
    TRY(dpar_ppermute(ctx, in, in, c->axes, half, 1)); /* one pair, in place: others get zeros */
    TRY(rec_buf(d, in));
    TRY(dpar_pbroadcast(ctx, out, out, c->axes, g - 1));
    return rec_buf(d, out);
}
static dpar_status c_all_to_all(dpar_ctx *ctx, devio *d, const pcase *c, int dev) {
    int g;
    TRY(dpar_ctx_axis_size(ctx, c->axes, &g));
    int64_t R = c->shape[0], C = c->shape[1];
    dpar_buffer *in, *o1, *o2;
    MK(in, c->dt, 2, D_INT, 0, g * R, C);
    MK(o1, c->dt, 2, D_ZERO, 0, R, g * C); /* split 0, concat 1 */
    MK(o2, c->dt, 2, D_ZERO, 0, g * R, C); /* split 0, concat 0 */
    TRY(dpar_all_to_all(ctx, o1, in, c->axes, 0, 1));
    TRY(rec_buf(d, o1));
    TRY(dpar_all_to_all(ctx, o2, in, c->axes, 0, 0));
    return rec_buf(d, o2);
}

/* ---- running and comparing ----------------------------------------------- */
static dpar_status run_fn(dpar_ctx *ctx, void *user) {
    run_ctx *rc = (run_ctx *)user;
    int dev = dpar_ctx_device(ctx);
    devio *d = &rc->io[dev];
    dpar_status s = rc->c->fn(ctx, d, rc->c, dev);
    finish_dev(d);
    return s;
}
static int run_case(dpar_mesh *m, const pcase *c, devio *io, char *why, size_t whylen) {
    run_ctx rc = { c, io };
    dpar_shard_map_desc sd = { .fn = run_fn, .user = &rc };
    dpar_status s = dpar_shard_map(m, &sd);
    if (s) {
        snprintf(why, whylen, "%s: %s", dpar_status_string(s), dpar_last_error());
        return 0;
    }
    for (int dv = 0; dv < MAXDEV; dv++)
        if (io[dv].err[0]) {
            snprintf(why, whylen, "device %d: %s", dv, io[dv].err);
            return 0;
        }
    return 1;
}
/* 0 when equal within tolerance; else prints the first mismatches. */
static int compare(const pcase *c, int ndev, const devio *want, const devio *got, const char *label) {
    int bad = 0;
    for (int dv = 0; dv < ndev; dv++) {
        if (want[dv].nrec != got[dv].nrec) {
            printf("  %s: device %d recorded %d outputs, cpu %d\n", label, dv, got[dv].nrec, want[dv].nrec);
            return 1;
        }
        for (int r = 0; r < want[dv].nrec; r++) {
            const rec *a = &want[dv].recs[r], *b = &got[dv].recs[r];
            if (a->count != b->count || a->dt != b->dt) {
                printf("  %s: output %d differs in size/dtype\n", label, r);
                return 1;
            }
            for (int64_t i = 0; i < a->count; i++) {
                double x = load(a->dt, a->data, i), y = load(b->dt, b->data, i);
                int ok;
                if (x != x || y != y)
                    ok = (x != x) && (y != y); /* NaN only where the CPU has NaN */
                else if (isinf(x) || isinf(y))
                    ok = x == y; /* Inf only where the CPU has it */
                else if (c->rtol == 0 && c->atol == 0)
                    ok = x == y;
                else
                    ok = fabs(x - y) <= c->atol + c->rtol * fabs(x);
                if (!ok) {
                    if (bad < NCOMPARE_PRINT)
                        printf("  %s: device %d output %d [%lld]: cpu %.9g, backend %.9g (|d| %.3g, rtol %g atol %g)\n",
                               label, dv, r, (long long)i, x, y, fabs(x - y), c->rtol, c->atol);
                    bad++;
                }
            }
        }
    }
    if (bad > NCOMPARE_PRINT) printf("  %s: ... %d mismatches in all\n", label, bad);
    return bad != 0;
}

/* ---- the case lists ------------------------------------------------------ */
static const pcase op_cases[] = {
    /* matmul: M K N, transposes (bit0 A, bit1 B), alpha beta */
    { .name = "matmul 1x1x1",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 1, 1, 1 },
      .alpha = 1,
      .rtol = 1e-6,
      .atol = 1e-6 },
    { .name = "matmul 5x7x3",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 5, 7, 3 },
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-5 },
    { .name = "matmul 5x7x3 tA",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 5, 7, 3 },
      .trans = 1,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-5 },
    { .name = "matmul 5x7x3 tB",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 5, 7, 3 },
      .trans = 2,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-5 },
    { .name = "matmul 5x7x3 tA tB",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 5, 7, 3 },
      .trans = 3,
      .alpha = 0.5f,
      .beta = 2.0f,
      .rtol = 1e-5,
      .atol = 1e-5 },
    { .name = "matmul 33x17x65 beta",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 33, 17, 65 },
      .alpha = 1.5f,
      .beta = -0.5f,
      .rtol = 1e-5,
      .atol = 2e-5 },
    { .name = "matmul 64x200x10 tB",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 64, 200, 10 },
      .trans = 2,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-4 },
    { .name = "matmul 70x64x128 tA",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 70, 64, 128 },
      .trans = 1,
      .alpha = 1,
      .beta = 1,
      .rtol = 1e-5,
      .atol = 1e-4 },
    /* a long k: llvmpipe ends an invocation's loops after 65,535 iterations (several column blocks of
       this a workgroup came out wrong, no error) */
    { .name = "matmul 64x9000x256",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 64, 9000, 256 },
      .alpha = 1,
      .rtol = 1e-4,
      .atol = 1e-3 },
    /* the direct matmul's column-block stride over a workgroup's blocks (one a workgroup as the host
       dispatches it): 19 blocks */
    { .name = "matmul 40x33x300 tA tB beta",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 40, 33, 300 },
      .trans = 3,
      .alpha = 1,
      .beta = 0.5f,
      .rtol = 1e-5,
      .atol = 1e-4 },
    /* Vulkan's direct variant on llvmpipe (blocks of 32 rows by 16 columns): the digits MLP's shapes (N = 10,
       its dW with A transposed, its dX with K = 10 and B transposed), edges one past a block, M and N of 1,
       K of 1 and 0 */
    { .name = "matmul 64x128x10",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 64, 128, 10 },
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-4 },
    { .name = "matmul 128x64x10 tA",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 128, 64, 10 },
      .trans = 1,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-4 },
    { .name = "matmul 64x10x128 tB",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 64, 10, 128 },
      .trans = 2,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-5 },
    { .name = "matmul 33x70x17 tA tB beta",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 33, 70, 17 },
      .trans = 3,
      .alpha = 0.5f,
      .beta = 2.0f,
      .rtol = 1e-5,
      .atol = 1e-4 },
    { .name = "matmul 1x7x1",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 1, 7, 1 },
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-5 },
    { .name = "matmul 64x64x64",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 64, 64, 64 },
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 1e-4 },
    { .name = "matmul 65x1x130 tB beta",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 65, 1, 130 },
      .trans = 2,
      .alpha = 0.5f,
      .beta = 2.0f,
      .rtol = 1e-5,
      .atol = 1e-5 },
    { .name = "matmul 49x0x50 (K=0)",
      .fn = c_matmul,
      .dt = DPAR_F32,
      .shape = { 49, 0, 50 },
      .alpha = 1,
      .beta = 0.5f },
    { .name = "matmul f16 50x33x70 tA",
      .fn = c_matmul,
      .dt = DPAR_F16,
      .shape = { 50, 33, 70 },
      .trans = 1,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 2e-5 },
    { .name = "matmul bf16 130x17x66 tA tB",
      .fn = c_matmul,
      .dt = DPAR_BF16,
      .shape = { 130, 17, 66 },
      .trans = 3,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 2e-5 },
    { .name = "matmul 8x0x4 (K=0)", .fn = c_matmul, .dt = DPAR_F32, .shape = { 8, 0, 4 }, .alpha = 1, .beta = 0.5f },
    { .name = "matmul 0x3x4 (M=0)", .fn = c_matmul, .dt = DPAR_F32, .shape = { 0, 3, 4 }, .alpha = 1 },
    { .name = "matmul f16 9x33x17",
      .fn = c_matmul,
      .dt = DPAR_F16,
      .shape = { 9, 33, 17 },
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 2e-5 },
    { .name = "matmul bf16 9x33x17 tA tB",
      .fn = c_matmul,
      .dt = DPAR_BF16,
      .shape = { 9, 33, 17 },
      .trans = 3,
      .alpha = 1,
      .rtol = 1e-5,
      .atol = 2e-5 },
    { .name = "bias 2x3x5", .fn = c_bias, .dt = DPAR_F32, .shape = { 2, 3, 5 }, .rtol = 1e-6, .atol = 1e-6 },
    { .name = "bias 4x50x130 beta",
      .fn = c_bias,
      .dt = DPAR_F32,
      .shape = { 4, 50, 130 },
      .beta = 0.5f,
      .rtol = 1e-5,
      .atol = 1e-5 },
    /* 16,640 rows of 33 columns: the GPUs add chunks of rows in parallel (65 chunks, a ragged second column
       tile), the CPU row by row, so f32 rounding differs by the summation order alone */
    { .name = "bias 64x260x33 beta (row chunks)",
      .fn = c_bias,
      .dt = DPAR_F32,
      .shape = { 64, 260, 33 },
      .beta = 0.5f,
      .rtol = 1e-4,
      .atol = 1e-3 },
    { .name = "relu 1000", .fn = c_relu, .dt = DPAR_F32, .shape = { 1000 } },
    { .name = "relu 70000", .fn = c_relu, .dt = DPAR_F32, .shape = { 70000 } },
    { .name = "softmax_xent 1x3", .fn = c_xent, .dt = DPAR_F32, .shape = { 1, 3 }, .rtol = 1e-5, .atol = 1e-6 },
    { .name = "softmax_xent 64x10", .fn = c_xent, .dt = DPAR_F32, .shape = { 64, 10 }, .rtol = 1e-5, .atol = 1e-6 },
    /* rows past the 64 invocations of the Vulkan shader's one workgroup */
    { .name = "softmax_xent 0x10 (no rows)", .fn = c_xent, .dt = DPAR_F32, .shape = { 0, 10 } },
    { .name = "softmax_xent 65x1", .fn = c_xent, .dt = DPAR_F32, .shape = { 65, 1 }, .rtol = 1e-5, .atol = 1e-6 },
    { .name = "softmax_xent 300x37", .fn = c_xent, .dt = DPAR_F32, .shape = { 300, 37 }, .rtol = 1e-5, .atol = 1e-6 },
    { .name = "mse 7x3", .fn = c_mse, .dt = DPAR_F32, .shape = { 7, 3 }, .rtol = 1e-6, .atol = 1e-7 },
    { .name = "mse 128x32", .fn = c_mse, .dt = DPAR_F32, .shape = { 128, 32 }, .rtol = 1e-5, .atol = 1e-7 },
    { .name = "axpy/scale 1", .fn = c_axpy_scale, .dt = DPAR_F32, .shape = { 1 }, .alpha = 0.25f, .scale = -3.0f },
    { .name = "axpy/scale 4099",
      .fn = c_axpy_scale,
      .dt = DPAR_F32,
      .shape = { 4099 },
      .alpha = -1.7f,
      .scale = 0.3f,
      .rtol = 1e-7,
      .atol = 0 },
    { .name = "fill/copy f32", .fn = c_fill_copy, .dt = DPAR_F32, .shape = { 7, 9 }, .value = -2.75f },
    { .name = "fill/copy f16 odd", .fn = c_fill_copy, .dt = DPAR_F16, .shape = { 7, 9 }, .value = 0.1f },
    { .name = "fill/copy bf16 odd", .fn = c_fill_copy, .dt = DPAR_BF16, .shape = { 3, 1 }, .value = -1e30f },
    { .name = "fill/copy i32", .fn = c_fill_copy, .dt = DPAR_I32, .shape = { 5, 5 }, .value = -7.9f },
    { .name = "fill/copy empty", .fn = c_fill_copy, .dt = DPAR_F32, .shape = { 0, 5 }, .value = 1.0f },
    { .name = "sum 0", .fn = c_sum, .dt = DPAR_F32, .shape = { 0 }, .data = D_RAND },
    { .name = "sum 1", .fn = c_sum, .dt = DPAR_F32, .shape = { 1 }, .data = D_RAND },
    { .name = "sum 1000 int", .fn = c_sum, .dt = DPAR_F32, .shape = { 1000 }, .data = D_INT },
    { .name = "sum 100003",
      .fn = c_sum,
      .dt = DPAR_F32,
      .shape = { 100003 },
      .data = D_RAND,
      .rtol = 1e-5,
      .atol = 1e-4 },
    { .name = "sgd plain",
      .fn = c_sgd,
      .dt = DPAR_F32,
      .shape = { 1000 },
      .sgd = { .learning_rate = 0.1f },
      .clip_scale = 1,
      .rtol = 1e-6,
      .atol = 1e-7 },
    { .name = "sgd momentum wd clip",
      .fn = c_sgd,
      .dt = DPAR_F32,
      .shape = { 1001 },
      .sgd = { .learning_rate = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f },
      .clip_scale = 0.7f,
      .rtol = 1e-6,
      .atol = 1e-7 },
    { .name = "sgd nesterov",
      .fn = c_sgd,
      .dt = DPAR_F32,
      .shape = { 333 },
      .sgd = { .learning_rate = 0.05f, .momentum = 0.9f, .nesterov = true },
      .clip_scale = 1,
      .rtol = 1e-6,
      .atol = 1e-7 },
};
static const dpar_dtype all_dtypes[] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };

typedef struct coll_kind {
    const char *name;
    case_fn fn;
    int64_t r, c;
} coll_kind;
static const coll_kind coll_kinds[] = {
    { "psum/pmean/pmax/pmin", c_reduce, 3, 5 }, { "all_gather", c_gather, 2, 3 },
    { "psum_scatter", c_scatter, 2, 3 },        { "ppermute/pbroadcast", c_permute, 3, 3 },
    { "all_to_all", c_all_to_all, 2, 3 },       { "psum/pmean/pmax/pmin empty", c_reduce, 0, 4 },
};

/* ---- one backend against the CPU, every mesh size ------------------------- */
typedef struct {
    int cases, failed;
} tally;

static void run_pair(dpar_runtime *cpu, dpar_runtime *gpu, int ndim, const int *shape, const char *const *names,
                     tally *t, const char *bname) {
    dpar_mesh *mc = t_mesh(cpu, ndim, shape, names), *mg = t_mesh(gpu, ndim, shape, names);
    int ndev = dpar_mesh_size(mc);
    static devio want[MAXDEV], got[MAXDEV];
    char why[600];
    pcase list[256];
    int n = 0;
    const char *axsets_1[] = { "x" }, *axsets_2[] = { "a", "b", "a,b" };
    const char *const *axsets = ndim == 1 ? axsets_1 : axsets_2;
    int naxsets = ndim == 1 ? 1 : 3;
    if (ndim == 1) {
        for (size_t i = 0; i < sizeof op_cases / sizeof op_cases[0]; i++) {
            list[n] = op_cases[i];
            list[n].axes = "x";
            n++;
        }
        /* casts: every pair, ordinary and special values */
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                for (int kind = 0; kind < 2; kind++) {
                    static char names_buf[4][4][2][48];
                    snprintf(names_buf[a][b][kind], 48, "cast %s->%s %s", dpar_dtype_name(all_dtypes[a]),
                             dpar_dtype_name(all_dtypes[b]), kind ? "special" : "random");
                    pcase c = { .name = names_buf[a][b][kind],
                                .fn = c_cast,
                                .dt = all_dtypes[a],
                                .shape = { kind ? 1001 : 37 },
                                .to = all_dtypes[b],
                                .data = kind ? D_SPECIAL : D_RAND };
                    list[n++] = c;
                }
    }
    for (size_t k = 0; k < sizeof coll_kinds / sizeof coll_kinds[0]; k++)
        for (int a = 0; a < naxsets; a++)
            for (int di = 0; di < 4; di++) {
                pcase c = { .name = coll_kinds[k].name,
                            .fn = coll_kinds[k].fn,
                            .dt = all_dtypes[di],
                            .shape = { coll_kinds[k].r, coll_kinds[k].c },
                            .axes = axsets[a] };
                list[n++] = c;
            }
    for (int i = 0; i < n; i++) {
        const pcase *c = &list[i];
        char label[200];
        snprintf(label, sizeof label, "%s %s [%s] mesh %d%s%d axes %s", bname, c->name, dpar_dtype_name(c->dt),
                 shape[0], ndim > 1 ? "x" : "", ndim > 1 ? shape[1] : 0, c->axes ? c->axes : "-");
        if (ndim == 1)
            snprintf(label, sizeof label, "%s %s [%s] mesh %d", bname, c->name, dpar_dtype_name(c->dt), shape[0]);
        t->cases++;
        g_case_seq = i * 7919 + ndev;
        int ok = run_case(mc, c, want, why, sizeof why);
        if (!ok) {
            printf("  %s: the CPU reference failed: %s\n", label, why);
            t->failed++;
        } else if (!run_case(mg, c, got, why, sizeof why)) {
            printf("  %s: FAILED: %s\n", label, why);
            t->failed++;
        } else if (compare(c, ndev, want, got, label)) {
            printf("  %s: FAILED (outputs differ from the CPU backend)\n", label);
            t->failed++;
        } else if (g_verbose) {
            printf("  %s: ok\n", label);
        }
        free_io(want);
        free_io(got);
    }
    dpar_mesh_destroy(mc);
    dpar_mesh_destroy(mg);
}

static dpar_runtime *rt_for(dpar_backend_kind k, int n, int noncoherent) {
    dpar_runtime_desc d = {
        .backend = k, .num_devices = n, .timeout_ms = 30000, .vulkan.force_noncoherent = noncoherent
    };
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&d, &rt);
    if (s == DPAR_OK) return rt;
    if (s == DPAR_ERR_BACKEND_UNAVAILABLE && !t_required(dpar_backend_name(k))) {
        printf("SKIPPED: %s: %s\n", dpar_backend_name(k), dpar_last_error());
        fflush(stdout);
        skip();
    }
    fail_msg("%s backend with %d devices: %s: %s", dpar_backend_name(k), n, dpar_status_string(s), dpar_last_error());
    return NULL;
}

static void parity(dpar_backend_kind k, int staged) {
    g_verbose = getenv("DPAR_PARITY_VERBOSE") && atoi(getenv("DPAR_PARITY_VERBOSE")) > 0;
    tally t = { 0, 0 };
    static const int sizes[] = { 1, 2, 4, 8 };
    const char *bname = dpar_backend_name(k);
    char label[64];
    snprintf(label, sizeof label, "%s%s", bname, staged ? "(staged,noncoherent)" : "");
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        if (staged && n != 2 && n != 4) continue;
        if (staged) setenv("DPAR_VK_FORCE_STAGING", "1", 1);
        dpar_runtime *gpu = rt_for(k, n, staged);
        if (staged) unsetenv("DPAR_VK_FORCE_STAGING");
        dpar_runtime *cpu = t_runtime(DPAR_BACKEND_CPU, n);
        int shape1[1] = { n };
        const char *n1[1] = { "x" };
        run_pair(cpu, gpu, 1, shape1, n1, &t, label);
        if (n >= 4) {
            int shape2[2] = { 2, n / 2 };
            const char *n2[2] = { "a", "b" };
            run_pair(cpu, gpu, 2, shape2, n2, &t, label);
        }
        dpar_runtime_destroy(cpu);
        dpar_runtime_destroy(gpu);
    }
    printf("parity %s: %d cases, %d failed\n", label, t.cases, t.failed);
    if (t.failed) fail_msg("%s: %d of %d parity cases failed (see above)", label, t.failed, t.cases);
}

static void test_parity_vulkan(void **state) {
    (void)state;
    parity(DPAR_BACKEND_VULKAN, 0);
}
static void test_parity_vulkan_staged(void **state) {
    (void)state;
    parity(DPAR_BACKEND_VULKAN, 1);
}
static void test_parity_cuda(void **state) {
    (void)state;
    parity(DPAR_BACKEND_CUDA, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_vulkan),
        cmocka_unit_test(test_parity_vulkan_staged),
        cmocka_unit_test(test_parity_cuda),
    };
    return cmocka_run_group_tests_name("parity", tests, NULL, NULL);
}
