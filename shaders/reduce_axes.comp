#version 450
// Reduction along axes and the binary gradients (dpar_reduce, dpar_binary_backward):
// y[o] = fold over the dims in mask p[13] of the dense 4-d x (shape p[0..3]);
// o runs over the kept dims in row-major order. kind p[12]: 0 sum, 1 mean, 2 max
// (NaN propagates), 3 argmax (i32: flat index over the reduced dims of the first
// maximum / first NaN), 4 -sum(dy), 5 sum(dy b), 6 sum(dy a), 7 sum(dy / b),
// 8 sum(-dy a / b^2), with a, b at strides p[4..7], p[8..11]; 9 the max backward:
// y is dx (x's shape), slice o gets a[o] (dy) at its first maximum, 0 elsewhere.
// One invocation per output, summing in order (f32): deterministic.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { uint y[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 3) readonly buffer A { float a[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u, mask = pc.p[13], kind = pc.p[12];
    uint xs[4], R = 1u;
    xs[3] = 1u;
    for (int d = 2; d >= 0; d--) xs[d] = xs[d + 1] * pc.p[d + 1];
    for (int d = 0; d < 4; d++) R *= ((mask >> d) & 1u) != 0u ? pc.p[d] : 1u;
    for (uint o = gl_GlobalInvocationID.x; o < pc.n; o += stride) {
        uint c[4], rem = o;
        for (int d = 3; d >= 0; d--) {
            c[d] = 0u;
            if (((mask >> d) & 1u) == 0u) { c[d] = rem % pc.p[d]; rem /= pc.p[d]; }
        }
        precise float acc = 0.0;
        int best = -1;
        for (uint r = 0u; r < R; r++) {
            rem = r;
            for (int d = 3; d >= 0; d--)
                if (((mask >> d) & 1u) != 0u) { c[d] = rem % pc.p[d]; rem /= pc.p[d]; }
            uint xo = 0u, ao = 0u, bo = 0u;
            for (int d = 0; d < 4; d++) { xo += c[d] * xs[d]; ao += c[d] * pc.p[4 + d]; bo += c[d] * pc.p[8 + d]; }
            float v = x[xo];
            switch (kind) {
            case 0u: case 1u: acc += v; break;
            case 2u: case 3u: case 9u:
                if (best < 0 || v > acc || (isnan(v) && !isnan(acc))) { acc = v; best = int(r); }
                break;
            case 4u: acc -= v; break;
            case 5u: acc += v * b[bo]; break;
            case 6u: acc += v * a[ao]; break;
            case 7u: acc += v / b[bo]; break;
            default: { float bb = b[bo]; acc += -v * a[ao] / (bb * bb); break; }
            }
        }
        if (kind == 9u) {
            for (uint r = 0u; r < R; r++) {
                rem = r;
                for (int d = 3; d >= 0; d--)
                    if (((mask >> d) & 1u) != 0u) { c[d] = rem % pc.p[d]; rem /= pc.p[d]; }
                uint xo = 0u;
                for (int d = 0; d < 4; d++) xo += c[d] * xs[d];
                y[xo] = floatBitsToUint(int(r) == best ? a[o] : 0.0);
            }
        } else if (kind == 3u) y[o] = uint(best);
        else y[o] = floatBitsToUint(kind == 1u ? acc / float(R) : acc);
    }
}
