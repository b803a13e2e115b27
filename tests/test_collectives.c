/* Collectives of the CPU reference backend: every collective over meshes of
   1, 2, 4 and 8 devices and over each axis / axis set of 2x4 and 2x2x2 meshes,
   in every dtype, with exact small-integer data; in place, async, zero-size,
   bitwise agreement between members, and the issue's small inputs and errors. */
#include "testutil.h"
#include <pthread.h>
#include <time.h>
#include <unistd.h>

enum { MAXD = 8 };

/* ---- exact dtype encode/decode, independent of the library ---- */
static double t_f16_val(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}
static double t_bf16_val(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* encodes a small integer / dyadic value that is exactly representable; used on
   worker threads, where cmocka's asserts cannot be used, so a bad value aborts */
#define T_NEED(c)                                                   \
    do {                                                            \
        if (!(c)) {                                                 \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                \
        }                                                           \
    } while (0)
static uint16_t t_f16_bits(double v) {
    if (v == 0) return signbit(v) ? 0x8000 : 0;
    uint16_t s = v < 0 ? 0x8000 : 0;
    double a = fabs(v);
    int e;
    double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5,1) */
    int E = e - 1 + 15;
    T_NEED(E >= 1 && E <= 30);
    double mant = ldexp(fr, 11) - 1024; /* 10 fraction bits */
    T_NEED(mant == floor(mant));
    return (uint16_t)(s | (E << 10) | (int)mant);
}
static uint16_t t_bf16_bits(double v) {
    float f = (float)v;
    T_NEED((double)f == v);
    uint32_t u;
    memcpy(&u, &f, 4);
    T_NEED((u & 0xffff) == 0);
    return (uint16_t)(u >> 16);
}
static void t_store(void *p, dpar_dtype t, int64_t i, double v) {
    switch (t) {
    case DPAR_F32: ((float *)p)[i] = (float)v; break;
    case DPAR_F16: ((uint16_t *)p)[i] = t_f16_bits(v); break;
    case DPAR_BF16: ((uint16_t *)p)[i] = t_bf16_bits(v); break;
    case DPAR_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    default: break;
    }
}
static double t_load(const void *p, dpar_dtype t, int64_t i) {
    switch (t) {
    case DPAR_F32: return ((const float *)p)[i];
    case DPAR_F16: return t_f16_val(((const uint16_t *)p)[i]);
    case DPAR_BF16: return t_bf16_val(((const uint16_t *)p)[i]);
    case DPAR_I32: return ((const int32_t *)p)[i];
    default: return NAN;
    }
}
/* small integers in [-8, 8], different per device and element */
static double gen(int dev, int64_t i) {
    return (double)(((dev * 5 + i * 3 + 1) % 17) - 8);
}

/* ---- the sweep: every collective variant in one shard_map per (mesh, axes, dtype) ----
   One row per variant: the call, its input and output shapes and what each output
   element must be. Shapes are in terms of the group size n (dims below); C = 3. */
enum { C = 3 };
#define N(k)  (-(k))       /* k * n */
#define NN(k) (-100 * (k)) /* k * n * n */
static int64_t dim_of(int d, int n) {
    return d >= 0 ? d : d > -100 ? (int64_t)-d * n : (int64_t)(-d / 100) * n * n;
}

typedef enum { PSUM, PMEAN, PMAX, PMIN, ALL_GATHER, PSUM_SCATTER, PPERMUTE, ALL_TO_ALL, PBROADCAST } coll_op;
typedef struct coll_case {
    const char *name;
    coll_op op;
    bool in_place;
    int dim;
    bool tiled;        /* all_gather, psum_scatter */
    int split, concat; /* all_to_all */
    bool partial;      /* ppermute: only 0 -> n-1; else the cycle i -> i+1 */
    bool root_last;    /* pbroadcast: root n-1; else 0 */
    bool async;        /* started together, waited in reverse order after the behind_async row */
    bool behind_async; /* a blocking in-place psum issued while the async ones may be pending */
    int in[2], out[3]; /* dims (N(k), NN(k) or a number); 0 ends out; in defaults to [2n, C] */
    bool same_bits;    /* every member of a group gets the same bits */
} coll_case;

static const coll_case cases[] = {
    { .name = "psum", .op = PSUM, .out = { N(2), C }, .same_bits = true },
    { .name = "pmean", .op = PMEAN, .out = { N(2), C }, .same_bits = true },
    { .name = "pmax", .op = PMAX, .out = { N(2), C }, .same_bits = true },
    { .name = "pmin", .op = PMIN, .out = { N(2), C }, .same_bits = true },
    { .name = "psum in place", .op = PSUM, .in_place = true, .out = { N(2), C }, .same_bits = true },
    { .name = "pmean in place", .op = PMEAN, .in_place = true, .out = { N(2), C }, .same_bits = true },
    { .name = "pmax in place", .op = PMAX, .in_place = true, .out = { N(2), C }, .same_bits = true },
    { .name = "pmin in place", .op = PMIN, .in_place = true, .out = { N(2), C }, .same_bits = true },
    { .name = "all_gather stacked dim 0", .op = ALL_GATHER, .dim = 0, .out = { N(1), N(2), C }, .same_bits = true },
    { .name = "all_gather tiled dim 0",
      .op = ALL_GATHER,
      .dim = 0,
      .tiled = true,
      .out = { NN(2), C },
      .same_bits = true },
    { .name = "all_gather tiled dim 1",
      .op = ALL_GATHER,
      .dim = 1,
      .tiled = true,
      .out = { N(2), N(C) },
      .same_bits = true },
    { .name = "all_gather stacked dim 1", .op = ALL_GATHER, .dim = 1, .out = { N(2), N(1), C }, .same_bits = true },
    { .name = "psum_scatter tiled dim 0", .op = PSUM_SCATTER, .dim = 0, .tiled = true, .out = { 2, C } },
    { .name = "psum_scatter stacked dim 0", .op = PSUM_SCATTER, .dim = 0, .in = { N(1), C }, .out = { C } },
    { .name = "psum_scatter tiled dim 1",
      .op = PSUM_SCATTER,
      .dim = 1,
      .tiled = true,
      .in = { C, N(2) },
      .out = { C, 2 } },
    { .name = "ppermute cycle", .op = PPERMUTE, .out = { N(2), C } },
    { .name = "ppermute partial", .op = PPERMUTE, .partial = true, .out = { N(2), C } },
    { .name = "ppermute in place", .op = PPERMUTE, .in_place = true, .out = { N(2), C } },
    { .name = "all_to_all split 0 concat 1", .op = ALL_TO_ALL, .split = 0, .concat = 1, .out = { 2, N(C) } },
    { .name = "all_to_all split 1 concat 0",
      .op = ALL_TO_ALL,
      .split = 1,
      .concat = 0,
      .in = { C, N(2) },
      .out = { N(C), 2 } },
    { .name = "all_to_all split 0 concat 0", .op = ALL_TO_ALL, .split = 0, .concat = 0, .out = { N(2), C } },
    { .name = "psum_scatter stacked dim 1", .op = PSUM_SCATTER, .dim = 1, .in = { C, N(1) }, .out = { C } },
    { .name = "ppermute in place partial", .op = PPERMUTE, .in_place = true, .partial = true, .out = { N(2), C } },
    { .name = "pbroadcast root n-1", .op = PBROADCAST, .root_last = true, .out = { N(2), C }, .same_bits = true },
    { .name = "pbroadcast in place root 0", .op = PBROADCAST, .in_place = true, .out = { N(2), C }, .same_bits = true },
    { .name = "async psum", .op = PSUM, .async = true, .out = { N(2), C }, .same_bits = true },
    { .name = "async all_gather",
      .op = ALL_GATHER,
      .async = true,
      .dim = 0,
      .out = { N(1), N(2), C },
      .same_bits = true },
    { .name = "async psum_scatter", .op = PSUM_SCATTER, .async = true, .dim = 0, .tiled = true, .out = { 2, C } },
    { .name = "blocking psum behind async",
      .op = PSUM,
      .in_place = true,
      .behind_async = true,
      .out = { N(2), C },
      .same_bits = true },
};
enum { NCASES = sizeof cases / sizeof cases[0] };

typedef struct sweep {
    const char *axes;
    dpar_dtype dt;
    int n; /* group size */
    dpar_status st[MAXD];
    char err[MAXD][256];
    int idx[MAXD], size[MAXD]; /* axis_index / axis_size seen inside */
    void *res[NCASES][MAXD];   /* host copies of outputs */
    int ndim[NCASES][MAXD];
    int64_t shape[NCASES][MAXD][3];
} sweep;

static void in_shape(const coll_case *c, int n, int64_t *s) {
    s[0] = c->in[0] ? dim_of(c->in[0], n) : 2 * n;
    s[1] = c->in[0] ? dim_of(c->in[1], n) : C;
}
static int out_shape(const coll_case *c, int n, int64_t *o) {
    int nd = 0;
    while (nd < 3 && c->out[nd]) {
        o[nd] = dim_of(c->out[nd], n);
        nd++;
    }
    return nd;
}

static dpar_status make_input(dpar_ctx *ctx, dpar_dtype dt, const int64_t *shape, int ndim, dpar_buffer **out) {
    dpar_status s = dpar_ctx_buffer(ctx, dt, ndim, shape, out);
    if (s) return s;
    int64_t cnt = dpar_buffer_count(*out);
    size_t es = dpar_dtype_size(dt);
    char *h = (char *)calloc((size_t)cnt + 1, es);
    for (int64_t i = 0; i < cnt; i++) t_store(h, dt, i, gen(dpar_ctx_device(ctx), i));
    s = dpar_buffer_write(*out, 0, h, (size_t)cnt * es);
    free(h);
    return s;
}

static dpar_status save(sweep *w, int v, int dev, dpar_buffer *b) {
    size_t nb = dpar_buffer_nbytes(b);
    w->res[v][dev] = malloc(nb + 1);
    w->ndim[v][dev] = dpar_buffer_ndim(b);
    for (int d = 0; d < dpar_buffer_ndim(b) && d < 3; d++) w->shape[v][dev][d] = dpar_buffer_dim(b, d);
    return dpar_buffer_read(b, 0, w->res[v][dev], nb);
}

/* Issues row c's collective (blocking, or its start when req is not NULL). */
static dpar_status issue(dpar_ctx *ctx, const coll_case *c, const sweep *w, dpar_buffer *out, dpar_buffer *in,
                         dpar_request **req) {
    int n = w->n, cyc[2 * MAXD], part[2] = { 0, n - 1 };
    for (int i = 0; i < n; i++) {
        cyc[2 * i] = i;
        cyc[2 * i + 1] = (i + 1) % n;
    }
    switch (c->op) {
    case PSUM: return req ? dpar_preduce_start(ctx, out, in, w->axes, DPAR_SUM, req) : dpar_psum(ctx, out, in, w->axes);
    case PMEAN: return dpar_pmean(ctx, out, in, w->axes);
    case PMAX: return dpar_pmax(ctx, out, in, w->axes);
    case PMIN: return dpar_pmin(ctx, out, in, w->axes);
    case ALL_GATHER:
        return req ? dpar_all_gather_start(ctx, out, in, w->axes, c->dim, c->tiled, req)
                   : dpar_all_gather(ctx, out, in, w->axes, c->dim, c->tiled);
    case PSUM_SCATTER:
        return req ? dpar_psum_scatter_start(ctx, out, in, w->axes, c->dim, c->tiled, req)
                   : dpar_psum_scatter(ctx, out, in, w->axes, c->dim, c->tiled);
    case PPERMUTE:
        return c->partial ? dpar_ppermute(ctx, out, in, w->axes, part, 1)
                          : dpar_ppermute(ctx, out, in, w->axes, cyc, n);
    case ALL_TO_ALL: return dpar_all_to_all(ctx, out, in, w->axes, c->split, c->concat);
    case PBROADCAST: return dpar_pbroadcast(ctx, out, in, w->axes, c->root_last ? n - 1 : 0);
    }
    return DPAR_ERR_INVALID_ARGUMENT;
}

static dpar_status sweep_fn(dpar_ctx *ctx, void *user) {
    sweep *w = (sweep *)user;
    int dev = dpar_ctx_device(ctx), n = w->n;
    dpar_status s;
    dpar_buffer *async_in = NULL, *async_out[NCASES] = { 0 };
    dpar_request *req[NCASES] = { 0 };
#define CK(x)             \
    do {                  \
        s = (x);          \
        if (s) goto fail; \
    } while (0)
    CK(dpar_ctx_axis_index(ctx, w->axes, &w->idx[dev]));
    CK(dpar_ctx_axis_size(ctx, w->axes, &w->size[dev]));
    for (int v = 0; v < NCASES; v++) {
        const coll_case *c = &cases[v];
        if (c->op == PMEAN && w->dt == DPAR_I32) continue; /* refused: test_i32_pmean_refused */
        int64_t is[2], os[3];
        in_shape(c, n, is);
        int ond = out_shape(c, n, os);
        dpar_buffer *in = NULL, *out = NULL;
        if (c->async) { /* one input shared by the async rows; their outputs are saved after the waits */
            if (!async_in) CK(make_input(ctx, w->dt, is, 2, &async_in));
            CK(dpar_ctx_buffer(ctx, w->dt, ond, os, &async_out[v]));
            CK(issue(ctx, c, w, async_out[v], async_in, &req[v]));
            continue;
        }
        CK(make_input(ctx, w->dt, is, 2, &in));
        if (c->in_place)
            out = in;
        else {
            CK(dpar_ctx_buffer(ctx, w->dt, ond, os, &out));
            CK(dpar_fill(out, 77)); /* stale contents must be overwritten */
        }
        CK(issue(ctx, c, w, out, in, NULL));
        if (c->behind_async) /* the async rows, waited in reverse order */
            for (int a = NCASES - 1; a >= 0; a--)
                if (req[a]) {
                    CK(dpar_wait(ctx, req[a]));
                    req[a] = NULL;
                }
        for (int a = 0; c->behind_async && a < NCASES; a++)
            if (async_out[a]) {
                CK(save(w, a, dev, async_out[a]));
                dpar_buffer_destroy(async_out[a]);
                async_out[a] = NULL;
            }
        CK(save(w, v, dev, out));
        dpar_buffer_destroy(in);
        if (!c->in_place) dpar_buffer_destroy(out);
    }
    if (async_in) dpar_buffer_destroy(async_in);
    w->st[dev] = DPAR_OK;
    return DPAR_OK;
fail:
    w->st[dev] = s;
    snprintf(w->err[dev], sizeof w->err[dev], "%s", dpar_last_error());
    return s;
#undef CK
}

/* expected value of element (flat index e) of row c on group rank r;
   X(k, i) = input element i of member k */
static double expect(const sweep *w, const coll_case *c, const int *mem, int r, int64_t e) {
    int n = w->n;
#define X(k, i) gen(mem[k], (i))
    switch (c->op) {
    case PSUM:
    case PMEAN: {
        double s = 0;
        for (int k = 0; k < n; k++) s += X(k, e);
        if (c->op == PMEAN) return s / n;
        return s;
    }
    case PMAX:
    case PMIN: {
        double m = X(0, e);
        for (int k = 1; k < n; k++) {
            double x = X(k, e);
            if (c->op == PMAX)
                m = x > m ? x : m;
            else
                m = x < m ? x : m;
        }
        return m;
    }
    case ALL_GATHER:
        if (c->dim == 0) { /* [n, R*C] */
            int64_t per = 2 * n * C;
            return X(e / per, e % per);
        } else { /* [R, n, C] */
            int64_t i = e / (n * C), k = (e / C) % n, j = e % C;
            return X(k, i * C + j);
        }
    case PSUM_SCATTER: { /* blocks of bs rows (dim 0) or columns (dim 1) of the input, summed */
        int64_t bs = c->tiled ? 2 : 1;
        double s = 0;
        if (c->dim == 0) { /* out [bs, C] (tiled) or [C] from in [n*bs, C] */
            int64_t i = e / C, j = e % C;
            for (int k = 0; k < n; k++) s += X(k, (r * bs + i) * C + j);
        } else { /* out [C, bs] (tiled) or [C] from in [C, n*bs] */
            int64_t i = e / bs, j = e % bs;
            for (int k = 0; k < n; k++) s += X(k, i * n * bs + r * bs + j);
        }
        return s;
    }
    case PPERMUTE:
        if (c->partial) return r == n - 1 ? X(0, e) : 0.0;
        return X((r + n - 1) % n, e);
    case ALL_TO_ALL:
        if (c->split == 0 && c->concat == 0) { /* out [2n, C]: out[k*2 + i, c] = x_k[(r*2+i)*C + c] */
            int64_t row = e / C, cc = e % C, k = row / 2, i = row % 2;
            return X(k, (r * 2 + i) * C + cc);
        }
        if (c->split == 0) { /* out [2, nC]: out[i, k*C + c] = x_k[(r*2+i)*C + c] */
            int64_t i = e / (n * C), k = (e % (n * C)) / C, cc = e % C;
            return X(k, (r * 2 + i) * C + cc);
        } else { /* out [nC, 2]: out[k*C + i, c] = x_k[i*2n + r*2 + c] */
            int64_t row = e / 2, cc = e % 2, k = row / C, i = row % C;
            return X(k, i * 2 * n + r * 2 + cc);
        }
    case PBROADCAST: return X(c->root_last ? n - 1 : 0, e);
    }
#undef X
    return NAN;
}

static void run_sweep(dpar_mesh *m, const char *axes, int nexpect) {
    static const dpar_dtype dts[4] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };
    int N = dpar_mesh_size(m);
    char sorted_axes[64] = ""; /* the axes of `axes` in mesh order */
    for (int a = 0; a < dpar_mesh_ndim(m); a++) {
        const char *nm = dpar_mesh_axis_name(m, a), *at = strstr(axes, nm);
        size_t len = strlen(nm);
        if (at && (at == axes || at[-1] == ',') && (at[len] == 0 || at[len] == ','))
            snprintf(sorted_axes + strlen(sorted_axes), sizeof sorted_axes - strlen(sorted_axes), "%s%s",
                     sorted_axes[0] ? "," : "", nm);
    }
    for (int t = 0; t < 4; t++) {
        sweep *w = (sweep *)calloc(1, sizeof *w);
        w->axes = axes;
        w->dt = dts[t];
        T_OK(dpar_mesh_axis_size(m, axes, &w->n));
        assert_int_equal(w->n, nexpect);
        dpar_shard_map_desc sd = { .fn = sweep_fn, .user = w };
        dpar_status s = dpar_shard_map(m, &sd);
        if (s != DPAR_OK) {
            for (int d = 0; d < N; d++)
                if (w->st[d]) print_error("device %d: %s: %s\n", d, dpar_status_string(w->st[d]), w->err[d]);
            fail_msg("sweep over '%s' in %s: %s: %s", axes, dpar_dtype_name(dts[t]), dpar_status_string(s),
                     dpar_last_error());
        }
        size_t es = dpar_dtype_size(w->dt);
        for (int d = 0; d < N; d++) {
            int mem[DPAR_MAX_DEVICES], gn = 0, r = -1, smem[DPAR_MAX_DEVICES], sn = 0, sr = -1;
            T_OK(dpar_mesh_group(m, axes, d, mem, &gn, &r));
            T_OK(dpar_mesh_group(m, sorted_axes, d, smem, &sn, &sr)); /* ppermute's group: mesh order */
            assert_int_equal(gn, w->n);
            assert_int_equal(w->idx[d], r);
            assert_int_equal(w->size[d], w->n);
            for (int v = 0; v < NCASES; v++) {
                const coll_case *c = &cases[v];
                if (c->op == PMEAN && w->dt == DPAR_I32) continue;
                int64_t os[3];
                int ond = out_shape(c, w->n, os);
                assert_int_equal(w->ndim[v][d], ond);
                int64_t cnt = 1;
                for (int k = 0; k < ond; k++) {
                    assert_int_equal(w->shape[v][d][k], os[k]);
                    cnt *= os[k];
                }
                for (int64_t e = 0; e < cnt; e++) {
                    double want = c->op == PPERMUTE ? expect(w, c, smem, sr, e) : expect(w, c, mem, r, e);
                    double got = t_load(w->res[v][d], w->dt, e);
                    if (!(got == want))
                        fail_msg("%s over '%s' (%d devices) in %s, device %d (rank %d), element %lld: got %g, want %g",
                                 c->name, axes, w->n, dpar_dtype_name(w->dt), d, r, (long long)e, got, want);
                }
                /* members of a group that get the same value get the same bits */
                if (c->same_bits)
                    for (int k = 0; k < gn; k++)
                        if (memcmp(w->res[v][d], w->res[v][mem[k]], (size_t)cnt * es))
                            fail_msg("%s over '%s': devices %d and %d differ bitwise", c->name, axes, d, mem[k]);
            }
        }
        for (int v = 0; v < NCASES; v++)
            for (int d = 0; d < MAXD; d++) free(w->res[v][d]);
        free(w);
    }
}

static void sweep_1d(int n) {
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, n);
    dpar_mesh *m = t_mesh1(rt, n, "data");
    run_sweep(m, "data", n);
    dpar_runtime_destroy(rt);
}
static void test_sweep_1(void **st) {
    (void)st;
    sweep_1d(1);
}
static void test_sweep_2(void **st) {
    (void)st;
    sweep_1d(2);
}
static void test_sweep_4(void **st) {
    (void)st;
    sweep_1d(4);
}
static void test_sweep_8(void **st) {
    (void)st;
    sweep_1d(8);
}
static void test_sweep_2x4(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[2] = { 2, 4 };
    const char *names[2] = { "data", "model" };
    dpar_mesh *m = t_mesh(rt, 2, shape, names);
    run_sweep(m, "data", 2);
    run_sweep(m, "model", 4);
    run_sweep(m, "data,model", 8);
    run_sweep(m, "model,data", 8);
    dpar_runtime_destroy(rt);
}
static void test_sweep_2x2x2(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[3] = { 2, 2, 2 };
    const char *names[3] = { "a", "b", "c" };
    dpar_mesh *m = t_mesh(rt, 3, shape, names);
    const char *sets[7] = { "a", "b", "c", "a,b", "a,c", "b,c", "a,b,c" };
    const int sizes[7] = { 2, 2, 2, 4, 4, 4, 8 };
    for (int i = 0; i < 7; i++) run_sweep(m, sets[i], sizes[i]);
    dpar_runtime_destroy(rt);
}
/* four axes, some of size 1 */
static void test_sweep_4d(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[4] = { 2, 1, 2, 2 };
    const char *names[4] = { "a", "b", "c", "d" };
    dpar_mesh *m = t_mesh(rt, 4, shape, names);
    run_sweep(m, "b", 1);
    run_sweep(m, "a,d", 4);
    run_sweep(m, "b,c", 2);
    run_sweep(m, "a,b,c,d", 8);
    dpar_runtime_destroy(rt);
}
/* a mesh over an explicit device order: groups follow mesh positions */
static void test_sweep_explicit_order(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int order[8] = { 5, 2, 7, 0, 3, 6, 1, 4 };
    dpar_mesh_desc md = { .ndim = 2, .shape = { 2, 4 }, .axis_names = { "x", "y" }, .devices = order };
    dpar_mesh *m = NULL;
    T_OK(dpar_mesh_create(rt, &md, &m));
    run_sweep(m, "y", 4);
    run_sweep(m, "x,y", 8);
    dpar_runtime_destroy(rt);
}

/* ---- generic small-job helper: each device runs fn with a shared struct ---- */
typedef struct small {
    dpar_status st[MAXD];
    char err[MAXD][512];
    float out[MAXD][8];
    uint16_t out16[MAXD][8];
    int holder; /* for NaN tests */
    int op;     /* DPAR_MAX / DPAR_MIN */
    dpar_dtype dt;
    int sleeper; /* timeout test: this device does not arrive */
    int skip;    /* ... and skips the call instead of sleeping */
    int variant;
} small;

static dpar_status rec(small *w, int dev, dpar_status s) {
    w->st[dev] = s;
    snprintf(w->err[dev], sizeof w->err[dev], "%s", s ? dpar_last_error() : "");
    return s;
}
enum { NEVER_RAN = -1 }; /* status slot of a device whose fn never ran (stopped before it started) */
static dpar_status run_small(dpar_mesh *m, dpar_fn fn, small *w) {
    for (int d = 0; d < MAXD; d++) w->st[d] = (dpar_status)NEVER_RAN;
    dpar_shard_map_desc sd = { .fn = fn, .user = w };
    return dpar_shard_map(m, &sd);
}

/* psum over a 4-device axis of f32 [d, 2d, 3d] gives [6, 12, 18] everywhere */
static dpar_status psum_d_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx);
    int64_t three = 3;
    dpar_buffer *x;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &three, &x);
    float v[3] = { (float)d, 2.0f * (float)d, 3.0f * (float)d };
    if (!s) s = dpar_buffer_write(x, 0, v, sizeof v);
    if (!s) s = dpar_psum(ctx, x, x, "data");
    if (!s) s = dpar_buffer_read(x, 0, w->out[d], sizeof v);
    return rec(w, d, s);
}
static void test_psum_d_2d_3d(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    small w;
    memset(&w, 0, sizeof w);
    T_OK(run_small(m, psum_d_fn, &w));
    for (int d = 0; d < 4; d++) {
        assert_true(w.out[d][0] == 6.0f);
        assert_true(w.out[d][1] == 12.0f);
        assert_true(w.out[d][2] == 18.0f);
    }
    dpar_runtime_destroy(rt);
}

/* pmax / pmin propagate NaN, whichever device holds it */
static dpar_status nan_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx), idx;
    int64_t three = 3;
    dpar_buffer *x, *y;
    dpar_status s = dpar_ctx_axis_index(ctx, "data", &idx);
    if (!s) s = dpar_ctx_buffer(ctx, w->dt, 1, &three, &x);
    if (!s) s = dpar_ctx_buffer(ctx, w->dt, 1, &three, &y);
    float v[3] = { 1.0f, idx == w->holder ? NAN : 2.0f, 3.0f };
    uint16_t h[3];
    for (int i = 0; i < 3; i++) h[i] = w->dt == DPAR_F16 ? dpar_f32_to_f16(v[i]) : dpar_f32_to_bf16(v[i]);
    if (!s) s = dpar_buffer_write(x, 0, w->dt == DPAR_F32 ? (void *)v : (void *)h, 3 * dpar_dtype_size(w->dt));
    if (!s) s = dpar_preduce(ctx, y, x, "data", (dpar_reduce_op)w->op);
    if (!s)
        s = dpar_buffer_read(y, 0, w->dt == DPAR_F32 ? (void *)w->out[d] : (void *)w->out16[d],
                             3 * dpar_dtype_size(w->dt));
    return rec(w, d, s);
}
static void test_pmax_pmin_nan(void **st) {
    (void)st;
    for (int n = 2; n <= 4; n += 2) {
        dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, n);
        dpar_mesh *m = t_mesh1(rt, n, "data");
        const dpar_dtype dts[3] = { DPAR_F32, DPAR_F16, DPAR_BF16 };
        for (int t = 0; t < 3; t++)
            for (int op = DPAR_MAX; op <= DPAR_MIN; op++)
                for (int holder = 0; holder < n; holder++) {
                    small w;
                    memset(&w, 0, sizeof w);
                    w.holder = holder;
                    w.op = op;
                    w.dt = dts[t];
                    T_OK(run_small(m, nan_fn, &w));
                    for (int d = 0; d < n; d++) {
                        double r[3];
                        for (int i = 0; i < 3; i++)
                            r[i] = w.dt == DPAR_F32   ? w.out[d][i]
                                   : w.dt == DPAR_F16 ? t_f16_val(w.out16[d][i])
                                                      : t_bf16_val(w.out16[d][i]);
                        if (!(r[0] == 1.0 && isnan(r[1]) && r[2] == 3.0))
                            fail_msg("%s in %s on %d devices, NaN on device %d: device %d got [%g, %g, %g], want [1, "
                                     "nan, 3]",
                                     op == DPAR_MAX ? "pmax" : "pmin", dpar_dtype_name(w.dt), n, holder, d, r[0], r[1],
                                     r[2]);
                    }
                }
        dpar_runtime_destroy(rt);
    }
}

/* psum_scatter of [1,2,3,4,5] over 4 devices: an error naming 5 and 4 */
static dpar_status rs5_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx);
    int64_t five = 5, one = 1;
    dpar_buffer *x, *y;
    float v[5] = { 1, 2, 3, 4, 5 };
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &five, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &y);
    if (!s) s = dpar_buffer_write(x, 0, v, sizeof v);
    if (!s) s = dpar_psum_scatter(ctx, y, x, "data", 0, w->variant);
    return rec(w, d, s);
}
static void test_psum_scatter_not_divisible(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    for (int tiled = 0; tiled < 2; tiled++) {
        small w;
        memset(&w, 0, sizeof w);
        w.variant = tiled;
        T_ERR(run_small(m, rs5_fn, &w), DPAR_ERR_SHAPE, "size 5", "4 devices", "psum_scatter");
        int shape_errs = 0;
        for (int d = 0; d < 4; d++) {
            assert_true(w.st[d] == DPAR_ERR_SHAPE || w.st[d] == DPAR_ERR_ABORTED || (int)w.st[d] == NEVER_RAN);
            if (w.st[d] == DPAR_ERR_SHAPE) {
                shape_errs++;
                assert_non_null(strstr(w.err[d], "size 5"));
            }
        }
        assert_true(shape_errs >= 1);
    }
    dpar_runtime_destroy(rt);
}

/* psum over an axis the mesh does not have */
static dpar_status batch_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx);
    int64_t two = 2;
    dpar_buffer *x;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &two, &x);
    if (!s) s = dpar_psum(ctx, x, x, "batch");
    return rec(w, d, s);
}
static void test_unknown_axis(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    small w;
    memset(&w, 0, sizeof w);
    T_ERR(run_small(m, batch_fn, &w), DPAR_ERR_UNKNOWN_AXIS, "'batch'", "(axes: data)");
    for (int d = 0; d < 2; d++)
        assert_true(w.st[d] == DPAR_ERR_UNKNOWN_AXIS || w.st[d] == DPAR_ERR_ABORTED || (int)w.st[d] == NEVER_RAN);
    dpar_runtime_destroy(rt);
}

/* members disagree: device 0 sums 2560 floats, the others 5120 */
static dpar_status mismatch_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx);
    int64_t cnt = w->variant == 0 ? (d == 0 ? 2560 : 5120) : 16;
    dpar_dtype dt = (w->variant == 2 && d == 1) ? DPAR_I32 : DPAR_F32;
    dpar_buffer *x;
    dpar_status s = dpar_ctx_buffer(ctx, dt, 1, &cnt, &x);
    if (s) return rec(w, d, s);
    int fwd[8] = { 0, 1, 1, 2, 2, 3, 3, 0 }, bwd[8] = { 1, 0, 2, 1, 3, 2, 0, 3 };
    if (w->variant == 1 && d == 2)
        s = dpar_pmax(ctx, x, x, "data");
    else if (w->variant == 3)
        s = dpar_ppermute(ctx, x, x, "data", d == 3 ? bwd : fwd, 4); /* different pairs */
    else if (w->variant == 4)
        s = dpar_pbroadcast(ctx, x, x, "data", d == 1 ? 1 : 0); /* different roots */
    else if (w->variant == 5 && d == 0) {                       /* all_gather vs psum */
        int64_t big = 64;
        dpar_buffer *y;
        s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &big, &y);
        if (!s) s = dpar_all_gather(ctx, y, x, "data", 0, true);
    } else if (w->variant == 6) { /* all_gather of [2,6] on device 2, [3,4] elsewhere: same count, other layout */
        int64_t shp[2] = { d == 2 ? 2 : 3, d == 2 ? 6 : 4 }, outs[2] = { shp[0], shp[1] * 4 };
        dpar_buffer *a2, *y;
        s = dpar_ctx_buffer(ctx, DPAR_F32, 2, shp, &a2);
        if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, outs, &y);
        if (!s) s = dpar_all_gather(ctx, y, a2, "data", 1, true);
    } else
        s = dpar_psum(ctx, x, x, "data");
    return rec(w, d, s);
}
static void test_mismatch(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    const char *needles[7][2] = { { "2560", "5120" },      { "psum", "pmax" },     { "f32", "i32" },
                                  { "ppermute", "pairs" }, { "root 0", "root 1" }, { "all_gather", "psum" },
                                  { "[3, 4]", "[2, 6]" } };
    for (int v = 0; v < 7; v++) {
        small w;
        memset(&w, 0, sizeof w);
        w.variant = v;
        T_ERR(run_small(m, mismatch_fn, &w), DPAR_ERR_COLLECTIVE_MISMATCH, needles[v][0], needles[v][1]);
        for (int d = 0; d < 4; d++) {
            if (w.st[d] != DPAR_ERR_COLLECTIVE_MISMATCH)
                fail_msg("variant %d: device %d got %s: %s", v, d, dpar_status_string(w.st[d]), w.err[d]);
            assert_non_null(strstr(w.err[d], needles[v][0]));
            assert_non_null(strstr(w.err[d], needles[v][1]));
        }
    }
    dpar_runtime_destroy(rt);
}

/* a member that never arrives: timeout naming it; a member that returns
   without calling: a mismatch naming it. Never a hang. */
static dpar_status late_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx);
    int64_t four = 4;
    dpar_buffer *x;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &x);
    if (s) return rec(w, d, s);
    if (d == w->sleeper) {
        if (w->skip) return rec(w, d, DPAR_OK);
        struct timespec ts = { 0, 900 * 1000000L };
        nanosleep(&ts, NULL);
        return rec(w, d, DPAR_OK); /* returns without ever calling psum */
    }
    return rec(w, d, dpar_psum(ctx, x, x, "data"));
}
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static void test_timeout_names_missing_device(void **st) {
    (void)st;
    dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CPU, .num_devices = 4, .timeout_ms = 300 };
    dpar_runtime *rt = NULL;
    T_OK(dpar_runtime_create(&rd, &rt));
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    small w;
    memset(&w, 0, sizeof w);
    w.sleeper = 2;
    double t0 = now_s();
    T_ERR(run_small(m, late_fn, &w), DPAR_ERR_TIMEOUT, "device(s) 2", "300 ms");
    double dt = now_s() - t0;
    assert_true(dt >= 0.29);
    assert_true(dt < 10.0);
    int timeouts = 0;
    for (int d = 0; d < 4; d++) {
        if (d == 2) continue;
        assert_true(w.st[d] == DPAR_ERR_TIMEOUT || w.st[d] == DPAR_ERR_ABORTED || (int)w.st[d] == NEVER_RAN);
        if (w.st[d] == DPAR_ERR_TIMEOUT) {
            timeouts++;
            assert_non_null(strstr(w.err[d], "device(s) 2"));
        }
    }
    assert_true(timeouts >= 1);
    /* the runtime is still usable afterwards */
    small ok;
    memset(&ok, 0, sizeof ok);
    T_OK(run_small(m, psum_d_fn, &ok));
    assert_true(ok.out[3][2] == 18.0f);
    /* a device that returns without calling: every waiting member is told which */
    memset(&w, 0, sizeof w);
    w.sleeper = 1;
    w.skip = 1;
    T_ERR(run_small(m, late_fn, &w), DPAR_ERR_COLLECTIVE_MISMATCH, "device 1");
    for (int d = 0; d < 4; d++)
        if (d != 1)
            assert_true(w.st[d] == DPAR_ERR_COLLECTIVE_MISMATCH || w.st[d] == DPAR_ERR_ABORTED ||
                        (int)w.st[d] == NEVER_RAN);
    dpar_runtime_destroy(rt);
    /* the timeout from DPAR_TIMEOUT_MS when the desc leaves it 0 */
    setenv("DPAR_TIMEOUT_MS", "200", 1);
    rd.timeout_ms = 0;
    rd.num_devices = 2;
    T_OK(dpar_runtime_create(&rd, &rt));
    unsetenv("DPAR_TIMEOUT_MS");
    m = t_mesh1(rt, 2, "data");
    memset(&w, 0, sizeof w);
    w.sleeper = 0;
    T_ERR(run_small(m, late_fn, &w), DPAR_ERR_TIMEOUT, "200 ms", "device(s) 0");
    dpar_runtime_destroy(rt);
}

/* f16 all-reduce accumulates in f32 and rounds once: 8 devices holding 10000
   give pmean 10000 exactly (the f32 sum 80000 never exists in f16), while psum
   is +Inf only because 80000 > 65504, the largest finite f16. */
static dpar_status f16_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx);
    int64_t two = 2;
    dpar_buffer *x, *a, *b;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F16, 1, &two, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F16, 1, &two, &a);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F16, 1, &two, &b);
    uint16_t v[2] = { 0x70E2 /* 10000 */, 0x3C00 /* 1 */ };
    if (!s) s = dpar_buffer_write(x, 0, v, sizeof v);
    if (!s) s = dpar_pmean(ctx, a, x, "data");
    if (!s) s = dpar_psum(ctx, b, x, "data");
    if (!s) s = dpar_buffer_read(a, 0, &w->out16[d][0], 4);
    if (!s) s = dpar_buffer_read(b, 0, &w->out16[d][2], 4);
    return rec(w, d, s);
}
static void test_f16_accumulates_in_f32(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    dpar_mesh *m = t_mesh1(rt, 8, "data");
    small w;
    memset(&w, 0, sizeof w);
    T_OK(run_small(m, f16_fn, &w));
    for (int d = 0; d < 8; d++) {
        assert_int_equal(w.out16[d][0], 0x70E2); /* pmean 10000 */
        assert_int_equal(w.out16[d][1], 0x3C00); /* pmean 1 */
        assert_int_equal(w.out16[d][2], 0x7C00); /* psum 80000 -> +Inf (f16 max 65504) */
        assert_int_equal(w.out16[d][3], 0x4800); /* psum 8 */
    }
    dpar_runtime_destroy(rt);
}

/* zero-size arrays work in every collective */
static dpar_status zero_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx), n;
    dpar_status s = dpar_ctx_axis_size(ctx, "data", &n);
    const dpar_dtype dts[4] = { DPAR_F32, DPAR_F16, DPAR_BF16, DPAR_I32 };
    for (int t = 0; t < 4 && !s; t++) {
        dpar_dtype dt = dts[t];
        int64_t z[2] = { 0, 3 }, zn[3] = { (int64_t)n, 0, 3 }, zt[2] = { 0, 3 * (int64_t)n }, sc[2] = { (int64_t)n, 0 },
                e0 = 0;
        dpar_buffer *a = NULL, *b = NULL, *g = NULL, *g2 = NULL, *sin = NULL, *sout = NULL, *r1 = NULL;
        s = dpar_ctx_buffer(ctx, dt, 2, z, &a);
        if (!s) s = dpar_ctx_buffer(ctx, dt, 2, z, &b);
        if (!s) s = dpar_ctx_buffer(ctx, dt, 3, zn, &g);
        if (!s) s = dpar_ctx_buffer(ctx, dt, 2, zt, &g2);
        if (!s) s = dpar_ctx_buffer(ctx, dt, 2, sc, &sin);
        if (!s) s = dpar_ctx_buffer(ctx, dt, 1, &e0, &sout);
        for (int op = DPAR_SUM; op <= DPAR_MIN && !s; op++) {
            if (op == DPAR_MEAN && dt == DPAR_I32) continue; /* refused even when empty */
            s = dpar_preduce(ctx, b, a, "data", (dpar_reduce_op)op);
            if (!s) s = dpar_preduce(ctx, a, a, "data", (dpar_reduce_op)op);
        }
        if (!s) s = dpar_all_gather(ctx, g, a, "data", 0, false);
        if (!s) s = dpar_all_gather(ctx, g2, a, "data", 1, true);
        if (!s) s = dpar_psum_scatter(ctx, b, a, "data", 0, true);       /* [0,3] -> [0,3] */
        if (!s) s = dpar_psum_scatter(ctx, sout, sin, "data", 0, false); /* [n,0] -> [0] */
        int pairs[2] = { 0, n - 1 };
        if (!s) s = dpar_ppermute(ctx, b, a, "data", pairs, 1);
        if (!s) s = dpar_ppermute(ctx, a, a, "data", pairs, 1);
        if (!s) s = dpar_all_to_all(ctx, g2, a, "data", 0, 1); /* [0,3] -> [0,3n] */
        if (!s) s = dpar_pbroadcast(ctx, b, a, "data", n - 1);
        if (!s) s = dpar_pbroadcast(ctx, a, a, "data", 0);
        dpar_request *rq;
        if (!s) s = dpar_preduce_start(ctx, b, a, "data", DPAR_SUM, &rq);
        if (!s) s = dpar_wait(ctx, rq);
        if (!s) s = dpar_all_gather_start(ctx, g, a, "data", 0, false, &rq);
        if (!s) s = dpar_wait(ctx, rq);
        if (!s) s = dpar_psum_scatter_start(ctx, b, a, "data", 0, true, &rq);
        if (!s) s = dpar_wait(ctx, rq);
        (void)r1;
        dpar_buffer_destroy(a);
        dpar_buffer_destroy(b);
        dpar_buffer_destroy(g);
        dpar_buffer_destroy(g2);
        dpar_buffer_destroy(sin);
        dpar_buffer_destroy(sout);
    }
    return rec(w, d, s);
}
static void test_zero_size(void **st) {
    (void)st;
    for (int n = 1; n <= 8; n *= 2) {
        dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, n);
        dpar_mesh *m = t_mesh1(rt, n, "data");
        small w;
        memset(&w, 0, sizeof w);
        dpar_status s = run_small(m, zero_fn, &w);
        if (s) fail_msg("zero-size collectives on %d devices: %s: %s", n, dpar_status_string(s), dpar_last_error());
        dpar_runtime_destroy(rt);
    }
}

/* Reductions add in mesh order, so the result is bitwise the sequential
   f32 sum x0 + x1 + ... in group order, the same on every member and every run. */
static float rnd_val(int dev, int i) {
    uint32_t h = ((uint32_t)dev * 2654435761u) ^ ((uint32_t)i * 40503u + 12345u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h % 2000000u) - 1000000.0f) / 7777.0f;
}
enum { RN = 1000 };
typedef struct det {
    float out[MAXD][RN];
    uint16_t out16[MAXD][RN];
    dpar_dtype dt;
} det;
static dpar_status det_fn(dpar_ctx *ctx, void *user) {
    det *w = (det *)user;
    int d = dpar_ctx_device(ctx);
    int64_t n = RN;
    dpar_buffer *x;
    dpar_status s = dpar_ctx_buffer(ctx, w->dt, 1, &n, &x);
    float v[RN];
    uint16_t h[RN];
    for (int i = 0; i < RN; i++) {
        v[i] = rnd_val(d, i);
        h[i] = w->dt == DPAR_F16 ? dpar_f32_to_f16(v[i] / 64) : dpar_f32_to_bf16(v[i]);
    }
    if (!s) s = dpar_buffer_write(x, 0, w->dt == DPAR_F32 ? (void *)v : (void *)h, (size_t)RN * dpar_dtype_size(w->dt));
    if (!s) s = dpar_psum(ctx, x, x, "data");
    if (!s)
        s = dpar_buffer_read(x, 0, w->dt == DPAR_F32 ? (void *)w->out[d] : (void *)w->out16[d],
                             (size_t)RN * dpar_dtype_size(w->dt));
    return s;
}
static void test_deterministic_mesh_order(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    dpar_mesh *m = t_mesh1(rt, 8, "data");
    det *a = (det *)calloc(1, sizeof *a), *b = (det *)calloc(1, sizeof *b);
    const dpar_dtype dts[3] = { DPAR_F32, DPAR_F16, DPAR_BF16 };
    for (int t = 0; t < 3; t++) {
        a->dt = b->dt = dts[t];
        dpar_shard_map_desc sd = { .fn = det_fn, .user = a };
        T_OK(dpar_shard_map(m, &sd));
        sd.user = b;
        T_OK(dpar_shard_map(m, &sd));
        for (int i = 0; i < RN; i++) {
            volatile float acc = 0.0f;
            for (int k = 0; k < 8; k++) {
                float x = rnd_val(k, i);
                float xv = dts[t] == DPAR_F32   ? x
                           : dts[t] == DPAR_F16 ? dpar_f16_to_f32(dpar_f32_to_f16(x / 64))
                                                : dpar_bf16_to_f32(dpar_f32_to_bf16(x));
                acc = k == 0 ? xv : acc + xv;
            }
            for (int d = 0; d < 8; d++) {
                if (dts[t] == DPAR_F32) {
                    if (memcmp(&a->out[d][i], (const void *)&acc, 4))
                        fail_msg("f32 psum element %d on device %d: %.9g, sequential sum %.9g", i, d, a->out[d][i],
                                 acc);
                } else {
                    uint16_t want = dts[t] == DPAR_F16 ? dpar_f32_to_f16(acc) : dpar_f32_to_bf16(acc);
                    if (a->out16[d][i] != want)
                        fail_msg("%s psum element %d on device %d: %04x, want %04x", dpar_dtype_name(dts[t]), i, d,
                                 a->out16[d][i], want);
                }
            }
        }
        assert_memory_equal(a->out, b->out, sizeof a->out);
        assert_memory_equal(a->out16, b->out16, sizeof a->out16);
    }
    free(a);
    free(b);
    dpar_runtime_destroy(rt);
}

/* local argument errors of collectives */
static dpar_status local_err_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int d = dpar_ctx_device(ctx);
    int64_t four = 4, eight[1] = { 8 }, three = 3;
    dpar_buffer *x, *y, *z, *h;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, eight, &y);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &three, &z);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F16, 1, &four, &h);
    if (s) return rec(w, d, s);
    switch (w->variant) {
    case 0: s = dpar_all_gather(ctx, y, y, "data", 0, true); break; /* in place: out cannot have the gathered shape */
    case 1: s = dpar_psum(ctx, z, x, "data"); break;                /* count mismatch */
    case 2: s = dpar_psum(ctx, h, x, "data"); break;                /* dtype mismatch */
    case 3: s = dpar_all_gather(ctx, z, x, "data", 0, true); break; /* wrong output shape */
    case 4: s = dpar_pbroadcast(ctx, x, x, "data", 2); break;       /* root out of range */
    case 5: {
        int p[4] = { 0, 1, 1, 1 };
        s = dpar_ppermute(ctx, x, x, "data", p, 2);
        break;
    }                                                            /* repeated destination */
    case 6: s = dpar_all_to_all(ctx, x, z, "data", 0, 0); break; /* 3 not divisible by 2 */
    case 7: s = dpar_psum(ctx, x, NULL, "data"); break;
    case 8:
        s = dpar_psum(NULL, x, x, "data");
        w->st[d] = s;
        return DPAR_OK;
    }
    return rec(w, d, s);
}
static void test_local_errors(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    const dpar_status want[9] = { DPAR_ERR_SHAPE,
                                  DPAR_ERR_SHAPE,
                                  DPAR_ERR_DTYPE,
                                  DPAR_ERR_SHAPE,
                                  DPAR_ERR_INVALID_ARGUMENT,
                                  DPAR_ERR_INVALID_ARGUMENT,
                                  DPAR_ERR_SHAPE,
                                  DPAR_ERR_INVALID_ARGUMENT,
                                  DPAR_ERR_INVALID_ARGUMENT };
    for (int v = 0; v < 9; v++) {
        small w;
        memset(&w, 0, sizeof w);
        w.variant = v;
        dpar_status s = run_small(m, local_err_fn, &w);
        if (v == 8) {
            assert_int_equal(s, DPAR_OK);
            assert_int_equal(w.st[0], want[v]);
            continue;
        }
        if (s != want[v])
            fail_msg("variant %d: %s (wanted %s): %s", v, dpar_status_string(s), dpar_status_string(want[v]),
                     dpar_last_error());
        for (int d = 0; d < 2; d++)
            assert_true(w.st[d] == want[v] || w.st[d] == DPAR_ERR_ABORTED || (int)w.st[d] == NEVER_RAN);
    }
    /* a collective outside any pmap: an error, not a crash */
    int64_t four = 4;
    dpar_buffer *x;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, &four, &x));
    T_ERR(dpar_psum(NULL, x, x, "data"), DPAR_ERR_INVALID_ARGUMENT, "ctx");
    dpar_runtime_destroy(rt);
}

/* an async request never waited: the pmap reports it, nothing leaks or hangs */
static dpar_status unwaited_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    int64_t four = 4;
    dpar_buffer *x, *y;
    dpar_request *r;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &y);
    if (!s) s = dpar_preduce_start(ctx, y, x, "data", DPAR_SUM, &r);
    return s;
}
static void test_unwaited_request(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    small w;
    memset(&w, 0, sizeof w);
    T_ERR(run_small(m, unwaited_fn, &w), DPAR_ERR_STATE, "dpar_wait");
    memset(&w, 0, sizeof w);
    T_OK(run_small(m, psum_d_fn, &w));
    assert_true(w.out[0][1] == 2.0f);
    dpar_runtime_destroy(rt);
}

/* i32 sums wrap around (two's complement); pmax/pmin see the extremes; pmean of i32 is refused
   (JAX's is a float mean) */
typedef struct iw {
    int32_t out[4][4][4];
} iw;
static dpar_status i32_fn(dpar_ctx *ctx, void *user) {
    iw *w = (iw *)user;
    int d = dpar_ctx_device(ctx);
    int64_t four = 4;
    dpar_buffer *x, *y;
    int32_t v[4] = { d == 0 ? INT32_MAX : 1, d == 0 ? INT32_MIN : -1, d == 0 ? -7 : 0, d == 0 ? 7 : 0 };
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_I32, 1, &four, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_I32, 1, &four, &y);
    if (!s) s = dpar_buffer_write(x, 0, v, sizeof v);
    for (int op = DPAR_SUM; op <= DPAR_MIN && !s; op++) {
        if (op == DPAR_MEAN) continue;
        s = dpar_preduce(ctx, y, x, "data", (dpar_reduce_op)op);
        if (!s) s = dpar_buffer_read(y, 0, w->out[op][d], 16);
    }
    return s;
}
static void test_i32_wrap(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    iw w;
    memset(&w, 0, sizeof w);
    dpar_shard_map_desc sd = { .fn = i32_fn, .user = &w };
    T_OK(dpar_shard_map(m, &sd));
    for (int d = 0; d < 2; d++) {
        assert_int_equal(w.out[DPAR_SUM][d][0], INT32_MIN); /* INT32_MAX + 1 wraps */
        assert_int_equal(w.out[DPAR_SUM][d][1], INT32_MAX); /* INT32_MIN - 1 wraps */
        assert_int_equal(w.out[DPAR_MAX][d][0], INT32_MAX);
        assert_int_equal(w.out[DPAR_MIN][d][1], INT32_MIN);
    }
    dpar_runtime_destroy(rt);
}

/* pmean of i32 (blocking and async) is refused with DPAR_ERR_DTYPE and says how to get the mean */
static dpar_status i32_pmean_fn(dpar_ctx *ctx, void *user) {
    int async = *(int *)user;
    int64_t four = 4;
    dpar_buffer *x;
    dpar_request *r = NULL;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_I32, 1, &four, &x);
    if (!s) s = async ? dpar_pmean_start(ctx, x, x, "data", &r) : dpar_pmean(ctx, x, x, "data");
    if (!s && r) s = dpar_wait(ctx, r);
    return s;
}
static void test_i32_pmean_refused(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    for (int async = 0; async < 2; async++) {
        dpar_shard_map_desc sd = { .fn = i32_pmean_fn, .user = &async };
        T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_DTYPE, "dpar_cast");
    }
    dpar_runtime_destroy(rt);
}

/* Axis tuples rank their group row-major over the axes as written (JAX): on a 2x4 (a, b) mesh,
   axis_index("b,a") of device (a=0, b=1) is 2. all_gather, psum_scatter, all_to_all and
   pbroadcast follow that order; ppermute sorts its group (mesh order), as JAX's does. */
typedef struct order_job {
    const char *axes;
    int idx[MAXD];
    float gather[MAXD][MAXD], scatter[MAXD], a2a[MAXD][MAXD], bcast[MAXD], perm[MAXD];
} order_job;
static dpar_status order_fn(dpar_ctx *ctx, void *user) {
    order_job *j = (order_job *)user;
    int d = dpar_ctx_device(ctx), n = 0, r = 0;
    dpar_buffer *x, *g, *sc, *big, *a2a, *b, *p;
    dpar_status s = dpar_ctx_axis_index(ctx, j->axes, &r);
    if (!s) s = dpar_ctx_axis_size(ctx, j->axes, &n);
    if (s) return s;
    j->idx[d] = r;
    int64_t one = 1, nn = n;
    float v = (float)(10 * d), vn[MAXD];
    for (int k = 0; k < n; k++) vn[k] = (float)(100 * d + k); /* block k goes to rank k */
    int pairs[2 * MAXD];
    for (int k = 0; k < n; k++) {
        pairs[2 * k] = k;
        pairs[2 * k + 1] = (k + 1) % n;
    }
    if ((s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &x)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &nn, &g)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &sc)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &nn, &big)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &nn, &a2a)) || (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &b)) ||
        (s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &one, &p)) || (s = dpar_buffer_write(x, 0, &v, 4)) ||
        (s = dpar_buffer_write(big, 0, vn, (size_t)n * 4)) || (s = dpar_all_gather(ctx, g, x, j->axes, 0, true)) ||
        (s = dpar_psum_scatter(ctx, sc, big, j->axes, 0, true)) ||
        (s = dpar_all_to_all(ctx, a2a, big, j->axes, 0, 0)) || (s = dpar_pbroadcast(ctx, b, x, j->axes, 1)) ||
        (s = dpar_ppermute(ctx, p, x, j->axes, pairs, n)) ||
        (s = dpar_buffer_read(g, 0, j->gather[d], (size_t)n * 4)) || (s = dpar_buffer_read(sc, 0, &j->scatter[d], 4)) ||
        (s = dpar_buffer_read(a2a, 0, j->a2a[d], (size_t)n * 4)) || (s = dpar_buffer_read(b, 0, &j->bcast[d], 4)))
        return s;
    return dpar_buffer_read(p, 0, &j->perm[d], 4);
}
static void check_axis_order(int ndim, const int *shape, const char *const *names, const char *axes) {
    int N = 1;
    for (int a = 0; a < ndim; a++) N *= shape[a];
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, N);
    dpar_mesh *m = t_mesh(rt, ndim, shape, names);
    int written[DPAR_MAX_AXES], nw = 0; /* the axes of `axes`, as written */
    for (const char *c = axes; *c; c++)
        for (int a = 0; a < ndim; a++)
            if (*c == names[a][0]) written[nw++] = a;
    order_job *j = (order_job *)calloc(1, sizeof *j);
    j->axes = axes;
    dpar_shard_map_desc sd = { .fn = order_fn, .user = j };
    T_OK(dpar_shard_map(m, &sd));
    for (int d = 0; d < N; d++) {
        int c[DPAR_MAX_AXES], want = 0, sorted = 0, mem[MAXD], gn, gr;
        T_OK(dpar_mesh_coords(m, d, c));
        for (int i = 0; i < nw; i++) want = want * shape[written[i]] + c[written[i]];
        for (int a = 0; a < ndim; a++)
            for (int i = 0; i < nw; i++)
                if (written[i] == a) sorted = sorted * shape[a] + c[a];
        if (j->idx[d] != want) fail_msg("axis_index(\"%s\") on device %d: %d, want %d", axes, d, j->idx[d], want);
        T_OK(dpar_mesh_group(m, axes, d, mem, &gn, &gr));
        assert_int_equal(gr, want);
        assert_int_equal(mem[gr], d);
        for (int k = 0; k < gn; k++) { /* member k of the group is the device of rank k */
            assert_int_equal(j->idx[mem[k]], k);
            assert_true(j->gather[d][k] == (float)(10 * mem[k]));
            assert_true(j->a2a[d][k] == (float)(100 * mem[k] + want));
        }
        float sum = 0;
        for (int k = 0; k < gn; k++) sum += (float)(100 * mem[k] + want);
        assert_true(j->scatter[d] == sum);
        assert_true(j->bcast[d] == (float)(10 * mem[1]));
        /* ppermute k -> k+1 over mesh-order ranks: device of sorted rank s receives from rank s-1 */
        int from = -1;
        for (int k = 0; k < gn; k++) {
            int ck[DPAR_MAX_AXES], sk = 0;
            T_OK(dpar_mesh_coords(m, mem[k], ck));
            for (int a = 0; a < ndim; a++)
                for (int i = 0; i < nw; i++)
                    if (written[i] == a) sk = sk * shape[a] + ck[a];
            if (sk == (sorted + gn - 1) % gn) from = mem[k];
        }
        if (j->perm[d] != (float)(10 * from))
            fail_msg("ppermute over \"%s\" on device %d got %g, want %d (mesh order)", axes, d, (double)j->perm[d],
                     10 * from);
    }
    free(j);
    dpar_runtime_destroy(rt);
}
static void test_axis_tuple_order(void **st) {
    (void)st;
    const int s24[2] = { 2, 4 }, s222[3] = { 2, 2, 2 };
    const char *ab[2] = { "a", "b" }, *abc[3] = { "a", "b", "c" };
    check_axis_order(2, s24, ab, "b,a");
    check_axis_order(2, s24, ab, "a,b");
    const char *orders[] = { "c,a", "b,a", "c,b,a", "b,c,a", "a,c,b", "c,a,b", "a,b,c" };
    for (int i = 0; i < 7; i++) check_axis_order(3, s222, abc, orders[i]);
    /* the case from JAX's documentation: device (a=0, b=1) is 2 over ("b", "a") */
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    dpar_mesh *m = t_mesh(rt, 2, s24, ab);
    int coords[2] = { 0, 1 }, dev, mem[8], n, idx;
    T_OK(dpar_mesh_device(m, coords, &dev));
    T_OK(dpar_mesh_group(m, "b,a", dev, mem, &n, &idx));
    assert_int_equal(idx, 2);
    dpar_runtime_destroy(rt);
}

/* on a 1-device group out can have the gathered shape: in place is still refused */
static dpar_status inplace_gather_fn(dpar_ctx *ctx, void *user) {
    small *w = (small *)user;
    int64_t s2[2] = { 2, 3 };
    dpar_buffer *x;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 2, s2, &x);
    if (!s)
        s = w->variant ? dpar_psum_scatter(ctx, x, x, "data", 0, true) : dpar_all_gather(ctx, x, x, "data", 0, true);
    return rec(w, dpar_ctx_device(ctx), s);
}
static void test_not_in_place(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    for (int v = 0; v < 2; v++) {
        small w;
        memset(&w, 0, sizeof w);
        w.variant = v;
        T_ERR(run_small(m, inplace_gather_fn, &w), DPAR_ERR_INVALID_ARGUMENT, "in place");
    }
    dpar_runtime_destroy(rt);
}

/* Large f32 all-reduce (takes the vectorized, streaming-store path of the CPU
   backend): still bitwise the sequential mesh-order sum, odd length, in and out
   of place, and pmean = that sum / n. */
enum { BIGN = 1000003 };
typedef struct big {
    float *res[8][3];
} big;
static float big_val(int dev, int64_t i) {
    return (float)((i * 31 + dev * 977) % 2003) * 0.001f - 1.0f + (float)dev * 1e-4f;
}
static dpar_status big_fn(dpar_ctx *ctx, void *user) {
    big *w = (big *)user;
    int d = dpar_ctx_device(ctx);
    int64_t n = BIGN;
    dpar_buffer *x, *y, *z;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &n, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &n, &y);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &n, &z);
    if (s) return s;
    float *h = (float *)malloc((size_t)BIGN * 4);
    for (int64_t i = 0; i < BIGN; i++) h[i] = big_val(d, i);
    s = dpar_buffer_write(x, 0, h, (size_t)BIGN * 4);
    if (!s) s = dpar_buffer_write(z, 0, h, (size_t)BIGN * 4);
    free(h);
    if (!s) s = dpar_psum(ctx, y, x, "data");
    if (!s) s = dpar_pmean(ctx, x, x, "data");
    if (!s) s = dpar_psum(ctx, z, z, "data");
    dpar_buffer *outs[3] = { y, x, z };
    for (int k = 0; k < 3 && !s; k++) {
        w->res[d][k] = (float *)malloc((size_t)BIGN * 4);
        s = dpar_buffer_read(outs[k], 0, w->res[d][k], (size_t)BIGN * 4);
    }
    dpar_buffer_destroy(x);
    dpar_buffer_destroy(y);
    dpar_buffer_destroy(z);
    return s;
}
static void test_large_psum_bitwise(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    dpar_mesh *m = t_mesh1(rt, 8, "data");
    big *w = (big *)calloc(1, sizeof *w);
    dpar_shard_map_desc sd = { .fn = big_fn, .user = w };
    T_OK(dpar_shard_map(m, &sd));
    for (int64_t i = 0; i < BIGN; i++) {
        volatile float acc = big_val(0, i);
        for (int k = 1; k < 8; k++) acc = acc + big_val(k, i);
        float sum = acc, mean = sum / 8.0f;
        for (int d = 0; d < 8; d++) {
            if (memcmp(&w->res[d][0][i], &sum, 4) || memcmp(&w->res[d][2][i], &sum, 4) ||
                memcmp(&w->res[d][1][i], &mean, 4))
                fail_msg("element %lld on device %d: psum %.9g / in place %.9g / pmean %.9g, sequential sum %.9g (mean "
                         "%.9g)",
                         (long long)i, d, w->res[d][0][i], w->res[d][2][i], w->res[d][1][i], sum, mean);
        }
    }
    for (int d = 0; d < 8; d++)
        for (int k = 0; k < 3; k++) free(w->res[d][k]);
    free(w);
    dpar_runtime_destroy(rt);
}

/* Repeated calls into the same outputs with new inputs each call: the host
   path claims a slice's chunks first to last on even calls of a group and last
   to first on odd ones (dpar__host_work; working sets up to 8x the caches: with
   4 MB of them all below but the 8-device all_gather), so every call must write every
   element of every slice, the partial last chunk included, or an output keeps
   the previous call's value. REP elements a member (64 KB chunks: slices of 2-9
   chunks, the last partial, on 1, 2, 3, 4 and 8 devices); five collectives an
   iteration, so each meets both orders. Bits: the sequential sum in mesh order. */
enum { REP = 24 * 5465, REP_ITERS = 2, REP_OPS = 5 };
typedef struct rep_job {
    int n;
    int64_t bad[MAXD];
    char msg[MAXD][160];
} rep_job;
static float rep_val(int dev, int it, int64_t i) {
    return (float)((i * 31 + dev * 977 + it * 131) % 2003) * 0.001f - 1.0f + (float)dev * 1e-4f;
}
static float rep_sum(int n, int it, int64_t i, int mean) {
    volatile float acc = rep_val(0, it, i);
    for (int k = 1; k < n; k++) acc = acc + rep_val(k, it, i);
    return mean ? acc / (float)n : acc;
}
static void rep_check(rep_job *w, int d, const char *op, int it, int64_t i, float got, float want) {
    if (memcmp(&got, &want, 4) && !w->bad[d]++) /* counts them all, names the first */
        snprintf(w->msg[d], sizeof w->msg[d], "%s, iteration %d, element %lld on device %d: %.9g, want %.9g", op, it,
                 (long long)i, d, (double)got, (double)want);
}
static dpar_status rep_fn(dpar_ctx *ctx, void *user) {
    rep_job *w = (rep_job *)user;
    int d = dpar_ctx_device(ctx), n = w->n;
    int64_t len = REP, glen = (int64_t)REP * n, slen = REP / n;
    dpar_buffer *x, *o[REP_OPS];
    int64_t lens[REP_OPS] = { len, len, glen, slen, len };
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &len, &x);
    for (int k = 0; k < REP_OPS && !s; k++) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &lens[k], &o[k]);
    float *h = (float *)malloc((size_t)glen * 4);
    for (int it = 0; it < REP_ITERS && !s; it++) {
        for (int64_t i = 0; i < REP; i++) h[i] = rep_val(d, it, i);
        if (!s) s = dpar_buffer_write(x, 0, h, (size_t)REP * 4);
        if (!s) s = dpar_psum(ctx, o[0], x, "data");
        if (!s) s = dpar_pmean(ctx, o[1], x, "data");
        if (!s) s = dpar_all_gather(ctx, o[2], x, "data", 0, true);
        if (!s) s = dpar_psum_scatter(ctx, o[3], x, "data", 0, true);
        if (!s) s = dpar_pbroadcast(ctx, o[4], x, "data", 0);
        static const char *names[REP_OPS] = { "psum", "pmean", "all_gather", "psum_scatter", "pbroadcast" };
        for (int k = 0; k < REP_OPS && !s; k++) {
            if ((s = dpar_buffer_read(o[k], 0, h, (size_t)lens[k] * 4))) break;
            for (int64_t i = 0; i < lens[k]; i++) {
                float want = k < 2    ? rep_sum(n, it, i, k)
                             : k == 2 ? rep_val((int)(i / REP), it, i % REP)
                             : k == 3 ? rep_sum(n, it, (int64_t)d * slen + i, 0)
                                      : rep_val(0, it, i);
                rep_check(w, d, names[k], it, i, h[i], want);
            }
        }
    }
    free(h);
    return s;
}
static void test_repeated_calls_chunk_order(void **st) {
    (void)st;
    static const int ns[] = { 1, 2, 3, 4, 8 };
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        int n = ns[t];
        dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, n);
        dpar_mesh *m = t_mesh1(rt, n, "data");
        rep_job w;
        memset(&w, 0, sizeof w);
        w.n = n;
        dpar_shard_map_desc sd = { .fn = rep_fn, .user = &w };
        T_OK(dpar_shard_map(m, &sd));
        for (int d = 0; d < n; d++)
            if (w.bad[d]) fail_msg("%d devices: %lld wrong elements; first: %s", n, (long long)w.bad[d], w.msg[d]);
        dpar_runtime_destroy(rt);
    }
}

/* async collectives over different axes in flight at once (2x4 mesh), a
   blocking one over both axes behind them, waited out of order */
typedef struct ax {
    float d[8][3][4];
    dpar_status st[8], mis[8];
    char err[8][512];
    int variant;
} ax;
static dpar_status axes_fn(dpar_ctx *ctx, void *user) {
    ax *w = (ax *)user;
    int dev = dpar_ctx_device(ctx);
    int64_t four = 4;
    dpar_buffer *a, *b, *c, *oa, *ob;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &a);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &b);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &c);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &oa);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &ob);
    if (!s) s = dpar_fill(a, (float)dev);
    if (!s) s = dpar_fill(b, (float)(dev * 10));
    if (!s) s = dpar_fill(c, 1.0f);
    if (s) return s;
    dpar_request *r1, *r2;
    if ((s = dpar_preduce_start(ctx, oa, a, "data", DPAR_SUM, &r1))) return s;
    if ((s = dpar_preduce_start(ctx, ob, b, "model", DPAR_MAX, &r2))) return s;
    s = dpar_psum(ctx, c, c, "data,model");
    dpar_status s2 = dpar_wait(ctx, r2), s1 = dpar_wait(ctx, r1);
    if (s || (s = s2) || (s = s1)) return s;
    if ((s = dpar_buffer_read(oa, 0, w->d[dev][0], 16)) || (s = dpar_buffer_read(ob, 0, w->d[dev][1], 16)) ||
        (s = dpar_buffer_read(c, 0, w->d[dev][2], 16)))
        return s;
    return DPAR_OK;
}
static void test_async_over_axes(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 8);
    int shape[2] = { 2, 4 };
    const char *names[2] = { "data", "model" };
    dpar_mesh *m = t_mesh(rt, 2, shape, names);
    ax *w = (ax *)calloc(1, sizeof *w);
    dpar_shard_map_desc sd = { .fn = axes_fn, .user = w };
    for (int rep = 0; rep < 3; rep++) {
        T_OK(dpar_shard_map(m, &sd));
        for (int dev = 0; dev < 8; dev++) {
            int col = dev % 4, row = dev / 4;
            for (int i = 0; i < 4; i++) {
                assert_true(w->d[dev][0][i] == (float)(col + col + 4));      /* psum over data: col + (col + 4) */
                assert_true(w->d[dev][1][i] == (float)((row * 4 + 3) * 10)); /* pmax over model */
                assert_true(w->d[dev][2][i] == 8.0f);
            }
        }
    }
    free(w);
    dpar_runtime_destroy(rt);
}

/* an async collective whose members disagree: dpar_wait returns the mismatch on every member */
static dpar_status async_mis_fn(dpar_ctx *ctx, void *user) {
    ax *w = (ax *)user;
    int dev = dpar_ctx_device(ctx);
    int64_t cnt = dev == 0 ? 2560 : 5120;
    dpar_buffer *x, *y;
    dpar_request *r;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &cnt, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &cnt, &y);
    if (!s) s = dpar_preduce_start(ctx, y, x, "data", DPAR_SUM, &r);
    if (!s) s = dpar_wait(ctx, r);
    w->st[dev] = s;
    snprintf(w->err[dev], sizeof w->err[dev], "%s", dpar_last_error());
    return s;
}
static void test_async_mismatch(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    ax *w = (ax *)calloc(1, sizeof *w);
    dpar_shard_map_desc sd = { .fn = async_mis_fn, .user = w };
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_COLLECTIVE_MISMATCH, "2560", "5120");
    for (int d = 0; d < 4; d++) {
        assert_int_equal(w->st[d], DPAR_ERR_COLLECTIVE_MISMATCH);
        assert_non_null(strstr(w->err[d], "2560"));
        assert_non_null(strstr(w->err[d], "5120"));
    }
    free(w);
    dpar_runtime_destroy(rt);
}

/* one device fails while the others wait in an async collective: they are
   stopped (ABORTED from dpar_wait), the first error is returned, no hang */
static dpar_status async_abort_fn(dpar_ctx *ctx, void *user) {
    ax *w = (ax *)user;
    int dev = dpar_ctx_device(ctx);
    int64_t four = 4;
    dpar_buffer *x, *y;
    dpar_request *r;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &x);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &four, &y);
    if (s) return s;
    if (dev == 2) {
        struct timespec ts = { 0, 50 * 1000000L };
        nanosleep(&ts, NULL);
        return dpar_scale(NULL, 1.0f); /* an op error */
    }
    s = dpar_preduce_start(ctx, y, x, "data", DPAR_SUM, &r);
    if (!s) s = dpar_wait(ctx, r);
    w->st[dev] = s;
    return s;
}
static void test_async_abort(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    ax *w = (ax *)calloc(1, sizeof *w);
    dpar_shard_map_desc sd = { .fn = async_abort_fn, .user = w };
    double t0 = now_s();
    T_ERR(dpar_shard_map(m, &sd), DPAR_ERR_INVALID_ARGUMENT, "device 2: ", "scale");
    assert_true(now_s() - t0 < 10.0);
    for (int d = 0; d < 4; d++)
        if (d != 2) assert_int_equal(w->st[d], DPAR_ERR_ABORTED);
    free(w);
    dpar_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep_1),
        cmocka_unit_test(test_sweep_2),
        cmocka_unit_test(test_sweep_4),
        cmocka_unit_test(test_sweep_8),
        cmocka_unit_test(test_sweep_2x4),
        cmocka_unit_test(test_sweep_2x2x2),
        cmocka_unit_test(test_sweep_4d),
        cmocka_unit_test(test_sweep_explicit_order),
        cmocka_unit_test(test_psum_d_2d_3d),
        cmocka_unit_test(test_pmax_pmin_nan),
        cmocka_unit_test(test_psum_scatter_not_divisible),
        cmocka_unit_test(test_unknown_axis),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_timeout_names_missing_device),
        cmocka_unit_test(test_f16_accumulates_in_f32),
        cmocka_unit_test(test_zero_size),
        cmocka_unit_test(test_deterministic_mesh_order),
        cmocka_unit_test(test_local_errors),
        cmocka_unit_test(test_unwaited_request),
        cmocka_unit_test(test_i32_wrap),
        cmocka_unit_test(test_i32_pmean_refused),
        cmocka_unit_test(test_axis_tuple_order),
        cmocka_unit_test(test_not_in_place),
        cmocka_unit_test(test_large_psum_bitwise),
        cmocka_unit_test(test_repeated_calls_chunk_order),
        cmocka_unit_test(test_async_over_axes),
        cmocka_unit_test(test_async_mismatch),
        cmocka_unit_test(test_async_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
