/* train_digits.c — the main job: a 64-H-10 MLP on the UCI handwritten digits,
   trained data-parallel over a 1-d mesh axis "data".

   The training step is a graph (dpar_graph): the forward pass on each
   device's shard of the batch (spec ("data", None)) is written once; the
   library appends the backward pass, averages the loss and the gradients
   over "data" (the parameters are replicated over it), and adds the SGD step
   with momentum, so the replicas stay bitwise identical. Each step is one
   dpar_graph_run on the batch staged by dpar_graph_put_feeds, which asks for
   no loss back: the steps queue on the devices (on Vulkan and CUDA the next
   batch uploads while the device runs the last step) and the graph logs each
   step's loss on the device (dpar_graph_log_losses). The host reads the
   logged losses every LOSS_EVERY steps and at each epoch's end, one wait for
   them all, and checks each for NaN by its own step number: a diverging run
   stops naming the step that first went NaN, at most LOSS_EVERY - 1 steps
   after it ran. The printed losses are the same numbers, summed in the same
   order, as a read after every step.

   build/train_digits [--backend cpu|vulkan|cuda] [--devices N] [--epochs N]
                      [--batch N] [--lr X] [--momentum X] [--seed N] [--hidden N]
                      [--data PATH] [--monitor 0|1]
   Ends with exactly one line "final: backend=... devices=... epochs=...
   test_accuracy=... train_loss=..." (train_loss: the mean over the last
   epoch's steps). Exit status 0 on success or after --help (each flag's
   values and default, on stdout); 2 for a bad flag (--lr must be > 0).

   Multi-process: built with -DDPAR_MPI (make build/train_digits_mpi) and run
   as `mpirun -np P build/train_digits_mpi --devices D`, each of the P
   processes opens D/P devices, loads only its own rows of every batch
   (dpar_array_local_rows; dpar_graph_put_feeds reads only this process's
   rows of the global batch), and process 0 prints. */
#include "digits_common.h" /* data, fixed-seed split, RNG, init, flags: shared with the other digits examples */
#ifdef DPAR_MPI
#include <mpi.h>
#define PROG "train_digits_mpi" /* the name in its usage and messages: the program the user ran */
#else
#define PROG "train_digits"
#endif

/* ------------------------------------------------------------------ model */
enum { W1, B1, W2, B2, NPARAM };
enum { LOSS_EVERY = 32 }; /* steps between two reads of the logged losses (and at each epoch's end) */

/* The step as a graph: x [batch, 64] f32 and y [batch] i32 split over "data"; the parameters W1 [64, H], b1 [H],
   W2 [H, 10], b2 [10] replicated. Gradients, their pmean over "data" and the SGD step come from the library. */
static dpar_status build_step(dpar_mesh *mesh, dpar_array *const param[NPARAM], int batch, const dpar_sgd_desc *sgd,
                              dpar_graph **out, dpar_value *x, dpar_value *y) {
    dpar_graph *g;
    dpar_status s = dpar_graph_create(mesh, &g);
    if (s) return s;
    *out = g;
    *x = dpar_g_feed(g, "x",
                     &(dpar_array_desc){ .dtype = DPAR_F32, .ndim = 2, .shape = { batch, NPIX }, .spec = { "data" } });
    *y =
        dpar_g_feed(g, "y", &(dpar_array_desc){ .dtype = DPAR_I32, .ndim = 1, .shape = { batch }, .spec = { "data" } });
    const char *names[NPARAM] = { "W1", "b1", "W2", "b2" };
    dpar_value p[NPARAM], grad[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_g_param(g, names[i], param[i]);
    dpar_value h = dpar_g_relu(g, dpar_g_bias_add(g, dpar_g_matmul(g, *x, p[W1], false, false), p[B1])); /* [b,H] */
    dpar_value logits = dpar_g_bias_add(g, dpar_g_matmul(g, h, p[W2], false, false), p[B2]);             /* [b,10] */
    dpar_value loss = dpar_g_softmax_xent(g, logits, *y); /* this shard's mean; the graph averages it over "data" */
    if ((s = dpar_graph_value_and_grad(g, loss, p, NPARAM, grad))) return s;
    if ((s = dpar_graph_sgd(g, sgd, p, grad, NPARAM))) return s;
    return dpar_graph_compile(g, NULL);
}

int main(int argc, char **argv) {
    int monitor = 0; /* --monitor 1: per-device time shares after each epoch (ex_monitor) */
    digits_opts o = { .backend = "cpu",
                      .path = "examples/data/digits.csv.gz",
                      .devices = 4,
                      .epochs = 30,
                      .batch = 64,
                      .seed = 42,
                      .hidden = 128,
                      .lr = 0.1f,
                      .momentum = 0.9f,
                      .extra = { EX_I("--monitor", &monitor, 0, 1) } };
    int rc = digits_parse(PROG, argc, argv, &o);
    if (rc) return ex_exit_status(rc);
    const char *backend = o.backend;
    int devices = o.devices, epochs = o.epochs, batch = o.batch, hidden = o.hidden;
    float lr = o.lr, momentum = o.momentum;
    if (batch % devices) {
        fprintf(stderr, PROG ": --batch %d is not divisible by --devices %d\n", batch, devices);
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
        fprintf(stderr, PROG ": --devices %d is not divisible by the %d processes\n", devices, nproc);
        MPI_Finalize();
        return 2;
    }
#endif

    /* data: fixed-seed 80/20 split and the initial weights (drawn in this order) */
    digits_setup ds;
    if ((rc = digits_prepare(PROG, &o, &ds))) return rc;
    dataset all = ds.all;
    int ntest = ds.ntest, ntrain = ds.ntrain, *train_idx = ds.train_idx, *test_idx = ds.test_idx;

    /* runtime and mesh */
    dpar_runtime_desc rd = { .num_devices = devices / nproc }; /* this process's devices */
#ifdef DPAR_MPI
    rd.mpi.comm = &world;
#endif
    if (digits_backend(backend, &rd.backend)) {
        fprintf(stderr, PROG ": unknown backend '%s' (cpu, vulkan, cuda)\n", backend);
        return 2;
    }
    dpar_runtime *rt;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    backend = dpar_backend_name(dpar_runtime_backend(rt)); /* what ran: --backend default or '' picks one */
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

    /* model: replicated parameters, He-uniform weights from digits_prepare, zero biases (the same numbers for any
       device count); the step graph over them */
    dpar_array *param[NPARAM];
    int64_t pshape[NPARAM][2] = { { NPIX, hidden }, { hidden, 0 }, { hidden, NCLASS }, { NCLASS, 0 } };
    for (int i = 0; i < NPARAM; i++)
        if (digits_array(mesh, DPAR_F32, pshape[i][1] ? 2 : 1, pshape[i][0], pshape[i][1], NULL, NULL, &param[i]))
            return digits_fail("parameters");
    if (dpar_array_put(param[W1], ds.w1) || dpar_array_put(param[W2], ds.w2)) return digits_fail("init");
    dpar_graph *step = NULL;
    dpar_value fx, fy;
    if (build_step(mesh, param, batch, &(dpar_sgd_desc){ .learning_rate = lr, .momentum = momentum }, &step, &fx, &fy))
        return digits_fail("step graph");
    if (dpar_graph_log_losses(step, LOSS_EVERY)) return digits_fail("loss log");

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

    float *xb = malloc((size_t)batch * NPIX * sizeof(float)), losses[LOSS_EVERY];
    int32_t *yb = malloc((size_t)batch * sizeof(int32_t));
    dpar_graph_feed feeds[2] = { { .value = fx, .host = xb }, { .value = fy, .host = yb } };
    int steps = ntrain / batch; /* drop the last partial batch: the global batch is constant */
    dpar_shard_map_desc eval = { .fn = digits_eval_step, .user = param, .num_args = 3, .args = { tx, th, tl } };
    double epoch_loss = 0.0, acc = 0.0;
    if (monitor) dpar_runtime_stats_reset(rt); /* the first window starts with training */
    for (int e = 1; e <= epochs; e++) {
        shuffle(train_idx, ntrain);
        double t0 = now_s(), sum = 0.0;
        int64_t b0, bn; /* this process's rows of the global batch */
        if (dpar_array_local_rows(dpar_graph_feed_array(step, fx), &b0, &bn)) return digits_fail("batch rows");
        for (int s = 0, logged = 0; s < steps; s++) {
            for (int64_t b = b0; b < b0 + bn; b++) { /* at their places in the global batch */
                int k = train_idx[s * batch + b];
                memcpy(xb + (size_t)b * NPIX, all.x + (size_t)k * NPIX, NPIX * sizeof(float));
                yb[b] = all.y[k];
            }
            if (dpar_graph_put_feeds(step, feeds, 2)) return digits_fail("batch upload");
            if (dpar_graph_run(step, NULL, 0, NULL)) return digits_fail("train step");
            if (++logged < LOSS_EVERY && s + 1 < steps) continue;
            if (dpar_graph_losses(step, losses, logged)) return digits_fail("train loss");
            for (int i = 0; i < logged; i++) { /* steps s + 1 - logged .. s */
                long long at = (long long)(e - 1) * steps + s + 2 - logged + i;
                if (ex_check_loss(PROG, losses[i], at, e, lr)) return 1;
                sum += losses[i];
            }
            logged = 0;
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (dpar_shard_map(mesh, &eval) || dpar_array_get(tl, lt)) return digits_fail("eval");
        acc = digits_accuracy(&ds, lt);
        if (proc == 0)
            printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f\n", e, epoch_loss, acc,
                   steps * batch / dt);
        if (monitor) ex_monitor(rt);
        fflush(stdout);
    }
    if (proc == 0)
        printf("final: backend=%s devices=%d epochs=%d test_accuracy=%.4f train_loss=%.8f\n", backend, devices, epochs,
               acc, epoch_loss);
    dpar_graph_destroy(step);
    dpar_runtime_destroy(rt); /* frees the arrays and the mesh too */
    free(xb);
    free(yb);
    free(xt);
    free(lt);
    digits_free(&ds);
#ifdef DPAR_MPI
    MPI_Finalize();
#endif
    return 0;
}
