// Decoding of fp codes and group scales on the GPU: the same rules as
// common/formats.h (MLX 0.32.4), written as bit manipulations instead of tables
// (a per-lane table lookup serialises on the constant cache).
#pragma once

#include <metal_stdlib>

#include "backend/metal/kernels/fp_params.h"

namespace fpqmm {

using namespace metal;

// E2M1 (sign, two exponent bits with bias 1, one mantissa bit) to half,
// exactly. The three magnitude bits become the low exponent bits and the top
// mantissa bit of a half, which is then 2^14 too small; exponent 0 lands on
// a half subnormal (0.5 * 2^-14), so E2M1's subnormal needs no special case.
inline half decode_e2m1(uint code) {
  ushort bits = ushort(((code & 0x8) << 12) | ((code & 0x7) << 9));
  return as_type<half>(bits) * 16384.0h;
}

// E4M3 (the FN variant) to half, exactly: the four exponent and three
// mantissa bits become a half's low exponent bits and top mantissa bits,
// 2^8 too small (subnormals again land on half subnormals). Magnitude 0x7F
// is NaN: setting the half's top exponent bit as well makes it a half NaN.
inline half decode_e4m3(uint code) {
  uint magnitude = code & 0x7F;
  uint nan_bit = magnitude == 0x7F ? 0x4000 : 0;
  ushort bits = ushort(((code & 0x80) << 8) | nan_bit | (magnitude << 7));
  return as_type<half>(bits) * 256.0h;
}

// The code format of a `bits`-wide code: E2M1 for 4, E4M3 for 8.
template <int bits>
inline half decode_code(uint code) {
  static_assert(bits == 4 || bits == 8, "fp codes are 4 or 8 bits wide");
  if (bits == 4) {
    return decode_e2m1(code);
  }
  return decode_e4m3(code);
}

// `value` shifted left by `shift` bits, or right by -shift when negative.
inline uint shift_bits(uint value, int shift) {
  return shift >= 0 ? value << shift : value >> -shift;
}

// Two codes of a packed word at once, as the halves of a half2 (the decode
// kernel's inner loop): pair p holds codes p and p + 16 / bits of the word,
// which sit 16 bits apart. Each code's sign and magnitude bits are moved
// straight to where decode_e2m1 / decode_e4m3 put them, a few integer
// operations for both codes. The result is the codes' values divided by
// code_pair_scale<bits>: those functions' final multiply is left to the
// caller, once per chunk instead of once per code.
template <int bits>
inline half2 decode_code_pair(uint word, int p) {
  static_assert(bits == 4 || bits == 8, "fp codes are 4 or 8 bits wide");
  // The lowest magnitude bit's place in the half: the top mantissa bit for
  // E2M1, the third for E4M3.
  constexpr int magnitude_bit = bits == 4 ? 9 : 7;
  constexpr uint magnitude_mask =
      ((1u << (bits - 1)) - 1) * (1u << magnitude_bit) * 0x00010001u;
  const int code_bit = bits * p;
  uint magnitude = shift_bits(word, magnitude_bit - code_bit) & magnitude_mask;
  const uint sign = shift_bits(word, 16 - bits - code_bit) & 0x80008000u;
  if (bits == 8) {
    // Magnitude 0x7F (NaN) is the only one whose increment carries into
    // bit 14, the half's top exponent bit: with it the half is a NaN.
    magnitude |= (magnitude + (0x00010001u << magnitude_bit)) & 0x40004000u;
  }
  return as_type<half2>(sign | magnitude);
}

// What decode_code_pair's values are multiplied by to be the codes' values.
template <int bits>
constexpr float code_pair_scale() {
  return bits == 4 ? 16384.0f : 256.0f;
}

// E8M0: byte b is 2^(b - 127); MLX decodes byte 0 as 2^-127 (a float
// subnormal) and byte 255 as +inf.
inline float decode_e8m0(uint byte) {
  return as_type<float>(byte == 0 ? 0x00400000u : byte << 23);
}

// Bytes per scale in a scales buffer of the given encoding.
inline int scale_itemsize(int encoding) {
  return encoding == kScaleFloat32                          ? 4
         : encoding == kScaleE8M0 || encoding == kScaleE4M3 ? 1
                                                            : 2;
}

// One group's scale as float. `scales` points at a matrix's scales,
// `index` counts scales (not bytes).
inline float decode_scale(
    const device uint8_t* scales, int64_t index, int encoding) {
  switch (encoding) {
    case kScaleE8M0:
      return decode_e8m0(scales[index]);
    case kScaleE4M3:
      return float(decode_e4m3(scales[index]));
    case kScaleFloat32:
      return ((const device float*)scales)[index];
    case kScaleFloat16:
      return float(((const device half*)scales)[index]);
    default:
      return float(((const device bfloat*)scales)[index]);
  }
}

// The nvfp4 global-scale factor, folded into the group scales in float: it is
// ~1e-5, too small to survive a trip through half next to a group scale.
inline float global_scale_factor(
    const device float* global_scale, bool has_global_scale) {
  return has_global_scale ? global_scale[0] / kNvfp4GlobalScaleDivisor : 1.0f;
}

// The group scales of one matrix with the global scale folded in.
struct GroupScales {
  const device uint8_t* scales;
  int encoding;
  float factor;

  float operator[](int64_t index) const {
    return decode_scale(scales, index, encoding) * factor;
  }
};

}  // namespace fpqmm
