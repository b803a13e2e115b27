#version 450
#extension GL_GOOGLE_include_directive : require
// dpar_matmul and dpar_matmul_batched (f32) as in matmul.comp (operands, flags, batches, push constants),
// without shared memory or barriers: the host's choice on a CPU device (llvmpipe runs a workgroup as
// SIMD lanes on one thread, splits it at each barrier and loads a buffer element lane by lane).
// A 16x16 workgroup computes a 64x64 block of C, 4x4 outputs per invocation read straight from A and
// B: 8 loads per 16 products. The same sums over k in the same order, no fused multiply-add: bit for
// bit matmul.comp's result. Batch z of workgroup row z (strided by the workgroup count).
layout(local_size_x = 16, local_size_y = 16) in;
#include "matmul_common.glsl"

// C[r, cc] = alpha * acc + beta * C[r, cc] where r, cc lie inside C.
void store_c(uint r, uint cc, float acc) {
    if (r >= pc.m || cc >= pc.n) return;
    uint i = offC + r * pc.n + cc;
    precise float v = pc.f0 == 0.0 ? 0.0 : pc.f0 * acc;
    precise float o = (pc.flags & 4u) != 0u ? v : v + pc.f1 * c[i];
    c[i] = o;
}

// Rows r0 + 16 i and columns c0 + 16 j (i, j < 4) of C, read straight from A and B.
// llvmpipe loads an SSBO element lane by lane; 16 outputs an invocation read 8 elements per k, not 16.
void direct(uint r0, uint c0) {
    precise float acc[4][4];
    uint ia[4], ib[4];
    // element (i, kk) of op(A) at ia[i] + kk * ak; rows and columns past the end are clamped to the
    // last (their sums are not stored), so the loop reads without bounds checks
    bool ta = (pc.flags & 1u) != 0u, tb = (pc.flags & 2u) != 0u;
    uint ak = ta ? pc.m : 1u, bk = tb ? 1u : pc.n;
    for (uint i = 0u; i < 4u; i++) {
        ia[i] = offA + min(r0 + 16u * i, pc.m - 1u) * (ta ? 1u : pc.k);
        ib[i] = offB + min(c0 + 16u * i, pc.n - 1u) * (tb ? pc.k : 1u);
        for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;
    }
    uint dt = (pc.flags >> 3) & 3u;
    for (uint kk = 0u; kk < pc.k; kk++) {
        float av[4], bv[4];
        for (uint i = 0u; i < 4u; i++) {
            uint x = ia[i] + kk * ak, y = ib[i] + kk * bk;
            av[i] = widen(dt, a[dt == 0u ? x : x >> 1], x);
            bv[i] = widen(dt, b[dt == 0u ? y : y >> 1], y);
        }
        for (uint i = 0u; i < 4u; i++)
            for (uint j = 0u; j < 4u; j++) acc[i][j] += av[i] * bv[j];
    }
    for (uint i = 0u; i < 4u; i++)
        for (uint j = 0u; j < 4u; j++) store_c(r0 + 16u * i, c0 + 16u * j, acc[i][j]);
}

void main() {
    for (uint z = gl_WorkGroupID.z; z < max(pc.p[0], 1u); z += gl_NumWorkGroups.z) {
        offA = z * pc.p[1];
        offB = z * pc.p[2];
        offC = z * pc.p[3];
        direct(gl_WorkGroupID.y * 64u + gl_LocalInvocationID.y, gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x);
    }
}
