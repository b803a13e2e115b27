/* libFuzzer harness: the axis and spec string parsers, through the public
   API, on a 2x2x2 mesh with axes "data", "model", "pp" (8 CPU devices).
   Input: up to 4 strings separated by '\n'. The first is an axis set for
   dpar_mesh_axis_size and dpar_mesh_group; all four are the per-dimension
   spec of a [4, 4, 4, 4] array (dpar_array_create), and the first three the
   axis names of a new 2x2x2 mesh (dpar_mesh_create). Every failure must
   carry an error text; an accepted spec must split the array consistently.
   Build: `make fuzz`. */
#define DPAR_IMPLEMENTATION
#include "../../dpar.h"

static dpar_runtime *g_rt;
static dpar_mesh *g_m;

static void fz_init(void) {
    dpar_runtime_desc rd = { .backend = DPAR_BACKEND_CPU, .num_devices = 8 };
    dpar_mesh_desc md = { .ndim = 3, .shape = { 2, 2, 2 }, .axis_names = { "data", "model", "pp" } };
    if (dpar_runtime_create(&rd, &g_rt) || dpar_mesh_create(g_rt, &md, &g_m)) abort();
}
static void fz_check(dpar_status s) {
    if (s != DPAR_OK && !dpar_last_error()[0]) abort(); /* an error without a text */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_rt) fz_init();
    if (size > 4096) return 0;
    char *buf = (char *)malloc(size + 1), *str[4] = { NULL, NULL, NULL, NULL };
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    int ns = 0;
    for (char *p = buf; ns < 4;) {
        str[ns++] = p;
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        p = nl + 1;
    }
    int n = 0, members[DPAR_MAX_DEVICES], idx = 0;
    dpar_status s = dpar_mesh_axis_size(g_m, str[0], &n);
    fz_check(s);
    if (!s && (n < 1 || n > 8 || 8 % n)) abort();
    s = dpar_mesh_group(g_m, str[0], 5, members, &n, &idx);
    fz_check(s);
    if (!s && (n < 1 || n > 8 || idx < 0 || idx >= n || members[idx] != 5)) abort();

    dpar_array_desc ad = { .dtype = DPAR_F32, .ndim = 4, .shape = { 4, 4, 4, 4 } };
    for (int i = 0; i < 4; i++) ad.spec[i] = str[i];
    dpar_array *a = NULL;
    s = dpar_array_create(g_m, &ad, &a);
    fz_check(s);
    if (!s) {
        int64_t cnt = 1;
        for (int d = 0; d < 4; d++) cnt *= dpar_array_shard_dim(a, d);
        if (cnt < 1 || cnt > 256 || 256 % cnt) abort();
        dpar_array_destroy(a);
    }

    dpar_mesh_desc md = { .ndim = 3, .shape = { 2, 2, 2 } };
    for (int i = 0; i < 3; i++) md.axis_names[i] = str[i] ? str[i] : "";
    dpar_mesh *m = NULL;
    s = dpar_mesh_create(g_rt, &md, &m);
    fz_check(s);
    if (!s) dpar_mesh_destroy(m);
    free(buf);
    return 0;
}
