#version 450
// Embedding lookup (dpar_embedding): out[i, d] = table[idx[i], d]; n = K*D, m = D, k = V.
// An index out of range writes 0 (the check_index pass reports it).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Out { float o[]; };
layout(std430, set = 0, binding = 2) readonly buffer Table { float tab[]; };
layout(std430, set = 0, binding = 3) readonly buffer Idx { int idx[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u, D = pc.m;
    for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += stride) {
        uint i = e / D, d = e - i * D;
        int v = idx[i];
        o[e] = (v >= 0 && uint(v) < pc.k) ? tab[uint(v) * D + d] : 0.0;
    }
}
