#version 450
// db[N] = beta * db + sum over rows of dy[M,N] (dpar_bias_grad); m = M, n = N,
// f1 = beta; beta == 0 ignores db's old contents. One invocation per column,
// rows summed in order: deterministic.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float db[]; };
layout(std430, set = 0, binding = 2) readonly buffer Dy { float dy[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint j = gl_GlobalInvocationID.x; j < pc.n; j += stride) {
        precise float s = 0.0;
        for (uint r = 0u; r < pc.m; r++) s += dy[r * pc.n + j];
        precise float o = pc.f1 == 0.0 ? s : pc.f1 * db[j] + s;
        db[j] = o;
    }
}
