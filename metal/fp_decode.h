// Decoding of fp codes and group scales on the GPU: the same rules as
// csrc/formats.h (MLX 0.32.4), written as bit manipulations instead of tables
// (a per-lane table lookup serialises on the constant cache).
#pragma once

#include <metal_stdlib>

#include "fp_params.h"

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

// Two codes at once, as the halves of a half2 (the decode kernels' inner
// loop): `pair` holds one code in bits 0.. and another in bits 16.., as a
// packed word shifted right holds codes i and i + 16 / bits. The result is
// the codes' values divided by code_pair_scale<bits>: the bit patterns of
// decode_e2m1 / decode_e4m3 without their final multiply, which the caller
// applies once per chunk instead of once per code.
inline half2 decode_e2m1_pair(uint pair) {
  return as_type<half2>(
      ((pair & 0x00080008u) << 12) | ((pair & 0x00070007u) << 9));
}

// Magnitude 0x7F (NaN) is the only one whose increment reaches bit 7; that
// bit, moved to the half's top exponent bit, makes the half a NaN.
inline half2 decode_e4m3_pair(uint pair) {
  uint magnitude = pair & 0x007F007Fu;
  uint nan_bits = ((magnitude + 0x00010001u) & 0x00800080u) << 7;
  return as_type<half2>(
      ((pair & 0x00800080u) << 8) | nan_bits | (magnitude << 7));
}

template <int bits>
inline half2 decode_code_pair(uint pair) {
  static_assert(bits == 4 || bits == 8, "fp codes are 4 or 8 bits wide");
  if (bits == 4) {
    return decode_e2m1_pair(pair);
  }
  return decode_e4m3_pair(pair);
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
