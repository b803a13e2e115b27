/* API conventions of issue 11: counts of 0 in descs are inferred (mesh ndim,
   shard_map num_args, pmap and shard_map_specs input/output counts), and
   every destroy that can fail says so with a status. */
#include "testutil.h"
#include <fenv.h>

/* ---- inferred counts ---- */
static void test_mesh_ndim_inferred(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = NULL;
    T_OK(dpar_mesh_create(rt, &(dpar_mesh_desc){ .shape = { 2, 2 }, .axis_names = { "data", "model" } }, &m));
    assert_int_equal(dpar_mesh_ndim(m), 2);
    int n = 0;
    T_OK(dpar_mesh_axis_size(m, "model", &n));
    assert_int_equal(n, 2);
    T_OK(dpar_mesh_destroy(m));
    /* a size without a name is still caught, naming the axis */
    T_ERR(dpar_mesh_create(rt, &(dpar_mesh_desc){ .shape = { 4 } }, &m), DPAR_ERR_INVALID_ARGUMENT, "axis 0", "name");
    /* nothing given: ndim stays 0, an error */
    T_ERR(dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 0 }, &m), DPAR_ERR_INVALID_ARGUMENT, "ndim = 0");
    T_OK(dpar_runtime_destroy(rt));
}

typedef struct seen {
    int nargs[4];
} seen;

/* records how many arguments fn sees: the first index whose dpar_ctx_arg is NULL */
static dpar_status count_args(dpar_ctx *ctx, void *user) {
    seen *s = (seen *)user;
    int i = 0;
    while (i < DPAR_MAX_ARGS && dpar_ctx_arg(ctx, i)) i++;
    s->nargs[dpar_ctx_device(ctx)] = i;
    return DPAR_OK;
}

static void test_shard_map_num_args_inferred(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *a = NULL, *b = NULL;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ .dtype = DPAR_F32, .ndim = 1, .shape = { 4 }, .spec = { "data" } },
                           &a));
    T_OK(dpar_array_create(m, &(dpar_array_desc){ .dtype = DPAR_F32, .ndim = 1, .shape = { 4 } }, &b));
    seen s = { { 0 } };
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = count_args, .user = &s, .args = { a, b } }));
    assert_int_equal(s.nargs[0], 2);
    assert_int_equal(s.nargs[1], 2);
    memset(&s, 0, sizeof s);
    T_OK(dpar_shard_map_specs(
        m, &(dpar_shard_map_specs_desc){
               .fn = count_args, .user = &s, .inputs = { a }, .in_specs = { { "data" } }, .outputs = { b } }));
    assert_int_equal(s.nargs[0], 2);
    assert_int_equal(s.nargs[1], 2);
    memset(&s, 0, sizeof s);
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = count_args, .user = &s })); /* no args at all */
    assert_int_equal(s.nargs[0], 0);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

static dpar_status twice(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_status s = dpar_copy(dpar_ctx_arg(ctx, 1), dpar_ctx_arg(ctx, 0));
    return s ? s : dpar_scale(dpar_ctx_arg(ctx, 1), 2.0f);
}

static void test_pmap_counts_inferred(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    float in[2][3] = { { 1, 2, 3 }, { 4, 5, 6 } }, out[2][3] = { { 0 } };
    T_OK(dpar_pmap(m,
                   &(dpar_pmap_desc){ .axis = "data",
                                      .fn = twice,
                                      .inputs = { { .data = in, .dtype = DPAR_F32, .ndim = 2, .shape = { 2, 3 } } },
                                      .outputs = { { .data = out, .dtype = DPAR_F32, .ndim = 1, .shape = { 3 } } } }));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) assert_true(out[i][j] == 2.0f * in[i][j]);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

/* ---- dpar's threads run in the floating-point environment of the thread that made the runtime, as POSIX
   threads do (Windows threads started with the default one, so MinGW's x87 libm rounded exp differently on
   a device's worker than on the caller's thread: an f64 graph differed from the eager op in the last bits) */
static dpar_status read_rounding(dpar_ctx *ctx, void *user) {
    ((int *)user)[dpar_ctx_device(ctx)] = fegetround();
    return DPAR_OK;
}
static void test_threads_take_the_creators_fenv(void **st) {
    (void)st;
#ifdef FE_UPWARD
    int keep = fegetround(), got[4] = { -1, -1, -1, -1 };
    assert_int_equal(fesetround(FE_UPWARD), 0);
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    dpar_status s = dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = read_rounding, .user = got });
    assert_int_equal(fesetround(keep), 0);
    T_OK(s);
    for (int d = 0; d < 4; d++)
        if (got[d] != FE_UPWARD)
            fail_msg("device %d ran in rounding mode %d, not its creator's %d", d, got[d], FE_UPWARD);
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
#else
    printf("SKIPPED: this C library has no FE_UPWARD\n");
    skip();
#endif
}

/* ---- destroys return a status ---- */
typedef struct handles {
    dpar_runtime *rt;
    dpar_mesh *m;
    dpar_array *a;
    dpar_status mesh_s[2], rt_s[2], arr_s[2];
} handles;

static dpar_status destroy_inside(dpar_ctx *ctx, void *user) {
    handles *h = (handles *)user;
    int d = dpar_ctx_device(ctx);
    h->arr_s[d] = dpar_array_destroy(h->a); /* freeing shards another device may be using */
    h->mesh_s[d] = dpar_mesh_destroy(h->m);
    h->rt_s[d] = dpar_runtime_destroy(h->rt);
    return DPAR_OK;
}

static void test_destroy_status(void **st) {
    (void)st;
    assert_int_equal(dpar_runtime_destroy(NULL), DPAR_OK);
    assert_int_equal(dpar_mesh_destroy(NULL), DPAR_OK);
    assert_int_equal(dpar_buffer_destroy(NULL), DPAR_OK);
    handles h = { .rt = t_runtime(DPAR_BACKEND_CPU, 2) };
    h.m = t_mesh1(h.rt, 2, "data");
    assert_int_equal(dpar_array_destroy(NULL), DPAR_OK);
    dpar_array *a = NULL;
    T_OK(dpar_array_create(h.m, &(dpar_array_desc){ .dtype = DPAR_F32, .ndim = 1, .shape = { 2 } }, &a));
    h.a = a;
    T_ERR(dpar_buffer_destroy(dpar_array_shard(a, 0)), DPAR_ERR_STATE, "dpar_buffer_destroy", "destroy the array");
    T_OK(dpar_shard_map(h.m, &(dpar_shard_map_desc){ .fn = destroy_inside, .user = &h }));
    for (int d = 0; d < 2; d++) {
        assert_int_equal(h.mesh_s[d], DPAR_ERR_STATE);
        assert_int_equal(h.rt_s[d], DPAR_ERR_STATE);
        assert_int_equal(h.arr_s[d], DPAR_ERR_STATE);
    }
    const float x[2] = { 1.5f, -2.0f };
    float y[2] = { 0 };
    T_OK(dpar_array_put(a, x)); /* the array survived the destroys inside fn */
    T_OK(dpar_array_get(a, y));
    assert_memory_equal(x, y, sizeof x);
    T_OK(dpar_array_destroy(a));
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(h.rt, 1, DPAR_F32, 1, (const int64_t[]){ 8 }, &b));
    T_OK(dpar_buffer_destroy(b));
    T_OK(dpar_mesh_destroy(h.m)); /* the mesh and the runtime survived the calls inside fn */
    T_OK(dpar_runtime_destroy(h.rt));
}

/* The last error may be an argument of the text that replaces it (context added
   around a callee's error); it was formatted in place and came out garbled. */
static void test_set_last_error_wraps_itself(void **st) {
    (void)st;
    dpar_set_last_error(DPAR_ERR_SHAPE, "inner: rows %d != %d", 3, 4);
    assert_int_equal(dpar_set_last_error(DPAR_ERR_SHAPE, "outer: loading w: %s", dpar_last_error()), DPAR_ERR_SHAPE);
    assert_string_equal(dpar_last_error(), "outer: loading w: inner: rows 3 != 4");
}

/* buffers of two runtimes: was "operands live on devices 0 and 0" */
static void test_two_runtimes_message(void **st) {
    (void)st;
    dpar_runtime *r1 = t_runtime(DPAR_BACKEND_CPU, 1), *r2 = t_runtime(DPAR_BACKEND_CPU, 1);
    int64_t four = 4;
    dpar_buffer *a, *b;
    T_OK(dpar_buffer_create(r1, 0, DPAR_F32, 1, &four, &a));
    T_OK(dpar_buffer_create(r2, 0, DPAR_F32, 1, &four, &b));
    T_ERR(dpar_copy(a, b), DPAR_ERR_INVALID_ARGUMENT, "different runtimes");
    T_OK(dpar_runtime_destroy(r1));
    T_OK(dpar_runtime_destroy(r2));
}

/* Every op names a bad operand by its parameter's name: was "operand 1 is NULL"
   for the operands without a name, and the input gradient of a conv was "x". */
static void test_operand_names(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    int64_t m22[2] = { 2, 2 }, x4[4] = { 1, 4, 4, 2 }, w4[4] = { 3, 3, 3, 2 };
    dpar_buffer *a, *b, *c, *other, *dx, *dy, *w;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m22, &a));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m22, &b));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m22, &c));
    T_OK(dpar_buffer_create(rt, 1, DPAR_F32, 2, m22, &other));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, x4, &dx));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, x4, &dy));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, w4, &w)); /* takes 3 channels; dx has 2 */
    T_ERR(dpar_matmul(c, a, NULL, false, false, 1.0f, 0.0f), DPAR_ERR_INVALID_ARGUMENT, "dpar_matmul: B is NULL");
    T_ERR(dpar_matmul(NULL, a, b, false, false, 1.0f, 0.0f), DPAR_ERR_INVALID_ARGUMENT, "dpar_matmul: C is NULL");
    T_ERR(dpar_relu_backward(c, a, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_relu_backward: x is NULL");
    T_ERR(dpar_relu_backward(c, NULL, a), DPAR_ERR_INVALID_ARGUMENT, "dpar_relu_backward: dy is NULL");
    T_ERR(dpar_softmax_xent(c, NULL, a, NULL), DPAR_ERR_INVALID_ARGUMENT, "labels is NULL");
    T_ERR(dpar_mse(c, NULL, a, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_mse: target is NULL");
    T_ERR(dpar_where(c, NULL, a, b, 0.0f, 0.0f), DPAR_ERR_INVALID_ARGUMENT, "dpar_where: cond is NULL");
    T_ERR(dpar_fill(NULL, 1.0f), DPAR_ERR_INVALID_ARGUMENT, "dpar_fill: x is NULL");
    T_ERR(dpar_copy(c, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_copy: src is NULL");
    T_ERR(dpar_conv2d_backward_input(dx, NULL, w, NULL), DPAR_ERR_INVALID_ARGUMENT,
          "dpar_conv2d_backward_input: dy is NULL");
    /* the geometry's input side is dx here */
    T_ERR(dpar_conv2d_backward_input(dx, dy, w, NULL), DPAR_ERR_SHAPE, "dpar_conv2d_backward_input: dx [1, 4, 4, 2]",
          "2 channels");
    /* across devices: both operands named, with their devices */
    T_ERR(dpar_binary(c, a, other, DPAR_BINARY_ADD), DPAR_ERR_INVALID_ARGUMENT,
          "dpar_binary: y and b are on devices 0 and 1");
    dpar_buffer *all[] = { a, b, c, other, dx, dy, w };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) T_OK(dpar_buffer_destroy(all[i]));
    T_OK(dpar_runtime_destroy(rt));
}

/* One text from each kind the fresh-user review found: the argument named by its parameter (not a wrong one,
   not "X or Y"), the function the user called, advice that holds, a stale text that fits the handle. */
static void test_error_texts(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    int64_t m22[2] = { 2, 2 }, m42[2] = { 4, 2 }, m33[2] = { 3, 3 }, m23[2] = { 2, 3 }, two[1] = { 2 },
            x4[4] = { 1, 4, 4, 2 }, dw4[4] = { 3, 3, 2, 4 }, dy4[4] = { 1, 4, 4, 3 }, w4[4] = { 3, 3, 2, 3 },
            p4[4] = { 1, 2, 2, 2 };
    dpar_buffer *a, *b, *c, *y, *lg, *lb, *x, *dw, *dy, *w, *p;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m22, &a));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m22, &b));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m42, &c));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m33, &y));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, m23, &lg));
    T_OK(dpar_buffer_create(rt, 0, DPAR_I32, 1, two, &lb));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, x4, &x));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, dw4, &dw));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, dy4, &dy));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, w4, &w));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 4, p4, &p));
    int64_t start[2] = { 0, 0 }, lo[2] = { -1, 0 };
    /* the parameter's name: slice_backward said x for dy and y for dx */
    T_ERR(dpar_slice_backward(a, NULL, start, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_slice_backward: dy is NULL");
    T_ERR(dpar_slice_backward(NULL, a, start, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_slice_backward: dx is NULL");
    const dpar_buffer *xs[2] = { a, NULL };
    T_ERR(dpar_concat(c, xs, 2, 0), DPAR_ERR_INVALID_ARGUMENT, "dpar_concat: xs[1] is NULL");
    /* one argument, not "runtime or desc" */
    dpar_mesh *m = NULL;
    T_ERR(dpar_mesh_create(NULL, &(dpar_mesh_desc){ .shape = { 1 }, .axis_names = { "d" } }, &m),
          DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_create: rt is NULL");
    m = t_mesh1(rt, 1, "d");
    T_ERR(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = NULL }), DPAR_ERR_INVALID_ARGUMENT,
          "dpar_shard_map: desc->fn is NULL");
    T_ERR(dpar_wait(NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_wait: req is NULL");
    T_ERR(dpar_cross_entropy(a, NULL, lg, lb, NULL), DPAR_ERR_SHAPE, "dpar_cross_entropy: loss must hold 1");
    dpar_graph *g1 = NULL, *g2 = NULL, *g3 = NULL;
    T_OK(dpar_graph_create(m, &g1));
    T_OK(dpar_graph_create(m, &g2));
    T_OK(dpar_graph_create(m, &g3));
    dpar_g_relu(g1, (dpar_value){ 999 });
    T_ERR(dpar_graph_status(g1), DPAR_ERR_INVALID_ARGUMENT, "dpar_g_relu: x (id 999) is not a value");
    /* the function the user called, not the shared check's */
    T_ERR(dpar_graph_adamw(g2, &(dpar_adamw_desc){ .learning_rate = 0.1f, .b2 = 2.0f }, NULL, NULL, 0),
          DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_adamw: b1 = 0.9, b2 = 2");
    T_ERR(dpar_graph_adamw_masked(g3, &(dpar_adamw_desc){ .b1 = -1.0f }, NULL, NULL, NULL, 0),
          DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_adamw_masked: b1 = -1");
    /* advice that holds: a pool strides by its window; only the bad field; all the sources of a shape */
    T_ERR(dpar_avg_pool2d(p, x, &(dpar_pool2d_desc){ .stride = { 0, -1 } }), DPAR_ERR_INVALID_ARGUMENT,
          "stride[1] = -1; use 0 (default: the window)");
    T_ERR(dpar_conv2d(dy, x, w, NULL, &(dpar_conv2d_desc){ .stride = { -1, 1 } }), DPAR_ERR_INVALID_ARGUMENT,
          "dpar_conv2d: stride[0] = -1; use 0 (default 1)");
    assert_null(strstr(dpar_last_error(), "dilation"));
    T_ERR(dpar_conv2d_backward_kernel(dw, NULL, x, dy, NULL), DPAR_ERR_SHAPE,
          "dy is [1, 4, 4, 3] but x, dw and d give [1, 4, 4, 4]");
    int64_t ys[4];
    T_ERR(dpar_conv2d_output_shape(x4, NULL, NULL, ys), DPAR_ERR_INVALID_ARGUMENT,
          "dpar_conv2d_output_shape: w_shape is NULL");
    T_ERR(dpar_pad(y, a, lo, 0.0f), DPAR_ERR_SHAPE, "dpar_pad: lo[0] = -1", "lo[0] = 0..1");
    assert_null(strstr(dpar_last_error(), "steps"));
    T_OK(dpar_graph_destroy(g1));
    T_OK(dpar_graph_destroy(g2));
    T_OK(dpar_graph_destroy(g3));
    T_OK(dpar_mesh_destroy(m));
    /* the graph calls name their graph g, as their prototypes do; a NULL buffer is b */
    float loss = 0.0f;
    T_ERR(dpar_graph_run(NULL, NULL, 0, &loss), DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run: g is NULL");
    dpar_value none = { 1 };
    assert_null(dpar_graph_feed_array(NULL, none));
    assert_non_null(strstr(dpar_last_error(), "dpar_graph_feed_array: g is NULL"));
    int64_t four = 4;
    T_ERR(dpar_buffer_reshape(NULL, 1, &four), DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_reshape: b is NULL");
    void *ptr = NULL;
    T_ERR(dpar_buffer_map(NULL, 0, 4, true, &ptr), DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_map: b is NULL");
    T_ERR(dpar_vulkan_buffer_release(NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_vulkan_buffer_release: b is NULL");
    dpar_buffer *all[] = { a, b, c, y, lg, lb, x, dw, dy, w, p };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) T_OK(dpar_buffer_destroy(all[i]));
    T_OK(dpar_runtime_destroy(rt));
    /* a runtime has no parent to have been released with */
    T_ERR(dpar_runtime_destroy(rt), DPAR_ERR_STATE, "dpar_runtime_destroy: the runtime is stale (destroyed); nothing",
          "stop using a runtime once it is destroyed");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mesh_ndim_inferred),
        cmocka_unit_test(test_shard_map_num_args_inferred),
        cmocka_unit_test(test_pmap_counts_inferred),
        cmocka_unit_test(test_destroy_status),
        cmocka_unit_test(test_threads_take_the_creators_fenv),
        cmocka_unit_test(test_set_last_error_wraps_itself),
        cmocka_unit_test(test_two_runtimes_message),
        cmocka_unit_test(test_operand_names),
        cmocka_unit_test(test_error_texts),
    };
    return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
