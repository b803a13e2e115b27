#version 450
// Fused SGD step (dpar_sgd_update), PyTorch SGD with dampening 0:
//   g = grad * clip + weight_decay * param
//   v = momentum * v + g;  u = nesterov ? g + momentum * v : v   (u = g without momentum)
//   param -= lr * u
// f0 = lr, f1 = momentum, f2 = weight_decay, f3 = clip; flags bit0 nesterov,
// bit1 momentum buffer present, bit2 guarded, bit3 the first update of a graph step. n = count.
// Guarded (the device has index-check error words, binding 4): while a label/index check's error is
// set, and until the host reports it, the update is skipped whole (bad input loses nothing); the
// step's first update counts the skipped step in err[5], which the graph takes off its step count.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Param { float p[]; };
layout(std430, set = 0, binding = 1) buffer Mom { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer Grad { float gr[]; };
layout(std430, set = 0, binding = 4) buffer Err { uint err[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
void main() {
    if ((pc.flags & 4u) != 0u && err[0] != 0u) {
        if ((pc.flags & 8u) != 0u && gl_GlobalInvocationID.x == 0u) err[5] += 1u;
        return;
    }
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
