/* bench_matmul.c — dpar_matmul (CPU backend) against OpenBLAS sgemm at the
   same shapes, the same thread count, in the same run.

   For every shape it alternates dpar and OpenBLAS `alts` times (5 by
   default), each trial the mean over enough back-to-back products to fill its
   share of --time, and prints

       mm,shape,threads,dpar_us,dpar_gflops,blas_us,blas_gflops,ratio,ratio_min,ratio_max,alts

   ratio = OpenBLAS time / dpar time per alternation (above 1: dpar is faster;
   the median and its range); the times are the median trials. dpar runs on a
   one-device CPU runtime with DPAR_CPU_THREADS = threads, called inside
   dpar_shard_map as the training jobs call it; OpenBLAS with
   openblas_set_num_threads(threads). OpenBLAS is opened at run time
   (libopenblas.so.0, Debian's libopenblas0-pthread; BENCH_OPENBLAS=path
   overrides): without it the program prints "skip,openblas,<reason>" and
   exits 0. Each shape's two results are compared (relative max error
   1e-3 of max |C|); a mismatch prints the shape and exits 1.

   --clock cpu times each side by the CPU time of its thread instead of the
   wall clock (1 thread only): on a machine far more loaded than it has cores,
   the wall clock mostly measures the wait for a core.

   A shape is MxNxK (C[M,N] = op(A)[M,K] op(B)[K,N]) with an optional
   :tn / :nt / :tt suffix for transposed A and/or B, e.g. 64x128x64:tn.

   bench_matmul [--shapes S1,S2,...] [--threads T] [--time SECONDS] [--alts N] [--clock wall|cpu] */
#include "dpar.h"
#include "bench_util.h" /* clock, median, OpenBLAS */
#include <math.h>

static sgemm_fn blas_sgemm;

typedef struct {
    int64_t M, N, K;
    int ta, tb, iters;
    dpar_buffer *a, *b, *c;
    double elapsed;
} mm_job;

static dpar_status mm_fn(dpar_ctx *ctx, void *user) {
    (void)ctx;
    mm_job *j = (mm_job *)user;
    dpar_status s;
    double t0 = now_s();
    for (int i = 0; i < j->iters; i++)
        if ((s = dpar_matmul(j->c, j->a, j->b, j->ta, j->tb, 1.0f, 0.0f))) return s;
    float probe;
    if ((s = dpar_buffer_read(j->c, 0, &probe, sizeof probe))) return s; /* waits for the device */
    j->elapsed = now_s() - t0;
    return DPAR_OK;
}
static double mm_blas(const mm_job *j, const float *a, const float *b, float *c, int iters) {
    return blas_trial(blas_sgemm, j->M, j->N, j->K, j->ta, j->tb, a, b, c, iters);
}

/* "MxNxK[:tn|:nt|:tt]" (the whole string) into j; -1 when s is not one */
static int parse_shape(const char *s, mm_job *j) {
    long long m, n, k;
    char t[3] = "nn";
    int end = 0;
    int got = sscanf(s, "%lldx%lldx%lld%n:%2[nt]%n", &m, &n, &k, &end, t, &end);
    if (got < 3 || s[end] || t[1] == 0 || m < 1 || n < 1 || k < 1) return -1;
    j->M = m;
    j->N = n;
    j->K = k;
    j->ta = t[0] == 't';
    j->tb = t[1] == 't';
    return 0;
}

/* one shape: alternate dpar and OpenBLAS; 0 ok, 1 results differ, -1 error */
static int run_shape(dpar_runtime *rt, dpar_mesh *mesh, const char *shape, int threads, double target, int alts) {
    mm_job j;
    memset(&j, 0, sizeof j);
    if (parse_shape(shape, &j)) {
        fprintf(stderr, "bench_matmul: bad shape %s (MxNxK[:tn|nt|tt])\n", shape);
        return -1;
    }
    int64_t ar = j.ta ? j.K : j.M, ac = j.ta ? j.M : j.K, br = j.tb ? j.N : j.K, bc = j.tb ? j.K : j.N;
    size_t na = (size_t)(j.M * j.K), nb = (size_t)(j.K * j.N), nc = (size_t)(j.M * j.N);
    float *a = aligned_alloc(64, (na * 4 + 63) & ~(size_t)63), *b = aligned_alloc(64, (nb * 4 + 63) & ~(size_t)63),
          *c = aligned_alloc(64, (nc * 4 + 63) & ~(size_t)63), *cd = malloc(nc * 4);
    int rc = -1;
    if (!a || !b || !c || !cd) goto out;
    for (size_t i = 0; i < na; i++) a[i] = (float)((i * 7919u) % 23u) / 23.0f - 0.5f;
    for (size_t i = 0; i < nb; i++) b[i] = (float)((i * 104729u) % 31u) / 31.0f - 0.5f;
    if (dpar_buffer_create(rt, 0, DPAR_F32, 2, (int64_t[]){ ar, ac }, &j.a) ||
        dpar_buffer_create(rt, 0, DPAR_F32, 2, (int64_t[]){ br, bc }, &j.b) ||
        dpar_buffer_create(rt, 0, DPAR_F32, 2, (int64_t[]){ j.M, j.N }, &j.c) || dpar_buffer_write(j.a, 0, a, na * 4) ||
        dpar_buffer_write(j.b, 0, b, nb * 4)) {
        fprintf(stderr, "bench_matmul %s: %s\n", shape, dpar_last_error());
        goto out;
    }
    dpar_shard_map_desc sd = { .fn = mm_fn, .user = &j };
    j.iters = 1; /* warm-up and calibration */
    if (dpar_shard_map(mesh, &sd) || dpar_shard_map(mesh, &sd)) {
        fprintf(stderr, "bench_matmul %s: %s\n", shape, dpar_last_error());
        goto out;
    }
    double per = j.elapsed > 1e-7 ? j.elapsed : 1e-7, pb = mm_blas(&j, a, b, c, 1);
    pb = mm_blas(&j, a, b, c, 1);
    int iters = (int)(target / alts / 2 / (per > pb ? per : pb));
    j.iters = iters < 1 ? 1 : iters > 100000 ? 100000 : iters;
    double td[MAX_ALTS], tbl[MAX_ALTS], r[MAX_ALTS];
    for (int k = 0; k < alts; k++) {
        if (dpar_shard_map(mesh, &sd)) {
            fprintf(stderr, "bench_matmul %s: %s\n", shape, dpar_last_error());
            goto out;
        }
        td[k] = j.elapsed / j.iters;
        tbl[k] = mm_blas(&j, a, b, c, j.iters) / j.iters;
        r[k] = tbl[k] / td[k];
    }
    double flop = 2.0 * (double)j.M * (double)j.N * (double)j.K, tdm = median(td, alts), tbm = median(tbl, alts),
           rm = median(r, alts);
    printf("mm,%s,%d,%.2f,%.2f,%.2f,%.2f,%.3f,%.3f,%.3f,%d\n", shape, threads, tdm * 1e6, flop / tdm / 1e9, tbm * 1e6,
           flop / tbm / 1e9, rm, r[0], r[alts - 1], alts);
    fflush(stdout);
    if (dpar_buffer_read(j.c, 0, cd, nc * 4)) {
        fprintf(stderr, "bench_matmul %s: %s\n", shape, dpar_last_error());
        goto out;
    }
    double err = 0, mag = 0;
    for (size_t i = 0; i < nc; i++) {
        err = fmax(err, fabs((double)cd[i] - (double)c[i]));
        mag = fmax(mag, fabs((double)c[i]));
    }
    rc = err <= 1e-3 * (mag > 1 ? mag : 1) ? 0 : 1;
    if (rc) fprintf(stderr, "bench_matmul %s: dpar and OpenBLAS differ by %g (max |C| %g)\n", shape, err, mag);
out:
    dpar_buffer_destroy(j.a);
    dpar_buffer_destroy(j.b);
    dpar_buffer_destroy(j.c);
    free(a);
    free(b);
    free(c);
    free(cd);
    return rc;
}

/* Every item of --shapes is a shape: 0; else prints the first that is not, and the form, and
   returns 2 (a usage error), before any output. */
static int check_shapes(const char *shapes) {
    char s[64], why[192];
    mm_job j;
    if (!*shapes) return ex_bad_value("bench_matmul", "--shapes", "''", "an empty list; give one shape at least");
    for (const char *q = shapes; ex_list_next(&q, s, sizeof s);)
        if (parse_shape(s, &j)) {
            snprintf(why, sizeof why,
                     "'%s' is not a shape; want MxNxK[:tn|:nt|:tt] (C[M,N] = op(A)[M,K] op(B)[K,N], t: transposed), "
                     "a list: 64x128x64,64x128x64:tn",
                     s);
            return ex_bad_value("bench_matmul", "--shapes", shapes, why);
        }
    return 0;
}

int main(int argc, char **argv) {
    const char *shapes = "64x128x64,64x128x64:tn,64x64x128:nt,16x256x3136,3136x256x16:tn,16x3136x256:nt,1818x64x288,"
                         "288x64x1818:tn,1818x288x64:nt,16x384x128,16x128x384:nt,512x1024x1024";
    int threads = 1, alts = 5;
    float target = 0.5f;
    const char *clk = "wall";
    const ex_flag flags[] = {
        EX_S("--shapes", &shapes, "MxNxK[:tn|:nt|:tt], a list"),
        EX_I("--threads", &threads, 1, 64),
        EX_F("--time", &target, "seconds per shape, > 0 and <= 3600"),
        EX_I("--alts", &alts, 1, MAX_ALTS),
        EX_S("--clock", &clk, "cpu|wall (cpu: 1 thread)"),
    };
    int rc = ex_parse("bench_matmul", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (!rc) rc = bench_clock("bench_matmul", clk, CLOCK_THREAD_CPUTIME_ID);
    if (!rc) rc = ex_check_seconds("bench_matmul", "--time", target);
    if (!rc) rc = check_shapes(shapes);
    if (rc) return ex_exit_status(rc);
    if (threads > 1 && clock_id != CLOCK_MONOTONIC) {
        fprintf(stderr, "bench_matmul: --clock cpu times one thread; give --threads 1 with it\n");
        return 2;
    }
    const char *lib;
    if (!(blas_sgemm = blas_open(threads, &lib))) {
        printf("skip,openblas,%s not found (apt-get install libopenblas0-pthread)\n", lib);
        return 0;
    }
    char nth[16];
    snprintf(nth, sizeof nth, "%d", threads);
    setenv("DPAR_CPU_THREADS", nth, 1);
    dpar_runtime *rt = NULL;
    dpar_mesh *mesh = NULL;
    dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CPU, .num_devices = 1 };
    dpar_mesh_desc md = { .ndim = 1, .shape = { 1 }, .axis_names = { "data" } };
    if (dpar_runtime_create(&rd, &rt) || dpar_mesh_create(rt, &md, &mesh)) {
        fprintf(stderr, "bench_matmul: %s\n", dpar_last_error());
        dpar_runtime_destroy(rt);
        return 1;
    }
    printf("kind,shape,threads,dpar_us,dpar_gflops,blas_us,blas_gflops,ratio,ratio_min,ratio_max,alts\n");
    rc = 0;
    char s[64];
    for (const char *q = shapes; rc >= 0 && ex_list_next(&q, s, sizeof s);) {
        int r = run_shape(rt, mesh, s, threads, target, alts);
        if (r) rc = r;
    }
    dpar_runtime_destroy(rt);
    return rc < 0 ? 1 : rc;
}
