/* train_digits.c — the main job: a 64-H-10 MLP on the UCI handwritten digits,
   trained data-parallel over a 1-d mesh axis "data".

   Each step the global batch is split across the devices (dpar_array with
   spec ("data", None)), every device runs forward and backward on its shard,
   the gradients are pmean'd over "data", and every device takes the same SGD
   step with momentum, so the replicas stay bitwise identical.

   build/train_digits [--backend cpu|vulkan|cuda] [--devices N] [--epochs N]
                      [--batch N] [--lr X] [--momentum X] [--seed N] [--hidden N]
                      [--data PATH]
   Ends with exactly one line "final: backend=... devices=... epochs=...
   test_accuracy=... train_loss=...". Exit status 0 on success.

   Multi-process: built with -DDPAR_MPI (make build/train_digits_mpi) and run
   as `mpirun -np P build/train_digits_mpi --devices D`, each of the P
   processes opens D/P devices, loads only its own rows of every batch
   (dpar_array_local_rows + dpar_array_put_rows), and process 0 prints. */
#include "digits_common.h" /* data, fixed-seed split, RNG, init, flags: shared with the other digits examples */
#ifdef DPAR_MPI
#include <mpi.h>
#endif

/* ------------------------------------------------------------------ model */
enum { W1, B1, W2, B2, NPARAM };
typedef struct {
    dpar_array *param[NPARAM], *grad[NPARAM], *mom[NPARAM];       /* replicated */
    dpar_array *x, *y, *h_pre, *h, *logits, *dlogits, *dh, *loss; /* split over "data" */
    dpar_sgd_desc sgd;
} model;

/* What every device runs each step, on its own shard of the batch. */
static dpar_status train_step(dpar_ctx *ctx, void *user) {
    model *m = user;
    dpar_buffer *p[NPARAM], *g[NPARAM], *v[NPARAM];
    for (int i = 0; i < NPARAM; i++) {
        p[i] = dpar_array_shard(m->param[i], dpar_ctx_device(ctx));
        g[i] = dpar_array_shard(m->grad[i], dpar_ctx_device(ctx));
        v[i] = dpar_array_shard(m->mom[i], dpar_ctx_device(ctx));
    }
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *x = dpar_array_shard(m->x, dev), *y = dpar_array_shard(m->y, dev);
    dpar_buffer *h_pre = dpar_array_shard(m->h_pre, dev), *h = dpar_array_shard(m->h, dev);
    dpar_buffer *logits = dpar_array_shard(m->logits, dev), *dlogits = dpar_array_shard(m->dlogits, dev);
    dpar_buffer *dh = dpar_array_shard(m->dh, dev), *loss = dpar_array_shard(m->loss, dev);
    dpar_status s;
#define CHECK(call)                            \
    do {                                       \
        if ((s = (call)) != DPAR_OK) return s; \
    } while (0)
    /* forward */
    CHECK(digits_forward(p, x, h_pre, h, logits));
    CHECK(dpar_softmax_xent(loss, dlogits, logits, y)); /* local mean loss, dlogits / b */
    /* backward */
    CHECK(dpar_matmul(g[W2], h, dlogits, true, false, 1.0f, 0.0f)); /* h^T @ dlogits */
    CHECK(dpar_bias_grad(g[B2], dlogits, 0.0f));
    CHECK(dpar_matmul(dh, dlogits, p[W2], false, true, 1.0f, 0.0f)); /* dlogits @ W2^T */
    CHECK(dpar_relu_backward(dh, dh, h_pre));
    CHECK(dpar_matmul(g[W1], x, dh, true, false, 1.0f, 0.0f)); /* x^T @ dh */
    CHECK(dpar_bias_grad(g[B1], dh, 0.0f));
    /* the mean of the local means over equal shards is the global-batch mean */
    for (int i = 0; i < NPARAM; i++) CHECK(dpar_pmean(ctx, g[i], g[i], "data"));
    CHECK(dpar_pmean(ctx, loss, loss, "data"));
    CHECK(dpar_sgd_step(ctx, &m->sgd, p, g, v, NPARAM));
#undef CHECK
    return DPAR_OK;
}

int main(int argc, char **argv) {
    digits_opts o = { .backend = "cpu",
                      .path = "examples/data/digits.csv.gz",
                      .devices = 4,
                      .epochs = 30,
                      .batch = 64,
                      .seed = 42,
                      .hidden = 128,
                      .lr = 0.1f,
                      .momentum = 0.9f };
    if (digits_parse("train_digits", argc, argv, &o)) return 2;
    const char *backend = o.backend;
    int devices = o.devices, epochs = o.epochs, batch = o.batch, hidden = o.hidden;
    float lr = o.lr, momentum = o.momentum;
    if (batch % devices) {
        fprintf(stderr, "train_digits: --batch %d is not divisible by --devices %d\n", batch, devices);
        return 2;
    }
    int nproc = 1, proc = 0;
#ifdef DPAR_MPI
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);
    MPI_Comm_rank(MPI_COMM_WORLD, &proc);
    MPI_Comm world = MPI_COMM_WORLD;
    if (devices % nproc) {
        fprintf(stderr, "train_digits: --devices %d is not divisible by the %d processes\n", devices, nproc);
        MPI_Finalize();
        return 2;
    }
#endif

    /* data: fixed-seed 80/20 split and the initial weights (drawn in this order) */
    digits_setup ds;
    if (digits_prepare("train_digits", &o, &ds)) return 1;
    dataset all = ds.all;
    int ntest = ds.ntest, ntrain = ds.ntrain, *train_idx = ds.train_idx, *test_idx = ds.test_idx;

    /* runtime and mesh */
    dpar_runtime_desc rd = { .num_devices = devices / nproc }; /* this process's devices */
#ifdef DPAR_MPI
    rd.mpi.comm = &world;
#endif
    if (digits_backend(backend, &rd.backend)) {
        fprintf(stderr, "train_digits: unknown backend '%s' (cpu, vulkan, cuda)\n", backend);
        return 2;
    }
    dpar_runtime *rt;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    dpar_mesh *mesh;
    if (dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { devices }, .axis_names = { "data" } }, &mesh))
        return digits_fail("mesh");
    dpar_device_info info;
    dpar_runtime_device_info(rt, 0, &info);
    if (proc == 0) {
        printf("backend %s, %d device(s) in %d process(es): %s\n", backend, devices, nproc, info.name);
        printf("data: %d train, %d test images; MLP 64-%d-10, batch %d (%d per device), lr %g, momentum %g\n", ntrain,
               ntest, hidden, batch, batch / devices, (double)lr, (double)momentum);
    }

    /* model: replicated parameters, momentum and gradients; batch-split activations */
    model m;
    memset(&m, 0, sizeof m);
    int64_t pshape[NPARAM][2] = { { NPIX, hidden }, { hidden, 0 }, { hidden, NCLASS }, { NCLASS, 0 } };
    for (int i = 0; i < NPARAM; i++) {
        int nd = pshape[i][1] ? 2 : 1;
        if (digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], NULL, NULL, &m.param[i]) ||
            digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], NULL, NULL, &m.grad[i]) ||
            digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], NULL, NULL, &m.mom[i]))
            return digits_fail("parameters");
    }
    /* He-uniform weights from digits_prepare, zero biases: the same numbers for any device count */
    if (dpar_array_put(m.param[W1], ds.w1) || dpar_array_put(m.param[W2], ds.w2)) return digits_fail("init");
    if (digits_array(mesh, DPAR_F32, 2, batch, NPIX, "data", NULL, &m.x) ||
        digits_array(mesh, DPAR_I32, 1, batch, 0, "data", NULL, &m.y) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", NULL, &m.h_pre) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", NULL, &m.h) ||
        digits_array(mesh, DPAR_F32, 2, batch, NCLASS, "data", NULL, &m.logits) ||
        digits_array(mesh, DPAR_F32, 2, batch, NCLASS, "data", NULL, &m.dlogits) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", NULL, &m.dh) ||
        digits_array(mesh, DPAR_F32, 1, devices, 0, "data", NULL, &m.loss))
        return digits_fail("activations");
    m.sgd.learning_rate = lr;
    m.sgd.momentum = momentum;

    /* test set, padded to a multiple of the device count */
    int tpad = (ntest + devices - 1) / devices * devices;
    float *xt = calloc((size_t)tpad * NPIX, sizeof(float)), *lt = malloc((size_t)tpad * NCLASS * sizeof(float));
    dpar_array *tx, *th, *tl;
    int64_t r0, rn; /* the rows of every split array that live on this process */
    if (digits_array(mesh, DPAR_F32, 2, tpad, NPIX, "data", NULL, &tx) ||
        digits_array(mesh, DPAR_F32, 2, tpad, hidden, "data", NULL, &th) ||
        digits_array(mesh, DPAR_F32, 2, tpad, NCLASS, "data", NULL, &tl) || dpar_array_local_rows(tx, &r0, &rn))
        return digits_fail("test set");
    for (int64_t i = r0; i < r0 + rn && i < ntest; i++)
        memcpy(xt + (size_t)(i - r0) * NPIX, all.x + (size_t)test_idx[i] * NPIX, NPIX * sizeof(float));
    if (dpar_array_put_rows(tx, r0, rn, xt)) return digits_fail("test set");

    float *xb = malloc((size_t)batch * NPIX * sizeof(float)), *losses = malloc((size_t)devices * sizeof(float));
    int32_t *yb = malloc((size_t)batch * sizeof(int32_t));
    int steps = ntrain / batch; /* drop the last partial batch: the global batch is constant */
    dpar_shard_map_desc train = { .fn = train_step, .user = &m };
    dpar_shard_map_desc eval = { .fn = digits_eval_step, .user = m.param, .num_args = 3, .args = { tx, th, tl } };
    double epoch_loss = 0.0, acc = 0.0;
    for (int e = 1; e <= epochs; e++) {
        shuffle(train_idx, ntrain);
        double t0 = now_s(), sum = 0.0;
        int64_t b0, bn; /* this process's rows of the global batch */
        if (dpar_array_local_rows(m.x, &b0, &bn)) return digits_fail("batch rows");
        for (int s = 0; s < steps; s++) {
            for (int64_t b = b0; b < b0 + bn; b++) {
                int k = train_idx[s * batch + b];
                memcpy(xb + (size_t)(b - b0) * NPIX, all.x + (size_t)k * NPIX, NPIX * sizeof(float));
                yb[b - b0] = all.y[k];
            }
            if (dpar_array_put_rows(m.x, b0, bn, xb) || dpar_array_put_rows(m.y, b0, bn, yb))
                return digits_fail("batch upload");
            if (dpar_shard_map(mesh, &train)) return digits_fail("train step");
            if (dpar_array_get(m.loss, losses)) return digits_fail("loss");
            sum += losses[0];
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (dpar_shard_map(mesh, &eval) || dpar_array_get(tl, lt)) return digits_fail("eval");
        acc = digits_accuracy(&ds, lt);
        if (proc == 0)
            printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f\n", e, epoch_loss, acc,
                   steps * batch / dt);
        fflush(stdout);
    }
    if (proc == 0)
        printf("final: backend=%s devices=%d epochs=%d test_accuracy=%.4f train_loss=%.8f\n", backend, devices, epochs,
               acc, epoch_loss);
    dpar_runtime_destroy(rt); /* frees the arrays and the mesh too */
    free(xb);
    free(yb);
    free(losses);
    free(xt);
    free(lt);
    digits_free(&ds);
#ifdef DPAR_MPI
    MPI_Finalize();
#endif
    return 0;
}
