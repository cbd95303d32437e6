// The AVX-512 vector traits of the float32 kernels (simd_kernels.h), also
// used by the bf16 GEMM's packing. Part of avx512.cpp's translation unit
// (see there).
#pragma once

#include <immintrin.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_loops.h"

namespace mlx_fpqmm::cpu {

// Unnamed, as the simd_*.h headers (see simd_loops.h).
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
  // E4M3 from its bits (kernels.h's e4m3_from_top): the code in the top
  // byte of each lane, lower bits ignored; NaN comes out finite.
  static F e4m3_top(I top) {
    const __m512i bits = _mm512_and_si512(
        _mm512_srai_epi32(top, kE4M3TopShift),
        _mm512_set1_epi32(static_cast<int>(kE4M3TopMask)));
    return _mm512_mul_ps(
        _mm512_castsi512_ps(bits), _mm512_set1_ps(kE4M3TopFactor));
  }
  // The low byte of each lane as E4M3, NaN included.
  static F e4m3(I v) {
    const __m512i top = _mm512_slli_epi32(v, 24);
    const __m512i magnitude = _mm512_set1_epi32(0x7F000000);
    const __mmask16 nan =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(top, magnitude), magnitude);
    return _mm512_mask_mov_ps(
        e4m3_top(top), nan, _mm512_set1_ps(__builtin_nanf("")));
  }
  // A dot step of 64 E4M3 codes (16 words) as four vectors, vector i holding
  // byte i of each word (the default order), without the NaN test: NaN codes
  // come out finite and the kernels redo the rows that hold them
  // (simd::has_nan_codes).
  static void decode_e4m3_step(const uint8_t* p, F* d) {
    const __m512i words = load_words(p);
    MLX_FPQMM_UNROLL
    for (int i = 0; i < 4; ++i) {
      d[i] = e4m3_top(_mm512_slli_epi32(words, 24 - 8 * i));
    }
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

}  // namespace
}  // namespace mlx_fpqmm::cpu
