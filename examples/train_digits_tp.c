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
       both layers are local. A layer before this block would get the
       gradient of its input x, dx = dh @ W1^T, through ONE all-reduce (psum
       over "model", Megatron's "f"); the graph adds it only when that
       gradient is asked for (here nothing consumes it).
   The batch is split over "data". The step is a graph (dpar_graph): only the
   forward pass above is written; the backward pass follows from JAX's
   shard_map transpose rules (psum's cotangent passes through unchanged), and
   every gradient is reduced over the axes its parameter is replicated on:
   "data" for all four (dlogits is already replicated over "model", so b2
   needs no reduction over it), so the replicas stay bitwise identical
   (checked at the end). The loss, a mean over this device's rows, is averaged
   over "data" by the graph.

   build/train_digits_tp [--backend B] [--dp N] [--tp M] [--devices N*M] [--epochs N] [--batch N]
                         [--lr X] [--momentum X] [--seed N] [--hidden N] [--data PATH]
   defaults: a 2x2 mesh (--dp 2 --tp 2), 4 devices. */
#include "digits_common.h"

enum { W1, B1, W2, B2, NPARAM };

/* forward of the two tensor-parallel layers on this device's shards (the eager test-set pass) */
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

/* The same forward pass as a graph, plus its gradients and the SGD step: x [batch, 64] f32 and y [batch] i32 split
   over "data"; the parameters' specs are their arrays'. */
static dpar_status build_step(dpar_mesh *mesh, dpar_array *const param[NPARAM], int batch, const dpar_sgd_desc *sgd,
                              dpar_graph **out, dpar_value *x, dpar_value *y) {
    dpar_graph *g;
    dpar_status s = dpar_graph_create(mesh, &g);
    if (s) return s;
    *out = g;
    *x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 2, { batch, NPIX }, { "data" } });
    *y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { batch }, { "data" } });
    const char *names[NPARAM] = { "W1", "b1", "W2", "b2" };
    dpar_value p[NPARAM], grad[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_g_param(g, names[i], param[i]);
    dpar_value h = dpar_g_relu(g, dpar_g_bias_add(g, dpar_g_matmul(g, *x, p[W1], false, false), p[B1])); /* [b,H/M] */
    dpar_value partial = dpar_g_matmul(g, h, p[W2], false, false);                   /* [b,10], a partial sum */
    dpar_value logits = dpar_g_bias_add(g, dpar_g_psum(g, partial, "model"), p[B2]); /* the forward all-reduce */
    dpar_value loss = dpar_g_softmax_xent(g, logits, *y);
    if ((s = dpar_graph_value_and_grad(g, loss, p, NPARAM, grad))) return s;
    if ((s = dpar_graph_sgd(g, sgd, p, grad, NPARAM))) return s;
    return dpar_graph_compile(g, NULL);
}

static dpar_status eval_step(dpar_ctx *ctx, void *user) {
    dpar_array *const *param = (dpar_array *const *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *p[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_array_shard(param[i], dev);
    dpar_buffer *h = dpar_ctx_arg(ctx, 1);
    return tp_forward(ctx, p, dpar_ctx_arg(ctx, 0), h, h, dpar_ctx_arg(ctx, 2));
}

int main(int argc, char **argv) {
    int dp = 2, tp = 2;
    digits_opts o = { "cpu", "examples/data/digits.csv.gz",
                      4,     30,
                      64,    42,
                      128,   0.1f,
                      0.9f,  { EX_I("--dp", &dp, 1, INT_MAX), EX_I("--tp", &tp, 1, INT_MAX) } };
    int rc = digits_parse("train_digits_tp", argc, argv, &o);
    if (rc) return ex_exit_status(rc);
    long long ndev = (long long)dp * tp; /* in 64 bits: --dp and --tp may each be near INT_MAX */
    if (o.devices != ndev) {
        if (o.devices != 4 || ndev > INT_MAX) {
            fprintf(stderr, "train_digits_tp: --devices %d but the mesh --dp %d x --tp %d has %lld devices\n",
                    o.devices, dp, tp, ndev);
            return 2;
        }
        o.devices = (int)ndev; /* the default follows --dp x --tp */
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
    if ((rc = digits_prepare("train_digits_tp", &o, &ds))) return rc;
    int devices = dp * tp, batch = o.batch, hidden = o.hidden;

    dpar_runtime_desc rd = { .num_devices = devices };
    if (digits_backend(o.backend, &rd.backend)) {
        fprintf(stderr, "train_digits_tp: unknown backend '%s'\n", o.backend);
        return 2;
    }
    dpar_runtime *rt;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    o.backend = dpar_backend_name(dpar_runtime_backend(rt)); /* what ran: --backend default or '' picks one */
    dpar_mesh *mesh;
    dpar_mesh_desc md = { .ndim = 2, .shape = { dp, tp }, .axis_names = { "data", "model" } };
    if (dpar_mesh_create(rt, &md, &mesh)) return digits_fail("mesh");
    printf("backend %s, %d devices: mesh %dx%d (data, model), Megatron column- then row-parallel MLP\n", o.backend,
           devices, dp, tp);
    printf("data: %d train, %d test images; MLP 64-%d-10 (%d hidden units per device), batch %d (%d per data shard), "
           "lr %g, momentum %g\n",
           ds.ntrain, ds.ntest, hidden, hidden / tp, batch, batch / dp, (double)o.lr, (double)o.momentum);

    /* shapes and specs: W1 (None, model), b1 (model), W2 (model, None), b2 replicated */
    dpar_array *param[NPARAM];
    int64_t pshape[NPARAM][2] = { { NPIX, hidden }, { hidden, 0 }, { hidden, NCLASS }, { NCLASS, 0 } };
    const char *pspec[NPARAM][2] = { { NULL, "model" }, { "model", NULL }, { "model", NULL }, { NULL, NULL } };
    for (int i = 0; i < NPARAM; i++)
        if (digits_array(mesh, DPAR_F32, pshape[i][1] ? 2 : 1, pshape[i][0], pshape[i][1], pspec[i][0], pspec[i][1],
                         &param[i]))
            return digits_fail("parameters");
    if (dpar_array_put(param[W1], ds.w1) || dpar_array_put(param[W2], ds.w2)) return digits_fail("init");
    dpar_graph *step = NULL;
    dpar_value fx, fy;
    if (build_step(mesh, param, batch, &(dpar_sgd_desc){ .learning_rate = o.lr, .momentum = o.momentum }, &step, &fx,
                   &fy))
        return digits_fail("step graph");

    int tpad = (ds.ntest + dp - 1) / dp * dp;
    float *xt = calloc((size_t)tpad * NPIX, sizeof(float)), *lt = malloc((size_t)tpad * NCLASS * sizeof(float));
    for (int i = 0; i < ds.ntest; i++)
        memcpy(xt + (size_t)i * NPIX, ds.all.x + (size_t)ds.test_idx[i] * NPIX, NPIX * sizeof(float));
    dpar_array *tx, *th, *tl;
    if (digits_array(mesh, DPAR_F32, 2, tpad, NPIX, "data", NULL, &tx) ||
        digits_array(mesh, DPAR_F32, 2, tpad, hidden, "data", "model", &th) ||
        digits_array(mesh, DPAR_F32, 2, tpad, NCLASS, "data", NULL, &tl) || dpar_array_put(tx, xt))
        return digits_fail("test set");

    float *xb = malloc((size_t)batch * NPIX * sizeof(float));
    int32_t *yb = malloc((size_t)batch * sizeof(int32_t));
    int steps = ds.ntrain / batch;
    dpar_shard_map_desc eval = { .fn = eval_step, .user = param, .num_args = 3, .args = { tx, th, tl } };
    dpar_graph_feed feeds[2] = { { .value = fx, .host = xb }, { .value = fy, .host = yb } };
    double epoch_loss = 0.0, acc = 0.0;
    for (int e = 1; e <= o.epochs; e++) {
        shuffle(ds.train_idx, ds.ntrain);
        double t0 = now_s(), sum = 0.0;
        for (int s = 0; s < steps; s++) {
            digits_batch(&ds, s, batch, xb, yb);
            float loss;
            if (dpar_graph_run(step, feeds, 2, &loss)) return digits_fail("train step");
            if (ex_check_loss("train_digits_tp", loss, (long long)(e - 1) * steps + s + 1, e, o.lr)) return 1;
            sum += loss;
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (dpar_shard_map(mesh, &eval) || dpar_array_get(tl, lt)) return digits_fail("eval");
        acc = digits_accuracy(&ds, lt);
        printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f\n", e, epoch_loss, acc, steps * batch / dt);
        fflush(stdout);
    }
    int same = 1;
    for (int i = 0; i < NPARAM; i++) same &= ex_replicas_identical(mesh, param[i]);
    printf("replicated parameters bitwise identical on every device: %s\n", same ? "yes" : "NO");
    printf("final: backend=%s devices=%d epochs=%d test_accuracy=%.4f train_loss=%.8f\n", o.backend, devices, o.epochs,
           acc, epoch_loss);
    dpar_graph_destroy(step);
    dpar_runtime_destroy(rt);
    free(xb);
    free(yb);
    free(xt);
    free(lt);
    digits_free(&ds);
    return same ? 0 : 1;
}
