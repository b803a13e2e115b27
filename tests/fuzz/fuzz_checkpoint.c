/* libFuzzer harness: dpar_checkpoint_restore on arbitrary files.
   Input: one mode byte, then the file. Mode bit 0 makes the header's length
   field match the file, bit 1 makes the CRC-32 trailer valid (so the entry
   parser behind them is reached); bits 2-3 ask for 0..3 entries of a
   1-device CPU runtime (f32 [4] "a", i32 [2, 3] "b", padded f32 [8] "p").
   Every failure must carry an error text. Build: `make fuzz`. */
#define DPAR_IMPLEMENTATION
#include "../../dpar.h"
#include "../../util/dpar_train.h"

static dpar_runtime *g_rt;
static dpar_checkpoint_entry g_e[3];
static char g_dir[256], g_path[512];

static void fz_cleanup(void) {
    remove(g_path);
    rmdir(g_dir);
}

static void fz_init(void) {
    dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CPU, .num_devices = 1 };
    dpar_mesh_desc md = { .ndim = 1, .shape = { 1 }, .axis_names = { "data" } };
    dpar_array_desc ad[3] = { { .dtype = DPAR_F32, .ndim = 1, .shape = { 4 } },
                              { .dtype = DPAR_I32, .ndim = 2, .shape = { 2, 3 } },
                              { .dtype = DPAR_F32, .ndim = 1, .shape = { 8 } } };
    static const char *names[3] = { "a", "b", "p" };
    dpar_mesh *m = NULL;
    if (dpar_runtime_create(&rd, &g_rt) || dpar_mesh_create(g_rt, &md, &m)) abort();
    for (int i = 0; i < 3; i++) {
        g_e[i].name = names[i];
        g_e[i].padded = i == 2;
        if (dpar_array_create(m, &ad[i], &g_e[i].array)) abort();
    }
    /* tmpfs when there is one: each input is a file (30x more inputs a second than on disk) */
    const char *t = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/dpar_fuzz_ckpt_XXXXXX", t);
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_path, sizeof g_path, "%s/in.ckpt", g_dir);
    atexit(fz_cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_rt) fz_init();
    if (size < 1) return 0;
    unsigned mode = data[0];
    size_t n = size - 1;
    unsigned char *buf = (unsigned char *)malloc(n ? n : 1);
    if (!buf) return 0;
    memcpy(buf, data + 1, n);
    if ((mode & 1) && n >= 24)
        for (int i = 0; i < 8; i++) buf[16 + i] = (unsigned char)((uint64_t)n >> (8 * i));
    if ((mode & 2) && n >= 4) {
        uint32_t crc = dpar_crc32(0, buf, n - 4);
        for (int i = 0; i < 4; i++) buf[n - 4 + (size_t)i] = (unsigned char)(crc >> (8 * i));
    }
    FILE *f = fopen(g_path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) abort();
    free(buf);
    uint64_t step = 0;
    dpar_status s = dpar_checkpoint_restore(g_path, g_e, (int)((mode >> 2) & 3u), &step);
    if (s != DPAR_OK && !dpar_last_error()[0]) abort(); /* an error without a text */
    return 0;
}
