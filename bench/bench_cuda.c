/* CUDA backend benchmark (a benchmark, not a test): dpar against the raw
   libraries in the same process, on GPU 0.

     1. Device-copy bandwidth: cuMemcpyDtoDAsync of a 256 MB buffer, counted
        as bytes read + bytes written (the reference for 2-3).
     2. Memory-bound dpar ops on 256 MB f32 buffers (SGD step with and
        without momentum, axpy, scale, relu, casts f32 <-> bf16 / f16): effective
        bandwidth (bytes each op must read + write) as % of (1).
     3. dpar_matmul against cublasSgemm / cublasGemmEx called directly
        (f32 4096^3, bf16 8192^3): TFLOP/s and ratio.
     4. 1-rank all-reduce: dpar_psum on a 1-device mesh against ncclAllReduce
        on a 1-rank communicator (1 MB, 64 MB, 256 MB f32): time and ratio.
     5. conv2d at examples/train_cnn.c's two layers (batch 64, 3x3 SAME, no
        bias): forward, backward-data and backward-filter, each against
        cublasSgemm called directly at its im2col GEMM shape (M = N*OH*OW,
        K = C*KH*KW, N = OC; backward-data [M, K] = dy w^T, backward-filter
        [K, OC] = col^T dy): time and dpar/GEMM time (what im2col, col2im
        and dpar's dispatch add to the one GEMM).

   Every figure is measured here; nothing is assumed. Without a GPU (or in a
   build without DPAR_CUDA) it prints "SKIPPED: <reason>" and exits 0, or
   "FAIL: <reason>" and exits 1 when DPAR_REQUIRE_BACKENDS lists cuda (as
   scripts/gpu-check.sh sets it).
   Usage: bench_cuda [--quick 0|1] [--mb N]
     --quick 1  fewer repetitions, small matrix products, batch 2 convs (a smoke test)
     --mb N     buffer size for (1), (2) and the largest all-reduce (default 256) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dpar.h"
#include "examples/flags.h" /* ex_parse */

typedef unsigned long long cuptr;
static struct {
    int (*cuInit)(unsigned);
    int (*cuDeviceGet)(int *, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuStreamCreate)(void **, unsigned);
    int (*cuStreamSynchronize)(void *);
    int (*cuMemAlloc)(cuptr *, size_t);
    int (*cuMemFree)(cuptr);
    int (*cuMemsetD32Async)(cuptr, unsigned, size_t, void *);
    int (*cuMemcpyDtoDAsync)(cuptr, cuptr, size_t, void *);
    int (*cublasCreate)(void **);
    int (*cublasSetStream)(void *, void *);
    int (*cublasSgemm)(void *, int, int, int, int, int, const float *, const float *, int, const float *, int,
                       const float *, float *, int);
    int (*cublasGemmEx)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
                        const void *, void *, int, int, int, int);
    int (*ncclCommInitAll)(void **, int, const int *);
    int (*ncclAllReduce)(const void *, void *, size_t, int, int, void *, void *);
    int (*ncclCommDestroy)(void *);
} R;
static void *cu_ctx, *stream;
static int have_blas, have_nccl;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#define SYM(lib, f, name) (*(void **)(&R.f) = dlsym((lib), (name)))

static int load_raw(void) {
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu) return 0;
    if (!SYM(cu, cuInit, "cuInit") || !SYM(cu, cuDeviceGet, "cuDeviceGet") ||
        !SYM(cu, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
        !SYM(cu, cuCtxSetCurrent, "cuCtxSetCurrent") || !SYM(cu, cuStreamCreate, "cuStreamCreate") ||
        !SYM(cu, cuStreamSynchronize, "cuStreamSynchronize") || !SYM(cu, cuMemAlloc, "cuMemAlloc_v2") ||
        !SYM(cu, cuMemFree, "cuMemFree_v2") || !SYM(cu, cuMemsetD32Async, "cuMemsetD32Async") ||
        !SYM(cu, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"))
        return 0;
    int dev;
    if (R.cuInit(0) || R.cuDeviceGet(&dev, 0) || R.cuDevicePrimaryCtxRetain(&cu_ctx, dev) ||
        R.cuCtxSetCurrent(cu_ctx) || R.cuStreamCreate(&stream, 1))
        return 0;
    void *bl = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!bl) bl = dlopen("libcublas.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!bl) bl = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    have_blas = bl && SYM(bl, cublasCreate, "cublasCreate_v2") && SYM(bl, cublasSetStream, "cublasSetStream_v2") &&
                SYM(bl, cublasSgemm, "cublasSgemm_v2") && SYM(bl, cublasGemmEx, "cublasGemmEx");
    void *nc = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    have_nccl = nc && SYM(nc, ncclCommInitAll, "ncclCommInitAll") && SYM(nc, ncclAllReduce, "ncclAllReduce") &&
                SYM(nc, ncclCommDestroy, "ncclCommDestroy");
    return 1;
}

#define CHECK(expr)                                                                           \
    do {                                                                                      \
        dpar_status s_ = (expr);                                                              \
        if (s_) {                                                                             \
            printf("FAILED: %s: %s: %s\n", #expr, dpar_status_string(s_), dpar_last_error()); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static int reps = 20;

/* A buffer on device 0 holding v everywhere. */
static dpar_buffer *filled(dpar_runtime *rt, dpar_dtype t, int ndim, const int64_t *shape, float v) {
    dpar_buffer *b;
    CHECK(dpar_buffer_create(rt, 0, t, ndim, shape, &b));
    CHECK(dpar_fill(b, v));
    return b;
}

/* ---- 1. device copy ---- */
static double copy_bw(size_t bytes) {
    cuptr a, b;
    if (R.cuMemAlloc(&a, bytes) || R.cuMemAlloc(&b, bytes)) {
        printf("copy: cuMemAlloc failed\n");
        return 0;
    }
    R.cuMemsetD32Async(a, 0x3f800000u, bytes / 4, stream);
    R.cuMemcpyDtoDAsync(b, a, bytes, stream);
    R.cuStreamSynchronize(stream);
    double best = 1e30;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) R.cuMemcpyDtoDAsync(b, a, bytes, stream);
        R.cuStreamSynchronize(stream);
        double t = (now() - t0) / reps;
        if (t < best) best = t;
    }
    R.cuMemFree(a);
    R.cuMemFree(b);
    return 2.0 * (double)bytes / best; /* read + write */
}

/* ---- 2. dpar memory-bound ops ---- */
typedef enum {
    OP_SGD_MOM,
    OP_SGD,
    OP_AXPY,
    OP_SCALE,
    OP_RELU,
    OP_CAST_BF16,
    OP_CAST_F16,
    OP_BF16_TO_F32,
    OP_F16_TO_F32
} opk;
static const char *op_name[] = {
    "sgd step (momentum 0.9)", "sgd step (no momentum)", "axpy",           "scale",        "relu",
    "cast f32->bf16",          "cast f32->f16",          "cast bf16->f32", "cast f16->f32"
};
static const double op_traffic[] = { 5, 3, 3, 2, 2, 1.5, 1.5, 1.5, 1.5 }; /* x buffer bytes read + written */

static double dpar_op_bw(dpar_runtime *rt, opk k, int64_t n) {
    dpar_buffer *p, *g, *v, *h, *f16;
    int64_t shape[1] = { n };
    CHECK(dpar_buffer_create(rt, 0, DPAR_F32, 1, shape, &p));
    CHECK(dpar_buffer_create(rt, 0, DPAR_F32, 1, shape, &g));
    CHECK(dpar_buffer_create(rt, 0, DPAR_F32, 1, shape, &v));
    CHECK(dpar_buffer_create(rt, 0, DPAR_BF16, 1, shape, &h));
    CHECK(dpar_buffer_create(rt, 0, DPAR_F16, 1, shape, &f16));
    CHECK(dpar_fill(h, 0.001f));
    CHECK(dpar_fill(f16, 0.001f));
    CHECK(dpar_fill(p, 1.0f));
    CHECK(dpar_fill(g, 0.001f));
    dpar_sgd_desc d = { .learning_rate = 0.01f, .momentum = k == OP_SGD_MOM ? 0.9f : 0.0f };
    double best = 1e30;
    for (int trial = 0; trial < 4; trial++) {
        CHECK(dpar_runtime_device_sync(rt, 0));
        double t0 = now();
        for (int i = 0; i < reps; i++) {
            switch (k) {
            case OP_SGD_MOM: CHECK(dpar_sgd_update(&d, p, g, v, 1.0f)); break;
            case OP_SGD: CHECK(dpar_sgd_update(&d, p, g, NULL, 1.0f)); break;
            case OP_AXPY: CHECK(dpar_axpy(p, 1e-6f, g)); break;
            case OP_SCALE: CHECK(dpar_scale(p, 1.0f)); break;
            case OP_RELU: CHECK(dpar_relu(p, g)); break;
            case OP_CAST_BF16: CHECK(dpar_cast(h, g)); break;
            case OP_CAST_F16: CHECK(dpar_cast(f16, g)); break;
            case OP_BF16_TO_F32: CHECK(dpar_cast(g, h)); break;
            case OP_F16_TO_F32: CHECK(dpar_cast(g, f16)); break;
            }
        }
        CHECK(dpar_runtime_device_sync(rt, 0));
        double t = (now() - t0) / reps;
        if (trial > 0 && t < best) best = t; /* trial 0 warms up */
    }
    dpar_buffer_destroy(p);
    dpar_buffer_destroy(g);
    dpar_buffer_destroy(v);
    dpar_buffer_destroy(h);
    dpar_buffer_destroy(f16);
    return op_traffic[k] * 4.0 * (double)n / best;
}

/* ---- 3. matmul ---- */
static void bench_matmul(dpar_runtime *rt, dpar_dtype t, int nsz) {
    int64_t s2[2] = { nsz, nsz };
    dpar_buffer *A = filled(rt, t, 2, s2, 0.01f), *B = filled(rt, t, 2, s2, 0.01f), *C;
    CHECK(dpar_buffer_create(rt, 0, DPAR_F32, 2, s2, &C));
    int r = nsz >= 8192 ? reps / 4 + 1 : reps;
    double flops = 2.0 * (double)nsz * nsz * nsz, best_d = 1e30, best_r = 1e30;
    for (int trial = 0; trial < 3; trial++) {
        CHECK(dpar_runtime_device_sync(rt, 0));
        double t0 = now();
        for (int i = 0; i < r; i++) CHECK(dpar_matmul(C, A, B, false, false, 1.0f, 0.0f));
        CHECK(dpar_runtime_device_sync(rt, 0));
        double tt = (now() - t0) / r;
        if (trial > 0 && tt < best_d) best_d = tt;
    }
    dpar_buffer_destroy(A);
    dpar_buffer_destroy(B);
    dpar_buffer_destroy(C);
    if (have_blas) {
        void *h;
        size_t es = t == DPAR_F32 ? 4 : 2;
        cuptr a, b, c;
        if (R.cublasCreate(&h) || R.cublasSetStream(h, stream) || R.cuMemAlloc(&a, (size_t)nsz * (size_t)nsz * es) ||
            R.cuMemAlloc(&b, (size_t)nsz * (size_t)nsz * es) || R.cuMemAlloc(&c, (size_t)nsz * (size_t)nsz * 4)) {
            printf("matmul: raw cuBLAS setup failed\n");
            return;
        }
        R.cuMemsetD32Async(a, 0x3c003c00u, (size_t)nsz * (size_t)nsz * es / 4, stream);
        R.cuMemsetD32Async(b, 0x3c003c00u, (size_t)nsz * (size_t)nsz * es / 4, stream);
        float al = 1.0f, be = 0.0f;
        for (int trial = 0; trial < 3; trial++) {
            R.cuStreamSynchronize(stream);
            double t0 = now();
            for (int i = 0; i < r; i++) {
                if (t == DPAR_F32)
                    R.cublasSgemm(h, 0, 0, nsz, nsz, nsz, &al, (const float *)(size_t)b, nsz, (const float *)(size_t)a,
                                  nsz, &be, (float *)(size_t)c, nsz);
                else
                    R.cublasGemmEx(h, 0, 0, nsz, nsz, nsz, &al, (const void *)(size_t)b, t == DPAR_F16 ? 2 : 14, nsz,
                                   (const void *)(size_t)a, t == DPAR_F16 ? 2 : 14, nsz, &be, (void *)(size_t)c, 0, nsz,
                                   68, -1);
            }
            R.cuStreamSynchronize(stream);
            double tt = (now() - t0) / r;
            if (trial > 0 && tt < best_r) best_r = tt;
        }
        R.cuMemFree(a);
        R.cuMemFree(b);
        R.cuMemFree(c);
    }
    printf("matmul %-4s %5d^3: dpar %8.1f TFLOP/s", dpar_dtype_name(t), nsz, flops / best_d * 1e-12);
    if (have_blas)
        printf("   cuBLAS direct %8.1f TFLOP/s   dpar/direct = %.3f\n", flops / best_r * 1e-12, best_r / best_d);
    else
        printf("   (cuBLAS direct: library not loadable)\n");
}

/* ---- 4. 1-rank all-reduce ---- */
typedef struct {
    int reps;
    double t;
} ar_job;
static dpar_status ar_fn(dpar_ctx *ctx, void *user) {
    ar_job *j = (ar_job *)user;
    dpar_buffer *in = dpar_ctx_arg(ctx, 0), *out = dpar_ctx_arg(ctx, 1);
    dpar_status s;
    double best = 1e30;
    for (int trial = 0; trial < 3; trial++) {
        if ((s = dpar_runtime_device_sync(dpar_ctx_runtime(ctx), dpar_ctx_device(ctx)))) return s;
        double t0 = now();
        for (int i = 0; i < j->reps; i++)
            if ((s = dpar_psum(ctx, out, in, "data"))) return s;
        if ((s = dpar_runtime_device_sync(dpar_ctx_runtime(ctx), dpar_ctx_device(ctx)))) return s;
        double t = (now() - t0) / j->reps;
        if (trial > 0 && t < best) best = t;
    }
    j->t = best;
    return DPAR_OK;
}
static void bench_allreduce(dpar_runtime *rt, int64_t n) {
    dpar_mesh *m;
    dpar_mesh_desc md = { .ndim = 1, .shape = { 1 }, .axis_names = { "data" } };
    CHECK(dpar_mesh_create(rt, &md, &m));
    float *host = (float *)calloc((size_t)n, 4);
    float *res = (float *)calloc((size_t)n, 4);
    ar_job j = { reps, 0 };
    dpar_pmap_desc d = { .axis = "data",
                         .fn = ar_fn,
                         .user = &j,
                         .num_inputs = 1,
                         .num_outputs = 1,
                         .inputs[0].data = host,
                         .inputs[0].dtype = DPAR_F32,
                         .inputs[0].ndim = 2,
                         .inputs[0].shape[0] = 1,
                         .inputs[0].shape[1] = n,
                         .inputs[0].in_axis = DPAR_MAPPED,
                         .outputs[0].data = res,
                         .outputs[0].dtype = DPAR_F32,
                         .outputs[0].ndim = 1,
                         .outputs[0].shape[0] = n };
    CHECK(dpar_pmap(m, &d));
    free(host);
    free(res);
    dpar_mesh_destroy(m);
    double bytes = 4.0 * (double)n, raw = 0;
    if (have_nccl) {
        void *comm;
        int devs[1] = { 0 };
        cuptr a, b;
        if (R.ncclCommInitAll(&comm, 1, devs) || R.cuMemAlloc(&a, (size_t)bytes) || R.cuMemAlloc(&b, (size_t)bytes)) {
            printf("allreduce: raw NCCL setup failed\n");
            return;
        }
        R.cuCtxSetCurrent(cu_ctx);
        double best = 1e30;
        for (int trial = 0; trial < 3; trial++) {
            R.cuStreamSynchronize(stream);
            double t0 = now();
            for (int i = 0; i < reps; i++)
                R.ncclAllReduce((void *)(size_t)a, (void *)(size_t)b, (size_t)n, 7, 0, comm, stream);
            R.cuStreamSynchronize(stream);
            double t = (now() - t0) / reps;
            if (trial > 0 && t < best) best = t;
        }
        raw = best;
        R.ncclCommDestroy(comm);
        R.cuMemFree(a);
        R.cuMemFree(b);
    }
    printf("all-reduce 1 rank %7.1f MB: dpar psum %9.1f us (algbw %7.1f GB/s)", bytes / 1e6, j.t * 1e6,
           bytes / j.t * 1e-9);
    if (have_nccl)
        printf("   ncclAllReduce %9.1f us (algbw %7.1f GB/s)   dpar/raw time = %.3f\n", raw * 1e6, bytes / raw * 1e-9,
               j.t / raw);
    else
        printf("   (raw NCCL: libnccl.so.2 not loadable)\n");
}

/* ---- 5. conv2d against its im2col GEMM ---- */
/* Row-major C[M,N] = op(A) op(B), as dpar's CUDA conv does it: column-major C^T = op(B)^T op(A)^T. */
static void sgemm_rm(void *h, int ta, int tb, int M, int N, int K, cuptr A, cuptr B, cuptr C) {
    float al = 1.0f, be = 0.0f;
    R.cublasSgemm(h, tb, ta, N, M, K, &al, (const float *)(size_t)B, tb ? K : N, (const float *)(size_t)A, ta ? M : K,
                  &be, (float *)(size_t)C, N);
}
/* The best time of cublasSgemm at row-major [M,N] = op(A) op(B), K inner; 0 when cuBLAS is missing. */
static double gemm_time(int ta, int tb, int M, int N, int K) {
    void *h;
    cuptr a, b, c;
    if (!have_blas) return 0;
    if (R.cublasCreate(&h) || R.cublasSetStream(h, stream) || R.cuMemAlloc(&a, (size_t)M * (size_t)K * 4) ||
        R.cuMemAlloc(&b, (size_t)K * (size_t)N * 4) || R.cuMemAlloc(&c, (size_t)M * (size_t)N * 4)) {
        printf("conv2d: raw cuBLAS setup failed\n");
        return 0;
    }
    R.cuMemsetD32Async(a, 0x3c003c00u, (size_t)M * (size_t)K, stream);
    R.cuMemsetD32Async(b, 0x3c003c00u, (size_t)K * (size_t)N, stream);
    double best = 1e30;
    for (int trial = 0; trial < 4; trial++) {
        R.cuStreamSynchronize(stream);
        double t0 = now();
        for (int i = 0; i < reps; i++) sgemm_rm(h, ta, tb, M, N, K, a, b, c);
        R.cuStreamSynchronize(stream);
        double t = (now() - t0) / reps;
        if (trial > 0 && t < best) best = t; /* trial 0 warms up */
    }
    R.cuMemFree(a);
    R.cuMemFree(b);
    R.cuMemFree(c);
    return best;
}
typedef enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER } convk;
static const char *conv_name[] = { "fwd", "bwd-data", "bwd-filter" };
/* One layer, x [n, hw, hw, c] and w [3, 3, c, oc], SAME: a row per direction. */
static void bench_conv(dpar_runtime *rt, const char *layer, int64_t n, int64_t hw, int64_t c, int64_t oc) {
    int64_t xs[4] = { n, hw, hw, c }, ws[4] = { 3, 3, c, oc }, ys[4] = { n, hw, hw, oc };
    dpar_buffer *x = filled(rt, DPAR_F32, 4, xs, 0.5f), *w = filled(rt, DPAR_F32, 4, ws, 0.01f);
    dpar_buffer *y = filled(rt, DPAR_F32, 4, ys, 0.25f);
    int M = (int)(n * hw * hw), K = (int)(9 * c), O = (int)oc;
    for (int k = CONV_FWD; k <= CONV_BWD_FILTER; k++) {
        double best = 1e30;
        for (int trial = 0; trial < 4; trial++) {
            CHECK(dpar_runtime_device_sync(rt, 0));
            double t0 = now();
            for (int i = 0; i < reps; i++) {
                switch ((convk)k) {
                case CONV_FWD: CHECK(dpar_conv2d(y, x, w, NULL, NULL)); break;
                case CONV_BWD_DATA: CHECK(dpar_conv2d_backward_input(x, y, w, NULL)); break;
                case CONV_BWD_FILTER: CHECK(dpar_conv2d_backward_kernel(w, NULL, x, y, NULL)); break;
                }
            }
            CHECK(dpar_runtime_device_sync(rt, 0));
            double t = (now() - t0) / reps;
            if (trial > 0 && t < best) best = t; /* trial 0 warms up */
        }
        /* the GEMM's row-major [rows, cols] and inner size, as dpar__cu_op_conv calls it */
        int ta = k == CONV_BWD_FILTER, tb = k == CONV_BWD_DATA;
        int rows = k == CONV_BWD_FILTER ? K : M, cols = k == CONV_BWD_DATA ? K : O;
        int inner = k == CONV_FWD ? K : k == CONV_BWD_DATA ? O : M;
        double g = gemm_time(ta, tb, rows, cols, inner);
        printf("conv2d %s %-10s %3lldx%2lldx%2lldx%-2lld -> %2lld: dpar %8.1f us", layer, conv_name[k], (long long)n,
               (long long)hw, (long long)hw, (long long)c, (long long)oc, best * 1e6);
        if (g > 0)
            printf("   sgemm M %5d N %3d K %5d %8.1f us   dpar/GEMM time = %.3f\n", rows, cols, inner, g * 1e6,
                   best / g);
        else
            printf("   (cuBLAS direct: library not loadable)\n");
    }
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(w);
    dpar_buffer_destroy(y);
}

int main(int argc, char **argv) {
    int quick = 0, mb = 256;
    const ex_flag flags[] = {
        EX_I("--quick", &quick, 0, 1), /* fewer repetitions, small products, batch 2 convs */
        EX_I("--mb", &mb, 1, 65536),
    };
    int rc = ex_parse("bench_cuda", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (rc) return ex_exit_status(rc);
    if (quick) reps = 3;
    dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CUDA, .num_devices = 1 };
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&rd, &rt);
    const char *req = getenv("DPAR_REQUIRE_BACKENDS");
    int required = req && strstr(req, "cuda");
    if (s == DPAR_ERR_BACKEND_UNAVAILABLE) {
        printf("%s: cuda backend unavailable: %s\n", required ? "FAIL" : "SKIPPED", dpar_last_error());
        return required;
    }
    CHECK(s);
    if (!load_raw()) {
        printf("%s: could not open the CUDA driver directly for the reference figures\n",
               required ? "FAIL" : "SKIPPED");
        return required;
    }
    dpar_device_info info;
    CHECK(dpar_runtime_device_info(rt, 0, &info));
    printf("device: %s (%s), %.1f GiB\n", info.name, info.driver, (double)info.memory_bytes / (1 << 30));

    const int64_t n = (int64_t)mb << 18; /* mb MB of f32 */
    double cbw = copy_bw((size_t)n * 4);
    printf("device copy (cuMemcpyDtoDAsync, %d MB): %8.1f GB/s (read + write)\n", mb, cbw * 1e-9);
    for (int k = 0; k <= OP_F16_TO_F32; k++) {
        double bw = dpar_op_bw(rt, (opk)k, n);
        printf("%-26s %d MB: %8.1f GB/s = %5.1f%% of device copy\n", op_name[k], mb, bw * 1e-9, 100.0 * bw / cbw);
    }
    bench_matmul(rt, DPAR_F32, quick ? 64 : 4096);
    bench_matmul(rt, DPAR_BF16, quick ? 64 : 8192);
    bench_allreduce(rt, (int64_t)1 << 18 < n ? (int64_t)1 << 18 : n);
    if (!quick) bench_allreduce(rt, (int64_t)16 << 20 < n ? (int64_t)16 << 20 : n);
    bench_allreduce(rt, n);
    int64_t batch = quick ? 2 : 64; /* examples/train_cnn.c's global batch on one device */
    bench_conv(rt, "conv1", batch, 28, 1, 32);
    bench_conv(rt, "conv2", batch, 14, 32, 64);
    dpar_runtime_destroy(rt);
    return 0;
}
