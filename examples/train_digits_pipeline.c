/* train_digits_pipeline.c — the digits MLP in 2 pipeline stages along a mesh
   axis "stage", GPipe schedule (Huang et al. 2019), written as one graph:

     stage 0 (device of stage index 0): dense 64->H + ReLU     (W1, b1)
     -- dpar_g_pipe_split: the activations go to stage 1, their gradient comes back --
     stage 1 (device of stage index 1): dense H->10 + softmax cross-entropy (W2, b2)

   dpar_graph_pipeline(g, "stage", M) cuts the global batch into M
   micro-batches: while stage 1 works on micro-batch k, stage 0 works on
   k + 1 (M + 1 forward ticks, then M + 1 backward ticks). The gradients are
   summed over the micro-batches (each scaled by 1/M: the gradient of the
   global-batch mean) and every device takes the same SGD step. The losses are
   those of the unpipelined run (build/train_digits --devices 1) up to float
   rounding: each micro-batch's gradient is summed separately.

   build/train_digits_pipeline [--backend B] [--microbatches M] [--epochs N] [--batch N]
                               [--lr X] [--momentum X] [--seed N] [--hidden N] [--data PATH]
   uses 2 devices; --batch must be divisible by --microbatches (default 4). */
#include "digits_common.h"

enum { W1, B1, W2, B2, NPARAM };

/* The step for one micro-batch: x [batch, 64] f32 and y [batch] i32 replicated over "stage" (each stage
   reads what it needs: x stage 0, y stage 1); W1, b1 stage 0, W2, b2 stage 1. */
static dpar_status build_step(dpar_mesh *mesh, dpar_array *const param[NPARAM], int batch, int M,
                              const dpar_sgd_desc *sgd, dpar_graph **g, dpar_value *x, dpar_value *y) {
    dpar_status s = dpar_graph_create(mesh, g);
    if (!s) s = dpar_graph_pipeline(*g, "stage", M);
    if (s) return s;
    *x = dpar_g_feed(*g, "x", &(dpar_array_desc){ .dtype = DPAR_F32, .ndim = 2, .shape = { batch, NPIX } });
    *y = dpar_g_feed(*g, "y", &(dpar_array_desc){ .dtype = DPAR_I32, .ndim = 1, .shape = { batch } });
    const char *names[NPARAM] = { "W1", "b1", "W2", "b2" };
    dpar_value p[NPARAM], grad[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_g_param(*g, names[i], param[i]);
    dpar_value h = dpar_g_relu(*g, dpar_g_bias_add(*g, dpar_g_matmul(*g, *x, p[W1], false, false), p[B1])); /* [mb,H] */
    h = dpar_g_pipe_split(*g, h);                                                              /* stage 0 -> stage 1 */
    dpar_value logits = dpar_g_bias_add(*g, dpar_g_matmul(*g, h, p[W2], false, false), p[B2]); /* [mb,10] */
    if ((s = dpar_graph_value_and_grad(*g, dpar_g_softmax_xent(*g, logits, *y), p, NPARAM, grad))) return s;
    if ((s = dpar_graph_sgd(*g, sgd, p, grad, NPARAM))) return s;
    return dpar_graph_compile(*g, NULL);
}

int main(int argc, char **argv) {
    int M = 4;
    digits_opts o = {
        "cpu", "examples/data/digits.csv.gz", 2, 30, 64, 42, 128, 0.1f, 0.9f, { EX_I("--microbatches", &M, 1, INT_MAX) }
    };
    int rc = digits_parse("train_digits_pipeline", argc, argv, &o);
    if (rc) return ex_exit_status(rc);
    if (o.devices != 2) {
        fprintf(stderr, "train_digits_pipeline: --devices %d: the 2 pipeline stages take 2 devices; use --devices 2\n",
                o.devices);
        return 2;
    }
    if (o.batch % M) {
        fprintf(stderr, "train_digits_pipeline: --microbatches %d must divide --batch %d\n", M, o.batch);
        return 2;
    }
    digits_setup ds;
    if ((rc = digits_prepare("train_digits_pipeline", &o, &ds))) return rc;
    int batch = o.batch, hidden = o.hidden;
    dpar_runtime_desc rd = { .num_devices = 2 };
    if (digits_backend(o.backend, &rd.backend)) {
        fprintf(stderr, "train_digits_pipeline: unknown backend '%s'\n", o.backend);
        return 2;
    }
    dpar_runtime *rt;
    dpar_mesh *mesh;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    o.backend = dpar_backend_name(dpar_runtime_backend(rt)); /* what ran: --backend default or '' picks one */
    if (dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { 2 }, .axis_names = { "stage" } }, &mesh))
        return digits_fail("mesh");
    printf("backend %s, 2 devices: 2 pipeline stages along \"stage\", GPipe with %d micro-batches of %d\n", o.backend,
           M, batch / M);
    printf("data: %d train, %d test images; MLP 64-%d-10, batch %d, lr %g, momentum %g\n", ds.ntrain, ds.ntest, hidden,
           batch, (double)o.lr, (double)o.momentum);

    /* model: the parameters as replicated arrays (each stage computes with its own; every device steps all) */
    dpar_array *param[NPARAM];
    int64_t pshape[NPARAM][2] = { { NPIX, hidden }, { hidden, 0 }, { hidden, NCLASS }, { NCLASS, 0 } };
    for (int i = 0; i < NPARAM; i++)
        if (digits_array(mesh, DPAR_F32, pshape[i][1] ? 2 : 1, pshape[i][0], pshape[i][1], NULL, NULL, &param[i]))
            return digits_fail("parameters");
    if (dpar_array_put(param[W1], ds.w1) || dpar_array_put(param[W2], ds.w2)) return digits_fail("init");
    dpar_graph *step;
    dpar_value fx, fy;
    if (build_step(mesh, param, batch, M, &(dpar_sgd_desc){ .learning_rate = o.lr, .momentum = o.momentum }, &step, &fx,
                   &fy))
        return digits_fail("step graph");

    /* test set: half the rows on each device (evaluation needs no pipeline) */
    int tpad = (ds.ntest + 1) / 2 * 2;
    float *xt = calloc((size_t)tpad * NPIX, sizeof(float)), *lt = malloc((size_t)tpad * NCLASS * sizeof(float));
    for (int i = 0; i < ds.ntest; i++)
        memcpy(xt + (size_t)i * NPIX, ds.all.x + (size_t)ds.test_idx[i] * NPIX, NPIX * sizeof(float));
    dpar_array *tx, *th, *tl;
    if (digits_array(mesh, DPAR_F32, 2, tpad, NPIX, "stage", NULL, &tx) ||
        digits_array(mesh, DPAR_F32, 2, tpad, hidden, "stage", NULL, &th) ||
        digits_array(mesh, DPAR_F32, 2, tpad, NCLASS, "stage", NULL, &tl) || dpar_array_put(tx, xt))
        return digits_fail("test set");

    float *xb = malloc((size_t)batch * NPIX * sizeof(float));
    int32_t *yb = malloc((size_t)batch * sizeof(int32_t));
    int steps = ds.ntrain / batch;
    dpar_shard_map_desc eval = { .fn = digits_eval_step, .user = param, .num_args = 3, .args = { tx, th, tl } };
    double epoch_loss = 0.0, acc = 0.0;
    for (int e = 1; e <= o.epochs; e++) {
        shuffle(ds.train_idx, ds.ntrain);
        double t0 = now_s(), sum = 0.0;
        for (int s = 0; s < steps; s++) {
            float loss; /* the mean over the micro-batches */
            digits_batch(&ds, s, batch, xb, yb);
            if (dpar_graph_run(step, (dpar_graph_feed[]){ { fx, xb, NULL }, { fy, yb, NULL } }, 2, &loss))
                return digits_fail("train step");
            if (ex_check_loss("train_digits_pipeline", loss, (long long)(e - 1) * steps + s + 1, e, o.lr)) return 1;
            sum += loss;
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (dpar_shard_map(mesh, &eval) || dpar_array_get(tl, lt)) return digits_fail("eval");
        acc = digits_accuracy(&ds, lt);
        printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f\n", e, epoch_loss, acc, steps * batch / dt);
        fflush(stdout);
    }
    printf("final: backend=%s devices=2 epochs=%d test_accuracy=%.4f train_loss=%.8f\n", o.backend, o.epochs, acc,
           epoch_loss);
    dpar_graph_destroy(step);
    dpar_runtime_destroy(rt); /* frees the arrays too */
    free(xb);
    free(yb);
    free(xt);
    free(lt);
    digits_free(&ds);
    return 0;
}
