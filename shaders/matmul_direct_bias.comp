#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_ballot : require
// matmul_direct.comp with the bias added to each row of the product (alpha 1, beta 0) and, with flags bit 7,
// the ReLU of the sum written to binding 1 too: a graph's matmul -> bias_add (-> relu) as one dispatch
// (dpar__g_fuse_matmul_bias). A shader of its own: the plain product's stores stay as they were (the same
// code in matmul_direct.comp measured 7-20% slower on the digits matmuls, bench/results/results.md).
#define MM_EPILOGUE
#include "matmul_direct.glsl"
