#version 450
#extension GL_GOOGLE_include_directive : require
// softmax_xent.comp's op (the same loss, gradient and label check) for wide rows or many rows (the
// backend's dpar__vk_xent): three dispatches of pass p[3] over the scratch tmp (binding 5: tmp[0] the
// counted rows, tmp[1 + g] the bits of workgroup g's loss sum, G = k workgroups in pass 1):
//   0: one workgroup counts the rows and checks the labels;
//   1: workgroup g takes rows g, g + G, ..., its lanes a row's classes c = t, t + 64, ... with the max, the
//      sum of exp and the smoothing sum met in fixed trees; its row losses added in row order into tmp[1 + g];
//   2: one workgroup adds tmp[1..G] (lanes strided, then the tree) into loss[0].
// Every order is fixed by M and C: the same bits run after run, op by op or recorded.
layout(local_size_x = 64) in;
#include "softmax_xent_common.glsl"
layout(std430, set = 0, binding = 5) buffer Tmp { uint tmp[]; };
shared float part[64], part2[64];

// pass 0: the counted rows into tmp[0], the lowest bad row into the error words
void wide_count(uint t) {
    count_rows(t);
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (t < h) {
            cnt[t] += cnt[t + h];
            first_bad[t] = min(first_bad[t], first_bad[t + h]);
        }
        barrier();
    }
    if (t == 0u) {
        record_bad(first_bad[0]);
        tmp[0] = cnt[0];
    }
}

// the workgroup's max (NaN wins) of v, or its sums of v and v2 (into part[0], part2[0]), in a fixed tree
void tree(float v, float v2, bool is_max) {
    uint t = gl_LocalInvocationID.x;
    part[t] = v;
    part2[t] = v2;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (t < h) {
            float x = part[t], y = part[t + h];
            precise float s = x + y, s2 = part2[t] + part2[t + h];
            part[t] = is_max ? ((y > x || isnan(y)) ? y : x) : s;
            part2[t] = s2;
        }
        barrier();
    }
}

// pass 1: a row a workgroup (uniform r: the barriers are reached by every lane)
void wide_rows(uint t) {
    uint C = pc.n, G = gl_NumWorkGroups.x;
    bool grad = (pc.flags & 1u) != 0u;
    float a = pc.f[0];
    uint counted = tmp[0];
    float inv_m = 1.0 / float(counted);
    precise float acc = 0.0; // lane 0's sum of its rows' losses, in row order
    for (uint r = gl_WorkGroupID.x; r < pc.m; r += G) {
        uint base = r * C;
        int lab = labels[r];
        if (ignored(lab)) {
            if (grad)
                for (uint c = t; c < C; c += 64u) dz[base + c] = 0.0;
            continue;
        }
        float mx = uintBitsToFloat(0xff800000u); // -inf
        for (uint c = t; c < C; c += 64u) { float v = z[base + c]; mx = (v > mx || isnan(v)) ? v : mx; }
        tree(mx, 0.0, true);
        mx = part[0];
        barrier(); // every lane has read part[0] before the next tree writes it
        precise float se = 0.0, zs = 0.0;
        for (uint c = t; c < C; c += 64u) {
            float d = z[base + c] - mx;
            se += exp(d);
            zs += a != 0.0 ? d : 0.0;
        }
        tree(se, zs, false);
        se = part[0];
        zs = part2[0];
        barrier();
        bool ok = lab >= 0 && uint(lab) < C && !isnan(mx);
        if (t == 0u) acc += row_loss(r, mx, se, zs, ok);
        if (grad)
            for (uint c = t; c < C; c += 64u) grad_at(base, c, lab, mx, se, inv_m, ok);
    }
    if (t == 0u) tmp[1u + gl_WorkGroupID.x] = floatBitsToUint(acc);
}

// pass 2: the workgroups' sums (G = pc.k of them) in a fixed order, over the counted rows
void wide_sum(uint t) {
    precise float acc = 0.0;
    for (uint g = t; g < pc.k; g += 64u) acc += uintBitsToFloat(tmp[1u + g]);
    tree(acc, 0.0, false);
    if (t == 0u) {
        uint counted = tmp[0];
        precise float l = part[0] * (1.0 / float(counted));
        loss[0] = counted == 0u ? 0.0 : l;
    }
}

void main() {
    uint t = gl_LocalInvocationID.x;
    if (pc.p[3] == 0u) wide_count(t);
    else if (pc.p[3] == 1u) wide_rows(t);
    else wide_sum(t);
}
