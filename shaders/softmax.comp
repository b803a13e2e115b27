#version 450
// Softmax / log_softmax (p[0] = 1) along rows of n (m rows; dpar_softmax) and, with
// flags bit0, their backward (dpar_softmax_backward: x = dy, yv = the forward's y):
// softmax dx = y (dy - sum(dy y)); log_softmax dx = dy - exp(y) sum(dy).
// One invocation per row, in order (deterministic). Max subtracted; a row of -inf
// gives NaN (as JAX).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 3) readonly buffer Yv { float yv[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u, n = pc.n;
    bool lg = pc.p[0] != 0u, bwd = (pc.flags & 1u) != 0u;
    for (uint r = gl_GlobalInvocationID.x; r < pc.m; r += stride) {
        uint base = r * n;
        precise float acc = 0.0;
        if (bwd) {
            for (uint j = 0u; j < n; j++) acc += lg ? x[base + j] : x[base + j] * yv[base + j];
            for (uint j = 0u; j < n; j++)
                y[base + j] = lg ? x[base + j] - exp(yv[base + j]) * acc : yv[base + j] * (x[base + j] - acc);
            continue;
        }
        float mx = uintBitsToFloat(0xff800000u); // -inf
        for (uint j = 0u; j < n; j++) { float v = x[base + j]; mx = (v > mx || isnan(v)) ? v : mx; }
        for (uint j = 0u; j < n; j++) acc += exp(x[base + j] - mx);
        float lse = log(acc);
        for (uint j = 0u; j < n; j++) {
            float z = x[base + j] - mx;
            y[base + j] = lg ? z - lse : exp(z) / acc;
        }
    }
}
