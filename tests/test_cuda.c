/* CUDA backend tests: every op and every collective on small exact inputs,
   on 1, 2 and 4 devices (virtual devices on one GPU when the machine has
   fewer GPUs; NCCL between GPUs otherwise).

   Without a GPU (or in a build without DPAR_CUDA) every test prints
   "SKIPPED: <reason>" and is reported skipped by cmocka; with
   DPAR_REQUIRE_BACKENDS containing "cuda" a missing backend fails instead.

   DPAR_CUDA_TEST_BACKEND=cpu runs the same tests on the CPU backend: a check
   of the expectations themselves on machines without a GPU. The backend-
   parity test (tests/test_parity.c) compares CUDA against the CPU backend on
   random data; this file checks exact answers. */
#include "testutil.h"

static dpar_backend_kind backend(void) {
    const char *e = getenv("DPAR_CUDA_TEST_BACKEND");
    dpar_backend_kind k;
    if (e && dpar_backend_from_name(e, &k) == DPAR_OK && k == DPAR_BACKEND_CPU) return DPAR_BACKEND_CPU;
    return DPAR_BACKEND_CUDA;
}
static int on_cpu(void) {
    return backend() == DPAR_BACKEND_CPU;
}

static dpar_runtime *rt_or_skip(int n) {
    return t_runtime_or_skip(backend(), n);
}

static dpar_buffer *buf(dpar_runtime *rt, int dev, dpar_dtype t, int ndim, int64_t d0, int64_t d1) {
    int64_t shape[2] = { d0, d1 };
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(rt, dev, t, ndim, shape, &b));
    return b;
}
static dpar_buffer *fbuf(dpar_runtime *rt, int ndim, int64_t d0, int64_t d1, const float *v) {
    dpar_buffer *b = buf(rt, 0, DPAR_F32, ndim, d0, d1);
    if (v) T_OK(dpar_buffer_write(b, 0, v, dpar_buffer_nbytes(b)));
    return b;
}
static void fread_(const dpar_buffer *b, float *out) {
    T_OK(dpar_buffer_read(b, 0, out, dpar_buffer_nbytes(b)));
}
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* exact float comparison (NaN equals NaN) */
static void expect_f(const float *got, const float *want, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        int ok = (got[i] != got[i] && want[i] != want[i]) || got[i] == want[i];
        if (!ok) fail_msg("%s[%d]: got %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
    }
}
static void expect_near(const float *got, const double *want, int n, double rel, const char *what) {
    for (int i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        if (w != w) {
            if (g == g) fail_msg("%s[%d]: got %.9g, want NaN", what, i, g);
            continue;
        }
        if (fabs(g - w) > rel * (fabs(w) + 1e-30) + 1e-7) fail_msg("%s[%d]: got %.9g, want %.9g", what, i, g, w);
    }
}

/* ---------------------------------------------------------------------------
   Devices and memory
   ------------------------------------------------------------------------ */
static void test_device_info(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(2);
    assert_int_equal(dpar_runtime_device_count(rt), 2);
    assert_int_equal(dpar_runtime_backend(rt), backend());
    for (int d = 0; d < 2; d++) {
        dpar_device_info info;
        T_OK(dpar_runtime_device_info(rt, d, &info));
        assert_int_equal(info.index, d);
        assert_true(info.name[0] != 0);
        assert_true(info.memory_bytes > 0);
        if (!on_cpu()) {
            static const unsigned char zero[16];
            assert_string_equal(info.vendor, "NVIDIA");
            assert_int_equal(info.backend, DPAR_BACKEND_CUDA);
            assert_memory_not_equal(info.uuid, zero, 16); /* cuDeviceGetUuid */
        }
        printf("device %d: %s (%s, %s), %llu MiB, physical %d\n", d, info.name, info.vendor, info.driver,
               (unsigned long long)(info.memory_bytes >> 20), info.physical_index);
        /* NVML's readings (the driver ships NVML; the mock gives 37%, 48 C, 215.5 W) */
        dpar_device_stats st;
        T_OK(dpar_runtime_device_stats(rt, d, &st));
        printf("device %d: gpu %d%%, %d C, %.1f W\n", d, st.gpu_util_pct, st.temperature_c, st.power_w);
        if (on_cpu()) {
            assert_int_equal(st.gpu_util_pct, -1);
        } else {
            assert_true(st.gpu_util_pct >= 0 && st.gpu_util_pct <= 100);
            assert_true(st.temperature_c > 0 && st.temperature_c < 130);
            assert_true(st.power_w > 0 && st.power_w < 5000);
        }
    }
    dpar_runtime_destroy(rt);
}

static void test_too_many_virtual_devices(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(1);
    dpar_runtime_destroy(rt);
    if (on_cpu()) {
        printf("SKIPPED: CUDA-specific limit\n");
        skip();
    }
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_CUDA };
    d.num_devices = 200; /* > 64 virtual devices on one GPU (unless 200 GPUs) */
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_DEVICE_COUNT, "200", "virtual");
}

/* .cuda.physical_device is 1-based, so GPU 0 alone can be chosen (1), and the last GPU
   (its count); the devices are then virtual ones on that GPU. 0 keeps every GPU. */
static void test_choose_gpu(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(1);
    dpar_runtime_destroy(rt);
    if (on_cpu()) {
        printf("SKIPPED: CUDA-specific setting\n");
        skip();
    }
    dpar_runtime_desc d = { .backend = DPAR_BACKEND_CUDA, .timeout_ms = 20000 };
    T_OK(dpar_runtime_create(&d, &rt));
    int ngpu = dpar_runtime_device_count(rt);
    dpar_runtime_destroy(rt);
    int picks[2] = { 1, ngpu };
    for (int k = 0; k < 2; k++) {
        d.num_devices = 2;
        d.cuda.physical_device = picks[k];
        T_OK(dpar_runtime_create(&d, &rt));
        assert_int_equal(dpar_runtime_device_count(rt), 2);
        for (int i = 0; i < 2; i++) {
            dpar_device_info info;
            T_OK(dpar_runtime_device_info(rt, i, &info));
            printf("physical_device %d: device %d is %s on GPU %d\n", picks[k], i, info.name, info.physical_index);
            assert_int_equal(info.physical_index, picks[k] - 1);
        }
        dpar_runtime_destroy(rt);
    }
    d.cuda.physical_device = ngpu + 1;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_DEVICE_COUNT, "physical_device");
    d.cuda.physical_device = -1;
    T_ERR(dpar_runtime_create(&d, &rt), DPAR_ERR_INVALID_ARGUMENT, "negative");
}

static void test_memory(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(2);
    for (int dev = 0; dev < 2; dev++) {
        dpar_buffer *b = buf(rt, dev, DPAR_F32, 1, 1000, 0);
        float h[1000], z[1000];
        fread_(b, h);
        memset(z, 0, sizeof z);
        assert_memory_equal(h, z, sizeof h); /* zeroed */
        for (int i = 0; i < 1000; i++) h[i] = (float)(i * 3 + dev);
        T_OK(dpar_buffer_write(b, 0, h, sizeof h));
        float part[10] = { -1, -2, -3, -4, -5, -6, -7, -8, -9, -10 };
        T_OK(dpar_buffer_write(b, 40, part, sizeof part)); /* elements 10..19 */
        float back[1000];
        fread_(b, back);
        for (int i = 0; i < 1000; i++) {
            float want = i >= 10 && i < 20 ? part[i - 10] : (float)(i * 3 + dev);
            if (back[i] != want) fail_msg("device %d element %d: %g != %g", dev, i, (double)back[i], (double)want);
        }
        float mid[3];
        T_OK(dpar_buffer_read(b, 4 * 998, mid, 8));
        assert_true(mid[0] == (float)(998 * 3 + dev) && mid[1] == (float)(999 * 3 + dev));
        T_OK(dpar_runtime_device_sync(rt, dev));
        dpar_buffer_destroy(b);
        dpar_buffer *e = buf(rt, dev, DPAR_F32, 1, 0, 0); /* zero-size */
        assert_int_equal(dpar_buffer_nbytes(e), 0);
        T_OK(dpar_buffer_read(e, 0, mid, 0));
        dpar_buffer_destroy(e);
    }
    dpar_runtime_destroy(rt);
}

/* ---------------------------------------------------------------------------
   Ops
   ------------------------------------------------------------------------ */
static void transpose(const float *a, int r, int c, float *t) {
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) t[j * r + i] = a[i * c + j];
}

static void matmul_case(dpar_runtime *rt, dpar_dtype t) {
    /* A [2,3] @ B [3,2] = [[22,28],[49,64]] */
    const float A[6] = { 1, 2, 3, 4, 5, 6 }, B[6] = { 1, 2, 3, 4, 5, 6 };
    float At[6], Bt[6];
    transpose(A, 2, 3, At);
    transpose(B, 3, 2, Bt);
    const float AB[4] = { 22, 28, 49, 64 };
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            dpar_buffer *a = buf(rt, 0, t, 2, ta ? 3 : 2, ta ? 2 : 3);
            dpar_buffer *b = buf(rt, 0, t, 2, tb ? 2 : 3, tb ? 3 : 2);
            const float *ah = ta ? At : A, *bh = tb ? Bt : B;
            if (t == DPAR_F32) {
                T_OK(dpar_buffer_write(a, 0, ah, 24));
                T_OK(dpar_buffer_write(b, 0, bh, 24));
            } else {
                uint16_t x[6], y[6];
                for (int i = 0; i < 6; i++) {
                    x[i] = t == DPAR_F16 ? dpar_f32_to_f16(ah[i]) : dpar_f32_to_bf16(ah[i]);
                    y[i] = t == DPAR_F16 ? dpar_f32_to_f16(bh[i]) : dpar_f32_to_bf16(bh[i]);
                }
                T_OK(dpar_buffer_write(a, 0, x, 12));
                T_OK(dpar_buffer_write(b, 0, y, 12));
            }
            /* beta = 0 ignores C, even NaN */
            const float nan4[4] = { NAN, NAN, NAN, NAN };
            dpar_buffer *c = fbuf(rt, 2, 2, 2, nan4);
            float got[4];
            T_OK(dpar_matmul(c, a, b, ta, tb, 1.0f, 0.0f));
            fread_(c, got);
            expect_f(got, AB, 4, "matmul beta=0");
            /* C = 2 AB + 0.5 C */
            const float ones[4] = { 1, 1, 1, 1 };
            T_OK(dpar_buffer_write(c, 0, ones, 16));
            T_OK(dpar_matmul(c, a, b, ta, tb, 2.0f, 0.5f));
            fread_(c, got);
            const float want[4] = { 44.5f, 56.5f, 98.5f, 128.5f };
            expect_f(got, want, 4, "matmul alpha=2 beta=0.5");
            dpar_buffer_destroy(a);
            dpar_buffer_destroy(b);
            dpar_buffer_destroy(c);
        }
}

static void test_matmul(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(1);
    matmul_case(rt, DPAR_F32);
    if (!on_cpu()) {
        matmul_case(rt, DPAR_F16);
        matmul_case(rt, DPAR_BF16);
    }
    /* K = 0: C = beta C */
    dpar_buffer *a = buf(rt, 0, DPAR_F32, 2, 2, 0), *b = buf(rt, 0, DPAR_F32, 2, 0, 2);
    const float c0[4] = { 1, 2, 3, 4 };
    dpar_buffer *c = fbuf(rt, 2, 2, 2, c0);
    float got[4];
    T_OK(dpar_matmul(c, a, b, false, false, 1.0f, 0.0f));
    fread_(c, got);
    const float zeros[4] = { 0, 0, 0, 0 };
    expect_f(got, zeros, 4, "matmul K=0");
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
    /* a larger product against a host loop (exact: small integers) */
    enum { M = 67, K = 129, N = 33 };
    static float ha[M * K], hb[K * N], hc[M * N], ref[M * N];
    for (int i = 0; i < M * K; i++) ha[i] = (float)((i * 7) % 11 - 5);
    for (int i = 0; i < K * N; i++) hb[i] = (float)((i * 5) % 13 - 6);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += ha[i * K + k] * hb[k * N + j];
            ref[i * N + j] = s;
        }
    a = fbuf(rt, 2, M, K, ha);
    b = fbuf(rt, 2, K, N, hb);
    c = fbuf(rt, 2, M, N, NULL);
    T_OK(dpar_matmul(c, a, b, false, false, 1.0f, 0.0f));
    fread_(c, hc);
    expect_f(hc, ref, M * N, "matmul 67x129x33");
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
    dpar_runtime_destroy(rt);
}

static void test_elementwise(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(1);
    float got[8];
    /* bias_add / bias_grad */
    const float y0[6] = { 1, 2, 3, 4, 5, 6 }, bias[3] = { 10, 20, 30 };
    dpar_buffer *y = fbuf(rt, 2, 2, 3, y0), *b = fbuf(rt, 1, 3, 0, bias);
    T_OK(dpar_bias_add(y, b));
    fread_(y, got);
    const float yb[6] = { 11, 22, 33, 14, 25, 36 };
    expect_f(got, yb, 6, "bias_add");
    const float nan3[3] = { NAN, NAN, NAN };
    T_OK(dpar_buffer_write(b, 0, nan3, 12));
    T_OK(dpar_bias_grad(b, y, 0.0f)); /* beta 0 ignores NaN */
    fread_(b, got);
    const float bg[3] = { 25, 47, 69 };
    expect_f(got, bg, 3, "bias_grad beta=0");
    T_OK(dpar_bias_grad(b, y, 1.0f));
    fread_(b, got);
    const float bg2[3] = { 50, 94, 138 };
    expect_f(got, bg2, 3, "bias_grad beta=1");
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(b);

    /* relu / relu_backward (NaN propagates, -0 -> 0) */
    const float x[6] = { -1, 0, 2, NAN, -0.0f, 3.5f };
    dpar_buffer *xb = fbuf(rt, 1, 6, 0, x), *r = fbuf(rt, 1, 6, 0, NULL);
    T_OK(dpar_relu(r, xb));
    fread_(r, got);
    const float rw[6] = { 0, 0, 2, NAN, 0, 3.5f };
    expect_f(got, rw, 6, "relu");
    assert_true(bits(got[4]) == 0);
    const float dy[6] = { 1, 2, 3, 4, 5, 6 };
    dpar_buffer *dyb = fbuf(rt, 1, 6, 0, dy);
    T_OK(dpar_relu_backward(r, dyb, xb));
    fread_(r, got);
    const float rb[6] = { 0, 0, 3, 0, 0, 6 };
    expect_f(got, rb, 6, "relu_backward");
    /* axpy / scale (in place on 7 elements: vector body + tail) */
    const float a7[7] = { 1, 2, 3, 4, 5, 6, 7 }, b7[7] = { 1, 1, 1, 1, 1, 1, 1 };
    dpar_buffer *ya = fbuf(rt, 1, 7, 0, b7), *xa = fbuf(rt, 1, 7, 0, a7);
    T_OK(dpar_axpy(ya, 0.5f, xa));
    fread_(ya, got);
    const float ax[7] = { 1.5f, 2, 2.5f, 3, 3.5f, 4, 4.5f };
    expect_f(got, ax, 7, "axpy");
    T_OK(dpar_scale(ya, -2.0f));
    fread_(ya, got);
    const float sc[7] = { -3, -4, -5, -6, -7, -8, -9 };
    expect_f(got, sc, 7, "scale");
    /* copy */
    T_OK(dpar_copy(xa, ya));
    fread_(xa, got);
    expect_f(got, sc, 7, "copy");
    /* sum / sum of squares */
    dpar_buffer *s1 = fbuf(rt, 1, 1, 0, NULL);
    T_OK(dpar_sum(s1, xa));
    fread_(s1, got);
    assert_true(got[0] == -42.0f);
    T_OK(dpar_sum_squares(s1, xa));
    fread_(s1, got);
    assert_true(got[0] == 280.0f);
    /* a long sum: 1..100000 = 5000050000 (rounded once to f32) */
    {
        enum { L = 100000 };
        float *h = (float *)malloc(L * 4);
        for (int i = 0; i < L; i++) h[i] = (float)(i + 1);
        dpar_buffer *lb = fbuf(rt, 1, L, 0, h);
        T_OK(dpar_sum(s1, lb));
        fread_(s1, got);
        assert_true(got[0] == (float)5000050000.0);
        dpar_buffer_destroy(lb);
        free(h);
    }
    dpar_buffer_destroy(xb);
    dpar_buffer_destroy(r);
    dpar_buffer_destroy(dyb);
    dpar_buffer_destroy(ya);
    dpar_buffer_destroy(xa);
    dpar_buffer_destroy(s1);
    dpar_runtime_destroy(rt);
}

static void test_fill_cast(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(1);
    dpar_dtype ts[4] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };
    /* fill each dtype with -2.5 */
    for (int t = 0; t < 4; t++) {
        dpar_buffer *b = buf(rt, 0, ts[t], 1, 5, 0);
        T_OK(dpar_fill(b, -2.5f));
        unsigned char h[20];
        T_OK(dpar_buffer_read(b, 0, h, dpar_buffer_nbytes(b)));
        for (int i = 0; i < 5; i++) {
            if (ts[t] == DPAR_F32) {
                float v;
                memcpy(&v, h + 4 * i, 4);
                assert_true(v == -2.5f);
            } else if (ts[t] == DPAR_I32) {
                int32_t v;
                memcpy(&v, h + 4 * i, 4);
                assert_int_equal(v, -2);
            } else {
                uint16_t v;
                memcpy(&v, h + 2 * i, 2);
                assert_int_equal(v, ts[t] == DPAR_F16 ? dpar_f32_to_f16(-2.5f) : dpar_f32_to_bf16(-2.5f));
            }
        }
        dpar_buffer_destroy(b);
    }
    /* casts between every pair, on values exact in every dtype, and the
       special cases of float -> i32 and rounding to f16 / bf16 */
    const float v[6] = { 0, 1, -2, 3.5f, 256, -1024 };
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++) {
            dpar_buffer *src = buf(rt, 0, ts[s], 1, 6, 0), *dst = buf(rt, 0, ts[d], 1, 6, 0);
            dpar_buffer *f = fbuf(rt, 1, 6, 0, v);
            T_OK(dpar_cast(src, f));
            T_OK(dpar_cast(dst, src));
            T_OK(dpar_cast(f, dst));
            float got[6];
            fread_(f, got);
            for (int i = 0; i < 6; i++) {
                float want = v[i];
                if (ts[s] == DPAR_I32 || ts[d] == DPAR_I32) want = (float)(int32_t)v[i];
                if (got[i] != want)
                    fail_msg("cast %s -> %s, element %d: %g != %g", dpar_dtype_name(ts[s]), dpar_dtype_name(ts[d]), i,
                             (double)got[i], (double)want);
            }
            dpar_buffer_destroy(src);
            dpar_buffer_destroy(dst);
            dpar_buffer_destroy(f);
        }
    const float sp[6] = { 2.7f, -2.7f, NAN, 1e10f, -1e10f, 1.0009765625f /* 1 + 2^-10 */ };
    dpar_buffer *f = fbuf(rt, 1, 6, 0, sp), *i32 = buf(rt, 0, DPAR_I32, 1, 6, 0);
    dpar_buffer *h16 = buf(rt, 0, DPAR_F16, 1, 6, 0), *b16 = buf(rt, 0, DPAR_BF16, 1, 6, 0);
    T_OK(dpar_cast(i32, f));
    T_OK(dpar_cast(h16, f));
    T_OK(dpar_cast(b16, f));
    int32_t gi[6];
    uint16_t gh[6], gb[6];
    T_OK(dpar_buffer_read(i32, 0, gi, 24));
    T_OK(dpar_buffer_read(h16, 0, gh, 12));
    T_OK(dpar_buffer_read(b16, 0, gb, 12));
    const int32_t wi[6] = { 2, -2, 0, INT32_MAX, INT32_MIN, 1 };
    for (int i = 0; i < 6; i++) {
        assert_int_equal(gi[i], wi[i]);
        assert_int_equal(gh[i], dpar_f32_to_f16(sp[i])); /* same bits as the host conversion, NaN included */
        assert_int_equal(gb[i], dpar_f32_to_bf16(sp[i]));
    }
    dpar_buffer_destroy(f);
    dpar_buffer_destroy(i32);
    dpar_buffer_destroy(h16);
    dpar_buffer_destroy(b16);
    dpar_runtime_destroy(rt);
}

static void test_losses(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(1);
    /* softmax cross-entropy: rows [1,2,3] label 2, [0,0,0] label 0, [5,-5,0] label 1 */
    const float z[9] = { 1, 2, 3, 0, 0, 0, 5, -5, 0 };
    const int32_t lab[3] = { 2, 0, 1 };
    double want_loss = 0, want_g[9];
    for (int r = 0; r < 3; r++) {
        double mx = z[r * 3], se = 0;
        for (int j = 1; j < 3; j++) mx = z[r * 3 + j] > mx ? z[r * 3 + j] : mx;
        for (int j = 0; j < 3; j++) se += exp(z[r * 3 + j] - mx);
        double lse = mx + log(se);
        want_loss += lse - z[r * 3 + lab[r]];
        for (int j = 0; j < 3; j++) want_g[r * 3 + j] = (exp(z[r * 3 + j] - lse) - (j == lab[r])) / 3.0;
    }
    want_loss /= 3.0;
    dpar_buffer *zb = fbuf(rt, 2, 3, 3, z), *g = fbuf(rt, 2, 3, 3, NULL), *loss = fbuf(rt, 1, 1, 0, NULL);
    dpar_buffer *lb = buf(rt, 0, DPAR_I32, 1, 3, 0);
    T_OK(dpar_buffer_write(lb, 0, lab, 12));
    T_OK(dpar_softmax_xent(loss, g, zb, lb));
    float gl, gg[9];
    fread_(loss, &gl);
    fread_(g, gg);
    expect_near(&gl, &want_loss, 1, 1e-6, "softmax_xent loss");
    expect_near(gg, want_g, 9, 1e-6, "softmax_xent dlogits");
    T_OK(dpar_softmax_xent(loss, NULL, zb, lb)); /* without gradient */
    fread_(loss, &gl);
    expect_near(&gl, &want_loss, 1, 1e-6, "softmax_xent loss (no grad)");
    const int32_t bad[3] = { 2, 3, 0 }; /* 3 is out of range: NaN rows, and an error at the next read */
    T_OK(dpar_buffer_write(lb, 0, bad, 12));
    T_OK(dpar_softmax_xent(loss, g, zb, lb));
    T_ERR(dpar_buffer_read(loss, 0, &gl, 4), DPAR_ERR_INVALID_ARGUMENT, "dpar_softmax_xent", "labels[1] = 3");
    fread_(loss, &gl);
    fread_(g, gg);
    assert_true(gl != gl);
    assert_true(gg[3] != gg[3] && gg[4] != gg[4] && gg[5] != gg[5] && gg[0] == gg[0]);
    /* mean squared error */
    const float p[4] = { 1, 2, 3, 4 }, t[4] = { 0, 2, 5, 4 };
    dpar_buffer *pb = fbuf(rt, 1, 4, 0, p), *tb = fbuf(rt, 1, 4, 0, t), *dp = fbuf(rt, 1, 4, 0, NULL);
    T_OK(dpar_mse(loss, dp, pb, tb));
    float gd[4];
    fread_(loss, &gl);
    fread_(dp, gd);
    assert_true(gl == 1.25f);
    const float wd[4] = { 0.5f, 0, -1, 0 };
    expect_f(gd, wd, 4, "mse dpred");
    dpar_buffer_destroy(zb);
    dpar_buffer_destroy(g);
    dpar_buffer_destroy(loss);
    dpar_buffer_destroy(lb);
    dpar_buffer_destroy(pb);
    dpar_buffer_destroy(tb);
    dpar_buffer_destroy(dp);
    dpar_runtime_destroy(rt);
}

/* The fused SGD step must be bit-identical to the formula evaluated in C
   (the kernels are compiled without FMA contraction). */
static void test_sgd(void **state) {
    (void)state;
    dpar_runtime *rt = rt_or_skip(1);
    enum { L = 11 };
    float p[L], g[L], v[L], hp[L], hv[L];
    for (int i = 0; i < L; i++) {
        p[i] = 0.1f * (float)i - 0.3f;
        g[i] = 0.37f * (float)(i % 4) - 0.5f;
        v[i] = 0;
    }
    for (int variant = 0; variant < 3; variant++) {
        float lr = 0.05f, mu = variant == 0 ? 0.0f : 0.9f, wd = 0.01f, clip = 0.75f;
        bool nesterov = variant == 2;
        memcpy(hp, p, sizeof p);
        memset(hv, 0, sizeof hv);
        dpar_buffer *pb = fbuf(rt, 1, L, 0, p), *gb = fbuf(rt, 1, L, 0, g), *vb = fbuf(rt, 1, L, 0, v);
        dpar_sgd_desc d = { .learning_rate = lr, .momentum = mu, .nesterov = nesterov, .weight_decay = wd };
        for (int step = 0; step < 3; step++) {
            T_OK(dpar_sgd_update(&d, pb, gb, mu != 0 ? vb : NULL, clip));
            for (int i = 0; i < L; i++) {
                volatile float gg = g[i] * clip + wd * hp[i];
                float u = gg;
                if (mu != 0) {
                    hv[i] = mu * hv[i] + gg;
                    u = nesterov ? gg + mu * hv[i] : hv[i];
                }
                hp[i] -= lr * u;
            }
        }
        float got[L];
        fread_(pb, got);
        for (int i = 0; i < L; i++)
            if (bits(got[i]) != bits(hp[i]))
                fail_msg("sgd variant %d element %d: %.9g != %.9g", variant, i, (double)got[i], (double)hp[i]);
        dpar_buffer_destroy(pb);
        dpar_buffer_destroy(gb);
        dpar_buffer_destroy(vb);
    }
    dpar_runtime_destroy(rt);
}

/* ---------------------------------------------------------------------------
   Collectives (through pmap over a 1-d mesh "data" of n devices)
   ------------------------------------------------------------------------ */
enum {
    C_PSUM,
    C_PMEAN,
    C_PMAX,
    C_PMIN,
    C_GATHER,
    C_GATHER_TILED1,
    C_SCATTER,
    C_SCATTER_DIM1,
    C_PERMUTE_RING,
    C_PERMUTE_ONE,
    C_A2A_00,
    C_A2A_10,
    C_BCAST,
    C_ASYNC_PSUM
};

typedef struct cjob {
    int kind;
    int n;
} cjob;

static dpar_status coll_fn(dpar_ctx *ctx, void *user) {
    const cjob *j = (const cjob *)user;
    dpar_buffer *in = dpar_ctx_arg(ctx, 0), *out = dpar_ctx_arg(ctx, 1);
    int n = j->n;
    switch (j->kind) {
    case C_PSUM: return dpar_psum(ctx, out, in, "data");
    case C_PMEAN: return dpar_pmean(ctx, out, in, "data");
    case C_PMAX: return dpar_pmax(ctx, out, in, "data");
    case C_PMIN: return dpar_pmin(ctx, out, in, "data");
    case C_GATHER: return dpar_all_gather(ctx, out, in, "data", 0, false);
    case C_GATHER_TILED1: return dpar_all_gather(ctx, out, in, "data", 1, true);
    case C_SCATTER: return dpar_psum_scatter(ctx, out, in, "data", 0, true);
    case C_SCATTER_DIM1: return dpar_psum_scatter(ctx, out, in, "data", 1, true);
    case C_PERMUTE_RING: {
        int pairs[2 * 8];
        for (int i = 0; i < n; i++) {
            pairs[2 * i] = i;
            pairs[2 * i + 1] = (i + 1) % n;
        }
        dpar_status s = dpar_copy(out, in);
        if (s) return s;
        return dpar_ppermute(ctx, out, out, "data", pairs, n); /* in place */
    }
    case C_PERMUTE_ONE: {
        int pairs[2] = { 0, n - 1 };
        return dpar_ppermute(ctx, out, in, "data", pairs, 1);
    }
    case C_A2A_00: return dpar_all_to_all(ctx, out, in, "data", 0, 0);
    case C_A2A_10: return dpar_all_to_all(ctx, out, in, "data", 1, 0);
    case C_BCAST: {
        dpar_status s = dpar_copy(out, in);
        if (s) return s;
        return dpar_pbroadcast(ctx, out, out, "data", n - 1); /* in place */
    }
    case C_ASYNC_PSUM: {
        dpar_request *r = NULL;
        dpar_status s = dpar_preduce_start(ctx, out, in, "data", DPAR_SUM, &r);
        if (s) return s;
        return dpar_wait(ctx, r);
    }
    }
    return DPAR_ERR_INVALID_ARGUMENT;
}

/* Runs kind on n devices; in: per-device shape (ind), host data stacked
   [n, ...] as f32 values converted to dtype; out per-device shape (outd). */
static void run_coll(dpar_runtime *rt, int n, int kind, dpar_dtype t, int in_nd, const int64_t *ind,
                     const float *in_vals, int out_nd, const int64_t *outd, float *out_vals) {
    dpar_mesh *m = t_mesh1(rt, n, "data");
    int64_t in_count = 1, out_count = 1;
    for (int i = 0; i < in_nd; i++) in_count *= ind[i];
    for (int i = 0; i < out_nd; i++) out_count *= outd[i];
    size_t es = dpar_dtype_size(t);
    unsigned char *hin = (unsigned char *)calloc((size_t)(n * in_count) + 1, es);
    unsigned char *hout = (unsigned char *)calloc((size_t)(n * out_count) + 1, es);
    for (int64_t i = 0; i < n * in_count; i++) {
        float v = in_vals[i];
        if (t == DPAR_F32)
            memcpy(hin + 4 * i, &v, 4);
        else if (t == DPAR_I32) {
            int32_t x = (int32_t)v;
            memcpy(hin + 4 * i, &x, 4);
        } else {
            uint16_t h = t == DPAR_F16 ? dpar_f32_to_f16(v) : dpar_f32_to_bf16(v);
            memcpy(hin + 2 * i, &h, 2);
        }
    }
    dpar_pmap_desc d = { 0 };
    cjob job = { kind, n };
    d.axis = "data";
    d.fn = coll_fn;
    d.user = &job;
    d.num_inputs = 1;
    d.num_outputs = 1;
    d.inputs[0].data = hin;
    d.inputs[0].dtype = t;
    d.inputs[0].ndim = in_nd + 1;
    d.inputs[0].shape[0] = n;
    for (int i = 0; i < in_nd; i++) d.inputs[0].shape[i + 1] = ind[i];
    d.inputs[0].in_axis = DPAR_MAPPED;
    d.outputs[0].data = hout;
    d.outputs[0].dtype = t;
    d.outputs[0].ndim = out_nd;
    for (int i = 0; i < out_nd; i++) d.outputs[0].shape[i] = outd[i];
    T_OK(dpar_pmap(m, &d));
    for (int64_t i = 0; i < n * out_count; i++) {
        if (t == DPAR_F32)
            memcpy(&out_vals[i], hout + 4 * i, 4);
        else if (t == DPAR_I32) {
            int32_t x;
            memcpy(&x, hout + 4 * i, 4);
            out_vals[i] = (float)x;
        } else {
            uint16_t h;
            memcpy(&h, hout + 2 * i, 2);
            out_vals[i] = t == DPAR_F16 ? dpar_f16_to_f32(h) : dpar_bf16_to_f32(h);
        }
    }
    free(hin);
    free(hout);
    dpar_mesh_destroy(m);
}

static const int NS[3] = { 1, 2, 4 };

static void test_reductions(void **state) {
    (void)state;
    dpar_dtype ts[4] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };
    for (int ni = 0; ni < 3; ni++) {
        int n = NS[ni];
        dpar_runtime *rt = rt_or_skip(n);
        for (int ti = 0; ti < 4; ti++) {
            dpar_dtype t = ts[ti];
            int64_t shp[1] = { 3 };
            float in[4 * 3], out[4 * 3], want[3];
            for (int d = 0; d < n; d++)
                for (int i = 0; i < 3; i++) in[d * 3 + i] = (float)(d * (i + 1)); /* [d, 2d, 3d] */
            run_coll(rt, n, C_PSUM, t, 1, shp, in, 1, shp, out);
            for (int i = 0; i < 3; i++) want[i] = (float)(n * (n - 1) / 2 * (i + 1)); /* n=4: [6,12,18] */
            for (int d = 0; d < n; d++) expect_f(out + 3 * d, want, 3, "psum");
            run_coll(rt, n, C_ASYNC_PSUM, t, 1, shp, in, 1, shp, out);
            for (int d = 0; d < n; d++) expect_f(out + 3 * d, want, 3, "async psum");
            /* pmean of [d+1, 2(d+1), 7] (i32 is refused in the core, before the backend) */
            for (int d = 0; d < n; d++) {
                in[d * 3] = (float)(d + 1);
                in[d * 3 + 1] = (float)(2 * d + 2);
                in[d * 3 + 2] = (float)(7 + d % 2);
            }
            if (t != DPAR_I32) {
                run_coll(rt, n, C_PMEAN, t, 1, shp, in, 1, shp, out);
                double s0 = 0, s1 = 0, s2 = 0;
                for (int d = 0; d < n; d++) {
                    s0 += in[d * 3];
                    s1 += in[d * 3 + 1];
                    s2 += in[d * 3 + 2];
                }
                want[0] = (float)(s0 / n);
                want[1] = (float)(s1 / n);
                want[2] = (float)(s2 / n);
                if (t == DPAR_F16 || t == DPAR_BF16)
                    for (int i = 0; i < 3; i++)
                        want[i] = t == DPAR_F16 ? dpar_f16_to_f32(dpar_f32_to_f16(want[i]))
                                                : dpar_bf16_to_f32(dpar_f32_to_bf16(want[i]));
                for (int d = 0; d < n; d++) expect_f(out + 3 * d, want, 3, "pmean");
            }
            /* pmax / pmin, NaN on the last device propagates (floats) */
            for (int d = 0; d < n; d++) {
                in[d * 3] = (float)d;
                in[d * 3 + 1] = (float)(-d);
                in[d * 3 + 2] = 3;
            }
            if (t != DPAR_I32) in[(n - 1) * 3 + 2] = NAN;
            run_coll(rt, n, C_PMAX, t, 1, shp, in, 1, shp, out);
            want[0] = (float)(n - 1);
            want[1] = 0;
            want[2] = t != DPAR_I32 ? NAN : 3;
            for (int d = 0; d < n; d++) expect_f(out + 3 * d, want, 3, "pmax");
            if (t != DPAR_I32) {
                in[(n - 1) * 3 + 2] = 3;
                in[2] = NAN;
            } /* NaN on the first device */
            run_coll(rt, n, C_PMIN, t, 1, shp, in, 1, shp, out);
            want[0] = 0;
            want[1] = (float)(-(n - 1));
            for (int d = 0; d < n; d++) expect_f(out + 3 * d, want, 3, "pmin");
        }
        /* zero-size */
        {
            int64_t z[1] = { 0 };
            float dummy[1];
            run_coll(rt, n, C_PSUM, DPAR_F32, 1, z, dummy, 1, z, dummy);
        }
        /* a longer f32 psum (not a multiple of n or 4) */
        {
            enum { L = 1001 };
            int64_t shp[1] = { L };
            float *in = (float *)malloc(sizeof(float) * 4 * L), *out = (float *)malloc(sizeof(float) * 4 * L);
            for (int d = 0; d < n; d++)
                for (int i = 0; i < L; i++) in[d * L + i] = (float)(i % 17 + d);
            run_coll(rt, n, C_PSUM, DPAR_F32, 1, shp, in, 1, shp, out);
            for (int d = 0; d < n; d++)
                for (int i = 0; i < L; i++) {
                    float w = (float)(n * (i % 17) + n * (n - 1) / 2);
                    if (out[d * L + i] != w)
                        fail_msg("long psum device %d element %d: %g != %g", d, i, (double)out[d * L + i], (double)w);
                }
            free(in);
            free(out);
        }
        dpar_runtime_destroy(rt);
    }
}

static void test_gather_scatter(void **state) {
    (void)state;
    dpar_dtype ts[3] = { DPAR_F32, DPAR_BF16, DPAR_I32 };
    for (int ni = 0; ni < 3; ni++) {
        int n = NS[ni];
        dpar_runtime *rt = rt_or_skip(n);
        for (int ti = 0; ti < 3; ti++) {
            dpar_dtype t = ts[ti];
            float in[64], out[64];
            /* all_gather stacked: [d, 10+d] -> [n, 2] */
            int64_t i2[1] = { 2 }, o2[2] = { n, 2 };
            for (int d = 0; d < n; d++) {
                in[2 * d] = (float)d;
                in[2 * d + 1] = (float)(10 + d);
            }
            run_coll(rt, n, C_GATHER, t, 1, i2, in, 2, o2, out);
            for (int d = 0; d < n; d++) expect_f(out + 2 * n * d, in, 2 * n, "all_gather");
            /* all_gather tiled along dim 1 of [2,1] (outer = 2): out [2, n], out[i][j] = in_j[i] */
            int64_t i21[2] = { 2, 1 }, o2n[2] = { 2, n };
            for (int d = 0; d < n; d++) {
                in[2 * d] = (float)(d + 1);
                in[2 * d + 1] = (float)(100 + d);
            }
            run_coll(rt, n, C_GATHER_TILED1, t, 2, i21, in, 2, o2n, out);
            for (int d = 0; d < n; d++)
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < n; j++) {
                        float w = in[2 * j + i], g = out[d * 2 * n + i * n + j];
                        if (g != w)
                            fail_msg("all_gather tiled dim 1: device %d [%d][%d]: %g != %g", d, i, j, (double)g,
                                     (double)w);
                    }
            /* psum_scatter tiled: [2n] of (d+1) -> [2] of n(n+1)/2 */
            int64_t i2n[1] = { 2 * n };
            for (int d = 0; d < n; d++)
                for (int i = 0; i < 2 * n; i++) in[d * 2 * n + i] = (float)(d + 1 + i);
            run_coll(rt, n, C_SCATTER, t, 1, i2n, in, 1, i2, out);
            for (int d = 0; d < n; d++)
                for (int i = 0; i < 2; i++) {
                    float w = (float)(n * (n + 1) / 2 + n * (2 * d + i));
                    if (out[2 * d + i] != w)
                        fail_msg("psum_scatter device %d [%d]: %g != %g", d, i, (double)out[2 * d + i], (double)w);
                }
            /* psum_scatter along dim 1 of [2, n] (outer = 2): out_r [2, 1] = sum_d in_d[i][r] */
            for (int d = 0; d < n; d++)
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < n; j++) in[d * 2 * n + i * n + j] = (float)(10 * i + j + d);
            run_coll(rt, n, C_SCATTER_DIM1, t, 2, o2n, in, 2, i21, out);
            for (int r = 0; r < n; r++)
                for (int i = 0; i < 2; i++) {
                    float w = (float)(n * (10 * i + r) + n * (n - 1) / 2);
                    if (out[2 * r + i] != w)
                        fail_msg("psum_scatter dim 1 device %d [%d]: %g != %g", r, i, (double)out[2 * r + i],
                                 (double)w);
                }
        }
        dpar_runtime_destroy(rt);
    }
}

static void test_permute_a2a_bcast(void **state) {
    (void)state;
    dpar_dtype ts[2] = { DPAR_F32, DPAR_F16 };
    for (int ni = 0; ni < 3; ni++) {
        int n = NS[ni];
        dpar_runtime *rt = rt_or_skip(n);
        for (int ti = 0; ti < 2; ti++) {
            dpar_dtype t = ts[ti];
            float in[64], out[64];
            int64_t s3[1] = { 3 };
            for (int d = 0; d < n; d++)
                for (int i = 0; i < 3; i++) in[3 * d + i] = (float)(10 * d + i + 1);
            /* ring shift in place: device d gets device d-1's data */
            run_coll(rt, n, C_PERMUTE_RING, t, 1, s3, in, 1, s3, out);
            for (int d = 0; d < n; d++) expect_f(out + 3 * d, in + 3 * ((d + n - 1) % n), 3, "ppermute ring");
            /* one pair 0 -> n-1: the others get zeros */
            run_coll(rt, n, C_PERMUTE_ONE, t, 1, s3, in, 1, s3, out);
            for (int d = 0; d < n; d++) {
                const float zero[3] = { 0, 0, 0 };
                expect_f(out + 3 * d, d == n - 1 ? in : zero, 3, "ppermute one pair");
            }
            /* pbroadcast from the last device, in place */
            run_coll(rt, n, C_BCAST, t, 1, s3, in, 1, s3, out);
            for (int d = 0; d < n; d++) expect_f(out + 3 * d, in + 3 * (n - 1), 3, "pbroadcast");
            /* all_to_all split 0 concat 0: in_d [n, 2], in_d[j][k] = 100d + 10j + k;
               out_r[s][k] = in_s[r][k] */
            int64_t sn2[2] = { n, 2 };
            for (int d = 0; d < n; d++)
                for (int j = 0; j < n; j++)
                    for (int k = 0; k < 2; k++) in[d * 2 * n + j * 2 + k] = (float)(100 * d + 10 * j + k);
            run_coll(rt, n, C_A2A_00, t, 2, sn2, in, 2, sn2, out);
            for (int r = 0; r < n; r++)
                for (int s = 0; s < n; s++)
                    for (int k = 0; k < 2; k++) {
                        float w = (float)(100 * s + 10 * r + k), g = out[r * 2 * n + s * 2 + k];
                        if (g != w)
                            fail_msg("all_to_all(0,0) device %d [%d][%d]: %g != %g", r, s, k, (double)g, (double)w);
                    }
            /* all_to_all split 1 concat 0: in_d [2, n], in_d[i][j] = 100d + 10i + j;
               block j = column j; out_r [2n, 1], out_r[2s + i] = in_s[i][r] */
            int64_t s2n[2] = { 2, n }, o2n1[2] = { 2 * n, 1 };
            for (int d = 0; d < n; d++)
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < n; j++) in[d * 2 * n + i * n + j] = (float)(100 * d + 10 * i + j);
            run_coll(rt, n, C_A2A_10, t, 2, s2n, in, 2, o2n1, out);
            for (int r = 0; r < n; r++)
                for (int s = 0; s < n; s++)
                    for (int i = 0; i < 2; i++) {
                        float w = (float)(100 * s + 10 * i + r), g = out[r * 2 * n + 2 * s + i];
                        if (g != w)
                            fail_msg("all_to_all(1,0) device %d [%d]: %g != %g", r, 2 * s + i, (double)g, (double)w);
                    }
        }
        dpar_runtime_destroy(rt);
    }
}

/* Many collectives back to back with ops in between (stream ordering and
   event reuse), checked at the end. */
static dpar_status chain_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *x = dpar_ctx_arg(ctx, 0), *out = dpar_ctx_arg(ctx, 1);
    int d = dpar_ctx_device(ctx), n;
    dpar_status s;
    if ((s = dpar_ctx_axis_size(ctx, "data", &n))) return s;
    if ((s = dpar_fill(x, (float)(d + 1)))) return s;
    for (int it = 0; it < 50; it++) {
        if ((s = dpar_pmean(ctx, x, x, "data"))) return s; /* everyone: mean */
        if ((s = dpar_scale(x, 2.0f))) return s;
        if ((s = dpar_axpy(x, -1.0f, x))) return s; /* x = 0 */
        if ((s = dpar_fill(x, (float)(d + 1)))) return s;
    }
    if ((s = dpar_psum(ctx, out, x, "data"))) return s;
    return DPAR_OK;
}
static void test_chain(void **state) {
    (void)state;
    for (int ni = 0; ni < 3; ni++) {
        int n = NS[ni];
        dpar_runtime *rt = rt_or_skip(n);
        dpar_mesh *m = t_mesh1(rt, n, "data");
        float xin[4 * 256], res[4 * 256];
        memset(xin, 0, sizeof xin);
        dpar_pmap_desc d = { .axis = "data",
                             .fn = chain_fn,
                             .num_inputs = 1,
                             .num_outputs = 1,
                             .inputs[0].data = xin,
                             .inputs[0].dtype = DPAR_F32,
                             .inputs[0].ndim = 2,
                             .inputs[0].shape[0] = n,
                             .inputs[0].shape[1] = 256,
                             .inputs[0].in_axis = DPAR_MAPPED,
                             .outputs[0].data = res,
                             .outputs[0].dtype = DPAR_F32,
                             .outputs[0].ndim = 1,
                             .outputs[0].shape[0] = 256 };
        T_OK(dpar_pmap(m, &d));
        for (int i = 0; i < n * 256; i++)
            if (res[i] != (float)(n * (n + 1) / 2)) fail_msg("chain: element %d: %g", i, (double)res[i]);
        dpar_mesh_destroy(m);
        dpar_runtime_destroy(rt);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_info),
        cmocka_unit_test(test_too_many_virtual_devices),
        cmocka_unit_test(test_choose_gpu),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_fill_cast),
        cmocka_unit_test(test_losses),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_gather_scatter),
        cmocka_unit_test(test_permute_a2a_bcast),
        cmocka_unit_test(test_chain),
    };
    return cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
}
