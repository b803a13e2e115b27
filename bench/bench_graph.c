/* bench_graph.c — the digits MLP step (64-128-10, ReLU, softmax cross-entropy,
   SGD lr 0.1 momentum 0.9, global batch 64 over a 1-d mesh "data") two ways
   in one process: the eager hand-written step (train_digits.c before graphs:
   6 forward calls, 6 backward calls, a pmean per gradient, one fused SGD
   step in a shard_map) and the same step as a compiled graph replayed by
   dpar_graph_run. Both start from the same weights and see the same host
   batches (uploaded every step), each fed as its documented fast path
   feeds it: the eager step by dpar_array_put into its input arrays, the
   graph by dpar_graph_put_feeds (staged, six sets in turn: on Vulkan the
   next steps are queued while the device runs the last, and the host
   sleeps about once per six steps) and a run with
   num_feeds = 0 and loss = NULL.

   Interleaved (DESIGN §8): R rounds, each timing a block of K eager steps
   and a block of K graph steps (the order alternating per round), so a busy
   spell on the shared machine hits both alike. Each block ends with a loss
   read (a sync). Prints per backend and device count one CSV row
       graph,<backend>,digits,<devices>,<eager_ms>,<graph_ms>,<ratio_median>,<ratio_min>,<ratio_max>,<rounds>,
             <load1>,<cpu_ratio_median>,<cpu_ratio_min>,<cpu_ratio_max>,<eager_host_ms>,<graph_host_ms>,
             <host_ratio_median>,<host_ratio_min>,<host_ratio_max>
   where the ms are medians over the rounds of wall time per step, ratio =
   graph step time / eager step time per round (< 1: the graph is faster),
   load1 the 1-minute load average when the row was taken, cpu_ratio the
   same ratio of the process's CPU time (user + system, all threads: on a
   loaded shared machine the steadier figure with 1 device; with more devices
   it counts the workers' spin-waits too). On Vulkan (llvmpipe) the device
   computes on the same cores as the host, so wall and process CPU time
   count the device's work; host time (host_cpu_s, bench_util.h) is the CPU
   time of the calling thread and of dpar's own threads only (llvmpipe's
   are left out): the host's cost of issuing a step, per step, medians over
   the rounds, host_ratio its graph/eager ratio per round (-1: no /proc).

   bench_graph [--backend cpu|vulkan] [--devices 1,4] [--rounds R] [--time S] */
#include "dpar.h"
#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

enum { L = 2, D0 = 64, D1 = 128, D2 = 10, BATCH = 64, NB = 8, MAXR = 64 };
static const int sizes[L + 1] = { D0, D1, D2 };

static uint64_t rs = 12345;
static float urand(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (float)((double)((z ^ (z >> 31)) >> 40) * (1.0 / 16777216.0));
}
#define CK(call)                      \
    do {                              \
        dpar_status s_ = (call);      \
        if (s_ != DPAR_OK) return s_; \
    } while (0)

/* ---- the eager step (per device, inside dpar_shard_map) ---- */
typedef struct eager {
    dpar_array *w[L], *b[L], *gw[L], *gb[L], *mw[L], *mb[L];
    dpar_array *act[L + 1], *pre[L], *d[L + 1], *y, *loss;
    dpar_sgd_desc sgd;
} eager;
static dpar_status eager_fn(dpar_ctx *ctx, void *user) {
    eager *m = (eager *)user;
    int dev = dpar_ctx_device(ctx);
#define SH(a) dpar_array_shard((a), dev)
    for (int i = 0; i < L; i++) {
        dpar_buffer *out = i + 1 < L ? SH(m->pre[i]) : SH(m->act[L]);
        CK(dpar_matmul(out, SH(m->act[i]), SH(m->w[i]), false, false, 1.0f, 0.0f));
        CK(dpar_bias_add(out, SH(m->b[i])));
        if (i + 1 < L) CK(dpar_relu(SH(m->act[i + 1]), out));
    }
    CK(dpar_softmax_xent(SH(m->loss), SH(m->d[L]), SH(m->act[L]), SH(m->y)));
    for (int i = L - 1; i >= 0; i--) {
        CK(dpar_matmul(SH(m->gw[i]), SH(m->act[i]), SH(m->d[i + 1]), true, false, 1.0f, 0.0f));
        CK(dpar_bias_grad(SH(m->gb[i]), SH(m->d[i + 1]), 0.0f));
        if (i > 0) {
            CK(dpar_matmul(SH(m->d[i]), SH(m->d[i + 1]), SH(m->w[i]), false, true, 1.0f, 0.0f));
            CK(dpar_relu_backward(SH(m->d[i]), SH(m->d[i]), SH(m->pre[i - 1])));
        }
    }
    dpar_buffer *p[2 * L], *g[2 * L], *v[2 * L];
    for (int i = 0; i < L; i++) {
        CK(dpar_pmean(ctx, SH(m->gw[i]), SH(m->gw[i]), "data"));
        CK(dpar_pmean(ctx, SH(m->gb[i]), SH(m->gb[i]), "data"));
        p[2 * i] = SH(m->w[i]), p[2 * i + 1] = SH(m->b[i]);
        g[2 * i] = SH(m->gw[i]), g[2 * i + 1] = SH(m->gb[i]);
        v[2 * i] = SH(m->mw[i]), v[2 * i + 1] = SH(m->mb[i]);
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
static dpar_status eager_setup(dpar_mesh *mesh, int n, const float *const init[L], eager *m) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < L; i++) {
        CK(arr(mesh, DPAR_F32, 2, sizes[i], sizes[i + 1], NULL, &m->w[i]));
        CK(arr(mesh, DPAR_F32, 1, sizes[i + 1], 0, NULL, &m->b[i]));
        CK(arr(mesh, DPAR_F32, 2, sizes[i], sizes[i + 1], NULL, &m->gw[i]));
        CK(arr(mesh, DPAR_F32, 1, sizes[i + 1], 0, NULL, &m->gb[i]));
        CK(arr(mesh, DPAR_F32, 2, sizes[i], sizes[i + 1], NULL, &m->mw[i]));
        CK(arr(mesh, DPAR_F32, 1, sizes[i + 1], 0, NULL, &m->mb[i]));
        CK(dpar_array_put(m->w[i], init[i]));
    }
    for (int i = 0; i <= L; i++) {
        CK(arr(mesh, DPAR_F32, 2, BATCH, sizes[i], "data", &m->act[i]));
        CK(arr(mesh, DPAR_F32, 2, BATCH, sizes[i], "data", &m->d[i]));
        if (i < L - 1) CK(arr(mesh, DPAR_F32, 2, BATCH, sizes[i + 1], "data", &m->pre[i]));
    }
    CK(arr(mesh, DPAR_I32, 1, BATCH, 0, "data", &m->y));
    CK(arr(mesh, DPAR_F32, 1, n, 0, "data", &m->loss));
    m->sgd.learning_rate = 0.1f, m->sgd.momentum = 0.9f;
    return DPAR_OK;
}

/* ---- the same step as a graph ---- */
typedef struct graphed {
    dpar_graph *g;
    dpar_array *w[L], *b[L];
    dpar_value x, y;
} graphed;
static dpar_status graph_setup(dpar_mesh *mesh, const float *const init[L], graphed *t) {
    memset(t, 0, sizeof *t);
    CK(dpar_graph_create(mesh, &t->g));
    dpar_graph *g = t->g;
    dpar_value p[2 * L], gr[2 * L];
    t->x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 2, { BATCH, D0 }, { "data" } });
    t->y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { BATCH }, { "data" } });
    dpar_value h = t->x;
    for (int i = 0; i < L; i++) {
        CK(arr(mesh, DPAR_F32, 2, sizes[i], sizes[i + 1], NULL, &t->w[i]));
        CK(arr(mesh, DPAR_F32, 1, sizes[i + 1], 0, NULL, &t->b[i]));
        CK(dpar_array_put(t->w[i], init[i]));
        p[2 * i] = dpar_g_param(g, "w", t->w[i]), p[2 * i + 1] = dpar_g_param(g, "b", t->b[i]);
        h = dpar_g_bias_add(g, dpar_g_matmul(g, h, p[2 * i], false, false), p[2 * i + 1]);
        if (i + 1 < L) h = dpar_g_relu(g, h);
    }
    CK(dpar_graph_value_and_grad(g, dpar_g_softmax_xent(g, h, t->y), p, 2 * L, gr));
    CK(dpar_graph_sgd(g, &(dpar_sgd_desc){ .learning_rate = 0.1f, .momentum = 0.9f }, p, gr, 2 * L));
    return dpar_graph_compile(g, NULL);
}

/* ---- timing ---- */
typedef struct data {
    float *x[NB];
    int32_t *y[NB];
    int it;
} data;
/* k steps of one side; the last one reads the loss (a sync). Wall, process CPU and host CPU seconds
   (host_cpu_s) per step in per[0..2]. */
static dpar_status block(dpar_mesh *mesh, eager *e, graphed *t, data *dt, int k, bool graph, double per[3],
                         float *loss) {
    dpar_shard_map_desc sd = { .fn = eager_fn, .user = e };
    double t0 = now_s(), c0 = cpu_s(), h0 = host_cpu_s();
    for (int s = 0; s < k; s++, dt->it++) {
        const float *x = dt->x[dt->it % NB];
        const int32_t *y = dt->y[dt->it % NB];
        if (graph) {
            dpar_graph_feed f[2] = { { t->x, x, NULL }, { t->y, y, NULL } };
            CK(dpar_graph_put_feeds(t->g, f, 2)); /* staged: no wait for the step in flight */
            CK(dpar_graph_run(t->g, NULL, 0, s + 1 == k ? loss : NULL));
        } else {
            CK(dpar_array_put(e->act[0], x));
            CK(dpar_array_put(e->y, y));
            CK(dpar_shard_map(mesh, &sd));
            if (s + 1 == k) CK(dpar_array_get(e->loss, loss)); /* device 0's loss first */
        }
    }
    per[0] = (now_s() - t0) / k;
    per[1] = (cpu_s() - c0) / k;
    per[2] = h0 < 0 ? -1 : (host_cpu_s() - h0) / k;
    return DPAR_OK;
}
static int run(dpar_backend_kind kind, const char *bname, int n, int rounds, double target) {
    dpar_runtime *rt;
    if (dpar_runtime_create(&(dpar_runtime_desc){ .backend = kind, .num_devices = n }, &rt)) {
        printf("skip,graph,%s %d devices: %s\n", bname, n, dpar_last_error());
        return 0;
    }
    dpar_mesh *mesh;
    float *init[L], losses[64];
    data dt = { .it = 0 };
    for (int i = 0; i < L; i++) {
        int64_t c = (int64_t)sizes[i] * sizes[i + 1];
        init[i] = (float *)malloc((size_t)c * 4);
        for (int64_t k = 0; k < c; k++) init[i][k] = (2.0f * urand() - 1.0f) * sqrtf(6.0f / (float)sizes[i]);
    }
    for (int k = 0; k < NB; k++) {
        dt.x[k] = (float *)malloc((size_t)BATCH * D0 * 4);
        dt.y[k] = (int32_t *)malloc((size_t)BATCH * 4);
        for (int i = 0; i < BATCH * D0; i++) dt.x[k][i] = urand() * 2.0f - 1.0f;
        for (int i = 0; i < BATCH; i++) dt.y[k][i] = (int32_t)(urand() * D2) % D2;
    }
    eager e;
    graphed t;
    double pe[3] = { 0, 0, 0 }, pg[3], ratio[MAXR], cratio[MAXR], hratio[MAXR], te[MAXR], tg[MAXR], he[MAXR], hg[MAXR],
           be[3], bg[3];
    float le = 0, lg = 0;
    dpar_status s =
        dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { n }, .axis_names = { "data" } }, &mesh);
    if (!s) s = eager_setup(mesh, n, (const float *const *)init, &e);
    if (!s) s = graph_setup(mesh, (const float *const *)init, &t);
    /* the same first step on both sides: the same loss (a check that they compute the same step) */
    if (!s) s = block(mesh, &e, &t, &dt, 1, false, pe, losses);
    dt.it = 0;
    if (!s) s = block(mesh, &e, &t, &dt, 1, true, pg, &lg);
    for (int d = 0; d < n; d++) le += losses[d] / (float)n; /* the eager step keeps each device's loss */
    if (!s && fabsf(le - lg) > 1e-5f * fabsf(le))
        fprintf(stderr, "bench_graph: first-step loss differs: eager %.7g, graph %.7g\n", (double)le, (double)lg);
    if (!s) s = block(mesh, &e, &t, &dt, 3, false, pe, losses); /* warm-up, and the block size */
    if (!s) s = block(mesh, &e, &t, &dt, 3, true, pg, &lg);
    int k = (int)(target / (pe[0] > 1e-6 ? pe[0] : 1e-6));
    k = k < 1 ? 1 : k;
    for (int r = 0; r < rounds && !s; r++) {
        bool graph_first = r & 1;
        s = block(mesh, &e, &t, &dt, k, graph_first, graph_first ? bg : be, graph_first ? &lg : losses);
        if (!s) s = block(mesh, &e, &t, &dt, k, !graph_first, graph_first ? be : bg, graph_first ? losses : &lg);
        te[r] = be[0], tg[r] = bg[0];
        ratio[r] = bg[0] / be[0];
        cratio[r] = bg[1] / be[1];
        he[r] = be[2], hg[r] = bg[2];
        hratio[r] = be[2] > 0 && bg[2] >= 0 ? bg[2] / be[2] : -1;
    }
    if (s) {
        fprintf(stderr, "bench_graph: %s %d devices: %s\n", bname, n, dpar_last_error());
        return 1;
    }
    qsort(ratio, (size_t)rounds, sizeof(double), cmp_d);
    qsort(cratio, (size_t)rounds, sizeof(double), cmp_d);
    qsort(te, (size_t)rounds, sizeof(double), cmp_d);
    qsort(tg, (size_t)rounds, sizeof(double), cmp_d);
    qsort(hratio, (size_t)rounds, sizeof(double), cmp_d);
    qsort(he, (size_t)rounds, sizeof(double), cmp_d);
    qsort(hg, (size_t)rounds, sizeof(double), cmp_d);
    double l1 = load1();
    printf("graph,%s,digits,%d,%.4f,%.4f,%.3f,%.3f,%.3f,%d,%.1f,%.3f,%.3f,%.3f,%.4f,%.4f,%.3f,%.3f,%.3f\n", bname, n,
           te[rounds / 2] * 1e3, tg[rounds / 2] * 1e3, ratio[rounds / 2], ratio[0], ratio[rounds - 1], rounds, l1,
           cratio[rounds / 2], cratio[0], cratio[rounds - 1], he[rounds / 2] * 1e3, hg[rounds / 2] * 1e3,
           hratio[rounds / 2], hratio[0], hratio[rounds - 1]);
    fprintf(stderr,
            "bench_graph: %s %d devices: %d rounds of %d steps each side (load average %.1f); graph/eager "
            "wall time median %.3f (min %.3f, max %.3f), CPU time median %.3f (min %.3f, max %.3f); "
            "eager %.4f ms, graph %.4f ms per step (wall); host time (caller + dpar's threads) eager %.4f ms, "
            "graph %.4f ms per step, graph/eager median %.3f (min %.3f, max %.3f)\n",
            bname, n, rounds, k, l1, ratio[rounds / 2], ratio[0], ratio[rounds - 1], cratio[rounds / 2], cratio[0],
            cratio[rounds - 1], te[rounds / 2] * 1e3, tg[rounds / 2] * 1e3, he[rounds / 2] * 1e3, hg[rounds / 2] * 1e3,
            hratio[rounds / 2], hratio[0], hratio[rounds - 1]);
    fflush(stdout);
    dpar_graph_destroy(t.g);
    dpar_runtime_destroy(rt);
    for (int i = 0; i < L; i++) free(init[i]);
    for (int i = 0; i < NB; i++) free(dt.x[i]), free(dt.y[i]);
    return 0;
}

int main(int argc, char **argv) {
    const char *backend = "cpu", *devs = "1,4";
    int rounds = 7;
    float target = 0.2f;
    const ex_flag flags[] = {
        EX_S("--backend", &backend, "cpu|vulkan|cuda"),
        EX_S("--devices", &devs, "device counts, a list"),
        EX_I("--rounds", &rounds, 5, MAXR), /* interleaved: at least 5 alternations */
        EX_F("--time", &target, "seconds per round, > 0 and <= 3600"),
    };
    int rc = ex_parse("bench_graph", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (!rc) rc = ex_check_seconds("bench_graph", "--time", target);
    if (rc) return ex_exit_status(rc);
    dpar_backend_kind kind;
    if (dpar_backend_from_name(backend, &kind)) {
        fprintf(stderr, "bench_graph: %s\n", dpar_last_error());
        return 2;
    }
    for (const char *p = devs; *p;) {
        int n = atoi(p);
        if (n >= 1 && (BATCH % n || n > 64)) {
            fprintf(stderr, "bench_graph: batch %d does not divide over %d devices\n", BATCH, n);
            return 2;
        }
        if (n >= 1 && run(kind, backend, n, rounds, target)) return 1;
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    return 0;
}
