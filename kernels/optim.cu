/* dpar.h CUDA kernels of the optimizer and training ops (issue 13): AdamW,
   cross-entropy with an ignore label and label smoothing, embedding and its
   gradient, dropout (Philox-4x32-10), and the index check whose error words
   the backend reports at the next sync or read.

   Same conventions as dpar_kernels.cu (grid-stride loops over 64-bit counts,
   compiled with --fmad=false and IEEE division and square root): AdamW,
   embedding, its gradient and dropout give the CPU reference's bits. Only
   plain integer and float arithmetic (no intrinsics), so the mock driver runs
   them as host C++; dpar_k_embed_sort's shared tile and __syncthreads run on
   the mock's threaded blocks. */
#include <stdint.h>

#include "opt_guard.cuh"

/* AdamW (formula at dpar_adamw_desc), the CPU loop's operation order; skipped while the device's index-check
   error words hold an error, the step counted under the graph's id by its first update (opt_guard.cuh) */
extern "C" __global__ void dpar_k_adamw(float *p, float *m, float *v, const float *gr, int64_t n, float lr, float b1,
                                        float b2, float eps, float wd, float cs, float c1, float c2, uint32_t *err,
                                        uint32_t graph) {
    if (dk_opt_skipped(err, graph, blockIdx.x == 0 && threadIdx.x == 0)) return;
    const float ob1 = 1.0f - b1, ob2 = 1.0f - b2;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gr[i] * cs;
        float mi = b1 * m[i] + ob1 * g, vi = b2 * v[i] + ob2 * (g * g);
        m[i] = mi;
        v[i] = vi;
        float u = (mi * c1) / (sqrtf(vi * c2) + eps) + wd * p[i];
        p[i] = p[i] - lr * u;
    }
}

/* One thread: the first position of idx[0..n) outside 0..bound-1 (the ignore
   label excepted when use_ignore) into err = { 1, position, value, fn, bound },
   unless an earlier op set err first. Labels and indices are few per step. */
extern "C" __global__ void dpar_k_check_index(const int32_t *idx, int64_t n, int64_t bound, int use_ignore,
                                              int32_t ignore, int fn, uint32_t *err) {
    if (blockIdx.x != 0 || threadIdx.x != 0 || err[0] != 0u) return;
    for (int64_t i = 0; i < n; i++) {
        int32_t v = idx[i];
        if ((v < 0 || (int64_t)v >= bound) && !(use_ignore && v == ignore)) {
            err[1] = (uint32_t)i;
            err[2] = (uint32_t)v;
            err[3] = (uint32_t)fn;
            err[4] = (uint32_t)bound;
            err[0] = 1u;
            return;
        }
    }
}

/* One thread: count[0] = rows not labelled `ignore` (all rows when !use_ignore) */
extern "C" __global__ void dpar_k_count_rows(const int32_t *labels, int64_t m, int use_ignore, int32_t ignore,
                                             double *count) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int64_t c = 0;
    for (int64_t i = 0; i < m; i++) c += !(use_ignore && labels[i] == ignore);
    count[0] = (double)c;
}

/* Cross-entropy rows with an ignore label and smoothing a, one warp per row (the lanes over the classes, their
   maxima and sums met by xor shuffles: the same in every lane, a fixed order), in double as the CPU reference:
   rowloss[r] = lse - q . z (0 when ignored), dlogits = (softmax - q) / count[0] (zero rows when ignored). A
   label out of range gives NaN (dpar_k_check_index reports it). */
extern "C" __global__ void dpar_k_xent_ignore_rows(const float *z, const int32_t *labels, int64_t m, int64_t c,
                                                   int use_ignore, int32_t ignore, float smoothing,
                                                   const double *count, double *rowloss, float *dlogits) {
    const double a = (double)smoothing, qnan = (double)__uint_as_float(0x7fc00000u);
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t r = warp; r < m; r += nwarps) { /* uniform in the warp */
        const float *zr = z + r * c;
        int32_t lab = labels[r];
        if (use_ignore && lab == ignore) {
            if (lane == 0) rowloss[r] = 0.0;
            for (int64_t j = lane; dlogits && j < c; j += 32) dlogits[r * c + j] = 0.0f;
            continue;
        }
        int ok = lab >= 0 && (int64_t)lab < c;
        float mx = -__uint_as_float(0x7f800000u);
        for (int64_t j = lane; j < c; j += 32) mx = (zr[j] > mx || zr[j] != zr[j]) ? zr[j] : mx;
        for (int o = 16; o > 0; o >>= 1) {
            float v = __shfl_xor_sync(0xffffffffu, mx, o);
            mx = (v > mx || v != v) ? v : mx;
        }
        double se = 0.0, zs = 0.0;
        for (int64_t j = lane; j < c; j += 32) {
            double d = (double)zr[j] - (double)mx;
            se += exp(d);
            zs += a != 0.0 ? d : 0.0;
        }
        for (int o = 16; o > 0; o >>= 1) {
            se += __shfl_xor_sync(0xffffffffu, se, o);
            zs += __shfl_xor_sync(0xffffffffu, zs, o);
        }
        double lse_rel = log(se);
        double rl = a == 0.0 ? ((double)mx - (double)zr[ok ? lab : 0]) + lse_rel
                             : (1.0 - a) * (((double)mx - (double)zr[ok ? lab : 0]) + lse_rel) +
                                   a * (lse_rel - zs / (double)c);
        if (lane == 0) rowloss[r] = ok ? rl : qnan;
        for (int64_t j = lane; dlogits && j < c; j += 32) {
            double p = exp((double)zr[j] - (double)mx) / se, q = (j == lab ? 1.0 - a : 0.0) + a / (double)c;
            dlogits[r * c + j] = ok ? (float)((p - q) / count[0]) : (float)qnan;
        }
    }
}

/* One thread: out[0] = sum of the partials in order / count[0] (0 with no counted row) */
extern "C" __global__ void dpar_k_div_final(const double *partials, int64_t parts, const double *count, float *out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double s = 0.0;
    for (int64_t i = 0; i < parts; i++) s += partials[i];
    out[0] = count[0] > 0.0 ? (float)(s / count[0]) : 0.0f;
}

/* out[i, d] = table[idx[i], d]; 0 for a bad index (reported by the check) */
extern "C" __global__ void dpar_k_embed(float *out, const float *tab, const int32_t *idx, int64_t k, int64_t d,
                                        int64_t v) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < k * d; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / d, j = e - i * d;
        int32_t r = idx[i];
        out[e] = (r >= 0 && (int64_t)r < v) ? tab[(int64_t)r * d + j] : 0.0f;
    }
}

/* The embedding gradient, parallel over tokens and columns yet in the CPU's order: a stable sort of the
   token positions by row (dpar_k_embed_sort within tiles of DK_EMBED_TILE, dpar_k_embed_merge across them)
   lets one thread per (row present, column) add that row's tokens in increasing position. Keys are the
   rows, DK_EMBED_BAD for an index outside 0..v-1 (sorted last, never added; the check reports it). */
#define DK_EMBED_TILE 2048 /* tokens per block of dpar_k_embed_sort (DPAR__CU_EMBED_TILE) */
#define DK_EMBED_BAD  0xffffffffu
/* One block per tile of tokens: skey / stok[tile] = its keys / positions sorted by (key, position), each
   token's place counted against the whole tile in shared memory (no atomics: the same bits every run). */
extern "C" __global__ void dpar_k_embed_sort(uint32_t *skey, uint32_t *stok, const int32_t *idx, int64_t k,
                                             int64_t v) {
    __shared__ uint32_t key[DK_EMBED_TILE];
    const int64_t base = (int64_t)blockIdx.x * DK_EMBED_TILE;
    const int n = (int)(k - base < DK_EMBED_TILE ? k - base : DK_EMBED_TILE);
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        int32_t r = idx[base + t];
        key[t] = r >= 0 && (int64_t)r < v ? (uint32_t)r : DK_EMBED_BAD;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        uint32_t x = key[t];
        int pos = 0;
        for (int u = 0; u < n; u++) pos += key[u] < x || (key[u] == x && u < t);
        skey[base + pos] = x;
        stok[base + pos] = (uint32_t)(base + t);
    }
}
/* The keys of the sorted s[0..n) before x: those < x, or <= x with `ties` (binary search) */
__device__ __forceinline__ int64_t dk_embed_before(const uint32_t *s, int64_t n, uint32_t x, int ties) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s[mid] < x || (ties && s[mid] == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
/* Token e of the sorted tiles to its place in the whole stable order: its place in its tile plus, in every
   other tile, the keys before it (<= its key in earlier tiles, < in later ones). */
extern "C" __global__ void dpar_k_embed_merge(uint32_t *order, uint32_t *srow, const uint32_t *skey,
                                              const uint32_t *stok, int64_t k) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < k; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = e / DK_EMBED_TILE;
        const uint32_t x = skey[e];
        int64_t pos = e - b * DK_EMBED_TILE;
        for (int64_t c = 0; c * DK_EMBED_TILE < k; c++) {
            int64_t n = k - c * DK_EMBED_TILE < DK_EMBED_TILE ? k - c * DK_EMBED_TILE : DK_EMBED_TILE;
            if (c != b) pos += dk_embed_before(skey + c * DK_EMBED_TILE, n, x, c < b);
        }
        order[pos] = stok[e];
        srow[pos] = x;
    }
}
/* dt[row, j] += dout[i, j] over the row's tokens i in increasing order: one thread per (sorted token, column),
   only a row's first token in the sorted order working (the CPU's order and bits). The run's end comes first
   (srow ascends), so that the loop knows its length and keeps 8 rows' loads in flight ahead of the adds: a
   frequent row (a character-level GPT's space) is hundreds of tokens long. */
extern "C" __global__ void dpar_k_embed_bwd(float *dt, const float *dout, const uint32_t *order, const uint32_t *srow,
                                            int64_t k, int64_t d) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < k * d; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t p = e / d, j = e - p * d;
        uint32_t r = srow[p];
        if (r == DK_EMBED_BAD || (p > 0 && srow[p - 1] == r)) continue;
        const int64_t end = p + 1 + dk_embed_before(srow + p + 1, k - p - 1, r, 1);
        float s = dt[(int64_t)r * d + j], x[8];
        int64_t q = p;
        for (; q + 8 <= end; q += 8) {
            for (int u = 0; u < 8; u++) x[u] = dout[(int64_t)order[q + u] * d + j];
            for (int u = 0; u < 8; u++) s += x[u];
        }
        for (; q < end; q++) s += dout[(int64_t)order[q] * d + j];
        dt[(int64_t)r * d + j] = s;
    }
}

/* Philox-4x32-10 (Random123), plain 64-bit products */
__device__ __forceinline__ void dk_philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[1] = (uint32_t)p1;
        c[3] = (uint32_t)p0;
        c[0] = n0;
        c[2] = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}
/* dropout: element e keeps when word e % 4 of philox((e / 4, stream, step lo, step hi), seed) >> 8 >= thr */
extern "C" __global__ void dpar_k_dropout(float *y, const float *x, int64_t n, uint32_t seed_lo, uint32_t seed_hi,
                                          uint32_t stream, uint32_t step_lo, uint32_t step_hi, uint32_t thr,
                                          float scale) {
    int64_t blocks = (n + 3) / 4;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (int64_t)gridDim.x * blockDim.x) {
        uint32_t w[4] = { (uint32_t)b, stream, step_lo, step_hi };
        dk_philox(w, seed_lo, seed_hi);
        for (int64_t j = 0; j < 4 && b * 4 + j < n; j++) {
            int64_t e = b * 4 + j;
            y[e] = (w[j] >> 8) >= thr ? x[e] * scale : 0.0f;
        }
    }
}
