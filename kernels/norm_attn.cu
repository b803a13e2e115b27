/* dpar.h CUDA kernels of the layer ops: layer / RMS norm and attention
   (the batched matmul goes through cuBLAS in backends/dpar_cuda.h).

   Same conventions as dpar_kernels.cu (extern "C" dpar_k_* entry points,
   arguments in the order the host passes them, grid-stride loops over
   64-bit counts, fixed reduction trees so results repeat bit for bit), and
   the same algorithms as shaders/layernorm*.comp and attention*.comp:
   - norms: one block of 256 per row, the mean shifted by the row's first
     element (a constant row has exactly zero variance); dw/db as the bias
     gradient: 32-column tiles over chunks of rows, then the chunks in order.
   - attention: one block of 64 per query row (forward, backward pass 1) or
     key row (backward pass 2), keys / queries in chunks of 64, an online
     softmax in the forward; no Tq x Tk matrix. D, Dv <= 512 (checked on
     the host). */
#include <math.h>
#include <stdint.h>

#define DK_NA_HEAD 512

extern "C" {

/* ---- norms --------------------------------------------------------------- */
/* The sum (or, is_max, the largest) of v over a block of 256 threads, by a fixed tree */
__device__ float dk_block_red256(float v, float *red, int is_max) {
    int t = threadIdx.x;
    red[t] = v;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (t < s) red[t] = is_max ? fmaxf(red[t], red[t + s]) : red[t] + red[t + s];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

/* rstd of a row whose sum of squares overflows f32: the deviations scaled by their largest magnitude s
   first (see shaders/layernorm.comp); a row holding inf keeps the plain rstd, as the CPU. */
__device__ float dk_scaled_rstd(const float *xr, int64_t n, float mean, float plain, float *red) {
    int t = threadIdx.x;
    float s = 0.0f, sq = 0.0f;
    for (int64_t j = t; j < n; j += 256) s = fmaxf(s, fabsf(xr[j] - mean));
    s = dk_block_red256(s, red, 1);
    if (isinf(s)) return plain;
    for (int64_t j = t; j < n; j += 256) {
        float d = (xr[j] - mean) / s;
        sq += d * d;
    }
    return 1.0f / (s * sqrtf(dk_block_red256(sq, red, 0) / (float)n));
}

/* y = (x - mean) rstd w + b per row of x [m, n]; stats[2r] = mean, [2r+1] = rstd (stats may be 0) */
__global__ void dpar_k_norm_fwd(const float *x, const float *w, const float *b, float *y, float *stats, int64_t m,
                                int64_t n, float eps, int rms) {
    __shared__ float red[256];
    int t = threadIdx.x;
    for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
        const float *xr = x + r * n;
        float x0 = xr[0], acc = 0.0f, sq = 0.0f;
        if (!rms)
            for (int64_t j = t; j < n; j += 256) acc += xr[j] - x0;
        float mean = rms ? 0.0f : x0 + dk_block_red256(acc, red, 0) / (float)n;
        for (int64_t j = t; j < n; j += 256) {
            float d = xr[j] - mean;
            sq += d * d;
        }
        float var = dk_block_red256(sq, red, 0) / (float)n;
        float rstd = 1.0f / sqrtf(var + eps);
        if (isinf(var)) rstd = dk_scaled_rstd(xr, n, mean, rstd, red); /* uniform: one sum per block */
        for (int64_t j = t; j < n; j += 256) {
            float xh = (xr[j] - mean) * rstd;
            y[r * n + j] = (w ? xh * w[j] : xh) + (b ? b[j] : 0.0f);
        }
        if (t == 0 && stats) {
            stats[2 * r] = mean;
            stats[2 * r + 1] = rstd;
        }
    }
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w; dx may alias dy (read before written) */
__global__ void dpar_k_norm_bwd(const float *dy, const float *x, const float *w, const float *stats, float *dx,
                                int64_t m, int64_t n, int rms) {
    __shared__ float red[256];
    int t = threadIdx.x;
    for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
        float mean = stats[2 * r], rstd = stats[2 * r + 1], sg = 0.0f, sgx = 0.0f;
        for (int64_t j = t; j < n; j += 256) {
            float xh = (x[r * n + j] - mean) * rstd, g = w ? dy[r * n + j] * w[j] : dy[r * n + j];
            sg += g;
            sgx += g * xh;
        }
        float mg = dk_block_red256(sg, red, 0) / (float)n;
        float mgx = dk_block_red256(sgx, red, 0) / (float)n;
        if (rms) mg = 0.0f;
        for (int64_t j = t; j < n; j += 256) {
            float xh = (x[r * n + j] - mean) * rstd, g = w ? dy[r * n + j] * w[j] : dy[r * n + j];
            dx[r * n + j] = rstd * (g - mg - xh * mgx);
        }
    }
}

/* dw[j] = sum_r dy xhat, db[j] = sum_r dy (either may be 0), in the shape of dpar_k_bias_grad (dpar_kernels.cu),
   which the host derives from m and n alone: block b sums 32 columns (tile b % tiles) over one chunk of `rows`
   rows (chunk b / tiles), its 8 warps taking every 8th row (whole rows, coalesced), then adds the warps' sums in
   warp order. With one chunk it writes dw, db; else part[chunk, :] (dw) and part[chunks + chunk, :] (db), which
   dpar_k_bias_grad_final adds in chunk order. One thread per column summing every row left all but a few warps
   idle on the GPT's [B*T, 128] norms. */
#define DK_NW_WARPS 8
__global__ void dpar_k_norm_wgrad(const float *dy, const float *x, const float *stats, float *dw, float *db,
                                  float *part, int64_t m, int64_t n, int64_t rows, int64_t tiles) {
    __shared__ float shw[DK_NW_WARPS][32], shb[DK_NW_WARPS][32];
    int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    int64_t tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles, chunks = gridDim.x / tiles, j = tile * 32 + lane;
    int64_t r0 = chunk * rows, r1 = r0 + rows < m ? r0 + rows : m;
    float aw = 0.0f, ab = 0.0f;
    if (j < n)
        for (int64_t r = r0 + w; r < r1; r += DK_NW_WARPS) {
            float g = dy[r * n + j];
            aw += g * ((x[r * n + j] - stats[2 * r]) * stats[2 * r + 1]);
            ab += g;
        }
    shw[w][lane] = aw;
    shb[w][lane] = ab;
    __syncthreads();
    if (w || j >= n) return;
    for (int k = 1; k < DK_NW_WARPS; k++) {
        aw += shw[k][lane];
        ab += shb[k][lane];
    }
    if (chunks == 1) {
        if (dw) dw[j] = aw;
        if (db) db[j] = ab;
    } else {
        part[chunk * n + j] = aw;
        part[(chunks + chunk) * n + j] = ab;
    }
}

/* ---- attention ------------------------------------------------------------ */
__device__ float dk_block_red64(float v, float *red, int is_max) {
    int t = threadIdx.x;
    red[t] = v;
    __syncthreads();
    for (int h = 32; h > 0; h >>= 1) {
        if (t < h) red[t] = is_max ? fmaxf(red[t], red[t + h]) : red[t] + red[t + h];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

/* g[0..5] = BH, Tq, Tk, D, Dv, causal. out [BH,Tq,Dv], stats [BH,Tq,2] (lse, 0) or 0 */
__global__ void dpar_k_attn_fwd(const float *q, const float *k, const float *v, float *out, float *stats, int64_t bh,
                                int64_t tq, int64_t tk, int64_t d, int64_t dv, int causal, float scale) {
    __shared__ float qs[DK_NA_HEAD], acc[DK_NA_HEAD], s[64], red[64];
    int t = threadIdx.x;
    const float ninf = -__uint_as_float(0x7f800000u);
    for (int64_t row = blockIdx.x; row < bh * tq; row += gridDim.x) {
        int64_t b = row / tq, i = row % tq, nk = causal ? i + 1 : tk;
        for (int64_t e = t; e < d; e += 64) qs[e] = q[row * d + e];
        for (int64_t e = t; e < dv; e += 64) acc[e] = 0.0f;
        __syncthreads();
        float mx = ninf, l = 0.0f;
        for (int64_t c0 = 0; c0 < nk; c0 += 64) {
            int64_t j = c0 + t;
            float sc = ninf;
            if (j < nk) {
                float a = 0.0f;
                for (int64_t e = 0; e < d; e++) a += qs[e] * k[(b * tk + j) * d + e];
                sc = scale * a;
            }
            float nmx = fmaxf(mx, dk_block_red64(sc, red, 1));
            float alpha = expf(mx - nmx);
            float pj = j < nk ? expf(sc - nmx) : 0.0f;
            s[t] = pj;
            l = l * alpha + dk_block_red64(pj, red, 0);
            int64_t cend = nk - c0 < 64 ? nk - c0 : 64;
            for (int64_t e = t; e < dv; e += 64) {
                float a = acc[e] * alpha;
                for (int64_t jj = 0; jj < cend; jj++) a += s[jj] * v[(b * tk + c0 + jj) * dv + e];
                acc[e] = a;
            }
            mx = nmx;
            __syncthreads();
        }
        for (int64_t e = t; e < dv; e += 64) out[row * dv + e] = nk == 0 ? 0.0f : acc[e] / l;
        if (t == 0 && stats) {
            stats[2 * row] = mx + logf(l);
            stats[2 * row + 1] = 0.0f;
        }
        __syncthreads();
    }
}

/* P_ij, dp_ij of key j for the row held in qs / dos (0, 0 past the row's keys) */
__device__ void dk_attn_p_dp(const float *qs, const float *dos, const float *k, const float *v, int64_t b, int64_t j,
                             int64_t nk, int64_t tk, int64_t d, int64_t dv, float scale, float lse, float *pj,
                             float *dpj) {
    *pj = 0.0f;
    *dpj = 0.0f;
    if (j >= nk) return;
    float a = 0.0f, e2 = 0.0f;
    for (int64_t e = 0; e < d; e++) a += qs[e] * k[(b * tk + j) * d + e];
    for (int64_t e = 0; e < dv; e++) e2 += dos[e] * v[(b * tk + j) * dv + e];
    *pj = expf(scale * a - lse);
    *dpj = e2;
}

/* pass 1 over query rows: D_i -> stats[2 row + 1], dq (may be 0) */
__global__ void dpar_k_attn_bwd_q(const float *dout, const float *q, const float *k, const float *v, float *stats,
                                  float *dq, int64_t bh, int64_t tq, int64_t tk, int64_t d, int64_t dv, int causal,
                                  float scale) {
    __shared__ float qs[DK_NA_HEAD], dos[DK_NA_HEAD], acc[DK_NA_HEAD], s[64], red[64];
    int t = threadIdx.x;
    for (int64_t row = blockIdx.x; row < bh * tq; row += gridDim.x) {
        int64_t b = row / tq, i = row % tq, nk = causal ? i + 1 : tk;
        float lse = stats[2 * row], dsum = 0.0f, pj, dpj;
        for (int64_t e = t; e < d; e += 64) {
            qs[e] = q[row * d + e];
            acc[e] = 0.0f;
        }
        for (int64_t e = t; e < dv; e += 64) dos[e] = dout[row * dv + e];
        __syncthreads();
        for (int64_t c0 = 0; c0 < nk; c0 += 64) {
            dk_attn_p_dp(qs, dos, k, v, b, c0 + t, nk, tk, d, dv, scale, lse, &pj, &dpj);
            dsum += dk_block_red64(pj * dpj, red, 0);
        }
        if (dq) {
            for (int64_t c0 = 0; c0 < nk; c0 += 64) {
                dk_attn_p_dp(qs, dos, k, v, b, c0 + t, nk, tk, d, dv, scale, lse, &pj, &dpj);
                s[t] = pj * (dpj - dsum);
                __syncthreads();
                int64_t cend = nk - c0 < 64 ? nk - c0 : 64;
                for (int64_t e = t; e < d; e += 64) {
                    float a = acc[e];
                    for (int64_t jj = 0; jj < cend; jj++) a += s[jj] * k[(b * tk + c0 + jj) * d + e];
                    acc[e] = a;
                }
                __syncthreads();
            }
            for (int64_t e = t; e < d; e += 64) dq[row * d + e] = scale * acc[e];
        }
        if (t == 0) stats[2 * row + 1] = dsum;
        __syncthreads();
    }
}

/* pass 2 over key rows: dk, dv (either may be 0) from lse_i, D_i in stats */
__global__ void dpar_k_attn_bwd_kv(const float *dout, const float *q, const float *k, const float *v,
                                   const float *stats, float *dk, float *dvv, int64_t bh, int64_t tq, int64_t tk,
                                   int64_t d, int64_t dv, int causal, float scale) {
    __shared__ float ks[DK_NA_HEAD], vs[DK_NA_HEAD], ak[DK_NA_HEAD], av[DK_NA_HEAD], ps[64], dss[64];
    int t = threadIdx.x;
    for (int64_t krow = blockIdx.x; krow < bh * tk; krow += gridDim.x) {
        int64_t b = krow / tk, j = krow % tk, i0 = causal ? j : 0;
        for (int64_t e = t; e < d; e += 64) {
            ks[e] = k[krow * d + e];
            ak[e] = 0.0f;
        }
        for (int64_t e = t; e < dv; e += 64) {
            vs[e] = v[krow * dv + e];
            av[e] = 0.0f;
        }
        __syncthreads();
        for (int64_t c0 = i0; c0 < tq; c0 += 64) {
            int64_t i = c0 + t;
            float pj = 0.0f, ds = 0.0f;
            if (i < tq) {
                int64_t row = b * tq + i;
                float a = 0.0f, dp = 0.0f;
                for (int64_t e = 0; e < d; e++) a += q[row * d + e] * ks[e];
                for (int64_t e = 0; e < dv; e++) dp += dout[row * dv + e] * vs[e];
                pj = expf(scale * a - stats[2 * row]);
                ds = pj * (dp - stats[2 * row + 1]);
            }
            ps[t] = pj;
            dss[t] = ds;
            __syncthreads();
            int64_t cend = tq - c0 < 64 ? tq - c0 : 64;
            for (int64_t e = t; e < d; e += 64) {
                float a = ak[e];
                for (int64_t ii = 0; ii < cend; ii++) a += dss[ii] * q[(b * tq + c0 + ii) * d + e];
                ak[e] = a;
            }
            for (int64_t e = t; e < dv; e += 64) {
                float a = av[e];
                for (int64_t ii = 0; ii < cend; ii++) a += ps[ii] * dout[(b * tq + c0 + ii) * dv + e];
                av[e] = a;
            }
            __syncthreads();
        }
        for (int64_t e = t; dk && e < d; e += 64) dk[krow * d + e] = scale * ak[e];
        for (int64_t e = t; dvv && e < dv; e += 64) dvv[krow * dv + e] = av[e];
        __syncthreads();
    }
}

} /* extern "C" */
