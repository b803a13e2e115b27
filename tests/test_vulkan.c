/* Vulkan backend tests (backends/dpar_vulkan.h), on llvmpipe or any GPU.
   Skipped (SKIPPED: reason) when the backend is not compiled in or no Vulkan
   driver is present, unless DPAR_REQUIRE_BACKENDS lists "vulkan". */
#include "testutil.h"
#include <unistd.h>

/* llvmpipe's unattributable JIT leak under LeakSanitizer: see the hook in testutil.h */

/* ---- helpers ---------------------------------------------------------- */
typedef dpar_status (*dev_fn)(dpar_ctx *ctx, int dev, void *user);
typedef struct {
    dev_fn fn;
    void *user;
} run_args;
static dpar_status run_trampoline(dpar_ctx *ctx, void *user) {
    run_args *a = (run_args *)user;
    return a->fn(ctx, dpar_ctx_device(ctx), a->user);
}
/* Runs fn once on every device of the mesh, concurrently (shard_map, no args). */
static dpar_status run_all(dpar_mesh *m, dev_fn fn, void *user) {
    run_args a = { fn, user };
    dpar_shard_map_desc d = { .fn = run_trampoline, .user = &a };
    return dpar_shard_map(m, &d);
}

static dpar_runtime *vk_runtime(int n, int noncoherent) {
    dpar_runtime_desc d = {
        .backend = DPAR_BACKEND_VULKAN, .num_devices = n, .timeout_ms = 20000, .vulkan.force_noncoherent = noncoherent
    };
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&d, &rt);
    if (s == DPAR_OK) return rt;
    if (s == DPAR_ERR_BACKEND_UNAVAILABLE && !t_required("vulkan")) {
        printf("SKIPPED: vulkan backend unavailable: %s\n", dpar_last_error());
        fflush(stdout);
        skip();
    }
    fail_msg("vulkan runtime with %d devices: %s: %s", n, dpar_status_string(s), dpar_last_error());
    return NULL;
}

/* ---- device info ------------------------------------------------------- */
static void test_device_info(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(4, 0);
    assert_int_equal(dpar_runtime_device_count(rt), 4);
    assert_int_equal(dpar_runtime_backend(rt), DPAR_BACKEND_VULKAN);
    for (int i = 0; i < 4; i++) {
        dpar_device_info info;
        T_OK(dpar_runtime_device_info(rt, i, &info));
        assert_int_equal(info.backend, DPAR_BACKEND_VULKAN);
        assert_int_equal(info.index, i);
        assert_true(info.memory_bytes > 0);
        assert_non_null(strstr(info.name, "[logical"));
        /* the physical device's UUID: set, and the same for every logical device on it */
        static const unsigned char zero[16];
        static unsigned char first[16];
        assert_memory_not_equal(info.uuid, zero, 16);
        if (i == 0)
            memcpy(first, info.uuid, 16);
        else
            assert_memory_equal(info.uuid, first, 16);
        if (i == 0)
            printf("vulkan device: %s | vendor %s | driver %s | %llu MiB\n", info.name, info.vendor, info.driver,
                   (unsigned long long)(info.memory_bytes >> 20));
    }
    dpar_runtime_destroy(rt);
}

/* ---- 2-device psum of [1..N] through non-coherent (and staged) memory ---- */
enum { PSUM_N = 1000 }; /* not a multiple of nonCoherentAtomSize */
static dpar_status psum_fn(dpar_ctx *ctx, int dev, void *user) {
    (void)dev;
    float *res = (float *)user;
    int64_t sh[1] = { PSUM_N };
    dpar_buffer *in, *out;
    dpar_status s;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &in))) return s;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &out))) return s;
    float x[PSUM_N];
    for (int i = 0; i < PSUM_N; i++) x[i] = (float)(i + 1);
    /* write in two pieces at an offset that is not atom aligned */
    if ((s = dpar_buffer_write(in, 0, x, 100 * sizeof(float)))) return s;
    if ((s = dpar_buffer_write(in, 100 * sizeof(float), x + 100, (PSUM_N - 100) * sizeof(float)))) return s;
    if ((s = dpar_psum(ctx, out, in, "data"))) return s;
    if ((s = dpar_psum(ctx, in, in, "data"))) return s; /* in place */
    float y[PSUM_N];
    if ((s = dpar_buffer_read(out, 0, res + (size_t)dev * 2 * PSUM_N, PSUM_N * sizeof(float)))) return s;
    if ((s = dpar_buffer_read(in, 17 * sizeof(float), y, (PSUM_N - 17) * sizeof(float)))) return s;
    memcpy(res + (size_t)dev * 2 * PSUM_N + PSUM_N + 17, y, (PSUM_N - 17) * sizeof(float));
    dpar_buffer_destroy(in);
    dpar_buffer_destroy(out);
    return DPAR_OK;
}
static void check_psum(int staging) {
    if (staging) setenv("DPAR_VK_FORCE_STAGING", "1", 1);
    dpar_runtime *rt = vk_runtime(2, 1);
    if (staging) unsetenv("DPAR_VK_FORCE_STAGING");
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    float *res = (float *)calloc(4 * PSUM_N, sizeof(float));
    T_OK(run_all(m, psum_fn, res));
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < PSUM_N; i++) {
            if (res[d * 2 * PSUM_N + i] != 2.0f * (float)(i + 1))
                fail_msg("device %d out[%d] = %g, want %g", d, i, res[d * 2 * PSUM_N + i], 2.0 * (i + 1));
            if (i >= 17 && res[d * 2 * PSUM_N + PSUM_N + i] != 2.0f * (float)(i + 1))
                fail_msg("device %d in-place[%d] = %g, want %g", d, i, res[d * 2 * PSUM_N + PSUM_N + i], 2.0 * (i + 1));
        }
    free(res);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}
static void test_psum_noncoherent(void **state) {
    (void)state;
    check_psum(0);
}
static void test_psum_noncoherent_staged(void **state) {
    (void)state;
    check_psum(1);
}

/* ---- a shader scales [1..1024] by 2, psum over 1 device: exactly [2..2048], 1000 times ---- */
typedef struct {
    int iters;
    int bad_iter;
    int bad_index;
    float bad_value;
} scale_res;
static dpar_status scale_fn(dpar_ctx *ctx, int dev, void *user) {
    (void)dev;
    scale_res *r = (scale_res *)user;
    int64_t sh[1] = { 1024 };
    dpar_buffer *b, *o;
    dpar_status s;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b))) return s;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &o))) return s;
    float x[1024], y[1024];
    for (int i = 0; i < 1024; i++) x[i] = (float)(i + 1);
    for (int it = 0; it < r->iters && r->bad_iter < 0; it++) {
        if ((s = dpar_buffer_write(b, 0, x, sizeof x))) return s;
        if ((s = dpar_scale(b, 2.0f))) return s;         /* compute write ... */
        if ((s = dpar_psum(ctx, o, b, "one"))) return s; /* ... staged to the host and back */
        if ((s = dpar_buffer_read(o, 0, y, sizeof y))) return s;
        for (int i = 0; i < 1024; i++)
            if (y[i] != 2.0f * (float)(i + 1)) {
                r->bad_iter = it;
                r->bad_index = i;
                r->bad_value = y[i];
                break;
            }
    }
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(o);
    return DPAR_OK;
}
static void check_scale(int staging, int noncoherent, int iters) {
    if (staging) setenv("DPAR_VK_FORCE_STAGING", "1", 1);
    dpar_runtime *rt = vk_runtime(1, noncoherent);
    if (staging) unsetenv("DPAR_VK_FORCE_STAGING");
    dpar_mesh *m = t_mesh1(rt, 1, "one");
    scale_res r = { iters, -1, -1, 0 };
    T_OK(run_all(m, scale_fn, &r));
    if (r.bad_iter >= 0)
        fail_msg("iteration %d: out[%d] = %g, want %d", r.bad_iter, r.bad_index, r.bad_value, 2 * (r.bad_index + 1));
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}
static void test_scale_psum_1000(void **state) {
    (void)state;
    check_scale(0, 0, 1000);
}
static void test_scale_psum_noncoherent(void **state) {
    (void)state;
    check_scale(0, 1, 300);
}
static void test_scale_psum_staged(void **state) {
    (void)state;
    check_scale(1, 1, 300);
}

/* ---- large all-reduce: several pipelined chunks through the staging slots ---- */
typedef struct {
    int64_t count;
    dpar_dtype dt;
    int bad;
    int64_t bad_index;
    double got, want;
} big_res;
static dpar_status big_fn(dpar_ctx *ctx, int dev, void *user) {
    big_res *r = (big_res *)user;
    int64_t sh[1] = { r->count };
    dpar_buffer *in, *out;
    dpar_status s;
    int n;
    if ((s = dpar_ctx_axis_size(ctx, "data", &n))) return s;
    if ((s = dpar_ctx_buffer(ctx, r->dt, 1, sh, &in)) || (s = dpar_ctx_buffer(ctx, r->dt, 1, sh, &out))) return s;
    size_t es = dpar_dtype_size(r->dt);
    unsigned char *h = (unsigned char *)malloc((size_t)r->count * es);
    if (!h) return DPAR_ERR_OUT_OF_MEMORY;
    /* member d holds (i % 97) + d: integers, exact in every dtype after the sum */
    for (int64_t i = 0; i < r->count; i++) {
        float v = (float)(i % 97 + dev);
        if (r->dt == DPAR_F32)
            ((float *)h)[i] = v;
        else if (r->dt == DPAR_I32)
            ((int32_t *)h)[i] = (int32_t)v;
        else
            ((uint16_t *)h)[i] = r->dt == DPAR_F16 ? dpar_f32_to_f16(v) : dpar_f32_to_bf16(v);
    }
    if ((s = dpar_buffer_write(in, 0, h, (size_t)r->count * es))) {
        free(h);
        return s;
    }
    if ((s = dpar_scale(in, 1.0f)) && r->dt == DPAR_F32) {
        free(h);
        return s;
    } /* queued compute before the copy */
    for (int op = DPAR_SUM; op <= DPAR_MAX; op += 2) {
        if ((s = dpar_preduce(ctx, out, in, "data", (dpar_reduce_op)op))) {
            free(h);
            return s;
        }
        if ((s = dpar_buffer_read(out, 0, h, (size_t)r->count * es))) {
            free(h);
            return s;
        }
        for (int64_t i = 0; i < r->count && !r->bad; i += 1) {
            double want = op == DPAR_SUM ? (double)((i % 97) * n + n * (n - 1) / 2) : (double)(i % 97 + n - 1);
            double got = r->dt == DPAR_F32   ? ((float *)h)[i]
                         : r->dt == DPAR_I32 ? (float)((int32_t *)h)[i]
                         : r->dt == DPAR_F16 ? dpar_f16_to_f32(((uint16_t *)h)[i])
                                             : dpar_bf16_to_f32(((uint16_t *)h)[i]);
            if (r->dt == DPAR_BF16 && want > 256) want = dpar_bf16_to_f32(dpar_f32_to_bf16((float)want));
            if (got != want) {
                r->bad = 1;
                r->bad_index = i;
                r->got = got;
                r->want = want;
            }
        }
    }
    free(h);
    dpar_buffer_destroy(in);
    dpar_buffer_destroy(out);
    return DPAR_OK;
}
static void check_big(int staging) {
    if (staging) setenv("DPAR_VK_FORCE_STAGING", "1", 1);
    dpar_runtime *rt = vk_runtime(4, 1);
    if (staging) unsetenv("DPAR_VK_FORCE_STAGING");
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    const dpar_dtype dts[3] = { DPAR_F32, DPAR_F16, DPAR_I32 };
    const int64_t counts[3] = { 2600007, 3000001, 1048576 }; /* 10.4 MB (3 chunks), 6 MB (2 chunks), exactly 1 chunk */
    for (int i = 0; i < 3; i++) {
        big_res r;
        memset(&r, 0, sizeof r);
        r.count = counts[i];
        r.dt = dts[i];
        T_OK(run_all(m, big_fn, &r));
        if (r.bad)
            fail_msg("%s all-reduce of %lld elements: [%lld] = %g, want %g", dpar_dtype_name(r.dt), (long long)r.count,
                     (long long)r.bad_index, r.got, r.want);
    }
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}
static void test_allreduce_large_mapped(void **state) {
    (void)state;
    check_big(0);
}
static void test_allreduce_large_pipelined(void **state) {
    (void)state;
    check_big(1);
}

/* ---- logical devices spread over two physical devices ------------------------
   Two physical devices are made from lavapipe by listing its ICD twice (the
   second entry through a symlink), so the multi-GPU paths (one VkDevice per
   physical device, collectives across them) run on any machine with Mesa. */
static int lvp_icd(char *json, size_t jn, char *lib, size_t ln) {
    static const char *cands[] = { "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",
                                   "/usr/share/vulkan/icd.d/lvp_icd.aarch64.json",
                                   "/usr/share/vulkan/icd.d/lvp_icd.json",
                                   "/usr/local/share/vulkan/icd.d/lvp_icd.x86_64.json" };
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        FILE *f = fopen(cands[i], "rb");
        if (!f) continue;
        char buf[4096];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *k = strstr(buf, "\"library_path\"");
        char *q1 = k ? strchr(k + 14, '"') : NULL;
        char *q2 = q1 ? strchr(q1 + 1, '"') : NULL;
        if (!q2 || (size_t)(q2 - q1) >= ln) continue;
        memcpy(lib, q1 + 1, (size_t)(q2 - q1 - 1));
        lib[q2 - q1 - 1] = 0;
        snprintf(json, jn, "%s", cands[i]);
        return 1;
    }
    return 0;
}
typedef struct {
    float got[4][8];
    float gathered[4][8];
} multi_res;
static dpar_status multi_fn(dpar_ctx *ctx, int dev, void *user) {
    multi_res *r = (multi_res *)user;
    int64_t sh[1] = { 8 }, sg[1] = { 32 }, sbig[1] = { 1500000 };
    dpar_buffer *x, *y, *g, *big;
    dpar_status s;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &x)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &y)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sg, &g)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sbig, &big)))
        return s;
    if ((s = dpar_fill(x, (float)(dev + 1))) || (s = dpar_scale(x, 2.0f)) || (s = dpar_psum(ctx, y, x, "data")) ||
        (s = dpar_all_gather(ctx, g, x, "data", 0, true)) ||
        (s = dpar_buffer_read(y, 0, r->got[dev], sizeof r->got[dev])))
        return s;
    float gg[32];
    if ((s = dpar_buffer_read(g, 0, gg, sizeof gg))) return s;
    for (int i = 0; i < 4; i++) r->gathered[dev][i] = gg[8 * i];
    /* a 6 MB all-reduce: two pipelined chunks when staged */
    float v = 0;
    if ((s = dpar_fill(big, 1.0f)) || (s = dpar_psum(ctx, big, big, "data")) ||
        (s = dpar_buffer_read(big, (size_t)(sbig[0] - 1) * 4, &v, 4)))
        return s;
    if (v != 4.0f) return DPAR_ERR_STATE;
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(g);
    dpar_buffer_destroy(big);
    return DPAR_OK;
}
/* Makes the loader see lavapipe twice (skips when it cannot); two_icds_end undoes it. */
typedef struct {
    char dir[64], link[600], json2[600];
    char *saved, *saved2;
} two_icds;
static void two_icds_begin(two_icds *t) {
    dpar_runtime *probe = vk_runtime(1, 0); /* skips when there is no Vulkan */
    dpar_runtime_destroy(probe);
    char json[512], lib[512], both[1300];
    if (!lvp_icd(json, sizeof json, lib, sizeof lib)) {
        printf("SKIPPED: lavapipe's ICD file was not found (Debian: mesa-vulkan-drivers)\n");
        skip();
    }
    snprintf(t->dir, sizeof t->dir, "/tmp/dpar_vk_icd_XXXXXX");
    assert_non_null(mkdtemp(t->dir));
    snprintf(t->link, sizeof t->link, "%s/libvulkan_lvp_second.so", t->dir);
    snprintf(t->json2, sizeof t->json2, "%s/second.json", t->dir);
    assert_int_equal(symlink(lib, t->link), 0);
    FILE *f = fopen(t->json2, "w");
    assert_non_null(f);
    fprintf(
        f,
        "{ \"file_format_version\": \"1.0.0\", \"ICD\": { \"library_path\": \"%s\", \"api_version\": \"1.1.0\" } }\n",
        t->link);
    fclose(f);
    snprintf(both, sizeof both, "%s:%s", json, t->json2);
    /* VK_DRIVER_FILES takes precedence over VK_ICD_FILENAMES in newer loaders: set both */
    const char *old = getenv("VK_ICD_FILENAMES"), *old2 = getenv("VK_DRIVER_FILES");
    t->saved = old ? strdup(old) : NULL;
    t->saved2 = old2 ? strdup(old2) : NULL;
    setenv("VK_ICD_FILENAMES", both, 1);
    setenv("VK_DRIVER_FILES", both, 1);
}
static void two_icds_end(two_icds *t) {
    if (t->saved) {
        setenv("VK_ICD_FILENAMES", t->saved, 1);
        free(t->saved);
    } else
        unsetenv("VK_ICD_FILENAMES");
    if (t->saved2) {
        setenv("VK_DRIVER_FILES", t->saved2, 1);
        free(t->saved2);
    } else
        unsetenv("VK_DRIVER_FILES");
    unlink(t->json2);
    unlink(t->link);
    rmdir(t->dir);
}
static void check_two_physical(int staging) {
    two_icds t;
    two_icds_begin(&t);
    if (staging) setenv("DPAR_VK_FORCE_STAGING", "1", 1);
    dpar_runtime *rt = vk_runtime(4, staging);
    unsetenv("DPAR_VK_FORCE_STAGING");
    two_icds_end(&t);
    int phys[4];
    for (int i = 0; i < 4; i++) {
        dpar_device_info info;
        T_OK(dpar_runtime_device_info(rt, i, &info));
        phys[i] = info.physical_index;
    }
    printf("logical devices on physical devices %d %d %d %d\n", phys[0], phys[1], phys[2], phys[3]);
    assert_int_equal(phys[0], 0);
    assert_int_equal(phys[1], 1);
    assert_int_equal(phys[2], 0);
    assert_int_equal(phys[3], 1);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    multi_res r;
    memset(&r, 0, sizeof r);
    dpar_status s = run_all(m, multi_fn, &r);
    if (s) fail_msg("collectives across two physical devices: %s: %s", dpar_status_string(s), dpar_last_error());
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < 8; i++) {
            assert_true(r.got[d][i] == 20.0f); /* 2 * (1 + 2 + 3 + 4) */
            if (i < 4) assert_true(r.gathered[d][i] == 2.0f * (float)(i + 1));
        }
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}
static void test_two_physical_devices(void **state) {
    (void)state;
    check_two_physical(0);
}
static void test_two_physical_devices_staged(void **state) {
    (void)state;
    check_two_physical(1);
}

/* .vulkan.physical_device is 1-based, so the first device alone can be chosen (0 is the default:
   every device of the best kind); the deprecated flat field keeps its old 0-based meaning. */
static int all_on_physical(const dpar_runtime_desc *d, int want) {
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(d, &rt);
    if (s) fail_msg("runtime: %s: %s", dpar_status_string(s), dpar_last_error());
    int n = dpar_runtime_device_count(rt), ok = n == d->num_devices;
    for (int i = 0; i < n; i++) {
        dpar_device_info info;
        T_OK(dpar_runtime_device_info(rt, i, &info));
        printf("physical_device %d: logical %d on physical %d\n", d->vulkan.physical_device, i, info.physical_index);
        ok = ok && info.physical_index == want;
    }
    dpar_runtime_destroy(rt);
    return ok;
}
static void test_choose_physical_device(void **state) {
    (void)state;
    two_icds t;
    two_icds_begin(&t);
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_VULKAN, .num_devices = 2, .timeout_ms = 20000 };
    d.vulkan.physical_device = 1;
    int first_alone = all_on_physical(&d, 0);
    d.vulkan.physical_device = 2;
    int second_alone = all_on_physical(&d, 1);
    d.vulkan.physical_device = 0;
    d.vulkan_physical_device = 1; /* deprecated name, 0-based */
    int old_name = all_on_physical(&d, 1);
    d.vulkan_physical_device = 0;
    setenv("DPAR_VK_DEVICE", " 1 ", 1); /* 0-based, spaced as a shell line may leave it */
    int from_env = all_on_physical(&d, 1);
    unsetenv("DPAR_VK_DEVICE");
    d.vulkan.physical_device = 3;
    dpar_runtime *rt = NULL;
    dpar_status too_far = dpar_runtime_create(&d, &rt);
    d.vulkan.physical_device = -1;
    dpar_status negative = dpar_runtime_create(&d, &rt);
    two_icds_end(&t);
    assert_true(first_alone);
    assert_true(second_alone);
    assert_true(old_name);
    assert_true(from_env);
    assert_int_equal(too_far, DPAR_ERR_DEVICE_COUNT);
    assert_int_equal(negative, DPAR_ERR_INVALID_ARGUMENT);
    assert_null(rt);
}

/* ---- small ops with known answers --------------------------------------- */
typedef struct {
    int failed;
    char msg[256];
} op_res;
#define OP_CHECK(cond, ...)                               \
    do {                                                  \
        if (!(cond)) {                                    \
            r->failed = 1;                                \
            snprintf(r->msg, sizeof r->msg, __VA_ARGS__); \
            return DPAR_OK;                               \
        }                                                 \
    } while (0)
static dpar_status ops_fn(dpar_ctx *ctx, int dev, void *user) {
    (void)dev;
    op_res *r = (op_res *)user;
    dpar_status s;
    /* matmul: A [2,3], B [3,2] -> [[58,64],[139,154]]; and A^T stored */
    int64_t sa[2] = { 2, 3 }, sb[2] = { 3, 2 }, sc[2] = { 2, 2 }, sat[2] = { 3, 2 };
    dpar_buffer *A, *B, *C, *At;
    float a[6] = { 1, 2, 3, 4, 5, 6 }, bm[6] = { 7, 8, 9, 10, 11, 12 }, at[6] = { 1, 4, 2, 5, 3, 6 }, c[4];
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 2, sa, &A)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 2, sb, &B)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 2, sc, &C)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 2, sat, &At)))
        return s;
    if ((s = dpar_buffer_write(A, 0, a, sizeof a)) || (s = dpar_buffer_write(B, 0, bm, sizeof bm)) ||
        (s = dpar_buffer_write(At, 0, at, sizeof at)))
        return s;
    if ((s = dpar_fill(C, NAN))) return s; /* beta = 0 ignores NaN */
    if ((s = dpar_matmul(C, A, B, false, false, 1.0f, 0.0f))) return s;
    if ((s = dpar_buffer_read(C, 0, c, sizeof c))) return s;
    OP_CHECK(c[0] == 58 && c[1] == 64 && c[2] == 139 && c[3] == 154, "matmul: %g %g %g %g", c[0], c[1], c[2], c[3]);
    if ((s = dpar_matmul(C, At, B, true, false, 2.0f, 1.0f))) return s; /* C = 2 A B + C = 3 A B */
    if ((s = dpar_buffer_read(C, 0, c, sizeof c))) return s;
    OP_CHECK(c[0] == 174 && c[1] == 192 && c[2] == 417 && c[3] == 462, "matmul ta: %g %g %g %g", c[0], c[1], c[2],
             c[3]);
    /* cast f32 -> f16 -> f32, f32 -> bf16, f32 -> i32 (odd count: the packed last word) */
    int64_t s5[1] = { 5 };
    dpar_buffer *f, *h, *bf, *i32, *back;
    float fv[5] = { 1.0f, -2.5f, 65520.0f /* rounds to Inf in f16 */, 1e-8f /* subnormal f16 -> 0 */, 3.7f };
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, s5, &f)) || (s = dpar_ctx_buffer(ctx, DPAR_F16, 1, s5, &h)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_BF16, 1, s5, &bf)) || (s = dpar_ctx_buffer(ctx, DPAR_I32, 1, s5, &i32)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, s5, &back)))
        return s;
    if ((s = dpar_buffer_write(f, 0, fv, sizeof fv))) return s;
    if ((s = dpar_cast(h, f)) || (s = dpar_cast(bf, f)) || (s = dpar_cast(i32, f)) || (s = dpar_cast(back, h)))
        return s;
    uint16_t hv[5], bv[5];
    int32_t iv[5];
    float bk[5];
    if ((s = dpar_buffer_read(h, 0, hv, sizeof hv)) || (s = dpar_buffer_read(bf, 0, bv, sizeof bv)) ||
        (s = dpar_buffer_read(i32, 0, iv, sizeof iv)) || (s = dpar_buffer_read(back, 0, bk, sizeof bk)))
        return s;
    for (int i = 0; i < 5; i++) {
        OP_CHECK(hv[i] == dpar_f32_to_f16(fv[i]), "cast f16[%d] = 0x%04x, want 0x%04x", i, hv[i],
                 dpar_f32_to_f16(fv[i]));
        OP_CHECK(bv[i] == dpar_f32_to_bf16(fv[i]), "cast bf16[%d] = 0x%04x, want 0x%04x", i, bv[i],
                 dpar_f32_to_bf16(fv[i]));
        OP_CHECK(iv[i] == (int32_t)fv[i] || (i == 2 && iv[i] == 65520), "cast i32[%d] = %d", i, iv[i]);
        float want = dpar_f16_to_f32(dpar_f32_to_f16(fv[i]));
        OP_CHECK(memcmp(&bk[i], &want, 4) == 0, "cast f16->f32[%d] = %g, want %g", i, bk[i], want);
    }
    /* fill of every dtype, and copy */
    if ((s = dpar_fill(h, 0.5f)) || (s = dpar_fill(i32, -7.9f))) return s;
    if ((s = dpar_buffer_read(h, 0, hv, sizeof hv)) || (s = dpar_buffer_read(i32, 0, iv, sizeof iv))) return s;
    for (int i = 0; i < 5; i++) OP_CHECK(hv[i] == 0x3800 && iv[i] == -7, "fill: 0x%04x %d", hv[i], iv[i]);
    if ((s = dpar_copy(back, f)) || (s = dpar_buffer_read(back, 0, bk, sizeof bk))) return s;
    OP_CHECK(memcmp(bk, fv, sizeof fv) == 0, "copy differs");
    /* sum / sum of squares / relu / softmax */
    int64_t s1[1] = { 1 };
    dpar_buffer *sum;
    float one;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, s1, &sum))) return s;
    if ((s = dpar_sum(sum, A)) || (s = dpar_buffer_read(sum, 0, &one, 4))) return s;
    OP_CHECK(one == 21.0f, "sum = %g", one);
    if ((s = dpar_sum_squares(sum, A)) || (s = dpar_buffer_read(sum, 0, &one, 4))) return s;
    OP_CHECK(one == 91.0f, "sum_squares = %g", one);
    float rv[5] = { -1.0f, 0.0f, 2.0f, NAN, -0.5f }, ro[5];
    if ((s = dpar_buffer_write(f, 0, rv, sizeof rv)) || (s = dpar_relu(f, f)) ||
        (s = dpar_buffer_read(f, 0, ro, sizeof ro)))
        return s;
    OP_CHECK(ro[0] == 0 && ro[1] == 0 && ro[2] == 2 && isnan(ro[3]) && ro[4] == 0, "relu: %g %g %g %g %g", ro[0], ro[1],
             ro[2], ro[3], ro[4]);
    int64_t sl[2] = { 2, 3 }, s2[1] = { 2 };
    dpar_buffer *logits, *labels, *dl;
    float z[6] = { 0, 0, 0, 1, 2, 3 }, g[6];
    int32_t lab[2] = { 1, 7 /* out of range -> NaN row, and an error at the next read */ };
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 2, sl, &logits)) || (s = dpar_ctx_buffer(ctx, DPAR_I32, 1, s2, &labels)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 2, sl, &dl)))
        return s;
    if ((s = dpar_buffer_write(logits, 0, z, sizeof z)) || (s = dpar_buffer_write(labels, 0, lab, sizeof lab)) ||
        (s = dpar_softmax_xent(sum, dl, logits, labels)))
        return s;
    s = dpar_buffer_read(sum, 0, &one, 4);
    OP_CHECK(s == DPAR_ERR_INVALID_ARGUMENT && strstr(dpar_last_error(), "labels[1] = 7"),
             "softmax_xent with a bad label: the next read gave %s: %s", dpar_status_string(s), dpar_last_error());
    if ((s = dpar_buffer_read(sum, 0, &one, 4)) || (s = dpar_buffer_read(dl, 0, g, sizeof g))) return s;
    OP_CHECK(isnan(one) && isnan(g[3]) && fabsf(g[0] - (1.0f / 3 / 2)) < 1e-6f && fabsf(g[1] + (2.0f / 3 / 2)) < 1e-6f,
             "softmax_xent with a bad label: loss %g, grad %g %g %g", one, g[0], g[1], g[3]);
    lab[1] = 2;
    if ((s = dpar_buffer_write(labels, 0, lab, sizeof lab)) || (s = dpar_softmax_xent(sum, NULL, logits, labels)) ||
        (s = dpar_buffer_read(sum, 0, &one, 4)))
        return s;
    double want = (log(3.0) + (log(exp(1.0) + exp(2.0) + exp(3.0)) - 3.0)) / 2;
    OP_CHECK(fabs(one - want) < 1e-5 * want, "softmax_xent loss %.8g, want %.8g", one, want);
    dpar_buffer *bufs[] = { A, B, C, At, f, h, bf, i32, back, sum, logits, labels, dl };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
    return DPAR_OK;
}
static void test_ops_known_values(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(2, 0);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    op_res r;
    memset(&r, 0, sizeof r);
    T_OK(run_all(m, ops_fn, &r));
    if (r.failed) fail_msg("%s", r.msg);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}

/* ---- many queued ops (more than one command buffer ring), determinism ---- */
static dpar_status many_fn(dpar_ctx *ctx, int dev, void *user) {
    float *out = (float *)user;
    int64_t sh[1] = { 1 << 16 };
    dpar_buffer *x, *y, *sum;
    dpar_status s;
    int64_t s1[1] = { 1 };
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &x)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &y)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, s1, &sum)))
        return s;
    float *h = (float *)malloc(sizeof(float) << 16);
    if (!h) return DPAR_ERR_OUT_OF_MEMORY;
    uint32_t seed = 12345;
    for (int i = 0; i < (1 << 16); i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    if ((s = dpar_buffer_write(x, 0, h, sizeof(float) << 16))) {
        free(h);
        return s;
    }
    free(h);
    if ((s = dpar_fill(y, 1.0f))) return s;
    for (int i = 0; i < 1000; i++)
        if ((s = dpar_axpy(y, 0.001f, x))) return s; /* 1000 ops queued without a read */
    float sums[4];
    for (int rep = 0; rep < 2; rep++) {
        if ((s = dpar_sum(sum, y)) || (s = dpar_buffer_read(sum, 0, &sums[rep], 4))) return s;
        if ((s = dpar_sum_squares(sum, x)) || (s = dpar_buffer_read(sum, 0, &sums[2 + rep], 4))) return s;
    }
    float y0;
    if ((s = dpar_buffer_read(y, 0, &y0, 4))) return s;
    memcpy(out + dev * 5, sums, sizeof sums);
    out[dev * 5 + 4] = y0;
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(sum);
    return DPAR_OK;
}
static void test_many_ops_deterministic(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(4, 0);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    float out[20];
    T_OK(run_all(m, many_fn, out));
    for (int d = 0; d < 4; d++) {
        /* same sums run after run and on every device (bitwise) */
        assert_memory_equal(&out[d * 5], &out[0], 5 * sizeof(float));
        assert_memory_equal(&out[d * 5 + 0], &out[d * 5 + 1], sizeof(float));
        assert_memory_equal(&out[d * 5 + 2], &out[d * 5 + 3], sizeof(float));
    }
    /* y = 1 + 1000 * 0.001 * x, so sum(y) is about 65536 + sum(x) */
    assert_true(fabsf(out[0] - 65536.0f) < 400.0f);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}

/* ---- errors: statuses and texts, never a crash -------------------------- */
static void test_missing_loader(void **state) {
    (void)state;
    setenv("DPAR_VK_LOADER", "/nonexistent/libvulkan.so.1", 1);
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_VULKAN, .num_devices = 1 };
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&d, &rt);
    unsetenv("DPAR_VK_LOADER");
    assert_int_equal(s, DPAR_ERR_BACKEND_UNAVAILABLE);
    assert_null(rt);
    printf("missing loader: %s\n", dpar_last_error());
#ifdef DPAR_VULKAN
    assert_non_null(strstr(dpar_last_error(), "libvulkan"));
#endif
}
static void test_missing_icd(void **state) {
    (void)state;
    const char *old = getenv("VK_ICD_FILENAMES"), *old2 = getenv("VK_DRIVER_FILES");
    char *saved = old ? strdup(old) : NULL, *saved2 = old2 ? strdup(old2) : NULL;
    setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json", 1);
    setenv("VK_DRIVER_FILES", "/nonexistent/icd.json", 1);
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_VULKAN, .num_devices = 2 };
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&d, &rt);
    if (saved) {
        setenv("VK_ICD_FILENAMES", saved, 1);
        free(saved);
    } else
        unsetenv("VK_ICD_FILENAMES");
    if (saved2) {
        setenv("VK_DRIVER_FILES", saved2, 1);
        free(saved2);
    } else
        unsetenv("VK_DRIVER_FILES");
    assert_int_equal(s, DPAR_ERR_BACKEND_UNAVAILABLE);
    assert_null(rt);
    printf("missing ICD: %s\n", dpar_last_error());
#ifdef DPAR_VULKAN
    assert_true(strstr(dpar_last_error(), "VK_ERROR_INCOMPATIBLE_DRIVER") || strstr(dpar_last_error(), "no Vulkan"));
#endif
}
static void test_bad_physical_device(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(1, 0); /* skips when there is no Vulkan */
    dpar_runtime_destroy(rt);
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_VULKAN, .num_devices = 1, .vulkan.physical_device = 99 };
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_DEVICE_COUNT, "dpar_runtime_create: vulkan: ", "99");
}
static dpar_status oom_fn(dpar_ctx *ctx, int dev, void *user) {
    (void)dev;
    (void)user;
    dpar_buffer *b = NULL;
    int64_t huge[1] = { (int64_t)1 << 40 }; /* 4 TiB of f32 */
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, huge, &b);
    if (s != DPAR_ERR_OUT_OF_MEMORY || b) {
        printf("4 TiB buffer: %s: %s\n", dpar_status_string(s), dpar_last_error());
        return DPAR_ERR_STATE;
    }
    printf("4 TiB buffer: %s\n", dpar_last_error());
    /* the text begins with the call the user made, then the backend's */
    return strncmp(dpar_last_error(), "dpar_ctx_buffer: vulkan: ", 25) ? DPAR_ERR_STATE : DPAR_OK;
}
static void test_out_of_memory(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(1, 0);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_status s = run_all(m, oom_fn, NULL);
    if (s) fail_msg("out-of-memory checks: %s: %s", dpar_status_string(s), dpar_last_error());
    dpar_buffer *b = NULL;
    dpar_array *a = NULL;
    T_ERR(dpar_buffer_create(rt, 0, DPAR_F32, 1, (int64_t[]){ (int64_t)1 << 40 }, &b), DPAR_ERR_OUT_OF_MEMORY,
          "dpar_buffer_create: vulkan: vkCreateBuffer failed");
    T_ERR(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 1, { (int64_t)1 << 40 }, { NULL } }, &a),
          DPAR_ERR_OUT_OF_MEMORY, "dpar_array_create: vulkan: vkCreateBuffer failed");
    assert_null(b);
    assert_null(a);
    /* the runtime still works afterwards */
    int64_t sh[1] = { 3 };
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, sh, &b));
    float x[3] = { 1, 2, 3 }, y[3];
    T_OK(dpar_buffer_write(b, 0, x, sizeof x));
    T_OK(dpar_buffer_read(b, 0, y, sizeof y));
    assert_memory_equal(x, y, sizeof x);
    dpar_buffer_destroy(b);
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
}
static void test_zero_size_and_bad_args(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(2, 0);
    int64_t z[2] = { 0, 4 }, sh[2] = { 2, 3 }, sh2[2] = { 4, 5 };
    dpar_buffer *a, *b, *c;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F16, 2, z, &a));
    assert_int_equal(dpar_buffer_nbytes(a), 0);
    T_OK(dpar_fill(a, 1.0f));
    T_OK(dpar_buffer_read(a, 0, NULL, 0));
    dpar_buffer_destroy(a);
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, z, &a));
    T_OK(dpar_scale(a, 2.0f));
    T_OK(dpar_relu(a, a));
    T_OK(dpar_runtime_device_sync(rt, 0));
    dpar_buffer_destroy(a);
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sh, &a));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, sh2, &b));
    T_OK(dpar_buffer_create(rt, 1, DPAR_F32, 2, sh, &c));
    float big[64] = { 0 };
    assert_int_not_equal(dpar_buffer_write(a, 4, big, sizeof(float) * 6), DPAR_OK); /* past the end */
    assert_int_not_equal(dpar_matmul(a, a, b, false, false, 1, 0), DPAR_OK);        /* shapes */
    assert_int_not_equal(dpar_axpy(a, 1.0f, c), DPAR_OK);                           /* devices */
    T_OK(dpar_runtime_device_sync(rt, 1));
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
    dpar_runtime_destroy(rt);
}

/* ---- an engine's own device (desc.vulkan.external) ---------------------- */
#ifdef DPAR_VULKAN
/* The "engine": its own instance, device and queue through the loader (dlopen, as dpar does, so this
   binary starts without Vulkan), a counting allocator, and a lock around its queue. */
#include <vulkan/vulkan.h>
#include <dlfcn.h>
#include <pthread.h>
/* clang-format off */
#define HOST_VK_FNS(X) \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties) \
    X(vkGetPhysicalDeviceQueueFamilyProperties) X(vkGetPhysicalDeviceMemoryProperties) X(vkCreateDevice) \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements) \
    X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) X(vkCreateCommandPool) \
    X(vkDestroyCommandPool) X(vkAllocateCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer) \
    X(vkCmdFillBuffer) X(vkCmdCopyBuffer) X(vkCmdPipelineBarrier) X(vkQueueSubmit) X(vkCreateFence) \
    X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences) X(vkDeviceWaitIdle) X(vkGetPhysicalDeviceFeatures2)
/* clang-format on */
typedef struct host_vk {
    void *lib;
    PFN_vkGetInstanceProcAddr gipa;
#define HOST_DECL(n) PFN_##n n;
    HOST_VK_FNS(HOST_DECL)
#undef HOST_DECL
    VkInstance inst;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue q;
    uint32_t fam;
    int timeline;
    pthread_mutex_t qlock;
    int lock_calls;
} host_vk;

/* the counting allocator handed to dpar: size and alignment in a header before each block */
typedef struct counts {
    long live, total;
} counts;
static void *VKAPI_PTR cnt_alloc(void *u, size_t size, size_t align, VkSystemAllocationScope sc) {
    (void)sc;
    if (align < 16) align = 16;
    void *raw = NULL;
    if (posix_memalign(&raw, align, size + align)) return NULL;
    size_t *hdr = (size_t *)((unsigned char *)raw + align);
    hdr[-1] = size, hdr[-2] = align;
    __atomic_add_fetch(&((counts *)u)->live, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&((counts *)u)->total, 1, __ATOMIC_RELAXED);
    return hdr;
}
static void VKAPI_PTR cnt_free(void *u, void *p) {
    if (!p) return;
    __atomic_sub_fetch(&((counts *)u)->live, 1, __ATOMIC_RELAXED);
    free((unsigned char *)p - ((size_t *)p)[-2]);
}
static void *VKAPI_PTR cnt_realloc(void *u, void *p, size_t size, size_t align, VkSystemAllocationScope sc) {
    if (!p) return cnt_alloc(u, size, align, sc);
    if (!size) {
        cnt_free(u, p);
        return NULL;
    }
    void *n = cnt_alloc(u, size, align, sc);
    if (n) memcpy(n, p, ((size_t *)p)[-1] < size ? ((size_t *)p)[-1] : size);
    if (n) cnt_free(u, p);
    return n;
}
static void host_lock(void *u) {
    host_vk *h = (host_vk *)u;
    pthread_mutex_lock(&h->qlock);
    h->lock_calls++;
}
static void host_unlock(void *u) {
    pthread_mutex_unlock(&((host_vk *)u)->qlock);
}

/* Creates the engine's Vulkan 1.2 instance and a device on the first physical device (timeline semaphores
   enabled where offered), a queue of its first compute family. Skips without Vulkan. */
static void host_create(host_vk *h) {
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->qlock, NULL);
    h->lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h->lib) h->gipa = (PFN_vkGetInstanceProcAddr)(uintptr_t)dlsym(h->lib, "vkGetInstanceProcAddr");
    PFN_vkCreateInstance ci = h->gipa ? (PFN_vkCreateInstance)h->gipa(NULL, "vkCreateInstance") : NULL;
    VkApplicationInfo app = { .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_2 };
    VkInstanceCreateInfo ici = { .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app };
    if (!ci || ci(&ici, NULL, &h->inst) != VK_SUCCESS) {
        if (t_required("vulkan")) fail_msg("%s", "the test's own Vulkan instance could not be created");
        printf("SKIPPED: no Vulkan loader or driver for the engine's own instance\n");
        skip();
    }
#define HOST_LOAD(n) h->n = (PFN_##n)h->gipa(h->inst, #n);
    HOST_VK_FNS(HOST_LOAD)
#undef HOST_LOAD
    uint32_t n = 1;
    VkResult vr = h->vkEnumeratePhysicalDevices(h->inst, &n, &h->pd);
    assert_true((vr == VK_SUCCESS || vr == VK_INCOMPLETE) && n == 1);
    VkQueueFamilyProperties qf[8];
    uint32_t nf = 8;
    h->vkGetPhysicalDeviceQueueFamilyProperties(h->pd, &nf, qf);
    h->fam = 99;
    for (uint32_t i = 0; i < nf && h->fam == 99; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) h->fam = i;
    assert_true(h->fam != 99);
    VkPhysicalDeviceProperties pp;
    h->vkGetPhysicalDeviceProperties(h->pd, &pp);
    VkPhysicalDeviceVulkan12Features f12 = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES };
    VkPhysicalDeviceFeatures2 f2 = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12 };
    if (pp.apiVersion >= VK_API_VERSION_1_2) h->vkGetPhysicalDeviceFeatures2(h->pd, &f2);
    h->timeline = f12.timelineSemaphore == VK_TRUE;
    VkPhysicalDeviceVulkan12Features want = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                              .timelineSemaphore = VK_TRUE };
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = { .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                    .queueFamilyIndex = h->fam,
                                    .queueCount = 1,
                                    .pQueuePriorities = &prio };
    VkDeviceCreateInfo dci = { .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                               .pNext = h->timeline ? &want : NULL,
                               .queueCreateInfoCount = 1,
                               .pQueueCreateInfos = &qci };
    assert_int_equal(h->vkCreateDevice(h->pd, &dci, NULL, &h->dev), VK_SUCCESS);
    h->vkGetDeviceQueue(h->dev, h->fam, 0, &h->q);
}
static void host_destroy(host_vk *h) {
    h->vkDestroyDevice(h->dev, NULL);
    h->vkDestroyInstance(h->inst, NULL);
    pthread_mutex_destroy(&h->qlock);
}
/* host_create, skipping the test where the device has no timeline semaphores (buffer loans need them) */
static void host_create_timeline(host_vk *h) {
    host_create(h);
    if (h->timeline) return;
    host_destroy(h);
    printf("SKIPPED: the device has no timeline semaphores\n");
    skip();
}
static dpar_runtime_desc host_desc(host_vk *h, int n, const VkAllocationCallbacks *ac) {
    dpar_runtime_desc d;
    memset(&d, 0, sizeof d);
    d.backend = DPAR_BACKEND_VULKAN, d.num_devices = n, d.timeout_ms = 20000;
    dpar_vulkan_external *x = &d.vulkan.external;
    x->instance = h->inst, x->physical_device = h->pd, x->device = h->dev, x->queue = h->q;
    x->queue_family = h->fam, x->allocator = ac, x->timeline_semaphore = h->timeline != 0;
    x->get_instance_proc_addr = (void (*)(void))h->gipa;
    x->lock_queue = host_lock, x->unlock_queue = host_unlock, x->queue_user = h;
    return d;
}

/* A host-visible buffer of the engine with n floats, mapped. */
typedef struct hbuf {
    VkBuffer buf;
    VkDeviceMemory mem;
    float *map;
} hbuf;
static void hbuf_create(host_vk *h, size_t n, hbuf *b) {
    VkBufferCreateInfo bi = { .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                              .size = n * sizeof(float),
                              .usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT };
    assert_int_equal(h->vkCreateBuffer(h->dev, &bi, NULL, &b->buf), VK_SUCCESS);
    VkMemoryRequirements r;
    h->vkGetBufferMemoryRequirements(h->dev, b->buf, &r);
    VkPhysicalDeviceMemoryProperties mp;
    h->vkGetPhysicalDeviceMemoryProperties(h->pd, &mp);
    uint32_t want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, t = 0;
    while (t < mp.memoryTypeCount && !((r.memoryTypeBits >> t & 1) && (mp.memoryTypes[t].propertyFlags & want) == want))
        t++;
    assert_true(t < mp.memoryTypeCount);
    VkMemoryAllocateInfo ai = { .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .allocationSize = r.size,
                                .memoryTypeIndex = t };
    assert_int_equal(h->vkAllocateMemory(h->dev, &ai, NULL, &b->mem), VK_SUCCESS);
    assert_int_equal(h->vkBindBufferMemory(h->dev, b->buf, b->mem, 0), VK_SUCCESS);
    assert_int_equal(h->vkMapMemory(h->dev, b->mem, 0, VK_WHOLE_SIZE, 0, (void **)&b->map), VK_SUCCESS);
}
static void hbuf_destroy(host_vk *h, hbuf *b) {
    h->vkDestroyBuffer(h->dev, b->buf, NULL);
    h->vkFreeMemory(h->dev, b->mem, NULL);
}

/* Records `rec` into a one-time command buffer and submits it on the engine's queue (under its lock),
   waiting for / signalling the timeline semaphore `sem` at wait_v / signal_v when given; waits the fence
   when `wait` is set, else returns it in *fence_out (and the pool in *pool_out) for the caller. */
typedef void (*recorder)(host_vk *h, VkCommandBuffer cb, void *user);
static void host_submit(host_vk *h, recorder rec, void *user, VkSemaphore sem, uint64_t wait_v, uint64_t signal_v) {
    VkCommandPool pool;
    VkCommandPoolCreateInfo pi = { .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .queueFamilyIndex = h->fam };
    assert_int_equal(h->vkCreateCommandPool(h->dev, &pi, NULL, &pool), VK_SUCCESS);
    VkCommandBuffer cb;
    VkCommandBufferAllocateInfo ai = { .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                       .commandBufferCount = 1 };
    assert_int_equal(h->vkAllocateCommandBuffers(h->dev, &ai, &cb), VK_SUCCESS);
    VkCommandBufferBeginInfo bi = { .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                    .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT };
    h->vkBeginCommandBuffer(cb, &bi);
    rec(h, cb, user);
    VkMemoryBarrier mb = { .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                           .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                           .dstAccessMask = VK_ACCESS_HOST_READ_BIT };
    h->vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0,
                            NULL);
    h->vkEndCommandBuffer(cb);
    VkTimelineSemaphoreSubmitInfo ti = { .sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                         .waitSemaphoreValueCount = 1,
                                         .pWaitSemaphoreValues = &wait_v,
                                         .signalSemaphoreValueCount = 1,
                                         .pSignalSemaphoreValues = &signal_v };
    VkPipelineStageFlags stage = VK_PIPELINE_STAGE_TRANSFER_BIT;
    VkSubmitInfo si = { .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                        .pNext = sem ? &ti : NULL,
                        .waitSemaphoreCount = sem ? 1u : 0u,
                        .pWaitSemaphores = &sem,
                        .pWaitDstStageMask = &stage,
                        .commandBufferCount = 1,
                        .pCommandBuffers = &cb,
                        .signalSemaphoreCount = sem ? 1u : 0u,
                        .pSignalSemaphores = &sem };
    VkFence fence;
    VkFenceCreateInfo fi = { .sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO };
    assert_int_equal(h->vkCreateFence(h->dev, &fi, NULL, &fence), VK_SUCCESS);
    pthread_mutex_lock(&h->qlock);
    VkResult vr = h->vkQueueSubmit(h->q, 1, &si, fence);
    pthread_mutex_unlock(&h->qlock);
    assert_int_equal(vr, VK_SUCCESS);
    assert_int_equal(h->vkWaitForFences(h->dev, 1, &fence, VK_TRUE, 60ull * 1000000000ull), VK_SUCCESS);
    h->vkDestroyFence(h->dev, fence, NULL);
    h->vkDestroyCommandPool(h->dev, pool, NULL);
}
typedef struct fill_job {
    VkBuffer dst;
    uint32_t word;
} fill_job;
static void rec_fill(host_vk *h, VkCommandBuffer cb, void *user) {
    fill_job *j = (fill_job *)user;
    h->vkCmdFillBuffer(cb, j->dst, 0, VK_WHOLE_SIZE, j->word);
}
typedef struct copy_job {
    VkBuffer src, dst;
    VkDeviceSize off, size;
} copy_job;
static void rec_copy(host_vk *h, VkCommandBuffer cb, void *user) {
    copy_job *j = (copy_job *)user;
    VkBufferCopy r = { j->off, 0, j->size };
    h->vkCmdCopyBuffer(cb, j->src, j->dst, 1, &r);
}

/* The engine's use of a lent buffer: it waits for the export's ready value, copies the buffer into hb
   and signals the release value (its fence waited). */
static void engine_copy(host_vk *h, const dpar_vulkan_export *ex, const hbuf *hb) {
    copy_job cj;
    VkSemaphore sem;
    memcpy(&cj.src, &ex->buffer, sizeof cj.src); /* a pointer or a uint64_t, as the platform has it */
    memcpy(&sem, &ex->semaphore, sizeof sem);
    cj.dst = hb->buf, cj.off = ex->offset, cj.size = ex->size;
    host_submit(h, rec_copy, &cj, sem, ex->ready_value, ex->release_value);
}

static dpar_status scale_dev(dpar_ctx *ctx, int dev, void *user) {
    (void)dev;
    return dpar_scale(dpar_ctx_arg(ctx, 0), *(const float *)user);
}
#endif

/* dpar runs on the engine's device (2 logical devices on its one queue, with its allocator and queue
   lock), computes right, creates and frees its own objects through the allocator only, and leaves the
   device working: the engine fills and reads a buffer on it after dpar_runtime_destroy. */
static void test_adopt_engine_device(void **state) {
    (void)state;
#ifndef DPAR_VULKAN
    skip();
#else
    host_vk h;
    host_create(&h);
    counts c = { 0, 0 };
    VkAllocationCallbacks ac = {
        .pUserData = &c, .pfnAllocation = cnt_alloc, .pfnReallocation = cnt_realloc, .pfnFree = cnt_free
    };
    dpar_runtime_desc d = host_desc(&h, 2, &ac);
    dpar_runtime *rt = NULL;
    T_OK(dpar_runtime_create(&d, &rt));
    assert_int_equal(dpar_runtime_device_count(rt), 2);
    dpar_device_info info;
    T_OK(dpar_runtime_device_info(rt, 1, &info));
    VkPhysicalDeviceProperties pp;
    h.vkGetPhysicalDeviceProperties(h.pd, &pp);
    assert_non_null(strstr(info.name, pp.deviceName));
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 1, { 6 }, { "data" } }, &a));
    const float x[6] = { 1, -2, 3.5f, 4, 0.25f, -8 };
    float y[6];
    T_OK(dpar_array_put(a, x));
    float k = 3.0f;
    run_args ra = { scale_dev, &k };
    T_OK(dpar_shard_map(m, &(dpar_shard_map_desc){ .fn = run_trampoline, .user = &ra, .args = { a } }));
    T_OK(dpar_array_get(a, y));
    for (int i = 0; i < 6; i++) assert_true(y[i] == 3.0f * x[i]);
    assert_true(h.lock_calls > 0); /* dpar's submissions took the engine's queue lock */
    assert_true(c.total > 0);      /* and its objects came from the engine's allocator */
    T_OK(dpar_array_destroy(a));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
    assert_int_equal(c.live, 0); /* everything dpar made on the device is gone, through the same allocator */

    /* the engine's device, queue and instance still work */
    hbuf hb;
    hbuf_create(&h, 4, &hb);
    fill_job fj = { hb.buf, 0x3fc00000u }; /* 1.5f */
    host_submit(&h, rec_fill, &fj, VK_NULL_HANDLE, 0, 0);
    for (int i = 0; i < 4; i++) assert_true(hb.map[i] == 1.5f);
    hbuf_destroy(&h, &hb);
    host_destroy(&h);
#endif
}

/* Bad adoptions are refused with the field named, before anything is created; nothing leaks. */
static void test_adopt_bad_inputs(void **state) {
    (void)state;
#ifndef DPAR_VULKAN
    skip();
#else
    host_vk h;
    host_create(&h);
    dpar_runtime *rt = NULL;
    dpar_runtime_desc d = host_desc(&h, 1, NULL);
    d.vulkan.external.device = NULL; /* handles without a device */
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "external.device is NULL");
    assert_null(rt);
    d = host_desc(&h, 1, NULL);
    d.vulkan.external.queue = NULL;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, ".queue is NULL");
    d = host_desc(&h, 1, NULL);
    d.vulkan.external.queue_family = 99;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "queue_family = 99", "queue famil");
    d = host_desc(&h, 1, NULL);
    d.vulkan.external.unlock_queue = NULL;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "lock_queue / unlock_queue");
    d = host_desc(&h, 1, NULL);
    d.vulkan.physical_device = 1;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "physical_device", "external.device");
    /* a family without compute, where the device has one (llvmpipe's one family has compute) */
    VkQueueFamilyProperties qf[8];
    uint32_t nf = 8;
    h.vkGetPhysicalDeviceQueueFamilyProperties(h.pd, &nf, qf);
    for (uint32_t i = 0; i < nf; i++)
        if (!(qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
            d = host_desc(&h, 1, NULL);
            d.vulkan.external.queue_family = i;
            T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "no VK_QUEUE_COMPUTE_BIT");
        }
    assert_null(rt);
    host_destroy(&h);
#endif
}

/* The export contract: dpar's result reaches an engine buffer through the exported VkBuffer on the GPU
   (wait ready_value, copy, signal release_value), the loan blocks every dpar use of the buffer and of the
   runtime's dispatches, and dpar's next write waits for the engine's release: the engine's copy holds the
   values from before it. */
static void test_export_contract(void **state) {
    (void)state;
#ifndef DPAR_VULKAN
    skip();
#else
    host_vk h;
    host_create_timeline(&h);
    dpar_runtime_desc d = host_desc(&h, 1, NULL);
    dpar_runtime *rt = NULL;
    T_OK(dpar_runtime_create(&d, &rt));
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &(dpar_array_desc){ DPAR_F32, 1, { 5 }, { NULL } }, &a));
    const float x[5] = { 1, 2, 3, 4, 5 };
    T_OK(dpar_array_put(a, x));
    float k = 2.0f;
    run_args ra = { scale_dev, &k };
    dpar_shard_map_desc sm = { .fn = run_trampoline, .user = &ra, .args = { a } };
    T_OK(dpar_shard_map(m, &sm)); /* 2 x, still on the GPU */
    dpar_buffer *b = dpar_array_shard(a, 0);

    dpar_vulkan_export ex;
    T_OK(dpar_vulkan_buffer_export(b, &ex));
    assert_true(ex.buffer != 0 && ex.semaphore != 0);
    assert_int_equal(ex.size, 5 * sizeof(float));
    assert_int_equal(ex.queue_family, h.fam);
    assert_true(ex.release_value > ex.ready_value && ex.ready_value > 0);
    /* lent: dpar leaves it alone */
    float tmp[5];
    dpar_vulkan_export ex2;
    T_ERR(dpar_buffer_read(b, 0, tmp, sizeof tmp), DPAR_ERR_STATE, "lent", "dpar_vulkan_buffer_release");
    T_ERR(dpar_shard_map(m, &sm), DPAR_ERR_STATE, "lent", "dpar_vulkan_buffer_release");
    T_ERR(dpar_vulkan_buffer_export(b, &ex2), DPAR_ERR_STATE, "lent");
    T_ERR(dpar_runtime_destroy(rt), DPAR_ERR_STATE, "lent");

    hbuf hb;
    hbuf_create(&h, 5, &hb);
    engine_copy(&h, &ex, &hb);
    (void)dpar_set_last_error(DPAR_ERR_SHAPE, "user: kept");
    T_OK(dpar_vulkan_buffer_release(b));
    assert_string_equal(dpar_last_error(), "user: kept"); /* a release that succeeds keeps the last error */
    T_ERR(dpar_vulkan_buffer_release(b), DPAR_ERR_STATE, "not lent");
    for (int i = 0; i < 5; i++) assert_true(hb.map[i] == 2.0f * x[i]);
    T_OK(dpar_shard_map(m, &sm)); /* 4 x, after the engine's copy */
    float y[5];
    T_OK(dpar_array_get(a, y));
    for (int i = 0; i < 5; i++) assert_true(y[i] == 4.0f * x[i] && hb.map[i] == 2.0f * x[i]);
    /* a second loan of the same buffer, values 3 and 4 of the semaphore */
    T_OK(dpar_vulkan_buffer_export(b, &ex2));
    assert_true(ex2.ready_value == ex.release_value + 1);
    engine_copy(&h, &ex2, &hb);
    T_OK(dpar_vulkan_buffer_release(b));
    for (int i = 0; i < 5; i++) assert_true(hb.map[i] == 4.0f * x[i]);
    hbuf_destroy(&h, &hb);
    T_OK(dpar_array_destroy(a));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));

    /* a buffer of dpar's own VkDevice is out of the engine's reach */
    dpar_runtime *own = vk_runtime(1, 0);
    dpar_buffer *ob = NULL;
    T_OK(dpar_buffer_create(own, 0, DPAR_F32, 1, (const int64_t[]){ 2 }, &ob));
    T_ERR(dpar_vulkan_buffer_export(ob, &ex), DPAR_ERR_BACKEND_UNAVAILABLE, "dpar created", "desc.vulkan.external");
    T_ERR(dpar_vulkan_buffer_release(ob), DPAR_ERR_STATE, "not lent");
    T_OK(dpar_buffer_destroy(ob));
    T_OK(dpar_runtime_destroy(own));
    /* a CPU runtime's buffer has no VkBuffer */
    dpar_runtime *cpu = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_buffer *cb = NULL;
    T_OK(dpar_buffer_create(cpu, 0, DPAR_F32, 1, (const int64_t[]){ 2 }, &cb));
    T_ERR(dpar_vulkan_buffer_export(cb, &ex), DPAR_ERR_BACKEND_UNAVAILABLE, "cpu backend");
    T_ERR(dpar_vulkan_buffer_export(NULL, &ex), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_OK(dpar_buffer_destroy(cb));
    T_OK(dpar_runtime_destroy(cpu));
    host_destroy(&h);
#endif
}

/* Runtimes that lend a buffer and are destroyed at once, many times: dpar_runtime_destroy must not free its
   timeline semaphore while the driver still uses it (Mesa's emulated timelines finish a batch on a submit
   thread after its fence is signalled; this corrupted the heap about once in 50 runs of
   test_export_contract under load before the destroy drained the queue). */
static void test_export_destroy_repeated(void **state) {
    (void)state;
#ifndef DPAR_VULKAN
    skip();
#else
    host_vk h;
    host_create_timeline(&h);
    hbuf hb;
    hbuf_create(&h, 4, &hb);
    const float x[4] = { 1, 2, 3, 4 };
    for (int it = 0; it < 40; it++) {
        dpar_runtime_desc d = host_desc(&h, 1, NULL);
        dpar_runtime *rt = NULL;
        T_OK(dpar_runtime_create(&d, &rt));
        dpar_buffer *b = NULL;
        T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, (const int64_t[]){ 4 }, &b));
        T_OK(dpar_buffer_write(b, 0, x, sizeof x));
        dpar_vulkan_export ex;
        T_OK(dpar_vulkan_buffer_export(b, &ex));
        engine_copy(&h, &ex, &hb);
        T_OK(dpar_vulkan_buffer_release(b));
        T_OK(dpar_scale(b, 2.0f)); /* a batch that waits for the release value */
        T_OK(dpar_buffer_destroy(b));
        T_OK(dpar_runtime_destroy(rt));
        for (int i = 0; i < 4; i++) assert_true(hb.map[i] == x[i]);
    }
    hbuf_destroy(&h, &hb);
    host_destroy(&h);
#endif
}

/* ---- llvmpipe's loop cap (>>vulkan loops in backends/dpar_vulkan.h) ---- */
/* llvmpipe ends a shader's loops after 65,535 turns an invocation, silently: dpar refuses there what it
   cannot split */
static int loop_capped(dpar_runtime *rt) {
    dpar_device_info info;
    T_OK(dpar_runtime_device_info(rt, 0, &info));
    return strstr(info.driver, "llvmpipe") != NULL || strstr(info.name, "llvmpipe") != NULL;
}
/* A buffer past maxStorageBufferRange (llvmpipe's 128 MiB; a GPU binds 272 MiB): transfers fill and read it;
   ops that bind it in a shader are refused with the range as the reason (dpar_sum named its loop cap, checked
   first) and write nothing, calls of several ops (pad, slice_backward) included. */
static void test_buffer_range(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(1, 0);
    int llvmpipe = loop_capped(rt);
    const int64_t n = (int64_t)(272 << 20) / 4; /* past 67,096,576: dpar_sum's loops pass llvmpipe's cap too */
    dpar_buffer *b = t_buf1(rt, DPAR_F32, n, NULL), *r = t_buf1(rt, DPAR_F32, 1, NULL);
    float v = 0, sum = 0;
    T_OK(dpar_fill(b, 3.0f));
    T_OK(dpar_fill(r, -1.0f));
    T_OK(dpar_buffer_read(b, (size_t)(n - 1) * 4, &v, 4));
    assert_true(v == 3.0f);
    if (llvmpipe) {
        T_ERR(dpar_scale(b, 2.0f), DPAR_ERR_BACKEND, "vulkan: scale", "exceeds maxStorageBufferRange");
        T_ERR(dpar_sum(r, b), DPAR_ERR_BACKEND, "vulkan: sum", "exceeds maxStorageBufferRange");
        /* pad and slice_backward fill b, then copy into it: refused before the fill (b was -5, then 0) */
        dpar_buffer *x = t_buf1(rt, DPAR_F32, 4, NULL);
        const int64_t at[1] = { 8 };
        T_ERR(dpar_pad(b, x, at, -5.0f), DPAR_ERR_BACKEND, "strided_copy", "exceeds maxStorageBufferRange");
        T_ERR(dpar_slice_backward(b, x, at, NULL), DPAR_ERR_BACKEND, "strided_copy", "exceeds maxStorageBufferRange");
        dpar_buffer_destroy(x);
    } else {
        T_OK(dpar_scale(b, 2.0f));
        T_OK(dpar_sum(r, b));
    }
    T_OK(dpar_buffer_read(b, 0, &v, 4));
    T_OK(dpar_buffer_read(r, 0, &sum, 4));
    double want = llvmpipe ? -1.0 : 6.0 * (double)n; /* a GPU's sum: within float rounding */
    if (v != (llvmpipe ? 3.0f : 6.0f) || fabs(sum - want) > 1e-6 * fabs(want))
        fail_msg("b[0] = %g, sum = %.9g (want %.9g)", (double)v, (double)sum, want);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(r);
    dpar_runtime_destroy(rt);
}
/* The one-workgroup shaders over 2^24 elements (65,536 turns of 256 lanes; on main each came out wrong):
   dpar_sum and dpar_sum_squares of ones (131,070), dpar_mse of ones against zeros, and the index check of
   dpar_embedding with the one bad index last (not seen: no error). */
static void test_loop_cap_one_group(void **state) {
    (void)state;
    const int64_t n = (int64_t)1 << 24, d1[2] = { 2, 1 };
    dpar_runtime *rt = vk_runtime(1, 0);
    dpar_buffer *x = t_buf1(rt, DPAR_F32, n, NULL), *out = t_buf1(rt, DPAR_F32, 1, NULL);
    float r = 0;
    T_OK(dpar_fill(x, 1.0f));
    T_OK(dpar_sum(out, x));
    t_read(out, &r);
    assert_true(r == 16777216.0f); /* exact: every partial sum is an integer below 2^24 */
    T_OK(dpar_sum_squares(out, x));
    t_read(out, &r);
    assert_true(r == 16777216.0f);
    dpar_buffer *zero = t_buf1(rt, DPAR_F32, n, NULL); /* zeroed */
    T_OK(dpar_mse(out, NULL, x, zero));
    t_read(out, &r);
    assert_true(r == 1.0f);
    dpar_buffer_destroy(zero);
    dpar_buffer *idx = t_buf1(rt, DPAR_I32, n, NULL), *table = t_buf(rt, 0, DPAR_F32, 2, d1, NULL); /* zeroed */
    int32_t bad = 2;
    T_OK(dpar_buffer_write(idx, (size_t)(n - 1) * 4, &bad, 4));
    T_OK(dpar_embedding(x, table, idx));
    T_ERR(dpar_buffer_read(x, 0, &r, 4), DPAR_ERR_INVALID_ARGUMENT, "16777215", "= 2");
    dpar_buffer_destroy(idx);
    dpar_buffer_destroy(table);
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(out);
    dpar_runtime_destroy(rt);
}
/* softmax, log_softmax and their backward over 2 rows of 70,000 (a workgroup a row): against double on the
   host. An invocation a row looped 3 x 70,000 times and left most of the row unwritten on llvmpipe. */
static void test_loop_cap_softmax_rows(void **state) {
    (void)state;
    enum { M = 2, N = 70000 };
    int64_t sh[2] = { M, N };
    dpar_runtime *rt = vk_runtime(1, 0);
    float *x = (float *)malloc(sizeof(float) * M * N), *dy = (float *)malloc(sizeof(float) * M * N);
    float *y = (float *)malloc(sizeof(float) * M * N), *dx = (float *)malloc(sizeof(float) * M * N);
    assert_true(x && dy && y && dx);
    for (int i = 0; i < M * N; i++) x[i] = (float)((i * 7919) % 1000) / 125.0f - 4.0f, dy[i] = (float)(i % 13) - 6.0f;
    dpar_buffer *bx = t_buf(rt, 0, DPAR_F32, 2, sh, x), *bdy = t_buf(rt, 0, DPAR_F32, 2, sh, dy);
    dpar_buffer *by = t_buf(rt, 0, DPAR_F32, 2, sh, NULL), *bdx = t_buf(rt, 0, DPAR_F32, 2, sh, NULL);
    for (int lg = 0; lg < 2; lg++) {
        T_OK(dpar_softmax(by, bx, lg));
        T_OK(dpar_softmax_backward(bdx, bdy, by, lg));
        t_read(by, y);
        t_read(bdx, dx);
        for (int r = 0; r < M; r++) {
            const float *xr = x + r * N, *dyr = dy + r * N;
            double mx = -INFINITY, se = 0, sg = 0;
            for (int j = 0; j < N; j++) mx = xr[j] > mx ? xr[j] : mx;
            for (int j = 0; j < N; j++) se += exp(xr[j] - mx);
            for (int j = 0; j < N; j++) sg += lg ? dyr[j] : dyr[j] * (double)y[r * N + j];
            for (int j = 0; j < N; j++) {
                double p = exp(xr[j] - mx) / se, want = lg ? xr[j] - mx - log(se) : p;
                double g = lg ? dyr[j] - p * sg : p * (dyr[j] - sg);
                if (fabs(y[r * N + j] - want) > 1e-5 * fabs(want) + 1e-12 ||
                    fabs(dx[r * N + j] - g) > 1e-4 * fabs(g) + 1e-8)
                    fail_msg("%s row %d [%d]: y %.9g (want %.9g), dx %.9g (want %.9g)", lg ? "log_softmax" : "softmax",
                             r, j, y[r * N + j], want, dx[r * N + j], g);
            }
        }
    }
    dpar_buffer *bufs[] = { bx, bdy, by, bdx };
    for (int i = 0; i < 4; i++) dpar_buffer_destroy(bufs[i]);
    free(x), free(dy), free(y), free(dx);
    dpar_runtime_destroy(rt);
}
/* Column sums over 70,000 rows (a workgroup a column): dpar_bias_grad and dpar_layer_norm_backward's dw, db,
   against double on the host. An invocation a column looped 70,000 times: wrong on llvmpipe, no error. */
static void test_loop_cap_column_sums(void **state) {
    (void)state;
    enum { M = 70000, N = 3 };
    int64_t sh[2] = { M, N }, sst[2] = { M, 2 }, s1[1] = { N };
    dpar_runtime *rt = vk_runtime(1, 0);
    float *x = (float *)malloc(sizeof(float) * M * N), *dy = (float *)malloc(sizeof(float) * M * N);
    float *st = (float *)malloc(sizeof(float) * M * 2), db[N], dw[N], db2[N];
    assert_true(x && dy && st);
    for (int i = 0; i < M * N; i++) x[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f, dy[i] = (float)(i % 13) - 6.5f;
    dpar_buffer *bx = t_buf(rt, 0, DPAR_F32, 2, sh, x), *bdy = t_buf(rt, 0, DPAR_F32, 2, sh, dy);
    dpar_buffer *bst = t_buf(rt, 0, DPAR_F32, 2, sst, NULL), *by = t_buf(rt, 0, DPAR_F32, 2, sh, NULL);
    dpar_buffer *bdb = t_buf(rt, 0, DPAR_F32, 1, s1, NULL), *bdw = t_buf(rt, 0, DPAR_F32, 1, s1, NULL);
    dpar_buffer *bdb2 = t_buf(rt, 0, DPAR_F32, 1, s1, NULL);
    T_OK(dpar_bias_grad(bdb, bdy, 0.0f));
    T_OK(dpar_layer_norm(by, bst, bx, NULL, NULL, 1e-5f));
    T_OK(dpar_layer_norm_backward(NULL, bdw, bdb2, bdy, bx, NULL, bst));
    t_read(bdb, db);
    t_read(bdw, dw);
    t_read(bdb2, db2);
    t_read(bst, st);
    for (int j = 0; j < N; j++) {
        double sb = 0, sw = 0, ab = 0, aw = 0;
        for (int r = 0; r < M; r++) {
            double g = dy[r * N + j], xh = ((double)x[r * N + j] - st[2 * r]) * st[2 * r + 1];
            sb += g, sw += g * xh, ab += fabs(g), aw += fabs(g * xh);
        }
        if (fabs(db[j] - sb) > 1e-6 * ab || fabs(db2[j] - sb) > 1e-6 * ab || fabs(dw[j] - sw) > 1e-5 * aw)
            fail_msg("column %d: bias_grad %.9g, layer_norm db %.9g (want %.9g), dw %.9g (want %.9g)", j, db[j], db2[j],
                     sb, dw[j], sw);
    }
    dpar_buffer *bufs[] = { bx, bdy, bst, by, bdb, bdw, bdb2 };
    for (int i = 0; i < 7; i++) dpar_buffer_destroy(bufs[i]);
    free(x), free(dy), free(st);
    dpar_runtime_destroy(rt);
}
/* layer_norm and its backward over 2 rows of 24,000 (a workgroup a row): against double on the host. A row
   an invocation looped 3 x 24,000 times: wrong on llvmpipe, no error. */
static void test_loop_cap_norm_rows(void **state) {
    (void)state;
    enum { M = 2, N = 24000 };
    int64_t sh[2] = { M, N }, sst[2] = { M, 2 };
    dpar_runtime *rt = vk_runtime(1, 0);
    float *x = (float *)malloc(sizeof(float) * M * N), *dy = (float *)malloc(sizeof(float) * M * N);
    float *y = (float *)malloc(sizeof(float) * M * N), *dx = (float *)malloc(sizeof(float) * M * N);
    assert_true(x && dy && y && dx);
    for (int i = 0; i < M * N; i++) x[i] = (float)((i * 7919) % 1000) / 250.0f + 3.0f, dy[i] = (float)(i % 13) - 6.0f;
    dpar_buffer *bx = t_buf(rt, 0, DPAR_F32, 2, sh, x), *bdy = t_buf(rt, 0, DPAR_F32, 2, sh, dy);
    dpar_buffer *by = t_buf(rt, 0, DPAR_F32, 2, sh, NULL), *bdx = t_buf(rt, 0, DPAR_F32, 2, sh, NULL);
    dpar_buffer *bst = t_buf(rt, 0, DPAR_F32, 2, sst, NULL);
    T_OK(dpar_layer_norm(by, bst, bx, NULL, NULL, 1e-5f));
    T_OK(dpar_layer_norm_backward(bdx, NULL, NULL, bdy, bx, NULL, bst));
    t_read(by, y);
    t_read(bdx, dx);
    for (int r = 0; r < M; r++) {
        const float *xr = x + r * N, *gr = dy + r * N;
        double mean = 0, var = 0, mg = 0, mgx = 0;
        for (int j = 0; j < N; j++) mean += xr[j];
        mean /= N;
        for (int j = 0; j < N; j++) var += (xr[j] - mean) * (xr[j] - mean);
        double rstd = 1 / sqrt(var / N + 1e-5);
        for (int j = 0; j < N; j++) mg += gr[j], mgx += gr[j] * (xr[j] - mean) * rstd;
        mg /= N, mgx /= N;
        for (int j = 0; j < N; j++) {
            double xh = (xr[j] - mean) * rstd, g = rstd * (gr[j] - mg - xh * mgx);
            if (fabs(y[r * N + j] - xh) > 1e-4 || fabs(dx[r * N + j] - g) > 1e-4 * (fabs(g) + 1))
                fail_msg("row %d [%d]: y %.9g (want %.9g), dx %.9g (want %.9g)", r, j, y[r * N + j], xh, dx[r * N + j],
                         g);
        }
    }
    dpar_buffer *bufs[] = { bx, bdy, by, bdx, bst };
    for (int i = 0; i < 5; i++) dpar_buffer_destroy(bufs[i]);
    free(x), free(dy), free(y), free(dx);
    dpar_runtime_destroy(rt);
}
/* conv2d's kernel gradient (and db) over 64 x 32 x 32 outputs, 3x3 SAME (a workgroup a dw element): against
   double on the host. An invocation a dw element looped 64 x 32 x 33 times: wrong on llvmpipe, no error. */
static void test_loop_cap_conv_kernel_grad(void **state) {
    (void)state;
    enum { N = 64, H = 32, W = 32, O = 2 };
    int64_t sx[4] = { N, H, W, 1 }, sy[4] = { N, H, W, O }, sw[4] = { 3, 3, 1, O }, sb[1] = { O };
    dpar_runtime *rt = vk_runtime(1, 0);
    float *x = (float *)malloc(sizeof(float) * N * H * W), *dy = (float *)malloc(sizeof(float) * N * H * W * O);
    float dw[9 * O], db[O];
    assert_true(x && dy);
    for (int i = 0; i < N * H * W; i++) x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    for (int i = 0; i < N * H * W * O; i++) dy[i] = (float)(i % 7) - 3.0f;
    dpar_buffer *bx = t_buf(rt, 0, DPAR_F32, 4, sx, x), *bdy = t_buf(rt, 0, DPAR_F32, 4, sy, dy);
    dpar_buffer *bdw = t_buf(rt, 0, DPAR_F32, 4, sw, NULL), *bdb = t_buf(rt, 0, DPAR_F32, 1, sb, NULL);
    dpar_conv2d_desc cd = { 0 }; /* stride 1, SAME */
    T_OK(dpar_conv2d_backward_kernel(bdw, bdb, bx, bdy, &cd));
    t_read(bdw, dw);
    t_read(bdb, db);
    for (int p = 0; p < 3; p++)
        for (int q = 0; q < 3; q++)
            for (int o = 0; o < O; o++) {
                double sum = 0, mag = 0, bsum = 0;
                for (int n = 0; n < N; n++)
                    for (int i = 0; i < H; i++)
                        for (int j = 0; j < W; j++) {
                            int ih = i - 1 + p, iw = j - 1 + q;
                            double g = dy[((n * H + i) * W + j) * O + o];
                            bsum += g;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            double t = x[(n * H + ih) * W + iw] * g;
                            sum += t, mag += fabs(t);
                        }
                float got = dw[(p * 3 + q) * O + o];
                if (fabs(got - sum) > 1e-5 * mag || fabs(db[o] - bsum) > 1e-6 * N * H * W)
                    fail_msg("dw[%d,%d,0,%d] = %.9g (want %.9g), db[%d] = %.9g (want %.9g)", p, q, o, got, sum, o,
                             db[o], bsum);
            }
    dpar_buffer *bufs[] = { bx, bdy, bdw, bdb };
    for (int i = 0; i < 4; i++) dpar_buffer_destroy(bufs[i]);
    free(x), free(dy);
    dpar_runtime_destroy(rt);
}
/* The direct matmul's column blocks a workgroup on a CPU device (dpar__vk_mm_cols: 8 up to K = 1,021, 7 at
   1,022, 2 at 2,728, one from 4,094) and K at the cap's boundary: 65,530 runs, 65,531 is refused as with a
   block a workgroup. Small integers: every sum exact in f32, so against the host's exactly. */
static void test_loop_cap_matmul_blocks(void **state) {
    (void)state;
    enum { M = 33, N = 389 };
    static const int64_t ks[] = { 1021, 1022, 2728, 8190 };
    dpar_runtime *rt = vk_runtime(1, 0);
    int capped = loop_capped(rt);
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        int64_t K = ks[t], sa[2] = { M, K }, sb[2] = { N, K }, sc[2] = { M, N }; /* B transposed: [N, K] */
        float *a = (float *)malloc(sizeof(float) * (size_t)(M * K)),
              *b = (float *)malloc(sizeof(float) * (size_t)(N * K));
        float *c = (float *)malloc(sizeof(float) * M * N);
        assert_true(a && b && c);
        for (int64_t i = 0; i < M * K; i++) a[i] = (float)(i % 5) - 2.0f;
        for (int64_t i = 0; i < N * K; i++) b[i] = (float)((i * 3) % 7) - 3.0f;
        dpar_buffer *ba = t_buf(rt, 0, DPAR_F32, 2, sa, a), *bb = t_buf(rt, 0, DPAR_F32, 2, sb, b);
        dpar_buffer *bc = t_buf(rt, 0, DPAR_F32, 2, sc, NULL);
        T_OK(dpar_matmul(bc, ba, bb, false, true, 1.0f, 0.0f));
        t_read(bc, c);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double want = 0;
                for (int64_t kk = 0; kk < K; kk++) want += (double)a[i * K + kk] * b[j * K + kk];
                if (c[i * N + j] != (float)want)
                    fail_msg("K %lld: C[%d, %d] = %.9g (want %.9g)", (long long)K, i, j, c[i * N + j], want);
            }
        dpar_buffer_destroy(ba), dpar_buffer_destroy(bb), dpar_buffer_destroy(bc);
        free(a), free(b), free(c);
    }
    for (int64_t K = 65530; K <= 65531; K++) {
        int64_t sa[2] = { 1, K }, sb[2] = { K, 17 }, sc[2] = { 1, 17 };
        float c[17];
        dpar_buffer *ba = t_buf(rt, 0, DPAR_F32, 2, sa, NULL), *bb = t_buf(rt, 0, DPAR_F32, 2, sb, NULL);
        dpar_buffer *bc = t_buf(rt, 0, DPAR_F32, 2, sc, NULL);
        T_OK(dpar_fill(ba, 1.0f));
        T_OK(dpar_fill(bb, 1.0f));
        T_OK(dpar_fill(bc, 5.0f));
        int refused = capped && K == 65531;
        if (refused)
            T_ERR(dpar_matmul(bc, ba, bb, false, false, 1.0f, 0.0f), DPAR_ERR_SHAPE, "k 65531",
                  "llvmpipe ends shader loops after 65,535 iterations");
        else
            T_OK(dpar_matmul(bc, ba, bb, false, false, 1.0f, 0.0f));
        t_read(bc, c);
        for (int j = 0; j < 17; j++)
            if (c[j] != (refused ? 5.0f : (float)K)) fail_msg("K %lld: C[0, %d] = %.9g", (long long)K, j, c[j]);
        dpar_buffer_destroy(ba), dpar_buffer_destroy(bb), dpar_buffer_destroy(bc);
    }
    dpar_runtime_destroy(rt);
}
/* The element-wise shaders' fuller workgroups on a CPU device (dpar__vk_flat_groups: up to 16 items an
   invocation): bias_add stepping its column across an invocation's items ([3001, 10] and [4097, 7]:
   strides of 2,048 and 4,352 are not multiples of the columns), relu and relu_backward, exactly against the
   host at workgroup boundaries (4,096 items a workgroup, one item more or less). */
static void test_fuller_workgroups(void **state) {
    (void)state;
    static const int64_t shapes[][2] = { { 3001, 10 }, { 4097, 7 }, { 16, 256 }, { 16, 257 }, { 4095, 16 }, { 1, 1 } };
    dpar_runtime *rt = vk_runtime(1, 0);
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        int64_t m = shapes[t][0], n = shapes[t][1], cnt = m * n;
        float *x = (float *)malloc(sizeof(float) * (size_t)cnt), *dy = (float *)malloc(sizeof(float) * (size_t)cnt);
        float *y = (float *)malloc(sizeof(float) * (size_t)cnt), *dx = (float *)malloc(sizeof(float) * (size_t)cnt);
        float *bias = (float *)malloc(sizeof(float) * (size_t)n);
        assert_true(x && dy && y && dx && bias);
        for (int64_t i = 0; i < cnt; i++)
            x[i] = (float)((i * 7919) % 1001) / 64.0f - 7.0f, dy[i] = (float)(i % 13) - 6.0f;
        for (int64_t j = 0; j < n; j++) bias[j] = (float)j * 0.25f + 0.125f;
        dpar_buffer *bx = t_buf(rt, 0, DPAR_F32, 2, shapes[t], x), *bb = t_buf1(rt, DPAR_F32, n, bias);
        dpar_buffer *bdy = t_buf(rt, 0, DPAR_F32, 2, shapes[t], dy), *by = t_buf(rt, 0, DPAR_F32, 2, shapes[t], NULL);
        dpar_buffer *bdx = t_buf(rt, 0, DPAR_F32, 2, shapes[t], NULL);
        T_OK(dpar_bias_add(bx, bb));
        T_OK(dpar_relu(by, bx));
        T_OK(dpar_relu_backward(bdx, bdy, bx));
        t_read(by, y);
        t_read(bdx, dx);
        for (int64_t i = 0; i < cnt; i++) {
            float h = x[i] + bias[i % n];
            if (y[i] != (h > 0.0f ? h : 0.0f) || dx[i] != (h > 0.0f ? dy[i] : 0.0f))
                fail_msg("[%lld, %lld] element %lld: relu %.9g, relu_backward %.9g (x + b = %.9g, dy %.9g)",
                         (long long)m, (long long)n, (long long)i, y[i], dx[i], h, dy[i]);
        }
        dpar_buffer *bufs[] = { bx, bb, bdy, by, bdx };
        for (int i = 0; i < 5; i++) dpar_buffer_destroy(bufs[i]);
        free(x), free(dy), free(y), free(dx), free(bias);
    }
    dpar_runtime_destroy(rt);
}
/* Ops whose invocations must loop past llvmpipe's cap are refused there with their output untouched, and
   right on any other device: a matmul of K = 70,000; an embedding gradient over 70,000 indices with beta 0.5
   (refused before the core scales dtable: be->op_fits). */
/* The host's softmax cross-entropy of M rows of C (smoothing a, no ignored rows) in double, its gradient in g:
   NaN for a row with a NaN logit or a label outside 0..C-1. */
static double xent_want(int64_t M, int64_t C, const float *z, const int32_t *lab, double a, double *g) {
    double loss = 0;
    for (int64_t r = 0; r < M; r++) {
        const float *zr = z + r * C;
        double mx = -INFINITY, se = 0, zs = 0;
        for (int64_t c = 0; c < C; c++) mx = zr[c] > mx || isnan(zr[c]) ? zr[c] : mx;
        for (int64_t c = 0; c < C; c++) se += exp(zr[c] - mx), zs += zr[c] - mx;
        int ok = lab[r] >= 0 && lab[r] < C && !isnan(mx);
        loss += ok ? (1 - a) * (mx - zr[lab[r]] + log(se)) + a * (log(se) - zs / (double)C) : NAN;
        for (int64_t c = 0; c < C; c++)
            g[r * C + c] = ok ? (exp(zr[c] - mx) / se - (c == lab[r] ? 1 - a : 0) - a / (double)C) / (double)M : NAN;
    }
    return loss / (double)M;
}
/* dpar_cross_entropy of M rows of C (smoothing a) on rt against xent_want; bad: the bad label's error text
   (at the next read), or NULL */
static void xent_check(dpar_runtime *rt, int64_t M, int64_t C, const float *z, const int32_t *lab, float a,
                       const char *bad) {
    int64_t sz[2] = { M, C }, one = 1;
    dpar_buffer *bz = t_buf(rt, 0, DPAR_F32, 2, sz, z), *bl = t_buf1(rt, DPAR_I32, M, lab);
    dpar_buffer *bg = t_buf(rt, 0, DPAR_F32, 2, sz, NULL), *bo = t_buf1(rt, DPAR_F32, one, NULL);
    float *g = (float *)malloc(sizeof(float) * (size_t)(M * C)), loss = 0;
    double *want = (double *)malloc(sizeof(double) * (size_t)(M * C));
    assert_true(g && want);
    dpar_xent_desc d = { .label_smoothing = a };
    T_OK(dpar_cross_entropy(bo, bg, bz, bl, &d));
    if (bad) T_ERR(dpar_buffer_read(bo, 0, &loss, 4), DPAR_ERR_INVALID_ARGUMENT, bad);
    t_read(bo, &loss);
    t_read(bg, g);
    double wl = xent_want(M, C, z, lab, a, want);
    if (isnan(wl) != isnan(loss) || (!isnan(wl) && fabs(loss - wl) > 1e-5 * fabs(wl) + 1e-6))
        fail_msg("xent %lldx%lld smoothing %g: loss %.9g, want %.9g", (long long)M, (long long)C, a, loss, wl);
    for (int64_t i = 0; i < M * C; i++)
        if (isnan(want[i]) != isnan(g[i]) || (!isnan(want[i]) && fabs(g[i] - want[i]) > 1e-4 * fabs(want[i]) + 1e-10))
            fail_msg("xent %lldx%lld smoothing %g: dlogits[%lld] %.9g, want %.9g", (long long)M, (long long)C, a,
                     (long long)i, g[i], want[i]);
    dpar_buffer_destroy(bz), dpar_buffer_destroy(bl), dpar_buffer_destroy(bg), dpar_buffer_destroy(bo);
    free(g), free(want);
}
/* Softmax cross-entropy of wide rows (a workgroup a row, its lanes over the classes: dpar__vk_xent) against
   double on the host. A row of GPT-2's 50,257 classes was refused on llvmpipe (an invocation looped 4 x 50,257
   times): plain and smoothed; 4 rows of them with a NaN logit in row 1 and bad labels in rows 2 and 3 (NaN
   loss and rows, row 2 named). Then the cap's edge, 3 * ceil(C / 64) + 19 turns an invocation: a row of
   1,397,632 classes runs right (let through, one turn more left its last gradients unwritten), one more
   class is refused on llvmpipe. */
static void test_loop_cap_xent_wide(void **state) {
    (void)state;
    const int64_t V = 50257, E = 21838 * 64;
    dpar_runtime *rt = vk_runtime(1, 0);
    int capped = loop_capped(rt);
    float *z = (float *)malloc(sizeof(float) * (size_t)(E + 1));
    assert_true(z != NULL);
    for (int64_t i = 0; i <= E; i++) z[i] = (float)((i * 7919) % 1000) / 125.0f - 4.0f;
    int32_t lab[4] = { 50000, 7, 50257, -1 };
    xent_check(rt, 1, V, z, lab, 0.0f, NULL);
    xent_check(rt, 1, V, z, lab, 0.1f, NULL);
    z[V + 123] = NAN;
    xent_check(rt, 4, V, z, lab, 0.1f, "labels[2] = 50257");
    z[V + 123] = 1.0f;
    xent_check(rt, 1, E, z, lab, 0.0f, NULL);
    int64_t sz[2] = { 1, E + 1 }, one = 1;
    dpar_buffer *bz = t_buf(rt, 0, DPAR_F32, 2, sz, z), *bl = t_buf1(rt, DPAR_I32, 1, lab);
    dpar_buffer *bg = t_buf(rt, 0, DPAR_F32, 2, sz, NULL), *bo = t_buf1(rt, DPAR_F32, one, NULL);
    if (capped)
        T_ERR(dpar_softmax_xent(bo, bg, bz, bl), DPAR_ERR_SHAPE, "softmax_xent of [1, 1397633]",
              "llvmpipe ends shader loops after 65,535 iterations");
    else
        T_OK(dpar_softmax_xent(bo, bg, bz, bl));
    dpar_buffer_destroy(bz), dpar_buffer_destroy(bl), dpar_buffer_destroy(bg), dpar_buffer_destroy(bo);
    free(z);
    dpar_runtime_destroy(rt);
}
static void test_loop_cap_refused(void **state) {
    (void)state;
    dpar_runtime *rt = vk_runtime(1, 0);
    int capped = loop_capped(rt);
    float r = 0, tab[2];
    int64_t sk[2] = { 70000, 1 }, st[2] = { 2, 1 };
    dpar_buffer *idx = t_buf1(rt, DPAR_I32, 70000, NULL), *dout = t_buf(rt, 0, DPAR_F32, 2, sk, NULL); /* zeros */
    dpar_buffer *dt = t_buf(rt, 0, DPAR_F32, 2, st, NULL);
    T_OK(dpar_fill(dout, 1.0f));
    T_OK(dpar_fill(dt, 5.0f));
    if (capped) {
        T_ERR(dpar_embedding_backward(dt, dout, idx, 0.5f), DPAR_ERR_SHAPE, "embedding_backward of [70000, 1]",
              "llvmpipe ends shader loops after 65,535 iterations");
        assert_null(strstr(dpar_last_error(), "(m ")); /* the backend's m, n, k: a matmul's only */
    } else
        T_OK(dpar_embedding_backward(dt, dout, idx, 0.5f));
    t_read(dt, tab);
    assert_true(tab[0] == (capped ? 5.0f : 70002.5f) && tab[1] == (capped ? 5.0f : 2.5f));
    dpar_buffer_destroy(idx);
    dpar_buffer_destroy(dout);
    dpar_buffer_destroy(dt);
    int64_t sa[2] = { 1, 70000 }, sb[2] = { 70000, 1 }, sc[2] = { 1, 1 };
    dpar_buffer *a = t_buf(rt, 0, DPAR_F32, 2, sa, NULL), *b = t_buf(rt, 0, DPAR_F32, 2, sb, NULL);
    dpar_buffer *c = t_buf(rt, 0, DPAR_F32, 2, sc, NULL);
    T_OK(dpar_fill(a, 1.0f));
    T_OK(dpar_fill(b, 1.0f));
    T_OK(dpar_fill(c, 5.0f));
    if (capped)
        T_ERR(dpar_matmul(c, a, b, false, false, 1.0f, 0.0f), DPAR_ERR_SHAPE, "matmul of [1, 70000] and [70000, 1]",
              "k 70000", "llvmpipe ends shader loops after 65,535 iterations");
    else
        T_OK(dpar_matmul(c, a, b, false, false, 1.0f, 0.0f));
    t_read(c, &r);
    assert_true(r == (capped ? 5.0f : 70000.0f));
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
    dpar_runtime_destroy(rt);
}

/* ---- workgroup counts past the device's (maxComputeWorkGroupCount) ---- */
/* Runs a graph of y = mul_scalar(0.75, x) into y, or (y NULL) of t = dot(x, x) into *t, on rt (one device)
   over x of n elements (host). The error of the run or of the read. */
static dpar_status graph_scalars(dpar_runtime *rt, int64_t n, const float *x, float *y, float *t) {
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    const int64_t one[1] = { 1 };
    dpar_value vx = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 1, { n }, { NULL } });
    dpar_value vt = y ? dpar_g_mul_scalar(g, dpar_g_const(g, DPAR_F32, 1, one, 0.75f), vx) : dpar_g_dot(g, vx, vx);
    T_OK(dpar_graph_keep(g, vt));
    dpar_graph_feed f = { vx, x, NULL };
    dpar_status s = dpar_graph_run(g, &f, 1, NULL);
    if (!s) s = dpar_graph_get(g, vt, y ? (void *)y : (void *)t);
    dpar_graph_destroy(g);
    dpar_mesh_destroy(m);
    return s;
}
/* A graph's mul_scalar over 8,388,608 elements is a [1, 1] @ [1, 8388608] matmul: on a CPU device the
   direct matmul's 65,536 workgroups of column blocks, past llvmpipe's 65,535 (refused before, naming the
   shader), now two dispatches; equal to the CPU backend's bit for bit. Where a refusal remains (a dot's
   K past llvmpipe's loop cap) it names the graph's op and the matmul it runs as. */
static void test_workgroups_graph_mul_scalar(void **state) {
    (void)state;
    const int64_t n = 8388608;
    float *x = (float *)malloc(sizeof(float) * (size_t)n), *y = (float *)malloc(sizeof(float) * (size_t)n);
    float *want = (float *)malloc(sizeof(float) * (size_t)n), t = 0;
    assert_true(x && y && want);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7919) % 1999) / 8.0f - 100.0f;
    dpar_runtime *cpu = t_runtime(DPAR_BACKEND_CPU, 1), *rt = vk_runtime(1, 0);
    T_OK(graph_scalars(cpu, n, x, want, NULL));
    T_OK(graph_scalars(rt, n, x, y, NULL));
    for (int64_t i = 0; i < n; i++)
        if (t_f2u(y[i]) != t_f2u(want[i]))
            fail_msg("y[%lld] = %.9g (cpu %.9g, x %.9g)", (long long)i, y[i], want[i], x[i]);
    if (loop_capped(rt))
        T_ERR(graph_scalars(rt, 70000, x, NULL, &t), DPAR_ERR_SHAPE, "node 2 (dot)", "k 70000",
              "(dot runs as the matmul [1, 70000] @ [70000, 1])");
    free(x), free(y), free(want);
    dpar_runtime_destroy(rt);
    dpar_runtime_destroy(cpu);
}
/* Products with more row blocks than a device's workgroup count allows (M = 65,535 * 32 + 33: 65,537
   blocks of 32 rows, on x of the direct matmul, on y of the tiled one where GPUs allow 65,535): dpar_matmul
   of A [M, 1] by B^T ([2, 1] transposed) and dpar_matmul_batched of A [1, M, 1] by a shared [1, 1], both with
   beta 1, against the CPU backend bit for bit (small integers: every result exact). Both were
   refused before. */
static void test_workgroups_tall_matmul(void **state) {
    (void)state;
    const int64_t M = 65535 * 32 + 33, sa[2] = { M, 1 }, sb[2] = { 2, 1 }, sc[2] = { M, 2 };
    const int64_t sa3[3] = { 1, M, 1 }, sb3[2] = { 1, 1 }, sc3[3] = { 1, M, 1 };
    float *a = (float *)malloc(sizeof(float) * (size_t)(2 * M)), *c0 = (float *)malloc(sizeof(float) * (size_t)(2 * M));
    float *c = (float *)malloc(sizeof(float) * (size_t)(2 * M)),
          *want = (float *)malloc(sizeof(float) * (size_t)(2 * M));
    const float b[2] = { 3.0f, -2.0f };
    assert_true(a && c0 && c && want);
    for (int64_t i = 0; i < 2 * M; i++) a[i] = (float)(i % 7) - 3.0f, c0[i] = (float)(i % 5);
    dpar_runtime *rts[2] = { t_runtime(DPAR_BACKEND_CPU, 1), vk_runtime(1, 0) };
    for (int batched = 0; batched < 2; batched++) {
        for (int r = 0; r < 2; r++) {
            dpar_runtime *rt = rts[r];
            dpar_buffer *ba = batched ? t_buf(rt, 0, DPAR_F32, 3, sa3, a) : t_buf(rt, 0, DPAR_F32, 2, sa, a);
            dpar_buffer *bb = t_buf(rt, 0, DPAR_F32, 2, batched ? sb3 : sb, b);
            dpar_buffer *bc = batched ? t_buf(rt, 0, DPAR_F32, 3, sc3, c0) : t_buf(rt, 0, DPAR_F32, 2, sc, c0);
            T_OK(batched ? dpar_matmul_batched(bc, ba, bb, false, false, 1.0f, 1.0f)
                         : dpar_matmul(bc, ba, bb, false, true, 1.0f, 1.0f));
            t_read(bc, r ? c : want);
            dpar_buffer_destroy(ba), dpar_buffer_destroy(bb), dpar_buffer_destroy(bc);
        }
        for (int64_t i = 0; i < (batched ? M : 2 * M); i++)
            if (t_f2u(c[i]) != t_f2u(want[i]))
                fail_msg("%s: C element %lld = %.9g (cpu %.9g)", batched ? "matmul_batched" : "matmul", (long long)i,
                         c[i], want[i]);
    }
    free(a), free(c0), free(c), free(want);
    dpar_runtime_destroy(rts[1]);
    dpar_runtime_destroy(rts[0]);
}

/* dpar_sgd_step's parameters two an op on Vulkan (sgd_pairs, sgd_pair.comp): after two steps every parameter
   and momentum buffer bit for bit what its own dpar_sgd_update (sgd.comp) gives, with and without momentum
   (nesterov, weight decay), and one op fewer a pair: the digits step's four parameters, workgroup boundaries
   of the element-wise shaders (4,096 items a workgroup), an odd count (the last alone), uneven pairs (the
   larger's workgroups: 1 and 1,048,577), empty parameters (alone). */
static void test_sgd_pairs(void **state) {
    (void)state;
    enum { MAXP = 5 };
    static const int64_t sets[][MAXP] = { { 8192, 128, 1280, 10, -1 }, { 4096, 4097, 1, -1, -1 },
                                          { 1, 1048577, -1, -1, -1 },  { 0, 5, 7, -1, -1 },
                                          { 3, 0, 5, 0, 0 },           { 4095, 17, 33, 1, 2 } };
    static const dpar_sgd_desc hps[] = {
        { .learning_rate = 0.1f, .momentum = 0.9f },
        { .learning_rate = 0.05f, .weight_decay = 0.01f },
        { .learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-3f }
    };
    dpar_runtime *rt = vk_runtime(1, 0);
    for (size_t t = 0; t < sizeof sets / sizeof sets[0]; t++)
        for (size_t h = 0; h < sizeof hps / sizeof hps[0]; h++) {
            const dpar_sgd_desc *d = &hps[h];
            int n = 0, pairs = 0;
            dpar_buffer *p[2][MAXP], *g[2][MAXP], *m[2][MAXP];
            while (n < MAXP && sets[t][n] >= 0) n++;
            for (int i = 0; i < n; i++) {
                int64_t c = sets[t][i];
                float *x = (float *)malloc(sizeof(float) * (size_t)(c + 1));
                assert_non_null(x);
                for (int r = 0; r < 2; r++) {
                    for (int64_t e = 0; e < c; e++) x[e] = (float)((e * 7 + i) % 13) * 0.125f - 0.75f;
                    p[r][i] = t_buf1(rt, DPAR_F32, c, x);
                    for (int64_t e = 0; e < c; e++) x[e] = (float)((e * 5 + 3 * i) % 11) * 0.0625f - 0.3f;
                    g[r][i] = t_buf1(rt, DPAR_F32, c, x);
                    m[r][i] = t_buf1(rt, DPAR_F32, c, NULL);
                    T_OK(dpar_fill(m[r][i], 0.0f));
                }
                free(x);
            }
            for (int i = 0; i + 1 < n; i++)
                if (sets[t][i] > 0 && sets[t][i + 1] > 0) pairs++, i++;
            uint64_t ops[2];
            for (int step = 0; step < 2; step++) {
                dpar_device_stats ds;
                dpar_runtime_stats_reset(rt);
                T_OK(dpar_sgd_step(NULL, d, p[0], g[0], m[0], n));
                T_OK(dpar_runtime_device_stats(rt, 0, &ds));
                ops[0] = ds.ops;
                dpar_runtime_stats_reset(rt);
                for (int i = 0; i < n; i++) T_OK(dpar_sgd_update(d, p[1][i], g[1][i], m[1][i], 1.0f));
                T_OK(dpar_runtime_device_stats(rt, 0, &ds));
                ops[1] = ds.ops;
                if (ops[0] + (uint64_t)pairs != ops[1])
                    fail_msg("set %zu: %llu ops a step, %llu updates alone (want %d fewer)", t,
                             (unsigned long long)ops[0], (unsigned long long)ops[1], pairs);
            }
            for (int i = 0; i < n; i++) {
                size_t c = (size_t)sets[t][i];
                float *a = (float *)malloc(sizeof(float) * (4 * c + 1)), *b = a + c, *am = b + c, *bm = am + c;
                assert_non_null(a);
                t_read(p[0][i], a), t_read(p[1][i], b), t_read(m[0][i], am), t_read(m[1][i], bm);
                for (size_t e = 0; e < c; e++)
                    if (t_f2u(a[e]) != t_f2u(b[e]) || t_f2u(am[e]) != t_f2u(bm[e]))
                        fail_msg("set %zu hp %zu param %d [%zu]: %.9g, momentum %.9g in the step; %.9g, %.9g alone", t,
                                 h, i, e, (double)a[e], (double)am[e], (double)b[e], (double)bm[e]);
                free(a);
                for (int r = 0; r < 2; r++)
                    dpar_buffer_destroy(p[r][i]), dpar_buffer_destroy(g[r][i]), dpar_buffer_destroy(m[r][i]);
            }
        }
    dpar_runtime_destroy(rt);
}
/* No pair where the two updates share a buffer (the same parameter twice: its updates must follow each other)
   or sit on two devices: an op each, the results those of the updates in turn. */
static void test_sgd_pairs_refused(void **state) {
    (void)state;
    enum { C = 4097 };
    static float x[C];
    for (int e = 0; e < C; e++) x[e] = (float)(e % 9) * 0.25f - 1.0f;
    dpar_runtime *rt = vk_runtime(2, 0);
    const dpar_sgd_desc d = { .learning_rate = 0.1f, .momentum = 0.9f };
    for (int two_devices = 0; two_devices < 2; two_devices++) {
        dpar_buffer *p[2][2], *g[2][2], *m[2][2];
        float a[C], b[C];
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 2; i++) {
                int dev = two_devices ? i : 0;
                int64_t c = C;
                p[r][i] = two_devices || i == 0 ? t_buf(rt, dev, DPAR_F32, 1, &c, x) : p[r][0];
                g[r][i] = t_buf(rt, dev, DPAR_F32, 1, &c, x), m[r][i] = t_buf(rt, dev, DPAR_F32, 1, &c, NULL);
                T_OK(dpar_fill(m[r][i], 0.5f));
            }
        dpar_device_stats ds;
        dpar_runtime_stats_reset(rt);
        T_OK(dpar_sgd_step(NULL, &d, p[0], g[0], m[0], 2));
        uint64_t ops = 0;
        for (int dev = 0; dev < 2; dev++) {
            T_OK(dpar_runtime_device_stats(rt, dev, &ds));
            ops += ds.ops;
        }
        if (ops != 2) fail_msg("two devices %d: %llu ops (want 2: no pair)", two_devices, (unsigned long long)ops);
        for (int i = 0; i < 2; i++) T_OK(dpar_sgd_update(&d, p[1][i], g[1][i], m[1][i], 1.0f));
        for (int i = 0; i < 2; i++) {
            t_read(p[0][i], a), t_read(p[1][i], b);
            for (int e = 0; e < C; e++)
                if (t_f2u(a[e]) != t_f2u(b[e]))
                    fail_msg("two devices %d param %d [%d]: %.9g in the step, %.9g in turn", two_devices, i, e,
                             (double)a[e], (double)b[e]);
        }
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 2; i++) {
                if (two_devices || i == 0) dpar_buffer_destroy(p[r][i]);
                dpar_buffer_destroy(g[r][i]), dpar_buffer_destroy(m[r][i]);
            }
    }
    dpar_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_info),
        cmocka_unit_test(test_psum_noncoherent),
        cmocka_unit_test(test_psum_noncoherent_staged),
        cmocka_unit_test(test_scale_psum_1000),
        cmocka_unit_test(test_scale_psum_noncoherent),
        cmocka_unit_test(test_scale_psum_staged),
        cmocka_unit_test(test_allreduce_large_mapped),
        cmocka_unit_test(test_allreduce_large_pipelined),
        cmocka_unit_test(test_two_physical_devices),
        cmocka_unit_test(test_two_physical_devices_staged),
        cmocka_unit_test(test_choose_physical_device),
        cmocka_unit_test(test_ops_known_values),
        cmocka_unit_test(test_many_ops_deterministic),
        cmocka_unit_test(test_missing_loader),
        cmocka_unit_test(test_missing_icd),
        cmocka_unit_test(test_bad_physical_device),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_zero_size_and_bad_args),
        cmocka_unit_test(test_adopt_engine_device),
        cmocka_unit_test(test_adopt_bad_inputs),
        cmocka_unit_test(test_export_contract),
        cmocka_unit_test(test_export_destroy_repeated),
        cmocka_unit_test(test_buffer_range),
        cmocka_unit_test(test_loop_cap_one_group),
        cmocka_unit_test(test_loop_cap_softmax_rows),
        cmocka_unit_test(test_loop_cap_column_sums),
        cmocka_unit_test(test_loop_cap_norm_rows),
        cmocka_unit_test(test_loop_cap_conv_kernel_grad),
        cmocka_unit_test(test_loop_cap_refused),
        cmocka_unit_test(test_loop_cap_xent_wide),
        cmocka_unit_test(test_loop_cap_matmul_blocks),
        cmocka_unit_test(test_fuller_workgroups),
        cmocka_unit_test(test_workgroups_graph_mul_scalar),
        cmocka_unit_test(test_workgroups_tall_matmul),
        cmocka_unit_test(test_sgd_pairs),
        cmocka_unit_test(test_sgd_pairs_refused),
    };
    return cmocka_run_group_tests_name("vulkan", tests, NULL, NULL);
}
