#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_ballot : require
// dpar_matmul and dpar_matmul_batched as in matmul.comp (operands, flags, batches, push constants),
// without shared memory or barriers: the host's choice on a CPU device (llvmpipe runs a workgroup as
// SIMD lanes on one thread and splits it at each barrier).
// Lanes run over rows only: a workgroup of 8 computes a 32x16 block of C, each invocation 4 rows
// (r0 + 8 i) by the block's 16 columns, so every lane needs the same elements of B: per k, 4 loads of
// A and 16 of B feed 64 products. With flags bit 5 (set by the host where the subgroup is the
// workgroup's 8 lanes, llvmpipe on 256-bit vectors) f32 operands take B as 2 loads a lane, columns
// c0 + l and c0 + 8 + l, each lane's value then broadcast to all: the 16 loads at addresses all lanes
// share cost llvmpipe more (fc1 of the digits step 300 -> 230 us, bench/results/results.md).
// The same sums over k in the same order, no fused multiply-add: bit for bit matmul.comp's result.
// Batch z of workgroup z and column block y of workgroup y, each strided by the count (the host gives
// a workgroup several column blocks; the column blocks by the product's count p[6], its dispatches
// offset by p[4], p[5]: matmul_common.glsl).
layout(local_size_x = 8) in;
#include "matmul_common.glsl"

const uint R = 4u, NB = 16u;  // rows an invocation, columns a workgroup

// C[r, cc] (store_at) where r, cc lie inside C.
void store_c(uint r, uint cc, float acc) {
    if (r < pc.m && cc < pc.n) store_at(offC + r * pc.n + cc, cc, acc);
}

// bv[o + j] = lane j's x for j < 8: the broadcast's lane must be a constant
#define BCAST8(o, x)                                                                                    \
    bv[o] = subgroupBroadcast(x, 0u), bv[o + 1] = subgroupBroadcast(x, 1u);                             \
    bv[o + 2] = subgroupBroadcast(x, 2u), bv[o + 3] = subgroupBroadcast(x, 3u);                         \
    bv[o + 4] = subgroupBroadcast(x, 4u), bv[o + 5] = subgroupBroadcast(x, 5u);                         \
    bv[o + 6] = subgroupBroadcast(x, 6u), bv[o + 7] = subgroupBroadcast(x, 7u);

// Rows r0 + 8 i (i < R) and columns c0 + j (j < NB) of C. Rows and columns past the end are clamped to
// the last (their sums are not stored), so the loop reads without bounds checks.
void direct(uint r0, uint c0) {
    precise float acc[R][NB];
    uint ia[R], ib[NB];
    // element (i, kk) of op(A) at ia[i] + kk * ak, (kk, j) of op(B) at ib[j] + kk * bk
    bool ta = (pc.flags & 1u) != 0u, tb = (pc.flags & 2u) != 0u;
    uint ak = ta ? pc.m : 1u, bk = tb ? 1u : pc.n;
    for (uint i = 0u; i < R; i++) {
        ia[i] = offA + min(r0 + 8u * i, pc.m - 1u) * (ta ? 1u : pc.k);
        for (uint j = 0u; j < NB; j++) acc[i][j] = 0.0;
    }
    for (uint j = 0u; j < NB; j++) ib[j] = offB + min(c0 + j, pc.n - 1u) * (tb ? pc.k : 1u);
    uint dt = (pc.flags >> 3) & 3u;
    bool bcast = (pc.flags & 32u) != 0u;
    uint lane = gl_SubgroupInvocationID, bs = tb ? pc.k : 1u;  // this lane's two columns of B (bit 5)
    uint jb0 = offB + min(c0 + lane, pc.n - 1u) * bs, jb1 = offB + min(c0 + 8u + lane, pc.n - 1u) * bs;
    if (dt == 0u && bcast) {
        for (uint kk = 0u; kk < pc.k; kk++) {
            float av[R], bv[NB];
            for (uint i = 0u; i < R; i++) av[i] = uintBitsToFloat(a[ia[i] + kk * ak]);
            float b0 = uintBitsToFloat(b[jb0 + kk * bk]), b1 = uintBitsToFloat(b[jb1 + kk * bk]);
            BCAST8(0, b0)
            BCAST8(8, b1)
            for (uint i = 0u; i < R; i++)
                for (uint j = 0u; j < NB; j++) acc[i][j] += av[i] * bv[j];
        }
    } else if (dt == 0u) {  // f32: no widening in the loop (measured 1.5-2x on llvmpipe)
        for (uint kk = 0u; kk < pc.k; kk++) {
            float av[R], bv[NB];
            for (uint i = 0u; i < R; i++) av[i] = uintBitsToFloat(a[ia[i] + kk * ak]);
            for (uint j = 0u; j < NB; j++) bv[j] = uintBitsToFloat(b[ib[j] + kk * bk]);
            for (uint i = 0u; i < R; i++)
                for (uint j = 0u; j < NB; j++) acc[i][j] += av[i] * bv[j];
        }
    } else {
        for (uint kk = 0u; kk < pc.k; kk++) {
            float av[R], bv[NB];
            for (uint i = 0u; i < R; i++) {
                uint x = ia[i] + kk * ak;
                av[i] = widen(dt, a[x >> 1], x);
            }
            for (uint j = 0u; j < NB; j++) {
                uint y = ib[j] + kk * bk;
                bv[j] = widen(dt, b[y >> 1], y);
            }
            for (uint i = 0u; i < R; i++)
                for (uint j = 0u; j < NB; j++) acc[i][j] += av[i] * bv[j];
        }
    }
    for (uint i = 0u; i < R; i++)
        for (uint j = 0u; j < NB; j++) store_c(r0 + 8u * i, c0 + j, acc[i][j]);
}

void main() {
    for (uint z = gl_WorkGroupID.z; z < max(pc.p[0], 1u); z += gl_NumWorkGroups.z) {
        offA = z * pc.p[1];
        offB = z * pc.p[2];
        offC = z * pc.p[3];
        for (uint cb = gl_WorkGroupID.y + pc.p[5]; cb * NB < pc.n; cb += pc.p[6])
            direct((gl_WorkGroupID.x + pc.p[4]) * 8u * R + gl_LocalInvocationID.x, cb * NB);
    }
}
