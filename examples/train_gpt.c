/* train_gpt.c — a character-level GPT on tiny Shakespeare, data- and
   tensor-parallel on a 2-d mesh (data, model), written with dpar's graph API:

     tokens [b, T] -> wte[tokens] + wpe -> 4 x block -> LayerNorm -> head -> logits [b*T, 65]
     block: x += proj(attention(LN1(x)));  x += fc2(gelu(fc1(LN2(x))))    (pre-LN, GPT-2)

   n_layer 4, n_head 4, n_embd 128, context 64, GELU (tanh) MLP 4x, biases
   everywhere, untied head: 818,241 parameters. AdamW lr 3e-3, betas (0.9,
   0.99), weight decay 0.1 on the matrices only (embeddings and weights; not
   biases or norm gains), global-norm clipping at 1.0, 100 warm-up steps then
   cosine decay to 3e-4 at the last step; batch 32; 1,000 steps. The warm-up
   starts from 0 (optax.linear_schedule(0, lr, 100)): step 1 moves only
   AdamW's moments.

   The mesh (Megatron, Shoeybi et al. 2019, sec. 3; the seed material's case
   for shard_map): the batch is split over "data"; each device of a "model"
   group holds n_head / tp heads. Q, K, V and fc1 are column-parallel
   (weights split over "model" by columns, spec (None, model)), the attention
   output projection and fc2 row-parallel (split by rows, spec (model, None)),
   so each sublayer ends in ONE psum over "model" in the forward. Its input
   goes through dpar_g_pcast (JAX's pvary, Megatron's "f"), whose transpose is
   the ONE psum of the backward. Embeddings, norms, the head and the
   row-parallel biases are replicated; the graph reduces their gradients over
   every axis they are replicated on, so replicas stay bitwise identical
   (checked at the end). Clipping uses one global norm over all the
   parameters (dpar_graph_adamw_masked: each gradient's squared norm psum'd
   over the axes its parameter is split on).

   build/train_gpt [--backend cpu|vulkan|cuda] [--dp N] [--tp M] [--devices N*M] [--steps N]
                   [--batch N] [--lr X] [--seed N] [--log-every N] [--eval-every N]
                   [--val-batches N] [--gen N] [--prompt S] [--data PATH] [--remat 0|1] [--memory 0|1]
                   [--monitor 0|1]
   Defaults: cpu, --dp 2 --tp 2 (4 devices), 1,000 steps, batch 32, lr 3e-3,
   seed 42, train loss (mean since the last line) every 50 steps, validation
   loss over 20 fixed batches every 250 steps and at the end, 200 generated
   characters after --prompt "ROMEO:" (every character must occur in the
   text: checked before training). --remat 1 makes each block a remat segment
   (recomputed in the backward: less memory, the same gradients); --memory 1
   prints after the first step the training graph's measured peak on device 0
   against its planned live set (one "memory:" line); --monitor 1 prints with
   each training-loss line one "monitor:" line per device, its time shares
   (compute, collectives, copies, idle) since the last one (ex_monitor). Ends
   with exactly one line "final: backend=cpu devices=4 model=gpt dp=2 tp=2
   steps=1000 train_loss=... train_loss_steps=951-1000 val_loss=...":
   train_loss is the mean training loss over the steps train_loss_steps names
   (those since the previous training-loss line: the last --log-every
   window, shorter when --steps is not a multiple of it), val_loss the last
   validation loss. Exit status 0 on success; 0 after --help (each flag's
   values and default, on stdout); 2 for a bad flag (each named with its
   value and limit), 1 for unreadable data, a NaN or infinite loss (naming
   the step) or replicas that differ. */
#include "digits_common.h" /* splitmix64 (rng_next), now_s, digits_fail, ex_parse */

/* ------------------------------------------------------------------ flags */
enum { N_LAYER = 4, N_HEAD = 4, N_EMBD = 128, CTX = 64, MAXV = 256, GEN_MAX = 100000 };
/* --batch at most: a training step holds about 240 KB of activations per row (--batch 100000 took 24 GB
   and met the OOM killer), so 4,096 rows are about 1 GB */
enum { BATCH_MAX = 4096 };
typedef struct {
    const char *backend, *path, *prompt;
    int dp, tp, devices, steps, batch, seed, log_every, eval_every, val_batches, gen;
    int remat;   /* --remat 1: each block a remat segment (recomputed in the backward) */
    int memory;  /* --memory 1: the training graph's measured memory against its plan (ex_memory_report) */
    int monitor; /* --monitor 1: per-device time shares with each training-loss line (ex_monitor) */
    float lr;
} gpt_opts;

/* Parses the flags into o (defaults already there; ex_parse); 0 on success,
   EX_HELP after --help, 2 on a usage error (main returns ex_exit_status). */
static int gpt_parse(int argc, char **argv, gpt_opts *o) {
    const ex_flag f[] = { EX_S("--backend", &o->backend, "cpu|vulkan|cuda"),
                          EX_S("--data", &o->path, "a text file, gzip'd or plain"),
                          EX_S("--prompt", &o->prompt, "text whose characters occur in --data"),
                          EX_I("--dp", &o->dp, 1, INT_MAX),
                          EX_I("--tp", &o->tp, 1, INT_MAX),
                          EX_FLAG("--devices", EX_INT, &o->devices, 1, DPAR_MAX_DEVICES, NULL, "--dp x --tp"),
                          EX_I("--steps", &o->steps, 1, INT_MAX),
                          EX_I("--batch", &o->batch, 1, BATCH_MAX),
                          EX_I("--seed", &o->seed, INT_MIN, INT_MAX),
                          EX_FLAG("--log-every", EX_INT, &o->log_every, 1, INT_MAX,
                                  "an integer >= 1: steps per train_loss line, the mean over them", NULL),
                          EX_I("--eval-every", &o->eval_every, 0, INT_MAX), /* 0: off */
                          EX_I("--val-batches", &o->val_batches, 1, INT_MAX),
                          EX_I("--gen", &o->gen, 0, GEN_MAX), /* 0: off; one forward pass per character */
                          EX_I("--remat", &o->remat, 0, 1),
                          EX_I("--memory", &o->memory, 0, 1),
                          EX_I("--monitor", &o->monitor, 0, 1),
                          EX_F("--lr", &o->lr, "a finite number > 0: the schedule's peak") };
    int r = ex_parse("train_gpt", argc, argv, f, (int)(sizeof f / sizeof f[0]));
    if (r) return r;
    long long mesh = (long long)o->dp * o->tp;                  /* in 64 bits: --dp and --tp may each be near INT_MAX */
    if (!o->devices && mesh <= INT_MAX) o->devices = (int)mesh; /* the default follows --dp x --tp */
    if (o->devices != mesh) {
        fprintf(stderr, "train_gpt: --devices %d but the mesh --dp %d x --tp %d has %lld devices\n", o->devices, o->dp,
                o->tp, mesh);
        return 2;
    }
    if (o->batch % o->dp) {
        fprintf(stderr, "train_gpt: --batch %d must be divisible by --dp %d (each data shard gets whole rows)\n",
                o->batch, o->dp);
        return 2;
    }
    if (N_HEAD % o->tp) {
        fprintf(stderr, "train_gpt: --tp %d must divide the %d attention heads (each device holds whole heads)\n",
                o->tp, N_HEAD);
        return 2;
    }
    if (!*o->prompt) {
        fprintf(stderr, "train_gpt: --prompt is empty; generation needs at least one character to start from\n");
        return 2;
    }
    return ex_check_lr("train_gpt", "--lr", o->lr, 1); /* the peak of the schedule */
}

/* ------------------------------------------------------------------- data */
/* The text as token ids (its sorted distinct bytes: 65 for tiny Shakespeare). */
typedef struct {
    uint8_t *tok;
    long n, ntrain; /* first 90% train, the rest validation */
    int vocab;
    char chars[MAXV]; /* id -> byte */
    int id[MAXV];     /* byte -> id; -1: not in the text */
} text_data;

/* Reads the gzip'd (or plain) text at path. 0 on success; else prints what
   is wrong (a directory, cannot open, corrupt gzip data, too short) and
   returns -1. */
static int text_load(const char *path, text_data *t) {
    memset(t, 0, sizeof *t);
    if (ex_check_data_file("train_gpt", path)) return -1;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fprintf(stderr, "train_gpt: cannot open '%s': %s (run from the repository root, or give --data PATH)\n", path,
                errno ? strerror(errno) : "out of memory");
        return -1;
    }
    long cap = 1 << 20;
    int got = 0;
    uint8_t *grown;
    t->tok = malloc((size_t)cap);
    while (t->tok && (got = gzread(f, t->tok + t->n, (unsigned)(cap - t->n))) > 0)
        if ((t->n += got) == cap) {
            grown = realloc(t->tok, (size_t)(cap *= 2));
            if (!grown) free(t->tok);
            t->tok = grown;
        }
    int err = Z_OK;
    const char *msg = gzerror(f, &err);
    int bad = got < 0 || (err != Z_OK && err != Z_STREAM_END); /* a truncated gzip ends with Z_BUF_ERROR */
    if (t->tok && bad)
        fprintf(stderr, "train_gpt: %s: the gzip data is corrupt or truncated after %ld characters: %s\n", path, t->n,
                msg);
    gzclose(f);
    if (!t->tok) fprintf(stderr, "train_gpt: %s: out of host memory after %ld characters\n", path, t->n);
    if (!t->tok || bad) return -1;
    if (t->n < 10 * (CTX + 1)) { /* the validation tenth must hold a whole window */
        fprintf(stderr, "train_gpt: %s holds %ld characters; want at least %d (10 windows of %d + 1)\n", path, t->n,
                10 * (CTX + 1), CTX);
        return -1;
    }
    int seen[MAXV] = { 0 };
    for (long i = 0; i < t->n; i++) seen[t->tok[i]] = 1;
    for (int c = 0; c < MAXV; c++) {
        t->id[c] = seen[c] ? t->vocab : -1;
        if (seen[c]) t->chars[t->vocab++] = (char)c;
    }
    for (long i = 0; i < t->n; i++) t->tok[i] = (uint8_t)t->id[t->tok[i]];
    t->ntrain = t->n * 9 / 10;
    return 0;
}

/* Writes p[0..n) to `out`, control bytes other than newline and tab (NUL
   too) as \xNN: a sample of a binary --data file puts no escape sequence on
   the terminal and is not cut at a NUL; other bytes (UTF-8 text) as they are. */
static void put_text(FILE *out, const char *p, size_t n) {
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)p[k];
        if ((c < 32 && c != '\n' && c != '\t') || c == 127)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
}

/* Can `prompt` be fed (every character in the text's vocabulary)? 0 if so;
   else prints the first character that is not and returns 2 (checked
   before training, not after it). */
static int text_check_prompt(const text_data *t, const char *path, const char *prompt) {
    for (const char *p = prompt; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (t->id[c] >= 0) continue;
        char text[96], shown[8] = ""; /* the prompt escaped (ex_excerpt); the character when printable */
        if (c >= 32 && c < 127) snprintf(shown, sizeof shown, ", '%c'", c);
        fprintf(stderr,
                "train_gpt: --prompt \"%s\": character %ld (byte 0x%02x%s) is not in the %d-character vocabulary "
                "of %s; use characters that occur in the text\n",
                ex_excerpt(prompt, strlen(prompt), text, sizeof text), (long)(p - prompt) + 1, c, shown, t->vocab,
                path);
        return 2;
    }
    return 0;
}

/* Row r of a batch: tokens [start, start + CTX) into x, the next tokens into y. */
static void text_row(const text_data *t, long start, int32_t *x, int32_t *y) {
    for (int i = 0; i < CTX; i++) x[i] = t->tok[start + i], y[i] = t->tok[start + i + 1];
}
/* A training batch: random windows of the training split (the seeded stream). */
static void train_batch(const text_data *t, int batch, int32_t *x, int32_t *y) {
    for (int r = 0; r < batch; r++)
        text_row(t, (long)(rng_next() % (uint64_t)(t->ntrain - CTX - 1)), x + r * CTX, y + r * CTX);
}
/* Validation batch k of nb: windows evenly spaced over the validation split (the same for every seed). */
static void val_batch(const text_data *t, int k, int nb, int batch, int32_t *x, int32_t *y) {
    long span = t->n - t->ntrain - CTX - 1, rows = (long)nb * batch;
    for (int r = 0; r < batch; r++)
        text_row(t, t->ntrain + span * ((long)k * batch + r) / rows, x + r * CTX, y + r * CTX);
}

/* ------------------------------------------------------------------ model */
/* Per block: LN1 gain/bias, Q K V weights/biases, proj, LN2, fc1, fc2. */
enum { LN1W, LN1B, QW, QB, KW, KB, VW, VB, PW, PB, LN2W, LN2B, F1W, F1B, F2W, F2B, NBLK };
enum { WTE, WPE, BLK0, LNFW = BLK0 + N_LAYER * NBLK, LNFB, HW, HB, NPARAM };
typedef struct {
    int ndim;
    int64_t shape[2];
    const char *spec[2]; /* over "model": column-parallel (-, model), row-parallel (model, -) */
    float std;           /* normal(0, std); 0: zeros; -1: ones (norm gains) */
    char name[24];
} param_info;

static void param_table(int vocab, param_info pi[NPARAM]) {
    const float s = 0.02f, sp = 0.02f / sqrtf(2.0f * N_LAYER); /* GPT-2: residual projections scaled */
    const int64_t C = N_EMBD, F = 4 * N_EMBD;
    static const char *const blk[NBLK] = { "ln1.w",  "ln1.b",  "q.w",   "q.b",   "k.w",   "k.b",   "v.w",   "v.b",
                                           "proj.w", "proj.b", "ln2.w", "ln2.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b" };
    pi[WTE] = (param_info){ 2, { vocab, C }, { 0 }, s, "wte" };
    pi[WPE] = (param_info){ 2, { CTX, C }, { 0 }, s, "wpe" };
    for (int l = 0; l < N_LAYER; l++) {
        param_info *b = pi + BLK0 + l * NBLK;
        b[LN1W] = b[LN2W] = (param_info){ 1, { C }, { 0 }, -1.0f, "" };
        b[LN1B] = b[LN2B] = b[PB] = b[F2B] = (param_info){ 1, { C }, { 0 }, 0.0f, "" };
        b[QW] = b[KW] = b[VW] = (param_info){ 2, { C, C }, { NULL, "model" }, s, "" };
        b[QB] = b[KB] = b[VB] = (param_info){ 1, { C }, { "model" }, 0.0f, "" };
        b[PW] = (param_info){ 2, { C, C }, { "model", NULL }, sp, "" };
        b[F1W] = (param_info){ 2, { C, F }, { NULL, "model" }, s, "" };
        b[F1B] = (param_info){ 1, { F }, { "model" }, 0.0f, "" };
        b[F2W] = (param_info){ 2, { F, C }, { "model", NULL }, sp, "" };
        for (int k = 0; k < NBLK; k++) snprintf(b[k].name, sizeof b[k].name, "h%d.%s", l, blk[k]);
    }
    pi[LNFW] = (param_info){ 1, { C }, { 0 }, -1.0f, "ln_f.w" };
    pi[LNFB] = (param_info){ 1, { C }, { 0 }, 0.0f, "ln_f.b" };
    pi[HW] = (param_info){ 2, { C, vocab }, { 0 }, s, "head.w" };
    pi[HB] = (param_info){ 1, { vocab }, { 0 }, 0.0f, "head.b" };
}

/* A standard normal from the seeded stream (Box-Muller, 53-bit uniforms). */
static double rng_normal(void) {
    double u1 = ((double)(rng_next() >> 11) + 1.0) * 0x1p-53, u2 = (double)(rng_next() >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The parameters as arrays of the mesh, initialised from the seeded stream in
   table order (the same global values for every mesh); *count: their number. */
static dpar_status gpt_params(dpar_mesh *mesh, const param_info pi[NPARAM], dpar_array *p[NPARAM], int64_t *count) {
    *count = 0;
    for (int i = 0; i < NPARAM; i++) {
        dpar_array_desc d = { .dtype = DPAR_F32, .ndim = pi[i].ndim };
        int64_t n = 1;
        for (int k = 0; k < d.ndim; k++) n *= d.shape[k] = pi[i].shape[k], d.spec[k] = pi[i].spec[k];
        dpar_status s = dpar_array_create(mesh, &d, &p[i]);
        if (s) return s;
        *count += n;
        float *w = malloc((size_t)n * sizeof(float));
        if (!w) return DPAR_ERR_OUT_OF_MEMORY;
        for (int64_t k = 0; k < n; k++) w[k] = pi[i].std > 0.0f ? (float)(pi[i].std * rng_normal()) : -pi[i].std;
        s = dpar_array_put(p[i], w);
        free(w);
        if (s) return s;
    }
    return DPAR_OK;
}

/* x [rows, k] @ w + b; w and b this device's shards. */
static dpar_value linear(dpar_graph *g, dpar_value x, dpar_value w, dpar_value b) {
    return dpar_g_bias_add(g, dpar_g_matmul(g, x, w, false, false), b);
}
/* [b*T, hl*hd] <-> [b, hl, T, hd] (heads to the batch dims and back) */
static dpar_value split_heads(dpar_graph *g, dpar_value x, int64_t b, int64_t hl) {
    x = dpar_g_reshape(g, x, 4, (int64_t[]){ b, CTX, hl, N_EMBD / N_HEAD });
    return dpar_g_transpose(g, x, (const int[]){ 0, 2, 1, 3 });
}
static dpar_value merge_heads(dpar_graph *g, dpar_value x, int64_t b, int64_t hl) {
    x = dpar_g_transpose(g, x, (const int[]){ 0, 2, 1, 3 });
    return dpar_g_reshape(g, x, 2, (int64_t[]){ b * CTX, hl * (N_EMBD / N_HEAD) });
}

/* One pre-LN block on x [b*T, C] (invariant over "model"); p: its NBLK params. */
static dpar_value gpt_block(dpar_graph *g, const dpar_value *p, dpar_value x, int64_t b, int tp) {
    const int64_t hl = N_HEAD / tp;
    /* attention: the heads of this device (column-parallel Q, K, V; row-parallel proj) */
    dpar_value h = dpar_g_pcast(g, dpar_g_layer_norm(g, x, p[LN1W], p[LN1B], 1e-5f), "model"); /* [b*T, C] */
    dpar_value q = split_heads(g, linear(g, h, p[QW], p[QB]), b, hl);                          /* [b, hl, T, hd] */
    dpar_value k = split_heads(g, linear(g, h, p[KW], p[KB]), b, hl);
    dpar_value v = split_heads(g, linear(g, h, p[VW], p[VB]), b, hl);
    dpar_value a = merge_heads(g, dpar_g_attention(g, q, k, v, 0.0f, true), b, hl);   /* [b*T, C/tp] */
    dpar_value o = dpar_g_psum(g, dpar_g_matmul(g, a, p[PW], false, false), "model"); /* [b*T, C]: the all-reduce */
    x = dpar_g_add(g, x, dpar_g_bias_add(g, o, p[PB]));
    /* MLP: fc1 column-parallel, fc2 row-parallel */
    h = dpar_g_pcast(g, dpar_g_layer_norm(g, x, p[LN2W], p[LN2B], 1e-5f), "model");
    h = dpar_g_unary(g, linear(g, h, p[F1W], p[F1B]), DPAR_UNARY_GELU_TANH, 0.0f); /* [b*T, 4C/tp] */
    o = dpar_g_psum(g, dpar_g_matmul(g, h, p[F2W], false, false), "model");        /* [b*T, C] */
    return dpar_g_add(g, x, dpar_g_bias_add(g, o, p[F2B]));
}

/* The logits [b*T, V] of this device's token rows idx [b, T] (i32). */
static dpar_value gpt_forward(dpar_graph *g, const dpar_value p[NPARAM], dpar_value idx, int64_t b, int tp,
                              bool remat) {
    dpar_value x = dpar_g_embedding(g, p[WTE], idx);             /* [b, T, C] */
    x = dpar_g_binary(g, x, p[WPE], DPAR_BINARY_ADD);            /* + wpe [T, C], broadcast over b */
    x = dpar_g_reshape(g, x, 2, (int64_t[]){ b * CTX, N_EMBD }); /* rows: (batch, position) */
    for (int l = 0; l < N_LAYER; l++) { /* remat: jax.checkpoint per block; errors stay in the graph */
        if (remat) dpar_graph_remat_begin(g);
        x = gpt_block(g, p + BLK0 + l * NBLK, x, b, tp);
        if (remat) dpar_graph_remat_end(g);
    }
    x = dpar_g_layer_norm(g, x, p[LNFW], p[LNFB], 1e-5f);
    return linear(g, x, p[HW], p[HB]);
}

/* A graph *out over the parameters: feed x [batch, T] i32 (split over "data"
   when `split`), and its forward pass (blocks remat segments when `remat`);
   *logits the logits value. Builder errors are the graph's (dpar_graph_status). */
static dpar_status gpt_graph(dpar_mesh *mesh, dpar_array *const param[NPARAM], const param_info pi[NPARAM], int batch,
                             bool split, int tp, bool remat, dpar_graph **out, dpar_value p[NPARAM], dpar_value *x,
                             dpar_value *logits) {
    dpar_status s = dpar_graph_create(mesh, out);
    if (s) return s;
    dpar_graph *g = *out;
    int64_t dp = split ? dpar_mesh_size(mesh) / tp : 1;
    *x = dpar_g_feed(g, "x", &(dpar_array_desc){ DPAR_I32, 2, { batch, CTX }, { split ? "data" : NULL } });
    for (int i = 0; i < NPARAM; i++) p[i] = dpar_g_param(g, pi[i].name, param[i]);
    *logits = gpt_forward(g, p, *x, batch / dp, tp, remat);
    return DPAR_OK;
}

/* The training step: the mean cross-entropy of y [batch*T] (split over
   "data"), its gradients and AdamW with decay on the 2-d params only; its
   compile stats into *st. */
static dpar_status gpt_train_graph(dpar_mesh *mesh, dpar_array *const param[NPARAM], const param_info pi[NPARAM],
                                   const gpt_opts *o, dpar_graph **out, dpar_value *x, dpar_value *y,
                                   dpar_graph_stats *st) {
    dpar_value p[NPARAM], grad[NPARAM], logits;
    dpar_status s = gpt_graph(mesh, param, pi, o->batch, true, o->tp, o->remat != 0, out, p, x, &logits);
    if (s) return s;
    dpar_graph *g = *out;
    *y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { (int64_t)o->batch * CTX }, { "data" } });
    dpar_value loss = dpar_g_softmax_xent(g, logits, *y); /* averaged over "data" by the graph */
    s = dpar_graph_value_and_grad(g, loss, p, NPARAM, grad);
    bool decay[NPARAM];
    for (int i = 0; i < NPARAM; i++) decay[i] = pi[i].ndim == 2;
    dpar_adamw_desc ad = { .learning_rate = o->lr, .b1 = 0.9f, .b2 = 0.99f, .weight_decay = 0.1f, .clip_norm = 1.0f };
    if (!s) s = dpar_graph_adamw_masked(g, &ad, p, grad, decay, NPARAM);
    return s ? s : dpar_graph_compile(g, st);
}

/* The validation loss graph: feeds x, y as training; the loss pmean'd over "data", kept. */
static dpar_status gpt_val_graph(dpar_mesh *mesh, dpar_array *const param[NPARAM], const param_info pi[NPARAM],
                                 const gpt_opts *o, dpar_graph **out, dpar_value *x, dpar_value *y, dpar_value *loss) {
    dpar_value p[NPARAM], logits;
    dpar_status s = gpt_graph(mesh, param, pi, o->batch, true, o->tp, false, out, p, x, &logits);
    if (s) return s;
    dpar_graph *g = *out;
    *y = dpar_g_feed(g, "y", &(dpar_array_desc){ DPAR_I32, 1, { (int64_t)o->batch * CTX }, { "data" } });
    *loss = dpar_g_pmean(g, dpar_g_softmax_xent(g, logits, *y), "data");
    s = dpar_graph_keep(g, *loss);
    return s ? s : dpar_graph_compile(g, NULL);
}

/* Mean validation loss over nb fixed batches. */
static dpar_status val_loss(dpar_graph *g, dpar_value x, dpar_value y, dpar_value loss, const text_data *t, int nb,
                            int batch, int32_t *xb, int32_t *yb, double *out) {
    double sum = 0.0;
    for (int k = 0; k < nb; k++) {
        float l;
        val_batch(t, k, nb, batch, xb, yb);
        dpar_graph_feed f[2] = { { .value = x, .host = xb }, { .value = y, .host = yb } };
        dpar_status s = dpar_graph_run(g, f, 2, NULL);
        if (!s) s = dpar_graph_get(g, loss, &l);
        if (s) return s;
        sum += l;
    }
    *out = sum / nb;
    return DPAR_OK;
}

/* Prints `prompt` and n more characters, each sampled (temperature 1, the
   seeded stream) from the logits of a batch-1 forward graph over the trained
   parameters; the context is the last CTX characters. */
static dpar_status generate(dpar_mesh *mesh, dpar_array *const param[NPARAM], const param_info pi[NPARAM], int tp,
                            const text_data *t, const char *prompt, int n) {
    dpar_value p[NPARAM], x, logits;
    dpar_graph *g = NULL;
    dpar_status s = gpt_graph(mesh, param, pi, 1, false, tp, false, &g, p, &x, &logits);
    if (!s) s = dpar_graph_keep(g, logits);
    if (!s) s = dpar_graph_compile(g, NULL);
    int len = (int)strlen(prompt), V = t->vocab;
    char *text = malloc((size_t)(len + n + 1));
    int32_t ctx[CTX];
    float *lg = malloc((size_t)CTX * (size_t)V * sizeof(float));
    memcpy(text, prompt, (size_t)len);
    for (int k = 0; k < n && !s; k++, len++) {
        int from = len > CTX ? len - CTX : 0, m = len - from;
        memset(ctx, 0, sizeof ctx); /* positions after m - 1 do not reach it (causal) */
        for (int i = 0; i < m; i++) ctx[i] = t->id[(unsigned char)text[from + i]]; /* >= 0: text_check_prompt */
        s = dpar_graph_run(g, &(dpar_graph_feed){ .value = x, .host = ctx }, 1, NULL);
        if (!s) s = dpar_graph_get(g, logits, lg);
        if (s) break;
        const float *z = lg + (size_t)(m - 1) * (size_t)V;
        double mx = z[0], tot = 0.0, u = (double)(rng_next() >> 11) * 0x1p-53, acc = 0.0;
        for (int c = 1; c < V; c++) mx = fmax(mx, z[c]);
        for (int c = 0; c < V; c++) tot += exp(z[c] - mx);
        int c = 0;
        for (; c < V - 1; c++)
            if ((acc += exp(z[c] - mx) / tot) > u) break;
        text[len] = t->chars[c];
    }
    if (!s) {
        printf("sample (prompt \"");
        put_text(stdout, prompt, strlen(prompt));
        printf("\", %d characters, temperature 1):\n", n);
        put_text(stdout, text, (size_t)len);
        printf("\n");
    }
    free(text);
    free(lg);
    dpar_graph_destroy(g);
    return s;
}

/* ------------------------------------------------------------------ main */
int main(int argc, char **argv) {
    gpt_opts o = { .backend = "cpu",
                   .path = "examples/data/tinyshakespeare.txt.gz",
                   .prompt = "ROMEO:",
                   .dp = 2,
                   .tp = 2,
                   .steps = 1000,
                   .batch = 32,
                   .seed = 42,
                   .log_every = 50,
                   .eval_every = 250,
                   .val_batches = 20,
                   .gen = 200,
                   .lr = 3e-3f };
    int rc = gpt_parse(argc, argv, &o);
    if (rc) return ex_exit_status(rc);
    digits_prog = "train_gpt";
    dpar_runtime_desc rd = { .num_devices = o.devices };
    if (dpar_backend_from_name(o.backend, &rd.backend)) {
        fprintf(stderr, "train_gpt: %s\n", dpar_last_error());
        return 2;
    }
    text_data td;
    if (text_load(o.path, &td)) return 1; /* it said why */
    long windows = td.ntrain - CTX - 1;   /* the training windows a batch draws from */
    if (ex_check_batch("train_gpt", o.batch, windows > INT_MAX ? INT_MAX : (int)windows, "training windows")) return 2;
    long vwin = td.n - td.ntrain - CTX - 1; /* validation windows: each evaluated row a different one */
    if ((long)o.val_batches * o.batch > vwin) {
        fprintf(stderr,
                "train_gpt: --val-batches %d x --batch %d rows exceed the %ld validation windows; use --val-batches "
                "%ld or less\n",
                o.val_batches, o.batch, vwin, vwin / o.batch > 0 ? vwin / o.batch : 1);
        return 2;
    }
    if (o.gen && text_check_prompt(&td, o.path, o.prompt)) return 2;
    rng_state = (uint64_t)o.seed; /* the weights, then the batches, then the sample */
    dpar_runtime *rt;
    dpar_mesh *mesh;
    if (dpar_runtime_create(&rd, &rt)) return digits_fail("runtime");
    o.backend = dpar_backend_name(dpar_runtime_backend(rt)); /* what ran: --backend default or '' picks one */
    dpar_mesh_desc md = { .ndim = 2, .shape = { o.dp, o.tp }, .axis_names = { "data", "model" } };
    if (dpar_mesh_create(rt, &md, &mesh)) return digits_fail("mesh");
    param_info pi[NPARAM];
    param_table(td.vocab, pi);
    dpar_array *param[NPARAM];
    int64_t nparam;
    if (gpt_params(mesh, pi, param, &nparam)) return digits_fail("parameters");
    dpar_graph *train = NULL, *val = NULL;
    dpar_value x, y, vx, vy, vloss;
    dpar_graph_stats gs;
    ex_memory mem = { .base = ex_memory_now(rt, 0) };
    if (gpt_train_graph(mesh, param, pi, &o, &train, &x, &y, &gs)) return digits_fail("training graph");
    mem.graph = ex_memory_now(rt, 0) - mem.base;
    if (gpt_val_graph(mesh, param, pi, &o, &val, &vx, &vy, &vloss)) return digits_fail("validation graph");
    printf("backend %s, %d device%s: mesh %dx%d (data, model); %d heads per device\n", o.backend, o.devices,
           o.devices == 1 ? "" : "s", o.dp, o.tp, N_HEAD / o.tp);
    printf("data: %ld characters, vocabulary %d, %ld train / %ld validation; GPT %d layers, %d heads, %d embd, "
           "context %d: %lld parameters; batch %d (%d per data shard), %d steps\n",
           td.n, td.vocab, td.ntrain, td.n - td.ntrain, N_LAYER, N_HEAD, N_EMBD, CTX, (long long)nparam, o.batch,
           o.batch / o.dp, o.steps);

    int32_t *xb = malloc((size_t)o.batch * CTX * sizeof(int32_t)),
            *yb = malloc((size_t)o.batch * CTX * sizeof(int32_t));
    dpar_lr_schedule_desc sched = { .kind = DPAR_LR_COSINE,
                                    .peak_lr = o.lr,
                                    .init_lr = 0.0f, /* warm-up from 0, as optax.linear_schedule(0, lr) */
                                    .warmup_steps = 100,
                                    .decay_steps = o.steps,
                                    .end_lr = o.lr / 10.0f };
    if (sched.decay_steps <= sched.warmup_steps) sched.decay_steps = sched.warmup_steps + 1; /* short runs */
    double t0 = now_s(), tlog = t0, sum = 0.0, train_l = 0.0, val_l = 0.0;
    int train_from = 1;                          /* train_l: the mean loss of steps train_from..the last logged step */
    if (o.monitor) dpar_runtime_stats_reset(rt); /* the first window starts with training */
    for (int step = 0; step < o.steps; step++) {
        float lr, loss;
        train_batch(&td, o.batch, xb, yb);
        dpar_graph_feed f[2] = { { .value = x, .host = xb }, { .value = y, .host = yb } };
        if (o.memory && !step) mem.step = ex_memory_now(rt, 1); /* a stats window for the first step */
        if (dpar_lr_at(&sched, step, &lr) || dpar_graph_set_lr(train, lr) || dpar_graph_run(train, f, 2, &loss)) {
            fprintf(stderr, "train_gpt: step %d (lr %g): %s\n", step + 1, (double)lr, dpar_last_error());
            return 1;
        }
        if (o.memory && !step) ex_memory_report(rt, &mem, &gs);
        if (ex_check_loss("train_gpt", loss, step + 1, 0, o.lr)) return 1;
        sum += loss;
        int done = step + 1, last = done == o.steps;
        if (done % o.log_every == 0 || last) {
            int k = done % o.log_every ? done % o.log_every : o.log_every;
            double now = now_s();
            train_l = sum / k, train_from = done - k + 1;
            printf("step %5d  train_loss %.8f  lr %.3e  ms/step %.0f\n", done, train_l, (double)lr,
                   1e3 * (now - tlog) / k);
            if (o.monitor) ex_monitor(rt);
            fflush(stdout);
            sum = 0.0, tlog = now;
        }
        if ((o.eval_every && done % o.eval_every == 0) || last) {
            if (val_loss(val, vx, vy, vloss, &td, o.val_batches, o.batch, xb, yb, &val_l))
                return digits_fail("validation");
            printf("step %5d  val_loss %.6f  (%d batches)  elapsed %.1f s\n", done, val_l, o.val_batches, now_s() - t0);
            fflush(stdout);
            tlog = now_s();
        }
    }
    if (o.gen && generate(mesh, param, pi, o.tp, &td, o.prompt, o.gen)) return digits_fail("generation");
    int same = 1;
    for (int i = 0; i < NPARAM; i++) same &= ex_replicas_identical(mesh, param[i]);
    printf("replicated parameters bitwise identical on every device: %s\n", same ? "yes" : "NO");
    printf("final: backend=%s devices=%d model=gpt dp=%d tp=%d steps=%d train_loss=%.6f train_loss_steps=%d-%d "
           "val_loss=%.6f\n",
           o.backend, o.devices, o.dp, o.tp, o.steps, train_l, train_from, o.steps, val_l);
    dpar_graph_destroy(val);
    dpar_graph_destroy(train);
    dpar_runtime_destroy(rt); /* frees the arrays and the mesh too */
    free(xb);
    free(yb);
    free(td.tok);
    return same ? 0 : 1;
}
