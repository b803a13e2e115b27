/* bench_util.h — the pieces the benchmarks share (include after dpar.h):

     >>bench clock    now_s() on clock_id (CLOCK_MONOTONIC; a program's
                      --clock cpu sets a CPU-time clock instead: bench_clock)
     >>bench process  cpu_s() (the process's user + system seconds, all
                      threads) and load1() (the 1-minute load average, -1
                      where /proc has none), printed beside timings taken on
                      a shared machine; host_cpu_s() (the CPU seconds of the
                      calling thread and of dpar's own threads only, -1 where
                      /proc has none: a driver's threads, llvmpipe's, left out)
     >>bench median   median() of a trial array (sorts it: v[0] is then the min)
     >>bench stream   the stream kernels that measure this machine's memory
                      bandwidth in the same run: copy (z = x), add
                      (z = x + y, or in place), fill (z = 0) and read
                      (sum x), n threads each over its own arrays, and
                      with stream_set.ways = w the CPU collectives' own
                      patterns over w member buffers (sum_all, sum_one,
                      fanout), with stream_set.mix an op's own mix of
                      read-only, in-place and write-only arrays, the
                      faster of non-temporal and ordinary stores. Every
                      kernel's arrays span the set's footprint, so a
                      footprint that fits in the cache is bounded by the
                      cache, not by DRAM; each trial starts in the cache
                      state its passes keep (ST_WARM). stream_init sizes
                      the arrays for a footprint; stream_bw_best returns
                      the best kernel's bytes read + written per second
                      (stream_kernel_label names it), stream_bw_kernel
                      one kernel's.
     >>bench openblas cblas_sgemm opened at run time (libopenblas.so.0,
                      Debian's libopenblas0-pthread; BENCH_OPENBLAS=path
                      overrides; its AVX-512 kernels named on CPUs that
                      have them) and timed by blas_trial.

   The flags are read by ex_parse (examples/flags.h, the examples' parser).
   Every function is static inline: a program that leaves one unused gets
   no warning. */
#ifndef DPAR_BENCH_UTIL_H
#define DPAR_BENCH_UTIL_H
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "examples/flags.h" /* ex_parse: the flags */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

/* >>bench clock ============================================================ */
static clockid_t clock_id = CLOCK_MONOTONIC;
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* --clock's value: "wall" (CLOCK_MONOTONIC) or "cpu" (the program's CPU clock, cpu) into clock_id
   and 0; else 2 (a usage error) after saying so. */
static inline int bench_clock(const char *prog, const char *v, clockid_t cpu) {
    if (strcmp(v, "wall") && strcmp(v, "cpu")) return ex_bad_value(prog, "--clock", v, "must be cpu or wall");
    clock_id = strcmp(v, "cpu") ? CLOCK_MONOTONIC : cpu;
    return 0;
}

/* >>bench process ========================================================== */
static inline double cpu_s(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}
/* The CPU seconds of the calling thread (CLOCK_THREAD_CPUTIME_ID) plus those of every thread dpar
   started: dpar names its threads "dpar-..." (dpar__thread_name); their run time is read from
   /proc/self/task/<tid>/schedstat (first field: nanoseconds on a CPU, the scheduler's
   sum_exec_runtime, which the thread CPU clocks read too). The calling thread's own cost of reading
   /proc is left out (summed over the calls: call it from one thread). Threads that ended are not
   counted. */
static inline double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline double host_cpu_s(void) {
    static double scans; /* the calling thread's seconds spent in this function so far */
    double c0 = thread_cpu_s(), t = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        char path[320], comm[32] = "";
        unsigned long long ns = 0;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        bool ours = fgets(comm, sizeof comm, f) && !strncmp(comm, "dpar-", 5);
        fclose(f);
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        if (!ours || !(f = fopen(path, "r"))) continue;
        if (fscanf(f, "%llu", &ns) == 1) t += 1e-9 * (double)ns;
        fclose(f);
    }
    closedir(d);
    double c1 = thread_cpu_s();
    scans += c1 - c0;
    return t + c1 - scans;
}
/* Waits until no other thread of this process is running (state R in /proc/self/task/<tid>/stat on
   two polls 0.2 ms apart), at most cap_s seconds; returns the seconds waited. OpenBLAS's workers spin
   about 2^28 TSC cycles (~0.1 s here) after each call before they sleep (its THREAD_TIMEOUT): run
   right after its pass, they held one of this machine's two cores while dpar's next pass ran, and
   bench_ops' conv2 forward at 2 threads took 640-665 us instead of 394-420 (measured with the spin
   cut short by OPENBLAS_THREAD_TIMEOUT=4). Called around every peer pass, so each side starts its
   timed pass with the other side's threads asleep, and the peer keeps its own spin while it runs. */
static inline double settle_threads(double cap_s) {
    char self[32];
    snprintf(self, sizeof self, "%ld", (long)syscall(SYS_gettid));
    double t0 = now_s();
    for (int quiet = 0; quiet < 2 && now_s() - t0 < cap_s;) {
        int busy = 0;
        DIR *d = opendir("/proc/self/task");
        if (!d) return 0;
        for (struct dirent *e; (e = readdir(d)) && !busy;) {
            char path[320], st[256];
            if (e->d_name[0] == '.' || !strcmp(e->d_name, self)) continue;
            snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            size_t n = fread(st, 1, sizeof st - 1, f);
            fclose(f);
            st[n] = 0;
            const char *r = strrchr(st, ')'); /* "tid (comm) S ...": comm may hold spaces */
            busy = r && r[1] == ' ' && r[2] == 'R';
        }
        closedir(d);
        quiet = busy ? 0 : quiet + 1;
        if (quiet < 2) nanosleep(&(struct timespec){ 0, 200000 }, NULL);
    }
    return now_s() - t0;
}
static inline double load1(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &l) != 1) l = -1;
    if (f) fclose(f);
    return l;
}

/* >>bench median =========================================================== */
enum { MAX_ALTS = 64 };
static inline int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* >>bench stream =========================================================== */
#define STREAM_CAP ((int64_t)256 << 20)         /* 8x the 32 MB L3 of the machine this was written on */
enum { STREAM_MAX_THREADS = DPAR_MAX_DEVICES }; /* one per device at most */
/* a stream kernel's access mix, per thread: copy z = x (1 read : 1 write),
   add z = x + y (2 : 1; y = z: in place, no read-for-ownership of z), fill
   z = 0 (0 : 1), read (sum x: 1 : 0), and the CPU collectives' own patterns
   over `ways` arrays (dpar.h's host path, each thread over its slice of
   every member's buffer): sum_all z_k = x_0 + ... + x_{w-1} for every k
   (all-reduce: w : w), sum_one z_0 = the same (reduce-scatter: w : 1) and
   fanout z_k = x for every k in 8 KB pieces, so x is read once (broadcast,
   all-gather: 1 : w), and mix: an op's access mix over mix[0] read-only,
   mix[1] in-place and mix[2] write-only arrays (array i at x + i * stride),
   v = the sum of the arrays it reads, stored to every array it writes
   (mix[0] + mix[1] : mix[1] + mix[2]; in place, no read-for-ownership) */
enum { ST_COPY, ST_ADD, ST_FILL, ST_READ, ST_SUM_ALL, ST_SUM_ONE, ST_FANOUT, ST_MIX };
typedef struct {
    float *x, *y, *z; /* the ways kernels: array i of x / z at x + i * stride */
    int64_t len;      /* floats per array */
    int64_t stride;
    int kind, ways, nt, iters, nthreads;
    int warm;      /* passes before the timed ones */
    int mix[3];    /* ST_MIX: read-only, in-place and write-only arrays */
    float sink;    /* read's sum, so the loads stay */
    int *arrived;  /* threads at the trial's start gate (st_gate), of nthreads */
    double t0, t1; /* this thread's first pass began, and its last one ended */
} st_arg;
enum { ST_PIECE = 2048 }; /* fanout's piece: dpar__copy_fanout's 8 KB, read once, stays in L1 */

/* elements [i, len) of a mix pass, scalar */
static inline void st_mix_tail(st_arg *a, int64_t i) {
    const int rd = a->mix[0] + a->mix[1], all = rd + a->mix[2];
    for (; i < a->len; i++) {
        float v = 0.0f;
        for (int j = 0; j < rd; j++) v += a->x[j * a->stride + i];
        for (int k = a->mix[0]; k < all; k++) a->x[k * a->stride + i] = v;
    }
}

/* elements [i, len) of a pass, scalar */
static inline void st_pass_tail(st_arg *a, int64_t i) {
    int outs = a->kind == ST_SUM_ALL || a->kind == ST_FANOUT ? a->ways : 1;
    if (a->kind == ST_MIX) {
        st_mix_tail(a, i);
        return;
    }
    for (; i < a->len; i++) {
        float v = a->kind == ST_FILL ? 0.0f : a->x[i];
        if (a->kind == ST_ADD) v += a->y[i];
        if (a->kind == ST_SUM_ALL || a->kind == ST_SUM_ONE)
            for (int j = 1; j < a->ways; j++) v += a->x[j * a->stride + i];
        if (a->kind == ST_READ)
            a->sink += v;
        else
            for (int k = 0; k < outs; k++) a->z[k * a->stride + i] = v;
    }
}
#ifdef BENCH_X86
/* the sums of `ways` arrays into `outs` arrays, 16 floats a step as dpar__sum_f32_avx2 */
__attribute__((target("avx2"))) static inline int64_t st_sum_avx2(st_arg *a, int outs, int64_t n) {
    const int64_t w = a->stride;
    int64_t i = 0;
    for (; i < n; i += 16) {
        __m256 a0 = _mm256_load_ps(a->x + i), a1 = _mm256_load_ps(a->x + i + 8);
        for (int j = 1; j < a->ways; j++) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(a->x + j * w + i));
            a1 = _mm256_add_ps(a1, _mm256_load_ps(a->x + j * w + i + 8));
        }
        for (int k = 0; k < outs; k++)
            if (a->nt) {
                _mm256_stream_ps(a->z + k * w + i, a0);
                _mm256_stream_ps(a->z + k * w + i + 8, a1);
            } else {
                _mm256_store_ps(a->z + k * w + i, a0);
                _mm256_store_ps(a->z + k * w + i + 8, a1);
            }
    }
    return i;
}
/* x to every z_k, a piece at a time */
__attribute__((target("avx2"))) static inline int64_t st_fanout_avx2(st_arg *a, int64_t n) {
    for (int64_t p = 0; p < n; p += ST_PIECE) {
        int64_t e = n - p < ST_PIECE ? n : p + ST_PIECE;
        for (int k = 0; k < a->ways; k++) {
            float *z = a->z + k * a->stride;
            if (a->nt)
                for (int64_t i = p; i < e; i += 8) _mm256_stream_ps(z + i, _mm256_load_ps(a->x + i));
            else
                for (int64_t i = p; i < e; i += 8) _mm256_store_ps(z + i, _mm256_load_ps(a->x + i));
        }
    }
    return n;
}
/* the mix kernel, a 64-byte line of every array a step (the loops over the arrays cost what the
   accesses do at 8 floats, in the L2); streaming stores (nt) to the write-only arrays only: an in-place
   array's line is in the cache already */
__attribute__((target("avx2"))) static inline int64_t st_mix_avx2(st_arg *a, int64_t n) {
    const int64_t w = a->stride;
    float *const rw = a->x + a->mix[0] * w, *const wo = a->x + (a->mix[0] + a->mix[1]) * w;
    float *const end = wo + a->mix[2] * w;
    int64_t i = 0;
    for (; i < n; i += 16) {
        __m256 v0 = _mm256_setzero_ps(), v1 = v0;
        for (const float *p = a->x + i; p < wo + i; p += w) {
            v0 = _mm256_add_ps(v0, _mm256_load_ps(p));
            v1 = _mm256_add_ps(v1, _mm256_load_ps(p + 8));
        }
        for (float *p = rw + i; p < end + i; p += w)
            if (a->nt && p >= wo + i) {
                _mm256_stream_ps(p, v0);
                _mm256_stream_ps(p + 8, v1);
            } else {
                _mm256_store_ps(p, v0);
                _mm256_store_ps(p + 8, v1);
            }
    }
    return i;
}
/* the same with one 64-byte access per line (st_pass_avx512 says why) */
__attribute__((target("avx512f"))) static inline int64_t st_mix_avx512(st_arg *a, int64_t n) {
    const int64_t w = a->stride;
    float *const rw = a->x + a->mix[0] * w, *const wo = a->x + (a->mix[0] + a->mix[1]) * w;
    float *const end = wo + a->mix[2] * w;
    int64_t i = 0;
    for (; i < n; i += 16) {
        __m512 v = _mm512_setzero_ps();
        for (const float *p = a->x + i; p < wo + i; p += w) v = _mm512_add_ps(v, _mm512_load_ps(p));
        for (float *p = rw + i; p < end + i; p += w)
            if (a->nt && p >= wo + i)
                _mm512_stream_ps(p, v);
            else
                _mm512_store_ps(p, v);
    }
    return i;
}
__attribute__((target("avx2"))) static inline void st_pass_avx2(st_arg *a) {
    int64_t i = 0, n = a->len & ~(int64_t)15;
    const __m256 zero = _mm256_setzero_ps();
    __m256 acc = zero;
    if (a->kind == ST_SUM_ALL || a->kind == ST_SUM_ONE)
        i = st_sum_avx2(a, a->kind == ST_SUM_ALL ? a->ways : 1, n);
    else if (a->kind == ST_FANOUT)
        i = st_fanout_avx2(a, n);
    else if (a->kind == ST_MIX)
        i = st_mix_avx2(a, n);
    else if (a->kind == ST_ADD && a->nt)
        for (; i < n; i += 8)
            _mm256_stream_ps(a->z + i, _mm256_add_ps(_mm256_load_ps(a->x + i), _mm256_load_ps(a->y + i)));
    else if (a->kind == ST_ADD)
        for (; i < n; i += 8)
            _mm256_store_ps(a->z + i, _mm256_add_ps(_mm256_load_ps(a->x + i), _mm256_load_ps(a->y + i)));
    else if (a->kind == ST_FILL && a->nt)
        for (; i < n; i += 8) _mm256_stream_ps(a->z + i, zero);
    else if (a->kind == ST_FILL)
        for (; i < n; i += 8) _mm256_store_ps(a->z + i, zero);
    else if (a->kind == ST_READ)
        for (; i < n; i += 16)
            acc = _mm256_add_ps(acc, _mm256_add_ps(_mm256_load_ps(a->x + i), _mm256_load_ps(a->x + i + 8)));
    else if (a->nt)
        for (; i < n; i += 8) _mm256_stream_ps(a->z + i, _mm256_load_ps(a->x + i));
    else
        for (; i < n; i += 8) _mm256_store_ps(a->z + i, _mm256_load_ps(a->x + i));
    if (a->nt) _mm_sfence();
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int k = 0; k < 8; k++) a->sink += l[k];
    if (i < a->len) st_pass_tail(a, i);
}
#endif
#ifdef BENCH_X86
/* copy, add, fill and mix with 64-byte accesses, on CPUs with AVX-512: in the L1 the AVX2 loops are
   bound by their instructions, not by the cache (a 17 KB copy, add and in-place add: 170-200 GB/s,
   here 370-400), and dpar's AVX-512 ops would outrun a limit measured with them. read stays AVX2:
   its AVX-512 form (four sums) ran at half the AVX2 one's 140 GB/s in the L1 of this VM. The
   collectives' kernels stay AVX2. */
__attribute__((target("avx512f"))) static inline void st_pass_avx512(st_arg *a) {
    int64_t i = 0, n = a->len & ~(int64_t)15;
    const __m512 zero = _mm512_setzero_ps();
    const float *x = a->x, *y = a->y;
    float *z = a->z;
    if (a->kind == ST_MIX)
        i = st_mix_avx512(a, n);
    else if (a->kind == ST_ADD && a->nt)
        for (; i < n; i += 16) _mm512_stream_ps(z + i, _mm512_add_ps(_mm512_load_ps(x + i), _mm512_load_ps(y + i)));
    else if (a->kind == ST_ADD)
        for (; i < n; i += 16) _mm512_store_ps(z + i, _mm512_add_ps(_mm512_load_ps(x + i), _mm512_load_ps(y + i)));
    else if (a->kind == ST_FILL && a->nt)
        for (; i < n; i += 16) _mm512_stream_ps(z + i, zero);
    else if (a->kind == ST_FILL)
        for (; i < n; i += 16) _mm512_store_ps(z + i, zero);
    else if (a->nt)
        for (; i < n; i += 16) _mm512_stream_ps(z + i, _mm512_load_ps(x + i));
    else
        for (; i < n; i += 16) _mm512_store_ps(z + i, _mm512_load_ps(x + i));
    if (a->nt) _mm_sfence();
    if (i < a->len) st_pass_tail(a, i);
}
#endif
static inline void st_pass(st_arg *a) {
#ifdef BENCH_X86
    if ((a->kind == ST_COPY || a->kind == ST_ADD || a->kind == ST_FILL || a->kind == ST_MIX) &&
        __builtin_cpu_supports("avx512f")) {
        st_pass_avx512(a);
        return;
    }
    if (__builtin_cpu_supports("avx2")) {
        st_pass_avx2(a);
        return;
    }
#endif
    st_pass_tail(a, 0);
}
/* Warm-up passes before a trial: with one, the trial did not start in the cache state its passes
   keep, as the op it bounds does after its back-to-back calls. After another kernel's arrays (or
   streaming stores), a 6.4 MB in-place add on this VM (2 MB L2) ran at 31 GB/s after one warm-up
   pass, 41-45 after two and 44-45 after three, its lines reaching the L3 only as the L2 evicts them;
   axpy, at 42, was at 125% of the one-pass limit. A trial with streaming stores keeps one pass: its
   stores bypass the cache, so it wins only where the footprint streams from DRAM, where a second pass
   changes nothing; there it made the quick collectives' sweep 45 s long instead of 32 (load 7-10;
   one pass everywhere, kernels over part of the footprint: 24 s; 16 MB over 4 devices is
   milliseconds a pass). A trial right after its kernel's sizing trial, over the same arrays, starts
   warm (warm = 0). */
enum { ST_WARM = 2 };
/* The trial's start: returns once all `threads` threads have arrived, spinning (yielding now and then:
   one not yet arrived may need this core), so they begin their passes together. Behind a futex
   barrier the last to arrive began at once and the sleepers 5-50 us later (more on a loaded machine),
   and each thread's end waited for a wake-up too: against a 64 KB all-reduce's 1-3 us pass, that skew
   was most of a short trial, and the 2-thread limit came out near one thread's bandwidth. */
static inline void st_gate(int *arrived, int threads) {
    __atomic_add_fetch(arrived, 1, __ATOMIC_ACQ_REL);
    for (unsigned i = 1; __atomic_load_n(arrived, __ATOMIC_ACQUIRE) < threads; i++) {
        if (i % 64 == 0) sched_yield();
#ifdef BENCH_X86
        _mm_pause();
#endif
    }
}
static inline void *st_main(void *p) {
    st_arg *a = (st_arg *)p;
    for (int w = 0; w < a->warm; w++) st_pass(a);
    st_gate(a->arrived, a->nthreads);
    a->t0 = now_s();
    for (int i = 0; i < a->iters; i++) {
        st_pass(a);
        __asm__ __volatile__("" ::: "memory");
    }
    a->t1 = now_s();
    return NULL;
}
/* The kernels of the limit (a set made with add = 1): copy (z = x: 2
   accesses an element), add (z = x + y: 3), in place (z = z + x: 3, and no
   read-for-ownership of z, which an in-place op such as an optimizer step
   does not pay either), fill (z = 0: 1), read (sum x: 1), with ways = w
   > 1 the collectives' own: sum_all (2w), sum_one and fanout (w + 1), and
   with a mix the op's own (reads + in-place twice + writes). Each lays its
   arrays over the whole of its thread's share of the footprint, so every
   kernel runs over the same working set (the op's, in bench_ops: copy and
   fill over two thirds and one third of it ran in a faster cache level
   than the op); the collectives' ones as w (+ w or 1) member buffers, each
   thread over its slice of every buffer, as dpar's threads are. */
enum {
    ST_K_COPY,
    ST_K_ADD,
    ST_K_INPLACE,
    ST_K_FILL,
    ST_K_READ,
    ST_K_SUM_ALL,
    ST_K_SUM_ONE,
    ST_K_FANOUT,
    ST_K_MIX,
    ST_KERNELS
};
enum { ST_MIX_MAX = 16 }; /* arrays of the mix kernel at most */
static const char *const stream_kernel_names[ST_KERNELS] = { "copy",    "add",     "inplace", "fill", "read",
                                                             "sum_all", "sum_one", "fanout",  "mix" };
typedef struct {
    int threads, add;
    int ways;          /* > 1: stream_bw_best adds the collectives' kernels over this many members */
    int mix[3];        /* read-only, in-place, write-only arrays; any > 0: stream_bw_best adds the mix kernel */
    int64_t footprint; /* bytes of all arrays together: the working set of every kernel */
    float *mem;
    int best_q, best_nt;      /* the kernel and stores of stream_bw_best's best trial */
    double bw_of[ST_KERNELS]; /* each kernel's best of its stores in stream_bw_best's last call, 0: none */
    st_arg a[STREAM_MAX_THREADS];
} stream_set;
/* arrays for `threads` threads over a footprint of `moved` bytes (capped at
   STREAM_CAP, at least 64 bytes per array); -1 when out of memory. ways = 0:
   set it to the member count for the collectives' kernels. */
static inline int stream_init(stream_set *s, int threads, int add, int64_t moved) {
    memset(s, 0, sizeof *s);
    threads = threads < 1 ? 1 : threads > STREAM_MAX_THREADS ? STREAM_MAX_THREADS : threads;
    s->threads = threads;
    s->add = add;
    int64_t fp = moved < STREAM_CAP ? moved : STREAM_CAP, arrays = add ? 3 : 2;
    int64_t len = fp / 4 / arrays / threads;
    len = (len + 15) & ~(int64_t)15; /* 64-byte multiples: every array stays aligned */
    if (len < 16) len = 16;
    s->footprint = len * 4 * arrays * threads;
    s->mem = (float *)aligned_alloc(64, (size_t)s->footprint);
    if (!s->mem) return -1;
    for (int64_t i = 0; i < s->footprint / 4; i++) s->mem[i] = (float)(i & 7);
    for (int t = 0; t < threads; t++) {
        float *base = s->mem + (int64_t)t * arrays * len;
        s->a[t].x = base;
        s->a[t].y = add ? base + len : base;
        s->a[t].z = base + (arrays - 1) * len;
        s->a[t].len = len;
        s->a[t].kind = add ? ST_ADD : ST_COPY;
    }
    return 0;
}
/* seconds per pass of all threads over the footprint, after `warm` passes; *own (unless NULL): the
   slowest thread's own seconds per pass, what sizes a trial (the span also holds the threads' start-up) */
static inline double stream_trial(stream_set *s, int nt, int iters, int warm, double *own) {
    pthread_t th[STREAM_MAX_THREADS];
    int arrived = 0;
    for (int t = 0; t < s->threads; t++) {
        s->a[t].nt = nt;
        s->a[t].iters = iters;
        s->a[t].warm = warm;
        s->a[t].nthreads = s->threads;
        s->a[t].arrived = &arrived;
        if (s->threads > 1) pthread_create(&th[t], NULL, st_main, &s->a[t]);
    }
    if (s->threads == 1) st_main(&s->a[0]); /* on this thread: no start-up cost on a loaded machine */
    for (int t = 0; t < s->threads && s->threads > 1; t++) pthread_join(th[t], NULL);
    /* from the first thread's start to the last one's end: with more threads than cores, thread 0 may be
       scheduled after the others began, and its own interval would leave their first passes out (a
       thread's CPU clock is its own: thread 0's interval then) */
    double t0 = s->a[0].t0, t1 = s->a[0].t1, slow = t1 - t0;
    for (int t = 1; t < s->threads && clock_id != CLOCK_THREAD_CPUTIME_ID; t++) {
        t0 = s->a[t].t0 < t0 ? s->a[t].t0 : t0;
        t1 = s->a[t].t1 > t1 ? s->a[t].t1 : t1;
        slow = s->a[t].t1 - s->a[t].t0 > slow ? s->a[t].t1 - s->a[t].t0 : slow;
    }
    double per = clock_id == CLOCK_MONOTONIC ? 1.0 : s->threads;
    if (own) *own = slow / iters / per;
    return (t1 - t0) / iters / per;
}
/* points every thread's arrays at kernel q's; returns its bytes per pass, 0
   when the set has no such kernel (q = -1: back to the set's own kernel,
   add or copy over 3 or 2 arrays) */
static inline double stream_kernel_set(stream_set *s, int q) {
    static const int kinds[ST_KERNELS] = { ST_COPY,    ST_ADD,     ST_ADD,    ST_FILL, ST_READ,
                                           ST_SUM_ALL, ST_SUM_ONE, ST_FANOUT, ST_MIX };
    static const int arrays_of[ST_K_SUM_ALL] = { 2, 3, 2, 1, 1 }, acc_of[ST_K_SUM_ALL] = { 2, 3, 3, 1, 1 };
    int T = s->threads, w = s->ways, nmix = s->mix[0] + s->mix[1] + s->mix[2];
    int64_t share = s->footprint / 4 / T; /* floats of each thread's share */
    int ins = q == ST_K_FANOUT ? 1 : w, outs = q == ST_K_SUM_ONE ? 1 : w;
    if ((q >= ST_K_SUM_ALL && q <= ST_K_FANOUT && w < 2) || (q >= 0 && q != ST_K_COPY && !s->add))
        return 0; /* ways 0: no 0 / 0 */
    if (q == ST_K_MIX && (nmix < 1 || nmix > ST_MIX_MAX)) return 0;
    int arrays = q < 0 ? (s->add ? 3 : 2) : q == ST_K_MIX ? nmix : q >= ST_K_SUM_ALL ? ins + outs : arrays_of[q];
    int64_t seg = (share / arrays) & ~(int64_t)15;
    if (seg < 16) return 0;
    for (int t = 0; t < T; t++) {
        st_arg *a = &s->a[t];
        float *base = s->mem + (int64_t)t * share;
        a->kind = q < 0 ? (s->add ? ST_ADD : ST_COPY) : kinds[q];
        a->ways = w;
        memcpy(a->mix, s->mix, sizeof a->mix);
        a->len = seg;
        a->stride = q >= ST_K_SUM_ALL && q <= ST_K_FANOUT ? (int64_t)T * seg : seg;
        a->x = q >= ST_K_SUM_ALL && q <= ST_K_FANOUT ? s->mem + t * seg : base;
        a->z = q >= ST_K_SUM_ALL && q <= ST_K_FANOUT ? a->x + ins * a->stride : base + (arrays - 1) * seg;
        a->y = q == ST_K_INPLACE ? a->z : arrays == 3 ? base + seg : base;
    }
    int acc = q < 0               ? arrays
              : q == ST_K_MIX     ? s->mix[0] + 2 * s->mix[1] + s->mix[2]
              : q >= ST_K_SUM_ALL ? ins + outs
                                  : acc_of[q];
    return (double)T * (double)seg * 4.0 * acc;
}
/* kernel q's bytes read + written per second with streaming stores (nt) or
   ordinary ones, over about `target` seconds; 0 when the set has no such kernel */
static inline double stream_bw_kernel(stream_set *s, int q, int nt, double target) {
    double per_pass = stream_kernel_set(s, q), bw = 0;
    if (per_pass > 0) { /* one pass sizes the trial, and is the trial when no second pass fits the target; sized
                           by the threads' own pass time: the span of a 3 us pass was 10-50 us here, which
                           cut a 333 us trial to 6-30 passes */
        double own, one = stream_trial(s, nt, 1, nt ? 1 : ST_WARM, &own);
        int iters = (int)(target / (own > 1e-7 ? own : 1e-7));
        iters = iters > 20000 ? 20000 : iters;
        bw = per_pass / (iters < 2 ? one : stream_trial(s, nt, iters, 0, NULL));
    }
    stream_kernel_set(s, -1);
    return bw;
}
/* 2 when kernel q stores to an array it does not read (ordinary and streaming stores differ), else 1 */
static inline int stream_store_kinds(const stream_set *s, int q) {
    return q == ST_K_READ || (q == ST_K_MIX && s->mix[2] == 0) ? 1 : 2;
}
/* The best bytes per second of the kernels above, each with ordinary and
   streaming stores (read and an in-place mix store nothing elsewhere; the
   best is left in s->best_q, s->best_nt). No one mix bounds every other:
   a broadcast or all-gather writes n bytes for each it reads, which ran at
   100-113% of the copy kernel's bandwidth here (the write-only fill bounds
   it); a reduce-scatter reads n for each it writes; in a cache, where
   reads and write-backs travel apart, SGD with momentum (1 read : 2 in
   place) moved 49 GB/s where the in-place add (1 : 1) moved 44, so an op's
   own mix is a kernel of its own (stream_set.mix). The collectives'
   kernels keep as many streams in flight per thread as dpar's threads do
   (a 4-device all-reduce reads 4 and writes 4 at once, where copy has 2):
   the limit of a 4-device all-reduce on a 16-core host was below what dpar
   did (106%) with the five alone. */
static inline double stream_bw_best(stream_set *s, double target) {
    int trials = 0;
    for (int q = 0; q < ST_KERNELS; q++)
        if (stream_kernel_set(s, q) > 0) trials += stream_store_kinds(s, q);
    double best = 0;
    for (int q = 0; q < ST_KERNELS; q++)
        for (int nt = 0; nt < stream_store_kinds(s, q); nt++) {
            double bw = stream_bw_kernel(s, q, nt, target / (trials ? trials : 1));
            s->bw_of[q] = nt == 0 || bw > s->bw_of[q] ? bw : s->bw_of[q];
            if (bw > best) {
                best = bw;
                s->best_q = q;
                s->best_nt = nt;
            }
        }
    return best;
}
/* kernel q's name with its stores ("inplace", "copy/nt", "mix r1 rw2 w0/nt") into buf */
static inline void stream_kernel_label(const stream_set *s, int q, int nt, char *buf, size_t cap) {
    if (q == ST_K_MIX)
        snprintf(buf, cap, "mix r%d rw%d w%d%s", s->mix[0], s->mix[1], s->mix[2], nt ? "/nt" : "");
    else
        snprintf(buf, cap, "%s%s", q >= 0 && q < ST_KERNELS ? stream_kernel_names[q] : "?", nt ? "/nt" : "");
}

/* >>bench openblas ========================================================= */
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 }; /* CBLAS's enum values */
/* cblas_sgemm of OpenBLAS with `threads` threads; NULL (and *lib the name
   tried) when the library or a symbol is missing */
static inline sgemm_fn blas_open(int threads, const char **lib) {
    *lib = getenv("BENCH_OPENBLAS") ? getenv("BENCH_OPENBLAS") : "libopenblas.so.0";
#if defined(__x86_64__) && defined(__GNUC__)
    /* OpenBLAS 0.3.21 does not know a CPU that hides its model (this VM's "Intel Xeon Processor") and
       falls back to its SSE3 Prescott kernels, 2-5x slower here (measured: 64x128x64 26 against
       126-141 GFLOP/s); name its AVX-512 kernels when the CPU has them (the reader's value wins) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
#endif
    void *h = dlopen(*lib, RTLD_NOW | RTLD_LOCAL);
    sgemm_fn f = NULL;
    void (*set_threads)(int) = NULL;
    if (h) {
        *(void **)&f = dlsym(h, "cblas_sgemm");
        *(void **)&set_threads = dlsym(h, "openblas_set_num_threads");
    }
    if (!f || !set_threads) return NULL;
    set_threads(threads);
    return f;
}
/* seconds for `iters` row-major products C[M,N] = op(A)[M,K] op(B)[K,N] */
static inline double blas_trial(sgemm_fn f, int64_t M, int64_t N, int64_t K, int ta, int tb, const float *a,
                                const float *b, float *c, int iters) {
    settle_threads(0.5); /* dpar's threads asleep before the peer runs, its own after (settle_threads) */
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        f(ROW_MAJOR, ta ? TRANS : NO_TRANS, tb ? TRANS : NO_TRANS, (int)M, (int)N, (int)K, 1.0f, a,
          ta ? (int)M : (int)K, b, tb ? (int)K : (int)N, 0.0f, c, (int)N);
    double t = now_s() - t0;
    settle_threads(0.5);
    return t;
}
#endif
