#version 450
// Unary ops (dpar_unary, dpar_unary_backward), one family: p[0] = dpar_unary_op,
// f0 = the scalar of the *_SCALAR forms. flags bit0 = 0: y = op(x);
// bit0 = 1: dx = dy * op'(x). n = count; in place allowed. Math in f32
// (the CPU reference computes in double; parity within 2e-5).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer Src { float x[]; };
layout(std430, set = 0, binding = 3) readonly buffer Dy { float dy[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;

const float GELU_K = 0.7978845608028654;
float tanh_s(float v) { // exp form: tanh() may give NaN for large |v| on some drivers
    float t = exp(-2.0 * abs(v));
    return sign(v) * (1.0 - t) / (1.0 + t);
}
float sigm(float v) { return 1.0 / (1.0 + exp(-v)); }
float erf_s(float v) { // Abramowitz & Stegun 7.1.26, |error| < 1.5e-7
    float a = abs(v), t = 1.0 / (1.0 + 0.3275911 * a);
    float q = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(v) * (1.0 - q * exp(-a * a));
}
// C's pow (the CPU reference's): GLSL's pow is undefined for v < 0 and for v == 0 with s <= 0 (llvmpipe
// gives NaN and 0); here a negative v with an integer s gives (-1)^s |v|^s, a non-integer one NaN, and
// 0 with a negative s infinity (the sign of a zero is not kept).
float pow_c(float v, float s) {
    if (s == 0.0) return 1.0;
    float a = abs(v);
    float r = a == 0.0 ? (s < 0.0 ? uintBitsToFloat(0x7f800000u) : 0.0) : pow(a, s);
    if (v < 0.0) {
        if (floor(s) != s) return uintBitsToFloat(0x7fc00000u);
        if (mod(abs(s), 2.0) == 1.0) r = -r;
    }
    return r;
}
float fwd(uint u, float v, float s) {
    switch (u) {
    case 0u: return -v;
    case 1u: return exp(v);
    case 2u: return log(v);
    case 3u: return sqrt(v);
    case 4u: return inversesqrt(v);
    case 5u: return tanh_s(v);
    case 6u: return sigm(v);
    case 7u: return 0.5 * v * (1.0 + tanh_s(GELU_K * (v + 0.044715 * v * v * v)));
    case 8u: return 0.5 * v * (1.0 + erf_s(v * 0.7071067811865476));
    case 9u: return v * sigm(v);
    case 10u: return v * v;
    case 11u: return v + s;
    case 12u: return v * s;
    case 13u: return s - v;
    case 14u: return v / s;
    case 15u: return s / v;
    default: return pow_c(v, s);
    }
}
float deriv(uint u, float v, float s) {
    switch (u) {
    case 0u: return -1.0;
    case 1u: return exp(v);
    case 2u: return 1.0 / v;
    case 3u: return 0.5 / sqrt(v);
    case 4u: return -0.5 * inversesqrt(v) / v;
    case 5u: { float t = tanh_s(v); return 1.0 - t * t; }
    case 6u: { float g = sigm(v); return g * (1.0 - g); }
    case 7u: {
        float t = tanh_s(GELU_K * (v + 0.044715 * v * v * v));
        return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * 0.044715 * v * v);
    }
    case 8u: return 0.5 * (1.0 + erf_s(v * 0.7071067811865476)) + v * exp(-0.5 * v * v) * 0.3989422804014327;
    case 9u: { float g = sigm(v); return g * (1.0 + v * (1.0 - g)); }
    case 10u: return 2.0 * v;
    case 11u: return 1.0;
    case 12u: return s;
    case 13u: return -1.0;
    case 14u: return 1.0 / s;
    case 15u: return -s / (v * v);
    default: return s == 0.0 ? 0.0 : s * pow_c(v, s - 1.0);
    }
}
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    bool bwd = (pc.flags & 1u) != 0u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride)
        y[i] = bwd ? dy[i] * deriv(pc.p[0], x[i], pc.f[0]) : fwd(pc.p[0], x[i], pc.f[0]);
}
