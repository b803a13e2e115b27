#version 450
// Mean squared error (dpar_mse): loss[0] = mean((pred - target)^2);
// dpred = 2 (pred - target) / n when flags bit0. One workgroup of 256 with a
// fixed summation order (deterministic).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Loss { float loss[]; };
layout(std430, set = 0, binding = 1) buffer Grad { float dpred[]; };
layout(std430, set = 0, binding = 2) readonly buffer Pred { float pred[]; };
layout(std430, set = 0, binding = 3) readonly buffer Target { float target[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;
shared float part[256];
// acc += (pred[i] - target[i])^2, and its gradient into dpred
void term(uint i, inout float acc, bool grad, float inv_n) {
    precise float d = pred[i] - target[i];
    precise float a = acc + d * d;
    acc = a;
    if (grad) { precise float g = 2.0 * d * inv_n; dpred[i] = g; }
}

void main() {
    uint t = gl_LocalInvocationID.x;
    bool grad = (pc.flags & 1u) != 0u;
    float inv_n = 1.0 / float(pc.n);
    precise float acc = 0.0;
    // elements i, i+256, i+512, i+768 a turn, in that order (the bits of one a turn): under llvmpipe's cap
    // of 65,535 loop turns an invocation at every n its buffers hold (as reduce.comp)
    for (uint i = t; i < pc.n; i += 1024u) {
        term(i, acc, grad, inv_n);
        if (pc.n - i > 256u) term(i + 256u, acc, grad, inv_n);
        if (pc.n - i > 512u) term(i + 512u, acc, grad, inv_n);
        if (pc.n - i > 768u) term(i + 768u, acc, grad, inv_n);
    }
    part[t] = acc;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) { precise float r = part[t] + part[t + s]; part[t] = r; }
        barrier();
    }
    if (t == 0u) { precise float l = part[0] / float(pc.n); loss[0] = pc.n == 0u ? 0.0 : l; }
}
