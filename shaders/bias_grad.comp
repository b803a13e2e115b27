#version 450
// db[N] = beta * db + sum over rows of dy[M,N] (dpar_bias_grad); m = M, n = N,
// f1 = beta; beta == 0 ignores db's old contents. One invocation per column,
// rows summed in order: deterministic. flags bit0 (long columns: llvmpipe ends an invocation's loops
// after 65,535 turns): a workgroup a column, lane t summing rows t, t+256, ..., the lanes' sums
// meeting in a fixed tree (deterministic too, in another order). flags bit1 (a graph's relu_backward ->
// bias_grad in one dispatch): each dy taken where x > 0, else 0, and written to dx (may alias dy), as
// relu_bwd.comp; the sums are those of dx.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float db[]; };
layout(std430, set = 0, binding = 1) buffer Dx { float dx[]; };
layout(std430, set = 0, binding = 2) readonly buffer Dy { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
shared float red[256];

// element e of dy, masked by relu's input and written to dx with bit 1
float term(uint e, bool relu) {
    if (!relu) return dy[e];
    float v = x[e] > 0.0 ? dy[e] : 0.0;
    dx[e] = v;
    return v;
}

void wide_columns(bool relu) {
    uint t = gl_LocalInvocationID.x;
    for (uint j = gl_WorkGroupID.x; j < pc.n; j += gl_NumWorkGroups.x) { // uniform in the workgroup
        precise float s = 0.0;
        for (uint r = t; r < pc.m; r += 256u) s += term(r * pc.n + j, relu);
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
    bool relu = (pc.flags & 2u) != 0u;
    if ((pc.flags & 1u) != 0u) {
        wide_columns(relu);
        return;
    }
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint j = gl_GlobalInvocationID.x; j < pc.n; j += stride) {
        precise float s = 0.0;
        for (uint r = 0u; r < pc.m; r++) s += term(r * pc.n + j, relu);
        precise float o = pc.f1 == 0.0 ? s : pc.f1 * db[j] + s;
        db[j] = o;
    }
}
