#version 450
// Attention backward, pass 1 over query rows (dpar_attention_backward): with P_ij = exp(s_ij - lse_i)
// recomputed from q, k and stats[2 row] = lse_i, dp_ij = dout_i . v_j,
//   D_i = sum_j P_ij dp_ij -> stats[2 row + 1];  dq_i = scale sum_j P_ij (dp_ij - D_i) k_j (flags bit0).
// Geometry as attention.comp. One workgroup of 64 per query row, keys in chunks of 64, two sweeps
// (D_i first, then dq_i), fixed reduction tree: deterministic.
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer Stats { float st[]; };
layout(std430, set = 0, binding = 1) buffer DQ { float dq[]; };
layout(std430, set = 0, binding = 2) readonly buffer DO { float dout[]; };
layout(std430, set = 0, binding = 3) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 5) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 6) readonly buffer V { float v[]; };
layout(push_constant) uniform PC { uint n; uint m; uint kk; uint flags; float f[8]; uint p[16]; } pc;
shared float qs[512];
shared float dos[512];
shared float acc[512];
shared float s[64];
shared float red[64];

float tree_sum(float x) {
    uint t = gl_LocalInvocationID.x;
    red[t] = x;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (t < h) { precise float z = red[t] + red[t + h]; red[t] = z; }
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}
// P_ij and dp_ij for key j of this row (0, 0 past the row's keys)
void p_dp(uint b, uint j, uint nk, float lse, out float pj, out float dpj) {
    uint Tk = pc.p[2], D = pc.p[3], Dv = pc.p[4];
    pj = 0.0;
    dpj = 0.0;
    if (j >= nk) return;
    precise float d = 0.0, e2 = 0.0;
    for (uint e = 0u; e < D; e++) d += qs[e] * k[(b * Tk + j) * D + e];
    for (uint e = 0u; e < Dv; e++) e2 += dos[e] * v[(b * Tk + j) * Dv + e];
    precise float sc = pc.f[0] * d;
    pj = exp(sc - lse);
    dpj = e2;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint BH = pc.p[0], Tq = pc.p[1], Tk = pc.p[2], D = pc.p[3], Dv = pc.p[4];
    bool causal = pc.p[5] != 0u, want_dq = (pc.flags & 1u) != 0u;
    for (uint row = gl_WorkGroupID.x; row < BH * Tq; row += gl_NumWorkGroups.x) {
        uint b = row / Tq, i = row % Tq, nk = causal ? i + 1u : Tk;
        float lse = st[2u * row];
        for (uint e = t; e < D; e += 64u) { qs[e] = q[row * D + e]; acc[e] = 0.0; }
        for (uint e = t; e < Dv; e += 64u) dos[e] = dout[row * Dv + e];
        barrier();
        precise float Dsum = 0.0;
        for (uint c0 = 0u; c0 < nk; c0 += 64u) {
            float pj, dpj;
            p_dp(b, c0 + t, nk, lse, pj, dpj);
            Dsum += tree_sum(pj * dpj);
        }
        if (want_dq) {
            for (uint c0 = 0u; c0 < nk; c0 += 64u) {
                float pj, dpj;
                p_dp(b, c0 + t, nk, lse, pj, dpj);
                precise float ds = pj * (dpj - Dsum);
                s[t] = ds;
                barrier();
                uint cend = min(64u, nk - c0);
                for (uint e = t; e < D; e += 64u) {
                    precise float a = acc[e];
                    for (uint jj = 0u; jj < cend; jj++) a += s[jj] * k[(b * Tk + c0 + jj) * D + e];
                    acc[e] = a;
                }
                barrier();
            }
            for (uint e = t; e < D; e += 64u) { precise float r = pc.f[0] * acc[e]; dq[row * D + e] = r; }
        }
        if (t == 0u) st[2u * row + 1u] = Dsum;
        barrier();
    }
}
