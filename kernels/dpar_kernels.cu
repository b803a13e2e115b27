/* dpar.h CUDA backend kernels.

   Compiled ahead of time to PTX (tools/embed_ptx.py, `make CUDA=1 cuda-kernels`)
   and embedded in backends/dpar_cuda_kernels.h, which the backend loads with
   cuModuleLoadData, so user programs never need nvcc.

   Conventions
   - extern "C" entry points named dpar_k_*; the host side (backends/dpar_cuda.h)
     passes arguments in exactly the order declared here.
   - Every kernel is a grid-stride loop over 64-bit element counts, so any grid
     size is correct; the host picks grid sizes from the element count only, so
     reductions (block partials, then one block in fixed order) give bitwise the
     same result on every device of the same model, run after run.
   - Compiled with --fmad=false and without fast math: the arithmetic is the
     same sequence of IEEE operations as the CPU reference backend, so the
     element-wise ops, the SGD step and the casts match it bit for bit.
   - f16 / bf16 conversions use the same integer round-to-nearest-even code as
     dpar_f32_to_f16 / dpar_f32_to_bf16 on the host (identical NaN payloads).
   - Dtype codes: 0 f32, 1 f16, 2 bf16, 3 i32 (dpar_dtype).
   - Reduce-op codes: 0 sum, 1 mean, 2 max, 3 min (dpar_reduce_op). */
#include <stdint.h>

#include "opt_guard.cuh"

#define DPAR_K_MAXV 64 /* members of one virtual-device group (one GPU) */

/* ---- scalar conversions (same algorithm as the host's dpar.h) ---------- */
__device__ __forceinline__ uint16_t dk_f32_to_f16(float f) {
    uint32_t x = __float_as_uint(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u | (m >> 13) : 0));
    int32_t ee = (int32_t)e - 127 + 15;
    if (ee >= 31) return (uint16_t)(sign | 0x7c00u);
    if (ee <= 0) {
        if (ee < -10) return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - ee);
        uint32_t half = 1u << (shift - 1), rest = m & ((1u << shift) - 1), r = m >> shift;
        if (rest > half || (rest == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)ee << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
__device__ __forceinline__ float dk_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return __uint_as_float(sign);
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ uint16_t dk_f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
__device__ __forceinline__ float dk_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}
__device__ __forceinline__ float dk_load(const void *p, int t, int64_t i) {
    switch (t) {
    case 0: return ((const float *)p)[i];
    case 1: return dk_f16_to_f32(((const uint16_t *)p)[i]);
    case 2: return dk_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return (float)((const int32_t *)p)[i];
    }
}
__device__ __forceinline__ void dk_store(void *p, int t, int64_t i, float v) {
    switch (t) {
    case 0: ((float *)p)[i] = v; break;
    case 1: ((uint16_t *)p)[i] = dk_f32_to_f16(v); break;
    case 2: ((uint16_t *)p)[i] = dk_f32_to_bf16(v); break;
    default: {
        /* float -> i32: toward zero, NaN -> 0, saturating */
        int32_t r;
        if (v != v) r = 0;
        else if (v >= 2147483648.0f) r = 2147483647;
        else if (v <= -2147483648.0f) r = (-2147483647 - 1);
        else r = (int32_t)v;
        ((int32_t *)p)[i] = r;
    }
    }
}

#define DK_TID ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define DK_STRIDE ((int64_t)gridDim.x * blockDim.x)

extern "C" {

/* ---- element-wise ------------------------------------------------------ */
/* x *= a */
__global__ void dpar_k_scale(float *x, float a, int64_t n) {
    int64_t n4 = n >> 2;
    float4 *x4 = (float4 *)x;
    for (int64_t i = DK_TID; i < n4; i += DK_STRIDE) {
        float4 v = x4[i];
        v.x *= a; v.y *= a; v.z *= a; v.w *= a;
        x4[i] = v;
    }
    for (int64_t i = (n4 << 2) + DK_TID; i < n; i += DK_STRIDE) x[i] *= a;
}

/* y += a * x */
__global__ void dpar_k_axpy(float *y, const float *x, float a, int64_t n) {
    int64_t n4 = n >> 2;
    float4 *y4 = (float4 *)y;
    const float4 *x4 = (const float4 *)x;
    for (int64_t i = DK_TID; i < n4; i += DK_STRIDE) {
        float4 v = y4[i], u = x4[i];
        v.x += a * u.x; v.y += a * u.y; v.z += a * u.z; v.w += a * u.w;
        y4[i] = v;
    }
    for (int64_t i = (n4 << 2) + DK_TID; i < n; i += DK_STRIDE) y[i] += a * x[i];
}

__device__ __forceinline__ float dk_relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

/* y = max(x, 0), NaN propagates */
__global__ void dpar_k_relu(float *y, const float *x, int64_t n) {
    int64_t n4 = n >> 2;
    float4 *y4 = (float4 *)y;
    const float4 *x4 = (const float4 *)x;
    for (int64_t i = DK_TID; i < n4; i += DK_STRIDE) {
        float4 v = x4[i];
        v.x = dk_relu(v.x); v.y = dk_relu(v.y); v.z = dk_relu(v.z); v.w = dk_relu(v.w);
        y4[i] = v;
    }
    for (int64_t i = (n4 << 2) + DK_TID; i < n; i += DK_STRIDE) y[i] = dk_relu(x[i]);
}

/* dx = x > 0 ? dy : 0 */
__global__ void dpar_k_relu_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

/* y[M,N] += b[N] */
__global__ void dpar_k_bias_add(float *y, const float *b, int64_t m, int64_t n) {
    int64_t total = m * n;
    for (int64_t i = DK_TID; i < total; i += DK_STRIDE) y[i] += b[i % n];
}

/* db[N] = beta * db + sum_m dy[m, :] (beta == 0 ignores db), in two deterministic phases whose shape the host
   derives from m and n alone. dpar_k_bias_grad: block b sums 32 columns (tile b % tiles) over one chunk of
   `rows` rows (chunk b / tiles): its 8 warps take every 8th row, lane k column k (each warp reads whole rows,
   coalesced), then the warps' sums are added in warp order. With one chunk it writes db, else part[chunk, :],
   which dpar_k_bias_grad_final adds in chunk order. One thread per column summing every row, as before, kept
   a few warps busy for milliseconds on a conv gradient's [N*H*W, C]. */
#define DK_BG_WARPS 8
__global__ void dpar_k_bias_grad(float *db, float *part, const float *dy, int64_t m, int64_t n, int64_t rows,
                                 int64_t tiles, float beta) {
    __shared__ float sh[DK_BG_WARPS][32];
    int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    int64_t tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles, j = tile * 32 + lane;
    int64_t r0 = chunk * rows, r1 = r0 + rows < m ? r0 + rows : m;
    float s = 0.0f;
    if (j < n)
        for (int64_t r = r0 + w; r < r1; r += DK_BG_WARPS) s += dy[r * n + j];
    sh[w][lane] = s;
    __syncthreads();
    if (w || j >= n) return;
    for (int k = 1; k < DK_BG_WARPS; k++) s += sh[k][lane];
    if (gridDim.x == tiles)
        db[j] = (beta == 0.0f ? 0.0f : beta * db[j]) + s;
    else
        part[chunk * n + j] = s;
}
/* db[j] = beta * db + (the sum over chunks, in order, of part[chunk, j]) / div: also the last phase of the norms'
   dw, db and of dpar_k_reduce_cols (elementwise.cu; div = R for a mean, else 1, which divides exactly) */
__global__ void dpar_k_bias_grad_final(float *db, const float *part, int64_t chunks, int64_t n, float beta, float div) {
    for (int64_t j = DK_TID; j < n; j += DK_STRIDE) {
        float s = 0.0f;
        for (int64_t c = 0; c < chunks; c++) s += part[c * n + j];
        db[j] = (beta == 0.0f ? 0.0f : beta * db[j]) + s / div;
    }
}

/* Casts between f32 and a 16-bit float (h: 1 f16, 2 bf16) move several elements a thread as 8- and 16-byte words:
   one 2-byte access an element left the kernel at two thirds of copy bandwidth. Element i is the low half of its
   32-bit word (little endian). Narrowing moves 8 elements a thread (32 bytes of f32, 16 of halves); pointers not
   16-byte aligned (never from cuMemAlloc) take the scalar loop, which also converts the n % 8 tail. The bits are
   those of dk_f32_to_f16 / dk_f32_to_bf16 and their inverses either way. */
__device__ __forceinline__ uint32_t dk_pack_half2(int h, float lo, float hi) {
    uint32_t a = h == 1 ? dk_f32_to_f16(lo) : dk_f32_to_bf16(lo);
    uint32_t b = h == 1 ? dk_f32_to_f16(hi) : dk_f32_to_bf16(hi);
    return a | (b << 16);
}
__device__ __forceinline__ float dk_half_lo(int h, uint32_t w) {
    return h == 1 ? dk_f16_to_f32((uint16_t)(w & 0xffffu)) : dk_bf16_to_f32((uint16_t)(w & 0xffffu));
}
__device__ __forceinline__ float dk_half_hi(int h, uint32_t w) {
    return h == 1 ? dk_f16_to_f32((uint16_t)(w >> 16)) : dk_bf16_to_f32((uint16_t)(w >> 16));
}
__device__ __forceinline__ int64_t dk_vec8_count(const void *a, const void *b, int64_t n) {
    return (((uintptr_t)a | (uintptr_t)b) & 15u) ? 0 : n >> 3;
}
__device__ void dk_cast_to_half(uint16_t *dst, int h, const float *src, int64_t n) {
    int64_t n8 = dk_vec8_count(dst, src, n);
    const float4 *s4 = (const float4 *)src;
    uint4 *d4 = (uint4 *)dst;
    for (int64_t i = DK_TID; i < n8; i += DK_STRIDE) {
        float4 a = s4[2 * i], b = s4[2 * i + 1];
        uint4 w;
        w.x = dk_pack_half2(h, a.x, a.y); w.y = dk_pack_half2(h, a.z, a.w);
        w.z = dk_pack_half2(h, b.x, b.y); w.w = dk_pack_half2(h, b.z, b.w);
        d4[i] = w;
    }
    for (int64_t i = (n8 << 3) + DK_TID; i < n; i += DK_STRIDE) dk_store(dst, h, i, src[i]);
}
/* Widening moves 4 elements a thread per step (an 8-byte load, one 16-byte store), two steps a grid stride apart
   loaded together, so that each load and store instruction of a warp covers one contiguous span (256 and 512
   bytes). Eight elements a thread as two 16-byte stores 16 bytes apart left every other chunk of a warp's span to
   its second store: bf16 -> f32 ran at 65% of copy bandwidth on the H200. Pointers not aligned for the words (src
   to 8 bytes, dst to 16) take the scalar loop, which also converts the n % 4 tail. */
__device__ __forceinline__ float4 dk_half4(int h, uint2 w) {
    float4 a;
    a.x = dk_half_lo(h, w.x); a.y = dk_half_hi(h, w.x); a.z = dk_half_lo(h, w.y); a.w = dk_half_hi(h, w.y);
    return a;
}
__device__ void dk_cast_from_half(float *dst, const uint16_t *src, int h, int64_t n) {
    int64_t n4 = (((uintptr_t)src & 7u) | ((uintptr_t)dst & 15u)) ? 0 : n >> 2;
    const uint2 *s2 = (const uint2 *)src;
    float4 *d4 = (float4 *)dst;
    for (int64_t i = DK_TID; i < n4; i += 2 * DK_STRIDE) {
        int64_t i2 = i + DK_STRIDE;
        uint2 w = s2[i], w2 = i2 < n4 ? s2[i2] : w;
        d4[i] = dk_half4(h, w);
        if (i2 < n4) d4[i2] = dk_half4(h, w2);
    }
    for (int64_t i = (n4 << 2) + DK_TID; i < n; i += DK_STRIDE) dst[i] = dk_load(src, h, i);
}

/* dst = cast(src), any dtype pair */
__global__ void dpar_k_cast(void *dst, int dt, const void *src, int st, int64_t n) {
    if (st == 0 && (dt == 1 || dt == 2)) {
        dk_cast_to_half((uint16_t *)dst, dt, (const float *)src, n);
        return;
    }
    if (dt == 0 && (st == 1 || st == 2)) {
        dk_cast_from_half((float *)dst, (const uint16_t *)src, st, n);
        return;
    }
    if (st == 3 && dt == 3) {
        for (int64_t i = DK_TID; i < n; i += DK_STRIDE)
            ((int32_t *)dst)[i] = ((const int32_t *)src)[i];
        return;
    }
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) dk_store(dst, dt, i, dk_load(src, st, i));
}

/* Fused SGD step (PyTorch SGD, dampening 0), see dpar_sgd_desc:
     g = grad * clip + wd * param; v = mu * v + g; u = nesterov ? g + mu * v : v;
     param -= lr * u.   mom may be NULL when mu == 0 (then u = g). */
__device__ __forceinline__ void dk_sgd1(float &p, float gr, float *v, float lr, float mu,
                                        float wd, float clip, int nesterov) {
    float g = gr * clip + wd * p;
    float u = g;
    if (v) {
        float vv = mu * *v + g;
        *v = vv;
        u = nesterov ? g + mu * vv : vv;
    }
    p = p - lr * u;
}
/* err: the device's index-check error words (NULL: none yet), graph the graph's id on the first update of a
   graph step (else 0): the guard of opt_guard.cuh. */
__global__ void dpar_k_sgd(float *param, const float *grad, float *mom, int64_t n,
                           float lr, float mu, float wd, float clip, int nesterov, unsigned *err, unsigned graph) {
    if (dk_opt_skipped(err, graph, DK_TID == 0)) return;
    int64_t n4 = n >> 2;
    float4 *p4 = (float4 *)param;
    const float4 *g4 = (const float4 *)grad;
    float4 *m4 = (float4 *)mom;
    for (int64_t i = DK_TID; i < n4; i += DK_STRIDE) {
        float4 p = p4[i], g = g4[i];
        if (mom) {
            float4 v = m4[i];
            dk_sgd1(p.x, g.x, &v.x, lr, mu, wd, clip, nesterov);
            dk_sgd1(p.y, g.y, &v.y, lr, mu, wd, clip, nesterov);
            dk_sgd1(p.z, g.z, &v.z, lr, mu, wd, clip, nesterov);
            dk_sgd1(p.w, g.w, &v.w, lr, mu, wd, clip, nesterov);
            m4[i] = v;
        } else {
            dk_sgd1(p.x, g.x, 0, lr, mu, wd, clip, nesterov);
            dk_sgd1(p.y, g.y, 0, lr, mu, wd, clip, nesterov);
            dk_sgd1(p.z, g.z, 0, lr, mu, wd, clip, nesterov);
            dk_sgd1(p.w, g.w, 0, lr, mu, wd, clip, nesterov);
        }
        p4[i] = p;
    }
    for (int64_t i = (n4 << 2) + DK_TID; i < n; i += DK_STRIDE)
        dk_sgd1(param[i], grad[i], mom ? &mom[i] : 0, lr, mu, wd, clip, nesterov);
}

/* ---- deterministic reductions ------------------------------------------
   Phase 1: each block reduces its grid-stride share into partial[blockIdx.x]
   (fixed tree inside the block), accumulating in double like the CPU
   reference. Phase 2 (dpar_k_reduce_final, one block of 1024 threads): sums
   the partials in a fixed tree and writes out[0] = (float)(total / div)
   (0 when div == 0). The host chooses the grid from n only. */
#define DK_RBLOCK 256
__device__ __forceinline__ double dk_block_sum(double v, double *sh) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    return sh[0];
}

/* mode 0: sum x; 1: sum x*x (f32 input) */
__global__ void dpar_k_reduce_partial(const float *x, int64_t n, int mode, double *partial) {
    __shared__ double sh[DK_RBLOCK];
    double acc = 0.0;
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) {
        double v = (double)x[i];
        acc += mode ? v * v : v;
    }
    double s = dk_block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* sum of a double array (row losses) */
__global__ void dpar_k_reduce_partial_f64(const double *x, int64_t n, double *partial) {
    __shared__ double sh[DK_RBLOCK];
    double acc = 0.0;
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) acc += x[i];
    double s = dk_block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* MSE: partial sums of (p - t)^2 in double; dpred = 2 (p - t) / count when
   dpred != NULL (as the CPU reference: in double, rounded once) */
__global__ void dpar_k_mse_partial(const float *p, const float *t, int64_t n, float *dpred,
                                   double *partial) {
    __shared__ double sh[DK_RBLOCK];
    double acc = 0.0;
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) {
        double d = (double)p[i] - (double)t[i];
        acc += d * d;
        if (dpred) dpred[i] = (float)(2.0 * d / (double)n);
    }
    double s = dk_block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void dpar_k_reduce_final(const double *partial, int64_t nparts, double div, float *out) {
    __shared__ double sh[1024];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    double s = dk_block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = div == 0.0 ? 0.0f : (float)(s / div);
}

/* Softmax cross-entropy, one warp per row, in double like the CPU reference:
   rowloss[r] = logsumexp(z_r) - z_r[label_r]; dlogits (may be NULL) =
   (softmax(z_r) - onehot) / m. Labels out of range give a NaN row loss and a
   NaN gradient row. */
__global__ void dpar_k_xent_rows(const float *z, const int32_t *labels, int64_t m, int64_t c,
                                 double *rowloss, float *dlogits) {
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const float qnan = __uint_as_float(0x7fc00000u);
    for (int64_t r = warp; r < m; r += nwarps) {
        const float *zr = z + r * c;
        int32_t lab = labels[r];
        int ok = lab >= 0 && (int64_t)lab < c;
        float mx = -__uint_as_float(0x7f800000u);
        for (int64_t j = lane; j < c; j += 32) {
            float v = zr[j];
            mx = (v > mx || v != v) ? v : mx;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float v = __shfl_xor_sync(0xffffffffu, mx, o);
            mx = (v > mx || v != v) ? v : mx;
        }
        double se = 0.0;
        for (int64_t j = lane; j < c; j += 32) se += exp((double)zr[j] - (double)mx);
        for (int o = 16; o > 0; o >>= 1) se += __shfl_xor_sync(0xffffffffu, se, o);
        double lse = (double)mx + log(se);
        if (lane == 0) rowloss[r] = ok ? lse - (double)zr[lab] : (double)qnan;
        if (dlogits) {
            float *dr = dlogits + r * c;
            for (int64_t j = lane; j < c; j += 32) {
                double p = exp((double)zr[j] - lse);
                dr[j] = ok ? (float)((p - (j == lab ? 1.0 : 0.0)) / (double)m) : qnan;
            }
        }
    }
}

/* ---- collectives helpers ------------------------------------------------ */
typedef struct dk_ptrs {
    const void *in[DPAR_K_MAXV];
    void *out[DPAR_K_MAXV];
} dk_ptrs;

/* Reduction over nin members' buffers (virtual devices on one GPU), f32
   accumulation in member order, rounded once; written to nout outputs.
   Element e in [begin, end): o = e / inner, i = e % inner,
   source index = o * in_stride + in_off + i, destination index = e.
   op: 0 sum, 1 mean (sum / nin; i32: exact sum truncated), 2 max, 3 min
   (NaN propagates). i32 sums wrap around. Same arithmetic as the CPU
   reference's host path, so results match it bit for bit. */
__global__ void dpar_k_vreduce(dk_ptrs p, int nin, int nout, int64_t begin, int64_t end,
                               int64_t inner, int64_t in_stride, int64_t in_off, int dt, int op) {
    for (int64_t e = begin + DK_TID; e < end; e += DK_STRIDE) {
        int64_t o = e / inner, i = e - o * inner;
        int64_t si = o * in_stride + in_off + i;
        if (dt == 3) {
            const int32_t *x0 = (const int32_t *)p.in[0];
            int64_t acc = x0[si];
            int32_t best = x0[si];
            for (int s = 1; s < nin; s++) {
                int32_t v = ((const int32_t *)p.in[s])[si];
                acc += v;
                if (op == 2) best = v > best ? v : best;
                if (op == 3) best = v < best ? v : best;
            }
            int32_t r;
            if (op == 0) r = (int32_t)(uint32_t)(uint64_t)acc; /* wrap-around */
            else if (op == 1) r = (int32_t)(acc / nin);      /* exact sum, truncated */
            else r = best;
            for (int d = 0; d < nout; d++) ((int32_t *)p.out[d])[e] = r;
        } else {
            float acc = dk_load(p.in[0], dt, si);
            for (int s = 1; s < nin; s++) {
                float v = dk_load(p.in[s], dt, si);
                if (op <= 1) acc += v;
                else if (op == 2) acc = (v > acc || v != v) ? v : acc; /* as the CPU: NaN sticks */
                else acc = (v < acc || v != v) ? v : acc;
            }
            if (op == 1) acc = acc / (float)nin;
            for (int d = 0; d < nout; d++) dk_store(p.out[d], dt, e, acc);
        }
    }
}

/* Order-preserving float -> int32 keys for NCCL max/min (NCCL's own float
   max/min do not propagate NaN). NaN maps to the extreme key of the op so it
   wins. dst may alias src for f32. st: source dtype (0 f32, 1 f16, 2 bf16);
   keys are always int32. */
__global__ void dpar_k_to_key(int32_t *dst, const void *src, int st, int64_t n, int is_max) {
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) {
        float v = dk_load(src, st, i);
        int32_t k;
        if (v != v) k = is_max ? 2147483647 : (-2147483647 - 1);
        else {
            int32_t b = (int32_t)__float_as_uint(v);
            k = b >= 0 ? b : (int32_t)(b ^ 0x7fffffff);
        }
        dst[i] = k;
    }
}
__global__ void dpar_k_from_key(void *dst, int dt, const int32_t *src, int64_t n, int is_max) {
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) {
        int32_t k = src[i];
        float v;
        if (k == (is_max ? 2147483647 : (-2147483647 - 1))) v = __uint_as_float(0x7fc00000u);
        else v = __uint_as_float((uint32_t)(k >= 0 ? k : (k ^ 0x7fffffff)));
        dk_store(dst, dt, i, v);
    }
}

/* x[i] /= d for i32 (truncating), after an NCCL sum for an i32 pmean */
__global__ void dpar_k_div_i32(int32_t *x, int64_t n, int32_t d) {
    for (int64_t i = DK_TID; i < n; i += DK_STRIDE) x[i] = x[i] / d;
}

/* Strided N-d copy of elements of `es` bytes (2 or 4): for every index
   (i0..i_{nd-1}) < shape, dst[sum i_k*ds_k] = src[sum i_k*ss_k] (element
   strides). total = prod(shape). Used for all_gather / reduce_scatter
   packing and all_to_all blocks. */
typedef struct dk_nd {
    int64_t shape[8], ss[8], ds[8];
} dk_nd;
__global__ void dpar_k_copy_nd(void *dst, const void *src, int es, int nd, dk_nd g,
                               int64_t total) {
    for (int64_t e = DK_TID; e < total; e += DK_STRIDE) {
        int64_t rem = e, so = 0, doff = 0;
        for (int k = nd - 1; k >= 0; k--) {
            int64_t ik = rem % g.shape[k];
            rem /= g.shape[k];
            so += ik * g.ss[k];
            doff += ik * g.ds[k];
        }
        if (es == 4) ((uint32_t *)dst)[doff] = ((const uint32_t *)src)[so];
        else ((uint16_t *)dst)[doff] = ((const uint16_t *)src)[so];
    }
}

} /* extern "C" */
