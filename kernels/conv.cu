/* dpar.h CUDA kernels of conv2d and the 2-D pools (NHWC input, HWIO kernel).

   Same conventions as dpar_kernels.cu (extern "C" dpar_k_* entry points,
   arguments in the order the host passes them, grid-stride loops over
   64-bit counts). conv2d and its gradients are GEMMs in cuBLAS over a column
   matrix (im2col, as the CPU backend); the kernels here make the column
   matrix and fold its gradient back into the image. The pools follow
   shaders/pool2d*.comp: one thread per output element, each a gather (no
   atomics), so results repeat bit for bit, adding in the CPU backend's order.
   The geometry is dpar__win2d of dpar.h passed by value (dkc_win). */
#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t n, h, w, c, oh, ow, o, kh, kw, sh, sw, dh, dw, pt, pl, flags; /* flags bit 0: avg excludes padding */
} dkc_win;

#define DKC_TID    ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define DKC_STRIDE ((int64_t)gridDim.x * blockDim.x)

extern "C" {

/* The column matrix of images [n0, n0 + rows / (oh*ow)): col[r, (p*kw + q)*c + ci] =
   x[n0 + r / (oh*ow), i*sh - pt + p*dh, j*sw - pl + q*dw, ci] with r = (nb*oh + i)*ow + j, 0 outside the
   image; total = rows * kh*kw*c. conv2d is then one GEMM with the HWIO kernel as a [kh*kw*c, o] matrix. */
__global__ void dpar_k_im2col(float *col, const float *x, dkc_win g, int64_t n0, int64_t total) {
    int64_t kc = g.kh * g.kw * g.c;
    for (int64_t e = DKC_TID; e < total; e += DKC_STRIDE) {
        int64_t ci = e % g.c, t = e / g.c, q = t % g.kw, p = (t / g.kw) % g.kh, r = e / kc;
        int64_t j = r % g.ow, i = (r / g.ow) % g.oh, nb = n0 + r / (g.ow * g.oh);
        int64_t ih = i * g.sh - g.pt + p * g.dh, iw = j * g.sw - g.pl + q * g.dw;
        col[e] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? x[((nb * g.h + ih) * g.w + iw) * g.c + ci] : 0.0f;
    }
}

/* The input gradient of images [n0, n0 + total / (h*w*c)) from the column gradient dcol (the layout of
   dpar_k_im2col): dx[n0 + nb, ih, iw, ci] = the sum over the taps (p, q) whose output (i, j) reads that
   pixel of dcol[(nb*oh + i)*ow + j, (p*kw + q)*c + ci]. A gather in tap order (no atomics): results repeat
   bit for bit. */
__global__ void dpar_k_col2im(float *dx, const float *dcol, dkc_win g, int64_t n0, int64_t total) {
    int64_t kc = g.kh * g.kw * g.c;
    for (int64_t e = DKC_TID; e < total; e += DKC_STRIDE) {
        int64_t ci = e % g.c, r = e / g.c, iw = r % g.w, ih = (r / g.w) % g.h, nb = r / (g.w * g.h);
        float acc = 0.0f;
        for (int64_t p = 0; p < g.kh; p++) {
            int64_t ti = ih + g.pt - p * g.dh;
            if (ti < 0 || ti % g.sh != 0 || ti / g.sh >= g.oh) continue;
            for (int64_t q = 0; q < g.kw; q++) {
                int64_t tj = iw + g.pl - q * g.dw;
                if (tj < 0 || tj % g.sw != 0 || tj / g.sw >= g.ow) continue;
                acc += dcol[((nb * g.oh + ti / g.sh) * g.ow + tj / g.sw) * kc + (p * g.kw + q) * g.c + ci];
            }
        }
        dx[n0 * g.h * g.w * g.c + e] = acc;
    }
}

/* the in-image part [h0, h1) x [w0, w1) of window (i, j) and its avg divisor */
__device__ int64_t dkc_span(const dkc_win *g, int64_t i, int64_t j, int64_t *h0, int64_t *h1, int64_t *w0,
                            int64_t *w1) {
    int64_t a = i * g->sh - g->pt, b = j * g->sw - g->pl;
    *h0 = a < 0 ? 0 : a, *w0 = b < 0 ? 0 : b;
    *h1 = a + g->kh < g->h ? a + g->kh : g->h, *w1 = b + g->kw < g->w ? b + g->kw : g->w;
    if (*h1 < *h0) *h1 = *h0;
    if (*w1 < *w0) *w1 = *w0;
    return (g->flags & 1) ? (*h1 - *h0) * (*w1 - *w0) : g->kh * g->kw;
}
/* index into x of the first maximum of window (i, j), channel c (NaN beats numbers); -1: no in-image position */
__device__ int64_t dkc_argmax(const dkc_win *g, const float *x, int64_t nb, int64_t i, int64_t j, int64_t c) {
    int64_t h0, h1, w0, w1, best = -1;
    float bv = 0.0f;
    dkc_span(g, i, j, &h0, &h1, &w0, &w1);
    for (int64_t h = h0; h < h1; h++)
        for (int64_t w = w0; w < w1; w++) {
            int64_t at = ((nb * g->h + h) * g->w + w) * g->c + c;
            float v = x[at];
            if (best < 0 || v > bv || (v != v && bv == bv)) best = at, bv = v;
        }
    return best;
}

/* avg (is_max 0) or max pool forward, one thread per y element */
__global__ void dpar_k_pool2d(float *y, const float *x, dkc_win g, int is_max, int64_t total) {
    for (int64_t e = DKC_TID; e < total; e += DKC_STRIDE) {
        int64_t c = e % g.c, r = e / g.c, j = r % g.ow, i = (r / g.ow) % g.oh, nb = r / (g.ow * g.oh);
        if (is_max) {
            int64_t m = dkc_argmax(&g, x, nb, i, j, c);
            y[e] = m >= 0 ? x[m] : -INFINITY;
            continue;
        }
        int64_t h0, h1, w0, w1, cnt = dkc_span(&g, i, j, &h0, &h1, &w0, &w1);
        float acc = 0.0f;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t w = w0; w < w1; w++) acc += x[((nb * g.h + h) * g.w + w) * g.c + c];
        y[e] = cnt ? acc / (float)cnt : NAN; /* an empty window: 0/0, as the CPU */
    }
}

/* the pools' gradient, one thread per dx element: the windows holding it in ascending order */
__global__ void dpar_k_pool2d_bwd(float *dx, const float *dy, const float *x, dkc_win g, int is_max, int64_t total) {
    for (int64_t e = DKC_TID; e < total; e += DKC_STRIDE) {
        int64_t c = e % g.c, r = e / g.c, iw = r % g.w, ih = (r / g.w) % g.h, nb = r / (g.w * g.h);
        int64_t ti = ih + g.pt - g.kh + 1, tj = iw + g.pl - g.kw + 1;
        int64_t i0 = ti <= 0 ? 0 : (ti + g.sh - 1) / g.sh, j0 = tj <= 0 ? 0 : (tj + g.sw - 1) / g.sw;
        int64_t i1 = (ih + g.pt) / g.sh, j1 = (iw + g.pl) / g.sw;
        if (i1 > g.oh - 1) i1 = g.oh - 1;
        if (j1 > g.ow - 1) j1 = g.ow - 1;
        float acc = 0.0f;
        for (int64_t i = i0; i <= i1; i++)
            for (int64_t j = j0; j <= j1; j++) {
                float gy = dy[((nb * g.oh + i) * g.ow + j) * g.c + c];
                if (is_max) {
                    if (dkc_argmax(&g, x, nb, i, j, c) == e) acc += gy;
                } else {
                    int64_t h0, h1, w0, w1, cnt = dkc_span(&g, i, j, &h0, &h1, &w0, &w1);
                    acc += gy / (float)cnt;
                }
            }
        dx[e] = acc;
    }
}

} /* extern "C" */
