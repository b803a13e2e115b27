// Shared by softmax_xent.comp and softmax_xent_wide.comp (workgroups of 64): bindings, push constants, the
// label count and check, a row's loss and gradient.
layout(std430, set = 0, binding = 0) buffer Loss { float loss[]; };
layout(std430, set = 0, binding = 1) buffer Grad { float dz[]; };
layout(std430, set = 0, binding = 2) readonly buffer Logits { float z[]; };
layout(std430, set = 0, binding = 3) readonly buffer Labels { int labels[]; };
layout(std430, set = 0, binding = 4) buffer Err { uint err[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
shared uint cnt[64], first_bad[64];

bool ignored(int lab) { return pc.p[0] != 0u && lab == int(pc.p[1]); }

// the lowest bad row of those counted (first_bad) into the error words, unless an earlier op's is there
void record_bad(uint bad) {
    if (bad != 0xffffffffu && err[0] == 0u) {
        err[1] = bad;
        err[2] = uint(labels[bad]);
        err[3] = pc.p[2];
        err[4] = pc.n;
        err[0] = 1u;
    }
}

// this invocation's counted rows of t, t + 64, ... and the lowest bad one among them (rising r)
void count_rows(uint t) {
    uint c_own = 0u, bad = 0xffffffffu;
    for (uint r = t; r < pc.m; r += 64u) {
        int lab = labels[r];
        bool skip = ignored(lab);
        c_own += skip ? 0u : 1u;
        if (bad == 0xffffffffu && !skip && (lab < 0 || uint(lab) >= pc.n)) bad = r;
    }
    cnt[t] = c_own;
    first_bad[t] = bad;
}

// the loss of row r (NaN for a bad label or a NaN logit) from its max, sum of exp and smoothing sum
float row_loss(uint r, float mx, float se, float zs, bool ok) {
    float a = pc.f[0];
    if (!ok) return uintBitsToFloat(0x7fc00000u); // and labels[r] may be outside the row
    precise float rl = (mx - z[r * pc.n + uint(labels[r])]) + log(se); // exact even when |z| is near FLT_MAX
    if (a != 0.0) rl = (1.0 - a) * rl + a * (log(se) - zs / float(pc.n));
    return rl;
}

// dz[base + c] for row r's class c
void grad_at(uint base, uint c, int lab, float mx, float se, float inv_m, bool ok) {
    float a = pc.f[0];
    precise float p = exp(z[base + c] - mx) / se;
    precise float q = (int(c) == lab ? 1.0 - a : 0.0) + a / float(pc.n);
    precise float g = (p - q) * inv_m;
    dz[base + c] = ok ? g : uintBitsToFloat(0x7fc00000u);
}

