#version 450
// conv2d forward (dpar_conv2d), NHWC x, HWIO w:
//   y[n,i,j,o] = b[o] + sum_{p,q,c} x[n, i*sh - pt + p*dh, j*sw - pl + q*dw, c] w[p,q,c,o]
// p[0..15] = n h w c oh ow o kh kw sh sw dh dw pt pl flags (dpar__win2d); pc.flags bit 0: bias at
// binding 5. One invocation per output element, the window in row-major order (out-of-image taps skipped).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 3) readonly buffer Wt { float w[]; };
layout(std430, set = 0, binding = 5) readonly buffer B { float b[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint H = pc.p[1], W = pc.p[2], C = pc.p[3], OH = pc.p[4], OW = pc.p[5], O = pc.p[6], KH = pc.p[7];
    uint KW = pc.p[8], SH = pc.p[9], SW = pc.p[10], DH = pc.p[11], DW = pc.p[12];
    int PT = int(pc.p[13]), PL = int(pc.p[14]);
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += stride) {
        uint o = e % O, r = e / O, j = r % OW, i = (r / OW) % OH, nb = r / (OW * OH);
        float acc = (pc.flags & 1u) != 0u ? b[o] : 0.0;
        for (uint p = 0u; p < KH; p++) {
            int ih = int(i * SH) - PT + int(p * DH);
            if (ih < 0 || ih >= int(H)) continue;
            for (uint q = 0u; q < KW; q++) {
                int iw = int(j * SW) - PL + int(q * DW);
                if (iw < 0 || iw >= int(W)) continue;
                uint xb = ((nb * H + uint(ih)) * W + uint(iw)) * C, wb = (p * KW + q) * C * O + o;
                for (uint c = 0u; c < C; c++) acc += x[xb + c] * w[wb + c * O];
            }
        }
        y[e] = acc;
    }
}
