/* dpar_train.h — training helpers for dpar.h, written on its public API only:
   the data-parallel gradient exchange (PyTorch DDP's buckets), ZeRO-1 for SGD,
   and checkpoints of named global arrays.

   USAGE
   -----
       #include "dpar.h"
       #include "util/dpar_train.h"        // declarations (it includes dpar.h itself)

   The implementation is compiled where dpar's is: in the one file that defines
   DPAR_IMPLEMENTATION, include this header too and nothing else is needed.
   Where dpar's implementation lives elsewhere (a library), define
   DPAR_TRAIN_IMPLEMENTATION before including this header in exactly one file.
   Keep util/ next to dpar.h (this header includes "../dpar.h"). The
   single-file build/dpar_single.h (`make amalgamate`) contains this header.

   Nothing here touches dpar's internals (no struct fields; of the dpar__
   names only the platform layer's: threads, files, DESIGN §9):
   what the helpers need beyond the core API is public in dpar.h
   (dpar_buffer_map, dpar_ctx_position, dpar_ctx_dispatch_id, dpar_in_dispatch,
   dpar_sgd_check, dpar_set_last_error, dpar_trace_event, dpar_f32_to_f16_n),
   so this file is also an example of writing helpers on the API. Errors follow
   dpar's rules: a status, and dpar_last_error() says what, where, how to fix.
   Allocations go through DPAR_MALLOC / DPAR_FREE / DPAR_REALLOC as in dpar.h.

   License: MIT, as dpar.h.
*/
#if defined(DPAR_TRAIN_IMPLEMENTATION) && !defined(_GNU_SOURCE) && !defined(__cplusplus) && \
    !defined(DPAR_PLATFORM_FORCE_MACOS)
#define _GNU_SOURCE /* fileno, fsync, getpid with -std=c99 */
#endif
#ifndef DPAR_TRAIN_H_INCLUDED
#define DPAR_TRAIN_H_INCLUDED

#include "../dpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* >>train-api ================================================================
   Data-parallel helper, ZeRO-1, checkpoints
   ======================================================================== */
/* The data-parallel gradient exchange of PyTorch DDP (Li et al., "PyTorch
   Distributed", VLDB 2020): gradients registered once, fused into buckets
   (one all-reduce per bucket instead of one per tensor), and a bucket's
   all-reduce started asynchronously as soon as all its gradients are final,
   so it overlaps the backward pass of the earlier layers.
   Buckets are keyed by parameter: parameters are assigned to buckets at the
   first use, in reverse registration order (the last layer's gradients are
   usually final first), up to bucket_bytes each; a bucket is launched when
   all its parameters are ready AND every earlier bucket was launched, so
   every device issues the same collectives in the same order whatever order
   its gradients arrive in. Optional f16/bf16 communication: gradients are
   cast once to the narrow type, all-reduced with f32 accumulation (and the
   mean taken in f32), rounded once, and cast back to f32. f16 holds at most
   65504: a gradient or a mean past it becomes inf and the step returns
   DPAR_OK, as PyTorch DDP's fp16_compress_hook does; scale the loss
   (dpar_loss_scaler) so that its unscale step sees the inf and skips, or use
   bf16 (f32's range). When the axes span
   a single device there is nothing to exchange and the gradients are left
   as they are.

   Per step, inside fn:            dpar_dp_begin(dp, ctx);
     after each gradient is final: dpar_dp_grad_ready(dp, ctx, id);
     before the optimizer step:    dpar_dp_finish(dp, ctx);   (waits, unpacks)
   or all at once after the backward pass: dpar_dp_allreduce(dp, ctx). */
typedef struct dpar_dp dpar_dp;

typedef struct dpar_dp_desc {
    const char *axes;      /* mesh axes the replicas span, e.g. "data" (required) */
    bool sum;              /* false: gradients are averaged (pmean); true: summed */
    size_t bucket_bytes;   /* bucket capacity in bytes of comm_dtype; 0: 25 MiB (DDP's bucket_cap_mb) */
    dpar_dtype comm_dtype; /* DPAR_F32 (0, default), DPAR_F16 or DPAR_BF16 */
    bool blocking;         /* true: each bucket is all-reduced when launched, no overlap
                              (buckets under 256 KiB always are: handing them to the
                              communication thread costs more than their all-reduce) */
} dpar_dp_desc;

/* Creates a helper for mesh m, attached to it (dpar_handle_attach: destroying
   the mesh or its runtime frees a helper left alive). Outside fn.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, comm_dtype not f32/f16/bf16),
   DPAR_ERR_UNKNOWN_AXIS, DPAR_ERR_STATE (m stale), DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_dp_create(dpar_mesh *m, const dpar_dp_desc *desc, dpar_dp **out);
/* Frees the helper and its bucket buffers. NULL is a no-op (DPAR_OK).
   Errors (nothing is freed): DPAR_ERR_STATE for a stale helper (destroyed, or
   freed with its mesh or runtime), inside fn, or while a call on its runtime
   runs on another thread. Every dpar_dp_* call refuses a stale helper so. */
DPAR_API dpar_status dpar_dp_destroy(dpar_dp *dp);
/* Registers a gradient: an f32 array of dp's mesh, replicated over the axes.
   *id (may be NULL) gets its parameter id: 0, 1, 2, ... in registration
   order. Outside fn, before the first dpar_dp_begin / dpar_dp_allreduce.
   dp holds the array: keep it alive as long as dp (a step with a destroyed
   gradient fails in dpar_dp_begin with DPAR_ERR_STATE naming it, before any
   exchange). Errors: DPAR_ERR_INVALID_ARGUMENT (other mesh, split over dp's
   axes), DPAR_ERR_DTYPE (not f32), DPAR_ERR_STATE (buckets already formed). */
DPAR_API dpar_status dpar_dp_add(dpar_dp *dp, dpar_array *grad, int *id);
/* Number of buckets (forms them if not yet done); -1 for NULL. */
DPAR_API int dpar_dp_bucket_count(dpar_dp *dp);
/* Inside fn: starts a step on this device (no gradient ready yet). The step
   must be closed by dpar_dp_finish before fn returns: when fn returns DPAR_OK
   with the step still open, the dispatch (dpar_shard_map / dpar_pmap) fails
   with DPAR_ERR_STATE naming the device ("dpar_dp_begin ... without
   dpar_dp_finish"), never DPAR_OK with gradients left unreduced; a step left
   open by a failing fn is dropped.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, other mesh), DPAR_ERR_STATE (a
   step already begun in this dispatch). */
DPAR_API dpar_status dpar_dp_begin(dpar_dp *dp, dpar_ctx *ctx);
/* Inside fn: gradient `id` of this device is final. Launches every bucket
   that became complete, in bucket order (async unless desc.blocking).
   Errors: DPAR_ERR_INVALID_ARGUMENT (id out of range or already ready),
   DPAR_ERR_STATE (no dpar_dp_begin), and the collective's errors. */
DPAR_API dpar_status dpar_dp_grad_ready(dpar_dp *dp, dpar_ctx *ctx, int id);
/* Inside fn: launches the buckets not launched yet (their gradients are
   taken as final), waits for all, and writes the averaged (summed) values
   back into the gradient arrays' shards of this device.
   Errors: DPAR_ERR_STATE (no dpar_dp_begin in this dispatch), and the
   collectives' errors (the step is closed either way). */
DPAR_API dpar_status dpar_dp_finish(dpar_dp *dp, dpar_ctx *ctx);
/* Inside fn: dpar_dp_begin + dpar_dp_finish: all gradients at once. */
DPAR_API dpar_status dpar_dp_allreduce(dpar_dp *dp, dpar_ctx *ctx);

/* ZeRO-1 for SGD (Rajbhandari et al. 2020, "ZeRO", stage 1; llm.c): the
   optimizer state is sharded over the data-parallel axis. Each step, inside
   fn, every device
     1. reduce-scatters (psum_scatter, tiled) its local gradient of each
        parameter, flattened and zero-padded to a multiple of the axis size n,
        and scales its block by 1/n (the pmean of plain data parallelism),
     2. updates only its block of the parameter (an f32 master shard) and of
        the momentum with the fused SGD step (clipping by global norm psums the
        squared norms of the blocks over the axis),
     3. all_gathers (tiled) the updated blocks back into the full parameter.
   A parameter of L elements is padded to Lp = ceil(L / n) * n, so each device
   holds Lp / n elements of momentum and master parameter: optimizer memory
   per device falls by n. Padding is never dropped (no silent un-sharding).
   Data movement: a parameter whose L is a multiple of n moves only through
   the two collectives (its buffers are viewed flat, no copy); one that needs
   padding is staged into a per-device [Lp] buffer and copied back with
   dpar_buffer_write/read (a host round trip of L elements per step on GPU
   backends: small for biases, avoid it for large tensors by choosing sizes).
   Parameters must be f32 arrays replicated on the whole mesh (no dim split). */
typedef struct dpar_zero1 dpar_zero1;
typedef struct dpar_zero1_desc {
    dpar_sgd_desc sgd; /* optimizer; sgd.norm_axes is ignored (the axis is used) */
    const char *axis;  /* data-parallel axis or axes ("data" or "data,model"); NULL: "data" */
    int num_params;    /* 1..DPAR_MAX_ARGS */
    dpar_array *params[DPAR_MAX_ARGS];
} dpar_zero1_desc;
/* Creates the sharded state on the params' mesh: per parameter i a master
   array and (momentum > 0) a momentum array, both f32 [Lp_i] split over the
   axis, the master initialised from the parameter's current value (read from
   the host with dpar_array_get), the momentum zero. Outside fn.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, count out of range, params of
   different meshes, a split param), DPAR_ERR_DTYPE (not f32),
   DPAR_ERR_UNKNOWN_AXIS, the SGD desc checks, DPAR_ERR_OUT_OF_MEMORY. The
   state is attached to the params' mesh (dpar_handle_attach): destroying the
   mesh or its runtime frees it when it is left alive. The state holds the
   params: keep them alive as long as it (dpar_zero1_step and _reload refuse
   a destroyed param, or a destroyed master or momentum array, with
   DPAR_ERR_STATE naming it, before any collective or update). */
DPAR_API dpar_status dpar_zero1_create(const dpar_zero1_desc *desc, dpar_zero1 **out);
/* Frees the state (arrays included). NULL is a no-op (DPAR_OK). Errors
   (nothing is freed): DPAR_ERR_STATE for a stale z (destroyed, or freed with
   its mesh or runtime), inside fn, or while a call on its runtime runs on
   another thread. dpar_zero1_step and _reload refuse a stale z so. */
DPAR_API dpar_status dpar_zero1_destroy(dpar_zero1 *z);
/* One step, inside fn on every device of the mesh: grads[i] is this device's
   local (not yet averaged) f32 gradient of params[i], same element count; it
   is read only (reshaped for the call and restored). Afterwards every device
   holds the same updated parameters (bitwise). Errors: those of the
   collectives and of dpar_sgd_update; DPAR_ERR_SHAPE when a gradient's count
   differs from its parameter's. */
DPAR_API dpar_status dpar_zero1_step(dpar_ctx *ctx, dpar_zero1 *z, dpar_buffer *const *grads);
/* Re-initialises the master shards from the parameters' current values
   (after the parameters were changed from outside, e.g. restored). Outside fn. */
DPAR_API dpar_status dpar_zero1_reload(dpar_zero1 *z);
/* The state of parameter i as arrays f32 [Lp] split over the axis (for
   checkpoints: save them with padded = true). NULL when i is out of range
   (momentum: also when momentum == 0). */
DPAR_API dpar_array *dpar_zero1_master(const dpar_zero1 *z, int i);
DPAR_API dpar_array *dpar_zero1_momentum(const dpar_zero1 *z, int i);
/* Padded length Lp of parameter i; -1 when out of range. */
DPAR_API int64_t dpar_zero1_padded_count(const dpar_zero1 *z, int i);
/* Bytes of momentum that `device` holds (sum over parameters of its
   momentum shard buffers); 0 when the device is not in the mesh. */
DPAR_API size_t dpar_zero1_momentum_bytes(const dpar_zero1 *z, int device);

/* Checkpoints: named global arrays (parameters, optimizer state, sharded or
   not) in one file. Format version 1, little-endian:
     header  "DPARCKPT" | u32 version | u32 entry count | u64 file bytes | u64 step
     entry   u32 name bytes | name | u32 dtype | u32 ndim | u64 shape[ndim] |
             u32 flags (1 = padded) | u64 data bytes | data (the global array,
             row-major, as dpar_array_get gives it)
     trailer u32 CRC-32 (IEEE 802.3, reflected, poly 0xEDB88320; zlib's crc32)
             of every byte before it.
   The file stores global arrays, so a checkpoint restores onto any mesh and
   any spec (saved on 4 devices, restored on 2). */
typedef struct dpar_checkpoint_entry {
    const char *name; /* unique in the file, 1..255 bytes */
    dpar_array *array;
    bool padded; /* a 1-d array zero-padded at the end (ZeRO-1 state):
                    restore accepts a stored length that differs, as long
                    as every element beyond the shorter length is zero */
} dpar_checkpoint_entry;
#define DPAR_CHECKPOINT_VERSION 1
/* Saves `n` entries and a step counter to `path` atomically: written to a
   temporary "<path>.tmp.<pid>.<k>" created exclusively (k unique in the
   process), fsync'ed, renamed over `path`, and the directory fsync'ed, so a
   crash leaves either the old file or the new one, never a half-written one.
   Concurrent saves to one path (threads or processes) each succeed, and the
   file is whole: the last rename wins. Outside fn.
   Errors: DPAR_ERR_INVALID_ARGUMENT (NULL, bad or duplicate name),
   DPAR_ERR_STATE (an entry's array was destroyed: nothing is written),
   DPAR_ERR_IO (naming the path and the system error; the temporary is
   removed), DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_checkpoint_save(const char *path, const dpar_checkpoint_entry *entries, int n, uint64_t step);
/* Restores the `n` entries by name (entries of the file not asked for are
   skipped) and the step counter (*step, may be NULL). The whole file is
   checked before any array changes: on any error nothing was modified
   (unless the file changes during the restore: then the error says so).
   The file is untrusted input: only a regular file is read (a FIFO or a
   device is refused without reading), every length is checked against the
   file's size before use, and it is streamed: memory is a 64 KiB window,
   24 bytes per entry and the asked arrays, whatever the file claims.
   Errors: DPAR_ERR_IO for a missing, non-regular, truncated or corrupted
   file (a header field that disagrees with entries that fill the file, or
   with the CRC-32, is named as corrupt with the value read and the one
   expected; "truncated" only when the file ends before its entries do;
   bad magic, another format version, length differing from the header,
   CRC-32 mismatch, malformed entry: an entry count, name length, shape or
   data size the file cannot hold, element count x dtype size overflowing,
   unknown flags, two entries of one name; the text names the path and what
   is wrong);
   DPAR_ERR_INVALID_ARGUMENT (an asked name not in the file), DPAR_ERR_STATE
   (an entry's array was destroyed, checked first), DPAR_ERR_DTYPE,
   DPAR_ERR_SHAPE (stored and wanted shapes, both named), DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_checkpoint_restore(const char *path, const dpar_checkpoint_entry *entries, int n,
                                             uint64_t *step);
/* CRC-32 (as zlib crc32): crc = dpar_crc32(0, data, n), chainable. */
DPAR_API uint32_t dpar_crc32(uint32_t crc, const void *data, size_t n);

/* Graph checkpoints: a graph's whole training state (dpar_graph_state: every
   param, AdamW's m and v or SGD's momentum, sharded ones with their spec) and
   its step counter (dpar_graph_step) in one checkpoint file of the format
   above, written with dpar_checkpoint_save (atomic) and read with
   dpar_checkpoint_restore (untrusted input). Restoring into a freshly built
   graph of the same model and continuing gives the losses an uninterrupted
   run gives, bit for bit on one backend and mesh. The file holds global
   arrays, so it also restores onto another mesh (another device count or
   spec) as long as every global shape matches. Both compile the graph first
   if needed. Outside fn.
   dpar_graph_save errors: DPAR_ERR_INVALID_ARGUMENT (NULL, a param without a
   name or two params of one name, naming the nodes), DPAR_ERR_STATE (the
   graph's mesh was destroyed), those of dpar_checkpoint_save (DPAR_ERR_IO
   naming the path; the old file is then untouched). Texts start with
   "dpar_graph_save: ". */
DPAR_API dpar_status dpar_graph_save(dpar_graph *g, const char *path);
/* dpar_graph_save plus `n_extra` entries of the caller's in the same file
   (extra may be NULL when n_extra is 0): what a resume must check besides
   the state, e.g. the run's batch size, seed and optimizer as small arrays.
   dpar_graph_restore skips them; dpar_checkpoint_restore reads them back by
   name (DPAR_ERR_INVALID_ARGUMENT naming the entry when a file lacks it).
   Their names must differ from the state's ("w", "w@adamw.m", ...).
   Errors: as dpar_graph_save, and DPAR_ERR_INVALID_ARGUMENT for n_extra < 0
   or a name used twice (naming it). */
DPAR_API dpar_status dpar_graph_save_extra(dpar_graph *g, const char *path, const dpar_checkpoint_entry *extra,
                                           int n_extra);
/* Restores the training state and the step counter saved by dpar_graph_save.
   The whole file is checked against the graph before anything changes: on an
   error the graph's params, optimizer state and step are as they were.
   Errors (texts start with "dpar_graph_restore: "): DPAR_ERR_IO (a missing,
   non-regular, truncated or corrupted file, naming the path; a step counter
   above 2^63 - 1, which dpar never writes: then the arrays were restored but
   the step is kept), DPAR_ERR_INVALID_ARGUMENT (a param or optimizer state
   the file lacks, naming the entry: another model, or the other optimizer),
   DPAR_ERR_SHAPE (a param whose global shape differs: both shapes and the
   name), DPAR_ERR_DTYPE (naming the entry and both dtypes), DPAR_ERR_STATE,
   DPAR_ERR_OUT_OF_MEMORY. */
DPAR_API dpar_status dpar_graph_restore(dpar_graph *g, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* DPAR_TRAIN_H_INCLUDED */

/* ===========================================================================
   IMPLEMENTATION (with DPAR_IMPLEMENTATION or DPAR_TRAIN_IMPLEMENTATION)
   ======================================================================== */
#if (defined(DPAR_IMPLEMENTATION) || defined(DPAR_TRAIN_IMPLEMENTATION)) && !defined(DPAR_TRAIN_IMPLEMENTATION_DONE)
#define DPAR_TRAIN_IMPLEMENTATION_DONE
/* dpar.h's platform layer (DESIGN §9), when dpar.h was included before without it */
#include "../dpar.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef DPAR_MALLOC
#define DPAR_MALLOC(sz)     malloc(sz)
#define DPAR_FREE(p)        free(p)
#define DPAR_REALLOC(p, sz) realloc(p, sz)
#endif

/* >>train-common =============================================================
   Small helpers on the public API
   ======================================================================== */
enum { DPAR_TRAIN__ERR_LEN = 1024 }; /* dpar's last-error capacity */

static void dpar_train__clear_error(void) {
    (void)dpar_set_last_error(DPAR_OK, "%s", "");
}
/* Sets the last error to "<prefix>: <the last error>" and returns s. */
static dpar_status dpar_train__prefix_err(dpar_status s, const char *prefix, const char *text) {
    char saved[DPAR_TRAIN__ERR_LEN];
    snprintf(saved, sizeof saved, "%s", text);
    return dpar_set_last_error(s, "%s: %s", prefix, saved);
}
/* Runs cleanup-style code without losing the error text s was returned with. */
#define DPAR_TRAIN__KEEP_ERROR(stmt)                                                    \
    do {                                                                                \
        char dpar_train__saved[DPAR_TRAIN__ERR_LEN];                                    \
        snprintf(dpar_train__saved, sizeof dpar_train__saved, "%s", dpar_last_error()); \
        stmt;                                                                           \
        (void)dpar_set_last_error(DPAR_OK, "%s", dpar_train__saved);                    \
    } while (0)

/* The end of a destroy: when it succeeded (s == DPAR_OK) the last error goes
   back to saved, the text before the call (a cleanup never wipes the error the
   caller is about to print). */
static dpar_status dpar_train__destroyed(dpar_status s, const char *saved) {
    if (!s) (void)dpar_set_last_error(DPAR_OK, "%s", saved);
    return s;
}

static void *dpar_train__calloc(size_t n, size_t sz) {
    size_t total = n * sz;
    if (sz && total / sz != n) return NULL;
    void *p = DPAR_MALLOC(total ? total : 1);
    if (p) memset(p, 0, total ? total : 1);
    return p;
}
/* Whether array a (not NULL) was destroyed, or (uid not 0) is a new array at the address of the one whose
   dpar_array_uid was uid. The helpers check the arrays they hold before a call uses them, so a destroyed one is
   refused before anything is done. */
static int dpar_train__dead(const dpar_array *a, uint64_t uid) {
    if (!a) return 0;
    uint64_t now = dpar_array_uid(a); /* 0: a stale handle */
    return !now || (uid && now != uid);
}
/* The first of the arrays a[0..n) that dpar_train__dead finds (uid[i] recorded when a holder took a[i]; uid
   NULL: none recorded), or -1. */
static int dpar_train__first_dead(const dpar_array *const *a, const uint64_t *uid, int n) {
    for (int i = 0; i < n; i++)
        if (dpar_train__dead(a[i], uid ? uid[i] : 0)) return i;
    return -1;
}
static int64_t dpar_train__count(const dpar_array *a) { /* global elements */
    int64_t c = 1;
    for (int i = 0; i < dpar_array_ndim(a); i++) c *= dpar_array_dim(a, i);
    return c;
}
static int64_t dpar_train__shard_count(const dpar_array *a) { /* elements of each shard */
    int64_t c = 1;
    for (int i = 0; i < dpar_array_ndim(a); i++) c *= dpar_array_shard_dim(a, i);
    return c;
}
/* "[2, 3]" into buf */
static const char *dpar_train__shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, cap - at, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}
static const char *dpar_train__array_shape_str(char *buf, size_t cap, const dpar_array *a) {
    int64_t shape[DPAR_MAX_DIMS];
    for (int i = 0; i < dpar_array_ndim(a); i++) shape[i] = dpar_array_dim(a, i);
    return dpar_train__shape_str(buf, cap, dpar_array_ndim(a), shape);
}
/* Puts the last error, "<called function>: <text>", under `where` instead. */
static dpar_status dpar_train__reprefix(dpar_status s, const char *where) {
    if (!s) return DPAR_OK;
    const char *t = dpar_last_error(), *colon = strstr(t, ": ");
    return dpar_train__prefix_err(s, where, colon ? colon + 2 : t);
}
/* Devices spanned by `axes` of mesh m (dpar_mesh_axis_size), errors under `where`. */
static dpar_status dpar_train__axes_size(const dpar_mesh *m, const char *where, const char *axes, int *n) {
    return dpar_train__reprefix(dpar_mesh_axis_size(m, axes, n), where);
}
/* Is axis name [p, p+len) one of the names in the list "a,b" / "a b"? */
static int dpar_train__axis_listed(const char *list, const char *p, size_t len) {
    while (*list) {
        while (*list == ' ' || *list == ',') list++;
        const char *q = list;
        while (*q && *q != ',' && *q != ' ') q++;
        if ((size_t)(q - list) == len && len && !strncmp(list, p, len)) return 1;
        list = q;
    }
    return 0;
}
/* Is any dimension of a split over an axis named in `axes` (NULL: over any axis)? */
static dpar_status dpar_train__split_over(const dpar_array *a, const char *axes, int *split) {
    *split = 0;
    for (int d = 0; d < dpar_array_ndim(a); d++) {
        char spec[256];
        dpar_status s = dpar_array_spec(a, d, spec, sizeof spec);
        if (s) return s;
        if (!axes && spec[0]) *split = 1;
        for (const char *p = spec; axes && *p;) {
            while (*p == ',') p++;
            const char *q = p;
            while (*q && *q != ',') q++;
            if (dpar_train__axis_listed(axes, p, (size_t)(q - p))) *split = 1;
            p = q;
        }
    }
    return DPAR_OK;
}

/* >>train-dp =================================================================
   The data-parallel helper: buckets, launch in bucket order, wait and unpack
   ======================================================================== */
struct dpar_dp {
    dpar_mesh *mesh;
    char axes[128];
    int sum, blocking;
    int size;  /* devices in the mesh */
    int gsize; /* devices the axes span: 1 means nothing to exchange */
    dpar_dtype comm;
    size_t cap;
    dpar__mutex mu; /* forming the buckets */
    int formed;     /* atomic */
    int np, pcap;
    dpar_array **grads; /* [np] */
    uint64_t *grad_uid; /* [np] each gradient's dpar_array_uid when added */
    int *bucket_of;     /* [np] */
    int64_t *offset;    /* [np] element offset in its bucket */
    int nb;
    int64_t *bcount; /* [nb] elements */
    int *bparams;    /* [nb] parameters in the bucket */
    int *order;      /* [np] parameters in bucket order */
    int *bfirst;     /* [nb + 1] index into order */
    /* per mesh position */
    dpar_buffer **buf;    /* [size * nb] this device's bucket buffers (comm dtype), made on first use */
    dpar_request **req;   /* [size * nb] */
    unsigned char *ready; /* [size * np] */
    int *left;            /* [size * nb] */
    int *next;            /* [size] next bucket to launch */
    int *active;          /* [size] between begin and finish: the dispatch's tag */
};

static void dpar_dp__free(void *self);
DPAR_API dpar_status dpar_dp_create(dpar_mesh *m, const dpar_dp_desc *d, dpar_dp **out) {
    dpar_train__clear_error();
    if (!out) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_create: `out` is NULL");
    *out = NULL;
    if (!m) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_create: m is NULL");
    if (!d) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_create: desc is NULL");
    int gsize;
    dpar_status s = dpar_train__axes_size(m, "dpar_dp_create", d->axes, &gsize);
    if (s) return s;
    if (d->comm_dtype != DPAR_F32 && d->comm_dtype != DPAR_F16 && d->comm_dtype != DPAR_BF16)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_dp_create: comm_dtype %s; use DPAR_F32, DPAR_F16 or DPAR_BF16",
                                   dpar_dtype_name(d->comm_dtype));
    dpar_dp *dp = (dpar_dp *)dpar_train__calloc(1, sizeof *dp);
    if (!dp) return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_dp_create: out of host memory");
    dp->mesh = m;
    snprintf(dp->axes, sizeof dp->axes, "%s", d->axes);
    dp->sum = d->sum;
    dp->blocking = d->blocking;
    dp->comm = d->comm_dtype;
    dp->size = dpar_mesh_size(m);
    dp->gsize = gsize;
    dp->cap = d->bucket_bytes ? d->bucket_bytes : (size_t)25 << 20;
    dpar__mutex_init(&dp->mu);
    if ((s = dpar_handle_attach(m, dp, dpar_dp__free))) {
        DPAR_TRAIN__KEEP_ERROR(dpar_dp__free(dp));
        return s;
    }
    *out = dp;
    return DPAR_OK;
}
DPAR_API dpar_status dpar_dp_destroy(dpar_dp *dp) {
    if (!dp) return DPAR_OK;
    char saved[DPAR_TRAIN__ERR_LEN];
    snprintf(saved, sizeof saved, "%s", dpar_last_error());
    dpar_status s = dpar_handle_detach(dp, "dpar_dp_destroy");
    if (!s) dpar_dp__free(dp);
    return dpar_train__destroyed(s, saved);
}
/* Frees dp (detached: by dpar_dp_destroy, or by its mesh's destroy). */
static void dpar_dp__free(void *self) {
    dpar_dp *dp = (dpar_dp *)self;
    if (dp->buf)
        for (int i = 0; i < dp->size * dp->nb; i++) dpar_buffer_destroy(dp->buf[i]);
    DPAR_FREE(dp->grads);
    DPAR_FREE(dp->grad_uid);
    DPAR_FREE(dp->bucket_of);
    DPAR_FREE(dp->offset);
    DPAR_FREE(dp->bcount);
    DPAR_FREE(dp->bparams);
    DPAR_FREE(dp->order);
    DPAR_FREE(dp->bfirst);
    DPAR_FREE(dp->buf);
    DPAR_FREE(dp->req);
    DPAR_FREE(dp->ready);
    DPAR_FREE(dp->left);
    DPAR_FREE(dp->next);
    DPAR_FREE(dp->active);
    dpar__mutex_destroy(&dp->mu);
    DPAR_FREE(dp);
}
DPAR_API dpar_status dpar_dp_add(dpar_dp *dp, dpar_array *g, int *id) {
    dpar_train__clear_error();
    if (!dp) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_add: dp is NULL");
    if (!g) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_dp_add: grad is NULL");
    dpar_status hs = dpar_handle_check(dp, "dpar_dp_add");
    if (hs) return hs;
    if (dpar_train__dead(g, 0))
        return dpar_set_last_error(DPAR_ERR_STATE, "dpar_dp_add: grad is a stale array (destroyed); nothing was "
                                                   "added; register a live array");
    if (DPAR__ATOMIC_LOAD(&dp->formed))
        return dpar_set_last_error(
            DPAR_ERR_STATE, "dpar_dp_add: the buckets are formed (first step ran); register every gradient before");
    if (dpar_array_mesh(g) != dp->mesh)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_dp_add: the gradient array was created on another mesh");
    if (dpar_array_dtype(g) != DPAR_F32)
        return dpar_set_last_error(DPAR_ERR_DTYPE, "dpar_dp_add: the gradient is %s; gradients are f32",
                                   dpar_dtype_name(dpar_array_dtype(g)));
    int split;
    dpar_status s = dpar_train__split_over(g, dp->axes, &split);
    if (s) return s;
    if (split)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_dp_add: the gradient is split over axes '%s' that the replicas span; "
                                   "register replicated gradients",
                                   dp->axes);
    if (dp->np == dp->pcap) {
        int nc = dp->pcap ? 2 * dp->pcap : 16;
        dpar_array **ng = (dpar_array **)DPAR_REALLOC(dp->grads, (size_t)nc * sizeof *ng);
        if (ng) dp->grads = ng;
        uint64_t *nu = ng ? (uint64_t *)DPAR_REALLOC(dp->grad_uid, (size_t)nc * sizeof *nu) : NULL;
        if (!nu) return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_dp_add: out of host memory");
        dp->grad_uid = nu;
        dp->pcap = nc;
    }
    if (id) *id = dp->np;
    dp->grad_uid[dp->np] = dpar_array_uid(g);
    dp->grads[dp->np++] = g;
    return DPAR_OK;
}
/* Assigns parameters to buckets in reverse registration order (locked, once). */
static dpar_status dpar_dp__assign(dpar_dp *dp) {
    int np = dp->np;
    size_t es = dpar_dtype_size(dp->comm);
    dp->bucket_of = (int *)dpar_train__calloc((size_t)(np ? np : 1), sizeof(int));
    dp->offset = (int64_t *)dpar_train__calloc((size_t)(np ? np : 1), sizeof(int64_t));
    dp->order = (int *)dpar_train__calloc((size_t)(np ? np : 1), sizeof(int));
    dp->bcount = (int64_t *)dpar_train__calloc((size_t)(np ? np : 1), sizeof(int64_t));
    dp->bparams = (int *)dpar_train__calloc((size_t)(np ? np : 1), sizeof(int));
    dp->bfirst = (int *)dpar_train__calloc((size_t)np + 1, sizeof(int));
    if (!dp->bucket_of || !dp->offset || !dp->order || !dp->bcount || !dp->bparams || !dp->bfirst)
        return DPAR_ERR_OUT_OF_MEMORY;
    int nb = 0;
    for (int k = 0; k < np; k++) {
        int p = np - 1 - k;
        int64_t cnt = dpar_train__shard_count(dp->grads[p]);
        if (nb == 0 || (dp->bcount[nb - 1] > 0 && (size_t)(dp->bcount[nb - 1] + cnt) * es > dp->cap)) {
            dp->bfirst[nb] = k;
            nb++;
        }
        dp->bucket_of[p] = nb - 1;
        dp->offset[p] = dp->bcount[nb - 1];
        dp->bcount[nb - 1] += cnt;
        dp->bparams[nb - 1]++;
        dp->order[k] = p;
    }
    dp->nb = nb;
    dp->bfirst[nb] = np;
    size_t cells = (size_t)dp->size * (size_t)(nb ? nb : 1);
    dp->buf = (dpar_buffer **)dpar_train__calloc(cells, sizeof(dpar_buffer *));
    dp->req = (dpar_request **)dpar_train__calloc(cells, sizeof(dpar_request *));
    dp->left = (int *)dpar_train__calloc(cells, sizeof(int));
    dp->ready = (unsigned char *)dpar_train__calloc((size_t)dp->size * (size_t)(np ? np : 1), 1);
    dp->next = (int *)dpar_train__calloc((size_t)dp->size, sizeof(int));
    dp->active = (int *)dpar_train__calloc((size_t)dp->size, sizeof(int));
    if (!dp->buf || !dp->req || !dp->left || !dp->ready || !dp->next || !dp->active) return DPAR_ERR_OUT_OF_MEMORY;
    return DPAR_OK;
}
/* DPAR_OK when every registered gradient is live, else DPAR_ERR_STATE naming the first destroyed one. */
static dpar_status dpar_dp__grads_live(const dpar_dp *dp, const char *where) {
    int p = dpar_train__first_dead((const dpar_array *const *)dp->grads, dp->grad_uid, dp->np);
    if (p < 0) return DPAR_OK;
    return dpar_set_last_error(DPAR_ERR_STATE,
                               "%s: gradient %d (dpar_dp_add): its array was destroyed while the helper holds it; "
                               "nothing was done; destroy the helper (dpar_dp_destroy) before its gradients, or keep "
                               "them alive as long as the helper",
                               where, p);
}
/* Forms the buckets at the first use, once for every device. */
static dpar_status dpar_dp__form(dpar_dp *dp) {
    if (DPAR__ATOMIC_LOAD(&dp->formed)) return DPAR_OK;
    dpar__mutex_lock(&dp->mu);
    dpar_status s = DPAR_OK;
    if (!dp->formed) {
        s = dpar_dp__assign(dp);
        if (!s) DPAR__ATOMIC_STORE(&dp->formed, 1);
    }
    dpar__mutex_unlock(&dp->mu);
    if (s) return dpar_set_last_error(s, "dpar_dp: out of host memory forming the buckets");
    return DPAR_OK;
}
DPAR_API int dpar_dp_bucket_count(dpar_dp *dp) {
    if (!dp || dpar_handle_check(dp, "dpar_dp_bucket_count") || dpar_dp__grads_live(dp, "dpar_dp_bucket_count") ||
        dpar_dp__form(dp))
        return -1;
    return dp->nb;
}

/* n f32 values at x -> comm dtype at b, or back (to_bucket = 0) */
static void dpar_dp__convert(dpar_dtype comm, float *x, void *b, int64_t n, int to_bucket) {
    uint16_t *h = (uint16_t *)b;
    if (comm == DPAR_F32)
        memcpy(to_bucket ? b : (void *)x, to_bucket ? (const void *)x : b, (size_t)n * 4);
    else if (comm == DPAR_F16 && to_bucket)
        dpar_f32_to_f16_n(h, x, n);
    else if (comm == DPAR_F16)
        dpar_f16_to_f32_n(x, h, n);
    else if (to_bucket)
        for (int64_t i = 0; i < n; i++) h[i] = dpar_f32_to_bf16(x[i]);
    else
        for (int64_t i = 0; i < n; i++) x[i] = dpar_bf16_to_f32(h[i]);
}
/* Copies gradient <-> bucket range (casting f32 <-> comm dtype) through host
   views: in place where the backend maps its memory (dpar_buffer_map), else
   staged through dpar_buffer_read / dpar_buffer_write. */
static dpar_status dpar_dp__xfer(dpar_dp *dp, dpar_buffer *grad, dpar_buffer *bucket, int64_t off, int to_bucket) {
    int64_t n = dpar_buffer_count(grad);
    size_t es = dpar_dtype_size(dp->comm), gbytes = (size_t)n * 4, bbytes = (size_t)n * es, boff = (size_t)off * es;
    if (n == 0) return DPAR_OK;
    void *gv = NULL, *bv = NULL;
    /* the side read from is mapped for reading (waits for the device), the other for writing */
    dpar_status s = dpar_buffer_map(grad, 0, gbytes, to_bucket, &gv);
    if (!s) s = dpar_buffer_map(bucket, boff, bbytes, !to_bucket, &bv);
    if (s) return s;
    char *g = (char *)gv, *b = (char *)bv, *gtmp = NULL, *btmp = NULL;
    if (!g) {
        gtmp = (char *)DPAR_MALLOC(gbytes);
        g = gtmp;
    }
    if (!b) {
        btmp = (char *)DPAR_MALLOC(bbytes);
        b = btmp;
    }
    if (!g || !b) {
        DPAR_FREE(gtmp);
        DPAR_FREE(btmp);
        return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_dp: out of host memory for staging");
    }
    if (to_bucket) {
        if (gtmp) s = dpar_buffer_read(grad, 0, g, gbytes);
        if (!s) dpar_dp__convert(dp->comm, (float *)g, b, n, 1);
        if (!s) s = btmp ? dpar_buffer_write(bucket, boff, b, bbytes) : dpar_buffer_unmap(bucket, boff, bbytes, true);
    } else {
        if (btmp) s = dpar_buffer_read(bucket, boff, b, bbytes);
        if (!s) dpar_dp__convert(dp->comm, (float *)g, b, n, 0);
        if (!s) s = gtmp ? dpar_buffer_write(grad, 0, g, gbytes) : dpar_buffer_unmap(grad, 0, gbytes, true);
    }
    DPAR_FREE(gtmp);
    DPAR_FREE(btmp);
    return s;
}

static dpar_status dpar_dp__launch(dpar_dp *dp, dpar_ctx *ctx, int b) {
    int pos = dpar_ctx_position(ctx), nb = dp->nb, dev = dpar_ctx_device(ctx);
    dpar_buffer **bb = &dp->buf[(size_t)pos * (size_t)nb + (size_t)b];
    dpar_status s;
    if (!*bb) {
        int64_t c = dp->bcount[b];
        if ((s = dpar_buffer_create(dpar_ctx_runtime(ctx), dev, dp->comm, 1, &c, bb))) return s;
    }
    double t0 = dpar_trace_active() ? dpar_trace_clock_us() : 0.0;
    for (int k = dp->bfirst[b]; k < dp->bfirst[b + 1]; k++) {
        int p = dp->order[k];
        dpar_buffer *g = dpar_array_shard(dp->grads[p], dev);
        if (!g)
            return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_dp: gradient %d has no shard on device %d", p,
                                       dev);
        if ((s = dpar_dp__xfer(dp, g, *bb, dp->offset[p], 1))) return s;
    }
    if (t0 > 0.0)
        dpar_trace_event(dpar_ctx_runtime(ctx), dev, "dp_pack", "staging", t0, dpar_trace_clock_us(),
                         (int64_t)dpar_buffer_nbytes(*bb));
    dpar_reduce_op op = dp->sum ? DPAR_SUM : DPAR_MEAN;
    /* small buckets inline: handing them to the comm thread (two thread
       wake-ups, 10-40 us) costs more than their whole all-reduce */
    if (dp->blocking || dpar_buffer_nbytes(*bb) < ((size_t)256 << 10)) return dpar_preduce(ctx, *bb, *bb, dp->axes, op);
    return dpar_preduce_start(ctx, *bb, *bb, dp->axes, op, &dp->req[(size_t)pos * (size_t)nb + (size_t)b]);
}
/* The checks of a step's calls; grads: also that the gradients are live (dpar_dp_begin: a step's first call, and
   no destroy runs during the dispatch). */
static dpar_status dpar_dp__check(dpar_dp *dp, dpar_ctx *ctx, const char *where, int grads) {
    if (!dp) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: dp is NULL", where);
    if (!ctx)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "%s: ctx is NULL (call it inside the pmap/shard_map function)", where);
    dpar_status s = dpar_handle_check(dp, where); /* a compare once checked in this dispatch */
    if (s) return s;
    if (!dpar_ctx_mesh(ctx))
        return dpar_set_last_error(DPAR_ERR_STATE, "%s: the ctx is not the current one of this thread", where);
    if (dpar_ctx_mesh(ctx) != dp->mesh)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: the helper was made for another mesh", where);
    if (grads && (s = dpar_dp__grads_live(dp, where))) return s;
    return dpar_dp__form(dp);
}
/* Tag of ctx's dispatch: a step is open in that dispatch only. */
static int dpar_dp__job(const dpar_ctx *ctx) {
    return (int)(dpar_ctx_dispatch_id(ctx) & 0x3fffffff) + 1;
}

/* When fn returns (dpar_ctx_at_exit): a step begun and not finished is closed;
   an error when fn succeeded, so the dispatch never reports DPAR_OK with this
   device's gradients unreduced. Its async requests are freed by the worker. */
static dpar_status dpar_dp__at_exit(dpar_ctx *ctx, void *obj, dpar_status fn_status) {
    dpar_dp *dp = (dpar_dp *)obj;
    int pos = dpar_ctx_position(ctx);
    if (dp->active[pos] != dpar_dp__job(ctx)) return DPAR_OK; /* finished */
    dp->active[pos] = 0;
    for (int b = 0; b < dp->nb; b++) dp->req[(size_t)pos * (size_t)dp->nb + (size_t)b] = NULL;
    if (fn_status) return DPAR_OK; /* the dispatch fails anyway: the step is dropped */
    return dpar_set_last_error(DPAR_ERR_STATE,
                               "dpar_dp_begin: device %d began a data-parallel step and fn returned without "
                               "dpar_dp_finish, so its gradients were not reduced (the replicas would diverge); "
                               "call dpar_dp_finish (or use dpar_dp_allreduce) before fn returns",
                               dpar_ctx_device(ctx));
}
DPAR_API dpar_status dpar_dp_begin(dpar_dp *dp, dpar_ctx *ctx) {
    dpar_train__clear_error();
    dpar_status s = dpar_dp__check(dp, ctx, "dpar_dp_begin", 1);
    if (s) return s;
    int pos = dpar_ctx_position(ctx), job = dpar_dp__job(ctx);
    if (dp->active[pos] == job)
        return dpar_set_last_error(DPAR_ERR_STATE,
                                   "dpar_dp_begin: device %d already began a step; call dpar_dp_finish first",
                                   dpar_ctx_device(ctx));
    /* a step left open by a failed dispatch is dropped: its async requests were freed when that dispatch ended */
    for (int b = 0; b < dp->nb; b++) dp->req[(size_t)pos * (size_t)dp->nb + (size_t)b] = NULL;
    memset(dp->ready + (size_t)pos * (size_t)dp->np, 0, (size_t)dp->np);
    for (int b = 0; b < dp->nb; b++) dp->left[(size_t)pos * (size_t)dp->nb + (size_t)b] = dp->bparams[b];
    dp->next[pos] = 0;
    dp->active[pos] = job;
    return dpar_ctx_at_exit(ctx, dpar_dp__at_exit, dp);
}
/* Launches, in bucket order, every bucket whose gradients are all ready. */
static dpar_status dpar_dp__advance(dpar_dp *dp, dpar_ctx *ctx) {
    int pos = dpar_ctx_position(ctx);
    if (dp->gsize == 1) {
        dp->next[pos] = dp->nb;
        return DPAR_OK;
    } /* the mean / sum over one device is the gradient */
    while (dp->next[pos] < dp->nb && dp->left[(size_t)pos * (size_t)dp->nb + (size_t)dp->next[pos]] == 0) {
        dpar_status s = dpar_dp__launch(dp, ctx, dp->next[pos]);
        dp->next[pos]++;
        if (s) return s;
    }
    return DPAR_OK;
}
DPAR_API dpar_status dpar_dp_grad_ready(dpar_dp *dp, dpar_ctx *ctx, int id) {
    dpar_train__clear_error();
    dpar_status s = dpar_dp__check(dp, ctx, "dpar_dp_grad_ready", 0);
    if (s) return s;
    int pos = dpar_ctx_position(ctx);
    if (dp->active[pos] != dpar_dp__job(ctx))
        return dpar_set_last_error(
            DPAR_ERR_STATE, "dpar_dp_grad_ready: no step begun on device %d in this dispatch; call dpar_dp_begin first",
            dpar_ctx_device(ctx));
    if (id < 0 || id >= dp->np)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_dp_grad_ready: parameter id %d is out of range 0..%d", id, dp->np - 1);
    unsigned char *r = &dp->ready[(size_t)pos * (size_t)dp->np + (size_t)id];
    if (*r)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_dp_grad_ready: parameter %d was already marked ready in this step", id);
    *r = 1;
    dp->left[(size_t)pos * (size_t)dp->nb + (size_t)dp->bucket_of[id]]--;
    return dpar_dp__advance(dp, ctx);
}
/* Waits for bucket b of this device and copies it back into the gradients;
   the first error's text goes to msg. */
static dpar_status dpar_dp__complete(dpar_dp *dp, dpar_ctx *ctx, int b, dpar_status s, char *msg, size_t cap) {
    int pos = dpar_ctx_position(ctx), nb = dp->nb, dev = dpar_ctx_device(ctx);
    dpar_runtime *rt = dpar_ctx_runtime(ctx);
    dpar_request **rq = &dp->req[(size_t)pos * (size_t)nb + (size_t)b];
    if (*rq) {
        double t0 = dpar_trace_active() ? dpar_trace_clock_us() : 0.0;
        dpar_status w = dpar_wait(ctx, *rq);
        *rq = NULL;
        if (t0 > 0.0) dpar_trace_event(rt, dev, "dp_wait", "wait", t0, dpar_trace_clock_us(), -1);
        if (w && !s) {
            s = w;
            snprintf(msg, cap, "%s", dpar_last_error());
        }
    }
    if (s || dp->gsize == 1) return s;
    double t0 = dpar_trace_active() ? dpar_trace_clock_us() : 0.0;
    dpar_buffer *bb = dp->buf[(size_t)pos * (size_t)nb + (size_t)b];
    for (int k = dp->bfirst[b]; k < dp->bfirst[b + 1] && !s; k++) {
        int p = dp->order[k];
        s = dpar_dp__xfer(dp, dpar_array_shard(dp->grads[p], dev), bb, dp->offset[p], 0);
        if (s) snprintf(msg, cap, "%s", dpar_last_error());
    }
    if (t0 > 0.0)
        dpar_trace_event(rt, dev, "dp_unpack", "staging", t0, dpar_trace_clock_us(),
                         bb ? (int64_t)dpar_buffer_nbytes(bb) : 0);
    return s;
}
DPAR_API dpar_status dpar_dp_finish(dpar_dp *dp, dpar_ctx *ctx) {
    dpar_train__clear_error();
    dpar_status s = dpar_dp__check(dp, ctx, "dpar_dp_finish", 0);
    if (s) return s;
    int pos = dpar_ctx_position(ctx), nb = dp->nb;
    if (dp->active[pos] != dpar_dp__job(ctx))
        return dpar_set_last_error(
            DPAR_ERR_STATE, "dpar_dp_finish: no step begun on device %d in this dispatch; call dpar_dp_begin first",
            dpar_ctx_device(ctx));
    for (int b = dp->next[pos]; b < nb; b++) dp->left[(size_t)pos * (size_t)nb + (size_t)b] = 0;
    s = dpar_dp__advance(dp, ctx);
    char msg[DPAR_TRAIN__ERR_LEN];
    msg[0] = 0;
    if (s) snprintf(msg, sizeof msg, "%s", dpar_last_error());
    for (int b = 0; b < nb; b++) s = dpar_dp__complete(dp, ctx, b, s, msg, sizeof msg);
    dp->active[pos] = 0;
    if (s) return dpar_set_last_error(s, "%s", msg);
    return DPAR_OK;
}
DPAR_API dpar_status dpar_dp_allreduce(dpar_dp *dp, dpar_ctx *ctx) {
    dpar_status s = dpar_dp_begin(dp, ctx);
    return s ? s : dpar_dp_finish(dp, ctx);
}

/* >>train-zero1 ==============================================================
   ZeRO-1: reduce-scatter the gradients, update the local shard, all-gather
   ======================================================================== */
struct dpar_zero1 {
    dpar_mesh *mesh;
    dpar_sgd_desc sgd;
    char axis[128];
    int n, np;
    dpar_array *params[DPAR_MAX_ARGS];
    uint64_t param_uid[DPAR_MAX_ARGS]; /* each param's dpar_array_uid at create */
    int64_t count[DPAR_MAX_ARGS], padded[DPAR_MAX_ARGS];
    dpar_array *master[DPAR_MAX_ARGS], *mom[DPAR_MAX_ARGS];
    dpar_array *gshard[DPAR_MAX_ARGS]; /* [Lp] split: this device's reduced gradient block */
    dpar_array *pad[DPAR_MAX_ARGS];    /* [n * Lp] split: a per-device [Lp] staging buffer, when L % n != 0 */
};

/* dst[doff..] = src[soff..], nbytes, one device, through the host (any backend) */
static dpar_status dpar_zero1__region_copy(dpar_buffer *dst, size_t doff, const dpar_buffer *src, size_t soff,
                                           size_t nbytes) {
    if (!nbytes) return DPAR_OK;
    void *t = DPAR_MALLOC(nbytes);
    if (!t) return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "zero1: out of host memory (%zu bytes)", nbytes);
    dpar_status s = dpar_buffer_read(src, soff, t, nbytes);
    if (!s) s = dpar_buffer_write(dst, doff, t, nbytes);
    DPAR_FREE(t);
    return s;
}

static void dpar_zero1__free(void *self);
DPAR_API dpar_status dpar_zero1_destroy(dpar_zero1 *z) {
    if (!z) return DPAR_OK;
    char saved[DPAR_TRAIN__ERR_LEN];
    snprintf(saved, sizeof saved, "%s", dpar_last_error());
    dpar_status s = dpar_handle_detach(z, "dpar_zero1_destroy");
    if (!s) dpar_zero1__free(z);
    return dpar_train__destroyed(s, saved);
}
/* Frees z (detached: by dpar_zero1_destroy, or by its mesh's destroy). */
static void dpar_zero1__free(void *self) {
    dpar_zero1 *z = (dpar_zero1 *)self;
    for (int i = 0; i < z->np; i++) {
        dpar_array_destroy(z->master[i]);
        dpar_array_destroy(z->mom[i]);
        dpar_array_destroy(z->gshard[i]);
        dpar_array_destroy(z->pad[i]);
    }
    DPAR_FREE(z);
}

/* DPAR_OK when the params and z's own arrays are live, else DPAR_ERR_STATE naming the first destroyed one. */
static dpar_status dpar_zero1__live(const dpar_zero1 *z, const char *where) {
    int dead = dpar_train__first_dead((const dpar_array *const *)z->params, z->param_uid, z->np);
    if (dead >= 0)
        return dpar_set_last_error(DPAR_ERR_STATE,
                                   "%s: params[%d]: its array was destroyed while the ZeRO-1 state holds it; nothing "
                                   "was done; destroy the state (dpar_zero1_destroy) before its params, or keep them "
                                   "alive as long as the state",
                                   where, dead);
    for (int i = 0; i < z->np; i++) {
        const dpar_array *own[4] = { z->master[i], z->mom[i], z->gshard[i], z->pad[i] };
        int k = dpar_train__first_dead(own, NULL, 4);
        if (k >= 0)
            return dpar_set_last_error(DPAR_ERR_STATE,
                                       "%s: the %s of params[%d], which the ZeRO-1 state owns, was destroyed; "
                                       "nothing was done; never destroy what dpar_zero1_master / "
                                       "dpar_zero1_momentum hand out: dpar_zero1_destroy frees it",
                                       where,
                                       k == 0   ? "master copy"
                                       : k == 1 ? "momentum"
                                                : "staging array",
                                       i);
    }
    return DPAR_OK;
}
DPAR_API dpar_status dpar_zero1_reload(dpar_zero1 *z) {
    dpar_train__clear_error();
    if (!z) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_reload: z is NULL");
    dpar_status hs = dpar_handle_check(z, "dpar_zero1_reload");
    if (hs) return hs;
    if (dpar_in_dispatch())
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_zero1_reload: called from inside a pmap/shard_map function");
    dpar_status s = dpar_zero1__live(z, "dpar_zero1_reload");
    for (int i = 0; i < z->np && !s; i++) {
        float *h = (float *)dpar_train__calloc((size_t)z->padded[i], sizeof(float));
        if (!h) return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_zero1_reload: out of host memory");
        s = dpar_array_get(z->params[i], h);
        if (!s) s = dpar_array_put(z->master[i], h);
        DPAR_FREE(h);
    }
    return s;
}

/* The checks of dpar_zero1_create on the desc and its parameters. */
static dpar_status dpar_zero1__check(const dpar_zero1_desc *d, const char *axis, int *n) {
    if (d->num_params < 1 || d->num_params > DPAR_MAX_ARGS)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_zero1_create: num_params = %d is out of range 1..%d", d->num_params,
                                   (int)DPAR_MAX_ARGS);
    dpar_status s = dpar_train__reprefix(dpar_sgd_check(&d->sgd), "dpar_zero1_create");
    if (s) return s;
    if (!d->params[0]) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_create: params[0] is NULL");
    dpar_mesh *m = dpar_array_mesh(d->params[0]);
    if ((s = dpar_train__axes_size(m, "zero1_create", axis, n))) return s;
    if (strlen(axis) >= sizeof((dpar_zero1 *)0)->axis)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_create: axis string is too long");
    for (int i = 0; i < d->num_params; i++) {
        const dpar_array *p = d->params[i];
        int split;
        if (!p) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_create: params[%d] is NULL", i);
        if (dpar_array_mesh(p) != m)
            return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                       "dpar_zero1_create: params[%d] lives on another mesh than params[0]", i);
        if (dpar_array_dtype(p) != DPAR_F32)
            return dpar_set_last_error(DPAR_ERR_DTYPE,
                                       "dpar_zero1_create: params[%d] is %s; ZeRO-1 keeps f32 parameters", i,
                                       dpar_dtype_name(dpar_array_dtype(p)));
        if ((s = dpar_train__split_over(p, NULL, &split))) return s;
        if (split)
            return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                       "dpar_zero1_create: params[%d] is split over mesh axes; ZeRO-1 shards "
                                       "replicated parameters (give it a spec of all NULL)",
                                       i);
    }
    return DPAR_OK;
}

DPAR_API dpar_status dpar_zero1_create(const dpar_zero1_desc *d, dpar_zero1 **out) {
    dpar_train__clear_error();
    if (!out) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_create: `out` is NULL");
    *out = NULL;
    if (!d) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_create: desc is NULL");
    const char *axis = d->axis ? d->axis : "data";
    int n;
    dpar_status s = dpar_zero1__check(d, axis, &n);
    if (s) return s;
    dpar_mesh *m = dpar_array_mesh(d->params[0]);
    dpar_zero1 *z = (dpar_zero1 *)dpar_train__calloc(1, sizeof *z);
    if (!z) return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_zero1_create: out of host memory");
    z->mesh = m;
    z->sgd = d->sgd;
    z->sgd.norm_axes = NULL;
    snprintf(z->axis, sizeof z->axis, "%s", axis);
    z->n = n;
    z->np = 0; /* counts the parameters whose state exists, for dpar_zero1__free */
    if ((s = dpar_handle_attach(m, z, dpar_zero1__free))) {
        DPAR_FREE(z);
        return s;
    }
    for (int i = 0; i < d->num_params && !s; i++, z->np++) {
        z->params[i] = d->params[i];
        z->param_uid[i] = dpar_array_uid(d->params[i]);
        z->count[i] = dpar_train__count(d->params[i]);
        z->padded[i] = (z->count[i] + z->n - 1) / z->n * z->n;
        dpar_array_desc ad;
        memset(&ad, 0, sizeof ad);
        ad.dtype = DPAR_F32;
        ad.ndim = 1;
        ad.shape[0] = z->padded[i];
        ad.spec[0] = z->axis;
        s = dpar_array_create(m, &ad, &z->master[i]);
        if (!s) s = dpar_array_create(m, &ad, &z->gshard[i]);
        if (!s && d->sgd.momentum > 0.0f) s = dpar_array_create(m, &ad, &z->mom[i]);
        if (!s && z->padded[i] != z->count[i]) {
            ad.shape[0] = z->padded[i] * z->n;
            s = dpar_array_create(m, &ad, &z->pad[i]);
        }
    }
    if (!s) s = dpar_zero1_reload(z);
    if (s) {
        DPAR_TRAIN__KEEP_ERROR((void)dpar_zero1_destroy(z));
        return s;
    }
    *out = z;
    return DPAR_OK;
}

/* Runs a collective on buffer b viewed flat (1-d), restoring its shape. */
typedef dpar_status (*dpar_zero1__flat_fn)(dpar_ctx *ctx, dpar_buffer *out, const dpar_buffer *in, const char *axes,
                                           int dim, bool tiled);
static dpar_status dpar_zero1__flat(dpar_ctx *ctx, dpar_zero1__flat_fn fn, dpar_buffer *out, dpar_buffer *in,
                                    dpar_buffer *b, const char *axes) {
    int nd = dpar_buffer_ndim(b);
    int64_t shape[DPAR_MAX_DIMS], flat = dpar_buffer_count(b);
    for (int k = 0; k < nd; k++) shape[k] = dpar_buffer_dim(b, k);
    dpar_status s = dpar_buffer_reshape(b, 1, &flat);
    if (!s) s = fn(ctx, out, in, axes, 0, true);
    dpar_status s2 = dpar_buffer_reshape(b, nd, shape);
    return s ? s : s2;
}
/* 1. reduce-scatter the gradient of parameter i into gs, then the mean */
static dpar_status dpar_zero1__scatter(dpar_ctx *ctx, dpar_zero1 *z, int i, dpar_buffer *g, dpar_buffer *gs) {
    int dev = dpar_ctx_device(ctx);
    dpar_status s;
    if (!g) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_step: grads[%d] is NULL", i);
    if (dpar_buffer_dtype(g) != DPAR_F32)
        return dpar_set_last_error(DPAR_ERR_DTYPE, "dpar_zero1_step: grads[%d] is %s; it must be f32", i,
                                   dpar_dtype_name(dpar_buffer_dtype(g)));
    if (dpar_buffer_device(g) != dev)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_zero1_step: grads[%d] lives on device %d, not on this device %d", i,
                                   dpar_buffer_device(g), dev);
    if (dpar_buffer_count(g) != z->count[i])
        return dpar_set_last_error(DPAR_ERR_SHAPE,
                                   "dpar_zero1_step: grads[%d] has %lld elements but its parameter has %lld", i,
                                   (long long)dpar_buffer_count(g), (long long)z->count[i]);
    if (z->pad[i]) {
        dpar_buffer *pb = dpar_array_shard(z->pad[i], dev);
        s = dpar_zero1__region_copy(pb, 0, g, 0, (size_t)z->count[i] * 4);
        if (!s) s = dpar_psum_scatter(ctx, gs, pb, z->axis, 0, true);
    } else {
        s = dpar_zero1__flat(ctx, dpar_psum_scatter, gs, g, g, z->axis);
    }
    if (!s && z->n > 1) s = dpar_scale(gs, 1.0f / (float)z->n);
    return s;
}
/* 3. all-gather the updated blocks of parameter i back into it */
static dpar_status dpar_zero1__gather(dpar_ctx *ctx, dpar_zero1 *z, int i) {
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *p = dpar_array_shard(z->params[i], dev), *ms = dpar_array_shard(z->master[i], dev);
    if (!z->pad[i]) return dpar_zero1__flat(ctx, dpar_all_gather, p, ms, p, z->axis);
    dpar_buffer *pb = dpar_array_shard(z->pad[i], dev);
    dpar_status s = dpar_all_gather(ctx, pb, ms, z->axis, 0, true);
    if (!s) s = dpar_zero1__region_copy(p, 0, pb, 0, (size_t)z->count[i] * 4);
    return s;
}

DPAR_API dpar_status dpar_zero1_step(dpar_ctx *ctx, dpar_zero1 *z, dpar_buffer *const *grads) {
    dpar_train__clear_error();
    if (!ctx)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_zero1_step: ctx is NULL (call it inside the pmap/shard_map function)");
    if (!z) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_step: z is NULL");
    if (!grads) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_zero1_step: grads is NULL");
    dpar_status hs = dpar_handle_check(z, "dpar_zero1_step"); /* a compare once checked in this dispatch */
    if (hs) return hs;
    if (dpar_ctx_mesh(ctx) != z->mesh)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_zero1_step: called in a dispatch over another mesh than the parameters'");
    int dev = dpar_ctx_device(ctx);
    dpar_status s = dpar_zero1__live(z, "dpar_zero1_step"); /* on every device alike: before any collective */
    dpar_buffer *gs[DPAR_MAX_ARGS];
    for (int i = 0; i < z->np && !s; i++) { /* 1. reduce-scatter, mean */
        gs[i] = dpar_array_shard(z->gshard[i], dev);
        s = dpar_zero1__scatter(ctx, z, i, grads[i], gs[i]);
    }
    if (s) return s;
    float scale = 1.0f; /* 2. update this device's block */
    if (z->sgd.clip_norm > 0.0f) {
        dpar_sgd_desc sd = z->sgd;
        sd.norm_axes = z->axis;
        if ((s = dpar_sgd_clip_scale(ctx, &sd, gs, z->np, &scale, NULL))) return s;
    }
    for (int i = 0; i < z->np && !s; i++)
        s = dpar_sgd_update(&z->sgd, dpar_array_shard(z->master[i], dev), gs[i],
                            z->mom[i] ? dpar_array_shard(z->mom[i], dev) : NULL, scale);
    for (int i = 0; i < z->np && !s; i++) s = dpar_zero1__gather(ctx, z, i); /* 3. all-gather */
    return s;
}
DPAR_API dpar_array *dpar_zero1_master(const dpar_zero1 *z, int i) {
    return (z && !dpar_handle_check(z, "dpar_zero1_master") && i >= 0 && i < z->np) ? z->master[i] : NULL;
}
DPAR_API dpar_array *dpar_zero1_momentum(const dpar_zero1 *z, int i) {
    return (z && !dpar_handle_check(z, "dpar_zero1_momentum") && i >= 0 && i < z->np) ? z->mom[i] : NULL;
}
DPAR_API int64_t dpar_zero1_padded_count(const dpar_zero1 *z, int i) {
    return (z && !dpar_handle_check(z, "dpar_zero1_padded_count") && i >= 0 && i < z->np) ? z->padded[i] : -1;
}
DPAR_API size_t dpar_zero1_momentum_bytes(const dpar_zero1 *z, int device) {
    size_t t = 0;
    if (!z || dpar_handle_check(z, "dpar_zero1_momentum_bytes")) return 0;
    for (int i = 0; i < z->np; i++)
        if (z->mom[i]) t += dpar_buffer_nbytes(dpar_array_shard(z->mom[i], device));
    return t;
}

/* >>train-checkpoints ========================================================
   CRC-32, save (atomic: temporary, fsync, rename), parse, restore
   ======================================================================== */
static uint32_t dpar_train__crc_table[256];
static dpar__once dpar_train__crc_once = DPAR__ONCE_INIT;
static void dpar_train__crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        dpar_train__crc_table[i] = c;
    }
}
DPAR_API uint32_t dpar_crc32(uint32_t crc, const void *data, size_t n) {
    dpar__call_once(&dpar_train__crc_once, dpar_train__crc_init);
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = dpar_train__crc_table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

#define DPAR_CKPT__MAGIC "DPARCKPT"
enum { DPAR_CKPT__HEADER = 32, DPAR_CKPT__NAME_MAX = 255 };

static void dpar_ckpt__le32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static void dpar_ckpt__le64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t dpar_ckpt__rd32(const unsigned char *b) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}
static uint64_t dpar_ckpt__rd64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}
/* element data <-> little-endian, in place (no-op on little-endian hosts) */
static void dpar_ckpt__to_le(void *data, size_t count, size_t es) {
    const uint16_t one = 1;
    unsigned char probe;
    memcpy(&probe, &one, 1);
    if (probe) return;
    unsigned char *p = (unsigned char *)data;
    for (size_t i = 0; i < count; i++, p += es)
        for (size_t a = 0, b = es - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

typedef struct dpar_ckpt__writer {
    FILE *f;
    uint32_t crc;
    int err;
} dpar_ckpt__writer;
static void dpar_ckpt__put(dpar_ckpt__writer *w, const void *p, size_t n) {
    if (w->err || !n) return;
    if (fwrite(p, 1, n, w->f) != n) {
        w->err = errno ? errno : EIO;
        return;
    }
    w->crc = dpar_crc32(w->crc, p, n);
}

static dpar_status dpar_ckpt__check_entries(const char *fn, const dpar_checkpoint_entry *e, int n) {
    if (n < 0) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: n = %d; give n >= 0", fn, n);
    if (n > 0 && !e)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: entries is NULL but n = %d; give n entries", fn, n);
    for (int i = 0; i < n; i++) {
        if (!e[i].name || !e[i].name[0] || strlen(e[i].name) > DPAR_CKPT__NAME_MAX)
            return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                       "%s: entry %d has no name or a name longer than %d bytes", fn, i,
                                       (int)DPAR_CKPT__NAME_MAX);
        if (!e[i].array)
            return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: entry %d ('%s') has no array", fn, i, e[i].name);
        if (dpar_train__dead(e[i].array, 0))
            return dpar_set_last_error(DPAR_ERR_STATE,
                                       "%s: entry %d ('%s'): its array was destroyed (a stale handle); nothing was "
                                       "read or written; give each entry a live array",
                                       fn, i, e[i].name);
        if (e[i].padded && dpar_array_ndim(e[i].array) != 1)
            return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                       "%s: entry '%s' is marked padded but is %d-d; padded entries are 1-d", fn,
                                       e[i].name, dpar_array_ndim(e[i].array));
        for (int j = 0; j < i; j++)
            if (!strcmp(e[i].name, e[j].name))
                return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: entries %d and %d are both named '%s'", fn,
                                           j, i, e[i].name);
    }
    return DPAR_OK;
}

/* Creates "<path>.tmp.<pid>.<k>" exclusively (O_EXCL), k unique in the
   process, so concurrent saves to one path never share a temporary. NULL with
   errno set when it cannot; tmp holds the last name tried. */
static FILE *dpar_ckpt__create_tmp(const char *path, char *tmp, size_t cap) {
    static dpar__mutex mu = DPAR__MUTEX_INIT;
    static unsigned long seq;
    int flags = O_WRONLY | O_CREAT | O_EXCL | DPAR__O_BINARY;
#ifdef O_CLOEXEC
    flags |= O_CLOEXEC;
#endif
    for (int tries = 0; tries < 100; tries++) { /* a name left by a crashed process of the same pid is skipped */
        dpar__mutex_lock(&mu);
        unsigned long k = seq++;
        dpar__mutex_unlock(&mu);
        snprintf(tmp, cap, "%s.tmp.%ld.%lu", path, dpar__pid(), k);
        int fd = open(tmp, flags, 0666);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) return NULL;
        FILE *f = fdopen(fd, "wb");
        if (!f) {
            int err = errno;
            close(fd);
            remove(tmp);
            errno = err;
        }
        return f;
    }
    return NULL;
}

DPAR_API dpar_status dpar_checkpoint_save(const char *path, const dpar_checkpoint_entry *e, int n, uint64_t step) {
    dpar_train__clear_error();
    if (!path || !*path)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_checkpoint_save: path is NULL or empty");
    if (dpar_in_dispatch())
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_checkpoint_save: called from inside a pmap/shard_map function");
    dpar_status s = dpar_ckpt__check_entries("dpar_checkpoint_save", e, n);
    if (s) return s;
    uint64_t total = DPAR_CKPT__HEADER + 4;
    size_t maxnb = 1;
    for (int i = 0; i < n; i++) {
        const dpar_array *a = e[i].array;
        size_t nb = (size_t)dpar_train__count(a) * dpar_dtype_size(dpar_array_dtype(a));
        total += 4 + strlen(e[i].name) + 4 + 4 + 8 * (uint64_t)dpar_array_ndim(a) + 4 + 8 + nb;
        if (nb > maxnb) maxnb = nb;
    }
    size_t plen = strlen(path);
    char *tmp = (char *)DPAR_MALLOC(plen + 48);
    void *data = DPAR_MALLOC(maxnb);
    if (!tmp || !data) {
        DPAR_FREE(tmp);
        DPAR_FREE(data);
        return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_checkpoint_save: out of host memory (%zu bytes)",
                                   maxnb);
    }
    dpar_ckpt__writer w;
    w.crc = 0;
    w.err = 0;
    w.f = dpar_ckpt__create_tmp(path, tmp, plen + 48);
    if (!w.f) {
        s = dpar_set_last_error(DPAR_ERR_IO, "dpar_checkpoint_save: cannot create '%s': %s", tmp, strerror(errno));
        DPAR_FREE(tmp);
        DPAR_FREE(data);
        return s;
    }
    unsigned char hdr[DPAR_CKPT__HEADER];
    memcpy(hdr, DPAR_CKPT__MAGIC, 8);
    dpar_ckpt__le32(hdr + 8, DPAR_CHECKPOINT_VERSION);
    dpar_ckpt__le32(hdr + 12, (uint32_t)n);
    dpar_ckpt__le64(hdr + 16, total);
    dpar_ckpt__le64(hdr + 24, step);
    errno = 0;
    dpar_ckpt__put(&w, hdr, sizeof hdr);
    for (int i = 0; i < n && !w.err && !s; i++) {
        const dpar_array *a = e[i].array;
        size_t es = dpar_dtype_size(dpar_array_dtype(a)), cnt = (size_t)dpar_train__count(a), nb = cnt * es;
        unsigned char b[8];
        uint32_t nl = (uint32_t)strlen(e[i].name);
        dpar_ckpt__le32(b, nl);
        dpar_ckpt__put(&w, b, 4);
        dpar_ckpt__put(&w, e[i].name, nl);
        dpar_ckpt__le32(b, (uint32_t)dpar_array_dtype(a));
        dpar_ckpt__put(&w, b, 4);
        dpar_ckpt__le32(b, (uint32_t)dpar_array_ndim(a));
        dpar_ckpt__put(&w, b, 4);
        for (int d = 0; d < dpar_array_ndim(a); d++) {
            dpar_ckpt__le64(b, (uint64_t)dpar_array_dim(a, d));
            dpar_ckpt__put(&w, b, 8);
        }
        dpar_ckpt__le32(b, e[i].padded ? 1u : 0u);
        dpar_ckpt__put(&w, b, 4);
        dpar_ckpt__le64(b, (uint64_t)nb);
        dpar_ckpt__put(&w, b, 8);
        s = dpar_array_get(a, data);
        if (!s) {
            dpar_ckpt__to_le(data, cnt, es);
            dpar_ckpt__put(&w, data, nb);
        }
    }
    if (!s && !w.err) {
        unsigned char b[4];
        uint32_t crc = w.crc;
        dpar_ckpt__le32(b, crc);
        dpar_ckpt__put(&w, b, 4);
    }
    if (!s && !w.err) w.err = dpar__file_sync(w.f);
    if (fclose(w.f) != 0 && !w.err) w.err = errno ? errno : EIO;
    if (!s && w.err)
        s = dpar_set_last_error(
            DPAR_ERR_IO, "dpar_checkpoint_save: writing '%s' failed: %s (the old checkpoint, if any, is untouched)",
            tmp, strerror(w.err));
    char why[256];
    /* tmp is the scratch for the folder's name: it is longer than path */
    if (!s && dpar__file_replace(tmp, path, tmp, why, sizeof why) != 0)
        s = dpar_set_last_error(DPAR_ERR_IO, "dpar_checkpoint_save: cannot rename '%s' to '%s': %s", tmp, path, why);
    if (s) DPAR_TRAIN__KEEP_ERROR(remove(tmp));
    DPAR_FREE(tmp);
    DPAR_FREE(data);
    return s;
}

/* The reader: a regular file streamed front to back through a 64 KiB window
   with the CRC-32 of every byte consumed, so memory stays bounded whatever
   the file claims. Only the asked entries' data is read a second time. */
enum { DPAR_CKPT__WINDOW = 65536, DPAR_CKPT__MIN_ENTRY = 4 + 1 + 4 + 4 + 4 + 8 };
typedef struct dpar_ckpt__in {
    const char *path;
    int fd;
    uint64_t size, pos, end; /* file bytes; bytes consumed; where the entries end (size - 4) */
    unsigned char *win;
    size_t have, off; /* bytes in the window; of them consumed */
    uint32_t crc;
    int err;   /* errno of a failed read (EIO: the file got shorter while read) */
    int ended; /* a read went past the end of the entries (or failed) */
} dpar_ckpt__in;

/* Consumes up to `want` (> 0) of the next bytes; *p points at them in the
   window. Returns how many: 0 at the end of the entries or on a read error. */
static size_t dpar_ckpt__next(dpar_ckpt__in *in, uint64_t want, const unsigned char **p) {
    if (in->err || in->pos >= in->end) return 0;
    if (in->off == in->have) {
        uint64_t left = in->end - in->pos;
        size_t ask = left < DPAR_CKPT__WINDOW ? (size_t)left : (size_t)DPAR_CKPT__WINDOW;
        ssize_t got = read(in->fd, in->win, (unsigned)ask); /* ask <= 64 KiB: fits Windows' unsigned count */
        while (got < 0 && errno == EINTR) got = read(in->fd, in->win, (unsigned)ask);
        if (got <= 0) {
            in->err = got < 0 ? errno : EIO;
            return 0;
        }
        in->have = (size_t)got;
        in->off = 0;
    }
    size_t k = in->have - in->off;
    if (want < k) k = (size_t)want;
    *p = in->win + in->off;
    in->off += k;
    in->pos += k;
    in->crc = dpar_crc32(in->crc, *p, k);
    return k;
}
/* Copies the next n bytes to dst (NULL: skips them). 0 when all were there. */
static int dpar_ckpt__get(dpar_ckpt__in *in, void *dst, uint64_t n) {
    unsigned char *d = (unsigned char *)dst;
    while (n) {
        const unsigned char *p;
        size_t k = dpar_ckpt__next(in, n, &p);
        if (!k) {
            in->ended = 1;
            return -1;
        }
        if (d) {
            memcpy(d, p, k);
            d += k;
        }
        n -= k;
    }
    return 0;
}
/* pread of exactly n bytes at off; 0 when all were read */
static int dpar_ckpt__pread(int fd, void *dst, size_t n, uint64_t off) {
    unsigned char *d = (unsigned char *)dst;
    while (n) {
        int64_t got = dpar__pread(fd, d, n, off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        d += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

static dpar_status dpar_ckpt__not_regular(const char *path, unsigned mode) {
    return dpar_set_last_error(DPAR_ERR_IO,
                               "dpar_checkpoint_restore: '%s' is not a regular file (a %s); checkpoints are read "
                               "from regular files only",
                               path,
                               S_ISDIR(mode)    ? "directory"
                               : S_ISFIFO(mode) ? "FIFO"
                               : S_ISCHR(mode)  ? "character device"
                               : S_ISBLK(mode)  ? "block device"
                               : S_ISSOCK(mode) ? "socket"
                                                : "special file");
}
/* Opens `path` for reading if it is a regular file. O_NONBLOCK: opening a
   FIFO must not wait for a writer (it is refused right after). */
static dpar_status dpar_ckpt__open(const char *path, int *fd_out, uint64_t *size) {
    int flags = O_RDONLY | DPAR__O_BINARY;
#ifdef O_NONBLOCK
    flags |= O_NONBLOCK;
#endif
#ifdef O_CLOEXEC
    flags |= O_CLOEXEC;
#endif
    int fd = *fd_out = open(path, flags);
    struct stat st;
    if (fd < 0) {
        int err = errno; /* Windows refuses to open a folder (EACCES): say what it is */
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return dpar_ckpt__not_regular(path, (unsigned)st.st_mode);
        return dpar_set_last_error(DPAR_ERR_IO, "dpar_checkpoint_restore: cannot open '%s': %s", path, strerror(err));
    }
    if (fstat(fd, &st) != 0)
        return dpar_set_last_error(DPAR_ERR_IO, "dpar_checkpoint_restore: cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return dpar_ckpt__not_regular(path, (unsigned)st.st_mode);
    *size = (uint64_t)st.st_size;
    return DPAR_OK;
}

/* Whether the entries after the header fill the file exactly up to its
   CRC-32 (version-1 layout, lengths only, read with pread: the stream is not
   touched); *count gets how many. A file that really ends early cannot pass,
   so a header field that disagrees with a whole body is corrupt, not the
   file truncated. Needs in->size >= DPAR_CKPT__HEADER + 4. */
static int dpar_ckpt__body_whole(const dpar_ckpt__in *in, uint32_t *count) {
    uint64_t off = DPAR_CKPT__HEADER, end = in->size - 4;
    uint32_t k = 0;
    unsigned char b[12];
    while (off < end) {
        if (end - off < DPAR_CKPT__MIN_ENTRY || k == UINT32_MAX || dpar_ckpt__pread(in->fd, b, 4, off)) return 0;
        uint32_t nl = dpar_ckpt__rd32(b);
        if (nl == 0 || nl > DPAR_CKPT__NAME_MAX || (uint64_t)nl + 4 + 8 > end - off) return 0;
        off += 4 + (uint64_t)nl;
        if (dpar_ckpt__pread(in->fd, b, 8, off)) return 0;
        uint32_t nd = dpar_ckpt__rd32(b + 4);
        if (nd > DPAR_MAX_DIMS || 8 + 8 * (uint64_t)nd + 12 > end - off) return 0;
        off += 8 + 8 * (uint64_t)nd;
        if (dpar_ckpt__pread(in->fd, b, 12, off)) return 0;
        uint64_t nb = dpar_ckpt__rd64(b + 4);
        off += 12;
        if (nb > end - off) return 0;
        off += nb;
        k++;
    }
    *count = k;
    return 1;
}
/* Whether the CRC-32 of every byte before the last 4 is what they record
   (read with pread through the window: only on the way to an error). */
static int dpar_ckpt__crc_whole(dpar_ckpt__in *in) {
    uint32_t crc = 0;
    unsigned char b[4];
    for (uint64_t off = 0, end = in->size - 4; off < end;) {
        size_t k = end - off < DPAR_CKPT__WINDOW ? (size_t)(end - off) : (size_t)DPAR_CKPT__WINDOW;
        if (dpar_ckpt__pread(in->fd, in->win, k, off)) return 0;
        crc = dpar_crc32(crc, in->win, k);
        off += k;
    }
    return !dpar_ckpt__pread(in->fd, b, 4, in->size - 4) && dpar_ckpt__rd32(b) == crc;
}
/* A header field that disagrees with a file whose entries are whole: corrupt, naming it. */
static dpar_status dpar_ckpt__bad_field(const char *path, const char *field, int at, unsigned long long got,
                                        unsigned long long want, const char *why) {
    return dpar_set_last_error(DPAR_ERR_IO,
                               "dpar_checkpoint_restore: '%s' is corrupted: its header field '%s' (offset %d) reads "
                               "%llu but should be %llu (%s); the file is damaged: restore another copy",
                               path, field, at, got, want, why);
}

/* Magic, size, version and length of the header, read into hdr; afterwards
   the stream stands at the first entry. A field that disagrees is named:
   corrupt when the entries fill the file (or the CRC-32 fails), truncated
   only when the file ends before its entries do. */
static dpar_status dpar_ckpt__header(dpar_ckpt__in *in, unsigned char *hdr) {
    const char *path = in->path;
    uint32_t nrec = 0;
    if (in->size < 8 || dpar_ckpt__pread(in->fd, hdr, 8, 0) || memcmp(hdr, DPAR_CKPT__MAGIC, 8) != 0) {
        if (in->size >= DPAR_CKPT__HEADER + 4 && !dpar_ckpt__pread(in->fd, hdr, DPAR_CKPT__HEADER, 0) &&
            dpar_ckpt__rd32(hdr + 8) == DPAR_CHECKPOINT_VERSION && dpar_ckpt__rd64(hdr + 16) == in->size &&
            dpar_ckpt__body_whole(in, &nrec) && nrec == dpar_ckpt__rd32(hdr + 12)) {
            char got[9];
            for (int i = 0; i < 8; i++) got[i] = hdr[i] >= 32 && hdr[i] < 127 ? (char)hdr[i] : '?';
            got[8] = 0;
            return dpar_set_last_error(DPAR_ERR_IO,
                                       "dpar_checkpoint_restore: '%s' is corrupted: its header field 'magic' (offset "
                                       "0) reads \"%s\" but should be \"%s\" (the rest of the file is a whole "
                                       "checkpoint); the file is damaged: restore another copy",
                                       path, got, DPAR_CKPT__MAGIC);
        }
        return dpar_set_last_error(
            DPAR_ERR_IO, "dpar_checkpoint_restore: '%s' is not a dpar checkpoint (it does not start with \"%s\")", path,
            DPAR_CKPT__MAGIC);
    }
    if (in->size < DPAR_CKPT__HEADER + 4)
        return dpar_set_last_error(
            DPAR_ERR_IO,
            "dpar_checkpoint_restore: '%s' is truncated: %llu bytes, less than the %d of an empty checkpoint", path,
            (unsigned long long)in->size, (int)DPAR_CKPT__HEADER + 4);
    in->end = in->size - 4;
    if (dpar_ckpt__get(in, hdr, DPAR_CKPT__HEADER))
        return dpar_set_last_error(DPAR_ERR_IO, "dpar_checkpoint_restore: reading '%s' failed: %s", path,
                                   strerror(in->err));
    uint32_t ver = dpar_ckpt__rd32(hdr + 8);
    if (ver != DPAR_CHECKPOINT_VERSION && !dpar_ckpt__crc_whole(in)) /* another format keeps its CRC-32 right */
        return dpar_ckpt__bad_field(path, "format version", 8, ver, DPAR_CHECKPOINT_VERSION,
                                    "and the file's CRC-32 does not match: not another format");
    if (ver != DPAR_CHECKPOINT_VERSION)
        return dpar_set_last_error(DPAR_ERR_IO,
                                   "dpar_checkpoint_restore: '%s' has format version %u but this dpar.h reads version "
                                   "%d; restore it with a matching dpar.h",
                                   path, ver, (int)DPAR_CHECKPOINT_VERSION);
    uint64_t want = dpar_ckpt__rd64(hdr + 16);
    if (want != in->size && dpar_ckpt__body_whole(in, &nrec))
        return dpar_ckpt__bad_field(path, "file bytes", 16, (unsigned long long)want, (unsigned long long)in->size,
                                    "the file's size: its entries end where its CRC-32 starts");
    if (want != in->size)
        return dpar_set_last_error(DPAR_ERR_IO,
                                   "dpar_checkpoint_restore: '%s' is %llu bytes but its header says %llu: %s", path,
                                   (unsigned long long)in->size, (unsigned long long)want,
                                   in->size < want ? "the file is truncated: its last entry runs past its end (an "
                                                     "interrupted copy?)"
                                                   : "the file is corrupted or has trailing data");
    return DPAR_OK;
}

/* What the file holds for one asked entry. */
typedef struct dpar_ckpt__want {
    int found, tail_nonzero; /* tail: a byte beyond the array's size is not zero */
    uint32_t dtype, ndim;
    int64_t shape[DPAR_MAX_DIMS];
    uint64_t nbytes, off; /* stored data bytes, where they start */
    uint64_t take;        /* bytes restored: min(nbytes, the array's bytes) */
    uint32_t crc;         /* CRC-32 of those bytes */
} dpar_ckpt__want;
/* Every entry's name, by hash, to find duplicates without keeping names. */
typedef struct dpar_ckpt__name {
    uint64_t hash, off;
    uint32_t len;
} dpar_ckpt__name;
static int dpar_ckpt__name_cmp(const void *x, const void *y) {
    const dpar_ckpt__name *a = (const dpar_ckpt__name *)x, *b = (const dpar_ckpt__name *)y;
    return a->hash != b->hash ? (a->hash < b->hash ? -1 : 1) : a->len != b->len ? (a->len < b->len ? -1 : 1) : 0;
}

#define DPAR_CKPT__BAD(...) dpar_set_last_error(DPAR_ERR_IO, "dpar_checkpoint_restore: " __VA_ARGS__)
/* Dtype, shape, flags and data size of the entry at the stream, checked
   (count x dtype size without overflow, data within the file). When the
   stream ends first: DPAR_ERR_IO with in->ended set and no text. */
static dpar_status dpar_ckpt__entry_meta(dpar_ckpt__in *in, uint32_t r, dpar_ckpt__want *w) {
    unsigned char b[12];
    if (dpar_ckpt__get(in, b, 8)) return DPAR_ERR_IO;
    w->dtype = dpar_ckpt__rd32(b);
    w->ndim = dpar_ckpt__rd32(b + 4);
    size_t es = w->dtype < (uint32_t)DPAR_DTYPE_COUNT ? dpar_dtype_size((dpar_dtype)w->dtype) : 0;
    if (!es || w->ndim > DPAR_MAX_DIMS)
        return DPAR_CKPT__BAD("'%s': entry %u has dtype %u / ndim %u (malformed file)", in->path, r, w->dtype, w->ndim);
    uint64_t cnt = 1;
    int over = 0;
    for (uint32_t d = 0; d < w->ndim; d++) {
        if (dpar_ckpt__get(in, b, 8)) return DPAR_ERR_IO;
        uint64_t x = dpar_ckpt__rd64(b);
        if (x > (uint64_t)INT64_MAX)
            return DPAR_CKPT__BAD("'%s': entry %u has dimension %u of %llu (malformed file)", in->path, r, d,
                                  (unsigned long long)x);
        w->shape[d] = (int64_t)x;
        if (x && cnt > UINT64_MAX / x) over = 1;
        cnt *= x;
    }
    if (!over && cnt > UINT64_MAX / es) over = 1;
    if (dpar_ckpt__get(in, b, 12)) return DPAR_ERR_IO;
    uint32_t flags = dpar_ckpt__rd32(b);
    w->nbytes = dpar_ckpt__rd64(b + 4);
    if (flags & ~1u)
        return DPAR_CKPT__BAD("'%s': entry %u has unknown flags 0x%x (only 0x1, padded, is defined; malformed file "
                              "or a newer format)",
                              in->path, r, flags);
    if (over)
        return DPAR_CKPT__BAD("'%s': entry %u: its element count times %zu bytes overflows 64 bits (malformed file)",
                              in->path, r, es);
    if (w->nbytes != cnt * es)
        return DPAR_CKPT__BAD("'%s': entry %u holds %llu bytes but its shape needs %llu (malformed file)", in->path, r,
                              (unsigned long long)w->nbytes, (unsigned long long)(cnt * es));
    if (w->nbytes > in->end - in->pos) {
        in->ended = 1;
        return DPAR_ERR_IO;
    }
    return DPAR_OK;
}
/* Streams the data of an entry: its CRC (first w->take bytes) and whether
   anything after them is non-zero. */
static int dpar_ckpt__entry_data(dpar_ckpt__in *in, dpar_ckpt__want *w) {
    uint64_t k = 0;
    w->crc = 0;
    w->tail_nonzero = 0;
    while (k < w->nbytes) {
        const unsigned char *p;
        size_t got = dpar_ckpt__next(in, w->nbytes - k, &p), head = 0;
        if (!got) {
            in->ended = 1;
            return -1;
        }
        if (k < w->take) {
            head = w->take - k < got ? (size_t)(w->take - k) : got;
            w->crc = dpar_crc32(w->crc, p, head);
        }
        for (size_t i = head; i < got && !w->tail_nonzero; i++) w->tail_nonzero = p[i] != 0;
        k += got;
    }
    return 0;
}

/* One entry at the stream: its name recorded for the duplicate check; when
   it is asked for (e[0..n)) described in want[]. in->ended as for _entry_meta. */
static dpar_status dpar_ckpt__scan_one(dpar_ckpt__in *in, uint32_t r, const dpar_checkpoint_entry *e, int n,
                                       dpar_ckpt__want *want, dpar_ckpt__name *nm) {
    unsigned char b[4];
    char name[DPAR_CKPT__NAME_MAX + 1];
    dpar_ckpt__want tmp, *w = &tmp;
    if (dpar_ckpt__get(in, b, 4)) return DPAR_ERR_IO;
    uint32_t nl = dpar_ckpt__rd32(b);
    if (nl == 0 || nl > DPAR_CKPT__NAME_MAX)
        return DPAR_CKPT__BAD("'%s': entry %u has a name of %u bytes; names have 1 to %d (malformed file)", in->path, r,
                              nl, (int)DPAR_CKPT__NAME_MAX);
    nm->off = in->pos;
    nm->len = nl;
    if (dpar_ckpt__get(in, name, nl)) return DPAR_ERR_IO;
    name[nl] = 0;
    nm->hash = 1469598103934665603ull; /* FNV-1a */
    for (uint32_t i = 0; i < nl; i++) nm->hash = (nm->hash ^ (unsigned char)name[i]) * 1099511628211ull;
    for (int i = 0; i < n; i++)
        if (strlen(e[i].name) == nl && !memcmp(e[i].name, name, nl)) w = &want[i];
    dpar_status s = dpar_ckpt__entry_meta(in, r, w);
    if (s) return s;
    w->found = 1;
    w->off = in->pos;
    if (w == &tmp) return dpar_ckpt__get(in, NULL, w->nbytes) ? DPAR_ERR_IO : DPAR_OK;
    const dpar_array *a = e[w - want].array;
    uint64_t nb = (uint64_t)dpar_train__count(a) * dpar_dtype_size(dpar_array_dtype(a));
    w->take = w->nbytes < nb ? w->nbytes : nb;
    return dpar_ckpt__entry_data(in, w) ? DPAR_ERR_IO : DPAR_OK;
}
/* Walks the nrec entries; a stream that ends early is malformed. */
static dpar_status dpar_ckpt__scan(dpar_ckpt__in *in, uint32_t nrec, const dpar_checkpoint_entry *e, int n,
                                   dpar_ckpt__want *want, dpar_ckpt__name *names) {
    for (uint32_t r = 0; r < nrec; r++) {
        dpar_status s = dpar_ckpt__scan_one(in, r, e, n, want, &names[r]);
        if (s && !in->ended) return s;
        if (s && in->err) return DPAR_CKPT__BAD("reading '%s' failed: %s", in->path, strerror(in->err));
        if (s) return DPAR_CKPT__BAD("'%s': entry %u runs past the end of the data (malformed file)", in->path, r);
    }
    if (in->pos != in->end)
        return DPAR_CKPT__BAD("'%s': %llu bytes after the last entry (malformed file)", in->path,
                              (unsigned long long)(in->end - in->pos));
    return DPAR_OK;
}

/* Refuses two entries of one name (sorted by hash; equal hashes compared). */
static dpar_status dpar_ckpt__no_duplicates(dpar_ckpt__in *in, dpar_ckpt__name *names, uint32_t nrec) {
    qsort(names, nrec, sizeof *names, dpar_ckpt__name_cmp);
    for (uint32_t r = 1; r < nrec; r++) {
        char x[DPAR_CKPT__NAME_MAX + 1], y[DPAR_CKPT__NAME_MAX + 1];
        if (dpar_ckpt__name_cmp(&names[r - 1], &names[r])) continue;
        if (dpar_ckpt__pread(in->fd, x, names[r].len, names[r].off) ||
            dpar_ckpt__pread(in->fd, y, names[r].len, names[r - 1].off))
            return DPAR_CKPT__BAD("reading '%s' failed: %s", in->path, strerror(errno ? errno : EIO));
        x[names[r].len] = y[names[r].len] = 0;
        if (!memcmp(x, y, names[r].len))
            return DPAR_CKPT__BAD("'%s' has two entries named '%s' (malformed file)", in->path, x);
    }
    return DPAR_OK;
}

/* Reads and checks the whole file: header, entries, CRC-32, duplicates.
   A CRC mismatch is reported before what it may have caused. */
static dpar_status dpar_ckpt__check_file(dpar_ckpt__in *in, const dpar_checkpoint_entry *e, int n,
                                         dpar_ckpt__want *want, unsigned char *hdr) {
    const char *path = in->path;
    dpar_status s = dpar_ckpt__header(in, hdr);
    if (s) return s;
    uint32_t nrec = dpar_ckpt__rd32(hdr + 12);
    uint64_t most = (in->end - DPAR_CKPT__HEADER) / DPAR_CKPT__MIN_ENTRY;
    dpar_ckpt__name *names = NULL;
    uint32_t whole = 0;
    if (nrec > most && dpar_ckpt__body_whole(in, &whole) && !dpar_ckpt__crc_whole(in)) /* else: written so */
        return dpar_ckpt__bad_field(path, "entry count", 12, nrec, whole, "the entries the file holds");
    if (nrec > most)
        s = DPAR_CKPT__BAD("'%s' counts %u entries in its header but %llu bytes hold at most %llu (malformed file)",
                           path, nrec, (unsigned long long)in->size, (unsigned long long)most);
    else if (!(names = (dpar_ckpt__name *)dpar_train__calloc(nrec ? nrec : 1, sizeof *names)))
        return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_checkpoint_restore: out of host memory (%u entries)",
                                   nrec);
    if (!s) s = dpar_ckpt__scan(in, nrec, e, n, want, names);
    if (!in->err) (void)dpar_ckpt__get(in, NULL, in->end - in->pos); /* the rest, for the CRC */
    unsigned char b[4];
    if (in->err || dpar_ckpt__pread(in->fd, b, 4, in->end)) {
        s = DPAR_CKPT__BAD("reading '%s' failed: %s", path, strerror(in->err ? in->err : EIO));
    } else if (dpar_ckpt__rd32(b) != in->crc && dpar_ckpt__body_whole(in, &whole) && whole != nrec) {
        s = dpar_ckpt__bad_field(path, "entry count", 12, nrec, whole, "the entries the file holds");
    } else if (dpar_ckpt__rd32(b) != in->crc) {
        s = DPAR_CKPT__BAD("'%s' is corrupted: CRC-32 of the contents is 0x%08x but the file records 0x%08x", path,
                           in->crc, dpar_ckpt__rd32(b));
    } else if (!s)
        s = dpar_ckpt__no_duplicates(in, names, nrec);
    DPAR_FREE(names);
    return s;
}
#undef DPAR_CKPT__BAD

/* Every asked entry against what the file holds for it; nothing changes. */
static dpar_status dpar_ckpt__match(const char *path, const dpar_checkpoint_entry *e, int n,
                                    const dpar_ckpt__want *want) {
    for (int i = 0; i < n; i++) {
        const dpar_array *a = e[i].array;
        const dpar_ckpt__want *c = &want[i];
        if (!c->found)
            return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                       "dpar_checkpoint_restore: '%s' has no entry named '%s'", path, e[i].name);
        if (c->dtype != (uint32_t)dpar_array_dtype(a))
            return dpar_set_last_error(
                DPAR_ERR_DTYPE, "dpar_checkpoint_restore: entry '%s' is %s in '%s' but the array is %s", e[i].name,
                dpar_dtype_name((dpar_dtype)c->dtype), path, dpar_dtype_name(dpar_array_dtype(a)));
        int same = c->ndim == (uint32_t)dpar_array_ndim(a);
        for (int d = 0; same && d < dpar_array_ndim(a); d++) same = c->shape[d] == dpar_array_dim(a, d);
        if (!same && e[i].padded && c->ndim == 1) {
            /* accept another padding as long as what is cut off is zero */
            if (c->tail_nonzero)
                return dpar_set_last_error(DPAR_ERR_SHAPE,
                                           "dpar_checkpoint_restore: padded entry '%s' has %lld elements in '%s', more "
                                           "than the array's %lld, and the extra elements are not zero padding",
                                           e[i].name, (long long)c->shape[0], path, (long long)dpar_array_dim(a, 0));
            same = 1;
        }
        if (!same) {
            char x[160], y[160];
            return dpar_set_last_error(DPAR_ERR_SHAPE,
                                       "dpar_checkpoint_restore: entry '%s' has shape %s in '%s' but the array has %s",
                                       e[i].name, dpar_train__shape_str(x, sizeof x, (int)c->ndim, c->shape), path,
                                       dpar_train__array_shape_str(y, sizeof y, a));
        }
    }
    return DPAR_OK;
}

/* Reads each asked entry's data again, checks it against the CRC of the
   first pass (the file must not change meanwhile) and puts it. */
static dpar_status dpar_ckpt__load(const char *path, int fd, const dpar_checkpoint_entry *e, int n,
                                   const dpar_ckpt__want *want) {
    dpar_status s = DPAR_OK;
    for (int i = 0; i < n && !s; i++) {
        dpar_array *a = e[i].array;
        const dpar_ckpt__want *c = &want[i];
        size_t es = dpar_dtype_size(dpar_array_dtype(a)), cnt = (size_t)dpar_train__count(a), nb = cnt * es;
        unsigned char *h = (unsigned char *)dpar_train__calloc(nb ? nb : 1, 1);
        if (!h)
            return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY,
                                       "dpar_checkpoint_restore: out of host memory (%zu bytes)", nb);
        if (dpar_ckpt__pread(fd, h, (size_t)c->take, c->off) || dpar_crc32(0, h, (size_t)c->take) != c->crc)
            s = dpar_set_last_error(DPAR_ERR_IO,
                                    "dpar_checkpoint_restore: '%s' changed while it was restored (entry '%s'; the "
                                    "entries before it were restored); restore again from a file nothing writes to",
                                    path, e[i].name);
        if (!s) {
            dpar_ckpt__to_le(h, cnt, es); /* the same swap both ways */
            s = dpar_array_put(a, h);
        }
        DPAR_FREE(h);
    }
    return s;
}

DPAR_API dpar_status dpar_checkpoint_restore(const char *path, const dpar_checkpoint_entry *e, int n, uint64_t *step) {
    dpar_train__clear_error();
    if (!path || !*path)
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_checkpoint_restore: path is NULL or empty");
    if (dpar_in_dispatch())
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "dpar_checkpoint_restore: called from inside a pmap/shard_map function");
    dpar_status s = dpar_ckpt__check_entries("dpar_checkpoint_restore", e, n);
    if (s) return s;
    dpar_ckpt__in in;
    memset(&in, 0, sizeof in);
    in.path = path;
    s = dpar_ckpt__open(path, &in.fd, &in.size);
    if (s) {
        if (in.fd >= 0) close(in.fd);
        return s;
    }
    unsigned char hdr[DPAR_CKPT__HEADER];
    dpar_ckpt__want *want = (dpar_ckpt__want *)dpar_train__calloc(n ? (size_t)n : 1, sizeof *want);
    in.win = (unsigned char *)DPAR_MALLOC(DPAR_CKPT__WINDOW);
    if (!want || !in.win)
        s = dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "dpar_checkpoint_restore: out of host memory");
    if (!s) s = dpar_ckpt__check_file(&in, e, n, want, hdr);
    if (!s) s = dpar_ckpt__match(path, e, n, want);
    if (!s) s = dpar_ckpt__load(path, in.fd, e, n, want);
    if (!s && step) *step = dpar_ckpt__rd64(hdr + 24);
    close(in.fd);
    DPAR_FREE(in.win);
    DPAR_FREE(want);
    return s;
}

/* >>train-graph-checkpoints ==================================================
   A graph's training state through the checkpoint functions above. */
/* Status s of the inner call `inner` made for the user's call fn: its text as fn's, the inner name dropped
   (the user called fn, not inner). */
static dpar_status dpar_gckpt__as(dpar_status s, const char *fn, const char *inner) {
    const char *t = dpar_last_error();
    size_t k = strlen(inner);
    if (!strncmp(t, inner, k) && t[k] == ':' && t[k + 1] == ' ') t += k + 2;
    return dpar_set_last_error(s, "%s: %s", fn, t);
}
/* The checkpoint entries of g's training state (*e allocated, *n of them); errors as fn's. */
static dpar_status dpar_gckpt__entries(dpar_graph *g, const char *fn, dpar_checkpoint_entry **e, int *n) {
    *e = NULL;
    *n = 0;
    if (!g) return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: g is NULL", fn);
    int count = 0;
    dpar_status s = dpar_graph_state_count(g, &count);
    if (s) return dpar_gckpt__as(s, fn, "dpar_graph_state_count");
    *e = (dpar_checkpoint_entry *)dpar_train__calloc(count ? (size_t)count : 1, sizeof **e);
    if (!*e) return dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (int i = 0; i < count && !s; i++) s = dpar_graph_state(g, i, &(*e)[i].name, &(*e)[i].array, &(*e)[i].padded);
    if (s) return dpar_gckpt__as(s, fn, "dpar_graph_state");
    *n = count;
    return DPAR_OK;
}
/* The state's entries and extra[0..n_extra) in one file; errors as fn's. */
static dpar_status dpar_gckpt__save(dpar_graph *g, const char *fn, const char *path, const dpar_checkpoint_entry *extra,
                                    int n_extra) {
    dpar_train__clear_error();
    if (!path || !*path) /* before the entries: they compile a graph not compiled yet */
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "%s: path is NULL or empty", fn);
    if (n_extra < 0 || (n_extra && !extra))
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT,
                                   "%s: n_extra = %d with extra %s; want n_extra >= 0 "
                                   "entries",
                                   fn, n_extra, extra ? "given" : "NULL");
    dpar_checkpoint_entry *e;
    int n;
    dpar_status s = dpar_gckpt__entries(g, fn, &e, &n);
    dpar_checkpoint_entry *all =
        s ? NULL : (dpar_checkpoint_entry *)dpar_train__calloc((size_t)(n + n_extra) + 1, sizeof *all);
    if (!s && !all) s = dpar_set_last_error(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (!s) {
        if (n) memcpy(all, e, (size_t)n * sizeof *all);
        if (n_extra) memcpy(all + n, extra, (size_t)n_extra * sizeof *all);
        if ((s = dpar_checkpoint_save(path, all, n + n_extra, (uint64_t)dpar_graph_step(g))))
            s = dpar_gckpt__as(s, fn, "dpar_checkpoint_save");
    }
    DPAR_FREE(all);
    DPAR_FREE(e);
    return s;
}
DPAR_API dpar_status dpar_graph_save(dpar_graph *g, const char *path) {
    return dpar_gckpt__save(g, "dpar_graph_save", path, NULL, 0);
}
DPAR_API dpar_status dpar_graph_save_extra(dpar_graph *g, const char *path, const dpar_checkpoint_entry *extra,
                                           int n_extra) {
    return dpar_gckpt__save(g, "dpar_graph_save_extra", path, extra, n_extra);
}
DPAR_API dpar_status dpar_graph_restore(dpar_graph *g, const char *path) {
    dpar_train__clear_error();
    dpar_checkpoint_entry *e;
    int n;
    uint64_t step = 0;
    if (!path || !*path) /* before the entries: they compile a graph not compiled yet */
        return dpar_set_last_error(DPAR_ERR_INVALID_ARGUMENT, "dpar_graph_restore: path is NULL or empty");
    dpar_status s = dpar_gckpt__entries(g, "dpar_graph_restore", &e, &n);
    if (!s && (s = dpar_checkpoint_restore(path, e, n, &step))) {
        s = dpar_gckpt__as(s, "dpar_graph_restore", "dpar_checkpoint_restore");
        if (s == DPAR_ERR_SHAPE && strstr(dpar_last_error(), "@")) /* an optimizer state entry */
            s = dpar_set_last_error(s,
                                    "%s; a ZeRO-1 graph (dpar_graph_zero1) keeps its optimizer state flat and "
                                    "padded, another graph shaped like the param: restore into a graph built the "
                                    "same way",
                                    dpar_last_error());
    }
    if (!s && step > (uint64_t)INT64_MAX)
        s = dpar_set_last_error(DPAR_ERR_IO,
                                "dpar_graph_restore: '%s' has step counter %llu, above 2^63 - 1 (a corrupted or "
                                "crafted file); the arrays were restored, the step counter was kept",
                                path, (unsigned long long)step);
    if (!s && (s = dpar_graph_set_step(g, (int64_t)step)))
        s = dpar_gckpt__as(s, "dpar_graph_restore", "dpar_graph_set_step");
    DPAR_FREE(e);
    return s;
}

#endif /* DPAR_TRAIN_IMPLEMENTATION_DONE */
