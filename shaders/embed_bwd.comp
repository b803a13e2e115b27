#version 450
// Embedding gradient (dpar_embedding_backward, after the core applied beta):
// dtable[idx[i], d] += dout[i, d] for i = 0..K-1 in order. One invocation per column d,
// so each element sums in position order: the CPU's order, bit for bit. n = K, m = D, k = V.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer DTable { float dt[]; };
layout(std430, set = 0, binding = 2) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 3) readonly buffer Idx { int idx[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u, D = pc.m;
    for (uint d = gl_GlobalInvocationID.x; d < D; d += stride)
        for (uint i = 0u; i < pc.n; i++) {
            int v = idx[i];
            if (v < 0 || uint(v) >= pc.k) continue;
            precise float x = dt[uint(v) * D + d] + dout[i * D + d];
            dt[uint(v) * D + d] = x;
        }
}
