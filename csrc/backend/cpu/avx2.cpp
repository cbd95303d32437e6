// AVX2 + FMA kernels (x86-64 CPUs without AVX-512); this file alone is
// compiled with -mavx2 -mfma and only called after a CPU feature check.
#include <immintrin.h>

#include "backend/cpu/simd_kernels.h"

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
  static F add(F a, F b) {
    return _mm256_add_ps(a, b);
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
  // E4M3 from its bits (kernels.h's e4m3_from_top): the code in the top
  // byte of each lane, lower bits ignored; NaN comes out finite.
  static F e4m3_top(I top) {
    __m256i bits = _mm256_and_si256(
        _mm256_srai_epi32(top, kE4M3TopShift),
        _mm256_set1_epi32(static_cast<int>(kE4M3TopMask)));
    return _mm256_mul_ps(
        _mm256_castsi256_ps(bits), _mm256_set1_ps(kE4M3TopFactor));
  }
  // The low byte of each lane as E4M3, NaN included: magnitude 0x7F sets all
  // bits.
  static F e4m3(I v) {
    __m256i top = _mm256_slli_epi32(v, 24);
    __m256i magnitude = _mm256_set1_epi32(0x7F000000);
    __m256i nan =
        _mm256_cmpeq_epi32(_mm256_and_si256(top, magnitude), magnitude);
    return _mm256_or_ps(e4m3_top(top), _mm256_castsi256_ps(nan));
  }
  // A dot step of 32 E4M3 codes (8 words) as four vectors, vector i holding
  // byte i of each word (the default order): each byte shifted straight to
  // the top, without the NaN test, so NaN codes come out finite and the
  // kernels redo the rows that hold them (simd::has_nan_codes).
  static void decode_e4m3_step(const uint8_t* p, F* d) {
    __m256i words = load_words(p);
    for (int i = 0; i < 4; ++i) {
      d[i] = e4m3_top(_mm256_slli_epi32(words, 24 - 8 * i));
    }
  }
  // A dot step of 64 E2M1 codes (32 bytes) as eight vectors, by byte
  // shuffles: the low and high nibbles index kernels.h's bf16 byte tables,
  // the bytes are zipped into bf16 words, and each word vector splits into
  // its even words (shifted up) and odd words (masked) as floats. Vector
  // 4 * nibble + 2 * part + parity, lane 4 * half + j, holds the code of
  // nibble `nibble` of byte 16 * half + 8 * part + 2 * j + parity.
  static constexpr int e2m1_step_element(int v, int lane) {
    int byte = 16 * (lane / 4) + 8 * (v / 2 % 2) + 2 * (lane % 4) + v % 2;
    return 2 * byte + v / 4;
  }
  static void decode_e2m1_step(const uint8_t* p, F* d) {
    __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    __m256i low_nibble = _mm256_set1_epi8(0x0F);
    __m256i codes[2] = {
        _mm256_and_si256(bytes, low_nibble),
        _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibble)};
    __m256i table_lo = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kE2M1Bf16Bytes[0])));
    __m256i table_hi = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kE2M1Bf16Bytes[1])));
    __m256i upper_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int nibble = 0; nibble < 2; ++nibble) {
      __m256i lo = _mm256_shuffle_epi8(table_lo, codes[nibble]);
      __m256i hi = _mm256_shuffle_epi8(table_hi, codes[nibble]);
      __m256i words[2] = {
          _mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi)};
      for (int part = 0; part < 2; ++part) {
        F* out = d + 4 * nibble + 2 * part;
        out[0] = _mm256_castsi256_ps(_mm256_slli_epi32(words[part], 16));
        out[1] = _mm256_castsi256_ps(_mm256_and_si256(words[part], upper_half));
      }
    }
  }
  static I load_index(const int32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  // Lane j is p[index[j]], index[j] < 4.
  static F scale_lanes(const float* p, I index) {
    return _mm256_permutevar_ps(
        _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p)), index);
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
    return e4m3(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
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
      // Measured on Zen 3: the panel dots keep up with sgemm up to about 128
      // rows of x, the axpy kernel up to about 4.
      128,
      4,
      K::arranged_length,
      K::arrange_x,
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
