/* libFuzzer harness: the environment variables read by dpar_runtime_create.
   Input: mode byte, then up to 5 strings separated by '\n', the values of
   DPAR_BACKEND, DPAR_DEVICES, DPAR_TIMEOUT_MS, DPAR_CPU_THREADS and
   DPAR_SPIN_US (an absent string unsets the variable). Mode bit 0:
   num_devices 0 in the desc (DPAR_DEVICES decides; DPAR_CPU_THREADS unset so
   that at most 256 device threads start), else 1 device (DPAR_CPU_THREADS
   decides). A runtime that starts runs one psum; a refused one must name the
   variable or desc field. DPAR_TRACE is not fuzzed: its value is a path the
   library writes to (tests/test_trace.c checks an unwritable one).
   Build: `make fuzz`. */
#define DPAR_IMPLEMENTATION
#include "../../dpar.h"

static const char *const g_vars[5] = { "DPAR_BACKEND", "DPAR_DEVICES", "DPAR_TIMEOUT_MS", "DPAR_CPU_THREADS",
                                       "DPAR_SPIN_US" };

static dpar_status fz_fn(dpar_ctx *ctx, void *user) {
    dpar_array *a = (dpar_array *)user;
    dpar_buffer *b = dpar_array_shard(a, dpar_ctx_device(ctx));
    return dpar_psum(ctx, b, b, "data");
}
static void fz_run(dpar_runtime *rt) {
    dpar_mesh_desc md = { .ndim = 1, .shape = { dpar_runtime_device_count(rt) }, .axis_names = { "data" } };
    dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 1, .shape = { 4 } };
    dpar_mesh *m = NULL;
    dpar_array *a = NULL;
    if (dpar_mesh_create(rt, &md, &m) || dpar_array_create(m, &ad, &a)) abort();
    dpar_shard_map_desc d = { .fn = fz_fn, .user = a };
    if (dpar_shard_map(m, &d) && !dpar_last_error()[0]) abort(); /* a tiny DPAR_TIMEOUT_MS may time out */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1024) return 0;
    unsigned mode = data[0];
    char *buf = (char *)malloc(size), *str[5] = { NULL, NULL, NULL, NULL, NULL };
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    int ns = 0;
    for (char *p = buf; ns < 5;) {
        str[ns++] = p;
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        p = nl + 1;
    }
    if (mode & 1) str[3] = NULL;
    for (int i = 0; i < 5; i++) {
        if (str[i])
            setenv(g_vars[i], str[i], 1);
        else
            unsetenv(g_vars[i]);
    }
    dpar_runtime_desc rd = { .num_devices = (mode & 1) ? 0 : 1 };
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&rd, &rt);
    if (s == DPAR_OK) {
        fz_run(rt);
        dpar_runtime_destroy(rt);
    } else if (!strstr(dpar_last_error(), "DPAR_") && !strstr(dpar_last_error(), "desc.")) {
        abort(); /* refused without naming the variable */
    }
    free(buf);
    return 0;
}
