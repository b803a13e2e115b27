/* Shared by dpar_kernels.cu and optim.cu: the index-check guard of an optimizer update (dpar_k_sgd,
   dpar_k_adamw). */
#ifndef DPAR_OPT_GUARD_CUH
#define DPAR_OPT_GUARD_CUH
/* err: the device's index-check error words (NULL: none yet). While a label or index check's error
   waits there for the host's report, the update is skipped whole (bad input loses nothing). The first
   update of a graph step (graph: the graph's id, else 0) counts the skipped step in err[5] and under the
   id in the first pair err[8 + 2j] (id), err[9 + 2j] (steps) that holds it or is free (dpar.h's >>skipped
   steps), which the graph takes off its step count. Returns whether the update skips. */
static __device__ bool dk_opt_skipped(unsigned *err, unsigned graph, bool first_thread) {
    if (!err || err[0] == 0u) return false;
    if (graph && first_thread) {
        err[5] += 1u;
        for (int j = 8; j < 32; j += 2)
            if (err[j] == graph || err[j] == 0u) {
                err[j] = graph;
                err[j + 1] += 1u;
                break;
            }
    }
    return true;
}
#endif
