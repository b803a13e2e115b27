#version 450
// C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C      (dpar_matmul)
// op(A) = A [M,K] or A^T (A stored [K,M]); op(B) = B [K,N] or B^T (B stored [N,K]).
// beta == 0 (flags bit 2) ignores C's old contents, even NaN. A and B share a
// dtype (flags bits 3-4: 0 f32, 1 f16, 2 bf16), widened to f32; C is f32 and
// products accumulate in f32.
// Tiled: a 16x16 workgroup computes a 32x32 block of C (2x2 outputs per
// invocation), staging 32x16 tiles of op(A) and op(B) in shared memory.
// Each output sums over k in increasing order: deterministic, run after run.
// Direct (flags bit 5, chosen by the host for llvmpipe): a workgroup computes a 64x64 block of C, 4x4
// outputs per invocation read straight from A and B: no shared memory, no barrier, 8 loads per 16
// products. The same sums in the same order (no fused multiply-add): bit for bit the tiled result.
// Batched (dpar_matmul_batched, f32): p[0] batches (0: one), p[1..3] batch strides of A, B (0: shared),
// C in elements; batch z of workgroup row z (strided by the workgroup count).
layout(local_size_x = 16, local_size_y = 16) in;
layout(std430, set = 0, binding = 0) buffer Dst { float c[]; };
layout(std430, set = 0, binding = 2) readonly buffer SrcA { uint a[]; };
layout(std430, set = 0, binding = 3) readonly buffer SrcB { uint b[]; };
layout(push_constant) uniform PC {
    uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; float f4; float f5; float f6; float f7;
    uint p[16];
} pc;

const uint BM = 32u, BN = 32u, BK = 16u;
shared float As[BK][BM + 1u];
shared float Bs[BK][BN + 1u];

float f16_to_f32(uint h) {            // exact, subnormals included
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
    if (e == 0u) {
        if (m == 0u) return uintBitsToFloat(sign);
        int p = findMSB(m);
        return uintBitsToFloat(sign | (uint(p + 103) << 23) | ((m << uint(23 - p)) & 0x7fffffu));
    }
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}
float widen(uint dt, uint w, uint idx) {
    if (dt == 0u) return uintBitsToFloat(w);
    uint h = (idx & 1u) != 0u ? (w >> 16) : (w & 0xffffu);
    return dt == 1u ? f16_to_f32(h) : uintBitsToFloat(h << 16);
}
uint offA = 0u, offB = 0u, offC = 0u;  // this batch's offsets (elements)
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

// C[r, cc] = alpha * acc + beta * C[r, cc] where r, cc lie inside C.
void store_c(uint r, uint cc, float acc) {
    if (r >= pc.m || cc >= pc.n) return;
    uint i = offC + r * pc.n + cc;
    precise float v = pc.f0 == 0.0 ? 0.0 : pc.f0 * acc;
    precise float o = (pc.flags & 4u) != 0u ? v : v + pc.f1 * c[i];
    c[i] = o;
}

// The direct variant: rows r0 + 16 i and columns c0 + 16 j (i, j < 4) of C, read straight from A and B.
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
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint row0 = gl_WorkGroupID.y * BM, col0 = gl_WorkGroupID.x * BN;
    uint t = ty * 16u + tx;           // 0..255
    precise float acc00 = 0.0, acc01 = 0.0, acc10 = 0.0, acc11 = 0.0;
    if ((pc.flags & 32u) != 0u) { // a push constant: the whole workgroup skips the barriers, or none
        direct(gl_WorkGroupID.y * 64u + ty, gl_WorkGroupID.x * 64u + tx);
        continue;
    }
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
    store_c(r0, c0, acc00); store_c(r0, c1, acc01);
    store_c(r1, c0, acc10); store_c(r1, c1, acc11);
    barrier(); // the next batch reuses the tiles
  }
}
