// Must not compile: a threadgroup pointer passed where a device pointer is expected.
#include <metal_stdlib>
using namespace metal;

void store_one(device float* p) {
  p[0] = 1;
}

[[kernel]] void mixes_address_spaces(device float* out [[buffer(0)]]) {
  threadgroup float local[4];
  store_one(local);
  out[0] = local[0];
}
