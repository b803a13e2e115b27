#version 450
// Attention backward, pass 2 over key rows (dpar_attention_backward): for key j of batch-head b,
//   dk_j = scale sum_i P_ij (dp_ij - D_i) q_i (flags bit0);  dv_j = sum_i P_ij dout_i (flags bit1),
// i over the queries that see key j (i >= j when causal), P_ij and dp_ij recomputed, lse_i and D_i read
// from stats [BH,Tq,2] (attention_bwd_q wrote D_i). Geometry as attention.comp. One workgroup of 64 per
// key row, queries in chunks of 64, summed in order: deterministic.
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer Stats { float st[]; };
layout(std430, set = 0, binding = 1) buffer DK { float dk[]; };
layout(std430, set = 0, binding = 4) buffer DV { float dv[]; };
layout(std430, set = 0, binding = 2) readonly buffer DO { float dout[]; };
layout(std430, set = 0, binding = 3) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 5) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 6) readonly buffer V { float v[]; };
layout(push_constant) uniform PC { uint n; uint m; uint kk; uint flags; float f[8]; uint p[16]; } pc;
shared float ks[512];
shared float vs[512];
shared float ak[512];
shared float av[512];
shared float ps[64];
shared float dss[64];

void main() {
    uint t = gl_LocalInvocationID.x;
    uint BH = pc.p[0], Tq = pc.p[1], Tk = pc.p[2], D = pc.p[3], Dv = pc.p[4];
    bool causal = pc.p[5] != 0u;
    for (uint krow = gl_WorkGroupID.x; krow < BH * Tk; krow += gl_NumWorkGroups.x) {
        uint b = krow / Tk, j = krow % Tk, i0 = causal ? j : 0u;
        for (uint e = t; e < D; e += 64u) { ks[e] = k[krow * D + e]; ak[e] = 0.0; }
        for (uint e = t; e < Dv; e += 64u) { vs[e] = v[krow * Dv + e]; av[e] = 0.0; }
        barrier();
        for (uint c0 = i0; c0 < Tq; c0 += 64u) {
            uint i = c0 + t;
            precise float pj = 0.0, ds = 0.0;
            if (i < Tq) {
                uint row = b * Tq + i;
                precise float d = 0.0, dp = 0.0;
                for (uint e = 0u; e < D; e++) d += q[row * D + e] * ks[e];
                for (uint e = 0u; e < Dv; e++) dp += dout[row * Dv + e] * vs[e];
                precise float sc = pc.f[0] * d;
                pj = exp(sc - st[2u * row]);
                ds = pj * (dp - st[2u * row + 1u]);
            }
            ps[t] = pj;
            dss[t] = ds;
            barrier();
            uint cend = min(64u, Tq - c0);
            for (uint e = t; e < D; e += 64u) {
                precise float a = ak[e];
                for (uint ii = 0u; ii < cend; ii++) a += dss[ii] * q[(b * Tq + c0 + ii) * D + e];
                ak[e] = a;
            }
            for (uint e = t; e < Dv; e += 64u) {
                precise float a = av[e];
                for (uint ii = 0u; ii < cend; ii++) a += ps[ii] * dout[(b * Tq + c0 + ii) * Dv + e];
                av[e] = a;
            }
            barrier();
        }
        if ((pc.flags & 1u) != 0u)
            for (uint e = t; e < D; e += 64u) { precise float r = pc.f[0] * ak[e]; dk[krow * D + e] = r; }
        if ((pc.flags & 2u) != 0u)
            for (uint e = t; e < Dv; e += 64u) dv[krow * Dv + e] = av[e];
        barrier();
    }
}
