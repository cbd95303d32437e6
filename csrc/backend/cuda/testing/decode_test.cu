// The kernels' bit decoding of code pairs (code_pair_bits of fp_decode.cuh),
// run on the host (no GPU needed; tests/test_cuda_build.py builds and runs
// it): every pair laid out for half and bfloat16, times the layout's fixup,
// is MLX's value of each code (common/formats.h), over every pattern of a
// word's low and of its high 16 bits and random words; the bfloat16 pairs
// of E8M0 scales times the fixups; and the float16 codes' scale folds: the
// E8M0 windows byte by byte, every E4M3 scale with every E2M1 code. Prints
// the failures and exits 1 if any.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "backend/cuda/kernels/fp_decode.cuh"
#include "common/formats.h"

namespace {

using namespace fpqmm::cuda;

float half_value(uint16_t bits, __half) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

float half_value(uint16_t bits, __nv_bfloat16) {
  const uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

int failures = 0;

template <typename H, int bits>
void check_word(uint32_t word) {
  constexpr int per_word = 16 / bits;
  const float fixup = std::ldexp(1.0f, CodeLayout<H, bits>::fixup_exponent);
  for (int p = 0; p < per_word; ++p) {
    const uint32_t pair = code_pair_bits<H, bits>(word, p);
    for (int half = 0; half < 2; ++half) {
      const uint32_t code =
          word >> (bits * (p + half * per_word)) & ((1u << bits) - 1);
      const float expected = mlx_fpqmm::code_values(
          bits == 4 ? mlx_fpqmm::CodeKind::e2m1
                    : mlx_fpqmm::CodeKind::e4m3)[code];
      const float got = half_value(uint16_t(pair >> (16 * half)), H{}) * fixup;
      const bool same =
          std::isnan(expected)
              ? std::isnan(got)
              : got == expected && std::signbit(got) == std::signbit(expected);
      if (!same && ++failures <= 10) {
        std::printf(
            "%s bits=%d word=%08x pair %d half %d: code %x is %g, decoded %g "
            "(pair %08x)\n",
            std::is_same_v<H, __half> ? "half" : "bfloat16",
            bits,
            word,
            p,
            half,
            code,
            expected,
            got,
            pair);
      }
    }
  }
}

template <typename H, int bits>
void check_all() {
  // Every pattern of the 16 low bits under varied high bits, every pattern
  // of the high bits under varied low bits, and random words.
  std::mt19937 random(bits);
  for (uint32_t low = 0; low < 0x10000; ++low) {
    check_word<H, bits>(low | random() << 16);
    check_word<H, bits>(low << 16 | (random() & 0xFFFF));
  }
  for (int i = 0; i < 1 << 20; ++i) {
    check_word<H, bits>(random());
  }
}

// e8m0_pair<__nv_bfloat16, f>: both halves of every byte's pair are MLX's scale
// (2^(b - 127), byte 0 too) times 2^f, from the first byte whose field b + f
// is at least 1 up to kE8M0LargestPairByte<f>, past which the value leaves
// bfloat16's range (the kernels' two steps).
template <int f>
void check_e8m0_pairs() {
  for (uint32_t byte = std::max(0, 1 - f); byte < 255; ++byte) {
    const double value = std::ldexp(1.0, int(byte) - 127 + f);
    if (byte > kE8M0LargestPairByte<f>) {
      if (value < 0x1p128 && ++failures <= 10) {
        std::printf(
            "E8M0 byte %u times 2^%d fits bfloat16 but takes two steps\n",
            byte,
            f);
      }
      continue;
    }
    const uint32_t pair = e8m0_pair<__nv_bfloat16, f>(byte);
    for (int half = 0; half < 2; ++half) {
      const float got =
          half_value(uint16_t(pair >> (16 * half)), __nv_bfloat16{});
      if (got != value && ++failures <= 10) {
        std::printf(
            "E8M0 byte %u times 2^%d: %g, pair %08x\n", byte, f, value, pair);
      }
    }
  }
}

// Float16 codes times the multiplier of an E8M0 scale (e8m0_pair of the
// kernels' kMultiplierExponent): every code's product is exact, and both
// halves of the multiplier a normal float16, exactly for the bytes that
// e8m0_in_half_window takes.
template <int bits>
void check_half_window() {
  constexpr int exponent = kMultiplierExponent<__half, bits, fpqmm::kScaleE8M0>;
  constexpr int largest_field = 2 * FloatFormat<__half>::bias;
  for (uint32_t byte = 0; byte < 255; ++byte) {
    const int field = int(byte) - 127 + exponent + FloatFormat<__half>::bias;
    bool exact = field >= 1 && field <= largest_field;
    const uint32_t pair = e8m0_pair<__half, exponent>(byte);
    for (int half = 0; half < 2 && exact; ++half) {
      const float multiplier =
          half_value(uint16_t(pair >> (16 * half)), __half{});
      exact = multiplier == std::ldexp(1.0f, int(byte) - 127 + exponent);
      for (uint32_t code = 0; exact && code < (1u << bits); ++code) {
        const double value = bits == 4 ? mlx_fpqmm::kE2M1Values[code]
                                       : mlx_fpqmm::kE4M3Values[code];
        if (std::isnan(value)) {
          continue;
        }
        const float raw = half_value(
            uint16_t(code_pair_bits<__half, bits>(code, 0)), __half{});
        const float product = __half2float(__float2half_rn(raw * multiplier));
        exact = product == std::ldexp(value, int(byte) - 127);
      }
    }
    if (exact != e8m0_in_half_window<bits>(byte) && ++failures <= 10) {
      std::printf(
          "E8M0 byte %u with %d-bit float16 codes: exact %d, in the window "
          "%d\n",
          byte,
          bits,
          exact,
          !exact);
    }
  }
}

// Every finite E4M3 scale times every E2M1 code in float16, 2^-kE4M3ScaleShift
// of it: the multiplier and the product exact.
void check_half_e4m3_scales() {
  constexpr int exponent = kMultiplierExponent<__half, 4, fpqmm::kScaleE4M3>;
  for (int byte = 0; byte < 256; ++byte) {
    const double scale = mlx_fpqmm::kE4M3Values[byte];
    if (std::isnan(scale)) {
      continue;
    }
    if (std::fabs(scale) >= std::ldexp(1.0, kE4M3ScaleExponentBound) &&
        ++failures <= 10) {
      std::printf("E4M3 scale %02x: %g is not below the bound\n", byte, scale);
    }
    const float multiplier =
        __half2float(__float2half_rn(float(std::ldexp(scale, exponent))));
    for (uint32_t code = 0; code < 16; ++code) {
      const float raw =
          half_value(uint16_t(code_pair_bits<__half, 4>(code, 0)), __half{});
      const float product = __half2float(__float2half_rn(raw * multiplier));
      const double want =
          std::ldexp(mlx_fpqmm::kE2M1Values[code] * scale, -kE4M3ScaleShift);
      if (product != want && ++failures <= 10) {
        std::printf(
            "E4M3 scale %02x, code %u in float16: %g, not %g\n",
            byte,
            code,
            product,
            want);
      }
    }
  }
}

}  // namespace

int main() {
  check_half_window<4>();
  check_half_window<8>();
  check_half_e4m3_scales();
  check_e8m0_pairs<CodeLayout<__nv_bfloat16, 4>::fixup_exponent>();
  check_e8m0_pairs<CodeLayout<__nv_bfloat16, 8>::fixup_exponent>();
  check_e8m0_pairs<0>();
  check_all<__nv_bfloat16, 4>();
  check_all<__nv_bfloat16, 8>();
  check_all<__half, 4>();
  check_all<__half, 8>();
  if (failures) {
    std::printf("%d decoded halves differ\n", failures);
    return 1;
  }
  std::printf("every decoded pair matches\n");
  return 0;
}
