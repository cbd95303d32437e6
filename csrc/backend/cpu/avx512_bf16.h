// bfloat16 decoding for the AVX-512 BF16 kernels (avx512_bf16_dot.h,
// avx512_bf16_gemm.h), with the bf16 code tables of kernels.h. Part of
// avx512.cpp's translation unit (see there).
#pragma once

#include <immintrin.h>

#include "backend/cpu/kernels.h"

namespace mlx_fpqmm::cpu {
namespace {

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

}  // namespace
}  // namespace mlx_fpqmm::cpu
