// psum over 4 CPU devices from C++17: row d of x [4, 8] goes to device d,
// every device sums the rows over the mesh axis "data", and each of the 4
// stacked results must be exactly sum_d x[d][i]. Prints "psum4 ok" or why not.
#include "dpar.h"

#include <cstdio>
#include <vector>

namespace {

constexpr int kDevices = 4, kCols = 8;

dpar_status psum_fn(dpar_ctx *ctx, void *) {
    return dpar_psum(ctx, dpar_ctx_arg(ctx, 1), dpar_ctx_arg(ctx, 0), "data");
}

int fail(const char *what, dpar_status s) {
    std::fprintf(stderr, "psum4: %s: %s: %s\n", what, dpar_status_string(s), dpar_last_error());
    return 1;
}

} // namespace

int main() {
    dpar_runtime_desc rd{};
    rd.backend = DPAR_BACKEND_CPU;
    rd.num_devices = kDevices;
    dpar_runtime *rt = nullptr;
    if (dpar_status s = dpar_runtime_create(&rd, &rt)) return fail("dpar_runtime_create", s);

    dpar_mesh_desc md{};
    md.ndim = 1;
    md.shape[0] = kDevices;
    md.axis_names[0] = "data";
    dpar_mesh *mesh = nullptr;
    if (dpar_status s = dpar_mesh_create(rt, &md, &mesh)) return fail("dpar_mesh_create", s);

    std::vector<float> x(kDevices * kCols), y(kDevices * kCols, -1.0f);
    for (int d = 0; d < kDevices; d++)
        for (int i = 0; i < kCols; i++) x[d * kCols + i] = float(d * 100 + i);
    dpar_pmap_desc pd{};
    pd.axis = "data";
    pd.fn = psum_fn;
    pd.num_inputs = pd.num_outputs = 1;
    pd.inputs[0].data = x.data();
    pd.inputs[0].dtype = DPAR_F32;
    pd.inputs[0].ndim = 2;
    pd.inputs[0].shape[0] = kDevices;
    pd.inputs[0].shape[1] = kCols;
    pd.inputs[0].in_axis = DPAR_MAPPED;
    pd.outputs[0].data = y.data();
    pd.outputs[0].dtype = DPAR_F32;
    pd.outputs[0].ndim = 1;
    pd.outputs[0].shape[0] = kCols;
    if (dpar_status s = dpar_pmap(mesh, &pd)) return fail("dpar_pmap", s);

    int bad = 0;
    for (int d = 0; d < kDevices; d++)
        for (int i = 0; i < kCols; i++) {
            float want = float(600 + 4 * i); // (0 + 100 + 200 + 300) + 4 i, exact in f32
            if (y[d * kCols + i] != want) {
                std::fprintf(stderr, "psum4: device %d element %d: got %g, want %g\n", d, i, double(y[d * kCols + i]),
                             double(want));
                bad++;
            }
        }
    dpar_mesh_destroy(mesh);
    dpar_runtime_destroy(rt);
    if (bad) return 1;
    std::printf("psum4 ok: %d devices, C++%ld\n", kDevices, long(__cplusplus / 100 % 100));
    return 0;
}
