#version 450
// y[i] = cond[i.sc] ? a[i.sa] : b[i.sb] (dpar_where), i over the 4-d shape p[0..3],
// strides sc = p[4..7], sa = p[8..11], sb = p[12..15]. cond is f32 (nonzero or
// NaN is true) or i32 (flags bit0; nonzero). flags bit1 / bit2: a / b given,
// else the scalars f0 / f1.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float y[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) readonly buffer C { uint cond[]; };
layout(std430, set = 0, binding = 3) readonly buffer A { float a[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    uint zero_mask = (pc.flags & 1u) != 0u ? 0xffffffffu : 0x7fffffffu; // f32: -0 is false
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        uint r = i, co = 0u, ao = 0u, bo = 0u;
        for (int d = 3; d >= 0; d--) {
            uint c = r % pc.p[d];
            r /= pc.p[d];
            co += c * pc.p[4 + d];
            ao += c * pc.p[8 + d];
            bo += c * pc.p[12 + d];
        }
        if ((cond[co] & zero_mask) != 0u)
            y[i] = (pc.flags & 2u) != 0u ? a[ao] : pc.f[0];
        else
            y[i] = (pc.flags & 4u) != 0u ? b[bo] : pc.f[1];
    }
}
