#version 450
// Layer norm / RMS norm backward to the affine parameters: dw[j] = sum_i dy_ij xhat_ij (flags bit0),
// db[j] = sum_i dy_ij (flags bit1), xhat = (x - mean) rstd from stats [M,2]. dy, x [M,N] (m = M, n = N).
// One invocation per column, rows summed in order: deterministic.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 1) buffer DW { float dw[]; };
layout(std430, set = 0, binding = 4) buffer DB { float db[]; };
layout(std430, set = 0, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 6) readonly buffer Stats { float st[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;

void main() {
    uint N = pc.n;
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
