/* train_digits_zero1.c — the digits MLP, data-parallel over "data", with the
   optimizer state sharded ZeRO-1 style.

   The step is train_digits' graph (forward written once; gradients, the
   average over "data" and SGD from the library) plus one call,
   dpar_graph_zero1(g, "data"): each gradient is reduce-scattered over "data"
   instead of all-reduced (flattened, zero-padded to a multiple of N), each
   device updates only its block of every parameter and of its momentum, and
   the blocks are all-gathered back into the parameters. Momentum memory per
   device falls by N; the losses are those of plain data parallelism
   (tests/test_parallel_examples.sh compares them with train_digits --devices 1).

   build/train_digits_zero1 [--backend cpu|vulkan|cuda] [--devices N] [--epochs N]
                            [--batch N] [--lr X] [--momentum X] [--seed N] [--hidden N]
                            [--data PATH] [--checkpoint-epoch E]
   --checkpoint-epoch E saves the parameters and the sharded momentum after
   epoch E ($TMPDIR, or /tmp when unset or empty, dpar_zero1_<pid>.ckpt, its directory
   checked before training, removed afterwards), wipes
   both, restores them and continues: the later epochs must be the same bit for bit. */
#include "digits_common.h"
#include "util/dpar_train.h"
#include <unistd.h>

enum { W1, B1, W2, B2, NPARAM };
static const char *pname[NPARAM] = { "w1", "b1", "w2", "b2" };

/* The step: x [batch, 64] f32, y [batch] i32 split over "data"; params replicated; ZeRO-1 over "data". */
static dpar_status build_step(dpar_mesh *mesh, dpar_array *const param[NPARAM], int batch, const dpar_sgd_desc *sgd,
                              dpar_graph **g, dpar_value *x, dpar_value *y, dpar_graph_stats *st) {
    dpar_status s = dpar_graph_create(mesh, g);
    if (s) return s;
    *x = dpar_g_feed(*g, "x", &(dpar_array_desc){ DPAR_F32, 2, { batch, NPIX }, { "data" } });
    *y = dpar_g_feed(*g, "y", &(dpar_array_desc){ DPAR_I32, 1, { batch }, { "data" } });
    dpar_value p[NPARAM], grad[NPARAM];
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_g_param(*g, pname[i], param[i]);
    dpar_value h = dpar_g_relu(*g, dpar_g_bias_add(*g, dpar_g_matmul(*g, *x, p[W1], false, false), p[B1])); /* [b,H] */
    dpar_value logits = dpar_g_bias_add(*g, dpar_g_matmul(*g, h, p[W2], false, false), p[B2]);              /* [b,10] */
    if ((s = dpar_graph_value_and_grad(*g, dpar_g_softmax_xent(*g, logits, *y), p, NPARAM, grad))) return s;
    if ((s = dpar_graph_zero1(*g, "data"))) return s; /* reduce-scatter, block update, all-gather */
    if ((s = dpar_graph_sgd(*g, sgd, p, grad, NPARAM))) return s;
    return dpar_graph_compile(*g, st);
}

/* The checkpoint: the parameters (replicated) and the momentum (split over "data", padded). */
static int checkpoint_entries(dpar_graph *g, dpar_array *const param[NPARAM], dpar_checkpoint_entry *e) {
    static char names[NPARAM][16];
    for (int i = 0; i < NPARAM; i++) {
        snprintf(names[i], sizeof names[i], "%s.momentum", pname[i]);
        e[i] = (dpar_checkpoint_entry){ pname[i], param[i], false };
        e[NPARAM + i] = (dpar_checkpoint_entry){ names[i], dpar_graph_zero1_state(g, i, 0), true };
    }
    return 2 * NPARAM;
}

int main(int argc, char **argv) {
    int ckpt_epoch = 0;
    digits_opts o = { "cpu", "examples/data/digits.csv.gz",
                      4,     30,
                      64,    42,
                      128,   0.1f,
                      0.9f,  { EX_I("--checkpoint-epoch", &ckpt_epoch, 0, INT_MAX) } };
    int rc = digits_parse("train_digits_zero1", argc, argv, &o);
    if (rc) return ex_exit_status(rc);
    if (ckpt_epoch < 0 || ckpt_epoch > o.epochs) { /* it would never be reached: say so, do not skip it silently */
        fprintf(stderr, "train_digits_zero1: --checkpoint-epoch %d is outside 0..%d (--epochs %d; 0: no checkpoint)\n",
                ckpt_epoch, o.epochs, o.epochs);
        return 2;
    }
    if (o.batch % o.devices) {
        fprintf(stderr, "train_digits_zero1: --batch %d is not divisible by --devices %d\n", o.batch, o.devices);
        return 2;
    }
    /* the checkpoint's file, checked before any training (an empty TMPDIR, as unset, is /tmp: it was "/") */
    char ckpt[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(ckpt, sizeof ckpt, "%s/dpar_zero1_%ld.ckpt", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    if (ckpt_epoch && ex_check_writable("train_digits_zero1", "--checkpoint-epoch's file ($TMPDIR or /tmp)", ckpt))
        return 2;
    digits_setup ds;
    if ((rc = digits_prepare("train_digits_zero1", &o, &ds))) return rc;
    int devices = o.devices, batch = o.batch, hidden = o.hidden;
    dpar_runtime_desc rd = { .num_devices = devices };
    if (digits_backend(o.backend, &rd.backend)) {
        fprintf(stderr, "train_digits_zero1: unknown backend '%s'\n", o.backend);
        return 2;
    }
    dpar_runtime *rt;
    dpar_mesh *mesh;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    o.backend = dpar_backend_name(dpar_runtime_backend(rt)); /* what ran: --backend default or '' picks one */
    if (dpar_mesh_create(rt, &(dpar_mesh_desc){ .ndim = 1, .shape = { devices }, .axis_names = { "data" } }, &mesh))
        return digits_fail("mesh");
    printf("backend %s, %d device(s), ZeRO-1 over \"data\"\n", o.backend, devices);
    printf("data: %d train, %d test images; MLP 64-%d-10, batch %d (%d per device), lr %g, momentum %g\n", ds.ntrain,
           ds.ntest, hidden, batch, batch / devices, (double)o.lr, (double)o.momentum);

    /* model: replicated parameters (He-uniform weights, zero biases) and the step graph over them */
    dpar_array *param[NPARAM];
    int64_t pshape[NPARAM][2] = { { NPIX, hidden }, { hidden, 0 }, { hidden, NCLASS }, { NCLASS, 0 } };
    size_t replicated = 0; /* the momentum bytes plain data parallelism keeps on every device */
    for (int i = 0; i < NPARAM; i++) {
        if (digits_array(mesh, DPAR_F32, pshape[i][1] ? 2 : 1, pshape[i][0], pshape[i][1], NULL, NULL, &param[i]))
            return digits_fail("parameters");
        replicated += dpar_buffer_nbytes(dpar_array_shard(param[i], 0));
    }
    if (dpar_array_put(param[W1], ds.w1) || dpar_array_put(param[W2], ds.w2)) return digits_fail("init");
    dpar_graph *step;
    dpar_value fx, fy;
    dpar_graph_stats st;
    if (build_step(mesh, param, batch, &(dpar_sgd_desc){ .learning_rate = o.lr, .momentum = o.momentum }, &step, &fx,
                   &fy, &st))
        return digits_fail("step graph");
    printf("momentum per device: %llu bytes with ZeRO-1, %zu bytes replicated (%.2fx less); padded sizes:",
           (unsigned long long)st.opt_bytes, replicated,
           (double)replicated / (double)(st.opt_bytes ? st.opt_bytes : 1));
    for (int i = 0; i < NPARAM; i++)
        printf(" %lld", (long long)(dpar_array_shard_dim(dpar_graph_zero1_state(step, i, 0), 0) * devices));
    printf("\n");

    /* test set, padded to a multiple of the device count */
    int tpad = (ds.ntest + devices - 1) / devices * devices;
    float *xt = calloc((size_t)tpad * NPIX, sizeof(float)), *lt = malloc((size_t)tpad * NCLASS * sizeof(float));
    for (int i = 0; i < ds.ntest; i++)
        memcpy(xt + (size_t)i * NPIX, ds.all.x + (size_t)ds.test_idx[i] * NPIX, NPIX * sizeof(float));
    dpar_array *tx, *th, *tl;
    if (digits_array(mesh, DPAR_F32, 2, tpad, NPIX, "data", NULL, &tx) ||
        digits_array(mesh, DPAR_F32, 2, tpad, hidden, "data", NULL, &th) ||
        digits_array(mesh, DPAR_F32, 2, tpad, NCLASS, "data", NULL, &tl) || dpar_array_put(tx, xt))
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
            float loss;
            digits_batch(&ds, s, batch, xb, yb);
            if (dpar_graph_run(step, (dpar_graph_feed[]){ { fx, xb, NULL }, { fy, yb, NULL } }, 2, &loss))
                return digits_fail("train step");
            if (ex_check_loss("train_digits_zero1", loss, (long long)(e - 1) * steps + s + 1, e, o.lr)) return 1;
            sum += loss;
        }
        double dt = now_s() - t0;
        epoch_loss = sum / steps;
        if (dpar_shard_map(mesh, &eval) || dpar_array_get(tl, lt)) return digits_fail("eval");
        acc = digits_accuracy(&ds, lt);
        printf("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f\n", e, epoch_loss, acc, steps * batch / dt);
        fflush(stdout);
        if (e == ckpt_epoch) { /* save, wipe, restore: what a restarted job would do */
            dpar_checkpoint_entry ent[2 * NPARAM];
            int n = checkpoint_entries(step, param, ent);
            uint64_t saved_rng = rng_state, at = 0;
            if (dpar_checkpoint_save(ckpt, ent, n, (uint64_t)e)) return digits_fail("checkpoint save");
            float *junk = calloc((size_t)NPIX * (size_t)hidden + (size_t)devices, sizeof(float)); /* >= every array */
            for (int i = 0; i < n; i++)
                if (dpar_array_put(ent[i].array, junk)) return digits_fail("wipe");
            free(junk);
            if (dpar_checkpoint_restore(ckpt, ent, n, &at)) return digits_fail("checkpoint restore");
            rng_state = saved_rng;
            printf("checkpoint: saved after epoch %d to %s (%d entries), restored into wiped state (epoch %llu)\n", e,
                   ckpt, n, (unsigned long long)at);
            remove(ckpt);
        }
    }
    printf("final: backend=%s devices=%d epochs=%d test_accuracy=%.4f train_loss=%.8f\n", o.backend, devices, o.epochs,
           acc, epoch_loss);
    dpar_graph_destroy(step);
    dpar_runtime_destroy(rt);
    free(xb);
    free(yb);
    free(xt);
    free(lt);
    digits_free(&ds);
    return 0;
}
