/* mnist_common.h — the MNIST data of the CNN examples: 5,000 images
   (examples/data/mnist_5k.csv.gz: 784 pixels 0..255 then the label per row,
   rows grouped by class), scaled to [0, 1], shuffled with a fixed seed and
   split 1,000 test / 4,000 train. The random numbers come from
   digits_common.h's splitmix64 stream, so the peers in bench/peers/
   (cnn_common.py) reproduce the split, the batches and the initial weights
   bit for bit. Included by the examples (not compiled on its own). */
#ifndef MNIST_COMMON_H
#define MNIST_COMMON_H
#include "digits_common.h" /* dataset, splitmix64 (rng_next, rng_uniform, shuffle), now_s */

#define MNIST_SIDE  28
#define MNIST_PIX   (MNIST_SIDE * MNIST_SIDE)
#define MNIST_NTEST 1000

/* Reads up to `cap` rows of 784 pixels 0..255 and a label; pixels / 255 -> x
   [n, 784] f32 (= NHWC [n, 28, 28, 1]), labels -> y [n] i32. 0 on success;
   else prints what is wrong (csv_load: the line and field) and returns -1. */
static inline int mnist_load(const char *prog, const char *path, int cap, dataset *d) {
    return csv_load(prog, path, MNIST_PIX, 255, 255.0f, cap, d);
}

/* The data and its split; train_idx and test_idx point into idx. */
typedef struct {
    dataset all;
    int *idx, *train_idx, *test_idx, ntrain, ntest;
} mnist_data;

/* Loads `path`, seeds the stream with `seed`, shuffles the rows and splits
   them: the first MNIST_NTEST are the test set, the rest the training set.
   The next draws of the stream (the weights, then each epoch's shuffle) are
   the caller's. 0 on success; prints why and returns 1 otherwise. */
static inline int mnist_prepare(const char *prog, const char *path, uint64_t seed, mnist_data *m) {
    memset(m, 0, sizeof *m);
    if (mnist_load(prog, path, 5000, &m->all)) return 1; /* it said why */
    if (m->all.n <= MNIST_NTEST) {
        fprintf(stderr, "%s: %s holds %d images; want more than %d (%d test images, the rest for training)\n", prog,
                path, m->all.n, MNIST_NTEST, MNIST_NTEST);
        return 1;
    }
    rng_state = seed;
    m->idx = malloc((size_t)m->all.n * sizeof(int));
    for (int i = 0; i < m->all.n; i++) m->idx[i] = i;
    shuffle(m->idx, m->all.n);
    m->ntest = MNIST_NTEST;
    m->ntrain = m->all.n - MNIST_NTEST;
    m->test_idx = m->idx;
    m->train_idx = m->idx + MNIST_NTEST;
    return 0;
}

/* Copies the images and labels of rows[0..n) into x [n, 784] and y [n]. */
static inline void mnist_gather(const mnist_data *m, const int *rows, int n, float *x, int32_t *y) {
    for (int b = 0; b < n; b++) {
        memcpy(x + (size_t)b * MNIST_PIX, m->all.x + (size_t)rows[b] * MNIST_PIX, MNIST_PIX * sizeof(float));
        if (y) y[b] = m->all.y[rows[b]];
    }
}

static inline void mnist_free(mnist_data *m) {
    free(m->idx);
    free(m->all.x);
    free(m->all.y);
}
#endif
