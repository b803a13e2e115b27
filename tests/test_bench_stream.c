/* The benchmarks' stream limit (bench/bench_util.h): every kernel runs over the set's whole footprint (an
   op's working set in bench_ops, so a cache-resident op meets a cache-resident stream), the mix kernel
   (an op's own read-only, in-place and write-only arrays) reads and writes what it says on the AVX-512,
   AVX2 and scalar paths, the best kernel is named, a trial's threads wait at its gate for each other and
   end on their own clocks. No figure is checked: stream_bw_best runs only to name its kernel, the trial's clocks are
   compared with each other only. */
#include "testutil.h"
#if defined(_WIN32) /* bench_util.h is POSIX (pthreads, dlopen, getrusage): the benchmarks are not built there */
static void test_skipped(void **state) {
    (void)state;
    print_message("SKIPPED: posix: bench/bench_util.h needs pthreads, dlopen and getrusage\n");
    skip();
}
int main(void) {
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_skipped) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
#include "bench/bench_util.h"

/* kernel q's arrays and accesses per element (0: a collectives' kernel, not in a set without ways) */
static const struct {
    int q, arrays, acc;
} kernels[] = {
    { ST_K_COPY, 2, 2 }, { ST_K_ADD, 3, 3 },  { ST_K_INPLACE, 2, 3 },
    { ST_K_FILL, 1, 1 }, { ST_K_READ, 1, 1 }, { ST_K_MIX, 4, 1 + 2 * 2 + 1 }, /* mix r1 rw2 w1 */
};

static void test_kernels_span_working_set(void **state) {
    (void)state;
    const int64_t footprints[] = { 98304, 1 << 20, 6422528 + 64 * 7 }; /* sgd_update:digits, 1 MB, odd */
    for (int threads = 1; threads <= 2; threads++)
        for (size_t f = 0; f < sizeof footprints / sizeof *footprints; f++) {
            stream_set s;
            assert_int_equal(stream_init(&s, threads, 1, footprints[f]), 0);
            s.mix[0] = 1, s.mix[1] = 2, s.mix[2] = 1;
            const int64_t share = s.footprint / 4 / threads;
            for (size_t k = 0; k < sizeof kernels / sizeof *kernels; k++) {
                double per_pass = stream_kernel_set(&s, kernels[k].q);
                const st_arg *a = &s.a[threads - 1];
                int64_t touched = (int64_t)kernels[k].arrays * a->len * 4 * threads;
                /* the whole footprint, less at most 16 floats an array for alignment */
                assert_true(touched <= s.footprint);
                assert_true(touched > s.footprint - (int64_t)kernels[k].arrays * 64 * threads);
                assert_true(per_pass == (double)kernels[k].acc * (double)a->len * 4.0 * threads);
                assert_ptr_equal(a->x, s.mem + (threads - 1) * share); /* each thread in its own share */
                if (kernels[k].q == ST_K_MIX)
                    assert_int_equal(a->stride, a->len);
                else if (kernels[k].q != ST_K_READ)
                    assert_ptr_equal(a->z, a->x + (kernels[k].arrays - 1) * a->len);
            }
            assert_true(stream_kernel_set(&s, ST_K_SUM_ALL) == 0); /* no ways: no collectives' kernels */
            free(s.mem);
        }
}

/* one mix pass over arrays holding 1, 2, 3, 4: the in-place and write-only arrays get 1 + 2 + 3, the
   read-only one stays; len cut to a non-multiple of 16 runs the scalar tail, past it nothing changes.
   path 0: st_pass (AVX-512 where the CPU has it), 1: the AVX2 kernel and the tail, 2: scalar */
static void check_mix_pass(int nt, int64_t cut, int path) {
    stream_set s;
    assert_int_equal(stream_init(&s, 1, 1, 4 * 4 * 64), 0);
    s.mix[0] = 1, s.mix[1] = 2, s.mix[2] = 1;
    assert_true(stream_kernel_set(&s, ST_K_MIX) > 0);
    st_arg *a = &s.a[0];
    const int64_t len = a->len;
    for (int j = 0; j < 4; j++)
        for (int64_t i = 0; i < len; i++) a->x[j * len + i] = (float)(j + 1);
    a->nt = nt;
    a->len = len - cut;
    if (path == 0) st_pass(a);
#ifdef BENCH_X86
    if (path == 1) st_pass_tail(a, st_mix_avx2(a, a->len & ~(int64_t)15));
#endif
    if (path == 2) st_pass_tail(a, 0);
    for (int j = 0; j < 4; j++)
        for (int64_t i = 0; i < len; i++)
            assert_true(a->x[j * len + i] == (j > 0 && i < len - cut ? 6.0f : (float)(j + 1)));
    free(s.mem);
}
static void test_mix_pass(void **state) {
    (void)state;
    for (int path = 0; path < 3; path++) {
#ifdef BENCH_X86
        if (path == 1 && !__builtin_cpu_supports("avx2")) continue;
#else
        if (path == 1) continue;
#endif
        check_mix_pass(0, 0, path);
        check_mix_pass(1, 0, path);
        check_mix_pass(0, 5, path);
        check_mix_pass(1, 13, path);
    }
}

static void test_best_kernel_named(void **state) {
    (void)state;
    stream_set s;
    char label[32];
    assert_int_equal(stream_init(&s, 1, 1, 98304), 0);
    s.mix[0] = 1, s.mix[1] = 2; /* SGD with momentum: grad read, param and momentum in place */
    assert_true(stream_bw_best(&s, 0.001) > 0);
    assert_true(s.best_q >= 0 && s.best_q < ST_KERNELS && stream_kernel_set(&s, s.best_q) > 0);
    assert_true(s.best_nt < stream_store_kinds(&s, s.best_q));
    stream_kernel_label(&s, ST_K_MIX, 0, label, sizeof label);
    assert_string_equal(label, "mix r1 rw2 w0");
    stream_kernel_label(&s, ST_K_COPY, 1, label, sizeof label);
    assert_string_equal(label, "copy/nt");
    /* streaming stores only where a kernel stores to an array it does not read */
    assert_int_equal(stream_store_kinds(&s, ST_K_MIX), 1);
    assert_int_equal(stream_store_kinds(&s, ST_K_READ), 1);
    assert_int_equal(stream_store_kinds(&s, ST_K_INPLACE), 2);
    s.mix[2] = 1;
    assert_int_equal(stream_store_kinds(&s, ST_K_MIX), 2);
    free(s.mem);
}

/* The gate holds a thread until every thread has reached it: the other one here arrives 20 ms later. */
static int gate_passed;
static void *gate_thread(void *arrived) {
    st_gate((int *)arrived, 2);
    __atomic_store_n(&gate_passed, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void test_gate_waits_for_all(void **state) {
    (void)state;
    int arrived = 0;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, gate_thread, &arrived), 0);
    struct timespec ms20 = { 0, 20000000L };
    nanosleep(&ms20, NULL);
    assert_int_equal(__atomic_load_n(&gate_passed, __ATOMIC_ACQUIRE), 0);
    st_gate(&arrived, 2);
    pthread_join(th, NULL);
    assert_int_equal(gate_passed, 1);
    assert_int_equal(arrived, 2);
}

/* Two threads, thread 1 with all the work (64 copies of 4 MB), thread 0 with 16 floats: thread 0's end
   must be its own, not thread 1's (a barrier before the end clock made every thread's interval the
   slowest one's, and thread 0's idle wait part of the trial); the trial spans both, and the sizing
   figure is the slowest thread's own. */
static void test_trial_ends_own(void **state) {
    (void)state;
    enum { ITERS = 64 };
    stream_set s;
    assert_int_equal(stream_init(&s, 2, 1, (int64_t)16 << 20), 0);
    assert_true(stream_kernel_set(&s, ST_K_COPY) > 0);
    s.a[0].len = 16;
    double own = 0, span = stream_trial(&s, 0, ITERS, 2, &own);
    const double d0 = s.a[0].t1 - s.a[0].t0, d1 = s.a[1].t1 - s.a[1].t0;
    assert_true(d0 < 0.5 * d1);
    assert_true(own == (d0 > d1 ? d0 : d1) / ITERS);
    double first = s.a[0].t0 < s.a[1].t0 ? s.a[0].t0 : s.a[1].t0, last = s.a[0].t1 > s.a[1].t1 ? s.a[0].t1 : s.a[1].t1;
    assert_true(span == (last - first) / ITERS);
    assert_true(span >= own);
    free(s.mem);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_span_working_set), cmocka_unit_test(test_gate_waits_for_all),
        cmocka_unit_test(test_trial_ends_own),           cmocka_unit_test(test_mix_pass),
        cmocka_unit_test(test_best_kernel_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
