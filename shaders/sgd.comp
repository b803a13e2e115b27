#version 450
// Fused SGD step (dpar_sgd_update), PyTorch SGD with dampening 0:
//   g = grad * clip + weight_decay * param
//   v = momentum * v + g;  u = nesterov ? g + momentum * v : v   (u = g without momentum)
//   param -= lr * u
// f0 = lr, f1 = momentum, f2 = weight_decay, f3 = clip; flags bit0 nesterov,
// bit1 momentum buffer present, bit2 guarded (opt_guard.glsl); p[0] the graph's id. n = count.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Param { float p[]; };
layout(std430, set = 0, binding = 1) buffer Mom { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer Grad { float gr[]; };
layout(push_constant) uniform PC {
    uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; float f4[4]; uint p[16];
} pc;
#include "opt_guard.glsl"
void main() {
    if (opt_skipped()) return;
    uint stride = gl_NumWorkGroups.x * 256u;
    bool nesterov = (pc.flags & 1u) != 0u, has_mom = (pc.flags & 2u) != 0u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        precise float w = p[i];
        precise float g = gr[i] * pc.f3 + pc.f2 * w;
        precise float u = g;
        if (has_mom) {
            precise float vv = pc.f1 * v[i] + g;
            v[i] = vv;
            u = nesterov ? g + pc.f1 * vv : vv;
        }
        precise float o = w - pc.f0 * u;
        p[i] = o;
    }
}
