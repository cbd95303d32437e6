// W dequantized in y's type (the op's dequantize + matmul for many rows of
// x): y[r, k] = code(r, k) * scale(r, k / group_size) (* nvfp4's global
// factor: one, or with args.w_matrices > 1 one per matrix) for the rows of
// W, all of its matrices folded into args.N rows of args.K codes,
// row-contiguous. A thread takes a 32-bit word of codes (8
// E2M1 or 4 E4M3, all in one group: groups are 16 codes or more) and stores
// its values as one vector.
#pragma once

#include "backend/cuda/kernels/fp_operands.cuh"
#include "backend/cuda/kernels/grid_stride.cuh"

namespace fpqmm::cuda {

template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float a, float b) {
  if constexpr (std::is_same_v<T, __half>) {
    return bits_of(__floats2half2_rn(a, b));
  } else {
    return bits_of(__floats2bfloat162_rn(a, b));
  }
}

// The word's codes times `scale`, in K order, as T.
template <typename T, int bits>
__device__ __forceinline__ void store_scaled_word(
    uint32_t word, float scale, T* to) {
  constexpr int codes = 32 / bits;
  constexpr int stride = 16 / bits;  // decode_pair's pair: codes p, p + stride
  float values[codes];
#pragma unroll
  for (int p = 0; p < codes / 2; ++p) {
    // Exact in half (E2M1 and E4M3 values, subnormals and NaN included).
    const float2 v = __half22float2(decode_pair<__half, bits>(word, p));
    values[p] = v.x * scale;
    values[p + stride] = v.y * scale;
  }
  if constexpr (std::is_same_v<T, float>) {
    auto* out = reinterpret_cast<float4*>(to);
#pragma unroll
    for (int i = 0; i < codes / 4; ++i) {
      out[i] = make_float4(
          values[4 * i],
          values[4 * i + 1],
          values[4 * i + 2],
          values[4 * i + 3]);
    }
  } else {
    uint32_t pairs[codes / 2];
#pragma unroll
    for (int i = 0; i < codes / 2; ++i) {
      pairs[i] = pack_pair<T>(values[2 * i], values[2 * i + 1]);
    }
    if constexpr (codes == 8) {
      *reinterpret_cast<uint4*>(to) =
          make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    } else {
      *reinterpret_cast<uint2*>(to) = make_uint2(pairs[0], pairs[1]);
    }
  }
}

template <typename T, int bits, int encoding>
__global__ void __launch_bounds__(kDequantizeThreads)
    fp_dequantize(const QmmArgs args) {
  using S = typename ScaleStorage<encoding>::type;
  constexpr int codes = 32 / bits;
  const int64_t row_words = args.K / codes;
  const int64_t groups_per_row = args.K / args.group_size;
  const int64_t words = row_words * args.N;
  const auto* scales = static_cast<const S*>(args.scales);
  auto* y = static_cast<T*>(args.y);
  // One factor for all rows (the dense product's W), hoisted; per matrix
  // (gather's experts) it costs a division and a load per word.
  const float factor = global_factor(args.global_scale, 0);
  const int64_t matrix_rows = args.N / args.w_matrices;
  for_each_in_grid(words, [&](int64_t i) {
    const int64_t row = i / row_words;
    const int64_t k = (i - row * row_words) * codes;
    const float scale =
        decode_scale<encoding>(
            scales[row * groups_per_row + k / args.group_size]) *
        (args.w_matrices > 1
             ? global_factor(args.global_scale, row / matrix_rows)
             : factor);
    store_scaled_word<T, bits>(__ldg(args.w + i), scale, y + row * args.K + k);
  });
}

}  // namespace fpqmm::cuda
