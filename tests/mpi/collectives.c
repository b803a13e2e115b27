/* Multi-process tests: run under mpirun -np 2 or -np 4 (2 CPU devices per
   process). Every check is agreed on by all ranks (MPI_Allreduce of the local
   verdicts); rank 0 prints "PASS name" or "FAIL name: why" (why from the first
   failing rank), which tests/test_mpi.sh counts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include "dpar.h"

#define LOCAL 2
static int rank, nprocs, failures;

/* all ranks agree; rank 0 prints */
static void check(const char *name, int ok, const char *why) {
    int all = 0, mine = ok ? 1 : 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    char msg[512] = "";
    if (!ok) snprintf(msg, sizeof msg, "rank %d: %s", rank, why ? why : "");
    char first[512] = "";
    if (!all) { /* the lowest failing rank's reason */
        int who = ok ? nprocs : rank, lowest;
        MPI_Allreduce(&who, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (rank == lowest) memcpy(first, msg, sizeof first);
        MPI_Bcast(first, sizeof first, MPI_CHAR, lowest, MPI_COMM_WORLD);
    }
    if (rank == 0) {
        if (all)
            printf("PASS %s (np=%d)\n", name, nprocs);
        else
            printf("FAIL %s (np=%d): %s\n", name, nprocs, first);
        fflush(stdout);
    }
    if (!all) failures++;
}

static dpar_runtime *runtime(int timeout_ms) {
    dpar_runtime_desc d = { 0 };
    /* the CPU backend unless DPAR_BACKEND names another (tests/test_cuda_mock.sh: cuda) */
    d.backend = getenv("DPAR_BACKEND") && *getenv("DPAR_BACKEND") ? DPAR_BACKEND_DEFAULT : DPAR_BACKEND_CPU;
    d.num_devices = LOCAL;
    d.timeout_ms = timeout_ms;
    MPI_Comm world = MPI_COMM_WORLD;
    d.mpi.comm = &world;
    dpar_runtime *rt = NULL;
    if (dpar_runtime_create(&d, &rt)) {
        fprintf(stderr, "rank %d: runtime: %s\n", rank, dpar_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return rt;
}
/* shard_map of fn over m with no array arguments */
static dpar_status smap(dpar_mesh *m, dpar_fn fn, void *user) {
    dpar_shard_map_desc sd = { .fn = fn, .user = user };
    return dpar_shard_map(m, &sd);
}
static dpar_mesh *mesh2(dpar_runtime *rt, int a, int b, const char *na, const char *nb) {
    dpar_mesh_desc d = { .ndim = b ? 2 : 1, .shape = { a, b }, .axis_names = { na, nb } };
    dpar_mesh *m = NULL;
    if (dpar_mesh_create(rt, &d, &m)) {
        fprintf(stderr, "rank %d: mesh: %s\n", rank, dpar_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return m;
}

/* ---- every collective with exact integer data ---- */
typedef struct {
    const char *axes;
    dpar_dtype t;
    int bad;
    char why[256];
} coll_arg;
#define BAD(...)                                          \
    do {                                                  \
        if (!a->bad) {                                    \
            a->bad = 1;                                   \
            snprintf(a->why, sizeof a->why, __VA_ARGS__); \
        }                                                 \
    } while (0)

static float as_f(const void *p, dpar_dtype t, int i) {
    if (t == DPAR_F32) return ((const float *)p)[i];
    if (t == DPAR_I32) return (float)((const int32_t *)p)[i];
    if (t == DPAR_F16) return dpar_f16_to_f32(((const uint16_t *)p)[i]);
    return dpar_bf16_to_f32(((const uint16_t *)p)[i]);
}
static void from_f(void *p, dpar_dtype t, int i, float v) {
    if (t == DPAR_F32)
        ((float *)p)[i] = v;
    else if (t == DPAR_I32)
        ((int32_t *)p)[i] = (int32_t)v;
    else if (t == DPAR_F16)
        ((uint16_t *)p)[i] = dpar_f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = dpar_f32_to_bf16(v);
}

static dpar_status coll_fn(dpar_ctx *ctx, void *user) {
    coll_arg *a = user;
    int k, n;
    dpar_status s;
    if ((s = dpar_ctx_axis_index(ctx, a->axes, &k)) || (s = dpar_ctx_axis_size(ctx, a->axes, &n))) return s;
    enum { C = 8 };
    int64_t sh[1] = { C }, shn[1] = { (int64_t)C * n }, sh2[2] = { n, C };
    dpar_buffer *x, *y, *g;
    if ((s = dpar_ctx_buffer(ctx, a->t, 1, sh, &x)) || (s = dpar_ctx_buffer(ctx, a->t, 1, sh, &y)) ||
        (s = dpar_ctx_buffer(ctx, a->t, 1, shn, &g)))
        return s;
    char hx[C * 4], hy[C * 4 * 8];
    /* device at position k holds [k+1, 2(k+1), ...] */
    for (int i = 0; i < C; i++) from_f(hx, a->t, i, (float)((k + 1) * (i + 1)));
    dpar_buffer_write(x, 0, hx, dpar_buffer_nbytes(x));
    int sum = n * (n + 1) / 2;
    /* psum */
    if ((s = dpar_psum(ctx, y, x, a->axes))) return s;
    dpar_buffer_read(y, 0, hy, dpar_buffer_nbytes(y));
    for (int i = 0; i < C; i++)
        if (as_f(hy, a->t, i) != (float)(sum * (i + 1)))
            BAD("psum[%d] = %g, want %d", i, as_f(hy, a->t, i), sum * (i + 1));
    /* pmax / pmin */
    if ((s = dpar_pmax(ctx, y, x, a->axes))) return s;
    dpar_buffer_read(y, 0, hy, dpar_buffer_nbytes(y));
    for (int i = 0; i < C; i++)
        if (as_f(hy, a->t, i) != (float)(n * (i + 1))) BAD("pmax[%d] = %g", i, as_f(hy, a->t, i));
    if ((s = dpar_pmin(ctx, y, x, a->axes))) return s;
    dpar_buffer_read(y, 0, hy, dpar_buffer_nbytes(y));
    for (int i = 0; i < C; i++)
        if (as_f(hy, a->t, i) != (float)(i + 1)) BAD("pmin[%d] = %g", i, as_f(hy, a->t, i));
    /* pmean of n*(k+1)... : use psum value / n exactness: values k*n -> mean n*(n-1)/2 */
    for (int i = 0; i < C; i++) from_f(hx, a->t, i, (float)(k * n));
    dpar_buffer_write(y, 0, hx, dpar_buffer_nbytes(y));
    if (a->t != DPAR_I32) {                                 /* i32 pmean is refused (test_collectives) */
        if ((s = dpar_pmean(ctx, y, y, a->axes))) return s; /* in place */
        dpar_buffer_read(y, 0, hy, dpar_buffer_nbytes(y));
        for (int i = 0; i < C; i++)
            if (as_f(hy, a->t, i) != (float)(n * (n - 1) / 2))
                BAD("pmean[%d] = %g, want %d", i, as_f(hy, a->t, i), n * (n - 1) / 2);
    }
    for (int i = 0; i < C; i++) from_f(hx, a->t, i, (float)((k + 1) * (i + 1)));
    dpar_buffer_write(x, 0, hx, dpar_buffer_nbytes(x));
    /* all_gather tiled: block j = [j+1, 2(j+1), ...] */
    if ((s = dpar_all_gather(ctx, g, x, a->axes, 0, true))) return s;
    dpar_buffer_read(g, 0, hy, dpar_buffer_nbytes(g));
    for (int j = 0; j < n; j++)
        for (int i = 0; i < C; i++)
            if (as_f(hy, a->t, j * C + i) != (float)((j + 1) * (i + 1)))
                BAD("all_gather[%d][%d] = %g", j, i, as_f(hy, a->t, j * C + i));
    /* psum_scatter (tiled) of the gathered [n*C]: each position gets sum over members of its block */
    if ((s = dpar_buffer_reshape(g, 2, sh2))) return s;
    dpar_buffer *rs;
    int64_t sh1[1] = { C };
    if ((s = dpar_ctx_buffer(ctx, a->t, 1, sh1, &rs))) return s;
    dpar_buffer *rs2;
    int64_t shr[2] = { 1, C };
    if ((s = dpar_ctx_buffer(ctx, a->t, 2, shr, &rs2))) return s;
    if ((s = dpar_psum_scatter(ctx, rs2, g, a->axes, 0, true))) return s;
    dpar_buffer_read(rs2, 0, hy, dpar_buffer_nbytes(rs2));
    for (int i = 0; i < C; i++)
        if (as_f(hy, a->t, i) != (float)(n * (k + 1) * (i + 1))) BAD("psum_scatter[%d] = %g", i, as_f(hy, a->t, i));
    /* ppermute: ring shift k -> k+1 */
    int pairs[2 * 64];
    for (int j = 0; j < n; j++) {
        pairs[2 * j] = j;
        pairs[2 * j + 1] = (j + 1) % n;
    }
    if ((s = dpar_ppermute(ctx, y, x, a->axes, pairs, n))) return s;
    dpar_buffer_read(y, 0, hy, dpar_buffer_nbytes(y));
    int from = (k + n - 1) % n;
    for (int i = 0; i < C; i++)
        if (as_f(hy, a->t, i) != (float)((from + 1) * (i + 1))) BAD("ppermute[%d] = %g", i, as_f(hy, a->t, i));
    /* all_to_all on [n, C]: row j of member k = 10k + j; out row i = 10i + k (exact in bf16) */
    for (int j = 0; j < n; j++)
        for (int i = 0; i < C; i++) from_f(hy, a->t, j * C + i, (float)(10 * k + j));
    dpar_buffer *t2;
    if ((s = dpar_ctx_buffer(ctx, a->t, 2, sh2, &t2))) return s;
    dpar_buffer_write(g, 0, hy, dpar_buffer_nbytes(g));
    if ((s = dpar_all_to_all(ctx, t2, g, a->axes, 0, 0))) return s;
    dpar_buffer_read(t2, 0, hy, dpar_buffer_nbytes(t2));
    for (int j = 0; j < n; j++)
        for (int i = 0; i < C; i++)
            if (as_f(hy, a->t, j * C + i) != (float)(10 * j + k))
                BAD("all_to_all[%d][%d] = %g", j, i, as_f(hy, a->t, j * C + i));
    /* pbroadcast from the last position */
    if ((s = dpar_pbroadcast(ctx, y, x, a->axes, n - 1))) return s;
    dpar_buffer_read(y, 0, hy, dpar_buffer_nbytes(y));
    for (int i = 0; i < C; i++)
        if (as_f(hy, a->t, i) != (float)(n * (i + 1))) BAD("pbroadcast[%d] = %g", i, as_f(hy, a->t, i));
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(g);
    dpar_buffer_destroy(rs);
    dpar_buffer_destroy(rs2);
    dpar_buffer_destroy(t2);
    return DPAR_OK;
}

static void test_all_collectives(dpar_runtime *rt, dpar_mesh *m, const char *mesh_name, const char *const *axes_list) {
    dpar_dtype types[4] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };
    for (int ai = 0; axes_list[ai]; ai++)
        for (int ti = 0; ti < 4; ti++) {
            coll_arg a;
            memset(&a, 0, sizeof a);
            a.axes = axes_list[ai];
            a.t = types[ti];
            dpar_status s = smap(m, coll_fn, &a);
            char name[160], why[512];
            snprintf(name, sizeof name, "every collective over '%s' of %s, %s", axes_list[ai], mesh_name,
                     dpar_dtype_name(types[ti]));
            snprintf(why, sizeof why, "%s", s ? dpar_last_error() : a.why);
            check(name, s == DPAR_OK && !a.bad, why);
        }
    (void)rt;
}

/* ---- large all-reduce: several 1 MB chunks of the cross-process pipeline plus a tail ---- */
enum { BIG = 3 * (1 << 18) + 1234 };
typedef struct {
    dpar_dtype t;
    int bad;
    char why[256];
} big_arg;
static dpar_status big_fn(dpar_ctx *ctx, void *user) {
    big_arg *a = user;
    int k, n;
    dpar_status s;
    if ((s = dpar_ctx_axis_index(ctx, "data", &k)) || (s = dpar_ctx_axis_size(ctx, "data", &n))) return s;
    int64_t sh[1] = { BIG };
    dpar_buffer *x, *y;
    if ((s = dpar_ctx_buffer(ctx, a->t, 1, sh, &x)) || (s = dpar_ctx_buffer(ctx, a->t, 1, sh, &y))) return s;
    size_t nb = dpar_buffer_nbytes(x);
    char *hx = malloc(nb), *hy = malloc(nb);
    if (!hx || !hy) {
        free(hx);
        free(hy);
        return DPAR_ERR_OUT_OF_MEMORY;
    }
    /* member k holds (k+1) * (i % 7): sums, means, maxima and minima are exact in every dtype */
    for (int i = 0; i < BIG; i++) from_f(hx, a->t, i, (float)((k + 1) * (i % 7)));
    dpar_buffer_write(x, 0, hx, nb);
    const char *names[4] = { "psum", "pmean", "pmax", "pmin" };
    for (int op = 0; op < 4 && !s && !a->bad; op++) {
        if (op == 1 && a->t == DPAR_I32) continue; /* i32 pmean is refused */
        for (int inplace = 0; inplace < 2 && !s && !a->bad; inplace++) {
            dpar_buffer *out = y, *in = inplace ? y : x;
            if (inplace) dpar_buffer_write(y, 0, hx, nb);
            s = op == 0   ? dpar_psum(ctx, out, in, "data")
                : op == 1 ? dpar_pmean(ctx, out, in, "data")
                : op == 2 ? dpar_pmax(ctx, out, in, "data")
                          : dpar_pmin(ctx, out, in, "data");
            if (s) break;
            dpar_buffer_read(out, 0, hy, nb);
            for (int i = 0; i < BIG; i++) {
                int m = i % 7;
                float want = op == 0   ? (float)(n * (n + 1) / 2 * m)
                             : op == 2 ? (float)(n * m)
                             : op == 3 ? (float)m
                                       : (float)(n + 1) / 2.0f * (float)m;
                if (as_f(hy, a->t, i) != want) {
                    BAD("%s%s[%d] = %g, want %g", names[op], inplace ? " (in place)" : "", i, as_f(hy, a->t, i), want);
                    break;
                }
            }
        }
    }
    free(hx);
    free(hy);
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    return s;
}

/* ---- NaN in pmax whichever process holds it ---- */
static int nan_holder;
static dpar_status nan_fn(dpar_ctx *ctx, void *u) {
    int *bad = u;
    int64_t sh[1] = { 3 };
    dpar_buffer *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b);
    if (s) return s;
    float v[3] = { 1, dpar_ctx_device(ctx) == nan_holder ? NAN : 2, 3 };
    dpar_buffer_write(b, 0, v, 12);
    if ((s = dpar_pmax(ctx, b, b, "data"))) return s;
    dpar_buffer_read(b, 0, v, 12);
    if (!(v[0] == 1 && isnan(v[1]) && v[2] == 3)) *bad = 1;
    dpar_buffer_destroy(b);
    return DPAR_OK;
}

/* ---- mismatched count across processes ---- */
static dpar_status mismatch_fn(dpar_ctx *ctx, void *u) {
    (void)u;
    int64_t sh[1] = { dpar_ctx_device(ctx) < LOCAL ? 2560 : 5120 };
    dpar_buffer *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b);
    if (s) return s;
    s = dpar_psum(ctx, b, b, "data");
    dpar_buffer_destroy(b);
    return s;
}
/* ---- same count, other shape across processes (all_gather lays data out by shape) ---- */
static dpar_status shape_mismatch_fn(dpar_ctx *ctx, void *u) {
    (void)u;
    int first = dpar_ctx_device(ctx) < LOCAL, n;
    dpar_status s = dpar_ctx_axis_size(ctx, "data", &n);
    if (s) return s;
    int64_t sh[2] = { first ? 2 : 3, first ? 6 : 4 }, so[2] = { sh[0], sh[1] * n };
    dpar_buffer *a, *b;
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 2, sh, &a)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 2, so, &b))) return s;
    s = dpar_all_gather(ctx, b, a, "data", 1, true);
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    return s;
}
/* ---- uneven step counts: rank 0 runs 3 steps, the others 4 ---- */
static dpar_status uneven_fn(dpar_ctx *ctx, void *u) {
    (void)u;
    int steps = dpar_ctx_device(ctx) < LOCAL ? 3 : 4;
    int64_t sh[1] = { 16 };
    dpar_buffer *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b);
    if (s) return s;
    for (int i = 0; i < steps && !s; i++) s = dpar_psum(ctx, b, b, "data");
    dpar_buffer_destroy(b);
    return s;
}
/* ---- a rank that arrives after the others gave up on it ---- */
static dpar_status very_late_fn(dpar_ctx *ctx, void *u) {
    (void)u;
    int64_t sh[1] = { 16 };
    dpar_buffer *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b);
    if (s) return s;
    if (dpar_ctx_device(ctx) >= LOCAL && dpar_ctx_device(ctx) < 2 * LOCAL)
        usleep(1500 * 1000); /* rank 1: 5x the timeout */
    s = dpar_psum(ctx, b, b, "data");
    dpar_buffer_destroy(b);
    return s;
}
/* ---- a rank that finishes its dispatch (no collective) long after the others ---- */
static dpar_status end_late_fn(dpar_ctx *ctx, void *u) {
    (void)u;
    if (dpar_ctx_device(ctx) >= LOCAL && dpar_ctx_device(ctx) < 2 * LOCAL) usleep(1500 * 1000); /* rank 1 */
    return DPAR_OK;
}
/* ---- a rank that never arrives ---- */
static dpar_status late_fn(dpar_ctx *ctx, void *u) {
    (void)u;
    if (dpar_ctx_device(ctx) >= LOCAL && dpar_ctx_device(ctx) < 2 * LOCAL) {
        usleep(900 * 1000);
        return DPAR_OK;
    } /* rank 1 */
    int64_t sh[1] = { 16 };
    dpar_buffer *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, sh, &b);
    if (s) return s;
    s = dpar_psum(ctx, b, b, "data");
    dpar_buffer_destroy(b);
    return s;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

int main(int argc, char **argv) {
    int prov;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    int N = nprocs * LOCAL;
    char why[512];

    dpar_runtime *rt = runtime(20000);
    int first, cnt;
    dpar_runtime_local_devices(rt, &first, &cnt);
    snprintf(why, sizeof why, "count %d, process %d/%d, local %d..+%d", dpar_runtime_device_count(rt),
             dpar_runtime_process_index(rt), dpar_runtime_process_count(rt), first, cnt);
    check("global device list is processes x local devices",
          dpar_runtime_device_count(rt) == N && dpar_runtime_process_index(rt) == rank &&
              dpar_runtime_process_count(rt) == nprocs && first == rank * LOCAL && cnt == LOCAL,
          why);

    /* 1-d mesh over every device: groups across processes */
    dpar_mesh *m1 = mesh2(rt, N, 0, "data", NULL);
    const char *ax1[] = { "data", NULL };
    test_all_collectives(rt, m1, "a 1-d mesh", ax1);
    /* (data, model) with model inside a process and data across: 2x2 for np=2, 4x2 for np=4 */
    dpar_mesh *m2 = mesh2(rt, nprocs, LOCAL, "data", "model");
    const char *ax2[] = { "data", "model", "data,model", NULL };
    char nm[160];
    snprintf(nm, sizeof nm, "a %dx%d (data, model) mesh", nprocs, LOCAL);
    test_all_collectives(rt, m2, nm, ax2);
    /* model across processes, data inside and across: 2 x (N/2) */
    dpar_mesh *m3 = mesh2(rt, 2, N / 2, "data", "model");
    snprintf(nm, sizeof nm, "a 2x%d (data, model) mesh", N / 2);
    test_all_collectives(rt, m3, nm, ax2);

    {
        dpar_dtype types[4] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };
        for (int ti = 0; ti < 4; ti++) {
            big_arg a;
            memset(&a, 0, sizeof a);
            a.t = types[ti];
            dpar_status s = smap(m1, big_fn, &a);
            snprintf(nm, sizeof nm,
                     "psum/pmean/pmax/pmin of %d %s elements across processes (chunked), in place and not", (int)BIG,
                     dpar_dtype_name(types[ti]));
            snprintf(why, sizeof why, "%s", s ? dpar_last_error() : a.why);
            check(nm, !s && !a.bad, why);
        }
    }
    for (nan_holder = 0; nan_holder < N; nan_holder += N - 1) {
        int bad = 0;
        dpar_status s = smap(m1, nan_fn, &bad);
        snprintf(nm, sizeof nm, "pmax across processes propagates NaN held by device %d", nan_holder);
        check(nm, !s && !bad, s ? dpar_last_error() : "NaN lost");
    }

    /* host data: each process loads only its rows, the gather sees all */
    {
        dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 2, .shape = { 2 * N, 3 }, .spec = { "data" } };
        dpar_array *a;
        int ok = !dpar_array_create(m1, &ad, &a);
        int64_t b0 = 0, bc = 0;
        ok = ok && !dpar_array_local_rows(a, &b0, &bc);
        float rows[64 * 3], all[64 * 3];
        for (int i = 0; i < bc * 3; i++) rows[i] = (float)(b0 * 3 + i);
        ok = ok && b0 == 2 * rank * LOCAL && bc == 2 * LOCAL && !dpar_array_put_rows(a, b0, bc, rows) &&
             !dpar_array_get(a, all);
        for (int i = 0; ok && i < 2 * N * 3; i++) ok = all[i] == (float)i;
        snprintf(why, sizeof why, "rows [%lld, +%lld): %s", (long long)b0, (long long)bc, dpar_last_error());
        check("each process puts its own rows; array_get gathers every process's shards", ok, why);
        dpar_array_destroy(a);
    }

    /* mismatched counts across processes: every rank gets an error naming both */
    {
        dpar_status s = smap(m1, mismatch_fn, NULL);
        const char *e = dpar_last_error();
        snprintf(why, sizeof why, "%s: %s", dpar_status_string(s), e);
        check("mismatched element counts across processes: every rank gets an error naming 2560 and 5120",
              s == DPAR_ERR_COLLECTIVE_MISMATCH && strstr(e, "2560") && strstr(e, "5120"), why);
    }
    {
        dpar_status s = smap(m1, shape_mismatch_fn, NULL);
        const char *e = dpar_last_error();
        snprintf(why, sizeof why, "%s: %s", dpar_status_string(s), e);
        check("all_gather of [2, 6] on rank 0, [3, 4] elsewhere (same count): every rank gets an error naming both "
              "shapes",
              s == DPAR_ERR_COLLECTIVE_MISMATCH && strstr(e, "[2, 6]") && strstr(e, "[3, 4]"), why);
    }
    /* the runtime is still usable after a mismatch */
    {
        const char *ax[] = { "data", NULL };
        test_all_collectives(rt, m1, "a 1-d mesh after a mismatch", ax);
    }
    /* repeated init/destroy: no growth */
    long before = 0;
    for (int cyc = 0; cyc < 100; cyc++) {
        if (cyc == 10) before = rss_kb();
        dpar_runtime *r2 = runtime(20000);
        dpar_mesh *mm = mesh2(r2, nprocs, LOCAL, "data", "model");
        dpar_mesh_destroy(mm);
        dpar_runtime_destroy(r2);
    }
    long after = rss_kb();
    snprintf(why, sizeof why, "resident memory %ld kB after 10 cycles, %ld kB after 100", before, after);
#if defined(__SANITIZE_ADDRESS__)
    /* ASan's quarantine keeps freed memory resident: RSS says nothing here */
    if (rank == 0)
        printf("SKIPPED 100 runtime + mesh create/destroy cycles (np=%d): under ASan resident memory includes the "
               "allocator's quarantine; the plain build checks it\n",
               nprocs);
    (void)check;
#else
    check("100 runtime + mesh create/destroy cycles do not grow memory (< 1 MB)", after - before < 1024, why);
#endif
    dpar_runtime_destroy(rt);

    /* uneven steps: the ranks still waiting get an error naming rank 0 and the step */
    {
        dpar_runtime *r3 = runtime(10000);
        dpar_mesh *mm = mesh2(r3, N, 0, "data", NULL);
        double t0 = MPI_Wtime();
        dpar_status s = smap(mm, uneven_fn, NULL);
        double dt = MPI_Wtime() - t0;
        const char *e = dpar_last_error();
        /* every process's dispatch fails, with the waiting ranks' error naming rank 0 and the step */
        int ok = s == DPAR_ERR_COLLECTIVE_MISMATCH && strstr(e, "rank 0") && strstr(e, "collective #3") && dt < 10.0;
        snprintf(why, sizeof why, "%s after %.2f s: %s", dpar_status_string(s), dt, e);
        check("uneven steps (rank 0: 3, others: 4): every rank's dispatch fails, naming rank 0 and the step, before "
              "the timeout",
              ok, why);
        if (rank == 0 || rank == 1) printf("  rank %d saw: %s\n", rank, e);
        dpar_runtime_destroy(r3);
    }
    /* a rank that arrives after the others timed out: every rank gets an error saying so (the late one
       hears that the others gave up on it), and the MPI requests given up on do not crash the
       runtimes and MPI_Finalize that follow (they keep their buffers) */
    {
        dpar_runtime *r5 = runtime(300);
        dpar_mesh *mm = mesh2(r5, N, 0, "data", NULL);
        dpar_status s = smap(mm, very_late_fn, NULL);
        const char *e = dpar_last_error();
        int ok = s == DPAR_ERR_TIMEOUT && (rank == 1 ? strstr(e, "gave up waiting for this process") != NULL
                                                     : strstr(e, "rank 1") && strstr(e, "never"));
        snprintf(why, sizeof why, "%s: %s", dpar_status_string(s), e);
        check("a rank 5x the timeout late: the others name it, it hears they gave up on it", ok, why);
        if (rank == 1) printf("  rank 1 saw: %s\n", e);
        /* the runtime must be destroyed now; the next dispatch says so on every rank */
        s = smap(mm, very_late_fn, NULL);
        check("after that, every rank's next dispatch says to destroy the runtime",
              s != DPAR_OK && strstr(dpar_last_error(), "destroy"), dpar_last_error());
        /* destroyed at once, and the next runtime is made while rank 1 may still be on its way: the
           waiting ranks' given-up MPI requests complete only when it arrives (they must still find
           their buffers and communicators; this crashed in MPI_Comm_dup or MPI_Finalize before) */
        dpar_mesh_destroy(mm);
        dpar_runtime_destroy(r5);
    }
    /* a rank that finishes the dispatch after the others gave up on the end-of-dispatch agreement:
       it hears so (joining their abandoned agreement would read as a success) */
    {
        dpar_runtime *r6 = runtime(300);
        dpar_mesh *mm = mesh2(r6, N, 0, "data", NULL);
        dpar_status s = smap(mm, end_late_fn, NULL);
        const char *e = dpar_last_error();
        int ok = s == DPAR_ERR_TIMEOUT &&
                 strstr(e, rank == 1 ? "gave up waiting for this process to finish" : "did not finish this dispatch");
        snprintf(why, sizeof why, "%s: %s", dpar_status_string(s), e);
        check("a rank finishing its dispatch 5x the timeout late: every rank's dispatch fails, the late one hears why",
              ok, why);
        s = smap(mm, end_late_fn, NULL);
        check("and every rank's next dispatch fails at once, saying to destroy the runtime",
              s == DPAR_ERR_STATE && strstr(dpar_last_error(), "destroy"), dpar_last_error());
        dpar_mesh_destroy(mm);
        dpar_runtime_destroy(r6);
    }
    /* a rank that never arrives: timeout naming it */
    {
        dpar_runtime *r4 = runtime(300);
        dpar_mesh *mm = mesh2(r4, N, 0, "data", NULL);
        dpar_status s = smap(mm, late_fn, NULL);
        const char *e = dpar_last_error();
        /* the waiting ranks name rank 1; rank 1's own dispatch fails too (the status is agreed) */
        int ok = s == DPAR_ERR_TIMEOUT && (rank == 1 || (strstr(e, "rank 1") && strstr(e, "never")));
        snprintf(why, sizeof why, "%s: %s", dpar_status_string(s), e);
        check("a rank that never calls the collective: DPAR_ERR_TIMEOUT naming it", ok, why);
        if (rank == 0) printf("  rank 0 saw: %s\n", e);
        MPI_Barrier(MPI_COMM_WORLD);
        dpar_runtime_destroy(r4);
    }
    /* dpar_runtime_create failing on one rank only: every rank returns an error (no rank waits in MPI forever) */
    for (int kind = 0; kind < 3; kind++) {
        dpar_runtime_desc d = { .backend = getenv("DPAR_BACKEND") && *getenv("DPAR_BACKEND") ? DPAR_BACKEND_DEFAULT
                                                                                             : DPAR_BACKEND_CPU,
                                .num_devices = LOCAL };
        MPI_Comm world = MPI_COMM_WORLD;
        d.mpi.comm = &world;
        if (rank == 1) {
            if (kind == 0)
                d.timeout_ms = -5; /* rejected before this rank meets the others */
            else if (kind == 1)
                d.num_devices = LOCAL + 1; /* opens, but differs from the others */
            else
                d.backend =
                    d.backend == DPAR_BACKEND_CPU ? DPAR_BACKEND_VULKAN : DPAR_BACKEND_CPU; /* another backend */
        }
        dpar_runtime *bad = NULL;
        dpar_status s = dpar_runtime_create(&d, &bad);
        const char *e = dpar_last_error();
        int ok = s != DPAR_OK && bad == NULL;
        if (kind == 0)
            ok = ok && s == DPAR_ERR_INVALID_ARGUMENT && strstr(e, rank == 1 ? "timeout_ms" : "failed on process 1");
        else if (kind == 1)
            ok = ok && s == DPAR_ERR_DEVICE_COUNT && strstr(e, "process 1 has 3");
        else
            ok = ok && s == DPAR_ERR_INVALID_ARGUMENT && strstr(e, "but process 1 uses");
        snprintf(why, sizeof why, "%s: %s", dpar_status_string(s), e);
        check(kind == 0   ? "dpar_runtime_create rejected on rank 1 only: every rank gets its status, naming process 1"
              : kind == 1 ? "different local device counts: every rank gets DPAR_ERR_DEVICE_COUNT naming both"
                          : "another backend on rank 1: every rank gets an error naming both backends",
              ok, why);
        if (rank == 0) printf("  rank 0 saw: %s\n", e);
        dpar_runtime_destroy(bad);
    }
    if (rank == 0) printf("mpi_collectives np=%d: %d failed checks\n", nprocs, failures);
    MPI_Finalize();
    return failures ? 1 : 0;
}
