#version 450
// The first index out of range of dpar_embedding(_backward) (softmax_xent(_wide).comp check their labels
// themselves):
// one workgroup scans idx[0..n) for a value outside 0..m-1 that is not the ignore label
// (flags bit0 on, label p[0]). The lowest bad position is recorded in the device's error words
// (binding 0) unless an earlier op did so first: err = { 1, position, value, p[1] (the public
// function), m }. The backend reports it as an error at the next sync or read of the device.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Err { uint err[]; };
layout(std430, set = 0, binding = 3) readonly buffer Idx { int idx[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
shared uint best[256];
bool bad(uint i) {
    int v = idx[i];
    return (v < 0 || uint(v) >= pc.m) && !((pc.flags & 1u) != 0u && v == int(pc.p[0]));
}

void main() {
    uint t = gl_LocalInvocationID.x, b = 0xffffffffu;
    // rising i, four a turn (i, i+256, i+512, i+768: under llvmpipe's cap of 65,535 loop turns an
    // invocation at every n its buffers hold): the first bad one is this thread's lowest
    for (uint i = t; i < pc.n && b == 0xffffffffu; i += 1024u) {
        if (bad(i)) b = i;
        else if (pc.n - i > 256u && bad(i + 256u)) b = i + 256u;
        else if (pc.n - i > 512u && bad(i + 512u)) b = i + 512u;
        else if (pc.n - i > 768u && bad(i + 768u)) b = i + 768u;
    }
    best[t] = b;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) best[t] = min(best[t], best[t + s]);
        barrier();
    }
    if (t == 0u && best[0] != 0xffffffffu && err[0] == 0u) {
        err[1] = best[0];
        err[2] = uint(idx[best[0]]);
        err[3] = pc.p[1];
        err[4] = pc.m;
        err[0] = 1u;
    }
}
