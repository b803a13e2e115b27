/* example_util.h — what the small examples (pmap_basics, collectives_tour,
   dp_regression, predict_update) share: their --backend flag. The digits
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

#endif
