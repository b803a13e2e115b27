#version 450
// dst[p13 + i.ds] = src[p12 + i.ss] (the shape ops: transpose, broadcast_to, slice,
// pad, concat): i over the 4-d shape p[0..3], ss = p[4..7], ds = p[8..11].
// 4-byte elements copied as bits (f32 or i32).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { uint dst[]; };
layout(std430, set = 0, binding = 2) readonly buffer Src { uint src[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        uint r = i, so = pc.p[12], o = pc.p[13];
        for (int d = 3; d >= 0; d--) {
            uint c = r % pc.p[d];
            r /= pc.p[d];
            so += c * pc.p[4 + d];
            o += c * pc.p[8 + d];
        }
        dst[o] = src[so];
    }
}
