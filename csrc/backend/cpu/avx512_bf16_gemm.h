// AVX-512 BF16: the large-M GEMM x @ W^T with bfloat16 x, for the formats
// whose scaled codes are exact in bfloat16. Part of avx512.cpp's translation
// unit (see there).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <utility>

#include "backend/cpu/avx512_bf16.h"
#include "backend/cpu/avx512_vec.h"
#include "backend/cpu/simd_decode.h"
#include "backend/cpu/simd_loops.h"

namespace mlx_fpqmm::cpu {
namespace {

// W is decoded (scaled, exact in bf16) into panels of
// kPanel rows x kDepth columns, packed as pairs of columns for vdpbf16ps:
// panel[p * kPanel + n] holds W[n, k], W[n, k'] for the p-th pair. The
// kernel keeps a kRows x kPanel tile of the output in registers and
// broadcasts pairs of x.

constexpr int kPanel = 32;        // two vectors of output columns
constexpr int kRows = 12;         // 24 accumulators
constexpr int64_t kDepth = 2048;  // a panel is 128 KiB: it stays in L2
constexpr int kPackStep = 32;     // elements per decode step while packing

// Element order within a packing step: E2M1 steps are decoded as even and
// odd elements (as simd::decode does), E4M3 steps in element order.
template <int kBits>
constexpr int pack_element(int i) {
  return kBits == 4 ? (i < 16 ? 2 * i : 2 * (i - 16) + 1) : i;
}

template <int kBits>
void arrange_for_gemm(const bf16_bits* x, int64_t K, bf16_bits* dst) {
  int64_t k = 0;
  for (; k + kPackStep <= K; k += kPackStep) {
    for (int i = 0; i < kPackStep; ++i) {
      dst[k + i] = x[k + pack_element<kBits>(i)];
    }
  }
  for (; k < K; ++k) {
    dst[k] = x[k];
  }
}

// 32 scaled elements of one row as 16 dwords of bf16 pairs.
template <int kBits>
__m512i pack_step(const uint8_t* row, int64_t c, const float* scales, int gs) {
  __m512 first, second;
  if constexpr (kBits == 4) {
    Avx512Vec::decode_e2m1(row + c / 2, first, second);
    int shift = std::countr_zero(static_cast<unsigned>(gs));
    __m512 s = gs < 32 ? simd::step_scale<Avx512Vec, true>(scales, c, shift)
                       : simd::step_scale<Avx512Vec, false>(scales, c, shift);
    first = _mm512_mul_ps(first, s);
    second = _mm512_mul_ps(second, s);
  } else {
    __m512i words = decode_bf16_e4m3(row + c);
    auto widen = [](__m256i half) {
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    };
    first = _mm512_mul_ps(
        widen(_mm512_castsi512_si256(words)), _mm512_set1_ps(scales[c / gs]));
    second = _mm512_mul_ps(
        widen(_mm512_extracti64x4_epi64(words, 1)),
        _mm512_set1_ps(scales[(c + 16) / gs]));
  }
  // Exact: the products have at most 6 significant bits.
  return (__m512i)_mm512_cvtne2ps_pbh(second, first);
}

// Transposes 16 rows of 16 dwords in registers.
void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  __m512i u[4][4];  // u[G][q], lane L: rows 4G..4G+3 of column 4L+q
  for (int g = 0; g < 4; ++g) {
    u[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    __m512i v0 = _mm512_shuffle_i32x4(u[0][q], u[1][q], 0x44);
    __m512i v1 = _mm512_shuffle_i32x4(u[0][q], u[1][q], 0xEE);
    __m512i v2 = _mm512_shuffle_i32x4(u[2][q], u[3][q], 0x44);
    __m512i v3 = _mm512_shuffle_i32x4(u[2][q], u[3][q], 0xEE);
    r[q] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + q] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + q] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// Packs rows [n, n + kPanel) (zeros past n1) and columns [k0, k1) of W.
template <int kBits>
MLX_FPQMM_FLATTEN void pack_panel(
    const QuantizedMatrix& w,
    int64_t n,
    int64_t n1,
    int64_t k0,
    int64_t k1,
    const float* scales,
    int64_t scale_stride,
    uint32_t* panel) {
  int64_t full = k0 + (k1 - k0) / kPackStep * kPackStep;
  for (int half = 0; half < kPanel / 16; ++half) {
    for (int64_t c = k0; c < full; c += kPackStep) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        int64_t row = n + 16 * half + i;
        r[i] = row < n1 ? pack_step<kBits>(
                              w.row(row),
                              c,
                              scales + (row - n) * scale_stride,
                              w.group_size)
                        : _mm512_setzero_si512();
      }
      transpose16(r);
      uint32_t* dst = panel + (c - k0) / 2 * kPanel + 16 * half;
      for (int p = 0; p < 16; ++p) {
        _mm512_storeu_si512(dst + p * kPanel, r[p]);
      }
    }
  }
  // A tail of 16 elements (groups of 16), in element order.
  for (int64_t c = full; c < k1; c += 2) {
    for (int i = 0; i < kPanel; ++i) {
      uint32_t pair = 0;
      int64_t row = n + i;
      if (row < n1) {
        const float* s = scales + i * scale_stride;
        for (int j = 0; j < 2; ++j) {
          float value = code_value(w, row, c + j) * s[(c + j) / w.group_size];
          pair |= static_cast<uint32_t>(bf16_of_exact(value)) << (16 * j);
        }
      }
      panel[(c - k0) / 2 * kPanel + i] = pair;
    }
  }
}

// out rows [0, MR) x kPanel columns (the first `columns` stored) +=
// x rows . panel over `pairs` column pairs; `first` starts from zero.
template <int MR>
MLX_FPQMM_FLATTEN void gemm_tile(
    const bf16_bits* x,
    int64_t ldx,
    const uint32_t* panel,
    int64_t pairs,
    float* out,
    int64_t ldo,
    int columns,
    bool first,
    float factor) {
  __m512 acc[MR][2];
  MLX_FPQMM_UNROLL
  for (int i = 0; i < MR; ++i) {
    acc[i][0] = _mm512_setzero_ps();
    acc[i][1] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i b0 = _mm512_loadu_si512(panel + p * kPanel);
    __m512i b1 = _mm512_loadu_si512(panel + p * kPanel + 16);
    MLX_FPQMM_UNROLL
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, x + i * ldx + 2 * p, sizeof(pair));
      __m512i a = _mm512_set1_epi32(pair);
      acc[i][0] = dot_bf16(acc[i][0], a, b0);
      acc[i][1] = dot_bf16(acc[i][1], a, b1);
    }
  }
  __mmask16 masks[2] = {
      static_cast<__mmask16>((1u << std::min(columns, 16)) - 1),
      static_cast<__mmask16>((1u << std::max(columns - 16, 0)) - 1)};
  __m512 scale = _mm512_set1_ps(factor);
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < 2; ++h) {
      float* o = out + i * ldo + 16 * h;
      __m512 value = acc[i][h];
      if (!first) {
        value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(masks[h], o));
      }
      _mm512_mask_storeu_ps(o, masks[h], _mm512_mul_ps(value, scale));
    }
  }
}

using TileKernel = void (*)(
    const bf16_bits*,
    int64_t,
    const uint32_t*,
    int64_t,
    float*,
    int64_t,
    int,
    bool,
    float);

constexpr auto kTileKernels = []<size_t... I>(std::index_sequence<I...>) {
  return std::array<TileKernel, sizeof...(I)>{&gemm_tile<I + 1>...};
}(std::make_index_sequence<kRows>{});

template <int kBits>
void gemm_bf16_impl(
    const QuantizedMatrix& w,
    const bf16_bits* xa,
    int64_t M,
    int64_t n0,
    int64_t n1,
    float* out,
    int64_t ldo) {
  int64_t K = w.cols;
  int64_t stride = w.groups() + kScalePadding;
  float* scales = scratch<float>(1, kPanel * stride);
  uint32_t* panel = scratch<uint32_t>(2, kDepth / 2 * kPanel);
  for (int64_t n = n0; n < n1; n += kPanel) {
    int64_t rows = std::min<int64_t>(kPanel, n1 - n);
    for (int64_t r = 0; r < rows; ++r) {
      // Scales without the global factor keep the codes exact in bf16; the
      // factor multiplies the result instead.
      simd::decode_scales<Avx512Vec>(
          w, n + r, scales + r * stride, 0, w.groups(), false);
    }
    for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
      int64_t k1 = std::min(K, k0 + kDepth);
      pack_panel<kBits>(w, n, n + rows, k0, k1, scales, stride, panel);
      bool first = k0 == 0;
      float factor = k1 == K ? w.global_factor : 1.0f;
      for (int64_t m = 0; m < M; m += kRows) {
        int tile_rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
        kTileKernels[tile_rows - 1](
            xa + m * K + k0,
            K,
            panel,
            (k1 - k0) / 2,
            out + m * ldo + (n - n0),
            ldo,
            static_cast<int>(rows),
            first,
            factor);
      }
    }
  }
}

void arrange_x_bf16_entry(
    const QuantizedMatrix& w,
    const bf16_bits* x,
    int64_t rows,
    bf16_bits* arranged) {
  with_code_bits(w.bits, [&](auto bits) {
    for (int64_t m = 0; m < rows; ++m) {
      arrange_for_gemm<bits>(x + m * w.cols, w.cols, arranged + m * w.cols);
    }
  });
}

void gemm_bf16_entry(
    const QuantizedMatrix& w,
    const bf16_bits* arranged_x,
    int64_t M,
    int64_t n0,
    int64_t n1,
    float* out,
    int64_t ldo) {
  with_code_bits(w.bits, [&](auto bits) {
    gemm_bf16_impl<bits>(w, arranged_x, M, n0, n1, out, ldo);
  });
}

}  // namespace
}  // namespace mlx_fpqmm::cpu
