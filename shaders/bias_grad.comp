#version 450
// db[N] = beta * db + sum over rows of dy[M,N] (dpar_bias_grad); m = M, n = N,
// f1 = beta; beta == 0 ignores db's old contents. One invocation per column,
// rows summed in order: deterministic. flags bit0 (long columns: llvmpipe ends an invocation's loops
// after 65,535 turns): a workgroup a column, lane t summing rows t, t+256, ..., the lanes' sums
// meeting in a fixed tree (deterministic too, in another order).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float db[]; };
layout(std430, set = 0, binding = 2) readonly buffer Dy { float dy[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
shared float red[256];

void wide_columns() {
    uint t = gl_LocalInvocationID.x;
    for (uint j = gl_WorkGroupID.x; j < pc.n; j += gl_NumWorkGroups.x) { // uniform in the workgroup
        precise float s = 0.0;
        for (uint r = t; r < pc.m; r += 256u) s += dy[r * pc.n + j];
        red[t] = s;
        barrier();
        for (uint h = 128u; h > 0u; h >>= 1) {
            if (t < h) { precise float a = red[t] + red[t + h]; red[t] = a; }
            barrier();
        }
        if (t == 0u) { precise float o = pc.f1 == 0.0 ? red[0] : pc.f1 * db[j] + red[0]; db[j] = o; }
        barrier();
    }
}

void main() {
    if ((pc.flags & 1u) != 0u) {
        wide_columns();
        return;
    }
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint j = gl_GlobalInvocationID.x; j < pc.n; j += stride) {
        precise float s = 0.0;
        for (uint r = 0u; r < pc.m; r++) s += dy[r * pc.n + j];
        precise float o = pc.f1 == 0.0 ? s : pc.f1 * db[j] + s;
        db[j] = o;
    }
}
