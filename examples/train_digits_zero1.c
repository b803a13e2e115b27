/* train_digits_zero1.c — the digits MLP, data-parallel over "data", with the
   optimizer state sharded ZeRO-1 style (dpar_zero1_*).

   Each step every device runs forward and backward on its shard of the
   global batch (as train_digits.c). Then, instead of pmean'ing the gradients
   and updating a full replica of every parameter and momentum buffer,
   dpar_zero1_step reduce-scatters the gradients over "data" (each device gets
   the mean of 1/N of every parameter, zero-padded to a multiple of N), updates
   only that block of the parameters and of the momentum, and all-gathers the
   parameters back. Momentum memory per device falls by N; the loss trajectory
   is the one of plain data parallelism (tests/test_parallel_examples.sh
   compares it with build/train_digits --devices 1).

   build/train_digits_zero1 [--backend cpu|vulkan|cuda] [--devices N] [--epochs N]
                            [--batch N] [--lr X] [--momentum X] [--seed N] [--hidden N]
                            [--data PATH] [--checkpoint-epoch E]
   --checkpoint-epoch E saves parameters and the sharded optimizer state
   after epoch E ($TMPDIR or /tmp, dpar_zero1_<pid>.ckpt, removed afterwards), then restores them into fresh state and
   continues from there: the later epochs must be the same bit for bit. */
#include "digits_common.h"
#include "util/dpar_train.h"
#include <unistd.h>

enum { W1, B1, W2, B2, NPARAM };
typedef struct {
    dpar_array *param[NPARAM], *grad[NPARAM];                     /* replicated */
    dpar_array *x, *y, *h_pre, *h, *logits, *dlogits, *dh, *loss; /* split over "data" */
    dpar_zero1 *zero;
} model;

static dpar_status train_step(dpar_ctx *ctx, void *user) {
    model *m = user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *p[NPARAM], *g[NPARAM];
    for (int i = 0; i < NPARAM; i++) {
        p[i] = dpar_array_shard(m->param[i], dev);
        g[i] = dpar_array_shard(m->grad[i], dev);
    }
    dpar_buffer *x = dpar_array_shard(m->x, dev), *y = dpar_array_shard(m->y, dev);
    dpar_buffer *h_pre = dpar_array_shard(m->h_pre, dev), *h = dpar_array_shard(m->h, dev);
    dpar_buffer *logits = dpar_array_shard(m->logits, dev), *dlogits = dpar_array_shard(m->dlogits, dev);
    dpar_buffer *dh = dpar_array_shard(m->dh, dev), *loss = dpar_array_shard(m->loss, dev);
    TRY(digits_forward(p, x, h_pre, h, logits));
    TRY(dpar_softmax_xent(loss, dlogits, logits, y));
    TRY(dpar_matmul(g[W2], h, dlogits, true, false, 1.0f, 0.0f));
    TRY(dpar_bias_grad(g[B2], dlogits, 0.0f));
    TRY(dpar_matmul(dh, dlogits, p[W2], false, true, 1.0f, 0.0f));
    TRY(dpar_relu_backward(dh, dh, h_pre));
    TRY(dpar_matmul(g[W1], x, dh, true, false, 1.0f, 0.0f));
    TRY(dpar_bias_grad(g[B1], dh, 0.0f));
    TRY(dpar_pmean(ctx, loss, loss, "data"));
    /* ZeRO-1: reduce-scatter, update the local block, all-gather */
    TRY(dpar_zero1_step(ctx, m->zero, g));
    return DPAR_OK;
}

/* The checkpoint: parameters (replicated) and ZeRO-1 state (sharded, padded). */
static int checkpoint_entries(model *m, dpar_checkpoint_entry *e) {
    static const char *pn[NPARAM] = { "w1", "b1", "w2", "b2" };
    static char names[2 * NPARAM][16];
    int n = 0;
    for (int i = 0; i < NPARAM; i++) {
        e[n].name = pn[i];
        e[n].array = m->param[i];
        e[n].padded = false;
        n++;
    }
    for (int i = 0; i < NPARAM; i++) {
        snprintf(names[2 * i], sizeof names[0], "%s.master", pn[i]);
        e[n].name = names[2 * i];
        e[n].array = dpar_zero1_master(m->zero, i);
        e[n].padded = true;
        n++;
        if (dpar_zero1_momentum(m->zero, i)) {
            snprintf(names[2 * i + 1], sizeof names[0], "%s.momentum", pn[i]);
            e[n].name = names[2 * i + 1];
            e[n].array = dpar_zero1_momentum(m->zero, i);
            e[n].padded = true;
            n++;
        }
    }
    return n;
}

int main(int argc, char **argv) {
    int ckpt_epoch = 0;
    digits_opts o = {
        "cpu", "examples/data/digits.csv.gz", 4, 30, 64, 42, 128, 0.1f, 0.9f, { "--checkpoint-epoch" }, { &ckpt_epoch }
    };
    int rc = digits_parse("train_digits_zero1", argc, argv, &o);
    if (rc) return rc;
    if (o.batch % o.devices) {
        fprintf(stderr, "train_digits_zero1: --batch %d is not divisible by --devices %d\n", o.batch, o.devices);
        return 2;
    }
    digits_setup ds;
    if (digits_prepare("train_digits_zero1", &o, &ds)) return 1;
    int devices = o.devices, batch = o.batch, hidden = o.hidden;

    dpar_runtime_desc rd = { .num_devices = devices };
    if (digits_backend(o.backend, &rd.backend)) {
        fprintf(stderr, "train_digits_zero1: unknown backend '%s'\n", o.backend);
        return 2;
    }
    dpar_runtime *rt;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    dpar_mesh *mesh;
    dpar_mesh_desc md = { .ndim = 1, .shape = { devices }, .axis_names = { "data" } };
    if (dpar_mesh_create(rt, &md, &mesh)) return digits_fail("mesh");
    printf("backend %s, %d device(s), ZeRO-1 over \"data\"\n", o.backend, devices);
    printf("data: %d train, %d test images; MLP 64-%d-10, batch %d (%d per device), lr %g, momentum %g\n", ds.ntrain,
           ds.ntest, hidden, batch, batch / devices, (double)o.lr, (double)o.momentum);

    model m;
    memset(&m, 0, sizeof m);
    int64_t pshape[NPARAM][2] = { { NPIX, hidden }, { hidden, 0 }, { hidden, NCLASS }, { NCLASS, 0 } };
    for (int i = 0; i < NPARAM; i++) {
        int nd = pshape[i][1] ? 2 : 1;
        if (digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], NULL, NULL, &m.param[i]) ||
            digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], NULL, NULL, &m.grad[i]))
            return digits_fail("parameters");
    }
    if (dpar_array_put(m.param[W1], ds.w1) || dpar_array_put(m.param[W2], ds.w2)) return digits_fail("init");
    dpar_zero1_desc zd = {
        .sgd.learning_rate = o.lr, .sgd.momentum = o.momentum, .axis = "data", .num_params = NPARAM
    };
    for (int i = 0; i < NPARAM; i++) zd.params[i] = m.param[i];
    if (dpar_zero1_create(&zd, &m.zero)) return digits_fail("zero1");

    /* momentum memory per device: measured from the buffers each holds */
    {
        size_t zbytes = dpar_zero1_momentum_bytes(m.zero, 0), pbytes = 0;
        for (int d = 1; d < devices; d++)
            if (dpar_zero1_momentum_bytes(m.zero, d) != zbytes) return digits_fail("uneven momentum shards");
        for (int i = 0; i < NPARAM; i++) { /* what plain data parallelism allocates: a full replica per device */
            int nd = pshape[i][1] ? 2 : 1;
            dpar_array *rep;
            if (digits_array(mesh, DPAR_F32, nd, pshape[i][0], pshape[i][1], NULL, NULL, &rep))
                return digits_fail("replica");
            pbytes += dpar_buffer_nbytes(dpar_array_shard(rep, 0));
            dpar_array_destroy(rep);
        }
        printf("momentum per device: %zu bytes with ZeRO-1, %zu bytes replicated (%.2fx less); padded sizes:", zbytes,
               pbytes, (double)pbytes / (double)(zbytes ? zbytes : 1));
        for (int i = 0; i < NPARAM; i++) printf(" %lld", (long long)dpar_zero1_padded_count(m.zero, i));
        printf("\n");
    }
    if (digits_array(mesh, DPAR_F32, 2, batch, NPIX, "data", NULL, &m.x) ||
        digits_array(mesh, DPAR_I32, 1, batch, 0, "data", NULL, &m.y) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", NULL, &m.h_pre) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", NULL, &m.h) ||
        digits_array(mesh, DPAR_F32, 2, batch, NCLASS, "data", NULL, &m.logits) ||
        digits_array(mesh, DPAR_F32, 2, batch, NCLASS, "data", NULL, &m.dlogits) ||
        digits_array(mesh, DPAR_F32, 2, batch, hidden, "data", NULL, &m.dh) ||
        digits_array(mesh, DPAR_F32, 1, devices, 0, "data", NULL, &m.loss))
        return digits_fail("activations");

    int tpad = (ds.ntest + devices - 1) / devices * devices;
    float *xt = calloc((size_t)tpad * NPIX, sizeof(float)), *lt = malloc((size_t)tpad * NCLASS * sizeof(float));
    for (int i = 0; i < ds.ntest; i++)
        memcpy(xt + (size_t)i * NPIX, ds.all.x + (size_t)ds.test_idx[i] * NPIX, NPIX * sizeof(float));
    dpar_array *tx, *th, *tl;
    if (digits_array(mesh, DPAR_F32, 2, tpad, NPIX, "data", NULL, &tx) ||
        digits_array(mesh, DPAR_F32, 2, tpad, hidden, "data", NULL, &th) ||
        digits_array(mesh, DPAR_F32, 2, tpad, NCLASS, "data", NULL, &tl) || dpar_array_put(tx, xt))
        return digits_fail("test set");

    float *xb = malloc((size_t)batch * NPIX * sizeof(float)), *losses = malloc((size_t)devices * sizeof(float));
    int32_t *yb = malloc((size_t)batch * sizeof(int32_t));
    int steps = ds.ntrain / batch;
    dpar_shard_map_desc train = { .fn = train_step, .user = &m };
    dpar_shard_map_desc eval = { .fn = digits_eval_step, .user = m.param, .num_args = 3, .args = { tx, th, tl } };
    double epoch_loss = 0.0, acc = 0.0;
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/dpar_zero1_%ld.ckpt", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
    uint64_t saved_rng = 0;
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
        if (e == ckpt_epoch) {
            /* save, wipe the state, restore: what a restarted job would do */
            dpar_checkpoint_entry ent[3 * NPARAM];
            int n = checkpoint_entries(&m, ent);
            saved_rng = rng_state;
            if (dpar_checkpoint_save(ckpt, ent, n, (uint64_t)e)) return digits_fail("checkpoint save");
            dpar_zero1_destroy(m.zero);
            float *junk = calloc((size_t)NPIX * (size_t)hidden, sizeof(float));
            for (int i = 0; i < NPARAM; i++)
                if (dpar_array_put(m.param[i], junk)) return digits_fail("wipe");
            free(junk);
            if (dpar_zero1_create(&zd, &m.zero)) return digits_fail("zero1 (again)");
            n = checkpoint_entries(&m, ent);
            uint64_t step = 0;
            if (dpar_checkpoint_restore(ckpt, ent, n, &step)) return digits_fail("checkpoint restore");
            rng_state = saved_rng;
            printf("checkpoint: saved after epoch %d to %s (%d entries), restored into fresh state (step %llu)\n", e,
                   ckpt, n, (unsigned long long)step);
            remove(ckpt);
        }
    }
    printf("final: backend=%s devices=%d epochs=%d test_accuracy=%.4f train_loss=%.8f\n", o.backend, devices, o.epochs,
           acc, epoch_loss);
    dpar_zero1_destroy(m.zero);
    dpar_runtime_destroy(rt);
    free(xb);
    free(yb);
    free(losses);
    free(xt);
    free(lt);
    digits_free(&ds);
    return 0;
}
