/* One data-parallel step of a linear + ReLU regression.

   Every device holds the same weights w = ones(64, 32) (replicated) and its
   own batch: inputs x = ones(128, 64), targets y = ones(128, 32). Per device:

       pred = relu(x @ w)                      [128, 32]
       loss = mean((pred - y)^2)
       grad = d loss / d w                     [64, 32], then pmean over "data"
       w   -= 0.01 * grad                      (SGD)

   The exact numbers, by hand (the same on every device and for any device
   count, since every device sees the same data):
       x @ w = 64 everywhere, relu keeps it, pred - y = 63
       loss before = 63^2 = 3969
       d loss / d pred = 2 * 63 / (128 * 32) = 63 / 2048 at every element
       grad[i][j] = sum over the 128 rows of x * 63/2048 = 128 * 63 / 2048 = 3.9375
       w after = 1 - 0.01 * 3.9375 = 0.960625
       x @ w = 64 * 0.960625 = 61.48, pred - y = 60.48
       loss after = 60.48^2 = 3657.8304   (printed to 2 decimals: 3657.83)

   Then: targets of shape (128,) cannot be used against (128, 32) predictions;
   dpar_mse never broadcasts and returns DPAR_ERR_SHAPE.

   Usage: dp_regression [--devices N] [--backend cpu|vulkan|cuda]   (default 4, cpu) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"
#include "example_util.h"

enum { B = 128, IN = 64, OUT = 32 };
static const float LR = 0.01f;

/* Forward: pred = relu(x @ w) and loss = mean((pred - y)^2); with dpred != NULL
   also the gradient of the loss with respect to pred. z receives x @ w. */
static dpar_status forward(dpar_buffer *loss, dpar_buffer *dpred, dpar_buffer *z, dpar_buffer *pred,
                           const dpar_buffer *x, const dpar_buffer *w, const dpar_buffer *y) {
    TRY(dpar_matmul(z, x, w, false, false, 1.0f, 0.0f));
    TRY(dpar_relu(pred, z));
    return dpar_mse(loss, dpred, pred, y);
}

/* The per-device step. Args: 0 w [64,32] (replicated), 1 x [128,64], 2 y [128,32];
   outputs 3 new w [64,32], 4 grad [64,32], 5 loss before [1], 6 loss after [1].
   user: int[2] that device 0 fills with the gradient buffer's shape. */
static dpar_status step_fn(dpar_ctx *ctx, void *user) {
    dpar_buffer *w = dpar_ctx_arg(ctx, 0), *x = dpar_ctx_arg(ctx, 1), *y = dpar_ctx_arg(ctx, 2);
    dpar_buffer *w_new = dpar_ctx_arg(ctx, 3), *grad = dpar_ctx_arg(ctx, 4);
    dpar_buffer *loss0 = dpar_ctx_arg(ctx, 5), *loss1 = dpar_ctx_arg(ctx, 6);
    dpar_buffer *z = NULL, *pred = NULL, *dpred = NULL;
    const int64_t act[2] = { B, OUT };
    dpar_status s = DPAR_OK;
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, act, &z);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, act, &pred);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 2, act, &dpred);
    /* forward and backward */
    if (!s) s = forward(loss0, dpred, z, pred, x, w, y);
    if (!s) s = dpar_relu_backward(dpred, dpred, z);                  /* d loss / d z */
    if (!s) s = dpar_matmul(grad, x, dpred, true, false, 1.0f, 0.0f); /* x^T @ dz */
    /* average the gradients (and the loss) over the data-parallel axis */
    if (!s) s = dpar_pmean(ctx, grad, grad, "data");
    if (!s && dpar_ctx_device(ctx) == 0) {
        int *gshape = (int *)user;
        gshape[0] = (int)dpar_buffer_dim(grad, 0);
        gshape[1] = (int)dpar_buffer_dim(grad, 1);
    }
    if (!s) s = dpar_pmean(ctx, loss0, loss0, "data");
    /* SGD on a copy of w, then the loss with the new weights */
    if (!s) s = dpar_copy(w_new, w);
    if (!s) s = dpar_sgd_step(ctx, &(dpar_sgd_desc){ .learning_rate = LR }, &w_new, &grad, NULL, 1);
    if (!s) s = forward(loss1, NULL, z, pred, x, w_new, y);
    if (!s) s = dpar_pmean(ctx, loss1, loss1, "data");
    dpar_buffer_destroy(dpred);
    dpar_buffer_destroy(pred);
    dpar_buffer_destroy(z);
    return s;
}

int main(int argc, char **argv) {
    const char *backend_name = "cpu";
    int ndev = 4;
    const ex_flag flags[] = { EX_I("--devices", &ndev, 1, DPAR_MAX_DEVICES),
                              EX_S("--backend", &backend_name, "cpu|vulkan|cuda") };
    int rc = ex_parse("dp_regression", argc, argv, flags, 2);
    if (rc) return ex_exit_status(rc);
    dpar_backend_kind backend = parse_backend(backend_name);

    dpar_runtime *rt = NULL;
    dpar_mesh *mesh = NULL;
    CHECK(dpar_runtime_create(&(dpar_runtime_desc){ .backend = backend, .num_devices = ndev }, &rt));
    CHECK(dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { ndev }, .axis_names = { "data" } }, &mesh));
    printf("backend %s, mesh 'data' of %d device%s\n", dpar_backend_name(dpar_runtime_backend(rt)), ndev,
           ndev == 1 ? "" : "s");

    /* host data: w replicated, x and y stacked per device */
    size_t nw = (size_t)IN * OUT, nx = (size_t)ndev * B * IN, ny = (size_t)ndev * B * OUT;
    float *w = malloc(nw * sizeof *w), *x = malloc(nx * sizeof *x), *y = malloc(ny * sizeof *y);
    float *w_new = malloc((size_t)ndev * nw * sizeof *w_new), *grad = malloc((size_t)ndev * nw * sizeof *grad);
    float *loss0 = malloc((size_t)ndev * sizeof *loss0), *loss1 = malloc((size_t)ndev * sizeof *loss1);
    if (!w || !x || !y || !w_new || !grad || !loss0 || !loss1) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nw; i++) w[i] = 1.0f;
    for (size_t i = 0; i < nx; i++) x[i] = 1.0f;
    for (size_t i = 0; i < ny; i++) y[i] = 1.0f;

    int grad_shape[2] = { 0, 0 };
    dpar_pmap_desc pd = {
        .axis = "data", .fn = step_fn, .user = grad_shape, .num_inputs = 3, .num_outputs = 4,
        .inputs = {
            { .data = w, .dtype = DPAR_F32, .ndim = 2, .shape = { IN, OUT }, .in_axis = DPAR_REPLICATED },
            { .data = x, .dtype = DPAR_F32, .ndim = 3, .shape = { ndev, B, IN }, .in_axis = DPAR_MAPPED },
            { .data = y, .dtype = DPAR_F32, .ndim = 3, .shape = { ndev, B, OUT }, .in_axis = DPAR_MAPPED },
        },
        .outputs = {
            { .data = w_new, .dtype = DPAR_F32, .ndim = 2, .shape = { IN, OUT } },
            { .data = grad, .dtype = DPAR_F32, .ndim = 2, .shape = { IN, OUT } },
            { .data = loss0, .dtype = DPAR_F32, .ndim = 1, .shape = { 1 } },
            { .data = loss1, .dtype = DPAR_F32, .ndim = 1, .shape = { 1 } },
        },
    };
    CHECK(dpar_pmap(mesh, &pd));

    int same = 1; /* every replica holds bitwise the same gradient and weights */
    for (int d = 1; d < ndev; d++)
        same &= memcmp(grad, grad + (size_t)d * nw, nw * sizeof *grad) == 0 &&
                memcmp(w_new, w_new + (size_t)d * nw, nw * sizeof *w_new) == 0;
    printf("loss before the update: %.2f\n", (double)loss0[0]);
    printf("gradient shape: (%d, %d), grad[0][0] = %g\n", grad_shape[0], grad_shape[1], (double)grad[0]);
    printf("w[0][0] after one SGD step (lr %g): %g\n", (double)LR, (double)w_new[0]);
    printf("loss after the update: %.2f\n", (double)loss1[0]);
    printf("replicas identical after the step: %s\n", same ? "yes" : "no");
    if (!same) return 1;

    /* targets (128,) against predictions (128, 32): no broadcasting */
    printf("\n== mse with targets of shape (128,) against predictions (128, 32)\n");
    dpar_buffer *pred = NULL, *bad_y = NULL, *loss = NULL;
    const int64_t pshape[2] = { B, OUT }, yshape[1] = { B }, one[1] = { 1 };
    CHECK(dpar_buffer_create(rt, 0, DPAR_F32, 2, pshape, &pred));
    CHECK(dpar_buffer_create(rt, 0, DPAR_F32, 1, yshape, &bad_y));
    CHECK(dpar_buffer_create(rt, 0, DPAR_F32, 1, one, &loss));
    dpar_status s = dpar_mse(loss, NULL, pred, bad_y);
    if (s != DPAR_ERR_SHAPE) {
        fprintf(stderr, "expected DPAR_ERR_SHAPE, got %s: %s\n", dpar_status_string(s), dpar_last_error());
        return 1;
    }
    printf("error %s: %s\n", dpar_status_string(s), dpar_last_error());

    dpar_buffer_destroy(loss);
    dpar_buffer_destroy(bad_y);
    dpar_buffer_destroy(pred);
    free(w);
    free(x);
    free(y);
    free(w_new);
    free(grad);
    free(loss0);
    free(loss1);
    dpar_mesh_destroy(mesh);
    dpar_runtime_destroy(rt);
    return 0;
}
