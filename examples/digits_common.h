/* digits_common.h — what the digits examples share with train_digits.c: the
   data (UCI handwritten digits, examples/data), the fixed-seed split, the
   splitmix64 generator, the He-uniform initialisation, the flags, and the
   small helpers every example needs (arrays, the MLP forward pass, the
   test-set step, error exits); the flag parser itself is example_util.h's. Every
   example draws the same random numbers in the same order, so with the same
   seed and global batch they see the same batches and start from the same
   weights as build/train_digits, and their losses can be compared epoch by
   epoch. Included by the examples (not compiled on its own). */
#ifndef DIGITS_COMMON_H
#define DIGITS_COMMON_H
#include "example_util.h" /* CHECK, TRY, the flag parser */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <errno.h>
#include <time.h>
#include <zlib.h>

#define NPIX              64
#define DIGITS_MAX_HIDDEN (1 << 20) /* --hidden: W1 and W2 then take 44 MB */
#define NCLASS            10

typedef struct {
    int n;
    float *x;
    int32_t *y;
} dataset;

/* Reads up to `cap` rows of a gzip'd (or plain) CSV file (a note on stderr
   says when it holds more): `npix` pixels in 0..pix_max (x = v / scale) and
   a label in 0..9 per line (ex_csv_row), into d (x [n, npix] f32, y [n] i32;
   blank lines skipped). 0 on success; else prints what is wrong (a
   directory; the file cannot be opened; line L field F is malformed; a line
   is too long or holds a NUL byte, as a binary file does; the gzip stream is
   corrupt; no rows) and returns -1. */
static inline int csv_load(const char *prog, const char *path, int npix, long pix_max, float scale, int cap,
                           dataset *d) {
    memset(d, 0, sizeof *d);
    if (ex_check_data_file(prog, path)) return -1;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open '%s': %s (run from the repository root, or give --data PATH)\n", prog, path,
                errno ? strerror(errno) : "out of memory");
        return -1;
    }
    d->x = malloc((size_t)cap * (size_t)npix * sizeof(float));
    d->y = malloc((size_t)cap * sizeof(int32_t));
    char line[8192]; /* a row is at most 785 * 4 characters */
    long line_no = 0;
    int bad = !d->x || !d->y;
    z_off_t at = gztell(f);
    while (!bad && d->n < cap && gzgets(f, line, sizeof line)) {
        size_t got = (size_t)(gztell(f) - at), len = strlen(line); /* bytes read; fewer before a NUL byte */
        at += (z_off_t)got;
        line_no++;
        if (len < got) {
            char text[96];
            fprintf(stderr, "%s: %s line %ld holds a NUL byte after '%s'; is it a CSV of %d pixels and a label?\n",
                    prog, path, line_no, ex_excerpt(line, len, text, sizeof text), npix);
            bad = 1;
        } else if (!strchr(line, '\n') && !gzeof(f)) {
            fprintf(stderr, "%s: %s line %ld is longer than %zu characters; is it a CSV of %d pixels and a label?\n",
                    prog, path, line_no, sizeof line - 1, npix);
            bad = 1;
        } else if (line[strspn(line, " \t\r\n")]) {
            bad = ex_csv_row(prog, path, line_no, line, npix + 1, pix_max, NCLASS - 1, scale,
                             d->x + (size_t)d->n * (size_t)npix, d->y + d->n);
            d->n += !bad;
        }
    }
    int more = 0; /* rows past the cap are left out: said, not dropped silently */
    while (!bad && d->n == cap && !more && gzgets(f, line, sizeof line)) more = line[strspn(line, " \t\r\n")] != 0;
    if (more)
        fprintf(stderr, "%s: note: %s holds more than %d rows; %s reads the first %d\n", prog, path, cap, prog, cap);
    int err;
    const char *msg = gzerror(f, &err);
    if (!bad && err != Z_OK && err != Z_STREAM_END) {
        fprintf(stderr, "%s: %s: the gzip data is corrupt after line %ld: %s\n", prog, path, line_no, msg);
        bad = 1;
    }
    gzclose(f);
    if (!bad && d->n == 0) {
        fprintf(stderr, "%s: %s holds no rows; want lines of %d pixels and a label\n", prog, path, npix);
        bad = 1;
    }
    return bad ? -1 : 0;
}

/* The UCI digits: 64 pixels 0..16 (scaled to [0, 1]) and a label per line, up to 2048 rows. */
static inline int load_digits(const char *prog, const char *path, dataset *d) {
    return csv_load(prog, path, NPIX, 16, 16.0f, 2048, d);
}

/* splitmix64: small, seedable, the same on every platform */
static uint64_t rng_state;
static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float rng_uniform(void) {
    return (float)((double)(rng_next() >> 40) * (1.0 / 16777216.0));
}
static inline void shuffle(int *idx, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const char *backend, *path;
    int devices, epochs, batch, seed, hidden;
    float lr, momentum;
    ex_flag extra[4]; /* one example's own flags (their names, destinations and ranges) */
} digits_opts;

/* The example's name, for messages (set by digits_parse). */
static const char *digits_prog = "digits";

/* Prints "<example>: <what>: <the library's last error>"; returns 1 (main's exit status). */
static inline int digits_fail(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", digits_prog, what, dpar_last_error());
    return 1;
}

/* Parses the train_digits flags plus the example's extras (ex_parse); 0 on
   success, EX_HELP after --help, 2 on a usage error (main returns ex_exit_status). */
static inline int digits_parse(const char *prog, int argc, char **argv, digits_opts *o) {
    digits_prog = prog;
    /* --hidden at most DIGITS_MAX_HIDDEN: the MLP's weights and activations in host and device memory */
    ex_flag f[13] = { EX_S("--backend", &o->backend, "cpu|vulkan|cuda"),
                      EX_I("--devices", &o->devices, 1, DPAR_MAX_DEVICES),
                      EX_I("--epochs", &o->epochs, 1, INT_MAX),
                      EX_I("--batch", &o->batch, 1, INT_MAX),
                      EX_F("--lr", &o->lr, "a finite number > 0"),
                      EX_F("--momentum", &o->momentum, "a number in [0, 1)"),
                      EX_I("--seed", &o->seed, INT_MIN, INT_MAX),
                      EX_I("--hidden", &o->hidden, 1, DIGITS_MAX_HIDDEN),
                      EX_S("--data", &o->path, "a CSV file, gzip'd or plain") };
    int n = 9;
    for (int k = 0; k < 4 && o->extra[k].name; k++) f[n++] = o->extra[k];
    int r = ex_parse(prog, argc, argv, f, n);
    if (r) return r;
    if (ex_check_lr(prog, "--lr", o->lr, 1)) return 2;
    if (!(o->momentum >= 0.0f && o->momentum < 1.0f)) {
        fprintf(stderr, "%s: --momentum %g: must be in [0, 1)\n", prog, (double)o->momentum);
        return 2;
    }
    return 0;
}

/* The data, its fixed-seed 80/20 split and the initial weights, drawn in
   train_digits' order: shuffle, then W1 [64,H], then W2 [H,10] (He-uniform,
   zero biases). */
typedef struct {
    dataset all;
    int *idx, *train_idx, *test_idx, ntrain, ntest;
    float *w1, *w2;
} digits_setup;

/* 0 on success; else prints why and returns main's exit status (1: the data, 2: --batch). */
static inline int digits_prepare(const char *prog, const digits_opts *o, digits_setup *s) {
    memset(s, 0, sizeof *s);
    if (load_digits(prog, o->path, &s->all)) return 1; /* it said why */
    if (s->all.n < 5) {
        fprintf(stderr, "%s: %s holds %d rows; want at least 5 (a fifth is the test set)\n", prog, o->path, s->all.n);
        return 1;
    }
    if (ex_check_batch(prog, o->batch, s->all.n - s->all.n / 5, "training images")) return 2;
    rng_state = (uint64_t)o->seed;
    s->idx = malloc((size_t)s->all.n * sizeof(int));
    if (!s->idx) {
        fprintf(stderr, "%s: out of memory for the shuffle\n", prog);
        return 1;
    }
    for (int i = 0; i < s->all.n; i++) s->idx[i] = i;
    shuffle(s->idx, s->all.n);
    s->ntest = s->all.n / 5;
    s->ntrain = s->all.n - s->ntest;
    s->train_idx = s->idx + s->ntest;
    s->test_idx = s->idx;
    int64_t n1 = (int64_t)NPIX * o->hidden, n2 = (int64_t)o->hidden * NCLASS;
    s->w1 = malloc((size_t)n1 * sizeof(float));
    s->w2 = malloc((size_t)n2 * sizeof(float));
    if (!s->w1 || !s->w2) {
        fprintf(stderr, "%s: out of memory for the weights (--hidden %d)\n", prog, o->hidden);
        return 1;
    }
    float b1 = sqrtf(6.0f / (float)NPIX), b2 = sqrtf(6.0f / (float)o->hidden);
    for (int64_t k = 0; k < n1; k++) s->w1[k] = (2.0f * rng_uniform() - 1.0f) * b1;
    for (int64_t k = 0; k < n2; k++) s->w2[k] = (2.0f * rng_uniform() - 1.0f) * b2;
    return 0;
}
static inline void digits_free(digits_setup *s) {
    free(s->idx);
    free(s->w1);
    free(s->w2);
    free(s->all.x);
    free(s->all.y);
}

/* The rows of training step `step` of the current epoch's order. */
static inline void digits_batch(const digits_setup *s, int step, int batch, float *xb, int32_t *yb) {
    for (int b = 0; b < batch; b++) {
        int k = s->train_idx[step * batch + b];
        memcpy(xb + (size_t)b * NPIX, s->all.x + (size_t)k * NPIX, NPIX * sizeof(float));
        yb[b] = s->all.y[k];
    }
}
/* Test accuracy from logits [ntest (or more), 10]. */
static inline double digits_accuracy(const digits_setup *s, const float *logits) {
    int correct = 0;
    for (int i = 0; i < s->ntest; i++) {
        int best = 0;
        for (int c = 1; c < NCLASS; c++)
            if (logits[i * NCLASS + c] > logits[i * NCLASS + best]) best = c;
        correct += best == s->all.y[s->test_idx[i]];
    }
    return (double)correct / s->ntest;
}
/* A [d0] (ndim 1) or [d0, d1] (ndim 2) array of the mesh; spec0, spec1: the
   axes each dimension is split over (NULL: replicated). */
static inline dpar_status digits_array(dpar_mesh *mesh, dpar_dtype t, int ndim, int64_t d0, int64_t d1,
                                       const char *spec0, const char *spec1, dpar_array **out) {
    return dpar_array_create(
        mesh, &(dpar_array_desc){ .dtype = t, .ndim = ndim, .shape = { d0, d1 }, .spec = { spec0, spec1 } }, out);
}

/* The MLP 64-H-10 forward pass on this device's rows:
   h_pre = x W1 + b1, h = relu(h_pre), logits = h W2 + b2.
   x [b, 64]; p: W1 [64, H], b1 [H], W2 [H, 10], b2 [10]; h_pre, h [b, H]
   (h may be h_pre: relu in place); logits [b, 10]; all f32. */
static inline dpar_status digits_forward(dpar_buffer *const p[4], dpar_buffer *x, dpar_buffer *h_pre, dpar_buffer *h,
                                         dpar_buffer *logits) {
    dpar_status s;
    if ((s = dpar_matmul(h_pre, x, p[0], false, false, 1.0f, 0.0f))) return s; /* [b,64] @ [64,H] */
    if ((s = dpar_bias_add(h_pre, p[1]))) return s;
    if ((s = dpar_relu(h, h_pre))) return s;
    if ((s = dpar_matmul(logits, h, p[2], false, false, 1.0f, 0.0f))) return s; /* [b,H] @ [H,10] */
    return dpar_bias_add(logits, p[3]);
}

/* shard_map function for the test set: logits of this device's rows.
   user: the replicated parameter arrays W1, b1, W2, b2; args: x, h, logits. */
static inline dpar_status digits_eval_step(dpar_ctx *ctx, void *user) {
    dpar_array *const *param = (dpar_array *const *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *p[4], *h = dpar_ctx_arg(ctx, 1);
    for (int i = 0; i < 4; i++) p[i] = dpar_array_shard(param[i], dev);
    return digits_forward(p, dpar_ctx_arg(ctx, 0), h, h, dpar_ctx_arg(ctx, 2));
}

static inline int digits_backend(const char *name, dpar_backend_kind *k) {
    return dpar_backend_from_name(name, k) == DPAR_OK ? 0 : -1;
}
#endif
