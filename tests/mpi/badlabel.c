/* A bad label on another process (mpirun -np 2, run by tests/test_mpi.sh on the CPU and by
   tests/cuda_mock/mpi.sh on the CUDA mock): data parallel over 2 x LOCAL devices (argv[1], default 2),
   rank 1's last device gets label 9 of 5 classes at one step. Both ranks' runs must fail with the label's
   text naming rank 1 and its device, leave the params, the optimizer state and the step count bit for bit
   as they were on both ranks (SGD with momentum; AdamW clipped by the global norm, whose NaN norm would
   otherwise reach the params; its loss adds a cross_entropy of the same labels, a second check that fails),
   keep the runtime usable, and the next good step must equal a graph's that
   never saw the bad one. Prints "rank R: ok" per rank, or "rank R: FAIL ..." lines. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"

static int rank, bad;
#define FAIL(...) (printf("rank %d: FAIL ", rank), printf(__VA_ARGS__), printf("\n"), fflush(stdout), bad = 1)
#define OK(x)     ((x) ? (FAIL("%s: %s", #x, dpar_last_error()), 1) : 0)

static dpar_graph *graph(dpar_mesh *m, dpar_array *w, int opt, dpar_value *x, dpar_value *y) {
    dpar_graph *g = NULL;
    int n = dpar_mesh_size(m);
    if (OK(dpar_graph_create(m, &g))) return NULL;
    dpar_array_desc xd = { DPAR_F32, 2, { 4 * n, 3 }, { "data" } }, yd = { DPAR_I32, 1, { 4 * n }, { "data" } };
    *x = dpar_g_feed(g, "x", &xd), *y = dpar_g_feed(g, "y", &yd);
    dpar_value p = dpar_g_param(g, "w", w), gr;
    dpar_value z = dpar_g_matmul(g, *x, p, false, false), l = dpar_g_softmax_xent(g, z, *y);
    if (opt) /* a second check of the same labels, which fails too: the CPU's device must still reach the agreement */
        l = dpar_g_add(g, l, dpar_g_cross_entropy(g, z, *y, &(dpar_xent_desc){ .label_smoothing = 0.1f }));
    dpar_adamw_desc ad = { .learning_rate = 0.05f, .weight_decay = 0.01f, .clip_norm = 1.0f };
    dpar_sgd_desc sd = { .learning_rate = 0.1f, .momentum = 0.9f };
    if (OK(dpar_graph_value_and_grad(g, l, &p, 1, &gr)) ||
        OK(opt ? dpar_graph_adamw(g, &ad, &p, &gr, 1) : dpar_graph_sgd(g, &sd, &p, &gr, 1)) ||
        OK(dpar_graph_compile(g, NULL))) {
        dpar_graph_destroy(g);
        return NULL;
    }
    return g;
}
/* w [3,5], then its momentum or AdamW's m and v, 16 floats apart (a collective read: every rank calls it; each
   array is read from device 0, so every copy on this rank's devices must equal it too) */
static void state(dpar_runtime *rt, dpar_graph *g, float out[48]) {
    int c = 0, first = 0, count = 0;
    memset(out, 0, 48 * sizeof *out);
    OK(dpar_graph_state_count(g, &c));
    dpar_runtime_local_devices(rt, &first, &count);
    for (int i = 0; i < c && i < 3; i++) {
        const char *name = NULL;
        dpar_array *a = NULL;
        float mine[15];
        if (OK(dpar_graph_state(g, i, &name, &a, NULL)) || OK(dpar_array_get(a, out + 16 * i))) continue;
        for (int d = first; d < first + count; d++)
            if (!OK(dpar_buffer_read(dpar_array_shard(a, d), 0, mine, sizeof mine)) &&
                memcmp(mine, out + 16 * i, sizeof mine))
                FAIL("device %d's copy of %s differs from device 0's (%.9g vs %.9g)", d, name, (double)mine[0],
                     (double)out[16 * i]);
    }
}

int main(int argc, char **argv) {
    int prov, local = argc > 1 ? atoi(argv[1]) : 2;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm world = MPI_COMM_WORLD;
    dpar_runtime_desc rd = { .backend = getenv("DPAR_BACKEND") && *getenv("DPAR_BACKEND") ? DPAR_BACKEND_DEFAULT
                                                                                          : DPAR_BACKEND_CPU,
                             .num_devices = local,
                             .timeout_ms = 10000,
                             .mpi.comm = &world };
    dpar_runtime *rt = NULL;
    dpar_mesh *m = NULL;
    int n = 2 * local;
    dpar_mesh_desc md = { .ndim = 1, .shape = { n }, .axis_names = { "data" } };
    if (OK(dpar_runtime_create(&rd, &rt)) || OK(dpar_mesh_create(rt, &md, &m))) MPI_Abort(MPI_COMM_WORLD, 2);
    float w0[15], xs[4 * 4 * 3], loss;
    int32_t good[16], wrong[16];
    for (int i = 0; i < 15; i++) w0[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 12 * n; i++) xs[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
    for (int i = 0; i < 4 * n; i++) good[i] = wrong[i] = i % 5;
    wrong[4 * (n - 1) + 1] = 9; /* row 1 of the last device, rank 1's */
    char want[96];
    snprintf(want, sizeof want, "device %d (process 1): dpar_graph_run: node ", n - 1);
    dpar_array_desc wd = { DPAR_F32, 2, { 3, 5 }, { NULL } };
    for (int c = 0; c < 2 && !bad; c++) { /* c: SGD with momentum, loss read by the run, op by op; AdamW clipped,
                                              no read, recorded (Vulkan, CUDA) */
        setenv("DPAR_GRAPH_RECORD", c ? "1" : "0", 1);
        dpar_array *w[2] = { NULL, NULL };
        dpar_graph *g[2] = { NULL, NULL };
        dpar_value x[2], y[2];
        for (int j = 0; j < 2; j++)
            if (!OK(dpar_array_create(m, &wd, &w[j])) && !OK(dpar_array_put(w[j], w0)))
                g[j] = graph(m, w[j], c, &x[j], &y[j]);
        if (!g[0] || !g[1]) break;
        float before[48], after[48], ref[48];
        for (int j = 0; j < 2; j++)
            OK(dpar_graph_run(g[j], (dpar_graph_feed[]){ { x[j], xs, NULL }, { y[j], good, NULL } }, 2, &loss));
        state(rt, g[0], before);
        dpar_graph_feed f[2] = { { x[0], xs, NULL }, { y[0], rank == 1 ? wrong : good, NULL } };
        dpar_status s = dpar_graph_run(g[0], f, 2, c ? NULL : &loss);
        if (!s && c) s = dpar_graph_loss(g[0], &loss);
        const char *e = dpar_last_error();
        if (s != DPAR_ERR_INVALID_ARGUMENT || !strstr(e, want) || !strstr(e, "labels[1] = 9 is outside 0..4"))
            FAIL("case %d: the bad step returned %s: %s (want %s ...labels[1] = 9 is outside 0..4)", c,
                 dpar_status_string(s), s ? e : "", want);
        else
            printf("rank %d: case %d: %s\n", rank, c, e);
        state(rt, g[0], after);
        if (memcmp(before, after, sizeof before) || dpar_graph_step(g[0]) != 1)
            FAIL("case %d: the failed step changed the state (w[0] %.9g -> %.9g, state[0] %.9g -> %.9g) or the step "
                 "count (%lld; want 1)",
                 c, (double)before[0], (double)after[0], (double)before[16], (double)after[16],
                 (long long)dpar_graph_step(g[0]));
        for (int j = 0; j < 2; j++)
            OK(dpar_graph_run(g[j], (dpar_graph_feed[]){ { x[j], xs, NULL }, { y[j], good, NULL } }, 2, &loss));
        state(rt, g[0], after), state(rt, g[1], ref);
        if (memcmp(ref, after, sizeof ref))
            FAIL("case %d: the step after the failed one differs from a run without it", c);
        for (int j = 0; j < 2; j++) {
            if (g[j]) dpar_graph_destroy(g[j]);
            if (w[j]) dpar_array_destroy(w[j]);
        }
    }
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
    MPI_Finalize();
    if (!bad) printf("rank %d: ok\n", rank);
    return bad;
}
