/* The CPU kernels' f32 exp (dpar.h >>cpu exp) on every path this CPU has
   (scalar fmaf loop, AVX2 + FMA, AVX-512): against exp in double over every
   64th float in [-104, 89] within the documented bound (1 ulp; subnormal
   results: 1 ulp of their spacing, 2^-149), every path bit for bit the same,
   the special values exactly (+-0, +-inf, NaN, the overflow and underflow
   edges, subnormal inputs), and every vector tail length at every offset
   without writing past the end. This file holds its own implementation (the
   paths are private), so it is built without build/dpar.o. */
#define DPAR_IMPLEMENTATION
#include "testutil.h"
#include <float.h>

typedef int64_t (*t_exp_path)(float *y, const float *x, int64_t n);
static int64_t t_exp_scalar(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = dpar__exp_f32_1(x[i]);
    return n;
}
/* a vector path finished by the scalar loop, as dpar__exp_f32 does */
static void t_run(t_exp_path f, float *y, const float *x, int64_t n) {
    for (int64_t i = f(y, x, n); i < n; i++) y[i] = dpar__exp_f32_1(x[i]);
}
enum { T_NPATH = 3 };
static const char *const t_path_name[T_NPATH] = { "scalar", "avx2+fma", "avx512f" };
/* the paths this CPU runs (NULL: not here) */
static void t_paths(t_exp_path p[T_NPATH]) {
    p[0] = t_exp_scalar;
    p[1] = p[2] = NULL;
#ifdef DPAR__X86_SIMD
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) p[1] = dpar__exp_f32_avx2;
    if (__builtin_cpu_supports("avx512f")) p[2] = dpar__exp_f32_avx512;
#endif
}
/* |y - e| in units of the f32 spacing at e (2^-149 for subnormal e); inf/0 results exact or huge */
static double t_ulps(float y, double e) {
    if (isinf(y) || isinf(e) || e > (double)FLT_MAX) return (float)e == y ? 0.0 : 1e30;
    int ex;
    frexp(e, &ex); /* e = m 2^ex, m in [0.5, 1): spacing 2^(ex - 24) */
    double sp = ex - 24 < -149 ? ldexp(1.0, -149) : ldexp(1.0, ex - 24);
    return fabs((double)y - e) / sp;
}

static void test_exp_sweep(void **st) {
    (void)st;
    enum { CH = 1 << 16, STEP = 64 };
    t_exp_path path[T_NPATH];
    t_paths(path);
    float *x = malloc(CH * sizeof *x), *y[T_NPATH];
    double *e = malloc(CH * sizeof *e), worst[T_NPATH] = { 0 };
    float worst_x[T_NPATH] = { 0 };
    assert_non_null(x);
    assert_non_null(e);
    for (int p = 0; p < T_NPATH; p++) assert_non_null(y[p] = malloc(CH * sizeof(float)));
    /* positive floats up to 89, then negative ones down to -104, in chunks */
    const uint32_t lim[2] = { t_f2u(89.0f), t_f2u(104.0f) };
    int64_t count = 0;
    for (int sgn = 0; sgn < 2; sgn++)
        for (uint32_t u = 0; u <= lim[sgn];) {
            int n = 0;
            for (; n < CH && u <= lim[sgn]; n++, u += STEP) x[n] = t_u2f(u | (uint32_t)sgn << 31);
            for (int i = 0; i < n; i++) e[i] = exp((double)x[i]);
            for (int p = 0; p < T_NPATH; p++) {
                if (!path[p]) continue;
                t_run(path[p], y[p], x, n);
                for (int i = 0; i < n; i++) {
                    double d = t_ulps(y[p][i], e[i]);
                    if (d > worst[p]) worst[p] = d, worst_x[p] = x[i];
                }
                if (p && memcmp(y[p], y[0], (size_t)n * sizeof(float)) != 0)
                    for (int i = 0; i < n; i++)
                        if (t_f2u(y[p][i]) != t_f2u(y[0][i]))
                            fail_msg("exp(%a): %s gives %a, scalar %a", (double)x[i], t_path_name[p], (double)y[p][i],
                                     (double)y[0][i]);
            }
            count += n;
        }
    for (int p = 0; p < T_NPATH; p++) {
        if (!path[p]) {
            printf("exp sweep: %s not on this CPU (SKIPPED for it)\n", t_path_name[p]);
            continue;
        }
        printf("exp sweep, %s: %lld inputs, max error %.3f ulp at %a\n", t_path_name[p], (long long)count, worst[p],
               (double)worst_x[p]);
        assert_true(worst[p] <= 1.0);
    }
    for (int p = 0; p < T_NPATH; p++) free(y[p]);
    free(x);
    free(e);
}

/* exact results: zeros, infinities, NaN, the edges of overflow and underflow, subnormal inputs */
static void test_exp_special(void **st) {
    (void)st;
    struct {
        float x;
        uint32_t want;
    } c[] = {
        { 0.0f, 0x3f800000u },
        { -0.0f, 0x3f800000u },
        { INFINITY, 0x7f800000u },
        { -INFINITY, 0u },
        { FLT_MAX, 0x7f800000u },
        { -FLT_MAX, 0u },
        { 88.72283172607421875f, 0x7f7fff84u }, /* the last finite result; the next float overflows */
        { 88.7228393554687500f, 0x7f800000u },
        { 100.0f, 0x7f800000u },
        { -103.972076416015625f, 1u },   /* 2^-149, the smallest subnormal */
        { -103.97208404541015625f, 0u }, /* rounds to zero */
        { -150.0f, 0u },
        { 0x1p-149f, 0x3f800000u }, /* subnormal inputs: exp = 1 */
        { -0x1p-149f, 0x3f800000u },
        { 1.0f, 0x402df854u }, /* e */
    };
    t_exp_path path[T_NPATH];
    t_paths(path);
    enum { NC = sizeof c / sizeof c[0] };
    float x[NC + 2], y[NC + 2];
    for (int i = 0; i < NC; i++) x[i] = c[i].x;
    x[NC] = NAN;
    x[NC + 1] = -NAN;
    for (int p = 0; p < T_NPATH; p++) {
        if (!path[p]) continue;
        t_run(path[p], y, x, NC + 2);
        for (int i = 0; i < NC; i++)
            if (t_f2u(y[i]) != c[i].want)
                fail_msg("%s: exp(%a) = %a (0x%08x), want 0x%08x", t_path_name[p], (double)c[i].x, (double)y[i],
                         t_f2u(y[i]), c[i].want);
        assert_true(isnan(y[NC]) && isnan(y[NC + 1]));
        assert_true((t_f2u(y[NC]) & 0x00400000u) != 0); /* quiet */
    }
}

/* every length 0..40 at offsets 0..3: the vector paths' tails agree with the scalar loop and write nothing past n */
static void test_exp_tails(void **st) {
    (void)st;
    t_exp_path path[T_NPATH];
    t_paths(path);
    float x[48], y[48], want[48];
    for (int i = 0; i < 48; i++) x[i] = (float)(i * 7 % 23) * 0.37f - 4.0f;
    for (int p = 1; p < T_NPATH; p++) {
        if (!path[p]) continue;
        for (int off = 0; off < 4; off++)
            for (int n = 0; n <= 40; n++) {
                for (int i = 0; i < 48; i++) y[i] = want[i] = -7.0f;
                t_run(path[p], y + off, x + off, n);
                t_run(t_exp_scalar, want + off, x + off, n);
                assert_memory_equal(y, want, sizeof y);
            }
        /* in place, as the kernels call it */
        memcpy(y, x, sizeof y);
        t_run(path[p], y, y, 37);
        t_run(t_exp_scalar, want, x, 37);
        assert_memory_equal(y, want, 37 * sizeof(float));
    }
    /* the dispatcher itself */
    dpar__exp_f32(y, x, 45);
    t_run(t_exp_scalar, want, x, 45);
    assert_memory_equal(y, want, 45 * sizeof(float));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_special),
        cmocka_unit_test(test_exp_tails),
        cmocka_unit_test(test_exp_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
