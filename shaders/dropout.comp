#version 450
// Dropout (dpar_dropout) with Philox-4x32-10: element e uses word e % 4 of
// philox(counter (e / 4, p[4] stream, p[2] step lo, p[3] step hi), key (p[0], p[1]) seed)
// and is kept when word >> 8 >= p[5]; y = kept ? x * f[0] : 0. n = count. x may alias y.
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(push_constant) uniform PC { uint n; uint m; uint k; uint flags; float f[8]; uint p[16]; } pc;
uvec4 philox(uvec4 c, uvec2 key) {
    for (int r = 0; r < 10; r++) {
        uint h0, l0, h1, l1;
        umulExtended(0xD2511F53u, c.x, h0, l0);
        umulExtended(0xCD9E8D57u, c.z, h1, l1);
        c = uvec4(h1 ^ c.y ^ key.x, l1, h0 ^ c.w ^ key.y, l0);
        key += uvec2(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}
void main() {
    uint stride = gl_NumWorkGroups.x * 256u, blocks = (pc.n + 3u) / 4u;
    for (uint b = gl_GlobalInvocationID.x; b < blocks; b += stride) {
        uvec4 w = philox(uvec4(b, pc.p[4], pc.p[2], pc.p[3]), uvec2(pc.p[0], pc.p[1]));
        for (uint j = 0u; j < 4u; j++) {
            uint e = b * 4u + j;
            if (e >= pc.n) break;
            precise float o = x[e] * pc.f[0];
            y[e] = (w[j] >> 8) >= pc.p[5] ? o : 0.0;
        }
    }
}
