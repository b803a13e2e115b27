/* Checkpoints: round trip of replicated and sharded arrays, restore onto a
   different mesh (4 devices saved, 2 restored), ZeRO-1 padded state,
   corruption cases (truncated, flipped byte, wrong version, bad magic),
   atomic write, and training resumed from a checkpoint bit for bit.
   Untrusted files, one test per kind: an entry count the file cannot hold,
   count x dtype size overflow, duplicate names, unknown flags, /dev/zero and
   a FIFO, and 2 threads x 25 saves to one path. */
#include "testutil.h"
#include "util/dpar_train.h"
#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];
static const char *tpath(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}
static int setup(void **st) {
    (void)st;
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/dpar_ckpt_test_XXXXXX", t ? t : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}
static int teardown(void **st) {
    (void)st;
    return t_remove_tree(g_dir);
}
static dpar_array *arr(dpar_mesh *m, dpar_dtype t, int nd, int64_t d0, int64_t d1, const char *s0, const char *s1) {
    dpar_array_desc d = { .dtype = t, .ndim = nd, .shape = { d0, d1 }, .spec = { s0, s1 } };
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &d, &a));
    return a;
}
static long file_size(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}
static unsigned char *slurp(const char *p, long *n) {
    *n = file_size(p);
    unsigned char *b = malloc((size_t)*n);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}
static void spit(const char *p, const unsigned char *b, long n) {
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
}

static int count_tmp_files(void) { /* "<name>.tmp.*" left in the test folder */
    int k = 0;
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));) k += strstr(de->d_name, ".tmp.") != NULL;
    closedir(d);
    return k;
}

static void test_crc32(void **st) {
    (void)st;
    assert_int_equal(dpar_crc32(0, "123456789", 9), 0xCBF43926u); /* the CRC-32 check value */
    assert_int_equal(dpar_crc32(0, "", 0), 0u);
    uint32_t c = dpar_crc32(0, "12345", 5);
    assert_int_equal(dpar_crc32(c, "6789", 4), 0xCBF43926u); /* chainable */
}

/* Saved from a 4-device mesh (replicated, rows split, columns split over a 2x2
   mesh, i32 and bf16), restored on a 2-device runtime with other specs. */
static void test_roundtrip_other_mesh(void **st) {
    (void)st;
    float w[8 * 6], b[6], w2[8 * 6], b2[6];
    int32_t ids[8], ids2[8];
    uint16_t hb[8], hb2[8];
    for (int i = 0; i < 48; i++) w[i] = (float)i * 0.37f - 3.0f;
    for (int i = 0; i < 6; i++) b[i] = -(float)i;
    for (int i = 0; i < 8; i++) {
        ids[i] = i * i - 9;
        hb[i] = dpar_f32_to_bf16((float)i / 3.0f);
    }
    const char *path = tpath("rt.ckpt");
    {
        dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
        const int sh[2] = { 2, 2 };
        const char *nm[2] = { "data", "model" };
        dpar_mesh *m = t_mesh(rt, 2, sh, nm);
        dpar_array *aw = arr(m, DPAR_F32, 2, 8, 6, "data,model", NULL), *ab = arr(m, DPAR_F32, 1, 6, 0, NULL, NULL);
        dpar_array *ai = arr(m, DPAR_I32, 1, 8, 0, "model", NULL), *ah = arr(m, DPAR_BF16, 2, 4, 2, "data", "model");
        T_OK(dpar_array_put(aw, w));
        T_OK(dpar_array_put(ab, b));
        T_OK(dpar_array_put(ai, ids));
        T_OK(dpar_array_put(ah, hb));
        dpar_checkpoint_entry e[4] = {
            { "w", aw, false }, { "b", ab, false }, { "ids", ai, false }, { "half", ah, false }
        };
        T_OK(dpar_checkpoint_save(path, e, 4, 1234));
        dpar_runtime_destroy(rt);
    }
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *aw = arr(m, DPAR_F32, 2, 8, 6, NULL, "data"), *ab = arr(m, DPAR_F32, 1, 6, 0, "data", NULL);
    dpar_array *ai = arr(m, DPAR_I32, 1, 8, 0, NULL, NULL), *ah = arr(m, DPAR_BF16, 2, 4, 2, NULL, "data");
    dpar_checkpoint_entry e[4] = {
        { "b", ab, false }, { "w", aw, false }, { "half", ah, false }, { "ids", ai, false }
    };
    uint64_t step = 0;
    T_OK(dpar_checkpoint_restore(path, e, 4, &step));
    assert_int_equal(step, 1234);
    T_OK(dpar_array_get(aw, w2));
    T_OK(dpar_array_get(ab, b2));
    T_OK(dpar_array_get(ai, ids2));
    T_OK(dpar_array_get(ah, hb2));
    assert_memory_equal(w, w2, sizeof w);
    assert_memory_equal(b, b2, sizeof b);
    assert_memory_equal(ids, ids2, sizeof ids);
    assert_memory_equal(hb, hb2, sizeof hb);
    /* a subset may be restored; a missing name or a wrong shape/dtype is an error and changes nothing */
    T_OK(dpar_checkpoint_restore(path, e, 1, NULL));
    dpar_array *wrong = arr(m, DPAR_F32, 2, 6, 8, NULL, NULL), *wrongt = arr(m, DPAR_I32, 1, 6, 0, NULL, NULL);
    dpar_checkpoint_entry bad[2] = { { "b", ab, false }, { "w", wrong, false } };
    T_OK(dpar_array_put(ab, w)); /* sentinel */
    T_ERR(dpar_checkpoint_restore(path, bad, 2, NULL), DPAR_ERR_SHAPE, "'w'", "[8, 6]", "[6, 8]");
    T_OK(dpar_array_get(ab, b2));
    assert_memory_equal(b2, w, sizeof b2); /* "b" untouched: nothing is restored when one entry fails */
    bad[1].name = "b";
    bad[1].array = wrongt;
    T_ERR(dpar_checkpoint_restore(path, bad + 1, 1, NULL), DPAR_ERR_DTYPE, "f32", "i32");
    bad[1].name = "nope";
    T_ERR(dpar_checkpoint_restore(path, bad + 1, 1, NULL), DPAR_ERR_INVALID_ARGUMENT, "nope");
    dpar_checkpoint_entry dup[2] = { { "b", ab, false }, { "b", aw, false } };
    T_ERR(dpar_checkpoint_save(path, dup, 2, 0), DPAR_ERR_INVALID_ARGUMENT, "both named 'b'");
    dpar_runtime_destroy(rt);
}

static void put_le32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static void test_corruption(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *a = arr(m, DPAR_F32, 2, 4, 4, "data", NULL);
    float x[16], y[16], keep[16];
    for (int i = 0; i < 16; i++) {
        x[i] = (float)i;
        keep[i] = 100.0f + (float)i;
    }
    T_OK(dpar_array_put(a, x));
    dpar_checkpoint_entry e[1] = { { "a", a, false } };
    const char *path = tpath("c.ckpt"), *bad = tpath("bad.ckpt");
    T_OK(dpar_checkpoint_save(path, e, 1, 7));
    long n;
    unsigned char *img = slurp(path, &n);
    T_OK(dpar_array_put(a, keep));
    /* truncated */
    spit(bad, img, n - 10);
    T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "truncated", "bad.ckpt");
    spit(bad, img, 20);
    T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "truncated");
    spit(bad, img, 0);
    T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "not a dpar checkpoint");
    /* a flipped byte anywhere in the data or the entry header */
    for (long at = 32; at < n; at += 7) {
        img[at] ^= 0x10;
        spit(bad, img, n);
        T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "bad.ckpt");
        if (at < n - 4 && !strstr(dpar_last_error(), "CRC-32")) fail_msg("flip at %ld: %s", at, dpar_last_error());
        img[at] ^= 0x10;
    }
    /* a flipped byte in each header field: corrupt, naming the field, the value read and the one expected
       (a flip at 16 or 20, the file bytes, was called "truncated") */
    static const struct {
        int at;
        const char *field, *got, *want;
    } hf[] = { { 0, "'magic'", "\"TPARCKPT\"", "\"DPARCKPT\"" },
               { 5, "'magic'", "\"DPARC[PT\"", "\"DPARCKPT\"" },
               { 8, "'format version'", "reads 17", "should be 1" },
               { 11, "'format version'", "reads 268435457", "should be 1" },
               { 12, "'entry count'", "reads 17", "should be 1" },
               { 14, "'entry count'", "reads 1048577", "should be 1" },
               { 16, "'file bytes'", "reads ", "should be " },
               { 20, "'file bytes'", "reads 68719476", "should be " },
               { 23, "'file bytes'", "reads 115292150460684", "should be " },
               { 24, "CRC-32", "corrupted", "corrupted" } }; /* the step: any value is valid, the CRC-32 fails */
    for (size_t k = 0; k < sizeof hf / sizeof hf[0]; k++) {
        img[hf[k].at] ^= 0x10;
        spit(bad, img, n);
        T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "bad.ckpt", "corrupted", hf[k].field, hf[k].got,
              hf[k].want);
        if (strstr(dpar_last_error(), "truncated")) fail_msg("flip at %d: %s", hf[k].at, dpar_last_error());
        img[hf[k].at] ^= 0x10;
    }
    char size_text[32];
    snprintf(size_text, sizeof size_text, "should be %ld", n);
    img[16] ^= 0x10;
    spit(bad, img, n);
    T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "'file bytes' (offset 16)", size_text);
    img[16] ^= 0x10;
    /* another format version (its CRC-32 right): named as such */
    img[8] = 2;
    put_le32(img + n - 4, dpar_crc32(0, img, (size_t)n - 4));
    spit(bad, img, n);
    T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "version 2", "version 1");
    img[8] = 1;
    put_le32(img + n - 4, dpar_crc32(0, img, (size_t)n - 4));
    /* not a checkpoint at all, trailing data */
    static const char csv[] = "name,value\n1,2\n3,4\n5,6\n7,8\n9,10\n11,12\n13,14\n";
    spit(bad, (const unsigned char *)csv, (long)sizeof csv - 1); /* its length, not a count by hand */
    T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "not a dpar checkpoint");
    unsigned char *longer = calloc((size_t)n + 3, 1);
    memcpy(longer, img, (size_t)n);
    spit(bad, longer, n + 3);
    T_ERR(dpar_checkpoint_restore(bad, e, 1, NULL), DPAR_ERR_IO, "trailing");
    free(longer);
    T_ERR(dpar_checkpoint_restore(tpath("missing.ckpt"), e, 1, NULL), DPAR_ERR_IO, "missing.ckpt", "No such file");
    /* nothing of the above changed the array */
    T_OK(dpar_array_get(a, y));
    assert_memory_equal(y, keep, sizeof y);
    /* the intact image still restores */
    spit(bad, img, n);
    T_OK(dpar_checkpoint_restore(bad, e, 1, NULL));
    T_OK(dpar_array_get(a, y));
    assert_memory_equal(y, x, sizeof y);
    free(img);
    dpar_runtime_destroy(rt);
}

/* atomic write: no temporary is left, an existing checkpoint is replaced
   whole, and a failed save leaves the old file untouched. */
static void test_atomic_write(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array *a = arr(m, DPAR_F32, 1, 8, 0, "data", NULL), *big = arr(m, DPAR_F32, 1, 64, 0, NULL, NULL);
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    T_OK(dpar_array_put(a, x));
    T_OK(dpar_array_put(big, x));
    const char *path = tpath("a.ckpt");
    dpar_checkpoint_entry e[2] = { { "a", a, false }, { "big", big, false } };
    T_OK(dpar_checkpoint_save(path, e, 2, 1));
    long n1 = file_size(path);
    T_OK(dpar_checkpoint_save(path, e, 1, 2));
    long n2 = file_size(path);
    assert_true(n2 > 0 && n2 < n1);
    assert_int_equal(count_tmp_files(), 0);
    uint64_t step = 0;
    T_OK(dpar_checkpoint_restore(path, e, 1, &step));
    assert_int_equal(step, 2);
    /* a save that cannot be written: clear error, old file intact */
    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.ckpt", g_dir);
    T_ERR(dpar_checkpoint_save(nodir, e, 1, 3), DPAR_ERR_IO, "no/such/dir", "No such file");
    assert_int_equal(file_size(path), n2);
    T_ERR(dpar_checkpoint_save(NULL, e, 1, 0), DPAR_ERR_INVALID_ARGUMENT, "path");
    dpar_runtime_destroy(rt);
}

/* Training resumed from a checkpoint: a 2-layer regression trained with
   ZeRO-1 (padded state) on 4 devices for 6 steps vs. 3 steps, save,
   3 more steps from fresh state restored from the file: the same losses bit
   for bit. Then the same checkpoint restores onto 2 devices (other padding). */
enum { NP = 2, IN = 6, OUT = 3, B = 8 };
typedef struct {
    dpar_array *w[NP], *g[NP], *x, *y, *pred, *dpred, *loss;
    dpar_zero1 *z;
    int step;
} reg;
static dpar_status reg_step(dpar_ctx *ctx, void *user) {
    reg *r = (reg *)user;
    int dev = dpar_ctx_device(ctx);
    dpar_buffer *w = dpar_array_shard(r->w[0], dev), *b = dpar_array_shard(r->w[1], dev);
    dpar_buffer *gw = dpar_array_shard(r->g[0], dev), *gb = dpar_array_shard(r->g[1], dev);
    dpar_buffer *x = dpar_array_shard(r->x, dev), *y = dpar_array_shard(r->y, dev);
    dpar_buffer *pred = dpar_array_shard(r->pred, dev), *dpred = dpar_array_shard(r->dpred, dev),
                *loss = dpar_array_shard(r->loss, dev);
    dpar_status s;
    if ((s = dpar_matmul(pred, x, w, false, false, 1.0f, 0.0f)) || (s = dpar_bias_add(pred, b)) ||
        (s = dpar_mse(loss, dpred, pred, y)) || (s = dpar_matmul(gw, x, dpred, true, false, 1.0f, 0.0f)) ||
        (s = dpar_bias_grad(gb, dpred, 0.0f)) || (s = dpar_pmean(ctx, loss, loss, "data")))
        return s;
    dpar_buffer *g[NP] = { gw, gb };
    return dpar_zero1_step(ctx, r->z, g);
}
static void reg_make(dpar_mesh *m, int ndev, reg *r) {
    memset(r, 0, sizeof *r);
    r->w[0] = arr(m, DPAR_F32, 2, IN, OUT, NULL, NULL);
    r->w[1] = arr(m, DPAR_F32, 1, OUT, 0, NULL, NULL);
    r->g[0] = arr(m, DPAR_F32, 2, IN, OUT, NULL, NULL);
    r->g[1] = arr(m, DPAR_F32, 1, OUT, 0, NULL, NULL);
    r->x = arr(m, DPAR_F32, 2, B, IN, "data", NULL);
    r->y = arr(m, DPAR_F32, 2, B, OUT, "data", NULL);
    r->pred = arr(m, DPAR_F32, 2, B, OUT, "data", NULL);
    r->dpred = arr(m, DPAR_F32, 2, B, OUT, "data", NULL);
    r->loss = arr(m, DPAR_F32, 1, ndev, 0, "data", NULL);
    float w0[IN * OUT];
    for (int i = 0; i < IN * OUT; i++) w0[i] = sinf((float)i);
    T_OK(dpar_array_put(r->w[0], w0));
    dpar_zero1_desc zd = { .sgd.learning_rate = 0.05f,
                           .sgd.momentum = 0.9f,
                           .sgd.nesterov = true,
                           .sgd.weight_decay = 1e-3f,
                           .num_params = NP,
                           .params = { r->w[0], r->w[1] } };
    T_OK(dpar_zero1_create(&zd, &r->z));
}
static float reg_run(dpar_mesh *m, reg *r, int ndev) {
    float x[B * IN], y[B * OUT], l[8];
    for (int i = 0; i < B * IN; i++) x[i] = cosf((float)(i * 7 + r->step));
    for (int i = 0; i < B * OUT; i++) y[i] = sinf((float)(i * 3 + r->step * 2));
    T_OK(dpar_array_put(r->x, x));
    T_OK(dpar_array_put(r->y, y));
    dpar_shard_map_desc d = { .fn = reg_step, .user = r };
    T_OK(dpar_shard_map(m, &d));
    T_OK(dpar_array_get(r->loss, l));
    (void)ndev;
    r->step++;
    return l[0];
}
static int reg_entries(reg *r, dpar_checkpoint_entry *e) {
    static const char *names[] = { "w", "b", "w.master", "b.master", "w.mom", "b.mom" };
    for (int i = 0; i < NP; i++) {
        e[i].name = names[i];
        e[i].array = r->w[i];
        e[i].padded = false;
        e[2 + i].name = names[2 + i];
        e[2 + i].array = dpar_zero1_master(r->z, i);
        e[2 + i].padded = true;
        e[4 + i].name = names[4 + i];
        e[4 + i].array = dpar_zero1_momentum(r->z, i);
        e[4 + i].padded = true;
    }
    return 3 * NP;
}
static void test_resume_bitwise(void **st) {
    (void)st;
    const char *path = tpath("resume.ckpt");
    float full[6], resumed[6];
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    reg r;
    reg_make(m, 4, &r);
    assert_int_equal(dpar_zero1_padded_count(r.z, 1), 4); /* 3 -> 4 on 4 devices */
    for (int i = 0; i < 6; i++) full[i] = reg_run(m, &r, 4);
    dpar_zero1_destroy(r.z);
    reg_make(m, 4, &r);
    for (int i = 0; i < 3; i++) resumed[i] = reg_run(m, &r, 4);
    dpar_checkpoint_entry e[3 * NP];
    int n = reg_entries(&r, e);
    T_OK(dpar_checkpoint_save(path, e, n, 3));
    dpar_zero1_destroy(r.z);
    /* fresh state, different initial values */
    reg_make(m, 4, &r);
    n = reg_entries(&r, e);
    uint64_t step;
    T_OK(dpar_checkpoint_restore(path, e, n, &step));
    r.step = (int)step;
    for (int i = 3; i < 6; i++) resumed[i] = reg_run(m, &r, 4);
    for (int i = 0; i < 6; i++)
        if (memcmp(&full[i], &resumed[i], 4))
            fail_msg("step %d: uninterrupted loss %.9g, resumed %.9g", i, (double)full[i], (double)resumed[i]);
    dpar_zero1_destroy(r.z);
    dpar_runtime_destroy(rt);

    /* the 4-device checkpoint onto 2 devices: padded state of another length */
    rt = t_runtime(DPAR_BACKEND_CPU, 2);
    m = t_mesh1(rt, 2, "data");
    reg_make(m, 2, &r);
    assert_int_equal(dpar_zero1_padded_count(r.z, 1), 4); /* 3 -> 4 on 2 devices too */
    assert_int_equal(dpar_zero1_padded_count(r.z, 0), 18);
    n = reg_entries(&r, e);
    T_OK(dpar_checkpoint_restore(path, e, n, &step));
    r.step = (int)step;
    float wb[IN * OUT], mom[20];
    T_OK(dpar_array_get(r.w[0], wb));
    T_OK(dpar_array_get(dpar_zero1_momentum(r.z, 1), mom));
    assert_true(mom[3] == 0.0f);
    /* the loss of the next step on 2 devices is close to the 4-device one (same global batch) */
    float l = reg_run(m, &r, 2);
    assert_true(fabsf(l - full[3]) <= 1e-5f * fabsf(full[3]) + 1e-7f);
    dpar_zero1_destroy(r.z);
    dpar_runtime_destroy(rt);
}

/* padded entries: a longer stored array is accepted only if the tail is zero */
static void test_padded_rule(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    dpar_array *l12 = arr(m, DPAR_F32, 1, 12, 0, "data", NULL), *l10 = arr(m, DPAR_F32, 1, 10, 0, NULL, NULL);
    float x[12], y[12];
    for (int i = 0; i < 12; i++) x[i] = i < 10 ? (float)i + 1 : 0.0f;
    T_OK(dpar_array_put(l12, x));
    const char *path = tpath("pad.ckpt");
    dpar_checkpoint_entry e[1] = { { "v", l12, true } };
    T_OK(dpar_checkpoint_save(path, e, 1, 0));
    dpar_checkpoint_entry r[1] = { { "v", l10, true } };
    T_OK(dpar_checkpoint_restore(path, r, 1, NULL));
    T_OK(dpar_array_get(l10, y));
    assert_memory_equal(x, y, 10 * sizeof(float));
    r[0].padded = false;
    T_ERR(dpar_checkpoint_restore(path, r, 1, NULL), DPAR_ERR_SHAPE, "[12]", "[10]");
    x[11] = 5.0f;
    T_OK(dpar_array_put(l12, x));
    T_OK(dpar_checkpoint_save(path, e, 1, 0));
    r[0].padded = true;
    T_ERR(dpar_checkpoint_restore(path, r, 1, NULL), DPAR_ERR_SHAPE, "not zero padding");
    /* shorter stored array into a longer one: zero-extended */
    T_OK(dpar_array_put(l10, x));
    dpar_checkpoint_entry s10[1] = { { "v", l10, true } };
    T_OK(dpar_checkpoint_save(path, s10, 1, 0));
    dpar_checkpoint_entry r12[1] = { { "v", l12, true } };
    T_OK(dpar_checkpoint_restore(path, r12, 1, NULL));
    T_OK(dpar_array_get(l12, y));
    assert_memory_equal(x, y, 10 * sizeof(float));
    assert_true(y[10] == 0.0f && y[11] == 0.0f);
    dpar_array *two = arr(m, DPAR_F32, 2, 4, 3, NULL, NULL);
    dpar_checkpoint_entry bad[1] = { { "v", two, true } };
    T_ERR(dpar_checkpoint_restore(path, bad, 1, NULL), DPAR_ERR_INVALID_ARGUMENT, "padded", "1-d");
    dpar_runtime_destroy(rt);
}

/* A checkpoint written from the Vulkan backend (4 logical devices, sharded)
   restores on the CPU backend (2 devices): the file holds global arrays. */
static void test_cross_backend(void **st) {
    (void)st;
    dpar_runtime *vk = t_runtime_or_skip(DPAR_BACKEND_VULKAN, 4);
    if (!vk) return;
    dpar_mesh *m = t_mesh1(vk, 4, "data");
    dpar_array *a = arr(m, DPAR_F32, 2, 8, 3, "data", NULL);
    float x[24], y[24];
    for (int i = 0; i < 24; i++) x[i] = 1.0f / (float)(i + 1);
    T_OK(dpar_array_put(a, x));
    const char *path = tpath("vk.ckpt");
    dpar_checkpoint_entry e[1] = { { "a", a, false } };
    T_OK(dpar_checkpoint_save(path, e, 1, 9));
    dpar_runtime_destroy(vk);
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m2 = t_mesh1(rt, 2, "data");
    e[0].array = arr(m2, DPAR_F32, 2, 8, 3, "data", NULL);
    T_OK(dpar_checkpoint_restore(path, e, 1, NULL));
    T_OK(dpar_array_get(e[0].array, y));
    assert_memory_equal(x, y, sizeof x);
    dpar_runtime_destroy(rt);
}

/* >>untrusted files ==========================================================
   Hand-made checkpoint images: a byte writer, then the header's length and the
   CRC-32 trailer made valid, so what is tested is the check behind the CRC. */
typedef struct {
    unsigned char b[4096];
    size_t n;
} img_t;
static void put32(img_t *m, uint32_t v) {
    for (int i = 0; i < 4; i++) m->b[m->n++] = (unsigned char)(v >> (8 * i));
}
static void put64(img_t *m, uint64_t v) {
    for (int i = 0; i < 8; i++) m->b[m->n++] = (unsigned char)(v >> (8 * i));
}
static void img_header(img_t *m, uint32_t count) {
    m->n = 0;
    memcpy(m->b, "DPARCKPT", 8);
    m->n = 8;
    put32(m, DPAR_CHECKPOINT_VERSION);
    put32(m, count);
    put64(m, 0); /* length: img_finish */
    put64(m, 5); /* step */
}
/* name, dtype, ndim, shape, flags, data bytes (zeros) */
static void img_entry(img_t *m, const char *name, dpar_dtype t, int nd, const uint64_t *shape, uint32_t flags,
                      uint64_t nbytes, size_t zeros) {
    put32(m, (uint32_t)strlen(name));
    memcpy(m->b + m->n, name, strlen(name));
    m->n += strlen(name);
    put32(m, (uint32_t)t);
    put32(m, (uint32_t)nd);
    for (int d = 0; d < nd; d++) put64(m, shape[d]);
    put32(m, flags);
    put64(m, nbytes);
    memset(m->b + m->n, 0, zeros);
    m->n += zeros;
}
static void img_finish(img_t *m, const char *path) {
    size_t len = m->n + 4;
    for (int i = 0; i < 8; i++) m->b[16 + i] = (unsigned char)((uint64_t)len >> (8 * i));
    uint32_t crc = dpar_crc32(0, m->b, m->n);
    put32(m, crc);
    spit(path, m->b, (long)m->n);
}

/* 36 bytes with a valid CRC asking for 4 billion entries: refused as
   malformed before any allocation, not "out of host memory". Also an entry
   count one more than the file holds. */
static void test_huge_entry_count(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_checkpoint_entry e[1] = { { "a", arr(m, DPAR_F32, 1, 2, 0, NULL, NULL), false } };
    const char *p = tpath("huge.ckpt");
    img_t im;
    img_header(&im, 0xFFFFFFFFu);
    img_finish(&im, p);
    assert_int_equal(file_size(p), 36);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "4294967295 entries", "36 bytes", "malformed");
    assert_null(strstr(dpar_last_error(), "memory"));
    T_ERR(dpar_checkpoint_restore(p, NULL, 0, NULL), DPAR_ERR_IO, "4294967295 entries");
    const uint64_t sh[1] = { 2 };
    img_header(&im, 2); /* one entry written, two counted */
    img_entry(&im, "a", DPAR_F32, 1, sh, 0, 8, 8);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "counts 2 entries", "at most 1");
    img_header(&im, 0); /* an empty checkpoint is fine */
    img_finish(&im, p);
    uint64_t step = 0;
    T_OK(dpar_checkpoint_restore(p, NULL, 0, &step));
    assert_int_equal(step, 5);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_INVALID_ARGUMENT, "no entry named 'a'");
    dpar_runtime_destroy(rt);
}

/* CRC-valid entries whose element count x dtype size overflows 64 bits (the
   stored byte count is the wrapped product), a dimension above INT64_MAX, a
   data size past the end, name lengths 0 and 256: each refused by kind. */
static void test_malformed_entries(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_array *a = arr(m, DPAR_F32, 2, 2, 2, NULL, NULL);
    dpar_checkpoint_entry e[1] = { { "x", a, false } };
    float keep[4] = { 1, 2, 3, 4 }, y[4];
    T_OK(dpar_array_put(a, keep));
    const char *p = tpath("over.ckpt");
    img_t im;
    const uint64_t big[2] = { 1ull << 62, 8 };   /* count 2^65: wraps to 0 */
    const uint64_t bytes[2] = { 1ull << 62, 1 }; /* count 2^62, x 4 bytes = 2^64: wraps to 0 */
    const uint64_t neg[2] = { 1ull << 63, 1 };
    img_header(&im, 1);
    img_entry(&im, "x", DPAR_F32, 2, big, 0, 0, 0);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "overflows", "entry 0");
    img_header(&im, 1);
    img_entry(&im, "x", DPAR_F32, 2, bytes, 0, 0, 0);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "overflows");
    img_header(&im, 1);
    img_entry(&im, "x", DPAR_F32, 2, neg, 0, 0, 0);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "dimension 0", "malformed");
    const uint64_t sh[2] = { 2, 2 };
    img_header(&im, 1); /* 16 bytes announced, 8 present */
    img_entry(&im, "x", DPAR_F32, 2, sh, 0, 16, 8);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "past the end");
    img_header(&im, 1);
    img_entry(&im, "", DPAR_F32, 2, sh, 0, 16, 16);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "name of 0 bytes");
    char longname[300];
    memset(longname, 'n', 256);
    longname[256] = 0;
    img_header(&im, 1);
    img_entry(&im, longname, DPAR_F32, 2, sh, 0, 16, 16);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "name of 256 bytes");
    img_header(&im, 1);
    img_entry(&im, "x", (dpar_dtype)99, 2, sh, 0, 16, 16);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "dtype 99");
    img_header(&im, 1); /* and the well-formed one restores */
    img_entry(&im, "x", DPAR_F32, 2, sh, 0, 16, 16);
    img_finish(&im, p);
    T_OK(dpar_array_get(a, y));
    assert_memory_equal(y, keep, sizeof y);
    T_OK(dpar_checkpoint_restore(p, e, 1, NULL));
    T_OK(dpar_array_get(a, y));
    assert_true(y[0] == 0.0f && y[3] == 0.0f);
    dpar_runtime_destroy(rt);
}

/* Duplicate names and unknown flags are refused even with a valid CRC. */
static void test_duplicates_and_flags(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_checkpoint_entry e[1] = { { "w", arr(m, DPAR_F32, 1, 2, 0, NULL, NULL), false } };
    const char *p = tpath("dup.ckpt");
    const uint64_t sh[1] = { 2 };
    img_t im;
    img_header(&im, 3);
    img_entry(&im, "w", DPAR_F32, 1, sh, 0, 8, 8);
    img_entry(&im, "b", DPAR_F32, 1, sh, 0, 8, 8);
    img_entry(&im, "w", DPAR_F32, 1, sh, 0, 8, 8);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "two entries named 'w'");
    T_ERR(dpar_checkpoint_restore(p, NULL, 0, NULL), DPAR_ERR_IO, "two entries named 'w'"); /* even if not asked */
    img_header(&im, 2);
    img_entry(&im, "w", DPAR_F32, 1, sh, 0, 8, 8);
    img_entry(&im, "b", DPAR_F32, 1, sh, 0x2, 8, 8);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "unknown flags 0x2", "entry 1");
    img_header(&im, 1);
    img_entry(&im, "w", DPAR_F32, 1, sh, 0x80000001u, 8, 8);
    img_finish(&im, p);
    T_ERR(dpar_checkpoint_restore(p, e, 1, NULL), DPAR_ERR_IO, "unknown flags 0x80000001");
    dpar_runtime_destroy(rt);
}

/* Only regular files are read: /dev/zero, a FIFO without a writer (would
   hang on open) and a directory are refused at once. */
static void test_not_regular_files(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    dpar_mesh *m = t_mesh1(rt, 1, "data");
    dpar_checkpoint_entry e[1] = { { "a", arr(m, DPAR_F32, 1, 2, 0, NULL, NULL), false } };
#if !defined(_WIN32) /* no /dev/zero, no FIFOs in the file system */
    T_ERR(dpar_checkpoint_restore("/dev/zero", e, 1, NULL), DPAR_ERR_IO, "/dev/zero", "not a regular file",
          "character device");
    const char *fifo = tpath("fifo.ckpt");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    T_ERR(dpar_checkpoint_restore(fifo, e, 1, NULL), DPAR_ERR_IO, "fifo.ckpt", "FIFO", "regular files only");
    remove(fifo);
#endif
    T_ERR(dpar_checkpoint_restore(g_dir, e, 1, NULL), DPAR_ERR_IO, "directory");
    dpar_runtime_destroy(rt);
}

/* Two threads each save 25 times to one path: every save succeeds, no
   temporary is left, and the file restores whole (one thread's array). */
typedef struct {
    dpar_array *a;
    const char *path;
    int failed;
    char err[256];
} saver_t;
static void *saver(void *arg) {
    saver_t *s = (saver_t *)arg;
    dpar_checkpoint_entry e[1] = { { "v", s->a, false } };
    for (int i = 0; i < 25; i++)
        if (dpar_checkpoint_save(s->path, e, 1, (uint64_t)i) != DPAR_OK && !s->failed++)
            snprintf(s->err, sizeof s->err, "%s", dpar_last_error());
    return NULL;
}
static void test_concurrent_saves(void **st) {
    (void)st;
    const char *path = tpath("shared.ckpt");
    dpar_runtime *rt[2];
    saver_t sv[2];
    pthread_t th[2];
    float x[2][64], y[64];
    for (int t = 0; t < 2; t++) {
        rt[t] = t_runtime(DPAR_BACKEND_CPU, 1);
        dpar_mesh *m = t_mesh1(rt[t], 1, "data");
        for (int i = 0; i < 64; i++) x[t][i] = (float)(t * 1000 + i);
        memset(&sv[t], 0, sizeof sv[t]);
        sv[t].a = arr(m, DPAR_F32, 1, 64, 0, NULL, NULL);
        sv[t].path = path;
        T_OK(dpar_array_put(sv[t].a, x[t]));
    }
    for (int t = 0; t < 2; t++) assert_int_equal(pthread_create(&th[t], NULL, saver, &sv[t]), 0);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++)
        if (sv[t].failed) fail_msg("thread %d: %d of 25 saves failed: %s", t, sv[t].failed, sv[t].err);
    assert_int_equal(count_tmp_files(), 0);
    dpar_checkpoint_entry e[1] = { { "v", sv[0].a, false } };
    uint64_t step = 0;
    T_OK(dpar_checkpoint_restore(path, e, 1, &step));
    assert_int_equal(step, 24);
    T_OK(dpar_array_get(sv[0].a, y));
    assert_true(!memcmp(y, x[0], sizeof y) || !memcmp(y, x[1], sizeof y));
    for (int t = 0; t < 2; t++) dpar_runtime_destroy(rt[t]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32),
        cmocka_unit_test(test_roundtrip_other_mesh),
        cmocka_unit_test(test_corruption),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_resume_bitwise),
        cmocka_unit_test(test_padded_rule),
        cmocka_unit_test(test_cross_backend),
        cmocka_unit_test(test_huge_entry_count),
        cmocka_unit_test(test_malformed_entries),
        cmocka_unit_test(test_duplicates_and_flags),
        cmocka_unit_test(test_not_regular_files),
        cmocka_unit_test(test_concurrent_saves),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
