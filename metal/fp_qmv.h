// Decode (matrix-vector) kernels for a few rows of x: every weight and scale
// byte is read from device memory once per block of x rows, and the block
// covers every M the plan sends here.
#pragma once

#include <metal_stdlib>

#include "fp_common.h"

namespace fpqmm {

using namespace metal;

// y = x @ W^T with W (N, K) grouped along K, for up to `rows` rows of x per
// threadgroup. Each simdgroup owns `outputs` rows of W; its lanes split K,
// each reading 8 bytes of every owned row per step, and the partial dot
// products meet in simd_sum.
template <typename T, int bits, int rows, int outputs>
inline void fp_qmv_impl(
    Operands<T> op, uint2 tgid, ushort simdgroup, ushort lane) {
  constexpr int codes_per_lane = kQmvBytesPerLane * 8 / bits;  // 16 or 8
  constexpr int words_per_lane = kQmvBytesPerLane / 4;
  constexpr int step = kSimdSize * codes_per_lane;
  static_assert(rows <= kSimdSize, "lane r writes x row r");

  const int M = op.M;
  const int N = op.N;
  const int K = op.K;
  const int first_output = (int(tgid.x) * kQmvSimdgroups + simdgroup) * outputs;
  const int first_row = int(tgid.y) * rows;
  const int valid_rows = min(rows, M - first_row);
  const int words_per_row = K * bits / 32;
  const int groups_per_row = K / group_size;
  // Steps start at multiples of the group size, so groups are aligned runs
  // of lanes; the first lane of each run reads the scale for all of them.
  const int lanes_per_group = group_size / codes_per_lane;
  const ushort group_leader = lane - lane % lanes_per_group;
  const device T* x_rows = op.x + int64_t(first_row) * K;

  float sums[rows][outputs] = {};
  for (int k0 = 0; k0 < K; k0 += step) {
    const int k = k0 + lane * codes_per_lane;
    const bool lane_in_k = k < K;  // K is a multiple of 16: whole chunks

    float weights[outputs][codes_per_lane];
    for (int o = 0; o < outputs; ++o) {
      const int n = first_output + o;
      const bool valid = lane_in_k && n < N;
      const float scale = shared_group_scale(
          op.scales,
          int64_t(n) * groups_per_row + k / group_size,
          valid,
          lane,
          group_leader);
      uint32_t packed[words_per_lane] = {};
      if (valid) {
        load_words<words_per_lane>(
            op.w + int64_t(n) * words_per_row + k * bits / 32, packed);
      }
      decode_scaled<bits, codes_per_lane>(packed, scale, weights[o]);
    }

    for (int r = 0; r < rows; ++r) {
      if (r >= valid_rows || !lane_in_k) {
        continue;
      }
      const device T* x_chunk = x_rows + int64_t(r) * K + k;
      for (int i = 0; i < codes_per_lane; i += 4) {
        float4 x4 = float4(*(const device vec<T, 4>*)(x_chunk + i));
        for (int o = 0; o < outputs; ++o) {
          float4 w4 = float4(
              weights[o][i],
              weights[o][i + 1],
              weights[o][i + 2],
              weights[o][i + 3]);
          sums[r][o] += dot(x4, w4);
        }
      }
    }
  }

  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < outputs; ++o) {
      float total = simd_sum(sums[r][o]);
      const int n = first_output + o;
      if (lane == r && r < valid_rows && n < N) {
        op.y[int64_t(first_row + r) * N + n] = static_cast<T>(total);
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
      for (int r = 0; r < rows; ++r) {
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
