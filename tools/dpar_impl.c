/* The one translation unit that holds the dpar implementation for the
   project's own programs (tests, examples, benchmarks), the training helpers
   of util/ included. Backends are switched on by the build (-DDPAR_VULKAN,
   -DDPAR_CUDA). */
#define DPAR_IMPLEMENTATION
#include "../dpar.h"
#include "../util/dpar_train.h"
