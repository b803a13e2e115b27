#version 450
// y += alpha * x (dpar_axpy); alpha = f0, n = count.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer Src { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        precise float v = y[i] + pc.f0 * x[i];
        y[i] = v;
    }
}
