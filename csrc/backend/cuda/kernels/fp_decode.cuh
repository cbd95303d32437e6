// Decoding of fp codes and group scales on NVIDIA GPUs: the rules of
// common/formats.h (MLX 0.32.4) as bit manipulations on pairs of codes,
// the two halves of a half2 / bfloat162, exact in both.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/scale_encoding.h"

namespace fpqmm::cuda {

// The 16-bit float type the mma steps multiply in: half for half x,
// bfloat16 for bfloat16 and float32 x (float32 x as bfloat16 pairs, see
// split_x).
template <typename T>
struct MmaType {
  using type = __nv_bfloat16;
};
template <>
struct MmaType<__half> {
  using type = __half;
};

template <typename H>
struct Pair;
template <>
struct Pair<__half> {
  using type = __half2;
};
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
};

template <typename P>
__device__ __forceinline__ P pair_from_bits(uint32_t bits) {
  return *reinterpret_cast<const P*>(&bits);
}

template <typename P>
__device__ __forceinline__ uint32_t bits_of(P pair) {
  return *reinterpret_cast<const uint32_t*>(&pair);
}

template <typename P>
__device__ __forceinline__ P splat(float value) {
  if constexpr (std::is_same_v<P, __half2>) {
    return __float2half2_rn(value);
  } else {
    return __float2bfloat162_rn(value);
  }
}

// Mantissa bits and exponent bias of the 16-bit floats and of the codes
// (E2M1: 4 bits, E4M3: 8).
template <typename H>
struct FloatFormat {
  static constexpr int mantissa_bits = 7;  // bfloat16
  static constexpr int bias = 127;
};
template <>
struct FloatFormat<__half> {
  static constexpr int mantissa_bits = 10;
  static constexpr int bias = 15;
};
template <int bits>
struct CodeFormat {
  static constexpr int mantissa_bits = bits == 4 ? 1 : 3;
  static constexpr int bias = bits == 4 ? 1 : 7;
};

// Where a code's magnitude bits go in a 16-bit float, and the power of two
// that then restores its value (2^fixup_exponent, as a pair: fixup): the
// code's exponent bits become the float's low exponent bits and its
// mantissa bits the float's top mantissa bits, so the value is off by the
// difference of the biases; the codes' subnormals land on the float's
// subnormals, which the multiply makes normal again.
template <typename H>
__host__ __device__ constexpr uint32_t power_of_two_pair(int exponent) {
  return (uint32_t(FloatFormat<H>::bias + exponent)
          << FloatFormat<H>::mantissa_bits) *
         0x00010001u;
}

template <typename H, int bits>
struct CodeLayout {
  static constexpr int magnitude_bit =
      FloatFormat<H>::mantissa_bits - CodeFormat<bits>::mantissa_bits;
  static constexpr int fixup_exponent =
      FloatFormat<H>::bias - CodeFormat<bits>::bias;
  static constexpr uint32_t fixup = power_of_two_pair<H>(fixup_exponent);
};

// Codes p and p + 16 / bits of `word` (16 bits apart) as the low and high
// halves of a pair, each the code's value divided by the layout's fixup
// (exactly: the float's subnormals included). E4M3 magnitude 0x7F is NaN:
// only its increment carries past the magnitude bits, and that carry,
// spread over the float's remaining exponent bits, makes the pair's half a
// NaN.
template <typename H, int bits>
__host__ __device__ __forceinline__ uint32_t
code_pair_bits(uint32_t word, int p) {
  using Layout = CodeLayout<H, bits>;
  constexpr int shift = Layout::magnitude_bit;
  constexpr uint32_t lanes = 0x00010001u;
  constexpr uint32_t magnitude_mask = ((1u << (bits - 1)) - 1) * lanes << shift;
  constexpr uint32_t sign_mask = 0x80008000u;
  if constexpr (bits == 4 && shift + bits <= 16 - bits) {
    // One multiply puts the two nibbles' magnitude and sign copies in place
    // (they do not overlap, so nothing carries): 3 instructions a pair, not
    // 4. The nibble stays where it is, the multiplier shifts by its place
    // (whole bytes shifted first, so that the multiplier stays whole).
    constexpr uint32_t copies = (1u << shift) | (1u << (16 - bits));
    const int place = bits * (p % 2);
    const uint32_t nibbles =
        (word >> (8 * (p / 2))) & ((0xFu * lanes) << place);
    return (nibbles * (copies >> place)) & (magnitude_mask | sign_mask);
  }
  const uint32_t code = word >> (bits * p);
  uint32_t magnitude = (code << shift) & magnitude_mask;
  const uint32_t sign = (code << (16 - bits)) & sign_mask;
  if constexpr (bits == 8) {
    constexpr int carry_bit = shift + 7;
    constexpr int exponent_bits_left = 15 - carry_bit;
    const uint32_t carry =
        (magnitude + (lanes << shift)) & (lanes << carry_bit);
    magnitude |= carry * ((1u << exponent_bits_left) - 1);
  }
  return sign | magnitude;
}

// Codes p and p + 16 / bits of `word` as a pair, exactly.
template <typename H, int bits>
__device__ __forceinline__ typename Pair<H>::type decode_pair(
    uint32_t word, int p) {
  using P = typename Pair<H>::type;
  return __hmul2(
      pair_from_bits<P>(code_pair_bits<H, bits>(word, p)),
      pair_from_bits<P>(CodeLayout<H, bits>::fixup));
}

// E8M0: byte b is 2^(b - 127); MLX decodes byte 0 as 2^-127 (a float
// subnormal) and byte 255 as +inf.
__device__ __forceinline__ float decode_e8m0(uint32_t byte) {
  return __uint_as_float(byte == 0 ? 0x00400000u : byte << 23);
}

// E8M0 byte b times 2^f as a pair of H: the exponent field b - 127 + f +
// H's bias in each half, exact while that field is a normal number's (in
// bfloat16: 1 <= b + f <= 254, byte 0 too, as MLX's 2^-127, that is up to
// byte kE8M0LargestPairByte<f>).
template <typename H, int f>
__host__ __device__ constexpr uint32_t e8m0_pair(uint32_t byte) {
  constexpr uint32_t exponent_one =
      power_of_two_pair<H>(1 - FloatFormat<H>::bias);
  return uint32_t(int(byte) - 127 + f + FloatFormat<H>::bias) * exponent_one;
}
template <int f>
inline constexpr uint32_t kE8M0LargestPairByte = 254 - f;

// E4M3 scales (nvfp4) reach 448: their product with bfloat16's E2M1 fixup
// would leave bfloat16's range, so the multipliers are 2^kE4M3ScaleShift
// smaller and the float32 sums make up for it (small enough for float16's
// too: HalfWindow).
inline constexpr int kE4M3ScaleShift = 8;
// Every finite E4M3 value is below 2^9 (448; decode_test checks it).
inline constexpr int kE4M3ScaleExponentBound = 9;

template <int encoding>
__host__ __device__ constexpr int scale_shift() {
  return encoding == kScaleE4M3 ? kE4M3ScaleShift : 0;
}

// Float16 x multiplies in float16 where the multiplier is a normal float16
// and every code times the scale (2^-scale_shift of it) is a float16, its
// last significant bit at 2^-24 or above and its magnitude at most 65504:
// E8M0 scales from 2^lowest to 2^highest (decode_test checks the bounds
// exhaustively), every E4M3 scale. Other scales (float) are not exact in
// float16 codes.
template <int bits>
struct HalfWindow {
  static constexpr int lowest = bits == 4 ? -23 : -15;
  static constexpr int highest = bits == 4 ? 1 : 7;
};
template <int bits>
__host__ __device__ constexpr bool e8m0_in_half_window(uint32_t byte) {
  constexpr int lowest_byte = 127 + HalfWindow<bits>::lowest;
  return byte - uint32_t(lowest_byte) <=
         uint32_t(HalfWindow<bits>::highest - HalfWindow<bits>::lowest);
}

// The power of two of a group's multiplier besides its scale: the layout's
// fixup, 2^-scale_shift of it.
template <typename H, int bits, int encoding>
inline constexpr int kMultiplierExponent =
    CodeLayout<H, bits>::fixup_exponent - scale_shift<encoding>();

// E4M3 (FN), exact: one conversion instruction in code for sm_89 or later
// (the sm_90 build), the E4M3 pair decode before.
__device__ __forceinline__ float decode_e4m3(uint32_t byte) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return __half2float(__nv_cvt_fp8_to_halfraw(byte, __NV_E4M3));
#else
  return __low2float(decode_pair<__half, 8>(byte, 0));
#endif
}

template <int encoding>
struct ScaleStorage;
template <>
struct ScaleStorage<kScaleE8M0> {
  using type = uint8_t;
};
template <>
struct ScaleStorage<kScaleE4M3> {
  using type = uint8_t;
};
template <>
struct ScaleStorage<kScaleFloat32> {
  using type = float;
};
template <>
struct ScaleStorage<kScaleFloat16> {
  using type = __half;
};
template <>
struct ScaleStorage<kScaleBFloat16> {
  using type = __nv_bfloat16;
};

template <int encoding>
__device__ __forceinline__ float decode_scale(
    typename ScaleStorage<encoding>::type stored) {
  if constexpr (encoding == kScaleE8M0) {
    return decode_e8m0(stored);
  } else if constexpr (encoding == kScaleE4M3) {
    return decode_e4m3(stored);
  } else {
    return static_cast<float>(stored);
  }
}

// nvfp4's global-scale factor for W matrix `matrix`: it multiplies every
// group scale, in float (it is ~1e-5, too small for a 16-bit float).
__device__ __forceinline__ float global_factor(
    const float* global_scale, int64_t matrix) {
  return global_scale ? global_scale[matrix] / kNvfp4GlobalScaleDivisor : 1.0f;
}

}  // namespace fpqmm::cuda
