#version 450
// Softmax / log_softmax (p[0] = 1) along rows of n (m rows; dpar_softmax) and, with
// flags bit0, their backward (dpar_softmax_backward: x = dy, yv = the forward's y):
// softmax dx = y (dy - sum(dy y)); log_softmax dx = dy - exp(y) sum(dy).
// One invocation per row, in order (deterministic); or, with flags bit1 (long rows: llvmpipe ends an
// invocation's loops after 65,535 turns, and three loops over a row of 21,844 pass that), a workgroup per
// row, lane t taking elements t, t+256, ... and the lanes' maxima and sums meeting in a fixed tree
// (deterministic too, summed in another order). Max subtracted; a row of -inf gives NaN (as JAX).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 3) readonly buffer Yv { float yv[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
shared float red[256];
// the workgroup's max (NaN wins, as the row loop's) or sum of v, the same in every lane
float wide_reduce(float v, bool is_max) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h) {
            float a = red[t], b = red[t + h];
            precise float sum = a + b;
            red[t] = is_max ? ((b > a || isnan(b)) ? b : a) : sum;
        }
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

// flags bit1: a row a workgroup
void wide_rows(uint n, bool lg, bool bwd) {
    uint t = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < pc.m; r += gl_NumWorkGroups.x) { // uniform in the workgroup
        uint base = r * n;
        precise float acc = 0.0;
        if (bwd) {
            for (uint j = t; j < n; j += 256u) acc += lg ? x[base + j] : x[base + j] * yv[base + j];
            acc = wide_reduce(acc, false);
            for (uint j = t; j < n; j += 256u)
                y[base + j] = lg ? x[base + j] - exp(yv[base + j]) * acc : yv[base + j] * (x[base + j] - acc);
            continue;
        }
        float mx = uintBitsToFloat(0xff800000u); // -inf
        for (uint j = t; j < n; j += 256u) { float v = x[base + j]; mx = (v > mx || isnan(v)) ? v : mx; }
        mx = wide_reduce(mx, true);
        for (uint j = t; j < n; j += 256u) acc += exp(x[base + j] - mx);
        acc = wide_reduce(acc, false);
        float lse = log(acc);
        for (uint j = t; j < n; j += 256u) {
            float z = x[base + j] - mx;
            y[base + j] = lg ? z - lse : exp(z) / acc;
        }
    }
}

void main() {
    uint stride = gl_NumWorkGroups.x * 256u, n = pc.n;
    bool lg = pc.p[0] != 0u, bwd = (pc.flags & 1u) != 0u;
    if ((pc.flags & 2u) != 0u) {
        wide_rows(n, lg, bwd);
        return;
    }
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
