#version 450
// y[p14 + i] = a[p12 + i.sa] op b[p13 + i.sb] (dpar_binary with NumPy broadcasting):
// i runs over the 4-d shape p[0..3] in row-major order, sa = p[4..7], sb = p[8..11]
// (0 along broadcast dims), op = p[15] (add, sub, mul, div). n = p0 p1 p2 p3.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 3) readonly buffer B { float b[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        uint r = i, ao = pc.p[12], bo = pc.p[13];
        for (int d = 3; d >= 0; d--) {
            uint c = r % pc.p[d];
            r /= pc.p[d];
            ao += c * pc.p[4 + d];
            bo += c * pc.p[8 + d];
        }
        float va = a[ao], vb = b[bo], o;
        switch (pc.p[15]) {
        case 0u: o = va + vb; break;
        case 1u: o = va - vb; break;
        case 2u: o = va * vb; break;
        default: o = va / vb; break;
        }
        y[pc.p[14] + i] = o;
    }
}
