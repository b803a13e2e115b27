/* bench_collectives.c — collective bandwidth of dpar, as nccl-tests measures it.

   For every backend asked for and every device count (emulated devices of
   that backend), it times all-reduce (psum), all-gather (tiled),
   reduce-scatter (psum_scatter, tiled) and broadcast (pbroadcast) of f32
   data over a range of sizes, out of place, and prints one CSV row per
   measurement:

       kind,backend,op,devices,bytes,time_us,algbw_GBps,busbw_GBps

   Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md there):
     bytes  = the whole buffer: all-reduce / broadcast in = out = bytes;
              all-gather out = bytes (in = bytes / n); reduce-scatter in = bytes
              (out = bytes / n)
     algbw  = bytes / time
     busbw  = algbw * 2(n-1)/n  all-reduce
              algbw * (n-1)/n   all-gather, reduce-scatter
              algbw             broadcast
   GB/s are 1e9 bytes per second. Time per collective: the best of 5 trials
   (STREAM's convention: this 2-core VM shares memory bandwidth with its
   neighbours, and the best trial is the least disturbed one), each the mean
   over `iters` back-to-back collectives (iters sized to fill --time seconds
   in all; warm-up first), measured on device 0 between two tiny psums that
   act as barriers. bench_mpi_allreduce times the same way.

   --memcpy adds the host memcpy rows (kind "memcpy", backend "host", devices
   1, and 2 for two threads each copying its own buffer): algbw = busbw =
   bytes copied per second (the bytes read plus written are twice that).

   bench_collectives [--backend cpu,vulkan] [--devices 2,4,8]
                     [--ops allreduce,allgather,reducescatter,broadcast]
                     [--min BYTES] [--max BYTES] [--factor F] [--time SECONDS]
                     [--memcpy] [--no-dpar]
   A backend that is not available prints "skip,<backend>,<reason>" and is
   left out (not an error). DPAR_TRACE=file.json traces the run. */
#include "dpar.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BROADCAST, OP_COUNT };
static const char *op_names[OP_COUNT] = { "allreduce", "allgather", "reducescatter", "broadcast" };

enum { TRIALS = 5 };
typedef struct {
    int op, iters, n, trials;
    dpar_array *in, *out, *tiny;
    double elapsed[TRIALS]; /* seconds for `iters`, device 0, per trial */
} bench_job;

static dpar_status one(dpar_ctx *ctx, bench_job *j, dpar_buffer *in, dpar_buffer *out) {
    switch (j->op) {
    case OP_ALLREDUCE: return dpar_psum(ctx, out, in, "data");
    case OP_ALLGATHER: return dpar_all_gather(ctx, out, in, "data", 0, true);
    case OP_REDUCESCATTER: return dpar_psum_scatter(ctx, out, in, "data", 0, true);
    default: return dpar_pbroadcast(ctx, out, in, "data", 0);
    }
}

static dpar_status bench_fn(dpar_ctx *ctx, void *user) {
    bench_job *j = (bench_job *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *in = dpar_array_shard(j->in, dev), *out = dpar_array_shard(j->out, dev),
                *t = dpar_array_shard(j->tiny, dev);
    dpar_status s;
    if ((s = one(ctx, j, in, out))) return s; /* warm-up */
    for (int k = 0; k < j->trials; k++) {
        if ((s = dpar_psum(ctx, t, t, "data"))) return s;
        double t0 = now_s();
        for (int i = 0; i < j->iters; i++)
            if ((s = one(ctx, j, in, out))) return s;
        if ((s = dpar_psum(ctx, t, t, "data"))) return s;
        if (dev == 0) j->elapsed[k] = now_s() - t0;
    }
    return DPAR_OK;
}

static double best(const double *v, int n) {
    double b = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < b) b = v[i];
    return b;
}

static int make_arr(dpar_mesh *m, int64_t global, dpar_array **out) {
    dpar_array_desc d = { .dtype = DPAR_F32, .ndim = 1, .shape = { global }, .spec = { "data" } };
    return dpar_array_create(m, &d, out) == DPAR_OK ? 0 : -1;
}

static int has(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}

static int run_backend(const char *bname, dpar_backend_kind kind, int n, const char *ops, int64_t lo, int64_t hi,
                       int factor, double target) {
    dpar_runtime_desc rd = { .backend = kind, .num_devices = n };
    dpar_runtime *rt = NULL;
    if (dpar_runtime_create(&rd, &rt)) {
        printf("skip,%s,%d devices: %s\n", bname, n, dpar_last_error());
        fflush(stdout);
        return 0;
    }
    dpar_mesh *m = NULL;
    dpar_mesh_desc md = { .ndim = 1, .shape = { n }, .axis_names = { "data" } };
    if (dpar_mesh_create(rt, &md, &m)) {
        fprintf(stderr, "mesh: %s\n", dpar_last_error());
        dpar_runtime_destroy(rt);
        return -1;
    }
    for (int op = 0; op < OP_COUNT; op++) {
        if (!has(ops, op_names[op])) continue;
        for (int64_t bytes = lo; bytes <= hi; bytes *= factor) {
            int64_t count = bytes / 4;
            count -= count % n; /* divisible for gather/scatter */
            int64_t in_local = count, out_local = count;
            if (op == OP_ALLGATHER) in_local = count / n;
            if (op == OP_REDUCESCATTER) out_local = count / n;
            bench_job j;
            memset(&j, 0, sizeof j);
            j.op = op;
            j.n = n;
            if (make_arr(m, in_local * n, &j.in) || make_arr(m, out_local * n, &j.out) || make_arr(m, n, &j.tiny)) {
                fprintf(stderr, "%s %s n=%d %lld bytes: %s\n", bname, op_names[op], n, (long long)bytes,
                        dpar_last_error());
                dpar_array_destroy(j.in);
                dpar_array_destroy(j.out);
                dpar_array_destroy(j.tiny);
                break;
            }
            dpar_shard_map_desc sd = { .fn = bench_fn, .user = &j };
            /* calibrate: 1 iteration, then enough to fill `target` seconds */
            j.iters = 1;
            j.trials = 3;
            if (dpar_shard_map(m, &sd)) {
                fprintf(stderr, "%s: %s\n", op_names[op], dpar_last_error());
                return -1;
            }
            double per = best(j.elapsed, 3);
            if (per < 1e-7) per = 1e-7;
            int iters = (int)(target / TRIALS / per);
            j.iters = iters < 1 ? 1 : iters > 2000 ? 2000 : iters;
            j.trials = TRIALS;
            if (dpar_shard_map(m, &sd)) {
                fprintf(stderr, "%s: %s\n", op_names[op], dpar_last_error());
                return -1;
            }
            double t = best(j.elapsed, TRIALS) / j.iters;
            double b = (double)count * 4.0;
            double alg = b / t / 1e9, bus;
            if (op == OP_ALLREDUCE)
                bus = alg * 2.0 * (n - 1) / n;
            else if (op == OP_BROADCAST)
                bus = alg;
            else
                bus = alg * (double)(n - 1) / n;
            printf("coll,%s,%s,%d,%lld,%.2f,%.3f,%.3f\n", bname, op_names[op], n, (long long)(count * 4), t * 1e6, alg,
                   bus);
            fflush(stdout);
            dpar_array_destroy(j.in);
            dpar_array_destroy(j.out);
            dpar_array_destroy(j.tiny);
        }
    }
    dpar_runtime_destroy(rt);
    return 0;
}

/* ---- memcpy: 1 thread, and 2 threads each copying its own pair of buffers */
typedef struct {
    char *dst, *src;
    size_t bytes;
    int iters;
    pthread_barrier_t *bar;
    double t;
} cp_arg;
static void *cp_main(void *p) {
    cp_arg *a = (cp_arg *)p;
    memcpy(a->dst, a->src, a->bytes); /* warm-up, faults the pages in */
    pthread_barrier_wait(a->bar);
    double t0 = now_s();
    for (int i = 0; i < a->iters; i++) {
        memcpy(a->dst, a->src, a->bytes);
        __asm__ __volatile__("" ::: "memory");
    }
    a->t = now_s() - t0;
    return NULL;
}
static void run_memcpy(int threads, int64_t lo, int64_t hi, int factor, double target) {
    for (int64_t bytes = lo; bytes <= hi; bytes *= factor) {
        cp_arg a[2];
        pthread_t th[2];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)threads);
        /* calibrate with one thread */
        char *s0 = (char *)malloc((size_t)bytes), *d0 = (char *)malloc((size_t)bytes);
        memset(s0, 1, (size_t)bytes);
        memset(d0, 0, (size_t)bytes);
        double t0 = now_s();
        memcpy(d0, s0, (size_t)bytes);
        double per = now_s() - t0;
        if (per < 1e-7) per = 1e-7;
        int iters = (int)(target / per);
        iters = iters < 2 ? 2 : iters > 20000 ? 20000 : iters;
        for (int i = 0; i < threads; i++) {
            a[i].bytes = (size_t)bytes;
            a[i].iters = iters;
            a[i].bar = &bar;
            a[i].src = i ? (char *)malloc((size_t)bytes) : s0;
            a[i].dst = i ? (char *)malloc((size_t)bytes) : d0;
            if (i) {
                memset(a[i].src, 1, (size_t)bytes);
                memset(a[i].dst, 0, (size_t)bytes);
            }
        }
        for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, cp_main, &a[i]);
        double tmax = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            if (a[i].t > tmax) tmax = a[i].t;
        }
        double t = tmax / iters;
        double bw = (double)bytes * threads / t / 1e9;
        printf("memcpy,host,memcpy,%d,%lld,%.2f,%.3f,%.3f\n", threads, (long long)bytes, t * 1e6, bw, bw);
        fflush(stdout);
        for (int i = 0; i < threads; i++) {
            free(a[i].src);
            free(a[i].dst);
        }
        pthread_barrier_destroy(&bar);
    }
}

int main(int argc, char **argv) {
    const char *backends = "cpu", *devs = "2,4,8", *ops = "allreduce,allgather,reducescatter,broadcast";
    int64_t lo = 4096, hi = (int64_t)256 << 20;
    int factor = 4, memcpy_rows = 0, dpar_rows = 1;
    double target = 0.2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--memcpy")) {
            memcpy_rows = 1;
            continue;
        }
        if (!strcmp(a, "--no-dpar")) {
            dpar_rows = 0;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_collectives: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--backend"))
            backends = v;
        else if (!strcmp(a, "--devices"))
            devs = v;
        else if (!strcmp(a, "--ops"))
            ops = v;
        else if (!strcmp(a, "--min"))
            lo = atoll(v);
        else if (!strcmp(a, "--max"))
            hi = atoll(v);
        else if (!strcmp(a, "--factor"))
            factor = atoi(v);
        else if (!strcmp(a, "--time"))
            target = atof(v);
        else {
            fprintf(stderr, "bench_collectives: unknown flag %s\n", a);
            return 2;
        }
        i++;
    }
    if (lo < 64 || hi < lo || factor < 2 || target <= 0) {
        fprintf(stderr, "bench_collectives: bad --min/--max/--factor/--time\n");
        return 2;
    }
    printf("kind,backend,op,devices,bytes,time_us,algbw_GBps,busbw_GBps\n");
    if (memcpy_rows) {
        run_memcpy(1, lo, hi, factor, target);
        run_memcpy(2, lo, hi, factor, target);
    }
    if (!dpar_rows) return 0;
    for (const char *q = backends; *q;) { /* (not strtok: drivers use it too) */
        char b[32];
        size_t len = strcspn(q, ",");
        snprintf(b, sizeof b, "%.*s", (int)(len < sizeof b ? len : sizeof b - 1), q);
        q += len + (q[len] == ',');
        dpar_backend_kind k = DPAR_BACKEND_DEFAULT;
        if (dpar_backend_from_name(b, &k) || k == DPAR_BACKEND_DEFAULT) {
            fprintf(stderr, "bench_collectives: unknown backend %s (cpu, vulkan, cuda)\n", b);
            return 2;
        }
        const char *p = devs;
        while (*p) {
            int n = atoi(p);
            if (n >= 1 && run_backend(b, k, n, ops, lo, hi, factor, target)) return 1;
            while (*p && *p != ',') p++;
            if (*p == ',') p++;
        }
    }
    return 0;
}
