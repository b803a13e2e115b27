// Shared by matmul.comp and matmul_direct.comp: bindings, push constants, the operands' widening.
// A product with more workgroups than the device allows on x or y runs as several dispatches
// (dpar__vk_dispatch_mm): p[4], p[5] hold a dispatch's first workgroup on x and on y (0, 0 where one
// dispatch fits), p[6] the product's workgroups on y (matmul_direct.comp strides its column blocks by it).
// With MM_EPILOGUE defined (matmul.comp, matmul_direct_bias.comp) flags bit 6 (alpha 1, beta 0) adds
// bias[N] (binding 5) to each row of the product, rounded once as bias_add rounds it, and bit 7 writes the
// ReLU of that sum to binding 1 as well: a graph's matmul -> bias_add (-> relu) in one dispatch, the same
// bits (dpar__matmul, dpar__g_fuse_matmul_bias).
layout(std430, set = 0, binding = 0) buffer Dst { float c[]; };
#ifdef MM_EPILOGUE
layout(std430, set = 0, binding = 1) writeonly buffer Relu { float relu_out[]; };
layout(std430, set = 0, binding = 5) readonly buffer Bias { float bias[]; };
#endif
layout(std430, set = 0, binding = 2) readonly buffer SrcA { uint a[]; };
layout(std430, set = 0, binding = 3) readonly buffer SrcB { uint b[]; };
layout(push_constant) uniform PC {
    uint n; uint m; uint k; uint flags; float f0; float f1; float f2; float f3; float f4; float f5; float f6; float f7;
    uint p[16];
} pc;

float f16_to_f32(uint h) {            // exact, subnormals included
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
    if (e == 0u) {
        if (m == 0u) return uintBitsToFloat(sign);
        int p = findMSB(m);
        return uintBitsToFloat(sign | (uint(p + 103) << 23) | ((m << uint(23 - p)) & 0x7fffffu));
    }
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}
float widen(uint dt, uint w, uint idx) {
    if (dt == 0u) return uintBitsToFloat(w);
    uint h = (idx & 1u) != 0u ? (w >> 16) : (w & 0xffffu);
    return dt == 1u ? f16_to_f32(h) : uintBitsToFloat(h << 16);
}
uint offA = 0u, offB = 0u, offC = 0u;  // this batch's offsets (elements)

#ifdef MM_EPILOGUE
// bias_add.comp's ReLU: NaN propagates as relu.comp's
float relu_of(float v) {
    return (v > 0.0 || isnan(v)) ? v : 0.0;
}
#endif
