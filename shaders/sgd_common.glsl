// Shared by sgd.comp and sgd_pair.comp: the bindings of a parameter, its momentum and its gradient, the push
// constants, the guard (opt_guard.glsl) and the update of one buffer, SGD_LOOP, a grid-stride loop.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Param { float p[]; };
layout(std430, set = 0, binding = 1) buffer Mom { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer Grad { float gr[]; };
layout(push_constant) uniform PC {
    uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; float f4[4]; uint p[16];
} pc;
#include "opt_guard.glsl"
// P, V, GR's first N elements (V unread without momentum)
#define SGD_LOOP(P, V, GR, N)                                                                            \
    {                                                                                                    \
        uint stride = gl_NumWorkGroups.x * 256u;                                                         \
        bool nesterov = (pc.flags & 1u) != 0u, has_mom = (pc.flags & 2u) != 0u;                          \
        for (uint i = gl_GlobalInvocationID.x; i < N; i += stride) {                                     \
            precise float w = P[i];                                                                      \
            precise float g = GR[i] * pc.f3 + pc.f2 * w;                                                 \
            precise float u = g;                                                                         \
            if (has_mom) {                                                                               \
                precise float vv = pc.f1 * V[i] + g;                                                     \
                V[i] = vv;                                                                               \
                u = nesterov ? g + pc.f1 * vv : vv;                                                      \
            }                                                                                            \
            precise float o = w - pc.f0 * u;                                                             \
            P[i] = o;                                                                                    \
        }                                                                                                \
    }
