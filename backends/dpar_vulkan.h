/* backends/dpar_vulkan.h — the Vulkan compute backend of dpar.h.

   Compiled into the implementation when DPAR_VULKAN is defined:

       #define DPAR_VULKAN
       #define DPAR_IMPLEMENTATION
       #include "dpar.h"          // includes backends/dpar_vulkan.h at its end

   Build: only the Vulkan headers are needed (Debian: libvulkan-dev). Nothing
   is linked: the loader (libvulkan.so.1) is opened with dlopen at run time,
   so a program starts on a machine without Vulkan and gets
   DPAR_ERR_BACKEND_UNAVAILABLE with the reason from dpar_runtime_create
   (link with -ldl on glibc older than 2.34). The SPIR-V of the shaders
   (shaders/NAME.comp) is embedded in backends/dpar_vulkan_spirv.h
   (generated, committed; glslang is not needed to build).

   Devices: the usable physical devices are those with Vulkan 1.1 and a
   compute queue, ordered GPUs first (discrete, integrated, virtual, then CPU
   implementations such as llvmpipe). By default dpar uses every device of
   the best kind (all discrete GPUs, say, but never llvmpipe next to a GPU);
   desc.vulkan.physical_device (1-based; or DPAR_VK_DEVICE, 0-based) picks
   one. N
   logical devices (desc.num_devices / DPAR_DEVICES; default: one per
   physical device used) are dealt round-robin over them, so 2-, 4- and
   8-device meshes run on a single GPU or on llvmpipe. Each physical device
   has one VkDevice; each logical device gets its own VkQueue when the queue
   family has enough, otherwise logical devices share queues (under a lock).
   Every logical device has its own command pool, a ring of command buffers
   with fences and descriptor pools, and records ops asynchronously; reads,
   syncs and host access wait for the work that touches the buffer. A graph
   records its device ops once into command buffers of their own and
   re-submits them every step (>>vulkan program).

   An engine's own device (desc.vulkan.external, see dpar_vulkan_external in
   dpar.h): its instance, device and one queue are used as given, with its
   allocation callbacks and queue lock; every logical device shares that
   queue, dpar destroys only the objects it created and waits only for its
   own fences. dpar_vulkan_buffer_export lends a buffer to the engine's
   Vulkan work under a timeline semaphore per logical device (>>vulkan interop).

   Collectives (the backend's `collective` entry) are staged through host
   memory. Mapped buffers are reduced in place by the group's worker threads,
   each taking 1/n of the elements (f16/bf16 accumulate in f32). Device-local
   buffers: an all-reduce goes in 4 MiB chunks through two persistent staging
   slots per device, so the device -> host copy of chunk k+1 and the host ->
   device copy of chunk k-1 overlap the host reduction of chunk k; the other
   collectives are copied whole. Every copy is preceded by a compute/transfer
   barrier, and every batch ends with a barrier to the host before its fence.

   Memory: where memory is DEVICE_LOCAL and HOST_VISIBLE (integrated and
   mobile GPUs, llvmpipe, resizable BAR with cached memory) buffers are mapped
   persistently and host access works in place; otherwise
   buffers are device-local and host copies go through a persistent staging
   buffer, in chunks. Non-coherent memory is flushed after host writes and
   invalidated before host reads, ranges aligned to nonCoherentAtomSize.

   Environment:
       DPAR_VK_NONCOHERENT=1   treat host-visible memory as non-coherent (also
                               dpar_runtime_desc.vulkan.force_noncoherent)
       DPAR_VK_FORCE_STAGING=1 never map buffers: use the staging path even
                               where memory is host-visible (tests it anywhere)
       DPAR_VK_LOADER=path     loader library to load (default libvulkan.so.1; Windows
                               vulkan-1.dll; macOS libvulkan.1.dylib)
       DPAR_VK_DEVICE=i        use only usable device i, 0-based (when desc.vulkan.physical_device,
                               1-based, is 0)

   Limits: one buffer may be at most maxStorageBufferRange bytes for ops
   (llvmpipe: 128 MiB; copies, fills and collectives have no such limit);
   element counts below 2^32. Workgroup counts never pass maxComputeWorkGroupCount:
   the shaders stride over at most 65,535 workgroups, and a matmul past the counts
   runs as several dispatches. Matrix products take f32, f16 or bf16 operands
   and accumulate in f32. Every buffer is its own VkDeviceMemory allocation
   (drivers allow at least 4096; no sub-allocator yet).

   Loops: llvmpipe ends a shader's loops after 65,535 turns an invocation,
   all its loops counted together, and the result is silently wrong past it
   (>>vulkan loops). The shaders keep their loops short where the geometry
   allows: dpar_sum and dpar_mse at any size, softmax rows up to about 5.5M,
   layer-norm rows up to about 2.7M, bias and layer-norm parameter gradients
   over up to 16M rows, conv2d's kernel gradient over up to 16M outputs. An
   op whose invocations must loop past the cap (a matmul's K above about
   65,530, an embedding gradient over more than 65,532 indices, a large conv
   window, ...) fails there with DPAR_ERR_SHAPE before anything is recorded,
   its output untouched. GPUs are not limited.

   Tests: tests/test_vulkan.c (this backend), tests/test_parity.c (every op
   and collective against the CPU backend), tests/test_graph_record.c (recorded
   graph programs against the op-by-op replay), tests/vulkan_validation.sh (the
   Khronos validation layer with synchronization validation).
*/
#ifndef DPAR_VULKAN_H_INCLUDED
#define DPAR_VULKAN_H_INCLUDED

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>
#include "dpar_vulkan_spirv.h"

/* ---------------------------------------------------------------------------
   Vulkan entry points (loaded at run time, volk-style)
   ------------------------------------------------------------------------ */
/* one X() per Vulkan entry point, packed rather than one per line */
/* clang-format off */
#define DPAR__VK_INSTANCE_FNS(X) \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties) \
    X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkCreateDevice) \
    X(vkEnumerateDeviceExtensionProperties) X(vkGetPhysicalDeviceFeatures2)

#define DPAR__VK_DEVICE_FNS(X) \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkDeviceWaitIdle) \
    X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements) \
    X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) X(vkUnmapMemory) \
    X(vkFlushMappedMemoryRanges) X(vkInvalidateMappedMemoryRanges) \
    X(vkCreateCommandPool) X(vkDestroyCommandPool) X(vkAllocateCommandBuffers) X(vkFreeCommandBuffers) \
    X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkCmdPipelineBarrier) \
    X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets) X(vkCmdPushConstants) X(vkCmdDispatch) \
    X(vkCmdCopyBuffer) X(vkCmdFillBuffer) X(vkQueueSubmit) X(vkQueueWaitIdle) \
    X(vkCreateFence) X(vkDestroyFence) X(vkResetFences) X(vkWaitForFences) \
    X(vkCreateShaderModule) X(vkDestroyShaderModule) \
    X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) \
    X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout) \
    X(vkCreateComputePipelines) X(vkDestroyPipeline) \
    X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool) X(vkResetDescriptorPool) \
    X(vkAllocateDescriptorSets) X(vkUpdateDescriptorSets) X(vkCreateSemaphore) X(vkDestroySemaphore)
/* clang-format on */

enum {
    DPAR__VK_FRAMES = 6,      /* batches in flight per logical device (>>graph feeds' staged sets: as many) */
    DPAR__VK_FRAME_OPS = 128, /* ops recorded before a command buffer is submitted */
    DPAR__VK_BINDINGS = 8,    /* dst, dst2, src0, src1, dst3, src2, src3, spare (the layer ops need 7) */
    DPAR__VK_WG = 256,        /* 1-D workgroup size of the element-wise shaders */
    /* On a CPU device (llvmpipe) each workgroup costs a setup of its own, so fewer, fuller workgroups, but
       only where the loop cap allows (>>vulkan loops): a shader whose items take a few fixed turns each
       gets a workgroup per DPAR__VK_CPU_ITEMS items (16 an invocation; dpar__vk_flat_groups), and the
       direct matmul up to DPAR__VK_CPU_MM_COLS column blocks a workgroup while an invocation's turns stay
       within DPAR__VK_CPU_TURNS (dpar__vk_mm_cols). Shaders whose items loop with the shape (a conv
       kernel gradient's sums, a softmax row, ...) keep an item an invocation: 16 conv sums of 7,200
       terms an invocation came out wrong with no error. */
    DPAR__VK_CPU_ITEMS = 4096,
    DPAR__VK_CPU_MM_COLS = 8,
    DPAR__VK_CPU_TURNS = 8192
};
#define DPAR__VK_CHUNK            ((VkDeviceSize)16 << 20) /* staging chunk */
#define DPAR__VK_FENCE_TIMEOUT_NS ((uint64_t)600 * 1000000000ull)
#define DPAR__VK_LOOP_CAP         65535u /* llvmpipe's LP_MAX_TGSI_LOOP_ITERATIONS (>>vulkan loops) */
/* A softmax row, a column summed by bias_grad / layernorm_wgrad, or the outputs summed into a conv kernel
   gradient's element, at least this long takes a workgroup (its lanes share the loop, a fixed tree adds
   their parts): llvmpipe's cap, and parallelism where rows or columns are few (softmax.comp flags bit1,
   bias_grad.comp bit0, layernorm_wgrad.comp bit2, conv2d_bwd_kernel.comp bit1; layer-norm rows: their
   workgroup variant). */
#define DPAR__VK_WIDE 4096

typedef struct dpar__vkqueue {
    VkQueue queue;
    dpar__mutex lock; /* VkQueue is externally synchronized */
} dpar__vkqueue;

typedef struct dpar__vkframe {
    VkCommandBuffer cb;
    VkFence fence;
    VkDescriptorPool pool;
    uint64_t serial; /* serial of the batch it holds (0: never used) */
    int state;       /* 0 idle, 1 recording, 2 submitted */
    int nops;
    bool bare; /* only its fence: it carries a program's recording alone (dpar__vk_prog_submit), cb unused */
} dpar__vkframe;

struct dpar__vk;
struct dpar__vkphys;

typedef struct dpar__vkbuf {
    struct dpar__vkphys *ph; /* the physical device (VkDevice) it lives on */
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;       /* buffer size (nbytes rounded up to 4, at least 4) */
    VkDeviceSize alloc_size; /* allocation size, multiple of nonCoherentAtomSize */
    size_t nbytes;
    unsigned char *map;   /* persistent mapping (NULL: staging path) */
    int coherent;         /* no flush/invalidate needed */
    uint64_t last_serial; /* last batch of its device that used it */
} dpar__vkbuf;

/* One physical device in use: its VkDevice, queues and pipelines. */
typedef struct dpar__vkphys {
    int index; /* among the usable physical devices (GPUs first) */
    VkPhysicalDevice pd;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDeviceSize max_alloc; /* maxMemoryAllocationSize */
    VkDeviceSize atom;      /* nonCoherentAtomSize */
    char driver[64];
    uint8_t uuid[VK_UUID_SIZE]; /* VkPhysicalDeviceIDProperties::deviceUUID */
    int prefer_mappable;        /* map device memory in place */
    int lanes8;                 /* compute subgroups of 8 with broadcast (matmul_direct.comp's flags bit 5) */
    uint32_t loop_cap;          /* shader loops end after this many turns an invocation (llvmpipe); 0: none */
    VkDevice device;
    uint32_t family;
    int nqueues;
    dpar__vkqueue *queues;
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    dpar__mutex pipe_lock;
    int pipe_lock_init;
    VkPipeline pipes[DPAR__SPV_COUNT];
    dpar__vkbuf dummy; /* bound to unused bindings */
    int timeline;      /* an adopted device with timeline semaphores enabled (>>vulkan interop) */
} dpar__vkphys;

typedef struct dpar__vkdev {
    struct dpar__vk *st;
    dpar__vkphys *ph;
    int index;
    dpar__mutex lock; /* command pool, frames, staging, serials */
    dpar__vkqueue *queue;
    VkCommandPool cmd_pool;
    dpar__vkframe frames[DPAR__VK_FRAMES];
    int cur;              /* recording frame or -1 */
    uint64_t next_serial; /* serial of the next batch (starts at 1) */
    uint64_t completed;   /* every batch <= completed has finished */
    VkBuffer staging;     /* persistent, grows on demand */
    VkDeviceMemory staging_mem;
    VkDeviceSize staging_size, staging_alloc;
    unsigned char *staging_map;
    int staging_coherent;
    dpar__vkbuf cstage; /* collective staging: two chunk slots, grows on demand */
    void *hbuf[2];      /* host copies for the unpipelined collective path */
    size_t hcap[2];
    char *coll_in, *coll_out; /* this member's host views, published to the group */
    dpar__vkbuf *idx_err;     /* error words of the index checks (>>vulkan optim), made on first use */
    dpar__vkbuf *half[7];     /* f32 temporaries of the 16-bit layer ops (>>vulkan half storage), kept */
    dpar__vkbuf *xent_tmp;    /* softmax_xent_wide.comp's scratch (dpar__vk_xent), made on first use */
    int idx_pending;          /* a check ran since the last report (atomic) */
    int idx_used;             /* a check ever ran: the optimizer updates are guarded (atomic) */
    /* >>vulkan interop: one buffer lent at a time; values of the timeline semaphore `sem` */
    VkSemaphore sem;           /* made by the first export */
    uint64_t sem_value;        /* last value handed out (an export's ready value, then its release value) */
    uint64_t sem_signal;       /* the next submit signals it (0: none) */
    uint64_t sem_wait;         /* the next submit waits for it (0: none): the engine's release */
    int loaned;                /* a buffer of this device is lent */
    VkCommandBuffer suffix[2]; /* >>vulkan program: the next submit runs these recordings after its batch */
    uint64_t host_waits;       /* vkWaitForFences calls (atomic: dpar_device_stats.host_waits reads it) */
} dpar__vkdev;

/* Push constants shared by every shader (112 bytes; Vulkan guarantees 128). A shader declares the
   prefix it reads: the first 32 bytes for the original ops, p[] for the layer ops' geometry. */
typedef struct dpar__vkpc {
    uint32_t n, m, k, flags;
    float f[8];
    uint32_t p[16];
} dpar__vkpc;

typedef struct dpar__vk {
    void *lib;
    PFN_vkGetInstanceProcAddr gipa;
    PFN_vkCreateInstance vkCreateInstance;
    PFN_vkEnumerateInstanceExtensionProperties vkEnumerateInstanceExtensionProperties;
    PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion;
#define DPAR__VK_DECL(name) PFN_##name name;
    DPAR__VK_INSTANCE_FNS(DPAR__VK_DECL)
    DPAR__VK_DEVICE_FNS(DPAR__VK_DECL)
#undef DPAR__VK_DECL
    VkInstance instance;
    int api_version; /* instance API version asked for */
    int nphys;
    dpar__vkphys *phys; /* [nphys] physical devices in use */
    int ndev;
    dpar__vkdev *devs; /* [ndev] logical devices, round-robin over phys */
    int force_noncoherent, force_staging, force_tiled;
    int lost; /* VK_ERROR_DEVICE_LOST seen */
    /* an adopted engine device (desc.vulkan.external): instance and device are not dpar's to destroy */
    int adopted;
    const VkAllocationCallbacks *alloc; /* the engine's, for every object dpar creates; NULL: the driver's */
    void (*lock_queue)(void *user);
    void (*unlock_queue)(void *user);
    void *queue_user;
} dpar__vk;

/* ---------------------------------------------------------------------------
   Errors
   ------------------------------------------------------------------------ */
static const char *dpar__vk_result_name(VkResult r) {
    switch (r) {
/* clang-format off */
#define DPAR__VK_R(x) case x: return #x;
    DPAR__VK_R(VK_SUCCESS) DPAR__VK_R(VK_NOT_READY) DPAR__VK_R(VK_TIMEOUT)
    DPAR__VK_R(VK_EVENT_SET) DPAR__VK_R(VK_EVENT_RESET) DPAR__VK_R(VK_INCOMPLETE)
    DPAR__VK_R(VK_ERROR_OUT_OF_HOST_MEMORY) DPAR__VK_R(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    DPAR__VK_R(VK_ERROR_INITIALIZATION_FAILED) DPAR__VK_R(VK_ERROR_DEVICE_LOST)
    DPAR__VK_R(VK_ERROR_MEMORY_MAP_FAILED) DPAR__VK_R(VK_ERROR_LAYER_NOT_PRESENT)
    DPAR__VK_R(VK_ERROR_EXTENSION_NOT_PRESENT) DPAR__VK_R(VK_ERROR_FEATURE_NOT_PRESENT)
    DPAR__VK_R(VK_ERROR_INCOMPATIBLE_DRIVER) DPAR__VK_R(VK_ERROR_TOO_MANY_OBJECTS)
    DPAR__VK_R(VK_ERROR_FORMAT_NOT_SUPPORTED) DPAR__VK_R(VK_ERROR_FRAGMENTED_POOL)
    DPAR__VK_R(VK_ERROR_UNKNOWN) DPAR__VK_R(VK_ERROR_OUT_OF_POOL_MEMORY)
    DPAR__VK_R(VK_ERROR_INVALID_EXTERNAL_HANDLE) DPAR__VK_R(VK_ERROR_FRAGMENTATION)
    DPAR__VK_R(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS) DPAR__VK_R(VK_PIPELINE_COMPILE_REQUIRED)
    DPAR__VK_R(VK_ERROR_INVALID_SHADER_NV)
#undef DPAR__VK_R
            /* clang-format on */
            default : return "VK_RESULT_UNKNOWN";
    }
}

/* Sets the last error "<call> failed: <VkResult> (<detail>)" and returns the
   matching status: out-of-memory results -> DPAR_ERR_OUT_OF_MEMORY, the rest
   -> DPAR_ERR_BACKEND. A lost device is remembered: later calls fail at once. */
static dpar_status dpar__vk_fail(dpar__vk *st, VkResult r, const char *call, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(DPAR__PRINTF_FMT, 4, 5)))
#endif
    ;
static dpar_status dpar__vk_fail(dpar__vk *st, VkResult r, const char *call, const char *fmt, ...) {
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    dpar_status s = DPAR_ERR_BACKEND;
    const char *hint = "";
    if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY) {
        s = DPAR_ERR_OUT_OF_MEMORY;
        hint = "; free buffers or use smaller ones";
    } else if (r == VK_ERROR_DEVICE_LOST) {
        if (st) DPAR__ATOMIC_STORE(&st->lost, 1);
        hint = "; the GPU was reset or the driver crashed: destroy the runtime and create a new one";
    }
    return dpar__err(s, "vulkan: %s failed: %s (%s)%s", call, dpar__vk_result_name(r), detail, hint);
}

static dpar_status dpar__vk_check_lost(dpar__vk *st) {
    if (DPAR__ATOMIC_LOAD(&st->lost))
        return dpar__err(DPAR_ERR_BACKEND, "vulkan: the device was lost earlier (VK_ERROR_DEVICE_LOST); "
                                           "destroy the runtime and create a new one");
    return DPAR_OK;
}

/* >>vulkan settings ==========================================================
   desc.vulkan (and its deprecated flat names), then the environment: the only
   place this backend reads either. */
typedef struct dpar__vk_settings {
    int device;             /* 0-based index among the usable devices; -1: every device of the best kind */
    char device_from[64];   /* where `device` came from, for error messages */
    bool force_noncoherent; /* desc.vulkan.force_noncoherent or DPAR_VK_NONCOHERENT */
    bool force_staging;     /* DPAR_VK_FORCE_STAGING */
    bool force_tiled;       /* DPAR_VK_FORCE_TILED */
} dpar__vk_settings;

static dpar_status dpar__vk_settings_get(const dpar_runtime_desc *desc, dpar__vk_settings *out) {
    dpar_runtime_desc zero;
    memset(&zero, 0, sizeof zero);
    if (!desc) desc = &zero;
#ifndef DPAR_NO_DEPRECATED
    int old_noncoherent = desc->vulkan_force_noncoherent, old_device = desc->vulkan_physical_device;
#else
    int old_noncoherent = desc->dpar__reserved_vk[0], old_device = desc->dpar__reserved_vk[1];
#endif
    memset(out, 0, sizeof *out);
    out->device = -1;
    if (desc->vulkan.physical_device < 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "vulkan: desc.vulkan.physical_device = %d is negative; use 1 for "
                         "the first usable device, 2 for the second, ..., or 0 for every device of the best kind",
                         desc->vulkan.physical_device);
    const dpar_vulkan_external *x = &desc->vulkan.external;
    if (!x->device && (x->instance || x->physical_device || x->queue))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "vulkan: desc.vulkan.external.device is NULL but its instance, physical_device or queue is "
                         "set; give the engine's VkDevice too (or leave external all zero for dpar's own device)");
    if (x->device && desc->vulkan.physical_device != 0)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "vulkan: desc.vulkan.physical_device = %d and desc.vulkan.external.device are both set; an "
                         "adopted device is the one used: leave physical_device 0",
                         desc->vulkan.physical_device);
    if (desc->vulkan.physical_device > 0) {
        out->device = desc->vulkan.physical_device - 1;
        snprintf(out->device_from, sizeof out->device_from, "desc.vulkan.physical_device = %d (1-based)",
                 desc->vulkan.physical_device);
    } else if (old_device > 0) {
        out->device = old_device;
        snprintf(out->device_from, sizeof out->device_from, "desc.vulkan_physical_device = %d", old_device);
    } else if (dpar__env_int("DPAR_VK_DEVICE", -1) >= 0) { /* in range: dpar_runtime_create checked it */
        out->device = dpar__env_int("DPAR_VK_DEVICE", -1);
        snprintf(out->device_from, sizeof out->device_from, "DPAR_VK_DEVICE=%d", out->device);
    }
    out->force_noncoherent =
        desc->vulkan.force_noncoherent || old_noncoherent || dpar__env_int("DPAR_VK_NONCOHERENT", 0) > 0;
    out->force_staging = dpar__env_int("DPAR_VK_FORCE_STAGING", 0) > 0; /* in range: dpar_runtime_create */
    out->force_tiled = dpar__env_int("DPAR_VK_FORCE_TILED", 0) > 0;
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   Memory
   ------------------------------------------------------------------------ */
static VkDeviceSize dpar__vk_round_up(VkDeviceSize x, VkDeviceSize a) {
    return (x + a - 1) / a * a;
}

/* First memory type allowed by `bits` that has all of `want`; -1 if none. */
static int dpar__vk_find_type(const dpar__vkphys *ph, uint32_t bits, VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < ph->memprops.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (ph->memprops.memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

/* Flush (after host writes) or invalidate (before host reads) [off, off+n) of
   a mapped allocation, widened to nonCoherentAtomSize. */
static dpar_status dpar__vk_map_range(dpar__vk *st, const dpar__vkphys *ph, VkDeviceMemory mem, VkDeviceSize alloc_size,
                                      size_t off, size_t n, int invalidate) {
    if (n == 0) return DPAR_OK;
    VkDeviceSize start = (VkDeviceSize)off / ph->atom * ph->atom;
    VkDeviceSize end = dpar__vk_round_up((VkDeviceSize)off + n, ph->atom);
    if (end > alloc_size) end = alloc_size;
    VkMappedMemoryRange r;
    memset(&r, 0, sizeof r);
    r.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE;
    r.memory = mem;
    r.offset = start;
    r.size = end - start;
    VkResult vr = invalidate ? st->vkInvalidateMappedMemoryRanges(ph->device, 1, &r)
                             : st->vkFlushMappedMemoryRanges(ph->device, 1, &r);
    if (vr != VK_SUCCESS)
        return dpar__vk_fail(st, vr, invalidate ? "vkInvalidateMappedMemoryRanges" : "vkFlushMappedMemoryRanges",
                             "offset %llu, %llu bytes", (unsigned long long)start, (unsigned long long)(end - start));
    return DPAR_OK;
}

static void dpar__vk_destroy_vkbuf(dpar__vk *st, dpar__vkbuf *b) {
    if (!b->ph) return;
    VkDevice dv = b->ph->device;
    if (b->map) st->vkUnmapMemory(dv, b->mem);
    if (b->buf != VK_NULL_HANDLE) st->vkDestroyBuffer(dv, b->buf, st->alloc);
    if (b->mem != VK_NULL_HANDLE) st->vkFreeMemory(dv, b->mem, st->alloc);
    b->map = NULL;
    b->buf = VK_NULL_HANDLE;
    b->mem = VK_NULL_HANDLE;
}

/* Creates a buffer + its own allocation. staging: host-visible memory for
   copies; else storage memory, mapped when the policy allows. */
static dpar_status dpar__vk_create_vkbuf(dpar__vk *st, dpar__vkphys *ph, int dev, size_t nbytes, int staging,
                                         dpar__vkbuf *b) {
    memset(b, 0, sizeof *b);
    b->ph = ph;
    b->nbytes = nbytes;
    b->size = dpar__vk_round_up(nbytes < 4 ? 4 : (VkDeviceSize)nbytes, 4);
    VkBufferCreateInfo bi;
    memset(&bi, 0, sizeof bi);
    bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bi.size = b->size;
    bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
               (staging ? 0 : VK_BUFFER_USAGE_STORAGE_BUFFER_BIT);
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkResult vr = st->vkCreateBuffer(ph->device, &bi, st->alloc, &b->buf);
    if (vr != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkCreateBuffer", "device %d, %llu bytes", dev, (unsigned long long)b->size);
    VkMemoryRequirements req;
    st->vkGetBufferMemoryRequirements(ph->device, b->buf, &req);
    int type = -1;
    const VkMemoryPropertyFlags DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                HC = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    if (staging) {
        type = dpar__vk_find_type(ph, req.memoryTypeBits, HV | HC);
        if (type < 0) type = dpar__vk_find_type(ph, req.memoryTypeBits, HV);
    } else {
        if (ph->prefer_mappable) type = dpar__vk_find_type(ph, req.memoryTypeBits, DL | HV);
        if (type < 0) type = dpar__vk_find_type(ph, req.memoryTypeBits, DL);
        if (type < 0) type = dpar__vk_find_type(ph, req.memoryTypeBits, 0);
    }
    if (type < 0) {
        dpar__vk_destroy_vkbuf(st, b);
        return dpar__err(DPAR_ERR_BACKEND, "vulkan: no suitable memory type for a %s buffer (memoryTypeBits 0x%x)",
                         staging ? "staging" : "storage", req.memoryTypeBits);
    }
    VkMemoryPropertyFlags flags = ph->memprops.memoryTypes[type].propertyFlags;
    uint32_t heap = ph->memprops.memoryTypes[type].heapIndex;
    b->alloc_size = dpar__vk_round_up(req.size, ph->atom);
    if (b->alloc_size > ph->memprops.memoryHeaps[heap].size || b->alloc_size > ph->max_alloc) {
        VkDeviceSize hs = ph->memprops.memoryHeaps[heap].size;
        dpar__vk_destroy_vkbuf(st, b);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY,
                         "vulkan: vkAllocateMemory: %llu bytes on device %d exceed the memory heap (%llu bytes) "
                         "or maxMemoryAllocationSize (%llu bytes); use smaller buffers or more devices",
                         (unsigned long long)b->alloc_size, dev, (unsigned long long)hs,
                         (unsigned long long)ph->max_alloc);
    }
    VkMemoryAllocateInfo ai;
    memset(&ai, 0, sizeof ai);
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.allocationSize = b->alloc_size;
    ai.memoryTypeIndex = (uint32_t)type;
    vr = st->vkAllocateMemory(ph->device, &ai, st->alloc, &b->mem);
    if (vr != VK_SUCCESS) {
        b->mem = VK_NULL_HANDLE;
        dpar__vk_destroy_vkbuf(st, b);
        return dpar__vk_fail(st, vr, "vkAllocateMemory", "device %d, %llu bytes", dev,
                             (unsigned long long)ai.allocationSize);
    }
    vr = st->vkBindBufferMemory(ph->device, b->buf, b->mem, 0);
    if (vr != VK_SUCCESS) {
        dpar__vk_destroy_vkbuf(st, b);
        return dpar__vk_fail(st, vr, "vkBindBufferMemory", "device %d", dev);
    }
    if ((flags & HV) && (staging || !st->force_staging)) {
        void *p = NULL;
        vr = st->vkMapMemory(ph->device, b->mem, 0, VK_WHOLE_SIZE, 0, &p);
        if (vr != VK_SUCCESS) {
            dpar__vk_destroy_vkbuf(st, b);
            return dpar__vk_fail(st, vr, "vkMapMemory", "device %d, %llu bytes", dev,
                                 (unsigned long long)b->alloc_size);
        }
        b->map = (unsigned char *)p;
        b->coherent = (flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) && !st->force_noncoherent;
    }
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   Batches: each logical device records into a ring of command buffers
   ------------------------------------------------------------------------ */
/* Waits until every batch with serial <= s has finished, newest first: the queue runs its batches in
   order and a fence's signal covers every earlier submission on the queue, so the first wait is the one
   sleep and the older fences are found signaled (lavapipe sleeps and wakes once per fence waited for
   while unsignaled, also for a wait on several). Lock held. */
static dpar_status dpar__vk_wait_serial(dpar__vkdev *d, uint64_t s) {
    dpar__vk *st = d->st;
    bool counted = false;
    for (uint64_t x = s; x > d->completed; x--) {
        dpar__vkframe *f = &d->frames[x % DPAR__VK_FRAMES];
        if (f->serial != x || f->state != 2) continue;
        if (!counted) DPAR__ATOMIC_ADD_FETCH(&d->host_waits, 1);
        counted = true;
        VkResult vr = st->vkWaitForFences(d->ph->device, 1, &f->fence, VK_TRUE, DPAR__VK_FENCE_TIMEOUT_NS);
        if (vr != VK_SUCCESS) {
            if (vr == VK_TIMEOUT)
                return dpar__err(DPAR_ERR_BACKEND,
                                 "vulkan: vkWaitForFences failed: VK_TIMEOUT (device %d did not "
                                 "finish its work in %llu s)",
                                 d->index, (unsigned long long)(DPAR__VK_FENCE_TIMEOUT_NS / 1000000000ull));
            return dpar__vk_fail(st, vr, "vkWaitForFences", "device %d", d->index);
        }
        f->state = 0;
    }
    if (s > d->completed) d->completed = s;
    return DPAR_OK;
}
/* The newest batch of d that was submitted (the open batch, if any, is not). Lock held. */
static uint64_t dpar__vk_newest(const dpar__vkdev *d) {
    return d->next_serial - 1 - (d->cur >= 0 ? 1u : 0u);
}

/* A full memory barrier between consecutive commands (compute and transfer).
   Its first scope also covers earlier submissions on the queue. */
static void dpar__vk_cmd_barrier(dpar__vk *st, VkCommandBuffer cb) {
    VkMemoryBarrier mb;
    memset(&mb, 0, sizeof mb);
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT;
    VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    st->vkCmdPipelineBarrier(cb, stages, stages, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* Device writes -> host reads: made available to the host domain before the fence signals (the
   transfer/compute -> host barrier); the last command of every submitted command buffer. */
static void dpar__vk_cmd_host_barrier(dpar__vk *st, VkCommandBuffer cb) {
    VkMemoryBarrier mb;
    memset(&mb, 0, sizeof mb);
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_HOST_WRITE_BIT;
    st->vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                             VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* The recording batch of d, begun when none is open (bare: a batch of no commands of its own, for a
   program's recording to be submitted with its fence; its command buffer is not begun). Lock held. */
static dpar_status dpar__vk_begin_batch(dpar__vkdev *d, bool bare, dpar__vkframe **out) {
    dpar__vk *st = d->st;
    if (d->cur >= 0) {
        *out = &d->frames[d->cur];
        return DPAR_OK;
    }
    dpar_status s = dpar__vk_check_lost(st);
    if (s) return s;
    uint64_t serial = d->next_serial;
    int i = (int)(serial % DPAR__VK_FRAMES);
    dpar__vkframe *f = &d->frames[i];
    /* a bare batch carries a recording, submitted right after: when its frame is still in flight, wait for
       every submitted batch, not just the frame's (the device idles only for the wake-up, and the next
       steps find their frames free: one sleep per DPAR__VK_FRAMES replayed steps, not one a step). A
       batch of ops waits for its frame alone: the device keeps running the newer batches while the host
       records this one op by op (>>vulkan program) */
    if (f->state == 2 && (s = dpar__vk_wait_serial(d, bare ? dpar__vk_newest(d) : f->serial)) != DPAR_OK) return s;
    VkResult vr;
    if (f->serial != 0 && (vr = st->vkResetFences(d->ph->device, 1, &f->fence)) != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkResetFences", "device %d", d->index);
    if (!bare && (vr = st->vkResetDescriptorPool(d->ph->device, f->pool, 0)) != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkResetDescriptorPool", "device %d", d->index);
    VkCommandBufferBeginInfo bi;
    memset(&bi, 0, sizeof bi);
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    if (!bare && (vr = st->vkBeginCommandBuffer(f->cb, &bi)) != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkBeginCommandBuffer", "device %d", d->index);
    f->serial = serial;
    f->state = 1;
    f->nops = 0;
    f->bare = bare;
    d->next_serial++;
    d->cur = i;
    *out = f;
    return DPAR_OK;
}
static dpar_status dpar__vk_begin(dpar__vkdev *d, dpar__vkframe **out) {
    return dpar__vk_begin_batch(d, false, out);
}

/* Ends and submits the recording batch, if any. Lock held. */
static dpar_status dpar__vk_submit(dpar__vkdev *d) {
    dpar__vk *st = d->st;
    if (d->cur < 0) return DPAR_OK;
    dpar__vkframe *f = &d->frames[d->cur];
    d->cur = -1;
    if (!f->bare) dpar__vk_cmd_host_barrier(st, f->cb);
    VkResult vr = f->bare ? VK_SUCCESS : st->vkEndCommandBuffer(f->cb);
    if (vr == VK_SUCCESS) {
        VkSubmitInfo si;
        memset(&si, 0, sizeof si);
        si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
        /* the batch, then a program's recordings (none, prog, or a step's staged copies and prog) */
        VkCommandBuffer cbs[3] = { f->cb, d->suffix[0], d->suffix[1] };
        si.commandBufferCount = (f->bare ? 0u : 1u) + (d->suffix[0] ? 1u : 0u) + (d->suffix[1] ? 1u : 0u);
        si.pCommandBuffers = f->bare ? cbs + 1 : cbs;
        d->suffix[0] = d->suffix[1] = VK_NULL_HANDLE;
        /* a loan (>>vulkan interop): wait for the engine's release value, signal an export's ready value */
        VkTimelineSemaphoreSubmitInfo ti;
        memset(&ti, 0, sizeof ti);
        ti.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
        VkPipelineStageFlags wait_stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        uint64_t wv = d->sem_wait, sv = d->sem_signal;
        if (wv) {
            si.waitSemaphoreCount = ti.waitSemaphoreValueCount = 1;
            si.pWaitSemaphores = &d->sem;
            si.pWaitDstStageMask = &wait_stage;
            ti.pWaitSemaphoreValues = &wv;
        }
        if (sv) {
            si.signalSemaphoreCount = ti.signalSemaphoreValueCount = 1;
            si.pSignalSemaphores = &d->sem;
            ti.pSignalSemaphoreValues = &sv;
        }
        if (wv || sv) si.pNext = &ti;
        d->sem_wait = d->sem_signal = 0;
        dpar__mutex_lock(&d->queue->lock);
        if (st->lock_queue) st->lock_queue(st->queue_user); /* the engine's own lock of a shared queue */
        vr = st->vkQueueSubmit(d->queue->queue, 1, &si, f->fence);
        if (st->unlock_queue) st->unlock_queue(st->queue_user);
        dpar__mutex_unlock(&d->queue->lock);
        if (vr == VK_SUCCESS) {
            f->state = 2;
            return DPAR_OK;
        }
        f->state = 0;
        if (f->serial > d->completed) d->completed = f->serial;
        return dpar__vk_fail(st, vr, "vkQueueSubmit", "device %d", d->index);
    }
    f->state = 0;
    if (f->serial > d->completed) d->completed = f->serial;
    return dpar__vk_fail(st, vr, "vkEndCommandBuffer", "device %d", d->index);
}

/* Submits and waits for everything queued on d. Lock held. */
static dpar_status dpar__vk_drain(dpar__vkdev *d) {
    dpar_status s = dpar__vk_submit(d);
    if (s) return s;
    return dpar__vk_wait_serial(d, d->next_serial - 1);
}

/* Waits until no queued work of d touches b. Lock held. */
static dpar_status dpar__vk_buf_idle(dpar__vkdev *d, const dpar__vkbuf *b) {
    if (b->last_serial <= d->completed) return DPAR_OK;
    if (d->cur >= 0 && d->frames[d->cur].serial <= b->last_serial) {
        dpar_status s = dpar__vk_submit(d);
        if (s) return s;
    }
    return dpar__vk_wait_serial(d, b->last_serial);
}

/* dpar__vk_buf_idle before the host refills b, one of a few buffers it writes in turn (the graph's
   staged feed sets, >>graph feeds in dpar.h): when b is still in a submitted batch, waits for every
   submitted batch, not just b's, so the next refills find theirs free and the host sleeps once per
   few steps, not once a step (the device, far behind, is drained: it idles only while the host wakes
   and submits the next step). Lock held. */
static dpar_status dpar__vk_buf_refill(dpar__vkdev *d, const dpar__vkbuf *b) {
    uint64_t newest = dpar__vk_newest(d);
    if (b->last_serial <= d->completed || b->last_serial > newest) return dpar__vk_buf_idle(d, b); /* the open batch */
    return dpar__vk_wait_serial(d, newest);
}

/* Counts one recorded command; submits the batch when it is full. Lock held. */
static dpar_status dpar__vk_recorded(dpar__vkdev *d, dpar__vkframe *f) {
    if (++f->nops >= DPAR__VK_FRAME_OPS) return dpar__vk_submit(d);
    return DPAR_OK;
}

/* Frees the staging buffer of d, if it has one, and forgets it. */
static void dpar__vk_staging_free(dpar__vk *st, dpar__vkdev *d) {
    if (d->staging == VK_NULL_HANDLE) return;
    dpar__vkbuf old;
    memset(&old, 0, sizeof old);
    old.ph = d->ph;
    old.buf = d->staging;
    old.mem = d->staging_mem;
    old.map = d->staging_map;
    dpar__vk_destroy_vkbuf(st, &old);
    d->staging = VK_NULL_HANDLE;
    d->staging_mem = VK_NULL_HANDLE;
    d->staging_map = NULL;
    d->staging_size = 0;
}
/* Makes sure the staging buffer of d holds at least `need` bytes (at most one
   chunk). Lock held. */
static dpar_status dpar__vk_staging(dpar__vkdev *d, VkDeviceSize need) {
    dpar__vk *st = d->st;
    if (need > DPAR__VK_CHUNK) need = DPAR__VK_CHUNK;
    if (d->staging != VK_NULL_HANDLE && d->staging_size >= need) return DPAR_OK;
    dpar_status s = dpar__vk_drain(d);
    if (s) return s;
    dpar__vk_staging_free(st, d);
    VkDeviceSize size = need < ((VkDeviceSize)1 << 20) ? ((VkDeviceSize)1 << 20) : need;
    dpar__vkbuf nb;
    if ((s = dpar__vk_create_vkbuf(st, d->ph, d->index, (size_t)size, 1, &nb)) != DPAR_OK) return s;
    d->staging = nb.buf;
    d->staging_mem = nb.mem;
    d->staging_map = nb.map;
    d->staging_size = nb.size;
    d->staging_alloc = nb.alloc_size;
    d->staging_coherent = nb.coherent;
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   Recording a program (the graph's prog_* hooks, >>vulkan program): while a
   thread records for a device, its dispatches and transfers on that device go
   into the recording's command buffer, with descriptor sets from its own
   pools, instead of the ring; the buffers they touch are listed so that each
   submit can move their last_serial.
   ------------------------------------------------------------------------ */
typedef struct dpar__vkprog {
    dpar__vkframe fr;         /* fr.cb: the recording; fr.pool: the descriptor pool being filled */
    VkDescriptorPool *pools;  /* every pool made for it (fr.pool last) */
    int npools, sets_left;    /* sets left in fr.pool */
    dpar__vkbuf **bufs;       /* the buffers its commands touch, once each */
    int nbufs, capbufs, nops; /* nops: dispatches and transfers recorded */
    int idx;                  /* holds an index check (>>vulkan optim): each submit leaves a report pending */
    uint64_t serial;          /* the batch that carried its last submit (0: never submitted) */
} dpar__vkprog;
static DPAR__TLS dpar__vkprog *dpar__vk_rec; /* what this thread records, NULL: nothing */
static DPAR__TLS int dpar__vk_rec_dev;       /* for this logical device */

static dpar__vkprog *dpar__vk_recording(int dev) {
    return dpar__vk_rec && dpar__vk_rec_dev == dev ? dpar__vk_rec : NULL;
}
/* Host access by the recording thread would see the recorded commands' buffers before they ran. */
static dpar_status dpar__vk_rec_refuse(const char *what) {
    return dpar__err(DPAR_ERR_STATE,
                     "vulkan: %s on a device this thread is recording a graph program for; only device "
                     "ops can be recorded (the graph replays such a node on the host instead)",
                     what);
}
/* A descriptor pool for one frame's worth of ops (DPAR__VK_FRAME_OPS sets of DPAR__VK_BINDINGS storage
   buffers): each ring frame has one, reset when the frame is reused; a recorded program adds one per
   DPAR__VK_FRAME_OPS ops it holds. */
static VkResult dpar__vk_desc_pool(dpar__vk *st, VkDevice dv, VkDescriptorPool *out) {
    VkDescriptorPoolSize ps;
    ps.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    ps.descriptorCount = DPAR__VK_FRAME_OPS * DPAR__VK_BINDINGS;
    VkDescriptorPoolCreateInfo dpi;
    memset(&dpi, 0, sizeof dpi);
    dpi.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    dpi.maxSets = DPAR__VK_FRAME_OPS;
    dpi.poolSizeCount = 1;
    dpi.pPoolSizes = &ps;
    return st->vkCreateDescriptorPool(dv, &dpi, st->alloc, out);
}
/* The recording's frame with a descriptor set free in fr.pool (a new pool when full). Lock held. */
static dpar_status dpar__vk_rec_pool(dpar__vkdev *d, dpar__vkprog *p, dpar__vkframe **out) {
    dpar__vk *st = d->st;
    *out = &p->fr;
    p->nops++;
    if (p->sets_left > 0) return DPAR_OK;
    VkDescriptorPool *np = (VkDescriptorPool *)DPAR_REALLOC(p->pools, (size_t)(p->npools + 1) * sizeof *np);
    if (!np) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory (graph program)");
    p->pools = np;
    VkResult vr = dpar__vk_desc_pool(st, d->ph->device, &p->pools[p->npools]);
    if (vr != VK_SUCCESS) return dpar__vk_fail(st, vr, "vkCreateDescriptorPool", "device %d (graph program)", d->index);
    p->fr.pool = p->pools[p->npools++];
    p->sets_left = DPAR__VK_FRAME_OPS;
    return DPAR_OK;
}
/* A command touching b was recorded: in the ring batch `serial`, or in the recording p (listed once). */
static dpar_status dpar__vk_used(dpar__vkprog *p, dpar__vkbuf *b, uint64_t serial) {
    if (!p) {
        b->last_serial = serial;
        return DPAR_OK;
    }
    for (int i = p->nbufs - 1; i >= 0; i--)
        if (p->bufs[i] == b) return DPAR_OK;
    if (p->nbufs == p->capbufs) {
        int cap = p->capbufs ? 2 * p->capbufs : 32;
        dpar__vkbuf **nb = (dpar__vkbuf **)DPAR_REALLOC(p->bufs, (size_t)cap * sizeof *nb);
        if (!nb) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory (graph program)");
        p->bufs = nb;
        p->capbufs = cap;
    }
    p->bufs[p->nbufs++] = b;
    return DPAR_OK;
}

/* ---------------------------------------------------------------------------
   Pipelines
   ------------------------------------------------------------------------ */
static dpar_status dpar__vk_pipeline(dpar__vk *st, dpar__vkphys *ph, int id, VkPipeline *out) {
    dpar__mutex_lock(&ph->pipe_lock);
    if (ph->pipes[id] != VK_NULL_HANDLE) {
        *out = ph->pipes[id];
        dpar__mutex_unlock(&ph->pipe_lock);
        return DPAR_OK;
    }
    VkShaderModuleCreateInfo mi;
    memset(&mi, 0, sizeof mi);
    mi.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    mi.codeSize = dpar__spv_table[id].size;
    mi.pCode = dpar__spv_table[id].code;
    VkShaderModule mod;
    VkResult vr = st->vkCreateShaderModule(ph->device, &mi, st->alloc, &mod);
    if (vr != VK_SUCCESS) {
        dpar__mutex_unlock(&ph->pipe_lock);
        return dpar__vk_fail(st, vr, "vkCreateShaderModule", "shader %s", dpar__spv_table[id].name);
    }
    VkComputePipelineCreateInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = mod;
    ci.stage.pName = "main";
    ci.layout = ph->layout;
    VkPipeline p;
    vr = st->vkCreateComputePipelines(ph->device, VK_NULL_HANDLE, 1, &ci, st->alloc, &p);
    st->vkDestroyShaderModule(ph->device, mod, st->alloc);
    if (vr != VK_SUCCESS) {
        dpar__mutex_unlock(&ph->pipe_lock);
        return dpar__vk_fail(st, vr, "vkCreateComputePipelines", "shader %s", dpar__spv_table[id].name);
    }
    ph->pipes[id] = p;
    *out = p;
    dpar__mutex_unlock(&ph->pipe_lock);
    return DPAR_OK;
}

/* The error of a buffer of `size` bytes that a shader cannot bind (fn: the shader or op). */
static dpar_status dpar__vk_range_err(const dpar__vkphys *ph, int dev, const char *fn, uint64_t size) {
    return dpar__err(DPAR_ERR_BACKEND,
                     "vulkan: %s: a buffer of %llu bytes exceeds maxStorageBufferRange "
                     "(%u bytes) of device %d; shard it over more devices or use smaller buffers",
                     fn, (unsigned long long)size, ph->props.limits.maxStorageBufferRange, dev);
}
/* Records one dispatch of shader `id` on device dev with buffers b[0..6] = dst, dst2, src0, src1,
   dst3, src2, src3 (NULL: unused), gx x gy x gz workgroups. */
static dpar_status dpar__vk_dispatch3(dpar__vk *st, int dev, int id, dpar__vkbuf *const b[DPAR__VK_BINDINGS],
                                      const dpar__vkpc *pc, uint32_t gx, uint32_t gy, uint32_t gz) {
    dpar__vkphys *ph = st->devs[dev].ph;
    if (gx == 0 || gy == 0 || gz == 0) return DPAR_OK;
    if (gx > ph->props.limits.maxComputeWorkGroupCount[0] || gy > ph->props.limits.maxComputeWorkGroupCount[1] ||
        gz > ph->props.limits.maxComputeWorkGroupCount[2])
        return dpar__err(DPAR_ERR_BACKEND,
                         "vulkan: shader %s needs %u x %u x %u workgroups, more than the device allows "
                         "(%u x %u x %u): a backend bug (every op keeps its dispatches within them); please report it",
                         dpar__spv_table[id].name, gx, gy, gz, ph->props.limits.maxComputeWorkGroupCount[0],
                         ph->props.limits.maxComputeWorkGroupCount[1], ph->props.limits.maxComputeWorkGroupCount[2]);
    for (int i = 0; i < DPAR__VK_BINDINGS; i++)
        if (b[i] && b[i]->size > ph->props.limits.maxStorageBufferRange)
            return dpar__vk_range_err(ph, dev, dpar__spv_table[id].name, b[i]->size);
    VkPipeline pipe = VK_NULL_HANDLE;
    dpar_status s = dpar__vk_pipeline(st, ph, id, &pipe);
    if (s) return s;
    dpar__vkdev *d = &st->devs[dev];
    dpar__mutex_lock(&d->lock);
    dpar__vkframe *f;
    struct dpar__vkprog *rec = dpar__vk_recording(dev);
    if ((s = rec ? dpar__vk_rec_pool(d, rec, &f) : dpar__vk_begin(d, &f)) != DPAR_OK) {
        dpar__mutex_unlock(&d->lock);
        return s;
    }
    VkDescriptorSetAllocateInfo ai;
    memset(&ai, 0, sizeof ai);
    ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    ai.descriptorPool = f->pool;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &ph->dsl;
    VkDescriptorSet set;
    VkResult vr = st->vkAllocateDescriptorSets(ph->device, &ai, &set);
    if (vr != VK_SUCCESS) {
        dpar__mutex_unlock(&d->lock);
        return dpar__vk_fail(st, vr, "vkAllocateDescriptorSets", "device %d", dev);
    }
    if (rec) rec->sets_left--;
    VkDescriptorBufferInfo info[DPAR__VK_BINDINGS];
    VkWriteDescriptorSet w[DPAR__VK_BINDINGS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < DPAR__VK_BINDINGS; i++) {
        const dpar__vkbuf *x = b[i] ? b[i] : &ph->dummy;
        info[i].buffer = x->buf;
        info[i].offset = 0;
        info[i].range = x->size;
        w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w[i].dstSet = set;
        w[i].dstBinding = (uint32_t)i;
        w[i].descriptorCount = 1;
        w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w[i].pBufferInfo = &info[i];
    }
    st->vkUpdateDescriptorSets(ph->device, DPAR__VK_BINDINGS, w, 0, NULL);
    dpar__vk_cmd_barrier(st, f->cb);
    st->vkCmdBindPipeline(f->cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    st->vkCmdBindDescriptorSets(f->cb, VK_PIPELINE_BIND_POINT_COMPUTE, ph->layout, 0, 1, &set, 0, NULL);
    st->vkCmdPushConstants(f->cb, ph->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof *pc, pc);
    st->vkCmdDispatch(f->cb, gx, gy, gz);
    for (int i = 0; i < DPAR__VK_BINDINGS && !s; i++)
        if (b[i]) s = dpar__vk_used(rec, b[i], f->serial);
    if (!s) s = rec ? DPAR_OK : dpar__vk_recorded(d, f);
    dpar__mutex_unlock(&d->lock);
    return s;
}
static dpar_status dpar__vk_dispatch(dpar__vk *st, int dev, int id, dpar__vkbuf *const b[DPAR__VK_BINDINGS],
                                     const dpar__vkpc *pc, uint32_t gx, uint32_t gy) {
    return dpar__vk_dispatch3(st, dev, id, b, pc, gx, gy, 1);
}

/* Records vkCmdFillBuffer of dst's first `size` bytes (src == NULL) or vkCmdCopyBuffer of `size` bytes from
   src at byte soff to dst at byte doff. */
static dpar_status dpar__vk_transfer(dpar__vk *st, int dev, dpar__vkbuf *dst, dpar__vkbuf *src, VkDeviceSize soff,
                                     VkDeviceSize doff, VkDeviceSize size, uint32_t pattern) {
    dpar__vkdev *d = &st->devs[dev];
    dpar__mutex_lock(&d->lock);
    dpar__vkframe *f;
    struct dpar__vkprog *rec = dpar__vk_recording(dev);
    dpar_status s = rec ? dpar__vk_rec_pool(d, rec, &f) : dpar__vk_begin(d, &f);
    if (s) {
        dpar__mutex_unlock(&d->lock);
        return s;
    }
    dpar__vk_cmd_barrier(st, f->cb);
    if (src) {
        VkBufferCopy r;
        r.srcOffset = soff;
        r.dstOffset = doff;
        r.size = size;
        st->vkCmdCopyBuffer(f->cb, src->buf, dst->buf, 1, &r);
        s = dpar__vk_used(rec, src, f->serial);
    } else {
        st->vkCmdFillBuffer(f->cb, dst->buf, 0, size, pattern);
    }
    if (!s) s = dpar__vk_used(rec, dst, f->serial);
    if (!s) s = rec ? DPAR_OK : dpar__vk_recorded(d, f);
    dpar__mutex_unlock(&d->lock);
    return s;
}

/* ---------------------------------------------------------------------------
   Backend entry points
   ------------------------------------------------------------------------ */
/* Waits until the queue of a device whose timeline semaphore was lent is idle, under the engine's
   queue lock. Its batches' fences are not enough before vkDestroySemaphore: Mesa's emulated timelines
   (lavapipe, among others) signal the fence on a submit thread that then still installs and releases
   the semaphore's time points, so destroying it at once frees what that thread is using (heap
   corruption seen in test_export_contract). The thread finishes a batch before it takes the next, so
   the idle wait's own batch orders the destroy after it. */
static void dpar__vk_drain_queue(dpar__vk *st, dpar__vkdev *d) {
    dpar__mutex_lock(&d->queue->lock);
    if (st->lock_queue) st->lock_queue(st->queue_user);
    (void)st->vkQueueWaitIdle(d->queue->queue); /* a lost device has nothing left to run */
    if (st->unlock_queue) st->unlock_queue(st->queue_user);
    dpar__mutex_unlock(&d->queue->lock);
}

static void dpar__vk_shutdown(void *state) {
    dpar__vk *st = (dpar__vk *)state;
    if (!st) return;
    /* an adopted device may be busy with the engine's work (and vkDeviceWaitIdle would need all of its
       queues locked): wait for dpar's own batches only */
    for (int p = 0; !st->adopted && st->phys && p < st->nphys; p++)
        if (st->phys[p].device != VK_NULL_HANDLE) st->vkDeviceWaitIdle(st->phys[p].device);
    for (int i = 0; st->adopted && st->devs && i < st->ndev; i++)
        if (st->devs[i].cmd_pool != VK_NULL_HANDLE) dpar__vk_wait_serial(&st->devs[i], st->devs[i].next_serial - 1);
    for (int i = 0; st->adopted && st->devs && i < st->ndev; i++)
        if (st->devs[i].sem != VK_NULL_HANDLE) dpar__vk_drain_queue(st, &st->devs[i]);
    for (int i = 0; st->devs && i < st->ndev; i++) {
        dpar__vkdev *d = &st->devs[i];
        if (d->ph && d->ph->device != VK_NULL_HANDLE) {
            VkDevice dv = d->ph->device;
            if (d->sem != VK_NULL_HANDLE) st->vkDestroySemaphore(dv, d->sem, st->alloc);
            for (int j = 0; j < DPAR__VK_FRAMES; j++) {
                if (d->frames[j].fence != VK_NULL_HANDLE) st->vkDestroyFence(dv, d->frames[j].fence, st->alloc);
                if (d->frames[j].pool != VK_NULL_HANDLE) st->vkDestroyDescriptorPool(dv, d->frames[j].pool, st->alloc);
            }
            if (d->cmd_pool != VK_NULL_HANDLE) st->vkDestroyCommandPool(dv, d->cmd_pool, st->alloc);
            dpar__vk_destroy_vkbuf(st, &d->cstage);
            if (d->idx_err) dpar__vk_destroy_vkbuf(st, d->idx_err);
            DPAR_FREE(d->idx_err);
            if (d->xent_tmp) dpar__vk_destroy_vkbuf(st, d->xent_tmp);
            DPAR_FREE(d->xent_tmp);
            for (int j = 0; j < 7; j++) {
                if (d->half[j]) dpar__vk_destroy_vkbuf(st, d->half[j]);
                DPAR_FREE(d->half[j]);
            }
            dpar__vk_staging_free(st, d);
        }
        DPAR_FREE(d->hbuf[0]);
        DPAR_FREE(d->hbuf[1]);
        dpar__mutex_destroy(&d->lock);
    }
    DPAR_FREE(st->devs);
    for (int p = 0; st->phys && p < st->nphys; p++) {
        dpar__vkphys *ph = &st->phys[p];
        if (ph->device != VK_NULL_HANDLE) {
            for (int i = 0; i < DPAR__SPV_COUNT; i++)
                if (ph->pipes[i] != VK_NULL_HANDLE) st->vkDestroyPipeline(ph->device, ph->pipes[i], st->alloc);
            dpar__vk_destroy_vkbuf(st, &ph->dummy);
            if (ph->layout != VK_NULL_HANDLE) st->vkDestroyPipelineLayout(ph->device, ph->layout, st->alloc);
            if (ph->dsl != VK_NULL_HANDLE) st->vkDestroyDescriptorSetLayout(ph->device, ph->dsl, st->alloc);
            if (!st->adopted) st->vkDestroyDevice(ph->device, NULL);
        }
        if (ph->queues) {
            for (int i = 0; i < ph->nqueues; i++) dpar__mutex_destroy(&ph->queues[i].lock);
            DPAR_FREE(ph->queues);
        }
        if (ph->pipe_lock_init) dpar__mutex_destroy(&ph->pipe_lock);
    }
    DPAR_FREE(st->phys);
    if (!st->adopted && st->instance != VK_NULL_HANDLE && st->vkDestroyInstance)
        st->vkDestroyInstance(st->instance, NULL);
    /* The loader stays loaded (as volk does): drivers keep thread-local state and
       exit handlers that must not be unmapped while the process runs. */
    DPAR_FREE(st);
}

static int dpar__vk_has_ext(const VkExtensionProperties *e, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(e[i].extensionName, name) == 0) return 1;
    return 0;
}

/* Queue family with compute and the most queues (first on ties); -1 if none. */
static int dpar__vk_compute_family(dpar__vk *st, VkPhysicalDevice pd, uint32_t *count) {
    uint32_t n = 0;
    st->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    if (n == 0) return -1;
    VkQueueFamilyProperties *q = (VkQueueFamilyProperties *)DPAR_MALLOC(n * sizeof *q);
    if (!q) return -1;
    st->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
    int best = -1;
    for (uint32_t i = 0; i < n; i++)
        if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && q[i].queueCount > 0 &&
            (best < 0 || q[i].queueCount > q[best].queueCount))
            best = (int)i;
    if (best >= 0 && count) *count = q[best].queueCount;
    DPAR_FREE(q);
    return best;
}

/* Command pool, command buffers, fences and descriptor pools of one logical device. */
static dpar_status dpar__vk_init_device(dpar__vk *st, dpar__vkdev *d) {
    VkResult vr;
    VkDevice dv = d->ph->device;
    VkCommandPoolCreateInfo pi;
    memset(&pi, 0, sizeof pi);
    pi.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pi.queueFamilyIndex = d->ph->family;
    if ((vr = st->vkCreateCommandPool(dv, &pi, st->alloc, &d->cmd_pool)) != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkCreateCommandPool", "device %d", d->index);
    VkCommandBuffer cbs[DPAR__VK_FRAMES];
    VkCommandBufferAllocateInfo ai;
    memset(&ai, 0, sizeof ai);
    ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    ai.commandPool = d->cmd_pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = DPAR__VK_FRAMES;
    if ((vr = st->vkAllocateCommandBuffers(dv, &ai, cbs)) != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkAllocateCommandBuffers", "device %d", d->index);
    for (int j = 0; j < DPAR__VK_FRAMES; j++) {
        dpar__vkframe *f = &d->frames[j];
        f->cb = cbs[j];
        VkFenceCreateInfo fi;
        memset(&fi, 0, sizeof fi);
        fi.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
        if ((vr = st->vkCreateFence(dv, &fi, st->alloc, &f->fence)) != VK_SUCCESS)
            return dpar__vk_fail(st, vr, "vkCreateFence", "device %d", d->index);
        if ((vr = dpar__vk_desc_pool(st, dv, &f->pool)) != VK_SUCCESS)
            return dpar__vk_fail(st, vr, "vkCreateDescriptorPool", "device %d", d->index);
    }
    return DPAR_OK;
}

/* >>vulkan adopt =============================================================
   desc.vulkan.external: an engine's instance, physical device, device and
   queue, checked and used as they are. dpar creates only its own objects on
   the device (with the engine's allocator) and destroys only those. */

static dpar_status dpar__vk_open_loader(dpar__vk *st, uint32_t *iver);
static dpar_status dpar__vk_load_fns(dpar__vk *st);

/* Whether pd offers timeline semaphores (Vulkan 1.2 core). */
static int dpar__vk_has_timeline(dpar__vk *st, VkPhysicalDevice pd) {
    VkPhysicalDeviceProperties p;
    st->vkGetPhysicalDeviceProperties(pd, &p);
    if (p.apiVersion < VK_API_VERSION_1_2) return 0;
    VkPhysicalDeviceTimelineSemaphoreFeatures tl;
    memset(&tl, 0, sizeof tl);
    tl.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES;
    VkPhysicalDeviceFeatures2 f2;
    memset(&f2, 0, sizeof f2);
    f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    f2.pNext = &tl;
    st->vkGetPhysicalDeviceFeatures2(pd, &f2);
    return tl.timelineSemaphore == VK_TRUE;
}

/* The engine's queue family: it must exist and run compute shaders. */
static dpar_status dpar__vk_check_family(dpar__vk *st, VkPhysicalDevice pd, uint32_t family) {
    uint32_t n = 0;
    st->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties *q = (VkQueueFamilyProperties *)DPAR_MALLOC((n ? n : 1) * sizeof *q);
    if (!q) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    st->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
    dpar_status s = DPAR_OK;
    if (family >= n)
        s = dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                      "vulkan: desc.vulkan.external.queue_family = %u, but the physical device has %u queue "
                      "famil%s (0..%u); pass the family index the queue was created with",
                      family, n, n == 1 ? "y" : "ies", n ? n - 1 : 0);
    else if (!(q[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
        int other = dpar__vk_compute_family(st, pd, NULL);
        s = dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                      "vulkan: desc.vulkan.external.queue_family = %u has no VK_QUEUE_COMPUTE_BIT (flags 0x%x); dpar "
                      "runs compute shaders: give it a queue of a compute family (family %d has one)",
                      family, (unsigned)q[family].queueFlags, other);
    }
    DPAR_FREE(q);
    return s;
}

/* Checks desc.vulkan.external and takes its handles (entry points: the engine's vkGetInstanceProcAddr,
   else the dlopen'ed loader's). Before anything is created. */
static dpar_status dpar__vk_adopt(dpar__vk *st, const dpar_vulkan_external *x) {
    const char *missing = !x->instance          ? "instance"
                          : !x->physical_device ? "physical_device"
                          : !x->queue           ? "queue"
                                                : NULL;
    if (missing)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "vulkan: desc.vulkan.external.device is set but .%s is NULL; an adopted device needs its "
                         "instance, physical device and a queue",
                         missing);
    if (!x->lock_queue != !x->unlock_queue)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "vulkan: desc.vulkan.external has only one of lock_queue / unlock_queue; give both or "
                         "neither");
    if (x->get_instance_proc_addr) {
        st->gipa = (PFN_vkGetInstanceProcAddr)x->get_instance_proc_addr;
    } else {
        uint32_t iver = 0;
        dpar_status s = dpar__vk_open_loader(st, &iver);
        if (s) return s;
    }
    st->adopted = 1;
    st->instance = (VkInstance)x->instance;
    st->alloc = (const VkAllocationCallbacks *)x->allocator;
    st->lock_queue = x->lock_queue;
    st->unlock_queue = x->unlock_queue;
    st->queue_user = x->queue_user;
    st->api_version = (int)VK_API_VERSION_1_1; /* the engine's instance version is unknown: ask only for 1.1 */
    dpar_status s = dpar__vk_load_fns(st);
    if (s) return s;
    VkPhysicalDevice pd = (VkPhysicalDevice)x->physical_device;
    VkPhysicalDeviceProperties p;
    st->vkGetPhysicalDeviceProperties(pd, &p);
    if (p.apiVersion < VK_API_VERSION_1_1)
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "vulkan: the engine's device %s has Vulkan %u.%u; dpar needs 1.1",
                         p.deviceName, VK_VERSION_MAJOR(p.apiVersion), VK_VERSION_MINOR(p.apiVersion));
    if ((s = dpar__vk_check_family(st, pd, x->queue_family))) return s;
    if (x->timeline_semaphore && !dpar__vk_has_timeline(st, pd))
        return dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                         "vulkan: desc.vulkan.external.timeline_semaphore is set, but %s has no timeline semaphores "
                         "(Vulkan 1.2 timelineSemaphore); leave it false (dpar_vulkan_buffer_export is then "
                         "unavailable)",
                         p.deviceName);
    return DPAR_OK;
}

/* ph on the engine's device: its one queue, shared by every logical device. */
static dpar_status dpar__vk_adopt_device(dpar__vk *st, const dpar_vulkan_external *x, dpar__vkphys *ph) {
    ph->device = (VkDevice)x->device;
    ph->family = x->queue_family;
    ph->timeline = x->timeline_semaphore;
    ph->queues = (dpar__vkqueue *)DPAR_MALLOC(sizeof *ph->queues);
    if (!ph->queues) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    ph->nqueues = 1;
    ph->queues[0].queue = (VkQueue)x->queue;
    dpar__mutex_init(&ph->queues[0].lock);
    DPAR__UNUSED(st);
    return DPAR_OK;
}

/* dpar's own VkDevice on ph with up to `nq` queues of the compute family with the most queues. */
static dpar_status dpar__vk_create_device(dpar__vk *st, dpar__vkphys *ph, int nq) {
    VkResult vr;
    uint32_t qcount = 0;
    ph->family = (uint32_t)dpar__vk_compute_family(st, ph->pd, &qcount);
    int nqueues = (int)((uint32_t)nq < qcount ? (uint32_t)nq : qcount);
    float *prio = (float *)DPAR_MALLOC((size_t)nqueues * sizeof *prio);
    if (!prio) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    for (int i = 0; i < nqueues; i++) prio[i] = 1.0f;
    VkDeviceQueueCreateInfo qci;
    memset(&qci, 0, sizeof qci);
    qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci.queueFamilyIndex = ph->family;
    qci.queueCount = (uint32_t)nqueues;
    qci.pQueuePriorities = prio;
    uint32_t ndext = 0;
    st->vkEnumerateDeviceExtensionProperties(ph->pd, NULL, &ndext, NULL);
    VkExtensionProperties *dexts = (VkExtensionProperties *)DPAR_MALLOC((ndext ? ndext : 1) * sizeof *dexts);
    if (!dexts) {
        DPAR_FREE(prio);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    }
    st->vkEnumerateDeviceExtensionProperties(ph->pd, NULL, &ndext, dexts);
    const char *dev_exts[1] = { "VK_KHR_portability_subset" };
    int subset = dpar__vk_has_ext(dexts, ndext, dev_exts[0]);
    DPAR_FREE(dexts);
    VkDeviceCreateInfo dci;
    memset(&dci, 0, sizeof dci);
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.enabledExtensionCount = subset ? 1u : 0u;
    dci.ppEnabledExtensionNames = dev_exts;
    vr = st->vkCreateDevice(ph->pd, &dci, NULL, &ph->device);
    DPAR_FREE(prio);
    if (vr != VK_SUCCESS) {
        ph->device = VK_NULL_HANDLE;
        return dpar__vk_fail(st, vr, "vkCreateDevice", "%s, %d queue(s) of family %u", ph->props.deviceName, nqueues,
                             ph->family);
    }
    ph->queues = (dpar__vkqueue *)DPAR_MALLOC((size_t)nqueues * sizeof *ph->queues);
    if (!ph->queues) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    ph->nqueues = nqueues;
    for (int i = 0; i < nqueues; i++) {
        st->vkGetDeviceQueue(ph->device, ph->family, (uint32_t)i, &ph->queues[i].queue);
        dpar__mutex_init(&ph->queues[i].lock);
    }
    return DPAR_OK;
}

/* Properties, driver name, memory types and the mapping policy of one physical device. */
static void dpar__vk_query_phys(dpar__vk *st, dpar__vkphys *ph) {
    VkPhysicalDeviceDriverProperties drv;
    memset(&drv, 0, sizeof drv);
    drv.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
    VkPhysicalDeviceMaintenance3Properties m3;
    memset(&m3, 0, sizeof m3);
    m3.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES;
    VkPhysicalDeviceIDProperties idp;
    memset(&idp, 0, sizeof idp);
    idp.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES;
    idp.pNext = &m3;
    VkPhysicalDeviceSubgroupProperties sg;
    memset(&sg, 0, sizeof sg);
    sg.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
    sg.pNext = &idp;
    VkPhysicalDeviceProperties2 p2;
    memset(&p2, 0, sizeof p2);
    p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    p2.pNext = &sg;
    st->vkGetPhysicalDeviceProperties(ph->pd, &ph->props);
    int has_drv = (uint32_t)st->api_version >= VK_API_VERSION_1_2 && ph->props.apiVersion >= VK_API_VERSION_1_2;
    if (has_drv) m3.pNext = &drv;
    st->vkGetPhysicalDeviceProperties2(ph->pd, &p2);
    ph->max_alloc = m3.maxMemoryAllocationSize ? m3.maxMemoryAllocationSize : ~(VkDeviceSize)0;
    memcpy(ph->uuid, idp.deviceUUID, sizeof ph->uuid);
    ph->lanes8 = sg.subgroupSize == 8 && (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                 (sg.supportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT);
    int llvmpipe = has_drv && drv.driverID == VK_DRIVER_ID_MESA_LLVMPIPE;
    ph->loop_cap = llvmpipe || ph->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? DPAR__VK_LOOP_CAP : 0;
    if (has_drv && drv.driverName[0])
        snprintf(ph->driver, sizeof ph->driver, "%.31s %.31s", drv.driverName, drv.driverInfo);
    else
        snprintf(ph->driver, sizeof ph->driver, "driver version 0x%x", ph->props.driverVersion);
    st->vkGetPhysicalDeviceMemoryProperties(ph->pd, &ph->memprops);
    ph->atom = ph->props.limits.nonCoherentAtomSize ? ph->props.limits.nonCoherentAtomSize : 1;
    /* map device memory in place unless it is a discrete GPU without cached host-visible device memory
       (host reads from uncached BAR memory are very slow: stage instead) */
    int cached_dl = 0;
    for (uint32_t i = 0; i < ph->memprops.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = ph->memprops.memoryTypes[i].propertyFlags;
        if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
            (f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT))
            cached_dl = 1;
    }
    ph->prefer_mappable =
        !st->force_staging && (ph->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU || cached_dl);
}

/* One descriptor set layout and pipeline layout for every shader; more bindings than the stage
   allows would be invalid usage, not a reported error. */
static dpar_status dpar__vk_create_layouts(dpar__vk *st, dpar__vkphys *ph) {
    VkResult vr;
    if (ph->props.limits.maxPerStageDescriptorStorageBuffers < DPAR__VK_BINDINGS)
        return dpar__err(DPAR_ERR_BACKEND,
                         "vulkan: %s allows %u storage buffers per shader stage; dpar's shaders bind %d "
                         "(use another device or the cpu backend)",
                         ph->props.deviceName, ph->props.limits.maxPerStageDescriptorStorageBuffers, DPAR__VK_BINDINGS);
    VkDescriptorSetLayoutBinding lb[DPAR__VK_BINDINGS];
    memset(lb, 0, sizeof lb);
    for (int i = 0; i < DPAR__VK_BINDINGS; i++) {
        lb[i].binding = (uint32_t)i;
        lb[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        lb[i].descriptorCount = 1;
        lb[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo dli;
    memset(&dli, 0, sizeof dli);
    dli.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    dli.bindingCount = DPAR__VK_BINDINGS;
    dli.pBindings = lb;
    if ((vr = st->vkCreateDescriptorSetLayout(ph->device, &dli, st->alloc, &ph->dsl)) != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkCreateDescriptorSetLayout", "%s", ph->props.deviceName);
    VkPushConstantRange pcr;
    pcr.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    pcr.offset = 0;
    pcr.size = sizeof(dpar__vkpc);
    VkPipelineLayoutCreateInfo pli;
    memset(&pli, 0, sizeof pli);
    pli.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &ph->dsl;
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &pcr;
    if ((vr = st->vkCreatePipelineLayout(ph->device, &pli, st->alloc, &ph->layout)) != VK_SUCCESS)
        return dpar__vk_fail(st, vr, "vkCreatePipelineLayout", "%s", ph->props.deviceName);
    return DPAR_OK;
}

/* Properties, VkDevice with `nq` queues (or the engine's, adopted), layouts and the dummy buffer of
   one physical device. */
static dpar_status dpar__vk_init_phys(dpar__vk *st, const dpar_runtime_desc *desc, dpar__vkphys *ph, int nq) {
    dpar__vk_query_phys(st, ph);
    dpar_status s =
        st->adopted ? dpar__vk_adopt_device(st, &desc->vulkan.external, ph) : dpar__vk_create_device(st, ph, nq);
    if (s) return s;
    dpar__mutex_init(&ph->pipe_lock);
    ph->pipe_lock_init = 1;
    s = dpar__vk_create_layouts(st, ph);
    return s ? s : dpar__vk_create_vkbuf(st, ph, 0, 16, 0, &ph->dummy);
}

/* >>vulkan init ==============================================================
   dpar__vk_init_impl reads as its phases: settings, loader, instance, the
   usable physical devices, which of them to use, then open them. */

#if defined(_WIN32)
#define DPAR__VK_LOADER_NAME "vulkan-1.dll"
#elif defined(DPAR__MACOS)
#define DPAR__VK_LOADER_NAME "libvulkan.1.dylib"
#else
#define DPAR__VK_LOADER_NAME "libvulkan.so.1"
#endif
/* Loads the loader and checks it offers Vulkan 1.1; *iver: its instance version. */
static dpar_status dpar__vk_open_loader(dpar__vk *st, uint32_t *iver) {
    const char *libname = getenv("DPAR_VK_LOADER");
    char why[256];
    if (dpar__env_blank(libname)) libname = DPAR__VK_LOADER_NAME;
    st->lib = dpar__dl_open(libname);
    if (!st->lib) {
        const char *e = dpar__dl_error(why, sizeof why);
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "vulkan: cannot load the Vulkan loader %s (%s); install it (Debian: libvulkan1 and a "
                         "driver such as mesa-vulkan-drivers) or use the cpu backend",
                         libname, e ? e : "dlopen failed");
    }
    st->gipa = (PFN_vkGetInstanceProcAddr)dpar__dl_sym(st->lib, "vkGetInstanceProcAddr");
    if (!st->gipa)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE, "vulkan: %s has no vkGetInstanceProcAddr; not a Vulkan loader",
                         libname);
    st->vkCreateInstance = (PFN_vkCreateInstance)st->gipa(VK_NULL_HANDLE, "vkCreateInstance");
    st->vkEnumerateInstanceExtensionProperties =
        (PFN_vkEnumerateInstanceExtensionProperties)st->gipa(VK_NULL_HANDLE, "vkEnumerateInstanceExtensionProperties");
    st->vkEnumerateInstanceVersion =
        (PFN_vkEnumerateInstanceVersion)st->gipa(VK_NULL_HANDLE, "vkEnumerateInstanceVersion");
    if (!st->vkCreateInstance || !st->vkEnumerateInstanceExtensionProperties)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE, "vulkan: the loader %s lacks vkCreateInstance", libname);
    *iver = VK_API_VERSION_1_0;
    if (st->vkEnumerateInstanceVersion) st->vkEnumerateInstanceVersion(iver);
    if (*iver < VK_API_VERSION_1_1)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE, "vulkan: the loader supports Vulkan %u.%u; dpar needs 1.1",
                         VK_VERSION_MAJOR(*iver), VK_VERSION_MINOR(*iver));
    return DPAR_OK;
}

/* The instance (with portability enumeration where the loader offers it,
   e.g. MoltenVK) and every instance- and device-level entry point. */
static dpar_status dpar__vk_create_instance(dpar__vk *st, uint32_t iver) {
    uint32_t next = 0;
    st->vkEnumerateInstanceExtensionProperties(NULL, &next, NULL);
    VkExtensionProperties *iexts = (VkExtensionProperties *)DPAR_MALLOC((next ? next : 1) * sizeof *iexts);
    if (!iexts) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    st->vkEnumerateInstanceExtensionProperties(NULL, &next, iexts);
    int portability = dpar__vk_has_ext(iexts, next, VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME);
    DPAR_FREE(iexts);
    const char *inst_exts[1] = { VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME };
    VkApplicationInfo app;
    memset(&app, 0, sizeof app);
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "dpar";
    app.pEngineName = "dpar.h";
    app.engineVersion = VK_MAKE_VERSION(DPAR_VERSION_MAJOR, DPAR_VERSION_MINOR, 0);
    app.apiVersion = iver >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_1;
    st->api_version = (int)app.apiVersion;
    VkInstanceCreateInfo ici;
    memset(&ici, 0, sizeof ici);
    ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ici.pApplicationInfo = &app;
    if (portability) {
        ici.flags = VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
        ici.enabledExtensionCount = 1;
        ici.ppEnabledExtensionNames = inst_exts;
    }
    VkResult vr = st->vkCreateInstance(&ici, NULL, &st->instance);
    if (vr != VK_SUCCESS) {
        st->instance = VK_NULL_HANDLE;
        if (vr == VK_ERROR_INCOMPATIBLE_DRIVER || vr == VK_ERROR_INITIALIZATION_FAILED ||
            vr == VK_ERROR_LAYER_NOT_PRESENT || vr == VK_ERROR_EXTENSION_NOT_PRESENT)
            return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                             "vulkan: vkCreateInstance failed: %s (no usable Vulkan driver (ICD) or layer; install "
                             "one, e.g. mesa-vulkan-drivers, check VK_ICD_FILENAMES / VK_INSTANCE_LAYERS, or use the "
                             "cpu backend)",
                             dpar__vk_result_name(vr));
        return dpar__vk_fail(st, vr, "vkCreateInstance", "Vulkan %u.%u", VK_VERSION_MAJOR(app.apiVersion),
                             VK_VERSION_MINOR(app.apiVersion));
    }
    return dpar__vk_load_fns(st);
}

/* Every instance- and device-level entry point of st->instance, through st->gipa. */
static dpar_status dpar__vk_load_fns(dpar__vk *st) {
#define DPAR__VK_LOAD_I(name)                                    \
    if (!(st->name = (PFN_##name)st->gipa(st->instance, #name))) \
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE, "vulkan: the loader lacks %s", #name);
    DPAR__VK_INSTANCE_FNS(DPAR__VK_LOAD_I)
#undef DPAR__VK_LOAD_I

    /* device-level entry points through the loader's trampolines: valid for
       every VkDevice of this instance */
#define DPAR__VK_LOAD_D(name)                                    \
    if (!(st->name = (PFN_##name)st->gipa(st->instance, #name))) \
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE, "vulkan: the loader lacks %s", #name);
    DPAR__VK_DEVICE_FNS(DPAR__VK_LOAD_D)
#undef DPAR__VK_LOAD_D
    return DPAR_OK;
}

/* The usable physical devices (Vulkan >= 1.1 and a compute queue), GPUs first. */
typedef struct dpar__vk_usable {
    int n;
    VkPhysicalDevice *pd; /* [n] */
    int *kind;            /* [n] 0 discrete, 1 integrated, 2 virtual, 3 other, 4 CPU */
} dpar__vk_usable;

static void dpar__vk_usable_free(dpar__vk_usable *u) {
    DPAR_FREE(u->pd);
    DPAR_FREE(u->kind);
    memset(u, 0, sizeof *u);
}

/* Fills *u with the physical devices with Vulkan >= 1.1 and a compute queue,
   GPUs first: discrete, integrated, virtual, other, then CPU implementations
   (llvmpipe, SwiftShader); enumeration order within a kind. */
static dpar_status dpar__vk_list_usable(dpar__vk *st, dpar__vk_usable *u) {
    memset(u, 0, sizeof *u);
    uint32_t npd = 0;
    VkResult vr = st->vkEnumeratePhysicalDevices(st->instance, &npd, NULL);
    if (vr != VK_SUCCESS && vr != VK_INCOMPLETE) return dpar__vk_fail(st, vr, "vkEnumeratePhysicalDevices", "instance");
    if (npd == 0)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "vulkan: no Vulkan physical device found (the loader found no "
                         "working driver; install one, e.g. mesa-vulkan-drivers, or use the cpu backend)");
    VkPhysicalDevice *pds = (VkPhysicalDevice *)DPAR_MALLOC(npd * sizeof *pds);
    u->pd = (VkPhysicalDevice *)DPAR_MALLOC(npd * sizeof *u->pd);
    u->kind = (int *)DPAR_MALLOC(npd * sizeof *u->kind);
    if (!pds || !u->pd || !u->kind) {
        DPAR_FREE(pds);
        dpar__vk_usable_free(u);
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    }
    vr = st->vkEnumeratePhysicalDevices(st->instance, &npd, pds);
    if (vr != VK_SUCCESS && vr != VK_INCOMPLETE) {
        DPAR_FREE(pds);
        dpar__vk_usable_free(u);
        return dpar__vk_fail(st, vr, "vkEnumeratePhysicalDevices", "instance");
    }
    static const VkPhysicalDeviceType order[5] = { VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU,
                                                   VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU,
                                                   VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU, VK_PHYSICAL_DEVICE_TYPE_OTHER,
                                                   VK_PHYSICAL_DEVICE_TYPE_CPU };
    for (int o = 0; o < 5; o++)
        for (uint32_t i = 0; i < npd; i++) {
            VkPhysicalDeviceProperties p;
            st->vkGetPhysicalDeviceProperties(pds[i], &p);
            int kind = 3;
            for (int q = 0; q < 5; q++)
                if (p.deviceType == order[q]) kind = q;
            if (kind != o || p.apiVersion < VK_API_VERSION_1_1 || dpar__vk_compute_family(st, pds[i], NULL) < 0)
                continue;
            u->kind[u->n] = kind;
            u->pd[u->n++] = pds[i];
        }
    DPAR_FREE(pds);
    if (u->n == 0) {
        dpar__vk_usable_free(u);
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "vulkan: none of the %u Vulkan devices supports Vulkan 1.1 "
                         "with a compute queue",
                         npd);
    }
    return DPAR_OK;
}

/* Which usable devices to open: [*first, *first + *nphys), and *n logical
   devices over them. The one asked for, else every device of the best kind
   (with MPI: this process's node-local share). */
static dpar_status dpar__vk_pick(const dpar__vk_settings *set, const dpar__vk_usable *u, int requested, int local_index,
                                 int local_count, int *first, int *nphys, int *n) {
    int explicit_dev = set->device_from[0] != 0;
    int want = explicit_dev ? set->device : 0;
    if (explicit_dev && (want < 0 || want >= u->n))
        return dpar__err(DPAR_ERR_DEVICE_COUNT,
                         "vulkan: %s asks for usable device %d (0-based), but only %d usable "
                         "Vulkan device(s) exist (0..%d)",
                         set->device_from, want, u->n, u->n - 1);
    int nbest = 1;
    *first = explicit_dev ? want : 0;
    if (!explicit_dev) {
        while (nbest < u->n && u->kind[nbest] == u->kind[0]) nbest++;
        /* several processes on this node (MPI): each opens its own share of
           the best devices, by node-local rank (with fewer devices than
           processes, ranks share one and dpar_runtime_create names them) */
        if (local_count > 1) {
            if (nbest >= local_count) {
                int per = nbest / local_count;
                *first = local_index * per;
                nbest = per;
            } else {
                *first = local_index % nbest;
                nbest = 1;
            }
        }
    }
    *n = requested > 0 ? requested : nbest;
    if (*n > DPAR_MAX_DEVICES)
        return dpar__err(DPAR_ERR_DEVICE_COUNT, "vulkan: %d devices asked, at most %d logical devices are supported",
                         *n, (int)DPAR_MAX_DEVICES);
    *nphys = *n < nbest ? *n : nbest;
    return DPAR_OK;
}

/* Opens physical devices pd[0..nphys) and n logical devices dealt
   round-robin over them (logical device i runs on physical device i % nphys). */
static dpar_status dpar__vk_open(dpar__vk *st, const dpar_runtime_desc *desc, const VkPhysicalDevice *pd, int first,
                                 int nphys, int n) {
    st->phys = (dpar__vkphys *)DPAR_MALLOC((size_t)nphys * sizeof *st->phys);
    if (!st->phys) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    memset(st->phys, 0, (size_t)nphys * sizeof *st->phys);
    st->nphys = nphys;
    for (int p = 0; p < nphys; p++) {
        st->phys[p].index = first + p;
        st->phys[p].pd = pd[p];
    }
    for (int p = 0; p < nphys; p++) {
        int on_p = n / nphys + (p < n % nphys ? 1 : 0);
        dpar_status s = dpar__vk_init_phys(st, desc, &st->phys[p], on_p);
        if (s) return s;
    }
    st->devs = (dpar__vkdev *)DPAR_MALLOC((size_t)n * sizeof *st->devs);
    if (!st->devs) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    memset(st->devs, 0, (size_t)n * sizeof *st->devs);
    st->ndev = n;
    for (int i = 0; i < n; i++) {
        dpar__vkdev *d = &st->devs[i];
        d->st = st;
        d->index = i;
        d->ph = &st->phys[i % nphys];
        d->cur = -1;
        d->next_serial = 1;
        d->queue = &d->ph->queues[(i / nphys) % d->ph->nqueues];
        dpar__mutex_init(&d->lock);
    }
    for (int i = 0; i < n; i++) {
        dpar_status s = dpar__vk_init_device(st, &st->devs[i]);
        if (s) return s;
    }
    return DPAR_OK;
}

static dpar_status dpar__vk_init_impl(dpar__vk *st, const dpar_runtime_desc *desc, int requested, int local_index,
                                      int local_count, int *count) {
    dpar__vk_settings set;
    dpar__vk_usable u;
    uint32_t iver = 0;
    int first = 0, nphys = 0, n = 0;
    dpar_status s;
    if ((s = dpar__vk_settings_get(desc, &set))) return s;
    st->force_noncoherent = set.force_noncoherent;
    st->force_staging = set.force_staging;
    st->force_tiled = set.force_tiled;
    if (desc && desc->vulkan.external.device) { /* the engine's device: every logical device on its queue */
        if ((s = dpar__vk_adopt(st, &desc->vulkan.external))) return s;
        VkPhysicalDevice pd = (VkPhysicalDevice)desc->vulkan.external.physical_device;
        n = requested > 0 ? requested : 1;
        if (n > DPAR_MAX_DEVICES)
            return dpar__err(DPAR_ERR_DEVICE_COUNT,
                             "vulkan: %d devices asked, at most %d logical devices are supported", n,
                             (int)DPAR_MAX_DEVICES);
        if ((s = dpar__vk_open(st, desc, &pd, 0, 1, n))) return s;
        *count = n;
        return DPAR_OK;
    }
    if ((s = dpar__vk_open_loader(st, &iver))) return s;
    if ((s = dpar__vk_create_instance(st, iver))) return s;
    if ((s = dpar__vk_list_usable(st, &u))) return s;
    s = dpar__vk_pick(&set, &u, requested, local_index, local_count, &first, &nphys, &n);
    if (!s) s = dpar__vk_open(st, desc, u.pd + first, first, nphys, n);
    dpar__vk_usable_free(&u);
    if (s) return s;
    *count = n;
    return DPAR_OK;
}

static dpar_status dpar__vk_init(const dpar_runtime_desc *desc, int requested, int local_index, int local_count,
                                 void **state, int *count) {
    *state = NULL;
    *count = 0;
    dpar__vk *st = (dpar__vk *)DPAR_MALLOC(sizeof *st);
    if (!st) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    memset(st, 0, sizeof *st);
    dpar_status s = dpar__vk_init_impl(st, desc, requested, local_index, local_count, count);
    if (s) {
        char saved[DPAR__ERR_LEN];
        snprintf(saved, sizeof saved, "%s", dpar_last_error());
        dpar__vk_shutdown(st);
        *count = 0;
        return dpar__err(s, "%s", saved);
    }
    *state = st;
    return DPAR_OK;
}

static const char *dpar__vk_vendor(uint32_t id) {
    switch (id) {
    case 0x1002: return "AMD";
    case 0x1010: return "ImgTec";
    case 0x106B: return "Apple";
    case 0x10DE: return "NVIDIA";
    case 0x13B5: return "ARM";
    case 0x14E4: return "Broadcom";
    case 0x5143: return "Qualcomm";
    case 0x8086: return "Intel";
    case 0x10005: return "Mesa";
    default: return NULL;
    }
}

static dpar_status dpar__vk_device_info(void *state, int dev, dpar_device_info *out) {
    dpar__vk *st = (dpar__vk *)state;
    const dpar__vkphys *ph = st->devs[dev].ph;
    memset(out, 0, sizeof *out);
    if (st->ndev > 1)
        snprintf(out->name, sizeof out->name, "%.90s [logical %d/%d]", ph->props.deviceName, dev + 1, st->ndev);
    else
        snprintf(out->name, sizeof out->name, "%.127s", ph->props.deviceName);
    const char *v = dpar__vk_vendor(ph->props.vendorID);
    if (v)
        snprintf(out->vendor, sizeof out->vendor, "%s", v);
    else
        snprintf(out->vendor, sizeof out->vendor, "vendor 0x%x", ph->props.vendorID);
    snprintf(out->driver, sizeof out->driver, "%s", ph->driver);
    out->backend = DPAR_BACKEND_VULKAN;
    out->index = dev;
    out->physical_index = ph->index;
    memcpy(out->uuid, ph->uuid, sizeof out->uuid);
    out->runs_on_cpu = ph->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    uint64_t mem = 0;
    for (uint32_t i = 0; i < ph->memprops.memoryHeapCount; i++)
        if ((ph->memprops.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            ph->memprops.memoryHeaps[i].size > mem)
            mem = ph->memprops.memoryHeaps[i].size;
    out->memory_bytes = mem;
    return DPAR_OK;
}

static void dpar__vk_physical_device(void *state, int dev, int *index, unsigned char uuid[16]) {
    const dpar__vkphys *ph = ((dpar__vk *)state)->devs[dev].ph;
    *index = ph->index;
    memcpy(uuid, ph->uuid, 16);
}

static dpar_status dpar__vk_alloc(void *state, int dev, size_t nbytes, void **mem) {
    dpar__vk *st = (dpar__vk *)state;
    *mem = NULL;
    dpar_status s = dpar__vk_check_lost(st);
    if (s) return s;
    dpar__vkbuf *b = (dpar__vkbuf *)DPAR_MALLOC(sizeof *b);
    if (!b) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    if ((s = dpar__vk_create_vkbuf(st, st->devs[dev].ph, dev, nbytes, 0, b)) != DPAR_OK) {
        DPAR_FREE(b);
        return s;
    }
    if (b->map) { /* zero in place */
        memset(b->map, 0, (size_t)b->size);
        if (!b->coherent &&
            (s = dpar__vk_map_range(st, b->ph, b->mem, b->alloc_size, 0, (size_t)b->size, 0)) != DPAR_OK) {
            dpar__vk_destroy_vkbuf(st, b);
            DPAR_FREE(b);
            return s;
        }
    } else if ((s = dpar__vk_transfer(st, dev, b, NULL, 0, 0, b->size, 0)) != DPAR_OK) {
        dpar__vk_destroy_vkbuf(st, b);
        DPAR_FREE(b);
        return s;
    }
    *mem = b;
    return DPAR_OK;
}

static void dpar__vk_free(void *state, int dev, void *mem) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkbuf *b = (dpar__vkbuf *)mem;
    if (!b) return;
    dpar__vkdev *d = &st->devs[dev];
    dpar__mutex_lock(&d->lock);
    int idle = dpar__vk_buf_idle(d, b) == DPAR_OK || DPAR__ATOMIC_LOAD(&st->lost);
    if (!idle && !st->adopted) { /* could not wait: wait for the whole device before destroying */
        st->vkDeviceWaitIdle(d->ph->device);
        idle = 1;
    }
    /* an engine's device: its queues are not dpar's to lock for vkDeviceWaitIdle; the buffer is left to it */
    if (idle) dpar__vk_destroy_vkbuf(st, b);
    dpar__mutex_unlock(&d->lock);
    DPAR_FREE(b);
}

/* A host write to b (refill: one of the buffers the host refills in turn, dpar__vk_buf_refill). */
static dpar_status dpar__vk_write_buf(dpar__vk *st, int dev, dpar__vkbuf *b, size_t off, const void *src, size_t nbytes,
                                      bool refill) {
    dpar__vkdev *d = &st->devs[dev];
    if (nbytes == 0) return DPAR_OK;
    if (dpar__vk_recording(dev)) return dpar__vk_rec_refuse("a buffer write");
    dpar__mutex_lock(&d->lock);
    dpar_status s = dpar__vk_check_lost(st);
    if (!s) s = refill ? dpar__vk_buf_refill(d, b) : dpar__vk_buf_idle(d, b); /* no queued work may touch b */
    if (!s && b->map) {
        memcpy(b->map + off, src, nbytes);
        if (!b->coherent) s = dpar__vk_map_range(st, b->ph, b->mem, b->alloc_size, off, nbytes, 0);
    } else if (!s) {
        s = dpar__vk_staging(d, nbytes);
        for (size_t done = 0; !s && done < nbytes;) {
            size_t c = nbytes - done;
            if (c > d->staging_size) c = (size_t)d->staging_size;
            memcpy(d->staging_map, (const unsigned char *)src + done, c);
            if (!d->staging_coherent) s = dpar__vk_map_range(st, d->ph, d->staging_mem, d->staging_alloc, 0, c, 0);
            dpar__vkframe *f;
            if (!s) s = dpar__vk_begin(d, &f);
            if (s) break;
            dpar__vk_cmd_barrier(st, f->cb);
            VkBufferCopy r;
            r.srcOffset = 0;
            r.dstOffset = (VkDeviceSize)(off + done);
            r.size = c;
            st->vkCmdCopyBuffer(f->cb, d->staging, b->buf, 1, &r);
            b->last_serial = f->serial;
            s = dpar__vk_drain(d); /* the staging buffer is reused by the next chunk */
            done += c;
        }
    }
    dpar__mutex_unlock(&d->lock);
    return s;
}

static dpar_status dpar__vk_write(void *state, int dev, void *mem, size_t off, const void *src, size_t nbytes) {
    return dpar__vk_write_buf((dpar__vk *)state, dev, (dpar__vkbuf *)mem, off, src, nbytes, false);
}
static dpar_status dpar__vk_refill(void *state, int dev, void *mem, size_t off, const void *src, size_t nbytes) {
    return dpar__vk_write_buf((dpar__vk *)state, dev, (dpar__vkbuf *)mem, off, src, nbytes, true);
}
static uint64_t dpar__vk_host_waits(void *state, int dev) {
    return (uint64_t)DPAR__ATOMIC_LOAD_RELAXED(&((dpar__vk *)state)->devs[dev].host_waits);
}

static dpar_status dpar__vk_idx_report(dpar__vk *st, int dev);
static dpar_status dpar__vk_read(void *state, int dev, void *mem, size_t off, void *dst, size_t nbytes) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkbuf *b = (dpar__vkbuf *)mem;
    dpar__vkdev *d = &st->devs[dev];
    if (nbytes == 0) return DPAR_OK;
    if (dpar__vk_recording(dev)) return dpar__vk_rec_refuse("a buffer read");
    dpar__mutex_lock(&d->lock);
    dpar_status s = dpar__vk_check_lost(st);
    if (!s && b->map) {
        s = dpar__vk_buf_idle(d, b);
        if (!s && !b->coherent) s = dpar__vk_map_range(st, b->ph, b->mem, b->alloc_size, off, nbytes, 1);
        if (!s) memcpy(dst, b->map + off, nbytes);
    } else if (!s) {
        s = dpar__vk_staging(d, nbytes);
        for (size_t done = 0; !s && done < nbytes;) {
            size_t c = nbytes - done;
            if (c > d->staging_size) c = (size_t)d->staging_size;
            dpar__vkframe *f;
            if ((s = dpar__vk_begin(d, &f)) != DPAR_OK) break;
            dpar__vk_cmd_barrier(st, f->cb); /* compute write -> transfer read */
            VkBufferCopy r;
            r.srcOffset = (VkDeviceSize)(off + done);
            r.dstOffset = 0;
            r.size = c;
            st->vkCmdCopyBuffer(f->cb, b->buf, d->staging, 1, &r);
            b->last_serial = f->serial;
            s = dpar__vk_drain(d); /* ends with the transfer -> host barrier */
            if (!s && !d->staging_coherent)
                s = dpar__vk_map_range(st, d->ph, d->staging_mem, d->staging_alloc, 0, c, 1);
            if (!s) memcpy((unsigned char *)dst + done, d->staging_map, c);
            done += c;
        }
    }
    dpar__mutex_unlock(&d->lock);
    return s || b == d->idx_err ? s : dpar__vk_idx_report(st, dev); /* a bad index found by an earlier op */
}

static dpar_status dpar__vk_sync(void *state, int dev) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkdev *d = &st->devs[dev];
    if (dpar__vk_recording(dev)) return dpar__vk_rec_refuse("a sync");
    dpar__mutex_lock(&d->lock);
    dpar_status s = dpar__vk_check_lost(st);
    if (!s) s = dpar__vk_drain(d);
    dpar__mutex_unlock(&d->lock);
    return s ? s : dpar__vk_idx_report(st, dev);
}

static void *dpar__vk_host_ptr(void *state, int dev, void *mem) {
    DPAR__UNUSED(state);
    DPAR__UNUSED(dev);
    return mem ? ((dpar__vkbuf *)mem)->map : NULL;
}

static dpar_status dpar__vk_host_acquire(void *state, int dev, void *mem, size_t off, size_t nbytes) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkbuf *b = (dpar__vkbuf *)mem;
    dpar__vkdev *d = &st->devs[dev];
    if (dpar__vk_recording(dev)) return dpar__vk_rec_refuse("host access");
    dpar__mutex_lock(&d->lock);
    dpar_status s = dpar__vk_check_lost(st);
    if (!s) s = dpar__vk_buf_idle(d, b);
    if (!s && b->map && !b->coherent) s = dpar__vk_map_range(st, b->ph, b->mem, b->alloc_size, off, nbytes, 1);
    dpar__mutex_unlock(&d->lock);
    return s;
}

static dpar_status dpar__vk_host_release(void *state, int dev, void *mem, size_t off, size_t nbytes) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkbuf *b = (dpar__vkbuf *)mem;
    DPAR__UNUSED(dev);
    if (b->map && !b->coherent) return dpar__vk_map_range(st, b->ph, b->mem, b->alloc_size, off, nbytes, 0);
    return DPAR_OK;
}

/* ceil(a / b); 0 for b = 0 */
static uint64_t dpar__vk_ceil(uint64_t a, uint64_t b) {
    return b ? (a + b - 1) / b : 0;
}
/* Workgroups for a grid-stride loop over n items (at least 1, capped). */
static uint32_t dpar__vk_groups(const dpar__vkphys *ph, uint64_t n) {
    uint64_t g = (n + DPAR__VK_WG - 1) / DPAR__VK_WG;
    uint64_t cap = ph->props.limits.maxComputeWorkGroupCount[0];
    if (cap > 65535) cap = 65535;
    if (g > cap) g = cap;
    return (uint32_t)(g ? g : 1);
}

/* Workgroups for a grid-stride loop over n items that take a few fixed loop turns each (element-wise):
   a workgroup per DPAR__VK_CPU_ITEMS items on a CPU device, so an invocation takes at most 16 items, or
   257 at 2^32 items over the 65,535 workgroups: far below llvmpipe's loop cap whatever n. */
static uint32_t dpar__vk_flat_groups(const dpar__vkphys *ph, uint64_t n) {
    if (ph->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU) return dpar__vk_groups(ph, n);
    return dpar__vk_groups(ph, (n + DPAR__VK_CPU_ITEMS - 1) / DPAR__VK_CPU_ITEMS * DPAR__VK_WG);
}

/* Workgroups for rows taken a workgroup each (strided over at most 65535). */
static uint32_t dpar__vk_rows(int64_t rows) {
    return rows <= 0 ? 0u : rows > 65535 ? 65535u : (uint32_t)rows;
}
/* The 32-bit pattern that fills a buffer of dtype t with v (vkCmdFillBuffer). */
static uint32_t dpar__vk_fill_pattern(dpar_dtype t, float v) {
    uint32_t pat;
    switch (t) {
    case DPAR_F16:
        pat = dpar_f32_to_f16(v);
        pat |= pat << 16;
        break;
    case DPAR_BF16:
        pat = dpar_f32_to_bf16(v);
        pat |= pat << 16;
        break;
    case DPAR_I32: {
        int32_t i = v != v ? 0 : v >= 2147483648.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : (int32_t)v;
        memcpy(&pat, &i, 4);
        break;
    }
    default: memcpy(&pat, &v, 4); break;
    }
    return pat;
}

/* The index-check guard of an SGD or AdamW update (opt_guard.glsl): once a label or index check ran on the
   device, its error words go in binding 4 and the update skips itself while a check's error waits for its report
   (a device that never checks pays nothing); op->p[4], into pc->p[0]: the graph's id on the first update of a
   graph step, which counts a skipped step under it. The push flags. */
static uint32_t dpar__vk_opt_guard(dpar__vk *st, int dev, const dpar__op *op, dpar__vkbuf **b, dpar__vkpc *pc) {
    b[4] = DPAR__ATOMIC_LOAD_RELAXED(&st->devs[dev].idx_used) ? st->devs[dev].idx_err : NULL;
    pc->p[0] = b[4] ? (uint32_t)op->p[4] : 0u;
    return b[4] ? 4u : 0u;
}

/* RELU, RELU_BWD, AXPY, SCALE, SGD: one thread per element of dst (b[0]). */
static dpar_status dpar__vk_op_elementwise(dpar__vk *st, int dev, const dpar__op *op, dpar__vkbuf **b, dpar__vkpc *pc) {
    int64_t n = op->dst->count;
    pc->n = (uint32_t)n;
    b[2] = op->src0 ? (dpar__vkbuf *)op->src0->mem : NULL;
    int id = DPAR__SPV_RELU;
    if (op->kind == DPAR__OP_RELU_BWD) {
        id = DPAR__SPV_RELU_BWD;
        b[3] = (dpar__vkbuf *)op->src1->mem;
    } else if (op->kind == DPAR__OP_AXPY)
        id = DPAR__SPV_AXPY;
    else if (op->kind == DPAR__OP_SCALE) {
        id = DPAR__SPV_SCALE;
        b[2] = NULL;
    } else if (op->kind == DPAR__OP_SGD) {
        id = DPAR__SPV_SGD;
        int mom = op->dst2 != NULL && op->f[1] != 0.0f;
        pc->flags = (op->nesterov && mom ? 1u : 0u) | (mom ? 2u : 0u) | dpar__vk_opt_guard(st, dev, op, b, pc);
        b[1] = mom ? (dpar__vkbuf *)op->dst2->mem : NULL;
        if (op->dst3) { /* a second parameter: the workgroups of the larger */
            id = DPAR__SPV_SGD_PAIR;
            pc->m = (uint32_t)op->dst3->count;
            b[3] = (dpar__vkbuf *)op->dst3->mem, b[6] = (dpar__vkbuf *)op->src1->mem;
            b[5] = mom ? (dpar__vkbuf *)op->dst4->mem : NULL;
            if (op->dst3->count > n) n = op->dst3->count;
        }
    }
    return dpar__vk_dispatch(st, dev, id, b, pc, dpar__vk_flat_groups(st->devs[dev].ph, (uint64_t)n), 1);
}

/* >>vulkan elementwise =========================================================
   The elementwise kinds (see >>elementwise ops in dpar.h): one shader per
   family, geometry in p[] (uint32: the core's buffers stay below 2^32
   elements here), one invocation per output element (rows for softmax). */
static dpar_status dpar__vk_op_elem(dpar__vk *st, int dev, const dpar__op *op, dpar__vkbuf **b, dpar__vkpc *pc) {
    const dpar__vkphys *ph = st->devs[dev].ph;
    int id;
    uint64_t items = (uint64_t)op->n;
    for (int i = 0; i < 16; i++) pc->p[i] = (uint32_t)op->p[i];
    pc->n = (uint32_t)op->n;
    b[2] = op->src0 ? (dpar__vkbuf *)op->src0->mem : NULL;
    b[3] = op->src1 ? (dpar__vkbuf *)op->src1->mem : NULL;
    b[1] = op->src2 ? (dpar__vkbuf *)op->src2->mem : NULL;
    switch (op->kind) {
    case DPAR__OP_UNARY:
    case DPAR__OP_UNARY_BWD:
        id = DPAR__SPV_UNARY;
        pc->flags = op->kind == DPAR__OP_UNARY_BWD ? 1u : 0u;
        break;
    case DPAR__OP_BINARY: id = DPAR__SPV_BINARY; break;
    case DPAR__OP_REDUCE: id = DPAR__SPV_REDUCE_AXES; break;
    case DPAR__OP_WHERE:
        id = DPAR__SPV_WHERE;
        pc->flags = (op->k ? 1u : 0u) | (op->src1 ? 2u : 0u) | (op->src2 ? 4u : 0u);
        break;
    case DPAR__OP_SOFTMAX:
    case DPAR__OP_SOFTMAX_BWD:
        id = DPAR__SPV_SOFTMAX;
        pc->m = (uint32_t)op->m;
        pc->flags = op->kind == DPAR__OP_SOFTMAX_BWD ? 1u : 0u;
        items = (uint64_t)op->m;
        if (op->n >= DPAR__VK_WIDE && items) { /* a workgroup a row */
            pc->flags |= 2u;
            return dpar__vk_dispatch(st, dev, id, b, pc, dpar__vk_rows(op->m), 1);
        }
        break;
    default: /* DPAR__OP_STRIDED; one contiguous run (a graph bucket's copies, concat on axis 0) is a buffer
                copy: on llvmpipe such a dispatch cost ~75 us of its threads, a copy a few (results.md) */
        id = DPAR__SPV_STRIDED;
        if (items && b[0] != b[2] && op->p[7] == 1 && op->p[11] == 1 && op->p[0] * op->p[1] * op->p[2] == 1)
            return dpar__vk_transfer(st, dev, b[0], b[2], 4 * (VkDeviceSize)op->p[12], 4 * (VkDeviceSize)op->p[13],
                                     4 * items, 0);
        break;
    }
    if (items == 0) return DPAR_OK;
    /* a reduced output's or a softmax row's items loop with the shape: an item an invocation */
    uint32_t groups = id == DPAR__SPV_REDUCE_AXES || id == DPAR__SPV_SOFTMAX ? dpar__vk_groups(ph, items)
                                                                             : dpar__vk_flat_groups(ph, items);
    return dpar__vk_dispatch(st, dev, id, b, pc, groups, 1);
}

/* >>vulkan norm-attn ==========================================================
   layer/rms norm, batched matmul and attention (shaders/layernorm*.comp, matmul.comp with
   a batch dimension, attention*.comp). Bindings: 0 dst, 1 dst2, 2 src0, 3 src1, 4 dst3,
   5 src2, 6 src3. Rows are strided over at most 65535 workgroups. */
#define DPAR__VK_ATTN_MAX_HEAD 512 /* D and Dv held in shared memory by attention*.comp */
static dpar__vkbuf *dpar__vk_mem(const dpar_buffer *b) {
    return b ? (dpar__vkbuf *)b->mem : NULL;
}
/* Variants for a CPU device (llvmpipe runs a workgroup as SIMD lanes on one thread, splits it at each
   barrier and loads a buffer element lane by lane unless no lane's id enters its address):
   shaders/matmul_direct.comp (lanes over rows, 4 rows by 16 columns an invocation, B loaded once for all
   lanes, no shared memory; at every matmul shape of bench_ops faster than the tiles and the former
   4x4-an-invocation blocks);
   layernorm.comp's and layernorm_bwd.comp's row per invocation (bit 4), taken there and for rows of
   at most 32 (the tree has nothing to share). Measured in bench/results/results.md. */
static int dpar__vk_on_cpu(const dpar__vk *st, int dev) {
    return st->devs[dev].ph->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
}
/* Column blocks of 16 a workgroup of the direct matmul on a CPU device, for K = k over batches: up to
   DPAR__VK_CPU_MM_COLS while an invocation's turns (dpar__vk_op_turns) stay within DPAR__VK_CPU_TURNS,
   else one, so the op is refused at llvmpipe's loop cap exactly where a block a workgroup would be. */
static uint64_t dpar__vk_mm_cols(int64_t k, int64_t batches) {
    uint64_t zs = dpar__vk_ceil(batches > 1 ? (uint64_t)batches : 1, 65535),
             c = DPAR__VK_CPU_TURNS / (zs * ((uint64_t)k + 3));
    return c < 1 ? 1 : c > (uint64_t)DPAR__VK_CPU_MM_COLS ? (uint64_t)DPAR__VK_CPU_MM_COLS : c;
}
/* The matmul shader for C [m, n] (K = k, over batches) on device dev, its workgroups (g[0], g[1]) and its
   flags beyond the operands' (pc->flags). */
static int dpar__vk_mm_pick(const dpar__vk *st, int dev, int64_t m, int64_t n, int64_t k, int64_t batches,
                            uint32_t g[2], dpar__vkpc *pc) {
    /* DPAR_VK_FORCE_TILED (tests): the GPUs' tiled shader on a CPU device too, where an invocation's loops
       (about k + k / 16 turns, and a turn a batch past 65,535) stay well inside llvmpipe's loop cap */
    int tiled = st->force_tiled && k <= 16384 && batches <= 65535;
    if (dpar__vk_on_cpu(st, dev) && !tiled) { /* blocks of 32 rows by 16 columns, dpar__vk_mm_cols a workgroup */
        if (st->devs[dev].ph->lanes8) pc->flags |= 32u;
        g[0] = (uint32_t)((m + 31) / 32);
        g[1] = (uint32_t)dpar__vk_ceil(dpar__vk_ceil((uint64_t)n, 16), dpar__vk_mm_cols(k, batches));
        return DPAR__SPV_MATMUL_DIRECT;
    }
    g[0] = (uint32_t)((n + 31) / 32), g[1] = (uint32_t)((m + 31) / 32);
    return DPAR__SPV_MATMUL;
}
/* Records matmul shader id's gx x gy x gz workgroups (dpar__vk_mm_pick; gz within 65535) as dispatches of at
   most the device's workgroup counts on x and y, each with its first workgroup in pc->p[4], p[5] and the
   workgroups on y in all in p[6] (matmul_common.glsl): one dispatch where they fit, several for a product
   past them, such as the direct matmul's 65,536 column blocks of a graph's mul_scalar over 8,388,608
   elements ([1, 1] @ [1, n]) or the tiled one's rows past 2,097,120 where y allows 65,535. */
static dpar_status dpar__vk_dispatch_mm(dpar__vk *st, int dev, int id, dpar__vkbuf *const b[DPAR__VK_BINDINGS],
                                        dpar__vkpc *pc, uint32_t gx, uint32_t gy, uint32_t gz) {
    const uint32_t *lim = st->devs[dev].ph->props.limits.maxComputeWorkGroupCount;
    dpar_status s = DPAR_OK;
    pc->p[6] = gy;
    for (uint32_t y = 0, h = 0; y < gy && !s; y += h) {
        h = gy - y < lim[1] ? gy - y : lim[1];
        for (uint32_t x = 0, w = 0; x < gx && !s; x += w) {
            w = gx - x < lim[0] ? gx - x : lim[0];
            pc->p[4] = x, pc->p[5] = y;
            s = dpar__vk_dispatch3(st, dev, id, b, pc, w, h, gz);
        }
    }
    return s;
}
/* layernorm.comp's and layernorm_bwd.comp's row an invocation (flags bit4) rather than a workgroup: on a
   CPU device unless the row is DPAR__VK_WIDE or longer (llvmpipe's loop cap: six loops over a row of
   10,900 pass it), and for rows of at most 32 anywhere. */
static int dpar__vk_norm_per_row(const dpar__vk *st, int dev, const dpar__op *op) {
    return (dpar__vk_on_cpu(st, dev) && op->n < DPAR__VK_WIDE) || op->n <= 32;
}
static dpar_status dpar__vk_op_norm(dpar__vk *st, int dev, const dpar__op *op, dpar__vkpc *pc) {
    dpar__vkbuf *b[DPAR__VK_BINDINGS] = { NULL };
    pc->n = (uint32_t)op->n;
    pc->m = (uint32_t)op->m;
    pc->flags = op->p[0] ? 8u : 0u;
    if (op->kind == DPAR__OP_NORM) {
        pc->flags |= (op->dst2 ? 1u : 0u) | (op->src1 ? 2u : 0u) | (op->src2 ? 4u : 0u);
        b[0] = dpar__vk_mem(op->dst), b[1] = dpar__vk_mem(op->dst2), b[2] = dpar__vk_mem(op->src0);
        b[3] = dpar__vk_mem(op->src1), b[5] = dpar__vk_mem(op->src2);
        if (dpar__vk_norm_per_row(st, dev, op)) { /* 256 rows a workgroup */
            pc->flags |= 16u;
            return dpar__vk_dispatch(st, dev, DPAR__SPV_LAYERNORM, b, pc, dpar__vk_rows((op->m + 255) / 256), 1);
        }
        return dpar__vk_dispatch(st, dev, DPAR__SPV_LAYERNORM, b, pc, dpar__vk_rows(op->m), 1);
    }
    dpar_status s;
    b[2] = dpar__vk_mem(op->src0), b[3] = dpar__vk_mem(op->src1), b[6] = dpar__vk_mem(op->src3);
    if (op->dst2 || op->dst3) { /* dw, db first: dx may alias dy */
        dpar__vkpc pw = *pc;
        pw.flags = (op->dst2 ? 1u : 0u) | (op->dst3 ? 2u : 0u) | (op->m >= DPAR__VK_WIDE ? 4u : 0u);
        b[1] = dpar__vk_mem(op->dst2), b[4] = dpar__vk_mem(op->dst3);
        uint32_t g = op->m >= DPAR__VK_WIDE ? dpar__vk_rows(op->n) /* a workgroup a column */
                                            : dpar__vk_groups(st->devs[dev].ph, (uint64_t)op->n);
        if ((s = dpar__vk_dispatch(st, dev, DPAR__SPV_LAYERNORM_WGRAD, b, &pw, g, 1))) return s;
        b[1] = b[4] = NULL;
    }
    if (op->p[1]) return DPAR_OK; /* no dx */
    pc->flags |= op->src2 ? 2u : 0u;
    b[0] = dpar__vk_mem(op->dst), b[5] = dpar__vk_mem(op->src2);
    if (dpar__vk_norm_per_row(st, dev, op)) { /* 256 rows a workgroup */
        pc->flags |= 16u;
        return dpar__vk_dispatch(st, dev, DPAR__SPV_LAYERNORM_BWD, b, pc, dpar__vk_rows((op->m + 255) / 256), 1);
    }
    return dpar__vk_dispatch(st, dev, DPAR__SPV_LAYERNORM_BWD, b, pc, dpar__vk_rows(op->m), 1);
}
static dpar_status dpar__vk_op_matmul_batched(dpar__vk *st, int dev, const dpar__op *op, dpar__vkpc *pc) {
    dpar__vkbuf *b[DPAR__VK_BINDINGS] = { NULL };
    if (op->m == 0 || op->n == 0 || op->p[0] == 0) return DPAR_OK;
    pc->m = (uint32_t)op->m;
    pc->n = (uint32_t)op->n;
    pc->k = (uint32_t)op->k;
    pc->flags = (op->trans_a ? 1u : 0u) | (op->trans_b ? 2u : 0u) | (op->f[1] == 0.0f ? 4u : 0u);
    for (int i = 0; i < 4; i++) pc->p[i] = (uint32_t)op->p[i];
    b[0] = dpar__vk_mem(op->dst), b[2] = dpar__vk_mem(op->src0), b[3] = dpar__vk_mem(op->src1);
    uint32_t g[2];
    int id = dpar__vk_mm_pick(st, dev, op->m, op->n, op->k, op->p[0], g, pc);
    return dpar__vk_dispatch_mm(st, dev, id, b, pc, g[0], g[1], dpar__vk_rows(op->p[0]));
}
static dpar_status dpar__vk_op_attn(dpar__vk *st, int dev, const dpar__op *op, dpar__vkpc *pc) {
    dpar__vkbuf *b[DPAR__VK_BINDINGS] = { NULL };
    if (op->p[3] > DPAR__VK_ATTN_MAX_HEAD || op->p[4] > DPAR__VK_ATTN_MAX_HEAD)
        return dpar__err(DPAR_ERR_SHAPE,
                         "vulkan: attention with head sizes D %lld, Dv %lld; this backend handles at most %d "
                         "(split the heads further)",
                         (long long)op->p[3], (long long)op->p[4], DPAR__VK_ATTN_MAX_HEAD);
    for (int i = 0; i < 6; i++) pc->p[i] = (uint32_t)op->p[i];
    b[2] = dpar__vk_mem(op->src0), b[3] = dpar__vk_mem(op->src1), b[5] = dpar__vk_mem(op->src2);
    b[6] = dpar__vk_mem(op->src3);
    b[0] = dpar__vk_mem(op->dst), b[1] = dpar__vk_mem(op->dst2);
    int id = DPAR__SPV_ATTENTION;
    int64_t rows = op->p[0] * op->p[1]; /* query rows */
    if (op->kind == DPAR__OP_ATTN) {
        pc->flags = op->dst2 ? 1u : 0u;
    } else if (op->kind == DPAR__OP_ATTN_BWD_Q) {
        id = DPAR__SPV_ATTENTION_BWD_Q;
        pc->flags = op->dst2 ? 1u : 0u;
    } else {
        id = DPAR__SPV_ATTENTION_BWD_KV;
        pc->flags = (op->dst2 ? 1u : 0u) | (op->dst3 ? 2u : 0u);
        b[4] = dpar__vk_mem(op->dst3);
        rows = op->p[0] * op->p[2]; /* key rows */
    }
    return dpar__vk_dispatch(st, dev, id, b, pc, dpar__vk_rows(rows), 1);
}

/* >>vulkan conv-pool ==========================================================
   conv2d and the 2-D pools (shaders/conv2d*.comp, pool2d*.comp): one
   invocation per output element, each a gather in the CPU's order (no
   atomics: deterministic). The dpar__win2d geometry goes in the push
   constants' p[]. Bindings: 0 dst, 2 src0, 3 src1, 5 src2 (the bias). */
/* conv2d's kernel gradient summing at least DPAR__VK_WIDE outputs (n oh ow) into each dw element: a
   workgroup an element (conv2d_bwd_kernel.comp flags bit1). */
static int dpar__vk_conv_wide(const dpar__op *op) {
    return op->kind == DPAR__OP_CONV2D_BWD_KERNEL && op->p[0] * op->p[4] * op->p[5] >= DPAR__VK_WIDE;
}
static dpar_status dpar__vk_op_conv_pool(dpar__vk *st, int dev, const dpar__op *op, dpar__vkpc *pc) {
    static const int ids[] = { DPAR__SPV_CONV2D,    DPAR__SPV_CONV2D_BWD_INPUT, DPAR__SPV_CONV2D_BWD_KERNEL,
                               DPAR__SPV_POOL2D,    DPAR__SPV_POOL2D_BWD,       DPAR__SPV_POOL2D,
                               DPAR__SPV_POOL2D_BWD };
    int k = (int)op->kind - (int)DPAR__OP_CONV2D; /* the seven kinds are consecutive, in this order */
    dpar__vkbuf *b[DPAR__VK_BINDINGS] = { NULL };
    for (int i = 0; i < 16; i++) {
        if (op->p[i] < 0 || op->p[i] > (int64_t)0xffffffff)
            return dpar__err(DPAR_ERR_BACKEND, "vulkan: %s: geometry value %lld does not fit the shader's 32 bits",
                             dpar__op_name(op), (long long)op->p[i]);
        pc->p[i] = (uint32_t)op->p[i];
    }
    if (op->dst->count == 0) return DPAR_OK;
    pc->n = (uint32_t)op->dst->count;
    pc->flags = op->kind == DPAR__OP_CONV2D ? (op->src2 ? 1u : 0u)
                                            : (op->kind == DPAR__OP_MAX_POOL || op->kind == DPAR__OP_MAX_POOL_BWD);
    b[0] = dpar__vk_mem(op->dst), b[2] = dpar__vk_mem(op->src0), b[3] = dpar__vk_mem(op->src1);
    b[5] = dpar__vk_mem(op->src2);
    if (dpar__vk_conv_wide(op)) { /* a workgroup a dw element */
        pc->flags = 2u;
        return dpar__vk_dispatch(st, dev, ids[k], b, pc, dpar__vk_rows(op->dst->count), 1);
    }
    return dpar__vk_dispatch(st, dev, ids[k], b, pc, dpar__vk_groups(st->devs[dev].ph, (uint64_t)op->dst->count), 1);
}

/* >>vulkan optim =============================================================
   AdamW, embedding, dropout, and the index check of the label/index ops: a
   shader (check_index.comp, or softmax_xent(_wide).comp for its labels) records the
   first bad index in the device's error words, reported as the op's error at
   the next sync or read of that device. */
static dpar_status dpar__vk_idx_words(dpar__vk *st, int dev, dpar__vkbuf **out) {
    dpar__vkdev *d = &st->devs[dev];
    if (!d->idx_err) {
        void *mem = NULL;
        dpar_status s = dpar__vk_alloc(st, dev, DPAR__IDX_WORDS * 4, &mem); /* zeroed: no error */
        if (s) return s;
        d->idx_err = (dpar__vkbuf *)mem;
    }
    *out = d->idx_err;
    return DPAR_OK;
}
/* after a checking dispatch recorded without error: a report is pending */
static void dpar__vk_idx_recorded(dpar__vk *st, int dev) {
    struct dpar__vkprog *rec = dpar__vk_recording(dev);
    DPAR__ATOMIC_STORE(&st->devs[dev].idx_used, 1);
    if (rec) rec->idx = 1; /* each submit of the recording leaves a report pending */
    if (!rec) DPAR__ATOMIC_STORE(&st->devs[dev].idx_pending, 1);
}
static dpar_status dpar__vk_idx_check(dpar__vk *st, int dev, const dpar_buffer *idx, int64_t bound, int use_ignore,
                                      int32_t ignore, int fn) {
    dpar__vkbuf *err = NULL;
    dpar_status s = DPAR_OK;
    if (idx->count == 0) return DPAR_OK;
    if ((s = dpar__vk_idx_words(st, dev, &err))) return s;
    dpar__vkpc pc;
    memset(&pc, 0, sizeof pc);
    pc.n = (uint32_t)idx->count;
    pc.m = (uint32_t)bound;
    pc.flags = use_ignore ? 1u : 0u;
    pc.p[0] = (uint32_t)ignore;
    pc.p[1] = (uint32_t)fn;
    dpar__vkbuf *b[DPAR__VK_BINDINGS] = { err, NULL, NULL, (dpar__vkbuf *)idx->mem };
    s = dpar__vk_dispatch(st, dev, DPAR__SPV_CHECK_INDEX, b, &pc, 1, 1);
    if (!s) dpar__vk_idx_recorded(st, dev);
    return s;
}
/* the error words of the checks run since the last report: the first bad index as the op's error */
static dpar_status dpar__vk_idx_report(dpar__vk *st, int dev) {
    dpar__vkdev *d = &st->devs[dev];
    if (!DPAR__ATOMIC_EXCHANGE(&d->idx_pending, 0)) return DPAR_OK;
    uint32_t w[DPAR__IDX_WORDS];
    static const uint32_t zero[DPAR__IDX_WORDS] = { 0 };
    dpar_status s = dpar__vk_read(st, dev, d->idx_err, 0, w, sizeof w);
    if (s || !w[0]) return s;
    if ((s = dpar__vk_write(st, dev, d->idx_err, 0, zero, sizeof zero))) return s;
    return dpar__bad_index_words(dev, w); /* and the graph steps it skipped (opt_guard.glsl) */
}
static dpar_status dpar__vk_op_optim(dpar__vk *st, int dev, const dpar__op *op, dpar__vkbuf **b, dpar__vkpc *pc) {
    const dpar__vkphys *ph = st->devs[dev].ph;
    b[2] = (dpar__vkbuf *)op->src0->mem;
    switch (op->kind) {
    case DPAR__OP_ADAMW:
        if (op->n == 0) return DPAR_OK;
        pc->n = (uint32_t)op->n;
        pc->flags = dpar__vk_opt_guard(st, dev, op, b, pc);
        b[1] = (dpar__vkbuf *)op->dst2->mem;
        b[3] = (dpar__vkbuf *)op->dst3->mem;
        return dpar__vk_dispatch(st, dev, DPAR__SPV_ADAMW, b, pc, dpar__vk_flat_groups(ph, (uint64_t)op->n), 1);
    case DPAR__OP_EMBED:
    case DPAR__OP_EMBED_BWD: {
        int bwd = op->kind == DPAR__OP_EMBED_BWD;
        dpar_status s = dpar__vk_idx_check(st, dev, op->src1, op->k, 0, 0, (int)op->p[2]);
        if (s || op->m == 0 || op->n == 0) return s;
        pc->n = (uint32_t)(bwd ? op->m : op->m * op->n);
        pc->m = (uint32_t)op->n;
        pc->k = (uint32_t)op->k;
        b[3] = (dpar__vkbuf *)op->src1->mem;
        return dpar__vk_dispatch(st, dev, bwd ? DPAR__SPV_EMBED_BWD : DPAR__SPV_EMBED, b, pc,
                                 dpar__vk_groups(ph, bwd ? (uint64_t)op->n : (uint64_t)(op->m * op->n)), 1);
    }
    case DPAR__OP_DROPOUT:
        if (op->n == 0) return DPAR_OK;
        pc->n = (uint32_t)op->n;
        for (int i = 0; i < 6; i++) pc->p[i] = (uint32_t)op->p[i];
        return dpar__vk_dispatch(st, dev, DPAR__SPV_DROPOUT, b, pc, dpar__vk_flat_groups(ph, ((uint64_t)op->n + 3) / 4),
                                 1);
    default: return dpar__err(DPAR_ERR_BACKEND, "vulkan: op %s is not an optim op", dpar__op_name(op));
    }
}

/* softmax_xent.comp: one workgroup of 64 (an invocation a row) while an invocation's share of the logits,
   ceil(rows / 64) * cols, stays within DPAR__VK_XENT_ONE (the digits' 64 x 10: one dispatch, no scratch);
   past it softmax_xent_wide.comp's three passes (a workgroup a row, its lanes over the classes), so a
   GPT-size vocabulary fits llvmpipe's loop cap and a GPU gets a workgroup a row. */
#define DPAR__VK_XENT_ONE 1024
static int dpar__vk_xent_wide(uint64_t rows, uint64_t cols) {
    return dpar__vk_ceil(rows, 64) * cols > DPAR__VK_XENT_ONE;
}
/* The loss and dlogits of op (DPAR__OP_SOFTMAX_XENT), the labels checked by the shader itself. The wide
   passes meet in the device's scratch d->xent_tmp (the counted rows, then a loss sum a workgroup: 1 +
   65,535 words whatever the shape), made on first use and kept: a recorded program replays with it, and
   the queue runs one dispatch after the other (each begins with a full barrier). */
static dpar_status dpar__vk_xent(dpar__vk *st, int dev, const dpar__op *op, dpar__vkbuf **b, dpar__vkpc *pc) {
    dpar__vkdev *d = &st->devs[dev];
    int64_t rows = op->src1->count, cols = rows ? op->src0->count / rows : 0;
    pc->m = (uint32_t)rows;
    pc->n = (uint32_t)cols;
    pc->flags = op->dst2 ? 1u : 0u;
    pc->p[0] = op->p[0] ? 1u : 0u;
    pc->p[1] = (uint32_t)op->p[1];
    pc->p[2] = (uint32_t)op->p[2]; /* the public function, for a bad label's error */
    b[1] = op->dst2 ? (dpar__vkbuf *)op->dst2->mem : NULL;
    b[2] = (dpar__vkbuf *)op->src0->mem;
    b[3] = (dpar__vkbuf *)op->src1->mem;
    dpar_status s = dpar__vk_idx_words(st, dev, &b[4]); /* the shader checks the labels */
    if (!s && !dpar__vk_xent_wide((uint64_t)rows, (uint64_t)cols))
        s = dpar__vk_dispatch(st, dev, DPAR__SPV_SOFTMAX_XENT, b, pc, 1, 1);
    else if (!s) {
        if (!d->xent_tmp) { /* no fill: each use writes what it reads */
            dpar__vkbuf *t = (dpar__vkbuf *)DPAR_MALLOC(sizeof *t);
            if (!t) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory (softmax_xent scratch)");
            if ((s = dpar__vk_create_vkbuf(st, d->ph, dev, 4 * (1 + 65535), 0, t))) {
                DPAR_FREE(t);
                return s;
            }
            d->xent_tmp = t;
        }
        uint32_t g = dpar__vk_rows(rows);
        b[5] = d->xent_tmp;
        pc->k = g;
        for (uint32_t pass = 0; pass < 3 && !s; pass++) {
            pc->p[3] = pass;
            s = dpar__vk_dispatch(st, dev, DPAR__SPV_SOFTMAX_XENT_WIDE, b, pc, pass == 1 ? g : 1, 1);
        }
    }
    if (!s && rows) dpar__vk_idx_recorded(st, dev);
    return s;
}

/* The kinds with one shader each and no helper of their own: matmul, bias,
   loss and reduction kernels, fills, copies and casts. `b` holds dst in
   binding 0; n is dst's element count. */
static dpar_status dpar__vk_op_basic(dpar__vk *st, int dev, const dpar__op *op, dpar__vkbuf **b, dpar__vkpc *pc,
                                     int64_t n) {
    dpar__vkbuf *dst = b[0];
    dpar__vkbuf *dst2 = op->dst2 ? (dpar__vkbuf *)op->dst2->mem : NULL;
    dpar__vkbuf *src0 = op->src0 ? (dpar__vkbuf *)op->src0->mem : NULL;
    dpar__vkbuf *src1 = op->src1 ? (dpar__vkbuf *)op->src1->mem : NULL;
    switch (op->kind) {
    case DPAR__OP_MATMUL: {
        if (op->m == 0 || op->n == 0) return DPAR_OK;
        pc->m = (uint32_t)op->m;
        pc->n = (uint32_t)op->n;
        pc->k = (uint32_t)op->k;
        pc->flags = (op->trans_a ? 1u : 0u) | (op->trans_b ? 2u : 0u) | (op->f[1] == 0.0f ? 4u : 0u) |
                    ((uint32_t)(op->src0->dtype == DPAR_F16    ? 1
                                : op->src0->dtype == DPAR_BF16 ? 2
                                                               : 0)
                     << 3) |
                    (op->src2 ? 64u : 0u) | (dst2 ? 128u : 0u); /* bias, its ReLU: matmul_common.glsl's store_at */
        b[1] = dst2;
        b[2] = src0;
        b[3] = src1;
        b[5] = dpar__vk_mem(op->src2);
        uint32_t g[2];
        int id = dpar__vk_mm_pick(st, dev, op->m, op->n, op->k, 1, g, pc);
        if (op->src2 && id == DPAR__SPV_MATMUL_DIRECT) id = DPAR__SPV_MATMUL_DIRECT_BIAS; /* the same loops */
        return dpar__vk_dispatch_mm(st, dev, id, b, pc, g[0], g[1], 1);
    }
    case DPAR__OP_BIAS_ADD: {
        int64_t cols = op->src0->count;
        if (n == 0 || cols == 0) return DPAR_OK;
        pc->n = (uint32_t)n;
        pc->m = (uint32_t)cols;
        pc->flags = dst2 ? 1u : 0u;
        b[1] = dst2;
        b[2] = src0;
        return dpar__vk_dispatch(st, dev, DPAR__SPV_BIAS_ADD, b, pc,
                                 dpar__vk_flat_groups(st->devs[dev].ph, (uint64_t)n), 1);
    }
    case DPAR__OP_BIAS_GRAD: {
        if (n == 0) return DPAR_OK;
        pc->n = (uint32_t)n;
        pc->m = (uint32_t)(op->src0->count / n);
        pc->flags = src1 ? 2u : 0u; /* relu's gradient too */
        b[1] = dst2;
        b[2] = src0;
        b[3] = src1;
        if (op->src0->count / n >= DPAR__VK_WIDE) { /* a workgroup a column */
            pc->flags |= 1u;
            return dpar__vk_dispatch(st, dev, DPAR__SPV_BIAS_GRAD, b, pc, dpar__vk_rows(n), 1);
        }
        return dpar__vk_dispatch(st, dev, DPAR__SPV_BIAS_GRAD, b, pc, dpar__vk_groups(st->devs[dev].ph, (uint64_t)n),
                                 1);
    }
    case DPAR__OP_SOFTMAX_XENT: return dpar__vk_xent(st, dev, op, b, pc);
    case DPAR__OP_MSE:
        pc->n = (uint32_t)op->src0->count;
        pc->flags = dst2 ? 1u : 0u;
        b[1] = dst2;
        b[2] = src0;
        b[3] = src1;
        return dpar__vk_dispatch(st, dev, DPAR__SPV_MSE, b, pc, 1, 1);
    case DPAR__OP_SUM:
    case DPAR__OP_SUMSQ:
        pc->n = (uint32_t)op->src0->count;
        pc->m = (uint32_t)op->p[0]; /* the result's element */
        pc->flags = op->kind == DPAR__OP_SUMSQ ? 1u : 0u;
        b[2] = src0;
        return dpar__vk_dispatch(st, dev, DPAR__SPV_REDUCE, b, pc, 1, 1);
    case DPAR__OP_FILL:
        if (n == 0) return DPAR_OK;
        return dpar__vk_transfer(st, dev, dst, NULL, 0, 0, dst->size, dpar__vk_fill_pattern(op->dst->dtype, op->f[0]));
    case DPAR__OP_COPY:
        if (op->dst->nbytes == 0 || dst == src0) return DPAR_OK;
        return dpar__vk_transfer(st, dev, dst, src0, 0, 0, op->dst->nbytes, 0);
    case DPAR__OP_CAST: {
        if (n == 0) return DPAR_OK;
        if (op->dst->dtype == op->src0->dtype) {
            if (dst == src0) return DPAR_OK;
            return dpar__vk_transfer(st, dev, dst, src0, 0, 0, op->dst->nbytes, 0);
        }
        pc->n = (uint32_t)n;
        pc->flags = (uint32_t)op->src0->dtype | ((uint32_t)op->dst->dtype << 8);
        b[2] = src0;
        int half = op->dst->dtype == DPAR_F16 || op->dst->dtype == DPAR_BF16;
        return dpar__vk_dispatch(st, dev, DPAR__SPV_CAST, b, pc,
                                 dpar__vk_flat_groups(st->devs[dev].ph, half ? ((uint64_t)n + 1) / 2 : (uint64_t)n), 1);
    }
    default: /* dpar__vk_op routes only the kinds above here */
        return dpar__err(DPAR_ERR_BACKEND, "vulkan: op %s reached the basic kernels; a dispatch bug",
                         dpar__op_name(op));
    }
}

/* >>vulkan half storage =======================================================
   The 16-bit layer ops run through dpar__half_lowered (>>device half storage)
   with cast.comp and the f32 shaders, on the device's kept temporaries
   (d->half): every dispatch begins with a full barrier whose first scope
   covers the queue's earlier work, so the next op may reuse them without a
   wait. One that must grow is freed first (dpar__vk_free waits for its last
   use). Not while recording a graph program, whose replays would share
   memory that may grow: the graph then runs that device op by op (the
   graph's layer nodes are f32 today, so this does not arise). */
static dpar_status dpar__vk_half_temps(void *state, int dev, int n, const size_t *nbytes, void **mem) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkdev *d = &st->devs[dev];
    if (dpar__vk_recording(dev)) return dpar__vk_rec_refuse("a 16-bit layer op (f32 temporaries)");
    for (int i = 0; i < n; i++) {
        if (d->half[i] && d->half[i]->nbytes < nbytes[i]) {
            dpar__vk_free(st, dev, d->half[i]);
            d->half[i] = NULL;
        }
        if (!d->half[i]) {
            void *b = NULL;
            dpar_status s = dpar__vk_alloc(st, dev, nbytes[i], &b);
            if (s) return s;
            d->half[i] = (dpar__vkbuf *)b;
        }
        mem[i] = d->half[i];
    }
    return DPAR_OK;
}
static dpar_status dpar__vk_op(void *state, int dev, const dpar__op *op);
static const dpar__half_hooks dpar__vk_half = { dpar__vk_op, dpar__vk_half_temps };

/* >>vulkan loops ==============================================================
   llvmpipe (Mesa's gallivm) ends a shader's loops after LP_MAX_TGSI_LOOP_ITERATIONS = 65,535
   iterations an invocation, every loop of the invocation counted together (one counter a function,
   lp_exec_mask_function_init): past it the loops just end and the op's result is wrong, with no error.
   Measured on Mesa 22.3.6 (llvmpipe, 256 bits) through this backend: dpar_sum (one loop of
   ceil(n/256) turns, then the tree's 8) is right for n = 256 * 65,526 and wrong from one element more
   (8,387,456 for 16,774,912 ones); softmax over one row of n (three loops of n turns each, none near
   the cap) is right at n = 21,843 and wrong (the row unwritten) from 21,844: the cap counts all loops
   of an invocation, each turn plus about one a loop entered. So the shaders' geometry keeps the trip
   count down where it can (reduce.comp: 4 elements a turn), and where one invocation must loop with
   the input (a matmul's K, a softmax row, a conv window, ...) the op is refused on such a device
   before anything is recorded, with an upper bound of its invocations' turns below. GPUs loop freely. */
/* Items of a grid-stride loop over n items an invocation takes (at most dpar__vk_groups' groups). */
static uint64_t dpar__vk_per_inv(const dpar__vkphys *ph, uint64_t n) {
    return dpar__vk_ceil(n, (uint64_t)dpar__vk_groups(ph, n) * DPAR__VK_WG);
}
/* Column sums of m rows over n columns (bias_grad.comp, layernorm_wgrad.comp): an invocation a column,
   or a workgroup a column, its lanes over the rows, then the tree. */
static uint64_t dpar__vk_col_turns(const dpar__vkphys *ph, uint64_t n, uint64_t m) {
    if (m >= DPAR__VK_WIDE)
        return dpar__vk_ceil(n, dpar__vk_rows((int64_t)n)) * (dpar__vk_ceil(m, DPAR__VK_WG) + 11) + 1;
    return dpar__vk_per_inv(ph, n) * (m + 1) + 1;
}
/* Attention: an upper bound of the turns of a query (or key) row over nk keys (queries) in chunks of 64
   with heads D, Dv: per chunk a lane's dot products (D, Dv) and the lanes' reductions, and the 64-turn
   accumulations of each of the ceil(D/64), ceil(Dv/64) columns a lane keeps. */
static uint64_t dpar__vk_attn_turns(uint64_t nk, uint64_t D, uint64_t Dv) {
    uint64_t cols = dpar__vk_ceil(D, 64) + dpar__vk_ceil(Dv, 64), chunks = dpar__vk_ceil(nk, 64);
    uint64_t per_chunk = 2 * (D + 1) + 2 * (Dv + 1) + 4 * 7 + 66 * (cols + 2);
    return 2 * (chunks + 1) + chunks * per_chunk + 4 * (cols + 2);
}
/* conv2d's three passes and the pools (p: n h w c oh ow o kh kw sh sw, dpar__win2d): an element's window,
   the windows holding it for the pools' gradients. */
static uint64_t dpar__vk_win_turns(const dpar__vkphys *ph, const dpar__op *op) {
    const int64_t *p = op->p;
    uint64_t n = (uint64_t)op->dst->count;
    uint64_t N = (uint64_t)p[0], C = (uint64_t)p[3], OH = (uint64_t)p[4], OW = (uint64_t)p[5];
    uint64_t O = (uint64_t)p[6], KH = (uint64_t)p[7], KW = (uint64_t)p[8];
    uint64_t win = KH + 1 + KH * (KW + 1), e;
    switch (op->kind) {
    case DPAR__OP_CONV2D: e = win + KH * KW * (C + 1); break;
    case DPAR__OP_CONV2D_BWD_INPUT: e = win + KH * KW * (O + 1); break;
    case DPAR__OP_CONV2D_BWD_KERNEL:
        if (dpar__vk_conv_wide(op)) /* lanes over the outputs, then the tree */
            return dpar__vk_ceil(n, dpar__vk_rows((int64_t)n)) * (dpar__vk_ceil(N * OH * OW, DPAR__VK_WG) + 11) + 1;
        e = N + 1 + N * (OH + 1) + N * OH * (OW + 1);
        break;
    case DPAR__OP_AVG_POOL:
    case DPAR__OP_MAX_POOL: e = win; break;
    default: { /* the windows holding an element, each rescanned for its maximum */
        uint64_t wi = dpar__vk_ceil(KH, (uint64_t)p[9]) + 1, wj = dpar__vk_ceil(KW, (uint64_t)p[10]) + 1;
        e = wi + 1 + wi * (wj + 1) + (op->kind == DPAR__OP_MAX_POOL_BWD ? wi * wj * win : 0);
    }
    }
    return dpar__vk_per_inv(ph, n) * (e + 1) + 1;
}
/* An upper bound of the loop turns one invocation of op's shaders takes on device dev (turns plus one
   a loop entered; 0: bounded by constants whatever the shape). Mirrors the dispatch geometry below. */
static uint64_t dpar__vk_op_turns(const dpar__vk *st, int dev, const dpar__op *op) {
    const dpar__vkphys *ph = st->devs[dev].ph;
    uint64_t n = op->dst ? (uint64_t)op->dst->count : 0;
    const int64_t *p = op->p;
    if (op->kind >= DPAR__OP_CONV2D && op->kind <= DPAR__OP_MAX_POOL_BWD) /* the seven consecutive kinds */
        return dpar__vk_win_turns(ph, op);
    switch (op->kind) {
    case DPAR__OP_MATMUL:
    case DPAR__OP_MATMUL_BATCHED: { /* matmul_direct.comp: a K loop a column block, batches over 65535 groups */
        int64_t batches = op->kind == DPAR__OP_MATMUL ? 1 : p[0];
        uint64_t zs = dpar__vk_ceil(batches > 1 ? (uint64_t)batches : 1, 65535);
        return zs * dpar__vk_mm_cols(op->k, batches) * ((uint64_t)op->k + 3) + 1;
    }
    case DPAR__OP_SUM:
    case DPAR__OP_SUMSQ: /* one group, 4 elements a turn */ return dpar__vk_ceil((uint64_t)op->src0->count, 1024) + 10;
    case DPAR__OP_MSE: /* one group, 4 elements a turn */ return dpar__vk_ceil((uint64_t)op->src0->count, 1024) + 10;
    case DPAR__OP_BIAS_GRAD: /* a column's rows */
        return n ? dpar__vk_col_turns(ph, n, (uint64_t)op->src0->count / n) : 0;
    case DPAR__OP_SOFTMAX_XENT: { /* dpar__vk_xent: one group of 64, rows t, t+64, ..., four loops over a row;
                                     or the wide passes: the count's and the sum's strided loop and tree, and a
                                     workgroup's rows, each three loops over its lanes' classes and two trees of
                                     6 levels (measured: a row of 64 k classes is right on llvmpipe up to
                                     3 k + 19 = 65,533 turns, k = 21,838, and one turn short past it) */
        uint64_t rows = (uint64_t)op->src1->count, cols = rows ? (uint64_t)op->src0->count / rows : 0;
        if (!dpar__vk_xent_wide(rows, cols)) return dpar__vk_ceil(rows, 64) * (4 * (cols + 1) + 2) + 4 * 65 + 2;
        uint64_t g = dpar__vk_rows((int64_t)rows), sums = dpar__vk_ceil(rows, 64) + 1 + 7 + 1;
        uint64_t row = dpar__vk_ceil(rows, g) * (3 * (dpar__vk_ceil(cols, 64) + 1) + 2 * 7 + 1) + 1;
        return row > sums ? row : sums;
    }
    case DPAR__OP_EMBED:
    case DPAR__OP_EMBED_BWD: { /* the index check's one group, 4 a turn; embed_bwd: a column's indices */
        uint64_t turns = dpar__vk_ceil((uint64_t)op->src1->count, 1024) + 10;
        if (op->kind == DPAR__OP_EMBED_BWD && op->n > 0) {
            uint64_t t = dpar__vk_per_inv(ph, (uint64_t)op->n) * ((uint64_t)op->m + 1) + 1;
            turns = t > turns ? t : turns;
        }
        return turns;
    }
    case DPAR__OP_REDUCE: { /* reduce_axes.comp: an output's reduced elements (twice for argmax's scatter) */
        uint64_t r = 1;
        for (int d = 0; d < 4; d++)
            if ((p[13] >> d) & 1) r *= (uint64_t)p[d];
        return dpar__vk_per_inv(ph, (uint64_t)op->n) * (2 * (r + 1) + 1) + 1;
    }
    case DPAR__OP_SOFTMAX:
    case DPAR__OP_SOFTMAX_BWD: /* a row's three loops, over an invocation or over a workgroup's lanes */
        if (op->n >= DPAR__VK_WIDE)
            return dpar__vk_ceil((uint64_t)op->m, dpar__vk_rows(op->m)) *
                       (3 * (dpar__vk_ceil((uint64_t)op->n, DPAR__VK_WG) + 1) + 3 * 9 + 1) +
                   1;
        return dpar__vk_per_inv(ph, (uint64_t)op->m) * (3 * ((uint64_t)op->n + 1) + 1) + 1;
    case DPAR__OP_NORM:
    case DPAR__OP_NORM_BWD: { /* a row's loops (six with the overflow-safe rescale), columns over 256 lanes
                                 or one lane, the tree reductions; layernorm_wgrad: a column's rows */
        uint64_t m = (uint64_t)op->m, N = (uint64_t)op->n;
        int per_row = dpar__vk_norm_per_row(st, dev, op);
        uint64_t rows = per_row ? dpar__vk_ceil(dpar__vk_ceil(m, 256), dpar__vk_rows((int64_t)dpar__vk_ceil(m, 256)))
                                : dpar__vk_ceil(m, dpar__vk_rows((int64_t)m));
        uint64_t turns = rows * (6 * (dpar__vk_ceil(N, per_row ? 1 : 256) + 1) + 5 * 9 + 1) + 1;
        if (op->kind == DPAR__OP_NORM_BWD && (op->dst2 || op->dst3)) {
            uint64_t w = dpar__vk_col_turns(ph, N, m);
            turns = w > turns ? w : turns;
        }
        return turns;
    }
    case DPAR__OP_ATTN:
    case DPAR__OP_ATTN_BWD_Q:
    case DPAR__OP_ATTN_BWD_KV: { /* p: B*H, Tq, Tk, D, Dv; rows over 65535 groups */
        int kv = op->kind == DPAR__OP_ATTN_BWD_KV;
        uint64_t rows = (uint64_t)(p[0] * (kv ? p[2] : p[1])), nk = (uint64_t)(kv ? p[1] : p[2]);
        return dpar__vk_ceil(rows, 65535) * dpar__vk_attn_turns(nk, (uint64_t)p[3], (uint64_t)p[4]);
    }
    default: return 0; /* element-wise: at most 257 items an invocation (dpar__vk_flat_groups), fixed loops each */
    }
}
/* Refuses op on a device that caps shader loops (ph->loop_cap) when an invocation would pass the cap. */
static dpar_status dpar__vk_loop_check(const dpar__vk *st, int dev, const dpar__op *op) {
    const dpar__vkphys *ph = st->devs[dev].ph;
    if (!ph->loop_cap) return DPAR_OK;
    uint64_t turns = dpar__vk_op_turns(st, dev, op);
    if (turns < ph->loop_cap) return DPAR_OK;
    char a[96], b[96], mnk[96] = "";
    const dpar_buffer *x = op->src0 ? op->src0 : op->dst;
    const dpar_buffer *y = op->src1 ? op->src1 : op->dst;
    if (op->kind == DPAR__OP_MATMUL ||
        op->kind == DPAR__OP_MATMUL_BATCHED) /* the product's own sizes; other ops' m, n, k are the backend's */
        snprintf(mnk, sizeof mnk, " (m %lld, n %lld, k %lld)", (long long)op->m, (long long)op->n, (long long)op->k);
    return dpar__err(DPAR_ERR_SHAPE,
                     "vulkan: %s of %s and %s: an invocation would loop about %llu times%s; llvmpipe ends shader "
                     "loops after 65,535 iterations; split the op or use the CPU backend",
                     dpar__op_name(op), x ? dpar__shape_str(a, sizeof a, x->ndim, x->shape) : "-",
                     y ? dpar__shape_str(b, sizeof b, y->ndim, y->shape) : "-", (unsigned long long)turns, mnk);
}
/* be->op_fits: the buffers' range, then the loop cap (a buffer past the range is the reason an op cannot run, whatever
   its loops), checked by dpar__vk_op and before a call issued as several ops runs its first */
static dpar_status dpar__vk_op_fits(void *state, int dev, const dpar__op *op) {
    const dpar__vk *st = (const dpar__vk *)state;
    const dpar__vkphys *ph = st->devs[dev].ph;
    const dpar_buffer *b[8] = { op->dst, op->dst2, op->dst3, op->dst4, op->src0, op->src1, op->src2, op->src3 };
    bool transfer = op->kind == DPAR__OP_FILL || op->kind == DPAR__OP_COPY ||
                    (op->kind == DPAR__OP_CAST && op->dst->dtype == op->src0->dtype); /* no shader: no range */
    for (int i = 0; i < 8 && !transfer; i++) {
        const dpar__vkbuf *vb = b[i] ? (const dpar__vkbuf *)b[i]->mem : NULL;
        if (vb && vb->size > ph->props.limits.maxStorageBufferRange)
            return dpar__vk_range_err(ph, dev, dpar__op_name(op), vb->size);
    }
    return dpar__vk_loop_check(st, dev, op);
}

static dpar_status dpar__vk_op(void *state, int dev, const dpar__op *op) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkbuf *dst = op->dst ? (dpar__vkbuf *)op->dst->mem : NULL;
    dpar__vkpc pc;
    memset(&pc, 0, sizeof pc);
    memcpy(pc.f, op->f, sizeof pc.f);
    dpar__vkbuf *b[DPAR__VK_BINDINGS] = { dst, NULL, NULL, NULL };
    int64_t n = op->dst ? op->dst->count : 0;
    const int64_t U32 = (int64_t)0xffffffff;
    int64_t big = n;
    if (op->src0 && op->src0->count > big) big = op->src0->count;
    if (op->src1 && op->src1->count > big) big = op->src1->count;
    if (big > U32 || op->m > U32 || op->n > U32 || op->k > U32)
        return dpar__err(DPAR_ERR_BACKEND,
                         "vulkan: op on %lld elements: the Vulkan backend handles at most 2^32-1 "
                         "elements per buffer",
                         (long long)big);
    DPAR_ASSERT((int)op->kind >= 0 && op->kind < DPAR__OP_COUNT);
    if (dpar__cpu_half_kind(op->kind) && dpar__op_has_half(op)) return dpar__half_lowered(st, dev, op, &dpar__vk_half);
    dpar_status s = dpar__vk_op_fits(st, dev, op); /* before anything is recorded */
    if (s) return s;
    switch (op->kind) {
    case DPAR__OP_MATMUL:
    case DPAR__OP_BIAS_ADD:
    case DPAR__OP_BIAS_GRAD:
    case DPAR__OP_SOFTMAX_XENT:
    case DPAR__OP_MSE:
    case DPAR__OP_SUM:
    case DPAR__OP_SUMSQ:
    case DPAR__OP_FILL:
    case DPAR__OP_COPY:
    case DPAR__OP_CAST: return dpar__vk_op_basic(st, dev, op, b, &pc, n);
    case DPAR__OP_RELU:
    case DPAR__OP_RELU_BWD:
    case DPAR__OP_AXPY:
    case DPAR__OP_SCALE:
    case DPAR__OP_SGD:
        if (n == 0) return DPAR_OK;
        return dpar__vk_op_elementwise(st, dev, op, b, &pc);
    case DPAR__OP_ADAMW:
    case DPAR__OP_EMBED:
    case DPAR__OP_EMBED_BWD:
    case DPAR__OP_DROPOUT: return dpar__vk_op_optim(st, dev, op, b, &pc);
    case DPAR__OP_UNARY:
    case DPAR__OP_UNARY_BWD:
    case DPAR__OP_BINARY:
    case DPAR__OP_REDUCE:
    case DPAR__OP_WHERE:
    case DPAR__OP_SOFTMAX:
    case DPAR__OP_SOFTMAX_BWD:
    case DPAR__OP_STRIDED: return dpar__vk_op_elem(st, dev, op, b, &pc);
    /* >>norm-attn kinds */
    case DPAR__OP_NORM:
    case DPAR__OP_NORM_BWD: return dpar__vk_op_norm(st, dev, op, &pc);
    case DPAR__OP_MATMUL_BATCHED: return dpar__vk_op_matmul_batched(st, dev, op, &pc);
    case DPAR__OP_ATTN:
    case DPAR__OP_ATTN_BWD_Q:
    case DPAR__OP_ATTN_BWD_KV: return dpar__vk_op_attn(st, dev, op, &pc);
    /* >>conv-pool kinds */
    case DPAR__OP_CONV2D:
    case DPAR__OP_CONV2D_BWD_INPUT:
    case DPAR__OP_CONV2D_BWD_KERNEL:
    case DPAR__OP_AVG_POOL:
    case DPAR__OP_AVG_POOL_BWD:
    case DPAR__OP_MAX_POOL:
    case DPAR__OP_MAX_POOL_BWD: return dpar__vk_op_conv_pool(st, dev, op, &pc);
    default: return dpar__op_unsupported("vulkan", op);
    }
}

/* ---------------------------------------------------------------------------
   Collectives, staged through host memory
   ------------------------------------------------------------------------ */
#define DPAR__VK_COLL_CHUNK ((size_t)4 << 20) /* bytes per pipelined all-reduce chunk */

static dpar_status dpar__vk_grow_host(dpar__vkdev *d, int i, size_t need) {
    if (need == 0) need = 1;
    if (d->hcap[i] >= need) return DPAR_OK;
    void *p = DPAR_REALLOC(d->hbuf[i], need);
    if (!p)
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: collective: out of host memory for %zu staging bytes", need);
    d->hbuf[i] = p;
    d->hcap[i] = need;
    return DPAR_OK;
}

/* Records a copy between a buffer and the collective staging buffer of d and
   submits it (no wait); *serial receives the batch to wait for. */
static dpar_status dpar__vk_stage_copy(dpar__vkdev *d, dpar__vkbuf *b, VkDeviceSize boff, VkDeviceSize soff,
                                       VkDeviceSize n, int to_staging, uint64_t *serial) {
    dpar__vk *st = d->st;
    dpar__mutex_lock(&d->lock);
    dpar__vkframe *f;
    dpar_status s = dpar__vk_begin(d, &f);
    if (!s) {
        dpar__vk_cmd_barrier(st, f->cb); /* compute writes -> transfer read / earlier transfers -> this one */
        VkBufferCopy r;
        r.srcOffset = to_staging ? boff : soff;
        r.dstOffset = to_staging ? soff : boff;
        r.size = n;
        if (to_staging)
            st->vkCmdCopyBuffer(f->cb, b->buf, d->cstage.buf, 1, &r);
        else
            st->vkCmdCopyBuffer(f->cb, d->cstage.buf, b->buf, 1, &r);
        b->last_serial = f->serial;
        *serial = f->serial;
        s = dpar__vk_submit(d); /* ends with the transfer -> host barrier */
    }
    dpar__mutex_unlock(&d->lock);
    return s;
}

static dpar_status dpar__vk_wait(dpar__vkdev *d, uint64_t serial) {
    dpar__mutex_lock(&d->lock);
    dpar_status s = dpar__vk_wait_serial(d, serial);
    dpar__mutex_unlock(&d->lock);
    return s;
}

/* All-reduce of device-local (unmapped) buffers: chunks go device -> staging
   (two slots per member), every member reduces its 1/n of the chunk on the
   host over all members' slots (f16/bf16 in f32), in place, and copies the
   result back; the download of chunk k+1 and the upload of chunk k-1 run on
   the device while the host reduces chunk k. */
static dpar_status dpar__vk_allreduce_pipelined(dpar__vk *st, dpar__coll *c) {
    int n = c->n, r = c->rank;
    dpar__vkdev *d = &st->devs[c->devices[r]];
    dpar__vkbuf *bin = (dpar__vkbuf *)c->in[r]->mem, *bout = (dpar__vkbuf *)c->out[r]->mem;
    size_t es = dpar_dtype_size(c->dtype);
    size_t total = (size_t)c->count * es;
    size_t chunk_el = DPAR__VK_COLL_CHUNK / es;
    size_t chunk = chunk_el * es;
    size_t nchunks = (total + chunk - 1) / chunk;
    dpar_status s = DPAR_OK;
    /* 1. a staging buffer with two slots on every member */
    size_t want = 2 * (total < chunk ? total : chunk);
    if (d->cstage.buf == VK_NULL_HANDLE || d->cstage.size < want) {
        dpar__mutex_lock(&d->lock);
        s = dpar__vk_drain(d);
        if (!s) {
            dpar__vk_destroy_vkbuf(st, &d->cstage);
            s = dpar__vk_create_vkbuf(st, d->ph, d->index, want, 1, &d->cstage);
        }
        dpar__mutex_unlock(&d->lock);
        if (s) return s;
    }
    size_t slot = d->cstage.size / 2;
    uint64_t up_serial[2] = { 0, 0 }, down_serial[2] = { 0, 0 };
    s = dpar__vk_stage_copy(d, bin, 0, 0, total < chunk ? total : chunk, 1, &down_serial[0]);
    for (size_t k = 0; !s && k < nchunks; k++) {
        int cur = (int)(k & 1), nxt = cur ^ 1;
        size_t off = k * chunk, len = total - off < chunk ? total - off : chunk;
        if (k + 1 < nchunks) { /* prefetch chunk k+1 into the other slot once its upload is done */
            size_t off1 = off + chunk, len1 = total - off1 < chunk ? total - off1 : chunk;
            if (up_serial[nxt] && (s = dpar__vk_wait(d, up_serial[nxt])) != DPAR_OK) break;
            if ((s = dpar__vk_stage_copy(d, bin, off1, (size_t)nxt * slot, len1, 1, &down_serial[nxt])) != DPAR_OK)
                break;
        }
        if ((s = dpar__vk_wait(d, down_serial[cur])) != DPAR_OK) break;
        unsigned char *mine = d->cstage.map + (size_t)cur * slot;
        if (!d->cstage.coherent && (s = dpar__vk_map_range(st, d->ph, d->cstage.mem, d->cstage.alloc_size,
                                                           (size_t)cur * slot, len, 1)) != DPAR_OK)
            break;
        if ((s = dpar__coll_barrier(c)) != DPAR_OK) return s; /* every member's chunk k is on the host */
        int64_t m = (int64_t)(len / es), lo = m * r / n, hi = m * (r + 1) / n;
        const char *src[DPAR_MAX_DEVICES];
        char *dst[DPAR_MAX_DEVICES];
        for (int j = 0; j < n; j++) {
            dpar__vkdev *dj = &st->devs[c->devices[j]];
            dst[j] = (char *)dj->cstage.map + (size_t)cur * (dj->cstage.size / 2) + (size_t)lo * es;
            src[j] = dst[j];
        }
        if (hi > lo) /* streaming stores as for the whole collective's working set: this chunk's, of every member */
            dpar__reduce_span(c->dtype, c->op, n, src, dst, n, hi - lo,
                              dpar__streaming((uint64_t)m * es * 2u * (uint64_t)n));
        if ((s = dpar__coll_barrier(c)) != DPAR_OK) return s; /* chunk k reduced everywhere */
        if (!d->cstage.coherent && (s = dpar__vk_map_range(st, d->ph, d->cstage.mem, d->cstage.alloc_size,
                                                           (size_t)cur * slot, len, 0)) != DPAR_OK)
            break;
        (void)mine;
        s = dpar__vk_stage_copy(d, bout, off, (size_t)cur * slot, len, 0, &up_serial[cur]);
    }
    if (!s) {
        dpar__mutex_lock(&d->lock);
        s = dpar__vk_wait_serial(d, up_serial[0] > up_serial[1] ? up_serial[0] : up_serial[1]);
        dpar__mutex_unlock(&d->lock);
    }
    return s;
}

/* The whole collective for member c->rank. Mapped buffers are reduced in
   place (wait for the device + invalidate, then flush); device-local ones are
   staged: all-reduce chunked and pipelined, the other kinds whole. */
static dpar_status dpar__vk_collective(void *state, dpar__coll *c) {
    dpar__vk *st = (dpar__vk *)state;
    int n = c->n, r = c->rank, dev = c->devices[r];
    dpar__vkdev *d = &st->devs[dev];
    dpar_buffer *in = c->in[r], *out = c->out[r];
    dpar__vkbuf *bin = (dpar__vkbuf *)in->mem, *bout = (dpar__vkbuf *)out->mem;
    if (dpar__vk_rec) return dpar__vk_rec_refuse("a collective");
    dpar_status s = dpar__vk_check_lost(st);
    /* a check of this member's labels or indices first: its error fails the job before any member's optimizer
       update takes the reduced NaN (the guard of sgd.comp sees this device's words only); the staging below
       waits for the device anyway */
    if (!s && DPAR__ATOMIC_LOAD(&d->idx_pending)) s = dpar__vk_idx_report(st, dev);
    if (s) return s;
    int all_unmapped = 1;
    for (int j = 0; j < n; j++)
        if (((dpar__vkbuf *)c->in[j]->mem)->map || ((dpar__vkbuf *)c->out[j]->mem)->map) all_unmapped = 0;
    if (c->kind == DPAR__COLL_ALL_REDUCE && all_unmapped && c->count > 0 && c->in[r]->nbytes > 0)
        return dpar__vk_allreduce_pipelined(st, c);

    /* host views of this member's input and output */
    size_t inb = in->nbytes, outb = out->nbytes;
    char *in_h, *out_h, *scratch = NULL;
    if (bin->map) {
        in_h = (char *)bin->map;
        if (inb && (s = dpar__vk_host_acquire(st, dev, bin, 0, inb)) != DPAR_OK) return s;
    } else {
        if ((s = dpar__vk_grow_host(d, 0, inb)) != DPAR_OK) return s;
        in_h = (char *)d->hbuf[0];
        if (inb && (s = dpar__vk_read(st, dev, bin, 0, in_h, inb)) != DPAR_OK) return s;
    }
    if (out == in) {
        out_h = in_h;
    } else if (bout->map) {
        out_h = (char *)bout->map;
        if (outb && (s = dpar__vk_host_acquire(st, dev, bout, 0, outb)) != DPAR_OK) return s;
    } else {
        if ((s = dpar__vk_grow_host(d, 1, outb)) != DPAR_OK) return s;
        out_h = (char *)d->hbuf[1];
    }
    if (c->kind == DPAR__COLL_PERMUTE && out_h == in_h) {
        int i = bin->map ? 0 : 1; /* a host buffer this member does not use otherwise */
        if ((s = dpar__vk_grow_host(d, i, outb)) != DPAR_OK) return s;
        scratch = (char *)d->hbuf[i];
    }
    d->coll_in = in_h;
    d->coll_out = out_h;
    if ((s = dpar__coll_barrier(c)) != DPAR_OK) return s; /* every member's views are published */
    char *ins[DPAR_MAX_DEVICES], *outs[DPAR_MAX_DEVICES];
    for (int j = 0; j < n; j++) {
        ins[j] = st->devs[c->devices[j]].coll_in;
        outs[j] = st->devs[c->devices[j]].coll_out;
    }
    dpar__host_work(c, ins, outs, scratch, 1, 0);         /* every member's views are visible here */
    if ((s = dpar__coll_barrier(c)) != DPAR_OK) return s; /* nobody reads the views any more */
    if (scratch && outb) memcpy(out_h, scratch, outb);
    if (!outb) return DPAR_OK;
    if (bout->map) return dpar__vk_host_release(st, dev, bout, 0, outb);
    return dpar__vk_write(st, dev, bout, 0, out_h, outb);
}

/* >>vulkan interop ===========================================================
   dpar_vulkan_buffer_export / _release: a buffer lent to the engine's Vulkan
   work, ordered by a timeline semaphore per logical device (values: an
   export's ready value, signalled by dpar; its release value, signalled by the
   engine and waited for by dpar's next submission on the device). */
static dpar_status dpar__vk_loan_check(dpar_buffer *b, const char *fn, int lending) {
    if (!b) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: b is NULL", fn);
    if (dpar__live_buf(b, fn, "b")) return DPAR_ERR_STATE;
    if (dpar__self_worker)
        return dpar__err(DPAR_ERR_STATE, "%s: called inside a pmap/shard_map function; call it between steps", fn);
    dpar_status s = dpar__busy(b->rt, lending ? b : NULL, fn);
    if (s) return s;
    if (b->rt->be->kind != DPAR_BACKEND_VULKAN)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "%s: the buffer lives on the %s backend; only buffers of a Vulkan runtime (backend = "
                         "DPAR_BACKEND_VULKAN) have a VkBuffer",
                         fn, b->rt->be->name);
    if (!lending && !DPAR__ATOMIC_LOAD(&b->lent))
        return dpar__err(DPAR_ERR_STATE, "%s: the buffer is not lent (dpar_vulkan_buffer_export it first)", fn);
    return DPAR_OK;
}

/* The device's timeline semaphore, made on first use. Lock held. */
static dpar_status dpar__vk_loan_sem(dpar__vk *st, dpar__vkdev *d) {
    if (d->sem != VK_NULL_HANDLE) return DPAR_OK;
    VkSemaphoreTypeCreateInfo ti;
    memset(&ti, 0, sizeof ti);
    ti.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO;
    ti.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO;
    ci.pNext = &ti;
    VkResult vr = st->vkCreateSemaphore(d->ph->device, &ci, st->alloc, &d->sem);
    if (vr != VK_SUCCESS) {
        d->sem = VK_NULL_HANDLE;
        return dpar__vk_fail(st, vr, "vkCreateSemaphore", "device %d, a timeline semaphore", d->index);
    }
    return DPAR_OK;
}

DPAR_API dpar_status dpar_vulkan_buffer_export(dpar_buffer *b, dpar_vulkan_export *out) {
    dpar__clear_error();
    if (!out) return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "dpar_vulkan_buffer_export: out is NULL");
    memset(out, 0, sizeof *out);
    dpar_status s = dpar__vk_loan_check(b, "dpar_vulkan_buffer_export", 1);
    if (s) return s;
    dpar__vk *st = (dpar__vk *)b->rt->bstate;
    dpar__vkdev *d = &st->devs[b->device];
    dpar__vkbuf *vb = (dpar__vkbuf *)b->mem;
    if (!st->adopted) /* no other code can reach dpar's own VkDevice: its buffers are of no use outside */
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "dpar_vulkan_buffer_export: the runtime runs on a VkDevice dpar created, which your Vulkan "
                         "code cannot use; hand dpar your own device (desc.vulkan.external) to share buffers");
    if (!d->ph->timeline)
        return dpar__err(DPAR_ERR_BACKEND_UNAVAILABLE,
                         "dpar_vulkan_buffer_export: device %d has no timeline semaphores; enable "
                         "VkPhysicalDeviceVulkan12Features::timelineSemaphore on your device and set "
                         "desc.vulkan.external.timeline_semaphore",
                         b->gdev);
    dpar__mutex_lock(&d->lock);
    if (d->loaned) {
        dpar__mutex_unlock(&d->lock);
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_vulkan_buffer_export: device %d already has a buffer lent (one at a time per device); "
                         "dpar_vulkan_buffer_release it first",
                         b->gdev);
    }
    dpar__vkframe *f = NULL;
    s = dpar__vk_loan_sem(st, d);
    if (!s) s = dpar__vk_check_lost(st);
    if (!s) s = dpar__vk_begin(d, &f); /* every earlier command of the queue is in the signal's first scope */
    if (!s) {
        d->sem_signal = d->sem_value + 1;
        s = dpar__vk_submit(d);
    }
    if (!s) {
        out->ready_value = ++d->sem_value;
        out->release_value = ++d->sem_value;
        d->loaned = 1;
        memcpy(&out->buffer, &vb->buf, sizeof vb->buf); /* a pointer or a uint64_t, as the platform has it */
        memcpy(&out->semaphore, &d->sem, sizeof d->sem);
        out->offset = 0;
        out->size = b->nbytes;
        out->queue_family = d->ph->family;
    }
    dpar__mutex_unlock(&d->lock);
    if (s) {
        memset(out, 0, sizeof *out);
        return s;
    }
    DPAR__ATOMIC_STORE(&b->lent, 1);
    DPAR__ATOMIC_ADD_FETCH(&b->rt->lent, 1);
    return DPAR_OK;
}

static dpar_status dpar__vk_buffer_release(void *obj);
DPAR_API dpar_status dpar_vulkan_buffer_release(dpar_buffer *b) {
    return dpar__destroy_kept(dpar__vk_buffer_release, b);
}
static dpar_status dpar__vk_buffer_release(void *obj) {
    dpar_buffer *b = (dpar_buffer *)obj;
    dpar_status s = dpar__vk_loan_check(b, "dpar_vulkan_buffer_release", 0);
    if (s) return s;
    dpar__vk *st = (dpar__vk *)b->rt->bstate;
    dpar__vkdev *d = &st->devs[b->device];
    dpar__vkbuf *vb = (dpar__vkbuf *)b->mem;
    dpar__mutex_lock(&d->lock);
    dpar__vkframe *f = NULL;
    s = dpar__vk_begin(d, &f);
    if (!s) {
        /* the batch waits for the engine's release; the barrier chains every later command (this batch's
           and, through their leading barriers, the next batches') after that wait; host access to b waits
           for this batch's fence */
        d->sem_wait = d->sem_value;
        dpar__vk_cmd_barrier(st, f->cb);
        vb->last_serial = f->serial;
        d->loaned = 0;
        s = dpar__vk_recorded(d, f);
    }
    dpar__mutex_unlock(&d->lock);
    if (s) return s;
    DPAR__ATOMIC_STORE(&b->lent, 0);
    DPAR__ATOMIC_SUB_FETCH(&b->rt->lent, 1);
    return DPAR_OK;
}

/* >>vulkan program ===========================================================
   The backend's prog_* hooks (>>graph program in dpar.h): a graph records a
   device's run of ops once into a command buffer (descriptor sets made once,
   push constants baked in) and re-submits it every step. A recording is
   SIMULTANEOUS_USE: a submit does not wait for its previous submit (the
   queue runs them in order, and the first command's full barrier orders it
   after every earlier submission), so the host can queue step k+1 while the
   device runs step k (up to the ring's DPAR__VK_FRAMES batches). It submits the
   recording in one vkQueueSubmit after the ring's open batch, if any, and after
   another recording for prog_submit_pre (a replayed step's staged feed copies,
   >>graph feeds in dpar.h, so the step records nothing), with the fence of a
   bare batch (no command buffer of its own to record) when none is open; that
   batch's serial and fence stand for them: every listed buffer's last_serial moves
   to that batch, so reads, writes and frees wait for it as for any batch. Each
   recorded command starts with the full barrier of the ring's commands (so
   the batch's commands run first); the recording ends with the host barrier,
   as every batch does. */
static dpar_status dpar__vk_prog_begin(void *state, int dev) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkdev *d = &st->devs[dev];
    if (dpar__vk_rec) return dpar__err(DPAR_ERR_STATE, "vulkan: a graph program is being recorded on this thread");
    dpar_status s = dpar__vk_check_lost(st);
    dpar__vkbuf *err = NULL;
    if (!s) s = dpar__vk_idx_words(st, dev, &err); /* made now: its zero-fill must not be recorded */
    if (s) return s;
    dpar__vkprog *p = (dpar__vkprog *)DPAR_MALLOC(sizeof *p);
    if (!p) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "vulkan: out of host memory (graph program)");
    memset(p, 0, sizeof *p);
    VkCommandBufferAllocateInfo ai;
    memset(&ai, 0, sizeof ai);
    ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    ai.commandPool = d->cmd_pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBufferBeginInfo bi;
    memset(&bi, 0, sizeof bi);
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT; /* submitted every step, the next before this one ran */
    dpar__mutex_lock(&d->lock);                              /* the command pool is externally synchronized */
    VkResult vr = st->vkAllocateCommandBuffers(d->ph->device, &ai, &p->fr.cb);
    if (vr == VK_SUCCESS && (vr = st->vkBeginCommandBuffer(p->fr.cb, &bi)) != VK_SUCCESS)
        st->vkFreeCommandBuffers(d->ph->device, d->cmd_pool, 1, &p->fr.cb);
    dpar__mutex_unlock(&d->lock);
    if (vr != VK_SUCCESS) {
        DPAR_FREE(p);
        return dpar__vk_fail(st, vr, "vkAllocateCommandBuffers/vkBeginCommandBuffer", "device %d (graph program)", dev);
    }
    p->fr.state = 1;
    dpar__vk_rec = p;
    dpar__vk_rec_dev = dev;
    return DPAR_OK;
}
static void dpar__vk_prog_free(void *state, int dev, void *prog) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkdev *d = &st->devs[dev];
    dpar__vkprog *p = (dpar__vkprog *)prog;
    if (!p) return;
    dpar__mutex_lock(&d->lock);
    if (p->serial > d->completed && dpar__vk_wait_serial(d, p->serial) != DPAR_OK && !st->adopted)
        st->vkDeviceWaitIdle(d->ph->device); /* could not wait for its batch: wait for the device */
    st->vkFreeCommandBuffers(d->ph->device, d->cmd_pool, 1, &p->fr.cb);
    for (int i = 0; i < p->npools; i++) st->vkDestroyDescriptorPool(d->ph->device, p->pools[i], st->alloc);
    dpar__mutex_unlock(&d->lock);
    DPAR_FREE(p->pools);
    DPAR_FREE(p->bufs);
    DPAR_FREE(p);
}
/* Ends this thread's recording for dev: *prog the recording, NULL when it holds no command. */
static dpar_status dpar__vk_prog_end(void *state, int dev, void **prog) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkprog *p = dpar__vk_recording(dev);
    *prog = NULL;
    if (!p) return dpar__err(DPAR_ERR_STATE, "vulkan: no graph program is being recorded for device %d", dev);
    dpar__vk_rec = NULL;
    if (p->nops) dpar__vk_cmd_host_barrier(st, p->fr.cb); /* it runs last in its submit */
    VkResult vr = st->vkEndCommandBuffer(p->fr.cb);
    if (vr != VK_SUCCESS || p->nops == 0) {
        dpar__vk_prog_free(state, dev, p);
        return vr == VK_SUCCESS ? DPAR_OK
                                : dpar__vk_fail(st, vr, "vkEndCommandBuffer", "device %d (graph program)", dev);
    }
    p->fr.state = 0;
    *prog = p;
    return DPAR_OK;
}
/* Submits recordings pre (NULL: none) and prog in one vkQueueSubmit, after the open batch if any. */
static dpar_status dpar__vk_prog_submit_pre(void *state, int dev, void *pre, void *prog) {
    dpar__vk *st = (dpar__vk *)state;
    dpar__vkdev *d = &st->devs[dev];
    dpar__vkprog *ps[2] = { (dpar__vkprog *)pre, (dpar__vkprog *)prog };
    if (dpar__vk_rec) return dpar__vk_rec_refuse("a program submit");
    dpar__mutex_lock(&d->lock);
    dpar_status s = dpar__vk_check_lost(st);
    dpar__vkframe *f = NULL;
    if (!s) s = dpar__vk_begin_batch(d, d->cur < 0, &f); /* the open batch (its commands run first), else a bare one */
    if (!s) {
        uint64_t serial = f->serial;
        int n = 0;
        for (int j = 0; j < 2; j++)
            if (ps[j]) d->suffix[n++] = ps[j]->fr.cb;
        s = dpar__vk_submit(d);
        d->suffix[0] = d->suffix[1] = VK_NULL_HANDLE;
        for (int j = 0; j < 2 && !s; j++) {
            dpar__vkprog *p = ps[j];
            if (!p) continue;
            p->serial = serial;
            for (int i = 0; i < p->nbufs; i++) p->bufs[i]->last_serial = serial;
            if (p->idx) DPAR__ATOMIC_STORE(&d->idx_pending, 1);
        }
    }
    dpar__mutex_unlock(&d->lock);
    return s;
}
static dpar_status dpar__vk_prog_submit(void *state, int dev, void *prog) {
    return dpar__vk_prog_submit_pre(state, dev, NULL, prog);
}

static const dpar__backend_iface *dpar__vulkan_iface(void) {
    static const dpar__backend_iface iface = {
        "vulkan",
        DPAR_BACKEND_VULKAN,
        false, /* attn_kv_computes_d: attention_bwd_kv.comp reads pass 1's D */
        true,  /* bias_add_relu: bias_add.comp writes the ReLU too (flags bit 0) */
        true,  /* bias_grad_relu: bias_grad.comp masks dy and writes it (flags bit 1) */
        true,  /* matmul_bias: matmul.comp and matmul_direct_bias.comp add the bias and write its ReLU */
        true,  /* sgd_pairs: sgd_pair.comp */
        dpar__vk_init,
        dpar__vk_shutdown,
        dpar__vk_device_info,
        NULL, /* thread_init */
        dpar__vk_alloc,
        dpar__vk_free,
        dpar__vk_write,
        dpar__vk_read,
        dpar__vk_sync,
        dpar__vk_host_ptr,
        dpar__vk_host_acquire,
        dpar__vk_host_release,
        dpar__vk_op,
        dpar__vk_collective,
        NULL, /* cross_id_size: groups across processes take the core's host-staged MPI path */
        NULL, /* cross_id */
        NULL, /* device_status: every wait reports its own error */
        NULL, /* visible_devices */
        dpar__vk_physical_device,
        NULL, /* health: no vendor-neutral readings */
        dpar__vk_prog_begin,
        dpar__vk_prog_end,
        dpar__vk_prog_submit,
        dpar__vk_prog_free,
        dpar__vk_prog_submit_pre,
        dpar__vk_refill,
        dpar__vk_host_waits,
        dpar__vk_op_fits,
    };
    return &iface;
}

#endif /* DPAR_VULKAN_H_INCLUDED */
