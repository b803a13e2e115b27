// The body of matmul_direct.comp and, with MM_EPILOGUE defined, matmul_direct_bias.comp (see there).
layout(local_size_x = 8) in;
#include "matmul_common.glsl"

const uint R = 4u, NB = 16u;  // rows an invocation, columns a workgroup

// C[r, cc] = alpha * acc + beta * C[r, cc] where r, cc lie inside C.
void store_c(uint r, uint cc, float acc) {
    if (r >= pc.m || cc >= pc.n) return;
    uint i = offC + r * pc.n + cc;
    precise float v = pc.f0 == 0.0 ? 0.0 : pc.f0 * acc;
    precise float o = (pc.flags & 4u) != 0u ? v : v + pc.f1 * c[i];
    c[i] = o;
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
#ifdef MM_EPILOGUE
    // the bias (alpha 1, beta 0: the stored sum is acc + bias, rounded once as bias_add rounds it)
    for (uint j = 0u; j < NB; j++) {
        float bj = bias[min(c0 + j, pc.n - 1u)];
        for (uint i = 0u; i < R; i++) acc[i][j] += bj;
    }
#endif
    for (uint i = 0u; i < R; i++)
        for (uint j = 0u; j < NB; j++) store_c(r0 + 8u * i, c0 + j, acc[i][j]);
#ifdef MM_EPILOGUE
    if ((pc.flags & 128u) != 0u)  // its ReLU
        for (uint i = 0u; i < R; i++)
            for (uint j = 0u; j < NB; j++)
                if (r0 + 8u * i < pc.m && c0 + j < pc.n)
                    relu_out[offC + (r0 + 8u * i) * pc.n + c0 + j] = relu_of(acc[i][j]);
#endif
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
