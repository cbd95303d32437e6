// AVX-512 kernels (F, BW, VL, DQ, and BF16 for the bf16 kernels: Zen 4,
// Sapphire Rapids and later); this file alone is compiled with those flags
// and only called after a CPU feature check.
#include <immintrin.h>

#include <array>
#include <bit>
#include <cstring>
#include <utility>

#include "backend/cpu/simd_kernels.h"

namespace mlx_fpqmm::cpu {

namespace {

struct Avx512Vec {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;

  static F zero() {
    return _mm512_setzero_ps();
  }
  static F set1(float v) {
    return _mm512_set1_ps(v);
  }
  static F set2(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
  }
  static F load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  static void store(float* p, F v) {
    _mm512_storeu_ps(p, v);
  }
  static F fma(F a, F b, F c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  static F mul(F a, F b) {
    return _mm512_mul_ps(a, b);
  }
  static F add(F a, F b) {
    return _mm512_add_ps(a, b);
  }
  static float sum(F v) {
    return _mm512_reduce_add_ps(v);
  }
  static I load_words(const uint8_t* p) {
    return _mm512_loadu_si512(p);
  }
  static I shift_right(I v, int bits) {
    return _mm512_srli_epi32(v, bits);
  }
  // vpermps reads the low 4 bits of each lane: one lookup per 16 codes.
  static F e2m1(I v) {
    return _mm512_permutexvar_ps(v, _mm512_loadu_ps(kE2M1Values.data()));
  }
  // The 128 magnitudes sit in eight registers: vpermt2ps picks among 32 by
  // the low 5 bits, bits 5 and 6 pick the quarter, bit 7 is the sign bit.
  static F e4m3(I v) {
    F quarter[4];
    MLX_FPQMM_UNROLL
    for (int q = 0; q < 4; ++q) {
      const float* table = kE4M3Values.data() + 32 * q;
      quarter[q] = _mm512_permutex2var_ps(
          _mm512_loadu_ps(table), v, _mm512_loadu_ps(table + 16));
    }
    __mmask16 bit5 = _mm512_test_epi32_mask(v, _mm512_set1_epi32(0x20));
    __mmask16 bit6 = _mm512_test_epi32_mask(v, _mm512_set1_epi32(0x40));
    F magnitude = _mm512_mask_blend_ps(
        bit6,
        _mm512_mask_blend_ps(bit5, quarter[0], quarter[1]),
        _mm512_mask_blend_ps(bit5, quarter[2], quarter[3]));
    // magnitude | (v << 24 & sign bit)
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(magnitude),
        _mm512_slli_epi32(v, 24),
        _mm512_set1_epi32(static_cast<int>(0x80000000u)),
        0xF8));
  }
  static I load_index(const int32_t* p) {
    return _mm512_loadu_si512(p);
  }
  static F permute(F table, I index) {
    return _mm512_permutexvar_ps(index, table);
  }
  static __m512i bytes_to_lanes(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void decode_e2m1(const uint8_t* p, F& even, F& odd) {
    __m512i bytes = bytes_to_lanes(p);
    even = e2m1(bytes);
    odd = e2m1(_mm512_srli_epi32(bytes, 4));
  }
  static F decode_e4m3(const uint8_t* p) {
    return e4m3(bytes_to_lanes(p));
  }
  static void store_interleaved(float* dst, F even, F odd) {
    __m512i lo = _mm512_setr_epi32(
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    _mm512_storeu_ps(dst, _mm512_permutex2var_ps(even, lo, odd));
    _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(even, hi, odd));
  }
};

using Kernels = SimdKernels<Avx512Vec>;

// ---------------------------------------------------------------------------
// bfloat16 decoding, with the bf16 code tables of kernels.h.

// 128 E2M1 codes (64 bytes) as four vectors of 32 bf16. In 128-bit lane L,
// word j of v[0] is element 32L + 2j, of v[1] 32L + 16 + 2j, of v[2] and v[3]
// the odd elements after those.
void decode_bf16_e2m1(const uint8_t* p, __m512i* v) {
  __m512i bytes = _mm512_loadu_si512(p);
  __m512i low_nibble = _mm512_set1_epi8(0x0F);
  __m512i lo = _mm512_and_si512(bytes, low_nibble);
  __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibble);
  __m512i table_lo = _mm512_broadcast_i32x4(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kE2M1Bf16Bytes[0])));
  __m512i table_hi = _mm512_broadcast_i32x4(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kE2M1Bf16Bytes[1])));
  __m512i codes[2] = {lo, hi};
  for (int h = 0; h < 2; ++h) {
    __m512i low_bytes = _mm512_shuffle_epi8(table_lo, codes[h]);
    __m512i high_bytes = _mm512_shuffle_epi8(table_hi, codes[h]);
    v[2 * h] = _mm512_unpacklo_epi8(low_bytes, high_bytes);
    v[2 * h + 1] = _mm512_unpackhi_epi8(low_bytes, high_bytes);
  }
}

// Offset of the element that x word i of vector v in a 128-element E2M1
// step pairs with, matching decode_bf16_e2m1.
constexpr int e2m1_step_element(int v, int i) {
  constexpr int kOffsets[4] = {0, 16, 1, 17};
  return 32 * (i / 8) + kOffsets[v] + 2 * (i % 8);
}

// 32 E4M3 codes (32 bytes) as 32 bf16 in element order: two 64-entry word
// lookups cover the 128 magnitudes, then the sign bit is or-ed in.
__m512i decode_bf16_e4m3(const uint8_t* p) {
  const auto* table =
      reinterpret_cast<const __m512i*>(kE4M3Bf16Magnitudes.data());
  __m512i codes = _mm512_cvtepu8_epi16(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  __m512i low = _mm512_permutex2var_epi16(
      _mm512_loadu_si512(table), codes, _mm512_loadu_si512(table + 1));
  __m512i high = _mm512_permutex2var_epi16(
      _mm512_loadu_si512(table + 2), codes, _mm512_loadu_si512(table + 3));
  __m512i magnitude = _mm512_mask_mov_epi16(
      low, _mm512_test_epi16_mask(codes, _mm512_set1_epi16(0x40)), high);
  // magnitude | (codes << 8 & 0x8000)
  return _mm512_ternarylogic_epi32(
      magnitude,
      _mm512_slli_epi16(codes, 8),
      _mm512_set1_epi16(static_cast<int16_t>(0x8000)),
      0xF8);
}

__m512 dot_bf16(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// ---------------------------------------------------------------------------
// Small M, bf16 x: codes decoded to bf16, products summed by vdpbf16ps per
// step, then scaled in float32 (so every scale type stays exact).

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
  int shift = Kernels::group_shift(w);
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
      __builtin_prefetch(codes + c * kBits / 8 + kPrefetchDistance, 0, 2);
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
  float* scales = scratch<float>(1, Kernels::kRowBlock * stride);
  Kernels::for_w_rows(M, K * sizeof(bf16_bits), n0, n1, [&]<int R>(int64_t n) {
    Kernels::decode_row_scales(w, n, R, scales, stride);
    Kernels::for_row_blocks(M, [&]<int MB>(int64_t m) {
      dot_bf16_block<kBits, R, MB>(
          w,
          n,
          scales,
          stride,
          xa + m * K,
          lane_groups,
          out + m * ldo + n - n0,
          ldo);
    });
    Kernels::redo_nonfinite_rows(
        w, n, R, scales, stride, x, M, out + n - n0, ldo);
  });
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

// ---------------------------------------------------------------------------
// Large M, bf16 x: W is decoded (scaled, exact in bf16) into panels of
// kPanel rows x kDepth columns, packed as pairs of columns for vdpbf16ps:
// panel[p * kPanel + n] holds W[n, k], W[n, k'] for the p-th pair. The
// kernel keeps a kRows x kPanel tile of the output in registers and
// broadcasts pairs of x.

constexpr int kPanel = 32;        // two vectors of output columns
constexpr int kRows = 12;         // 24 accumulators
constexpr int64_t kDepth = 2048;  // a panel is 128 KiB: it stays in L2
constexpr int kPackStep = 32;     // elements per decode step while packing

// Element order within a packing step: E2M1 steps are decoded as even and
// odd elements (as SimdKernels does), E4M3 steps in element order.
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
    __m512 s = gs < 32 ? Kernels::step_scale<true>(scales, c, shift)
                       : Kernels::step_scale<false>(scales, c, shift);
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
      Kernels::decode_scales(
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

const IsaKernels* avx512_kernels() {
  static const IsaKernels kernels{
      "avx512",
      96,  // Zen 4, both orientations
      96,
      Kernels::arranged_length,
      Kernels::arrange_x,
      Kernels::dot,
      Kernels::axpy,
      Kernels::dequantize,
      dot_bf16_entry,
      arrange_x_bf16_entry,
      gemm_bf16_entry,
  };
  return &kernels;
}

}  // namespace mlx_fpqmm::cpu
