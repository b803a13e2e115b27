#version 450
// dx = dy where x > 0, else 0 (dpar_relu_backward). n = count. dx may alias dy.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float dx[]; };
layout(std430, set = 0, binding = 2) readonly buffer Dy { float dy[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride)
        dx[i] = x[i] > 0.0 ? dy[i] : 0.0;
}
