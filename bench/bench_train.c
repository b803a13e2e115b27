/* bench_train.c — training throughput of a data-parallel MLP with dpar, the
   same model, batch and optimizer as bench/jax_peer.py runs in JAX.

   An MLP with layer sizes L0-L1-...-Lk (ReLU between, softmax cross-entropy
   on integer labels), global batch B split over a 1-d mesh "data" of N
   devices, SGD with momentum 0.9 and lr 0.1. Each step uploads a host batch
   (dpar_array_put, as the JAX side does with jax.device_put), runs forward
   and backward on every device's rows, averages the gradients over "data"
   and takes the SGD step.

   Gradient exchange (--grads):
     pmean   one pmean per parameter after the backward pass (train_digits.c)
     dp      the data-parallel helper (dpar_dp_*): gradients bucketed, and the
             bucket of the last layers all-reduced asynchronously while the
             earlier layers' gradients are still being computed (default)

   bench_train --name digits --layers 64,128,10 --batch 64 --devices 1,2,4
               [--steps N] [--time S] [--grads dp|pmean] [--backend cpu|vulkan]
               [--bucket-bytes B]   (the helper's bucket capacity; default 25 MiB)
   Prints one CSV row per device count:
       train,dpar,<name>,<devices>,<batch>,<step_ms>,<samples_per_s>
   step_ms is the best of 3 trials of the mean step time (as jax_peer.py).
   DPAR_TRACE=file.json traces the run. */
#include "dpar.h"
#include "util/dpar_train.h"
#include "bench/bench_util.h" /* now_s, ex_parse, ex_check_seconds */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

enum { MAXL = 8 };

static uint64_t rs = 12345;
static uint64_t rnd(void) {
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float urand(void) {
    return (float)((double)(rnd() >> 40) * (1.0 / 16777216.0));
}

typedef struct {
    int nl, sizes[MAXL + 1], use_dp;
    dpar_array *w[MAXL], *b[MAXL], *gw[MAXL], *gb[MAXL], *mw[MAXL], *mb[MAXL];
    dpar_array *act[MAXL + 1], *pre[MAXL], *d[MAXL + 1], *y, *loss;
    dpar_sgd_desc sgd;
    dpar_dp *dp;
} net;

#define CK(call)                      \
    do {                              \
        dpar_status s_ = (call);      \
        if (s_ != DPAR_OK) return s_; \
    } while (0)

static dpar_status step_fn(dpar_ctx *ctx, void *user) {
    net *m = (net *)user;
    int dev = dpar_ctx_device(ctx), L = m->nl;
#define SH(a) dpar_array_shard((a), dev)
    /* forward: pre_i = act_i W_i + b_i, act_{i+1} = relu(pre_i) (last: logits = pre) */
    for (int i = 0; i < L; i++) {
        dpar_buffer *out = i + 1 < L ? SH(m->pre[i]) : SH(m->act[L]);
        CK(dpar_matmul(out, SH(m->act[i]), SH(m->w[i]), false, false, 1.0f, 0.0f));
        CK(dpar_bias_add(out, SH(m->b[i])));
        if (i + 1 < L) CK(dpar_relu(SH(m->act[i + 1]), out));
    }
    CK(dpar_softmax_xent(SH(m->loss), SH(m->d[L]), SH(m->act[L]), SH(m->y)));
    if (m->use_dp) CK(dpar_dp_begin(m->dp, ctx));
    /* backward, last layer first; d[i+1] is dL/d(pre_i) */
    for (int i = L - 1; i >= 0; i--) {
        CK(dpar_matmul(SH(m->gw[i]), SH(m->act[i]), SH(m->d[i + 1]), true, false, 1.0f, 0.0f));
        CK(dpar_bias_grad(SH(m->gb[i]), SH(m->d[i + 1]), 0.0f));
        if (m->use_dp) { /* these two are final: their bucket may start */
            CK(dpar_dp_grad_ready(m->dp, ctx, 2 * i));
            CK(dpar_dp_grad_ready(m->dp, ctx, 2 * i + 1));
        }
        if (i > 0) {
            CK(dpar_matmul(SH(m->d[i]), SH(m->d[i + 1]), SH(m->w[i]), false, true, 1.0f, 0.0f));
            CK(dpar_relu_backward(SH(m->d[i]), SH(m->d[i]), SH(m->pre[i - 1])));
        }
    }
    if (m->use_dp)
        CK(dpar_dp_finish(m->dp, ctx));
    else
        for (int i = 0; i < L; i++) {
            CK(dpar_pmean(ctx, SH(m->gw[i]), SH(m->gw[i]), "data"));
            CK(dpar_pmean(ctx, SH(m->gb[i]), SH(m->gb[i]), "data"));
        }
    dpar_buffer *p[2 * MAXL], *g[2 * MAXL], *v[2 * MAXL];
    for (int i = 0; i < L; i++) {
        p[2 * i] = SH(m->w[i]);
        p[2 * i + 1] = SH(m->b[i]);
        g[2 * i] = SH(m->gw[i]);
        g[2 * i + 1] = SH(m->gb[i]);
        v[2 * i] = SH(m->mw[i]);
        v[2 * i + 1] = SH(m->mb[i]);
    }
    CK(dpar_sgd_step(ctx, &m->sgd, p, g, v, 2 * L));
#undef SH
    return DPAR_OK;
}

static dpar_status arr(dpar_mesh *mesh, dpar_dtype t, int ndim, int64_t d0, int64_t d1, const char *spec0,
                       dpar_array **out) {
    dpar_array_desc d = { .dtype = t, .ndim = ndim, .shape = { d0, d1 }, .spec = { spec0 } };
    return dpar_array_create(mesh, &d, out);
}

static size_t bucket_bytes; /* --bucket-bytes; 0: the helper's default (25 MiB) */
static int run(dpar_backend_kind kind, const char *bname, const char *name, int nl, const int *sizes, int batch, int n,
               int steps, double target, int use_dp) {
    dpar_runtime_desc rd = { .backend = kind, .num_devices = n };
    dpar_runtime *rt;
    if (dpar_runtime_create(&rd, &rt)) {
        printf("skip,%s,%s,%d: %s\n", bname, name, n, dpar_last_error());
        return 0;
    }
    dpar_mesh *mesh;
    dpar_mesh_desc md = { .ndim = 1, .shape = { n }, .axis_names = { "data" } };
    if (dpar_mesh_create(rt, &md, &mesh)) {
        fprintf(stderr, "mesh: %s\n", dpar_last_error());
        return 1;
    }
    net m;
    memset(&m, 0, sizeof m);
    m.nl = nl;
    m.use_dp = use_dp;
    for (int i = 0; i <= nl; i++) m.sizes[i] = sizes[i];
    int bad = 0;
    for (int i = 0; i < nl && !bad; i++) {
        bad |= arr(mesh, DPAR_F32, 2, sizes[i], sizes[i + 1], NULL, &m.w[i]) ||
               arr(mesh, DPAR_F32, 1, sizes[i + 1], 0, NULL, &m.b[i]) ||
               arr(mesh, DPAR_F32, 2, sizes[i], sizes[i + 1], NULL, &m.gw[i]) ||
               arr(mesh, DPAR_F32, 1, sizes[i + 1], 0, NULL, &m.gb[i]) ||
               arr(mesh, DPAR_F32, 2, sizes[i], sizes[i + 1], NULL, &m.mw[i]) ||
               arr(mesh, DPAR_F32, 1, sizes[i + 1], 0, NULL, &m.mb[i]);
        if (!bad) {
            int64_t cnt = (int64_t)sizes[i] * sizes[i + 1];
            float *w = (float *)malloc((size_t)cnt * 4), bound = sqrtf(6.0f / (float)sizes[i]);
            for (int64_t k = 0; k < cnt; k++) w[k] = (2.0f * urand() - 1.0f) * bound;
            bad |= dpar_array_put(m.w[i], w) != DPAR_OK;
            free(w);
        }
    }
    for (int i = 0; i <= nl && !bad; i++) {
        bad |= arr(mesh, DPAR_F32, 2, batch, sizes[i], "data", &m.act[i]) ||
               arr(mesh, DPAR_F32, 2, batch, sizes[i], "data", &m.d[i]);
        if (i < nl - 1) bad |= arr(mesh, DPAR_F32, 2, batch, sizes[i + 1], "data", &m.pre[i]) != DPAR_OK;
    }
    bad = bad || arr(mesh, DPAR_I32, 1, batch, 0, "data", &m.y) || arr(mesh, DPAR_F32, 1, n, 0, "data", &m.loss);
    if (bad) {
        fprintf(stderr, "bench_train: setup: %s\n", dpar_last_error());
        return 1;
    }
    m.sgd.learning_rate = 0.1f;
    m.sgd.momentum = 0.9f;
    if (use_dp) {
        dpar_dp_desc dd = { .axes = "data", .bucket_bytes = bucket_bytes };
        if (dpar_dp_create(mesh, &dd, &m.dp)) {
            fprintf(stderr, "dp_create: %s\n", dpar_last_error());
            return 1;
        }
        for (int i = 0; i < nl && !bad; i++) /* parameter ids 2i (weights), 2i+1 (bias) */
            bad |= dpar_dp_add(m.dp, m.gw[i], NULL) != DPAR_OK || dpar_dp_add(m.dp, m.gb[i], NULL) != DPAR_OK;
        if (bad) {
            fprintf(stderr, "dp_add: %s\n", dpar_last_error());
            return 1;
        }
    }
    /* 8 host batches, cycled, uploaded every step */
    enum { NB = 8 };
    float *xs[NB];
    int32_t *ys[NB];
    for (int k = 0; k < NB; k++) {
        xs[k] = (float *)malloc((size_t)batch * (size_t)sizes[0] * 4);
        ys[k] = (int32_t *)malloc((size_t)batch * 4);
        for (int64_t i = 0; i < (int64_t)batch * sizes[0]; i++) xs[k][i] = urand() * 2.0f - 1.0f;
        for (int i = 0; i < batch; i++) ys[k][i] = (int32_t)(rnd() % (uint64_t)sizes[nl]);
    }
    dpar_shard_map_desc sd = { .fn = step_fn, .user = &m };
    int it = 0;
#define STEP()                                                                                                        \
    do {                                                                                                              \
        if (dpar_array_put(m.act[0], xs[it % NB]) || dpar_array_put(m.y, ys[it % NB]) || dpar_shard_map(mesh, &sd)) { \
            fprintf(stderr, "bench_train: step: %s\n", dpar_last_error());                                            \
            return 1;                                                                                                 \
        }                                                                                                             \
        it++;                                                                                                         \
    } while (0)
    double t0 = now_s();
    for (int i = 0; i < 3; i++) STEP(); /* warm-up */
    double per = (now_s() - t0) / 3;
    int per_trial = steps > 0 ? steps / 3 : (int)(target / 3 / (per > 1e-6 ? per : 1e-6));
    if (per_trial < 1) per_trial = 1;
    double bestt = 1e30;
    for (int trial = 0; trial < 3; trial++) {
        t0 = now_s();
        for (int i = 0; i < per_trial; i++) STEP();
        double t = (now_s() - t0) / per_trial;
        if (t < bestt) bestt = t;
    }
    float loss = 0.0f;
    float *losses = (float *)malloc((size_t)n * 4);
    if (dpar_array_get(m.loss, losses) == DPAR_OK) loss = losses[0];
    free(losses);
    printf("train,dpar,%s,%d,%d,%.4f,%.1f\n", name, n, batch, bestt * 1e3, batch / bestt);
    fprintf(stderr, "bench_train: %s devices=%d loss after %d steps %.4f (%s)\n", name, n, it, (double)loss,
            use_dp ? "dp helper" : "pmean");
    fflush(stdout);
    for (int k = 0; k < NB; k++) {
        free(xs[k]);
        free(ys[k]);
    }
    dpar_dp_destroy(m.dp);
    dpar_runtime_destroy(rt);
    return 0;
}

int main(int argc, char **argv) {
    const char *name = "digits", *layers = "64,128,10", *devs = "1,2,4", *grads = "dp", *backend = "cpu";
    int batch = 64, steps = 0;
    float target = 2.0f;
    int bucket = (int)bucket_bytes;
    const ex_flag flags[] = {
        EX_S("--name", &name, "the row's name"),
        EX_S("--layers", &layers, "layer sizes, a list"),
        EX_I("--batch", &batch, 1, INT_MAX),
        EX_S("--devices", &devs, "device counts, a list"),
        EX_FLAG("--steps", EX_INT, &steps, 0, INT_MAX, NULL, "0: as many as --time allows"),
        EX_F("--time", &target, "seconds per point, > 0 and <= 3600"),
        EX_S("--grads", &grads, "dp|pmean"),
        EX_S("--backend", &backend, "cpu|vulkan|cuda"),
        EX_FLAG("--bucket-bytes", EX_INT, &bucket, 0, INT_MAX, NULL, "0: the helper's 25 MiB"),
    };
    int rc = ex_parse("bench_train", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (!rc) rc = ex_check_seconds("bench_train", "--time", target);
    if (rc) return ex_exit_status(rc);
    bucket_bytes = (size_t)bucket;
    int sizes[MAXL + 1], nl = -1;
    for (const char *p = layers; *p && nl < MAXL;) {
        sizes[++nl] = atoi(p);
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    if (nl < 1) {
        fprintf(stderr, "bench_train: --layers needs at least two sizes\n");
        return 2;
    }
    dpar_backend_kind kind;
    if (dpar_backend_from_name(backend, &kind)) {
        fprintf(stderr, "bench_train: %s\n", dpar_last_error());
        return 2;
    }
    int use_dp = strcmp(grads, "pmean") != 0;
    for (const char *p = devs; *p;) {
        int n = atoi(p);
        if (n >= 1) {
            if (batch % n) {
                fprintf(stderr, "bench_train: batch %d not divisible by %d devices\n", batch, n);
                return 2;
            }
            if (run(kind, backend, name, nl, sizes, batch, n, steps, target, use_dp)) return 1;
        }
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    return 0;
}
