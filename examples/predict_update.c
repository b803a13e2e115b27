/* predict / update_step with pmap: one dense layer 784 -> 10, data parallel.

   params = (W [784, 10], b [10]), replicated on every device. The inputs are
   stacked per device: x [devices, 100, 784], labels [devices, 100]; device d
   sees x[d] and labels[d]. Both are synthetic, from a fixed-seed LCG: pixels
   uniform in [0, 1), labels from a random "teacher" layer, argmax((x - 0.5) @ T)
   (roughly balanced classes), so there is something to learn.

       predict(params, x)      = x @ W + b                    logits [100, 10]
       loss(params, x, labels) = softmax cross-entropy, pmean over "data"
       update(params, x, labels): grads of the loss, pmean over "data",
                                  params -= 0.01 * grads (SGD)

   Each call is one pmap over host data: the parameters go in replicated and
   the updated parameters come out stacked [devices, ...] (all replicas equal;
   we keep replica 0), like `params = pmap(update)(params, x, y)` in JAX.
   With W = 0 and b = 0 the first loss is exactly ln(10) = 2.302585.

   Usage: predict_update [--devices N] [--steps N] [--backend cpu|vulkan|cuda]
          (defaults 4, 5, cpu) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"
#include "example_util.h"

enum { BATCH = 100, IN = 784, OUT = 10 };
static const float LR = 0.01f;

/* Fixed-seed 64-bit LCG (Knuth's MMIX constants); uniform floats in [0, 1). */
static uint64_t rng_state = 42;
static float rng_uniform(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(rng_state >> 40) / 16777216.0f; /* top 24 bits / 2^24 */
}

/* ---- per-device functions. Args: 0 W, 1 b, 2 x [100,784], 3 labels [100] ---- */

/* logits = x @ W + b */
static dpar_status predict(dpar_buffer *logits, const dpar_buffer *W, const dpar_buffer *b, const dpar_buffer *x) {
    TRY(dpar_matmul(logits, x, W, false, false, 1.0f, 0.0f));
    return dpar_bias_add(logits, b);
}

/* output 4: loss [1], averaged over the devices */
static dpar_status loss_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *W = dpar_ctx_arg(ctx, 0), *b = dpar_ctx_arg(ctx, 1);
    dpar_buffer *x = dpar_ctx_arg(ctx, 2), *labels = dpar_ctx_arg(ctx, 3), *loss = dpar_ctx_arg(ctx, 4);
    dpar_buffer *logits = NULL;
    const int64_t lshape[2] = { BATCH, OUT };
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 2, lshape, &logits);
    if (!s) s = predict(logits, W, b, x);
    if (!s) s = dpar_softmax_xent(loss, NULL, logits, labels);
    if (!s) s = dpar_pmean(ctx, loss, loss, "data");
    dpar_buffer_destroy(logits);
    return s;
}

/* outputs 4: new W, 5: new b, 6: loss [1] before the step (averaged over devices) */
static dpar_status update_fn(dpar_ctx *ctx, void *user) {
    (void)user;
    dpar_buffer *W = dpar_ctx_arg(ctx, 0), *b = dpar_ctx_arg(ctx, 1);
    dpar_buffer *x = dpar_ctx_arg(ctx, 2), *labels = dpar_ctx_arg(ctx, 3);
    dpar_buffer *W_new = dpar_ctx_arg(ctx, 4), *b_new = dpar_ctx_arg(ctx, 5), *loss = dpar_ctx_arg(ctx, 6);
    dpar_buffer *logits = NULL, *dlogits = NULL, *dW = NULL, *db = NULL;
    const int64_t lshape[2] = { BATCH, OUT }, wshape[2] = { IN, OUT }, bshape[1] = { OUT };
    dpar_status s = DPAR_OK;
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, lshape, &logits);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, lshape, &dlogits);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, wshape, &dW);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, bshape, &db);
    /* forward, loss and backward on this device's 100 examples */
    if (!s) s = predict(logits, W, b, x);
    if (!s) s = dpar_softmax_xent(loss, dlogits, logits, labels);
    if (!s) s = dpar_matmul(dW, x, dlogits, true, false, 1.0f, 0.0f); /* x^T @ dlogits */
    if (!s) s = dpar_bias_grad(db, dlogits, 0.0f);
    /* all-reduce: the mean over devices is the gradient of the global batch */
    if (!s) s = dpar_pmean(ctx, dW, dW, "data");
    if (!s) s = dpar_pmean(ctx, db, db, "data");
    if (!s) s = dpar_pmean(ctx, loss, loss, "data");
    /* SGD on copies of the parameters */
    if (!s) s = dpar_copy(W_new, W);
    if (!s) s = dpar_copy(b_new, b);
    dpar_buffer *params[2] = { W_new, b_new }, *grads[2] = { dW, db };
    if (!s) s = dpar_sgd_step(ctx, &(dpar_sgd_desc){ .learning_rate = LR }, params, grads, NULL, 2);
    dpar_buffer_destroy(db);
    dpar_buffer_destroy(dW);
    dpar_buffer_destroy(dlogits);
    dpar_buffer_destroy(logits);
    return s;
}

int main(int argc, char **argv) {
    const char *backend_name = "cpu";
    int ndev = 4, steps = 5;
    const ex_flag flags[] = { EX_I("--devices", &ndev, 1, DPAR_MAX_DEVICES), EX_I("--steps", &steps, 1, INT_MAX),
                              EX_S("--backend", &backend_name, "cpu|vulkan|cuda") };
    int rc = ex_parse("predict_update", argc, argv, flags, 3);
    if (rc) return ex_exit_status(rc);
    dpar_backend_kind backend = parse_backend(backend_name);

    dpar_runtime *rt = NULL;
    dpar_mesh *mesh = NULL;
    CHECK(dpar_runtime_create(&(dpar_runtime_desc){ .backend = backend, .num_devices = ndev }, &rt));
    CHECK(dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { ndev }, .axis_names = { "data" } }, &mesh));
    printf("backend %s, mesh 'data' of %d device%s, inputs [%d, %d, %d], dense %d -> %d, SGD lr %g\n",
           dpar_backend_name(dpar_runtime_backend(rt)), ndev, ndev == 1 ? "" : "s", ndev, BATCH, IN, IN, OUT,
           (double)LR);

    /* synthetic data: uniform pixels, labels = argmax((x - 0.5) @ T) for a random teacher T */
    size_t nx = (size_t)ndev * BATCH * IN, nrows = (size_t)ndev * BATCH, nw = (size_t)IN * OUT;
    float *x = malloc(nx * sizeof *x), *T = malloc(nw * sizeof *T);
    int32_t *labels = malloc(nrows * sizeof *labels);
    float *W = calloc(nw, sizeof *W), *b = calloc(OUT, sizeof *b); /* params start at zero */
    float *W_out = malloc((size_t)ndev * nw * sizeof *W_out), *b_out = malloc((size_t)ndev * OUT * sizeof *b_out);
    float *loss = malloc((size_t)ndev * sizeof *loss);
    if (!x || !T || !labels || !W || !b || !W_out || !b_out || !loss) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nx; i++) x[i] = rng_uniform();
    for (size_t i = 0; i < nw; i++) T[i] = 2.0f * rng_uniform() - 1.0f;
    for (size_t r = 0; r < nrows; r++) {
        int best = 0;
        float best_z = 0.0f;
        for (int c = 0; c < OUT; c++) {
            float z = 0.0f;
            for (int k = 0; k < IN; k++) z += (x[r * IN + (size_t)k] - 0.5f) * T[(size_t)k * OUT + (size_t)c];
            if (c == 0 || z > best_z) {
                best = c;
                best_z = z;
            }
        }
        labels[r] = best;
    }

    /* inputs 0..3 are the same for both functions; outputs differ */
    dpar_pmap_desc pd = {
        .axis = "data", .num_inputs = 4,
        .inputs = {
            { .data = W, .dtype = DPAR_F32, .ndim = 2, .shape = { IN, OUT }, .in_axis = DPAR_REPLICATED },
            { .data = b, .dtype = DPAR_F32, .ndim = 1, .shape = { OUT }, .in_axis = DPAR_REPLICATED },
            { .data = x, .dtype = DPAR_F32, .ndim = 3, .shape = { ndev, BATCH, IN }, .in_axis = DPAR_MAPPED },
            { .data = labels, .dtype = DPAR_I32, .ndim = 2, .shape = { ndev, BATCH }, .in_axis = DPAR_MAPPED },
        },
    };
    dpar_pmap_desc loss_pd = pd, update_pd = pd;
    loss_pd.fn = loss_fn;
    loss_pd.num_outputs = 1;
    loss_pd.outputs[0] = (dpar_pmap_output){ .data = loss, .dtype = DPAR_F32, .ndim = 1, .shape = { 1 } };
    update_pd.fn = update_fn;
    update_pd.num_outputs = 3;
    update_pd.outputs[0] = (dpar_pmap_output){ .data = W_out, .dtype = DPAR_F32, .ndim = 2, .shape = { IN, OUT } };
    update_pd.outputs[1] = (dpar_pmap_output){ .data = b_out, .dtype = DPAR_F32, .ndim = 1, .shape = { OUT } };
    update_pd.outputs[2] = (dpar_pmap_output){ .data = loss, .dtype = DPAR_F32, .ndim = 1, .shape = { 1 } };

    CHECK(dpar_pmap(mesh, &loss_pd));
    float loss_before = loss[0];
    printf("loss before: %.6f\n", (double)loss_before);
    for (int step = 1; step <= steps; step++) {
        CHECK(dpar_pmap(mesh, &update_pd));
        for (int d = 1; d < ndev; d++) /* replicas must agree bitwise */
            if (memcmp(W_out, W_out + (size_t)d * nw, nw * sizeof *W_out) != 0) {
                fprintf(stderr, "step %d: device %d's weights differ from device 0's\n", step, d);
                return 1;
            }
        memcpy(W, W_out, nw * sizeof *W); /* the inputs point at W and b: next step uses them */
        memcpy(b, b_out, OUT * sizeof *b);
        printf("step %d: loss %.6f (before its update)\n", step, (double)loss[0]);
    }
    CHECK(dpar_pmap(mesh, &loss_pd));
    printf("loss after %d steps: %.6f (%s)\n", steps, (double)loss[0], loss[0] < loss_before ? "down" : "NOT down");
    int ok = loss[0] < loss_before;

    free(x);
    free(T);
    free(labels);
    free(W);
    free(b);
    free(W_out);
    free(b_out);
    free(loss);
    dpar_mesh_destroy(mesh);
    dpar_runtime_destroy(rt);
    return ok ? 0 : 1;
}
