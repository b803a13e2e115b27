#version 450
// Fused AdamW step (dpar_adamw_update), as optax.adamw (formula at dpar_adamw_desc):
//   g = grad * clip;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   param -= lr ((m * c1) / (sqrt(v * c2) + eps) + weight_decay param),  c1 = 1/(1-b1^t), c2 = 1/(1-b2^t)
// f = { lr, b1, b2, eps, weight_decay, clip, c1, c2 }; n = count. Same operation order as the CPU loop.
// flags bit2 guarded, p[0] the graph's id: the index-check guard (opt_guard.glsl).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Param { float p[]; };
layout(std430, set = 0, binding = 1) buffer M1 { float m[]; };
layout(std430, set = 0, binding = 2) readonly buffer Grad { float gr[]; };
layout(std430, set = 0, binding = 3) buffer M2 { float v[]; };
layout(push_constant) uniform PC { uint n; uint mm; uint k; uint flags; float f[8]; uint p[16]; } pc;
#include "opt_guard.glsl"
void main() {
    if (opt_skipped()) return;
    uint stride = gl_NumWorkGroups.x * 256u;
    precise float ob1 = 1.0 - pc.f[1], ob2 = 1.0 - pc.f[2];
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        precise float g = gr[i] * pc.f[5];
        precise float mi = pc.f[1] * m[i] + ob1 * g;
        precise float vi = pc.f[2] * v[i] + ob2 * (g * g);
        m[i] = mi;
        v[i] = vi;
        precise float w = p[i];
        precise float u = (mi * pc.f[6]) / (sqrt(vi * pc.f[7]) + pc.f[3]) + pc.f[4] * w;
        precise float o = w - pc.f[0] * u;
        p[i] = o;
    }
}
