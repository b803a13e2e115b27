#version 450
// conv2d gradient to the input (dpar_conv2d_backward_input): for dx[n,ih,iw,c], the sum over the
// taps (p, q) and outputs (i, j) with i*sh - pt + p*dh = ih, j*sw - pl + q*dw = iw of dy[n,i,j,:] . w[p,q,c,:].
// Geometry in p[0..15] as conv2d.comp. One invocation per dx element (a gather: no atomics).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) writeonly buffer DX { float dx[]; };
layout(std430, set = 0, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer Wt { float w[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint H = pc.p[1], W = pc.p[2], C = pc.p[3], OH = pc.p[4], OW = pc.p[5], O = pc.p[6], KH = pc.p[7];
    uint KW = pc.p[8], SH = pc.p[9], SW = pc.p[10], DH = pc.p[11], DW = pc.p[12];
    int PT = int(pc.p[13]), PL = int(pc.p[14]);
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += stride) {
        uint c = e % C, r = e / C, iw = r % W, ih = (r / W) % H, nb = r / (W * H);
        float acc = 0.0;
        for (uint p = 0u; p < KH; p++) {
            int ti = int(ih) + PT - int(p * DH);
            if (ti < 0 || uint(ti) % SH != 0u || uint(ti) / SH >= OH) continue;
            uint i = uint(ti) / SH;
            for (uint q = 0u; q < KW; q++) {
                int tj = int(iw) + PL - int(q * DW);
                if (tj < 0 || uint(tj) % SW != 0u || uint(tj) / SW >= OW) continue;
                uint j = uint(tj) / SW;
                uint yb = ((nb * OH + i) * OW + j) * O, wb = ((p * KW + q) * C + c) * O;
                for (uint o = 0u; o < O; o++) acc += dy[yb + o] * w[wb + o];
            }
        }
        dx[e] = acc;
    }
}
