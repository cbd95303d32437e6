// Scale decoding shared by every ISA, and the portable kernels: the same
// templates as the SIMD ISAs over a one-lane "vector".
#include "backend/cpu/kernels.h"

#include <bit>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/cpu/simd_kernels.h"

namespace mlx_fpqmm::cpu {

namespace {

// IEEE half to float, exact (subnormals, infinities and NaN included).
float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  if (exponent == 0) {
    // Subnormal (or zero): mantissa * 2^-24, exact in float.
    float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
  }
  uint32_t bits = exponent == 0x1F
                      ? 0x7F800000u | (mantissa << 13)
                      : ((exponent + 112) << 23) | (mantissa << 13);
  return std::bit_cast<float>(bits | sign);
}

template <typename T>
T load_as(const void* base, int64_t index) {
  T value;
  std::memcpy(&value, static_cast<const T*>(base) + index, sizeof(T));
  return value;
}

struct ScalarVec {
  using F = float;
  using I = uint32_t;
  static constexpr int kLanes = 1;

  static F zero() {
    return 0.0f;
  }
  static F set1(float v) {
    return v;
  }
  static F set2(float lo, float) {
    return lo;
  }
  static F load(const float* p) {
    return *p;
  }
  static void store(float* p, F v) {
    *p = v;
  }
  static F fma(F a, F b, F c) {
    return a * b + c;
  }
  static F mul(F a, F b) {
    return a * b;
  }
  static F add(F a, F b) {
    return a + b;
  }
  static float sum(F v) {
    return v;
  }
  static I load_words(const uint8_t* p) {
    return load_as<uint32_t>(p, 0);
  }
  static I shift_right(I v, int bits) {
    return v >> bits;
  }
  static F e2m1(I v) {
    return kE2M1Values[v & 0xF];
  }
  static F e4m3(I v) {
    return kE4M3Values[v & 0xFF];
  }
  static I load_index(const int32_t* p) {
    return *p;
  }
  static F permute(F table, I) {
    return table;
  }
  static void decode_e2m1(const uint8_t* p, F& even, F& odd) {
    even = kE2M1Values[*p & 0xF];
    odd = kE2M1Values[*p >> 4];
  }
  static F decode_e4m3(const uint8_t* p) {
    return kE4M3Values[*p];
  }
  static void store_interleaved(float* dst, F even, F odd) {
    dst[0] = even;
    dst[1] = odd;
  }
};

}  // namespace

void decode_float_scales(
    const QuantizedMatrix& w, int64_t row, float* dst, int64_t g0, int64_t g1) {
  int64_t first = row * w.groups();
  for (int64_t g = g0; g < g1; ++g) {
    switch (w.scale_encoding) {
      case ScaleEncoding::float16:
        dst[g] = half_to_float(load_as<uint16_t>(w.scales, first + g));
        break;
      case ScaleEncoding::bfloat16:
        dst[g] = std::bit_cast<float>(
            static_cast<uint32_t>(load_as<uint16_t>(w.scales, first + g))
            << 16);
        break;
      default:
        dst[g] = load_as<float>(w.scales, first + g);
    }
    dst[g] *= w.global_factor;
  }
}

void* aligned_bytes(std::vector<std::byte>& storage, size_t bytes) {
  constexpr size_t kAlignment = 64;
  if (storage.size() < bytes + kAlignment) {
    storage.resize(bytes + kAlignment);
  }
  void* data = storage.data();
  size_t space = storage.size();
  return std::align(kAlignment, bytes, data, space);
}

void* thread_scratch(int slot, size_t bytes) {
  thread_local std::array<std::vector<std::byte>, 3> buffers;
  return aligned_bytes(buffers.at(slot), bytes);
}

float code_value(const QuantizedMatrix& w, int64_t row, int64_t col) {
  const uint8_t* bytes = w.row(row);
  if (w.bits == 4) {
    return kE2M1Values[(bytes[col / 2] >> (col % 2 * 4)) & 0xF];
  }
  return kE4M3Values[bytes[col]];
}

template <typename X>
float dot_by_element_impl(
    const QuantizedMatrix& w, int64_t row, const float* scales, const X* x) {
  float total = 0.0f;
  for (int64_t k = 0; k < w.cols; ++k) {
    float value = code_value(w, row, k) * scales[k / w.group_size];
    if constexpr (std::is_same_v<X, bf16_bits>) {
      total += bf16_to_float(x[k]) * value;
    } else {
      total += x[k] * value;
    }
  }
  return total;
}

float dot_by_element(
    const QuantizedMatrix& w,
    int64_t row,
    const float* scales,
    const float* x) {
  return dot_by_element_impl(w, row, scales, x);
}

float dot_by_element(
    const QuantizedMatrix& w,
    int64_t row,
    const float* scales,
    const bf16_bits* x) {
  return dot_by_element_impl(w, row, scales, x);
}

const IsaKernels* portable_kernels() {
  using K = SimdKernels<ScalarVec>;
  static const IsaKernels kernels{
      "portable",
      96,  // not measured: the Zen 4 values
      96,
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
