// The float32 kernels, written once over an ISA's vector traits V and
// instantiated in each ISA's own translation unit (compiled with its flags):
// SimdKernels<V> gives the entries of an IsaKernels table, composed from
//   simd_decode.h      scales and codes decoded into vectors, x arranged
//   simd_dot.h         the fused dots (few rows of x)
//   simd_panels.h      the panel dots (more rows of x)
//   simd_nonfinite.h   the rows both dots redo element by element
//   simd_dequantize.h  dequantized rows, and x @ W from them
//   simd_loops.h       the macros and row-block loops they all share
//
// V provides: F (a vector of V::kLanes floats), zero, set1, set2 (lower half
// of the lanes one value, upper half another), load, store, fma(a, b, c) =
// a * b + c, mul, add, sum (horizontal); for the dot kernels an integer vector
// I with load_words (kLanes 32-bit words), shift_right, e2m1 / e4m3 (the
// values of the low 4 / 8 bits of each lane; e2m1 not needed with
// decode_e2m1_step and e2m1_step_element, which decode a whole step),
// load_index and permute (lanes of a float vector picked by index),
// optionally scale_lanes (see kScaleLanes) and decode_e4m3_step (see
// kOwnE4M3Step); for dequantizing, decode_e2m1(bytes, even, odd) (2 * kLanes
// E2M1 codes from kLanes bytes: elements 0, 2, 4, ... and 1, 3, 5, ...),
// decode_e4m3(bytes) (kLanes E4M3 codes) and store_interleaved(dst, even,
// odd) (2 * kLanes floats back in element order). Decoding uses the tables
// of formats.h; tails shorter than one vector go through code_value().
#pragma once

#include <algorithm>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_decode.h"
#include "backend/cpu/simd_dequantize.h"
#include "backend/cpu/simd_dot.h"
#include "backend/cpu/simd_loops.h"
#include "backend/cpu/simd_nonfinite.h"
#include "backend/cpu/simd_panels.h"

namespace mlx_fpqmm::cpu {

template <class V>
struct SimdKernels {
  // x for dot: `rows` rows in step order, arranged_length(w) floats each.
  static int64_t arranged_length(const QuantizedMatrix& w) {
    return w.bits == 4 ? simd::padded_length<V, 4>(w.cols)
                       : simd::padded_length<V, 8>(w.cols);
  }
  static void arrange_x(
      const QuantizedMatrix& w, const float* x, int64_t rows, float* arranged) {
    with_code_bits(w.bits, [&](auto bits) {
      int64_t ldx = simd::padded_length<V, bits>(w.cols);
      for (int64_t m = 0; m < rows; ++m) {
        simd::arrange<V, bits>(x + m * w.cols, w.cols, arranged + m * ldx);
      }
    });
  }

  // The fused dots of MB rows of x whose rows outgrow L1: K in chunks, for
  // kChunkRows rows of W at a time.
  template <int kBits, int kClasses, int MB>
  static void dot_chunks(
      const QuantizedMatrix& w,
      const float* x,
      const float* xa,
      int64_t ldx,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
    constexpr int64_t kStep = simd::kDotStep<V, kBits>;
    const int64_t K = w.cols;
    const int64_t chunk = std::max(
        kStep,
        simd::kFusedXBytes / (MB * int64_t(sizeof(float))) / kStep * kStep);
    const int64_t stride = w.groups() + kScalePadding;
    float* scales = scratch<float>(1, simd::kChunkRows * stride);
    for (int64_t n = n0; n < n1; n += simd::kChunkRows) {
      const int rows =
          static_cast<int>(std::min<int64_t>(simd::kChunkRows, n1 - n));
      simd::decode_row_scales<V>(w, n, rows, scales, stride);
      for (int64_t c = 0; c < K; c += chunk) {
        for (int r = 0; r < rows; ++r) {
          simd::dot_block<V, kBits, 1, MB, kClasses>(
              w,
              n + r,
              scales + r * stride,
              stride,
              xa,
              ldx,
              out + n + r - n0,
              ldo,
              c,
              std::min(K, c + chunk));
        }
      }
      simd::redo_nonfinite_rows<V>(
          w, n, rows, scales, stride, x, MB, out + n - n0, ldo);
    }
  }

  // The fused dots for up to kFusedRows rows of x, the panels for more.
  template <int kBits, int kClasses>
  static void dot_impl(
      const QuantizedMatrix& w,
      const float* x,
      const float* xa,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
    int64_t K = w.cols;
    int64_t ldx = simd::padded_length<V, kBits>(K);
    if (M <= simd::kFusedRows) {
      int64_t stride = w.groups() + kScalePadding;
      float* scales = scratch<float>(1, simd::kRowBlock * stride);
      auto rows = [&]<int R, int MB>(int64_t n) {
        simd::decode_row_scales<V>(w, n, R, scales, stride);
        simd::dot_block<V, kBits, R, MB, kClasses>(
            w, n, scales, stride, xa, ldx, out + n - n0, ldo);
        simd::redo_nonfinite_rows<V>(
            w, n, R, scales, stride, x, M, out + n - n0, ldo);
      };
      if (M == 1) {
        simd::for_w_rows(1, K * sizeof(float), n0, n1, [&]<int R>(int64_t n) {
          rows.template operator()<R, 1>(n);
        });
      } else if (M * ldx * int64_t(sizeof(float)) <= simd::kL1Bytes) {
        simd::with_count<simd::kFusedRows>(M, [&]<int MB>() {
          for (int64_t n = n0; n < n1; ++n) {
            rows.template operator()<1, MB>(n);
          }
        });
      } else {
        simd::with_count<simd::kFusedRows>(M, [&]<int MB>() {
          dot_chunks<kBits, kClasses, MB>(w, x, xa, ldx, n0, n1, out, ldo);
        });
      }
      return;
    }
    simd::dot_panels<V, kBits, kClasses>(w, x, xa, ldx, M, n0, n1, out, ldo);
  }
  static void dot(
      const QuantizedMatrix& w,
      const float* x,
      const float* arranged_x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
    with_code_bits(w.bits, [&](auto bits) {
      if (w.group_size < 32) {
        dot_impl<bits, 2>(w, x, arranged_x, M, n0, n1, out, ldo);
      } else {
        dot_impl<bits, 1>(w, x, arranged_x, M, n0, n1, out, ldo);
      }
    });
  }

  static constexpr auto axpy = &simd::axpy<V>;

  static void dequantize(
      const QuantizedMatrix& w,
      int64_t r0,
      int64_t r1,
      int64_t c0,
      int64_t c1,
      float* dst,
      int64_t ld) {
    with_code_bits(w.bits, [&](auto bits) {
      simd::dequantize_rows<V, bits>(w, r0, r1, c0, c1, dst, ld);
    });
  }
};

}  // namespace mlx_fpqmm::cpu
