/* Ops of the CPU reference backend against plain references computed here:
   matmul (all transposes, alpha/beta), bias add/grad, relu fwd/bwd, softmax
   cross-entropy, mse, axpy/scale/fill/copy, casts (round to nearest even, NaN,
   Inf, overflow, subnormals), sum / sum of squares, and argument errors.
   Small-integer data makes most results exact; tolerances appear only where
   the summation order legitimately differs from the reference. */
#include "testutil.h"

T_CPU_FIXTURE(2)

static dpar_buffer *mkf(int ndim, const int64_t *shape, const float *data) {
    return t_buf(RT, 0, DPAR_F32, ndim, shape, data);
}
static float ival(int i, int salt) {
    return (float)(((i * 7 + salt * 13 + 3) % 11) - 5);
}

/* ---- matmul ---- */
static void matmul_case(int64_t M, int64_t K, int64_t N, int ta, int tb, float alpha, float beta, dpar_dtype ab) {
    int64_t as[2] = { ta ? K : M, ta ? M : K }, bs[2] = { tb ? N : K, tb ? K : N }, cs[2] = { M, N };
    float *A = malloc((size_t)(M * K) * 4), *B = malloc((size_t)(K * N) * 4), *C0 = malloc((size_t)(M * N) * 4),
          *Cr = malloc((size_t)(M * N) * 4);
    uint16_t *A16 = malloc((size_t)(M * K) * 2), *B16 = malloc((size_t)(K * N) * 2);
    for (int64_t i = 0; i < M * K; i++) {
        A[i] = ival((int)i, 1);
        A16[i] = ab == DPAR_F16 ? dpar_f32_to_f16(A[i]) : dpar_f32_to_bf16(A[i]);
    }
    for (int64_t i = 0; i < K * N; i++) {
        B[i] = ival((int)i, 2);
        B16[i] = ab == DPAR_F16 ? dpar_f32_to_f16(B[i]) : dpar_f32_to_bf16(B[i]);
    }
    for (int64_t i = 0; i < M * N; i++) C0[i] = beta == 0.0f ? NAN : ival((int)i, 3);
    dpar_buffer *a = t_buf(RT, 0, ab, 2, as, ab == DPAR_F32 ? (void *)A : (void *)A16);
    dpar_buffer *b = t_buf(RT, 0, ab, 2, bs, ab == DPAR_F32 ? (void *)B : (void *)B16);
    dpar_buffer *c = mkf(2, cs, C0);
    T_OK(dpar_matmul(c, a, b, ta, tb, alpha, beta));
    t_read(c, Cr);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) {
                double x = ta ? A[k * M + i] : A[i * K + k], y = tb ? B[j * K + k] : B[k * N + j];
                acc += x * y;
            }
            double want = alpha * acc + (beta == 0.0f ? 0.0 : beta * C0[i * N + j]);
            if ((double)Cr[i * N + j] != want)
                fail_msg("matmul %s M%lld K%lld N%lld ta%d tb%d alpha %g beta %g: C[%lld,%lld] = %g, want %g",
                         dpar_dtype_name(ab), (long long)M, (long long)K, (long long)N, ta, tb, alpha, beta,
                         (long long)i, (long long)j, Cr[i * N + j], want);
        }
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
    free(A);
    free(B);
    free(C0);
    free(Cr);
    free(A16);
    free(B16);
}
static void test_matmul(void **st) {
    (void)st;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            matmul_case(5, 7, 3, ta, tb, 1.0f, 0.0f, DPAR_F32);
            matmul_case(5, 7, 3, ta, tb, 2.0f, 0.5f, DPAR_F32);
            matmul_case(4, 6, 2, ta, tb, -1.0f, 1.0f, DPAR_F32);
            matmul_case(3, 130, 515, ta, tb, 0.25f, -2.0f, DPAR_F32); /* crosses the CPU blocking */
            matmul_case(1, 1, 1, ta, tb, 1.0f, 0.0f, DPAR_F32);
            matmul_case(4, 6, 5, ta, tb, 1.0f, 0.0f, DPAR_F16);
            matmul_case(4, 6, 5, ta, tb, 2.0f, 1.0f, DPAR_BF16);
        }
    matmul_case(3, 0, 4, 0, 0, 1.0f, 0.5f, DPAR_F32); /* K = 0: C = beta C */
    matmul_case(3, 0, 4, 0, 0, 1.0f, 0.0f, DPAR_F32); /* ... and beta 0 clears NaN */
    matmul_case(0, 5, 4, 1, 0, 1.0f, 0.0f, DPAR_F32); /* empty result */
    matmul_case(4, 5, 3, 0, 1, 0.0f, 0.0f, DPAR_F32); /* alpha 0, beta 0: zeros, NaN in C ignored */
    /* IEEE products: 0 * NaN and 0 * Inf are NaN, so a NaN/Inf in B reaches C even
       where A holds zeros (relu outputs); skipping zero products would hide it */
    int64_t s22[2] = { 2, 2 };
    float A[4] = { 0, 0, 1, 0 }, B[4] = { NAN, 1, INFINITY, 2 }, Cv[4];
    dpar_buffer *a = mkf(2, s22, A), *b = mkf(2, s22, B), *c = mkf(2, s22, NULL);
    T_OK(dpar_matmul(c, a, b, false, false, 1.0f, 0.0f));
    t_read(c, Cv);
    /* row 0: 0*NaN + 0*Inf = NaN, 0*1 + 0*2 = 0; row 1: 1*NaN + 0*Inf = NaN, 1*1 + 0*2 = 1 */
    assert_true(isnan(Cv[0]) && Cv[1] == 0.0f && isnan(Cv[2]) && Cv[3] == 1.0f);
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(b);
    dpar_buffer_destroy(c);
}
/* the blocked CPU kernel's edges: M over the row block and not a multiple of the
   micro-tile, K over the k block, N over the column block and not a multiple of
   the strip; on a 1-device runtime with 2 helper threads, so large products are
   split over threads too */
static void test_matmul_blocked(void **st) {
    (void)st;
    dpar_runtime *save = RT;
    setenv("DPAR_CPU_THREADS", "2", 1);
    RT = t_runtime(DPAR_BACKEND_CPU, 1);
    unsetenv("DPAR_CPU_THREADS");
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) matmul_case(97, 261, 530, ta, tb, 2.0f, 0.5f, DPAR_F32);
    matmul_case(97, 261, 530, 0, 0, 1.0f, 0.0f, DPAR_F32); /* beta 0: NaN in C ignored */
    matmul_case(97, 261, 530, 1, 1, -1.0f, 1.0f, DPAR_F32);
    matmul_case(7, 600, 33, 0, 1, 1.0f, 0.0f, DPAR_F32); /* several k blocks, one strip and a bit */
    dpar_runtime_destroy(RT);
    /* a large product right after the runtime starts, before its helper
       threads first ran: the fork must not be lost (it used to hang here) */
    for (int rep = 0; rep < 8; rep++) {
        setenv("DPAR_CPU_THREADS", "2", 1);
        RT = t_runtime(DPAR_BACKEND_CPU, 1);
        unsetenv("DPAR_CPU_THREADS");
        matmul_case(64, 1024, 64, 0, 0, 1.0f, 0.0f, DPAR_F32);
        dpar_runtime_destroy(RT);
    }
    RT = save;
}
static void test_matmul_errors(void **st) {
    (void)st;
    int64_t s23[2] = { 2, 3 }, s34[2] = { 3, 4 }, s24[2] = { 2, 4 }, s44[2] = { 4, 4 }, s6 = 6;
    dpar_buffer *a = mkf(2, s23, NULL), *b = mkf(2, s34, NULL), *c = mkf(2, s24, NULL), *bad = mkf(2, s44, NULL),
                *v = t_buf1(RT, DPAR_F32, 6, NULL);
    dpar_buffer *c16 = t_buf(RT, 0, DPAR_F16, 2, s24, NULL), *a32 = t_buf(RT, 0, DPAR_I32, 2, s23, NULL),
                *b1 = t_buf(RT, 1, DPAR_F32, 2, s34, NULL);
    dpar_buffer *b16 = t_buf(RT, 0, DPAR_F16, 2, s34, NULL), *sq = mkf(2, s44, NULL);
    (void)s6;
    T_OK(dpar_matmul(c, a, b, false, false, 1, 0));
    T_ERR(dpar_matmul(c, a, bad, false, false, 1, 0), DPAR_ERR_SHAPE, "[2, 3]", "[4, 4]", "[2, 4]");
    T_ERR(dpar_matmul(c, a, b, true, false, 1, 0), DPAR_ERR_SHAPE, "transposed");
    T_ERR(dpar_matmul(c, v, b, false, false, 1, 0), DPAR_ERR_SHAPE, "2-d");
    T_ERR(dpar_matmul(c16, a, b, false, false, 1, 0), DPAR_ERR_DTYPE, "f16");
    T_ERR(dpar_matmul(c, a32, b, false, false, 1, 0), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_matmul(c, a, b16, false, false, 1, 0), DPAR_ERR_DTYPE, "f16");
    T_ERR(dpar_matmul(c, a, b1, false, false, 1, 0), DPAR_ERR_INVALID_ARGUMENT, "devices 0 and 1");
    T_ERR(dpar_matmul(NULL, a, b, false, false, 1, 0), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_matmul(c, NULL, b, false, false, 1, 0), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_matmul(sq, sq, bad, false, false, 1, 0), DPAR_ERR_INVALID_ARGUMENT, "alias");
    dpar_buffer *bufs[] = { a, b, c, bad, v, c16, a32, b1, b16, sq };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dpar_buffer_destroy(bufs[i]);
}

/* ---- bias ---- */
static void test_bias(void **st) {
    (void)st;
    int64_t ys[3] = { 2, 2, 3 };
    float y0[12], b0[3] = { 1.5f, -2.0f, 0.25f }, out[12];
    for (int i = 0; i < 12; i++) y0[i] = ival(i, 4);
    dpar_buffer *y = mkf(3, ys, y0), *b = t_buf1(RT, DPAR_F32, 3, b0);
    T_OK(dpar_bias_add(y, b));
    t_read(y, out);
    for (int i = 0; i < 12; i++) assert_true(out[i] == y0[i] + b0[i % 3]);
    /* bias_grad: db = beta db + column sums of dy viewed as [4, 3] */
    float db0[3] = { NAN, NAN, NAN }, db[3];
    dpar_buffer *g = t_buf1(RT, DPAR_F32, 3, db0), *dy = mkf(3, ys, y0);
    T_OK(dpar_bias_grad(g, dy, 0.0f)); /* beta 0 ignores NaN */
    t_read(g, db);
    for (int j = 0; j < 3; j++) {
        float s = 0;
        for (int r = 0; r < 4; r++) s += y0[r * 3 + j];
        assert_true(db[j] == s);
    }
    T_OK(dpar_bias_grad(g, dy, 0.5f));
    float db2[3];
    t_read(g, db2);
    for (int j = 0; j < 3; j++) assert_true(db2[j] == 0.5f * db[j] + db[j]);
    /* 187 columns: two blocks of 64, one of 32, one of 24 (its fourth vector re-reads the first) and 3
       left (every loop of the vector path); magnitudes 1 and 2^20 plus tenths, so that another order of
       the row sums would show (reversed rows, or 8 interleaved partial sums, change most of the sums);
       exact against the rows added in order */
    enum { GR = 37, GC = 187 };
    static float gx[GR * GC], gb[GC], gs[GC];
    for (int i = 0; i < GR * GC; i++) gx[i] = ival(i, 7) * (i % 5 == 0 ? 1048576.0f : 1.0f) + 0.1f * (float)(i % 3);
    for (int j = 0; j < GC; j++) gb[j] = ival(j, 3);
    int64_t gsh[2] = { GR, GC }, gn = GC;
    dpar_buffer *gdy = mkf(2, gsh, gx), *gdb = t_buf(RT, 0, DPAR_F32, 1, &gn, gb);
    T_OK(dpar_bias_grad(gdb, gdy, 0.5f));
    t_read(gdb, gs);
    for (int j = 0; j < GC; j++) {
        float s = 0;
        for (int r = 0; r < GR; r++) s += gx[r * GC + j];
        assert_true(gs[j] == 0.5f * gb[j] + s);
    }
    dpar_buffer_destroy(gdy);
    dpar_buffer_destroy(gdb);
    /* axpy: y += alpha x, a rounded multiply then the add, exactly; 37 elements (vector loop and tail),
       then x aliasing y */
    float ay0[37], ax[37], ay[37];
    for (int i = 0; i < 37; i++) ay0[i] = ival(i, 5) + 0.1f * (float)i, ax[i] = ival(i, 6) * 0.3f + 1e-3f * (float)i;
    dpar_buffer *bay = t_buf1(RT, DPAR_F32, 37, ay0), *bax = t_buf1(RT, DPAR_F32, 37, ax);
    T_OK(dpar_axpy(bay, 0.7f, bax));
    t_read(bay, ay);
    for (int i = 0; i < 37; i++) assert_true(ay[i] == ay0[i] + 0.7f * ax[i]);
    T_OK(dpar_axpy(bax, -0.5f, bax));
    t_read(bax, ay);
    for (int i = 0; i < 37; i++) assert_true(ay[i] == ax[i] + -0.5f * ax[i]);
    dpar_buffer_destroy(bay);
    dpar_buffer_destroy(bax);
    int64_t s4 = 4, s23[2] = { 2, 3 };
    dpar_buffer *b4 = t_buf1(RT, DPAR_F32, 4, NULL), *b2d = mkf(2, s23, NULL),
                *bi = t_buf(RT, 0, DPAR_I32, 1, ys + 2, NULL), *bo = t_buf(RT, 1, DPAR_F32, 1, ys + 2, NULL);
    (void)s4;
    T_ERR(dpar_bias_add(y, b4), DPAR_ERR_SHAPE, "[4]", "[2, 2, 3]");
    T_ERR(dpar_bias_add(y, b2d), DPAR_ERR_SHAPE, "[2, 3]");
    T_ERR(dpar_bias_add(y, bi), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_bias_add(y, bo), DPAR_ERR_INVALID_ARGUMENT, "devices");
    T_ERR(dpar_bias_add(y, NULL), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_bias_grad(b4, dy, 0), DPAR_ERR_SHAPE, "[4]");
    T_ERR(dpar_bias_grad(bi, dy, 0), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_bias_grad(NULL, dy, 0), DPAR_ERR_INVALID_ARGUMENT, "NULL");
}

/* ---- relu ---- */
/* bias_grad split over intra-op threads: blocks of 32 columns, each column summed in row order
   whatever the split, so 1 and 3 threads give the sums of the rows added in order, exactly. 3000 x 187
   forks (6 blocks of 3000 rows); 187 columns end in a part block. */
static void test_bias_grad_threads(void **st) {
    (void)st;
    enum { R = 3000, C = 187 };
    float *x = malloc((size_t)R * C * 4), *want = malloc(C * 4), *got = malloc(C * 4), b0[C];
    for (int i = 0; i < R * C; i++) x[i] = ival(i, 7) * (i % 5 == 0 ? 1048576.0f : 1.0f) + 0.1f * (float)(i % 3);
    for (int j = 0; j < C; j++) {
        b0[j] = ival(j, 3);
        float s = 0;
        for (int r = 0; r < R; r++) s += x[r * C + j];
        want[j] = 0.5f * b0[j] + s;
    }
    const char *threads[2] = { "1", "3" };
    for (int t = 0; t < 2; t++) {
        dpar_runtime *rt = t_cpu_runtime_threads(threads[t]);
        int64_t sh[2] = { R, C }, n = C;
        dpar_buffer *dy = t_buf(rt, 0, DPAR_F32, 2, sh, x), *db = t_buf(rt, 0, DPAR_F32, 1, &n, b0);
        T_OK(dpar_bias_grad(db, dy, 0.5f));
        t_read(db, got);
        for (int j = 0; j < C; j++)
            if (got[j] != want[j]) fail_msg("%s threads: db[%d] = %.9g, want %.9g", threads[t], j, got[j], want[j]);
        dpar_runtime_destroy(rt);
    }
    free(x);
    free(want);
    free(got);
}
static void test_relu(void **st) {
    (void)st;
    float x0[8] = { -2.0f, -0.0f, 0.0f, 1e-30f, 3.5f, NAN, -INFINITY, INFINITY }, y[8];
    float want[8] = { 0, 0, 0, 1e-30f, 3.5f, NAN, 0, INFINITY };
    dpar_buffer *x = t_buf1(RT, DPAR_F32, 8, x0), *o = t_buf1(RT, DPAR_F32, 8, NULL);
    T_OK(dpar_relu(o, x));
    t_read(o, y);
    for (int i = 0; i < 8; i++) {
        if (isnan(want[i]))
            assert_true(isnan(y[i]));
        else
            assert_true(y[i] == want[i]);
    }
    assert_false(signbit(y[1])); /* relu(-0) = +0 */
    T_OK(dpar_relu(x, x));       /* in place */
    float y2[8];
    t_read(x, y2);
    assert_memory_equal(y, y2, sizeof y);
    /* backward: dx = dy where x > 0 else 0 (NaN x is not > 0) */
    float xs[6] = { -1, 0, 2, NAN, 5, 1e-38f }, dys[6] = { 10, 20, 30, 40, NAN, 60 }, dx[6];
    dpar_buffer *bx = t_buf1(RT, DPAR_F32, 6, xs), *bdy = t_buf1(RT, DPAR_F32, 6, dys),
                *bdx = t_buf1(RT, DPAR_F32, 6, NULL);
    T_OK(dpar_relu_backward(bdx, bdy, bx));
    t_read(bdx, dx);
    assert_true(dx[0] == 0 && dx[1] == 0 && dx[2] == 30 && dx[3] == 0 && isnan(dx[4]) && dx[5] == 60);
    T_OK(dpar_relu_backward(bdy, bdy, bx)); /* dx may alias dy */
    t_read(bdy, dx);
    assert_true(dx[0] == 0 && dx[2] == 30 && isnan(dx[4]) && dx[5] == 60);
    int64_t s23[2] = { 2, 3 };
    dpar_buffer *r23 = mkf(2, s23, NULL), *xi = t_buf(RT, 0, DPAR_I32, 1, (int64_t[]){ 6 }, NULL);
    T_ERR(dpar_relu(r23, bx), DPAR_ERR_SHAPE, "[2, 3]", "[6]");
    T_ERR(dpar_relu(bdx, xi), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_relu_backward(bdx, bdy, r23), DPAR_ERR_SHAPE, "[2, 3]");
    T_ERR(dpar_relu_backward(bdx, NULL, bx), DPAR_ERR_INVALID_ARGUMENT, "NULL");
}

/* ---- softmax cross-entropy against a double-precision reference ---- */
static void xent_check(int M, int Cn, const float *z, const int32_t *lab, double tol) {
    int64_t zs[2] = { M, Cn }, ls = M, one = 1;
    dpar_buffer *bz = mkf(2, zs, z), *bl = t_buf(RT, 0, DPAR_I32, 1, &ls, lab), *loss = mkf(1, &one, NULL),
                *g = mkf(2, zs, NULL);
    T_OK(dpar_softmax_xent(loss, g, bz, bl));
    float L = t_value_f32(loss), *G = malloc((size_t)(M * Cn) * 4);
    t_read(g, G);
    double total = 0;
    for (int i = 0; i < M; i++) {
        double mx = -INFINITY;
        for (int j = 0; j < Cn; j++) mx = z[i * Cn + j] > mx ? z[i * Cn + j] : mx;
        double se = 0;
        for (int j = 0; j < Cn; j++) se += exp((double)z[i * Cn + j] - mx);
        /* stable forms: (mx - z_l) + log(se) and exp(z - mx) / se, exact even for |z| ~ 1e38 */
        total += ((double)mx - z[i * Cn + lab[i]]) + log(se);
        for (int j = 0; j < Cn; j++) {
            double p = exp((double)z[i * Cn + j] - mx) / se, want = (p - (j == lab[i])) / M;
            assert_true(isfinite(G[i * Cn + j]));
            if (fabs(G[i * Cn + j] - want) > tol * (fabs(want) + 1.0 / M * 1e-3) + 1e-12)
                fail_msg("dlogits[%d,%d] = %.9g, want %.9g", i, j, G[i * Cn + j], want);
        }
    }
    double want = total / M;
    assert_true(isfinite(L));
    if (fabs(L - want) > tol * fabs(want) + 1e-7) fail_msg("loss %.9g, want %.9g", L, want);
    /* loss only */
    T_OK(dpar_softmax_xent(loss, NULL, bz, bl));
    assert_true(t_value_f32(loss) == L);
    free(G);
    dpar_buffer_destroy(bz);
    dpar_buffer_destroy(bl);
    dpar_buffer_destroy(loss);
    dpar_buffer_destroy(g);
}
static void test_softmax_xent(void **st) {
    (void)st;
    float z[6 * 10];
    int32_t lab[6];
    for (int i = 0; i < 60; i++) z[i] = sinf((float)i * 0.7f) * 3.0f;
    for (int i = 0; i < 6; i++) lab[i] = (i * 3) % 10;
    xent_check(6, 10, z, lab, 1e-6);
    /* rows wider than the CPU op's cache of exp values (512 classes) take its recomputing path */
    float *wide = malloc(3 * 700 * sizeof(float));
    int32_t wl[3] = { 0, 511, 699 };
    for (int i = 0; i < 3 * 700; i++) wide[i] = cosf((float)i * 0.37f) * 4.0f;
    xent_check(3, 700, wide, wl, 1e-6);
    free(wide);
    /* stability: large logits overflow a naive exp */
    float big[2 * 3] = { 1000.0f, 0.0f, -1000.0f, 88.0f, 89.0f, 90.0f };
    int32_t bl[2] = { 2, 1 };
    xent_check(2, 3, big, bl, 1e-6);
    float huge[1 * 4] = { 3e38f, 3e38f, -3e38f, 0.0f };
    int32_t hl[1] = { 0 };
    xent_check(1, 4, huge, hl, 1e-6);
    /* exact: two equal logits -> loss log 2, gradient [-1/2, 1/2] */
    float eq[2] = { 5.0f, 5.0f };
    int32_t el[1] = { 0 };
    int64_t zs[2] = { 1, 2 }, one = 1;
    dpar_buffer *bz = mkf(2, zs, eq), *bl1 = t_buf(RT, 0, DPAR_I32, 1, &one, el), *loss = mkf(1, &one, NULL),
                *g = mkf(2, zs, NULL);
    T_OK(dpar_softmax_xent(loss, g, bz, bl1));
    float G[2];
    t_read(g, G);
    assert_true(t_value_f32(loss) == (float)log(2.0));
    assert_true(G[0] == -0.5f && G[1] == 0.5f);
    /* a label out of range: an error naming the row and the value, nothing written */
    int32_t badl[1] = { 7 };
    T_OK(dpar_buffer_write(bl1, 0, badl, 4));
    T_ERR(dpar_softmax_xent(loss, g, bz, bl1), DPAR_ERR_INVALID_ARGUMENT, "dpar_softmax_xent", "labels[0] = 7", "0..1");
    t_read(g, G);
    assert_true(G[0] == -0.5f && G[1] == 0.5f);
    badl[0] = -1;
    T_OK(dpar_buffer_write(bl1, 0, badl, 4));
    T_ERR(dpar_softmax_xent(loss, NULL, bz, bl1), DPAR_ERR_INVALID_ARGUMENT, "labels[0] = -1");
    /* errors */
    int64_t two = 2, s3 = 3;
    dpar_buffer *lf = mkf(1, &one, NULL), *l2 = t_buf1(RT, DPAR_F32, 2, NULL), *labf = t_buf1(RT, DPAR_F32, 1, NULL),
                *lab2 = t_buf(RT, 0, DPAR_I32, 1, &two, NULL), *z1 = t_buf1(RT, DPAR_F32, 3, NULL);
    dpar_buffer *g13 = mkf(1, &s3, NULL);
    T_ERR(dpar_softmax_xent(l2, g, bz, bl1), DPAR_ERR_SHAPE, "1 f32 element");
    T_ERR(dpar_softmax_xent(lf, g, bz, labf), DPAR_ERR_DTYPE, "f32", "i32");
    T_ERR(dpar_softmax_xent(lf, g, bz, lab2), DPAR_ERR_SHAPE, "[2]", "[1, 2]");
    T_ERR(dpar_softmax_xent(lf, NULL, z1, bl1), DPAR_ERR_SHAPE, "2-d");
    T_ERR(dpar_softmax_xent(lf, g13, bz, bl1), DPAR_ERR_SHAPE, "[3]");
    T_ERR(dpar_softmax_xent(lf, bz, bz, bl1), DPAR_ERR_INVALID_ARGUMENT, "alias");
    T_ERR(dpar_softmax_xent(lf, g, NULL, bl1), DPAR_ERR_INVALID_ARGUMENT, "NULL");
}

/* ---- mse ---- */
static void test_mse(void **st) {
    (void)st;
    int64_t s[2] = { 128, 32 }, s1 = 128, one = 1;
    float *p = malloc(128 * 32 * 4), *t = malloc(128 * 32 * 4), *g = malloc(128 * 32 * 4);
    for (int i = 0; i < 128 * 32; i++) {
        p[i] = ival(i, 5) * 0.5f;
        t[i] = 1.0f;
    }
    dpar_buffer *bp = mkf(2, s, p), *bt = mkf(2, s, t), *loss = mkf(1, &one, NULL), *bg = mkf(2, s, NULL);
    T_OK(dpar_mse(loss, bg, bp, bt));
    t_read(bg, g);
    double tot = 0;
    for (int i = 0; i < 128 * 32; i++) {
        double d = (double)p[i] - t[i];
        tot += d * d;
        assert_true(g[i] == (float)(2.0 * d / (128 * 32))); /* exact: dyadic values */
    }
    assert_true(t_value_f32(loss) == (float)(tot / (128 * 32)));
    T_OK(dpar_mse(loss, NULL, bp, bp));
    assert_true(t_value_f32(loss) == 0.0f);
    /* targets of shape (128,) cannot broadcast against (128, 32) predictions */
    dpar_buffer *t1 = mkf(1, &s1, NULL);
    T_ERR(dpar_mse(loss, bg, bp, t1), DPAR_ERR_SHAPE, "[128, 32]", "[128]", "broadcast");
    T_ERR(dpar_mse(loss, t1, bp, bt), DPAR_ERR_SHAPE, "[128]");
    T_ERR(dpar_mse(bg, NULL, bp, bt), DPAR_ERR_SHAPE, "1 f32 element");
    dpar_buffer *ti = t_buf(RT, 0, DPAR_I32, 2, s, NULL), *t_other = t_buf(RT, 1, DPAR_F32, 2, s, NULL);
    T_ERR(dpar_mse(loss, NULL, bp, ti), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_mse(loss, NULL, bp, t_other), DPAR_ERR_INVALID_ARGUMENT, "devices 0 and 1");
    T_ERR(dpar_mse(NULL, NULL, bp, bt), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    free(p);
    free(t);
    free(g);
}

/* ---- axpy / scale / fill / copy ---- */
static void test_elementwise(void **st) {
    (void)st;
    float x0[5] = { 1, -2, 3.5f, 0, NAN }, y0[5] = { 10, 20, 30, 40, 50 }, y[5];
    dpar_buffer *x = t_buf1(RT, DPAR_F32, 5, x0), *yb = t_buf1(RT, DPAR_F32, 5, y0);
    T_OK(dpar_axpy(yb, 2.0f, x));
    t_read(yb, y);
    assert_true(y[0] == 12 && y[1] == 16 && y[2] == 37 && y[3] == 40 && isnan(y[4]));
    T_OK(dpar_scale(yb, -0.5f));
    t_read(yb, y);
    assert_true(y[0] == -6 && y[1] == -8 && y[2] == -18.5f && y[3] == -20 && isnan(y[4]));
    T_OK(dpar_fill(yb, 0.75f));
    t_read(yb, y);
    for (int i = 0; i < 5; i++) assert_true(y[i] == 0.75f);
    /* fill in every dtype */
    int64_t four = 4;
    dpar_buffer *h = t_buf(RT, 0, DPAR_F16, 1, &four, NULL), *bh = t_buf(RT, 0, DPAR_BF16, 1, &four, NULL),
                *ib = t_buf(RT, 0, DPAR_I32, 1, &four, NULL);
    uint16_t hv[4];
    int32_t iv[4];
    T_OK(dpar_fill(h, 1.5f));
    t_read(h, hv);
    assert_int_equal(hv[3], 0x3E00);
    T_OK(dpar_fill(bh, -1.5f));
    t_read(bh, hv);
    assert_int_equal(hv[0], 0xBFC0);
    T_OK(dpar_fill(ib, 3.9f));
    t_read(ib, iv);
    assert_int_equal(iv[2], 3);
    T_OK(dpar_fill(ib, -3.9f));
    t_read(ib, iv);
    assert_int_equal(iv[1], -3);
    /* out of range / NaN: the same saturating conversion as dpar_cast, never C's undefined (int32_t) of them */
    T_OK(dpar_fill(ib, 3e9f));
    t_read(ib, iv);
    assert_int_equal(iv[0], INT32_MAX);
    T_OK(dpar_fill(ib, -3e9f));
    t_read(ib, iv);
    assert_int_equal(iv[0], INT32_MIN);
    T_OK(dpar_fill(ib, INFINITY));
    t_read(ib, iv);
    assert_int_equal(iv[0], INT32_MAX);
    T_OK(dpar_fill(ib, NAN));
    t_read(ib, iv);
    assert_int_equal(iv[3], 0);
    /* copy: same dtype and count, shapes may differ; dtype mismatch is an error */
    int64_t s5[2] = { 5, 1 };
    dpar_buffer *c = mkf(2, s5, NULL);
    T_OK(dpar_copy(c, x));
    float cv[5];
    t_read(c, cv);
    assert_memory_equal(cv, x0, sizeof cv);
    T_OK(dpar_copy(c, c));
    T_ERR(dpar_copy(h, ib), DPAR_ERR_DTYPE, "f16", "i32", "dpar_cast");
    T_ERR(dpar_copy(h, x), DPAR_ERR_SHAPE, "4", "5");
    T_ERR(dpar_axpy(h, 1, x), DPAR_ERR_DTYPE, "f16");
    int64_t four2[1] = { 4 };
    dpar_buffer *x4 = mkf(1, four2, NULL), *xo = t_buf(RT, 1, DPAR_F32, 1, four2, NULL);
    T_ERR(dpar_axpy(yb, 1, x4), DPAR_ERR_SHAPE, "[5]", "[4]");
    T_ERR(dpar_axpy(x4, 1, xo), DPAR_ERR_INVALID_ARGUMENT, "devices 0 and 1");
    T_ERR(dpar_scale(ib, 2), DPAR_ERR_DTYPE, "i32");
    T_ERR(dpar_scale(NULL, 2), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_fill(NULL, 2), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    T_ERR(dpar_copy(x4, NULL), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    /* zero-size buffers are fine */
    int64_t z = 0;
    dpar_buffer *e1 = mkf(1, &z, NULL), *e2 = mkf(1, &z, NULL);
    T_OK(dpar_axpy(e1, 1, e2));
    T_OK(dpar_scale(e1, 3));
    T_OK(dpar_fill(e1, 1));
    T_OK(dpar_copy(e1, e2));
    T_OK(dpar_relu(e1, e2));
}

/* ---- casts: independent references for round-to-nearest-even ---- */
static uint16_t ref_half(float f, int mant_bits, int emin, int emax) {
    /* generic binary format with mant_bits fraction bits, normal exponents emin..emax */
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isnan(f)) return 0xFFFF; /* any NaN; compared as "is NaN" */
    int ebits = mant_bits == 10 ? 5 : 8;
    uint16_t inf = (uint16_t)(sign | (((1u << ebits) - 1) << mant_bits));
    if (isinf(f)) return inf;
    double a = fabs((double)f);
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    int E = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, E - mant_bits);
    double r = nearbyint(a / q), v = r * q;
    if (v == 0) return sign;
    if (v < ldexp(1.0, emin)) return (uint16_t)(sign | (uint16_t)r); /* subnormal */
    frexp(v, &e);
    E = e - 1;
    if (E > emax) return inf;
    uint32_t mant = (uint32_t)(v / ldexp(1.0, E - mant_bits)) - (1u << mant_bits);
    return (uint16_t)(sign | ((uint32_t)(E - emin + 1) << mant_bits) | mant);
}
static int is_nan16(uint16_t h, int mant_bits) {
    uint16_t em = mant_bits == 10 ? 0x7C00 : 0x7F80, mm = mant_bits == 10 ? 0x3FF : 0x7F;
    return (h & em) == em && (h & mm);
}
static void test_scalar_conversions(void **st) {
    (void)st;
    struct {
        float f;
        uint16_t h;
    } f16c[] = {
        { 1.0f, 0x3C00 },
        { -2.0f, 0xC000 },
        { 65504.0f, 0x7BFF },
        { 65519.99f, 0x7BFF },
        { 65520.0f, 0x7C00 },
        { 1e6f, 0x7C00 },
        { -1e6f, 0xFC00 },
        { INFINITY, 0x7C00 },
        { -INFINITY, 0xFC00 },
        { -0.0f, 0x8000 },
        { 1.0f + 0x1p-11f, 0x3C00 },            /* tie -> even (down) */
        { 1.0f + 3 * 0x1p-11f, 0x3C02 },        /* tie -> even (up) */
        { 1.0f + 0x1p-11f + 0x1p-20f, 0x3C01 }, /* above the tie */
        { 0x1p-24f, 0x0001 },
        { 0x1p-25f, 0x0000 },
        { 1.5f * 0x1p-25f, 0x0001 },
        { 3 * 0x1p-25f, 0x0002 },
        { 0x1p-14f, 0x0400 },
        { 1023.5f * 0x1p-24f, 0x0400 },
        { 1022.5f * 0x1p-24f, 0x03FE },
        { 1e-40f, 0x0000 },
        { -0x1p-24f, 0x8001 },
        { 2049.0f, 0x6800 },
        { 2051.0f, 0x6802 },
    };
    for (size_t i = 0; i < sizeof f16c / sizeof f16c[0]; i++)
        if (dpar_f32_to_f16(f16c[i].f) != f16c[i].h)
            fail_msg("f32_to_f16(%a) = 0x%04x, want 0x%04x", (double)f16c[i].f, dpar_f32_to_f16(f16c[i].f), f16c[i].h);
    assert_true(is_nan16(dpar_f32_to_f16(NAN), 10));
    assert_true(is_nan16(dpar_f32_to_f16(t_u2f(0x7F800001u)), 10)); /* signalling NaN with low payload stays NaN */
    assert_true(is_nan16(dpar_f32_to_bf16(t_u2f(0x7F800001u)), 7));
    assert_true(is_nan16(dpar_f32_to_bf16(t_u2f(0xFFC00000u)), 7));
    struct {
        float f;
        uint16_t h;
    } bfc[] = {
        { 1.0f, 0x3F80 },
        { 1.0f + 0x1p-8f, 0x3F80 },
        { 1.0f + 3 * 0x1p-8f, 0x3F82 },
        { 1.0f + 0x1p-8f + 0x1p-20f, 0x3F81 },
        { 3.4028235e38f, 0x7F80 }, /* max f32 rounds up past the largest bf16 -> Inf */
        { 3.38e38f, 0x7F7E },
        { INFINITY, 0x7F80 },
        { -0.0f, 0x8000 },
        { 0x1p-133f, 0x0001 },
        { 0x1p-134f, 0x0000 },
        { 0x1p-126f, 0x0080 },
        { t_u2f(0x00008000u), 0x0000 },
        { t_u2f(0x00018000u), 0x0002 },
    };
    for (size_t i = 0; i < sizeof bfc / sizeof bfc[0]; i++)
        if (dpar_f32_to_bf16(bfc[i].f) != bfc[i].h)
            fail_msg("f32_to_bf16(%a) = 0x%04x, want 0x%04x", (double)bfc[i].f, dpar_f32_to_bf16(bfc[i].f), bfc[i].h);
    /* decode */
    assert_true(dpar_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(dpar_f16_to_f32(0x03FF) == 1023 * 0x1p-24f);
    assert_true(dpar_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(dpar_f16_to_f32(0xFC00) == -INFINITY);
    assert_true(isnan(dpar_f16_to_f32(0x7E00)) && isnan(dpar_f16_to_f32(0x7C01)));
    assert_true(signbit(dpar_f16_to_f32(0x8000)) && dpar_f16_to_f32(0x8000) == 0);
    assert_true(dpar_bf16_to_f32(0x0001) == 0x1p-133f);
    /* every f16 round-trips exactly */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if (is_nan16((uint16_t)h, 10)) {
            assert_true(isnan(dpar_f16_to_f32((uint16_t)h)));
            continue;
        }
        if (dpar_f32_to_f16(dpar_f16_to_f32((uint16_t)h)) != h) fail_msg("f16 0x%04x does not round-trip", h);
    }
    /* a sweep of f32 bit patterns against the reference rounding */
    uint32_t u = 12345;
    for (int i = 0; i < 300000; i++) {
        u = u * 1664525u + 1013904223u;
        uint32_t bits =
            i < 100000 ? u
                       : (i < 200000 ? (u & 0x807FFFFFu) | ((uint32_t)(100 + (u >> 7) % 50) << 23) /* near f16 range */
                                     : (u & 0x80FFFFFFu) | 0x30000000u);
        float f = t_u2f(bits);
        uint16_t want = ref_half(f, 10, -14, 15), got = dpar_f32_to_f16(f);
        if (isnan(f))
            assert_true(is_nan16(got, 10));
        else if (got != want)
            fail_msg("f32_to_f16(%a [0x%08x]) = 0x%04x, want 0x%04x", (double)f, bits, got, want);
        want = ref_half(f, 7, -126, 127);
        got = dpar_f32_to_bf16(f);
        if (isnan(f))
            assert_true(is_nan16(got, 7));
        else if (got != want)
            fail_msg("f32_to_bf16(%a [0x%08x]) = 0x%04x, want 0x%04x", (double)f, bits, got, want);
    }
}

static void test_cast_op(void **st) {
    (void)st;
    enum { N = 12 };
    float src[N] = { 1.0f,     -2.5f, 65520.0f, 1.0f + 0x1p-11f, 0x1p-25f * 3, NAN,
                     INFINITY, -0.0f, 2.7f,     -2.7f,           3e9f,         -3e9f };
    int64_t n = N;
    dpar_buffer *f = t_buf1(RT, DPAR_F32, N, src), *h = t_buf(RT, 0, DPAR_F16, 1, &n, NULL),
                *b = t_buf(RT, 0, DPAR_BF16, 1, &n, NULL), *i = t_buf(RT, 0, DPAR_I32, 1, &n, NULL);
    dpar_buffer *back = t_buf1(RT, DPAR_F32, N, NULL);
    uint16_t hv[N], bv[N];
    int32_t iv[N];
    T_OK(dpar_cast(h, f));
    t_read(h, hv);
    T_OK(dpar_cast(b, f));
    t_read(b, bv);
    T_OK(dpar_cast(i, f));
    t_read(i, iv);
    for (int k = 0; k < N; k++) {
        if (isnan(src[k])) {
            assert_true(is_nan16(hv[k], 10));
            assert_true(is_nan16(bv[k], 7));
            continue;
        }
        assert_int_equal(hv[k], ref_half(src[k], 10, -14, 15));
        assert_int_equal(bv[k], ref_half(src[k], 7, -126, 127));
    }
    /* float -> i32 truncates toward zero, NaN -> 0, saturating */
    const int32_t iw[N] = { 1, -2, 65520, 1, 0, 0, INT32_MAX, 0, 2, -2, INT32_MAX, INT32_MIN };
    for (int k = 0; k < N; k++)
        if (iv[k] != iw[k]) fail_msg("cast f32 %g -> i32 = %d, want %d", src[k], iv[k], iw[k]);
    /* f16 -> f32 and bf16 -> f32 give the decoded values exactly */
    float fv[N];
    T_OK(dpar_cast(back, h));
    t_read(back, fv);
    for (int k = 0; k < N; k++) {
        if (isnan(src[k])) {
            assert_true(isnan(fv[k]));
            continue;
        }
        assert_true(fv[k] == dpar_f16_to_f32(hv[k]));
    }
    T_OK(dpar_cast(back, b));
    t_read(back, fv);
    for (int k = 0; k < N; k++)
        if (!isnan(src[k])) assert_true(fv[k] == dpar_bf16_to_f32(bv[k]));
    /* i32 -> f32 rounds to nearest even; i32 -> f16 overflows to Inf */
    int32_t is[4] = { 16777217, -16777219, 70000, 7 };
    int64_t four = 4;
    dpar_buffer *ib = t_buf(RT, 0, DPAR_I32, 1, &four, is), *fb = t_buf1(RT, DPAR_F32, 4, NULL),
                *hb = t_buf(RT, 0, DPAR_F16, 1, &four, NULL);
    float fo[4];
    uint16_t ho[4];
    T_OK(dpar_cast(fb, ib));
    t_read(fb, fo);
    assert_true(fo[0] == 16777216.0f && fo[1] == -16777220.0f && fo[2] == 70000.0f && fo[3] == 7.0f);
    T_OK(dpar_cast(hb, ib));
    t_read(hb, ho);
    assert_int_equal(ho[2], 0x7C00);
    assert_int_equal(ho[3], 0x4700);
    /* f16 -> bf16 directly, and i32 -> i32 keeps every bit */
    T_OK(dpar_cast(b, h));
    t_read(b, bv);
    assert_int_equal(bv[0], 0x3F80);
    assert_int_equal(bv[2], 0x7F80); /* f16 Inf stays Inf */
    dpar_buffer *ib2 = t_buf(RT, 0, DPAR_I32, 1, &four, NULL);
    T_OK(dpar_cast(ib2, ib));
    int32_t io[4];
    t_read(ib2, io);
    assert_memory_equal(io, is, sizeof is);
    /* errors */
    T_ERR(dpar_cast(fb, h), DPAR_ERR_SHAPE, "[4]", "[12]");
    T_ERR(dpar_cast(NULL, h), DPAR_ERR_INVALID_ARGUMENT, "NULL");
    dpar_buffer *other = t_buf(RT, 1, DPAR_F16, 1, &four, NULL);
    T_ERR(dpar_cast(fb, other), DPAR_ERR_INVALID_ARGUMENT, "devices 0 and 1");
}

/* ---- sum / sum of squares ---- */
static void test_sum(void **st) {
    (void)st;
    enum { N = 1000 };
    float x[N];
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        x[i] = ival(i, 6) * 0.25f;
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    int64_t one = 1, n = N;
    dpar_buffer *bx = t_buf1(RT, DPAR_F32, N, x), *o = mkf(1, &one, NULL);
    T_OK(dpar_sum(o, bx));
    assert_true(t_value_f32(o) == (float)s); /* dyadic data: exact in any order */
    T_OK(dpar_sum_squares(o, bx));
    assert_true(t_value_f32(o) == (float)s2);
    /* non-dyadic data: the order may differ from the reference, so a tolerance */
    for (int i = 0; i < N; i++) x[i] = sinf((float)i) * 1.1f;
    T_OK(dpar_buffer_write(bx, 0, x, sizeof x));
    s = 0;
    s2 = 0;
    for (int i = 0; i < N; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    T_OK(dpar_sum(o, bx));
    assert_true(fabs(t_value_f32(o) - s) <= 1e-5 * (fabs(s) + 1));
    T_OK(dpar_sum_squares(o, bx));
    assert_true(fabs(t_value_f32(o) - s2) <= 1e-6 * s2);
    float nanv[3] = { 1, NAN, 2 };
    dpar_buffer *bn = t_buf1(RT, DPAR_F32, 3, nanv);
    T_OK(dpar_sum(o, bn));
    assert_true(isnan(t_value_f32(o)));
    int64_t z = 0;
    dpar_buffer *e = t_buf1(RT, DPAR_F32, z, NULL);
    T_OK(dpar_sum(o, e));
    assert_true(t_value_f32(o) == 0.0f);
    dpar_buffer *h = t_buf(RT, 0, DPAR_F16, 1, &n, NULL), *o2 = t_buf1(RT, DPAR_F32, 2, NULL),
                *oi = t_buf(RT, 0, DPAR_I32, 1, &one, NULL), *oo = t_buf(RT, 1, DPAR_F32, 1, &one, NULL);
    T_ERR(dpar_sum(o, h), DPAR_ERR_DTYPE, "f16");
    T_ERR(dpar_sum(o2, bx), DPAR_ERR_SHAPE, "1 f32 element");
    T_ERR(dpar_sum_squares(oi, bx), DPAR_ERR_DTYPE, "i32", "f32");
    T_ERR(dpar_sum(oo, bx), DPAR_ERR_INVALID_ARGUMENT, "devices");
    T_ERR(dpar_sum_squares(o, NULL), DPAR_ERR_INVALID_ARGUMENT, "NULL");
}

/* ops run inside pmap functions on each device's own buffers */
static dpar_status op_fn(dpar_ctx *ctx, void *user) {
    float *res = (float *)user;
    int d = dpar_ctx_device(ctx);
    int64_t s[2] = { 2, 2 };
    dpar_buffer *a, *c;
    dpar_status st = dpar_ctx_buffer(ctx, DPAR_F32, 2, s, &a);
    if (!st) st = dpar_ctx_buffer(ctx, DPAR_F32, 2, s, &c);
    if (!st) st = dpar_fill(a, (float)(d + 1));
    if (!st) st = dpar_matmul(c, a, a, false, true, 1.0f, 0.0f);
    if (!st) st = dpar_buffer_read(c, 0, &res[d * 4], 16);
    return st;
}
static void test_ops_in_pmap(void **st) {
    (void)st;
    dpar_mesh *m = t_mesh1(RT, 2, "data");
    float res[8];
    dpar_shard_map_desc sd = { .fn = op_fn, .user = res };
    T_OK(dpar_shard_map(m, &sd));
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 4; k++) assert_true(res[d * 4 + k] == 2.0f * (float)(d + 1) * (float)(d + 1));
    dpar_mesh_destroy(m);
}

int main(void) {
    t_watchdog("test_ops: still running after 300 s: a hang (deadlock) in an op\n", 300);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_blocked),
        cmocka_unit_test(test_matmul_errors),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_bias_grad_threads),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_mse),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_scalar_conversions),
        cmocka_unit_test(test_cast_op),
        cmocka_unit_test(test_sum),
        cmocka_unit_test(test_ops_in_pmap),
    };
    return cmocka_run_group_tests(tests, t_setup, t_teardown);
}
