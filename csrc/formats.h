// The quantization formats: one table, and the one definition of each decode
// rule (codes and scales) that every CPU path uses.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fp_params.h"

namespace mlx_fpqmm {

enum class Mode { mxfp4, nvfp4, mxfp8, fp4, fp8 };
enum class CodeKind { e2m1, e4m3 };
enum class ScaleKind { e8m0, e4m3, floating };

struct Format {
  Mode mode;
  std::string_view name;
  CodeKind codes;
  int bits;
  int default_group_size;
  std::span<const int> group_sizes;
  ScaleKind scales;

  int elements_per_word() const {
    return 32 / bits;
  }
  bool allows_group_size(int group_size) const;
};

inline constexpr std::array<int, 1> kGroupSizes32 = {32};
inline constexpr std::array<int, 1> kGroupSizes16 = {16};
inline constexpr std::array<int, 4> kFloatScaleGroupSizes = {16, 32, 64, 128};

inline constexpr std::array<Format, 5> kFormats = {{
    {Mode::mxfp4,
     "mxfp4",
     CodeKind::e2m1,
     4,
     32,
     kGroupSizes32,
     ScaleKind::e8m0},
    {Mode::nvfp4,
     "nvfp4",
     CodeKind::e2m1,
     4,
     16,
     kGroupSizes16,
     ScaleKind::e4m3},
    {Mode::mxfp8,
     "mxfp8",
     CodeKind::e4m3,
     8,
     32,
     kGroupSizes32,
     ScaleKind::e8m0},
    {Mode::fp4,
     "fp4",
     CodeKind::e2m1,
     4,
     32,
     kFloatScaleGroupSizes,
     ScaleKind::floating},
    {Mode::fp8,
     "fp8",
     CodeKind::e4m3,
     8,
     32,
     kFloatScaleGroupSizes,
     ScaleKind::floating},
}};

// Shared with the Metal kernels (metal/fp_params.h).
using fpqmm::kNvfp4GlobalScaleDivisor;

const Format& format_for(Mode mode);
std::optional<Mode> mode_from_name(std::string_view name);

// E2M1: sign bit 3, two exponent bits (bias 1), one mantissa bit.
inline constexpr std::array<float, 16> kE2M1Values = {
    0.0f,
    0.5f,
    1.0f,
    1.5f,
    2.0f,
    3.0f,
    4.0f,
    6.0f,
    -0.0f,
    -0.5f,
    -1.0f,
    -1.5f,
    -2.0f,
    -3.0f,
    -4.0f,
    -6.0f};

// E4M3 (FN variant): bias 7, subnormals, 0x7F / 0xFF are NaN, no infinities.
constexpr float decode_e4m3(uint8_t byte) {
  int exponent = (byte >> 3) & 0xF;
  int mantissa = byte & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = mantissa / 8.0f / 64.0f;
  } else {
    magnitude = (1.0f + mantissa / 8.0f);
    for (int e = 7; e < exponent; ++e) {
      magnitude *= 2.0f;
    }
    for (int e = exponent; e < 7; ++e) {
      magnitude /= 2.0f;
    }
  }
  return (byte & 0x80) ? -magnitude : magnitude;
}

inline constexpr std::array<float, 256> kE4M3Values = [] {
  std::array<float, 256> table{};
  for (int byte = 0; byte < 256; ++byte) {
    table[byte] = decode_e4m3(static_cast<uint8_t>(byte));
  }
  return table;
}();

// E8M0: byte b is 2^(b - 127), with MLX's two special cases: byte 0 is the
// float32 subnormal 2^-127 and byte 255 is +inf (not NaN).
constexpr float decode_e8m0(uint8_t byte) {
  uint32_t bits = byte == 0 ? 0x00400000u : static_cast<uint32_t>(byte) << 23;
  return std::bit_cast<float>(bits);
}

inline std::span<const float> code_values(CodeKind codes) {
  if (codes == CodeKind::e2m1) {
    return kE2M1Values;
  }
  return kE4M3Values;
}

}  // namespace mlx_fpqmm
