// A host-memory stand-in for the CUDA driver, cuBLAS and NCCL, so the CUDA
// backend's host code (argument passing, launch geometry, collective logic,
// NCCL call sequences, error paths) runs on machines without a GPU.
//
// Built by tests/test_cuda_mock.sh into one shared library, reachable as
// libcuda.so.1, libcublas.so.13 and libnccl.so.2 through LD_LIBRARY_PATH.
// The real kernels (kernels/dpar_kernels.cu) are compiled here as host C++
// through a small shim and run with CUDA's semantics: blocks one after
// another, the threads of a block concurrently (real threads, so
// __syncthreads and warp shuffles behave) when the kernel needs it.
// Streams are asynchronous, as on a GPU: each stream is a thread running its
// queue in order, with a random delay before every operation (MOCK_CUDA_
// JITTER_US, default 20) so that a missing event or stream wait shows up as
// wrong data; events and cuStreamWaitEvent order streams; NCCL operations run
// on their streams and rendezvous there; cuMemFree poisons (0xFF, NaN) and
// quarantines the memory, so work still queued on it yields NaN.
// Not emulated: the PTX itself (the kernels run as host C++), timing, and
// concurrency inside one kernel launch beyond what __syncthreads needs.
//
// Environment: MOCK_CUDA_GPUS=N (default 1) physical GPUs;
// MOCK_CUDA_NO_DEVICE=1 makes cuInit fail with CUDA_ERROR_NO_DEVICE;
// MOCK_CUDA_SYNC=1 runs every operation at enqueue instead (no streams).
// Checks: a current context for allocations, copies and launches; guard
// bytes after every allocation (checked on free); frees of unknown pointers;
// BLAS leading-dimension rules; kernel names.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------
// Kernel shim
// ---------------------------------------------------------------------------
struct dim3 { unsigned x, y, z; };
static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
struct float4 { float x, y, z, w; };
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }

static pthread_barrier_t g_block_bar;       // all threads of the running block
static pthread_barrier_t g_warp_bar[32];    // per warp
static double g_warp_val[32][32];
static bool g_threaded;                      // running a block with real threads

static void mock_syncthreads() {
    if (!g_threaded) { fprintf(stderr, "mock: __syncthreads in a kernel not marked threaded\n"); abort(); }
    pthread_barrier_wait(&g_block_bar);
}
template <typename T> static T mock_shfl_xor(T v, int o) {
    if (!g_threaded) { fprintf(stderr, "mock: warp shuffle in a kernel not marked threaded\n"); abort(); }
    unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    g_warp_val[w][lane] = (double)v;
    pthread_barrier_wait(&g_warp_bar[w]);
    T r = (T)g_warp_val[w][lane ^ (unsigned)o];
    pthread_barrier_wait(&g_warp_bar[w]);
    return r;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() mock_syncthreads()
#define __shfl_xor_sync(mask, v, o) mock_shfl_xor((v), (o))

#include "../../kernels/dpar_kernels.cu"

// ---------------------------------------------------------------------------
// Kernel table and launcher
// ---------------------------------------------------------------------------
typedef void (*launch_fn)(void *f, void **args);
template <typename... A, size_t... I>
static void call_with(void (*f)(A...), void **args, std::index_sequence<I...>) {
    f(*(typename std::remove_reference<A>::type *)args[I]...);
}
template <typename... A> static void invoke(void *f, void **args) {
    call_with((void (*)(A...))f, args, std::index_sequence_for<A...>{});
}
template <typename... A> static launch_fn launcher_of(void (*)(A...)) { return &invoke<A...>; }

typedef std::vector<std::string> (*capture_fn)(void **args);
template <typename... A, size_t... I>
static std::vector<std::string> capture_with(void **args, std::index_sequence<I...>) {
    return { std::string((const char *)args[I], sizeof(typename std::remove_reference<A>::type))... };
}
template <typename... A> static std::vector<std::string> capture_args(void **args) {
    return capture_with<A...>(args, std::index_sequence_for<A...>{});
}
template <typename... A> static capture_fn capture_of(void (*)(A...)) { return &capture_args<A...>; }

struct kinfo { const char *name; void *fn; launch_fn run; bool threaded; capture_fn capture; };
#define K(name, thr) { #name, (void *)&name, launcher_of(&name), thr, capture_of(&name) }
static const kinfo g_kernels[] = {
    K(dpar_k_scale, false), K(dpar_k_axpy, false), K(dpar_k_relu, false), K(dpar_k_relu_bwd, false),
    K(dpar_k_bias_add, false), K(dpar_k_bias_grad, false), K(dpar_k_cast, false), K(dpar_k_sgd, false),
    K(dpar_k_reduce_partial, true), K(dpar_k_reduce_partial_f64, true), K(dpar_k_mse_partial, true),
    K(dpar_k_reduce_final, true), K(dpar_k_xent_rows, true), K(dpar_k_vreduce, false),
    K(dpar_k_to_key, false), K(dpar_k_from_key, false), K(dpar_k_div_i32, false), K(dpar_k_copy_nd, false),
};

struct thr_arg { const kinfo *k; void **args; dim3 b, bd, gd; unsigned t; };
static void *thr_main(void *p) {
    thr_arg *a = (thr_arg *)p;
    threadIdx = dim3{ a->t, 0, 0 }; blockIdx = a->b; blockDim = a->bd; gridDim = a->gd;
    a->k->run(a->k->fn, a->args);
    return NULL;
}

static std::mutex g_launch_mu; // one kernel at a time (the shim's state is global)
static int g_launches;

static void run_kernel(const kinfo *k, unsigned gx, unsigned bx, void **args) {
    std::lock_guard<std::mutex> lock(g_launch_mu);
    g_launches++;
    dim3 gd{ gx, 1, 1 }, bd{ bx, 1, 1 };
    if (!k->threaded) {
        for (unsigned b = 0; b < gx; b++)
            for (unsigned t = 0; t < bx; t++) {
                threadIdx = dim3{ t, 0, 0 }; blockIdx = dim3{ b, 0, 0 }; blockDim = bd; gridDim = gd;
                k->run(k->fn, args);
            }
        return;
    }
    if (bx % 32) { fprintf(stderr, "mock: threaded kernel %s with block %u\n", k->name, bx); abort(); }
    g_threaded = true;
    std::vector<pthread_t> th(bx);
    std::vector<thr_arg> ta(bx);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (unsigned b = 0; b < gx; b++) {
        pthread_barrier_init(&g_block_bar, NULL, bx);
        for (unsigned w = 0; w < bx / 32; w++) pthread_barrier_init(&g_warp_bar[w], NULL, 32);
        for (unsigned t = 0; t < bx; t++) {
            ta[t] = thr_arg{ k, args, dim3{ b, 0, 0 }, bd, gd, t };
            if (pthread_create(&th[t], &attr, thr_main, &ta[t])) { fprintf(stderr, "mock: pthread_create\n"); abort(); }
        }
        for (unsigned t = 0; t < bx; t++) pthread_join(th[t], NULL);
        pthread_barrier_destroy(&g_block_bar);
        for (unsigned w = 0; w < bx / 32; w++) pthread_barrier_destroy(&g_warp_bar[w]);
    }
    pthread_attr_destroy(&attr);
    g_threaded = false;
}


// ---------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------
struct mstream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    uint64_t enq = 0, done = 0;
    bool stop = false;
    std::thread th;
};
struct mevent {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t rec = 0, comp = 0;
};
static int jitter_us() {
    static int j = -1;
    if (j < 0) { const char *e = getenv("MOCK_CUDA_JITTER_US"); j = e ? atoi(e) : 20; }
    return j;
}
static bool sync_mode() { static int m = -1; if (m < 0) m = getenv("MOCK_CUDA_SYNC") != NULL; return m; }
static void stream_loop(mstream *s) {
    unsigned seed = (unsigned)(uintptr_t)s;
    std::unique_lock<std::mutex> l(s->mu);
    for (;;) {
        s->cv.wait(l, [&] { return s->stop || !s->q.empty(); });
        if (s->q.empty()) return;
        std::function<void()> f = std::move(s->q.front());
        s->q.pop_front();
        l.unlock();
        if (jitter_us() > 0) std::this_thread::sleep_for(std::chrono::microseconds(rand_r(&seed) % (jitter_us() + 1)));
        f();
        l.lock();
        s->done++;
        s->cv.notify_all();
    }
}
static void enqueue(void *sv, std::function<void()> f) {
    mstream *s = (mstream *)sv;
    if (!s || sync_mode()) { f(); return; }
    std::lock_guard<std::mutex> l(s->mu);
    s->q.push_back(std::move(f));
    s->enq++;
    s->cv.notify_all();
}
static void stream_sync(void *sv) {
    mstream *s = (mstream *)sv;
    if (!s) return;
    std::unique_lock<std::mutex> l(s->mu);
    s->cv.wait(l, [&] { return s->done == s->enq; });
}
// ---------------------------------------------------------------------------
// Driver API
// ---------------------------------------------------------------------------
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_OOM = 2, ERR_NOT_INIT = 3, ERR_NO_DEVICE = 100,
       ERR_INVALID_DEVICE = 101, ERR_INVALID_CONTEXT = 201, ERR_NOT_FOUND = 500 };
static const size_t GUARD = 64;
static std::mutex g_mu;
static std::map<uintptr_t, size_t> g_allocs;
static std::vector<void *> g_quarantine;
static int g_inited, g_ngpu = 1;
struct mock_ctx { int dev; int refs; };
static mock_ctx g_ctx[16];
static thread_local mock_ctx *t_cur;

static int fail_bad(const char *what) { fprintf(stderr, "mock cuda: %s\n", what); return ERR_INVALID_VALUE; }
#define NEED_CTX() do { if (!t_cur) { fprintf(stderr, "mock cuda: %s without a current context\n", __func__); return ERR_INVALID_CONTEXT; } } while (0)

// checks [p, p+n) lies inside one allocation
static bool in_alloc(CUdeviceptr p, size_t n) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return false;
    --it;
    return (uintptr_t)p >= it->first && (uintptr_t)p + n <= it->first + it->second;
}

extern "C" {
CUresult cuInit(unsigned flags) {
    (void)flags;
    const char *nd = getenv("MOCK_CUDA_NO_DEVICE");
    if (nd && *nd == '1') return ERR_NO_DEVICE;
    const char *g = getenv("MOCK_CUDA_GPUS");
    if (g && atoi(g) > 0 && atoi(g) <= 16) g_ngpu = atoi(g);
    g_inited = 1;
    return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuGetErrorName(CUresult r, const char **s) {
    switch (r) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case ERR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case ERR_OOM: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case ERR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case ERR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case ERR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    default: *s = "CUDA_ERROR_UNKNOWN";
    }
    return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
    switch (r) {
    case ERR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
    case ERR_OOM: *s = "out of memory"; break;
    default: *s = "mock error";
    }
    return OK;
}
CUresult cuDeviceGetCount(int *n) { if (!g_inited) return ERR_NOT_INIT; *n = g_ngpu; return OK; }
CUresult cuDeviceGet(int *d, int i) { if (i < 0 || i >= g_ngpu) return ERR_INVALID_DEVICE; *d = i; return OK; }
CUresult cuDeviceGetName(char *s, int len, int d) { snprintf(s, (size_t)len, "Mock GPU %d", d); return OK; }
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)1 << 34; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
    (void)d;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : 0;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
    if (d < 0 || d >= g_ngpu) return ERR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lock(g_mu);
    g_ctx[d].dev = d; g_ctx[d].refs++;
    *c = &g_ctx[d];
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_ctx[d].refs <= 0) return fail_bad("cuDevicePrimaryCtxRelease without retain");
    g_ctx[d].refs--;
    return OK;
}
CUresult cuCtxSetCurrent(void *c) { t_cur = (mock_ctx *)c; return OK; }
CUresult cuStreamCreate(void **s, unsigned f) {
    NEED_CTX(); (void)f;
    mstream *m = new mstream();
    m->th = std::thread(stream_loop, m);
    *s = m;
    return OK;
}
CUresult cuStreamDestroy_v2(void *s) {
    mstream *m = (mstream *)s;
    stream_sync(m);
    { std::lock_guard<std::mutex> l(m->mu); m->stop = true; m->cv.notify_all(); }
    m->th.join();
    delete m;
    return OK;
}
CUresult cuStreamSynchronize(void *s) { stream_sync(s); return OK; }
CUresult cuStreamQuery(void *s) {
    mstream *m = (mstream *)s;
    std::lock_guard<std::mutex> l(m->mu);
    return m->done == m->enq ? OK : 600;
}
CUresult cuEventCreate(void **e, unsigned f) { NEED_CTX(); (void)f; *e = new mevent(); return OK; }
CUresult cuEventDestroy_v2(void *e) { delete (mevent *)e; return OK; }
CUresult cuEventRecord(void *ev, void *s) {
    mevent *e = (mevent *)ev;
    if (!e) return ERR_INVALID_VALUE;
    uint64_t g;
    { std::lock_guard<std::mutex> l(e->mu); g = ++e->rec; }
    enqueue(s, [e, g] { std::lock_guard<std::mutex> l(e->mu); if (e->comp < g) e->comp = g; e->cv.notify_all(); });
    return OK;
}
CUresult cuEventQuery(void *ev) {
    mevent *e = (mevent *)ev;
    std::lock_guard<std::mutex> l(e->mu);
    return e->comp >= e->rec ? OK : 600;
}
CUresult cuStreamWaitEvent(void *s, void *ev, unsigned f) {
    (void)f;
    mevent *e = (mevent *)ev;
    if (!e) return ERR_INVALID_VALUE;
    uint64_t g;
    { std::lock_guard<std::mutex> l(e->mu); g = e->rec; }
    enqueue(s, [e, g] { std::unique_lock<std::mutex> l(e->mu); e->cv.wait(l, [&] { return e->comp >= g; }); });
    return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    NEED_CTX();
    if (n == 0) return ERR_INVALID_VALUE; // as the real driver
    unsigned char *m = (unsigned char *)aligned_alloc(256, (n + GUARD + 255) / 256 * 256);
    if (!m) return ERR_OOM;
    memset(m, 0xA5, n);          // not zeroed, like device memory
    memset(m + n, 0x5A, GUARD);
    std::lock_guard<std::mutex> lock(g_mu);
    g_allocs[(uintptr_t)m] = n;
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_CTX();
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) { fprintf(stderr, "mock cuda: cuMemFree of unknown pointer %llx\n", p); abort(); }
    unsigned char *m = (unsigned char *)(uintptr_t)p;
    for (size_t i = 0; i < GUARD; i++)
        if (m[it->second + i] != 0x5A) {
            fprintf(stderr, "mock cuda: guard bytes after a %zu-byte allocation were overwritten\n", it->second);
            abort();
        }
    memset(m, 0xFF, it->second); /* poisoned and never reused: late readers see NaN */
    g_quarantine.push_back(m);    /* kept reachable (not a leak for LeakSanitizer) */
    g_allocs.erase(it);
    return OK;
}
#define CHECK_RANGE(p, n) do { if ((n) != 0 && !in_alloc((p), (n))) { \
    fprintf(stderr, "mock cuda: %s: [%llx, +%zu) is outside every allocation\n", __func__, (p), (size_t)(n)); abort(); } } while (0)
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void *s) {
    NEED_CTX(); CHECK_RANGE(p, n);
    enqueue(s, [=] { memset((void *)(uintptr_t)p, v, n); });
    return OK;
}
CUresult cuMemsetD16Async(CUdeviceptr p, unsigned short v, size_t n, void *s) {
    NEED_CTX(); CHECK_RANGE(p, 2 * n);
    enqueue(s, [=] { for (size_t i = 0; i < n; i++) ((unsigned short *)(uintptr_t)p)[i] = v; });
    return OK;
}
CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, size_t n, void *s) {
    NEED_CTX(); CHECK_RANGE(p, 4 * n);
    enqueue(s, [=] { for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)p)[i] = v; });
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) {
    NEED_CTX(); CHECK_RANGE(d, n);
    /* pageable source: staged at the call, as the driver does */
    std::vector<unsigned char> data((const unsigned char *)h, (const unsigned char *)h + n);
    enqueue(s, [=] { memcpy((void *)(uintptr_t)d, data.data(), n); });
    return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) {
    NEED_CTX(); CHECK_RANGE(d, n);
    /* pageable destination: returns when the copy is done, as the driver does */
    enqueue(s, [=] { memcpy(h, (const void *)(uintptr_t)d, n); });
    stream_sync(s);
    return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr sp, size_t n, void *s) {
    NEED_CTX(); CHECK_RANGE(d, n); CHECK_RANGE(sp, n);
    enqueue(s, [=] { memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)sp, n); });
    return OK;
}
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *opts, void **vals) {
    NEED_CTX(); (void)n; (void)opts; (void)vals;
    if (!strstr((const char *)img, ".visible .entry dpar_k_")) return fail_bad("module image is not the dpar PTX");
    *m = malloc(8);
    return OK;
}
CUresult cuModuleUnload(void *m) { free(m); return OK; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    (void)m;
    for (const kinfo &k : g_kernels)
        if (strcmp(k.name, name) == 0) { *f = (void *)&k; return OK; }
    return ERR_NOT_FOUND;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *s, void **args, void **extra) {
    NEED_CTX(); (void)shmem;
    if (!f || gy != 1 || gz != 1 || by != 1 || bz != 1 || extra || !args || gx == 0 || bx == 0 || bx > 1024)
        return fail_bad("cuLaunchKernel: unexpected launch configuration");
    const kinfo *k = (const kinfo *)f;
    std::vector<std::string> params = k->capture(args); /* by value, at the call */
    enqueue(s, [=]() mutable {
        std::vector<void *> argv;
        for (std::string &b : params) argv.push_back(&b[0]);
        run_kernel(k, gx, bx, argv.data());
    });
    return OK;
}

// ---------------------------------------------------------------------------
// cuBLAS (column major, as the real one)
// ---------------------------------------------------------------------------
struct mblas { void *stream; };
int cublasCreate_v2(void **h) { if (!t_cur) return 1; *h = new mblas{ NULL }; return 0; }
int cublasDestroy_v2(void *h) { delete (mblas *)h; return 0; }
int cublasSetStream_v2(void *h, void *s) { ((mblas *)h)->stream = s; return 0; }
const char *cublasGetStatusString(int s) { return s == 7 ? "CUBLAS_STATUS_INVALID_VALUE" : "mock cuBLAS status"; }
static float ld_elem(const void *p, int t, size_t i) { /* t: CUDA_R_32F 0, _16F 2, _16BF 14 */
    if (t == 0) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == 2 ? dk_f16_to_f32(h) : dk_bf16_to_f32(h);
}
static int gemm(int ta, int tb, int m, int n, int k, float alpha, const void *A, int at, int lda, const void *B, int bt,
                int ldb, float beta, void *C, int ct, int ldc) {
    if (m < 0 || n < 0 || k < 0) return 7;
    if (lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1))) { fprintf(stderr, "mock cuBLAS: lda %d too small\n", lda); return 7; }
    if (ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1))) { fprintf(stderr, "mock cuBLAS: ldb %d too small\n", ldb); return 7; }
    if (ldc < (m > 1 ? m : 1)) { fprintf(stderr, "mock cuBLAS: ldc %d too small\n", ldc); return 7; }
    if (ct != 0) return 7;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0;
            for (int l = 0; l < k; l++) {
                float a = ld_elem(A, at, ta ? (size_t)i * lda + l : (size_t)l * lda + i);
                float b = ld_elem(B, bt, tb ? (size_t)l * ldb + j : (size_t)j * ldb + l);
                s += a * b;
            }
            float *c = (float *)C + (size_t)j * ldc + i;
            *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
        }
    return 0;
}
static int gemm_check(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc, int ct) {
    if (m < 0 || n < 0 || k < 0) return 7;
    if (lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1))) { fprintf(stderr, "mock cuBLAS: lda %d too small\n", lda); return 7; }
    if (ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1))) { fprintf(stderr, "mock cuBLAS: ldb %d too small\n", ldb); return 7; }
    if (ldc < (m > 1 ? m : 1)) { fprintf(stderr, "mock cuBLAS: ldc %d too small\n", ldc); return 7; }
    return ct != 0 ? 7 : 0;
}
int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc) {
    int e = gemm_check(ta, tb, m, n, k, lda, ldb, ldc, 0);
    if (e) return e;
    float al = *alpha, be = *beta;
    enqueue(((mblas *)h)->stream, [=] { gemm(ta, tb, m, n, k, al, A, 0, lda, B, 0, ldb, be, C, 0, ldc); });
    return 0;
}
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo) {
    (void)algo;
    if (compute != 68 || (at != 2 && at != 14) || bt != at) return 7;
    int e = gemm_check(ta, tb, m, n, k, lda, ldb, ldc, ct);
    if (e) return e;
    float al = *(const float *)alpha, be = *(const float *)beta;
    enqueue(((mblas *)h)->stream, [=] { gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc); });
    return 0;
}

// ---------------------------------------------------------------------------
// NCCL (one process, one thread per rank)
// ---------------------------------------------------------------------------
struct p2p { int src, dst; const void *buf; size_t bytes; bool taken; };
struct clique {
    int n;
    pthread_barrier_t bar;
    std::vector<const void *> send;
    std::vector<void *> recv;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<p2p> mail;
    int err = 0; /* asynchronous error, reported by ncclCommGetAsyncError */
    bool aborted = false;
    std::vector<int> ncoll; /* collectives run per rank (MOCK_NCCL_STALL) */
};
struct mcomm { clique *c; int rank; };
static size_t nccl_es(int t) { return t == 6 || t == 9 ? 2 : t == 2 || t == 7 ? 4 : 0; }
static float nccl_ld(const void *p, int t, size_t i) {
    switch (t) {
    case 7: return ((const float *)p)[i];
    case 6: return dk_f16_to_f32(((const uint16_t *)p)[i]);
    case 9: return dk_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return 0;
    }
}
static void nccl_st(void *p, int t, size_t i, float v) {
    switch (t) {
    case 7: ((float *)p)[i] = v; break;
    case 6: ((uint16_t *)p)[i] = dk_f32_to_f16(v); break;
    case 9: ((uint16_t *)p)[i] = dk_f32_to_bf16(v); break;
    }
}
int ncclGetVersion(int *v) { *v = 22809; return 0; }
const char *ncclGetErrorString(int r) { return r == 4 ? "invalid argument (mock)" : "mock NCCL error"; }
const char *ncclGetLastError(void *c) { (void)c; return ""; }
int ncclCommInitAll(void **comms, int n, const int *devs) {
    if (n < 1) return 4;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (devs[i] == devs[j]) { fprintf(stderr, "mock NCCL: two ranks on GPU %d\n", devs[i]); return 4; }
    static std::mutex cmu;
    static std::vector<clique *> all; /* cliques live for the process (stalled work may hold them) */
    clique *c = new clique();
    { std::lock_guard<std::mutex> l(cmu); all.push_back(c); }
    c->n = n;
    pthread_barrier_init(&c->bar, NULL, (unsigned)n);
    c->send.resize(n); c->recv.resize(n); c->ncoll.resize(n);
    for (int i = 0; i < n; i++) comms[i] = new mcomm{ c, i };
    return 0;
}
static std::vector<mcomm *> g_dead_comms; /* aborted handles stay valid for stalled work */
int ncclCommDestroy(void *c) { delete (mcomm *)c; return 0; }
int ncclCommAbort(void *c) { /* releases stalled operations; the handle stays valid for them */
    clique *q = ((mcomm *)c)->c;
    std::lock_guard<std::mutex> l(q->mu);
    q->aborted = true;
    q->cv.notify_all();
    return 0;
}
/* MOCK_NCCL_STALL=k: the k-th collective of every rank of a communicator set
   never completes (as a hung NCCL kernel) until ncclCommAbort; with
   MOCK_NCCL_STALL_ERROR=1 it also reports ncclSystemError asynchronously. */
static bool stalled(mcomm *m) {
    static int at = -1;
    if (at < 0) { const char *e = getenv("MOCK_NCCL_STALL"); at = e ? atoi(e) : 0; }
    clique *c = m->c;
    std::unique_lock<std::mutex> l(c->mu);
    if (c->aborted) return true;
    if (at <= 0 || ++c->ncoll[m->rank] != at) return false;
    if (getenv("MOCK_NCCL_STALL_ERROR")) c->err = 2;
    c->cv.wait(l, [&] { return c->aborted; });
    return true;
}
int ncclCommGetAsyncError(void *c, int *e) { *e = ((mcomm *)c)->c->err; return 0; }

// every rank publishes its buffers, then computes its own output into a
// temporary, waits for everyone to finish reading, then writes it
static void publish(mcomm *m, const void *s, void *r) {
    if (getenv("MOCK_NCCL_TRACE")) fprintf(stderr, "mock nccl: clique %p rank %d collective\n", (void *)m->c, m->rank);
    m->c->send[m->rank] = s; m->c->recv[m->rank] = r;
    pthread_barrier_wait(&m->c->bar);
}
static int reduce_into(mcomm *m, std::vector<unsigned char> &tmp, size_t count, int t, int op, size_t off) {
    size_t es = nccl_es(t);
    if (!es) return 4;
    tmp.resize(count * es + 1);
    for (size_t i = 0; i < count; i++) {
        if (t == 2) {
            int64_t acc = ((const int32_t *)m->c->send[0])[off + i];
            for (int s = 1; s < m->c->n; s++) {
                int32_t v = ((const int32_t *)m->c->send[s])[off + i];
                if (op == 2) acc = v > acc ? v : acc;
                else if (op == 3) acc = v < acc ? v : acc;
                else acc = (int32_t)((uint32_t)acc + (uint32_t)v);
            }
            if (op == 4) acc /= m->c->n;
            ((int32_t *)tmp.data())[i] = (int32_t)acc;
        } else {
            float acc = nccl_ld(m->c->send[0], t, off + i);
            for (int s = 1; s < m->c->n; s++) {
                float v = nccl_ld(m->c->send[s], t, off + i);
                if (op == 2) acc = fmaxf(acc, v);       // NCCL: NaN does not propagate
                else if (op == 3) acc = fminf(acc, v);
                else acc += v;
            }
            if (op == 4) acc /= (float)m->c->n;
            nccl_st(tmp.data(), t, i, acc);
        }
    }
    return 0;
}
static void finish(mcomm *m, void *dst, const std::vector<unsigned char> &tmp, size_t bytes) {
    pthread_barrier_wait(&m->c->bar);
    if (bytes) memcpy(dst, tmp.data(), bytes);
    pthread_barrier_wait(&m->c->bar);
}
static int nccl_check(int t, int op) { return !nccl_es(t) || op < 0 || op > 4 ? 4 : 0; }
int ncclAllReduce(const void *s, void *r, size_t count, int t, int op, void *c, void *st) {
    if (nccl_check(t, op)) return 4;
    mcomm *m = (mcomm *)c;
    enqueue(st, [=] {
        if (stalled(m)) return;
        std::vector<unsigned char> tmp;
        publish(m, s, r);
        reduce_into(m, tmp, count, t, op, 0);
        finish(m, r, tmp, count * nccl_es(t));
    });
    return 0;
}
int ncclBroadcast(const void *s, void *r, size_t count, int t, int root, void *c, void *st) {
    mcomm *m = (mcomm *)c;
    if (nccl_check(t, 0) || root < 0 || root >= m->c->n) return 4;
    enqueue(st, [=] {
        if (stalled(m)) return;
        publish(m, s, r);
        size_t b = count * nccl_es(t);
        std::vector<unsigned char> tmp(b + 1);
        if (b) memcpy(tmp.data(), m->c->send[root], b);
        finish(m, r, tmp, b);
    });
    return 0;
}
int ncclAllGather(const void *s, void *r, size_t count, int t, void *c, void *st) {
    if (nccl_check(t, 0)) return 4;
    mcomm *m = (mcomm *)c;
    enqueue(st, [=] {
        if (stalled(m)) return;
        publish(m, s, r);
        size_t b = count * nccl_es(t);
        std::vector<unsigned char> tmp(b * (size_t)m->c->n + 1);
        for (int i = 0; i < m->c->n; i++) if (b) memcpy(tmp.data() + b * (size_t)i, m->c->send[i], b);
        finish(m, r, tmp, b * (size_t)m->c->n);
    });
    return 0;
}
int ncclReduceScatter(const void *s, void *r, size_t count, int t, int op, void *c, void *st) {
    if (nccl_check(t, op)) return 4;
    mcomm *m = (mcomm *)c;
    enqueue(st, [=] {
        if (stalled(m)) return;
        std::vector<unsigned char> tmp;
        publish(m, s, r);
        reduce_into(m, tmp, count, t, op, count * (size_t)m->rank);
        finish(m, r, tmp, count * nccl_es(t));
    });
    return 0;
}
static thread_local int t_depth;
struct pending { bool send; mcomm *m; const void *sb; void *rb; size_t bytes; int peer; void *stream; };
static thread_local std::vector<pending> t_group;
int ncclSend(const void *b, size_t count, int t, int peer, void *c, void *st) {
    if (!t_depth) { fail_bad("ncclSend outside a group (the mock supports grouped p2p only)"); return 4; }
    t_group.push_back(pending{ true, (mcomm *)c, b, NULL, count * nccl_es(t), peer, st });
    return 0;
}
int ncclRecv(void *b, size_t count, int t, int peer, void *c, void *st) {
    if (!t_depth) { fail_bad("ncclRecv outside a group"); return 4; }
    t_group.push_back(pending{ false, (mcomm *)c, NULL, b, count * nccl_es(t), peer, st });
    return 0;
}
static int trace_on() { static int t = -1; if (t < 0) t = getenv("MOCK_NCCL_TRACE") != NULL; return t; }
int ncclGroupStart(void) { t_depth++; return 0; }
static int run_p2p(std::vector<pending> &t_group) {
    if (trace_on())
        for (pending &p : t_group)
            fprintf(stderr, "mock nccl: clique %p rank %d %s peer %d %zu bytes\n", (void *)p.m->c, p.m->rank,
                    p.send ? "send" : "recv", p.peer, p.bytes);
    // post the sends, then serve the receives, then wait until our sends were taken
    for (pending &p : t_group)
        if (p.send) {
            std::lock_guard<std::mutex> lock(p.m->c->mu);
            p.m->c->mail.push_back(p2p{ p.m->rank, p.peer, p.sb, p.bytes, false });
            p.m->c->cv.notify_all();
        }
    for (pending &p : t_group)
        if (!p.send) {
            clique *c = p.m->c;
            std::unique_lock<std::mutex> lock(c->mu);
            for (;;) {
                bool got = false;
                for (p2p &x : c->mail)
                    if (!x.taken && x.src == p.peer && x.dst == p.m->rank) {
                        if (x.bytes != p.bytes) { fprintf(stderr, "mock NCCL: send/recv sizes differ\n"); abort(); }
                        if (p.bytes) memcpy(p.rb, x.buf, p.bytes);
                        x.taken = true;
                        got = true;
                        break;
                    }
                if (got) break;
                if (c->cv.wait_for(lock, std::chrono::seconds(10)) == std::cv_status::timeout) {
                    fprintf(stderr, "mock NCCL: rank %d waited 10 s for a send from rank %d (a real GPU would hang)\n",
                            p.m->rank, p.peer);
                    p.m->c->err = 2;
                    return 2;
                }
            }
            c->cv.notify_all();
        }
    for (pending &p : t_group)
        if (p.send) {
            clique *c = p.m->c;
            std::unique_lock<std::mutex> lock(c->mu);
            for (;;) {
                bool done = false;
                for (size_t i = 0; i < c->mail.size(); i++)
                    if (c->mail[i].taken && c->mail[i].src == p.m->rank && c->mail[i].dst == p.peer && c->mail[i].buf == p.sb) {
                        c->mail.erase(c->mail.begin() + (long)i);
                        done = true;
                        break;
                    }
                if (done) break;
                if (c->cv.wait_for(lock, std::chrono::seconds(10)) == std::cv_status::timeout) {
                    fprintf(stderr, "mock NCCL: rank %d waited 10 s for rank %d to receive (a real GPU would hang)\n",
                            p.m->rank, p.peer);
                    p.m->c->err = 2;
                    return 2;
                }
            }
        }
    return 0;
}
int ncclGroupEnd(void) {
    if (--t_depth > 0) return 0;
    if (t_group.empty()) return 0;
    void *st = t_group[0].stream;
    for (pending &p : t_group)
        if (p.stream != st) { fprintf(stderr, "mock NCCL: one group on several streams is not supported\n"); abort(); }
    std::vector<pending> ops = std::move(t_group);
    t_group.clear();
    enqueue(st, [ops]() mutable { if (!stalled(ops[0].m)) run_p2p(ops); });
    return 0;
}

int mock_cuda_launches(void) { return g_launches; }
} // extern "C"

// MOCK_CUDA_REPORT=1: at exit, print the allocations never freed (by size).
__attribute__((destructor)) static void mock_report(void) {
    if (!getenv("MOCK_CUDA_REPORT")) return;
    std::lock_guard<std::mutex> lock(g_mu);
    fprintf(stderr, "mock cuda: %zu allocation(s) never freed, %zu freed\n", g_allocs.size(), g_quarantine.size());
    for (auto &a : g_allocs) fprintf(stderr, "mock cuda:   live allocation of %zu bytes\n", a.second);
}
