/* Runtime, devices, environment, mesh, groups, global arrays with specs,
   pmap / shard_map dispatch and their errors (CPU backend). */
#include "testutil.h"
#include <unistd.h>
#include <pthread.h>

static void clear_env(void) {
    unsetenv("DPAR_BACKEND");
    unsetenv("DPAR_DEVICES");
    unsetenv("DPAR_TIMEOUT_MS");
}
static int setup(void **st) {
    (void)st;
    clear_env();
    return 0;
}

/* ---- status, dtype and backend names ---- */
static void test_names(void **st) {
    (void)st;
    assert_string_equal(dpar_status_string(DPAR_OK), "DPAR_OK");
    assert_string_equal(dpar_status_string(DPAR_ERR_SHAPE), "DPAR_ERR_SHAPE");
    assert_string_equal(dpar_status_string(DPAR_ERR_TIMEOUT), "DPAR_ERR_TIMEOUT");
    assert_non_null(dpar_status_string((dpar_status)999));
    assert_int_equal(dpar_dtype_size(DPAR_F32), 4);
    assert_int_equal(dpar_dtype_size(DPAR_F16), 2);
    assert_int_equal(dpar_dtype_size(DPAR_BF16), 2);
    assert_int_equal(dpar_dtype_size(DPAR_I32), 4);
    assert_int_equal(dpar_dtype_size(DPAR_DTYPE_COUNT), 0);
    assert_string_equal(dpar_dtype_name(DPAR_BF16), "bf16");
    assert_string_equal(dpar_dtype_name(DPAR_DTYPE_COUNT), "invalid");
    assert_string_equal(dpar_backend_name(DPAR_BACKEND_CPU), "cpu");
    assert_string_equal(dpar_backend_name(DPAR_BACKEND_VULKAN), "vulkan");
    assert_string_equal(dpar_backend_name(DPAR_BACKEND_CUDA), "cuda");
    /* dpar_backend_from_name inverts dpar_backend_name */
    for (int k = DPAR_BACKEND_DEFAULT; k <= DPAR_BACKEND_CUDA; k++) {
        dpar_backend_kind got = DPAR_BACKEND_CUDA + 1;
        T_OK(dpar_backend_from_name(dpar_backend_name((dpar_backend_kind)k), &got));
        assert_int_equal(got, k);
    }
    dpar_backend_kind keep = DPAR_BACKEND_CPU;
    T_ERR(dpar_backend_from_name("gpu", &keep), DPAR_ERR_INVALID_ARGUMENT, "dpar_backend_from_name", "'gpu'",
          "cpu, vulkan");
    assert_int_equal(keep, DPAR_BACKEND_CPU);
    T_ERR(dpar_backend_from_name(NULL, &keep), DPAR_ERR_INVALID_ARGUMENT, "NULL");
}

/* ---- runtime and devices ---- */
static void test_runtime_basic(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 3);
    assert_string_equal(dpar_last_error(), "");
    assert_int_equal(dpar_runtime_device_count(rt), 3);
    assert_int_equal(dpar_runtime_backend(rt), DPAR_BACKEND_CPU);
    for (int d = 0; d < 3; d++) {
        dpar_device_info info;
        T_OK(dpar_runtime_device_info(rt, d, &info));
        char want[16];
        snprintf(want, sizeof want, "cpu:%d", d);
        assert_non_null(strstr(info.name, want));
        assert_int_equal(info.backend, DPAR_BACKEND_CPU);
        assert_int_equal(info.index, d);
        assert_true(info.memory_bytes > 0);
        assert_true(info.vendor[0] != 0);
        static const unsigned char zero[16];
        assert_memory_equal(info.uuid, zero, 16); /* emulated devices: no UUID */
    }
    dpar_device_info info;
    T_ERR(dpar_runtime_device_info(rt, 3, &info), DPAR_ERR_INVALID_ARGUMENT, "device 3", "3 devices");
    T_ERR(dpar_runtime_device_info(rt, -1, &info), DPAR_ERR_INVALID_ARGUMENT, "-1");
    T_ERR(dpar_runtime_device_info(rt, 0, NULL), DPAR_ERR_INVALID_ARGUMENT, "");
    dpar_runtime_destroy(rt);
    dpar_runtime_destroy(NULL); /* no-op */
    assert_int_equal(dpar_runtime_device_count(NULL), 0);
}

static void test_runtime_errors(void **st) {
    (void)st;
    dpar_runtime_desc d;
    dpar_runtime *rt = (dpar_runtime *)&d; /* must be reset to NULL on error */
    memset(&d, 0, sizeof d);
    T_ERR(dpar_runtime_create(&d, NULL), DPAR_ERR_INVALID_ARGUMENT, "out");
    d.backend = DPAR_BACKEND_CPU;
    d.num_devices = -2;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "-2");
    assert_null(rt);
    d.num_devices = 300;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_DEVICE_COUNT, "300", "256");
    assert_null(rt);
    d.num_devices = 2;
    d.timeout_ms = -5;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "-5");
    d.timeout_ms = 0;
    d.backend = (dpar_backend_kind)42;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "42");
    assert_null(rt);
    /* a backend that is not built in (or has no device here) is unavailable, never a crash */
    d.backend = DPAR_BACKEND_CUDA;
    dpar_status s = dpar_runtime_create(&d, &rt);
    if (s == DPAR_OK)
        dpar_runtime_destroy(rt);
    else {
        assert_int_equal(s, DPAR_ERR_BACKEND_UNAVAILABLE);
        assert_non_null(strstr(dpar_last_error(), "cuda"));
        assert_null(rt);
    }
}

static void test_env_backend_and_devices(void **st) {
    (void)st;
    dpar_runtime *rt = NULL;
    dpar_runtime_desc d = { 0 };
    setenv("DPAR_BACKEND", "cpu", 1);
    setenv("DPAR_DEVICES", "5", 1);
    T_OK(dpar_runtime_create(&d, &rt));
    assert_int_equal(dpar_runtime_backend(rt), DPAR_BACKEND_CPU);
    assert_int_equal(dpar_runtime_device_count(rt), 5);
    dpar_runtime_destroy(rt);
    /* NULL desc means all defaults too */
    T_OK(dpar_runtime_create(NULL, &rt));
    assert_int_equal(dpar_runtime_device_count(rt), 5);
    dpar_runtime_destroy(rt);
    /* the desc wins over the environment */
    d.num_devices = 2;
    T_OK(dpar_runtime_create(&d, &rt));
    assert_int_equal(dpar_runtime_device_count(rt), 2);
    dpar_runtime_destroy(rt);
    d.num_devices = 0;
    /* default count without DPAR_DEVICES: CPU gives 1 device per core, at most 8 */
    unsetenv("DPAR_DEVICES");
    T_OK(dpar_runtime_create(&d, &rt));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cores < 1 ? 1 : cores > 8 ? 8 : (int)cores;
    assert_int_equal(dpar_runtime_device_count(rt), want);
    dpar_runtime_destroy(rt);
    setenv("DPAR_DEVICES", "four", 1);
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "DPAR_DEVICES", "four");
    assert_null(rt);
    setenv("DPAR_DEVICES", "2", 1);
    setenv("DPAR_BACKEND", "tpu", 1);
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "DPAR_BACKEND", "tpu", "or default");
    assert_null(rt);
    setenv("DPAR_BACKEND", " cpu\t", 1); /* surrounding whitespace ignored, as by every DPAR_* variable */
    T_OK(dpar_runtime_create(&d, &rt));
    assert_int_equal(dpar_runtime_backend(rt), DPAR_BACKEND_CPU);
    dpar_runtime_destroy(rt);
    setenv("DPAR_BACKEND", "cpuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuu", 1);
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "DPAR_BACKEND='cpuuuu");
    assert_null(rt);
    /* an explicit backend in the desc ignores DPAR_BACKEND */
    d.backend = DPAR_BACKEND_CPU;
    T_OK(dpar_runtime_create(&d, &rt));
    assert_int_equal(dpar_runtime_device_count(rt), 2);
    dpar_runtime_destroy(rt);
    setenv("DPAR_TIMEOUT_MS", "-3", 1);
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "DPAR_TIMEOUT_MS");
    clear_env();
}

/* Every integer DPAR_* variable is checked against its range when a runtime
   is created, even one the desc overrides: non-numeric, negative, zero where
   1 is the least, absurdly large, trailing garbage. The text names the
   variable, its value and the range. */
static void test_env_ranges(void **st) {
    (void)st;
    static const struct {
        const char *var, *value, *range;
    } bad[] = {
        { "DPAR_DEVICES", "0", "1..256" },
        { "DPAR_DEVICES", "257", "1..256" },
        { "DPAR_DEVICES", "4x", "1..256" },
        { "DPAR_TIMEOUT_MS", "0", "1..1000000000" },
        { "DPAR_SPIN_US", "-1", "0..1000000" },
        { "DPAR_SPIN_US", "fast", "0..1000000" },
        { "DPAR_SPIN_US", "1000001", "0..1000000" },
        { "DPAR_CPU_THREADS", "0", "1..64" },
        { "DPAR_CPU_THREADS", "-2", "1..64" },
        { "DPAR_CPU_THREADS", "99999999999999999999", "1..64" },
        { "DPAR_GRAPH_ASYNC_BYTES", "-1", "0..2000000000" },
        { "DPAR_GRAPH_ASYNC_BYTES", "1M", "0..2000000000" },
        { "DPAR_GRAPH_RECORD", "banana", "0..1" }, /* it was taken as 1 */
        { "DPAR_GRAPH_RECORD", "2", "0..1" },
        { "DPAR_VK_DEVICE", "abc", "0..255" }, /* atoi took it as device 0 */
        { "DPAR_VK_DEVICE", "-1", "0..255" },
        { "DPAR_VK_NONCOHERENT", "2", "0..1" },
        { "DPAR_VK_FORCE_STAGING", "on", "0..1" },
        { "DPAR_DEVICES", "2 x", "1..256" },
    };
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_CPU, .num_devices = 1 };
    dpar_runtime *rt = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(bad[i].var, bad[i].value, 1);
        T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, bad[i].var, bad[i].value, bad[i].range);
        assert_null(rt);
        unsetenv(bad[i].var);
    }
    /* the ends of each range are accepted */
    setenv("DPAR_SPIN_US", "0", 1);
    setenv("DPAR_CPU_THREADS", "64", 1);
    setenv("DPAR_TIMEOUT_MS", "1000000000", 1);
    T_OK(dpar_runtime_create(&d, &rt));
    dpar_runtime_destroy(rt);
    unsetenv("DPAR_SPIN_US");
    unsetenv("DPAR_CPU_THREADS");
    /* surrounding whitespace is ignored by every variable alike ("2 " was refused while " 2" was taken), and a
       blank value is an unset one */
    static const struct {
        const char *value;
        int devices;
    } spaced[] = { { "3 ", 3 }, { " 3", 3 }, { "\t2\n", 2 }, { "  ", 0 } };
    dpar_runtime_desc d0 = { .backend = DPAR_BACKEND_CPU };
    for (size_t i = 0; i < sizeof spaced / sizeof spaced[0]; i++) {
        setenv("DPAR_DEVICES", spaced[i].value, 1);
        T_OK(dpar_runtime_create(&d0, &rt));
        if (spaced[i].devices && dpar_runtime_device_count(rt) != spaced[i].devices)
            fail_msg("DPAR_DEVICES='%s': %d devices, want %d", spaced[i].value, dpar_runtime_device_count(rt),
                     spaced[i].devices);
        dpar_runtime_destroy(rt);
    }
    clear_env();
}

/* Texts that misled (issue 15): "has 1 devices", a spec for a dimension the
   array lacks ignored silently. */
static void test_messages(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_buffer *b = NULL;
    int64_t sh[1] = { 4 };
    T_ERR(dpar_buffer_create(rt, 3, DPAR_F32, 1, sh, &b), DPAR_ERR_INVALID_ARGUMENT, "the runtime has 1 device");
    assert_null(strstr(dpar_last_error(), "1 devices"));
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_array *a = NULL;
    dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 1, .shape = { 4 }, .spec = { NULL, "data" } };
    T_ERR(dpar_array_create(m, &d, &a), DPAR_ERR_INVALID_ARGUMENT, "spec[1]", "\"data\"", "1 dimension;");
    assert_null(a);
    d.spec[1] = "";
    T_OK(dpar_array_create(m, &d, &a)); /* an empty spec is no spec */
    dpar_runtime_destroy(rt);
}

/* ---- buffers ---- */
static void test_buffers(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    int64_t sh[2] = { 3, 4 };
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(rt, 1, DPAR_F32, 2, sh, &b));
    assert_int_equal(dpar_buffer_count(b), 12);
    assert_int_equal(dpar_buffer_nbytes(b), 48);
    assert_int_equal(dpar_buffer_device(b), 1);
    assert_int_equal(dpar_buffer_ndim(b), 2);
    assert_int_equal(dpar_buffer_dim(b, 1), 4);
    assert_int_equal(dpar_buffer_dim(b, 2), -1);
    float z[12], v[12];
    T_OK(dpar_buffer_read(b, 0, z, sizeof z));
    for (int i = 0; i < 12; i++) {
        assert_true(z[i] == 0.0f);
        v[i] = (float)i;
    }
    T_OK(dpar_buffer_write(b, 0, v, sizeof v));
    T_OK(dpar_buffer_read(b, 16, z, 8));
    assert_true(z[0] == 4.0f && z[1] == 5.0f);
    T_ERR(dpar_buffer_write(b, 40, v, 16), DPAR_ERR_INVALID_ARGUMENT, "48");
    T_ERR(dpar_buffer_read(b, 49, z, 0), DPAR_ERR_INVALID_ARGUMENT, "");
    /* an offset near SIZE_MAX: the text gives offset and count, not a wrapped end ("bytes [18446744073709551613, 1)") */
    T_ERR(dpar_buffer_write(b, (size_t)-3, v, 4), DPAR_ERR_INVALID_ARGUMENT, "4 bytes at offset 18446744073709551613",
          "outside the 48-byte buffer");
    int64_t r[1] = { 12 }, bad[2] = { 5, 2 };
    T_OK(dpar_buffer_reshape(b, 1, r));
    assert_int_equal(dpar_buffer_ndim(b), 1);
    T_ERR(dpar_buffer_reshape(b, 2, bad), DPAR_ERR_SHAPE, "10", "12");
    dpar_buffer *x = NULL;
    T_ERR(dpar_buffer_create(rt, 2, DPAR_F32, 1, r, &x), DPAR_ERR_INVALID_ARGUMENT, "device 2");
    assert_null(x);
    int64_t neg = -1;
    T_ERR(dpar_buffer_create(rt, 0, DPAR_F32, 1, &neg, &x), DPAR_ERR_INVALID_ARGUMENT, "-1");
    T_ERR(dpar_buffer_create(rt, 0, DPAR_DTYPE_COUNT, 1, r, &x), DPAR_ERR_DTYPE, "");
    T_ERR(dpar_buffer_create(rt, 0, DPAR_F32, 9, r, &x), DPAR_ERR_INVALID_ARGUMENT, "");
    /* scalar and zero-size */
    T_OK(dpar_buffer_create(rt, 0, DPAR_I32, 0, NULL, &x));
    assert_int_equal(dpar_buffer_count(x), 1);
    dpar_buffer_destroy(x);
    int64_t zs[2] = { 0, 7 };
    T_OK(dpar_buffer_create(rt, 0, DPAR_BF16, 2, zs, &x));
    assert_int_equal(dpar_buffer_count(x), 0);
    T_OK(dpar_buffer_write(x, 0, NULL, 0));
    T_OK(dpar_runtime_device_sync(rt, 0));
    T_ERR(dpar_runtime_device_sync(rt, 5), DPAR_ERR_INVALID_ARGUMENT, "");
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(NULL);
    dpar_runtime_destroy(rt); /* frees b too */
}

/* ---- mesh ---- */
static dpar_status try_mesh(dpar_runtime *rt, int ndim, const int *shape, const char *const *names, const int *devs) {
    dpar_mesh_desc d = { .ndim = ndim };
    for (int i = 0; i < ndim && i < DPAR_MAX_AXES; i++) {
        d.shape[i] = shape[i];
        d.axis_names[i] = names[i];
    }
    d.devices = devs;
    dpar_mesh *m = (dpar_mesh *)&d;
    dpar_status s = dpar_mesh_create(rt, &d, &m);
    if (s == DPAR_OK)
        dpar_mesh_destroy(m);
    else
        assert_null(m);
    return s;
}
static void test_mesh_errors(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    int s8[1] = { 8 }, s2[1] = { 2 }, s22[2] = { 2, 1 }, s0[1] = { 0 }, s11111[5] = { 1, 1, 1, 1, 1 };
    const char *data[1] = { "data" }, *dup[2] = { "x", "x" }, *empty[1] = { "" }, *null[1] = { NULL },
               *comma[1] = { "a,b" }, *space[1] = { "a b" }, *five[5] = { "a", "b", "c", "d", "e" };
    const char *longname[1] = { "an_axis_name_that_is_far_too_long_for_dpar" };
    /* asking for an 8-device mesh when 2 devices exist */
    T_ERR(try_mesh(rt, 1, s8, data, NULL), DPAR_ERR_DEVICE_COUNT, "8", "2");
    T_ERR(try_mesh(rt, 2, s22, dup, NULL), DPAR_ERR_INVALID_ARGUMENT, "'x'");
    T_ERR(try_mesh(rt, 1, s2, empty, NULL), DPAR_ERR_INVALID_ARGUMENT, "empty");
    T_ERR(try_mesh(rt, 1, s2, null, NULL), DPAR_ERR_INVALID_ARGUMENT, "empty");
    T_ERR(try_mesh(rt, 1, s2, comma, NULL), DPAR_ERR_INVALID_ARGUMENT, "a,b");
    T_ERR(try_mesh(rt, 1, s2, space, NULL), DPAR_ERR_INVALID_ARGUMENT, "a b");
    T_ERR(try_mesh(rt, 1, s2, longname, NULL), DPAR_ERR_INVALID_ARGUMENT, "longer");
    T_ERR(try_mesh(rt, 1, s0, data, NULL), DPAR_ERR_INVALID_ARGUMENT, "size 0");
    T_ERR(try_mesh(rt, 0, s2, data, NULL), DPAR_ERR_INVALID_ARGUMENT, "ndim");
    T_ERR(try_mesh(rt, 5, s11111, five, NULL), DPAR_ERR_INVALID_ARGUMENT, "ndim");
    int rep[2] = { 1, 1 }, oor[2] = { 0, 2 };
    T_ERR(try_mesh(rt, 1, s2, data, rep), DPAR_ERR_INVALID_ARGUMENT, "device 1", "twice");
    T_ERR(try_mesh(rt, 1, s2, data, oor), DPAR_ERR_INVALID_ARGUMENT, "2");
    dpar_mesh *m = NULL;
    T_ERR(dpar_mesh_create(rt, NULL, &m), DPAR_ERR_INVALID_ARGUMENT, "");
    T_OK(try_mesh(rt, 1, s2, data, NULL));
    dpar_runtime_destroy(rt);
}

static void test_mesh_coords_2x4(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[2] = { 2, 4 };
    const char *names[2] = { "data", "model" };
    dpar_mesh *m = t_mesh(rt, 2, shape, names);
    assert_int_equal(dpar_mesh_ndim(m), 2);
    assert_int_equal(dpar_mesh_size(m), 8);
    assert_string_equal(dpar_mesh_axis_name(m, 1), "model");
    assert_null(dpar_mesh_axis_name(m, 2));
    int n;
    T_OK(dpar_mesh_axis_size(m, "model", &n));
    assert_int_equal(n, 4);
    T_OK(dpar_mesh_axis_size(m, "data,model", &n));
    assert_int_equal(n, 8);
    T_OK(dpar_mesh_axis_size(m, "model, data", &n));
    assert_int_equal(n, 8);
    T_ERR(dpar_mesh_axis_size(m, "batch", &n), DPAR_ERR_UNKNOWN_AXIS, "'batch'", "data, model");
    T_ERR(dpar_mesh_axis_size(m, "data,data", &n), DPAR_ERR_INVALID_ARGUMENT, "twice");
    T_ERR(dpar_mesh_axis_size(m, "", &n), DPAR_ERR_UNKNOWN_AXIS, "");
    T_ERR(dpar_mesh_axis_size(m, NULL, &n), DPAR_ERR_UNKNOWN_AXIS, "");
    for (int dev = 0; dev < 8; dev++) {
        int c[2], back;
        T_OK(dpar_mesh_coords(m, dev, c));
        assert_int_equal(c[0], dev / 4);
        assert_int_equal(c[1], dev % 4);
        T_OK(dpar_mesh_device(m, c, &back));
        assert_int_equal(back, dev);
    }
    int c[2] = { 1, 4 }, dev;
    T_ERR(dpar_mesh_device(m, c, &dev), DPAR_ERR_INVALID_ARGUMENT, "model");
    T_ERR(dpar_mesh_coords(m, 8, c), DPAR_ERR_INVALID_ARGUMENT, "8");
    /* groups: over data from device 5 = (1,1): {1,5}; over model: {4..7}; both: all */
    int mem[DPAR_MAX_DEVICES], idx;
    T_OK(dpar_mesh_group(m, "data", 5, mem, &n, &idx));
    assert_int_equal(n, 2);
    assert_int_equal(mem[0], 1);
    assert_int_equal(mem[1], 5);
    assert_int_equal(idx, 1);
    T_OK(dpar_mesh_group(m, "model", 5, mem, &n, &idx));
    assert_int_equal(n, 4);
    assert_int_equal(idx, 1);
    for (int i = 0; i < 4; i++) assert_int_equal(mem[i], 4 + i);
    T_OK(dpar_mesh_group(m, "data,model", 5, mem, &n, &idx));
    assert_int_equal(n, 8);
    assert_int_equal(idx, 5);
    for (int i = 0; i < 8; i++) assert_int_equal(mem[i], i);
    /* written order (JAX): rank = model * 2 + data, so member k is device (k % 2) * 4 + k / 2 */
    T_OK(dpar_mesh_group(m, "model,data", 6, mem, &n, &idx));
    for (int i = 0; i < 8; i++) assert_int_equal(mem[i], (i % 2) * 4 + i / 2);
    assert_int_equal(idx, 5); /* device 6 = (data 1, model 2) */
    T_ERR(dpar_mesh_group(m, "batch", 5, mem, &n, &idx), DPAR_ERR_UNKNOWN_AXIS, "'batch'", "(axes: data, model)");
    T_ERR(dpar_mesh_group(m, "data", 9, mem, &n, &idx), DPAR_ERR_INVALID_ARGUMENT, "9");
    dpar_runtime_destroy(rt);
}

/* 2x2x2: every axis set, brute force against the coordinates */
static void test_mesh_groups_2x2x2(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[3] = { 2, 2, 2 };
    const char *names[3] = { "a", "b", "c" };
    dpar_mesh *m = t_mesh(rt, 3, shape, names);
    const char *sets[7] = { "a", "b", "c", "a,b", "a,c", "b,c", "a,b,c" };
    const unsigned masks[7] = { 1, 2, 4, 3, 5, 6, 7 };
    for (int si = 0; si < 7; si++)
        for (int dev = 0; dev < 8; dev++) {
            int mem[DPAR_MAX_DEVICES], n, idx, want[8], wn = 0, widx = -1;
            int c0[3] = { dev >> 2, (dev >> 1) & 1, dev & 1 };
            for (int o = 0; o < 8; o++) { /* row-major over the mesh: o ascending keeps mesh order */
                int c[3] = { o >> 2, (o >> 1) & 1, o & 1 }, same = 1;
                for (int a = 0; a < 3; a++)
                    if (!(masks[si] & (1u << a)) && c[a] != c0[a]) same = 0;
                if (same) {
                    if (o == dev) widx = wn;
                    want[wn++] = o;
                }
            }
            T_OK(dpar_mesh_group(m, sets[si], dev, mem, &n, &idx));
            assert_int_equal(n, wn);
            assert_int_equal(idx, widx);
            for (int i = 0; i < n; i++) assert_int_equal(mem[i], want[i]);
        }
    /* the worked example: over (a,c) from device 3 = (0,1,1): {2,3,6,7}, index 1 */
    int mem[DPAR_MAX_DEVICES], n, idx;
    T_OK(dpar_mesh_group(m, "a,c", 3, mem, &n, &idx));
    assert_int_equal(n, 4);
    assert_int_equal(idx, 1);
    assert_int_equal(mem[0], 2);
    assert_int_equal(mem[1], 3);
    assert_int_equal(mem[2], 6);
    assert_int_equal(mem[3], 7);
    dpar_runtime_destroy(rt);
}

static void test_mesh_explicit_order(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int order[8] = { 7, 6, 5, 4, 3, 2, 1, 0 };
    dpar_mesh_desc d = { .ndim = 2, .shape = { 2, 4 }, .axis_names = { "data", "model" }, .devices = order };
    dpar_mesh *m;
    T_OK(dpar_mesh_create(rt, &d, &m));
    int c[2], dev, mem[DPAR_MAX_DEVICES], n, idx;
    T_OK(dpar_mesh_coords(m, 7, c));
    assert_int_equal(c[0], 0);
    assert_int_equal(c[1], 0);
    c[0] = 1;
    c[1] = 2;
    T_OK(dpar_mesh_device(m, c, &dev));
    assert_int_equal(dev, 1);
    T_OK(dpar_mesh_group(m, "model", 2, mem, &n, &idx));
    assert_int_equal(n, 4);
    assert_int_equal(idx, 1);
    assert_int_equal(mem[0], 3);
    assert_int_equal(mem[1], 2);
    assert_int_equal(mem[2], 1);
    assert_int_equal(mem[3], 0);
    /* a mesh over a subset of the devices: the others are not in it */
    int sub[2] = { 6, 3 };
    dpar_mesh_desc d2 = { .ndim = 1, .shape = { 2 }, .axis_names = { "data" }, .devices = sub };
    dpar_mesh *m2;
    T_OK(dpar_mesh_create(rt, &d2, &m2));
    T_ERR(dpar_mesh_coords(m2, 0, c), DPAR_ERR_INVALID_ARGUMENT, "not in the mesh");
    T_OK(dpar_mesh_coords(m2, 3, c));
    assert_int_equal(c[0], 1);
    dpar_mesh_destroy(m2);
    dpar_runtime_destroy(rt);
}

/* ---- global arrays ---- */
static void test_array_rows_over_4(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 2, .shape = { 8, 6 }, .spec = { "data" } };
    dpar_array *a;
    T_OK(dpar_array_create(m, &ad, &a));
    assert_int_equal(dpar_array_ndim(a), 2);
    assert_int_equal(dpar_array_dim(a, 0), 8);
    float host[48], back[48];
    for (int i = 0; i < 48; i++) host[i] = (float)i;
    T_OK(dpar_array_put(a, host));
    for (int dev = 0; dev < 4; dev++) {
        dpar_buffer *sh = dpar_array_shard(a, dev);
        assert_non_null(sh);
        assert_int_equal(dpar_buffer_ndim(sh), 2);
        assert_int_equal(dpar_buffer_dim(sh, 0), 2); /* 8 rows over 4 devices -> 2 rows each */
        assert_int_equal(dpar_buffer_dim(sh, 1), 6);
        assert_int_equal(dpar_buffer_device(sh), dev);
        float s[12];
        T_OK(dpar_buffer_read(sh, 0, s, sizeof s));
        for (int i = 0; i < 12; i++) assert_true(s[i] == (float)(dev * 12 + i));
    }
    assert_null(dpar_array_shard(a, 4));
    memset(back, 0, sizeof back);
    T_OK(dpar_array_get(a, back));
    assert_memory_equal(host, back, sizeof host);
    dpar_array_destroy(a);
    /* columns split: [4, 8] with spec (None, data) -> [4, 2] shards */
    ad = (dpar_array_desc){ .dtype = DPAR_I32, .ndim = 2, .shape = { 4, 8 }, .spec = { NULL, "data" } };
    T_OK(dpar_array_create(m, &ad, &a));
    int32_t ih[32], ib[32];
    for (int i = 0; i < 32; i++) ih[i] = i * 7 - 100;
    T_OK(dpar_array_put(a, ih));
    int32_t s3[8];
    T_OK(dpar_buffer_read(dpar_array_shard(a, 3), 0, s3, sizeof s3));
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 2; c++) assert_int_equal(s3[r * 2 + c], ih[r * 8 + 6 + c]);
    T_OK(dpar_array_get(a, ib));
    assert_memory_equal(ih, ib, sizeof ih);
    dpar_array_destroy(a);
    /* not divisible: an error naming both numbers */
    ad = (dpar_array_desc){ .dtype = DPAR_F32, .ndim = 1, .shape = { 6 }, .spec = { "data" } };
    a = (dpar_array *)&ad;
    T_ERR(dpar_array_create(m, &ad, &a), DPAR_ERR_SHAPE, "size 6", "4 devices");
    assert_null(a);
    ad.shape[0] = 8;
    ad.spec[0] = "batch";
    T_ERR(dpar_array_create(m, &ad, &a), DPAR_ERR_UNKNOWN_AXIS, "'batch'", "(axes: data)");
    ad.ndim = 2;
    ad.shape[1] = 4;
    ad.spec[0] = "data";
    ad.spec[1] = "data";
    T_ERR(dpar_array_create(m, &ad, &a), DPAR_ERR_INVALID_ARGUMENT, "");
    ad.ndim = 1;
    ad.spec[1] = NULL;
    ad.dtype = (dpar_dtype)17;
    T_ERR(dpar_array_create(m, &ad, &a), DPAR_ERR_DTYPE, "");
    /* a scalar (ndim 0) is replicated everywhere */
    ad = (dpar_array_desc){ .dtype = DPAR_F32, .ndim = 0 };
    T_OK(dpar_array_create(m, &ad, &a));
    float sc = 42.5f, scb = 0;
    T_OK(dpar_array_put(a, &sc));
    T_OK(dpar_array_get(a, &scb));
    assert_true(scb == 42.5f);
    T_OK(dpar_buffer_read(dpar_array_shard(a, 3), 0, &scb, 4));
    assert_true(scb == 42.5f);
    dpar_array_destroy(a);
    /* 3-d with the middle dimension split: [2, 8, 3] over data -> [2, 2, 3] */
    ad = (dpar_array_desc){ .dtype = DPAR_I32, .ndim = 3, .shape = { 2, 8, 3 }, .spec = { NULL, "data" } };
    T_OK(dpar_array_create(m, &ad, &a));
    int32_t g3[48], b3[48], s3d[12];
    for (int i = 0; i < 48; i++) g3[i] = i;
    T_OK(dpar_array_put(a, g3));
    T_OK(dpar_buffer_read(dpar_array_shard(a, 1), 0, s3d, sizeof s3d));
    for (int i0 = 0; i0 < 2; i0++)
        for (int i1 = 0; i1 < 2; i1++)
            for (int i2 = 0; i2 < 3; i2++)
                assert_int_equal(s3d[(i0 * 2 + i1) * 3 + i2], g3[(i0 * 8 + 2 + i1) * 3 + i2]);
    T_OK(dpar_array_get(a, b3));
    assert_memory_equal(g3, b3, sizeof g3);
    dpar_array_destroy(a);
    /* zero-size */
    ad = (dpar_array_desc){ .dtype = DPAR_F16, .ndim = 2, .shape = { 0, 4 }, .spec = { "data" } };
    T_OK(dpar_array_create(m, &ad, &a));
    uint16_t dummy[1] = { 0 };
    T_OK(dpar_array_put(a, dummy));
    T_OK(dpar_array_get(a, dummy));
    T_ERR(dpar_array_put(a, NULL), DPAR_ERR_INVALID_ARGUMENT, "");
    dpar_array_destroy(a);
    dpar_runtime_destroy(rt);
}

/* 2x4 mesh: both dims split, a combined axis, replication over the unused axis, every dtype */
static void array_specs_on(dpar_mesh *m) {
    const dpar_dtype dts[4] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };
    struct {
        int64_t s0, s1;
        const char *p0, *p1;
        int64_t l0, l1;
    } cases[] = {
        { 4, 8, "data", "model", 2, 2 },    { 8, 3, "data,model", NULL, 1, 3 },
        { 8, 3, "model,data", NULL, 1, 3 }, { 4, 6, "data", NULL, 2, 6 }, /* replicated over model */
        { 4, 8, NULL, "model", 4, 2 },                                    /* replicated over data */
        { 3, 5, NULL, NULL, 3, 5 },                                       /* fully replicated */
    };
    for (int t = 0; t < 4; t++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            dpar_array_desc ad = { .dtype = dts[t],
                                   .ndim = 2,
                                   .shape = { cases[ci].s0, cases[ci].s1 },
                                   .spec = { cases[ci].p0, cases[ci].p1 } };
            dpar_array *a;
            T_OK(dpar_array_create(m, &ad, &a));
            size_t es = dpar_dtype_size(dts[t]), cnt = (size_t)(cases[ci].s0 * cases[ci].s1);
            unsigned char host[256], back[256];
            for (size_t i = 0; i < cnt * es; i++) host[i] = (unsigned char)(i * 37 + 11 + (size_t)t);
            T_OK(dpar_array_put(a, host));
            memset(back, 0, sizeof back);
            T_OK(dpar_array_get(a, back));
            assert_memory_equal(host, back, cnt * es);
            for (int dev = 0; dev < 8; dev++) {
                dpar_buffer *b = dpar_array_shard(a, dev);
                assert_int_equal(dpar_buffer_dim(b, 0), cases[ci].l0);
                assert_int_equal(dpar_buffer_dim(b, 1), cases[ci].l1);
                /* shard content = the block its coordinates select */
                int c[2];
                T_OK(dpar_mesh_coords(m, dev, c));
                int64_t k0 = 0, k1 = 0;
                if (cases[ci].p0 && !strcmp(cases[ci].p0, "data")) k0 = c[0];
                if (cases[ci].p0 && !strcmp(cases[ci].p0, "data,model")) k0 = c[0] * 4 + c[1];
                if (cases[ci].p0 && !strcmp(cases[ci].p0, "model,data")) k0 = c[1] * 2 + c[0];
                if (cases[ci].p1 && !strcmp(cases[ci].p1, "model")) k1 = c[1];
                unsigned char sh[256];
                T_OK(dpar_buffer_read(b, 0, sh, dpar_buffer_nbytes(b)));
                for (int64_t i = 0; i < cases[ci].l0; i++)
                    for (int64_t j = 0; j < cases[ci].l1; j++) {
                        int64_t gi = k0 * cases[ci].l0 + i, gj = k1 * cases[ci].l1 + j;
                        if (memcmp(sh + (size_t)(i * cases[ci].l1 + j) * es,
                                   host + (size_t)(gi * cases[ci].s1 + gj) * es, es))
                            fail_msg("case %zu %s: device %d shard element (%lld,%lld) is not global (%lld,%lld)", ci,
                                     dpar_dtype_name(dts[t]), dev, (long long)i, (long long)j, (long long)gi,
                                     (long long)gj);
                    }
            }
            dpar_array_destroy(a);
        }
}
static void test_array_2x4_specs(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[2] = { 2, 4 };
    const char *names[2] = { "data", "model" };
    array_specs_on(t_mesh(rt, 2, shape, names));
    /* the same over a mesh with an explicit device order */
    int order[8] = { 6, 1, 4, 3, 0, 7, 2, 5 };
    dpar_mesh_desc md = { .ndim = 2, .shape = { 2, 4 }, .axis_names = { "data", "model" }, .devices = order };
    dpar_mesh *m2;
    T_OK(dpar_mesh_create(rt, &md, &m2));
    array_specs_on(m2);
    dpar_runtime_destroy(rt);
}

/* ---- pmap ---- */
typedef struct pm {
    int ran; /* atomic: how many devices ran fn */
    int idx[8], dev[8];
    dpar_status st;
    int fail_dev;
} pm;

static dpar_status double_fn(dpar_ctx *ctx, void *user) {
    pm *p = (pm *)user;
    __atomic_add_fetch(&p->ran, 1, __ATOMIC_SEQ_CST);
    int d = dpar_ctx_device(ctx), i;
    dpar_status s = dpar_ctx_axis_index(ctx, "data", &i);
    if (s) return s;
    p->idx[d] = i;
    p->dev[d] = d;
    dpar_buffer *in = dpar_ctx_arg(ctx, 0), *rep = dpar_ctx_arg(ctx, 1), *out = dpar_ctx_arg(ctx, 2);
    if (!in || !rep || !out) return DPAR_ERR_INVALID_ARGUMENT;
    if (dpar_buffer_ndim(in) != 1 || dpar_buffer_dim(in, 0) != 3 || dpar_buffer_dim(rep, 0) != 5) return DPAR_ERR_SHAPE;
    if (dpar_ctx_arg(ctx, 3) != NULL) return DPAR_ERR_STATE;
    if ((s = dpar_copy(out, in)) || (s = dpar_scale(out, 2.0f))) return s;
    float r[5];
    if ((s = dpar_buffer_read(rep, 0, r, sizeof r))) return s;
    float add[3] = { r[4], r[4], r[4] };
    float o[3];
    if ((s = dpar_buffer_read(out, 0, o, sizeof o))) return s;
    for (int k = 0; k < 3; k++) o[k] += add[k];
    return dpar_buffer_write(out, 0, o, sizeof o);
}
static void set_pmap(dpar_pmap_desc *d, pm *p, const float *x, int64_t lead, const float *rep, float *out, int nout) {
    memset(d, 0, sizeof *d);
    d->axis = "data";
    d->fn = double_fn;
    d->user = p;
    d->num_inputs = 2;
    d->num_outputs = 1;
    d->inputs[0].data = x;
    d->inputs[0].dtype = DPAR_F32;
    d->inputs[0].ndim = 2;
    d->inputs[0].shape[0] = lead;
    d->inputs[0].shape[1] = 3;
    d->inputs[0].in_axis = DPAR_MAPPED;
    d->inputs[1].data = rep;
    d->inputs[1].dtype = DPAR_F32;
    d->inputs[1].ndim = 1;
    d->inputs[1].shape[0] = 5;
    d->inputs[1].in_axis = DPAR_REPLICATED;
    d->outputs[0].data = out;
    d->outputs[0].dtype = DPAR_F32;
    d->outputs[0].ndim = 1;
    d->outputs[0].shape[0] = nout;
}
static void test_pmap_basics(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    float x[12], rep[5] = { 0, 0, 0, 0, 100 }, out[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i;
    pm p;
    memset(&p, 0, sizeof p);
    dpar_pmap_desc d;
    set_pmap(&d, &p, x, 4, rep, out, 3);
    T_OK(dpar_pmap(m, &d));
    assert_int_equal(p.ran, 4);
    for (int i = 0; i < 12; i++) assert_true(out[i] == 2.0f * (float)i + 100.0f);
    for (int k = 0; k < 4; k++) assert_int_equal(p.idx[k], k);
    dpar_runtime_destroy(rt);
}

/* Checked before anything runs: nothing runs partially, outputs untouched */
static void test_pmap_errors_before_running(void **st) {
    (void)st;
    float x[24], rep[5] = { 0 }, out[12];
    for (int i = 0; i < 24; i++) x[i] = (float)i;
    /* a 1-device axis with an input of leading dimension 5 */
    {
        dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
        dpar_mesh *m = t_mesh1(rt, 1, "data");
        pm p;
        memset(&p, 0, sizeof p);
        dpar_pmap_desc d;
        set_pmap(&d, &p, x, 5, rep, out, 3);
        for (int i = 0; i < 12; i++) out[i] = -1.0f;
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_SHAPE, "input 0", "leading dimension 5", "'data'", "has 1 device");
        assert_int_equal(p.ran, 0);
        for (int i = 0; i < 12; i++) assert_true(out[i] == -1.0f);
        dpar_runtime_destroy(rt);
    }
    {
        dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
        dpar_mesh *m = t_mesh1(rt, 4, "data");
        pm p;
        memset(&p, 0, sizeof p);
        dpar_pmap_desc d;
        /* 8 rows on 4 devices: an error in pmap ... */
        set_pmap(&d, &p, x, 8, rep, out, 3);
        for (int i = 0; i < 12; i++) out[i] = -1.0f;
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_SHAPE, "input 0", "leading dimension 8", "'data'", "4 devices");
        assert_int_equal(p.ran, 0);
        /* the second input is the bad one: still nothing runs */
        set_pmap(&d, &p, x, 4, rep, out, 3);
        d.inputs[1].in_axis = DPAR_MAPPED;
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_SHAPE, "input 1", "leading dimension 5");
        assert_int_equal(p.ran, 0);
        set_pmap(&d, &p, x, 4, rep, out, 3);
        d.axis = "batch";
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_UNKNOWN_AXIS, "'batch'", "(axes: data)");
        set_pmap(&d, &p, x, 4, rep, out, 3);
        d.inputs[0].data = NULL;
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_INVALID_ARGUMENT, "input 0");
        set_pmap(&d, &p, x, 4, rep, out, 3);
        d.inputs[1].in_axis = 7;
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_INVALID_ARGUMENT, "in_axis");
        set_pmap(&d, &p, x, 4, rep, out, 3);
        d.outputs[0].dtype = (dpar_dtype)9;
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_DTYPE, "output 0");
        set_pmap(&d, &p, x, 4, rep, out, 3);
        d.fn = NULL;
        T_ERR(dpar_pmap(m, &d), DPAR_ERR_INVALID_ARGUMENT, "");
        assert_int_equal(p.ran, 0);
        for (int i = 0; i < 12; i++) assert_true(out[i] == -1.0f);
        /* ... and 2 rows each in shard_map */
        dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 2, .shape = { 8, 3 }, .spec = { "data" } };
        dpar_array *a;
        T_OK(dpar_array_create(m, &ad, &a));
        T_OK(dpar_array_put(a, x));
        assert_int_equal(dpar_buffer_dim(dpar_array_shard(a, 2), 0), 2);
        dpar_runtime_destroy(rt);
    }
}

static dpar_status scale_shard_fn(dpar_ctx *ctx, void *user) {
    pm *p = (pm *)user;
    __atomic_add_fetch(&p->ran, 1, __ATOMIC_SEQ_CST);
    dpar_buffer *b = dpar_ctx_arg(ctx, 0);
    if (!b || dpar_buffer_dim(b, 0) != 2) return DPAR_ERR_SHAPE;
    int i;
    dpar_status s = dpar_ctx_axis_index(ctx, "data", &i);
    if (s) return s;
    return dpar_scale(b, (float)(i + 1));
}
static void test_shard_map(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 2, .shape = { 8, 3 }, .spec = { "data" } };
    dpar_array *a;
    T_OK(dpar_array_create(m, &ad, &a));
    float x[24], y[24];
    for (int i = 0; i < 24; i++) x[i] = 1.0f;
    T_OK(dpar_array_put(a, x));
    pm p;
    memset(&p, 0, sizeof p);
    dpar_shard_map_desc sd = { .fn = scale_shard_fn, .user = &p, .num_args = 1, .args = { a } };
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_array_get(a, y));
    for (int i = 0; i < 24; i++) assert_true(y[i] == (float)(i / 6 + 1));
    /* an array of another mesh */
    dpar_mesh *m2 = t_mesh1(rt, 4, "data");
    T_ERR(dpar_shard_map(m2, &sd), DPAR_ERR_INVALID_ARGUMENT, "another mesh");
    sd.num_args = 33;
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_INVALID_ARGUMENT, "num_args");
    dpar_runtime_destroy(rt);
}

/* pmap over one axis of a 2x4 mesh: outputs come from the devices whose other coordinates are 0 */
static dpar_status model_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    int di, mi;
    dpar_status s = dpar_ctx_axis_index(ctx, "data", &di);
    if (!s) s = dpar_ctx_axis_index(ctx, "model", &mi);
    if (s) return s;
    float v = (float)(di * 100 + mi);
    return dpar_fill(dpar_ctx_arg(ctx, 0), v);
}
static void test_pmap_on_2x4(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[2] = { 2, 4 };
    const char *names[2] = { "data", "model" };
    dpar_mesh *m = t_mesh(rt, 2, shape, names);
    float out[8] = { 0 };
    dpar_pmap_desc d = { .axis = "model",
                         .fn = model_fn,
                         .num_outputs = 1,
                         .outputs[0].data = out,
                         .outputs[0].dtype = DPAR_F32,
                         .outputs[0].ndim = 1,
                         .outputs[0].shape[0] = 2 };
    T_OK(dpar_pmap(m, &d));
    for (int k = 0; k < 4; k++) {
        assert_true(out[2 * k] == (float)k);
        assert_true(out[2 * k + 1] == (float)k);
    }
    dpar_runtime_destroy(rt);
}

/* the first error of any device is returned, prefixed "device D: "; the
   others, waiting in a collective, are stopped (never a hang) */
static dpar_status fail_fn(dpar_ctx *ctx, void *user) {
    pm *p = (pm *)user;
    int d = dpar_ctx_device(ctx);
    int64_t two = 2, three = 3;
    dpar_buffer *x, *y;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &two, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &three, &y);
    if (s) return s;
    if (d == p->fail_dev) return dpar_axpy(x, 1.0f, y); /* shape error */
    s = dpar_psum(ctx, x, x, "data");
    if (s != DPAR_ERR_ABORTED) return DPAR_ERR_STATE; /* must have been stopped */
    return s;
}
static dpar_status nested_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_shard_map_desc sd = { .fn = nested_fn };
    dpar_status s = dpar_shard_map(dpar_ctx_mesh(ctx), &sd);
    return s == DPAR_ERR_STATE ? DPAR_OK : DPAR_ERR_BACKEND;
}
static void test_first_error_wins(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    pm p;
    memset(&p, 0, sizeof p);
    p.fail_dev = 2;
    dpar_shard_map_desc sd = { .fn = fail_fn, .user = &p };
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_SHAPE, "device 2: ", "axpy", "[3]", "[2]");
    /* and the runtime keeps working */
    sd.fn = nested_fn;
    T_OK(dpar_shard_map(m, &sd));
    assert_string_equal(dpar_last_error(), "");
    T_ERR(dpar_shard_map(NULL, &sd), DPAR_ERR_INVALID_ARGUMENT, "");
    dpar_runtime_destroy(rt);
}

/* two meshes of one runtime, used one after the other */
static dpar_status idx_fn(dpar_ctx *ctx, void *user) {
    pm *p = (pm *)user;
    int i;
    dpar_status s = dpar_ctx_axis_index(ctx, dpar_mesh_axis_name(dpar_ctx_mesh(ctx), 0), &i);
    p->idx[dpar_ctx_device(ctx)] = i;
    p->dev[dpar_ctx_device(ctx)] = 1;
    if (!s) {
        int bad;
        s = dpar_ctx_axis_index(ctx, "nope", &bad) == DPAR_ERR_UNKNOWN_AXIS ? DPAR_OK : DPAR_ERR_STATE;
    }
    return s;
}
static void test_two_meshes(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    int sub[2] = { 3, 1 };
    dpar_mesh_desc md = { .ndim = 1, .shape = { 2 }, .axis_names = { "pair" }, .devices = sub };
    dpar_mesh *m2, *m4 = t_mesh1(rt, 4, "data");
    T_OK(dpar_mesh_create(rt, &md, &m2));
    pm p;
    memset(&p, 0, sizeof p);
    dpar_shard_map_desc sd = { .fn = idx_fn, .user = &p };
    T_OK(dpar_shard_map(m2, &sd));
    assert_int_equal(p.dev[0], 0);
    assert_int_equal(p.dev[2], 0); /* not in the mesh: did not run */
    assert_int_equal(p.idx[3], 0);
    assert_int_equal(p.idx[1], 1);
    memset(&p, 0, sizeof p);
    T_OK(dpar_shard_map(m4, &sd));
    for (int k = 0; k < 4; k++) {
        assert_int_equal(p.dev[k], 1);
        assert_int_equal(p.idx[k], k);
    }
    dpar_runtime_destroy(rt);
}

/* pmap / shard_map called from several host threads: one dispatch at a time
   per runtime, every result right, no deadlock; two runtimes side by side */
typedef struct cc {
    dpar_mesh *m;
    int bad;
    int iters;
    float base;
} cc;
static dpar_status psum_fn(dpar_ctx *ctx, void *user) {
    cc *c = (cc *)user;
    int64_t one = 1;
    dpar_buffer *x = NULL;
    int i;
    dpar_status s = dpar_ctx_axis_index(ctx, dpar_mesh_axis_name(dpar_ctx_mesh(ctx), 0), &i);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &x);
    if (!s) s = dpar_fill(x, c->base + (float)i);
    if (!s) s = dpar_psum(ctx, x, x, dpar_mesh_axis_name(dpar_ctx_mesh(ctx), 0));
    float v = 0;
    if (!s) s = dpar_buffer_read(x, 0, &v, 4);
    int n = 0;
    if (!s) s = dpar_ctx_axis_size(ctx, dpar_mesh_axis_name(dpar_ctx_mesh(ctx), 0), &n);
    if (!s && v != c->base * (float)n + (float)(n * (n - 1) / 2)) __atomic_add_fetch(&c->bad, 1, __ATOMIC_SEQ_CST);
    dpar_buffer_destroy(x);
    return s;
}
static void *cc_thread(void *arg) {
    cc *c = (cc *)arg;
    dpar_shard_map_desc sd = { .fn = psum_fn, .user = c };
    for (int k = 0; k < c->iters; k++)
        if (dpar_shard_map(c->m, &sd) != DPAR_OK) __atomic_add_fetch(&c->bad, 1000, __ATOMIC_SEQ_CST);
    return NULL;
}
static void test_concurrent_dispatch(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4), *rt2 = t_runtime(DPAR_BACKEND_CPU, 2);
    int shape[2] = { 2, 2 };
    const char *names[2] = { "x", "y" };
    cc c[4] = { { t_mesh1(rt, 4, "data"), 0, 10, 1.0f },
                { t_mesh(rt, 2, shape, names), 0, 10, 10.0f },
                { t_mesh1(rt, 4, "data"), 0, 10, 100.0f },
                { t_mesh1(rt2, 2, "data"), 0, 10, 5.0f } };
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, cc_thread, &c[i]), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) assert_int_equal(c[i].bad, 0);
    dpar_runtime_destroy(rt);
    dpar_runtime_destroy(rt2);
}

/* Review regressions: element counts that overflow int64, row ranges that
   overflow, a second wait on one request, destroying shards or meshes from the
   wrong place. Each must be an error, never a crash or a silent OK. */
static dpar_status wait_twice(dpar_ctx *ctx, void *user) {
    (void)user;
    int64_t n = 4;
    dpar_buffer *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &n, &b);
    if (s) return s;
    dpar_request *r;
    if ((s = dpar_preduce_start(ctx, b, b, "data", DPAR_SUM, &r))) return s;
    if ((s = dpar_wait(ctx, r))) return s;
    T_ERR(dpar_wait(ctx, r), DPAR_ERR_INVALID_ARGUMENT, "not a pending request");
    dpar_runtime_destroy(dpar_ctx_runtime(ctx)); /* refused inside fn */
    assert_non_null(strstr(dpar_last_error(), "inside a pmap"));
    dpar_mesh_destroy(dpar_ctx_mesh(ctx));
    assert_non_null(strstr(dpar_last_error(), "inside a pmap"));
    dpar_buffer_destroy(b);
    return DPAR_OK;
}
static void test_review_regressions(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_buffer *b = NULL;
    int64_t big2[2] = { (int64_t)1 << 24, (int64_t)1 << 40 },
            big3[3] = { (int64_t)1 << 22, (int64_t)1 << 21, (int64_t)1 << 21 };
    T_ERR(dpar_buffer_create(rt, 0, DPAR_F32, 2, big2, &b), DPAR_ERR_INVALID_ARGUMENT, "too large");
    assert_null(b);
    T_ERR(dpar_buffer_create(rt, 0, DPAR_F32, 3, big3, &b), DPAR_ERR_INVALID_ARGUMENT, "too large");
    int64_t zero_big[3] = { 0, (int64_t)1 << 40, (int64_t)1 << 40 };
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 3, zero_big, &b)); /* zero-size is fine */
    assert_int_equal(dpar_buffer_count(b), 0);
    dpar_buffer_destroy(b);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array_desc ad = {
        .dtype = DPAR_F32, .ndim = 2, .shape = { (int64_t)1 << 40, (int64_t)1 << 24 }, .spec = { "data" }
    };
    dpar_array *a = NULL;
    T_ERR(dpar_array_create(m, &ad, &a), DPAR_ERR_INVALID_ARGUMENT, "too large");
    ad.shape[0] = 8;
    ad.shape[1] = 2;
    T_OK(dpar_array_create(m, &ad, &a));
    float h[16] = { 0 };
    T_ERR(dpar_array_put_rows(a, INT64_MAX, 2, h), DPAR_ERR_SHAPE, "outside");
    T_ERR(dpar_array_put_rows(a, 2, INT64_MAX, h), DPAR_ERR_SHAPE, "outside");
    dpar_buffer_destroy(dpar_array_shard(a, 0)); /* a shard: refused, the array keeps it */
    assert_non_null(strstr(dpar_last_error(), "shard"));
    T_OK(dpar_array_put(a, h));
    dpar_shard_map_desc sd = { .fn = wait_twice };
    T_OK(dpar_shard_map(m, &sd));
    dpar_runtime_destroy(rt);
}

/* The default backend is never a software GPU (llvmpipe) when the CPU backend
   runs on the same cores; the CPU backend's devices say they run on the CPU. */
static void test_default_backend_not_software(void **st) {
    (void)st;
    dpar_runtime_desc d = { .num_devices = 1 };
    dpar_runtime *rt = NULL;
    T_OK(dpar_runtime_create(&d, &rt));
    dpar_device_info info;
    T_OK(dpar_runtime_device_info(rt, 0, &info));
    if (dpar_runtime_backend(rt) == DPAR_BACKEND_CPU)
        assert_int_equal(info.runs_on_cpu, 1);
    else
        assert_int_equal(info.runs_on_cpu, 0);
    dpar_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_names, setup),
        cmocka_unit_test_setup(test_runtime_basic, setup),
        cmocka_unit_test_setup(test_runtime_errors, setup),
        cmocka_unit_test_setup(test_env_backend_and_devices, setup),
        cmocka_unit_test_setup(test_env_ranges, setup),
        cmocka_unit_test_setup(test_messages, setup),
        cmocka_unit_test_setup(test_buffers, setup),
        cmocka_unit_test_setup(test_mesh_errors, setup),
        cmocka_unit_test_setup(test_mesh_coords_2x4, setup),
        cmocka_unit_test_setup(test_mesh_groups_2x2x2, setup),
        cmocka_unit_test_setup(test_mesh_explicit_order, setup),
        cmocka_unit_test_setup(test_array_rows_over_4, setup),
        cmocka_unit_test_setup(test_array_2x4_specs, setup),
        cmocka_unit_test_setup(test_pmap_basics, setup),
        cmocka_unit_test_setup(test_pmap_errors_before_running, setup),
        cmocka_unit_test_setup(test_shard_map, setup),
        cmocka_unit_test_setup(test_pmap_on_2x4, setup),
        cmocka_unit_test_setup(test_first_error_wins, setup),
        cmocka_unit_test_setup(test_two_meshes, setup),
        cmocka_unit_test_setup(test_concurrent_dispatch, setup),
        cmocka_unit_test_setup(test_review_regressions, setup),
        cmocka_unit_test_setup(test_default_backend_not_software, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
