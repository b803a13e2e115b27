/* dpar_visualize_array_sharding: the exact text for 0-, 1- and 2-d arrays on
   1-d and 2-d meshes, split, replicated and partly replicated; a mesh whose
   device order is not the identity; bad input. */
#include "testutil.h"

static dpar_array *arr(dpar_mesh *m, int ndim, int64_t d0, int64_t d1, const char *s0, const char *s1) {
    dpar_array_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DPAR_F32;
    d.ndim = ndim;
    d.shape[0] = d0, d.shape[1] = d1;
    d.spec[0] = s0, d.spec[1] = s1;
    dpar_array *a = NULL;
    T_OK(dpar_array_create(m, &d, &a));
    return a;
}
/* Draws a to a file and compares the whole text with want. */
static void expect(const dpar_array *a, const char *want) {
    char path[512], got[4096];
    snprintf(path, sizeof path, "%s/dpar_test_visualize.txt", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    T_OK(dpar_visualize_array_sharding(a, path));
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    got[n] = 0;
    fclose(f);
    remove(path);
    if (strcmp(got, want)) fail_msg("got:\n%s\nwanted:\n%s", got, want);
}

static void test_mesh_1d(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    dpar_mesh *m = t_mesh1(rt, 4, "data");
    expect(arr(m, 1, 8, 0, "data", NULL), "f32[8] spec(data) mesh(data=4)\n"
                                          "+-------+-------+-------+-------+\n"
                                          "| dev 0 | dev 1 | dev 2 | dev 3 |\n"
                                          "| [0:2] | [2:4] | [4:6] | [6:8] |\n"
                                          "+-------+-------+-------+-------+\n");
    expect(arr(m, 1, 6, 0, NULL, NULL), "f32[6] spec(-) mesh(data=4)\n"
                                        "+--------------+\n"
                                        "| devs 0,1,2,3 |\n"
                                        "| [0:6]        |\n"
                                        "+--------------+\n");
    expect(arr(m, 2, 8, 3, "data", NULL), "f32[8, 3] spec(data, -) mesh(data=4)\n"
                                          "+------------+\n"
                                          "| dev 0      |\n"
                                          "| [0:2, 0:3] |\n"
                                          "+------------+\n"
                                          "| dev 1      |\n"
                                          "| [2:4, 0:3] |\n"
                                          "+------------+\n"
                                          "| dev 2      |\n"
                                          "| [4:6, 0:3] |\n"
                                          "+------------+\n"
                                          "| dev 3      |\n"
                                          "| [6:8, 0:3] |\n"
                                          "+------------+\n");
    expect(arr(m, 0, 0, 0, NULL, NULL), "f32[] spec() mesh(data=4)\n"
                                        "+--------------+\n"
                                        "| devs 0,1,2,3 |\n"
                                        "| []           |\n"
                                        "+--------------+\n");
    T_OK(dpar_runtime_destroy(rt));
}
static void test_mesh_2d(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 4);
    int shape[2] = { 2, 2 };
    const char *names[2] = { "data", "model" };
    dpar_mesh *m = t_mesh(rt, 2, shape, names);
    /* device d sits at (data, model) = (d / 2, d % 2) */
    expect(arr(m, 2, 8, 6, "data", "model"), "f32[8, 6] spec(data, model) mesh(data=2, model=2)\n"
                                             "+------------+------------+\n"
                                             "| dev 0      | dev 1      |\n"
                                             "| [0:4, 0:3] | [0:4, 3:6] |\n"
                                             "+------------+------------+\n"
                                             "| dev 2      | dev 3      |\n"
                                             "| [4:8, 0:3] | [4:8, 3:6] |\n"
                                             "+------------+------------+\n");
    expect(arr(m, 2, 4, 6, NULL, "model"), "f32[4, 6] spec(-, model) mesh(data=2, model=2)\n"
                                           "+------------+------------+\n"
                                           "| devs 0,2   | devs 1,3   |\n"
                                           "| [0:4, 0:3] | [0:4, 3:6] |\n"
                                           "+------------+------------+\n");
    expect(arr(m, 2, 8, 2, "model,data", NULL), "f32[8, 2] spec(model,data, -) mesh(data=2, model=2)\n"
                                                "+------------+\n"
                                                "| dev 0      |\n"
                                                "| [0:2, 0:2] |\n"
                                                "+------------+\n"
                                                "| dev 2      |\n"
                                                "| [2:4, 0:2] |\n"
                                                "+------------+\n"
                                                "| dev 1      |\n"
                                                "| [4:6, 0:2] |\n"
                                                "+------------+\n"
                                                "| dev 3      |\n"
                                                "| [6:8, 0:2] |\n"
                                                "+------------+\n");
    expect(arr(m, 1, 4, 0, "model", NULL), "f32[4] spec(model) mesh(data=2, model=2)\n"
                                           "+----------+----------+\n"
                                           "| devs 0,2 | devs 1,3 |\n"
                                           "| [0:2]    | [2:4]    |\n"
                                           "+----------+----------+\n");
    T_OK(dpar_runtime_destroy(rt));
}
/* A mesh over devices in another order: cells name devices, not positions. */
static void test_device_order(void **st) {
    (void)st;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh_desc d;
    memset(&d, 0, sizeof d);
    static const int order[2] = { 1, 0 };
    d.ndim = 1, d.shape[0] = 2, d.axis_names[0] = "data", d.devices = order;
    dpar_mesh *m = NULL;
    T_OK(dpar_mesh_create(rt, &d, &m));
    expect(arr(m, 1, 4, 0, "data", NULL), "f32[4] spec(data) mesh(data=2)\n"
                                          "+-------+-------+\n"
                                          "| dev 1 | dev 0 |\n"
                                          "| [0:2] | [2:4] |\n"
                                          "+-------+-------+\n");
    T_OK(dpar_runtime_destroy(rt));
}
static void test_bad_input(void **st) {
    (void)st;
    T_ERR(dpar_visualize_array_sharding(NULL, NULL), DPAR_ERR_INVALID_ARGUMENT, "dpar_visualize_array_sharding",
          "NULL");
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array_desc d3 = { DPAR_F32, 3, { 2, 2, 2 }, { "data" } };
    dpar_array *a3 = NULL;
    T_OK(dpar_array_create(m, &d3, &a3));
    T_ERR(dpar_visualize_array_sharding(a3, NULL), DPAR_ERR_SHAPE, "3-d", "reshape");
    T_ERR(dpar_visualize_array_sharding(arr(m, 1, 2, 0, NULL, NULL), "/nonexistent-dir/x.txt"), DPAR_ERR_IO,
          "/nonexistent-dir/x.txt");
    T_OK(dpar_runtime_destroy(rt));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mesh_1d),
        cmocka_unit_test(test_mesh_2d),
        cmocka_unit_test(test_device_order),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
