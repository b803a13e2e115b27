#version 450
// avg / max pool gradient (dpar_avg_pool2d_backward, dpar_max_pool2d_backward), NHWC: for dx[n,ih,iw,c]
// the windows (i, j) that hold (ih, iw), in ascending order (the CPU's order of additions): avg adds
// dy / count, max adds dy where (ih, iw) is the window's first maximum (recomputed from x at binding 3).
// Geometry in p[0..15] as pool2d.comp; pc.flags bit 0: max. One invocation per dx element: no atomics.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) writeonly buffer DX { float dx[]; };
layout(std430, set = 0, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint H = pc.p[1], W = pc.p[2], C = pc.p[3], OH = pc.p[4], OW = pc.p[5], KH = pc.p[7], KW = pc.p[8];
    int SH = int(pc.p[9]), SW = int(pc.p[10]), PT = int(pc.p[13]), PL = int(pc.p[14]);
    bool is_max = (pc.flags & 1u) != 0u, excl = (pc.p[15] & 1u) != 0u;
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += stride) {
        uint c = e % C, r = e / C, iw = r % W, ih = (r / W) % H, nb = r / (W * H);
        int ti = int(ih) + PT - int(KH) + 1, tj = int(iw) + PL - int(KW) + 1;
        int i0 = ti <= 0 ? 0 : (ti + SH - 1) / SH, j0 = tj <= 0 ? 0 : (tj + SW - 1) / SW;
        int i1 = min((int(ih) + PT) / SH, int(OH) - 1), j1 = min((int(iw) + PL) / SW, int(OW) - 1);
        float acc = 0.0;
        for (int i = i0; i <= i1; i++)
            for (int j = j0; j <= j1; j++) {
                int h0 = max(i * SH - PT, 0), w0 = max(j * SW - PL, 0);
                int h1 = min(i * SH - PT + int(KH), int(H)), w1 = min(j * SW - PL + int(KW), int(W));
                float g = dy[((nb * OH + uint(i)) * OW + uint(j)) * C + c];
                if (!is_max) {
                    int cnt = excl ? max(h1 - h0, 0) * max(w1 - w0, 0) : int(KH * KW);
                    acc += g / float(cnt);
                    continue;
                }
                int bh = -1, bw = -1;
                float best = 0.0;
                for (int h = h0; h < h1; h++)
                    for (int w = w0; w < w1; w++) {
                        float v = x[((nb * H + uint(h)) * W + uint(w)) * C + c];
                        if (bh < 0 || v > best || (isnan(v) && !isnan(best))) { best = v; bh = h; bw = w; }
                    }
                if (bh == int(ih) && bw == int(iw)) acc += g;
            }
        dx[e] = acc;
    }
}
