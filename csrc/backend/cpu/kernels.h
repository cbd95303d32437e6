// The CPU kernels' interface, free of MLX types so that the same sources also
// build into the standalone cross-ISA test harness (testing/).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/formats.h"

namespace mlx_fpqmm::cpu {

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
  int bits;  // 4: E2M1 codes, 8: E4M3 codes
  int group_size;
  int64_t rows;
  int64_t cols;
  const uint8_t* data;  // rows * cols * bits / 8 bytes
  const void* scales;   // rows * cols / group_size scales
  ScaleEncoding scale_encoding;
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

// The first `bytes` bytes of `storage` from a 64-byte boundary, growing it
// when needed: vector loads from it never straddle cache lines.
void* aligned_bytes(std::vector<std::byte>& storage, size_t bytes);

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

// A float that is exact in bfloat16 (the low 16 bits of its float32 are
// zero) as bfloat16: its upper half.
constexpr bf16_bits bf16_of_exact(float value) {
  return static_cast<bf16_bits>(std::bit_cast<uint32_t>(value) >> 16);
}

// The code tables of formats.h in bfloat16, for the bf16 kernels. Every E2M1
// and E4M3 value is exact in bfloat16.
static_assert([] {
  for (auto codes : {CodeKind::e2m1, CodeKind::e4m3}) {
    for (float value : code_values(codes)) {
      if ((std::bit_cast<uint32_t>(value) & 0xFFFF) != 0) {
        return false;
      }
    }
  }
  return true;
}());

// E2M1 values as bfloat16, split into their low and high bytes for 16-entry
// byte-shuffle lookups.
inline constexpr auto kE2M1Bf16Bytes = [] {
  std::array<std::array<uint8_t, 16>, 2> bytes{};  // low, high
  for (int code = 0; code < 16; ++code) {
    bytes[0][code] = bf16_of_exact(kE2M1Values[code]) & 0xFF;
    bytes[1][code] = bf16_of_exact(kE2M1Values[code]) >> 8;
  }
  return bytes;
}();

// E4M3 magnitudes (codes 0..127) as bfloat16; bit 7 of a code is its sign
// bit, to be or-ed in as the float's.
inline constexpr auto kE4M3Bf16Magnitudes = [] {
  std::array<bf16_bits, 128> table{};
  for (int code = 0; code < 128; ++code) {
    table[code] = bf16_of_exact(kE4M3Values[code]);
  }
  return table;
}();

static_assert([] {
  for (int code = 0; code < 128; ++code) {
    if (std::bit_cast<uint32_t>(kE4M3Values[code + 128]) !=
        (std::bit_cast<uint32_t>(kE4M3Values[code]) | 0x80000000u)) {
      return false;
    }
  }
  return true;
}());

// E4M3 from its bits by arithmetic, without a table: a code in the top byte
// of a 32-bit lane, shifted right arithmetically by kE4M3TopShift (the sign
// stays at bit 31, the magnitude's 7 bits land at float bits 20..26) and
// masked with kE4M3TopMask, reads as a float kE4M3TopFactor times smaller
// than the code's value (E4M3's subnormals as float subnormals). Magnitude
// 0x7F, NaN, comes out as the finite +-480.
inline constexpr int kE4M3TopShift = 4;
inline constexpr uint32_t kE4M3TopMask = 0x87F00000u;
inline constexpr float kE4M3TopFactor = 0x1p120f;

constexpr float e4m3_from_top(uint8_t code) {
  const int32_t top = static_cast<int32_t>(uint32_t{code} << 24);
  return std::bit_cast<float>(
             static_cast<uint32_t>(top >> kE4M3TopShift) & kE4M3TopMask) *
         kE4M3TopFactor;
}

static_assert([] {
  for (int code = 0; code < 256; ++code) {
    const bool nan = (code & 0x7F) == 0x7F;
    const float value = e4m3_from_top(static_cast<uint8_t>(code));
    if (nan ? value != ((code & 0x80) ? -480.0f : 480.0f)
            : std::bit_cast<uint32_t>(value) !=
                  std::bit_cast<uint32_t>(kE4M3Values[code])) {
      return false;
    }
  }
  return true;
}());

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

  // From this many rows of x on, float32 x takes OpenBLAS/Accelerate sgemm on
  // dequantized panels instead of dot (x @ W^T) / axpy (x @ W), measured per
  // ISA: the faster the fused kernel, the more rows the panels need to pay
  // for themselves.
  int64_t sgemm_min_rows_dot;
  int64_t sgemm_min_rows_axpy;

  // The small-M product x @ W^T, in two steps: arrange_x puts `rows` rows
  // of x in the order dot's steps read them, arranged_length(w) floats each
  // (once per product, for all its tasks); then dot computes
  // out[m * ldo + n - n0] = sum_k x[m * w.cols + k] * W[n, k], for m < M and
  // n in [n0, n1), from the arranged rows (and x itself for rare rows redone
  // element by element), W decoded in registers into the dots (few rows of
  // x) or into L1 panels (more).
  int64_t (*arranged_length)(const QuantizedMatrix& w);
  void (*arrange_x)(
      const QuantizedMatrix& w, const float* x, int64_t rows, float* arranged);
  void (*dot)(
      const QuantizedMatrix& w,
      const float* x,
      const float* arranged_x,
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

  // As dot, with bfloat16 x and bfloat16 dot products (scales applied in
  // float32, so for every format).
  void (*dot_bf16)(
      const QuantizedMatrix& w,
      const bf16_bits* x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo);

  // The large-M x @ W^T for Format::bf16_exact formats, in two steps:
  // arrange_x_bf16 puts `rows` rows of x (w.cols each) in the order the GEMM
  // reads them, then gemm_bf16 computes output columns [n0, n1) as dot does
  // from all M arranged rows: W is decoded into packed bfloat16 panels
  // feeding a bf16 dot-product GEMM kernel.
  void (*arrange_x_bf16)(
      const QuantizedMatrix& w,
      const bf16_bits* x,
      int64_t rows,
      bf16_bits* arranged);
  void (*gemm_bf16)(
      const QuantizedMatrix& w,
      const bf16_bits* arranged_x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo);
};

// The kernels of each ISA compiled into this build (null when not compiled).
const IsaKernels* portable_kernels();
const IsaKernels* avx2_kernels();
const IsaKernels* avx512_kernels();
const IsaKernels* neon_kernels();

}  // namespace mlx_fpqmm::cpu
