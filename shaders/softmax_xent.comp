#version 450
#extension GL_GOOGLE_include_directive : require
// Softmax cross-entropy with integer labels (dpar_softmax_xent, dpar_cross_entropy).
// logits [M,C] (m = M, n = C), labels [M] i32. A row labelled p[1] is ignored when p[0] != 0
// (zero gradient row, not counted); a = f[0] smooths the target: q = (1 - a) onehot + a / C.
// loss[0] = sum over counted rows of (lse(z_i) - q_i . z_i) / counted;
// dlogits (flags bit0) = (softmax(z_i) - q_i) / counted. Max subtracted:
// row loss (max - z_label) + log(sum exp(z - max)) when a = 0.
// A label outside 0..C-1 gives a NaN row loss and a NaN gradient row, and the lowest such row is
// recorded in the device's error words (binding 4) as check_index.comp records it (function p[2]): the
// check rides on the label count's pass, so it costs no dispatch of its own.
// The small ops (the backend's dpar__vk_xent; softmax_xent_wide.comp takes the others): one workgroup of
// 64, rows t, t+64, ... per invocation; the per-invocation counts and sums are added in invocation order:
// deterministic, with two barriers (llvmpipe splits a workgroup at each one).
layout(local_size_x = 64) in;
#include "softmax_xent_common.glsl"
shared float part[64];

void main() {
    uint t = gl_LocalInvocationID.x;
    uint M = pc.m, C = pc.n;
    bool grad = (pc.flags & 1u) != 0u;
    float a = pc.f[0];
    count_rows(t);
    barrier();
    if (t == 0u) {
        uint bad = 0xffffffffu;
        for (uint i = 0u; i < 64u; i++) bad = min(bad, first_bad[i]);
        record_bad(bad);
    }
    uint counted = 0u;
    for (uint i = 0u; i < 64u; i++) counted += cnt[i];
    float inv_m = 1.0 / float(counted);
    precise float acc = 0.0;
    for (uint r = t; r < M; r += 64u) {
        uint base = r * C;
        int lab = labels[r];
        if (ignored(lab)) {
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
        precise float zs = 0.0;
        if (a != 0.0 && ok)
            for (uint c = 0u; c < C; c++) zs += z[base + c] - mx;
        acc += row_loss(r, mx, se, zs, ok);
        if (grad)
            for (uint c = 0u; c < C; c++) grad_at(base, c, lab, mx, se, inv_m, ok);
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
