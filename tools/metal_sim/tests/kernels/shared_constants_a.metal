#include "shared_constants.h"

[[kernel]] void scale_a(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  out[i] = scaled(in[i], i);
}
