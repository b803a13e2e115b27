#version 450
// conv2d gradient to the kernel (dpar_conv2d_backward_kernel):
//   dw[p,q,c,o] = sum_{n,i,j} x[n, i*sh - pt + p*dh, j*sw - pl + q*dw, c] dy[n,i,j,o]
// Geometry in p[0..15] as conv2d.comp. One invocation per dw element, outputs in order; or, with
// flags bit1 (many outputs: llvmpipe ends an invocation's loops after 65,535 turns), a workgroup per dw
// element, lane t taking outputs t, t+256, ... of the flattened (n, i, j), the lanes' sums meeting in a
// fixed tree (deterministic too, in another order).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) writeonly buffer DW { float dw[]; };
layout(std430, set = 0, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
shared float red[256];

void wide(uint e, uint N, uint H, uint W, uint C, uint OH, uint OW, uint O, uint KW, uint SH, uint SW, uint DH,
          uint DW, int PT, int PL) {
    uint t = gl_LocalInvocationID.x;
    uint o = e % O, r = e / O, c = r % C, q = (r / C) % KW, p = r / (C * KW);
    float acc = 0.0;
    for (uint s = t; s < N * OH * OW; s += 256u) {
        uint j = s % OW, i = (s / OW) % OH, nb = s / (OW * OH);
        int ih = int(i * SH) - PT + int(p * DH), iw = int(j * SW) - PL + int(q * DW);
        if (ih < 0 || ih >= int(H) || iw < 0 || iw >= int(W)) continue;
        acc += x[((nb * H + uint(ih)) * W + uint(iw)) * C + c] * dy[s * O + o];
    }
    red[t] = acc;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h) red[t] += red[t + h];
        barrier();
    }
    if (t == 0u) dw[e] = red[0];
    barrier();
}

void main() {
    uint N = pc.p[0], H = pc.p[1], W = pc.p[2], C = pc.p[3], OH = pc.p[4], OW = pc.p[5], O = pc.p[6];
    uint KW = pc.p[8], SH = pc.p[9], SW = pc.p[10], DH = pc.p[11], DW = pc.p[12];
    int PT = int(pc.p[13]), PL = int(pc.p[14]);
    if ((pc.flags & 2u) != 0u) {
        for (uint e = gl_WorkGroupID.x; e < pc.n; e += gl_NumWorkGroups.x) // uniform in the workgroup
            wide(e, N, H, W, C, OH, OW, O, KW, SH, SW, DH, DW, PT, PL);
        return;
    }
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += stride) {
        uint o = e % O, r = e / O, c = r % C, q = (r / C) % KW, p = r / (C * KW);
        float acc = 0.0;
        for (uint nb = 0u; nb < N; nb++)
            for (uint i = 0u; i < OH; i++) {
                int ih = int(i * SH) - PT + int(p * DH);
                if (ih < 0 || ih >= int(H)) continue;
                for (uint j = 0u; j < OW; j++) {
                    int iw = int(j * SW) - PL + int(q * DW);
                    if (iw < 0 || iw >= int(W)) continue;
                    acc += x[((nb * H + uint(ih)) * W + uint(iw)) * C + c] * dy[((nb * OH + i) * OW + j) * O + o];
                }
            }
        dw[e] = acc;
    }
}
