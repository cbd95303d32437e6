#include "shared_constants.h"

// The same constants, seen from a second translation unit.
[[kernel]] void scale_b(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  out[i] = -scaled(in[i], i);
}
