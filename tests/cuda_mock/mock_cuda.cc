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
// cuMemAllocHost blocks are pinned host memory: a device-to-host copy into
// one is asynchronous, into other (pageable) memory it returns when done.
// Streams are asynchronous, as on a GPU: each stream is a thread running its
// queue in order, with a random delay before every operation (MOCK_CUDA_
// JITTER_US, default 20) so that a missing event or stream wait shows up as
// wrong data; events and cuStreamWaitEvent order streams; NCCL operations run
// on their streams and rendezvous there; cuMemFree poisons (0xFF, NaN) and
// quarantines the memory, so work still queued on it yields NaN.
// CUDA Graphs by stream capture: between cuStreamBeginCapture_v2 and
// cuStreamEndCapture a stream's operations are recorded instead of run, and
// cuGraphLaunch enqueues the recording again (kernel parameters as they were
// at capture). Capture rules that the real driver enforces and dpar must
// respect fail here too, invalidating the capture (cuStreamEndCapture then
// returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED): synchronizing or querying a
// capturing stream, host copies on it, events recorded on or waited for by it
// (stricter than the driver, which captures events), and cuMemAlloc /
// cuMemFree on a thread whose capture is not in relaxed mode.
// NCCL: ncclCommInitAll communicators live in one process (one thread per
// rank, each rank reading the others' buffers). ncclCommInitRank (with
// ncclGetUniqueId) builds communicators whose ranks live in several
// processes, several ranks per process too (inside ncclGroupStart/End the
// init runs at ncclGroupEnd, so one thread can initialize all its ranks):
// data moves in fixed-size chunks through a POSIX shared-memory segment named
// by the unique id (unlinked as soon as every rank attached), with the same
// numeric results as the in-process path (rank-order reductions, f16/bf16
// through f32, i32 wrap-around, NaN-ignoring max/min). Two ranks of one
// communicator on the same physical GPU are refused (ncclInvalidUsage), as
// real NCCL does. Every NCCL wait is timed: a rank that never arrives makes
// the init fail (ncclSystemError) or sets the asynchronous error
// (ncclCommGetAsyncError) instead of hanging; ncclCommAbort ends any wait.
// Not emulated: the PTX itself (the kernels run as host C++), timing, and
// concurrency inside one kernel launch beyond what __syncthreads needs.
//
// Environment: MOCK_CUDA_GPUS=N (default 1) physical GPUs;
// CUDA_VISIBLE_DEVICES=i,j,... (physical ids; as CUDA, the list ends at the
// first invalid entry, and an empty list means no device) maps ordinal k to
// physical GPU list[k] (cuDeviceGetName "Mock GPU <physical id>";
// cuDeviceGetUuid is the same for one physical GPU in every process);
// MOCK_CUDA_NO_DEVICE=1 makes cuInit fail with CUDA_ERROR_NO_DEVICE;
// MOCK_CUDA_SYNC=1 runs every operation at enqueue instead (no streams);
// MOCK_CUDA_JITTER_US (default 20) the random delay before stream operations;
// MOCK_CUDA_REPORT=1 prints at exit the device allocations never freed and
// "mock nccl: N communicator rank(s) spanning processes, M collective(s)
// through shared memory" (ncclCommInitRank ranks of this process whose
// communicator has ranks in other processes, and the collectives / p2p
// groups they ran), "mock nccl: K unique id(s) made" (ncclGetUniqueId
// calls) and "mock calls: NAME N" per entry point called; MOCK_NCCL_TIMEOUT_MS (default 10000) bounds every wait of
// a cross-process communicator; MOCK_NCCL_STALL=k (MOCK_NCCL_STALL_ERROR=1)
// hangs the k-th collective of every rank until ncclCommAbort (and reports
// ncclSystemError asynchronously); MOCK_NCCL_TRACE=1 logs NCCL operations.
// Checks: a current context for allocations, copies and launches; guard
// bytes after every allocation (checked on free); frees of unknown pointers;
// BLAS leading-dimension rules; kernel names.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------
// Kernel shim
// ---------------------------------------------------------------------------
struct dim3 {
    unsigned x, y, z;
};
static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static pthread_barrier_t *g_block_bar; // all threads of the running block (its pool's)
static pthread_barrier_t *g_warp_bar;  // per warp of the running block
static double g_warp_val[32][32];
static bool g_threaded; // running a block with real threads

static void mock_syncthreads() {
    if (!g_threaded) {
        fprintf(stderr, "mock: __syncthreads in a kernel not marked threaded\n");
        abort();
    }
    pthread_barrier_wait(g_block_bar);
}
template <typename T> static T mock_shfl_xor(T v, int o) {
    if (!g_threaded) {
        fprintf(stderr, "mock: warp shuffle in a kernel not marked threaded\n");
        abort();
    }
    unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    g_warp_val[w][lane] = (double)v;
    pthread_barrier_wait(&g_warp_bar[w]);
    T r = (T)g_warp_val[w][lane ^ (unsigned)o];
    pthread_barrier_wait(&g_warp_bar[w]);
    return r;
}
#define __global__
#define __device__
#define __forceinline__             inline
#define __shared__                  static
#define __syncthreads()             mock_syncthreads()
#define __shfl_xor_sync(mask, v, o) mock_shfl_xor((v), (o))

#include "../../kernels/dpar_kernels.cu"
#include "../../kernels/elementwise.cu"
#include "../../kernels/norm_attn.cu"
#include "../../kernels/conv.cu"
#include "../../kernels/optim.cu"

// ---------------------------------------------------------------------------
// Kernel table and launcher
// ---------------------------------------------------------------------------
typedef void (*launch_fn)(void *f, void **args);
template <typename... A, size_t... I> static void call_with(void (*f)(A...), void **args, std::index_sequence<I...>) {
    f(*(typename std::remove_reference<A>::type *)args[I]...);
}
template <typename... A> static void invoke(void *f, void **args) {
    call_with((void (*)(A...))f, args, std::index_sequence_for<A...>{});
}
template <typename... A> static launch_fn launcher_of(void (*)(A...)) {
    return &invoke<A...>;
}

typedef std::vector<std::string> (*capture_fn)(void **args);
template <typename... A, size_t... I>
static std::vector<std::string> capture_with(void **args, std::index_sequence<I...>) {
    return { std::string((const char *)args[I], sizeof(typename std::remove_reference<A>::type))... };
}
template <typename... A> static std::vector<std::string> capture_args(void **args) {
    return capture_with<A...>(args, std::index_sequence_for<A...>{});
}
template <typename... A> static capture_fn capture_of(void (*)(A...)) {
    return &capture_args<A...>;
}

struct kinfo {
    const char *name;
    void *fn;
    launch_fn run;
    bool threaded;
    capture_fn capture;
};
#define K(name, thr) \
    { #name, (void *)&name, launcher_of(&name), thr, capture_of(&name) }
// one kernel per line
static const kinfo g_kernels[] = {
    K(dpar_k_scale, false),
    K(dpar_k_axpy, false),
    K(dpar_k_relu, false),
    K(dpar_k_relu_bwd, false),
    K(dpar_k_bias_add, false),
    K(dpar_k_bias_grad, true),
    K(dpar_k_bias_grad_final, false),
    K(dpar_k_cast, false),
    K(dpar_k_sgd, false),
    K(dpar_k_reduce_partial, true),
    K(dpar_k_reduce_partial_f64, true),
    K(dpar_k_mse_partial, true),
    K(dpar_k_reduce_final, true),
    K(dpar_k_xent_rows, true),
    K(dpar_k_vreduce, false),
    K(dpar_k_to_key, false),
    K(dpar_k_from_key, false),
    K(dpar_k_div_i32, false),
    K(dpar_k_copy_nd, false),
    K(dpar_k_unary, false),
    K(dpar_k_binary, false),
    K(dpar_k_reduce_axes, false),
    K(dpar_k_reduce_cols, true),
    K(dpar_k_where, false),
    K(dpar_k_softmax, false),
    K(dpar_k_strided, false),
    K(dpar_k_norm_fwd, true),
    K(dpar_k_norm_bwd, true),
    K(dpar_k_norm_wgrad, true),
    K(dpar_k_attn_fwd, true),
    K(dpar_k_attn_bwd_q, true),
    K(dpar_k_attn_bwd_kv, true),
    K(dpar_k_im2col, false),
    K(dpar_k_col2im, false),
    K(dpar_k_pool2d, false),
    K(dpar_k_pool2d_bwd, false),
    K(dpar_k_adamw, false),
    K(dpar_k_check_index, false),
    K(dpar_k_count_rows, false),
    K(dpar_k_xent_ignore_rows, true),
    K(dpar_k_div_final, false),
    K(dpar_k_embed, false),
    K(dpar_k_embed_sort, true),
    K(dpar_k_embed_merge, false),
    K(dpar_k_embed_bwd, false),
    K(dpar_k_dropout, false),
};

static std::mutex g_launch_mu; // one kernel at a time (the shim's state is global)
static int g_launches;

// Threaded kernels run each block on a pool of bx threads kept per block size (a kernel launch used to
// create bx threads per block: hundreds of thousands per test, most of the mock's time on 2 cores).
// The launcher and the pool meet at `start` and `end` (bx + 1 each) around every block.
struct block_pool {
    unsigned bx;
    pthread_barrier_t start, end, block, warp[32];
    const kinfo *k;
    void **args;
    dim3 b, gd;
};
struct pool_arg {
    block_pool *bp;
    unsigned t;
};
static void *pool_main(void *p) {
    block_pool *bp = ((pool_arg *)p)->bp;
    unsigned t = ((pool_arg *)p)->t;
    for (;;) {
        pthread_barrier_wait(&bp->start);
        threadIdx = dim3{ t, 0, 0 };
        blockIdx = bp->b;
        blockDim = dim3{ bp->bx, 1, 1 };
        gridDim = bp->gd;
        bp->k->run(bp->k->fn, bp->args);
        pthread_barrier_wait(&bp->end);
    }
    return NULL;
}
static block_pool *pool_for(unsigned bx) { /* called with g_launch_mu held */
    static std::map<unsigned, block_pool *> pools;
    block_pool *&bp = pools[bx];
    if (bp) return bp;
    bp = new block_pool();
    bp->bx = bx;
    pthread_barrier_init(&bp->start, NULL, bx + 1);
    pthread_barrier_init(&bp->end, NULL, bx + 1);
    pthread_barrier_init(&bp->block, NULL, bx);
    for (unsigned w = 0; w < bx / 32; w++) pthread_barrier_init(&bp->warp[w], NULL, 32);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (unsigned t = 0; t < bx; t++) {
        pthread_t th;
        if (pthread_create(&th, &attr, pool_main, new pool_arg{ bp, t }) || pthread_detach(th)) {
            fprintf(stderr, "mock: pthread_create\n");
            abort();
        }
    }
    pthread_attr_destroy(&attr);
    return bp;
}

static void run_kernel(const kinfo *k, unsigned gx, unsigned bx, void **args) {
    std::lock_guard<std::mutex> lock(g_launch_mu);
    g_launches++;
    dim3 gd{ gx, 1, 1 }, bd{ bx, 1, 1 };
    if (!k->threaded) {
        for (unsigned b = 0; b < gx; b++)
            for (unsigned t = 0; t < bx; t++) {
                threadIdx = dim3{ t, 0, 0 };
                blockIdx = dim3{ b, 0, 0 };
                blockDim = bd;
                gridDim = gd;
                k->run(k->fn, args);
            }
        return;
    }
    if (bx % 32) {
        fprintf(stderr, "mock: threaded kernel %s with block %u\n", k->name, bx);
        abort();
    }
    block_pool *bp = pool_for(bx);
    g_threaded = true;
    g_block_bar = &bp->block;
    g_warp_bar = bp->warp;
    bp->k = k;
    bp->args = args;
    bp->gd = gd;
    for (unsigned b = 0; b < gx; b++) {
        bp->b = dim3{ b, 0, 0 };
        pthread_barrier_wait(&bp->start);
        pthread_barrier_wait(&bp->end);
    }
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
    /* stream capture (CUDA Graphs): changed and recorded into by the capturing thread (cap_thread) only;
       `capturing` is read by every thread, so that another thread's operation on the stream is caught */
    std::atomic<bool> capturing{ false };
    bool cap_invalid = false;
    std::thread::id cap_thread;
    std::vector<std::function<void()>> cap;
};
struct mgraph {
    std::vector<std::function<void()>> ops;
};
static thread_local int t_strict_captures; /* captures of this thread not in relaxed mode */
struct mevent {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t rec = 0, comp = 0;
};
static int jitter_us() {
    static int j = -1;
    if (j < 0) {
        const char *e = getenv("MOCK_CUDA_JITTER_US");
        j = e ? atoi(e) : 20;
    }
    return j;
}
static bool sync_mode() {
    static int m = -1;
    if (m < 0) m = getenv("MOCK_CUDA_SYNC") != NULL;
    return m;
}
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
/* Another thread's operation on a capturing stream: the real driver (relaxed mode) silently captures it into
   that thread's graph, where it runs at every replay instead of once, and an event it records can then be
   waited for only inside that capture (another device's stream gets CUDA_ERROR_STREAM_CAPTURE_MERGE, as a
   communication thread's collective did on an H200). dpar never means it, so it is fatal here. */
static void cap_foreign(mstream *s, const char *what) {
    if (!s || !s->capturing.load() || s->cap_thread == std::this_thread::get_id()) return;
    fprintf(stderr,
            "mock cuda: %s on a stream that another thread is capturing (it would land in that thread's "
            "CUDA Graph)\n",
            what);
    abort();
}
static void enqueue(void *sv, std::function<void()> f) {
    mstream *s = (mstream *)sv;
    cap_foreign(s, "an operation");
    if (s && s->capturing) {
        /* capture costs host time on the real driver (graph-node bookkeeping, cuBLAS's own calls): without
           it here, the window in which another thread's call lands in a capture would be too short to see */
        static thread_local unsigned seed = (unsigned)(uintptr_t)&seed;
        if (jitter_us() > 0) std::this_thread::sleep_for(std::chrono::microseconds(rand_r(&seed) % (jitter_us() + 1)));
        s->cap.push_back(std::move(f));
        return;
    }
    if (!s || sync_mode()) {
        f();
        return;
    }
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
enum {
    OK = 0,
    ERR_INVALID_VALUE = 1,
    ERR_OOM = 2,
    ERR_NOT_INIT = 3,
    ERR_NO_DEVICE = 100,
    ERR_INVALID_DEVICE = 101,
    ERR_INVALID_CONTEXT = 201,
    ERR_NOT_FOUND = 500,
    ERR_CAPTURE_UNSUPPORTED = 900,
    ERR_CAPTURE_INVALIDATED = 901,
    ERR_CAPTURE_ISOLATION = 905
};
/* An operation stream capture forbids on a capturing stream: the capture is invalidated. */
static bool cap_refuse(void *sv) {
    mstream *s = (mstream *)sv;
    cap_foreign(s, "a synchronization, host copy or event");
    if (!s || !s->capturing) return false;
    s->cap_invalid = true;
    return true;
}
static const size_t GUARD = 64;
static std::mutex g_mu;
static std::map<uintptr_t, size_t> g_allocs;
static std::vector<void *> g_quarantine;
static std::map<uintptr_t, size_t> g_pinned; /* cuMemAllocHost blocks */
static int g_inited, g_ngpu = 1;
static int g_phys[16] = { 0 }; /* ordinal -> physical mock GPU (CUDA_VISIBLE_DEVICES) */
struct CUuuid {
    char bytes[16];
};
struct mock_ctx {
    int dev;
    int refs;
}; /* dev: the ordinal */
static mock_ctx g_ctx[16];
static thread_local mock_ctx *t_cur;

static int fail_bad(const char *what) {
    fprintf(stderr, "mock cuda: %s\n", what);
    return ERR_INVALID_VALUE;
}
#define NEED_CTX()                                                                  \
    do {                                                                            \
        if (!t_cur) {                                                               \
            fprintf(stderr, "mock cuda: %s without a current context\n", __func__); \
            return ERR_INVALID_CONTEXT;                                             \
        }                                                                           \
    } while (0)

// checks [p, p+n) lies inside one allocation
static bool in_alloc(CUdeviceptr p, size_t n) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return false;
    --it;
    return (uintptr_t)p >= it->first && (uintptr_t)p + n <= it->first + it->second;
}

// MOCK_CUDA_REPORT: how often each API entry point was called (its first
// call registers its counter; the report lists them by name).
struct call_count {
    const char *name;
    unsigned long n = 0; /* atomic */
    call_count *next;
    explicit call_count(const char *nm);
};
static call_count *g_counts; /* atomic list head */
call_count::call_count(const char *nm) : name(nm), next(NULL) {
    next = __atomic_load_n(&g_counts, __ATOMIC_ACQUIRE);
    while (!__atomic_compare_exchange_n(&g_counts, &next, this, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
}
/* The calls of entry point `name` so far (0: never called): tests/cuda_mock/step_calls.c
   takes its per-step counts from it (dlsym on libcuda.so.1). */
extern "C" unsigned long mock_cuda_calls(const char *name) {
    for (call_count *c = __atomic_load_n(&g_counts, __ATOMIC_ACQUIRE); c; c = c->next)
        if (strcmp(c->name, name) == 0) return __atomic_load_n(&c->n, __ATOMIC_RELAXED);
    return 0;
}
#define COUNT_AS(name)                                      \
    do {                                                    \
        static call_count count_(name);                     \
        __atomic_add_fetch(&count_.n, 1, __ATOMIC_RELAXED); \
    } while (0)
#define COUNT_CALL() COUNT_AS(__func__)

extern "C" {
CUresult cuInit(unsigned flags) {
    COUNT_CALL();
    (void)flags;
    const char *nd = getenv("MOCK_CUDA_NO_DEVICE");
    if (nd && *nd == '1') return ERR_NO_DEVICE;
    const char *g = getenv("MOCK_CUDA_GPUS");
    int nphys = g && atoi(g) > 0 && atoi(g) <= 16 ? atoi(g) : 1;
    /* CUDA_VISIBLE_DEVICES: physical ids, comma-separated; like CUDA, the list
       ends at the first invalid entry (not a number, out of range, repeated) */
    int n = 0;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (n = 0; n < nphys; n++) g_phys[n] = n;
    } else {
        const char *p = v;
        while (*p && n < nphys) {
            char *end;
            long id = strtol(p, &end, 10);
            bool bad = end == p || id < 0 || id >= nphys || (*end && *end != ',');
            for (int i = 0; i < n && !bad; i++) bad = g_phys[i] == id;
            if (bad) break;
            g_phys[n++] = (int)id;
            if (!*end) break;
            p = end + 1;
        }
    }
    if (n == 0) return ERR_NO_DEVICE;
    g_ngpu = n;
    g_inited = 1;
    return OK;
}
CUresult cuDriverGetVersion(int *v) {
    COUNT_CALL();
    *v = 13000;
    return OK;
}
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
CUresult cuDeviceGetCount(int *n) {
    COUNT_CALL();
    if (!g_inited) return ERR_NOT_INIT;
    *n = g_ngpu;
    return OK;
}
CUresult cuDeviceGet(int *d, int i) {
    COUNT_CALL();
    if (i < 0 || i >= g_ngpu) return ERR_INVALID_DEVICE;
    *d = i;
    return OK;
}
CUresult cuDeviceGetName(char *s, int len, int d) {
    COUNT_CALL();
    if (d < 0 || d >= g_ngpu) return ERR_INVALID_DEVICE;
    snprintf(s, (size_t)len, "Mock GPU %d", g_phys[d]);
    return OK;
}
/* the same 16 bytes for one physical mock GPU in every process */
CUresult cuDeviceGetUuid(CUuuid *u, int d) {
    COUNT_CALL();
    if (!u) return ERR_INVALID_VALUE;
    if (d < 0 || d >= g_ngpu) return ERR_INVALID_DEVICE;
    char b[17];
    snprintf(b, sizeof b, "MOCKGPU%09u", (unsigned)g_phys[d] % 1000000000u);
    memcpy(u->bytes, b, 16);
    return OK;
}
CUresult cuDeviceGetUuid_v2(CUuuid *u, int d) {
    COUNT_CALL();
    return cuDeviceGetUuid(u, d);
}
CUresult cuDeviceTotalMem_v2(size_t *b, int d) {
    COUNT_CALL();
    (void)d;
    *b = (size_t)1 << 34;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
    COUNT_CALL();
    (void)d;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : 0;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
    COUNT_CALL();
    if (d < 0 || d >= g_ngpu) return ERR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lock(g_mu);
    g_ctx[d].dev = d;
    g_ctx[d].refs++;
    *c = &g_ctx[d];
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) {
    COUNT_CALL();
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_ctx[d].refs <= 0) return fail_bad("cuDevicePrimaryCtxRelease without retain");
    g_ctx[d].refs--;
    return OK;
}
CUresult cuCtxSetCurrent(void *c) {
    COUNT_CALL();
    t_cur = (mock_ctx *)c;
    return OK;
}
CUresult cuStreamCreate(void **s, unsigned f) {
    COUNT_CALL();
    NEED_CTX();
    (void)f;
    mstream *m = new mstream();
    m->th = std::thread(stream_loop, m);
    *s = m;
    return OK;
}
CUresult cuStreamDestroy_v2(void *s) {
    COUNT_CALL();
    mstream *m = (mstream *)s;
    stream_sync(m);
    {
        std::lock_guard<std::mutex> l(m->mu);
        m->stop = true;
        m->cv.notify_all();
    }
    m->th.join();
    delete m;
    return OK;
}
CUresult cuStreamSynchronize(void *s) {
    COUNT_CALL();
    if (cap_refuse(s)) return ERR_CAPTURE_UNSUPPORTED;
    stream_sync(s);
    return OK;
}
CUresult cuStreamQuery(void *s) {
    COUNT_CALL();
    if (cap_refuse(s)) return ERR_CAPTURE_UNSUPPORTED;
    mstream *m = (mstream *)s;
    std::lock_guard<std::mutex> l(m->mu);
    return m->done == m->enq ? OK : 600;
}
CUresult cuEventCreate(void **e, unsigned f) {
    COUNT_CALL();
    NEED_CTX();
    (void)f;
    *e = new mevent();
    return OK;
}
CUresult cuEventDestroy_v2(void *e) {
    COUNT_CALL();
    delete (mevent *)e;
    return OK;
}
CUresult cuEventRecord(void *ev, void *s) {
    COUNT_CALL();
    mevent *e = (mevent *)ev;
    if (!e) return ERR_INVALID_VALUE;
    if (cap_refuse(s)) return ERR_CAPTURE_UNSUPPORTED;
    uint64_t g;
    {
        std::lock_guard<std::mutex> l(e->mu);
        g = ++e->rec;
    }
    enqueue(s, [e, g] {
        std::lock_guard<std::mutex> l(e->mu);
        if (e->comp < g) e->comp = g;
        e->cv.notify_all();
    });
    return OK;
}
CUresult cuEventQuery(void *ev) {
    COUNT_CALL();
    mevent *e = (mevent *)ev;
    std::lock_guard<std::mutex> l(e->mu);
    return e->comp >= e->rec ? OK : 600;
}
CUresult cuStreamWaitEvent(void *s, void *ev, unsigned f) {
    COUNT_CALL();
    (void)f;
    mevent *e = (mevent *)ev;
    if (!e) return ERR_INVALID_VALUE;
    if (cap_refuse(s)) return ERR_CAPTURE_ISOLATION; /* an event recorded outside the capture */
    uint64_t g;
    {
        std::lock_guard<std::mutex> l(e->mu);
        g = e->rec;
    }
    enqueue(s, [e, g] {
        std::unique_lock<std::mutex> l(e->mu);
        e->cv.wait(l, [&] { return e->comp >= g; });
    });
    return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    COUNT_CALL();
    NEED_CTX();
    if (t_strict_captures) return ERR_CAPTURE_UNSUPPORTED; /* only relaxed mode allows it */
    if (n == 0) return ERR_INVALID_VALUE;                  // as the real driver
    unsigned char *m = (unsigned char *)aligned_alloc(256, (n + GUARD + 255) / 256 * 256);
    if (!m) return ERR_OOM;
    memset(m, 0xA5, n); // not zeroed, like device memory
    memset(m + n, 0x5A, GUARD);
    std::lock_guard<std::mutex> lock(g_mu);
    g_allocs[(uintptr_t)m] = n;
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    COUNT_CALL();
    NEED_CTX();
    if (t_strict_captures) return ERR_CAPTURE_UNSUPPORTED;
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) {
        fprintf(stderr, "mock cuda: cuMemFree of unknown pointer %llx\n", p);
        abort();
    }
    unsigned char *m = (unsigned char *)(uintptr_t)p;
    for (size_t i = 0; i < GUARD; i++)
        if (m[it->second + i] != 0x5A) {
            fprintf(stderr, "mock cuda: guard bytes after a %zu-byte allocation were overwritten\n", it->second);
            abort();
        }
    memset(m, 0xFF, it->second); /* poisoned and never reused: late readers see NaN */
    g_quarantine.push_back(m);   /* kept reachable (not a leak for LeakSanitizer) */
    g_allocs.erase(it);
    return OK;
}
#define CHECK_RANGE(p, n)                                                                                             \
    do {                                                                                                              \
        if ((n) != 0 && !in_alloc((p), (n))) {                                                                        \
            fprintf(stderr, "mock cuda: %s: [%llx, +%zu) is outside every allocation\n", __func__, (p), (size_t)(n)); \
            abort();                                                                                                  \
        }                                                                                                             \
    } while (0)
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void *s) {
    COUNT_CALL();
    NEED_CTX();
    CHECK_RANGE(p, n);
    enqueue(s, [=] { memset((void *)(uintptr_t)p, v, n); });
    return OK;
}
CUresult cuMemsetD16Async(CUdeviceptr p, unsigned short v, size_t n, void *s) {
    COUNT_CALL();
    NEED_CTX();
    CHECK_RANGE(p, 2 * n);
    enqueue(s, [=] {
        for (size_t i = 0; i < n; i++) ((unsigned short *)(uintptr_t)p)[i] = v;
    });
    return OK;
}
CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, size_t n, void *s) {
    COUNT_CALL();
    NEED_CTX();
    CHECK_RANGE(p, 4 * n);
    enqueue(s, [=] {
        for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)p)[i] = v;
    });
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) {
    COUNT_CALL();
    NEED_CTX();
    if (cap_refuse(s)) return ERR_CAPTURE_UNSUPPORTED; /* pageable host memory */
    CHECK_RANGE(d, n);
    /* pageable source: staged at the call, as the driver does */
    std::vector<unsigned char> data((const unsigned char *)h, (const unsigned char *)h + n);
    enqueue(s, [=] { memcpy((void *)(uintptr_t)d, data.data(), n); });
    return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) {
    COUNT_CALL();
    NEED_CTX();
    if (cap_refuse(s)) return ERR_CAPTURE_UNSUPPORTED;
    CHECK_RANGE(d, n);
    bool pinned;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        auto it = g_pinned.upper_bound((uintptr_t)h);
        pinned = it != g_pinned.begin() && (uintptr_t)h + n <= (--it)->first + it->second;
    }
    enqueue(s, [=] { memcpy(h, (const void *)(uintptr_t)d, n); });
    if (pinned) return OK; /* asynchronous, as the driver's */
    /* pageable destination: returns when the copy is done, as the driver does */
    COUNT_AS("cuMemcpyDtoHAsync_v2:pageable"); /* the host waits for the stream */
    stream_sync(s);
    return OK;
}
CUresult cuMemAllocHost_v2(void **p, size_t n) {
    COUNT_CALL();
    NEED_CTX();
    if (!p || n == 0) return ERR_INVALID_VALUE;
    *p = malloc(n);
    if (!*p) return ERR_OOM;
    std::lock_guard<std::mutex> lock(g_mu);
    g_pinned[(uintptr_t)*p] = n;
    return OK;
}
CUresult cuMemFreeHost(void *p) {
    COUNT_CALL();
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_pinned.erase((uintptr_t)p)) {
        fprintf(stderr, "mock cuda: cuMemFreeHost of unknown pointer %p\n", p);
        abort();
    }
    free(p);
    return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr sp, size_t n, void *s) {
    COUNT_CALL();
    NEED_CTX();
    CHECK_RANGE(d, n);
    CHECK_RANGE(sp, n);
    enqueue(s, [=] { memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)sp, n); });
    return OK;
}
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *opts, void **vals) {
    COUNT_CALL();
    NEED_CTX();
    (void)n;
    (void)opts;
    (void)vals;
    if (!strstr((const char *)img, ".visible .entry dpar_k_")) return fail_bad("module image is not the dpar PTX");
    *m = malloc(8);
    return OK;
}
CUresult cuModuleUnload(void *m) {
    COUNT_CALL();
    free(m);
    return OK;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    COUNT_CALL();
    (void)m;
    for (const kinfo &k : g_kernels)
        if (strcmp(k.name, name) == 0) {
            *f = (void *)&k;
            return OK;
        }
    return ERR_NOT_FOUND;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *s, void **args, void **extra) {
    COUNT_CALL();
    COUNT_CALL();
    NEED_CTX();
    (void)shmem;
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
// CUDA Graphs through stream capture
// ---------------------------------------------------------------------------
CUresult cuStreamBeginCapture_v2(void *sv, int mode) {
    COUNT_CALL();
    NEED_CTX();
    mstream *s = (mstream *)sv;
    if (!s || mode < 0 || mode > 2) return ERR_INVALID_VALUE;
    if (s->capturing) return ERR_CAPTURE_UNSUPPORTED;
    s->cap_invalid = false;
    s->cap.clear();
    s->cap_thread = std::this_thread::get_id();
    s->capturing = true;
    if (mode != 2) t_strict_captures++;
    return OK;
}
CUresult cuStreamEndCapture(void *sv, void **graph) {
    COUNT_CALL();
    mstream *s = (mstream *)sv;
    if (!s || !graph) return ERR_INVALID_VALUE;
    *graph = NULL;
    if (!s->capturing) return ERR_INVALID_VALUE;
    s->capturing = false;
    if (t_strict_captures) t_strict_captures--;
    if (s->cap_invalid) {
        s->cap.clear();
        return ERR_CAPTURE_INVALIDATED;
    }
    mgraph *g = new mgraph();
    g->ops.swap(s->cap);
    *graph = g;
    return OK;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    COUNT_CALL();
    if (!exec || !graph || flags) return ERR_INVALID_VALUE;
    *exec = new mgraph(*(mgraph *)graph); /* independent of the graph from now on, as the driver's */
    return OK;
}
CUresult cuGraphLaunch(void *exec, void *s) {
    COUNT_CALL();
    NEED_CTX();
    if (!exec || !s) return ERR_INVALID_VALUE;
    if (cap_refuse(s)) return ERR_CAPTURE_UNSUPPORTED;
    for (const std::function<void()> &f : ((mgraph *)exec)->ops) enqueue(s, f);
    return OK;
}
CUresult cuGraphExecDestroy(void *exec) {
    COUNT_CALL();
    delete (mgraph *)exec;
    return OK;
}
CUresult cuGraphDestroy(void *graph) {
    COUNT_CALL();
    delete (mgraph *)graph;
    return OK;
}

// ---------------------------------------------------------------------------
// cuBLAS (column major, as the real one)
// ---------------------------------------------------------------------------
struct mblas {
    void *stream;
};
int cublasCreate_v2(void **h) {
    COUNT_CALL();
    if (!t_cur) return 1;
    *h = new mblas{ NULL };
    return 0;
}
int cublasDestroy_v2(void *h) {
    COUNT_CALL();
    delete (mblas *)h;
    return 0;
}
int cublasSetStream_v2(void *h, void *s) {
    COUNT_CALL();
    ((mblas *)h)->stream = s;
    return 0;
}
const char *cublasGetStatusString(int s) {
    return s == 7 ? "CUBLAS_STATUS_INVALID_VALUE" : "mock cuBLAS status";
}
static float ld_elem(const void *p, int t, size_t i) { /* t: CUDA_R_32F 0, _16F 2, _16BF 14 */
    if (t == 0) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == 2 ? dk_f16_to_f32(h) : dk_bf16_to_f32(h);
}
static int gemm(int ta, int tb, int m, int n, int k, float alpha, const void *A, int at, int lda, const void *B, int bt,
                int ldb, float beta, void *C, int ct, int ldc) {
    if (m < 0 || n < 0 || k < 0) return 7;
    if (lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1))) {
        fprintf(stderr, "mock cuBLAS: lda %d too small\n", lda);
        return 7;
    }
    if (ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1))) {
        fprintf(stderr, "mock cuBLAS: ldb %d too small\n", ldb);
        return 7;
    }
    if (ldc < (m > 1 ? m : 1)) {
        fprintf(stderr, "mock cuBLAS: ldc %d too small\n", ldc);
        return 7;
    }
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
    if (lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1))) {
        fprintf(stderr, "mock cuBLAS: lda %d too small\n", lda);
        return 7;
    }
    if (ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1))) {
        fprintf(stderr, "mock cuBLAS: ldb %d too small\n", ldb);
        return 7;
    }
    if (ldc < (m > 1 ? m : 1)) {
        fprintf(stderr, "mock cuBLAS: ldc %d too small\n", ldc);
        return 7;
    }
    return ct != 0 ? 7 : 0;
}
int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc) {
    COUNT_CALL();
    COUNT_CALL();
    int e = gemm_check(ta, tb, m, n, k, lda, ldb, ldc, 0);
    if (e) return e;
    float al = *alpha, be = *beta;
    enqueue(((mblas *)h)->stream, [=] { gemm(ta, tb, m, n, k, al, A, 0, lda, B, 0, ldb, be, C, 0, ldc); });
    return 0;
}
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo) {
    COUNT_CALL();
    COUNT_CALL();
    (void)algo;
    if (compute != 68 || (at != 2 && at != 14) || bt != at) return 7;
    int e = gemm_check(ta, tb, m, n, k, lda, ldb, ldc, ct);
    if (e) return e;
    float al = *(const float *)alpha, be = *(const float *)beta;
    enqueue(((mblas *)h)->stream, [=] { gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc); });
    return 0;
}

// ---------------------------------------------------------------------------
// NCCL. ncclCommInitAll: ranks in one process, one thread per rank (a
// clique: the ranks read each other's buffers directly). ncclCommInitRank:
// ranks in any processes, several per process too, through a POSIX
// shared-memory segment (see "NCCL across processes" below).
// ---------------------------------------------------------------------------
struct p2p {
    int src, dst;
    const void *buf;
    size_t bytes;
    bool taken;
};
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
struct xseg;
struct mcomm {
    clique *c; /* ncclCommInitAll; NULL for ncclCommInitRank */
    int rank, n;
    int dev = -1; /* the ordinal of its GPU */
    /* ncclCommInitRank only */
    std::string xname;      /* the shared-memory segment */
    xseg *x = nullptr;      /* attached: from a successful init until the last reference goes */
    int phys = -1;          /* physical mock GPU */
    int ready = 0;          /* the init completed */
    int err = 0;            /* asynchronous error (atomic) */
    int aborted = 0;        /* ncclCommAbort (atomic) */
    bool spans = false;     /* has ranks in other processes */
    bool destroyed = false; /* ncclCommDestroy ran */
    bool handle_ref = true; /* the handle's reference is still held (g_xmu) */
    int refs = 1;           /* the handle + queued operations (g_xmu) */
    unsigned seq = 0;       /* collective rounds run (slot parity); its stream's thread only */
    int ncoll = 0;          /* MOCK_NCCL_STALL */
    std::mutex smu;
    std::condition_variable scv;
    mcomm(clique *c_, int rank_, int n_) : c(c_), rank(rank_), n(n_) {}
};
static size_t nccl_es(int t) {
    return t == 6 || t == 9 ? 2 : t == 2 || t == 7 ? 4 : 0;
}
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
/* dst[i] = src[0][off+i] op ... op src[n-1][off+i], in rank order (both paths) */
static void reduce_elems(const void *const *src, int n, void *dst, size_t count, int t, int op, size_t off) {
    for (size_t i = 0; i < count; i++) {
        if (t == 2) {
            int64_t acc = ((const int32_t *)src[0])[off + i];
            for (int s = 1; s < n; s++) {
                int32_t v = ((const int32_t *)src[s])[off + i];
                if (op == 2)
                    acc = v > acc ? v : acc;
                else if (op == 3)
                    acc = v < acc ? v : acc;
                else
                    acc = (int32_t)((uint32_t)acc + (uint32_t)v);
            }
            if (op == 4) acc /= n;
            ((int32_t *)dst)[i] = (int32_t)acc;
        } else {
            float acc = nccl_ld(src[0], t, off + i);
            for (int s = 1; s < n; s++) {
                float v = nccl_ld(src[s], t, off + i);
                if (op == 2)
                    acc = fmaxf(acc, v); // NCCL: NaN does not propagate
                else if (op == 3)
                    acc = fminf(acc, v);
                else
                    acc += v;
            }
            if (op == 4) acc /= (float)n;
            nccl_st(dst, t, i, acc);
        }
    }
}
static int trace_on() {
    static int t = -1;
    if (t < 0) t = getenv("MOCK_NCCL_TRACE") != NULL;
    return t;
}

// ---------------------------------------------------------------------------
// NCCL across processes (ncclCommInitRank). ncclGetUniqueId names a POSIX
// shared-memory segment; the first rank to arrive creates it (O_EXCL), the
// last one to attach unlinks the name, so nothing stays in /dev/shm. Layout:
// header | two XSLOT slots per rank (collectives: every rank copies its chunk
// in, one barrier, every rank reads all slots and writes its own output; the
// slots alternate, so one barrier per chunk suffices) | an XRING ring per
// ordered pair of ranks (grouped send/recv: a byte stream, every message led
// by its 8-byte size). Waits use a futex "doorbell" word that every change
// bumps; every wait is timed (MOCK_NCCL_TIMEOUT_MS) and ncclCommAbort ends it.
// ---------------------------------------------------------------------------
enum { XMAXR = 64 };
static const size_t XSLOT = 128 << 10, XRING = 64 << 10, XRINGHDR = 128, XHDR = 4096;
static const uint32_t XMAGIC = 0x584d434bu;
static const char XIDMAGIC[8] = { 'D', 'P', 'A', 'R', 'M', 'O', 'C', 'K' };
struct xhdr {
    uint32_t magic; /* XMAGIC once the creator initialized it */
    int32_t nranks;
    uint32_t bell, waiters; /* futex doorbell; threads sleeping on it */
    uint32_t njoined;
    int32_t failed;   /* the init failed for everyone (an NCCL error code) */
    uint32_t aborted; /* some rank aborted or failed a wait: the others stop waiting */
    uint32_t bar_count, bar_gen;
    uint32_t joined[XMAXR];
    int32_t gpu[XMAXR], pid[XMAXR];
};
static_assert(sizeof(xhdr) <= XHDR, "xhdr too big");
struct xseg {
    std::string name;
    unsigned char *base;
    size_t size;
    int refs;
    bool warned;
};
static std::mutex g_xmu; /* the segments attached here; mcomm refs */
static std::vector<xseg *> g_xsegs;
static std::vector<mcomm *> g_xdead; /* aborted handles stay valid */
static int g_xranks, g_xops;         /* MOCK_CUDA_REPORT */
#define XLD(p)     __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define XST(p, v)  __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define XADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define XSUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_SEQ_CST)

static size_t xsize(int n) {
    return XHDR + (size_t)n * 2 * XSLOT + (size_t)n * (size_t)n * (XRINGHDR + XRING);
}
static xhdr *xh(mcomm *m) {
    return (xhdr *)m->x->base;
}
static unsigned char *xslot(mcomm *m, int r, unsigned par) {
    return m->x->base + XHDR + ((size_t)r * 2 + par) * XSLOT;
}
/* ring src -> dst: head (bytes written, by src) at 0, tail (bytes read, by dst) at 64, data at XRINGHDR */
static unsigned char *xring(mcomm *m, int src, int dst) {
    return m->x->base + XHDR + (size_t)m->n * 2 * XSLOT +
           ((size_t)src * (size_t)m->n + (size_t)dst) * (XRINGHDR + XRING);
}
static long xtimeout_ms() {
    const char *e = getenv("MOCK_NCCL_TIMEOUT_MS");
    long v = e ? atol(e) : 0;
    return v > 0 ? v : 10000;
}
static double xnow_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
/* ThreadSanitizer cannot see the futexes and atomics of this (uninstrumented)
   library: tell it about the orderings, so ranks of one process copying
   through the segment on their stream threads are not reported as races */
extern "C" void __tsan_acquire(void *addr) __attribute__((weak));
extern "C" void __tsan_release(void *addr) __attribute__((weak));
static void xacq(void *a) {
    if (__tsan_acquire) __tsan_acquire(a);
}
static void xrel(void *a) {
    if (__tsan_release) __tsan_release(a);
}
static void xbell(xhdr *h) {
    XADD(&h->bell, 1u);
    if (XLD(&h->waiters)) syscall(SYS_futex, &h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
static void xsleep(xhdr *h, uint32_t bell, double left_ms) { /* until the bell moves from `bell`, at most left_ms */
    if (left_ms > 100) left_ms = 100;
    struct timespec ts = { 0, (long)(left_ms * 1e6) };
    XADD(&h->waiters, 1u);
    syscall(SYS_futex, &h->bell, FUTEX_WAIT, bell, &ts, NULL, 0);
    XSUB(&h->waiters, 1u);
}
enum { XW_OK, XW_ABORTED, XW_TIMEOUT, XW_PEER };
/* waits until ready(); m (may be NULL): its ncclCommAbort ends the wait */
extern "C++" { /* templates */
template <class P> static int xwait(xhdr *h, mcomm *m, double deadline, P ready) {
    for (;;) {
        uint32_t b = XLD(&h->bell);
        if (ready()) return XW_OK;
        if (m && XLD(&m->aborted)) return XW_ABORTED;
        if (XLD(&h->aborted) || XLD(&h->failed)) return XW_PEER;
        double left = deadline - xnow_ms();
        if (left <= 0) return XW_TIMEOUT;
        xsleep(h, b, left);
    }
}
}
/* a failed wait: the asynchronous error, and the communicator is broken for
   every rank (the others stop waiting instead of using stale data) */
static void xfail(mcomm *m, int r, const char *what) {
    if (r == XW_ABORTED) return;
    if (r == XW_TIMEOUT)
        fprintf(stderr, "mock NCCL: rank %d waited %ld ms %s (a real GPU would hang)\n", m->rank, xtimeout_ms(), what);
    else
        fprintf(stderr, "mock NCCL: rank %d: another rank failed or aborted the communicator (%s)\n", m->rank, what);
    XST(&m->err, 2);
    XST(&xh(m)->aborted, 1u);
    xbell(xh(m));
}
static bool xbarrier(mcomm *m, const char *what) {
    xhdr *h = xh(m);
    if (XLD(&h->aborted)) {
        xfail(m, XLD(&m->aborted) ? XW_ABORTED : XW_PEER, what);
        return false;
    }
    uint32_t g = XLD(&h->bar_gen);
    xrel(&h->bar_gen);
    if (XADD(&h->bar_count, 1u) == (uint32_t)m->n) {
        XST(&h->bar_count, 0u);
        XADD(&h->bar_gen, 1u);
        xbell(h);
    } else {
        int r = xwait(h, m, xnow_ms() + (double)xtimeout_ms(), [&] { return XLD(&h->bar_gen) != g; });
        if (r) {
            xfail(m, r, what);
            return false;
        }
    }
    xacq(&h->bar_gen);
    return true;
}
static void xseg_release(xseg *s) {
    std::lock_guard<std::mutex> l(g_xmu);
    if (--s->refs > 0) return;
    munmap(s->base, s->size);
    for (size_t i = 0; i < g_xsegs.size(); i++)
        if (g_xsegs[i] == s) {
            g_xsegs.erase(g_xsegs.begin() + (long)i);
            break;
        }
    delete s;
}
static void xforget_dead(mcomm *m) { /* g_xmu held */
    for (size_t i = 0; i < g_xdead.size(); i++)
        if (g_xdead[i] == m) {
            g_xdead.erase(g_xdead.begin() + (long)i);
            break;
        }
}
static void xhold(mcomm *m) {
    std::lock_guard<std::mutex> l(g_xmu);
    m->refs++;
}
static void xdrop(mcomm *m) { /* the last reference unmaps (last local rank) and frees a destroyed handle */
    xseg *s;
    bool del;
    {
        std::lock_guard<std::mutex> l(g_xmu);
        if (--m->refs > 0) return;
        s = m->x;
        m->x = NULL;
        del = m->destroyed;
        if (del) xforget_dead(m);
    }
    if (s) xseg_release(s);
    if (del) delete m;
}
static int stall_at() {
    static int at = -1;
    if (at < 0) {
        const char *e = getenv("MOCK_NCCL_STALL");
        at = e ? atoi(e) : 0;
    }
    return at;
}
static bool xstalled(mcomm *m) { /* MOCK_NCCL_STALL, as for ncclCommInitAll communicators */
    int at = stall_at();
    std::unique_lock<std::mutex> l(m->smu);
    if (XLD(&m->aborted)) return true;
    if (at <= 0 || ++m->ncoll != at) return false;
    if (getenv("MOCK_NCCL_STALL_ERROR")) XST(&m->err, 2);
    m->scv.wait(l, [&] { return XLD(&m->aborted) != 0; });
    return true;
}
static bool xusable(mcomm *m) {
    return m->x && m->ready && !XLD(&m->aborted) && !XLD(&m->err);
}
static int xready(mcomm *m, const char *fn) {
    if (m->ready || XLD(&m->aborted)) return 0;
    fprintf(stderr, "mock NCCL: %s on a communicator whose ncclCommInitRank did not succeed\n", fn);
    return 5;
}
/* runs body on the stream, holding the communicator (and its mapping) */
extern "C++" {
template <class F> static void xenqueue(mcomm *m, void *st, const char *what, F body) {
    xhold(m);
    enqueue(st, [m, what, body]() mutable {
        if (!xstalled(m) && xusable(m)) {
            if (trace_on()) fprintf(stderr, "mock nccl: %s rank %d %s\n", m->xname.c_str(), m->rank, what);
            if (m->spans) XADD(&g_xops, 1);
            body();
        }
        xdrop(m);
    });
}
}
static int xallreduce(const void *s, void *r, size_t count, int t, int op, mcomm *m, void *st) {
    if (int e = xready(m, "ncclAllReduce")) return e;
    xenqueue(m, st, "all-reduce", [=] {
        size_t es = nccl_es(t), chunk = XSLOT / es;
        const void *src[XMAXR];
        for (size_t off = 0; off < count; off += chunk) {
            size_t len = count - off < chunk ? count - off : chunk;
            unsigned par = m->seq++ & 1;
            memcpy(xslot(m, m->rank, par), (const unsigned char *)s + off * es, len * es);
            if (!xbarrier(m, "in ncclAllReduce")) return;
            for (int i = 0; i < m->n; i++) src[i] = xslot(m, i, par);
            reduce_elems(src, m->n, (unsigned char *)r + off * es, len, t, op, 0);
        }
    });
    return 0;
}
static int xbroadcast(const void *s, void *r, size_t count, int t, int root, mcomm *m, void *st) {
    if (int e = xready(m, "ncclBroadcast")) return e;
    xenqueue(m, st, "broadcast", [=] {
        size_t b = count * nccl_es(t);
        for (size_t off = 0; off < b; off += XSLOT) {
            size_t len = b - off < XSLOT ? b - off : XSLOT;
            unsigned par = m->seq++ & 1;
            if (m->rank == root) memcpy(xslot(m, root, par), (const unsigned char *)s + off, len);
            if (!xbarrier(m, "in ncclBroadcast")) return;
            memcpy((unsigned char *)r + off, xslot(m, root, par), len);
        }
    });
    return 0;
}
static int xallgather(const void *s, void *r, size_t count, int t, mcomm *m, void *st) {
    if (int e = xready(m, "ncclAllGather")) return e;
    xenqueue(m, st, "all-gather", [=] {
        size_t b = count * nccl_es(t);
        for (size_t off = 0; off < b; off += XSLOT) { /* in place (s == r + rank * b) too */
            size_t len = b - off < XSLOT ? b - off : XSLOT;
            unsigned par = m->seq++ & 1;
            memcpy(xslot(m, m->rank, par), (const unsigned char *)s + off, len);
            if (!xbarrier(m, "in ncclAllGather")) return;
            for (int i = 0; i < m->n; i++) memcpy((unsigned char *)r + b * (size_t)i + off, xslot(m, i, par), len);
        }
    });
    return 0;
}
static int xreducescatter(const void *s, void *r, size_t count, int t, int op, mcomm *m, void *st) {
    if (int e = xready(m, "ncclReduceScatter")) return e;
    xenqueue(m, st, "reduce-scatter", [=] {
        size_t es = nccl_es(t), sub = XSLOT / (size_t)m->n / es; /* elements per destination and round */
        const void *src[XMAXR];
        for (size_t off = 0; off < count; off += sub) { /* in place (r == s + rank * count) too */
            size_t len = count - off < sub ? count - off : sub;
            unsigned par = m->seq++ & 1;
            for (int d = 0; d < m->n; d++)
                memcpy(xslot(m, m->rank, par) + (size_t)d * sub * es,
                       (const unsigned char *)s + ((size_t)d * count + off) * es, len * es);
            if (!xbarrier(m, "in ncclReduceScatter")) return;
            for (int i = 0; i < m->n; i++) src[i] = xslot(m, i, par) + (size_t)m->rank * sub * es;
            reduce_elems(src, m->n, (unsigned char *)r + off * es, len, t, op, 0);
        }
    });
    return 0;
}

/* one pending send or receive of a group: a stream of its 8-byte size, then the data */
struct xp {
    mcomm *m;
    bool send;
    unsigned char *buf;
    uint64_t bytes, total, done, size;
    int peer;
};
static void xvcopy(xp &p, uint64_t o, unsigned char *ring, uint64_t n) { /* stream bytes [o, o+n) <-> ring */
    while (n) {
        uint64_t k;
        unsigned char *v;
        if (o < 8) {
            k = 8 - o < n ? 8 - o : n;
            v = (unsigned char *)&p.size + o;
        } else {
            k = n;
            v = p.buf + (o - 8);
        }
        if (p.send)
            memcpy(ring, v, k);
        else
            memcpy(v, ring, k);
        o += k;
        ring += k;
        n -= k;
    }
}
static bool xstep(xp &p) { /* moves what fits; true if anything moved */
    unsigned char *rg = p.send ? xring(p.m, p.m->rank, p.peer) : xring(p.m, p.peer, p.m->rank);
    uint64_t *head = (uint64_t *)rg, *tail = (uint64_t *)(rg + 64);
    uint64_t hd = XLD(head), tl = XLD(tail);
    xacq(rg);
    uint64_t avail = p.send ? XRING - (hd - tl) : hd - tl, n = p.total - p.done;
    if (n > avail) n = avail;
    if (!n) return false;
    uint64_t pos = (p.send ? hd : tl) % XRING, first = XRING - pos < n ? XRING - pos : n;
    xvcopy(p, p.done, rg + XRINGHDR + pos, first);
    xvcopy(p, p.done + first, rg + XRINGHDR, n - first);
    uint64_t before = p.done;
    p.done += n;
    xrel(rg);
    if (p.send)
        XST(head, hd + n);
    else
        XST(tail, tl + n);
    if (!p.send && before < 8 && p.done >= 8 && p.size != p.bytes) {
        fprintf(stderr, "mock NCCL: rank %d receives %llu bytes from rank %d, which sends %llu\n", p.m->rank,
                (unsigned long long)p.bytes, p.peer, (unsigned long long)p.size);
        abort();
    }
    return true;
}
struct pending {
    bool send;
    mcomm *m;
    const void *sb;
    void *rb;
    size_t bytes;
    int peer;
    void *stream;
};
/* progresses all sends and receives of the group together (no deadlock however large);
   the messages between one pair of ranks match in order */
static void xrun_p2p(std::vector<pending> &ops) {
    std::vector<xp> ps;
    bool one = true;
    for (pending &o : ops) {
        ps.push_back(xp{ o.m, o.send, o.send ? (unsigned char *)o.sb : (unsigned char *)o.rb, o.bytes, o.bytes + 8, 0,
                         o.send ? (uint64_t)o.bytes : ~(uint64_t)0, o.peer });
        one = one && o.m->x == ops[0].m->x;
        if (trace_on())
            fprintf(stderr, "mock nccl: %s rank %d %s peer %d %zu bytes\n", o.m->xname.c_str(), o.m->rank,
                    o.send ? "send" : "recv", o.peer, o.bytes);
    }
    xhdr *h0 = xh(ps[0].m);
    double deadline = xnow_ms() + (double)xtimeout_ms();
    for (;;) {
        uint32_t b = XLD(&h0->bell);
        bool moved = false;
        int stuck = -1;
        for (size_t i = 0; i < ps.size(); i++) {
            xp &p = ps[i];
            if (p.done == p.total) continue;
            bool blocked = false; /* an earlier message on the same ring comes first */
            for (size_t j = 0; j < i && !blocked; j++)
                blocked = ps[j].done != ps[j].total && ps[j].m == p.m && ps[j].send == p.send && ps[j].peer == p.peer;
            if (blocked) continue;
            if (stuck < 0) stuck = (int)i;
            if (xstep(p)) {
                moved = true;
                xbell(xh(p.m));
            }
        }
        if (stuck < 0) return; /* all done */
        if (moved) {
            deadline = xnow_ms() + (double)xtimeout_ms();
            continue;
        }
        for (xp &p : ps)
            if (XLD(&p.m->aborted)) return;
        int r = XW_OK;
        for (xp &p : ps)
            if (XLD(&xh(p.m)->aborted)) r = XW_PEER;
        double left = deadline - xnow_ms();
        if (!r && left <= 0) r = XW_TIMEOUT;
        if (r) {
            xp &p = ps[(size_t)stuck];
            char what[96];
            if (p.send)
                snprintf(what, sizeof what, "for rank %d to receive", p.peer);
            else
                snprintf(what, sizeof what, "for a send from rank %d", p.peer);
            xfail(p.m, r, what);
            for (xp &q : ps) XST(&q.m->err, 2);
            return;
        }
        if (one)
            xsleep(h0, b, left);
        else
            usleep(200);
    }
}

int ncclGetVersion(int *v) {
    COUNT_CALL();
    *v = 22809;
    return 0;
}
const char *ncclGetErrorString(int r) {
    switch (r) {
    case 2: return "unhandled system error (mock)";
    case 4: return "invalid argument (mock)";
    case 5: return "invalid usage (mock)";
    default: return "mock NCCL error";
    }
}
const char *ncclGetLastError(void *c) {
    (void)c;
    return "";
}
int ncclCommInitAll(void **comms, int n, const int *devs) {
    COUNT_CALL();
    if (n < 1) return 4;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (devs[i] == devs[j]) {
                fprintf(stderr, "mock NCCL: two ranks on GPU %d\n", devs[i]);
                return 4;
            }
    static std::mutex cmu;
    static std::vector<clique *> all; /* cliques live for the process (stalled work may hold them) */
    clique *c = new clique();
    {
        std::lock_guard<std::mutex> l(cmu);
        all.push_back(c);
    }
    c->n = n;
    pthread_barrier_init(&c->bar, NULL, (unsigned)n);
    c->send.resize(n);
    c->recv.resize(n);
    c->ncoll.resize(n);
    for (int i = 0; i < n; i++) {
        comms[i] = new mcomm(c, i, n);
        ((mcomm *)comms[i])->dev = devs[i];
    }
    return 0;
}

struct ncclUniqueId {
    char internal[128];
};
static unsigned g_unique_ids; /* ncclGetUniqueId calls (MOCK_CUDA_REPORT) */
int ncclGetUniqueId(ncclUniqueId *id) {
    COUNT_CALL();
    if (!id) return 4;
    unsigned k = __atomic_add_fetch(&g_unique_ids, 1u, __ATOMIC_SEQ_CST);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned rnd = ((unsigned)ts.tv_nsec ^ ((unsigned)ts.tv_sec << 11) ^ (unsigned)(uintptr_t)&ts) * 2654435761u + k;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, XIDMAGIC, sizeof XIDMAGIC);
    snprintf(id->internal + 8, sizeof id->internal - 8, "/dparmock-%d-%u-%08x", (int)getpid(), k, rnd);
    return 0;
}
/* attaches m to its segment (creating it if first) and registers its rank */
static int xjoin(mcomm *m, double deadline) {
    const char *name = m->xname.c_str();
    xseg *s = NULL;
    {
        std::lock_guard<std::mutex> l(g_xmu);
        for (xseg *q : g_xsegs)
            if (q->name == m->xname) {
                s = q;
                s->refs++;
                break;
            }
        if (!s) {
            size_t size = xsize(m->n);
            unsigned char *base;
            int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
            if (fd >= 0) {
                base = (unsigned char *)MAP_FAILED;
                if (ftruncate(fd, (off_t)size) == 0)
                    base = (unsigned char *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                int e = errno;
                close(fd);
                if (base == (unsigned char *)MAP_FAILED) {
                    fprintf(stderr, "mock NCCL: creating shared memory %s (%zu bytes): %s\n", name, size, strerror(e));
                    shm_unlink(name);
                    return 2;
                }
                ((xhdr *)base)->nranks = m->n;
                XST(&((xhdr *)base)->magic, XMAGIC);
            } else if (errno == EEXIST && (fd = shm_open(name, O_RDWR, 0600)) >= 0) {
                struct stat sb;
                for (;;) { /* the creator sizes it, then initializes it */
                    if (fstat(fd, &sb) == 0 && sb.st_size > 0) break;
                    if (xnow_ms() > deadline) {
                        close(fd);
                        fprintf(stderr, "mock NCCL: ncclCommInitRank: shared memory %s was never sized\n", name);
                        return 2;
                    }
                    usleep(1000);
                }
                size = (size_t)sb.st_size;
                base = (unsigned char *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                int e = errno;
                close(fd);
                if (base == (unsigned char *)MAP_FAILED) {
                    fprintf(stderr, "mock NCCL: mapping shared memory %s: %s\n", name, strerror(e));
                    return 2;
                }
                while (XLD(&((xhdr *)base)->magic) != XMAGIC) {
                    if (xnow_ms() > deadline) {
                        munmap(base, size);
                        fprintf(stderr, "mock NCCL: ncclCommInitRank: shared memory %s was never initialized\n", name);
                        return 2;
                    }
                    usleep(1000);
                }
            } else if (errno == ENOENT) {
                fprintf(stderr,
                        "mock NCCL: ncclCommInitRank: rank %d came after its communicator was complete "
                        "(a rank joined twice?)\n",
                        m->rank);
                return 5;
            } else {
                fprintf(stderr, "mock NCCL: shm_open %s: %s\n", name, strerror(errno));
                return 2;
            }
            s = new xseg{ m->xname, base, size, 1, false };
            g_xsegs.push_back(s);
        }
    }
    xhdr *h = (xhdr *)s->base;
    int e = 0;
    uint32_t zero = 0;
    if (h->nranks != m->n) {
        fprintf(stderr, "mock NCCL: ncclCommInitRank: rank %d says %d ranks, an earlier rank %d\n", m->rank, m->n,
                h->nranks);
        e = 5;
    } else if (!__atomic_compare_exchange_n(&h->joined[m->rank], &zero, 1u, false, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST)) {
        fprintf(stderr, "mock NCCL: ncclCommInitRank: rank %d of the communicator joined twice\n", m->rank);
        e = 5;
    }
    if (e) {
        int32_t z = 0;
        __atomic_compare_exchange_n(&h->failed, &z, e, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        xbell(h);
        shm_unlink(name); /* the communicator failed: nothing stays in /dev/shm */
        xseg_release(s);
        return e;
    }
    m->x = s;
    h->gpu[m->rank] = m->phys;
    h->pid[m->rank] = (int32_t)getpid();
    if (XADD(&h->njoined, 1u) == (uint32_t)m->n) shm_unlink(name); /* all attached: nothing stays in /dev/shm */
    xbell(h);
    return 0;
}
/* joins every rank first, then waits for all (one thread may hold several ranks) */
static int xinit(std::vector<mcomm *> &ms) {
    int rc = 0;
    double deadline = xnow_ms() + (double)xtimeout_ms();
    for (mcomm *m : ms) {
        int r = xjoin(m, deadline);
        if (r && !rc) rc = r;
    }
    if (rc) /* this group cannot complete: neither can the other communicators of its ranks */
        for (mcomm *m : ms)
            if (m->x) {
                int32_t z = 0;
                __atomic_compare_exchange_n(&xh(m)->failed, &z, rc, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
                xbell(xh(m));
            }
    for (mcomm *m : ms) {
        if (!m->x) continue;
        xhdr *h = xh(m);
        int e = 0,
            r = xwait(h, NULL, deadline, [&] { return XLD(&h->njoined) == (uint32_t)m->n || XLD(&h->failed) != 0; });
        if (r == XW_TIMEOUT) {
            fprintf(stderr, "mock NCCL: ncclCommInitRank: rank %d: %u of %d ranks joined within %ld ms\n", m->rank,
                    XLD(&h->njoined), m->n, xtimeout_ms());
            int32_t z = 0;
            __atomic_compare_exchange_n(&h->failed, &z, 2, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            xbell(h);
            e = 2;
        } else if (r != XW_OK) {
            e = 2;
        } else if ((e = XLD(&h->failed)) == 0) {
            for (int i = 0; i < m->n && !e; i++)
                for (int j = i + 1; j < m->n && !e; j++)
                    if (h->gpu[i] == h->gpu[j]) { /* as real NCCL: one GPU, one rank */
                        std::lock_guard<std::mutex> l(g_xmu);
                        if (!m->x->warned)
                            fprintf(stderr, "mock NCCL: ranks %d and %d on the same GPU %d\n", i, j, h->gpu[i]);
                        m->x->warned = true;
                        e = 5;
                    }
        }
        if (e) {
            if (!rc) rc = e;
            shm_unlink(m->xname.c_str()); /* (ENOENT when unlinked already) */
            xseg *s = m->x;
            m->x = NULL;
            xseg_release(s);
            continue;
        }
        for (int i = 0; i < m->n; i++) m->spans = m->spans || h->pid[i] != (int32_t)getpid();
        if (m->spans) XADD(&g_xranks, 1);
        m->ready = 1;
    }
    return rc;
}
static thread_local int t_depth;
static thread_local std::vector<mcomm *> t_inits; /* ncclCommInitRank inside a group: done at ncclGroupEnd */
int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank) {
    COUNT_CALL();
    if (!comm) return 4;
    *comm = NULL;
    if (nranks < 1 || nranks > XMAXR || rank < 0 || rank >= nranks) {
        fprintf(stderr, "mock NCCL: ncclCommInitRank: rank %d of %d ranks\n", rank, nranks);
        return 4;
    }
    if (memcmp(id.internal, XIDMAGIC, sizeof XIDMAGIC) != 0 || !memchr(id.internal + 8, 0, sizeof id.internal - 8)) {
        fprintf(stderr, "mock NCCL: ncclCommInitRank: the id does not come from ncclGetUniqueId\n");
        return 4;
    }
    if (!t_cur) {
        fprintf(stderr, "mock NCCL: ncclCommInitRank without a current context\n");
        return 5;
    }
    mcomm *m = new mcomm(NULL, rank, nranks);
    m->dev = t_cur->dev;
    m->phys = g_phys[t_cur->dev];
    m->xname = id.internal + 8;
    *comm = m;
    if (t_depth) {
        t_inits.push_back(m);
        return 0;
    }
    std::vector<mcomm *> one(1, m);
    int r = xinit(one);
    if (r) {
        *comm = NULL;
        delete m;
    }
    return r;
}
int ncclCommCount(void *c, int *n) {
    COUNT_CALL();
    *n = ((mcomm *)c)->n;
    return 0;
}
int ncclCommUserRank(void *c, int *r) {
    COUNT_CALL();
    *r = ((mcomm *)c)->rank;
    return 0;
}
int ncclCommCuDevice(void *c, int *d) {
    COUNT_CALL();
    *d = ((mcomm *)c)->dev;
    return 0;
}
int ncclCommDestroy(void *c) {
    COUNT_CALL();
    mcomm *m = (mcomm *)c;
    if (!m) return 4;
    if (m->c) {
        delete m;
        return 0;
    }
    bool drop, del = false;
    {
        std::lock_guard<std::mutex> l(g_xmu);
        m->destroyed = true;
        drop = m->handle_ref;
        m->handle_ref = false;
        if (!drop && m->refs == 0) {
            del = true;
            xforget_dead(m);
        } /* aborted earlier */
    }
    if (drop)
        xdrop(m);
    else if (del)
        delete m;
    return 0;
}
int ncclCommAbort(void *c) { /* releases stalled operations; the handle stays valid for them */
    COUNT_CALL();
    mcomm *m = (mcomm *)c;
    if (!m) return 4;
    if (m->c) {
        clique *q = m->c;
        std::lock_guard<std::mutex> l(q->mu);
        q->aborted = true;
        q->cv.notify_all();
        return 0;
    }
    {
        std::lock_guard<std::mutex> l(m->smu);
        XST(&m->aborted, 1);
        m->scv.notify_all();
    }
    bool drop;
    {
        std::lock_guard<std::mutex> l(g_xmu);
        drop = m->handle_ref;
        m->handle_ref = false;
        if (drop) g_xdead.push_back(m);
        if (m->x) {
            XST(&xh(m)->aborted, 1u);
            xbell(xh(m));
        } /* wakes the waiters, here and in the other processes */
    }
    if (drop) xdrop(m);
    return 0;
}
/* MOCK_NCCL_STALL=k: the k-th collective of every rank of a communicator set
   never completes (as a hung NCCL kernel) until ncclCommAbort; with
   MOCK_NCCL_STALL_ERROR=1 it also reports ncclSystemError asynchronously. */
static bool stalled(mcomm *m) {
    if (!m->c) return xstalled(m);
    int at = stall_at();
    clique *c = m->c;
    std::unique_lock<std::mutex> l(c->mu);
    if (c->aborted) return true;
    if (at <= 0 || ++c->ncoll[m->rank] != at) return false;
    if (getenv("MOCK_NCCL_STALL_ERROR")) c->err = 2;
    c->cv.wait(l, [&] { return c->aborted; });
    return true;
}
int ncclCommGetAsyncError(void *c, int *e) {
    COUNT_CALL();
    mcomm *m = (mcomm *)c;
    *e = m->c ? m->c->err : XLD(&m->err);
    return 0;
}

// every rank publishes its buffers, then computes its own output into a
// temporary, waits for everyone to finish reading, then writes it
static void publish(mcomm *m, const void *s, void *r) {
    if (trace_on()) fprintf(stderr, "mock nccl: clique %p rank %d collective\n", (void *)m->c, m->rank);
    m->c->send[m->rank] = s;
    m->c->recv[m->rank] = r;
    pthread_barrier_wait(&m->c->bar);
}
static int reduce_into(mcomm *m, std::vector<unsigned char> &tmp, size_t count, int t, int op, size_t off) {
    size_t es = nccl_es(t);
    if (!es) return 4;
    tmp.resize(count * es + 1);
    reduce_elems(m->c->send.data(), m->c->n, tmp.data(), count, t, op, off);
    return 0;
}
static void finish(mcomm *m, void *dst, const std::vector<unsigned char> &tmp, size_t bytes) {
    pthread_barrier_wait(&m->c->bar);
    if (bytes) memcpy(dst, tmp.data(), bytes);
    pthread_barrier_wait(&m->c->bar);
}
static int nccl_check(int t, int op) {
    return !nccl_es(t) || op < 0 || op > 4 ? 4 : 0;
}
int ncclAllReduce(const void *s, void *r, size_t count, int t, int op, void *c, void *st) {
    COUNT_CALL();
    if (nccl_check(t, op)) return 4;
    mcomm *m = (mcomm *)c;
    if (!m->c) return xallreduce(s, r, count, t, op, m, st);
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
    COUNT_CALL();
    mcomm *m = (mcomm *)c;
    if (nccl_check(t, 0) || root < 0 || root >= m->n) return 4;
    if (!m->c) return xbroadcast(s, r, count, t, root, m, st);
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
    COUNT_CALL();
    if (nccl_check(t, 0)) return 4;
    mcomm *m = (mcomm *)c;
    if (!m->c) return xallgather(s, r, count, t, m, st);
    enqueue(st, [=] {
        if (stalled(m)) return;
        publish(m, s, r);
        size_t b = count * nccl_es(t);
        std::vector<unsigned char> tmp(b * (size_t)m->c->n + 1);
        for (int i = 0; i < m->c->n; i++)
            if (b) memcpy(tmp.data() + b * (size_t)i, m->c->send[i], b);
        finish(m, r, tmp, b * (size_t)m->c->n);
    });
    return 0;
}
int ncclReduceScatter(const void *s, void *r, size_t count, int t, int op, void *c, void *st) {
    COUNT_CALL();
    if (nccl_check(t, op)) return 4;
    mcomm *m = (mcomm *)c;
    if (!m->c) return xreducescatter(s, r, count, t, op, m, st);
    enqueue(st, [=] {
        if (stalled(m)) return;
        std::vector<unsigned char> tmp;
        publish(m, s, r);
        reduce_into(m, tmp, count, t, op, count * (size_t)m->rank);
        finish(m, r, tmp, count * nccl_es(t));
    });
    return 0;
}
static thread_local std::vector<pending> t_group;
int ncclSend(const void *b, size_t count, int t, int peer, void *c, void *st) {
    COUNT_CALL();
    if (!t_depth) {
        fail_bad("ncclSend outside a group (the mock supports grouped p2p only)");
        return 4;
    }
    mcomm *m = (mcomm *)c;
    if (!nccl_es(t) || peer < 0 || peer >= m->n) return 4;
    if (!m->c)
        if (int e = xready(m, "ncclSend")) return e;
    t_group.push_back(pending{ true, m, b, NULL, count * nccl_es(t), peer, st });
    return 0;
}
int ncclRecv(void *b, size_t count, int t, int peer, void *c, void *st) {
    COUNT_CALL();
    if (!t_depth) {
        fail_bad("ncclRecv outside a group");
        return 4;
    }
    mcomm *m = (mcomm *)c;
    if (!nccl_es(t) || peer < 0 || peer >= m->n) return 4;
    if (!m->c)
        if (int e = xready(m, "ncclRecv")) return e;
    t_group.push_back(pending{ false, m, NULL, b, count * nccl_es(t), peer, st });
    return 0;
}
int ncclGroupStart(void) {
    COUNT_CALL();
    t_depth++;
    return 0;
}
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
                        if (x.bytes != p.bytes) {
                            fprintf(stderr, "mock NCCL: send/recv sizes differ\n");
                            abort();
                        }
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
                    if (c->mail[i].taken && c->mail[i].src == p.m->rank && c->mail[i].dst == p.peer &&
                        c->mail[i].buf == p.sb) {
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
/* ncclGroupEnd: first the deferred ncclCommInitRank calls, then the grouped
   sends and receives, one task per stream (one thread may drive several
   ranks, as with real NCCL) */
int ncclGroupEnd(void) {
    COUNT_CALL();
    if (t_depth <= 0) {
        fprintf(stderr, "mock NCCL: ncclGroupEnd without ncclGroupStart\n");
        return 5;
    }
    if (--t_depth > 0) return 0;
    int rc = 0;
    if (!t_inits.empty()) {
        std::vector<mcomm *> in;
        in.swap(t_inits);
        rc = xinit(in);
    }
    std::vector<pending> all;
    all.swap(t_group);
    while (!all.empty()) {
        void *st = all[0].stream;
        std::vector<pending> ops, rest;
        for (pending &p : all) (p.stream == st ? ops : rest).push_back(p);
        all.swap(rest);
        bool x = !ops[0].m->c, mixed = false;
        for (pending &p : ops) mixed = mixed || (p.m->c == NULL) != x;
        if (mixed) {
            fprintf(stderr,
                    "mock NCCL: a group mixes ncclCommInitAll and ncclCommInitRank communicators on one stream\n");
            rc = 5;
            continue;
        }
        if (!x) {
            enqueue(st, [ops]() mutable {
                if (!stalled(ops[0].m)) run_p2p(ops);
            });
            continue;
        }
        for (pending &p : ops) xhold(p.m);
        enqueue(st, [ops]() mutable {
            bool ok = !xstalled(ops[0].m);
            for (size_t i = 0; i < ops.size() && ok; i++) ok = xusable(ops[i].m);
            if (ok) {
                for (size_t i = 0; i < ops.size(); i++) {
                    bool first = true; /* counted once per rank */
                    for (size_t j = 0; j < i; j++) first = first && ops[j].m != ops[i].m;
                    if (first && ops[i].m->spans) XADD(&g_xops, 1);
                }
                xrun_p2p(ops);
            }
            for (pending &p : ops) xdrop(p.m);
        });
    }
    return rc;
}

int mock_cuda_launches(void) {
    return g_launches;
}

/* NVML, as the backend's stats read it: fixed readings per GPU (utilization
   37%, 48 C, 215.5 W), for a handle found by a "GPU-..." UUID string. */
static int g_nvml_handle;
int nvmlInit_v2(void) {
    return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    if (!uuid || strncmp(uuid, "GPU-", 4) != 0 || !h) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *h = &g_nvml_handle;
    return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, unsigned *util) {
    if (h != &g_nvml_handle) return 2;
    util[0] = 37;
    util[1] = 12;
    return 0;
}
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned *t) {
    if (h != &g_nvml_handle || sensor != 0) return 2;
    *t = 48;
    return 0;
}
int nvmlDeviceGetPowerUsage(void *h, unsigned *mw) {
    if (h != &g_nvml_handle) return 2;
    *mw = 215500;
    return 0;
}
} // extern "C"

// MOCK_CUDA_REPORT=1: at exit, print the allocations never freed (by size),
// how much NCCL work crossed processes, and "mock calls: NAME N" for every
// driver / cuBLAS / NCCL entry point called (tests/test_cuda_mock.sh takes
// per-step counts as the difference between runs of N and N+k steps).
__attribute__((destructor)) static void mock_report(void) {
    if (!getenv("MOCK_CUDA_REPORT")) return;
    std::lock_guard<std::mutex> lock(g_mu);
    fprintf(stderr, "mock cuda: %zu allocation(s) never freed, %zu freed\n", g_allocs.size() + g_pinned.size(),
            g_quarantine.size());
    for (auto &a : g_allocs) fprintf(stderr, "mock cuda:   live allocation of %zu bytes\n", a.second);
    fprintf(stderr, "mock nccl: %d communicator rank(s) spanning processes, %d collective(s) through shared memory\n",
            XLD(&g_xranks), XLD(&g_xops));
    fprintf(stderr, "mock nccl: %u unique id(s) made\n", __atomic_load_n(&g_unique_ids, __ATOMIC_SEQ_CST));
    std::map<std::string, unsigned long> calls; /* by name */
    for (call_count *c = __atomic_load_n(&g_counts, __ATOMIC_ACQUIRE); c; c = c->next)
        calls[c->name] = __atomic_load_n(&c->n, __ATOMIC_RELAXED);
    for (auto &c : calls) fprintf(stderr, "mock calls: %s %lu\n", c.first.c_str(), c.second);
}
