#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_ballot : require
// dpar_matmul and dpar_matmul_batched as in matmul.comp (operands, flags, batches, push constants),
// without shared memory or barriers: the host's choice on a CPU device (llvmpipe runs a workgroup as
// SIMD lanes on one thread and splits it at each barrier).
// Lanes run over rows only: a workgroup of 8 computes a 32x16 block of C, each invocation 4 rows
// (r0 + 8 i) by the block's 16 columns, so every lane needs the same elements of B: per k, 4 loads of
// A and 16 of B feed 64 products. With flags bit 5 (set by the host where the subgroup is the
// workgroup's 8 lanes, llvmpipe on 256-bit vectors) f32 operands take B as 2 loads a lane, columns
// c0 + l and c0 + 8 + l, each lane's value then broadcast to all: the 16 loads at addresses all lanes
// share cost llvmpipe more (fc1 of the digits step 300 -> 230 us, bench/results/results.md).
// The same sums over k in the same order, no fused multiply-add: bit for bit matmul.comp's result.
// Batch z of workgroup z and column block y of workgroup y, each strided by the count (the host gives
// a workgroup several column blocks; the column blocks by the product's count p[6], its dispatches
// offset by p[4], p[5]: matmul_common.glsl).
#include "matmul_direct.glsl"
