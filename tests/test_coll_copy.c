/* The copying collectives of the CPU host path at the sizes where they switch
   to streaming stores (the whole collective above the caches it can stay in:
   the L2s of all CPUs, at most 3/4 of the last-level cache; 4 MB on a 2-CPU
   machine with 2 MB L2s) and at sizes that stay in the cache: all-gather
   (tiled along dim 0, and stacked along dim 1 so that every member's block is
   split in rows) and broadcast (out of place and in place, from a root that
   is not member 0), with byte counts that are not multiples of the 128-byte
   copy step, checked element by element against values made from the source
   member and the index. The host path cuts its work into 64 KB chunks that any
   member may do: reduce-scatter with blocks longer than a chunk (split
   between chunks) and shorter (several in one), and all-to-all, checked bit
   for bit against the sum in member order. */
#include "testutil.h"

typedef struct {
    dpar_array *in, *out;
    int kind; /* 0 all-gather tiled dim 0, 1 all-gather stacked dim 1, 2 broadcast, 3 broadcast in place */
} job;

static dpar_status fn(dpar_ctx *ctx, void *user) {
    job *j = (job *)user;
    int d = dpar_ctx_device(ctx);
    dpar_buffer *in = dpar_array_shard(j->in, d), *out = j->out ? dpar_array_shard(j->out, d) : in;
    switch (j->kind) {
    case 0: return dpar_all_gather(ctx, out, in, "data", 0, true);
    case 1: return dpar_all_gather(ctx, out, in, "data", 1, false);
    default: return dpar_pbroadcast(ctx, out, in, "data", 1);
    }
}

static float val(int member, int64_t i) {
    return (float)member * 1e6f + (float)(i % 999983);
}

/* n members, each input [rows, cols] f32 (the global input array stacks them along dim 0) */
static void run(int n, int kind, int64_t rows, int64_t cols) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, n);
    dpar_mesh *m = t_mesh1(rt, n, "data");
    int64_t per = rows * cols, total = per * n;
    float *h = malloc((size_t)total * 4), *o = malloc((size_t)(total * n) * 4);
    assert_non_null(h);
    assert_non_null(o);
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < per; i++) h[r * per + i] = val(r, i);
    job j = { NULL, NULL, kind };
    dpar_array_desc din = { .dtype = DPAR_F32, .ndim = 2, .shape = { rows * n, cols }, .spec = { "data" } };
    T_OK(dpar_array_create(m, &din, &j.in));
    T_OK(dpar_array_put(j.in, h));
    if (kind != 3) {
        dpar_array_desc dout = { .dtype = DPAR_F32, .ndim = 2, .shape = { rows * n * n, cols }, .spec = { "data" } };
        if (kind == 1)
            dout =
                (dpar_array_desc){ .dtype = DPAR_F32, .ndim = 3, .shape = { rows * n, n, cols }, .spec = { "data" } };
        if (kind >= 2) dout = din;
        T_OK(dpar_array_create(m, &dout, &j.out));
    }
    dpar_shard_map_desc sd = { .fn = fn, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_array_get(j.out ? j.out : j.in, o));
    int64_t per_out = kind >= 2 ? per : per * n;
    for (int d = 0; d < n; d++)
        for (int64_t i = 0; i < per_out; i++) {
            int src;
            int64_t k;
            if (kind == 0) { /* out = the n inputs one after the other */
                src = (int)(i / per);
                k = i % per;
            } else if (kind == 1) { /* out [rows, n, cols]: row r, member s, column c */
                src = (int)(i / cols % n);
                k = i / (cols * n) * cols + i % cols;
            } else {
                src = 1;
                k = i;
            }
            float want = val(src, k), got = o[(int64_t)d * per_out + i];
            if (got != want)
                fail_msg("n=%d kind %d %lldx%lld: member %d element %lld = %g, want %g", n, kind, (long long)rows,
                         (long long)cols, d, (long long)i, (double)got, (double)want);
        }
    dpar_array_destroy(j.in);
    dpar_array_destroy(j.out);
    dpar_runtime_destroy(rt);
    free(h);
    free(o);
}

static void test_all_gather_copy(void **st) {
    (void)st;
    run(2, 0, 4099, 1031); /* 16.9 MB per input: (n+1) S = 101 MB, streaming stores */
    run(3, 1, 1025, 2053); /* stacked, every block split in rows: streaming */
    run(4, 0, 7, 13);      /* cached */
    run(2, 1, 3, 5);
}
static void test_broadcast_copy(void **st) {
    (void)st;
    run(2, 2, 8191, 1027); /* 33.6 MB: streaming */
    run(3, 3, 4097, 1025); /* in place: the root's copy is skipped */
    run(4, 2, 5, 3);
    run(2, 3, 1, 1);
}

/* psum_scatter tiled along dim 1 of [rows, n * cols] f32 inputs: block (row,
   member) is cols elements, summed over the members in order */
typedef struct {
    dpar_array *in, *out;
    int a2a;
} rs_job;
static dpar_status rs_fn(dpar_ctx *ctx, void *user) {
    rs_job *j = (rs_job *)user;
    int d = dpar_ctx_device(ctx);
    dpar_buffer *in = dpar_array_shard(j->in, d), *out = dpar_array_shard(j->out, d);
    return j->a2a ? dpar_all_to_all(ctx, out, in, "data", 1, 0) : dpar_psum_scatter(ctx, out, in, "data", 1, true);
}
static float rs_val(int member, int64_t i) {
    return (float)(member + 1) * 0.1f + (float)(i % 1009) * 1.3e-3f; /* sums that round */
}
static void run_rs(int n, int64_t rows, int64_t cols, int a2a) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, n);
    dpar_mesh *m = t_mesh1(rt, n, "data");
    int64_t per = rows * n * cols; /* one member's input */
    float *h = malloc((size_t)(per * n) * 4), *o = malloc((size_t)(per * n) * 4);
    assert_non_null(h);
    assert_non_null(o);
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < per; i++) h[r * per + i] = rs_val(r, i);
    rs_job j = { NULL, NULL, a2a };
    dpar_array_desc din = { .dtype = DPAR_F32, .ndim = 2, .shape = { rows * n, n * cols }, .spec = { "data" } };
    dpar_array_desc dout = { .dtype = DPAR_F32, .ndim = 2, .shape = { rows * n, cols }, .spec = { "data" } };
    if (a2a) /* split dim 1 into n, concatenate along dim 0: out [n * rows, cols] per member */
        dout.shape[0] = rows * n * n;
    T_OK(dpar_array_create(m, &din, &j.in));
    T_OK(dpar_array_put(j.in, h));
    T_OK(dpar_array_create(m, &dout, &j.out));
    dpar_shard_map_desc sd = { .fn = rs_fn, .user = &j };
    T_OK(dpar_shard_map(m, &sd));
    T_OK(dpar_array_get(j.out, o));
    int64_t per_out = a2a ? per : rows * cols;
    for (int d = 0; d < n; d++)
        for (int64_t i = 0; i < per_out; i++) {
            float want;
            if (a2a) { /* out row s * rows + r of member d: member s's row r, columns of split d */
                int s = (int)(i / (rows * cols));
                int64_t r = i / cols % rows, c = i % cols;
                want = rs_val(s, r * n * cols + d * cols + c);
            } else {
                int64_t r = i / cols, c = i % cols, at = r * n * cols + d * cols + c;
                volatile float acc = rs_val(0, at);
                for (int k = 1; k < n; k++) acc = acc + rs_val(k, at);
                want = acc;
            }
            float got = o[(int64_t)d * per_out + i];
            if (memcmp(&got, &want, 4))
                fail_msg("n=%d %s %lldx%lld: member %d element %lld = %.9g, want %.9g", n,
                         a2a ? "all_to_all" : "psum_scatter", (long long)rows, (long long)cols, d, (long long)i,
                         (double)got, (double)want);
        }
    dpar_array_destroy(j.in);
    dpar_array_destroy(j.out);
    dpar_runtime_destroy(rt);
    free(h);
    free(o);
}
static void test_reduce_scatter_chunks(void **st) {
    (void)st;
    run_rs(3, 5, 40009, 0); /* blocks of 40009 elements: split between 64 KB chunks */
    run_rs(8, 7, 1031, 0);  /* 8 members on fewer cores: chunks of several blocks, claimed by any member */
    run_rs(2, 1, 3, 0);
}
static void test_all_to_all_chunks(void **st) {
    (void)st;
    run_rs(8, 3, 517, 1); /* 64 blocks, any member copies any */
    run_rs(3, 2, 20011, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_gather_copy),
        cmocka_unit_test(test_broadcast_copy),
        cmocka_unit_test(test_reduce_scatter_chunks),
        cmocka_unit_test(test_all_to_all_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
