#version 450
// Layer norm / RMS norm over the last axis, forward (dpar_layer_norm, dpar_rms_norm).
// x [M,N] (m = M, n = N) -> y = (x - mean) * rstd * w + b; stats[2r] = mean, stats[2r+1] = rstd.
// flags: bit0 stats, bit1 w, bit2 b, bit3 rms (mean = 0); f0 = eps.
// One workgroup of 256 per row (rows strided by the workgroup count), fixed reduction tree:
// deterministic. Flags bit 4 (chosen by the host for short rows, or where barriers are dear: llvmpipe
// splits a workgroup at each one): one invocation per row, summed in order, no barrier.
// The mean is shifted by x[0], so a constant row has exactly zero variance and y = b.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Y { float y[]; };
layout(std430, set = 0, binding = 1) buffer Stats { float st[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 3) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 5) readonly buffer B { float bias[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
shared float red[256];
bool per_row = (pc.flags & 16u) != 0u;  // a push constant: uniform
uint t0 = per_row ? 0u : gl_LocalInvocationID.x, step = per_row ? 1u : 256u;  // this invocation's columns

// The sum (or, is_max, the largest) of v over the workgroup, by a fixed tree.
float row_red(float v, bool is_max) {
    if (per_row) return v;
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) { precise float z = is_max ? max(red[t], red[t + s]) : red[t] + red[t + s]; red[t] = z; }
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

// rstd of a row whose sum of squares overflows f32 (a spread above about 1.8e19 / sqrt(N)): the deviations
// scaled by their largest magnitude s first, var = s^2 mean((d/s)^2); eps is below f32's resolution of
// var there. A row holding inf keeps the plain rstd (0), as the CPU's double sum does.
float scaled_rstd(uint base, uint N, float mean, float plain) {
    float s = 0.0;
    for (uint j = t0; j < N; j += step) s = max(s, abs(x[base + j] - mean));
    s = row_red(s, true);
    if (isinf(s)) return plain;
    precise float sq = 0.0;
    for (uint j = t0; j < N; j += step) { precise float d = (x[base + j] - mean) / s; sq += d * d; }
    return 1.0 / (s * sqrt(row_red(sq, false) / float(N)));
}

void main() {
    uint N = pc.n;
    bool rms = (pc.flags & 8u) != 0u;
    uint r0 = per_row ? gl_GlobalInvocationID.x : gl_WorkGroupID.x;
    uint rstep = per_row ? 256u * gl_NumWorkGroups.x : gl_NumWorkGroups.x;
    for (uint r = r0; r < pc.m; r += rstep) {
        uint base = r * N;
        float x0 = x[base];
        precise float acc = 0.0;
        if (!rms)
            for (uint j = t0; j < N; j += step) acc += x[base + j] - x0;
        precise float mean = rms ? 0.0 : x0 + row_red(acc, false) / float(N);
        precise float sq = 0.0;
        for (uint j = t0; j < N; j += step) { precise float d = x[base + j] - mean; sq += d * d; }
        precise float var = row_red(sq, false) / float(N);
        precise float rstd = 1.0 / sqrt(var + pc.f[0]);
        if (isinf(var)) rstd = scaled_rstd(base, N, mean, rstd); // uniform per row: every thread read one sum
        for (uint j = t0; j < N; j += step) {
            precise float xh = (x[base + j] - mean) * rstd;
            precise float o = ((pc.flags & 2u) != 0u ? xh * w[j] : xh) + ((pc.flags & 4u) != 0u ? bias[j] : 0.0);
            y[base + j] = o;
        }
        if (t0 == 0u && (pc.flags & 1u) != 0u) { st[2u * r] = mean; st[2u * r + 1u] = rstd; }
    }
}
