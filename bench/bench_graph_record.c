/* bench_graph_record.c — what recording a graph's device ops into command
   buffers (>>graph program; Vulkan) saves per step: the same graph built
   twice in one process, one replayed op by op (DPAR_GRAPH_RECORD=0 at its
   first run) and one re-submitting its recordings, interleaved (DESIGN §8):
   R rounds, each timing a block of K steps of either side, the order
   alternating per round. Two graphs:
     chain:  1 device, y = x; NOPS times y = scale(y) on 16 floats, summed: a
             step of NOPS tiny dispatches, so the step time per dispatch bounds
             the host time per dispatch (llvmpipe computes on the same cores).
     digits: the digits MLP step of bench_graph.c (64-128-10, ReLU, softmax
             cross-entropy, pmean of the gradients, SGD with momentum, batch 64
             over a 1-d "data" mesh), on 1 and 4 devices.
   Prints one CSV row per graph and device count
       record,<graph>,<devices>,<dispatches_per_step>,<off_us>,<on_us>,<ratio_median>,<ratio_min>,<ratio_max>,
              <off_cpu_us>,<on_cpu_us>,<rounds>,<load1>
   where off/on are medians over rounds of wall microseconds per step,
   ratio = on / off per round, cpu the process's CPU time per step (all
   threads, llvmpipe's included), dispatches the device ops per step per
   device counted by dpar_runtime_device_stats on the op-by-op side, load1
   the 1-minute load average when the row was taken. Each block ends with a
   loss read (a sync); the two sides' losses must agree bit for bit.

   bench_graph_record [--rounds R] [--time S] [--ops NOPS] */
#include "dpar.h"
#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { D0 = 64, D1 = 128, D2 = 10, BATCH = 64, MAXR = 64 };
#define CK(call)                      \
    do {                              \
        dpar_status s_ = (call);      \
        if (s_ != DPAR_OK) return s_; \
    } while (0)

static float frand(uint64_t *s) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (float)((double)((z ^ (z >> 31)) >> 40) * (2.0 / 16777216.0) - 1.0);
}

typedef struct side {
    dpar_graph *g;
    dpar_value x, y; /* y: the invalid value for the chain */
} side;
static float xs[BATCH * D0];
static int32_t ys[BATCH];

static dpar_status build_chain(dpar_mesh *m, int nops, side *t) {
    CK(dpar_graph_create(m, &t->g));
    t->x = dpar_g_feed(t->g, "x", &(dpar_array_desc){ DPAR_F32, 2, { 1, 16 }, { NULL } });
    t->y.id = 0;
    dpar_value h = t->x;
    for (int i = 0; i < nops; i++) h = dpar_g_scale(t->g, h, 1.0f - 1.0f / 1024.0f);
    dpar_value loss = dpar_g_sum(t->g, h);
    CK(dpar_graph_value_and_grad(t->g, loss, NULL, 0, NULL));
    return dpar_graph_compile(t->g, NULL);
}
static dpar_status build_digits(dpar_mesh *m, side *t, dpar_array *w[4]) {
    CK(dpar_graph_create(m, &t->g));
    dpar_graph *g = t->g;
    t->x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 2, { BATCH, D0 }, { "data" } });
    t->y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { BATCH }, { "data" } });
    dpar_value p[4], gr[4], h = t->x;
    for (int i = 0; i < 4; i++) p[i] = dpar_g_param(g, i % 2 ? "b" : "w", w[i]);
    h = dpar_g_relu(g, dpar_g_bias_add(g, dpar_g_matmul(g, h, p[0], false, false), p[1]));
    h = dpar_g_bias_add(g, dpar_g_matmul(g, h, p[2], false, false), p[3]);
    CK(dpar_graph_value_and_grad(g, dpar_g_softmax_xent(g, h, t->y), p, 4, gr));
    CK(dpar_graph_sgd(g, &(dpar_sgd_desc){ .learning_rate = 0.1f, .momentum = 0.9f }, p, gr, 4));
    return dpar_graph_compile(g, NULL);
}
/* k steps of one side (the record setting applies at its first run); the last reads the loss. */
static dpar_status block(side *t, bool record, int k, double *wall, double *cpu, float *loss) {
    setenv("DPAR_GRAPH_RECORD", record ? "1" : "0", 1);
    dpar_graph_feed f[2] = { { t->x, xs, NULL }, { t->y, ys, NULL } };
    double t0 = now_s(), c0 = cpu_s();
    for (int s = 0; s < k; s++) CK(dpar_graph_run(t->g, f, t->y.id ? 2 : 1, s + 1 == k ? loss : NULL));
    *wall = (now_s() - t0) / k;
    *cpu = (cpu_s() - c0) / k;
    return DPAR_OK;
}
static int run(const char *name, int n, int nops, int rounds, double target) {
    dpar_runtime *rt = NULL;
    dpar_mesh *m = NULL;
    if (dpar_runtime_create(&(dpar_runtime_desc){ .backend = DPAR_BACKEND_VULKAN, .num_devices = n }, &rt)) {
        printf("skip,record,%s %d devices: %s\n", name, n, dpar_last_error());
        return 0;
    }
    side off, on;
    dpar_array *w[2][4];
    static float init[4][D1 * D1];
    uint64_t seed = 7;
    for (int i = 0; i < D1 * D1; i++) init[0][i] = 0.1f * frand(&seed), init[2][i] = 0.1f * frand(&seed);
    for (int i = 0; i < BATCH * D0; i++) xs[i] = frand(&seed);
    for (int i = 0; i < BATCH; i++) ys[i] = i % D2;
    dpar_status s = dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { n }, .axis_names = { "data" } }, &m);
    const int64_t shp[4][2] = { { D0, D1 }, { D1, 0 }, { D1, D2 }, { D2, 0 } };
    for (int j = 0; j < 2 && !s && nops == 0; j++)
        for (int i = 0; i < 4 && !s; i++) {
            dpar_array_desc d = { .dtype = DPAR_F32, .ndim = i % 2 ? 1 : 2, .shape = { shp[i][0], shp[i][1] } };
            s = dpar_array_create(m, &d, &w[j][i]);
            if (!s) s = dpar_array_put(w[j][i], init[i]);
        }
    if (!s) s = nops ? build_chain(m, nops, &off) : build_digits(m, &off, w[0]);
    if (!s) s = nops ? build_chain(m, nops, &on) : build_digits(m, &on, w[1]);
    double wo = 0, wn = 0, co = 0, cn = 0, r[MAXR], a[MAXR], b[MAXR], ca[MAXR], cb[MAXR];
    float lo = 0, ln = 0;
    dpar_device_stats st;
    if (!s) s = block(&off, false, 2, &wo, &co, &lo); /* first runs (the recording) and warm-up */
    if (!s) s = block(&on, true, 2, &wn, &cn, &ln);
    if (!s) dpar_runtime_stats_reset(rt);
    if (!s) s = block(&off, false, 1, &wo, &co, &lo);
    if (!s) s = dpar_runtime_device_stats(rt, 0, &st);
    if (!s) s = block(&on, true, 1, &wn, &cn, &ln); /* both sides the same number of steps */
    int k = (int)(target / (wo > 1e-7 ? wo : 1e-7));
    k = k < 1 ? 1 : k;
    for (int i = 0; i < rounds && !s; i++) {
        bool on_first = i & 1;
        s = block(on_first ? &on : &off, on_first, k, on_first ? &wn : &wo, on_first ? &cn : &co, on_first ? &ln : &lo);
        if (!s)
            s = block(on_first ? &off : &on, !on_first, k, on_first ? &wo : &wn, on_first ? &co : &cn,
                      on_first ? &lo : &ln);
        a[i] = wo, b[i] = wn, ca[i] = co, cb[i] = cn, r[i] = wn / wo;
    }
    int segs = 0;
    if (!s) s = dpar_graph_recorded(on.g, &segs, NULL);
    if (s) {
        fprintf(stderr, "bench_graph_record: %s %d devices: %s\n", name, n, dpar_last_error());
        return 1;
    }
    if (memcmp(&lo, &ln, sizeof lo))
        fprintf(stderr, "bench_graph_record: %s: losses differ: %.9g op by op, %.9g recorded\n", name, (double)lo,
                (double)ln);
    qsort(r, (size_t)rounds, sizeof *r, cmp_d), qsort(a, (size_t)rounds, sizeof *a, cmp_d);
    qsort(b, (size_t)rounds, sizeof *b, cmp_d), qsort(ca, (size_t)rounds, sizeof *ca, cmp_d);
    qsort(cb, (size_t)rounds, sizeof *cb, cmp_d);
    int h = rounds / 2;
    double l1 = load1(), disp = (double)st.ops;
    printf("record,%s,%d,%.0f,%.1f,%.1f,%.3f,%.3f,%.3f,%.1f,%.1f,%d,%.1f\n", name, n, disp, a[h] * 1e6, b[h] * 1e6,
           r[h], r[0], r[rounds - 1], ca[h] * 1e6, cb[h] * 1e6, rounds, l1);
    fprintf(stderr,
            "bench_graph_record: %s on %d Vulkan device(s), %.0f dispatches per step per device, %d recorded "
            "segments: op by op %.1f us/step (%.2f us/dispatch), recorded %.1f us/step (%.2f us/dispatch), "
            "recorded/op-by-op median %.3f (min %.3f, max %.3f) over %d rounds of %d steps; process CPU "
            "%.1f -> %.1f us/step; load average %.1f\n",
            name, n, disp, segs, a[h] * 1e6, a[h] * 1e6 / disp, b[h] * 1e6, b[h] * 1e6 / disp, r[h], r[0],
            r[rounds - 1], rounds, k, ca[h] * 1e6, cb[h] * 1e6, l1);
    fflush(stdout);
    dpar_graph_destroy(off.g);
    dpar_graph_destroy(on.g);
    dpar_runtime_destroy(rt);
    return 0;
}

int main(int argc, char **argv) {
    int rounds = 7, nops = 256;
    float target = 0.2f;
    const ex_flag flags[] = {
        EX_I("--rounds", &rounds, 5, MAXR),
        EX_F("--time", &target, "seconds per round, > 0 and <= 3600"),
        EX_I("--ops", &nops, 1, 100000),
    };
    int rc = ex_parse("bench_graph_record", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (!rc) rc = ex_check_seconds("bench_graph_record", "--time", target);
    if (rc) return ex_exit_status(rc);
    if (run("chain", 1, nops, rounds, target)) return 1;
    if (run("digits", 1, 0, rounds, target)) return 1;
    return run("digits", 4, 0, rounds, target);
}
