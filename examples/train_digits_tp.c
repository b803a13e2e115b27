/* train_digits_tp.c — the digits MLP with data and tensor parallelism at once
   on a 2-d mesh (data, model), Megatron style (Shoeybi et al. 2019, sec. 3):

     layer 1, column-parallel: W1 [64,H] split by columns over "model"
       (spec (None, "model")), b1 [H] split over "model": every device of a
       model group computes its H/M hidden units from the whole input
       x [b,64]; no communication.
     layer 2, row-parallel: W2 [H,10] split by rows over "model" (spec
       ("model", None)): each device multiplies its hidden units by its rows
       and gets a partial sum of the logits; ONE all-reduce (psum over
       "model") completes them in forward. b2 [10] is replicated.
     backward: dlogits is replicated over "model", so the weight gradients of
       both layers are local; ONE all-reduce (psum over "model") completes
       the gradient with respect to the layer's input x, dx = dh @ W1^T —
       what a layer before this block would consume (Megatron's "f" operator).
   The batch is split over "data"; gradients are pmean'd over "data", and the
   gradient of the replicated b2 also over "model" — every axis it is
   replicated on — so its replicas stay bitwise identical (checked at the end);
   over "data" then "model" rather than over "data,model" at once, because
   the mean of two equal values is exact while (a + a + b + b) / 4 may round
   differently from (a + b) / 2, the 1-device arithmetic.

   build/train_digits_tp [--backend B] [--dp N] [--tp M] [--devices N*M] [--epochs N] [--batch N]
                         [--lr X] [--momentum X] [--seed N] [--hidden N] [--data PATH]
   defaults: a 2x2 mesh (--dp 2 --tp 2), 4 devices. */
#include "digits_common.h"

enum { W1, B1, W2, B2, NPARAM };
typedef struct {
    dpar_array *param[NPARAM], *grad[NPARAM], *mom[NPARAM];
    dpar_array *x, *y, *h_pre, *h, *logits, *dlogits, *dh, *dx, *loss;
    dpar_sgd_desc sgd;
} model;

/* forward of the two tensor-parallel layers on this device's shards */
static dpar_status tp_forward(dpar_ctx *ctx, dpar_buffer *const *p, dpar_buffer *x, dpar_buffer *h_pre, dpar_buffer *h,
                              dpar_buffer *logits) {
    dpar_status s;
    if ((s = dpar_matmul(h_pre, x, p[W1], false, false, 1.0f, 0.0f))) return s; /* [b,64] @ [64,H/M] */
    if ((s = dpar_bias_add(h_pre, p[B1]))) return s;
    if ((s = dpar_relu(h, h_pre))) return s;
    if ((s = dpar_matmul(logits, h, p[W2], false, false, 1.0f, 0.0f))) return s; /* [b,H/M] @ [H/M,10]: partial */
    if ((s = dpar_psum(ctx, logits, logits, "model"))) return s;                 /* the forward all-reduce */
    return dpar_bias_add(logits, p[B2]);
}

static dpar_status train_step(dpar_ctx *ctx, void *user) {
    model *m = user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *p[NPARAM], *g[NPARAM], *v[NPARAM];
    for (int i = 0; i < NPARAM; i++) {
        p[i] = dpar_array_shard(m->param[i], dev);
        g[i] = dpar_array_shard(m->grad[i], dev);
        v[i] = dpar_array_shard(m->mom[i], dev);
    }
    dpar_buffer *x = dpar_array_shard(m->x, dev), *y = dpar_array_shard(m->y, dev);
    dpar_buffer *h_pre = dpar_array_shard(m->h_pre, dev), *h = dpar_array_shard(m->h, dev);
    dpar_buffer *logits = dpar_array_shard(m->logits, dev), *dlogits = dpar_array_shard(m->dlogits, dev);
    dpar_buffer *dh = dpar_array_shard(m->dh, dev), *dx = dpar_array_shard(m->dx, dev),
                *loss = dpar_array_shard(m->loss, dev);
    dpar_status s;
#define CHECK(call)                            \
    do {                                       \
        if ((s = (call)) != DPAR_OK) return s; \
    } while (0)
    CHECK(tp_forward(ctx, p, x, h_pre, h, logits));
    CHECK(dpar_softmax_xent(loss, dlogits, logits, y));             /* replicated over "model" */
    CHECK(dpar_matmul(g[W2], h, dlogits, true, false, 1.0f, 0.0f)); /* local rows of dW2 */
    CHECK(dpar_bias_grad(g[B2], dlogits, 0.0f));
    CHECK(dpar_matmul(dh, dlogits, p[W2], false, true, 1.0f, 0.0f)); /* [b,10] @ [10,H/M]: local */
    CHECK(dpar_relu_backward(dh, dh, h_pre));
    CHECK(dpar_matmul(g[W1], x, dh, true, false, 1.0f, 0.0f)); /* local columns of dW1 */
    CHECK(dpar_bias_grad(g[B1], dh, 0.0f));
    CHECK(dpar_matmul(dx, dh, p[W1], false, true, 1.0f, 0.0f)); /* partial dx */
    CHECK(dpar_psum(ctx, dx, dx, "model"));                     /* the backward all-reduce */
    /* data-parallel reduction: sharded params over "data"; the replicated b2 over every axis */
    CHECK(dpar_pmean(ctx, g[W1], g[W1], "data"));
    CHECK(dpar_pmean(ctx, g[B1], g[B1], "data"));
    CHECK(dpar_pmean(ctx, g[W2], g[W2], "data"));
    CHECK(dpar_pmean(ctx, g[B2], g[B2], "data"));
    CHECK(dpar_pmean(ctx, g[B2], g[B2], "model")); /* equal values: (x + x) / 2 = x exactly */
    CHECK(dpar_pmean(ctx, loss, loss, "data"));
    CHECK(dpar_sgd_step(ctx, &m->sgd, p, g, v, NPARAM));
#undef CHECK
    return DPAR_OK;
}

static dpar_status eval_step(dpar_ctx *ctx, void *user) {
    model *m = user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *p[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_array_shard(m->param[i], dev);
    dpar_buffer *h = dpar_ctx_arg(ctx, 1);
    return tp_forward(ctx, p, dpar_ctx_arg(ctx, 0), h, h, dpar_ctx_arg(ctx, 2));
}

/* Are the replicas of every shard of `a` bitwise identical across the mesh? */
static int replicas_identical(dpar_mesh *mesh, dpar_array *a) {
    int n = dpar_mesh_size(mesh), ok = 1;
    size_t nb = dpar_buffer_nbytes(dpar_array_shard(a, 0));
    char *x = malloc(nb ? nb : 1), *y = malloc(nb ? nb : 1);
    for (int i = 0; i < n && ok; i++)
        for (int j = i + 1; j < n && ok; j++) {
            /* the same block when the two devices share the coordinates of every axis in the spec */
            int ci[DPAR_MAX_AXES], cj[DPAR_MAX_AXES], same = 1;
            dpar_mesh_coords(mesh, i, ci);
            dpar_mesh_coords(mesh, j, cj);
            for (int d = 0; d < dpar_array_ndim(a); d++) {
                char spec[64];
                dpar_array_spec(a, d, spec, sizeof spec);
                for (int ax = 0; ax < dpar_mesh_ndim(mesh); ax++)
                    if (strstr(spec, dpar_mesh_axis_name(mesh, ax)) && ci[ax] != cj[ax]) same = 0;
            }
            if (!same) continue;
            dpar_buffer_read(dpar_array_shard(a, i), 0, x, nb);
            dpar_buffer_read(dpar_array_shard(a, j), 0, y, nb);
            if (memcmp(x, y, nb)) ok = 0;
        }
    free(x);
    free(y);
    return ok;
}

int main(int argc, char **argv) {
    int dp = 2, tp = 2;
    digits_opts o = { "cpu",       "examples/data/digits.csv.gz", 4, 30, 64, 42, 128, 0.1f, 0.9f, { "--dp", "--tp" },
                      { &dp, &tp } };
    int rc = digits_parse("train_digits_tp", argc, argv, &o);
    if (rc) return rc;
    if (dp < 1 || tp < 1) {
        fprintf(stderr, "train_digits_tp: --dp and --tp must be >= 1\n");
        return 2;
    }
    if (o.devices != dp * tp) {
        if (o.devices != 4) {
            fprintf(stderr, "train_digits_tp: --devices %d but the mesh --dp %d x --tp %d has %d devices\n", o.devices,
                    dp, tp, dp * tp);
            return 2;
        }
        o.devices = dp * tp; /* the default follows --dp x --tp */
    }
    if (o.batch % dp) {
        fprintf(stderr, "train_digits_tp: --batch %d is not divisible by --dp %d\n", o.batch, dp);
        return 2;
    }
    if (o.hidden % tp) {
        fprintf(stderr, "train_digits_tp: --hidden %d is not divisible by --tp %d\n", o.hidden, tp);
        return 2;
    }
    digits_setup ds;
    if (digits_prepare("train_digits_tp", &o, &ds)) return 1;
    int devices = dp * tp, batch = o.batch, hidden = o.hidden;

    dpar_runtime_desc rd = { .num_devices = devices };
    if (digits_backend(o.backend, &rd.backend)) {
        fprintf(stderr, "train_digits_tp: unknown backend '%s'\n", o.backend);
        return 2;
    }
    dpar_runtime *rt;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    dpar_mesh *mesh;
    dpar_mesh_desc md = { .ndim = 2, .shape = { dp, tp }, .axis_names = { "data", "model" } };
    if (dpar_mesh_create(rt, &md, &mesh)) return digits_fail("mesh");
    printf("backend %s, %d devices: mesh %dx%d (data, model), Megatron column- then row-parallel MLP\n", o.backend,
           devices, dp, tp);
    printf("data: %d train, %d test images; MLP 64-%d-10 (%d hidden units per device), batch %d (%d per data shard), "
           "lr %g, momentum %g\n",
           ds.ntrain, ds.ntest, hidden, hidden / tp, batch, batch / dp, (double)o.lr, (double)o.momentum);

    model m;
    memset(&m, 0, sizeof m);
    /* shapes and specs: W1 (None, model), b1 (model), W2 (model, None), b2 replicated */
    int64_t pshape[NPARAM][2] = { { NPIX, hidden }, { hidden, 0 }, { hidden, NCLASS }, { NCLASS, 0 } };
    const char *pspec[NPARAM][2] = { { NULL, "model" }, { "model", NULL }, { "model", NULL }, { NULL, NULL } };
    for (int i = 0; i < NPARAM; i++) {
        int nd = pshape[i][1] ? 2 : 1;
        if (digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], pspec[i][0], pspec[i][1], &m.param[i]) ||
            digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], pspec[i][0], pspec[i][1], &m.grad[i]) ||
            digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], pspec[i][0], pspec[i][1], &m.mom[i]))
            return digits_fail("parameters");
    }
    if (dpar_array_put(m.param[W1], ds.w1) || dpar_array_put(m.param[W2], ds.w2)) return digits_fail("init");
    if (digits_array(mesh, DPAR_F32, 2, batch, NPIX, "data", NULL, &m.x) ||
        digits_array(mesh, DPAR_I32, 1, batch, 0, "data", NULL, &m.y) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", "model", &m.h_pre) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", "model", &m.h) ||
        digits_array(mesh, DPAR_F32, 2, batch, NCLASS, "data", NULL, &m.logits) ||
        digits_array(mesh, DPAR_F32, 2, batch, NCLASS, "data", NULL, &m.dlogits) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", "model", &m.dh) ||
        digits_array(mesh, DPAR_F32, 2, batch, NPIX, "data", NULL, &m.dx) ||
        digits_array(mesh, DPAR_F32, 1, dp, 0, "data", NULL, &m.loss))
        return digits_fail("activations");
    m.sgd.learning_rate = o.lr;
    m.sgd.momentum = o.momentum;

    int tpad = (ds.ntest + dp - 1) / dp * dp;
    float *xt = calloc((size_t)tpad * NPIX, sizeof(float)), *lt = malloc((size_t)tpad * NCLASS * sizeof(float));
    for (int i = 0; i < ds.ntest; i++)
        memcpy(xt + (size_t)i * NPIX, ds.all.x + (size_t)ds.test_idx[i] * NPIX, NPIX * sizeof(float));
    dpar_array *tx, *th, *tl;
    if (digits_array(mesh, DPAR_F32, 2, tpad, NPIX, "data", NULL, &tx) ||
        digits_array(mesh, DPAR_F32, 2, tpad, hidden, "data", "model", &th) ||
        digits_array(mesh, DPAR_F32, 2, tpad, NCLASS, "data", NULL, &tl) || dpar_array_put(tx, xt))
        return digits_fail("test set");

    float *xb = malloc((size_t)batch * NPIX * sizeof(float)), *losses = malloc((size_t)dp * sizeof(float));
    int32_t *yb = malloc((size_t)batch * sizeof(int32_t));
    int steps = ds.ntrain / batch;
    dpar_shard_map_desc train = { .fn = train_step, .user = &m };
    dpar_shard_map_desc eval = { .fn = eval_step, .user = &m, .num_args = 3, .args = { tx, th, tl } };
    double epoch_loss = 0.0, acc = 0.0;
    for (int e = 1; e <= o.epochs; e++) {
        shuffle(ds.train_idx, ds.ntrain);
        double t0 = now_s(), sum = 0.0;
        for (int s = 0; s < steps; s++) {
            digits_batch(&ds, s, batch, xb, yb);
            if (dpar_array_put(m.x, xb) || dpar_array_put(m.y, yb)) return digits_fail("batch upload");
            if (dpar_shard_map(mesh, &train)) return digits_fail("train step");
            if (dpar_array_get(m.loss, losses)) return digits_fail("loss");
            sum += losses[0];
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (dpar_shard_map(mesh, &eval) || dpar_array_get(tl, lt)) return digits_fail("eval");
        acc = digits_accuracy(&ds, lt);
        printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f\n", e, epoch_loss, acc, steps * batch / dt);
        fflush(stdout);
    }
    int same = 1;
    for (int i = 0; i < NPARAM; i++) same &= replicas_identical(mesh, m.param[i]);
    printf("replicated parameters bitwise identical on every device: %s\n", same ? "yes" : "NO");
    printf("final: backend=%s devices=%d epochs=%d test_accuracy=%.4f train_loss=%.8f\n", o.backend, devices, o.epochs,
           acc, epoch_loss);
    dpar_runtime_destroy(rt);
    free(xb);
    free(yb);
    free(losses);
    free(xt);
    free(lt);
    digits_free(&ds);
    return same ? 0 : 1;
}
