#version 450
// Scaled dot-product attention, forward (dpar_attention): per query row i of batch-head b,
//   s_j = scale q_i . k_j (j <= i when causal), out_i = sum_j exp(s_j - lse) v_j, lse = log sum_j exp(s_j).
// q [BH,Tq,D], k [BH,Tk,D], v [BH,Tk,Dv], out [BH,Tq,Dv], stats [BH,Tq,2] (flags bit0): (lse, 0).
// p[0] BH, p[1] Tq, p[2] Tk, p[3] D, p[4] Dv, p[5] causal; f[0] scale. D, Dv <= 512 (checked on the host).
// One workgroup of 64 per query row; keys in chunks of 64 with an online softmax (running max and sum),
// reductions in a fixed tree: deterministic. No Tq x Tk matrix is stored.
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer Out { float o[]; };
layout(std430, set = 0, binding = 1) buffer Stats { float st[]; };
layout(std430, set = 0, binding = 2) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 3) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 5) readonly buffer V { float v[]; };
layout(push_constant) uniform PC { uint n; uint m; uint kk; uint flags; float f[8]; uint p[16]; } pc;
shared float qs[512];
shared float acc[512];
shared float s[64];
shared float red[64];

float tree(float x, bool is_max) {
    uint t = gl_LocalInvocationID.x;
    red[t] = x;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (t < h) { precise float z = is_max ? max(red[t], red[t + h]) : red[t] + red[t + h]; red[t] = z; }
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint BH = pc.p[0], Tq = pc.p[1], Tk = pc.p[2], D = pc.p[3], Dv = pc.p[4];
    bool causal = pc.p[5] != 0u;
    float neg_inf = uintBitsToFloat(0xff800000u);
    for (uint row = gl_WorkGroupID.x; row < BH * Tq; row += gl_NumWorkGroups.x) {
        uint b = row / Tq, i = row % Tq, nk = causal ? i + 1u : Tk;
        for (uint e = t; e < D; e += 64u) qs[e] = q[row * D + e];
        for (uint e = t; e < Dv; e += 64u) acc[e] = 0.0;
        barrier();
        float mx = neg_inf;
        precise float l = 0.0;
        for (uint c0 = 0u; c0 < nk; c0 += 64u) {
            uint j = c0 + t;
            precise float sc = neg_inf;
            if (j < nk) {
                precise float d = 0.0;
                uint kb = (b * Tk + j) * D;
                for (uint e = 0u; e < D; e++) d += qs[e] * k[kb + e];
                sc = pc.f[0] * d;
            }
            float nmx = max(mx, tree(sc, true));
            precise float alpha = exp(mx - nmx); // 0 on the first chunk (mx = -inf)
            precise float pj = j < nk ? exp(sc - nmx) : 0.0;
            s[t] = pj;
            precise float lsum = tree(pj, false); // the tree's barriers publish s[]
            l = l * alpha + lsum;
            uint cend = min(64u, nk - c0);
            for (uint e = t; e < Dv; e += 64u) {
                precise float a = acc[e] * alpha;
                for (uint jj = 0u; jj < cend; jj++) a += s[jj] * v[(b * Tk + c0 + jj) * Dv + e];
                acc[e] = a;
            }
            mx = nmx;
            barrier();
        }
        for (uint e = t; e < Dv; e += 64u) { precise float r = nk == 0u ? 0.0 : acc[e] / l; o[row * Dv + e] = r; }
        if (t == 0u && (pc.flags & 1u) != 0u) { st[2u * row] = mx + log(l); st[2u * row + 1u] = 0.0; }
        barrier();
    }
}
