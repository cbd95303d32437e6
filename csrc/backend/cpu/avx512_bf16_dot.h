// AVX-512 BF16: the small-M dots x @ W^T with bfloat16 x. Codes are decoded
// to bf16, products summed by vdpbf16ps per step, then scaled in float32 (so
// every scale type stays exact). Part of avx512.cpp's translation unit (see
// there).
#pragma once

#include <array>

#include "backend/cpu/avx512_bf16.h"
#include "backend/cpu/avx512_vec.h"
#include "backend/cpu/simd_decode.h"
#include "backend/cpu/simd_loops.h"
#include "backend/cpu/simd_nonfinite.h"

namespace mlx_fpqmm::cpu {
namespace {

template <int kBits>
struct Bf16Step {
  static constexpr int kElements = kBits == 4 ? 128 : 64;
  static constexpr int kVecs = kBits == 4 ? 4 : 2;

  static void decode(const uint8_t* row, int64_t c, __m512i* v) {
    if constexpr (kBits == 4) {
      decode_bf16_e2m1(row + c / 2, v);
    } else {
      v[0] = decode_bf16_e4m3(row + c);
      v[1] = decode_bf16_e4m3(row + c + 32);
    }
  }

  // Element offset (within the step) of x word i of vector v.
  static constexpr int element(int v, int i) {
    return kBits == 4 ? e2m1_step_element(v, i) : 32 * v + i;
  }

  static constexpr auto kOrder = [] {
    std::array<int16_t, kElements> order{};
    for (int v = 0; v < kVecs; ++v) {
      for (int i = 0; i < 32; ++i) {
        order[32 * v + i] = static_cast<int16_t>(element(v, i));
      }
    }
    return order;
  }();

  static void arrange(const bf16_bits* x, int64_t K, bf16_bits* dst) {
    int64_t k = 0;
    for (; k + kElements <= K; k += kElements) {
      for (int i = 0; i < kElements; ++i) {
        dst[k + i] = x[k + kOrder[i]];
      }
    }
    for (; k < K; ++k) {
      dst[k] = x[k];
    }
  }

  // Result lane l of vdpbf16ps on vector v sums words 2l, 2l + 1: lane_group
  // gives their group relative to the step's first group. Vectors v and
  // v + 2 (E2M1) or v alone (E4M3) share one scale vector s[v % 2].
  static __m512i lane_groups(int v, int group_size) {
    alignas(64) int32_t index[16];
    for (int l = 0; l < 16; ++l) {
      index[l] = element(v, 2 * l) / group_size;
    }
    return _mm512_load_si512(index);
  }
};

template <int kBits, int R, int MB>
MLX_FPQMM_FLATTEN void dot_bf16_block(
    const QuantizedMatrix& w,
    int64_t row,
    const float* scales,
    int64_t stride,
    const bf16_bits* xa,
    const __m512i* lane_groups,
    float* out,
    int64_t ldo) {
  using S = Bf16Step<kBits>;
  int64_t K = w.cols;
  int64_t full = K - K % S::kElements;
  int shift = simd::group_shift(w);
  __m512 acc[R][MB];
  MLX_FPQMM_UNROLL
  for (int r = 0; r < R; ++r) {
    MLX_FPQMM_UNROLL
    for (int m = 0; m < MB; ++m) {
      acc[r][m] = _mm512_setzero_ps();
    }
  }
  for (int64_t c = 0; c < full; c += S::kElements) {
    MLX_FPQMM_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint8_t* codes = w.row(row + r);
      __builtin_prefetch(codes + c * kBits / 8 + simd::kPrefetchDistance, 0, 2);
      __m512i d[S::kVecs];
      S::decode(codes, c, d);
      __m512 group_scales = _mm512_loadu_ps(scales + r * stride + (c >> shift));
      __m512 s[2];
      MLX_FPQMM_UNROLL
      for (int h = 0; h < 2; ++h) {
        s[h] = _mm512_permutexvar_ps(lane_groups[h], group_scales);
      }
      MLX_FPQMM_UNROLL
      for (int m = 0; m < MB; ++m) {
        const bf16_bits* x = xa + m * K + c;
        __m512 p[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        MLX_FPQMM_UNROLL
        for (int v = 0; v < S::kVecs; ++v) {
          p[v % 2] = dot_bf16(p[v % 2], d[v], _mm512_loadu_si512(x + 32 * v));
        }
        acc[r][m] = _mm512_fmadd_ps(p[0], s[0], acc[r][m]);
        acc[r][m] = _mm512_fmadd_ps(p[1], s[1], acc[r][m]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < MB; ++m) {
      float total = _mm512_reduce_add_ps(acc[r][m]);
      for (int64_t c = full; c < K; ++c) {
        total += bf16_to_float(xa[m * K + c]) * code_value(w, row + r, c) *
                 scales[r * stride + (c >> shift)];
      }
      out[m * ldo + r] = total;
    }
  }
}

// The narrow blocks of dot_bf16_impl: rows of W, and of x at most.
inline constexpr int kNarrowRows = 2;
inline constexpr int kNarrowXRows = 8;

template <int kBits>
void dot_bf16_impl(
    const QuantizedMatrix& w,
    const bf16_bits* x,
    int64_t M,
    int64_t n0,
    int64_t n1,
    float* out,
    int64_t ldo) {
  using S = Bf16Step<kBits>;
  int64_t K = w.cols;
  bf16_bits* xa = scratch<bf16_bits>(0, M * K);
  for (int64_t m = 0; m < M; ++m) {
    S::arrange(x + m * K, K, xa + m * K);
  }
  __m512i lane_groups[2] = {
      S::lane_groups(0, w.group_size), S::lane_groups(1, w.group_size)};
  int64_t stride = w.groups() + kScalePadding;
  float* scales = scratch<float>(1, simd::kRowBlock * stride);
  auto rows_of_w = [&]<int R>(int64_t n) {
    simd::decode_row_scales<Avx512Vec>(w, n, R, scales, stride);
    auto rows_of_x = [&]<int MB>(int64_t m) {
      dot_bf16_block<kBits, R, MB>(
          w,
          n,
          scales,
          stride,
          xa + m * K,
          lane_groups,
          out + m * ldo + n - n0,
          ldo);
    };
    if constexpr (R == kNarrowRows) {
      simd::for_x_blocks<kNarrowXRows>(M, rows_of_x);
    } else {
      simd::for_row_blocks(M, rows_of_x);
    }
    simd::redo_nonfinite_rows<Avx512Vec>(
        w, n, R, scales, stride, x, M, out + n - n0, ldo);
  };
  // Measured on Zen 4 (x of 2 to 11 rows by 14336 x 4096): 2 rows of W
  // with up to 8 of x take 6-24% less time than 4 rows with up to 4, but
  // for E4M3 codes at 2 to 4 rows of x (5-12% more).
  if (M > 1 && (kBits == 4 || M > 4)) {
    simd::for_w_rows<kNarrowRows>(M, K * sizeof(bf16_bits), n0, n1, rows_of_w);
  } else {
    simd::for_w_rows(M, K * sizeof(bf16_bits), n0, n1, rows_of_w);
  }
}

void dot_bf16_entry(
    const QuantizedMatrix& w,
    const bf16_bits* x,
    int64_t M,
    int64_t n0,
    int64_t n1,
    float* out,
    int64_t ldo) {
  with_code_bits(w.bits, [&](auto bits) {
    dot_bf16_impl<bits>(w, x, M, n0, n1, out, ldo);
  });
}

}  // namespace
}  // namespace mlx_fpqmm::cpu
