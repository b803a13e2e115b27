/* Self-test of the mock NCCL across processes (run by tests/test_cuda_mock.sh
   against tests/cuda_mock/mock_cuda.cc, linked directly, MOCK_CUDA_GPUS=4):
   fork()ed processes holding 1 or 2 ranks each build one communicator with
   ncclGetUniqueId (in the process holding rank 0; the id travels through a
   pipe, as it would by MPI_Bcast) and ncclCommInitRank (a process with two
   ranks initializes both from one thread inside ncclGroupStart/End), then
   check every collective with exact data (small integers in f32, f16 and
   bf16; i32 with wrap-around): all-reduce sum/avg/max/min (max/min ignore
   NaN, as NCCL), broadcast from the last rank, all-gather and reduce-scatter
   (in place too), a grouped send/recv ring (two messages per pair, matched
   in order; 64 MB each way with 2 ranks). Also: CUDA_VISIBLE_DEVICES and
   cuDeviceGetUuid, two ranks on one physical GPU and one rank joining twice
   (ncclInvalidUsage), a missing rank (the init fails after
   MOCK_NCCL_TIMEOUT_MS), a collective whose peer never comes (asynchronous
   error), ncclCommAbort ending a wait, and nothing left in /dev/shm.
   Prints PASS name / FAIL name: why; exits 1 on any failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct {
    char bytes[16];
} CUuuid;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef void *ncclComm_t;
CUresult cuInit(unsigned flags);
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice d);
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d);
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d);
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d);
CUresult cuCtxSetCurrent(CUcontext c);
CUresult cuStreamCreate(CUstream *s, unsigned flags);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s);
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
int ncclCommDestroy(ncclComm_t c);
int ncclCommAbort(ncclComm_t c);
int ncclCommGetAsyncError(ncclComm_t c, int *e);
int ncclAllReduce(const void *s, void *r, size_t count, int t, int op, ncclComm_t c, CUstream st);
int ncclBroadcast(const void *s, void *r, size_t count, int t, int root, ncclComm_t c, CUstream st);
int ncclAllGather(const void *s, void *r, size_t count, int t, ncclComm_t c, CUstream st);
int ncclReduceScatter(const void *s, void *r, size_t count, int t, int op, ncclComm_t c, CUstream st);
int ncclSend(const void *b, size_t count, int t, int peer, ncclComm_t c, CUstream st);
int ncclRecv(void *b, size_t count, int t, int peer, ncclComm_t c, CUstream st);
int ncclGroupStart(void);
int ncclGroupEnd(void);

enum { I32 = 2, F16 = 6, F32 = 7, BF16 = 9 };
enum { SUM = 0, MAX = 2, MIN = 3, AVG = 4 };
static const char *tname(int t) {
    return t == I32 ? "i32" : t == F16 ? "f16" : t == F32 ? "f32" : "bf16";
}
static const char *oname(int op) {
    return op == SUM ? "sum" : op == MAX ? "max" : op == MIN ? "min" : "avg";
}

/* ---- one process of a communicator ------------------------------------- */
typedef struct {
    const char *cfg;
    int n, nl, rank[2];
    CUdevice dev[2];
    CUcontext ctx[2];
    CUstream st[2];
    ncclComm_t comm[2];
    int fails;
} child;

static void fail(child *c, const char *check, int rank, const char *fmt, ...) {
    va_list ap;
    char msg[300];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("FAIL xproc_%s: %s: rank %d: %s\n", c->cfg, check, rank, msg);
    c->fails++;
}
static void die(const char *what, int r) {
    printf("FAIL xproc: %s returned %d\n", what, r);
    exit(2);
}
#define CK(call)                \
    do {                        \
        int r_ = (call);        \
        if (r_) die(#call, r_); \
    } while (0)

static CUdeviceptr dalloc(child *c, int l, size_t bytes) {
    CUdeviceptr p = 0;
    CK(cuCtxSetCurrent(c->ctx[l]));
    CK(cuMemAlloc_v2(&p, bytes ? bytes : 1));
    return p;
}
static void dfree(child *c, int l, CUdeviceptr p) {
    CK(cuCtxSetCurrent(c->ctx[l]));
    CK(cuMemFree_v2(p));
}
static void h2d(child *c, int l, CUdeviceptr d, const void *h, size_t n) {
    CK(cuCtxSetCurrent(c->ctx[l]));
    CK(cuMemcpyHtoDAsync_v2(d, h, n, c->st[l]));
}
static void d2h(child *c, int l, void *h, CUdeviceptr d, size_t n) {
    CK(cuCtxSetCurrent(c->ctx[l]));
    CK(cuMemcpyDtoHAsync_v2(h, d, n, c->st[l]));
    CK(cuStreamSynchronize(c->st[l]));
}
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("FAIL xproc: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* exact encodings of small integers */
static size_t esize(int t) {
    return t == F16 || t == BF16 ? 2 : 4;
}
static uint16_t f16_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if (f == 0) return (uint16_t)((b >> 16) & 0x8000);
    return (uint16_t)(((b >> 16) & 0x8000) | ((((b >> 23) & 0xff) - 127 + 15) << 10) | ((b >> 13) & 0x3ff));
}
static void put(void *p, int t, size_t i, double v) {
    float f = (float)v;
    uint32_t b;
    switch (t) {
    case F32: ((float *)p)[i] = f; break;
    case I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case F16: ((uint16_t *)p)[i] = f16_of(f); break;
    default:
        memcpy(&b, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(b >> 16);
        break;
    }
}
static int compare(child *c, const char *check, int rank, const void *got, const void *want, size_t count, int t) {
    size_t es = esize(t);
    for (size_t i = 0; i < count; i++)
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) {
            uint32_t g = 0, w = 0;
            memcpy(&g, (const char *)got + i * es, es);
            memcpy(&w, (const char *)want + i * es, es);
            fail(c, check, rank, "element %zu of %zu: got 0x%x, want 0x%x", i, count, g, w);
            return 1;
        }
    return 0;
}

/* all-reduce inputs: small integers; avg inputs sum to n * base exactly */
static double ar_in(int op, int n, int r, size_t i) {
    if (op == AVG) {
        int k = (int)(i % 3) - 1;
        return (double)((int)(i % 11) - 5) + (r == 0 ? -(n - 1) * k : k);
    }
    return (double)((int)((i * 7 + (size_t)r * 3) % 13) - 6);
}
/* reads every local rank's output r (count elements of t), compares it with
   want, frees r and, unless in place (then s is r or lies inside it), s */
static void collect(child *c, const char *check, CUdeviceptr *s, CUdeviceptr *r, int inplace, unsigned char *out,
                    const unsigned char *want, size_t count, int t) {
    for (int l = 0; l < c->nl; l++) {
        d2h(c, l, out, r[l], count * esize(t));
        compare(c, check, c->rank[l], out, want, count, t);
        dfree(c, l, r[l]);
        if (!inplace) dfree(c, l, s[l]);
    }
}
static void check_allreduce(child *c, int t, int op, size_t count) {
    char check[64];
    size_t es = esize(t), b = count * es;
    int inplace = op == MIN, wrap = t == I32 && op == SUM, nanr = t == F32 && (op == MAX || op == MIN) ? c->n - 1 : -1;
    CUdeviceptr s[2], r[2];
    unsigned char *in = xmalloc(b), *out = xmalloc(b), *want = xmalloc(b);
    snprintf(check, sizeof check, "all-reduce %s %s%s", oname(op), tname(t), inplace ? " in place" : "");
    for (int l = 0; l < c->nl; l++) {
        int rk = c->rank[l];
        s[l] = dalloc(c, l, b);
        r[l] = inplace ? s[l] : dalloc(c, l, b);
        for (size_t i = 0; i < count; i++) {
            if (wrap)
                ((uint32_t *)in)[i] = 0x7fff0000u + (uint32_t)(i * 977 + (size_t)rk * 131071);
            else
                put(in, t, i, ar_in(op, c->n, rk, i));
        }
        if (rk == nanr) ((float *)in)[0] = NAN;
        h2d(c, l, s[l], in, b);
        int e = ncclAllReduce((void *)(uintptr_t)s[l], (void *)(uintptr_t)r[l], count, t, op, c->comm[l], c->st[l]);
        if (e) fail(c, check, rk, "ncclAllReduce returned %d", e);
    }
    for (size_t i = 0; i < count; i++) {
        if (wrap) {
            uint32_t acc = 0;
            for (int q = 0; q < c->n; q++) acc += 0x7fff0000u + (uint32_t)(i * 977 + (size_t)q * 131071);
            ((uint32_t *)want)[i] = acc;
            continue;
        }
        double acc = op == AVG ? (double)((int)(i % 11) - 5) : 0;
        int first = 1;
        for (int q = 0; q < c->n && op != AVG; q++) {
            double v = ar_in(op, c->n, q, i);
            if (q == nanr && i == 0) continue; /* NaN: ignored by max/min */
            if (op == SUM)
                acc += v;
            else if (first || (op == MAX ? v > acc : v < acc))
                acc = v;
            first = 0;
        }
        put(want, t, i, acc);
    }
    collect(c, check, s, r, inplace, out, want, count, t);
    free(in);
    free(out);
    free(want);
}

static void check_broadcast(child *c, int t, size_t count, int inplace) {
    char check[64];
    size_t b = count * esize(t);
    int root = c->n - 1;
    CUdeviceptr s[2], r[2];
    unsigned char *in = xmalloc(b), *out = xmalloc(b), *want = xmalloc(b);
    snprintf(check, sizeof check, "broadcast %s from rank %d%s", tname(t), root, inplace ? " in place" : "");
    for (int l = 0; l < c->nl; l++) {
        int rk = c->rank[l];
        s[l] = dalloc(c, l, b);
        r[l] = inplace ? s[l] : dalloc(c, l, b);
        for (size_t i = 0; i < count; i++) put(in, t, i, (double)((int)((i + (size_t)rk * 17) % 201) - 100));
        h2d(c, l, s[l], in, b);
        int e = ncclBroadcast((void *)(uintptr_t)s[l], (void *)(uintptr_t)r[l], count, t, root, c->comm[l], c->st[l]);
        if (e) fail(c, check, rk, "ncclBroadcast returned %d", e);
    }
    for (size_t i = 0; i < count; i++) put(want, t, i, (double)((int)((i + (size_t)root * 17) % 201) - 100));
    collect(c, check, s, r, inplace, out, want, count, t);
    free(in);
    free(out);
    free(want);
}

static double ag_in(int r, size_t i) {
    return (double)((int)(((size_t)r * 37 + i) % 201) - 100);
}
static void check_allgather(child *c, int t, size_t count, int inplace) {
    char check[64];
    size_t es = esize(t), b = count * es, bt = b * (size_t)c->n;
    CUdeviceptr s[2], r[2];
    unsigned char *in = xmalloc(b), *out = xmalloc(bt), *want = xmalloc(bt);
    snprintf(check, sizeof check, "all-gather %s%s", tname(t), inplace ? " in place" : "");
    for (int l = 0; l < c->nl; l++) {
        int rk = c->rank[l];
        r[l] = dalloc(c, l, bt);
        s[l] = inplace ? r[l] + (CUdeviceptr)(b * (size_t)rk) : dalloc(c, l, b);
        if (inplace) {
            memset(out, 0x7f, bt);
            h2d(c, l, r[l], out, bt);
        }
        for (size_t i = 0; i < count; i++) put(in, t, i, ag_in(rk, i));
        h2d(c, l, s[l], in, b);
        int e = ncclAllGather((void *)(uintptr_t)s[l], (void *)(uintptr_t)r[l], count, t, c->comm[l], c->st[l]);
        if (e) fail(c, check, rk, "ncclAllGather returned %d", e);
    }
    for (int q = 0; q < c->n; q++)
        for (size_t i = 0; i < count; i++) put(want, t, (size_t)q * count + i, ag_in(q, i));
    collect(c, check, s, r, inplace, out, want, count * (size_t)c->n, t);
    free(in);
    free(out);
    free(want);
}

static double rs_in(int r, size_t k) {
    return (double)((int)(((size_t)r * 5 + k * 3) % 9) - 4);
}
static void check_reducescatter(child *c, int t, int op, size_t count, int inplace) {
    char check[64];
    size_t es = esize(t), b = count * es, bt = b * (size_t)c->n;
    CUdeviceptr s[2], r[2];
    unsigned char *in = xmalloc(bt), *out = xmalloc(b), *want = xmalloc(b);
    snprintf(check, sizeof check, "reduce-scatter %s %s%s", oname(op), tname(t), inplace ? " in place" : "");
    for (int l = 0; l < c->nl; l++) {
        int rk = c->rank[l];
        s[l] = dalloc(c, l, bt);
        r[l] = inplace ? s[l] + (CUdeviceptr)(b * (size_t)rk) : dalloc(c, l, b);
        for (size_t k = 0; k < count * (size_t)c->n; k++) put(in, t, k, rs_in(rk, k));
        h2d(c, l, s[l], in, bt);
        int e = ncclReduceScatter((void *)(uintptr_t)s[l], (void *)(uintptr_t)r[l], count, t, op, c->comm[l], c->st[l]);
        if (e) fail(c, check, rk, "ncclReduceScatter returned %d", e);
    }
    for (int l = 0; l < c->nl; l++) {
        int rk = c->rank[l];
        for (size_t i = 0; i < count; i++) {
            size_t k = (size_t)rk * count + i;
            double acc = rs_in(0, k);
            for (int q = 1; q < c->n; q++) {
                double v = rs_in(q, k);
                acc = op == SUM ? acc + v : op == MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
            }
            put(want, t, i, acc);
        }
        d2h(c, l, out, r[l], b);
        compare(c, check, rk, out, want, count, t);
        dfree(c, l, s[l]);
        if (!inplace) dfree(c, l, r[l]);
    }
    free(in);
    free(out);
    free(want);
}

/* every rank sends two f32 messages to rank+1 and receives two from rank-1 */
static size_t ring_count(int big, int sender, int msg) {
    if (msg == 1) return 3 + (size_t)sender;
    return big ? ((size_t)64 << 20) / 4 : 70000 + 1000 * (size_t)sender; /* 64 MB; else > one ring */
}
static float ring_val(int sender, int msg, size_t i) {
    return (float)(((size_t)sender * 1000003u + (size_t)msg * 7919u + i) % 1000003u);
}
static void check_ring(child *c, int big) {
    const char *check = big ? "send/recv ring (64 MB each way)" : "send/recv ring";
    CUdeviceptr s[2][2], r[2][2];
    size_t maxc = ring_count(big, c->n - 1, 0);
    float *buf = xmalloc(maxc * 4);
    CK(ncclGroupStart());
    for (int l = 0; l < c->nl; l++) {
        int rk = c->rank[l], next = (rk + 1) % c->n, prev = (rk + c->n - 1) % c->n;
        for (int msg = 0; msg < 2; msg++) {
            size_t ns = ring_count(big, rk, msg), nr = ring_count(big, prev, msg);
            s[l][msg] = dalloc(c, l, ns * 4);
            r[l][msg] = dalloc(c, l, nr * 4);
            for (size_t i = 0; i < ns; i++) buf[i] = ring_val(rk, msg, i);
            h2d(c, l, s[l][msg], buf, ns * 4);
            int e1 = ncclSend((void *)(uintptr_t)s[l][msg], ns, F32, next, c->comm[l], c->st[l]);
            int e2 = ncclRecv((void *)(uintptr_t)r[l][msg], nr, F32, prev, c->comm[l], c->st[l]);
            if (e1 || e2) fail(c, check, rk, "ncclSend/ncclRecv returned %d/%d", e1, e2);
        }
    }
    int e = ncclGroupEnd();
    if (e) fail(c, check, c->rank[0], "ncclGroupEnd returned %d", e);
    for (int l = 0; l < c->nl; l++) {
        int rk = c->rank[l], prev = (rk + c->n - 1) % c->n;
        for (int msg = 0; msg < 2; msg++) {
            size_t nr = ring_count(big, prev, msg);
            d2h(c, l, buf, r[l][msg], nr * 4);
            for (size_t i = 0; i < nr; i++)
                if (buf[i] != ring_val(prev, msg, i)) {
                    fail(c, check, rk, "message %d from rank %d, element %zu of %zu: got %g, want %g", msg, prev, i, nr,
                         (double)buf[i], (double)ring_val(prev, msg, i));
                    break;
                }
            dfree(c, l, s[l][msg]);
            dfree(c, l, r[l][msg]);
        }
    }
    free(buf);
}

typedef struct {
    const char *name;
    int nproc, n, nl[3], rank[3][2], ord[3][2];
    const char *cvd[3];
    int big;
} config;
/* physical GPU == rank everywhere; CUDA_VISIBLE_DEVICES reorders some */
static const config configs[] = {
    { "p2_ranks_1+1", 2, 2, { 1, 1 }, { { 0 }, { 1 } }, { { 0 }, { 1 } }, { NULL, NULL }, 1 },
    { "p2_ranks_2+1", 2, 3, { 2, 1 }, { { 0, 2 }, { 1 } }, { { 1, 0 }, { 1 } }, { "2,0", NULL }, 0 },
    { "p3_ranks_1+2+1",
      3,
      4,
      { 1, 2, 1 },
      { { 0 }, { 1, 3 }, { 2 } },
      { { 0 }, { 1, 0 }, { 0 } },
      { NULL, "3,1", "2" },
      0 },
};

static void read_all(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)p + got, n - got);
        if (k <= 0) {
            printf("FAIL xproc: reading a pipe\n");
            exit(2);
        }
        got += (size_t)k;
    }
}
static void write_all(int fd, const void *p, size_t n) {
    if (write(fd, p, n) != (ssize_t)n) {
        printf("FAIL xproc: writing a pipe\n");
        exit(2);
    }
}

static int run_config(const config *cf, int p, int in_fd, const int *out_fds) {
    child c;
    ncclUniqueId id;
    char name[64], want[64];
    memset(&c, 0, sizeof c);
    c.cfg = cf->name;
    c.n = cf->n;
    c.nl = cf->nl[p];
    if (cf->cvd[p])
        setenv("CUDA_VISIBLE_DEVICES", cf->cvd[p], 1);
    else
        unsetenv("CUDA_VISIBLE_DEVICES");
    CK(cuInit(0));
    for (int l = 0; l < c.nl; l++) {
        c.rank[l] = cf->rank[p][l];
        CK(cuDeviceGet(&c.dev[l], cf->ord[p][l]));
        CK(cuDeviceGetName(name, sizeof name, c.dev[l]));
        snprintf(want, sizeof want, "Mock GPU %d", c.rank[l]);
        if (strcmp(name, want) != 0)
            fail(&c, "CUDA_VISIBLE_DEVICES", c.rank[l], "ordinal %d is \"%s\", want \"%s\"", cf->ord[p][l], name, want);
        CK(cuDevicePrimaryCtxRetain(&c.ctx[l], c.dev[l]));
        CK(cuCtxSetCurrent(c.ctx[l]));
        CK(cuStreamCreate(&c.st[l], 0));
    }
    if (c.rank[0] == 0) {
        CK(ncclGetUniqueId(&id));
        for (int q = 1; q < cf->nproc; q++) write_all(out_fds[q], &id, sizeof id);
    } else {
        read_all(in_fd, &id, sizeof id);
    }
    if (c.nl == 1) {
        CK(cuCtxSetCurrent(c.ctx[0]));
        int e = ncclCommInitRank(&c.comm[0], c.n, id, c.rank[0]);
        if (e) {
            fail(&c, "ncclCommInitRank", c.rank[0], "returned %d", e);
            return 1;
        }
    } else {
        CK(ncclGroupStart());
        for (int l = 0; l < c.nl; l++) {
            CK(cuCtxSetCurrent(c.ctx[l]));
            CK(ncclCommInitRank(&c.comm[l], c.n, id, c.rank[l]));
        }
        int e = ncclGroupEnd();
        if (e) {
            fail(&c, "ncclCommInitRank in a group", c.rank[0], "ncclGroupEnd returned %d", e);
            return 1;
        }
    }
    static const int types[] = { F32, I32, F16, BF16 }, ops[] = { SUM, AVG, MAX, MIN };
    for (int ti = 0; ti < 4; ti++)
        for (int oi = 0; oi < 4; oi++) check_allreduce(&c, types[ti], ops[oi], types[ti] == F32 ? 70000 : 5003);
    check_broadcast(&c, F32, 100000, 0);
    check_broadcast(&c, BF16, 1001, 1);
    check_allgather(&c, F32, 40000, 0);
    check_allgather(&c, F16, 777, 1);
    check_reducescatter(&c, F32, SUM, 30000, 0);
    check_reducescatter(&c, I32, MAX, 5000, 1);
    check_reducescatter(&c, BF16, SUM, 500, 0);
    check_ring(&c, cf->big);
    check_allreduce(&c, F32, SUM, 1); /* and the communicator still works after p2p */
    for (int l = 0; l < c.nl; l++) {
        int e = -1;
        ncclCommGetAsyncError(c.comm[l], &e);
        if (e) fail(&c, "ncclCommGetAsyncError", c.rank[l], "%d after the checks", e);
        CK(cuCtxSetCurrent(c.ctx[l]));
        CK(ncclCommDestroy(c.comm[l]));
        CK(cuStreamDestroy_v2(c.st[l]));
        CK(cuDevicePrimaryCtxRelease_v2(c.dev[l]));
    }
    return c.fails != 0;
}

/* ---- error cases --------------------------------------------------------- */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
static void setup1(child *c, const char *cfg, int ordinal) {
    memset(c, 0, sizeof *c);
    c->cfg = cfg;
    c->nl = 1;
    CK(cuInit(0));
    CK(cuDeviceGet(&c->dev[0], ordinal));
    CK(cuDevicePrimaryCtxRetain(&c->ctx[0], c->dev[0]));
    CK(cuCtxSetCurrent(c->ctx[0]));
    CK(cuStreamCreate(&c->st[0], 0));
}
static void teardown1(child *c) {
    CK(cuStreamDestroy_v2(c->st[0]));
    CK(cuDevicePrimaryCtxRelease_v2(c->dev[0]));
}
static void get_id(int rank, int in_fd, int out_fd, ncclUniqueId *id) {
    if (rank == 0) {
        CK(ncclGetUniqueId(id));
        write_all(out_fd, id, sizeof *id);
    } else
        read_all(in_fd, id, sizeof *id);
}
/* ncclCommInitRank with stderr captured; returns the result, *text the message */
static int init_captured(ncclComm_t *comm, int n, ncclUniqueId id, int rank, char *text, size_t len, double *ms) {
    FILE *tf = tmpfile();
    int saved = dup(2), r;
    size_t k;
    if (!tf || saved < 0) {
        printf("FAIL xproc: tmpfile/dup\n");
        exit(2);
    }
    fflush(stderr);
    dup2(fileno(tf), 2);
    double t0 = now_ms();
    r = ncclCommInitRank(comm, n, id, rank);
    *ms = now_ms() - t0;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tf);
    k = fread(text, 1, len - 1, tf);
    text[k] = 0;
    fclose(tf);
    return r;
}

/* ranks 0 and 1 on physical GPU 0 (rank 1 through CUDA_VISIBLE_DEVICES=0) */
static int run_same_gpu(int rank, int in_fd, int out_fd) {
    child c;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    char text[2048];
    double ms;
    if (rank == 1) setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    setup1(&c, "same_gpu_refused", 0);
    get_id(rank, in_fd, out_fd, &id);
    int r = init_captured(&comm, 2, id, rank, text, sizeof text, &ms);
    if (r != 5) fail(&c, "ncclCommInitRank", rank, "returned %d, want 5 (ncclInvalidUsage)", r);
    if (!strstr(text, "mock NCCL: ranks 0 and 1 on the same GPU 0"))
        fail(&c, "ncclCommInitRank", rank, "stderr lacks \"ranks 0 and 1 on the same GPU 0\": %s", text);
    if (ms > 5000) fail(&c, "ncclCommInitRank", rank, "took %.0f ms", ms);
    teardown1(&c);
    return c.fails != 0;
}
/* two processes both claim rank 0 */
static int run_rank_twice(int p, int in_fd, int out_fd) {
    child c;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    char text[2048];
    double ms;
    setup1(&c, "rank_joined_twice_refused", p);
    get_id(p, in_fd, out_fd, &id);
    int r = init_captured(&comm, 2, id, 0, text, sizeof text, &ms);
    if (r != 5) fail(&c, "ncclCommInitRank", 0, "process %d: returned %d, want 5 (ncclInvalidUsage)", p, r);
    if (ms > 5000) fail(&c, "ncclCommInitRank", 0, "took %.0f ms", ms);
    teardown1(&c);
    return c.fails != 0;
}
/* rank 1 never comes (MOCK_NCCL_TIMEOUT_MS=300) */
static int run_missing_rank(void) {
    child c;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    char text[2048];
    double ms;
    setenv("MOCK_NCCL_TIMEOUT_MS", "300", 1);
    setup1(&c, "missing_rank_fails_init", 0);
    CK(ncclGetUniqueId(&id));
    int r = init_captured(&comm, 2, id, 0, text, sizeof text, &ms);
    if (r != 2) fail(&c, "ncclCommInitRank", 0, "returned %d, want 2 (ncclSystemError)", r);
    if (ms < 250 || ms > 3000) fail(&c, "ncclCommInitRank", 0, "failed after %.0f ms, want about 300", ms);
    teardown1(&c);
    return c.fails != 0;
}
/* rank 1 runs a collective rank 0 never joins: an asynchronous error after
   MOCK_NCCL_TIMEOUT_MS; then on a second communicator ncclCommAbort ends a
   wait at once */
static int run_async_error(int rank, int in_fd, int out_fd, int done_in, int done_out) {
    child c;
    ncclUniqueId id1, id2;
    ncclComm_t a = NULL, b = NULL;
    float x[4] = { 1, 2, 3, 4 };
    char byte = 0;
    setup1(&c, "async_error_and_abort", rank);
    get_id(rank, in_fd, out_fd, &id1);
    get_id(rank, in_fd, out_fd, &id2);
    CK(ncclCommInitRank(&a, 2, id1, rank));
    CK(ncclCommInitRank(&b, 2, id2, rank));
    if (rank == 1) {
        CUdeviceptr d = dalloc(&c, 0, sizeof x);
        setenv("MOCK_NCCL_TIMEOUT_MS", "400", 1); /* (no stream runs NCCL work now) */
        h2d(&c, 0, d, x, sizeof x);
        double t0 = now_ms();
        CK(ncclAllReduce((void *)(uintptr_t)d, (void *)(uintptr_t)d, 4, F32, SUM, a, c.st[0]));
        CK(cuStreamSynchronize(c.st[0]));
        double ms = now_ms() - t0;
        int e = -1;
        ncclCommGetAsyncError(a, &e);
        if (e != 2) fail(&c, "timeout", 1, "ncclCommGetAsyncError gives %d, want 2", e);
        if (ms < 350 || ms > 5000) fail(&c, "timeout", 1, "the collective ended after %.0f ms, want about 400", ms);
        setenv("MOCK_NCCL_TIMEOUT_MS", "60000", 1);
        CK(ncclAllReduce((void *)(uintptr_t)d, (void *)(uintptr_t)d, 4, F32, SUM, b, c.st[0]));
        usleep(300 * 1000);
        t0 = now_ms();
        CK(ncclCommAbort(b));
        CK(cuStreamSynchronize(c.st[0]));
        ms = now_ms() - t0;
        if (ms > 2000) fail(&c, "ncclCommAbort", 1, "the waiting collective ended %.0f ms after the abort", ms);
        dfree(&c, 0, d);
        CK(ncclCommDestroy(a));
        write_all(done_out, &byte, 1);
    } else {
        read_all(done_in, &byte, 1);
        CK(ncclCommDestroy(a));
        CK(ncclCommDestroy(b));
    }
    teardown1(&c);
    return c.fails != 0;
}
/* CUDA_VISIBLE_DEVICES: physical ids; the list ends at the first invalid entry */
static int run_visible(int which, int in_fd, int out_fd) {
    child c;
    CUuuid u[4], v, v2;
    int n = -1;
    char name[64];
    memset(&c, 0, sizeof c);
    c.cfg = "visible_devices_and_uuids";
    if (which == 0) { /* all four: hands their uuids on */
        unsetenv("CUDA_VISIBLE_DEVICES");
        CK(cuInit(0));
        CK(cuDeviceGetCount(&n));
        if (n != 4) fail(&c, "cuDeviceGetCount", -1, "%d devices without CUDA_VISIBLE_DEVICES, want 4", n);
        for (int i = 0; i < 4; i++) CK(cuDeviceGetUuid_v2(&u[i], i));
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < i; j++)
                if (!memcmp(&u[i], &u[j], sizeof u[i]))
                    fail(&c, "cuDeviceGetUuid_v2", -1, "GPUs %d and %d share a uuid", i, j);
        write_all(out_fd, u, sizeof u);
    } else if (which == 1) {
        setenv("CUDA_VISIBLE_DEVICES", "3,1,7,2", 1);
        CK(cuInit(0));
        read_all(in_fd, u, sizeof u);
        CK(cuDeviceGetCount(&n));
        if (n != 2) fail(&c, "cuDeviceGetCount", -1, "%d devices with CUDA_VISIBLE_DEVICES=3,1,7,2, want 2", n);
        for (int i = 0; i < 2; i++) {
            int phys = i == 0 ? 3 : 1;
            char want[32];
            CK(cuDeviceGetName(name, sizeof name, i));
            snprintf(want, sizeof want, "Mock GPU %d", phys);
            if (strcmp(name, want)) fail(&c, "cuDeviceGetName", -1, "ordinal %d is \"%s\", want \"%s\"", i, name, want);
            CK(cuDeviceGetUuid_v2(&v2, i));
            CK(cuDeviceGetUuid(&v, i));
            if (memcmp(&v2, &u[phys], sizeof v) || memcmp(&v, &u[phys], sizeof v))
                fail(&c, "cuDeviceGetUuid", -1, "ordinal %d differs from physical GPU %d in another process", i, phys);
        }
        CUdevice d;
        if (cuDeviceGet(&d, 2) == 0) fail(&c, "cuDeviceGet", -1, "ordinal 2 exists with 2 visible devices");
    } else {
        setenv("CUDA_VISIBLE_DEVICES", "", 1);
        int r = cuInit(0);
        if (r != 100)
            fail(&c, "cuInit", -1, "returned %d with CUDA_VISIBLE_DEVICES empty, want 100 (CUDA_ERROR_NO_DEVICE)", r);
    }
    return c.fails != 0;
}

/* ---- parent -------------------------------------------------------------- */
static pid_t g_pids[64];
static int g_npids;
static pid_t spawn(void) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        printf("FAIL xproc: fork\n");
        exit(1);
    }
    if (pid == 0)
        alarm(60); /* never hang the test suite */
    else
        g_pids[g_npids++] = pid;
    return pid;
}
static int wait_all(const pid_t *pids, int n, char *why, size_t len) {
    int bad = 0;
    why[0] = 0;
    for (int i = 0; i < n; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            if (!bad)
                snprintf(why, len, "process %d %s %d", i, WIFEXITED(st) ? "exited with" : "was killed by signal",
                         WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            bad = 1;
        }
    }
    return bad;
}
static int report(const char *name, int bad, const char *why, const char *what) {
    if (bad)
        printf("FAIL xproc_%s: %s\n", name, why);
    else
        printf("PASS xproc_%s (%s)\n", name, what);
    return bad;
}
/* P processes connected by pipes: fds[q] is q's read end, wfd[q] its write end */
typedef struct {
    int rfd[3], wfd[3];
} pipes;
static void make_pipes(pipes *p, int n) {
    for (int q = 0; q < n; q++) {
        int fd[2];
        if (pipe(fd)) {
            printf("FAIL xproc: pipe\n");
            exit(1);
        }
        p->rfd[q] = fd[0];
        p->wfd[q] = fd[1];
    }
}
static void close_pipes(pipes *p, int n) {
    for (int q = 0; q < n; q++) {
        close(p->rfd[q]);
        close(p->wfd[q]);
    }
}
/* `nproc` forked processes run fn(q, in_fd, out_fd) over one pair of pipes; one PASS/FAIL line */
static int scenario(const char *name, int nproc, int (*fn)(int, int, int), const char *what) {
    pipes pp;
    pid_t pids[3];
    char why[200];
    make_pipes(&pp, 2);
    for (int q = 0; q < nproc; q++)
        if ((pids[q] = spawn()) == 0) exit(fn(q, pp.rfd[1], pp.wfd[1]));
    close_pipes(&pp, 2);
    return report(name, wait_all(pids, nproc, why, sizeof why), why, what);
}

int main(void) {
    int failed = 0;
    char why[200];
    pid_t pids[3];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!getenv("MOCK_CUDA_GPUS")) setenv("MOCK_CUDA_GPUS", "4", 1);
    if (atoi(getenv("MOCK_CUDA_GPUS")) < 4) {
        printf("FAIL xproc: needs MOCK_CUDA_GPUS=4\n");
        return 1;
    }
    unsetenv("MOCK_NCCL_TIMEOUT_MS");

    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        const config *cf = &configs[k];
        pipes pp;
        double t0 = now_ms();
        make_pipes(&pp, cf->nproc);
        for (int p = 0; p < cf->nproc; p++)
            if ((pids[p] = spawn()) == 0) exit(run_config(cf, p, pp.rfd[p], pp.wfd));
        close_pipes(&pp, cf->nproc);
        int bad = wait_all(pids, cf->nproc, why, sizeof why);
        char what[200];
        snprintf(what, sizeof what,
                 "%d ranks in %d processes: all-reduce sum/avg/max/min f32/i32/f16/bf16, broadcast, "
                 "all-gather, reduce-scatter, send/recv ring%s; %.1f s",
                 cf->n, cf->nproc, cf->big ? " with 64 MB each way" : "", (now_ms() - t0) / 1e3);
        failed |= report(cf->name, bad, why, what);
    }

    failed |= scenario("visible_devices_and_uuids", 3, run_visible,
                       "CUDA_VISIBLE_DEVICES=3,1,7,2 gives GPUs 3 and 1 with their uuids; empty: no device");
    failed |= scenario("same_gpu_refused", 2, run_same_gpu,
                       "two processes' ranks on physical GPU 0: ncclInvalidUsage in both");
    failed |= scenario("rank_joined_twice_refused", 2, run_rank_twice,
                       "two processes claim rank 0: ncclInvalidUsage in both");
    if ((pids[0] = spawn()) == 0) exit(run_missing_rank());
    failed |= report("missing_rank_fails_init", wait_all(pids, 1, why, sizeof why), why,
                     "ncclCommInitRank gives ncclSystemError after MOCK_NCCL_TIMEOUT_MS");
    {
        pipes pp; /* [1]: the ids to rank 1; [0]: rank 1 is done */
        make_pipes(&pp, 2);
        for (int q = 0; q < 2; q++)
            if ((pids[q] = spawn()) == 0) exit(run_async_error(q, pp.rfd[1], pp.wfd[1], pp.rfd[0], pp.wfd[0]));
        close_pipes(&pp, 2);
        failed |= report("async_error_and_abort", wait_all(pids, 2, why, sizeof why), why,
                         "a collective without its peer sets ncclCommGetAsyncError; ncclCommAbort ends a wait");
    }

    /* every segment is unlinked once all ranks attached, or when the init fails */
    DIR *dir = opendir("/dev/shm");
    int left = 0;
    struct dirent *de;
    while (dir && (de = readdir(dir)) != NULL) {
        int pid;
        if (sscanf(de->d_name, "dparmock-%d-", &pid) != 1) continue;
        for (int i = 0; i < g_npids; i++)
            if (pid == g_pids[i]) {
                printf("FAIL xproc_shm_cleanup: /dev/shm/%s was left behind\n", de->d_name);
                left = 1;
            }
    }
    if (dir) closedir(dir);
    if (!left) printf("PASS xproc_shm_cleanup (nothing left in /dev/shm)\n");
    return failed || left;
}
