// The CPU kernels' interface, free of MLX types so that the same sources also
// build into the standalone cross-ISA test harness (csrc/cpu/testing/).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "formats.h"

namespace mlx_fpqmm::cpu {

enum class ScaleType : uint8_t { e8m0, e4m3, f32, f16, bf16 };

// Calls f(std::integral_constant<int, bits>) for a code width of 4 or 8, so
// kernels templated on the width are instantiated once per width.
template <typename F>
inline void with_code_bits(int bits, F&& f) {
  if (bits == 4) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

// A row-major matrix of packed codes, quantized along its rows: `rows` rows of
// `cols` elements, each row `cols / group_size` groups with one scale each.
struct QuantizedMatrix {
  CodeKind codes;
  int bits;
  int group_size;
  int64_t rows;
  int64_t cols;
  const uint8_t* data;  // rows * cols * bits / 8 bytes
  const void* scales;   // rows * cols / group_size scales of scale_type
  ScaleType scale_type;
  float global_factor;  // multiplies every scale (nvfp4 global scale)

  int64_t groups() const {
    return cols / group_size;
  }
  const uint8_t* row(int64_t r) const {
    return data + r * (cols * bits / 8);
  }
};

// Extra floats a scale buffer needs past groups(): SIMD code reads whole
// vectors of scales.
inline constexpr int64_t kScalePadding = 16;

// dst[g] for groups g in [g0, g1) of one row of float scales (f32, f16 or
// bf16), times the global factor. Byte scales are decoded in the kernels.
void decode_float_scales(
    const QuantizedMatrix& w, int64_t row, float* dst, int64_t g0, int64_t g1);

// decode_e8m0's bits without its branch, so that loops over it vectorize
// (checked equal for every byte in kernels.cpp).
constexpr uint32_t e8m0_bits(uint8_t byte) {
  return static_cast<uint32_t>(byte) << 23 | static_cast<uint32_t>(byte == 0)
                                                 << 22;
}

// A per-thread buffer of at least `bytes` bytes, 64-byte aligned; `slot`
// tells apart the buffers one kernel call holds at once. Defined in the
// baseline-compiled kernels.cpp: ISA files instantiate no std containers,
// whose shared inline code could otherwise be linked with their flags.
void* thread_scratch(int slot, size_t bytes);

template <typename T>
T* scratch(int slot, int64_t count) {
  return static_cast<T*>(thread_scratch(slot, count * sizeof(T)));
}

// Code value of element `col` of `row`, unscaled (for tails and references).
float code_value(const QuantizedMatrix& w, int64_t row, int64_t col);

// bfloat16 as raw bits; conversions round to nearest even like MLX.
using bf16_bits = uint16_t;

inline float bf16_to_float(bf16_bits bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// sum_k x[k] * (code_k * scale_k) over row `row` of W, element by element as
// the reference dequantizes (scales decoded, `scales[g]` for group g).
float dot_by_element(
    const QuantizedMatrix& w, int64_t row, const float* scales, const float* x);
float dot_by_element(
    const QuantizedMatrix& w,
    int64_t row,
    const float* scales,
    const bf16_bits* x);

// One ISA's kernels. x is row-major and dense, outputs are float32 with row
// stride ldo. The bf16 entries are null where the ISA has no bf16 dots.
struct IsaKernels {
  const char* name;

  // out[m * ldo + n - n0] = sum_k x[m * w.cols + k] * W[n, k], for m < M and
  // n in [n0, n1): the small-M product x @ W^T, decode fused into the dots.
  void (*dot)(
      const QuantizedMatrix& w,
      const float* x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo);

  // out[m * ldo + c - c0] = sum_r x[m * w.rows + r] * W[r, c], for m < M and
  // c in [c0, c1): the small-M product x @ W. c0 is a multiple of 32 and of
  // the group size.
  void (*axpy)(
      const QuantizedMatrix& w,
      const float* x,
      int64_t M,
      int64_t c0,
      int64_t c1,
      float* out,
      int64_t ldo);

  // dst[(r - r0) * ld + c - c0] = W[r, c] scaled, for r in [r0, r1) and
  // c in [c0, c1), c0 a multiple of 32 and of the group size: panels for a
  // float32 GEMM.
  void (*dequantize)(
      const QuantizedMatrix& w,
      int64_t r0,
      int64_t r1,
      int64_t c0,
      int64_t c1,
      float* dst,
      int64_t ld);

  // As dot, with bfloat16 x and bfloat16 dot products; only for formats
  // whose scaled codes are exact in bfloat16 (bf16_exact).
  void (*dot_bf16)(
      const QuantizedMatrix& w,
      const bf16_bits* x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo);

  // The large-M x @ W^T for bf16_exact formats: W is decoded into packed
  // bfloat16 panels feeding a bf16 dot-product GEMM kernel.
  void (*gemm_bf16)(
      const QuantizedMatrix& w,
      const bf16_bits* x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo);
};

// E2M1 or E4M3 codes times E8M0 or E4M3 scales are exact in bfloat16 (at most
// 2 + 4 significant bits), so bf16 dot products lose nothing for these.
inline bool bf16_exact(const QuantizedMatrix& w) {
  return w.scale_type == ScaleType::e8m0 ||
         (w.scale_type == ScaleType::e4m3 && w.codes == CodeKind::e2m1);
}

// The kernels of each ISA compiled into this build (null when not compiled).
const IsaKernels* portable_kernels();
const IsaKernels* avx2_kernels();
const IsaKernels* avx512_kernels();
const IsaKernels* neon_kernels();

}  // namespace mlx_fpqmm::cpu
