// Kernels with known instruction counts per thread (tests of the counters).
#include <metal_stdlib>
using namespace metal;

// 2 float (multiply, add), 2 memory.
[[kernel]] void scale_and_shift(
    const device float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = x[i] * 3.0f + 1.0f;
}

// 8 float (four lanes of a multiply and an add), 2 memory (16-byte accesses).
[[kernel]] void vector_lanes(
    const device float4* x [[buffer(0)]],
    device float4* y [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  float4 v = x[i];
  y[i] = v * v + 1.0f;
}

// 3 conversions (half to float, float to int, int to float), 1 float, 2 memory.
[[kernel]] void conversions(
    const device half* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  int k = int(float(x[i]) * 2.0f);
  y[i] = float(k);
}

// n iterations of 2 float ops: 2n float.
[[kernel]] void float_loop(
    const device float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    constant int& n [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  float a = x[i];
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    acc = acc * a + 0.5f;
  }
  y[i] = acc;
}

// A variable shift: the simulator's shift-exponent check is not counted.
[[kernel]] void shift_and_xor(
    const device uint* x [[buffer(0)]],
    device uint* y [[buffer(1)]],
    constant uint& s [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  uint k = x[i];
  y[i] = (k << s) ^ k;
}
