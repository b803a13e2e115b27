// The one translation unit with dpar's implementation (backends as the
// dpar::dpar target's options define them).
#define DPAR_IMPLEMENTATION
#include "dpar.h"
