// The rows of W the dot kernels redo element by element. The dot kernels
// scale each group's sum of x * code, which matches the reference's sum of
// x * (code * scale) only for finite scales (an infinite scale times a ±0
// code is NaN there); and an ISA's own E4M3 step may decode NaN codes as
// finite values. Rows holding either, rare, are redone as the reference
// computes them.
#pragma once

#include <algorithm>
#include <bit>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_decode.h"

namespace mlx_fpqmm::cpu::simd {
namespace {  // see simd_loops.h

// Whether row r of W holds a NaN code (magnitude 0x7F, the largest) that
// the ISA's own E4M3 step decodes as a finite value. A max-reduction, so
// that it vectorizes.
template <class V>
inline bool has_nan_codes(const QuantizedMatrix& w, int64_t r) {
  if (!kOwnE4M3Step<V> || w.bits != 8) {
    return false;
  }
  const uint8_t* codes = w.row(r);
  uint8_t largest = 0;
  for (int64_t k = 0; k < w.cols; ++k) {
    largest = std::max<uint8_t>(largest, codes[k] & 0x7F);
  }
  return largest == 0x7F;
}

// On the exponent bits, as a max-reduction: it vectorizes (the check runs
// for every row of W) and survives -ffinite-math-only.
inline bool all_finite(const float* scales, int64_t count) {
  constexpr uint32_t kExponent = 0x7F800000u;
  uint32_t largest = 0;
  for (int64_t g = 0; g < count; ++g) {
    largest = std::max(largest, std::bit_cast<uint32_t>(scales[g]) & kExponent);
  }
  return largest != kExponent;
}

// Redoes the outputs of the rows of W [n, n + R) (decoded scales `stride`
// floats apart) that hold a non-finite scale or a NaN code decoded as
// finite, for M rows of x.
template <class V, typename X>
inline void redo_nonfinite_rows(
    const QuantizedMatrix& w,
    int64_t n,
    int R,
    const float* scales,
    int64_t stride,
    const X* x,
    int64_t M,
    float* out,
    int64_t ldo) {
  for (int r = 0; r < R; ++r) {
    const float* row_scales = scales + r * stride;
    if (all_finite(row_scales, w.groups()) && !has_nan_codes<V>(w, n + r)) {
      continue;
    }
    for (int64_t m = 0; m < M; ++m) {
      out[m * ldo + r] = dot_by_element(w, n + r, row_scales, x + m * w.cols);
    }
  }
}

}  // namespace
}  // namespace mlx_fpqmm::cpu::simd
