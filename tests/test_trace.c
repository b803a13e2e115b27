/* Tracing (DPAR_TRACE / dpar_trace_*): the file is valid JSON in the Chrome
   trace format with one track per device (ops, collectives, waits) and one per
   device's communication thread; and the stats call (memory in use, peak,
   op and collective counts, collective bytes). */
#include "testutil.h"
#include <unistd.h>
#include <ctype.h>
#include <time.h>

/* ---- a strict JSON validator (RFC 8259), enough to reject a broken file ---- */
static const char *js_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}
static const char *js_value(const char *p, int depth);
static const char *js_string(const char *p) {
    if (*p != '"') return NULL;
    for (p++; *p != '"'; p++) {
        if (!*p || (unsigned char)*p < 0x20) return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!isxdigit((unsigned char)p[i])) return NULL;
                p += 4;
            } else if (!strchr("\"\\/bfnrt", *p) || !*p)
                return NULL;
        }
    }
    return p + 1;
}
static const char *js_number(const char *p) {
    if (*p == '-') p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (isdigit((unsigned char)*p)) p++;
    else
        return NULL;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return NULL;
        while (isdigit((unsigned char)*p)) p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return NULL;
        while (isdigit((unsigned char)*p)) p++;
    }
    return p;
}
static const char *js_value(const char *p, int depth) {
    if (depth > 64) return NULL;
    p = js_ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        int obj = *p == '{';
        p = js_ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (obj) {
                p = js_string(js_ws(p));
                if (!p) return NULL;
                p = js_ws(p);
                if (*p != ':') return NULL;
                p++;
            }
            p = js_value(p, depth + 1);
            if (!p) return NULL;
            p = js_ws(p);
            if (*p == ',') {
                p++;
                continue;
            }
            if (*p == close) return p + 1;
            return NULL;
        }
    }
    if (*p == '"') return js_string(p);
    if (!strncmp(p, "true", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    if (!strncmp(p, "null", 4)) return p + 4;
    return js_number(p);
}
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = (char *)malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}
static void check_json(const char *path, char **text) {
    char *s = slurp(path);
    if (!s) fail_msg("trace file %s was not written", path);
    const char *end = js_value(s, 0);
    if (!end || *js_ws(end))
        fail_msg("trace file %s is not valid JSON (at byte %ld)", path, end ? (long)(end - s) : -1L);
    assert_non_null(strstr(s, "\"traceEvents\""));
    /* a second opinion when python3 is around */
    if (system("command -v python3 >/dev/null 2>&1") == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "python3 -m json.tool '%s' >/dev/null", path);
        assert_int_equal(system(cmd), 0);
    }
    *text = s;
}
static int count(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub)) n++;
    return n;
}

/* ---- a small step: ops, a blocking psum, an async psum + wait ---- */
static dpar_status work(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *a = dpar_ctx_arg(ctx, 0), *b = dpar_ctx_arg(ctx, 1), *c = dpar_ctx_arg(ctx, 2);
    dpar_status s;
    if ((s = dpar_fill(a, 1.0f)) || (s = dpar_fill(b, 2.0f))) return s;
    if ((s = dpar_matmul(c, a, b, false, false, 1.0f, 0.0f))) return s;
    if ((s = dpar_psum(ctx, c, c, "data"))) return s;
    dpar_request *r;
    if ((s = dpar_preduce_start(ctx, a, a, "data", DPAR_SUM, &r))) return s;
    return dpar_wait(ctx, r);
}
static void run_work(dpar_runtime *rt, int n) {
    dpar_mesh *m = t_mesh1(rt, n, "data");
    dpar_array *arr[3];
    for (int i = 0; i < 3; i++) {
        dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 2, .shape = { 8, 8 } };
        T_OK(dpar_array_create(m, &d, &arr[i]));
    }
    dpar_shard_map_desc sd = { .fn = work, .num_args = 3 };
    for (int i = 0; i < 3; i++) sd.args[i] = arr[i];
    for (int k = 0; k < 3; k++) T_OK(dpar_shard_map(m, &sd));
}

static char tmpdir[64];

/* DPAR_TRACE set before the process's first runtime: written at destroy.
   A path that cannot be written is refused by name (not dropped silently),
   and the next runtime tries DPAR_TRACE again. */
static void test_env_trace(void **state) {
    (void)state;
    char path[128];
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_CPU, .num_devices = 2 };
    dpar_runtime *rt = NULL;
    snprintf(path, sizeof path, "%s/no/such/dir/env.json", tmpdir);
    setenv("DPAR_TRACE", path, 1);
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_IO, "DPAR_TRACE", "no/such/dir/env.json", "cannot be written");
    assert_null(rt);
    snprintf(path, sizeof path, "%s/env.json", tmpdir);
    setenv("DPAR_TRACE", path, 1);
    rt = t_runtime(DPAR_BACKEND_CPU, 2);
    run_work(rt, 2);
    dpar_runtime_destroy(rt);
    unsetenv("DPAR_TRACE");
    char *s;
    check_json(path, &s);
    /* one track per device, plus each device's comm thread */
    assert_non_null(strstr(s, "\"name\":\"device 0\""));
    assert_non_null(strstr(s, "\"name\":\"device 1\""));
    assert_non_null(strstr(s, "\"name\":\"device 0 comm\""));
    assert_non_null(strstr(s, "\"name\":\"device 1 comm\""));
    assert_non_null(strstr(s, "\"name\":\"host\""));
    /* 3 steps x 2 devices: 3 matmuls each, 3 blocking psums, 3 async psums (each with its hand-off on
       the worker's track), 3 waits */
    assert_int_equal(count(s, "\"name\":\"matmul\""), 6);
    assert_int_equal(count(s, "\"name\":\"fill\""), 12);
    assert_int_equal(count(s, "\"cat\":\"collective\""), 6);
    assert_int_equal(count(s, "\"cat\":\"collective async\""), 6);
    assert_int_equal(count(s, "\"cat\":\"collective start\""), 6);
    assert_int_equal(count(s, "\"name\":\"wait\""), 6);
    assert_int_equal(count(s, "\"name\":\"dispatch\""), 3);
    assert_int_equal(count(s, "\"bytes\":256"), 18); /* 8x8 f32 per collective and per hand-off */
    assert_non_null(strstr(s, "\"ph\":\"X\""));
    free(s);
    T_OK(dpar_trace_end());
}

/* dpar_trace_begin / flush / end, over two runtimes (two processes in the trace) */
static void test_api_trace(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/api.json", tmpdir);
    T_ERR(dpar_trace_flush(), DPAR_ERR_STATE, "DPAR_TRACE");
    T_ERR(dpar_trace_begin(""), DPAR_ERR_INVALID_ARGUMENT, "path");
    T_OK(dpar_trace_begin(path));
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    run_work(rt, 4);
    T_OK(dpar_trace_flush());
    char *s;
    check_json(path, &s); /* valid while still recording */
    assert_int_equal(count(s, "\"name\":\"matmul\""), 12);
    free(s);
    dpar_runtime *rt2 = t_runtime(DPAR_BACKEND_CPU, 2);
    run_work(rt2, 2);
    dpar_runtime_destroy(rt2);
    dpar_runtime_destroy(rt);
    T_OK(dpar_trace_end());
    check_json(path, &s);
    assert_int_equal(count(s, "\"name\":\"matmul\""), 18);
    assert_true(count(s, "\"name\":\"process_name\"") >= 2);
    free(s);
    T_ERR(dpar_trace_end(), DPAR_ERR_STATE, "dpar_trace_end: not tracing"); /* it named dpar_trace_flush */
    /* bad path: an IO error naming it, at once, and nothing starts */
    T_ERR(dpar_trace_begin("/nonexistent-dir/x/trace.json"), DPAR_ERR_IO, "/nonexistent-dir/x/trace.json");
    T_ERR(dpar_trace_end(), DPAR_ERR_STATE, "not tracing");
}

/* Ops of a kind that several public ops share are traced (and named in backend errors) as the op called:
   layer_norm, rms_norm, log_softmax; the trace said "norm" for both norms and "softmax" for log_softmax. */
static void test_shared_kind_names(void **state) {
    (void)state;
    char path[128], *s;
    snprintf(path, sizeof path, "%s/kinds.json", tmpdir);
    T_OK(dpar_trace_begin(path));
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    int64_t sh[2] = { 2, 4 }, ss[2] = { 2, 2 };
    float x[8] = { 1, 2, 3, 4, 5, 6, 7, 9 };
    dpar_buffer *bx = t_buf(rt, 0, DPAR_F32, 2, sh, x), *by = t_buf(rt, 0, DPAR_F32, 2, sh, NULL);
    dpar_buffer *st = t_buf(rt, 0, DPAR_F32, 2, ss, NULL);
    T_OK(dpar_layer_norm(by, st, bx, NULL, NULL, 1e-5f));
    T_OK(dpar_rms_norm(by, st, bx, NULL, NULL, 1e-5f));
    T_OK(dpar_rms_norm(by, st, bx, NULL, NULL, 1e-5f));
    T_OK(dpar_softmax(by, bx, true));
    T_OK(dpar_softmax(by, bx, false));
    int64_t one = 1, two = 2;
    int32_t lab[2] = { 1, 3 };
    dpar_buffer *loss = t_buf(rt, 0, DPAR_F32, 1, &one, NULL), *bl = t_buf(rt, 0, DPAR_I32, 1, &two, lab);
    T_OK(dpar_softmax_xent(loss, by, bx, bl));
    T_OK(dpar_cross_entropy(loss, by, bx, bl, NULL)); /* was traced (and refused) as "softmax_xent" */
    T_OK(dpar_trace_end());
    check_json(path, &s);
    assert_int_equal(count(s, "\"name\":\"layer_norm\""), 1);
    assert_int_equal(count(s, "\"name\":\"rms_norm\""), 2);
    assert_int_equal(count(s, "\"name\":\"log_softmax\""), 1);
    assert_int_equal(count(s, "\"name\":\"softmax\""), 1);
    assert_int_equal(count(s, "\"name\":\"norm\""), 0);
    assert_int_equal(count(s, "\"name\":\"softmax_xent\""), 1);
    assert_int_equal(count(s, "\"name\":\"cross_entropy\""), 1);
    free(s);
    dpar_buffer_destroy(bx), dpar_buffer_destroy(by), dpar_buffer_destroy(st);
    dpar_buffer_destroy(loss), dpar_buffer_destroy(bl);
    dpar_runtime_destroy(rt);
}

/* Every track of the trace has its name, however late it first appears: a second runtime's tracks after
   the first's 5,000 events had none (the metadata scan stopped at event 4,096); an event's name and category
   are escaped (a quote made the file invalid JSON). */
static dpar_status many_ops(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_status s = DPAR_OK;
    for (int i = 0; i < 5000 && !s; i++) s = dpar_scale(dpar_ctx_arg(ctx, 0), 1.0f);
    return s;
}
static void test_late_tracks(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/late.json", tmpdir);
    T_OK(dpar_trace_begin(path));
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_array *a;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ .dtype = DPAR_F32, .ndim = 1, .shape = { 4 } }, &a));
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = many_ops, .num_args = 1, .args = { a } }));
    dpar_runtime *rt2 = t_runtime(DPAR_BACKEND_CPU, 2);
    run_work(rt2, 2);
    double t0 = dpar_trace_clock_us(); /* a user's name with JSON's special characters: escaped */
    dpar_trace_event(rt2, 1, "quote\"back\\slash\nnl\ttab", "c\"at", t0, t0 + 1.0, -1);
    dpar_runtime_destroy(rt2);
    dpar_runtime_destroy(rt);
    T_OK(dpar_trace_end());
    char *s;
    check_json(path, &s);
    assert_non_null(strstr(s, "\"name\":\"quote\\\"back\\\\slash\\u000anl\\u0009tab\",\"cat\":\"c\\\"at\""));
    int events = 0, last_pid = -1, last_tid = -1;
    for (const char *p = strstr(s, "\"ph\":\"X\""); p; p = strstr(p + 1, "\"ph\":\"X\""), events++) {
        int pid = -1, tid = -1;
        const char *q = strstr(p, "\"pid\":");
        if (!q || sscanf(q, "\"pid\":%d,\"tid\":%d", &pid, &tid) != 2) fail_msg("%s", "an event without pid, tid");
        if (pid == last_pid && tid == last_tid) continue;
        last_pid = pid, last_tid = tid;
        char want[96];
        snprintf(want, sizeof want, "\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,", pid, tid);
        if (!strstr(s, want)) fail_msg("track pid %d tid %d has no thread_name", pid, tid);
    }
    assert_true(events > 5000);
    free(s);
}

/* stats: memory in use and peak per device, op and collective counts and bytes */
static dpar_status psums(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *a = dpar_ctx_arg(ctx, 0);
    dpar_status s;
    if ((s = dpar_scale(a, 2.0f))) return s;
    for (int i = 0; i < 3; i++)
        if ((s = dpar_psum(ctx, a, a, "data"))) return s;
    return DPAR_OK;
}
static void test_stats(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_device_stats st;
    T_OK(dpar_runtime_device_stats(rt, 0, &st));
    assert_int_equal((int)st.memory_in_use, 0);
    assert_int_equal((int)st.buffers, 0);
    int64_t s1 = 1000, s2 = 2000;
    dpar_buffer *b1, *b2, *b3;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &s1, &b1));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F16, 1, &s2, &b2));
    T_OK(dpar_buffer_create(rt, 1, DPAR_F32, 1, &s2, &b3));
    T_OK(dpar_runtime_device_stats(rt, 0, &st));
    assert_int_equal((int)st.memory_in_use, 4000 + 4000);
    assert_int_equal((int)st.memory_peak, 8000);
    assert_int_equal((int)st.buffers, 2);
    dpar_buffer_destroy(b1);
    T_OK(dpar_runtime_device_stats(rt, 0, &st));
    assert_int_equal((int)st.memory_in_use, 4000);
    assert_int_equal((int)st.memory_peak, 8000);
    assert_int_equal((int)st.buffers, 1);
    T_OK(dpar_runtime_device_stats(rt, 1, &st));
    assert_int_equal((int)st.memory_in_use, 8000);
    dpar_buffer_destroy(b2);
    dpar_buffer_destroy(b3);
    dpar_runtime_stats_reset(rt);
    T_OK(dpar_runtime_device_stats(rt, 0, &st));
    assert_int_equal((int)st.memory_peak, 0);

    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *a;
    dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 1, .shape = { 250 } };
    T_OK(dpar_array_create(m, &d, &a));
    dpar_shard_map_desc sd = { .fn = psums, .num_args = 1, .args = { a } };
    T_OK(dpar_shard_map(m, &sd));
    for (int dev = 0; dev < 2; dev++) {
        T_OK(dpar_runtime_device_stats(rt, dev, &st));
        assert_int_equal((int)st.collectives, 3);
        assert_int_equal((int)st.collective_bytes_in, 3000);
        assert_int_equal((int)st.collective_bytes_out, 3000);
        assert_int_equal((int)st.ops, 1);
        assert_int_equal((int)st.memory_in_use, 1000);
        assert_true(st.memory_peak >= 1000);
    }
    dpar_runtime_stats_reset(rt);
    T_OK(dpar_runtime_device_stats(rt, 1, &st));
    assert_int_equal((int)st.collectives, 0);
    assert_int_equal((int)st.collective_bytes_in, 0);
    assert_int_equal((int)st.memory_peak, 1000);
    T_ERR(dpar_runtime_device_stats(rt, 2, &st), DPAR_ERR_INVALID_ARGUMENT, "device 2");
    T_ERR(dpar_runtime_device_stats(NULL, 0, &st), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    dpar_runtime_destroy(rt);
}

/* stats' times: device 1 arrives 200 ms late at a psum, so device 0 spends
   that long in the collective, and the straggler shows as the device that
   waited least; the times fit in the window; a reset zeroes them; the CPU
   backend has no GPU readings (-1). */
static dpar_status late_psum(dpar_ctx *ctx, void *user) { /* user: a runtime device 1 resets when late, or NULL */
    dpar_buffer *a = dpar_ctx_arg(ctx, 0);
    dpar_status s = dpar_scale(a, 2.0f);
    if (s) return s;
    if (dpar_ctx_device(ctx) == 1) {
        struct timespec ts = { 0, 200 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        if (user) dpar_runtime_stats_reset((dpar_runtime *)user);
    }
    return dpar_psum(ctx, a, a, "data");
}
static void test_stats_times(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *a;
    dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 1, .shape = { 1 << 16 } };
    T_OK(dpar_array_create(m, &d, &a));
    float *host = calloc(1 << 16, sizeof(float));
    dpar_runtime_stats_reset(rt);
    T_OK(dpar_array_put(a, host));
    dpar_shard_map_desc sd = { .fn = late_psum, .num_args = 1, .args = { a } };
    T_OK(dpar_shard_map(m, &sd));
    dpar_device_stats st[2];
    for (int dev = 0; dev < 2; dev++) {
        T_OK(dpar_runtime_device_stats(rt, dev, &st[dev]));
        assert_true(st[dev].window_s >= 0.2);
        assert_true(st[dev].compute_s > 0 && st[dev].transfer_s > 0 && st[dev].collective_s > 0);
        assert_true(st[dev].compute_s + st[dev].collective_s + st[dev].transfer_s <= st[dev].window_s);
        assert_int_equal(st[dev].gpu_util_pct, -1);
        assert_int_equal(st[dev].temperature_c, -1);
        assert_true(st[dev].power_w == -1);
    }
    if (!(st[0].collective_s >= 0.1 && st[1].collective_s < st[0].collective_s))
        fail_msg("device 0 waited %.3f s in the psum, the late device 1 %.3f s: want >= 0.1 and less",
                 st[0].collective_s, st[1].collective_s);
    dpar_runtime_stats_reset(rt);
    T_OK(dpar_runtime_device_stats(rt, 0, &st[0]));
    assert_true(st[0].compute_s == 0 && st[0].collective_s == 0 && st[0].transfer_s == 0);
    assert_true(st[0].window_s >= 0 && st[0].window_s < 0.2);
    free(host);
    dpar_array_destroy(a);
    dpar_runtime_destroy(rt);
}

/* A call that spans a reset counts only its part in the new window: device 0 waits about 0.2 s in a
   psum whose late member resets the stats before it joins, so device 0's collective time is the few
   milliseconds after the reset (it was the whole 0.2 s, more than the window, before the clip). */
static void test_stats_reset_mid_call(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *a;
    dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 1, .shape = { 1024 } };
    T_OK(dpar_array_create(m, &d, &a));
    dpar_shard_map_desc sd = { .fn = late_psum, .user = rt, .num_args = 1, .args = { a } };
    T_OK(dpar_shard_map(m, &sd));
    dpar_device_stats st;
    T_OK(dpar_runtime_device_stats(rt, 0, &st));
    if (!(st.collective_s <= st.window_s))
        fail_msg("device 0: %.3f s in collectives in a window of %.3f s that began after its psum did: want at most "
                 "the window",
                 st.collective_s, st.window_s);
    dpar_array_destroy(a);
    dpar_runtime_destroy(rt);
}

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dpar_trace_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    return t_remove_tree(tmpdir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_trace),
        cmocka_unit_test(test_api_trace),
        cmocka_unit_test(test_late_tracks),
        cmocka_unit_test(test_shared_kind_names),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_stats_times),
        cmocka_unit_test(test_stats_reset_mid_call),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
