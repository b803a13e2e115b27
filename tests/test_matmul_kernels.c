/* The CPU matmul's arithmetic, bit for bit, whatever kernel runs it (portable
   C, NEON, AVX2, AVX-512; packed or in-place operands; one or two threads):
   every C element accumulates its k products in ascending order within each
   block of 256 k (dpar.h DPAR__KC), one fused multiply-add per product on
   x86 CPUs with FMA (else one multiply and one add, each rounded), then C = C0 + alpha * acc per
   block, where C0 is 0 for the first block when beta is 0, beta * C for the
   first block when beta is neither 0 nor 1, and C itself otherwise.
   Emulated here in scalar C (-std=c99: no contraction) and compared with
   memcmp on random data of mixed magnitudes, so any change of order or
   rounding shows. The shapes cross every edge of the blocking: rows over
   and under the micro-tiles (6 and, on AVX-512, 8), the in-place-B limit
   (128), the row block (96) and the packed transposed-A limit (512 rows
   and more, in place again for one strip of columns);
   columns under and over the strips (16, 32) and the column block (1024); k
   over the k block; all transposes. */
#include "testutil.h"
#include <math.h>

enum { KC = 256 };
static dpar_runtime *RT;

static uint32_t rng = 12345u;
static float rnd(void) { /* mixed magnitudes: rounding differences cannot hide */
    rng = rng * 1664525u + 1013904223u;
    float m = (float)((rng >> 8) & 0xffff) / 65536.0f - 0.5f;
    return ldexpf(m, (int)((rng >> 28) & 7) - 3);
}

static int uses_fma(void) {
#if (defined(__x86_64__) || defined(__i386__)) && !defined(DPAR_NO_SIMD)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

#if (defined(__x86_64__) || defined(__i386__)) && !defined(DPAR_NO_SIMD)
#include <immintrin.h>
/* the CPU's fused multiply-add, as the kernels use it: MinGW-w64's fmaf is not
   fused (about a third of random triples round differently), which made the
   reference, not dpar, wrong under Windows */
__attribute__((target("fma"))) static float fused(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}
#else
static float fused(float a, float b, float c) {
    return fmaf(a, b, c);
}
#endif

static void emulate(int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha, const float *A, const float *B,
                    float beta, float *C) {
    int fma = uses_fma();
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float c = C[i * N + j];
            if (K == 0 || alpha == 0.0f) {
                C[i * N + j] = beta == 0.0f ? 0.0f : beta == 1.0f ? c : beta * c;
                continue;
            }
            if (beta != 0.0f && beta != 1.0f) c = beta * c;
            for (int64_t p = 0; p < K; p += KC) {
                float acc = 0.0f;
                for (int64_t k = p; k < K && k < p + KC; k++) {
                    float a = ta ? A[k * M + i] : A[i * K + k], b = tb ? B[j * K + k] : B[k * N + j];
                    if (fma)
                        acc = fused(a, b, acc);
                    else {
                        float prod = a * b;
                        acc = acc + prod;
                    }
                }
                float scaled = alpha * acc;
                c = ((p == 0 && beta == 0.0f) ? 0.0f : c) + scaled;
            }
            C[i * N + j] = c;
        }
}

static void bits_case(int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha, float beta) {
    size_t na = (size_t)(M * K), nb = (size_t)(K * N), nc = (size_t)(M * N);
    float *A = malloc(na * 4 + 4), *B = malloc(nb * 4 + 4), *C = malloc(nc * 4 + 4), *want = malloc(nc * 4 + 4);
    assert_non_null(A && B && C && want);
    for (size_t i = 0; i < na; i++) A[i] = rnd();
    for (size_t i = 0; i < nb; i++) B[i] = rnd();
    for (size_t i = 0; i < nc; i++) C[i] = want[i] = rnd();
    int64_t as[2] = { ta ? K : M, ta ? M : K }, bs[2] = { tb ? N : K, tb ? K : N }, cs[2] = { M, N };
    dpar_buffer *a = NULL, *b = NULL, *c = NULL;
    T_OK(dpar_buffer_create(RT, 0, DPAR_F32, 2, as, &a));
    T_OK(dpar_buffer_create(RT, 0, DPAR_F32, 2, bs, &b));
    T_OK(dpar_buffer_create(RT, 0, DPAR_F32, 2, cs, &c));
    T_OK(dpar_buffer_write(a, 0, A, na * 4));
    T_OK(dpar_buffer_write(b, 0, B, nb * 4));
    T_OK(dpar_buffer_write(c, 0, C, nc * 4));
    T_OK(dpar_matmul(c, a, b, ta, tb, alpha, beta));
    T_OK(dpar_buffer_read(c, 0, C, nc * 4));
    emulate(M, N, K, ta, tb, alpha, A, B, beta, want);
    for (size_t i = 0; i < nc; i++)
        if (memcmp(&C[i], &want[i], 4))
            fail_msg("matmul %lldx%lldx%lld ta=%d tb=%d alpha=%g beta=%g: C[%zu] = %a, the documented order gives %a",
                     (long long)M, (long long)N, (long long)K, ta, tb, (double)alpha, (double)beta, i, (double)C[i],
                     (double)want[i]);
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
    free(A);
    free(B);
    free(C);
    free(want);
}

/* the per-device shapes of the jobs (B read in place for M <= 128) and the edges */
static void test_small_bits(void **st) {
    (void)st;
    static const int64_t shapes[][3] = { { 64, 128, 64 },  { 16, 256, 600 },  { 16, 384, 128 },  { 1, 1, 1 },
                                         { 5, 17, 3 },     { 6, 16, 256 },    { 7, 33, 257 },    { 31, 47, 513 },
                                         { 32, 530, 40 },  { 33, 15, 70 },    { 97, 40, 300 },   { 16, 10, 128 },
                                         { 8, 32, 64 },    { 9, 31, 65 },     { 64, 10, 128 },   { 23, 65, 17 },
                                         { 601, 20, 40 },  { 513, 33, 16 },   { 128, 600, 300 }, { 129, 40, 70 },
                                         { 20, 1100, 40 }, { 130, 1060, 20 }, { 511, 40, 300 },  { 512, 40, 300 },
                                         { 515, 70, 260 }, { 600, 32, 300 } };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) bits_case(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, 1.0f, 0.0f);
    bits_case(16, 40, 300, 0, 0, 0.5f, 1.0f);  /* accumulate into C */
    bits_case(20, 40, 300, 1, 0, -2.0f, 0.5f); /* scale C first */
    bits_case(40, 40, 300, 0, 1, 1.5f, 1.0f);
}

/* a product of 2^24 multiply-adds or more: fused on x86 with FMA, split over 2 threads */
static void test_large_bits(void **st) {
    (void)st;
    bits_case(128, 544, 260, 0, 0, 1.0f, 0.0f);
    bits_case(128, 544, 260, 1, 1, 0.5f, 1.0f);
}

int main(void) {
    RT = t_cpu_runtime_threads("2");
    if (!RT) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_bits),
        cmocka_unit_test(test_large_bits),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dpar_runtime_destroy(RT);
    return rc;
}
