#version 450
// out[m] = sum(x) (flags bit0 = 0) or sum(x*x) (bit0 = 1) over n elements
// (dpar_sum / dpar_sum_squares: m = 0; the clip's norms: m = the gradient's). One workgroup of 256: invocation t sums
// elements t, t+256, ... in order with Neumaier's compensated summation, then
// the (sum, compensation) pairs meet in a fixed tree over shared memory. The
// result is close to the correctly rounded sum (the CPU backend sums in double)
// and bitwise the same run after run.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float o[]; };
layout(std430, set = 0, binding = 2) readonly buffer Src { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
shared float ps[256];
shared float pcomp[256];

// (s, c) += v, Neumaier (improved Kahan-Babuska)
void add(inout float s, inout float c, float v) {
    precise float t = s + v;
    precise float e = abs(s) >= abs(v) ? (s - t) + v : (v - t) + s;
    precise float cc = c + e;
    s = t;
    c = cc;
}

// (s, c) += v or v*v
void term(inout float s, inout float c, float v, bool sq) {
    precise float w = sq ? v * v : v;
    add(s, c, w);
}

void main() {
    uint t = gl_LocalInvocationID.x;
    bool sq = (pc.flags & 1u) != 0u;
    float s = 0.0, c = 0.0;
    // elements t, t+256, t+512, t+768 an iteration, in that order: a quarter of the iterations, so the
    // loop stays under llvmpipe's cap (65,535 iterations an invocation, every loop counted) at every n a
    // buffer can hold there (32M floats in 128 MiB); the same order, so the same bits, as one a turn
    for (uint i = t; i < pc.n; i += 1024u) {
        term(s, c, x[i], sq);
        if (pc.n - i > 256u) term(s, c, x[i + 256u], sq);
        if (pc.n - i > 512u) term(s, c, x[i + 512u], sq);
        if (pc.n - i > 768u) term(s, c, x[i + 768u], sq);
    }
    ps[t] = s;
    pcomp[t] = c;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h) {
            float a = ps[t], ca = pcomp[t];
            add(a, ca, ps[t + h]);
            precise float cb = ca + pcomp[t + h];
            ps[t] = a;
            pcomp[t] = cb;
        }
        barrier();
    }
    if (t == 0u) {
        precise float r = ps[0] + pcomp[0];
        o[pc.m] = isnan(r) && !isnan(ps[0]) ? ps[0] : r;   // +-Inf: the compensation is NaN
    }
}
