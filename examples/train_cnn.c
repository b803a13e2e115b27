/* train_cnn.c — the main job: the seed material's CNN on 5,000 MNIST images,
   trained data-parallel over a 1-d mesh axis "data" with dpar's graph API.

     Conv(32, 3x3, SAME) -> ReLU -> avg_pool 2x2 -> Conv(64, 3x3, SAME) -> ReLU
     -> avg_pool 2x2 -> flatten -> Dense(256) -> ReLU -> Dense(10),
     softmax cross-entropy; NHWC 28x28x1 inputs in [0, 1]; 824,458 parameters.

   The forward pass is written once as a graph of the per-device program; the
   graph appends the backward pass itself (value_and_grad), reduces every
   gradient over "data" (the parameters are replicated there) and applies
   AdamW (or SGD) to every parameter, so a step is one dispatch: batch in,
   loss out. The replicas stay bitwise identical.

   build/train_cnn [--backend cpu|vulkan|cuda] [--devices N] [--epochs N]
                   [--batch N] [--lr X] [--weight-decay X] [--momentum X]
                   [--optimizer adamw|sgd] [--seed N] [--steps N] [--data PATH]
                   [--checkpoint PATH] [--resume PATH] [--remat 0|1] [--memory 0|1] [--monitor 0|1]
   Defaults: cpu, 4 devices, 10 epochs, global batch 64, AdamW lr 1e-3 weight
   decay 1e-4 (optax semantics: the decay is multiplied by lr), seed 42;
   --optimizer sgd: lr 0.05, momentum 0.9.
   --steps N caps the steps per epoch (quick checks).
   --checkpoint PATH saves the training state (params, AdamW moments or SGD
   momentum, step counter: dpar_graph_save) at the end of every epoch,
   atomically: a crash leaves the previous epoch's file. --resume PATH
   continues from such a file with the flags it was trained with (the file
   holds them: another --batch, steps per epoch, --seed, --optimizer, --lr,
   --weight-decay, --momentum or --data contents (a hash of the rows) is
   refused, naming both values and the flags
   to pass, e.g. "--optimizer sgd --lr 0.05 --momentum 0.9"): its epochs
   are skipped (their shuffles replayed), and the epochs after it print what
   an uninterrupted run prints, bit for bit on the CPU backend.
   --remat 1 makes each conv block a remat segment (recomputed in the
   backward: less memory, the same losses); --memory 1 prints after the
   first step the training graph's measured peak on device 0 against its
   planned live set (one "memory:" line, ex_memory_report).
   Ends with exactly one line
   "final: backend=cpu devices=4 model=cnn data=mnist_5k.csv.gz epochs=10
   test_accuracy=... train_loss=..." (data: the --data file's name; train_loss:
   the mean over the last epoch's steps). Exit status 0 on success; 0 after
   --help (each flag's values and default, on stdout); 2 for a bad flag.

   The data, split, batch order and initial weights come from one splitmix64
   stream (mnist_common.h); bench/peers/cnn_jax.py and cnn_torch.py draw the
   same, so the three start from identical weights and see identical batches. */
#include "mnist_common.h"    /* the data, its fixed-seed split, splitmix64, now_s */
#include "util/dpar_train.h" /* dpar_graph_save, dpar_graph_restore */

/* ------------------------------------------------------------------ flags */
typedef struct {
    const char *backend, *path, *optimizer, *checkpoint, *resume;
    int devices, epochs, batch, seed, steps;
    int monitor; /* --monitor 1: per-device time shares after each epoch (ex_monitor) */
    int remat;   /* --remat 1: each conv block a remat segment */
    int memory;  /* --memory 1: the training graph's measured memory against its plan (ex_memory_report) */
    float lr, weight_decay, momentum;
} cnn_opts;

/* Parses the flags into o (defaults already there; ex_parse); 0 on success,
   EX_HELP after --help, 2 on a usage error (main returns ex_exit_status). */
static int cnn_parse(int argc, char **argv, cnn_opts *o) {
    const ex_flag f[] = { EX_S("--backend", &o->backend, "cpu|vulkan|cuda"),
                          EX_S("--data", &o->path, "a CSV file of 784 pixels and a label per row, gzip'd or plain"),
                          EX_S("--optimizer", &o->optimizer, "adamw|sgd"),
                          EX_I("--devices", &o->devices, 1, DPAR_MAX_DEVICES),
                          EX_I("--epochs", &o->epochs, 1, INT_MAX),
                          EX_I("--batch", &o->batch, 1, INT_MAX),
                          EX_I("--seed", &o->seed, INT_MIN, INT_MAX),
                          EX_FLAG("--steps", EX_INT, &o->steps, 0, INT_MAX, "an integer >= 0: the steps per epoch",
                                  "0: whole epochs"),
                          EX_FLAG("--lr", EX_FLOAT, &o->lr, 0, 0, "a finite number > 0", "0.001 (adamw), 0.05 (sgd)"),
                          EX_F("--weight-decay", &o->weight_decay, "a finite number >= 0"),
                          EX_F("--momentum", &o->momentum, "a number in [0, 1) (sgd)"),
                          EX_I("--monitor", &o->monitor, 0, 1),
                          EX_I("--remat", &o->remat, 0, 1),
                          EX_I("--memory", &o->memory, 0, 1),
                          EX_S("--checkpoint", &o->checkpoint, "a file path to write"),
                          EX_S("--resume", &o->resume, "a file --checkpoint wrote") };
    int r = ex_parse("train_cnn", argc, argv, f, (int)(sizeof f / sizeof f[0]));
    if (r) return r;
    if (o->resume && !*o->resume) { /* refused here, not after the data is loaded */
        fprintf(stderr, "train_cnn: --resume '': give the path of a file --checkpoint wrote\n");
        return 2;
    }
    if (MNIST_NTEST % o->devices) { /* no --batch helps then: say which device counts do */
        fprintf(stderr,
                "train_cnn: --devices %d must divide the %d test images (each device evaluates an equal share); "
                "use 1, 2, 4, 5, 8 or another divisor of %d\n",
                o->devices, MNIST_NTEST, MNIST_NTEST);
        return 2;
    }
    if (o->batch % o->devices) {
        fprintf(stderr, "train_cnn: --batch %d must be divisible by --devices %d (each device gets whole images)\n",
                o->batch, o->devices);
        return 2;
    }
    if (strcmp(o->optimizer, "adamw") && strcmp(o->optimizer, "sgd")) {
        fprintf(stderr, "train_cnn: --optimizer %s: use adamw or sgd\n", o->optimizer);
        return 2;
    }
    if (!ex_given(argc, argv, "--lr")) o->lr = strcmp(o->optimizer, "sgd") ? 1e-3f : 0.05f; /* the optimizer's */
    if (ex_check_lr("train_cnn", "--lr", o->lr, 1) || ex_check_lr("train_cnn", "--weight-decay", o->weight_decay, 0))
        return 2;
    if (!(o->momentum >= 0.0f && o->momentum < 1.0f)) {
        fprintf(stderr, "train_cnn: --momentum %g: must be in [0, 1)\n", (double)o->momentum);
        return 2;
    }
    if (o->checkpoint && ex_check_writable("train_cnn", "--checkpoint", o->checkpoint)) return 2;
    return 0;
}

/* ------------------------------------------------------------------ model */
enum { C1W, C1B, C2W, C2B, D1W, D1B, D2W, D2B, NPARAM };
static const char *const param_name[NPARAM] = { "conv1.w",  "conv1.b",  "conv2.w",  "conv2.b",
                                                "dense1.w", "dense1.b", "dense2.w", "dense2.b" };
static const int param_ndim[NPARAM] = { 4, 1, 4, 1, 2, 1, 2, 1 };
static const int64_t param_shape[NPARAM][4] = { { 3, 3, 1, 32 }, { 32 },  { 3, 3, 32, 64 }, { 64 },
                                                { 3136, 256 },   { 256 }, { 256, NCLASS },  { NCLASS } };

/* Replicated parameters; weights LeCun-uniform (bound sqrt(3 / fan_in), the
   variance of flax's lecun_normal) drawn in order from the seeded stream,
   biases zero. *count gets the number of parameters. */
static dpar_status cnn_params(dpar_mesh *mesh, dpar_array *p[NPARAM], int64_t *count) {
    *count = 0;
    for (int i = 0; i < NPARAM; i++) {
        dpar_array_desc d = { .dtype = DPAR_F32, .ndim = param_ndim[i] };
        int64_t n = 1;
        for (int k = 0; k < d.ndim; k++) n *= d.shape[k] = param_shape[i][k];
        dpar_status s = dpar_array_create(mesh, &d, &p[i]);
        if (s) return s;
        *count += n;
        if (d.ndim == 1) continue; /* biases: zero */
        float *w = malloc((size_t)n * sizeof(float));
        if (!w) return DPAR_ERR_OUT_OF_MEMORY;
        float bound = sqrtf(3.0f / (float)(n / d.shape[d.ndim - 1]));
        for (int64_t k = 0; k < n; k++) w[k] = (2.0f * rng_uniform() - 1.0f) * bound;
        s = dpar_array_put(p[i], w);
        free(w);
        if (s) return s;
    }
    return DPAR_OK;
}

/* The logits [b, 10] of this device's images x [b, 28, 28, 1] (NHWC); remat: each conv block a segment
   (errors stay in the graph). */
static dpar_value cnn_forward(dpar_graph *g, const dpar_value p[NPARAM], dpar_value x, int64_t b, bool remat) {
    const dpar_pool2d_desc pool = { .window = { 2, 2 }, .stride = { 2, 2 } };
    if (remat) dpar_graph_remat_begin(g);
    dpar_value h = dpar_g_relu(g, dpar_g_conv2d(g, x, p[C1W], p[C1B], NULL)); /* [b, 28, 28, 32], SAME */
    h = dpar_g_avg_pool2d(g, h, &pool);                                       /* [b, 14, 14, 32] */
    if (remat) dpar_graph_remat_end(g), dpar_graph_remat_begin(g);
    h = dpar_g_relu(g, dpar_g_conv2d(g, h, p[C2W], p[C2B], NULL)); /* [b, 14, 14, 64] */
    h = dpar_g_avg_pool2d(g, h, &pool);                            /* [b, 7, 7, 64] */
    if (remat) dpar_graph_remat_end(g);
    h = dpar_g_reshape(g, h, 2, (int64_t[]){ b, 7 * 7 * 64 });                                 /* flatten (h, w, c) */
    h = dpar_g_relu(g, dpar_g_bias_add(g, dpar_g_matmul(g, h, p[D1W], false, false), p[D1B])); /* [b, 256] */
    return dpar_g_bias_add(g, dpar_g_matmul(g, h, p[D2W], false, false), p[D2B]);              /* [b, 10] */
}

/* The training step as a graph: feeds x [batch, 28, 28, 1] and y [batch]
   split over "data", the mean cross-entropy, its gradients (reduced over
   "data" by the graph: the parameters are replicated there) and the
   optimizer's update of every parameter. */
static dpar_status cnn_train_graph(dpar_mesh *mesh, dpar_array *const param[NPARAM], const cnn_opts *o,
                                   dpar_graph **out, dpar_value *x, dpar_value *y, dpar_graph_stats *st) {
    dpar_graph *g;
    dpar_status s = dpar_graph_create(mesh, &g);
    if (s) return s;
    *out = g;
    *x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_F32, 4, { o->batch, MNIST_SIDE, MNIST_SIDE, 1 }, { "data" } });
    *y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { o->batch }, { "data" } });
    dpar_value p[NPARAM], grad[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_g_param(g, param_name[i], param[i]);
    dpar_value loss = dpar_g_softmax_xent(g, cnn_forward(g, p, *x, o->batch / o->devices, o->remat != 0), *y);
    if ((s = dpar_graph_value_and_grad(g, loss, p, NPARAM, grad))) return s;
    if (!strcmp(o->optimizer, "sgd"))
        s = dpar_graph_sgd(
            g, &(dpar_sgd_desc){ .learning_rate = o->lr, .momentum = o->momentum, .weight_decay = o->weight_decay }, p,
            grad, NPARAM);
    else
        s = dpar_graph_adamw(g, &(dpar_adamw_desc){ .learning_rate = o->lr, .weight_decay = o->weight_decay }, p, grad,
                             NPARAM);
    return s ? s : dpar_graph_compile(g, st);
}

/* The test set's forward pass: feed x [1000, 28, 28, 1] split over "data", kept logits. */
static dpar_status cnn_eval_graph(dpar_mesh *mesh, dpar_array *const param[NPARAM], int devices, dpar_graph **out,
                                  dpar_value *x, dpar_value *logits) {
    dpar_graph *g;
    dpar_status s = dpar_graph_create(mesh, &g);
    if (s) return s;
    *out = g;
    *x = dpar_g_feed(g, "x_test",
                     &(dpar_array_desc){ DPAR_F32, 4, { MNIST_NTEST, MNIST_SIDE, MNIST_SIDE, 1 }, { "data" } });
    dpar_value p[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_g_param(g, param_name[i], param[i]);
    *logits = cnn_forward(g, p, *x, MNIST_NTEST / devices, false);
    if ((s = dpar_graph_keep(g, *logits))) return s;
    return dpar_graph_compile(g, NULL);
}

/* Test accuracy: the eval graph on x_test, argmax of every device's logits against the labels. */
static dpar_status cnn_accuracy(dpar_graph *g, dpar_value x, dpar_value logits, const float *x_test,
                                const int32_t *y_test, int devices, float *logit_buf, double *acc) {
    dpar_status s = dpar_graph_run(g, &(dpar_graph_feed){ .value = x, .host = x_test }, 1, NULL);
    int per = MNIST_NTEST / devices, correct = 0;
    for (int d = 0; d < devices && !s; d++)
        s = dpar_graph_read_shard(g, logits, d, logit_buf + (size_t)(d * per * NCLASS));
    if (s) return s;
    for (int i = 0; i < MNIST_NTEST; i++) {
        const float *l = logit_buf + (size_t)i * NCLASS;
        int best = 0;
        for (int c = 1; c < NCLASS; c++)
            if (l[c] > l[best]) best = c;
        correct += best == y_test[i];
    }
    *acc = (double)correct / MNIST_NTEST;
    return DPAR_OK;
}

/* ------------------------------------------------------------- run shape */
/* What decides the schedule and the updates of a run, saved with the
   training state (dpar_graph_save_extra) so that --resume refuses other
   flags instead of skipping or replaying the wrong epochs: the global batch,
   the steps per epoch, the seed (the data split and every epoch's order),
   the optimizer and its hyper-parameters, and a hash of the --data rows
   (another file splits and batches differently). Two small replicated
   arrays, "train_cnn.run" (i32) and "train_cnn.hyper" (f32). */
enum { RUN_BATCH, RUN_STEPS, RUN_SEED, RUN_OPT, RUN_DATA, NRUN };
enum { HYP_LR, HYP_WD, HYP_MOM, NHYP };
typedef struct {
    int32_t run[NRUN];
    float hyp[NHYP];
} cnn_shape;

/* FNV-1a (32 bits) of the loaded rows, pixels and labels: which data a checkpoint was trained on. */
static int32_t cnn_data_hash(const dataset *d) {
    uint32_t h = 2166136261u;
    const unsigned char *p[2] = { (const unsigned char *)d->x, (const unsigned char *)d->y };
    size_t n[2] = { (size_t)d->n * MNIST_PIX * sizeof(float), (size_t)d->n * sizeof(int32_t) };
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < n[k]; i++) h = (h ^ p[k][i]) * 16777619u;
    return (int32_t)(h & 0x7fffffff); /* an i32 array holds it */
}

static cnn_shape cnn_shape_of(const cnn_opts *o, int steps, const dataset *data) {
    int sgd = !strcmp(o->optimizer, "sgd");
    return (cnn_shape){ { o->batch, steps, o->seed, sgd, cnn_data_hash(data) },
                        { o->lr, o->weight_decay, sgd ? o->momentum : 0.0f } };
}

/* The arrays of the shape, holding `sh`, and their checkpoint entries. */
static dpar_status cnn_shape_entries(dpar_mesh *mesh, const cnn_shape *sh, dpar_checkpoint_entry e[2]) {
    dpar_array *run = NULL, *hyp = NULL;
    dpar_status s = dpar_array_create(mesh, &(dpar_array_desc){ DPAR_I32, 1, { NRUN }, { NULL } }, &run);
    if (!s) s = dpar_array_create(mesh, &(dpar_array_desc){ DPAR_F32, 1, { NHYP }, { NULL } }, &hyp);
    if (!s) s = dpar_array_put(run, sh->run);
    if (!s) s = dpar_array_put(hyp, sh->hyp);
    e[0] = (dpar_checkpoint_entry){ "train_cnn.run", run, false };
    e[1] = (dpar_checkpoint_entry){ "train_cnn.hyper", hyp, false };
    return s;
}

/* The shape `got` saved in o->resume against this run's `want`: 0 when they
   agree, else prints every difference, naming the flag and both values, then
   the flags to pass ("--optimizer sgd --lr 0.05 --momentum 0.9"), and
   returns 2. An AdamW file's momentum is not compared (AdamW has none: the
   difference is the optimizer's, named once). */
static int cnn_check_shape(const cnn_opts *o, const cnn_shape *got, const cnn_shape *want) {
    static const char *const run_flag[NRUN] = { "--batch", "steps per epoch (--steps, --batch)", "--seed",
                                                "--optimizer", "--data" };
    static const char *const run_pass[NRUN] = { "--batch", "--steps", "--seed", "--optimizer", "--data" };
    static const char *const hyp_flag[NHYP] = { "--lr", "--weight-decay", "--momentum" };
    static const char *const opt_name[2] = { "adamw", "sgd" };
    char fix[256] = "";
    size_t at = 0;
    int bad = 0;
    for (int k = 0; k < NRUN; k++) {
        if (got->run[k] == want->run[k]) continue;
        bad++;
        if (k == RUN_OPT && (unsigned)got->run[k] < 2) {
            fprintf(stderr, "train_cnn: --resume %s was trained with --optimizer %s; this run asks for %s\n", o->resume,
                    opt_name[got->run[k]], opt_name[want->run[k]]);
            at += (size_t)snprintf(fix + at, sizeof fix - at, " --optimizer %s", opt_name[got->run[k]]);
            continue;
        }
        if (k == RUN_DATA) { /* no flag value to pass: the file is not recorded, only its rows' hash */
            fprintf(stderr,
                    "train_cnn: --resume %s was trained on other data (rows hash %08x) than --data %s (%08x); give "
                    "the --data file it was trained on\n",
                    o->resume, (unsigned)got->run[k], o->path, (unsigned)want->run[k]);
            continue;
        }
        fprintf(stderr, "train_cnn: --resume %s was trained with %s %d; this run asks for %d\n", o->resume, run_flag[k],
                (int)got->run[k], (int)want->run[k]);
        if (k != RUN_OPT) at += (size_t)snprintf(fix + at, sizeof fix - at, " %s %d", run_pass[k], (int)got->run[k]);
    }
    for (int k = 0; k < NHYP; k++) {
        if (got->hyp[k] == want->hyp[k] || (k == HYP_MOM && got->run[RUN_OPT] == 0)) continue;
        bad++;
        fprintf(stderr, "train_cnn: --resume %s was trained with %s %g; this run asks for %g\n", o->resume, hyp_flag[k],
                (double)got->hyp[k], (double)want->hyp[k]);
        at += (size_t)snprintf(fix + at, sizeof fix - at, " %s %g", hyp_flag[k], (double)got->hyp[k]);
    }
    if (at) fprintf(stderr, "train_cnn: resume with the flags %s was trained with:%s\n", o->resume, fix);
    return bad ? 2 : 0;
}

/* ------------------------------------------------------------------ resume */
/* Restores the training graph from o->resume, checks the run's shape saved
   with it, and replays the shuffles of the epochs it covers, so the next
   epoch sees the batches an uninterrupted run sees; *first gets the next
   epoch. 0 on success, else main's exit status. */
static int cnn_resume(dpar_graph *train, const cnn_opts *o, const dpar_checkpoint_entry shape[2], const cnn_shape *want,
                      int steps, mnist_data *md, int *first) {
    cnn_shape got; /* first the shape: another --optimizer is named as such, not as missing state */
    int have = !dpar_checkpoint_restore(o->resume, shape, 2, NULL) && !dpar_array_get(shape[0].array, got.run) &&
               !dpar_array_get(shape[1].array, got.hyp);
    int rc = have ? cnn_check_shape(o, &got, want) : 0;
    if (rc) return rc;
    if (dpar_graph_restore(train, o->resume)) return digits_fail("--resume"); /* a missing or corrupt file */
    if (!have) {
        fprintf(stderr,
                "train_cnn: --resume %s holds no run shape (batch, steps per epoch, seed, optimizer); it was "
                "saved by an older train_cnn: start a new run with --checkpoint\n",
                o->resume);
        return 2;
    }
    long long done = (long long)dpar_graph_step(train);
    if (done % steps) {
        fprintf(stderr,
                "train_cnn: %s was saved after step %lld, not at the end of an epoch of %d steps; resume with "
                "the --batch and --steps it was trained with\n",
                o->resume, done, steps);
        return 2;
    }
    if (done / steps >= o->epochs) {
        fprintf(stderr, "train_cnn: %s holds %lld epoch(s) already; ask for more with --epochs\n", o->resume,
                done / steps);
        return 2;
    }
    for (long long e = 0; e < done / steps; e++) shuffle(md->train_idx, md->ntrain);
    *first = (int)(done / steps) + 1;
    printf("resumed from %s: %d epoch(s), %lld steps done\n", o->resume, *first - 1, done);
    return 0;
}

/* ------------------------------------------------------------------ main */
int main(int argc, char **argv) {
    cnn_opts o = { .backend = "cpu",
                   .path = "examples/data/mnist_5k.csv.gz",
                   .optimizer = "adamw",
                   .devices = 4,
                   .epochs = 10,
                   .batch = 64,
                   .seed = 42,
                   .weight_decay = 1e-4f,
                   .momentum = 0.9f };
    int rc = cnn_parse(argc, argv, &o);
    if (rc) return ex_exit_status(rc);
    digits_prog = "train_cnn";
    dpar_runtime_desc rd = { .num_devices = o.devices };
    if (dpar_backend_from_name(o.backend, &rd.backend)) {
        fprintf(stderr, "train_cnn: %s\n", dpar_last_error());
        return 2;
    }
    /* data: the fixed-seed split, then the weights, then each epoch's order, all from one stream */
    mnist_data md;
    if (mnist_prepare("train_cnn", o.path, (uint64_t)o.seed, &md)) return 1;
    if (ex_check_batch("train_cnn", o.batch, md.ntrain, "training images")) return 2; /* before any allocation */
    dpar_runtime *rt;
    dpar_mesh *mesh;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    o.backend = dpar_backend_name(dpar_runtime_backend(rt)); /* what ran: --backend default or '' picks one */
    if (dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { o.devices }, .axis_names = { "data" } }, &mesh))
        return digits_fail("mesh");
    dpar_array *param[NPARAM];
    int64_t nparam;
    if (cnn_params(mesh, param, &nparam)) return digits_fail("parameters");

    dpar_graph *train, *eval;
    dpar_value x, y, xt, logits;
    dpar_graph_stats gs;
    ex_memory mem = { .base = ex_memory_now(rt, 0) };
    if (cnn_train_graph(mesh, param, &o, &train, &x, &y, &gs)) return digits_fail("training graph");
    mem.graph = ex_memory_now(rt, 0) - mem.base;
    if (cnn_eval_graph(mesh, param, o.devices, &eval, &xt, &logits)) return digits_fail("test graph");
    dpar_device_info info;
    dpar_runtime_device_info(rt, 0, &info);
    int steps = md.ntrain / o.batch; /* drop the last partial batch: the global batch is constant */
    if (o.steps && o.steps < steps) steps = o.steps;
    printf("backend %s, %d device%s: %s\n", o.backend, o.devices, o.devices == 1 ? "" : "s", info.name);
    printf("data: %d train, %d test images; CNN, %lld parameters; batch %d (%d per device), %d steps per epoch; "
           "%s lr %g weight decay %g\n",
           md.ntrain, md.ntest, (long long)nparam, o.batch, o.batch / o.devices, steps, o.optimizer, (double)o.lr,
           (double)o.weight_decay);

    float *xb = malloc((size_t)o.batch * MNIST_PIX * sizeof(float));
    float *x_test = malloc((size_t)MNIST_NTEST * MNIST_PIX * sizeof(float));
    float *logit_buf = malloc((size_t)MNIST_NTEST * NCLASS * sizeof(float));
    int32_t *yb = malloc((size_t)o.batch * sizeof(int32_t)), *y_test = malloc(MNIST_NTEST * sizeof(int32_t));
    mnist_gather(&md, md.test_idx, MNIST_NTEST, x_test, y_test);
    cnn_shape shape = cnn_shape_of(&o, steps, &md.all);
    dpar_checkpoint_entry shape_entry[2];
    if (cnn_shape_entries(mesh, &shape, shape_entry)) return digits_fail("run shape");
    int first = 1;
    if (o.resume && (rc = cnn_resume(train, &o, shape_entry, &shape, steps, &md, &first))) return rc;
    double epoch_loss = 0.0, acc = 0.0;
    if (o.monitor) dpar_runtime_stats_reset(rt); /* the first window starts with training */
    for (int e = first; e <= o.epochs; e++) {
        shuffle(md.train_idx, md.ntrain);
        double t0 = now_s(), shown = t0, sum = 0.0;
        for (int s = 0; s < steps; s++) {
            float loss;
            mnist_gather(&md, md.train_idx + (size_t)s * (size_t)o.batch, o.batch, xb, yb);
            dpar_graph_feed feeds[2] = { { .value = x, .host = xb }, { .value = y, .host = yb } };
            bool first_step = o.memory && e == first && !s;
            if (first_step) mem.step = ex_memory_now(rt, 1); /* a stats window for the first step */
            if (dpar_graph_run(train, feeds, 2, &loss)) return digits_fail("train step");
            if (first_step) ex_memory_report(rt, &mem, &gs);
            if (ex_check_loss("train_cnn", loss, (long long)(e - 1) * steps + s + 1, e, o.lr)) return 1;
            sum += loss;
            if (now_s() - shown > 5.0) { /* a progress line when an epoch is slow */
                shown = now_s();
                printf("  epoch %d step %d/%d  loss %.6f  samples/s %.0f\n", e, s + 1, steps, sum / (s + 1),
                       (s + 1) * o.batch / (shown - t0));
                fflush(stdout);
            }
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (cnn_accuracy(eval, xt, logits, x_test, y_test, o.devices, logit_buf, &acc)) return digits_fail("test");
        /* dt: the epoch's steps (batches gathered, put, run, the loss read each step), not the test pass */
        printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f  ms/step %.3f\n", e, epoch_loss, acc,
               steps * o.batch / dt, 1e3 * dt / steps);
        if (o.monitor) ex_monitor(rt);
        fflush(stdout);
        if (o.checkpoint && dpar_graph_save_extra(train, o.checkpoint, shape_entry, 2))
            return digits_fail("--checkpoint");
    }
    printf("final: backend=%s devices=%d model=cnn data=%s epochs=%d test_accuracy=%.4f train_loss=%.8f\n", o.backend,
           o.devices, ex_basename(o.path), o.epochs, acc, epoch_loss);
    dpar_graph_destroy(eval);
    dpar_graph_destroy(train);
    dpar_runtime_destroy(rt); /* frees the arrays and the mesh too */
    free(xb);
    free(yb);
    free(x_test);
    free(y_test);
    free(logit_buf);
    mnist_free(&md);
    return 0;
}
