/* Object lifetimes and threads (issue 15, "Lifetimes" and "Silent wrong
   results"): no public call reaches freed memory. Destroys during a dispatch
   from another thread, stale contexts and handles, every parent/child destroy
   order, 1,000 create/destroy cycles with helpers left alive, ops on another
   device's buffer, host transfers during a dispatch, a data-parallel step
   never finished, and the range checks of the MPI environment variables.
   Run under ASan/LSan and TSan by CI (make SAN=address|thread test): a freed
   object reached, a leak or a race fails there. CPU backend, 2 devices (1
   where a 1-device runtime's dispatch on the calling thread is tested). */
#include "testutil.h"
#include "util/dpar_train.h"
#include <pthread.h>
#include <sched.h>

static dpar_mesh *mesh2(dpar_runtime *rt) {
    return t_mesh1(rt, 2, "data");
}
static dpar_array *arr(dpar_mesh *m, const char *spec) {
    dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 1, .shape = { 4 }, .spec = { spec } };
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &ad, &a));
    return a;
}

/* ---- destroy and host calls from another thread while a dispatch runs ---- */
typedef struct hold_job {
    int started, release; /* atomic */
} hold_job;
static dpar_status hold(dpar_ctx *ctx, void *user) {
    hold_job *j = (hold_job *)user;
    if (dpar_ctx_device(ctx) != 0) return DPAR_OK;
    /* a clip first: its scratch, kept by device 0, is live under the destroys refused meanwhile */
    dpar_sgd_desc sd = { .learning_rate = 1.0f, .clip_norm = 1.0f };
    dpar_buffer *g = NULL;
    int64_t four = 4;
    float scale = 0.0f;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &g);
    if (!s) s = dpar_fill(g, 1.0f);
    if (!s) s = dpar_sgd_clip_scale(ctx, &sd, &g, 1, &scale, NULL);
    dpar_buffer_destroy(g);
    __atomic_store_n(&j->started, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&j->release, __ATOMIC_ACQUIRE)) sched_yield();
    return s ? s : scale == 0.5f ? DPAR_OK : DPAR_ERR_BACKEND; /* norm 2 */
}
typedef struct dispatcher {
    dpar_mesh *m;
    hold_job job;
    dpar_status status;
} dispatcher;
static void *dispatch_thread(void *arg) {
    dispatcher *d = (dispatcher *)arg;
    dpar_shard_map_desc sd = { .fn = hold, .user = &d->job };
    d->status = dpar_shard_map(d->m, &sd);
    return NULL;
}
static void test_destroy_during_dispatch(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dpar_array *a = arr(m, "data");
    dpar_buffer *b = NULL;
    int64_t four = 4;
    T_OK(dpar_buffer_create(rt, 1, DPAR_F32, 1, &four, &b));
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dispatcher d = { .m = m };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, dispatch_thread, &d), 0);
    while (!__atomic_load_n(&d.job.started, __ATOMIC_ACQUIRE)) sched_yield();
    float h[4] = { 1, 2, 3, 4 };
    /* each is refused, and nothing is freed under the running dispatch */
    T_ERR(dpar_mesh_destroy(m), DPAR_ERR_STATE, "dpar_mesh_destroy", "another thread");
    T_ERR(dpar_runtime_destroy(rt), DPAR_ERR_STATE, "dpar_runtime_destroy", "another thread");
    T_ERR(dpar_array_destroy(a), DPAR_ERR_STATE, "dpar_array_destroy", "another thread");
    T_ERR(dpar_graph_destroy(g), DPAR_ERR_STATE, "dpar_graph_destroy");
    T_ERR(dpar_buffer_destroy(b), DPAR_ERR_STATE, "dpar_buffer_destroy", "running");
    T_ERR(dpar_array_get(a, h), DPAR_ERR_STATE, "dpar_array_get", "running");
    T_ERR(dpar_array_put(a, h), DPAR_ERR_STATE, "dpar_array_put", "running");
    T_ERR(dpar_fill(b, 1.0f), DPAR_ERR_STATE, "dpar_fill", "running");
    T_ERR(dpar_buffer_write(b, 0, h, sizeof h), DPAR_ERR_STATE, "dpar_buffer_write", "running");
    __atomic_store_n(&d.job.release, 1, __ATOMIC_RELEASE);
    assert_int_equal(pthread_join(th, NULL), 0);
    T_OK(d.status);
    /* after the dispatch, the same calls work */
    T_OK(dpar_array_put(a, h));
    float back[4] = { 0 };
    T_OK(dpar_array_get(a, back));
    assert_memory_equal(back, h, sizeof h);
    T_OK(dpar_fill(b, 1.0f));
    T_OK(dpar_buffer_destroy(b));
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_array_destroy(a));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- a ctx kept after its dispatch, or used on another thread ---- */
typedef struct ctx_job {
    dpar_ctx *saved[2];
    dpar_status other_thread_status;
    int other_thread_device;
} ctx_job;
static dpar_status keep_ctx(dpar_ctx *ctx, void *user) {
    ctx_job *j = (ctx_job *)user;
    j->saved[dpar_ctx_position(ctx)] = ctx;
    return DPAR_OK;
}
static void *use_ctx_thread(void *arg) {
    void **p = (void **)arg;
    dpar_ctx *ctx = (dpar_ctx *)p[0];
    ctx_job *j = (ctx_job *)p[1];
    int n = 0;
    j->other_thread_device = dpar_ctx_device(ctx);
    j->other_thread_status = dpar_ctx_axis_size(ctx, "data", &n);
    return NULL;
}
static dpar_status ctx_on_thread(dpar_ctx *ctx, void *user) {
    if (dpar_ctx_device(ctx) != 0) return DPAR_OK;
    void *args[2] = { ctx, user };
    pthread_t th;
    if (pthread_create(&th, NULL, use_ctx_thread, args)) return DPAR_ERR_BACKEND;
    pthread_join(th, NULL);
    return DPAR_OK;
}
static dpar_status use_old_ctx(dpar_ctx *ctx, void *user) {
    ctx_job *j = (ctx_job *)user;
    dpar_ctx *old = j->saved[1 - dpar_ctx_position(ctx)]; /* the other device's, never this call's own */
    int k = 0;
    if (old == ctx) return DPAR_OK; /* the allocator gave this ctx that address: nothing stale to test */
    if (dpar_ctx_axis_index(old, "data", &k) != DPAR_ERR_STATE) return DPAR_ERR_BACKEND;
    return DPAR_OK;
}
static void test_stale_ctx(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    ctx_job j;
    memset(&j, 0, sizeof j);
    dpar_shard_map_desc sd = { .fn = keep_ctx, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    dpar_ctx *c = j.saved[0];
    assert_non_null(c);
    /* after the dispatch: refused without reading the freed ctx */
    assert_int_equal(dpar_ctx_device(c), -1);
    assert_int_equal(dpar_ctx_position(c), -1);
    assert_null(dpar_ctx_mesh(c));
    assert_null(dpar_ctx_runtime(c));
    assert_int_equal((int)dpar_ctx_dispatch_id(c), 0);
    assert_null(dpar_ctx_arg(c, 0));
    int k = 0;
    T_ERR(dpar_ctx_axis_index(c, "data", &k), DPAR_ERR_STATE, "dpar_ctx_axis_index", "valid only inside");
    dpar_buffer *b = NULL;
    T_ERR(dpar_ctx_buffer(c, DPAR_F32, 0, NULL, &b), DPAR_ERR_STATE, "dpar_ctx_buffer");
    assert_null(b);
    T_ERR(dpar_psum(c, NULL, NULL, "data"), DPAR_ERR_STATE, "dpar_psum");
    dpar_request *req = NULL;
    T_ERR(dpar_psum_start(c, NULL, NULL, "data", &req), DPAR_ERR_STATE, "dpar_psum_start");
    T_ERR(dpar_ctx_at_exit(c, NULL, NULL), DPAR_ERR_STATE, "dpar_ctx_at_exit");
    T_ERR(dpar_psum(NULL, NULL, NULL, "data"), DPAR_ERR_INVALID_ARGUMENT, "ctx is NULL");
    /* in a later dispatch, the old ctx is refused too */
    sd.fn = use_old_ctx;
    T_OK(dpar_shard_map(m, &sd));
    /* the ctx of a running fn, used on a thread fn started */
    sd.fn = ctx_on_thread;
    T_OK(dpar_shard_map(m, &sd));
    assert_int_equal(j.other_thread_device, -1);
    assert_int_equal(j.other_thread_status, DPAR_ERR_STATE);
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- ops and buffer I/O on another device's shard from a worker ---- */
static dpar_status touch_other(dpar_ctx *ctx, void *user) {
    dpar_array *a = (dpar_array *)user;
    int me = dpar_ctx_device(ctx);
    dpar_buffer *mine = dpar_array_shard(a, me), *other = dpar_array_shard(a, 1 - me);
    float v[2] = { 0, 0 };
    T_ERR(dpar_fill(other, 5.0f), DPAR_ERR_STATE, "dpar_fill", "device");
    T_ERR(dpar_axpy(other, 1.0f, other), DPAR_ERR_STATE, "dpar_axpy");
    T_ERR(dpar_buffer_read(other, 0, v, sizeof v), DPAR_ERR_STATE, "dpar_buffer_read");
    T_ERR(dpar_buffer_write(other, 0, v, sizeof v), DPAR_ERR_STATE, "dpar_buffer_write");
    void *p = NULL;
    T_ERR(dpar_buffer_map(other, 0, 4, true, &p), DPAR_ERR_STATE, "dpar_buffer_map");
    T_ERR(dpar_array_get(a, v), DPAR_ERR_STATE, "dpar_array_get"); /* host transfers: between dispatches */
    dpar_buffer *tmp = NULL;
    int64_t one = 1;
    T_OK(dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &tmp)); /* its own buffers: created and freed inside fn */
    T_OK(dpar_buffer_destroy(tmp));
    return dpar_fill(mine, (float)(me + 1)); /* its own shard: allowed */
}
static void test_op_on_other_device(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dpar_array *a = arr(m, "data");
    dpar_shard_map_desc sd = { .fn = touch_other, .user = a };
    T_OK(dpar_shard_map(m, &sd));
    float h[4];
    T_OK(dpar_array_get(a, h));
    const float want[4] = { 1, 1, 2, 2 }; /* each device wrote only its own shard */
    assert_memory_equal(h, want, sizeof want);
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- handles used after they were destroyed ---- */
static dpar_status nop(dpar_ctx *ctx, void *user) {
    (void)ctx;
    (void)user;
    return DPAR_OK;
}
static void test_stale_handles(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dpar_array *a = arr(m, NULL);
    T_OK(dpar_array_destroy(a));
    T_ERR(dpar_array_destroy(a), DPAR_ERR_STATE, "dpar_array_destroy", "stale");
    float h[4] = { 0 };
    T_ERR(dpar_array_get(a, h), DPAR_ERR_STATE, "dpar_array_get", "stale");
    T_ERR(dpar_array_put(a, h), DPAR_ERR_STATE, "dpar_array_put", "stale");
    dpar_shard_map_desc sd = { .fn = nop, .args = { a } };
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_STATE, "dpar_shard_map", "stale");
    dpar_buffer *b = NULL;
    int64_t one = 1;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &one, &b));
    T_OK(dpar_buffer_destroy(b));
    T_ERR(dpar_buffer_destroy(b), DPAR_ERR_STATE, "dpar_buffer_destroy", "stale");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    T_OK(dpar_graph_destroy(g));
    T_ERR(dpar_graph_destroy(g), DPAR_ERR_STATE, "stale");
    T_ERR(dpar_graph_run(g, NULL, 0, NULL), DPAR_ERR_STATE, "dpar_graph_run", "stale");
    T_OK(dpar_mesh_destroy(m));
    T_ERR(dpar_mesh_destroy(m), DPAR_ERR_STATE, "dpar_mesh_destroy", "stale");
    sd.args[0] = NULL;
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_STATE, "dpar_shard_map", "stale");
    T_ERR(dpar_array_create(m, &(dpar_array_desc){ .dtype = DPAR_F32 }, &a), DPAR_ERR_STATE, "dpar_array_create");
    T_ERR(dpar_graph_create(m, &g), DPAR_ERR_STATE, "dpar_graph_create");
    T_OK(dpar_runtime_destroy(rt));
    T_ERR(dpar_runtime_destroy(rt), DPAR_ERR_STATE, "dpar_runtime_destroy", "stale");
    T_ERR(dpar_buffer_create(rt, 0, DPAR_F32, 1, &one, &b), DPAR_ERR_STATE, "dpar_buffer_create");
    T_ERR(dpar_mesh_create(rt, &(dpar_mesh_desc){ .shape = { 1 }, .axis_names = { "x" } }, &m), DPAR_ERR_STATE,
          "dpar_mesh_create");
}

/* ---- stale handles given as arguments: ops, collectives, buffer I/O, getters ---- */
#define STALE(call, fn, arg) T_ERR(call, DPAR_ERR_STATE, fn ": " arg, "stale")
/* Inside fn: a buffer used, destroyed, then used again by the same worker (its
   memo of live buffers must forget it), and collectives given a stale buffer. */
static dpar_status use_after_destroy(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *t = NULL, *u = NULL;
    int64_t four = 4;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &t);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &u);
    if (!s) s = dpar_fill(t, 1.0f);
    if (!s) s = dpar_copy(u, t);
    if (!s) s = dpar_buffer_destroy(t);
    if (s) return s;
    if (dpar_fill(t, 2.0f) != DPAR_ERR_STATE || !strstr(dpar_last_error(), "dpar_fill: x is a stale"))
        return dpar_set_last_error(DPAR_ERR_BACKEND, "fill of a freed buffer: %s", dpar_last_error());
    if (dpar_copy(u, t) != DPAR_ERR_STATE || !strstr(dpar_last_error(), "dpar_copy: src is a stale buffer"))
        return dpar_set_last_error(DPAR_ERR_BACKEND, "copy from a freed buffer: %s", dpar_last_error());
    if (dpar_psum(ctx, u, t, "data") != DPAR_ERR_STATE || !strstr(dpar_last_error(), "dpar_psum: in is a stale"))
        return dpar_set_last_error(DPAR_ERR_BACKEND, "psum of a freed buffer: %s", dpar_last_error());
    dpar_request *r = NULL;
    if (dpar_all_gather_start(ctx, t, u, "data", 0, true, &r) != DPAR_ERR_STATE ||
        !strstr(dpar_last_error(), "dpar_all_gather_start: out is a stale"))
        return dpar_set_last_error(DPAR_ERR_BACKEND, "all_gather into a freed buffer: %s", dpar_last_error());
    if (dpar_buffer_count(t) != 0 || !strstr(dpar_last_error(), "dpar_buffer_count: b is a stale"))
        return dpar_set_last_error(DPAR_ERR_BACKEND, "count of a freed buffer: %s", dpar_last_error());
    s = dpar_psum(ctx, u, u, "data"); /* the live one still works, on both devices */
    return s ? s : dpar_buffer_destroy(u);
}
static void test_stale_arguments(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    int64_t four = 4;
    dpar_buffer *b = NULL, *live = NULL;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &four, &b));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &four, &live));
    T_OK(dpar_buffer_destroy(b));
    float h[4] = { 0 };
    /* ops from the host thread, the stale buffer in each position */
    STALE(dpar_fill(b, 1.0f), "dpar_fill", "x is");
    STALE(dpar_copy(b, live), "dpar_copy", "dst is");
    STALE(dpar_copy(live, b), "dpar_copy", "src is");
    STALE(dpar_cast(live, b), "dpar_cast", "src is");
    STALE(dpar_axpy(live, 2.0f, b), "dpar_axpy", "x");
    STALE(dpar_binary(live, live, b, DPAR_BINARY_ADD), "dpar_binary", "b");
    STALE(dpar_sum(live, b), "dpar_sum", "x");
    STALE(dpar_relu(live, b), "dpar_relu", "x");
    STALE(dpar_relu_backward(live, live, b), "dpar_relu_backward", "x is"); /* was "operand 1" */
    /* buffer I/O and getters */
    STALE(dpar_buffer_write(b, 0, h, 4), "dpar_buffer_write", "b");
    STALE(dpar_buffer_read(b, 0, h, 4), "dpar_buffer_read", "b");
    void *ptr = NULL;
    STALE(dpar_buffer_map(b, 0, 4, true, &ptr), "dpar_buffer_map", "b");
    STALE(dpar_buffer_unmap(b, 0, 4, false), "dpar_buffer_unmap", "b");
    STALE(dpar_buffer_reshape(b, 1, &four), "dpar_buffer_reshape", "b");
    assert_int_equal(dpar_buffer_count(b), 0);
    assert_int_equal(dpar_buffer_device(b), -1);
    assert_int_equal(dpar_buffer_dtype(b), DPAR_DTYPE_COUNT);
    assert_non_null(strstr(dpar_last_error(), "dpar_buffer_dtype: b is a stale buffer"));
    dpar_vulkan_export ex;
    STALE(dpar_vulkan_buffer_export(b, &ex), "dpar_vulkan_buffer_export", "b");
    /* inside fn: a worker's own buffer freed, then used */
    dpar_shard_map_desc sd = { .fn = use_after_destroy };
    T_OK(dpar_shard_map(m, &sd));
    /* arrays, meshes, runtimes, graphs */
    dpar_array *a = arr(m, "data"), *keep = arr(m, "data");
    T_OK(dpar_array_destroy(a));
    assert_null(dpar_array_shard(a, 0));
    assert_non_null(strstr(dpar_last_error(), "dpar_array_shard: a is a stale array"));
    assert_int_equal(dpar_array_ndim(a), -1);
    assert_null(dpar_array_mesh(a));
    int64_t begin, count;
    STALE(dpar_array_local_rows(a, &begin, &count), "dpar_array_local_rows", "a");
    char spec[16];
    STALE(dpar_array_spec(a, 0, spec, sizeof spec), "dpar_array_spec", "a");
    STALE(dpar_array_reshard(keep, a), "dpar_array_reshard", "src");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    assert_int_equal(dpar_g_param(g, "w", a).id, 0);
    T_ERR(dpar_graph_status(g), DPAR_ERR_STATE, "dpar_g_param: a is a stale array");
    T_OK(dpar_graph_destroy(g));
    assert_int_equal(dpar_graph_step(g), -1);
    STALE(dpar_graph_set_step(g, 1), "dpar_graph_set_step", "g");
    STALE(dpar_graph_set_lr(g, 0.1f), "dpar_graph_set_lr", "g");
    int n = 0;
    STALE(dpar_graph_state_count(g, &n), "dpar_graph_state_count", "g");
    T_OK(dpar_mesh_destroy(m));
    assert_int_equal(dpar_mesh_size(m), 0);
    assert_null(dpar_mesh_axis_name(m, 0));
    STALE(dpar_mesh_axis_size(m, "data", &n), "dpar_mesh_axis_size", "m");
    int coords[1] = { 0 }, dev = 0, members[2];
    STALE(dpar_mesh_device(m, coords, &dev), "dpar_mesh_device", "m");
    STALE(dpar_mesh_group(m, "data", 0, members, &n, NULL), "dpar_mesh_group", "m");
    T_ERR(dpar_array_get(keep, h), DPAR_ERR_STATE, "dpar_array_get", "stale"); /* freed with its mesh */
    T_OK(dpar_runtime_destroy(rt));
    assert_int_equal(dpar_runtime_device_count(rt), 0);
    assert_non_null(strstr(dpar_last_error(), "dpar_runtime_device_count: rt is a stale runtime"));
    dpar_device_info info;
    STALE(dpar_runtime_device_info(rt, 0, &info), "dpar_runtime_device_info", "rt");
    STALE(dpar_runtime_device_sync(rt, 0), "dpar_runtime_device_sync", "rt");
    STALE(dpar_fill(live, 1.0f), "dpar_fill", "x is"); /* freed with its runtime */
}

/* ---- a stale handle whose address a new object of its kind could take ---- */
static void test_address_not_reused(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    int64_t four = 4;
    dpar_buffer *b = NULL, *nb[100];
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &four, &b));
    T_OK(dpar_buffer_destroy(b));
    for (int i = 0; i < 100; i++) { /* malloc would hand b's block to the first of them */
        T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &four, &nb[i]));
        assert_ptr_not_equal(nb[i], b);
    }
    T_ERR(dpar_fill(b, 1.0f), DPAR_ERR_STATE, "dpar_fill", "stale");
    T_ERR(dpar_buffer_destroy(b), DPAR_ERR_STATE, "dpar_buffer_destroy", "stale");
    for (int i = 0; i < 100; i++) T_OK(dpar_buffer_destroy(nb[i]));
    dpar_array *a = arr(m, NULL);
    T_OK(dpar_array_destroy(a));
    dpar_array *a2 = arr(m, NULL), *a3 = arr(m, "data");
    assert_true(a2 != a && a3 != a);
    float h[4];
    T_ERR(dpar_array_get(a, h), DPAR_ERR_STATE, "dpar_array_get", "stale");
    dpar_graph *g = NULL, *g2 = NULL;
    T_OK(dpar_graph_create(m, &g));
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_graph_create(m, &g2));
    assert_ptr_not_equal(g2, g);
    T_ERR(dpar_graph_destroy(g), DPAR_ERR_STATE, "dpar_graph_destroy", "stale");
    dpar_mesh *m2 = mesh2(rt);
    T_OK(dpar_mesh_destroy(m2));
    dpar_mesh *m3 = mesh2(rt);
    assert_ptr_not_equal(m3, m2);
    T_ERR(dpar_mesh_destroy(m2), DPAR_ERR_STATE, "dpar_mesh_destroy", "stale");
    T_OK(dpar_runtime_destroy(rt)); /* the last object: the live set is empty now */
    dpar_runtime *rt2 = t_runtime(DPAR_BACKEND_CPU, 1);
    assert_ptr_not_equal(rt2, rt);
    T_ERR(dpar_runtime_destroy(rt), DPAR_ERR_STATE, "dpar_runtime_destroy", "stale");
    T_ERR(dpar_mesh_destroy(m), DPAR_ERR_STATE, "dpar_mesh_destroy", "stale");
    T_OK(dpar_runtime_destroy(rt2));
}

/* ---- every parent/child destroy order ---- */
enum { O_RT, O_MESH, O_ARRAY, O_BUFFER, O_GRAPH, O_ZERO1, O_DP, O_COUNT };
typedef struct family {
    dpar_runtime *rt;
    dpar_mesh *m;
    dpar_array *a, *p, *grad;
    dpar_buffer *b;
    dpar_graph *g;
    dpar_zero1 *z;
    dpar_dp *dp;
} family;
static dpar_status dp_and_zero1_step(dpar_ctx *ctx, void *user) {
    family *f = (family *)user;
    dpar_status s = dpar_dp_allreduce(f->dp, ctx);
    dpar_buffer *gr = dpar_array_shard(f->grad, dpar_ctx_device(ctx));
    return s ? s : dpar_zero1_step(ctx, f->z, &gr);
}
/* A runtime with one of each child, each used once (so each has allocated what it lazily allocates). */
static void family_make(family *f) {
    memset(f, 0, sizeof *f);
    f->rt = t_runtime(DPAR_BACKEND_CPU, 2);
    f->m = mesh2(f->rt);
    f->a = arr(f->m, "data");
    f->p = arr(f->m, NULL);
    f->grad = arr(f->m, NULL);
    int64_t four = 4;
    T_OK(dpar_buffer_create(f->rt, 1, DPAR_F32, 1, &four, &f->b));
    T_OK(dpar_graph_create(f->m, &f->g));
    dpar_value w = dpar_g_param(f->g, "w", f->p);
    dpar_value loss = dpar_g_sum_squares(f->g, w), dw;
    T_OK(dpar_graph_value_and_grad(f->g, loss, &w, 1, &dw));
    float l = -1.0f;
    T_OK(dpar_graph_run(f->g, NULL, 0, &l));
    dpar_zero1_desc zd = { .sgd = { .learning_rate = 0.1f, .momentum = 0.9f }, .num_params = 1, .params = { f->p } };
    T_OK(dpar_zero1_create(&zd, &f->z));
    dpar_dp_desc dd = { .axes = "data" };
    T_OK(dpar_dp_create(f->m, &dd, &f->dp));
    T_OK(dpar_dp_add(f->dp, f->grad, NULL));
    dpar_shard_map_desc sd = { .fn = dp_and_zero1_step, .user = f };
    T_OK(dpar_shard_map(f->m, &sd));
}
static dpar_status family_destroy(family *f, int which) {
    switch (which) {
    case O_RT: return dpar_runtime_destroy(f->rt);
    case O_MESH: return dpar_mesh_destroy(f->m);
    case O_ARRAY: return dpar_array_destroy(f->a);
    case O_BUFFER: return dpar_buffer_destroy(f->b);
    case O_GRAPH: return dpar_graph_destroy(f->g);
    case O_ZERO1: return dpar_zero1_destroy(f->z);
    default: return dpar_dp_destroy(f->dp);
    }
}
/* Destroys in order[0..n): each call is DPAR_OK when none of its parents went
   before, else DPAR_ERR_STATE (stale: freed with the parent); then whatever is
   left goes with the runtime. ASan/LSan: no use after free, no double free, no leak. */
static void run_order(const int *order, int n) {
    family f;
    family_make(&f);
    int gone[O_COUNT] = { 0 };
    for (int i = 0; i < n; i++) {
        int w = order[i];
        int parent_gone = gone[O_RT] || (w != O_RT && w != O_BUFFER && w != O_MESH && gone[O_MESH]);
        dpar_status s = family_destroy(&f, w);
        if (parent_gone || gone[w])
            T_ERR(s, DPAR_ERR_STATE, "stale");
        else if (s != DPAR_OK)
            fail_msg("destroy %d at step %d: %s: %s", w, i, dpar_status_string(s), dpar_last_error());
        gone[w] = 1;
    }
    if (!gone[O_RT]) T_OK(dpar_runtime_destroy(f.rt));
}
static void test_destroy_orders(void **state) {
    (void)state;
    /* every order of runtime, mesh and each child */
    for (int c = O_ARRAY; c < O_COUNT; c++) {
        const int three[6][3] = { { O_RT, O_MESH, c }, { O_RT, c, O_MESH }, { O_MESH, O_RT, c },
                                  { O_MESH, c, O_RT }, { c, O_RT, O_MESH }, { c, O_MESH, O_RT } };
        for (int k = 0; k < 6; k++) run_order(three[k], 3);
    }
    /* all seven in pseudo-random orders (fixed seed), and each object destroyed twice */
    uint32_t seed = 12345u;
    for (int r = 0; r < 12; r++) {
        int order[2 * O_COUNT];
        for (int i = 0; i < O_COUNT; i++) order[i] = order[i + O_COUNT] = i;
        for (int i = 2 * O_COUNT - 1; i > 0; i--) {
            seed = seed * 1664525u + 1013904223u;
            int j = (int)((seed >> 8) % (uint32_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        run_order(order, 2 * O_COUNT);
    }
}

/* ---- 1,000 create/destroy cycles with helpers left alive ---- */
static int released; /* by the attached object's release hook */
static void count_release(void *obj) {
    released++;
    free(obj);
}
static void test_cycles_helpers_left_alive(void **state) {
    (void)state;
    dpar_runtime *rt = NULL;
    int attached = 0;
    released = 0;
    for (int i = 0; i < 1000; i++) {
        if (i % 50 == 0) {
            if (rt) T_OK(dpar_runtime_destroy(rt)); /* leftover meshes, helpers, graphs, arrays, buffers */
            rt = t_runtime(DPAR_BACKEND_CPU, 2);
        }
        dpar_mesh *m = mesh2(rt);
        dpar_array *p = arr(m, NULL);
        dpar_zero1 *z = NULL;
        dpar_zero1_desc zd = { .sgd = { .learning_rate = 0.1f, .momentum = 0.5f }, .num_params = 1, .params = { p } };
        T_OK(dpar_zero1_create(&zd, &z));
        dpar_dp *dp = NULL;
        dpar_dp_desc dd = { .axes = "data" };
        T_OK(dpar_dp_create(m, &dd, &dp));
        T_OK(dpar_dp_add(dp, p, NULL));
        dpar_graph *g = NULL;
        T_OK(dpar_graph_create(m, &g));
        dpar_g_param(g, "w", p);
        void *mine = malloc(16);
        T_OK(dpar_handle_attach(m, mine, count_release));
        attached++;
        dpar_buffer *b = NULL;
        int64_t n = 8;
        T_OK(dpar_buffer_create(rt, i % 2, DPAR_F32, 1, &n, &b));
        if (i % 3 == 0) T_OK(dpar_mesh_destroy(m)); /* else left for the runtime */
        if (i % 3 == 0) T_ERR(dpar_zero1_destroy(z), DPAR_ERR_STATE, "stale");
        if (i % 3 == 1) T_OK(dpar_dp_destroy(dp)); /* a child destroyed on its own, then the rest with the runtime */
    }
    T_OK(dpar_runtime_destroy(rt));
    assert_int_equal(released, attached); /* each release hook ran exactly once */
}

/* ---- a destroy that succeeds keeps the last error; a second destroy fails ---- */
static const char *const kept = "user_step: an earlier failure the caller is about to print";
/* Sets the last error, runs a destroy that must succeed, and checks the text survived. */
#define KEEPS(call)                                                                                  \
    do {                                                                                             \
        (void)dpar_set_last_error(DPAR_ERR_SHAPE, "%s", kept);                                       \
        T_OK(call);                                                                                  \
        if (strcmp(dpar_last_error(), kept) != 0)                                                    \
            fail_msg("%s succeeded but changed the last error to \"%s\"", #call, dpar_last_error()); \
    } while (0)
static void test_destroy_keeps_error(void **state) {
    (void)state;
    family f;
    family_make(&f); /* each child used once: their destroys free what they allocated lazily */
    KEEPS(dpar_dp_destroy(f.dp));
    KEEPS(dpar_zero1_destroy(f.z));
    KEEPS(dpar_graph_destroy(f.g));
    KEEPS(dpar_array_destroy(f.a));
    KEEPS(dpar_buffer_destroy(f.b));
    KEEPS(dpar_buffer_destroy(NULL));
    KEEPS(dpar_mesh_destroy(f.m)); /* with its arrays p and grad */
    KEEPS(dpar_runtime_destroy(f.rt));
    /* parents that free children still alive: the children's frees keep it too */
    family_make(&f);
    KEEPS(dpar_mesh_destroy(f.m));
    KEEPS(dpar_runtime_destroy(f.rt));
    family_make(&f);
    KEEPS(dpar_runtime_destroy(f.rt));
    /* every type destroyed twice: the second call is refused (stale) and says so */
    family_make(&f);
    dpar_array *a2 = arr(f.m, NULL);
    dpar_buffer *b2 = NULL;
    int64_t one = 1;
    T_OK(dpar_buffer_create(f.rt, 0, DPAR_F32, 1, &one, &b2));
    T_OK(dpar_dp_destroy(f.dp));
    T_ERR(dpar_dp_destroy(f.dp), DPAR_ERR_STATE, "dpar_dp_destroy", "stale");
    T_OK(dpar_zero1_destroy(f.z));
    T_ERR(dpar_zero1_destroy(f.z), DPAR_ERR_STATE, "dpar_zero1_destroy", "stale");
    assert_null(dpar_zero1_master(f.z, 0)); /* the getters refuse it too */
    assert_non_null(strstr(dpar_last_error(), "dpar_zero1_master"));
    assert_null(dpar_zero1_momentum(f.z, 0));
    assert_int_equal(dpar_zero1_padded_count(f.z, 0), -1);
    assert_int_equal(dpar_zero1_momentum_bytes(f.z, 0), 0);
    T_OK(dpar_graph_destroy(f.g));
    T_ERR(dpar_graph_destroy(f.g), DPAR_ERR_STATE, "dpar_graph_destroy", "stale");
    T_OK(dpar_array_destroy(a2));
    T_ERR(dpar_array_destroy(a2), DPAR_ERR_STATE, "dpar_array_destroy", "stale");
    T_OK(dpar_buffer_destroy(b2));
    T_ERR(dpar_buffer_destroy(b2), DPAR_ERR_STATE, "dpar_buffer_destroy", "stale");
    T_ERR(dpar_buffer_destroy(dpar_array_shard(f.a, 0)), DPAR_ERR_STATE, "shard of a dpar_array");
    T_OK(dpar_mesh_destroy(f.m));
    T_ERR(dpar_mesh_destroy(f.m), DPAR_ERR_STATE, "dpar_mesh_destroy", "stale");
    T_ERR(dpar_array_destroy(f.a), DPAR_ERR_STATE, "dpar_array_destroy", "stale"); /* freed with its mesh */
    T_OK(dpar_runtime_destroy(f.rt));
    T_ERR(dpar_runtime_destroy(f.rt), DPAR_ERR_STATE, "dpar_runtime_destroy", "stale");
    T_ERR(dpar_buffer_destroy(f.b), DPAR_ERR_STATE, "dpar_buffer_destroy", "stale"); /* freed with its runtime */
    /* a step's request waited twice (the first wait frees it) */
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dpar_request *r = NULL;
    dpar_shard_map_desc sd = { .fn = nop };
    T_OK(dpar_shard_map_start(m, &sd, &r));
    T_OK(dpar_wait(NULL, r));
    T_ERR(dpar_wait(NULL, r), DPAR_ERR_INVALID_ARGUMENT, "dpar_wait");
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- dpar_handle_attach / check / detach ---- */
static void test_handle_api(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    void *obj = malloc(8);
    released = 0;
    T_ERR(dpar_handle_check(obj, "my_helper_step"), DPAR_ERR_STATE, "my_helper_step", "stale");
    T_OK(dpar_handle_attach(m, obj, count_release));
    T_ERR(dpar_handle_attach(m, obj, count_release), DPAR_ERR_STATE, "attached already");
    T_OK(dpar_handle_check(obj, "my_helper_step"));
    T_ERR(dpar_handle_attach(NULL, obj, count_release), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_OK(dpar_handle_detach(obj, "my_helper_destroy"));
    T_ERR(dpar_handle_detach(obj, "my_helper_destroy"), DPAR_ERR_STATE, "my_helper_destroy", "stale");
    T_OK(dpar_handle_attach(m, obj, count_release));
    T_OK(dpar_mesh_destroy(m));
    assert_int_equal(released, 1);
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- the caller's thread keeps its handle memos from one runtime to the next ---- */
/* A 1-device runtime runs fn on the calling thread, so that thread's memos of handles found live in a
   dispatch outlive the runtime. A handle freed by another thread (its memo slot is not forgotten there)
   must still be refused in a later runtime's dispatch: at the same job count, at a freed runtime's address. */
typedef struct memo_job {
    dpar_buffer *stale, *live; /* stale: freed since the last dispatch, NULL: none */
    void *obj;                 /* a helper object, checked with dpar_handle_check */
    dpar_status obj_status;
    char obj_error[256]; /* its error text */
} memo_job;
static dpar_status memo_use(dpar_ctx *ctx, void *user) {
    (void)ctx;
    memo_job *j = (memo_job *)user;
    if (j->stale && (dpar_fill(j->stale, 1.0f) != DPAR_ERR_STATE || !strstr(dpar_last_error(), "stale buffer")))
        return dpar_set_last_error(DPAR_ERR_BACKEND, "a buffer freed under an earlier runtime passed as live: %s",
                                   dpar_last_error());
    if (j->obj) {
        j->obj_status = dpar_handle_check(j->obj, "memo_use");
        snprintf(j->obj_error, sizeof j->obj_error, "%s", dpar_last_error());
    }
    return dpar_fill(j->live, 2.0f); /* found live: remembered by this thread until the dispatch ends */
}
static void *destroy_buffer_thread(void *arg) {
    return dpar_buffer_destroy((dpar_buffer *)arg) == DPAR_OK ? arg : NULL;
}
static void memo_dispatch(dpar_mesh *m, memo_job *j) {
    dpar_shard_map_desc sd = { .fn = memo_use, .user = j };
    T_OK(dpar_shard_map(m, &sd));
}
static void test_caller_thread_memos(void **state) {
    (void)state;
    int64_t four = 4;
    /* two runtimes at once: a helper object checked in A's first dispatch, detached, then checked in B's */
    dpar_runtime *ra = t_runtime(DPAR_BACKEND_CPU, 1), *rb = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_mesh *ma = t_mesh1(ra, 1, "data"), *mb = t_mesh1(rb, 1, "data");
    void *obj = malloc(8);
    memo_job j = { .obj = obj };
    T_OK(dpar_buffer_create(ra, 0, DPAR_F32, 1, &four, &j.live));
    T_OK(dpar_handle_attach(ma, obj, count_release));
    memo_dispatch(ma, &j);
    T_OK(j.obj_status);
    T_OK(dpar_handle_detach(obj, "test"));
    T_OK(dpar_buffer_create(rb, 0, DPAR_F32, 1, &four, &j.live));
    memo_dispatch(mb, &j); /* B's job 1, as A's was */
    assert_int_equal(j.obj_status, DPAR_ERR_STATE);
    if (!strstr(j.obj_error, "memo_use") || !strstr(j.obj_error, "stale")) fail_msg("error text: %s", j.obj_error);
    free(obj);
    T_OK(dpar_runtime_destroy(ra));
    T_OK(dpar_runtime_destroy(rb));
    /* runtimes made and destroyed in a loop, each dispatching once (job 1): the last one's buffer, freed by
       another thread, is refused in the next one's dispatch, also when the allocator gives the new runtime
       the freed one's address (after DPAR__ADDR_RING other frees, here meshes of a filler runtime) */
    dpar_runtime *filler = t_runtime(DPAR_BACKEND_CPU, 1), *prev_rt = NULL;
    dpar_buffer *prev = NULL;
    int same_address = 0, rounds = 48;
    for (int i = 0; i < rounds; i++) {
        dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
        dpar_mesh *m = t_mesh1(rt, 1, "data");
        memo_job k = { .stale = prev };
        T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &four, &k.live));
        if (k.live == prev) k.stale = NULL; /* its address is a live buffer again: not stale */
        same_address += rt == prev_rt;
        memo_dispatch(m, &k);
        pthread_t th;
        void *done = NULL;
        assert_int_equal(pthread_create(&th, NULL, destroy_buffer_thread, k.live), 0);
        assert_int_equal(pthread_join(th, &done), 0);
        assert_ptr_equal(done, k.live);
        T_OK(dpar_runtime_destroy(rt));
        for (int f = 0; f < 260; f++) T_OK(dpar_mesh_destroy(t_mesh1(filler, 1, "data")));
        prev_rt = rt, prev = k.live;
    }
    T_OK(dpar_runtime_destroy(filler));
    printf("%d of %d runtimes took the address of the one before (each refused the stale buffer)\n", same_address,
           rounds - 1);
}

/* ---- a data-parallel step begun and never finished ---- */
typedef struct dp_job {
    dpar_dp *dp;
    dpar_array *g;
    int finish, fail_dev;
} dp_job;
static dpar_status dp_step(dpar_ctx *ctx, void *user) {
    dp_job *j = (dp_job *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_status s = dpar_fill(dpar_array_shard(j->g, dev), (float)(dev + 1));
    if (!s) s = dpar_dp_begin(j->dp, ctx);
    if (!s) s = dpar_dp_grad_ready(j->dp, ctx, 0);
    if (!s && dev == j->fail_dev) return dpar_set_last_error(DPAR_ERR_BACKEND, "a failure of the test's fn");
    if (!s && j->finish) s = dpar_dp_finish(j->dp, ctx);
    return s;
}
static void test_forgotten_dp_finish(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dp_job j = { .g = arr(m, NULL), .fail_dev = -1 };
    dpar_dp_desc dd = { .axes = "data", .blocking = true };
    T_OK(dpar_dp_create(m, &dd, &j.dp));
    T_OK(dpar_dp_add(j.dp, j.g, NULL));
    dpar_shard_map_desc sd = { .fn = dp_step, .user = &j };
    /* finish forgotten: the dispatch itself fails, never DPAR_OK with unreduced gradients */
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_STATE, "device", "without dpar_dp_finish", "not reduced");
    /* the same with buckets reduced asynchronously */
    dpar_dp *async_dp = NULL;
    dpar_dp_desc ad = { .axes = "data" };
    T_OK(dpar_dp_create(m, &ad, &async_dp));
    T_OK(dpar_dp_add(async_dp, j.g, NULL));
    dpar_dp *blocking_dp = j.dp;
    j.dp = async_dp;
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_STATE, "without dpar_dp_finish");
    j.dp = blocking_dp;
    /* a failing fn keeps its own error; the open step is dropped */
    j.finish = 1;
    j.fail_dev = 1;
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_BACKEND, "failure of the test's fn");
    /* the next complete step works and averages: (1 + 2) / 2 on both devices */
    j.fail_dev = -1;
    T_OK(dpar_shard_map(m, &sd));
    float h[4];
    T_OK(dpar_array_get(j.g, h));
    for (int i = 0; i < 4; i++) assert_true(h[i] == 1.5f);
    T_OK(dpar_dp_destroy(async_dp));
    T_OK(dpar_runtime_destroy(rt)); /* j.dp goes with it */
    T_ERR(dpar_dp_destroy(j.dp), DPAR_ERR_STATE, "stale");
}

/* ---- a graph run after its mesh was destroyed ---- */
static void test_graph_after_mesh(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dpar_array *p = arr(m, NULL);
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_value w = dpar_g_param(g, "w", p);
    dpar_value loss = dpar_g_sum(g, w), dw;
    T_OK(dpar_graph_value_and_grad(g, loss, &w, 1, &dw));
    float l = -1.0f;
    T_OK(dpar_graph_run(g, NULL, 0, &l));
    T_OK(dpar_mesh_destroy(m));
    T_ERR(dpar_graph_run(g, NULL, 0, &l), DPAR_ERR_STATE, "dpar_graph_run", "stale");
    T_ERR(dpar_graph_compile(g, NULL), DPAR_ERR_STATE, "stale");
    T_ERR(dpar_graph_get(g, w, &l), DPAR_ERR_STATE, "stale");
    T_ERR(dpar_graph_status(g), DPAR_ERR_STATE, "stale");
    assert_int_equal(dpar_g_sum(g, w).id, 0);
    T_ERR(dpar_graph_keep(g, w), DPAR_ERR_STATE, "stale");
    T_ERR(dpar_graph_destroy(g), DPAR_ERR_STATE, "stale");
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- arrays held by a graph, dp, ZeRO-1 or a checkpoint call, destroyed: refused before any work ---- */
#define DEAD(call, fn, what) T_ERR(call, DPAR_ERR_STATE, fn ": " what, "was destroyed", "nothing was done")
static void get4(const dpar_array *a, float *h) {
    T_OK(dpar_array_get(a, h));
}
static void same4(const float *a, const float *b) {
    assert_memory_equal(a, b, 4 * sizeof(float));
}
/* A graph: loss sum(x w) + sum(v), x a [2, 4] feed split over "data", w [4] and v [2] params, SGD (AdamW: adamw). */
static dpar_graph *small_graph(dpar_mesh *m, dpar_array *w, dpar_array *v, bool adamw, dpar_value *x) {
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_array_desc xd = { .dtype = DPAR_F32, .ndim = 2, .shape = { 2, 4 }, .spec = { "data" } };
    *x = dpar_g_feed(g, "x", &xd);
    dpar_value p[2] = { dpar_g_param(g, "w", w), dpar_g_param(g, "v", v) }, gr[2];
    dpar_value y = dpar_g_matmul(g, *x, dpar_g_reshape(g, p[0], 2, (int64_t[]){ 4, 1 }), false, false);
    dpar_value loss = dpar_g_add(g, dpar_g_sum(g, y), dpar_g_sum(g, p[1]));
    T_OK(dpar_graph_value_and_grad(g, loss, p, 2, gr));
    if (adamw)
        T_OK(dpar_graph_adamw(g, &(dpar_adamw_desc){ .learning_rate = 0.1f }, p, gr, 2));
    else
        T_OK(dpar_graph_sgd(g, &(dpar_sgd_desc){ .learning_rate = 0.1f }, p, gr, 2));
    return g;
}
/* A new folder dir under TMPDIR (or /tmp), and path: a file `name` in it (t_remove_tree(dir) after). */
static void tmp_path(char dir[256], char path[300], const char *name) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, 256, "%s/dpar_lifetime_XXXXXX", t ? t : "/tmp");
    assert_non_null(mkdtemp(dir));
    snprintf(path, 300, "%s/%s", dir, name);
}
/* dpar_array_uid: a number per array, never reused, 0 once destroyed, which graphs, the dp helper and ZeRO-1
   record to tell a destroyed array from a new one at its address. test_alloc's test_param_address_reused
   makes the address come back and checks the refused run. */
static void test_array_uid_never_reused(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dpar_array *w = arr(m, NULL), *v = arr(m, NULL);
    uint64_t uid = dpar_array_uid(w);
    assert_true(uid != 0 && uid != dpar_array_uid(v));
    assert_true(dpar_array_uid(NULL) == 0);
    T_OK(dpar_array_destroy(w));
    assert_true(dpar_array_uid(w) == 0); /* stale: 0, not its old number */
    for (int i = 0; i < 300; i++) {      /* past the registry's 256 held addresses: w's may come back */
        dpar_array *t = arr(m, NULL);
        assert_true(dpar_array_uid(t) > uid);
        T_OK(dpar_array_destroy(t));
    }
    T_OK(dpar_array_destroy(v));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}
static void test_graph_param_destroyed(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    char dir[256], path[300];
    tmp_path(dir, path, "g.ck");
    float xs[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, l = 0.0f, before[4], after[4], fx[8];
    dpar_array *w = arr(m, NULL), *v = arr(m, NULL);
    dpar_value x;
    dpar_graph *g = small_graph(m, w, v, false, &x);
    dpar_graph_feed f = { x, xs, NULL };
    T_OK(dpar_graph_run(g, &f, 1, &l));
    T_OK(dpar_graph_save(g, path));
    get4(v, before);
    T_OK(dpar_array_get(dpar_graph_feed_array(g, x), fx));
    T_OK(dpar_array_destroy(w));
    /* every call that reads the params refuses, naming it, and changes nothing (no step, v as it was) */
    const char *fn[] = { "dpar_graph_run",  "dpar_graph_run_start",   "dpar_graph_put_feeds",
                         "dpar_graph_get",  "dpar_graph_state_count", "dpar_graph_state",
                         "dpar_graph_save", "dpar_graph_restore",     "dpar_graph_print" };
    for (int k = 0; k < (int)(sizeof fn / sizeof fn[0]); k++) {
        dpar_request *req = NULL;
        int n = 0;
        const char *name = NULL;
        dpar_array *got = NULL;
        dpar_status s = k == 0   ? dpar_graph_run(g, &f, 1, &l)
                        : k == 1 ? dpar_graph_run_start(g, &f, 1, &l, &req)
                        : k == 2 ? dpar_graph_put_feeds(g, &f, 1)
                        : k == 3 ? dpar_graph_get(g, x, fx)
                        : k == 4 ? dpar_graph_state_count(g, &n)
                        : k == 5 ? dpar_graph_state(g, 0, &name, &got, NULL)
                        : k == 6 ? dpar_graph_save(g, path)
                        : k == 7 ? dpar_graph_restore(g, path)
                                 : dpar_graph_print(g, path);
        T_ERR(s, DPAR_ERR_STATE, fn[k], "param 'w' (node 2): its array was destroyed", "nothing was done",
              "destroy the graph before its params");
        assert_null(req);
        assert_null(got);
    }
    assert_int_equal(dpar_graph_step(g), 1);
    get4(v, after);
    same4(before, after);
    T_OK(dpar_graph_destroy(g)); /* after its params: fine, it never touches them */
    /* before the first compile too */
    w = arr(m, NULL);
    g = small_graph(m, w, v, false, &x);
    T_OK(dpar_array_destroy(w));
    DEAD(dpar_graph_compile(g, NULL), "dpar_graph_compile", "param 'w' (node 2)");
    T_OK(dpar_graph_destroy(g));
    /* arrays the graph owns and hands out: a feed's, an optimizer state's */
    w = arr(m, NULL);
    g = small_graph(m, w, v, true, &x);
    T_OK(dpar_graph_run(g, &f, 1, &l));
    const char *name = NULL;
    dpar_array *st = NULL;
    T_OK(dpar_graph_state(g, 3, &name, &st, NULL));
    assert_string_equal(name, "v@adamw.m");
    T_OK(dpar_array_destroy(st));
    DEAD(dpar_graph_run(g, &f, 1, &l), "dpar_graph_run", "optimizer state 'v@adamw.m' of param 'v' (node 3)");
    T_OK(dpar_graph_destroy(g));
    g = small_graph(m, w, v, false, &x);
    T_OK(dpar_graph_run(g, &f, 1, &l));
    T_OK(dpar_array_destroy(dpar_graph_feed_array(g, x)));
    DEAD(dpar_graph_run(g, &f, 1, &l), "dpar_graph_run", "feed 'x' (node 1): its array, which the graph owns");
    assert_null(dpar_graph_feed_array(g, x));
    assert_non_null(strstr(dpar_last_error(), "dpar_graph_feed_array: feed 'x' (node 1)"));
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_array_destroy(w));
    T_OK(dpar_runtime_destroy(rt));
    assert_int_equal(t_remove_tree(dir), 0);
}
typedef struct dp2_job {
    dpar_dp *dp;
    dpar_zero1 *z;
    dpar_array *g; /* zero1: the gradients, [4] per device */
} dp2_job;
static dpar_status dp2_step(dpar_ctx *ctx, void *user) {
    dp2_job *j = (dp2_job *)user;
    if (j->dp) return dpar_dp_allreduce(j->dp, ctx);
    dpar_buffer *g[2] = { dpar_ctx_arg(ctx, 0), dpar_ctx_arg(ctx, 1) };
    return dpar_zero1_step(ctx, j->z, g);
}
static void test_dp_zero1_array_destroyed(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    float before[4], after[4], mb[4], ma[4], ones[4] = { 1, 1, 1, 1 }, ones8[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    /* dp: a gradient destroyed; the other one is not reduced (left as it was) */
    dpar_array *g0 = arr(m, NULL), *g1 = arr(m, NULL);
    dp2_job j = { 0 };
    T_OK(dpar_dp_create(m, &(dpar_dp_desc){ .axes = "data", .blocking = true }, &j.dp));
    T_OK(dpar_dp_add(j.dp, g0, NULL));
    T_OK(dpar_dp_add(j.dp, g1, NULL));
    dpar_shard_map_desc sd = { .fn = dp2_step, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_array_destroy(g0));
    T_OK(dpar_array_put(g1, ones));
    get4(g1, before);
    DEAD(dpar_shard_map(m, &sd), "dpar_dp_begin", "gradient 0 (dpar_dp_add)");
    get4(g1, after);
    same4(before, after);
    assert_int_equal(dpar_dp_bucket_count(j.dp), -1);
    T_OK(dpar_dp_destroy(j.dp)); /* after its gradient: fine */
    j.dp = NULL;
    /* ZeRO-1: a param destroyed; the other param and its master copy unchanged (no update, no collective) */
    dpar_array *p0 = arr(m, NULL), *p1 = arr(m, NULL), *gr[2];
    dpar_array_desc gd = { .dtype = DPAR_F32, .ndim = 1, .shape = { 8 }, .spec = { "data" } };
    T_OK(dpar_array_create(m, &gd, &gr[0]));
    T_OK(dpar_array_create(m, &gd, &gr[1]));
    T_OK(dpar_array_put(gr[0], ones8));
    T_OK(dpar_array_put(gr[1], ones8));
    dpar_zero1_desc zd = { .sgd = { .learning_rate = 0.1f }, .num_params = 2, .params = { p0, p1 } };
    T_OK(dpar_zero1_create(&zd, &j.z));
    sd.args[0] = gr[0];
    sd.args[1] = gr[1];
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_array_destroy(p0));
    get4(p1, before);
    get4(dpar_zero1_master(j.z, 1), mb);
    DEAD(dpar_shard_map(m, &sd), "dpar_zero1_step", "params[0]");
    DEAD(dpar_zero1_reload(j.z), "dpar_zero1_reload", "params[0]");
    get4(p1, after);
    same4(before, after);
    get4(dpar_zero1_master(j.z, 1), ma);
    same4(mb, ma);
    T_OK(dpar_zero1_destroy(j.z)); /* after its param: fine */
    /* ZeRO-1: an array it owns and hands out (the master copy) destroyed */
    p0 = arr(m, NULL);
    zd.params[0] = p0;
    T_OK(dpar_zero1_create(&zd, &j.z));
    T_OK(dpar_array_destroy(dpar_zero1_master(j.z, 1)));
    DEAD(dpar_shard_map(m, &sd), "dpar_zero1_step", "the master copy of params[1], which the ZeRO-1 state owns");
    T_OK(dpar_zero1_destroy(j.z));
    T_OK(dpar_runtime_destroy(rt));
}
static void test_checkpoint_array_destroyed(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    char dir[256], path[300];
    tmp_path(dir, path, "c.ck");
    dpar_array *a = arr(m, "data"), *b = arr(m, NULL);
    float h[4] = { 1, 2, 3, 4 }, before[4], after[4];
    T_OK(dpar_array_put(b, h));
    dpar_checkpoint_entry e[2] = { { "b", b, false }, { "a", a, false } };
    T_OK(dpar_checkpoint_save(path, e, 2, 7));
    T_OK(dpar_array_put(b, (float[]){ 5, 6, 7, 8 }));
    get4(b, before);
    T_OK(dpar_array_destroy(a));
    T_ERR(dpar_checkpoint_restore(path, e, 2, NULL), DPAR_ERR_STATE,
          "dpar_checkpoint_restore: entry 1 ('a'): its array was destroyed", "nothing was read or written");
    get4(b, after);
    same4(before, after); /* b not restored either */
    T_ERR(dpar_checkpoint_save(path, e, 2, 8), DPAR_ERR_STATE, "dpar_checkpoint_save: entry 1 ('a')", "was destroyed");
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char hdr[32];
    assert_int_equal(fread(hdr, 1, sizeof hdr, f), sizeof hdr);
    fclose(f);
    assert_int_equal(hdr[24], 7); /* the file is still the first save's (step 7) */
    T_OK(dpar_runtime_destroy(rt));
    assert_int_equal(t_remove_tree(dir), 0);
}

/* ---- the MPI environment variables are range-checked like the others ---- */
static void env_case(const char *name, const char *value, int ok) {
    setenv(name, value, 1);
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_CPU, .num_devices = 1 };
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&d, &rt);
    unsetenv(name);
    if (ok) {
        T_OK(s);
        T_OK(dpar_runtime_destroy(rt));
    } else {
        T_ERR(s, DPAR_ERR_INVALID_ARGUMENT, name, value, "0..1");
        assert_null(rt);
    }
}
static void test_mpi_env_ranges(void **state) {
    (void)state;
    const char *names[2] = { "DPAR_ALLOW_SHARED_DEVICE", "DPAR_MPI_BACKEND_COLLECTIVES" };
    for (int i = 0; i < 2; i++) {
        env_case(names[i], "0", 1);
        env_case(names[i], "1", 1);
        env_case(names[i], "2", 0);
        env_case(names[i], "-1", 0);
        env_case(names[i], "yes", 0);
        env_case(names[i], "1x", 0);
    }
}

/* A shard's reshape inside fn is a view for that call: it stayed, so the next dispatch saw [6] where the
   spec gives [2, 3], and a reshape from the host broke dpar_array_reshard (the fresh user's shard2.c). */
static dpar_status flatten_shard(dpar_ctx *ctx, void *user) {
    int64_t six = 6;
    dpar_status s = dpar_buffer_reshape(dpar_ctx_arg(ctx, 0), 1, &six);
    if (!s && user) /* the shard of an array that is not an argument of this call: a view too */
        s = dpar_buffer_reshape(dpar_array_shard((const dpar_array *)user, dpar_ctx_device(ctx)), 1, &six);
    return s;
}
static dpar_status shard_is_2x3(dpar_ctx *ctx, void *user) {
    (void)user;
    const dpar_buffer *b = dpar_ctx_arg(ctx, 0);
    if (dpar_buffer_ndim(b) != 2 || dpar_buffer_dim(b, 0) != 2 || dpar_buffer_dim(b, 1) != 3)
        return dpar_set_last_error(DPAR_ERR_SHAPE, "device %d: the shard is %d-d, dim 0 = %lld", dpar_ctx_device(ctx),
                                   dpar_buffer_ndim(b), (long long)dpar_buffer_dim(b, 0));
    return DPAR_OK;
}
static void test_shard_reshape_is_a_view(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = mesh2(rt);
    dpar_array *a = NULL, *b = NULL;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 2, { 4, 3 }, { "data" } }, &a));
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 2, { 4, 3 }, { "data" } }, &b));
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = flatten_shard, .user = b, .args = { a } }));
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = shard_is_2x3, .args = { a } }));
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = shard_is_2x3, .args = { b } }));
    int64_t six = 6;
    T_ERR(dpar_buffer_reshape(dpar_array_shard(a, 0), 1, &six), DPAR_ERR_STATE, "dpar_buffer_reshape",
          "a shard of a dpar_array", "nothing was changed");
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = shard_is_2x3, .args = { a } }));
    T_OK(dpar_array_destroy(a));
    T_OK(dpar_array_destroy(b));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_destroy_during_dispatch),
        cmocka_unit_test(test_stale_ctx),
        cmocka_unit_test(test_op_on_other_device),
        cmocka_unit_test(test_stale_handles),
        cmocka_unit_test(test_destroy_orders),
        cmocka_unit_test(test_cycles_helpers_left_alive),
        cmocka_unit_test(test_handle_api),
        cmocka_unit_test(test_forgotten_dp_finish),
        cmocka_unit_test(test_graph_after_mesh),
        cmocka_unit_test(test_graph_param_destroyed),
        cmocka_unit_test(test_array_uid_never_reused),
        cmocka_unit_test(test_dp_zero1_array_destroyed),
        cmocka_unit_test(test_checkpoint_array_destroyed),
        cmocka_unit_test(test_mpi_env_ranges),
        cmocka_unit_test(test_destroy_keeps_error),
        cmocka_unit_test(test_stale_arguments),
        cmocka_unit_test(test_shard_reshape_is_a_view),
        cmocka_unit_test(test_address_not_reused),
        cmocka_unit_test(test_caller_thread_memos),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
