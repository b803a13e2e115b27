#version 450
// out[0] = sum(x) (flags bit0 = 0) or sum(x*x) (bit0 = 1) over n elements
// (dpar_sum / dpar_sum_squares). One workgroup of 256: invocation t sums
// elements t, t+256, ... in order, then a fixed tree over shared memory, so
// the result is bitwise the same run after run.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float o[]; };
layout(std430, set = 0, binding = 2) readonly buffer Src { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
shared float part[256];
void main() {
    uint t = gl_LocalInvocationID.x;
    bool sq = (pc.flags & 1u) != 0u;
    precise float acc = 0.0;
    for (uint i = t; i < pc.n; i += 256u) {
        float v = x[i];
        acc += sq ? v * v : v;
    }
    part[t] = acc;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) { precise float r = part[t] + part[t + s]; part[t] = r; }
        barrier();
    }
    if (t == 0u) o[0] = part[0];
}
