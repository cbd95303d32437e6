// The quantization formats: one table (with the facts derived from the
// decode rules: largest code, bfloat16 exactness), the one definition of each
// decode rule (codes and scales) that every CPU path uses, and the one
// mapping from a mode and its scales' type to the scale encoding the CPU and
// Metal kernels read (ScaleEncoding, common/scale_encoding.h).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/scale_encoding.h"

namespace mlx_fpqmm {

enum class Mode { mxfp4, nvfp4, mxfp8, fp4, fp8 };
enum class CodeKind { e2m1, e4m3 };
enum class ScaleKind { e8m0, e4m3, floating };

// The float types of x and of float scales.
enum class FloatType { float32, float16, bfloat16 };

inline constexpr std::array<std::string_view, 3> kFloatTypeNames = {
    "float32", "float16", "bfloat16"};

constexpr std::string_view type_name(FloatType type) {
  return kFloatTypeNames[static_cast<size_t>(type)];
}

constexpr std::optional<FloatType> float_type_from_name(std::string_view name) {
  for (size_t i = 0; i < kFloatTypeNames.size(); ++i) {
    if (kFloatTypeNames[i] == name) {
      return static_cast<FloatType>(i);
    }
  }
  return std::nullopt;
}

// Shared with the GPU kernels (common/scale_encoding.h).
using fpqmm::kE4M3GroupSize;
using fpqmm::kE8M0GroupSize;
using fpqmm::kNvfp4GlobalScaleDivisor;
using fpqmm::ScaleEncoding;

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
// float32 subnormal 2^-127 and byte 255 is +inf (not NaN). As float32 bits,
// without a branch so that loops over it vectorize.
constexpr uint32_t e8m0_bits(uint8_t byte) {
  return static_cast<uint32_t>(byte) << 23 | static_cast<uint32_t>(byte == 0)
                                                 << 22;
}

constexpr float decode_e8m0(uint8_t byte) {
  return std::bit_cast<float>(e8m0_bits(byte));
}

static_assert(decode_e8m0(0) == 0x1p-127f && decode_e8m0(1) == 0x1p-126f);
static_assert(decode_e8m0(127) == 1.0f && decode_e8m0(254) == 0x1p127f);
static_assert(decode_e8m0(255) == std::numeric_limits<float>::infinity());

constexpr std::span<const float> code_values(CodeKind codes) {
  if (codes == CodeKind::e2m1) {
    return kE2M1Values;
  }
  return kE4M3Values;
}

// Significant bits of the widest finite value in `values` (all of them normal
// float32 values or zero).
constexpr int significant_bits(std::span<const float> values) {
  int widest = 0;
  for (float value : values) {
    uint32_t bits = std::bit_cast<uint32_t>(value) & 0x7FFFFFFFu;
    if (bits != 0 && bits < 0x7F800000u) {
      uint32_t significand = (bits & 0x007FFFFFu) | 0x00800000u;
      widest = std::max(widest, 24 - std::countr_zero(significand));
    }
  }
  return widest;
}

constexpr int significant_bits(ScaleKind scales) {
  switch (scales) {
    case ScaleKind::e8m0:
      return 1;  // powers of two
    case ScaleKind::e4m3:
      return significant_bits(kE4M3Values);
    case ScaleKind::floating:
      break;
  }
  return std::numeric_limits<float>::digits;
}

// The largest finite value in `values`.
constexpr float largest_finite(std::span<const float> values) {
  float largest = 0.0f;
  for (float value : values) {
    if (value == value && value < std::numeric_limits<float>::infinity()) {
      largest = std::max(largest, value);
    }
  }
  return largest;
}

inline constexpr int kBfloat16SignificantBits = 8;

struct Format {
  Mode mode;
  std::string_view name;
  CodeKind codes;
  int bits;
  int default_group_size;
  std::span<const int> group_sizes;
  ScaleKind scales;
  // The largest code value: float-scale quantization stores each group's
  // scale as max|w| / code_max.
  float code_max;
  // Every code times every scale (without nvfp4's global scale) is exact in
  // bfloat16, so the scaled codes can be multiplied in bfloat16 or staged as
  // bfloat16 without rounding.
  bool bf16_exact;

  int elements_per_word() const {
    return 32 / bits;
  }
  constexpr bool allows_group_size(int group_size) const {
    return std::ranges::find(group_sizes, group_size) != group_sizes.end();
  }
};

// A table row: code_max and bf16_exact follow from the decode rules above.
constexpr Format make_format(
    Mode mode,
    std::string_view name,
    CodeKind codes,
    int bits,
    int default_group_size,
    std::span<const int> group_sizes,
    ScaleKind scales) {
  return {
      mode,
      name,
      codes,
      bits,
      default_group_size,
      group_sizes,
      scales,
      largest_finite(code_values(codes)),
      significant_bits(code_values(codes)) + significant_bits(scales) <=
          kBfloat16SignificantBits};
}

inline constexpr std::array<int, 1> kE8M0GroupSizes = {kE8M0GroupSize};
inline constexpr std::array<int, 1> kE4M3GroupSizes = {kE4M3GroupSize};
inline constexpr std::array<int, 4> kFloatScaleGroupSizes = {16, 32, 64, 128};

inline constexpr std::array<Format, 5> kFormats = {{
    make_format(
        Mode::mxfp4,
        "mxfp4",
        CodeKind::e2m1,
        4,
        kE8M0GroupSize,
        kE8M0GroupSizes,
        ScaleKind::e8m0),
    make_format(
        Mode::nvfp4,
        "nvfp4",
        CodeKind::e2m1,
        4,
        kE4M3GroupSize,
        kE4M3GroupSizes,
        ScaleKind::e4m3),
    make_format(
        Mode::mxfp8,
        "mxfp8",
        CodeKind::e4m3,
        8,
        kE8M0GroupSize,
        kE8M0GroupSizes,
        ScaleKind::e8m0),
    make_format(
        Mode::fp4,
        "fp4",
        CodeKind::e2m1,
        4,
        32,
        kFloatScaleGroupSizes,
        ScaleKind::floating),
    make_format(
        Mode::fp8,
        "fp8",
        CodeKind::e4m3,
        8,
        32,
        kFloatScaleGroupSizes,
        ScaleKind::floating),
}};

constexpr const Format& format_for(Mode mode) {
  return kFormats[static_cast<size_t>(mode)];
}

constexpr std::optional<Mode> mode_from_name(std::string_view name) {
  for (const auto& format : kFormats) {
    if (format.name == name) {
      return format.mode;
    }
  }
  return std::nullopt;
}

static_assert([] {
  for (size_t i = 0; i < kFormats.size(); ++i) {
    if (kFormats[i].mode != static_cast<Mode>(i)) {
      return false;
    }
  }
  return true;
}());
static_assert(format_for(Mode::fp4).code_max == 6.0f);
static_assert(format_for(Mode::fp8).code_max == 448.0f);
static_assert(
    format_for(Mode::mxfp4).bf16_exact && format_for(Mode::nvfp4).bf16_exact &&
    format_for(Mode::mxfp8).bf16_exact && !format_for(Mode::fp4).bf16_exact &&
    !format_for(Mode::fp8).bf16_exact);

// How the kernels read the scales of `mode`: its byte format, or for
// float-scale modes the scales' float type (which they then need).
constexpr ScaleEncoding scale_encoding(
    Mode mode, std::optional<FloatType> scale_type) {
  switch (format_for(mode).scales) {
    case ScaleKind::e8m0:
      return ScaleEncoding::e8m0;
    case ScaleKind::e4m3:
      return ScaleEncoding::e4m3;
    case ScaleKind::floating:
      break;
  }
  if (!scale_type) {
    throw std::invalid_argument(
        "[scale_encoding] float-scale modes need the scales' float type.");
  }
  switch (*scale_type) {
    case FloatType::float16:
      return ScaleEncoding::float16;
    case FloatType::bfloat16:
      return ScaleEncoding::bfloat16;
    case FloatType::float32:
      break;
  }
  return ScaleEncoding::float32;
}

// Bytes per element of a float type.
constexpr int itemsize(FloatType type) {
  return type == FloatType::float32 ? 4 : 2;
}

// Bytes per scale of an encoding.
constexpr int scale_itemsize(ScaleEncoding encoding) {
  switch (encoding) {
    case ScaleEncoding::e8m0:
    case ScaleEncoding::e4m3:
      return 1;
    case ScaleEncoding::float16:
    case ScaleEncoding::bfloat16:
      return 2;
    case ScaleEncoding::float32:
      break;
  }
  return 4;
}

}  // namespace mlx_fpqmm
