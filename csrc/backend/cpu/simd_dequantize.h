// Dequantizing W, over an ISA's vector traits V (simd_kernels.h): rows in
// element order, scaled, for a float32 GEMM's panels (dequantize) and for
// the small-M product x @ W (axpy).
#pragma once

#include <algorithm>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_decode.h"
#include "backend/cpu/simd_loops.h"

namespace mlx_fpqmm::cpu::simd {
namespace {  // see simd_loops.h

// Decodes columns [c0, c1) of row r, scaled, into dst in element order.
template <class V, int kBits>
MLX_FPQMM_FLATTEN inline void dequantize_row(
    const QuantizedMatrix& w,
    int64_t r,
    int64_t c0,
    int64_t c1,
    const float* scales,
    float* dst) {
  using F = typename V::F;
  const uint8_t* row = w.row(r);
  int shift = group_shift(w);
  int64_t c = c0;
  bool two_groups = split<V, kBits>(w);
  for (; c + kStep<V, kBits> <= c1; c += kStep<V, kBits>) {
    F s = two_groups ? step_scale<V, true>(scales, c, shift)
                     : step_scale<V, false>(scales, c, shift);
    F d[kVecs<kBits>];
    decode<V, kBits>(row, c, d);
    if constexpr (kBits == 4) {
      V::store_interleaved(dst + c - c0, V::mul(d[0], s), V::mul(d[1], s));
    } else {
      V::store(dst + c - c0, V::mul(d[0], s));
    }
  }
  for (; c < c1; ++c) {
    dst[c - c0] = code_value(w, r, c) * scales[c / w.group_size];
  }
}

// dst[(r - r0) * ld + c - c0] = W[r, c] scaled, for r in [r0, r1) and c in
// [c0, c1).
template <class V, int kBits>
inline void dequantize_rows(
    const QuantizedMatrix& w,
    int64_t r0,
    int64_t r1,
    int64_t c0,
    int64_t c1,
    float* dst,
    int64_t ld) {
  float* scales = scratch<float>(1, w.groups() + kScalePadding);
  for (int64_t r = r0; r < r1; ++r) {
    decode_scales<V>(
        w,
        r,
        scales,
        c0 / w.group_size,
        (c1 + w.group_size - 1) / w.group_size);
    dequantize_row<V, kBits>(w, r, c0, c1, scales, dst + (r - r0) * ld);
  }
}

// x @ W with W (K, N): each row of W is decoded once, in blocks of columns
// that stay in L1, and added into every x row's accumulators.
template <class V>
MLX_FPQMM_FLATTEN inline void axpy(
    const QuantizedMatrix& w,
    const float* x,
    int64_t M,
    int64_t c0,
    int64_t c1,
    float* out,
    int64_t ldo) {
  using F = typename V::F;
  constexpr int kLanes = V::kLanes;
  constexpr int64_t kBlock = 256;
  float* w_row = scratch<float>(2, kBlock);
  float* scales = scratch<float>(1, w.groups() + kScalePadding);
  int64_t K = w.rows;
  for (int64_t b0 = c0; b0 < c1; b0 += kBlock) {
    int64_t b1 = std::min(c1, b0 + kBlock);
    int64_t width = b1 - b0;
    for (int64_t m = 0; m < M; ++m) {
      std::fill_n(out + m * ldo + b0 - c0, width, 0.0f);
    }
    for (int64_t k = 0; k < K; ++k) {
      decode_scales<V>(
          w,
          k,
          scales,
          b0 / w.group_size,
          (b1 + w.group_size - 1) / w.group_size);
      with_code_bits(w.bits, [&](auto bits) {
        dequantize_row<V, bits>(w, k, b0, b1, scales, w_row);
      });
      for (int64_t m = 0; m < M; ++m) {
        F xk = V::set1(x[m * K + k]);
        float* o = out + m * ldo + b0 - c0;
        int64_t j = 0;
        for (; j + kLanes <= width; j += kLanes) {
          V::store(o + j, V::fma(V::load(w_row + j), xk, V::load(o + j)));
        }
        for (; j < width; ++j) {
          o[j] += w_row[j] * x[m * K + k];
        }
      }
    }
  }
}

}  // namespace
}  // namespace mlx_fpqmm::cpu::simd
