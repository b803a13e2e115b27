/* dpar.h — JAX-style multi-device training for plain C, in one header.

   Device mesh with named axes, pmap / shard_map dispatch (one function run per
   device, concurrently), collectives over axis names (psum, pmean, pmax, pmin,
   all_gather, psum_scatter, ppermute, all_to_all, pbroadcast), the ops a
   small network needs, and an SGD optimizer — behind a backend vtable.

   USAGE
   -----
   In exactly one C or C++ file:

       #define DPAR_IMPLEMENTATION
       #include "dpar.h"

   Everywhere else just #include "dpar.h". Link with -lpthread -lm (Linux,
   macOS; Windows needs no library beyond the C runtime: see >>platform).
   The training helpers (data-parallel gradient buckets, ZeRO-1, checkpoints)
   are in util/dpar_train.h, on this header's public API: include it where
   they are used, and also in the file above to compile them.
   build/dpar_single.h (`make amalgamate`) is this header with backends/ and
   util/ inlined: one file to drop in.
   Optional backends are compiled into the implementation file:

       #define DPAR_VULKAN            // Vulkan backend, see backends/dpar_vulkan.h
       #define DPAR_CUDA              // CUDA backend,   see backends/dpar_cuda.h
       #define DPAR_MPI               // processes (mpicc), see backends/dpar_mpi.h
       #define DPAR_IMPLEMENTATION
       #include "dpar.h"

   Overrides (define before the implementation):
       DPAR_STATIC            make every API function static
       DPAR_ASSERT(c)         internal invariant checks (default assert.h)
       DPAR_MALLOC(sz) / DPAR_FREE(p) / DPAR_REALLOC(p, sz)   allocator (every host allocation)
       DPAR_ALIGNED_MALLOC(sz, align) / DPAR_ALIGNED_FREE(p)  aligned allocator (CPU-backend
                              device buffers, matmul packing; align: a power of two, 64).
                              Default: through DPAR_MALLOC / DPAR_FREE, so one hook sees all
       DPAR_LOG(msg)          log sink for warnings (default: stderr, only if DPAR_VERBOSE=1)
       DPAR_USE_CBLAS         CPU matrix products through cblas_sgemm

   A FIRST PROGRAM   (tests/test_first_programs.sh builds it as C99 and C++20 and runs it)
   ---------------
   BEGIN FIRST PROGRAM
       #define DPAR_IMPLEMENTATION   // in exactly one .c file
       #include "dpar.h"
       #include <stdio.h>

       // Runs once per device on its row of x [4, 3]: y = 2 x.
       static dpar_status twice(dpar_ctx *ctx, void *user) {
           (void)user;
           dpar_buffer *x = dpar_ctx_arg(ctx, 0), *y = dpar_ctx_arg(ctx, 1);
           dpar_status s = dpar_copy(y, x);
           return s ? s : dpar_scale(y, 2.0f);
       }

       int main(void) {
           float x[4][3] = { {0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11} }, y[4][3];
           dpar_runtime *rt = NULL;  dpar_mesh *mesh = NULL;
           dpar_runtime_desc rd = { .num_devices = 4 };
           dpar_mesh_desc md = { .ndim = 1, .shape = {4}, .axis_names = {"data"} };
           dpar_pmap_desc pd = { .axis = "data", .fn = twice,   // row d to device d, stacked back
               .inputs = { { .data = x, .dtype = DPAR_F32, .ndim = 2, .shape = {4, 3} } },
               .outputs = { { .data = y, .dtype = DPAR_F32, .ndim = 1, .shape = {3} } } };
           dpar_status s = dpar_runtime_create(&rd, &rt);
           if (!s) s = dpar_mesh_create(rt, &md, &mesh);
           if (!s) s = dpar_pmap(mesh, &pd);
           if (s) fprintf(stderr, "%s\n", dpar_last_error());
           else printf("y[3] = %g %g %g\n", (double)y[3][0], (double)y[3][1], (double)y[3][2]);
           dpar_runtime_destroy(rt);
           return s != DPAR_OK;
       }
   END FIRST PROGRAM
   In C the descs can be compound literals passed in place,
   dpar_runtime_create(&(dpar_runtime_desc){ .num_devices = 4 }, &rt); the
   named descs above are also valid C++20 (C++17: value-initialize, then
   assign; see examples/cpp_example.cpp).

   Inside a pmap/shard_map function every device sees its own shard
   (dpar_ctx_arg), its position (dpar_ctx_axis_index), and calls ops and
   collectives, which block until every member of the group has arrived.

   EXECUTION MODEL
   ---------------
   One persistent host worker thread per device. pmap/shard_map hand the
   function to every worker and return when all are done (a runtime of one
   local device in one process, CPU or Vulkan, runs it on the calling thread
   instead, bit for bit the same: no hand-off; DPAR_CALLER_THREAD=0 keeps the
   worker); the first error
   wins and every other worker is told to stop (a worker waiting in a
   collective returns DPAR_ERR_ABORTED). A collective over axis "a" groups the
   devices that share every other mesh coordinate; over "a,b" it groups over
   both, its members ranked row-major over the axes as written (JAX's order
   for an axis tuple). Reductions add in rank order, so every member gets
   bitwise the same result, run after run. (Across MPI processes the order is hierarchical:
   each process adds its own members in mesh order, then MPI combines the
   processes' partial results; on CUDA, NCCL across processes orders it as
   NCCL does; see "Multi-process" in the README.)

   THREADS AND LIFETIMES
   ---------------------
   Host calls (create, destroy, pmap/shard_map, dpar_array_put/get, graph
   runs, helper setup) may come from any thread; a runtime runs one dispatch
   at a time (a second one waits). Inside fn, on a device's worker thread (or
   the calling thread, see EXECUTION MODEL):
   ops, buffer I/O and dpar_buffer_destroy on that device's buffers,
   collectives, dpar_ctx_* and the helpers' per-step calls, with the ctx fn was
   given. Refused with DPAR_ERR_STATE instead of racing:
     - a dpar_ctx used after its fn returned, or on another thread;
     - an op, dpar_buffer_read/write/map or dpar_buffer_destroy on another
       device's buffer from a worker; the same from a non-worker thread while
       a dispatch runs on the buffer's runtime;
     - dpar_array_put/get/put_rows while a dispatch runs on the array's
       runtime (inside fn, or from another thread); a dispatch started while
       they run waits for them;
     - any destroy while a call on the same runtime runs on another thread (a
       dispatch, a graph run, a host transfer), and every destroy but
       dpar_buffer_destroy inside fn;
     - a stale handle: a runtime, mesh, array, buffer, graph, dpar_dp or
       dpar_zero1 already destroyed, or freed with its parent, given to a
       destroy, a create on it, a dispatch, an array transfer, a graph call or
       a helper call.
   Destroying a parent frees its children, in any order: dpar_mesh_destroy its
   helpers (dpar_dp, dpar_zero1, anything dpar_handle_attach tied to it),
   graphs and arrays; dpar_runtime_destroy its meshes (with theirs) and
   buffers. Their handles are stale afterwards: destroying one again returns
   DPAR_ERR_STATE and frees nothing. Handles are plain pointers looked up in a
   process-wide hash set of live objects by every call that takes one: ops,
   collectives, buffer I/O and getters too ("dpar_copy: the source is a stale
   buffer ..."; a getter returns its NULL answer, -1 or 0, and sets the last
   error). Inside fn a worker looks each handle up once per dispatch, then
   compares. A getter racing a destroy of the same object on another thread
   is the caller's race (the destroy may free it between the lookup and the
   read); every other call is counted in flight and refuses or waits as
   above. A new object never takes the address of one of the last 256
   destroyed, so a stale handle is refused even after new objects were made;
   the one case not detected (the API has no room for a generation in a
   plain pointer): a handle used after more than 256 later destroys may name
   a newer object of the same kind at its address. A dispatch where fn called dpar_dp_begin without dpar_dp_finish
   fails with DPAR_ERR_STATE (util/dpar_train.h).

   ENVIRONMENT
   -----------
       DPAR_BACKEND=cpu|vulkan|cuda   backend when the desc leaves it default
       DPAR_DEVICES=N                 number of (emulated) devices, 1..DPAR_MAX_DEVICES
       DPAR_TIMEOUT_MS=ms             collective timeout (default 60000), 1..10^9
       DPAR_TRACE=file.json           write a Chrome/Perfetto trace (see dpar_trace_begin)
       DPAR_SPIN_US=us                spin before sleeping in a rendezvous (default
                                      2 us, then yields; 0: sleep at once), 0..10^6
       DPAR_CPU_THREADS=N             CPU backend: threads per device for large
                                      matrix products and element, row and image
                                      ops (default CPUs / devices; 1: none; the
                                      same bits for any N), 1..64
       DPAR_ALLOW_SHARED_DEVICE=1     MPI: let two ranks on a node open one device (.mpi.allow_shared_device);
                                      0..1 (checked in every build)
       DPAR_MPI_BACKEND_COLLECTIVES=0 MPI + CUDA (.mpi.host_collectives): groups across processes on the
                                      host-staged MPI path instead of NCCL; 0..1 (1: the default)
       DPAR_GRAPH_ASYNC_BYTES=n       graphs: gradients of >= n bytes are reduced asynchronously, overlapping
                                      the rest of the backward pass; smaller ones (and the loss's pmean) share
                                      buckets of up to 1 MiB, one collective each (default 262144;
                                      0..2000000000; read at value_and_grad)
       DPAR_GRAPH_ALIAS=0             graphs: plan every node's output apart from its inputs (default 1: an
                                      elementwise node's output takes the buffer of an input it reads last,
                                      computed in place, and a kept psum/pmean over one device (a 1-device
                                      mesh's gradients) is run by its input writing the kept buffer; bit for
                                      bit the same); 0..1, read at compile
       DPAR_CALLER_THREAD=0           a runtime of one device (one process, a backend without per-thread
                                      setup: CPU, Vulkan) runs each dispatch's fn on the calling thread, not
                                      on the device's worker (default 1: no hand-off and no wait between two
                                      threads; bit for bit the same); 0: on the worker; 0..1, read at create
   dpar_runtime_create refuses a value that is not an integer in its range, or
   a DPAR_TRACE path it cannot write, with an error naming the variable.

   ERRORS
   ------
   Every fallible call returns dpar_status; dpar_last_error() (thread local)
   says what went wrong, where, and how to fix it. The library never calls
   exit() or abort() on user error.
   A destroy or release that succeeds (dpar_*_destroy, dpar_vulkan_buffer_
   release) leaves the last error as it was: clean up, then print it.

   License: MIT, at the end of this file.
*/
#if defined(DPAR_IMPLEMENTATION) && !defined(_GNU_SOURCE) && !defined(__cplusplus) && \
    !defined(DPAR_PLATFORM_FORCE_MACOS)
#define _GNU_SOURCE /* clock_gettime, fileno in the implementation */
#endif
#if (defined(DPAR_IMPLEMENTATION) || defined(DPAR_TRAIN_IMPLEMENTATION)) && defined(__MINGW32__) && \
    !defined(__USE_MINGW_ANSI_STDIO)
#define __USE_MINGW_ANSI_STDIO 1 /* MinGW-w64's C99 printf: %zu, %lld as everywhere else */
#endif
#ifndef DPAR_H_INCLUDED
#define DPAR_H_INCLUDED

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
/* the printf archetype of format checks: dpar formats with MinGW-w64's C99 printf there */
#if defined(__MINGW32__)
#define DPAR__PRINTF_FMT gnu_printf
#else
#define DPAR__PRINTF_FMT printf
#endif

#ifndef DPAR_API
#ifdef DPAR_STATIC
#define DPAR_API static
#else
#define DPAR_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DPAR_VERSION_MAJOR 0
#define DPAR_VERSION_MINOR 1

enum {
    DPAR_MAX_DIMS = 8,      /* array / buffer rank */
    DPAR_MAX_AXES = 4,      /* mesh rank */
    DPAR_MAX_DEVICES = 256, /* devices per runtime */
    DPAR_MAX_ARGS = 32,     /* arrays per pmap / shard_map call */
    DPAR_NAME_LEN = 32      /* axis name length, including the terminator */
};

/* ---------------------------------------------------------------------------
   Status and errors
   ------------------------------------------------------------------------ */
typedef enum dpar_status {
    DPAR_OK = 0,
    DPAR_ERR_INVALID_ARGUMENT,    /* a NULL, out-of-range or malformed argument */
    DPAR_ERR_SHAPE,               /* shapes do not match / do not divide */
    DPAR_ERR_DTYPE,               /* dtype not supported by the op or mismatched */
    DPAR_ERR_UNKNOWN_AXIS,        /* axis name not in the mesh */
    DPAR_ERR_DEVICE_COUNT,        /* more devices asked than the backend has */
    DPAR_ERR_OUT_OF_MEMORY,       /* host or device allocation failed */
    DPAR_ERR_BACKEND_UNAVAILABLE, /* backend not compiled in, no driver or no device */
    DPAR_ERR_BACKEND,             /* the backend's driver/library reported an error */
    DPAR_ERR_COLLECTIVE_MISMATCH, /* members of a group called different collectives */
    DPAR_ERR_TIMEOUT,             /* a member never arrived within DPAR_TIMEOUT_MS */
    DPAR_ERR_ABORTED,             /* another device failed first; this one stopped */
    DPAR_ERR_IO,                  /* file read/write failed */
    DPAR_ERR_STATE                /* call not allowed in this state (e.g. outside pmap) */
} dpar_status;

/* Short name of a status ("DPAR_ERR_SHAPE"), never NULL. */
DPAR_API const char *dpar_status_string(dpar_status s);
/* Text of the last error on the calling thread: what, where, how to fix.
   Empty string ("") when the last call succeeded or nothing failed yet.
   Valid until the next dpar call on this thread. */
DPAR_API const char *dpar_last_error(void);
/* Sets the calling thread's last error to the printf-style text and returns
   `code`, for helpers built on the API (util/dpar_train.h):
       return dpar_set_last_error(DPAR_ERR_SHAPE, "fn: x has %d rows; ...", n);
   Text beyond 1023 bytes is cut. dpar_set_last_error(DPAR_OK, "%s", "")
   clears it. Never fails. */
DPAR_API dpar_status dpar_set_last_error(dpar_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(DPAR__PRINTF_FMT, 2, 3)))
#endif
    ;

/* ---------------------------------------------------------------------------
   Dtypes
   ------------------------------------------------------------------------ */
typedef enum dpar_dtype {
    DPAR_F32 = 0, /* IEEE 754 binary32 */
    DPAR_F16,     /* IEEE 754 binary16 */
    DPAR_BF16,    /* bfloat16: the upper 16 bits of a binary32 */
    DPAR_I32,     /* two's complement int32 */
    DPAR_F64,     /* IEEE 754 binary64: the cpu backend only (see >>f64 api) */
    DPAR_DTYPE_COUNT
} dpar_dtype;

/* Bytes per element (4, 2, 2, 4, 8); 0 for an invalid dtype. */
DPAR_API size_t dpar_dtype_size(dpar_dtype t);
/* "f32", "f16", "bf16", "i32", "f64"; "invalid" otherwise. */
DPAR_API const char *dpar_dtype_name(dpar_dtype t);
/* Scalar conversions with round-to-nearest-even (IEEE 754-2008 sec. 4.3.1);
   NaN stays NaN, overflow gives +-Inf. */
DPAR_API uint16_t dpar_f32_to_f16(float f);
DPAR_API float dpar_f16_to_f32(uint16_t h);
DPAR_API uint16_t dpar_f32_to_bf16(float f);
DPAR_API float dpar_bf16_to_f32(uint16_t h);
/* The f16 conversions over n elements (F16C where the CPU has it), bit for
   bit the scalar ones except signalling NaNs, which F16C returns quieted
   (f16 0x7c01 -> f32 0x7fc02000, the scalar form gives 0x7f802000);
   n <= 0 does nothing. */
DPAR_API void dpar_f32_to_f16_n(uint16_t *dst, const float *src, int64_t n);
DPAR_API void dpar_f16_to_f32_n(float *dst, const uint16_t *src, int64_t n);
/* >>f64 api ==================================================================
   f64 (IEEE binary64) buffers and arrays exist on the cpu backend only: on
   Vulkan and CUDA, dpar_buffer_create / dpar_array_create (so dpar_ctx_buffer
   and graph feeds too) answer DPAR_ERR_DTYPE naming the backend. On the cpu
   backend these ops take f64, with every float operand f64 (a mixed op is
   DPAR_ERR_DTYPE naming both operands; convert with dpar_cast) and all math
   in double, so results are within a few ulp of a double reference (one
   rounding each for fill, copy, axpy, scale, casts and binary):
     | op                                            | f64 operands (the rest as the f32 op)      |
     |-----------------------------------------------|--------------------------------------------|
     | dpar_fill, dpar_copy                          | x / dst, src                               |
     | dpar_cast                                     | either side (f64 -> f16/bf16 via f32)      |
     | dpar_axpy, dpar_scale                         | y, x                                       |
     | dpar_unary, dpar_unary_backward               | all                                        |
     | dpar_binary, dpar_binary_backward (broadcast) | all                                        |
     | dpar_reduce (sum, mean, max, argmax)          | x, y (argmax: y i32)                       |
     | dpar_reduce_backward                          | all                                        |
     | dpar_sum, dpar_sum_squares                    | x and the 1-element result                 |
     | dpar_matmul                                   | A, B and C (blocked f64 GEMM)              |
     | dpar_relu, dpar_relu_backward                 | all                                        |
     | dpar_bias_add, dpar_bias_grad                 | all                                        |
     | dpar_softmax, dpar_softmax_backward (log too) | all                                        |
     | dpar_mse                                      | pred, target, dpred, loss                  |
     | dpar_softmax_xent, dpar_cross_entropy         | logits, dlogits, loss (labels i32)         |
     | dpar_layer_norm, dpar_rms_norm (+ backward)   | all, stats too                             |
     | dpar_matmul_batched                           | A, B and C (the f64 GEMM per batch)        |
     | dpar_attention (+ backward)                   | all, stats too (exp and GEMMs in double)   |
     | dpar_conv2d (+ backward_input, _kernel)       | all (im2col + the f64 GEMM)                |
     | dpar_avg_pool2d, dpar_max_pool2d (+ backward) | all (max: exact)                           |
     | dpar_embedding (+ backward)                   | table, out, dout, dtable (idx i32; exact)  |
     | dpar_where                                    | y, a, b (cond f64 or i32)                  |
     | dpar_dropout                                  | x, y (the f32 op's mask; scale in double)  |
     | dpar_sgd_update/_step, dpar_adamw_update/_step| param, grad, momentum / m, v (clip by      |
     |   (clip by global norm too)                   |   global norm sums f64 grads in double)    |
     | shape ops (transpose, slice, concat, pad, ...)| x and y                                    |
     | collectives (psum, pmean, pmax, pmin,         | in and out; the reducing ones fold in      |
     |   psum_scatter, all_gather, ppermute, ...)    |   double, and refuse f64 across processes  |
     | graphs: dpar_g_matmul, _bias_add, _relu,      | feeds, params and consts f64: every node   |
     |   _add, _scale, _mul_scalar, _sum, _dot,      |   on them is f64, gradients too, so        |
     |   _sum_squares, _unary, _binary, _where,      |   dpar_graph_value_and_grad runs in double |
     |   _reduce, _softmax, _mse, _softmax_xent,     |   (dpar_graph_run rounds the loss to       |
     |   _cross_entropy, _layer_norm, _rms_norm,     |   float; in double: see dpar_graph_run);   |
     |   _matmul_batched, _attention, _conv2d,       |   each node runs the eager f64 kernel of   |
     |   _avg_pool2d, _max_pool2d, _embedding,       |   the op above (where: cond f64 or i32;    |
     |   _dropout, shape nodes                       |   embedding: idx i32)                      |
     | graphs: dpar_graph_sgd, _adamw, _adamw_masked | f64 params with f64 gradients (state f64); |
     |   (clip by global norm too)                   |   not with dpar_graph_zero1 (f32 blocks)   |
   The float scalars of these ops (alpha, beta, the unary scalar, eps, label
   smoothing) are widened exactly from float, so pass values a float holds
   (0.5, not 0.1) where the last digits matter; so are the optimizers'
   hyper-parameters and clip factor (AdamW's bias corrections and dropout's
   scale are computed in double). Every other op (the loss scaler among
   them) answers DPAR_ERR_DTYPE for f64; dpar_cast to f32 first. */

/* ---------------------------------------------------------------------------
   Runtime and devices
   ------------------------------------------------------------------------ */
typedef enum dpar_backend_kind {
    DPAR_BACKEND_DEFAULT = 0, /* DPAR_BACKEND env, else the best compiled-in available */
    DPAR_BACKEND_CPU,
    DPAR_BACKEND_VULKAN,
    DPAR_BACKEND_CUDA
} dpar_backend_kind;

DPAR_API const char *dpar_backend_name(dpar_backend_kind k); /* "cpu", "vulkan", "cuda" */
/* The backend named "cpu", "vulkan" or "cuda" (as dpar_backend_name gives them;
   "default" or "" gives DPAR_BACKEND_DEFAULT), into *out. Case-sensitive.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, or not a backend name; *out is
   left unchanged and the text lists the names). */
DPAR_API dpar_status dpar_backend_from_name(const char *name, dpar_backend_kind *out);

typedef struct dpar_runtime dpar_runtime;

/* An engine's own Vulkan objects for dpar to run on instead of creating its own (adoption). Handles are
   given as void * (dpar.h does not include vulkan.h): VkInstance, VkPhysicalDevice, VkDevice and VkQueue
   are pointers. dpar never destroys them; it destroys only what it created on `device` (with `allocator`).
   Requirements, checked by dpar_runtime_create (DPAR_ERR_INVALID_ARGUMENT naming the field otherwise):
   every handle non-NULL, physical_device of Vulkan >= 1.1 with >= 8 storage buffers per shader stage,
   queue_family among its families and with VK_QUEUE_COMPUTE_BIT, lock_queue / unlock_queue both or neither,
   timeline_semaphore only where the physical device has timelineSemaphore. dpar needs no optional device
   feature or extension to compute (enable VK_KHR_portability_subset where the device lists it, as Vulkan
   requires); dpar_vulkan_buffer_export needs timelineSemaphore (Vulkan 1.2, enabled by the engine).
   All num_devices logical devices share `queue`. dpar submits to it from its worker threads (with one
   device, from the thread that dispatches: see EXECUTION MODEL): when the
   engine also submits to it, give lock_queue / unlock_queue (dpar calls them around each vkQueueSubmit)
   or the engine must not touch the queue while a dpar call runs. dpar waits on its own fences only (never
   vkDeviceWaitIdle), so the engine's work is not waited for, with one exception: dpar_runtime_destroy of a
   runtime that lent a buffer (dpar_vulkan_buffer_export) calls vkQueueWaitIdle on `queue` once, under
   lock_queue, before it destroys its timeline semaphore (drivers with emulated timelines, such as Mesa's
   lavapipe, still touch the semaphore after signalling the fence of its last batch). */
typedef struct dpar_vulkan_external {
    void *instance;                       /* VkInstance the device was created from */
    void *physical_device;                /* VkPhysicalDevice of `device` */
    void *device;                         /* VkDevice; non-NULL turns adoption on */
    void *queue;                          /* VkQueue of `device` from queue_family, index any */
    uint32_t queue_family;                /* its family index; must support compute */
    const void *allocator;                /* const VkAllocationCallbacks * for every object dpar creates; NULL: none */
    void (*get_instance_proc_addr)(void); /* the engine's vkGetInstanceProcAddr, cast to void (*)(void) (from
                                             volk, a static loader); NULL: dpar dlopens libvulkan.so.1 */
    bool timeline_semaphore;              /* the engine enabled timelineSemaphore (dpar_vulkan_buffer_export) */
    void (*lock_queue)(void *user);       /* around dpar's vkQueueSubmit / vkQueueWaitIdle on `queue`; NULL: none */
    void (*unlock_queue)(void *user);
    void *queue_user; /* passed to lock_queue / unlock_queue */
} dpar_vulkan_external;

/* Vulkan backend settings (read only by backends/dpar_vulkan.h); zero means default. */
typedef struct dpar_vulkan_desc {
    int physical_device;           /* 1-based index of the one physical device to use, counting the usable
                                      devices GPUs first (discrete, integrated, virtual, other, then CPU
                                      implementations such as llvmpipe): 1 is the first. 0: env DPAR_VK_DEVICE
                                      (0-based) if set, else every device of the best kind (with MPI: this
                                      process's node-local share). Errors: DPAR_ERR_DEVICE_COUNT when there
                                      are fewer usable devices, DPAR_ERR_INVALID_ARGUMENT when negative. */
    bool force_noncoherent;        /* treat host-visible memory as non-coherent (flush/invalidate on every
                                      host access); false: env DPAR_VK_NONCOHERENT */
    dpar_vulkan_external external; /* an engine's own device (.external.device non-NULL); physical_device
                                      must then be 0 */
} dpar_vulkan_desc;

/* CUDA backend settings (read only by backends/dpar_cuda.h); zero means default. */
typedef struct dpar_cuda_desc {
    int physical_device; /* 1-based CUDA ordinal of the one GPU to use (as numbered after
                            CUDA_VISIBLE_DEVICES): 1 is GPU 0; num_devices > 1 then gives virtual
                            devices on it. 0: every GPU (with MPI: this process's node-local share).
                            Errors: DPAR_ERR_DEVICE_COUNT when there are fewer GPUs,
                            DPAR_ERR_INVALID_ARGUMENT when negative. */
} dpar_cuda_desc;

/* Multi-process settings (DPAR_MPI builds; read only by backends/dpar_mpi.h); zero means default. */
typedef struct dpar_mpi_desc {
    const void *comm;         /* address of the MPI_Comm whose processes share the runtime; NULL:
                                 MPI_COMM_WORLD when MPI is initialized, else one process */
    bool allow_shared_device; /* let two ranks of a node open one physical device (their groups
                                 then take the host-staged path); false: env DPAR_ALLOW_SHARED_DEVICE=1 */
    bool host_collectives;    /* groups across processes on the host-staged MPI path even where the
                                 backend could run them (CUDA: NCCL); false: env
                                 DPAR_MPI_BACKEND_COLLECTIVES=0 */
} dpar_mpi_desc;

typedef struct dpar_runtime_desc {
    dpar_backend_kind backend; /* 0: DPAR_BACKEND env, else best available */
    int num_devices;           /* 0: DPAR_DEVICES env, else all the backend has
                                  (CPU: 1 device per core, at most 8) */
    int timeout_ms;            /* collective timeout; 0: DPAR_TIMEOUT_MS env, else 60000 */
#ifndef DPAR_NO_DEPRECATED
    int vulkan_force_noncoherent; /* deprecated: use .vulkan.force_noncoherent (nonzero: the same) */
    int vulkan_physical_device;   /* deprecated: use .vulkan.physical_device, which is 1-based. Here
                                     k > 0 picks usable device k; -1 or 0: the default */
#else
    int dpar__reserved_vk[2];       /* keeps the layout of builds that have the deprecated names */
#endif
#ifndef DPAR_NO_DEPRECATED
    const void *mpi_comm; /* deprecated: use .mpi.comm (used when .mpi.comm is NULL) */
#else
    const void *dpar__reserved_mpi; /* keeps the layout of builds that have the deprecated name */
#endif
    dpar_vulkan_desc vulkan; /* Vulkan settings, e.g. .vulkan = { .physical_device = 1 } */
    dpar_cuda_desc cuda;     /* CUDA settings, e.g. .cuda = { .physical_device = 2 } */
    dpar_mpi_desc mpi;       /* multi-process settings, e.g. .mpi = { .comm = &world }; ignored without DPAR_MPI */
} dpar_runtime_desc;

/* Creates a runtime: picks the backend, opens `num_devices` devices and
   starts one worker thread per device.
   Errors: DPAR_ERR_BACKEND_UNAVAILABLE (backend not compiled in / no driver),
   DPAR_ERR_DEVICE_COUNT (asked for more devices than the backend has; the
   text names both numbers), DPAR_ERR_INVALID_ARGUMENT (also for a DPAR_*
   variable out of its range, see ENVIRONMENT: the text names it, its value
   and the range), DPAR_ERR_IO (DPAR_TRACE names a path that cannot be
   written), DPAR_ERR_OUT_OF_MEMORY.
   With MPI every process returns an error if any fails (that process's
   status, naming it); processes with different local device counts give
   DPAR_ERR_DEVICE_COUNT, different backends or two ranks on one physical
   device DPAR_ERR_INVALID_ARGUMENT (naming both ranks).
   On error *out is NULL and nothing is leaked. */
DPAR_API dpar_status dpar_runtime_create(const dpar_runtime_desc *desc, dpar_runtime **out);
/* Stops the workers and frees the runtime with everything still on it: its
   meshes (with their helpers, graphs and arrays) and buffers, whose handles
   are stale afterwards (see THREADS AND LIFETIMES). NULL is a no-op (DPAR_OK).
   Errors (nothing is freed): DPAR_ERR_STATE when called from inside a
   pmap/shard_map function, while a call on the runtime runs on another thread
   (a dispatch, a graph run, a host transfer), or for a runtime already
   destroyed. */
DPAR_API dpar_status dpar_runtime_destroy(dpar_runtime *rt);
/* Global device count: processes x local devices (the same on every process). */
DPAR_API int dpar_runtime_device_count(const dpar_runtime *rt);
/* Multi-process (DPAR_MPI): this process's index and the process count
   (0 and 1 without MPI). Global device d lives on process d / local count. */
DPAR_API int dpar_runtime_process_index(const dpar_runtime *rt);
DPAR_API int dpar_runtime_process_count(const dpar_runtime *rt);
/* This process's devices are first .. first+count-1 (global ids). */
DPAR_API void dpar_runtime_local_devices(const dpar_runtime *rt, int *first, int *count);
DPAR_API dpar_backend_kind dpar_runtime_backend(const dpar_runtime *rt);

typedef struct dpar_device_info {
    char name[128];  /* e.g. "cpu:2", "llvmpipe (LLVM 15.0.6, 256 bits) [logical 1/4]" */
    char vendor[64]; /* e.g. "host", "NVIDIA", "Mesa" */
    char driver[64]; /* driver name and version where known */
    dpar_backend_kind backend;
    int index;              /* device index in this runtime, 0..count-1 */
    int physical_index;     /* index of the physical device it runs on */
    uint64_t memory_bytes;  /* device memory (CPU: physical RAM) in bytes */
    bool runs_on_cpu;       /* true: the work runs on host CPU cores (the CPU backend's
                               emulated devices, or a software GPU such as llvmpipe) */
    unsigned char uuid[16]; /* the physical device's UUID (CUDA: cuDeviceGetUuid, Vulkan:
                               VkPhysicalDeviceIDProperties::deviceUUID); all zero when
                               unknown (CPU). Equal UUIDs are the same physical device,
                               whatever CUDA_VISIBLE_DEVICES numbered it. */
} dpar_device_info;

/* Describes `device` (a global device index of the runtime) into *out.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, device out of range). */
DPAR_API dpar_status dpar_runtime_device_info(const dpar_runtime *rt, int device, dpar_device_info *out);

/* ---------------------------------------------------------------------------
   Device buffers: a typed, shaped, contiguous row-major array on one device
   ------------------------------------------------------------------------ */
typedef struct dpar_buffer dpar_buffer;

/* Allocates a buffer of `dtype` with `ndim` dims (0..DPAR_MAX_DIMS; ndim 0 is
   a scalar) on `device`. Contents are zero. Zero-size dims are allowed.
   Errors: DPAR_ERR_INVALID_ARGUMENT (device or ndim out of range, negative
   dim), DPAR_ERR_DTYPE (dtype not a dpar_dtype), DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_buffer_create(dpar_runtime *rt, int device, dpar_dtype dtype, int ndim, const int64_t *shape,
                                        dpar_buffer **out);
/* Frees the buffer (waits for pending work on it). NULL is a no-op (DPAR_OK).
   Errors (nothing is freed): DPAR_ERR_STATE for a shard of a dpar_array
   (destroy the array), a stale buffer (destroyed, or freed with its runtime),
   another device's buffer from a worker, or from a non-worker thread while a
   dispatch runs on its runtime. */
DPAR_API dpar_status dpar_buffer_destroy(dpar_buffer *b);
DPAR_API dpar_dtype dpar_buffer_dtype(const dpar_buffer *b);
DPAR_API int dpar_buffer_ndim(const dpar_buffer *b);
/* Dimension i (0 <= i < ndim); -1 when i is out of range. */
DPAR_API int64_t dpar_buffer_dim(const dpar_buffer *b, int i);
DPAR_API int64_t dpar_buffer_count(const dpar_buffer *b); /* elements */
DPAR_API size_t dpar_buffer_nbytes(const dpar_buffer *b);
DPAR_API int dpar_buffer_device(const dpar_buffer *b);
/* Gives the buffer a new shape with the same element count (a view change,
   no data moves). Errors: DPAR_ERR_SHAPE naming both counts. */
DPAR_API dpar_status dpar_buffer_reshape(dpar_buffer *b, int ndim, const int64_t *shape);
/* Copies `nbytes` bytes host -> device at byte offset `offset`.
   Errors: DPAR_ERR_INVALID_ARGUMENT when offset+nbytes exceeds the buffer. */
DPAR_API dpar_status dpar_buffer_write(dpar_buffer *b, size_t offset, const void *src, size_t nbytes);
/* Copies device -> host; waits for pending work on the device first. */
DPAR_API dpar_status dpar_buffer_read(const dpar_buffer *b, size_t offset, void *dst, size_t nbytes);
/* Host access without a copy where the backend keeps the memory host-visible
   (the CPU backend; not CUDA). *ptr gets the address of byte `offset` of b,
   valid for `nbytes` bytes until dpar_buffer_unmap, or NULL (and DPAR_OK)
   when the memory is not host-visible: use dpar_buffer_read / _write then.
   read = true: the host will read the range (waits for pending device work
   and makes the device's writes visible). Outside or inside fn, on the
   buffer's own device only from its worker. Errors: DPAR_ERR_INVALID_ARGUMENT
   (NULL, bytes outside the buffer), the backend's errors. */
DPAR_API dpar_status dpar_buffer_map(dpar_buffer *b, size_t offset, size_t nbytes, bool read, void **ptr);
/* Ends dpar_buffer_map of the same range; written = true makes the host's
   writes visible to the device. No-op for memory that is not host-visible.
   Errors: as dpar_buffer_map. */
DPAR_API dpar_status dpar_buffer_unmap(dpar_buffer *b, size_t offset, size_t nbytes, bool written);
/* Waits until all work queued on `device` has finished (no-op on CPU). */
DPAR_API dpar_status dpar_runtime_device_sync(dpar_runtime *rt, int device);

/* ---------------------------------------------------------------------------
   Mesh
   ------------------------------------------------------------------------ */
typedef struct dpar_mesh dpar_mesh;

typedef struct dpar_mesh_desc {
    int ndim;                              /* 1..DPAR_MAX_AXES; 0: inferred, the number of
                                              leading axes with a nonzero shape or a name */
    int shape[DPAR_MAX_AXES];              /* devices along each axis */
    const char *axis_names[DPAR_MAX_AXES]; /* unique, non-empty, < DPAR_NAME_LEN chars,
                                              no ',' or spaces */
    const int *devices;                    /* optional explicit order: devices[i] is the device at
                                              row-major position i; NULL: device i at position i */
} dpar_mesh_desc;

/* Creates a mesh over prod(shape) devices of the runtime: all of them or a
   subset (devices 0..prod-1 unless `devices` says which).
   Errors: DPAR_ERR_DEVICE_COUNT (the product exceeds the runtime's devices;
   the text names both), DPAR_ERR_INVALID_ARGUMENT (duplicate, empty or
   malformed axis names, repeated device in `devices`). */
DPAR_API dpar_status dpar_mesh_create(dpar_runtime *rt, const dpar_mesh_desc *desc, dpar_mesh **out);
/* Frees the mesh with what was made on it: attached helpers (dpar_dp,
   dpar_zero1), graphs and arrays, whose handles are stale afterwards (see
   THREADS AND LIFETIMES). NULL is a no-op (DPAR_OK). Errors (nothing is
   freed): DPAR_ERR_STATE inside a pmap/shard_map function, while a call on
   its runtime runs on another thread, or for a mesh already destroyed. */
DPAR_API dpar_status dpar_mesh_destroy(dpar_mesh *m);
DPAR_API int dpar_mesh_ndim(const dpar_mesh *m);
DPAR_API int dpar_mesh_size(const dpar_mesh *m);                     /* devices in the mesh */
DPAR_API const char *dpar_mesh_axis_name(const dpar_mesh *m, int i); /* NULL if out of range */
/* Size of an axis set: "data" or "data,model" (product of sizes).
   Errors: DPAR_ERR_UNKNOWN_AXIS naming the axis and listing the mesh axes. */
DPAR_API dpar_status dpar_mesh_axis_size(const dpar_mesh *m, const char *axes, int *out);
/* Device at mesh coordinates coords[ndim]. Errors: DPAR_ERR_INVALID_ARGUMENT. */
DPAR_API dpar_status dpar_mesh_device(const dpar_mesh *m, const int *coords, int *device);
/* Mesh coordinates of a device (coords[ndim]).
   Errors: DPAR_ERR_INVALID_ARGUMENT when the device is not in the mesh. */
DPAR_API dpar_status dpar_mesh_coords(const dpar_mesh *m, int device, int *coords);
/* The group a collective over `axes` spans from `device`: its members in
   rank order (row-major over the named axes in the order written, as JAX
   ranks an axis tuple: "b,a" differs from "a,b"; ppermute alone uses
   mesh-axis order, as JAX sorts its groups),
   written to members[] (capacity DPAR_MAX_DEVICES), their count to *n, and
   the device's own position in the group to *index (may be NULL). */
DPAR_API dpar_status dpar_mesh_group(const dpar_mesh *m, const char *axes, int device, int *members, int *n,
                                     int *index);

/* ---------------------------------------------------------------------------
   Global arrays with a sharding spec (JAX's PartitionSpec / NamedSharding)
   ------------------------------------------------------------------------ */
typedef struct dpar_array dpar_array;

typedef struct dpar_array_desc {
    dpar_dtype dtype;
    int ndim;                        /* 0..DPAR_MAX_DIMS */
    int64_t shape[DPAR_MAX_DIMS];    /* global shape */
    const char *spec[DPAR_MAX_DIMS]; /* per dim: NULL (whole, replicated), an axis
                                        name "data", or several "data,model" */
} dpar_array_desc;

/* Creates a global array on every device of the mesh: each device holds the
   shard its mesh coordinates select (dims split over an axis of size n hold
   shape[d]/n elements; over axes not named in the spec the shard is replicated).
   Errors: DPAR_ERR_SHAPE (dim not divisible by its axes' size, text names both),
   DPAR_ERR_UNKNOWN_AXIS, DPAR_ERR_INVALID_ARGUMENT (an axis used twice, a
   spec for a dimension >= ndim), DPAR_ERR_OUT_OF_MEMORY. Contents are zero. */
DPAR_API dpar_status dpar_array_create(dpar_mesh *m, const dpar_array_desc *desc, dpar_array **out);
/* Frees the array and its shards. NULL is a no-op (DPAR_OK). Errors
   (nothing is freed): DPAR_ERR_STATE inside a pmap/shard_map function (the
   dispatch may be using the shards), while a call on its runtime runs on
   another thread, or for a stale array (destroyed, or freed with its mesh). */
DPAR_API dpar_status dpar_array_destroy(dpar_array *a);
/* device_put: scatters (split dims) / replicates a host array in row-major
   order of the global shape, `host` holding prod(shape) elements of dtype.
   dpar_array_put, _get and _put_rows run between dispatches: DPAR_ERR_STATE
   while a pmap/shard_map runs on the array's runtime (inside fn, or from
   another thread; a dispatch started meanwhile waits for them) and for a
   stale array. */
DPAR_API dpar_status dpar_array_put(dpar_array *a, const void *host);
/* Gathers the global array to host (row-major, prod(shape) elements); each
   shard is read from the first device in mesh order that holds it. */
DPAR_API dpar_status dpar_array_get(const dpar_array *a, void *host);
/* Multi-process data loading: the rows [*begin, *begin + *count) of
   dimension 0 that this process's shards cover (the hull, if they are not
   contiguous). Without MPI, or when dimension 0 is not split: all rows.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, 0-d array). */
DPAR_API dpar_status dpar_array_local_rows(const dpar_array *a, int64_t *begin, int64_t *count);
/* Writes rows [row_begin, row_begin + row_count) of dimension 0 (host holds
   exactly those rows, row-major) into every shard of this process that they
   cover; with dpar_array_local_rows each process loads only its slice.
   Errors: DPAR_ERR_SHAPE when a local shard is only partly covered, or the
   range is outside the array. */
DPAR_API dpar_status dpar_array_put_rows(dpar_array *a, int64_t row_begin, int64_t row_count, const void *host);
/* The shard buffer of `device` (NULL if the device is not in the array's mesh
   or lives on another process). */
DPAR_API dpar_buffer *dpar_array_shard(const dpar_array *a, int device);
DPAR_API int dpar_array_ndim(const dpar_array *a);
DPAR_API int64_t dpar_array_dim(const dpar_array *a, int i);
/* Draws which device holds which block of a global 0-, 1- or 2-d array
   (jax.debug.visualize_array_sharding) as a text table to `path`, or stdout
   when path is NULL: a header line "f32[8, 6] spec(data, model) mesh(data=2,
   model=2)", then one cell per block (rows: dimension 0's blocks; columns:
   the last dimension's, so a 1-d array is one row), each naming the devices
   holding it ("dev 3", or "devs 0,2" when replicated over a mesh axis) and
   its element range ("[0:4, 3:6]"). Dimensions not in the spec are whole.
   Errors: DPAR_ERR_INVALID_ARGUMENT (a NULL), DPAR_ERR_SHAPE (more than 2
   dimensions), DPAR_ERR_IO naming the path. */
DPAR_API dpar_status dpar_visualize_array_sharding(const dpar_array *a, const char *path);

/* ---------------------------------------------------------------------------
   Dispatch: pmap and shard_map
   ------------------------------------------------------------------------ */
typedef struct dpar_ctx dpar_ctx;
/* The per-device function. Return DPAR_OK or the status of the failing call. */
typedef dpar_status (*dpar_fn)(dpar_ctx *ctx, void *user);

#define DPAR_MAPPED     0    /* pmap in_axes: split the leading dimension */
#define DPAR_REPLICATED (-1) /* pmap in_axes: every device gets the whole array (JAX None) */

typedef struct dpar_pmap_input {
    const void *data; /* host data, row-major */
    dpar_dtype dtype;
    int ndim;
    int64_t shape[DPAR_MAX_DIMS]; /* global shape; DPAR_MAPPED: shape[0] = axis size */
    int in_axis;                  /* DPAR_MAPPED (0) or DPAR_REPLICATED (-1) */
} dpar_pmap_input;

typedef struct dpar_pmap_output {
    void *data; /* host destination: [axis_size, shape...] stacked */
    dpar_dtype dtype;
    int ndim;
    int64_t shape[DPAR_MAX_DIMS]; /* per-device shape */
} dpar_pmap_output;

typedef struct dpar_pmap_desc {
    const char *axis; /* mesh axis to map over (JAX axis_name) */
    dpar_fn fn;
    void *user;
    int num_inputs, num_outputs; /* each <= DPAR_MAX_ARGS/2; 0: inferred, the number of
                                    leading inputs / outputs whose data is non-NULL */
    dpar_pmap_input inputs[DPAR_MAX_ARGS / 2];
    dpar_pmap_output outputs[DPAR_MAX_ARGS / 2];
} dpar_pmap_desc;

/* JAX pmap on host data: every device of the mesh runs fn once, concurrently.
   Inside, dpar_ctx_arg(ctx, i) is input i's per-device part (mapped: shape[1:],
   slice axis_index(axis); replicated: whole) and dpar_ctx_arg(ctx,
   num_inputs + j) is output j's per-device buffer (zeroed). After fn returns
   everywhere, output j is stacked along a new leading dimension of size
   axis_size into outputs[j].data, taken from the devices whose other mesh
   coordinates are 0.
   Checked before anything runs: a mapped input whose leading dimension is not
   the axis size -> DPAR_ERR_SHAPE naming the input, its leading dimension,
   the axis and its size; unknown axis -> DPAR_ERR_UNKNOWN_AXIS.
   The first error of any device is returned (its text prefixed "device D: ");
   the other devices are told to stop. Must not be called from inside fn. */
DPAR_API dpar_status dpar_pmap(dpar_mesh *m, const dpar_pmap_desc *desc);

typedef struct dpar_shard_map_desc {
    dpar_fn fn;
    void *user;
    int num_args;                    /* <= DPAR_MAX_ARGS; 0: inferred, the number of leading
                                        non-NULL args (none: fn gets no arguments) */
    dpar_array *args[DPAR_MAX_ARGS]; /* arrays of this mesh; fn sees each device's shard */
} dpar_shard_map_desc;

/* shard_map over device-resident arrays: fn runs once per device of the mesh
   and dpar_ctx_arg(ctx, i) is args[i]'s shard on that device (shape from the
   array's spec, e.g. 8 rows split over a 4-device axis gives 2 rows). Writes
   to a shard are the output. Errors: DPAR_ERR_INVALID_ARGUMENT (array of
   another mesh), and the first error of any device, as dpar_pmap. */
DPAR_API dpar_status dpar_shard_map(dpar_mesh *m, const dpar_shard_map_desc *desc);

/* --- inside fn --- */
DPAR_API int dpar_ctx_device(const dpar_ctx *ctx); /* device index */
DPAR_API dpar_runtime *dpar_ctx_runtime(const dpar_ctx *ctx);
DPAR_API dpar_mesh *dpar_ctx_mesh(const dpar_ctx *ctx);
/* This device's position in the mesh, 0..dpar_mesh_size - 1 (row-major over
   the mesh axes: dpar_ctx_axis_index over every axis); -1 for NULL. */
DPAR_API int dpar_ctx_position(const dpar_ctx *ctx);
/* Number of the dispatch ctx runs in: the runtime's pmap/shard_map calls
   counted from 1, the same on every device (and process) of the dispatch.
   Helpers key per-dispatch state on it; 0 for NULL. */
DPAR_API uint64_t dpar_ctx_dispatch_id(const dpar_ctx *ctx);
/* Whether the calling thread runs a pmap/shard_map function (a device's
   worker or communication thread): calls allowed only between dispatches
   check it. */
DPAR_API bool dpar_in_dispatch(void);
/* Argument i's buffer on this device; NULL (and last error set) if out of range. */
DPAR_API dpar_buffer *dpar_ctx_arg(const dpar_ctx *ctx, int i);
/* JAX axis_index / axis_size for "a" or "a,b" (index row-major over the axes
   in the order written: on a 2x4 (a, b) mesh, device (a=0, b=1) has index 1
   over "a,b" and 2 over "b,a").
   Errors: DPAR_ERR_UNKNOWN_AXIS naming the axis and listing the mesh axes. */
DPAR_API dpar_status dpar_ctx_axis_index(const dpar_ctx *ctx, const char *axes, int *out);
DPAR_API dpar_status dpar_ctx_axis_size(const dpar_ctx *ctx, const char *axes, int *out);
/* Allocates a buffer on this device (see dpar_buffer_create). */
DPAR_API dpar_status dpar_ctx_buffer(dpar_ctx *ctx, dpar_dtype dtype, int ndim, const int64_t *shape,
                                     dpar_buffer **out);
/* Registers fn(ctx, obj, status) to run on this device when the pmap/shard_map
   function returns (status: what it returned), before the dispatch ends: a
   helper with per-step state closes its step there, and an error it returns
   while status is DPAR_OK becomes this device's error of the dispatch (the
   data-parallel helper so reports a step begun and never finished). Hooks run
   in registration order; the same (fn, obj) again in one dispatch is a no-op.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, more than 8 hooks in one dispatch),
   DPAR_ERR_STATE (ctx stale or of another thread). */
typedef dpar_status (*dpar_ctx_exit_fn)(dpar_ctx *ctx, void *obj, dpar_status status);
DPAR_API dpar_status dpar_ctx_at_exit(dpar_ctx *ctx, dpar_ctx_exit_fn fn, void *obj);

/* ---------------------------------------------------------------------------
   Helper objects on a mesh (see THREADS AND LIFETIMES at the top)
   ------------------------------------------------------------------------ */
/* Ties a helper object built on this API (util/dpar_train.h's dpar_dp and
   dpar_zero1, or your own; obj is its unique address) to mesh m:
   dpar_mesh_destroy and dpar_runtime_destroy call release(obj) for each object
   still attached, before they free the mesh's arrays, so a helper left alive
   is neither leaked nor freed twice, and its handle is refused afterwards
   (dpar_handle_check). Outside fn. Errors: DPAR_ERR_INVALID_ARGUMENT (NULL),
   DPAR_ERR_STATE (m stale or being destroyed, obj already attached),
   DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_handle_attach(dpar_mesh *m, void *obj, void (*release)(void *obj));
/* DPAR_OK when obj is attached (live), else DPAR_ERR_STATE ("fn: the helper
   object is stale ..."; NULL: DPAR_ERR_INVALID_ARGUMENT). Inside fn, an object
   checked once in the dispatch is checked again by a compare (it cannot be
   destroyed while the dispatch runs). */
DPAR_API dpar_status dpar_handle_check(const void *obj, const char *fn);
/* Detaches obj for its destroy call; the caller frees it afterwards. Errors:
   DPAR_ERR_STATE when obj is stale (destroyed, or released with its mesh or
   runtime: free nothing), when a call on its runtime is in flight on another
   thread or inside fn (obj stays attached); DPAR_ERR_INVALID_ARGUMENT (NULL). */
DPAR_API dpar_status dpar_handle_detach(void *obj, const char *fn);

/* ---------------------------------------------------------------------------
   Collectives (inside fn). Every member of the group (the devices that share
   all mesh coordinates not in `axes`) must call the same collective with the
   same dtype and shapes, in the same order. in == out (in place) is allowed
   unless said otherwise. Dtypes f32, f16, bf16 (accumulated in f32 in mesh
   order, rounded once), i32 (wrap-around sums).
   Errors, for all: DPAR_ERR_UNKNOWN_AXIS; DPAR_ERR_SHAPE / DPAR_ERR_DTYPE for
   a local mismatch; DPAR_ERR_COLLECTIVE_MISMATCH when members disagree (every
   member gets it, naming both calls); DPAR_ERR_TIMEOUT naming the devices that
   never arrived within the timeout; DPAR_ERR_ABORTED when another device
   failed first. Zero-size buffers are allowed everywhere.
   ------------------------------------------------------------------------ */
typedef enum dpar_reduce_op { DPAR_SUM = 0, DPAR_MEAN, DPAR_MAX, DPAR_MIN } dpar_reduce_op;

/* out = reduce over the group of in (same shape, same dtype).
   pmean = psum / n; i32 is refused with DPAR_ERR_DTYPE, since JAX's pmean of integers is a float
   mean (cast to f32 first). pmax/pmin propagate NaN: if any member holds NaN at an element, every
   member gets NaN there. */
DPAR_API dpar_status dpar_psum(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes);
DPAR_API dpar_status dpar_pmean(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes);
DPAR_API dpar_status dpar_pmax(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes);
DPAR_API dpar_status dpar_pmin(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes);
DPAR_API dpar_status dpar_preduce(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                  dpar_reduce_op op);
/* all_gather along dimension `dim` of in (group size n).
   tiled = false: out.shape = in.shape with n inserted at dim (JAX stacked);
   tiled = true:  out.shape[dim] = n * in.shape[dim]. Member k's data goes to
   position k. Not in place. */
DPAR_API dpar_status dpar_all_gather(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes, int dim,
                                     bool tiled);
/* psum_scatter (reduce-scatter) along dimension `dim`: the sum over the group
   is split in n blocks along dim and member k keeps block k.
   tiled = false: in.shape[dim] must equal n and out drops that dim;
   tiled = true:  in.shape[dim] must be divisible by n, out.shape[dim] = in/n.
   Not divisible -> DPAR_ERR_SHAPE naming the size and n (no padding). Not in place. */
DPAR_API dpar_status dpar_psum_scatter(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                       int dim, bool tiled);
/* ppermute: pairs[2i] = source, pairs[2i+1] = destination, as positions in the
   group (axis_index). Each source and each destination at most once; members
   that are no destination get zeros (JAX semantics). In place allowed. */
DPAR_API dpar_status dpar_ppermute(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                   const int *pairs, int num_pairs);
/* all_to_all (JAX, tiled): in.shape[split_dim] divisible by n; block j along
   split_dim goes to member j; received blocks are concatenated along
   concat_dim in member order. out.shape = in.shape with shape[split_dim] / n
   and shape[concat_dim] * n. Not in place. */
DPAR_API dpar_status dpar_all_to_all(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     int split_dim, int concat_dim);
/* pbroadcast: every member gets the value of the member at position `root`
   (NCCL broadcast). In place allowed. */
DPAR_API dpar_status dpar_pbroadcast(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     int root);

/* Async forms, one per collective: dpar_X_start takes dpar_X's arguments
   plus `req`, returns at once with a handle in *req (NULL on error), and
   gives the same result bit for bit as dpar_X. The buffers must not be
   touched until dpar_wait(req) returns (which returns the collective's
   status and frees the handle). Collectives of one device run in issue
   order, blocking and async alike. Errors: as the blocking form, reported
   by the start call (argument checks) or by dpar_wait (everything else);
   DPAR_ERR_INVALID_ARGUMENT when req is NULL. */
typedef struct dpar_request dpar_request;
DPAR_API dpar_status dpar_psum_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     dpar_request **req);
DPAR_API dpar_status dpar_pmean_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                      dpar_request **req);
DPAR_API dpar_status dpar_pmax_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     dpar_request **req);
DPAR_API dpar_status dpar_pmin_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     dpar_request **req);
DPAR_API dpar_status dpar_preduce_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                        dpar_reduce_op op, dpar_request **req);
DPAR_API dpar_status dpar_all_gather_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                           int dim, bool tiled, dpar_request **req);
DPAR_API dpar_status dpar_psum_scatter_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                             int dim, bool tiled, dpar_request **req);
DPAR_API dpar_status dpar_ppermute_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                         const int *pairs, int num_pairs, dpar_request **req);
DPAR_API dpar_status dpar_all_to_all_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                           int split_dim, int concat_dim, dpar_request **req);
DPAR_API dpar_status dpar_pbroadcast_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                           int root, dpar_request **req);
DPAR_API dpar_status dpar_wait(dpar_ctx *ctx, dpar_request *req);

/* ---------------------------------------------------------------------------
   Ops on device buffers (all operands on one device; f32 unless said; the
   ops in the >>f64 api table also take f64 on the cpu backend).
   Errors, for all: DPAR_ERR_INVALID_ARGUMENT (NULL, different devices),
   DPAR_ERR_SHAPE (text names both shapes), DPAR_ERR_DTYPE.
   16-bit storage: the ops marked "f32, f16 or bf16" (bias_grad, reduce
   but not its backward, softmax, conv2d, the pools, the norms, attention,
   and their gradients) take one dtype for all their tensors (stats buffers stay f32). With f16 or bf16 they
   accumulate in f32 exactly as the f32 op does on the same (widened) inputs
   and round each result once to nearest even, on every backend (Vulkan and
   CUDA cast into f32 device temporaries and back: a 16-bit result is that
   backend's f32 result rounded once; the temporaries, 4 bytes per element of
   each 16-bit operand of the largest such call, are the device's, reused
   without waiting for it and kept until dpar_runtime_destroy). Mixed dtypes: DPAR_ERR_DTYPE naming both operands;
   i32 and other dtypes: DPAR_ERR_DTYPE naming the op, the dtype and the backend.
   ------------------------------------------------------------------------ */
/* C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T; A, B, C 2-D,
   op(A) [M,K], op(B) [K,N], C [M,N]. beta = 0 ignores C's old contents
   (even NaN). C f32; A and B f32, or both f16 or both bf16, widened and
   accumulated in f32 (every backend); or A, B and C all f64 (cpu backend,
   accumulated in double: a blocked GEMM, see >>f64 api). */
DPAR_API dpar_status dpar_matmul(dpar_buffer *C, const dpar_buffer *A, const dpar_buffer *B, bool trans_a, bool trans_b,
                                 float alpha, float beta);
/* y[M,N] += b[N] (broadcast over rows). y may be any rank >= 1; last dim N. */
DPAR_API dpar_status dpar_bias_add(dpar_buffer *y, const dpar_buffer *b);
/* db[N] = beta * db + sum over rows of dy[M,N]. f32, f16 or bf16, or f64 on the cpu backend (db and dy alike). */
DPAR_API dpar_status dpar_bias_grad(dpar_buffer *db, const dpar_buffer *dy, float beta);
/* y = max(x, 0) (NaN propagates). Same shape; in place allowed. */
DPAR_API dpar_status dpar_relu(dpar_buffer *y, const dpar_buffer *x);
/* dx = dy where x > 0, else 0. Same shapes; dx may alias dy. */
DPAR_API dpar_status dpar_relu_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x);
/* Softmax cross-entropy with integer labels, logits [M,C] f32 (or f64 on the
   cpu backend: then loss and dlogits f64 too), labels [M] i32 in 0..C-1.
   loss (1 element, the logits' dtype) = mean_i(logsumexp(z_i) - z_i[label_i]);
   dlogits (may be NULL) [M,C] = (softmax(z_i) - onehot(label_i)) / M.
   Numerically stable (max subtracted). A label out of range gives
   DPAR_ERR_INVALID_ARGUMENT naming the first bad row and its value (CPU: at
   once, nothing written; GPUs: NaN rows, and the error at the next sync or
   read of that device). dpar_cross_entropy adds an ignore label and smoothing. */
DPAR_API dpar_status dpar_softmax_xent(dpar_buffer *loss, dpar_buffer *dlogits, const dpar_buffer *logits,
                                       const dpar_buffer *labels);
/* Mean squared error: loss (1 element) = mean((pred - target)^2); dpred (may be
   NULL) = 2 (pred - target) / count. pred and target same shape (no broadcast). */
DPAR_API dpar_status dpar_mse(dpar_buffer *loss, dpar_buffer *dpred, const dpar_buffer *pred,
                              const dpar_buffer *target);
/* y += alpha * x (same count). */
DPAR_API dpar_status dpar_axpy(dpar_buffer *y, float alpha, const dpar_buffer *x);
/* x *= alpha. */
DPAR_API dpar_status dpar_scale(dpar_buffer *x, float alpha);
/* x = value (any dtype; i32 gets value truncated toward zero, saturating, NaN -> 0, as dpar_cast). */
DPAR_API dpar_status dpar_fill(dpar_buffer *x, float value);
/* dst = src (same dtype and count; shapes may differ). */
DPAR_API dpar_status dpar_copy(dpar_buffer *dst, const dpar_buffer *src);
/* dst = (dtype of dst) src, same count; f32/f16/bf16/i32 in any direction;
   float -> i32 truncates toward zero (NaN -> 0, saturating). */
DPAR_API dpar_status dpar_cast(dpar_buffer *dst, const dpar_buffer *src);
/* out (1 element) = sum(x) / sum(x*x) of an f32 buffer (out f32), or of an
   f64 one on the cpu backend (out f64; see >>f64 api). */
DPAR_API dpar_status dpar_sum(dpar_buffer *out, const dpar_buffer *x);
DPAR_API dpar_status dpar_sum_squares(dpar_buffer *out, const dpar_buffer *x);

/* >>elementwise api ===========================================================
   Elementwise ops with NumPy broadcasting, reductions along axes, softmax
   along the last axis and shape ops, each with its backward where it has a
   gradient. f32 unless said (shape ops also move i32; f64 on the cpu backend:
   see the >>f64 api table). Shapes follow NumPy:
   broadcasting aligns trailing dims; a dim of size 1 stretches to any size
   (0 included). Errors, for all: DPAR_ERR_INVALID_ARGUMENT (NULL, different
   devices, op out of range, aliasing), DPAR_ERR_SHAPE (naming the shapes),
   DPAR_ERR_DTYPE. Backends lacking an op return DPAR_ERR_BACKEND naming it. */
typedef enum dpar_unary_op {
    DPAR_UNARY_NEG = 0,     /* -x */
    DPAR_UNARY_EXP,         /* e^x */
    DPAR_UNARY_LOG,         /* ln x */
    DPAR_UNARY_SQRT,        /* sqrt x */
    DPAR_UNARY_RSQRT,       /* 1 / sqrt x */
    DPAR_UNARY_TANH,        /* tanh x */
    DPAR_UNARY_SIGMOID,     /* 1 / (1 + e^-x) */
    DPAR_UNARY_GELU_TANH,   /* x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016; GPT-2) */
    DPAR_UNARY_GELU_ERF,    /* x/2 (1 + erf(x / sqrt 2)) (exact GELU, jax.nn.gelu(approximate=False)) */
    DPAR_UNARY_SILU,        /* x sigmoid(x) (swish) */
    DPAR_UNARY_SQUARE,      /* x^2 */
    DPAR_UNARY_ADD_SCALAR,  /* x + s (scalar forms: s is dpar_unary's `s`) */
    DPAR_UNARY_MUL_SCALAR,  /* x * s */
    DPAR_UNARY_RSUB_SCALAR, /* s - x */
    DPAR_UNARY_DIV_SCALAR,  /* x / s */
    DPAR_UNARY_RDIV_SCALAR, /* s / x */
    DPAR_UNARY_POW_SCALAR,  /* x^s (pow; x < 0 with a non-integer s gives NaN) */
    DPAR_UNARY_COUNT
} dpar_unary_op;
/* y = op(x) (s: the scalar of the *_SCALAR forms, ignored by the others).
   x, y: same shape, f32 (or both f64 on the cpu backend); in place allowed. */
DPAR_API dpar_status dpar_unary(dpar_buffer *y, const dpar_buffer *x, dpar_unary_op op, float s);
/* dx = dy * op'(x). dx, dy, x: same shape, f32 (or all f64 on the cpu backend); dx may alias dy. */
DPAR_API dpar_status dpar_unary_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x, dpar_unary_op op,
                                         float s);

typedef enum dpar_binary_op {
    DPAR_BINARY_ADD = 0,
    DPAR_BINARY_SUB,
    DPAR_BINARY_MUL,
    DPAR_BINARY_DIV,
    DPAR_BINARY_COUNT
} dpar_binary_op;
/* y = a op b with broadcasting: y's shape must be broadcast(a.shape, b.shape).
   f32 (or all f64 on the cpu backend). y may alias a or b when that operand has y's shape. */
DPAR_API dpar_status dpar_binary(dpar_buffer *y, const dpar_buffer *a, const dpar_buffer *b, dpar_binary_op op);
/* Gradients of dpar_binary, each summed over the dims its operand was
   broadcast along (reduce-to-shape): da (a's shape, or NULL to skip) and db
   (b's shape, or NULL). dy: y's shape. add: da = dy, db = dy; sub: db = -dy;
   mul: da = dy b, db = dy a; div: da = dy / b, db = -dy a / b^2. */
DPAR_API dpar_status dpar_binary_backward(dpar_buffer *da, dpar_buffer *db, const dpar_buffer *dy, const dpar_buffer *a,
                                          const dpar_buffer *b, dpar_binary_op op);
/* y = cond ? a : b elementwise, with broadcasting of cond (y's dtype: nonzero
   is true, NaN too; or i32: nonzero), a and b to y's shape. y, a, b f32, or
   all f64 (cpu backend, >>f64 api). a or b NULL: the
   scalar a_value / b_value instead (e.g. a mask: dpar_where(y, m, x, NULL, 0,
   -INFINITY)). Its gradient is dpar_where(da, cond, dy, NULL, 0, 0) (then
   dpar_reduce to a's shape if a was broadcast). At most 4 dims after merging
   neighbours that broadcast alike (DPAR_ERR_SHAPE otherwise). */
DPAR_API dpar_status dpar_where(dpar_buffer *y, const dpar_buffer *cond, const dpar_buffer *a, const dpar_buffer *b,
                                float a_value, float b_value);

typedef enum dpar_reduce_kind {
    DPAR_REDUCE_SUM = 0, /* CPU sums in double */
    DPAR_REDUCE_MEAN,    /* sum / count (NaN over 0 elements, as NumPy) */
    DPAR_REDUCE_MAX,     /* NaN propagates; over 0 elements: DPAR_ERR_SHAPE */
    DPAR_REDUCE_ARGMAX,  /* y is i32: the first maximum's (first NaN's) flat index, row-major over the reduced
                            axes in x's order whatever their order in `axes` (NumPy's unravel order) */
    DPAR_REDUCE_KIND_COUNT
} dpar_reduce_kind;
/* y = reduce(x) over `axes` (naxes entries, negative counts from the end;
   axes NULL: every axis). y's shape is x's without those axes, or with them
   kept as 1 (keepdims); both are accepted. x f32, f16 or bf16 (16-bit
   storage: accumulated as the f32 op, rounded once), y the same dtype (i32
   for ARGMAX); or x and y f64 on the cpu backend (y i32 for ARGMAX).
   At most 4 dims after merging neighbouring axes that are both reduced or
   both kept (DPAR_ERR_SHAPE otherwise). */
DPAR_API dpar_status dpar_reduce(dpar_buffer *y, const dpar_buffer *x, dpar_reduce_kind kind, const int *axes,
                                 int naxes);
/* dx (x's shape) = gradient of dpar_reduce: SUM dy broadcast back; MEAN
   dy / count broadcast back; MAX dy at the first maximum of each reduced
   slice (NaN: the first NaN), 0 elsewhere (as max pooling; JAX would split
   ties evenly). dy: y's shape; x: the forward's input (MAX only; may be NULL
   for SUM and MEAN). ARGMAX: DPAR_ERR_INVALID_ARGUMENT (no gradient). */
DPAR_API dpar_status dpar_reduce_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x,
                                          dpar_reduce_kind kind, const int *axes, int naxes);

/* Softmax (log_softmax when `log`) along the last axis, stable (max
   subtracted, in double on the CPU): softmax([1000, 1000]) = [0.5, 0.5];
   entries of -inf get 0 (log: -inf); a row that is all -inf gives NaN (as
   JAX). x, y same shape, f32, f16 or bf16, or f64 on the cpu backend (one dtype); in place allowed. */
DPAR_API dpar_status dpar_softmax(dpar_buffer *y, const dpar_buffer *x, bool log);
/* dx from dy and the forward's output y: softmax dx = y (dy - sum(dy y));
   log_softmax dx = dy - exp(y) sum(dy). Same shapes and dtype (f32, f16 or
   bf16, or f64 on the cpu backend); dx may alias dy. */
DPAR_API dpar_status dpar_softmax_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *y, bool log);

/* Shape ops: f32 or i32, or f64 on the cpu backend (y and x the same dtype), bit-exact copies. */
/* y = x with its axes permuted: y.shape[i] = x.shape[perm[i]] (perm NULL:
   reversed). Backward: transpose with the inverse permutation. Not in place. */
DPAR_API dpar_status dpar_transpose(dpar_buffer *y, const dpar_buffer *x, const int *perm);
/* y = x broadcast to y's shape (NumPy rules). Backward: dpar_reduce SUM. */
DPAR_API dpar_status dpar_broadcast_to(dpar_buffer *y, const dpar_buffer *x);
/* y = x[start[i] : : step[i]] with y.shape[i] elements along axis i (step
   NULL: 1; steps >= 1); every index read must lie in x. Backward:
   dpar_slice_backward. */
DPAR_API dpar_status dpar_slice(dpar_buffer *y, const dpar_buffer *x, const int64_t *start, const int64_t *step);
/* dx = 0, then dx[start : : step] = dy (the transpose of dpar_slice). */
DPAR_API dpar_status dpar_slice_backward(dpar_buffer *dx, const dpar_buffer *dy, const int64_t *start,
                                         const int64_t *step);
/* y = value everywhere, then y[lo[i] : lo[i] + x.shape[i]] = x (padding
   after each axis is what y's shape leaves). lo NULL: zeros. Backward:
   dpar_slice(dx, dy, lo, NULL). */
DPAR_API dpar_status dpar_pad(dpar_buffer *y, const dpar_buffer *x, const int64_t *lo, float value);
/* y = the n buffers xs joined along `axis` (negative: from the end); the
   other dims equal. Backward: one dpar_slice per input. */
DPAR_API dpar_status dpar_concat(dpar_buffer *y, const dpar_buffer *const *xs, int n, int axis);

/* ---------------------------------------------------------------------------
   Convolution and pooling, 2-D, NHWC (JAX / flax layouts; f32; f64 on the cpu backend)
   Window geometry per spatial dim (h, w), as lax.conv_general_dilated and
   flax.linen.{avg,max}_pool define it:
     effective window  ek = (k - 1) * dilation + 1
     VALID             out = floor((in - ek) / stride) + 1, no padding
     SAME              out = ceil(in / stride); total = max((out - 1) * stride + ek - in, 0),
                       lo = total / 2, hi = total - lo (XLA's padtype_to_pads)
     EXPLICIT          out = floor((in + lo + hi - ek) / stride) + 1
   Zero-filled fields take their defaults (a zeroed desc, or NULL, is valid).
   ------------------------------------------------------------------------ */
typedef enum dpar_padding {
    DPAR_PADDING_DEFAULT = 0, /* conv2d: SAME (flax nn.Conv); pools: VALID (flax pooling) */
    DPAR_PADDING_SAME,
    DPAR_PADDING_VALID,
    DPAR_PADDING_EXPLICIT /* pad[][] below */
} dpar_padding;
typedef struct dpar_conv2d_desc {
    int stride[2];        /* (h, w); 0: 1 */
    int dilation[2];      /* kernel (rhs) dilation (h, w); 0: 1 */
    dpar_padding padding; /* 0: SAME */
    int pad[2][2];        /* EXPLICIT only: {{top, bottom}, {left, right}}, >= 0 */
} dpar_conv2d_desc;
typedef struct dpar_pool2d_desc {
    int window[2];          /* (h, w); 0: 2 */
    int stride[2];          /* (h, w); 0: the window (PyTorch's default; flax's is 1: set it) */
    dpar_padding padding;   /* 0: VALID */
    int pad[2][2];          /* EXPLICIT only: {{top, bottom}, {left, right}}, >= 0 */
    bool count_exclude_pad; /* avg_pool: divide by the in-image count (flax count_include_pad=False);
                               false (default): by the window size, as flax's default */
} dpar_pool2d_desc;

/* Output shape y [N, OH, OW, O] of conv2d of x [N, H, W, C] with kernel
   w [KH, KW, C, O] (HWIO). Errors: DPAR_ERR_SHAPE (ranks, C mismatch, window
   larger than the padded input, a size or dilated window above 2^40),
   DPAR_ERR_INVALID_ARGUMENT (bad desc field). */
DPAR_API dpar_status dpar_conv2d_output_shape(const int64_t x_shape[4], const int64_t w_shape[4],
                                              const dpar_conv2d_desc *d, int64_t y_shape[4]);
/* y [N,OH,OW,O] = conv(x [N,H,W,C], w [KH,KW,C,O]) + b [O] (b may be NULL):
     y[n,i,j,o] = b[o] + sum_{p,q,c} x[n, i*sh - pt + p*dh, j*sw - pl + q*dw, c] w[p,q,c,o]
   (cross-correlation, as lax.conv_general_dilated with ('NHWC','HWIO','NHWC');
   out-of-image x reads as 0). All f32, f16 or bf16 (one dtype: see 16-bit storage
   above; every backend), or all f64 (cpu backend, in double: >>f64 api), on one
   device; y must not alias x or w.
   CPU: im2col a cache-sized block at a time, each block straight into the matrix product (f32:
   scratch per thread 128 KiB or 24 im2col rows, w^T for the input gradient; f64: 4 MiB). CUDA:
   im2col + cuBLAS sgemm over chunks of images (column matrix <= 64 MiB; a 1x1
   stride-1 unpadded kernel multiplies x in place); the input gradient folds
   the column gradient back with a gather, so results repeat bit for bit.
   Vulkan: one shader invocation per output element.
   Errors: DPAR_ERR_SHAPE (naming the shapes and the expected y), DPAR_ERR_DTYPE
   (mixed dtypes, i32), DPAR_ERR_INVALID_ARGUMENT
   (desc fields, aliasing). The pools and gradients below: dtypes and errors alike. */
DPAR_API dpar_status dpar_conv2d(dpar_buffer *y, const dpar_buffer *x, const dpar_buffer *w, const dpar_buffer *b,
                                 const dpar_conv2d_desc *d);
/* dx [N,H,W,C] = d(sum y*dy)/dx for dy [N,OH,OW,O] and w [KH,KW,C,O] (overwrites dx;
   the transposed convolution). Errors as dpar_conv2d. */
DPAR_API dpar_status dpar_conv2d_backward_input(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *w,
                                                const dpar_conv2d_desc *d);
/* dw [KH,KW,C,O] = d(sum y*dy)/dw for x [N,H,W,C] and dy [N,OH,OW,O] (overwrites dw);
   db [O] (may be NULL) = sum of dy over N, OH, OW (as dpar_bias_grad with beta 0).
   Errors as dpar_conv2d. */
DPAR_API dpar_status dpar_conv2d_backward_kernel(dpar_buffer *dw, dpar_buffer *db, const dpar_buffer *x,
                                                 const dpar_buffer *dy, const dpar_conv2d_desc *d);
/* Output shape y [N, OH, OW, C] of a pool over x [N, H, W, C]. Errors as above. */
DPAR_API dpar_status dpar_pool2d_output_shape(const int64_t x_shape[4], const dpar_pool2d_desc *d, int64_t y_shape[4]);
/* y [N,OH,OW,C] = mean of each window of x [N,H,W,C] (padding counts as 0 and,
   unless count_exclude_pad, in the divisor: flax.linen.avg_pool). With
   count_exclude_pad, a window wholly in the padding averages nothing: NaN
   (flax's 0/0, as DPAR_REDUCE_MEAN over 0 elements), and no gradient. */
DPAR_API dpar_status dpar_avg_pool2d(dpar_buffer *y, const dpar_buffer *x, const dpar_pool2d_desc *d);
/* dx [N,H,W,C] = the gradient of dpar_avg_pool2d for dy [N,OH,OW,C] (overwrites dx). */
DPAR_API dpar_status dpar_avg_pool2d_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_pool2d_desc *d);
/* y [N,OH,OW,C] = max of each window of x [N,H,W,C] (padding is -inf; NaN
   wins; a window wholly in the padding gives -inf: flax.linen.max_pool). */
DPAR_API dpar_status dpar_max_pool2d(dpar_buffer *y, const dpar_buffer *x, const dpar_pool2d_desc *d);
/* dx [N,H,W,C] = dy routed to the first maximum of each window (row-major in
   the window; ties go to the first only), summed where windows overlap;
   x is the forward input. Overwrites dx. */
DPAR_API dpar_status dpar_max_pool2d_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x,
                                              const dpar_pool2d_desc *d);

/* ---------------------------------------------------------------------------
   SGD (PyTorch torch.optim.SGD with dampening 0 = optax.sgd + add_decayed_weights)
     g = grad * clip + weight_decay * param
     v = momentum * v + g                         (if momentum != 0)
     u = nesterov ? g + momentum * v : v          (u = g if momentum == 0)
     param -= learning_rate * u
   clip = 1, or for clip_norm > 0 with global norm ||g||_2 over all buffers:
     clip = norm < clip_norm ? 1 : clip_norm / norm   (optax.clip_by_global_norm)
   ------------------------------------------------------------------------ */
typedef struct dpar_sgd_desc {
    float learning_rate;   /* >= 0, finite (0: the step leaves param as it is) */
    float momentum;        /* 0..1; 0 = plain SGD (momentum buffers may be NULL) */
    bool nesterov;         /* needs momentum > 0 */
    float weight_decay;    /* L2, >= 0 */
    float clip_norm;       /* > 0: clip by global norm; 0: off */
    const char *norm_axes; /* axes over which grads are sharded (their squared norms
                              are psum'd); NULL: grads are replicated */
} dpar_sgd_desc;

/* One fused step for one buffer: param, grad, momentum (f32, or all f64 on the
   cpu backend: the update in double; same count).
   clip_scale from dpar_sgd_clip_scale (1 when not clipping).
   Errors: DPAR_ERR_INVALID_ARGUMENT (bad hyper-parameters, missing momentum
   buffer when momentum > 0), DPAR_ERR_SHAPE, DPAR_ERR_DTYPE. */
/* Checks the hyper-parameters alone (every SGD call does it first).
   Errors: DPAR_ERR_INVALID_ARGUMENT naming the field and its valid range. */
DPAR_API dpar_status dpar_sgd_check(const dpar_sgd_desc *d);
DPAR_API dpar_status dpar_sgd_update(const dpar_sgd_desc *d, dpar_buffer *param, const dpar_buffer *grad,
                                     dpar_buffer *momentum, float clip_scale);
/* Clipping by the global norm (inside fn): *norm = sqrt(sum_i sum(grads[i]^2))
   over the n gradient buffers of this device (any shapes; f32, or f64 on the
   cpu backend), the squared total psum'd over d->norm_axes when set (sharded
   gradients); *scale = d->clip_norm / *norm when clipping is on and *norm >=
   clip_norm, else 1 (optax.clip_by_global_norm, PyTorch's clip_grad_norm_).
   Each sum of squares is f32 (f64 for f64 gradients), added on the host in
   gradient order in double: the same bits on every replica. norm may be NULL;
   n = 0 gives norm 0, scale 1. The squared norms go through a scratch the
   device keeps until the runtime is destroyed (f32 [n] for the largest n
   asked, f32 [1] for the psum'd total, f64 [1] with f64 gradients;
   dpar_runtime_device_stats counts it), so a steady clipped step allocates
   nothing; one blocking read per call (more with f64 gradients).
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL ctx, scale or grads with n > 0,
   n < 0, bad hyper-parameters as dpar_sgd_check, an unknown axis in
   norm_axes, a norm that is NaN or Inf: the gradients hold NaN or Inf),
   DPAR_ERR_DTYPE (a gradient that is not float), DPAR_ERR_STATE (a destroyed
   gradient), DPAR_ERR_OUT_OF_MEMORY (the scratch); nothing is changed. */
DPAR_API dpar_status dpar_sgd_clip_scale(dpar_ctx *ctx, const dpar_sgd_desc *d, dpar_buffer *const *grads, int n,
                                         float *scale, float *norm);
/* Full step over `n` parameters (inside fn): clipping (if on) then the fused
   update for each. After the same step on replicas with identical gradients,
   the replicas stay bitwise identical. moms may be NULL when momentum == 0. */
DPAR_API dpar_status dpar_sgd_step(dpar_ctx *ctx, const dpar_sgd_desc *d, dpar_buffer *const *params,
                                   dpar_buffer *const *grads, dpar_buffer *const *moms, int n);

/* >>optim api ================================================================
   AdamW, learning-rate schedules, dynamic loss scaling, cross-entropy with an
   ignore label and label smoothing, embedding, dropout (issue 13). */

/* AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization",
   arXiv:1711.05101, exactly as optax.adamw = chain(scale_by_adam,
   add_decayed_weights, scale_by_learning_rate); torch.optim.AdamW is the same
   formula rounded differently). With t = step (1 for the first update):
     g  = grad * clip
     m  = b1 m + (1 - b1) g              v  = b2 v + (1 - b2) g^2
     m^ = m / (1 - b1^t)                 v^ = v / (1 - b2^t)
     param -= lr (m^ / (sqrt(v^) + eps) + weight_decay param)
   The decay is multiplied by lr (optax), not applied alone. Moments m, v are
   state buffers of the params' dtype (f32; f64 params, cpu backend: f64 moments
   and the update in double, bias corrections unrounded), zero before step 1. clip = 1, or with clip_norm > 0 the
   global-norm factor of dpar_sgd_clip_scale (optax.clip_by_global_norm). */
typedef struct dpar_adamw_desc {
    float learning_rate;   /* >= 0, finite (a schedule: set it each step from dpar_lr_at; 0 moves only m, v) */
    float b1, b2;          /* in (0, 1); 0: optax's defaults 0.9 and 0.999 */
    float eps;             /* > 0; 0: 1e-8 */
    float weight_decay;    /* >= 0; 0: no decay (optax's default is 1e-4: pass it) */
    float clip_norm;       /* > 0: clip by global norm; 0: off */
    const char *norm_axes; /* axes over which grads are sharded (squared norms psum'd); NULL: replicated */
} dpar_adamw_desc;
/* Checks the hyper-parameters alone. Errors: DPAR_ERR_INVALID_ARGUMENT naming the field and its range. */
DPAR_API dpar_status dpar_adamw_check(const dpar_adamw_desc *d);
/* One fused update of one buffer: param, grad, m, v f32 (or all f64, cpu
   backend) of one count on one device; step >= 1 counts updates including this one; clip_scale finite >= 0
   (1 when not clipping). Deterministic: replicas given identical inputs stay
   bitwise identical. Errors: DPAR_ERR_INVALID_ARGUMENT (hyper-parameters, step
   < 1, aliasing, NULL), DPAR_ERR_SHAPE (counts differ, naming both), DPAR_ERR_DTYPE. */
DPAR_API dpar_status dpar_adamw_update(const dpar_adamw_desc *d, dpar_buffer *param, const dpar_buffer *grad,
                                       dpar_buffer *m, dpar_buffer *v, int64_t step, float clip_scale);
/* Full step over `n` parameters (inside fn): every buffer is checked first (a
   failed step changes nothing), then clipping (if on), then the fused update
   of each. Errors: as dpar_adamw_update and dpar_sgd_clip_scale. */
DPAR_API dpar_status dpar_adamw_step(dpar_ctx *ctx, const dpar_adamw_desc *d, dpar_buffer *const *params,
                                     dpar_buffer *const *grads, dpar_buffer *const *ms, dpar_buffer *const *vs, int n,
                                     int64_t step);

/* Learning-rate schedules, pure functions of the step (0-based), as optax's:
     warm-up (steps < warmup_steps): init_lr + (peak_lr - init_lr) step / warmup_steps
                                     (optax.linear_schedule)
     then, with s = step - warmup_steps:
     DPAR_LR_CONSTANT: peak_lr
     DPAR_LR_COSINE:   end_lr + (peak_lr - end_lr) (1 + cos(pi min(s, D) / D)) / 2,
                       D = decay_steps - warmup_steps (optax.warmup_cosine_decay_schedule:
                       decay_steps counts the warm-up too)
     DPAR_LR_STEP:     peak_lr gamma^floor(s / step_every) (optax.exponential_decay, staircase) */
typedef enum dpar_lr_kind { DPAR_LR_CONSTANT = 0, DPAR_LR_COSINE, DPAR_LR_STEP } dpar_lr_kind;
typedef struct dpar_lr_schedule_desc {
    dpar_lr_kind kind;
    float peak_lr;        /* > 0 */
    float init_lr;        /* >= 0, the rate at step 0 of the warm-up */
    int64_t warmup_steps; /* >= 0; 0: no warm-up */
    int64_t decay_steps;  /* COSINE: > warmup_steps */
    float end_lr;         /* COSINE: >= 0 */
    int64_t step_every;   /* STEP: > 0 */
    float gamma;          /* STEP: in (0, 1] */
} dpar_lr_schedule_desc;
/* *lr = the rate at `step` (>= 0), computed in double and rounded once.
   Errors: DPAR_ERR_INVALID_ARGUMENT naming the field (or step < 0, NULL). */
DPAR_API dpar_status dpar_lr_at(const dpar_lr_schedule_desc *d, int64_t step, float *lr);

/* Dynamic loss scaling for f16 training (torch.cuda.amp.GradScaler, jmp's
   DynamicLossScale): the loss is multiplied by `scale` before the backward
   pass; dpar_loss_scaler_unscale divides the gradients by it and says whether
   they are finite. A step with an Inf/NaN gradient must be skipped (the
   optimizer is not called, so an overflow never reaches the f32 master
   weights); the scale is then multiplied by backoff_factor (not below
   min_scale). After growth_interval finite steps in a row it is multiplied by
   growth_factor. The state is host memory; keep one per device inside fn. */
typedef struct dpar_loss_scale_desc {
    float init_scale;     /* > 0; 0: 65536 */
    int growth_interval;  /* > 0; 0: 2000 */
    float growth_factor;  /* > 1; 0: 2 */
    float backoff_factor; /* in (0, 1); 0: 0.5 */
    float min_scale;      /* > 0; 0: 1 */
} dpar_loss_scale_desc;
typedef struct dpar_loss_scaler {
    float scale;           /* multiply the loss by this */
    int good_steps;        /* finite steps since the last change of scale */
    int64_t skipped_steps; /* steps skipped so far */
    dpar_loss_scale_desc desc;
} dpar_loss_scaler;
/* Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, a field out of range, named). */
DPAR_API dpar_status dpar_loss_scaler_init(dpar_loss_scaler *ls, const dpar_loss_scale_desc *d);
/* Multiplies the n f32 gradient buffers (one device) by 1/scale, sets *finite
   (every element of every buffer finite; with `axes`, over every device of
   those axes, so replicas agree: ctx is then needed), and updates the scale
   as described above. Errors: DPAR_ERR_INVALID_ARGUMENT, DPAR_ERR_DTYPE, and
   the collectives' errors (the scaler is then unchanged). */
DPAR_API dpar_status dpar_loss_scaler_unscale(dpar_ctx *ctx, dpar_loss_scaler *ls, dpar_buffer *const *grads, int n,
                                              const char *axes, bool *finite);

/* Cross-entropy with integer labels (torch.nn.functional.cross_entropy with
   ignore_index and label_smoothing; optax.smooth_labels):
   logits [M,C] f32, labels [M] i32, loss 1 f32 element (logits, dlogits and loss f64 on the cpu backend).
   With q_i = (1 - a) onehot(label_i) + a / C (a = label_smoothing):
     loss = sum over counted rows of (logsumexp(z_i) - q_i . z_i) / (counted rows)
     dlogits (may be NULL) [M,C] = (softmax(z_i) - q_i) / (counted rows)
   A row whose label is ignore_label (when use_ignore) is not counted and gets a
   zero gradient row; no counted row: loss 0. Max subtracted (stable).
   Errors: as dpar_softmax_xent; DPAR_ERR_INVALID_ARGUMENT for smoothing outside
   [0, 1) or a label outside 0..C-1 that is not the ignore label, naming the
   first bad row and its value (CPU: at once; GPUs: the flag set by the op is
   reported by the next sync or read of that device). */
typedef struct dpar_xent_desc {
    bool use_ignore;       /* skip rows labelled ignore_label (padding) */
    int32_t ignore_label;  /* PyTorch's ignore_index, -100 there */
    float label_smoothing; /* in [0, 1) */
} dpar_xent_desc;
DPAR_API dpar_status dpar_cross_entropy(dpar_buffer *loss, dpar_buffer *dlogits, const dpar_buffer *logits,
                                        const dpar_buffer *labels, const dpar_xent_desc *d);

/* Embedding lookup: out[i, :] = table[idx[i], :]. table [V,D] f32 (or f64 on
   the cpu backend, out then f64); idx i32, any shape, K elements; out f32 with K*D elements (shape idx.shape + [D] is
   natural). Errors: DPAR_ERR_SHAPE, DPAR_ERR_DTYPE, DPAR_ERR_INVALID_ARGUMENT
   for an index outside 0..V-1, naming the first bad position and its value
   (GPUs: reported at the next sync, as dpar_cross_entropy). */
DPAR_API dpar_status dpar_embedding(dpar_buffer *out, const dpar_buffer *table, const dpar_buffer *idx);
/* Its gradient: dtable = beta dtable, then dtable[idx[i], :] += dout[i, :]
   for i = 0, 1, ..., K-1 in that order (repeated indices sum; deterministic,
   the same on every backend). beta = 0 ignores dtable's old contents.
   Shapes, dtypes and errors as dpar_embedding. */
DPAR_API dpar_status dpar_embedding_backward(dpar_buffer *dtable, const dpar_buffer *dout, const dpar_buffer *idx,
                                             float beta);

/* Dropout (inverted, as flax.linen.Dropout): y = keep ? x / (1 - rate) : 0,
   computed as x * (float)(1 / (1 - rate)). keep is decided by Philox-4x32-10
   (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"; the
   generator of JAX and cuRAND) with key (seed low, seed high) and counter
   (element / 4, stream, step low, step high); element e uses output word
   e % 4, r, and keeps when (r >> 8) >= round(rate 2^24). So a mask is a pure
   function of (seed, step, stream, element), bit-identical on every backend.
   stream: pass dpar_ctx_device(ctx) for a different mask per device, or an
   axis index for one mask across the other axes. rate 0: y = x; rate 1: y = 0.
   The gradient is the same call on dy (same seed, step, stream). x, y f32 (or
   both f64, cpu backend: the f32 op's mask, scale 1 / (1 - rate) in double) of
   one count; in place allowed. Errors: DPAR_ERR_INVALID_ARGUMENT (rate
   outside [0, 1]), DPAR_ERR_SHAPE, DPAR_ERR_DTYPE. */
DPAR_API dpar_status dpar_dropout(dpar_buffer *y, const dpar_buffer *x, float rate, uint64_t seed, uint64_t step,
                                  uint32_t stream);
/* The 4 words of Philox-4x32-10 for counter ctr and key (exposed for tests and
   for host code that must draw the same numbers). Never fails. */
DPAR_API void dpar_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* ---------------------------------------------------------------------------
   Layers: layer norm, RMS norm, batched matmul, causal attention
   (all operands on one device, f32; "rows" are all leading dims flattened;
   the norms and attention also take f16 or bf16 storage, one dtype for all
   but the f32 stats: see 16-bit storage under "Ops on device buffers"; the
   norms also take f64 on the cpu backend, stats f64 too: see >>f64 api)
   ------------------------------------------------------------------------ */
/* Layer norm over the last axis (Ba, Kiros, Hinton 2016; torch.nn.LayerNorm, flax.linen.LayerNorm):
     mean_i = sum_j x_ij / N;  var_i = sum_j (x_ij - mean_i)^2 / N;  rstd_i = 1 / sqrt(var_i + eps)
     y_ij = (x_ij - mean_i) * rstd_i * w_j + b_j
   x, y: [..., N] (same shape; y may alias x); w, b: [N] or NULL (ones / zeros); eps > 0 (1e-5 usual).
   stats: NULL, or M*2 f32 (f64 with f64 x) ([..., 2] with x's leading dims), (mean_i, rstd_i) per row, saved for the
   backward. A constant row gives y = b exactly (no NaN). M or N may be 0 (N = 0: stats are zeros).
   Range: the CPU sums in double; Vulkan and CUDA in f32, rescaling a row whose sum of squares overflows
   (a spread above about 1e19), so every backend normalizes rows of finite f32 values alike.
   Errors: DPAR_ERR_SHAPE (text names both shapes), DPAR_ERR_DTYPE (mixed, i32, stats not f32 (f64 for f64 x)),
   DPAR_ERR_INVALID_ARGUMENT
   (NULL x/y, eps <= 0 or not finite, operands on different devices). */
DPAR_API dpar_status dpar_layer_norm(dpar_buffer *y, dpar_buffer *stats, const dpar_buffer *x, const dpar_buffer *w,
                                     const dpar_buffer *b, float eps);
/* Gradients of dpar_layer_norm, with xhat = (x - mean) rstd and g = dy * w:
     dx_ij = rstd_i (g_ij - mean_j(g_ij) - xhat_ij mean_j(g_ij xhat_ij))
     dw_j = sum_i dy_ij xhat_ij;  db_j = sum_i dy_ij   (overwritten, summed in a fixed row order)
   dx: [..., N] like x (may alias dy), dw, db: [N]; any may be NULL (not computed), not all three; w: as given to the forward
   (NULL: ones); stats: the forward's. Errors: as dpar_layer_norm. */
DPAR_API dpar_status dpar_layer_norm_backward(dpar_buffer *dx, dpar_buffer *dw, dpar_buffer *db, const dpar_buffer *dy,
                                              const dpar_buffer *x, const dpar_buffer *w, const dpar_buffer *stats);
/* RMS norm over the last axis (Zhang & Sennrich 2019; torch.nn.RMSNorm):
     rstd_i = 1 / sqrt(sum_j x_ij^2 / N + eps);  y_ij = x_ij rstd_i w_j + b_j
   Operands, stats and errors as dpar_layer_norm (stats holds (0, rstd_i) per row). */
DPAR_API dpar_status dpar_rms_norm(dpar_buffer *y, dpar_buffer *stats, const dpar_buffer *x, const dpar_buffer *w,
                                   const dpar_buffer *b, float eps);
/* Gradients of dpar_rms_norm (xhat = x rstd, g = dy w): dx_ij = rstd_i (g_ij - xhat_ij mean_j(g_ij xhat_ij)),
   dw_j = sum_i dy_ij xhat_ij, db_j = sum_i dy_ij. Operands and errors as dpar_layer_norm_backward. */
DPAR_API dpar_status dpar_rms_norm_backward(dpar_buffer *dx, dpar_buffer *dw, dpar_buffer *db, const dpar_buffer *dy,
                                            const dpar_buffer *x, const dpar_buffer *w, const dpar_buffer *stats);
/* Batched matmul: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for every batch index b, as dpar_matmul
   on each (numpy.matmul / jnp.matmul batching, no broadcasting except a 2-d B shared by every batch).
   A: [..., M, K] ([..., K, M] with trans_a), B: [..., K, N] ([..., N, K] with trans_b) or 2-d,
   C: [..., M, N]; the leading dims of A and C (and B unless 2-d) hold the same batch count.
   beta = 0 ignores C's old contents. f32, or all f64 (cpu backend: dpar_matmul's f64 GEMM).
   Errors: DPAR_ERR_SHAPE, DPAR_ERR_DTYPE,
   DPAR_ERR_INVALID_ARGUMENT (C aliases A or B). */
DPAR_API dpar_status dpar_matmul_batched(dpar_buffer *C, const dpar_buffer *A, const dpar_buffer *B, bool trans_a,
                                         bool trans_b, float alpha, float beta);
/* Scaled dot-product attention (Vaswani et al. 2017; jax.nn.dot_product_attention,
   torch.nn.functional.scaled_dot_product_attention), per batch-head row of the leading dims:
     s_ij = scale q_i . k_j  (j <= i when causal);  lse_i = log sum_j exp(s_ij)
     out_i = sum_j exp(s_ij - lse_i) v_j
   q: [..., Tq, D], k: [..., Tk, D], v: [..., Tk, Dv], out: [..., Tq, Dv] (heads in the leading dims:
   [batch, heads, T, D]); causal needs Tq == Tk. scale = 0 means 1 / sqrt(D). stats: NULL or
   [..., Tq, 2] f32: lse_i in [.., 0] (the backward needs it; [.., 1] is the backward's scratch).
   q, k, v, out f32, f16 or bf16 (one dtype), or all f64 with f64 stats (cpu backend, in double).
   Fused on every backend: no [..., Tq, Tk] tensor is stored. Extra memory: 8 bytes per query row (stats);
   the CPU backend also works through its GEMM one batch-head and one block of query rows at a time, with
   two blocks of scores as scratch (at most 2^15 floats each, or one row of Tk if longer); Vulkan and CUDA
   keep one row of D and Dv (<= 512 each) in shared memory. A row with no key (Tk = 0) gives zeros.
   Errors: DPAR_ERR_SHAPE (also: D or Dv above 512 on Vulkan / CUDA), DPAR_ERR_DTYPE,
   DPAR_ERR_INVALID_ARGUMENT (NULL, aliasing, scale < 0). */
DPAR_API dpar_status dpar_attention(dpar_buffer *out, dpar_buffer *stats, const dpar_buffer *q, const dpar_buffer *k,
                                    const dpar_buffer *v, float scale, bool causal);
/* Gradients of dpar_attention (recomputing P_ij = exp(s_ij - lse_i) from q, k and the saved lse):
     dp_ij = dout_i . v_j;  D_i = sum_j P_ij dp_ij;  ds_ij = P_ij (dp_ij - D_i)
     dq_i = scale sum_j ds_ij k_j;  dk_j = scale sum_i ds_ij q_i;  dv_j = sum_i P_ij dout_i
   dq, dk, dv shaped like q, k, v (any may be NULL: not computed, but not all three); stats: the
   forward's (its [.., 1] column is the backward's scratch: D_i); dout like out; scale and causal as
   given to the forward. Two passes (one over query rows for dq and D, one over key rows for dk, dv; on
   the CPU backend the second finds D and dq itself, so a call runs one pass: the second, or the first
   for dq alone), no Tq x Tk matrix, deterministic (no atomics). Errors: as dpar_attention. */
DPAR_API dpar_status dpar_attention_backward(dpar_buffer *dq, dpar_buffer *dk, dpar_buffer *dv, dpar_buffer *stats,
                                             const dpar_buffer *dout, const dpar_buffer *q, const dpar_buffer *k,
                                             const dpar_buffer *v, float scale, bool causal);

/* ---------------------------------------------------------------------------
   Sharding, resharding
   (model parallelism: JAX NamedSharding / reshard, shard_map in/out specs;
   ZeRO-1 and checkpoints are in util/dpar_train.h)
   ------------------------------------------------------------------------ */
DPAR_API dpar_dtype dpar_array_dtype(const dpar_array *a); /* DPAR_DTYPE_COUNT for NULL */
DPAR_API dpar_mesh *dpar_array_mesh(const dpar_array *a);
/* Dimension i of every shard (shape[i] / size of the axes splitting dim i);
   -1 when i is out of range. */
DPAR_API int64_t dpar_array_shard_dim(const dpar_array *a, int i);
/* Spec of dimension i as text into buf (capacity cap): "" when the dim is
   whole (replicated), else the axes that split it, "data" or "data,model".
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, i out of range, cap too small). */
DPAR_API dpar_status dpar_array_spec(const dpar_array *a, int i, char *buf, size_t cap);

/* Reshard (JAX jax.device_put(x, NamedSharding(mesh, P(...)))): copies the
   global contents of src into dst, an array of the same mesh, dtype and global
   shape with possibly another spec. Afterwards dpar_array_get(dst) equals
   dpar_array_get(src) bit for bit. The path is chosen from the two specs:
     same spec                                  -> dpar_copy on every device;
     dim i split over axes A -> dim j split over A (i != j, the rest equal)
                                                -> all_to_all over A inside a
                                                   shard_map (split j, concat i);
     dim i split over A -> dim i whole (rest equal) -> all_gather(tiled) over A;
     every src shard contains the same device's dst shard (on every dim,
     src's axes are a prefix of dst's: whole -> "data", "data" -> "data,model")
                                                -> each device keeps its block of
                                                   its own copy (staged through
                                                   dpar_buffer_read/write);
     anything else                              -> gathered to the host and put
                                                   again (one global host copy).
   Example: an 8x4 f32 matrix with spec ("data", NULL) on a 4-device axis
   "data" (2x4 rows per device) resharded to (NULL, "data") gives device d
   the 8x1 column d. Must be called outside pmap/shard_map. src == dst is a no-op.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, different meshes, inside fn),
   DPAR_ERR_DTYPE, DPAR_ERR_SHAPE (global shapes differ; the text names both),
   DPAR_ERR_OUT_OF_MEMORY, and the collectives' errors. */
DPAR_API dpar_status dpar_array_reshard(dpar_array *dst, const dpar_array *src);

/* shard_map with in_specs / out_specs per argument (JAX shard_map(f, mesh,
   in_specs=(P('batch', None, None), ...), out_specs=...)). A spec gives, per
   dimension, NULL (whole) or the axes splitting it ("batch", "data,model").
   Inside fn, dpar_ctx_arg(ctx, i) is input i's shard under in_specs[i] for
   i < num_inputs, and dpar_ctx_arg(ctx, num_inputs + j) output j's shard under
   out_specs[j].
   - An input whose spec equals its array's own spec is passed as is (no copy);
     otherwise fn sees a resharded temporary copy (writes to it are dropped).
   - An output whose spec equals its array's own spec is written in place;
     otherwise fn writes a zeroed temporary which is resharded into the output
     array after fn returned on every device. A dim left whole in out_specs
     must hold the same values on every device of the axes it is replicated on
     (as in JAX); each device's own copy is used.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, counts out of range: num_inputs +
   num_outputs <= DPAR_MAX_ARGS, array of another mesh, an output listed twice),
   DPAR_ERR_UNKNOWN_AXIS / DPAR_ERR_SHAPE for a bad spec (text names the
   argument), and the errors of dpar_shard_map and dpar_array_reshard. */
typedef struct dpar_shard_map_specs_desc {
    dpar_fn fn;
    void *user;
    int num_inputs, num_outputs; /* 0: inferred, the number of leading non-NULL inputs / outputs */
    dpar_array *inputs[DPAR_MAX_ARGS];
    const char *in_specs[DPAR_MAX_ARGS][DPAR_MAX_DIMS];
    dpar_array *outputs[DPAR_MAX_ARGS];
    const char *out_specs[DPAR_MAX_ARGS][DPAR_MAX_DIMS];
} dpar_shard_map_specs_desc;
DPAR_API dpar_status dpar_shard_map_specs(dpar_mesh *m, const dpar_shard_map_specs_desc *desc);

/* ---------------------------------------------------------------------------
   Tracing, stats (the data-parallel helper is in util/dpar_train.h)
   ------------------------------------------------------------------------ */
/* Tracing: a Chrome / Perfetto trace (JSON "traceEvents", open it in
   ui.perfetto.dev or chrome://tracing). One process per runtime, one track
   per device for its worker thread (ops, blocking collectives, waits for
   async ones, the data-parallel helper's staging copies), one track per
   device for its communication thread (async collectives), and a "host"
   track (pmap / shard_map dispatches). Collective events carry their byte
   counts. Times are host times: on GPU backends an op's event is the time to
   enqueue it. Set DPAR_TRACE=file.json to trace a whole program (written at
   every dpar_runtime_destroy and at exit; with MPI, process P writes
   file.rankP.json), or call these. While tracing is
   off, each op and collective pays one predictable branch. */
/* Starts recording; the trace goes to `path` (copied). Restarting drops the
   events recorded so far. Errors: DPAR_ERR_INVALID_ARGUMENT (NULL/empty),
   DPAR_ERR_IO (the file cannot be opened for writing; nothing starts). */
DPAR_API dpar_status dpar_trace_begin(const char *path);
/* Writes everything recorded so far (valid JSON) and keeps recording.
   Errors: DPAR_ERR_STATE (not tracing), DPAR_ERR_IO naming the path. */
DPAR_API dpar_status dpar_trace_flush(void);
/* Writes the trace and stops recording. Errors: as dpar_trace_flush. */
DPAR_API dpar_status dpar_trace_end(void);
/* Events of helpers built on the API (util/dpar_train.h traces its staging
   copies and waits with them). dpar_trace_active: whether a trace is being
   recorded (one atomic load). dpar_trace_clock_us: the trace clock
   (monotonic, microseconds). dpar_trace_event: one complete event from t0_us
   to t1_us on runtime rt's track of `device` (its worker), or the host track
   (device -1); name and cat are kept, not copied (pass string literals);
   bytes < 0: none. Nothing is recorded while not tracing. */
DPAR_API bool dpar_trace_active(void);
DPAR_API double dpar_trace_clock_us(void);
DPAR_API void dpar_trace_event(const dpar_runtime *rt, int device, const char *name, const char *cat, double t0_us,
                               double t1_us, int64_t bytes);

/* Per-device statistics over a window: from the runtime's creation or the
   last dpar_runtime_stats_reset (memory_in_use and buffers are always now).
   The times are host seconds on the monotonic clock the trace uses
   (dpar_trace_clock_us), taken around each call on the thread that runs it
   (a call that began before the window counts from the window's start):
   - compute_s: in ops. On the CPU backend an op runs inside the call, so this
     is the time the device computed; on Vulkan and CUDA an op only records or
     launches work, so it is the host's cost of driving the device, and the
     device's own busy time shows in gpu_util_pct (NVIDIA) instead.
   - collective_s: in collectives, waiting for the other members included (a
     straggler shows as the one device that waits least), asynchronous ones
     too (they overlap compute, so the times may add up to more than window_s).
   - transfer_s: copying between host and device (dpar_buffer_write/read and
     what is built on them: array puts and gets, graph feeds).
   - idle: window_s minus the three, when positive (the host's own work, data
     loading, a device waiting for its dispatch).
   gpu_util_pct, temperature_c and power_w are read from NVML (libnvidia-ml,
   opened at run time) when the stats are read, on the CUDA backend; -1
   where there is no such reading (other backends, no NVML, a virtual device
   reports its GPU's).
   host_waits (Vulkan; 0 on the other backends): the times in the window the
   host blocked on the device's queued work (a vkWaitForFences, for one batch
   or several at once). A replayed graph fed by dpar_graph_put_feeds with no
   loss read takes about one per three steps while the device is behind. */
typedef struct dpar_device_stats {
    uint64_t memory_in_use;        /* bytes of the device's live buffers */
    uint64_t memory_peak;          /* high-water mark of memory_in_use in the window */
    uint64_t buffers;              /* live buffers */
    uint64_t ops;                  /* ops run */
    uint64_t collectives;          /* collectives this device took part in */
    uint64_t collective_bytes_in;  /* sum of their input buffers' bytes */
    uint64_t collective_bytes_out; /* sum of their output buffers' bytes */
    double window_s;               /* wall time of the window, seconds */
    double compute_s;              /* in ops, seconds (see above) */
    double collective_s;           /* in collectives, seconds */
    double transfer_s;             /* in host <-> device copies, seconds */
    int gpu_util_pct;              /* NVML: percent of the window's last sample period the GPU ran kernels; -1 */
    int temperature_c;             /* NVML: GPU core temperature, degrees C; -1 */
    double power_w;                /* NVML: board power draw, watts; -1 */
    uint64_t host_waits;           /* Vulkan: fence waits, the times the host blocked on the device; 0 elsewhere */
} dpar_device_stats;
/* Stats of `device` (a device of this process).
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, device out of range). */
DPAR_API dpar_status dpar_runtime_device_stats(const dpar_runtime *rt, int device, dpar_device_stats *out);
/* Starts a new window: every device's memory_peak becomes its memory_in_use,
   and the op and collective counters and the times are zeroed. */
DPAR_API void dpar_runtime_stats_reset(dpar_runtime *rt);

/* ---------------------------------------------------------------------------
   Graphs and gradients (JAX jit + grad inside shard_map; ggml's cgraph)
   Build the per-device (SPMD) program once from values, append its backward
   pass and an optimizer step, compile, then run it every step:

       dpar_graph *g;  dpar_graph_create(mesh, &g);
       dpar_value x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 2, {B, 64}, {"data"} });
       dpar_value y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, {B}, {"data"} });
       dpar_value w = dpar_g_param(g, "w", w_array), b = dpar_g_param(g, "b", b_array);
       dpar_value loss = dpar_g_softmax_xent(g, dpar_g_bias_add(g, dpar_g_matmul(g, x, w, 0, 0), b), y);
       dpar_value grads[2], params[2] = { w, b };
       dpar_graph_value_and_grad(g, loss, params, 2, grads);
       dpar_graph_sgd(g, &sgd, params, grads, 2);
       dpar_graph_compile(g, NULL);
       for (...) dpar_graph_run(g, (dpar_graph_feed[]){ { x, xb }, { y, yb } }, 2, &loss_host);

   - Values are per-device and functional (every op returns a new value).
     Shapes given to and reported by the graph are per-device shapes, except
     feeds, which take a global shape and a PartitionSpec (the per-device
     shard shape is derived), and params, which are dpar_arrays of the mesh.
   - Builder calls (dpar_g_*) return a value, or the invalid value {0} on
     error: the first error is kept (dpar_graph_status), its text names the
     node, the shapes and the rule broken, and every later call that takes the
     graph returns that status. So a model is built without a check per line.
   - Every value knows the mesh axes it varies over (JAX's varying manual
     axes): feeds and params over the axes of their spec, an op's result over
     the union of its inputs', psum/pmean/all_gather/pbroadcast over A make a
     value invariant over A, psum_scatter/ppermute/all_to_all/pcast over A
     make it vary over A.
   - Gradients follow JAX's shard_map transpose rules: psum -> identity,
     pcast (pvary, Megatron's "f") -> psum, all_gather <-> own block /
     psum_scatter, ppermute -> the inverse permutation, all_to_all -> with
     split and concat swapped, pbroadcast -> the cotangent on the root (zero
     elsewhere), pmean = psum / n. Where an op combines a value with one that
     varies over more axes (a replicated weight times a batch shard), the
     value's cotangent is psum'd over those extra axes, so a parameter's
     gradient is reduced over every mesh axis it is replicated on and replicas
     stay bitwise identical by construction.
   - Pin the scale down (DESIGN.md sec. 7, jax-ml/jax#3970): a loss that still
     varies over mesh axes (a local mean over a batch shard) is averaged over
     them (pmean) before it is differentiated and reported; a loss already
     reduced in the graph is differentiated as written.
   - pmax / pmin have no gradient (refused, not guessed): value_and_grad
     through them fails with DPAR_ERR_INVALID_ARGUMENT naming the node (use
     psum/pmean, or keep them off the differentiated path).
   - A gradient requested for a value the loss does not depend on is zero.
   - Destroying its mesh or runtime frees the graph too (see THREADS AND
     LIFETIMES): running, reading or destroying it afterwards gives
     DPAR_ERR_STATE (a stale handle) and touches nothing.
   ------------------------------------------------------------------------ */
typedef struct dpar_graph dpar_graph;
typedef struct dpar_value {
    int32_t id; /* 0: invalid (a failed builder call) */
} dpar_value;
/* A graph of per-device ops over the devices of `mesh`.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL), DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_graph_create(dpar_mesh *mesh, dpar_graph **out);
/* Frees the graph and everything it allocated (feed arrays, gradient arrays,
   buffers, optimizer state); not the params. NULL is a no-op (DPAR_OK).
   Errors (nothing is freed): DPAR_ERR_STATE inside a pmap/shard_map function,
   while a call on its runtime runs on another thread, or for a stale graph
   (destroyed, or freed with its mesh or runtime). */
DPAR_API dpar_status dpar_graph_destroy(dpar_graph *g);
/* The first error of the graph's builder calls (DPAR_OK if none); sets the
   last error text to that error's text again. */
DPAR_API dpar_status dpar_graph_status(const dpar_graph *g);
/* Names a value (copied, < DPAR_NAME_LEN chars) for print, DOT and errors; returns v. */
DPAR_API dpar_value dpar_g_name(dpar_graph *g, dpar_value v, const char *name);
/* Per-device shape of v into ndim / shape[DPAR_MAX_DIMS] and its dtype (each may be NULL).
   Errors: DPAR_ERR_INVALID_ARGUMENT (not a value of g). */
DPAR_API dpar_status dpar_graph_value_shape(const dpar_graph *g, dpar_value v, dpar_dtype *dtype, int *ndim,
                                            int64_t *shape);

/* --- leaves --- */
/* A per-step input: global shape and spec as dpar_array_create takes them
   (the graph keeps a dpar_array of it; fed by dpar_graph_run). The value is
   this device's shard. Errors (recorded): those of dpar_array_create. */
DPAR_API dpar_value dpar_g_feed(dpar_graph *g, const char *name, const dpar_array_desc *desc);
/* A parameter: the array `a` of the graph's mesh, read (and updated by the
   optimizer nodes) in place; the value is this device's shard.
   Errors (recorded): DPAR_ERR_INVALID_ARGUMENT (NULL, array of another mesh). */
DPAR_API dpar_value dpar_g_param(dpar_graph *g, const char *name, dpar_array *a);
/* A constant filled with `value` (any dtype, as dpar_fill), invariant over the mesh. */
DPAR_API dpar_value dpar_g_const(dpar_graph *g, dpar_dtype dtype, int ndim, const int64_t *shape, float value);

/* --- ops (f32 unless said; the eager op of the same name does the work; the ops of the >>f64 api
   table also take f64 in a cpu graph, every input f64) --- */
/* op(a) [M,K] @ op(b) [K,N] -> [M,N], op(x) = x or x^T (dpar_matmul, alpha 1, beta 0). */
DPAR_API dpar_value dpar_g_matmul(dpar_graph *g, dpar_value a, dpar_value b, bool trans_a, bool trans_b);
/* x [..., N] + b [N] broadcast over the leading dims. */
DPAR_API dpar_value dpar_g_bias_add(dpar_graph *g, dpar_value x, dpar_value b);
/* max(x, 0). */
DPAR_API dpar_value dpar_g_relu(dpar_graph *g, dpar_value x);
/* Scalar (0-d) mean softmax cross-entropy of logits [M,C] f32 (f64: see >>f64 api) with labels [M] i32
   (dpar_softmax_xent). */
DPAR_API dpar_value dpar_g_softmax_xent(dpar_graph *g, dpar_value logits, dpar_value labels);
/* Scalar mean((pred - target)^2), same shapes (dpar_mse). */
DPAR_API dpar_value dpar_g_mse(dpar_graph *g, dpar_value pred, dpar_value target);
/* a + b (same shape). */
DPAR_API dpar_value dpar_g_add(dpar_graph *g, dpar_value a, dpar_value b);
/* alpha * x. */
DPAR_API dpar_value dpar_g_scale(dpar_graph *g, dpar_value x, float alpha);
/* s * x with s a 1-element value (a device scalar). */
DPAR_API dpar_value dpar_g_mul_scalar(dpar_graph *g, dpar_value s, dpar_value x);
/* Scalar sum(x) / sum(x * x) / sum(a * b) (a, b same count). */
DPAR_API dpar_value dpar_g_sum(dpar_graph *g, dpar_value x);
DPAR_API dpar_value dpar_g_sum_squares(dpar_graph *g, dpar_value x);
DPAR_API dpar_value dpar_g_dot(dpar_graph *g, dpar_value a, dpar_value b);
/* x converted to dtype (dpar_cast); the gradient is cast back. */
DPAR_API dpar_value dpar_g_cast(dpar_graph *g, dpar_value x, dpar_dtype dtype);
/* x with another shape of the same count (a copy). */
DPAR_API dpar_value dpar_g_reshape(dpar_graph *g, dpar_value x, int ndim, const int64_t *shape);
/* --- layers (the eager ops of the same name; >>graph norm-attn) --- */
/* Layer / RMS norm over the last axis: x [..., N], w [N] (required), b [N] or the invalid value (no
   bias), eps > 0. Two nodes: the per-row statistics (kept for the backward) and y. Gradients to x,
   w and b. */
DPAR_API dpar_value dpar_g_layer_norm(dpar_graph *g, dpar_value x, dpar_value w, dpar_value b, float eps);
DPAR_API dpar_value dpar_g_rms_norm(dpar_graph *g, dpar_value x, dpar_value w, dpar_value b, float eps);
/* Batched matmul (dpar_matmul_batched): a [..., M, K] (or [..., K, M] with trans_a), b [..., K, N] or a 2-d
   b shared by every batch (then trans_a is refused: its gradient would need a transpose). Gradients to
   both; a shared b's gradient is summed over the batch. */
DPAR_API dpar_value dpar_g_matmul_batched(dpar_graph *g, dpar_value a, dpar_value b, bool trans_a, bool trans_b);
/* Attention (dpar_attention): q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] -> [..., Tq, Dv]; scale 0 means
   1/sqrt(D); causal needs Tq == Tk. Gradients to q, k and v: one node each, computed together by the first
   of them in one dpar_attention_backward call (the others run nothing). */
DPAR_API dpar_value dpar_g_attention(dpar_graph *g, dpar_value q, dpar_value k, dpar_value v, float scale, bool causal);
/* conv2d of x [N,H,W,C] with w [KH,KW,C,O] plus b [O] (b = {0}: no bias) -> [N,OH,OW,O]
   (dpar_conv2d; d may be NULL, copied). Gradients to x, w and b. */
DPAR_API dpar_value dpar_g_conv2d(dpar_graph *g, dpar_value x, dpar_value w, dpar_value b, const dpar_conv2d_desc *d);
/* avg / max pool of x [N,H,W,C] -> [N,OH,OW,C] (dpar_avg_pool2d, dpar_max_pool2d; d may be
   NULL, copied). max: the gradient goes to the first maximum of each window. */
DPAR_API dpar_value dpar_g_avg_pool2d(dpar_graph *g, dpar_value x, const dpar_pool2d_desc *d);
DPAR_API dpar_value dpar_g_max_pool2d(dpar_graph *g, dpar_value x, const dpar_pool2d_desc *d);

/* --- the elementwise family (see >>elementwise api; gradients summed back to broadcast operands) --- */
/* op(x) (dpar_unary; s: the scalar of the *_SCALAR forms). */
DPAR_API dpar_value dpar_g_unary(dpar_graph *g, dpar_value x, dpar_unary_op op, float s);
/* a op b with NumPy broadcasting (dpar_binary). */
DPAR_API dpar_value dpar_g_binary(dpar_graph *g, dpar_value a, dpar_value b, dpar_binary_op op);
/* cond ? a : b, cond (a's dtype or i32, no gradient) broadcast to broadcast(a, b) (dpar_where). */
DPAR_API dpar_value dpar_g_where(dpar_graph *g, dpar_value cond, dpar_value a, dpar_value b);
/* x reduced over axes (NULL: all; keepdims keeps them as 1) (dpar_reduce). ARGMAX gives i32 and has
   no gradient; MAX's gradient goes to the first maximum. */
DPAR_API dpar_value dpar_g_reduce(dpar_graph *g, dpar_value x, dpar_reduce_kind kind, const int *axes, int naxes,
                                  bool keepdims);
/* softmax / log_softmax along the last axis (dpar_softmax). */
DPAR_API dpar_value dpar_g_softmax(dpar_graph *g, dpar_value x, bool log);
/* Shape ops (f32 or i32; f64 in a cpu graph): dpar_transpose (perm NULL: reversed), dpar_broadcast_to,
   dpar_slice (`sizes` elements per axis from start in steps, step NULL: 1), dpar_pad (lo before, hi
   after each axis, NULL: zeros), dpar_concat (1..4 values). */
DPAR_API dpar_value dpar_g_transpose(dpar_graph *g, dpar_value x, const int *perm);
DPAR_API dpar_value dpar_g_broadcast_to(dpar_graph *g, dpar_value x, int ndim, const int64_t *shape);
DPAR_API dpar_value dpar_g_slice(dpar_graph *g, dpar_value x, const int64_t *start, const int64_t *step,
                                 const int64_t *sizes);
DPAR_API dpar_value dpar_g_pad(dpar_graph *g, dpar_value x, const int64_t *lo, const int64_t *hi, float value);
DPAR_API dpar_value dpar_g_concat(dpar_graph *g, const dpar_value *xs, int n, int axis);

/* --- collectives over mesh axes "a" or "a,b" (the eager collective of the same name) --- */
DPAR_API dpar_value dpar_g_psum(dpar_graph *g, dpar_value x, const char *axes);
DPAR_API dpar_value dpar_g_pmean(dpar_graph *g, dpar_value x, const char *axes);
DPAR_API dpar_value dpar_g_pmax(dpar_graph *g, dpar_value x, const char *axes); /* no gradient */
DPAR_API dpar_value dpar_g_pmin(dpar_graph *g, dpar_value x, const char *axes); /* no gradient */
DPAR_API dpar_value dpar_g_all_gather(dpar_graph *g, dpar_value x, const char *axes, int dim, bool tiled);
DPAR_API dpar_value dpar_g_psum_scatter(dpar_graph *g, dpar_value x, const char *axes, int dim, bool tiled);
/* pairs: num_pairs (source, destination) group positions, copied. */
DPAR_API dpar_value dpar_g_ppermute(dpar_graph *g, dpar_value x, const char *axes, const int *pairs, int num_pairs);
DPAR_API dpar_value dpar_g_all_to_all(dpar_graph *g, dpar_value x, const char *axes, int split_dim, int concat_dim);
DPAR_API dpar_value dpar_g_pbroadcast(dpar_graph *g, dpar_value x, const char *axes, int root);
/* Identity forward that marks x (invariant over axes) as varying over them
   (JAX pcast/pvary, Megatron's "f"); its gradient is psum'd over axes. */
DPAR_API dpar_value dpar_g_pcast(dpar_graph *g, dpar_value x, const char *axes);

/* --- gradients, optimizer --- */
/* Appends the backward pass of the scalar (1-element f32, or f64 in an f64 cpu graph) `loss` with respect
   to wrt[0..n-1] (params, feeds or any value); grads[i] gets a value of
   wrt[i]'s shape (zero when the loss does not depend on it). Once per graph.
   Gradients of params and feeds are read as global arrays (dpar_graph_get).
   Errors: DPAR_ERR_SHAPE (non-scalar loss, naming its shape), DPAR_ERR_DTYPE,
   DPAR_ERR_STATE (called twice, after compile), DPAR_ERR_INVALID_ARGUMENT
   (no gradient rule on the path: pmax/pmin), the recorded builder error. */
DPAR_API dpar_status dpar_graph_value_and_grad(dpar_graph *g, dpar_value loss, const dpar_value *wrt, int n,
                                               dpar_value *grads);
/* Appends one fused SGD step (as dpar_sgd_step; momentum buffers owned by the
   graph, zero at compile) of params[i] (param values) with grads[i]. The
   clipping norm is one global norm over every param: each gradient's squared norm is
   psum'd over the axes its param is split on (params may have different
   specs: Megatron's split weights next to replicated ones).
   params[i] and grads[i] f32, or both f64 in a cpu graph (then the momentum
   is f64 too and the step is the eager f64 one; not with dpar_graph_zero1).
   Errors: those of dpar_sgd_check, DPAR_ERR_INVALID_ARGUMENT (not a param,
   sizes differ), DPAR_ERR_DTYPE (a param and its gradient not both f32 or
   both f64, or f64 with ZeRO-1; the text names both dtypes), DPAR_ERR_STATE (after
   compile); at run time the clipping error of dpar_sgd_clip_scale (a NaN or
   Inf gradient). */
DPAR_API dpar_status dpar_graph_sgd(dpar_graph *g, const dpar_sgd_desc *d, const dpar_value *params,
                                    const dpar_value *grads, int n);
/* Appends one AdamW step (as dpar_adamw_step: moments m, v owned by the
   graph, zero at compile; the step count is 1 on the first run and advances
   with every run) of params[i] with grads[i]. Clipping as dpar_graph_sgd.
   Errors: those of dpar_adamw_check, then as dpar_graph_sgd. */
DPAR_API dpar_status dpar_graph_adamw(dpar_graph *g, const dpar_adamw_desc *d, const dpar_value *params,
                                      const dpar_value *grads, int n);
/* ZeRO-1 (Rajbhandari et al. 2020, stage 1; PyTorch's ZeroRedundancyOptimizer): shards the optimizer
   state of the next dpar_graph_sgd / dpar_graph_adamw over the data axes `axes` ("data" or "data,fsdp";
   call this after dpar_graph_value_and_grad, before the optimizer). Each gradient's all-reduce over
   the axes becomes a reduce-scatter (psum_scatter, tiled) of the gradient viewed flat and zero-padded
   to Lp = ceil(L / n) n elements (n: devices over the axes, L: the param's elements); each device
   updates its block of Lp / n elements of every param and of its state, and the blocks are
   all-gathered back into every replica of the params. Optimizer state per device falls by n
   (dpar_graph_stats.opt_bytes); the losses are those of the plain data-parallel graph up to the order
   of float sums, and the replicas stay bitwise identical. A gradient then holds this device's block
   (f32 [Lp / n]; dpar_graph_get reads the first device's). Params must be f32 (not f64) and replicated on the
   whole mesh; clipping by global norm psums over the axes.
   Errors: DPAR_ERR_UNKNOWN_AXIS, DPAR_ERR_STATE (twice, after the optimizer or compile); recorded by
   the optimizer call: DPAR_ERR_INVALID_ARGUMENT naming the param when it is split over mesh axes, when
   its gradient is not an all-reduce over exactly `axes` (the loss must vary over them: a batch split
   over them) or when another node reads the gradient. */
DPAR_API dpar_status dpar_graph_zero1(dpar_graph *g, const char *axes);
/* Pipeline stages (GPipe, Huang et al. 2019; PyTorch's pipe_split + ScheduleGPipe): the stages of the
   model run on the devices along mesh axis `axis` (one stage per device of the axis), the batch in
   `num_microbatches` micro-batches. Call right after dpar_graph_create; then build the model for ONE
   micro-batch: feeds still take the global batch (its rows per device must split into
   num_microbatches micro-batches; the feed value is one of them), and dpar_g_pipe_split(g, x) ends a
   stage: x goes to the next stage (ppermute over `axis`; in the backward pass its gradient comes
   back). Mark exactly (devices along axis) - 1 boundaries and differentiate a loss of the last stage.
   A run: M + S - 1 forward ticks (stage s runs micro-batch t - s at tick t, then every boundary passes
   its value on), as many backward ticks, then the loss (the mean over the micro-batches) and each
   gradient (summed over them, each micro-batch's seeded with 1 / M) are broadcast from their stage to
   every device, which all take the same optimizer step: the losses are those of the plain graph on the
   whole batch up to float rounding, and the params' replicas stay bitwise identical. Activations are
   kept per micro-batch (M buffer sets; dpar_graph_stats counts them); other kept values hold
   micro-batch 0's. Gradient reductions are not asynchronous in pipelines.
   Errors: DPAR_ERR_STATE (not right after create, twice, with ZeRO-1), DPAR_ERR_UNKNOWN_AXIS,
   DPAR_ERR_INVALID_ARGUMENT (several axes, num_microbatches < 1). Recorded by the builders:
   DPAR_ERR_SHAPE (a feed whose rows per device num_microbatches does not divide), DPAR_ERR_INVALID_ARGUMENT
   (a value of another stage read without a boundary; more boundaries than devices). At compile:
   DPAR_ERR_INVALID_ARGUMENT (too few boundaries, no loss or not the last stage's, a value varying over
   or a collective over `axis`, a param read by two stages). */
DPAR_API dpar_status dpar_graph_pipeline(dpar_graph *g, const char *axis, int num_microbatches);
/* Ends the current pipeline stage at x (any dtype and shape): returns x on the next stage.
   Errors (recorded): DPAR_ERR_STATE (no pipeline, after value_and_grad), DPAR_ERR_INVALID_ARGUMENT. */
DPAR_API dpar_value dpar_g_pipe_split(dpar_graph *g, dpar_value x);
/* ZeRO-1 state j (0: SGD momentum or AdamW m; 1: AdamW v) of the optimizer's param i after compile:
   f32 [Lp] split over the ZeRO-1 axes, owned by the graph (save it in a checkpoint with padded =
   true; restoring it and the params continues training bit for bit). NULL (last error set:
   DPAR_ERR_INVALID_ARGUMENT) when there is no such state. */
DPAR_API dpar_array *dpar_graph_zero1_state(const dpar_graph *g, int i, int j);
/* dpar_graph_adamw with the weight decay applied only to params[i] whose
   decay[i] is true (optax.adamw's mask; GPT-2 / nanoGPT decay the matrices,
   not biases or norm gains); decay has n entries, copied; NULL: every param.
   Clipping stays one global norm over all n params. Errors: as dpar_graph_adamw. */
DPAR_API dpar_status dpar_graph_adamw_masked(dpar_graph *g, const dpar_adamw_desc *d, const dpar_value *params,
                                             const dpar_value *grads, const bool *decay, int n);
/* The optimizer node's learning rate from the next run on (a schedule: dpar_lr_at each step).
   lr >= 0: 0 is a warm-up's first rate (the step moves no param; AdamW's moments and the step
   counter still advance, as optax's). A rate that differs from the one before makes a graph's
   recorded program (>>graph program) record again with the SGD step outside it, run op by op.
   Errors: DPAR_ERR_INVALID_ARGUMENT (no optimizer node, lr negative, NaN or infinite),
   DPAR_ERR_STATE (a step started with dpar_graph_run_start is in flight). */
DPAR_API dpar_status dpar_graph_set_lr(dpar_graph *g, float lr);
/* Keeps v readable after each run (dpar_graph_get); the loss and the
   gradients are kept already. Errors: DPAR_ERR_STATE after compile. */
DPAR_API dpar_status dpar_graph_keep(dpar_graph *g, dpar_value v);
/* Remat (gradient checkpointing, jax.checkpoint): the ops built between
   dpar_graph_remat_begin and dpar_graph_remat_end form a segment whose values
   the backward pass recomputes (from the segment's inputs, on first use)
   instead of keeping them from the forward pass: less memory (the planned
   and measured peak fall), one more forward of the segment per step, and
   gradients bit-identical to the unmarked graph on the CPU backend. Leaves
   (feeds, params, consts) are never recomputed. Segments do not nest; mark
   them before dpar_graph_value_and_grad (which fails with DPAR_ERR_STATE
   while one is open). Errors: DPAR_ERR_INVALID_ARGUMENT (g NULL),
   DPAR_ERR_STATE (begin while open, end while none is open, after
   value_and_grad or compile). */
DPAR_API dpar_status dpar_graph_remat_begin(dpar_graph *g);
DPAR_API dpar_status dpar_graph_remat_end(dpar_graph *g);
/* --- training state, for checkpoints (dpar_graph_save / dpar_graph_restore in util/dpar_train.h) --- */
/* The number of named global arrays that make up the graph's training state
   (compiles the graph first if needed, as dpar_graph_run does): every param
   once (its dpar_g_param name; the user's array, with its spec), then the
   optimizer's state of each param of the optimizer node: AdamW's first and
   second moments "<param>@adamw.m" and "<param>@adamw.v", or SGD's
   "<param>@sgd.momentum" (none when momentum is 0), f32 arrays of the param's
   global shape and spec, owned by the graph, zero at compile; with ZeRO-1
   (dpar_graph_zero1) the state is dpar_graph_zero1_state's f32 [Lp] arrays
   split over its axes, marked padded.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL), DPAR_ERR_STATE (the graph's mesh
   was destroyed), those of dpar_graph_compile. */
DPAR_API dpar_status dpar_graph_state_count(dpar_graph *g, int *count);
/* Entry i (0 <= i < the count) of the training state: its name (valid while
   the graph lives), its array (writing it changes what the next run uses)
   and whether it is zero-padded ZeRO-1 state (padded may be NULL; save such
   an entry with dpar_checkpoint_entry.padded = true).
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, i out of range, a param without a
   name or two params of one name: the text names the nodes), DPAR_ERR_STATE
   (not compiled; the mesh was destroyed). */
DPAR_API dpar_status dpar_graph_state(const dpar_graph *g, int i, const char **name, dpar_array **array, bool *padded);
/* The graph's step counter: the runs done (AdamW's bias correction uses
   step + 1 on the next run, dropout masks use step). -1 when g is NULL. */
DPAR_API int64_t dpar_graph_step(const dpar_graph *g);
/* Sets the step counter (restoring a checkpoint, or skipping a schedule ahead).
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, step < 0), DPAR_ERR_STATE (a step
   started with dpar_graph_run_start is in flight). */
DPAR_API dpar_status dpar_graph_set_step(dpar_graph *g, int64_t step);

/* --- compile, run, inspect --- */
typedef struct dpar_graph_stats {
    int nodes;              /* nodes of the schedule */
    int buffers;            /* device buffers per device after reuse */
    uint64_t planned_bytes; /* bytes per device of the node buffers after liveness reuse */
    uint64_t naive_bytes;   /* bytes per device with one buffer per node */
    uint64_t opt_bytes;     /* bytes per device of optimizer state (momentum, AdamW m and v) */
    /* Per device, params (the user's arrays) not counted: resident_bytes, the
       feeds (and a one-float scratch; ZeRO-1: each param's block and padded
       copy); live_bytes, the node buffers any plan needs: the largest sum
       of temporaries live at one point of the schedule, plus the values
       live through every step (kept values and gradients, read after the
       run; consts; a pipeline's boundaries). A pipeline: one micro-batch's
       buffer set (planned_bytes counts all M sets).
       The graph's planned live set is live_bytes + resident_bytes +
       opt_bytes; it allocates exactly planned_bytes + resident_bytes +
       opt_bytes. */
    uint64_t resident_bytes;
    uint64_t live_bytes;
    /* collectives per step that reduce gradients: one per bucket of small gradients (<
       DPAR_GRAPH_ASYNC_BYTES, same reduction and axes, up to 1 MiB; PyTorch DDP's buckets) plus one per
       other gradient; each reduction adds in rank order, so bucketing changes no bit */
    int grad_reductions;
} dpar_graph_stats;
/* Schedules (the order built), plans memory (a buffer reused once its last
   reader ran; params and feeds not counted) and allocates on every device.
   stats may be NULL. Errors: the recorded builder error, DPAR_ERR_STATE (twice),
   DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_graph_compile(dpar_graph *g, dpar_graph_stats *stats);
typedef struct dpar_graph_feed {
    dpar_value value;  /* a feed of the graph */
    const void *host;  /* row-major global data of the feed's dtype and shape, or NULL and: */
    dpar_array *array; /* an array of the graph's mesh with the feed's dtype and global shape */
} dpar_graph_feed;
/* One step (compiles first if needed): puts the feeds, runs every node on
   every device in one dispatch, and reads the (pinned) loss into *loss when
   loss is not NULL (that read waits for the devices; an f64 loss is rounded
   to float there). *loss is the loss averaged over the axes it varies on
   (the implicit pmean of dpar_graph_value_and_grad); dpar_graph_get of the
   value given to value_and_grad reads device 0's own loss, before that mean.
   For the mean in double, pmean the loss in the graph yourself (dpar_g_pmean
   over its data axes) and keep and read that value.
   Errors: DPAR_ERR_INVALID_ARGUMENT (a feed missing, given twice, not a feed,
   an array of another mesh; no loss while loss != NULL), DPAR_ERR_SHAPE /
   DPAR_ERR_DTYPE (feed array differs, naming both), the errors of the ops, each
   prefixed with the node that failed. */
DPAR_API dpar_status dpar_graph_run(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds, float *loss);
/* The graph's own array behind feed v (the global shape and spec given to
   dpar_g_feed): fill it in place (dpar_array_put_rows when each process loads
   only its rows) and pass it as that feed's array, which costs no copy. Owned
   by the graph. NULL (last error set: DPAR_ERR_INVALID_ARGUMENT) when v is not
   a feed of g. */
DPAR_API dpar_array *dpar_graph_feed_array(const dpar_graph *g, dpar_value v);
/* Stages the next step's feeds (JAX's asynchronous device_put): copies each
   host entry now, into one of six staged copies of the feeds' arrays, in
   turn (the first put allocates them: six times the feeds' bytes per
   device; on Vulkan, a put that must wait for a step waits for every queued
   step, so the next five puts do not wait: one sleep per six steps while
   the device is behind), and takes
   array entries by reference; the next dpar_graph_run / dpar_graph_run_start
   with num_feeds = 0 runs on them (each device copies them into the feeds as
   the step's first op). Allowed while a step started with
   dpar_graph_run_start is in flight, of this graph or another (the put does
   not touch what the running step reads), so step N+1's batch uploads while
   step N computes; the host data may be reused as soon as it returns.
   feeds: every feed of g once, as for dpar_graph_run (host: row-major global
   data of the feed's dtype and shape, of which a process reads only the
   parts its devices hold (dpar_array_local_rows); array: of the graph's mesh with the
   feed's dtype, global shape and spec, which must stay alive and unwritten
   until the run that takes it). feeds = NULL, num_feeds = 0: drops the staged
   feeds. Puts and runs of a graph come from one thread (or are serialized
   by the caller). Destroying the graph frees staged feeds never run.
   Errors: DPAR_ERR_INVALID_ARGUMENT (g NULL, num_feeds < 0, a feed missing,
   given twice, not a feed of g, with both or neither of host and array, an
   array of another mesh or sharded differently), DPAR_ERR_DTYPE /
   DPAR_ERR_SHAPE (an array's dtype or global shape differs, naming both),
   DPAR_ERR_STATE (feeds staged already and not yet run; the first put of a
   graph while a step is in flight; inside a pmap function; g destroyed),
   DPAR_ERR_OUT_OF_MEMORY. A run with num_feeds > 0 while feeds are staged
   fails with DPAR_ERR_INVALID_ARGUMENT; a run that fails before it dispatches
   leaves them staged. */
DPAR_API dpar_status dpar_graph_put_feeds(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds);
/* The loss (f32 scalar, the pinned value of dpar_graph_value_and_grad) of
   the graph's last run, read now: run with loss = NULL to leave it on the
   devices (no host read, no wait per step) and read it when needed. It
   waits for the devices. Errors: DPAR_ERR_INVALID_ARGUMENT (NULL; the graph
   has no loss), DPAR_ERR_STATE (not run yet; a step in flight: wait for it
   first; the mesh was destroyed). */
DPAR_API dpar_status dpar_graph_loss(dpar_graph *g, float *loss);
/* Logs each run's loss on the devices, so that many steps' losses come back
   with one wait (an epoch's mean, a NaN check a few steps late) while every
   run passes loss = NULL and the steps queue: from the next run on, each run
   (dpar_graph_run, dpar_graph_run_start) appends its loss to a ring of
   `capacity` f32 slots on this process's first device (a 4-byte device copy,
   no host read). capacity 0 stops logging and frees the ring; another
   capacity starts a new, empty ring (4 * capacity bytes of device memory; if
   it cannot be made, the old ring logs on). Errors:
   DPAR_ERR_INVALID_ARGUMENT (g NULL, capacity < 0, the graph has no loss),
   DPAR_ERR_DTYPE (an f64 loss), DPAR_ERR_STATE (a step in flight; g
   destroyed), DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_graph_log_losses(dpar_graph *g, int capacity);
/* The losses of the last n logged runs (dpar_graph_log_losses) into out[n]
   (f32, host memory), oldest first, as dpar_graph_run's *loss would have read
   them, read with one wait for the devices. Errors: DPAR_ERR_INVALID_ARGUMENT (NULL with n > 0, n < 0, n more
   than the ring holds or than the runs logged since it was made, no ring),
   DPAR_ERR_STATE (a step in flight; g destroyed). */
DPAR_API dpar_status dpar_graph_losses(dpar_graph *g, float *out, int n);
/* How the graph's steps are replayed on a backend that records programs
   (Vulkan: command buffers; CUDA: CUDA Graphs by stream capture): the first
   run records each device's runs of device ops (everything but collectives,
   optimizer steps other than a plain SGD step with nothing asynchronous to
   wait for (a bucket reduced blocking just before it: its copies back are
   recorded with it), dropout, the index-checked embedding and
   cross-entropy-with-ignore, blocks, ZeRO-1 and pipeline graphs) once, each
   run between two such host nodes into one command buffer or CUDA Graph, and
   every later run re-submits them (vkQueueSubmit / cuGraphLaunch), running
   only the host nodes op by op; results are bit-identical to the op-by-op
   replay (same kernels, same order). *segments: the recordings and *nodes: the
   nodes they hold, summed over this process's devices (either pointer may be
   NULL). Both are 0 before the first run, on the CPU backend, while a trace was
   recording during the first run, with DPAR_GRAPH_RECORD=0 in the
   environment at the first run, and where a device could not record (it then
   replays op by op). Errors: DPAR_ERR_INVALID_ARGUMENT (g NULL), DPAR_ERR_STATE
   (g destroyed). */
DPAR_API dpar_status dpar_graph_recorded(const dpar_graph *g, int *segments, int *nodes);
/* Copies a kept value to host after a run: gradients of params and feeds as
   their global array (row-major), other values as the shard of the first
   device of this process. dpar_graph_read_shard: the shard of `device`.
   Errors: DPAR_ERR_INVALID_ARGUMENT (not kept, not a value, device not local),
   DPAR_ERR_STATE (not run yet). */
DPAR_API dpar_status dpar_graph_get(dpar_graph *g, dpar_value v, void *host);
DPAR_API dpar_status dpar_graph_read_shard(dpar_graph *g, dpar_value v, int device, void *host);
/* Writes one line per node (id, op (the optimizer node: sgd, adamw or adamw_masked), name, inputs, dtype
   and per-device shape, the axes it varies over, the collective's axes, global shape and spec of
   feeds/params, in pipelines its stage and whether it is a boundary; compiled: in_place(j) where the node
   writes over input j's buffer, DPAR_GRAPH_ALIAS) to `path`, or stdout when path is NULL. dpar_graph_write_dot:
   the same graph as Graphviz DOT. Errors: DPAR_ERR_IO naming the path. */
DPAR_API dpar_status dpar_graph_print(const dpar_graph *g, const char *path);
DPAR_API dpar_status dpar_graph_write_dot(const dpar_graph *g, const char *path);
/* --- issue 13 ops in graphs (>>graph optim): cross-entropy with an ignore
   label, embedding, dropout --- */
/* Scalar cross-entropy of logits [M,C] f32 with labels [M] i32, an ignore
   label and label smoothing (dpar_cross_entropy; d NULL: plain). Errors
   (recorded): as dpar_g_softmax_xent, DPAR_ERR_INVALID_ARGUMENT (smoothing). */
DPAR_API dpar_value dpar_g_cross_entropy(dpar_graph *g, dpar_value logits, dpar_value labels, const dpar_xent_desc *d);
/* Rows of table [V,D] f32 (f64 in a cpu graph) at idx (i32, any shape) -> idx.shape + [D]
   (dpar_embedding); the gradient goes to the table (scatter-add in position
   order), none to idx. Errors (recorded): DPAR_ERR_DTYPE, DPAR_ERR_SHAPE. */
DPAR_API dpar_value dpar_g_embedding(dpar_graph *g, dpar_value table, dpar_value idx);
/* Dropout of x f32 (f64 in a cpu graph) (dpar_dropout) with `seed`, the number of earlier runs of
   the graph as the step and the device as the stream; its gradient uses the
   same mask. Errors (recorded): DPAR_ERR_INVALID_ARGUMENT (rate outside [0, 1]). */
DPAR_API dpar_value dpar_g_dropout(dpar_graph *g, dpar_value x, float rate, uint64_t seed);
/* >>async dispatch (public) ===================================================
   Non-blocking dispatch for programs with a frame budget (game and simulation
   engines): start a step, keep rendering, poll or wait. The same dpar_request
   and dpar_wait as the async collectives, with ctx = NULL.

   dpar_pmap_start / dpar_shard_map_start / dpar_graph_run_start take the
   arguments of dpar_pmap / dpar_shard_map / dpar_graph_run plus `req`, and
   return at once with a handle in *req (NULL on error). The step runs on a
   host thread of its own, one step per runtime at a time; it gives the same
   result bit for bit as the blocking call. Host memory named by the call (pmap
   inputs/outputs, graph feeds, *loss) must stay valid and untouched until
   dpar_wait(NULL, req) returns. dpar_test(NULL, req, &done) polls without
   blocking; dpar_wait(NULL, req) blocks, returns the step's status (its text
   in dpar_last_error) and frees the handle. Every started step must be waited
   for, also after dpar_test said done.
   Thread safety, enforced: while a step is in flight (started, not yet waited)
   any call that starts a dispatch, or that reads, writes, creates or frees
   the runtime's buffers, arrays, meshes or graphs (dpar_pmap, dpar_shard_map,
   dpar_graph_run, dpar_array_put/get/create/destroy, dpar_buffer_read/write/
   destroy, dpar_mesh_destroy, dpar_graph_destroy, dpar_runtime_destroy,
   dpar_vulkan_buffer_export/release) returns DPAR_ERR_STATE and does nothing;
   dpar_test, dpar_wait, dpar_runtime_device_info/stats, dpar_last_error and
   dpar_graph_put_feeds (staging the next step's feeds: six sets in turn,
   the step never reads what it writes) are allowed. Only one thread may wait for
   or test a given request.
   Errors of the start calls: DPAR_ERR_INVALID_ARGUMENT (NULL mesh, graph,
   desc, fn or req), DPAR_ERR_STATE (called inside a pmap function, another
   step of the runtime in flight, a runtime over several MPI processes),
   DPAR_ERR_OUT_OF_MEMORY (no host thread). Every other error of the blocking
   call (shapes, the devices' errors) is returned by dpar_wait. */
DPAR_API dpar_status dpar_pmap_start(dpar_mesh *m, const dpar_pmap_desc *desc, dpar_request **req);
DPAR_API dpar_status dpar_shard_map_start(dpar_mesh *m, const dpar_shard_map_desc *desc, dpar_request **req);
DPAR_API dpar_status dpar_graph_run_start(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds, float *loss,
                                          dpar_request **req);
/* Sets *done to whether the request finished, without blocking: a step
   (ctx = NULL) or an async collective of ctx's device (ctx = the pmap
   context). The request stays valid until dpar_wait. Errors:
   DPAR_ERR_INVALID_ARGUMENT (NULL req or done, a request that is not pending:
   already waited, or a step passed with a ctx / a collective without one). */
DPAR_API dpar_status dpar_test(dpar_ctx *ctx, dpar_request *req, bool *done);

/* >>vulkan interop (public) ===================================================
   Engines that bring their own Vulkan device (DPAR_VULKAN builds; see
   dpar_vulkan_external in dpar_vulkan_desc for adoption). */
typedef struct dpar_vulkan_export {
    uint64_t buffer;        /* VkBuffer holding the data, owned by dpar, valid until the dpar_buffer is destroyed:
                               memcpy it into a VkBuffer (a pointer on 64-bit targets, a uint64_t on 32-bit) */
    uint64_t offset;        /* byte offset of element 0 within `buffer` */
    uint64_t size;          /* bytes of data: dpar_buffer_nbytes */
    uint64_t semaphore;     /* VkSemaphore, timeline, owned by dpar (one per logical device), likewise */
    uint64_t ready_value;   /* wait for semaphore >= ready_value before any access to buffer */
    uint64_t release_value; /* signal semaphore = release_value once done with buffer, then
                               call dpar_vulkan_buffer_release */
    uint32_t queue_family;  /* the queue family that owns the buffer (VK_SHARING_MODE_EXCLUSIVE) */
} dpar_vulkan_export;
/* Lends dpar buffer b (Vulkan backend) to the caller's Vulkan work without a
   host round trip. Submits b's device's recorded work with a signal of
   `semaphore` to ready_value and fills *out. Synchronization contract:
   the engine's queue submission that reads (or writes) buffer waits on
   (semaphore, ready_value) at the stage of its first access (e.g.
   VK_PIPELINE_STAGE_TRANSFER_BIT for vkCmdCopyBuffer) and signals
   (semaphore, release_value) after its last access; dpar's writes are then
   available and visible to it (the signal covers all of dpar's earlier work on
   that queue). Then call dpar_vulkan_buffer_release: dpar's next work on the
   device waits on the GPU for release_value (the host is not blocked; a host
   read of b waits for it). Submit on the queue family in out->queue_family
   (an adopted device: the engine's queue). Between export and release, b is
   lent: any dpar use of b's runtime that could touch it (a dispatch, a read or
   write of b, destroying b) returns DPAR_ERR_STATE.
   Only on an adopted device (desc.vulkan.external: a device dpar created is
   out of the caller's reach), with timeline semaphores:
   VkPhysicalDeviceVulkan12Features::timelineSemaphore enabled and said so in
   dpar_vulkan_external.timeline_semaphore.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL), DPAR_ERR_BACKEND_UNAVAILABLE
   (not a Vulkan buffer, dpar's own device, or no timeline semaphores: the text
   says how to fix it), DPAR_ERR_STATE (b already lent, called inside a pmap function or with
   a step in flight), DPAR_ERR_BACKEND (the driver failed). */
DPAR_API dpar_status dpar_vulkan_buffer_export(dpar_buffer *b, dpar_vulkan_export *out);
/* Ends the loan of b begun by dpar_vulkan_buffer_export: dpar's next GPU work
   on b's device waits for the semaphore to reach release_value (which the
   engine's submission signals; it may be submitted after this call). If it
   is never signalled, dpar's next wait on that device fails after its fence
   timeout (600 s) with DPAR_ERR_BACKEND.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL), DPAR_ERR_STATE (b is not lent,
   a step in flight, inside a pmap function), DPAR_ERR_BACKEND. */
DPAR_API dpar_status dpar_vulkan_buffer_release(dpar_buffer *b);

/* >>deprecated ===============================================================
   Names of version 0.1, kept for one release as wrappers of the new names
   (CHANGELOG.md lists them). A call warns (-Wdeprecated-declarations) naming
   the replacement; tools/rename_api.sh rewrites a source tree to the new names.
   Define DPAR_NO_DEPRECATED to drop them, or DPAR_DEPRECATED(msg) as empty to
   keep them without the warning. */
#ifndef DPAR_DEPRECATED
#if defined(__GNUC__) || defined(__clang__)
#define DPAR_DEPRECATED(msg) __attribute__((deprecated(msg)))
#elif defined(_MSC_VER)
#define DPAR_DEPRECATED(msg) __declspec(deprecated(msg))
#else
#define DPAR_DEPRECATED(msg)
#endif
#endif
#if defined(__GNUC__) || defined(__clang__)
#define DPAR__ALIAS static inline __attribute__((unused)) /* no unused-function warning for dpar.h itself */
#else
#define DPAR__ALIAS static inline
#endif
#ifndef DPAR_NO_DEPRECATED
/* BEGIN DEPRECATED NAMES (tools/rename_api.sh leaves this block alone) */
DPAR_DEPRECATED("use dpar_runtime_device_count")
DPAR__ALIAS int dpar_device_count(const dpar_runtime *rt) {
    return dpar_runtime_device_count(rt);
}
DPAR_DEPRECATED("use dpar_runtime_process_index")
DPAR__ALIAS int dpar_process_index(const dpar_runtime *rt) {
    return dpar_runtime_process_index(rt);
}
DPAR_DEPRECATED("use dpar_runtime_process_count")
DPAR__ALIAS int dpar_process_count(const dpar_runtime *rt) {
    return dpar_runtime_process_count(rt);
}
DPAR_DEPRECATED("use dpar_runtime_local_devices")
DPAR__ALIAS void dpar_local_devices(const dpar_runtime *rt, int *first, int *count) {
    dpar_runtime_local_devices(rt, first, count);
}
DPAR_DEPRECATED("use dpar_runtime_device_sync")
DPAR__ALIAS dpar_status dpar_device_sync(dpar_runtime *rt, int device) {
    return dpar_runtime_device_sync(rt, device);
}
DPAR_DEPRECATED("use dpar_runtime_device_info")
DPAR__ALIAS dpar_status dpar_device_info_get(const dpar_runtime *rt, int device, dpar_device_info *out) {
    return dpar_runtime_device_info(rt, device, out);
}
DPAR_DEPRECATED("use dpar_runtime_device_stats")
DPAR__ALIAS dpar_status dpar_device_stats_get(const dpar_runtime *rt, int device, dpar_device_stats *out) {
    return dpar_runtime_device_stats(rt, device, out);
}
DPAR_DEPRECATED("use dpar_runtime_stats_reset")
DPAR__ALIAS void dpar_stats_reset(dpar_runtime *rt) {
    dpar_runtime_stats_reset(rt);
}
DPAR_DEPRECATED("use dpar_ctx_axis_index")
DPAR__ALIAS dpar_status dpar_axis_index(const dpar_ctx *ctx, const char *axes, int *out) {
    return dpar_ctx_axis_index(ctx, axes, out);
}
DPAR_DEPRECATED("use dpar_ctx_axis_size")
DPAR__ALIAS dpar_status dpar_axis_size(const dpar_ctx *ctx, const char *axes, int *out) {
    return dpar_ctx_axis_size(ctx, axes, out);
}
/* END DEPRECATED NAMES */
#endif /* DPAR_NO_DEPRECATED */

#ifdef __cplusplus
}
#endif
#endif /* DPAR_H_INCLUDED */

/* Windows: <windows.h> as dpar includes it (lean, no min/max macros), for the
   implementation below and for any file that defines DPAR_INCLUDE_WINDOWS
   before including dpar.h (tests/testutil.h), so both see the same
   declarations. Users' files get no <windows.h> from dpar.h. */
#if defined(_WIN32) && !defined(DPAR__WINDOWS_DONE) && \
    (defined(DPAR_IMPLEMENTATION) || defined(DPAR_TRAIN_IMPLEMENTATION) || defined(DPAR_INCLUDE_WINDOWS))
#define DPAR__WINDOWS_DONE
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#include <fenv.h>
#endif

/* >>platform =================================================================
   Platform layer (DESIGN §9): threads, mutexes, condition variables, the
   monotonic clock and deadline waits, atomics, CPU count, memory size,
   dynamic libraries, durable file replacement. The rest of dpar.h, the
   backends and util/dpar_train.h call these and carry no OS #ifdef.
   POSIX (Linux, macOS) or Win32 (MinGW-w64, MSVC). On Linux each wrapper is
   the call the code made before, so behaviour and speed are unchanged.
   Compiled where the implementation of dpar.h or of util/dpar_train.h is.
   DPAR_PLATFORM_FORCE_MACOS (CI, compile only): takes the macOS branches on
   Linux, to show they build without pthread_condattr_setclock; its result is
   not meant to run (F_FULLFSYNC is given a stand-in value there).
   DPAR_PLATFORM_INTERLOCKED (CI, Windows): the MSVC atomics (Interlocked*)
   under MinGW-w64, to compile the branch MSVC takes.
   ======================================================================== */
#if (defined(DPAR_IMPLEMENTATION) || defined(DPAR_TRAIN_IMPLEMENTATION)) && !defined(DPAR__PLATFORM_DONE)
#define DPAR__PLATFORM_DONE
/* unused ones must not warn where dpar.h is compiled as the main file */
#if defined(__GNUC__)
#define DPAR__PLATFORM_FN static inline __attribute__((unused))
#else
#define DPAR__PLATFORM_FN static inline
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(_WIN32)
#include <io.h>
#include <process.h>
#define DPAR__O_BINARY O_BINARY
#else
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#define DPAR__O_BINARY 0
#endif
#if defined(__linux__)
#include <sys/prctl.h>
#endif
#if defined(__APPLE__) || defined(DPAR_PLATFORM_FORCE_MACOS)
#define DPAR__MACOS 1
#if !defined(F_FULLFSYNC) && defined(DPAR_PLATFORM_FORCE_MACOS)
#define F_FULLFSYNC 51 /* <sys/fcntl.h> on macOS; a compile-only stand-in on Linux */
#endif
#endif

/* --- atomics: GCC/Clang builtins; Interlocked* (full barriers) for MSVC --- */
#if defined(_WIN32) && (defined(_MSC_VER) || defined(DPAR_PLATFORM_INTERLOCKED)) && !defined(__clang__)
/* 4- or 8-byte integers only; every operation is a full barrier (stronger than asked). */
#define DPAR__IL64(p) ((volatile LONG64 *)(void *)(p))
#define DPAR__IL32(p) ((volatile LONG *)(void *)(p))
#define DPAR__ATOMIC_LOAD(p)                                               \
    (sizeof(*(p)) == 8 ? InterlockedCompareExchange64(DPAR__IL64(p), 0, 0) \
                       : InterlockedCompareExchange(DPAR__IL32(p), 0, 0))
#define DPAR__ATOMIC_STORE(p, v)                                                            \
    ((void)(sizeof(*(p)) == 8 ? InterlockedExchange64(DPAR__IL64(p), (LONG64)(intptr_t)(v)) \
                              : (LONG64)InterlockedExchange(DPAR__IL32(p), (LONG)(intptr_t)(v))))
#define DPAR__ATOMIC_EXCHANGE(p, v)                                                  \
    (sizeof(*(p)) == 8 ? InterlockedExchange64(DPAR__IL64(p), (LONG64)(intptr_t)(v)) \
                       : InterlockedExchange(DPAR__IL32(p), (LONG)(intptr_t)(v)))
#define DPAR__ATOMIC_FETCH_ADD(p, v)                                                    \
    (sizeof(*(p)) == 8 ? InterlockedExchangeAdd64(DPAR__IL64(p), (LONG64)(intptr_t)(v)) \
                       : InterlockedExchangeAdd(DPAR__IL32(p), (LONG)(intptr_t)(v)))
#define DPAR__ATOMIC_SUB_FETCH(p, v)     (DPAR__ATOMIC_FETCH_ADD(p, -(v)) - (v))
#define DPAR__ATOMIC_ADD_FETCH(p, v)     (DPAR__ATOMIC_FETCH_ADD(p, v) + (v))
#define DPAR__ATOMIC_CAS_PTR(p, e, d)    dpar__cas_ptr((void *volatile *)(void *)(p), (void **)(void *)(e), (void *)(d))
#define DPAR__ATOMIC_LOAD_RELAXED(p)     DPAR__ATOMIC_LOAD(p)
#define DPAR__ATOMIC_STORE_RELAXED(p, v) DPAR__ATOMIC_STORE(p, v)
#define DPAR__UNLIKELY(x)                (x)
#define DPAR__LIKELY(x)                  (x)
#else
#define DPAR__ATOMIC_LOAD(p)             __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define DPAR__ATOMIC_STORE(p, v)         __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define DPAR__ATOMIC_EXCHANGE(p, v)      __atomic_exchange_n((p), (v), __ATOMIC_ACQ_REL)
#define DPAR__ATOMIC_FETCH_ADD(p, v)     __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define DPAR__ATOMIC_SUB_FETCH(p, v)     __atomic_sub_fetch((p), (v), __ATOMIC_ACQ_REL)
#define DPAR__ATOMIC_ADD_FETCH(p, v)     __atomic_add_fetch((p), (v), __ATOMIC_ACQ_REL)
/* compare-and-swap of a pointer: 1 when *p was *e and is now d, else 0 with *e = *p */
#define DPAR__ATOMIC_CAS_PTR(p, e, d)    __atomic_compare_exchange_n((p), (e), (d), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
#define DPAR__ATOMIC_LOAD_RELAXED(p)     __atomic_load_n((p), __ATOMIC_RELAXED)
#define DPAR__ATOMIC_STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define DPAR__UNLIKELY(x)                __builtin_expect(!!(x), 0)
#define DPAR__LIKELY(x)                  __builtin_expect(!!(x), 1)
#endif
#if defined(_WIN32) && (defined(_MSC_VER) || defined(DPAR_PLATFORM_INTERLOCKED)) && !defined(__clang__)
static inline int dpar__cas_ptr(void *volatile *p, void **expected, void *desired) {
    void *seen = InterlockedCompareExchangePointer(p, desired, *expected);
    if (seen == *expected) return 1;
    *expected = seen;
    return 0;
}
#endif
/* one iteration of a spin-wait loop */
#if defined(_MSC_VER) || (defined(_WIN32) && defined(DPAR_PLATFORM_INTERLOCKED))
#define DPAR__CPU_RELAX() YieldProcessor()
#elif defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define DPAR__CPU_RELAX() __builtin_ia32_pause()
#elif defined(__GNUC__) && defined(__aarch64__)
#define DPAR__CPU_RELAX() __asm__ __volatile__("yield")
#else
#define DPAR__CPU_RELAX() ((void)0)
#endif

/* --- threads, mutexes, condition variables, once --- */
#if defined(_WIN32)
typedef HANDLE dpar__thread;
typedef SRWLOCK dpar__mutex;
typedef CONDITION_VARIABLE dpar__cond;
typedef INIT_ONCE dpar__once;
#define DPAR__MUTEX_INIT SRWLOCK_INIT
#define DPAR__COND_INIT  CONDITION_VARIABLE_INIT
#define DPAR__ONCE_INIT  INIT_ONCE_STATIC_INIT
/* a thread's entry point: static DPAR__THREAD_FN(name, arg) { ...; return 0; } */
#define DPAR__THREAD_FN(name, arg) DWORD WINAPI name(LPVOID arg)
typedef LPTHREAD_START_ROUTINE dpar__thread_fn;
#else
typedef pthread_t dpar__thread;
typedef pthread_mutex_t dpar__mutex;
typedef pthread_cond_t dpar__cond;
typedef pthread_once_t dpar__once;
#define DPAR__MUTEX_INIT           PTHREAD_MUTEX_INITIALIZER
#define DPAR__COND_INIT            PTHREAD_COND_INITIALIZER /* untimed waits only: the default clock */
#define DPAR__ONCE_INIT            PTHREAD_ONCE_INIT
#define DPAR__THREAD_FN(name, arg) void *name(void *arg)
typedef void *(*dpar__thread_fn)(void *);
#endif

#if defined(_WIN32)
/* A new Windows thread starts with the default floating-point environment (x87 precision 53 bits),
   not its creator's (MinGW's CRT sets 64 bits in the main thread), and MinGW's libm computes exp, log,
   tanh ... on the x87: a kernel on a worker then rounds differently from the same kernel on the
   caller's thread (an f64 graph against the eager op differed in the last bits). As POSIX threads
   do, a dpar thread takes its creator's environment (fegetenv / fesetenv) before it runs. */
typedef struct dpar__thread_start_rec {
    dpar__thread_fn fn;
    void *arg;
    fenv_t env;
} dpar__thread_start_rec;
static DWORD WINAPI dpar__thread_trampoline(LPVOID p) {
    dpar__thread_start_rec r = *(dpar__thread_start_rec *)p;
    HeapFree(GetProcessHeap(), 0, p);
    fesetenv(&r.env);
    return r.fn(r.arg);
}
#endif
/* 0 when the thread started, else nonzero (out of resources). The thread runs in the caller's
   floating-point environment (rounding, precision), on every platform. */
DPAR__PLATFORM_FN int dpar__thread_start(dpar__thread *t, dpar__thread_fn fn, void *arg) {
#if defined(_WIN32)
    dpar__thread_start_rec *r = (dpar__thread_start_rec *)HeapAlloc(GetProcessHeap(), 0, sizeof *r);
    if (!r) return 1;
    r->fn = fn, r->arg = arg;
    fegetenv(&r->env);
    *t = CreateThread(NULL, 0, dpar__thread_trampoline, r, 0, NULL);
    if (!*t) HeapFree(GetProcessHeap(), 0, r);
    return *t ? 0 : 1;
#else
    return pthread_create(t, NULL, fn, arg);
#endif
}
/* Names the calling thread "dpar-<what><i>" (Linux: what top, perf and /proc/self/task/<tid>/comm show,
   15 characters at most), so a profile or a benchmark tells dpar's threads from a driver's (llvmpipe's
   compute threads are unnamed); elsewhere nothing. */
DPAR__PLATFORM_FN void dpar__thread_name(const char *what, int i) {
#if defined(__linux__)
    char name[16];
    snprintf(name, sizeof name, "dpar-%s%d", what, i);
    prctl(PR_SET_NAME, name, 0, 0, 0);
#else
    (void)what, (void)i;
#endif
}
DPAR__PLATFORM_FN void dpar__thread_join(dpar__thread t) {
#if defined(_WIN32)
    WaitForSingleObject(t, INFINITE);
    CloseHandle(t);
#else
    pthread_join(t, NULL);
#endif
}
DPAR__PLATFORM_FN void dpar__thread_yield(void) {
#if defined(_WIN32)
    SwitchToThread();
#else
    sched_yield();
#endif
}
DPAR__PLATFORM_FN void dpar__mutex_init(dpar__mutex *m) {
#if defined(_WIN32)
    InitializeSRWLock(m);
#else
    pthread_mutex_init(m, NULL);
#endif
}
DPAR__PLATFORM_FN void dpar__mutex_destroy(dpar__mutex *m) {
#if defined(_WIN32)
    (void)m; /* an SRW lock holds no resources */
#else
    pthread_mutex_destroy(m);
#endif
}
DPAR__PLATFORM_FN void dpar__mutex_lock(dpar__mutex *m) {
#if defined(_WIN32)
    AcquireSRWLockExclusive(m);
#else
    pthread_mutex_lock(m);
#endif
}
DPAR__PLATFORM_FN void dpar__mutex_unlock(dpar__mutex *m) {
#if defined(_WIN32)
    ReleaseSRWLockExclusive(m);
#else
    pthread_mutex_unlock(m);
#endif
}
/* Deadlines (dpar__cond_timedwait) run on the monotonic clock, so an NTP step
   or a resumed VM neither fires nor stalls them. macOS has no
   pthread_condattr_setclock: there the wait converts to the realtime clock. */
DPAR__PLATFORM_FN void dpar__cond_init(dpar__cond *cv) {
#if defined(_WIN32)
    InitializeConditionVariable(cv);
#elif defined(DPAR__MACOS)
    pthread_cond_init(cv, NULL);
#else
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
#endif
}
DPAR__PLATFORM_FN void dpar__cond_destroy(dpar__cond *cv) {
#if defined(_WIN32)
    (void)cv;
#else
    pthread_cond_destroy(cv);
#endif
}
DPAR__PLATFORM_FN void dpar__cond_wait(dpar__cond *cv, dpar__mutex *m) {
#if defined(_WIN32)
    SleepConditionVariableSRW(cv, m, INFINITE, 0);
#else
    pthread_cond_wait(cv, m);
#endif
}
DPAR__PLATFORM_FN void dpar__cond_signal(dpar__cond *cv) {
#if defined(_WIN32)
    WakeConditionVariable(cv);
#else
    pthread_cond_signal(cv);
#endif
}
DPAR__PLATFORM_FN void dpar__cond_broadcast(dpar__cond *cv) {
#if defined(_WIN32)
    WakeAllConditionVariable(cv);
#else
    pthread_cond_broadcast(cv);
#endif
}
#if defined(_WIN32)
static BOOL CALLBACK dpar__once_tramp(PINIT_ONCE once, PVOID fn, PVOID *ctx) {
    (void)once;
    (void)ctx;
    void (*f)(void);
    memcpy(&f, &fn, sizeof f); /* the function pointer travels as the callback's parameter */
    f();
    return TRUE;
}
#endif
DPAR__PLATFORM_FN void dpar__call_once(dpar__once *once, void (*fn)(void)) {
#if defined(_WIN32)
    PVOID p;
    memcpy(&p, &fn, sizeof p);
    InitOnceExecuteOnce(once, dpar__once_tramp, p, NULL);
#else
    pthread_once(once, fn);
#endif
}

/* --- clock, sleeping, deadline waits --- */
/* monotonic nanoseconds (an arbitrary origin) */
DPAR__PLATFORM_FN uint64_t dpar__now_ns(void) {
#if defined(_WIN32)
    LARGE_INTEGER freq, c;
    QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&c);
    uint64_t f = (uint64_t)freq.QuadPart, t = (uint64_t)c.QuadPart;
    return t / f * 1000000000u + t % f * 1000000000u / f;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}
/* the monotonic time `ms` milliseconds from now, for dpar__cond_timedwait */
DPAR__PLATFORM_FN uint64_t dpar__deadline(int ms) {
    return dpar__now_ns() + (uint64_t)(ms > 0 ? ms : 0) * 1000000u;
}
DPAR__PLATFORM_FN void dpar__sleep_us(int64_t us) {
    if (us <= 0) return;
#if defined(_WIN32)
    Sleep((DWORD)((us + 999) / 1000));
#else
    struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000L };
    nanosleep(&ts, NULL);
#endif
}
/* Waits on cv until signalled or the monotonic `deadline` (dpar__deadline)
   passed: ETIMEDOUT then, else 0 (also spuriously: callers loop). */
DPAR__PLATFORM_FN int dpar__cond_timedwait(dpar__cond *cv, dpar__mutex *m, uint64_t deadline) {
#if defined(_WIN32)
    uint64_t now = dpar__now_ns();
    if (now >= deadline) return ETIMEDOUT;
    uint64_t ms = (deadline - now + 999999u) / 1000000u;
    if (!SleepConditionVariableSRW(cv, m, ms > 0x7fffffffu ? 0x7fffffffu : (DWORD)ms, 0) &&
        GetLastError() == ERROR_TIMEOUT && dpar__now_ns() >= deadline)
        return ETIMEDOUT;
    return 0;
#elif defined(DPAR__MACOS)
    uint64_t now = dpar__now_ns(), left = deadline > now ? deadline - now : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t abs_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + left;
    ts.tv_sec = (time_t)(abs_ns / 1000000000u);
    ts.tv_nsec = (long)(abs_ns % 1000000000u);
    int rc = pthread_cond_timedwait(cv, m, &ts);
    return rc == ETIMEDOUT && dpar__now_ns() >= deadline ? ETIMEDOUT : 0;
#else
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline / 1000000000u);
    ts.tv_nsec = (long)(deadline % 1000000000u);
    return pthread_cond_timedwait(cv, m, &ts) == ETIMEDOUT ? ETIMEDOUT : 0;
#endif
}

/* --- the machine: CPUs, memory, L2 and last-level caches, process id --- */
/* online CPUs (>= 1) */
DPAR__PLATFORM_FN int dpar__cpu_count(void) {
#if defined(_WIN32)
    DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
    return n > 0 ? (int)n : 1;
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
#endif
}
/* physical memory in bytes, 0 when unknown */
DPAR__PLATFORM_FN uint64_t dpar__memory_bytes(void) {
#if defined(_WIN32)
    MEMORYSTATUSEX ms;
    ms.dwLength = sizeof ms;
    return GlobalMemoryStatusEx(&ms) ? (uint64_t)ms.ullTotalPhys : 0;
#else
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
#endif
}
/* bytes of the level-2 or level-3 (last-level) cache where the C library says (glibc), else 0 */
DPAR__PLATFORM_FN long dpar__cache_bytes(int level) {
#if defined(_SC_LEVEL2_CACHE_SIZE)
    if (level == 2) return sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
#if defined(_SC_LEVEL3_CACHE_SIZE)
    if (level == 3) return sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    (void)level;
    return 0;
}
DPAR__PLATFORM_FN long dpar__pid(void) {
#if defined(_WIN32)
    return (long)_getpid();
#else
    return (long)getpid();
#endif
}

#if defined(_WIN32)
/* the system's text for error `e` (GetLastError), without its line break */
DPAR__PLATFORM_FN const char *dpar__win_msg(unsigned long e, char *buf, size_t cap) {
    DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, (DWORD)e, 0, buf,
                             (DWORD)cap, NULL);
    if (!n) snprintf(buf, cap, "Windows error %lu", e);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == '.')) buf[--n] = 0;
    return buf;
}
#endif

/* --- dynamic libraries --- */
/* NULL when `name` cannot be loaded; dpar__dl_error then says why */
DPAR__PLATFORM_FN void *dpar__dl_open(const char *name) {
#if defined(_WIN32)
    return (void *)LoadLibraryA(name);
#else
    return dlopen(name, RTLD_NOW | RTLD_LOCAL);
#endif
}
/* the symbol's address as an integer (cast it to the function type), 0 when absent */
DPAR__PLATFORM_FN uintptr_t dpar__dl_sym(void *lib, const char *name) {
#if defined(_WIN32)
    return (uintptr_t)GetProcAddress((HMODULE)lib, name);
#else
    return (uintptr_t)dlsym(lib, name);
#endif
}
DPAR__PLATFORM_FN void dpar__dl_close(void *lib) {
#if defined(_WIN32)
    FreeLibrary((HMODULE)lib);
#else
    dlclose(lib);
#endif
}
/* why the last dpar__dl_open failed, in buf */
DPAR__PLATFORM_FN const char *dpar__dl_error(char *buf, size_t cap) {
#if defined(_WIN32)
    dpar__win_msg(GetLastError(), buf, cap);
#else
    const char *e = dlerror();
    snprintf(buf, cap, "%s", e ? e : "dlopen failed");
#endif
    return buf;
}

/* --- files: positioned read, durable flush, durable replace --- */
#if defined(_WIN32) /* what <sys/stat.h> lacks there: no such files on Windows */
#ifndef S_ISSOCK
#define S_ISSOCK(m) 0
#endif
#ifndef S_ISBLK
#define S_ISBLK(m) 0
#endif
#endif
/* pread: up to n bytes at offset off of fd, leaving the file position as it
   was; how many, 0 at the end, -1 with errno on error */
DPAR__PLATFORM_FN int64_t dpar__pread(int fd, void *dst, size_t n, uint64_t off) {
#if defined(_WIN32)
    __int64 cur = _lseeki64(fd, 0, SEEK_CUR);
    if (cur < 0 || _lseeki64(fd, (__int64)off, SEEK_SET) < 0) return -1;
    int got = _read(fd, dst, n > 0x40000000u ? 0x40000000u : (unsigned)n);
    int err = errno;
    _lseeki64(fd, cur, SEEK_SET);
    errno = err;
    return got;
#else
    return (int64_t)pread(fd, dst, n, (off_t)off);
#endif
}
/* Flushes `f` and its file's data to the storage device: 0, else an errno
   value. macOS's fsync stops at the drive's cache; F_FULLFSYNC goes through. */
DPAR__PLATFORM_FN int dpar__file_sync(FILE *f) {
    if (fflush(f) != 0) return errno ? errno : EIO;
#if defined(_WIN32)
    if (_commit(_fileno(f)) != 0) return errno ? errno : EIO;
#elif defined(DPAR__MACOS)
    if (fcntl(fileno(f), F_FULLFSYNC) != 0 && fsync(fileno(f)) != 0) return errno ? errno : EIO;
#else
    if (fsync(fileno(f)) != 0) return errno ? errno : EIO;
#endif
    return 0;
}
/* Renames `from` over `to`, replacing a file there, and makes the rename
   durable (POSIX: fsync of the folder, best effort; Windows: MoveFileEx
   with MOVEFILE_WRITE_THROUGH). `dir` is scratch of strlen(to) + 2 bytes,
   written after the rename only (so it may be `from`).
   Windows denies access while another thread or process replaces or holds
   `to` open: that is retried for about a second.
   0, else nonzero with why (strerror or the Windows message) in `why`. */
DPAR__PLATFORM_FN int dpar__file_replace(const char *from, const char *to, char *dir, char *why, size_t cap) {
#if defined(_WIN32)
    (void)dir;
    DWORD e = 0;
    for (int tries = 0; tries < 200; tries++) {
        if (MoveFileExA(from, to, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) return 0;
        e = GetLastError();
        if (e != ERROR_ACCESS_DENIED && e != ERROR_SHARING_VIOLATION) break;
        Sleep(5);
    }
    dpar__win_msg(e, why, cap);
    return 1;
#else
    if (rename(from, to) != 0) {
        snprintf(why, cap, "%s", strerror(errno));
        return 1;
    }
    const char *slash = strrchr(to, '/');
    if (slash) {
        memcpy(dir, to, (size_t)(slash - to) + 1);
        dir[slash - to + 1] = 0;
    } else
        strcpy(dir, ".");
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    return 0;
#endif
}
#endif /* DPAR__PLATFORM_DONE */

/* ===========================================================================
   IMPLEMENTATION
   ======================================================================== */
#ifdef DPAR_IMPLEMENTATION
#ifndef DPAR_IMPLEMENTATION_DONE
#define DPAR_IMPLEMENTATION_DONE

#if !defined(_GNU_SOURCE) && !defined(__cplusplus)
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <errno.h>
#ifndef DPAR_ASSERT
#include <assert.h>
#define DPAR_ASSERT(c) assert(c)
#endif
#ifndef DPAR_MALLOC
#define DPAR_MALLOC(sz)     malloc(sz)
#define DPAR_FREE(p)        free(p)
#define DPAR_REALLOC(p, sz) realloc(p, sz)
#endif
#ifndef DPAR_ALIGNED_MALLOC
#define DPAR_ALIGNED_MALLOC(sz, align) dpar__aligned_malloc(sz, align)
#define DPAR_ALIGNED_FREE(p)           dpar__aligned_free(p)
#endif
#ifndef DPAR_LOG
#define DPAR_LOG(msg)                                              \
    do {                                                           \
        if (dpar__verbose()) fprintf(stderr, "dpar: %s\n", (msg)); \
    } while (0)
#endif
#ifdef DPAR_USE_CBLAS
#include <cblas.h>
#endif

#if defined(__cplusplus)
#define DPAR__TLS thread_local
#elif defined(_MSC_VER)
#define DPAR__TLS __declspec(thread)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define DPAR__TLS _Thread_local
#else
#define DPAR__TLS __thread
#endif
#define DPAR__UNUSED(x) (void)(x)
#if defined(__GNUC__)
#define DPAR__MAYBE_UNUSED __attribute__((unused))
#else
#define DPAR__MAYBE_UNUSED
#endif

/* ---------------------------------------------------------------------------
   Errors
   ------------------------------------------------------------------------ */
enum { DPAR__ERR_LEN = 1024 };
static DPAR__TLS char dpar__err_text[DPAR__ERR_LEN];

DPAR__MAYBE_UNUSED static int dpar__verbose(void) {
    const char *v = getenv("DPAR_VERBOSE");
    return v && v[0] && v[0] != '0';
}

/* Sets the thread's last error and returns s. fmt follows printf. */
static dpar_status dpar__err(dpar_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(DPAR__PRINTF_FMT, 2, 3)))
#endif
    ;
/* Formats into a temporary first: an argument may be the last error itself
   (dpar_set_last_error(s, "f: %s", dpar_last_error()) adds context). */
static void dpar__err_vset(const char *fmt, va_list ap) {
    char t[DPAR__ERR_LEN];
    vsnprintf(t, sizeof t, fmt, ap);
    memcpy(dpar__err_text, t, sizeof t);
}
static dpar_status dpar__err(dpar_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dpar__err_vset(fmt, ap);
    va_end(ap);
    return s;
}
static void dpar__clear_error(void) {
    dpar__err_text[0] = 0;
}
/* Runs a destroy or release: when it succeeds the last error is left as it was,
   since a cleanup must not wipe the error the caller is about to print. */
static dpar_status dpar__destroy_kept(dpar_status (*destroy)(void *obj), void *obj) {
    char saved[DPAR__ERR_LEN];
    size_t n = strlen(dpar__err_text) + 1;
    memcpy(saved, dpar__err_text, n);
    dpar_status s = destroy(obj);
    if (!s) memcpy(dpar__err_text, saved, n);
    return s;
}

DPAR_API const char *dpar_last_error(void) {
    return dpar__err_text;
}
DPAR_API dpar_status dpar_set_last_error(dpar_status code, const char *fmt, ...) {
    va_list ap;
    if (!fmt) {
        dpar__clear_error();
        return code;
    }
    va_start(ap, fmt);
    dpar__err_vset(fmt, ap);
    va_end(ap);
    return code;
}

DPAR_API const char *dpar_status_string(dpar_status s) {
    switch (s) {
    case DPAR_OK: return "DPAR_OK";
    case DPAR_ERR_INVALID_ARGUMENT: return "DPAR_ERR_INVALID_ARGUMENT";
    case DPAR_ERR_SHAPE: return "DPAR_ERR_SHAPE";
    case DPAR_ERR_DTYPE: return "DPAR_ERR_DTYPE";
    case DPAR_ERR_UNKNOWN_AXIS: return "DPAR_ERR_UNKNOWN_AXIS";
    case DPAR_ERR_DEVICE_COUNT: return "DPAR_ERR_DEVICE_COUNT";
    case DPAR_ERR_OUT_OF_MEMORY: return "DPAR_ERR_OUT_OF_MEMORY";
    case DPAR_ERR_BACKEND_UNAVAILABLE: return "DPAR_ERR_BACKEND_UNAVAILABLE";
    case DPAR_ERR_BACKEND: return "DPAR_ERR_BACKEND";
    case DPAR_ERR_COLLECTIVE_MISMATCH: return "DPAR_ERR_COLLECTIVE_MISMATCH";
    case DPAR_ERR_TIMEOUT: return "DPAR_ERR_TIMEOUT";
    case DPAR_ERR_ABORTED: return "DPAR_ERR_ABORTED";
    case DPAR_ERR_IO: return "DPAR_ERR_IO";
    case DPAR_ERR_STATE: return "DPAR_ERR_STATE";
    }
    return "DPAR_ERR_UNKNOWN_STATUS";
}

/* ---------------------------------------------------------------------------
   Dtypes and scalar conversions
   ------------------------------------------------------------------------ */
DPAR_API size_t dpar_dtype_size(dpar_dtype t) {
    switch (t) {
    case DPAR_F32:
    case DPAR_I32: return 4;
    case DPAR_F16:
    case DPAR_BF16: return 2;
    case DPAR_F64: return 8;
    default: return 0;
    }
}
DPAR_API const char *dpar_dtype_name(dpar_dtype t) {
    switch (t) {
    case DPAR_F32: return "f32";
    case DPAR_F16: return "f16";
    case DPAR_BF16: return "bf16";
    case DPAR_I32: return "i32";
    case DPAR_F64: return "f64";
    default: return "invalid";
    }
}
static uint32_t dpar__f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float dpar__u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

DPAR_API uint16_t dpar_f32_to_f16(float f) {
    uint32_t x = dpar__f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u | (m >> 13) : 0)); /* Inf/NaN (quiet) */
    int32_t ee = (int32_t)e - 127 + 15;
    if (ee >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow -> Inf */
    if (ee <= 0) {                                   /* subnormal / zero */
        if (ee < -10) return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - ee);
        uint32_t half = 1u << (shift - 1), rest = m & ((1u << shift) - 1), r = m >> shift;
        if (rest > half || (rest == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)ee << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) r++; /* may carry into exponent: correct */
    return (uint16_t)(sign | r);
}
DPAR_API float dpar_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return dpar__u2f(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return dpar__u2f(sign);
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
        return sign ? -v : v;
    }
    return dpar__u2f(sign | ((e + 112u) << 23) | (m << 13));
}
DPAR_API uint16_t dpar_f32_to_bf16(float f) {
    uint32_t x = dpar__f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
DPAR_API float dpar_bf16_to_f32(uint16_t h) {
    return dpar__u2f((uint32_t)h << 16);
}

static float dpar__load_f(const void *p, dpar_dtype t, int64_t i) {
    switch (t) {
    case DPAR_F32: return ((const float *)p)[i];
    case DPAR_F16: return dpar_f16_to_f32(((const uint16_t *)p)[i]);
    case DPAR_BF16: return dpar_bf16_to_f32(((const uint16_t *)p)[i]);
    case DPAR_I32: return (float)((const int32_t *)p)[i];
    case DPAR_F64: return (float)((const double *)p)[i];
    default: return 0.0f;
    }
}

/* ---------------------------------------------------------------------------
   Internal structures and the backend interface
   ------------------------------------------------------------------------ */
struct dpar_buffer {
    dpar_runtime *rt;
    int device; /* the backend's (process-local) device index: what backends use */
    int gdev;   /* global device id (== device without MPI) */
    dpar_dtype dtype;
    int ndim;
    int64_t shape[DPAR_MAX_DIMS];
    int64_t count;
    size_t nbytes;
    void *mem;                       /* backend handle (CPU: host pointer) */
    int owned;                       /* a shard of a dpar_array: freed with the array only */
    int lent;                        /* lent to the caller's Vulkan work (dpar_vulkan_buffer_export) */
    struct dpar_buffer *prev, *next; /* runtime's list, for cleanup */
};

/* One op, checked by the core; backends execute it. Shapes are resolved. */
typedef enum dpar__op_kind {
    DPAR__OP_MATMUL = 0,   /* dst[M,N] = f[0]*op(src0)[M,K] op(src1)[K,N] + f[1]*dst; ta, tb */
    DPAR__OP_BIAS_ADD,     /* dst[M,N] += src0[N] */
    DPAR__OP_BIAS_GRAD,    /* dst[N] = f[1]*dst + sum_m src0[M,N] */
    DPAR__OP_RELU,         /* dst = max(src0, 0), n elements */
    DPAR__OP_RELU_BWD,     /* dst = src0 (dy) where src1 (x) > 0 else 0 */
    DPAR__OP_SOFTMAX_XENT, /* dst (loss[1]), dst2 (dlogits [M,N] or NULL), src0 logits [M,N], src1 labels[M] i32;
                              p[0] use_ignore, p[1] ignore_label, p[2] public fn (dpar__idx_fn), f[0] smoothing */
    DPAR__OP_MSE,          /* dst (loss[1]), dst2 (dpred or NULL), src0 pred, src1 target; n elements */
    DPAR__OP_AXPY,         /* dst += f[0] * src0 */
    DPAR__OP_SCALE,        /* dst *= f[0] */
    DPAR__OP_FILL,         /* dst = f[0] (any dtype) */
    DPAR__OP_COPY,         /* dst = src0 (same dtype, byte copy) */
    DPAR__OP_CAST,         /* dst = cast(src0) */
    DPAR__OP_SUM,          /* dst[p[0]] = sum(src0) */
    DPAR__OP_SUMSQ,        /* dst[p[0]] = sum(src0^2) */
    DPAR__OP_SGD,          /* dst param, dst2 momentum (NULL if f[1]==0), src0 grad;
                              f[0]=lr f[1]=momentum f[2]=weight_decay f[3]=clip_scale; nesterov */
    /* >>norm-attn kinds (see >>layers-norm-attn) */
    DPAR__OP_NORM,           /* dst y, dst2 stats[M,2] or NULL, src0 x[M,N], src1 w, src2 b (NULL: none); f[0] eps,
                                p[0] 1 = rms */
    DPAR__OP_NORM_BWD,       /* dst dx, dst2 dw, dst3 db (NULL: skip), src0 dy, src1 x, src2 w, src3 stats; p[0] rms,
                                p[1] 1: no dx (dst is dw or db then) */
    DPAR__OP_MATMUL_BATCHED, /* as MATMUL per batch; p[0] batches, p[1..3] batch strides of A, B (0: shared), C */
    DPAR__OP_ATTN,           /* dst out, dst2 stats or NULL, src0 q, src1 k, src2 v; f[0] scale,
                                p[0] batch, p[1] Tq, p[2] Tk, p[3] D, p[4] Dv, p[5] causal */
    DPAR__OP_ATTN_BWD_Q,     /* dst stats (reads lse, writes D), dst2 dq or NULL, src0 dout, src1 q, src2 k, src3 v */
    DPAR__OP_ATTN_BWD_KV,    /* dst stats (read; writes D where the backend's attn_kv_computes_d), dst2 dk,
                                dst3 dv (NULL: skip), dst4 dq (only where attn_kv_computes_d; NULL: skip),
                                src0..3 as _Q */
    /* >>optim kinds (see >>optim) */
    DPAR__OP_ADAMW,     /* dst param, dst2 m, dst3 v, src0 grad; f[0]=lr f[1]=b1 f[2]=b2 f[3]=eps
                           f[4]=weight_decay f[5]=clip_scale f[6]=1/(1-b1^t) f[7]=1/(1-b2^t) */
    DPAR__OP_EMBED,     /* dst out [K,D], src0 table [V,D], src1 idx [K] i32; m=K n=D k=V */
    DPAR__OP_EMBED_BWD, /* dst dtable [V,D] += rows of src0 dout [K,D] at src1 idx [K], i ascending; m n k */
    DPAR__OP_DROPOUT,   /* dst = src0 * f[0] where kept; p[0..1] seed, p[2..3] step, p[4] stream,
                           p[5] threshold (keep when philox word >> 8 >= it) */
    /* >>elementwise kinds (geometry: see >>elementwise ops; 4-d, strides in elements) */
    DPAR__OP_UNARY,       /* dst[n] = u(src0), p[0] = dpar_unary_op, f[0] = its scalar */
    DPAR__OP_UNARY_BWD,   /* dst[n] = src1 (dy) * u'(src0 (x)); p[0], f[0] as UNARY */
    DPAR__OP_BINARY,      /* dst[p14 + i] = src0[p12 + a(i)] op src1[p13 + b(i)]; p[15] = dpar_binary_op */
    DPAR__OP_REDUCE,      /* dst[o] = reduce of src0 (dense) over dims in mask p[13]; p[12] = DPAR__RED_*; */
                          /* src1, src2: a, b of a binary backward (strides p[4..7], p[8..11]) */
    DPAR__OP_WHERE,       /* dst[i] = src0 (cond) ? src1 : src2, strides p[4..7], p[8..11], p[12..15]; */
                          /* src1/src2 NULL: f[0]/f[1]; k = 1: cond is i32 */
    DPAR__OP_SOFTMAX,     /* dst[m,n] = softmax rows of src0; p[0] = 1: log_softmax */
    DPAR__OP_SOFTMAX_BWD, /* dst[m,n] from src0 (dy), src1 (y); p[0] = 1: log_softmax */
    DPAR__OP_STRIDED,     /* dst[p13 + d(i)] = src0[p12 + s(i)], strides p[4..7] (src), p[8..11] (dst); 4 bytes */
    /* >>conv-pool kinds (see >>conv-pool) */
    DPAR__OP_CONV2D,            /* dst y, src0 x, src1 w, src2 bias or NULL; p: dpar__win2d */
    DPAR__OP_CONV2D_BWD_INPUT,  /* dst dx, src0 dy, src1 w; p: dpar__win2d */
    DPAR__OP_CONV2D_BWD_KERNEL, /* dst dw, src0 dy, src1 x; p: dpar__win2d */
    DPAR__OP_AVG_POOL,          /* dst y, src0 x; p: dpar__win2d */
    DPAR__OP_AVG_POOL_BWD,      /* dst dx, src0 dy; p: dpar__win2d */
    DPAR__OP_MAX_POOL,          /* dst y, src0 x; p: dpar__win2d */
    DPAR__OP_MAX_POOL_BWD,      /* dst dx, src0 dy, src1 x; p: dpar__win2d */
    DPAR__OP_COUNT
} dpar__op_kind;

typedef struct dpar__op {
    dpar__op_kind kind;
    dpar_buffer *dst, *dst2, *dst3, *dst4;
    const dpar_buffer *src0, *src1, *src2, *src3;
    int64_t m, n, k; /* matmul M,N,K; row ops M (rows), N (cols); element ops n = count */
    bool trans_a, trans_b, nesterov;
    float f[8];
    int64_t p[16]; /* integer parameters of the layer ops (geometry, axes, strides); see each kind */
} dpar__op;
enum { DPAR__OP_DSTS = 4, DPAR__OP_BUFS = 8 }; /* dst..dst4, then src0..src3: the half-precision wrappers' order */

/* The window geometry of conv2d and the 2-D pools, resolved by the core
   (defaults, SAME pads), stored in dpar__op.p (see dpar__win2d_put):
   x [n,h,w,c], y [n,oh,ow,o] (pools: o = c), window kh x kw, strides sh sw,
   dilations dh dw, leading pads pt pl (the trailing ones follow from oh, ow).
   flags: DPAR__WIN_EXCLUDE_PAD (avg pool divides by the in-image count). */
typedef struct dpar__win2d {
    int64_t n, h, w, c, oh, ow, o, kh, kw, sh, sw, dh, dw, pt, pl, flags;
} dpar__win2d;
enum { DPAR__WIN_EXCLUDE_PAD = 1 };
typedef char dpar__win2d_fits_op_p[sizeof(dpar__win2d) == sizeof(((dpar__op *)0)->p) ? 1 : -1];
static void dpar__win2d_put(dpar__op *op, const dpar__win2d *g) {
    memcpy(op->p, g, sizeof *g);
}
static dpar__win2d dpar__win2d_get(const dpar__op *op) {
    dpar__win2d g;
    memcpy(&g, op->p, sizeof g);
    return g;
}

typedef enum dpar__coll_kind {
    DPAR__COLL_ALL_REDUCE = 0,
    DPAR__COLL_ALL_GATHER,
    DPAR__COLL_REDUCE_SCATTER,
    DPAR__COLL_PERMUTE,
    DPAR__COLL_ALL_TO_ALL,
    DPAR__COLL_BROADCAST,
    DPAR__COLL_KIND_COUNT
} dpar__coll_kind;

typedef struct dpar__group dpar__group;

/* One member's view of one collective, after the core checked every member
   called the same thing. in[r] / out[r] are member r's buffers (all members'
   buffers are visible to every member inside one process).
   Geometry, for the gather/scatter kinds, in elements:
     ALL_GATHER:     in [outer, inner] -> out [outer, n, inner]
     REDUCE_SCATTER: in [outer, n, inner] -> out [outer, inner]
     ALL_TO_ALL:     see dpar_all_to_all; in_shape/out_shape, split_dim, concat_dim
     PERMUTE:        src_of[r] = member whose input member r receives, -1: zeros
     BROADCAST:      root */
typedef struct dpar__coll {
    dpar__coll_kind kind;
    dpar_reduce_op op;
    dpar_dtype dtype;
    int n, rank;
    const int *devices;      /* group members' device ids, in reduction order */
    dpar_buffer *const *in;  /* [n] */
    dpar_buffer *const *out; /* [n] */
    int64_t count;           /* elements of each in (ALL_REDUCE, BROADCAST, PERMUTE) */
    int64_t outer, inner;    /* ALL_GATHER / REDUCE_SCATTER */
    int ndim, split_dim, concat_dim;
    int64_t in_shape[DPAR_MAX_DIMS];
    const int *src_of; /* PERMUTE [n] */
    int root;          /* BROADCAST */
    /* a group that spans processes (only for backends with cross_id_size):
       devices[j] is -1 for members on other processes, gdevices[] the
       members' global device ids (the same list on every process) and xid
       the backend's bootstrap id made by cross_id on the process holding
       member 0 and broadcast over MPI (the same bytes on every process) */
    int cross;
    const int *gdevices;
    const void *xid;
    dpar__group *group;
    int64_t *claim; /* [n] the call's chunk counters of dpar__host_work (the core sets them) */
    void *ctx;      /* core's per-call state */
    /* issued by the device's comm thread (dpar_*_start, or a blocking call queued behind one): a GPU backend runs it
       on a stream of its own to overlap compute; 0: blocking, on the device's own thread, nothing to overlap */
    int async;
} dpar__coll;

/* Barrier of all members of the collective's group (with the runtime's
   timeout and abort handling); backends implementing `collective` use it. */
static dpar_status dpar__coll_barrier(dpar__coll *c);

typedef struct dpar__backend_iface {
    const char *name;
    dpar_backend_kind kind;
    /* true when the backend's ATTN_BWD_KV computes attention's D_i = sum_j P dP itself (CPU), and dq
       too (dst4), so dpar_attention_backward issues ATTN_BWD_Q only for dq alone; false (the safe
       default): pass 2 reads the D that ATTN_BWD_Q leaves in stats[.., 1], so pass 1 always runs first */
    bool attn_kv_computes_d;
    /* Opens `requested` devices (0: the backend's default). Sets *state, *count.
       local_index / local_count: this process's index among the processes
       of its node, and their count (0 / 1 without MPI); a GPU backend opens
       this process's share of the node's devices (see each backend).
       Errors set the last error and return a status (nothing to shut down). */
    dpar_status (*init)(const dpar_runtime_desc *desc, int requested, int local_index, int local_count, void **state,
                        int *count);
    void (*shutdown)(void *state);
    dpar_status (*device_info)(void *state, int dev, dpar_device_info *out);
    dpar_status (*thread_init)(void *state, int dev);                      /* optional */
    dpar_status (*alloc)(void *state, int dev, size_t nbytes, void **mem); /* zeroed; nbytes may be 0 */
    void (*free)(void *state, int dev, void *mem);
    dpar_status (*write)(void *state, int dev, void *mem, size_t off, const void *src, size_t nbytes);
    dpar_status (*read)(void *state, int dev, void *mem, size_t off, void *dst, size_t nbytes);
    dpar_status (*sync)(void *state, int dev);
    /* optional: host pointer to mem when the host can access it in place, else NULL */
    void *(*host_ptr)(void *state, int dev, void *mem);
    /* with host_ptr: before the host reads [off, off+n) (wait for the device, invalidate) */
    dpar_status (*host_acquire)(void *state, int dev, void *mem, size_t off, size_t nbytes);
    /* with host_ptr: after the host wrote [off, off+n) (flush) */
    dpar_status (*host_release)(void *state, int dev, void *mem, size_t off, size_t nbytes);
    dpar_status (*op)(void *state, int dev, const dpar__op *op);
    /* optional: the whole collective for member c->rank; NULL: the core's host path */
    dpar_status (*collective)(void *state, dpar__coll *c);
    /* optional (DPAR_MPI): collectives over groups that span processes.
       cross_id_size: bytes of the bootstrap id, 0 when this runtime cannot
       (then such groups take the core's host-staged MPI path); cross_id
       makes a new id. `collective` then gets c->cross, c->gdevices, c->xid. */
    size_t (*cross_id_size)(void *state);
    dpar_status (*cross_id)(void *state, void *id);
    /* optional: an asynchronous error the device ran into earlier (a hung or
       failed collective found while waiting), without waiting; it stays set
       (the runtime must be destroyed). Sets the error text. */
    dpar_status (*device_status)(void *state, int dev);
    /* optional (multi-process transport): this process's device-visibility
       setting (CUDA: CUDA_VISIBLE_DEVICES), NULL when unset; processes of a
       node whose settings differ each open every device they see, not a share */
    const char *(*visible_devices)(void);
    /* optional (multi-process transport): the physical device behind local
       device dev, its index on the node and UUID (zeros: unknown), so that
       no two processes open one device. NULL: the devices are emulated and
       may be shared (CPU). */
    void (*physical_device)(void *state, int dev, int *index, unsigned char uuid[16]);
    /* optional: fills out's gpu_util_pct, temperature_c, power_w for local
       device dev where the backend can read them (NVML), else leaves them */
    void (*health)(void *state, int dev, dpar_device_stats *out);
    /* optional, all four or none (>>graph program): prog_begin makes the ops that this thread
       issues on dev next be recorded instead of run, until prog_end (*prog: the recording, NULL
       when it holds nothing; host access to dev meanwhile fails); prog_submit runs a recording
       once more, after everything issued on dev before; prog_free waits for it and frees it. */
    dpar_status (*prog_begin)(void *state, int dev);
    dpar_status (*prog_end)(void *state, int dev, void **prog);
    dpar_status (*prog_submit)(void *state, int dev, void *prog);
    void (*prog_free)(void *state, int dev, void *prog);
    /* optional (with the four): prog_submit of recording pre, then prog, as one submission (one driver
       call, no batch of the backend's own): a replayed step's staged feed copies (>>graph feeds). NULL:
       the graph copies staged feeds op by op */
    dpar_status (*prog_submit_pre)(void *state, int dev, void *pre, void *prog);
    /* optional: write, for a buffer the host refills in turn with a few others (>>graph feeds' staged
       sets): when queued work still touches mem, waits for all of dev's submitted work, not just mem's,
       so the next refills find theirs free (one sleep per few steps, not one a step). NULL: write */
    dpar_status (*refill)(void *state, int dev, void *mem, size_t off, const void *src, size_t nbytes);
    /* optional: the times the host blocked on dev's queued work (dpar_device_stats.host_waits); NULL: 0 */
    uint64_t (*host_waits)(void *state, int dev);
} dpar__backend_iface;

static const dpar__backend_iface *dpar__cpu_iface(void);
#ifdef DPAR_VULKAN
static const dpar__backend_iface *dpar__vulkan_iface(void);
#endif
#ifdef DPAR_CUDA
static const dpar__backend_iface *dpar__cuda_iface(void);
#endif

/* ---------------------------------------------------------------------------
   Small helpers
   ------------------------------------------------------------------------ */
/* `sz` bytes aligned to `align` (a power of two) from DPAR_MALLOC: the block
   is over-allocated and the pointer DPAR_MALLOC returned is kept just below
   the aligned address, for dpar__aligned_free. NULL when out of memory. */
static void *dpar__aligned_malloc(size_t sz, size_t align) {
    DPAR_ASSERT(align && (align & (align - 1)) == 0);
    if (align < sizeof(void *)) align = sizeof(void *);
    if (sz > (size_t)-1 - align - sizeof(void *)) return NULL;
    char *raw = (char *)DPAR_MALLOC(sz + align + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t at = ((uintptr_t)(raw + sizeof(void *)) + align - 1) & ~(uintptr_t)(align - 1);
    memcpy((char *)at - sizeof(void *), &raw, sizeof raw);
    return (void *)at;
}
static void dpar__aligned_free(void *p) {
    if (!p) return;
    void *raw;
    memcpy(&raw, (char *)p - sizeof(void *), sizeof raw);
    DPAR_FREE(raw);
}
static void *dpar__calloc(size_t n, size_t sz) {
    size_t total = n * sz;
    if (sz && total / sz != n) return NULL;
    void *p = DPAR_MALLOC(total ? total : 1);
    if (p) memset(p, 0, total ? total : 1);
    return p;
}
static int64_t dpar__prod(const int64_t *s, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= s[i];
    return p;
}
/* "[2, 3]" into buf */
static const char *dpar__shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, cap - at, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}
static int dpar__env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (!end || *end || x < 0 || x > 1000000000L) return -1;
    return (int)x;
}
/* ---------------------------------------------------------------------------
   Runtime and workers
   ------------------------------------------------------------------------ */
typedef struct dpar__job dpar__job;
typedef struct dpar__worker dpar__worker;

typedef struct dpar__req_queue {
    struct dpar_request *head, *tail;
} dpar__req_queue;

struct dpar__worker {
    dpar_runtime *rt;
    int device;
    dpar__thread thread, comm_thread;
    int comm_started;
    /* async collectives of this device, executed in issue order */
    dpar__mutex qmu;
    dpar__cond qcv;
    dpar__req_queue queue;
    int pending;               /* started and not finished */
    struct dpar_request *live; /* started and not waited */
    int stop;
    dpar_buffer *norms[3]; /* dpar__clip_scale's scratch on this device, kept (dpar__norm_scratch) */
    float *norms_host;     /* the host copy of norms[0], as many floats */
};

struct dpar_runtime {
    const dpar__backend_iface *be;
    void *bstate;
    int ndev;                     /* global device count (nproc * nlocal) */
    int nlocal, local_base;       /* this process's devices: local_base .. local_base+nlocal-1 */
    int proc, nproc, local_rank;  /* MPI process index, count, rank on this node */
    int local_size;               /* processes on this node (1 without MPI) */
    int share_index, share_count; /* this process's share of the node's devices: share_index of share_count */
    int xbackend;                 /* cross-process groups use the backend's collective (every process agreed) */
    size_t xid_size;              /* its bootstrap id's bytes */
    uint64_t job_count;           /* dispatches so far (the same on every process) */
    uint64_t job_id;              /* the running dispatch's number, unique in the process (dpar__job_ids):
                                     what a thread's handle memos are keyed by */
    int caller_runs;              /* 1 local device, one process, no thread_init: a 1-device dispatch runs on
                                     the caller's thread (DPAR_CALLER_THREAD, default 1) */
    void *mpi;                    /* the transport's state (backends/dpar_mpi.h), else NULL */
    int timeout_ms;
    dpar_runtime_desc desc;
    dpar__worker *workers;
    int threads_started;
    dpar__mutex mu;
    dpar__cond cv_start, cv_done;
    uint64_t job_gen;
    int job_remaining;
    dpar__job *job;
    int shutting_down;
    dpar__mutex dispatch_mu; /* one pmap at a time */
    dpar__mutex list_mu;     /* buffers list */
    dpar_buffer *buffers;
    struct dpar_mesh *meshes;
    int thread_init_failed;
    char thread_init_msg[DPAR__ERR_LEN];
    struct dpar__obs *obs;                   /* stats and trace ids (Data-parallel helper, tracing, stats) */
    struct dpar_request *async_req;          /* the step in flight (>>async dispatch), atomic; NULL: none */
    int lent;                                /* buffers lent by dpar_vulkan_buffer_export (atomic) */
    int busy, host_io, dispatching, closing; /* calls in flight etc. (>>lifetime; under dpar__live_mu) */
};

/* Hooks into the core, defined in "Data-parallel helper, tracing, stats". */
typedef struct dpar__obs dpar__obs;
struct dpar__cargs;
static int dpar__trace_on; /* recording a trace (atomic): the one branch on the hot paths */
static double dpar__now_us(void);
static dpar_status dpar__obs_init(dpar_runtime *rt);
static void dpar__obs_free(dpar_runtime *rt);
static void dpar__obs_mem(dpar_runtime *rt, int dev, int64_t delta);
static void dpar__obs_count_op(dpar_runtime *rt, int dev);
static uint64_t dpar__obs_ops(const dpar_runtime *rt, int dev);
static void dpar__obs_add_ops(dpar_runtime *rt, int dev, uint64_t n);
enum { DPAR__OBS_COMPUTE, DPAR__OBS_COLL, DPAR__OBS_TRANSFER }; /* the stats' times */
static void dpar__obs_time(dpar_runtime *rt, int dev, int what, double t0_us);
static dpar_status dpar__trace_op(dpar__op *op);
static dpar_status dpar__coll_run(dpar_ctx *ctx, const struct dpar__cargs *a, int comm);
static void dpar__trace_event(int pid, int tid, const char *name, const char *cat, double t0, double t1, int64_t bytes);
static int dpar__trace_pid(const dpar_runtime *rt);
/* the short spin before a sleep (defined with the collectives' barrier) */
static int dpar__spin_moved(const void *word, uint64_t seen);
static int dpar__spin_zero(const void *word, uint64_t unused);
static int dpar__spin_until(int (*done)(const void *, uint64_t), const void *word, uint64_t seen, const int *abort_flag,
                            int nthreads);

static DPAR__TLS dpar__worker *dpar__self_worker;       /* non-NULL on a worker / comm thread (and on the caller's
                                                     thread while it runs a dispatch for the worker) */
static uint64_t dpar__job_ids;                          /* the last dpar_runtime.job_id given, atomic */
static DPAR__TLS struct dpar_request *dpar__async_self; /* the step this thread runs (>>async dispatch) */
/* The thread-safety rule of non-blocking dispatch and Vulkan loans: while a step of rt is in flight only
   its own threads may touch rt's objects; a lent buffer (b, may be NULL) is not touched at all. */
static dpar_status dpar__busy(const dpar_runtime *rt, const dpar_buffer *b, const char *fn) {
    struct dpar_request *a = rt ? (struct dpar_request *)DPAR__ATOMIC_LOAD(&rt->async_req) : NULL;
    if (a && !dpar__self_worker && dpar__async_self != a)
        return dpar__err(DPAR_ERR_STATE,
                         "%s: a step started with dpar_pmap_start/dpar_shard_map_start/dpar_graph_run_start is in "
                         "flight on this runtime; poll dpar_test(NULL, req, &done) and call dpar_wait(NULL, req) first",
                         fn);
    if (b && DPAR__ATOMIC_LOAD(&b->lent))
        return dpar__err(DPAR_ERR_STATE,
                         "%s: the buffer is lent to Vulkan work by dpar_vulkan_buffer_export; call "
                         "dpar_vulkan_buffer_release first",
                         fn);
    return DPAR_OK;
}
/* >>lifetime hooks (defined in >>lifetime): the set of live handles */
enum {
    DPAR__LIVE_RUNTIME = 1,
    DPAR__LIVE_MESH,
    DPAR__LIVE_ARRAY,
    DPAR__LIVE_BUFFER,
    DPAR__LIVE_GRAPH,
    DPAR__LIVE_CHILD /* an attached helper (dpar_handle_attach) */
};
static DPAR__TLS int dpar__releasing; /* this thread frees a parent's children: their destroys skip the checks */
static dpar_status dpar__live_check(const void *p, int kind, const char *fn);
static dpar_status dpar__live_add(const void *p, int kind, const void *parent, int parent_kind, void (*release)(void *),
                                  const char *fn);
static dpar_status dpar__live_add_runtime(dpar_runtime *rt);
static dpar_status dpar__live_close(const void *p, int kind, const char *fn);
static void dpar__live_forget(const void *p);
static int dpar__live_has(const void *p);
static dpar_status dpar__live_buffer_detach(const dpar_buffer *b);
static dpar_status dpar__live_arg(const void *p, int kind, const char *fn, const char *arg);
static int dpar__live_buf_ok(const dpar_buffer *b);
static int dpar__live_got(const void *p, int kind, const char *fn);
static void *dpar__handle_alloc(size_t size);
static void dpar__handle_free(void *p);
static dpar_status dpar__live_buf(const dpar_buffer *b, const char *fn, const char *arg);
static int dpar__is_local(const dpar_runtime *rt, int device) {
    return device >= rt->local_base && device < rt->local_base + rt->nlocal;
}
/* >>transport ================================================================
   The multi-process transport (backends/dpar_mpi.h with DPAR_MPI, else one
   process: no-op hooks at the end of this file). The core reaches the other
   processes only through these hooks. */
struct dpar_mesh;
typedef struct dpar__transport {
    /* before the backend opens its devices: this process's place on its node
       (rt->local_rank, local_size, share_index, share_count) */
    dpar_status (*runtime_pre)(dpar_runtime *rt, const dpar_runtime_desc *desc);
    /* after: every process learns whether all opened their devices (the
       status `opened` of this one); sets rt->proc, nproc, local_base, ndev */
    dpar_status (*runtime_init)(dpar_runtime *rt, dpar_status opened);
    void (*runtime_free)(dpar_runtime *rt);
    /* dpar_runtime_create failed with s before meeting the other processes:
       meet them now, so that they fail too instead of waiting forever */
    void (*runtime_failed)(const dpar_runtime_desc *desc, dpar_status s);
    dpar_status (*mesh_init)(struct dpar_mesh *m);
    void (*mesh_free)(struct dpar_mesh *m);
    /* before a dispatch: an error when the processes are out of step */
    dpar_status (*dispatch_begin)(dpar_runtime *rt);
    /* after it: tell the others this process returned, and agree on its
       status (`late`: a device error found after the functions returned) */
    void (*dispatch_end)(struct dpar_mesh *m, dpar__job *job, dpar_status late);
    /* a cross-process group on the backend: the leader checks the call with
       the other processes; group_xid is then the backend's bootstrap id */
    dpar_status (*coll_agree)(dpar_ctx *ctx, dpar__group *g, const char *what);
    const void *(*group_xid)(const dpar__group *g);
    /* a cross-process group on the host: the leader's part across processes */
    dpar_status (*coll)(dpar_ctx *ctx, dpar__group *g, dpar__coll *c, const char *what);
    /* process `owner` shares n bytes of buf and its status st with every process */
    dpar_status (*share)(dpar_runtime *rt, void *buf, size_t n, int owner, dpar_status st);
} dpar__transport;
static const dpar__transport *dpar__transport_get(void);
static DPAR__THREAD_FN(dpar__worker_main, arg);
static DPAR__THREAD_FN(dpar__comm_main, arg);

DPAR_API const char *dpar_backend_name(dpar_backend_kind k) {
    switch (k) {
    case DPAR_BACKEND_DEFAULT: return "default";
    case DPAR_BACKEND_CPU: return "cpu";
    case DPAR_BACKEND_VULKAN: return "vulkan";
    case DPAR_BACKEND_CUDA: return "cuda";
    }
    return "invalid";
}
DPAR_API dpar_status dpar_backend_from_name(const char *name, dpar_backend_kind *out) {
    dpar__clear_error();
    if (!name || !out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_backend_from_name: name or out is NULL");
    static const dpar_backend_kind kinds[] = { DPAR_BACKEND_DEFAULT, DPAR_BACKEND_CPU, DPAR_BACKEND_VULKAN,
                                               DPAR_BACKEND_CUDA };
    if (!*name) {
        *out = DPAR_BACKEND_DEFAULT;
        return DPAR_OK;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(name, dpar_backend_name(kinds[i]))) {
            *out = kinds[i];
            return DPAR_OK;
        }
    return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                     "dpar_backend_from_name: '%s' is not a backend; use cpu, vulkan, cuda or default", name);
}

static const dpar__backend_iface *dpar__backend_by_kind(dpar_backend_kind k) {
    switch (k) {
    case DPAR_BACKEND_CPU: return dpar__cpu_iface();
#ifdef DPAR_VULKAN
    case DPAR_BACKEND_VULKAN: return dpar__vulkan_iface();
#endif
#ifdef DPAR_CUDA
    case DPAR_BACKEND_CUDA: return dpar__cuda_iface();
#endif
    default: return NULL;
    }
}

static void dpar__runtime_free(dpar_runtime *rt) {
    if (!rt) return;
    if (rt->workers) {
        if (rt->threads_started) {
            dpar__mutex_lock(&rt->mu);
            rt->shutting_down = 1;
            dpar__cond_broadcast(&rt->cv_start);
            dpar__mutex_unlock(&rt->mu);
            for (int i = 0; i < rt->threads_started; i++) dpar__thread_join(rt->workers[i].thread);
        }
        for (int i = 0; i < rt->nlocal; i++) {
            dpar__worker *w = &rt->workers[i];
            if (w->comm_started) {
                dpar__mutex_lock(&w->qmu);
                w->stop = 1;
                dpar__cond_broadcast(&w->qcv);
                dpar__mutex_unlock(&w->qmu);
                dpar__thread_join(w->comm_thread);
            }
            dpar__mutex_destroy(&w->qmu);
            dpar__cond_destroy(&w->qcv);
            DPAR_FREE(w->norms_host); /* its device buffers went with the runtime's */
        }
        DPAR_FREE(rt->workers);
    }
    if (rt->be && rt->bstate) rt->be->shutdown(rt->bstate);
    dpar__transport_get()->runtime_free(rt);
    dpar__mutex_destroy(&rt->mu);
    dpar__cond_destroy(&rt->cv_start);
    dpar__cond_destroy(&rt->cv_done);
    dpar__mutex_destroy(&rt->dispatch_mu);
    dpar__mutex_destroy(&rt->list_mu);
    dpar__obs_free(rt);
    dpar__handle_free(rt);
}

/* *met: set once this process reached the other processes (the transport) */
/* >>runtime create ==========================================================
   Defaults (one place), the backend, its devices (with the other processes
   through the transport), then one worker thread per local device. */

/* The integer DPAR_* variables and their ranges (DPAR_BACKEND and DPAR_TRACE
   are checked where they are read). dpar_runtime_create checks them all
   first, so a value read later (the spin loop, the CPU backend) is valid. */
static const struct dpar__env_range {
    const char *name, *what;
    long lo, hi;
} dpar__env_ranges[] = {
    { "DPAR_DEVICES", "a device count", 1, DPAR_MAX_DEVICES },
    { "DPAR_TIMEOUT_MS", "a collective timeout in milliseconds", 1, 1000000000L },
    { "DPAR_SPIN_US", "microseconds to spin before sleeping", 0, 1000000L },
    { "DPAR_CPU_THREADS", "CPU backend threads per device", 1, 64 },
    { "DPAR_ALLOW_SHARED_DEVICE", "a flag (1: MPI ranks of a node may share a device)", 0, 1 },
    { "DPAR_MPI_BACKEND_COLLECTIVES", "a flag (0: groups across processes on the host-staged MPI path)", 0, 1 },
    { "DPAR_GRAPH_ASYNC_BYTES", "a gradient size in bytes", 0, 2000000000L },
    { "DPAR_GRAPH_ALIAS", "a flag (0: a graph node's output never takes its input's buffer)", 0, 1 },
    { "DPAR_CALLER_THREAD", "a flag (0: a 1-device runtime's dispatches run on its worker thread)", 0, 1 },
};
/* DPAR_ERR_INVALID_ARGUMENT naming the first variable set to a value that is
   not a decimal integer in its range, the value and the range. */
static dpar_status dpar__env_check(const char *where) {
    for (size_t i = 0; i < sizeof dpar__env_ranges / sizeof dpar__env_ranges[0]; i++) {
        const struct dpar__env_range *r = &dpar__env_ranges[i];
        const char *v = getenv(r->name);
        if (!v || !*v) continue;
        char *end = NULL;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno == ERANGE || x < r->lo || x > r->hi)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "%s: %s='%.64s' is not %s in %ld..%ld; set it in that range or unset it for the default",
                             where, r->name, v, r->what, r->lo, r->hi);
    }
    return DPAR_OK;
}

/* *out = *in (or zeros) with every zero the core owns resolved: backend from
   DPAR_BACKEND (still DEFAULT: the best available), num_devices from
   DPAR_DEVICES (still 0: all the backend has), timeout_ms from DPAR_TIMEOUT_MS
   else 60000. Backend settings (.vulkan, ...) are resolved by their backend. */
static dpar_status dpar__runtime_desc_defaults(const dpar_runtime_desc *in, dpar_runtime_desc *out) {
    memset(out, 0, sizeof *out);
    if (in) *out = *in;
    dpar_status s = dpar__env_check("dpar_runtime_create");
    if (s) return s;
    if (out->backend == DPAR_BACKEND_DEFAULT) {
        const char *env = getenv("DPAR_BACKEND");
        if (env && *env && dpar_backend_from_name(env, &out->backend) != DPAR_OK)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_runtime_create: DPAR_BACKEND='%s' is not a backend; use cpu, vulkan or cuda", env);
    }
    if ((int)out->backend < 0 || out->backend > DPAR_BACKEND_CUDA)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_runtime_create: desc.backend = %d is not a dpar_backend_kind",
                         (int)out->backend);
    if (out->num_devices == 0) out->num_devices = dpar__env_int("DPAR_DEVICES", 0); /* in range: env_check */
    if (out->num_devices < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_runtime_create: desc.num_devices = %d is negative; use 0 "
                         "(default) or a positive count",
                         out->num_devices);
    if (out->num_devices > DPAR_MAX_DEVICES)
        return dpar__err(DPAR_ERR_DEVICE_COUNT,
                         "dpar_runtime_create: %d devices requested but at most %d are supported "
                         "(DPAR_MAX_DEVICES)",
                         out->num_devices, (int)DPAR_MAX_DEVICES);
    if (out->timeout_ms == 0) out->timeout_ms = dpar__env_int("DPAR_TIMEOUT_MS", 60000);
    if (out->timeout_ms < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_runtime_create: desc.timeout_ms = %d is negative",
                         out->timeout_ms);
    return DPAR_OK;
}

/* The backend of desc->backend, or for DEFAULT the best available: CUDA, then
   Vulkan on a hardware GPU, then the CPU. */
static dpar_status dpar__runtime_pick_backend(const dpar_runtime_desc *desc, const dpar__backend_iface **out) {
    dpar_backend_kind kind = desc->backend;
    *out = NULL;
    if (kind != DPAR_BACKEND_DEFAULT) {
        *out = dpar__backend_by_kind(kind);
        if (!*out)
            return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                             "dpar_runtime_create: the %s backend is not compiled in; "
                             "define DPAR_%s before the implementation (build this project with `make %s=1`)",
                             dpar_backend_name(kind), kind == DPAR_BACKEND_VULKAN ? "VULKAN" : "CUDA",
                             kind == DPAR_BACKEND_VULKAN ? "VULKAN" : "CUDA");
        return DPAR_OK;
    }
    dpar_backend_kind order[3] = { DPAR_BACKEND_CUDA, DPAR_BACKEND_VULKAN, DPAR_BACKEND_CPU };
    for (int i = 0; i < 3 && !*out; i++) {
        const dpar__backend_iface *cand = dpar__backend_by_kind(order[i]);
        if (!cand) continue;
        if (order[i] == DPAR_BACKEND_CPU) {
            *out = cand;
            break;
        }
        void *st = NULL;
        int cnt = 0;
        if (cand->init(desc, 0, 0, 1, &st, &cnt) == DPAR_OK) {
            /* a software GPU (llvmpipe) is slower than the CPU backend on the same cores: not "best" */
            dpar_device_info info;
            memset(&info, 0, sizeof info);
            int soft = cnt > 0 && cand->device_info(st, 0, &info) == DPAR_OK && info.runs_on_cpu;
            cand->shutdown(st);
            if (!soft) *out = cand;
        }
    }
    dpar__clear_error();
    return DPAR_OK;
}

/* Opens this process's share of the backend's devices; with the transport,
   every process learns whether all did. *count: local devices. */
static dpar_status dpar__runtime_open(dpar_runtime *rt, int *count, int *met) {
    const dpar_runtime_desc *desc = &rt->desc;
    int requested = desc->num_devices;
    /* the node-local rank picks this process's share of the node's devices */
    *met = 1;
    dpar_status s = dpar__transport_get()->runtime_pre(rt, desc);
    if (s != DPAR_OK) return s;
    s = rt->be->init(desc, requested, rt->share_index, rt->share_count, &rt->bstate, count);
    if (s != DPAR_OK)
        rt->bstate = NULL;
    else if (requested && *count != requested)
        s = dpar__err(DPAR_ERR_DEVICE_COUNT, "dpar_runtime_create: %d devices requested but the %s backend has %d",
                      requested, rt->be->name, *count);
    rt->ndev = rt->nlocal = s ? 0 : *count;
    rt->nproc = 1;
    /* every process learns whether all opened their devices */
    return dpar__transport_get()->runtime_init(rt, s);
}

/* One worker thread per local device; returns once each ran its thread_init. */
static dpar_status dpar__runtime_start_workers(dpar_runtime *rt, int count) {
    rt->workers = (dpar__worker *)dpar__calloc((size_t)count, sizeof(dpar__worker));
    if (!rt->workers) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_runtime_create: out of host memory");
    for (int i = 0; i < count; i++) {
        rt->workers[i].rt = rt;
        rt->workers[i].device = rt->local_base + i;
        dpar__mutex_init(&rt->workers[i].qmu);
        dpar__cond_init(&rt->workers[i].qcv);
    }
    for (int i = 0; i < count; i++) {
        if (dpar__thread_start(&rt->workers[i].thread, dpar__worker_main, &rt->workers[i]) != 0)
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_runtime_create: could not start worker thread %d", i);
        rt->threads_started = i + 1;
    }
    /* wait for each worker's thread_init */
    dpar__mutex_lock(&rt->mu);
    while (rt->job_remaining < count && !rt->thread_init_failed) dpar__cond_wait(&rt->cv_done, &rt->mu);
    rt->job_remaining = 0;
    int failed = rt->thread_init_failed;
    dpar__mutex_unlock(&rt->mu);
    if (failed) return dpar__err(DPAR_ERR_BACKEND, "%s", rt->thread_init_msg);
    return DPAR_OK;
}

/* *met: set once this process reached the other processes (transport) */
static dpar_status dpar__runtime_create(const dpar_runtime_desc *desc_in, dpar_runtime **out, int *met) {
    dpar__clear_error();
    if (!out)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_runtime_create: `out` is NULL; pass the address of a "
                                                    "dpar_runtime pointer");
    *out = NULL;
    dpar_runtime_desc desc;
    const dpar__backend_iface *be = NULL;
    dpar_status s = dpar__runtime_desc_defaults(desc_in, &desc);
    if (!s) s = dpar__runtime_pick_backend(&desc, &be);
    if (s) return s;

    dpar_runtime *rt = (dpar_runtime *)dpar__handle_alloc(sizeof *rt);
    if (!rt) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_runtime_create: out of host memory");
    dpar__mutex_init(&rt->mu);
    dpar__cond_init(&rt->cv_start);
    dpar__cond_init(&rt->cv_done);
    dpar__mutex_init(&rt->dispatch_mu);
    dpar__mutex_init(&rt->list_mu);
    rt->be = be;
    rt->timeout_ms = desc.timeout_ms;
    rt->desc = desc;
    rt->local_size = 1;
    rt->share_count = 1;
    int count = 0;
    s = dpar__runtime_open(rt, &count, met);
    if (!s) s = dpar__runtime_start_workers(rt, count);
    /* in range: checked above (dpar__env_check) */
    rt->caller_runs = rt->nlocal == 1 && rt->nproc <= 1 && !be->thread_init && dpar__env_int("DPAR_CALLER_THREAD", 1);
    if (!s) s = dpar__obs_init(rt);
    if (!s) s = dpar__live_add_runtime(rt);
    if (s) {
        /* freeing may overwrite the error text (worker shutdown, the transport): keep it */
        char msg[DPAR__ERR_LEN];
        memcpy(msg, dpar__err_text, sizeof msg);
        dpar__runtime_free(rt);
        return dpar__err(s, "%s", msg);
    }
    *out = rt;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_runtime_create(const dpar_runtime_desc *desc, dpar_runtime **out) {
    int met = 0;
    dpar_status s = dpar__runtime_create(desc, out, &met);
    /* failed before meeting the other processes (bad argument on this rank
       only?): meet them now with the failure */
    if (s && !met) dpar__transport_get()->runtime_failed(desc, s);
    return s;
}

static void dpar__mesh_free(struct dpar_mesh *m);
static void dpar__buffer_free(dpar_buffer *b);

static dpar_status dpar__runtime_destroy(void *obj);
DPAR_API dpar_status dpar_runtime_destroy(dpar_runtime *rt) {
    return dpar__destroy_kept(dpar__runtime_destroy, rt);
}
static dpar_status dpar__runtime_destroy(void *obj) {
    dpar_runtime *rt = (dpar_runtime *)obj;
    if (!rt) return DPAR_OK;
    if (dpar__self_worker)
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_runtime_destroy: called inside a pmap/shard_map function; nothing was destroyed "
                         "(destroy the runtime after the dispatch returns)");
    if (dpar__live_check(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_destroy")) return DPAR_ERR_STATE;
    dpar_status busy = dpar__busy(rt, NULL, "dpar_runtime_destroy");
    if (busy) return busy;
    if (DPAR__ATOMIC_LOAD(&rt->lent))
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_runtime_destroy: %d buffer(s) are lent by dpar_vulkan_buffer_export; nothing was "
                         "destroyed (call dpar_vulkan_buffer_release for each first)",
                         (int)DPAR__ATOMIC_LOAD(&rt->lent));
    dpar_status s = dpar__live_close(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_destroy");
    if (s) return s;
    dpar__releasing++; /* the children's own destroys, called by their release hooks, skip the checks */
    while (rt->meshes) {
        dpar__live_forget(rt->meshes);
        dpar__mesh_free(rt->meshes);
    }
    while (rt->buffers) dpar__buffer_free(rt->buffers);
    dpar__releasing--;
    dpar__runtime_free(rt);
    return DPAR_OK;
}
DPAR_API int dpar_runtime_device_count(const dpar_runtime *rt) {
    return dpar__live_got(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_device_count") ? rt->ndev : 0;
}
DPAR_API int dpar_runtime_process_index(const dpar_runtime *rt) {
    return dpar__live_got(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_process_index") ? rt->proc : 0;
}
DPAR_API int dpar_runtime_process_count(const dpar_runtime *rt) {
    return dpar__live_got(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_process_count") ? rt->nproc : 1;
}
DPAR_API void dpar_runtime_local_devices(const dpar_runtime *rt, int *first, int *count) {
    int ok = dpar__live_got(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_local_devices");
    if (first) *first = ok ? rt->local_base : 0;
    if (count) *count = ok ? rt->nlocal : 0;
}
DPAR_API dpar_backend_kind dpar_runtime_backend(const dpar_runtime *rt) {
    return dpar__live_got(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_backend") ? rt->be->kind : DPAR_BACKEND_DEFAULT;
}

DPAR_API dpar_status dpar_runtime_device_info(const dpar_runtime *rt, int device, dpar_device_info *out) {
    dpar__clear_error();
    if (dpar__live_arg(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_device_info", "the runtime")) return DPAR_ERR_STATE;
    if (!rt || !out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_runtime_device_info: runtime or out is NULL");
    if (device < 0 || device >= rt->ndev)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_runtime_device_info: device %d is out of range; the runtime has %d device%s (0..%d)",
                         device, rt->ndev, rt->ndev == 1 ? "" : "s", rt->ndev - 1);
    memset(out, 0, sizeof *out);
    dpar_status s = DPAR_OK;
    if (device >= rt->local_base && device < rt->local_base + rt->nlocal) {
        s = rt->be->device_info(rt->bstate, device - rt->local_base, out);
    } else {
        snprintf(out->name, sizeof out->name, "%s device %d of process %d", rt->be->name, device % rt->nlocal,
                 device / rt->nlocal);
        snprintf(out->vendor, sizeof out->vendor, "remote");
    }
    out->backend = rt->be->kind;
    out->index = device;
    return s;
}

/* ---------------------------------------------------------------------------
   Buffers
   ------------------------------------------------------------------------ */
/* The largest dimension and element count of a buffer or graph value */
#define DPAR__MAX_DIM ((int64_t)1 << 40)
static dpar_status dpar__check_shape(const char *where, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > DPAR_MAX_DIMS)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: ndim = %d is out of range 0..%d", where, ndim,
                         (int)DPAR_MAX_DIMS);
    if (ndim > 0 && !shape) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: shape is NULL but ndim = %d", where, ndim);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dimension %d is %lld; sizes must be >= 0", where, i,
                             (long long)shape[i]);
        if (shape[i] > DPAR__MAX_DIM)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dimension %d is %lld, which is too large", where, i,
                             (long long)shape[i]);
    }
    /* the element count, without overflowing: a zero dim makes it 0 */
    int zero = 0;
    for (int i = 0; i < ndim; i++) zero |= shape[i] == 0;
    if (zero) return DPAR_OK;
    const int64_t lim = DPAR__MAX_DIM;
    int64_t p = 1;
    for (int i = 0; i < ndim; i++) {
        if (p > lim / shape[i]) {
            char sh[200];
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: shape %s has more than 2^40 elements, which is too large",
                             where, dpar__shape_str(sh, sizeof sh, ndim, shape));
        }
        p *= shape[i];
    }
    return DPAR_OK;
}

DPAR_API dpar_status dpar_buffer_create(dpar_runtime *rt, int device, dpar_dtype dtype, int ndim, const int64_t *shape,
                                        dpar_buffer **out) {
    dpar__clear_error();
    if (!out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_create: `out` is NULL");
    *out = NULL;
    if (!rt) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_create: runtime is NULL");
    if (dpar__live_check(rt, DPAR__LIVE_RUNTIME, "dpar_buffer_create")) return DPAR_ERR_STATE;
    if (device < 0 || device >= rt->ndev)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_buffer_create: device %d is out of range; the runtime has %d device%s", device, rt->ndev,
                         rt->ndev == 1 ? "" : "s");
    if (device < rt->local_base || device >= rt->local_base + rt->nlocal)
        return dpar__err(
            DPAR_ERR_INVALID_ARGUMENT,
            "dpar_buffer_create: device %d belongs to process %d, not to this process (%d, devices %d..%d)", device,
            device / rt->nlocal, rt->proc, rt->local_base, rt->local_base + rt->nlocal - 1);
    if (dpar_dtype_size(dtype) == 0)
        return dpar__err(DPAR_ERR_DTYPE, "dpar_buffer_create: dtype %d is not a dpar_dtype", (int)dtype);
    if (dtype == DPAR_F64 && rt->be->kind != DPAR_BACKEND_CPU) /* no backend op could read it (>>f64 api) */
        return dpar__err(DPAR_ERR_DTYPE,
                         "dpar_buffer_create: the %s backend has no f64 buffers or ops (f64 runs on the cpu backend); "
                         "use f32 here, or a cpu runtime for f64",
                         rt->be->name);
    dpar_status s = dpar__check_shape("dpar_buffer_create", ndim, shape);
    if (s) return s;
    dpar_buffer *b = (dpar_buffer *)dpar__handle_alloc(sizeof *b);
    if (!b) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_buffer_create: out of host memory");
    b->rt = rt;
    b->device = device - rt->local_base;
    b->gdev = device;
    b->dtype = dtype;
    b->ndim = ndim;
    for (int i = 0; i < ndim; i++) b->shape[i] = shape[i];
    b->count = dpar__prod(shape, ndim);
    b->nbytes = (size_t)b->count * dpar_dtype_size(dtype);
    s = rt->be->alloc(rt->bstate, b->device, b->nbytes, &b->mem);
    if (s != DPAR_OK) {
        size_t nb = b->nbytes;
        DPAR_FREE(b);
        if (!dpar__err_text[0])
            dpar__err(s, "dpar_buffer_create: %s backend could not allocate %zu bytes on device %d", rt->be->name, nb,
                      device);
        return s;
    }
    if ((s = dpar__live_add(b, DPAR__LIVE_BUFFER, rt, DPAR__LIVE_RUNTIME, NULL, "dpar_buffer_create"))) {
        rt->be->free(rt->bstate, b->device, b->mem);
        DPAR_FREE(b);
        return s;
    }
    dpar__mutex_lock(&rt->list_mu);
    b->next = rt->buffers;
    if (rt->buffers) rt->buffers->prev = b;
    rt->buffers = b;
    dpar__obs_mem(rt, b->device, (int64_t)b->nbytes);
    dpar__mutex_unlock(&rt->list_mu);
    *out = b;
    return DPAR_OK;
}

static dpar_status dpar__buffer_destroy(void *obj);
DPAR_API dpar_status dpar_buffer_destroy(dpar_buffer *b) {
    return dpar__destroy_kept(dpar__buffer_destroy, b);
}
static dpar_status dpar__buffer_destroy(void *obj) {
    dpar_buffer *b = (dpar_buffer *)obj;
    if (!b) return DPAR_OK;
    if (dpar__live_check(b, DPAR__LIVE_BUFFER, "dpar_buffer_destroy")) return DPAR_ERR_STATE;
    dpar_status s = dpar__busy(b->rt, b, "dpar_buffer_destroy");
    if (!s) s = dpar__live_buffer_detach(b);
    if (s) return s;
    dpar__buffer_free(b);
    return DPAR_OK;
}
static void dpar__buffer_free(dpar_buffer *b) {
    dpar_runtime *rt = b->rt;
    dpar__live_forget(b); /* an array's shard, or a leftover freed with its runtime */
    dpar__mutex_lock(&rt->list_mu);
    if (b->prev)
        b->prev->next = b->next;
    else
        rt->buffers = b->next;
    if (b->next) b->next->prev = b->prev;
    dpar__obs_mem(rt, b->device, -(int64_t)b->nbytes);
    dpar__mutex_unlock(&rt->list_mu);
    rt->be->free(rt->bstate, b->device, b->mem);
    dpar__handle_free(b);
}
DPAR_API dpar_dtype dpar_buffer_dtype(const dpar_buffer *b) {
    return dpar__live_got(b, DPAR__LIVE_BUFFER, "dpar_buffer_dtype") ? b->dtype : DPAR_DTYPE_COUNT;
}
DPAR_API int dpar_buffer_ndim(const dpar_buffer *b) {
    return dpar__live_got(b, DPAR__LIVE_BUFFER, "dpar_buffer_ndim") ? b->ndim : -1;
}
DPAR_API int64_t dpar_buffer_dim(const dpar_buffer *b, int i) {
    return (dpar__live_got(b, DPAR__LIVE_BUFFER, "dpar_buffer_dim") && i >= 0 && i < b->ndim) ? b->shape[i] : -1;
}
DPAR_API int64_t dpar_buffer_count(const dpar_buffer *b) {
    return dpar__live_got(b, DPAR__LIVE_BUFFER, "dpar_buffer_count") ? b->count : 0;
}
DPAR_API size_t dpar_buffer_nbytes(const dpar_buffer *b) {
    return dpar__live_got(b, DPAR__LIVE_BUFFER, "dpar_buffer_nbytes") ? b->nbytes : 0;
}
DPAR_API int dpar_buffer_device(const dpar_buffer *b) {
    return dpar__live_got(b, DPAR__LIVE_BUFFER, "dpar_buffer_device") ? b->gdev : -1;
}

DPAR_API dpar_status dpar_buffer_reshape(dpar_buffer *b, int ndim, const int64_t *shape) {
    dpar__clear_error();
    if (!b) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_reshape: buffer is NULL");
    if (dpar__live_buf(b, "dpar_buffer_reshape", "the buffer")) return DPAR_ERR_STATE;
    dpar_status s = dpar__check_shape("dpar_buffer_reshape", ndim, shape);
    if (s) return s;
    int64_t c = dpar__prod(shape, ndim);
    if (c != b->count) {
        char a[160], bb[160];
        return dpar__err(DPAR_ERR_SHAPE,
                         "dpar_buffer_reshape: new shape %s has %lld elements but the buffer %s has %lld",
                         dpar__shape_str(a, sizeof a, ndim, shape), (long long)c,
                         dpar__shape_str(bb, sizeof bb, b->ndim, b->shape), (long long)b->count);
    }
    b->ndim = ndim;
    for (int i = 0; i < ndim; i++) b->shape[i] = shape[i];
    return DPAR_OK;
}

/* Whether the calling thread may touch b's memory: b's own device's worker,
   or any other thread between dispatches of b's runtime (compares, no lock:
   this is on the ops' path). */
static dpar_status dpar__buffer_owner(const dpar_buffer *b, const char *fn) {
    const dpar__worker *w = dpar__self_worker;
    if (w && w->rt == b->rt) {
        if (DPAR__LIKELY(w->device == b->gdev)) return DPAR_OK;
        return dpar__err(DPAR_ERR_STATE,
                         "%s: the buffer lives on device %d but this is device %d's worker; inside fn use only this "
                         "device's buffers (dpar_ctx_arg, dpar_ctx_buffer) and move data with collectives",
                         fn, b->gdev, w->device);
    }
    if (DPAR__UNLIKELY(DPAR__ATOMIC_LOAD(&b->rt->dispatching) != 0))
        return dpar__err(DPAR_ERR_STATE,
                         "%s: a pmap/shard_map is running on the buffer's runtime; from this thread use its buffers "
                         "between dispatches (inside fn, its device's worker does)",
                         fn);
    return DPAR_OK;
}

/* The checks of a host access to bytes [offset, offset + nbytes) of b (not NULL), in this order: b is live,
   not in use by a running pmap (when busy is set), this thread's to use, and the span lies inside it. */
static dpar_status dpar__buffer_span(const dpar_buffer *b, size_t offset, size_t nbytes, const char *fn, bool busy) {
    if (dpar__live_buf(b, fn, "the buffer")) return DPAR_ERR_STATE;
    dpar_status s = busy ? dpar__busy(b->rt, b, fn) : DPAR_OK;
    if (s) return s;
    if (dpar__buffer_owner(b, fn)) return DPAR_ERR_STATE;
    if (offset > b->nbytes || nbytes > b->nbytes - offset)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: bytes [%zu, %zu) are outside the %zu-byte buffer", fn, offset,
                         offset + nbytes, b->nbytes);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_buffer_write(dpar_buffer *b, size_t offset, const void *src, size_t nbytes) {
    dpar__clear_error();
    if (!b || (!src && nbytes))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_write: buffer or source is NULL");
    dpar_status c = dpar__buffer_span(b, offset, nbytes, "dpar_buffer_write", true);
    if (c || !nbytes) return c;
    double t0 = dpar__now_us();
    dpar_status s = b->rt->be->write(b->rt->bstate, b->device, b->mem, offset, src, nbytes);
    dpar__obs_time(b->rt, b->device, DPAR__OBS_TRANSFER, t0);
    return s;
}
DPAR_API dpar_status dpar_buffer_read(const dpar_buffer *b, size_t offset, void *dst, size_t nbytes) {
    dpar__clear_error();
    if (!b || (!dst && nbytes))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_read: buffer or destination is NULL");
    dpar_status c = dpar__buffer_span(b, offset, nbytes, "dpar_buffer_read", true);
    if (c || !nbytes) return c;
    double t0 = dpar__now_us();
    dpar_status s = b->rt->be->read(b->rt->bstate, b->device, b->mem, offset, dst, nbytes);
    dpar__obs_time(b->rt, b->device, DPAR__OBS_TRANSFER, t0);
    return s;
}
/* map / unmap: the checks, then the backend's host view (NULL: not host-visible) */
static dpar_status dpar__buffer_view(const dpar_buffer *b, size_t offset, size_t nbytes, const char *fn, char **host) {
    *host = NULL;
    if (!b) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", fn);
    dpar_status c = dpar__buffer_span(b, offset, nbytes, fn, false);
    if (c) return c;
    const dpar__backend_iface *be = b->rt->be;
    *host = be->host_ptr ? (char *)be->host_ptr(b->rt->bstate, b->device, b->mem) : NULL;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_buffer_map(dpar_buffer *b, size_t offset, size_t nbytes, bool read, void **ptr) {
    dpar__clear_error();
    if (!ptr) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_buffer_map: ptr is NULL");
    *ptr = NULL;
    char *h;
    dpar_status s = dpar__buffer_view(b, offset, nbytes, "dpar_buffer_map", &h);
    if (!s) s = dpar__busy(b->rt, b, "dpar_buffer_map");
    if (s || !h) return s;
    const dpar__backend_iface *be = b->rt->be;
    if (read && nbytes && be->host_acquire) s = be->host_acquire(b->rt->bstate, b->device, b->mem, offset, nbytes);
    if (s) return s;
    *ptr = h + offset;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_buffer_unmap(dpar_buffer *b, size_t offset, size_t nbytes, bool written) {
    dpar__clear_error();
    char *h;
    dpar_status s = dpar__buffer_view(b, offset, nbytes, "dpar_buffer_unmap", &h);
    if (s || !h || !written || !nbytes || !b->rt->be->host_release) return s;
    return b->rt->be->host_release(b->rt->bstate, b->device, b->mem, offset, nbytes);
}
DPAR_API dpar_status dpar_runtime_device_sync(dpar_runtime *rt, int device) {
    dpar__clear_error();
    if (dpar__live_arg(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_device_sync", "the runtime")) return DPAR_ERR_STATE;
    if (!rt || device < rt->local_base || device >= rt->local_base + rt->nlocal)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_runtime_device_sync: device %d is not a device of this process", device);
    return rt->be->sync(rt->bstate, device - rt->local_base);
}
/* ---------------------------------------------------------------------------
   Mesh and axis groups
   ------------------------------------------------------------------------ */
/* Groups are keyed by the axes as written. Keys below DPAR__MASKS are axis masks (the axes in mesh
   order); the keys above are the same sets written in another order, because JAX ranks a group
   row-major over the axis tuple as written: axis_index(("b","a")) differs from axis_index(("a","b")).
   DPAR__GROUP_KEYS counts the ordered lists of distinct axes: sum over k of 4!/(4-k)! = 65. */
enum { DPAR__MASKS = 1 << DPAR_MAX_AXES, DPAR__GROUP_KEYS = 65 };

typedef struct dpar__post { /* what one member asked for, checked against the others */
    int kind, op, dtype;
    int64_t in_count, out_count;
    int dim, tiled, split_dim, concat_dim, root;
    uint64_t pairs_hash;
    int ndim;                     /* the input's shape: all_gather, psum_scatter and */
    int64_t shape[DPAR_MAX_DIMS]; /* all_to_all lay data out by it, so members must agree */
    const char *name;
} dpar__post;

struct dpar__group {
    dpar__mutex mu;
    dpar__cond cv;
    struct dpar_mesh *mesh;
    int n;
    int *devices; /* [n] in reduction order */
    uint64_t gen; /* barrier generation (atomic: waiters spin on it) */
    int arrived;
    int sleepers;        /* members blocked in the condition wait */
    unsigned char *here; /* [n] arrived in the current barrier */
    uint64_t seq;        /* collectives completed, for messages */
    /* posts, in_ptr, out_ptr and claim hold two calls' records, [2n]: call c of a
       group on one process uses half c % 2 (dpar__coll_match). Its host path ends
       without a barrier (each member waits for the work, not for the others to
       return), so a member may post call c + 1 while another still reads call
       c's records; call c + 2 waits in its entry barrier for every member to
       have left call c. A group across processes uses half 0 only. */
    dpar__post *posts;                 /* [2n] */
    dpar_buffer **in_bufs, **out_bufs; /* [n] */
    void **in_ptr, **out_ptr;          /* [2n] host-visible views used by the host path */
    void **stage;                      /* [n] per-member host staging (grown on demand) */
    size_t *stage_cap;                 /* [n] */
    int nlocal;                        /* members on this process (== n without MPI) */
    int leader;                        /* first local member's rank: does the cross-process part */
    int cross;                         /* members on more than one process */
    void **xin_ptr;                    /* [n] every member's input as seen by this process (cross path) */
    dpar_status xstatus;               /* leader's cross-process result, read by the other local members */
    char *xmsg;                        /* its error text (DPAR__ERR_LEN) */
    void *mpi;                         /* the transport's per-group state (backends/dpar_mpi.h) */
    int64_t *claim;                    /* [2n] chunks of slice j claimed in the host work (atomic) */
    int64_t done[2];                   /* chunks of the host work finished, per half (atomic) */
    uint64_t *calls;                   /* [n] collectives member r entered (its own; 0 at each dispatch's end) */
};

struct dpar_mesh {
    dpar_runtime *rt;
    int ndim;
    int shape[DPAR_MAX_AXES];
    char names[DPAR_MAX_AXES][DPAR_NAME_LEN];
    int size;
    int devices[DPAR_MAX_DEVICES];         /* position -> device */
    int pos_of[DPAR_MAX_DEVICES];          /* device -> position, -1 if absent */
    dpar__group *groups[DPAR__GROUP_KEYS]; /* per group key: size / group size groups */
    int ngroups[DPAR__GROUP_KEYS];
    int key_n[DPAR__GROUP_KEYS];                             /* axes of each key, */
    unsigned char key_axes[DPAR__GROUP_KEYS][DPAR_MAX_AXES]; /* in the order written */
    unsigned key_mask[DPAR__GROUP_KEYS];
    int nkeys;
    struct dpar_array *arrays; /* arrays of this mesh, freed with it */
    struct dpar_mesh *prev, *next;
    int closing; /* being destroyed: its handles are refused (>>lifetime) */
};

static void dpar__pos_to_coords(const dpar_mesh *m, int pos, int *coords) {
    for (int a = m->ndim - 1; a >= 0; a--) {
        coords[a] = pos % m->shape[a];
        pos /= m->shape[a];
    }
}
static int dpar__coords_to_pos(const dpar_mesh *m, const int *coords) {
    int pos = 0;
    for (int a = 0; a < m->ndim; a++) pos = pos * m->shape[a] + coords[a];
    return pos;
}
static const char *dpar__axes_list(const dpar_mesh *m, char *buf, size_t cap) {
    size_t at = 0;
    snprintf(buf, cap, "%s", m->ndim ? "" : "none"); /* not "axes: )" */
    for (int a = 0; a < m->ndim && at < cap; a++)
        at += (size_t)snprintf(buf + at, cap - at, a ? ", %s" : "%s", m->names[a]);
    return buf;
}
/* Parses "a" or "a,b" (spaces allowed) into a mask; order[] gets the axes in
   the order written (may be NULL). Errors name the axis and list the mesh axes. */
static dpar_status dpar__parse_axes(const dpar_mesh *m, const char *where, const char *axes, unsigned *mask, int *order,
                                    int *norder) {
    char list[160];
    *mask = 0;
    if (norder) *norder = 0;
    if (!axes || !*axes)
        return dpar__err(DPAR_ERR_UNKNOWN_AXIS, "%s: no axis name given; name one of the mesh axes (axes: %s)", where,
                         dpar__axes_list(m, list, sizeof list));
    const char *p = axes;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        const char *q = p;
        while (*q && *q != ',' && *q != ' ') q++;
        size_t len = (size_t)(q - p);
        int found = -1;
        for (int a = 0; a < m->ndim; a++)
            if (strlen(m->names[a]) == len && !strncmp(m->names[a], p, len)) found = a;
        if (found < 0)
            return dpar__err(DPAR_ERR_UNKNOWN_AXIS, "%s: axis '%.*s' is not in the mesh (axes: %s)", where, (int)len, p,
                             dpar__axes_list(m, list, sizeof list));
        if (*mask & (1u << found))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: axis '%s' is named twice in \"%s\"", where,
                             m->names[found], axes);
        *mask |= 1u << found;
        if (order) order[(*norder)++] = found;
        p = q;
    }
    if (!*mask)
        return dpar__err(DPAR_ERR_UNKNOWN_AXIS, "%s: no axis name in \"%s\" (axes: %s)", where, axes,
                         dpar__axes_list(m, list, sizeof list));
    return DPAR_OK;
}
static int dpar__mask_size(const dpar_mesh *m, unsigned mask) {
    int s = 1;
    for (int a = 0; a < m->ndim; a++)
        if (mask & (1u << a)) s *= m->shape[a];
    return s;
}
/* Group id (row-major over the axes outside the key's, in mesh order) and rank (row-major over the
   key's axes in the order written). A mask is its own key. */
static void dpar__group_of(const dpar_mesh *m, int key, int pos, int *gid, int *rank) {
    int c[DPAR_MAX_AXES], g = 0, r = 0;
    DPAR_ASSERT(pos >= 0 && pos < m->size && key > 0 && key < m->nkeys);
    dpar__pos_to_coords(m, pos, c);
    for (int a = 0; a < m->ndim; a++)
        if (!(m->key_mask[key] & (1u << a))) g = g * m->shape[a] + c[a];
    for (int i = 0; i < m->key_n[key]; i++) r = r * m->shape[m->key_axes[key][i]] + c[m->key_axes[key][i]];
    *gid = g;
    *rank = r;
}
/* The key of the axes order[0..n) as written (see DPAR__GROUP_KEYS). */
static int dpar__axes_key(const dpar_mesh *m, const int *order, int n) {
    unsigned mask = 0;
    int sorted = 1;
    for (int i = 0; i < n; i++) {
        mask |= 1u << order[i];
        if (i && order[i] < order[i - 1]) sorted = 0;
    }
    if (sorted) return (int)mask;
    for (int k = DPAR__MASKS; k < m->nkeys; k++) {
        int same = m->key_n[k] == n;
        for (int i = 0; same && i < n; i++) same = m->key_axes[k][i] == order[i];
        if (same) return k;
    }
    DPAR_ASSERT(0 && "every ordered axis list has a key");
    return (int)mask;
}
/* Fills the key table: masks first (axes ascending), then every other order of each mask's axes,
   enumerated in lexicographic order. */
static void dpar__mesh_keys(dpar_mesh *m) {
    m->nkeys = DPAR__MASKS;
    for (unsigned mask = 1; mask < (1u << m->ndim); mask++) {
        int ax[DPAR_MAX_AXES], n = 0;
        for (int a = 0; a < m->ndim; a++)
            if (mask & (1u << a)) ax[n++] = a;
        m->key_mask[mask] = mask;
        m->key_n[mask] = n;
        for (int i = 0; i < n; i++) m->key_axes[mask][i] = (unsigned char)ax[i];
        for (;;) { /* next lexicographic permutation of ax */
            int i = n - 2;
            while (i >= 0 && ax[i] > ax[i + 1]) i--;
            if (i < 0) break;
            int j = n - 1;
            while (ax[j] < ax[i]) j--;
            int t = ax[i];
            ax[i] = ax[j];
            ax[j] = t;
            for (int lo = i + 1, hi = n - 1; lo < hi; lo++, hi--) {
                t = ax[lo];
                ax[lo] = ax[hi];
                ax[hi] = t;
            }
            int k = m->nkeys++;
            DPAR_ASSERT(k < DPAR__GROUP_KEYS);
            m->key_mask[k] = mask;
            m->key_n[k] = n;
            for (int q = 0; q < n; q++) m->key_axes[k][q] = (unsigned char)ax[q];
        }
    }
}

/* >>lifetime =================================================================
   Handles that outlive their object. Every runtime, mesh, array, buffer, graph
   and attached helper (dpar_handle_attach) is entered in one process-wide set
   when created and taken out before it is freed. The calls a user may make
   with a handle kept too long (every destroy, pmap/shard_map, host transfers
   of arrays, graph calls, the helpers' calls; every other call through
   >>handle arguments) look it up first and refuse a stale one with
   DPAR_ERR_STATE, so none of them reaches freed memory. The set
   is keyed by address, not by generation-counted ids, because the handles stay
   plain pointers (API and ABI): a stale handle whose address a newer object of
   the same kind took refers to that object.
   Each runtime counts, under the set's lock, the calls in flight on it (busy),
   its host transfers (host_io) and its running dispatches (dispatching): a
   destroy refuses while anything is in flight, a host transfer while a
   dispatch runs, and a dispatch waits for the host transfers to end. The hot
   paths never take the lock: a dpar_ctx is compared with the calling thread's
   current one, an op's device with the calling worker's. */
typedef struct dpar__live_entry {
    const void *key; /* NULL: empty slot; &dpar__live_tomb: removed */
    int kind;
    dpar_runtime *rt;
    dpar_mesh *mesh;             /* parent mesh (arrays, graphs, helpers), else NULL */
    void (*release)(void *self); /* graphs and helpers: frees the object with its parent */
} dpar__live_entry;
static dpar__mutex dpar__live_mu = DPAR__MUTEX_INIT;
static dpar__cond dpar__live_cv = DPAR__COND_INIT;           /* busy / host_io / dispatching fell */
static dpar__live_entry *dpar__live_tab;                     /* open addressing, linear probing */
static size_t dpar__live_cap, dpar__live_used, dpar__live_n; /* slots, non-empty slots, live entries */
static const char dpar__live_tomb = 0;
static DPAR__TLS const void *dpar__live_memo_obj; /* dpar_handle_check's memo, valid in one dispatch */
static DPAR__TLS uint64_t dpar__live_memo_job;    /* that dispatch's job_id */

static const char *dpar__live_kind_name(int kind) {
    static const char *const names[] = { "handle", "runtime", "mesh", "array", "buffer", "graph", "helper object" };
    return kind >= 0 && kind <= DPAR__LIVE_CHILD ? names[kind] : "handle";
}
static size_t dpar__live_slot(const void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL; /* MurmurHash3's finalizer: heap addresses differ in their middle bits */
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}
/* The live entry of p, or NULL. Under dpar__live_mu. */
static dpar__live_entry *dpar__live_find(const void *p) {
    if (!dpar__live_tab || !p) return NULL;
    for (size_t i = dpar__live_slot(p, dpar__live_cap);; i = (i + 1) & (dpar__live_cap - 1)) {
        dpar__live_entry *e = &dpar__live_tab[i];
        if (!e->key) return NULL;
        if (e->key == p) return e;
    }
}
/* Rehashes the live entries into a table of at least 4 slots per entry (no tombstones). */
static int dpar__live_grow(void) {
    size_t cap = 64;
    while (cap < 4 * (dpar__live_n + 1)) cap *= 2;
    dpar__live_entry *t = (dpar__live_entry *)dpar__calloc(cap, sizeof *t);
    if (!t) return 0;
    for (size_t i = 0; i < dpar__live_cap; i++) {
        const dpar__live_entry *e = &dpar__live_tab[i];
        if (!e->key || e->key == &dpar__live_tomb) continue;
        size_t j = dpar__live_slot(e->key, cap);
        while (t[j].key) j = (j + 1) & (cap - 1);
        t[j] = *e;
    }
    DPAR_FREE(dpar__live_tab);
    dpar__live_tab = t;
    dpar__live_cap = cap;
    dpar__live_used = dpar__live_n;
    return 1;
}
/* Enters p (a new object). Under dpar__live_mu. */
static dpar_status dpar__live_insert(const void *p, int kind, dpar_runtime *rt, dpar_mesh *mesh,
                                     void (*release)(void *), const char *fn) {
    if (2 * (dpar__live_used + 1) > dpar__live_cap && !dpar__live_grow())
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    size_t i = dpar__live_slot(p, dpar__live_cap);
    while (dpar__live_tab[i].key && dpar__live_tab[i].key != &dpar__live_tomb) i = (i + 1) & (dpar__live_cap - 1);
    if (!dpar__live_tab[i].key) dpar__live_used++;
    dpar__live_entry *e = &dpar__live_tab[i];
    e->key = p;
    e->kind = kind;
    e->rt = rt;
    e->mesh = mesh;
    e->release = release;
    dpar__live_n++;
    return DPAR_OK;
}
/* Takes e out; the table goes when the last object does (nothing stays allocated). Under dpar__live_mu. */
static void dpar__live_erase(dpar__live_entry *e) {
    e->key = &dpar__live_tomb;
    if (--dpar__live_n == 0) {
        DPAR_FREE(dpar__live_tab);
        dpar__live_tab = NULL;
        dpar__live_cap = dpar__live_used = 0;
    }
}
static dpar_status dpar__live_stale(const char *fn, int kind) {
    const char *k = dpar__live_kind_name(kind);
    return dpar__err(DPAR_ERR_STATE,
                     "%s: the %s is stale (destroyed, or released when its mesh or runtime was destroyed); nothing "
                     "was done; stop using a handle once it or its parent is destroyed",
                     fn, k);
}
/* The live entry of p of that kind, else NULL with the error set; refuses a
   handle whose runtime or mesh another thread is destroying. Under dpar__live_mu. */
static dpar__live_entry *dpar__live_get(const void *p, int kind, const char *fn, dpar_status *s) {
    dpar__live_entry *e = dpar__live_find(p);
    *s = DPAR_OK;
    if (!e || e->kind != kind)
        *s = dpar__live_stale(fn, kind);
    else if (!dpar__releasing && (e->rt->closing || (e->mesh && e->mesh->closing)))
        *s = dpar__err(DPAR_ERR_STATE, "%s: the %s's %s is being destroyed by another thread; nothing was done", fn,
                       dpar__live_kind_name(kind), e->mesh && e->mesh->closing ? "mesh" : "runtime");
    return *s ? NULL : e;
}
/* Looks p up: DPAR_OK when it is a live handle of that kind. */
static dpar_status dpar__live_check(const void *p, int kind, const char *fn) {
    dpar_status s;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_get(p, kind, fn, &s);
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}
/* >>handle arguments ==========================================================
   Every public call that takes a handle looks it up before it reads it (one
   hash probe under the set's lock); a stale one is refused with
   DPAR_ERR_STATE naming the call and the argument. A thread freeing a
   parent's children (dpar__releasing) skips it: they were checked with the
   parent. On the hot path (ops and getters inside fn) a worker remembers the
   handles of its runtime it found live in the current dispatch: until the
   dispatch ends none of them can be freed (every destroy refuses while it
   runs) except the worker's own device's buffers, by that worker, which
   forgets each one it frees. The next use costs a compare. A memo is keyed by
   the dispatch's job_id, unique in the process, not by the runtime's address
   and job_count: on the caller's thread (EXECUTION MODEL) it outlives the
   runtime, and a new runtime at a freed one's address counts from 1 again. */
enum { DPAR__LIVE_MEMO = 64 }; /* direct-mapped by address */
typedef struct dpar__live_memo_slot {
    const void *p;
    int kind;
} dpar__live_memo_slot;
static DPAR__TLS dpar__live_memo_slot dpar__live_memo[DPAR__LIVE_MEMO];
static DPAR__TLS uint64_t dpar__live_memo_disp; /* the memo holds handles found live in this dispatch (job_id) */

static dpar_status dpar__live_stale_arg(const char *fn, const char *arg, int kind) {
    return dpar__err(DPAR_ERR_STATE,
                     "%s: %s is a stale %s (destroyed, or released when its mesh or runtime was destroyed); nothing "
                     "was done; stop using a handle once it or its parent is destroyed",
                     fn, arg, dpar__live_kind_name(kind));
}
static size_t dpar__live_memo_of(const void *p) {
    uintptr_t x = (uintptr_t)p;
    return (size_t)((x >> 4) ^ (x >> 10)) & (DPAR__LIVE_MEMO - 1);
}
/* Whether p is NULL or a live handle of that kind (no error text). */
static int dpar__live_ok(const void *p, int kind) {
    if (!p || dpar__releasing) return 1;
    const dpar__worker *w = dpar__self_worker;
    dpar__live_memo_slot *m = &dpar__live_memo[dpar__live_memo_of(p)];
    if (w) {
        if (DPAR__UNLIKELY(dpar__live_memo_disp != w->rt->job_id)) {
            memset((void *)dpar__live_memo, 0, sizeof dpar__live_memo); /* a new dispatch */
            dpar__live_memo_disp = w->rt->job_id;
        }
        if (DPAR__LIKELY(m->p == p && m->kind == kind)) return 1;
    }
    dpar__mutex_lock(&dpar__live_mu);
    const dpar__live_entry *e = dpar__live_find(p);
    int ok = e && e->kind == kind;
    if (ok && w && e->rt == w->rt && (kind != DPAR__LIVE_BUFFER || ((const dpar_buffer *)p)->gdev == w->device)) {
        m->p = p;
        m->kind = kind;
    }
    dpar__mutex_unlock(&dpar__live_mu);
    return ok;
}
/* DPAR_OK when p is NULL (the caller's own check names it) or a live handle
   of that kind, else DPAR_ERR_STATE "fn: arg is a stale <kind> ...". */
static dpar_status dpar__live_arg(const void *p, int kind, const char *fn, const char *arg) {
    return dpar__live_ok(p, kind) ? DPAR_OK : dpar__live_stale_arg(fn, arg, kind);
}
static int dpar__live_buf_ok(const dpar_buffer *b) {
    return dpar__live_ok(b, DPAR__LIVE_BUFFER);
}
static dpar_status dpar__live_buf(const dpar_buffer *b, const char *fn, const char *arg) {
    return dpar__live_arg(b, DPAR__LIVE_BUFFER, fn, arg);
}
/* Whether getter fn may read p: not NULL and live (stale: the last error is set
   and the getter returns what it returns for NULL). */
static int dpar__live_got(const void *p, int kind, const char *fn) {
    static const char *const args[] = {
        "the handle", "the runtime", "the mesh", "the array", "the buffer", "the graph"
    };
    return p && !dpar__live_arg(p, kind, fn, kind >= 0 && kind <= DPAR__LIVE_GRAPH ? args[kind] : args[0]);
}
/* Enters a new object whose parent (a runtime or a mesh) must be live. */
static dpar_status dpar__live_add(const void *p, int kind, const void *parent, int parent_kind, void (*release)(void *),
                                  const char *fn) {
    dpar_status s;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_entry *e = dpar__live_get(parent, parent_kind, fn, &s);
    if (e) {
        dpar_mesh *m = parent_kind == DPAR__LIVE_MESH ? (dpar_mesh *)(uintptr_t)parent : NULL;
        s = dpar__live_insert(p, kind, e->rt, m, release, fn);
    }
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}
/* Begins a call on live handle p: counts it in flight on its runtime (so no
   destroy frees p meanwhile) and, for a host transfer (io), refuses while a
   dispatch runs. *rt: p's runtime, for dpar__live_leave. */
static dpar_status dpar__live_enter(const void *p, int kind, const char *fn, int io, dpar_runtime **rt) {
    dpar_status s;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_entry *e = dpar__live_get(p, kind, fn, &s);
    if (e && io && e->rt->dispatching)
        s = dpar__err(DPAR_ERR_STATE,
                      "%s: a pmap/shard_map is running on this runtime; host transfers of arrays run between "
                      "dispatches (not inside fn, not from another thread during one)",
                      fn);
    if (e && !s) {
        e->rt->busy++;
        e->rt->host_io += io;
        *rt = e->rt;
    }
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}
static void dpar__live_leave(dpar_runtime *rt, int io) {
    dpar__mutex_lock(&dpar__live_mu);
    rt->busy--;
    rt->host_io -= io;
    dpar__cond_broadcast(&dpar__live_cv);
    dpar__mutex_unlock(&dpar__live_mu);
}
/* A dispatch's start and end (inside a dpar__live_enter): waits for the host
   transfers in flight; while it runs, host transfers and host-thread ops refuse. */
static void dpar__live_dispatch(dpar_runtime *rt, int delta) {
    dpar__mutex_lock(&dpar__live_mu);
    while (delta > 0 && rt->host_io) dpar__cond_wait(&dpar__live_cv, &dpar__live_mu);
    DPAR__ATOMIC_STORE(&rt->dispatching, rt->dispatching + delta); /* host-thread ops read it without the lock */
    if (delta < 0) dpar__cond_broadcast(&dpar__live_cv);
    dpar__mutex_unlock(&dpar__live_mu);
}
/* Takes live handle p out of the set for its destroy; refuses a stale one and,
   unless this thread is freeing p's parent, one whose runtime has a call in
   flight. *rt (may be NULL): p's runtime. */
static dpar_status dpar__live_detach(const void *p, int kind, const char *fn, dpar_runtime **rt) {
    dpar_status s;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_entry *e = dpar__live_get(p, kind, fn, &s);
    if (e && !dpar__releasing && e->rt->busy)
        s = dpar__err(DPAR_ERR_STATE,
                      "%s: the %s's runtime is in use by another thread (a pmap/shard_map, a graph run or a host "
                      "transfer is running); nothing was destroyed; destroy it after that call returns",
                      fn, dpar__live_kind_name(kind));
    if (e && !s) {
        if (rt) *rt = e->rt;
        dpar__live_erase(e);
    }
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}
/* Takes one graph or helper of mesh m out of the set (NULL when none is left):
   its release is called by the caller, outside the lock. */
static void *dpar__live_pop_child(const dpar_mesh *m, void (**release)(void *)) {
    void *obj = NULL;
    dpar__mutex_lock(&dpar__live_mu);
    for (size_t i = 0; i < dpar__live_cap && !obj; i++) {
        dpar__live_entry *e = &dpar__live_tab[i];
        if (!e->key || e->key == &dpar__live_tomb || e->mesh != m || !e->release) continue;
        obj = (void *)(uintptr_t)e->key;
        *release = e->release;
        dpar__live_erase(e);
    }
    dpar__mutex_unlock(&dpar__live_mu);
    return obj;
}
/* Marks a mesh or runtime as being destroyed (refusing its handles) after the
   checks of dpar__live_detach, which takes it out of the set. */
static dpar_status dpar__live_close(const void *p, int kind, const char *fn) {
    dpar_status s;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_entry *e = dpar__live_get(p, kind, fn, &s);
    if (e && !dpar__releasing && e->rt->busy)
        s = dpar__err(DPAR_ERR_STATE,
                      "%s: a call on %s is running on another thread (a pmap/shard_map, a graph run or a host "
                      "transfer); nothing was destroyed; destroy it after that call returns",
                      fn, kind == DPAR__LIVE_MESH ? "this mesh's runtime" : "this runtime");
    if (e && !s) {
        if (kind == DPAR__LIVE_MESH)
            ((dpar_mesh *)(uintptr_t)p)->closing = 1;
        else
            e->rt->closing = 1;
        dpar__live_erase(e);
    }
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}

/* Whether p is a live handle (no error text). */
static int dpar__live_has(const void *p) {
    dpar__mutex_lock(&dpar__live_mu);
    int has = dpar__live_find(p) != NULL;
    dpar__mutex_unlock(&dpar__live_mu);
    return has;
}
/* Takes p out of the set if it is in (a parent freeing its children). */
static void dpar__live_forget(const void *p) {
    dpar__live_memo_slot *m = &dpar__live_memo[dpar__live_memo_of(p)];
    if (m->p == p) m->p = NULL; /* this thread frees it: its address may come back */
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_entry *e = dpar__live_find(p);
    if (e) dpar__live_erase(e);
    dpar__mutex_unlock(&dpar__live_mu);
}
static dpar_status dpar__live_add_runtime(dpar_runtime *rt) {
    dpar__mutex_lock(&dpar__live_mu);
    dpar_status s = dpar__live_insert(rt, DPAR__LIVE_RUNTIME, rt, NULL, NULL, "dpar_runtime_create");
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}
/* >>handle addresses ==========================================================
   The set is keyed by address, so a stale handle whose address a newer object
   took would pass the lookup as that object. To make that case rare a new
   runtime, mesh, array, buffer or graph never gets the address of one of the
   last DPAR__ADDR_RING destroyed: dpar__handle_alloc allocates again while the
   block it got has such an address, holding the refused blocks until it has
   one (at most DPAR__ADDR_RING + 1 tries: the held blocks are all distinct).
   Nothing is kept allocated. The residual case, documented in THREADS AND
   LIFETIMES: a handle used after more than DPAR__ADDR_RING later destroys may
   name a newer object of the same kind at the same address. */
enum { DPAR__ADDR_RING = 256 };
static const void *dpar__addr_ring[DPAR__ADDR_RING]; /* the last addresses freed, under dpar__live_mu */
static size_t dpar__addr_next;

static int dpar__addr_recent(const void *p) {
    dpar__mutex_lock(&dpar__live_mu);
    int hit = 0;
    for (size_t i = 0; i < DPAR__ADDR_RING && !hit; i++) hit = dpar__addr_ring[i] == p;
    dpar__mutex_unlock(&dpar__live_mu);
    return hit;
}
/* A zeroed block for a handle's object, at none of the recently freed addresses; NULL: out of memory. */
static void *dpar__handle_alloc(size_t size) {
    void *held[DPAR__ADDR_RING];
    size_t nheld = 0;
    void *p = dpar__calloc(1, size);
    while (p && nheld < DPAR__ADDR_RING && dpar__addr_recent(p)) {
        held[nheld++] = p;
        p = dpar__calloc(1, size);
    }
    while (nheld) DPAR_FREE(held[--nheld]);
    return p;
}
/* Frees a handle's object and remembers its address. */
static void dpar__handle_free(void *p) {
    if (!p) return;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__addr_ring[dpar__addr_next] = p;
    dpar__addr_next = (dpar__addr_next + 1) % DPAR__ADDR_RING;
    dpar__mutex_unlock(&dpar__live_mu);
    DPAR_FREE(p);
}

/* dpar_buffer_destroy's checks, then b leaves the set: a live buffer, not an
   array's shard; during a dispatch only its own device's worker may free it. */
static dpar_status dpar__live_buffer_detach(const dpar_buffer *b) {
    dpar_status s;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_entry *e = dpar__live_get(b, DPAR__LIVE_BUFFER, "dpar_buffer_destroy", &s);
    const dpar__worker *w = dpar__self_worker;
    int own = w && w->rt == b->rt;
    if (!e) {
    } else if (b->owned) {
        s = dpar__err(DPAR_ERR_STATE, "dpar_buffer_destroy: the buffer is a shard of a dpar_array and was not freed; "
                                      "destroy the array instead");
    } else if (dpar__releasing) {
    } else if (own && w->device != b->gdev) {
        s = dpar__err(DPAR_ERR_STATE,
                      "dpar_buffer_destroy: the buffer lives on device %d but this is device %d's worker; nothing "
                      "was destroyed; free a buffer inside fn only on its own device",
                      b->gdev, w->device);
    } else if (!own && e->rt->dispatching) {
        s = dpar__err(DPAR_ERR_STATE,
                      "dpar_buffer_destroy: a pmap/shard_map is running on the buffer's runtime; nothing was "
                      "destroyed; free it after the dispatch returns (or inside fn, on its device)");
    }
    if (e && !s) dpar__live_erase(e);
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}

DPAR_API dpar_status dpar_handle_attach(dpar_mesh *m, void *obj, void (*release)(void *obj)) {
    dpar__clear_error();
    if (!m || !obj || !release)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_handle_attach: mesh, obj or release is NULL");
    if (dpar__live_check(obj, DPAR__LIVE_CHILD, "dpar_handle_attach") == DPAR_OK)
        return dpar__err(DPAR_ERR_STATE, "dpar_handle_attach: the object is attached already");
    dpar__clear_error();
    return dpar__live_add(obj, DPAR__LIVE_CHILD, m, DPAR__LIVE_MESH, release, "dpar_handle_attach");
}
DPAR_API dpar_status dpar_handle_check(const void *obj, const char *fn) {
    if (!fn) fn = "dpar_handle_check";
    if (!obj) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the helper object is NULL", fn);
    dpar__worker *w = dpar__self_worker;
    if (w && obj == dpar__live_memo_obj && dpar__live_memo_job == w->rt->job_id) return DPAR_OK;
    dpar_status s;
    dpar__mutex_lock(&dpar__live_mu);
    dpar__live_entry *e = dpar__live_get(obj, DPAR__LIVE_CHILD, fn, &s);
    if (e && w && e->rt == w->rt) { /* its runtime runs this dispatch: no destroy can free it before it ends */
        dpar__live_memo_obj = obj;
        dpar__live_memo_job = w->rt->job_id;
    }
    dpar__mutex_unlock(&dpar__live_mu);
    return s;
}
DPAR_API dpar_status dpar_handle_detach(void *obj, const char *fn) {
    if (!fn) fn = "dpar_handle_detach";
    if (!obj) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the helper object is NULL", fn);
    if (dpar__self_worker && !dpar__releasing)
        return dpar__err(DPAR_ERR_STATE, "%s: called inside a pmap/shard_map function; nothing was destroyed", fn);
    return dpar__live_detach(obj, DPAR__LIVE_CHILD, fn, NULL);
}

static void dpar__array_free(dpar_array *a);
/* Frees m with its helpers and graphs (their release hooks, while their arrays
   still exist), then its arrays and groups. */
static void dpar__mesh_free(dpar_mesh *m) {
    if (!m) return;
    dpar_runtime *rt = m->rt;
    void (*release)(void *) = NULL;
    dpar__releasing++;
    for (void *obj; (obj = dpar__live_pop_child(m, &release)) != NULL;) release(obj);
    while (m->arrays) dpar__array_free(m->arrays);
    dpar__releasing--;
    dpar__transport_get()->mesh_free(m);
    dpar__mutex_lock(&rt->list_mu);
    if (m->prev)
        m->prev->next = m->next;
    else if (rt->meshes == m)
        rt->meshes = m->next;
    if (m->next) m->next->prev = m->prev;
    dpar__mutex_unlock(&rt->list_mu);
    for (int k = 0; k < DPAR__GROUP_KEYS; k++) {
        if (!m->groups[k]) continue;
        for (int g = 0; g < m->ngroups[k]; g++) {
            dpar__group *gr = &m->groups[k][g];
            dpar__mutex_destroy(&gr->mu);
            dpar__cond_destroy(&gr->cv);
            if (gr->stage)
                for (int i = 0; i < gr->n; i++) DPAR_FREE(gr->stage[i]);
            DPAR_FREE(gr->devices);
            DPAR_FREE(gr->here);
            DPAR_FREE(gr->posts);
            DPAR_FREE(gr->in_bufs);
            DPAR_FREE(gr->out_bufs);
            DPAR_FREE(gr->in_ptr);
            DPAR_FREE(gr->out_ptr);
            DPAR_FREE(gr->stage);
            DPAR_FREE(gr->stage_cap);
            DPAR_FREE(gr->xin_ptr);
            DPAR_FREE(gr->xmsg);
            DPAR_FREE(gr->claim);
            DPAR_FREE(gr->calls);
        }
        DPAR_FREE(m->groups[k]);
    }
    dpar__handle_free(m);
}

/* Checks a mesh desc against the runtime: infers ndim when 0, validates the axes
   (size >= 1, unique non-empty names without separators) and the device count. */
static dpar_status dpar__mesh_desc_check(const dpar_runtime *rt, const dpar_mesh_desc *desc, dpar_mesh_desc *resolved,
                                         long long *size_out) {
    *resolved = *desc;
    if (resolved->ndim == 0) /* inferred: the leading axes given a size or a name */
        while (resolved->ndim < DPAR_MAX_AXES && (desc->shape[resolved->ndim] || desc->axis_names[resolved->ndim]))
            resolved->ndim++;
    const dpar_mesh_desc *d = resolved;
    if (d->ndim < 1 || d->ndim > DPAR_MAX_AXES)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_mesh_create: ndim = %d; a mesh has 1..%d axes (0: as many as "
                         "shape / axis_names give)",
                         d->ndim, (int)DPAR_MAX_AXES);
    long long size = 1;
    for (int a = 0; a < d->ndim; a++) {
        const char *nm = d->axis_names[a];
        if (d->shape[a] < 1)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_create: axis %d has size %d; sizes must be >= 1", a,
                             d->shape[a]);
        size *= d->shape[a];
        if (!nm || !*nm)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_mesh_create: axis %d has an empty name; give every axis a name such as \"data\"", a);
        if (strlen(nm) >= DPAR_NAME_LEN)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_create: axis name '%s' is longer than %d characters",
                             nm, (int)DPAR_NAME_LEN - 1);
        if (strpbrk(nm, ", \t"))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_mesh_create: axis name '%s' contains ',' or a space, which separate axis names", nm);
        for (int b = 0; b < a; b++)
            if (!strcmp(nm, d->axis_names[b]))
                return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                 "dpar_mesh_create: axis name '%s' is used for axes %d and %d; names must be unique",
                                 nm, b, a);
    }
    if (size > rt->ndev) {
        char sh[96];
        size_t at = 0;
        for (int a = 0; a < d->ndim; a++)
            at += (size_t)snprintf(sh + at, sizeof sh - at, a ? " x %d" : "%d", d->shape[a]);
        return dpar__err(DPAR_ERR_DEVICE_COUNT,
                         "dpar_mesh_create: a mesh of shape (%s) needs %lld devices but the runtime has %d; "
                         "create the runtime with num_devices = %lld (or DPAR_DEVICES=%lld)",
                         sh, size, rt->ndev, size, size);
    }
    *size_out = size;
    return DPAR_OK;
}

/* Puts device d->devices[p] (or p) at mesh position p; rejects unknown or repeated devices. */
static dpar_status dpar__mesh_place_devices(dpar_mesh *m, const dpar_mesh_desc *d) {
    const dpar_runtime *rt = m->rt;
    for (int i = 0; i < DPAR_MAX_DEVICES; i++) m->pos_of[i] = -1;
    for (int p = 0; p < m->size; p++) {
        int dev = d->devices ? d->devices[p] : p;
        if (dev < 0 || dev >= rt->ndev) {
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_mesh_create: devices[%d] = %d is not a device of the runtime (0..%d)", p, dev,
                             rt->ndev - 1);
        }
        if (m->pos_of[dev] >= 0) {
            int prev = m->pos_of[dev];
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_mesh_create: device %d appears twice in devices[] (positions %d and %d)", dev, prev,
                             p);
        }
        m->devices[p] = dev;
        m->pos_of[dev] = p;
    }
    return DPAR_OK;
}

/* The collective groups of every non-empty axis mask: members, leader, and
   whether the group spans processes. On failure the caller frees the mesh. */
static dpar_status dpar__mesh_build_groups(dpar_mesh *m) {
    const dpar_runtime *rt = m->rt;
    dpar__mesh_keys(m);
    for (int key = 1; key < m->nkeys; key++) {
        if (!m->key_n[key]) continue; /* a mask naming axes this mesh lacks */
        int gs = dpar__mask_size(m, m->key_mask[key]), ng = m->size / gs;
        m->groups[key] = (dpar__group *)dpar__calloc((size_t)ng, sizeof(dpar__group));
        if (!m->groups[key]) { return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_mesh_create: out of host memory"); }
        m->ngroups[key] = ng;
        for (int g = 0; g < ng; g++) {
            dpar__group *gr = &m->groups[key][g];
            dpar__mutex_init(&gr->mu);
            dpar__cond_init(&gr->cv);
            gr->mesh = m;
            gr->n = gs;
            gr->devices = (int *)dpar__calloc((size_t)gs, sizeof(int));
            gr->here = (unsigned char *)dpar__calloc((size_t)gs, 1);
            gr->posts = (dpar__post *)dpar__calloc(2 * (size_t)gs, sizeof(dpar__post));
            gr->in_bufs = (dpar_buffer **)dpar__calloc((size_t)gs, sizeof(void *));
            gr->out_bufs = (dpar_buffer **)dpar__calloc((size_t)gs, sizeof(void *));
            gr->in_ptr = (void **)dpar__calloc(2 * (size_t)gs, sizeof(void *));
            gr->out_ptr = (void **)dpar__calloc(2 * (size_t)gs, sizeof(void *));
            gr->stage = (void **)dpar__calloc((size_t)gs, sizeof(void *));
            gr->stage_cap = (size_t *)dpar__calloc((size_t)gs, sizeof(size_t));
            gr->xin_ptr = (void **)dpar__calloc((size_t)gs, sizeof(void *));
            gr->xmsg = (char *)dpar__calloc(DPAR__ERR_LEN, 1);
            gr->claim = (int64_t *)dpar__calloc(2 * (size_t)gs, sizeof(int64_t));
            gr->calls = (uint64_t *)dpar__calloc((size_t)gs, sizeof(uint64_t));
            if (!gr->devices || !gr->here || !gr->posts || !gr->in_bufs || !gr->out_bufs || !gr->in_ptr ||
                !gr->out_ptr || !gr->stage || !gr->stage_cap || !gr->xin_ptr || !gr->xmsg || !gr->claim || !gr->calls) {
                return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_mesh_create: out of host memory");
            }
        }
        for (int p = 0; p < m->size; p++) {
            int gid, rank;
            dpar__group_of(m, key, p, &gid, &rank);
            m->groups[key][gid].devices[rank] = m->devices[p];
        }
        for (int g = 0; g < ng; g++) {
            dpar__group *gr = &m->groups[key][g];
            gr->leader = -1;
            for (int r = 0; r < gr->n; r++) {
                if (dpar__is_local(rt, gr->devices[r])) {
                    gr->nlocal++;
                    if (gr->leader < 0) gr->leader = r;
                }
            }
            gr->cross = gr->nlocal != gr->n;
        }
    }
    return DPAR_OK;
}

DPAR_API dpar_status dpar_mesh_create(dpar_runtime *rt, const dpar_mesh_desc *desc, dpar_mesh **out) {
    dpar__clear_error();
    if (!out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_create: `out` is NULL");
    *out = NULL;
    if (!rt || !desc) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_create: runtime or desc is NULL");
    dpar_mesh_desc resolved;
    long long size = 0;
    if (dpar__live_check(rt, DPAR__LIVE_RUNTIME, "dpar_mesh_create")) return DPAR_ERR_STATE;
    dpar_status s = dpar__mesh_desc_check(rt, desc, &resolved, &size);
    if (s != DPAR_OK) return s;
    const dpar_mesh_desc *d = &resolved;
    /* size < rt->ndev without a device list is allowed: the mesh takes the first `size` devices */
    dpar_mesh *m = (dpar_mesh *)dpar__handle_alloc(sizeof *m);
    if (!m) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_mesh_create: out of host memory");
    m->rt = rt;
    m->ndim = d->ndim;
    m->size = (int)size;
    for (int a = 0; a < d->ndim; a++) {
        m->shape[a] = d->shape[a];
        strcpy(m->names[a], d->axis_names[a]);
    }
    s = dpar__mesh_place_devices(m, d);
    if (s == DPAR_OK) s = dpar__mesh_build_groups(m);
    if (s != DPAR_OK) {
        dpar__mesh_free(m);
        return s;
    }
    dpar_status ms = dpar__transport_get()->mesh_init(m);
    if (!ms) ms = dpar__live_add(m, DPAR__LIVE_MESH, rt, DPAR__LIVE_RUNTIME, NULL, "dpar_mesh_create");
    if (ms != DPAR_OK) {
        char msg[DPAR__ERR_LEN];
        memcpy(msg, dpar__err_text, sizeof msg);
        dpar__mesh_free(m);
        return dpar__err(ms, "%s", msg);
    }
    dpar__mutex_lock(&rt->list_mu);
    m->next = rt->meshes;
    if (rt->meshes) rt->meshes->prev = m;
    rt->meshes = m;
    dpar__mutex_unlock(&rt->list_mu);
    *out = m;
    return DPAR_OK;
}
static dpar_status dpar__mesh_destroy(void *obj);
DPAR_API dpar_status dpar_mesh_destroy(dpar_mesh *m) {
    return dpar__destroy_kept(dpar__mesh_destroy, m);
}
static dpar_status dpar__mesh_destroy(void *obj) {
    dpar_mesh *m = (dpar_mesh *)obj;
    if (!m) return DPAR_OK;
    if (dpar__self_worker)
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_mesh_destroy: called inside a pmap/shard_map function; nothing was destroyed");
    if (dpar__live_check(m, DPAR__LIVE_MESH, "dpar_mesh_destroy")) return DPAR_ERR_STATE;
    dpar_status s = dpar__busy(m->rt, NULL, "dpar_mesh_destroy");
    if (!s) s = dpar__live_close(m, DPAR__LIVE_MESH, "dpar_mesh_destroy");
    if (s) return s;
    dpar__mesh_free(m);
    return DPAR_OK;
}
DPAR_API int dpar_mesh_ndim(const dpar_mesh *m) {
    return dpar__live_got(m, DPAR__LIVE_MESH, "dpar_mesh_ndim") ? m->ndim : 0;
}
DPAR_API int dpar_mesh_size(const dpar_mesh *m) {
    return dpar__live_got(m, DPAR__LIVE_MESH, "dpar_mesh_size") ? m->size : 0;
}
DPAR_API const char *dpar_mesh_axis_name(const dpar_mesh *m, int i) {
    return (dpar__live_got(m, DPAR__LIVE_MESH, "dpar_mesh_axis_name") && i >= 0 && i < m->ndim) ? m->names[i] : NULL;
}

DPAR_API dpar_status dpar_mesh_axis_size(const dpar_mesh *m, const char *axes, int *out) {
    dpar__clear_error();
    if (dpar__live_arg(m, DPAR__LIVE_MESH, "dpar_mesh_axis_size", "the mesh")) return DPAR_ERR_STATE;
    if (!m || !out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_axis_size: mesh or out is NULL");
    unsigned mask;
    dpar_status s = dpar__parse_axes(m, "dpar_mesh_axis_size", axes, &mask, NULL, NULL);
    if (s) return s;
    *out = dpar__mask_size(m, mask);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_mesh_device(const dpar_mesh *m, const int *coords, int *device) {
    dpar__clear_error();
    if (dpar__live_arg(m, DPAR__LIVE_MESH, "dpar_mesh_device", "the mesh")) return DPAR_ERR_STATE;
    if (!m || !coords || !device) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_device: NULL argument");
    for (int a = 0; a < m->ndim; a++)
        if (coords[a] < 0 || coords[a] >= m->shape[a])
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_mesh_device: coordinate %d on axis '%s' is out of range 0..%d", coords[a],
                             m->names[a], m->shape[a] - 1);
    *device = m->devices[dpar__coords_to_pos(m, coords)];
    return DPAR_OK;
}
DPAR_API dpar_status dpar_mesh_coords(const dpar_mesh *m, int device, int *coords) {
    dpar__clear_error();
    if (dpar__live_arg(m, DPAR__LIVE_MESH, "dpar_mesh_coords", "the mesh")) return DPAR_ERR_STATE;
    if (!m || !coords) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_coords: NULL argument");
    if (device < 0 || device >= DPAR_MAX_DEVICES || m->pos_of[device] < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_coords: device %d is not in the mesh", device);
    dpar__pos_to_coords(m, m->pos_of[device], coords);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_mesh_group(const dpar_mesh *m, const char *axes, int device, int *members, int *n,
                                     int *index) {
    dpar__clear_error();
    if (dpar__live_arg(m, DPAR__LIVE_MESH, "dpar_mesh_group", "the mesh")) return DPAR_ERR_STATE;
    if (!m || !members || !n) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_group: NULL argument");
    if (device < 0 || device >= DPAR_MAX_DEVICES || m->pos_of[device] < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_mesh_group: device %d is not in the mesh", device);
    unsigned mask;
    int order[DPAR_MAX_AXES], norder;
    dpar_status s = dpar__parse_axes(m, "dpar_mesh_group", axes, &mask, order, &norder);
    if (s) return s;
    int gid, rank, key = dpar__axes_key(m, order, norder);
    dpar__group_of(m, key, m->pos_of[device], &gid, &rank);
    const dpar__group *g = &m->groups[key][gid];
    for (int i = 0; i < g->n; i++) members[i] = g->devices[i];
    *n = g->n;
    if (index) *index = rank;
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   N-d block copy (row-major), used by arrays and the host collectives
   ------------------------------------------------------------------------ */
static void dpar__copy_fanout(char *const *dst, int ndst, const char *src, size_t n, int nt);
/* Copies the block of extent ext[ndim] from src (shape sshape, at soff) to
   dst (shape dshape, at doff). esize bytes per element. nt: rows of 4 KB and
   more with streaming stores (dpar__copy_fanout). */
static void dpar__copy_block_nt(char *dst, const int64_t *dshape, const int64_t *doff, const char *src,
                                const int64_t *sshape, const int64_t *soff, const int64_t *ext, int ndim, size_t esize,
                                int nt) {
    if (ndim == 0) {
        memcpy(dst, src, esize);
        return;
    }
    for (int i = 0; i < ndim; i++)
        if (ext[i] == 0) return;
    /* merge trailing dims that are whole in both */
    int last = ndim - 1;
    size_t run = (size_t)ext[last] * esize;
    while (last > 0 && ext[last] == dshape[last] && ext[last] == sshape[last] && doff[last] == 0 && soff[last] == 0) {
        last--;
        run *= (size_t)ext[last];
    }
    /* iterate over dims 0..last-1, copying `run` bytes at dim `last` */
    int64_t idx[DPAR_MAX_DIMS] = { 0 };
    int64_t dstride[DPAR_MAX_DIMS], sstride[DPAR_MAX_DIMS];
    int64_t ds = 1, ss = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        dstride[i] = ds;
        sstride[i] = ss;
        ds *= dshape[i];
        ss *= sshape[i];
    }
    for (;;) {
        int64_t dpos = 0, spos = 0;
        for (int i = 0; i <= last; i++) {
            int64_t v = (i < last) ? idx[i] : 0;
            dpos += (doff[i] + v) * dstride[i];
            spos += (soff[i] + v) * sstride[i];
        }
        char *d = dst + (size_t)dpos * esize;
        if (nt && run >= 4096)
            dpar__copy_fanout(&d, 1, src + (size_t)spos * esize, run, 1);
        else
            memcpy(d, src + (size_t)spos * esize, run);
        int i = last - 1;
        while (i >= 0) {
            if (++idx[i] < ext[i]) break;
            idx[i] = 0;
            i--;
        }
        if (i < 0) break;
    }
}
static void dpar__copy_block(char *dst, const int64_t *dshape, const int64_t *doff, const char *src,
                             const int64_t *sshape, const int64_t *soff, const int64_t *ext, int ndim, size_t esize) {
    dpar__copy_block_nt(dst, dshape, doff, src, sshape, soff, ext, ndim, esize, 0);
}

/* ---------------------------------------------------------------------------
   Global arrays
   ------------------------------------------------------------------------ */
struct dpar_array {
    dpar_mesh *mesh;
    dpar_dtype dtype;
    int ndim;
    int64_t shape[DPAR_MAX_DIMS];
    int64_t local[DPAR_MAX_DIMS];
    int spec_axes[DPAR_MAX_DIMS][DPAR_MAX_AXES]; /* axes splitting each dim, in written order */
    int spec_n[DPAR_MAX_DIMS];
    unsigned used_mask;
    dpar_buffer **shards;           /* [mesh size] by position */
    struct dpar_array *prev, *next; /* mesh's list */
};

/* offsets of the shard of mesh position pos */
static void dpar__array_offsets(const dpar_array *a, int pos, int64_t *off) {
    int c[DPAR_MAX_AXES];
    dpar__pos_to_coords(a->mesh, pos, c);
    for (int d = 0; d < a->ndim; d++) {
        int64_t k = 0;
        for (int j = 0; j < a->spec_n[d]; j++) {
            int ax = a->spec_axes[d][j];
            k = k * a->mesh->shape[ax] + c[ax];
        }
        off[d] = k * a->local[d];
    }
}

static dpar_status dpar__array_destroy(void *obj);
DPAR_API dpar_status dpar_array_destroy(dpar_array *a) {
    return dpar__destroy_kept(dpar__array_destroy, a);
}
static dpar_status dpar__array_destroy(void *obj) {
    dpar_array *a = (dpar_array *)obj;
    if (!a) return DPAR_OK;
    if (dpar__self_worker && !dpar__releasing)
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_array_destroy: called inside a pmap/shard_map function; nothing was destroyed "
                         "(destroy the array after the dispatch returns)");
    if (dpar__live_check(a, DPAR__LIVE_ARRAY, "dpar_array_destroy")) return DPAR_ERR_STATE;
    dpar_status s = dpar__releasing ? DPAR_OK : dpar__busy(a->mesh->rt, NULL, "dpar_array_destroy");
    if (!s) s = dpar__live_detach(a, DPAR__LIVE_ARRAY, "dpar_array_destroy", NULL);
    if (s) return s;
    dpar__array_free(a);
    return DPAR_OK;
}
static void dpar__array_free(dpar_array *a) {
    if (!a) return;
    dpar__live_forget(a); /* freed with its mesh, or a failed create */
    dpar_mesh *m = a->mesh;
    dpar__mutex_lock(&m->rt->list_mu);
    if (a->prev)
        a->prev->next = a->next;
    else if (m->arrays == a)
        m->arrays = a->next;
    if (a->next) a->next->prev = a->prev;
    dpar__mutex_unlock(&m->rt->list_mu);
    if (a->shards)
        for (int p = 0; p < a->mesh->size; p++)
            if (a->shards[p]) dpar__buffer_free(a->shards[p]);
    DPAR_FREE(a->shards);
    dpar__handle_free(a);
}

DPAR_API dpar_status dpar_array_create(dpar_mesh *m, const dpar_array_desc *d, dpar_array **out) {
    dpar__clear_error();
    if (!out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_create: `out` is NULL");
    *out = NULL;
    if (!m || !d) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_create: mesh or desc is NULL");
    if (dpar__live_check(m, DPAR__LIVE_MESH, "dpar_array_create")) return DPAR_ERR_STATE;
    dpar_status busy = dpar__busy(m->rt, NULL, "dpar_array_create");
    if (busy) return busy;
    if (dpar_dtype_size(d->dtype) == 0)
        return dpar__err(DPAR_ERR_DTYPE, "dpar_array_create: dtype %d is not a dpar_dtype", (int)d->dtype);
    if (d->dtype == DPAR_F64 && m->rt->be->kind != DPAR_BACKEND_CPU)
        return dpar__err(DPAR_ERR_DTYPE,
                         "dpar_array_create: the %s backend has no f64 buffers or ops (f64 runs on the cpu backend); "
                         "use f32 here, or a cpu runtime for f64",
                         m->rt->be->name);
    dpar_status s = dpar__check_shape("dpar_array_create", d->ndim, d->shape);
    if (s) return s;
    for (int i = d->ndim; i < DPAR_MAX_DIMS; i++) /* a spec meant for a dimension the array lacks */
        if (d->spec[i] && *d->spec[i])
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_array_create: spec[%d] is \"%s\" but the array has %d dimension%s; give a spec "
                             "only for dimensions 0..ndim-1 (or raise ndim)",
                             i, d->spec[i], d->ndim, d->ndim == 1 ? "" : "s");
    dpar_array *a = (dpar_array *)dpar__handle_alloc(sizeof *a);
    if (!a) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_array_create: out of host memory");
    a->mesh = m;
    a->dtype = d->dtype;
    a->ndim = d->ndim;
    for (int i = 0; i < d->ndim; i++) {
        a->shape[i] = d->shape[i];
        a->local[i] = d->shape[i];
        if (!d->spec[i] || !*d->spec[i]) continue;
        unsigned mask;
        char where[64];
        snprintf(where, sizeof where, "dpar_array_create: spec of dimension %d", i);
        s = dpar__parse_axes(m, where, d->spec[i], &mask, a->spec_axes[i], &a->spec_n[i]);
        if (s) {
            DPAR_FREE(a);
            return s;
        }
        if (mask & a->used_mask) {
            DPAR_FREE(a);
            return dpar__err(
                DPAR_ERR_INVALID_ARGUMENT,
                "dpar_array_create: spec \"%s\" of dimension %d uses an axis already used by another dimension",
                d->spec[i], i);
        }
        a->used_mask |= mask;
        int n = dpar__mask_size(m, mask);
        if (d->shape[i] % n) {
            DPAR_FREE(a);
            return dpar__err(
                DPAR_ERR_SHAPE,
                "dpar_array_create: dimension %d has size %lld, which is not divisible by the %d devices of axis '%s'; "
                "pad it to a multiple of %d",
                i, (long long)d->shape[i], n, d->spec[i], n);
        }
        a->local[i] = d->shape[i] / n;
    }
    a->shards = (dpar_buffer **)dpar__calloc((size_t)m->size, sizeof(dpar_buffer *));
    if (!a->shards) {
        DPAR_FREE(a);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_array_create: out of host memory");
    }
    for (int p = 0; p < m->size; p++) {
        if (!dpar__is_local(m->rt, m->devices[p])) continue; /* another process holds it */
        s = dpar_buffer_create(m->rt, m->devices[p], d->dtype, d->ndim, a->local, &a->shards[p]);
        if (s) {
            dpar__array_free(a);
            return s;
        }
        a->shards[p]->owned = 1;
    }
    if ((s = dpar__live_add(a, DPAR__LIVE_ARRAY, m, DPAR__LIVE_MESH, NULL, "dpar_array_create"))) {
        dpar__array_free(a);
        return s;
    }
    dpar__mutex_lock(&m->rt->list_mu);
    a->next = m->arrays;
    if (m->arrays) m->arrays->prev = a;
    m->arrays = a;
    dpar__mutex_unlock(&m->rt->list_mu);
    *out = a;
    return DPAR_OK;
}

static dpar_status dpar__array_scatter(dpar_array *a, const void *host, bool direct);
static dpar_status dpar__array_put(dpar_array *a, const void *host) {
    dpar__clear_error();
    if (!a || !host) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_put: array or host data is NULL");
    dpar_status busy = dpar__busy(a->mesh->rt, NULL, "dpar_array_put");
    if (busy) return busy;
    return dpar__array_scatter(a, host, false);
}
/* Row-major global host data -> each local shard of a. direct: straight to the backend, without
   dpar_buffer_write's checks that no dispatch runs (>>graph feeds: buffers no dispatch touches). */
static dpar_status dpar__array_scatter(dpar_array *a, const void *host, bool direct) {
    size_t es = dpar_dtype_size(a->dtype);
    size_t nb = (size_t)dpar__prod(a->local, a->ndim) * es;
    bool rows = true; /* a shard is a run of whole rows (split on dim 0 at most): written from host in place */
    for (int d = 1; d < a->ndim; d++) rows = rows && a->local[d] == a->shape[d];
    char *tmp = rows ? NULL : (char *)DPAR_MALLOC(nb ? nb : 1);
    if (!rows && !tmp) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_array_put: out of host memory (%zu bytes)", nb);
    int64_t zero[DPAR_MAX_DIMS] = { 0 }, off[DPAR_MAX_DIMS];
    dpar_status s = DPAR_OK;
    for (int p = 0; p < a->mesh->size && !s; p++) {
        if (!a->shards[p]) continue;
        dpar__array_offsets(a, p, off);
        const char *src = tmp;
        if (rows) /* off[0] rows of prod(local[1..]) elements before it */
            src = (const char *)host +
                  (a->ndim ? (size_t)off[0] * (size_t)dpar__prod(a->local + 1, a->ndim - 1) * es : 0);
        else
            dpar__copy_block(tmp, a->local, zero, (const char *)host, a->shape, off, a->local, a->ndim, es);
        dpar_buffer *b = a->shards[p];
        if (!direct) {
            s = dpar_buffer_write(b, 0, src, nb);
        } else if (nb) { /* a staged set, refilled in turn with the others */
            const dpar__backend_iface *be = b->rt->be;
            double t0 = dpar__now_us();
            s = (be->refill ? be->refill : be->write)(b->rt->bstate, b->device, b->mem, 0, src, nb);
            dpar__obs_time(b->rt, b->device, DPAR__OBS_TRANSFER, t0);
        }
    }
    DPAR_FREE(tmp);
    return s;
}

static dpar_status dpar__array_get(const dpar_array *a, void *host) {
    dpar__clear_error();
    if (!a || !host) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_get: array or host destination is NULL");
    dpar_status busy = dpar__busy(a->mesh->rt, NULL, "dpar_array_get");
    if (busy) return busy;
    size_t es = dpar_dtype_size(a->dtype);
    size_t nb = (size_t)dpar__prod(a->local, a->ndim) * es;
    char *tmp = (char *)DPAR_MALLOC(nb ? nb : 1);
    if (!tmp) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_array_get: out of host memory (%zu bytes)", nb);
    int64_t zero[DPAR_MAX_DIMS] = { 0 }, off[DPAR_MAX_DIMS];
    dpar_status s = DPAR_OK;
    for (int p = 0; p < a->mesh->size && !s; p++) {
        /* the canonical holder of a shard: coordinate 0 on every axis the spec does not use */
        int c[DPAR_MAX_AXES], canon = 1;
        dpar__pos_to_coords(a->mesh, p, c);
        for (int ax = 0; ax < a->mesh->ndim; ax++)
            if (!(a->used_mask & (1u << ax)) && c[ax] != 0) canon = 0;
        if (!canon) continue;
        if (a->shards[p]) s = dpar_buffer_read(a->shards[p], 0, tmp, nb);
        if (a->mesh->rt->nproc > 1) {
            /* the owner broadcasts its status and the shard to every process */
            dpar_status s2 =
                dpar__transport_get()->share(a->mesh->rt, tmp, nb, a->mesh->devices[p] / a->mesh->rt->nlocal, s);
            if (s2) s = s2;
        }
        if (s) break;
        dpar__array_offsets(a, p, off);
        dpar__copy_block((char *)host, a->shape, off, tmp, a->local, zero, a->local, a->ndim, es);
    }
    DPAR_FREE(tmp);
    return s;
}
DPAR_API dpar_buffer *dpar_array_shard(const dpar_array *a, int device) {
    if (!dpar__live_got(a, DPAR__LIVE_ARRAY, "dpar_array_shard") || device < 0 || device >= DPAR_MAX_DEVICES ||
        a->mesh->pos_of[device] < 0)
        return NULL;
    return a->shards[a->mesh->pos_of[device]];
}
DPAR_API dpar_status dpar_array_local_rows(const dpar_array *a, int64_t *begin, int64_t *count) {
    dpar__clear_error();
    if (dpar__live_arg(a, DPAR__LIVE_ARRAY, "dpar_array_local_rows", "the array")) return DPAR_ERR_STATE;
    if (!a || !begin || !count || a->ndim < 1)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_local_rows: NULL argument or 0-d array");
    int64_t lo = -1, hi = -1, off[DPAR_MAX_DIMS];
    for (int p = 0; p < a->mesh->size; p++) {
        if (!a->shards[p]) continue;
        dpar__array_offsets(a, p, off);
        if (lo < 0 || off[0] < lo) lo = off[0];
        if (hi < 0 || off[0] + a->local[0] > hi) hi = off[0] + a->local[0];
    }
    *begin = lo < 0 ? 0 : lo;
    *count = lo < 0 ? 0 : hi - lo;
    return DPAR_OK;
}
static dpar_status dpar__array_put_rows(dpar_array *a, int64_t row_begin, int64_t row_count, const void *host) {
    dpar__clear_error();
    if (!a || (!host && row_count) || a->ndim < 1)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_put_rows: NULL argument or 0-d array");
    if (row_begin < 0 || row_count < 0 || row_begin > a->shape[0] || row_count > a->shape[0] - row_begin)
        return dpar__err(DPAR_ERR_SHAPE,
                         "dpar_array_put_rows: %lld rows from row %lld are outside dimension 0 of size %lld",
                         (long long)row_count, (long long)row_begin, (long long)a->shape[0]);
    size_t es = dpar_dtype_size(a->dtype);
    size_t nb = (size_t)dpar__prod(a->local, a->ndim) * es;
    char *tmp = (char *)DPAR_MALLOC(nb ? nb : 1);
    if (!tmp) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_array_put_rows: out of host memory (%zu bytes)", nb);
    int64_t zero[DPAR_MAX_DIMS] = { 0 }, off[DPAR_MAX_DIMS], hshape[DPAR_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) hshape[d] = a->shape[d];
    hshape[0] = row_count;
    dpar_status s = DPAR_OK;
    for (int p = 0; p < a->mesh->size && !s; p++) {
        if (!a->shards[p]) continue;
        dpar__array_offsets(a, p, off);
        int64_t b = off[0], e = off[0] + a->local[0];
        if (e <= row_begin || b >= row_begin + row_count) continue; /* not covered */
        if (b < row_begin || e > row_begin + row_count) {
            s = dpar__err(
                DPAR_ERR_SHAPE,
                "dpar_array_put_rows: the shard on device %d holds rows [%lld, %lld), only partly inside [%lld, %lld); "
                "pass whole shards (dpar_array_local_rows gives this process's rows)",
                a->mesh->devices[p], (long long)b, (long long)e, (long long)row_begin,
                (long long)(row_begin + row_count));
            break;
        }
        off[0] -= row_begin;
        dpar__copy_block(tmp, a->local, zero, (const char *)host, hshape, off, a->local, a->ndim, es);
        s = dpar_buffer_write(a->shards[p], 0, tmp, nb);
    }
    DPAR_FREE(tmp);
    return s;
}
/* The host transfers: a live array, between dispatches (dpar__live_enter). */
DPAR_API dpar_status dpar_array_put(dpar_array *a, const void *host) {
    dpar_runtime *rt = NULL;
    if (a && dpar__live_enter(a, DPAR__LIVE_ARRAY, "dpar_array_put", 1, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__array_put(a, host);
    if (rt) dpar__live_leave(rt, 1);
    return s;
}
DPAR_API dpar_status dpar_array_get(const dpar_array *a, void *host) {
    dpar_runtime *rt = NULL;
    if (a && dpar__live_enter(a, DPAR__LIVE_ARRAY, "dpar_array_get", 1, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__array_get(a, host);
    if (rt) dpar__live_leave(rt, 1);
    return s;
}
DPAR_API dpar_status dpar_array_put_rows(dpar_array *a, int64_t row_begin, int64_t row_count, const void *host) {
    dpar_runtime *rt = NULL;
    if (a && dpar__live_enter(a, DPAR__LIVE_ARRAY, "dpar_array_put_rows", 1, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__array_put_rows(a, row_begin, row_count, host);
    if (rt) dpar__live_leave(rt, 1);
    return s;
}
DPAR_API int dpar_array_ndim(const dpar_array *a) {
    return dpar__live_got(a, DPAR__LIVE_ARRAY, "dpar_array_ndim") ? a->ndim : -1;
}
DPAR_API int64_t dpar_array_dim(const dpar_array *a, int i) {
    return (dpar__live_got(a, DPAR__LIVE_ARRAY, "dpar_array_dim") && i >= 0 && i < a->ndim) ? a->shape[i] : -1;
}
/* ---------------------------------------------------------------------------
   Dispatch: jobs, workers, pmap, shard_map
   ------------------------------------------------------------------------ */
enum { DPAR__CTX_EXITS = 8 };
struct dpar_ctx {
    dpar__job *job;
    dpar_runtime *rt;
    dpar_mesh *mesh;
    int device, pos;
    int coords[DPAR_MAX_AXES];
    int nargs;
    dpar_buffer **args; /* [nargs] this device's shards */
    int nexits;         /* dpar_ctx_at_exit hooks, run when fn returns */
    dpar_ctx_exit_fn exit_fn[DPAR__CTX_EXITS];
    void *exit_obj[DPAR__CTX_EXITS];
};

struct dpar__job {
    dpar_mesh *mesh;
    dpar_fn fn;
    void *user;
    dpar_ctx *ctxs; /* [mesh size] by position */
    int abort;      /* atomic */
    dpar__mutex err_mu;
    dpar_status first_status;
    int first_device;
    char first_msg[DPAR__ERR_LEN];
    unsigned char departed[DPAR_MAX_DEVICES]; /* by position, atomic */
};

static void dpar__wake_all_groups(dpar_mesh *m) {
    for (int k = 1; k < DPAR__GROUP_KEYS; k++)
        for (int g = 0; g < m->ngroups[k]; g++) {
            dpar__group *gr = &m->groups[k][g];
            dpar__mutex_lock(&gr->mu);
            dpar__cond_broadcast(&gr->cv);
            dpar__mutex_unlock(&gr->mu);
        }
}
/* Records the first error of the job (status + this thread's last-error
   text) and tells every device to stop. */
static void dpar__job_fail(dpar__job *job, int device, dpar_status s) {
    if (s == DPAR_OK) return;
    dpar__mutex_lock(&job->err_mu);
    /* an ABORTED status is only the first error if nothing else failed */
    if (job->first_status == DPAR_OK || (job->first_status == DPAR_ERR_ABORTED && s != DPAR_ERR_ABORTED)) {
        job->first_status = s;
        job->first_device = device;
        snprintf(job->first_msg, sizeof job->first_msg, "%s",
                 dpar__err_text[0] ? dpar__err_text : dpar_status_string(s));
    }
    dpar__mutex_unlock(&job->err_mu);
    if (!DPAR__ATOMIC_LOAD(&job->abort)) {
        DPAR__ATOMIC_STORE(&job->abort, 1);
        dpar__wake_all_groups(job->mesh);
    }
}

static void dpar__worker_drain(dpar__worker *w);
static DPAR__TLS const dpar_ctx *dpar__cur_ctx; /* ctx of the fn this worker runs, else NULL */

/* Runs ctx's dpar_ctx_at_exit hooks after fn returned st; the first hook
   error becomes the device's status when fn succeeded. */
static dpar_status dpar__ctx_exits(dpar_ctx *ctx, dpar_status st) {
    for (int i = 0; i < ctx->nexits; i++) {
        char keep[DPAR__ERR_LEN];
        memcpy(keep, dpar__err_text, sizeof keep);
        dpar_status h = ctx->exit_fn[i](ctx, ctx->exit_obj[i], st);
        if (h && !st)
            st = h;
        else
            memcpy(dpar__err_text, keep, sizeof keep); /* fn's own error text stays */
    }
    ctx->nexits = 0;
    return st;
}

/* Runs w's member of job (if the mesh has one): fn, its exit hooks, the
   device's pending frees. On w's thread, or on the caller's (dpar__run with
   rt->caller_runs) while w's thread sleeps: w stands for the device there. */
static void dpar__worker_job(dpar__worker *w, dpar__job *job) {
    int pos = job->mesh->pos_of[w->device];
    if (pos < 0) return;
    dpar__worker *was = dpar__self_worker;
    dpar__self_worker = w;
    dpar_ctx *ctx = &job->ctxs[pos];
    dpar__clear_error();
    dpar__cur_ctx = ctx; /* the only ctx this thread may use, until fn and its exit hooks return */
    dpar_status st = DPAR__ATOMIC_LOAD(&job->abort) ? DPAR_ERR_ABORTED : job->fn(ctx, job->user);
    if ((int)st < 0 || st > DPAR_ERR_STATE)
        st = dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                       "the pmap function returned %d, which is not a dpar_status; return DPAR_OK or "
                       "the status of the call that failed",
                       (int)st);
    st = dpar__ctx_exits(ctx, st);
    dpar__cur_ctx = NULL;
    if (st != DPAR_OK) dpar__job_fail(job, w->device, st);
    dpar__worker_drain(w);
    DPAR__ATOMIC_STORE(&job->departed[pos], 1);
    dpar__wake_all_groups(job->mesh);
    dpar__self_worker = was;
}

static DPAR__THREAD_FN(dpar__worker_main, arg) {
    dpar__worker *w = (dpar__worker *)arg;
    dpar_runtime *rt = w->rt;
    dpar__self_worker = w;
    dpar__thread_name("dev", w->device);
    dpar_status s = rt->be->thread_init ? rt->be->thread_init(rt->bstate, w->device - rt->local_base) : DPAR_OK;
    dpar__mutex_lock(&rt->mu);
    if (s != DPAR_OK && !rt->thread_init_failed) {
        rt->thread_init_failed = 1;
        snprintf(rt->thread_init_msg, sizeof rt->thread_init_msg, "%s", dpar__err_text);
    }
    rt->job_remaining++;
    dpar__cond_broadcast(&rt->cv_done);
    uint64_t seen = rt->job_gen;
    static const int no_abort = 0;
    for (;;) {
        if (rt->job_gen == seen && !rt->shutting_down) { /* the next step usually follows at once: spin first */
            dpar__mutex_unlock(&rt->mu);
            dpar__spin_until(dpar__spin_moved, &rt->job_gen, seen, &no_abort, rt->nlocal + 1);
            dpar__mutex_lock(&rt->mu);
        }
        while (rt->job_gen == seen && !rt->shutting_down) dpar__cond_wait(&rt->cv_start, &rt->mu);
        if (rt->shutting_down) break;
        seen = rt->job_gen;
        dpar__job *job = rt->job;
        dpar__mutex_unlock(&rt->mu);

        dpar__worker_job(w, job);
        dpar__mutex_lock(&rt->mu);
        if (DPAR__ATOMIC_SUB_FETCH(&rt->job_remaining, 1) == 0) dpar__cond_broadcast(&rt->cv_done);
    }
    dpar__mutex_unlock(&rt->mu);
    return 0;
}

static void dpar__reset_groups(dpar_mesh *m) {
    for (int k = 1; k < DPAR__GROUP_KEYS; k++)
        for (int g = 0; g < m->ngroups[k]; g++) {
            dpar__group *gr = &m->groups[k][g];
            dpar__mutex_lock(&gr->mu);
            gr->arrived = 0;
            memset(gr->here, 0, (size_t)gr->n);
            memset(gr->calls, 0, (size_t)gr->n * sizeof(uint64_t)); /* every dispatch starts at half 0 */
            gr->gen++;
            dpar__mutex_unlock(&gr->mu);
        }
}

/* The first asynchronous error a local device ran into (a hung or failed
   collective found while waiting, e.g. while freeing a dispatch's buffers). */
static dpar_status dpar__devices_status(dpar_runtime *rt, int *device) {
    if (!rt->be->device_status) return DPAR_OK;
    for (int i = 0; i < rt->nlocal; i++) {
        dpar_status s = rt->be->device_status(rt->bstate, i);
        if (s) {
            if (device) *device = rt->local_base + i;
            return s;
        }
    }
    return DPAR_OK;
}

/* Runs fn on every device of the mesh with args[pos * nargs + i]. */
enum { DPAR__RUN_SMALL = 8 }; /* meshes of up to this many devices dispatch without a host allocation */
static dpar_status dpar__run(dpar_mesh *m, dpar_fn fn, void *user, int nargs, dpar_buffer **args) {
    dpar_runtime *rt = m->rt;
    int bad_dev = -1;
    dpar_status early = dpar__busy(rt, NULL, "dpar_pmap/dpar_shard_map");
    if (early) return early;
    if (DPAR__ATOMIC_LOAD(&rt->lent))
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_pmap/dpar_shard_map: %d buffer(s) of the runtime are lent by dpar_vulkan_buffer_export; "
                         "call dpar_vulkan_buffer_release for each before the next dispatch",
                         (int)DPAR__ATOMIC_LOAD(&rt->lent));
    early = dpar__devices_status(rt, &bad_dev);
    if (early) {
        char msg[DPAR__ERR_LEN];
        memcpy(msg, dpar__err_text, sizeof msg);
        return dpar__err(early, "device %d: %s (from an earlier dispatch; destroy the runtime)", bad_dev, msg);
    }
    if ((early = dpar__transport_get()->dispatch_begin(rt))) return early;
    dpar__job job;
    memset(&job, 0, sizeof job);
    job.mesh = m;
    job.fn = fn;
    job.user = user;
    dpar_ctx small[DPAR__RUN_SMALL]; /* a small mesh's contexts: no allocation per dispatch (a replayed step's) */
    job.ctxs = m->size <= DPAR__RUN_SMALL ? small : (dpar_ctx *)DPAR_MALLOC((size_t)m->size * sizeof(dpar_ctx));
    if (!job.ctxs) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_pmap: out of host memory");
    memset(job.ctxs, 0, (size_t)m->size * sizeof(dpar_ctx));
    dpar__mutex_init(&job.err_mu);
    for (int p = 0; p < m->size; p++) {
        dpar_ctx *c = &job.ctxs[p];
        c->job = &job;
        c->rt = rt;
        c->mesh = m;
        c->device = m->devices[p];
        c->pos = p;
        dpar__pos_to_coords(m, p, c->coords);
        c->nargs = nargs;
        c->args = args ? args + (size_t)p * (size_t)nargs : NULL;
    }
    double t0 = DPAR__ATOMIC_LOAD(&dpar__trace_on) ? dpar__now_us() : 0.0;
    dpar__live_dispatch(rt, 1); /* waits for host transfers; refuses new ones until the end */
    dpar__mutex_lock(&rt->dispatch_mu);
    dpar__mutex_lock(&rt->mu);
    rt->job = &job;
    rt->job_count++;
    rt->job_id = DPAR__ATOMIC_ADD_FETCH(&dpar__job_ids, 1);
    if (rt->caller_runs && m->size == 1) {
        /* the one member runs here: no wake-up of its worker, no wait for it (the hand-off and the
           spins cost a Vulkan step's host most of its time); the worker sleeps on cv_start */
        dpar__mutex_unlock(&rt->mu);
        dpar__worker_job(&rt->workers[0], &job);
        dpar__mutex_lock(&rt->mu);
    } else {
        rt->job_remaining = rt->nlocal;
        DPAR__ATOMIC_STORE(&rt->job_gen, rt->job_gen + 1); /* workers spin on it */
        dpar__cond_broadcast(&rt->cv_start);
        if (rt->job_remaining > 0) {
            dpar__mutex_unlock(&rt->mu);
            dpar__spin_until(dpar__spin_zero, &rt->job_remaining, 0, &job.abort, rt->nlocal + 1);
            dpar__mutex_lock(&rt->mu);
        }
        while (rt->job_remaining > 0) dpar__cond_wait(&rt->cv_done, &rt->mu);
    }
    rt->job = NULL;
    dpar__mutex_unlock(&rt->mu);
    dpar_status late = dpar__devices_status(rt, &bad_dev); /* e.g. found while the workers freed their buffers */
    if (late && !job.first_status) {
        job.first_status = late;
        job.first_device = bad_dev;
        snprintf(job.first_msg, sizeof job.first_msg, "%s", dpar__err_text);
    }
    dpar__transport_get()->dispatch_end(m, &job, late);
    dpar__reset_groups(m);
    dpar__mutex_unlock(&rt->dispatch_mu);
    dpar__live_dispatch(rt, -1);
    dpar_status s = job.first_status;
    if (s != DPAR_OK && job.first_device >= 0)
        dpar__err(s, "device %d: %s", job.first_device, job.first_msg);
    else if (s != DPAR_OK)
        dpar__err(s, "%s", job.first_msg);
    else
        dpar__clear_error();
    dpar__mutex_destroy(&job.err_mu);
    if (job.ctxs != small) DPAR_FREE(job.ctxs);
    if (t0 > 0.0) dpar__trace_event(dpar__trace_pid(rt), -1, "dispatch", "host", t0, dpar__now_us(), -1);
    return s;
}

static dpar_status dpar__shard_map(dpar_mesh *m, const dpar_shard_map_desc *desc) {
    dpar__clear_error();
    dpar_shard_map_desc resolved;
    const dpar_shard_map_desc *d = desc ? &resolved : NULL;
    if (desc) {
        resolved = *desc;
        if (resolved.num_args == 0) /* inferred: the leading non-NULL args */
            while (resolved.num_args < DPAR_MAX_ARGS && resolved.args[resolved.num_args]) resolved.num_args++;
    }
    if (!m || !d || !d->fn)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map: mesh, desc or desc->fn is NULL");
    if (dpar__self_worker)
        return dpar__err(
            DPAR_ERR_STATE,
            "dpar_shard_map: called from inside a pmap/shard_map function; nested dispatch is not supported");
    if (d->num_args < 0 || d->num_args > DPAR_MAX_ARGS)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map: num_args = %d is out of range 0..%d", d->num_args,
                         (int)DPAR_MAX_ARGS);
    for (int i = 0; i < d->num_args; i++) {
        if (!d->args[i]) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map: args[%d] is NULL", i);
        if (dpar__live_check(d->args[i], DPAR__LIVE_ARRAY, "dpar_shard_map")) return DPAR_ERR_STATE;
        if (d->args[i]->mesh != m)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map: args[%d] was created on another mesh", i);
    }
    size_t n = (size_t)m->size * (size_t)d->num_args;
    /* a small mesh's table: no allocation per dispatch (ints: C++20 deprecates arithmetic between enums) */
    dpar_buffer *small[(int)DPAR__RUN_SMALL * (int)DPAR_MAX_ARGS];
    dpar_buffer **tab = n <= sizeof small / sizeof *small ? small : (dpar_buffer **)DPAR_MALLOC(n * sizeof *tab);
    if (!tab) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_shard_map: out of host memory");
    for (int p = 0; p < m->size; p++)
        for (int i = 0; i < d->num_args; i++)
            tab[(size_t)p * (size_t)d->num_args + (size_t)i] = d->args[i]->shards[p]; /* NULL if remote */
    dpar_status s = dpar__run(m, d->fn, d->user, d->num_args, d->num_args ? tab : NULL);
    if (tab != small) DPAR_FREE(tab);
    return s;
}

DPAR_API dpar_status dpar_shard_map(dpar_mesh *m, const dpar_shard_map_desc *desc) {
    dpar__clear_error();
    dpar_runtime *rt = NULL; /* counted in flight: no destroy frees m or the args meanwhile */
    if (m && dpar__live_enter(m, DPAR__LIVE_MESH, "dpar_shard_map", 0, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__shard_map(m, desc);
    if (rt) dpar__live_leave(rt, 0);
    return s;
}

/* dpar_pmap's argument checks, all before anything runs: dtypes, shapes, data
   pointers, and mapped inputs whose leading dimension is the n devices of the axis. */
static dpar_status dpar__pmap_check(const dpar_pmap_desc *d, int n) {
    dpar_status s;
    for (int i = 0; i < d->num_inputs; i++) {
        const dpar_pmap_input *in = &d->inputs[i];
        char where[48];
        snprintf(where, sizeof where, "dpar_pmap: input %d", i);
        if (dpar_dtype_size(in->dtype) == 0)
            return dpar__err(DPAR_ERR_DTYPE, "%s: dtype %d is not a dpar_dtype", where, (int)in->dtype);
        s = dpar__check_shape(where, in->ndim, in->shape);
        if (s) return s;
        if (!in->data && dpar__prod(in->shape, in->ndim) > 0)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: data is NULL", where);
        if (in->in_axis == DPAR_MAPPED) {
            if (in->ndim < 1)
                return dpar__err(DPAR_ERR_SHAPE,
                                 "%s is a scalar but is mapped over axis '%s'; use in_axis = DPAR_REPLICATED", where,
                                 d->axis);
            if (in->shape[0] != n)
                return dpar__err(
                    DPAR_ERR_SHAPE,
                    "dpar_pmap: input %d has leading dimension %lld but mesh axis '%s' has %d device%s; "
                    "give it a leading dimension of %d, or use dpar_shard_map to split %lld rows over %d devices",
                    i, (long long)in->shape[0], d->axis, n, n == 1 ? "" : "s", n, (long long)in->shape[0], n);
        } else if (in->in_axis != DPAR_REPLICATED) {
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: in_axis = %d; use DPAR_MAPPED (0) or DPAR_REPLICATED (-1)",
                             where, in->in_axis);
        }
    }
    for (int j = 0; j < d->num_outputs; j++) {
        const dpar_pmap_output *o = &d->outputs[j];
        char where[48];
        snprintf(where, sizeof where, "dpar_pmap: output %d", j);
        if (dpar_dtype_size(o->dtype) == 0)
            return dpar__err(DPAR_ERR_DTYPE, "%s: dtype %d is not a dpar_dtype", where, (int)o->dtype);
        s = dpar__check_shape(where, o->ndim, o->shape);
        if (s) return s;
        if (o->ndim + 1 > DPAR_MAX_DIMS)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: ndim %d leaves no room for the stacked dimension", where,
                             o->ndim);
        if (!o->data && dpar__prod(o->shape, o->ndim) > 0)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: data is NULL", where);
    }
    return DPAR_OK;
}

static dpar_status dpar__pmap(dpar_mesh *m, const dpar_pmap_desc *desc) {
    dpar__clear_error();
    dpar_pmap_desc resolved;
    const dpar_pmap_desc *d = desc ? &resolved : NULL;
    if (desc) { /* counts of 0 inferred: the leading inputs / outputs with non-NULL data */
        resolved = *desc;
        if (resolved.num_inputs == 0)
            while (resolved.num_inputs < DPAR_MAX_ARGS / 2 && resolved.inputs[resolved.num_inputs].data)
                resolved.num_inputs++;
        if (resolved.num_outputs == 0)
            while (resolved.num_outputs < DPAR_MAX_ARGS / 2 && resolved.outputs[resolved.num_outputs].data)
                resolved.num_outputs++;
    }
    if (!m || !d || !d->fn) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_pmap: mesh, desc or desc->fn is NULL");
    if (dpar__self_worker)
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_pmap: called from inside a pmap/shard_map function; nested dispatch is not supported");
    dpar_status busy = dpar__busy(m->rt, NULL, "dpar_pmap");
    if (busy) return busy;
    unsigned mask;
    dpar_status s = dpar__parse_axes(m, "dpar_pmap", d->axis, &mask, NULL, NULL);
    if (s) return s;
    if (d->num_inputs < 0 || d->num_outputs < 0 || d->num_inputs > DPAR_MAX_ARGS / 2 ||
        d->num_outputs > DPAR_MAX_ARGS / 2)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_pmap: num_inputs/num_outputs must be in 0..%d",
                         (int)DPAR_MAX_ARGS / 2);
    int n = dpar__mask_size(m, mask);
    s = dpar__pmap_check(d, n); /* everything is validated before anything runs */
    if (s) return s;
    /* the mapped axis name(s) as a spec */
    int nargs = d->num_inputs + d->num_outputs;
    dpar_array *arrs[DPAR_MAX_ARGS];
    memset(arrs, 0, sizeof arrs);
    for (int i = 0; i < d->num_inputs && !s; i++) {
        const dpar_pmap_input *in = &d->inputs[i];
        dpar_array_desc ad;
        memset(&ad, 0, sizeof ad);
        ad.dtype = in->dtype;
        ad.ndim = in->ndim;
        for (int k = 0; k < in->ndim; k++) ad.shape[k] = in->shape[k];
        if (in->in_axis == DPAR_MAPPED) ad.spec[0] = d->axis;
        s = dpar_array_create(m, &ad, &arrs[i]);
        if (!s) s = dpar_array_put(arrs[i], in->data);
        if (!s && in->in_axis == DPAR_MAPPED) /* drop the mapped dimension of size 1 */
            for (int p = 0; p < m->size; p++) {
                dpar_buffer *b = arrs[i]->shards[p];
                if (b) s = dpar_buffer_reshape(b, b->ndim - 1, b->shape + 1);
            }
    }
    for (int j = 0; j < d->num_outputs && !s; j++) {
        const dpar_pmap_output *o = &d->outputs[j];
        dpar_array_desc ad;
        memset(&ad, 0, sizeof ad);
        ad.dtype = o->dtype;
        ad.ndim = o->ndim + 1;
        ad.shape[0] = n;
        for (int k = 0; k < o->ndim; k++) ad.shape[k + 1] = o->shape[k];
        ad.spec[0] = d->axis;
        s = dpar_array_create(m, &ad, &arrs[d->num_inputs + j]);
        if (!s)
            for (int p = 0; p < m->size; p++) {
                dpar_buffer *b = arrs[d->num_inputs + j]->shards[p];
                if (b) s = dpar_buffer_reshape(b, b->ndim - 1, b->shape + 1);
            }
    }
    dpar_buffer **tab = NULL;
    if (!s) {
        tab = (dpar_buffer **)dpar__calloc((size_t)m->size * (size_t)(nargs ? nargs : 1), sizeof(dpar_buffer *));
        if (!tab) s = dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_pmap: out of host memory");
    }
    if (!s) {
        for (int p = 0; p < m->size; p++)
            for (int i = 0; i < nargs; i++) tab[(size_t)p * (size_t)nargs + (size_t)i] = arrs[i]->shards[p];
        s = dpar__run(m, d->fn, d->user, nargs, tab);
    }
    if (!s) {
        for (int j = 0; j < d->num_outputs && !s; j++) {
            dpar_array *a = arrs[d->num_inputs + j];
            for (int p = 0; p < m->size; p++) { /* restore [1, ...] shard shapes for the gather */
                dpar_buffer *b = a->shards[p];
                if (!b) continue;
                b->ndim = a->ndim;
                for (int k = 0; k < a->ndim; k++) b->shape[k] = a->local[k];
            }
            s = dpar_array_get(a, d->outputs[j].data);
        }
    }
    char saved[DPAR__ERR_LEN];
    memcpy(saved, dpar__err_text, sizeof saved);
    for (int i = 0; i < nargs; i++) dpar__array_free(arrs[i]); /* not the public destroy: this call is in flight */
    DPAR_FREE(tab);
    memcpy(dpar__err_text, saved, sizeof saved);
    if (!s) { /* freeing the buffers waited for the devices: a collective that hung shows up here */
        int dv = -1;
        dpar_status e = dpar__devices_status(m->rt, &dv);
        if (e) {
            memcpy(saved, dpar__err_text, sizeof saved);
            s = dpar__err(e, "device %d: %s", dv, saved);
        }
    }
    return s;
}

DPAR_API dpar_status dpar_pmap(dpar_mesh *m, const dpar_pmap_desc *desc) {
    dpar__clear_error();
    dpar_runtime *rt = NULL; /* counted in flight: no destroy frees m meanwhile */
    if (m && dpar__live_enter(m, DPAR__LIVE_MESH, "dpar_pmap", 0, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__pmap(m, desc);
    if (rt) dpar__live_leave(rt, 0);
    return s;
}

/* A ctx is valid only on the thread running the fn it was passed to, until fn
   returns: checked by comparing it with that thread's current ctx (no lookup,
   and a stale ctx is never dereferenced). */
static dpar_status dpar__ctx_check(const dpar_ctx *ctx, const char *fn) {
    if (DPAR__LIKELY(ctx != NULL && ctx == dpar__cur_ctx)) return DPAR_OK;
    if (!ctx)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "%s: ctx is NULL (call it inside a pmap/shard_map function, with the ctx it was given)", fn);
    return dpar__err(DPAR_ERR_STATE,
                     "%s: this dpar_ctx is not the one of the pmap/shard_map function running on this thread; a ctx "
                     "is valid only inside the function it was passed to, on that thread, until it returns",
                     fn);
}
#define DPAR__CTX_OK(ctx) ((ctx) != NULL && (ctx) == dpar__cur_ctx)
DPAR_API int dpar_ctx_device(const dpar_ctx *ctx) {
    return DPAR__CTX_OK(ctx) ? ctx->device : -1;
}
DPAR_API int dpar_ctx_position(const dpar_ctx *ctx) {
    return DPAR__CTX_OK(ctx) ? ctx->pos : -1;
}
DPAR_API uint64_t dpar_ctx_dispatch_id(const dpar_ctx *ctx) {
    return DPAR__CTX_OK(ctx) ? ctx->rt->job_count : 0;
}
DPAR_API bool dpar_in_dispatch(void) {
    return dpar__self_worker != NULL;
}
DPAR_API dpar_runtime *dpar_ctx_runtime(const dpar_ctx *ctx) {
    return DPAR__CTX_OK(ctx) ? ctx->rt : NULL;
}
DPAR_API dpar_mesh *dpar_ctx_mesh(const dpar_ctx *ctx) {
    return DPAR__CTX_OK(ctx) ? ctx->mesh : NULL;
}
DPAR_API dpar_status dpar_ctx_at_exit(dpar_ctx *ctx, dpar_ctx_exit_fn fn, void *obj) {
    dpar__clear_error();
    dpar_status s = dpar__ctx_check(ctx, "dpar_ctx_at_exit");
    if (s) return s;
    if (!fn) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_ctx_at_exit: fn is NULL");
    for (int i = 0; i < ctx->nexits; i++)
        if (ctx->exit_fn[i] == fn && ctx->exit_obj[i] == obj) return DPAR_OK;
    if (ctx->nexits == DPAR__CTX_EXITS)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_ctx_at_exit: %d hooks are registered already (the most)",
                         (int)DPAR__CTX_EXITS);
    ctx->exit_fn[ctx->nexits] = fn;
    ctx->exit_obj[ctx->nexits++] = obj;
    return DPAR_OK;
}
DPAR_API dpar_buffer *dpar_ctx_arg(const dpar_ctx *ctx, int i) {
    if (dpar__ctx_check(ctx, "dpar_ctx_arg")) return NULL;
    if (i < 0 || i >= ctx->nargs) {
        dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_ctx_arg: argument %d is out of range; this call has %d arguments", i,
                  ctx ? ctx->nargs : 0);
        return NULL;
    }
    return ctx->args[i];
}
DPAR_API dpar_status dpar_ctx_axis_index(const dpar_ctx *ctx, const char *axes, int *out) {
    dpar__clear_error();
    dpar_status cs = dpar__ctx_check(ctx, "dpar_ctx_axis_index");
    if (cs) return cs;
    if (!out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_ctx_axis_index: out is NULL");
    unsigned mask;
    int order[DPAR_MAX_AXES], norder;
    dpar_status s = dpar__parse_axes(ctx->mesh, "dpar_ctx_axis_index", axes, &mask, order, &norder);
    if (s) return s;
    int gid;
    dpar__group_of(ctx->mesh, dpar__axes_key(ctx->mesh, order, norder), ctx->pos, &gid, out);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_ctx_axis_size(const dpar_ctx *ctx, const char *axes, int *out) {
    dpar__clear_error();
    dpar_status cs = dpar__ctx_check(ctx, "dpar_ctx_axis_size");
    if (cs) return cs;
    if (!out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_ctx_axis_size: out is NULL");
    unsigned mask;
    dpar_status s = dpar__parse_axes(ctx->mesh, "dpar_ctx_axis_size", axes, &mask, NULL, NULL);
    if (s) return s;
    *out = dpar__mask_size(ctx->mesh, mask);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_ctx_buffer(dpar_ctx *ctx, dpar_dtype dtype, int ndim, const int64_t *shape,
                                     dpar_buffer **out) {
    dpar_status s = dpar__ctx_check(ctx, "dpar_ctx_buffer");
    if (s) {
        if (out) *out = NULL;
        return s;
    }
    return dpar_buffer_create(ctx->rt, ctx->device, dtype, ndim, shape, out);
}
/* ---------------------------------------------------------------------------
   Collectives: rendezvous, matching, the host path, async requests
   ------------------------------------------------------------------------ */
typedef struct dpar__cargs {
    dpar__coll_kind kind;
    dpar_reduce_op op;
    dpar_buffer *out;
    const dpar_buffer *in;
    char axes[128];
    int dim, tiled, split_dim, concat_dim, root;
    int npairs;
    int pairs[2 * DPAR_MAX_DEVICES];
} dpar__cargs;

struct dpar_request {
    struct dpar_request *next;      /* queue link */
    struct dpar_request *live_next; /* worker's list of un-waited requests */
    dpar_ctx *ctx;
    dpar__cargs args;
    int done;
    dpar_status status;
    char msg[DPAR__ERR_LEN];
    struct dpar__disp *disp; /* a step (>>async dispatch); NULL: a collective */
};
static dpar_status dpar__disp_wait(struct dpar_request *r);

static const char *dpar__coll_name(dpar__coll_kind k, dpar_reduce_op op) {
    switch (k) {
    case DPAR__COLL_ALL_REDUCE:
        return op == DPAR_SUM ? "psum" : op == DPAR_MEAN ? "pmean" : op == DPAR_MAX ? "pmax" : "pmin";
    case DPAR__COLL_ALL_GATHER: return "all_gather";
    case DPAR__COLL_REDUCE_SCATTER: return "psum_scatter";
    case DPAR__COLL_PERMUTE: return "ppermute";
    case DPAR__COLL_ALL_TO_ALL: return "all_to_all";
    case DPAR__COLL_BROADCAST: return "pbroadcast";
    default: return "collective";
    }
}
static int dpar__post_by_shape(int kind) {
    return kind == DPAR__COLL_ALL_GATHER || kind == DPAR__COLL_REDUCE_SCATTER || kind == DPAR__COLL_ALL_TO_ALL;
}
static void dpar__post_str(const dpar__post *p, char *buf, size_t cap) {
    char sh[96];
    int at = dpar__post_by_shape(p->kind)
                 ? snprintf(buf, cap, "%s of shape %s %s", p->name, dpar__shape_str(sh, sizeof sh, p->ndim, p->shape),
                            dpar_dtype_name((dpar_dtype)p->dtype))
                 : snprintf(buf, cap, "%s of %lld %s elements", p->name, (long long)p->in_count,
                            dpar_dtype_name((dpar_dtype)p->dtype));
    if (at < 0 || (size_t)at >= cap) return;
    if (p->kind == DPAR__COLL_ALL_GATHER || p->kind == DPAR__COLL_REDUCE_SCATTER)
        snprintf(buf + at, cap - (size_t)at, " (dim %d, %s)", p->dim, p->tiled ? "tiled" : "stacked");
    else if (p->kind == DPAR__COLL_ALL_TO_ALL)
        snprintf(buf + at, cap - (size_t)at, " (split dim %d, concat dim %d)", p->split_dim, p->concat_dim);
    else if (p->kind == DPAR__COLL_BROADCAST)
        snprintf(buf + at, cap - (size_t)at, " (root %d)", p->root);
    else if (p->kind == DPAR__COLL_PERMUTE)
        snprintf(buf + at, cap - (size_t)at, " (pairs hash %llx)", (unsigned long long)p->pairs_hash);
}
static int dpar__post_eq(const dpar__post *a, const dpar__post *b) {
    return a->kind == b->kind && a->op == b->op && a->dtype == b->dtype && a->in_count == b->in_count &&
           a->out_count == b->out_count && a->dim == b->dim && a->tiled == b->tiled && a->split_dim == b->split_dim &&
           a->concat_dim == b->concat_dim && a->root == b->root && a->pairs_hash == b->pairs_hash &&
           (!dpar__post_by_shape(a->kind) ||
            (a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)(a->ndim > 0 ? a->ndim : 0))));
}

/* Waits a short while for done(word, seen) without sleeping: a spin
   with pause for DPAR_SPIN_US microseconds (default 2), then dpar__thread_yield()
   rounds, so that a core shared with a member not yet arrived (more workers
   than CPUs, or another process on the machine) runs that member, for up to
   100 us (20 us when there are more worker threads than online CPUs; 10x
   DPAR_SPIN_US when set). DPAR_SPIN_US=0 always sleeps at once. Returns 1 when it moved, 0 to fall
   back to the condition wait (also on abort). A futex wake-up costs 5-50 us;
   most rendezvous of a training step complete within the spin. */
static int dpar__spin_env = -2, dpar__ncpu = 0;
static int dpar__spin_moved(const void *word, uint64_t seen) {
    return DPAR__ATOMIC_LOAD((const uint64_t *)word) != seen;
}
static int dpar__spin_zero(const void *word, uint64_t unused) {
    (void)unused;
    return DPAR__ATOMIC_LOAD((const int *)word) == 0;
}
static int dpar__spin_until(int (*done)(const void *, uint64_t), const void *word, uint64_t seen, const int *abort_flag,
                            int nthreads) {
    int us = DPAR__ATOMIC_LOAD(&dpar__spin_env);
    if (us == -2) {
        us = dpar__env_int("DPAR_SPIN_US", -1);
        DPAR__ATOMIC_STORE(&dpar__ncpu, dpar__cpu_count());
        DPAR__ATOMIC_STORE(&dpar__spin_env, us);
    }
    int yield_us = 0;
    if (us < 0) {
        us = 2;
        yield_us = nthreads <= DPAR__ATOMIC_LOAD(&dpar__ncpu) ? 100 : 20;
    } else
        yield_us = 10 * us;
    if (us == 0) return 0;
    uint64_t t0 = dpar__now_ns();
    for (uint32_t i = 1;; i++) {
        if (done(word, seen)) return 1;
        if ((i & 15) == 0) {
            if (DPAR__ATOMIC_LOAD(abort_flag)) return 0;
            long el = (long)((dpar__now_ns() - t0) / 1000u);
            if (el > us + yield_us) return 0;
            if (el > us) dpar__thread_yield();
        }
        DPAR__CPU_RELAX();
    }
}

/* Barrier over the group, with abort, departure and timeout detection.
   `what` names the collective for messages. */
static dpar_status dpar__barrier_t(dpar__group *g, int rank, dpar_ctx *ctx, const char *what, int slack);
static dpar_status dpar__barrier(dpar__group *g, int rank, dpar_ctx *ctx, const char *what) {
    return dpar__barrier_t(g, rank, ctx, what, 1);
}
/* Barrier of the group's members on this process. `slack` multiplies the
   timeout (members waiting for a leader that waits on other processes). */
static dpar_status dpar__barrier_t(dpar__group *g, int rank, dpar_ctx *ctx, const char *what, int slack) {
    dpar__job *job = ctx->job;
    dpar_runtime *rt = ctx->rt;
    dpar_status s = DPAR_OK;
    DPAR_ASSERT(rank >= 0 && rank < g->n && g->devices[rank] == ctx->device); /* the caller is this member */
    dpar__mutex_lock(&g->mu);
    uint64_t my = g->gen;
    g->here[rank] = 1;
    if (++g->arrived == g->nlocal) {
        g->arrived = 0;
        memset(g->here, 0, (size_t)g->n);
        DPAR__ATOMIC_STORE(&g->gen, my + 1);
        if (g->sleepers) dpar__cond_broadcast(&g->cv);
        dpar__mutex_unlock(&g->mu);
        return DPAR_OK;
    }
    dpar__mutex_unlock(&g->mu);
    if (dpar__spin_until(dpar__spin_moved, &g->gen, my, &job->abort, rt->nlocal)) return DPAR_OK;
    dpar__mutex_lock(&g->mu);
    g->sleepers++;
    uint64_t dl = dpar__deadline(rt->timeout_ms * slack);
    while (g->gen == my) {
        if (DPAR__ATOMIC_LOAD(&job->abort)) {
            s = dpar__err(DPAR_ERR_ABORTED, "%s: stopped because another device failed first", what);
            break;
        }
        int gone = -1;
        for (int r = 0; r < g->n && gone < 0; r++)
            if (!g->here[r] && dpar__is_local(rt, g->devices[r]) &&
                DPAR__ATOMIC_LOAD(&job->departed[g->mesh->pos_of[g->devices[r]]]))
                gone = g->devices[r];
        if (gone >= 0) {
            s = dpar__err(
                DPAR_ERR_COLLECTIVE_MISMATCH,
                "%s (collective #%llu of this group): device %d returned from the pmap function without calling it; "
                "every device of the group must make the same collective calls (uneven step counts?)",
                what, (unsigned long long)g->seq, gone);
            break;
        }
        int rc = dpar__cond_timedwait(&g->cv, &g->mu, dl);
        if (rc == ETIMEDOUT && g->gen == my) {
            char list[512];
            size_t at = 0;
            list[0] = 0;
            for (int r = 0; r < g->n && at < sizeof list; r++)
                if (!g->here[r] && dpar__is_local(rt, g->devices[r]))
                    at += (size_t)snprintf(list + at, sizeof list - at, at ? ", %d" : "%d", g->devices[r]);
            s = dpar__err(DPAR_ERR_TIMEOUT,
                          "%s (collective #%llu of this group): timed out after %d ms waiting for device(s) %s, which "
                          "never arrived; "
                          "check that every device makes the same collective calls (DPAR_TIMEOUT_MS sets the timeout)",
                          what, (unsigned long long)g->seq, rt->timeout_ms, list);
            break;
        }
    }
    /* leaving with an error: withdraw this member's arrival, so a late member
       cannot complete the barrier and release the others into a collective
       whose member is gone (its buffers may already be freed). here[rank]
       stays set: the others' timeout / departure messages must not name it. */
    if (s != DPAR_OK && g->gen == my) g->arrived--;
    g->sleepers--;
    dpar__mutex_unlock(&g->mu);
    if (s != DPAR_OK && s != DPAR_ERR_ABORTED) dpar__job_fail(job, ctx->device, s);
    return s;
}

/* The end of a call's host work on one process: adds this member's `did`
   chunks to the half's count (release: its writes come before) and waits
   until the members did all `total` (acquire: theirs are then visible), with
   the barrier's spin, then the condition wait; the member that completes the
   count wakes the sleepers. Every claimed chunk is done by a member that is
   running, so the wait ends without the others calling again. */
static int dpar__spin_reached(const void *word, uint64_t total) {
    return DPAR__ATOMIC_LOAD((const int64_t *)word) >= (int64_t)total;
}
static dpar_status dpar__host_wait_done(dpar__group *g, int half, int64_t did, int64_t total, dpar_ctx *ctx,
                                        const char *what) {
    int64_t *done = &g->done[half];
    if (did && DPAR__ATOMIC_ADD_FETCH(done, did) == total) {
        dpar__mutex_lock(&g->mu);
        if (g->sleepers) dpar__cond_broadcast(&g->cv);
        dpar__mutex_unlock(&g->mu);
        return DPAR_OK;
    }
    if (dpar__spin_until(dpar__spin_reached, done, (uint64_t)total, &ctx->job->abort, ctx->rt->nlocal)) return DPAR_OK;
    dpar_status s = DPAR_OK;
    uint64_t dl = dpar__deadline(ctx->rt->timeout_ms);
    dpar__mutex_lock(&g->mu);
    g->sleepers++;
    while (DPAR__ATOMIC_LOAD(done) < total)
        if (dpar__cond_timedwait(&g->cv, &g->mu, dl) == ETIMEDOUT && DPAR__ATOMIC_LOAD(done) < total) {
            s = dpar__err(DPAR_ERR_TIMEOUT,
                          "%s (collective #%llu of this group): the members' work was not done after %d ms (a member "
                          "stopped while it held a share of it); DPAR_TIMEOUT_MS sets the timeout",
                          what, (unsigned long long)g->seq, ctx->rt->timeout_ms);
            break;
        }
    g->sleepers--;
    dpar__mutex_unlock(&g->mu);
    if (s) dpar__job_fail(ctx->job, ctx->device, s);
    return s;
}

typedef struct dpar__coll_state {
    dpar_ctx *ctx;
    char what[160];
} dpar__coll_state;

DPAR__MAYBE_UNUSED static dpar_status dpar__coll_barrier(dpar__coll *c) {
    dpar__coll_state *st = (dpar__coll_state *)c->ctx;
    return dpar__barrier(c->group, c->rank, st->ctx, st->what);
}

/* f32 sum (mean: then / n) of n sources into ndst destinations in one pass:
   per element ((s0 + s1) + s2) + ..., the same order and rounding as the
   scalar loop, so results stay bitwise reproducible. `nt`: non-temporal
   stores (large spans: the outputs bypass the cache instead of evicting the
   inputs and paying a read-for-ownership per line). */
static int64_t dpar__sum_f32_scalar(int n, const float *const *src, float *const *dst, int ndst, int64_t lo, int64_t hi,
                                    int mean) {
    for (int64_t i = lo; i < hi; i++) {
        float a = src[0][i];
        for (int j = 1; j < n; j++) a += src[j][i];
        if (mean) a /= (float)n;
        for (int k = 0; k < ndst; k++) dst[k][i] = a;
    }
    return hi;
}
#if defined(__aarch64__) && defined(__ARM_NEON) && !defined(DPAR_NO_SIMD)
/* aarch64: NEON is always there (no run-time check); DPAR_NO_SIMD leaves the scalar loops */
#include <arm_neon.h>
#define DPAR__ARM_NEON 1
/* f32 sum / mean, per element in the scalar loop's order: the same bits */
static int64_t dpar__sum_f32_neon(int n, const float *const *src, float *const *dst, int ndst, int64_t len, int mean) {
    int64_t i = 0;
    const float32x4_t dn = vdupq_n_f32((float)n);
    for (; i + 8 <= len; i += 8) {
        float32x4_t a0 = vld1q_f32(src[0] + i), a1 = vld1q_f32(src[0] + i + 4);
        for (int j = 1; j < n; j++) {
            a0 = vaddq_f32(a0, vld1q_f32(src[j] + i));
            a1 = vaddq_f32(a1, vld1q_f32(src[j] + i + 4));
        }
        if (mean) {
            a0 = vdivq_f32(a0, dn);
            a1 = vdivq_f32(a1, dn);
        }
        for (int k = 0; k < ndst; k++) {
            vst1q_f32(dst[k] + i, a0);
            vst1q_f32(dst[k] + i + 4, a1);
        }
    }
    return i;
}
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DPAR_NO_SIMD)
#include <immintrin.h>
#define DPAR__X86_SIMD 1
__attribute__((target("avx2"))) static void dpar__sum_f32_avx2(int n, const float *const *src, float *const *dst,
                                                               int ndst, int64_t len, int mean, int nt) {
    int64_t i = 0;
    if (nt) { /* align the stores; every destination must share the alignment */
        int64_t head = (int64_t)((32 - ((uintptr_t)dst[0] & 31)) & 31);
        if (head % 4) nt = 0;
        for (int k = 1; k < ndst && nt; k++)
            if (((uintptr_t)dst[k] & 31) != ((uintptr_t)dst[0] & 31)) nt = 0;
        if (nt) i = dpar__sum_f32_scalar(n, src, dst, ndst, 0, head / 4 < len ? head / 4 : len, mean);
    }
    const __m256 dn = _mm256_set1_ps((float)n);
    for (; i + 16 <= len; i += 16) {
        __m256 a0 = _mm256_loadu_ps(src[0] + i), a1 = _mm256_loadu_ps(src[0] + i + 8);
        for (int j = 1; j < n; j++) {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(src[j] + i));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(src[j] + i + 8));
        }
        if (mean) {
            a0 = _mm256_div_ps(a0, dn);
            a1 = _mm256_div_ps(a1, dn);
        }
        if (nt)
            for (int k = 0; k < ndst; k++) {
                _mm256_stream_ps(dst[k] + i, a0);
                _mm256_stream_ps(dst[k] + i + 8, a1);
            }
        else
            for (int k = 0; k < ndst; k++) {
                _mm256_storeu_ps(dst[k] + i, a0);
                _mm256_storeu_ps(dst[k] + i + 8, a1);
            }
    }
    if (nt) _mm_sfence();
    dpar__sum_f32_scalar(n, src, dst, ndst, i, len, mean);
}
#endif
/* bytes of cache `index` of CPU 0 as Linux describes it (index2: L2, index3:
   L3), else 0 */
static long dpar__sys_cache_bytes(int index) {
    char path[64], unit = 0;
    long c = 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (fscanf(f, "%ld%c", &c, &unit) < 1) c = 0;
    fclose(f);
    return unit == 'K' ? c << 10 : unit == 'M' ? c << 20 : c;
}
/* whether a collective whose members together touch `bytes` should write with
   streaming stores: once they no longer fit in 3/4 of the caches they can
   stay in, where ordinary stores would first read every destination line (3
   bytes of traffic per 2 copied) and evict the sources. Those caches: the
   last-level cache, but no more than the private L2s of all CPUs together. A
   VM reports its host's whole L3 (266 MB on a 2-CPU guest here, 384 MB for 32
   MB measured on an EPYC guest) and shares it with other guests: measured on
   that 2-CPU guest (2 MB L2 each), streaming copies win from 8 MB on (64 vs 52
   GB/s), ordinary ones only up to 4 MB. Linux's cache description first:
   sysconf can report the host's figures. */
static int dpar__streaming(uint64_t bytes) {
    static long fit = 0;
    long c = DPAR__ATOMIC_LOAD(&fit);
    if (!c) {
        long l3 = dpar__sys_cache_bytes(3), l2 = dpar__sys_cache_bytes(2);
        if (l3 <= 0) l3 = dpar__cache_bytes(3);
        if (l3 <= 0) l3 = 32L << 20;
        if (l2 <= 0) l2 = dpar__cache_bytes(2);
        long cpus = dpar__cpu_count();
        c = l2 > 0 && cpus > 0 && l2 * cpus < l3 ? l2 * cpus : l3;
        DPAR__ATOMIC_STORE(&fit, c);
    }
    return bytes > (uint64_t)c / 4u * 3u;
}
#ifdef DPAR__X86_SIMD
/* memcpy with streaming stores (the caller fences) */
__attribute__((target("avx2"))) static void dpar__copy_nt_avx2(char *d, const char *s, size_t n) {
    size_t i = (32 - ((uintptr_t)d & 31)) & 31;
    if (i > n) i = n;
    memcpy(d, s, i);
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i)), b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i f = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), e);
        _mm256_stream_si256((__m256i *)(d + i + 96), f);
    }
    memcpy(d + i, s + i, n - i);
}
#endif
/* n bytes of src to each of the ndst destinations (a destination equal to src
   is skipped). nt: streaming stores, the source read once from memory in
   pieces that stay in L1 while every destination gets them. */
static void dpar__copy_fanout(char *const *dst, int ndst, const char *src, size_t n, int nt) {
#ifdef DPAR__X86_SIMD
    if (nt && __builtin_cpu_supports("avx2")) {
        const size_t piece = 8192;
        for (size_t o = 0; o < n; o += piece)
            for (int k = 0; k < ndst; k++)
                if (dst[k] != src) dpar__copy_nt_avx2(dst[k] + o, src + o, n - o < piece ? n - o : piece);
        _mm_sfence();
        return;
    }
#endif
    (void)nt;
    for (int k = 0; k < ndst; k++)
        if (dst[k] != src && n) memcpy(dst[k], src, n);
}
/* nt: streaming stores (the caller decides from the whole collective's
   working set, dpar__streaming) */
static void dpar__sum_f32(int n, const float *const *src, float *const *dst, int ndst, int64_t len, int mean, int nt) {
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2")) {
        dpar__sum_f32_avx2(n, src, dst, ndst, len, mean, nt);
        return;
    }
#endif
    (void)nt;
    int64_t i = 0;
#ifdef DPAR__ARM_NEON
    i = dpar__sum_f32_neon(n, src, dst, ndst, len, mean);
#endif
    /* portable: blocks of 16, which compilers vectorize */
    for (; i + 16 <= len; i += 16) {
        float a[16];
        for (int e = 0; e < 16; e++) a[e] = src[0][i + e];
        for (int j = 1; j < n; j++)
            for (int e = 0; e < 16; e++) a[e] += src[j][i + e];
        if (mean)
            for (int e = 0; e < 16; e++) a[e] /= (float)n;
        for (int k = 0; k < ndst; k++) memcpy(dst[k] + i, a, sizeof a);
    }
    dpar__sum_f32_scalar(n, src, dst, ndst, i, len, mean);
}

#ifdef DPAR__X86_SIMD
/* f16 sum / mean with f32 accumulation (F16C): the same bits as the scalar
   path (exact widening, one round-to-nearest-even narrowing; NaN stays a
   quiet NaN with its payload's top bits, overflow gives Inf). Returns the
   elements done (a multiple of 8). */
__attribute__((target("avx2,f16c"))) static int64_t
dpar__sum_f16_f16c(int n, const uint16_t *const *src, uint16_t *const *dst, int ndst, int64_t len, int mean) {
    int64_t i = 0;
    const __m256 dn = _mm256_set1_ps((float)n);
    for (; i + 8 <= len; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src[0] + i)));
        for (int j = 1; j < n; j++)
            a = _mm256_add_ps(a, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src[j] + i))));
        if (mean) a = _mm256_div_ps(a, dn);
        __m128i h = _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT);
        for (int k = 0; k < ndst; k++) _mm_storeu_si128((__m128i *)(dst[k] + i), h);
    }
    return i;
}
#endif

/* f32 <-> f16 arrays, the same bits as dpar_f32_to_f16 / dpar_f16_to_f32 */
#ifdef DPAR__X86_SIMD
__attribute__((target("avx2,f16c"))) static int64_t dpar__to_f16_f16c(uint16_t *d, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}
__attribute__((target("avx2,f16c"))) static int64_t dpar__from_f16_f16c(float *y, const uint16_t *h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    return i;
}
#endif
#ifdef DPAR__ARM_NEON
/* FCVT rounds to nearest even and keeps subnormals (FPCR.FZ is 0 on Linux);
   a NaN becomes quiet with its payload's top bits: the scalar bits */
static int64_t dpar__to_f16_neon(uint16_t *d, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(d + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    return i;
}
/* widening is exact, but FCVT quiets a signalling NaN and the scalar path
   keeps its bits: NaN lanes are rebuilt as the scalar path does */
static int64_t dpar__from_f16_neon(float *y, const uint16_t *h, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint16x4_t v = vld1_u16(h + i);
        uint32x4_t w = vmovl_u16(v);
        uint32x4_t nan = vcgtq_u32(vandq_u32(w, vdupq_n_u32(0x7fffu)), vdupq_n_u32(0x7c00u));
        uint32x4_t sign = vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x8000u)), 16);
        uint32x4_t mant = vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x3ffu)), 13);
        uint32x4_t bits = vorrq_u32(sign, vorrq_u32(vdupq_n_u32(0x7f800000u), mant));
        float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(v));
        vst1q_f32(y + i, vbslq_f32(nan, vreinterpretq_f32_u32(bits), f));
    }
    return i;
}
#endif
DPAR_API void dpar_f32_to_f16_n(uint16_t *d, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2") /* every AVX2 CPU has F16C */) i = dpar__to_f16_f16c(d, x, n);
#endif
#ifdef DPAR__ARM_NEON
    i = dpar__to_f16_neon(d, x, n);
#endif
    for (; i < n; i++) d[i] = dpar_f32_to_f16(x[i]);
}
DPAR_API void dpar_f16_to_f32_n(float *y, const uint16_t *h, int64_t n) {
    int64_t i = 0;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2") /* every AVX2 CPU has F16C */) i = dpar__from_f16_f16c(y, h, n);
#endif
#ifdef DPAR__ARM_NEON
    i = dpar__from_f16_neon(y, h, n);
#endif
    for (; i < n; i++) y[i] = dpar_f16_to_f32(h[i]);
}

/* reduce `len` elements of the n sources into every destination; nt: f32
   sums write with streaming stores */
static void dpar__reduce_span(dpar_dtype t, dpar_reduce_op op, int n, const char *const *src, char *const *dst,
                              int ndst, int64_t len, int nt) {
    enum { CH = 1024 };
    size_t es = dpar_dtype_size(t);
    if (t == DPAR_F64) { /* in double, members in order; each element's sources are read before it is written */
        for (int64_t i = 0; i < len; i++) {
            double acc = ((const double *)(const void *)src[0])[i];
            for (int j = 1; j < n; j++) {
                double x = ((const double *)(const void *)src[j])[i];
                acc = op == DPAR_SUM || op == DPAR_MEAN ? acc + x
                      : op == DPAR_MAX                  ? ((x > acc || x != x) ? x : acc)
                                                        : ((x < acc || x != x) ? x : acc);
            }
            for (int k = 0; k < ndst; k++) ((double *)(void *)dst[k])[i] = op == DPAR_MEAN ? acc / n : acc;
        }
        return;
    }
    if (t == DPAR_F32 && (op == DPAR_SUM || op == DPAR_MEAN)) {
        dpar__sum_f32(n, (const float *const *)src, (float *const *)dst, ndst, len, op == DPAR_MEAN, nt);
        return;
    }
    const char *s2[DPAR_MAX_DEVICES]; /* the tail's pointers; outlive the block below */
    char *d2[DPAR_MAX_DEVICES];
    (void)s2;
    (void)d2;
#ifdef DPAR__X86_SIMD
    if (t == DPAR_F16 && (op == DPAR_SUM || op == DPAR_MEAN) &&
        __builtin_cpu_supports("avx2") /* every AVX2 CPU has F16C */) {
        int64_t done =
            dpar__sum_f16_f16c(n, (const uint16_t *const *)src, (uint16_t *const *)dst, ndst, len, op == DPAR_MEAN);
        for (int j = 0; j < n; j++) s2[j] = src[j] + (size_t)done * 2;
        for (int k = 0; k < ndst; k++) d2[k] = dst[k] + (size_t)done * 2;
        src = (const char *const *)s2;
        dst = d2;
        len -= done; /* the tail: the scalar loop below */
    }
#endif
    for (int64_t base = 0; base < len; base += CH) {
        int64_t m = len - base < (int64_t)CH ? len - base : (int64_t)CH;
        if (t == DPAR_I32) {
            int64_t acc[CH];
            const int32_t *p0 = (const int32_t *)src[0] + base;
            for (int64_t i = 0; i < m; i++) acc[i] = p0[i];
            for (int j = 1; j < n; j++) {
                const int32_t *pj = (const int32_t *)src[j] + base;
                if (op == DPAR_SUM || op == DPAR_MEAN)
                    for (int64_t i = 0; i < m; i++) acc[i] += pj[i];
                else if (op == DPAR_MAX)
                    for (int64_t i = 0; i < m; i++) acc[i] = pj[i] > acc[i] ? pj[i] : acc[i];
                else
                    for (int64_t i = 0; i < m; i++) acc[i] = pj[i] < acc[i] ? pj[i] : acc[i];
            }
            int32_t res[CH];
            for (int64_t i = 0; i < m; i++) {
                if (op == DPAR_MEAN)
                    res[i] = (int32_t)(acc[i] / n);
                else
                    res[i] = (int32_t)(uint32_t)(uint64_t)acc[i]; /* wrap-around */
            }
            for (int k = 0; k < ndst; k++) memcpy(dst[k] + (size_t)base * es, res, (size_t)m * es);
            continue;
        }
        float acc[CH];
        if (t == DPAR_F32)
            memcpy(acc, (const float *)src[0] + base, (size_t)m * 4);
        else
            for (int64_t i = 0; i < m; i++) acc[i] = dpar__load_f(src[0], t, base + i);
        for (int j = 1; j < n; j++) {
            float tmp[CH];
            const float *pj;
            if (t == DPAR_F32)
                pj = (const float *)src[j] + base;
            else {
                for (int64_t i = 0; i < m; i++) tmp[i] = dpar__load_f(src[j], t, base + i);
                pj = tmp;
            }
            if (op == DPAR_SUM || op == DPAR_MEAN)
                for (int64_t i = 0; i < m; i++) acc[i] += pj[i];
            else if (op == DPAR_MAX)
                for (int64_t i = 0; i < m; i++) {
                    float x = pj[i];
                    acc[i] = (x > acc[i] || x != x) ? x : acc[i];
                }
            else
                for (int64_t i = 0; i < m; i++) {
                    float x = pj[i];
                    acc[i] = (x < acc[i] || x != x) ? x : acc[i];
                }
        }
        if (op == DPAR_MEAN)
            for (int64_t i = 0; i < m; i++) acc[i] /= (float)n;
        if (t == DPAR_F32) {
            for (int k = 0; k < ndst; k++) memcpy(dst[k] + (size_t)base * 4, acc, (size_t)m * 4);
        } else {
            uint16_t h[CH];
            for (int64_t i = 0; i < m; i++) h[i] = t == DPAR_F16 ? dpar_f32_to_f16(acc[i]) : dpar_f32_to_bf16(acc[i]);
            for (int k = 0; k < ndst; k++) memcpy(dst[k] + (size_t)base * 2, h, (size_t)m * 2);
        }
    }
}

/* The work of the host path, in slices: slice j is what member j did alone
   before work was shared (the elements of out[j]'s share for ALL_REDUCE and
   BROADCAST, in[j]'s block to every member for ALL_GATHER, out[j] for
   REDUCE_SCATTER and ALL_TO_ALL), counted in units (elements; ALL_TO_ALL:
   source blocks) and cut into chunks. Which member does a chunk changes no
   value: every element is reduced over the members in group order. */
enum { DPAR__CHUNK_BYTES = 64 << 10 }; /* a claim's work: large enough to amortise the atomic */
static int64_t dpar__slice_units(const dpar__coll *c, int j) {
    switch (c->kind) {
    case DPAR__COLL_ALL_REDUCE:
    case DPAR__COLL_BROADCAST: return c->count * (j + 1) / c->n - c->count * j / c->n;
    case DPAR__COLL_ALL_GATHER:
    case DPAR__COLL_REDUCE_SCATTER: return c->outer * c->inner;
    case DPAR__COLL_ALL_TO_ALL: return c->n;
    default: return 0;
    }
}
static int64_t dpar__chunk_units(const dpar__coll *c) {
    if (c->kind == DPAR__COLL_ALL_TO_ALL) return 1;
    /* a multiple of 16 elements: chunks of an aligned buffer stay 64-byte aligned for streaming stores */
    return (int64_t)(DPAR__CHUNK_BYTES / dpar_dtype_size(c->dtype)) & ~(int64_t)15;
}
/* whether the whole collective's working set (every member's input and output) asks for streaming stores */
static int dpar__coll_streaming(const dpar__coll *c) {
    uint64_t es = dpar_dtype_size(c->dtype), n = (uint64_t)c->n;
    switch (c->kind) {
    case DPAR__COLL_ALL_REDUCE: return dpar__streaming((uint64_t)c->count * es * 2u * n);
    case DPAR__COLL_BROADCAST: return dpar__streaming((uint64_t)c->count * es * (n + 1u));
    case DPAR__COLL_ALL_GATHER:
    case DPAR__COLL_REDUCE_SCATTER: return dpar__streaming((uint64_t)(c->outer * c->inner) * es * n * (n + 1u));
    case DPAR__COLL_ALL_TO_ALL: return dpar__streaming((uint64_t)c->count * es * 2u * n);
    default: return 0;
    }
}
/* units [u0, u1) of slice j */
static void dpar__host_piece(const dpar__coll *c, char *const *in, char *const *out, int j, int64_t u0, int64_t u1,
                             int nt) {
    int n = c->n;
    size_t es = dpar_dtype_size(c->dtype);
    const char *src[DPAR_MAX_DEVICES];
    char *dst[DPAR_MAX_DEVICES];
    switch (c->kind) {
    case DPAR__COLL_ALL_REDUCE: {
        size_t at = (size_t)(c->count * j / n + u0) * es;
        for (int k = 0; k < n; k++) {
            src[k] = in[k] + at;
            dst[k] = out[k] + at;
        }
        dpar__reduce_span(c->dtype, c->op, n, src, dst, n, u1 - u0, nt);
        break;
    }
    case DPAR__COLL_BROADCAST: { /* read the root's buffer once */
        size_t at = (size_t)(c->count * j / n + u0) * es;
        for (int k = 0; k < n; k++) dst[k] = out[k] + at;
        dpar__copy_fanout(dst, n, in[c->root] + at, (size_t)(u1 - u0) * es, nt);
        break;
    }
    case DPAR__COLL_ALL_GATHER:     /* in[j]'s block o to every member: each input read once */
    case DPAR__COLL_REDUCE_SCATTER: /* out[j]'s block o from block (o, j) of every input */
        for (int64_t u = u0; u < u1;) {
            int64_t o = u / c->inner, i = u % c->inner, len = c->inner - i < u1 - u ? c->inner - i : u1 - u;
            size_t part = (size_t)(o * c->inner + i) * es, whole = (size_t)((o * n + j) * c->inner + i) * es;
            if (c->kind == DPAR__COLL_ALL_GATHER) {
                for (int k = 0; k < n; k++) dst[k] = out[k] + whole;
                dpar__copy_fanout(dst, n, in[j] + part, (size_t)len * es, nt);
            } else {
                for (int k = 0; k < n; k++) src[k] = in[k] + whole;
                dst[0] = out[j] + part;
                dpar__reduce_span(c->dtype, DPAR_SUM, n, src, dst, 1, len, nt);
            }
            u += len;
        }
        break;
    case DPAR__COLL_ALL_TO_ALL: { /* out[j]'s blocks u0..u1-1: block i from in[i]'s split j */
        int64_t oshape[DPAR_MAX_DIMS], ext[DPAR_MAX_DIMS], soff[DPAR_MAX_DIMS], doff[DPAR_MAX_DIMS];
        for (int d = 0; d < c->ndim; d++) {
            oshape[d] = ext[d] = c->in_shape[d];
            soff[d] = doff[d] = 0;
        }
        ext[c->split_dim] = c->in_shape[c->split_dim] / n;
        oshape[c->split_dim] /= n;
        oshape[c->concat_dim] *= n;
        soff[c->split_dim] = (int64_t)j * ext[c->split_dim];
        for (int64_t i = u0; i < u1; i++) {
            doff[c->concat_dim] = i * ext[c->concat_dim];
            dpar__copy_block_nt(out[j], oshape, doff, in[i], c->in_shape, soff, ext, c->ndim, es, nt);
        }
        break;
    }
    default: break;
    }
}

/* chunks of slice j of the host work */
static int64_t dpar__slice_chunks(const dpar__coll *c, int j) {
    int64_t per = dpar__chunk_units(c);
    return (dpar__slice_units(c, j) + per - 1) / per;
}

/* The work of member c->rank on host-visible views in[] / out[], after the
   entry barrier of the host path. all_out: every member's out[] may be written
   here (one process): the member claims the chunks of its own slice first
   (the lines it touched last call), then the chunks of the others' slices no
   member has claimed yet, from the call's counters c->claim (zeroed by each
   member for its slice before it posts the call). So the members that have a
   core do the work of those waiting for one (more members than CPUs, or a
   loaded machine) instead of every slice waiting for its member. Returns the
   chunks this member did. Else (across processes) member r writes only out[r],
   alone (returns 0). */
static int64_t dpar__host_work(const dpar__coll *c, char *const *in, char *const *out, char *scratch, int all_out) {
    int n = c->n, r = c->rank;
    size_t es = dpar_dtype_size(c->dtype);
    if (c->kind == DPAR__COLL_PERMUTE) {
        char *dst = scratch ? scratch : out[r];
        int s = c->src_of[r];
        if (c->count) {
            if (s < 0)
                memset(dst, 0, (size_t)c->count * es);
            else
                memcpy(dst, in[s], (size_t)c->count * es);
        }
        return 0;
    }
    int nt = dpar__coll_streaming(c);
    if (!all_out) {
        if (c->kind == DPAR__COLL_ALL_GATHER) /* out[r] from every input */
            for (int k = 0; k < n; k++)
                for (int64_t o = 0; o < c->outer; o++)
                    if (c->inner)
                        memcpy(out[r] + (size_t)((o * n + k) * c->inner) * es, in[k] + (size_t)(o * c->inner) * es,
                               (size_t)c->inner * es);
        if (c->kind == DPAR__COLL_REDUCE_SCATTER || c->kind == DPAR__COLL_ALL_TO_ALL)
            dpar__host_piece(c, in, out, r, 0, dpar__slice_units(c, r), nt);
        return 0;
    }
    int64_t per = dpar__chunk_units(c), did = 0;
    for (int t = 0; t < n; t++) {
        int j = (r + t) % n;
        int64_t units = dpar__slice_units(c, j), chunks = dpar__slice_chunks(c, j);
        for (int64_t q; (q = DPAR__ATOMIC_FETCH_ADD(&c->claim[j], (int64_t)1)) < chunks; did++)
            dpar__host_piece(c, in, out, j, q * per, (q + 1) * per < units ? (q + 1) * per : units, nt);
    }
    return did;
}

static int dpar__grow(void **p, size_t *cap, size_t need) {
    if (*cap >= need) return 1;
    void *q = DPAR_REALLOC(*p, need);
    if (!q) return 0;
    *p = q;
    *cap = need;
    return 1;
}

static dpar_status dpar__coll_fail(dpar_ctx *ctx, dpar_status s) {
    dpar__job_fail(ctx->job, ctx->device, s);
    return s;
}

/* One member's call as it moves through the phases of dpar__coll_exec. */
typedef struct dpar__call {
    dpar__coll c;                 /* what the backend / the host work sees */
    dpar__coll_state st;          /* c.ctx points here */
    dpar__post post;              /* what this member asked for, checked against the others */
    int src_of[DPAR_MAX_DEVICES]; /* PERMUTE: c.src_of points here */
    dpar__group *g;
    const dpar_buffer *in;
    dpar_buffer *out;
    int use_backend; /* the backend's collective, else the core's host path */
    int half;        /* which half of the group's two-call records this call uses */
} dpar__call;

/* Host path: this member's data as host-visible views (mapped or staged). */
typedef struct dpar__stage {
    char *in_h, *out_h, *scratch; /* scratch: PERMUTE in place, the result before copy-back */
    int in_mapped, out_mapped;
} dpar__stage;

/* The group of the call and the checks every kind shares: buffers on this
   device, one dtype. Fills k->c and k->post with what every kind uses. */
static dpar_status dpar__coll_begin(dpar_ctx *ctx, const dpar__cargs *a, dpar__call *k) {
    const char *name = dpar__coll_name(a->kind, a->op);
    k->st.ctx = ctx;
    snprintf(k->st.what, sizeof k->st.what, "%s over axis '%s'", name, a->axes);
    if (DPAR__ATOMIC_LOAD(&ctx->job->abort))
        return dpar__err(DPAR_ERR_ABORTED, "%s: stopped because another device failed first", k->st.what);
    dpar_mesh *m = ctx->mesh;
    unsigned mask;
    int order[DPAR_MAX_AXES], norder;
    dpar_status s = dpar__parse_axes(m, name, a->axes, &mask, order, &norder);
    if (s) return dpar__coll_fail(ctx, s);
    /* members rank row-major over the axes as written (JAX), except ppermute: JAX sorts its group */
    int gid, rank, key = a->kind == DPAR__COLL_PERMUTE ? (int)mask : dpar__axes_key(m, order, norder);
    dpar__group_of(m, key, ctx->pos, &gid, &rank);
    dpar__group *g = k->g = &m->groups[key][gid];
    const dpar_buffer *in = k->in = a->in;
    dpar_buffer *out = k->out = a->out;
    if (!in || !out)
        return dpar__coll_fail(ctx,
                               dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: input or output buffer is NULL", k->st.what));
    if (in->gdev != ctx->device || out->gdev != ctx->device || in->rt != ctx->rt || out->rt != ctx->rt)
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                              "%s on device %d: the buffers live on devices %d (in) "
                                              "and %d (out); use this device's buffers",
                                              k->st.what, ctx->device, in->gdev, out->gdev));
    if (in->dtype != out->dtype)
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_DTYPE, "%s: input is %s but output is %s; they must match",
                                              k->st.what, dpar_dtype_name(in->dtype), dpar_dtype_name(out->dtype)));
    /* JAX's pmean is psum / n with true division and a float result; a truncated integer mean would
       be silently wrong, so it is refused with the two ways to get the float one. */
    if (a->kind == DPAR__COLL_ALL_REDUCE && a->op == DPAR_MEAN && in->dtype == DPAR_I32)
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_DTYPE,
                                              "%s: the mean of i32 values is not an integer (JAX returns a float); "
                                              "dpar_cast the input to f32 first, or psum and divide by the axis size",
                                              k->st.what));
    /* f64 is reduced in double on the host within a process; the MPI transport folds f32 / i32 only */
    if ((a->kind == DPAR__COLL_ALL_REDUCE || a->kind == DPAR__COLL_REDUCE_SCATTER) && in->dtype == DPAR_F64 && g->cross)
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_DTYPE,
                                              "%s: f64 is not reduced across MPI processes (within a process it "
                                              "is; moving collectives take it everywhere); dpar_cast to f32 first",
                                              k->st.what));
    dpar__coll *c = &k->c;
    c->kind = a->kind;
    c->op = a->op;
    c->dtype = in->dtype;
    c->n = g->n;
    c->rank = rank;
    c->devices = g->devices;
    c->in = (dpar_buffer *const *)g->in_bufs;
    c->out = (dpar_buffer *const *)g->out_bufs;
    c->count = in->count;
    c->group = g;
    c->ctx = &k->st;
    c->ndim = in->ndim;
    for (int d = 0; d < in->ndim; d++) c->in_shape[d] = in->shape[d];
    dpar__post *p = &k->post;
    p->kind = (int)a->kind;
    p->op = (int)a->op;
    p->dtype = (int)in->dtype;
    p->in_count = in->count;
    p->out_count = out->count;
    p->ndim = in->ndim;
    for (int d = 0; d < in->ndim && d < DPAR_MAX_DIMS; d++) p->shape[d] = in->shape[d];
    p->dim = a->dim;
    p->tiled = a->tiled;
    p->split_dim = a->split_dim;
    p->concat_dim = a->concat_dim;
    p->name = name;
    return DPAR_OK;
}

/* PERMUTE: the pairs name group positions, each source and destination at
   most once; members compare their pairs by hash. */
static dpar_status dpar__coll_check_pairs(dpar_ctx *ctx, const dpar__cargs *a, dpar__call *k) {
    int n = k->c.n, is_src[DPAR_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        k->src_of[i] = -1;
        is_src[i] = 0;
    }
    uint64_t h = 1469598103934665603ull;
    if (a->npairs < 0 || a->npairs > n)
        return dpar__coll_fail(
            ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: %d pairs for a %d-device group", k->st.what, a->npairs, n));
    for (int i = 0; i < a->npairs; i++) {
        int sidx = a->pairs[2 * i], didx = a->pairs[2 * i + 1];
        if (sidx < 0 || sidx >= n || didx < 0 || didx >= n)
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                                  "%s: pair %d (%d -> %d) is outside the group positions "
                                                  "0..%d",
                                                  k->st.what, i, sidx, didx, n - 1));
        if (is_src[sidx] || k->src_of[didx] >= 0)
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                                  "%s: pair %d (%d -> %d) repeats a source or "
                                                  "destination; each may appear once",
                                                  k->st.what, i, sidx, didx));
        is_src[sidx] = 1;
        k->src_of[didx] = sidx;
        h = (h ^ (uint64_t)(sidx * 1024 + didx)) * UINT64_C(1099511628211);
    }
    k->post.pairs_hash = h;
    k->c.src_of = k->src_of;
    return DPAR_OK;
}

/* The kinds whose output has the input's element count: ALL_REDUCE,
   BROADCAST, PERMUTE. */
static dpar_status dpar__coll_check_same(dpar_ctx *ctx, const dpar__cargs *a, dpar__call *k) {
    const dpar_buffer *in = k->in, *out = k->out;
    int n = k->c.n;
    if (out->count != in->count) {
        char x[160], y[160];
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_SHAPE,
                                              "%s: output %s has %lld elements but input %s has %lld; they must "
                                              "match",
                                              k->st.what, dpar__shape_str(x, sizeof x, out->ndim, out->shape),
                                              (long long)out->count, dpar__shape_str(y, sizeof y, in->ndim, in->shape),
                                              (long long)in->count));
    }
    if (a->kind == DPAR__COLL_BROADCAST && (a->root < 0 || a->root >= n))
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                              "%s: root %d is not a position in the %d-device group", k->st.what,
                                              a->root, n));
    if (a->kind == DPAR__COLL_PERMUTE) {
        dpar_status s = dpar__coll_check_pairs(ctx, a, k);
        if (s) return s;
    }
    k->c.root = a->root;
    k->post.root = a->root;
    k->post.dim = 0;
    k->post.tiled = 0;
    return DPAR_OK;
}

/* ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL: dims in range and dividing the
   group; want / *want_nd: the output shape the group needs. */
static dpar_status dpar__coll_check_layout(dpar_ctx *ctx, const dpar__cargs *a, dpar__call *k, int64_t *want,
                                           int *want_nd) {
    const dpar_buffer *in = k->in;
    const char *what = k->st.what;
    int n = k->c.n;
    dpar__coll *c = &k->c;
    switch (a->kind) {
    case DPAR__COLL_ALL_GATHER: {
        int lim = a->tiled ? in->ndim - 1 : in->ndim;
        if (a->dim < 0 || a->dim > lim)
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                                  "%s: dim %d is out of range 0..%d for a %d-d input", what, a->dim,
                                                  lim, in->ndim));
        if (!a->tiled && in->ndim + 1 > DPAR_MAX_DIMS)
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: stacking would exceed %d dims", what,
                                                  (int)DPAR_MAX_DIMS));
        c->outer = dpar__prod(in->shape, a->dim);
        c->inner = a->dim < in->ndim ? dpar__prod(in->shape + a->dim, in->ndim - a->dim) : 1;
        if (a->tiled)
            want[a->dim] *= n;
        else {
            for (int d = in->ndim; d > a->dim; d--) want[d] = want[d - 1];
            want[a->dim] = n;
            *want_nd = in->ndim + 1;
        }
        return DPAR_OK;
    }
    case DPAR__COLL_REDUCE_SCATTER:
        if (a->dim < 0 || a->dim >= in->ndim)
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                                  "%s: dim %d is out of range 0..%d for a %d-d input", what, a->dim,
                                                  in->ndim - 1, in->ndim));
        if (a->tiled ? (in->shape[a->dim] % n != 0) : (in->shape[a->dim] != n))
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_SHAPE,
                                                  "%s: dimension %d has size %lld, which %s the %d devices of the "
                                                  "group; %s",
                                                  what, a->dim, (long long)in->shape[a->dim],
                                                  a->tiled ? "is not divisible by" : "is not equal to", n,
                                                  a->tiled ? "pad it to a multiple of the group size"
                                                           : "use tiled = true to split a longer dimension"));
        c->outer = dpar__prod(in->shape, a->dim);
        c->inner = dpar__prod(in->shape + a->dim, in->ndim - a->dim) / (n ? n : 1);
        if (a->tiled)
            want[a->dim] /= n;
        else {
            for (int d = a->dim; d < in->ndim - 1; d++) want[d] = want[d + 1];
            *want_nd = in->ndim - 1;
        }
        return DPAR_OK;
    case DPAR__COLL_ALL_TO_ALL:
        if (a->split_dim < 0 || a->split_dim >= in->ndim || a->concat_dim < 0 || a->concat_dim >= in->ndim)
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                                  "%s: split_dim %d / concat_dim %d out of range for a "
                                                  "%d-d input",
                                                  what, a->split_dim, a->concat_dim, in->ndim));
        if (in->shape[a->split_dim] % n)
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_SHAPE,
                                                  "%s: split dimension %d has size %lld, which is not divisible by "
                                                  "the %d devices of the group",
                                                  what, a->split_dim, (long long)in->shape[a->split_dim], n));
        c->split_dim = a->split_dim;
        c->concat_dim = a->concat_dim;
        want[a->split_dim] /= n;
        want[a->concat_dim] *= n;
        return DPAR_OK;
    default:
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT, "collective: unknown kind %d", (int)a->kind));
    }
}

/* Per-kind validation: arguments, then the output's shape. */
static dpar_status dpar__coll_check(dpar_ctx *ctx, const dpar__cargs *a, dpar__call *k) {
    const dpar_buffer *in = k->in, *out = k->out;
    if (a->kind == DPAR__COLL_ALL_REDUCE || a->kind == DPAR__COLL_BROADCAST || a->kind == DPAR__COLL_PERMUTE)
        return dpar__coll_check_same(ctx, a, k);
    int64_t want[DPAR_MAX_DIMS];
    int want_nd = in->ndim;
    for (int d = 0; d < in->ndim; d++) want[d] = in->shape[d];
    dpar_status s = dpar__coll_check_layout(ctx, a, k, want, &want_nd);
    if (s) return s;
    int ok = out->ndim == want_nd;
    for (int d = 0; ok && d < want_nd; d++) ok = out->shape[d] == want[d];
    if (!ok) {
        char x[160], y[160];
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_SHAPE, "%s: output has shape %s but a %d-device group needs %s",
                                              k->st.what, dpar__shape_str(x, sizeof x, out->ndim, out->shape), k->c.n,
                                              dpar__shape_str(y, sizeof y, want_nd, want)));
    }
    if (out == in && in->count > 0)
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                              "%s: cannot run in place; give a separate output buffer", k->st.what));
    return DPAR_OK;
}

/* Host path: makes this member's input and output host visible (mapped in
   place, else copied into the member's staging memory). */
static dpar_status dpar__coll_stage_in(dpar_ctx *ctx, dpar__call *k, dpar__stage *io) {
    const dpar__backend_iface *be = ctx->rt->be;
    void *bs = ctx->rt->bstate;
    const dpar_buffer *in = k->in;
    dpar_buffer *out = k->out;
    dpar__group *g = k->g;
    int dev = in->device, rank = k->c.rank; /* backend-local index */
    dpar_status s;
    io->in_h = be->host_ptr ? (char *)be->host_ptr(bs, dev, in->mem) : NULL;
    io->out_h = be->host_ptr ? (char *)be->host_ptr(bs, dev, out->mem) : NULL;
    io->in_mapped = io->in_h != NULL;
    io->out_mapped = out == in ? io->in_mapped : io->out_h != NULL;
    size_t need = (io->in_mapped ? 0 : in->nbytes) + ((io->out_mapped || out == in) ? 0 : out->nbytes) +
                  (k->c.kind == DPAR__COLL_PERMUTE ? out->nbytes : 0);
    if (!dpar__grow(&g->stage[rank], &g->stage_cap[rank], need ? need : 1))
        return dpar__coll_fail(
            ctx, dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu staging bytes", k->st.what, need));
    char *sp = (char *)g->stage[rank];
    if (io->in_mapped) {
        if (be->host_acquire && in->nbytes && (s = be->host_acquire(bs, dev, in->mem, 0, in->nbytes)))
            return dpar__coll_fail(ctx, s);
    } else {
        io->in_h = sp;
        sp += in->nbytes;
        if (in->nbytes && (s = be->read(bs, dev, in->mem, 0, io->in_h, in->nbytes))) return dpar__coll_fail(ctx, s);
    }
    if (out == in) {
        io->out_h = io->in_h;
    } else if (io->out_mapped) {
        if (be->host_acquire && out->nbytes && (s = be->host_acquire(bs, dev, out->mem, 0, out->nbytes)))
            return dpar__coll_fail(ctx, s);
    } else {
        io->out_h = sp;
        sp += out->nbytes;
    }
    if (k->c.kind == DPAR__COLL_PERMUTE && io->out_h == io->in_h) io->scratch = sp;
    return DPAR_OK;
}

/* Posts this member's call and views in the group, waits for every member,
   then checks every post against the leader's (every member checks the same
   way, so all get the same verdict). */
static dpar_status dpar__coll_match(dpar_ctx *ctx, dpar__call *k, const dpar__stage *io) {
    dpar__group *g = k->g;
    int rank = k->c.rank, n = g->n, h = k->half = g->cross ? 0 : (int)(g->calls[rank] & 1u);
    g->posts[h * n + rank] = k->post;
    g->in_bufs[rank] = (dpar_buffer *)k->in;
    g->out_bufs[rank] = k->out;
    g->in_ptr[h * n + rank] = io->in_h;
    g->out_ptr[h * n + rank] = io->out_h;
    /* this half's last call (two calls ago) ended for every member before the last entry barrier */
    k->c.claim = g->claim + h * n;
    DPAR__ATOMIC_STORE_RELAXED(&k->c.claim[rank], (int64_t)0);
    if (rank == g->leader) DPAR__ATOMIC_STORE_RELAXED(&g->done[h], (int64_t)0);
    dpar_status s = dpar__barrier(g, rank, ctx, k->st.what);
    if (s) return s;
    g->calls[rank]++;
    const dpar__post *posts = g->posts + h * n;
    const int L = g->leader;
    for (int j = 0; j < n; j++) {
        if (j == L || !dpar__is_local(ctx->rt, g->devices[j])) continue;
        if (dpar__post_eq(&posts[L], &posts[j])) continue;
        char x[200], y[200];
        dpar__post_str(&posts[L], x, sizeof x);
        dpar__post_str(&posts[j], y, sizeof y);
        s = dpar__err(
            DPAR_ERR_COLLECTIVE_MISMATCH,
            "%s (collective #%llu of this group): device %d called %s but device %d called %s; every member of a group "
            "must call the same collective, in the same order, with the same dtype and element count (all_gather, "
            "psum_scatter, all_to_all: the same shape)",
            k->st.what, (unsigned long long)g->seq, g->devices[L], x, g->devices[j], y);
        return dpar__coll_fail(ctx, s);
    }
    return DPAR_OK;
}

/* A group across processes: the leader runs the transport's part (the
   call's check with the other processes, or with agree_only == 0 the host
   collective across them), the others wait; every member returns its status. */
static dpar_status dpar__coll_cross(dpar_ctx *ctx, dpar__call *k, int agree_only) {
    dpar__group *g = k->g;
    int rank = k->c.rank;
    if (rank == g->leader) {
        const dpar__transport *t = dpar__transport_get();
        g->xstatus = agree_only ? t->coll_agree(ctx, g, k->st.what) : t->coll(ctx, g, &k->c, k->st.what);
        if (g->xstatus) snprintf(g->xmsg, DPAR__ERR_LEN, "%s", dpar__err_text);
        if (g->xstatus || !agree_only) g->seq++;
    }
    dpar_status s = dpar__barrier_t(g, rank, ctx, k->st.what, 3);
    if (s) return s;
    if (g->xstatus) {
        dpar__err(g->xstatus, "%s", g->xmsg);
        return dpar__coll_fail(ctx, g->xstatus);
    }
    return DPAR_OK;
}

/* The backend runs the collective (across processes: after the leader
   checked the call with the other processes and sent the bootstrap id). */
static dpar_status dpar__coll_backend(dpar_ctx *ctx, dpar__call *k) {
    dpar_runtime *rt = ctx->rt;
    dpar__group *g = k->g;
    dpar__coll *c = &k->c;
    int ldevs[DPAR_MAX_DEVICES];
    for (int j = 0; j < g->n; j++) ldevs[j] = dpar__is_local(rt, g->devices[j]) ? g->devices[j] - rt->local_base : -1;
    c->devices = ldevs;
    dpar_status s;
    if (g->cross) {
        if ((s = dpar__coll_cross(ctx, k, 1))) return s;
        c->cross = 1;
        c->gdevices = g->devices;
        c->xid = dpar__transport_get()->group_xid(g);
    }
    s = rt->be->collective(rt->bstate, c);
    if (s) return dpar__coll_fail(ctx, s);
    if (c->rank == g->leader) g->seq++;
    /* nobody may post the next call while a member still reads this one's records */
    return dpar__barrier(g, c->rank, ctx, k->st.what);
}

/* The core's host path after the entry barrier: the local members share the
   work; across processes the leader's transport part comes first. On one
   process a member then waits for the work to be done, not for the others to
   leave (a member that finds every chunk done returns without waiting for a
   core for the others: one rendezvous a call, not two); PERMUTE, whose members
   read each other's input alone, keeps its closing barrier. */
static dpar_status dpar__coll_host(dpar_ctx *ctx, dpar__call *k, const dpar__stage *io) {
    dpar__group *g = k->g;
    const dpar__coll *c = &k->c;
    dpar_status s;
    if (g->cross) {
        if ((s = dpar__coll_cross(ctx, k, 0))) return s;
        if (c->kind == DPAR__COLL_ALL_REDUCE || c->kind == DPAR__COLL_BROADCAST) return DPAR_OK;
        dpar__host_work(c, (char *const *)g->xin_ptr, (char *const *)g->out_ptr, io->scratch, 0);
        return dpar__barrier(g, c->rank, ctx, k->st.what);
    }
    int h = k->half, n = g->n;
    int64_t did =
        dpar__host_work(c, (char *const *)(g->in_ptr + h * n), (char *const *)(g->out_ptr + h * n), io->scratch, 1);
    if (c->rank == g->leader) g->seq++;
    if (c->kind == DPAR__COLL_PERMUTE) return dpar__barrier(g, c->rank, ctx, k->st.what);
    int64_t total = 0;
    for (int j = 0; j < n; j++) total += dpar__slice_chunks(c, j);
    return dpar__host_wait_done(g, h, did, total, ctx, k->st.what);
}

/* Host path: the result back to the device (release the mapping, or write). */
static dpar_status dpar__coll_stage_out(dpar_ctx *ctx, const dpar__call *k, const dpar__stage *io) {
    const dpar__backend_iface *be = ctx->rt->be;
    void *bs = ctx->rt->bstate;
    dpar_buffer *out = k->out;
    dpar_status s = DPAR_OK;
    if (io->scratch && out->nbytes) memcpy(io->out_h, io->scratch, out->nbytes);
    if (io->out_mapped) {
        if (be->host_release && out->nbytes) s = be->host_release(bs, k->in->device, out->mem, 0, out->nbytes);
    } else if (out->nbytes) {
        s = be->write(bs, k->in->device, out->mem, 0, io->out_h, out->nbytes);
    }
    if (s) return dpar__coll_fail(ctx, s);
    return DPAR_OK;
}

/* Executes one collective for one member (blocking), phase by phase; async: issued by the comm thread (dpar__coll). */
static dpar_status dpar__coll_exec(dpar_ctx *ctx, const dpar__cargs *a, int async) {
    dpar__call k;
    dpar__stage io;
    memset(&k, 0, sizeof k);
    memset(&io, 0, sizeof io);
    dpar_status s;
    if ((s = dpar__coll_begin(ctx, a, &k))) return s; /* group, buffers, dtype */
    k.c.async = async;
    if ((s = dpar__coll_check(ctx, a, &k))) return s; /* per-kind arguments and output shape */
    /* a group across processes runs on the backend only where every process's
       backend can (CUDA: NCCL across processes), else on the host over MPI */
    k.use_backend = ctx->rt->be->collective != NULL && (!k.g->cross || ctx->rt->xbackend);
    if (!k.use_backend && (s = dpar__coll_stage_in(ctx, &k, &io))) return s; /* device -> host */
    if ((s = dpar__coll_match(ctx, &k, &io))) return s; /* post, barrier, every member called the same */
    if (k.use_backend) return dpar__coll_backend(ctx, &k);
    if ((s = dpar__coll_host(ctx, &k, &io))) return s;
    return dpar__coll_stage_out(ctx, &k, &io); /* host -> device */
}

/* --- async machinery --- */
static void dpar__req_run(dpar__worker *w, struct dpar_request *r) {
    dpar__clear_error();
    dpar_status s = dpar__coll_run(r->ctx, &r->args, 1);
    dpar__mutex_lock(&w->qmu);
    DPAR_ASSERT(!r->done && w->pending > 0); /* queued -> done, once */
    r->status = s;
    if (s) snprintf(r->msg, sizeof r->msg, "%s", dpar__err_text);
    r->done = 1;
    w->pending--;
    dpar__cond_broadcast(&w->qcv);
    dpar__mutex_unlock(&w->qmu);
}
static DPAR__THREAD_FN(dpar__comm_main, arg) {
    dpar__worker *w = (dpar__worker *)arg;
    dpar__self_worker = w;
    dpar_runtime *rt = w->rt;
    dpar__thread_name("comm", w->device);
    if (rt->be->thread_init) rt->be->thread_init(rt->bstate, w->device - rt->local_base);
    dpar__mutex_lock(&w->qmu);
    for (;;) {
        while (!w->queue.head && !w->stop) dpar__cond_wait(&w->qcv, &w->qmu);
        if (!w->queue.head) break;
        struct dpar_request *r = w->queue.head;
        w->queue.head = r->next;
        if (!w->queue.head) w->queue.tail = NULL;
        dpar__mutex_unlock(&w->qmu);
        dpar__req_run(w, r);
        dpar__mutex_lock(&w->qmu);
    }
    dpar__mutex_unlock(&w->qmu);
    return 0;
}

static dpar_status dpar__coll_start(dpar_ctx *ctx, const dpar__cargs *a, struct dpar_request **out) {
    *out = NULL;
    dpar__worker *w = &ctx->rt->workers[ctx->device - ctx->rt->local_base];
    struct dpar_request *r = (struct dpar_request *)dpar__calloc(1, sizeof *r);
    if (!r)
        return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_%s: out of host memory for the request",
                                              dpar__coll_name(a->kind, a->op)));
    r->ctx = ctx;
    r->args = *a;
    dpar__mutex_lock(&w->qmu);
    if (!w->comm_started) {
        if (dpar__thread_start(&w->comm_thread, dpar__comm_main, w) != 0) {
            dpar__mutex_unlock(&w->qmu);
            DPAR_FREE(r);
            return dpar__coll_fail(ctx, dpar__err(DPAR_ERR_OUT_OF_MEMORY,
                                                  "dpar_%s: could not start the communication thread of device %d",
                                                  dpar__coll_name(a->kind, a->op), ctx->device));
        }
        w->comm_started = 1;
    }
    w->pending++;
    if (w->queue.tail)
        w->queue.tail->next = r;
    else
        w->queue.head = r;
    w->queue.tail = r;
    r->live_next = w->live;
    w->live = r;
    dpar__cond_broadcast(&w->qcv);
    dpar__mutex_unlock(&w->qmu);
    *out = r;
    return DPAR_OK;
}

/* Waits until the communication thread has issued every async collective started on this device (on a
   GPU, issued is not finished: their commands are in the device's streams). Called with w->qmu held. */
static void dpar__worker_issued_locked(dpar__worker *w) {
    while (w->pending > 0) dpar__cond_wait(&w->qcv, &w->qmu);
}
static void dpar__worker_issued(dpar__worker *w) {
    dpar__mutex_lock(&w->qmu);
    dpar__worker_issued_locked(w);
    dpar__mutex_unlock(&w->qmu);
}
/* At the end of fn: waits for this device's async collectives and frees the
   ones fn never waited for (an error: their buffers were in use). */
static void dpar__worker_drain(dpar__worker *w) {
    dpar__mutex_lock(&w->qmu);
    dpar__worker_issued_locked(w);
    int leftover = 0;
    dpar_ctx *ctx = NULL;
    while (w->live) {
        struct dpar_request *r = w->live;
        w->live = r->live_next;
        ctx = r->ctx;
        leftover++;
        DPAR_FREE(r);
    }
    dpar__mutex_unlock(&w->qmu);
    if (leftover && ctx)
        dpar__job_fail(ctx->job, w->device,
                       dpar__err(DPAR_ERR_STATE,
                                 "the pmap function returned with %d async collective(s) started but never "
                                 "waited; call dpar_wait on every request before returning",
                                 leftover));
}

DPAR_API dpar_status dpar_wait(dpar_ctx *ctx, dpar_request *r) {
    dpar__clear_error();
    if (!ctx) return dpar__disp_wait(r); /* a step (>>async dispatch) */
    dpar_status cs = dpar__ctx_check(ctx, "dpar_wait");
    if (cs) return cs;
    if (!r) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_wait: request is NULL");
    dpar__worker *w = &ctx->rt->workers[ctx->device - ctx->rt->local_base];
    double t0 = DPAR__ATOMIC_LOAD(&dpar__trace_on) ? dpar__now_us() : 0.0;
    dpar__mutex_lock(&w->qmu);
    struct dpar_request *it = w->live; /* a pending request of this device? (compared, never dereferenced) */
    while (it && it != r) it = it->live_next;
    if (!it) {
        dpar__mutex_unlock(&w->qmu);
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_wait: the request is not a pending request of device %d (already waited, "
                         "or started on another device)",
                         ctx->device);
    }
    while (!r->done) dpar__cond_wait(&w->qcv, &w->qmu);
    if (t0 > 0.0) dpar__trace_event(dpar__trace_pid(ctx->rt), ctx->device, "wait", "wait", t0, dpar__now_us(), -1);
    struct dpar_request **pp = &w->live;
    while (*pp && *pp != r) pp = &(*pp)->live_next;
    if (*pp) *pp = r->live_next;
    dpar__mutex_unlock(&w->qmu);
    dpar_status s = r->status;
    if (s) dpar__err(s, "%s", r->msg);
    DPAR_FREE(r);
    return s;
}

/* The error for a collective given a stale out or in buffer. */
static dpar_status dpar__coll_stale(const dpar__cargs *a, const char *suffix) {
    char fn[48];
    snprintf(fn, sizeof fn, "dpar_%s%s", dpar__coll_name(a->kind, a->op), suffix);
    return dpar__live_stale_arg(fn, dpar__live_buf_ok(a->out) ? "in" : "out", DPAR__LIVE_BUFFER);
}
/* Blocking collective: inline when nothing async is pending on this device,
   else queued behind the pending ones (issue order is kept). */
static dpar_status dpar__collective(dpar_ctx *ctx, dpar__cargs *a, const char *axes) {
    dpar__clear_error();
    if (DPAR__UNLIKELY(!DPAR__CTX_OK(ctx))) {
        char fn[48];
        snprintf(fn, sizeof fn, "dpar_%s", dpar__coll_name(a->kind, a->op));
        return dpar__ctx_check(ctx, fn);
    }
    if (DPAR__UNLIKELY(!dpar__live_buf_ok(a->out) || !dpar__live_buf_ok(a->in))) return dpar__coll_stale(a, "");
    if (!axes) axes = "";
    snprintf(a->axes, sizeof a->axes, "%s", axes);
    dpar__worker *w = &ctx->rt->workers[ctx->device - ctx->rt->local_base];
    dpar__mutex_lock(&w->qmu);
    int pending = w->pending;
    dpar__mutex_unlock(&w->qmu);
    if (pending == 0) return dpar__coll_run(ctx, a, 0);
    struct dpar_request *r;
    dpar_status s = dpar__coll_start(ctx, a, &r);
    if (s) return s;
    return dpar_wait(ctx, r);
}
static dpar_status dpar__collective_start(dpar_ctx *ctx, dpar__cargs *a, const char *axes, dpar_request **req) {
    dpar__clear_error();
    if (!req)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_%s_start: `req` is NULL", dpar__coll_name(a->kind, a->op));
    *req = NULL;
    if (!DPAR__CTX_OK(ctx)) {
        char fn[48];
        snprintf(fn, sizeof fn, "dpar_%s_start", dpar__coll_name(a->kind, a->op));
        return dpar__ctx_check(ctx, fn);
    }
    if (!dpar__live_buf_ok(a->out) || !dpar__live_buf_ok(a->in)) return dpar__coll_stale(a, "_start");
    snprintf(a->axes, sizeof a->axes, "%s", axes ? axes : "");
    return dpar__coll_start(ctx, a, req);
}

static void dpar__cargs_init(dpar__cargs *a, dpar__coll_kind k, dpar_reduce_op op, dpar_buffer *out,
                             const dpar_buffer *in) {
    memset(a, 0, sizeof *a);
    a->kind = k;
    a->op = op;
    a->out = out;
    a->in = in;
}
/* Each collective's arguments are packed once by a dpar__*_args helper; the
   blocking form runs them through dpar__collective, the async form through
   dpar__collective_start, so both check and behave alike. */
static dpar_status dpar__preduce_args(dpar__cargs *a, dpar_buffer *out, const dpar_buffer *in, dpar_reduce_op op,
                                      const char *fn) {
    dpar__cargs_init(a, DPAR__COLL_ALL_REDUCE, op, out, in);
    if ((int)op < 0 || op > DPAR_MIN)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: op %d is not a dpar_reduce_op", fn, (int)op);
    return DPAR_OK;
}
static void dpar__all_gather_args(dpar__cargs *a, dpar_buffer *out, const dpar_buffer *in, int dim, bool tiled) {
    dpar__cargs_init(a, DPAR__COLL_ALL_GATHER, DPAR_SUM, out, in);
    a->dim = dim;
    a->tiled = tiled;
}
static void dpar__psum_scatter_args(dpar__cargs *a, dpar_buffer *out, const dpar_buffer *in, int dim, bool tiled) {
    dpar__cargs_init(a, DPAR__COLL_REDUCE_SCATTER, DPAR_SUM, out, in);
    a->dim = dim;
    a->tiled = tiled;
}
static dpar_status dpar__ppermute_args(dpar__cargs *a, dpar_buffer *out, const dpar_buffer *in, const int *pairs,
                                       int num_pairs, const char *fn) {
    dpar__cargs_init(a, DPAR__COLL_PERMUTE, DPAR_SUM, out, in);
    if (num_pairs < 0 || num_pairs > DPAR_MAX_DEVICES || (num_pairs > 0 && !pairs))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "%s: num_pairs = %d with pairs %s; give 0..%d (source, destination) pairs", fn, num_pairs,
                         pairs ? "given" : "NULL", (int)DPAR_MAX_DEVICES);
    a->npairs = num_pairs;
    for (int i = 0; i < 2 * num_pairs; i++) a->pairs[i] = pairs[i];
    return DPAR_OK;
}
static void dpar__all_to_all_args(dpar__cargs *a, dpar_buffer *out, const dpar_buffer *in, int split_dim,
                                  int concat_dim) {
    dpar__cargs_init(a, DPAR__COLL_ALL_TO_ALL, DPAR_SUM, out, in);
    a->split_dim = split_dim;
    a->concat_dim = concat_dim;
}
static void dpar__pbroadcast_args(dpar__cargs *a, dpar_buffer *out, const dpar_buffer *in, int root) {
    dpar__cargs_init(a, DPAR__COLL_BROADCAST, DPAR_SUM, out, in);
    a->root = root;
}

/* blocking forms */
DPAR_API dpar_status dpar_preduce(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                  dpar_reduce_op op) {
    dpar__cargs a;
    dpar_status s = dpar__preduce_args(&a, out, in, op, "dpar_preduce");
    return s ? s : dpar__collective(ctx, &a, axes);
}
DPAR_API dpar_status dpar_psum(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes) {
    return dpar_preduce(ctx, out, in, axes, DPAR_SUM);
}
DPAR_API dpar_status dpar_pmean(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes) {
    return dpar_preduce(ctx, out, in, axes, DPAR_MEAN);
}
DPAR_API dpar_status dpar_pmax(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes) {
    return dpar_preduce(ctx, out, in, axes, DPAR_MAX);
}
DPAR_API dpar_status dpar_pmin(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes) {
    return dpar_preduce(ctx, out, in, axes, DPAR_MIN);
}
DPAR_API dpar_status dpar_all_gather(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes, int dim,
                                     bool tiled) {
    dpar__cargs a;
    dpar__all_gather_args(&a, out, in, dim, tiled);
    return dpar__collective(ctx, &a, axes);
}
DPAR_API dpar_status dpar_psum_scatter(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                       int dim, bool tiled) {
    dpar__cargs a;
    dpar__psum_scatter_args(&a, out, in, dim, tiled);
    return dpar__collective(ctx, &a, axes);
}
DPAR_API dpar_status dpar_ppermute(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                   const int *pairs, int num_pairs) {
    dpar__cargs a;
    dpar_status s = dpar__ppermute_args(&a, out, in, pairs, num_pairs, "dpar_ppermute");
    return s ? s : dpar__collective(ctx, &a, axes);
}
DPAR_API dpar_status dpar_all_to_all(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     int split_dim, int concat_dim) {
    dpar__cargs a;
    dpar__all_to_all_args(&a, out, in, split_dim, concat_dim);
    return dpar__collective(ctx, &a, axes);
}
DPAR_API dpar_status dpar_pbroadcast(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     int root) {
    dpar__cargs a;
    dpar__pbroadcast_args(&a, out, in, root);
    return dpar__collective(ctx, &a, axes);
}

/* async forms */
DPAR_API dpar_status dpar_preduce_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                        dpar_reduce_op op, dpar_request **req) {
    dpar__cargs a;
    if (req) *req = NULL;
    dpar_status s = dpar__preduce_args(&a, out, in, op, "dpar_preduce_start");
    return s ? s : dpar__collective_start(ctx, &a, axes, req);
}
DPAR_API dpar_status dpar_psum_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     dpar_request **req) {
    return dpar_preduce_start(ctx, out, in, axes, DPAR_SUM, req);
}
DPAR_API dpar_status dpar_pmean_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                      dpar_request **req) {
    return dpar_preduce_start(ctx, out, in, axes, DPAR_MEAN, req);
}
DPAR_API dpar_status dpar_pmax_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     dpar_request **req) {
    return dpar_preduce_start(ctx, out, in, axes, DPAR_MAX, req);
}
DPAR_API dpar_status dpar_pmin_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                     dpar_request **req) {
    return dpar_preduce_start(ctx, out, in, axes, DPAR_MIN, req);
}
DPAR_API dpar_status dpar_all_gather_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                           int dim, bool tiled, dpar_request **req) {
    dpar__cargs a;
    dpar__all_gather_args(&a, out, in, dim, tiled);
    return dpar__collective_start(ctx, &a, axes, req);
}
DPAR_API dpar_status dpar_psum_scatter_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                             int dim, bool tiled, dpar_request **req) {
    dpar__cargs a;
    dpar__psum_scatter_args(&a, out, in, dim, tiled);
    return dpar__collective_start(ctx, &a, axes, req);
}
DPAR_API dpar_status dpar_ppermute_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                         const int *pairs, int num_pairs, dpar_request **req) {
    dpar__cargs a;
    if (req) *req = NULL;
    dpar_status s = dpar__ppermute_args(&a, out, in, pairs, num_pairs, "dpar_ppermute_start");
    return s ? s : dpar__collective_start(ctx, &a, axes, req);
}
DPAR_API dpar_status dpar_all_to_all_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                           int split_dim, int concat_dim, dpar_request **req) {
    dpar__cargs a;
    dpar__all_to_all_args(&a, out, in, split_dim, concat_dim);
    return dpar__collective_start(ctx, &a, axes, req);
}
DPAR_API dpar_status dpar_pbroadcast_start(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                           int root, dpar_request **req) {
    dpar__cargs a;
    dpar__pbroadcast_args(&a, out, in, root);
    return dpar__collective_start(ctx, &a, axes, req);
}
/* ---------------------------------------------------------------------------
   Ops: argument checks, then the backend
   ------------------------------------------------------------------------ */
/* The output `first` and the operands bufs[0..nb) of op `name`: not NULL, live, of one runtime and device. An
   error names operand i as names[i] (the parameter: "the source", "x"), or "operand i" when names is NULL. */
static dpar_status dpar__op_check_named(const char *name, const dpar_buffer *first, const dpar_buffer *const *bufs,
                                        const char *const *names, int nb) {
    if (!first) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: output buffer is NULL", name);
    if (!dpar__live_buf_ok(first)) return dpar__live_stale_arg(name, "the output buffer", DPAR__LIVE_BUFFER);
    for (int i = 0; i < nb; i++) {
        const dpar_buffer *b = bufs[i];
        if (b && dpar__live_buf_ok(b) && b->rt == first->rt && b->device == first->device) continue;
        char num[32]; /* formatted on the error path only: it was a third of a 1x1x1 dpar_matmul's time */
        snprintf(num, sizeof num, "operand %d", i);
        const char *arg = names ? names[i] : num;
        if (!bufs[i]) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: %s is NULL", name, arg);
        if (!dpar__live_buf_ok(bufs[i])) return dpar__live_stale_arg(name, arg, DPAR__LIVE_BUFFER);
        if (bufs[i]->rt != first->rt)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "%s: %s and the output belong to different runtimes; every operand of an op must "
                             "be a buffer of one runtime, on one device",
                             name, arg);
        if (bufs[i]->device != first->device)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "%s: operands live on devices %d and %d; every operand of an op must be on one device",
                             name, first->gdev, bufs[i]->gdev);
    }
    return DPAR_OK;
}
static dpar_status dpar__op_check(const char *name, const dpar_buffer *first, const dpar_buffer *const *bufs, int nb) {
    return dpar__op_check_named(name, first, bufs, NULL, nb);
}
static dpar_status dpar__need_f32(const char *name, const dpar_buffer *b, const char *which) {
    if (b->dtype != DPAR_F32)
        return dpar__err(DPAR_ERR_DTYPE, "%s: %s is %s but this op takes f32; convert with dpar_cast", name, which,
                         dpar_dtype_name(b->dtype));
    return DPAR_OK;
}
static dpar_status dpar__same_count(const char *name, const dpar_buffer *a, const char *an, const dpar_buffer *b,
                                    const char *bn) {
    if (a->count != b->count) {
        char x[160], y[160];
        return dpar__err(DPAR_ERR_SHAPE, "%s: %s %s has %lld elements but %s %s has %lld; they must match", name, an,
                         dpar__shape_str(x, sizeof x, a->ndim, a->shape), (long long)a->count, bn,
                         dpar__shape_str(y, sizeof y, b->ndim, b->shape), (long long)b->count);
    }
    return DPAR_OK;
}
static dpar_status dpar__same_shape(const char *name, const dpar_buffer *a, const char *an, const dpar_buffer *b,
                                    const char *bn) {
    int ok = a->ndim == b->ndim;
    for (int i = 0; ok && i < a->ndim; i++) ok = a->shape[i] == b->shape[i];
    if (!ok) {
        char x[160], y[160];
        return dpar__err(
            DPAR_ERR_SHAPE, "%s: %s has shape %s but %s has shape %s; they must be equal (no broadcasting)", name, an,
            dpar__shape_str(x, sizeof x, a->ndim, a->shape), bn, dpar__shape_str(y, sizeof y, b->ndim, b->shape));
    }
    return DPAR_OK;
}
/* a 1-element result of dtype t: another count is DPAR_ERR_SHAPE, another dtype DPAR_ERR_DTYPE (naming both) */
static dpar_status dpar__scalar_out_t(const char *name, const dpar_buffer *b, dpar_dtype t) {
    if (b->count != 1)
        return dpar__err(DPAR_ERR_SHAPE, "%s: the result buffer must hold 1 %s element (it has %lld %s)", name,
                         dpar_dtype_name(t), (long long)b->count, dpar_dtype_name(b->dtype));
    if (b->dtype != t)
        return dpar__err(DPAR_ERR_DTYPE,
                         "%s: the result buffer is %s but the op's float operands are %s; make it a 1-element %s "
                         "buffer (or convert the operands with dpar_cast)",
                         name, dpar_dtype_name(b->dtype), dpar_dtype_name(t), dpar_dtype_name(t));
    return DPAR_OK;
}
/* >>half storage (checks) =====================================================
   The layer ops (conv2d, pools, norms, softmax, attention, bias_grad) take one
   storage dtype for all their float tensors: f32, or f16 / bf16 with f32
   accumulation and each result rounded once to nearest even (every backend:
   see >>cpu half storage, >>device half storage). Their stats buffers stay f32. */
/* Every non-NULL b[i] has the dtype of the first non-NULL one: f32, f16 or
   bf16; the op's name is fn. */
static dpar_status dpar__same_float(const char *fn, const dpar_buffer *const *b, const char *const *names, int n) {
    int r = 0;
    while (r < n && !b[r]) r++;
    if (r == n) return DPAR_OK;
    dpar_dtype t = b[r]->dtype;
    if (t != DPAR_F32 && t != DPAR_F16 && t != DPAR_BF16)
        return dpar__err(DPAR_ERR_DTYPE,
                         "%s: %s is %s but this op takes f32, f16 or bf16 on every backend (%s here); convert with "
                         "dpar_cast",
                         fn, names[r], dpar_dtype_name(t), b[r]->rt->be->name);
    for (int i = r + 1; i < n; i++)
        if (b[i] && b[i]->dtype != t)
            return dpar__err(DPAR_ERR_DTYPE,
                             "%s: %s is %s but %s is %s; the op's tensors share one dtype (stats stay "
                             "f32); convert with dpar_cast",
                             fn, names[i], dpar_dtype_name(b[i]->dtype), names[r], dpar_dtype_name(t));
    return DPAR_OK;
}
/* >>f64 (checks) ==============================================================
   The ops of the >>f64 api table take all their float tensors in f32, or all
   in f64 (cpu buffers only: dpar_buffer_create refuses f64 elsewhere). The
   first float operand of the op names the dtype (dpar__fdt); each other one
   must match (dpar__need_ft), so a mixed op is refused naming both. */
static dpar_dtype dpar__fdt(const dpar_buffer *ref) {
    return ref && ref->dtype == DPAR_F64 ? DPAR_F64 : DPAR_F32;
}
static dpar_status dpar__need_ft(const char *name, const dpar_buffer *b, const char *which, dpar_dtype t) {
    if (t == DPAR_F32 && b->dtype != DPAR_F64) return dpar__need_f32(name, b, which);
    if (b->dtype != t)
        return dpar__err(DPAR_ERR_DTYPE,
                         "%s: %s is %s but the op's first float operand is %s; its float operands share f32 or f64; "
                         "convert with dpar_cast",
                         name, which, dpar_dtype_name(b->dtype), dpar_dtype_name(t));
    return DPAR_OK;
}
/* dpar__same_float, or every non-NULL b[i] f64 (the layer ops of the >>f64 api: softmax and the norms) */
static dpar_status dpar__same_float64(const char *fn, const dpar_buffer *const *b, const char *const *names, int n) {
    int r = 0;
    while (r < n && !b[r]) r++;
    if (r == n || b[r]->dtype != DPAR_F64) return dpar__same_float(fn, b, names, n);
    for (int i = r + 1; i < n; i++) {
        dpar_status s = b[i] ? dpar__need_ft(fn, b[i], names[i], DPAR_F64) : DPAR_OK;
        if (s) return s;
    }
    return DPAR_OK;
}
static const char *dpar__op_name(dpar__op_kind k);
static dpar_status dpar__op_run(dpar__op *op) {
    dpar_runtime *rt = op->dst->rt;
    if (DPAR__UNLIKELY(dpar__buffer_owner(op->dst, "op") != DPAR_OK)) { /* two compares when fine */
        char fn[64];
        snprintf(fn, sizeof fn, "dpar_%s", dpar__op_name(op->kind));
        return dpar__buffer_owner(op->dst, fn);
    }
    int dev = op->dst->device; /* backend-local index */
    double t0 = dpar__now_us();
    dpar__obs_count_op(rt, dev);
    dpar_status s =
        DPAR__UNLIKELY(DPAR__ATOMIC_LOAD(&dpar__trace_on)) ? dpar__trace_op(op) : rt->be->op(rt->bstate, dev, op);
    dpar__obs_time(rt, dev, DPAR__OBS_COMPUTE, t0);
    return s;
}
static void dpar__op_init(dpar__op *op, dpar__op_kind k, dpar_buffer *dst) {
    memset(op, 0, sizeof *op);
    op->kind = k;
    op->dst = dst;
    if (dst) op->n = dst->count;
}

DPAR_API dpar_status dpar_matmul(dpar_buffer *C, const dpar_buffer *A, const dpar_buffer *B, bool ta, bool tb,
                                 float alpha, float beta) {
    dpar__clear_error();
    const dpar_buffer *ops[2] = { A, B };
    dpar_status s = dpar__op_check("dpar_matmul", C, ops, 2);
    if (s) return s;
    if (A->ndim != 2 || B->ndim != 2 || C->ndim != 2)
        return dpar__err(
            DPAR_ERR_SHAPE,
            "dpar_matmul: A, B and C must be 2-d (they are %d-d, %d-d, %d-d); reshape with dpar_buffer_reshape",
            A->ndim, B->ndim, C->ndim);
    int f64 = A->dtype == DPAR_F64 && B->dtype == DPAR_F64 && C->dtype == DPAR_F64;
    if (!f64 && (A->dtype != B->dtype || C->dtype != DPAR_F32 ||
                 (A->dtype != DPAR_F32 && A->dtype != DPAR_F16 && A->dtype != DPAR_BF16)))
        return dpar__err(DPAR_ERR_DTYPE,
                         "dpar_matmul: A is %s, B is %s, C is %s; A and B must share a float dtype and C must be f32 "
                         "(or all three f64)",
                         dpar_dtype_name(A->dtype), dpar_dtype_name(B->dtype), dpar_dtype_name(C->dtype));
    int64_t M = ta ? A->shape[1] : A->shape[0], K = ta ? A->shape[0] : A->shape[1];
    int64_t K2 = tb ? B->shape[1] : B->shape[0], N = tb ? B->shape[0] : B->shape[1];
    if (K != K2 || C->shape[0] != M || C->shape[1] != N) {
        char a[64], b[64], c[64];
        return dpar__err(DPAR_ERR_SHAPE,
                         "dpar_matmul: op(A) is [%lld, %lld] (A %s%s), op(B) is [%lld, %lld] (B %s%s), C is %s; need "
                         "op(A) [M,K] @ op(B) [K,N] = C [M,N]",
                         (long long)M, (long long)K, dpar__shape_str(a, sizeof a, 2, A->shape), ta ? " transposed" : "",
                         (long long)K2, (long long)N, dpar__shape_str(b, sizeof b, 2, B->shape),
                         tb ? " transposed" : "", dpar__shape_str(c, sizeof c, 2, C->shape));
    }
    if (C == A || C == B) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_matmul: C must not alias A or B");
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_MATMUL, C);
    op.src0 = A;
    op.src1 = B;
    op.m = M;
    op.n = N;
    op.k = K;
    op.trans_a = ta;
    op.trans_b = tb;
    op.f[0] = alpha;
    op.f[1] = beta;
    return dpar__op_run(&op);
}
/* v (NULL: none) is [N] for x [..., N]: a bias, a norm's scale, their gradients */
static dpar_status dpar__last_dim_vec(const char *fn, const dpar_buffer *v, const char *vn, const dpar_buffer *x,
                                      const char *xn) {
    if (!v || (v->ndim == 1 && x->ndim >= 1 && v->shape[0] == x->shape[x->ndim - 1])) return DPAR_OK;
    char a[160], b[160];
    return dpar__err(DPAR_ERR_SHAPE, "%s: %s %s must be 1-d with the size of %s's last dimension (%s is %s)", fn, vn,
                     dpar__shape_str(a, sizeof a, v->ndim, v->shape), xn, xn,
                     dpar__shape_str(b, sizeof b, x->ndim, x->shape));
}
/* y [..., N] and b [N] */
DPAR_API dpar_status dpar_bias_add(dpar_buffer *y, const dpar_buffer *b) {
    dpar__clear_error();
    dpar_status s = dpar__op_check("dpar_bias_add", y, &b, 1);
    if (s || (s = dpar__need_ft("dpar_bias_add", y, "y", dpar__fdt(y))) ||
        (s = dpar__need_ft("dpar_bias_add", b, "bias", dpar__fdt(y))))
        return s;
    if ((s = dpar__last_dim_vec("dpar_bias_add", b, "bias", y, "y"))) return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_BIAS_ADD, y);
    op.src0 = b;
    op.n = b->shape[0];
    op.m = b->shape[0] ? y->count / b->shape[0] : 0;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_bias_grad(dpar_buffer *db, const dpar_buffer *dy, float beta) {
    dpar__clear_error();
    dpar_status s = dpar__op_check("dpar_bias_grad", db, &dy, 1);
    const dpar_buffer *fl[2] = { db, dy };
    const char *fln[2] = { "db", "dy" };
    if (s || (s = dpar__same_float64("dpar_bias_grad", fl, fln, 2))) return s;
    if ((s = dpar__last_dim_vec("dpar_bias_grad", db, "db", dy, "dy"))) return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_BIAS_GRAD, db);
    op.src0 = dy;
    op.n = db->shape[0];
    op.m = db->shape[0] ? dy->count / db->shape[0] : 0;
    op.f[1] = beta;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_relu(dpar_buffer *y, const dpar_buffer *x) {
    dpar__clear_error();
    static const char *const opn[] = { "x" };
    dpar_status s = dpar__op_check_named("dpar_relu", y, &x, opn, 1);
    if (s || (s = dpar__need_ft("dpar_relu", y, "y", dpar__fdt(y))) ||
        (s = dpar__need_ft("dpar_relu", x, "x", dpar__fdt(y))) || (s = dpar__same_shape("dpar_relu", y, "y", x, "x")))
        return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_RELU, y);
    op.src0 = x;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_relu_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x) {
    dpar__clear_error();
    const dpar_buffer *ops[2] = { dy, x };
    dpar_status s = dpar__op_check("dpar_relu_backward", dx, ops, 2);
    if (s || (s = dpar__need_ft("dpar_relu_backward", dx, "dx", dpar__fdt(dx))) ||
        (s = dpar__need_ft("dpar_relu_backward", dy, "dy", dpar__fdt(dx))) ||
        (s = dpar__need_ft("dpar_relu_backward", x, "x", dpar__fdt(dx))) ||
        (s = dpar__same_shape("dpar_relu_backward", dx, "dx", dy, "dy")) ||
        (s = dpar__same_shape("dpar_relu_backward", x, "x", dy, "dy")))
        return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_RELU_BWD, dx);
    op.src0 = dy;
    op.src1 = x;
    return dpar__op_run(&op);
}
/* public names of the ops that check indices, by p[2] of their op record */
static const char *const dpar__idx_fn[] = { "dpar_softmax_xent", "dpar_cross_entropy", "dpar_embedding",
                                            "dpar_embedding_backward" };
enum { DPAR__IDX_SOFTMAX_XENT = 0, DPAR__IDX_XENT, DPAR__IDX_EMBED, DPAR__IDX_EMBED_BWD };
/* softmax cross-entropy of dpar_softmax_xent / dpar_cross_entropy (fn_id: dpar__idx_fn; d NULL: plain) */
static dpar_status dpar__xent(int fn_id, dpar_buffer *loss, dpar_buffer *dlogits, const dpar_buffer *logits,
                              const dpar_buffer *labels, const dpar_xent_desc *d) {
    const char *fn = dpar__idx_fn[fn_id];
    const dpar_buffer *ops[3] = { logits, labels, dlogits ? dlogits : logits };
    dpar_status s = dpar__op_check(fn, loss, ops, 3);
    dpar_dtype t = dpar__fdt(logits);
    if (s || (s = dpar__scalar_out_t(fn, loss, t)) || (s = dpar__need_ft(fn, logits, "logits", t))) return s;
    if (logits->ndim != 2) {
        char x[160];
        return dpar__err(DPAR_ERR_SHAPE, "%s: logits must be 2-d [M, C] (got %s)", fn,
                         dpar__shape_str(x, sizeof x, logits->ndim, logits->shape));
    }
    if (labels->dtype != DPAR_I32)
        return dpar__err(DPAR_ERR_DTYPE, "%s: labels are %s but must be i32 class indices", fn,
                         dpar_dtype_name(labels->dtype));
    if (labels->count != logits->shape[0]) {
        char x[160], y[160];
        return dpar__err(DPAR_ERR_SHAPE, "%s: labels %s must hold one label per row of logits %s", fn,
                         dpar__shape_str(y, sizeof y, labels->ndim, labels->shape),
                         dpar__shape_str(x, sizeof x, logits->ndim, logits->shape));
    }
    if (dlogits && ((s = dpar__need_ft(fn, dlogits, "dlogits", t)) ||
                    (s = dpar__same_shape(fn, dlogits, "dlogits", logits, "logits"))))
        return s;
    if (dlogits == logits) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dlogits must not alias logits", fn);
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_SOFTMAX_XENT, loss);
    op.dst2 = dlogits;
    op.src0 = logits;
    op.src1 = labels;
    op.m = logits->shape[0];
    op.n = logits->shape[1];
    op.p[0] = d && d->use_ignore;
    op.p[1] = d ? d->ignore_label : 0;
    op.p[2] = fn_id;
    op.f[0] = d ? d->label_smoothing : 0.0f;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_softmax_xent(dpar_buffer *loss, dpar_buffer *dlogits, const dpar_buffer *logits,
                                       const dpar_buffer *labels) {
    dpar__clear_error();
    return dpar__xent(DPAR__IDX_SOFTMAX_XENT, loss, dlogits, logits, labels, NULL);
}
DPAR_API dpar_status dpar_mse(dpar_buffer *loss, dpar_buffer *dpred, const dpar_buffer *pred,
                              const dpar_buffer *target) {
    dpar__clear_error();
    const dpar_buffer *ops[3] = { pred, target, dpred ? dpred : pred };
    dpar_status s = dpar__op_check("dpar_mse", loss, ops, 3);
    dpar_dtype t = dpar__fdt(pred);
    if (s || (s = dpar__scalar_out_t("dpar_mse", loss, t)) || (s = dpar__need_ft("dpar_mse", pred, "pred", t)) ||
        (s = dpar__need_ft("dpar_mse", target, "target", t)) ||
        (s = dpar__same_shape("dpar_mse", pred, "pred", target, "target")))
        return s;
    if (dpred && ((s = dpar__need_ft("dpar_mse", dpred, "dpred", t)) ||
                  (s = dpar__same_shape("dpar_mse", dpred, "dpred", pred, "pred"))))
        return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_MSE, loss);
    op.dst2 = dpred;
    op.src0 = pred;
    op.src1 = target;
    op.n = pred->count;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_axpy(dpar_buffer *y, float alpha, const dpar_buffer *x) {
    dpar__clear_error();
    static const char *const opn[] = { "x" };
    dpar_status s = dpar__op_check_named("dpar_axpy", y, &x, opn, 1);
    if (s || (s = dpar__need_ft("dpar_axpy", y, "y", dpar__fdt(y))) ||
        (s = dpar__need_ft("dpar_axpy", x, "x", dpar__fdt(y))) || (s = dpar__same_count("dpar_axpy", y, "y", x, "x")))
        return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_AXPY, y);
    op.src0 = x;
    op.f[0] = alpha;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_scale(dpar_buffer *x, float alpha) {
    dpar__clear_error();
    dpar_status s = dpar__op_check("dpar_scale", x, NULL, 0);
    if (s || (s = dpar__need_ft("dpar_scale", x, "x", dpar__fdt(x)))) return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_SCALE, x);
    op.f[0] = alpha;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_fill(dpar_buffer *x, float value) {
    dpar__clear_error();
    dpar_status s = dpar__op_check("dpar_fill", x, NULL, 0);
    if (s) return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_FILL, x);
    op.f[0] = value;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_copy(dpar_buffer *dst, const dpar_buffer *src) {
    dpar__clear_error();
    static const char *const opn[] = { "the source" };
    dpar_status s = dpar__op_check_named("dpar_copy", dst, &src, opn, 1);
    if (s || (s = dpar__same_count("dpar_copy", dst, "dst", src, "src"))) return s;
    if (dst->dtype != src->dtype)
        return dpar__err(DPAR_ERR_DTYPE, "dpar_copy: dst is %s but src is %s; use dpar_cast to convert",
                         dpar_dtype_name(dst->dtype), dpar_dtype_name(src->dtype));
    if (dst == src) return DPAR_OK;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_COPY, dst);
    op.src0 = src;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_cast(dpar_buffer *dst, const dpar_buffer *src) {
    dpar__clear_error();
    static const char *const opn[] = { "the source" };
    dpar_status s = dpar__op_check_named("dpar_cast", dst, &src, opn, 1);
    if (s || (s = dpar__same_count("dpar_cast", dst, "dst", src, "src"))) return s;
    if (dst == src) return DPAR_OK;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_CAST, dst);
    op.src0 = src;
    return dpar__op_run(&op);
}
/* out[at] = the reduction of x (op.p[0] = at): dpar_sum and dpar_sum_squares pass at < 0, the one element
   of a 1-element out; the clip's norms (dpar__clip_scale) write element i of one buffer for gradient i, so
   a single read fetches them all */
static dpar_status dpar__reduce_op(const char *name, dpar__op_kind k, dpar_buffer *out, int64_t at,
                                   const dpar_buffer *x) {
    dpar__clear_error();
    static const char *const opn[] = { "x" };
    dpar_status s = dpar__op_check_named(name, out, &x, opn, 1);
    if (s || (s = dpar__need_ft(name, x, "x", dpar__fdt(x)))) return s;
    if (at < 0 && (s = dpar__scalar_out_t(name, out, dpar__fdt(x)))) return s;
    if (at < 0) at = 0;
    if (at >= out->count || out->dtype != dpar__fdt(x))
        return dpar__err(DPAR_ERR_SHAPE, "%s: result element %lld of a %lld-element %s buffer: out of range or not %s",
                         name, (long long)at, (long long)out->count, dpar_dtype_name(out->dtype),
                         dpar_dtype_name(dpar__fdt(x)));
    dpar__op op;
    dpar__op_init(&op, k, out);
    op.src0 = x;
    op.n = x->count;
    op.p[0] = at;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_sum(dpar_buffer *out, const dpar_buffer *x) {
    return dpar__reduce_op("dpar_sum", DPAR__OP_SUM, out, -1, x);
}
DPAR_API dpar_status dpar_sum_squares(dpar_buffer *out, const dpar_buffer *x) {
    return dpar__reduce_op("dpar_sum_squares", DPAR__OP_SUMSQ, out, -1, x);
}

/* >>elementwise ops ===========================================================
   Checks, then DPAR__OP_* records over a geometry: an iteration shape with one
   stride array per operand (elements; 0 = broadcast). Neighbouring dims that
   every operand walks as one merge, so most ops reach a backend with 1-3 dims;
   backends take 4 (p[0..3]), and dpar__geo_issue loops over any dims beyond. */
typedef struct dpar__geo {
    int nd;
    int64_t shape[DPAR_MAX_DIMS];
    int64_t st[3][DPAR_MAX_DIMS];
} dpar__geo;

/* reduction kinds of DPAR__OP_REDUCE: dpar_reduce_kind, then the binary gradients */
enum {
    DPAR__RED_NEG = DPAR_REDUCE_KIND_COUNT,
    DPAR__RED_MUL_B,
    DPAR__RED_MUL_A,
    DPAR__RED_DIV_B,
    DPAR__RED_DIV_B2,
    DPAR__RED_MAX_BWD /* dst = dx (dense, src0's shape): src1 (dy)[o] at the first max of slice o, else 0 */
};

static void dpar__dense_strides(int nd, const int64_t *shape, int64_t *st) {
    int64_t acc = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= shape[i];
    }
}
/* strides of x broadcast to nd dims (NumPy: trailing alignment; size-1 dims get 0) */
static void dpar__bcast_strides(const dpar_buffer *x, int nd, int64_t *st) {
    int64_t xs[DPAR_MAX_DIMS];
    int off = nd - x->ndim;
    dpar__dense_strides(x->ndim, x->shape, xs);
    for (int i = 0; i < nd; i++) st[i] = i < off || x->shape[i - off] == 1 ? 0 : xs[i - off];
}
static dpar_status dpar__bcast_check(const char *fn, const dpar_buffer *y, const dpar_buffer *x, const char *xn) {
    int ok = x->ndim <= y->ndim;
    for (int i = 0; ok && i < x->ndim; i++) {
        int64_t d = x->shape[x->ndim - 1 - i];
        ok = d == 1 || d == y->shape[y->ndim - 1 - i];
    }
    if (!ok) {
        char a[160], b[160];
        return dpar__err(DPAR_ERR_SHAPE,
                         "%s: %s %s does not broadcast to the result's shape %s (NumPy rules: trailing dims equal "
                         "or 1); give the result the broadcast shape",
                         fn, xn, dpar__shape_str(a, sizeof a, x->ndim, x->shape),
                         dpar__shape_str(b, sizeof b, y->ndim, y->shape));
    }
    return DPAR_OK;
}
/* drops size-1 dims and merges a dim into the previous one when every operand steps over both as one */
static void dpar__geo_merge(dpar__geo *g, int nops) {
    int out = 0;
    for (int i = 0; i < g->nd; i++) {
        if (g->shape[i] == 1) continue;
        int merge = out > 0;
        for (int k = 0; merge && k < nops; k++) merge = g->st[k][out - 1] == g->st[k][i] * g->shape[i];
        int at = merge ? out - 1 : out++;
        g->shape[at] = merge ? g->shape[at] * g->shape[i] : g->shape[i];
        for (int k = 0; k < nops; k++) g->st[k][at] = g->st[k][i];
    }
    g->nd = out;
}
/* Writes the innermost 4 dims of g into p[0..3] (shape), p[4..7], p[8..11]
   (strides of operands 0, 1), leading dims padded with size 1. */
static void dpar__geo_put(dpar__op *op, const dpar__geo *g) {
    for (int d = 0; d < 4; d++) {
        int i = g->nd - 4 + d;
        op->p[d] = i >= 0 ? g->shape[i] : 1;
        op->p[4 + d] = i >= 0 ? g->st[0][i] : 0;
        op->p[8 + d] = i >= 0 ? g->st[1][i] : 0;
    }
    op->n = op->p[0] * op->p[1] * op->p[2] * op->p[3];
}
/* Runs op over g: once per index of the dims beyond the innermost 4, with
   p[12..14] the offsets of operands 0..2 (off[] plus that index's). */
static dpar_status dpar__geo_issue(dpar__op *op, const dpar__geo *g, const int64_t off[3]) {
    int outer = g->nd > 4 ? g->nd - 4 : 0;
    int64_t idx[DPAR_MAX_DIMS];
    if (dpar__prod(g->shape, g->nd) == 0) return DPAR_OK;
    memset(idx, 0, sizeof idx);
    dpar__geo_put(op, g);
    for (;;) {
        for (int k = 0; k < 3; k++) {
            op->p[12 + k] = off[k];
            for (int i = 0; i < outer; i++) op->p[12 + k] += idx[i] * g->st[k][i];
        }
        dpar_status s = dpar__op_run(op);
        if (s) return s;
        int i = outer - 1;
        while (i >= 0 && ++idx[i] == g->shape[i]) idx[i--] = 0;
        if (i < 0) return DPAR_OK;
    }
}
static dpar_status dpar__geo_4d(const char *fn, const dpar__geo *g) {
    if (g->nd > 4) {
        char a[160];
        return dpar__err(DPAR_ERR_SHAPE,
                         "%s: the operands' layout needs %d dims %s after merging neighbours (at most 4); "
                         "reshape or split the op",
                         fn, g->nd, dpar__shape_str(a, sizeof a, g->nd, g->shape));
    }
    return DPAR_OK;
}

DPAR_API dpar_status dpar_unary(dpar_buffer *y, const dpar_buffer *x, dpar_unary_op u, float sc) {
    dpar__clear_error();
    dpar_status s = dpar__op_check("dpar_unary", y, &x, 1);
    if (s || (s = dpar__need_ft("dpar_unary", y, "y", dpar__fdt(y))) ||
        (s = dpar__need_ft("dpar_unary", x, "x", dpar__fdt(y))) || (s = dpar__same_shape("dpar_unary", y, "y", x, "x")))
        return s;
    if ((int)u < 0 || u >= DPAR_UNARY_COUNT)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_unary: op %d is not a dpar_unary_op (0..%d)", (int)u,
                         (int)DPAR_UNARY_COUNT - 1);
    if (y->count == 0) return DPAR_OK;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_UNARY, y);
    op.src0 = x;
    op.p[0] = (int64_t)u;
    op.f[0] = sc;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_unary_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x, dpar_unary_op u,
                                         float sc) {
    const char *fn = "dpar_unary_backward";
    dpar__clear_error();
    const dpar_buffer *ops[2] = { dy, x };
    dpar_status s = dpar__op_check(fn, dx, ops, 2);
    if (s || (s = dpar__need_ft(fn, dx, "dx", dpar__fdt(dx))) || (s = dpar__need_ft(fn, dy, "dy", dpar__fdt(dx))) ||
        (s = dpar__need_ft(fn, x, "x", dpar__fdt(dx))) || (s = dpar__same_shape(fn, dx, "dx", dy, "dy")) ||
        (s = dpar__same_shape(fn, x, "x", dy, "dy")))
        return s;
    if ((int)u < 0 || u >= DPAR_UNARY_COUNT)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: op %d is not a dpar_unary_op (0..%d)", fn, (int)u,
                         (int)DPAR_UNARY_COUNT - 1);
    if (dx->count == 0) return DPAR_OK;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_UNARY_BWD, dx);
    op.src0 = x;
    op.src1 = dy;
    op.p[0] = (int64_t)u;
    op.f[0] = sc;
    return dpar__op_run(&op);
}

DPAR_API dpar_status dpar_binary(dpar_buffer *y, const dpar_buffer *a, const dpar_buffer *b, dpar_binary_op bop) {
    const char *fn = "dpar_binary";
    dpar__clear_error();
    const dpar_buffer *ops[2] = { a, b };
    static const char *const opn[] = { "a", "b" };
    dpar_status s = dpar__op_check_named(fn, y, ops, opn, 2);
    dpar_dtype t = dpar__fdt(y);
    if (s || (s = dpar__need_ft(fn, y, "y", t)) || (s = dpar__need_ft(fn, a, "a", t)) ||
        (s = dpar__need_ft(fn, b, "b", t)) || (s = dpar__bcast_check(fn, y, a, "a")) ||
        (s = dpar__bcast_check(fn, y, b, "b")))
        return s;
    if ((int)bop < 0 || bop >= DPAR_BINARY_COUNT)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: op %d is not a dpar_binary_op (0..%d)", fn, (int)bop,
                         (int)DPAR_BINARY_COUNT - 1);
    if ((y == a && a->count != y->count) || (y == b && b->count != y->count))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: y aliases a broadcast operand; write to another buffer", fn);
    dpar__geo g;
    g.nd = y->ndim;
    memcpy(g.shape, y->shape, sizeof g.shape);
    dpar__bcast_strides(a, y->ndim, g.st[0]);
    dpar__bcast_strides(b, y->ndim, g.st[1]);
    dpar__dense_strides(y->ndim, y->shape, g.st[2]);
    dpar__geo_merge(&g, 3);
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_BINARY, y);
    op.src0 = a;
    op.src1 = b;
    op.p[15] = (int64_t)bop;
    int64_t off[3] = { 0, 0, 0 };
    return dpar__geo_issue(&op, &g, off);
}

/* dst = reduction `red` of src0 (dense over g's shape) over the dims where
   g->st[2] (dst's strides) is 0; a, b (strides g->st[0], g->st[1]) feed the
   binary gradients. DPAR__RED_MAX_BWD writes dst in src0's shape, one slice per element of a (dy). */
static dpar_status dpar__reduce_issue(const char *fn, dpar_buffer *dst, const dpar_buffer *src0, const dpar_buffer *a,
                                      const dpar_buffer *b, dpar__geo *g, int red) {
    dpar__geo_merge(g, 3);
    dpar_status s = dpar__geo_4d(fn, g);
    if (s || dst->count == 0 || (a && red == DPAR__RED_MAX_BWD && a->count == 0)) return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_REDUCE, dst);
    op.src0 = src0;
    op.src1 = a;
    op.src2 = b;
    dpar__geo_put(&op, g);
    op.n = red == DPAR__RED_MAX_BWD ? a->count : dst->count;
    op.p[12] = red;
    for (int d = 0; d < 4; d++) {
        int i = g->nd - 4 + d;
        if (i >= 0 && g->st[2][i] == 0) op.p[13] |= (int64_t)1 << d;
    }
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_binary_backward(dpar_buffer *da, dpar_buffer *db, const dpar_buffer *dy, const dpar_buffer *a,
                                          const dpar_buffer *b, dpar_binary_op bop) {
    const char *fn = "dpar_binary_backward";
    dpar__clear_error();
    const dpar_buffer *ops[3] = { dy, a, b };
    dpar_status s = dpar__op_check(fn, dy, ops, 3);
    dpar_dtype t = dpar__fdt(dy);
    if (s || (s = dpar__need_ft(fn, dy, "dy", t)) || (s = dpar__need_ft(fn, a, "a", t)) ||
        (s = dpar__need_ft(fn, b, "b", t)) || (s = dpar__bcast_check(fn, dy, a, "a")) ||
        (s = dpar__bcast_check(fn, dy, b, "b")))
        return s;
    if ((int)bop < 0 || bop >= DPAR_BINARY_COUNT)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: op %d is not a dpar_binary_op (0..%d)", fn, (int)bop,
                         (int)DPAR_BINARY_COUNT - 1);
    dpar_buffer *outs[2] = { da, db };
    const dpar_buffer *ins[2] = { a, b };
    static const int red[DPAR_BINARY_COUNT][2] = { { DPAR_REDUCE_SUM, DPAR_REDUCE_SUM },
                                                   { DPAR_REDUCE_SUM, DPAR__RED_NEG },
                                                   { DPAR__RED_MUL_B, DPAR__RED_MUL_A },
                                                   { DPAR__RED_DIV_B, DPAR__RED_DIV_B2 } };
    for (int k = 0; k < 2; k++) {
        if (!outs[k]) continue;
        const char *nm = k ? "db" : "da";
        if ((s = dpar__op_check(fn, outs[k], &dy, 1)) || (s = dpar__need_ft(fn, outs[k], nm, t)) ||
            (s = dpar__same_shape(fn, outs[k], nm, ins[k], k ? "b" : "a")))
            return s;
        if (outs[k] == dy || outs[k] == a || outs[k] == b || outs[k] == outs[1 - k])
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: %s aliases another operand; give it its own buffer", fn,
                             nm);
    }
    for (int k = 0; k < 2; k++) {
        if (!outs[k]) continue;
        dpar__geo g;
        g.nd = dy->ndim;
        memcpy(g.shape, dy->shape, sizeof g.shape);
        dpar__bcast_strides(a, dy->ndim, g.st[0]);
        dpar__bcast_strides(b, dy->ndim, g.st[1]);
        memcpy(g.st[2], g.st[k], sizeof g.st[2]);
        if ((s = dpar__reduce_issue(fn, outs[k], dy, a, b, &g, red[bop][k]))) return s;
    }
    return DPAR_OK;
}

DPAR_API dpar_status dpar_where(dpar_buffer *y, const dpar_buffer *cond, const dpar_buffer *a, const dpar_buffer *b,
                                float a_value, float b_value) {
    const char *fn = "dpar_where";
    dpar__clear_error();
    const dpar_buffer *ops[3] = { cond, a ? a : cond, b ? b : cond };
    dpar_status s = dpar__op_check(fn, y, ops, 3);
    dpar_dtype t = s ? DPAR_F32 : dpar__fdt(y); /* y, a, b: f32, or f64 throughout (>>f64 api) */
    if (s || (s = dpar__need_ft(fn, y, "y", t)) || (s = dpar__bcast_check(fn, y, cond, "cond")) ||
        (a && ((s = dpar__need_ft(fn, a, "a", t)) || (s = dpar__bcast_check(fn, y, a, "a")))) ||
        (b && ((s = dpar__need_ft(fn, b, "b", t)) || (s = dpar__bcast_check(fn, y, b, "b")))))
        return s;
    if (cond->dtype != t && cond->dtype != DPAR_I32)
        return dpar__err(DPAR_ERR_DTYPE, "%s: cond is %s but y is %s; cond must be %s or i32 (nonzero: true)", fn,
                         dpar_dtype_name(cond->dtype), dpar_dtype_name(t), dpar_dtype_name(t));
    if ((y == (const dpar_buffer *)cond && cond->count != y->count) || (y == a && a->count != y->count) ||
        (y == b && b->count != y->count))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: y aliases a broadcast operand; write to another buffer", fn);
    dpar__geo g;
    g.nd = y->ndim;
    memcpy(g.shape, y->shape, sizeof g.shape);
    dpar__bcast_strides(cond, y->ndim, g.st[0]);
    dpar__bcast_strides(a ? a : cond, y->ndim, g.st[1]);
    dpar__bcast_strides(b ? b : cond, y->ndim, g.st[2]);
    dpar__geo_merge(&g, 3);
    if ((s = dpar__geo_4d(fn, &g)) || y->count == 0) return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_WHERE, y);
    op.src0 = cond;
    op.src1 = a;
    op.src2 = b;
    dpar__geo_put(&op, &g);
    for (int d = 0; d < 4; d++) op.p[12 + d] = g.nd - 4 + d >= 0 ? g.st[2][g.nd - 4 + d] : 0;
    op.k = cond->dtype == DPAR_I32;
    op.f[0] = a_value;
    op.f[1] = b_value;
    return dpar__op_run(&op);
}

/* axes -> bit mask over x's dims (axes NULL: all) */
static dpar_status dpar__axes_mask(const char *fn, int ndim, const int *axes, int naxes, unsigned *mask) {
    *mask = 0;
    if (!axes) {
        *mask = (1u << ndim) - 1u;
        return DPAR_OK;
    }
    if (naxes < 0 || naxes > ndim)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: naxes = %d; it must be in 0..%d (x's rank)", fn, naxes, ndim);
    for (int i = 0; i < naxes; i++) {
        int ax = axes[i] < 0 ? axes[i] + ndim : axes[i];
        if (ax < 0 || ax >= ndim || (*mask >> ax & 1u))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "%s: axes[%d] = %d is out of range or repeated (x has %d dims; -%d..%d allowed)", fn, i,
                             axes[i], ndim, ndim, ndim - 1);
        *mask |= 1u << ax;
    }
    return DPAR_OK;
}
/* y must be x's shape without the masked dims, or with them as 1; fills g for dpar__reduce_issue */
static dpar_status dpar__reduce_shape(const char *fn, const dpar_buffer *y, const char *yn, const dpar_buffer *x,
                                      const char *xn, unsigned mask, dpar__geo *g) {
    int64_t kept[DPAR_MAX_DIMS], keep1[DPAR_MAX_DIMS];
    int nk = 0;
    for (int i = 0; i < x->ndim; i++) {
        keep1[i] = mask >> i & 1u ? 1 : x->shape[i];
        if (!(mask >> i & 1u)) kept[nk++] = x->shape[i];
    }
    int ok1 = y->ndim == nk, ok2 = y->ndim == x->ndim;
    for (int i = 0; ok1 && i < nk; i++) ok1 = y->shape[i] == kept[i];
    for (int i = 0; ok2 && i < x->ndim; i++) ok2 = y->shape[i] == keep1[i];
    if (!ok1 && !ok2) {
        char a[160], b[160], c[160], d[160];
        return dpar__err(DPAR_ERR_SHAPE, "%s: %s is %s; reducing %s %s needs %s or %s (keepdims)", fn, yn,
                         dpar__shape_str(a, sizeof a, y->ndim, y->shape), xn,
                         dpar__shape_str(b, sizeof b, x->ndim, x->shape), dpar__shape_str(c, sizeof c, nk, kept),
                         dpar__shape_str(d, sizeof d, x->ndim, keep1));
    }
    int64_t ks[DPAR_MAX_DIMS];
    dpar__dense_strides(x->ndim, keep1, ks);
    g->nd = x->ndim;
    memcpy(g->shape, x->shape, sizeof g->shape);
    for (int i = 0; i < x->ndim; i++) {
        g->st[0][i] = g->st[1][i] = 0;
        g->st[2][i] = mask >> i & 1u ? 0 : ks[i];
    }
    return DPAR_OK;
}
DPAR_API dpar_status dpar_reduce(dpar_buffer *y, const dpar_buffer *x, dpar_reduce_kind kind, const int *axes,
                                 int naxes) {
    const char *fn = "dpar_reduce";
    dpar__clear_error();
    unsigned mask;
    dpar__geo g;
    dpar_status s = dpar__op_check(fn, y, &x, 1);
    const char *xn = "x";
    if (s || (s = dpar__same_float64(fn, &x, &xn, 1))) return s;
    if ((int)kind < 0 || kind >= DPAR_REDUCE_KIND_COUNT)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: kind %d is not a dpar_reduce_kind", fn, (int)kind);
    if (y->dtype != (kind == DPAR_REDUCE_ARGMAX ? DPAR_I32 : x->dtype))
        return dpar__err(DPAR_ERR_DTYPE, "%s: y is %s; it must be %s for this kind", fn, dpar_dtype_name(y->dtype),
                         kind == DPAR_REDUCE_ARGMAX ? "i32" : dpar_dtype_name(x->dtype));
    if ((s = dpar__axes_mask(fn, x->ndim, axes, naxes, &mask)) ||
        (s = dpar__reduce_shape(fn, y, "y", x, "x", mask, &g)))
        return s;
    if ((kind == DPAR_REDUCE_MAX || kind == DPAR_REDUCE_ARGMAX) && y->count > 0 && x->count == 0)
        return dpar__err(DPAR_ERR_SHAPE, "%s: max/argmax over 0 elements has no value; reduce a non-empty axis", fn);
    if (y == x && y->count != x->count) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: y must not alias x", fn);
    return dpar__reduce_issue(fn, y, x, NULL, NULL, &g, (int)kind);
}

/* dst[doff + i . dst_st] = src[soff + i . src_st] for i over shape (nd dims) */
static dpar_status dpar__strided(dpar_buffer *dst, const dpar_buffer *src, int nd, const int64_t *shape,
                                 const int64_t *src_st, int64_t soff, const int64_t *dst_st, int64_t doff) {
    dpar__geo g;
    g.nd = nd;
    for (int i = 0; i < nd; i++) {
        g.shape[i] = shape[i];
        g.st[0][i] = src_st[i];
        g.st[1][i] = dst_st[i];
        g.st[2][i] = 0;
    }
    dpar__geo_merge(&g, 2);
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_STRIDED, dst);
    op.src0 = src;
    int64_t off[3] = { soff, doff, 0 };
    return dpar__geo_issue(&op, &g, off);
}
static dpar_status dpar__shape_op_check(const char *fn, const dpar_buffer *y, const dpar_buffer *x, int same_rank) {
    dpar_status s = dpar__op_check(fn, y, &x, 1);
    if (s) return s;
    if (y->dtype != x->dtype || (x->dtype != DPAR_F32 && x->dtype != DPAR_I32 && x->dtype != DPAR_F64))
        return dpar__err(DPAR_ERR_DTYPE, "%s: y is %s and x is %s; both must be f32, both f64 or both i32", fn,
                         dpar_dtype_name(y->dtype), dpar_dtype_name(x->dtype));
    if (same_rank && y->ndim != x->ndim) {
        char a[160], b[160];
        return dpar__err(DPAR_ERR_SHAPE, "%s: y %s and x %s must have the same rank", fn,
                         dpar__shape_str(a, sizeof a, y->ndim, y->shape),
                         dpar__shape_str(b, sizeof b, x->ndim, x->shape));
    }
    if (y == x) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: y must not alias x (not in place)", fn);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_reduce_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x,
                                          dpar_reduce_kind kind, const int *axes, int naxes) {
    const char *fn = "dpar_reduce_backward";
    dpar__clear_error();
    unsigned mask;
    dpar__geo g;
    dpar_status s = dpar__shape_op_check(fn, dx, dy, 0);
    if (s || (s = dpar__need_ft(fn, dx, "dx", dpar__fdt(dx)))) return s;
    if (kind != DPAR_REDUCE_SUM && kind != DPAR_REDUCE_MEAN && kind != DPAR_REDUCE_MAX)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: kind %d has no gradient (SUM, MEAN and MAX do)", fn,
                         (int)kind);
    if ((s = dpar__axes_mask(fn, dx->ndim, axes, naxes, &mask)) ||
        (s = dpar__reduce_shape(fn, dy, "dy", dx, "dx", mask, &g)))
        return s;
    if (kind == DPAR_REDUCE_MAX) {
        if (!x) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: MAX needs the forward's input x (it is NULL)", fn);
        if ((s = dpar__op_check(fn, dx, &x, 1)) || (s = dpar__need_ft(fn, x, "x", dpar__fdt(dx))) ||
            (s = dpar__same_shape(fn, x, "x", dx, "dx")))
            return s;
        if (x == dx) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dx must not alias x", fn);
        return dpar__reduce_issue(fn, dx, x, dy, NULL, &g, DPAR__RED_MAX_BWD);
    }
    int64_t dst_st[DPAR_MAX_DIMS];
    dpar__dense_strides(dx->ndim, dx->shape, dst_st);
    if ((s = dpar__strided(dx, dy, dx->ndim, dx->shape, g.st[2], 0, dst_st, 0))) return s;
    /* f64: divide by n, since 1/n as a float would lose digits */
    if (kind == DPAR_REDUCE_MEAN && dx->count > 0 && dx->dtype == DPAR_F64)
        return dpar_unary(dx, dx, DPAR_UNARY_DIV_SCALAR, (float)(dx->count / dy->count));
    if (kind == DPAR_REDUCE_MEAN && dx->count > 0)
        return dpar_unary(dx, dx, DPAR_UNARY_MUL_SCALAR, (float)(1.0 / (double)(dx->count / dy->count)));
    return DPAR_OK;
}

DPAR_API dpar_status dpar_softmax(dpar_buffer *y, const dpar_buffer *x, bool log) {
    const char *fn = "dpar_softmax";
    dpar__clear_error();
    const dpar_buffer *fl[2] = { y, x };
    const char *fln[2] = { "y", "x" };
    dpar_status s = dpar__op_check(fn, y, &x, 1);
    if (s || (s = dpar__same_float64(fn, fl, fln, 2)) || (s = dpar__same_shape(fn, y, "y", x, "x"))) return s;
    if (x->ndim < 1) return dpar__err(DPAR_ERR_SHAPE, "%s: x is a scalar; it needs a last axis", fn);
    if (y->count == 0) return DPAR_OK;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_SOFTMAX, y);
    op.src0 = x;
    op.n = x->shape[x->ndim - 1];
    op.m = x->count / op.n;
    op.p[0] = log;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_softmax_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *y, bool log) {
    const char *fn = "dpar_softmax_backward";
    dpar__clear_error();
    const dpar_buffer *ops[2] = { dy, y }, *fl[3] = { dx, dy, y };
    const char *fln[3] = { "dx", "dy", "y" };
    dpar_status s = dpar__op_check(fn, dx, ops, 2);
    if (s || (s = dpar__same_float64(fn, fl, fln, 3)) || (s = dpar__same_shape(fn, dx, "dx", dy, "dy")) ||
        (s = dpar__same_shape(fn, y, "y", dy, "dy")))
        return s;
    if (y->ndim < 1) return dpar__err(DPAR_ERR_SHAPE, "%s: y is a scalar; it needs a last axis", fn);
    if (dx == y) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dx must not alias y", fn);
    if (dx->count == 0) return DPAR_OK;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_SOFTMAX_BWD, dx);
    op.src0 = dy;
    op.src1 = y;
    op.n = y->shape[y->ndim - 1];
    op.m = y->count / op.n;
    op.p[0] = log;
    return dpar__op_run(&op);
}

DPAR_API dpar_status dpar_transpose(dpar_buffer *y, const dpar_buffer *x, const int *perm) {
    const char *fn = "dpar_transpose";
    dpar__clear_error();
    dpar_status s = dpar__shape_op_check(fn, y, x, 1);
    if (s) return s;
    int64_t xs[DPAR_MAX_DIMS], src_st[DPAR_MAX_DIMS], dst_st[DPAR_MAX_DIMS];
    unsigned seen = 0;
    dpar__dense_strides(x->ndim, x->shape, xs);
    dpar__dense_strides(y->ndim, y->shape, dst_st);
    for (int i = 0; i < x->ndim; i++) {
        int p = perm ? perm[i] : x->ndim - 1 - i;
        if (p < 0 || p >= x->ndim || (seen >> p & 1u))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: perm[%d] = %d; perm must hold each of 0..%d once", fn, i,
                             p, x->ndim - 1);
        seen |= 1u << p;
    }
    for (int i = 0; i < x->ndim; i++) {
        int p = perm ? perm[i] : x->ndim - 1 - i;
        if (y->shape[i] != x->shape[p]) {
            char a[160], b[160];
            return dpar__err(DPAR_ERR_SHAPE, "%s: y %s: dim %d must be x's dim %d (x is %s)", fn,
                             dpar__shape_str(a, sizeof a, y->ndim, y->shape), i, p,
                             dpar__shape_str(b, sizeof b, x->ndim, x->shape));
        }
        src_st[i] = xs[p];
    }
    return dpar__strided(y, x, y->ndim, y->shape, src_st, 0, dst_st, 0);
}
DPAR_API dpar_status dpar_broadcast_to(dpar_buffer *y, const dpar_buffer *x) {
    const char *fn = "dpar_broadcast_to";
    dpar__clear_error();
    dpar_status s = dpar__shape_op_check(fn, y, x, 0);
    if (s || (s = dpar__bcast_check(fn, y, x, "x"))) return s;
    int64_t src_st[DPAR_MAX_DIMS], dst_st[DPAR_MAX_DIMS];
    dpar__bcast_strides(x, y->ndim, src_st);
    dpar__dense_strides(y->ndim, y->shape, dst_st);
    return dpar__strided(y, x, y->ndim, y->shape, src_st, 0, dst_st, 0);
}
/* Do n elements from start in steps of step (>= 1) lie in 0..dim-1? Checked without
   overflow, as start, step and n may be any int64 a caller passes. */
static bool dpar__span_fits(int64_t dim, int64_t start, int64_t n, int64_t step) {
    if (step < 1 || start < 0 || n < 0 || start > dim) return false;
    return n == 0 || (start < dim && n - 1 <= (dim - 1 - start) / step);
}
/* big[start : : step] with small's shape: strides and offset into big */
static dpar_status dpar__slice_geo(const char *fn, const dpar_buffer *big, const dpar_buffer *small,
                                   const int64_t *start, const int64_t *step, int64_t *st, int64_t *off) {
    int64_t bs[DPAR_MAX_DIMS];
    dpar__dense_strides(big->ndim, big->shape, bs);
    *off = 0;
    if (!start && big->ndim > 0) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: start is NULL", fn);
    for (int i = 0; i < big->ndim; i++) {
        int64_t n = small->shape[i], k = step ? step[i] : 1;
        if (!dpar__span_fits(big->shape[i], start[i], n, k))
            return dpar__err(DPAR_ERR_SHAPE,
                             "%s: axis %d: %lld elements from %lld in steps of %lld do not fit in %lld; steps are "
                             ">= 1 and every index must lie inside",
                             fn, i, (long long)n, (long long)start[i], (long long)k, (long long)big->shape[i]);
        st[i] = bs[i] * k;
        *off += start[i] * bs[i];
    }
    return DPAR_OK;
}
DPAR_API dpar_status dpar_slice(dpar_buffer *y, const dpar_buffer *x, const int64_t *start, const int64_t *step) {
    const char *fn = "dpar_slice";
    dpar__clear_error();
    int64_t st[DPAR_MAX_DIMS], dst_st[DPAR_MAX_DIMS], off;
    dpar_status s = dpar__shape_op_check(fn, y, x, 1);
    if (s || (s = dpar__slice_geo(fn, x, y, start, step, st, &off))) return s;
    dpar__dense_strides(y->ndim, y->shape, dst_st);
    return dpar__strided(y, x, y->ndim, y->shape, st, off, dst_st, 0);
}
DPAR_API dpar_status dpar_slice_backward(dpar_buffer *dx, const dpar_buffer *dy, const int64_t *start,
                                         const int64_t *step) {
    const char *fn = "dpar_slice_backward";
    dpar__clear_error();
    int64_t st[DPAR_MAX_DIMS], src_st[DPAR_MAX_DIMS], off;
    dpar_status s = dpar__shape_op_check(fn, dx, dy, 1);
    if (s || (s = dpar__slice_geo(fn, dx, dy, start, step, st, &off)) || (s = dpar_fill(dx, 0.0f))) return s;
    dpar__dense_strides(dy->ndim, dy->shape, src_st);
    return dpar__strided(dx, dy, dy->ndim, dy->shape, src_st, 0, st, off);
}
DPAR_API dpar_status dpar_pad(dpar_buffer *y, const dpar_buffer *x, const int64_t *lo, float value) {
    const char *fn = "dpar_pad";
    dpar__clear_error();
    int64_t zeros[DPAR_MAX_DIMS], st[DPAR_MAX_DIMS], src_st[DPAR_MAX_DIMS], off;
    memset(zeros, 0, sizeof zeros);
    dpar_status s = dpar__shape_op_check(fn, y, x, 1);
    if (s || (s = dpar__slice_geo(fn, y, x, lo ? lo : zeros, NULL, st, &off)) || (s = dpar_fill(y, value))) return s;
    dpar__dense_strides(x->ndim, x->shape, src_st);
    return dpar__strided(y, x, x->ndim, x->shape, src_st, 0, st, off);
}
DPAR_API dpar_status dpar_concat(dpar_buffer *y, const dpar_buffer *const *xs, int n, int axis) {
    const char *fn = "dpar_concat";
    dpar__clear_error();
    if (!y || !xs || n < 1) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: y or xs is NULL, or n < 1", fn);
    int ax = axis < 0 ? axis + y->ndim : axis;
    if (ax < 0 || ax >= y->ndim)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: axis %d is out of range for y's %d dims", fn, axis, y->ndim);
    int64_t at = 0, dst_st[DPAR_MAX_DIMS], src_st[DPAR_MAX_DIMS];
    dpar__dense_strides(y->ndim, y->shape, dst_st);
    for (int k = 0; k < n; k++) {
        dpar_status s = dpar__shape_op_check(fn, y, xs[k], 1);
        if (s) return s;
        int ok = 1;
        for (int i = 0; i < y->ndim; i++) ok &= i == ax || xs[k]->shape[i] == y->shape[i];
        at += xs[k]->shape[ax];
        if (!ok || at > y->shape[ax] || (k == n - 1 && at != y->shape[ax])) {
            char a[160], b[160];
            return dpar__err(DPAR_ERR_SHAPE,
                             "%s: input %d is %s and y is %s; inputs must match y except along axis %d, where "
                             "their sizes sum to y's",
                             fn, k, dpar__shape_str(a, sizeof a, xs[k]->ndim, xs[k]->shape),
                             dpar__shape_str(b, sizeof b, y->ndim, y->shape), ax);
        }
    }
    at = 0;
    for (int k = 0; k < n; k++) {
        dpar__dense_strides(xs[k]->ndim, xs[k]->shape, src_st);
        dpar_status s = dpar__strided(y, xs[k], y->ndim, xs[k]->shape, src_st, 0, dst_st, at * dst_st[ax]);
        if (s) return s;
        at += xs[k]->shape[ax];
    }
    return DPAR_OK;
}

/* >>conv-pool ================================================================
   conv2d and the 2-D pools: the desc's defaults resolved in one place, the
   window geometry (dpar__win2d), shape checks, then one op record each. */
/* One spatial dim: output size and leading pad (see the header's formulas). */
static dpar_status dpar__win_dim(const char *fn, const char *dim, int64_t in, int64_t k, int64_t s, int64_t dil,
                                 dpar_padding mode, const int lohi[2], int64_t *out, int64_t *lo) {
    /* in and k are <= 2^40 (dpar__win2d_make), s and dil < 2^31: bounding ek bounds every sum below */
    if (k - 1 > DPAR__MAX_DIM / dil)
        return dpar__err(DPAR_ERR_SHAPE, "%s: a window of %lld with dilation %lld spans more than 2^40 in %s", fn,
                         (long long)k, (long long)dil, dim);
    int64_t ek = (k - 1) * dil + 1, plo = 0, phi = 0;
    if (mode == DPAR_PADDING_SAME) {
        int64_t o = (in + s - 1) / s, total = (o - 1) * s + ek - in;
        if (in == 0) total = 0;
        plo = total > 0 ? total / 2 : 0;
        phi = total > 0 ? total - plo : 0;
        if (in == 0) {
            *out = 0, *lo = 0;
            return DPAR_OK;
        }
    } else if (mode == DPAR_PADDING_EXPLICIT) {
        plo = lohi[0];
        phi = lohi[1];
    }
    if (in + plo + phi < ek)
        return dpar__err(DPAR_ERR_SHAPE,
                         "%s: the window spans %lld in %s (size %lld, dilation %lld) but the padded input is %lld "
                         "(%lld + pads %lld, %lld); use a smaller window or more padding",
                         fn, (long long)ek, dim, (long long)k, (long long)dil, (long long)(in + plo + phi),
                         (long long)in, (long long)plo, (long long)phi);
    *out = (in + plo + phi - ek) / s + 1;
    *lo = plo;
    return DPAR_OK;
}
/* Geometry over x [n,h,w,c] for a kh x kw window; s, dl (may be NULL) 0 = 1; mode resolved. */
static dpar_status dpar__win2d_make(const char *fn, const int64_t xs[4], int64_t kh, int64_t kw, const int s[2],
                                    const int dl[2], dpar_padding mode, const int pad[2][2], dpar__win2d *g) {
    if ((int)mode < (int)DPAR_PADDING_DEFAULT || (int)mode > (int)DPAR_PADDING_EXPLICIT)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: padding = %d is not a dpar_padding value", fn, (int)mode);
    for (int i = 0; i < 2; i++) {
        if (s[i] < 0 || (dl && dl[i] < 0))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "%s: stride[%d] = %d, dilation[%d] = %d; use 0 (default 1) or a positive value", fn, i,
                             s[i], i, dl ? dl[i] : 0);
        if (mode == DPAR_PADDING_EXPLICIT && (pad[i][0] < 0 || pad[i][1] < 0))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: pad[%d] = {%d, %d}; explicit pads must be >= 0", fn, i,
                             pad[i][0], pad[i][1]);
    }
    for (int i = 0; i < 4; i++)
        if (xs[i] < 0 || xs[i] > DPAR__MAX_DIM)
            return dpar__err(DPAR_ERR_SHAPE, "%s: dimension %d of x is %lld; sizes are 0..2^40", fn, i,
                             (long long)xs[i]);
    if (kh < 1 || kw < 1 || kh > DPAR__MAX_DIM || kw > DPAR__MAX_DIM)
        return dpar__err(DPAR_ERR_SHAPE, "%s: the window is %lld x %lld; each side must be in 1..2^40", fn,
                         (long long)kh, (long long)kw);
    memset(g, 0, sizeof *g);
    g->n = xs[0], g->h = xs[1], g->w = xs[2], g->c = xs[3], g->o = xs[3];
    g->kh = kh, g->kw = kw;
    g->sh = s[0] ? s[0] : 1, g->sw = s[1] ? s[1] : 1;
    g->dh = dl && dl[0] ? dl[0] : 1, g->dw = dl && dl[1] ? dl[1] : 1;
    dpar_status st = dpar__win_dim(fn, "height", g->h, kh, g->sh, g->dh, mode, pad[0], &g->oh, &g->pt);
    return st ? st : dpar__win_dim(fn, "width", g->w, kw, g->sw, g->dw, mode, pad[1], &g->ow, &g->pl);
}
static dpar_status dpar__conv2d_win(const char *fn, const int64_t xs[4], const int64_t ws[4], const dpar_conv2d_desc *d,
                                    dpar__win2d *g) {
    dpar_conv2d_desc z;
    if (!d) memset(&z, 0, sizeof z), d = &z;
    if (ws[2] != xs[3]) {
        char a[96], b[96];
        return dpar__err(DPAR_ERR_SHAPE,
                         "%s: x %s has %lld channels but the kernel %s takes %lld; kernels are HWIO [KH, KW, C, O]", fn,
                         dpar__shape_str(a, sizeof a, 4, xs), (long long)xs[3], dpar__shape_str(b, sizeof b, 4, ws),
                         (long long)ws[2]);
    }
    if (ws[3] < 0) return dpar__err(DPAR_ERR_SHAPE, "%s: the kernel has %lld outputs", fn, (long long)ws[3]);
    dpar_padding mode = d->padding == DPAR_PADDING_DEFAULT ? DPAR_PADDING_SAME : d->padding;
    dpar_status s = dpar__win2d_make(fn, xs, ws[0], ws[1], d->stride, d->dilation, mode, d->pad, g);
    g->o = ws[3];
    return s;
}
static dpar_status dpar__pool2d_win(const char *fn, const int64_t xs[4], const dpar_pool2d_desc *d, dpar__win2d *g) {
    dpar_pool2d_desc z;
    if (!d) memset(&z, 0, sizeof z), d = &z;
    if (d->window[0] < 0 || d->window[1] < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: window = (%d, %d); use 0 (default 2) or a positive size", fn,
                         d->window[0], d->window[1]);
    int k[2] = { d->window[0] ? d->window[0] : 2, d->window[1] ? d->window[1] : 2 };
    int s[2] = { d->stride[0] ? d->stride[0] : k[0], d->stride[1] ? d->stride[1] : k[1] };
    if (d->stride[0] < 0 || d->stride[1] < 0) s[0] = d->stride[0], s[1] = d->stride[1]; /* reported below */
    dpar_padding mode = d->padding == DPAR_PADDING_DEFAULT ? DPAR_PADDING_VALID : d->padding;
    dpar_status st = dpar__win2d_make(fn, xs, k[0], k[1], s, NULL, mode, d->pad, g);
    g->flags = d->count_exclude_pad ? DPAR__WIN_EXCLUDE_PAD : 0;
    return st;
}
DPAR_API dpar_status dpar_conv2d_output_shape(const int64_t x_shape[4], const int64_t w_shape[4],
                                              const dpar_conv2d_desc *d, int64_t y_shape[4]) {
    dpar__clear_error();
    if (!x_shape || !w_shape || !y_shape)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_conv2d_output_shape: x_shape, w_shape and y_shape are needed");
    dpar__win2d g;
    dpar_status s = dpar__conv2d_win("dpar_conv2d_output_shape", x_shape, w_shape, d, &g);
    if (s) return s;
    y_shape[0] = g.n, y_shape[1] = g.oh, y_shape[2] = g.ow, y_shape[3] = g.o;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_pool2d_output_shape(const int64_t x_shape[4], const dpar_pool2d_desc *d, int64_t y_shape[4]) {
    dpar__clear_error();
    if (!x_shape || !y_shape)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_pool2d_output_shape: x_shape and y_shape are needed");
    dpar__win2d g;
    dpar_status s = dpar__pool2d_win("dpar_pool2d_output_shape", x_shape, d, &g);
    if (s) return s;
    y_shape[0] = g.n, y_shape[1] = g.oh, y_shape[2] = g.ow, y_shape[3] = g.c;
    return DPAR_OK;
}
/* b: a 4-d buffer (dtypes: dpar__same_float) */
static dpar_status dpar__need_4d(const char *fn, const dpar_buffer *b, const char *name, const char *layout) {
    if (b->ndim != 4) {
        char x[160];
        return dpar__err(DPAR_ERR_SHAPE, "%s: %s must be 4-d %s but is %s", fn, name, layout,
                         dpar__shape_str(x, sizeof x, b->ndim, b->shape));
    }
    return DPAR_OK;
}
/* The operand on the output side (y or dy) against the geometry; the written
   buffer dst must not be any of the read operands. */
static dpar_status dpar__win2d_check_out(const char *fn, const dpar_buffer *y, const char *yn, const dpar__win2d *g,
                                         const dpar_buffer *dst, const dpar_buffer *const *ops, int nops) {
    int64_t want[4] = { g->n, g->oh, g->ow, g->o };
    if (memcmp(y->shape, want, sizeof want) != 0) {
        char a[160], b[160];
        return dpar__err(DPAR_ERR_SHAPE,
                         "%s: %s is %s but the input, window and desc give %s; size it with dpar_conv2d_output_shape "
                         "or dpar_pool2d_output_shape",
                         fn, yn, dpar__shape_str(a, sizeof a, 4, y->shape), dpar__shape_str(b, sizeof b, 4, want));
    }
    int uses = 0;
    for (int i = 0; i < nops; i++) uses += ops[i] == dst;
    if (uses) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the output buffer must not alias an input", fn);
    return DPAR_OK;
}
/* b (bias or its gradient): [O] */
static dpar_status dpar__conv2d_bias(const char *fn, const dpar_buffer *b, const char *name, const dpar__win2d *g) {
    if (b->ndim == 1 && b->shape[0] == g->o) return DPAR_OK;
    char a[160];
    return dpar__err(DPAR_ERR_SHAPE, "%s: %s is %s but must be [%lld], one per output channel", fn, name,
                     dpar__shape_str(a, sizeof a, b->ndim, b->shape), (long long)g->o);
}
static dpar_status dpar__conv2d_run(dpar__op_kind k, const dpar__win2d *g, dpar_buffer *dst, const dpar_buffer *s0,
                                    const dpar_buffer *s1, const dpar_buffer *s2) {
    dpar__op op;
    dpar__op_init(&op, k, dst);
    op.src0 = s0;
    op.src1 = s1;
    op.src2 = s2;
    dpar__win2d_put(&op, g);
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_conv2d(dpar_buffer *y, const dpar_buffer *x, const dpar_buffer *w, const dpar_buffer *b,
                                 const dpar_conv2d_desc *d) {
    const char *fn = "dpar_conv2d";
    dpar__clear_error();
    const dpar_buffer *ops[3] = { x, w, b ? b : x }, *fl[4] = { y, x, w, b };
    const char *fln[4] = { "y", "x", "w", "bias" };
    dpar__win2d g;
    dpar_status s = dpar__op_check(fn, y, ops, 3);
    if (s || (s = dpar__same_float64(fn, fl, fln, 4)) || (s = dpar__need_4d(fn, x, "x", "NHWC")) ||
        (s = dpar__need_4d(fn, w, "w", "HWIO")) || (s = dpar__need_4d(fn, y, "y", "NHWC")) ||
        (s = dpar__conv2d_win(fn, x->shape, w->shape, d, &g)) || (s = dpar__win2d_check_out(fn, y, "y", &g, y, ops, 3)))
        return s;
    if (b && (s = dpar__conv2d_bias(fn, b, "bias", &g))) return s;
    return dpar__conv2d_run(DPAR__OP_CONV2D, &g, y, x, w, b);
}
DPAR_API dpar_status dpar_conv2d_backward_input(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *w,
                                                const dpar_conv2d_desc *d) {
    const char *fn = "dpar_conv2d_backward_input";
    dpar__clear_error();
    const dpar_buffer *ops[2] = { dy, w }, *fl[3] = { dx, dy, w };
    const char *fln[3] = { "dx", "dy", "w" };
    dpar__win2d g;
    dpar_status s = dpar__op_check(fn, dx, ops, 2);
    if (s || (s = dpar__same_float64(fn, fl, fln, 3)) || (s = dpar__need_4d(fn, dx, "dx", "NHWC")) ||
        (s = dpar__need_4d(fn, w, "w", "HWIO")) || (s = dpar__need_4d(fn, dy, "dy", "NHWC")) ||
        (s = dpar__conv2d_win(fn, dx->shape, w->shape, d, &g)) ||
        (s = dpar__win2d_check_out(fn, dy, "dy", &g, dx, ops, 2)))
        return s;
    return dpar__conv2d_run(DPAR__OP_CONV2D_BWD_INPUT, &g, dx, dy, w, NULL);
}
DPAR_API dpar_status dpar_conv2d_backward_kernel(dpar_buffer *dw, dpar_buffer *db, const dpar_buffer *x,
                                                 const dpar_buffer *dy, const dpar_conv2d_desc *d) {
    const char *fn = "dpar_conv2d_backward_kernel";
    dpar__clear_error();
    const dpar_buffer *ops[2] = { x, dy }, *fl[4] = { dw, x, dy, db };
    const char *fln[4] = { "dw", "x", "dy", "db" };
    dpar__win2d g;
    dpar_status s = dpar__op_check(fn, dw, ops, 2);
    if (s || (s = dpar__same_float64(fn, fl, fln, 4)) || (s = dpar__need_4d(fn, dw, "dw", "HWIO")) ||
        (s = dpar__need_4d(fn, x, "x", "NHWC")) || (s = dpar__need_4d(fn, dy, "dy", "NHWC")) ||
        (s = dpar__conv2d_win(fn, x->shape, dw->shape, d, &g)) ||
        (s = dpar__win2d_check_out(fn, dy, "dy", &g, dw, ops, 2)))
        return s;
    const dpar_buffer *dbc = db;
    if (db && ((s = dpar__op_check(fn, dw, &dbc, 1)) || (s = dpar__conv2d_bias(fn, db, "db", &g)))) return s;
    if (db && (db == dw || (const dpar_buffer *)db == x || (const dpar_buffer *)db == dy))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: db must not alias dw, x or dy", fn);
    if ((s = dpar__conv2d_run(DPAR__OP_CONV2D_BWD_KERNEL, &g, dw, dy, x, NULL)) || !db) return s;
    return dpar_bias_grad(db, dy, 0.0f);
}
/* The pools: dst is written; `in` (x or dx) and `out` (y or dy) give the
   geometry; src0 and src1 (may be NULL) are what the op reads. */
static dpar_status dpar__pool2d_op(const char *fn, dpar__op_kind k, dpar_buffer *dst, const dpar_buffer *in,
                                   const char *inn, const dpar_buffer *out, const char *outn, const dpar_buffer *src0,
                                   const dpar_buffer *src1, const dpar_pool2d_desc *d) {
    dpar__clear_error();
    const dpar_buffer *ops[2] = { src0, src1 ? src1 : src0 }, *fl[3] = { dst, src0, src1 };
    const char *fln[3] = { dst == in ? inn : outn, dst == in ? outn : inn, "x" };
    dpar__win2d g;
    dpar_status s = dpar__op_check(fn, dst, ops, 2);
    if (s || (s = dpar__same_float64(fn, fl, fln, 3)) || (s = dpar__need_4d(fn, in, inn, "NHWC")) ||
        (s = dpar__need_4d(fn, out, outn, "NHWC")) ||
        (src1 && ((s = dpar__need_4d(fn, src1, "x", "NHWC")) || (s = dpar__same_shape(fn, src1, "x", in, inn)))) ||
        (s = dpar__pool2d_win(fn, in->shape, d, &g)) || (s = dpar__win2d_check_out(fn, out, outn, &g, dst, ops, 2)))
        return s;
    return dpar__conv2d_run(k, &g, dst, src0, src1, NULL);
}
DPAR_API dpar_status dpar_avg_pool2d(dpar_buffer *y, const dpar_buffer *x, const dpar_pool2d_desc *d) {
    return dpar__pool2d_op("dpar_avg_pool2d", DPAR__OP_AVG_POOL, y, x, "x", y, "y", x, NULL, d);
}
DPAR_API dpar_status dpar_avg_pool2d_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_pool2d_desc *d) {
    return dpar__pool2d_op("dpar_avg_pool2d_backward", DPAR__OP_AVG_POOL_BWD, dx, dx, "dx", dy, "dy", dy, NULL, d);
}
DPAR_API dpar_status dpar_max_pool2d(dpar_buffer *y, const dpar_buffer *x, const dpar_pool2d_desc *d) {
    return dpar__pool2d_op("dpar_max_pool2d", DPAR__OP_MAX_POOL, y, x, "x", y, "y", x, NULL, d);
}
DPAR_API dpar_status dpar_max_pool2d_backward(dpar_buffer *dx, const dpar_buffer *dy, const dpar_buffer *x,
                                              const dpar_pool2d_desc *d) {
    return dpar__pool2d_op("dpar_max_pool2d_backward", DPAR__OP_MAX_POOL_BWD, dx, dx, "dx", dy, "dy", dy, x, d);
}

/* ---------------------------------------------------------------------------
   SGD
   ------------------------------------------------------------------------ */
/* the ranges of the fields that SGD and AdamW share, checked last in both */
static dpar_status dpar__decay_clip_check(const char *fn, float weight_decay, float clip_norm) {
    if (!(weight_decay >= 0.0f) || !isfinite(weight_decay))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: weight_decay = %g; it must be >= 0", fn, (double)weight_decay);
    if (!(clip_norm >= 0.0f) || !isfinite(clip_norm))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: clip_norm = %g; use 0 (off) or a positive norm", fn,
                         (double)clip_norm);
    return DPAR_OK;
}
static dpar_status dpar__sgd_check(const char *fn, const dpar_sgd_desc *d) {
    if (!d) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    if (!(d->learning_rate >= 0.0f) || !isfinite(d->learning_rate)) /* 0: a warm-up's first step */
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: learning_rate = %g; it must be a finite number >= 0", fn,
                         (double)d->learning_rate);
    if (!(d->momentum >= 0.0f && d->momentum < 1.0f))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: momentum = %g; it must be in [0, 1)", fn, (double)d->momentum);
    if (d->nesterov && d->momentum == 0.0f)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: nesterov needs momentum > 0", fn);
    return dpar__decay_clip_check(fn, d->weight_decay, d->clip_norm);
}
DPAR_API dpar_status dpar_sgd_check(const dpar_sgd_desc *d) {
    dpar__clear_error();
    return dpar__sgd_check("dpar_sgd_check", d);
}
/* the buffer checks of one update (dpar_sgd_step runs them for every buffer first) */
static dpar_status dpar__sgd_check_bufs(const char *fn, const dpar_sgd_desc *d, const dpar_buffer *param,
                                        const dpar_buffer *grad, const dpar_buffer *mom) {
    dpar_status s;
    const dpar_buffer *ops[2] = { grad, mom ? mom : grad };
    if ((s = dpar__op_check(fn, param, ops, 2))) return s;
    dpar_dtype t = dpar__fdt(param); /* f32, or f64 throughout (>>f64 api) */
    if ((s = dpar__need_ft(fn, param, "param", t)) || (s = dpar__need_ft(fn, grad, "grad", t)) ||
        (s = dpar__same_count(fn, param, "param", grad, "grad")))
        return s;
    if (d->momentum > 0.0f) {
        if (!mom)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: momentum = %g but no momentum buffer was given", fn,
                             (double)d->momentum);
        if ((s = dpar__need_ft(fn, mom, "momentum", t)) || (s = dpar__same_count(fn, param, "param", mom, "momentum")))
            return s;
        if (mom == param || mom == grad)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the momentum buffer must not alias param or grad", fn);
    }
    if (grad == param) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: grad must not alias param", fn);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_sgd_update(const dpar_sgd_desc *d, dpar_buffer *param, const dpar_buffer *grad,
                                     dpar_buffer *mom, float clip_scale) {
    dpar__clear_error();
    dpar_status s = dpar__sgd_check("dpar_sgd_update", d);
    if (s || (s = dpar__sgd_check_bufs("dpar_sgd_update", d, param, grad, mom))) return s;
    if (!isfinite(clip_scale) || clip_scale < 0.0f)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_sgd_update: clip_scale = %g is not a finite scale >= 0",
                         (double)clip_scale);
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_SGD, param);
    op.dst2 = d->momentum > 0.0f ? mom : NULL;
    op.src0 = grad;
    op.f[0] = d->learning_rate;
    op.f[1] = d->momentum;
    op.f[2] = d->weight_decay;
    op.f[3] = clip_scale;
    op.nesterov = d->nesterov;
    return dpar__op_run(&op);
}
/* The clip's scratch on ctx's device (slot DPAR__NORM_*), at least count
   elements, and for DPAR__NORM_SQ its host copy: kept by the device's worker
   from one step to the next, so a steady clipped step allocates and frees
   nothing (a CUDA cuMemFree waits for the whole device). It grows (the old
   one freed) when a call needs more and goes with the runtime's other
   buffers. Only the device's own worker runs its dispatches: no lock. */
enum { DPAR__NORM_SQ, DPAR__NORM_F64, DPAR__NORM_TOT }; /* f32 [n] per-gradient sums, f64 [1], f32 [1] psum'd total */
static dpar_status dpar__norm_scratch(const char *fn, dpar_ctx *ctx, int slot, int64_t count, dpar_buffer **out) {
    dpar__worker *w = &ctx->rt->workers[ctx->device - ctx->rt->local_base];
    dpar_buffer **b = &w->norms[slot];
    *out = *b;
    if (*b && (*b)->count >= count) return DPAR_OK;
    dpar_status s = *b ? dpar_buffer_destroy(*b) : DPAR_OK;
    if (s) return s;
    *out = *b = NULL;
    if (slot == DPAR__NORM_SQ) {
        DPAR_FREE(w->norms_host);
        if (!(w->norms_host = (float *)DPAR_MALLOC((size_t)count * sizeof(float))))
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory (%lld gradient norms)", fn,
                             (long long)count);
    }
    s = dpar_buffer_create(ctx->rt, ctx->device, slot == DPAR__NORM_F64 ? DPAR_F64 : DPAR_F32, 1, &count, b);
    *out = *b;
    return s;
}
/* Every f32 gradient's sum of squares into its element of ctx's scratch,
   read once into *sq (the worker's host copy, n floats): a read waits for the
   device, and one per gradient left it idle between each of the ~70 small
   reductions of the GPT's step. f64 gradients are left to dpar__norms_total. */
static dpar_status dpar__norms_read(const char *fn, dpar_ctx *ctx, dpar_buffer *const *grads, int n, float **sq) {
    dpar_buffer *tmp = NULL;
    bool any32 = false;
    dpar_status s = dpar__ctx_check(ctx, fn);
    if (!s) s = dpar__norm_scratch(fn, ctx, DPAR__NORM_SQ, n > 0 ? n : 1, &tmp);
    if (s) return s;
    *sq = ctx->rt->workers[ctx->device - ctx->rt->local_base].norms_host;
    for (int i = 0; i < n && !s; i++) {
        if (grads[i] && !dpar__live_buf(grads[i], fn, "grads[i]") && grads[i]->dtype == DPAR_F64) continue;
        s = dpar__reduce_op("dpar_sum_squares", DPAR__OP_SUMSQ, tmp, i, grads[i]);
        any32 = true;
    }
    return !s && any32 ? dpar_buffer_read(tmp, 0, *sq, (size_t)n * sizeof(float)) : s;
}
/* The squared global norm of n gradients (sq: their f32 sums of squares from
   dpar__norms_read) psum'd over axes when set: the host adds them in gradient
   order in double (f64 gradients summed here: >>f64 api). */
static dpar_status dpar__norms_total(const char *fn, dpar_ctx *ctx, const char *axes, dpar_buffer *const *grads, int n,
                                     const float *sq, double *out) {
    dpar_buffer *tmp64 = NULL; /* the f64 gradients' sums */
    double total = 0.0;
    dpar_status s = DPAR_OK;
    for (int i = 0; i < n && !s; i++) {
        double v64 = 0.0;
        if (grads[i]->dtype != DPAR_F64) {
            total += (double)sq[i];
            continue;
        }
        if (!tmp64) s = dpar__norm_scratch(fn, ctx, DPAR__NORM_F64, 1, &tmp64);
        if (!s) s = dpar_sum_squares(tmp64, grads[i]);
        if (!s) s = dpar_buffer_read(tmp64, 0, &v64, 8);
        total += v64;
    }
    if (!s && axes && *axes && tmp64) { /* the f64 total psum'd in double */
        s = dpar_buffer_write(tmp64, 0, &total, 8);
        if (!s) s = dpar_psum(ctx, tmp64, tmp64, axes);
        if (!s) s = dpar_buffer_read(tmp64, 0, &total, 8);
    } else if (!s && axes && *axes) { /* the f32 total psum'd as a 1-element f32 buffer */
        float v = (float)total;
        dpar_buffer *tot = NULL;
        s = dpar__norm_scratch(fn, ctx, DPAR__NORM_TOT, 1, &tot);
        if (!s) s = dpar_buffer_write(tot, 0, &v, 4);
        if (!s) s = dpar_psum(ctx, tot, tot, axes);
        if (!s) s = dpar_buffer_read(tot, 0, &v, 4);
        total = (double)v;
    }
    *out = total;
    return s;
}
/* The norm of a squared total, refused when it is not finite (fn names the caller). */
static dpar_status dpar__norm_of(const char *fn, double total, float *norm) {
    *norm = (float)sqrt(total);
    if (isfinite(*norm)) return DPAR_OK;
    return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                     "%s: the global gradient norm is %g: the gradients hold NaN or Inf "
                     "(lower the learning rate or check the loss); no parameter was changed",
                     fn, (double)*norm);
}
/* the global norm of n gradient buffers of ctx's device (psum'd over axes
   when set) and the clip factor for clip_norm (0: off -> 1); fn names the caller. */
static dpar_status dpar__clip_scale(const char *fn, dpar_ctx *ctx, float clip_norm, const char *axes,
                                    dpar_buffer *const *grads, int n, float *scale, float *norm_out) {
    float *sq = NULL, norm = 0.0f;
    double total = 0.0;
    dpar_status s = dpar__norms_read(fn, ctx, grads, n, &sq);
    if (!s) s = dpar__norms_total(fn, ctx, axes, grads, n, sq, &total);
    if (s) return s;
    s = dpar__norm_of(fn, total, &norm);
    if (norm_out) *norm_out = norm;
    if (s) return s;
    *scale = (clip_norm > 0.0f && !(norm < clip_norm)) ? clip_norm / norm : 1.0f;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_sgd_clip_scale(dpar_ctx *ctx, const dpar_sgd_desc *d, dpar_buffer *const *grads, int n,
                                         float *scale, float *norm_out) {
    dpar__clear_error();
    if (!ctx || !scale || (n > 0 && !grads) || n < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_sgd_clip_scale: NULL or invalid argument");
    dpar_status s = dpar__sgd_check("dpar_sgd_clip_scale", d);
    if (s) return s;
    return dpar__clip_scale("dpar_sgd_clip_scale", ctx, d->clip_norm, d->norm_axes, grads, n, scale, norm_out);
}
DPAR_API dpar_status dpar_sgd_step(dpar_ctx *ctx, const dpar_sgd_desc *d, dpar_buffer *const *params,
                                   dpar_buffer *const *grads, dpar_buffer *const *moms, int n) {
    dpar__clear_error();
    dpar_status s = dpar__sgd_check("dpar_sgd_step", d);
    if (s) return s;
    if (n < 0) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_sgd_step: n = %d parameters; it must be >= 0", n);
    if (n > 0 && (!params || !grads))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_sgd_step: params or grads is NULL");
    /* every buffer is checked before any is updated: a failed step changes nothing */
    for (int i = 0; i < n; i++)
        if ((s = dpar__sgd_check_bufs("dpar_sgd_step", d, params[i], grads[i], moms ? moms[i] : NULL))) return s;
    float scale = 1.0f;
    if (d->clip_norm > 0.0f) {
        s = dpar_sgd_clip_scale(ctx, d, grads, n, &scale, NULL);
        if (s) return s;
    }
    for (int i = 0; i < n; i++) {
        s = dpar_sgd_update(d, params[i], grads[i], moms ? moms[i] : NULL, scale);
        if (s) return s;
    }
    return DPAR_OK;
}

/* >>layers-norm-attn =========================================================
   layer_norm / rms_norm, batched matmul, causal attention: checks, then one op
   record each (the CPU reference is in >>cpu norm-attn, Vulkan in
   shaders/layernorm*.comp + attention*.comp, CUDA in kernels/norm_attn.cu). */
/* Rows of x [..., N]: the product of its leading dims (also when N = 0, where count / N cannot
   give it), capped above 2^40 so that dims of 2^40 each cannot overflow it. */
static int64_t dpar__norm_rows(const dpar_buffer *x) {
    int64_t m = 1;
    for (int i = 0; i + 1 < x->ndim && m > 0; i++)
        m = x->shape[i] && m > DPAR__MAX_DIM / x->shape[i] ? DPAR__MAX_DIM + 1 : m * x->shape[i];
    return m;
}
static dpar_status dpar__stats_count(const char *fn, const dpar_buffer *st, int64_t rows, const char *what) {
    if (!st || st->count == 2 * rows) return DPAR_OK;
    char a[160];
    return dpar__err(DPAR_ERR_SHAPE, "%s: stats %s has %lld elements but %s needs 2 per row (%lld); shape it [..., 2]",
                     fn, dpar__shape_str(a, sizeof a, st->ndim, st->shape), (long long)st->count, what,
                     (long long)(2 * rows));
}
static dpar_status dpar__norm_fwd(const char *fn, int rms, dpar_buffer *y, dpar_buffer *stats, const dpar_buffer *x,
                                  const dpar_buffer *w, const dpar_buffer *b, float eps) {
    dpar__clear_error();
    if (!x) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: x is NULL", fn);
    const dpar_buffer *ops[4] = { x, w ? w : x, b ? b : x, stats ? stats : x };
    const dpar_buffer *fl[4] = { y, x, w, b };
    const char *names[4] = { "y", "x", "w", "b" };
    dpar_status s = dpar__op_check(fn, y, ops, 4);
    if (s || (s = dpar__same_float64(fn, fl, names, 4)) ||
        (stats && (s = dpar__need_ft(fn, stats, "stats", dpar__fdt(x)))) || (s = dpar__same_shape(fn, y, "y", x, "x")))
        return s;
    if (x->ndim < 1) return dpar__err(DPAR_ERR_SHAPE, "%s: x is a scalar; it needs a last axis to normalize", fn);
    if ((s = dpar__last_dim_vec(fn, w, "w", x, "x")) || (s = dpar__last_dim_vec(fn, b, "b", x, "x"))) return s;
    int64_t n = x->shape[x->ndim - 1], m = dpar__norm_rows(x);
    if ((s = dpar__stats_count(fn, stats, m, "x"))) return s;
    if (!(eps > 0.0f) || !isfinite(eps))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: eps = %g; it must be a finite number > 0 (1e-5 is usual)", fn,
                         (double)eps);
    if (stats == y || stats == x) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: stats must not alias x or y", fn);
    if (n == 0) return stats ? dpar_fill(stats, 0.0f) : DPAR_OK; /* empty rows: y is empty, stats zeros */
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_NORM, y);
    op.dst2 = stats;
    op.src0 = x;
    op.src1 = w;
    op.src2 = b;
    op.m = m;
    op.n = n;
    op.f[0] = eps;
    op.p[0] = rms;
    return dpar__op_run(&op);
}
static dpar_status dpar__norm_bwd(const char *fn, int rms, dpar_buffer *dx, dpar_buffer *dw, dpar_buffer *db,
                                  const dpar_buffer *dy, const dpar_buffer *x, const dpar_buffer *w,
                                  const dpar_buffer *stats) {
    dpar__clear_error();
    if (!dy || !x || !stats) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dy, x or stats is NULL", fn);
    if (!dx && !dw && !db) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dx, dw and db are all NULL", fn);
    dpar_buffer *first = dx ? dx : dw ? dw : db; /* the op's dst: dx, else a parameter gradient (p[1] = 1) */
    const dpar_buffer *ops[6] = { dy, x, stats, w ? w : x, dw ? dw : x, db ? db : x };
    const dpar_buffer *fl[6] = { dx, dw, db, dy, x, w };
    const char *names[6] = { "dx", "dw", "db", "dy", "x", "w" };
    dpar_status s = dpar__op_check(fn, first, ops, 6);
    if (s || (s = dpar__same_float64(fn, fl, names, 6)) || (s = dpar__need_ft(fn, stats, "stats", dpar__fdt(x))) ||
        (dx && (s = dpar__same_shape(fn, dx, "dx", x, "x"))) || (s = dpar__same_shape(fn, dy, "dy", x, "x")))
        return s;
    if (x->ndim < 1) return dpar__err(DPAR_ERR_SHAPE, "%s: x is a scalar; it needs a last axis to normalize", fn);
    if ((s = dpar__last_dim_vec(fn, w, "w", x, "x")) || (s = dpar__last_dim_vec(fn, dw, "dw", x, "x")) ||
        (s = dpar__last_dim_vec(fn, db, "db", x, "x")))
        return s;
    int64_t n = x->shape[x->ndim - 1], m = dpar__norm_rows(x);
    if ((s = dpar__stats_count(fn, stats, m, "x"))) return s;
    if ((dx && dx == x) || (dw && (dw == dx || dw == db || dw == dy)) || (db && (db == dx || db == dy)))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dx must not alias x, nor dw/db any other operand", fn);
    if (n == 0) return DPAR_OK; /* dx, dw and db are all empty */
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_NORM_BWD, first);
    op.p[1] = dx ? 0 : 1;
    op.dst2 = dw;
    op.dst3 = db;
    op.src0 = dy;
    op.src1 = x;
    op.src2 = w;
    op.src3 = stats;
    op.m = m;
    op.n = n;
    op.p[0] = rms;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_layer_norm(dpar_buffer *y, dpar_buffer *stats, const dpar_buffer *x, const dpar_buffer *w,
                                     const dpar_buffer *b, float eps) {
    return dpar__norm_fwd("dpar_layer_norm", 0, y, stats, x, w, b, eps);
}
DPAR_API dpar_status dpar_rms_norm(dpar_buffer *y, dpar_buffer *stats, const dpar_buffer *x, const dpar_buffer *w,
                                   const dpar_buffer *b, float eps) {
    return dpar__norm_fwd("dpar_rms_norm", 1, y, stats, x, w, b, eps);
}
DPAR_API dpar_status dpar_layer_norm_backward(dpar_buffer *dx, dpar_buffer *dw, dpar_buffer *db, const dpar_buffer *dy,
                                              const dpar_buffer *x, const dpar_buffer *w, const dpar_buffer *stats) {
    return dpar__norm_bwd("dpar_layer_norm_backward", 0, dx, dw, db, dy, x, w, stats);
}
DPAR_API dpar_status dpar_rms_norm_backward(dpar_buffer *dx, dpar_buffer *dw, dpar_buffer *db, const dpar_buffer *dy,
                                            const dpar_buffer *x, const dpar_buffer *w, const dpar_buffer *stats) {
    return dpar__norm_bwd("dpar_rms_norm_backward", 1, dx, dw, db, dy, x, w, stats);
}

/* the batch count of b's leading dims (all but the last two) */
static int64_t dpar__batch_of(const dpar_buffer *b) {
    int64_t n = 1;
    for (int i = 0; i + 2 < b->ndim; i++) n *= b->shape[i];
    return n;
}
DPAR_API dpar_status dpar_matmul_batched(dpar_buffer *C, const dpar_buffer *A, const dpar_buffer *B, bool ta, bool tb,
                                         float alpha, float beta) {
    const char *fn = "dpar_matmul_batched";
    dpar__clear_error();
    const dpar_buffer *ops[2] = { A, B };
    const char *names[3] = { "C", "A", "B" };
    const dpar_buffer *f32[3] = { C, A, B };
    dpar_status s = dpar__op_check(fn, C, ops, 2);
    dpar_dtype t = s ? DPAR_F32 : dpar__fdt(C); /* f32, or f64 throughout (>>f64 api) */
    for (int i = 0; i < 3 && !s; i++) s = dpar__need_ft(fn, f32[i], names[i], t);
    if (s) return s;
    char a[160], b[160], c[160];
    int ok = A->ndim >= 2 && B->ndim >= 2 && C->ndim == A->ndim;
    int64_t nb = ok ? dpar__batch_of(A) : 0, M = 0, K = 0, K2 = 0, N = 0;
    if (ok) {
        M = A->shape[A->ndim - (ta ? 1 : 2)], K = A->shape[A->ndim - (ta ? 2 : 1)];
        K2 = B->shape[B->ndim - (tb ? 1 : 2)], N = B->shape[B->ndim - (tb ? 2 : 1)];
        ok = K == K2 && C->shape[C->ndim - 2] == M && C->shape[C->ndim - 1] == N && dpar__batch_of(C) == nb &&
             (B->ndim == 2 || dpar__batch_of(B) == nb);
        for (int i = 0; ok && i + 2 < A->ndim; i++) ok = A->shape[i] == C->shape[i];
    }
    if (!ok)
        return dpar__err(DPAR_ERR_SHAPE,
                         "%s: A %s%s, B %s%s, C %s; need A [..., M, K] @ B [..., K, N] (or 2-d B) = C [..., M, N] "
                         "with A's and C's leading dims equal",
                         fn, dpar__shape_str(a, sizeof a, A->ndim, A->shape), ta ? " transposed" : "",
                         dpar__shape_str(b, sizeof b, B->ndim, B->shape), tb ? " transposed" : "",
                         dpar__shape_str(c, sizeof c, C->ndim, C->shape));
    if (C == A || C == B) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: C must not alias A or B", fn);
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_MATMUL_BATCHED, C);
    op.src0 = A;
    op.src1 = B;
    op.m = M;
    op.n = N;
    op.k = K;
    op.trans_a = ta;
    op.trans_b = tb;
    op.f[0] = alpha;
    op.f[1] = beta;
    op.p[0] = nb;
    op.p[1] = M * K; /* batch strides in elements: A, B (0: shared), C */
    op.p[2] = B->ndim == 2 ? 0 : K * N;
    op.p[3] = M * N;
    return dpar__op_run(&op);
}

/* q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv], out [..., Tq, Dv] -> op.p geometry */
static dpar_status dpar__attn_check(const char *fn, dpar__op *op, const dpar_buffer *out, const dpar_buffer *q,
                                    const dpar_buffer *k, const dpar_buffer *v, const dpar_buffer *stats, float scale,
                                    bool causal) {
    char sq[160], sk[160], sv[160], so[160];
    int ok = q->ndim >= 2 && k->ndim == q->ndim && v->ndim == q->ndim && out->ndim == q->ndim;
    for (int i = 0; ok && i + 2 < q->ndim; i++)
        ok = k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i] && out->shape[i] == q->shape[i];
    int r = q->ndim;
    int64_t tq = ok ? q->shape[r - 2] : 0, d = ok ? q->shape[r - 1] : 0, tk = ok ? k->shape[r - 2] : 0;
    int64_t dv = ok ? v->shape[r - 1] : 0;
    ok = ok && k->shape[r - 1] == d && v->shape[r - 2] == tk && out->shape[r - 2] == tq && out->shape[r - 1] == dv;
    if (!ok)
        return dpar__err(
            DPAR_ERR_SHAPE,
            "%s: q %s, k %s, v %s, out %s; need q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv], "
            "out [..., Tq, Dv] with equal leading dims",
            fn, dpar__shape_str(sq, sizeof sq, q->ndim, q->shape), dpar__shape_str(sk, sizeof sk, k->ndim, k->shape),
            dpar__shape_str(sv, sizeof sv, v->ndim, v->shape), dpar__shape_str(so, sizeof so, out->ndim, out->shape));
    if (causal && tq != tk)
        return dpar__err(DPAR_ERR_SHAPE, "%s: causal attention needs as many queries as keys (Tq %lld, Tk %lld)", fn,
                         (long long)tq, (long long)tk);
    dpar_status s = dpar__stats_count(fn, stats, dpar__batch_of(q) * tq, "q");
    if (s) return s;
    if (!(scale >= 0.0f) || !isfinite(scale))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: scale = %g; use 0 (1/sqrt(D)) or a finite number > 0", fn,
                         (double)scale);
    op->p[0] = dpar__batch_of(q);
    op->p[1] = tq;
    op->p[2] = tk;
    op->p[3] = d;
    op->p[4] = dv;
    op->p[5] = causal ? 1 : 0;
    op->f[0] = scale > 0.0f ? scale : (d > 0 ? (float)(1.0 / sqrt((double)d)) : 1.0f);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_attention(dpar_buffer *out, dpar_buffer *stats, const dpar_buffer *q, const dpar_buffer *k,
                                    const dpar_buffer *v, float scale, bool causal) {
    const char *fn = "dpar_attention";
    dpar__clear_error();
    const dpar_buffer *ops[4] = { q, k, v, stats ? stats : q };
    const dpar_buffer *fl[4] = { out, q, k, v };
    const char *names[4] = { "out", "q", "k", "v" };
    dpar_status s = dpar__op_check(fn, out, ops, 4);
    if (s || (s = dpar__same_float64(fn, fl, names, 4)) ||
        (stats && (s = dpar__need_ft(fn, stats, "stats", dpar__fdt(out))))) /* stats f64 with an f64 out */
        return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_ATTN, out);
    if ((s = dpar__attn_check(fn, &op, out, q, k, v, stats, scale, causal))) return s;
    if (out == q || out == k || out == v || (stats && (stats == out || stats == q || stats == k || stats == v)))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: out and stats must not alias q, k, v or each other", fn);
    op.dst2 = stats;
    op.src0 = q;
    op.src1 = k;
    op.src2 = v;
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_attention_backward(dpar_buffer *dq, dpar_buffer *dk, dpar_buffer *dv, dpar_buffer *stats,
                                             const dpar_buffer *dout, const dpar_buffer *q, const dpar_buffer *k,
                                             const dpar_buffer *v, float scale, bool causal) {
    const char *fn = "dpar_attention_backward";
    dpar__clear_error();
    if (!stats) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: stats is NULL; pass the forward's stats", fn);
    if (!dq && !dk && !dv) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dq, dk and dv are all NULL", fn);
    const dpar_buffer *ops[7] = { dout, q, k, v, dq ? dq : stats, dk ? dk : stats, dv ? dv : stats };
    const dpar_buffer *fl[7] = { dq, dk, dv, dout, q, k, v };
    const char *names[7] = { "dq", "dk", "dv", "dout", "q", "k", "v" };
    dpar_status s = dpar__op_check(fn, stats, ops, 7);
    if (s || (s = dpar__same_float64(fn, fl, names, 7)) ||
        (s = dpar__need_ft(fn, stats, "stats",
                           dpar__fdt(dq   ? dq
                                     : dk ? dk
                                          : dv)))) /* stats f64 with f64 grads */
        return s;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_ATTN_BWD_Q, stats);
    if ((s = dpar__attn_check(fn, &op, dout, q, k, v, stats, scale, causal)) ||
        (dq && (s = dpar__same_shape(fn, dq, "dq", q, "q"))) || (dk && (s = dpar__same_shape(fn, dk, "dk", k, "k"))) ||
        (dv && (s = dpar__same_shape(fn, dv, "dv", v, "v"))))
        return s;
    const dpar_buffer *ins[5] = { dout, q, k, v, stats };
    for (int i = 0; i < 5; i++)
        if ((dq && dq == ins[i]) || (dk && dk == ins[i]) || (dv && dv == ins[i]) || (dq && (dq == dk || dq == dv)) ||
            (dk && dk == dv))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: dq, dk, dv must not alias each other or an input", fn);
    op.dst2 = dq; /* pass 1, over query rows: D_i into stats[.., 1], dq */
    op.src0 = dout;
    op.src1 = q;
    op.src2 = k;
    op.src3 = v;
    /* a pass 2 that computes D and dq itself (the same bits) needs no pass 1 unless dq is all there is:
       P and dP once, not once a pass */
    bool one = stats->rt->be->attn_kv_computes_d;
    if ((!one || (dq && !dk && !dv)) && (s = dpar__op_run(&op))) return s;
    if (!dk && !dv) return DPAR_OK;
    op.kind = DPAR__OP_ATTN_BWD_KV; /* pass 2, over key rows: dk, dv (and dq) */
    op.dst2 = dk;
    op.dst3 = dv;
    op.dst4 = one ? dq : NULL;
    return dpar__op_run(&op);
}

/* >>optim ====================================================================
   AdamW, learning-rate schedules, loss scaling, cross-entropy with an ignore
   label, embedding, dropout: argument checks and op records (the kernels are
   in each backend). */
/* The error of an index out of range, for every backend: fn from dpar__idx_fn,
   pos the first bad position, value its index, bound the number of classes/rows. */
static dpar_status dpar__bad_index(int fn, int64_t pos, int32_t value, int64_t bound) {
    int lab = fn == DPAR__IDX_SOFTMAX_XENT || fn == DPAR__IDX_XENT;
    if (bound <= 0) /* no index is valid: the data is fine, the table or the class axis is empty */
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: %s[%lld] = %d indexes %s; give it at least one%s",
                         dpar__idx_fn[fn >= 0 && fn < 4 ? fn : 1], lab ? "labels" : "idx", (long long)pos, (int)value,
                         lab ? "logits with 0 classes" : "a table of 0 rows",
                         fn == DPAR__IDX_XENT ? ", or mark the row with dpar_xent_desc.ignore_label" : "");
    return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                     "%s: %s[%lld] = %d is outside 0..%lld%s (first bad position); fix the data%s",
                     dpar__idx_fn[fn >= 0 && fn < 4 ? fn : 1], lab ? "labels" : "idx", (long long)pos, (int)value,
                     (long long)bound - 1, fn == DPAR__IDX_XENT ? " and is not the ignore label" : "",
                     lab ? " or mark padding with dpar_xent_desc.ignore_label" : "");
}
/* first position of idx[0..n) outside 0..bound-1 (ignore skipped when use_ignore), or -1 */
static int64_t dpar__first_bad_index(const int32_t *idx, int64_t n, int64_t bound, int use_ignore, int32_t ignore) {
    for (int64_t i = 0; i < n; i++)
        if ((idx[i] < 0 || idx[i] >= bound) && !(use_ignore && idx[i] == ignore)) return i;
    return -1;
}

/* zero fields -> optax's defaults; then the ranges */
static dpar_status dpar__adamw_resolve(const char *fn, const dpar_adamw_desc *d, dpar_adamw_desc *r) {
    if (!d) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    *r = *d;
    if (r->b1 == 0.0f) r->b1 = 0.9f;
    if (r->b2 == 0.0f) r->b2 = 0.999f;
    if (r->eps == 0.0f) r->eps = 1e-8f;
    if (!(r->learning_rate >= 0.0f) || !isfinite(r->learning_rate)) /* 0: a warm-up's first step */
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: learning_rate = %g; it must be a finite number >= 0", fn,
                         (double)r->learning_rate);
    if (!(r->b1 > 0.0f && r->b1 < 1.0f) || !(r->b2 > 0.0f && r->b2 < 1.0f))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: b1 = %g, b2 = %g; both must be in (0, 1) (0: default)", fn,
                         (double)r->b1, (double)r->b2);
    if (!(r->eps > 0.0f) || !isfinite(r->eps))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: eps = %g; it must be a finite number > 0", fn, (double)r->eps);
    return dpar__decay_clip_check(fn, r->weight_decay, r->clip_norm);
}
DPAR_API dpar_status dpar_adamw_check(const dpar_adamw_desc *d) {
    dpar__clear_error();
    dpar_adamw_desc r;
    return dpar__adamw_resolve("dpar_adamw_check", d, &r);
}
static dpar_status dpar__adamw_check_bufs(const char *fn, const dpar_buffer *param, const dpar_buffer *grad,
                                          const dpar_buffer *m, const dpar_buffer *v) {
    dpar_status s;
    const dpar_buffer *ops[3] = { grad, m, v };
    if ((s = dpar__op_check(fn, param, ops, 3))) return s;
    dpar_dtype t = dpar__fdt(param); /* f32, or f64 throughout (>>f64 api) */
    if ((s = dpar__need_ft(fn, param, "param", t)) || (s = dpar__need_ft(fn, grad, "grad", t)) ||
        (s = dpar__need_ft(fn, m, "m", t)) || (s = dpar__need_ft(fn, v, "v", t)) ||
        (s = dpar__same_count(fn, param, "param", grad, "grad")) ||
        (s = dpar__same_count(fn, param, "param", m, "m")) || (s = dpar__same_count(fn, param, "param", v, "v")))
        return s;
    if (grad == param || m == param || v == param || m == grad || v == grad || m == v)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: param, grad, m and v must be four distinct buffers", fn);
    return DPAR_OK;
}
static dpar_status dpar__adamw_run(const dpar_adamw_desc *r, dpar_buffer *param, const dpar_buffer *grad,
                                   dpar_buffer *m, dpar_buffer *v, int64_t step, float clip_scale) {
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_ADAMW, param);
    op.dst2 = m;
    op.dst3 = v;
    op.src0 = grad;
    op.f[0] = r->learning_rate;
    op.f[1] = r->b1;
    op.f[2] = r->b2;
    op.f[3] = r->eps;
    op.f[4] = r->weight_decay;
    op.f[5] = clip_scale;
    /* bias corrections in double, rounded once: the same on every backend and replica */
    op.f[6] = (float)(1.0 / (1.0 - pow((double)r->b1, (double)step)));
    op.f[7] = (float)(1.0 / (1.0 - pow((double)r->b2, (double)step)));
    double c[2] = { 1.0 / (1.0 - pow((double)r->b1, (double)step)), 1.0 / (1.0 - pow((double)r->b2, (double)step)) };
    memcpy(op.p, c, sizeof c); /* unrounded, for the f64 kernel */
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_adamw_update(const dpar_adamw_desc *d, dpar_buffer *param, const dpar_buffer *grad,
                                       dpar_buffer *m, dpar_buffer *v, int64_t step, float clip_scale) {
    dpar__clear_error();
    dpar_adamw_desc r;
    dpar_status s = dpar__adamw_resolve("dpar_adamw_update", d, &r);
    if (s || (s = dpar__adamw_check_bufs("dpar_adamw_update", param, grad, m, v))) return s;
    if (step < 1)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_adamw_update: step = %lld; count updates from 1",
                         (long long)step);
    if (!isfinite(clip_scale) || clip_scale < 0.0f)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_adamw_update: clip_scale = %g is not a finite scale >= 0",
                         (double)clip_scale);
    return dpar__adamw_run(&r, param, grad, m, v, step, clip_scale);
}
DPAR_API dpar_status dpar_adamw_step(dpar_ctx *ctx, const dpar_adamw_desc *d, dpar_buffer *const *params,
                                     dpar_buffer *const *grads, dpar_buffer *const *ms, dpar_buffer *const *vs, int n,
                                     int64_t step) {
    dpar__clear_error();
    dpar_adamw_desc r;
    dpar_status s = dpar__adamw_resolve("dpar_adamw_step", d, &r);
    if (s) return s;
    if (n < 0 || step < 1)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_adamw_step: n = %d, step = %lld; need n >= 0 and step >= 1",
                         n, (long long)step);
    if (n > 0 && (!params || !grads || !ms || !vs))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_adamw_step: params, grads, ms or vs is NULL");
    for (int i = 0; i < n; i++) /* every buffer first: a failed step changes nothing */
        if ((s = dpar__adamw_check_bufs("dpar_adamw_step", params[i], grads[i], ms[i], vs[i]))) return s;
    float scale = 1.0f;
    if (r.clip_norm > 0.0f) {
        if (!ctx)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_adamw_step: clipping needs ctx (call it inside fn)");
        if ((s = dpar__clip_scale("dpar_adamw_step", ctx, r.clip_norm, r.norm_axes, grads, n, &scale, NULL))) return s;
    }
    for (int i = 0; i < n; i++)
        if ((s = dpar__adamw_run(&r, params[i], grads[i], ms[i], vs[i], step, scale))) return s;
    return DPAR_OK;
}

static dpar_status dpar__lr_check(const dpar_lr_schedule_desc *d) {
    const char *fn = "dpar_lr_at";
    if (!(d->peak_lr > 0.0f) || !isfinite(d->peak_lr) || !(d->init_lr >= 0.0f) || !isfinite(d->init_lr))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: peak_lr = %g, init_lr = %g; need peak_lr > 0, init_lr >= 0",
                         fn, (double)d->peak_lr, (double)d->init_lr);
    if (d->warmup_steps < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: warmup_steps = %lld; it must be >= 0", fn,
                         (long long)d->warmup_steps);
    if (d->kind == DPAR_LR_COSINE && (d->decay_steps <= d->warmup_steps || !(d->end_lr >= 0.0f)))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "%s: cosine needs decay_steps (%lld, warm-up included) > warmup_steps (%lld) and end_lr "
                         "(%g) >= 0",
                         fn, (long long)d->decay_steps, (long long)d->warmup_steps, (double)d->end_lr);
    if (d->kind == DPAR_LR_STEP && (d->step_every <= 0 || !(d->gamma > 0.0f && d->gamma <= 1.0f)))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "%s: step decay needs step_every (%lld) > 0 and gamma (%g) in (0, 1]", fn,
                         (long long)d->step_every, (double)d->gamma);
    if ((int)d->kind < 0 || d->kind > DPAR_LR_STEP)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: kind = %d is not a dpar_lr_kind", fn, (int)d->kind);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_lr_at(const dpar_lr_schedule_desc *d, int64_t step, float *lr) {
    dpar__clear_error();
    if (!d || !lr) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_lr_at: desc or lr is NULL");
    if (step < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_lr_at: step = %lld; it must be >= 0", (long long)step);
    dpar_status s = dpar__lr_check(d);
    if (s) return s;
    double peak = d->peak_lr, r = peak;
    if (step < d->warmup_steps) {
        *lr = (float)(d->init_lr + (peak - d->init_lr) * (double)step / (double)d->warmup_steps);
        return DPAR_OK;
    }
    int64_t t = step - d->warmup_steps;
    if (d->kind == DPAR_LR_COSINE) {
        double len = (double)(d->decay_steps - d->warmup_steps), x = (double)t < len ? (double)t : len;
        r = d->end_lr + (peak - d->end_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * x / len));
    } else if (d->kind == DPAR_LR_STEP) {
        r = peak * pow((double)d->gamma, (double)(t / d->step_every));
    }
    *lr = (float)r;
    return DPAR_OK;
}

DPAR_API dpar_status dpar_loss_scaler_init(dpar_loss_scaler *ls, const dpar_loss_scale_desc *d) {
    dpar__clear_error();
    if (!ls) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_loss_scaler_init: ls is NULL");
    dpar_loss_scale_desc r;
    memset(&r, 0, sizeof r);
    if (d) r = *d;
    if (r.init_scale == 0.0f) r.init_scale = 65536.0f;
    if (r.growth_interval == 0) r.growth_interval = 2000;
    if (r.growth_factor == 0.0f) r.growth_factor = 2.0f;
    if (r.backoff_factor == 0.0f) r.backoff_factor = 0.5f;
    if (r.min_scale == 0.0f) r.min_scale = 1.0f;
    if (!(r.init_scale > 0.0f) || !isfinite(r.init_scale) || r.growth_interval < 0 || !(r.growth_factor > 1.0f) ||
        !isfinite(r.growth_factor) || !(r.backoff_factor > 0.0f && r.backoff_factor < 1.0f) || !(r.min_scale > 0.0f) ||
        !isfinite(r.min_scale))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_loss_scaler_init: init_scale %g, growth_interval %d, growth_factor %g, backoff_factor "
                         "%g, min_scale %g; need > 0, > 0, > 1, in (0, 1), > 0 (0: default)",
                         (double)r.init_scale, r.growth_interval, (double)r.growth_factor, (double)r.backoff_factor,
                         (double)r.min_scale);
    memset(ls, 0, sizeof *ls);
    ls->desc = r;
    ls->scale = r.init_scale;
    return DPAR_OK;
}
/* unscales the grads and sums them (finite sum <=> every element finite, up to
   an overflow of the sum itself, which after unscaling needs values near FLT_MAX) */
static dpar_status dpar__unscale_sum(dpar_ctx *ctx, float inv, dpar_buffer *const *grads, int n, const char *axes,
                                     double *sum) {
    dpar_buffer *tmp = NULL;
    int64_t one = 1;
    dpar_status s = dpar_buffer_create(grads[0]->rt, grads[0]->device, DPAR_F32, 1, &one, &tmp);
    *sum = 0.0;
    for (int i = 0; i < n && !s; i++) {
        float v = 0.0f;
        s = dpar_scale(grads[i], inv);
        if (!s) s = dpar_sum(tmp, grads[i]);
        if (!s) s = dpar_buffer_read(tmp, 0, &v, 4);
        *sum += isfinite(v) ? 0.0 : 1.0; /* count the non-finite buffers */
    }
    if (!s && axes && *axes) {
        float v = (float)*sum;
        s = dpar_buffer_write(tmp, 0, &v, 4);
        if (!s) s = dpar_psum(ctx, tmp, tmp, axes);
        if (!s) s = dpar_buffer_read(tmp, 0, &v, 4);
        *sum = (double)v;
    }
    dpar_buffer_destroy(tmp);
    return s;
}
DPAR_API dpar_status dpar_loss_scaler_unscale(dpar_ctx *ctx, dpar_loss_scaler *ls, dpar_buffer *const *grads, int n,
                                              const char *axes, bool *finite) {
    dpar__clear_error();
    const char *fn = "dpar_loss_scaler_unscale";
    if (!ls || !finite || n < 0 || (n > 0 && !grads))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: ls, finite or grads is NULL (or n < 0)", fn);
    if (axes && *axes && !ctx) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: axes need ctx (call it inside fn)", fn);
    if (ctx && !DPAR__CTX_OK(ctx)) return dpar__ctx_check(ctx, fn);
    if (!(ls->scale > 0.0f) || ls->desc.growth_interval <= 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the scaler is not initialized (dpar_loss_scaler_init)", fn);
    dpar_status s;
    for (int i = 0; i < n; i++) {
        if (!grads[i]) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: grads[%d] is NULL", fn, i);
        if (!dpar__live_buf_ok(grads[i])) return dpar__live_stale_arg(fn, "a grads[] entry", DPAR__LIVE_BUFFER);
        if ((s = dpar__need_f32(fn, grads[i], "grad"))) return s;
    }
    double bad = 0.0;
    if (n > 0 && (s = dpar__unscale_sum(ctx, 1.0f / ls->scale, grads, n, axes, &bad))) return s;
    *finite = bad == 0.0;
    if (*finite && ++ls->good_steps >= ls->desc.growth_interval) {
        float g = ls->scale * ls->desc.growth_factor;
        if (isfinite(g)) ls->scale = g;
        ls->good_steps = 0;
    } else if (!*finite) {
        float b = ls->scale * ls->desc.backoff_factor;
        ls->scale = b > ls->desc.min_scale ? b : ls->desc.min_scale;
        ls->good_steps = 0;
        ls->skipped_steps++;
    }
    return DPAR_OK;
}

DPAR_API dpar_status dpar_cross_entropy(dpar_buffer *loss, dpar_buffer *dlogits, const dpar_buffer *logits,
                                        const dpar_buffer *labels, const dpar_xent_desc *d) {
    dpar__clear_error();
    if (d && !(d->label_smoothing >= 0.0f && d->label_smoothing < 1.0f))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_cross_entropy: label_smoothing = %g; it must be in [0, 1)",
                         (double)d->label_smoothing);
    return dpar__xent(DPAR__IDX_XENT, loss, dlogits, logits, labels, d);
}

static dpar_status dpar__embed_check(int fn_id, dpar_buffer *dst, const dpar_buffer *src, const dpar_buffer *idx,
                                     int bwd) {
    const char *fn = dpar__idx_fn[fn_id];
    const dpar_buffer *ops[2] = { src, idx };
    dpar_status s = dpar__op_check(fn, dst, ops, 2);
    dpar_dtype t = s ? DPAR_F32 : dpar__fdt(dst); /* f32, or f64 throughout (>>f64 api) */
    if (s || (s = dpar__need_ft(fn, dst, bwd ? "dtable" : "out", t)) ||
        (s = dpar__need_ft(fn, src, bwd ? "dout" : "table", t)))
        return s;
    if (idx->dtype != DPAR_I32)
        return dpar__err(DPAR_ERR_DTYPE, "%s: idx is %s but must be i32 row indices", fn, dpar_dtype_name(idx->dtype));
    const dpar_buffer *table = bwd ? dst : src, *rows = bwd ? src : dst;
    if (table->ndim != 2 || rows->count != idx->count * table->shape[1]) {
        char x[160], y[160], z[160];
        return dpar__err(DPAR_ERR_SHAPE, "%s: %s %s must be [V, D] and %s %s must hold idx %s count x D elements", fn,
                         bwd ? "dtable" : "table", dpar__shape_str(x, sizeof x, table->ndim, table->shape),
                         bwd ? "dout" : "out", dpar__shape_str(y, sizeof y, rows->ndim, rows->shape),
                         dpar__shape_str(z, sizeof z, idx->ndim, idx->shape));
    }
    if (dst == src) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the table and the rows must not alias", fn);
    return DPAR_OK;
}
static void dpar__embed_op(dpar__op *op, dpar__op_kind k, int fn_id, dpar_buffer *dst, const dpar_buffer *src,
                           const dpar_buffer *idx, const dpar_buffer *table) {
    dpar__op_init(op, k, dst);
    op->src0 = src;
    op->src1 = idx;
    op->m = idx->count;
    op->n = table->shape[1];
    op->k = table->shape[0];
    op->p[2] = fn_id;
}
DPAR_API dpar_status dpar_embedding(dpar_buffer *out, const dpar_buffer *table, const dpar_buffer *idx) {
    dpar__clear_error();
    dpar_status s = dpar__embed_check(DPAR__IDX_EMBED, out, table, idx, 0);
    if (s) return s;
    dpar__op op;
    dpar__embed_op(&op, DPAR__OP_EMBED, DPAR__IDX_EMBED, out, table, idx, table);
    return dpar__op_run(&op);
}
DPAR_API dpar_status dpar_embedding_backward(dpar_buffer *dtable, const dpar_buffer *dout, const dpar_buffer *idx,
                                             float beta) {
    dpar__clear_error();
    dpar_status s = dpar__embed_check(DPAR__IDX_EMBED_BWD, dtable, dout, idx, 1);
    if (s) return s;
    if (!isfinite(beta))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_embedding_backward: beta = %g must be finite", (double)beta);
    /* beta first, as its own op, so every backend adds the rows to the same values */
    if (beta == 0.0f)
        s = dpar_fill(dtable, 0.0f);
    else if (beta != 1.0f)
        s = dpar_scale(dtable, beta);
    if (s) return s;
    dpar__op op;
    dpar__embed_op(&op, DPAR__OP_EMBED_BWD, DPAR__IDX_EMBED_BWD, dtable, dout, idx, dtable);
    return dpar__op_run(&op);
}

/* Philox-4x32-10 (Random123's philox4x32, 10 rounds) */
static void dpar__philox(const uint32_t c_in[4], const uint32_t k_in[2], uint32_t out[4]) {
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3], k0 = k_in[0], k1 = k_in[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t h0 = (uint32_t)(p0 >> 32), l0 = (uint32_t)p0, h1 = (uint32_t)(p1 >> 32), l1 = (uint32_t)p1;
        c0 = h1 ^ c1 ^ k0;
        c1 = l1;
        c2 = h0 ^ c3 ^ k1;
        c3 = l0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}
DPAR_API void dpar_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    dpar__philox(ctr, key, out);
}
DPAR_API dpar_status dpar_dropout(dpar_buffer *y, const dpar_buffer *x, float rate, uint64_t seed, uint64_t step,
                                  uint32_t stream) {
    dpar__clear_error();
    const char *fn = "dpar_dropout";
    dpar_status s = dpar__op_check(fn, y, &x, 1);
    dpar_dtype t = s ? DPAR_F32 : dpar__fdt(y); /* f32, or f64 throughout (>>f64 api) */
    if (s || (s = dpar__need_ft(fn, y, "y", t)) || (s = dpar__need_ft(fn, x, "x", t)) ||
        (s = dpar__same_count(fn, y, "y", x, "x")))
        return s;
    if (!(rate >= 0.0f && rate <= 1.0f))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: rate = %g; it must be in [0, 1]", fn, (double)rate);
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_DROPOUT, y);
    op.src0 = x;
    op.f[0] = rate < 1.0f ? (float)(1.0 / (1.0 - (double)rate)) : 0.0f;
    op.p[0] = (int64_t)(uint32_t)seed;
    op.p[1] = (int64_t)(uint32_t)(seed >> 32);
    op.p[2] = (int64_t)(uint32_t)step;
    op.p[3] = (int64_t)(uint32_t)(step >> 32);
    op.p[4] = (int64_t)stream;
    op.p[5] = (int64_t)llround((double)rate * 16777216.0); /* 0 .. 2^24 */
    double scale = rate < 1.0f ? 1.0 / (1.0 - (double)rate) : 0.0;
    memcpy(&op.p[6], &scale, sizeof scale); /* unrounded, for the f64 kernel */
    return dpar__op_run(&op);
}
/* keep mask of element e under op's key (the CPU reference of every backend's kernel) */
static int dpar__dropout_keep(const dpar__op *op, const uint32_t w[4], int64_t e) {
    return (w[e & 3] >> 8) >= (uint32_t)op->p[5];
}
static void dpar__dropout_words(const dpar__op *op, int64_t block, uint32_t w[4]) {
    uint32_t c[4] = { (uint32_t)block, (uint32_t)op->p[4], (uint32_t)op->p[2], (uint32_t)op->p[3] };
    uint32_t k[2] = { (uint32_t)op->p[0], (uint32_t)op->p[1] };
    dpar__philox(c, k, w);
}

/* >>sharding =================================================================
   Array specs, resharding between specs, shard_map with in/out specs (built on
   arrays, dispatch and the collectives above). */

DPAR_API dpar_dtype dpar_array_dtype(const dpar_array *a) {
    return dpar__live_got(a, DPAR__LIVE_ARRAY, "dpar_array_dtype") ? a->dtype : DPAR_DTYPE_COUNT;
}
DPAR_API dpar_mesh *dpar_array_mesh(const dpar_array *a) {
    return dpar__live_got(a, DPAR__LIVE_ARRAY, "dpar_array_mesh") ? a->mesh : NULL;
}
DPAR_API int64_t dpar_array_shard_dim(const dpar_array *a, int i) {
    return (dpar__live_got(a, DPAR__LIVE_ARRAY, "dpar_array_shard_dim") && i >= 0 && i < a->ndim) ? a->local[i] : -1;
}
DPAR_API dpar_status dpar_array_spec(const dpar_array *a, int i, char *buf, size_t cap) {
    dpar__clear_error();
    if (dpar__live_arg(a, DPAR__LIVE_ARRAY, "dpar_array_spec", "the array")) return DPAR_ERR_STATE;
    if (!a || !buf || cap == 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_spec: array or buf is NULL, or cap is 0");
    buf[0] = 0;
    if (i < 0 || i >= a->ndim)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_spec: dimension %d is out of range for a %d-d array", i,
                         a->ndim);
    size_t at = 0;
    for (int j = 0; j < a->spec_n[i]; j++) {
        int w = snprintf(buf + at, cap - at, j ? ",%s" : "%s", a->mesh->names[a->spec_axes[i][j]]);
        if (w < 0 || (size_t)w >= cap - at) {
            buf[0] = 0;
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_array_spec: buffer of %zu bytes is too small for the spec of dimension %d", cap, i);
        }
        at += (size_t)w;
    }
    return DPAR_OK;
}

/* Same axes list (same order) on dimension d of a and dimension e of b. */
static int dpar__spec_dim_eq(const dpar_array *a, int d, const dpar_array *b, int e) {
    if (a->spec_n[d] != b->spec_n[e]) return 0;
    for (int j = 0; j < a->spec_n[d]; j++)
        if (a->spec_axes[d][j] != b->spec_axes[e][j]) return 0;
    return 1;
}
/* "a,b" of dimension d's axes into buf; 1 when they are in mesh order (the
   order of a collective's group), 0 otherwise. */
static int dpar__spec_axes_str(const dpar_array *a, int d, char *buf, size_t cap) {
    size_t at = 0;
    int inorder = 1;
    buf[0] = 0;
    for (int j = 0; j < a->spec_n[d] && at < cap; j++) {
        at += (size_t)snprintf(buf + at, cap - at, j ? ",%s" : "%s", a->mesh->names[a->spec_axes[d][j]]);
        if (j && a->spec_axes[d][j] < a->spec_axes[d][j - 1]) inorder = 0;
    }
    return inorder;
}

enum { DPAR__RESHARD_COPY, DPAR__RESHARD_A2A, DPAR__RESHARD_GATHER };
typedef struct dpar__reshard_plan {
    int kind, i, j;
    char axes[128];
} dpar__reshard_plan;

static dpar_status dpar__reshard_fn(dpar_ctx *ctx, void *user) {
    const dpar__reshard_plan *p = (const dpar__reshard_plan *)user;
    dpar_buffer *in = dpar_ctx_arg(ctx, 0), *out = dpar_ctx_arg(ctx, 1);
    switch (p->kind) {
    case DPAR__RESHARD_A2A: return dpar_all_to_all(ctx, out, in, p->axes, p->j, p->i);
    case DPAR__RESHARD_GATHER: return dpar_all_gather(ctx, out, in, p->axes, p->i, true);
    default: return dpar_copy(out, in);
    }
}

DPAR_API dpar_status dpar_array_reshard(dpar_array *dst, const dpar_array *src) {
    dpar__clear_error();
    if (dpar__live_arg(dst, DPAR__LIVE_ARRAY, "dpar_array_reshard", "dst")) return DPAR_ERR_STATE;
    if (dpar__live_arg(src, DPAR__LIVE_ARRAY, "dpar_array_reshard", "src")) return DPAR_ERR_STATE;
    if (!dst || !src) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_array_reshard: dst or src is NULL");
    if (dpar__self_worker)
        return dpar__err(
            DPAR_ERR_INVALID_ARGUMENT,
            "dpar_array_reshard: called from inside a pmap/shard_map function; call it between dispatches");
    if (dst == src) return DPAR_OK;
    if (dst->mesh != src->mesh)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_array_reshard: dst and src live on different meshes; reshard works within one mesh "
                         "(across meshes use dpar_array_get + dpar_array_put, or a checkpoint)");
    if (dst->dtype != src->dtype)
        return dpar__err(DPAR_ERR_DTYPE,
                         "dpar_array_reshard: dst is %s but src is %s; they must match (use dpar_cast inside a "
                         "shard_map to convert)",
                         dpar_dtype_name(dst->dtype), dpar_dtype_name(src->dtype));
    int same_shape = dst->ndim == src->ndim;
    for (int d = 0; same_shape && d < dst->ndim; d++) same_shape = dst->shape[d] == src->shape[d];
    if (!same_shape) {
        char x[160], y[160];
        return dpar__err(DPAR_ERR_SHAPE, "dpar_array_reshard: dst has global shape %s but src has %s; they must match",
                         dpar__shape_str(x, sizeof x, dst->ndim, dst->shape),
                         dpar__shape_str(y, sizeof y, src->ndim, src->shape));
    }
    dpar_mesh *m = dst->mesh;
    int nd = dst->ndim, ndiff = 0, diff[2] = { -1, -1 };
    for (int d = 0; d < nd; d++)
        if (!dpar__spec_dim_eq(dst, d, src, d)) {
            if (ndiff < 2) diff[ndiff] = d;
            ndiff++;
        }
    dpar__reshard_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.kind = -1;
    if (ndiff == 0) {
        plan.kind = DPAR__RESHARD_COPY;
    } else if (ndiff == 2) {
        /* dim i split over A in src and whole in dst, dim j the other way round */
        for (int t = 0; t < 2 && plan.kind < 0; t++) {
            int i = diff[t], j = diff[1 - t];
            if (src->spec_n[i] > 0 && dst->spec_n[i] == 0 && src->spec_n[j] == 0 && dpar__spec_dim_eq(src, i, dst, j) &&
                dpar__spec_axes_str(src, i, plan.axes, sizeof plan.axes)) {
                plan.kind = DPAR__RESHARD_A2A;
                plan.i = i;
                plan.j = j;
            }
        }
    } else if (ndiff == 1) {
        int i = diff[0];
        if (src->spec_n[i] > 0 && dst->spec_n[i] == 0 && dpar__spec_axes_str(src, i, plan.axes, sizeof plan.axes)) {
            plan.kind = DPAR__RESHARD_GATHER;
            plan.i = i;
        }
    }
    if (plan.kind >= 0) {
        dpar_shard_map_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.fn = dpar__reshard_fn;
        sd.user = &plan;
        sd.num_args = 2;
        sd.args[0] = (dpar_array *)src;
        sd.args[1] = dst;
        return dpar_shard_map(m, &sd);
    }
    size_t es = dpar_dtype_size(src->dtype);
    /* local slice: every src shard contains the same device's dst shard (src's
       axes on each dim are a prefix of dst's) */
    int contains = 1;
    for (int d = 0; d < nd && contains; d++) {
        if (src->spec_n[d] > dst->spec_n[d]) contains = 0;
        for (int j = 0; contains && j < src->spec_n[d]; j++) contains = src->spec_axes[d][j] == dst->spec_axes[d][j];
    }
    if (contains) {
        size_t snb = (size_t)dpar__prod(src->local, nd) * es, dnb = (size_t)dpar__prod(dst->local, nd) * es;
        char *ts = (char *)DPAR_MALLOC(snb ? snb : 1), *td = (char *)DPAR_MALLOC(dnb ? dnb : 1);
        dpar_status s = (ts && td) ? DPAR_OK
                                   : dpar__err(DPAR_ERR_OUT_OF_MEMORY,
                                               "dpar_array_reshard: out of host memory (%zu bytes)", snb + dnb);
        int64_t zero[DPAR_MAX_DIMS] = { 0 }, so[DPAR_MAX_DIMS], dof[DPAR_MAX_DIMS], rel[DPAR_MAX_DIMS];
        for (int p = 0; p < m->size && !s; p++) {
            if (!src->shards[p] || !dst->shards[p]) continue; /* held by another process */
            s = dpar_buffer_read(src->shards[p], 0, ts, snb);
            if (s) break;
            dpar__array_offsets(src, p, so);
            dpar__array_offsets(dst, p, dof);
            for (int d = 0; d < nd; d++) rel[d] = dof[d] - so[d];
            dpar__copy_block(td, dst->local, zero, ts, src->local, rel, dst->local, nd, es);
            s = dpar_buffer_write(dst->shards[p], 0, td, dnb);
        }
        DPAR_FREE(ts);
        DPAR_FREE(td);
        return s;
    }
    /* general case: through one global host copy */
    size_t gnb = (size_t)dpar__prod(src->shape, nd) * es;
    void *g = DPAR_MALLOC(gnb ? gnb : 1);
    if (!g)
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY,
                         "dpar_array_reshard: out of host memory (%zu bytes for the global array)", gnb);
    dpar_status s = dpar_array_get(src, g);
    if (!s) s = dpar_array_put(dst, g);
    DPAR_FREE(g);
    return s;
}

/* Does `spec` (per dim, NULL = whole) equal a's spec? Errors for a bad spec. */
static dpar_status dpar__spec_matches(const dpar_array *a, const char *const *spec, const char *where, int *eq) {
    *eq = 1;
    for (int d = 0; d < a->ndim; d++) {
        int order[DPAR_MAX_AXES], no = 0;
        unsigned mask = 0;
        if (spec[d] && *spec[d]) {
            char w[96];
            snprintf(w, sizeof w, "%s: spec of dimension %d", where, d);
            dpar_status s = dpar__parse_axes(a->mesh, w, spec[d], &mask, order, &no);
            if (s) return s;
        }
        if (no != a->spec_n[d]) {
            *eq = 0;
            continue;
        }
        for (int j = 0; j < no; j++)
            if (order[j] != a->spec_axes[d][j]) *eq = 0;
    }
    return DPAR_OK;
}
static dpar_status dpar__prefix_err(dpar_status s, const char *prefix) {
    char saved[DPAR__ERR_LEN];
    memcpy(saved, dpar__err_text, sizeof saved);
    return dpar__err(s, "%s: %s", prefix, saved);
}

DPAR_API dpar_status dpar_shard_map_specs(dpar_mesh *m, const dpar_shard_map_specs_desc *desc) {
    dpar__clear_error();
    if (dpar__live_arg(m, DPAR__LIVE_MESH, "dpar_shard_map_specs", "the mesh")) return DPAR_ERR_STATE;
    dpar_shard_map_specs_desc resolved;
    const dpar_shard_map_specs_desc *d = desc ? &resolved : NULL;
    if (desc) { /* counts of 0 inferred: the leading non-NULL inputs / outputs */
        resolved = *desc;
        if (resolved.num_inputs == 0)
            while (resolved.num_inputs < DPAR_MAX_ARGS && resolved.inputs[resolved.num_inputs]) resolved.num_inputs++;
        if (resolved.num_outputs == 0)
            while (resolved.num_outputs < DPAR_MAX_ARGS && resolved.outputs[resolved.num_outputs])
                resolved.num_outputs++;
    }
    if (!m || !d || !d->fn)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map_specs: mesh, desc or desc->fn is NULL");
    if (d->num_inputs < 0 || d->num_outputs < 0 || d->num_inputs + d->num_outputs > DPAR_MAX_ARGS)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_shard_map_specs: num_inputs = %d, num_outputs = %d; each >= 0 and together at most %d",
                         d->num_inputs, d->num_outputs, (int)DPAR_MAX_ARGS);
    int ni = d->num_inputs, no = d->num_outputs;
    for (int k = 0; k < ni + no; k++) {
        dpar_array *a = k < ni ? d->inputs[k] : d->outputs[k - ni];
        const char *kind = k < ni ? "input" : "output";
        int idx = k < ni ? k : k - ni;
        if (!a) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map_specs: %s %d is NULL", kind, idx);
        if (a->mesh != m)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_shard_map_specs: %s %d was created on another mesh", kind,
                             idx);
        for (int j = 0; j < k - ni && k >= ni; j++)
            if (d->outputs[j] == a)
                return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                 "dpar_shard_map_specs: outputs %d and %d are the same array", j, idx);
    }
    dpar_array *tmp[DPAR_MAX_ARGS];
    memset(tmp, 0, sizeof tmp);
    dpar_shard_map_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.fn = d->fn;
    sd.user = d->user;
    sd.num_args = ni + no;
    dpar_status s = DPAR_OK;
    for (int k = 0; k < ni + no && !s; k++) {
        dpar_array *a = k < ni ? d->inputs[k] : d->outputs[k - ni];
        const char *const *spec = k < ni ? d->in_specs[k] : d->out_specs[k - ni];
        char where[64];
        snprintf(where, sizeof where, "dpar_shard_map_specs: %s %d", k < ni ? "input" : "output", k < ni ? k : k - ni);
        int eq;
        s = dpar__spec_matches(a, spec, where, &eq);
        if (s) break;
        if (eq) {
            sd.args[k] = a;
            continue;
        }
        dpar_array_desc ad;
        memset(&ad, 0, sizeof ad);
        ad.dtype = a->dtype;
        ad.ndim = a->ndim;
        for (int i = 0; i < a->ndim; i++) {
            ad.shape[i] = a->shape[i];
            ad.spec[i] = spec[i];
        }
        s = dpar_array_create(m, &ad, &tmp[k]);
        if (!s && k < ni) s = dpar_array_reshard(tmp[k], a);
        if (s) {
            s = dpar__prefix_err(s, where);
            break;
        }
        sd.args[k] = tmp[k];
    }
    if (!s) s = dpar_shard_map(m, &sd);
    for (int j = 0; j < no && !s; j++)
        if (tmp[ni + j]) s = dpar_array_reshard(d->outputs[j], tmp[ni + j]);
    char saved[DPAR__ERR_LEN];
    memcpy(saved, dpar__err_text, sizeof saved);
    for (int k = 0; k < ni + no; k++) dpar_array_destroy(tmp[k]);
    memcpy(dpar__err_text, saved, sizeof saved);
    return s;
}

/* >>graph ====================================================================
   Graphs and gradients: a node table of per-device values (ggml's cgraph),
   reverse mode by appending nodes (ggml_build_backward_expand, JAX's
   transpose rules for the collectives), a liveness plan, and a run that
   replays the node list on every device in one shard_map dispatch, each node
   lowered to the eager op of the same name (so every backend runs graphs
   through its vtable with nothing new to implement).

   ADDING AN OP KIND (conv2d, pooling, norms, ...) is four local changes:
     1. an enum DPAR__G_<KIND> and its row in dpar__g_kinds (name, inputs,
        whether it is a collective over axes, whether a recorded program may
        hold it: device commands only);
     2. a builder dpar_g_<op>: dpar__g_args (validity) -> shape and dtype
        rules, failing with dpar__g_fail (names the node and the shapes) ->
        dpar__g_push (new node; set ip[]/fp[] attributes after it);
     3. a case in dpar__g_exec (the forward lowering: eager calls on
        dpar__g_in(...) buffers, already reshaped to the node's shapes);
     4. a case in dpar__g_grad (the gradient rule: build the cotangents of the
        inputs from `ct` with dpar_g_* builders and hand each to
        dpar__g_contrib(g, input, node, value)); leave an input out when it has
        no gradient (integer labels). The varying-axes bookkeeping and the
        psum over replicated axes happen in dpar__g_contrib, not in the rule. */
enum {
    DPAR__G_NONE = 0,
    DPAR__G_FEED,
    DPAR__G_PARAM,
    DPAR__G_CONST,
    DPAR__G_MATMUL,
    DPAR__G_BIAS_ADD,
    DPAR__G_BIAS_GRAD,
    DPAR__G_RELU,
    DPAR__G_RELU_GRAD,
    DPAR__G_XENT,
    DPAR__G_XENT_GRAD,
    DPAR__G_MSE,
    DPAR__G_MSE_GRAD,
    DPAR__G_ADD,
    DPAR__G_SCALE,
    DPAR__G_MULS,
    DPAR__G_SUM,
    DPAR__G_SUMSQ,
    DPAR__G_DOT,
    DPAR__G_CAST,
    DPAR__G_COPY,
    DPAR__G_PSUM,
    DPAR__G_PMEAN,
    DPAR__G_PMAX,
    DPAR__G_PMIN,
    DPAR__G_ALL_GATHER,
    DPAR__G_PSUM_SCATTER,
    DPAR__G_PPERMUTE,
    DPAR__G_ALL_TO_ALL,
    DPAR__G_PBROADCAST,
    DPAR__G_PCAST,
    DPAR__G_BLOCK,     /* this member's block of an all_gather'ed value (all_gather's transpose) */
    DPAR__G_ROOT_ONLY, /* x on the root of the group, zero elsewhere (pbroadcast's transpose) */
    DPAR__G_SGD,
    /* >>graph norm-attn kinds */
    DPAR__G_NORM_STATS,
    DPAR__G_NORM,
    DPAR__G_NORM_DX,
    DPAR__G_NORM_DW,
    DPAR__G_MATMUL_BATCHED,
    DPAR__G_ATTN_STATS,
    DPAR__G_ATTN,
    DPAR__G_ATTN_DQ,
    DPAR__G_ATTN_DK,
    DPAR__G_ATTN_DV,
    /* >>graph conv-pool kinds */
    DPAR__G_CONV2D,      /* in x, w[, b]; attr: dpar_conv2d_desc */
    DPAR__G_CONV2D_DX,   /* in ct, w; attr: dpar_conv2d_desc */
    DPAR__G_CONV2D_DW,   /* in x, ct; attr: dpar_conv2d_desc */
    DPAR__G_AVG_POOL,    /* in x; attr: dpar_pool2d_desc */
    DPAR__G_AVG_POOL_DX, /* in ct; attr: dpar_pool2d_desc */
    DPAR__G_MAX_POOL,    /* in x; attr: dpar_pool2d_desc */
    DPAR__G_MAX_POOL_DX, /* in ct, x; attr: dpar_pool2d_desc */
    /* >>graph elementwise kinds */
    DPAR__G_UNARY,
    DPAR__G_UNARY_GRAD,
    DPAR__G_BINARY,
    DPAR__G_BINARY_GRAD, /* ip[1]: the side (0 a, 1 b) */
    DPAR__G_WHERE,
    DPAR__G_WHERE_GRAD,
    DPAR__G_REDUCE, /* ip[0] kind, ip[1] axes mask */
    DPAR__G_REDUCE_GRAD,
    DPAR__G_SOFTMAX,
    DPAR__G_SOFTMAX_GRAD,
    DPAR__G_TRANSPOSE, /* lp: perm */
    DPAR__G_BROADCAST,
    DPAR__G_SLICE, /* lp: start, then step */
    DPAR__G_SLICE_GRAD,
    DPAR__G_PAD,    /* lp: lo; fp: value */
    DPAR__G_CONCAT, /* ip[0]: axis */
    /* >>graph optim kinds */
    DPAR__G_XENT_IGN,      /* ip[0] use_ignore, ip[1] ignore label, fp smoothing */
    DPAR__G_XENT_IGN_GRAD, /* the same attributes */
    DPAR__G_EMBED,
    DPAR__G_EMBED_GRAD,
    DPAR__G_DROPOUT, /* ip[0..1] seed, fp rate */
    /* >>graph zero1-pipe kinds */
    DPAR__G_ZERO1_SCATTER, /* in: a local gradient; ip[0]: the optimizer's param index; fp: scale */
    DPAR__G_KINDS
};
typedef struct dpar__g_kind {
    const char *name;
    int nin;  /* inputs */
    int coll; /* 1: a collective over the node's axes */
    int rec;  /* 1: its lowering issues device commands only (no host read or write, no collective, nothing that
                 changes between steps), so a recorded program may hold it (dpar__g_recordable) */
} dpar__g_kind;
static const dpar__g_kind dpar__g_kinds[DPAR__G_KINDS] = {
    { "none", 0, 0, 0 },
    { "feed", 0, 0, 1 },
    { "param", 0, 0, 1 },
    { "const", 0, 0, 1 },
    { "matmul", 2, 0, 1 },
    { "bias_add", 2, 0, 1 },
    { "bias_grad", 1, 0, 1 },
    { "relu", 1, 0, 1 },
    { "relu_grad", 2, 0, 1 },
    { "softmax_xent", 2, 0, 1 },
    { "xent_grad", 2, 0, 1 },
    { "mse", 2, 0, 1 },
    { "mse_grad", 2, 0, 1 },
    { "add", 2, 0, 1 },
    { "scale", 1, 0, 1 },
    { "mul_scalar", 2, 0, 1 },
    { "sum", 1, 0, 1 },
    { "sum_squares", 1, 0, 1 },
    { "dot", 2, 0, 1 },
    { "cast", 1, 0, 1 },
    { "copy", 1, 0, 1 },
    { "psum", 1, 1, 0 },
    { "pmean", 1, 1, 0 },
    { "pmax", 1, 1, 0 },
    { "pmin", 1, 1, 0 },
    { "all_gather", 1, 1, 0 },
    { "psum_scatter", 1, 1, 0 },
    { "ppermute", 1, 1, 0 },
    { "all_to_all", 1, 1, 0 },
    { "pbroadcast", 1, 1, 0 },
    { "pcast", 1, 1, 1 },
    { "block", 1, 1, 0 },
    { "root_only", 1, 1, 1 },
    { "sgd", 0, 0, 0 },
    /* >>graph norm-attn kinds */
    { "norm_stats", 1, 0, 1 },
    { "norm", 4, 0, 1 },
    { "norm_dx", 4, 0, 1 },
    { "norm_dw", 3, 0, 1 },
    { "matmul_batched", 2, 0, 1 },
    { "attention_stats", 1, 0, 1 },
    { "attention", 4, 0, 1 },
    { "attention_dq", 5, 0, 1 },
    { "attention_dk", 5, 0, 1 },
    { "attention_dv", 5, 0, 1 },
    /* >>graph conv-pool kinds */
    { "conv2d", 3, 0, 1 },
    { "conv2d_dx", 2, 0, 1 },
    { "conv2d_dw", 2, 0, 1 },
    { "avg_pool2d", 1, 0, 1 },
    { "avg_pool2d_dx", 1, 0, 1 },
    { "max_pool2d", 1, 0, 1 },
    { "max_pool2d_dx", 2, 0, 1 },
    /* >>graph elementwise kinds */
    { "unary", 1, 0, 1 },
    { "unary_grad", 2, 0, 1 },
    { "binary", 2, 0, 1 },
    { "binary_grad", 3, 0, 1 },
    { "where", 3, 0, 1 },
    { "where_grad", 2, 0, 1 },
    { "reduce", 1, 0, 1 },
    { "reduce_grad", 2, 0, 1 },
    { "softmax", 1, 0, 1 },
    { "softmax_grad", 2, 0, 1 },
    { "transpose", 1, 0, 1 },
    { "broadcast_to", 1, 0, 1 },
    { "slice", 1, 0, 1 },
    { "slice_grad", 1, 0, 1 },
    { "pad", 1, 0, 1 },
    { "concat", 4, 0, 1 },
    /* >>graph optim kinds */
    { "cross_entropy", 2, 0, 0 },
    { "cross_entropy_grad", 2, 0, 0 },
    { "embedding", 2, 0, 0 },
    { "embedding_grad", 2, 0, 0 },
    { "dropout", 1, 0, 0 },
    /* >>graph zero1-pipe kinds */
    { "zero1_scatter", 1, 1, 0 },
};

/* The inputs a kind's output may share a buffer with: bit k, the lowering is right with its output in input k's
   buffer, so the plan may alias them (dpar__g_alias_of). bias_add, add and scale copy input 0 into the output
   (a dpar_copy onto itself does nothing) and update it in place (add's b is never the output: bit 0 only); a
   copy (reshape) runs nothing; relu, unary and softmax run in place; their gradients' dx may alias dy (input
   0); binary's y may alias a or b of y's shape. A new kind is left out unless its lowering runs in place. */
static unsigned dpar__g_inplace(int kind) {
    switch (kind) {
    case DPAR__G_BIAS_ADD:
    case DPAR__G_ADD:
    case DPAR__G_SCALE:
    case DPAR__G_COPY:
    case DPAR__G_PCAST:
    case DPAR__G_RELU:
    case DPAR__G_RELU_GRAD:
    case DPAR__G_UNARY:
    case DPAR__G_UNARY_GRAD:
    case DPAR__G_SOFTMAX:
    case DPAR__G_SOFTMAX_GRAD: return 1u;
    case DPAR__G_BINARY: return 3u;
    default: return 0u;
    }
}
typedef struct dpar__gnode {
    int kind;
    char name[DPAR_NAME_LEN];
    int nin, in[5]; /* up to 5: attention's gradient nodes read dout, q, k, v and the statistics */
    dpar_dtype dtype;
    int ndim;
    int64_t shape[DPAR_MAX_DIMS]; /* per-device */
    unsigned vary;                /* mesh axes over which the value differs between devices */
    unsigned axes;                /* collectives: the axes; its text in axes_str */
    char axes_str[64];
    int ip[4];                     /* integer attributes: trans_a/b, dim/tiled, split/concat, root */
    int64_t lp[2 * DPAR_MAX_DIMS]; /* per-axis attributes: perm, slice start and step, pad lo */
    float fp;                      /* scale, const value */
    int *pairs;                    /* ppermute (source, destination) pairs */
    int npairs;
    void *attr;        /* the op's desc (conv2d, pools), owned by the node */
    bool is_one;       /* const 1 (the seed): rules skip a multiply by it */
    bool async;        /* a gradient's reduction: started at once, waited for before the optimizer */
    bool keep;         /* buffer kept to the end of a run (loss, grads, dpar_graph_keep) */
    int spec_of;       /* grads of feeds/params: the leaf whose global shape and spec it has */
    dpar_array *array; /* param: the user's; feed, kept grads: the graph's */
    int slot;          /* compiled: index into the graph's buffers, -1 none */
    int stage;         /* pipelines: the stage that computes it (-1: a leaf, on every stage) */
    bool pipe;         /* pipelines: a stage boundary (a ppermute between neighbouring stages) */
    size_t attr_sz;    /* bytes of attr (0: unknown, the node is not recomputed) */
    int remat;         /* > 0: made inside remat segment `remat` (>>graph remat) */
    int remat_of;      /* > 0: the backward's recomputed copy of that forward node */
    int fused;         /* compiled: a loss, > 0: its gradient node, computed in the same pass; the gradient
                          node, < 0: minus the loss that computes it (dpar__g_fuse_losses); the same for
                          attention's gradient nodes (the first computes the others: dpar__g_fuse_attn) */
    int fused2;        /* compiled: attention's first gradient node, > 0: the third, computed in the same call */
    int bucket;        /* compiled: a small gradient's reduction, 1 + its bucket (dpar__g_bucket_plan); 0: alone */
    bool ident;        /* compiled: a psum/pmean over one device whose input writes its buffer: runs nothing
                          (dpar__g_ident_ok) */
} dpar__gnode;

/* Small gradients reduced together (PyTorch DDP's buckets): their pre-reduction values are
   concatenated into buf and reduced in place by one collective, started when the last member is
   computed; waiting for it copies each member's block back to the member's own buffer. */
typedef struct dpar__gbucket {
    int n, *members;   /* reduction nodes, in execution order */
    int64_t *offset;   /* [n] each member's first element in buf */
    int64_t count;     /* f32 elements */
    dpar_buffer **buf; /* [nlocal] */
    bool blocking;     /* waited for at once (dpar__g_bucket_blocking): reduced by a blocking collective */
    bool at_opt;       /* blocking, and the next node that runs is the optimizer's: it copies the members back */
} dpar__gbucket;

typedef struct dpar__gopt {
    bool adamw;         /* else SGD */
    dpar_sgd_desc d;    /* SGD */
    dpar_adamw_desc ad; /* AdamW */
    int64_t step;       /* AdamW: updates done (the next run does step + 1) */
    char norm_axes[64];
    int n, *params, *grads;
    bool mixed; /* params split over different axes: the clip norm is summed per split (dpar__g_opt_step) */
    int nsplit, *split_order, *split_end; /* clipped: params grouped by split (each in param order), group ends */
    bool *decay;                          /* AdamW: weight decay on params[k] only where decay[k] (NULL: on all) */
} dpar__gopt;

struct dpar_graph {
    dpar_mesh *mesh;
    dpar_runtime *rt;
    dpar__gnode *n; /* n[0] unused: id 0 is the invalid value */
    int count, cap;
    dpar_status err;
    char *errtext;
    int loss, loss_value; /* the differentiated loss and the reported (pinned) one */
    float gscale;         /* 1 / size of the pinned axes, applied to the gradients */
    unsigned pin;
    dpar__gopt opt;
    bool has_opt, compiled, ran;
    bool opt_rec;      /* compiled: the optimizer node may join a recorded program (dpar__g_opt_recordable) */
    int first, nlocal; /* this process's devices */
    int nslots;
    dpar_buffer **slots;        /* [slot * nlocal + li] */
    bool *slot_owned;           /* slot's buffers belong to the graph (not to an array) */
    size_t *slot_bytes;         /* [slot] capacity of a graph-owned slot's buffers */
    dpar_array **opt_state;     /* optimizer state [j * n + k]: m, v / momentum of param k (its shape and spec) */
    struct dpar__gstate *state; /* the training state's named arrays (>>graph state), built at compile */
    int nstate;
    dpar_buffer **scratch;   /* one f32 element per device (the discarded loss of xent_grad) */
    dpar_buffer **scratch64; /* the same in f64, for a graph with f64 values (NULL otherwise) */
    dpar_buffer **sgd_ptrs;  /* [li][4][n] params, grads, optimizer state (momentum / AdamW m, v) */
    dpar_buffer **clip_ptrs; /* [li][n] a clip's grads in opt.split_order (dpar__g_clip_mixed) */
    dpar_request **reqs;     /* [node * nlocal + li] async reductions in flight */
    dpar__gbucket *bk;       /* gradient buckets (>>graph buckets), nbk of them */
    int nbk;
    dpar_graph_stats stats;
    struct dpar__gz1 *z1;       /* ZeRO-1 (dpar_graph_zero1), NULL: off */
    struct dpar__gpipe *pp;     /* pipeline (dpar_graph_pipeline), NULL: off */
    int stage_now;              /* pipelines, building: the stage of new op nodes */
    int *mb_now;                /* pipelines, running: [nlocal] the micro-batch (buffer set) of each device */
    dpar_buffer **mb_slots;     /* pipelines: [((m - 1) * nslots + slot) * nlocal + li], sets m = 1..M-1 */
    bool *mb_owned;             /* [(m - 1) * nslots + slot]: the graph's buffers (not set 0's, shared) */
    int remat_seg;              /* segments begun so far (>>graph remat) */
    bool remat_open;            /* between dpar_graph_remat_begin and _end */
    int *rclone;                /* while the backward is built: [forward node] its recomputed copy, 0 none yet */
    int rupto;                  /* the forward nodes are 1..rupto-1 */
    struct dpar__gprog *prog;   /* [nlocal] recorded command buffers (>>graph program), NULL: op by op */
    struct dpar__gstage *stage; /* staged feeds (>>graph feeds), NULL: none put yet */
    dpar_buffer **feed_take;    /* the running step's staged shards [feed * nlocal + li], NULL: none */
    dpar_buffer *loss_log;      /* dpar_graph_log_losses: the ring of losses on device first, NULL: off */
    int64_t losses_logged;      /* runs logged into it; run r in slot r % its count */
};
static bool dpar__g_pipe_inputs(dpar_graph *g, int nin, const int *in); /* >>graph zero1-pipe */
static bool dpar__g_pipe_feed(dpar_graph *g, int id, const char *name);

/* ---- building: validity, errors, nodes ---- */
/* A node's kind as printed graphs and errors name it: the optimizer node
   (DPAR__G_SGD, one kind for every optimizer) by the optimizer the graph
   was given, "sgd", "adamw" or "adamw_masked" (a decay mask). */
static const char *dpar__g_kind_name(const dpar_graph *g, const dpar__gnode *nd) {
    if (nd->kind != DPAR__G_SGD || !g->opt.adamw) return dpar__g_kinds[nd->kind].name;
    return g->opt.decay ? "adamw_masked" : "adamw";
}
static const char *dpar__g_label(const dpar_graph *g, int id, char *buf, size_t cap) {
    const dpar__gnode *nd = &g->n[id];
    if (nd->name[0])
        snprintf(buf, cap, "node %d '%s' (%s)", id, nd->name, dpar__g_kind_name(g, nd));
    else
        snprintf(buf, cap, "node %d (%s)", id, dpar__g_kind_name(g, nd));
    return buf;
}
/* A node of a run failed with s: the last error becomes "dpar_graph_run:
   <node>: <the node's error>", without a second "dpar_graph_run: " where
   the node's error (the optimizer's clip norm, say) already starts so. */
static dpar_status dpar__g_node_err(const dpar_graph *g, dpar_status s, int id) {
    static const char run[] = "dpar_graph_run: ";
    const char *why = dpar_last_error();
    char l[96];
    if (!strncmp(why, run, sizeof run - 1)) why += sizeof run - 1;
    return dpar__err(s, "%s%s: %s", run, dpar__g_label(g, id, l, sizeof l), why);
}
static dpar_value dpar__gv(int id) {
    dpar_value v;
    v.id = id;
    return v;
}
/* Keeps the thread's error as the graph's first error (a later one does not replace it); returns s. */
static dpar_status dpar__g_keep(dpar_graph *g, dpar_status s) {
    if (g && !g->err) {
        g->err = s;
        memcpy(g->errtext, dpar__err_text, DPAR__ERR_LEN);
    }
    return s;
}
/* Records the graph's first error (and sets the thread's); returns the invalid value. */
static dpar_value dpar__g_fail(dpar_graph *g, dpar_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(DPAR__PRINTF_FMT, 3, 4)))
#endif
    ;
static dpar_value dpar__g_fail(dpar_graph *g, dpar_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dpar__err_vset(fmt, ap);
    va_end(ap);
    dpar__g_keep(g, s);
    return dpar__gv(0);
}
/* As dpar__g_fail, returning the status (for the calls that return one). */
static dpar_status dpar__g_err(dpar_graph *g, dpar_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(DPAR__PRINTF_FMT, 3, 4)))
#endif
    ;
static dpar_status dpar__g_err(dpar_graph *g, dpar_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dpar__err_vset(fmt, ap);
    va_end(ap);
    return dpar__g_keep(g, s);
}
static dpar_status dpar__g_status(const dpar_graph *g) {
    if (g->err) memcpy(dpar__err_text, g->errtext, DPAR__ERR_LEN);
    return g->err;
}
/* The status of a failed dpar__g_args (whose error text stays): NULL, stale, or the graph's first error. */
static dpar_status dpar__g_args_status(const dpar_graph *g) {
    if (!g) return DPAR_ERR_INVALID_ARGUMENT;
    if (!dpar__live_has(g)) return DPAR_ERR_STATE;
    return dpar__g_status(g);
}
/* Whether a builder may go on: g valid, no earlier error, every value of g. */
static bool dpar__g_args(dpar_graph *g, const char *fn, int n, const dpar_value *v) {
    if (!g) {
        dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: graph is NULL", fn);
        return false;
    }
    if (dpar__live_check(g, DPAR__LIVE_GRAPH, fn)) return false; /* stale: destroyed, or freed with its mesh */
    if (g->err) return false;
    if (g->compiled) {
        dpar__g_fail(g, DPAR_ERR_STATE, "%s: the graph is compiled; add nodes before dpar_graph_compile", fn);
        return false;
    }
    for (int i = 0; i < n; i++)
        if (v[i].id <= 0 || v[i].id >= g->count) {
            dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: argument %d (id %d) is not a value of this graph", fn,
                         i + 1, (int)v[i].id);
            return false;
        }
    return true;
}
static int dpar__g_remat_in(dpar_graph *g, int x);
static int dpar__g_push(dpar_graph *g, int kind, int nin, const int *in, dpar_dtype dt, int ndim,
                        const int64_t *shape) {
    int sub[5];
    if (g->rclone) { /* building the backward: it reads the recomputed copies of remat nodes */
        for (int i = 0; i < nin; i++) sub[i] = dpar__g_remat_in(g, in[i]);
        if (g->err) return 0;
        in = sub;
    }
    if (g->pp && !dpar__g_pipe_inputs(g, nin, in)) return 0;
    if (g->count == g->cap) {
        int cap = g->cap * 2;
        dpar__gnode *n = (dpar__gnode *)DPAR_REALLOC(g->n, (size_t)cap * sizeof *n);
        if (!n) {
            dpar__g_fail(g, DPAR_ERR_OUT_OF_MEMORY, "dpar graph: out of memory for node %d", g->count);
            return 0;
        }
        g->n = n;
        g->cap = cap;
    }
    int id = g->count++;
    dpar__gnode *nd = &g->n[id];
    memset(nd, 0, sizeof *nd);
    nd->kind = kind;
    nd->nin = nin;
    nd->dtype = dt;
    nd->ndim = ndim;
    nd->slot = -1;
    nd->stage = nin ? g->stage_now : -1;
    nd->remat = g->remat_open && nin > 0 ? g->remat_seg : 0;
    for (int d = 0; d < ndim; d++) nd->shape[d] = shape[d];
    for (int i = 0; i < nin; i++) {
        nd->in[i] = in[i];
        nd->vary |= g->n[in[i]].vary;
    }
    return id;
}
static int64_t dpar__g_count(const dpar__gnode *nd) {
    return dpar__prod(nd->shape, nd->ndim);
}
static const char *dpar__g_shape(const dpar__gnode *nd, char *buf, size_t cap) {
    return dpar__shape_str(buf, cap, nd->ndim, nd->shape);
}

static void dpar__g_free(void *self);
DPAR_API dpar_status dpar_graph_create(dpar_mesh *mesh, dpar_graph **out) {
    dpar__clear_error();
    if (out) *out = NULL;
    if (!mesh || !out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_create: mesh or out is NULL");
    if (dpar__live_check(mesh, DPAR__LIVE_MESH, "dpar_graph_create")) return DPAR_ERR_STATE;
    dpar_graph *g = (dpar_graph *)dpar__handle_alloc(sizeof *g);
    if (g) g->errtext = (char *)DPAR_MALLOC(DPAR__ERR_LEN);
    if (g) g->n = (dpar__gnode *)DPAR_MALLOC(64 * sizeof *g->n);
    if (!g || !g->errtext || !g->n) {
        if (g) DPAR_FREE(g->errtext);
        if (g) DPAR_FREE(g->n);
        DPAR_FREE(g);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_create: out of memory");
    }
    g->errtext[0] = 0;
    g->mesh = mesh;
    g->rt = mesh->rt;
    g->cap = 64;
    g->count = 1;
    memset(&g->n[0], 0, sizeof g->n[0]);
    g->gscale = 1.0f;
    dpar_runtime_local_devices(g->rt, &g->first, &g->nlocal);
    dpar_status s = dpar__live_add(g, DPAR__LIVE_GRAPH, mesh, DPAR__LIVE_MESH, dpar__g_free, "dpar_graph_create");
    if (s) {
        DPAR_FREE(g->errtext);
        DPAR_FREE(g->n);
        DPAR_FREE(g);
        return s;
    }
    *out = g;
    return DPAR_OK;
}

DPAR_API dpar_status dpar_graph_status(const dpar_graph *g) {
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_status: graph is NULL");
    if (dpar__live_check(g, DPAR__LIVE_GRAPH, "dpar_graph_status")) return DPAR_ERR_STATE;
    return dpar__g_status(g);
}

DPAR_API dpar_value dpar_g_name(dpar_graph *g, dpar_value v, const char *name) {
    if (!dpar__g_args(g, "dpar_g_name", 1, &v)) return dpar__gv(0);
    snprintf(g->n[v.id].name, DPAR_NAME_LEN, "%s", name ? name : "");
    return v;
}

DPAR_API dpar_status dpar_graph_value_shape(const dpar_graph *g, dpar_value v, dpar_dtype *dtype, int *ndim,
                                            int64_t *shape) {
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_value_shape", "the graph")) return DPAR_ERR_STATE;
    if (!g || v.id <= 0 || v.id >= g->count)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_value_shape: not a value of this graph");
    const dpar__gnode *nd = &g->n[v.id];
    if (dtype) *dtype = nd->dtype;
    if (ndim) *ndim = nd->ndim;
    if (shape)
        for (int d = 0; d < nd->ndim; d++) shape[d] = nd->shape[d];
    return DPAR_OK;
}

/* ---- leaves ---- */
/* The axes an array's spec splits over (what its shards vary over). */
static unsigned dpar__g_array_vary(const dpar_array *a) {
    unsigned m = 0;
    for (int d = 0; d < a->ndim; d++)
        for (int j = 0; j < a->spec_n[d]; j++) m |= 1u << a->spec_axes[d][j];
    return m;
}
static int dpar__g_leaf(dpar_graph *g, int kind, const char *name, dpar_array *a) {
    int64_t sh[DPAR_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) sh[d] = a->local[d];
    int id = dpar__g_push(g, kind, 0, NULL, a->dtype, a->ndim, sh);
    if (!id) return 0;
    g->n[id].array = a;
    g->n[id].vary = dpar__g_array_vary(a);
    snprintf(g->n[id].name, DPAR_NAME_LEN, "%s", name ? name : "");
    return id;
}
DPAR_API dpar_value dpar_g_feed(dpar_graph *g, const char *name, const dpar_array_desc *desc) {
    if (!dpar__g_args(g, "dpar_g_feed", 0, NULL)) return dpar__gv(0);
    if (!desc) return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "dpar_g_feed: feed '%s': desc is NULL", name);
    dpar_array *a = NULL;
    dpar_status s = dpar_array_create(g->mesh, desc, &a);
    if (s) return dpar__g_fail(g, s, "dpar_g_feed: feed '%s': %s", name ? name : "", dpar_last_error());
    int id = dpar__g_leaf(g, DPAR__G_FEED, name, a);
    if (id && g->pp && !dpar__g_pipe_feed(g, id, name)) id = 0; /* the graph destroys a */
    if (!id && !(g->count > 1 && g->n[g->count - 1].array == a)) dpar_array_destroy(a);
    return dpar__gv(id);
}
DPAR_API dpar_value dpar_g_param(dpar_graph *g, const char *name, dpar_array *a) {
    if (!dpar__g_args(g, "dpar_g_param", 0, NULL)) return dpar__gv(0);
    if (!a) return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "dpar_g_param: param '%s': array is NULL", name);
    if (dpar__live_arg(a, DPAR__LIVE_ARRAY, "dpar_g_param", "the array"))
        return dpar__g_fail(g, DPAR_ERR_STATE, "%s", dpar_last_error());
    if (a->mesh != g->mesh)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT,
                            "dpar_g_param: param '%s' is an array of another mesh; create it on the graph's mesh",
                            name ? name : "");
    return dpar__gv(dpar__g_leaf(g, DPAR__G_PARAM, name, a));
}
DPAR_API dpar_value dpar_g_const(dpar_graph *g, dpar_dtype dtype, int ndim, const int64_t *shape, float value) {
    if (!dpar__g_args(g, "dpar_g_const", 0, NULL)) return dpar__gv(0);
    dpar_status s = dpar__check_shape("dpar_g_const", ndim, shape);
    if (!s && (int)dtype >= (int)DPAR_DTYPE_COUNT)
        s = dpar__err(DPAR_ERR_DTYPE, "dpar_g_const: dtype %d is not a dpar_dtype", (int)dtype);
    if (s) return dpar__g_fail(g, s, "%s", dpar_last_error());
    int id = dpar__g_push(g, DPAR__G_CONST, 0, NULL, dtype, ndim, shape);
    if (id) g->n[id].fp = value;
    if (id) g->n[id].is_one = value == 1.0f && (dtype == DPAR_F32 || dtype == DPAR_F64);
    return dpar__gv(id);
}

/* ---- ops: shape and dtype rules ---- */
/* The ops of the >>f64 api table in graphs: inputs all f32, or all f64 (a cpu graph; feeds and params of
   another backend cannot be f64). The node then computes in the inputs' dtype; a mixed node's error
   names the node, both inputs and both dtypes. */
static bool dpar__g_float(dpar_graph *g, const char *fn, int n, const dpar_value *v) {
    char l[96], l0[96];
    dpar_dtype t = n > 0 ? g->n[v[0].id].dtype : DPAR_F32;
    if (t != DPAR_F32 && t != DPAR_F64) {
        dpar__g_fail(g, DPAR_ERR_DTYPE,
                     "%s: input %s is %s; this op takes f32 (or f64 on the cpu backend; cast it "
                     "with dpar_g_cast)",
                     fn, dpar__g_label(g, v[0].id, l, sizeof l), dpar_dtype_name(t));
        return false;
    }
    for (int i = 1; i < n; i++)
        if (g->n[v[i].id].dtype != t) {
            dpar__g_fail(g, DPAR_ERR_DTYPE,
                         "%s: input %s is %s but %s is %s; the inputs share f32 or f64 (cast with "
                         "dpar_g_cast)",
                         fn, dpar__g_label(g, v[i].id, l, sizeof l), dpar_dtype_name(g->n[v[i].id].dtype),
                         dpar__g_label(g, v[0].id, l0, sizeof l0), dpar_dtype_name(t));
            return false;
        }
    return true;
}
static bool dpar__g_same(dpar_graph *g, const char *fn, dpar_value a, dpar_value b) {
    const dpar__gnode *x = &g->n[a.id], *y = &g->n[b.id];
    bool same = x->ndim == y->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == y->shape[d];
    if (same) return true;
    char s1[160], s2[160], l1[96], l2[96];
    dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: %s is %s but %s is %s; they must have the same shape", fn,
                 dpar__g_label(g, a.id, l1, sizeof l1), dpar__g_shape(x, s1, sizeof s1),
                 dpar__g_label(g, b.id, l2, sizeof l2), dpar__g_shape(y, s2, sizeof s2));
    return false;
}
/* A node of `kind` on inputs v[0..n-1] with the shape and dtype of node `like`. */
static dpar_value dpar__g_make(dpar_graph *g, int kind, int n, const dpar_value *v, int like) {
    int in[5];
    for (int i = 0; i < n; i++) in[i] = v[i].id;
    int64_t sh[DPAR_MAX_DIMS];
    const dpar__gnode *x = &g->n[like];
    memcpy(sh, x->shape, sizeof sh);
    return dpar__gv(dpar__g_push(g, kind, n, in, x->dtype, x->ndim, sh));
}
/* ... with the shape and dtype of v[0]. */
static dpar_value dpar__g_like(dpar_graph *g, int kind, int n, const dpar_value *v) {
    return dpar__g_make(g, kind, n, v, v[0].id);
}
static dpar_value dpar__g_scalar(dpar_graph *g, int kind, int n, const dpar_value *v) {
    int in[4];
    for (int i = 0; i < n; i++) in[i] = v[i].id;
    return dpar__gv(dpar__g_push(g, kind, n, in, g->n[v[0].id].dtype == DPAR_F64 ? DPAR_F64 : DPAR_F32, 0, NULL));
}

DPAR_API dpar_value dpar_g_matmul(dpar_graph *g, dpar_value a, dpar_value b, bool trans_a, bool trans_b) {
    const char *fn = "dpar_g_matmul";
    dpar_value v[2] = { a, b };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 2, v)) return dpar__gv(0);
    const dpar__gnode *x = &g->n[a.id], *y = &g->n[b.id];
    char s1[160], s2[160], l1[96], l2[96];
    if (x->ndim != 2 || y->ndim != 2 || x->shape[trans_a ? 0 : 1] != y->shape[trans_b ? 1 : 0])
        return dpar__g_fail(
            g, DPAR_ERR_SHAPE, "%s: %s %s%s and %s %s%s: need 2-d operands whose inner dimensions agree", fn,
            dpar__g_label(g, a.id, l1, sizeof l1), dpar__g_shape(x, s1, sizeof s1), trans_a ? "^T" : "",
            dpar__g_label(g, b.id, l2, sizeof l2), dpar__g_shape(y, s2, sizeof s2), trans_b ? "^T" : "");
    int64_t sh[2] = { x->shape[trans_a ? 1 : 0], y->shape[trans_b ? 0 : 1] };
    int in[2] = { a.id, b.id };
    int id = dpar__g_push(g, DPAR__G_MATMUL, 2, in, x->dtype, 2, sh);
    if (id) g->n[id].ip[0] = trans_a, g->n[id].ip[1] = trans_b;
    return dpar__gv(id);
}
DPAR_API dpar_value dpar_g_bias_add(dpar_graph *g, dpar_value x, dpar_value b) {
    const char *fn = "dpar_g_bias_add";
    dpar_value v[2] = { x, b };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 2, v)) return dpar__gv(0);
    const dpar__gnode *xn = &g->n[x.id], *bn = &g->n[b.id];
    if (xn->ndim < 1 || bn->ndim != 1 || bn->shape[0] != xn->shape[xn->ndim - 1]) {
        char s1[160], s2[160], l1[96], l2[96];
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: bias %s %s must be 1-d with the size of the last dim of %s %s", fn,
                            dpar__g_label(g, b.id, l2, sizeof l2), dpar__g_shape(bn, s2, sizeof s2),
                            dpar__g_label(g, x.id, l1, sizeof l1), dpar__g_shape(xn, s1, sizeof s1));
    }
    return dpar__g_like(g, DPAR__G_BIAS_ADD, 2, v);
}
DPAR_API dpar_value dpar_g_relu(dpar_graph *g, dpar_value x) {
    if (!dpar__g_args(g, "dpar_g_relu", 1, &x) || !dpar__g_float(g, "dpar_g_relu", 1, &x)) return dpar__gv(0);
    return dpar__g_like(g, DPAR__G_RELU, 1, &x);
}
DPAR_API dpar_value dpar_g_softmax_xent(dpar_graph *g, dpar_value logits, dpar_value labels) {
    const char *fn = "dpar_g_softmax_xent";
    dpar_value v[2] = { logits, labels };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 1, v)) return dpar__gv(0);
    const dpar__gnode *z = &g->n[logits.id], *y = &g->n[labels.id];
    char s1[160], s2[160], l1[96], l2[96];
    if (y->dtype != DPAR_I32)
        return dpar__g_fail(g, DPAR_ERR_DTYPE, "%s: labels %s are %s; they must be i32 class indices", fn,
                            dpar__g_label(g, labels.id, l2, sizeof l2), dpar_dtype_name(y->dtype));
    if (z->ndim != 2 || dpar__g_count(y) != z->shape[0])
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: logits %s %s must be [M,C] and labels %s %s hold M values", fn,
                            dpar__g_label(g, logits.id, l1, sizeof l1), dpar__g_shape(z, s1, sizeof s1),
                            dpar__g_label(g, labels.id, l2, sizeof l2), dpar__g_shape(y, s2, sizeof s2));
    return dpar__g_scalar(g, DPAR__G_XENT, 2, v);
}
DPAR_API dpar_value dpar_g_mse(dpar_graph *g, dpar_value pred, dpar_value target) {
    dpar_value v[2] = { pred, target };
    if (!dpar__g_args(g, "dpar_g_mse", 2, v) || !dpar__g_float(g, "dpar_g_mse", 2, v) ||
        !dpar__g_same(g, "dpar_g_mse", pred, target))
        return dpar__gv(0);
    return dpar__g_scalar(g, DPAR__G_MSE, 2, v);
}
DPAR_API dpar_value dpar_g_add(dpar_graph *g, dpar_value a, dpar_value b) {
    dpar_value v[2] = { a, b };
    if (!dpar__g_args(g, "dpar_g_add", 2, v) || !dpar__g_float(g, "dpar_g_add", 2, v) ||
        !dpar__g_same(g, "dpar_g_add", a, b))
        return dpar__gv(0);
    return dpar__g_like(g, DPAR__G_ADD, 2, v);
}
DPAR_API dpar_value dpar_g_scale(dpar_graph *g, dpar_value x, float alpha) {
    if (!dpar__g_args(g, "dpar_g_scale", 1, &x) || !dpar__g_float(g, "dpar_g_scale", 1, &x)) return dpar__gv(0);
    dpar_value r = dpar__g_like(g, DPAR__G_SCALE, 1, &x);
    if (r.id) g->n[r.id].fp = alpha;
    return r;
}
DPAR_API dpar_value dpar_g_mul_scalar(dpar_graph *g, dpar_value s, dpar_value x) {
    const char *fn = "dpar_g_mul_scalar";
    dpar_value v[2] = { s, x };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 2, v)) return dpar__gv(0);
    if (dpar__g_count(&g->n[s.id]) != 1) {
        char s1[160], l1[96];
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: the scalar %s is %s; it must hold one element", fn,
                            dpar__g_label(g, s.id, l1, sizeof l1), dpar__g_shape(&g->n[s.id], s1, sizeof s1));
    }
    return dpar__g_make(g, DPAR__G_MULS, 2, v, x.id);
}
DPAR_API dpar_value dpar_g_sum(dpar_graph *g, dpar_value x) {
    if (!dpar__g_args(g, "dpar_g_sum", 1, &x) || !dpar__g_float(g, "dpar_g_sum", 1, &x)) return dpar__gv(0);
    return dpar__g_scalar(g, DPAR__G_SUM, 1, &x);
}
DPAR_API dpar_value dpar_g_sum_squares(dpar_graph *g, dpar_value x) {
    if (!dpar__g_args(g, "dpar_g_sum_squares", 1, &x) || !dpar__g_float(g, "dpar_g_sum_squares", 1, &x))
        return dpar__gv(0);
    return dpar__g_scalar(g, DPAR__G_SUMSQ, 1, &x);
}
DPAR_API dpar_value dpar_g_dot(dpar_graph *g, dpar_value a, dpar_value b) {
    const char *fn = "dpar_g_dot";
    dpar_value v[2] = { a, b };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 2, v)) return dpar__gv(0);
    if (dpar__g_count(&g->n[a.id]) != dpar__g_count(&g->n[b.id])) {
        char s1[160], s2[160], l1[96], l2[96];
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: %s %s and %s %s must have the same element count", fn,
                            dpar__g_label(g, a.id, l1, sizeof l1), dpar__g_shape(&g->n[a.id], s1, sizeof s1),
                            dpar__g_label(g, b.id, l2, sizeof l2), dpar__g_shape(&g->n[b.id], s2, sizeof s2));
    }
    return dpar__g_scalar(g, DPAR__G_DOT, 2, v);
}
DPAR_API dpar_value dpar_g_cast(dpar_graph *g, dpar_value x, dpar_dtype dtype) {
    if (!dpar__g_args(g, "dpar_g_cast", 1, &x)) return dpar__gv(0);
    if ((int)dtype < 0 || (int)dtype >= (int)DPAR_DTYPE_COUNT)
        return dpar__g_fail(g, DPAR_ERR_DTYPE, "dpar_g_cast: dtype %d is not a dpar_dtype", (int)dtype);
    dpar_value r = dpar__g_like(g, DPAR__G_CAST, 1, &x);
    if (r.id) g->n[r.id].dtype = dtype;
    return r;
}
DPAR_API dpar_value dpar_g_reshape(dpar_graph *g, dpar_value x, int ndim, const int64_t *shape) {
    if (!dpar__g_args(g, "dpar_g_reshape", 1, &x)) return dpar__gv(0);
    dpar_status s = dpar__check_shape("dpar_g_reshape", ndim, shape);
    if (s) return dpar__g_fail(g, s, "%s", dpar_last_error());
    if (dpar__prod(shape, ndim) != dpar__g_count(&g->n[x.id])) {
        char s1[160], s2[160], l1[96];
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "dpar_g_reshape: %s %s cannot become %s (element counts differ)",
                            dpar__g_label(g, x.id, l1, sizeof l1), dpar__g_shape(&g->n[x.id], s1, sizeof s1),
                            dpar__shape_str(s2, sizeof s2, ndim, shape));
    }
    int in[1] = { x.id };
    return dpar__gv(dpar__g_push(g, DPAR__G_COPY, 1, in, g->n[x.id].dtype, ndim, shape));
}

/* ---- collectives: axes, shapes, varying axes ---- */
static dpar_value dpar__g_coll(dpar_graph *g, int kind, dpar_value x, const char *axes) {
    const char *fn = dpar__g_kinds[kind].name;
    if (!dpar__g_args(g, fn, 1, &x)) return dpar__gv(0);
    unsigned mask = 0;
    dpar_status s = dpar__parse_axes(g->mesh, fn, axes, &mask, NULL, NULL);
    if (s) return dpar__g_fail(g, s, "dpar_g_%s", dpar_last_error());
    if (strlen(axes) >= sizeof g->n[0].axes_str)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "dpar_g_%s: axes \"%s\" too long", fn, axes);
    dpar_value r = dpar__g_like(g, kind, 1, &x);
    if (!r.id) return r;
    dpar__gnode *nd = &g->n[r.id];
    nd->axes = mask;
    snprintf(nd->axes_str, sizeof nd->axes_str, "%s", axes);
    bool reduce = kind == DPAR__G_PSUM || kind == DPAR__G_PMEAN || kind == DPAR__G_PMAX || kind == DPAR__G_PMIN ||
                  kind == DPAR__G_ALL_GATHER || kind == DPAR__G_PBROADCAST;
    nd->vary = reduce ? (g->n[x.id].vary & ~mask) : (g->n[x.id].vary | mask);
    return r;
}
static int dpar__g_group_size(const dpar_graph *g, unsigned mask) {
    return dpar__mask_size(g->mesh, mask);
}
DPAR_API dpar_value dpar_g_psum(dpar_graph *g, dpar_value x, const char *axes) {
    return dpar__g_coll(g, DPAR__G_PSUM, x, axes);
}
DPAR_API dpar_value dpar_g_pmean(dpar_graph *g, dpar_value x, const char *axes) {
    return dpar__g_coll(g, DPAR__G_PMEAN, x, axes);
}
DPAR_API dpar_value dpar_g_pmax(dpar_graph *g, dpar_value x, const char *axes) {
    return dpar__g_coll(g, DPAR__G_PMAX, x, axes);
}
DPAR_API dpar_value dpar_g_pmin(dpar_graph *g, dpar_value x, const char *axes) {
    return dpar__g_coll(g, DPAR__G_PMIN, x, axes);
}
DPAR_API dpar_value dpar_g_pcast(dpar_graph *g, dpar_value x, const char *axes) {
    return dpar__g_coll(g, DPAR__G_PCAST, x, axes);
}
/* Checks dim against x's rank (+extra) and gives the group size; 0 on error (recorded). */
static int dpar__g_coll_dim(dpar_graph *g, const char *fn, dpar_value r, int dim, int extra) {
    dpar__gnode *nd = &g->n[r.id];
    if (dim < 0 || dim >= nd->ndim + extra) {
        char l[96];
        dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: %s: dim %d is outside 0..%d", fn,
                     dpar__g_label(g, nd->in[0], l, sizeof l), dim, nd->ndim + extra - 1);
        return 0;
    }
    return dpar__g_group_size(g, nd->axes);
}
DPAR_API dpar_value dpar_g_all_gather(dpar_graph *g, dpar_value x, const char *axes, int dim, bool tiled) {
    dpar_value r = dpar__g_coll(g, DPAR__G_ALL_GATHER, x, axes);
    int n = r.id ? dpar__g_coll_dim(g, "dpar_g_all_gather", r, dim, tiled ? 0 : 1) : 0;
    if (!n) return dpar__gv(0);
    dpar__gnode *nd = &g->n[r.id];
    if (tiled) {
        nd->shape[dim] *= n;
    } else {
        if (nd->ndim == DPAR_MAX_DIMS)
            return dpar__g_fail(g, DPAR_ERR_SHAPE, "dpar_g_all_gather: stacking would exceed %d dims", DPAR_MAX_DIMS);
        for (int d = nd->ndim; d > dim; d--) nd->shape[d] = nd->shape[d - 1];
        nd->shape[dim] = n;
        nd->ndim++;
    }
    nd->ip[0] = dim, nd->ip[1] = tiled;
    return r;
}
DPAR_API dpar_value dpar_g_psum_scatter(dpar_graph *g, dpar_value x, const char *axes, int dim, bool tiled) {
    dpar_value r = dpar__g_coll(g, DPAR__G_PSUM_SCATTER, x, axes);
    int n = r.id ? dpar__g_coll_dim(g, "dpar_g_psum_scatter", r, dim, 0) : 0;
    if (!n) return dpar__gv(0);
    dpar__gnode *nd = &g->n[r.id];
    char s1[160];
    if ((tiled && nd->shape[dim] % n) || (!tiled && nd->shape[dim] != n))
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "dpar_g_psum_scatter: dim %d of %s is %lld; it must be %s %d", dim,
                            dpar__g_shape(nd, s1, sizeof s1), (long long)nd->shape[dim],
                            tiled ? "a multiple of the group size" : "the group size", n);
    if (tiled) {
        nd->shape[dim] /= n;
    } else {
        for (int d = dim; d + 1 < nd->ndim; d++) nd->shape[d] = nd->shape[d + 1];
        nd->ndim--;
    }
    nd->ip[0] = dim, nd->ip[1] = tiled;
    return r;
}
DPAR_API dpar_value dpar_g_ppermute(dpar_graph *g, dpar_value x, const char *axes, const int *pairs, int num_pairs) {
    dpar_value r = dpar__g_coll(g, DPAR__G_PPERMUTE, x, axes);
    if (!r.id) return r;
    if (num_pairs < 0 || (num_pairs && !pairs))
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "dpar_g_ppermute: %d pairs and pairs %s", num_pairs,
                            pairs ? "given" : "NULL");
    int n = dpar__g_group_size(g, g->n[r.id].axes);
    for (int i = 0; i < 2 * num_pairs; i++)
        if (pairs[i] < 0 || pairs[i] >= n)
            return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT,
                                "dpar_g_ppermute: pair %d names position %d; the group over \"%s\" has %d members",
                                i / 2, pairs[i], axes, n);
    int *p = (int *)DPAR_MALLOC((size_t)(2 * num_pairs + 1) * sizeof(int));
    if (!p) return dpar__g_fail(g, DPAR_ERR_OUT_OF_MEMORY, "dpar_g_ppermute: out of memory");
    if (num_pairs) memcpy(p, pairs, (size_t)(2 * num_pairs) * sizeof(int));
    g->n[r.id].pairs = p;
    g->n[r.id].npairs = num_pairs;
    return r;
}
DPAR_API dpar_value dpar_g_all_to_all(dpar_graph *g, dpar_value x, const char *axes, int split_dim, int concat_dim) {
    dpar_value r = dpar__g_coll(g, DPAR__G_ALL_TO_ALL, x, axes);
    int n = r.id ? dpar__g_coll_dim(g, "dpar_g_all_to_all", r, split_dim, 0) : 0;
    if (n) n = dpar__g_coll_dim(g, "dpar_g_all_to_all", r, concat_dim, 0);
    if (!n) return dpar__gv(0);
    dpar__gnode *nd = &g->n[r.id];
    char s1[160];
    if (nd->shape[split_dim] % n)
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "dpar_g_all_to_all: split dim %d of %s is not divisible by %d",
                            split_dim, dpar__g_shape(nd, s1, sizeof s1), n);
    nd->shape[split_dim] /= n;
    nd->shape[concat_dim] *= n;
    nd->ip[0] = split_dim, nd->ip[1] = concat_dim;
    return r;
}
DPAR_API dpar_value dpar_g_pbroadcast(dpar_graph *g, dpar_value x, const char *axes, int root) {
    dpar_value r = dpar__g_coll(g, DPAR__G_PBROADCAST, x, axes);
    if (!r.id) return r;
    int n = dpar__g_group_size(g, g->n[r.id].axes);
    if (root < 0 || root >= n)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "dpar_g_pbroadcast: root %d is outside 0..%d", root, n - 1);
    g->n[r.id].ip[0] = root;
    return r;
}
/* Internal transposes: this member's block of an all_gather output / the root's copy of x. */
static dpar_value dpar__g_block(dpar_graph *g, dpar_value ct, const dpar__gnode *ag) {
    dpar_value r = dpar__g_like(g, DPAR__G_BLOCK, 1, &ct);
    if (!r.id) return r;
    dpar__gnode *nd = &g->n[r.id], *x = &g->n[ag->in[0]];
    nd->ndim = x->ndim;
    memcpy(nd->shape, x->shape, sizeof nd->shape);
    nd->axes = ag->axes;
    memcpy(nd->axes_str, ag->axes_str, sizeof nd->axes_str);
    nd->ip[0] = ag->ip[0], nd->ip[1] = ag->ip[1];
    return r;
}
static dpar_value dpar__g_root_only(dpar_graph *g, dpar_value ct, const dpar__gnode *pb) {
    dpar_value r = dpar__g_like(g, DPAR__G_ROOT_ONLY, 1, &ct);
    if (!r.id) return r;
    dpar__gnode *nd = &g->n[r.id];
    nd->axes = pb->axes;
    memcpy(nd->axes_str, pb->axes_str, sizeof nd->axes_str);
    nd->ip[0] = pb->ip[0];
    nd->vary |= pb->axes;
    return r;
}

/* >>graph elementwise ===========================================================
   Graph nodes of the elementwise family (>>elementwise ops), each lowered to
   its eager op; the gradient rules are in dpar__g_grad_elem. */
#define DPAR__G_ELEM_CASES     \
    case DPAR__G_UNARY:        \
    case DPAR__G_UNARY_GRAD:   \
    case DPAR__G_BINARY:       \
    case DPAR__G_BINARY_GRAD:  \
    case DPAR__G_WHERE:        \
    case DPAR__G_WHERE_GRAD:   \
    case DPAR__G_REDUCE:       \
    case DPAR__G_REDUCE_GRAD:  \
    case DPAR__G_SOFTMAX:      \
    case DPAR__G_SOFTMAX_GRAD: \
    case DPAR__G_TRANSPOSE:    \
    case DPAR__G_BROADCAST:    \
    case DPAR__G_SLICE:        \
    case DPAR__G_SLICE_GRAD:   \
    case DPAR__G_PAD:          \
    case DPAR__G_CONCAT
static dpar_buffer *dpar__g_buf(const dpar_graph *g, int id, int li);
static dpar_value dpar__g_node(dpar_graph *g, int kind, int n, const int *in, dpar_dtype dt, int ndim,
                               const int64_t *shape) {
    return dpar__gv(dpar__g_push(g, kind, n, in, dt, ndim, shape));
}
/* NumPy broadcast of the shapes of a and b into sh (the rank into *nd); false when they do not broadcast */
static bool dpar__g_bcast_shape(const dpar__gnode *a, const dpar__gnode *b, int *nd, int64_t *sh) {
    *nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < *nd; i++) {
        int ia = i - (*nd - a->ndim), ib = i - (*nd - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        sh[i] = da == 1 ? db : da;
    }
    return true;
}
static dpar_value dpar__g_bcast_fail(dpar_graph *g, const char *fn, dpar_value a, dpar_value b) {
    char s1[160], s2[160], l1[96], l2[96];
    return dpar__g_fail(g, DPAR_ERR_SHAPE,
                        "%s: %s %s and %s %s do not broadcast (NumPy rules: trailing dims equal or 1)", fn,
                        dpar__g_label(g, a.id, l1, sizeof l1), dpar__g_shape(&g->n[a.id], s1, sizeof s1),
                        dpar__g_label(g, b.id, l2, sizeof l2), dpar__g_shape(&g->n[b.id], s2, sizeof s2));
}
DPAR_API dpar_value dpar_g_unary(dpar_graph *g, dpar_value x, dpar_unary_op op, float s) {
    const char *fn = "dpar_g_unary";
    if (!dpar__g_args(g, fn, 1, &x) || !dpar__g_float(g, fn, 1, &x)) return dpar__gv(0);
    if ((int)op < 0 || op >= DPAR_UNARY_COUNT)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: op %d is not a dpar_unary_op", fn, (int)op);
    dpar_value r = dpar__g_like(g, DPAR__G_UNARY, 1, &x);
    if (r.id) g->n[r.id].ip[0] = (int)op, g->n[r.id].fp = s;
    return r;
}
DPAR_API dpar_value dpar_g_binary(dpar_graph *g, dpar_value a, dpar_value b, dpar_binary_op op) {
    const char *fn = "dpar_g_binary";
    dpar_value v[2] = { a, b };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 2, v)) return dpar__gv(0);
    if ((int)op < 0 || op >= DPAR_BINARY_COUNT)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: op %d is not a dpar_binary_op", fn, (int)op);
    int nd, in[2] = { a.id, b.id };
    int64_t sh[DPAR_MAX_DIMS];
    if (!dpar__g_bcast_shape(&g->n[a.id], &g->n[b.id], &nd, sh)) return dpar__g_bcast_fail(g, fn, a, b);
    dpar_value r = dpar__g_node(g, DPAR__G_BINARY, 2, in, g->n[a.id].dtype, nd, sh);
    if (r.id) g->n[r.id].ip[0] = (int)op;
    return r;
}
DPAR_API dpar_value dpar_g_where(dpar_graph *g, dpar_value cond, dpar_value a, dpar_value b) {
    const char *fn = "dpar_g_where";
    dpar_value v[3] = { cond, a, b };
    if (!dpar__g_args(g, fn, 3, v) || !dpar__g_float(g, fn, 2, v + 1)) return dpar__gv(0);
    dpar_dtype t = g->n[a.id].dtype; /* f32, or f64 (cond then f64 or i32, as the eager op) */
    if (g->n[cond.id].dtype != t && g->n[cond.id].dtype != DPAR_I32)
        return dpar__g_fail(g, DPAR_ERR_DTYPE, "%s: cond is %s and a, b are %s; cond must be %s or i32", fn,
                            dpar_dtype_name(g->n[cond.id].dtype), dpar_dtype_name(t), dpar_dtype_name(t));
    int nd, nd2, in[3] = { cond.id, a.id, b.id };
    int64_t sh[DPAR_MAX_DIMS], sh2[DPAR_MAX_DIMS];
    if (!dpar__g_bcast_shape(&g->n[a.id], &g->n[b.id], &nd, sh)) return dpar__g_bcast_fail(g, fn, a, b);
    dpar_value r = dpar__g_node(g, DPAR__G_WHERE, 3, in, t, nd, sh);
    if (r.id && !dpar__g_bcast_shape(&g->n[cond.id], &g->n[r.id], &nd2, sh2)) return dpar__g_bcast_fail(g, fn, cond, r);
    if (r.id && (nd2 != nd || memcmp(sh, sh2, sizeof(int64_t) * (size_t)nd)))
        return dpar__g_bcast_fail(g, fn, cond, r); /* cond may not grow the result */
    return r;
}
DPAR_API dpar_value dpar_g_reduce(dpar_graph *g, dpar_value x, dpar_reduce_kind kind, const int *axes, int naxes,
                                  bool keepdims) {
    const char *fn = "dpar_g_reduce";
    if (!dpar__g_args(g, fn, 1, &x) || !dpar__g_float(g, fn, 1, &x)) return dpar__gv(0);
    const dpar__gnode *xn = &g->n[x.id];
    unsigned mask;
    if ((int)kind < 0 || kind >= DPAR_REDUCE_KIND_COUNT)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: kind %d is not a dpar_reduce_kind", fn, (int)kind);
    dpar_status s = dpar__axes_mask(fn, xn->ndim, axes, naxes, &mask);
    if (s) return dpar__g_fail(g, s, "%s", dpar_last_error());
    int64_t sh[DPAR_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < xn->ndim; i++)
        if (!(mask >> i & 1u) || keepdims) sh[nd++] = mask >> i & 1u ? 1 : xn->shape[i];
    int in[1] = { x.id };
    dpar_value r = dpar__g_node(g, DPAR__G_REDUCE, 1, in, kind == DPAR_REDUCE_ARGMAX ? DPAR_I32 : xn->dtype, nd, sh);
    if (r.id) g->n[r.id].ip[0] = (int)kind, g->n[r.id].ip[1] = (int)mask;
    return r;
}
DPAR_API dpar_value dpar_g_softmax(dpar_graph *g, dpar_value x, bool log) {
    if (!dpar__g_args(g, "dpar_g_softmax", 1, &x) || !dpar__g_float(g, "dpar_g_softmax", 1, &x)) return dpar__gv(0);
    if (g->n[x.id].ndim < 1) return dpar__g_fail(g, DPAR_ERR_SHAPE, "dpar_g_softmax: x is a scalar; it needs an axis");
    dpar_value r = dpar__g_like(g, DPAR__G_SOFTMAX, 1, &x);
    if (r.id) g->n[r.id].ip[0] = log;
    return r;
}
DPAR_API dpar_value dpar_g_transpose(dpar_graph *g, dpar_value x, const int *perm) {
    const char *fn = "dpar_g_transpose";
    if (!dpar__g_args(g, fn, 1, &x)) return dpar__gv(0);
    const dpar__gnode *xn = &g->n[x.id];
    int64_t sh[DPAR_MAX_DIMS], p[DPAR_MAX_DIMS];
    unsigned seen = 0;
    for (int i = 0; i < xn->ndim; i++) {
        p[i] = perm ? perm[i] : xn->ndim - 1 - i;
        if (p[i] < 0 || p[i] >= xn->ndim || (seen >> p[i] & 1u))
            return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: perm[%d] = %lld; perm must hold each of 0..%d once",
                                fn, i, (long long)p[i], xn->ndim - 1);
        seen |= 1u << p[i];
        sh[i] = xn->shape[p[i]];
    }
    int in[1] = { x.id };
    dpar_value r = dpar__g_node(g, DPAR__G_TRANSPOSE, 1, in, xn->dtype, xn->ndim, sh);
    if (r.id) memcpy(g->n[r.id].lp, p, sizeof p);
    return r;
}
DPAR_API dpar_value dpar_g_broadcast_to(dpar_graph *g, dpar_value x, int ndim, const int64_t *shape) {
    const char *fn = "dpar_g_broadcast_to";
    if (!dpar__g_args(g, fn, 1, &x)) return dpar__gv(0);
    dpar_status s = dpar__check_shape(fn, ndim, shape);
    if (s) return dpar__g_fail(g, s, "%s", dpar_last_error());
    int in[1] = { x.id };
    dpar_value r = dpar__g_node(g, DPAR__G_BROADCAST, 1, in, g->n[x.id].dtype, ndim, shape);
    int nd;
    int64_t sh[DPAR_MAX_DIMS];
    if (r.id && (!dpar__g_bcast_shape(&g->n[x.id], &g->n[r.id], &nd, sh) || nd != ndim ||
                 memcmp(sh, shape, sizeof(int64_t) * (size_t)nd)))
        return dpar__g_bcast_fail(g, fn, x, r);
    return r;
}
/* x[start : : step] with `sizes` elements per axis (step NULL: 1) */
DPAR_API dpar_value dpar_g_slice(dpar_graph *g, dpar_value x, const int64_t *start, const int64_t *step,
                                 const int64_t *sizes) {
    const char *fn = "dpar_g_slice";
    if (!dpar__g_args(g, fn, 1, &x)) return dpar__gv(0);
    const dpar__gnode *xn = &g->n[x.id];
    if (xn->ndim > 0 && (!start || !sizes))
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: start or sizes is NULL", fn);
    for (int i = 0; i < xn->ndim; i++) {
        int64_t k = step ? step[i] : 1;
        if (!dpar__span_fits(xn->shape[i], start[i], sizes[i], k)) {
            char s1[160], l1[96];
            return dpar__g_fail(g, DPAR_ERR_SHAPE,
                                "%s: %s %s: axis %d: %lld elements from %lld in steps of %lld do not fit", fn,
                                dpar__g_label(g, x.id, l1, sizeof l1), dpar__g_shape(xn, s1, sizeof s1), i,
                                (long long)sizes[i], (long long)start[i], (long long)k);
        }
    }
    int in[1] = { x.id };
    dpar_value r = dpar__g_node(g, DPAR__G_SLICE, 1, in, xn->dtype, xn->ndim, sizes);
    for (int i = 0; r.id && i < g->n[r.id].ndim; i++)
        g->n[r.id].lp[i] = start[i], g->n[r.id].lp[DPAR_MAX_DIMS + i] = step ? step[i] : 1;
    return r;
}
/* x padded with `value`: lo[i] before and hi[i] after each axis (NULL: zeros) */
DPAR_API dpar_value dpar_g_pad(dpar_graph *g, dpar_value x, const int64_t *lo, const int64_t *hi, float value) {
    const char *fn = "dpar_g_pad";
    if (!dpar__g_args(g, fn, 1, &x)) return dpar__gv(0);
    const dpar__gnode *xn = &g->n[x.id];
    int64_t sh[DPAR_MAX_DIMS];
    for (int i = 0; i < xn->ndim; i++) {
        int64_t l = lo ? lo[i] : 0, h = hi ? hi[i] : 0;
        if (l < 0 || h < 0 || l > DPAR__MAX_DIM || h > DPAR__MAX_DIM)
            return dpar__g_fail(g, DPAR_ERR_SHAPE,
                                "%s: axis %d: padding %lld before, %lld after; each must be in 0..2^40", fn, i,
                                (long long)l, (long long)h);
        sh[i] = xn->shape[i] + l + h; /* <= 3 * 2^40: no overflow; dpar__check_shape bounds the count */
    }
    dpar_status s = dpar__check_shape(fn, xn->ndim, sh);
    if (s) return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s", dpar_last_error());
    int in[1] = { x.id };
    dpar_value r = dpar__g_node(g, DPAR__G_PAD, 1, in, xn->dtype, xn->ndim, sh);
    for (int i = 0; r.id && i < xn->ndim; i++) g->n[r.id].lp[i] = lo ? lo[i] : 0;
    if (r.id) g->n[r.id].fp = value;
    return r;
}
/* xs[0..n-1] (n <= 4) joined along axis */
DPAR_API dpar_value dpar_g_concat(dpar_graph *g, const dpar_value *xs, int n, int axis) {
    const char *fn = "dpar_g_concat";
    if (n < 1 || n > 4 || !xs)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: n = %d; a node joins 1..4 values (chain more)", fn, n);
    if (!dpar__g_args(g, fn, n, xs)) return dpar__gv(0);
    const dpar__gnode *x0 = &g->n[xs[0].id];
    int ax = axis < 0 ? axis + x0->ndim : axis, in[4];
    if (ax < 0 || ax >= x0->ndim)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: axis %d is out of range for %d dims", fn, axis,
                            x0->ndim);
    int64_t sh[DPAR_MAX_DIMS];
    memcpy(sh, x0->shape, sizeof sh);
    sh[ax] = 0;
    for (int k = 0; k < n; k++) {
        const dpar__gnode *xk = &g->n[xs[k].id];
        char s1[160], s2[160], l1[96], l2[96];
        if (xk->dtype != x0->dtype)
            return dpar__g_fail(g, DPAR_ERR_DTYPE,
                                "%s: %s is %s but %s is %s; the joined values share one dtype "
                                "(convert with dpar_g_cast)",
                                fn, dpar__g_label(g, xs[0].id, l1, sizeof l1), dpar_dtype_name(x0->dtype),
                                dpar__g_label(g, xs[k].id, l2, sizeof l2), dpar_dtype_name(xk->dtype));
        bool ok = xk->ndim == x0->ndim;
        for (int i = 0; ok && i < x0->ndim; i++) ok = i == ax || xk->shape[i] == x0->shape[i];
        if (!ok) {
            return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: %s %s and %s %s differ outside axis %d", fn,
                                dpar__g_label(g, xs[0].id, l1, sizeof l1), dpar__g_shape(x0, s1, sizeof s1),
                                dpar__g_label(g, xs[k].id, l2, sizeof l2), dpar__g_shape(xk, s2, sizeof s2), ax);
        }
        sh[ax] += xk->shape[ax];
        in[k] = xs[k].id;
    }
    dpar_value r = dpar__g_node(g, DPAR__G_CONCAT, n, in, x0->dtype, x0->ndim, sh);
    if (r.id) g->n[r.id].ip[0] = ax;
    return r;
}
/* v (of a broadcast shape) summed down to the shape of node `like` (the transpose of broadcasting) */
static dpar_value dpar__g_sum_to(dpar_graph *g, dpar_value v, int like) {
    const dpar__gnode *vn = &g->n[v.id], *ln = &g->n[like];
    int axes[DPAR_MAX_DIMS], na = 0, off = vn->ndim - ln->ndim;
    for (int i = 0; i < vn->ndim; i++)
        if (i < off || (ln->shape[i - off] == 1 && vn->shape[i] != 1)) axes[na++] = i;
    if (!na) return vn->ndim == ln->ndim ? v : dpar_g_reshape(g, v, ln->ndim, ln->shape);
    int64_t sh[DPAR_MAX_DIMS];
    memcpy(sh, ln->shape, sizeof sh);
    dpar_value r = dpar_g_reduce(g, v, DPAR_REDUCE_SUM, axes, na, false);
    return r.id ? dpar_g_reshape(g, r, g->n[like].ndim, sh) : r;
}
/* the forward lowering of the nodes above (y, a, b: the buffers of the node and its inputs 0, 1) */
static dpar_status dpar__g_exec_elem(const dpar_graph *g, int li, const dpar__gnode *nd, dpar_buffer *y, dpar_buffer *a,
                                     dpar_buffer *b) {
    dpar_buffer *c = nd->nin > 2 ? dpar__g_buf(g, nd->in[2], li) : NULL;
    int axes[DPAR_MAX_DIMS], na = 0, perm[DPAR_MAX_DIMS];
    for (int i = 0; i < DPAR_MAX_DIMS; i++)
        if ((unsigned)nd->ip[1] >> i & 1u) axes[na++] = i;
    switch (nd->kind) {
    case DPAR__G_UNARY: return dpar_unary(y, a, (dpar_unary_op)nd->ip[0], nd->fp);
    case DPAR__G_UNARY_GRAD: return dpar_unary_backward(y, a, b, (dpar_unary_op)nd->ip[0], nd->fp);
    case DPAR__G_BINARY: return dpar_binary(y, a, b, (dpar_binary_op)nd->ip[0]);
    case DPAR__G_BINARY_GRAD:
        return dpar_binary_backward(nd->ip[1] ? NULL : y, nd->ip[1] ? y : NULL, a, b, c, (dpar_binary_op)nd->ip[0]);
    case DPAR__G_WHERE: return dpar_where(y, a, b, c, 0.0f, 0.0f);
    case DPAR__G_WHERE_GRAD: /* inputs (ct, cond): ct where the side was chosen, else 0 */
        return nd->ip[1] ? dpar_where(y, b, NULL, a, 0.0f, 0.0f) : dpar_where(y, b, a, NULL, 0.0f, 0.0f);
    case DPAR__G_REDUCE: return dpar_reduce(y, a, (dpar_reduce_kind)nd->ip[0], axes, na);
    case DPAR__G_REDUCE_GRAD: return dpar_reduce_backward(y, a, b, (dpar_reduce_kind)nd->ip[0], axes, na);
    case DPAR__G_SOFTMAX: return dpar_softmax(y, a, nd->ip[0] != 0);
    case DPAR__G_SOFTMAX_GRAD: return dpar_softmax_backward(y, a, b, nd->ip[0] != 0);
    case DPAR__G_TRANSPOSE:
        for (int i = 0; i < nd->ndim; i++) perm[i] = (int)nd->lp[i];
        return dpar_transpose(y, a, perm);
    case DPAR__G_BROADCAST: return dpar_broadcast_to(y, a);
    case DPAR__G_SLICE: return dpar_slice(y, a, nd->lp, nd->lp + DPAR_MAX_DIMS);
    case DPAR__G_SLICE_GRAD: return dpar_slice_backward(y, a, nd->lp, nd->lp + DPAR_MAX_DIMS);
    case DPAR__G_PAD: return dpar_pad(y, a, nd->lp, nd->fp);
    default: { /* DPAR__G_CONCAT */
        const dpar_buffer *xs[4];
        for (int k = 0; k < nd->nin; k++) xs[k] = dpar__g_buf(g, nd->in[k], li);
        return dpar_concat(y, xs, nd->nin, nd->ip[0]);
    }
    }
}

/* ---- reverse mode ---- */
typedef struct dpar__gback {
    int *ct;      /* [count] accumulated cotangent of each node (0: none yet) */
    bool *needed; /* [count] node lies on a path from a wrt value */
    int *owner;   /* [count] the reduction node made for a contribution to this node (peephole) */
} dpar__gback;

/* Adds contribution c (as seen by a node whose inputs vary over `eff`) to
   node v's cotangent. What c varies over beyond v is psum'd away first: the
   transpose of the implicit pvary of v (a replicated weight used with a batch
   shard, an invariant value fed to a collective). */
static void dpar__g_contrib(dpar_graph *g, dpar__gback *bk, int v, unsigned eff, dpar_value c) {
    if (!c.id || !bk->needed[v]) return;
    unsigned extra = eff & ~g->n[v].vary;
    if (extra) {
        char axes[64] = "";
        size_t at = 0;
        for (int a = 0; a < g->mesh->ndim; a++)
            if (extra & (1u << a))
                at += (size_t)snprintf(axes + at, sizeof axes - at, at ? ",%s" : "%s", g->mesh->names[a]);
        c = dpar_g_psum(g, c, axes);
        if (!c.id) return;
        bk->owner[c.id] = v;
    }
    bk->ct[v] = bk->ct[v] ? dpar_g_add(g, dpar__gv(bk->ct[v]), c).id : c.id;
}
/* ct scaled by the device scalar s, unless s is the constant 1. */
static dpar_value dpar__g_times(dpar_graph *g, dpar_value s, dpar_value x) {
    return g->n[s.id].is_one ? x : dpar_g_mul_scalar(g, s, x);
}
/* >>graph norm-attn ===========================================================
   Graph nodes of layer_norm / rms_norm and the batched matmul (eager ops in
   >>layers-norm-attn). A norm is two nodes: NORM_STATS (x -> [rows, 2], filled
   by the NORM node's eager call, so its own lowering does nothing; the planner
   keeps it alive up to the backward) and NORM (x, w, stats[, b] -> y). Its
   backward is NORM_DX (ct, x, w, stats -> dx), NORM_DW (ct, x, stats -> dw)
   and the existing BIAS_GRAD for db. */
static dpar_buffer *dpar__g_buf(const dpar_graph *g, int id, int li);

static dpar_value dpar__g_norm(dpar_graph *g, const char *fn, int rms, dpar_value x, dpar_value w, dpar_value b,
                               float eps) {
    dpar_value v[3] = { x, w, b };
    int nv = b.id ? 3 : 2;
    if (!dpar__g_args(g, fn, nv, v) || !dpar__g_float(g, fn, nv, v)) return dpar__gv(0);
    int ndim = g->n[x.id].ndim;
    int64_t sh[DPAR_MAX_DIMS], st[2];
    memcpy(sh, g->n[x.id].shape, sizeof sh);
    for (int i = 1; i < nv; i++) {
        const dpar__gnode *pn = &g->n[v[i].id];
        if (ndim < 1 || pn->ndim != 1 || pn->shape[0] != sh[ndim - 1]) {
            char s1[160], s2[160], l1[96], l2[96];
            return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: %s %s must be 1-d with the size of the last dim of %s %s", fn,
                                dpar__g_label(g, v[i].id, l2, sizeof l2), dpar__g_shape(pn, s2, sizeof s2),
                                dpar__g_label(g, x.id, l1, sizeof l1), dpar__g_shape(&g->n[x.id], s1, sizeof s1));
        }
    }
    if (!(eps > 0.0f) || !isfinite(eps))
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: eps = %g; it must be a finite number > 0", fn,
                            (double)eps);
    st[0] = sh[ndim - 1] ? dpar__prod(sh, ndim) / sh[ndim - 1] : 0, st[1] = 2;
    int in[4] = { x.id, w.id, 0, b.id };
    dpar_dtype t = g->n[x.id].dtype; /* f32 or f64 (the f64 stats are f64 too) */
    in[2] = dpar__g_push(g, DPAR__G_NORM_STATS, 1, in, t, 2, st);
    int id = in[2] ? dpar__g_push(g, DPAR__G_NORM, nv + 1, in, t, ndim, sh) : 0;
    for (int k = 0; id && k < 2; k++) g->n[in[2] + k].ip[0] = rms, g->n[in[2] + k].fp = eps;
    return dpar__gv(id);
}
DPAR_API dpar_value dpar_g_layer_norm(dpar_graph *g, dpar_value x, dpar_value w, dpar_value b, float eps) {
    return dpar__g_norm(g, "dpar_g_layer_norm", 0, x, w, b, eps);
}
DPAR_API dpar_value dpar_g_rms_norm(dpar_graph *g, dpar_value x, dpar_value w, dpar_value b, float eps) {
    return dpar__g_norm(g, "dpar_g_rms_norm", 1, x, w, b, eps);
}
DPAR_API dpar_value dpar_g_matmul_batched(dpar_graph *g, dpar_value a, dpar_value b, bool trans_a, bool trans_b) {
    const char *fn = "dpar_g_matmul_batched";
    dpar_value v[2] = { a, b };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 2, v)) return dpar__gv(0);
    const dpar__gnode *x = &g->n[a.id], *y = &g->n[b.id];
    int r = x->ndim, ok = r >= 2 && (y->ndim == r || y->ndim == 2) && !(y->ndim == 2 && r > 2 && trans_a);
    for (int d = 0; ok && y->ndim == r && d + 2 < r; d++) ok = x->shape[d] == y->shape[d];
    ok = ok && x->shape[r - (trans_a ? 2 : 1)] == y->shape[y->ndim - (trans_b ? 1 : 2)];
    if (!ok) {
        char s1[160], s2[160], l1[96], l2[96];
        return dpar__g_fail(g, DPAR_ERR_SHAPE,
                            "%s: %s %s%s and %s %s%s: need [..., M, K] @ [..., K, N] with equal leading dims, or a "
                            "2-d right operand (then without trans_a)",
                            fn, dpar__g_label(g, a.id, l1, sizeof l1), dpar__g_shape(x, s1, sizeof s1),
                            trans_a ? "^T" : "", dpar__g_label(g, b.id, l2, sizeof l2), dpar__g_shape(y, s2, sizeof s2),
                            trans_b ? "^T" : "");
    }
    int64_t sh[DPAR_MAX_DIMS];
    memcpy(sh, x->shape, sizeof sh);
    sh[r - 2] = x->shape[r - (trans_a ? 1 : 2)];
    sh[r - 1] = y->shape[y->ndim - (trans_b ? 2 : 1)];
    int in[2] = { a.id, b.id };
    int id = dpar__g_push(g, DPAR__G_MATMUL_BATCHED, 2, in, x->dtype, r, sh);
    if (id) g->n[id].ip[0] = trans_a, g->n[id].ip[1] = trans_b;
    return dpar__gv(id);
}

DPAR_API dpar_value dpar_g_attention(dpar_graph *g, dpar_value q, dpar_value k, dpar_value v, float scale,
                                     bool causal) {
    const char *fn = "dpar_g_attention";
    dpar_value in3[3] = { q, k, v };
    if (!dpar__g_args(g, fn, 3, in3) || !dpar__g_float(g, fn, 3, in3)) return dpar__gv(0);
    const dpar__gnode *qn = &g->n[q.id], *kn = &g->n[k.id], *vn = &g->n[v.id];
    int r = qn->ndim, ok = r >= 2 && kn->ndim == r && vn->ndim == r;
    for (int d = 0; ok && d + 2 < r; d++) ok = kn->shape[d] == qn->shape[d] && vn->shape[d] == qn->shape[d];
    ok = ok && kn->shape[r - 1] == qn->shape[r - 1] && vn->shape[r - 2] == kn->shape[r - 2] &&
         (!causal || qn->shape[r - 2] == kn->shape[r - 2]);
    if (!ok || !(scale >= 0.0f) || !isfinite(scale)) {
        char s1[160], s2[160], s3[160];
        return dpar__g_fail(g, ok ? DPAR_ERR_INVALID_ARGUMENT : DPAR_ERR_SHAPE,
                            "%s: q %s, k %s, v %s, scale %g%s; need q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] "
                            "with equal leading dims (Tq == Tk when causal) and scale >= 0",
                            fn, dpar__g_shape(qn, s1, sizeof s1), dpar__g_shape(kn, s2, sizeof s2),
                            dpar__g_shape(vn, s3, sizeof s3), (double)scale, causal ? ", causal" : "");
    }
    int64_t sh[DPAR_MAX_DIMS], st[2] = { dpar__g_count(qn) / (qn->shape[r - 1] ? qn->shape[r - 1] : 1), 2 };
    if (!qn->shape[r - 1]) st[0] = dpar__prod(qn->shape, r - 1);
    memcpy(sh, qn->shape, sizeof sh);
    sh[r - 1] = vn->shape[r - 1];
    int in[4] = { q.id, k.id, v.id, 0 };
    dpar_dtype t = qn->dtype; /* f32 or f64 (the f64 stats are f64 too) */
    in[3] = dpar__g_push(g, DPAR__G_ATTN_STATS, 1, in, t, 2, st);
    int id = in[3] ? dpar__g_push(g, DPAR__G_ATTN, 4, in, t, r, sh) : 0;
    for (int j = 0; id && j < 2; j++) g->n[in[3] + j].ip[0] = causal, g->n[in[3] + j].fp = scale;
    return dpar__gv(id);
}

/* the lowering of the kinds above (dpar__g_exec) */
static dpar_status dpar__g_exec_norm_attn(const dpar_graph *g, const dpar__gnode *nd, int li, dpar_buffer *y) {
    dpar_buffer *in[5] = { NULL, NULL, NULL, NULL, NULL };
    for (int j = 0; j < nd->nin; j++) in[j] = dpar__g_buf(g, nd->in[j], li);
    int rms = nd->ip[0];
    bool causal = nd->ip[0] != 0;
    switch (nd->kind) {
    case DPAR__G_NORM_STATS:
    case DPAR__G_ATTN_STATS: return DPAR_OK; /* filled by the NORM / ATTN node */
    case DPAR__G_ATTN: return dpar_attention(y, in[3], in[0], in[1], in[2], nd->fp, causal);
    case DPAR__G_ATTN_DQ: /* dout, q, k, v, stats (the backward rewrites its D column, the same each time) */
    case DPAR__G_ATTN_DK:
    case DPAR__G_ATTN_DV: { /* this node's gradient and those fused into it (dpar__g_fuse_attn) */
        dpar_buffer *d[3] = { NULL, NULL, NULL };
        d[nd->kind - DPAR__G_ATTN_DQ] = y;
        if (nd->fused > 0) d[g->n[nd->fused].kind - DPAR__G_ATTN_DQ] = dpar__g_buf(g, nd->fused, li);
        if (nd->fused2 > 0) d[g->n[nd->fused2].kind - DPAR__G_ATTN_DQ] = dpar__g_buf(g, nd->fused2, li);
        return dpar_attention_backward(d[0], d[1], d[2], in[4], in[0], in[1], in[2], in[3], nd->fp, causal);
    }
    case DPAR__G_NORM:
        return rms ? dpar_rms_norm(y, in[2], in[0], in[1], in[3], nd->fp)
                   : dpar_layer_norm(y, in[2], in[0], in[1], in[3], nd->fp);
    case DPAR__G_NORM_DX: /* ct, x, w, stats */
        return rms ? dpar_rms_norm_backward(y, NULL, NULL, in[0], in[1], in[2], in[3])
                   : dpar_layer_norm_backward(y, NULL, NULL, in[0], in[1], in[2], in[3]);
    case DPAR__G_NORM_DW: /* ct, x, stats */
        return rms ? dpar_rms_norm_backward(NULL, y, NULL, in[0], in[1], NULL, in[2])
                   : dpar_layer_norm_backward(NULL, y, NULL, in[0], in[1], NULL, in[2]);
    default: /* DPAR__G_MATMUL_BATCHED */
        return dpar_matmul_batched(y, in[0], in[1], nd->ip[0] != 0, nd->ip[1] != 0, 1.0f, 0.0f);
    }
}
/* sum over the leading (batch) dims of a batched value [..., R, C] -> [R, C] (a ones-row matmul) */
static dpar_value dpar__g_batch_sum(dpar_graph *g, dpar_value x) {
    const dpar__gnode *xn = &g->n[x.id];
    int64_t r = xn->shape[xn->ndim - 2], c = xn->shape[xn->ndim - 1], nb = r * c != 0 ? dpar__g_count(xn) / (r * c) : 0;
    int64_t s2[2] = { nb, r * c }, s1[2] = { 1, nb }, out[2] = { r, c };
    dpar_value flat = dpar_g_reshape(g, x, 2, s2), ones = dpar_g_const(g, xn->dtype, 2, s1, 1.0f);
    return dpar_g_reshape(g, dpar_g_matmul(g, ones, flat, false, false), 2, out);
}
/* the gradient rules of the kinds above (dpar__g_grad) */
static void dpar__g_grad_norm_attn(dpar_graph *g, dpar__gback *bk, const dpar__gnode *nd, unsigned eff, dpar_value ct) {
    dpar_value a = dpar__gv(nd->in[0]), b = dpar__gv(nd->in[1]);
    if (nd->kind == DPAR__G_MATMUL_BATCHED) {
        bool ta = nd->ip[0] != 0, tb = nd->ip[1] != 0, shared = g->n[b.id].ndim == 2 && nd->ndim > 2;
        if (bk->needed[a.id])
            dpar__g_contrib(g, bk, a.id, eff,
                            ta ? dpar_g_matmul_batched(g, b, ct, tb, true)
                               : dpar_g_matmul_batched(g, ct, b, false, !tb));
        if (bk->needed[b.id]) {
            dpar_value d = tb ? dpar_g_matmul_batched(g, ct, a, true, ta) : dpar_g_matmul_batched(g, a, ct, !ta, false);
            dpar__g_contrib(g, bk, b.id, eff, shared ? dpar__g_batch_sum(g, d) : d);
        }
        return;
    }
    if (nd->kind == DPAR__G_ATTN) {
        static const int kinds[3] = { DPAR__G_ATTN_DQ, DPAR__G_ATTN_DK, DPAR__G_ATTN_DV };
        dpar_value v[5] = { ct, a, b, dpar__gv(nd->in[2]), dpar__gv(nd->in[3]) };
        for (int j = 0; j < 3; j++) {
            if (!bk->needed[nd->in[j]]) continue;
            dpar_value d = dpar__g_make(g, kinds[j], 5, v, nd->in[j]);
            if (d.id) g->n[d.id].ip[0] = nd->ip[0], g->n[d.id].fp = nd->fp;
            dpar__g_contrib(g, bk, nd->in[j], eff, d);
        }
        return;
    }
    if (nd->kind != DPAR__G_NORM) return;
    dpar_value st = dpar__gv(nd->in[2]), r;
    if (bk->needed[a.id]) {
        dpar_value v[4] = { ct, a, b, st };
        if ((r = dpar__g_like(g, DPAR__G_NORM_DX, 4, v)).id) g->n[r.id].ip[0] = nd->ip[0];
        dpar__g_contrib(g, bk, a.id, eff, r);
    }
    if (bk->needed[b.id]) {
        dpar_value v[3] = { ct, a, st };
        if ((r = dpar__g_make(g, DPAR__G_NORM_DW, 3, v, b.id)).id) g->n[r.id].ip[0] = nd->ip[0];
        dpar__g_contrib(g, bk, b.id, eff, r);
    }
    if (nd->nin > 3 && bk->needed[nd->in[3]])
        dpar__g_contrib(g, bk, nd->in[3], eff, dpar__g_make(g, DPAR__G_BIAS_GRAD, 1, &ct, nd->in[3]));
}

/* >>graph conv-pool ===========================================================
   Graph nodes of conv2d and the 2-D pools (see >>conv-pool): builders that
   infer shapes with the eager ops' geometry, the gradient rules (conv2d ->
   conv2d_dx, conv2d_dw, bias_grad; pools -> their _dx nodes), and the
   lowering to the eager calls. Each node owns a copy of its desc (attr). */
static dpar_buffer *dpar__g_buf(const dpar_graph *g, int id, int li);
/* A 4-d node of `kind` on in[0..n-1] with attr a copy of desc (sz bytes), of in[0]'s dtype (f32 or f64). */
static dpar_value dpar__g_win_node(dpar_graph *g, int kind, int n, const int *in, const int64_t *shape,
                                   const void *desc, size_t sz) {
    int id = dpar__g_push(g, kind, n, in, g->n[in[0]].dtype, 4, shape);
    if (!id) return dpar__gv(0);
    if (!(g->n[id].attr = DPAR_MALLOC(sz)))
        return dpar__g_fail(g, DPAR_ERR_OUT_OF_MEMORY, "dpar graph: out of memory for node %d", id);
    memcpy(g->n[id].attr, desc, sz);
    g->n[id].attr_sz = sz;
    return dpar__gv(id);
}
DPAR_API dpar_value dpar_g_conv2d(dpar_graph *g, dpar_value x, dpar_value w, dpar_value b, const dpar_conv2d_desc *d) {
    const char *fn = "dpar_g_conv2d";
    dpar_value v[3] = { x, w, b };
    int n = b.id ? 3 : 2;
    if (!dpar__g_args(g, fn, n, v) || !dpar__g_float(g, fn, n, v)) return dpar__gv(0);
    dpar_conv2d_desc z;
    if (!d) memset(&z, 0, sizeof z), d = &z;
    const dpar__gnode *xn = &g->n[x.id], *wn = &g->n[w.id];
    int64_t ys[4];
    char s1[160], s2[160], l1[96], l2[96];
    dpar_status s = xn->ndim != 4 || wn->ndim != 4 ? dpar__err(DPAR_ERR_SHAPE, "x must be 4-d NHWC and w 4-d HWIO")
                                                   : dpar_conv2d_output_shape(xn->shape, wn->shape, d, ys);
    if (!s && b.id && (g->n[b.id].ndim != 1 || g->n[b.id].shape[0] != ys[3]))
        s = dpar__err(DPAR_ERR_SHAPE, "the bias %s must be [%lld]", dpar__g_shape(&g->n[b.id], s1, sizeof s1),
                      (long long)ys[3]);
    if (s)
        return dpar__g_fail(g, s, "%s: x %s %s, w %s %s: %s", fn, dpar__g_label(g, x.id, l1, sizeof l1),
                            dpar__g_shape(xn, s1, sizeof s1), dpar__g_label(g, w.id, l2, sizeof l2),
                            dpar__g_shape(wn, s2, sizeof s2), dpar_last_error());
    int in[3] = { x.id, w.id, b.id };
    return dpar__g_win_node(g, DPAR__G_CONV2D, n, in, ys, d, sizeof *d);
}
static dpar_value dpar__g_pool(dpar_graph *g, const char *fn, int kind, dpar_value x, const dpar_pool2d_desc *d) {
    if (!dpar__g_args(g, fn, 1, &x) || !dpar__g_float(g, fn, 1, &x)) return dpar__gv(0);
    dpar_pool2d_desc z;
    if (!d) memset(&z, 0, sizeof z), d = &z;
    const dpar__gnode *xn = &g->n[x.id];
    int64_t ys[4];
    char s1[160], l1[96];
    dpar_status s =
        xn->ndim != 4 ? dpar__err(DPAR_ERR_SHAPE, "x must be 4-d NHWC") : dpar_pool2d_output_shape(xn->shape, d, ys);
    if (s)
        return dpar__g_fail(g, s, "%s: x %s %s: %s", fn, dpar__g_label(g, x.id, l1, sizeof l1),
                            dpar__g_shape(xn, s1, sizeof s1), dpar_last_error());
    return dpar__g_win_node(g, kind, 1, &x.id, ys, d, sizeof *d);
}
DPAR_API dpar_value dpar_g_avg_pool2d(dpar_graph *g, dpar_value x, const dpar_pool2d_desc *d) {
    return dpar__g_pool(g, "dpar_g_avg_pool2d", DPAR__G_AVG_POOL, x, d);
}
DPAR_API dpar_value dpar_g_max_pool2d(dpar_graph *g, dpar_value x, const dpar_pool2d_desc *d) {
    return dpar__g_pool(g, "dpar_g_max_pool2d", DPAR__G_MAX_POOL, x, d);
}
/* The gradient rules: nd is the forward node (a copy), ct its cotangent. */
static void dpar__g_conv_pool_grad(dpar_graph *g, dpar__gback *bk, const dpar__gnode *nd, unsigned eff, dpar_value ct) {
    int x = nd->in[0], w = nd->in[1], in[2] = { ct.id, x };
    size_t sz = nd->kind == DPAR__G_CONV2D ? sizeof(dpar_conv2d_desc) : sizeof(dpar_pool2d_desc);
    int64_t xs[4], ws[4];
    memcpy(xs, g->n[x].shape, sizeof xs);
    if (nd->kind == DPAR__G_CONV2D) {
        memcpy(ws, g->n[w].shape, sizeof ws);
        int dx_in[2] = { ct.id, w }, dw_in[2] = { x, ct.id };
        if (bk->needed[x])
            dpar__g_contrib(g, bk, x, eff, dpar__g_win_node(g, DPAR__G_CONV2D_DX, 2, dx_in, xs, nd->attr, sz));
        if (bk->needed[w])
            dpar__g_contrib(g, bk, w, eff, dpar__g_win_node(g, DPAR__G_CONV2D_DW, 2, dw_in, ws, nd->attr, sz));
        if (nd->nin > 2 && bk->needed[nd->in[2]])
            dpar__g_contrib(g, bk, nd->in[2], eff, dpar__g_make(g, DPAR__G_BIAS_GRAD, 1, &ct, nd->in[2]));
        return;
    }
    int kind = nd->kind == DPAR__G_AVG_POOL ? DPAR__G_AVG_POOL_DX : DPAR__G_MAX_POOL_DX;
    if (!bk->needed[x]) return;
    dpar__g_contrib(g, bk, x, eff,
                    dpar__g_win_node(g, kind, kind == DPAR__G_MAX_POOL_DX ? 2 : 1, in, xs, nd->attr, sz));
}
/* The lowering: y the node's buffer, a and b its first two inputs'. */
static dpar_status dpar__g_conv_pool_exec(const dpar_graph *g, const dpar__gnode *nd, int li, dpar_buffer *y,
                                          dpar_buffer *a, dpar_buffer *b) {
    const dpar_conv2d_desc *cd = (const dpar_conv2d_desc *)nd->attr;
    const dpar_pool2d_desc *pd = (const dpar_pool2d_desc *)nd->attr;
    switch (nd->kind) {
    case DPAR__G_CONV2D: return dpar_conv2d(y, a, b, nd->nin > 2 ? dpar__g_buf(g, nd->in[2], li) : NULL, cd);
    case DPAR__G_CONV2D_DX: return dpar_conv2d_backward_input(y, a, b, cd);
    case DPAR__G_CONV2D_DW: return dpar_conv2d_backward_kernel(y, NULL, a, b, cd);
    case DPAR__G_AVG_POOL: return dpar_avg_pool2d(y, a, pd);
    case DPAR__G_AVG_POOL_DX: return dpar_avg_pool2d_backward(y, a, pd);
    case DPAR__G_MAX_POOL: return dpar_max_pool2d(y, a, pd);
    default: return dpar_max_pool2d_backward(y, a, b, pd);
    }
}

/* The gradient rules of the >>graph elementwise nodes (see dpar__g_grad). */
static void dpar__g_grad_elem(dpar_graph *g, dpar__gback *bk, const dpar__gnode *nd, int i, unsigned eff,
                              dpar_value ct) {
    dpar_value a = dpar__gv(nd->in[0]), b = dpar__gv(nd->in[1]), r;
    switch (nd->kind) {
    case DPAR__G_UNARY: {
        dpar_value v[2] = { ct, a };
        r = dpar__g_like(g, DPAR__G_UNARY_GRAD, 2, v);
        if (r.id) g->n[r.id].ip[0] = nd->ip[0], g->n[r.id].fp = nd->fp;
        dpar__g_contrib(g, bk, a.id, eff, r);
        break;
    }
    case DPAR__G_BINARY:
        for (int side = 0; side < 2; side++) {
            int x = nd->in[side];
            if (!bk->needed[x]) continue;
            dpar_value v[3] = { ct, a, b };
            r = dpar__g_make(g, DPAR__G_BINARY_GRAD, 3, v, x);
            if (r.id) g->n[r.id].ip[0] = nd->ip[0], g->n[r.id].ip[1] = side;
            dpar__g_contrib(g, bk, x, eff, r);
        }
        break;
    case DPAR__G_WHERE: /* cond has no gradient */
        for (int side = 0; side < 2; side++) {
            int x = nd->in[1 + side];
            if (!bk->needed[x]) continue;
            dpar_value v[2] = { ct, a };
            r = dpar__g_like(g, DPAR__G_WHERE_GRAD, 2, v);
            if (r.id) g->n[r.id].ip[1] = side;
            dpar__g_contrib(g, bk, x, eff, r.id ? dpar__g_sum_to(g, r, x) : r);
        }
        break;
    case DPAR__G_REDUCE: {
        if (nd->ip[0] == DPAR_REDUCE_ARGMAX) break; /* integer result: no gradient */
        dpar_value v[2] = { ct, a };
        r = dpar__g_make(g, DPAR__G_REDUCE_GRAD, nd->ip[0] == DPAR_REDUCE_MAX ? 2 : 1, v, a.id);
        if (r.id) g->n[r.id].ip[0] = nd->ip[0], g->n[r.id].ip[1] = nd->ip[1];
        dpar__g_contrib(g, bk, a.id, eff, r);
        break;
    }
    case DPAR__G_SOFTMAX: {
        dpar_value v[2] = { ct, dpar__gv(i) };
        r = dpar__g_like(g, DPAR__G_SOFTMAX_GRAD, 2, v);
        if (r.id) g->n[r.id].ip[0] = nd->ip[0];
        dpar__g_contrib(g, bk, a.id, eff, r);
        break;
    }
    case DPAR__G_TRANSPOSE: {
        int inv[DPAR_MAX_DIMS];
        for (int k = 0; k < nd->ndim; k++) inv[nd->lp[k]] = k;
        dpar__g_contrib(g, bk, a.id, eff, dpar_g_transpose(g, ct, inv));
        break;
    }
    case DPAR__G_BROADCAST: dpar__g_contrib(g, bk, a.id, eff, dpar__g_sum_to(g, ct, a.id)); break;
    case DPAR__G_SLICE:
        r = dpar__g_make(g, DPAR__G_SLICE_GRAD, 1, &ct, a.id);
        if (r.id) memcpy(g->n[r.id].lp, nd->lp, sizeof nd->lp);
        dpar__g_contrib(g, bk, a.id, eff, r);
        break;
    case DPAR__G_PAD: dpar__g_contrib(g, bk, a.id, eff, dpar_g_slice(g, ct, nd->lp, NULL, g->n[a.id].shape)); break;
    case DPAR__G_CONCAT: {
        int64_t at[DPAR_MAX_DIMS];
        memset(at, 0, sizeof at);
        for (int k = 0; k < nd->nin; k++) {
            int x = nd->in[k];
            int64_t sh[DPAR_MAX_DIMS];
            memcpy(sh, g->n[x].shape, sizeof sh);
            if (bk->needed[x]) dpar__g_contrib(g, bk, x, eff, dpar_g_slice(g, ct, at, NULL, sh));
            at[nd->ip[0]] += sh[nd->ip[0]];
        }
        break;
    }
    default: break;
    }
}
static void dpar__g_grad_optim(dpar_graph *g, dpar__gback *bk, const dpar__gnode *nd, unsigned eff, dpar_value ct);
static void dpar__g_pipe_grad(dpar_graph *g, dpar__gback *bk, const dpar__gnode *nd, dpar_value ct);
/* The gradient rule of node i with cotangent ct: contributions to its inputs. */
static dpar_status dpar__g_grad(dpar_graph *g, dpar__gback *bk, int i, dpar_value ct) {
    dpar__gnode nd = g->n[i]; /* a copy: building nodes may move the table */
    dpar_value a = dpar__gv(nd.in[0]), b = dpar__gv(nd.in[1]);
    unsigned eff = nd.vary; /* inputs of an ordinary op are pvary'd to its result's axes */
    if (dpar__g_kinds[nd.kind].coll) eff = g->n[nd.in[0]].vary | nd.axes;
    char l[96];
    if (nd.pipe) { /* >>graph zero1-pipe */
        dpar__g_pipe_grad(g, bk, &nd, ct);
        return dpar__g_status(g);
    }
    switch (nd.kind) {
    case DPAR__G_MATMUL: {
        bool ta = nd.ip[0] != 0, tb = nd.ip[1] != 0;
        if (bk->needed[a.id])
            dpar__g_contrib(g, bk, a.id, eff,
                            ta ? dpar_g_matmul(g, b, ct, tb, true) : dpar_g_matmul(g, ct, b, false, !tb));
        if (bk->needed[b.id])
            dpar__g_contrib(g, bk, b.id, eff,
                            tb ? dpar_g_matmul(g, ct, a, true, ta) : dpar_g_matmul(g, a, ct, !ta, false));
        break;
    }
    case DPAR__G_BIAS_ADD:
        dpar__g_contrib(g, bk, a.id, eff, ct);
        if (bk->needed[b.id]) dpar__g_contrib(g, bk, b.id, eff, dpar__g_make(g, DPAR__G_BIAS_GRAD, 1, &ct, b.id));
        break;
    case DPAR__G_RELU: {
        dpar_value v[2] = { ct, a };
        dpar__g_contrib(g, bk, a.id, eff, dpar__g_like(g, DPAR__G_RELU_GRAD, 2, v));
        break;
    }
    case DPAR__G_XENT_IGN:
    case DPAR__G_EMBED:
    case DPAR__G_DROPOUT: dpar__g_grad_optim(g, bk, &nd, eff, ct); break;
    case DPAR__G_XENT:
    case DPAR__G_MSE: {
        dpar_value v[2] = { a, b };
        dpar_value d = dpar__g_like(g, nd.kind == DPAR__G_XENT ? DPAR__G_XENT_GRAD : DPAR__G_MSE_GRAD, 2, v);
        d = dpar__g_times(g, ct, d);
        dpar__g_contrib(g, bk, a.id, eff, d);
        if (nd.kind == DPAR__G_MSE && bk->needed[b.id]) dpar__g_contrib(g, bk, b.id, eff, dpar_g_scale(g, d, -1.0f));
        break;
    }
    case DPAR__G_ADD:
        dpar__g_contrib(g, bk, a.id, eff, ct);
        dpar__g_contrib(g, bk, b.id, eff, ct);
        break;
    case DPAR__G_SCALE: dpar__g_contrib(g, bk, a.id, eff, dpar_g_scale(g, ct, nd.fp)); break;
    case DPAR__G_MULS:
        if (bk->needed[a.id])
            dpar__g_contrib(g, bk, a.id, eff,
                            dpar_g_reshape(g, dpar_g_dot(g, ct, b), g->n[a.id].ndim, g->n[a.id].shape));
        dpar__g_contrib(g, bk, b.id, eff, dpar__g_times(g, a, ct));
        break;
    case DPAR__G_SUM:
    case DPAR__G_SUMSQ: {
        const dpar__gnode *x = &g->n[a.id];
        dpar_value d =
            nd.kind == DPAR__G_SUM ? dpar_g_const(g, x->dtype, x->ndim, x->shape, 1.0f) : dpar_g_scale(g, a, 2.0f);
        dpar__g_contrib(g, bk, a.id, eff, dpar__g_times(g, ct, d));
        break;
    }
    case DPAR__G_DOT:
        dpar__g_contrib(g, bk, a.id, eff,
                        dpar_g_reshape(g, dpar__g_times(g, ct, b), g->n[a.id].ndim, g->n[a.id].shape));
        dpar__g_contrib(g, bk, b.id, eff,
                        dpar_g_reshape(g, dpar__g_times(g, ct, a), g->n[b.id].ndim, g->n[b.id].shape));
        break;
    case DPAR__G_CAST: dpar__g_contrib(g, bk, a.id, eff, dpar_g_cast(g, ct, g->n[a.id].dtype)); break;
    case DPAR__G_COPY:
        dpar__g_contrib(g, bk, a.id, eff, dpar_g_reshape(g, ct, g->n[a.id].ndim, g->n[a.id].shape));
        break;
    case DPAR__G_PSUM:
    case DPAR__G_PCAST: /* psum's transpose is pvary (identity); pcast's is psum, done by dpar__g_contrib */
        dpar__g_contrib(g, bk, a.id, eff, ct);
        break;
    case DPAR__G_PMEAN:
        dpar__g_contrib(g, bk, a.id, eff, dpar_g_scale(g, ct, 1.0f / (float)dpar__g_group_size(g, nd.axes)));
        break;
    case DPAR__G_ALL_GATHER: /* the cotangent is invariant over the axes: each member takes its block */
        dpar__g_contrib(g, bk, a.id, eff, dpar__g_block(g, ct, &nd));
        break;
    case DPAR__G_PSUM_SCATTER:
        dpar__g_contrib(g, bk, a.id, eff, dpar_g_all_gather(g, ct, nd.axes_str, nd.ip[0], nd.ip[1] != 0));
        break;
    case DPAR__G_PPERMUTE: {
        int inv[2 * 256];
        int np = nd.npairs < 256 ? nd.npairs : 256;
        for (int k = 0; k < np; k++) inv[2 * k] = nd.pairs[2 * k + 1], inv[2 * k + 1] = nd.pairs[2 * k];
        dpar__g_contrib(g, bk, a.id, eff, dpar_g_ppermute(g, ct, nd.axes_str, inv, np));
        break;
    }
    case DPAR__G_ALL_TO_ALL:
        dpar__g_contrib(g, bk, a.id, eff, dpar_g_all_to_all(g, ct, nd.axes_str, nd.ip[1], nd.ip[0]));
        break;
    case DPAR__G_PBROADCAST: dpar__g_contrib(g, bk, a.id, eff, dpar__g_root_only(g, ct, &nd)); break;
    case DPAR__G_NORM:
    case DPAR__G_ATTN:
    case DPAR__G_MATMUL_BATCHED: dpar__g_grad_norm_attn(g, bk, &nd, eff, ct); break;
    case DPAR__G_CONV2D:
    case DPAR__G_AVG_POOL:
    case DPAR__G_MAX_POOL: dpar__g_conv_pool_grad(g, bk, &nd, eff, ct); break;
    case DPAR__G_PMAX:
    case DPAR__G_PMIN:
        dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT,
                     "dpar_graph_value_and_grad: %s lies on the path to the loss but pmax/pmin have no gradient in "
                     "dpar graphs (refused: which member gets it is a modelling choice); use psum/pmean there",
                     dpar__g_label(g, i, l, sizeof l));
        break;
    DPAR__G_ELEM_CASES:
        dpar__g_grad_elem(g, bk, &nd, i, eff, ct);
        break;
    default: break;
    }
    return dpar__g_status(g);
}

static void dpar__g_pipe_enter(dpar_graph *g, int i, int bwd);
static float dpar__g_pipe_seed(const dpar_graph *g);
/* Marks the nodes on a path from a wrt value (their cotangents are built). */
static void dpar__g_mark_needed(const dpar_graph *g, dpar__gback *bk, const dpar_value *wrt, int n, int upto) {
    for (int k = 0; k < n; k++) bk->needed[wrt[k].id] = true;
    for (int i = 1; i <= upto; i++)
        for (int j = 0; j < g->n[i].nin; j++)
            if (bk->needed[g->n[i].in[j]]) bk->needed[i] = true;
}
/* The loss as differentiated and reported: a loss that varies over mesh axes is pmean'd over them. */
static dpar_status dpar__g_pin(dpar_graph *g, int loss) {
    unsigned pin = g->n[loss].vary;
    g->loss = loss;
    g->loss_value = loss;
    g->pin = pin;
    if (!pin) return DPAR_OK;
    char axes[64] = "";
    size_t at = 0;
    for (int a = 0; a < g->mesh->ndim; a++)
        if (pin & (1u << a)) at += (size_t)snprintf(axes + at, sizeof axes - at, at ? ",%s" : "%s", g->mesh->names[a]);
    g->loss_value = dpar_g_pmean(g, dpar__gv(loss), axes).id;
    g->gscale = 1.0f / (float)dpar__g_group_size(g, pin);
    return dpar__g_status(g);
}
/* Gradients of at least this many bytes are reduced asynchronously (DPAR_GRAPH_ASYNC_BYTES, default 256 KiB):
   below it, the hand-off to the communication thread costs more than the overlap saves. */
static uint64_t dpar__g_async_bytes(void) {
    const char *e = getenv("DPAR_GRAPH_ASYNC_BYTES"); /* in range: dpar_runtime_create checked it */
    return e && *e ? (uint64_t)strtoull(e, NULL, 10) : (uint64_t)256 << 10;
}
/* Gradient of wrt value w from its cotangent c: the pinned scale applied (a
   psum over exactly the pinned axes becomes the pmean the eager code would
   call), then a node of its own that the plan keeps. */
static int dpar__g_final_grad(dpar_graph *g, dpar__gback *bk, int w, int c, const int *uses) {
    const dpar__gnode *wn = &g->n[w];
    if (!c) {
        int64_t sh[DPAR_MAX_DIMS];
        memcpy(sh, wn->shape, sizeof sh);
        c = dpar_g_const(g, wn->dtype, wn->ndim, sh, 0.0f).id; /* the loss does not depend on w */
        if (c) g->n[c].vary = g->n[w].vary;
    } else if (g->gscale != 1.0f) {
        dpar__gnode *cn = &g->n[c];
        if (cn->kind == DPAR__G_PSUM && bk->owner[c] == w && cn->axes == g->pin && !uses[c])
            cn->kind = DPAR__G_PMEAN;
        else
            c = dpar_g_scale(g, dpar__gv(c), g->gscale).id;
    } else if (uses[c] || g->n[c].kind == DPAR__G_FEED || g->n[c].kind == DPAR__G_PARAM ||
               g->n[c].kind == DPAR__G_CONST || g->n[c].keep) {
        c = dpar_g_reshape(g, dpar__gv(c), wn->ndim, g->n[w].shape).id; /* a copy the plan can keep */
    }
    if (!c) return 0;
    dpar__gnode *cn = &g->n[c];
    /* over axes of one device the reduction is the identity: not handed to the communication thread
       (nothing to overlap), so the plan can make it run nothing (dpar__g_ident_ok) */
    cn->async = (cn->kind == DPAR__G_PSUM || cn->kind == DPAR__G_PMEAN) && bk->owner[c] == w &&
                dpar__mask_size(g->mesh, cn->axes) > 1 &&
                (uint64_t)dpar__g_count(cn) * dpar_dtype_size(cn->dtype) >= dpar__g_async_bytes();
    cn->keep = true;
    cn->vary = g->n[w].vary;
    if (g->n[w].kind == DPAR__G_FEED || g->n[w].kind == DPAR__G_PARAM) g->n[c].spec_of = w;
    return c;
}
static dpar_status dpar__g_remat_start(dpar_graph *g, int upto);
static void dpar__g_remat_stop(dpar_graph *g);
DPAR_API dpar_status dpar_graph_value_and_grad(dpar_graph *g, dpar_value loss, const dpar_value *wrt, int n,
                                               dpar_value *grads) {
    const char *fn = "dpar_graph_value_and_grad";
    dpar__clear_error();
    if (!dpar__g_args(g, fn, 1, &loss)) return dpar__g_args_status(g);
    if (n < 0 || (n && (!wrt || !grads)))
        return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "%s: n = %d with wrt or grads NULL", fn, n);
    if (n && !dpar__g_args(g, fn, n, wrt)) return dpar__g_status(g);
    if (g->loss) return dpar__g_err(g, DPAR_ERR_STATE, "%s: the graph has a loss already (once per graph)", fn);
    if (g->remat_open)
        return dpar__g_err(g, DPAR_ERR_STATE, "%s: remat segment %d is still open; call dpar_graph_remat_end first", fn,
                           g->remat_seg);
    const dpar__gnode *ln = &g->n[loss.id];
    char l[96], sh[160];
    if (dpar__g_count(ln) != 1 || (ln->dtype != DPAR_F32 && ln->dtype != DPAR_F64))
        return dpar__g_err(g, dpar__g_count(ln) != 1 ? DPAR_ERR_SHAPE : DPAR_ERR_DTYPE,
                           "%s: the loss %s is %s %s; it must be a scalar (one f32 or f64 element): reduce it first "
                           "(dpar_g_sum, dpar_g_softmax_xent)",
                           fn, dpar__g_label(g, loss.id, l, sizeof l), dpar_dtype_name(ln->dtype),
                           dpar__g_shape(ln, sh, sizeof sh));
    int upto = g->count;
    dpar__gback bk;
    size_t cap = (size_t)(upto * 8 + 64 * (n + 4)) + 4096; /* backward nodes never exceed this many */
    bk.ct = (int *)DPAR_MALLOC(cap * sizeof(int));
    bk.owner = (int *)DPAR_MALLOC(cap * sizeof(int));
    bk.needed = (bool *)DPAR_MALLOC(cap * sizeof(bool));
    int *uses = (int *)DPAR_MALLOC(cap * sizeof(int));
    dpar_status s = DPAR_OK;
    if (!bk.ct || !bk.owner || !bk.needed || !uses) {
        s = dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    } else {
        memset(bk.ct, 0, cap * sizeof(int));
        memset(bk.owner, 0, cap * sizeof(int));
        memset(bk.needed, 0, cap * sizeof(bool));
        memset(uses, 0, cap * sizeof(int));
        dpar__g_mark_needed(g, &bk, wrt, n, loss.id);
        dpar__g_pipe_enter(g, loss.id, upto);
        s = dpar__g_pin(g, loss.id);
        /* a pipeline sums the gradients of its micro-batches: each is seeded with 1 / M */
        int seed = s ? 0 : dpar_g_const(g, g->n[loss.id].dtype, 0, NULL, dpar__g_pipe_seed(g)).id;
        bk.ct[loss.id] = seed;
        if (!s && g->remat_seg) s = dpar__g_remat_start(g, upto);
        for (int i = loss.id; i > 0 && !s; i--)
            if (bk.ct[i] && bk.needed[i] && g->count + 64 < (int)cap) {
                dpar__g_pipe_enter(g, i, upto);
                s = dpar__g_grad(g, &bk, i, dpar__gv(bk.ct[i]));
            }
        dpar__g_remat_stop(g);
        if (!s && g->count + 64 * (n + 1) >= (int)cap)
            s = dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "%s: backward pass too large", fn);
        for (int i = 1; i < g->count; i++)
            for (int j = 0; j < g->n[i].nin; j++) uses[g->n[i].in[j]]++;
        for (int k = 0; k < n && !s; k++) {
            if (bk.ct[wrt[k].id]) dpar__g_pipe_enter(g, bk.ct[wrt[k].id], upto);
            grads[k] = dpar__gv(dpar__g_final_grad(g, &bk, wrt[k].id, bk.ct[wrt[k].id], uses));
            if (grads[k].id) uses[grads[k].id]++;
            s = dpar__g_status(g);
        }
        if (!s) g->n[g->loss_value].keep = true;
    }
    DPAR_FREE(bk.ct);
    DPAR_FREE(bk.owner);
    DPAR_FREE(bk.needed);
    DPAR_FREE(uses);
    if (s)
        for (int k = 0; k < n; k++) grads[k] = dpar__gv(0);
    return s;
}

DPAR_API dpar_status dpar_graph_keep(dpar_graph *g, dpar_value v) {
    dpar__clear_error();
    if (!dpar__g_args(g, "dpar_graph_keep", 1, &v)) return dpar__g_args_status(g);
    g->n[v.id].keep = true;
    return DPAR_OK;
}

/* ---- optimizer nodes ---- */
static dpar_status dpar__g_z1_rewrite(dpar_graph *g, const char *fn, const dpar_value *params, const dpar_value *grads,
                                      int n, float clip_norm); /* >>graph zero1-pipe */
/* A clip's grouping, once: the params of each distinct split (the mesh axes
   they vary over) together, each split's in param order, and where each group
   ends, so a step reads every norm in one pass (dpar__g_clip_mixed). */
static dpar_status dpar__g_split_groups(dpar_graph *g, const char *fn) {
    dpar__gopt *o = &g->opt;
    int n = o->n;
    o->split_order = (int *)DPAR_MALLOC((size_t)n * sizeof(int));
    o->split_end = (int *)DPAR_MALLOC((size_t)n * sizeof(int));
    if (!o->split_order || !o->split_end) return dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    int cnt = 0;
    o->nsplit = 0;
    for (int k = 0; k < n; k++) {
        unsigned split = g->n[o->params[k]].vary;
        bool first = true; /* param k opens its split's group */
        for (int j = 0; j < k && first; j++) first = g->n[o->params[j]].vary != split;
        if (!first) continue;
        for (int j = k; j < n; j++)
            if (g->n[o->params[j]].vary == split) o->split_order[cnt++] = j;
        o->split_end[o->nsplit++] = cnt;
    }
    return DPAR_OK;
}
/* The optimizer node's params and grads, checked (params, same sizes); notes whether their specs differ. */
static dpar_status dpar__g_opt_add(dpar_graph *g, const char *fn, const dpar_value *params, const dpar_value *grads,
                                   int n, float clip_norm) {
    if (!params || !grads || n <= 0)
        return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "%s: params or grads NULL or n = %d", fn, n);
    if (g->has_opt) return dpar__g_err(g, DPAR_ERR_STATE, "%s: the graph has an optimizer step already", fn);
    if (!dpar__g_args(g, fn, n, params) || !dpar__g_args(g, fn, n, grads)) return dpar__g_status(g);
    unsigned split = 0;
    char l[96], l2[96];
    for (int k = 0; k < n; k++) {
        const dpar__gnode *p = &g->n[params[k].id], *q = &g->n[grads[k].id];
        if (p->kind != DPAR__G_PARAM)
            return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "%s: params[%d] %s is not a param (dpar_g_param)", fn, k,
                               dpar__g_label(g, params[k].id, l, sizeof l));
        /* f32 pairs, or f64 pairs (a cpu graph; their state is f64 too), as the eager steps (>>f64 api) */
        if ((p->dtype != DPAR_F32 && p->dtype != DPAR_F64) || q->dtype != p->dtype || (g->z1 && p->dtype != DPAR_F32))
            return dpar__g_err(g, DPAR_ERR_DTYPE,
                               "%s: param %s is %s and gradient %s is %s; the optimizer nodes update f32 params "
                               "with f32 gradients, or f64 with f64 (not with ZeRO-1, whose blocks are f32); "
                               "dpar_g_cast the gradient to the param's dtype",
                               fn, dpar__g_label(g, params[k].id, l, sizeof l), dpar_dtype_name(p->dtype),
                               dpar__g_label(g, grads[k].id, l2, sizeof l2), dpar_dtype_name(q->dtype));
        if (dpar__g_count(p) != dpar__g_count(q))
            return dpar__g_err(
                g, DPAR_ERR_INVALID_ARGUMENT, "%s: param %s and gradient %s differ in size (%lld and %lld elements)",
                fn, dpar__g_label(g, params[k].id, l, sizeof l), dpar__g_label(g, grads[k].id, l2, sizeof l2),
                (long long)dpar__g_count(p), (long long)dpar__g_count(q));
        if (k && clip_norm > 0 && p->vary != split) g->opt.mixed = true; /* one norm over differently split params */
        split = p->vary;
    }
    dpar__gopt *o = &g->opt;
    o->params = (int *)DPAR_MALLOC((size_t)n * sizeof(int));
    o->grads = (int *)DPAR_MALLOC((size_t)n * sizeof(int));
    if (!o->params || !o->grads) return dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    o->n = n;
    size_t at = 0;
    o->norm_axes[0] = 0;
    for (int a = 0; a < g->mesh->ndim && clip_norm > 0; a++)
        if (split & (1u << a))
            at += (size_t)snprintf(o->norm_axes + at, sizeof o->norm_axes - at, at ? ",%s" : "%s", g->mesh->names[a]);
    dpar_status s = g->z1 ? dpar__g_z1_rewrite(g, fn, params, grads, n, clip_norm) : DPAR_OK;
    if (s) return s;
    for (int k = 0; k < n; k++) o->params[k] = params[k].id, o->grads[k] = grads[k].id;
    if (clip_norm > 0 && (s = dpar__g_split_groups(g, fn))) return s;
    g->has_opt = true;
    int id = dpar__g_push(g, DPAR__G_SGD, 0, NULL, DPAR_F32, 0, NULL);
    return id ? DPAR_OK : dpar__g_status(g);
}
DPAR_API dpar_status dpar_graph_sgd(dpar_graph *g, const dpar_sgd_desc *d, const dpar_value *params,
                                    const dpar_value *grads, int n) {
    dpar__clear_error();
    if (!dpar__g_args(g, "dpar_graph_sgd", 0, NULL)) return dpar__g_args_status(g);
    if (!d) return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_sgd: desc is NULL");
    dpar_status s = dpar_sgd_check(d);
    if (s) return dpar__g_err(g, s, "%s", dpar_last_error());
    if ((s = dpar__g_opt_add(g, "dpar_graph_sgd", params, grads, n, d->clip_norm))) return s;
    g->opt.d = *d;
    g->opt.d.norm_axes = g->opt.norm_axes[0] ? g->opt.norm_axes : NULL;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_graph_adamw(dpar_graph *g, const dpar_adamw_desc *d, const dpar_value *params,
                                      const dpar_value *grads, int n) {
    dpar__clear_error();
    if (!dpar__g_args(g, "dpar_graph_adamw", 0, NULL)) return dpar__g_args_status(g);
    if (!d) return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_adamw: desc is NULL");
    dpar_status s = dpar_adamw_check(d);
    if (s) return dpar__g_err(g, s, "%s", dpar_last_error());
    if ((s = dpar__g_opt_add(g, "dpar_graph_adamw", params, grads, n, d->clip_norm))) return s;
    g->opt.adamw = true;
    g->opt.ad = *d;
    g->opt.ad.norm_axes = g->opt.norm_axes[0] ? g->opt.norm_axes : NULL;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_graph_adamw_masked(dpar_graph *g, const dpar_adamw_desc *d, const dpar_value *params,
                                             const dpar_value *grads, const bool *decay, int n) {
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_adamw_masked", "the graph")) return DPAR_ERR_STATE;
    if (g && g->z1 && decay)
        return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT,
                           "dpar_graph_adamw_masked: a decay mask with ZeRO-1 (dpar_graph_zero1) is not supported; "
                           "decay every param (dpar_graph_adamw) or leave ZeRO-1 off");
    dpar_status s = dpar_graph_adamw(g, d, params, grads, n);
    if (s || !decay) return s;
    g->opt.decay = (bool *)DPAR_MALLOC((size_t)n * sizeof(bool));
    if (!g->opt.decay) return dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_adamw_masked: out of memory");
    memcpy(g->opt.decay, decay, (size_t)n * sizeof(bool));
    return DPAR_OK;
}
static void dpar__g_prog_rerecord(dpar_graph *g); /* >>graph program */
/* Whether the optimizer node's commands stay the same every step, so a recorded program may hold it:
   SGD (AdamW's bias correction moves with the step) without a clip norm (read on the host), ZeRO-1, a
   split clip or a decay mask, in a graph with no asynchronous reduction for it to wait for (a bucket
   reduced blocking just before it leaves only device copies for its node: dpar__g_bucket_blocking).
   dpar_graph_set_lr that changes the rate turns it off (a schedule runs the optimizer op by op). */
static bool dpar__g_opt_recordable(const dpar_graph *g) {
    if (!g->has_opt || g->opt.adamw || g->z1 || g->pp || g->opt.mixed || g->opt.decay || g->opt.d.clip_norm > 0.0f)
        return false;
    for (int i = 1; i < g->count; i++)
        if (g->n[i].async || (g->n[i].bucket && !g->bk[g->n[i].bucket - 1].at_opt)) return false;
    return true;
}
DPAR_API dpar_status dpar_graph_set_lr(dpar_graph *g, float lr) {
    dpar__clear_error();
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_set_lr", "the graph")) return DPAR_ERR_STATE;
    if (!g || !g->has_opt)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_set_lr: %s",
                         g ? "the graph has no optimizer node (dpar_graph_sgd, dpar_graph_adamw)" : "graph is NULL");
    if (!(lr >= 0.0f) || !isfinite(lr)) /* 0: a warm-up from 0 (optax.linear_schedule(0, ...)) */
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_set_lr: learning rate %g must be finite and >= 0",
                         (double)lr);
    float *now = g->opt.adamw ? &g->opt.ad.learning_rate : &g->opt.d.learning_rate;
    if (g->opt_rec && lr != *now) { /* a recorded SGD holds the old rate: record again, the optimizer op by op */
        dpar_status busy = dpar__busy(g->rt, NULL, "dpar_graph_set_lr");
        if (busy) return busy;
        g->opt_rec = false;
        dpar__g_prog_rerecord(g);
    }
    *now = lr;
    return DPAR_OK;
}

static void dpar__g_axes_text(const dpar_graph *g, unsigned mask, char *buf, size_t cap);
/* The clip factor of one global norm over params split over different axes
   (Megatron's split weights next to replicated ones): the params of each
   distinct split sum their gradients' squares, psum'd over that split's axes
   (dpar__clip_scale), and the splits' totals add up. So every device gets the
   norm of the whole gradient, the same bits on every replica. li: the local
   device, whose grads clip_ptrs holds in the order dpar__g_split_groups chose. */
static dpar_status dpar__g_clip_mixed(dpar_graph *g, dpar_ctx *ctx, float clip_norm, int li, float *scale) {
    const dpar__gopt *o = &g->opt;
    dpar_buffer **sub = g->clip_ptrs + (size_t)li * (size_t)o->n; /* the grads grouped by split */
    /* every split's squared norms in one read, then each split's total psum'd over its axes */
    float *sq = NULL;
    double total = 0.0;
    dpar_status s = dpar__norms_read("dpar_graph_run", ctx, sub, o->n, &sq);
    for (int t = 0, at = 0; t < o->nsplit && !s; at = o->split_end[t++]) {
        char axes[64];
        double part = 0.0;
        float norm = 0.0f;
        dpar__g_axes_text(g, g->n[o->params[o->split_order[at]]].vary, axes, sizeof axes);
        s = dpar__norms_total("dpar_graph_run", ctx, axes, sub + at, o->split_end[t] - at, sq + at, &part);
        if (!s) s = dpar__norm_of("dpar_graph_run", part, &norm);
        total += (double)norm * (double)norm;
    }
    float norm = (float)sqrt(total);
    if (!s) *scale = (clip_norm > 0.0f && !(norm < clip_norm)) ? clip_norm / norm : 1.0f;
    return s;
}
/* The optimizer node with mixed splits or a decay mask: one clip factor
   (dpar__g_clip_mixed), then the update of each param with its own decay. */
static dpar_status dpar__g_opt_step(dpar_graph *g, dpar_ctx *ctx, int li, dpar_buffer *const *p) {
    const dpar__gopt *o = &g->opt;
    int n = o->n;
    float clip_norm = o->adamw ? o->ad.clip_norm : o->d.clip_norm, scale = 1.0f;
    dpar_status s = clip_norm > 0.0f ? dpar__g_clip_mixed(g, ctx, clip_norm, li, &scale) : DPAR_OK;
    for (int k = 0; k < n && !s; k++) {
        if (!o->adamw) {
            s = dpar_sgd_update(&o->d, p[k], p[n + k], o->d.momentum != 0.0f ? p[2 * n + k] : NULL, scale);
            continue;
        }
        dpar_adamw_desc ad = o->ad;
        if (o->decay && !o->decay[k]) ad.weight_decay = 0.0f;
        s = dpar_adamw_update(&ad, p[k], p[n + k], p[2 * n + k], p[3 * n + k], o->step + 1, scale);
    }
    return s;
}

/* >>graph optim ==============================================================
   Issue 13's ops in graphs: cross-entropy with an ignore label, embedding,
   dropout, following the four steps of >>graph (the AdamW node is above). */
DPAR_API dpar_value dpar_g_cross_entropy(dpar_graph *g, dpar_value logits, dpar_value labels, const dpar_xent_desc *d) {
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_g_cross_entropy", "the graph")) return dpar__gv(0);
    if (g && d && !(d->label_smoothing >= 0.0f && d->label_smoothing < 1.0f))
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT,
                            "dpar_g_cross_entropy: label_smoothing = %g; it must be in "
                            "[0, 1)",
                            (double)d->label_smoothing);
    dpar_value v = dpar_g_softmax_xent(g, logits, labels); /* the same checks and shape */
    if (v.id) {
        dpar__gnode *nd = &g->n[v.id];
        nd->kind = DPAR__G_XENT_IGN;
        nd->ip[0] = d && d->use_ignore;
        nd->ip[1] = d ? d->ignore_label : 0;
        nd->fp = d ? d->label_smoothing : 0.0f;
    }
    return v;
}
DPAR_API dpar_value dpar_g_embedding(dpar_graph *g, dpar_value table, dpar_value idx) {
    const char *fn = "dpar_g_embedding";
    dpar_value v[2] = { table, idx };
    if (!dpar__g_args(g, fn, 2, v) || !dpar__g_float(g, fn, 1, v)) return dpar__gv(0);
    const dpar__gnode *t = &g->n[table.id], *x = &g->n[idx.id];
    char s1[160], s2[160], l1[96], l2[96];
    if (x->dtype != DPAR_I32)
        return dpar__g_fail(g, DPAR_ERR_DTYPE, "%s: idx %s is %s; it must hold i32 row indices", fn,
                            dpar__g_label(g, idx.id, l2, sizeof l2), dpar_dtype_name(x->dtype));
    if (t->ndim != 2 || x->ndim + 1 > DPAR_MAX_DIMS)
        return dpar__g_fail(g, DPAR_ERR_SHAPE, "%s: table %s %s must be [V,D] and idx %s %s have < %d dims", fn,
                            dpar__g_label(g, table.id, l1, sizeof l1), dpar__g_shape(t, s1, sizeof s1),
                            dpar__g_label(g, idx.id, l2, sizeof l2), dpar__g_shape(x, s2, sizeof s2), DPAR_MAX_DIMS);
    int64_t sh[DPAR_MAX_DIMS];
    memcpy(sh, x->shape, (size_t)x->ndim * sizeof sh[0]);
    sh[x->ndim] = t->shape[1];
    int in[2] = { table.id, idx.id };
    return dpar__gv(dpar__g_push(g, DPAR__G_EMBED, 2, in, t->dtype, x->ndim + 1, sh));
}
static dpar_value dpar__g_dropout_node(dpar_graph *g, dpar_value x, int lo, int hi, float rate) {
    dpar_value v = dpar__g_like(g, DPAR__G_DROPOUT, 1, &x);
    if (v.id) {
        g->n[v.id].ip[0] = lo;
        g->n[v.id].ip[1] = hi;
        g->n[v.id].fp = rate;
    }
    return v;
}
DPAR_API dpar_value dpar_g_dropout(dpar_graph *g, dpar_value x, float rate, uint64_t seed) {
    const char *fn = "dpar_g_dropout";
    if (!dpar__g_args(g, fn, 1, &x) || !dpar__g_float(g, fn, 1, &x)) return dpar__gv(0);
    if (!(rate >= 0.0f && rate <= 1.0f))
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT, "%s: rate = %g; it must be in [0, 1]", fn, (double)rate);
    return dpar__g_dropout_node(g, x, (int)(uint32_t)seed, (int)(uint32_t)(seed >> 32), rate);
}
/* gradient rules of the kinds above (called from dpar__g_grad) */
static void dpar__g_grad_optim(dpar_graph *g, dpar__gback *bk, const dpar__gnode *nd, unsigned eff, dpar_value ct) {
    dpar_value a = dpar__gv(nd->in[0]), b = dpar__gv(nd->in[1]);
    if (nd->kind == DPAR__G_XENT_IGN) {
        dpar_value v[2] = { a, b };
        dpar_value d = dpar__g_like(g, DPAR__G_XENT_IGN_GRAD, 2, v);
        if (d.id) {
            g->n[d.id].ip[0] = nd->ip[0];
            g->n[d.id].ip[1] = nd->ip[1];
            g->n[d.id].fp = nd->fp;
        }
        dpar__g_contrib(g, bk, a.id, eff, dpar__g_times(g, ct, d));
    } else if (nd->kind == DPAR__G_EMBED) {
        dpar_value v[2] = { ct, b };
        if (bk->needed[a.id]) dpar__g_contrib(g, bk, a.id, eff, dpar__g_make(g, DPAR__G_EMBED_GRAD, 2, v, a.id));
    } else if (nd->kind == DPAR__G_DROPOUT) {
        dpar__g_contrib(g, bk, a.id, eff, dpar__g_dropout_node(g, ct, nd->ip[0], nd->ip[1], nd->fp));
    }
}
/* forward lowerings of the kinds above (called from dpar__g_exec) */
/* where a gradient node's eager loss call puts the loss it discards: a scalar of y's dtype */
static dpar_buffer *dpar__g_scratch(const dpar_graph *g, int li, const dpar_buffer *y) {
    return y->dtype == DPAR_F64 && g->scratch64 ? g->scratch64[li] : g->scratch[li];
}
static dpar_status dpar__g_exec_optim(dpar_graph *g, dpar_ctx *ctx, int li, const dpar__gnode *nd, dpar_buffer *y,
                                      dpar_buffer *a, dpar_buffer *b) {
    dpar_xent_desc xd;
    xd.use_ignore = nd->ip[0] != 0;
    xd.ignore_label = nd->ip[1];
    xd.label_smoothing = nd->fp;
    uint64_t seed = (uint64_t)(uint32_t)nd->ip[0] | ((uint64_t)(uint32_t)nd->ip[1] << 32);
    switch (nd->kind) {
    case DPAR__G_XENT_IGN: return dpar_cross_entropy(y, nd->fused ? dpar__g_buf(g, nd->fused, li) : NULL, a, b, &xd);
    case DPAR__G_XENT_IGN_GRAD: return dpar_cross_entropy(dpar__g_scratch(g, li, y), y, a, b, &xd);
    case DPAR__G_EMBED: return dpar_embedding(y, a, b);
    case DPAR__G_EMBED_GRAD: return dpar_embedding_backward(y, a, b, 0.0f);
    case DPAR__G_DROPOUT:
        return dpar_dropout(y, a, nd->fp, seed, (uint64_t)g->opt.step, (uint32_t)dpar_ctx_device(ctx));
    default: return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run: node kind %d has no lowering", nd->kind);
    }
}

/* >>graph zero1-pipe ==========================================================
   ZeRO-1 (Rajbhandari et al. 2020, stage 1; PyTorch's ZeroRedundancyOptimizer) as a graph option:
   the all-reduce of each gradient over the data axes becomes a reduce-scatter of the gradient viewed
   flat and zero-padded to Lp, a multiple of the group size n; the optimizer node updates only this
   device's block (Lp / n elements) of each param and of its state, then all-gathers the blocks into
   the params. The block of a param is sliced from the param itself at every step (the params are
   all-gathered from the blocks, so it is the block of the last update, bit for bit): no master copy. */
static void dpar__g_axes_text(const dpar_graph *g, unsigned mask, char *buf, size_t cap);
typedef struct dpar__gz1 {
    char axes[64];
    unsigned mask;
    int n;                   /* group size over the axes */
    int np;                  /* the optimizer's params (set at compile) */
    int64_t *count, *padded; /* [np]: L and Lp = ceil(L / n) n */
    dpar_array **state;      /* [j * np + k]: state j (momentum; AdamW m, v) of param k, f32 [Lp] split */
    dpar_buffer **blk;       /* [k * nlocal + li]: this device's block of param k, f32 [Lp / n] */
    dpar_buffer **pad;       /* [k * nlocal + li]: f32 [Lp] staging when Lp != L, else NULL */
} dpar__gz1;

DPAR_API dpar_status dpar_graph_zero1(dpar_graph *g, const char *axes) {
    const char *fn = "dpar_graph_zero1";
    dpar__clear_error();
    if (!dpar__g_args(g, fn, 0, NULL)) return dpar__g_args_status(g);
    if (g->has_opt || g->z1 || g->pp)
        return dpar__g_err(g, DPAR_ERR_STATE, "%s: %s; call it once, before dpar_graph_sgd / dpar_graph_adamw", fn,
                           g->z1   ? "ZeRO-1 is on already"
                           : g->pp ? "the graph is a pipeline (not combined with ZeRO-1)"
                                   : "the graph has its optimizer node already");
    unsigned mask = 0;
    dpar_status s = dpar__parse_axes(g->mesh, fn, axes, &mask, NULL, NULL);
    if (s) return dpar__g_err(g, s, "%s", dpar_last_error());
    if (strlen(axes) >= sizeof g->z1->axes)
        return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "%s: axes \"%s\" too long", fn, axes);
    dpar__gz1 *z = (dpar__gz1 *)DPAR_MALLOC(sizeof *z);
    if (!z) return dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    memset(z, 0, sizeof *z);
    snprintf(z->axes, sizeof z->axes, "%s", axes);
    z->mask = mask;
    z->n = dpar__g_group_size(g, mask);
    g->z1 = z;
    return DPAR_OK;
}
/* The gradient grads[k] of params[k] as value_and_grad made it: an all-reduce over exactly the ZeRO-1
   axes (psum, or pmean when the loss was pinned), maybe scaled. That reduction becomes a zero1_scatter
   node (the reduce-scatter, in the reduction's place in the schedule) and the gradient a block. */
static dpar_status dpar__g_z1_rewrite(dpar_graph *g, const char *fn, const dpar_value *params, const dpar_value *grads,
                                      int n, float clip_norm) {
    dpar__gz1 *z = g->z1;
    char l[96], l2[96], ax[64];
    if (clip_norm > 0) snprintf(g->opt.norm_axes, sizeof g->opt.norm_axes, "%s", z->axes); /* blocks: split */
    for (int k = 0; k < n; k++) {
        int p = params[k].id, c = grads[k].id;
        int r = g->n[c].kind == DPAR__G_SCALE ? g->n[c].in[0] : c;
        if (g->n[p].vary)
            return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT,
                               "%s: param %s is split over mesh axes; ZeRO-1 shards replicated params only", fn,
                               dpar__g_label(g, p, l, sizeof l));
        if ((g->n[r].kind != DPAR__G_PSUM && g->n[r].kind != DPAR__G_PMEAN) || g->n[r].axes != z->mask) {
            dpar__g_axes_text(g, g->n[r].kind == DPAR__G_PSUM || g->n[r].kind == DPAR__G_PMEAN ? g->n[r].axes : 0, ax,
                              sizeof ax);
            return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT,
                               "%s: the gradient %s of %s is not an all-reduce over exactly \"%s\" (it reduces over "
                               "\"%s\"); ZeRO-1 needs the gradients of dpar_graph_value_and_grad of a loss that "
                               "varies over those axes (a batch split over them)",
                               fn, dpar__g_label(g, c, l, sizeof l), dpar__g_label(g, p, l2, sizeof l2), z->axes, ax);
        }
        for (int i = 1; i < g->count; i++)
            for (int j = 0; j < g->n[i].nin; j++)
                if (g->n[i].in[j] == c || (g->n[i].in[j] == r && i != c))
                    return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT,
                                       "%s: the gradient %s is read by %s; under ZeRO-1 a gradient is a block per "
                                       "device that only the optimizer reads",
                                       fn, dpar__g_label(g, c, l, sizeof l), dpar__g_label(g, i, l2, sizeof l2));
        int64_t blk = (dpar__g_count(&g->n[p]) + z->n - 1) / z->n;
        for (int id = r;; id = c) {
            dpar__gnode *nd = &g->n[id];
            nd->ndim = 1;
            nd->shape[0] = blk;
            nd->vary |= z->mask;
            nd->async = false;
            if (id == c) break;
        }
        dpar__gnode *rn = &g->n[r];
        rn->fp = rn->kind == DPAR__G_PMEAN ? 1.0f / (float)z->n : 1.0f;
        rn->kind = DPAR__G_ZERO1_SCATTER;
        rn->ip[0] = k;
        g->n[c].spec_of = 0; /* no longer a global array: dpar_graph_get reads the first device's block */
    }
    return DPAR_OK;
}
/* At compile: the state arrays, the block and staging buffers; nstate buffers of state per param. */
static dpar_status dpar__g_z1_alloc(dpar_graph *g, int nstate) {
    dpar__gz1 *z = g->z1;
    int np = g->opt.n, nl = g->nlocal;
    z->np = np;
    z->count = (int64_t *)DPAR_MALLOC((size_t)(2 * np) * sizeof(int64_t));
    z->state = (dpar_array **)DPAR_MALLOC((size_t)(2 * np) * sizeof(dpar_array *));
    z->blk = (dpar_buffer **)DPAR_MALLOC((size_t)(2 * np * nl) * sizeof(dpar_buffer *));
    if (!z->count || !z->state || !z->blk)
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    memset(z->state, 0, (size_t)(2 * np) * sizeof(dpar_array *));
    memset(z->blk, 0, (size_t)(2 * np * nl) * sizeof(dpar_buffer *));
    z->padded = z->count + np;
    z->pad = z->blk + np * nl;
    dpar_status s = DPAR_OK;
    for (int k = 0; k < np && !s; k++) {
        z->count[k] = dpar__g_count(&g->n[g->opt.params[k]]);
        z->padded[k] = (z->count[k] + z->n - 1) / z->n * z->n;
        int64_t blk = z->padded[k] / z->n;
        dpar_array_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DPAR_F32;
        d.ndim = 1;
        d.shape[0] = z->padded[k];
        d.spec[0] = z->axes;
        for (int j = 0; j < nstate && !s; j++) s = dpar_array_create(g->mesh, &d, &z->state[j * np + k]);
        for (int li = 0; li < nl && !s; li++) {
            s = dpar_buffer_create(g->rt, g->first + li, DPAR_F32, 1, &blk, &z->blk[k * nl + li]);
            if (!s && z->padded[k] != z->count[k])
                s = dpar_buffer_create(g->rt, g->first + li, DPAR_F32, 1, &z->padded[k], &z->pad[k * nl + li]);
        }
        g->stats.opt_bytes += (uint64_t)nstate * (uint64_t)blk * 4u;
        /* the staging buffers: the param's block, its padded copy */
        g->stats.resident_bytes += (uint64_t)(blk + (z->padded[k] != z->count[k] ? z->padded[k] : 0)) * 4u;
    }
    return s;
}
/* zero1_scatter: this device's block of the sum (times fp) over the axes of its local gradient a. */
static dpar_status dpar__g_z1_scatter(dpar_graph *g, dpar_ctx *ctx, int li, const dpar__gnode *nd, dpar_buffer *y,
                                      dpar_buffer *a) {
    dpar_buffer *pad = g->z1->pad[nd->ip[0] * g->nlocal + li];
    int64_t zero = 0;
    a->ndim = 1;
    a->shape[0] = a->count;
    dpar_status s = pad ? dpar_pad(pad, a, &zero, 0.0f) : DPAR_OK;
    if (!s) s = dpar_psum_scatter(ctx, y, pad ? pad : a, nd->axes_str, 0, true);
    if (!s && nd->fp != 1.0f) s = dpar_scale(y, nd->fp);
    dpar__g_buf(g, nd->in[0], li); /* its own shape back */
    return s;
}
/* The optimizer node under ZeRO-1: block of every param, the step on the blocks, all-gather. */
static dpar_status dpar__g_z1_step(dpar_graph *g, dpar_ctx *ctx, int li) {
    const dpar__gz1 *z = g->z1;
    int n = g->opt.n, nl = g->nlocal, pos = 0;
    dpar_buffer **p = g->sgd_ptrs + (size_t)li * 4 * (size_t)n;
    int64_t zero = 0;
    dpar_status s = dpar_ctx_axis_index(ctx, z->axes, &pos);
    for (int k = 0; k < n && !s; k++) { /* p[k] is this device's block of param k */
        dpar_buffer *x = dpar__g_buf(g, g->opt.params[k], li), *pad = z->pad[k * nl + li];
        int64_t start = pos * (z->padded[k] / z->n);
        x->ndim = 1;
        x->shape[0] = z->count[k];
        if (pad) s = dpar_pad(pad, x, &zero, 0.0f);
        if (!s) s = dpar_slice(p[k], pad ? pad : x, &start, NULL);
        dpar__g_buf(g, g->opt.params[k], li);
    }
    if (!s && g->opt.adamw) s = dpar_adamw_step(ctx, &g->opt.ad, p, p + n, p + 2 * n, p + 3 * n, n, g->opt.step + 1);
    if (!s && !g->opt.adamw)
        s = dpar_sgd_step(ctx, &g->opt.d, p, p + n, g->opt.d.momentum != 0.0f ? p + 2 * n : NULL, n);
    for (int k = 0; k < n && !s; k++) { /* the updated blocks back into every replica */
        dpar_buffer *x = dpar__g_buf(g, g->opt.params[k], li), *pad = z->pad[k * nl + li];
        x->ndim = 1;
        x->shape[0] = z->count[k];
        s = dpar_all_gather(ctx, pad ? pad : x, p[k], z->axes, 0, true);
        if (!s && pad) s = dpar_slice(x, pad, &zero, NULL);
        dpar__g_buf(g, g->opt.params[k], li);
    }
    return s;
}
DPAR_API dpar_array *dpar_graph_zero1_state(const dpar_graph *g, int i, int j) {
    dpar__clear_error();
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_zero1_state", "the graph")) return NULL;
    const dpar__gz1 *z = g ? g->z1 : NULL;
    if (!z || !g->compiled || i < 0 || i >= z->np || j < 0 || j > 1 || !z->state[j * z->np + i]) {
        dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                  "dpar_graph_zero1_state: no state %d of param %d (a compiled graph with ZeRO-1 has one state per "
                  "param for SGD with momentum, two for AdamW)",
                  j, i);
        return NULL;
    }
    return z->state[j * z->np + i];
}
static void dpar__g_z1_destroy(dpar_graph *g, bool alive) {
    dpar__gz1 *z = g->z1;
    if (!z) return;
    for (int k = 0; z->state && k < 2 * z->np; k++)
        if (alive) dpar_array_destroy(z->state[k]);
    for (int k = 0; z->blk && k < 2 * z->np * g->nlocal; k++) dpar_buffer_destroy(z->blk[k]);
    DPAR_FREE(z->count);
    DPAR_FREE(z->state);
    DPAR_FREE(z->blk);
    DPAR_FREE(z);
}

/* GPipe (Huang et al. 2019; PyTorch's pipe_split + ScheduleGPipe) as a graph option. The graph is
   built for one micro-batch: feeds take the global batch and each device's rows are cut into M
   micro-batches (the feed value is one of them); dpar_g_pipe_split marks where stage s hands its
   activation to stage s + 1 (a ppermute over the pipeline axis, its transpose sends the gradient back).
   Every node belongs to one stage; device s of the axis runs only stage s's nodes. A run is M + S - 1
   forward ticks (at tick t stage s computes micro-batch t - s, then every boundary passes its value on),
   the same number of backward ticks in the reverse direction, then each gradient and the loss, summed
   over the micro-batches on their stage, are broadcast over the axis and every device takes the same
   optimizer step on its replica of all params. Activations are kept per micro-batch (M buffer sets). */
typedef struct dpar__gpipe {
    char axis[64];
    unsigned mask;
    int S, M; /* stages (the axis size), micro-batches */
    int bwd;  /* the first node of the backward pass (0: not appended yet) */
} dpar__gpipe;

DPAR_API dpar_status dpar_graph_pipeline(dpar_graph *g, const char *axis, int num_microbatches) {
    const char *fn = "dpar_graph_pipeline";
    dpar__clear_error();
    if (!dpar__g_args(g, fn, 0, NULL)) return dpar__g_args_status(g);
    if (g->pp || g->z1 || g->count > 1)
        return dpar__g_err(g, DPAR_ERR_STATE, "%s: %s; call it once, right after dpar_graph_create", fn,
                           g->pp   ? "the graph is a pipeline already"
                           : g->z1 ? "the graph uses ZeRO-1 (not combined with pipelines)"
                                   : "the graph has nodes already");
    unsigned mask = 0;
    dpar_status s = dpar__parse_axes(g->mesh, fn, axis, &mask, NULL, NULL);
    if (s) return dpar__g_err(g, s, "%s", dpar_last_error());
    if (mask & (mask - 1) || strlen(axis) >= sizeof g->pp->axis)
        return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "%s: \"%s\": name one mesh axis for the stages", fn, axis);
    if (num_microbatches < 1)
        return dpar__g_err(g, DPAR_ERR_INVALID_ARGUMENT, "%s: %d micro-batches; give 1 or more", fn, num_microbatches);
    dpar__gpipe *p = (dpar__gpipe *)DPAR_MALLOC(sizeof *p);
    int *mb = (int *)DPAR_MALLOC((size_t)g->nlocal * sizeof(int));
    if (!p || !mb) {
        DPAR_FREE(p);
        DPAR_FREE(mb);
        return dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    memset(p, 0, sizeof *p);
    memset(mb, 0, (size_t)g->nlocal * sizeof(int));
    snprintf(p->axis, sizeof p->axis, "%s", axis);
    p->mask = mask;
    p->S = dpar__g_group_size(g, mask);
    p->M = num_microbatches;
    g->pp = p;
    g->mb_now = mb;
    return DPAR_OK;
}
/* Builder hooks: a feed's value is one micro-batch of its rows; an op reads only its own stage's values. */
static bool dpar__g_pipe_feed(dpar_graph *g, int id, const char *name) {
    dpar__gnode *nd = &g->n[id];
    if (nd->ndim < 1 || nd->shape[0] % g->pp->M) {
        dpar__g_fail(g, DPAR_ERR_SHAPE,
                     "dpar_g_feed: feed '%s': %lld rows per device do not split into %d micro-batches "
                     "(dpar_graph_pipeline); give a batch whose rows per device the micro-batch count divides",
                     name ? name : "", nd->ndim ? (long long)nd->shape[0] : 0LL, g->pp->M);
        return false;
    }
    nd->shape[0] /= g->pp->M;
    return true;
}
static bool dpar__g_pipe_inputs(dpar_graph *g, int nin, const int *in) {
    char l[96];
    for (int j = 0; j < nin && !g->pp->bwd; j++)
        if (g->n[in[j]].stage >= 0 && g->n[in[j]].stage != g->stage_now) {
            dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT,
                         "pipeline: %s belongs to stage %d but is read in stage %d; pass values between stages "
                         "with dpar_g_pipe_split",
                         dpar__g_label(g, in[j], l, sizeof l), g->n[in[j]].stage, g->stage_now);
            return false;
        }
    return true;
}
/* A boundary: x of stage `from` sent to stage from + 1 (forward) or back (its transpose). */
static int dpar__g_pipe_send(dpar_graph *g, int x, int from, int to) {
    int *pairs = (int *)DPAR_MALLOC(2 * sizeof(int));
    if (!pairs) return dpar__g_fail(g, DPAR_ERR_OUT_OF_MEMORY, "dpar_g_pipe_split: out of memory").id;
    int saved = g->stage_now;
    g->stage_now = from; /* x is the sender's */
    dpar_value xv = dpar__gv(x);
    int id = dpar__g_like(g, DPAR__G_PPERMUTE, 1, &xv).id;
    g->stage_now = saved;
    if (!id) {
        DPAR_FREE(pairs);
        return 0;
    }
    dpar__gnode *nd = &g->n[id];
    pairs[0] = from, pairs[1] = to;
    nd->pairs = pairs;
    nd->npairs = 1;
    nd->axes = g->pp->mask;
    snprintf(nd->axes_str, sizeof nd->axes_str, "%s", g->pp->axis);
    nd->stage = to; /* the value lives on the receiver */
    nd->pipe = true;
    return id;
}
DPAR_API dpar_value dpar_g_pipe_split(dpar_graph *g, dpar_value x) {
    const char *fn = "dpar_g_pipe_split";
    if (!dpar__g_args(g, fn, 1, &x)) return dpar__gv(0);
    if (!g->pp || g->pp->bwd)
        return dpar__g_fail(g, DPAR_ERR_STATE, "%s: %s", fn,
                            g->pp ? "the backward pass is appended already; mark stages while building the forward"
                                  : "the graph is no pipeline; call dpar_graph_pipeline first");
    if (g->stage_now + 1 >= g->pp->S)
        return dpar__g_fail(g, DPAR_ERR_INVALID_ARGUMENT,
                            "%s: boundary %d needs stage %d but axis \"%s\" has %d devices (one stage each)", fn,
                            g->stage_now + 1, g->stage_now + 1, g->pp->axis, g->pp->S);
    if (!dpar__g_pipe_inputs(g, 1, &x.id)) return dpar__gv(0);
    int id = dpar__g_pipe_send(g, x.id, g->stage_now, g->stage_now + 1);
    if (id) g->stage_now++;
    return dpar__gv(id);
}
/* The gradient of a boundary: the cotangent goes back from the receiver to the sender. */
static void dpar__g_pipe_grad(dpar_graph *g, dpar__gback *bk, const dpar__gnode *nd, dpar_value ct) {
    int from = nd->stage, to = nd->stage - 1;
    int id = dpar__g_pipe_send(g, ct.id, from, to);
    g->stage_now = to;
    if (id) dpar__g_contrib(g, bk, nd->in[0], g->n[nd->in[0]].vary, dpar__gv(id));
}
/* value_and_grad: the backward pass starts at node bwd; the rule of node i builds nodes of i's stage. */
static void dpar__g_pipe_enter(dpar_graph *g, int i, int bwd) {
    if (!g->pp) return;
    g->pp->bwd = bwd;
    g->stage_now = g->n[i].stage;
}
static float dpar__g_pipe_seed(const dpar_graph *g) {
    return g->pp ? 1.0f / (float)g->pp->M : 1.0f;
}

/* At compile: the checks that need the whole graph. */
static dpar_status dpar__g_pipe_check(dpar_graph *g) {
    const dpar__gpipe *p = g->pp;
    char l[96], l2[96];
    int *owner = (int *)DPAR_MALLOC((size_t)g->count * sizeof(int));
    if (!owner) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    for (int i = 0; i < g->count; i++) owner[i] = -1;
    dpar_status s = DPAR_OK;
    if (!g->loss || g->n[g->loss].stage != p->S - 1)
        s = dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                      "dpar_graph_compile: the pipeline %s on stage %d but axis \"%s\" has %d stages: mark %d "
                      "boundaries with dpar_g_pipe_split and differentiate the last stage's loss",
                      g->loss ? "has its loss" : "has no loss (dpar_graph_value_and_grad)",
                      g->loss ? g->n[g->loss].stage : -1, p->axis, p->S, p->S - 1);
    for (int i = 1; i < g->count && !s; i++) {
        dpar__gnode *nd = &g->n[i];
        nd->async = false; /* one reduction per micro-batch: waited for at once */
        if ((nd->vary & p->mask) || (dpar__g_kinds[nd->kind].coll && !nd->pipe && (nd->axes & p->mask)))
            s = dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                          "dpar_graph_compile: %s %s the pipeline axis \"%s\"; only dpar_g_pipe_split crosses stages",
                          dpar__g_label(g, i, l, sizeof l), nd->vary & p->mask ? "varies over" : "is a collective over",
                          p->axis);
        for (int j = 0; j < nd->nin && !s && i < p->bwd && nd->stage >= 0; j++) {
            int in = nd->in[j];
            if (g->n[in].kind != DPAR__G_PARAM) continue;
            if (owner[in] >= 0 && owner[in] != nd->stage)
                s = dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                              "dpar_graph_compile: param %s is read by stage %d and by stage %d (%s); a param "
                              "belongs to one stage",
                              dpar__g_label(g, in, l, sizeof l), owner[in], nd->stage,
                              dpar__g_label(g, i, l2, sizeof l2));
            owner[in] = nd->stage;
        }
    }
    DPAR_FREE(owner);
    return s;
}
/* At compile, after the plan: buffer sets 1..M-1 (params and constants shared with set 0). */
static dpar_status dpar__g_pipe_alloc(dpar_graph *g) {
    int M = g->pp->M, nl = g->nlocal, ns = g->nslots;
    size_t n = (size_t)(M - 1) * (size_t)ns;
    bool *shared = (bool *)DPAR_MALLOC((size_t)ns + 1);
    g->mb_slots = (dpar_buffer **)DPAR_MALLOC(n * (size_t)nl * sizeof(dpar_buffer *) + 1);
    g->mb_owned = (bool *)DPAR_MALLOC(n + 1);
    if (!shared || !g->mb_slots || !g->mb_owned) {
        DPAR_FREE(shared);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    }
    memset(shared, 0, (size_t)ns + 1);
    memset(g->mb_slots, 0, n * (size_t)nl * sizeof(dpar_buffer *));
    for (int i = 1; i < g->count; i++)
        if (g->n[i].slot >= 0 && (g->n[i].kind == DPAR__G_PARAM || g->n[i].kind == DPAR__G_CONST))
            shared[g->n[i].slot] = true;
    dpar_status s = DPAR_OK;
    for (size_t k = 0; k < n && !s; k++) {
        int slot = (int)(k % (size_t)ns);
        g->mb_owned[k] = !shared[slot];
        for (int li = 0; li < nl && !s; li++) {
            dpar_buffer *b0 = g->slots[slot * nl + li], **b = &g->mb_slots[k * (size_t)nl + (size_t)li];
            int64_t cap = (int64_t)(g->slot_bytes[slot] / 4); /* a graph-owned slot: f32 of its capacity */
            if (shared[slot])
                *b = b0;
            else if (g->slot_owned[slot])
                s = dpar_buffer_create(g->rt, g->first + li, DPAR_F32, 1, &cap, b);
            else
                s = dpar_buffer_create(g->rt, g->first + li, b0->dtype, b0->ndim, b0->shape, b);
        }
        const dpar_buffer *b0 = g->slots[slot * nl];
        if (!shared[slot])
            g->stats.planned_bytes +=
                g->slot_owned[slot] ? g->slot_bytes[slot] : (uint64_t)b0->count * dpar_dtype_size(b0->dtype);
    }
    DPAR_FREE(shared);
    return s;
}

/* ---- pipeline run ---- */
static dpar_status dpar__g_exec(dpar_graph *g, dpar_ctx *ctx, int li, int i);
/* Whether node i's sum over the micro-batches is the result: the loss and the gradients of leaves. */
static bool dpar__g_pipe_summed(const dpar_graph *g, int i) {
    return g->n[i].keep && g->n[i].stage >= 0 && (g->n[i].spec_of || i == g->loss_value);
}
/* Stage `st`'s nodes lo..hi-1 on micro-batch m (feeds: micro-batch m of this device's rows). */
static dpar_status dpar__g_pipe_part(dpar_graph *g, dpar_ctx *ctx, int li, int st, int m, int lo, int hi, int *at) {
    g->mb_now[li] = m;
    dpar_status s = DPAR_OK;
    for (int i = lo; i < hi && !s; i++) {
        const dpar__gnode *nd = &g->n[i];
        *at = i;
        if (nd->kind == DPAR__G_FEED && lo == 1) {
            int64_t start[DPAR_MAX_DIMS] = { 0 };
            start[0] = m * nd->shape[0];
            s = dpar_slice(dpar__g_buf(g, i, li), dpar_array_shard(nd->array, g->first + li), start, NULL);
        } else if (nd->stage == st && !nd->pipe && nd->kind != DPAR__G_SGD) {
            s = dpar__g_exec(g, ctx, li, i);
        }
    }
    if (s || lo == 1 || !m) return s;
    for (int i = 1; i < g->count && !s; i++) /* after the backward of micro-batch m > 0: its results into set 0 */
        if (g->n[i].stage == st && dpar__g_pipe_summed(g, i)) {
            *at = i;
            dpar_buffer *bm = dpar__g_buf(g, i, li);
            g->mb_now[li] = 0;
            s = dpar_axpy(dpar__g_buf(g, i, li), 1.0f, bm);
            g->mb_now[li] = m;
        }
    return s;
}
/* One direction's ticks: compute, then every boundary of that direction passes micro-batch t - lag on. */
static dpar_status dpar__g_pipe_ticks(dpar_graph *g, dpar_ctx *ctx, int li, int st, bool fwd, int *at) {
    const dpar__gpipe *p = g->pp;
    int lo = fwd ? 1 : p->bwd, hi = fwd ? p->bwd : g->count;
    dpar_status s = DPAR_OK;
    for (int t = 0; t < p->M + p->S - 1 && !s; t++) {
        int m = t - (fwd ? st : p->S - 1 - st);
        if (m >= 0 && m < p->M) s = dpar__g_pipe_part(g, ctx, li, st, m, lo, hi, at);
        for (int i = lo; i < hi && !s; i++) {
            if (!g->n[i].pipe) continue;
            int from = g->n[i].pairs[0], mb = t - (fwd ? from : p->S - 1 - from);
            if (mb < 0 || mb >= p->M) continue;
            *at = i;
            g->mb_now[li] = mb;
            s = dpar__g_exec(g, ctx, li, i);
        }
    }
    g->mb_now[li] = 0;
    return s;
}
static dpar_status dpar__g_stage_copy(const dpar_graph *g, int li); /* >>graph feeds */
static dpar_status dpar__g_pipe_dispatch(dpar_ctx *ctx, void *user) {
    dpar_graph *g = (dpar_graph *)user;
    const dpar__gpipe *p = g->pp;
    int li = dpar_ctx_device(ctx) - g->first, st = 0, at = 0;
    dpar_status s = g->feed_take ? dpar__g_stage_copy(g, li) : DPAR_OK; /* >>graph feeds */
    if (s) return s;
    s = dpar_ctx_axis_index(ctx, p->axis, &st);
    if (!s) s = dpar__g_pipe_ticks(g, ctx, li, st, true, &at);
    if (!s) s = dpar__g_pipe_ticks(g, ctx, li, st, false, &at);
    if (!s && g->n[g->loss_value].stage == st) { /* the mean over the micro-batches */
        at = g->loss_value;
        s = dpar_scale(dpar__g_buf(g, g->loss_value, li), 1.0f / (float)p->M);
    }
    for (int i = 1; i < g->count && !s; i++) /* each sum from its stage to every stage */
        if (dpar__g_pipe_summed(g, i)) {
            at = i;
            dpar_buffer *b = dpar__g_buf(g, i, li);
            s = dpar_pbroadcast(ctx, b, b, p->axis, g->n[i].stage);
        }
    for (int i = 1; i < g->count && !s; i++) /* every replica takes the same step */
        if (g->n[i].kind == DPAR__G_SGD) s = dpar__g_exec(g, ctx, li, at = i);
    return s ? dpar__g_node_err(g, s, at) : DPAR_OK;
}
static void dpar__g_slot_free(const dpar_graph *g, int k, dpar_buffer *b);
static void dpar__g_pipe_destroy(dpar_graph *g) {
    size_t n = g->pp && g->mb_slots ? (size_t)(g->pp->M - 1) * (size_t)g->nslots : 0;
    for (size_t k = 0; k < n; k++)
        for (int li = 0; li < g->nlocal && g->mb_owned[k]; li++)
            dpar__g_slot_free(g, (int)(k % (size_t)g->nslots), g->mb_slots[k * (size_t)g->nlocal + (size_t)li]);
    DPAR_FREE(g->mb_slots);
    DPAR_FREE(g->mb_owned);
    DPAR_FREE(g->mb_now);
    DPAR_FREE(g->pp);
}

/* ---- compile: liveness plan, buffers ---- */
/* Pooled node buffers are sized, not typed. A pooled value lives from its
   node to its last reader; after the walk in schedule order, the values are
   placed in slots whose values' lives do not overlap, so the slots add up to
   about the largest live set of the schedule rather than the largest live
   set of each exact shape. Two placements of TFLite's memory planner for
   shared objects (Pisarchyk and Lee 2020) are tried and the smaller kept:
   greedy by size (values largest first, each in the smallest free slot) and
   greedy by breadth (the nodes with the most bytes live first, their values
   largest first, each in the smallest free slot that holds it, else the
   largest free one, grown). Slots are allocated after planning;
   dpar__g_buf gives a slot the dtype, shape and byte count of the node
   using it. */
typedef struct dpar__gplan {
    int *last;      /* [count] last node that reads each node */
    bool *pooled;   /* [count] its buffer returns to the pool after `last` */
    bool *freed;    /* [count] a pooled value whose last reader ran */
    int *born;      /* [count] the node that writes each value (a fused gradient: its loss node) */
    int *alias;     /* [count] the value whose slot a node's output takes (dpar__g_alias_of), 0 none */
    bool alias_on;  /* DPAR_GRAPH_ALIAS unset or 1 */
    size_t *sbytes; /* [slots] capacity of a graph-owned slot */
    uint64_t live;  /* bytes of the pooled values live now (the walk in schedule order) */
    uint64_t peak;  /* the most bytes of pooled values live at once */
    uint64_t held;  /* bytes of the values not pooled (kept, consts, pipeline boundaries) */
} dpar__gplan;

static size_t dpar__g_bytes(const dpar__gnode *nd) {
    return (size_t)dpar__g_count(nd) * dpar_dtype_size(nd->dtype);
}
/* A new slot: the shards of array a, or (a NULL) a graph-owned slot of nd's size, allocated by dpar__g_alloc. */
static int dpar__g_new_slot(dpar_graph *g, dpar__gplan *p, const dpar__gnode *nd, dpar_array *a) {
    int k = g->nslots++;
    p->sbytes[k] = dpar__g_bytes(nd);
    g->slot_owned[k] = a == NULL;
    for (int li = 0; li < g->nlocal && a; li++) g->slots[k * g->nlocal + li] = dpar_array_shard(a, g->first + li);
    return k;
}
typedef struct dpar__gsize {
    size_t bytes;
    int id;
} dpar__gsize;
static int dpar__g_size_desc(const void *x, const void *y) { /* bytes descending, then schedule order */
    const dpar__gsize *a = (const dpar__gsize *)x, *b = (const dpar__gsize *)y;
    return a->bytes != b->bytes ? (a->bytes < b->bytes ? 1 : -1) : a->id - b->id;
}
/* A placement of the pooled values in untyped slots 0..n-1 (one candidate plan). */
typedef struct dpar__gfit {
    int *slot;      /* [count] each pooled value's slot, -1 not placed */
    int *next;      /* [count] the next value in the same slot, 0 none */
    int *head;      /* [count] each slot's first value, 0 none */
    size_t *cap;    /* [count] each slot's capacity */
    int n;          /* slots */
    uint64_t total; /* bytes of all slots */
} dpar__gfit;
/* Whether the life of value i overlaps that of a value already in slot k. */
static bool dpar__g_fit_busy(const dpar__gfit *f, const dpar__gplan *p, int k, int i) {
    for (int j = f->head[k]; j; j = f->next[j])
        if (p->born[j] <= p->last[i] && p->born[i] <= p->last[j]) return true;
    return false;
}
/* Value i of b bytes into slot k (k == f->n: a new one), the slot grown to b. */
static void dpar__g_fit_put(dpar__gfit *f, int k, int i, size_t b) {
    if (k == f->n) f->cap[f->n] = 0, f->head[f->n++] = 0;
    if (f->cap[k] < b) f->total += b - f->cap[k], f->cap[k] = b;
    f->slot[i] = k;
    f->next[i] = f->head[k];
    f->head[k] = i;
}
/* The slot for value i of b bytes: the smallest free one holding b, else the largest free one, else a new one. */
static int dpar__g_fit_best(const dpar__gfit *f, const dpar__gplan *p, int i, size_t b) {
    int fit = -1, grow = -1;
    for (int k = 0; k < f->n; k++) {
        if (dpar__g_fit_busy(f, p, k, i)) continue;
        if (f->cap[k] >= b && (fit < 0 || f->cap[k] < f->cap[fit])) fit = k;
        if (f->cap[k] < b && (grow < 0 || f->cap[k] > f->cap[grow])) grow = k;
    }
    return fit >= 0 ? fit : grow >= 0 ? grow : f->n;
}
/* Greedy by breadth: the nodes by bytes live there (largest first), their unplaced values largest first.
   v: the n pooled values, largest first; t: scratch of count + 1. */
static void dpar__g_fit_breadth(const dpar_graph *g, const dpar__gplan *p, const dpar__gsize *v, int n, dpar__gsize *t,
                                dpar__gfit *f) {
    int c = g->count;
    for (int k = 0; k <= c; k++) t[k].bytes = 0, t[k].id = k;
    for (int q = 0; q < n; q++)
        for (int k = p->born[v[q].id]; k <= p->last[v[q].id]; k++) t[k].bytes += v[q].bytes;
    qsort(t, (size_t)c + 1, sizeof *t, dpar__g_size_desc);
    for (int k = 0; k <= c && t[k].bytes; k++)
        for (int q = 0; q < n; q++) {
            int i = v[q].id;
            if (f->slot[i] < 0 && p->born[i] <= t[k].id && t[k].id <= p->last[i])
                dpar__g_fit_put(f, dpar__g_fit_best(f, p, i, v[q].bytes), i, v[q].bytes);
        }
}
/* Places the pooled values (their slots still -1): both plans, the smaller made g's slots. */
static dpar_status dpar__g_place(dpar_graph *g, dpar__gplan *p) {
    int n = 0, c = g->count;
    /* per plan one block: the size_t capacities first, then three int arrays, the block rounded up to
       8 bytes so the second plan's capacities stay aligned */
    size_t ci = (size_t)c * sizeof(int), cs = (size_t)c * sizeof(size_t), blk = cs + ((3 * ci + 7) & ~(size_t)7);
    dpar__gsize *v = (dpar__gsize *)DPAR_MALLOC((size_t)(2 * c + 1) * sizeof *v);
    char *mem = (char *)DPAR_MALLOC(2 * blk);
    if (!v || !mem) {
        DPAR_FREE(v);
        DPAR_FREE(mem);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    }
    dpar__gfit f[2];
    for (int k = 0; k < 2; k++) {
        char *m = mem + (size_t)k * blk;
        f[k].cap = (size_t *)(void *)m, f[k].n = 0, f[k].total = 0;
        f[k].slot = (int *)(void *)(m + cs), f[k].next = (int *)(void *)(m + cs + ci);
        f[k].head = (int *)(void *)(m + cs + 2 * ci);
        memset(f[k].slot, 0xff, ci); /* -1: not placed */
    }
    for (int i = 1; i < c; i++)
        if (p->pooled[i]) v[n].bytes = dpar__g_bytes(&g->n[i]), v[n++].id = i;
    qsort(v, (size_t)n, sizeof *v, dpar__g_size_desc);
    for (int q = 0; q < n; q++) /* greedy by size: every slot holds >= v[q].bytes (placed larger first) */
        dpar__g_fit_put(&f[0], dpar__g_fit_best(&f[0], p, v[q].id, v[q].bytes), v[q].id, v[q].bytes);
    dpar__g_fit_breadth(g, p, v, n, v + n, &f[1]);
    const dpar__gfit *b = f[1].total < f[0].total ? &f[1] : &f[0];
    int first = g->nslots;
    for (int k = 0; k < b->n; k++) p->sbytes[dpar__g_new_slot(g, p, &g->n[b->head[k]], NULL)] = b->cap[k];
    for (int q = 0; q < n; q++) g->n[v[q].id].slot = first + b->slot[v[q].id];
    DPAR_FREE(v);
    DPAR_FREE(mem);
    return DPAR_OK;
}
/* An array with the global shape, spec and dtype of leaf w, zero (the gradient of a feed or param, or an
   optimizer state of a param: f64 for an f64 param, as the eager steps). */
static dpar_status dpar__g_grad_array(dpar_graph *g, int w, dpar_array **out) {
    const dpar_array *src = g->n[w].array;
    dpar_array_desc d;
    char spec[DPAR_MAX_DIMS][64];
    memset(&d, 0, sizeof d);
    d.dtype = src->dtype;
    d.ndim = src->ndim;
    for (int i = 0; i < src->ndim; i++) {
        d.shape[i] = src->shape[i];
        dpar_status s = dpar_array_spec(src, i, spec[i], sizeof spec[i]);
        if (s) return s;
        d.spec[i] = spec[i][0] ? spec[i] : NULL;
    }
    return dpar_array_create(g->mesh, &d, out);
}
/* The input whose buffer node i's output may take (0: none): one its kind may overwrite (dpar__g_inplace),
   a pooled value (no feed, param, const or kept value: nothing the user reads) that node i
   reads last (nothing later, backward and remat copies included, needs it) and through no other operand,
   of i's dtype and shape (a copy or reshape: its element count). Node i is no fused loss or gradient. */
static int dpar__g_alias_of(const dpar_graph *g, const dpar__gplan *p, int i) {
    const dpar__gnode *nd = &g->n[i];
    unsigned mask = p->alias_on && !nd->fused ? dpar__g_inplace(nd->kind) : 0u;
    bool copy = nd->kind == DPAR__G_COPY || nd->kind == DPAR__G_PCAST;
    for (int k = 0; k < nd->nin && mask; k++) {
        int j = nd->in[k], uses = 0;
        const dpar__gnode *x = &g->n[j];
        if (!(mask >> k & 1u) || !p->pooled[j] || p->freed[j] || p->last[j] != i || x->dtype != nd->dtype ||
            dpar__g_count(x) != dpar__g_count(nd))
            continue;
        for (int m = 0; m < nd->nin; m++) uses += nd->in[m] == j;
        if (uses == 1 &&
            (copy || (x->ndim == nd->ndim && !memcmp(x->shape, nd->shape, (size_t)nd->ndim * sizeof nd->shape[0]))))
            return j;
    }
    return 0;
}
/* Whether pooled value j, its alias decided, may be written straight into the buffer of its last reader
   i instead: i is a kept psum or pmean over axes of one device (the identity: x + nothing, x / 1; a
   gradient array's shard or the loss), not bucketed, async or in a pipeline, reading j through its one
   operand; j has i's dtype and shape and is in no alias chain. j then leaves the pool and i runs
   nothing (ident): on a 1-device mesh a gradient's matmul writes the kept gradient, and the reduction
   neither copies it nor, on Vulkan, ends a recorded segment (>>graph program). */
static bool dpar__g_ident_ok(const dpar_graph *g, const dpar__gplan *p, int j) {
    int i = p->last[j];
    const dpar__gnode *nd = &g->n[i], *x = &g->n[j];
    if (i == j || i >= g->count || (nd->kind != DPAR__G_PSUM && nd->kind != DPAR__G_PMEAN) || !p->alias_on ||
        !nd->keep || nd->async || nd->bucket || g->pp || !nd->axes || dpar__mask_size(g->mesh, nd->axes) != 1)
        return false;
    return nd->in[0] == j && p->pooled[j] && !p->alias[j] && x->dtype == nd->dtype && x->ndim == nd->ndim &&
           !memcmp(x->shape, nd->shape, (size_t)nd->ndim * sizeof nd->shape[0]);
}
static dpar_status dpar__g_assign(dpar_graph *g, dpar__gplan *p, int i) {
    dpar__gnode *nd = &g->n[i];
    dpar_status s = DPAR_OK;
    if (nd->kind == DPAR__G_SGD) return DPAR_OK;
    if (nd->kind == DPAR__G_FEED || nd->kind == DPAR__G_PARAM) { /* a pipeline's feed: one micro-batch, a copy */
        if (nd->kind == DPAR__G_FEED) /* the feed's array: a pipeline's holds its M micro-batches */
            g->stats.resident_bytes += dpar__g_bytes(nd) * (size_t)(g->pp ? g->pp->M : 1);
        nd->slot = dpar__g_new_slot(g, p, nd, g->pp && nd->kind == DPAR__G_FEED ? NULL : nd->array);
        return s;
    }
    g->stats.naive_bytes += dpar__g_bytes(nd);
    p->pooled[i] = !nd->keep && nd->kind != DPAR__G_CONST && !nd->pipe; /* boundaries: written on every stage */
    if (!p->pooled[i]) p->held += dpar__g_bytes(nd); /* live through every step: read after it, or set at compile */
    p->alias[i] = p->pooled[i] ? dpar__g_alias_of(g, p, i) : 0;
    if (p->alias[i]) p->freed[p->alias[i]] = true; /* its bytes become node i's, live until i's last reader */
    if (dpar__g_ident_ok(g, p, i)) { /* its bytes are its reader's, held: its slot is set after placement */
        g->n[p->last[i]].ident = true;
        p->pooled[i] = false;
        nd->slot = -1;
        return s;
    }
    p->live += p->pooled[i] && !p->alias[i] ? dpar__g_bytes(nd) : 0;
    if (p->live > p->peak) p->peak = p->live;
    if (nd->keep && nd->spec_of) {
        if ((s = dpar__g_grad_array(g, nd->spec_of, &nd->array))) return s;
        g->stats.planned_bytes += dpar__g_bytes(nd);
        nd->slot = dpar__g_new_slot(g, p, nd, nd->array);
        return s;
    }
    nd->slot = p->pooled[i] ? -1 : dpar__g_new_slot(g, p, nd, NULL); /* pooled: placed by dpar__g_place */
    return s;
}
static void dpar__g_release(const dpar_graph *g, dpar__gplan *p, int j, int i) {
    if (j > 0 && p->pooled[j] && p->last[j] == i && !p->freed[j]) {
        p->freed[j] = true;
        p->live -= dpar__g_bytes(&g->n[j]);
    }
}
/* The graph-owned slots (f32 buffers of the planned capacity, rounded up to 4 bytes), then the consts' values. */
static dpar_status dpar__g_alloc(dpar_graph *g, const dpar__gplan *p) {
    dpar_status s = DPAR_OK;
    g->slot_bytes = (size_t *)DPAR_MALLOC((size_t)g->nslots * sizeof(size_t) + 1);
    if (!g->slot_bytes) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    for (int k = 0; k < g->nslots && !s; k++) {
        int64_t n = (int64_t)((p->sbytes[k] + 3) / 4);
        g->slot_bytes[k] = (size_t)n * 4;
        if (!g->slot_owned[k]) continue;
        g->stats.planned_bytes += (uint64_t)n * 4;
        for (int li = 0; li < g->nlocal && !s; li++)
            s = dpar_buffer_create(g->rt, g->first + li, DPAR_F32, 1, &n, &g->slots[k * g->nlocal + li]);
    }
    for (int i = 1; i < g->count && !s; i++)
        for (int li = 0; li < g->nlocal && !s && g->n[i].kind == DPAR__G_CONST; li++)
            s = dpar_fill(dpar__g_buf(g, i, li), g->n[i].fp);
    return s;
}
/* Destroys buffer b of slot k; a graph-owned one gets its created type back first (the memory count). */
static void dpar__g_slot_free(const dpar_graph *g, int k, dpar_buffer *b) {
    if (!b) return;
    if (g->slot_owned[k] && g->slot_bytes) {
        b->dtype = DPAR_F32, b->ndim = 1, b->nbytes = g->slot_bytes[k];
        b->count = b->shape[0] = (int64_t)(g->slot_bytes[k] / 4);
    }
    dpar_buffer_destroy(b);
}
/* >>graph buckets ============================================================
   A gradient reduced blocking (smaller than DPAR_GRAPH_ASYNC_BYTES) costs every member of the group a
   rendezvous per step however few its bytes, and with emulated devices on few cores that rendezvous,
   not the bytes, is the price (the digits MLP's four gradients: four rendezvous). Such reductions of
   the same kind over the same axes share a bucket of at most DPAR__G_BUCKET_BYTES (PyTorch DDP's
   first bucket is 1 MB): the members' values are concatenated, reduced in place by one asynchronous
   collective started when the last member's value exists (a blocking one where nothing runs before its
   wait: dpar__g_bucket_blocking), and copied back to the members' buffers
   when it is waited for (before the optimizer, or at the end of the run). Reductions add in rank order
   element by element, so the results are bit for bit those of one reduction per gradient. The pinned
   loss's pmean joins too (read by no node, only after the run): no blocking collective in mid-step,
   whose host-staged read of the loss would wait for the forward pass and end a recorded segment
   (>>graph program). Each member copies its value into the bucket when it runs, so only the last
   member's node runs anything but a device copy, and the others join a recording. */
enum { DPAR__G_BUCKET_BYTES = 1 << 20 };

/* Whether reduction node i may join a bucket: a final gradient (kept, of a leaf) or the pinned loss, f32,
   reduced blocking over axes of more than one device (over one it is a copy: a bucket would only add
   two), read by no node (only by the optimizer, or by the user after the run). */
static bool dpar__g_bucketable(const dpar_graph *g, int i, const bool *read) {
    const dpar__gnode *nd = &g->n[i];
    return (nd->kind == DPAR__G_PSUM || nd->kind == DPAR__G_PMEAN) && nd->keep && (nd->spec_of || i == g->loss_value) &&
           !nd->async && nd->axes && dpar__mask_size(g->mesh, nd->axes) > 1 && nd->dtype == DPAR_F32 && !read[i] &&
           (uint64_t)dpar__g_count(nd) * 4u <= (uint64_t)DPAR__G_BUCKET_BYTES / 2;
}
/* The newest bucket that node i may join (same kind and axes, room left), or -1. */
static int dpar__g_bucket_open(const dpar_graph *g, int i) {
    const dpar__gnode *nd = &g->n[i];
    for (int b = g->nbk - 1; b >= 0; b--) {
        const dpar__gnode *m = &g->n[g->bk[b].members[0]];
        if (m->kind != nd->kind || strcmp(m->axes_str, nd->axes_str) != 0) continue;
        return (g->bk[b].count + dpar__g_count(nd)) * 4 <= DPAR__G_BUCKET_BYTES ? b : -1;
    }
    return -1;
}
/* At compile, before the plan: every bucketable reduction joins the newest bucket of its kind and axes,
   or opens one; a bucket left with one member is dissolved (that reduction runs alone, as before). */
static dpar_status dpar__g_bucket_plan(dpar_graph *g) {
    if (g->pp || g->z1) return DPAR_OK; /* their reductions are per micro-batch / reduce-scatters */
    int c = g->count;
    bool *read = (bool *)DPAR_MALLOC((size_t)c + 1);
    g->bk = (dpar__gbucket *)DPAR_MALLOC((size_t)c * sizeof(dpar__gbucket));
    int *where = (int *)DPAR_MALLOC((size_t)c * sizeof(int)); /* a member's index in its bucket */
    if (!read || !g->bk || !where) {
        DPAR_FREE(read), DPAR_FREE(where);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    }
    memset(read, 0, (size_t)c + 1);
    memset(g->bk, 0, (size_t)c * sizeof(dpar__gbucket));
    for (int i = 1; i < c; i++)
        for (int j = 0; j < g->n[i].nin; j++) read[g->n[i].in[j]] = true;
    dpar_status s = DPAR_OK;
    for (int i = 1; i < c && !s; i++) {
        if (!dpar__g_bucketable(g, i, read)) continue;
        int b = dpar__g_bucket_open(g, i);
        if (b < 0) {
            b = g->nbk++;
            g->bk[b].members = (int *)DPAR_MALLOC((size_t)c * sizeof(int));
            g->bk[b].offset = (int64_t *)DPAR_MALLOC((size_t)c * sizeof(int64_t));
            if (!g->bk[b].members || !g->bk[b].offset)
                s = dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
        }
        if (s) break;
        dpar__gbucket *bk = &g->bk[b];
        where[i] = bk->n;
        bk->members[bk->n] = i, bk->offset[bk->n++] = bk->count;
        bk->count += dpar__g_count(&g->n[i]);
        g->n[i].bucket = b + 1;
    }
    for (int b = 0; b < g->nbk; b++)
        if (g->bk[b].n == 1) g->n[g->bk[b].members[0]].bucket = 0, g->bk[b].n = 0;
    DPAR_FREE(read);
    DPAR_FREE(where);
    return s;
}
/* At compile, after the plan: each bucket's buffer on every local device (part of the planned live set). */
static dpar_status dpar__g_bucket_alloc(dpar_graph *g) {
    dpar_status s = DPAR_OK;
    for (int b = 0; b < g->nbk && !s; b++) {
        dpar__gbucket *bk = &g->bk[b];
        if (!bk->n) continue;
        bk->buf = (dpar_buffer **)DPAR_MALLOC((size_t)g->nlocal * sizeof(dpar_buffer *));
        if (!bk->buf) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
        memset(bk->buf, 0, (size_t)g->nlocal * sizeof(dpar_buffer *));
        for (int li = 0; li < g->nlocal && !s; li++)
            s = dpar_buffer_create(g->rt, g->first + li, DPAR_F32, 1, &bk->count, &bk->buf[li]);
        g->stats.planned_bytes += (uint64_t)bk->count * 4u;
        g->stats.live_bytes += (uint64_t)bk->count * 4u;  /* held all step, as in any plan */
        g->stats.naive_bytes += (uint64_t)bk->count * 4u; /* a buffer either plan needs */
    }
    return s;
}
/* Whether node i runs anything (feeds, params, consts, fused gradients and identities run nothing). */
static bool dpar__g_runs(const dpar__gnode *nd) {
    return nd->kind != DPAR__G_FEED && nd->kind != DPAR__G_PARAM && nd->kind != DPAR__G_CONST && nd->fused >= 0 &&
           !nd->ident;
}
/* At compile, after the plan: a bucket whose start is followed by no work before it is waited for (the
   optimizer, or the end of the run) has nothing to overlap; its asynchronous collective would only add
   the hand-off to the comm threads and back (on Vulkan a comm thread per device, with its own waits).
   Such a bucket is reduced by a blocking collective on the device's worker, as the eager step's pmeans.
   When the optimizer follows, its node copies the members' blocks back (at_opt): the copies and the
   optimizer step are then one recorded segment after the collective (>>graph program), not ops issued
   one by one. */
static void dpar__g_bucket_blocking(dpar_graph *g) {
    for (int b = 0; b < g->nbk; b++) {
        dpar__gbucket *bk = &g->bk[b];
        if (!bk->n) continue;
        bk->blocking = true;
        int j = bk->members[bk->n - 1] + 1;
        for (; j < g->count && g->n[j].kind != DPAR__G_SGD && bk->blocking; j++) bk->blocking = !dpar__g_runs(&g->n[j]);
        bk->at_opt = bk->blocking && j < g->count && g->n[j].kind == DPAR__G_SGD;
    }
}
static void dpar__g_bucket_free(dpar_graph *g) {
    for (int b = 0; g->bk && b < g->nbk; b++) {
        for (int li = 0; g->bk[b].buf && li < g->nlocal; li++) dpar_buffer_destroy(g->bk[b].buf[li]);
        DPAR_FREE(g->bk[b].buf);
        DPAR_FREE(g->bk[b].members);
        DPAR_FREE(g->bk[b].offset);
    }
    DPAR_FREE(g->bk);
}
/* Whether node i reduces: not a bucket member, or the last one (which starts its bucket). */
static bool dpar__g_bucket_starts(const dpar_graph *g, int i) {
    const dpar__gbucket *bk = g->n[i].bucket ? &g->bk[g->n[i].bucket - 1] : NULL;
    return !bk || bk->members[bk->n - 1] == i;
}
/* The plan keeps each member's input until its bucket starts (at the last member). */
static void dpar__g_bucket_lives(const dpar_graph *g, int *last) {
    for (int b = 0; b < g->nbk; b++)
        for (int k = 0, end = g->bk[b].n ? g->bk[b].members[g->bk[b].n - 1] : 0; k < g->bk[b].n; k++) {
            int in = g->n[g->bk[b].members[k]].in[0];
            if (last[in] < end) last[in] = end;
        }
}
static dpar_buffer *dpar__g_buf(const dpar_graph *g, int id, int li);
/* After the wait for the bucket that node i started: each member's block into its own buffer. */
static dpar_status dpar__g_bucket_finish(dpar_graph *g, int li, int i) {
    const dpar__gbucket *bk = &g->bk[g->n[i].bucket - 1];
    dpar_status s = DPAR_OK;
    const int64_t one = 1;
    for (int k = 0; k < bk->n && !s; k++) {
        dpar_buffer *y = dpar__g_buf(g, bk->members[k], li);
        s = dpar__strided(y, bk->buf[li], 1, &y->count, &one, bk->offset[k], &one, 0);
    }
    return s;
}
/* Member i of a bucket has its value: copies it into its block; the last member starts the reduction. */
static dpar_status dpar__g_bucket_start(dpar_graph *g, dpar_ctx *ctx, int li, int i) {
    const dpar__gbucket *bk = &g->bk[g->n[i].bucket - 1];
    const dpar_buffer *x = dpar__g_buf(g, g->n[i].in[0], li);
    const int64_t one = 1;
    int k = 0;
    while (bk->members[k] != i) k++;
    dpar_status s = dpar__strided(bk->buf[li], x, 1, &x->count, &one, 0, &one, bk->offset[k]);
    if (s || !dpar__g_bucket_starts(g, i)) return s;
    if (bk->blocking) {
        dpar_buffer *y = bk->buf[li];
        s = g->n[i].kind == DPAR__G_PMEAN ? dpar_pmean(ctx, y, y, g->n[i].axes_str)
                                          : dpar_psum(ctx, y, y, g->n[i].axes_str);
        return s || bk->at_opt ? s : dpar__g_bucket_finish(g, li, i); /* at_opt: the optimizer's node copies */
    }
    return dpar_preduce_start(ctx, bk->buf[li], bk->buf[li], g->n[i].axes_str,
                              g->n[i].kind == DPAR__G_PMEAN ? DPAR_MEAN : DPAR_SUM, &g->reqs[i * g->nlocal + li]);
}

/* A loss and its gradient node read the same logits and labels (the rules of >>graph grad make the
   gradient a separate node): the loss node computes both in one pass, as the eager step does, so the
   softmax (or the difference) is evaluated once per step; the gradient's buffer is then live from the
   loss node on (dpar__g_plan). Remat copies only match their own gradient nodes. */
static bool dpar__g_fusable(const dpar__gnode *loss, const dpar__gnode *grad) {
    bool kinds = (loss->kind == DPAR__G_XENT && grad->kind == DPAR__G_XENT_GRAD) ||
                 (loss->kind == DPAR__G_MSE && grad->kind == DPAR__G_MSE_GRAD) ||
                 (loss->kind == DPAR__G_XENT_IGN && grad->kind == DPAR__G_XENT_IGN_GRAD && loss->ip[0] == grad->ip[0] &&
                  loss->ip[1] == grad->ip[1] && loss->fp == grad->fp);
    return kinds && loss->fused == 0 && loss->in[0] == grad->in[0] && loss->in[1] == grad->in[1];
}
static void dpar__g_fuse_losses(dpar_graph *g) {
    for (int j = 1; j < g->count; j++) {
        int k = g->n[j].kind;
        if (k != DPAR__G_XENT_GRAD && k != DPAR__G_MSE_GRAD && k != DPAR__G_XENT_IGN_GRAD) continue;
        for (int i = j - 1; i >= 1; i--)
            if (dpar__g_fusable(&g->n[i], &g->n[j]) && g->n[i].stage == g->n[j].stage) {
                g->n[i].fused = j, g->n[j].fused = -i;
                break;
            }
    }
}
/* Attention's gradient nodes (dq, dk, dv) read the same dout, q, k, v and statistics (the rule of >>graph
   grad makes one node each): the first computes all of them in one dpar_attention_backward call, so the
   backward recomputes P and dP once, not once a node (the GPT step's 1x1 CPU time: see CHANGELOG); the
   others' buffers are then live from the first on (dpar__g_plan), as a fused loss's gradient. */
static bool dpar__g_attn_grad(const dpar__gnode *nd) {
    return nd->kind == DPAR__G_ATTN_DQ || nd->kind == DPAR__G_ATTN_DK || nd->kind == DPAR__G_ATTN_DV;
}
static void dpar__g_fuse_attn(dpar_graph *g) {
    for (int i = 1; i < g->count; i++) {
        dpar__gnode *a = &g->n[i];
        if (!dpar__g_attn_grad(a) || a->fused) continue;
        for (int j = i + 1; j < g->count && !a->fused2; j++) {
            dpar__gnode *b = &g->n[j];
            if (!dpar__g_attn_grad(b) || b->fused || b->kind == a->kind || b->stage != a->stage ||
                memcmp(b->in, a->in, 5 * sizeof a->in[0]) || b->ip[0] != a->ip[0] || b->fp != a->fp ||
                (a->fused && g->n[a->fused].kind == b->kind))
                continue;
            *(a->fused ? &a->fused2 : &a->fused) = j;
            b->fused = -i;
        }
    }
}
static dpar_status dpar__g_plan(dpar_graph *g) {
    int c = g->count;
    dpar__gplan p;
    p.last = (int *)DPAR_MALLOC((size_t)c * sizeof(int));
    p.pooled = (bool *)DPAR_MALLOC((size_t)c * sizeof(bool));
    p.sbytes = (size_t *)DPAR_MALLOC((size_t)c * sizeof(size_t));
    p.freed = (bool *)DPAR_MALLOC((size_t)c * sizeof(bool));
    p.born = (int *)DPAR_MALLOC((size_t)c * sizeof(int));
    p.alias = (int *)DPAR_MALLOC((size_t)c * sizeof(int));
    p.alias_on = dpar__env_int("DPAR_GRAPH_ALIAS", 1) != 0; /* in range: dpar_runtime_create checked it */
    g->slots = (dpar_buffer **)DPAR_MALLOC((size_t)c * (size_t)g->nlocal * sizeof(dpar_buffer *) + 1);
    g->slot_owned = (bool *)DPAR_MALLOC((size_t)c * sizeof(bool));
    dpar_status s = DPAR_OK;
    if (!p.last || !p.pooled || !p.sbytes || !p.freed || !p.born || !p.alias || !g->slots || !g->slot_owned) {
        s = dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    } else {
        memset(p.pooled, 0, (size_t)c * sizeof(bool));
        memset(p.freed, 0, (size_t)c * sizeof(bool));
        memset(p.alias, 0, (size_t)c * sizeof(int));
        p.live = p.peak = p.held = 0;
        memset(g->slots, 0, (size_t)c * (size_t)g->nlocal * sizeof(dpar_buffer *));
        for (int i = 0; i < c; i++) p.last[i] = p.born[i] = i;
        for (int i = 1; i < c; i++)
            if (g->n[i].fused > 0) p.born[g->n[i].fused] = i;
        for (int i = 1; i < c; i++)
            if (g->n[i].fused2 > 0) p.born[g->n[i].fused2] = i;
        for (int i = 1; i < c; i++)
            for (int j = 0; j < g->n[i].nin; j++) p.last[g->n[i].in[j]] = i;
        for (int i = 1; i < c; i++) /* an async reduction reads its input until it is waited for */
            if (g->n[i].async) p.last[g->n[i].in[0]] = c;
        for (int i = 1; i < c && g->has_opt; i++)
            if (g->n[i].kind == DPAR__G_SGD)
                for (int k = 0; k < g->opt.n; k++) p.last[g->opt.grads[k]] = i;
        dpar__g_bucket_lives(g, p.last);
        for (int i = 1; i < c && !s; i++) {
            if (g->n[i].fused >= 0) s = dpar__g_assign(g, &p, i); /* a fused gradient: assigned with its loss */
            if (!s && g->n[i].fused > 0) s = dpar__g_assign(g, &p, g->n[i].fused);
            if (!s && g->n[i].fused2 > 0) s = dpar__g_assign(g, &p, g->n[i].fused2);
            for (int j = 0; j < g->n[i].nin; j++) dpar__g_release(g, &p, g->n[i].in[j], i);
            const dpar__gbucket *bk = g->n[i].bucket ? &g->bk[g->n[i].bucket - 1] : NULL;
            for (int k = 0; bk && dpar__g_bucket_starts(g, i) && k < bk->n; k++) /* the bucket started here */
                dpar__g_release(g, &p, g->n[bk->members[k]].in[0], i);
            for (int k = 0; g->n[i].kind == DPAR__G_SGD && k < g->opt.n; k++)
                dpar__g_release(g, &p, g->opt.grads[k], i);
            dpar__g_release(g, &p, i, i);
        }
        g->stats.live_bytes = p.peak + p.held;
        for (int i = 1; i < c; i++) { /* an aliased output joins the chain's first value: one life, one slot */
            int r = p.alias[i] && p.alias[p.alias[i]] ? p.alias[p.alias[i]] : p.alias[i];
            if (!r) continue;
            p.alias[i] = r, p.pooled[i] = false;
            if (p.last[r] < p.last[i]) p.last[r] = p.last[i];
        }
        if (!s) s = dpar__g_place(g, &p);
        for (int i = 1; i < c && !s; i++)
            if (p.alias[i]) g->n[i].slot = g->n[p.alias[i]].slot;
        for (int i = 1; i < c && !s; i++)
            if (g->n[i].ident) g->n[g->n[i].in[0]].slot = g->n[i].slot;
        if (!s) s = dpar__g_alloc(g, &p);
    }
    DPAR_FREE(p.last);
    DPAR_FREE(p.pooled);
    DPAR_FREE(p.sbytes);
    DPAR_FREE(p.freed);
    DPAR_FREE(p.born);
    DPAR_FREE(p.alias);
    return s;
}
static dpar_status dpar__g_state_list(dpar_graph *g);
/* The optimizer state (global arrays, so checkpoints save and restore it),
   the xent/mse scratch, and the optimizer's pointer lists. */
static dpar_status dpar__g_state(dpar_graph *g) {
    int nl = g->nlocal, n = g->has_opt ? g->opt.n : 0;
    g->scratch = (dpar_buffer **)DPAR_MALLOC((size_t)nl * sizeof(dpar_buffer *));
    g->opt_state = (dpar_array **)DPAR_MALLOC((size_t)(2 * n + 1) * sizeof(dpar_array *));
    g->sgd_ptrs = (dpar_buffer **)DPAR_MALLOC((size_t)(4 * n * nl + 1) * sizeof(dpar_buffer *));
    g->clip_ptrs = (dpar_buffer **)DPAR_MALLOC((size_t)(n * nl + 1) * sizeof(dpar_buffer *));
    g->reqs = (dpar_request **)DPAR_MALLOC((size_t)g->count * (size_t)nl * sizeof(dpar_request *));
    if (g->reqs) memset(g->reqs, 0, (size_t)g->count * (size_t)nl * sizeof(dpar_request *));
    if (!g->scratch || !g->opt_state || !g->sgd_ptrs || !g->clip_ptrs || !g->reqs)
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    memset(g->scratch, 0, (size_t)nl * sizeof(dpar_buffer *));
    memset(g->opt_state, 0, (size_t)(2 * n + 1) * sizeof(dpar_array *));
    dpar_status s = DPAR_OK;
    for (int li = 0; li < nl && !s; li++)
        s = dpar_buffer_create(g->rt, g->first + li, DPAR_F32, 0, NULL, &g->scratch[li]);
    g->stats.resident_bytes += sizeof(float);
    bool f64 = false; /* f64 values (a cpu graph): an f64 scratch for their discarded losses */
    for (int i = 1; i < g->count && !f64; i++) f64 = g->n[i].dtype == DPAR_F64;
    if (f64 && !s && !(g->scratch64 = (dpar_buffer **)DPAR_MALLOC((size_t)nl * sizeof(dpar_buffer *))))
        s = dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    if (g->scratch64) memset(g->scratch64, 0, (size_t)nl * sizeof(dpar_buffer *));
    for (int li = 0; li < nl && !s && g->scratch64; li++)
        s = dpar_buffer_create(g->rt, g->first + li, DPAR_F64, 0, NULL, &g->scratch64[li]);
    if (g->scratch64) g->stats.resident_bytes += sizeof(double);
    int nstate = !g->has_opt ? 0 : g->opt.adamw ? 2 : g->opt.d.momentum != 0.0f ? 1 : 0; /* m, v / momentum */
    if (!s && g->z1) s = dpar__g_z1_alloc(g, nstate); /* ZeRO-1: blocks of the params and of their state */
    for (int k = 0; k < n && !s && !g->z1; k++)
        for (int j = 0; j < nstate && !s; j++)
            s = dpar__g_grad_array(g, g->opt.params[k], &g->opt_state[j * n + k]); /* zero, of p's dtype */
    for (int k = 0; k < n && !s; k++)
        for (int li = 0; li < nl; li++) {
            dpar_buffer **ptr = g->sgd_ptrs + (size_t)li * 4 * (size_t)n; /* params, grads, state 0, state 1 */
            const dpar__gnode *p = &g->n[g->opt.params[k]];
            ptr[k] = g->z1 ? g->z1->blk[k * nl + li] : g->slots[p->slot * nl + li];
            ptr[n + k] = g->slots[g->n[g->opt.grads[k]].slot * nl + li];
            for (int j = 0; j < nstate; j++) /* ZeRO-1: this device's block of the state */
                ptr[(2 + j) * n + k] =
                    dpar_array_shard(g->z1 ? g->z1->state[j * n + k] : g->opt_state[j * n + k], g->first + li);
            if (!g->z1 && li == 0)
                g->stats.opt_bytes += (uint64_t)nstate * (uint64_t)dpar__g_count(p) * dpar_dtype_size(p->dtype);
        }
    for (int k = 0; k < n && g->opt.split_order; k++) /* a clip's grads, grouped by split */
        for (int li = 0; li < nl; li++)
            g->clip_ptrs[(size_t)li * (size_t)n + (size_t)k] =
                g->sgd_ptrs[(size_t)li * 4 * (size_t)n + (size_t)n + (size_t)g->opt.split_order[k]];
    return s ? s : dpar__g_state_list(g);
}
DPAR_API dpar_status dpar_graph_compile(dpar_graph *g, dpar_graph_stats *stats) {
    dpar__clear_error();
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_compile: graph is NULL");
    if (dpar__live_check(g, DPAR__LIVE_GRAPH, "dpar_graph_compile")) return DPAR_ERR_STATE;
    if (g->err) return dpar__g_status(g);
    if (g->compiled) return dpar__err(DPAR_ERR_STATE, "dpar_graph_compile: the graph is compiled already");
    if (dpar_in_dispatch())
        return dpar__err(DPAR_ERR_STATE, "dpar_graph_compile: called inside a pmap/shard_map function");
    memset(&g->stats, 0, sizeof g->stats);
    dpar_status s = g->pp ? dpar__g_pipe_check(g) : DPAR_OK;
    if (s) return s;
    dpar__g_fuse_losses(g);
    dpar__g_fuse_attn(g);
    s = dpar__g_bucket_plan(g);
    if (!s) s = dpar__g_plan(g);
    if (!s) s = dpar__g_bucket_alloc(g);
    if (!s) dpar__g_bucket_blocking(g);
    if (!s) s = dpar__g_state(g);
    if (!s && g->pp) s = dpar__g_pipe_alloc(g);
    if (s) return dpar__err(s, "dpar_graph_compile: %s", dpar_last_error());
    g->stats.nodes = g->count - 1;
    for (int k = 0; k < g->nslots; k++) g->stats.buffers += g->slot_owned[k];
    for (int i = 1; i < g->count; i++) {
        const dpar__gnode *nd = &g->n[i];
        g->stats.grad_reductions += (nd->kind == DPAR__G_PSUM || nd->kind == DPAR__G_PMEAN) && nd->keep &&
                                    (nd->bucket ? dpar__g_bucket_starts(g, i) : nd->spec_of != 0);
    }
    g->opt_rec = dpar__g_opt_recordable(g);
    g->compiled = true;
    if (stats) *stats = g->stats;
    return DPAR_OK;
}

/* ---- run: each node lowered to its eager op ---- */
/* Node id's buffer on local device li, shaped as the node (pooled buffers change shape). */
static dpar_buffer *dpar__g_buf(const dpar_graph *g, int id, int li) {
    const dpar__gnode *nd = &g->n[id];
    int m = g->mb_now ? g->mb_now[li] : 0; /* pipelines: the buffer set of the device's micro-batch */
    dpar_buffer *b =
        m ? g->mb_slots[((size_t)(m - 1) * (size_t)g->nslots + (size_t)nd->slot) * (size_t)g->nlocal + (size_t)li]
          : g->slots[nd->slot * g->nlocal + li];
    b->ndim = nd->ndim;
    for (int d = 0; d < nd->ndim; d++) b->shape[d] = nd->shape[d];
    if (g->slot_owned[nd->slot]) { /* a pooled slot: this node's dtype and size within its capacity */
        b->dtype = nd->dtype;
        b->count = dpar__g_count(nd);
        b->nbytes = dpar__g_bytes(nd);
    }
    return b;
}
static void dpar__g_view2(dpar_buffer *b, int64_t rows, int64_t cols) {
    b->ndim = 2;
    b->shape[0] = rows;
    b->shape[1] = cols;
}
/* This member's block of an all_gather'ed x along dim: a dpar_slice (f32, i32) on the device, y viewed with
   x's rank (size 1 at dim when the gather stacked); other dtypes are staged through the host. */
static dpar_status dpar__g_block_run(dpar_ctx *ctx, const dpar__gnode *nd, const dpar__gnode *xn, dpar_buffer *y,
                                     const dpar_buffer *x) {
    int k = 0, n = 1, d = nd->ip[0];
    dpar_status s = dpar_ctx_axis_index(ctx, nd->axes_str, &k);
    if (!s) s = dpar_ctx_axis_size(ctx, nd->axes_str, &n);
    if (s) return s;
    int64_t rows = xn->shape[d], blk = nd->ip[1] ? rows / n : 1;
    if (xn->dtype == DPAR_F32 || xn->dtype == DPAR_I32) {
        int ndim = y->ndim;
        int64_t shape[DPAR_MAX_DIMS], start[DPAR_MAX_DIMS] = { 0 };
        memcpy(shape, y->shape, sizeof shape);
        y->ndim = xn->ndim;
        for (int i = 0; i < xn->ndim; i++) y->shape[i] = i == d ? blk : xn->shape[i];
        start[d] = k * blk;
        s = dpar_slice(y, x, start, NULL);
        y->ndim = ndim; /* y may be a gradient array's shard: its own shape back */
        memcpy(y->shape, shape, sizeof shape);
        return s;
    }
    size_t es = dpar_dtype_size(xn->dtype), inner = es;
    int64_t outer = 1;
    for (int i = 0; i < d; i++) outer *= xn->shape[i];
    for (int i = d + 1; i < xn->ndim; i++) inner *= (size_t)xn->shape[i];
    size_t nin = dpar_buffer_nbytes(x), nout = dpar_buffer_nbytes(y);
    char *hin = (char *)DPAR_MALLOC(nin + 1), *hout = (char *)DPAR_MALLOC(nout + 1);
    if (!hin || !hout) s = dpar__err(DPAR_ERR_OUT_OF_MEMORY, "block: out of memory");
    if (!s) s = dpar_buffer_read(x, 0, hin, nin);
    for (int64_t o = 0; o < outer && !s; o++)
        memcpy(hout + (size_t)(o * blk) * inner, hin + (size_t)(o * rows + k * blk) * inner, (size_t)blk * inner);
    if (!s) s = dpar_buffer_write(y, 0, hout, nout);
    DPAR_FREE(hin);
    DPAR_FREE(hout);
    return s;
}
/* Waits for this device's async gradient reductions; the first error is returned, every one is waited for. */
static dpar_status dpar__g_wait_all(dpar_graph *g, dpar_ctx *ctx, int li) {
    dpar_status first = DPAR_OK;
    for (int i = 1; i < g->count; i++) {
        dpar_request **r = &g->reqs[i * g->nlocal + li];
        if (!*r) continue;
        dpar_status s = dpar_wait(ctx, *r);
        *r = NULL;
        if (!s && g->n[i].bucket) s = dpar__g_bucket_finish(g, li, i);
        if (s && !first) first = s;
    }
    return first;
}
static dpar_status dpar__g_exec(dpar_graph *g, dpar_ctx *ctx, int li, int i) {
    const dpar__gnode *nd = &g->n[i];
    if (nd->kind == DPAR__G_FEED || nd->kind == DPAR__G_PARAM || nd->kind == DPAR__G_CONST) return DPAR_OK;
    if (nd->fused < 0 || nd->ident)
        return DPAR_OK; /* written by its loss (attention: first gradient) node; by its input's */
    if (nd->bucket) return dpar__g_bucket_start(g, ctx, li, i);
    if (nd->async) /* a gradient's reduction overlaps the rest of the backward pass (DDP's buckets, one per grad) */
        return dpar_preduce_start(ctx, dpar__g_buf(g, i, li), dpar__g_buf(g, nd->in[0], li), nd->axes_str,
                                  nd->kind == DPAR__G_PMEAN ? DPAR_MEAN : DPAR_SUM, &g->reqs[i * g->nlocal + li]);
    if (nd->kind == DPAR__G_SGD) {
        dpar_status s = DPAR_OK;
        for (int b = 0; b < g->nbk && !s; b++) /* blocking buckets reduced just before: their members' values */
            if (g->bk[b].at_opt) s = dpar__g_bucket_finish(g, li, g->bk[b].members[g->bk[b].n - 1]);
        if (!s) s = dpar__g_wait_all(g, ctx, li);
        if (s) return s;
        if (g->z1) return dpar__g_z1_step(g, ctx, li);
        int n = g->opt.n;
        dpar_buffer **p = g->sgd_ptrs + (size_t)li * 4 * (size_t)n;
        if (g->opt.mixed || g->opt.decay) return dpar__g_opt_step(g, ctx, li, p);
        if (g->opt.adamw) return dpar_adamw_step(ctx, &g->opt.ad, p, p + n, p + 2 * n, p + 3 * n, n, g->opt.step + 1);
        return dpar_sgd_step(ctx, &g->opt.d, p, p + n, g->opt.d.momentum != 0.0f ? p + 2 * n : NULL, n);
    }
    dpar_buffer *y = dpar__g_buf(g, i, li), *a = nd->nin > 0 ? dpar__g_buf(g, nd->in[0], li) : NULL;
    dpar_buffer *b = nd->nin > 1 ? dpar__g_buf(g, nd->in[1], li) : NULL;
    const char *ax = nd->axes_str;
    dpar_status s = DPAR_OK;
    switch (nd->kind) {
    case DPAR__G_XENT_IGN:
    case DPAR__G_XENT_IGN_GRAD:
    case DPAR__G_EMBED:
    case DPAR__G_EMBED_GRAD:
    case DPAR__G_DROPOUT: return dpar__g_exec_optim(g, ctx, li, nd, y, a, b);
    case DPAR__G_ZERO1_SCATTER: return dpar__g_z1_scatter(g, ctx, li, nd, y, a);
    case DPAR__G_MATMUL: return dpar_matmul(y, a, b, nd->ip[0] != 0, nd->ip[1] != 0, 1.0f, 0.0f);
    case DPAR__G_BIAS_ADD: return (s = dpar_copy(y, a)) ? s : dpar_bias_add(y, b);
    case DPAR__G_BIAS_GRAD: return dpar_bias_grad(y, a, 0.0f);
    case DPAR__G_RELU: return dpar_relu(y, a);
    case DPAR__G_RELU_GRAD: return dpar_relu_backward(y, a, b);
    case DPAR__G_XENT: return dpar_softmax_xent(y, nd->fused ? dpar__g_buf(g, nd->fused, li) : NULL, a, b);
    case DPAR__G_XENT_GRAD: return dpar_softmax_xent(dpar__g_scratch(g, li, y), y, a, b);
    case DPAR__G_MSE: return dpar_mse(y, nd->fused ? dpar__g_buf(g, nd->fused, li) : NULL, a, b);
    case DPAR__G_MSE_GRAD: return dpar_mse(dpar__g_scratch(g, li, y), y, a, b);
    case DPAR__G_ADD: return (s = dpar_copy(y, a)) ? s : dpar_axpy(y, 1.0f, b);
    case DPAR__G_SCALE: return (s = dpar_copy(y, a)) ? s : dpar_scale(y, nd->fp);
    case DPAR__G_MULS: /* [1,1] @ [1,n]: a device scalar times x on every backend */
        dpar__g_view2(a, 1, 1), dpar__g_view2(b, 1, b->count), dpar__g_view2(y, 1, y->count);
        s = dpar_matmul(y, a, b, false, false, 1.0f, 0.0f);
        break;
    case DPAR__G_DOT:
        dpar__g_view2(a, 1, a->count), dpar__g_view2(b, 1, b->count), dpar__g_view2(y, 1, 1);
        s = dpar_matmul(y, a, b, false, true, 1.0f, 0.0f);
        break;
    case DPAR__G_SUM: return dpar_sum(y, a);
    case DPAR__G_SUMSQ: return dpar_sum_squares(y, a);
    case DPAR__G_CAST: return dpar_cast(y, a);
    case DPAR__G_COPY:
    case DPAR__G_PCAST: return dpar_copy(y, a);
    case DPAR__G_PSUM: return dpar_psum(ctx, y, a, ax);
    case DPAR__G_PMEAN: return dpar_pmean(ctx, y, a, ax);
    case DPAR__G_PMAX: return dpar_pmax(ctx, y, a, ax);
    case DPAR__G_PMIN: return dpar_pmin(ctx, y, a, ax);
    case DPAR__G_ALL_GATHER: return dpar_all_gather(ctx, y, a, ax, nd->ip[0], nd->ip[1] != 0);
    case DPAR__G_PSUM_SCATTER: return dpar_psum_scatter(ctx, y, a, ax, nd->ip[0], nd->ip[1] != 0);
    case DPAR__G_PPERMUTE: return dpar_ppermute(ctx, y, a, ax, nd->pairs, nd->npairs);
    case DPAR__G_ALL_TO_ALL: return dpar_all_to_all(ctx, y, a, ax, nd->ip[0], nd->ip[1]);
    case DPAR__G_PBROADCAST: return dpar_pbroadcast(ctx, y, a, ax, nd->ip[0]);
    case DPAR__G_BLOCK: return dpar__g_block_run(ctx, nd, &g->n[nd->in[0]], y, a);
    case DPAR__G_ROOT_ONLY: {
        int k = 0;
        if ((s = dpar_ctx_axis_index(ctx, ax, &k))) return s;
        return k == nd->ip[0] ? dpar_copy(y, a) : dpar_fill(y, 0.0f);
    }
    case DPAR__G_NORM_STATS:
    case DPAR__G_NORM:
    case DPAR__G_NORM_DX:
    case DPAR__G_NORM_DW:
    case DPAR__G_MATMUL_BATCHED:
    case DPAR__G_ATTN_STATS:
    case DPAR__G_ATTN:
    case DPAR__G_ATTN_DQ:
    case DPAR__G_ATTN_DK:
    case DPAR__G_ATTN_DV: return dpar__g_exec_norm_attn(g, nd, li, y);
    case DPAR__G_CONV2D:
    case DPAR__G_CONV2D_DX:
    case DPAR__G_CONV2D_DW:
    case DPAR__G_AVG_POOL:
    case DPAR__G_AVG_POOL_DX:
    case DPAR__G_MAX_POOL:
    case DPAR__G_MAX_POOL_DX:
        return dpar__g_conv_pool_exec(g, nd, li, y, a, b);
    DPAR__G_ELEM_CASES:
        return dpar__g_exec_elem(g, li, nd, y, a, b);
    default: return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "no lowering for op kind %d", nd->kind);
    }
    /* the 2-d views back to the nodes' shapes (a param's shard must keep its shape) */
    dpar__g_buf(g, i, li), dpar__g_buf(g, nd->in[0], li), dpar__g_buf(g, nd->in[1], li);
    return s;
}
/* >>graph program ============================================================
   Issue 12's "Vulkan: one recorded command buffer per device re-submitted
   every step". Where the backend has the prog_* hooks, the first run records
   each device's maximal runs of recordable nodes (dpar__g_recordable: ops
   whose commands depend only on the compiled graph's fixed buffers and
   shapes) into one recording each, submitted at once; later runs submit the
   recordings and run only the other nodes (collectives, optimizer steps that
   read the step or clip norms on the host or whose lr was changed, dropout whose
   seed moves with the step, ...) op by op, so a recording ends where a host-staged collective or a
   host read must run. A device whose recording fails (a node touched the host)
   replays op by op from then on. Compile happens once and the graph's buffers
   never move, so a recording stays valid until the graph is destroyed. */
typedef struct dpar__gseg {
    int i0, i1;    /* nodes [i0, i1) */
    void *prog;    /* the backend's recording */
    uint64_t nops; /* the ops it holds: each submit counts them in dpar_device_stats */
} dpar__gseg;
typedef struct dpar__gprog {
    int state; /* 0: record at the next run, 1: recorded, -1: op by op */
    int nseg, cap;
    dpar__gseg *seg;
} dpar__gprog;

static bool dpar__g_recordable(const dpar_graph *g, const dpar__gnode *nd) {
    if (nd->async) return false;
    if (nd->bucket) return !dpar__g_bucket_starts(g, (int)(nd - g->n)); /* a device copy into its bucket */
    if (nd->kind == DPAR__G_SGD) return g->opt_rec;
    return nd->fused < 0 || nd->ident || dpar__g_kinds[nd->kind].rec; /* fused, ident: run nothing */
}
/* The backend's index of local device li. */
static int dpar__g_bdev(const dpar_graph *g, int li) {
    return g->scratch[li]->device;
}
/* Frees device li's recordings; the next run records again (state 0). */
static void dpar__g_prog_clear(dpar_graph *g, int li) {
    dpar__gprog *pr = &g->prog[li];
    for (int k = 0; k < pr->nseg; k++) g->rt->be->prog_free(g->rt->bstate, dpar__g_bdev(g, li), pr->seg[k].prog);
    DPAR_FREE(pr->seg);
    memset(pr, 0, sizeof *pr);
}
/* Frees the recordings of the devices that replay them; their next run records again. */
static void dpar__g_prog_rerecord(dpar_graph *g) {
    for (int li = 0; g->prog && li < g->nlocal; li++)
        if (g->prog[li].state == 1) dpar__g_prog_clear(g, li);
}
/* Before a run: makes the per-device program states on the first run where recording applies
   (out of memory: op by op). */
static void dpar__g_prog_setup(dpar_graph *g) {
    if (g->prog || g->pp || !g->rt->be->prog_begin || DPAR__ATOMIC_LOAD(&dpar__trace_on)) return;
    const char *e = getenv("DPAR_GRAPH_RECORD");
    if (e && !strcmp(e, "0")) return;
    g->prog = (dpar__gprog *)DPAR_MALLOC((size_t)g->nlocal * sizeof *g->prog);
    if (g->prog) memset(g->prog, 0, (size_t)g->nlocal * sizeof *g->prog);
}
static dpar_status dpar__g_prog_keep(dpar__gprog *pr, int i0, int i1, void *prog, uint64_t nops) {
    if (pr->nseg == pr->cap) {
        int cap = pr->cap ? 2 * pr->cap : 8;
        dpar__gseg *ns = (dpar__gseg *)DPAR_REALLOC(pr->seg, (size_t)cap * sizeof *ns);
        if (!ns) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_run: out of memory (graph program)");
        pr->seg = ns;
        pr->cap = cap;
    }
    dpar__gseg *sg = &pr->seg[pr->nseg++];
    sg->i0 = i0, sg->i1 = i1, sg->prog = prog, sg->nops = nops;
    return DPAR_OK;
}
/* Records nodes *i.. (the run of recordable nodes starting there) on device li
   and submits the recording; leaves *i at the run's last node, or at the node
   that failed. A recording that fails turns the device to op by op (the nodes
   run again op by op, so a real error is reported as without recording). */
static dpar_status dpar__g_prog_record(dpar_graph *g, dpar_ctx *ctx, int li, int *i) {
    const dpar__backend_iface *be = g->rt->be;
    dpar__gprog *pr = &g->prog[li];
    int i0 = *i, i1 = i0, dev = dpar__g_bdev(g, li);
    while (i1 < g->count && dpar__g_recordable(g, &g->n[i1])) i1++;
    void *prog = NULL;
    uint64_t ops0 = dpar__obs_ops(g->rt, dev);
    /* The communication thread issues this device's async gradient reductions into the same streams; one
       issued while the recording is open would land in it (a CUDA stream capture takes every thread's
       work, and replays it every step). Waiting costs the first run only: later runs submit, not record. */
    dpar__worker_issued(&g->rt->workers[ctx->device - ctx->rt->local_base]);
    dpar_status s = be->prog_begin(g->rt->bstate, dev);
    if (!s) {
        for (int j = i0; j < i1 && !s; j++) s = dpar__g_exec(g, ctx, li, j);
        dpar_status e = be->prog_end(g->rt->bstate, dev, &prog);
        if (!s) s = e;
        if (s && prog) be->prog_free(g->rt->bstate, dev, prog), prog = NULL;
    }
    if (!s && prog && !(s = be->prog_submit(g->rt->bstate, dev, prog)))
        s = dpar__g_prog_keep(pr, i0, i1, prog, dpar__obs_ops(g->rt, dev) - ops0);
    if (s && prog) {
        be->prog_free(g->rt->bstate, dev, prog); /* waits for its submit, if any */
        *i = i1 - 1;
        return s;
    }
    if (s) { /* not recordable after all: op by op */
        dpar__g_prog_clear(g, li);
        pr->state = -1;
        for (int j = i0; j < i1; j++)
            if ((s = dpar__g_exec(g, ctx, li, j))) {
                *i = j;
                return s;
            }
    }
    *i = i1 - 1;
    return DPAR_OK;
}
/* One node (pr NULL or op by op), or from a recorded run's first node: submits
   (state 1) or records (state 0) the run and moves *i to its last node. *k: the next segment. pre: the
   step's staged feed copies as a recording (>>graph feeds), submitted with the next segment; prog NULL: none. */
static dpar_status dpar__g_step_node(dpar_graph *g, dpar_ctx *ctx, int li, dpar__gprog *pr, int *i, int *k,
                                     dpar__gseg *pre) {
    if (pr && pr->state == 0 && dpar__g_recordable(g, &g->n[*i])) return dpar__g_prog_record(g, ctx, li, i);
    if (pr && pr->state == 1 && *k < pr->nseg && pr->seg[*k].i0 == *i) {
        const dpar__backend_iface *be = g->rt->be;
        const dpar__gseg *sg = &pr->seg[(*k)++];
        int dev = dpar__g_bdev(g, li);
        double t0 = dpar__now_us();
        *i = sg->i1 - 1;
        dpar_status s = pre->prog ? be->prog_submit_pre(g->rt->bstate, dev, pre->prog, sg->prog)
                                  : be->prog_submit(g->rt->bstate, dev, sg->prog);
        dpar__obs_add_ops(g->rt, dev, sg->nops + pre->nops); /* their ops and issue time, as op by op */
        dpar__obs_time(g->rt, dev, DPAR__OBS_COMPUTE, t0);
        pre->prog = NULL, pre->nops = 0;
        return s;
    }
    return dpar__g_exec(g, ctx, li, *i);
}
DPAR_API dpar_status dpar_graph_recorded(const dpar_graph *g, int *segments, int *nodes) {
    dpar__clear_error();
    if (segments) *segments = 0;
    if (nodes) *nodes = 0;
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_recorded: graph is NULL");
    if (dpar__live_check(g, DPAR__LIVE_GRAPH, "dpar_graph_recorded")) return DPAR_ERR_STATE;
    for (int li = 0; g->prog && li < g->nlocal; li++)
        for (int k = 0; g->prog[li].state == 1 && k < g->prog[li].nseg; k++) {
            if (segments) ++*segments;
            if (nodes) *nodes += g->prog[li].seg[k].i1 - g->prog[li].seg[k].i0;
        }
    return DPAR_OK;
}

static dpar_status dpar__g_stage_in(dpar_graph *g, dpar_ctx *ctx, int li, const dpar__gprog *pr,
                                    dpar__gseg *pre); /* >>graph feeds */
static dpar_status dpar__g_dispatch(dpar_ctx *ctx, void *user) {
    dpar_graph *g = (dpar_graph *)user;
    int li = dpar_ctx_device(ctx) - g->first, k = 0;
    dpar__gprog *pr = g->prog && g->prog[li].state >= 0 && !DPAR__ATOMIC_LOAD(&dpar__trace_on) ? &g->prog[li] : NULL;
    dpar__gseg pre = { 0, 0, NULL, 0 };
    dpar_status staged = g->feed_take ? dpar__g_stage_in(g, ctx, li, pr, &pre) : DPAR_OK; /* >>graph feeds */
    if (staged) return staged;
    for (int i = 1; i < g->count; i++) {
        dpar_status s = dpar__g_step_node(g, ctx, li, pr, &i, &k, &pre);
        if (!s) continue;
        if (pr && pr->state == 0) dpar__g_prog_clear(g, li); /* a failed first run: record again next time */
        dpar__g_node_err(g, s, i);
        char text[DPAR__ERR_LEN];
        memcpy(text, dpar__err_text, sizeof text);
        dpar__g_wait_all(g, ctx, li); /* nothing left in flight; the first error stays */
        memcpy(dpar__err_text, text, sizeof text);
        return s;
    }
    if (pr && pr->state == 0) pr->state = 1;
    return dpar__g_wait_all(g, ctx, li);
}
/* Whether the graph's mesh still exists (its feed and gradient arrays die with it). */
static bool dpar__g_mesh_alive(const dpar_graph *g) {
    for (const dpar_mesh *m = g->rt->meshes; m; m = m->next)
        if (m == g->mesh) return true;
    return false;
}
/* Whether array a may feed `want` (the feed's own array, labelled l): live, same mesh, dtype and global shape. */
static dpar_status dpar__g_feed_check(const dpar_array *a, const dpar_array *want, const char *l, const char *fn) {
    char s1[160], s2[160];
    if (dpar__live_arg(a, DPAR__LIVE_ARRAY, fn, "a feed's array")) return DPAR_ERR_STATE;
    if (a->mesh != want->mesh)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: feed %s: the array is on another mesh", fn, l);
    if (a->dtype != want->dtype)
        return dpar__err(DPAR_ERR_DTYPE, "%s: feed %s is %s but the array is %s", fn, l, dpar_dtype_name(want->dtype),
                         dpar_dtype_name(a->dtype));
    bool same = a->ndim == want->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == want->shape[d];
    if (!same)
        return dpar__err(DPAR_ERR_SHAPE, "%s: feed %s has global shape %s but the array is %s", fn, l,
                         dpar__shape_str(s1, sizeof s1, want->ndim, want->shape),
                         dpar__shape_str(s2, sizeof s2, a->ndim, a->shape));
    return DPAR_OK;
}
/* Puts one feed entry into its feed's array. */
static dpar_status dpar__g_put_feed(dpar_graph *g, const dpar_graph_feed *f) {
    const dpar__gnode *nd = &g->n[f->value.id];
    char l[96];
    dpar__g_label(g, f->value.id, l, sizeof l);
    if (!f->host == !f->array)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run: feed %s: give exactly one of host and array", l);
    if (f->host) return dpar_array_put(nd->array, f->host);
    dpar_status s = dpar__g_feed_check(f->array, nd->array, l, "dpar_graph_run");
    return s ? s : dpar_array_reshard(nd->array, f->array);
}
static dpar_status dpar__g_feeds(dpar_graph *g, const dpar_graph_feed *feeds, int num) {
    char l[96];
    for (int k = 0; k < num; k++) {
        int id = feeds[k].value.id;
        if (id <= 0 || id >= g->count || g->n[id].kind != DPAR__G_FEED)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run: feeds[%d] is not a feed of this graph", k);
        for (int j = 0; j < k; j++)
            if (feeds[j].value.id == id)
                return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run: feed %s is given twice",
                                 dpar__g_label(g, id, l, sizeof l));
    }
    for (int i = 1; i < g->count; i++) {
        if (g->n[i].kind != DPAR__G_FEED) continue;
        int k = 0;
        while (k < num && feeds[k].value.id != i) k++;
        if (k == num)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_graph_run: feed %s was not given; pass it in feeds (or stage the feeds first "
                             "with dpar_graph_put_feeds and run with num_feeds = 0)",
                             dpar__g_label(g, i, l, sizeof l));
        dpar_status s = dpar__g_put_feed(g, &feeds[k]);
        if (s) return s;
    }
    return DPAR_OK;
}
static dpar_status dpar__g_run(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds, float *loss, bool take);
static dpar_status dpar__g_stage_take(dpar_graph *g, int num_feeds, const char *fn); /* >>graph feeds */
static void dpar__g_stage_untake(dpar_graph *g);
/* A run from the caller's thread (take: it takes staged feeds, see >>graph feeds) or from a step's (taken). */
static dpar_status dpar__g_run_entered(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds, float *loss,
                                       bool take) {
    dpar__clear_error();
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run: graph is NULL");
    dpar_runtime *rt = NULL; /* counted in flight: no destroy frees g or its mesh meanwhile */
    if (dpar__live_enter(g, DPAR__LIVE_GRAPH, "dpar_graph_run", 0, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__g_run(g, feeds, num_feeds, loss, take);
    dpar__live_leave(rt, 0);
    return s;
}
DPAR_API dpar_status dpar_graph_run(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds, float *loss) {
    return dpar__g_run_entered(g, feeds, num_feeds, loss, true);
}
static dpar_status dpar__g_log_loss(dpar_graph *g); /* >>graph feeds */
static dpar_status dpar__g_run(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds, float *loss, bool take) {
    if (g->err) return dpar__g_status(g);
    if (num_feeds < 0 || (num_feeds && !feeds))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run: num_feeds = %d with feeds %s", num_feeds,
                         feeds ? "given" : "NULL");
    if (!dpar__g_mesh_alive(g))
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_graph_run: the graph's mesh was destroyed; destroy a graph before its mesh");
    dpar_status busy = dpar__busy(g->mesh->rt, NULL, "dpar_graph_run");
    if (busy) return busy;
    if (loss && !g->loss_value)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_graph_run: the graph has no loss; call dpar_graph_value_and_grad or pass loss = NULL");
    dpar_status s = take ? dpar__g_stage_take(g, num_feeds, "dpar_graph_run") : DPAR_OK;
    if (!s && !g->compiled) s = dpar_graph_compile(g, NULL);
    if (!s && !g->feed_take) s = dpar__g_feeds(g, feeds, num_feeds);
    if (s) {
        if (take) dpar__g_stage_untake(g); /* nothing ran: the staged feeds stay for the next run */
        return s;
    }
    dpar__g_prog_setup(g);
    dpar_shard_map_desc d;
    memset(&d, 0, sizeof d);
    d.fn = g->pp ? dpar__g_pipe_dispatch : dpar__g_dispatch;
    d.user = g;
    if ((s = dpar_shard_map(g->mesh, &d))) return s;
    g->ran = true;
    g->opt.step++;
    if (g->loss_log && (s = dpar__g_log_loss(g))) return s;
    if (loss && g->n[g->loss_value].dtype == DPAR_F64) { /* an f64 loss: rounded here, dpar_graph_get has it whole */
        double lv = 0.0;
        s = dpar_buffer_read(dpar__g_buf(g, g->loss_value, 0), 0, &lv, sizeof lv);
        *loss = (float)lv;
        return s;
    }
    if (loss) return dpar_buffer_read(dpar__g_buf(g, g->loss_value, 0), 0, loss, sizeof *loss);
    return DPAR_OK;
}

DPAR_API dpar_array *dpar_graph_feed_array(const dpar_graph *g, dpar_value v) {
    dpar__clear_error();
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_feed_array", "the graph")) return NULL;
    if (!g || v.id <= 0 || v.id >= g->count || g->n[v.id].kind != DPAR__G_FEED) {
        dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_feed_array: not a feed of this graph (dpar_g_feed)");
        return NULL;
    }
    return g->n[v.id].array;
}

/* >>graph feeds ==============================================================
   Issue 12's "feeds in, the loss out": the asynchronous device_put of the next
   step's feeds, and the loss left on the devices until read.
   dpar_graph_put_feeds copies host batches into one of DPAR__G_STAGE_SETS
   staged sets of arrays shaped like the feeds (made by the first put), in
   turn, also while a step is in flight; a run with num_feeds = 0 takes the
   staged set, and each device copies its shards into the feeds' own arrays as
   the first op of the step's dispatch (no dispatch of its own); a replayed step
   that took a whole set submits that set's copies prerecorded, with its first
   segment (dpar__g_stage_in: one submit, nothing recorded per step). The steps in
   flight read the sets they took while the next put fills another; a put
   whose set a queued step still reads waits through the backend's refill,
   for every submitted step (Vulkan), so the next five puts find theirs free:
   one sleep per six steps instead of one a step while the device is behind
   (as many as Vulkan's ring holds batches, one a replayed step: its frames
   would bound the puts otherwise; each wait costs the host a sleep and a
   wake, the largest part of a replayed step's host time at three). Only the caller's thread
   touches the stage (puts, and the takes of dpar_graph_run / _start, which no
   step is in flight for); the step's workers read g->feed_take, set before the
   step starts. A put reads only the stage, cached at the first put: the step
   in flight may be compiling the graph's nodes. */
enum { DPAR__G_STAGE_SETS = 6 };
typedef struct dpar__gstage {
    int n;              /* the graph's feeds */
    int *ids;           /* [n] their nodes */
    char (*label)[96];  /* [n] their labels, for errors */
    dpar_array **feed;  /* [n] their own arrays (what the step reads) */
    dpar_buffer **dst;  /* [n * nlocal] their shards on this process's devices */
    dpar_array **own;   /* [DPAR__G_STAGE_SETS * n] the staged sets: own[set * n + k] */
    dpar_array **src;   /* [n] what is staged: own[next * n + k] (a host put) or the caller's array */
    dpar_buffer **take; /* [n * nlocal] the shards the taking run copies from (g->feed_take) */
    int *at;            /* [n] a put's entry for each feed (no allocation per put) */
    int next;           /* the set the next host put fills */
    int taken;          /* the set the running step took whole (every feed a host put), -1: none */
    bool full, host;    /* a put no run took yet; it put host data (in set `next`) */
    dpar__gseg *pre;    /* [DPAR__G_STAGE_SETS * nlocal] set's copies on device li, recorded (prog NULL: not yet) */
    bool *pre_off;      /* [nlocal] device li's copies could not be recorded: op by op */
} dpar__gstage;

static void dpar__g_stage_free(dpar_graph *g, bool alive) {
    dpar__gstage *st = g->stage;
    if (!st) return;
    for (int k = 0; alive && st->pre && k < DPAR__G_STAGE_SETS * g->nlocal; k++)
        if (st->pre[k].prog) g->rt->be->prog_free(g->rt->bstate, dpar__g_bdev(g, k % g->nlocal), st->pre[k].prog);
    for (int k = 0; alive && st->own && k < DPAR__G_STAGE_SETS * st->n; k++) dpar_array_destroy(st->own[k]);
    DPAR_FREE(st->ids);
    DPAR_FREE(st->label);
    DPAR_FREE(st->feed);
    DPAR_FREE(st->dst);
    DPAR_FREE(st->own);
    DPAR_FREE(st->src);
    DPAR_FREE(st->take);
    DPAR_FREE(st->at);
    DPAR_FREE(st->pre);
    DPAR_FREE(st->pre_off);
    DPAR_FREE(st);
    g->stage = NULL;
}
/* The first put: the stage and its sets of arrays (the feeds' global shapes and specs). */
static dpar_status dpar__g_stage_make(dpar_graph *g) {
    if (DPAR__ATOMIC_LOAD(&g->rt->async_req))
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_graph_put_feeds: a step is in flight and this graph's first put allocates its staged "
                         "feed arrays; put the first batch between steps (before the first dpar_graph_run_start)");
    if (g->err) return dpar__g_status(g);
    if (!dpar__g_mesh_alive(g))
        return dpar__err(DPAR_ERR_STATE, "dpar_graph_put_feeds: the graph's mesh was destroyed");
    int n = 0;
    for (int i = 1; i < g->count; i++) n += g->n[i].kind == DPAR__G_FEED;
    size_t m = (size_t)(n ? n : 1), nl = (size_t)g->nlocal;
    dpar__gstage *st = g->stage = (dpar__gstage *)dpar__calloc(1, sizeof *st);
    if (st) {
        st->n = n;
        st->ids = (int *)dpar__calloc(m, sizeof *st->ids);
        st->label = (char(*)[96])dpar__calloc(m, sizeof *st->label);
        st->feed = (dpar_array **)dpar__calloc(m, sizeof *st->feed);
        st->dst = (dpar_buffer **)dpar__calloc(m * nl, sizeof *st->dst);
        st->own = (dpar_array **)dpar__calloc(DPAR__G_STAGE_SETS * m, sizeof *st->own);
        st->src = (dpar_array **)dpar__calloc(m, sizeof *st->src);
        st->take = (dpar_buffer **)dpar__calloc(m * nl, sizeof *st->take);
        st->at = (int *)dpar__calloc(m, sizeof *st->at);
        st->pre = (dpar__gseg *)dpar__calloc(DPAR__G_STAGE_SETS * nl, sizeof *st->pre);
        st->pre_off = (bool *)dpar__calloc(nl, sizeof *st->pre_off);
    }
    if (!st || !st->ids || !st->label || !st->feed || !st->dst || !st->own || !st->src || !st->take || !st->at ||
        !st->pre || !st->pre_off) {
        dpar__g_stage_free(g, true);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_put_feeds: out of host memory");
    }
    dpar_status s = DPAR_OK;
    for (int i = 1, k = 0; i < g->count && !s; i++) {
        if (g->n[i].kind != DPAR__G_FEED) continue;
        st->ids[k] = i;
        dpar__g_label(g, i, st->label[k], sizeof st->label[k]);
        st->feed[k] = g->n[i].array;
        for (int li = 0; li < g->nlocal; li++)
            st->dst[(size_t)k * nl + (size_t)li] = dpar_array_shard(st->feed[k], g->first + li);
        for (int set = 0; set < DPAR__G_STAGE_SETS && !s; set++) s = dpar__g_grad_array(g, i, &st->own[set * n + k]);
        k++;
    }
    if (s) {
        char text[DPAR__ERR_LEN];
        snprintf(text, sizeof text, "%s", dpar_last_error());
        dpar__g_stage_free(g, true);
        return dpar__err(s, "dpar_graph_put_feeds: the staged feed arrays: %s", text);
    }
    return DPAR_OK;
}
/* Each feed's entry in feeds (at[k]), checked before anything is written. */
static dpar_status dpar__g_stage_match(const dpar__gstage *st, const dpar_graph_feed *feeds, int num, int *at) {
    const char *fn = "dpar_graph_put_feeds";
    for (int k = 0; k < st->n; k++) at[k] = -1;
    for (int j = 0; j < num; j++) {
        int k = 0;
        while (k < st->n && st->ids[k] != feeds[j].value.id) k++;
        if (k == st->n) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: feeds[%d] is not a feed of this graph", fn, j);
        if (at[k] >= 0) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: feed %s is given twice", fn, st->label[k]);
        if (!feeds[j].host == !feeds[j].array)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: feed %s: give exactly one of host and array", fn,
                             st->label[k]);
        dpar_status s = feeds[j].array ? dpar__g_feed_check(feeds[j].array, st->feed[k], st->label[k], fn) : DPAR_OK;
        if (s) return s;
        for (int d = 0; feeds[j].array && d < st->feed[k]->ndim; d++)
            if (!dpar__spec_dim_eq(feeds[j].array, d, st->feed[k], d))
                return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                                 "%s: feed %s: the array is sharded differently from the feed (dimension %d); stage "
                                 "an array of the feed's spec, or pass this one to dpar_graph_run, which reshards",
                                 fn, st->label[k], d);
        at[k] = j;
    }
    for (int k = 0; k < st->n; k++)
        if (at[k] < 0)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: feed %s was not given; stage every feed of the graph", fn,
                             st->label[k]);
    return DPAR_OK;
}
static dpar_status dpar__g_put_feeds(dpar_graph *g, const dpar_graph_feed *feeds, int num) {
    if (dpar__self_worker)
        return dpar__err(DPAR_ERR_STATE, "dpar_graph_put_feeds: called inside a pmap/shard_map function");
    if (!num) { /* drop what is staged */
        if (g->stage) g->stage->full = false;
        return DPAR_OK;
    }
    dpar_status s = g->stage ? DPAR_OK : dpar__g_stage_make(g);
    if (s) return s;
    dpar__gstage *st = g->stage;
    if (st->full)
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_graph_put_feeds: feeds are staged already and no run took them; run the graph with "
                         "num_feeds = 0 first, or drop them with dpar_graph_put_feeds(g, NULL, 0)");
    int *at = st->at;
    s = dpar__g_stage_match(st, feeds, num, at);
    st->host = false;
    for (int k = 0; k < st->n && !s; k++) {
        const dpar_graph_feed *f = &feeds[at[k]];
        st->src[k] = f->array ? f->array : st->own[st->next * st->n + k];
        st->host |= f->host != NULL;
        if (f->host && (s = dpar__array_scatter(st->src[k], f->host, true)))
            s = dpar__err(s, "dpar_graph_put_feeds: feed %s: %s", st->label[k], dpar_last_error());
    }
    st->full = !s;
    return s;
}
DPAR_API dpar_status dpar_graph_put_feeds(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds) {
    dpar__clear_error();
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_put_feeds: graph is NULL");
    if (num_feeds < 0 || (num_feeds && !feeds))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_put_feeds: num_feeds = %d with feeds %s", num_feeds,
                         feeds ? "given" : "NULL");
    dpar_runtime *rt = NULL; /* counted in flight: no destroy frees g meanwhile */
    if (dpar__live_enter(g, DPAR__LIVE_GRAPH, "dpar_graph_put_feeds", 0, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__g_put_feeds(g, feeds, num_feeds);
    dpar__live_leave(rt, 0);
    return s;
}
/* Before a run, on the caller's thread with no step in flight: num_feeds = 0 takes what is staged (explicit
   feeds then are refused); sets g->feed_take for the step's workers, NULL when nothing was taken. */
static dpar_status dpar__g_stage_take(dpar_graph *g, int num_feeds, const char *fn) {
    dpar__gstage *st = g->stage;
    g->feed_take = NULL;
    if (!st || !st->full) return DPAR_OK;
    if (num_feeds)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "%s: %d feed(s) passed while feeds are staged by dpar_graph_put_feeds; pass num_feeds = 0 "
                         "to run on the staged ones, or drop them first with dpar_graph_put_feeds(g, NULL, 0)",
                         fn, num_feeds);
    size_t nl = (size_t)g->nlocal;
    st->taken = st->next;
    for (int k = 0; k < st->n; k++) {
        bool own = st->src[k] == st->own[st->next * st->n + k];
        dpar_status s = own ? DPAR_OK : dpar__g_feed_check(st->src[k], st->feed[k], st->label[k], fn); /* still live */
        if (s) return s;
        if (!own) st->taken = -1;
        for (int li = 0; li < g->nlocal; li++)
            st->take[(size_t)k * nl + (size_t)li] = dpar_array_shard(st->src[k], g->first + li);
    }
    st->full = false;
    if (st->host) st->next = (st->next + 1) % DPAR__G_STAGE_SETS; /* the next put fills another set */
    g->feed_take = st->take;
    return DPAR_OK;
}
/* A run that failed before its dispatch gives back what it took. */
static void dpar__g_stage_untake(dpar_graph *g) {
    dpar__gstage *st = g->stage;
    if (!g->feed_take) return;
    g->feed_take = NULL;
    st->full = true;
    if (st->host) st->next = (st->next + DPAR__G_STAGE_SETS - 1) % DPAR__G_STAGE_SETS;
}
/* Device li's first op of a step that took staged feeds: their shards into the feeds' own arrays. */
static dpar_status dpar__g_stage_copy(const dpar_graph *g, int li) {
    const dpar__gstage *st = g->stage;
    size_t nl = (size_t)g->nlocal;
    for (int k = 0; k < st->n; k++) {
        size_t at = (size_t)k * nl + (size_t)li;
        dpar_status s = dpar_copy(st->dst[at], g->feed_take[at]);
        if (s) return dpar__err(s, "dpar_graph_run: staged feed %s: %s", st->label[k], dpar_last_error());
    }
    return DPAR_OK;
}
/* Device li's staged feed copies for a step that took them. A replayed step (pr recorded from node 1 on)
   that took a whole staged set gets the set's copies as a recording of their own, made the first time li
   takes the set (3 per device, a few commands each) and submitted with the step's first segment (*pre;
   pre->nops 0 the step it is recorded, whose copies count as they record): the step is one submit of
   prerecorded command buffers, with no batch of the backend's own to record. Otherwise (the first run,
   caller's arrays staged, op by op, no prog_submit_pre) the copies run op by op as the step's first ops. */
static dpar_status dpar__g_stage_in(dpar_graph *g, dpar_ctx *ctx, int li, const dpar__gprog *pr, dpar__gseg *pre) {
    dpar__gstage *st = g->stage;
    const dpar__backend_iface *be = g->rt->be;
    if (!pr || pr->state != 1 || !pr->nseg || pr->seg[0].i0 != 1 || st->taken < 0 || !st->n || st->pre_off[li] ||
        !be->prog_submit_pre)
        return dpar__g_stage_copy(g, li);
    dpar__gseg *sg = &st->pre[st->taken * g->nlocal + li];
    if (sg->prog) {
        *pre = *sg;
        return DPAR_OK;
    }
    int dev = dpar__g_bdev(g, li);
    uint64_t ops0 = dpar__obs_ops(g->rt, dev);
    dpar__worker_issued(&g->rt->workers[ctx->device - ctx->rt->local_base]); /* as dpar__g_prog_record */
    dpar_status s = be->prog_begin(g->rt->bstate, dev);
    if (!s) {
        s = dpar__g_stage_copy(g, li);
        dpar_status e = be->prog_end(g->rt->bstate, dev, &sg->prog);
        if (!s) s = e;
    }
    if (s || !sg->prog) { /* not recordable after all: op by op from now on (a real error shows there) */
        if (sg->prog) be->prog_free(g->rt->bstate, dev, sg->prog);
        sg->prog = NULL;
        st->pre_off[li] = true;
        dpar__clear_error();
        return dpar__g_stage_copy(g, li);
    }
    sg->nops = dpar__obs_ops(g->rt, dev) - ops0;
    pre->prog = sg->prog; /* its copies counted as they recorded */
    return DPAR_OK;
}
/* The loss of the last run, read now (dpar_graph_run with loss = NULL leaves it on the devices). */
static dpar_status dpar__g_loss(dpar_graph *g, float *loss) {
    const char *fn = "dpar_graph_loss";
    dpar_status s = dpar__busy(g->rt, NULL, fn);
    if (s) return s;
    if (g->err) return dpar__g_status(g);
    if (!g->loss_value)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the graph has no loss; call dpar_graph_value_and_grad", fn);
    if (!g->ran) return dpar__err(DPAR_ERR_STATE, "%s: the graph has not run yet (dpar_graph_run)", fn);
    if (!dpar__g_mesh_alive(g)) return dpar__err(DPAR_ERR_STATE, "%s: the graph's mesh was destroyed", fn);
    return dpar_buffer_read(dpar__g_buf(g, g->loss_value, 0), 0, loss, sizeof *loss);
}
DPAR_API dpar_status dpar_graph_loss(dpar_graph *g, float *loss) {
    dpar__clear_error();
    if (!g || !loss) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_loss: graph or loss is NULL");
    dpar_runtime *rt = NULL;
    if (dpar__live_enter(g, DPAR__LIVE_GRAPH, "dpar_graph_loss", 0, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__g_loss(g, loss);
    dpar__live_leave(rt, 0);
    return s;
}
/* The loss log (dpar_graph_log_losses): after each run, a device copy of the pinned loss into the ring's next
   slot, queued behind the step like its other ops, so that no run waits for the device. */
static dpar_status dpar__g_log_loss(dpar_graph *g) {
    int64_t one = 1, cap = g->loss_log->count;
    dpar_status s =
        dpar__strided(g->loss_log, dpar__g_buf(g, g->loss_value, 0), 1, &one, &one, 0, &one, g->losses_logged % cap);
    if (s) return dpar__err(s, "dpar_graph_run: logging the loss (dpar_graph_log_losses): %s", dpar_last_error());
    g->losses_logged++;
    return DPAR_OK;
}
static dpar_status dpar__g_log_losses(dpar_graph *g, int capacity) {
    const char *fn = "dpar_graph_log_losses";
    dpar_status s = dpar__busy(g->rt, NULL, fn);
    if (s) return s;
    if (g->err) return dpar__g_status(g);
    if (capacity < 0) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: capacity %d is negative", fn, capacity);
    if (!g->loss_value)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: the graph has no loss; call dpar_graph_value_and_grad", fn);
    if (g->n[g->loss_value].dtype != DPAR_F32)
        return dpar__err(DPAR_ERR_DTYPE,
                         "%s: the loss is %s; the log holds f32 losses (read an f64 one with "
                         "dpar_graph_get)",
                         fn, dpar_dtype_name(g->n[g->loss_value].dtype));
    if (!dpar__g_mesh_alive(g)) return dpar__err(DPAR_ERR_STATE, "%s: the graph's mesh was destroyed", fn);
    dpar_buffer *ring = NULL; /* made before the old ring goes: a refused one leaves the log as it was */
    int64_t n = capacity;
    if (capacity && (s = dpar_buffer_create(g->rt, g->first, DPAR_F32, 1, &n, &ring)))
        return dpar__err(s, "%s: the ring of %d losses: %s; the old ring logs on", fn, capacity, dpar_last_error());
    if ((s = dpar_buffer_destroy(g->loss_log))) {
        dpar_buffer_destroy(ring);
        return s;
    }
    g->loss_log = ring;
    g->losses_logged = 0;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_graph_log_losses(dpar_graph *g, int capacity) {
    dpar__clear_error();
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_log_losses: graph is NULL");
    dpar_runtime *rt = NULL;
    if (dpar__live_enter(g, DPAR__LIVE_GRAPH, "dpar_graph_log_losses", 0, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__g_log_losses(g, capacity);
    dpar__live_leave(rt, 0);
    return s;
}
/* The last n logged losses, oldest first: at most two reads (the ring may wrap), the first one waits. */
static dpar_status dpar__g_losses(dpar_graph *g, float *out, int n) {
    const char *fn = "dpar_graph_losses";
    dpar_status s = dpar__busy(g->rt, NULL, fn);
    if (s) return s;
    if (g->err) return dpar__g_status(g);
    if (n < 0 || (n && !out))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: n = %d with out %s", fn, n, out ? "given" : "NULL");
    if (!g->loss_log)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: no losses are logged; call dpar_graph_log_losses first", fn);
    int64_t cap = g->loss_log->count, have = g->losses_logged < cap ? g->losses_logged : cap;
    if (n > have)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "%s: %d losses asked for, the ring holds %lld (%lld runs logged, capacity %lld)", fn, n,
                         (long long)have, (long long)g->losses_logged, (long long)cap);
    int64_t at = (g->losses_logged - n) % cap, first = n < cap - at ? n : cap - at;
    s = dpar_buffer_read(g->loss_log, (size_t)at * sizeof *out, out, (size_t)first * sizeof *out);
    if (!s && n > first) s = dpar_buffer_read(g->loss_log, 0, out + first, (size_t)(n - first) * sizeof *out);
    return s;
}
DPAR_API dpar_status dpar_graph_losses(dpar_graph *g, float *out, int n) {
    dpar__clear_error();
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_losses: graph is NULL");
    dpar_runtime *rt = NULL;
    if (dpar__live_enter(g, DPAR__LIVE_GRAPH, "dpar_graph_losses", 0, &rt)) return DPAR_ERR_STATE;
    dpar_status s = dpar__g_losses(g, out, n);
    dpar__live_leave(rt, 0);
    return s;
}

/* ---- inspect ---- */
static dpar_status dpar__g_readable(const dpar_graph *g, const char *fn, dpar_value v) {
    char l[96];
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: graph is NULL", fn);
    if (dpar__live_check(g, DPAR__LIVE_GRAPH, fn)) return DPAR_ERR_STATE;
    if (v.id <= 0 || v.id >= g->count) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: not a value of this graph", fn);
    if (!g->ran) return dpar__err(DPAR_ERR_STATE, "%s: the graph has not run yet (dpar_graph_run)", fn);
    if (!dpar__g_mesh_alive(g)) return dpar__err(DPAR_ERR_STATE, "%s: the graph's mesh was destroyed", fn);
    const dpar__gnode *nd = &g->n[v.id];
    if (!nd->keep && nd->kind != DPAR__G_FEED && nd->kind != DPAR__G_PARAM && nd->kind != DPAR__G_CONST)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "%s: %s was not kept (its buffer is reused); call dpar_graph_keep before compile", fn,
                         dpar__g_label(g, v.id, l, sizeof l));
    return DPAR_OK;
}
DPAR_API dpar_status dpar_graph_read_shard(dpar_graph *g, dpar_value v, int device, void *host) {
    dpar__clear_error();
    dpar_status s = dpar__g_readable(g, "dpar_graph_read_shard", v);
    if (s) return s;
    if (!host || device < g->first || device >= g->first + g->nlocal)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_read_shard: host is NULL or device %d is not local",
                         device);
    const dpar_buffer *b = dpar__g_buf(g, v.id, device - g->first);
    return dpar_buffer_read(b, 0, host, dpar_buffer_nbytes(b));
}
DPAR_API dpar_status dpar_graph_get(dpar_graph *g, dpar_value v, void *host) {
    dpar__clear_error();
    dpar_status s = dpar__g_readable(g, "dpar_graph_get", v);
    if (s) return s;
    if (!host) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_get: host is NULL");
    if (g->n[v.id].array) return dpar_array_get(g->n[v.id].array, host);
    return dpar_graph_read_shard(g, v, g->first, host);
}
static void dpar__g_axes_text(const dpar_graph *g, unsigned mask, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int a = 0; a < g->mesh->ndim && at < cap; a++)
        if (mask & (1u << a)) at += (size_t)snprintf(buf + at, cap - at, at ? ",%s" : "%s", g->mesh->names[a]);
}
static FILE *dpar__g_open(const char *fn, const char *path) {
    FILE *f = path ? fopen(path, "w") : stdout;
    if (!f) dpar__err(DPAR_ERR_IO, "%s: cannot open '%s' for writing", fn, path);
    return f;
}
static dpar_status dpar__g_close(const char *fn, const char *path, FILE *f) {
    int bad = ferror(f);
    if (path)
        bad |= fclose(f);
    else
        fflush(f);
    return bad ? dpar__err(DPAR_ERR_IO, "%s: writing '%s' failed", fn, path ? path : "stdout") : DPAR_OK;
}
DPAR_API dpar_status dpar_graph_print(const dpar_graph *g, const char *path) {
    dpar__clear_error();
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_print: graph is NULL");
    FILE *f = dpar__g_open("dpar_graph_print", path);
    if (!f) return DPAR_ERR_IO;
    fprintf(f, "graph: %d nodes on a %d-device mesh\n", g->count - 1, g->mesh->size);
    for (int i = 1; i < g->count; i++) {
        const dpar__gnode *nd = &g->n[i];
        char sh[160], v[64], ax[64];
        dpar__g_axes_text(g, nd->vary, v, sizeof v);
        dpar__g_axes_text(g, nd->axes, ax, sizeof ax);
        fprintf(f, "%4d %-13s %-12s in(", i, dpar__g_kind_name(g, nd), nd->name);
        for (int j = 0; j < nd->nin; j++) fprintf(f, j ? ",%d" : "%d", nd->in[j]);
        fprintf(f, ") %s %s", dpar_dtype_name(nd->dtype), dpar__g_shape(nd, sh, sizeof sh));
        if (nd->vary) fprintf(f, " varies{%s}", v);
        if (nd->axes) fprintf(f, " over{%s}", ax);
        if (nd->array) {
            fprintf(f, " global %s spec(", dpar__shape_str(sh, sizeof sh, nd->array->ndim, nd->array->shape));
            for (int d = 0; d < nd->array->ndim; d++) {
                char sp[64];
                dpar_array_spec(nd->array, d, sp, sizeof sp);
                fprintf(f, d ? ", %s" : "%s", sp[0] ? sp : "-");
            }
            fprintf(f, ")");
        }
        if (nd->keep) fprintf(f, " kept");
        if (nd->async) fprintf(f, " async");
        if (nd->bucket) fprintf(f, " bucket %d", nd->bucket);
        if (g->pp && nd->stage >= 0) fprintf(f, " stage %d%s", nd->stage, nd->pipe ? " (boundary)" : "");
        if (nd->remat) fprintf(f, " remat%d", nd->remat);
        if (nd->remat_of) fprintf(f, " recomputes(%d)", nd->remat_of);
        for (int j = 0; j < nd->nin && g->compiled; j++) /* the plan aliased its output to that input */
            if (nd->slot >= 0 && g->n[nd->in[j]].slot == nd->slot) fprintf(f, " in_place(%d)", nd->in[j]);
        fprintf(f, "\n");
    }
    return dpar__g_close("dpar_graph_print", path, f);
}
DPAR_API dpar_status dpar_graph_write_dot(const dpar_graph *g, const char *path) {
    dpar__clear_error();
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_write_dot: graph is NULL");
    FILE *f = dpar__g_open("dpar_graph_write_dot", path);
    if (!f) return DPAR_ERR_IO;
    fprintf(f, "digraph dpar {\n  rankdir=TB; node [shape=box, fontname=monospace];\n");
    for (int i = 1; i < g->count; i++) {
        const dpar__gnode *nd = &g->n[i];
        char sh[160], ax[64];
        dpar__g_axes_text(g, nd->axes, ax, sizeof ax);
        const char *color = dpar__g_kinds[nd->kind].coll ? "lightblue"
                            : nd->kind == DPAR__G_PARAM  ? "lightyellow"
                            : nd->kind == DPAR__G_FEED   ? "palegreen"
                                                         : "white";
        fprintf(f, "  n%d [label=\"%d %s%s%s\\n%s %s%s%s\", style=filled, fillcolor=%s];\n", i, i,
                dpar__g_kind_name(g, nd), nd->name[0] ? " " : "", nd->name, dpar_dtype_name(nd->dtype),
                dpar__g_shape(nd, sh, sizeof sh), nd->axes ? " over " : "", ax, color);
        for (int j = 0; j < nd->nin; j++) fprintf(f, "  n%d -> n%d;\n", nd->in[j], i);
        for (int k = 0; nd->kind == DPAR__G_SGD && k < g->opt.n; k++)
            fprintf(f, "  n%d -> n%d;\n  n%d -> n%d [style=dashed];\n", g->opt.grads[k], i, i, g->opt.params[k]);
    }
    fprintf(f, "}\n");
    return dpar__g_close("dpar_graph_write_dot", path, f);
}

static dpar_status dpar__graph_destroy(void *obj);
DPAR_API dpar_status dpar_graph_destroy(dpar_graph *g) {
    return dpar__destroy_kept(dpar__graph_destroy, g);
}
static dpar_status dpar__graph_destroy(void *obj) {
    dpar_graph *g = (dpar_graph *)obj;
    if (!g) return DPAR_OK;
    if (dpar_in_dispatch())
        return dpar__err(DPAR_ERR_STATE, "dpar_graph_destroy: called inside a pmap/shard_map function");
    if (dpar__live_check(g, DPAR__LIVE_GRAPH, "dpar_graph_destroy")) return DPAR_ERR_STATE;
    dpar_status s = dpar__busy(g->mesh->rt, NULL, "dpar_graph_destroy");
    if (!s) s = dpar__live_detach(g, DPAR__LIVE_GRAPH, "dpar_graph_destroy", NULL);
    if (s) return s;
    dpar__g_free(g);
    return DPAR_OK;
}
/* Frees g and what it allocated (its mesh still exists: a mesh releases its
   graphs before its arrays). */
static void dpar__g_free(void *self) {
    dpar_graph *g = (dpar_graph *)self;
    dpar__releasing++; /* g's arrays and buffers: already checked with g */
    bool alive = dpar__g_mesh_alive(g);
    for (int li = 0; g->prog && li < g->nlocal; li++)
        if (alive) dpar__g_prog_clear(g, li); /* before the buffers they use */
    DPAR_FREE(g->prog);
    dpar__g_stage_free(g, alive); /* >>graph feeds: its recordings too, before the feeds' arrays */
    for (int k = 0; k < g->nslots; k++)
        for (int li = 0; li < g->nlocal && g->slot_owned[k]; li++)
            dpar__g_slot_free(g, k, g->slots[k * g->nlocal + li]);
    for (int i = 1; i < g->count; i++) {
        DPAR_FREE(g->n[i].pairs);
        DPAR_FREE(g->n[i].attr);
        if (g->n[i].kind != DPAR__G_PARAM && g->n[i].array && alive) dpar_array_destroy(g->n[i].array);
    }
    dpar__g_z1_destroy(g, alive);
    dpar_buffer_destroy(g->loss_log);
    dpar__g_pipe_destroy(g);
    dpar__g_bucket_free(g);
    DPAR_FREE(g->slot_bytes);
    for (int k = 0; g->opt_state && alive && k < 2 * g->opt.n; k++) dpar_array_destroy(g->opt_state[k]);
    for (int li = 0; g->scratch && li < g->nlocal; li++) dpar_buffer_destroy(g->scratch[li]);
    for (int li = 0; g->scratch64 && li < g->nlocal; li++) dpar_buffer_destroy(g->scratch64[li]);
    DPAR_FREE(g->scratch64);
    DPAR_FREE(g->opt_state);
    DPAR_FREE(g->state);
    DPAR_FREE(g->scratch);
    DPAR_FREE(g->sgd_ptrs);
    DPAR_FREE(g->clip_ptrs);
    DPAR_FREE(g->reqs);
    DPAR_FREE(g->slots);
    DPAR_FREE(g->slot_owned);
    DPAR_FREE(g->opt.params);
    DPAR_FREE(g->opt.grads);
    DPAR_FREE(g->opt.decay);
    DPAR_FREE(g->opt.split_order);
    DPAR_FREE(g->opt.split_end);
    DPAR_FREE(g->n);
    DPAR_FREE(g->errtext);
    dpar__handle_free(g);
    dpar__releasing--;
}

/* >>async dispatch ===========================================================
   dpar_pmap_start / dpar_shard_map_start / dpar_graph_run_start: the blocking
   call on a host thread of its own, polled by dpar_test and joined by dpar_wait
   with ctx = NULL. rt->async_req marks the runtime busy for dpar__busy. */
typedef enum dpar__disp_kind { DPAR__DISP_PMAP, DPAR__DISP_SHARD_MAP, DPAR__DISP_GRAPH } dpar__disp_kind;
struct dpar__disp {
    dpar__disp_kind kind;
    dpar_runtime *rt;
    dpar_mesh *mesh;
    dpar_pmap_desc pmap;
    dpar_shard_map_desc smap;
    dpar_graph *g;
    dpar_graph_feed *feeds; /* a copy: the caller's array may go, the host data it names may not */
    int num_feeds;
    float *loss;
    dpar__thread thread;
};
static dpar__mutex dpar__disp_mu = DPAR__MUTEX_INIT;
static struct dpar_request *dpar__disp_live; /* steps started and not waited, linked by live_next */

static void dpar__disp_free(struct dpar_request *r) {
    if (r->disp) DPAR_FREE(r->disp->feeds);
    DPAR_FREE(r->disp);
    DPAR_FREE(r);
}

static DPAR__THREAD_FN(dpar__disp_main, arg) {
    struct dpar_request *r = (struct dpar_request *)arg;
    struct dpar__disp *d = r->disp;
    dpar__async_self = r;
    dpar__thread_name("step", 0);
    dpar_status s;
    if (d->kind == DPAR__DISP_PMAP)
        s = dpar_pmap(d->mesh, &d->pmap);
    else if (d->kind == DPAR__DISP_SHARD_MAP)
        s = dpar_shard_map(d->mesh, &d->smap);
    else
        s = dpar__g_run_entered(d->g, d->feeds, d->num_feeds, d->loss, false); /* taken by dpar_graph_run_start */
    r->status = s;
    if (s) snprintf(r->msg, sizeof r->msg, "%s", dpar__err_text);
    DPAR__ATOMIC_STORE(&r->done, 1);
    return 0;
}

/* Whether r is a step started and not yet waited for (compared, never dereferenced before);
   unlink: take it off the list so that only one caller waits for it. */
static int dpar__disp_pending(const struct dpar_request *r, int unlink) {
    dpar__mutex_lock(&dpar__disp_mu);
    struct dpar_request **pp = &dpar__disp_live;
    while (*pp && *pp != r) pp = &(*pp)->live_next;
    int found = *pp != NULL;
    if (found && unlink) *pp = r->live_next;
    dpar__mutex_unlock(&dpar__disp_mu);
    return found;
}

/* Marks d->rt busy and starts the step's thread; takes d (freed on error). */
static dpar_status dpar__disp_start(struct dpar__disp *d, const char *fn, dpar_request **req) {
    dpar_runtime *rt = d->rt;
    dpar_status s = DPAR_OK;
    if (dpar__self_worker)
        s = dpar__err(DPAR_ERR_STATE, "%s: called inside a pmap/shard_map function; start steps from the host", fn);
    else if (rt->nproc > 1)
        s = dpar__err(DPAR_ERR_STATE,
                      "%s: the runtime spans %d MPI processes, whose steps must be issued from the thread that "
                      "initialized MPI; use the blocking call (dpar_pmap, dpar_shard_map, dpar_graph_run)",
                      fn, rt->nproc);
    else if (DPAR__ATOMIC_LOAD(&rt->lent))
        s = dpar__err(DPAR_ERR_STATE,
                      "%s: %d buffer(s) of the runtime are lent by dpar_vulkan_buffer_export; call "
                      "dpar_vulkan_buffer_release for each first",
                      fn, (int)DPAR__ATOMIC_LOAD(&rt->lent));
    struct dpar_request *r = s ? NULL : (struct dpar_request *)dpar__calloc(1, sizeof *r);
    if (!s && !r) s = dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory for the request", fn);
    struct dpar_request *none = NULL;
    if (!s && !DPAR__ATOMIC_CAS_PTR(&rt->async_req, &none, r))
        s = dpar__err(DPAR_ERR_STATE,
                      "%s: another step of this runtime is in flight (one at a time); call dpar_wait(NULL, req) "
                      "for it first",
                      fn);
    if (s) {
        DPAR_FREE(r);
        DPAR_FREE(d->feeds);
        DPAR_FREE(d);
        return s;
    }
    r->disp = d;
    dpar__mutex_lock(&dpar__disp_mu);
    r->live_next = dpar__disp_live;
    dpar__disp_live = r;
    dpar__mutex_unlock(&dpar__disp_mu);
    if (dpar__thread_start(&d->thread, dpar__disp_main, r) != 0) {
        dpar__disp_pending(r, 1);
        DPAR__ATOMIC_STORE(&rt->async_req, (struct dpar_request *)NULL);
        dpar__disp_free(r);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: could not start a host thread for the step", fn);
    }
    *req = r;
    return DPAR_OK;
}

/* dpar_pmap_start and dpar_shard_map_start up to their desc: the checks (has_fn: desc and desc->fn are not
   NULL), then a new dispatch of `kind` over m in *d. */
static dpar_status dpar__map_disp(dpar_mesh *m, bool has_fn, dpar__disp_kind kind, const char *fn, dpar_request **req,
                                  struct dpar__disp **d) {
    if (!req) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: req is NULL", fn);
    *req = NULL;
    if (!m || !has_fn) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: mesh, desc or desc->fn is NULL", fn);
    if (dpar__live_check(m, DPAR__LIVE_MESH, fn)) return DPAR_ERR_STATE;
    *d = (struct dpar__disp *)dpar__calloc(1, sizeof **d);
    if (!*d) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    (*d)->kind = kind;
    (*d)->rt = m->rt;
    (*d)->mesh = m;
    return DPAR_OK;
}

DPAR_API dpar_status dpar_pmap_start(dpar_mesh *m, const dpar_pmap_desc *desc, dpar_request **req) {
    dpar__clear_error();
    struct dpar__disp *d = NULL;
    dpar_status s = dpar__map_disp(m, desc && desc->fn, DPAR__DISP_PMAP, "dpar_pmap_start", req, &d);
    if (s) return s;
    d->pmap = *desc;
    return dpar__disp_start(d, "dpar_pmap_start", req);
}

DPAR_API dpar_status dpar_shard_map_start(dpar_mesh *m, const dpar_shard_map_desc *desc, dpar_request **req) {
    dpar__clear_error();
    struct dpar__disp *d = NULL;
    dpar_status s = dpar__map_disp(m, desc && desc->fn, DPAR__DISP_SHARD_MAP, "dpar_shard_map_start", req, &d);
    if (s) return s;
    d->smap = *desc;
    return dpar__disp_start(d, "dpar_shard_map_start", req);
}

DPAR_API dpar_status dpar_graph_run_start(dpar_graph *g, const dpar_graph_feed *feeds, int num_feeds, float *loss,
                                          dpar_request **req) {
    dpar__clear_error();
    if (!req) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run_start: req is NULL");
    *req = NULL;
    if (!g) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run_start: graph is NULL");
    if (num_feeds < 0 || (num_feeds && !feeds))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_run_start: num_feeds = %d with feeds %s", num_feeds,
                         feeds ? "given" : "NULL");
    if (dpar__live_check(g, DPAR__LIVE_GRAPH, "dpar_graph_run_start")) return DPAR_ERR_STATE;
    struct dpar__disp *d = (struct dpar__disp *)dpar__calloc(1, sizeof *d);
    if (d && num_feeds) {
        d->feeds = (dpar_graph_feed *)DPAR_MALLOC((size_t)num_feeds * sizeof *feeds);
        if (d->feeds) memcpy(d->feeds, feeds, (size_t)num_feeds * sizeof *feeds);
    }
    if (!d || (num_feeds && !d->feeds)) {
        if (d) DPAR_FREE(d->feeds);
        DPAR_FREE(d);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_run_start: out of host memory");
    }
    d->kind = DPAR__DISP_GRAPH;
    d->rt = g->mesh->rt;
    d->mesh = g->mesh;
    d->g = g;
    d->num_feeds = num_feeds;
    d->loss = loss;
    /* staged feeds are taken here, before the step's thread exists (>>graph feeds); a step in flight reads them */
    dpar_status s = dpar__busy(d->rt, NULL, "dpar_graph_run_start");
    if (!s) s = dpar__g_stage_take(g, num_feeds, "dpar_graph_run_start");
    if (s) {
        DPAR_FREE(d->feeds);
        DPAR_FREE(d);
        return s;
    }
    if ((s = dpar__disp_start(d, "dpar_graph_run_start", req))) dpar__g_stage_untake(g);
    return s;
}

/* dpar_wait with ctx = NULL: joins the step's thread, frees the runtime for the next one. */
static dpar_status dpar__disp_wait(dpar_request *r) {
    if (!r) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_wait: request is NULL");
    if (!dpar__disp_pending(r, 1))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_wait: with ctx = NULL the request must be a step from dpar_pmap_start, "
                         "dpar_shard_map_start or dpar_graph_run_start not yet waited for (a collective's request "
                         "takes its ctx)");
    double t0 = DPAR__ATOMIC_LOAD(&dpar__trace_on) ? dpar__now_us() : 0.0;
    dpar__thread_join(r->disp->thread);
    dpar_runtime *rt = r->disp->rt;
    if (t0 > 0.0) dpar__trace_event(dpar__trace_pid(rt), -1, "wait step", "wait", t0, dpar__now_us(), -1);
    DPAR__ATOMIC_STORE(&rt->async_req, (struct dpar_request *)NULL);
    dpar_status s = r->status;
    if (s)
        dpar__err(s, "%s", r->msg);
    else
        dpar__clear_error();
    dpar__disp_free(r);
    return s;
}

DPAR_API dpar_status dpar_test(dpar_ctx *ctx, dpar_request *r, bool *done) {
    dpar__clear_error();
    if (!r || !done) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_test: request or done is NULL");
    *done = false;
    if (!ctx) {
        if (!dpar__disp_pending(r, 0))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_test: with ctx = NULL the request must be a step not yet waited for (a "
                             "collective's request takes its ctx)");
        *done = DPAR__ATOMIC_LOAD(&r->done) != 0;
        return DPAR_OK;
    }
    if (!DPAR__CTX_OK(ctx)) return dpar__ctx_check(ctx, "dpar_test");
    dpar__worker *w = &ctx->rt->workers[ctx->device - ctx->rt->local_base];
    dpar__mutex_lock(&w->qmu);
    struct dpar_request *it = w->live; /* compared, never dereferenced, until found */
    while (it && it != r) it = it->live_next;
    if (it) *done = r->done != 0;
    dpar__mutex_unlock(&w->qmu);
    if (!it)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_test: the request is not a pending collective of device %d (already waited, started "
                         "on another device, or a step: pass ctx = NULL)",
                         ctx->device);
    return DPAR_OK;
}

/* >>sharding visualize =======================================================
   jax.debug.visualize_array_sharding as text: one cell per block of a 0-, 1-
   or 2-d global array (rows: dimension 0's blocks, columns: the last
   dimension's), naming every device that holds it and the element range. */
enum { DPAR__VIS_CELL = 512 };
/* The block (index along a dimension) that mesh position pos holds on dimension d. */
static int64_t dpar__vis_block(const dpar_array *a, const int *coords, int d) {
    int64_t k = 0;
    for (int j = 0; j < a->spec_n[d]; j++) k = k * a->mesh->shape[a->spec_axes[d][j]] + coords[a->spec_axes[d][j]];
    return k;
}
static int64_t dpar__vis_nblocks(const dpar_array *a, int d) {
    int64_t n = 1;
    for (int j = 0; d >= 0 && j < a->spec_n[d]; j++) n *= a->mesh->shape[a->spec_axes[d][j]];
    return n;
}
/* Fills cells[r * nc + c] (two lines each: "dev i" / "devs i,j,..." and the range). */
static void dpar__vis_cells(const dpar_array *a, int rd, int cd, int64_t nr, int64_t nc, char *cells) {
    for (int p = 0; p < a->mesh->size; p++) {
        int c[DPAR_MAX_AXES];
        dpar__pos_to_coords(a->mesh, p, c);
        int64_t r = rd >= 0 ? dpar__vis_block(a, c, rd) : 0, k = cd >= 0 ? dpar__vis_block(a, c, cd) : 0;
        char *cell = cells + (size_t)(r * nc + k) * DPAR__VIS_CELL;
        size_t at = strlen(cell), cap = DPAR__VIS_CELL / 2 - 8; /* room for the "devs " prefix */
        if (at + 12 < cap) snprintf(cell + at, cap - at, at ? ",%d" : "%d", a->mesh->devices[p]);
        char *rng = cell + DPAR__VIS_CELL / 2;
        size_t ra = 0;
        int dims[2] = { rd, cd };
        int64_t blk[2] = { r, k };
        ra += (size_t)snprintf(rng, DPAR__VIS_CELL / 2, "[");
        for (int i = 0; i < 2; i++)
            if (dims[i] >= 0)
                ra += (size_t)snprintf(rng + ra, DPAR__VIS_CELL / 2 - ra, ra > 1 ? ", %lld:%lld" : "%lld:%lld",
                                       (long long)(blk[i] * a->local[dims[i]]),
                                       (long long)((blk[i] + 1) * a->local[dims[i]]));
        snprintf(rng + ra, DPAR__VIS_CELL / 2 - ra, "]");
    }
    for (int64_t i = 0; i < nr * nc; i++) { /* "0,2" -> "devs 0,2" */
        char *cell = cells + (size_t)i * DPAR__VIS_CELL, tmp[DPAR__VIS_CELL / 2];
        snprintf(tmp, sizeof tmp, "%s %s", strchr(cell, ',') ? "devs" : "dev", cell);
        memcpy(cell, tmp, sizeof tmp);
    }
}
static void dpar__vis_rule(FILE *f, int64_t nc, size_t w) {
    for (int64_t k = 0; k < nc; k++) {
        fputc('+', f);
        for (size_t i = 0; i < w + 2; i++) fputc('-', f);
    }
    fputs("+\n", f);
}
DPAR_API dpar_status dpar_visualize_array_sharding(const dpar_array *a, const char *path) {
    const char *fn = "dpar_visualize_array_sharding";
    dpar__clear_error();
    if (dpar__live_arg(a, DPAR__LIVE_ARRAY, "dpar_visualize_array_sharding", "the array")) return DPAR_ERR_STATE;
    if (!a) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: array is NULL", fn);
    if (a->ndim > 2)
        return dpar__err(DPAR_ERR_SHAPE, "%s: the array is %d-d; it draws 0-, 1- and 2-d arrays (reshape it first)", fn,
                         a->ndim);
    int rd = a->ndim == 2 ? 0 : -1, cd = a->ndim - 1; /* a 1-d array is one row of blocks */
    int64_t nr = dpar__vis_nblocks(a, rd), nc = dpar__vis_nblocks(a, cd);
    char *cells = (char *)DPAR_MALLOC((size_t)(nr * nc) * DPAR__VIS_CELL);
    if (!cells) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    memset(cells, 0, (size_t)(nr * nc) * DPAR__VIS_CELL);
    dpar__vis_cells(a, rd, cd, nr, nc, cells);
    size_t w = 0;
    for (int64_t i = 0; i < nr * nc; i++)
        for (int l = 0; l < 2; l++) {
            size_t n = strlen(cells + (size_t)i * DPAR__VIS_CELL + (size_t)l * DPAR__VIS_CELL / 2);
            w = n > w ? n : w;
        }
    FILE *f = dpar__g_open(fn, path);
    if (!f) {
        DPAR_FREE(cells);
        return DPAR_ERR_IO;
    }
    char sh[160], sp[64];
    fprintf(f, "%s%s spec(", dpar_dtype_name(a->dtype), dpar__shape_str(sh, sizeof sh, a->ndim, a->shape));
    for (int d = 0; d < a->ndim; d++) {
        dpar__spec_axes_str(a, d, sp, sizeof sp);
        fprintf(f, d ? ", %s" : "%s", sp[0] ? sp : "-");
    }
    fprintf(f, ") mesh(");
    for (int x = 0; x < a->mesh->ndim; x++) fprintf(f, x ? ", %s=%d" : "%s=%d", a->mesh->names[x], a->mesh->shape[x]);
    fprintf(f, ")\n");
    for (int64_t r = 0; r < nr; r++) {
        dpar__vis_rule(f, nc, w);
        for (int l = 0; l < 2; l++) {
            for (int64_t k = 0; k < nc; k++) {
                const char *line = cells + (size_t)(r * nc + k) * DPAR__VIS_CELL + (size_t)l * DPAR__VIS_CELL / 2;
                fprintf(f, "| %-*s ", (int)w, line);
            }
            fputs("|\n", f);
        }
    }
    dpar__vis_rule(f, nc, w);
    DPAR_FREE(cells);
    return dpar__g_close(fn, path, f);
}

/* >>graph remat ==============================================================
   Gradient checkpointing (jax.checkpoint): the nodes built between
   dpar_graph_remat_begin and _end carry their segment number. A segment's
   interior is its nodes read only by nodes of the same segment; its outputs
   (read outside it, kept, or the loss) and its inputs are saved, as JAX saves
   a checkpointed function's arguments and results. While
   dpar_graph_value_and_grad builds the backward, dpar__g_push swaps every
   input that is an interior node for a recomputed copy, made on first use
   (its interior inputs swapped the same way, recursively). So the forward
   originals die after their last forward reader, the copies live only
   through the backward stretch that reads them, and the liveness plan needs
   fewer buffers. The copies run the same ops on the same inputs, so the
   gradients are bit-identical on the CPU backend. Leaves (feeds, params,
   consts) are never recomputed; a node whose attribute size is unknown is
   kept, not recomputed. */
DPAR_API dpar_status dpar_graph_remat_begin(dpar_graph *g) {
    dpar__clear_error();
    if (!dpar__g_args(g, "dpar_graph_remat_begin", 0, NULL)) return dpar__g_args_status(g);
    if (g->loss)
        return dpar__g_err(g, DPAR_ERR_STATE,
                           "dpar_graph_remat_begin: the backward is built already; mark segments of the forward "
                           "before dpar_graph_value_and_grad");
    if (g->remat_open)
        return dpar__g_err(g, DPAR_ERR_STATE,
                           "dpar_graph_remat_begin: segment %d is open; segments do not nest, end it first",
                           g->remat_seg);
    g->remat_seg++;
    g->remat_open = true;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_graph_remat_end(dpar_graph *g) {
    dpar__clear_error();
    if (!dpar__g_args(g, "dpar_graph_remat_end", 0, NULL)) return dpar__g_args_status(g);
    if (!g->remat_open)
        return dpar__g_err(g, DPAR_ERR_STATE,
                           "dpar_graph_remat_end: no remat segment is open; call dpar_graph_remat_begin first");
    g->remat_open = false;
    return DPAR_OK;
}
/* rclone[x]: -1 saved (used as is), 0 interior not copied yet, else its copy. */
static dpar_status dpar__g_remat_start(dpar_graph *g, int upto) {
    g->rclone = (int *)DPAR_MALLOC((size_t)upto * sizeof(int));
    if (!g->rclone) return dpar__g_err(g, DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_value_and_grad: out of memory for remat");
    g->rupto = upto;
    for (int x = 0; x < upto; x++) g->rclone[x] = g->n[x].remat && !g->n[x].keep && x != g->loss ? -2 : -1;
    for (int j = 1; j < upto; j++)
        for (int k = 0; k < g->n[j].nin; k++) {
            int x = g->n[j].in[k];
            if (g->n[x].remat != g->n[j].remat)
                g->rclone[x] = -1; /* a segment output */
            else if (g->rclone[x] == -2)
                g->rclone[x] = 0; /* read inside its segment */
        }
    for (int x = 0; x < upto; x++)
        if (g->rclone[x] == -2) g->rclone[x] = -1; /* read by nothing forward: an output */
    return DPAR_OK;
}
static void dpar__g_remat_stop(dpar_graph *g) {
    DPAR_FREE(g->rclone);
    g->rclone = NULL;
    g->rupto = 0;
}
/* The recomputed copy of forward node x: the same op and attributes on the
   (recomputed) inputs; x itself when it cannot be copied (out of memory: error recorded). */
static int dpar__g_remat_copy(dpar_graph *g, int x) {
    dpar__gnode o = g->n[x]; /* a copy: pushing may move the table */
    if (o.attr && !o.attr_sz) return x;
    void *attr = o.attr ? DPAR_MALLOC(o.attr_sz) : NULL;
    int *pairs = o.pairs ? (int *)DPAR_MALLOC((size_t)o.npairs * 2 * sizeof(int)) : NULL;
    bool ok = (!o.attr || attr) && (!o.pairs || pairs);
    int id = ok ? dpar__g_push(g, o.kind, o.nin, o.in, o.dtype, o.ndim, o.shape) : 0;
    if (!id) {
        DPAR_FREE(attr);
        DPAR_FREE(pairs);
        if (!g->err) dpar__g_fail(g, DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_value_and_grad: out of memory for remat");
        return x;
    }
    if (attr) memcpy(attr, o.attr, o.attr_sz);
    if (pairs) memcpy(pairs, o.pairs, (size_t)o.npairs * 2 * sizeof(int));
    dpar__gnode *c = &g->n[id];
    memcpy(o.in, c->in, sizeof o.in); /* the inputs as swapped by dpar__g_push */
    *c = o;
    c->attr = attr;
    c->pairs = pairs;
    c->keep = c->async = false;
    c->spec_of = 0;
    c->array = NULL;
    c->slot = -1;
    c->remat = 0;
    c->remat_of = x;
    return id;
}
static int dpar__g_remat_in(dpar_graph *g, int x) {
    if (x <= 0 || x >= g->rupto || g->rclone[x] < 0) return x;
    if (!g->rclone[x]) g->rclone[x] = dpar__g_remat_copy(g, x);
    return g->rclone[x];
}

/* >>graph state ==============================================================
   A compiled graph's training state as named global arrays, for checkpoints
   (dpar_graph_save / dpar_graph_restore in util/dpar_train.h write and read
   them through dpar_checkpoint_*): every param once, then the optimizer's
   state of each optimized param, and the step counter (runs done). Global
   arrays, so a sharded param or state keeps its spec and a checkpoint
   restores onto another mesh with the same global shapes. */
struct dpar__gstate {
    char name[DPAR_NAME_LEN + 16]; /* "<param>", "<param>@adamw.m", ... */
    dpar_array *array;
    int node;    /* the param node it belongs to */
    bool padded; /* ZeRO-1 state: f32 [Lp] zero-padded (a checkpoint entry's padded) */
};
/* Suffixes of the optimizer state arrays, [adamw][j] */
static const char *const dpar__g_state_suffix[2][2] = { { "@sgd.momentum", "" }, { "@adamw.m", "@adamw.v" } };
/* Builds g->state at compile: the param nodes in order (an array used by two nodes once), then state j of
   every optimized param, for j = 0, 1. */
static dpar_status dpar__g_state_list(dpar_graph *g) {
    int n = g->has_opt ? g->opt.n : 0;
    g->state = (struct dpar__gstate *)dpar__calloc((size_t)(g->count + 2 * n), sizeof *g->state);
    if (!g->state) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_graph_compile: out of memory");
    g->nstate = 0;
    for (int i = 1; i < g->count; i++) {
        if (g->n[i].kind != DPAR__G_PARAM) continue;
        int e = 0;
        while (e < g->nstate && g->state[e].array != g->n[i].array) e++;
        if (e < g->nstate) continue;
        struct dpar__gstate *st = &g->state[g->nstate++];
        snprintf(st->name, sizeof st->name, "%s", g->n[i].name);
        st->array = g->n[i].array;
        st->node = i;
    }
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < n; k++) {
            dpar_array *a = g->z1 ? g->z1->state[j * n + k] : g->opt_state[j * n + k];
            if (!a) continue;
            struct dpar__gstate *st = &g->state[g->nstate++];
            st->node = g->opt.params[k];
            snprintf(st->name, sizeof st->name, "%s%s", g->n[st->node].name, dpar__g_state_suffix[g->opt.adamw][j]);
            st->array = a;
            st->padded = g->z1 != NULL;
        }
    return DPAR_OK;
}
DPAR_API dpar_status dpar_graph_state_count(dpar_graph *g, int *count) {
    dpar__clear_error();
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_state_count", "the graph")) return DPAR_ERR_STATE;
    if (!g || !count) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_state_count: graph or count is NULL");
    *count = 0;
    if (!dpar__g_mesh_alive(g))
        return dpar__err(DPAR_ERR_STATE, "dpar_graph_state_count: the graph's mesh was destroyed (and its state "
                                         "with it); destroy a graph before its mesh");
    dpar_status s = g->compiled ? DPAR_OK : dpar_graph_compile(g, NULL);
    if (s) return s;
    *count = g->nstate;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_graph_state(const dpar_graph *g, int i, const char **name, dpar_array **array, bool *padded) {
    dpar__clear_error();
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_state", "the graph")) return DPAR_ERR_STATE;
    char l[96], l2[96];
    if (!g || !name || !array)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_state: graph, name or array is NULL");
    if (!g->compiled)
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_graph_state: the graph is not compiled; call dpar_graph_state_count (it compiles)");
    if (!dpar__g_mesh_alive(g))
        return dpar__err(DPAR_ERR_STATE, "dpar_graph_state: the graph's mesh was destroyed (and its state with it)");
    if (i < 0 || i >= g->nstate)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_state: entry %d is out of range (the state has %d)", i,
                         g->nstate);
    const struct dpar__gstate *st = &g->state[i];
    if (!g->n[st->node].name[0])
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_graph_state: param %s has no name; give it one in dpar_g_param (checkpoint entries are "
                         "found by name)",
                         dpar__g_label(g, st->node, l, sizeof l));
    for (int e = 0; e < i; e++)
        if (!strcmp(g->state[e].name, st->name))
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                             "dpar_graph_state: params %s and %s are both named '%s'; give each param its own name",
                             dpar__g_label(g, g->state[e].node, l, sizeof l), dpar__g_label(g, st->node, l2, sizeof l2),
                             st->name);
    *name = st->name;
    *array = st->array;
    if (padded) *padded = st->padded;
    return DPAR_OK;
}
DPAR_API int64_t dpar_graph_step(const dpar_graph *g) {
    return dpar__live_got(g, DPAR__LIVE_GRAPH, "dpar_graph_step") ? g->opt.step : -1;
}
DPAR_API dpar_status dpar_graph_set_step(dpar_graph *g, int64_t step) {
    dpar__clear_error();
    if (dpar__live_arg(g, DPAR__LIVE_GRAPH, "dpar_graph_set_step", "the graph")) return DPAR_ERR_STATE;
    if (!g || step < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_set_step: %s",
                         g ? "the step must be >= 0 (the number of runs done)" : "graph is NULL");
    dpar_status busy = dpar__busy(g->rt, NULL, "dpar_graph_set_step"); /* a step in flight advances it */
    if (busy) return busy;
    g->opt.step = step;
    return DPAR_OK;
}

/* >>trace-stats ==============================================================
   Per-device stats and the Chrome/Perfetto trace: the hooks the core calls
   (ops, collectives, buffers, dispatches) and the public trace calls. */
static double dpar__ns_to_us(uint64_t ns) { /* exact to the nanosecond for any uptime */
    return (double)(ns / 1000000000u) * 1e6 + (double)(ns % 1000000000u) * 1e-3;
}
static double dpar__now_us(void) {
    return dpar__ns_to_us(dpar__now_ns());
}

/* --- stats: per runtime, per local device --- */
typedef struct dpar__devstats {
    uint64_t in_use, peak, buffers;           /* under rt->list_mu */
    uint64_t ops, colls, bytes_in, bytes_out; /* atomic (worker and comm threads) */
    uint64_t ns[3];                           /* atomic: DPAR__OBS_COMPUTE, _COLL, _TRANSFER */
    uint64_t waits0;                          /* atomic: the backend's host_waits at the window's start */
} dpar__devstats;
struct dpar__obs {
    int pid; /* trace process id of this runtime */
    int nlocal;
    uint64_t window_ns;    /* atomic: start of the stats window (dpar__now_ns) */
    dpar__devstats dev[1]; /* [nlocal] */
};

/* --- trace events: process wide, appended under a mutex --- */
typedef struct dpar__tev {
    const char *name, *cat; /* static strings */
    int pid, tid;           /* tid: global device id; DPAR__TID_COMM + id for its comm thread; -1 host */
    double ts, dur;         /* microseconds */
    int64_t bytes;          /* -1: none */
} dpar__tev;
enum { DPAR__TID_COMM = 100000, DPAR__TRACE_MAX_EVENTS = 4 << 20 };
static dpar__mutex dpar__trace_mu = DPAR__MUTEX_INIT;
static dpar__tev *dpar__tev_buf;
static size_t dpar__tev_n, dpar__tev_cap, dpar__tev_dropped;
static char *dpar__trace_path;
static double dpar__trace_t0;
static int dpar__trace_pids, dpar__trace_env_done, dpar__trace_atexit;
static char dpar__trace_pname[64][96]; /* process names by pid (first 64 runtimes) */

static void dpar__trace_event(int pid, int tid, const char *name, const char *cat, double t0, double t1,
                              int64_t bytes) {
    dpar__mutex_lock(&dpar__trace_mu);
    if (DPAR__ATOMIC_LOAD(&dpar__trace_on)) {
        if (dpar__tev_n == dpar__tev_cap && dpar__tev_cap < DPAR__TRACE_MAX_EVENTS) {
            size_t nc = dpar__tev_cap ? dpar__tev_cap * 2 : 4096;
            dpar__tev *nb = (dpar__tev *)DPAR_REALLOC(dpar__tev_buf, nc * sizeof *nb);
            if (nb) {
                dpar__tev_buf = nb;
                dpar__tev_cap = nc;
            }
        }
        if (dpar__tev_n < dpar__tev_cap) {
            dpar__tev *e = &dpar__tev_buf[dpar__tev_n++];
            e->name = name;
            e->cat = cat;
            e->pid = pid;
            e->tid = tid;
            e->ts = t0 - dpar__trace_t0;
            e->dur = t1 - t0;
            e->bytes = bytes;
        } else {
            dpar__tev_dropped++;
        }
    }
    dpar__mutex_unlock(&dpar__trace_mu);
}
static int dpar__trace_pid(const dpar_runtime *rt) {
    return rt && rt->obs ? rt->obs->pid : 0;
}

static const char *dpar__op_name(dpar__op_kind k) {
    static const char *const names[DPAR__OP_COUNT + 1] = {
        "matmul", "bias_add", "bias_grad", "relu", "relu_backward", "softmax_xent", "mse", "axpy", "scale", "fill",
        "copy", "cast", "sum", "sum_squares", "sgd",
        /* >>norm-attn kinds */
        "norm", "norm_backward", "matmul_batched", "attention", "attention_backward_q", "attention_backward_kv",
        /* >>optim kinds */
        "adamw", "embedding", "embedding_backward", "dropout",
        /* >>elementwise kinds */
        "unary", "unary_backward", "binary", "reduce", "where", "softmax", "softmax_backward", "strided_copy",
        /* >>conv-pool kinds */
        "conv2d", "conv2d_backward_input", "conv2d_backward_kernel", "avg_pool2d", "avg_pool2d_backward", "max_pool2d",
        "max_pool2d_backward", "op"
    };
    return (int)k >= 0 && (int)k < (int)DPAR__OP_COUNT && names[k] ? names[k] : "op";
}
/* A backend's answer to an op kind it has no kernel for (the default of its op switch; unused in a
   CPU-only build). */
DPAR__MAYBE_UNUSED static dpar_status dpar__op_unsupported(const char *backend, const dpar__op *op) {
    return dpar__err(DPAR_ERR_BACKEND, "%s: op %s (kind %d) is not implemented on this backend; use the cpu backend",
                     backend, dpar__op_name(op->kind), (int)op->kind);
}

/* hooks called by the core (declared before it) */
static dpar_status dpar__trace_op(dpar__op *op) {
    dpar_runtime *rt = op->dst->rt;
    double t0 = dpar__now_us();
    dpar_status s = rt->be->op(rt->bstate, op->dst->device, op);
    dpar__trace_event(dpar__trace_pid(rt), op->dst->gdev, dpar__op_name(op->kind), "op", t0, dpar__now_us(), -1);
    return s;
}
static dpar_status dpar__coll_run(dpar_ctx *ctx, const struct dpar__cargs *a, int comm) {
    double t0 = dpar__now_us();
    dpar_status s = dpar__coll_exec(ctx, a, comm);
    dpar_runtime *rt = ctx->rt;
    int li = ctx->device - rt->local_base;
    dpar__obs_time(rt, li, DPAR__OBS_COLL, t0);
    if (rt->obs && s == DPAR_OK && a->in && a->out) {
        if (li >= 0 && li < rt->obs->nlocal) {
            dpar__devstats *d = &rt->obs->dev[li];
            DPAR__ATOMIC_FETCH_ADD(&d->colls, 1);
            DPAR__ATOMIC_FETCH_ADD(&d->bytes_in, (uint64_t)a->in->nbytes);
            DPAR__ATOMIC_FETCH_ADD(&d->bytes_out, (uint64_t)a->out->nbytes);
        }
    }
    if (DPAR__ATOMIC_LOAD(&dpar__trace_on))
        dpar__trace_event(dpar__trace_pid(rt), comm ? DPAR__TID_COMM + ctx->device : ctx->device,
                          dpar__coll_name(a->kind, a->op), comm ? "collective async" : "collective", t0, dpar__now_us(),
                          a->in ? (int64_t)a->in->nbytes : 0);
    return s;
}
static void dpar__obs_mem(dpar_runtime *rt, int dev, int64_t delta) { /* under rt->list_mu */
    if (!rt->obs || dev < 0 || dev >= rt->obs->nlocal) return;
    dpar__devstats *d = &rt->obs->dev[dev];
    d->in_use = (uint64_t)((int64_t)d->in_use + delta);
    d->buffers += delta >= 0 ? 1u : (uint64_t)-1;
    if (d->in_use > d->peak) d->peak = d->in_use;
}
static void dpar__obs_count_op(dpar_runtime *rt, int dev) {
    dpar__obs_add_ops(rt, dev, 1);
}
static void dpar__obs_add_ops(dpar_runtime *rt, int dev, uint64_t n) { /* n ops of a recorded graph segment */
    if (rt->obs && dev >= 0 && dev < rt->obs->nlocal) DPAR__ATOMIC_FETCH_ADD(&rt->obs->dev[dev].ops, n);
}
static uint64_t dpar__obs_ops(const dpar_runtime *rt, int dev) { /* ops counted so far on local device dev */
    if (!rt->obs || dev < 0 || dev >= rt->obs->nlocal) return 0;
    return DPAR__ATOMIC_LOAD_RELAXED(&rt->obs->dev[dev].ops);
}
/* Adds the time since t0_us (dpar__now_us) to local device dev's `what`: only
   its part inside the window, so a call that spans a dpar_runtime_stats_reset
   does not put the old window's time into the new one. */
static void dpar__obs_time(dpar_runtime *rt, int dev, int what, double t0_us) {
    if (!rt->obs || dev < 0 || dev >= rt->obs->nlocal) return;
    double w0 = dpar__ns_to_us((uint64_t)DPAR__ATOMIC_LOAD(&rt->obs->window_ns));
    double ns = (dpar__now_us() - (t0_us > w0 ? t0_us : w0)) * 1e3;
    if (ns > 0) DPAR__ATOMIC_FETCH_ADD(&rt->obs->dev[dev].ns[what], (uint64_t)ns);
}

static void dpar__trace_atexit_fn(void) {
    if (DPAR__ATOMIC_LOAD(&dpar__trace_on)) dpar_trace_end();
}

static dpar_status dpar__obs_init(dpar_runtime *rt) {
    dpar__obs *o = (dpar__obs *)dpar__calloc(1, sizeof(dpar__obs) +
                                                    (size_t)(rt->nlocal > 0 ? rt->nlocal : 1) * sizeof(dpar__devstats));
    if (!o) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_runtime_create: out of host memory");
    o->nlocal = rt->nlocal;
    o->window_ns = dpar__now_ns();
    dpar__mutex_lock(&dpar__trace_mu);
    int first = !dpar__trace_env_done;
    dpar__trace_env_done = 1;
    o->pid = ++dpar__trace_pids;
    if (o->pid <= 64)
        snprintf(dpar__trace_pname[o->pid - 1], sizeof dpar__trace_pname[0], "dpar runtime %d (%s, %d devices)", o->pid,
                 rt->be->name, rt->ndev);
    dpar__mutex_unlock(&dpar__trace_mu);
    rt->obs = o;
    const char *env = getenv("DPAR_TRACE");
    if (first && env && *env && !DPAR__ATOMIC_LOAD(&dpar__trace_on)) {
        char path[1024];
        if (rt->nproc > 1) /* one file per MPI process: trace.json -> trace.rank3.json */
            snprintf(path, sizeof path, "%.*s.rank%d%s",
                     (int)(strlen(env) > 5 && !strcmp(env + strlen(env) - 5, ".json") ? strlen(env) - 5 : strlen(env)),
                     env, rt->proc, strlen(env) > 5 && !strcmp(env + strlen(env) - 5, ".json") ? ".json" : "");
        else
            snprintf(path, sizeof path, "%s", env);
        if (dpar_trace_begin(path) != DPAR_OK) { /* refused, not dropped; the next create tries again */
            dpar__mutex_lock(&dpar__trace_mu);
            dpar__trace_env_done = 0;
            dpar__mutex_unlock(&dpar__trace_mu);
            return dpar__err(DPAR_ERR_IO,
                             "dpar_runtime_create: DPAR_TRACE='%s' cannot be written (%s); set it to a writable file "
                             "path or unset it",
                             env, dpar_last_error());
        }
        dpar__mutex_lock(&dpar__trace_mu);
        if (!dpar__trace_atexit) {
            dpar__trace_atexit = 1;
            atexit(dpar__trace_atexit_fn);
        }
        dpar__mutex_unlock(&dpar__trace_mu);
        dpar__clear_error();
    }
    return DPAR_OK;
}
static void dpar__obs_free(dpar_runtime *rt) {
    if (!rt->obs) return;
    if (DPAR__ATOMIC_LOAD(&dpar__trace_on)) {
        dpar_trace_flush();
        dpar__clear_error();
    }
    DPAR_FREE(rt->obs);
    rt->obs = NULL;
}

DPAR_API dpar_status dpar_trace_begin(const char *path) {
    dpar__clear_error();
    if (!path || !*path)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_trace_begin: path is NULL or empty; give a file name such as \"trace.json\"");
    FILE *probe = fopen(path, "a"); /* fail now, not when the trace is written */
    if (!probe) return dpar__err(DPAR_ERR_IO, "dpar_trace_begin: cannot write '%s': %s", path, strerror(errno));
    fclose(probe);
    size_t len = strlen(path);
    char *p = (char *)DPAR_MALLOC(len + 1);
    if (!p) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_trace_begin: out of host memory");
    memcpy(p, path, len + 1);
    dpar__mutex_lock(&dpar__trace_mu);
    DPAR_FREE(dpar__trace_path);
    dpar__trace_path = p;
    dpar__tev_n = 0;
    dpar__tev_dropped = 0;
    dpar__trace_t0 = dpar__now_us();
    DPAR__ATOMIC_STORE(&dpar__trace_on, 1);
    dpar__mutex_unlock(&dpar__trace_mu);
    return DPAR_OK;
}

static dpar_status dpar__trace_write_locked(void) {
    FILE *f = fopen(dpar__trace_path, "w");
    if (!f) return dpar__err(DPAR_ERR_IO, "dpar trace: cannot write '%s': %s", dpar__trace_path, strerror(errno));
    fprintf(f,
            "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"dpar.h\",\"dropped_events\":%llu},"
            "\"traceEvents\":[\n",
            (unsigned long long)dpar__tev_dropped);
    /* metadata: process and thread names, for every (pid, tid) seen */
    int first = 1;
    for (int pid = 1; pid <= dpar__trace_pids && pid <= 64; pid++) {
        fprintf(f, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"%s\"}}",
                first ? "" : ",\n", pid, dpar__trace_pname[pid - 1]);
        first = 0;
    }
    for (size_t i = 0; i < dpar__tev_n; i++) {
        const dpar__tev *e = &dpar__tev_buf[i];
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) seen = dpar__tev_buf[j].pid == e->pid && dpar__tev_buf[j].tid == e->tid;
        if (seen) continue;
        int tid = e->tid < 0 ? 0 : e->tid + 1, sort = e->tid < 0                 ? 0
                                                      : e->tid >= DPAR__TID_COMM ? 2 * (e->tid - DPAR__TID_COMM) + 2
                                                                                 : 2 * e->tid + 1;
        char nm[64];
        if (e->tid < 0)
            snprintf(nm, sizeof nm, "host");
        else if (e->tid >= DPAR__TID_COMM)
            snprintf(nm, sizeof nm, "device %d comm", e->tid - DPAR__TID_COMM);
        else
            snprintf(nm, sizeof nm, "device %d", e->tid);
        fprintf(f, "%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                first ? "" : ",\n", e->pid, tid, nm);
        fprintf(f,
                ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                e->pid, tid, sort);
        first = 0;
        if (i > 4096) break; /* tracks appear early; bound the quadratic scan */
    }
    for (size_t i = 0; i < dpar__tev_n; i++) {
        const dpar__tev *e = &dpar__tev_buf[i];
        int tid = e->tid < 0 ? 0 : e->tid + 1;
        fprintf(f, "%s{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f",
                first ? "" : ",\n", e->name, e->cat, e->pid, tid, e->ts, e->dur > 0.0 ? e->dur : 0.0);
        if (e->bytes >= 0) fprintf(f, ",\"args\":{\"bytes\":%lld}", (long long)e->bytes);
        fputc('}', f);
        first = 0;
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0)
        return dpar__err(DPAR_ERR_IO, "dpar trace: error writing '%s': %s", dpar__trace_path, strerror(errno));
    return DPAR_OK;
}
DPAR_API dpar_status dpar_trace_flush(void) {
    dpar__clear_error();
    dpar__mutex_lock(&dpar__trace_mu);
    dpar_status s = DPAR__ATOMIC_LOAD(&dpar__trace_on) && dpar__trace_path
                        ? dpar__trace_write_locked()
                        : dpar__err(DPAR_ERR_STATE,
                                    "dpar_trace_flush: not tracing; call dpar_trace_begin or set DPAR_TRACE=file.json");
    dpar__mutex_unlock(&dpar__trace_mu);
    return s;
}
DPAR_API dpar_status dpar_trace_end(void) {
    dpar_status s = dpar_trace_flush();
    dpar__mutex_lock(&dpar__trace_mu);
    DPAR__ATOMIC_STORE(&dpar__trace_on, 0);
    DPAR_FREE(dpar__tev_buf);
    dpar__tev_buf = NULL;
    dpar__tev_n = dpar__tev_cap = 0;
    dpar__mutex_unlock(&dpar__trace_mu);
    return s;
}

DPAR_API bool dpar_trace_active(void) {
    return DPAR__ATOMIC_LOAD(&dpar__trace_on) != 0;
}
DPAR_API double dpar_trace_clock_us(void) {
    return dpar__now_us();
}
DPAR_API void dpar_trace_event(const dpar_runtime *rt, int device, const char *name, const char *cat, double t0_us,
                               double t1_us, int64_t bytes) {
    if (!DPAR__ATOMIC_LOAD(&dpar__trace_on) || !name || !cat) return;
    if (rt && !dpar__live_got(rt, DPAR__LIVE_RUNTIME, "dpar_trace_event")) return;
    dpar__trace_event(dpar__trace_pid(rt), device < 0 ? -1 : device, name, cat, t0_us, t1_us, bytes);
}

DPAR_API dpar_status dpar_runtime_device_stats(const dpar_runtime *rt, int device, dpar_device_stats *out) {
    dpar__clear_error();
    if (dpar__live_arg(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_device_stats", "the runtime")) return DPAR_ERR_STATE;
    if (!rt || !out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_runtime_device_stats: runtime or out is NULL");
    int li = device - rt->local_base;
    if (!rt->obs || li < 0 || li >= rt->obs->nlocal)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "dpar_runtime_device_stats: device %d is not a device of this process (%d..%d)", device,
                         rt->local_base, rt->local_base + rt->nlocal - 1);
    const dpar__devstats *d = &rt->obs->dev[li];
    memset(out, 0, sizeof *out);
    dpar__mutex_lock((dpar__mutex *)&rt->list_mu);
    out->memory_in_use = d->in_use;
    out->memory_peak = d->peak;
    out->buffers = d->buffers;
    dpar__mutex_unlock((dpar__mutex *)&rt->list_mu);
    out->ops = DPAR__ATOMIC_LOAD_RELAXED(&d->ops);
    out->collectives = DPAR__ATOMIC_LOAD_RELAXED(&d->colls);
    out->collective_bytes_in = DPAR__ATOMIC_LOAD_RELAXED(&d->bytes_in);
    out->collective_bytes_out = DPAR__ATOMIC_LOAD_RELAXED(&d->bytes_out);
    out->window_s = (dpar__now_us() - dpar__ns_to_us((uint64_t)DPAR__ATOMIC_LOAD(&rt->obs->window_ns))) * 1e-6;
    out->compute_s = (double)DPAR__ATOMIC_LOAD_RELAXED(&d->ns[DPAR__OBS_COMPUTE]) * 1e-9;
    out->collective_s = (double)DPAR__ATOMIC_LOAD_RELAXED(&d->ns[DPAR__OBS_COLL]) * 1e-9;
    out->transfer_s = (double)DPAR__ATOMIC_LOAD_RELAXED(&d->ns[DPAR__OBS_TRANSFER]) * 1e-9;
    out->gpu_util_pct = out->temperature_c = -1;
    out->power_w = -1;
    if (rt->be->health) rt->be->health(rt->bstate, li, out); /* NVML readings; leaves -1 where it has none */
    if (rt->be->host_waits) out->host_waits = rt->be->host_waits(rt->bstate, li) - DPAR__ATOMIC_LOAD(&d->waits0);
    return DPAR_OK;
}
DPAR_API void dpar_runtime_stats_reset(dpar_runtime *rt) {
    if (!dpar__live_got(rt, DPAR__LIVE_RUNTIME, "dpar_runtime_stats_reset") || !rt->obs) return;
    dpar__mutex_lock(&rt->list_mu);
    DPAR__ATOMIC_STORE(&rt->obs->window_ns, dpar__now_ns()); /* first: calls ending from now on clip to it */
    for (int i = 0; i < rt->obs->nlocal; i++) {
        dpar__devstats *d = &rt->obs->dev[i];
        d->peak = d->in_use;
        DPAR__ATOMIC_STORE_RELAXED(&d->ops, 0);
        DPAR__ATOMIC_STORE_RELAXED(&d->colls, 0);
        DPAR__ATOMIC_STORE_RELAXED(&d->bytes_in, 0);
        DPAR__ATOMIC_STORE_RELAXED(&d->bytes_out, 0);
        for (int k = 0; k < 3; k++) DPAR__ATOMIC_STORE_RELAXED(&d->ns[k], 0);
        if (rt->be->host_waits) DPAR__ATOMIC_STORE(&d->waits0, rt->be->host_waits(rt->bstate, i));
    }
    dpar__mutex_unlock(&rt->list_mu);
}

/* ---------------------------------------------------------------------------
   CPU backend: N emulated devices in host memory (the reference backend)
   ------------------------------------------------------------------------ */
/* Intra-op threads: when the process has fewer emulated devices than CPUs,
   each device gets CPUs / devices threads (DPAR_CPU_THREADS overrides; 1 =
   none) for its large matrix products: a fork-join pool of helpers per
   device. The split is over blocks of C's columns, or of its rows when
   the columns are few (dpar__sgemm_items), which does not change any
   element's arithmetic: results are the same bits for any thread count. */
typedef struct dpar__cpu_pool {
    int n; /* helper threads */
    dpar__thread *th;
    dpar__mutex mu;
    dpar__cond cv, done;
    uint64_t gen;
    int left, stop, nparts;
    void (*fn)(void *arg, int part, int nparts);
    void *arg;
} dpar__cpu_pool;
typedef struct dpar__cpu {
    int ndev, threads;
    dpar__cpu_pool *pools; /* [ndev] when threads > 1 */
} dpar__cpu;

typedef struct dpar__cpu_helper {
    dpar__cpu_pool *p;
    int idx;
} dpar__cpu_helper;
static DPAR__THREAD_FN(dpar__cpu_helper_main, arg) {
    dpar__cpu_helper h = *(dpar__cpu_helper *)arg;
    DPAR_FREE(arg);
    dpar__cpu_pool *p = h.p;
    dpar__thread_name("cpu", h.idx);
    dpar__mutex_lock(&p->mu);
    /* 0, the pool's generation at creation, not p->gen: a fork issued before this
       thread first ran must still be picked up (else the fork waits forever) */
    uint64_t seen = 0;
    for (;;) {
        while (p->gen == seen && !p->stop) dpar__cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        int part = h.idx + 1, nparts = p->nparts;
        void (*fn)(void *, int, int) = p->fn;
        void *fa = p->arg;
        dpar__mutex_unlock(&p->mu);
        if (part < nparts) fn(fa, part, nparts);
        dpar__mutex_lock(&p->mu);
        if (--p->left == 0) dpar__cond_signal(&p->done);
    }
    dpar__mutex_unlock(&p->mu);
    return 0;
}
/* Runs fn(arg, part, nparts) for part 0..nparts-1 (nparts <= helpers + 1):
   part 0 on the calling thread, the others on the device's helpers. */
static void dpar__cpu_fork(dpar__cpu_pool *p, int nparts, void (*fn)(void *, int, int), void *arg) {
    dpar__mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->nparts = nparts;
    p->left = p->n;
    p->gen++;
    dpar__cond_broadcast(&p->cv);
    dpar__mutex_unlock(&p->mu);
    fn(arg, 0, nparts);
    dpar__mutex_lock(&p->mu);
    while (p->left > 0) dpar__cond_wait(&p->done, &p->mu);
    dpar__mutex_unlock(&p->mu);
}
/* fn(arg, lo, hi) over items [0, n), split on the device's intra-op threads when the work (n * cost)
   is large: the helpers and the caller take chunks of about n / (4 parts) items until none is left.
   Items must be independent (each output written by one item, in an order of its own), so the
   result does not depend on the split or the thread count. */
typedef void (*dpar__cpu_range_fn)(const void *arg, int64_t lo, int64_t hi);
typedef struct dpar__cpu_range {
    dpar__cpu_range_fn fn;
    const void *arg;
    int64_t n, chunk, next;
} dpar__cpu_range;
static void dpar__cpu_range_part(void *arg, int part, int nparts) {
    dpar__cpu_range *r = (dpar__cpu_range *)arg;
    (void)part;
    (void)nparts;
    for (;;) {
        int64_t lo = DPAR__ATOMIC_FETCH_ADD(&r->next, 1) * r->chunk;
        if (lo >= r->n) break;
        r->fn(r->arg, lo, lo + r->chunk < r->n ? lo + r->chunk : r->n);
    }
}
/* the device's intra-op threads for a job of `work` (items x cost per item): all of them once it
   pays for the fork (2^16), else 1 (no pool, or dev not one of c's devices: 1) */
static int dpar__cpu_threads(const dpar__cpu *c, int dev, double work) {
    return c && c->pools && dev >= 0 && dev < c->ndev && work >= 65536.0 ? c->threads : 1;
}
static void dpar__cpu_parallel(dpar__cpu *c, int dev, int64_t n, int64_t cost, dpar__cpu_range_fn fn, const void *arg) {
    int parts = n > 1 ? dpar__cpu_threads(c, dev, (double)n * (double)cost) : 1;
    if (parts <= 1) {
        fn(arg, 0, n);
        return;
    }
    dpar__cpu_range r;
    r.fn = fn;
    r.arg = arg;
    r.n = n;
    r.next = 0;
    r.chunk = n / (4 * parts) + 1;
    dpar__cpu_fork(&c->pools[dev], parts, dpar__cpu_range_part, &r);
}
static void dpar__cpu_shutdown(void *st) {
    dpar__cpu *c = (dpar__cpu *)st;
    if (c && c->pools)
        for (int d = 0; d < c->ndev; d++) {
            dpar__cpu_pool *p = &c->pools[d];
            if (!p->th) continue;
            dpar__mutex_lock(&p->mu);
            p->stop = 1;
            dpar__cond_broadcast(&p->cv);
            dpar__mutex_unlock(&p->mu);
            for (int i = 0; i < p->n; i++) dpar__thread_join(p->th[i]);
            dpar__mutex_destroy(&p->mu);
            dpar__cond_destroy(&p->cv);
            dpar__cond_destroy(&p->done);
            DPAR_FREE(p->th);
        }
    if (c) DPAR_FREE(c->pools);
    DPAR_FREE(st);
}

static dpar_status dpar__cpu_init(const dpar_runtime_desc *desc, int requested, int local_index, int local_count,
                                  void **state, int *count) {
    DPAR__UNUSED(desc);
    DPAR__UNUSED(local_index); /* emulated devices: nothing physical to share out */
    DPAR__UNUSED(local_count);
    dpar__cpu *c = (dpar__cpu *)dpar__calloc(1, sizeof *c);
    if (!c) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cpu backend: out of host memory");
    long cores = dpar__cpu_count();
    if (!requested) { /* default: 1 device per core, at most 8 (see dpar_runtime_desc.num_devices) */
        requested = cores > 8 ? 8 : (int)cores;
    }
    c->ndev = requested;
    int th = dpar__env_int("DPAR_CPU_THREADS", 0);
    c->threads = th > 0 ? (th > 64 ? 64 : th) : (int)(cores / requested);
    if (c->threads < 1) c->threads = 1;
    if (c->threads > 1) {
        c->pools = (dpar__cpu_pool *)dpar__calloc((size_t)requested, sizeof(dpar__cpu_pool));
        if (!c->pools) {
            DPAR_FREE(c);
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cpu backend: out of host memory");
        }
        for (int d = 0; d < requested; d++) {
            dpar__cpu_pool *p = &c->pools[d];
            dpar__mutex_init(&p->mu);
            dpar__cond_init(&p->cv);
            dpar__cond_init(&p->done);
            p->th = (dpar__thread *)dpar__calloc((size_t)(c->threads - 1), sizeof(dpar__thread));
            if (!p->th) {
                c->ndev = d + 1;
                dpar__cpu_shutdown(c);
                return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cpu backend: out of host memory");
            }
            for (int i = 0; i < c->threads - 1; i++) {
                dpar__cpu_helper *h = (dpar__cpu_helper *)DPAR_MALLOC(sizeof *h);
                if (h) {
                    h->p = p;
                    h->idx = i;
                }
                if (!h || dpar__thread_start(&p->th[i], dpar__cpu_helper_main, h) != 0) {
                    DPAR_FREE(h);
                    c->ndev = d + 1;
                    dpar__cpu_shutdown(c);
                    return dpar__err(DPAR_ERR_OUT_OF_MEMORY,
                                     "cpu backend: could not start helper thread %d of device %d", i, d);
                }
                p->n = i + 1;
            }
        }
    }
    *state = c;
    *count = c->ndev;
    return DPAR_OK;
}
static dpar_status dpar__cpu_info(void *st, int dev, dpar_device_info *o) {
    dpar__cpu *c = (dpar__cpu *)st;
    snprintf(o->name, sizeof o->name, "cpu:%d (emulated device %d of %d)", dev, dev + 1, c->ndev);
    snprintf(o->vendor, sizeof o->vendor, "host");
    snprintf(o->driver, sizeof o->driver, "dpar cpu reference");
    o->runs_on_cpu = true;
    o->physical_index = 0;
    o->memory_bytes = dpar__memory_bytes();
    return DPAR_OK;
}
static dpar_status dpar__cpu_alloc(void *st, int dev, size_t nbytes, void **mem) {
    DPAR__UNUSED(st);
    void *p = NULL;
    size_t sz = (nbytes + 63) & ~(size_t)63;
    if (!(p = DPAR_ALIGNED_MALLOC(sz ? sz : 64, 64)))
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "cpu backend: could not allocate %zu bytes for device %d", nbytes,
                         dev);
    memset(p, 0, sz ? sz : 64);
    *mem = p;
    return DPAR_OK;
}
static void dpar__cpu_free(void *st, int dev, void *mem) {
    DPAR__UNUSED(st);
    DPAR__UNUSED(dev);
    DPAR_ALIGNED_FREE(mem);
}
static dpar_status dpar__cpu_write(void *st, int dev, void *mem, size_t off, const void *src, size_t n) {
    DPAR__UNUSED(st);
    DPAR__UNUSED(dev);
    memcpy((char *)mem + off, src, n);
    return DPAR_OK;
}
static dpar_status dpar__cpu_read(void *st, int dev, void *mem, size_t off, void *dst, size_t n) {
    DPAR__UNUSED(st);
    DPAR__UNUSED(dev);
    memcpy(dst, (const char *)mem + off, n);
    return DPAR_OK;
}
static dpar_status dpar__cpu_sync(void *st, int dev) {
    DPAR__UNUSED(st);
    DPAR__UNUSED(dev);
    return DPAR_OK;
}
static void *dpar__cpu_host_ptr(void *st, int dev, void *mem) {
    DPAR__UNUSED(st);
    DPAR__UNUSED(dev);
    return mem;
}

/* Cache-blocked f32 GEMM in the BLIS layout (Van Zee & van de Geijn, "BLIS",
   ACM TOMS 2015): op(B) packed in KC x nr strips, op(A) in MC x KC blocks of
   mr-row strips, an mr x nr register-tile micro-kernel chosen at run time
   (dpar__ukr_pick: 8 x 32 with AVX-512, 6 x 16 with AVX2, NEON or portable
   C). An operand is read in place where the copy would cost more than it
   saves: a non-transposed A always, a transposed A below 512 rows, a
   non-transposed B for at most 128 rows of C, and B's edge strip whenever the
   kernel masks edges (AVX-512). Each C element accumulates k in ascending
   order within a KC block and the blocks in ascending order. On an x86 CPU
   with AVX2 and FMA every product is a fused multiply-add, rounded once
   (twice the throughput of a multiply and an add: two instructions on the two
   FMA ports per product; measured on AVX-512, one core: 167 GFLOP/s against
   82); the NEON and portable kernels, and x86 CPUs without AVX2 or FMA, round
   the multiply and the add separately. The kernel depends only on the shapes
   and the CPU (never on the thread split or the tile), so results are the
   same bits run after run and for any DPAR_CPU_THREADS. Without memory for
   the packs, a plain loop (multiply, then add, k in order, no k blocks) gives
   the same values to rounding, not the same bits. No zero-skipping:
   0 * NaN and 0 * Inf give NaN, as in reference BLAS. */
#define DPAR__MR            6    /* micro-tile rows (AVX2, NEON, C; AVX-512: DPAR__MR512) */
#define DPAR__NR            16   /* micro-tile columns (two 8-float vectors) */
#define DPAR__KC            256  /* k block: an NR strip of B stays in L1 */
#define DPAR__MC            96   /* rows of A packed per block (L2) */
#define DPAR__NC            1024 /* columns of B packed per block: 1 MiB at KC, half of L2 (1024^3: 1.04x of 512) */
#define DPAR__DIRECT_B_ROWS 128
#define DPAR__PACK_AT_ROWS  512 /* a transposed A of this many rows or more is packed */
/* ow: C starts as +0 (beta = 0, first k block): C = 0 + alpha * acc, without reading C.
   a: element (i, k) of the A micro-panel at a[i * ars + k * acs] (packed: ars 1, acs MR;
   unpacked rows of a non-transposed A: ars lda, acs 1). */
static void dpar__ukr_c(int64_t kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs, float *c,
                        int64_t ldc, float alpha, int mr, int nr, int ow) {
    float acc[DPAR__MR][DPAR__NR];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < kc; k++, a += acs, b += bs)
        for (int i = 0; i < DPAR__MR; i++)
            for (int j = 0; j < DPAR__NR; j++) acc[i][j] += a[i * ars] * b[j];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = (ow ? 0.0f : c[i * ldc + j]) + alpha * acc[i][j];
}
#ifdef DPAR__ARM_NEON
/* dpar__ukr_c with NEON: the same multiply then add per k, in the same
   order, and the same write-back: the same bits */
static void dpar__ukr_neon(int64_t kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs, float *c,
                           int64_t ldc, float alpha, int mr, int nr, int ow) {
    float32x4_t r[DPAR__MR][4];
    for (int i = 0; i < DPAR__MR; i++)
        for (int q = 0; q < 4; q++) r[i][q] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < kc; k++, a += acs, b += bs) {
        float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
        for (int i = 0; i < DPAR__MR; i++) {
            float32x4_t x = vdupq_n_f32(a[i * ars]);
            r[i][0] = vaddq_f32(r[i][0], vmulq_f32(x, b0));
            r[i][1] = vaddq_f32(r[i][1], vmulq_f32(x, b1));
            r[i][2] = vaddq_f32(r[i][2], vmulq_f32(x, b2));
            r[i][3] = vaddq_f32(r[i][3], vmulq_f32(x, b3));
        }
    }
    float t[DPAR__MR][DPAR__NR];
    for (int i = 0; i < DPAR__MR; i++)
        for (int q = 0; q < 4; q++) vst1q_f32(t[i] + 4 * q, r[i][q]);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = (ow ? 0.0f : c[i * ldc + j]) + alpha * t[i][j];
}
#endif
#ifdef DPAR__X86_SIMD
/* C[mr, nr] (row stride ldc) = alpha * r + (ow ? 0 : C): the microkernels' write-back */
__attribute__((target("avx2"))) static inline void dpar__ukr_store(__m256 r[DPAR__MR][2], float *c, int64_t ldc,
                                                                   float alpha, int mr, int nr, int ow) {
    __m256 al = _mm256_set1_ps(alpha);
    if (mr == DPAR__MR && nr == DPAR__NR) {
        const __m256 z = _mm256_setzero_ps();
        for (int i = 0; i < DPAR__MR; i++) {
            float *ci = c + i * ldc;
            _mm256_storeu_ps(ci, _mm256_add_ps(ow ? z : _mm256_loadu_ps(ci), _mm256_mul_ps(al, r[i][0])));
            _mm256_storeu_ps(ci + 8, _mm256_add_ps(ow ? z : _mm256_loadu_ps(ci + 8), _mm256_mul_ps(al, r[i][1])));
        }
        return;
    }
    float t[DPAR__MR][DPAR__NR];
    for (int i = 0; i < DPAR__MR; i++) {
        _mm256_storeu_ps(t[i], r[i][0]);
        _mm256_storeu_ps(t[i] + 8, r[i][1]);
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = (ow ? 0.0f : c[i * ldc + j]) + alpha * t[i][j];
}
__attribute__((target("avx2"))) static void dpar__ukr_avx2(int64_t kc, const float *a, int64_t ars, int64_t acs,
                                                           const float *b, int64_t bs, float *c, int64_t ldc,
                                                           float alpha, int mr, int nr, int ow) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *a1 = a + ars, *a2 = a + 2 * ars, *a3 = a + 3 * ars, *a4 = a + 4 * ars, *a5 = a + 5 * ars;
    for (int64_t k = 0; k < kc; k++, a += acs, a1 += acs, a2 += acs, a3 += acs, a4 += acs, a5 += acs, b += bs) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
        x = _mm256_broadcast_ss(a);
        c00 = _mm256_add_ps(c00, _mm256_mul_ps(x, b0));
        c01 = _mm256_add_ps(c01, _mm256_mul_ps(x, b1));
        x = _mm256_broadcast_ss(a1);
        c10 = _mm256_add_ps(c10, _mm256_mul_ps(x, b0));
        c11 = _mm256_add_ps(c11, _mm256_mul_ps(x, b1));
        x = _mm256_broadcast_ss(a2);
        c20 = _mm256_add_ps(c20, _mm256_mul_ps(x, b0));
        c21 = _mm256_add_ps(c21, _mm256_mul_ps(x, b1));
        x = _mm256_broadcast_ss(a3);
        c30 = _mm256_add_ps(c30, _mm256_mul_ps(x, b0));
        c31 = _mm256_add_ps(c31, _mm256_mul_ps(x, b1));
        x = _mm256_broadcast_ss(a4);
        c40 = _mm256_add_ps(c40, _mm256_mul_ps(x, b0));
        c41 = _mm256_add_ps(c41, _mm256_mul_ps(x, b1));
        x = _mm256_broadcast_ss(a5);
        c50 = _mm256_add_ps(c50, _mm256_mul_ps(x, b0));
        c51 = _mm256_add_ps(c51, _mm256_mul_ps(x, b1));
    }
    __m256 r[DPAR__MR][2] = { { c00, c01 }, { c10, c11 }, { c20, c21 }, { c30, c31 }, { c40, c41 }, { c50, c51 } };
    dpar__ukr_store(r, c, ldc, alpha, mr, nr, ow);
}
/* the same with fused multiply-adds: twice the throughput of the separate
   multiply and add here, used wherever the CPU has FMA (see dpar__ukr_pick) */
__attribute__((target("avx2,fma"))) static void dpar__ukr_fma(int64_t kc, const float *a, int64_t ars, int64_t acs,
                                                              const float *b, int64_t bs, float *c, int64_t ldc,
                                                              float alpha, int mr, int nr, int ow) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *a1 = a + ars, *a2 = a + 2 * ars, *a3 = a + 3 * ars, *a4 = a + 4 * ars, *a5 = a + 5 * ars;
    for (int64_t k = 0; k < kc; k++, a += acs, a1 += acs, a2 += acs, a3 += acs, a4 += acs, a5 += acs, b += bs) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
        x = _mm256_broadcast_ss(a);
        c00 = _mm256_fmadd_ps(x, b0, c00);
        c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a1);
        c10 = _mm256_fmadd_ps(x, b0, c10);
        c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a2);
        c20 = _mm256_fmadd_ps(x, b0, c20);
        c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3);
        c30 = _mm256_fmadd_ps(x, b0, c30);
        c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a4);
        c40 = _mm256_fmadd_ps(x, b0, c40);
        c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a5);
        c50 = _mm256_fmadd_ps(x, b0, c50);
        c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    __m256 r[DPAR__MR][2] = { { c00, c01 }, { c10, c11 }, { c20, c21 }, { c30, c31 }, { c40, c41 }, { c50, c51 } };
    dpar__ukr_store(r, c, ldc, alpha, mr, nr, ow);
}
/* The same arithmetic on an 8 x 32 AVX-512 tile (MR512 x NR512): 16 accumulators, two 16-float
   vectors per row. A fused multiply-add has 4 cycles of latency on 2 ports, so 8 independent
   accumulators are the least that keep it busy; the 6 x 16 tile's 6 capped the kernel near 75% of
   peak. Each element still takes one multiply and one add (or one fused multiply-add) per k in
   ascending k: the same bits as the 6 x 16 kernels. The kernel reads only the mr rows of A and the
   nr columns of B it is given (rows past mr are skipped, columns past nr are masked), so edge
   strips need no zero-padded copy; nr <= 16 runs the one-vector form (16 lanes, 8 accumulators). */
#define DPAR__MR512 8
#define DPAR__NR512 32
__attribute__((target("avx512f"))) static inline __mmask16 dpar__mask16(int n) {
    return (__mmask16)(n >= 16 ? 0xffffu : n <= 0 ? 0u : (1u << n) - 1u);
}
/* row i of the tile at step k: x = A(i, k) against the nv vectors of B's row k; none past the first rows */
#define DPAR__ROW512(madd, nv, rows, i)              \
    do {                                             \
        if (i >= rows) break;                        \
        const __m512 x_ = _mm512_set1_ps(a[o##i]);   \
        c##i##0 = madd(x_, b0, c##i##0);             \
        if (nv > 1) c##i##1 = madd(x_, b1, c##i##1); \
    } while (0)
/* the k loop over the tile's first rows (DPAR__MR512: a constant, no tests left in the loop) */
#define DPAR__KLOOP512(madd, nv, rows)                                                                        \
    for (int64_t k = 0; k < kc; k++, a += acs, b += bs) {                                                     \
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = nv > 1 ? _mm512_maskz_loadu_ps(m1, b + 16) : b0; \
        DPAR__ROW512(madd, nv, rows, 0);                                                                      \
        DPAR__ROW512(madd, nv, rows, 1);                                                                      \
        DPAR__ROW512(madd, nv, rows, 2);                                                                      \
        DPAR__ROW512(madd, nv, rows, 3);                                                                      \
        DPAR__ROW512(madd, nv, rows, 4);                                                                      \
        DPAR__ROW512(madd, nv, rows, 5);                                                                      \
        DPAR__ROW512(madd, nv, rows, 6);                                                                      \
        DPAR__ROW512(madd, nv, rows, 7);                                                                      \
    }
/* row i of C (row stride ldc) = (ow ? 0 : C) + alpha * acc, masked to the nr columns */
#define DPAR__STORE512(nv, i)                                                                                      \
    do {                                                                                                           \
        float *ci_ = c + i * ldc;                                                                                  \
        if (i >= mr) break;                                                                                        \
        c##i##0 = _mm512_mul_ps(al, c##i##0);                                                                      \
        _mm512_mask_storeu_ps(ci_, m0, _mm512_add_ps(ow ? z : _mm512_maskz_loadu_ps(m0, ci_), c##i##0));           \
        if (nv < 2) break;                                                                                         \
        c##i##1 = _mm512_mul_ps(al, c##i##1);                                                                      \
        _mm512_mask_storeu_ps(ci_ + 16, m1, _mm512_add_ps(ow ? z : _mm512_maskz_loadu_ps(m1, ci_ + 16), c##i##1)); \
    } while (0)
/* name: the kernel with nv (1 or 2) vectors a row; narrow: its one-vector form, for nr <= 16; full: the
   whole 8 x 32 tile only (no masks, no row clamps: the loop keeps its registers, measured 1.1x faster) */
#define DPAR__UKR512(name, narrow, target_s, madd, nv, full)                                                           \
    __attribute__((target(target_s))) static void name(int64_t kc, const float *a, int64_t ars, int64_t acs,           \
                                                       const float *b, int64_t bs, float *c, int64_t ldc, float alpha, \
                                                       int mr, int nr, int ow) {                                       \
        if (!full && nv > 1 && nr <= 16) {                                                                             \
            narrow(kc, a, ars, acs, b, bs, c, ldc, alpha, mr, nr, ow);                                                 \
            return;                                                                                                    \
        }                                                                                                              \
        if (full) mr = DPAR__MR512, nr = DPAR__NR512;                                                                  \
        const __mmask16 m0 = full ? 0xffff : dpar__mask16(nr), m1 = full ? 0xffff : dpar__mask16(nr - 16);             \
        const int64_t o0 = 0, o1 = ars, o2 = 2 * ars, o3 = 3 * ars, o4 = 4 * ars, o5 = 5 * ars, o6 = 6 * ars,          \
                      o7 = 7 * ars;                                                                                    \
        for (int i_ = 0; full && !ow && i_ < DPAR__MR512; i_++) { /* C's tile, read after the loop */                  \
            _mm_prefetch((const char *)(c + i_ * ldc), _MM_HINT_T0);                                                   \
            _mm_prefetch((const char *)(c + i_ * ldc + DPAR__NR512 - 1), _MM_HINT_T0);                                 \
        }                                                                                                              \
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00;            \
        __m512 c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;      \
        if (full || mr == DPAR__MR512) {                                                                               \
            DPAR__KLOOP512(madd, nv, DPAR__MR512);                                                                     \
        } else { /* no multiply-adds for rows past mr: a 1-row edge tile cost a full one (conv1's kernel gradient,   \
                    9 x 32: its 1-row tile took half the product's time); 1 row 3.2x, 4 rows 1.9x faster */ \
            DPAR__KLOOP512(madd, nv, mr);                                                                              \
        }                                                                                                              \
        const __m512 al = _mm512_set1_ps(alpha), z = _mm512_setzero_ps(); /* 0 + x: -0 stores +0 */                    \
        DPAR__STORE512(nv, 0);                                                                                         \
        DPAR__STORE512(nv, 1);                                                                                         \
        DPAR__STORE512(nv, 2);                                                                                         \
        DPAR__STORE512(nv, 3);                                                                                         \
        DPAR__STORE512(nv, 4);                                                                                         \
        DPAR__STORE512(nv, 5);                                                                                         \
        DPAR__STORE512(nv, 6);                                                                                         \
        DPAR__STORE512(nv, 7);                                                                                         \
    }
#define DPAR__MULADD512(x, y, acc) _mm512_add_ps(acc, _mm512_mul_ps(x, y))
DPAR__UKR512(dpar__ukr_avx512_16, dpar__ukr_avx512_16, "avx512f", DPAR__MULADD512, 1, 0)
DPAR__UKR512(dpar__ukr_avx512_e, dpar__ukr_avx512_16, "avx512f", DPAR__MULADD512, 2, 0)
DPAR__UKR512(dpar__ukr_avx512_f, dpar__ukr_avx512_16, "avx512f", DPAR__MULADD512, 2, 1)
DPAR__UKR512(dpar__ukr_fma512_16, dpar__ukr_fma512_16, "avx512f,fma", _mm512_fmadd_ps, 1, 0)
DPAR__UKR512(dpar__ukr_fma512_e, dpar__ukr_fma512_16, "avx512f,fma", _mm512_fmadd_ps, 2, 0)
DPAR__UKR512(dpar__ukr_fma512_f, dpar__ukr_fma512_16, "avx512f,fma", _mm512_fmadd_ps, 2, 1)
/* the tile's kernels: the full form where the tile is whole, the masked one at the edges */
static void dpar__ukr_avx512(int64_t kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs, float *c,
                             int64_t ldc, float alpha, int mr, int nr, int ow) {
    (mr == DPAR__MR512 && nr == DPAR__NR512 ? dpar__ukr_avx512_f : dpar__ukr_avx512_e)(kc, a, ars, acs, b, bs, c, ldc,
                                                                                       alpha, mr, nr, ow);
}
static void dpar__ukr_fma512(int64_t kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs, float *c,
                             int64_t ldc, float alpha, int mr, int nr, int ow) {
    (mr == DPAR__MR512 && nr == DPAR__NR512 ? dpar__ukr_fma512_f : dpar__ukr_fma512_e)(kc, a, ars, acs, b, bs, c, ldc,
                                                                                       alpha, mr, nr, ow);
}
/* row i of the tap tile at step k: x = A(i, k), read from the tap's pointer for row i */
#define DPAR__TAPROW512(i)                          \
    do {                                            \
        const __m512 x_ = _mm512_set1_ps(a##i[k]);  \
        c##i##0 = _mm512_fmadd_ps(x_, b0, c##i##0); \
        c##i##1 = _mm512_fmadd_ps(x_, b1, c##i##1); \
    } while (0)
/* row i of C (row stride ldc) += acc: DPAR__STORE512's write-back at alpha 1, C read (ow 0) */
#define DPAR__TAPSTORE512(i)                                                           \
    do {                                                                               \
        float *ci_ = c + i * ldc;                                                      \
        if (i >= mr) break;                                                            \
        _mm512_storeu_ps(ci_, _mm512_add_ps(_mm512_loadu_ps(ci_), c##i##0));           \
        _mm512_storeu_ps(ci_ + 16, _mm512_add_ps(_mm512_loadu_ps(ci_ + 16), c##i##1)); \
    } while (0)
/* C[mr, 32] += A B over kc steps, A read in place from a convolution's input (implicit GEMM, no im2col
   copy): the steps come in taps of seg (a tap's channels, contiguous in NHWC), row i of the tap s at
   ap[s * 8 + i], a pixel of x or zeros in the padding. Per element the fused multiply-adds of
   dpar__ukr_fma512_f in the same order from +0, then C + 1 * acc: the same bits as the GEMM on im2col's
   rows. Rows past mr point at zeros and are not stored. */
__attribute__((target("avx512f,fma"))) static void dpar__ukr_taps512(int64_t kc, int64_t seg, const float *const *ap,
                                                                     const float *b, int64_t bs, float *c, int64_t ldc,
                                                                     int mr) {
    for (int i_ = 0; i_ < mr; i_++) { /* C's tile, read after the loop */
        _mm_prefetch((const char *)(c + i_ * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i_ * ldc + DPAR__NR512 - 1), _MM_HINT_T0);
    }
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00;
    __m512 c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    for (int64_t s = 0; s < kc; s += seg, ap += DPAR__MR512) {
        const float *a0 = ap[0], *a1 = ap[1], *a2 = ap[2], *a3 = ap[3], *a4 = ap[4], *a5 = ap[5], *a6 = ap[6],
                    *a7 = ap[7];
        for (int64_t k = 0; k < seg; k++, b += bs) {
            const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
            DPAR__TAPROW512(0);
            DPAR__TAPROW512(1);
            DPAR__TAPROW512(2);
            DPAR__TAPROW512(3);
            DPAR__TAPROW512(4);
            DPAR__TAPROW512(5);
            DPAR__TAPROW512(6);
            DPAR__TAPROW512(7);
        }
    }
    DPAR__TAPSTORE512(0);
    DPAR__TAPSTORE512(1);
    DPAR__TAPSTORE512(2);
    DPAR__TAPSTORE512(3);
    DPAR__TAPSTORE512(4);
    DPAR__TAPSTORE512(5);
    DPAR__TAPSTORE512(6);
    DPAR__TAPSTORE512(7);
}
/* C[8, 32] = A B over kc steps (A's rows at a + i * ars, read in place; B as dpar__ukr_fma512_f's), each
   row i added into dst[i] (none where NULL): the input gradient's col2im fused into the write-back. dst[i]
   + (0 + acc) is col2im's add of the element that the GEMM's first k block stores, the same bits. */
__attribute__((target("avx512f,fma"))) static void dpar__ukr_scatter512(int64_t kc, const float *a, int64_t ars,
                                                                        const float *b, int64_t bs, float *const *dst) {
    const int64_t acs = 1, o0 = 0, o1 = ars, o2 = 2 * ars, o3 = 3 * ars, o4 = 4 * ars, o5 = 5 * ars, o6 = 6 * ars,
                  o7 = 7 * ars;
    const __mmask16 m0 = 0xffff, m1 = 0xffff;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00;
    __m512 c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    DPAR__KLOOP512(_mm512_fmadd_ps, 2, DPAR__MR512);
    const __m512 z = _mm512_setzero_ps();
    const __m512 acc[DPAR__MR512][2] = { { c00, c01 }, { c10, c11 }, { c20, c21 }, { c30, c31 },
                                         { c40, c41 }, { c50, c51 }, { c60, c61 }, { c70, c71 } };
    for (int i = 0; i < DPAR__MR512; i++)
        for (int h = 0; dst[i] && h < 2; h++)
            _mm512_storeu_ps(dst[i] + 16 * h,
                             _mm512_add_ps(_mm512_loadu_ps(dst[i] + 16 * h), _mm512_add_ps(z, acc[i][h])));
}
#undef DPAR__TAPROW512
#undef DPAR__TAPSTORE512
#endif
/* dst[k * ldd + j] = src[j * ld + k], j < 16, k < kc: 16 columns of a transposed B packed
   (row j of the stored B is column j of op(B)); rows read in order, the copy is exact */
static void dpar__pack_bt_c(float *dst, int64_t ldd, const float *src, int64_t ld, int64_t kc) {
    for (int64_t j = 0; j < 16; j++, src += ld)
        for (int64_t k = 0; k < kc; k++) dst[k * ldd + j] = src[k];
}
#ifdef DPAR__X86_SIMD
/* the same by 16 x 16 register transposes, the k tail by dpar__pack_bt_c's loop;
   the scalar strided gather was a third of the packing time of attention's small Q K^T products */
__attribute__((target("avx512f"))) static void dpar__pack_bt_avx512(float *dst, int64_t ldd, const float *src,
                                                                    int64_t ld, int64_t kc) {
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16) {
        __m512 r[16], t[16];
        for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(src + j * ld + k);
        for (int j = 0; j < 16; j += 2) { /* interleave row pairs: 2 x 2 blocks */
            t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
            t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
        }
        for (int j = 0; j < 16; j += 4) { /* 4 x 4 blocks within each 128-bit lane */
            r[j] = _mm512_shuffle_ps(t[j], t[j + 2], 0x44);
            r[j + 1] = _mm512_shuffle_ps(t[j], t[j + 2], 0xee);
            r[j + 2] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0x44);
            r[j + 3] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0xee);
        }
        for (int j = 0; j < 4; j++) { /* 128-bit lanes across row groups 0-3 | 4-7 and 8-11 | 12-15 */
            t[j] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0x88);
            t[j + 4] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0xdd);
            t[j + 8] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0x88);
            t[j + 12] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0xdd);
        }
        for (int j = 0; j < 8; j++) {
            _mm512_storeu_ps(dst + (k + j) * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88));
            _mm512_storeu_ps(dst + (k + j + 8) * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd));
        }
    }
    if (k < kc) dpar__pack_bt_c(dst + k * ldd, ldd, src + k, ld, kc - k);
}
#endif
/* a micro-kernel, its register tile and how it copes with edges */
typedef struct dpar__ukr {
    void (*fn)(int64_t kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs, float *c, int64_t ldc,
               float alpha, int mr, int nr, int ow);
    void (*packbt)(float *dst, int64_t ldd, const float *src, int64_t ld, int64_t kc); /* 16 columns of op(B) */
    int mr, nr; /* the tile: rows, columns (a multiple of 16) */
    int edges;  /* reads only the mr x nr corner it is given: edge strips need no zero-padded copy */
} dpar__ukr;
/* the fastest kernel this CPU has: fused multiply-adds where it has FMA (else a rounded multiply, then an add) */
static dpar__ukr dpar__ukr_pick(void) {
    dpar__ukr u = { dpar__ukr_c, dpar__pack_bt_c, DPAR__MR, DPAR__NR, 0 };
#ifdef DPAR__ARM_NEON
    u.fn = dpar__ukr_neon;
#endif
#ifdef DPAR__X86_SIMD
    int fma = __builtin_cpu_supports("fma");
    if (__builtin_cpu_supports("avx2")) u.fn = fma ? dpar__ukr_fma : dpar__ukr_avx2;
    if (__builtin_cpu_supports("avx512f")) {
        u.fn = fma ? dpar__ukr_fma512 : dpar__ukr_avx512;
        u.packbt = dpar__pack_bt_avx512;
        u.mr = DPAR__MR512;
        u.nr = DPAR__NR512;
        u.edges = 1;
    }
#endif
    return u;
}
/* whether the strip of nr columns (of the tile's u->nr) is read from B's own rows: a non-transposed B
   for few rows of C (direct), and its edge strip whenever the kernel masks edges (measured: 64x10x128
   1.45x faster; in place full strips of B for 1024 rows were slower, 1024x256x128 0.8x) */
static int dpar__direct_b(const dpar__ukr *u, int direct, int tb, int64_t nr) {
    return !tb && (direct ? nr == u->nr || u->edges : u->edges && nr < u->nr);
}
/* op(B)[pc:pc+kc, jc:jc+nc] into strips of u->nr columns, element (k, j) of a strip at
   bp[k * nr + j], zero padded; strips read in place (dpar__direct_b) are left out */
static void dpar__pack_b(const dpar__ukr *u, float *bp, const float *B, int64_t N, int64_t K, int tb, int64_t pc,
                         int64_t kc, int64_t jc, int64_t nc, int direct) {
    const int64_t NR = u->nr;
    for (int64_t jr = 0; jr < nc; jr += NR) {
        float *dst = bp + jr * kc;
        int64_t nr = nc - jr < NR ? nc - jr : NR;
        if (dpar__direct_b(u, direct, tb, nr)) continue;
        if (nr == NR) { /* full strips: whole rows, or a transpose */
            if (tb)
                for (int64_t h = 0; h < NR; h += 16) u->packbt(dst + h, NR, B + (jc + jr + h) * K + pc, K, kc);
            else /* 16 floats a memcpy: a constant size the compiler turns into vector moves */
                for (int64_t k = 0; k < kc; k++)
                    for (int64_t h = 0; h < NR; h += 16)
                        memcpy(dst + k * NR + h, B + (pc + k) * N + jc + jr + h, 16 * sizeof(float));
            continue;
        }
        for (int64_t k = 0; k < kc; k++, dst += NR) {
            for (int64_t j = 0; j < nr; j++)
                dst[j] = tb ? B[(jc + jr + j) * K + pc + k] : B[(pc + k) * N + jc + jr + j];
            for (int64_t j = nr; j < NR; j++) dst[j] = 0.0f;
        }
    }
}
/* op(A)[ic:ic+mc, pc:pc+kc] into strips of u->mr rows, element (i, k) of a strip at
   ap[k * mr + i], zero padded; strips read in place (direct) are left out */
static void dpar__pack_a(const dpar__ukr *u, float *ap, const float *A, int64_t M, int64_t K, int ta, int64_t pc,
                         int64_t kc, int64_t ic, int64_t mc, int direct) {
    const int64_t MR = u->mr, mfull = direct ? 0 : mc / MR * MR;
    /* the full strips of a transposed A: each row of the stored A (one k) read once, in order, MR floats
       to each strip; strip by strip it was kc strided rows per strip, slower than reading A in place */
    for (int64_t k = 0; ta && k < kc; k++) {
        const float *src = A + (pc + k) * M + ic;
        float *dst = ap + k * MR;
        if (MR == 8) /* the AVX-512 tile: a constant size, one vector move */
            for (int64_t ir = 0; ir < mfull; ir += 8) memcpy(dst + ir * kc, src + ir, 8 * sizeof(float));
        else
            for (int64_t ir = 0; ir < mfull; ir += MR) memcpy(dst + ir * kc, src + ir, (size_t)MR * sizeof(float));
    }
    for (int64_t ir = 0; ir < mc; ir += MR) {
        float *dst = ap + ir * kc;
        int64_t mr = mc - ir < MR ? mc - ir : MR;
        if ((direct && (mr == MR || u->edges)) || (ta && mr == MR)) continue;
        for (int64_t k = 0; k < kc; k++, dst += MR) {
            for (int64_t i = 0; i < mr; i++)
                dst[i] = ta ? A[(pc + k) * M + ic + ir + i] : A[(ic + ir + i) * K + pc + k];
            for (int64_t i = mr; i < MR; i++) dst[i] = 0.0f;
        }
    }
}
/* Rows i0..i1-1, columns j0..j1-1 of C[M,N] = alpha op(A) op(B) + beta C, f32, row-major. */
/* whether dpar__sgemm_tile packs A[M,K] for ncols columns of C with nr-column strips: a transposed A of
   DPAR__PACK_AT_ROWS rows or more and more than one strip (the rule's measurements are at its use) */
static int dpar__sgemm_packs_a(int ta, int64_t M, int64_t K, int64_t ncols, int64_t nr) {
    return ta && M >= DPAR__PACK_AT_ROWS && K > 16 && ncols > nr;
}
static void dpar__sgemm_tile(int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha, const float *A,
                             const float *B, float beta, float *C, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    int trivial = K == 0 || alpha == 0.0f || i1 <= i0 || j1 <= j0;
    if (trivial || (beta != 0.0f && beta != 1.0f)) /* beta = 0: the first k block overwrites C */
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = j0; j < j1; j++) C[i * N + j] = beta == 0.0f ? 0.0f : beta * C[i * N + j];
    if (trivial) return;
    const dpar__ukr u = dpar__ukr_pick();
    const int64_t MR = u.mr, NR = u.nr;
    int64_t ncmax = j1 - j0 < DPAR__NC ? j1 - j0 : DPAR__NC, kcmax = K < DPAR__KC ? K : DPAR__KC,
            mcmax = i1 - i0 < DPAR__MC ? i1 - i0 : DPAR__MC;
    size_t bsz = (size_t)((ncmax + NR - 1) / NR * NR) * (size_t)kcmax;
    size_t asz = (size_t)((mcmax + MR - 1) / MR * MR) * (size_t)kcmax;
    float *ws = NULL;
    if (!(ws = (float *)DPAR_ALIGNED_MALLOC((bsz + asz) * sizeof(float) + 64, 64))) {
        /* no memory for the packs: the plain triple loop (k in order; see the rounding note above) */
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = j0; j < j1; j++) {
                float acc = 0.0f;
                for (int64_t k = 0; k < K; k++)
                    acc += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
                C[i * N + j] = (beta == 0.0f ? 0.0f : C[i * N + j]) + alpha * acc;
            }
        return;
    }
    float *bp = ws, *ap = ws + bsz;
    /* B read in place: each packed B element would serve at most DPAR__DIRECT_B_ROWS rows of C, too few to
       pay for the copy (measured, 1 thread: 16x256x3136 1.6x, 64x128x64 1.13x, 128x128x128 1.08x faster;
       packing A's rows into a compact block did nothing at 1024^3, so A's 4 KiB row stride costs
       nothing measurable). A non-transposed A is always read in place
       (its rows are contiguous in k); a transposed one (each k a row of M) below DPAR__PACK_AT_ROWS rows
       (measured on Zen 4, 1 thread, against packing: 64x32x64:tn 1.15x, 288x64x1818:tn 1.2x, 384x128x2048:tn
       1.05x faster in place; at 512 rows and 2 KiB strides, and at 1024 and 2048, packed is 1.1-1.2x faster),
       or of any size when C has one strip of columns: each element is read once, the copy saves nothing
       (measured: 2048x16x512:tn 1.6x, 512x32x512:tn 1.3x faster in place) */
    int directb = i1 - i0 <= DPAR__DIRECT_B_ROWS, directa = !dpar__sgemm_packs_a(ta, M, K, j1 - j0, NR);
    const int64_t ars = ta ? 1 : K, acs = ta ? M : 1;
    for (int64_t jc = j0; jc < j1; jc += DPAR__NC) {
        int64_t nc = j1 - jc < DPAR__NC ? j1 - jc : DPAR__NC;
        for (int64_t pc = 0; pc < K; pc += DPAR__KC) {
            int64_t kc = K - pc < DPAR__KC ? K - pc : DPAR__KC;
            dpar__pack_b(&u, bp, B, N, K, tb, pc, kc, jc, nc, directb);
            for (int64_t ic = i0; ic < i1; ic += DPAR__MC) {
                int64_t mc = i1 - ic < DPAR__MC ? i1 - ic : DPAR__MC;
                dpar__pack_a(&u, ap, A, M, K, ta, pc, kc, ic, mc, directa);
                for (int64_t jr = 0; jr < nc; jr += NR)
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        int mr = (int)(mc - ir < MR ? mc - ir : MR), nr = (int)(nc - jr < NR ? nc - jr : NR);
                        int da = directa && (mr == MR || u.edges), db = dpar__direct_b(&u, directb, tb, nr);
                        u.fn(kc, da ? A + (ic + ir) * ars + pc * acs : ap + ir * kc, da ? ars : 1, da ? acs : MR,
                             db ? B + pc * N + jc + jr : bp + jr * kc, db ? N : NR, C + (ic + ir) * N + jc + jr, N,
                             alpha, mr, nr, pc == 0 && beta == 0.0f);
                    }
            }
        }
    }
    DPAR_ALIGNED_FREE(ws);
}
typedef struct dpar__sgemm_args {
    int64_t M, N, K;
    int ta, tb;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int64_t rows, cols, ncols; /* a work item: rows x cols of C; ncols items across */
} dpar__sgemm_args;
/* columns per work item: a whole number of every kernel's strips, and enough that a split is worth
   reading A once more (measured, 2 threads: 32-column items took 1.2x the CPU time of 1818x64x288) */
#define DPAR__SGEMM_COLS 128
/* rows per work item at least: a whole number of every kernel's tile rows (6, 8), and a block of A
   (DPAR__MC) for each packed copy of B */
#define DPAR__SGEMM_ROWS 96
static void dpar__sgemm_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__sgemm_args *g = (const dpar__sgemm_args *)arg;
    for (int64_t t = lo; t < hi; t++) {
        int64_t i0 = t / g->ncols * g->rows, j0 = t % g->ncols * g->cols;
        int64_t i1 = i0 + g->rows < g->M ? i0 + g->rows : g->M, j1 = j0 + g->cols < g->N ? j0 + g->cols : g->N;
        dpar__sgemm_tile(g->M, g->N, g->K, g->ta, g->tb, g->alpha, g->A, g->B, g->beta, g->C, i0, i1, j0, j1);
    }
}
/* The work items of C[M,N] for nt threads: column blocks of DPAR__SGEMM_COLS while they are enough
   to share out (4 a thread), else blocks of rows too (the CNN's convolutions have 32 or 64
   columns: one item, one thread), else, with fewer rows than two blocks, columns in strips of 16
   (conv1's kernel gradient: 9 x 32). Each element of C takes the same k blocks and the same
   multiply-adds in any item, so the split never changes a bit. */
static void dpar__sgemm_items(dpar__sgemm_args *g, int nt) {
    int64_t M = g->M, N = g->N, want = 4 * (int64_t)nt, nr = 1;
    if (nt <= 1 && dpar__sgemm_packs_a(g->ta, M, g->K, N, dpar__ukr_pick().nr)) {
        /* one thread and an A that dpar__sgemm_tile packs: one item, all of C, so A is packed once per
           DPAR__NC columns, not once per 128 (1024^3:tn 0.90 -> 1.03 of OpenBLAS). Not for the rest: one
           item of 3136 columns ran 16x3136x256:nt at 0.84 of OpenBLAS against 0.93 in items of 128 */
        g->rows = M;
        g->cols = N > 0 ? N : 1;
        g->ncols = 1;
        return;
    }
    g->cols = DPAR__SGEMM_COLS;
    g->ncols = N > 0 ? (N + g->cols - 1) / g->cols : 1;
    if (nt > 1 && g->ncols < want) {
        nr = (want + g->ncols - 1) / g->ncols;
        if (nr > M / DPAR__SGEMM_ROWS) nr = M / DPAR__SGEMM_ROWS > 0 ? M / DPAR__SGEMM_ROWS : 1;
    }
    g->rows = (M + nr - 1) / nr;
    g->rows = g->rows > 0 ? (g->rows + 23) / 24 * 24 : 1; /* whole tiles of 6 and of 8 rows */
    if (nt > 1 && nr == 1 && g->ncols == 1 && N > 16) {
        g->cols = (N + 16 * nt - 1) / (16 * nt) * 16;
        g->ncols = (N + g->cols - 1) / g->cols;
    }
}
/* C[M,N] = alpha op(A) op(B) + beta C, f32, row-major; on the device's
   helper threads too when it has them and the product is large. */
static void dpar__cpu_sgemm(dpar__cpu *c, int dev, int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha,
                            const float *A, const float *B, float beta, float *C) {
#ifdef DPAR_USE_CBLAS
    DPAR__UNUSED(c);
    DPAR__UNUSED(dev);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, ta ? (int)M : (int)K, B, tb ? (int)K : (int)N, beta, C, (int)N);
#else
    dpar__sgemm_args g;
    g.M = M;
    g.N = N;
    g.K = K;
    g.ta = ta;
    g.tb = tb;
    g.alpha = alpha;
    g.beta = beta;
    g.A = A;
    g.B = B;
    g.C = C;
    /* cost 2 M N K / DPAR__SGEMM_COLS: threads from M N K >= 2^22 multiply-adds on */
    int nt = dpar__cpu_threads(c, dev, 2.0 * (double)M * (double)N * (double)K / DPAR__SGEMM_COLS);
    dpar__sgemm_items(&g, nt);
    int64_t n = (M + g.rows - 1) / g.rows * g.ncols;
    /* cost per item 2 rows K cols / 128 */
    dpar__cpu_parallel(c, dev, n > 0 ? n : 1, 2 * g.rows * K * g.cols / DPAR__SGEMM_COLS + 1, dpar__sgemm_range, &g);
#endif
}

/* AVX2 forms of the hottest element-wise ops (same arithmetic, element by
   element, as the scalar loops: separately rounded multiplies and adds);
   they return how many leading elements they did, the scalar loop does the rest. */
#ifdef DPAR__X86_SIMD
/* y[i] += alpha x[i] (a rounded multiply, then the add; y may be x): the scalar loop stays scalar, as
   the compiler cannot rule out a partial overlap (3% of the GPT's 1x1 step, accumulating gradients) */
__attribute__((target("avx2"))) static int64_t dpar__axpy_avx2(float *y, const float *x, int64_t n, float alpha) {
    int64_t i = 0;
    const __m256 a = _mm256_set1_ps(alpha);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(a, _mm256_loadu_ps(x + i))));
    return i;
}
__attribute__((target("avx2"))) static int64_t dpar__relu_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    const __m256 z = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) { /* x > 0 or NaN: x, else +0 */
        __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(y + i, _mm256_and_ps(_mm256_cmp_ps(v, z, _CMP_NLE_UQ), v));
    }
    return i;
}
__attribute__((target("avx2"))) static int64_t dpar__relu_bwd_avx2(float *y, const float *dy, const float *x,
                                                                   int64_t n) {
    int64_t i = 0;
    const __m256 z = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), z, _CMP_GT_OQ), _mm256_loadu_ps(dy + i)));
    return i;
}
__attribute__((target("avx2"))) static int64_t dpar__sgd_avx2(float *p, float *v, const float *g, int64_t n, float lr,
                                                              float mu, float wd, float cs, int nesterov) {
    int64_t i = 0;
    const __m256 vlr = _mm256_set1_ps(lr), vmu = _mm256_set1_ps(mu), vwd = _mm256_set1_ps(wd), vcs = _mm256_set1_ps(cs);
    for (; i + 8 <= n; i += 8) {
        __m256 pp = _mm256_loadu_ps(p + i);
        __m256 gg = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), vcs), _mm256_mul_ps(vwd, pp));
        __m256 u = gg;
        if (v) {
            __m256 vv = _mm256_add_ps(_mm256_mul_ps(vmu, _mm256_loadu_ps(v + i)), gg);
            _mm256_storeu_ps(v + i, vv);
            u = nesterov ? _mm256_add_ps(gg, _mm256_mul_ps(vmu, vv)) : vv;
        }
        _mm256_storeu_ps(p + i, _mm256_sub_ps(pp, _mm256_mul_ps(vlr, u)));
    }
    return i;
}
/* y[m, 0:n8] += b[0:n8], n8 = n rounded down to 8 */
__attribute__((target("avx2"))) static int64_t dpar__bias_add_avx2(float *y, const float *b, int64_t m, int64_t n) {
    int64_t n8 = n / 8 * 8;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n8; j += 8)
            _mm256_storeu_ps(y + i * n + j, _mm256_add_ps(_mm256_loadu_ps(y + i * n + j), _mm256_loadu_ps(b + j)));
    return n8;
}
/* y[j] = beta y[j] + (sum over rows of x[., j]) for 8 columns from j, the sum in row order */
__attribute__((target("avx2"))) static void dpar__bias_grad_put8(float *y, __m256 acc, float beta) {
    __m256 base = beta == 0.0f ? _mm256_setzero_ps() : _mm256_mul_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(y));
    _mm256_storeu_ps(y, _mm256_add_ps(base, acc));
}
/* column sums s[j] = ((0 + x[0][j]) + x[1][j]) + ..., then y[j] = (beta ? beta y[j] : 0) + s[j], for j < n8,
   n8 = n rounded down to 8, of x's m rows of stride ld; returns n8. 64 columns at a time (8 sums in
   flight: one chain of dependent adds ran at a quarter of the adder's rate, measured 5.7% of the GPT
   step), then up to 32 (4 in flight: conv1's 32 columns took four chains one after the other, 7% of its
   kernel gradient), vectors past the width re-reading the first, their sums dropped. Each column still
   adds its rows in order */
__attribute__((target("avx2"))) static int64_t dpar__bias_grad_avx2(float *y, const float *x, int64_t m, int64_t ld,
                                                                    int64_t n, float beta) {
    int64_t j = 0, n8 = n / 8 * 8;
    for (; j + 64 <= n; j += 64) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t i = 0; i < m; i++) {
            const float *r = x + i * ld + j;
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(r));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(r + 8));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(r + 16));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(r + 24));
            a4 = _mm256_add_ps(a4, _mm256_loadu_ps(r + 32));
            a5 = _mm256_add_ps(a5, _mm256_loadu_ps(r + 40));
            a6 = _mm256_add_ps(a6, _mm256_loadu_ps(r + 48));
            a7 = _mm256_add_ps(a7, _mm256_loadu_ps(r + 56));
        }
        __m256 acc[8] = { a0, a1, a2, a3, a4, a5, a6, a7 };
        for (int k = 0; k < 8; k++) dpar__bias_grad_put8(y + j + 8 * k, acc[k], beta);
    }
    for (; j < n8; j += 32) {
        int nv = n8 - j < 32 ? (int)(n8 - j) / 8 : 4;
        const int64_t o1 = nv > 1 ? 8 : 0, o2 = nv > 2 ? 16 : 0, o3 = nv > 3 ? 24 : 0;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < m; i++) {
            const float *r = x + i * ld + j;
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(r));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(r + o1));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(r + o2));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(r + o3));
        }
        __m256 acc[4] = { a0, a1, a2, a3 };
        for (int k = 0; k < nv; k++) dpar__bias_grad_put8(y + j + 8 * k, acc[k], beta);
    }
    return n8;
}
#endif

/* The fused SGD step in element type T on elements [lo, hi), from element i0 of the range on (the
   AVX2 form did those before): one body for f32 and f64 (>>f64 api), which reads each scalar
   widened exactly from float. */
#define DPAR__SGD_LOOP(T, i0)                                                          \
    do {                                                                               \
        const T lr = op->f[0], mu = op->f[1], wd = op->f[2], cs = op->f[3];            \
        T *y = (T *)op->dst->mem + lo, *v = op->dst2 ? (T *)op->dst2->mem + lo : NULL; \
        const T *x0 = (const T *)op->src0->mem + lo;                                   \
        for (int64_t i = (i0); i < hi - lo; i++) {                                     \
            T g = x0[i] * cs + wd * y[i];                                              \
            T u = g;                                                                   \
            if (v) {                                                                   \
                v[i] = mu * v[i] + g;                                                  \
                u = op->nesterov ? g + mu * v[i] : v[i];                               \
            }                                                                          \
            y[i] -= lr * u;                                                            \
        }                                                                              \
    } while (0)
static void dpar__sgd_range(const dpar__op *op, int64_t lo, int64_t hi) {
    int64_t i0 = 0;
    if (op->dst->dtype == DPAR_F64) {
        DPAR__SGD_LOOP(double, 0);
        return;
    }
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2"))
        i0 = dpar__sgd_avx2((float *)op->dst->mem + lo, op->dst2 ? (float *)op->dst2->mem + lo : NULL,
                            (const float *)op->src0->mem + lo, hi - lo, op->f[0], op->f[1], op->f[2], op->f[3],
                            op->nesterov);
#endif
    DPAR__SGD_LOOP(float, i0);
}
#undef DPAR__SGD_LOOP
/* the SGD step on blocks [lo, hi) of 64 elements (whole blocks keep the vector loop whole) */
static void dpar__sgd_blocks(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    dpar__sgd_range(op, lo * 64, hi * 64 < op->n ? hi * 64 : op->n);
}

/* >>cpu exp ===================================================================
   The f32 exp of the CPU kernels (softmax, cross-entropy, exp, sigmoid, SiLU,
   GELU): y = 2^k p(r) with k = rint(x log2 e) (the 1.5 * 2^23 trick, round to
   nearest even), r = x - k ln 2 in two fused steps (Cody-Waite: ln 2 split as
   0x3f317200 + 1.4286068e-6, the first exact in k * it), p the degree-7
   minimax polynomial of Cephes' expf (S. Moshier) in Horner form, and 2^k
   applied as 2^(k/2) 2^(k - k/2), both normal, so a subnormal result is
   rounded once. Every path (AVX-512, AVX2 + FMA, the scalar loop with dpar__fmaf)
   does the same fused operations in the same order: the same bits everywhere.
   Max error against exp in double: below 1 ulp (0.873 measured by
   tests/test_exp.c over every 64th float in [-104, 89]; subnormal results in
   units of their spacing, 2^-149). Exact: exp(+-0) = 1, exp(+inf) = +inf, exp(-inf) = +0, NaN ->
   NaN (quiet); x >= 88.72284 -> +inf, x <= -103.97208 -> +0. */
#define DPAR__EXP_LO     (-104.0f) /* inputs are clamped to [LO, HI]: exp(LO) rounds to +0, exp(HI) to +inf */
#define DPAR__EXP_HI     89.0f
#define DPAR__EXP_LOG2E  1.44269504088896341f
#define DPAR__EXP_SHIFT  12582912.0f /* 1.5 * 2^23: t = x log2e + it holds rint(x log2e) in its low bits */
#define DPAR__EXP_LN2_HI 0.693145751953125f
#define DPAR__EXP_LN2_LO 1.428606765330187045e-6f
#define DPAR__EXP_C7     1.9875691500e-4f
#define DPAR__EXP_C6     1.3981999507e-3f
#define DPAR__EXP_C5     8.3334519073e-3f
#define DPAR__EXP_C4     4.1665795894e-2f
#define DPAR__EXP_C3     1.6666665459e-1f
#define DPAR__EXP_C2     5.0000001201e-1f
/* a * b + c rounded once, in portable C (libm's fmaf is not correctly rounded on
   every platform: MinGW-w64's is not). The product is exact in double (24 + 24
   bits); the double sum is then rounded to odd (if inexact and even, moved one
   ulp toward the exact sum, found by TwoSum), and rounding a round-to-odd value
   with 29 bits to spare to float gives the correctly rounded result (Boldo and
   Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms
   using rounding to odd", IEEE Trans. Computers 57(4), 2008). */
static float dpar__fmaf(float a, float b, float c) {
    double p = (double)a * (double)b, s = p + (double)c, t = s - p;
    double err = (p - (s - t)) + ((double)c - t);
    if (err != 0.0 && isfinite(s)) {
        uint64_t u;
        memcpy(&u, &s, sizeof u);
        if (!(u & 1)) {
            u = (err > 0.0) == (s > 0.0) ? u + 1 : u - 1;
            memcpy(&s, &u, sizeof s);
        }
    }
    return (float)s;
}
static float dpar__exp_f32_1(float x) {
    if (x != x) return x + x;
    float xc = x < DPAR__EXP_LO ? DPAR__EXP_LO : x > DPAR__EXP_HI ? DPAR__EXP_HI : x;
    float k = dpar__fmaf(xc, DPAR__EXP_LOG2E, DPAR__EXP_SHIFT) - DPAR__EXP_SHIFT;
    float r = dpar__fmaf(k, -DPAR__EXP_LN2_HI, xc);
    r = dpar__fmaf(k, -DPAR__EXP_LN2_LO, r);
    float p = dpar__fmaf(DPAR__EXP_C7, r, DPAR__EXP_C6);
    p = dpar__fmaf(p, r, DPAR__EXP_C5);
    p = dpar__fmaf(p, r, DPAR__EXP_C4);
    p = dpar__fmaf(p, r, DPAR__EXP_C3);
    p = dpar__fmaf(p, r, DPAR__EXP_C2);
    p = dpar__fmaf(p, r, 1.0f);
    p = dpar__fmaf(p, r, 1.0f);
    int32_t n = (int32_t)k, n1 = n / 2, n2 = n - n1;
    uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}
#ifdef DPAR__X86_SIMD
/* The same operations on a vector of lanes, written once for both widths: P is the intrinsics'
   prefix (_mm512, _mm256), V and VI the float and int vector types, SI the cast's suffix (si512,
   si256), NANS(y, x) the width's way to make the NaN lanes of y x + x (quiet). */
#define DPAR__EXP_F32_VEC(name, tgt, P, V, VI, SI, NANS)                                               \
    __attribute__((target(tgt))) static inline V name(V x) {                                           \
        V xc = P##_min_ps(P##_max_ps(x, P##_set1_ps(DPAR__EXP_LO)), P##_set1_ps(DPAR__EXP_HI));        \
        V k = P##_sub_ps(P##_fmadd_ps(xc, P##_set1_ps(DPAR__EXP_LOG2E), P##_set1_ps(DPAR__EXP_SHIFT)), \
                         P##_set1_ps(DPAR__EXP_SHIFT));                                                \
        V r = P##_fmadd_ps(k, P##_set1_ps(-DPAR__EXP_LN2_HI), xc);                                     \
        r = P##_fmadd_ps(k, P##_set1_ps(-DPAR__EXP_LN2_LO), r);                                        \
        V p = P##_fmadd_ps(P##_set1_ps(DPAR__EXP_C7), r, P##_set1_ps(DPAR__EXP_C6));                   \
        p = P##_fmadd_ps(p, r, P##_set1_ps(DPAR__EXP_C5));                                             \
        p = P##_fmadd_ps(p, r, P##_set1_ps(DPAR__EXP_C4));                                             \
        p = P##_fmadd_ps(p, r, P##_set1_ps(DPAR__EXP_C3));                                             \
        p = P##_fmadd_ps(p, r, P##_set1_ps(DPAR__EXP_C2));                                             \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.0f));                                                     \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.0f));                                                     \
        VI n = P##_cvtps_epi32(k), bias = P##_set1_epi32(127);                                         \
        VI n1 = P##_srai_epi32(n, 1), n2 = P##_sub_epi32(n, n1);                                       \
        V s1 = P##_cast##SI##_ps(P##_slli_epi32(P##_add_epi32(n1, bias), 23));                         \
        V s2 = P##_cast##SI##_ps(P##_slli_epi32(P##_add_epi32(n2, bias), 23));                         \
        return NANS(P##_mul_ps(P##_mul_ps(p, s1), s2), x);                                             \
    }
#define DPAR__EXP_NANS_V16(y, x) _mm512_mask_add_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, x)
#define DPAR__EXP_NANS_V8(y, x)  _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
DPAR__EXP_F32_VEC(dpar__exp_f32_v16, "avx512f", _mm512, __m512, __m512i, si512, DPAR__EXP_NANS_V16)
DPAR__EXP_F32_VEC(dpar__exp_f32_v8, "avx2,fma", _mm256, __m256, __m256i, si256, DPAR__EXP_NANS_V8)
/* y[i] = exp(x[i]) for i < n, the tail by masked loads (y may be x) */
__attribute__((target("avx512f"))) static int64_t dpar__exp_f32_avx512(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, dpar__exp_f32_v16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, dpar__exp_f32_v16(_mm512_maskz_loadu_ps(m, x + i)));
    }
    return n;
}
/* y[i] = exp(x[i]) for the first multiple of 8 below n; returns it (y may be x) */
__attribute__((target("avx2,fma"))) static int64_t dpar__exp_f32_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, dpar__exp_f32_v8(_mm256_loadu_ps(x + i)));
    return i;
}
#endif
/* y[i] = exp(x[i]), i < n, f32 (y may be x): the widest path this CPU has, the same bits on each */
static void dpar__exp_f32(float *y, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx512f"))
        i = dpar__exp_f32_avx512(y, x, n);
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        i = dpar__exp_f32_avx2(y, x, n);
#endif
    for (; i < n; i++) y[i] = dpar__exp_f32_1(x[i]);
}
#ifdef DPAR__X86_SIMD
/* dpar__exp_shifted_f32 on 16 lanes, the subtraction in the register (the scalar loop that wrote the
   differences first was a third of attention's row work) */
__attribute__((target("avx512f"))) static void dpar__exp_shifted_avx512(float *e, const float *z, float mx, int64_t n) {
    const __m512 m = _mm512_set1_ps(mx);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(e + j, dpar__exp_f32_v16(_mm512_sub_ps(_mm512_loadu_ps(z + j), m)));
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
        _mm512_mask_storeu_ps(e + j, k, dpar__exp_f32_v16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, z + j), m)));
    }
}
#endif
/* e[j] = exp(z[j] - mx), j < n (the softmax, cross-entropy and attention rows; the difference rounded
   to f32; e may be z) */
static void dpar__exp_shifted_f32(float *e, const float *z, float mx, int64_t n) {
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx512f")) {
        dpar__exp_shifted_avx512(e, z, mx, n);
        return;
    }
#endif
    for (int64_t j = 0; j < n; j++) e[j] = z[j] - mx;
    dpar__exp_f32(e, e, n);
}

/* >>cpu elementwise ===========================================================
   CPU reference of the elementwise kinds (see >>elementwise ops): math in
   double, sums in order, one element after another. */
#define DPAR__GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
/* op(x) in double: the f64 kernels, and the f32 ones of the kinds not built on exp (those:
   dpar__cpu_unary_exp_range) */
static double dpar__unary_f(int u, double x, double s) {
    switch (u) {
    case DPAR_UNARY_NEG: return -x;
    case DPAR_UNARY_EXP: return exp(x);
    case DPAR_UNARY_LOG: return log(x);
    case DPAR_UNARY_SQRT: return sqrt(x);
    case DPAR_UNARY_RSQRT: return 1.0 / sqrt(x);
    case DPAR_UNARY_TANH: return tanh(x);
    case DPAR_UNARY_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case DPAR_UNARY_GELU_TANH: /* 0.5 (1 + tanh u) = sigmoid(2u): one exp, no cancellation as tanh u -> -1 */
        return x / (1.0 + exp(-2.0 * DPAR__GELU_K * (x + 0.044715 * x * x * x)));
    case DPAR_UNARY_GELU_ERF: return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
    case DPAR_UNARY_SILU: return x / (1.0 + exp(-x));
    case DPAR_UNARY_SQUARE: return x * x;
    case DPAR_UNARY_ADD_SCALAR: return x + s;
    case DPAR_UNARY_MUL_SCALAR: return x * s;
    case DPAR_UNARY_RSUB_SCALAR: return s - x;
    case DPAR_UNARY_DIV_SCALAR: return x / s;
    case DPAR_UNARY_RDIV_SCALAR: return s / x;
    case DPAR_UNARY_POW_SCALAR: return pow(x, s);
    default: return NAN;
    }
}
/* d op(x) / dx (the same use) */
static double dpar__unary_d(int u, double x, double s) {
    switch (u) {
    case DPAR_UNARY_NEG: return -1.0;
    case DPAR_UNARY_EXP: return exp(x);
    case DPAR_UNARY_LOG: return 1.0 / x;
    case DPAR_UNARY_SQRT: return 0.5 / sqrt(x);
    case DPAR_UNARY_RSQRT: return -0.5 / (x * sqrt(x));
    case DPAR_UNARY_TANH: {
        double t = tanh(x);
        return 1.0 - t * t;
    }
    case DPAR_UNARY_SIGMOID: {
        double g = 1.0 / (1.0 + exp(-x));
        return g * (1.0 - g);
    }
    case DPAR_UNARY_GELU_TANH: { /* with g = sigmoid(2u) = 0.5 (1 + tanh u): 1 - tanh^2 u = 4 g (1 - g) */
        double g = 1.0 / (1.0 + exp(-2.0 * DPAR__GELU_K * (x + 0.044715 * x * x * x)));
        return g + 2.0 * x * g * (1.0 - g) * DPAR__GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case DPAR_UNARY_GELU_ERF:
        return 0.5 * (1.0 + erf(x * 0.7071067811865476)) + x * exp(-0.5 * x * x) * 0.3989422804014327;
    case DPAR_UNARY_SILU: {
        double g = 1.0 / (1.0 + exp(-x));
        return g * (1.0 + x * (1.0 - g));
    }
    case DPAR_UNARY_SQUARE: return 2.0 * x;
    case DPAR_UNARY_ADD_SCALAR: return 1.0;
    case DPAR_UNARY_MUL_SCALAR: return s;
    case DPAR_UNARY_RSUB_SCALAR: return -1.0;
    case DPAR_UNARY_DIV_SCALAR: return 1.0 / s;
    case DPAR_UNARY_RDIV_SCALAR: return -s / (x * x);
    case DPAR_UNARY_POW_SCALAR: return s == 0.0 ? 0.0 : s * pow(x, s - 1.0);
    default: return NAN;
    }
}
enum { DPAR__EXP_BLOCK = 256 }; /* elements per dpar__exp_f32 call of the kernels below (1 KiB on the stack) */
/* the kinds built on one exp per element (exp, sigmoid, SiLU, GELU as sigmoid(2u)) */
static int dpar__unary_is_exp(int u) {
    return u == DPAR_UNARY_EXP || u == DPAR_UNARY_SIGMOID || u == DPAR_UNARY_SILU || u == DPAR_UNARY_GELU_TANH;
}
#ifdef DPAR__X86_SIMD
/* dpar__cpu_unary_exp_range's steps in double on 8 lanes: the scalar loops' multiplies, adds and
   divides in the same order, each rounded once (no fused multiply-add), so the same bits; each
   returns how many leading elements it did (a multiple of 8), the scalar loop does the rest.
   t = the exp's argument: -2u for GELU, -x for sigmoid and SiLU (exp: none, returns 0) */
__attribute__((target("avx512f"))) static int dpar__exp_arg_avx512(int u, float *t, const float *x, int n) {
    const __m512d k3 = _mm512_set1_pd(0.044715), km = _mm512_set1_pd(-2.0 * DPAR__GELU_K);
    int i = 0;
    if (u == DPAR_UNARY_GELU_TANH)
        for (; i + 8 <= n; i += 8) {
            __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
            __m512d c = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(k3, v), v), v);
            _mm256_storeu_ps(t + i, _mm512_cvtpd_ps(_mm512_mul_pd(km, _mm512_add_pd(v, c))));
        }
    else if (u != DPAR_UNARY_EXP)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(t + i, _mm256_xor_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + i)));
    return i;
}
/* forward, from t = exp(arg): g = 1 / (1 + t); y = g (sigmoid) or x g (SiLU, GELU) */
__attribute__((target("avx512f"))) static int dpar__exp_fwd_avx512(int u, float *y, const float *x, const float *t,
                                                                   int n) {
    const __m512d one = _mm512_set1_pd(1.0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d g = _mm512_div_pd(one, _mm512_add_pd(one, _mm512_cvtps_pd(_mm256_loadu_ps(t + i))));
        if (u != DPAR_UNARY_SIGMOID) g = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i)), g);
        _mm256_storeu_ps(y + i, _mm512_cvtpd_ps(g));
    }
    return i;
}
/* backward, from t: y = dy f'(x), f' as dpar__cpu_unary_exp_range's scalar loop has it */
__attribute__((target("avx512f"))) static int dpar__exp_bwd_avx512(int u, float *y, const float *x, const float *dy,
                                                                   const float *t, int n) {
    const __m512d one = _mm512_set1_pd(1.0), two = _mm512_set1_pd(2.0), k = _mm512_set1_pd(DPAR__GELU_K),
                  k3 = _mm512_set1_pd(3.0 * 0.044715);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d tv = _mm512_cvtps_pd(_mm256_loadu_ps(t + i)), v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), f;
        __m512d g = _mm512_div_pd(one, _mm512_add_pd(one, tv)), h = _mm512_sub_pd(one, g);
        if (u == DPAR_UNARY_EXP)
            f = tv;
        else if (u == DPAR_UNARY_SIGMOID)
            f = _mm512_mul_pd(g, h);
        else if (u == DPAR_UNARY_SILU)
            f = _mm512_mul_pd(g, _mm512_add_pd(one, _mm512_mul_pd(v, h)));
        else {
            __m512d a = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(two, v), g), h), k);
            f = _mm512_add_pd(g, _mm512_mul_pd(a, _mm512_add_pd(one, _mm512_mul_pd(_mm512_mul_pd(k3, v), v))));
        }
        _mm256_storeu_ps(y + i, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(dy + i)), f)));
    }
    return i;
}
#endif
/* y = f(x) (kind UNARY) or dy f'(x) for the exp-based kinds, DPAR__EXP_BLOCK elements at a time:
   t = the exp's argument (x, -x, or -2u for GELU) rounded to f32, t = dpar__exp_f32(t), then the
   rest of the formula (as dpar__unary_f / dpar__unary_d would have it) in double on t */
static void dpar__cpu_unary_exp_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    int u = (int)op->p[0], bwd = op->kind != DPAR__OP_UNARY;
    float *y = (float *)op->dst->mem, t[DPAR__EXP_BLOCK];
    const float *x = (const float *)op->src0->mem, *dy = op->src1 ? (const float *)op->src1->mem : NULL;
    if (u == DPAR_UNARY_EXP && !bwd) {
        dpar__exp_f32(y + lo, x + lo, hi - lo);
        return;
    }
    for (int64_t b = lo; b < hi; b += DPAR__EXP_BLOCK) {
        int n = hi - b < DPAR__EXP_BLOCK ? (int)(hi - b) : (int)DPAR__EXP_BLOCK;
        const float *xb = x + b;
        float *yb = y + b;
        int i0 = 0, i1 = 0;
#ifdef DPAR__X86_SIMD
        int wide = __builtin_cpu_supports("avx512f");
        if (wide) i0 = dpar__exp_arg_avx512(u, t, xb, n);
#endif
        if (u == DPAR_UNARY_EXP)
            memcpy(t, xb, (size_t)n * sizeof(float));
        else if (u == DPAR_UNARY_GELU_TANH)
            for (int i = i0; i < n; i++) {
                double v = (double)xb[i];
                t[i] = (float)(-2.0 * DPAR__GELU_K * (v + 0.044715 * v * v * v));
            }
        else
            for (int i = i0; i < n; i++) t[i] = -xb[i];
        dpar__exp_f32(t, t, n);
#ifdef DPAR__X86_SIMD
        if (wide) i1 = bwd ? dpar__exp_bwd_avx512(u, yb, xb, dy + b, t, n) : dpar__exp_fwd_avx512(u, yb, xb, t, n);
#endif
        if (u == DPAR_UNARY_EXP) /* backward */
            for (int i = i1; i < n; i++) yb[i] = (float)((double)dy[b + i] * (double)t[i]);
        else if (!bwd) /* sigmoid: g; SiLU and GELU: x g */
            for (int i = i1; i < n; i++) {
                double g = 1.0 / (1.0 + (double)t[i]);
                yb[i] = (float)(u == DPAR_UNARY_SIGMOID ? g : (double)xb[i] * g);
            }
        else
            for (int i = i1; i < n; i++) {
                double v = (double)xb[i], g = 1.0 / (1.0 + (double)t[i]), f;
                if (u == DPAR_UNARY_SIGMOID)
                    f = g * (1.0 - g);
                else if (u == DPAR_UNARY_SILU)
                    f = g * (1.0 + v * (1.0 - g));
                else /* GELU_TANH, with g = sigmoid(2u) = 0.5 (1 + tanh u): 1 - tanh^2 u = 4 g (1 - g) */
                    f = g + 2.0 * v * g * (1.0 - g) * DPAR__GELU_K * (1.0 + 3.0 * 0.044715 * v * v);
                yb[i] = (float)((double)dy[b + i] * f);
            }
    }
}
static void dpar__cpu_unary_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    int u = (int)op->p[0];
    if (dpar__unary_is_exp(u)) {
        dpar__cpu_unary_exp_range(op, lo, hi);
        return;
    }
    double s = (double)op->f[0];
    float *y = (float *)op->dst->mem;
    const float *x = (const float *)op->src0->mem, *dy = op->src1 ? (const float *)op->src1->mem : NULL;
    if (op->kind == DPAR__OP_UNARY)
        for (int64_t i = lo; i < hi; i++) y[i] = (float)dpar__unary_f(u, (double)x[i], s);
    else
        for (int64_t i = lo; i < hi; i++) y[i] = (float)((double)dy[i] * dpar__unary_d(u, (double)x[i], s));
}
static dpar_status dpar__cpu_op_unary(dpar__cpu *c, int dev, const dpar__op *op, float *y, const float *x0,
                                      const float *x1) {
    DPAR__UNUSED(y);
    DPAR__UNUSED(x0);
    DPAR__UNUSED(x1);
    dpar__cpu_parallel(c, dev, op->n, 16, dpar__cpu_unary_range, op);
    return DPAR_OK;
}
/* y[p14 + i] = a[p12 + i.sa] op b[p13 + i.sb] over the 4-d shape p[0..3] */
static dpar_status dpar__cpu_op_binary(dpar__cpu *c, int dev, const dpar__op *op, float *y, const float *x0,
                                       const float *x1) {
    DPAR__UNUSED(c);
    DPAR__UNUSED(dev);
    const int64_t *p = op->p;
    int bop = (int)p[15];
    float *o = y + p[14];
    for (int64_t i0 = 0; i0 < p[0]; i0++)
        for (int64_t i1 = 0; i1 < p[1]; i1++)
            for (int64_t i2 = 0; i2 < p[2]; i2++) {
                const float *a = x0 + p[12] + i0 * p[4] + i1 * p[5] + i2 * p[6];
                const float *b = x1 + p[13] + i0 * p[8] + i1 * p[9] + i2 * p[10];
                for (int64_t i3 = 0; i3 < p[3]; i3++, o++) {
                    float va = a[i3 * p[7]], vb = b[i3 * p[11]];
                    *o = bop == DPAR_BINARY_ADD   ? va + vb
                         : bop == DPAR_BINARY_SUB ? va - vb
                         : bop == DPAR_BINARY_MUL ? va * vb
                                                  : va / vb;
                }
            }
    return DPAR_OK;
}
/* one element of a REDUCE pass: folds dy (and a, b) into (acc, best) */
static void dpar__red_step(int red, double *acc, int64_t *best, int64_t r, double v, double a, double b) {
    switch (red) {
    case DPAR_REDUCE_SUM:
    case DPAR_REDUCE_MEAN: *acc += v; break;
    case DPAR_REDUCE_MAX:
    case DPAR_REDUCE_ARGMAX:
    case DPAR__RED_MAX_BWD:
        if (*best < 0 || v > *acc || (v != v && *acc == *acc)) {
            *acc = v;
            *best = r;
        }
        break;
    case DPAR__RED_NEG: *acc -= v; break;
    case DPAR__RED_MUL_B: *acc += v * b; break;
    case DPAR__RED_MUL_A: *acc += v * a; break;
    case DPAR__RED_DIV_B: *acc += v / b; break;
    default: *acc += -v * a / (b * b); break; /* DPAR__RED_DIV_B2 */
    }
}
#ifdef DPAR__X86_SIMD
/* y[0..8) = the sums (mean: / R) of 8 neighbouring outputs along a kept last dim, x at their first
   element, the reduced dims' extents e and strides xs: dpar__cpu_reduce_range's walk and double sums on
   8 lanes, each lane's adds in the same order, so the same bits (the position embedding's gradient, a
   sum over the batch walked per element, was 0.9% of the GPT's 1x1 step) */
__attribute__((target("avx512f"))) static void dpar__red_sum8_avx512(float *y, const float *x, const int64_t *e,
                                                                     const int64_t *xs, int64_t R, int mean) {
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i0 = 0; i0 < e[0]; i0++)
        for (int64_t i1 = 0; i1 < e[1]; i1++)
            for (int64_t i2 = 0; i2 < e[2]; i2++) {
                const float *r = x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2];
                acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(r)));
            }
    if (mean) acc = _mm512_div_pd(acc, _mm512_set1_pd((double)R));
    _mm256_storeu_ps(y, _mm512_cvtpd_ps(acc));
}
#endif
/* y[o] = reduction over the dims in mask p[13] of dense x (shape p[0..3]); o runs over the kept dims.
   Each output walks its slice with nested loops (extent 1 along kept dims); DPAR__RED_MAX_BWD walks it
   twice: find the first maximum, then write dx. A sum or mean over leading dims takes 8 outputs of the
   last at a time where the CPU has AVX-512 (dpar__red_sum8_avx512). */
static void dpar__cpu_reduce_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    const int64_t *p = op->p;
    float *y = (float *)op->dst->mem;
    const float *x0 = (const float *)op->src0->mem, *x1 = op->src1 ? (const float *)op->src1->mem : NULL;
    const float *a = x1, *b = op->src2 ? (const float *)op->src2->mem : NULL;
    int red = (int)p[12];
    int64_t xs[4], e[4], R = 1;
    dpar__dense_strides(4, p, xs);
    for (int d = 0; d < 4; d++) {
        e[d] = p[13] >> d & 1 ? p[d] : 1;
        R *= e[d];
    }
    /* o's coordinates along the kept dims (0 along reduced ones): divided out once for lo, then carried */
    int64_t cd[4] = { 0, 0, 0, 0 }, rem = lo;
    for (int d = 3; d >= 0; d--)
        if (!(p[13] >> d & 1)) {
            cd[d] = rem % p[d];
            rem /= p[d];
        }
    int sum8 = 0;
#ifdef DPAR__X86_SIMD
    sum8 = (red == DPAR_REDUCE_SUM || red == DPAR_REDUCE_MEAN) && R > 1 && !(p[13] & 8) &&
           __builtin_cpu_supports("avx512f");
#endif
    for (int64_t o = lo, nv = 1; o < hi; o += nv) {
        int64_t x_0 = 0, a_0 = 0, b_0 = 0, best = -1;
        for (int d = 0; d < 4; d++) {
            x_0 += cd[d] * xs[d];
            a_0 += cd[d] * p[4 + d];
            b_0 += cd[d] * p[8 + d];
        }
        nv = sum8 && cd[3] + 8 <= p[3] && o + 8 <= hi ? 8 : 1;
        for (int64_t v = 0; v < nv; v++)
            for (int d = 3; d >= 0; d--) /* the next output's: last kept dim fastest */
                if (!(p[13] >> d & 1)) {
                    if (++cd[d] < p[d]) break;
                    cd[d] = 0;
                }
#ifdef DPAR__X86_SIMD
        if (nv == 8) {
            dpar__red_sum8_avx512(y + o, x0 + x_0, e, xs, R, red == DPAR_REDUCE_MEAN);
            continue;
        }
#endif
        double acc = 0.0;
        if (R == 1 && red != DPAR__RED_MAX_BWD) /* one element (binary_backward without broadcast): no walk */
            dpar__red_step(red, &acc, &best, 0, (double)x0[x_0], a ? (double)a[a_0] : 0.0, b ? (double)b[b_0] : 0.0);
        for (int pass = 0; pass < (red == DPAR__RED_MAX_BWD ? 2 : R > 1); pass++) {
            int64_t r = 0;
            for (int64_t i0 = 0; i0 < e[0]; i0++)
                for (int64_t i1 = 0; i1 < e[1]; i1++)
                    for (int64_t i2 = 0; i2 < e[2]; i2++)
                        for (int64_t i3 = 0; i3 < e[3]; i3++, r++) {
                            int64_t xo = x_0 + i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3;
                            if (pass) {
                                y[xo] = r == best ? x1[o] : 0.0f;
                                continue;
                            }
                            int64_t ao = a_0 + i0 * p[4] + i1 * p[5] + i2 * p[6] + i3 * p[7];
                            int64_t bo = b_0 + i0 * p[8] + i1 * p[9] + i2 * p[10] + i3 * p[11];
                            dpar__red_step(red, &acc, &best, r, (double)x0[xo], a ? (double)a[ao] : 0.0,
                                           b ? (double)b[bo] : 0.0);
                        }
        }
        if (red == DPAR_REDUCE_ARGMAX)
            ((int32_t *)y)[o] = (int32_t)best;
        else if (red != DPAR__RED_MAX_BWD)
            y[o] = (float)(red == DPAR_REDUCE_MEAN ? acc / (double)R : acc);
    }
}
/* y[o] = 0 + x[o] on [lo, hi): a sum over nothing but the element itself (binary_backward of an add
   without broadcast; the walk per element was 1% of the GPT's step), as dpar__cpu_reduce_range's
   0.0 + (double)x rounded back: -0 gives +0, a NaN stays NaN */
static void dpar__reduce_one_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    float *y = (float *)op->dst->mem;
    const float *x = (const float *)op->src0->mem;
    for (int64_t o = lo; o < hi; o++) y[o] = 0.0f + x[o];
}
static dpar_status dpar__cpu_op_reduce(dpar__cpu *c, int dev, const dpar__op *op, float *y, const float *x0,
                                       const float *x1) {
    DPAR__UNUSED(y);
    DPAR__UNUSED(x0);
    DPAR__UNUSED(x1);
    int64_t R = 1;
    for (int d = 0; d < 4; d++) R *= op->p[13] >> d & 1 ? op->p[d] : 1;
    int red = (int)op->p[12];
    if (R == 1 && (red == DPAR_REDUCE_SUM || red == DPAR_REDUCE_MEAN))
        dpar__cpu_parallel(c, dev, op->n, 1, dpar__reduce_one_range, op);
    else
        dpar__cpu_parallel(c, dev, op->n, R + 1, dpar__cpu_reduce_range, op);
    return DPAR_OK;
}
/* y[i] = cond[i.sc] ? a[i.sa] : b[i.sb] over the 4-d shape p[0..3] (a / b NULL: f[0] / f[1]) */
static dpar_status dpar__cpu_op_where(dpar__cpu *c, int dev, const dpar__op *op, float *y, const float *x0,
                                      const float *x1) {
    DPAR__UNUSED(c);
    DPAR__UNUSED(dev);
    DPAR__UNUSED(y);
    DPAR__UNUSED(x0);
    DPAR__UNUSED(x1);
    const int64_t *p = op->p;
    /* one body for f32 and f64 (y, a, b and a float cond all T) */
#define DPAR__WHERE(T)                                                                                      \
    do {                                                                                                    \
        const T *c0 = (const T *)op->src0->mem, *a = op->src1 ? (const T *)op->src1->mem : NULL,            \
                *b = op->src2 ? (const T *)op->src2->mem : NULL;                                            \
        T *yy = (T *)op->dst->mem;                                                                          \
        int64_t i = 0;                                                                                      \
        for (int64_t i0 = 0; i0 < p[0]; i0++)                                                               \
            for (int64_t i1 = 0; i1 < p[1]; i1++)                                                           \
                for (int64_t i2 = 0; i2 < p[2]; i2++)                                                       \
                    for (int64_t i3 = 0; i3 < p[3]; i3++, i++) {                                            \
                        int64_t co = i0 * p[4] + i1 * p[5] + i2 * p[6] + i3 * p[7];                         \
                        int t = op->k ? ((const int32_t *)op->src0->mem)[co] != 0 : c0[co] != (T)0;         \
                        if (t)                                                                              \
                            yy[i] = a ? a[i0 * p[8] + i1 * p[9] + i2 * p[10] + i3 * p[11]] : (T)op->f[0];   \
                        else                                                                                \
                            yy[i] = b ? b[i0 * p[12] + i1 * p[13] + i2 * p[14] + i3 * p[15]] : (T)op->f[1]; \
                    }                                                                                       \
    } while (0)
    if (op->dst->dtype == DPAR_F64)
        DPAR__WHERE(double);
    else
        DPAR__WHERE(float);
#undef DPAR__WHERE
    return DPAR_OK;
}
/* rows of n: softmax / log_softmax (p[0]) and their backward (kind SOFTMAX_BWD: x0 = dy, x1 = y) */
static void dpar__cpu_softmax_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    int64_t n = op->n;
    int lg = op->p[0] != 0;
    float *y = (float *)op->dst->mem;
    const float *x0 = (const float *)op->src0->mem, *x1 = op->src1 ? (const float *)op->src1->mem : NULL;
    float e[DPAR__EXP_BLOCK]; /* exp values (dpar__exp_f32), a block of a row at a time */
    for (int64_t r = lo; r < hi; r++) {
        const float *x = x0 + r * n, *yy = x1 ? x1 + r * n : NULL;
        float *o = y + r * n;
        double acc = 0.0;
        if (op->kind == DPAR__OP_SOFTMAX_BWD) {
            for (int64_t j = 0; j < n; j++) acc += lg ? (double)x[j] : (double)x[j] * (double)yy[j];
            if (!lg) {
                for (int64_t j = 0; j < n; j++) o[j] = (float)((double)yy[j] * ((double)x[j] - acc));
                continue;
            }
            for (int64_t b = 0; b < n; b += DPAR__EXP_BLOCK) {
                int64_t nb = n - b < DPAR__EXP_BLOCK ? n - b : (int64_t)DPAR__EXP_BLOCK;
                dpar__exp_f32(e, yy + b, nb);
                for (int64_t j = 0; j < nb; j++) o[b + j] = (float)((double)x[b + j] - (double)e[j] * acc);
            }
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) mx = (x[j] > mx || x[j] != x[j]) ? x[j] : mx;
        for (int64_t b = 0; b < n; b += DPAR__EXP_BLOCK) {
            int64_t nb = n - b < DPAR__EXP_BLOCK ? n - b : (int64_t)DPAR__EXP_BLOCK;
            dpar__exp_shifted_f32(e, x + b, mx, nb);
            for (int64_t j = 0; j < nb; j++) acc += (double)e[j];
        }
        if (lg) {
            double lse = log(acc);
            for (int64_t j = 0; j < n; j++) o[j] = (float)((double)x[j] - (double)mx - lse);
            continue;
        }
        for (int64_t b = 0; b < n; b += DPAR__EXP_BLOCK) { /* the exps again: cheaper than a row-sized buffer */
            int64_t nb = n - b < DPAR__EXP_BLOCK ? n - b : (int64_t)DPAR__EXP_BLOCK;
            dpar__exp_shifted_f32(e, x + b, mx, nb);
            for (int64_t j = 0; j < nb; j++) o[b + j] = (float)((double)e[j] / acc);
        }
    }
}
static dpar_status dpar__cpu_op_softmax(dpar__cpu *c, int dev, const dpar__op *op, float *y, const float *x0,
                                        const float *x1) {
    DPAR__UNUSED(y);
    DPAR__UNUSED(x0);
    DPAR__UNUSED(x1);
    dpar__cpu_parallel(c, dev, op->m, 32 * op->n, dpar__cpu_softmax_range, op);
    return DPAR_OK;
}
/* dst[p13 + i.ds] = src[p12 + i.ss] over the 4-d shape p[0..3], 4-byte elements */
static dpar_status dpar__cpu_op_strided(dpar__cpu *c, int dev, const dpar__op *op, float *y, const float *x0,
                                        const float *x1) {
    DPAR__UNUSED(c);
    DPAR__UNUSED(dev);
    DPAR__UNUSED(x1);
    const int64_t *p = op->p;
    const uint32_t *s = (const uint32_t *)(const void *)x0 + p[12];
    uint32_t *d = (uint32_t *)(void *)y + p[13];
    for (int64_t i0 = 0; i0 < p[0]; i0++)
        for (int64_t i1 = 0; i1 < p[1]; i1++)
            for (int64_t i2 = 0; i2 < p[2]; i2++) {
                const uint32_t *si = s + i0 * p[4] + i1 * p[5] + i2 * p[6];
                uint32_t *di = d + i0 * p[8] + i1 * p[9] + i2 * p[10];
                if (p[7] == 1 && p[11] == 1) /* contiguous rows (slices, concat, gradient buckets) */
                    memcpy(di, si, (size_t)p[3] * sizeof *di);
                else
                    for (int64_t i3 = 0; i3 < p[3]; i3++) di[i3 * p[11]] = si[i3 * p[7]];
            }
    return DPAR_OK;
}

/* >>cpu conv-pool =============================================================
   conv2d as blocked im2col + the GEMM: the im2col matrix [N*OH*OW, KH*KW*C]
   (row = output pixel, columns in HWI order, so the HWIO kernel is already
   its [K, O] right-hand side) is built a block of rows at a time: f64
   DPAR__CONV_ROWS(K) rows (dpar__cpu64_conv2d), f32 a cache-sized block that
   the GEMM reads at once (dpar__cpu_conv2d), in the sums' order of the f64
   blocks. A 1x1 stride-1 unpadded conv reads x in place. Pools: direct loops,
   window positions in row-major order (the order every backend sums in). */
#define DPAR__CONV_SCRATCH ((int64_t)1 << 19) /* floats: 2 MiB */
static int64_t dpar__conv_rows(int64_t K, int64_t M) {
    int64_t r = K ? DPAR__CONV_SCRATCH / K / DPAR__MR * DPAR__MR : M;
    if (r < DPAR__MR) r = DPAR__MR;
    return r < M ? r : M;
}
static int dpar__conv_direct(const dpar__win2d *g) { /* x is its own im2col matrix */
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->pt == 0 && g->pl == 0 && g->oh == g->h &&
           g->ow == g->w;
}
typedef enum { DPAR__CONV_FWD, DPAR__CONV_BWD_INPUT, DPAR__CONV_BWD_KERNEL } dpar__conv_pass;
static void dpar__cpu64_gemm(dpar__cpu *c, int dev, int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha,
                             const double *A, const double *B, float beta, double *C);
/* y[0:n] += x[0:n], col2im's add. f32: runs of 16 and more on AVX2 vectors first where there are
   (gcc's -O2 left the loop scalar, a quarter of conv2's input gradient); f64: the loop. */
static void dpar__add_f32(float *y, const float *x, int64_t n) {
    int64_t j = 0;
#ifdef DPAR__X86_SIMD
    if (n >= 16 && __builtin_cpu_supports("avx2")) j = dpar__bias_add_avx2(y, x, 1, n);
#endif
    for (; j < n; j++) y[j] += x[j];
}
static void dpar__add_f64(double *y, const double *x, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] += x[j];
}
/* IM2COL: columns [k0, k1) of rows [r0, r0 + rows) of im2col(x) into col (row stride k1 - k0; add = 0),
   or col added back into x (add = 1: col2im). CONV: one pass of conv2d over the im2col blocks; x is the
   input side (x or dx), k the kernel side (w or dw), y the output side (y or dy). IM2COL serves f32 and
   f64 (VADD: dpar__add_f32 / _f64); CONV is f64's (dpar__cpu64_gemm, the blocked f64 GEMM of
   dpar_matmul; its scratch is 4 MiB). */
#define DPAR__IM2COL_DEF(IM2COL, T, VADD)                                                                    \
    static void IM2COL(const dpar__win2d *g, T *x, int64_t r0, int64_t rows, int64_t k0, int64_t k1, T *col, \
                       int add) {                                                                            \
        int64_t C = g->c, ohw = g->oh * g->ow, n = r0 / ohw, i = r0 % ohw / g->ow, j = r0 % g->ow;           \
        for (int64_t r = 0; r < rows; r++, col += k1 - k0) {                                                 \
            int64_t iw0 = j * g->sw - g->pl, span = g->kw * C;                                               \
            if (!add && k0 == 0 && k1 == span * g->kh && g->dw == 1 && iw0 >= 0 && iw0 + g->kw <= g->w) {    \
                /* the window inside across: a span of x per kernel row (conv1's rows are 3 floats) */       \
                for (int64_t p = 0; p < g->kh; p++) {                                                        \
                    int64_t ih = i * g->sh - g->pt + p * g->dh;                                              \
                    const T *xp = x + ((n * g->h + ih) * g->w + iw0) * C;                                    \
                    if (ih < 0 || ih >= g->h)                                                                \
                        memset(col + p * span, 0, (size_t)span * sizeof(T));                                 \
                    else if (span >= 16)                                                                     \
                        memcpy(col + p * span, xp, (size_t)span * sizeof(T));                                \
                    else                                                                                     \
                        for (int64_t q = 0; q < span; q++) col[p * span + q] = xp[q];                        \
                }                                                                                            \
                if (++j == g->ow && (j = 0, ++i == g->oh)) i = 0, n++;                                       \
                continue;                                                                                    \
            }                                                                                                \
            for (int64_t p = 0; p < g->kh; p++) {                                                            \
                int64_t ih = i * g->sh - g->pt + p * g->dh, kp = p * g->kw * C;                              \
                int64_t run = g->dw == 1 && iw0 >= 0 && iw0 + g->kw <= g->w ? g->kw * C : C;                 \
                if (kp >= k1 || kp + g->kw * C <= k0) continue; /* the kernel row is outside the columns */  \
                for (int64_t t = 0; t < g->kw; t += run / C) {                                               \
                    /* run: the kernel row's pixels as one span of x when they are adjacent and inside */    \
                    int64_t iw = iw0 + t * g->dw, a = kp + t * C, e = a + run;                               \
                    int64_t a1 = a > k0 ? a : k0, e1 = e < k1 ? e : k1, len = e1 - a1;                       \
                    int in = ih >= 0 && ih < g->h && iw >= 0 && iw < g->w;                                   \
                    T *cr = col + a1 - k0, *xp = in ? x + ((n * g->h + ih) * g->w + iw) * C + a1 - a : NULL; \
                    if (len <= 0) continue;                                                                  \
                    if (add && in)                                                                           \
                        VADD(xp, cr, len);                                                                   \
                    else if (!add && in && len >= 16)                                                        \
                        memcpy(cr, xp, (size_t)len * sizeof(T));                                             \
                    else if (!add && in) /* short runs (conv1's 3 floats): no call */                        \
                        for (int64_t q = 0; q < len; q++) cr[q] = xp[q];                                     \
                    else if (!add)                                                                           \
                        memset(cr, 0, (size_t)len * sizeof(T)); /* +0 */                                     \
                }                                                                                            \
            }                                                                                                \
            if (++j == g->ow && (j = 0, ++i == g->oh)) i = 0, n++; /* the next output pixel */               \
        }                                                                                                    \
    }
DPAR__IM2COL_DEF(dpar__im2col, float, dpar__add_f32)
DPAR__IM2COL_DEF(dpar__im2col64, double, dpar__add_f64)
#undef DPAR__IM2COL_DEF
#define DPAR__CONV_DEF(IM2COL, CONV, T, GEMM)                                                                      \
    typedef struct IM2COL##_job {                                                                                  \
        const dpar__win2d *g;                                                                                      \
        T *x, *col, *y; /* y: the forward's output rows, set to b (or 0) with their im2col rows */                 \
        const T *b;                                                                                                \
        int64_t r0, rows; /* the block: im2col rows [r0, r0 + rows) */                                             \
    } IM2COL##_job;                                                                                                \
    static void IM2COL##_rows(const void *arg, int64_t lo, int64_t hi) { /* rows are independent */                \
        const IM2COL##_job *j = (const IM2COL##_job *)arg;                                                         \
        int64_t O = j->g->o;                                                                                       \
        int64_t K = j->g->kh * j->g->kw * j->g->c;                                                                 \
        if (j->col) IM2COL(j->g, j->x, j->r0 + lo, hi - lo, 0, K, j->col + lo * K, 0);                             \
        if (j->y)                                                                                                  \
            for (int64_t r = j->r0 + lo; r < j->r0 + hi; r++)                                                      \
                for (int64_t o = 0; o < O; o++) j->y[r * O + o] = j->b ? j->b[o] : (T)0;                           \
    }                                                                                                              \
    /* col2im of the block's rows that fall in images [lo, hi) of it: images write disjoint parts of x,     \
       and each image's rows are added in the order of the one-thread loop */      \
    static void IM2COL##_add_images(const void *arg, int64_t lo, int64_t hi) {                                     \
        const IM2COL##_job *j = (const IM2COL##_job *)arg;                                                         \
        int64_t ohw = j->g->oh * j->g->ow, n0 = j->r0 / ohw, a = (n0 + lo) * ohw, e = (n0 + hi) * ohw;             \
        if (a < j->r0) a = j->r0;                                                                                  \
        if (e > j->r0 + j->rows) e = j->r0 + j->rows;                                                              \
        int64_t K = j->g->kh * j->g->kw * j->g->c;                                                                 \
        IM2COL(j->g, j->x, a, e - a, 0, K, j->col + (a - j->r0) * K, 1);                                           \
    }                                                                                                              \
    static dpar_status CONV(dpar__cpu *c, int dev, const dpar__op *op, dpar__conv_pass pass, T *x, T *k, T *y) {   \
        dpar__win2d g = dpar__win2d_get(op);                                                                       \
        int64_t K = g.kh * g.kw * g.c, M = g.n * g.oh * g.ow, O = g.o, R = dpar__conv_rows(K, M);                  \
        if (pass == DPAR__CONV_FWD && (K == 0 || O == 0)) { /* y = b (or 0), then y += im2col(x) w */              \
            const T *b = op->src2 ? (const T *)op->src2->mem : NULL;                                               \
            for (int64_t r = 0; r < M; r++)                                                                        \
                for (int64_t o = 0; o < O; o++) y[r * O + o] = b ? b[o] : (T)0;                                    \
        } else if (pass == DPAR__CONV_BWD_INPUT) {                                                                 \
            memset(x, 0, (size_t)(g.n * g.h * g.w * g.c) * sizeof(T));                                             \
        } else if (M == 0) {                                                                                       \
            memset(k, 0, (size_t)(K * O) * sizeof(T));                                                             \
        }                                                                                                          \
        if (M == 0 || O == 0 || K == 0) return DPAR_OK;                                                            \
        int direct = dpar__conv_direct(&g);                                                                        \
        T *col = direct ? NULL : (T *)DPAR_ALIGNED_MALLOC((size_t)(R * K) * sizeof(T), 64);                        \
        if (!direct && !col)                                                                                       \
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", dpar__op_name(op->kind));           \
        for (int64_t r0 = 0; r0 < M; r0 += R) {                                                                    \
            int64_t rows = M - r0 < R ? M - r0 : R;                                                                \
            T *cb = direct ? x + r0 * K : col, *yb = y + r0 * O;                                                   \
            int fwd = pass == DPAR__CONV_FWD;                                                                      \
            IM2COL##_job job = { &g,                                                                               \
                                 x,                                                                                \
                                 direct ? NULL : col,                                                              \
                                 fwd ? y : NULL,                                                                   \
                                 fwd && op->src2 ? (const T *)op->src2->mem : NULL,                                \
                                 r0,                                                                               \
                                 rows };                                                                           \
            if (job.y || (job.col && pass != DPAR__CONV_BWD_INPUT))                                                \
                dpar__cpu_parallel(c, dev, rows, K + (fwd ? O : 0), IM2COL##_rows, &job);                          \
            if (pass == DPAR__CONV_FWD) {                                                                          \
                GEMM(c, dev, rows, O, K, 0, 0, 1.0f, cb, k, 1.0f, yb); /* [rows,K] [K,O] */                        \
            } else if (pass == DPAR__CONV_BWD_KERNEL) {                                                            \
                GEMM(c, dev, K, O, rows, 1, 0, 1.0f, cb, yb, r0 ? 1.0f : 0.0f, k); /* [K,rows] [rows,O] */         \
            } else {                                                                                               \
                GEMM(c, dev, rows, K, O, 0, 1, 1.0f, yb, k, 0.0f, cb);                    /* [rows,O] [O,K] */     \
                int64_t ohw = g.oh * g.ow, n0 = r0 / ohw, n1 = (r0 + rows - 1) / ohw + 1; /* images touched */     \
                if (!direct)                                                                                       \
                    dpar__cpu_parallel(c, dev, n1 - n0, (rows + n1 - n0 - 1) / (n1 - n0) * K, IM2COL##_add_images, \
                                       &job);                                                                      \
            }                                                                                                      \
        }                                                                                                          \
        DPAR_ALIGNED_FREE(col);                                                                                    \
        return DPAR_OK;                                                                                            \
    }
DPAR__CONV_DEF(dpar__im2col64, dpar__cpu64_conv2d, double, dpar__cpu64_gemm)
#undef DPAR__CONV_DEF

/* The f32 passes build no im2col matrix. Each takes its rows in blocks of at most DPAR__CONV_BLOCK
   floats of im2col (in L2), builds a block in its thread's buffer and hands it to the GEMM at once,
   which reads it back from cache; dpar__cpu64_conv2d's blocks (2 MiB) went to memory and back, 10-15%
   of the CNN's step. Every sum keeps its order, so the bits are those of the blocked im2col: a row of
   the forward's and of the input gradient's products sums over K or O in the GEMM's k blocks
   whatever block of rows it is in, and col2im adds each image's rows in row order; the kernel
   gradient, whose product sums over rows, takes them in the k blocks (DPAR__KC rows) of the blocks
   of dpar__conv_rows, C += each block's sum, in row order. Threads: blocks of rows (forward), images
   (input gradient), row strips of dw (kernel gradient: each thread builds its strip's columns). */
#define DPAR__CONV_BLOCK ((int64_t)1 << 15) /* floats: 128 KiB */
typedef struct dpar__conv_job {
    const dpar__win2d *g;
    float *x, *k, *y, *col;    /* as dpar__cpu_conv2d's; col: each part's block */
    float *kt;                 /* the input gradient's w^T [O, K]: read in place by every block's GEMM */
    const float *b;            /* the forward's bias, or NULL */
    int64_t K, M, O, rows;     /* rows: per block (forward, input gradient), of dw per part (kernel) */
    int64_t ncol, items, next; /* floats of a part's col; items: blocks or images, the next one to take */
    int taps; /* x read in place (forward: col its tap pointers) or dx added to in place (input gradient) */
} dpar__conv_job;
#ifdef DPAR__X86_SIMD
static const float dpar__conv_zeros[DPAR__KC] = { 0.0f }; /* a padded tap's channels */
/* whether the forward reads x in place (dpar__conv_fwd_taps): the AVX-512 FMA tile, the kernel that
   dpar__cpu_sgemm runs on im2col's rows here (so the same bits), whole 32-column strips of y, and taps
   of at least 8 channels (conv1's one channel stays with im2col) that tile the k blocks */
static int dpar__conv_taps(const dpar__win2d *g) {
#ifdef DPAR_USE_CBLAS
    (void)g;
    return 0;
#else
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") && g->o % DPAR__NR512 == 0 &&
           g->c % 8 == 0 && DPAR__KC % g->c == 0 && !dpar__conv_direct(g);
#endif
}
/* y[r0, r0 + rows) += im2col(x) w, the rows read from x in place: tab (ceil(rows / 8) * KH * KW * 8
   pointers) gets, per tile of 8 rows and kernel tap, each row's pixel under the tap (zeros in the
   padding and past the block); then the GEMM's loops over k blocks (taps, as DPAR__KC % C == 0), strips
   of 32 columns and tiles. im2col's pass wrote and read back 9% of conv2's forward samples. */
static void dpar__conv_fwd_taps(const dpar__conv_job *j, int64_t r0, int64_t rows, const float **tab, float *yb) {
    const dpar__win2d *g = j->g;
    const int64_t T = g->kh * g->kw, ohw = g->oh * g->ow, tiles = (rows + DPAR__MR512 - 1) / DPAR__MR512, O = j->O;
    int64_t n = r0 / ohw, i = r0 % ohw / g->ow, jw = r0 % g->ow; /* output pixel r0 + r, stepped: no divisions */
    for (int64_t r = 0; r < tiles * DPAR__MR512; r++) {
        const float **tr = tab + r / DPAR__MR512 * T * DPAR__MR512 + r % DPAR__MR512;
        const int64_t ih0 = i * g->sh - g->pt, iw0 = jw * g->sw - g->pl;
        const float *xn = j->x + n * g->h * g->w * g->c;
        for (int64_t p = 0, s = 0; p < g->kh; p++)
            for (int64_t q = 0; q < g->kw; q++, s++) {
                const int64_t ih = ih0 + p * g->dh, iw = iw0 + q * g->dw;
                const int in = r < rows && ih >= 0 && ih < g->h && iw >= 0 && iw < g->w;
                tr[s * DPAR__MR512] = in ? xn + (ih * g->w + iw) * g->c : dpar__conv_zeros;
            }
        if (++jw == g->ow && (jw = 0, ++i == g->oh)) i = 0, n++;
    }
    for (int64_t pc = 0; pc < j->K; pc += DPAR__KC) {
        const int64_t kc = j->K - pc < DPAR__KC ? j->K - pc : DPAR__KC;
        for (int64_t jr = 0; jr < O; jr += DPAR__NR512)
            for (int64_t t = 0; t < tiles; t++) {
                const int mr = (int)(rows - t * DPAR__MR512 < DPAR__MR512 ? rows - t * DPAR__MR512 : DPAR__MR512);
                dpar__ukr_taps512(kc, g->c, tab + (t * T + pc / g->c) * DPAR__MR512, j->k + pc * O + jr, O,
                                  yb + t * DPAR__MR512 * O + jr, O, mr);
            }
    }
}
#endif
/* forward: y = b (or 0), then y += im2col(x) w, block by block (x read in place where j->taps) */
static void dpar__conv_fwd_part(void *arg, int part, int nparts) {
    dpar__conv_job *j = (dpar__conv_job *)arg;
    float *col = j->col ? j->col + part * j->ncol : NULL;
    (void)nparts;
    for (int64_t t; (t = DPAR__ATOMIC_FETCH_ADD(&j->next, 1)) < j->items;) {
        int64_t r0 = t * j->rows, rows = j->M - r0 < j->rows ? j->M - r0 : j->rows;
        float *yb = j->y + r0 * j->O;
        for (int64_t r = 0; r < rows; r++)
            if (j->b)
                memcpy(yb + r * j->O, j->b, (size_t)j->O * sizeof(float));
            else
                memset(yb + r * j->O, 0, (size_t)j->O * sizeof(float));
#ifdef DPAR__X86_SIMD
        if (j->taps) {
            dpar__conv_fwd_taps(j, r0, rows, (const float **)(void *)col, yb);
            continue;
        }
#endif
        if (col) dpar__im2col(j->g, j->x, r0, rows, 0, j->K, col, 0);
        dpar__cpu_sgemm(NULL, 0, rows, j->O, j->K, 0, 0, 1.0f, col ? col : j->x + r0 * j->K, j->k, 1.0f, yb);
    }
}
#ifdef DPAR__X86_SIMD
/* whether the input gradient adds dy w^T's tiles straight into dx (dpar__conv_bwd_input_taps): the AVX-512
   FMA tile, one k block (O <= DPAR__KC: each element of im2col's gradient is then one tile's sum) and
   32-column strips inside a tap (C % 32 == 0) */
static int dpar__conv_scatter(const dpar__win2d *g) {
#ifdef DPAR_USE_CBLAS
    (void)g;
    return 0;
#else
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") && g->c % DPAR__NR512 == 0 &&
           g->o <= DPAR__KC && !dpar__conv_direct(g);
#endif
}
/* dx of image t = the sum of dy w^T's rows over their taps, without im2col's gradient in memory: per tile of
   8 output pixels (dy's rows, a part tile copied to pad: 8 x O floats, zeros past it) and strip of 32
   columns (channels of one tap), the kernel adds each row into the pixel under the tap. col2im added each
   element's terms in output pixel order; here the tiles go in that order and, within a tile, the taps from
   last to first: two rows of a tile that reach one pixel do it through taps in the opposite order. */
static void dpar__conv_bwd_input_taps(const dpar__conv_job *j, int64_t t, float *pad) {
    const dpar__win2d *g = j->g;
    const int64_t ohw = g->oh * g->ow, O = j->O, K = j->K, C = g->c;
    float *dxn = j->x + t * g->h * g->w * C;
    for (int64_t r = 0; r < ohw; r += DPAR__MR512) {
        const int64_t mr = ohw - r < DPAR__MR512 ? ohw - r : DPAR__MR512;
        const float *a = j->y + (t * ohw + r) * O;
        int64_t ih0[DPAR__MR512], iw0[DPAR__MR512];
        if (mr < DPAR__MR512) { /* the kernel reads 8 rows: not past dy's end */
            memcpy(pad, a, (size_t)(mr * O) * sizeof(float));
            memset(pad + mr * O, 0, (size_t)((DPAR__MR512 - mr) * O) * sizeof(float));
            a = pad;
        }
        for (int64_t i = 0; i < mr; i++)
            ih0[i] = (r + i) / g->ow * g->sh - g->pt, iw0[i] = (r + i) % g->ow * g->sw - g->pl;
        for (int64_t jr = K - DPAR__NR512; jr >= 0; jr -= DPAR__NR512) {
            const int64_t s = jr / C, ph = s / g->kw * g->dh, qw = s % g->kw * g->dw;
            float *dst[DPAR__MR512];
            for (int64_t i = 0; i < DPAR__MR512; i++) {
                const int64_t ih = i < mr ? ih0[i] + ph : -1, iw = i < mr ? iw0[i] + qw : -1;
                dst[i] = ih >= 0 && ih < g->h && iw >= 0 && iw < g->w ? dxn + (ih * g->w + iw) * C + jr % C : NULL;
            }
            dpar__ukr_scatter512(O, a, O, j->kt + jr, K, dst);
        }
    }
}
#endif
/* input gradient, an image at a time: dx = 0, then per block col = dy w^T, added back into dx */
static void dpar__conv_bwd_input_part(void *arg, int part, int nparts) {
    dpar__conv_job *j = (dpar__conv_job *)arg;
    const dpar__win2d *g = j->g;
    int64_t ohw = g->oh * g->ow, hwc = g->h * g->w * g->c;
    float *col = j->col ? j->col + part * j->ncol : NULL;
    (void)nparts;
    for (int64_t t; (t = DPAR__ATOMIC_FETCH_ADD(&j->next, 1)) < j->items;) {
        memset(j->x + t * hwc, 0, (size_t)hwc * sizeof(float));
#ifdef DPAR__X86_SIMD
        if (j->taps) {
            dpar__conv_bwd_input_taps(j, t, col);
            continue;
        }
#endif
        for (int64_t r0 = t * ohw; r0 < (t + 1) * ohw; r0 += j->rows) {
            int64_t rows = (t + 1) * ohw - r0 < j->rows ? (t + 1) * ohw - r0 : j->rows;
            dpar__cpu_sgemm(NULL, 0, rows, j->K, j->O, 0, 0, 1.0f, j->y + r0 * j->O, j->kt, 0.0f,
                            col ? col : j->x + r0 * j->K);
            if (col) dpar__im2col(g, j->x, r0, rows, 0, j->K, col, 1);
        }
    }
}
/* rows [k0, k1) of im2col's transpose for a one-channel x: row t - k0 (kernel tap t) holds the
   pixel under tap t for output pixels [r0, r0 + rows), row stride rows (+0 in the padding). Along an
   output row a tap reads one span of x's row (stride 1): a copy, where im2col's rows are 3-float
   pieces, 45% of conv1's kernel gradient */
static void dpar__im2col_t1(const dpar__win2d *g, const float *x, int64_t r0, int64_t rows, int64_t k0, int64_t k1,
                            float *colt) {
    const int64_t ohw = g->oh * g->ow;
    for (int64_t t = k0; t < k1; t++, colt += rows) {
        const int64_t p = t / g->kw, q = t % g->kw;
        for (int64_t r = 0, len; r < rows; r += len) { /* the output pixels of one output row */
            int64_t o = r0 + r, n = o / ohw, i = o % ohw / g->ow, j0 = o % g->ow, ih = i * g->sh - g->pt + p * g->dh;
            int64_t iw0 = j0 * g->sw - g->pl + q * g->dw; /* the column under output column j0 */
            float *d = colt + r;
            len = g->ow - j0 < rows - r ? g->ow - j0 : rows - r;
            if (ih < 0 || ih >= g->h) {
                memset(d, 0, (size_t)len * sizeof(float));
                continue;
            }
            const float *xr = x + (n * g->h + ih) * g->w;
            if (g->sw == 1) { /* [0, a) and [e, len) fall outside x's row */
                int64_t a = iw0 < 0 ? (-iw0 < len ? -iw0 : len) : 0, e = g->w - iw0 < len ? g->w - iw0 : len;
                if (e < a) e = a;
                memset(d, 0, (size_t)a * sizeof(float));
                memcpy(d + a, xr + iw0 + a, (size_t)(e - a) * sizeof(float));
                memset(d + e, 0, (size_t)(len - e) * sizeof(float));
            } else {
                for (int64_t u = 0, iw = iw0; u < len; u++, iw += g->sw) d[u] = iw >= 0 && iw < g->w ? xr[iw] : 0.0f;
            }
        }
    }
}
/* kernel gradient, rows [k0, k1) of dw: their columns of im2col, DPAR__KC rows at a time (one channel:
   im2col's transpose, the same products in the same order) */
static void dpar__conv_bwd_kernel_part(void *arg, int part, int nparts) {
    dpar__conv_job *j = (dpar__conv_job *)arg;
    int64_t k0 = part * j->rows, k1 = k0 + j->rows < j->K ? k0 + j->rows : j->K, R = dpar__conv_rows(j->K, j->M);
    float *col = j->col + part * j->ncol;
    int t1 = j->g->c == 1;
    (void)nparts;
    for (int64_t r0 = 0; r0 < j->M && k0 < k1; r0 += R) {
        int64_t r1 = j->M - r0 < R ? j->M : r0 + R;
        for (int64_t q0 = r0; q0 < r1; q0 += DPAR__KC) {
            int64_t kc = r1 - q0 < DPAR__KC ? r1 - q0 : DPAR__KC;
            if (t1)
                dpar__im2col_t1(j->g, j->x, q0, kc, k0, k1, col);
            else
                dpar__im2col(j->g, j->x, q0, kc, k0, k1, col, 0);
            dpar__cpu_sgemm(NULL, 0, k1 - k0, j->O, kc, !t1, 0, 1.0f, col, j->y + q0 * j->O, q0 ? 1.0f : 0.0f,
                            j->k + k0 * j->O);
        }
    }
}
static dpar_status dpar__cpu_conv2d(dpar__cpu *c, int dev, const dpar__op *op, dpar__conv_pass pass, float *x, float *k,
                                    float *y) {
    dpar__win2d g = dpar__win2d_get(op);
    int64_t K = g.kh * g.kw * g.c, M = g.n * g.oh * g.ow, O = g.o;
    dpar__conv_job j;
    memset(&j, 0, sizeof j);
    j.g = &g, j.x = x, j.k = k, j.y = y, j.K = K, j.M = M, j.O = O;
    j.b = pass == DPAR__CONV_FWD && op->src2 ? (const float *)op->src2->mem : NULL;
    if (M == 0 || O == 0 || K == 0) { /* y = b (or 0), dx = 0, dw = 0 */
        if (pass == DPAR__CONV_FWD)
            for (int64_t q = 0; q < M * O; q++) y[q] = j.b ? j.b[q % O] : 0.0f; /* O = 0 or K = 0: rare */
        else if (pass == DPAR__CONV_BWD_INPUT)
            memset(x, 0, (size_t)(g.n * g.h * g.w * g.c) * sizeof(float));
        else
            memset(k, 0, (size_t)(K * O) * sizeof(float));
        return DPAR_OK;
    }
    int parts = dpar__cpu_threads(c, dev, 2.0 * (double)M * (double)K * (double)O / DPAR__SGEMM_COLS);
    int64_t rows = DPAR__CONV_BLOCK / K > 24 ? DPAR__CONV_BLOCK / K / 24 * 24 : 24; /* whole tiles of 6 and 8 */
    void (*fn)(void *, int, int) = dpar__conv_fwd_part;
    if (pass == DPAR__CONV_FWD) {
        j.rows = rows < M ? rows : M;
        j.items = (M + j.rows - 1) / j.rows;
    } else if (pass == DPAR__CONV_BWD_INPUT) {
        /* blocks of about equal rows within an image, whole tiles of 6 and 8 rows but the last: conv2's
           196 rows as 72 + 72 + 52 run 25 rows of 8 x 32 tiles, 66 + 66 + 64 ran 26 (two part tiles) */
        int64_t ohw = g.oh * g.ow, nb = (ohw + rows - 1) / rows;
        j.rows = ((ohw + nb - 1) / nb + 23) / 24 * 24;
        j.items = g.n;
        fn = dpar__conv_bwd_input_part;
    } else { /* strips of dw's rows, whole tiles of 6 and 8 rows; even strips for few rows (conv1's 9:
                5 + 4, edge tiles costing their rows; 8 + 1 left one thread a quarter of the work) */
        j.rows = (K + parts - 1) / parts;
        if (j.rows > 24) j.rows = (j.rows + 23) / 24 * 24;
        j.items = (K + j.rows - 1) / j.rows;
        fn = dpar__conv_bwd_kernel_part;
    }
    if (parts > j.items) parts = (int)j.items;
    j.ncol = pass == DPAR__CONV_BWD_KERNEL ? DPAR__KC * j.rows : j.rows * K;
#ifdef DPAR__X86_SIMD
    if (pass == DPAR__CONV_FWD && (j.taps = dpar__conv_taps(&g))) /* tab's pointers, in floats */
        j.ncol = (j.rows + DPAR__MR512 - 1) / DPAR__MR512 * DPAR__MR512 * g.kh * g.kw * (int64_t)sizeof(float *) /
                 (int64_t)sizeof(float);
    if (pass == DPAR__CONV_BWD_INPUT && (j.taps = dpar__conv_scatter(&g))) j.ncol = DPAR__MR512 * O; /* pad */
#endif
    /* w^T once: a transposed B is packed at every GEMM call, once per block (a third of the time) */
    int64_t nkt = pass == DPAR__CONV_BWD_INPUT ? K * O : 0, ncol = dpar__conv_direct(&g) ? 0 : parts * j.ncol;
    if (pass == DPAR__CONV_BWD_KERNEL) ncol = parts * j.ncol;
    if (ncol + nkt) {
        if (!(j.kt = (float *)DPAR_ALIGNED_MALLOC((size_t)(ncol + nkt) * sizeof(float), 64)))
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", dpar__op_name(op->kind));
        j.col = ncol ? j.kt + nkt : NULL;
        for (int64_t o = 0; o < nkt / K; o++)
            for (int64_t q = 0; q < K; q++) j.kt[o * K + q] = k[q * O + o];
    }
    if (parts > 1)
        dpar__cpu_fork(&c->pools[dev], parts, fn, &j);
    else
        fn(&j, 0, 1);
    DPAR_ALIGNED_FREE(j.kt);
    return DPAR_OK;
}

/* The in-image part of window (i, j): rows [*h0, *h1), columns [*w0, *w1). */
static void dpar__pool_span(const dpar__win2d *g, int64_t i, int64_t j, int64_t *h0, int64_t *h1, int64_t *w0,
                            int64_t *w1) {
    int64_t a = i * g->sh - g->pt, b = j * g->sw - g->pl;
    *h0 = a < 0 ? 0 : a, *w0 = b < 0 ? 0 : b;
    *h1 = a + g->kh < g->h ? a + g->kh : g->h, *w1 = b + g->kw < g->w ? b + g->kw : g->w;
    if (*h1 < *h0) *h1 = *h0;
    if (*w1 < *w0) *w1 = *w0;
}
/* Forward (y from x) or backward (dx from dy) of avg or max pool, output
   pixel by output pixel, channels innermost (contiguous in NHWC). Max: the
   first maximum of a window in row-major order (NaN beats numbers, the
   first NaN later ones), tracked per channel in best/arg; -inf (and no
   gradient) for a window wholly in the padding. Avg: padding counts 0 and,
   unless DPAR__WIN_EXCLUDE_PAD, in the divisor (then an empty window is 0/0:
   NaN, as flax). One body for f32 and f64. */
#ifdef DPAR__X86_SIMD
__attribute__((target("avx512f"))) static int64_t dpar__pool_acc_avx512(float *y, const float *x, int64_t n, float d) {
    int64_t i = 0;
    const __m512 dv = _mm512_set1_ps(d);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), d != 0.0f ? _mm512_div_ps(v, dv) : v));
    }
    return i;
}
#endif
/* y[i] += x[i] (d = 0) or x[i] / d, i < n (the average pools' channel loops, which the compiler
   leaves scalar: y and x may alias as far as it knows); f32 on AVX-512 lanes, the same bits */
static void dpar__pool_acc_f32(float *y, const float *x, int64_t n, float d) {
    int64_t i = 0;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx512f")) i = dpar__pool_acc_avx512(y, x, n, d);
#endif
    for (; i < n; i++) y[i] += d != 0.0f ? x[i] / d : x[i];
}
static void dpar__pool_acc_f64(double *y, const double *x, int64_t n, double d) {
    for (int64_t i = 0; i < n; i++) y[i] += d != 0.0 ? x[i] / d : x[i];
}
#define DPAR__POOL2D_DEF(NAME, T, ACC)                                                                             \
    typedef struct NAME##_job {                                                                                    \
        const dpar__op *op;                                                                                        \
        int is_max, bwd;                                                                                           \
        int *oom; /* set when a range could not get its max-pool scratch */                                        \
    } NAME##_job;                                                                                                  \
    static void NAME##_images(const void *job, int64_t lo, int64_t hi) { /* images [lo, hi): independent */        \
        const NAME##_job *jb = (const NAME##_job *)job;                                                            \
        const dpar__op *op = jb->op;                                                                               \
        int is_max = jb->is_max, bwd = jb->bwd;                                                                    \
        dpar__win2d g = dpar__win2d_get(op);                                                                       \
        const T *src = (const T *)op->src0->mem, *xf = op->src1 ? (const T *)op->src1->mem : src;                  \
        T *dst = (T *)op->dst->mem, *best = NULL;                                                                  \
        int64_t C = g.c, *arg = NULL, img = g.h * g.w * C;                                                         \
        if (bwd) memset(dst + lo * img, 0, (size_t)((hi - lo) * img) * sizeof(T));                                 \
        if (is_max && C > 0) {                                                                                     \
            arg = (int64_t *)DPAR_MALLOC((size_t)C * (sizeof(int64_t) + sizeof(T))); /* int64 first: aligned */    \
            if (!arg) {                                                                                            \
                DPAR__ATOMIC_STORE(jb->oom, 1);                                                                    \
                return;                                                                                            \
            }                                                                                                      \
            best = (T *)(void *)(arg + C);                                                                         \
        }                                                                                                          \
        for (int64_t n = lo; n < hi; n++)                                                                          \
            for (int64_t i = 0; i < g.oh; i++)                                                                     \
                for (int64_t j = 0; j < g.ow; j++) {                                                               \
                    int64_t h0, h1, w0, w1, at = ((n * g.oh + i) * g.ow + j) * C;                                  \
                    dpar__pool_span(&g, i, j, &h0, &h1, &w0, &w1);                                                 \
                    int64_t cnt = g.flags & DPAR__WIN_EXCLUDE_PAD ? (h1 - h0) * (w1 - w0) : g.kh * g.kw;           \
                    T *yo = bwd ? NULL : dst + at;                                                                 \
                    const T *go = bwd ? src + at : NULL;                                                           \
                    for (int64_t ch = 0; is_max && ch < C; ch++) best[ch] = -INFINITY, arg[ch] = -1;               \
                    for (int64_t ch = 0; !is_max && !bwd && ch < C; ch++) yo[ch] = (T)0;                           \
                    for (int64_t ih = h0; ih < h1; ih++)                                                           \
                        for (int64_t iw = w0; iw < w1; iw++) {                                                     \
                            int64_t xi = ((n * g.h + ih) * g.w + iw) * C;                                          \
                            if (is_max) {                                                                          \
                                const T *xv = xf + xi;                                                             \
                                for (int64_t ch = 0; ch < C; ch++) {                                               \
                                    T v = xv[ch], bv = best[ch];                                                   \
                                    if (arg[ch] < 0 || v > bv || (v != v && bv == bv))                             \
                                        best[ch] = v, arg[ch] = xi + ch;                                           \
                                }                                                                                  \
                            } else if (bwd) {                                                                      \
                                ACC(dst + xi, go, C, (T)cnt);                                                      \
                            } else {                                                                               \
                                ACC(yo, src + xi, C, (T)0);                                                        \
                            }                                                                                      \
                        }                                                                                          \
                    for (int64_t ch = 0; is_max && !bwd && ch < C; ch++) yo[ch] = best[ch];                        \
                    for (int64_t ch = 0; is_max && bwd && ch < C; ch++)                                            \
                        if (arg[ch] >= 0) dst[arg[ch]] += go[ch];                                                  \
                    for (int64_t ch = 0; !is_max && !bwd && ch < C; ch++) yo[ch] = cnt ? yo[ch] / (T)cnt : (T)NAN; \
                }                                                                                                  \
        DPAR_FREE(arg);                                                                                            \
    }                                                                                                              \
    static dpar_status NAME(dpar__cpu *c, int dev, const dpar__op *op, int is_max, int bwd) {                      \
        int oom = 0;                                                                                               \
        NAME##_job job = { op, is_max, bwd, &oom };                                                                \
        dpar__win2d g = dpar__win2d_get(op);                                                                       \
        int64_t per_image = g.oh * g.ow * g.kh * g.kw * g.c + 1; /* window reads of an image */                    \
        dpar__cpu_parallel(c, dev, g.n, per_image, NAME##_images, &job);                                           \
        if (DPAR__ATOMIC_LOAD(&oom))                                                                               \
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", dpar__op_name(op->kind));           \
        return DPAR_OK;                                                                                            \
    }
DPAR__POOL2D_DEF(dpar__cpu_pool2d, float, dpar__pool_acc_f32)
DPAR__POOL2D_DEF(dpar__cpu64_pool2d, double, dpar__pool_acc_f64) /* >>f64 api */
#undef DPAR__POOL2D_DEF

/* >>cpu ops ===================================================================
   One function per op kind (shapes and dtypes are checked by the core before
   dispatch; see dpar__op_kind), looked up in dpar__cpu_ops by kind. */
#define DPAR__CPU_OP_ARGS dpar__cpu *c, int dev, const dpar__op *op, float *y, const float *x0, const float *x1
#define DPAR__CPU_OP_UNUSED \
    DPAR__UNUSED(c);        \
    DPAR__UNUSED(dev);      \
    DPAR__UNUSED(op);       \
    DPAR__UNUSED(y);        \
    DPAR__UNUSED(x0);       \
    DPAR__UNUSED(x1)
typedef dpar_status (*dpar__cpu_op_fn)(DPAR__CPU_OP_ARGS);

static dpar_status dpar__cpu_op_matmul(DPAR__CPU_OP_ARGS) {
    if (op->src0->dtype == DPAR_F32) {
        dpar__cpu_sgemm(c, dev, op->m, op->n, op->k, op->trans_a, op->trans_b, op->f[0], x0, x1, op->f[1], y);
        return DPAR_OK;
    }
    /* f16/bf16 operands: widen to f32, accumulate in f32 */
    float *a = (float *)DPAR_MALLOC((size_t)(op->src0->count + 1) * 4);
    float *b = (float *)DPAR_MALLOC((size_t)(op->src1->count + 1) * 4);
    if (!a || !b) {
        DPAR_FREE(a);
        DPAR_FREE(b);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_matmul: out of host memory");
    }
    for (int64_t i = 0; i < op->src0->count; i++) a[i] = dpar__load_f(op->src0->mem, op->src0->dtype, i);
    for (int64_t i = 0; i < op->src1->count; i++) b[i] = dpar__load_f(op->src1->mem, op->src1->dtype, i);
    dpar__cpu_sgemm(c, dev, op->m, op->n, op->k, op->trans_a, op->trans_b, op->f[0], a, b, op->f[1], y);
    DPAR_FREE(a);
    DPAR_FREE(b);
    return DPAR_OK;
}
/* rows [lo, hi) of y[m, n] += b[n] */
static void dpar__bias_add_rows(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    float *y = (float *)op->dst->mem + lo * op->n;
    const float *b = (const float *)op->src0->mem;
    int64_t j0 = 0;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2")) j0 = dpar__bias_add_avx2(y, b, hi - lo, op->n);
#endif
    for (int64_t i = 0; i < hi - lo; i++)
        for (int64_t j = j0; j < op->n; j++) y[i * op->n + j] += b[j];
}
static dpar_status dpar__cpu_op_bias_add(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    dpar__cpu_parallel(c, dev, op->m, op->n, dpar__bias_add_rows, op);
    return DPAR_OK;
}
/* blocks [lo, hi) of 8 columns of the bias gradient (whole blocks for the vector loop): each column
   summed over the rows in order */
static void dpar__bias_grad_cols(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    lo *= 8, hi = hi * 8 < op->n ? hi * 8 : op->n;
    float *y = (float *)op->dst->mem;
    const float *x = (const float *)op->src0->mem;
    int64_t j0 = lo;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2")) j0 = lo + dpar__bias_grad_avx2(y + lo, x + lo, op->m, op->n, hi - lo, op->f[1]);
#endif
    for (int64_t j = j0; j < hi; j++) {
        float s = 0.0f;
        for (int64_t i = 0; i < op->m; i++) s += x[i * op->n + j];
        y[j] = (op->f[1] == 0.0f ? 0.0f : op->f[1] * y[j]) + s;
    }
}
static dpar_status dpar__cpu_op_bias_grad(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    dpar__cpu_parallel(c, dev, (op->n + 7) / 8, 8 * op->m, dpar__bias_grad_cols, op);
    return DPAR_OK;
}
/* elements [lo, hi) of relu (x > 0 or NaN: x, else +0) */
static void dpar__relu_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    float *y = (float *)op->dst->mem + lo;
    const float *x = (const float *)op->src0->mem + lo;
    int64_t i = 0, n = hi - lo;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2")) i = dpar__relu_avx2(y, x, n);
#endif
    for (; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : (x[i] != x[i] ? x[i] : 0.0f);
}
static dpar_status dpar__cpu_op_relu(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    dpar__cpu_parallel(c, dev, op->n, 1, dpar__relu_range, op);
    return DPAR_OK;
}
/* elements [lo, hi) of relu's backward: dy where x > 0, else 0 */
static void dpar__relu_bwd_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    float *y = (float *)op->dst->mem + lo;
    const float *dy = (const float *)op->src0->mem + lo, *x = (const float *)op->src1->mem + lo;
    int64_t i = 0, n = hi - lo;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2")) i = dpar__relu_bwd_avx2(y, dy, x, n);
#endif
    for (; i < n; i++) y[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}
static dpar_status dpar__cpu_op_relu_bwd(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    dpar__cpu_parallel(c, dev, op->n, 1, dpar__relu_bwd_range, op);
    return DPAR_OK;
}
enum { DPAR__XENT_ROW_CACHE = 512 }; /* classes whose exp values dpar__cpu_op_softmax_xent keeps (2 KiB) */
static dpar_status dpar__cpu_op_softmax_xent(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    const int32_t *lab = (const int32_t *)op->src1->mem;
    float *g = op->dst2 ? (float *)op->dst2->mem : NULL;
    int64_t M = op->m, C = op->n, counted = 0;
    int ign = (int)op->p[0];
    int32_t ignore = (int32_t)op->p[1];
    int64_t bad = dpar__first_bad_index(lab, M, C, ign, ignore);
    if (bad >= 0) return dpar__bad_index((int)op->p[2], bad, lab[bad], C);
    for (int64_t i = 0; i < M; i++) counted += !(ign && lab[i] == ignore);
    const double a = (double)op->f[0]; /* label smoothing: q = (1 - a) onehot + a / C */
    double total = 0.0;
    for (int64_t i = 0; i < M; i++) {
        const float *z = x0 + i * C;
        int32_t l = lab[i];
        if (ign && l == ignore) {
            if (g) memset(g + i * C, 0, (size_t)C * sizeof(float));
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < C; j++) mx = (z[j] > mx || z[j] != z[j]) ? z[j] : mx;
        /* exp(z - mx) (dpar__exp_f32) once per element when the row fits the stack cache: the gradient
           reuses the same values; longer rows compute them again, a cache-sized block at a time */
        float e[DPAR__XENT_ROW_CACHE];
        double se = 0.0, zsum = 0.0;
        const bool cached = C <= DPAR__XENT_ROW_CACHE;
        for (int64_t b = 0; b < C; b += DPAR__XENT_ROW_CACHE) {
            int64_t nb = C - b < DPAR__XENT_ROW_CACHE ? C - b : (int64_t)DPAR__XENT_ROW_CACHE;
            dpar__exp_shifted_f32(e, z + b, mx, nb);
            for (int64_t j = 0; j < nb; j++) se += (double)e[j];
        }
        if (a != 0.0)
            for (int64_t j = 0; j < C; j++) zsum += (double)z[j] - (double)mx;
        /* relative to the max: (mx - z_l) + log(se) and exp(z - mx) / se stay exact for
           huge logits, where mx + log(se) would absorb log(se) (|z| ~ 1e30 and up) */
        double lse_rel = log(se);
        if (a == 0.0)
            total += ((double)mx - (double)z[l]) + lse_rel;
        else
            total += (1.0 - a) * (((double)mx - (double)z[l]) + lse_rel) + a * (lse_rel - zsum / (double)C);
        if (g)
            for (int64_t b = 0; b < C; b += DPAR__XENT_ROW_CACHE) {
                int64_t nb = C - b < DPAR__XENT_ROW_CACHE ? C - b : (int64_t)DPAR__XENT_ROW_CACHE;
                if (!cached) dpar__exp_shifted_f32(e, z + b, mx, nb);
                for (int64_t j = 0; j < nb; j++) {
                    double p = (double)e[j] / se, q = (b + j == l ? 1.0 - a : 0.0) + a / (double)C;
                    g[i * C + b + j] = (float)((p - q) / (double)counted);
                }
            }
    }
    y[0] = counted ? (float)(total / (double)counted) : 0.0f;
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_mse(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    float *g = op->dst2 ? (float *)op->dst2->mem : NULL;
    int64_t n = op->n;
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x0[i] - (double)x1[i];
        total += d * d;
        if (g) g[i] = (float)(2.0 * d / (double)n);
    }
    y[0] = n ? (float)(total / (double)n) : 0.0f;
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_axpy(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    int64_t i = 0;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2")) i = dpar__axpy_avx2(y, x0, op->n, op->f[0]);
#endif
    for (; i < op->n; i++) y[i] += op->f[0] * x0[i];
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_scale(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    for (int64_t i = 0; i < op->n; i++) y[i] *= op->f[0];
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_fill(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    dpar_dtype t = op->dst->dtype;
    int64_t n = op->n;
    if (t == DPAR_F32) {
        for (int64_t i = 0; i < n; i++) y[i] = op->f[0];
    } else if (t ==
               DPAR_I32) { /* saturating like dpar_cast: (int32_t) of NaN / out-of-range floats is undefined in C */
        float f = op->f[0];
        int32_t v = f != f ? 0 : f >= 2147483647.0f ? INT32_MAX : f <= -2147483648.0f ? INT32_MIN : (int32_t)f;
        for (int64_t i = 0; i < n; i++) ((int32_t *)y)[i] = v;
    } else {
        uint16_t v = t == DPAR_F16 ? dpar_f32_to_f16(op->f[0]) : dpar_f32_to_bf16(op->f[0]);
        for (int64_t i = 0; i < n; i++) ((uint16_t *)y)[i] = v;
    }
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_copy(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    memmove(y, x0, op->dst->nbytes);
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_cast(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    dpar_dtype ts = op->src0->dtype, td = op->dst->dtype;
    for (int64_t i = 0; i < op->n; i++) {
        if (ts == DPAR_I32 && td == DPAR_I32) {
            ((int32_t *)y)[i] = ((const int32_t *)x0)[i];
            continue;
        }
        float v = dpar__load_f(x0, ts, i);
        switch (td) {
        case DPAR_F32: y[i] = v; break;
        case DPAR_F16: ((uint16_t *)y)[i] = dpar_f32_to_f16(v); break;
        case DPAR_BF16: ((uint16_t *)y)[i] = dpar_f32_to_bf16(v); break;
        case DPAR_I32:
            ((int32_t *)y)[i] = v != v                ? 0
                                : v >= 2147483647.0f  ? INT32_MAX
                                : v <= -2147483648.0f ? INT32_MIN
                                                      : (int32_t)v;
            break;
        default: break;
        }
    }
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_sum(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    double s = 0.0;
    for (int64_t i = 0; i < op->n; i++) s += (double)x0[i];
    y[op->p[0]] = (float)s;
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_sumsq(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    double s = 0.0;
    for (int64_t i = 0; i < op->n; i++) s += (double)x0[i] * (double)x0[i];
    y[op->p[0]] = (float)s;
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_sgd(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    dpar__cpu_parallel(c, dev, (op->n + 63) / 64, 64, dpar__sgd_blocks, op);
    return DPAR_OK;
}
/* >>cpu norm-attn =============================================================
   CPU reference of the layer ops (double accumulation, fixed order). */
enum { DPAR__NORM_LANES = 8 }; /* partial sums per row sum: independent chains the CPU overlaps */
/* the lanes' partial sums added in a fixed order */
static double dpar__norm_lanes_sum(const double *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
/* per row: mean (shifted by x[0], so a constant row gives exactly x[0] and a zero variance) and rstd;
   each sum as DPAR__NORM_LANES partial sums (element j in lane j % 8) */
#ifdef DPAR__X86_SIMD
/* The norm ops' loops with lane k of one __m512d as partial sum k (DPAR__NORM_LANES = 8): the same
   double operations per element in the same order, so the same bits as the scalar loops, which do
   what is left; each returns how many leading elements it did (a multiple of 8). */
/* l[k] += (x[j] - c) (sq: squared) over whole blocks of 8 */
__attribute__((target("avx512f"))) static int64_t dpar__norm_lanes_avx512(const float *x, int64_t n, double c, int sq,
                                                                          double *l) {
    int64_t j = 0;
    __m512d acc = _mm512_loadu_pd(l), cv = _mm512_set1_pd(c);
    for (; j + 8 <= n; j += 8) {
        __m512d v = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + j)), cv);
        acc = _mm512_add_pd(acc, sq ? _mm512_mul_pd(v, v) : v);
    }
    _mm512_storeu_pd(l, acc);
    return j;
}
/* y[j] = (float)((x[j] - mu) rs) w[j] + b[j] (w, b: NULL for none; + 0.0f then, as the scalar loop) */
__attribute__((target("avx512f"))) static int64_t dpar__norm_out_avx512(float *y, const float *x, int64_t n, double mu,
                                                                        double rs, const float *w, const float *b) {
    int64_t j = 0;
    const __m512d m = _mm512_set1_pd(mu), r = _mm512_set1_pd(rs);
    for (; j + 8 <= n; j += 8) {
        __m256 xh = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + j)), m), r));
        if (w) xh = _mm256_mul_ps(xh, _mm256_loadu_ps(w + j));
        _mm256_storeu_ps(y + j, _mm256_add_ps(xh, b ? _mm256_loadu_ps(b + j) : _mm256_setzero_ps()));
    }
    return j;
}
/* one row of dpar__cpu_op_norm_bwd's first pass: xs, gs, the lane sums lg, lgx and the column sums acc */
__attribute__((target("avx512f"))) static int64_t dpar__norm_bwd_row_avx512(const float *dy, const float *x, int64_t n,
                                                                            double mu, double rs, const float *w,
                                                                            double *xs, double *gs, double *lg,
                                                                            double *lgx, double *acc) {
    int64_t j = 0;
    const __m512d m = _mm512_set1_pd(mu), r = _mm512_set1_pd(rs);
    __m512d sg = _mm512_loadu_pd(lg), sgx = _mm512_loadu_pd(lgx);
    for (; j + 8 <= n; j += 8) {
        __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(dy + j));
        __m512d xh = _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + j)), m), r);
        __m512d g = w ? _mm512_mul_pd(d, _mm512_cvtps_pd(_mm256_loadu_ps(w + j))) : d; /* d * 1.0 = d */
        _mm512_storeu_pd(xs + j, xh);
        _mm512_storeu_pd(gs + j, g);
        sg = _mm512_add_pd(sg, g);
        sgx = _mm512_add_pd(sgx, _mm512_mul_pd(g, xh));
        _mm512_storeu_pd(acc + j, _mm512_add_pd(_mm512_loadu_pd(acc + j), _mm512_mul_pd(d, xh)));
        _mm512_storeu_pd(acc + n + j, _mm512_add_pd(_mm512_loadu_pd(acc + n + j), d));
    }
    _mm512_storeu_pd(lg, sg);
    _mm512_storeu_pd(lgx, sgx);
    return j;
}
/* dx[j] = (float)(rs (gs[j] - mg - xs[j] mgx)) */
__attribute__((target("avx512f"))) static int64_t dpar__norm_dx_avx512(float *dx, const double *gs, const double *xs,
                                                                       int64_t n, double rs, double mg, double mgx) {
    int64_t j = 0;
    const __m512d r = _mm512_set1_pd(rs), a = _mm512_set1_pd(mg), b = _mm512_set1_pd(mgx);
    for (; j + 8 <= n; j += 8) {
        __m512d t = _mm512_sub_pd(_mm512_sub_pd(_mm512_loadu_pd(gs + j), a), _mm512_mul_pd(_mm512_loadu_pd(xs + j), b));
        _mm256_storeu_ps(dx + j, _mm512_cvtpd_ps(_mm512_mul_pd(r, t)));
    }
    return j;
}
#endif
/* whether the norm ops take their AVX-512 loops */
static int dpar__norm_wide(void) {
#ifdef DPAR__X86_SIMD
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}
static void dpar__cpu_norm_row(const float *x, int64_t n, int rms, float eps, double *mean, double *rstd) {
    double mu = 0.0, l[DPAR__NORM_LANES] = { 0 };
    int wide = dpar__norm_wide();
    int64_t j = 0;
    (void)wide; /* used by the AVX-512 loops only */
    if (!rms && n > 0) {
#ifdef DPAR__X86_SIMD
        if (wide) j = dpar__norm_lanes_avx512(x, n, (double)x[0], 0, l);
#endif
        for (; j < n; j++) l[j % DPAR__NORM_LANES] += (double)x[j] - (double)x[0];
        mu = (double)x[0] + dpar__norm_lanes_sum(l) / (double)n;
        memset(l, 0, sizeof l);
    }
    j = 0;
#ifdef DPAR__X86_SIMD
    if (wide) j = dpar__norm_lanes_avx512(x, n, mu, 1, l);
#endif
    for (; j < n; j++) l[j % DPAR__NORM_LANES] += ((double)x[j] - mu) * ((double)x[j] - mu);
    *mean = mu;
    *rstd = 1.0 / sqrt((n ? dpar__norm_lanes_sum(l) / (double)n : 0.0) + (double)eps);
}
static dpar_status dpar__cpu_op_norm(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    const float *w = op->src1 ? (const float *)op->src1->mem : NULL,
                *b = op->src2 ? (const float *)op->src2->mem : NULL;
    float *st = op->dst2 ? (float *)op->dst2->mem : NULL;
    int64_t n = op->n;
    for (int64_t i = 0; i < op->m; i++) {
        const float *xr = x0 + i * n;
        float *yr = y + i * n;
        double mu, rs;
        dpar__cpu_norm_row(xr, n, (int)op->p[0], op->f[0], &mu, &rs);
        int64_t j = 0;
#ifdef DPAR__X86_SIMD
        if (dpar__norm_wide()) j = dpar__norm_out_avx512(yr, xr, n, mu, rs, w, b);
#endif
        for (; j < n; j++) {
            float xh = (float)(((double)xr[j] - mu) * rs);
            yr[j] = (w ? xh * w[j] : xh) + (b ? b[j] : 0.0f);
        }
        if (st) {
            st[2 * i] = (float)mu;
            st[2 * i + 1] = (float)rs;
        }
    }
    return DPAR_OK;
}
/* Layer/RMS norm backward, one pass over each row: xh and g = dy w kept in two row scratches, the row
   sums mean(g) and mean(g xh) as DPAR__NORM_LANES partial sums (element j in lane j % 8), then
   dx = rstd (g - mean(g) - xh mean(g xh)); dw and db summed per column over the rows in order. */
static dpar_status dpar__cpu_op_norm_bwd(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    const float *w = op->src2 ? (const float *)op->src2->mem : NULL, *st = (const float *)op->src3->mem;
    float *dw = op->dst2 ? (float *)op->dst2->mem : NULL, *db = op->dst3 ? (float *)op->dst3->mem : NULL;
    int64_t n = op->n;
    double *acc = (double *)DPAR_MALLOC((size_t)(4 * n + 1) * sizeof(double)); /* dw, db sums; xh, g of a row */
    if (!acc)
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "norm backward: out of host memory (%lld columns)", (long long)n);
    memset(acc, 0, (size_t)(2 * n + 1) * sizeof(double));
    double *xs = acc + 2 * n, *gs = acc + 3 * n;
    int wide = dpar__norm_wide();
    (void)wide;                           /* used by the AVX-512 loops only */
    for (int64_t i = 0; i < op->m; i++) { /* row i of dy is read before row i of dx is written (dx may alias dy) */
        const float *dyr = x0 + i * n, *xr = x1 + i * n;
        double mu = (double)st[2 * i], rs = (double)st[2 * i + 1];
        double lg[DPAR__NORM_LANES] = { 0 }, lgx[DPAR__NORM_LANES] = { 0 };
        int64_t done = 0;
#ifdef DPAR__X86_SIMD
        if (wide) done = dpar__norm_bwd_row_avx512(dyr, xr, n, mu, rs, w, xs, gs, lg, lgx, acc);
#endif
        for (int64_t j0 = done; j0 < n; j0 += DPAR__NORM_LANES) {
            int64_t nl = n - j0 < DPAR__NORM_LANES ? n - j0 : (int64_t)DPAR__NORM_LANES;
            for (int64_t k = 0; k < nl; k++) {
                int64_t j = j0 + k;
                double d = (double)dyr[j], xh = ((double)xr[j] - mu) * rs, g = d * (w ? (double)w[j] : 1.0);
                xs[j] = xh;
                gs[j] = g;
                lg[k] += g;
                lgx[k] += g * xh;
                acc[j] += d * xh;
                acc[n + j] += d;
            }
        }
        if (op->p[1]) continue; /* no dx */
        double mg = op->p[0] ? 0.0 : dpar__norm_lanes_sum(lg) / (double)n, mgx = dpar__norm_lanes_sum(lgx) / (double)n;
        float *dx = y + i * n;
        int64_t j = 0;
#ifdef DPAR__X86_SIMD
        if (wide) j = dpar__norm_dx_avx512(dx, gs, xs, n, rs, mg, mgx);
#endif
        for (; j < n; j++) dx[j] = (float)(rs * (gs[j] - mg - xs[j] * mgx));
    }
    for (int64_t j = 0; j < n; j++) {
        if (dw) dw[j] = (float)acc[j];
        if (db) db[j] = (float)acc[n + j];
    }
    DPAR_FREE(acc);
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_matmul_batched(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    for (int64_t b = 0; b < op->p[0] && op->dst->dtype == DPAR_F64; b++) /* >>f64 api: the blocked f64 GEMM */
        dpar__cpu64_gemm(c, dev, op->m, op->n, op->k, op->trans_a, op->trans_b, op->f[0],
                         (const double *)op->src0->mem + b * op->p[1], (const double *)op->src1->mem + b * op->p[2],
                         op->f[1], (double *)op->dst->mem + b * op->p[3]);
    for (int64_t b = 0; b < op->p[0] && op->dst->dtype != DPAR_F64; b++)
        dpar__cpu_sgemm(c, dev, op->m, op->n, op->k, op->trans_a, op->trans_b, op->f[0], x0 + b * op->p[1],
                        x1 + b * op->p[2], op->f[1], y + b * op->p[3]);
    return DPAR_OK;
}
/* Attention on the CPU: one batch-head at a time, query rows in blocks of rb, each block's
   scores S = scale Q K^T and products through the GEMM. Scratch: two rb x Tk float blocks
   (rb x Tk <= 2^15 unless Tk alone is larger: 256 KiB, cache-sized); the keys past a causal
   block's last row are skipped. */
typedef struct dpar__attn_geo {
    int64_t bh, tq, tk, d, dv, rb;
    int causal;
    float scale;
} dpar__attn_geo;
static dpar__attn_geo dpar__attn_geo_of(const dpar__op *op) {
    dpar__attn_geo g;
    g.bh = op->p[0], g.tq = op->p[1], g.tk = op->p[2], g.d = op->p[3], g.dv = op->p[4];
    g.causal = (int)op->p[5];
    g.scale = op->f[0];
    int64_t cap = ((int64_t)1 << 15) / (g.tk > 0 ? g.tk : 1);
    g.rb = g.tq < cap ? g.tq : cap > 0 ? cap : 1;
    return g;
}
/* nb blocks of rb x tk scores (P, dS, dq's dS) */
static void *dpar__attn_scratch(const dpar__attn_geo *g, const char *fn, size_t es, int nb) {
    void *p = DPAR_MALLOC((size_t)(nb * g->rb * g->tk + 1) * es);
    if (!p)
        dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory (%lld x %lld scores)", fn, (long long)g->rb,
                  (long long)g->tk);
    return p;
}
/* One row of attention's dS = P (dP - D): dr[j] = p[j] (dr[j] - D) with D = sum_j p[j] dr[j] (have_d: D
   given; rnd: D computed, then rounded to the element type before use, as pass 2 reads it back from
   the stats), in double; returns D. f32: D as DPAR__NORM_LANES partial sums (element j in lane j % 8),
   the lanes on one AVX-512 vector where there is one; f64: D summed in order (rnd changes nothing). */
#ifdef DPAR__X86_SIMD
__attribute__((target("avx512f"))) static int64_t dpar__attn_dsrow_avx512(const float *p, float *dr, int64_t n,
                                                                          int have_d, int rnd, double *D, double *l) {
    int64_t j = 0;
    if (!have_d) {
        __m512d acc = _mm512_setzero_pd();
        for (; j + 8 <= n; j += 8)
            acc = _mm512_add_pd(
                acc, _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(p + j)), _mm512_cvtps_pd(_mm256_loadu_ps(dr + j))));
        _mm512_storeu_pd(l, acc);
        for (int64_t k = j; k < n; k++) l[k % DPAR__NORM_LANES] += (double)p[k] * (double)dr[k];
        *D = dpar__norm_lanes_sum(l);
        if (rnd) *D = (double)(float)*D;
    }
    const __m512d d = _mm512_set1_pd(*D);
    for (j = 0; j + 8 <= n; j += 8) {
        __m512d v = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(dr + j)), d);
        _mm256_storeu_ps(dr + j, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(p + j)), v)));
    }
    return j;
}
#endif
static double dpar__attn_dsrow_f32(const float *p, float *dr, int64_t n, int have_d, int rnd, double D) {
    double l[DPAR__NORM_LANES] = { 0 };
    int64_t j = 0;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx512f")) {
        j = dpar__attn_dsrow_avx512(p, dr, n, have_d, rnd, &D, l);
        have_d = 1;
    }
#endif
    if (!have_d) {
        for (int64_t k = 0; k < n; k++) l[k % DPAR__NORM_LANES] += (double)p[k] * (double)dr[k];
        D = dpar__norm_lanes_sum(l);
        if (rnd) D = (double)(float)D;
    }
    for (; j < n; j++) dr[j] = (float)((double)p[j] * ((double)dr[j] - D));
    return D;
}
static double dpar__attn_dsrow_f64(const double *p, double *dr, int64_t n, int have_d, int rnd, double D) {
    (void)rnd; /* D is already a double */
    if (!have_d)
        for (int64_t j = 0; j < n; j++) D += p[j] * dr[j];
    for (int64_t j = 0; j < n; j++) dr[j] = p[j] * (dr[j] - D);
    return D;
}
/* the largest of r[0..n) that is not NaN (-inf for none), as the loop r[j] > mx ? r[j] : mx. f64: that
   loop; f32: on AVX-512 lanes then a fold, the same maximum (a zero's sign may differ, which no use of
   it can tell: z - mx and mx + log(se) come out the same) */
#ifdef DPAR__X86_SIMD
__attribute__((target("avx512f"))) static float dpar__rowmax_avx512(const float *r, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(r + j), m); /* NaN lanes keep m */
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
        m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, r + j), m);
    }
    return _mm512_reduce_max_ps(m);
}
#endif
static float dpar__rowmax_f32(const float *r, int64_t n) {
    float mx = -INFINITY;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx512f")) return dpar__rowmax_avx512(r, n);
#endif
    for (int64_t j = 0; j < n; j++) mx = r[j] > mx ? r[j] : mx;
    return mx;
}
static double dpar__rowmax_f64(const double *r, int64_t n) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) mx = r[j] > mx ? r[j] : mx;
    return mx;
}
/* e[j] = exp(z[j] - mx) in double: the f64 attention's dpar__exp_shifted_f32 */
static void dpar__exp_shifted_f64(double *e, const double *z, double mx, int64_t n) {
    for (int64_t j = 0; j < n; j++) e[j] = exp(z[j] - mx);
}
/* The attention kernels, one body for f32 and f64 (>>f64 api; stats then f64 too): element type T,
   its GEMM (dpar__cpu_sgemm, dpar__cpu64_gemm), shifted exp, dS row and row max; sums and lse in double.
   PROBS: P[r, j] = exp(scale q_i . k_j - lse_i) for query rows i = i0 + r < i1, keys j < nk (ld nk);
   zero past row i's last key. lse_i: from st (st_lse) or computed and stored there (P normalized
   either way). DSCORES: dS = P (dP - D_i) with dP = dout V^T, for one block of query rows; D_i
   computed and stored in stats[.., 1], used as computed (pass 1) or as stored, rounded to T (pass 2:
   the D that pass 1 leaves there, so pass 2 needs no pass 1 before it); with dSq, both: dSq with D as
   computed (dq's), dS with D rounded (dk's). FWD: the forward. BWDQ: pass 1 over query rows: D_i,
   dq_i = scale sum_j ds_ij k_j. BWDKV: pass 2: dk = scale dS^T q, dv = P^T dout, summed over the
   query-row blocks in order, and dq as pass 1 computes it (from the same P and dP: one pass for all). */
#define DPAR__ATTN_DEF(PROBS, DSCORES, FWD, BWDQ, BWDKV, T, GEMM, EXPSH, DSROW, ROWMAX)                                \
    static void PROBS(dpar__cpu *c, int dev, const dpar__attn_geo *g, int64_t b, int64_t i0, int64_t i1, int64_t nk,   \
                      const T *Q, const T *K, T *st, int st_lse, T *P) {                                               \
        GEMM(c, dev, i1 - i0, nk, g->d, 0, 1, g->scale, Q + (b * g->tq + i0) * g->d, K + b * g->tk * g->d, 0.0f, P);   \
        for (int64_t i = i0; i < i1; i++) {                                                                            \
            T *pr = P + (i - i0) * nk;                                                                                 \
            int64_t nj = g->causal ? i + 1 : nk, row = b * g->tq + i;                                                  \
            double lse;                                                                                                \
            if (st_lse) {                                                                                              \
                lse = (double)st[2 * row];                                                                             \
            } else {                                                                                                   \
                T mx = ROWMAX(pr, nj);                                                                                 \
                double se = 0.0;                                                                                       \
                for (int64_t j0 = 0; j0 < nj; j0 += DPAR__EXP_BLOCK) {                                                 \
                    T e[DPAR__EXP_BLOCK];                                                                              \
                    int64_t nb = nj - j0 < DPAR__EXP_BLOCK ? nj - j0 : (int64_t)DPAR__EXP_BLOCK;                       \
                    EXPSH(e, pr + j0, mx, nb);                                                                         \
                    for (int64_t j = 0; j < nb; j++) se += (double)e[j];                                               \
                }                                                                                                      \
                lse = (double)mx + log(se);                                                                            \
                if (st) st[2 * row] = (T)lse, st[2 * row + 1] = (T)0;                                                  \
            }                                                                                                          \
            EXPSH(pr, pr, (T)lse, nj);                                                                                 \
            for (int64_t j = nj; j < nk; j++) pr[j] = (T)0;                                                            \
        }                                                                                                              \
    }                                                                                                                  \
    static void DSCORES(dpar__cpu *c, int dev, const dpar__attn_geo *g, int64_t b, int64_t i0, int64_t i1, int64_t nk, \
                        const T *dO, const T *V, T *st, int rnd, const T *P, T *dS, T *dSq) {                          \
        GEMM(c, dev, i1 - i0, nk, g->dv, 0, 1, 1.0f, dO + (b * g->tq + i0) * g->dv, V + b * g->tk * g->dv, 0.0f, dS);  \
        for (int64_t i = i0; i < i1; i++) {                                                                            \
            int64_t row = b * g->tq + i;                                                                               \
            const T *pr = P + (i - i0) * nk;                                                                           \
            T *dr = dS + (i - i0) * nk, *qr = dSq ? dSq + (i - i0) * nk : NULL;                                        \
            if (qr) memcpy(qr, dr, (size_t)nk * sizeof(T));                                                            \
            double D = qr ? DSROW(pr, qr, nk, 0, 0, 0.0) : DSROW(pr, dr, nk, 0, rnd, 0.0);                             \
            if (qr) DSROW(pr, dr, nk, 1, 0, (double)(T)D);                                                             \
            st[2 * row + 1] = (T)D;                                                                                    \
        }                                                                                                              \
    }                                                                                                                  \
    static dpar_status FWD(dpar__cpu *c, int dev, const dpar__op *op) {                                                \
        dpar__attn_geo g = dpar__attn_geo_of(op);                                                                      \
        T *y = (T *)op->dst->mem, *st = op->dst2 ? (T *)op->dst2->mem : NULL;                                          \
        T *P = (T *)dpar__attn_scratch(&g, "dpar_attention", sizeof(T), 2);                                            \
        const T *Q = (const T *)op->src0->mem, *K = (const T *)op->src1->mem, *V = (const T *)op->src2->mem;           \
        if (!P) return DPAR_ERR_OUT_OF_MEMORY;                                                                         \
        for (int64_t b = 0; b < g.bh; b++)                                                                             \
            for (int64_t i0 = 0; i0 < g.tq; i0 += g.rb) {                                                              \
                int64_t i1 = i0 + g.rb < g.tq ? i0 + g.rb : g.tq, nk = g.causal && i1 < g.tk ? i1 : g.tk;              \
                PROBS(c, dev, &g, b, i0, i1, nk, Q, K, st, 0, P);                                                      \
                GEMM(c, dev, i1 - i0, g.dv, nk, 0, 0, 1.0f, P, V + b * g.tk * g.dv, 0.0f, y + (b * g.tq + i0) * g.dv); \
            }                                                                                                          \
        DPAR_FREE(P);                                                                                                  \
        return DPAR_OK;                                                                                                \
    }                                                                                                                  \
    static dpar_status BWDQ(dpar__cpu *c, int dev, const dpar__op *op) {                                               \
        dpar__attn_geo g = dpar__attn_geo_of(op);                                                                      \
        const T *dO = (const T *)op->src0->mem, *Q = (const T *)op->src1->mem, *K = (const T *)op->src2->mem,          \
                *V = (const T *)op->src3->mem;                                                                         \
        T *st = (T *)op->dst->mem, *dq = op->dst2 ? (T *)op->dst2->mem : NULL;                                         \
        T *P = (T *)dpar__attn_scratch(&g, "dpar_attention_backward", sizeof(T), 2);                                   \
        if (!P) return DPAR_ERR_OUT_OF_MEMORY;                                                                         \
        T *dS = P + g.rb * g.tk;                                                                                       \
        for (int64_t b = 0; b < g.bh; b++)                                                                             \
            for (int64_t i0 = 0; i0 < g.tq; i0 += g.rb) {                                                              \
                int64_t i1 = i0 + g.rb < g.tq ? i0 + g.rb : g.tq, nk = g.causal && i1 < g.tk ? i1 : g.tk;              \
                PROBS(c, dev, &g, b, i0, i1, nk, Q, K, st, 1, P);                                                      \
                DSCORES(c, dev, &g, b, i0, i1, nk, dO, V, st, 0, P, dS, NULL);                                         \
                if (dq)                                                                                                \
                    GEMM(c, dev, i1 - i0, g.d, nk, 0, 0, g.scale, dS, K + b * g.tk * g.d, 0.0f,                        \
                         dq + (b * g.tq + i0) * g.d);                                                                  \
            }                                                                                                          \
        DPAR_FREE(P);                                                                                                  \
        return DPAR_OK;                                                                                                \
    }                                                                                                                  \
    static dpar_status BWDKV(dpar__cpu *c, int dev, const dpar__op *op) {                                              \
        dpar__attn_geo g = dpar__attn_geo_of(op);                                                                      \
        const T *dO = (const T *)op->src0->mem, *Q = (const T *)op->src1->mem, *K = (const T *)op->src2->mem,          \
                *V = (const T *)op->src3->mem;                                                                         \
        T *st = (T *)op->dst->mem, *dk = op->dst2 ? (T *)op->dst2->mem : NULL;                                         \
        T *dv = op->dst3 ? (T *)op->dst3->mem : NULL, *dq = op->dst4 ? (T *)op->dst4->mem : NULL;                      \
        T *P = (T *)dpar__attn_scratch(&g, "dpar_attention_backward", sizeof(T), dq && dk ? 3 : 2);                    \
        if (!P) return DPAR_ERR_OUT_OF_MEMORY;                                                                         \
        T *dS = P + g.rb * g.tk, *dSq = dq && dk ? dS + g.rb * g.tk : dS; /* dq's dS: D unrounded, as pass 1's */      \
        if (dk) memset(dk, 0, (size_t)(g.bh * g.tk * g.d) * sizeof(T));   /* keys no query sees get 0 */               \
        if (dv) memset(dv, 0, (size_t)(g.bh * g.tk * g.dv) * sizeof(T));                                               \
        for (int64_t b = 0; b < g.bh; b++)                                                                             \
            for (int64_t i0 = 0; i0 < g.tq; i0 += g.rb) {                                                              \
                int64_t i1 = i0 + g.rb < g.tq ? i0 + g.rb : g.tq, nk = g.causal && i1 < g.tk ? i1 : g.tk;              \
                PROBS(c, dev, &g, b, i0, i1, nk, Q, K, st, 1, P);                                                      \
                if (dk || dq)                                                                                          \
                    DSCORES(c, dev, &g, b, i0, i1, nk, dO, V, st, dk != NULL, P, dS, dSq != dS ? dSq : NULL);          \
                if (dq)                                                                                                \
                    GEMM(c, dev, i1 - i0, g.d, nk, 0, 0, g.scale, dSq, K + b * g.tk * g.d, 0.0f,                       \
                         dq + (b * g.tq + i0) * g.d);                                                                  \
                if (dk)                                                                                                \
                    GEMM(c, dev, nk, g.d, i1 - i0, 1, 0, g.scale, dS, Q + (b * g.tq + i0) * g.d, i0 ? 1.0f : 0.0f,     \
                         dk + b * g.tk * g.d);                                                                         \
                if (dv)                                                                                                \
                    GEMM(c, dev, nk, g.dv, i1 - i0, 1, 0, 1.0f, P, dO + (b * g.tq + i0) * g.dv, i0 ? 1.0f : 0.0f,      \
                         dv + b * g.tk * g.dv);                                                                        \
            }                                                                                                          \
        DPAR_FREE(P);                                                                                                  \
        return DPAR_OK;                                                                                                \
    }
DPAR__ATTN_DEF(dpar__attn_probs, dpar__attn_dscores, dpar__cpu_attn, dpar__cpu_attn_bwd_q, dpar__cpu_attn_bwd_kv, float,
               dpar__cpu_sgemm, dpar__exp_shifted_f32, dpar__attn_dsrow_f32, dpar__rowmax_f32)
DPAR__ATTN_DEF(dpar__attn64_probs, dpar__attn64_dscores, dpar__cpu64_attn, dpar__cpu64_attn_bwd_q,
               dpar__cpu64_attn_bwd_kv, double, dpar__cpu64_gemm, dpar__exp_shifted_f64, dpar__attn_dsrow_f64,
               dpar__rowmax_f64)
#undef DPAR__ATTN_DEF
static dpar_status dpar__cpu_op_attn(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    return dpar__cpu_attn(c, dev, op);
}
static dpar_status dpar__cpu_op_attn_bwd_q(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    return dpar__cpu_attn_bwd_q(c, dev, op);
}
static dpar_status dpar__cpu_op_attn_bwd_kv(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    return dpar__cpu_attn_bwd_kv(c, dev, op);
}
/* The fused AdamW update on elements [lo, hi) (formula at dpar_adamw_desc), one body for f32 and
   f64: element type T, its sqrt, and the bias corrections c1, c2 (f64: the unrounded doubles that
   dpar__adamw_run keeps in p[0..1]; f32: f[6..7]). */
#define DPAR__ADAMW_RANGE(NAME, T, SQRT, C1, C2)                                                           \
    static void NAME(const void *arg, int64_t lo, int64_t hi) {                                            \
        const dpar__op *op = (const dpar__op *)arg;                                                        \
        const T lr = op->f[0], b1 = op->f[1], b2 = op->f[2], eps = op->f[3], wd = op->f[4], cs = op->f[5]; \
        const T c1 = (C1), c2 = (C2), ob1 = (T)1 - b1, ob2 = (T)1 - b2;                                    \
        T *p = (T *)op->dst->mem, *m = (T *)op->dst2->mem, *v = (T *)op->dst3->mem;                        \
        const T *gr = (const T *)op->src0->mem;                                                            \
        for (int64_t i = lo; i < hi; i++) {                                                                \
            T g = gr[i] * cs;                                                                              \
            T mi = b1 * m[i] + ob1 * g, vi = b2 * v[i] + ob2 * (g * g);                                    \
            m[i] = mi;                                                                                     \
            v[i] = vi;                                                                                     \
            T u = (mi * c1) / (SQRT(vi * c2) + eps) + wd * p[i];                                           \
            p[i] = p[i] - lr * u;                                                                          \
        }                                                                                                  \
    }
DPAR__ADAMW_RANGE(dpar__adamw_range, float, sqrtf, op->f[6], op->f[7])
#ifdef DPAR__X86_SIMD
/* dpar__adamw_range's f32 body on 16 lanes, for the leading multiple of 16 elements of [lo, hi):
   the same multiplies, adds, divide and (correctly rounded) square root in the same order, no
   fused multiply-add, so the same bits; the scalar loop, which sqrtf's errno path keeps from
   being vectorised, cost 14% of the CNN step's CPU time on 4 devices (each updates every
   parameter). Returns the end of what it did. */
__attribute__((target("avx512f"))) static int64_t dpar__adamw_avx512(const dpar__op *op, int64_t lo, int64_t hi) {
    const float b1 = op->f[1], b2 = op->f[2];
    const __m512 lr = _mm512_set1_ps(op->f[0]), vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2),
                 eps = _mm512_set1_ps(op->f[3]), wd = _mm512_set1_ps(op->f[4]), cs = _mm512_set1_ps(op->f[5]),
                 c1 = _mm512_set1_ps(op->f[6]), c2 = _mm512_set1_ps(op->f[7]), ob1 = _mm512_set1_ps(1.0f - b1),
                 ob2 = _mm512_set1_ps(1.0f - b2);
    float *p = (float *)op->dst->mem, *m = (float *)op->dst2->mem, *v = (float *)op->dst3->mem;
    const float *gr = (const float *)op->src0->mem;
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16) {
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(gr + i), cs), pi = _mm512_loadu_ps(p + i);
        __m512 mi = _mm512_add_ps(_mm512_mul_ps(vb1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(ob1, g));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(vb2, _mm512_loadu_ps(v + i)), _mm512_mul_ps(ob2, _mm512_mul_ps(g, g)));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        __m512 u = _mm512_div_ps(_mm512_mul_ps(mi, c1), _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vi, c2)), eps));
        u = _mm512_add_ps(u, _mm512_mul_ps(wd, pi));
        _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_mul_ps(lr, u)));
    }
    return i;
}
#endif
/* the double that the core kept bit for bit in op->p[i] (an f64 op's scalar that float f[] would round) */
static double dpar__op_pd(const dpar__op *op, int i) {
    double c;
    memcpy(&c, &op->p[i], sizeof c);
    return c;
}
DPAR__ADAMW_RANGE(dpar__adamw64_range, double, sqrt, dpar__op_pd(op, 0), dpar__op_pd(op, 1))
#undef DPAR__ADAMW_RANGE
/* the f32 update on [lo, hi): its leading multiple of 16 on AVX-512 lanes where the CPU has them */
static void dpar__adamw32_range(const void *arg, int64_t lo, int64_t hi) {
    int64_t i = lo;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx512f")) i = dpar__adamw_avx512((const dpar__op *)arg, lo, hi);
#endif
    dpar__adamw_range(arg, i, hi);
}
static dpar_status dpar__cpu_op_adamw(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    if (op->dst->dtype == DPAR_F64)
        dpar__cpu_parallel(c, dev, op->n, 16, dpar__adamw64_range, op);
    else
        dpar__cpu_parallel(c, dev, op->n, 16, dpar__adamw32_range, op);
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_embed(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    const int32_t *idx = (const int32_t *)x1;
    int64_t K = op->m, D = op->n, bad = dpar__first_bad_index(idx, K, op->k, 0, 0);
    if (bad >= 0) return dpar__bad_index((int)op->p[2], bad, idx[bad], op->k);
    size_t es = dpar_dtype_size(op->dst->dtype); /* f32 or f64: rows are copied whole */
    for (int64_t i = 0; i < K && D > 0; i++)
        memcpy((char *)op->dst->mem + (size_t)(i * D) * es, (const char *)op->src0->mem + (size_t)(idx[i] * D) * es,
               (size_t)D * es);
    return DPAR_OK;
}
static dpar_status dpar__cpu_op_embed_bwd(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    const int32_t *idx = (const int32_t *)x1;
    int64_t K = op->m, D = op->n, bad = dpar__first_bad_index(idx, K, op->k, 0, 0);
    if (bad >= 0) return dpar__bad_index((int)op->p[2], bad, idx[bad], op->k);
#define DPAR__EMBED_ADD(T)                                                                            \
    for (int64_t i = 0; i < K; i++) { /* positions in order: the GPU kernels add in the same order */ \
        T *row = (T *)op->dst->mem + (int64_t)idx[i] * D;                                             \
        for (int64_t d = 0; d < D; d++) row[d] += ((const T *)op->src0->mem)[i * D + d];              \
    }
    if (op->dst->dtype == DPAR_F64) {
        DPAR__EMBED_ADD(double)
    } else {
        DPAR__EMBED_ADD(float)
    }
#undef DPAR__EMBED_ADD
    return DPAR_OK;
}
/* y = x scale where kept, else 0: f32 (scale f[0]) and f64 (the unrounded scale in p[6]) */
#define DPAR__DROPOUT(T, SCALE)                                             \
    do {                                                                    \
        const T scale = (SCALE), *x = (const T *)op->src0->mem;             \
        T *yy = (T *)op->dst->mem;                                          \
        for (int64_t b = 0; b * 4 < op->n; b++) {                           \
            uint32_t w[4];                                                  \
            dpar__dropout_words(op, b, w);                                  \
            for (int64_t e = b * 4; e < b * 4 + 4 && e < op->n; e++)        \
                yy[e] = dpar__dropout_keep(op, w, e) ? x[e] * scale : (T)0; \
        }                                                                   \
    } while (0)
static dpar_status dpar__cpu_op_dropout(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    if (op->dst->dtype == DPAR_F64)
        DPAR__DROPOUT(double, dpar__op_pd(op, 6));
    else
        DPAR__DROPOUT(float, op->f[0]);
    return DPAR_OK;
}
#undef DPAR__DROPOUT
/* >>conv-pool kinds */
static dpar_status dpar__cpu_op_conv2d(DPAR__CPU_OP_ARGS) {
    return dpar__cpu_conv2d(c, dev, op, DPAR__CONV_FWD, (float *)(uintptr_t)x0, (float *)(uintptr_t)x1, y);
}
static dpar_status dpar__cpu_op_conv2d_bwd_input(DPAR__CPU_OP_ARGS) { /* dx = y, dy = x0, w = x1 */
    return dpar__cpu_conv2d(c, dev, op, DPAR__CONV_BWD_INPUT, y, (float *)(uintptr_t)x1, (float *)(uintptr_t)x0);
}
static dpar_status dpar__cpu_op_conv2d_bwd_kernel(DPAR__CPU_OP_ARGS) { /* dw = y, dy = x0, x = x1 */
    return dpar__cpu_conv2d(c, dev, op, DPAR__CONV_BWD_KERNEL, (float *)(uintptr_t)x1, y, (float *)(uintptr_t)x0);
}
static dpar_status dpar__cpu_op_avg_pool(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    return dpar__cpu_pool2d(c, dev, op, 0, 0);
}
static dpar_status dpar__cpu_op_avg_pool_bwd(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    return dpar__cpu_pool2d(c, dev, op, 0, 1);
}
static dpar_status dpar__cpu_op_max_pool(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    return dpar__cpu_pool2d(c, dev, op, 1, 0);
}
static dpar_status dpar__cpu_op_max_pool_bwd(DPAR__CPU_OP_ARGS) {
    DPAR__CPU_OP_UNUSED;
    return dpar__cpu_pool2d(c, dev, op, 1, 1);
}
#undef DPAR__CPU_OP_ARGS
#undef DPAR__CPU_OP_UNUSED

/* in dpar__op_kind order (C++ has no array designators; the size is checked below) */
static const dpar__cpu_op_fn dpar__cpu_ops[] = {
    dpar__cpu_op_matmul,       /* DPAR__OP_MATMUL */
    dpar__cpu_op_bias_add,     /* DPAR__OP_BIAS_ADD */
    dpar__cpu_op_bias_grad,    /* DPAR__OP_BIAS_GRAD */
    dpar__cpu_op_relu,         /* DPAR__OP_RELU */
    dpar__cpu_op_relu_bwd,     /* DPAR__OP_RELU_BWD */
    dpar__cpu_op_softmax_xent, /* DPAR__OP_SOFTMAX_XENT */
    dpar__cpu_op_mse,          /* DPAR__OP_MSE */
    dpar__cpu_op_axpy,         /* DPAR__OP_AXPY */
    dpar__cpu_op_scale,        /* DPAR__OP_SCALE */
    dpar__cpu_op_fill,         /* DPAR__OP_FILL */
    dpar__cpu_op_copy,         /* DPAR__OP_COPY */
    dpar__cpu_op_cast,         /* DPAR__OP_CAST */
    dpar__cpu_op_sum,          /* DPAR__OP_SUM */
    dpar__cpu_op_sumsq,        /* DPAR__OP_SUMSQ */
    dpar__cpu_op_sgd,          /* DPAR__OP_SGD */
    /* >>norm-attn kinds */
    dpar__cpu_op_norm,           /* DPAR__OP_NORM */
    dpar__cpu_op_norm_bwd,       /* DPAR__OP_NORM_BWD */
    dpar__cpu_op_matmul_batched, /* DPAR__OP_MATMUL_BATCHED */
    dpar__cpu_op_attn,           /* DPAR__OP_ATTN */
    dpar__cpu_op_attn_bwd_q,     /* DPAR__OP_ATTN_BWD_Q */
    dpar__cpu_op_attn_bwd_kv,    /* DPAR__OP_ATTN_BWD_KV */
    /* >>optim kinds */
    dpar__cpu_op_adamw,     /* DPAR__OP_ADAMW */
    dpar__cpu_op_embed,     /* DPAR__OP_EMBED */
    dpar__cpu_op_embed_bwd, /* DPAR__OP_EMBED_BWD */
    dpar__cpu_op_dropout,   /* DPAR__OP_DROPOUT */
    dpar__cpu_op_unary,     /* DPAR__OP_UNARY */
    dpar__cpu_op_unary,     /* DPAR__OP_UNARY_BWD */
    dpar__cpu_op_binary,    /* DPAR__OP_BINARY */
    dpar__cpu_op_reduce,    /* DPAR__OP_REDUCE */
    dpar__cpu_op_where,     /* DPAR__OP_WHERE */
    dpar__cpu_op_softmax,   /* DPAR__OP_SOFTMAX */
    dpar__cpu_op_softmax,   /* DPAR__OP_SOFTMAX_BWD */
    dpar__cpu_op_strided,   /* DPAR__OP_STRIDED */
    /* >>conv-pool kinds */
    dpar__cpu_op_conv2d,            /* DPAR__OP_CONV2D */
    dpar__cpu_op_conv2d_bwd_input,  /* DPAR__OP_CONV2D_BWD_INPUT */
    dpar__cpu_op_conv2d_bwd_kernel, /* DPAR__OP_CONV2D_BWD_KERNEL */
    dpar__cpu_op_avg_pool,          /* DPAR__OP_AVG_POOL */
    dpar__cpu_op_avg_pool_bwd,      /* DPAR__OP_AVG_POOL_BWD */
    dpar__cpu_op_max_pool,          /* DPAR__OP_MAX_POOL */
    dpar__cpu_op_max_pool_bwd,      /* DPAR__OP_MAX_POOL_BWD */
};
typedef char dpar__cpu_ops_cover_every_kind[sizeof dpar__cpu_ops / sizeof dpar__cpu_ops[0] == DPAR__OP_COUNT ? 1 : -1];

/* >>cpu half storage ==========================================================
   The layer ops with f16 / bf16 tensors (see >>half storage (checks)): each
   16-bit operand widened (exactly) into an f32 copy, the f32 kernel run on the
   copies, so it accumulates as the f32 op does (f32, double where that kernel
   uses double), then each 16-bit output rounded once to nearest even. An
   operand given twice maps to one copy, so the kernel sees the same aliasing.
   The f32 ops never come here: their results stay bit for bit. */
static int dpar__is_half(const dpar_buffer *b) {
    return b && (b->dtype == DPAR_F16 || b->dtype == DPAR_BF16);
}
static int dpar__cpu_half_kind(dpar__op_kind k) {
    switch (k) {
    case DPAR__OP_REDUCE:
    case DPAR__OP_BIAS_GRAD:
    case DPAR__OP_NORM:
    case DPAR__OP_NORM_BWD:
    case DPAR__OP_ATTN:
    case DPAR__OP_ATTN_BWD_Q:
    case DPAR__OP_ATTN_BWD_KV:
    case DPAR__OP_SOFTMAX:
    case DPAR__OP_SOFTMAX_BWD:
    case DPAR__OP_CONV2D:
    case DPAR__OP_CONV2D_BWD_INPUT:
    case DPAR__OP_CONV2D_BWD_KERNEL:
    case DPAR__OP_AVG_POOL:
    case DPAR__OP_AVG_POOL_BWD:
    case DPAR__OP_MAX_POOL:
    case DPAR__OP_MAX_POOL_BWD: return 1;
    default: return 0;
    }
}
static int dpar__op_has_half(const dpar__op *op) {
    return dpar__is_half(op->dst) || dpar__is_half(op->dst2) || dpar__is_half(op->dst3) || dpar__is_half(op->dst4) ||
           dpar__is_half(op->src0) || dpar__is_half(op->src1) || dpar__is_half(op->src2) || dpar__is_half(op->src3);
}
static dpar_status dpar__cpu_op(void *st, int dev, const dpar__op *op);
static dpar_status dpar__cpu_op_half(void *st, int dev, const dpar__op *op) {
    const dpar_buffer *orig[DPAR__OP_BUFS] = { op->dst,  op->dst2, op->dst3, op->dst4,
                                               op->src0, op->src1, op->src2, op->src3 };
    const dpar_buffer *map[DPAR__OP_BUFS];
    dpar_buffer wide[DPAR__OP_BUFS];
    dpar_status s = DPAR_OK;
    int nw = 0;
    for (int i = 0; i < DPAR__OP_BUFS && !s; i++) {
        int j = 0;
        while (j < i && orig[j] != orig[i]) j++;
        map[i] = j < i ? map[j] : orig[i];
        if (j < i || !dpar__is_half(orig[i])) continue;
        const dpar_buffer *b = orig[i];
        float *m = (float *)DPAR_MALLOC((size_t)(b->count + 1) * sizeof(float));
        if (!m) {
            s = dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory widening %lld %s elements to f32",
                          dpar__op_name(op->kind), (long long)b->count, dpar_dtype_name(b->dtype));
            break;
        }
        for (int64_t e = 0; e < b->count; e++) m[e] = dpar__load_f(b->mem, b->dtype, e);
        wide[nw] = *b;
        wide[nw].dtype = DPAR_F32;
        wide[nw].nbytes = (size_t)b->count * sizeof(float);
        wide[nw].mem = m;
        map[i] = &wide[nw++];
    }
    if (!s) {
        dpar__op w = *op;
        w.dst = (dpar_buffer *)(uintptr_t)map[0], w.dst2 = (dpar_buffer *)(uintptr_t)map[1];
        w.dst3 = (dpar_buffer *)(uintptr_t)map[2], w.dst4 = (dpar_buffer *)(uintptr_t)map[3];
        w.src0 = map[4], w.src1 = map[5], w.src2 = map[6], w.src3 = map[7];
        s = dpar__cpu_op(st, dev, &w);
    }
    for (int i = 0; i < DPAR__OP_DSTS && !s; i++) { /* the outputs, rounded once */
        if (!dpar__is_half(orig[i])) continue;
        const float *m = (const float *)map[i]->mem;
        uint16_t *h = (uint16_t *)orig[i]->mem;
        for (int64_t e = 0; e < orig[i]->count; e++)
            h[e] = orig[i]->dtype == DPAR_F16 ? dpar_f32_to_f16(m[e]) : dpar_f32_to_bf16(m[e]);
    }
    for (int i = 0; i < nw; i++) DPAR_FREE(wide[i].mem);
    return s;
}

/* >>cpu f64 ===================================================================
   The cpu backend's f64 kernels (see >>f64 api), one per kind, on double
   storage with every intermediate in double. The math is the f32 reference's
   own (dpar__unary_f / dpar__unary_d / dpar__red_step, the same accumulation
   order); only the loads and stores differ. The f32 kernels never come here,
   so their results stay bit for bit; they are being vectorised separately. */
static int dpar__is_f64(const dpar_buffer *b) {
    return b && b->dtype == DPAR_F64;
}
static int dpar__op_has_f64(const dpar__op *op) {
    return dpar__is_f64(op->dst) || dpar__is_f64(op->dst2) || dpar__is_f64(op->dst3) || dpar__is_f64(op->dst4) ||
           dpar__is_f64(op->src0) || dpar__is_f64(op->src1) || dpar__is_f64(op->src2) || dpar__is_f64(op->src3);
}
#define DPAR__D(b)  ((double *)(b)->mem)
#define DPAR__CD(b) ((b) ? (const double *)(b)->mem : (const double *)NULL)
/* C[M,N] = alpha op(A) op(B) + beta C on rows [lo, hi), op(A) = A [M,K] and op(B) = B [K,N] stored
   dense (dpar__cpu64_matmul transposes first). For each block of DPAR__DGEMM_KB x DPAR__DGEMM_NB of B
   (256 KiB, L2), 4 x 8 tiles of C are summed in registers over the block's k (AVX2 FMA where the CPU
   has it, else plain C), then added to C once; ragged edges take the plain loop with their own bounds. */
enum { DPAR__DGEMM_KB = 128, DPAR__DGEMM_NB = 256, DPAR__DGEMM_MR = 4, DPAR__DGEMM_NR = 8 };
static void dpar__cpu64_tile(double *C, const double *A, const double *B, int64_t N, int64_t K, int64_t p0, int64_t p1,
                             double alpha, int64_t mr, int64_t nr) {
    double acc[DPAR__DGEMM_MR][DPAR__DGEMM_NR];
    memset(acc, 0, sizeof acc);
    if (mr == DPAR__DGEMM_MR && nr == DPAR__DGEMM_NR) {
        for (int64_t p = p0; p < p1; p++)
            for (int r = 0; r < DPAR__DGEMM_MR; r++)
                for (int c = 0; c < DPAR__DGEMM_NR; c++) acc[r][c] += A[r * K + p] * B[p * N + c];
    } else {
        for (int64_t p = p0; p < p1; p++)
            for (int64_t r = 0; r < mr; r++)
                for (int64_t c = 0; c < nr; c++) acc[r][c] += A[r * K + p] * B[p * N + c];
    }
    for (int64_t r = 0; r < mr; r++)
        for (int64_t c = 0; c < nr; c++) C[r * N + c] += alpha * acc[r][c];
}
#ifdef DPAR__X86_SIMD
/* dpar__cpu64_tile's full 4 x 8 tile with AVX2 FMA: 8 accumulators, B's row loaded once per k */
__attribute__((target("avx2,fma"))) static void dpar__cpu64_tile_fma(double *C, const double *A, const double *B,
                                                                     int64_t N, int64_t K, int64_t p0, int64_t p1,
                                                                     double alpha) {
    __m256d acc[DPAR__DGEMM_MR][2];
    for (int r = 0; r < DPAR__DGEMM_MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_pd();
    for (int64_t p = p0; p < p1; p++) {
        __m256d b0 = _mm256_loadu_pd(B + p * N), b1 = _mm256_loadu_pd(B + p * N + 4);
        for (int r = 0; r < DPAR__DGEMM_MR; r++) {
            __m256d a = _mm256_broadcast_sd(A + r * K + p);
            acc[r][0] = _mm256_fmadd_pd(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_pd(a, b1, acc[r][1]);
        }
    }
    __m256d al = _mm256_set1_pd(alpha);
    for (int r = 0; r < DPAR__DGEMM_MR; r++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_pd(C + r * N + 4 * h, _mm256_fmadd_pd(al, acc[r][h], _mm256_loadu_pd(C + r * N + 4 * h)));
}
#endif
static void dpar__cpu64_gemm_rows(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    const double *A = DPAR__CD(op->src0), *B = DPAR__CD(op->src1);
    double *C = DPAR__D(op->dst), alpha = (double)op->f[0], beta = (double)op->f[1];
    int64_t N = op->n, K = op->k;
#ifdef DPAR__X86_SIMD
    int fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    for (int64_t i = lo; i < hi; i++)
        for (int64_t j = 0; j < N; j++) C[i * N + j] = beta == 0.0 ? 0.0 : beta * C[i * N + j];
    for (int64_t j0 = 0; j0 < N; j0 += DPAR__DGEMM_NB) {
        int64_t j1 = j0 + DPAR__DGEMM_NB < N ? j0 + (int64_t)DPAR__DGEMM_NB : N;
        for (int64_t p0 = 0; p0 < K; p0 += DPAR__DGEMM_KB) {
            int64_t p1 = p0 + DPAR__DGEMM_KB < K ? p0 + (int64_t)DPAR__DGEMM_KB : K;
            for (int64_t i = lo; i < hi; i += DPAR__DGEMM_MR)
                for (int64_t j = j0; j < j1; j += DPAR__DGEMM_NR) {
                    int64_t mr = hi - i < DPAR__DGEMM_MR ? hi - i : (int64_t)DPAR__DGEMM_MR;
                    int64_t nr = j1 - j < DPAR__DGEMM_NR ? j1 - j : (int64_t)DPAR__DGEMM_NR;
#ifdef DPAR__X86_SIMD
                    if (fma && mr == DPAR__DGEMM_MR && nr == DPAR__DGEMM_NR) {
                        dpar__cpu64_tile_fma(C + i * N + j, A + i * K, B + j, N, K, p0, p1, alpha);
                        continue;
                    }
#endif
                    dpar__cpu64_tile(C + i * N + j, A + i * K, B + j, N, K, p0, p1, alpha, mr, nr);
                }
        }
    }
}
/* dst [r, c] = src^T (src [c, r]) */
static void dpar__cpu64_transpose(double *dst, const double *src, int64_t r, int64_t c) {
    for (int64_t i = 0; i < c; i++)
        for (int64_t j = 0; j < r; j++) dst[j * c + i] = src[i * r + j];
}
static dpar_status dpar__cpu64_matmul(dpar__cpu *c, int dev, const dpar__op *op) {
    int64_t M = op->m, N = op->n, K = op->k;
    dpar_buffer a = *op->src0, b = *op->src1;
    double *ta = op->trans_a ? (double *)DPAR_MALLOC((size_t)(M * K + 1) * sizeof(double)) : NULL;
    double *tb = op->trans_b ? (double *)DPAR_MALLOC((size_t)(K * N + 1) * sizeof(double)) : NULL;
    if ((op->trans_a && !ta) || (op->trans_b && !tb)) {
        DPAR_FREE(ta);
        DPAR_FREE(tb);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_matmul: out of host memory transposing an f64 operand");
    }
    if (ta) dpar__cpu64_transpose(ta, DPAR__CD(op->src0), M, K), a.mem = ta;
    if (tb) dpar__cpu64_transpose(tb, DPAR__CD(op->src1), K, N), b.mem = tb;
    dpar__op w = *op;
    w.src0 = &a;
    w.src1 = &b;
    dpar__cpu_parallel(c, dev, M, 2 * K * N + 1, dpar__cpu64_gemm_rows, &w);
    DPAR_FREE(ta);
    DPAR_FREE(tb);
    return DPAR_OK;
}
/* dpar__cpu_sgemm's call in double, for the layer kernels shared with f32 (conv2d, batched matmul,
   attention): dense C [M,N] = alpha op(A) op(B) + beta C through dpar__cpu64_matmul (alpha and beta
   are floats, as dpar__op carries them). Out of host memory for a transposed copy, the plain
   triple loop runs instead (the same sums, summed in k order in one pass). */
static void dpar__cpu64_gemm(dpar__cpu *c, int dev, int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha,
                             const double *A, const double *B, float beta, double *C) {
    dpar_buffer a, b, y;
    memset(&a, 0, sizeof a);
    a.dtype = DPAR_F64;
    b = y = a;
    a.mem = (void *)(uintptr_t)A, b.mem = (void *)(uintptr_t)B, y.mem = C;
    dpar__op op;
    dpar__op_init(&op, DPAR__OP_MATMUL, &y);
    op.src0 = &a, op.src1 = &b;
    op.m = M, op.n = N, op.k = K;
    op.trans_a = ta != 0, op.trans_b = tb != 0;
    op.f[0] = alpha, op.f[1] = beta;
    if (!dpar__cpu64_matmul(c, dev, &op)) return;
    dpar__clear_error();
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t p = 0; p < K; p++) acc += A[ta ? p * M + i : i * K + p] * B[tb ? j * K + p : p * N + j];
            C[i * N + j] = (beta == 0.0f ? 0.0 : (double)beta * C[i * N + j]) + (double)alpha * acc;
        }
}
static void dpar__cpu64_unary_range(const void *arg, int64_t lo, int64_t hi) {
    const dpar__op *op = (const dpar__op *)arg;
    int u = (int)op->p[0];
    double s = (double)op->f[0], *y = DPAR__D(op->dst);
    const double *x = DPAR__CD(op->src0), *dy = DPAR__CD(op->src1);
    for (int64_t i = lo; i < hi; i++)
        y[i] = op->kind == DPAR__OP_UNARY ? dpar__unary_f(u, x[i], s) : dy[i] * dpar__unary_d(u, x[i], s);
}
/* as dpar__cpu_op_binary: y[p14 + i] = a[p12 + i.sa] op b[p13 + i.sb] over the 4-d shape p[0..3] */
static void dpar__cpu64_binary(const dpar__op *op) {
    const int64_t *p = op->p;
    int bop = (int)p[15];
    double *o = DPAR__D(op->dst) + p[14];
    const double *x0 = DPAR__CD(op->src0), *x1 = DPAR__CD(op->src1);
    for (int64_t i0 = 0; i0 < p[0]; i0++)
        for (int64_t i1 = 0; i1 < p[1]; i1++)
            for (int64_t i2 = 0; i2 < p[2]; i2++)
                for (int64_t i3 = 0; i3 < p[3]; i3++, o++) {
                    double va = x0[p[12] + i0 * p[4] + i1 * p[5] + i2 * p[6] + i3 * p[7]];
                    double vb = x1[p[13] + i0 * p[8] + i1 * p[9] + i2 * p[10] + i3 * p[11]];
                    *o = bop == DPAR_BINARY_ADD   ? va + vb
                         : bop == DPAR_BINARY_SUB ? va - vb
                         : bop == DPAR_BINARY_MUL ? va * vb
                                                  : va / vb;
                }
}
/* DPAR__OP_REDUCE (geometry as dpar__cpu_reduce_range) as one pass over x in storage order: element
   c (4-d) folds into output o = c . ks (dense over the kept dims) at slice position r = c . rs (dense
   over the reduced dims). Each slice sees its elements in the order of the f32 kernel. */
static dpar_status dpar__cpu64_reduce(const dpar__op *op) {
    const int64_t *p = op->p;
    int red = (int)p[12];
    int64_t ks[4], rs[4], nout = 1, R = 1;
    for (int d = 3; d >= 0; d--) {
        int r = (int)(p[13] >> d & 1);
        ks[d] = r ? 0 : nout;
        rs[d] = r ? R : 0;
        nout *= r ? 1 : p[d];
        R *= r ? p[d] : 1;
    }
    double *acc = (double *)DPAR_MALLOC((size_t)(nout + 1) * sizeof(double));
    int64_t *best = (int64_t *)DPAR_MALLOC((size_t)(nout + 1) * sizeof(int64_t));
    if (!acc || !best) {
        DPAR_FREE(acc);
        DPAR_FREE(best);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_reduce: out of host memory (%lld f64 results)", (long long)nout);
    }
    for (int64_t o = 0; o < nout; o++) acc[o] = 0.0, best[o] = -1;
    const double *x = DPAR__CD(op->src0), *a = DPAR__CD(op->src1), *b = DPAR__CD(op->src2);
    double *y = DPAR__D(op->dst);
    for (int pass = 0; pass < (red == DPAR__RED_MAX_BWD ? 2 : 1); pass++) {
        int64_t xo = 0;
        for (int64_t i0 = 0; i0 < p[0]; i0++)
            for (int64_t i1 = 0; i1 < p[1]; i1++)
                for (int64_t i2 = 0; i2 < p[2]; i2++)
                    for (int64_t i3 = 0; i3 < p[3]; i3++, xo++) {
                        int64_t o = i0 * ks[0] + i1 * ks[1] + i2 * ks[2] + i3 * ks[3];
                        int64_t r = i0 * rs[0] + i1 * rs[1] + i2 * rs[2] + i3 * rs[3];
                        if (pass) {
                            y[xo] = r == best[o] ? a[o] : 0.0;
                            continue;
                        }
                        int64_t ao = i0 * p[4] + i1 * p[5] + i2 * p[6] + i3 * p[7];
                        int64_t bo = i0 * p[8] + i1 * p[9] + i2 * p[10] + i3 * p[11];
                        dpar__red_step(red, &acc[o], &best[o], r, x[xo], a ? a[ao] : 0.0, b ? b[bo] : 0.0);
                    }
    }
    for (int64_t o = 0; o < nout && red != DPAR__RED_MAX_BWD; o++) {
        if (red == DPAR_REDUCE_ARGMAX)
            ((int32_t *)op->dst->mem)[o] = (int32_t)best[o];
        else
            y[o] = red == DPAR_REDUCE_MEAN ? acc[o] / (double)R : acc[o];
    }
    DPAR_FREE(acc);
    DPAR_FREE(best);
    return DPAR_OK;
}
/* rows of n: softmax / log_softmax (p[0]) and their backward (SOFTMAX_BWD: src0 = dy, src1 = y) */
static void dpar__cpu64_softmax(const dpar__op *op) {
    int64_t n = op->n;
    int lg = op->p[0] != 0;
    const double *x0 = DPAR__CD(op->src0), *x1 = DPAR__CD(op->src1);
    for (int64_t r = 0; r < op->m; r++) {
        const double *x = x0 + r * n, *yy = x1 ? x1 + r * n : NULL;
        double *o = DPAR__D(op->dst) + r * n, acc = 0.0, mx = -INFINITY;
        if (op->kind == DPAR__OP_SOFTMAX_BWD) {
            for (int64_t j = 0; j < n; j++) acc += lg ? x[j] : x[j] * yy[j];
            for (int64_t j = 0; j < n; j++) o[j] = lg ? x[j] - exp(yy[j]) * acc : yy[j] * (x[j] - acc);
            continue;
        }
        for (int64_t j = 0; j < n; j++) mx = (x[j] > mx || x[j] != x[j]) ? x[j] : mx;
        for (int64_t j = 0; j < n; j++) acc += exp(x[j] - mx);
        double lse = log(acc);
        for (int64_t j = 0; j < n; j++) o[j] = lg ? (x[j] - mx) - lse : exp(x[j] - mx) / acc;
    }
}
/* softmax cross-entropy (the formula of dpar__cpu_op_softmax_xent, all in double) */
static dpar_status dpar__cpu64_xent(const dpar__op *op) {
    const int32_t *lab = (const int32_t *)op->src1->mem;
    const double *z0 = DPAR__CD(op->src0), a = (double)op->f[0];
    double *g = op->dst2 ? DPAR__D(op->dst2) : NULL, total = 0.0;
    int64_t M = op->m, C = op->n, counted = 0;
    int ign = (int)op->p[0];
    int32_t ignore = (int32_t)op->p[1];
    int64_t bad = dpar__first_bad_index(lab, M, C, ign, ignore);
    if (bad >= 0) return dpar__bad_index((int)op->p[2], bad, lab[bad], C);
    for (int64_t i = 0; i < M; i++) counted += !(ign && lab[i] == ignore);
    for (int64_t i = 0; i < M; i++) {
        const double *z = z0 + i * C;
        int32_t l = lab[i];
        if (ign && l == ignore) {
            for (int64_t j = 0; j < C && g; j++) g[i * C + j] = 0.0;
            continue;
        }
        double mx = -INFINITY, se = 0.0, zsum = 0.0;
        for (int64_t j = 0; j < C; j++) mx = (z[j] > mx || z[j] != z[j]) ? z[j] : mx;
        for (int64_t j = 0; j < C; j++) se += exp(z[j] - mx), zsum += z[j] - mx;
        double lse_rel = log(se), nll = (mx - z[l]) + lse_rel;
        total += a == 0.0 ? nll : (1.0 - a) * nll + a * (lse_rel - zsum / (double)C);
        for (int64_t j = 0; j < C && g; j++)
            g[i * C + j] = (exp(z[j] - mx) / se - ((j == l ? 1.0 - a : 0.0) + a / (double)C)) / (double)counted;
    }
    DPAR__D(op->dst)[0] = counted ? total / (double)counted : 0.0;
    return DPAR_OK;
}
/* layer_norm / rms_norm (p[0]) forward: the row statistics of dpar__cpu_norm_row, in double */
static void dpar__cpu64_norm(const dpar__op *op) {
    const double *w = DPAR__CD(op->src1), *b = DPAR__CD(op->src2);
    double *st = op->dst2 ? DPAR__D(op->dst2) : NULL;
    int64_t n = op->n;
    for (int64_t i = 0; i < op->m; i++) {
        const double *x = DPAR__CD(op->src0) + i * n;
        double *y = DPAR__D(op->dst) + i * n, mu = 0.0, ss = 0.0, sh = 0.0;
        for (int64_t j = 0; j < n && !op->p[0]; j++) sh += x[j] - x[0];
        if (!op->p[0] && n > 0) mu = x[0] + sh / (double)n;
        for (int64_t j = 0; j < n; j++) ss += (x[j] - mu) * (x[j] - mu);
        double rs = 1.0 / sqrt((n ? ss / (double)n : 0.0) + (double)op->f[0]);
        for (int64_t j = 0; j < n; j++) y[j] = (x[j] - mu) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
        if (st) st[2 * i] = mu, st[2 * i + 1] = rs;
    }
}
/* their backward (p[1]: dx not wanted; dst is then dw or db): the f32 kernel's formula */
static dpar_status dpar__cpu64_norm_bwd(const dpar__op *op) {
    const double *w = DPAR__CD(op->src2), *st = DPAR__CD(op->src3);
    double *dw = op->dst2 ? DPAR__D(op->dst2) : NULL, *db = op->dst3 ? DPAR__D(op->dst3) : NULL;
    int64_t n = op->n;
    double *acc = (double *)DPAR_MALLOC((size_t)(2 * n + 1) * sizeof(double)); /* dw, db sums */
    if (!acc)
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "norm backward: out of host memory (%lld columns)", (long long)n);
    for (int64_t j = 0; j < 2 * n; j++) acc[j] = 0.0;
    for (int64_t i = 0; i < op->m; i++) { /* row i of dy is read before row i of dx is written (dx may alias dy) */
        const double *dy = DPAR__CD(op->src0) + i * n, *x = DPAR__CD(op->src1) + i * n;
        double mu = st[2 * i], rs = st[2 * i + 1], mg = 0.0, mgx = 0.0;
        for (int64_t j = 0; j < n; j++) {
            double xh = (x[j] - mu) * rs, g = dy[j] * (w ? w[j] : 1.0);
            mg += g;
            mgx += g * xh;
            acc[j] += dy[j] * xh;
            acc[n + j] += dy[j];
        }
        mg = op->p[0] ? 0.0 : mg / (double)n;
        mgx /= (double)n;
        for (int64_t j = 0; j < n && !op->p[1]; j++)
            DPAR__D(op->dst)[i * n + j] = rs * (dy[j] * (w ? w[j] : 1.0) - mg - (x[j] - mu) * rs * mgx);
    }
    for (int64_t j = 0; j < n; j++) {
        if (dw) dw[j] = acc[j];
        if (db) db[j] = acc[n + j];
    }
    DPAR_FREE(acc);
    return DPAR_OK;
}
/* dpar_cast with an f64 side: through double (to f16 / bf16 via f32, so rounded twice) */
static void dpar__cpu64_cast(const dpar__op *op) {
    dpar_dtype ts = op->src0->dtype, td = op->dst->dtype;
    const void *x = op->src0->mem;
    void *y = op->dst->mem;
    for (int64_t i = 0; i < op->n; i++) {
        double v = ts == DPAR_F64   ? ((const double *)x)[i]
                   : ts == DPAR_I32 ? (double)((const int32_t *)x)[i]
                                    : (double)dpar__load_f(x, ts, i);
        switch (td) {
        case DPAR_F64: ((double *)y)[i] = v; break;
        case DPAR_F32: ((float *)y)[i] = (float)v; break;
        case DPAR_F16: ((uint16_t *)y)[i] = dpar_f32_to_f16((float)v); break;
        case DPAR_BF16: ((uint16_t *)y)[i] = dpar_f32_to_bf16((float)v); break;
        case DPAR_I32:
            ((int32_t *)y)[i] = v != v               ? 0
                                : v >= 2147483647.0  ? INT32_MAX
                                : v <= -2147483648.0 ? INT32_MIN
                                                     : (int32_t)v;
            break;
        default: break;
        }
    }
}
/* the elementwise and row kinds that are short enough to live here whole */
static void dpar__cpu64_small(const dpar__op *op) {
    double *y = DPAR__D(op->dst), f = (double)op->f[0], s = 0.0;
    const double *x0 = DPAR__CD(op->src0), *x1 = DPAR__CD(op->src1);
    const int64_t *p = op->p;
    switch (op->kind) {
    case DPAR__OP_AXPY:
        for (int64_t i = 0; i < op->n; i++) y[i] += f * x0[i];
        break;
    case DPAR__OP_SCALE:
        for (int64_t i = 0; i < op->n; i++) y[i] *= f;
        break;
    case DPAR__OP_FILL:
        for (int64_t i = 0; i < op->n; i++) y[i] = f;
        break;
    case DPAR__OP_SUM:
    case DPAR__OP_SUMSQ:
        for (int64_t i = 0; i < op->n; i++) s += op->kind == DPAR__OP_SUM ? x0[i] : x0[i] * x0[i];
        y[op->p[0]] = s;
        break;
    case DPAR__OP_MSE:
        for (int64_t i = 0; i < op->n; i++) {
            double d = x0[i] - x1[i];
            s += d * d;
            if (op->dst2) DPAR__D(op->dst2)[i] = 2.0 * d / (double)op->n;
        }
        y[0] = op->n ? s / (double)op->n : 0.0;
        break;
    case DPAR__OP_RELU:
        for (int64_t i = 0; i < op->n; i++) y[i] = x0[i] > 0.0 || x0[i] != x0[i] ? x0[i] : 0.0;
        break;
    case DPAR__OP_RELU_BWD:
        for (int64_t i = 0; i < op->n; i++) y[i] = x1[i] > 0.0 ? x0[i] : 0.0;
        break;
    case DPAR__OP_BIAS_ADD:
        for (int64_t i = 0; i < op->m * op->n; i++) y[i] += x0[i % op->n];
        break;
    case DPAR__OP_BIAS_GRAD:
        for (int64_t j = 0; j < op->n; j++) {
            for (int64_t i = 0; i < op->m; i++) s += x0[i * op->n + j];
            y[j] = (op->f[1] == 0.0f ? 0.0 : (double)op->f[1] * y[j]) + s;
            s = 0.0;
        }
        break;
    default: /* DPAR__OP_STRIDED (8-byte elements; see dpar__cpu_op_strided) */
        for (int64_t i0 = 0; i0 < p[0]; i0++)
            for (int64_t i1 = 0; i1 < p[1]; i1++)
                for (int64_t i2 = 0; i2 < p[2]; i2++)
                    for (int64_t i3 = 0; i3 < p[3]; i3++)
                        y[p[13] + i0 * p[8] + i1 * p[9] + i2 * p[10] + i3 * p[11]] =
                            x0[p[12] + i0 * p[4] + i1 * p[5] + i2 * p[6] + i3 * p[7]];
        break;
    }
}
static dpar_status dpar__cpu_op_f64(dpar__cpu *c, int dev, const dpar__op *op) {
    switch (op->kind) {
    case DPAR__OP_MATMUL: return dpar__cpu64_matmul(c, dev, op);
    case DPAR__OP_UNARY:
    case DPAR__OP_UNARY_BWD: dpar__cpu_parallel(c, dev, op->n, 16, dpar__cpu64_unary_range, op); return DPAR_OK;
    case DPAR__OP_BINARY: dpar__cpu64_binary(op); return DPAR_OK;
    case DPAR__OP_REDUCE: return dpar__cpu64_reduce(op);
    case DPAR__OP_SOFTMAX:
    case DPAR__OP_SOFTMAX_BWD: dpar__cpu64_softmax(op); return DPAR_OK;
    case DPAR__OP_SOFTMAX_XENT: return dpar__cpu64_xent(op);
    case DPAR__OP_NORM: dpar__cpu64_norm(op); return DPAR_OK;
    case DPAR__OP_NORM_BWD: return dpar__cpu64_norm_bwd(op);
    case DPAR__OP_COPY: memmove(op->dst->mem, op->src0->mem, op->dst->nbytes); return DPAR_OK;
    case DPAR__OP_CAST: dpar__cpu64_cast(op); return DPAR_OK;
    case DPAR__OP_AXPY:
    case DPAR__OP_SCALE:
    case DPAR__OP_FILL:
    case DPAR__OP_SUM:
    case DPAR__OP_SUMSQ:
    case DPAR__OP_MSE:
    case DPAR__OP_RELU:
    case DPAR__OP_RELU_BWD:
    case DPAR__OP_BIAS_ADD:
    case DPAR__OP_BIAS_GRAD:
    case DPAR__OP_STRIDED: dpar__cpu64_small(op); return DPAR_OK;
    case DPAR__OP_SGD: return dpar__cpu_op_sgd(c, dev, op, NULL, NULL, NULL);     /* the kinds whose f32 kernel */
    case DPAR__OP_ADAMW: return dpar__cpu_op_adamw(c, dev, op, NULL, NULL, NULL); /* has an f64 form too */
    case DPAR__OP_EMBED: return dpar__cpu_op_embed(c, dev, op, NULL, NULL, (const float *)op->src1->mem);
    case DPAR__OP_EMBED_BWD: return dpar__cpu_op_embed_bwd(c, dev, op, NULL, NULL, (const float *)op->src1->mem);
    case DPAR__OP_DROPOUT: return dpar__cpu_op_dropout(c, dev, op, NULL, NULL, NULL);
    case DPAR__OP_WHERE: return dpar__cpu_op_where(c, dev, op, NULL, NULL, NULL);
    case DPAR__OP_MATMUL_BATCHED: return dpar__cpu_op_matmul_batched(c, dev, op, NULL, NULL, NULL);
    case DPAR__OP_CONV2D:
        return dpar__cpu64_conv2d(c, dev, op, DPAR__CONV_FWD, (double *)(uintptr_t)op->src0->mem,
                                  (double *)(uintptr_t)op->src1->mem, DPAR__D(op->dst));
    case DPAR__OP_CONV2D_BWD_INPUT: /* dx = dst, dy = src0, w = src1 */
        return dpar__cpu64_conv2d(c, dev, op, DPAR__CONV_BWD_INPUT, DPAR__D(op->dst),
                                  (double *)(uintptr_t)op->src1->mem, (double *)(uintptr_t)op->src0->mem);
    case DPAR__OP_CONV2D_BWD_KERNEL: /* dw = dst, dy = src0, x = src1 */
        return dpar__cpu64_conv2d(c, dev, op, DPAR__CONV_BWD_KERNEL, (double *)(uintptr_t)op->src1->mem,
                                  DPAR__D(op->dst), (double *)(uintptr_t)op->src0->mem);
    case DPAR__OP_ATTN: return dpar__cpu64_attn(c, dev, op);
    case DPAR__OP_ATTN_BWD_Q: return dpar__cpu64_attn_bwd_q(c, dev, op);
    case DPAR__OP_ATTN_BWD_KV: return dpar__cpu64_attn_bwd_kv(c, dev, op);
    case DPAR__OP_AVG_POOL: return dpar__cpu64_pool2d(c, dev, op, 0, 0);
    case DPAR__OP_AVG_POOL_BWD: return dpar__cpu64_pool2d(c, dev, op, 0, 1);
    case DPAR__OP_MAX_POOL: return dpar__cpu64_pool2d(c, dev, op, 1, 0);
    case DPAR__OP_MAX_POOL_BWD: return dpar__cpu64_pool2d(c, dev, op, 1, 1);
    default: /* the core's checks refuse f64 for the other ops first; this guards a missed one */
        return dpar__err(DPAR_ERR_DTYPE,
                         "dpar_%s: the cpu backend has no f64 kernel for this op (see the f64 table in dpar.h); "
                         "dpar_cast to f32",
                         dpar__op_name(op->kind));
    }
}
#undef DPAR__D
#undef DPAR__CD

static dpar_status dpar__cpu_op(void *st, int dev, const dpar__op *op) {
    DPAR_ASSERT((int)op->kind >= 0 && op->kind < DPAR__OP_COUNT);
    if ((int)op->kind < 0 || op->kind >= DPAR__OP_COUNT)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "cpu backend: unknown op %d", (int)op->kind);
    if (dpar__cpu_half_kind(op->kind) && dpar__op_has_half(op)) return dpar__cpu_op_half(st, dev, op);
    if (dpar__op_has_f64(op)) return dpar__cpu_op_f64((dpar__cpu *)st, dev, op);
    float *y = (float *)op->dst->mem;
    const float *x0 = op->src0 ? (const float *)op->src0->mem : NULL;
    const float *x1 = op->src1 ? (const float *)op->src1->mem : NULL;
    return dpar__cpu_ops[op->kind]((dpar__cpu *)st, dev, op, y, x0, x1);
}

static const dpar__backend_iface dpar__cpu_backend = {
    "cpu",
    DPAR_BACKEND_CPU,
    true /* attn_kv_computes_d: pass 2 recomputes D (DPAR__ATTN_DEF's BWDKV) */,
    dpar__cpu_init,
    dpar__cpu_shutdown,
    dpar__cpu_info,
    NULL /* thread_init */,
    dpar__cpu_alloc,
    dpar__cpu_free,
    dpar__cpu_write,
    dpar__cpu_read,
    dpar__cpu_sync,
    dpar__cpu_host_ptr,
    NULL /* host_acquire */,
    NULL /* host_release */,
    dpar__cpu_op,
    NULL /* collective: core host path */,
    NULL /* cross_id_size */,
    NULL /* cross_id */,
    NULL /* device_status */,
    NULL /* visible_devices */,
    NULL /* physical_device: emulated devices */,
    NULL /* health: no GPU readings */,
    NULL /* prog_begin: graphs replay op by op */,
    NULL /* prog_end */,
    NULL /* prog_submit */,
    NULL /* prog_free */,
    NULL /* prog_submit_pre */,
    NULL /* refill: a write waits for nothing */,
    NULL /* host_waits */
};
static const dpar__backend_iface *dpar__cpu_iface(void) {
    return &dpar__cpu_backend;
}

#if defined(DPAR_VULKAN) || defined(DPAR_CUDA)
/* >>device half storage =======================================================
   Vulkan and CUDA run the 16-bit layer ops (dpar__cpu_half_kind) with the
   numerics of >>cpu half storage, on device temporaries: each 16-bit operand
   is cast into an f32 temporary by the backend's CAST kernel (exact), the
   backend's f32 kernel runs on the temporaries, then each 16-bit output is
   cast back, rounded once to nearest even (as dpar_f32_to_f16 / _bf16). So a
   16-bit result is the backend's f32 result rounded once. Outputs are widened
   too (an op may read its output, as bias_grad's beta does, or alias it to an
   input), and an operand given twice maps to one temporary. The temporaries
   are the device's own, kept and reused in queue order (each command waits
   for the ones before it), so an op neither allocates nor waits for the
   device; they grow (waiting once) when a larger op comes. Extra device
   memory: 4 bytes per element of each 16-bit operand of the largest such op,
   held until the runtime is destroyed. */
typedef struct dpar__half_hooks {
    dpar_status (*run)(void *st, int dev, const dpar__op *op); /* the backend's op (f32 kernels, CAST) */
    /* mem[0..n): n temporaries of nbytes[i] bytes each, valid until the device's next 16-bit layer op */
    dpar_status (*temps)(void *st, int dev, int n, const size_t *nbytes, void **mem);
} dpar__half_hooks;
static dpar_status dpar__half_cast(void *st, int dev, const dpar__half_hooks *h, dpar_buffer *dst,
                                   const dpar_buffer *src) {
    dpar__op c;
    dpar__op_init(&c, DPAR__OP_CAST, dst);
    c.src0 = src;
    return h->run(st, dev, &c);
}
static dpar_status dpar__half_lowered(void *st, int dev, const dpar__op *op, const dpar__half_hooks *h) {
    const dpar_buffer *orig[DPAR__OP_BUFS] = { op->dst,  op->dst2, op->dst3, op->dst4,
                                               op->src0, op->src1, op->src2, op->src3 };
    const dpar_buffer *map[DPAR__OP_BUFS];
    dpar_buffer wide[DPAR__OP_BUFS];
    size_t nbytes[DPAR__OP_BUFS];
    void *mem[DPAR__OP_BUFS];
    int nw = 0, first[DPAR__OP_BUFS] = { 0 }, slot[DPAR__OP_BUFS];
    for (int i = 0; i < DPAR__OP_BUFS; i++) { /* which operands are widened, into which temporary */
        int j = 0;
        while (j < i && orig[j] != orig[i]) j++;
        first[i] = j == i;
        slot[i] = j < i ? slot[j] : -1;
        if (j < i || !dpar__is_half(orig[i])) continue;
        wide[nw] = *orig[i];
        wide[nw].dtype = DPAR_F32;
        nbytes[nw] = wide[nw].nbytes = (size_t)orig[i]->count * sizeof(float);
        slot[i] = nw++;
    }
    dpar_status s = nw ? h->temps(st, dev, nw, nbytes, mem) : DPAR_OK;
    for (int i = 0; i < DPAR__OP_BUFS && !s; i++) {
        map[i] = slot[i] < 0 ? orig[i] : &wide[slot[i]];
        if (slot[i] < 0 || !first[i]) continue;
        wide[slot[i]].mem = mem[slot[i]];
        s = dpar__half_cast(st, dev, h, &wide[slot[i]], orig[i]);
    }
    if (!s) {
        dpar__op w = *op;
        w.dst = (dpar_buffer *)(uintptr_t)map[0], w.dst2 = (dpar_buffer *)(uintptr_t)map[1];
        w.dst3 = (dpar_buffer *)(uintptr_t)map[2], w.dst4 = (dpar_buffer *)(uintptr_t)map[3];
        w.src0 = map[4], w.src1 = map[5], w.src2 = map[6], w.src3 = map[7];
        s = h->run(st, dev, &w);
    }
    for (int i = 0; i < DPAR__OP_DSTS && !s; i++) /* the outputs, rounded once */
        if (first[i] && slot[i] >= 0) s = dpar__half_cast(st, dev, h, (dpar_buffer *)(uintptr_t)orig[i], map[i]);
    return s;
}
#endif

#ifdef DPAR_VULKAN
#include "backends/dpar_vulkan.h"
#else
/* >>vulkan interop without the backend: every buffer is of another backend */
DPAR_API dpar_status dpar_vulkan_buffer_export(dpar_buffer *b, dpar_vulkan_export *out) {
    dpar__clear_error();
    if (out) memset(out, 0, sizeof *out);
    if (!b || !out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_vulkan_buffer_export: buffer or out is NULL");
    if (dpar__live_buf(b, "dpar_vulkan_buffer_export", "the buffer")) return DPAR_ERR_STATE; /* as with Vulkan */
    return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                     "dpar_vulkan_buffer_export: this build has no Vulkan backend; define DPAR_VULKAN where "
                     "DPAR_IMPLEMENTATION is defined (make VULKAN=1)");
}
DPAR_API dpar_status dpar_vulkan_buffer_release(dpar_buffer *b) {
    dpar__clear_error();
    if (!b) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_vulkan_buffer_release: buffer is NULL");
    if (dpar__live_buf(b, "dpar_vulkan_buffer_release", "the buffer")) return DPAR_ERR_STATE;
    return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                     "dpar_vulkan_buffer_release: this build has no Vulkan backend; define DPAR_VULKAN where "
                     "DPAR_IMPLEMENTATION is defined (make VULKAN=1)");
}
#endif
#ifdef DPAR_CUDA
#include "backends/dpar_cuda.h"
#endif

#ifdef DPAR_MPI
#include "backends/dpar_mpi.h"
#else
/* >>transport-none ===========================================================
   One process: the transport's hooks do nothing (no group spans processes). */
static dpar_status dpar__one_runtime_pre(dpar_runtime *rt, const dpar_runtime_desc *desc) {
    DPAR__UNUSED(rt);
    DPAR__UNUSED(desc);
    return DPAR_OK;
}
static dpar_status dpar__one_runtime_init(dpar_runtime *rt, dpar_status opened) {
    DPAR__UNUSED(rt);
    return opened;
}
static void dpar__one_runtime_free(dpar_runtime *rt) {
    DPAR__UNUSED(rt);
}
static void dpar__one_runtime_failed(const dpar_runtime_desc *desc, dpar_status s) {
    DPAR__UNUSED(desc);
    DPAR__UNUSED(s);
}
static dpar_status dpar__one_mesh_init(dpar_mesh *m) {
    DPAR__UNUSED(m);
    return DPAR_OK;
}
static void dpar__one_mesh_free(dpar_mesh *m) {
    DPAR__UNUSED(m);
}
static dpar_status dpar__one_dispatch_begin(dpar_runtime *rt) {
    DPAR__UNUSED(rt);
    return DPAR_OK;
}
static void dpar__one_dispatch_end(dpar_mesh *m, dpar__job *job, dpar_status late) {
    DPAR__UNUSED(m);
    DPAR__UNUSED(job);
    DPAR__UNUSED(late);
}
static dpar_status dpar__one_cross(const char *what) {
    return dpar__err(DPAR_ERR_STATE, "%s: the group spans processes but dpar was built without DPAR_MPI", what);
}
static dpar_status dpar__one_coll_agree(dpar_ctx *ctx, dpar__group *g, const char *what) {
    DPAR__UNUSED(ctx);
    DPAR__UNUSED(g);
    return dpar__one_cross(what);
}
static const void *dpar__one_group_xid(const dpar__group *g) {
    DPAR__UNUSED(g);
    return NULL;
}
static dpar_status dpar__one_coll(dpar_ctx *ctx, dpar__group *g, dpar__coll *c, const char *what) {
    DPAR__UNUSED(ctx);
    DPAR__UNUSED(g);
    DPAR__UNUSED(c);
    return dpar__one_cross(what);
}
static dpar_status dpar__one_share(dpar_runtime *rt, void *buf, size_t n, int owner, dpar_status st) {
    DPAR__UNUSED(rt);
    DPAR__UNUSED(buf);
    DPAR__UNUSED(n);
    DPAR__UNUSED(owner);
    return st;
}
static const dpar__transport *dpar__transport_get(void) {
    static const dpar__transport one = { dpar__one_runtime_pre,    dpar__one_runtime_init, dpar__one_runtime_free,
                                         dpar__one_runtime_failed, dpar__one_mesh_init,    dpar__one_mesh_free,
                                         dpar__one_dispatch_begin, dpar__one_dispatch_end, dpar__one_coll_agree,
                                         dpar__one_group_xid,      dpar__one_coll,         dpar__one_share };
    return &one;
}
#endif

#endif /* DPAR_IMPLEMENTATION_DONE */
#endif /* DPAR_IMPLEMENTATION */
