/* bench_collectives.c — collective bandwidth of dpar against the memory-traffic
   limit of this machine, measured in the same run with the same thread count.

   For every backend asked for and every device count n (emulated devices of
   that backend), it times all-reduce (psum), all-gather (tiled),
   reduce-scatter (psum_scatter, tiled), broadcast (pbroadcast) and all-to-all
   of f32 data over a range of sizes, out of place, and prints one CSV row per
   measurement:

       kind,backend,op,devices,bytes,time_us,algbw_GBps,busbw_GBps,limit_us,pct_limit,pct_min,pct_max,alts,
       limit_kernel,own_kernel,own_us,pct_own,pct_own_min,pct_own_max

   Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md there):
     bytes  = the whole buffer: all-reduce / broadcast / all-to-all in = out =
              bytes per device; all-gather out = bytes (in = bytes / n);
              reduce-scatter in = bytes (out = bytes / n)
     algbw  = bytes / time;  busbw = algbw * 2(n-1)/n (all-reduce),
              (n-1)/n (all-gather, reduce-scatter, all-to-all), 1 (broadcast)
   busbw is a network figure: it says nothing about how close a shared-memory
   collective is to what this machine's memory allows. The limit does:

     moved    = the DRAM bytes the collective must read plus write, S = bytes:
                all-reduce 2nS (n inputs read, n outputs written), all-gather,
                reduce-scatter and broadcast (n+1)S, all-to-all 2nS
     limit_us = moved / stream bandwidth, the best of bench_util.h's
                stream kernels (copy, add, in-place add, fill and read: the
                most favourable access mix, as bench_ops; a collective's mix
                is its own, e.g. a broadcast writes n bytes for each it
                reads, and ran above the copy kernel's bandwidth) and of the
                collectives' own patterns over n members, each thread over
                its slice of every member's buffer as dpar's host path does
                (sum_all: n reads summed into n writes, all-reduce; sum_one:
                into 1, reduce-scatter; fanout: 1 read to n writes, broadcast
                and all-gather; all-to-all's block copies are copy's mix),
                which keep as many streams in flight per thread as dpar does,
                run by n threads over the same footprint (capped at
                STREAM_CAP bytes, beyond which its bandwidth is flat), the
                faster of non-temporal and ordinary stores (a footprint that
                fits in the cache is bounded by the cache, not by DRAM)
     pct      = 100 * limit_us / time_us
     limit_kernel = the kernel (and stores, "/nt": streaming) that gave the limit
     own_us   = moved / the bandwidth of the op's own pattern alone (own_kernel:
                sum_all, fanout, sum_one or copy, as above; the best of its
                trials): what its traffic costs without any rendezvous, so
                pct_own = 100 * own_us / time_us says how much of the gap to
                the limit is the access pattern and how much dpar's own (it
                may pass 100%: dpar's order of passes is not the kernel's)

   Timing: the stream kernel and dpar alternate `alts` times per point (5 by
   default), each trial the mean over `iters` back-to-back calls (sized to
   fill --time seconds over all trials; a stream trial's threads start together and it is sized by
   their own pass time: bench_util.h's st_gate). The stream bandwidth is the best of
   its trials (what the machine did at least once in this run, with these
   threads and this footprint: on a shared machine a single trial can be
   slowed by the neighbours, which would make the limit too low). time_us is
   the median dpar trial, pct the median of the per-alternation ratios
   limit_us / dpar trial and pct_min/pct_max their range. dpar is timed on
   device 0 between two tiny psums that act as barriers.

   A median above 100% of the limit is impossible: the run goes on, prints
   "bench_collectives: ... the measurement is broken" on stderr for each such
   point and exits with status 3.

   bench_collectives [--backend cpu,vulkan] [--devices 2,4,8]
                     [--ops allreduce,allgather,reducescatter,broadcast,alltoall]
                     [--min BYTES] [--max BYTES] [--factor F] [--time SECONDS] [--alts N]
                     [--clock wall|cpu]
   --clock cpu times both sides by the process's CPU time per working thread
   (a diagnostic for a machine far more loaded than it has cores: the wall
   clock then mostly measures the wait for a core; make bench uses wall).
   A backend that is not available prints "skip,<backend>,<reason>" and is
   left out (not an error). DPAR_TRACE=file.json traces the run. */
#include "dpar.h"
#include "bench_util.h" /* clock, median, the stream kernels */
#include <unistd.h>     /* sysconf: the CPUs */

enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BROADCAST, OP_ALLTOALL, OP_COUNT };
/* each op's own access pattern among the stream kernels (bench_util.h) */
static const int own_kernel[OP_COUNT] = { ST_K_SUM_ALL, ST_K_FANOUT, ST_K_SUM_ONE, ST_K_FANOUT, ST_K_COPY };
static const char *op_names[OP_COUNT] = { "allreduce", "allgather", "reducescatter", "broadcast", "alltoall" };

/* ---- dpar: one trial = `iters` collectives between two barrier psums */
typedef struct {
    int op, iters, n, warm;
    dpar_array *in, *out, *tiny;
    double elapsed; /* seconds for `iters`, device 0 */
} bench_job;

static dpar_status one(dpar_ctx *ctx, bench_job *j, dpar_buffer *in, dpar_buffer *out) {
    switch (j->op) {
    case OP_ALLREDUCE: return dpar_psum(ctx, out, in, "data");
    case OP_ALLGATHER: return dpar_all_gather(ctx, out, in, "data", 0, true);
    case OP_REDUCESCATTER: return dpar_psum_scatter(ctx, out, in, "data", 0, true);
    case OP_ALLTOALL: return dpar_all_to_all(ctx, out, in, "data", 0, 0);
    default: return dpar_pbroadcast(ctx, out, in, "data", 0);
    }
}

static dpar_status bench_fn(dpar_ctx *ctx, void *user) {
    bench_job *j = (bench_job *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *in = dpar_array_shard(j->in, dev), *out = dpar_array_shard(j->out, dev),
                *t = dpar_array_shard(j->tiny, dev);
    dpar_status s;
    if (j->warm && (s = one(ctx, j, in, out))) return s;
    if ((s = dpar_psum(ctx, t, t, "data"))) return s;
    double t0 = now_s();
    for (int i = 0; i < j->iters; i++)
        if ((s = one(ctx, j, in, out))) return s;
    if ((s = dpar_psum(ctx, t, t, "data"))) return s;
    if (dev == 0) j->elapsed = now_s() - t0;
    return DPAR_OK;
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

/* the DRAM bytes op must read plus write for S bytes on n devices (see the header) */
static double moved_bytes(int op, int n, double S) {
    return op == OP_ALLREDUCE || op == OP_ALLTOALL ? 2.0 * n * S : (n + 1.0) * S;
}

static int broken = 0;

/* one point: alternate the stream kernel and dpar `alts` times, print the row */
static int run_point(const char *bname, dpar_mesh *m, int op, int n, int64_t bytes, double target, int alts) {
    int64_t count = bytes / 4;
    count -= count % ((int64_t)n * n); /* divisible for gather/scatter and all-to-all */
    if (count <= 0) return 0;
    int64_t in_local = count, out_local = count;
    if (op == OP_ALLGATHER) in_local = count / n;
    if (op == OP_REDUCESCATTER) out_local = count / n;
    bench_job j;
    memset(&j, 0, sizeof j);
    j.op = op;
    j.n = n;
    if (make_arr(m, in_local * n, &j.in) || make_arr(m, out_local * n, &j.out) || make_arr(m, n, &j.tiny)) {
        fprintf(stderr, "%s %s n=%d %lld bytes: %s\n", bname, op_names[op], n, (long long)bytes, dpar_last_error());
        dpar_array_destroy(j.in);
        dpar_array_destroy(j.out);
        dpar_array_destroy(j.tiny);
        return 0;
    }
    double S = (double)count * 4.0, moved = moved_bytes(op, n, S);
    /* n threads, as dpar runs n devices; with more devices than CPUs also one thread a CPU: n threads
       time-sliced on fewer cores each lose their cache to the others, and dpar's members, which do not
       all stream at once, moved more than n stream threads did (16 MB all-gather, 4 and 8 devices on 2
       cores: 102-107%) */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int sets = cpus > 0 && n > cpus ? 2 : 1;
    stream_set ss[2];
    memset(ss, 0, sizeof ss);
    int rc = 0;
    for (int q = 0; q < sets; q++) {
        if (stream_init(&ss[q], q ? (int)cpus : n, 1, (int64_t)moved)) { /* 3 arrays: every kernel */
            fprintf(stderr, "%s %s n=%d: no memory for the stream arrays\n", bname, op_names[op], n);
            rc = -1;
            goto done;
        }
        ss[q].ways = n; /* and the collectives' own access patterns over n members */
    }
    dpar_shard_map_desc sd = { .fn = bench_fn, .user = &j };
    j.iters = 1; /* calibrate (with a warm-up collective first) */
    j.warm = 1;
    if (dpar_shard_map(m, &sd)) {
        fprintf(stderr, "%s: %s\n", op_names[op], dpar_last_error());
        rc = -1;
        goto done;
    }
    double per = j.elapsed > 1e-7 ? j.elapsed : 1e-7;
    int iters = (int)(target / alts / 2 / per);
    j.iters = iters < 1 ? 1 : iters > 2000 ? 2000 : iters;
    j.warm = 0;
    double t[MAX_ALTS], pct[MAX_ALTS], own[MAX_ALTS], bw = 0, own_bw = 0;
    int best_q = -1, best_nt = 0, oq = own_kernel[op];
    for (int k = 0; k < alts; k++) {
        for (int q = 0; q < sets; q++) {
            double b = stream_bw_best(&ss[q], target / alts / 4 / sets);
            if (b > bw) bw = b, best_q = ss[q].best_q, best_nt = ss[q].best_nt;
            if (ss[q].bw_of[oq] > own_bw) own_bw = ss[q].bw_of[oq];
        }
        if (dpar_shard_map(m, &sd)) {
            fprintf(stderr, "%s: %s\n", op_names[op], dpar_last_error());
            rc = -1;
            goto done;
        }
        t[k] = j.elapsed / j.iters / (clock_id == CLOCK_MONOTONIC ? 1 : n);
    }
    double lm = moved / bw; /* the best stream trial: the least disturbed view of what the machine can do */
    double lo = own_bw > 0 ? moved / own_bw : 0; /* the op's own access pattern alone, without any rendezvous */
    for (int k = 0; k < alts; k++) pct[k] = 100.0 * lm / t[k], own[k] = 100.0 * lo / t[k];
    double tm = median(t, alts), pm = median(pct, alts), po = median(own, alts); /* sorted: [0] min */
    char lk[48];
    stream_kernel_label(&ss[0], best_q, best_nt, lk, sizeof lk);
    double alg = S / tm / 1e9, bus = op == OP_ALLREDUCE   ? alg * 2.0 * (n - 1) / n
                                     : op == OP_BROADCAST ? alg
                                                          : alg * (double)(n - 1) / n;
    printf("coll,%s,%s,%d,%lld,%.2f,%.3f,%.3f,%.2f,%.1f,%.1f,%.1f,%d,%s,%s,%.2f,%.1f,%.1f,%.1f\n", bname, op_names[op],
           n, (long long)(count * 4), tm * 1e6, alg, bus, lm * 1e6, pm, pct[0], pct[alts - 1], alts, lk,
           stream_kernel_names[oq], lo * 1e6, po, own[0], own[alts - 1]);
    fflush(stdout);
    if (pm > 100.0) {
        fprintf(stderr,
                "bench_collectives: %s %s n=%d %lld bytes runs at %.0f%% of its memory-traffic limit (%.0f MB moved "
                "at the stream bandwidth): above 100%% is impossible, the measurement is broken (timing, the bytes "
                "the collective must move, or the stream kernel); fix the benchmark before quoting any figure\n",
                bname, op_names[op], n, (long long)(count * 4), pm, moved / 1e6);
        broken = 1;
    }
done:
    free(ss[0].mem);
    free(ss[1].mem);
    dpar_array_destroy(j.in);
    dpar_array_destroy(j.out);
    dpar_array_destroy(j.tiny);
    return rc;
}

static int run_backend(const char *bname, dpar_backend_kind kind, int n, const char *ops, int64_t lo, int64_t hi,
                       int factor, double target, int alts) {
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
    int rc = 0;
    for (int op = 0; op < OP_COUNT && !rc; op++) {
        if (!has(ops, op_names[op])) continue;
        for (int64_t bytes = lo; bytes <= hi && !rc; bytes *= factor)
            rc = run_point(bname, m, op, n, bytes, target, alts);
    }
    dpar_runtime_destroy(rt);
    return rc;
}

/* --backend, --devices and --ops, each a list of names or counts it runs: 0; else prints the first
   item that is not and returns 2 (a usage error), before the CSV header: a bad list would otherwise
   print the header, or measure nothing and exit 0. */
static int check_lists(const char *backends, const char *devs, const char *ops) {
    char item[32], why[160];
    if (!*backends || !*devs || !*ops) {
        const char *flag = !*backends ? "--backend" : !*devs ? "--devices" : "--ops";
        return ex_bad_value("bench_collectives", flag, "''", "an empty list; give one item at least");
    }
    for (const char *q = backends; ex_list_next(&q, item, sizeof item);) {
        dpar_backend_kind k = DPAR_BACKEND_DEFAULT;
        if (dpar_backend_from_name(item, &k) || k == DPAR_BACKEND_DEFAULT) {
            snprintf(why, sizeof why, "'%s' is not a backend; use cpu, vulkan or cuda (a list: cpu,vulkan)", item);
            return ex_bad_value("bench_collectives", "--backend", backends, why);
        }
    }
    for (const char *q = devs; ex_list_next(&q, item, sizeof item);) {
        char *end;
        long n = strtol(item, &end, 10);
        if (end == item || *end || n < 1 || n > DPAR_MAX_DEVICES) {
            snprintf(why, sizeof why, "'%s' is not a device count; use counts from 1 to %d (a list: 2,4,8)", item,
                     DPAR_MAX_DEVICES);
            return ex_bad_value("bench_collectives", "--devices", devs, why);
        }
    }
    for (const char *q = ops; ex_list_next(&q, item, sizeof item);) {
        int op = 0;
        while (op < OP_COUNT && strcmp(item, op_names[op])) op++;
        if (op == OP_COUNT) {
            int len = snprintf(why, sizeof why, "'%s' is not a collective; use", item);
            for (op = 0; op < OP_COUNT && len > 0 && (size_t)len < sizeof why; op++)
                len += snprintf(why + len, sizeof why - (size_t)len, " %s%s", op_names[op],
                                op + 1 < OP_COUNT ? "," : " (a list)");
            return ex_bad_value("bench_collectives", "--ops", ops, why);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *backends = "cpu", *devs = "2,4,8", *ops = "allreduce,allgather,reducescatter,broadcast,alltoall";
    const char *clk = "wall";
    int lo = 4096, hi = 64 << 20, factor = 4, alts = 5;
    float target = 0.2f;
    const ex_flag flags[] = {
        EX_S("--backend", &backends, "cpu,vulkan,cuda (a list)"),
        EX_S("--devices", &devs, "device counts, a list"),
        EX_S("--ops", &ops, "collectives, a list"),
        EX_I("--min", &lo, 64, INT_MAX),
        EX_I("--max", &hi, 64, INT_MAX),
        EX_I("--factor", &factor, 2, 1024),
        EX_F("--time", &target, "seconds per point, > 0 and <= 3600"),
        EX_I("--alts", &alts, 1, MAX_ALTS),
        EX_S("--clock", &clk, "cpu|wall"),
    };
    int rc = ex_parse("bench_collectives", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (!rc) rc = bench_clock("bench_collectives", clk, CLOCK_PROCESS_CPUTIME_ID);
    if (!rc) rc = ex_check_seconds("bench_collectives", "--time", target);
    if (!rc) rc = ex_check_order("bench_collectives", "--min", lo, "--max", hi);
    if (!rc) rc = check_lists(backends, devs, ops);
    if (rc) return ex_exit_status(rc);
    printf("kind,backend,op,devices,bytes,time_us,algbw_GBps,busbw_GBps,limit_us,pct_limit,pct_min,pct_max,alts,"
           "limit_kernel,own_kernel,own_us,pct_own,pct_own_min,pct_own_max\n");
    char b[32], n[32];
    for (const char *q = backends; ex_list_next(&q, b, sizeof b);) { /* check_lists took every item */
        dpar_backend_kind k = DPAR_BACKEND_DEFAULT;
        dpar_backend_from_name(b, &k);
        for (const char *p = devs; ex_list_next(&p, n, sizeof n);)
            if (run_backend(b, k, atoi(n), ops, lo, hi, factor, target, alts)) return 1;
    }
    return broken ? 3 : 0;
}
