#version 450
// dst = cast(src) between f32 / f16 / bf16 / i32 (dpar_cast), n elements.
// flags: bits 0-7 source dtype, bits 8-15 destination dtype (0 f32, 1 f16,
// 2 bf16, 3 i32, as dpar_dtype). Buffers are bound as 32-bit words; 16-bit
// elements are packed little-endian, two per word, and each invocation writes
// one whole destination word (16-bit buffers are allocated in whole words).
// Conversions work on bits and round to nearest even exactly as the CPU's
// dpar_f32_to_f16 / dpar_f32_to_bf16; float -> i32 truncates toward zero,
// saturates, NaN -> 0.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Dst { uint dw[]; };
layout(std430, set = 0, binding = 2) readonly buffer Src { uint sw[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; } pc;

const uint F32 = 0u, F16 = 1u, BF16 = 2u, I32 = 3u;

uint f32_to_f16(uint x) {
    uint sign = (x >> 16) & 0x8000u;
    uint e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xffu) return sign | 0x7c00u | (m != 0u ? (0x200u | (m >> 13)) : 0u);
    int ee = int(e) - 127 + 15;
    if (ee >= 31) return sign | 0x7c00u;
    if (ee <= 0) {
        if (ee < -10) return sign;
        m |= 0x800000u;
        uint shift = uint(14 - ee);
        uint hf = 1u << (shift - 1u), rest = m & ((1u << shift) - 1u), r = m >> shift;
        if (rest > hf || (rest == hf && (r & 1u) != 0u)) r++;
        return sign | r;
    }
    uint r = (uint(ee) << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u) != 0u)) r++;
    return sign | r;
}
uint f16_to_f32(uint h) {
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return sign | 0x7f800000u | (m << 13);
    if (e == 0u) {
        if (m == 0u) return sign;
        int p = findMSB(m);                      // m * 2^-24, normalised
        return sign | (uint(p + 103) << 23) | ((m << uint(23 - p)) & 0x7fffffu);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}
uint f32_to_bf16(uint x) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return ((x >> 16) | 0x40u) & 0xffffu;
    x += 0x7fffu + ((x >> 16) & 1u);
    return x >> 16;
}
uint f32_to_i32(uint x) {
    float f = uintBitsToFloat(x);
    if (isnan(f)) return 0u;
    if (f >= 2147483648.0) return 0x7fffffffu;
    if (f <= -2147483648.0) return 0x80000000u;
    return uint(int(f));
}

// element i of the source, as f32 bits (i32 stays raw when src == I32)
uint load_raw(uint t, uint i) {
    if (t == F16 || t == BF16) { uint w = sw[i >> 1]; return (i & 1u) != 0u ? (w >> 16) : (w & 0xffffu); }
    return sw[i];
}
uint to_f32(uint t, uint v) {
    if (t == F16) return f16_to_f32(v);
    if (t == BF16) return v << 16;
    if (t == I32) return floatBitsToUint(float(int(v)));
    return v;
}
uint convert(uint st, uint dt, uint i) {
    uint v = load_raw(st, i);
    if (st == dt) return v;
    if (st == I32 && dt == I32) return v;
    uint f = to_f32(st, v);
    if (dt == F32) return f;
    if (dt == F16) return f32_to_f16(f);
    if (dt == BF16) return f32_to_bf16(f);
    return f32_to_i32(f);
}

void main() {
    uint st = pc.flags & 0xffu, dt = (pc.flags >> 8) & 0xffu;
    bool half_dst = dt == F16 || dt == BF16;
    uint words = half_dst ? (pc.n + 1u) / 2u : pc.n;
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint w = gl_GlobalInvocationID.x; w < words; w += stride) {
        if (half_dst) {
            uint i = 2u * w;
            uint lo = convert(st, dt, i);
            uint hi = i + 1u < pc.n ? convert(st, dt, i + 1u) : 0u;
            dw[w] = (lo & 0xffffu) | (hi << 16);
        } else {
            dw[w] = convert(st, dt, w);
        }
    }
}
