#version 450
// Layer norm / RMS norm backward to the affine parameters: dw[j] = sum_i dy_ij xhat_ij (flags bit0),
// db[j] = sum_i dy_ij (flags bit1), xhat = (x - mean) rstd from stats [M,2]. dy, x [M,N] (m = M, n = N).
// One invocation per column, rows summed in order: deterministic. flags bit2 (long columns: llvmpipe
// ends an invocation's loops after 65,535 turns): a workgroup a column, lane t summing rows t, t+256, ...,
// the lanes' sums meeting in a fixed tree (deterministic too, in another order).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 1) buffer DW { float dw[]; };
layout(std430, set = 0, binding = 4) buffer DB { float db[]; };
layout(std430, set = 0, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 6) readonly buffer Stats { float st[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;

shared vec2 red[256];

// dy_rj xhat_rj and dy_rj of row r, column j
vec2 terms(uint r, uint j, uint N) {
    float g = dy[r * N + j];
    precise float xh = (x[r * N + j] - st[2u * r]) * st[2u * r + 1u];
    precise float gx = g * xh;
    return vec2(gx, g);
}

void store(uint j, vec2 a) {
    if ((pc.flags & 1u) != 0u) dw[j] = a.x;
    if ((pc.flags & 2u) != 0u) db[j] = a.y;
}

void wide_columns(uint N) {
    uint t = gl_LocalInvocationID.x;
    for (uint j = gl_WorkGroupID.x; j < N; j += gl_NumWorkGroups.x) { // uniform in the workgroup
        precise vec2 a = vec2(0.0);
        for (uint r = t; r < pc.m; r += 256u) a += terms(r, j, N);
        red[t] = a;
        barrier();
        for (uint h = 128u; h > 0u; h >>= 1) {
            if (t < h) { precise vec2 b = red[t] + red[t + h]; red[t] = b; }
            barrier();
        }
        if (t == 0u) store(j, red[0]);
        barrier();
    }
}

void main() {
    uint N = pc.n;
    if ((pc.flags & 4u) != 0u) {
        wide_columns(N);
        return;
    }
    for (uint j = gl_GlobalInvocationID.x; j < N; j += gl_NumWorkGroups.x * 256u) {
        precise float aw = 0.0, ab = 0.0;
        for (uint r = 0u; r < pc.m; r++) {
            float g = dy[r * N + j];
            precise float xh = (x[r * N + j] - st[2u * r]) * st[2u * r + 1u];
            aw += g * xh;
            ab += g;
        }
        if ((pc.flags & 1u) != 0u) dw[j] = aw;
        if ((pc.flags & 2u) != 0u) db[j] = ab;
    }
}
