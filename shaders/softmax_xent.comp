#version 450
// Softmax cross-entropy with integer labels (dpar_softmax_xent, dpar_cross_entropy).
// logits [M,C] (m = M, n = C), labels [M] i32. A row labelled p[1] is ignored when p[0] != 0
// (zero gradient row, not counted); a = f[0] smooths the target: q = (1 - a) onehot + a / C.
// loss[0] = sum over counted rows of (lse(z_i) - q_i . z_i) / counted;
// dlogits (flags bit0) = (softmax(z_i) - q_i) / counted. Max subtracted:
// row loss (max - z_label) + log(sum exp(z - max)) when a = 0.
// A label outside 0..C-1 gives a NaN row loss and a NaN gradient row, and the lowest such row is
// recorded in the device's error words (binding 4) as check_index.comp records it (function p[2]): the
// check rides on the label count's pass, so it costs no dispatch of its own.
// One workgroup of 64, rows t, t+64, ... per invocation; the per-invocation counts and sums are added
// in invocation order: deterministic, with two barriers (llvmpipe splits a workgroup at each one).
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer Loss { float loss[]; };
layout(std430, set = 0, binding = 1) buffer Grad { float dz[]; };
layout(std430, set = 0, binding = 2) readonly buffer Logits { float z[]; };
layout(std430, set = 0, binding = 3) readonly buffer Labels { int labels[]; };
layout(std430, set = 0, binding = 4) buffer Err { uint err[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
shared float part[64];
shared uint cnt[64], first_bad[64];
void main() {
    uint t = gl_LocalInvocationID.x;
    uint M = pc.m, C = pc.n;
    bool grad = (pc.flags & 1u) != 0u, ign = pc.p[0] != 0u;
    int ignore = int(pc.p[1]);
    float a = pc.f[0];
    float qnan = uintBitsToFloat(0x7fc00000u);
    uint c_own = 0u, bad = 0xffffffffu;
    for (uint r = t; r < M; r += 64u) { // rising r: the first bad one is this invocation's lowest
        int lab = labels[r];
        bool skip = ign && lab == ignore;
        c_own += skip ? 0u : 1u;
        if (bad == 0xffffffffu && !skip && (lab < 0 || uint(lab) >= C)) bad = r;
    }
    cnt[t] = c_own;
    first_bad[t] = bad;
    barrier();
    if (t == 0u) {
        for (uint i = 0u; i < 64u; i++) bad = min(bad, first_bad[i]);
        if (bad != 0xffffffffu && err[0] == 0u) {
            err[1] = bad;
            err[2] = uint(labels[bad]);
            err[3] = pc.p[2];
            err[4] = C;
            err[0] = 1u;
        }
    }
    uint counted = 0u;
    for (uint i = 0u; i < 64u; i++) counted += cnt[i];
    float inv_m = 1.0 / float(counted);
    precise float acc = 0.0;
    for (uint r = t; r < M; r += 64u) {
        uint base = r * C;
        int lab = labels[r];
        if (ign && lab == ignore) {
            if (grad)
                for (uint c = 0u; c < C; c++) dz[base + c] = 0.0;
            continue;
        }
        float mx = uintBitsToFloat(0xff800000u); // -inf
        bool has_nan = false;
        for (uint c = 0u; c < C; c++) { float v = z[base + c]; has_nan = has_nan || isnan(v); mx = max(mx, v); }
        precise float se = 0.0;
        for (uint c = 0u; c < C; c++) se += exp(z[base + c] - mx);
        bool ok = lab >= 0 && uint(lab) < C && !has_nan;
        // (max - z_label) + log(sum): exact even when |z| is near FLT_MAX
        precise float rl = ok ? (mx - z[base + uint(lab)]) + log(se) : qnan;
        if (a != 0.0 && ok) {
            precise float zs = 0.0;
            for (uint c = 0u; c < C; c++) zs += z[base + c] - mx;
            rl = (1.0 - a) * rl + a * (log(se) - zs / float(C));
        }
        acc += rl;
        if (grad) {
            for (uint c = 0u; c < C; c++) {
                precise float p = exp(z[base + c] - mx) / se;
                precise float q = (int(c) == lab ? 1.0 - a : 0.0) + a / float(C);
                precise float g = (p - q) * inv_m;
                dz[base + c] = ok ? g : qnan;
            }
        }
    }
    part[t] = acc;
    barrier();
    if (t == 0u) {
        precise float sum = 0.0;
        for (uint i = 0u; i < 64u; i++) sum += part[i];
        precise float l = sum * inv_m;
        loss[0] = counted == 0u ? 0.0 : l;
    }
}
