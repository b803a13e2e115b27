/* The graph's gradient reductions overlap its backward pass, as the
   Perfetto trace shows (issue 12): an MLP with three 1 MiB weight gradients
   (above DPAR_GRAPH_ASYNC_BYTES' 256 KiB default, so reduced asynchronously)
   on 2 CPU devices is traced with dpar_trace_begin; the test reads the JSON
   back and requires, on each device's worker track and in every step, the
   backward ops that compute the next gradients between the hand-off of a
   reduction ("collective start") and the wait for it: the schedule overlaps
   them, whatever the scheduler then does (whether the threads really ran at
   once is timing, printed, not tested: a saturated or one-CPU machine may
   serialise them). With DPAR_GRAPH_ASYNC_BYTES above every gradient, no
   async event. */
#include "testutil.h"

enum { B = 64, D = 512, NL = 3, DEV = 2, STEPS = 3, MAXEV = 1 << 16 };

typedef struct ev {
    char cat[32];
    int tid;
    double ts, dur;
} ev;

/* The "X" events of the trace at path (one per line, as dpar writes them). */
static int read_events(const char *path, ev *out, int cap) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        char name[64];
        int pid;
        const char *p = strstr(line, "{\"ph\":\"X\"");
        if (p && sscanf(p,
                        "{\"ph\":\"X\",\"name\":\"%63[^\"]\",\"cat\":\"%31[^\"]\",\"pid\":%d,\"tid\":%d,\"ts\":%lf,"
                        "\"dur\":%lf",
                        name, out[n].cat, &pid, &out[n].tid, &out[n].ts, &out[n].dur) == 6)
            n++;
    }
    fclose(f);
    return n;
}
/* Ops of device d's worker track (tid d + 1) that run while an async
   collective of its communication track runs (their spans intersect):
   timing, printed only. */
static int overlapped_ops(const ev *e, int n, int d, int *asyncs) {
    int hits = 0;
    *asyncs = 0;
    for (int a = 0; a < n; a++) {
        if (strcmp(e[a].cat, "collective async") || e[a].tid != 100000 + d + 1) continue;
        ++*asyncs;
        for (int o = 0; o < n; o++)
            if (!strcmp(e[o].cat, "op") && e[o].tid == d + 1 && e[o].ts < e[a].ts + e[a].dur &&
                e[a].ts < e[o].ts + e[o].dur)
                hits++;
    }
    return hits;
}
static int by_ts(const void *a, const void *b) {
    double x = ((const ev *)a)->ts, y = ((const ev *)b)->ts;
    return (x > y) - (x < y);
}
/* Device d's worker track in time order (one thread: program order): the
   number of reductions handed off ("collective start") with at least one op
   run after the hand-off and before the worker next waits. Sets *starts to
   the number of hand-offs. */
static int overlapped_in_schedule(ev *e, int n, int d, int *starts) {
    qsort(e, (size_t)n, sizeof *e, by_ts);
    int fresh = 0, overlapped = 0; /* fresh: handed off, no op after it yet */
    *starts = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].tid != d + 1) continue;
        if (!strcmp(e[i].cat, "collective start"))
            fresh++, ++*starts;
        else if (!strcmp(e[i].cat, "wait"))
            fresh = 0;
        else if (!strcmp(e[i].cat, "op"))
            overlapped += fresh, fresh = 0;
    }
    return overlapped;
}
/* Builds and runs the MLP for STEPS traced steps; returns the events. */
static int traced_run(const char *path, ev *evs) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, DEV);
    dpar_mesh *m = t_mesh1(rt, DEV, "data");
    dpar_graph *g;
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc xd = { DPAR_F32, 2, { B * DEV, D }, { "data" } }, yd = { DPAR_I32, 1, { B * DEV }, { "data" } };
    dpar_value x = dpar_g_feed(g, "x", &xd), y = dpar_g_feed(g, "y", &yd), p[NL], gr[NL], h = x;
    dpar_array *w[NL];
    float *init = malloc((size_t)D * D * sizeof(float));
    for (int i = 0; i < D * D; i++) init[i] = (float)((i * 7919) % 1000 - 500) * 1e-4f;
    for (int l = 0; l < NL; l++) {
        dpar_array_desc wd = { DPAR_F32, 2, { D, D }, { NULL } };
        T_OK(dpar_array_create(m, &wd, &w[l]));
        T_OK(dpar_array_put(w[l], init));
        p[l] = dpar_g_param(g, "w", w[l]);
        h = dpar_g_matmul(g, h, p[l], false, false);
        if (l + 1 < NL) h = dpar_g_relu(g, h);
    }
    T_OK(dpar_graph_value_and_grad(g, dpar_g_softmax_xent(g, h, y), p, NL, gr));
    T_OK(dpar_graph_sgd(g, &(dpar_sgd_desc){ .learning_rate = 0.01f }, p, gr, NL));
    T_OK(dpar_graph_compile(g, NULL));
    float *xh = malloc((size_t)B * DEV * D * sizeof(float));
    int32_t yh[B * DEV];
    for (int i = 0; i < B * DEV * D; i++) xh[i] = (float)((i * 31) % 200 - 100) * 1e-2f;
    for (int i = 0; i < B * DEV; i++) yh[i] = i % D;
    T_OK(dpar_trace_begin(path));
    for (int s = 0; s < STEPS; s++) {
        dpar_graph_feed f[2] = { { x, xh, NULL }, { y, yh, NULL } };
        T_OK(dpar_graph_run(g, f, 2, NULL));
    }
    T_OK(dpar_trace_end());
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_runtime_destroy(rt));
    free(init);
    free(xh);
    return read_events(path, evs, MAXEV);
}

static void test_reductions_overlap_backward(void **st) {
    (void)st;
    char path[512];
    snprintf(path, sizeof path, "%s/dpar_test_graph_trace.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ev *evs = malloc(MAXEV * sizeof *evs);
    int n = traced_run(path, evs);
    for (int d = 0; d < DEV; d++) {
        int asyncs, starts, hits = overlapped_ops(evs, n, d, &asyncs);
        int sched = overlapped_in_schedule(evs, n, d, &starts);
        printf("device %d: %d reductions handed off, %d with ops before their wait, %d op(s) ran at once\n", d, starts,
               sched, hits);
        /* the first layer's gradient is the last: it may be reduced in line */
        assert_true(asyncs >= (NL - 1) * STEPS);
        assert_int_equal(starts, asyncs);
        /* every hand-off but the last of a step (the first layer's gradient, computed last) is followed by
           the backward ops of the layers below it before the wait */
        assert_true(sched >= (NL - 1) * STEPS);
    }
    /* all gradients below the threshold: reduced in line, nothing async */
    setenv("DPAR_GRAPH_ASYNC_BYTES", "1000000000", 1);
    n = traced_run(path, evs);
    unsetenv("DPAR_GRAPH_ASYNC_BYTES");
    for (int d = 0; d < DEV; d++) {
        int asyncs, starts;
        overlapped_ops(evs, n, d, &asyncs);
        overlapped_in_schedule(evs, n, d, &starts);
        assert_int_equal(asyncs, 0);
        assert_int_equal(starts, 0);
    }
    remove(path);
    free(evs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reductions_overlap_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
