#version 450
// avg / max pool forward (dpar_avg_pool2d, dpar_max_pool2d), NHWC. Geometry in p[0..15] as
// conv2d.comp (o = c, no dilation); p[15] bit 0: avg divides by the in-image count. pc.flags bit 0: max.
// max: the first maximum in row-major window order (NaN beats numbers), -inf for a window wholly in
// the padding; avg: the in-image values summed in window order, divided by the count (NaN for
// none). As the CPU.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint H = pc.p[1], W = pc.p[2], C = pc.p[3], OH = pc.p[4], OW = pc.p[5], KH = pc.p[7], KW = pc.p[8];
    int SH = int(pc.p[9]), SW = int(pc.p[10]), PT = int(pc.p[13]), PL = int(pc.p[14]);
    bool is_max = (pc.flags & 1u) != 0u, excl = (pc.p[15] & 1u) != 0u;
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += stride) {
        uint c = e % C, r = e / C, j = r % OW, i = (r / OW) % OH, nb = r / (OW * OH);
        int h0 = max(int(i) * SH - PT, 0), w0 = max(int(j) * SW - PL, 0);
        int h1 = min(int(i) * SH - PT + int(KH), int(H)), w1 = min(int(j) * SW - PL + int(KW), int(W));
        float acc = 0.0, best = -1.0 / 0.0;
        bool found = false;
        for (int ih = h0; ih < h1; ih++)
            for (int iw = w0; iw < w1; iw++) {
                float v = x[((nb * H + uint(ih)) * W + uint(iw)) * C + c];
                if (!found || v > best || (isnan(v) && !isnan(best))) best = v;
                found = true;
                acc += v;
            }
        int cnt = excl ? max(h1 - h0, 0) * max(w1 - w0, 0) : int(KH * KW);
        y[e] = is_max ? best : (cnt > 0 ? acc / float(cnt) : uintBitsToFloat(0x7fc00000u));
    }
}
