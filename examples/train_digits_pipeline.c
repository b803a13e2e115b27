/* train_digits_pipeline.c — the digits MLP split into 2 pipeline stages along
   a mesh axis "stage", GPipe schedule (Huang et al. 2019):

     stage 0 (device of stage index 0): dense 64->H + ReLU, holds W1, b1
     stage 1 (device of stage index 1): dense H->10 + softmax cross-entropy,
                                        holds W2, b2

   Each parameter (and its gradient and momentum) lives only on its stage's
   device. The global batch is cut into M micro-batches. Forward: at tick t
   stage 0 computes micro-batch t while stage 1 computes micro-batch t-1
   (forward, loss and backward of its layer), then the activations of
   micro-batch t go 0 -> 1 with ppermute. Backward: at tick t the gradient
   of micro-batch t goes 1 -> 0 with ppermute while stage 0 runs the backward
   of micro-batch t-1. Gradients accumulate over the micro-batches (each
   micro-batch's loss gradient is scaled by 1/M, so the sum is the gradient
   of the global-batch mean), then each stage takes its SGD step. The losses
   are those of the unpipelined run (build/train_digits --devices 1).

   build/train_digits_pipeline [--backend B] [--microbatches M] [--epochs N] [--batch N]
                               [--lr X] [--momentum X] [--seed N] [--hidden N] [--data PATH]
   uses 2 devices; --batch must be divisible by --microbatches (default 4). */
#include "digits_common.h"

enum { MAXMB = 64 };
typedef struct {
    int M, mb, hidden;
    int dev[2]; /* device of each stage */
    /* stage 0 */
    dpar_buffer *w1, *b1, *gw1, *gb1, *vw1, *vb1;
    dpar_buffer *x[MAXMB], *h_pre[MAXMB], *h[MAXMB], *dh[MAXMB], *send0;
    /* stage 1 */
    dpar_buffer *w2, *b2, *gw2, *gb2, *vw2, *vb2;
    dpar_buffer *y[MAXMB], *hin[MAXMB], *logits, *dlogits, *dhout[MAXMB], *loss[MAXMB], *send1;
    dpar_sgd_desc sgd;
    /* evaluation */
    int tpad;
    dpar_buffer *tx, *th0, *th1, *tl, *tsend;
} pipe_model;

static const int FWD[2] = { 0, 1 }, BWD[2] = { 1, 0 }; /* ppermute pairs: source, destination */

static dpar_status stage1_microbatch(pipe_model *p, int k) {
    dpar_status s;
    float beta = k ? 1.0f : 0.0f; /* accumulate the gradients over micro-batches */
    if ((s = dpar_matmul(p->logits, p->hin[k], p->w2, false, false, 1.0f, 0.0f))) return s;
    if ((s = dpar_bias_add(p->logits, p->b2))) return s;
    if ((s = dpar_softmax_xent(p->loss[k], p->dlogits, p->logits, p->y[k]))) return s; /* dlogits / mb */
    if ((s = dpar_scale(p->dlogits, 1.0f / (float)p->M))) return s;                    /* -> / global batch */
    if ((s = dpar_matmul(p->gw2, p->hin[k], p->dlogits, true, false, 1.0f, beta))) return s;
    if ((s = dpar_bias_grad(p->gb2, p->dlogits, beta))) return s;
    return dpar_matmul(p->dhout[k], p->dlogits, p->w2, false, true, 1.0f, 0.0f);
}

static dpar_status train_step(dpar_ctx *ctx, void *user) {
    pipe_model *p = user;
    int stage;
    dpar_status s = dpar_ctx_axis_index(ctx, "stage", &stage);
    if (s) return s;
    /* forward (and stage 1's backward), M + 1 ticks */
    for (int t = 0; t <= p->M; t++) {
        if (stage == 0 && t < p->M) {
            if ((s = dpar_matmul(p->h_pre[t], p->x[t], p->w1, false, false, 1.0f, 0.0f))) return s;
            if ((s = dpar_bias_add(p->h_pre[t], p->b1))) return s;
            if ((s = dpar_relu(p->h[t], p->h_pre[t]))) return s;
        }
        if (stage == 1 && t >= 1 && (s = stage1_microbatch(p, t - 1))) return s;
        if (t < p->M) {
            if (stage == 0)
                s = dpar_ppermute(ctx, p->send0, p->h[t], "stage", FWD, 1);
            else
                s = dpar_ppermute(ctx, p->hin[t], p->hin[t], "stage", FWD, 1);
            if (s) return s;
        }
    }
    /* backward of stage 0, M + 1 ticks */
    for (int t = 0; t <= p->M; t++) {
        if (stage == 0 && t >= 1) {
            int k = t - 1;
            float beta = k ? 1.0f : 0.0f;
            if ((s = dpar_relu_backward(p->dh[k], p->dh[k], p->h_pre[k]))) return s;
            if ((s = dpar_matmul(p->gw1, p->x[k], p->dh[k], true, false, 1.0f, beta))) return s;
            if ((s = dpar_bias_grad(p->gb1, p->dh[k], beta))) return s;
        }
        if (t < p->M) {
            if (stage == 1)
                s = dpar_ppermute(ctx, p->send1, p->dhout[t], "stage", BWD, 1);
            else
                s = dpar_ppermute(ctx, p->dh[t], p->dh[t], "stage", BWD, 1);
            if (s) return s;
        }
    }
    /* each stage updates its own parameters */
    if (stage == 0) {
        dpar_buffer *pa[2] = { p->w1, p->b1 }, *g[2] = { p->gw1, p->gb1 }, *v[2] = { p->vw1, p->vb1 };
        return dpar_sgd_step(ctx, &p->sgd, pa, g, v, 2);
    }
    dpar_buffer *pa[2] = { p->w2, p->b2 }, *g[2] = { p->gw2, p->gb2 }, *v[2] = { p->vw2, p->vb2 };
    return dpar_sgd_step(ctx, &p->sgd, pa, g, v, 2);
}

static dpar_status eval_step(dpar_ctx *ctx, void *user) {
    pipe_model *p = user;
    int stage;
    dpar_status s = dpar_ctx_axis_index(ctx, "stage", &stage);
    if (s) return s;
    if (stage == 0) {
        if ((s = dpar_matmul(p->th0, p->tx, p->w1, false, false, 1.0f, 0.0f))) return s;
        if ((s = dpar_bias_add(p->th0, p->b1))) return s;
        if ((s = dpar_relu(p->th0, p->th0))) return s;
        return dpar_ppermute(ctx, p->tsend, p->th0, "stage", FWD, 1);
    }
    if ((s = dpar_ppermute(ctx, p->th1, p->th1, "stage", FWD, 1))) return s;
    if ((s = dpar_matmul(p->tl, p->th1, p->w2, false, false, 1.0f, 0.0f))) return s;
    return dpar_bias_add(p->tl, p->b2);
}

static int buf(dpar_runtime *rt, int dev, dpar_dtype t, int64_t d0, int64_t d1, dpar_buffer **out) {
    int64_t shape[2] = { d0, d1 };
    return dpar_buffer_create(rt, dev, t, d1 ? 2 : 1, shape, out) != DPAR_OK;
}

int main(int argc, char **argv) {
    int M = 4;
    digits_opts o = {
        "cpu", "examples/data/digits.csv.gz", 2, 30, 64, 42, 128, 0.1f, 0.9f, { "--microbatches" }, { &M }
    };
    int rc = digits_parse("train_digits_pipeline", argc, argv, &o);
    if (rc) return rc;
    if (o.devices != 2) {
        fprintf(stderr, "train_digits_pipeline: 2 stages use 2 devices (--devices 2)\n");
        return 2;
    }
    if (M < 1 || M > MAXMB || o.batch % M) {
        fprintf(stderr, "train_digits_pipeline: --microbatches must be 1..%d and divide --batch %d\n", MAXMB, o.batch);
        return 2;
    }
    digits_setup ds;
    if (digits_prepare("train_digits_pipeline", &o, &ds)) return 1;
    int batch = o.batch, hidden = o.hidden, mb = batch / M;

    dpar_runtime_desc rd = { .num_devices = 2 };
    if (digits_backend(o.backend, &rd.backend)) {
        fprintf(stderr, "train_digits_pipeline: unknown backend '%s'\n", o.backend);
        return 2;
    }
    dpar_runtime *rt;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    dpar_mesh *mesh;
    dpar_mesh_desc md = { .ndim = 1, .shape = { 2 }, .axis_names = { "stage" } };
    if (dpar_mesh_create(rt, &md, &mesh)) return digits_fail("mesh");
    printf("backend %s, 2 devices: 2 pipeline stages along \"stage\", GPipe with %d micro-batches of %d\n", o.backend,
           M, mb);
    printf("data: %d train, %d test images; MLP 64-%d-10, batch %d, lr %g, momentum %g\n", ds.ntrain, ds.ntest, hidden,
           batch, (double)o.lr, (double)o.momentum);

    pipe_model p;
    memset(&p, 0, sizeof p);
    p.M = M;
    p.mb = mb;
    p.hidden = hidden;
    for (int st = 0; st < 2; st++) {
        int c = st;
        if (dpar_mesh_device(mesh, &c, &p.dev[st])) return digits_fail("mesh device");
    }
    int d0 = p.dev[0], d1 = p.dev[1];
    if (buf(rt, d0, DPAR_F32, NPIX, hidden, &p.w1) || buf(rt, d0, DPAR_F32, hidden, 0, &p.b1) ||
        buf(rt, d0, DPAR_F32, NPIX, hidden, &p.gw1) || buf(rt, d0, DPAR_F32, hidden, 0, &p.gb1) ||
        buf(rt, d0, DPAR_F32, NPIX, hidden, &p.vw1) || buf(rt, d0, DPAR_F32, hidden, 0, &p.vb1) ||
        buf(rt, d1, DPAR_F32, hidden, NCLASS, &p.w2) || buf(rt, d1, DPAR_F32, NCLASS, 0, &p.b2) ||
        buf(rt, d1, DPAR_F32, hidden, NCLASS, &p.gw2) || buf(rt, d1, DPAR_F32, NCLASS, 0, &p.gb2) ||
        buf(rt, d1, DPAR_F32, hidden, NCLASS, &p.vw2) || buf(rt, d1, DPAR_F32, NCLASS, 0, &p.vb2) ||
        buf(rt, d0, DPAR_F32, mb, hidden, &p.send0) || buf(rt, d1, DPAR_F32, mb, hidden, &p.send1) ||
        buf(rt, d1, DPAR_F32, mb, NCLASS, &p.logits) || buf(rt, d1, DPAR_F32, mb, NCLASS, &p.dlogits))
        return digits_fail("parameters");
    for (int k = 0; k < M; k++)
        if (buf(rt, d0, DPAR_F32, mb, NPIX, &p.x[k]) || buf(rt, d0, DPAR_F32, mb, hidden, &p.h_pre[k]) ||
            buf(rt, d0, DPAR_F32, mb, hidden, &p.h[k]) || buf(rt, d0, DPAR_F32, mb, hidden, &p.dh[k]) ||
            buf(rt, d1, DPAR_I32, mb, 0, &p.y[k]) || buf(rt, d1, DPAR_F32, mb, hidden, &p.hin[k]) ||
            buf(rt, d1, DPAR_F32, mb, hidden, &p.dhout[k]) || buf(rt, d1, DPAR_F32, 1, 0, &p.loss[k]))
            return digits_fail("activations");
    if (dpar_buffer_write(p.w1, 0, ds.w1, (size_t)NPIX * (size_t)hidden * 4) ||
        dpar_buffer_write(p.w2, 0, ds.w2, (size_t)hidden * NCLASS * 4))
        return digits_fail("init");
    p.sgd.learning_rate = o.lr;
    p.sgd.momentum = o.momentum;

    p.tpad = ds.ntest;
    float *xt = calloc((size_t)p.tpad * NPIX, sizeof(float)), *lt = malloc((size_t)p.tpad * NCLASS * sizeof(float));
    for (int i = 0; i < ds.ntest; i++)
        memcpy(xt + (size_t)i * NPIX, ds.all.x + (size_t)ds.test_idx[i] * NPIX, NPIX * sizeof(float));
    if (buf(rt, d0, DPAR_F32, p.tpad, NPIX, &p.tx) || buf(rt, d0, DPAR_F32, p.tpad, hidden, &p.th0) ||
        buf(rt, d0, DPAR_F32, p.tpad, hidden, &p.tsend) || buf(rt, d1, DPAR_F32, p.tpad, hidden, &p.th1) ||
        buf(rt, d1, DPAR_F32, p.tpad, NCLASS, &p.tl) || dpar_buffer_write(p.tx, 0, xt, (size_t)p.tpad * NPIX * 4))
        return digits_fail("test set");

    float *xb = malloc((size_t)batch * NPIX * sizeof(float));
    int32_t *yb = malloc((size_t)batch * sizeof(int32_t));
    int steps = ds.ntrain / batch;
    dpar_shard_map_desc train = { .fn = train_step, .user = &p }, eval = { .fn = eval_step, .user = &p };
    double epoch_loss = 0.0, acc = 0.0;
    for (int e = 1; e <= o.epochs; e++) {
        shuffle(ds.train_idx, ds.ntrain);
        double t0 = now_s(), sum = 0.0;
        for (int s = 0; s < steps; s++) {
            digits_batch(&ds, s, batch, xb, yb);
            for (int k = 0; k < M; k++) /* inputs to stage 0, labels to stage 1 */
                if (dpar_buffer_write(p.x[k], 0, xb + (size_t)k * (size_t)mb * NPIX, (size_t)mb * NPIX * 4) ||
                    dpar_buffer_write(p.y[k], 0, yb + (size_t)k * (size_t)mb, (size_t)mb * 4))
                    return digits_fail("batch upload");
            if (dpar_shard_map(mesh, &train)) return digits_fail("train step");
            double l = 0.0;
            for (int k = 0; k < M; k++) {
                float v;
                if (dpar_buffer_read(p.loss[k], 0, &v, 4)) return digits_fail("loss");
                l += v;
            }
            sum += l / M;
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (dpar_shard_map(mesh, &eval) || dpar_buffer_read(p.tl, 0, lt, (size_t)p.tpad * NCLASS * 4))
            return digits_fail("eval");
        acc = digits_accuracy(&ds, lt);
        printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f\n", e, epoch_loss, acc, steps * batch / dt);
        fflush(stdout);
    }
    printf("final: backend=%s devices=2 epochs=%d test_accuracy=%.4f train_loss=%.8f\n", o.backend, o.epochs, acc,
           epoch_loss);
    dpar_runtime_destroy(rt); /* frees the buffers too */
    free(xb);
    free(yb);
    free(xt);
    free(lt);
    digits_free(&ds);
    return 0;
}
