/* dpar.h from C++17: psum of x [4, 3] over a 4-device mesh axis "data".

   C++17 has neither C's compound literals, `&(dpar_x_desc){ .f = 1 }`, nor
   C++20's designated initializers, so a desc is filled in two steps:
     dpar_x_desc d{};   value-initialized: every field zero, which means "default"
     d.field = ...;     then only the fields that matter
   A small function that returns a filled desc (line_mesh below) keeps call
   sites short. A captureless lambda converts to dpar_fn; per-device state goes
   through `user`. std::unique_ptr with dpar_runtime_destroy as deleter frees
   the runtime (and its meshes) on every return path.

   Built with -std=c++17 -Wall -Wextra -Werror by g++ and clang++
   (tests/test_first_programs.sh). Usage: cpp_example (no flags; --help says so) */
#include "dpar.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace {

// Prints the failing call and the library's error; true when s is DPAR_OK.
bool ok(dpar_status s, const char *what) {
    if (s == DPAR_OK) return true;
    std::fprintf(stderr, "%s: %s: %s\n", what, dpar_status_string(s), dpar_last_error());
    return false;
}

// A 1-D mesh of n devices along one named axis.
dpar_mesh_desc line_mesh(int n, const char *axis) {
    dpar_mesh_desc d{};
    d.ndim = 1;
    d.shape[0] = n;
    d.axis_names[0] = axis;
    return d;
}

} // namespace

int main(int argc, char **argv) {
    if (argc > 1) { // no flags: --help says so (exit 0), anything else is a usage error (exit 2), as in every example
        bool help = !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h");
        if (!help) std::fprintf(stderr, "cpp_example: unknown flag %s (it takes no flags)\n", argv[1]);
        std::fprintf(help ? stdout : stderr, "usage: cpp_example (no flags; psum of x [4, 3] over 4 CPU devices)\n");
        return help ? 0 : 2;
    }
    constexpr int ndev = 4, cols = 3;
    using runtime_ptr = std::unique_ptr<dpar_runtime, decltype(&dpar_runtime_destroy)>;

    dpar_runtime_desc rd{};
    rd.backend = DPAR_BACKEND_CPU;
    rd.num_devices = ndev;
    dpar_runtime *raw = nullptr;
    if (!ok(dpar_runtime_create(&rd, &raw), "dpar_runtime_create")) return 1;
    runtime_ptr rt(raw, dpar_runtime_destroy);

    const dpar_mesh_desc md = line_mesh(ndev, "data");
    dpar_mesh *mesh = nullptr;
    if (!ok(dpar_mesh_create(rt.get(), &md, &mesh), "dpar_mesh_create")) return 1;

    // x [4, 3] = 0..11: device d gets row d; y [4, 3] stacks every device's psum.
    std::vector<float> x(std::size_t(ndev * cols)), y(std::size_t(ndev * cols));
    for (std::size_t i = 0; i < x.size(); i++) x[i] = float(i);

    dpar_pmap_desc pd{};
    pd.axis = "data";
    pd.fn = [](dpar_ctx *ctx, void *) -> dpar_status {
        return dpar_psum(ctx, dpar_ctx_arg(ctx, 1), dpar_ctx_arg(ctx, 0), "data");
    };
    dpar_pmap_input &in = pd.inputs[0];
    in.data = x.data();
    in.dtype = DPAR_F32;
    in.ndim = 2;
    in.shape[0] = ndev;
    in.shape[1] = cols;
    dpar_pmap_output &out = pd.outputs[0];
    out.data = y.data();
    out.dtype = DPAR_F32;
    out.ndim = 1;
    out.shape[0] = cols;
    if (!ok(dpar_pmap(mesh, &pd), "dpar_pmap")) return 1;

    for (int d = 0; d < ndev; d++) {
        const float *row = &y[std::size_t(d * cols)];
        std::printf("device %d: psum = [%g, %g, %g]\n", d, double(row[0]), double(row[1]), double(row[2]));
    }
    return 0;
}
