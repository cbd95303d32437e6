// What every fp-quantized matmul kernel shares: the function constants, the
// buffer parameters, batch offsets and packed-code loads.
#pragma once

#include <metal_stdlib>

#include "backend/metal/kernels/fp_decode.h"
#include "backend/metal/kernels/fp_params.h"

// Fully unrolls the loop that follows (a constant trip count): its indices
// into thread arrays become constants and the arrays registers.
#define FPQMM_UNROLL _Pragma("clang loop unroll(full)")

namespace fpqmm {

using namespace metal;

// clang-format off
constant int group_size [[function_constant(FPQMM_CONSTANT_GROUP_SIZE)]];
constant int scale_encoding [[function_constant(FPQMM_CONSTANT_SCALE_ENCODING)]];
constant bool has_global_scale [[function_constant(FPQMM_CONSTANT_HAS_GLOBAL_SCALE)]];
// clang-format on

// The buffers of every kernel, in the slots of fp_params.h.
#define FPQMM_BUFFERS(T)                                                      \
  const device uint32_t *w [[buffer(FPQMM_BUFFER_W)]],                        \
      const device uint8_t *scales [[buffer(FPQMM_BUFFER_SCALES)]],           \
      const device float *global_scale [[buffer(FPQMM_BUFFER_GLOBAL_SCALE)]], \
      const device T *x [[buffer(FPQMM_BUFFER_X)]],                           \
      device T *y [[buffer(FPQMM_BUFFER_Y)]],                                 \
      constant int &M [[buffer(FPQMM_BUFFER_M)]],                             \
      constant int &N [[buffer(FPQMM_BUFFER_N)]],                             \
      constant int &K [[buffer(FPQMM_BUFFER_K)]],                             \
      constant int &batch_ndims [[buffer(FPQMM_BUFFER_BATCH_NDIMS)]],         \
      constant int *batch_shape [[buffer(FPQMM_BUFFER_BATCH_SHAPE)]],         \
      constant int64_t *x_batch_strides                                       \
      [[buffer(FPQMM_BUFFER_X_BATCH_STRIDES)]],                               \
      constant int64_t *w_batch_strides                                       \
      [[buffer(FPQMM_BUFFER_W_BATCH_STRIDES)]],                               \
      constant int64_t *scales_batch_strides                                  \
      [[buffer(FPQMM_BUFFER_SCALES_BATCH_STRIDES)]]
// The extra buffers of the gather kernels.
// The position parameters of a tiled kernel, and the arguments its *_impl
// takes from them for tile `tile`.
#define FPQMM_TILE_POSITION                                \
  uint3 tgid [[threadgroup_position_in_grid]],             \
      ushort thread_index [[thread_index_in_threadgroup]], \
      ushort simdgroup [[simdgroup_index_in_threadgroup]], \
      ushort lane [[thread_index_in_simdgroup]]
#define FPQMM_TILE_THREAD(tile) tile, thread_index, simdgroup, lane

#define FPQMM_GATHER_BUFFERS                                                   \
  const device uint32_t *lhs_indices [[buffer(FPQMM_BUFFER_LHS_INDICES)]],     \
      const device uint32_t *rhs_indices [[buffer(FPQMM_BUFFER_RHS_INDICES)]], \
      constant int &x_matrices [[buffer(FPQMM_BUFFER_X_MATRICES)]],            \
      constant int &w_matrices [[buffer(FPQMM_BUFFER_W_MATRICES)]],            \
      constant uint &lhs_divisor [[buffer(FPQMM_BUFFER_LHS_DIVISOR)]]
// The names FPQMM_BUFFERS declares, in batch_operands' order.
#define FPQMM_BUFFER_NAMES                                          \
  w, scales, global_scale, x, y, M, N, K, batch_ndims, batch_shape, \
      x_batch_strides, w_batch_strides, scales_batch_strides
// The names run_operands takes from FPQMM_BUFFERS and FPQMM_GATHER_BUFFERS.
#define FPQMM_RUN_NAMES \
  w, scales, global_scale, x, y, N, K, rhs_indices, w_matrices
// The names gather_operands takes from FPQMM_BUFFERS and
// FPQMM_GATHER_BUFFERS, in its order.
#define FPQMM_GATHER_NAMES                                          \
  w, scales, global_scale, x, y, M, N, K, lhs_indices, rhs_indices, \
      x_matrices, w_matrices, lhs_divisor

// The matrices of one product and their shape: y (M x N) = x (M x K) times
// W (N x K, transpose) or W (K x N).
template <typename T>
struct Operands {
  const device uint32_t* w;
  GroupScales scales;
  const device T* x;
  device T* y;
  int M;
  int N;
  int K;
};

// The operands of batch element `batch`: x, w and scales offset through their
// strides (broadcast axes have stride 0); y is contiguous.
template <typename T>
inline Operands<T> batch_operands(
    const device uint32_t* w,
    const device uint8_t* scales,
    const device float* global_scale,
    const device T* x,
    device T* y,
    int M,
    int N,
    int K,
    int batch_ndims,
    constant int* batch_shape,
    constant int64_t* x_batch_strides,
    constant int64_t* w_batch_strides,
    constant int64_t* scales_batch_strides,
    uint batch) {
  int64_t x_offset = 0;
  int64_t w_offset = 0;
  int64_t scales_offset = 0;
  uint rest = batch;
  for (int axis = batch_ndims - 1; axis >= 0; --axis) {
    int64_t index = rest % uint(batch_shape[axis]);
    rest /= uint(batch_shape[axis]);
    x_offset += index * x_batch_strides[axis];
    w_offset += index * w_batch_strides[axis];
    scales_offset += index * scales_batch_strides[axis];
  }
  GroupScales group_scales{
      scales + scales_offset * scale_itemsize(scale_encoding),
      scale_encoding,
      global_scale_factor(global_scale, has_global_scale)};
  return {
      w + w_offset,
      group_scales,
      x + x_offset,
      y + int64_t(batch) * M * N,
      M,
      N,
      K};
}

// x (M x K) and y (M x N) times W matrix `expert` (with its global scale).
// With `valid` false (an index out of range) W matrix 0 is read with a NaN
// scale factor, so the outputs are NaN and nothing is read out of bounds.
template <typename T, int bits>
inline Operands<T> expert_operands(
    const device uint32_t* w,
    const device uint8_t* scales,
    const device float* global_scale,
    const device T* x,
    device T* y,
    int M,
    int N,
    int K,
    uint expert,
    bool valid) {
  expert = valid ? expert : 0;
  const int64_t codes = int64_t(N) * K;
  float factor =
      has_global_scale ? global_scale[expert] / kNvfp4GlobalScaleDivisor : 1.0f;
  GroupScales group_scales{
      scales + expert * (codes / group_size) * scale_itemsize(scale_encoding),
      scale_encoding,
      valid ? factor : as_type<float>(0x7fc00000u)};  // quiet NaN
  return {w + expert * (codes * bits / 32), group_scales, x, y, M, N, K};
}

// The operands of gather pair `pair`: x matrix lhs_indices[pair] (or
// pair / lhs_divisor) and W matrix rhs_indices[pair]; y is contiguous.
template <typename T, int bits>
inline Operands<T> gather_operands(
    const device uint32_t* w,
    const device uint8_t* scales,
    const device float* global_scale,
    const device T* x,
    device T* y,
    int M,
    int N,
    int K,
    const device uint32_t* lhs_indices,
    const device uint32_t* rhs_indices,
    int x_matrices,
    int w_matrices,
    uint lhs_divisor,
    uint pair) {
  const uint lhs = lhs_divisor != 0 ? pair / lhs_divisor : lhs_indices[pair];
  const uint rhs = rhs_indices[pair];
  const bool valid = lhs < uint(x_matrices) && rhs < uint(w_matrices);
  return expert_operands<T, bits>(
      w,
      scales,
      global_scale,
      x + (valid ? lhs : 0) * (int64_t(M) * K),
      y + int64_t(pair) * M * N,
      M,
      N,
      K,
      rhs,
      valid);
}

// The sorted gather kernels take the rows of x (one per pair) in runs of one
// expert: the end of the run that starts at row `first`, before `rows_end`.
inline int expert_run_end(
    const device uint32_t* rhs_indices, int first, int rows_end) {
  int end = first + 1;
  while (end < rows_end && rhs_indices[end] == rhs_indices[first]) {
    ++end;
  }
  return end;
}

// The operands of the run of rows [first, end): those rows of x and y, W
// matrix rhs_indices[first].
template <typename T, int bits>
inline Operands<T> run_operands(
    const device uint32_t* w,
    const device uint8_t* scales,
    const device float* global_scale,
    const device T* x,
    device T* y,
    int N,
    int K,
    const device uint32_t* rhs_indices,
    int w_matrices,
    int first,
    int end) {
  const uint expert = rhs_indices[first];
  return expert_operands<T, bits>(
      w,
      scales,
      global_scale,
      x + int64_t(first) * K,
      y + int64_t(first) * N,
      end - first,
      N,
      K,
      expert,
      expert < uint(w_matrices));
}

// Loads `words` consecutive uint32 (1, 2 or 4) in one access.
template <int words>
inline void load_words(const device uint32_t* source, thread uint32_t* out) {
  static_assert(words == 1 || words == 2 || words == 4, "1, 2 or 4 words");
  if constexpr (words == 4) {
    uint4 packed = *(const device uint4*)source;
    for (int i = 0; i < 4; ++i) {
      out[i] = packed[i];
    }
  } else if constexpr (words == 2) {
    uint2 packed = *(const device uint2*)source;
    out[0] = packed.x;
    out[1] = packed.y;
  } else {
    out[0] = source[0];
  }
}

// Code i of a run of packed words (least significant bits first).
template <int bits>
inline uint code_at(const thread uint32_t* words, int i) {
  constexpr int per_word = 32 / bits;
  return (words[i / per_word] >> (bits * (i % per_word))) & ((1u << bits) - 1);
}

// The `count` codes of `words`, decoded and scaled, as U.
template <int bits, int count, typename U>
inline void decode_scaled(
    const thread uint32_t* words, float scale, thread U* out) {
  for (int i = 0; i < count; ++i) {
    out[i] = static_cast<U>(
        float(decode_code<bits>(code_at<bits>(words, i))) * scale);
  }
}

// A group scale that a run of lanes shares: the run's leader reads it (when
// `valid`), simd_shuffle hands it to the others. Every lane must call it.
inline float shared_group_scale(
    GroupScales scales, int64_t index, bool valid, ushort lane, ushort leader) {
  float scale = 0.0f;
  if (valid && lane == leader) {
    scale = scales[index];
  }
  return simd_shuffle(scale, leader);
}

}  // namespace fpqmm

// An explicit instantiation of a kernel template under a host name.
#define FPQMM_INSTANTIATE(name, function, ...)                            \
  template [[host_name(name)]] [[kernel]] decltype(function<__VA_ARGS__>) \
      function<__VA_ARGS__>;

// Calls m(type_name, T, codes, bits, ...) for each x type and code format.
#define FPQMM_FOR_TYPES_AND_CODES(m)                      \
  m(float32, float, e2m1, 4) m(float32, float, e4m3, 8)   \
      m(float16, half, e2m1, 4) m(float16, half, e4m3, 8) \
          m(bfloat16, bfloat, e2m1, 4) m(bfloat16, bfloat, e4m3, 8)
