/* bench_ops.c — every op of dpar against its limit on this machine, measured
   in the same run (issue 13's performance rows, issue 17's method).

   One row per op, variant and dtype, at the per-device shapes of the two
   seed models (the CNN of examples/train_cnn.c: global batch 64 on 4 devices,
   so 16 images of 28x28 per device; the GPT of examples/train_gpt.c: batch 32
   on dp 2 x tp 2, so 16 sequences of T = 64 tokens, C = 128, 2 of the 4 heads
   (head size 32) and an MLP slice of 4C/2 = 256 per device), and the ops of
   examples/train_digits.c's step (batch 64 on one device, 64-128-10; their
   op names hold "digits"). Every float
   dtype of dpar_dtype is tried; an op that refuses one (DPAR_ERR_DTYPE or
   DPAR_ERR_BACKEND) prints "opskip,backend,op,dtype,reason" instead of a row.

       ops,backend,op,dtype,shape,threads,time_us,GBps,stream_GBps,pct_stream,pct_stream_min,pct_stream_max,
           gflops,blas_gflops,pct_blas,pct_blas_min,pct_blas_max,alts,working_set_bytes,stream_kernel
   (rates to 4 significant digits, percentages to 3: a llvmpipe row can be at 0.01%)

   Limits (both measured alternating with the op):
     stream  bytes / the stream bandwidth (bench_util.h stream_bw_best: the
             fastest of copy, add, in-place add, fill, read and the op's own
             access mix (its read-only, in-place and write-only operands in
             units of its largest), each with non-temporal and ordinary
             stores; as many threads as the op uses; every kernel over the
             op's working set, working_set_bytes: the distinct bytes it
             touches, so an op whose operands fit in the L1, L2 or L3 is held
             to that cache's bandwidth, not DRAM's; stream_kernel names the
             kernel of the limit). A lower bound on the op's time. bytes =
             what the op must read plus write at the least: every operand it
             needs read once, every output written once, an operand updated
             in place both (the formula of each op is in its builder). Every
             row has it; pct_stream = 100 * limit / time.
     sgemm   for matmul, conv2d (forward and both backward ops) and
             attention: OpenBLAS cblas_sgemm (opened at run time as
             bench_matmul does) at the equivalent GEMM shapes, as many
             threads as the op uses: conv as im2col GEMMs (forward
             [N*OH*OW, KH*KW*C] x [KH*KW*C, O], input gradient
             [N*OH*OW, O] x [O, KH*KW*C], kernel gradient
             [KH*KW*C, N*OH*OW] x [N*OH*OW, O]); attention as its per-head
             GEMMs (forward QK^T and PV, backward QK^T, dO V^T, P^T dO, dS K,
             dS^T Q), scaled by (T + 1) / 2T when causal (the products'
             share of the lower triangle). pct_blas = 100 * sgemm time / op
             time, the "% of its limit" of these rows; the columns stay empty
             for the others.
   Timing: per row, `alts` alternations (5 by default) of the stream kernel,
   the op and (GEMM rows) sgemm, each trial the mean over back-to-back calls
   filling its share of --time; time_us is the median op trial, the pcts the
   medians of the per-alternation ratios with their min and max. The stream
   limit uses the best stream trial of the row (the least disturbed view of
   what the machine did); a stream trial starts after two warm-up passes
   over its arrays, in the cache state that the op's back-to-back calls
   keep too (bench_util.h ST_WARM). The op runs in a one-device shard_map, as the
   training jobs call it, and each trial ends with a read of its output (the
   device has finished).

   A median above 100% of the stream limit is impossible: the run goes on,
   prints "bench_ops: ... the measurement is broken" on stderr and exits 3.
   Above 100% of sgemm is possible (dpar beats OpenBLAS at some small shapes,
   see bench/README.md) and is reported, not failed. Other op errors print
   the op and dpar_last_error() and make the exit status 1.

   bench_ops [--backend cpu|vulkan] [--threads T] [--time SECONDS] [--alts N] [--only SUBSTRING]
             [--dtypes f32,f16,...] [--clock wall|cpu]
   --only: the rows whose op name contains SUBSTRING; --dtypes: the rows of
   those dtypes (a cast's dtype is its destination); default: all. An
   unknown dtype, or an --only and --dtypes that take no row, is refused
   with the valid names (exit 2).
   --threads: CPU backend threads per device (DPAR_CPU_THREADS; default 1,
   every device of the seed jobs is one thread on this machine). Vulkan: the
   device is llvmpipe where no GPU is, which computes on the same CPU cores
   with its own threads (LP_NUM_THREADS, default: every CPU), so its limits
   use that many threads and the figures compete with the host for the cores.
   --clock cpu: the process's CPU time per working thread (a diagnostic for a
   machine far more loaded than it has cores). Without OpenBLAS the sgemm
   columns stay empty and a "skip,openblas,..." line says why. */
#include "dpar.h"
#include "bench_util.h" /* clock, median, stream kernels, OpenBLAS */
#include <unistd.h>

/* >>ops case =================================================================
   A case: the op's operands, how each is accessed (for the bytes), the call
   and, for GEMM-class ops, the equivalent sgemm products. */
enum { MAXB = 10, MAXG = 5 };
enum { ACC_NONE = 0, ACC_R = 1, ACC_W = 2, ACC_RW = 3 }; /* how the op must touch an operand */
typedef struct {
    int64_t m, n, k;
    int ta, tb, count; /* count: products per call (attention: one per batch-head) */
} gemm_shape;
typedef struct ops_case ops_case;
typedef dpar_status (*ops_fn)(const ops_case *c);
struct ops_case {
    char op[48], shape[96];
    dpar_dtype dt;
    ops_fn run;
    dpar_buffer *b[MAXB]; /* operands in the builder's order */
    int nb;
    dpar_buffer *sync; /* read after each trial: the device is done */
    double rd, wr;     /* bytes the op must read / write */
    double rw, big;    /* of those, bytes read and written in place (in both); the largest operand's bytes */
    gemm_shape g[MAXG];
    int ng;
    double gfrac;          /* share of the products' flops the op needs (causal attention) */
    int k[4];              /* the op's integer parameters (op kind, transposes, ...) */
    dpar_conv2d_desc conv; /* zero: 3x3 SAME, stride 1, as the CNN */
    dpar_pool2d_desc pool; /* zero: 2x2 window, stride 2, VALID, as the CNN */
    dpar_status err;       /* the first error while building */
    int off;               /* left out by --only / --dtypes: nothing is built */
};

typedef struct {
    dpar_runtime *rt;
    dpar_mesh *mesh;
    const char *backend, *only, *dtypes; /* dtypes: names to run, comma-separated; NULL: all */
    int threads, alts, failed, broken;
    double target;
    sgemm_fn sgemm;   /* NULL: no OpenBLAS */
    int dry;          /* check_rows' pass: every case off; counts what --only and --dtypes take */
    int named, taken; /* the cases whose op --only takes; of them, those --dtypes takes too */
    char ops[4096];   /* the op names, comma-separated, each once */
} bench;

static int64_t count_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* host values in [0.5, 1.5) (safe for log, sqrt, division); i32: 0..imod-1 */
static dpar_status fill(dpar_runtime *rt, dpar_buffer *b, dpar_dtype dt, int ndim, const int64_t *shape, int imod) {
    int64_t n = count_of(ndim, shape);
    if (n == 0) return DPAR_OK;
    float *h = malloc((size_t)n * sizeof(float));
    if (!h) return DPAR_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == DPAR_I32 ? (float)((i * 7919) % imod) : 0.5f + (float)((i * 7919) % 97) / 97.0f;
    dpar_status s;
    if (dt == DPAR_F32) {
        s = dpar_buffer_write(b, 0, h, (size_t)n * sizeof(float));
    } else { /* through an f32 buffer and dpar_cast: any dtype the library has */
        dpar_buffer *t = NULL;
        s = dpar_buffer_create(rt, 0, DPAR_F32, ndim, shape, &t);
        if (!s) s = dpar_buffer_write(t, 0, h, (size_t)n * sizeof(float));
        if (!s) s = dpar_cast(b, t);
        dpar_buffer_destroy(t);
    }
    free(h);
    return s;
}

/* a new operand of c: counted in c->rd / c->wr by `acc`; imod for i32 indices */
static dpar_buffer *mk(bench *B, ops_case *c, int acc, dpar_dtype dt, int ndim, const int64_t *shape, int imod) {
    dpar_buffer *b = NULL;
    if (c->off || c->err || c->nb == MAXB) return NULL;
    c->err = dpar_buffer_create(B->rt, 0, dt, ndim, shape, &b);
    if (!c->err) c->err = fill(B->rt, b, dt, ndim, shape, imod > 0 ? imod : 1);
    if (c->err) {
        dpar_buffer_destroy(b);
        return NULL;
    }
    c->b[c->nb++] = b;
    double bytes = (double)count_of(ndim, shape) * (double)dpar_dtype_size(dt);
    if (acc & ACC_R) c->rd += bytes;
    if (acc & ACC_W) c->wr += bytes;
    if (acc == ACC_RW) c->rw += bytes;
    if (acc && bytes > c->big) c->big = bytes;
    if ((acc & ACC_W) && !c->sync) c->sync = b;
    return b;
}
#define SH(...) ((const int64_t[]){ __VA_ARGS__ })
#define ND(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))
/* an operand of shape (d0, d1, ...) */
#define MK(acc, dt, ...)    mk(B, c, acc, dt, ND(__VA_ARGS__), SH(__VA_ARGS__), 0)
#define MKI(acc, imod, ...) mk(B, c, acc, DPAR_I32, ND(__VA_ARGS__), SH(__VA_ARGS__), imod)

/* whether --dtypes lists `name` (no list: every dtype) */
static int dtype_on(const bench *B, const char *name) {
    size_t n = strlen(name);
    if (!B->dtypes) return 1;
    for (const char *p = B->dtypes; (p = strstr(p, name)); p += n)
        if ((p == B->dtypes || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}
/* the dry pass's count of one case, and its op name into B->ops once */
static void count_case(bench *B, const char *op, int named, int taken) {
    size_t n = strlen(op), len = strlen(B->ops), k;
    const char *p = B->ops; /* "a, b, c": op names hold no commas */
    while (*p && ((k = strcspn(p, ",")) != n || strncmp(p, op, n))) p += k + (p[k] ? 2 : 0);
    if (!*p) snprintf(B->ops + len, sizeof B->ops - len, "%s%s", len ? ", " : "", op);
    B->named += named;
    B->taken += taken;
}
static ops_case *begin(bench *B, ops_case *c, const char *op, dpar_dtype dt, const char *shape, ops_fn run) {
    memset(c, 0, sizeof *c);
    snprintf(c->op, sizeof c->op, "%s", op);
    snprintf(c->shape, sizeof c->shape, "%s", shape);
    c->dt = dt;
    c->run = run;
    c->gfrac = 1.0;
    int named = !B->only || strstr(op, B->only), taken = named && dtype_on(B, dpar_dtype_name(dt));
    if (B->dry) count_case(B, op, named, taken);
    c->off = B->dry || !taken;
    return c;
}
static void gemm(ops_case *c, int64_t m, int64_t n, int64_t k, int ta, int tb, int count) {
    if (c->ng < MAXG) c->g[c->ng++] = (gemm_shape){ m, n, k, ta, tb, count };
}

/* >>ops measure ==============================================================
   One row: alternate the stream kernel, the op and (GEMM rows) sgemm. */
typedef struct {
    const ops_case *c;
    int iters;
    double elapsed;
} ops_job;
static dpar_status ops_sm(dpar_ctx *ctx, void *user) {
    (void)ctx;
    ops_job *j = (ops_job *)user;
    dpar_status s;
    double t0 = now_s();
    for (int i = 0; i < j->iters; i++)
        if ((s = j->c->run(j->c))) return s;
    unsigned char probe[16];
    if (j->c->sync && (s = dpar_buffer_read(j->c->sync, 0, probe, dpar_dtype_size(dpar_buffer_dtype(j->c->sync)))))
        return s; /* waits for the device */
    j->elapsed = now_s() - t0;
    return DPAR_OK;
}

typedef struct {
    float *a, *b, *c;
} gemm_mem;
static int gemm_alloc(const ops_case *c, gemm_mem *m) {
    int64_t na = 1, nb = 1, nc = 1;
    for (int i = 0; i < c->ng; i++) {
        const gemm_shape *g = &c->g[i];
        na = g->m * g->k > na ? g->m * g->k : na;
        nb = g->k * g->n > nb ? g->k * g->n : nb;
        nc = g->m * g->n > nc ? g->m * g->n : nc;
    }
    m->a = calloc((size_t)na, sizeof(float));
    m->b = calloc((size_t)nb, sizeof(float));
    m->c = calloc((size_t)nc, sizeof(float));
    if (!m->a || !m->b || !m->c) return -1;
    for (int64_t i = 0; i < na; i++) m->a[i] = (float)((i * 7919) % 23) / 23.0f - 0.5f;
    for (int64_t i = 0; i < nb; i++) m->b[i] = (float)((i * 104729) % 31) / 31.0f - 0.5f;
    return 0;
}
/* seconds for `iters` passes over the case's products */
static double gemm_pass(const bench *B, const ops_case *c, const gemm_mem *m, int iters) {
    double t = 0;
    for (int i = 0; i < c->ng; i++) {
        const gemm_shape *g = &c->g[i];
        t += blas_trial(B->sgemm, g->m, g->n, g->k, g->ta, g->tb, m->a, m->b, m->c, g->count * iters);
    }
    return t;
}
static double gemm_flop(const ops_case *c) {
    double f = 0;
    for (int i = 0; i < c->ng; i++) {
        const gemm_shape *g = &c->g[i];
        f += 2.0 * (double)g->m * (double)g->n * (double)g->k * g->count;
    }
    return f * c->gfrac;
}

/* an op that refuses the dtype or is missing on the backend: a skip line, not a failure */
static int refused(bench *B, const ops_case *c, dpar_status s) {
    if (s != DPAR_ERR_DTYPE && s != DPAR_ERR_BACKEND) return 0;
    char why[160];
    snprintf(why, sizeof why, "%s", dpar_last_error());
    for (char *p = why; *p; p++)
        if (*p == ',' || *p == '\n') *p = ';';
    printf("opskip,%s,%s,%s,%s\n", B->backend, c->op, dpar_dtype_name(c->dt), why);
    return 1;
}

/* the distinct bytes the op touches (an operand read and written in place counts once): the stream
   kernels' footprint, so the limit comes from the cache level the op's operands live in */
static double working_set(const ops_case *c) {
    return c->rd + c->wr - c->rw;
}
/* the op's access mix in arrays of its largest operand (read-only, in place, write-only), for the
   stream set's mix kernel: exact for the element-wise ops and optimizer steps, whose operands are one
   size (SGD with momentum: 1 read, 2 in place, which on this VM's L3 moved 49 GB/s where the in-place
   add moved 44) */
static void access_mix(const ops_case *c, stream_set *ss) {
    if (c->big <= 0) return;
    ss->mix[0] = (int)lround((c->rd - c->rw) / c->big);
    ss->mix[1] = (int)lround(c->rw / c->big);
    ss->mix[2] = (int)lround((c->wr - c->rw) / c->big);
}

static void print_row(bench *B, const ops_case *c, double *t, double *ps, double *pb, double bw, double blas_t,
                      const char *kernel) {
    int n = B->alts;
    double tm = median(t, n), bytes = c->rd + c->wr, psm = median(ps, n);
    printf("ops,%s,%s,%s,%s,%d,%.3f,%.4g,%.4g,%.3g,%.3g,%.3g,", B->backend, c->op, dpar_dtype_name(c->dt), c->shape,
           B->threads, tm * 1e6, bytes / tm / 1e9, bw / 1e9, psm, ps[0], ps[n - 1]);
    if (pb) {
        double f = gemm_flop(c), pbm = median(pb, n);
        printf("%.4g,%.4g,%.3g,%.3g,%.3g,", f / tm / 1e9, f / blas_t / 1e9, pbm, pb[0], pb[n - 1]);
    } else {
        printf(",,,,,");
    }
    printf("%d,%.0f,%s\n", n, working_set(c), kernel);
    fflush(stdout);
    if (psm > 100.0) {
        fprintf(stderr,
                "bench_ops: %s %s %s (%s) runs at %.0f%% of its memory-traffic limit (%.0f KB read + written at "
                "the stream bandwidth): above 100%% is impossible, the measurement is broken (timing, the bytes the "
                "op must move, or the stream kernel); fix the benchmark before quoting any figure\n",
                B->backend, c->op, dpar_dtype_name(c->dt), c->shape, psm, bytes / 1e3);
        B->broken = 1;
    }
}

/* calibrate, then alternate; the case's buffers stay with the caller */
static void measure(bench *B, const ops_case *c) {
    ops_job j = { c, 1, 0 };
    dpar_shard_map_desc sd = { .fn = ops_sm, .user = &j };
    dpar_status s = dpar_shard_map(B->mesh, &sd); /* warm-up */
    if (!s) s = dpar_shard_map(B->mesh, &sd);     /* calibration */
    if (s) {
        if (!refused(B, c, s)) {
            fprintf(stderr, "bench_ops: %s %s (%s): %s\n", c->op, dpar_dtype_name(c->dt), c->shape, dpar_last_error());
            B->failed = 1;
        }
        return;
    }
    double per = j.elapsed > 1e-7 ? j.elapsed : 1e-7, pg = 0, bw = 0;
    int alts = B->alts, blas = c->ng && B->sgemm;
    stream_set ss;
    gemm_mem gm = { 0 };
    if (stream_init(&ss, B->threads, 1, (int64_t)working_set(c)) || (blas && gemm_alloc(c, &gm))) {
        fprintf(stderr, "bench_ops: %s: no memory for the limit's arrays\n", c->op);
        B->failed = 1;
        goto done;
    }
    access_mix(c, &ss);
    char kernel[32] = "";
    if (blas) pg = (gemm_pass(B, c, &gm, 1), gemm_pass(B, c, &gm, 1)); /* warm, then time one pass */
    int iters = (int)(B->target / alts / 2 / (per > pg ? per : pg));
    j.iters = iters < 1 ? 1 : iters > 100000 ? 100000 : iters;
    double t[MAX_ALTS], ps[MAX_ALTS], pb[MAX_ALTS], tg[MAX_ALTS];
    for (int k = 0; k < alts; k++) {
        double b = stream_bw_best(&ss, B->target / alts / 4);
        if (b > bw) {
            bw = b;
            stream_kernel_label(&ss, ss.best_q, ss.best_nt, kernel, sizeof kernel);
        }
        if ((s = dpar_shard_map(B->mesh, &sd))) {
            fprintf(stderr, "bench_ops: %s: %s\n", c->op, dpar_last_error());
            B->failed = 1;
            goto done;
        }
        t[k] = j.elapsed / j.iters / (clock_id == CLOCK_MONOTONIC ? 1 : B->threads);
        if (blas) {
            tg[k] = gemm_pass(B, c, &gm, j.iters) / j.iters * c->gfrac;
            pb[k] = 100.0 * tg[k] / t[k];
        }
    }
    double lm = (c->rd + c->wr) / bw; /* the best stream trial */
    for (int k = 0; k < alts; k++) ps[k] = 100.0 * lm / t[k];
    print_row(B, c, t, ps, blas ? pb : NULL, bw, blas ? median(tg, alts) : 0, kernel);
done:
    free(ss.mem);
    free(gm.a);
    free(gm.b);
    free(gm.c);
}

/* measures a built case (or reports why it could not be built) and frees its buffers */
static void finish(bench *B, ops_case *c) {
    if (!c->off) {
        if (c->err) {
            if (!refused(B, c, c->err)) {
                fprintf(stderr, "bench_ops: %s (%s): %s\n", c->op, c->shape, dpar_last_error());
                B->failed = 1;
            }
        } else {
            measure(B, c);
        }
    }
    for (int i = 0; i < c->nb; i++) dpar_buffer_destroy(c->b[i]);
    c->nb = 0;
}

/* >>ops cnn ==================================================================
   The CNN's ops per device: 16 images, conv1 28x28x1 -> 32, avg_pool 2x2,
   conv2 14x14x32 -> 64, avg_pool 2x2, dense 3136 -> 256 -> 10. */
static dpar_status r_conv(const ops_case *c) {
    return dpar_conv2d(c->b[3], c->b[0], c->b[1], c->b[2], &c->conv);
}
static dpar_status r_conv_dx(const ops_case *c) {
    return dpar_conv2d_backward_input(c->b[0], c->b[1], c->b[2], &c->conv);
}
static dpar_status r_conv_dw(const ops_case *c) {
    return dpar_conv2d_backward_kernel(c->b[0], c->b[1], c->b[2], c->b[3], &c->conv);
}
/* conv2d and its two gradients on x [n,h,w,ci], kernel 3x3, SAME, stride 1 (so OH = H, OW = W):
     forward:      bytes = x + w + b read, y written; sgemm [n*h*w, 9ci] x [9ci, co]
     input grad:   bytes = dy + w read, dx written;    sgemm [n*h*w, co] x [co, 9ci]
     kernel grad:  bytes = x + dy read, dw + db written; sgemm [9ci, n*h*w] x [n*h*w, co] */
static void conv_rows(bench *B, dpar_dtype dt, const char *name, int64_t n, int64_t h, int64_t w, int64_t ci,
                      int64_t co) {
    ops_case cc, *c = &cc;
    char sh[96], op[48];
    snprintf(sh, sizeof sh, "x%lldx%lldx%lldx%lld w3x3x%lldx%lld", (long long)n, (long long)h, (long long)w,
             (long long)ci, (long long)ci, (long long)co);
    snprintf(op, sizeof op, "conv2d:%s", name);
    begin(B, c, op, dt, sh, r_conv);
    MK(ACC_R, dt, n, h, w, ci), MK(ACC_R, dt, 3, 3, ci, co), MK(ACC_R, dt, co), MK(ACC_W, dt, n, h, w, co);
    gemm(c, n * h * w, co, 9 * ci, 0, 0, 1);
    finish(B, c);
    snprintf(op, sizeof op, "conv2d_backward_input:%s", name);
    begin(B, c, op, dt, sh, r_conv_dx);
    MK(ACC_W, dt, n, h, w, ci), MK(ACC_R, dt, n, h, w, co), MK(ACC_R, dt, 3, 3, ci, co);
    gemm(c, n * h * w, 9 * ci, co, 0, 1, 1);
    finish(B, c);
    snprintf(op, sizeof op, "conv2d_backward_kernel:%s", name);
    begin(B, c, op, dt, sh, r_conv_dw);
    MK(ACC_W, dt, 3, 3, ci, co), MK(ACC_W, dt, co), MK(ACC_R, dt, n, h, w, ci), MK(ACC_R, dt, n, h, w, co);
    gemm(c, 9 * ci, co, n * h * w, 1, 0, 1);
    finish(B, c);
}

static dpar_status r_avgpool(const ops_case *c) {
    return dpar_avg_pool2d(c->b[1], c->b[0], &c->pool);
}
static dpar_status r_avgpool_bwd(const ops_case *c) {
    return dpar_avg_pool2d_backward(c->b[0], c->b[1], &c->pool);
}
static dpar_status r_maxpool(const ops_case *c) {
    return dpar_max_pool2d(c->b[1], c->b[0], &c->pool);
}
static dpar_status r_maxpool_bwd(const ops_case *c) {
    return dpar_max_pool2d_backward(c->b[0], c->b[1], c->b[2], &c->pool);
}
/* 2x2 pools, stride 2, x [n,h,w,ch] -> y [n,h/2,w/2,ch]:
     forward: x read, y written; avg backward: dy read, dx written; max backward: dy + x read, dx written */
static void pool_rows(bench *B, dpar_dtype dt, int64_t n, int64_t h, int64_t w, int64_t ch) {
    ops_case cc, *c = &cc;
    char sh[64];
    snprintf(sh, sizeof sh, "%lldx%lldx%lldx%lld", (long long)n, (long long)h, (long long)w, (long long)ch);
    for (int mx = 0; mx < 2; mx++) {
        begin(B, c, mx ? "max_pool2d" : "avg_pool2d", dt, sh, mx ? r_maxpool : r_avgpool);
        MK(ACC_R, dt, n, h, w, ch), MK(ACC_W, dt, n, h / 2, w / 2, ch);
        finish(B, c);
        begin(B, c, mx ? "max_pool2d_backward" : "avg_pool2d_backward", dt, sh, mx ? r_maxpool_bwd : r_avgpool_bwd);
        MK(ACC_W, dt, n, h, w, ch), MK(ACC_R, dt, n, h / 2, w / 2, ch);
        if (mx) MK(ACC_R, dt, n, h, w, ch);
        finish(B, c);
    }
}

static dpar_status r_matmul(const ops_case *c) {
    return dpar_matmul(c->b[2], c->b[0], c->b[1], c->k[0], c->k[1], 1.0f, 0.0f);
}
static dpar_status r_matmul_batched(const ops_case *c) {
    return dpar_matmul_batched(c->b[2], c->b[0], c->b[1], c->k[0], c->k[1], 1.0f, 0.0f);
}
/* C[M,N] = op(A)[M,K] op(B)[K,N]: A + B read, C written; sgemm at the same shape */
static void matmul_row(bench *B, dpar_dtype dt, const char *what, const char *shape) {
    ops_case cc, *c = &cc;
    long long m, n, k;
    char t[3] = "nn", op[48];
    if (sscanf(shape, "%lldx%lldx%lld:%2[nt]", &m, &n, &k, t) < 3) return;
    snprintf(op, sizeof op, "matmul:%s", what);
    begin(B, c, op, dt, shape, r_matmul);
    c->k[0] = t[0] == 't';
    c->k[1] = t[1] == 't';
    MK(ACC_R, dt, c->k[0] ? k : m, c->k[0] ? m : k), MK(ACC_R, dt, c->k[1] ? n : k, c->k[1] ? k : n);
    MK(ACC_W, dt, m, n);
    gemm(c, m, n, k, c->k[0], c->k[1], 1);
    finish(B, c);
}

static dpar_status r_relu(const ops_case *c) {
    return dpar_relu(c->b[1], c->b[0]);
}
static dpar_status r_relu_bwd(const ops_case *c) {
    return dpar_relu_backward(c->b[0], c->b[1], c->b[2]);
}
static dpar_status r_bias_add(const ops_case *c) {
    return dpar_bias_add(c->b[0], c->b[1]);
}
static dpar_status r_bias_grad(const ops_case *c) {
    return dpar_bias_grad(c->b[0], c->b[1], 0.0f);
}
static dpar_status r_xent(const ops_case *c) {
    return dpar_softmax_xent(c->b[0], c->b[1], c->b[2], c->b[3]);
}
static dpar_status r_mse(const ops_case *c) {
    return dpar_mse(c->b[0], c->b[1], c->b[2], c->b[3]);
}

static void cnn_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    conv_rows(B, dt, "cnn1", 16, 28, 28, 1, 32);
    conv_rows(B, dt, "cnn2", 16, 14, 14, 32, 64);
    pool_rows(B, dt, 16, 28, 28, 32);
    pool_rows(B, dt, 16, 14, 14, 64);
    matmul_row(B, dt, "cnn dense1", "16x256x3136");
    matmul_row(B, dt, "cnn dense1 dx", "16x3136x256:nt");
    matmul_row(B, dt, "cnn dense1 dw", "3136x256x16:tn");
    matmul_row(B, dt, "cnn dense2", "16x10x256");
    /* relu: x read, y written; backward: dy + x read, dx written */
    begin(B, c, "relu", dt, "16x28x28x32", r_relu);
    MK(ACC_R, dt, 16, 28, 28, 32), MK(ACC_W, dt, 16, 28, 28, 32);
    finish(B, c);
    begin(B, c, "relu_backward", dt, "16x28x28x32", r_relu_bwd);
    MK(ACC_W, dt, 16, 28, 28, 32), MK(ACC_R, dt, 16, 28, 28, 32), MK(ACC_R, dt, 16, 28, 28, 32);
    finish(B, c);
    /* bias_add: y read and written, b read; bias_grad (beta 0): dy read, db written */
    begin(B, c, "bias_add", dt, "16x256", r_bias_add);
    MK(ACC_RW, dt, 16, 256), MK(ACC_R, dt, 256);
    finish(B, c);
    begin(B, c, "bias_grad", dt, "16x256", r_bias_grad);
    MK(ACC_W, dt, 256), MK(ACC_R, dt, 16, 256);
    finish(B, c);
    /* softmax_xent and mse: the inputs read, loss + gradient written */
    begin(B, c, "softmax_xent", dt, "16x10", r_xent);
    MK(ACC_W, DPAR_F32, 1), MK(ACC_W, dt, 16, 10), MK(ACC_R, dt, 16, 10), MKI(ACC_R, 10, 16);
    finish(B, c);
    begin(B, c, "mse", dt, "16x10", r_mse);
    MK(ACC_W, DPAR_F32, 1), MK(ACC_W, dt, 16, 10), MK(ACC_R, dt, 16, 10), MK(ACC_R, dt, 16, 10);
    finish(B, c);
}

/* >>ops gpt ==================================================================
   The GPT's ops per device: 16 sequences x T 64 = 1024 token rows, C 128,
   2 heads of 32, MLP slice 256, vocabulary 65. */
enum { G_B = 16, G_T = 64, G_C = 128, G_H = 2, G_HD = 32, G_F = 256, G_V = 65, G_ROWS = G_B * G_T };

static dpar_status r_embed(const ops_case *c) {
    return dpar_embedding(c->b[0], c->b[1], c->b[2]);
}
static dpar_status r_embed_bwd(const ops_case *c) {
    return dpar_embedding_backward(c->b[0], c->b[1], c->b[2], 0.0f);
}
static dpar_status r_norm(const ops_case *c) {
    return (c->k[0] ? dpar_rms_norm : dpar_layer_norm)(c->b[0], c->b[1], c->b[2], c->b[3], c->b[4], 1e-5f);
}
static dpar_status r_norm_bwd(const ops_case *c) {
    return (c->k[0] ? dpar_rms_norm_backward : dpar_layer_norm_backward)(c->b[0], c->b[1], c->b[2], c->b[3], c->b[4],
                                                                         c->b[5], c->b[6]);
}
static dpar_status r_attn(const ops_case *c) {
    return dpar_attention(c->b[0], c->b[1], c->b[2], c->b[3], c->b[4], 0.0f, true);
}
static dpar_status r_attn_bwd(const ops_case *c) {
    return dpar_attention_backward(c->b[0], c->b[1], c->b[2], c->b[3], c->b[4], c->b[5], c->b[6], c->b[7], 0.0f, true);
}
static dpar_status r_xent2(const ops_case *c) {
    static const dpar_xent_desc d = { .use_ignore = true, .ignore_label = -100, .label_smoothing = 0.1f };
    return dpar_cross_entropy(c->b[0], c->b[1], c->b[2], c->b[3], &d);
}

/* embedding: the K = 1024 rows it gathers (K*D of the table, not V*D) + idx read, out written;
   backward (beta 0): dout + idx read, the whole dtable [V,D] written */
static void embed_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    begin(B, c, "embedding", dt, "table 65x128 idx 16x64", r_embed);
    MK(ACC_W, dt, G_ROWS, G_C), MK(ACC_NONE, dt, G_V, G_C), MKI(ACC_R, G_V, G_B, G_T);
    c->rd += (double)G_ROWS * G_C * (double)dpar_dtype_size(dt);
    finish(B, c);
    begin(B, c, "embedding_backward", dt, "table 65x128 idx 16x64", r_embed_bwd);
    MK(ACC_W, dt, G_V, G_C), MK(ACC_R, dt, G_ROWS, G_C), MKI(ACC_R, G_V, G_B, G_T);
    finish(B, c);
}

/* layer_norm / rms_norm over C = 128: x + w + b read, y + stats (8 bytes a row) written;
   backward: dy + x + w + stats read, dx + dw + db written */
static void norm_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    for (int rms = 0; rms < 2; rms++) {
        begin(B, c, rms ? "rms_norm" : "layer_norm", dt, "1024x128", r_norm);
        c->k[0] = rms;
        MK(ACC_W, dt, G_ROWS, G_C), MK(ACC_W, DPAR_F32, G_ROWS, 2), MK(ACC_R, dt, G_ROWS, G_C), MK(ACC_R, dt, G_C);
        MK(ACC_R, dt, G_C);
        finish(B, c);
        begin(B, c, rms ? "rms_norm_backward" : "layer_norm_backward", dt, "1024x128", r_norm_bwd);
        c->k[0] = rms;
        MK(ACC_W, dt, G_ROWS, G_C), MK(ACC_W, dt, G_C), MK(ACC_W, dt, G_C), MK(ACC_R, dt, G_ROWS, G_C);
        MK(ACC_R, dt, G_ROWS, G_C), MK(ACC_R, dt, G_C), MK(ACC_R, DPAR_F32, G_ROWS, 2);
        finish(B, c);
    }
}

/* causal attention, q k v out [16,2,64,32], per batch-head (32 of them):
     forward:  q + k + v read, out + stats [.., 2] written; sgemm QK^T [64,32]x[32,64], PV [64,64]x[64,32]
     backward: dout + q + k + v read, stats read and written, dq + dk + dv written;
               sgemm QK^T, dO V^T, P^T dO, dS K, dS^T Q
   the products scaled by (T + 1) / 2T: the causal triangle */
static void attn_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    const int bh = G_B * G_H;
    begin(B, c, "attention", dt, "16x2x64x32 causal", r_attn);
    MK(ACC_W, dt, G_B, G_H, G_T, G_HD), MK(ACC_W, DPAR_F32, G_B, G_H, G_T, 2);
    for (int i = 0; i < 3; i++) MK(ACC_R, dt, G_B, G_H, G_T, G_HD);
    gemm(c, G_T, G_T, G_HD, 0, 1, bh), gemm(c, G_T, G_HD, G_T, 0, 0, bh);
    c->gfrac = (G_T + 1.0) / (2.0 * G_T);
    finish(B, c);
    begin(B, c, "attention_backward", dt, "16x2x64x32 causal", r_attn_bwd);
    for (int i = 0; i < 3; i++) MK(ACC_W, dt, G_B, G_H, G_T, G_HD);
    MK(ACC_RW, DPAR_F32, G_B, G_H, G_T, 2);
    for (int i = 0; i < 4; i++) MK(ACC_R, dt, G_B, G_H, G_T, G_HD);
    gemm(c, G_T, G_T, G_HD, 0, 1, bh), gemm(c, G_T, G_T, G_HD, 0, 1, bh), gemm(c, G_T, G_HD, G_T, 1, 0, bh);
    gemm(c, G_T, G_HD, G_T, 0, 0, bh), gemm(c, G_T, G_HD, G_T, 1, 0, bh);
    c->gfrac = (G_T + 1.0) / (2.0 * G_T);
    finish(B, c);
}

static void gpt_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    embed_rows(B, dt);
    norm_rows(B, dt);
    attn_rows(B, dt);
    matmul_row(B, dt, "gpt q/k/v", "1024x64x128");
    matmul_row(B, dt, "gpt proj", "1024x128x64");
    matmul_row(B, dt, "gpt fc1", "1024x256x128");
    matmul_row(B, dt, "gpt fc2", "1024x128x256");
    matmul_row(B, dt, "gpt head", "1024x65x128");
    matmul_row(B, dt, "gpt fc1 dw", "128x256x1024:tn");
    /* matmul_batched: the per-head scores QK^T [32 x 64x32] x [32 x 64x32]^T: A + B read, C written */
    begin(B, c, "matmul_batched", dt, "32x(64x64x32):nt", r_matmul_batched);
    c->k[1] = 1;
    MK(ACC_R, dt, G_B * G_H, G_T, G_HD), MK(ACC_R, dt, G_B * G_H, G_T, G_HD), MK(ACC_W, dt, G_B * G_H, G_T, G_T);
    gemm(c, G_T, G_T, G_HD, 0, 1, G_B * G_H);
    finish(B, c);
    /* cross-entropy with ignore label and smoothing 0.1 over the vocabulary: logits + labels read,
       loss + dlogits written */
    begin(B, c, "cross_entropy", dt, "1024x65", r_xent2);
    MK(ACC_W, DPAR_F32, 1), MK(ACC_W, dt, G_ROWS, G_V), MK(ACC_R, dt, G_ROWS, G_V), MKI(ACC_R, G_V, G_ROWS);
    finish(B, c);
}

/* >>ops elementwise ==========================================================
   The elementwise family, reductions, softmax and dropout at the GPT's
   activation shapes ([1024, 256] after fc1, [1024, 128] the residual). */
static const char *const unary_names[] = { "neg",     "exp",       "log",      "sqrt",   "rsqrt",  "tanh",
                                           "sigmoid", "gelu_tanh", "gelu_erf", "silu",   "square", "add_s",
                                           "mul_s",   "rsub_s",    "div_s",    "rdiv_s", "pow_s" };
static const char *const binary_names[] = { "add", "sub", "mul", "div" };
static const char *const reduce_names[] = { "sum", "mean", "max", "argmax" };
/* names[i], or "op<i>" for an op added to the enum after this table */
static const char *op_name(const char *const *names, int n, int i, char *buf, size_t cap) {
    if (i < n) return names[i];
    snprintf(buf, cap, "op%d", i);
    return buf;
}
#define NAME(names, i) op_name(names, (int)(sizeof names / sizeof *names), i, nb, sizeof nb)

static dpar_status r_unary(const ops_case *c) {
    return dpar_unary(c->b[1], c->b[0], (dpar_unary_op)c->k[0], 2.0f);
}
static dpar_status r_unary_bwd(const ops_case *c) {
    return dpar_unary_backward(c->b[0], c->b[1], c->b[2], (dpar_unary_op)c->k[0], 2.0f);
}
static dpar_status r_binary(const ops_case *c) {
    return dpar_binary(c->b[0], c->b[1], c->b[2], (dpar_binary_op)c->k[0]);
}
static dpar_status r_binary_bwd(const ops_case *c) {
    return dpar_binary_backward(c->b[0], c->b[1], c->b[2], c->b[3], c->b[4], (dpar_binary_op)c->k[0]);
}
static dpar_status r_where(const ops_case *c) {
    return dpar_where(c->b[0], c->b[1], c->b[2], c->b[3], 0, 0);
}
static const int last_axis[] = { -1 };
static dpar_status r_reduce(const ops_case *c) {
    return dpar_reduce(c->b[0], c->b[1], (dpar_reduce_kind)c->k[0], last_axis, 1);
}
static dpar_status r_reduce_bwd(const ops_case *c) {
    return dpar_reduce_backward(c->b[0], c->b[1], c->b[2], (dpar_reduce_kind)c->k[0], last_axis, 1);
}
static dpar_status r_softmax(const ops_case *c) {
    return dpar_softmax(c->b[1], c->b[0], c->k[0]);
}
static dpar_status r_softmax_bwd(const ops_case *c) {
    return dpar_softmax_backward(c->b[0], c->b[1], c->b[2], c->k[0]);
}
static dpar_status r_dropout(const ops_case *c) {
    return dpar_dropout(c->b[1], c->b[0], 0.1f, 42, 7, 0);
}

/* unary: x read, y written; backward: dy (and x, where op' depends on x) read, dx written */
static void unary_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    char op[48], nb[16];
    for (int u = 0; u < DPAR_UNARY_COUNT; u++) {
        snprintf(op, sizeof op, "unary:%s", NAME(unary_names, u));
        begin(B, c, op, dt, "1024x256", r_unary);
        c->k[0] = u;
        MK(ACC_R, dt, G_ROWS, G_F), MK(ACC_W, dt, G_ROWS, G_F);
        finish(B, c);
        int needs_x = !(u == DPAR_UNARY_NEG || u == DPAR_UNARY_ADD_SCALAR || u == DPAR_UNARY_MUL_SCALAR ||
                        u == DPAR_UNARY_RSUB_SCALAR || u == DPAR_UNARY_DIV_SCALAR);
        snprintf(op, sizeof op, "unary_backward:%s", NAME(unary_names, u));
        begin(B, c, op, dt, "1024x256", r_unary_bwd);
        c->k[0] = u;
        MK(ACC_W, dt, G_ROWS, G_F), MK(ACC_R, dt, G_ROWS, G_F), MK(needs_x ? ACC_R : ACC_NONE, dt, G_ROWS, G_F);
        finish(B, c);
    }
}

/* binary: a + b read, y written (the wpe broadcast reads b [64,128] once);
   backward: dy (and a, b for mul / div) read, da + db written (db summed to its shape) */
static void binary_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    char op[48], nb[16];
    for (int o = 0; o < DPAR_BINARY_COUNT; o++) {
        snprintf(op, sizeof op, "binary:%s", NAME(binary_names, o));
        begin(B, c, op, dt, "1024x128", r_binary);
        c->k[0] = o;
        MK(ACC_W, dt, G_ROWS, G_C), MK(ACC_R, dt, G_ROWS, G_C), MK(ACC_R, dt, G_ROWS, G_C);
        finish(B, c);
        snprintf(op, sizeof op, "binary_backward:%s", NAME(binary_names, o));
        begin(B, c, op, dt, "1024x128", r_binary_bwd);
        c->k[0] = o;
        int ab = o == DPAR_BINARY_MUL || o == DPAR_BINARY_DIV ? ACC_R : ACC_NONE;
        MK(ACC_W, dt, G_ROWS, G_C), MK(ACC_W, dt, G_ROWS, G_C), MK(ACC_R, dt, G_ROWS, G_C);
        MK(ab, dt, G_ROWS, G_C), MK(ab, dt, G_ROWS, G_C);
        finish(B, c);
    }
    begin(B, c, "binary:add broadcast", dt, "16x64x128 + 64x128", r_binary);
    MK(ACC_W, dt, G_B, G_T, G_C), MK(ACC_R, dt, G_B, G_T, G_C), MK(ACC_R, dt, G_T, G_C);
    finish(B, c);
    begin(B, c, "binary_backward:add broadcast", dt, "16x64x128 + 64x128", r_binary_bwd);
    MK(ACC_W, dt, G_B, G_T, G_C), MK(ACC_W, dt, G_T, G_C), MK(ACC_R, dt, G_B, G_T, G_C);
    MK(ACC_NONE, dt, G_B, G_T, G_C), MK(ACC_NONE, dt, G_T, G_C);
    finish(B, c);
    /* a product's gradients: da = dy b with b broadcast along rows, db = sum of dy a over the batch */
    begin(B, c, "binary_backward:mul broadcast", dt, "16x64x128 * 64x128", r_binary_bwd);
    c->k[0] = DPAR_BINARY_MUL;
    MK(ACC_W, dt, G_B, G_T, G_C), MK(ACC_W, dt, G_T, G_C), MK(ACC_R, dt, G_B, G_T, G_C);
    MK(ACC_R, dt, G_B, G_T, G_C), MK(ACC_R, dt, G_T, G_C);
    finish(B, c);
    /* where: cond + a + b read, y written */
    begin(B, c, "where", dt, "1024x256", r_where);
    MK(ACC_W, dt, G_ROWS, G_F), MK(ACC_R, dt, G_ROWS, G_F), MK(ACC_R, dt, G_ROWS, G_F), MK(ACC_R, dt, G_ROWS, G_F);
    finish(B, c);
}

/* reductions over the last axis of the logits [1024, 65]: x read, y written;
   backward: dy (and x for max) read, dx written. softmax / log_softmax over
   the attention scores [2048, 64]: x read, y written; backward: dy + y read,
   dx written. dropout: x read, y written (the mask is computed, not stored). */
static void reduce_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    char op[48], nb[16];
    for (int k = 0; k < DPAR_REDUCE_KIND_COUNT; k++) {
        snprintf(op, sizeof op, "reduce:%s", NAME(reduce_names, k));
        begin(B, c, op, dt, "1024x65 axis -1", r_reduce);
        c->k[0] = k;
        MK(ACC_W, k == DPAR_REDUCE_ARGMAX ? DPAR_I32 : dt, G_ROWS), MK(ACC_R, dt, G_ROWS, G_V);
        finish(B, c);
        if (k == DPAR_REDUCE_ARGMAX) continue;
        snprintf(op, sizeof op, "reduce_backward:%s", NAME(reduce_names, k));
        begin(B, c, op, dt, "1024x65 axis -1", r_reduce_bwd);
        c->k[0] = k;
        MK(ACC_W, dt, G_ROWS, G_V), MK(ACC_R, dt, G_ROWS), MK(k == DPAR_REDUCE_MAX ? ACC_R : ACC_NONE, dt, G_ROWS, G_V);
        finish(B, c);
    }
    for (int lg = 0; lg < 2; lg++) {
        begin(B, c, lg ? "log_softmax" : "softmax", dt, "2048x64", r_softmax);
        c->k[0] = lg;
        MK(ACC_R, dt, G_B * G_H * G_T, G_T), MK(ACC_W, dt, G_B * G_H * G_T, G_T);
        finish(B, c);
        begin(B, c, lg ? "log_softmax_backward" : "softmax_backward", dt, "2048x64", r_softmax_bwd);
        c->k[0] = lg;
        MK(ACC_W, dt, G_B * G_H * G_T, G_T), MK(ACC_R, dt, G_B * G_H * G_T, G_T), MK(ACC_R, dt, G_B * G_H * G_T, G_T);
        finish(B, c);
    }
    begin(B, c, "dropout", dt, "1024x128 rate 0.1", r_dropout);
    MK(ACC_R, dt, G_ROWS, G_C), MK(ACC_W, dt, G_ROWS, G_C);
    finish(B, c);
}

/* >>ops optim-copy ===========================================================
   Optimizer steps and the buffer ops on the CNN's largest parameter (dense1,
   3136 x 256 = 802,816 floats), casts, and the shape ops. */
enum { P_N = 3136 * 256 };
static dpar_status r_adamw(const ops_case *c) {
    static const dpar_adamw_desc d = { .learning_rate = 1e-3f, .weight_decay = 1e-4f };
    return dpar_adamw_update(&d, c->b[0], c->b[1], c->b[2], c->b[3], 10, 1.0f);
}
static dpar_status r_sgd(const ops_case *c) {
    static const dpar_sgd_desc d = { .learning_rate = 0.05f, .momentum = 0.9f };
    return dpar_sgd_update(&d, c->b[0], c->b[1], c->b[2], 1.0f);
}
static dpar_status r_sum(const ops_case *c) {
    return (c->k[0] ? dpar_sum_squares : dpar_sum)(c->b[0], c->b[1]);
}
static dpar_status r_axpy(const ops_case *c) {
    return dpar_axpy(c->b[0], 0.5f, c->b[1]);
}
static dpar_status r_scale(const ops_case *c) {
    return dpar_scale(c->b[0], 0.5f);
}
static dpar_status r_fill(const ops_case *c) {
    return dpar_fill(c->b[0], 0.5f);
}
static dpar_status r_copy(const ops_case *c) {
    return dpar_copy(c->b[0], c->b[1]);
}
static dpar_status r_cast(const ops_case *c) {
    return dpar_cast(c->b[0], c->b[1]);
}

/* adamw: param, m, v read and written, grad read (m, v f32); sgd with momentum:
   param and momentum read and written, grad read; sum / sum_squares: x read;
   axpy: y read and written, x read; scale: x read and written; fill: x written;
   copy and cast: src read, dst written */
static void optim_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    begin(B, c, "adamw_update", dt, "802816", r_adamw);
    MK(ACC_RW, dt, P_N), MK(ACC_R, dt, P_N), MK(ACC_RW, DPAR_F32, P_N), MK(ACC_RW, DPAR_F32, P_N);
    finish(B, c);
    begin(B, c, "sgd_update", dt, "802816 momentum 0.9", r_sgd);
    MK(ACC_RW, dt, P_N), MK(ACC_R, dt, P_N), MK(ACC_RW, dt, P_N);
    finish(B, c);
    for (int sq = 0; sq < 2; sq++) {
        begin(B, c, sq ? "sum_squares" : "sum", dt, "802816", r_sum);
        c->k[0] = sq;
        MK(ACC_W, DPAR_F32, 1), MK(ACC_R, dt, P_N);
        finish(B, c);
    }
    begin(B, c, "axpy", dt, "802816", r_axpy);
    MK(ACC_RW, dt, P_N), MK(ACC_R, dt, P_N);
    finish(B, c);
    begin(B, c, "scale", dt, "802816", r_scale);
    MK(ACC_RW, dt, P_N);
    finish(B, c);
    begin(B, c, "fill", dt, "802816", r_fill);
    MK(ACC_W, dt, P_N);
    finish(B, c);
    begin(B, c, "copy", dt, "802816", r_copy);
    MK(ACC_W, dt, P_N), MK(ACC_R, dt, P_N);
    finish(B, c);
} /* The step of examples/train_digits.c's MLP (64-128-10, batch 64 on one device), op by op: its five
   matmuls, bias_add, relu and the backward ops at its shapes, softmax_xent and the SGD update of W1
   (the largest of its four); bytes as in the rows above */
static void digits_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    matmul_row(B, dt, "digits fc1", "64x128x64");
    matmul_row(B, dt, "digits fc1 dw", "64x128x64:tn");
    matmul_row(B, dt, "digits fc2", "64x10x128");
    matmul_row(B, dt, "digits fc2 dw", "128x10x64:tn");
    matmul_row(B, dt, "digits fc2 dx", "64x128x10:nt");
    const int64_t width[2] = { 128, 10 };
    for (int w = 0; w < 2; w++) {
        char shape[24];
        snprintf(shape, sizeof shape, "64x%lld", (long long)width[w]);
        begin(B, c, "bias_add:digits", dt, shape, r_bias_add);
        MK(ACC_RW, dt, 64, width[w]), MK(ACC_R, dt, width[w]);
        finish(B, c);
        begin(B, c, "bias_grad:digits", dt, shape, r_bias_grad);
        MK(ACC_W, dt, width[w]), MK(ACC_R, dt, 64, width[w]);
        finish(B, c);
    }
    begin(B, c, "relu:digits", dt, "64x128", r_relu);
    MK(ACC_R, dt, 64, 128), MK(ACC_W, dt, 64, 128);
    finish(B, c);
    begin(B, c, "relu_backward:digits", dt, "64x128", r_relu_bwd);
    MK(ACC_W, dt, 64, 128), MK(ACC_R, dt, 64, 128), MK(ACC_R, dt, 64, 128);
    finish(B, c);
    begin(B, c, "softmax_xent:digits", dt, "64x10", r_xent);
    MK(ACC_W, DPAR_F32, 1), MK(ACC_W, dt, 64, 10), MK(ACC_R, dt, 64, 10), MKI(ACC_R, 10, 64);
    finish(B, c);
    begin(B, c, "sgd_update:digits", dt, "64x128 momentum 0.9", r_sgd);
    MK(ACC_RW, dt, 64 * 128), MK(ACC_R, dt, 64 * 128), MK(ACC_RW, dt, 64 * 128);
    finish(B, c);
}

/* every pair of distinct dtypes, from `src` (rows named cast:src->dst, dtype column = dst) */
static void cast_rows(bench *B, dpar_dtype src) {
    ops_case cc, *c = &cc;
    char op[48];
    for (int d = 0; d < DPAR_DTYPE_COUNT; d++) {
        if (d == (int)src) continue;
        snprintf(op, sizeof op, "cast:%s->%s", dpar_dtype_name(src), dpar_dtype_name((dpar_dtype)d));
        begin(B, c, op, (dpar_dtype)d, "1024x128", r_cast);
        MK(ACC_W, (dpar_dtype)d, G_ROWS, G_C), mk(B, c, ACC_R, src, 2, SH(G_ROWS, G_C), 1000);
        finish(B, c);
    }
}

static const int heads_perm[] = { 0, 2, 1, 3 };
static const int64_t slice_start[] = { 0, 32 }, pad_lo[] = { 0, 1, 1, 0 };
static dpar_status r_transpose(const ops_case *c) {
    return dpar_transpose(c->b[1], c->b[0], heads_perm);
}
static dpar_status r_bcast(const ops_case *c) {
    return dpar_broadcast_to(c->b[1], c->b[0]);
}
static dpar_status r_slice(const ops_case *c) {
    return dpar_slice(c->b[1], c->b[0], slice_start, NULL);
}
static dpar_status r_slice_bwd(const ops_case *c) {
    return dpar_slice_backward(c->b[0], c->b[1], slice_start, NULL);
}
static dpar_status r_pad(const ops_case *c) {
    return dpar_pad(c->b[1], c->b[0], pad_lo, 0.0f);
}
static dpar_status r_concat(const ops_case *c) {
    return dpar_concat(c->b[0], (const dpar_buffer *const *)(c->b + 1), 3, 1);
}
/* shape ops, bit-exact copies: transpose (split_heads), broadcast_to, pad (SAME
   padding of the CNN's activations), concat (Q|K|V): x read, y written;
   slice [1024, 32:96): the 1024x64 it reads, y written; slice_backward: dy
   read, the whole dx written */
static void shape_rows(bench *B, dpar_dtype dt) {
    ops_case cc, *c = &cc;
    begin(B, c, "transpose", dt, "16x64x2x32 perm 0 2 1 3", r_transpose);
    MK(ACC_R, dt, G_B, G_T, G_H, G_HD), MK(ACC_W, dt, G_B, G_H, G_T, G_HD);
    finish(B, c);
    begin(B, c, "broadcast_to", dt, "128 -> 1024x128", r_bcast);
    MK(ACC_R, dt, G_C), MK(ACC_W, dt, G_ROWS, G_C);
    finish(B, c);
    begin(B, c, "slice", dt, "1024x128 -> 1024x64", r_slice);
    MK(ACC_NONE, dt, G_ROWS, G_C), MK(ACC_W, dt, G_ROWS, G_C / 2);
    c->rd += c->wr; /* the part of x it reads: y's size */
    finish(B, c);
    begin(B, c, "slice_backward", dt, "1024x64 -> 1024x128", r_slice_bwd);
    MK(ACC_W, dt, G_ROWS, G_C), MK(ACC_R, dt, G_ROWS, G_C / 2);
    finish(B, c);
    begin(B, c, "pad", dt, "16x28x28x32 -> 16x30x30x32", r_pad);
    MK(ACC_R, dt, 16, 28, 28, 32), MK(ACC_W, dt, 16, 30, 30, 32);
    finish(B, c);
    begin(B, c, "concat", dt, "3 x 1024x64 -> 1024x192", r_concat);
    MK(ACC_W, dt, G_ROWS, 3 * G_C / 2);
    for (int i = 0; i < 3; i++) MK(ACC_R, dt, G_ROWS, G_C / 2);
    finish(B, c);
}

/* >>ops main ================================================================= */
/* every row: the float dtypes' rows, then i32's, then the casts */
static void all_rows(bench *B) {
    void (*const per_dtype[])(bench *, dpar_dtype) = { cnn_rows,    gpt_rows,   unary_rows, binary_rows,
                                                       reduce_rows, optim_rows, shape_rows, digits_rows };
    for (int d = 0; d < DPAR_DTYPE_COUNT; d++) {
        if (d == DPAR_I32) continue; /* the float dtypes; i32 below */
        for (size_t f = 0; f < sizeof per_dtype / sizeof *per_dtype; f++) per_dtype[f](B, (dpar_dtype)d);
    }
    shape_rows(B, DPAR_I32);
    ops_case cc;
    begin(B, &cc, "copy", DPAR_I32, "802816", r_copy);
    mk(B, &cc, ACC_W, DPAR_I32, 1, SH(P_N), 1000), mk(B, &cc, ACC_R, DPAR_I32, 1, SH(P_N), 1000);
    finish(B, &cc);
    for (int d = 0; d < DPAR_DTYPE_COUNT; d++) cast_rows(B, (dpar_dtype)d);
}

/* Every item of --dtypes names a dtype, and --only with --dtypes takes a row (a dry pass over the
   rows, which builds nothing): 0; else prints what is wrong and the valid names and returns 2 (a
   usage error), before any output: such a run would measure nothing and exit 0. */
static int check_rows(bench *B) {
    char item[32], why[128];
    if (B->dtypes && !*B->dtypes)
        return ex_bad_value("bench_ops", "--dtypes", "''", "an empty list; give one dtype at least");
    for (const char *q = B->dtypes ? B->dtypes : ""; ex_list_next(&q, item, sizeof item);) {
        int d = 0;
        while (d < DPAR_DTYPE_COUNT && strcmp(item, dpar_dtype_name((dpar_dtype)d))) d++;
        if (d == DPAR_DTYPE_COUNT) {
            int len = snprintf(why, sizeof why, "'%s' is not a dtype; use", item);
            for (d = 0; d < DPAR_DTYPE_COUNT && len > 0 && (size_t)len < sizeof why; d++)
                len += snprintf(why + len, sizeof why - (size_t)len, " %s%s", dpar_dtype_name((dpar_dtype)d),
                                d + 1 < DPAR_DTYPE_COUNT ? "," : " (a list)");
            return ex_bad_value("bench_ops", "--dtypes", B->dtypes, why);
        }
    }
    B->dry = 1;
    all_rows(B);
    B->dry = 0;
    if (!B->named) {
        fprintf(stderr, "bench_ops: --only %s: no op name contains it; the ops: %s\n", B->only, B->ops);
        return 2;
    }
    if (!B->taken) {
        fprintf(stderr, "bench_ops: --only %s --dtypes %s: no op that --only takes has a row of those dtypes\n",
                B->only ? B->only : "(all)", B->dtypes);
        return 2;
    }
    return 0;
}

static int parse(int argc, char **argv, bench *B) {
    const char *clk = "wall";
    float target = (float)B->target;
    const ex_flag flags[] = {
        EX_S("--backend", &B->backend, "cpu|vulkan|cuda"),
        EX_I("--threads", &B->threads, 1, 64),
        EX_F("--time", &target, "seconds per op, > 0 and <= 3600"),
        EX_I("--alts", &B->alts, 1, MAX_ALTS),
        EX_FLAG("--only", EX_STR, &B->only, 0, 0, "a substring of op names", "all"),
        EX_FLAG("--dtypes", EX_STR, &B->dtypes, 0, 0, "dtype names, a list", "all"),
        EX_S("--clock", &clk, "cpu|wall"),
    };
    int rc = ex_parse("bench_ops", argc, argv, flags, (int)(sizeof flags / sizeof flags[0]));
    if (!rc) rc = bench_clock("bench_ops", clk, CLOCK_PROCESS_CPUTIME_ID);
    if (!rc) rc = ex_check_seconds("bench_ops", "--time", target);
    if (!rc) rc = check_rows(B);
    B->target = target;
    return rc;
}

/* a one-device runtime of the backend; 1 (and a skip line) when it is not there */
static int open_backend(bench *B) {
    dpar_backend_kind kind = DPAR_BACKEND_DEFAULT;
    if (dpar_backend_from_name(B->backend, &kind) || kind == DPAR_BACKEND_DEFAULT) {
        fprintf(stderr, "bench_ops: unknown backend %s (cpu, vulkan, cuda)\n", B->backend);
        return 2;
    }
    if (kind == DPAR_BACKEND_CPU) {
        char nth[16];
        snprintf(nth, sizeof nth, "%d", B->threads);
        setenv("DPAR_CPU_THREADS", nth, 1);
    } else { /* llvmpipe computes with LP_NUM_THREADS threads (default: every CPU) */
        const char *lp = getenv("LP_NUM_THREADS");
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        B->threads = lp && atoi(lp) > 0 ? atoi(lp) : ncpu > 0 ? (int)ncpu : 1;
    }
    dpar_runtime_desc rd = { .backend = kind, .num_devices = 1 };
    dpar_mesh_desc md = { .ndim = 1, .shape = { 1 }, .axis_names = { "data" } };
    if (dpar_runtime_create(&rd, &B->rt)) {
        printf("skip,%s,%s\n", B->backend, dpar_last_error());
        return 1;
    }
    if (dpar_mesh_create(B->rt, &md, &B->mesh)) {
        fprintf(stderr, "bench_ops: %s\n", dpar_last_error());
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    bench B = { .backend = "cpu", .threads = 1, .alts = 5, .target = 0.2 };
    int rc = parse(argc, argv, &B);
    if (rc) return ex_exit_status(rc);
    rc = open_backend(&B);
    if (rc) {
        dpar_runtime_destroy(B.rt);
        return rc == 1 ? 0 : rc;
    }
    const char *lib;
    if (!(B.sgemm = blas_open(B.threads, &lib)))
        printf("skip,openblas,%s not found (apt-get install libopenblas0-pthread): no sgemm limits\n", lib);
    printf("kind,backend,op,dtype,shape,threads,time_us,GBps,stream_GBps,pct_stream,pct_stream_min,pct_stream_max,"
           "gflops,blas_gflops,pct_blas,pct_blas_min,pct_blas_max,alts,working_set_bytes,stream_kernel\n");
    all_rows(&B);
    dpar_runtime_destroy(B.rt);
    return B.broken ? 3 : B.failed ? 1 : 0;
}
