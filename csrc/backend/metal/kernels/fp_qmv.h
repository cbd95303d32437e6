// Decode (matrix-vector) kernels for a few rows of x: every weight and scale
// byte is read from device memory once per block of x rows, and the block
// covers every M the plan sends here.
#pragma once

#include <metal_stdlib>

#include "backend/metal/kernels/fp_common.h"

namespace fpqmm {

using namespace metal;

// The kQmvChunk codes of `words` packed words, in order, as floats divided
// by code_pair_scale<bits>.
template <int bits, int words>
inline void decode_chunk(const thread uint32_t* packed, thread float* codes) {
  constexpr int codes_per_word = 32 / bits;
  constexpr int pairs_per_word = codes_per_word / 2;
  FPQMM_UNROLL
  for (int i = 0; i < words; ++i) {
    FPQMM_UNROLL
    for (int p = 0; p < pairs_per_word; ++p) {
      const half2 pair = decode_code_pair<bits>(packed[i], p);
      codes[i * codes_per_word + p] = pair.x;
      codes[i * codes_per_word + p + pairs_per_word] = pair.y;
    }
  }
}

// The dot product of kQmvChunk codes (decode_chunk's) with kQmvChunk values
// of x, times the codes' group scale. A finite scale multiplies the sum; a
// non-finite one multiplies each code, so that an inf scale gives NaN on zero
// codes and zero x and opposite infinities cancel to NaN, element by element
// as the CPU path (and dequantize-then-matmul) does.
template <int bits>
inline float scaled_dot(
    const thread float* codes, const thread float* x, float scale) {
  constexpr float pair_scale = code_pair_scale<bits>();
  float sum = 0.0f;
  if (isfinite(scale)) {
    FPQMM_UNROLL
    for (int i = 0; i < kQmvChunk; ++i) {
      sum = fma(codes[i], x[i], sum);
    }
    // The pair scale before the group scale: their product can overflow
    // where the product with the sum does not.
    return sum * pair_scale * scale;
  }
  const float code_scale = pair_scale * scale;
  FPQMM_UNROLL
  for (int i = 0; i < kQmvChunk; ++i) {
    sum = fma(codes[i] * code_scale, x[i], sum);
  }
  return sum;
}

// kQmvChunk values of x as float (K is a multiple of 4: vector loads).
template <typename T>
inline void load_x_chunk(const device T* source, thread float* x) {
  FPQMM_UNROLL
  for (int i = 0; i < kQmvChunk; i += 4) {
    const vec<T, 4> x4 = *(const device vec<T, 4>*)(source + i);
    FPQMM_UNROLL
    for (int j = 0; j < 4; ++j) {
      x[i + j] = x4[j];
    }
  }
}

// y = x @ W^T with W (N, K) grouped along K, for up to `rows` rows of x per
// threadgroup. Each simdgroup owns `outputs` rows of W. Lane l takes whole
// groups of K (l, l + 32, ...), so it alone reads their scales: W and the
// scales move once, x once per simdgroup, each lane decodes a chunk of codes
// once for all rows of x and scales once per group and chunk, and the
// lanes' partial sums of an output meet in one simd_sum.
template <typename T, int bits, int rows, int outputs>
inline void fp_qmv_impl(
    Operands<T> op, uint2 tgid, ushort simdgroup, ushort lane) {
  constexpr int words = kQmvChunk * bits / 32;  // 2 or 4: one vector load
  static_assert(rows * outputs <= kSimdSize, "one writing lane per output");

  const int M = op.M;
  const int N = op.N;
  const int K = op.K;
  // Grid x walks the blocks of x rows, y the blocks of outputs.
  const int first_output = (int(tgid.y) * kQmvSimdgroups + simdgroup) * outputs;
  const int first_row = int(tgid.x) * rows;
  const int valid_rows = min(rows, M - first_row);
  const int words_per_row = K * bits / 32;
  const int groups_per_row = K / group_size;
  const device T* x_rows = op.x + int64_t(first_row) * K;

  // The outputs past N (of the last simdgroup) read nothing and stay zero.
  const int valid_outputs = min(outputs, N - first_output);
  const device uint32_t* w_rows[outputs];
  int64_t scale_rows[outputs];
  FPQMM_UNROLL
  for (int o = 0; o < outputs; ++o) {
    const int64_t n = first_output + o;
    w_rows[o] = op.w + n * words_per_row;
    scale_rows[o] = n * groups_per_row;
  }

  float sums[rows][outputs] = {};
  for (int group = lane; group < groups_per_row; group += kSimdSize) {
    float scales[outputs];
    FPQMM_UNROLL
    for (int o = 0; o < outputs; ++o) {
      scales[o] = o < valid_outputs ? op.scales[scale_rows[o] + group] : 0.0f;
    }
    for (int k = group * group_size; k < (group + 1) * group_size;
         k += kQmvChunk) {
      float codes[outputs][kQmvChunk];
      FPQMM_UNROLL
      for (int o = 0; o < outputs; ++o) {
        uint32_t packed[words] = {};
        if (o < valid_outputs) {
          load_words<words>(w_rows[o] + k * bits / 32, packed);
        }
        decode_chunk<bits, words>(packed, codes[o]);
      }
      // Unrolled with a break, so sums[r] is indexed by constants: a
      // register array, where a run-time index would put it in memory.
      FPQMM_UNROLL
      for (int r = 0; r < rows; ++r) {
        if (r == valid_rows) {
          break;
        }
        float x_chunk[kQmvChunk];
        load_x_chunk(x_rows + int64_t(r) * K + k, x_chunk);
        FPQMM_UNROLL
        for (int o = 0; o < outputs; ++o) {
          sums[r][o] += scaled_dot<bits>(codes[o], x_chunk, scales[o]);
        }
      }
    }
  }

  // valid_rows is the same on every lane: the simd_sums are uniform.
  FPQMM_UNROLL
  for (int r = 0; r < rows; ++r) {
    if (r == valid_rows) {
      break;
    }
    FPQMM_UNROLL
    for (int o = 0; o < outputs; ++o) {
      const float total = simd_sum(sums[r][o]);
      if (lane == r * outputs + o && o < valid_outputs) {
        op.y[int64_t(first_row + r) * N + first_output + o] =
            static_cast<T>(total);
      }
    }
  }
}

// y = x @ W with W (K, N) grouped along N, for up to kQvmRows rows of x per
// threadgroup. Each lane owns 8 adjacent outputs and walks K, so a
// simdgroup reads whole 128- or 256-byte runs of each weight row; the
// simdgroups of a threadgroup take turns over blocks of 32 rows of K and add
// their partial sums in threadgroup memory at the end.
template <typename T, int bits>
inline void fp_qvm_impl(
    Operands<T> op,
    threadgroup float* partials,
    uint2 tgid,
    ushort simdgroup,
    ushort lane) {
  constexpr int columns = kQvmColumnsPerLane;
  constexpr int rows = kQvmRows;
  constexpr int words_per_lane = columns * bits / 32;

  const int M = op.M;
  const int N = op.N;
  const int K = op.K;
  const int column = (int(tgid.x) * kSimdSize + lane) * columns;
  const bool column_valid = column < N;  // N is a multiple of 16: whole chunks
  const int first_row = int(tgid.y) * rows;
  const int valid_rows = min(rows, M - first_row);
  const int words_per_row = N * bits / 32;
  const int groups_per_row = N / group_size;
  // Each threadgroup starts at a multiple of the group size, so groups are
  // aligned runs of lanes; the first lane of a run reads the scale.
  const int lanes_per_group = group_size / columns;
  const ushort group_leader = lane - lane % lanes_per_group;
  const device T* x_rows = op.x + int64_t(first_row) * K;

  float sums[rows][columns] = {};
  for (int k_block = simdgroup * kSimdSize; k_block < K;
       k_block += kQvmSimdgroups * kSimdSize) {
    // x[r][k_block + lane] once per lane; row k_block + j gets it by shuffle.
    float x_block[rows];
    for (int r = 0; r < rows; ++r) {
      bool valid = r < valid_rows && k_block + lane < K;
      x_block[r] =
          valid ? float(x_rows[int64_t(r) * K + k_block + lane]) : 0.0f;
    }
    const int block_rows = min(kSimdSize, K - k_block);
    for (int j = 0; j < block_rows; ++j) {
      const int k = k_block + j;
      const float scale = shared_group_scale(
          op.scales,
          int64_t(k) * groups_per_row + column / group_size,
          column_valid,
          lane,
          group_leader);
      uint32_t packed[words_per_lane] = {};
      if (column_valid) {
        load_words<words_per_lane>(
            op.w + int64_t(k) * words_per_row + column * bits / 32, packed);
      }
      float weights[columns];
      decode_scaled<bits, columns>(packed, scale, weights);
      // valid_rows is the same on every lane: the shuffles are uniform.
      for (int r = 0; r < valid_rows; ++r) {
        float x_value = simd_shuffle(x_block[r], ushort(j));
        for (int c = 0; c < columns; ++c) {
          sums[r][c] += x_value * weights[c];
        }
      }
    }
  }

  // Simdgroups 1.. hand their sums to simdgroup 0, which writes y; lanes
  // write adjacent words (no bank conflicts).
  if (simdgroup > 0) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < columns; ++c) {
        partials
            [(((simdgroup - 1) * rows + r) * columns + c) * kSimdSize + lane] =
                sums[r][c];
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simdgroup > 0 || !column_valid) {
    return;
  }
  for (int r = 0; r < valid_rows; ++r) {
    for (int c = 0; c < columns; ++c) {
      float total = sums[r][c];
      for (int s = 0; s < kQvmSimdgroups - 1; ++s) {
        total += partials[((s * rows + r) * columns + c) * kSimdSize + lane];
      }
      op.y[int64_t(first_row + r) * N + column + c] = static_cast<T>(total);
    }
  }
}

template <typename T, int bits, int rows, int outputs>
[[kernel]] void fp_qmv(
    FPQMM_BUFFERS(T),
    uint3 tgid [[threadgroup_position_in_grid]],
    ushort simdgroup [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  const Operands<T> op = batch_operands<T>(FPQMM_BUFFER_NAMES, tgid.z);
  fp_qmv_impl<T, bits, rows, outputs>(op, tgid.xy, simdgroup, lane);
}

template <typename T, int bits>
[[kernel]] void fp_qvm(
    FPQMM_BUFFERS(T),
    threadgroup float* partials [[threadgroup(0)]],
    uint3 tgid [[threadgroup_position_in_grid]],
    ushort simdgroup [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  const Operands<T> op = batch_operands<T>(FPQMM_BUFFER_NAMES, tgid.z);
  fp_qvm_impl<T, bits>(op, partials, tgid.xy, simdgroup, lane);
}

// The gather (mixture-of-experts) variants: grid z walks the index pairs.
template <typename T, int bits, int rows, int outputs>
[[kernel]] void fp_gather_qmv(
    FPQMM_BUFFERS(T),
    FPQMM_GATHER_BUFFERS,
    uint3 tgid [[threadgroup_position_in_grid]],
    ushort simdgroup [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  const Operands<T> op = gather_operands<T, bits>(FPQMM_GATHER_NAMES, tgid.z);
  fp_qmv_impl<T, bits, rows, outputs>(op, tgid.xy, simdgroup, lane);
}

template <typename T, int bits>
[[kernel]] void fp_gather_qvm(
    FPQMM_BUFFERS(T),
    FPQMM_GATHER_BUFFERS,
    threadgroup float* partials [[threadgroup(0)]],
    uint3 tgid [[threadgroup_position_in_grid]],
    ushort simdgroup [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  const Operands<T> op = gather_operands<T, bits>(FPQMM_GATHER_NAMES, tgid.z);
  fp_qvm_impl<T, bits>(op, partials, tgid.xy, simdgroup, lane);
}

}  // namespace fpqmm
