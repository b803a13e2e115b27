#version 450
// y[M,N] += b[N] (dpar_bias_add); n = M*N elements of y, m = N (length of b). flags bit 0: r = max(y, 0)
// as well, NaN propagating as relu.comp (a graph's bias_add -> relu in one dispatch).
// The column advances by the stride modulo N: one division an invocation, not one an element
// (llvmpipe divides lane by lane).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float y[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Relu { float r[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float b[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u, step = stride % pc.m;
    uint i = gl_GlobalInvocationID.x, col = i % pc.m;
    bool relu = (pc.flags & 1u) != 0u;
    for (; i < pc.n; i += stride) {
        precise float v = y[i] + b[col];
        y[i] = v;
        if (relu) r[i] = (v > 0.0 || isnan(v)) ? v : 0.0;
        col += step;
        if (col >= pc.m) col -= pc.m;
    }
}
