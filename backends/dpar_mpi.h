/* backends/dpar_mpi.h — the multi-process transport of dpar.h (MPI).

   Compiled into the implementation when DPAR_MPI is defined (build with mpicc):

       #define DPAR_MPI
       #define DPAR_IMPLEMENTATION
       #include "dpar.h"          // includes backends/dpar_mpi.h at its end

   The core reaches it only through the dpar__transport hooks (see >>transport
   in dpar.h); without DPAR_MPI those hooks are no-ops and every runtime is one
   process. It reads the backend only through the vtable (visible_devices,
   physical_device, cross_id_size, cross_id).

   Runtimes and meshes that span processes: every process owns its local
   devices; global device d lives on process d / nlocal. A collective whose
   group spans processes is hierarchical: the local members meet in shared
   memory, the group's leader on each process exchanges the call's
   description with the other processes (so mismatches, departed ranks and
   timeouts are named, never a hang), then runs one MPI collective on the
   group's communicator (MPI_Iallreduce of the process's partial result,
   MPI_Ibcast, or MPI_Iallgatherv of the inputs), polled with the runtime's
   timeout.

   Dispatches are matched by their count: every process runs the same
   dispatches (pmap, shard_map, graph runs) in the same order, and the end of
   each agrees on its status. A process that skips one is paired with the
   others' next: its collectives' descriptions catch it where they differ
   (DPAR_ERR_COLLECTIVE_MISMATCH); a dispatch without collectives, or with the
   same ones, is not caught until the processes' counts part at the end
   (DPAR_ERR_TIMEOUT). A function's address cannot tell them apart: it
   differs between processes under ASLR.
*/
#ifndef DPAR_MPI_TRANSPORT_INCLUDED
#define DPAR_MPI_TRANSPORT_INCLUDED

#include <mpi.h>
#include <sched.h>

/* >>mpi-state ================================================================ */
typedef struct dpar__mpi {
    dpar_mpi_desc desc; /* the settings, defaults resolved (dpar__mpi_settings_get) */
    MPI_Comm comm;      /* dup of the user's communicator */
    int rank, size;
    dpar__mutex mu;                 /* serializes MPI calls: MPI_THREAD_SERIALIZED is enough */
    MPI_Op op_max, op_min;          /* NaN-propagating float max/min */
    int broken;                     /* a cross-process collective timed out: destroy the runtime */
    int keep;                       /* an MPI request given up on may still use this state's communicator,
                                       buffers and MPI_Ops: never free them */
    char broken_why[DPAR__ERR_LEN]; /* what put the processes out of step (for later dispatches) */
    int agree_notice[2];            /* "gave up on the end-of-dispatch agreement" (job, process), kept for MPI */
    uint64_t waited_out_job;        /* the last dispatch (1-based) in which a collective timed out waiting for
                                       another process: its end-of-dispatch agreement is not waited for */
    /* the end-of-dispatch agreement's buffers: they outlive a request that is
       given up on after a timeout (MPI may still write them later) */
    int agree_mine[2], agree_lowest[2], agree_abandoned; /* [lowest failing process, -(any process broken)] */
    /* dpar_array_get's agreement on each shared shard ([bytes, -bytes, owner, -owner], max) and its
       status: kept, as the agreement's, for a request given up on */
    int64_t share_mine[4], share_max[4];
    int share_status;
    /* the backend bootstrap ids sent so far, by the group's device list: a group
       of devices in a second mesh reuses its id (and so the backend's cached
       communicator) instead of making a new one (an unused NCCL id leaves a
       bootstrap thread and socket behind) */
    struct dpar__mpi_xid {
        struct dpar__mpi_xid *next;
        int n;
        int *devices;
        unsigned char *id;
    } * xids;
    struct {
        int status, device;
        char msg[DPAR__ERR_LEN];
    } agree_e;
} dpar__mpi;

typedef struct dpar__mpi_msg {
    uint64_t job, seq;
    int32_t type; /* 0: a collective's description, 1: "my pmap returned" */
    int32_t kind, op, dtype, dim, tiled, split_dim, concat_dim, root, pad;
    int64_t in_count, out_count;
    uint64_t pairs_hash;
    int64_t ndim, shape[DPAR_MAX_DIMS];
} dpar__mpi_msg;

enum { DPAR__MPI_TAG = 7071, DPAR__MPI_TAG_GAVE_UP = 7072 };

typedef struct dpar__mpi_group {
    MPI_Comm comm;
    int nprocs, me;         /* processes in the group, this process's rank in comm */
    int *procs;             /* [nprocs] runtime process index of each comm rank */
    int *cr_of;             /* [n] comm rank holding each member */
    int *slot_of;           /* [n] position of the member among its process's members */
    int *nmem;              /* [nprocs] members per comm rank */
    int *rcounts, *rdispls; /* [nprocs] bytes, for MPI_Iallgatherv */
    char *xbuf;
    size_t xcap;
    char *xrecv;
    size_t xrcap;
    dpar__mpi_msg *sbuf, *rbuf; /* [nprocs] */
    MPI_Request *sreq, *rreq;   /* [nprocs] */
    int sends_pending;
    unsigned char *xid; /* the backend's bootstrap id (+ status), once sent */
    int xid_ready;
    int abandoned;       /* a data request was given up on (timeout): MPI may still
                            use comm, xbuf, xrecv, xid and nbuf, so they are never freed */
    dpar__mpi_msg *nbuf; /* [nprocs] "gave up waiting for you" notices (tag DPAR__MPI_TAG_GAVE_UP) */
} dpar__mpi_group;

static void dpar__mpi_fmax(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const float *x = (const float *)in;
    float *y = (float *)inout;
    for (int i = 0; i < *len; i++)
        if (x[i] > y[i] || x[i] != x[i]) y[i] = x[i];
}
static void dpar__mpi_fmin(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const float *x = (const float *)in;
    float *y = (float *)inout;
    for (int i = 0; i < *len; i++)
        if (x[i] < y[i] || x[i] != x[i]) y[i] = x[i];
}
static dpar_status dpar__mpi_errstr(int rc, const char *call) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return dpar__err(DPAR_ERR_BACKEND, "%s failed: %s", call, msg);
}
#define DPAR__MPI_CALL(mp, call)                                       \
    do {                                                               \
        dpar__mutex_lock(&(mp)->mu);                                   \
        int rc__ = (call);                                             \
        dpar__mutex_unlock(&(mp)->mu);                                 \
        if (rc__ != MPI_SUCCESS) return dpar__mpi_errstr(rc__, #call); \
    } while (0)

/* desc->mpi with its defaults: the deprecated flat mpi_comm, then the
   environment. The one place the transport reads its settings. */
static void dpar__mpi_settings_get(const dpar_runtime_desc *desc, dpar_mpi_desc *out) {
    memset(out, 0, sizeof *out);
    if (!desc) return;
    *out = desc->mpi;
#ifndef DPAR_NO_DEPRECATED
    if (!out->comm) out->comm = desc->mpi_comm;
#endif
    /* both in range: dpar_runtime_create checked them (dpar__env_ranges) */
    if (!out->allow_shared_device) out->allow_shared_device = dpar__env_int("DPAR_ALLOW_SHARED_DEVICE", 0) == 1;
    if (!out->host_collectives) out->host_collectives = dpar__env_int("DPAR_MPI_BACKEND_COLLECTIVES", 1) == 0;
}

/* Before the backend opens its devices: the communicator, this process's
   rank, and its rank / the process count on its node (shared-memory split). */
static dpar_status dpar__mpi_runtime_pre(dpar_runtime *rt, const dpar_runtime_desc *desc) {
    dpar_mpi_desc set;
    dpar__mpi_settings_get(desc, &set);
    const void *comm_ptr = set.comm;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!comm_ptr && (!inited || fin)) return DPAR_OK; /* one process */
    if (!inited || fin)
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_runtime_create: desc.mpi.comm is set but MPI is %s; call MPI_Init_thread(&argc, &argv, "
                         "MPI_THREAD_MULTIPLE, &provided) first",
                         fin ? "finalized" : "not initialized");
    int prov = 0;
    MPI_Query_thread(&prov);
    if (prov < MPI_THREAD_SERIALIZED)
        return dpar__err(
            DPAR_ERR_STATE,
            "dpar_runtime_create: MPI was initialized with thread level %d; dpar's device threads need at least "
            "MPI_THREAD_SERIALIZED: use MPI_Init_thread with MPI_THREAD_MULTIPLE",
            prov);
    dpar__mpi *mp = (dpar__mpi *)dpar__calloc(1, sizeof *mp);
    if (!mp) return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_runtime_create: out of host memory");
    dpar__mutex_init(&mp->mu);
    mp->desc = set;
    rt->mpi = mp;
    MPI_Comm base = comm_ptr ? *(const MPI_Comm *)comm_ptr : MPI_COMM_WORLD;
    int rc = MPI_Comm_dup(base, &mp->comm);
    if (rc != MPI_SUCCESS) {
        mp->comm = MPI_COMM_NULL;
        return dpar__mpi_errstr(rc, "MPI_Comm_dup");
    }
    MPI_Comm_rank(mp->comm, &mp->rank);
    MPI_Comm_size(mp->comm, &mp->size);
    MPI_Op_create(dpar__mpi_fmax, 1, &mp->op_max);
    MPI_Op_create(dpar__mpi_fmin, 1, &mp->op_min);
    MPI_Comm node;
    rc = MPI_Comm_split_type(mp->comm, MPI_COMM_TYPE_SHARED, mp->rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return dpar__mpi_errstr(rc, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    MPI_Comm_rank(node, &rt->local_rank);
    MPI_Comm_size(node, &rt->local_size);
    rt->share_index = rt->local_rank;
    rt->share_count = rt->local_size;
    if (rt->local_size > 1) { /* (every process of the node takes part, whatever its backend) */
        /* the backend's device visibility (CUDA_VISIBLE_DEVICES) set differently
           per rank (Slurm --gpus-per-task, a wrapper script): each process
           already sees only its own devices, so it opens all it sees instead of
           a share of them */
        int has_vis = rt->be && rt->be->visible_devices;
        const char *v = has_vis ? rt->be->visible_devices() : NULL;
        uint64_t h = v ? 1469598103934665603ull : 0;
        for (const char *c = v; c && *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
        uint64_t mine[2] = { h, ~h }, mx[2] = { 0, 0 };
        rc = MPI_Allreduce(mine, mx, 2, MPI_UINT64_T, MPI_MAX, node);
        if (rc == MPI_SUCCESS && (mx[0] != h || mx[1] != ~h) && has_vis) {
            rt->share_index = 0;
            rt->share_count = 1;
        }
    }
    MPI_Comm_free(&node);
    return DPAR_OK;
}
/* After the backend opened its devices: the same local device count on every
   process, no physical device opened by two processes, and whether every
   process's backend can run collectives across processes itself. */
enum { DPAR__MPI_HEAD = 5, DPAR__MPI_PER = 3, DPAR__MPI_W = DPAR__MPI_HEAD + DPAR__MPI_PER * DPAR_MAX_DEVICES };

/* Two ranks on one physical device (same UUID, or same index on the same node
   without one) is an error unless .mpi.allow_shared_device; *shared says it was
   allowed (then NCCL cannot span processes). all: every rank's record, as
   dpar__mpi_runtime_init gathers it. */
static dpar_status dpar__mpi_check_shared(const dpar_runtime *rt, const dpar__mpi *mp, const int64_t *all,
                                          int *shared_out) {
    enum { HEAD = DPAR__MPI_HEAD, PER = DPAR__MPI_PER, W = DPAR__MPI_W };
    int nl = rt->nlocal < DPAR_MAX_DEVICES ? rt->nlocal : DPAR_MAX_DEVICES, shared = 0;
    dpar_status s = DPAR_OK;
    if (rt->be->physical_device) /* else emulated devices (CPU): any process may share them */
        for (int a = 0; a < mp->size && !s && !shared; a++)
            for (int b = a + 1; b < mp->size && !s && !shared; b++)
                for (int i = 0; i < nl && !s && !shared; i++)
                    for (int j = 0; j < nl && !s && !shared; j++) {
                        const int64_t *x = &all[(size_t)a * W + (size_t)(HEAD + PER * i)];
                        const int64_t *y = &all[(size_t)b * W + (size_t)(HEAD + PER * j)];
                        int has_uuid = x[1] || x[2], same;
                        /* a UUID names one physical device anywhere; without one, the same index on the same node */
                        if (has_uuid)
                            same = x[1] == y[1] && x[2] == y[2];
                        else
                            same = all[(size_t)a * W + 1] == all[(size_t)b * W + 1] && x[0] >= 0 && x[0] == y[0];
                        if (!same) continue;
                        if (mp->desc.allow_shared_device) {
                            shared = 1;
                            break;
                        } /* allowed, but NCCL cannot span it */
                        char u[48] = "";
                        if (has_uuid)
                            snprintf(u, sizeof u, " (UUID %016llx%016llx)", (unsigned long long)x[1],
                                     (unsigned long long)x[2]);
                        s = dpar__err(
                            DPAR_ERR_INVALID_ARGUMENT,
                            "dpar_runtime_create: ranks %d and %d both resolve to physical %s device %lld%s on "
                            "the same node (rank %d's device %d, rank %d's device %d); give each rank its own device: "
                            "by default the "
                            "node's devices are split evenly between its processes, in node-local rank order, so run "
                            "fewer ranks or "
                            "devices per node, or pick devices per rank (CUDA_VISIBLE_DEVICES, DPAR_VK_DEVICE), or set "
                            "DPAR_ALLOW_SHARED_DEVICE=1 to share it deliberately",
                            a, b, rt->be->name, (long long)x[0], u, a, i, b, j);
                    }
    *shared_out = shared;
    return s;
}

static dpar_status dpar__mpi_runtime_init(dpar_runtime *rt, dpar_status opened) {
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    if (!mp) return opened; /* one process */
    /* every process reports, including one whose backend failed to open
       (so the others get an error instead of waiting here forever) */
    char host[MPI_MAX_PROCESSOR_NAME];
    int hl = 0;
    MPI_Get_processor_name(host, &hl);
    uint64_t hh = 1469598103934665603ull;
    for (int i = 0; i < hl; i++) hh = (hh ^ (unsigned char)host[i]) * 1099511628211ull;
    enum { HEAD = DPAR__MPI_HEAD, PER = DPAR__MPI_PER, W = DPAR__MPI_W };
    int64_t mine[W];
    for (int i = 0; i < W; i++) mine[i] = -1;
    mine[0] = opened ? -1 : rt->nlocal;
    mine[1] = (int64_t)(hh >> 1);
    mine[2] = opened ? (int64_t)opened : 0;
    mine[3] = 0;
    mine[4] = rt->be ? (int64_t)rt->be->kind : -1;
    if (!opened) {
        if (rt->be->cross_id_size && !mp->desc.host_collectives) mine[3] = (int64_t)rt->be->cross_id_size(rt->bstate);
        for (int i = 0; i < rt->nlocal && i < DPAR_MAX_DEVICES && rt->be->physical_device; i++) {
            int phys = 0;
            unsigned char uuid[16] = { 0 };
            rt->be->physical_device(rt->bstate, i, &phys, uuid);
            uint64_t lo = 0, hi = 0;
            for (int b = 0; b < 8; b++) {
                lo = lo << 8 | uuid[b];
                hi = hi << 8 | uuid[8 + b];
            }
            mine[HEAD + PER * i] = phys;
            mine[HEAD + PER * i + 1] = (int64_t)lo;
            mine[HEAD + PER * i + 2] = (int64_t)hi;
        }
    }
    int64_t *all = (int64_t *)dpar__calloc((size_t)mp->size * W, sizeof(int64_t));
    if (!all) return opened ? opened : dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_runtime_create: out of host memory");
    char keep[DPAR__ERR_LEN];
    memcpy(keep, dpar__err_text, sizeof keep);
    int rc = MPI_Allgather(mine, W, MPI_INT64_T, all, W, MPI_INT64_T, mp->comm);
    if (opened) {
        DPAR_FREE(all);
        return dpar__err(opened, "%s", keep);
    }
    if (rc != MPI_SUCCESS) {
        DPAR_FREE(all);
        return dpar__mpi_errstr(rc, "MPI_Allgather (dpar_runtime_create)");
    }
    dpar_status s = DPAR_OK;
    for (int q = 0; q < mp->size && !s; q++)
        if (all[(size_t)q * W] < 0) /* the same status as the failing process, with its rank */
            s = dpar__err((dpar_status)all[(size_t)q * W + 2],
                          "dpar_runtime_create: it failed on process %d (%s; see that rank's error), "
                          "so no process gets a runtime",
                          q, dpar_status_string((dpar_status)all[(size_t)q * W + 2]));
    for (int q = 1; q < mp->size && !s; q++)
        if (all[(size_t)q * W + 4] != all[4])
            s = dpar__err(DPAR_ERR_INVALID_ARGUMENT,
                          "dpar_runtime_create: process 0 uses the %s backend but process %d uses %s; every "
                          "process must use the same backend (desc.backend / DPAR_BACKEND)",
                          dpar_backend_name((dpar_backend_kind)all[4]), q,
                          dpar_backend_name((dpar_backend_kind)all[(size_t)q * W + 4]));
    for (int q = 0; q < mp->size && !s; q++)
        if (all[(size_t)q * W] != all[0])
            s = dpar__err(
                DPAR_ERR_DEVICE_COUNT,
                "dpar_runtime_create: process 0 has %lld local devices but process %d has %lld; every process "
                "must open the same number (set num_devices or DPAR_DEVICES the same on every rank)",
                (long long)all[0], q, (long long)all[(size_t)q * W]);
    int shared = 0;
    if (!s) s = dpar__mpi_check_shared(rt, mp, all, &shared);
    /* the backend runs cross-process groups itself only if every process can,
       and no device is shared between processes (NCCL refuses two ranks on one GPU) */
    int64_t xs = shared ? 0 : all[3];
    for (int q = 1; q < mp->size; q++)
        if (all[(size_t)q * W + 3] != xs) xs = 0;
    rt->xbackend = !s && xs > 0;
    rt->xid_size = rt->xbackend ? (size_t)xs : 0;
    DPAR_FREE(all);
    if (s) return s;
    rt->proc = mp->rank;
    rt->nproc = mp->size;
    rt->local_base = mp->rank * rt->nlocal;
    rt->ndev = mp->size * rt->nlocal;
    if (rt->ndev > DPAR_MAX_DEVICES)
        return dpar__err(DPAR_ERR_DEVICE_COUNT,
                         "dpar_runtime_create: %d processes x %d devices = %d exceeds DPAR_MAX_DEVICES (%d)", mp->size,
                         rt->nlocal, rt->ndev, (int)DPAR_MAX_DEVICES);
    return DPAR_OK;
}
static void dpar__mpi_runtime_free(dpar_runtime *rt) {
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    if (!mp) return;
    rt->mpi = NULL;
    /* an abandoned end-of-dispatch agreement may still use mp's buffers and
       communicator, and a group's abandoned all-reduce its MPI_Ops: keep them
       (a deliberate, bounded leak after such a failure; see dpar__mpi_group_free) */
    if (mp->keep) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        if (mp->op_max != MPI_OP_NULL && mp->op_max) MPI_Op_free(&mp->op_max);
        if (mp->op_min != MPI_OP_NULL && mp->op_min) MPI_Op_free(&mp->op_min);
        if (mp->comm != MPI_COMM_NULL) MPI_Comm_free(&mp->comm);
    }
    while (mp->xids) {
        struct dpar__mpi_xid *x = mp->xids;
        mp->xids = x->next;
        DPAR_FREE(x->devices);
        DPAR_FREE(x->id);
        DPAR_FREE(x);
    }
    dpar__mutex_destroy(&mp->mu);
    DPAR_FREE(mp);
    rt->mpi = NULL;
}

static void dpar__mpi_group_free(dpar__mpi *mp, dpar__mpi_group *mg) {
    if (!mg) return;
    /* a collective that was given up on stays active inside MPI (it cannot be
       cancelled) and may still read or write these buffers, even during
       MPI_Finalize: leave the group's communicator and buffers alone (a
       deliberate, bounded leak after a failure across processes) */
    if (mg->abandoned) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && mg->comm != MPI_COMM_NULL) {
        if (mg->sends_pending) MPI_Waitall(mg->nprocs, mg->sreq, MPI_STATUSES_IGNORE);
        /* drain notices nobody asked for (the last "pmap returned" ones) */
        for (;;) {
            int flag = 0;
            MPI_Status st;
            MPI_Iprobe(MPI_ANY_SOURCE, DPAR__MPI_TAG, mg->comm, &flag, &st);
            if (!flag) break;
            dpar__mpi_msg junk;
            MPI_Recv(&junk, (int)sizeof junk, MPI_BYTE, st.MPI_SOURCE, DPAR__MPI_TAG, mg->comm, MPI_STATUS_IGNORE);
        }
        MPI_Comm_free(&mg->comm);
    }
    (void)mp;
    DPAR_FREE(mg->procs);
    DPAR_FREE(mg->cr_of);
    DPAR_FREE(mg->slot_of);
    DPAR_FREE(mg->nmem);
    DPAR_FREE(mg->rcounts);
    DPAR_FREE(mg->rdispls);
    DPAR_FREE(mg->xbuf);
    DPAR_FREE(mg->xrecv);
    DPAR_FREE(mg->sbuf);
    DPAR_FREE(mg->rbuf);
    DPAR_FREE(mg->sreq);
    DPAR_FREE(mg->rreq);
    DPAR_FREE(mg->xid);
    DPAR_FREE(mg);
}
static void dpar__mpi_mesh_free(dpar_mesh *m) {
    dpar__mpi *mp = (dpar__mpi *)m->rt->mpi;
    if (!mp) return;
    for (int k = 1; k < DPAR__GROUP_KEYS; k++)
        for (int g = 0; g < m->ngroups[k]; g++) {
            dpar__mpi_group_free(mp, (dpar__mpi_group *)m->groups[k][g].mpi);
            m->groups[k][g].mpi = NULL;
        }
}

static dpar_status dpar__mpi_mesh_init(dpar_mesh *m) {
    dpar_runtime *rt = m->rt;
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    if (!mp) return DPAR_OK;
    /* every process must create the same mesh */
    uint64_t h = 1469598103934665603ull;
#define DPAR__MIX(v) (h = (h ^ (uint64_t)(v)) * UINT64_C(1099511628211))
    DPAR__MIX(m->ndim);
    for (int a = 0; a < m->ndim; a++) {
        DPAR__MIX(m->shape[a]);
        for (const char *c = m->names[a]; *c; c++) DPAR__MIX((unsigned char)*c);
    }
    for (int p = 0; p < m->size; p++) DPAR__MIX(m->devices[p]);
#undef DPAR__MIX
    uint64_t mine[2] = { h, ~h }, mx[2];
    DPAR__MPI_CALL(mp, MPI_Allreduce(mine, mx, 2, MPI_UINT64_T, MPI_MAX, mp->comm));
    if (mx[0] != h || mx[1] != ~h)
        return dpar__err(
            DPAR_ERR_INVALID_ARGUMENT,
            "dpar_mesh_create: the processes created different meshes (shape, axis names or device "
            "order differ); every process must call dpar_mesh_create with the same desc, in the same order");
    for (int k = 1; k < (1 << m->ndim); k++)
        for (int g = 0; g < m->ngroups[k]; g++) {
            dpar__group *gr = &m->groups[k][g];
            int procs[DPAR_MAX_DEVICES], np = 0;
            for (int r = 0; r < gr->n; r++) {
                int pr = gr->devices[r] / rt->nlocal, seen = 0;
                for (int i = 0; i < np; i++) seen |= procs[i] == pr;
                if (!seen) procs[np++] = pr;
            }
            if (np < 2) continue;
            for (int i = 1; i < np; i++) /* sort: comm ranks follow process order */
                for (int j = i; j > 0 && procs[j - 1] > procs[j]; j--) {
                    int t = procs[j];
                    procs[j] = procs[j - 1];
                    procs[j - 1] = t;
                }
            MPI_Comm comm = MPI_COMM_NULL;
            DPAR__MPI_CALL(mp, MPI_Comm_split(mp->comm, gr->nlocal > 0 ? 0 : MPI_UNDEFINED, mp->rank, &comm));
            if (gr->nlocal == 0) continue;
            dpar__mpi_group *mg = (dpar__mpi_group *)dpar__calloc(1, sizeof *mg);
            if (!mg) {
                MPI_Comm_free(&comm);
                return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_mesh_create: out of host memory");
            }
            gr->mpi = mg;
            mg->comm = comm;
            mg->nprocs = np;
            mg->procs = (int *)dpar__calloc((size_t)np, sizeof(int));
            mg->nmem = (int *)dpar__calloc((size_t)np, sizeof(int));
            mg->rcounts = (int *)dpar__calloc((size_t)np, sizeof(int));
            mg->rdispls = (int *)dpar__calloc((size_t)np, sizeof(int));
            mg->cr_of = (int *)dpar__calloc((size_t)gr->n, sizeof(int));
            mg->slot_of = (int *)dpar__calloc((size_t)gr->n, sizeof(int));
            mg->sbuf = (dpar__mpi_msg *)dpar__calloc((size_t)np, sizeof(dpar__mpi_msg));
            mg->rbuf = (dpar__mpi_msg *)dpar__calloc((size_t)np, sizeof(dpar__mpi_msg));
            mg->sreq = (MPI_Request *)dpar__calloc((size_t)np, sizeof(MPI_Request));
            mg->rreq = (MPI_Request *)dpar__calloc((size_t)np, sizeof(MPI_Request));
            if (!mg->procs || !mg->nmem || !mg->rcounts || !mg->rdispls || !mg->cr_of || !mg->slot_of || !mg->sbuf ||
                !mg->rbuf || !mg->sreq || !mg->rreq)
                return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "dpar_mesh_create: out of host memory");
            for (int i = 0; i < np; i++) {
                mg->procs[i] = procs[i];
                if (procs[i] == rt->proc) mg->me = i;
                mg->sreq[i] = MPI_REQUEST_NULL;
            }
            for (int r = 0; r < gr->n; r++) {
                int pr = gr->devices[r] / rt->nlocal, cr = 0;
                while (mg->procs[cr] != pr) cr++;
                mg->cr_of[r] = cr;
                mg->slot_of[r] = mg->nmem[cr]++;
            }
        }
    return DPAR_OK;
}

/* Polls req until done, the deadline, or an abort of the job. `busy`: keep
   calling into MPI (its shared-memory transport only progresses inside MPI
   calls) instead of sleeping between polls; used for the data phase. */
static int dpar__mpi_poll(dpar__mpi *mp, MPI_Request *req, const uint64_t *dl, dpar__job *job, int busy) {
    for (int spins = 0;; spins++) {
        int flag = 0;
        dpar__mutex_lock(&mp->mu);
        MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        dpar__mutex_unlock(&mp->mu);
        if (flag) return 1;
        if (job && DPAR__ATOMIC_LOAD(&job->abort)) return -1;
        if (dpar__now_ns() >= *dl) return 0;
        if (!busy && spins > 64)
            dpar__sleep_us(20);
        else
            dpar__thread_yield();
    }
}
static void dpar__mpi_fill_msg(dpar__mpi_msg *mm, const dpar__post *p, uint64_t job, uint64_t seq, int type) {
    memset(mm, 0, sizeof *mm);
    mm->job = job;
    mm->seq = seq;
    mm->type = type;
    if (p) {
        mm->kind = p->kind;
        mm->op = p->op;
        mm->dtype = p->dtype;
        mm->dim = p->dim;
        mm->tiled = p->tiled;
        mm->split_dim = p->split_dim;
        mm->concat_dim = p->concat_dim;
        mm->root = p->root;
        mm->in_count = p->in_count;
        mm->out_count = p->out_count;
        mm->pairs_hash = p->pairs_hash;
        mm->ndim = p->ndim;
        for (int d = 0; d < DPAR_MAX_DIMS; d++) mm->shape[d] = p->shape[d];
    }
}
static dpar_status dpar__mpi_send_all(dpar__mpi *mp, dpar__mpi_group *mg, const dpar__mpi_msg *mm) {
    if (mg->sends_pending) {
        DPAR__MPI_CALL(mp, MPI_Waitall(mg->nprocs, mg->sreq, MPI_STATUSES_IGNORE));
        mg->sends_pending = 0;
    }
    for (int q = 0; q < mg->nprocs; q++) {
        mg->sreq[q] = MPI_REQUEST_NULL;
        if (q == mg->me) continue;
        mg->sbuf[q] = *mm;
        DPAR__MPI_CALL(mp,
                       MPI_Isend(&mg->sbuf[q], (int)sizeof *mm, MPI_BYTE, q, DPAR__MPI_TAG, mg->comm, &mg->sreq[q]));
    }
    mg->sends_pending = 1;
    return DPAR_OK;
}
static const char *dpar__mpi_devs(const dpar__group *g, const dpar__mpi_group *mg, int cr, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int r = 0; r < g->n && at < cap; r++)
        if (mg->cr_of[r] == cr) at += (size_t)snprintf(buf + at, cap - at, at ? ", %d" : "%d", g->devices[r]);
    return buf;
}

/* Did a process of this group give up waiting for this one (its timeout
   passed before this process arrived)? Then say so, instead of waiting for
   it in turn and reporting a vaguer timeout later. */
static dpar_status dpar__mpi_gave_up(dpar__mpi *mp, dpar__mpi_group *mg, const dpar__group *g, const char *what,
                                     uint64_t job, uint64_t seq, int timeout_ms) {
    int flag = 0;
    MPI_Status st;
    dpar__mutex_lock(&mp->mu);
    /* a probe that finds nothing makes progress afterwards: ask a few times */
    for (int i = 0; i < 3 && !flag; i++) MPI_Iprobe(MPI_ANY_SOURCE, DPAR__MPI_TAG_GAVE_UP, mg->comm, &flag, &st);
    dpar__mpi_msg o;
    memset(&o, 0, sizeof o);
    if (flag) MPI_Recv(&o, (int)sizeof o, MPI_BYTE, st.MPI_SOURCE, DPAR__MPI_TAG_GAVE_UP, mg->comm, MPI_STATUS_IGNORE);
    dpar__mutex_unlock(&mp->mu);
    if (!flag) return DPAR_OK;
    char devs[128];
    mp->broken = 1;
    return dpar__err(DPAR_ERR_TIMEOUT,
                     "%s (step: pmap #%llu, collective #%llu of this group): rank %d (devices %s) gave up waiting for "
                     "this process at pmap #%llu, collective #%llu of this group, after its timeout (%d ms here; "
                     "DPAR_TIMEOUT_MS): this "
                     "process arrived too late, so the processes are out of step; destroy the runtime on every process",
                     what, (unsigned long long)job, (unsigned long long)seq, mg->procs[st.MPI_SOURCE],
                     dpar__mpi_devs(g, mg, st.MPI_SOURCE, devs, sizeof devs), (unsigned long long)o.job,
                     (unsigned long long)o.seq, timeout_ms);
}

/* A receive of the agreement timed out (r == 0) or the job aborted (r < 0):
   cancels every outstanding receive, tells the ranks that never answered that
   this one gave up (should they arrive later), marks the runtime broken and
   returns the error naming them. */
static dpar_status dpar__mpi_abandon_wait(dpar_runtime *rt, dpar__mpi *mp, dpar__mpi_group *mg, dpar__group *g, int r,
                                          const char *what, uint64_t job, uint64_t seq) {
    char who[256], devs[128];
    size_t at = 0;
    who[0] = 0;
    for (int k = 0; k < mg->nprocs; k++) {
        if (k == mg->me || mg->rreq[k] == MPI_REQUEST_NULL) continue;
        int done = 0;
        dpar__mutex_lock(&mp->mu);
        MPI_Test(&mg->rreq[k], &done, MPI_STATUS_IGNORE);
        if (!done) {
            MPI_Cancel(&mg->rreq[k]);
            MPI_Wait(&mg->rreq[k], MPI_STATUS_IGNORE);
        }
        dpar__mutex_unlock(&mp->mu);
        if (!done && at < sizeof who)
            at += (size_t)snprintf(who + at, sizeof who - at, "%srank %d (devices %s)", at ? ", " : "", mg->procs[k],
                                   dpar__mpi_devs(g, mg, k, devs, sizeof devs));
        if (!done && r == 0) { /* tell it, should it arrive later */
            if (!mg->nbuf) mg->nbuf = (dpar__mpi_msg *)dpar__calloc((size_t)mg->nprocs, sizeof(dpar__mpi_msg));
            if (mg->nbuf) {
                MPI_Request nr = MPI_REQUEST_NULL;
                dpar__mpi_fill_msg(&mg->nbuf[k], NULL, job, seq, 2);
                dpar__mutex_lock(&mp->mu);
                if (MPI_Isend(&mg->nbuf[k], (int)sizeof(dpar__mpi_msg), MPI_BYTE, k, DPAR__MPI_TAG_GAVE_UP, mg->comm,
                              &nr) == MPI_SUCCESS)
                    MPI_Request_free(&nr); /* completes on its own; nbuf is kept (abandoned) */
                dpar__mutex_unlock(&mp->mu);
                mg->abandoned = 1; /* nbuf stays in use */
            }
        }
    }
    mp->broken = 1;
    if (r < 0) return dpar__err(DPAR_ERR_ABORTED, "%s: stopped because another device failed first", what);
    mp->waited_out_job = job;
    return dpar__err(
        DPAR_ERR_TIMEOUT,
        "%s (step: pmap #%llu, collective #%llu of this group): timed out after %d ms waiting for %s, "
        "which never called it; every process must make the same collective calls (DPAR_TIMEOUT_MS sets the "
        "timeout)",
        what, (unsigned long long)job, (unsigned long long)seq, rt->timeout_ms, who);
}

/* The collective another rank announced, as a post to compare with ours. */
static void dpar__mpi_msg_post(const dpar__mpi_msg *o, dpar__post *op) {
    memset(op, 0, sizeof *op);
    op->kind = o->kind;
    op->op = o->op;
    op->dtype = o->dtype;
    op->in_count = o->in_count;
    op->out_count = o->out_count;
    op->dim = o->dim;
    op->tiled = o->tiled;
    op->split_dim = o->split_dim;
    op->concat_dim = o->concat_dim;
    op->root = o->root;
    op->pairs_hash = o->pairs_hash;
    op->name = dpar__coll_name((dpar__coll_kind)op->kind, (dpar_reduce_op)op->op);
    op->ndim = (int)o->ndim;
    for (int d = 0; d < DPAR_MAX_DIMS; d++) op->shape[d] = o->shape[d];
}

/* Step 1 of every collective across processes, run by the group's leader on
   each process: every process tells the others what it calls, so a
   mismatch, a rank that returned from its pmap function, or one that never
   arrives is named (within the runtime's timeout) instead of hanging. */
static dpar_status dpar__mpi_describe(dpar_ctx *ctx, dpar__group *g, const char *what, const uint64_t *dlp) {
    dpar_runtime *rt = ctx->rt;
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    dpar__mpi_group *mg = (dpar__mpi_group *)g->mpi;
    if (!mp || !mg) return dpar__err(DPAR_ERR_STATE, "%s: group spans processes but has no MPI communicator", what);
    if (mp->broken)
        return dpar__err(
            DPAR_ERR_STATE,
            "%s: an earlier collective across processes failed, so the processes are out of step; destroy the "
            "runtime (dpar_runtime_destroy) on every process",
            what);
    const int L = g->leader;
    uint64_t job = rt->job_count, seq = g->seq;
    uint64_t dl = *dlp;
    dpar_status s;
    dpar__mpi_msg mine;
    dpar__mpi_fill_msg(&mine, &g->posts[L], job, seq, 0);
    s = dpar__mpi_send_all(mp, mg, &mine);
    if (s) return s;
    for (int q = 0; q < mg->nprocs; q++) {
        mg->rreq[q] = MPI_REQUEST_NULL;
        if (q == mg->me) continue;
        DPAR__MPI_CALL(mp,
                       MPI_Irecv(&mg->rbuf[q], (int)sizeof mine, MPI_BYTE, q, DPAR__MPI_TAG, mg->comm, &mg->rreq[q]));
    }
    for (int q = 0; q < mg->nprocs; q++) {
        if (q == mg->me) continue;
        for (;;) {
            int r = dpar__mpi_poll(mp, &mg->rreq[q], &dl, ctx->job, 1);
            if (r == 1 && mg->rbuf[q].type == 1 && mg->rbuf[q].job < job) { /* stale "pmap returned": skip it */
                DPAR__MPI_CALL(
                    mp, MPI_Irecv(&mg->rbuf[q], (int)sizeof mine, MPI_BYTE, q, DPAR__MPI_TAG, mg->comm, &mg->rreq[q]));
                continue;
            }
            if (r == 1) break;
            return dpar__mpi_abandon_wait(rt, mp, mg, g, r, what, job, seq);
        }
    }
    if ((s = dpar__mpi_gave_up(mp, mg, g, what, job, seq, rt->timeout_ms))) return s;
    for (int q = 0; q < mg->nprocs; q++) {
        if (q == mg->me) continue;
        const dpar__mpi_msg *o = &mg->rbuf[q];
        char devs[128];
        if (o->type == 1) {
            mp->broken = 1;
            return dpar__err(DPAR_ERR_COLLECTIVE_MISMATCH,
                             "%s (step: pmap #%llu, collective #%llu of this group): rank %d (devices %s) returned "
                             "from the pmap function after %llu collectives on this group, without calling this one "
                             "(uneven step counts?)",
                             what, (unsigned long long)job, (unsigned long long)seq, mg->procs[q],
                             dpar__mpi_devs(g, mg, q, devs, sizeof devs), (unsigned long long)o->seq);
        }
        dpar__post op;
        dpar__mpi_msg_post(o, &op);
        if (o->job != job || o->seq != seq || !dpar__post_eq(&op, &g->posts[L])) {
            char x[200], y[200];
            dpar__post_str(&g->posts[L], x, sizeof x);
            dpar__post_str(&op, y, sizeof y);
            return dpar__err(
                DPAR_ERR_COLLECTIVE_MISMATCH,
                "%s: rank %d called %s at pmap #%llu collective #%llu, but rank %d (devices %s) called %s "
                "at pmap #%llu collective #%llu; every process must make the same collective calls in the same order",
                what, rt->proc, x, (unsigned long long)job, (unsigned long long)seq, mg->procs[q],
                dpar__mpi_devs(g, mg, q, devs, sizeof devs), y, (unsigned long long)o->job, (unsigned long long)o->seq);
        }
    }
    return DPAR_OK;
}

/* A collective across processes that the backend runs itself (CUDA: NCCL
   across processes): step 1, then, on the group's first such call, the
   backend's bootstrap id (ncclGetUniqueId on the process holding member 0)
   travels to the group's other processes by MPI_Ibcast, polled with the
   runtime's timeout. A failure to make the id is sent along, so every
   process gets the error. */
static dpar_status dpar__mpi_coll_agree(dpar_ctx *ctx, dpar__group *g, const char *what) {
    dpar_runtime *rt = ctx->rt;
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    dpar__mpi_group *mg = (dpar__mpi_group *)g->mpi;
    uint64_t dl = dpar__deadline(rt->timeout_ms);
    dpar_status s = dpar__mpi_describe(ctx, g, what, &dl);
    if (s || mg->xid_ready) return s;
    size_t bytes = rt->xid_size + 8;
    if (!mg->xid) mg->xid = (unsigned char *)dpar__calloc(1, bytes);
    if (!mg->xid) {
        mp->broken = 1;
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
    }
    /* the same devices in an earlier mesh: every process of the group has the
       same meshes, so all find it (or none does) */
    dpar__mutex_lock(&mp->mu); /* leaders of other groups may look too */
    for (struct dpar__mpi_xid *x = mp->xids; x && !mg->xid_ready; x = x->next) {
        if (x->n != g->n || memcmp(x->devices, g->devices, sizeof(int) * (size_t)g->n)) continue;
        memcpy(mg->xid, x->id, rt->xid_size);
        mg->xid_ready = 1;
    }
    dpar__mutex_unlock(&mp->mu);
    if (mg->xid_ready) return DPAR_OK;
    int root = mg->cr_of[0];
    unsigned char *hdr = mg->xid + rt->xid_size; /* status after the id */
    char keep[DPAR__ERR_LEN] = "";
    if (mg->me == root) {
        int32_t made = (int32_t)rt->be->cross_id(rt->bstate, mg->xid);
        if (made) memcpy(keep, dpar__err_text, sizeof keep);
        memcpy(hdr, &made, 4);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    DPAR__MPI_CALL(mp, MPI_Ibcast(mg->xid, (int)bytes, MPI_BYTE, root, mg->comm, &req));
    int r = dpar__mpi_poll(mp, &req, &dl, ctx->job, 1);
    if (r != 1) {
        mp->broken = 1;
        mg->abandoned = 1; /* MPI may still write mg->xid */
        mp->keep = 1;
        if (r < 0) return dpar__err(DPAR_ERR_ABORTED, "%s: stopped because another device failed first", what);
        return dpar__err(DPAR_ERR_TIMEOUT,
                         "%s: sending the %s backend's bootstrap id across processes did not finish within %d ms", what,
                         rt->be->name, rt->timeout_ms);
    }
    int32_t made;
    memcpy(&made, hdr, 4);
    if (made) {
        mp->broken = 1;
        if (mg->me == root) return dpar__err((dpar_status)made, "%s", keep);
        return dpar__err(
            (dpar_status)made,
            "%s: rank %d could not make the %s backend's bootstrap id for this group (see that rank's error)", what,
            mg->procs[root], rt->be->name);
    }
    mg->xid_ready = 1;
    struct dpar__mpi_xid *x = (struct dpar__mpi_xid *)dpar__calloc(1, sizeof *x);
    if (x) {
        x->devices = (int *)dpar__calloc((size_t)g->n, sizeof(int));
        x->id = (unsigned char *)dpar__calloc(1, rt->xid_size);
        if (!x->devices || !x->id) {
            DPAR_FREE(x->devices);
            DPAR_FREE(x->id);
            DPAR_FREE(x);
            x = NULL;
        }
    }
    if (!x) {
        mp->broken = 1;
        return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
    }
    x->n = g->n;
    memcpy(x->devices, g->devices, sizeof(int) * (size_t)g->n);
    memcpy(x->id, mg->xid, rt->xid_size);
    dpar__mutex_lock(&mp->mu);
    x->next = mp->xids;
    mp->xids = x;
    dpar__mutex_unlock(&mp->mu);
    return DPAR_OK;
}

static const void *dpar__mpi_group_xid(const dpar__group *g) {
    const dpar__mpi_group *mg = (const dpar__mpi_group *)g->mpi;
    return mg ? mg->xid : NULL;
}

/* Waits for the data phase's MPI request. A collective cannot be cancelled:
   after a timeout the runtime is out of step, and the request stays active
   inside MPI with the group's buffers (mg->abandoned keeps them). */
static dpar_status dpar__mpi_data_wait(dpar_ctx *ctx, dpar__mpi_group *mg, MPI_Request *req, const uint64_t *dl,
                                       const char *what, uint64_t job, uint64_t seq) {
    dpar__mpi *mp = (dpar__mpi *)ctx->rt->mpi;
    int r = dpar__mpi_poll(mp, req, dl, ctx->job, 1);
    if (r == 1) return DPAR_OK;
    mp->broken = 1;
    mg->abandoned = 1;
    mp->keep = 1; /* the all-reduce may use mp's MPI_Ops */
    if (r < 0) return dpar__err(DPAR_ERR_ABORTED, "%s: stopped because another device failed first", what);
    return dpar__err(
        DPAR_ERR_TIMEOUT,
        "%s (step: pmap #%llu, collective #%llu of this group): the data exchange across processes did not "
        "finish within %d ms",
        what, (unsigned long long)job, (unsigned long long)seq, ctx->rt->timeout_ms);
}

/* f32 all-reduce across processes, in chunks of 1 MB, so that the process's
   partial result (vectorized, in member order), MPI's exchange of it and the
   copies back to the members stay in cache; the next chunk's local sum is
   computed while the current chunk's exchange is in flight. */
static dpar_status dpar__mpi_allreduce_f32(dpar_ctx *ctx, dpar__group *g, const dpar__coll *c, const uint64_t *dlp,
                                           const char *what) {
    dpar_runtime *rt = ctx->rt;
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    dpar__mpi_group *mg = (dpar__mpi_group *)g->mpi;
    const int n = g->n;
    uint64_t job = rt->job_count, seq = g->seq;
    int64_t cnt = c->count;
    MPI_Request req = MPI_REQUEST_NULL;
    dpar_status s;
    enum { CH = 1 << 18 };
    const char *src[DPAR_MAX_DEVICES], *sp[DPAR_MAX_DEVICES];
    char *dst[DPAR_MAX_DEVICES];
    int nl = 0;
    for (int r = 0; r < n; r++)
        if (dpar__is_local(rt, g->devices[r])) {
            src[nl] = (const char *)g->in_ptr[r];
            dst[nl++] = (char *)g->out_ptr[r];
        }
    float *acc = (float *)mg->xbuf;
    MPI_Op op = c->op == DPAR_MAX ? mp->op_max : c->op == DPAR_MIN ? mp->op_min : MPI_SUM;
    dpar_reduce_op lop = c->op == DPAR_MEAN ? DPAR_SUM : c->op;
    int64_t nch = cnt ? (cnt + CH - 1) / CH : 1;
    for (int64_t k = 0; k < nch; k++) {
        int64_t off = k * CH, len = cnt - off < CH ? cnt - off : CH;
        if (k == 0 && len) { /* ordinary stores: MPI reads acc back at once */
            char *a0 = (char *)acc;
            dpar__reduce_span(DPAR_F32, lop, nl, src, &a0, 1, len, 0);
        }
        DPAR__MPI_CALL(mp, MPI_Iallreduce(MPI_IN_PLACE, acc + off, (int)len, MPI_FLOAT, op, mg->comm, &req));
        if (k + 1 < nch) { /* overlap: the next chunk's local part */
            int64_t o2 = off + CH, l2 = cnt - o2 < CH ? cnt - o2 : CH;
            char *a2 = (char *)(acc + o2);
            for (int j = 0; j < nl; j++) sp[j] = src[j] + o2 * 4;
            dpar__reduce_span(DPAR_F32, lop, nl, sp, &a2, 1, l2, 0);
        }
        if ((s = dpar__mpi_data_wait(ctx, mg, &req, dlp, what, job, seq))) return s;
        if (c->op == DPAR_MEAN)
            for (int64_t i = off; i < off + len; i++) acc[i] /= (float)n;
        for (int j = 0; j < nl; j++)
            if (len) memcpy(dst[j] + off * 4, acc + off, (size_t)len * 4);
    }
    return DPAR_OK;
}

/* After the data phase: the result to the local members' host views
   (all-reduce: converted and divided for a mean; broadcast: copied; the
   gathers: every member's input as seen by this process, in g->xin_ptr). */
static void dpar__mpi_coll_out(dpar_runtime *rt, dpar__group *g, const dpar__coll *c, size_t inbytes) {
    dpar__mpi_group *mg = (dpar__mpi_group *)g->mpi;
    const int n = g->n;
    if (c->kind == DPAR__COLL_ALL_REDUCE) {
        for (int rr = 0; rr < n; rr++) {
            if (!dpar__is_local(rt, g->devices[rr])) continue;
            char *o = (char *)g->out_ptr[rr];
            for (int64_t i = 0; i < c->count; i++) {
                if (c->dtype == DPAR_I32) {
                    int64_t v = ((int64_t *)mg->xbuf)[i];
                    if (c->op == DPAR_MEAN) v /= n;
                    ((int32_t *)o)[i] = (int32_t)(uint32_t)(uint64_t)v;
                } else {
                    float v = ((float *)mg->xbuf)[i];
                    if (c->op == DPAR_MEAN) v /= (float)n;
                    if (c->dtype == DPAR_F32)
                        ((float *)o)[i] = v;
                    else
                        ((uint16_t *)o)[i] = c->dtype == DPAR_F16 ? dpar_f32_to_f16(v) : dpar_f32_to_bf16(v);
                }
            }
        }
    } else if (c->kind == DPAR__COLL_BROADCAST) {
        const char *buf = mg->xbuf;
        for (int rr = 0; rr < n; rr++)
            if (dpar__is_local(rt, g->devices[rr]) && g->out_ptr[rr] != buf && inbytes)
                memcpy(g->out_ptr[rr], buf, inbytes);
    } else {
        for (int rr = 0; rr < n; rr++)
            g->xin_ptr[rr] = mg->xrecv + mg->rdispls[mg->cr_of[rr]] + (size_t)mg->slot_of[rr] * inbytes;
    }
}

/* The cross-process part of one collective on the host path, run by the
   group's leader on each process; the local members' host views are in
   g->in_ptr/out_ptr. */
static dpar_status dpar__mpi_coll(dpar_ctx *ctx, dpar__group *g, dpar__coll *c, const char *what) {
    dpar_runtime *rt = ctx->rt;
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    dpar__mpi_group *mg = (dpar__mpi_group *)g->mpi;
    const int n = g->n;
    uint64_t job = rt->job_count, seq = g->seq;
    uint64_t dl = dpar__deadline(rt->timeout_ms);
    dpar_status s = dpar__mpi_describe(ctx, g, what, &dl);
    if (s) return s;
    /* 2. the data */
    size_t es = dpar_dtype_size(c->dtype);
    size_t inbytes = (size_t)c->count * es;
    MPI_Request req = MPI_REQUEST_NULL;
    if (c->kind == DPAR__COLL_ALL_REDUCE) {
        int64_t cnt = c->count;
        if (cnt > INT32_MAX)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: %lld elements exceed MPI's int count", what,
                             (long long)cnt);
        size_t need = (size_t)cnt * 8 + 8;
        if (!dpar__grow((void **)&mg->xbuf, &mg->xcap, need))
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
        int first = 1;
        if (c->dtype == DPAR_I32) {
            int64_t *acc = (int64_t *)mg->xbuf;
            for (int r = 0; r < n; r++) {
                if (!dpar__is_local(rt, g->devices[r])) continue;
                const int32_t *p = (const int32_t *)g->in_ptr[r];
                for (int64_t i = 0; i < cnt; i++) {
                    int64_t v = p[i];
                    if (first)
                        acc[i] = v;
                    else if (c->op == DPAR_MAX)
                        acc[i] = v > acc[i] ? v : acc[i];
                    else if (c->op == DPAR_MIN)
                        acc[i] = v < acc[i] ? v : acc[i];
                    else
                        acc[i] += v;
                }
                first = 0;
            }
            MPI_Op op = c->op == DPAR_MAX ? MPI_MAX : c->op == DPAR_MIN ? MPI_MIN : MPI_SUM;
            DPAR__MPI_CALL(mp, MPI_Iallreduce(MPI_IN_PLACE, acc, (int)cnt, MPI_INT64_T, op, mg->comm, &req));
        } else if (c->dtype == DPAR_F32) {
            return dpar__mpi_allreduce_f32(ctx, g, c, &dl, what);
        } else {
            float *acc = (float *)mg->xbuf;
            for (int r = 0; r < n; r++) {
                if (!dpar__is_local(rt, g->devices[r])) continue;
                for (int64_t i = 0; i < cnt; i++) {
                    float v = dpar__load_f(g->in_ptr[r], c->dtype, i);
                    if (first)
                        acc[i] = v;
                    else if (c->op == DPAR_MAX)
                        acc[i] = (v > acc[i] || v != v) ? v : acc[i];
                    else if (c->op == DPAR_MIN)
                        acc[i] = (v < acc[i] || v != v) ? v : acc[i];
                    else
                        acc[i] += v;
                }
                first = 0;
            }
            MPI_Op op = c->op == DPAR_MAX ? mp->op_max : c->op == DPAR_MIN ? mp->op_min : MPI_SUM;
            DPAR__MPI_CALL(mp, MPI_Iallreduce(MPI_IN_PLACE, acc, (int)cnt, MPI_FLOAT, op, mg->comm, &req));
        }
    } else if (c->kind == DPAR__COLL_BROADCAST) {
        int cr = mg->cr_of[c->root];
        if (inbytes > (size_t)INT32_MAX)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: %zu bytes exceed MPI's int count", what, inbytes);
        if (!dpar__grow((void **)&mg->xbuf, &mg->xcap, inbytes + 8))
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
        /* the root sends a copy: MPI only ever holds mg's buffers (see mg->abandoned) */
        if (cr == mg->me && inbytes) memcpy(mg->xbuf, g->in_ptr[c->root], inbytes);
        DPAR__MPI_CALL(mp, MPI_Ibcast(mg->xbuf, (int)inbytes, MPI_BYTE, cr, mg->comm, &req));
    } else {
        size_t total = inbytes * (size_t)n;
        if (total > (size_t)INT32_MAX)
            return dpar__err(DPAR_ERR_INVALID_ARGUMENT, "%s: %zu bytes exceed MPI's int count", what, total);
        if (!dpar__grow((void **)&mg->xbuf, &mg->xcap, inbytes * (size_t)g->nlocal + 8) ||
            !dpar__grow((void **)&mg->xrecv, &mg->xrcap, total + 8))
            return dpar__err(DPAR_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
        size_t at = 0;
        for (int r = 0; r < n; r++)
            if (dpar__is_local(rt, g->devices[r])) {
                if (inbytes) memcpy(mg->xbuf + at, g->in_ptr[r], inbytes);
                at += inbytes;
            }
        int disp = 0;
        for (int q = 0; q < mg->nprocs; q++) {
            mg->rcounts[q] = (int)((size_t)mg->nmem[q] * inbytes);
            mg->rdispls[q] = disp;
            disp += mg->rcounts[q];
        }
        DPAR__MPI_CALL(mp, MPI_Iallgatherv(mg->xbuf, (int)at, MPI_BYTE, mg->xrecv, mg->rcounts, mg->rdispls, MPI_BYTE,
                                           mg->comm, &req));
    }
    if ((s = dpar__mpi_data_wait(ctx, mg, &req, &dl, what, job, seq))) return s;
    dpar__mpi_coll_out(rt, g, c, inbytes); /* the result to the local members */
    return DPAR_OK;
}

/* At the end of a dispatch: tell the other processes of every cross-process
   group that this process's devices returned (so an uneven step count is
   named at once instead of timing out). */
static void dpar__mpi_job_end(dpar_mesh *m, dpar__job *job) {
    dpar_runtime *rt = m->rt;
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    (void)job;
    if (!mp || mp->broken) return;
    for (int k = 1; k < DPAR__GROUP_KEYS; k++)
        for (int g = 0; g < m->ngroups[k]; g++) {
            dpar__group *gr = &m->groups[k][g];
            dpar__mpi_group *mg = (dpar__mpi_group *)gr->mpi;
            if (!mg) continue;
            dpar__mpi_msg mm;
            dpar__mpi_fill_msg(&mm, NULL, rt->job_count, gr->seq, 1);
            dpar__mpi_send_all(mp, mg, &mm);
        }
}

static void dpar__mpi_mark_broken(dpar_runtime *rt, const char *why) {
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    if (!mp) return;
    if (!mp->broken_why[0]) snprintf(mp->broken_why, sizeof mp->broken_why, "%s", why);
    mp->broken = 1;
}
/* Before a dispatch: did another process give up waiting for this one at the
   end of an earlier dispatch? Is the runtime out of step? Then fail at once,
   on every process, instead of running into timeouts again. */
/* A "gave up waiting for you at the end of pmap #job" notice from another
   process, if one came: 1 and got[] = { job, process }. */
static int dpar__mpi_take_notice(dpar__mpi *mp, int got[2]) {
    int flag = 0;
    MPI_Status st;
    dpar__mutex_lock(&mp->mu);
    /* a probe that finds nothing makes progress afterwards: ask a few times */
    for (int i = 0; i < 3 && !flag; i++) MPI_Iprobe(MPI_ANY_SOURCE, DPAR__MPI_TAG_GAVE_UP, mp->comm, &flag, &st);
    if (flag) MPI_Recv(got, 2, MPI_INT, st.MPI_SOURCE, DPAR__MPI_TAG_GAVE_UP, mp->comm, MPI_STATUS_IGNORE);
    dpar__mutex_unlock(&mp->mu);
    return flag;
}
static dpar_status dpar__mpi_out_of_step(dpar_runtime *rt) {
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    if (!mp) return DPAR_OK;
    int got[2] = { 0, 0 };
    if (dpar__mpi_take_notice(mp, got)) {
        char why[160];
        snprintf(why, sizeof why, "process %d gave up waiting for this one at the end of pmap #%d (DPAR_TIMEOUT_MS)",
                 got[1], got[0]);
        dpar__mpi_mark_broken(rt, why);
    }
    if (!mp->broken) return DPAR_OK;
    return dpar__err(DPAR_ERR_STATE,
                     "pmap #%llu: the processes are out of step (%s); destroy the runtime (dpar_runtime_destroy) on "
                     "every process",
                     (unsigned long long)rt->job_count + 1,
                     mp->broken_why[0] ? mp->broken_why
                                       : "an earlier collective or dispatch across processes failed or timed out");
}

/* Gives up on this dispatch's agreement: the processes are out of step, and the others are told (a
   late one reads the notice before it joins an agreement of its own). */
static void dpar__mpi_agree_abandon(dpar_runtime *rt, dpar__mpi *mp) {
    mp->broken = 1;
    mp->agree_abandoned = 1;
    mp->keep = 1;
    mp->agree_notice[0] = (int)rt->job_count;
    mp->agree_notice[1] = rt->proc;
    dpar__mutex_lock(&mp->mu);
    for (int q = 0; q < mp->size; q++) {
        MPI_Request nr = MPI_REQUEST_NULL;
        if (q != rt->proc &&
            MPI_Isend(mp->agree_notice, 2, MPI_INT, q, DPAR__MPI_TAG_GAVE_UP, mp->comm, &nr) == MPI_SUCCESS)
            MPI_Request_free(&nr);
    }
    dpar__mutex_unlock(&mp->mu);
}

/* At the end of a dispatch every process learns whether any process failed,
   so the same pmap returns an error everywhere (the lowest failing process's
   error is adopted by the processes that did not fail themselves, or whose
   errors only follow from another's: dpar__err_secondary). */
static void dpar__mpi_job_agree(dpar_runtime *rt, dpar__job *job) {
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    if (!mp || mp->size < 2) return;
    if (mp->agree_abandoned) { /* an earlier agreement was given up on: its buffers may still be written */
        if (!job->first_status) {
            job->first_status = DPAR_ERR_STATE;
            job->first_device = -1;
            snprintf(job->first_msg, sizeof job->first_msg,
                     "the processes are out of step since an earlier dispatch timed out; "
                     "destroy the runtime on every process");
        }
        return;
    }
    int got[2] = { 0, 0 };
    if (dpar__mpi_take_notice(mp, got)) {
        /* the others gave up on this dispatch's agreement already: joining it
           now would match their abandoned one (and read as a success) */
        char why[160];
        snprintf(why, sizeof why, "process %d gave up waiting for this one at the end of pmap #%d (DPAR_TIMEOUT_MS)",
                 got[1], got[0]);
        dpar__mpi_mark_broken(rt, why);
        mp->agree_abandoned = 1;
        if (!job->first_status) {
            job->first_status = DPAR_ERR_TIMEOUT;
            job->first_device = -1;
            snprintf(job->first_msg, sizeof job->first_msg,
                     "pmap #%llu: process %d gave up waiting for this process to finish the "
                     "dispatch (it came more than 2 x DPAR_TIMEOUT_MS = %d ms later); the processes are out of step: "
                     "destroy the runtime "
                     "on every process",
                     (unsigned long long)rt->job_count, got[1], 2 * rt->timeout_ms);
        }
        return;
    }
    if (mp->waited_out_job == rt->job_count && job->first_status) {
        /* a collective of this dispatch already waited the whole timeout for another process, which is
           that late at least: waiting for it again here would report the error after 3x the timeout */
        dpar__mpi_agree_abandon(rt, mp);
        return;
    }
    /* a failed process's own error first, then one that follows from another's, then none */
    mp->agree_mine[0] = !job->first_status ? 2 * rt->nproc : job->first_secondary ? rt->nproc + rt->proc : rt->proc;
    mp->agree_mine[1] = -mp->broken; /* so that every process knows it must be destroyed */
    mp->agree_lowest[0] = 2 * rt->nproc;
    mp->agree_lowest[1] = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    dpar__mutex_lock(&mp->mu);
    int rc = MPI_Iallreduce(mp->agree_mine, mp->agree_lowest, 2, MPI_INT, MPI_MIN, mp->comm, &req);
    dpar__mutex_unlock(&mp->mu);
    uint64_t dl = dpar__deadline(rt->timeout_ms * 2);
    if (rc != MPI_SUCCESS || dpar__mpi_poll(mp, &req, &dl, NULL, 0) != 1) {
        dpar__mpi_agree_abandon(rt, mp);
        if (!job->first_status) {
            job->first_status = DPAR_ERR_TIMEOUT;
            job->first_device = rt->local_base;
            snprintf(job->first_msg, sizeof job->first_msg,
                     "pmap #%llu: the other processes did not finish this dispatch within %d ms "
                     "(DPAR_TIMEOUT_MS); every process must run the same dispatches",
                     (unsigned long long)rt->job_count, 2 * rt->timeout_ms);
        }
        return;
    }
    int lowest = mp->agree_lowest[0] % rt->nproc, primary = mp->agree_lowest[0] < rt->nproc;
    if (mp->agree_lowest[1] < 0) mp->broken = 1;      /* some process is out of step: so is this one */
    if (mp->agree_lowest[0] >= 2 * rt->nproc) return; /* everyone succeeded */
    memset(&mp->agree_e, 0, sizeof mp->agree_e);
    if (lowest == rt->proc) {
        mp->agree_e.status = (int)job->first_status;
        mp->agree_e.device = job->first_device;
        memcpy(mp->agree_e.msg, job->first_msg, sizeof mp->agree_e.msg);
    }
    req = MPI_REQUEST_NULL;
    dpar__mutex_lock(&mp->mu);
    rc = MPI_Ibcast(&mp->agree_e, (int)sizeof mp->agree_e, MPI_BYTE, lowest, mp->comm, &req);
    dpar__mutex_unlock(&mp->mu);
    int st = DPAR_ERR_TIMEOUT, dev = -1;
    char msg[DPAR__ERR_LEN];
    if (rc != MPI_SUCCESS ||
        dpar__mpi_poll(mp, &req, &dl, NULL, 0) != 1) { /* the failing process gave up waiting for us */
        mp->broken = 1;
        mp->agree_abandoned = 1;
        mp->keep = 1;
        snprintf(msg, sizeof msg,
                 "pmap #%llu failed on process %d, which stopped waiting for this one (DPAR_TIMEOUT_MS)",
                 (unsigned long long)rt->job_count, lowest);
    } else {
        st = mp->agree_e.status;
        dev = mp->agree_e.device;
        memcpy(msg, mp->agree_e.msg, sizeof msg);
        msg[sizeof msg - 1] = 0;
    }
    if (!job->first_status || (job->first_secondary && primary && lowest != rt->proc)) {
        job->first_status = (dpar_status)st;
        job->first_device = dev;
        job->first_secondary = 0;
        if (dev >= 0) /* the error is prefixed with the device and its process */
            snprintf(job->first_msg, sizeof job->first_msg, "%s", msg);
        else
            snprintf(job->first_msg, sizeof job->first_msg, "(failed on process %d) %s", lowest, msg);
    }
}

/* Waits (up to the timeout) for a small collective of dpar_array_get that every process must call; on a
   timeout the processes are out of step (the others are told, mp's buffers kept for MPI). */
static dpar_status dpar__mpi_share_wait(dpar_runtime *rt, dpar__mpi *mp, MPI_Request *req, int rc, const char *what) {
    uint64_t dl = dpar__deadline(rt->timeout_ms);
    if (rc == MPI_SUCCESS && dpar__mpi_poll(mp, req, &dl, NULL, 0) == 1) return DPAR_OK;
    dpar__mpi_agree_abandon(rt, mp);
    char why[160];
    snprintf(why, sizeof why, "dpar_array_get timed out waiting for another process (%s)", what);
    dpar__mpi_mark_broken(rt, why);
    snprintf(mp->broken_why, sizeof mp->broken_why, "%s", why);
    return dpar__err(DPAR_ERR_TIMEOUT,
                     "dpar_array_get: timed out after %d ms waiting for the other processes (%s): every process must "
                     "call dpar_array_get on the same array, in the same order (DPAR_TIMEOUT_MS sets the timeout); "
                     "the processes are out of step: destroy the runtime on every process",
                     rt->timeout_ms, what);
}
/* The process `owner` shares `n` bytes (and its status) with every process. The processes first agree
   (within the timeout) that they all share n bytes from `owner`, so that a process that skips the get, or
   reads an array of another shape or spec, gives an error on every process instead of a hang or an
   MPI abort. */
static dpar_status dpar__mpi_share(dpar_runtime *rt, void *buf, size_t n, int owner, dpar_status st) {
    dpar__mpi *mp = (dpar__mpi *)rt->mpi;
    if (!mp) return st;
    if (dpar__mpi_out_of_step(rt))
        return dpar__err(DPAR_ERR_STATE,
                         "dpar_array_get: the processes are out of step (%s); destroy the runtime "
                         "(dpar_runtime_destroy) on every process",
                         mp->broken_why[0] ? mp->broken_why : "an earlier call across processes failed or timed out");
    mp->share_mine[0] = (int64_t)n, mp->share_mine[1] = -(int64_t)n;
    mp->share_mine[2] = owner, mp->share_mine[3] = -owner;
    MPI_Request req = MPI_REQUEST_NULL;
    dpar__mutex_lock(&mp->mu);
    int rc = MPI_Iallreduce(mp->share_mine, mp->share_max, 4, MPI_INT64_T, MPI_MAX, mp->comm, &req);
    dpar__mutex_unlock(&mp->mu);
    dpar_status w = dpar__mpi_share_wait(rt, mp, &req, rc, "the shard's size");
    if (w) return w;
    if (mp->share_max[0] != -mp->share_max[1] || mp->share_max[2] != -mp->share_max[3])
        return dpar__err(DPAR_ERR_COLLECTIVE_MISMATCH,
                         "dpar_array_get: the processes read different arrays: this process reads a shard of %zu bytes "
                         "from process %d, the processes %lld to %lld bytes from processes %lld to %lld; every process "
                         "must call dpar_array_get on the same array (dtype, global shape and spec), in the same order",
                         n, owner, (long long)-mp->share_max[1], (long long)mp->share_max[0],
                         (long long)-mp->share_max[3], (long long)mp->share_max[2]);
    mp->share_status = (int)st;
    req = MPI_REQUEST_NULL;
    dpar__mutex_lock(&mp->mu);
    rc = MPI_Ibcast(&mp->share_status, 1, MPI_INT, owner, mp->comm, &req);
    dpar__mutex_unlock(&mp->mu);
    w = dpar__mpi_share_wait(rt, mp, &req, rc, "the shard's status");
    if (w) return w;
    int v = mp->share_status;
    if (v) {
        if (owner == rt->proc) return (dpar_status)v;
        return dpar__err((dpar_status)v, "dpar_array_get: process %d could not read its shard", owner);
    }
    for (size_t at = 0; at < n;) {
        size_t chunk = n - at > ((size_t)1 << 30) ? ((size_t)1 << 30) : n - at;
        DPAR__MPI_CALL(mp, MPI_Bcast((char *)buf + at, (int)chunk, MPI_BYTE, owner, mp->comm));
        at += chunk;
    }
    return DPAR_OK;
}

/* dpar_runtime_create failed on this process before meeting the others:
   meet them with the failure, so that they return an error too instead of
   waiting in MPI forever */
static void dpar__mpi_runtime_failed(const dpar_runtime_desc *desc, dpar_status s) {
    char msg[DPAR__ERR_LEN];
    memcpy(msg, dpar__err_text, sizeof msg);
    dpar_runtime tmp;
    memset(&tmp, 0, sizeof tmp);
    if (dpar__mpi_runtime_pre(&tmp, desc) == DPAR_OK) dpar__mpi_runtime_init(&tmp, s);
    dpar__mpi_runtime_free(&tmp);
    dpar__err(s, "%s", msg);
}
static void dpar__mpi_dispatch_end(dpar_mesh *m, dpar__job *job, dpar_status late) {
    if (late) dpar__mpi_mark_broken(m->rt, "a device's NCCL communicator timed out or failed");
    dpar__mpi_job_end(m, job);
    dpar__mpi_job_agree(m->rt, job);
}

static const dpar__transport *dpar__transport_get(void) {
    static const dpar__transport mpi = { dpar__mpi_runtime_pre,    dpar__mpi_runtime_init, dpar__mpi_runtime_free,
                                         dpar__mpi_runtime_failed, dpar__mpi_mesh_init,    dpar__mpi_mesh_free,
                                         dpar__mpi_out_of_step,    dpar__mpi_dispatch_end, dpar__mpi_coll_agree,
                                         dpar__mpi_group_xid,      dpar__mpi_coll,         dpar__mpi_share };
    return &mpi;
}

#endif /* DPAR_MPI_TRANSPORT_INCLUDED */
