#version 450
// Two parameters' SGD steps in one dispatch (dpar_sgd_step on a backend with sgd_pairs): sgd.comp's update
// of the first (bindings 0-2, n elements), then of the second (param 3, momentum 5, gradient 6, m elements),
// the same hyperparameters, flags and guard. Each a grid-stride loop over the workgroups the larger needs:
// at most 257 turns each (dpar__vk_flat_groups), far under llvmpipe's loop cap.
#extension GL_GOOGLE_include_directive : require
#include "sgd_common.glsl"
layout(std430, set = 0, binding = 3) buffer Param2 { float p2[]; };
layout(std430, set = 0, binding = 5) buffer Mom2 { float v2[]; };
layout(std430, set = 0, binding = 6) readonly buffer Grad2 { float gr2[]; };
void main() {
    if (opt_skipped()) return;
    SGD_LOOP(p, v, gr, pc.n)
    SGD_LOOP(p2, v2, gr2, pc.m)
}
