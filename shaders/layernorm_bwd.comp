#version 450
// Layer norm / RMS norm backward to the input (dpar_layer_norm_backward, dpar_rms_norm_backward):
// xhat = (x - mean) rstd, g = dy w, dx = rstd (g - mean(g) - xhat mean(g xhat)) (rms: no mean(g) term).
// dy, x [M,N] (m = M, n = N), w [N] (flags bit1; else ones), stats [M,2] (mean, rstd); flags bit3 rms.
// One workgroup of 256 per row, fixed reduction tree. Flags bit 4 (the host's choice as for the forward
// in layernorm.comp: a CPU device, or rows of at most 32): one invocation per row, summed in order, no
// barrier. dx may alias dy: each invocation reads dy[j] before it writes dx[j], and layernorm_wgrad ran
// before this shader.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer DX { float dx[]; };
layout(std430, set = 0, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 5) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 6) readonly buffer Stats { float st[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
shared float red[2][256];
bool per_row = (pc.flags & 16u) != 0u;  // a push constant: uniform
uint t0 = per_row ? 0u : gl_LocalInvocationID.x, step = per_row ? 1u : 256u;  // this invocation's columns

// The sums of u and v over the workgroup, by a fixed tree.
vec2 row_red(float u, float v) {
    if (per_row) return vec2(u, v);
    uint t = gl_LocalInvocationID.x;
    red[0][t] = u;
    red[1][t] = v;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) {
            precise float a = red[0][t] + red[0][t + s], b = red[1][t] + red[1][t + s];
            red[0][t] = a;
            red[1][t] = b;
        }
        barrier();
    }
    vec2 r = vec2(red[0][0], red[1][0]);
    barrier();
    return r;
}

void main() {
    uint N = pc.n;
    bool rms = (pc.flags & 8u) != 0u, hw = (pc.flags & 2u) != 0u;
    uint r0 = per_row ? gl_GlobalInvocationID.x : gl_WorkGroupID.x;
    uint rstep = per_row ? 256u * gl_NumWorkGroups.x : gl_NumWorkGroups.x;
    for (uint r = r0; r < pc.m; r += rstep) {
        uint base = r * N;
        float mean = st[2u * r], rstd = st[2u * r + 1u];
        precise float sg = 0.0, sgx = 0.0;
        for (uint j = t0; j < N; j += step) {
            precise float xh = (x[base + j] - mean) * rstd;
            precise float g = hw ? dy[base + j] * w[j] : dy[base + j];
            sg += g;
            sgx += g * xh;
        }
        vec2 sums = row_red(sg, sgx);
        precise float mg = rms ? 0.0 : sums.x / float(N);
        precise float mgx = sums.y / float(N);
        for (uint j = t0; j < N; j += step) {
            precise float xh = (x[base + j] - mean) * rstd;
            precise float g = hw ? dy[base + j] * w[j] : dy[base + j];
            precise float o = rstd * (g - mg - xh * mgx);
            dx[base + j] = o;
        }
    }
}
