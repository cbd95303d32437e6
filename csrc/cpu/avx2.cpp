// AVX2 + FMA kernels (x86-64 CPUs without AVX-512); this file alone is
// compiled with -mavx2 -mfma and only called after a CPU feature check.
#include <immintrin.h>

#include "cpu/simd_kernels.h"

namespace mlx_fpqmm::cpu {

namespace {

struct Avx2Vec {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;

  static F zero() {
    return _mm256_setzero_ps();
  }
  static F set1(float v) {
    return _mm256_set1_ps(v);
  }
  static F set2(float lo, float hi) {
    return _mm256_setr_m128(_mm_set1_ps(lo), _mm_set1_ps(hi));
  }
  static F load(const float* p) {
    return _mm256_loadu_ps(p);
  }
  static void store(float* p, F v) {
    _mm256_storeu_ps(p, v);
  }
  static F fma(F a, F b, F c) {
    return _mm256_fmadd_ps(a, b, c);
  }
  static F mul(F a, F b) {
    return _mm256_mul_ps(a, b);
  }
  static float sum(F v) {
    __m128 s =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  // The low nibble of each lane indexes the 16-entry table (higher bits are
  // ignored): vpermps reads 3 index bits, so bit 3 picks the table's half.
  static F lookup_e2m1(__m256i nibbles) {
    F low = _mm256_permutevar8x32_ps(_mm256_loadu_ps(&kE2M1Values[0]), nibbles);
    F high =
        _mm256_permutevar8x32_ps(_mm256_loadu_ps(&kE2M1Values[8]), nibbles);
    return _mm256_blendv_ps(
        low, high, _mm256_castsi256_ps(_mm256_slli_epi32(nibbles, 28)));
  }
  static I load_words(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static I shift_right(I v, int bits) {
    return _mm256_srli_epi32(v, bits);
  }
  static F e2m1(I v) {
    return lookup_e2m1(v);
  }
  static F e4m3(I v) {
    return _mm256_i32gather_ps(
        kE4M3Values.data(), _mm256_and_si256(v, _mm256_set1_epi32(0xFF)), 4);
  }
  static I load_index(const int32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static F permute(F table, I index) {
    return _mm256_permutevar8x32_ps(table, index);
  }
  static void decode_e2m1(const uint8_t* p, F& even, F& odd) {
    __m256i bytes = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    even = lookup_e2m1(bytes);
    odd = lookup_e2m1(_mm256_srli_epi32(bytes, 4));
  }
  static F decode_e4m3(const uint8_t* p) {
    __m256i bytes = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_i32gather_ps(kE4M3Values.data(), bytes, 4);
  }
  static void store_interleaved(float* dst, F even, F odd) {
    F lo = _mm256_unpacklo_ps(even, odd);  // e0 o0 e1 o1 | e4 o4 e5 o5
    F hi = _mm256_unpackhi_ps(even, odd);  // e2 o2 e3 o3 | e6 o6 e7 o7
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
};

}  // namespace

const IsaKernels* avx2_kernels() {
  using K = SimdKernels<Avx2Vec>;
  static const IsaKernels kernels{
      "avx2",
      K::dot,
      K::axpy,
      K::dequantize,
      nullptr,
      nullptr,
      nullptr,
  };
  return &kernels;
}

}  // namespace mlx_fpqmm::cpu
