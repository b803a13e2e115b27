#version 450
// Softmax cross-entropy with integer labels (dpar_softmax_xent).
// logits [M,C] (m = M, n = C), labels [M] i32. loss[0] = mean_i(lse(z_i) - z_i[label_i]);
// dlogits (flags bit0) = (softmax(z_i) - onehot(label_i)) / M. Max subtracted:
// row loss (max - z_label) + log(sum exp(z - max)).
// A label outside 0..C-1 gives a NaN row loss and a NaN gradient row.
// One workgroup of 256, rows t, t+256, ... per invocation, fixed tree: deterministic.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Loss { float loss[]; };
layout(std430, set = 0, binding = 1) buffer Grad { float dz[]; };
layout(std430, set = 0, binding = 2) readonly buffer Logits { float z[]; };
layout(std430, set = 0, binding = 3) readonly buffer Labels { int labels[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
shared float part[256];
void main() {
    uint t = gl_LocalInvocationID.x;
    uint M = pc.m, C = pc.n;
    bool grad = (pc.flags & 1u) != 0u;
    float qnan = uintBitsToFloat(0x7fc00000u);
    float inv_m = 1.0 / float(M);
    precise float acc = 0.0;
    for (uint r = t; r < M; r += 256u) {
        uint base = r * C;
        float mx = uintBitsToFloat(0xff800000u); // -inf
        bool has_nan = false;
        for (uint c = 0u; c < C; c++) { float v = z[base + c]; has_nan = has_nan || isnan(v); mx = max(mx, v); }
        precise float se = 0.0;
        for (uint c = 0u; c < C; c++) se += exp(z[base + c] - mx);
        int lab = labels[r];
        bool ok = lab >= 0 && uint(lab) < C && !has_nan;
        // (max - z_label) + log(sum): exact even when |z| is near FLT_MAX
        precise float rl = ok ? (mx - z[base + uint(lab)]) + log(se) : qnan;
        acc += rl;
        if (grad) {
            for (uint c = 0u; c < C; c++) {
                precise float p = exp(z[base + c] - mx) / se;
                precise float g = (p - (int(c) == lab ? 1.0 : 0.0)) * inv_m;
                dz[base + c] = ok ? g : qnan;
            }
        }
    }
    part[t] = acc;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) { precise float x = part[t] + part[t + s]; part[t] = x; }
        barrier();
    }
    if (t == 0u) { precise float l = part[0] * inv_m; loss[0] = M == 0u ? 0.0 : l; }
}
