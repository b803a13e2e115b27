/* The SIMD array casts (AVX2/F16C on x86, NEON on aarch64, scalar with
   DPAR_NO_SIMD) give the scalar dpar_f16_to_f32 / dpar_f32_to_f16 bits:
   every f16 value widened (x86 may quiet a signalling NaN), f32 values around
   every f16 rounding boundary, subnormals, overflow and NaN payloads
   narrowed, at every offset and length 0..17 (the vector tails). */
#include "testutil.h"

static void test_f16_to_f32_all(void **st) {
    (void)st;
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    float *y = malloc(N * sizeof *y);
    assert_non_null(h);
    assert_non_null(y);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    dpar_f16_to_f32_n(y, h, N);
    for (int i = 0; i < N; i++) {
        uint32_t want = t_f2u(dpar_f16_to_f32(h[i]));
        /* a signalling NaN: F16C (x86) quiets it (sets bit 22); NEON keeps the scalar bits */
        int snan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff) && !(i & 0x200);
        if (t_f2u(y[i]) != want && !(snan && t_f2u(y[i]) == (want | 0x400000u)))
            fail_msg("f16 0x%04x: array 0x%08x, scalar 0x%08x", i, t_f2u(y[i]), want);
    }
    for (int off = 0; off < 4; off++) /* tails and unaligned starts */
        for (int n = 0; n <= 17; n++) {
            float z[24];
            for (int k = 0; k < 24; k++) z[k] = -1.0f;
            dpar_f16_to_f32_n(z, h + 0x3c00 + off, n);
            for (int k = 0; k < 24; k++)
                assert_int_equal(t_f2u(z[k]), k < n ? t_f2u(dpar_f16_to_f32(h[0x3c00 + off + k])) : t_f2u(-1.0f));
        }
    free(h);
    free(y);
}

static void test_f32_to_f16_boundaries(void **st) {
    (void)st;
    /* every f16 exponent and sign, mantissas near the round bit (ties, +-1
       ulp), f32 subnormals, Inf, NaN payloads (quiet and signalling) */
    enum { N = 64 * 64 * 2 * 8 + 16 };
    float *x = malloc(N * sizeof *x);
    uint16_t *d = malloc(N * sizeof *d);
    assert_non_null(x);
    assert_non_null(d);
    static const uint32_t low[8] = { 0x0000, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff };
    int n = 0;
    for (uint32_t e = 96; e < 160; e++)
        for (uint32_t m = 0; m < 64; m++)
            for (uint32_t s = 0; s < 2; s++)
                for (int k = 0; k < 8; k++) x[n++] = t_u2f(s << 31 | e << 23 | (m * 0x1f3d1u & 0x7fe000u) | low[k]);
    static const uint32_t sp[16] = { 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa02000u,
                                     0xff801fffu, 0x7fffffffu, 0x00000001u, 0x807fffffu, 0x477ff000u, 0x477fefffu,
                                     0x477fe000u, 0x33000000u, 0x33000001u, 0xb3800000u };
    for (int k = 0; k < 16; k++) x[n++] = t_u2f(sp[k]);
    assert_int_equal(n, N);
    dpar_f32_to_f16_n(d, x, N);
    for (int i = 0; i < N; i++)
        if (d[i] != dpar_f32_to_f16(x[i]))
            fail_msg("f32 0x%08x: array 0x%04x, scalar 0x%04x", t_f2u(x[i]), d[i], dpar_f32_to_f16(x[i]));
    for (int off = 0; off < 4; off++)
        for (int len = 0; len <= 17; len++) {
            uint16_t z[24];
            for (int k = 0; k < 24; k++) z[k] = 0xabcd;
            dpar_f32_to_f16_n(z, x + N - 20 + off, len);
            for (int k = 0; k < 24; k++)
                assert_int_equal(z[k], k < len ? dpar_f32_to_f16(x[N - 20 + off + k]) : 0xabcd);
        }
    free(x);
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32_all),
        cmocka_unit_test(test_f32_to_f16_boundaries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
