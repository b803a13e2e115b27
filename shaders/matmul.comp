#version 450
#extension GL_GOOGLE_include_directive : require
// C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C      (dpar_matmul)
// op(A) = A [M,K] or A^T (A stored [K,M]); op(B) = B [K,N] or B^T (B stored [N,K]).
// beta == 0 (flags bit 2) ignores C's old contents, even NaN. A and B share a
// dtype (flags bits 3-4: 0 f32, 1 f16, 2 bf16), widened to f32; C is f32 and
// products accumulate in f32. Bits 6, 7: a bias and its ReLU (matmul_common.glsl).
// Tiled: a 16x16 workgroup computes a 32x32 block of C (2x2 outputs per
// invocation), staging 32x16 tiles of op(A) and op(B) in shared memory.
// Each output sums over k in increasing order: deterministic, run after run.
// matmul_direct.comp computes the same sums without shared memory (the host's choice on llvmpipe).
// Batched (dpar_matmul_batched, f32): p[0] batches (0: one), p[1..3] batch strides of A, B (0: shared),
// C in elements; batch z of workgroup row z (strided by the workgroup count). Workgroup (x, y) of a
// dispatch computes block (x + p[4], y + p[5]) of C (matmul_common.glsl).
layout(local_size_x = 16, local_size_y = 16) in;
#define MM_EPILOGUE
#include "matmul_common.glsl"

const uint BM = 32u, BN = 32u, BK = 16u;
shared float As[BK][BM + 1u];
shared float Bs[BK][BN + 1u];

float loadA(uint i, uint kk) {        // op(A)[i, kk]
    if (i >= pc.m || kk >= pc.k) return 0.0;
    uint dt = (pc.flags >> 3) & 3u;
    uint idx = offA + ((pc.flags & 1u) != 0u ? kk * pc.m + i : i * pc.k + kk);
    return widen(dt, a[dt == 0u ? idx : idx >> 1], idx);
}
float loadB(uint kk, uint j) {        // op(B)[kk, j]
    if (kk >= pc.k || j >= pc.n) return 0.0;
    uint dt = (pc.flags >> 3) & 3u;
    uint idx = offB + ((pc.flags & 2u) != 0u ? j * pc.k + kk : kk * pc.n + j);
    return widen(dt, b[dt == 0u ? idx : idx >> 1], idx);
}

// C[i] (column cc) = alpha * acc + beta * C[i] (flags bit 2: beta 0, C's old value unread), the bias and
// its ReLU (bits 6, 7: matmul_common.glsl).
void store_at(uint i, uint cc, float acc) {
    precise float v = pc.f0 == 0.0 ? 0.0 : pc.f0 * acc;
    precise float o = (pc.flags & 4u) != 0u ? v : v + pc.f1 * c[i];
    if ((pc.flags & 64u) != 0u) o += bias[cc];
    c[i] = o;
    if ((pc.flags & 128u) != 0u) relu_out[i] = relu_of(o);
}

void main() {
  for (uint z = gl_WorkGroupID.z; z < max(pc.p[0], 1u); z += gl_NumWorkGroups.z) {
    offA = z * pc.p[1];
    offB = z * pc.p[2];
    offC = z * pc.p[3];
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint row0 = (gl_WorkGroupID.y + pc.p[5]) * BM, col0 = (gl_WorkGroupID.x + pc.p[4]) * BN;
    uint t = ty * 16u + tx;           // 0..255
    precise float acc00 = 0.0, acc01 = 0.0, acc10 = 0.0, acc11 = 0.0;
    for (uint k0 = 0u; k0 < pc.k; k0 += BK) {
        // 512 elements per tile, 2 per invocation
        for (uint e = t; e < BK * BM; e += 256u) {
            uint kk = e / BM, r = e % BM;
            As[kk][r] = loadA(row0 + r, k0 + kk);
            Bs[kk][r] = loadB(k0 + kk, col0 + r);
        }
        barrier();
        uint kend = min(BK, pc.k - k0);
        for (uint kk = 0u; kk < kend; kk++) {
            float a0 = As[kk][ty], a1 = As[kk][ty + 16u];
            float b0 = Bs[kk][tx], b1 = Bs[kk][tx + 16u];
            acc00 += a0 * b0; acc01 += a0 * b1;
            acc10 += a1 * b0; acc11 += a1 * b1;
        }
        barrier();
    }
    uint r0 = row0 + ty, r1 = row0 + ty + 16u, c0 = col0 + tx, c1 = col0 + tx + 16u;
    if (r0 < pc.m && c0 < pc.n) store_at(offC + r0 * pc.n + c0, c0, acc00);
    if (r0 < pc.m && c1 < pc.n) store_at(offC + r0 * pc.n + c1, c1, acc01);
    if (r1 < pc.m && c0 < pc.n) store_at(offC + r1 * pc.n + c0, c0, acc10);
    if (r1 < pc.m && c1 < pc.n) store_at(offC + r1 * pc.n + c1, c1, acc11);
    barrier(); // the next batch reuses the tiles
  }
}
