/* dpar.h CUDA backend — NVIDIA GPUs: CUDA kernels, cuBLAS matrix products,
   NCCL collectives.

   Compiled into the dpar implementation when DPAR_CUDA is defined:

       #define DPAR_CUDA
       #define DPAR_IMPLEMENTATION
       #include "dpar.h"

       cc -std=c99 -O2 -I. -DDPAR_CUDA app.c -o app -lpthread -lm -ldl

   No CUDA toolkit is needed to build: the driver (libcuda.so.1), cuBLAS
   (libcublas.so.13 / .12) and NCCL (libnccl.so.2) are opened with dlopen at
   run time, and the kernels (kernels/dpar_kernels.cu) are embedded as PTX in
   backends/dpar_cuda_kernels.h, which the driver compiles for the GPU it
   finds (compute capability 7.5 or newer; the PTX needs a driver of CUDA 13
   or newer). A binary built this way starts anywhere: without a driver or a
   GPU, dpar_runtime_create returns DPAR_ERR_BACKEND_UNAVAILABLE saying why.

   Devices
   - num_devices <= physical GPUs: device i is GPU i (see MPI below), collectives go through
     NCCL, one communicator per mesh-axis group (created on first use with
     ncclCommInitAll, cached by the group's device list): blocking ones on
     the compute stream, asynchronous ones on a per-device communication
     stream ordered against the compute stream with events; a group of one
     device is a copy on the compute stream (no NCCL).
   - num_devices > physical GPUs (DPAR_DEVICES=N on a 1-GPU machine): N
     virtual devices on GPU 0, each with its own streams. NCCL cannot have
     two ranks on one GPU, so collectives are done by the backend's own
     kernels in device memory, adding in member order with f32 accumulation
     (bitwise identical on every member, and equal to the CPU reference's
     order). At most 64 virtual devices.
   - desc.cuda.physical_device = g + 1 uses GPU g alone (1-based, so 1 is GPU 0); the
     devices are then virtual ones on it (one device: GPU g itself). 0: every GPU.
   - MPI (DPAR_MPI): each process opens its node-local share of the GPUs
     (node-local rank x devices per process, or what CUDA_VISIBLE_DEVICES
     leaves it). A group spanning processes gets one NCCL communicator
     across them: ncclGetUniqueId on the process holding member 0, the id
     sent by MPI_Bcast (by the core), ncclCommInitRank for each local member
     inside ncclGroupStart/End. The core first checks every such call
     against the other processes (mismatch, departed or missing ranks).

   Semantics
   - Ops are asynchronous on the device's compute stream; dpar_buffer_read,
     dpar_runtime_device_sync and dpar_buffer_destroy wait. While NCCL communicators
     exist, those waits poll instead of blocking: an asynchronous NCCL error
     (ncclCommGetAsyncError) gives DPAR_ERR_BACKEND, and an NCCL collective
     whose inputs are ready but which has not finished within the runtime's
     timeout (DPAR_TIMEOUT_MS) gives DPAR_ERR_TIMEOUT; both abort the
     device's communicators (ncclCommAbort) instead of hanging. The error
     then sticks to the device: later waits and dispatches return it at
     once, and a dispatch returns it even when it was found while freeing
     the dispatch's buffers; destroy the runtime. Long compute work never
     times out. Reads and writes wait for the stream the same way first
     (a copy with pageable host memory would block inside the driver).
     A write returns once the driver has staged the host data (it is
     reusable then); it does not wait for the copy or the stream.
   - Blocking collectives run on the compute stream, in order with the ops.
     Asynchronous ones (dpar_*_start) run on a per-device communication
     stream: the compute stream's work so far -> NCCL -> the compute stream's
     later work, with events, so the compute issued in between overlaps them.
     Either way the host returns at once (the GPU streams stay ordered). Each
     NCCL collective costs one host barrier of the group's worker threads
     (see dpar__cu_collective).
   - Matrix products: cublasSgemm (f32, no TF32), cublasGemmEx for f16/bf16
     operands with f32 compute. Element-wise kernels, the SGD step and the
     casts do the same IEEE operations as the CPU reference (no FMA
     contraction) and match it bit for bit; reductions (sum, losses) use a
     fixed-order tree, deterministic but ordered differently from the CPU.
   - NCCL: pmean uses ncclAvg (f32/f16/bf16; i32 sums then truncates), f16 and
     bf16 reduce natively in NCCL (rounded per step, not once); pmax/pmin on
     floats go through order-preserving integer keys so NaN propagates (NCCL's
     own float max/min drop NaN).
   - Errors name the call and the library's message, e.g.
     "cuda: device 1: cuMemAlloc(1073741824 bytes): CUDA_ERROR_OUT_OF_MEMORY (out of memory)". */
#ifndef DPAR_CUDA_BACKEND_INCLUDED
#define DPAR_CUDA_BACKEND_INCLUDED

/* The PTX is one string literal far longer than the 4095 characters C99 promises;
   gcc and clang accept it, so -Wpedantic's length check is off for this include. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
#endif
#include "dpar_cuda_kernels.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* ---------------------------------------------------------------------------
   CUDA driver / cuBLAS / NCCL ABI, declared here so that no CUDA header is
   needed (values checked against the real headers by `make CUDA=1
   check-cuda-abi`, see tools/cuda_abi_check.c).
   ------------------------------------------------------------------------ */
typedef int dpar__CUresult;
typedef int dpar__CUdevice;
typedef unsigned long long dpar__CUdeviceptr;
typedef void *dpar__CUcontext;
typedef void *dpar__CUstream;
typedef void *dpar__CUevent;
typedef void *dpar__CUmodule;
typedef void *dpar__CUfunction;
typedef void *dpar__CUgraph;
typedef void *dpar__CUgraphExec;
typedef void *dpar__cublasHandle;
typedef void *dpar__ncclComm;
typedef struct {
    char internal[128];
} dpar__ncclUniqueId;
typedef struct {
    char bytes[16];
} dpar__CUuuid;

enum {
    DPAR__CUDA_SUCCESS = 0,
    DPAR__CUDA_ERROR_OUT_OF_MEMORY = 2,
    DPAR__CUDA_ERROR_NO_DEVICE = 100,
    DPAR__CUDA_ERROR_NOT_READY = 600,
    DPAR__CU_STREAM_NON_BLOCKING = 1,
    DPAR__CU_STREAM_CAPTURE_MODE_RELAXED = 2,
    DPAR__CU_EVENT_DISABLE_TIMING = 2,
    DPAR__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    DPAR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    DPAR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    DPAR__CU_JIT_ERROR_LOG_BUFFER = 5,
    DPAR__CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
    DPAR__CUBLAS_OP_N = 0,
    DPAR__CUBLAS_OP_T = 1,
    DPAR__CUDA_R_32F = 0,
    DPAR__CUDA_R_16F = 2,
    DPAR__CUDA_R_16BF = 14,
    DPAR__CUBLAS_COMPUTE_32F = 68,
    DPAR__CUBLAS_GEMM_DEFAULT = -1,
    DPAR__CUBLAS_STATUS_ALLOC_FAILED = 3,
    DPAR__ncclSuccess = 0,
    DPAR__ncclInProgress = 7,
    DPAR__ncclInt32 = 2,
    DPAR__ncclFloat16 = 6,
    DPAR__ncclFloat32 = 7,
    DPAR__ncclBfloat16 = 9,
    DPAR__ncclSum = 0,
    DPAR__ncclMax = 2,
    DPAR__ncclMin = 3,
    DPAR__ncclAvg = 4
};

typedef struct dpar__cu_api {
    void *lib_cuda, *lib_blas, *lib_nccl, *lib_nvml;
    int driver_version, nccl_version;
    char blas_name[32];
    /* driver */
    dpar__CUresult (*cuInit)(unsigned);
    dpar__CUresult (*cuDriverGetVersion)(int *);
    dpar__CUresult (*cuGetErrorName)(dpar__CUresult, const char **);
    dpar__CUresult (*cuGetErrorString)(dpar__CUresult, const char **);
    dpar__CUresult (*cuDeviceGetCount)(int *);
    dpar__CUresult (*cuDeviceGet)(dpar__CUdevice *, int);
    dpar__CUresult (*cuDeviceGetName)(char *, int, dpar__CUdevice);
    dpar__CUresult (*cuDeviceTotalMem)(size_t *, dpar__CUdevice);
    dpar__CUresult (*cuDeviceGetAttribute)(int *, int, dpar__CUdevice);
    dpar__CUresult (*cuDeviceGetUuid)(dpar__CUuuid *, dpar__CUdevice);
    dpar__CUresult (*cuDevicePrimaryCtxRetain)(dpar__CUcontext *, dpar__CUdevice);
    dpar__CUresult (*cuDevicePrimaryCtxRelease)(dpar__CUdevice);
    dpar__CUresult (*cuCtxSetCurrent)(dpar__CUcontext);
    dpar__CUresult (*cuStreamCreate)(dpar__CUstream *, unsigned);
    dpar__CUresult (*cuStreamDestroy)(dpar__CUstream);
    dpar__CUresult (*cuStreamSynchronize)(dpar__CUstream);
    dpar__CUresult (*cuStreamQuery)(dpar__CUstream);
    dpar__CUresult (*cuStreamWaitEvent)(dpar__CUstream, dpar__CUevent, unsigned);
    dpar__CUresult (*cuEventCreate)(dpar__CUevent *, unsigned);
    dpar__CUresult (*cuEventDestroy)(dpar__CUevent);
    dpar__CUresult (*cuEventRecord)(dpar__CUevent, dpar__CUstream);
    dpar__CUresult (*cuEventQuery)(dpar__CUevent);
    dpar__CUresult (*cuMemAlloc)(dpar__CUdeviceptr *, size_t);
    dpar__CUresult (*cuMemFree)(dpar__CUdeviceptr);
    dpar__CUresult (*cuMemAllocHost)(void **, size_t);
    dpar__CUresult (*cuMemFreeHost)(void *);
    dpar__CUresult (*cuMemsetD8Async)(dpar__CUdeviceptr, unsigned char, size_t, dpar__CUstream);
    dpar__CUresult (*cuMemsetD16Async)(dpar__CUdeviceptr, unsigned short, size_t, dpar__CUstream);
    dpar__CUresult (*cuMemsetD32Async)(dpar__CUdeviceptr, unsigned int, size_t, dpar__CUstream);
    dpar__CUresult (*cuMemcpyHtoDAsync)(dpar__CUdeviceptr, const void *, size_t, dpar__CUstream);
    dpar__CUresult (*cuMemcpyDtoHAsync)(void *, dpar__CUdeviceptr, size_t, dpar__CUstream);
    dpar__CUresult (*cuMemcpyDtoDAsync)(dpar__CUdeviceptr, dpar__CUdeviceptr, size_t, dpar__CUstream);
    dpar__CUresult (*cuModuleLoadDataEx)(dpar__CUmodule *, const void *, unsigned, int *, void **);
    dpar__CUresult (*cuModuleUnload)(dpar__CUmodule);
    dpar__CUresult (*cuModuleGetFunction)(dpar__CUfunction *, dpar__CUmodule, const char *);
    dpar__CUresult (*cuLaunchKernel)(dpar__CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, dpar__CUstream, void **, void **);
    /* CUDA Graphs (stream capture), for recorded graph programs */
    dpar__CUresult (*cuStreamBeginCapture)(dpar__CUstream, int);
    dpar__CUresult (*cuStreamEndCapture)(dpar__CUstream, dpar__CUgraph *);
    dpar__CUresult (*cuGraphInstantiateWithFlags)(dpar__CUgraphExec *, dpar__CUgraph, unsigned long long);
    dpar__CUresult (*cuGraphLaunch)(dpar__CUgraphExec, dpar__CUstream);
    dpar__CUresult (*cuGraphExecDestroy)(dpar__CUgraphExec);
    dpar__CUresult (*cuGraphDestroy)(dpar__CUgraph);
    /* cuBLAS */
    int (*cublasCreate)(dpar__cublasHandle *);
    int (*cublasDestroy)(dpar__cublasHandle);
    int (*cublasSetStream)(dpar__cublasHandle, dpar__CUstream);
    const char *(*cublasGetStatusString)(int);
    int (*cublasSgemm)(dpar__cublasHandle, int, int, int, int, int, const float *, const float *, int, const float *,
                       int, const float *, float *, int);
    int (*cublasGemmEx)(dpar__cublasHandle, int, int, int, int, int, const void *, const void *, int, int, const void *,
                        int, int, const void *, void *, int, int, int, int);
    /* NCCL (optional) */
    int (*ncclGetVersion)(int *);
    const char *(*ncclGetErrorString)(int);
    const char *(*ncclGetLastError)(dpar__ncclComm);
    int (*ncclCommInitAll)(dpar__ncclComm *, int, const int *);
    int (*ncclGetUniqueId)(dpar__ncclUniqueId *);
    int (*ncclCommInitRank)(dpar__ncclComm *, int, dpar__ncclUniqueId, int);
    int (*ncclCommDestroy)(dpar__ncclComm);
    int (*ncclCommAbort)(dpar__ncclComm);
    int (*ncclCommGetAsyncError)(dpar__ncclComm, int *);
    int (*ncclAllReduce)(const void *, void *, size_t, int, int, dpar__ncclComm, dpar__CUstream);
    int (*ncclBroadcast)(const void *, void *, size_t, int, int, dpar__ncclComm, dpar__CUstream);
    int (*ncclAllGather)(const void *, void *, size_t, int, dpar__ncclComm, dpar__CUstream);
    int (*ncclReduceScatter)(const void *, void *, size_t, int, int, dpar__ncclComm, dpar__CUstream);
    int (*ncclSend)(const void *, size_t, int, int, dpar__ncclComm, dpar__CUstream);
    int (*ncclRecv)(void *, size_t, int, int, dpar__ncclComm, dpar__CUstream);
    int (*ncclGroupStart)(void);
    int (*ncclGroupEnd)(void);
    /* NVML (optional): dpar_device_stats' utilization, temperature, power */
    int (*nvmlInit)(void);
    int (*nvmlDeviceGetHandleByUUID)(const char *, void **);
    int (*nvmlDeviceGetUtilizationRates)(void *, unsigned *); /* nvmlUtilization_t: { gpu, memory } percent */
    int (*nvmlDeviceGetTemperature)(void *, int, unsigned *); /* sensor 0: NVML_TEMPERATURE_GPU, degrees C */
    int (*nvmlDeviceGetPowerUsage)(void *, unsigned *);       /* milliwatts */
} dpar__cu_api;

/* Kernels of kernels/dpar_kernels.cu, then kernels/elementwise.cu, in this order. */
typedef enum {
    DPAR__CUK_SCALE = 0,
    DPAR__CUK_AXPY,
    DPAR__CUK_RELU,
    DPAR__CUK_RELU_BWD,
    DPAR__CUK_BIAS_ADD,
    DPAR__CUK_BIAS_GRAD,
    DPAR__CUK_BIAS_GRAD_FINAL,
    DPAR__CUK_CAST,
    DPAR__CUK_SGD,
    DPAR__CUK_REDUCE_PARTIAL,
    DPAR__CUK_MSE_PARTIAL,
    DPAR__CUK_REDUCE_FINAL,
    DPAR__CUK_XENT_ROWS,
    DPAR__CUK_VREDUCE,
    DPAR__CUK_TO_KEY,
    DPAR__CUK_FROM_KEY,
    DPAR__CUK_DIV_I32,
    DPAR__CUK_COPY_ND,
    DPAR__CUK_REDUCE_PARTIAL_F64,
    DPAR__CUK_UNARY, /* kernels/elementwise.cu */
    DPAR__CUK_BINARY,
    DPAR__CUK_REDUCE_AXES,
    DPAR__CUK_REDUCE_COLS,
    DPAR__CUK_WHERE,
    DPAR__CUK_SOFTMAX,
    DPAR__CUK_STRIDED,
    /* >>norm-attn kernels (kernels/norm_attn.cu) */
    DPAR__CUK_NORM_FWD,
    DPAR__CUK_NORM_BWD,
    DPAR__CUK_NORM_WGRAD,
    DPAR__CUK_ATTN_FWD,
    DPAR__CUK_ATTN_BWD_Q,
    DPAR__CUK_ATTN_BWD_KV,
    /* >>conv-pool kernels (kernels/conv.cu) */
    DPAR__CUK_IM2COL,
    DPAR__CUK_COL2IM,
    DPAR__CUK_POOL2D,
    DPAR__CUK_POOL2D_BWD,
    /* kernels/optim.cu */
    DPAR__CUK_ADAMW,
    DPAR__CUK_CHECK_INDEX,
    DPAR__CUK_COUNT_ROWS,
    DPAR__CUK_XENT_IGNORE_ROWS,
    DPAR__CUK_DIV_FINAL,
    DPAR__CUK_EMBED,
    DPAR__CUK_EMBED_SORT,
    DPAR__CUK_EMBED_MERGE,
    DPAR__CUK_EMBED_BWD,
    DPAR__CUK_DROPOUT,
    DPAR__CUK_COUNT
} dpar__cuk;
static const char *const dpar__cuk_names[DPAR__CUK_COUNT] = {
    "dpar_k_scale", "dpar_k_axpy", "dpar_k_relu", "dpar_k_relu_bwd", "dpar_k_bias_add", "dpar_k_bias_grad",
    "dpar_k_bias_grad_final", "dpar_k_cast", "dpar_k_sgd", "dpar_k_reduce_partial", "dpar_k_mse_partial",
    "dpar_k_reduce_final", "dpar_k_xent_rows", "dpar_k_vreduce", "dpar_k_to_key", "dpar_k_from_key", "dpar_k_div_i32",
    "dpar_k_copy_nd", "dpar_k_reduce_partial_f64", "dpar_k_unary", "dpar_k_binary", "dpar_k_reduce_axes",
    "dpar_k_reduce_cols", "dpar_k_where", "dpar_k_softmax", "dpar_k_strided",
    /* >>norm-attn kernels */
    "dpar_k_norm_fwd", "dpar_k_norm_bwd", "dpar_k_norm_wgrad", "dpar_k_attn_fwd", "dpar_k_attn_bwd_q",
    "dpar_k_attn_bwd_kv",
    /* >>conv-pool kernels */
    "dpar_k_im2col", "dpar_k_col2im", "dpar_k_pool2d", "dpar_k_pool2d_bwd",
    /* kernels/optim.cu */
    "dpar_k_adamw", "dpar_k_check_index", "dpar_k_count_rows", "dpar_k_xent_ignore_rows", "dpar_k_div_final",
    "dpar_k_embed", "dpar_k_embed_sort", "dpar_k_embed_merge", "dpar_k_embed_bwd", "dpar_k_dropout"
};

enum {
    DPAR__CU_MAXV = 64,
    DPAR__CU_BLOCK = 256,
    DPAR__CU_MAX_PARTIALS = 1024,
    DPAR__CU_NSCRATCH = 3,         /* 0: partials, 1: conv2d's columns, 2: the 16-bit layer ops' f32 temporaries */
    DPAR__CU_COL_BYTES = 64 << 20, /* conv2d's column matrix per chunk of images (scratch slot 1) */
    DPAR__CU_EMBED_TILE = 2048,    /* tokens per block of dpar_k_embed_sort (DK_EMBED_TILE, kernels/optim.cu) */
    DPAR__CU_RING = 32             /* NCCL collectives tracked per device for hang detection */
};

/* Same layout as dk_ptrs / dk_nd in kernels/dpar_kernels.cu. */
typedef struct {
    dpar__CUdeviceptr in[DPAR__CU_MAXV];
    dpar__CUdeviceptr out[DPAR__CU_MAXV];
} dpar__cu_ptrs;
typedef struct {
    int64_t shape[8], ss[8], ds[8];
} dpar__cu_nd;

typedef struct dpar__cu_phys {
    int ordinal;
    dpar__CUdevice dev;
    dpar__CUcontext ctx;
    int ctx_retained;
    dpar__CUmodule mod[DPAR__CUDA_NUM_MODULES];
    dpar__CUfunction fn[DPAR__CUK_COUNT];
    char name[100];
    dpar__CUuuid uuid;
    size_t mem;
    int cc_major, cc_minor, sms;
} dpar__cu_phys;

/* A recorded graph program: one CUDA Graph (>>cuda graphs). */
typedef struct dpar__cu_prog {
    dpar__CUgraph graph;
    dpar__CUgraphExec exec;
    dpar__CUdeviceptr *mem; /* scratch owned by the recording */
    int nmem, capmem;
    int checks; /* it holds index checks */
} dpar__cu_prog;

/* device memory handle given to the core */
typedef struct dpar__cu_mem {
    dpar__CUdeviceptr ptr;
    size_t nbytes;
} dpar__cu_mem;

typedef struct dpar__cu_dev {
    int phys; /* index into st->phys */
    dpar__CUstream compute, comm;
    /* NCCL collective k: pre[k % RING] recorded on compute (its inputs are
       ready; an asynchronous one's comm stream waits for it), post[k % RING]
       after it on its stream (compute waits for an asynchronous one's). The
       oldest collective whose pre is done but whose post is not is running in
       NCCL: that is what the timeout watches. */
    dpar__CUevent pre[DPAR__CU_RING], post[DPAR__CU_RING];
    uint64_t ring_head, ring_tail; /* collectives issued / known complete */
    dpar__mutex ring_mu;
    int ring_mu_init;
    dpar__CUevent ev_ready, ev_done; /* virtual-device collectives */
    dpar__cublasHandle blas;
    int sticky;                     /* an NCCL timeout / asynchronous error hit this device (status) */
    char sticky_msg[DPAR__ERR_LEN]; /* its text; the runtime must be destroyed */
    dpar__CUdeviceptr scratch[DPAR__CU_NSCRATCH];
    size_t scratch_cap[DPAR__CU_NSCRATCH];
    dpar__cu_mem half[7];      /* views into scratch slot 2: the 16-bit layer ops' temporaries (>>cuda half storage) */
    dpar__CUdeviceptr idx_err; /* error words of the index checks (>>cuda optim), made on first use */
    uint32_t *idx_host;        /* their pinned host copy: fetched without a blocking copy of its own */
    int idx_pending;           /* a check ran since the last report (atomic) */
    int idx_used;              /* a check ever ran: the optimizer updates are guarded (atomic) */
    dpar__cu_prog *cap;        /* the recording under way on compute (>>cuda graphs), else NULL */
} dpar__cu_dev;

typedef struct dpar__cu_comm {
    struct dpar__cu_comm *next;
    int n;
    int cross; /* spans processes: devices[i] is -1 for members elsewhere, gdevices the key */
    int devices[DPAR_MAX_DEVICES];
    int gdevices[DPAR_MAX_DEVICES];
    dpar__ncclComm comms[DPAR_MAX_DEVICES];
    int ready;  /* 0 while its creator runs ncclCommInitAll (outside the lock) */
    int failed; /* ncclCommInitAll failed */
    int aborted;
} dpar__cu_comm;

typedef struct dpar__cu_state {
    int nphys_total, nphys, ndev, virt, timeout_ms;
    int first; /* ordinal of this process's first GPU (its node-local share) */
    dpar__cu_phys *phys;
    dpar__cu_dev *dev;
    dpar__mutex comm_lock;
    dpar__cond comm_cv; /* a communicator set finished initializing */
    dpar__cu_comm *comms;
    int ncomms; /* read without the lock as a hint only */
} dpar__cu_state;

#define DPAR__CU_PTR(b) (((const dpar__cu_mem *)(b)->mem)->ptr)

static dpar__cu_api dpar__cu;
static dpar__once dpar__cu_once = DPAR__ONCE_INIT;
static dpar_status dpar__cu_load_status = DPAR_OK;
static char dpar__cu_load_text[512];

/* ---------------------------------------------------------------------------
   Errors
   ------------------------------------------------------------------------ */
static const char *dpar__cu_errname(dpar__CUresult r) {
    const char *s = NULL;
    if (!dpar__cu.cuGetErrorName || dpar__cu.cuGetErrorName(r, &s) != 0 || !s) return "CUDA_ERROR_UNKNOWN";
    return s;
}
static const char *dpar__cu_errstr(dpar__CUresult r) {
    const char *s = NULL;
    if (!dpar__cu.cuGetErrorString || dpar__cu.cuGetErrorString(r, &s) != 0 || !s) return "unknown error";
    return s;
}
/* "cuda: device D: CALL: CUDA_ERROR_X (text)" */
static dpar_status dpar__cu_fail(int dev, const char *call, dpar__CUresult r) {
    dpar_status s = r == DPAR__CUDA_ERROR_OUT_OF_MEMORY ? DPAR_ERR_OUT_OF_MEMORY : DPAR_ERR_BACKEND;
    if (dev >= 0)
        return dpar__err(s, "cuda: device %d: %s: %s (%s)", dev, call, dpar__cu_errname(r), dpar__cu_errstr(r));
    return dpar__err(s, "cuda: %s: %s (%s)", call, dpar__cu_errname(r), dpar__cu_errstr(r));
}
#define DPAR__CU_TRY(dev, call, expr)                                          \
    do {                                                                       \
        dpar__CUresult r_ = (expr);                                            \
        if (r_ != DPAR__CUDA_SUCCESS) return dpar__cu_fail((dev), (call), r_); \
    } while (0)

static dpar_status dpar__blas_fail(int dev, const char *call, int r) {
    const char *msg = dpar__cu.cublasGetStatusString ? dpar__cu.cublasGetStatusString(r) : NULL;
    return dpar__err(r == DPAR__CUBLAS_STATUS_ALLOC_FAILED ? DPAR_ERR_OUT_OF_MEMORY : DPAR_ERR_BACKEND,
                     "cuda: device %d: %s: cuBLAS status %d (%s)", dev, call, r, msg ? msg : "unknown");
}
static dpar_status dpar__nccl_fail(int dev, const char *call, int r, dpar__ncclComm comm) {
    const char *msg = dpar__cu.ncclGetErrorString ? dpar__cu.ncclGetErrorString(r) : NULL;
    const char *last = dpar__cu.ncclGetLastError ? dpar__cu.ncclGetLastError(comm) : NULL;
    if (dev < 0)
        return dpar__err(DPAR_ERR_BACKEND, "cuda: %s: NCCL error %d (%s)%s%s", call, r, msg ? msg : "unknown",
                         last && last[0] ? ": " : "", last && last[0] ? last : "");
    return dpar__err(DPAR_ERR_BACKEND, "cuda: device %d: %s: NCCL error %d (%s)%s%s", dev, call, r,
                     msg ? msg : "unknown", last && last[0] ? ": " : "", last && last[0] ? last : "");
}

/* ---------------------------------------------------------------------------
   Loading the libraries (once per process; never unloaded)
   ------------------------------------------------------------------------ */
static void *dpar__cu_sym(void *lib, const char *name, const char *libname, int *missing) {
    void *p = (void *)dpar__dl_sym(lib, name);
    if (!p && !*missing) {
        *missing = 1;
        snprintf(dpar__cu_load_text, sizeof dpar__cu_load_text,
                 "cuda: %s has no symbol %s: the installed version is too old "
                 "(dpar needs the CUDA 13 driver, cuBLAS 12+, NCCL 2.12+)",
                 libname, name);
    }
    return p;
}
#define DPAR__CU_SYM(lib, field, name, libname) \
    (*(void **)(&dpar__cu.field) = dpar__cu_sym((lib), (name), (libname), &missing))

/* NVML (libnvidia-ml.so.1, installed with the driver) is optional: without it
   or with a failed nvmlInit, the stats' GPU readings stay -1. */
static void dpar__cu_load_nvml(void) {
    void *l = dpar__dl_open("libnvidia-ml.so.1");
    if (!l) return;
    *(void **)&dpar__cu.nvmlInit = (void *)dpar__dl_sym(l, "nvmlInit_v2");
    *(void **)&dpar__cu.nvmlDeviceGetHandleByUUID = (void *)dpar__dl_sym(l, "nvmlDeviceGetHandleByUUID");
    *(void **)&dpar__cu.nvmlDeviceGetUtilizationRates = (void *)dpar__dl_sym(l, "nvmlDeviceGetUtilizationRates");
    *(void **)&dpar__cu.nvmlDeviceGetTemperature = (void *)dpar__dl_sym(l, "nvmlDeviceGetTemperature");
    *(void **)&dpar__cu.nvmlDeviceGetPowerUsage = (void *)dpar__dl_sym(l, "nvmlDeviceGetPowerUsage");
    if (!dpar__cu.nvmlInit || !dpar__cu.nvmlDeviceGetHandleByUUID || !dpar__cu.nvmlDeviceGetUtilizationRates ||
        !dpar__cu.nvmlDeviceGetTemperature || !dpar__cu.nvmlDeviceGetPowerUsage || dpar__cu.nvmlInit() != 0) {
        dpar__dl_close(l);
        return;
    }
    dpar__cu.lib_nvml = l;
}

/* libcuda.so.1 (the driver API) and its symbols, into dpar__cu; the error text into dpar__cu_load_text */
static dpar_status dpar__cu_load_driver(void) {
    int missing = 0;
    char why[256];
    void *l = dpar__dl_open("libcuda.so.1");
    if (!l) {
        const char *e = dpar__dl_error(why, sizeof why);
        snprintf(dpar__cu_load_text, sizeof dpar__cu_load_text,
                 "cuda: libcuda.so.1 not found: no NVIDIA driver is installed (dlopen: %s). "
                 "Install the NVIDIA driver, or use DPAR_BACKEND=cpu",
                 e ? e : "?");
        return DPAR_ERR_BACKEND_UNAVAILABLE;
    }
    dpar__cu.lib_cuda = l;
    DPAR__CU_SYM(l, cuInit, "cuInit", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDriverGetVersion, "cuDriverGetVersion", "libcuda.so.1");
    DPAR__CU_SYM(l, cuGetErrorName, "cuGetErrorName", "libcuda.so.1");
    DPAR__CU_SYM(l, cuGetErrorString, "cuGetErrorString", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDeviceGetCount, "cuDeviceGetCount", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDeviceGet, "cuDeviceGet", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDeviceGetName, "cuDeviceGetName", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDeviceTotalMem, "cuDeviceTotalMem_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDeviceGetAttribute, "cuDeviceGetAttribute", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDeviceGetUuid, "cuDeviceGetUuid_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "libcuda.so.1");
    DPAR__CU_SYM(l, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuCtxSetCurrent, "cuCtxSetCurrent", "libcuda.so.1");
    DPAR__CU_SYM(l, cuStreamCreate, "cuStreamCreate", "libcuda.so.1");
    DPAR__CU_SYM(l, cuStreamDestroy, "cuStreamDestroy_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuStreamSynchronize, "cuStreamSynchronize", "libcuda.so.1");
    DPAR__CU_SYM(l, cuStreamQuery, "cuStreamQuery", "libcuda.so.1");
    DPAR__CU_SYM(l, cuStreamWaitEvent, "cuStreamWaitEvent", "libcuda.so.1");
    DPAR__CU_SYM(l, cuEventCreate, "cuEventCreate", "libcuda.so.1");
    DPAR__CU_SYM(l, cuEventDestroy, "cuEventDestroy_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuEventRecord, "cuEventRecord", "libcuda.so.1");
    DPAR__CU_SYM(l, cuEventQuery, "cuEventQuery", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemAlloc, "cuMemAlloc_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemFree, "cuMemFree_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemAllocHost, "cuMemAllocHost_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemFreeHost, "cuMemFreeHost", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemsetD8Async, "cuMemsetD8Async", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemsetD16Async, "cuMemsetD16Async", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemsetD32Async, "cuMemsetD32Async", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuModuleLoadDataEx, "cuModuleLoadDataEx", "libcuda.so.1");
    DPAR__CU_SYM(l, cuModuleUnload, "cuModuleUnload", "libcuda.so.1");
    DPAR__CU_SYM(l, cuModuleGetFunction, "cuModuleGetFunction", "libcuda.so.1");
    DPAR__CU_SYM(l, cuLaunchKernel, "cuLaunchKernel", "libcuda.so.1");
    DPAR__CU_SYM(l, cuStreamBeginCapture, "cuStreamBeginCapture_v2", "libcuda.so.1");
    DPAR__CU_SYM(l, cuStreamEndCapture, "cuStreamEndCapture", "libcuda.so.1");
    DPAR__CU_SYM(l, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", "libcuda.so.1");
    DPAR__CU_SYM(l, cuGraphLaunch, "cuGraphLaunch", "libcuda.so.1");
    DPAR__CU_SYM(l, cuGraphExecDestroy, "cuGraphExecDestroy", "libcuda.so.1");
    DPAR__CU_SYM(l, cuGraphDestroy, "cuGraphDestroy", "libcuda.so.1");
    return missing ? DPAR_ERR_BACKEND_UNAVAILABLE : DPAR_OK;
}

/* cuBLAS (required: the matrix products), its first version found of 13, 12 and unversioned, and its symbols */
static dpar_status dpar__cu_load_blas(void) {
    int missing = 0;
    char why[256];
    static const char *const names[] = { "libcublas.so.13", "libcublas.so.12", "libcublas.so" };
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0] && !dpar__cu.lib_blas; i++) {
        dpar__cu.lib_blas = dpar__dl_open(names[i]);
        if (dpar__cu.lib_blas) snprintf(dpar__cu.blas_name, sizeof dpar__cu.blas_name, "%s", names[i]);
    }
    if (!dpar__cu.lib_blas) {
        const char *e = dpar__dl_error(why, sizeof why);
        snprintf(dpar__cu_load_text, sizeof dpar__cu_load_text,
                 "cuda: cuBLAS not found (libcublas.so.13 / .12; dlopen: %s). Install the CUDA "
                 "libraries (e.g. the cuda-libraries package) and add their directory to "
                 "LD_LIBRARY_PATH",
                 e ? e : "?");
        return DPAR_ERR_BACKEND_UNAVAILABLE;
    }
    void *l = dpar__cu.lib_blas;
    DPAR__CU_SYM(l, cublasCreate, "cublasCreate_v2", "libcublas");
    DPAR__CU_SYM(l, cublasDestroy, "cublasDestroy_v2", "libcublas");
    DPAR__CU_SYM(l, cublasSetStream, "cublasSetStream_v2", "libcublas");
    DPAR__CU_SYM(l, cublasGetStatusString, "cublasGetStatusString", "libcublas");
    DPAR__CU_SYM(l, cublasSgemm, "cublasSgemm_v2", "libcublas");
    DPAR__CU_SYM(l, cublasGemmEx, "cublasGemmEx", "libcublas");
    return missing ? DPAR_ERR_BACKEND_UNAVAILABLE : DPAR_OK;
}

/* NCCL (optional: only needed for collectives across several GPUs); an unusable one is left unloaded */
static void dpar__cu_load_nccl(void) {
    int missing = 0;
    dpar__cu.lib_nccl = dpar__dl_open("libnccl.so.2");
    if (dpar__cu.lib_nccl) {
        void *l = dpar__cu.lib_nccl;
        DPAR__CU_SYM(l, ncclGetVersion, "ncclGetVersion", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclGetErrorString, "ncclGetErrorString", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclGetLastError, "ncclGetLastError", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclCommInitAll, "ncclCommInitAll", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclGetUniqueId, "ncclGetUniqueId", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclCommInitRank, "ncclCommInitRank", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclCommDestroy, "ncclCommDestroy", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclCommAbort, "ncclCommAbort", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclCommGetAsyncError, "ncclCommGetAsyncError", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclAllReduce, "ncclAllReduce", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclBroadcast, "ncclBroadcast", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclAllGather, "ncclAllGather", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclReduceScatter, "ncclReduceScatter", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclSend, "ncclSend", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclRecv, "ncclRecv", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclGroupStart, "ncclGroupStart", "libnccl.so.2");
        DPAR__CU_SYM(l, ncclGroupEnd, "ncclGroupEnd", "libnccl.so.2");
        if (missing) { /* unusable NCCL: behave as if absent */
            dpar__cu.lib_nccl = NULL;
            dpar__cu_load_text[0] = 0;
        } else {
            dpar__cu.ncclGetVersion(&dpar__cu.nccl_version);
        }
    }
}

/* Once per process (dpar__cu_once): the driver and cuBLAS (required), NCCL and NVML (optional). */
static void dpar__cu_load(void) {
    dpar__cu_load_status = dpar__cu_load_driver();
    if (dpar__cu_load_status == DPAR_OK) dpar__cu_load_status = dpar__cu_load_blas();
    if (dpar__cu_load_status != DPAR_OK) return;
    dpar__cu_load_nccl();
    dpar__cu_load_nvml();
    dpar__cu.cuDriverGetVersion(&dpar__cu.driver_version);
}

/* ---------------------------------------------------------------------------
   Small helpers
   ------------------------------------------------------------------------ */
/* Makes the device's context current on the calling thread. Always set (it is
   cheap): NCCL, cuBLAS or the user's own CUDA code may change it in between. */
static dpar_status dpar__cu_bind(dpar__cu_state *st, int dev) {
    DPAR__CU_TRY(dev, "cuCtxSetCurrent", dpar__cu.cuCtxSetCurrent(st->phys[st->dev[dev].phys].ctx));
    return DPAR_OK;
}

static unsigned dpar__cu_grid(int64_t n, int per_thread, unsigned cap) {
    int64_t g = (n + (int64_t)DPAR__CU_BLOCK * per_thread - 1) / ((int64_t)DPAR__CU_BLOCK * per_thread);
    if (g < 1) g = 1;
    if (g > (int64_t)cap) g = cap;
    return (unsigned)g;
}

static dpar_status dpar__cu_launch(dpar__cu_state *st, int dev, dpar__cuk k, unsigned grid, unsigned block,
                                   dpar__CUstream s, void **args) {
    dpar__CUfunction f = st->phys[st->dev[dev].phys].fn[k];
    dpar__CUresult r = dpar__cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, args, NULL);
    if (r != DPAR__CUDA_SUCCESS) {
        char call[96];
        snprintf(call, sizeof call, "cuLaunchKernel(%s)", dpar__cuk_names[k]);
        return dpar__cu_fail(dev, call, r);
    }
    return DPAR_OK;
}

static double dpar__cu_now_ms(void) {
    uint64_t ns = dpar__now_ns();
    return (double)(ns / 1000000000u) * 1e3 + (double)(ns % 1000000000u) * 1e-6;
}

static void dpar__cu_abort_comms_of(dpar__cu_state *st, int dev) {
    dpar__cu_comm *c;
    dpar__mutex_lock(&st->comm_lock);
    for (c = st->comms; c; c = c->next) {
        int i, member = 0;
        for (i = 0; i < c->n; i++) member |= c->devices[i] == dev;
        if (!member || c->aborted || !c->ready) continue;
        c->aborted = 1;
        for (i = 0; i < c->n; i++)
            if (c->comms[i]) dpar__cu.ncclCommAbort(c->comms[i]);
    }
    dpar__mutex_unlock(&st->comm_lock);
}

/* Waits for a stream. While NCCL communicators exist, polls instead of
   blocking: an asynchronous NCCL error, or an NCCL collective that has been
   running (its inputs ready, the communication stream still busy) for longer
   than the runtime timeout, aborts the device's communicators and returns an
   error instead of hanging. Long compute work alone never times out. */
/* Remembers a device's first NCCL timeout / asynchronous error (its
   communicators are aborted: later waits and dispatches report it at once). */
static dpar_status dpar__cu_stick(dpar__cu_state *st, int dev, dpar_status s) {
    dpar__cu_dev *d = &st->dev[dev];
    dpar__mutex_lock(&d->ring_mu);
    if (!d->sticky) {
        snprintf(d->sticky_msg, sizeof d->sticky_msg, "%s", dpar__err_text);
        DPAR__ATOMIC_STORE(&d->sticky, (int)s);
    }
    dpar__mutex_unlock(&d->ring_mu);
    return s;
}
static dpar_status dpar__cu_device_status(void *state, int dev) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_dev *d = &st->dev[dev];
    int s = DPAR__ATOMIC_LOAD(&d->sticky);
    char msg[DPAR__ERR_LEN];
    if (!s) return DPAR_OK;
    dpar__mutex_lock(&d->ring_mu);
    memcpy(msg, d->sticky_msg, sizeof msg);
    dpar__mutex_unlock(&d->ring_mu);
    return dpar__err((dpar_status)s, "%s", msg);
}

static dpar_status dpar__cu_wait(dpar__cu_state *st, int dev, dpar__CUstream s, const char *what) {
    dpar__cu_dev *d = &st->dev[dev];
    double t0;
    uint64_t seq, watched = ~(uint64_t)0;
    unsigned spins = 0;
    if (DPAR__ATOMIC_LOAD(&d->sticky)) return dpar__cu_device_status(st, dev);
    if (!DPAR__ATOMIC_LOAD(&st->ncomms) || !d->comm) {
        DPAR__CU_TRY(dev, "cuStreamSynchronize", dpar__cu.cuStreamSynchronize(s));
        return DPAR_OK;
    }
    t0 = dpar__cu_now_ms();
    for (;;) {
        dpar__CUresult r = dpar__cu.cuStreamQuery(s);
        dpar__cu_comm *c;
        int bad = 0, code = 0, in_nccl;
        dpar__ncclComm badcomm = NULL;
        if (r == DPAR__CUDA_SUCCESS) return DPAR_OK;
        if (r != DPAR__CUDA_ERROR_NOT_READY) return dpar__cu_fail(dev, "cuStreamQuery", r);
        dpar__mutex_lock(&st->comm_lock);
        for (c = st->comms; c && !bad; c = c->next) {
            int i;
            if (!c->ready) continue;
            for (i = 0; i < c->n; i++) {
                int e = 0;
                if (c->devices[i] != dev || c->aborted || !c->comms[i]) continue;
                if (dpar__cu.ncclCommGetAsyncError(c->comms[i], &e) == DPAR__ncclSuccess && e != DPAR__ncclSuccess &&
                    e != DPAR__ncclInProgress) {
                    bad = 1;
                    code = e;
                    badcomm = c->comms[i];
                }
            }
        }
        dpar__mutex_unlock(&st->comm_lock);
        if (bad) {
            dpar_status s2 = dpar__nccl_fail(dev, "ncclCommGetAsyncError (asynchronous NCCL error)", code, badcomm);
            dpar__cu_abort_comms_of(st, dev);
            return dpar__cu_stick(st, dev, s2);
        }
        /* the oldest unfinished collective has its inputs ready: NCCL is running it */
        dpar__mutex_lock(&d->ring_mu);
        while (d->ring_tail < d->ring_head &&
               dpar__cu.cuEventQuery(d->post[d->ring_tail % DPAR__CU_RING]) == DPAR__CUDA_SUCCESS)
            d->ring_tail++;
        in_nccl = d->ring_tail < d->ring_head &&
                  dpar__cu.cuEventQuery(d->pre[d->ring_tail % DPAR__CU_RING]) == DPAR__CUDA_SUCCESS;
        seq = d->ring_tail;
        dpar__mutex_unlock(&d->ring_mu);
        if (!in_nccl || seq != watched) {
            t0 = dpar__cu_now_ms();
            watched = seq;
        } else if (dpar__cu_now_ms() - t0 > (double)st->timeout_ms) {
            dpar__cu_abort_comms_of(st, dev);
            return dpar__cu_stick(
                st, dev,
                dpar__err(DPAR_ERR_TIMEOUT,
                          "cuda: device %d: %s: NCCL collective #%llu of this device did not complete within %d ms "
                          "(DPAR_TIMEOUT_MS; a member never joined?); the device's NCCL communicators "
                          "were aborted (ncclCommAbort): destroy the runtime",
                          dev, what, (unsigned long long)seq + 1, st->timeout_ms));
        }
        if (++spins > 2000) { /* a few ms of polling, then 20 us naps */
            dpar__sleep_us(20);
        }
    }
}

static dpar_status dpar__cu_wait_dev(dpar__cu_state *st, int dev, const char *what) {
    dpar_status s = dpar__cu_wait(st, dev, st->dev[dev].compute, what);
    if (s == DPAR_OK && st->dev[dev].comm) s = dpar__cu_wait(st, dev, st->dev[dev].comm, what);
    return s;
}

/* Per-device scratch slot of at least `bytes` (grows; old one freed after
   the device's streams are idle). While a graph program is recorded, memory of
   the recording's own instead: its replays must not use a slot that grows. */
static dpar_status dpar__cu_prog_scratch(dpar__cu_state *st, int dev, size_t bytes, dpar__CUdeviceptr *out);
static dpar_status dpar__cu_scratch(dpar__cu_state *st, int dev, int slot, size_t bytes, dpar__CUdeviceptr *out) {
    dpar__cu_dev *d = &st->dev[dev];
    if (bytes == 0) bytes = 4;
    if (d->cap) return dpar__cu_prog_scratch(st, dev, bytes, out);
    if (d->scratch_cap[slot] < bytes) {
        size_t cap = d->scratch_cap[slot] * 2;
        dpar__CUdeviceptr p = 0;
        dpar__CUresult r;
        if (cap < bytes) cap = bytes;
        if (d->scratch[slot]) {
            dpar_status s = dpar__cu_wait_dev(st, dev, "scratch reallocation");
            if (s) return s;
            dpar__cu.cuMemFree(d->scratch[slot]);
            d->scratch[slot] = 0;
            d->scratch_cap[slot] = 0;
        }
        r = dpar__cu.cuMemAlloc(&p, cap);
        if (r != DPAR__CUDA_SUCCESS) {
            char call[64];
            snprintf(call, sizeof call, "cuMemAlloc(%zu bytes, scratch)", cap);
            return dpar__cu_fail(dev, call, r);
        }
        d->scratch[slot] = p;
        d->scratch_cap[slot] = cap;
    }
    *out = d->scratch[slot];
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   Runtime: init / shutdown / info
   ------------------------------------------------------------------------ */
typedef struct dpar__cu_destroy_arg {
    dpar__CUcontext ctx;
    dpar__ncclComm comm;
} dpar__cu_destroy_arg;
static DPAR__THREAD_FN(dpar__cu_destroy_main, p) {
    dpar__cu_destroy_arg *a = (dpar__cu_destroy_arg *)p;
    dpar__cu.cuCtxSetCurrent(a->ctx);
    dpar__cu.ncclCommDestroy(a->comm);
    return 0;
}

static void dpar__cu_shutdown(void *state) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    int i, k;
    if (!st) return;
    /* let queued work finish (NCCL kernels included) */
    for (i = 0; st->dev && i < st->ndev; i++) {
        dpar__cu_dev *d = &st->dev[i];
        if (!st->phys || !st->phys[d->phys].ctx) continue;
        dpar__cu.cuCtxSetCurrent(st->phys[d->phys].ctx);
        /* a hung NCCL collective times out and its communicators are aborted
           instead of hanging here; aborted NCCL work ends, so then the streams drain */
        if (st->ncomms && d->ring_mu_init && !DPAR__ATOMIC_LOAD(&d->sticky)) {
            if (d->compute) dpar__cu_wait(st, i, d->compute, "runtime destroy");
            if (d->comm) dpar__cu_wait(st, i, d->comm, "runtime destroy");
        }
        if (d->compute) dpar__cu.cuStreamSynchronize(d->compute);
        if (d->comm) dpar__cu.cuStreamSynchronize(d->comm);
    }
    /* communicators first (they use the devices' streams); every rank of a
       set is destroyed from its own thread, at the same time: recent NCCL
       finalizes collectively inside ncclCommDestroy */
    while (st->comms) {
        dpar__cu_comm *c = st->comms;
        st->comms = c->next;
        if (c->ready && !c->aborted) {
            dpar__thread th[DPAR_MAX_DEVICES];
            dpar__cu_destroy_arg args[DPAR_MAX_DEVICES];
            int started[DPAR_MAX_DEVICES];
            for (i = 0; i < c->n; i++) {
                args[i].ctx = c->devices[i] >= 0 ? st->phys[st->dev[c->devices[i]].phys].ctx : NULL;
                args[i].comm = c->comms[i];
                started[i] = c->comms[i] && dpar__thread_start(&th[i], dpar__cu_destroy_main, &args[i]) == 0;
            }
            for (i = 0; i < c->n; i++)
                if (started[i])
                    dpar__thread_join(th[i]);
                else if (c->comms[i])
                    dpar__cu_destroy_main(&args[i]); /* could not start a thread */
        }
        DPAR_FREE(c);
    }
    if (st->dev) {
        for (i = 0; i < st->ndev; i++) {
            dpar__cu_dev *d = &st->dev[i];
            if (!st->phys || !st->phys[d->phys].ctx) continue;
            dpar__cu.cuCtxSetCurrent(st->phys[d->phys].ctx);
            if (d->blas) dpar__cu.cublasDestroy(d->blas);
            for (k = 0; k < DPAR__CU_NSCRATCH; k++)
                if (d->scratch[k]) dpar__cu.cuMemFree(d->scratch[k]);
            if (d->idx_err) dpar__cu.cuMemFree(d->idx_err);
            if (d->idx_host) dpar__cu.cuMemFreeHost(d->idx_host);
            for (k = 0; k < DPAR__CU_RING; k++) {
                if (d->pre[k]) dpar__cu.cuEventDestroy(d->pre[k]);
                if (d->post[k]) dpar__cu.cuEventDestroy(d->post[k]);
            }
            if (d->ev_ready) dpar__cu.cuEventDestroy(d->ev_ready);
            if (d->ev_done) dpar__cu.cuEventDestroy(d->ev_done);
            if (d->compute) dpar__cu.cuStreamDestroy(d->compute);
            if (d->comm) dpar__cu.cuStreamDestroy(d->comm);
            if (d->ring_mu_init) dpar__mutex_destroy(&d->ring_mu);
        }
        DPAR_FREE(st->dev);
    }
    if (st->phys) {
        for (i = 0; i < st->nphys; i++) {
            dpar__cu_phys *p = &st->phys[i];
            if (!p->ctx) continue;
            dpar__cu.cuCtxSetCurrent(p->ctx);
            for (k = 0; k < DPAR__CUDA_NUM_MODULES; k++)
                if (p->mod[k]) dpar__cu.cuModuleUnload(p->mod[k]);
            dpar__cu.cuCtxSetCurrent(NULL);
            if (p->ctx_retained) dpar__cu.cuDevicePrimaryCtxRelease(p->dev);
        }
        DPAR_FREE(st->phys);
    }
    dpar__mutex_destroy(&st->comm_lock);
    dpar__cond_destroy(&st->comm_cv);
    DPAR_FREE(st);
}

static dpar_status dpar__cu_init_phys(dpar__cu_state *st, int i) {
    dpar__cu_phys *p = &st->phys[i];
    int k, j;
    p->ordinal = (st->first + i) % st->nphys_total;
    i = p->ordinal;
    DPAR__CU_TRY(-1, "cuDeviceGet", dpar__cu.cuDeviceGet(&p->dev, i));
    if (dpar__cu.cuDeviceGetUuid(&p->uuid, p->dev) != DPAR__CUDA_SUCCESS) memset(&p->uuid, 0, sizeof p->uuid);
    if (dpar__cu.cuDeviceGetName(p->name, (int)sizeof p->name, p->dev) != 0)
        snprintf(p->name, sizeof p->name, "NVIDIA GPU %d", i);
    dpar__cu.cuDeviceTotalMem(&p->mem, p->dev);
    dpar__cu.cuDeviceGetAttribute(&p->cc_major, DPAR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, p->dev);
    dpar__cu.cuDeviceGetAttribute(&p->cc_minor, DPAR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, p->dev);
    dpar__cu.cuDeviceGetAttribute(&p->sms, DPAR__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, p->dev);
    if (p->cc_major * 10 + p->cc_minor < 75)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "cuda: GPU %d (%s) has compute capability %d.%d; the dpar kernels need 7.5 or newer", i,
                         p->name, p->cc_major, p->cc_minor);
    DPAR__CU_TRY(-1, "cuDevicePrimaryCtxRetain", dpar__cu.cuDevicePrimaryCtxRetain(&p->ctx, p->dev));
    p->ctx_retained = 1;
    DPAR__CU_TRY(-1, "cuCtxSetCurrent", dpar__cu.cuCtxSetCurrent(p->ctx));
    for (k = 0; k < DPAR__CUDA_NUM_MODULES; k++) {
        char log[2048];
        int opts[2] = { DPAR__CU_JIT_ERROR_LOG_BUFFER, DPAR__CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES };
        void *vals[2];
        dpar__CUresult r;
        log[0] = 0;
        vals[0] = log;
        vals[1] = (void *)(uintptr_t)sizeof log;
        r = dpar__cu.cuModuleLoadDataEx(&p->mod[k], dpar__cuda_modules[k].ptx, 2, opts, vals);
        if (r != DPAR__CUDA_SUCCESS) {
            log[sizeof log - 1] = 0;
            return dpar__err(DPAR_ERR_BACKEND, "cuda: GPU %d: cuModuleLoadDataEx(kernels '%s'): %s (%s)%s%s%s", i,
                             dpar__cuda_modules[k].name, dpar__cu_errname(r), dpar__cu_errstr(r), log[0] ? ": " : "",
                             log, dpar__cu.driver_version < 13000 ? " (the embedded PTX needs a CUDA 13 driver)" : "");
        }
    }
    for (j = 0; j < DPAR__CUK_COUNT; j++) {
        dpar__CUresult r = 1;
        for (k = 0; k < DPAR__CUDA_NUM_MODULES && r != DPAR__CUDA_SUCCESS; k++)
            r = dpar__cu.cuModuleGetFunction(&p->fn[j], p->mod[k], dpar__cuk_names[j]);
        if (r != DPAR__CUDA_SUCCESS) {
            char call[96];
            snprintf(call, sizeof call, "cuModuleGetFunction(%s)", dpar__cuk_names[j]);
            return dpar__cu_fail(-1, call, r);
        }
    }
    return DPAR_OK;
}

static dpar_status dpar__cu_init_dev(dpar__cu_state *st, int i) {
    dpar__cu_dev *d = &st->dev[i];
    int r, k;
    dpar__mutex_init(&d->ring_mu);
    d->ring_mu_init = 1;
    DPAR__CU_TRY(i, "cuCtxSetCurrent", dpar__cu.cuCtxSetCurrent(st->phys[d->phys].ctx));
    DPAR__CU_TRY(i, "cuStreamCreate", dpar__cu.cuStreamCreate(&d->compute, DPAR__CU_STREAM_NON_BLOCKING));
    if (!st->virt) DPAR__CU_TRY(i, "cuStreamCreate", dpar__cu.cuStreamCreate(&d->comm, DPAR__CU_STREAM_NON_BLOCKING));
    for (k = 0; k < DPAR__CU_RING && !st->virt; k++) {
        DPAR__CU_TRY(i, "cuEventCreate", dpar__cu.cuEventCreate(&d->pre[k], DPAR__CU_EVENT_DISABLE_TIMING));
        DPAR__CU_TRY(i, "cuEventCreate", dpar__cu.cuEventCreate(&d->post[k], DPAR__CU_EVENT_DISABLE_TIMING));
    }
    DPAR__CU_TRY(i, "cuEventCreate", dpar__cu.cuEventCreate(&d->ev_ready, DPAR__CU_EVENT_DISABLE_TIMING));
    DPAR__CU_TRY(i, "cuEventCreate", dpar__cu.cuEventCreate(&d->ev_done, DPAR__CU_EVENT_DISABLE_TIMING));
    r = dpar__cu.cublasCreate(&d->blas);
    if (r != 0) {
        d->blas = NULL;
        return dpar__blas_fail(i, "cublasCreate", r);
    }
    r = dpar__cu.cublasSetStream(d->blas, d->compute);
    if (r != 0) return dpar__blas_fail(i, "cublasSetStream", r);
    return DPAR_OK;
}

static dpar_status dpar__cu_init(const dpar_runtime_desc *desc, int requested, int local_index, int local_count,
                                 void **state, int *count) {
    dpar__cu_state *st;
    dpar__CUresult r;
    int nphys = 0, i, share, first = 0, pick, avail;
    dpar_status s;
    *state = NULL;
    *count = 0;
    dpar__call_once(&dpar__cu_once, dpar__cu_load);
    if (dpar__cu_load_status != DPAR_OK) return dpar__err(dpar__cu_load_status, "%s", dpar__cu_load_text);
    r = dpar__cu.cuInit(0);
    if (r != DPAR__CUDA_SUCCESS)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE, "cuda: cuInit: %s (%s)%s", dpar__cu_errname(r),
                         dpar__cu_errstr(r),
                         r == DPAR__CUDA_ERROR_NO_DEVICE
                             ? ": no NVIDIA GPU is visible (check CUDA_VISIBLE_DEVICES), or use DPAR_BACKEND=cpu"
                             : "");
    r = dpar__cu.cuDeviceGetCount(&nphys);
    if (r != DPAR__CUDA_SUCCESS) return dpar__cu_fail(-1, "cuDeviceGetCount", r);
    if (nphys <= 0) return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE, "cuda: cuDeviceGetCount: no NVIDIA GPU found");
    if (requested < 0) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "cuda: negative device count %d", requested);
    /* several processes on this node (MPI): each opens its own share of the
       GPUs, by node-local rank; with fewer GPUs than processes (or more
       devices asked than the share) ranks would share a GPU, and
       dpar_runtime_create names them. CUDA_VISIBLE_DEVICES per rank also works:
       then each process sees only its GPUs. */
    /* desc.cuda.physical_device (1-based) pins one GPU: the devices are virtual ones on it */
    pick = desc ? desc->cuda.physical_device : 0;
    if (pick < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "cuda: desc.cuda.physical_device = %d is negative; use 1 for "
                         "GPU 0, 2 for GPU 1, ..., or 0 for every GPU",
                         pick);
    if (pick > nphys)
        return dpar__err(DPAR_ERR_DEVICE_COUNT,
                         "cuda: desc.cuda.physical_device = %d (1-based) asks for GPU %d, but "
                         "only %d GPU(s) are visible (0..%d)",
                         pick, pick - 1, nphys, nphys - 1);
    share = nphys;
    avail = pick ? 1 : nphys;
    if (pick) {
        first = pick - 1;
        share = 1;
    } else if (local_count > 1) {
        if (nphys >= local_count) {
            share = nphys / local_count;
            first = local_index * share;
        } else {
            share = 1;
            first = local_index % nphys;
        }
    }
    if (requested == 0) requested = share;
    if (requested > avail && requested > DPAR__CU_MAXV)
        return dpar__err(DPAR_ERR_DEVICE_COUNT,
                         "cuda: asked for %d devices but there are %d GPUs, and at most %d virtual "
                         "devices fit on one GPU; ask for at most %d (or %d)",
                         requested, avail, DPAR__CU_MAXV, avail, DPAR__CU_MAXV);
    if (requested <= avail && requested > 1 && !dpar__cu.lib_nccl)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "cuda: %d GPUs need NCCL for collectives but libnccl.so.2 was not found "
                         "(install NCCL 2.12+ and add it to LD_LIBRARY_PATH)",
                         requested);

    st = (dpar__cu_state *)DPAR_MALLOC(sizeof *st);
    if (!st) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    memset(st, 0, sizeof *st);
    dpar__mutex_init(&st->comm_lock);
    dpar__cond_init(&st->comm_cv);
    st->nphys_total = nphys;
    st->first = first;
    st->virt = requested > avail;
    st->nphys = st->virt ? 1 : requested;
    st->ndev = requested;
    st->timeout_ms = desc && desc->timeout_ms > 0 ? desc->timeout_ms : dpar__env_int("DPAR_TIMEOUT_MS", 60000);
    st->phys = (dpar__cu_phys *)DPAR_MALLOC(sizeof(dpar__cu_phys) * (size_t)st->nphys);
    st->dev = (dpar__cu_dev *)DPAR_MALLOC(sizeof(dpar__cu_dev) * (size_t)st->ndev);
    if (!st->phys || !st->dev) {
        dpar__cu_shutdown(st);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    }
    memset(st->phys, 0, sizeof(dpar__cu_phys) * (size_t)st->nphys);
    memset(st->dev, 0, sizeof(dpar__cu_dev) * (size_t)st->ndev);
    for (i = 0; i < st->ndev; i++) st->dev[i].phys = st->virt ? 0 : i;
    for (i = 0; i < st->nphys; i++) {
        s = dpar__cu_init_phys(st, i);
        if (s) {
            dpar__cu_shutdown(st);
            return s;
        }
    }
    for (i = 0; i < st->ndev; i++) {
        s = dpar__cu_init_dev(st, i);
        if (s) {
            dpar__cu_shutdown(st);
            return s;
        }
    }
    *state = st;
    *count = st->ndev;
    return DPAR_OK;
}

static dpar_status dpar__cu_device_info(void *state, int dev, dpar_device_info *out) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_phys *p = &st->phys[st->dev[dev].phys];
    memset(out, 0, sizeof *out);
    if (st->virt)
        snprintf(out->name, sizeof out->name, "%s [virtual %d/%d]", p->name, dev + 1, st->ndev);
    else
        snprintf(out->name, sizeof out->name, "%s", p->name);
    snprintf(out->vendor, sizeof out->vendor, "NVIDIA");
    snprintf(out->driver, sizeof out->driver, "CUDA %d.%d, sm_%d%d, NCCL %d", dpar__cu.driver_version / 1000,
             (dpar__cu.driver_version % 1000) / 10, p->cc_major, p->cc_minor, dpar__cu.nccl_version);
    out->backend = DPAR_BACKEND_CUDA;
    out->index = dev;
    out->physical_index = p->ordinal;
    memcpy(out->uuid, p->uuid.bytes, sizeof out->uuid);
    out->memory_bytes = (uint64_t)p->mem;
    return DPAR_OK;
}

/* MPI ranks given different CUDA_VISIBLE_DEVICES each open every GPU they see */
static const char *dpar__cu_visible_devices(void) {
    return getenv("CUDA_VISIBLE_DEVICES");
}
static void dpar__cu_physical_device(void *state, int dev, int *index, unsigned char uuid[16]) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    const dpar__cu_phys *p = &st->phys[st->dev[dev].phys];
    *index = p->ordinal;
    memcpy(uuid, p->uuid.bytes, 16);
}

/* NVML's readings for the GPU behind local device dev, found by its UUID
   (NVML's and CUDA's device orders can differ). */
static void dpar__cu_health(void *state, int dev, dpar_device_stats *out) {
    if (!dpar__cu.lib_nvml) return;
    const dpar__cu_state *st = (const dpar__cu_state *)state;
    const unsigned char *u = (const unsigned char *)st->phys[st->dev[dev].phys].uuid.bytes;
    char id[48];
    snprintf(id, sizeof id, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    void *h = NULL;
    unsigned util[2], temp, mw;
    if (dpar__cu.nvmlDeviceGetHandleByUUID(id, &h) != 0) return;
    if (dpar__cu.nvmlDeviceGetUtilizationRates(h, util) == 0) out->gpu_util_pct = (int)util[0];
    if (dpar__cu.nvmlDeviceGetTemperature(h, 0, &temp) == 0) out->temperature_c = (int)temp;
    if (dpar__cu.nvmlDeviceGetPowerUsage(h, &mw) == 0) out->power_w = mw * 1e-3;
}

static dpar_status dpar__cu_thread_init(void *state, int dev) {
    return dpar__cu_bind((dpar__cu_state *)state, dev);
}

/* ---------------------------------------------------------------------------
   Memory
   ------------------------------------------------------------------------ */
static dpar_status dpar__cu_alloc(void *state, int dev, size_t nbytes, void **mem) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_mem *m;
    dpar_status s = dpar__cu_bind(st, dev);
    *mem = NULL;
    if (s) return s;
    m = (dpar__cu_mem *)DPAR_MALLOC(sizeof *m);
    if (!m) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    m->ptr = 0;
    m->nbytes = nbytes;
    if (nbytes) {
        dpar__CUresult r = dpar__cu.cuMemAlloc(&m->ptr, nbytes);
        if (r != DPAR__CUDA_SUCCESS) {
            char call[64];
            DPAR_FREE(m);
            snprintf(call, sizeof call, "cuMemAlloc(%zu bytes)", nbytes);
            return dpar__cu_fail(dev, call, r);
        }
        r = dpar__cu.cuMemsetD8Async(m->ptr, 0, nbytes, st->dev[dev].compute);
        if (r != DPAR__CUDA_SUCCESS) {
            dpar__cu.cuMemFree(m->ptr);
            DPAR_FREE(m);
            return dpar__cu_fail(dev, "cuMemsetD8Async", r);
        }
    }
    *mem = m;
    return DPAR_OK;
}

static void dpar__cu_free(void *state, int dev, void *mem) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_mem *m = (dpar__cu_mem *)mem;
    if (!m) return;
    if (m->ptr && dpar__cu_bind(st, dev) == DPAR_OK) {
        dpar__cu_wait_dev(st, dev, "buffer destroy"); /* pending work may use it */
        dpar__cu.cuMemFree(m->ptr);
    }
    DPAR_FREE(m);
}

/* A copy between device memory and pageable host memory can block the
   calling thread until the stream's earlier work is done (device to host
   always does), and no timeout applies inside the driver: while NCCL
   communicators exist, first wait for that work with dpar__cu_wait, which
   turns a hung collective into DPAR_ERR_TIMEOUT. */
static dpar_status dpar__cu_wait_before_copy(dpar__cu_state *st, int dev, const char *what) {
    if (!DPAR__ATOMIC_LOAD(&st->ncomms)) return DPAR_OK;
    return dpar__cu_wait(st, dev, st->dev[dev].compute, what);
}

static dpar_status dpar__cu_write(void *state, int dev, void *mem, size_t off, const void *src, size_t nbytes) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_mem *m = (dpar__cu_mem *)mem;
    dpar_status s;
    if (!nbytes) return DPAR_OK;
    if ((s = dpar__cu_bind(st, dev))) return s;
    if ((s = dpar__cu_wait_before_copy(st, dev, "buffer write"))) return s;
    /* src is pageable: the driver copies it into pinned staging memory before it returns (the driver
       API's "API synchronization behavior", asynchronous memcpy: "the driver may synchronize with the
       stream and stage the copy into pinned memory"; PyTorch's non_blocking copies from pageable
       memory rely on the same), so the caller may reuse src at once without a wait for the stream */
    DPAR__CU_TRY(dev, "cuMemcpyHtoDAsync", dpar__cu.cuMemcpyHtoDAsync(m->ptr + off, src, nbytes, st->dev[dev].compute));
    return DPAR_OK;
}

static dpar_status dpar__cu_idx_fetch(dpar__cu_state *st, int dev, int *fetched);
static dpar_status dpar__cu_idx_report(dpar__cu_state *st, int dev);
/* The wait that completes a fetch failed: the words stay on the device (a report clears them only after
   reading them), so the next read or sync fetches them again and a bad index is still reported. */
static dpar_status dpar__cu_idx_unfetch(dpar__cu_state *st, int dev, int fetched, dpar_status s) {
    if (fetched) DPAR__ATOMIC_STORE(&st->dev[dev].idx_pending, 1);
    return s;
}
static dpar_status dpar__cu_read(void *state, int dev, void *mem, size_t off, void *dst, size_t nbytes) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_mem *m = (dpar__cu_mem *)mem;
    dpar_status s;
    if (!nbytes) return DPAR_OK;
    if ((s = dpar__cu_bind(st, dev))) return s;
    if ((s = dpar__cu_wait_before_copy(st, dev, "buffer read"))) return s;
    int fetched; /* the index checks' words, copied ahead of dst: one blocking copy for both */
    if ((s = dpar__cu_idx_fetch(st, dev, &fetched))) return s;
    /* into pageable memory the copy is done when the call returns: the stream's work before it too */
    dpar__CUresult r = dpar__cu.cuMemcpyDtoHAsync(dst, m->ptr + off, nbytes, st->dev[dev].compute);
    if (r != DPAR__CUDA_SUCCESS)
        return dpar__cu_idx_unfetch(st, dev, fetched, dpar__cu_fail(dev, "cuMemcpyDtoHAsync", r));
    return fetched ? dpar__cu_idx_report(st, dev) : DPAR_OK; /* a bad index found by an earlier op */
}

static dpar_status dpar__cu_sync(void *state, int dev) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar_status s;
    int fetched;
    if ((s = dpar__cu_bind(st, dev)) || (s = dpar__cu_idx_fetch(st, dev, &fetched))) return s;
    if ((s = dpar__cu_wait_dev(st, dev, "device sync"))) return dpar__cu_idx_unfetch(st, dev, fetched, s);
    return fetched ? dpar__cu_idx_report(st, dev) : DPAR_OK;
}

static void *dpar__cu_host_ptr(void *state, int dev, void *mem) {
    DPAR__UNUSED(state);
    DPAR__UNUSED(dev);
    DPAR__UNUSED(mem);
    return NULL; /* device memory is not host addressable */
}

/* ---------------------------------------------------------------------------
   Ops
   ------------------------------------------------------------------------ */
static int dpar__cu_blas_type(dpar_dtype t) {
    return t == DPAR_F16 ? DPAR__CUDA_R_16F : t == DPAR_BF16 ? DPAR__CUDA_R_16BF : DPAR__CUDA_R_32F;
}

static dpar_status dpar__cu_matmul(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__cu_dev *d = &st->dev[dev];
    int64_t M = op->m, N = op->n, K = op->k;
    float alpha = op->f[0], beta = op->f[1];
    dpar__CUdeviceptr C = DPAR__CU_PTR(op->dst), A = DPAR__CU_PTR(op->src0), B = DPAR__CU_PTR(op->src1);
    int ta = op->trans_a ? DPAR__CUBLAS_OP_T : DPAR__CUBLAS_OP_N;
    int tb = op->trans_b ? DPAR__CUBLAS_OP_T : DPAR__CUBLAS_OP_N;
    int lda, ldb, r;
    if (M == 0 || N == 0) return DPAR_OK;
    if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff)
        return dpar__err(DPAR_ERR_SHAPE,
                         "cuda: matmul [%lld,%lld]x[%lld,%lld]: dimensions above 2^31-1 "
                         "are not supported by cuBLAS' int API",
                         (long long)M, (long long)K, (long long)K, (long long)N);
    if (K == 0) { /* C = beta C (beta 0 ignores C, even NaN) */
        int64_t cnt = M * N;
        void *args[] = { &C, &beta, &cnt };
        if (beta == 0.0f) {
            DPAR__CU_TRY(dev, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(C, 0, op->dst->nbytes, d->compute));
            return DPAR_OK;
        }
        return dpar__cu_launch(st, dev, DPAR__CUK_SCALE, dpar__cu_grid(cnt, 16, 8192), DPAR__CU_BLOCK, d->compute,
                               args);
    }
    /* Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T:
       call gemm with the operands swapped; the leading dimensions are the
       row-major row lengths of the stored matrices. */
    lda = (int)(op->trans_a ? M : K);
    ldb = (int)(op->trans_b ? K : N);
    if (op->dst->dtype == DPAR_F32 && op->src0->dtype == DPAR_F32 && op->src1->dtype == DPAR_F32) {
        r = dpar__cu.cublasSgemm(d->blas, tb, ta, (int)N, (int)M, (int)K, &alpha, (const float *)(uintptr_t)B, ldb,
                                 (const float *)(uintptr_t)A, lda, &beta, (float *)(uintptr_t)C, (int)N);
        if (r != 0) return dpar__blas_fail(dev, "cublasSgemm", r);
    } else {
        r = dpar__cu.cublasGemmEx(d->blas, tb, ta, (int)N, (int)M, (int)K, &alpha, (const void *)(uintptr_t)B,
                                  dpar__cu_blas_type(op->src1->dtype), ldb, (const void *)(uintptr_t)A,
                                  dpar__cu_blas_type(op->src0->dtype), lda, &beta, (void *)(uintptr_t)C,
                                  dpar__cu_blas_type(op->dst->dtype), (int)N, DPAR__CUBLAS_COMPUTE_32F,
                                  DPAR__CUBLAS_GEMM_DEFAULT);
        if (r != 0) {
            char call[96];
            snprintf(call, sizeof call, "cublasGemmEx(A %s, B %s, C %s, compute f32)", dpar_dtype_name(op->src0->dtype),
                     dpar_dtype_name(op->src1->dtype), dpar_dtype_name(op->dst->dtype));
            return dpar__blas_fail(dev, call, r);
        }
    }
    return DPAR_OK;
}

/* out[0] = (float)(sum of the double partials / div), 0 when div == 0 */
static dpar_status dpar__cu_final(dpar__cu_state *st, int dev, dpar__CUdeviceptr partials, int64_t parts, double div,
                                  dpar__CUdeviceptr out) {
    void *args[] = { &partials, &parts, &div, &out };
    return dpar__cu_launch(st, dev, DPAR__CUK_REDUCE_FINAL, 1, 1024, st->dev[dev].compute, args);
}

/* softmax cross-entropy: per-row losses (and dlogits) in one kernel, then a
   fixed-order f64 reduction of the row losses to their mean. */
static dpar_status dpar__cu_op_xent(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr dst = DPAR__CU_PTR(op->dst), dst2 = op->dst2 ? DPAR__CU_PTR(op->dst2) : 0;
    dpar__CUdeviceptr a = DPAR__CU_PTR(op->src0), b = DPAR__CU_PTR(op->src1);
    int64_t n = op->n, m = op->m;
    /* scratch 0: [partials (1024 doubles) | row losses (m doubles)] */
    dpar__CUdeviceptr scr, rowloss;
    int64_t parts;
    unsigned g;
    dpar_status e = dpar__cu_scratch(st, dev, 0, (size_t)(DPAR__CU_MAX_PARTIALS + m) * 8, &scr);
    if (e) return e;
    rowloss = scr + DPAR__CU_MAX_PARTIALS * 8;
    if (m > 0) {
        void *args[] = { &a, &b, &m, &n, &rowloss, &dst2 };
        g = dpar__cu_grid(m * 32, 1, 8192);
        if ((e = dpar__cu_launch(st, dev, DPAR__CUK_XENT_ROWS, g, DPAR__CU_BLOCK, s, args))) return e;
    }
    {
        void *args[] = { &rowloss, &m, &scr };
        g = dpar__cu_grid(m, 8, DPAR__CU_MAX_PARTIALS);
        parts = g;
        if ((e = dpar__cu_launch(st, dev, DPAR__CUK_REDUCE_PARTIAL_F64, g, DPAR__CU_BLOCK, s, args))) return e;
    }
    return dpar__cu_final(st, dev, scr, parts, (double)m, dst);
}

/* fill: a 32- or 16-bit memset of the value's bit pattern in dst's dtype. */
static dpar_status dpar__cu_op_fill(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr dst = DPAR__CU_PTR(op->dst);
    float f0 = op->f[0];
    int64_t cnt = op->dst->count;
    if (cnt == 0) return DPAR_OK;
    switch (op->dst->dtype) {
    case DPAR_F32: {
        uint32_t u;
        memcpy(&u, &f0, 4);
        DPAR__CU_TRY(dev, "cuMemsetD32Async", dpar__cu.cuMemsetD32Async(dst, u, (size_t)cnt, s));
        break;
    }
    case DPAR_I32: {
        /* same conversion as the CPU backend's (int32_t)value, made safe */
        int32_t v = f0 != f0               ? 0
                    : f0 >= 2147483648.0f  ? 2147483647
                    : f0 <= -2147483648.0f ? (-2147483647 - 1)
                                           : (int32_t)f0;
        DPAR__CU_TRY(dev, "cuMemsetD32Async", dpar__cu.cuMemsetD32Async(dst, (uint32_t)v, (size_t)cnt, s));
        break;
    }
    default: {
        unsigned short h = op->dst->dtype == DPAR_F16 ? dpar_f32_to_f16(f0) : dpar_f32_to_bf16(f0);
        DPAR__CU_TRY(dev, "cuMemsetD16Async", dpar__cu.cuMemsetD16Async(dst, h, (size_t)cnt, s));
    }
    }
    return DPAR_OK;
}

/* The launch shape of a column sum over m rows of n (dpar_k_bias_grad, dpar_k_norm_wgrad): tiles of 32 columns
   times chunks of at least 256 rows, at most 4096 blocks, from m and n only so that every GPU adds in the same
   order. Returns the chunk count; *tiles and *rows (rows per chunk) complete the shape. */
static int64_t dpar__cu_col_chunks(int64_t m, int64_t n, int64_t *tiles, int64_t *rows) {
    int64_t t = (n + 31) / 32, chunks = (m + 255) / 256, cap = 4096 / t > 1 ? 4096 / t : 1;
    if (chunks > cap) chunks = cap;
    if (chunks < 1) chunks = 1;
    *tiles = t;
    *rows = (m + chunks - 1) / chunks;
    return chunks;
}
/* out[n] = beta * out + (the sum over chunks of part[chunk, :]) / div, the chunks added in order
   (dpar_k_bias_grad_final): the second launch of every chunked column sum. */
static dpar_status dpar__cu_add_chunks(dpar__cu_state *st, int dev, dpar__CUdeviceptr out, dpar__CUdeviceptr part,
                                       int64_t chunks, int64_t n, float beta, float div) {
    void *args[] = { &out, &part, &chunks, &n, &beta, &div };
    return dpar__cu_launch(st, dev, DPAR__CUK_BIAS_GRAD_FINAL, dpar__cu_grid(n, 1, 8192), DPAR__CU_BLOCK,
                           st->dev[dev].compute, args);
}

/* >>cuda elementwise ===========================================================
   The elementwise kinds (see >>elementwise ops in dpar.h) on the kernels of
   kernels/elementwise.cu; the geometry p[] travels as one by-value struct. */
typedef struct {
    int64_t p[16];
} dpar__cu_geo; /* same layout as dke_geo (elementwise.cu) and dkc_win (conv.cu) */
static int64_t dpar__cu_reduce_len(const dpar__cu_geo *g) { /* the elements each output folds */
    int64_t R = 1;
    for (int d = 0; d < 4; d++) R *= (g->p[13] >> d & 1) ? g->p[d] : 1;
    return R;
}
/* The sum kinds of a reduce (not max, argmax nor the max backward) with few outputs (at most 16384) of at least
   256 elements each: one thread per output would leave the GPU idle, so dpar__cu_reduce_cols takes them. */
static int dpar__cu_reduce_few(const dpar__cu_geo *g, int64_t nout) {
    int64_t kind = g->p[12], R = dpar__cu_reduce_len(g);
    return kind != DPAR_REDUCE_MAX && kind != DPAR_REDUCE_ARGMAX && kind != DPAR__RED_MAX_BWD && nout <= 16384 &&
           R >= 256;
}
/* dpar_k_reduce_cols sums 32-output tiles over chunks of the reduced elements (dpar__cu_col_chunks: from the
   shape alone) and, past one chunk, dpar_k_bias_grad_final adds the chunks' partial sums (scratch slot 0) in
   chunk order, dividing a mean by R there. */
static dpar_status dpar__cu_reduce_cols(dpar__cu_state *st, int dev, dpar__CUdeviceptr y, dpar__CUdeviceptr x,
                                        dpar__CUdeviceptr a, dpar__CUdeviceptr b, dpar__cu_geo *g, int64_t nout) {
    dpar__CUstream s = st->dev[dev].compute;
    int64_t R = dpar__cu_reduce_len(g), tiles, per;
    int64_t chunks = dpar__cu_col_chunks(R, nout, &tiles, &per);
    dpar__CUdeviceptr part = 0;
    dpar_status e;
    if (chunks > 1 && (e = dpar__cu_scratch(st, dev, 0, (size_t)(chunks * nout) * 4, &part))) return e;
    void *args[] = { &y, &part, &x, &a, &b, g, &nout, &per, &tiles };
    e = dpar__cu_launch(st, dev, DPAR__CUK_REDUCE_COLS, (unsigned)(tiles * chunks), DPAR__CU_BLOCK, s, args);
    if (e || chunks == 1) return e;
    return dpar__cu_add_chunks(st, dev, y, part, chunks, nout, 0.0f, g->p[12] == DPAR_REDUCE_MEAN ? (float)R : 1.0f);
}
static dpar_status dpar__cu_op_elem(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr y = DPAR__CU_PTR(op->dst);
    dpar__CUdeviceptr x0 = op->src0 ? DPAR__CU_PTR(op->src0) : 0, x1 = op->src1 ? DPAR__CU_PTR(op->src1) : 0;
    dpar__CUdeviceptr x2 = op->src2 ? DPAR__CU_PTR(op->src2) : 0;
    dpar__cu_geo g;
    int64_t n = op->n, m = op->m, items = n;
    int u = (int)op->p[0], bwd = op->kind == DPAR__OP_UNARY_BWD || op->kind == DPAR__OP_SOFTMAX_BWD;
    int lg = (int)op->p[0], ci32 = (int)op->k;
    float f0 = op->f[0], f1 = op->f[1];
    memcpy(g.p, op->p, sizeof g.p);
    void *a_unary[] = { &y, &x0, &x1, &n, &u, &f0, &bwd };
    void *a_binary[] = { &y, &x0, &x1, &g, &n };
    void *a_reduce[] = { &y, &x0, &x1, &x2, &g, &n };
    void *a_where[] = { &y, &x0, &x1, &x2, &g, &n, &ci32, &f0, &f1 };
    void *a_softmax[] = { &y, &x0, &x1, &m, &n, &lg, &bwd };
    void *a_strided[] = { &y, &x0, &g, &n };
    void **args = a_strided;
    dpar__cuk k = DPAR__CUK_STRIDED;
    switch (op->kind) {
    case DPAR__OP_UNARY:
    case DPAR__OP_UNARY_BWD: k = DPAR__CUK_UNARY, args = a_unary; break;
    case DPAR__OP_BINARY: k = DPAR__CUK_BINARY, args = a_binary; break;
    case DPAR__OP_REDUCE: k = DPAR__CUK_REDUCE_AXES, args = a_reduce; break;
    case DPAR__OP_WHERE: k = DPAR__CUK_WHERE, args = a_where; break;
    case DPAR__OP_SOFTMAX:
    case DPAR__OP_SOFTMAX_BWD: k = DPAR__CUK_SOFTMAX, args = a_softmax, items = m; break;
    default: break; /* DPAR__OP_STRIDED */
    }
    if (items == 0) return DPAR_OK;
    if (k == DPAR__CUK_REDUCE_AXES && dpar__cu_reduce_few(&g, n))
        return dpar__cu_reduce_cols(st, dev, y, x0, x1, x2, &g, n);
    return dpar__cu_launch(st, dev, k, dpar__cu_grid(items, 1, 8192), DPAR__CU_BLOCK, s, args);
}

/* >>cuda norm-attn ============================================================
   layer/rms norm and attention (kernels/norm_attn.cu), batched matmul (cuBLAS,
   one call per batch: no strided-batched entry point is loaded). */
static unsigned dpar__cu_rows(int64_t rows) {
    return rows < 1 ? 1u : rows > 65535 ? 65535u : (unsigned)rows;
}
static dpar__CUdeviceptr dpar__cu_ptr_or0(const dpar_buffer *b) {
    return b ? DPAR__CU_PTR(b) : 0;
}
/* dw, db (either may be 0) = the column sums of dy * xhat and dy over m rows of n (dpar_k_norm_wgrad), in the
   shape of dpar__cu_col_chunks; more than one chunk adds each output's partial sums (scratch slot 0: dw's
   chunks, then db's) in chunk order with dpar_k_bias_grad_final. */
static dpar_status dpar__cu_norm_wgrad(dpar__cu_state *st, int dev, dpar__CUdeviceptr dw, dpar__CUdeviceptr db,
                                       dpar__CUdeviceptr dy, dpar__CUdeviceptr x, dpar__CUdeviceptr stats, int64_t m,
                                       int64_t n) {
    dpar__CUstream s = st->dev[dev].compute;
    int64_t tiles, rows, chunks = dpar__cu_col_chunks(m, n, &tiles, &rows);
    dpar__CUdeviceptr part = 0;
    dpar_status e;
    if (chunks > 1 && (e = dpar__cu_scratch(st, dev, 0, (size_t)(2 * chunks * n) * 4, &part))) return e;
    void *args[] = { &dy, &x, &stats, &dw, &db, &part, &m, &n, &rows, &tiles };
    e = dpar__cu_launch(st, dev, DPAR__CUK_NORM_WGRAD, (unsigned)(tiles * chunks), DPAR__CU_BLOCK, s, args);
    if (e || chunks == 1) return e;
    if (dw && (e = dpar__cu_add_chunks(st, dev, dw, part, chunks, n, 0.0f, 1.0f))) return e;
    return db ? dpar__cu_add_chunks(st, dev, db, part + (dpar__CUdeviceptr)(chunks * n * 4), chunks, n, 0.0f, 1.0f)
              : DPAR_OK;
}
static dpar_status dpar__cu_op_norm(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    int64_t m = op->m, n = op->n;
    int rms = (int)op->p[0];
    float eps = op->f[0];
    dpar__CUdeviceptr y = DPAR__CU_PTR(op->dst), a = DPAR__CU_PTR(op->src0), b = dpar__cu_ptr_or0(op->src1);
    dpar__CUdeviceptr w = dpar__cu_ptr_or0(op->src2), x3 = dpar__cu_ptr_or0(op->src3);
    dpar__CUdeviceptr d2 = dpar__cu_ptr_or0(op->dst2), d3 = dpar__cu_ptr_or0(op->dst3);
    if (op->kind == DPAR__OP_NORM) { /* src1 w, src2 b */
        void *args[] = { &a, &b, &w, &y, &d2, &m, &n, &eps, &rms };
        if (m == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_NORM_FWD, dpar__cu_rows(m), 256, s, args);
    }
    dpar_status e;
    if ((d2 || d3) && n > 0 && (e = dpar__cu_norm_wgrad(st, dev, d2, d3, a, b, x3, m, n)))
        return e; /* dw, db first: dx may alias dy */
    void *args[] = { &a, &b, &w, &x3, &y, &m, &n, &rms };
    if (m == 0 || op->p[1]) return DPAR_OK; /* p[1]: no dx */
    return dpar__cu_launch(st, dev, DPAR__CUK_NORM_BWD, dpar__cu_rows(m), 256, s, args);
}
static dpar_status dpar__cu_op_matmul_batched(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__cu_dev *d = &st->dev[dev];
    int64_t M = op->m, N = op->n, K = op->k, nb = op->p[0];
    float alpha = op->f[0], beta = op->f[1];
    if (M == 0 || N == 0 || nb == 0) return DPAR_OK;
    if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff)
        return dpar__err(DPAR_ERR_SHAPE, "cuda: matmul_batched: a dimension above 2^31-1 (cuBLAS' int API)");
    dpar__CUdeviceptr C = DPAR__CU_PTR(op->dst), A = DPAR__CU_PTR(op->src0), B = DPAR__CU_PTR(op->src1);
    if (K == 0) { /* C = beta C over every batch */
        int64_t cnt = nb * M * N;
        void *args[] = { &C, &beta, &cnt };
        if (beta == 0.0f) {
            DPAR__CU_TRY(dev, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(C, 0, op->dst->nbytes, d->compute));
            return DPAR_OK;
        }
        return dpar__cu_launch(st, dev, DPAR__CUK_SCALE, dpar__cu_grid(cnt, 16, 8192), DPAR__CU_BLOCK, d->compute,
                               args);
    }
    int ta = op->trans_a ? DPAR__CUBLAS_OP_T : DPAR__CUBLAS_OP_N,
        tb = op->trans_b ? DPAR__CUBLAS_OP_T : DPAR__CUBLAS_OP_N;
    int lda = (int)(op->trans_a ? M : K), ldb = (int)(op->trans_b ? K : N);
    for (int64_t i = 0; i < nb; i++) { /* row-major via swapped operands, as dpar__cu_matmul */
        const float *Ai = (const float *)(uintptr_t)A + i * op->p[1], *Bi = (const float *)(uintptr_t)B + i * op->p[2];
        float *Ci = (float *)(uintptr_t)C + i * op->p[3];
        int r =
            dpar__cu.cublasSgemm(d->blas, tb, ta, (int)N, (int)M, (int)K, &alpha, Bi, ldb, Ai, lda, &beta, Ci, (int)N);
        if (r != 0) return dpar__blas_fail(dev, "cublasSgemm (matmul_batched)", r);
    }
    return DPAR_OK;
}
static dpar_status dpar__cu_op_attn(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    int64_t bh = op->p[0], tq = op->p[1], tk = op->p[2], dd = op->p[3], dv = op->p[4];
    int causal = (int)op->p[5];
    float scale = op->f[0];
    if (dd > 512 || dv > 512)
        return dpar__err(DPAR_ERR_SHAPE,
                         "cuda: attention with head sizes D %lld, Dv %lld; this backend handles at most 512 "
                         "(split the heads further)",
                         (long long)dd, (long long)dv);
    dpar__CUdeviceptr dst = DPAR__CU_PTR(op->dst), d2 = dpar__cu_ptr_or0(op->dst2), d3 = dpar__cu_ptr_or0(op->dst3);
    dpar__CUdeviceptr a = DPAR__CU_PTR(op->src0), b = DPAR__CU_PTR(op->src1), c = DPAR__CU_PTR(op->src2);
    dpar__CUdeviceptr x3 = dpar__cu_ptr_or0(op->src3);
    if (op->kind == DPAR__OP_ATTN) {
        void *args[] = { &a, &b, &c, &dst, &d2, &bh, &tq, &tk, &dd, &dv, &causal, &scale };
        if (bh * tq == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_ATTN_FWD, dpar__cu_rows(bh * tq), 64, s, args);
    }
    if (op->kind == DPAR__OP_ATTN_BWD_Q) {
        void *args[] = { &a, &b, &c, &x3, &dst, &d2, &bh, &tq, &tk, &dd, &dv, &causal, &scale };
        if (bh * tq == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_ATTN_BWD_Q, dpar__cu_rows(bh * tq), 64, s, args);
    }
    void *args[] = { &a, &b, &c, &x3, &dst, &d2, &d3, &bh, &tq, &tk, &dd, &dv, &causal, &scale };
    if (bh * tk == 0) return DPAR_OK;
    return dpar__cu_launch(st, dev, DPAR__CUK_ATTN_BWD_KV, dpar__cu_rows(bh * tk), 64, s, args);
}

/* >>cuda conv-pool ============================================================
   conv2d and its gradients as cuBLAS GEMMs over the column matrix (im2col,
   kernels/conv.cu), images in chunks whose column matrix fits
   DPAR__CU_COL_BYTES; a 1x1 kernel with stride 1 and no padding uses the
   image itself. The input gradient folds the column gradient back with a
   gather (col2im, no atomics). The pools: one thread per output element, each
   a gather (deterministic, as the Vulkan shaders). The dpar__win2d geometry
   travels as one by-value struct (dpar__cu_geo, dkc_win's layout). */
/* Row-major C[M,N] = op(A) op(B) (+ beta C) on device pointers: column-major C^T = op(B)^T op(A)^T (A [M,K] or
   [K,M] when ta, B [K,N] or [N,K] when tb). */
static dpar_status dpar__cu_sgemm_rm(dpar__cu_state *st, int dev, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                     dpar__CUdeviceptr A, dpar__CUdeviceptr B, float beta, dpar__CUdeviceptr C) {
    float alpha = 1.0f;
    int r = dpar__cu.cublasSgemm(st->dev[dev].blas, tb ? DPAR__CUBLAS_OP_T : DPAR__CUBLAS_OP_N,
                                 ta ? DPAR__CUBLAS_OP_T : DPAR__CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha,
                                 (const float *)(uintptr_t)B, (int)(tb ? K : N), (const float *)(uintptr_t)A,
                                 (int)(ta ? M : K), &beta, (float *)(uintptr_t)C, (int)N);
    return r ? dpar__blas_fail(dev, "cublasSgemm (conv2d)", r) : DPAR_OK;
}

/* conv2d (y = x * w + b), its input gradient (dx from dy, w) or kernel gradient (dw from dy, x). */
static dpar_status dpar__cu_op_conv(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__win2d w = dpar__win2d_get(op);
    dpar__cu_geo g;
    memcpy(g.p, op->p, sizeof g.p);
    dpar__CUdeviceptr out = DPAR__CU_PTR(op->dst), a = DPAR__CU_PTR(op->src0), b = DPAR__CU_PTR(op->src1), col = 0;
    int64_t kc = w.kh * w.kw * w.c, pix = w.oh * w.ow, img = w.h * w.w * w.c;
    int fwd = op->kind == DPAR__OP_CONV2D, dx = op->kind == DPAR__OP_CONV2D_BWD_INPUT;
    int direct =
        w.kh == 1 && w.kw == 1 && w.sh == 1 && w.sw == 1 && w.pt == 0 && w.pl == 0 && w.oh == w.h && w.ow == w.w;
    dpar_status e = DPAR_OK;
    if (op->dst->count == 0) return DPAR_OK;
    if (kc > 0x7fffffff || w.o > 0x7fffffff)
        return dpar__err(DPAR_ERR_SHAPE, "cuda: conv2d: kh*kw*c %lld or %lld output channels above 2^31-1",
                         (long long)kc, (long long)w.o);
    if (w.n == 0 || pix == 0 || kc == 0 || w.o == 0) { /* no products: zeros (plus the bias below) */
        DPAR__CU_TRY(dev, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(out, 0, op->dst->nbytes, s));
        kc = 0;
    }
    int64_t per = kc ? DPAR__CU_COL_BYTES / (pix * kc * 4) : 1;
    if (per < 1) per = 1;
    if (per > w.n) per = w.n;
    if (kc && per > 0x7fffffff / pix) per = 0x7fffffff / pix;
    if (kc && !direct) e = dpar__cu_scratch(st, dev, 1, (size_t)(per * pix * kc * 4), &col);
    for (int64_t n0 = 0; kc && !e && n0 < w.n; n0 += per) {
        int64_t nb = w.n - n0 < per ? w.n - n0 : per, rows = nb * pix, cnt = rows * kc, tot = nb * img;
        dpar__CUdeviceptr dyc = (fwd ? out : a) + (dpar__CUdeviceptr)(n0 * pix * w.o * 4);
        dpar__CUdeviceptr xc = (fwd ? a : dx ? out : b) + (dpar__CUdeviceptr)(n0 * img * 4), cm = direct ? xc : col;
        void *im[] = { &col, fwd ? &a : &b, &g, &n0, &cnt };
        void *ci[] = { &out, &col, &g, &n0, &tot };
        if (dx) { /* dcol[rows, kc] = dy w^T, folded back into dx */
            e = dpar__cu_sgemm_rm(st, dev, 0, 1, rows, kc, w.o, dyc, b, 0.0f, cm);
            if (!e && !direct)
                e = dpar__cu_launch(st, dev, DPAR__CUK_COL2IM, dpar__cu_grid(tot, 1, 8192), DPAR__CU_BLOCK, s, ci);
            continue;
        }
        if (!direct) e = dpar__cu_launch(st, dev, DPAR__CUK_IM2COL, dpar__cu_grid(cnt, 1, 8192), DPAR__CU_BLOCK, s, im);
        if (!e && fwd) /* y[rows, o] = col w */
            e = dpar__cu_sgemm_rm(st, dev, 0, 0, rows, w.o, kc, cm, b, 0.0f, dyc);
        else if (!e) /* dw[kc, o] (+)= col^T dy */
            e = dpar__cu_sgemm_rm(st, dev, 1, 0, kc, w.o, rows, cm, dyc, n0 ? 1.0f : 0.0f, out);
    }
    if (!e && fwd && op->src2) {
        dpar__CUdeviceptr bias = DPAR__CU_PTR(op->src2);
        int64_t m = w.n * pix, n = w.o;
        void *args[] = { &out, &bias, &m, &n };
        e = dpar__cu_launch(st, dev, DPAR__CUK_BIAS_ADD, dpar__cu_grid(m * n, 4, 8192), DPAR__CU_BLOCK, s, args);
    }
    return e;
}

static dpar_status dpar__cu_op_pool(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr y = DPAR__CU_PTR(op->dst), a = DPAR__CU_PTR(op->src0);
    dpar__CUdeviceptr b = op->src1 ? DPAR__CU_PTR(op->src1) : 0;
    dpar__cu_geo g;
    int64_t total = op->dst->count;
    int is_max = op->kind == DPAR__OP_MAX_POOL || op->kind == DPAR__OP_MAX_POOL_BWD;
    int fwd = op->kind == DPAR__OP_AVG_POOL || op->kind == DPAR__OP_MAX_POOL;
    memcpy(g.p, op->p, sizeof g.p);
    if (op->kind == DPAR__OP_AVG_POOL_BWD) b = a; /* x is unused by avg: any valid pointer */
    void *a_pool[] = { &y, &a, &g, &is_max, &total };
    void *a_pool_bwd[] = { &y, &a, &b, &g, &is_max, &total };
    if (total == 0) return DPAR_OK;
    return dpar__cu_launch(st, dev, fwd ? DPAR__CUK_POOL2D : DPAR__CUK_POOL2D_BWD, dpar__cu_grid(total, 1, 8192),
                           DPAR__CU_BLOCK, s, fwd ? a_pool : a_pool_bwd);
}

/* >>cuda optim ===============================================================
   AdamW, cross-entropy with an ignore label / smoothing, embedding, dropout
   (kernels/optim.cu), and the index check: a kernel records the first bad
   label or index in the device's error words, reported as the op's error at
   the next sync or read of that device. */
/* The device's zeroed error words, made on first use (before any recording:
   a recorded memset would not run until the replay). */
static dpar_status dpar__cu_idx_words(dpar__cu_state *st, int dev) {
    dpar__cu_dev *d = &st->dev[dev];
    if (d->idx_err) return DPAR_OK;
    if (!d->idx_host) {
        void *h = NULL;
        DPAR__CU_TRY(dev, "cuMemAllocHost(index check words)", dpar__cu.cuMemAllocHost(&h, DPAR__IDX_WORDS * 4));
        d->idx_host = (uint32_t *)h;
    }
    DPAR__CU_TRY(dev, "cuMemAlloc(index check words)", dpar__cu.cuMemAlloc(&d->idx_err, DPAR__IDX_WORDS * 4));
    DPAR__CU_TRY(dev, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(d->idx_err, 0, DPAR__IDX_WORDS * 4, d->compute));
    return DPAR_OK;
}
static dpar_status dpar__cu_idx_check(dpar__cu_state *st, int dev, const dpar_buffer *idx, int64_t bound,
                                      int use_ignore, int32_t ignore, int fn) {
    dpar__cu_dev *d = &st->dev[dev];
    dpar__CUdeviceptr p = DPAR__CU_PTR(idx);
    int64_t n = idx->count;
    if (n == 0) return DPAR_OK;
    dpar_status s = dpar__cu_idx_words(st, dev);
    if (s) return s;
    void *args[] = { &p, &n, &bound, &use_ignore, &ignore, &fn, &d->idx_err };
    s = dpar__cu_launch(st, dev, DPAR__CUK_CHECK_INDEX, 1, 1, d->compute, args);
    if (!s) DPAR__ATOMIC_STORE(&d->idx_pending, 1), DPAR__ATOMIC_STORE(&d->idx_used, 1);
    if (!s && d->cap) d->cap->checks = 1; /* each replay runs the check again */
    return s;
}
/* The error words that guard an SGD or AdamW update (dpar_k_sgd) once a label or index check ran on the device,
   else 0: a device that never checks pays nothing. */
static dpar__CUdeviceptr dpar__cu_opt_guard(dpar__cu_state *st, int dev) {
    return DPAR__ATOMIC_LOAD_RELAXED(&st->dev[dev].idx_used) ? st->dev[dev].idx_err : 0;
}
/* When checks ran since the last report (*fetched = 1): queues the copy of their error words into
   the pinned host copy, asynchronous; the caller's next wait or blocking copy on the compute stream
   completes it, then dpar__cu_idx_report reads it. */
static dpar_status dpar__cu_idx_fetch(dpar__cu_state *st, int dev, int *fetched) {
    dpar__cu_dev *d = &st->dev[dev];
    *fetched = DPAR__ATOMIC_EXCHANGE(&d->idx_pending, 0);
    if (!*fetched) return DPAR_OK;
    dpar__CUresult r = dpar__cu.cuMemcpyDtoHAsync(d->idx_host, d->idx_err, DPAR__IDX_WORDS * 4, d->compute);
    if (r == DPAR__CUDA_SUCCESS) return DPAR_OK;
    DPAR__ATOMIC_STORE(&d->idx_pending, 1); /* not fetched: the next read or sync tries again */
    *fetched = 0;
    return dpar__cu_fail(dev, "cuMemcpyDtoHAsync(index check words)", r);
}
/* The fetched error words (the fetch completed): the first bad index as the op's error. */
static dpar_status dpar__cu_idx_report(dpar__cu_state *st, int dev) {
    dpar__cu_dev *d = &st->dev[dev];
    const uint32_t *w = d->idx_host;
    if (!w[0]) return DPAR_OK;
    DPAR__CU_TRY(dev, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(d->idx_err, 0, DPAR__IDX_WORDS * 4, d->compute));
    return dpar__bad_index_words(dev, w); /* and the graph steps it skipped (opt_guard.cuh) */
}
/* cross-entropy with an ignore label or smoothing: the counted rows on the
   device, per-row losses in double, a fixed-order reduction divided by the count */
static dpar_status dpar__cu_op_xent_ignore(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr dst = DPAR__CU_PTR(op->dst), dst2 = op->dst2 ? DPAR__CU_PTR(op->dst2) : 0;
    dpar__CUdeviceptr z = DPAR__CU_PTR(op->src0), lab = DPAR__CU_PTR(op->src1), scr, count, rowloss;
    int64_t n = op->n, m = op->m, parts;
    int ign = (int)op->p[0];
    int32_t ignore = (int32_t)op->p[1];
    float a = op->f[0];
    /* scratch 0: [partials (1024 doubles) | count | row losses (m doubles)] */
    dpar_status e = dpar__cu_scratch(st, dev, 0, (size_t)(DPAR__CU_MAX_PARTIALS + 1 + m) * 8, &scr);
    if (e) return e;
    count = scr + DPAR__CU_MAX_PARTIALS * 8;
    rowloss = count + 8;
    void *cargs[] = { &lab, &m, &ign, &ignore, &count };
    if ((e = dpar__cu_launch(st, dev, DPAR__CUK_COUNT_ROWS, 1, 1, s, cargs))) return e;
    if (m > 0) {
        void *args[] = { &z, &lab, &m, &n, &ign, &ignore, &a, &count, &rowloss, &dst2 };
        if ((e = dpar__cu_launch(st, dev, DPAR__CUK_XENT_IGNORE_ROWS, dpar__cu_grid(m * 32, 1, 8192), DPAR__CU_BLOCK, s,
                                 args))) /* a warp a row */
            return e;
    }
    unsigned g = dpar__cu_grid(m, 8, DPAR__CU_MAX_PARTIALS);
    void *rargs[] = { &rowloss, &m, &scr };
    parts = g;
    if ((e = dpar__cu_launch(st, dev, DPAR__CUK_REDUCE_PARTIAL_F64, g, DPAR__CU_BLOCK, s, rargs))) return e;
    void *fargs[] = { &scr, &parts, &count, &dst };
    return dpar__cu_launch(st, dev, DPAR__CUK_DIV_FINAL, 1, 1, s, fargs);
}
/* dt[v, d] += the rows of dout[k, d] at idx[k], each row's tokens added in increasing position (the CPU's
   order, so its bits) yet parallel over tokens and columns: dpar_k_embed_sort sorts tiles of tokens by row,
   dpar_k_embed_merge places every token in the stable order of all of them, dpar_k_embed_bwd sums each row
   present over its run of that order. Scratch slot 0: [tile keys | tile positions | order | rows], k each. */
static dpar_status dpar__cu_embed_bwd(dpar__cu_state *st, int dev, dpar__CUdeviceptr dt, dpar__CUdeviceptr dout,
                                      dpar__CUdeviceptr idx, int64_t k, int64_t d, int64_t v) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr skey, stok, order, srow;
    if (k > (int64_t)UINT32_MAX)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "cuda: dpar_embedding_backward: %lld indices; the CUDA sort takes at most 2^32 - 1 "
                         "(split the batch)",
                         (long long)k);
    dpar_status e = dpar__cu_scratch(st, dev, 0, (size_t)k * 16, &skey);
    if (e) return e;
    stok = skey + (dpar__CUdeviceptr)k * 4;
    order = stok + (dpar__CUdeviceptr)k * 4;
    srow = order + (dpar__CUdeviceptr)k * 4;
    void *sargs[] = { &skey, &stok, &idx, &k, &v };
    void *margs[] = { &order, &srow, &skey, &stok, &k };
    void *bargs[] = { &dt, &dout, &order, &srow, &k, &d };
    unsigned tiles = (unsigned)((k + DPAR__CU_EMBED_TILE - 1) / DPAR__CU_EMBED_TILE);
    if ((e = dpar__cu_launch(st, dev, DPAR__CUK_EMBED_SORT, tiles, DPAR__CU_BLOCK, s, sargs))) return e;
    if ((e = dpar__cu_launch(st, dev, DPAR__CUK_EMBED_MERGE, dpar__cu_grid(k, 1, 8192), DPAR__CU_BLOCK, s, margs)))
        return e;
    return dpar__cu_launch(st, dev, DPAR__CUK_EMBED_BWD, dpar__cu_grid(k * d, 4, 8192), DPAR__CU_BLOCK, s, bargs);
}
static dpar_status dpar__cu_op_optim(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr dst = DPAR__CU_PTR(op->dst), a = DPAR__CU_PTR(op->src0);
    int64_t n = op->n, m = op->m, k = op->k;
    dpar_status e;
    switch (op->kind) {
    case DPAR__OP_SOFTMAX_XENT:
        e = op->p[0] || op->f[0] != 0.0f ? dpar__cu_op_xent_ignore(st, dev, op) : dpar__cu_op_xent(st, dev, op);
        return e ? e : dpar__cu_idx_check(st, dev, op->src1, op->n, (int)op->p[0], (int32_t)op->p[1], (int)op->p[2]);
    case DPAR__OP_ADAMW: {
        dpar__CUdeviceptr m1 = DPAR__CU_PTR(op->dst2), m2 = DPAR__CU_PTR(op->dst3), err = dpar__cu_opt_guard(st, dev);
        uint32_t graph = (uint32_t)op->p[4]; /* the first update of a graph step (opt_guard.cuh) */
        const float *f = op->f;
        void *args[] = { &dst,
                         &m1,
                         &m2,
                         &a,
                         &n,
                         (void *)&f[0],
                         (void *)&f[1],
                         (void *)&f[2],
                         (void *)&f[3],
                         (void *)&f[4],
                         (void *)&f[5],
                         (void *)&f[6],
                         (void *)&f[7],
                         &err,
                         &graph };
        if (n == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_ADAMW, dpar__cu_grid(n, 4, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_EMBED: {
        dpar__CUdeviceptr idx = DPAR__CU_PTR(op->src1);
        void *args[] = { &dst, &a, &idx, &m, &n, &k };
        if ((e = dpar__cu_idx_check(st, dev, op->src1, k, 0, 0, (int)op->p[2])) || m == 0 || n == 0) return e;
        return dpar__cu_launch(st, dev, DPAR__CUK_EMBED, dpar__cu_grid(m * n, 4, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_EMBED_BWD:
        if ((e = dpar__cu_idx_check(st, dev, op->src1, k, 0, 0, (int)op->p[2])) || m == 0 || n == 0) return e;
        return dpar__cu_embed_bwd(st, dev, dst, a, DPAR__CU_PTR(op->src1), m, n, k);
    case DPAR__OP_DROPOUT: {
        uint32_t w[6];
        float scale = op->f[0];
        for (int i = 0; i < 6; i++) w[i] = (uint32_t)op->p[i];
        /* kernel order: seed lo, seed hi, stream, step lo, step hi, threshold */
        void *args[] = { &dst, &a, &n, &w[0], &w[1], &w[4], &w[2], &w[3], &w[5], &scale };
        if (n == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_DROPOUT, dpar__cu_grid((n + 3) / 4, 1, 8192), DPAR__CU_BLOCK, s,
                               args);
    }
    default: return dpar__err(DPAR_ERR_BACKEND, "cuda: op %s is not an optim op", dpar__op_name(op));
    }
}

/* db[n] = beta * db + the column sums of dy[m, n] (kernels/dpar_kernels.cu, dpar_k_bias_grad) in the shape of
   dpar__cu_col_chunks; more than one chunk adds the chunks' partial sums (scratch slot 0) in a second launch. */
static dpar_status dpar__cu_bias_grad(dpar__cu_state *st, int dev, dpar__CUdeviceptr db, dpar__CUdeviceptr dy,
                                      int64_t m, int64_t n, float beta) {
    dpar__CUstream s = st->dev[dev].compute;
    if (n == 0) return DPAR_OK;
    int64_t tiles, rows, chunks = dpar__cu_col_chunks(m, n, &tiles, &rows);
    dpar__CUdeviceptr part = 0;
    if (chunks > 1) {
        dpar_status e = dpar__cu_scratch(st, dev, 0, (size_t)(chunks * n) * 4, &part);
        if (e) return e;
    }
    void *args[] = { &db, &part, &dy, &m, &n, &rows, &tiles, &beta };
    dpar_status e = dpar__cu_launch(st, dev, DPAR__CUK_BIAS_GRAD, (unsigned)(tiles * chunks), DPAR__CU_BLOCK, s, args);
    if (e || chunks == 1) return e;
    return dpar__cu_add_chunks(st, dev, db, part, chunks, n, beta, 1.0f);
}

/* The one-kernel pointwise kinds: bias add and its gradient (above), ReLU and its
   gradient, axpy, scale and the fused SGD update. */
static dpar_status dpar__cu_op_pointwise(dpar__cu_state *st, int dev, const dpar__op *op) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr dst = op->dst ? DPAR__CU_PTR(op->dst) : 0;
    dpar__CUdeviceptr dst2 = op->dst2 ? DPAR__CU_PTR(op->dst2) : 0;
    dpar__CUdeviceptr a = op->src0 ? DPAR__CU_PTR(op->src0) : 0;
    dpar__CUdeviceptr b = op->src1 ? DPAR__CU_PTR(op->src1) : 0;
    int64_t n = op->n, m = op->m;
    float f0 = op->f[0], f1 = op->f[1], f2 = op->f[2], f3 = op->f[3];
    switch (op->kind) {
    case DPAR__OP_BIAS_ADD: {
        int64_t total = m * n;
        void *args[] = { &dst, &a, &m, &n };
        if (total == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_BIAS_ADD, dpar__cu_grid(total, 4, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_BIAS_GRAD: return dpar__cu_bias_grad(st, dev, dst, a, m, n, f1);
    case DPAR__OP_RELU: {
        void *args[] = { &dst, &a, &n };
        if (n == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_RELU, dpar__cu_grid(n, 16, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_RELU_BWD: {
        void *args[] = { &dst, &a, &b, &n };
        if (n == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_RELU_BWD, dpar__cu_grid(n, 4, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_AXPY: {
        void *args[] = { &dst, &a, &f0, &n };
        if (n == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_AXPY, dpar__cu_grid(n, 16, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_SCALE: {
        void *args[] = { &dst, &f0, &n };
        if (n == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_SCALE, dpar__cu_grid(n, 16, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_SGD: { /* guarded by the device's index-check error words (dpar_k_sgd) */
        int nesterov = op->nesterov ? 1 : 0;
        uint32_t graph = (uint32_t)op->p[4]; /* the first update of a graph step (opt_guard.cuh) */
        dpar__CUdeviceptr err = dpar__cu_opt_guard(st, dev);
        void *args[] = { &dst, &a, &dst2, &n, &f0, &f1, &f2, &f3, &nesterov, &err, &graph };
        if (n == 0) return DPAR_OK;
        return dpar__cu_launch(st, dev, DPAR__CUK_SGD, dpar__cu_grid(n, 16, 8192), DPAR__CU_BLOCK, s, args);
    }
    default: return dpar__err(DPAR_ERR_BACKEND, "cuda: op %s is not a pointwise op", dpar__op_name(op));
    }
}

/* >>cuda half storage: the 16-bit layer ops through dpar__half_lowered (>>device half storage): the CAST kernel and
   the f32 kernels on temporaries carved from scratch slot 2 (256-byte aligned), reused in stream order without a
   wait; while a graph program is captured the slot is memory of the recording's own (dpar__cu_scratch). */
static dpar_status dpar__cu_half_temps(void *state, int dev, int n, const size_t *nbytes, void **mem) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_dev *d = &st->dev[dev];
    size_t off[7], total = 0;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        total += (nbytes[i] + 255) / 256 * 256;
    }
    dpar__CUdeviceptr base;
    dpar_status s = dpar__cu_scratch(st, dev, 2, total, &base);
    for (int i = 0; i < n && !s; i++) {
        d->half[i].ptr = base + off[i];
        d->half[i].nbytes = nbytes[i];
        mem[i] = &d->half[i];
    }
    return s;
}
static dpar_status dpar__cu_op(void *state, int dev, const dpar__op *op);
static const dpar__half_hooks dpar__cu_half = { dpar__cu_op, dpar__cu_half_temps };

static dpar_status dpar__cu_op(void *state, int dev, const dpar__op *op) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_dev *d = &st->dev[dev];
    dpar__CUstream s = d->compute;
    dpar__CUdeviceptr dst = op->dst ? DPAR__CU_PTR(op->dst) : 0;
    dpar__CUdeviceptr dst2 = op->dst2 ? DPAR__CU_PTR(op->dst2) : 0;
    dpar__CUdeviceptr a = op->src0 ? DPAR__CU_PTR(op->src0) : 0;
    dpar__CUdeviceptr b = op->src1 ? DPAR__CU_PTR(op->src1) : 0;
    int64_t n = op->n;
    dpar_status st2 = dpar__cu_bind(st, dev);
    if (st2) return st2;
    DPAR_ASSERT((int)op->kind >= 0 && op->kind < DPAR__OP_COUNT);
    if (dpar__cpu_half_kind(op->kind) && dpar__op_has_half(op)) return dpar__half_lowered(st, dev, op, &dpar__cu_half);

    switch (op->kind) {
    case DPAR__OP_MATMUL: return dpar__cu_matmul(st, dev, op);
    case DPAR__OP_BIAS_ADD:
    case DPAR__OP_BIAS_GRAD:
    case DPAR__OP_RELU:
    case DPAR__OP_RELU_BWD:
    case DPAR__OP_AXPY:
    case DPAR__OP_SCALE:
    case DPAR__OP_SGD: return dpar__cu_op_pointwise(st, dev, op);
    case DPAR__OP_SOFTMAX_XENT:
    case DPAR__OP_ADAMW:
    case DPAR__OP_EMBED:
    case DPAR__OP_EMBED_BWD:
    case DPAR__OP_DROPOUT: return dpar__cu_op_optim(st, dev, op);
    case DPAR__OP_MSE: {
        dpar__CUdeviceptr scr;
        unsigned g = dpar__cu_grid(n, 8, DPAR__CU_MAX_PARTIALS);
        int64_t parts = g;
        void *args[] = { &a, &b, &n, &dst2, &scr };
        dpar_status e = dpar__cu_scratch(st, dev, 0, DPAR__CU_MAX_PARTIALS * 8, &scr);
        if (e) return e;
        if ((e = dpar__cu_launch(st, dev, DPAR__CUK_MSE_PARTIAL, g, DPAR__CU_BLOCK, s, args))) return e;
        return dpar__cu_final(st, dev, scr, parts, (double)n, dst);
    }
    case DPAR__OP_SUM:
    case DPAR__OP_SUMSQ: {
        dpar__CUdeviceptr scr;
        int mode = op->kind == DPAR__OP_SUMSQ;
        unsigned g = dpar__cu_grid(n, 8, DPAR__CU_MAX_PARTIALS);
        int64_t parts = g;
        void *args[] = { &a, &n, &mode, &scr };
        dpar_status e = dpar__cu_scratch(st, dev, 0, DPAR__CU_MAX_PARTIALS * 8, &scr);
        if (e) return e;
        if ((e = dpar__cu_launch(st, dev, DPAR__CUK_REDUCE_PARTIAL, g, DPAR__CU_BLOCK, s, args))) return e;
        return dpar__cu_final(st, dev, scr, parts, 1.0, dst + (dpar__CUdeviceptr)op->p[0] * sizeof(float));
    }
    case DPAR__OP_FILL: return dpar__cu_op_fill(st, dev, op);
    case DPAR__OP_COPY: {
        size_t nb = op->src0->nbytes < op->dst->nbytes ? op->src0->nbytes : op->dst->nbytes;
        if (!nb || dst == a) return DPAR_OK;
        DPAR__CU_TRY(dev, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(dst, a, nb, s));
        return DPAR_OK;
    }
    case DPAR__OP_CAST: {
        int dt = (int)op->dst->dtype, stt = (int)op->src0->dtype;
        int64_t cnt = op->dst->count;
        void *args[] = { &dst, &dt, &a, &stt, &cnt };
        if (cnt == 0) return DPAR_OK;
        if (dt == stt) {
            if (dst != a)
                DPAR__CU_TRY(dev, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(dst, a, op->dst->nbytes, s));
            return DPAR_OK;
        }
        return dpar__cu_launch(st, dev, DPAR__CUK_CAST, dpar__cu_grid(cnt, 8, 8192), DPAR__CU_BLOCK, s, args);
    }
    case DPAR__OP_UNARY:
    case DPAR__OP_UNARY_BWD:
    case DPAR__OP_BINARY:
    case DPAR__OP_REDUCE:
    case DPAR__OP_WHERE:
    case DPAR__OP_SOFTMAX:
    case DPAR__OP_SOFTMAX_BWD:
    case DPAR__OP_STRIDED: return dpar__cu_op_elem(st, dev, op);
    /* >>norm-attn kinds */
    case DPAR__OP_NORM:
    case DPAR__OP_NORM_BWD: return dpar__cu_op_norm(st, dev, op);
    case DPAR__OP_MATMUL_BATCHED: return dpar__cu_op_matmul_batched(st, dev, op);
    case DPAR__OP_ATTN:
    case DPAR__OP_ATTN_BWD_Q:
    case DPAR__OP_ATTN_BWD_KV: return dpar__cu_op_attn(st, dev, op);
    /* >>conv-pool kinds */
    case DPAR__OP_CONV2D:
    case DPAR__OP_CONV2D_BWD_INPUT:
    case DPAR__OP_CONV2D_BWD_KERNEL: return dpar__cu_op_conv(st, dev, op);
    case DPAR__OP_AVG_POOL:
    case DPAR__OP_AVG_POOL_BWD:
    case DPAR__OP_MAX_POOL:
    case DPAR__OP_MAX_POOL_BWD: return dpar__cu_op_pool(st, dev, op);
    default: return dpar__op_unsupported("cuda", op);
    }
}

/* >>cuda graphs ===============================================================
   Recorded graph programs (the prog_* hooks of the backend interface) as CUDA
   Graphs: the device ops a graph issues between two host nodes are captured
   from the compute stream (cuStreamBeginCapture, relaxed mode, so the scratch
   allocations below stay legal), instantiated once and re-launched every step
   with cuGraphLaunch, one launch instead of one per kernel. A capture that
   breaks a rule of stream capture fails; the graph then replays that device op
   by op, with the same results. A recording owns the scratch its ops asked for
   (freed with it) and remembers whether it runs index checks, so that each
   replay's bad label is reported at the next sync as op by op. */

static dpar_status dpar__cu_prog_scratch(dpar__cu_state *st, int dev, size_t bytes, dpar__CUdeviceptr *out) {
    dpar__cu_prog *pr = st->dev[dev].cap;
    if (pr->nmem == pr->capmem) {
        int cap = pr->capmem ? 2 * pr->capmem : 8;
        dpar__CUdeviceptr *m = (dpar__CUdeviceptr *)DPAR_REALLOC(pr->mem, (size_t)cap * sizeof *m);
        if (!m) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cuda: device %d: out of host memory (graph program)", dev);
        pr->mem = m;
        pr->capmem = cap;
    }
    DPAR__CU_TRY(dev, "cuMemAlloc(graph program scratch)", dpar__cu.cuMemAlloc(out, bytes));
    pr->mem[pr->nmem++] = *out;
    return DPAR_OK;
}

/* Waits for the device's last launch of pr, then frees it. */
static void dpar__cu_prog_free(void *state, int dev, void *prog) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_prog *pr = (dpar__cu_prog *)prog;
    if (!pr) return;
    int idle = !dpar__cu_bind(st, dev) && !dpar__cu_wait(st, dev, st->dev[dev].compute, "graph program free");
    if (pr->exec) dpar__cu.cuGraphExecDestroy(pr->exec);
    if (pr->graph) dpar__cu.cuGraphDestroy(pr->graph);
    for (int i = 0; idle && i < pr->nmem; i++) dpar__cu.cuMemFree(pr->mem[i]); /* else kept: work may still read it */
    DPAR_FREE(pr->mem);
    DPAR_FREE(pr);
}

static dpar_status dpar__cu_prog_begin(void *state, int dev) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_dev *d = &st->dev[dev];
    dpar_status s;
    if ((s = dpar__cu_bind(st, dev)) || (s = dpar__cu_idx_words(st, dev))) return s;
    dpar__cu_prog *pr = (dpar__cu_prog *)DPAR_MALLOC(sizeof *pr);
    if (!pr) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cuda: device %d: out of host memory (graph program)", dev);
    memset(pr, 0, sizeof *pr);
    dpar__CUresult r = dpar__cu.cuStreamBeginCapture(d->compute, DPAR__CU_STREAM_CAPTURE_MODE_RELAXED);
    if (r != DPAR__CUDA_SUCCESS) {
        DPAR_FREE(pr);
        return dpar__cu_fail(dev, "cuStreamBeginCapture", r);
    }
    d->cap = pr;
    return DPAR_OK;
}

static dpar_status dpar__cu_prog_end(void *state, int dev, void **prog) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_dev *d = &st->dev[dev];
    dpar__cu_prog *pr = d->cap;
    d->cap = NULL;
    *prog = NULL;
    dpar__CUresult r = dpar__cu.cuStreamEndCapture(d->compute, &pr->graph);
    if (r == DPAR__CUDA_SUCCESS && pr->graph) r = dpar__cu.cuGraphInstantiateWithFlags(&pr->exec, pr->graph, 0);
    if (r != DPAR__CUDA_SUCCESS || !pr->graph) {
        dpar__cu_prog_free(st, dev, pr);
        return dpar__cu_fail(dev, r == DPAR__CUDA_SUCCESS ? "cuStreamEndCapture (no graph)" : "cuStreamEndCapture", r);
    }
    *prog = pr;
    return DPAR_OK;
}

static dpar_status dpar__cu_prog_submit(void *state, int dev, void *prog) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    dpar__cu_prog *pr = (dpar__cu_prog *)prog;
    dpar_status s = dpar__cu_bind(st, dev);
    if (s) return s;
    DPAR__CU_TRY(dev, "cuGraphLaunch", dpar__cu.cuGraphLaunch(pr->exec, st->dev[dev].compute));
    if (pr->checks) DPAR__ATOMIC_STORE(&st->dev[dev].idx_pending, 1);
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   Collectives, shared pieces
   ------------------------------------------------------------------------ */
static int dpar__cu_nccl_type(dpar_dtype t) {
    switch (t) {
    case DPAR_F16: return DPAR__ncclFloat16;
    case DPAR_BF16: return DPAR__ncclBfloat16;
    case DPAR_I32: return DPAR__ncclInt32;
    default: return DPAR__ncclFloat32;
    }
}

/* Strided copy of one block (elements of size es), see dpar_k_copy_nd. */
static dpar_status dpar__cu_copy_nd(dpar__cu_state *st, int dev, dpar__CUstream s, dpar__CUdeviceptr dst,
                                    dpar__CUdeviceptr src, int es, int nd, const int64_t *shape, const int64_t *ss,
                                    const int64_t *ds) {
    dpar__cu_nd g;
    int64_t total = 1;
    int k;
    void *args[] = { &dst, &src, &es, &nd, &g, &total };
    memset(&g, 0, sizeof g);
    for (k = 0; k < nd; k++) {
        g.shape[k] = shape[k];
        g.ss[k] = ss[k];
        g.ds[k] = ds[k];
        total *= shape[k];
    }
    if (total == 0) return DPAR_OK;
    return dpar__cu_launch(st, dev, DPAR__CUK_COPY_ND, dpar__cu_grid(total, 4, 8192), DPAR__CU_BLOCK, s, args);
}

static void dpar__cu_strides(int nd, const int64_t *shape, int64_t *strides) {
    int64_t acc = 1;
    int k;
    for (k = nd - 1; k >= 0; k--) {
        strides[k] = acc;
        acc *= shape[k];
    }
}

/* all_to_all geometry: block shape (split dim / n), strides of in and out */
typedef struct dpar__cu_a2a {
    int nd;
    int64_t blk[DPAR_MAX_DIMS], in_st[DPAR_MAX_DIMS], out_shape[DPAR_MAX_DIMS], out_st[DPAR_MAX_DIMS];
    int64_t blk_st[DPAR_MAX_DIMS], blk_count;
    int64_t in_step, out_step; /* elements between consecutive blocks in in / out */
} dpar__cu_a2a;

static void dpar__cu_a2a_geom(const dpar__coll *c, dpar__cu_a2a *g) {
    int k;
    g->nd = c->ndim;
    for (k = 0; k < c->ndim; k++) g->blk[k] = g->out_shape[k] = c->in_shape[k];
    g->blk[c->split_dim] = c->in_shape[c->split_dim] / c->n;
    g->out_shape[c->split_dim] = g->blk[c->split_dim];
    g->out_shape[c->concat_dim] = g->out_shape[c->concat_dim] * c->n;
    dpar__cu_strides(c->ndim, c->in_shape, g->in_st);
    dpar__cu_strides(c->ndim, g->out_shape, g->out_st);
    dpar__cu_strides(c->ndim, g->blk, g->blk_st);
    g->blk_count = 1;
    for (k = 0; k < c->ndim; k++) g->blk_count *= g->blk[k];
    g->in_step = g->blk[c->split_dim] * g->in_st[c->split_dim];
    g->out_step = g->blk[c->concat_dim] * g->out_st[c->concat_dim];
}

/* A 1-member group: out = in (every kind reduces to a copy, or zeros for a
   permute without source). */
static dpar_status dpar__cu_coll_local(dpar__cu_state *st, int dev, dpar__coll *c) {
    dpar__CUstream s = st->dev[dev].compute;
    dpar__CUdeviceptr in = DPAR__CU_PTR(c->in[0]), out = DPAR__CU_PTR(c->out[0]);
    size_t nb = c->out[0]->nbytes;
    if (!nb) return DPAR_OK;
    if (c->kind == DPAR__COLL_PERMUTE && c->src_of[0] < 0) {
        DPAR__CU_TRY(dev, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(out, 0, nb, s));
        return DPAR_OK;
    }
    if (in != out) DPAR__CU_TRY(dev, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(out, in, nb, s));
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   Collectives between virtual devices of one GPU (device memory, own kernels)
   ------------------------------------------------------------------------ */
/* Every member records an event after its pending work, then waits in its
   stream for everyone else's: afterwards any member may touch any member's
   buffers in its own stream. */
static dpar_status dpar__cu_vphase(dpar__cu_state *st, dpar__coll *c, int use_done) {
    int me = c->devices[c->rank], i;
    dpar__cu_dev *d = &st->dev[me];
    dpar_status s;
    DPAR__CU_TRY(me, "cuEventRecord", dpar__cu.cuEventRecord(use_done ? d->ev_done : d->ev_ready, d->compute));
    if ((s = dpar__coll_barrier(c))) return s;
    for (i = 0; i < c->n; i++) {
        dpar__cu_dev *o = &st->dev[c->devices[i]];
        if (i == c->rank) continue;
        DPAR__CU_TRY(me, "cuStreamWaitEvent",
                     dpar__cu.cuStreamWaitEvent(d->compute, use_done ? o->ev_done : o->ev_ready, 0));
    }
    return DPAR_OK;
}

static dpar_status dpar__cu_coll_virtual(dpar__cu_state *st, dpar__coll *c) {
    int me = c->devices[c->rank], r = c->rank, n = c->n, i;
    dpar__CUstream s = st->dev[me].compute;
    size_t es = dpar_dtype_size(c->dtype);
    int esi = (int)es, dt = (int)c->dtype, op = (int)c->op;
    dpar_status e;
    if ((e = dpar__cu_vphase(st, c, 0))) return e;

    switch (c->kind) {
    case DPAR__COLL_ALL_REDUCE:
    case DPAR__COLL_REDUCE_SCATTER: {
        dpar__cu_ptrs p;
        int nin = n, nout;
        int64_t begin, end, inner, in_stride, in_off;
        memset(&p, 0, sizeof p);
        for (i = 0; i < n; i++) p.in[i] = DPAR__CU_PTR(c->in[i]);
        if (c->kind == DPAR__COLL_ALL_REDUCE) {
            /* member r reduces chunk r of the elements and writes it to everyone */
            int64_t chunk = (c->count + n - 1) / n;
            for (i = 0; i < n; i++) p.out[i] = DPAR__CU_PTR(c->out[i]);
            nout = n;
            begin = chunk * r;
            end = begin + chunk;
            if (begin > c->count) begin = c->count;
            if (end > c->count) end = c->count;
            inner = c->count > 0 ? c->count : 1;
            in_stride = 0;
            in_off = 0;
        } else {
            /* member r computes its own block: out_r[o, i] = sum_s in_s[o, r, i] */
            p.out[0] = DPAR__CU_PTR(c->out[r]);
            nout = 1;
            begin = 0;
            end = c->outer * c->inner;
            inner = c->inner > 0 ? c->inner : 1;
            in_stride = (int64_t)n * c->inner;
            in_off = (int64_t)r * c->inner;
            if (op != DPAR_MEAN && op != DPAR_MAX && op != DPAR_MIN) op = DPAR_SUM;
        }
        if (end > begin) {
            void *args[] = { &p, &nin, &nout, &begin, &end, &inner, &in_stride, &in_off, &dt, &op };
            if ((e = dpar__cu_launch(st, me, DPAR__CUK_VREDUCE, dpar__cu_grid(end - begin, 4, 8192), DPAR__CU_BLOCK, s,
                                     args)))
                return e;
        }
        break;
    }
    case DPAR__COLL_ALL_GATHER: {
        /* my in [outer, inner] -> everyone's out[:, r, :] */
        int64_t shape[2] = { c->outer, c->inner }, ss[2] = { c->inner, 1 }, ds[2] = { (int64_t)n * c->inner, 1 };
        for (i = 0; i < n; i++) {
            dpar__CUdeviceptr dst = DPAR__CU_PTR(c->out[i]) + (dpar__CUdeviceptr)((size_t)r * (size_t)c->inner * es);
            if ((e = dpar__cu_copy_nd(st, me, s, dst, DPAR__CU_PTR(c->in[r]), esi, 2, shape, ss, ds))) return e;
        }
        break;
    }
    case DPAR__COLL_ALL_TO_ALL: {
        /* my block j -> member j's out at concat position r */
        dpar__cu_a2a g;
        dpar__cu_a2a_geom(c, &g);
        for (i = 0; i < n; i++) {
            dpar__CUdeviceptr src = DPAR__CU_PTR(c->in[r]) + (dpar__CUdeviceptr)((size_t)(g.in_step * i) * es);
            dpar__CUdeviceptr dst = DPAR__CU_PTR(c->out[i]) + (dpar__CUdeviceptr)((size_t)(g.out_step * r) * es);
            if ((e = dpar__cu_copy_nd(st, me, s, dst, src, esi, g.nd, g.blk, g.in_st, g.out_st))) return e;
        }
        break;
    }
    case DPAR__COLL_BROADCAST: {
        dpar__CUdeviceptr src = DPAR__CU_PTR(c->in[c->root]), dst = DPAR__CU_PTR(c->out[r]);
        size_t nb = (size_t)c->count * es;
        if (nb && src != dst) DPAR__CU_TRY(me, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(dst, src, nb, s));
        break;
    }
    case DPAR__COLL_PERMUTE: {
        /* in place is allowed: receive into scratch, let everyone finish
           reading, then copy into out */
        size_t nb = (size_t)c->count * es;
        dpar__CUdeviceptr scr = 0, dst = DPAR__CU_PTR(c->out[r]);
        int src = c->src_of[r];
        if (nb && src >= 0) {
            if ((e = dpar__cu_scratch(st, me, 1, nb, &scr))) return e;
            DPAR__CU_TRY(me, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(scr, DPAR__CU_PTR(c->in[src]), nb, s));
        }
        if ((e = dpar__cu_vphase(st, c, 1))) return e;
        if (nb) {
            if (src >= 0)
                DPAR__CU_TRY(me, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(dst, scr, nb, s));
            else
                DPAR__CU_TRY(me, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(dst, 0, nb, s));
        }
        return DPAR_OK; /* nobody else touches out[r] */
    }
    default:
        return dpar__err(
            DPAR_ERR_INVALID_ARGUMENT,
            "cuda: unknown collective kind %d (internal error: the core passes only dpar__coll_kind values)",
            (int)c->kind);
    }
    return dpar__cu_vphase(st, c, 1);
}

/* ---------------------------------------------------------------------------
   Collectives across GPUs through NCCL
   ------------------------------------------------------------------------ */
/* The communicator set of a group, created on first use by whichever member
   arrives first and cached by the group's device list. Inside one process:
   ncclCommInitAll over the members' GPUs. Across processes (c->cross): every
   process creates its local members' ranks with ncclCommInitRank from the
   bootstrap id the core broadcast over MPI (c->xid, made by cross_id on the
   process holding member 0), in one ncclGroupStart/End, as NCCL requires
   when one thread initializes several ranks; NCCL connects the processes.
   The creator runs the init outside the lock, so members of other groups
   can keep looking up their (ready) communicators meanwhile; members of
   this group wait for it (with the runtime timeout). */
static int dpar__cu_comm_init_cross(dpar__cu_state *st, dpar__cu_comm *cm, const dpar__coll *c, int *failed_member) {
    dpar__ncclUniqueId id;
    int i, r, r2;
    memcpy(&id, c->xid, sizeof id);
    *failed_member = -1;
    r = dpar__cu.ncclGroupStart();
    if (r != DPAR__ncclSuccess) return r;
    for (i = 0; i < c->n; i++) {
        if (c->devices[i] < 0) continue;
        dpar__cu.cuCtxSetCurrent(
            st->phys[st->dev[c->devices[i]].phys].ctx); /* NCCL binds the rank to the current GPU */
        r = dpar__cu.ncclCommInitRank(&cm->comms[i], c->n, id, i);
        if (r != DPAR__ncclSuccess && r != DPAR__ncclInProgress) {
            *failed_member = i;
            break;
        }
        r = DPAR__ncclSuccess;
    }
    r2 = dpar__cu.ncclGroupEnd();
    return r != DPAR__ncclSuccess ? r : r2;
}

static dpar_status dpar__cu_get_comm(dpar__cu_state *st, dpar__coll *c, dpar__ncclComm *out) {
    dpar__cu_comm *cm;
    int me = c->devices[c->rank], i, r;
    const int *key = c->cross ? c->gdevices : c->devices;
    dpar_status s = DPAR_OK;
    dpar__mutex_lock(&st->comm_lock);
    for (cm = st->comms; cm; cm = cm->next) {
        const int *ck = cm->cross ? cm->gdevices : cm->devices;
        if (cm->n != c->n || cm->cross != c->cross) continue;
        for (i = 0; i < c->n && ck[i] == key[i]; i++) {}
        if (i == c->n) break;
    }
    if (!cm) {
        int ords[DPAR_MAX_DEVICES], bad = -1;
        cm = (dpar__cu_comm *)DPAR_MALLOC(sizeof *cm);
        if (!cm) {
            dpar__mutex_unlock(&st->comm_lock);
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
        }
        memset(cm, 0, sizeof *cm);
        cm->n = c->n;
        cm->cross = c->cross;
        for (i = 0; i < c->n; i++) {
            cm->devices[i] = c->devices[i];
            cm->gdevices[i] = c->cross ? c->gdevices[i] : c->devices[i];
            if (!c->cross) ords[i] = st->phys[st->dev[c->devices[i]].phys].ordinal;
        }
        cm->next = st->comms;
        st->comms = cm;
        dpar__mutex_unlock(&st->comm_lock);
        r = c->cross ? dpar__cu_comm_init_cross(st, cm, c, &bad) : dpar__cu.ncclCommInitAll(cm->comms, c->n, ords);
        dpar__mutex_lock(&st->comm_lock);
        if (r != DPAR__ncclSuccess) {
            cm->failed = 1;
            if (c->cross) {
                char call[96];
                snprintf(call, sizeof call, "ncclCommInitRank (rank %d of %d, across processes)",
                         bad >= 0 ? bad : c->rank, c->n);
                s = dpar__nccl_fail(me, call, r, NULL);
            } else {
                s = dpar__nccl_fail(me, "ncclCommInitAll", r, NULL);
            }
        } else {
            cm->ready = 1;
            DPAR__ATOMIC_STORE(&st->ncomms, st->ncomms + 1);
        }
        dpar__cond_broadcast(&st->comm_cv);
    } else {
        uint64_t dl = dpar__deadline(st->timeout_ms);
        while (!cm->ready && !cm->failed) {
            if (dpar__cond_timedwait(&st->comm_cv, &st->comm_lock, dl) == ETIMEDOUT && !cm->ready && !cm->failed) {
                s = dpar__err(DPAR_ERR_TIMEOUT,
                              "cuda: device %d: %s for this group did not finish within %d ms "
                              "(DPAR_TIMEOUT_MS)",
                              me, c->cross ? "ncclCommInitRank" : "ncclCommInitAll", st->timeout_ms);
                break;
            }
        }
        if (!s && cm->failed)
            s = dpar__err(DPAR_ERR_BACKEND,
                          "cuda: device %d: creating the NCCL communicators of this group failed "
                          "(see the error of the member that created them)",
                          me);
    }
    if (!s && cm->aborted)
        s = dpar__err(DPAR_ERR_BACKEND,
                      "cuda: device %d: the NCCL communicator of this group was aborted "
                      "after an earlier error or timeout; destroy and recreate the runtime",
                      me);
    if (!s) *out = cm->comms[c->rank];
    dpar__mutex_unlock(&st->comm_lock);
    if (!s) s = dpar__cu_bind(st, me); /* NCCL may have switched the current device */
    return s;
}

/* Collectives over groups that span processes: NCCL across processes, on
   real GPUs only (NCCL cannot put two ranks on one GPU, so not with virtual
   devices); the core falls back to its host-staged MPI path unless every
   process can. */
static size_t dpar__cu_cross_id_size(void *state) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    return !st->virt && dpar__cu.lib_nccl ? sizeof(dpar__ncclUniqueId) : 0;
}
static dpar_status dpar__cu_cross_id(void *state, void *id) {
    int r;
    (void)state;
    r = dpar__cu.ncclGetUniqueId((dpar__ncclUniqueId *)id);
    if (r != DPAR__ncclSuccess) return dpar__nccl_fail(-1, "ncclGetUniqueId", r, NULL);
    return DPAR_OK;
}

#define DPAR__NCCL_TRY(dev, call, comm, expr)                                                                         \
    do {                                                                                                              \
        int r_ = (expr);                                                                                              \
        if (r_ != DPAR__ncclSuccess && r_ != DPAR__ncclInProgress) return dpar__nccl_fail((dev), (call), r_, (comm)); \
    } while (0)

/* all-reduce: NCCL sum/avg; i32 mean as a sum then a truncating division; float
   max/min through order-preserving i32 keys so NaN propagates. */
static dpar_status dpar__cu_nccl_all_reduce(dpar__cu_state *st, dpar__coll *c, dpar__ncclComm comm, dpar__CUstream s) {
    int me = c->devices[c->rank], r = c->rank, n = c->n, nt = dpar__cu_nccl_type(c->dtype);
    dpar__CUdeviceptr in = DPAR__CU_PTR(c->in[r]), out = DPAR__CU_PTR(c->out[r]);
    void *inp = (void *)(uintptr_t)in, *outp = (void *)(uintptr_t)out;
    dpar_status e;
    size_t cnt = (size_t)c->count;
    if (c->op == DPAR_SUM || (c->op == DPAR_MEAN && c->dtype != DPAR_I32)) {
        DPAR__NCCL_TRY(
            me, "ncclAllReduce", comm,
            dpar__cu.ncclAllReduce(inp, outp, cnt, nt, c->op == DPAR_SUM ? DPAR__ncclSum : DPAR__ncclAvg, comm, s));
    } else if (c->op == DPAR_MEAN) { /* i32: wrap-around sum, then truncating division */
        int64_t n64 = c->count;
        int32_t div = n;
        void *args[] = { &out, &n64, &div };
        DPAR__NCCL_TRY(me, "ncclAllReduce", comm, dpar__cu.ncclAllReduce(inp, outp, cnt, nt, DPAR__ncclSum, comm, s));
        if (cnt &&
            (e = dpar__cu_launch(st, me, DPAR__CUK_DIV_I32, dpar__cu_grid(n64, 4, 8192), DPAR__CU_BLOCK, s, args)))
            return e;
    } else if (c->dtype == DPAR_I32) {
        DPAR__NCCL_TRY(
            me, "ncclAllReduce", comm,
            dpar__cu.ncclAllReduce(inp, outp, cnt, nt, c->op == DPAR_MAX ? DPAR__ncclMax : DPAR__ncclMin, comm, s));
    } else { /* float max/min: order-preserving i32 keys, NaN as the extreme key */
        dpar__CUdeviceptr keys = out;
        int64_t n64 = c->count;
        int is_max = c->op == DPAR_MAX, stt = (int)c->dtype, dt = (int)c->dtype;
        if (c->dtype != DPAR_F32 && (e = dpar__cu_scratch(st, me, 1, cnt * 4, &keys))) return e;
        if (cnt) {
            void *a1[] = { &keys, &in, &stt, &n64, &is_max };
            if ((e = dpar__cu_launch(st, me, DPAR__CUK_TO_KEY, dpar__cu_grid(n64, 4, 8192), DPAR__CU_BLOCK, s, a1)))
                return e;
        }
        DPAR__NCCL_TRY(me, "ncclAllReduce", comm,
                       dpar__cu.ncclAllReduce((void *)(uintptr_t)keys, (void *)(uintptr_t)keys, cnt, DPAR__ncclInt32,
                                              is_max ? DPAR__ncclMax : DPAR__ncclMin, comm, s));
        if (cnt) {
            void *a2[] = { &out, &dt, &keys, &n64, &is_max };
            if ((e = dpar__cu_launch(st, me, DPAR__CUK_FROM_KEY, dpar__cu_grid(n64, 4, 8192), DPAR__CU_BLOCK, s, a2)))
                return e;
        }
    }
    return DPAR_OK;
}

/* ppermute: grouped send/recv; zeros where no member sends. */
static dpar_status dpar__cu_nccl_permute(dpar__cu_state *st, dpar__coll *c, dpar__ncclComm comm, dpar__CUstream s) {
    int me = c->devices[c->rank], r = c->rank, n = c->n, i, nt = dpar__cu_nccl_type(c->dtype);
    size_t es = dpar_dtype_size(c->dtype);
    dpar__CUdeviceptr in = DPAR__CU_PTR(c->in[r]), out = DPAR__CU_PTR(c->out[r]);
    void *inp = (void *)(uintptr_t)in;
    dpar_status e;
    size_t cnt = (size_t)c->count, nb = cnt * es;
    int src = c->src_of[r], dst_member = -1;
    dpar__CUdeviceptr recv = out;
    for (i = 0; i < n; i++)
        if (c->src_of[i] == r && i != r) dst_member = i;
    if (src >= 0 && src != r && dst_member >= 0 && in == out) {
        if ((e = dpar__cu_scratch(st, me, 1, nb, &recv))) return e;
    }
    if (cnt) {
        DPAR__NCCL_TRY(me, "ncclGroupStart", comm, dpar__cu.ncclGroupStart());
        if (dst_member >= 0) {
            int rs = dpar__cu.ncclSend(inp, cnt, nt, dst_member, comm, s);
            if (rs != DPAR__ncclSuccess && rs != DPAR__ncclInProgress) {
                dpar__cu.ncclGroupEnd();
                return dpar__nccl_fail(me, "ncclSend", rs, comm);
            }
        }
        if (src >= 0 && src != r) {
            int rr = dpar__cu.ncclRecv((void *)(uintptr_t)recv, cnt, nt, src, comm, s);
            if (rr != DPAR__ncclSuccess && rr != DPAR__ncclInProgress) {
                dpar__cu.ncclGroupEnd();
                return dpar__nccl_fail(me, "ncclRecv", rr, comm);
            }
        }
        DPAR__NCCL_TRY(me, "ncclGroupEnd", comm, dpar__cu.ncclGroupEnd());
    }
    if (!nb) return DPAR_OK;
    if (src < 0)
        DPAR__CU_TRY(me, "cuMemsetD8Async", dpar__cu.cuMemsetD8Async(out, 0, nb, s));
    else if (src == r) {
        if (in != out) DPAR__CU_TRY(me, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(out, in, nb, s));
    } else if (recv != out)
        DPAR__CU_TRY(me, "cuMemcpyDtoDAsync", dpar__cu.cuMemcpyDtoDAsync(out, recv, nb, s));
    return DPAR_OK;
}

/* all_to_all: pack blocks contiguously, exchange with grouped send/recv, unpack. */
static dpar_status dpar__cu_nccl_all_to_all(dpar__cu_state *st, dpar__coll *c, dpar__ncclComm comm, dpar__CUstream s) {
    int me = c->devices[c->rank], r = c->rank, n = c->n, i, nt = dpar__cu_nccl_type(c->dtype);
    size_t es = dpar_dtype_size(c->dtype);
    int esi = (int)es;
    dpar__CUdeviceptr in = DPAR__CU_PTR(c->in[r]), out = DPAR__CU_PTR(c->out[r]);
    dpar_status e;
    /* pack blocks contiguously, exchange with grouped send/recv, unpack */
    dpar__cu_a2a g;
    dpar__CUdeviceptr sbuf, rbuf;
    size_t bb;
    dpar__cu_a2a_geom(c, &g);
    bb = (size_t)g.blk_count * es;
    if (!bb) return DPAR_OK;
    if ((e = dpar__cu_scratch(st, me, 1, bb * (size_t)n, &sbuf))) return e;
    if ((e = dpar__cu_scratch(st, me, 2, bb * (size_t)n, &rbuf))) return e;
    for (i = 0; i < n; i++)
        if ((e = dpar__cu_copy_nd(st, me, s, sbuf + bb * (size_t)i, in + (size_t)(g.in_step * i) * es, esi, g.nd, g.blk,
                                  g.in_st, g.blk_st)))
            return e;
    DPAR__NCCL_TRY(me, "ncclGroupStart", comm, dpar__cu.ncclGroupStart());
    for (i = 0; i < n; i++) {
        int rs, rr;
        if (i == r) continue;
        rs = dpar__cu.ncclSend((void *)(uintptr_t)(sbuf + bb * (size_t)i), (size_t)g.blk_count, nt, i, comm, s);
        rr = rs == DPAR__ncclSuccess || rs == DPAR__ncclInProgress
                 ? dpar__cu.ncclRecv((void *)(uintptr_t)(rbuf + bb * (size_t)i), (size_t)g.blk_count, nt, i, comm, s)
                 : rs;
        if (rr != DPAR__ncclSuccess && rr != DPAR__ncclInProgress) {
            dpar__cu.ncclGroupEnd();
            return dpar__nccl_fail(me, "ncclSend/ncclRecv (all_to_all)", rr, comm);
        }
    }
    DPAR__NCCL_TRY(me, "ncclGroupEnd", comm, dpar__cu.ncclGroupEnd());
    DPAR__CU_TRY(me, "cuMemcpyDtoDAsync",
                 dpar__cu.cuMemcpyDtoDAsync(rbuf + bb * (size_t)r, sbuf + bb * (size_t)r, bb, s));
    for (i = 0; i < n; i++)
        if ((e = dpar__cu_copy_nd(st, me, s, out + (size_t)(g.out_step * i) * es, rbuf + bb * (size_t)i, esi, g.nd,
                                  g.blk, g.blk_st, g.out_st)))
            return e;
    return DPAR_OK;
}

static dpar_status dpar__cu_coll_nccl_body(dpar__cu_state *st, dpar__coll *c, dpar__ncclComm comm, dpar__CUstream s) {
    int me = c->devices[c->rank], r = c->rank, n = c->n;
    size_t es = dpar_dtype_size(c->dtype);
    int esi = (int)es, nt = dpar__cu_nccl_type(c->dtype);
    dpar__CUdeviceptr in = DPAR__CU_PTR(c->in[r]), out = DPAR__CU_PTR(c->out[r]);
    void *inp = (void *)(uintptr_t)in, *outp = (void *)(uintptr_t)out;
    dpar_status e;

    switch (c->kind) {
    case DPAR__COLL_ALL_REDUCE: return dpar__cu_nccl_all_reduce(st, c, comm, s);
    case DPAR__COLL_BROADCAST:
        DPAR__NCCL_TRY(me, "ncclBroadcast", comm,
                       dpar__cu.ncclBroadcast(inp, outp, (size_t)c->count, nt, c->root, comm, s));
        return DPAR_OK;
    case DPAR__COLL_ALL_GATHER: {
        size_t piece = (size_t)(c->outer * c->inner);
        dpar__CUdeviceptr tmp;
        int64_t shape[3] = { n, c->outer, c->inner };
        int64_t ss[3] = { c->outer * c->inner, c->inner, 1 }, ds[3] = { c->inner, (int64_t)n * c->inner, 1 };
        if (c->outer == 1) {
            DPAR__NCCL_TRY(me, "ncclAllGather", comm, dpar__cu.ncclAllGather(inp, outp, piece, nt, comm, s));
            return DPAR_OK;
        }
        if ((e = dpar__cu_scratch(st, me, 1, piece * (size_t)n * es, &tmp))) return e;
        DPAR__NCCL_TRY(me, "ncclAllGather", comm,
                       dpar__cu.ncclAllGather(inp, (void *)(uintptr_t)tmp, piece, nt, comm, s));
        return dpar__cu_copy_nd(st, me, s, out, tmp, esi, 3, shape, ss, ds); /* [n,outer,inner] -> [outer,n,inner] */
    }
    case DPAR__COLL_REDUCE_SCATTER: {
        size_t piece = (size_t)(c->outer * c->inner);
        int rop = c->op == DPAR_MEAN && c->dtype != DPAR_I32 ? DPAR__ncclAvg
                  : c->op == DPAR_MAX                        ? DPAR__ncclMax
                  : c->op == DPAR_MIN                        ? DPAR__ncclMin
                                                             : DPAR__ncclSum;
        dpar__CUdeviceptr src = in;
        if (c->outer != 1) { /* [outer, n, inner] -> [n, outer, inner] */
            int64_t shape[3] = { c->outer, n, c->inner };
            int64_t ss[3] = { (int64_t)n * c->inner, c->inner, 1 }, ds[3] = { c->inner, c->outer * c->inner, 1 };
            if ((e = dpar__cu_scratch(st, me, 1, piece * (size_t)n * es, &src))) return e;
            if ((e = dpar__cu_copy_nd(st, me, s, src, in, esi, 3, shape, ss, ds))) return e;
        }
        DPAR__NCCL_TRY(me, "ncclReduceScatter", comm,
                       dpar__cu.ncclReduceScatter((void *)(uintptr_t)src, outp, piece, nt, rop, comm, s));
        if (c->op == DPAR_MEAN && c->dtype == DPAR_I32 && piece) {
            int64_t n64 = (int64_t)piece;
            int32_t div = n;
            void *args[] = { &out, &n64, &div };
            return dpar__cu_launch(st, me, DPAR__CUK_DIV_I32, dpar__cu_grid(n64, 4, 8192), DPAR__CU_BLOCK, s, args);
        }
        return DPAR_OK;
    }
    case DPAR__COLL_PERMUTE: return dpar__cu_nccl_permute(st, c, comm, s);
    case DPAR__COLL_ALL_TO_ALL: return dpar__cu_nccl_all_to_all(st, c, comm, s);
    default:
        return dpar__err(
            DPAR_ERR_INVALID_ARGUMENT,
            "cuda: unknown collective kind %d (internal error: the core passes only dpar__coll_kind values)",
            (int)c->kind);
    }
}

/* An asynchronous collective (c->async: dpar_*_start, on the comm thread) hops compute -> comm stream -> compute, so
   compute issued after it overlaps it until someone reads its output. A blocking one, issued by the device's own
   thread, has nothing to overlap: it goes on the compute stream, without the two stream waits (a 1 MB 1-rank
   all-reduce took 7.1 us through the hop on the H200, raw NCCL 5.2). Either way pre / post bracket it on its stream
   for dpar__cu_wait's hang watchdog, and the compute stream runs it after what came before and before what follows. */
static dpar_status dpar__cu_coll_nccl(dpar__cu_state *st, dpar__coll *c) {
    int me = c->devices[c->rank], slot;
    dpar__cu_dev *d = &st->dev[me];
    dpar__CUstream s = c->async ? d->comm : d->compute;
    dpar__ncclComm comm = NULL;
    dpar_status e = dpar__cu_get_comm(st, c, &comm);
    if (e) return e;
    /* collectives of one device are issued one at a time; the lock only
       guards ring_head / ring_tail against a concurrent dpar__cu_wait */
    dpar__mutex_lock(&d->ring_mu);
    slot = (int)(d->ring_head % DPAR__CU_RING);
    if (d->ring_head - d->ring_tail >= DPAR__CU_RING) d->ring_tail = d->ring_head - DPAR__CU_RING + 1;
    dpar__mutex_unlock(&d->ring_mu);
    DPAR__CU_TRY(me, "cuEventRecord", dpar__cu.cuEventRecord(d->pre[slot], d->compute));
    if (c->async) DPAR__CU_TRY(me, "cuStreamWaitEvent", dpar__cu.cuStreamWaitEvent(d->comm, d->pre[slot], 0));
    e = dpar__cu_coll_nccl_body(st, c, comm, s);
    DPAR__CU_TRY(me, "cuEventRecord", dpar__cu.cuEventRecord(d->post[slot], s));
    if (c->async) DPAR__CU_TRY(me, "cuStreamWaitEvent", dpar__cu.cuStreamWaitEvent(d->compute, d->post[slot], 0));
    dpar__mutex_lock(&d->ring_mu);
    d->ring_head++;
    dpar__mutex_unlock(&d->ring_mu);
    return e;
}

static dpar_status dpar__cu_collective(void *state, dpar__coll *c) {
    dpar__cu_state *st = (dpar__cu_state *)state;
    int me = c->devices[c->rank];
    dpar_status e = dpar__cu_bind(st, me);
    if (e) return e;
    if (c->n > DPAR__CU_MAXV && st->virt)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "cuda: a group of %d virtual devices exceeds %d", c->n,
                         DPAR__CU_MAXV);
    /* a 1-member group is a copy on the compute stream: no NCCL communicator, so no
       communication stream, events or polled waits for a 1-GPU job */
    if (c->n == 1) return dpar__cu_coll_local(st, me, c);
    if (st->virt) return dpar__cu_coll_virtual(st, c);
    /* NCCL calls do not synchronize the host threads; the core's barrier
       after every backend collective keeps a fast member from posting its
       next call while a slow one still checks this call's records. */
    return dpar__cu_coll_nccl(st, c);
}

static const dpar__backend_iface *dpar__cuda_iface(void) {
    static const dpar__backend_iface iface = { "cuda",
                                               DPAR_BACKEND_CUDA,
                                               false, /* attn_kv_computes_d: the KV kernel reads pass 1's D */
                                               false, /* bias_add_relu: not written for the CUDA kernel */
                                               false, /* bias_grad_relu: as bias_add_relu */
                                               false, /* matmul_bias: as bias_add_relu */
                                               false, /* sgd_pairs: as bias_add_relu */
                                               dpar__cu_init,
                                               dpar__cu_shutdown,
                                               dpar__cu_device_info,
                                               dpar__cu_thread_init,
                                               dpar__cu_alloc,
                                               dpar__cu_free,
                                               dpar__cu_write,
                                               dpar__cu_read,
                                               dpar__cu_sync,
                                               dpar__cu_host_ptr,
                                               NULL, /* host_acquire */
                                               NULL, /* host_release */
                                               dpar__cu_op,
                                               dpar__cu_collective,
                                               dpar__cu_cross_id_size,
                                               dpar__cu_cross_id,
                                               dpar__cu_device_status,
                                               dpar__cu_visible_devices,
                                               dpar__cu_physical_device,
                                               dpar__cu_health,
                                               dpar__cu_prog_begin,
                                               dpar__cu_prog_end,
                                               dpar__cu_prog_submit,
                                               dpar__cu_prog_free,
                                               NULL, /* prog_submit_pre: staged feeds copied op by op */
                                               NULL, /* refill: a write waits for mem's work alone */
                                               NULL /* host_waits */,
                                               NULL /* op_fits: every op fits */ };
    return &iface;
}

#endif /* DPAR_CUDA_BACKEND_INCLUDED */
