#version 450
// Fused SGD step (dpar_sgd_update), PyTorch SGD with dampening 0:
//   g = grad * clip + weight_decay * param
//   v = momentum * v + g;  u = nesterov ? g + momentum * v : v   (u = g without momentum)
//   param -= lr * u
// f0 = lr, f1 = momentum, f2 = weight_decay, f3 = clip; flags bit0 nesterov,
// bit1 momentum buffer present, bit2 guarded (opt_guard.glsl); p[0] the graph's id. n = count.
#extension GL_GOOGLE_include_directive : require
#include "sgd_common.glsl"
void main() {
    if (opt_skipped()) return;
    SGD_LOOP(p, v, gr, pc.n)
}
