/* dpar.h CUDA kernels: the elementwise family (dpar_unary, dpar_binary,
   dpar_reduce and the binary gradients, dpar_where, dpar_softmax, the shape
   ops). Conventions as kernels/dpar_kernels.cu: extern "C" dpar_k_* entry
   points whose argument order backends/dpar_cuda.h follows, grid-stride loops
   over 64-bit counts, f32 math (the CPU reference computes in double; parity
   within 2e-5), no atomics (one thread per output, or fixed partial sums
   added in a fixed order: deterministic).
   Geometry (dke_geo): a 4-d iteration shape p[0..3] with per-operand strides
   p[4..7], p[8..11] (and p[12..15] for dpar_where), offsets p[12..14]; see
   >>elementwise ops in dpar.h. */
#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t p[16];
} dke_geo;

#define DKE_TID ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define DKE_STRIDE ((int64_t)gridDim.x * blockDim.x)
#define DKE_GELU_K 0.7978845608028654f

__device__ __forceinline__ float dke_sigm(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float dke_fwd(int u, float v, float s) {
    switch (u) {
    case 0: return -v;
    case 1: return expf(v);
    case 2: return logf(v);
    case 3: return sqrtf(v);
    case 4: return 1.0f / sqrtf(v);
    case 5: return tanhf(v);
    case 6: return dke_sigm(v);
    case 7: return 0.5f * v * (1.0f + tanhf(DKE_GELU_K * (v + 0.044715f * v * v * v)));
    case 8: return 0.5f * v * (1.0f + erff(v * 0.70710678f));
    case 9: return v * dke_sigm(v);
    case 10: return v * v;
    case 11: return v + s;
    case 12: return v * s;
    case 13: return s - v;
    case 14: return v / s;
    case 15: return s / v;
    default: return powf(v, s);
    }
}
__device__ __forceinline__ float dke_deriv(int u, float v, float s) {
    switch (u) {
    case 0: return -1.0f;
    case 1: return expf(v);
    case 2: return 1.0f / v;
    case 3: return 0.5f / sqrtf(v);
    case 4: return -0.5f / (v * sqrtf(v));
    case 5: {
        float t = tanhf(v);
        return 1.0f - t * t;
    }
    case 6: {
        float g = dke_sigm(v);
        return g * (1.0f - g);
    }
    case 7: {
        float t = tanhf(DKE_GELU_K * (v + 0.044715f * v * v * v));
        return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * DKE_GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
    }
    case 8: return 0.5f * (1.0f + erff(v * 0.70710678f)) + v * expf(-0.5f * v * v) * 0.39894228f;
    case 9: {
        float g = dke_sigm(v);
        return g * (1.0f + v * (1.0f - g));
    }
    case 10: return 2.0f * v;
    case 11: return 1.0f;
    case 12: return s;
    case 13: return -1.0f;
    case 14: return 1.0f / s;
    case 15: return -s / (v * v);
    default: return s == 0.0f ? 0.0f : s * powf(v, s - 1.0f);
    }
}

extern "C" {

/* y = op(x), or (bwd) dx = dy * op'(x); u = dpar_unary_op, s its scalar */
__global__ void dpar_k_unary(float *y, const float *x, const float *dy, int64_t n, int u, float s, int bwd) {
    for (int64_t i = DKE_TID; i < n; i += DKE_STRIDE)
        y[i] = bwd ? dy[i] * dke_deriv(u, x[i], s) : dke_fwd(u, x[i], s);
}

/* y[p14 + i] = a[p12 + i.sa] op b[p13 + i.sb]; op = p15 (add, sub, mul, div) */
__global__ void dpar_k_binary(float *y, const float *a, const float *b, dke_geo g, int64_t n) {
    for (int64_t i = DKE_TID; i < n; i += DKE_STRIDE) {
        int64_t r = i, ao = g.p[12], bo = g.p[13];
        for (int d = 3; d >= 0; d--) {
            int64_t c = r % g.p[d];
            r /= g.p[d];
            ao += c * g.p[4 + d];
            bo += c * g.p[8 + d];
        }
        float va = a[ao], vb = b[bo];
        int op = (int)g.p[15];
        y[g.p[14] + i] = op == 0 ? va + vb : op == 1 ? va - vb : op == 2 ? va * vb : va / vb;
    }
}

/* c[d] for the dims that mask selects (sel 1: the reduced ones) or leaves (sel 0: the kept ones), from the
   flat index i over those dims */
__device__ __forceinline__ void dke_unflat(int64_t *c, int64_t i, const dke_geo &g, int64_t mask, int64_t sel) {
    for (int d = 3; d >= 0; d--)
        if ((mask >> d & 1) == sel) {
            c[d] = i % g.p[d];
            i /= g.p[d];
        }
}
/* x's offset at c (dense strides xs) */
__device__ __forceinline__ int64_t dke_xoff(const int64_t *c, const int64_t *xs) {
    return c[0] * xs[0] + c[1] * xs[1] + c[2] * xs[2] + c[3] * xs[3];
}
/* The summand at c of the sum kinds (0, 1, 4..8) */
__device__ __forceinline__ float dke_red_term(int64_t kind, float v, const float *a, const float *b, const dke_geo &g,
                                              const int64_t *c) {
    int64_t ao = 0, bo = 0;
    for (int d = 0; d < 4; d++) {
        ao += c[d] * g.p[4 + d];
        bo += c[d] * g.p[8 + d];
    }
    switch (kind) {
    case 4: return -v;
    case 5: return v * b[bo];
    case 6: return v * a[ao];
    case 7: return v / b[bo];
    case 8: return -v * a[ao] / (b[bo] * b[bo]);
    default: return v;
    }
}
/* xs[d]: the dense strides of shape p[0..3]; returns R, the element count of the dims in mask */
__device__ __forceinline__ int64_t dke_red_shape(const dke_geo &g, int64_t mask, int64_t *xs) {
    int64_t R = 1;
    xs[3] = 1;
    for (int d = 2; d >= 0; d--) xs[d] = xs[d + 1] * g.p[d + 1];
    for (int d = 0; d < 4; d++) R *= (mask >> d & 1) ? g.p[d] : 1;
    return R;
}

/* y[o] = fold over the dims in mask p13 of dense x (shape p[0..3]); kind p12:
   0 sum, 1 mean, 2 max, 3 argmax (i32), 4 -sum, 5 sum(dy b), 6 sum(dy a),
   7 sum(dy / b), 8 sum(-dy a / b^2); a, b at strides p[4..7], p[8..11];
   9 the max backward: y is dx (x's shape), slice o gets a[o] (dy) at its
   first maximum, 0 elsewhere. One thread per output: the host takes
   dpar_k_reduce_cols for few outputs of many elements each. */
__global__ void dpar_k_reduce_axes(void *y, const float *x, const float *a, const float *b, dke_geo g, int64_t nout) {
    int64_t mask = g.p[13], kind = g.p[12], xs[4], R = dke_red_shape(g, mask, xs);
    for (int64_t o = DKE_TID; o < nout; o += DKE_STRIDE) {
        int64_t c[4] = { 0, 0, 0, 0 }, best = -1;
        dke_unflat(c, o, g, mask, 0);
        float acc = 0.0f;
        for (int64_t r = 0; r < R; r++) {
            dke_unflat(c, r, g, mask, 1);
            float v = x[dke_xoff(c, xs)];
            if (kind == 2 || kind == 3 || kind == 9) {
                if (best < 0 || v > acc || (v != v && acc == acc)) {
                    acc = v;
                    best = r;
                }
            } else
                acc += dke_red_term(kind, v, a, b, g, c);
        }
        if (kind == 9) {
            for (int64_t r = 0; r < R; r++) {
                dke_unflat(c, r, g, mask, 1);
                ((float *)y)[dke_xoff(c, xs)] = r == best ? a[o] : 0.0f;
            }
        } else if (kind == 3)
            ((int32_t *)y)[o] = (int32_t)best;
        else
            ((float *)y)[o] = kind == 1 ? acc / (float)R : acc;
    }
}

/* The sum kinds of dpar_k_reduce_axes for few outputs of many elements each (a reduce over rows to [1, N], or
   to a scalar), in the shape of dpar_k_bias_grad that the host derives from the shape alone: block b sums 32
   outputs (tile b % tiles, lane k output tile * 32 + k: a reduce over rows reads whole rows) over one chunk of
   `per` reduced elements (chunk b / tiles), its 8 warps taking every 8th element, then adds the warps' sums in
   warp order. With one chunk it writes y (the mean divided by R), else part[chunk, :], which
   dpar_k_bias_grad_final (dpar_kernels.cu) adds in chunk order. */
#define DKE_RC_WARPS 8
__global__ void dpar_k_reduce_cols(float *y, float *part, const float *x, const float *a, const float *b, dke_geo g,
                                   int64_t nout, int64_t per, int64_t tiles) {
    __shared__ float sh[DKE_RC_WARPS][32];
    int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    int64_t mask = g.p[13], kind = g.p[12], xs[4], R = dke_red_shape(g, mask, xs);
    int64_t tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles, o = tile * 32 + lane;
    int64_t r0 = chunk * per, r1 = r0 + per < R ? r0 + per : R, c[4] = { 0, 0, 0, 0 };
    float s = 0.0f;
    if (o < nout) {
        dke_unflat(c, o, g, mask, 0);
        for (int64_t r = r0 + w; r < r1; r += DKE_RC_WARPS) {
            dke_unflat(c, r, g, mask, 1);
            s += dke_red_term(kind, x[dke_xoff(c, xs)], a, b, g, c);
        }
    }
    sh[w][lane] = s;
    __syncthreads();
    if (w || o >= nout) return;
    for (int k = 1; k < DKE_RC_WARPS; k++) s += sh[k][lane];
    if (gridDim.x == tiles)
        y[o] = kind == 1 ? s / (float)R : s;
    else
        part[chunk * nout + o] = s;
}
/* y[i] = cond[i.sc] ? a[i.sa] : b[i.sb]; cond f32 (nonzero or NaN) or i32 (ci32);
   a / b NULL: av / bv */
__global__ void dpar_k_where(float *y, const void *cond, const float *a, const float *b, dke_geo g, int64_t n,
                             int ci32, float av, float bv) {
    for (int64_t i = DKE_TID; i < n; i += DKE_STRIDE) {
        int64_t r = i, co = 0, ao = 0, bo = 0;
        for (int d = 3; d >= 0; d--) {
            int64_t c = r % g.p[d];
            r /= g.p[d];
            co += c * g.p[4 + d];
            ao += c * g.p[8 + d];
            bo += c * g.p[12 + d];
        }
        int t = ci32 ? ((const int32_t *)cond)[co] != 0 : ((const float *)cond)[co] != 0.0f;
        y[i] = t ? (a ? a[ao] : av) : (b ? b[bo] : bv);
    }
}

/* rows of n: softmax / log_softmax (lg), or (bwd, x = dy, yv = y) their backward */
__global__ void dpar_k_softmax(float *y, const float *x, const float *yv, int64_t m, int64_t n, int lg, int bwd) {
    for (int64_t r = DKE_TID; r < m; r += DKE_STRIDE) {
        const float *xr = x + r * n;
        float *o = y + r * n;
        float acc = 0.0f;
        if (bwd) {
            const float *yr = yv + r * n;
            for (int64_t j = 0; j < n; j++) acc += lg ? xr[j] : xr[j] * yr[j];
            for (int64_t j = 0; j < n; j++) o[j] = lg ? xr[j] - expf(yr[j]) * acc : yr[j] * (xr[j] - acc);
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) mx = (xr[j] > mx || xr[j] != xr[j]) ? xr[j] : mx;
        for (int64_t j = 0; j < n; j++) acc += expf(xr[j] - mx);
        float lse = logf(acc);
        for (int64_t j = 0; j < n; j++) {
            float z = xr[j] - mx;
            o[j] = lg ? z - lse : expf(z) / acc;
        }
    }
}

/* dst[p13 + i.ds] = src[p12 + i.ss], 4-byte elements (the shape ops) */
__global__ void dpar_k_strided(uint32_t *dst, const uint32_t *src, dke_geo g, int64_t n) {
    for (int64_t i = DKE_TID; i < n; i += DKE_STRIDE) {
        int64_t r = i, so = g.p[12], o = g.p[13];
        for (int d = 3; d >= 0; d--) {
            int64_t c = r % g.p[d];
            r /= g.p[d];
            so += c * g.p[4 + d];
            o += c * g.p[8 + d];
        }
        dst[o] = src[so];
    }
}

} /* extern "C" */
