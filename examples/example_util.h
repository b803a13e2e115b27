/* example_util.h — what the small examples (pmap_basics, collectives_tour,
   dp_regression, predict_update) share: CHECK, TRY and their --backend flag. The digits
   examples have theirs in digits_common.h. Included by the examples (not
   compiled on its own). */
#ifndef EXAMPLE_UTIL_H
#define EXAMPLE_UTIL_H
#include "dpar.h"
#include <stdio.h>
#include <stdlib.h>

/* --backend NAME -> the backend kind ("cpu", "vulkan", "cuda"); an unknown
   name prints the library's error and exits with status 2 (a usage error). */
static inline dpar_backend_kind parse_backend(const char *s) {
    dpar_backend_kind k;
    if (dpar_backend_from_name(s, &k) == DPAR_OK) return k;
    fprintf(stderr, "%s\n", dpar_last_error());
    exit(2);
}

/* Host code: a failing call prints where, the status and the library's text, and exits. */
#define CHECK(call)                                                                                     \
    do {                                                                                                \
        dpar_status s_ = (call);                                                                        \
        if (s_ != DPAR_OK) {                                                                            \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, dpar_status_string(s_), \
                    dpar_last_error());                                                                 \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)
/* Inside a per-device function: return the status, pmap reports it. */
#define TRY(call)                     \
    do {                              \
        dpar_status s_ = (call);      \
        if (s_ != DPAR_OK) return s_; \
    } while (0)

#endif
