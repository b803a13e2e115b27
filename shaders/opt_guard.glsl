// Shared by sgd.comp, sgd_pair.comp (through sgd_common.glsl) and adamw.comp: the index-check guard of an
// optimizer update. Guarded (flags bit2: the device has index-check error words, binding 4): while a label/index
// check's error is set, and until the host
// reports it, the update is skipped whole (bad input loses nothing). The first update of a graph step
// (p[0] = the graph's id, 0: not one) counts the skipped step in err[5] and under the graph's id in the first
// of the pairs err[8 + 2j] (id), err[9 + 2j] (steps) that holds it or is free (dpar.h's >>skipped steps).
layout(std430, set = 0, binding = 4) buffer Err { uint err[]; };
bool opt_skipped() {
    if ((pc.flags & 4u) == 0u || err[0] == 0u) return false;
    uint graph = pc.p[0];
    if (graph != 0u && gl_GlobalInvocationID.x == 0u) {
        err[5] += 1u;
        for (uint j = 8u; j < 32u; j += 2u)
            if (err[j] == graph || err[j] == 0u) {
                err[j] = graph;
                err[j + 1u] += 1u;
                break;
            }
    }
    return true;
}
