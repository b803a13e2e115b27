/* Staged feeds (dpar_graph_put_feeds) and the loss left on the devices
   (dpar_graph_loss): a 4-device classifier trained for several steps on
   staged batches, each put while the previous step is in flight, gives bit
   for bit the losses and weights of plain runs with explicit feeds, on the
   CPU backend and on Vulkan; the losses logged on the devices
   (dpar_graph_log_losses) and read several steps at a time (dpar_graph_losses,
   the ring wrapped) are bit for bit each plain run's loss, on both backends;
   then every refusal of the staging and the logging API. */
#include "testutil.h"

enum { B = 8, F = 4, C = 3, STEPS = 6 };

typedef struct clf {
    dpar_array *w;
    dpar_graph *g;
    dpar_value x, y;
} clf;
/* softmax_xent(x [B,F] @ w [F,C], y [B] i32), SGD with momentum; batches split over "data". */
static void clf_build(dpar_mesh *m, clf *c) {
    float w0[F * C];
    for (int i = 0; i < F * C; i++) w0[i] = (float)((i * 5) % 7) / 7.0f - 0.4f;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 2, { F, C }, { NULL } }, &c->w));
    T_OK(dpar_array_put(c->w, w0));
    T_OK(dpar_graph_create(m, &c->g));
    c->x = dpar_g_feed(c->g, "x", &(dpar_array_desc){ DPAR_F32, 2, { B, F }, { "data" } });
    c->y = dpar_g_feed(c->g, "y", &(dpar_array_desc){ DPAR_I32, 1, { B }, { "data" } });
    dpar_value w = dpar_g_param(c->g, "w", c->w), gw;
    dpar_value loss = dpar_g_softmax_xent(c->g, dpar_g_matmul(c->g, c->x, w, false, false), c->y);
    T_OK(dpar_graph_value_and_grad(c->g, loss, &w, 1, &gw));
    dpar_sgd_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.learning_rate = 0.3f, sd.momentum = 0.9f;
    T_OK(dpar_graph_sgd(c->g, &sd, &w, &gw, 1));
}
static void clf_free(clf *c) {
    T_OK(dpar_graph_destroy(c->g));
    T_OK(dpar_array_destroy(c->w));
}
/* Every test's fixture: two classifiers a and b, built alike, on a runtime of n devices of backend k (the test
   is skipped where k is unavailable) and the mesh "data" over them. */
typedef struct fixture {
    dpar_runtime *rt;
    dpar_mesh *m;
    clf a, b;
} fixture;
static void fixture_open(fixture *f, dpar_backend_kind k, int n) {
    f->rt = t_runtime_or_skip(k, n);
    f->m = t_mesh1(f->rt, n, "data");
    clf_build(f->m, &f->a);
    clf_build(f->m, &f->b);
}
static void fixture_close(fixture *f) {
    clf_free(&f->a);
    clf_free(&f->b);
    T_OK(dpar_mesh_destroy(f->m));
    T_OK(dpar_runtime_destroy(f->rt));
}
/* Step s's batch: a different one every step, so a stale or swapped set changes the losses. */
static void batch(int s, float *x, int32_t *y) {
    for (int i = 0; i < B * F; i++) x[i] = (float)((i * 7 + s * 13) % 17) / 17.0f - 0.5f;
    for (int i = 0; i < B; i++) y[i] = (i + s) % C;
}

/* Plain runs (a) against staged ones (b): step s is started with dpar_graph_run_start on the set staged before,
   and step s+1's batch is put while it is in flight (the runtime refuses dpar_array_put then: that state, not
   timing, shows the put overlapped the step). Odd steps of b run blocking on what was staged. */
static void staged_equals_plain(dpar_backend_kind k) {
    fixture fx;
    fixture_open(&fx, k, 4);
    float x[B * F], la[STEPS], lb[STEPS], wa[F * C], wb[F * C], last = 0;
    int32_t y[B];
    batch(0, x, y);
    T_OK(dpar_graph_put_feeds(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, x, NULL }, { fx.b.y, y, NULL } }, 2));
    for (int s = 0; s < STEPS; s++) {
        batch(s, x, y);
        T_OK(dpar_graph_run(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, x, NULL }, { fx.a.y, y, NULL } }, 2, &la[s]));
        dpar_request *req = NULL;
        if (s % 2 == 0)
            T_OK(dpar_graph_run_start(fx.b.g, NULL, 0, &lb[s], &req));
        else
            T_OK(dpar_graph_run(fx.b.g, NULL, 0, &lb[s]));
        if (s + 1 < STEPS) {
            batch(s + 1, x, y);
            T_OK(dpar_graph_put_feeds(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, x, NULL }, { fx.b.y, y, NULL } }, 2));
            memset(x, 0, sizeof x); /* the put copied the data */
            memset(y, 0, sizeof y);
        }
        if (req) {
            /* the put above ran during the step: refused as in flight, or (still dispatching) as inside one */
            T_ERR(dpar_array_put(fx.a.w, wa), DPAR_ERR_STATE, "dpar_array_put: a ");
            /* the step in flight reads the rate: a new one is refused, not raced (the losses stay equal) */
            T_ERR(dpar_graph_set_lr(fx.b.g, 0.5f), DPAR_ERR_STATE, "dpar_graph_set_lr");
            T_OK(dpar_wait(NULL, req));
        }
        assert_memory_equal(&la[s], &lb[s], sizeof la[s]);
    }
    T_OK(dpar_graph_loss(fx.b.g, &last)); /* the last step's loss, left on the devices */
    assert_memory_equal(&last, &lb[STEPS - 1], sizeof last);
    T_OK(dpar_array_get(fx.a.w, wa));
    T_OK(dpar_array_get(fx.b.w, wb));
    assert_memory_equal(wa, wb, sizeof wa);
    fixture_close(&fx);
}
static void test_staged_equals_plain_cpu(void **state) {
    (void)state;
    staged_equals_plain(DPAR_BACKEND_CPU);
}
static void test_staged_equals_plain_vulkan(void **state) {
    (void)state;
    staged_equals_plain(DPAR_BACKEND_VULKAN);
}

/* Queued steps with no loss read, their losses logged in a ring of 4 and read 3, then 4 (wrapped), then 1 at a
   time: each one the plain run's loss of its step, bit for bit. */
static void logged_losses(dpar_backend_kind k) {
    fixture fx;
    fixture_open(&fx, k, 4);
    float x[B * F], la[STEPS], lb[STEPS];
    int32_t y[B];
    T_OK(dpar_graph_log_losses(fx.b.g, 4));
    for (int s = 0; s < STEPS; s++) {
        batch(s, x, y);
        T_OK(dpar_graph_run(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, x, NULL }, { fx.a.y, y, NULL } }, 2, &la[s]));
        T_OK(dpar_graph_put_feeds(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, x, NULL }, { fx.b.y, y, NULL } }, 2));
        T_OK(dpar_graph_run(fx.b.g, NULL, 0, NULL));
        if (s == 2) {
            T_OK(dpar_graph_losses(fx.b.g, lb, 3));
            assert_memory_equal(la, lb, 3 * sizeof *la);
        }
    }
    T_OK(dpar_graph_losses(fx.b.g, lb, 4)); /* steps 2..5: slots 2, 3, 0, 1 */
    assert_memory_equal(la + STEPS - 4, lb, 4 * sizeof *la);
    T_OK(dpar_graph_losses(fx.b.g, lb, 1));
    assert_memory_equal(la + STEPS - 1, lb, sizeof *la);
    T_ERR(dpar_graph_losses(fx.b.g, lb, 5), DPAR_ERR_INVALID_ARGUMENT, "5 losses asked for", "holds 4");
    fixture_close(&fx);
}
static void test_logged_losses_cpu(void **state) {
    (void)state;
    logged_losses(DPAR_BACKEND_CPU);
}
static void test_logged_losses_vulkan(void **state) {
    (void)state;
    logged_losses(DPAR_BACKEND_VULKAN);
}

/* Device arrays staged by reference, and runs with loss = NULL read later: the plain losses again. */
static void test_staged_arrays_and_late_loss(void **state) {
    (void)state;
    fixture fx;
    fixture_open(&fx, DPAR_BACKEND_CPU, 4);
    dpar_array *xa, *ya;
    T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_F32, 2, { B, F }, { "data" } }, &xa));
    T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_I32, 1, { B }, { "data" } }, &ya));
    float x[B * F], la = 0, lb = 0;
    int32_t y[B];
    for (int s = 0; s < 3; s++) {
        batch(s, x, y);
        T_OK(dpar_graph_run(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, x, NULL }, { fx.a.y, y, NULL } }, 2, &la));
        T_OK(dpar_array_put(xa, x));
        T_OK(dpar_array_put(ya, y));
        T_OK(dpar_graph_put_feeds(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, NULL, xa }, { fx.b.y, NULL, ya } }, 2));
        T_OK(dpar_graph_run(fx.b.g, NULL, 0, NULL));
        T_OK(dpar_graph_loss(fx.b.g, &lb));
        assert_memory_equal(&la, &lb, sizeof la);
    }
    fixture_close(&fx);
}

static void test_put_feeds_errors(void **state) {
    (void)state;
    fixture fx;
    fixture_open(&fx, DPAR_BACKEND_CPU, 2);
    float x[B * F], l = 0;
    int32_t y[B];
    batch(0, x, y);
    dpar_graph_feed f[2] = { { fx.a.x, x, NULL }, { fx.a.y, y, NULL } };
    T_ERR(dpar_graph_put_feeds(NULL, f, 2), DPAR_ERR_INVALID_ARGUMENT, "g is NULL");
    T_ERR(dpar_graph_put_feeds(fx.a.g, NULL, 2), DPAR_ERR_INVALID_ARGUMENT, "num_feeds = 2");
    T_ERR(dpar_graph_loss(fx.a.g, &l), DPAR_ERR_STATE, "not run yet");
    T_ERR(dpar_graph_loss(fx.a.g, NULL), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_graph_put_feeds(fx.a.g, f, 1), DPAR_ERR_INVALID_ARGUMENT, "'y'", "was not given");
    T_ERR(dpar_graph_put_feeds(fx.a.g, (dpar_graph_feed[]){ f[0], f[0] }, 2), DPAR_ERR_INVALID_ARGUMENT, "given twice");
    T_ERR(dpar_graph_put_feeds(fx.a.g, (dpar_graph_feed[]){ f[0], { { 1000 }, y, NULL } }, 2),
          DPAR_ERR_INVALID_ARGUMENT, "feeds[1] is not a feed");
    dpar_array *xi, *xs, *xr, *xo;
    T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_I32, 2, { B, F }, { "data" } }, &xi));
    T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_F32, 2, { B, F + 1 }, { "data" } }, &xs));
    T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_F32, 2, { B, F }, { NULL } }, &xr));
    T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_F32, 2, { B, F }, { "data" } }, &xo));
    T_ERR(dpar_graph_put_feeds(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, NULL, xi }, f[1] }, 2), DPAR_ERR_DTYPE, "'x'",
          "f32", "i32");
    T_ERR(dpar_graph_put_feeds(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, NULL, xs }, f[1] }, 2), DPAR_ERR_SHAPE, "[8, 4]",
          "[8, 5]");
    T_ERR(dpar_graph_put_feeds(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, NULL, xr }, f[1] }, 2), DPAR_ERR_INVALID_ARGUMENT,
          "sharded differently");
    T_ERR(dpar_graph_put_feeds(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, x, xo }, f[1] }, 2), DPAR_ERR_INVALID_ARGUMENT,
          "exactly one of host and array");
    /* staged twice without a run; a run with staged and explicit feeds (blocking or started) */
    T_OK(dpar_graph_put_feeds(fx.a.g, f, 2));
    T_ERR(dpar_graph_put_feeds(fx.a.g, f, 2), DPAR_ERR_STATE, "staged already");
    T_ERR(dpar_graph_run(fx.a.g, f, 2, &l), DPAR_ERR_INVALID_ARGUMENT, "staged by dpar_graph_put_feeds");
    dpar_request *req = NULL;
    T_ERR(dpar_graph_run_start(fx.a.g, f, 2, &l, &req), DPAR_ERR_INVALID_ARGUMENT, "staged by dpar_graph_put_feeds");
    assert_null(req);
    /* dropped: a run must name its feeds again */
    T_OK(dpar_graph_put_feeds(fx.a.g, NULL, 0));
    T_ERR(dpar_graph_run(fx.a.g, NULL, 0, &l), DPAR_ERR_INVALID_ARGUMENT, "was not given", "dpar_graph_put_feeds");
    /* a staged array destroyed before the run: refused, and the feeds stay staged until dropped */
    dpar_array *xd;
    T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_F32, 2, { B, F }, { "data" } }, &xd));
    T_OK(dpar_graph_put_feeds(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, NULL, xd }, f[1] }, 2));
    T_OK(dpar_array_destroy(xd));
    T_ERR(dpar_graph_run(fx.a.g, NULL, 0, &l), DPAR_ERR_STATE, "a feed's array");
    T_ERR(dpar_graph_put_feeds(fx.a.g, f, 2), DPAR_ERR_STATE, "staged already");
    T_OK(dpar_graph_put_feeds(fx.a.g, NULL, 0));
    /* a graph's first put while a step is in flight; the loss while in flight; a refused start keeps the stage */
    T_OK(dpar_graph_put_feeds(fx.a.g, f, 2));
    T_OK(dpar_graph_run_start(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, x, NULL }, { fx.b.y, y, NULL } }, 2, NULL, &req));
    T_ERR(dpar_graph_put_feeds(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, x, NULL }, { fx.b.y, y, NULL } }, 2),
          DPAR_ERR_STATE, "first put");
    T_ERR(dpar_graph_loss(fx.b.g, &l), DPAR_ERR_STATE, "in flight");
    dpar_request *req2 = NULL;
    T_ERR(dpar_graph_run_start(fx.a.g, NULL, 0, &l, &req2), DPAR_ERR_STATE, "in flight");
    T_OK(dpar_wait(NULL, req));
    T_OK(dpar_graph_run(fx.a.g, NULL, 0, &l)); /* what was staged before the refused start */
    float lc = 0;
    T_OK(dpar_graph_loss(fx.a.g, &lc));
    assert_memory_equal(&l, &lc, sizeof l);
    /* the loss log: refused arguments, no ring yet, in flight, restarted empty, stopped */
    T_ERR(dpar_graph_log_losses(NULL, 4), DPAR_ERR_INVALID_ARGUMENT, "g is NULL");
    T_ERR(dpar_graph_log_losses(fx.a.g, -1), DPAR_ERR_INVALID_ARGUMENT, "capacity -1");
    T_ERR(dpar_graph_losses(NULL, &l, 1), DPAR_ERR_INVALID_ARGUMENT, "g is NULL");
    T_ERR(dpar_graph_losses(fx.a.g, &l, 1), DPAR_ERR_INVALID_ARGUMENT, "no losses are logged", "dpar_graph_log_losses");
    T_OK(dpar_graph_log_losses(fx.a.g, 2));
    T_ERR(dpar_graph_losses(fx.a.g, &l, -1), DPAR_ERR_INVALID_ARGUMENT, "n = -1");
    T_ERR(dpar_graph_losses(fx.a.g, NULL, 1), DPAR_ERR_INVALID_ARGUMENT, "out NULL");
    T_ERR(dpar_graph_losses(fx.a.g, &l, 1), DPAR_ERR_INVALID_ARGUMENT, "holds 0", "0 runs logged");
    T_OK(dpar_graph_losses(fx.a.g, NULL, 0));
    T_OK(dpar_graph_run(fx.a.g, f, 2, &l));
    T_OK(dpar_graph_run_start(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, x, NULL }, { fx.b.y, y, NULL } }, 2, NULL, &req));
    T_ERR(dpar_graph_losses(fx.a.g, &lc, 1), DPAR_ERR_STATE, "dpar_graph_losses: ", "in flight");
    T_ERR(dpar_graph_log_losses(fx.a.g, 3), DPAR_ERR_STATE, "in flight");
    T_OK(dpar_wait(NULL, req));
    T_OK(dpar_graph_losses(fx.a.g, &lc, 1));
    assert_memory_equal(&l, &lc, sizeof l);
    T_OK(dpar_graph_log_losses(fx.a.g, 3)); /* a new ring: the run above is not in it */
    T_ERR(dpar_graph_losses(fx.a.g, &lc, 1), DPAR_ERR_INVALID_ARGUMENT, "holds 0");
    T_OK(dpar_graph_log_losses(fx.a.g, 0));
    T_ERR(dpar_graph_losses(fx.a.g, &lc, 1), DPAR_ERR_INVALID_ARGUMENT, "no losses are logged");
    /* a graph without a loss */
    dpar_graph *nl;
    T_OK(dpar_graph_create(fx.m, &nl));
    dpar_value nx = dpar_g_feed(nl, "x", &(dpar_array_desc){ DPAR_F32, 2, { B, F }, { "data" } });
    T_OK(dpar_graph_keep(nl, dpar_g_relu(nl, nx)));
    T_OK(dpar_graph_put_feeds(nl, (dpar_graph_feed[]){ { nx, x, NULL } }, 1));
    T_OK(dpar_graph_run(nl, NULL, 0, NULL));
    T_ERR(dpar_graph_loss(nl, &l), DPAR_ERR_INVALID_ARGUMENT, "no loss");
    T_ERR(dpar_graph_log_losses(nl, 4), DPAR_ERR_INVALID_ARGUMENT, "no loss");
    /* destroy with feeds staged and never run: freed with the graph (the leak check of CI sees it) */
    T_OK(dpar_graph_put_feeds(nl, (dpar_graph_feed[]){ { nx, x, NULL } }, 1));
    T_OK(dpar_graph_destroy(nl));
    T_OK(dpar_graph_put_feeds(fx.a.g, f, 2));
    fixture_close(&fx);
}

/* Two graphs logging at once, rings wrapping many times (capacities 3 and 5 over 23 steps), one of them also
   reading each step's loss: each ring holds its graph's last losses, bit for bit the plain reads; a new ring that
   cannot be made leaves the old one logging; an f64 loss is refused with DPAR_ERR_DTYPE. */
static void logged_losses_edges(dpar_backend_kind k) {
    enum { N = 23 };
    fixture fx;
    fixture_open(&fx, k, 4);
    float x[B * F], la[N], lr[5];
    int32_t y[B];
    T_OK(dpar_graph_log_losses(fx.a.g, 3));
    T_OK(dpar_graph_log_losses(fx.b.g, 5));
    for (int s = 0; s < N; s++) {
        batch(s, x, y);
        T_OK(dpar_graph_run(fx.a.g, (dpar_graph_feed[]){ { fx.a.x, x, NULL }, { fx.a.y, y, NULL } }, 2, &la[s]));
        T_OK(dpar_graph_run(fx.b.g, (dpar_graph_feed[]){ { fx.b.x, x, NULL }, { fx.b.y, y, NULL } }, 2, NULL));
    }
    T_OK(dpar_graph_losses(fx.a.g, lr, 3));
    assert_memory_equal(la + N - 3, lr, 3 * sizeof *la);
    T_OK(dpar_graph_losses(fx.b.g, lr, 5));
    assert_memory_equal(la + N - 5, lr, 5 * sizeof *la);
    T_OK(dpar_graph_log_losses(fx.a.g, 0));
    if (k == DPAR_BACKEND_CPU) { /* an f64 loss (f64 runs on the cpu backend only) */
        dpar_array *p;
        dpar_graph *g;
        double p0[4] = { 1, 2, 3, 4 };
        T_OK(dpar_array_create(fx.m, &(dpar_array_desc){ DPAR_F64, 1, { 4 }, { NULL } }, &p));
        T_OK(dpar_array_put(p, p0));
        T_OK(dpar_graph_create(fx.m, &g));
        dpar_value w = dpar_g_param(g, "w", p), dw;
        T_OK(dpar_graph_value_and_grad(g, dpar_g_sum(g, w), &w, 1, &dw));
        T_ERR(dpar_graph_log_losses(g, 4), DPAR_ERR_DTYPE, "f64", "dpar_graph_get");
        T_OK(dpar_graph_destroy(g));
        T_OK(dpar_array_destroy(p));
    } else { /* a ring too large for llvmpipe (the CPU backend would make its 8 GiB): refused, the old one kept */
        dpar_status s = dpar_graph_log_losses(fx.b.g, 0x7fffffff);
        if (s) {
            assert_int_equal(s, DPAR_ERR_OUT_OF_MEMORY);
            T_OK(dpar_graph_losses(fx.b.g, lr, 5));
            assert_memory_equal(la + N - 5, lr, 5 * sizeof *la);
        }
    }
    fixture_close(&fx);
}
static void test_logged_losses_edges_cpu(void **state) {
    (void)state;
    logged_losses_edges(DPAR_BACKEND_CPU);
}
static void test_logged_losses_edges_vulkan(void **state) {
    (void)state;
    logged_losses_edges(DPAR_BACKEND_VULKAN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staged_equals_plain_cpu),     cmocka_unit_test(test_staged_equals_plain_vulkan),
        cmocka_unit_test(test_logged_losses_cpu),           cmocka_unit_test(test_logged_losses_vulkan),
        cmocka_unit_test(test_logged_losses_edges_cpu),     cmocka_unit_test(test_logged_losses_edges_vulkan),
        cmocka_unit_test(test_staged_arrays_and_late_loss), cmocka_unit_test(test_put_feeds_errors),
    };
    return cmocka_run_group_tests_name("graph_async", tests, NULL, NULL);
}
