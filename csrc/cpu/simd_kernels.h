// The float32 kernels, written once over an ISA's vector traits V and
// instantiated in each ISA's own translation unit (compiled with its flags).
//
// V provides: F (a vector of V::kLanes floats), zero, set1, set2 (lower half
// of the lanes one value, upper half another), load, store, fma(a, b, c) =
// a * b + c, mul, sum (horizontal); for the dot kernels an integer vector I
// with load_words (kLanes 32-bit words), shift_right, e2m1 / e4m3 (table
// lookups of the low 4 / 8 bits of each lane), load_index and permute
// (lanes of a float vector picked by index); for dequantizing,
// decode_e2m1(bytes, even, odd) (2 * kLanes E2M1 codes from kLanes bytes:
// elements 0, 2, 4, ... and 1, 3, 5, ...), decode_e4m3(bytes) (kLanes E4M3
// codes) and store_interleaved(dst, even, odd) (2 * kLanes floats back in
// element order). Decoding uses the tables of formats.h; tails shorter than
// one vector go through code_value().
#pragma once

#include <algorithm>
#include <bit>

#include "cpu/kernels.h"

// Inner loops inline every trait call so that their small fixed-count loops
// unroll and the accumulators stay in registers.
#define MLX_FPQMM_FLATTEN [[gnu::flatten]]
#define MLX_FPQMM_UNROLL _Pragma("GCC unroll 16")

namespace mlx_fpqmm::cpu {

// How far ahead of its reads a streaming kernel prefetches W (into L2):
// measured best between 4 and 8 KiB on Zen 4.
inline constexpr int64_t kPrefetchDistance = 4096;

// Scratch slots (thread_scratch) the kernels hold at once: 0 for x, 1 for
// scales, 2 for decoded rows and panels.
template <class V>
struct SimdKernels {
  using F = typename V::F;
  static constexpr int kLanes = V::kLanes;

  // Elements one decode step covers and the vectors it yields.
  template <int kBits>
  static constexpr int kStep = kBits == 4 ? 2 * kLanes : kLanes;
  template <int kBits>
  static constexpr int kVecs = kBits == 4 ? 2 : 1;

  // dst[g] for groups g in [g0, g1) of one row: the float scales, times the
  // global factor when asked.
  static void decode_scales(
      const QuantizedMatrix& w,
      int64_t row,
      float* dst,
      int64_t g0,
      int64_t g1,
      bool with_global_factor = true) {
    const auto* bytes =
        static_cast<const uint8_t*>(w.scales) + row * w.groups();
    if (w.scale_encoding == ScaleEncoding::e8m0) {
      for (int64_t g = g0; g < g1; ++g) {
        dst[g] = decode_e8m0(bytes[g]);
      }
    } else if (w.scale_encoding == ScaleEncoding::e4m3) {
      for (int64_t g = g0; g < g1; ++g) {
        dst[g] = kE4M3Values[bytes[g]];
      }
    } else {
      decode_float_scales(w, row, dst, g0, g1);
      return;
    }
    if (with_global_factor && w.global_factor != 1.0f) {
      for (int64_t g = g0; g < g1; ++g) {
        dst[g] *= w.global_factor;
      }
    }
  }

  // log2 of the group size (a power of two): shifts, not divisions, in the
  // inner loops.
  static int group_shift(const QuantizedMatrix& w) {
    return std::countr_zero(static_cast<unsigned>(w.group_size));
  }

  // Calls body.template operator()<R>(n) over blocks of R rows of W in
  // [n0, n1): kRowBlock rows at a time when several x rows, or one x row
  // larger than L1 (32 KiB on current x86 and arm64 cores), are read for
  // each row of W, so that each load of x serves several rows; otherwise
  // one row at a time (measured best either way on Zen 4).
  static constexpr int kRowBlock = 4;
  template <typename Body>
  static void for_w_rows(
      int64_t M, int64_t x_row_bytes, int64_t n0, int64_t n1, Body&& body) {
    constexpr int64_t kL1Bytes = 32 << 10;
    int64_t n = n0;
    if (M > 1 || x_row_bytes > kL1Bytes) {
      for (; n + kRowBlock <= n1; n += kRowBlock) {
        body.template operator()<kRowBlock>(n);
      }
    }
    for (; n < n1; ++n) {
      body.template operator()<1>(n);
    }
  }

  // Calls body.template operator()<MB>(m) over blocks of up to 4 rows of x.
  template <typename Body>
  static void for_row_blocks(int64_t M, Body&& body) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) {
      body.template operator()<4>(m);
    }
    switch (M - m) {
      case 3:
        body.template operator()<3>(m);
        break;
      case 2:
        body.template operator()<2>(m);
        break;
      case 1:
        body.template operator()<1>(m);
        break;
    }
  }

  // The scales of the elements of a step starting at column c, lane by lane.
  // Only 32 E2M1 codes (AVX-512) in groups of 16 span two groups (kSplit);
  // their lower lanes hold the first 16 elements.
  template <bool kSplit>
  static F step_scale(const float* scales, int64_t c, int shift) {
    int64_t g = c >> shift;
    if constexpr (kSplit) {
      return V::set2(scales[g], scales[g + 1]);
    } else {
      return V::set1(scales[g]);
    }
  }

  template <int kBits>
  static bool split(const QuantizedMatrix& w) {
    return kStep<kBits> > w.group_size;
  }

  template <int kBits>
  static void decode(const uint8_t* row, int64_t c, F* v) {
    if constexpr (kBits == 4) {
      V::decode_e2m1(row + c / 2, v[0], v[1]);
    } else {
      v[0] = V::decode_e4m3(row + c);
    }
  }

  // Dot steps read kLanes 32-bit words of codes. Vector i of a step holds, in
  // lane j, the code of element j * kPerWord + i: decoding takes one shift
  // and one table lookup per vector, and x is arranged to match once.
  template <int kBits>
  static constexpr int kPerWord = 32 / kBits;
  template <int kBits>
  static constexpr int kDotStep = kLanes * kPerWord<kBits>;

  template <int kBits>
  static void arrange(const float* x, int64_t K, float* dst) {
    constexpr int P = kPerWord<kBits>;
    int64_t k = 0;
    for (; k + kDotStep<kBits> <= K; k += kDotStep<kBits>) {
      for (int i = 0; i < P; ++i) {
        for (int j = 0; j < kLanes; ++j) {
          dst[k + i * kLanes + j] = x[k + j * P + i];
        }
      }
    }
    for (; k < K; ++k) {
      dst[k] = x[k];
    }
  }

  template <int kBits>
  static F decode_lane_codes(typename V::I words, int i) {
    if constexpr (kBits == 4) {
      return V::e2m1(V::shift_right(words, 4 * i));
    } else {
      return V::e4m3(V::shift_right(words, 8 * i));
    }
  }

  // R consecutive rows of W (codes and decoded scales, `stride` floats per
  // row) against MB rows of arranged x, all of K. One row at a time (when x
  // fits in L1) keeps a single sequential stream per thread, which the
  // prefetchers follow best; see for_w_rows.
  template <int kBits, int R, int MB>
  MLX_FPQMM_FLATTEN static void dot_block(
      const QuantizedMatrix& w,
      int64_t row,
      const float* scales,
      int64_t stride,
      const float* xa,
      float* out,
      int64_t ldo) {
    constexpr int P = kPerWord<kBits>;
    int64_t K = w.cols;
    int64_t full = K - K % kDotStep<kBits>;
    int shift = group_shift(w);
    // Lane j's group, relative to the step's first group.
    alignas(64) int32_t lane_groups[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      lane_groups[j] = (j * P) >> shift;
    }
    auto groups = V::load_index(lane_groups);
    F acc[R][MB];
    MLX_FPQMM_UNROLL
    for (int r = 0; r < R; ++r) {
      MLX_FPQMM_UNROLL
      for (int m = 0; m < MB; ++m) {
        acc[r][m] = V::zero();
      }
    }
    for (int64_t c = 0; c < full; c += kDotStep<kBits>) {
      MLX_FPQMM_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* step = w.row(row + r) + c * kBits / 8;
        __builtin_prefetch(step + kPrefetchDistance, 0, 2);
        auto words = V::load_words(step);
        F s = V::permute(V::load(scales + r * stride + (c >> shift)), groups);
        // Two partial sums per x row halve the dependent-FMA chains.
        F p[MB][2];
        MLX_FPQMM_UNROLL
        for (int m = 0; m < MB; ++m) {
          p[m][0] = V::zero();
          p[m][1] = V::zero();
        }
        MLX_FPQMM_UNROLL
        for (int i = 0; i < P; ++i) {
          F d = decode_lane_codes<kBits>(words, i);
          MLX_FPQMM_UNROLL
          for (int m = 0; m < MB; ++m) {
            p[m][i % 2] =
                V::fma(d, V::load(xa + m * K + c + i * kLanes), p[m][i % 2]);
          }
        }
        MLX_FPQMM_UNROLL
        for (int m = 0; m < MB; ++m) {
          acc[r][m] = V::fma(p[m][0], s, acc[r][m]);
          acc[r][m] = V::fma(p[m][1], s, acc[r][m]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int m = 0; m < MB; ++m) {
        float total = V::sum(acc[r][m]);
        for (int64_t c = full; c < K; ++c) {
          total += xa[m * K + c] * code_value(w, row + r, c) *
                   scales[r * stride + (c >> shift)];
        }
        out[m * ldo + r] = total;
      }
    }
  }

  // The dot kernels scale each group's sum of x * code, which matches the
  // reference's sum of x * (code * scale) only for finite scales (an infinite
  // scale times a ±0 code is NaN there). Rows of W [n, n + R) holding a
  // non-finite scale, rare, are redone element by element.
  // On the exponent bits, as a max-reduction: it vectorizes (the check runs
  // for every row of W) and survives -ffinite-math-only.
  static bool all_finite(const float* scales, int64_t count) {
    constexpr uint32_t kExponent = 0x7F800000u;
    uint32_t largest = 0;
    for (int64_t g = 0; g < count; ++g) {
      largest =
          std::max(largest, std::bit_cast<uint32_t>(scales[g]) & kExponent);
    }
    return largest != kExponent;
  }

  template <typename X>
  static void redo_nonfinite_rows(
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
      if (all_finite(row_scales, w.groups())) {
        continue;
      }
      for (int64_t m = 0; m < M; ++m) {
        out[m * ldo + r] = dot_by_element(w, n + r, row_scales, x + m * w.cols);
      }
    }
  }

  template <int kBits>
  static void dot_impl(
      const QuantizedMatrix& w,
      const float* x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
    int64_t K = w.cols;
    float* xa = scratch<float>(0, M * K);
    for (int64_t m = 0; m < M; ++m) {
      arrange<kBits>(x + m * K, K, xa + m * K);
    }
    int64_t stride = w.groups() + kScalePadding;
    float* scales = scratch<float>(1, kRowBlock * stride);
    for_w_rows(M, K * sizeof(float), n0, n1, [&]<int R>(int64_t n) {
      for (int r = 0; r < R; ++r) {
        decode_scales(w, n + r, scales + r * stride, 0, w.groups());
      }
      for_row_blocks(M, [&]<int MB>(int64_t m) {
        dot_block<kBits, R, MB>(
            w, n, scales, stride, xa + m * K, out + m * ldo + n - n0, ldo);
      });
      redo_nonfinite_rows(w, n, R, scales, stride, x, M, out + n - n0, ldo);
    });
  }

  static void dot(
      const QuantizedMatrix& w,
      const float* x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
    with_code_bits(
        w.bits, [&](auto bits) { dot_impl<bits>(w, x, M, n0, n1, out, ldo); });
  }

  // Decodes columns [c0, c1) of row r, scaled, into dst in element order.
  template <int kBits>
  MLX_FPQMM_FLATTEN static void dequantize_row(
      const QuantizedMatrix& w,
      int64_t r,
      int64_t c0,
      int64_t c1,
      const float* scales,
      float* dst) {
    const uint8_t* row = w.row(r);
    int shift = group_shift(w);
    int64_t c = c0;
    bool two_groups = split<kBits>(w);
    for (; c + kStep<kBits> <= c1; c += kStep<kBits>) {
      F s = two_groups ? step_scale<true>(scales, c, shift)
                       : step_scale<false>(scales, c, shift);
      F d[kVecs<kBits>];
      decode<kBits>(row, c, d);
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

  template <int kBits>
  static void dequantize_impl(
      const QuantizedMatrix& w,
      int64_t r0,
      int64_t r1,
      int64_t c0,
      int64_t c1,
      float* dst,
      int64_t ld) {
    float* scales = scratch<float>(1, w.groups() + kScalePadding);
    for (int64_t r = r0; r < r1; ++r) {
      decode_scales(
          w,
          r,
          scales,
          c0 / w.group_size,
          (c1 + w.group_size - 1) / w.group_size);
      dequantize_row<kBits>(w, r, c0, c1, scales, dst + (r - r0) * ld);
    }
  }

  static void dequantize(
      const QuantizedMatrix& w,
      int64_t r0,
      int64_t r1,
      int64_t c0,
      int64_t c1,
      float* dst,
      int64_t ld) {
    with_code_bits(w.bits, [&](auto bits) {
      dequantize_impl<bits>(w, r0, r1, c0, c1, dst, ld);
    });
  }

  // x @ W with W (K, N): each row of W is decoded once, in blocks of columns
  // that stay in L1, and added into every x row's accumulators.
  MLX_FPQMM_FLATTEN static void axpy(
      const QuantizedMatrix& w,
      const float* x,
      int64_t M,
      int64_t c0,
      int64_t c1,
      float* out,
      int64_t ldo) {
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
        decode_scales(
            w,
            k,
            scales,
            b0 / w.group_size,
            (b1 + w.group_size - 1) / w.group_size);
        with_code_bits(w.bits, [&](auto bits) {
          dequantize_row<bits>(w, k, b0, b1, scales, w_row);
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
};

}  // namespace mlx_fpqmm::cpu
