/* Run by tests/test_cuda_mock.sh against the mock driver: dpar_k_cast between f32 and f16 / bf16 launched
   directly (the driver API), at every start offset of source and destination within 16 bytes, so that the
   word paths and the scalar path both run (cuMemAlloc's pointers, the only ones dpar passes, are always
   aligned), over lengths that leave every tail, on the backend's grid and on a single block (several grid
   strides a thread). Every element equals dpar.h's host conversion bit for bit, and the bytes around the
   destination keep their fill. Prints one "cast offsets:" line and exits 0, else names the first mismatch. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpar.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned flags);
CUresult cuDeviceGet(int *d, int i);
CUresult cuDevicePrimaryCtxRetain(void **c, int d);
CUresult cuCtxSetCurrent(void *c);
CUresult cuStreamCreate(void **s, unsigned f);
CUresult cuStreamSynchronize(void *s);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s);
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s);
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *opts, void **vals);
CUresult cuModuleGetFunction(void **f, void *m, const char *name);
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *s, void **args, void **extra);

enum { MAXN = 4099, PAD = 8, BYTES = (MAXN + 2 * PAD) * 4 };
static void *g_stream, *g_cast;
static CUdeviceptr g_src, g_dst;

static int check(CUresult r, const char *call) {
    if (r) fprintf(stderr, "cast offsets: %s: error %d\n", call, r);
    return r != 0;
}
/* dst[doff..doff+n) = cast(src[soff..soff+n)) on `grid` blocks of 256, `out` the destination's bytes */
static int launch(int dt, int st, int soff, int doff, int64_t n, unsigned grid, const void *in, uint8_t *out) {
    int ss = st == DPAR_F32 ? 4 : 2, ds = dt == DPAR_F32 ? 4 : 2;
    CUdeviceptr s = g_src + (CUdeviceptr)(soff * ss), d = g_dst + (CUdeviceptr)(doff * ds);
    void *args[] = { &d, &dt, &s, &st, &n };
    memset(out, 0xab, BYTES);
    return check(cuMemcpyHtoDAsync_v2(g_src, in, BYTES, g_stream), "cuMemcpyHtoDAsync") ||
           check(cuMemcpyHtoDAsync_v2(g_dst, out, BYTES, g_stream), "cuMemcpyHtoDAsync") ||
           check(cuLaunchKernel(g_cast, grid, 1, 1, 256, 1, 1, 0, g_stream, args, NULL), "cuLaunchKernel") ||
           check(cuMemcpyDtoHAsync_v2(out, g_dst, BYTES, g_stream), "cuMemcpyDtoHAsync") ||
           check(cuStreamSynchronize(g_stream), "cuStreamSynchronize");
}
/* the cast's bytes at doff, the fill (0xab) elsewhere */
static int compare(const uint8_t *got, const uint8_t *want, int ds, int doff, int64_t n, const char *what) {
    for (int64_t b = 0; b < BYTES; b++) {
        int64_t e = b / ds - doff;
        uint8_t w = e >= 0 && e < n ? want[e * ds + b % ds] : 0xab;
        if (got[b] != w) {
            fprintf(stderr, "cast offsets: %s: byte %lld (element %lld of %lld): 0x%02x, want 0x%02x\n", what,
                    (long long)b, (long long)e, (long long)n, got[b], w);
            return 1;
        }
    }
    return 0;
}

int main(void) {
    static const int64_t lens[] = { 1, 2, 3, 4, 5, 7, 8, 9, 12, 17, 255, 1030, MAXN };
    static uint8_t got[BYTES], want[BYTES];
    static uint32_t wide[MAXN + 2 * PAD];
    static uint16_t half[2 * (MAXN + 2 * PAD)];
    static const char ptx[] = ".visible .entry dpar_k_cast";
    void *ctx, *mod;
    int dev, runs = 0;
    if (check(cuInit(0), "cuInit") || check(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
        check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
        check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent") || check(cuStreamCreate(&g_stream, 0), "cuStreamCreate") ||
        check(cuModuleLoadDataEx(&mod, ptx, 0, NULL, NULL), "cuModuleLoadDataEx") ||
        check(cuModuleGetFunction(&g_cast, mod, "dpar_k_cast"), "cuModuleGetFunction") ||
        check(cuMemAlloc_v2(&g_src, BYTES), "cuMemAlloc") || check(cuMemAlloc_v2(&g_dst, BYTES), "cuMemAlloc"))
        return 1;
    uint32_t x = 2463534242u;
    for (int i = 0; i < MAXN + 2 * PAD; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5; /* xorshift32: NaNs, infinities, subnormals among them */
        wide[i] = x;
    }
    for (int i = 0; i < 2 * (MAXN + 2 * PAD); i++) half[i] = (uint16_t)((uint32_t)i * 40503u + 7u);
    for (int h = DPAR_F16; h <= DPAR_BF16; h++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (int soff = 0; soff < PAD; soff++)
                for (int doff = 0; doff < PAD; doff++)
                    for (int g = 0; g < 2; g++) {
                        int64_t n = lens[l];
                        unsigned grid = g ? 1u : (unsigned)((n + 2047) / 2048);
                        char what[96];
                        snprintf(what, sizeof what, "%s -> f32, source +%d, destination +%d, %u block(s)",
                                 dpar_dtype_name((dpar_dtype)h), soff, doff, grid);
                        for (int64_t i = 0; i < n; i++) {
                            float w =
                                h == DPAR_F16 ? dpar_f16_to_f32(half[soff + i]) : dpar_bf16_to_f32(half[soff + i]);
                            memcpy(want + i * 4, &w, 4);
                        }
                        if (launch(DPAR_F32, h, soff, doff, n, grid, half, got) || compare(got, want, 4, doff, n, what))
                            return 1;
                        snprintf(what, sizeof what, "f32 -> %s, source +%d, destination +%d, %u block(s)",
                                 dpar_dtype_name((dpar_dtype)h), soff, doff, grid);
                        for (int64_t i = 0; i < n; i++) {
                            float f;
                            memcpy(&f, &wide[soff + i], 4);
                            uint16_t w = h == DPAR_F16 ? dpar_f32_to_f16(f) : dpar_f32_to_bf16(f);
                            memcpy(want + i * 2, &w, 2);
                        }
                        if (launch(h, DPAR_F32, soff, doff, n, grid, wide, got) || compare(got, want, 2, doff, n, what))
                            return 1;
                        runs += 2;
                    }
    if (check(cuMemFree_v2(g_src), "cuMemFree") || check(cuMemFree_v2(g_dst), "cuMemFree")) return 1;
    printf("cast offsets: %d casts (f16 and bf16, both ways, offsets 0..7 elements each side, 13 lengths, 2 grids) "
           "equal the host conversions bit for bit\n",
           runs);
    return 0;
}
