// The prefill kernel: a BM x 32 tile of y per threadgroup from 8x8
// simdgroup_matrix products with fp32 accumulation. Per block of 32 along K,
// the threadgroup stages x (wide loads) and the dequantized weights in
// threadgroup memory, then each of its 2 x 2 simdgroups multiplies its
// (BM / 2) x 16 corner.
#pragma once

#include <metal_simdgroup_matrix>
#include <metal_stdlib>

#include "fp_common.h"

namespace fpqmm {

using namespace metal;

// Where a lane's two elements sit in an 8x8 simdgroup_matrix: (column, row)
// of the first; the second is one column right.
inline ushort2 fragment_position(ushort lane) {
  ushort quad = lane / 4;
  return ushort2((quad & 2) * 2 + (lane % 2) * 2, (quad & 4) + (lane / 2) % 4);
}

// transpose: y = x @ W^T with W (N, K) grouped along K.
// Otherwise: y = x @ W with W (K, N) grouped along N.
template <typename T, int bits, int BM, bool transpose>
[[kernel]] void fp_qmm(
    FPQMM_BUFFERS(T),
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup T* w_tile [[threadgroup(1)]],
    uint3 tgid [[threadgroup_position_in_grid]],
    ushort thread_index [[thread_index_in_threadgroup]],
    ushort simdgroup [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  constexpr int BN = kMmaBlockN;
  constexpr int BK = kMmaBlockK;
  constexpr int x_stride = padded_row(BK, sizeof(T));
  // The weight tile is stored as W is: rows of n (transpose) or of k.
  constexpr int w_stride = padded_row(transpose ? BK : BN, sizeof(T));
  constexpr int simdgroup_rows = BM / 2;
  constexpr int simdgroup_cols = BN / 2;
  constexpr int fragments_m = simdgroup_rows / 8;
  constexpr int fragments_n = simdgroup_cols / 8;
  // Loaders: thread i moves chunk i % 4 (8 values) of tile row i / 4.
  constexpr int chunk = 8;
  constexpr int chunks_per_row = 4;
  constexpr int rows_per_pass = kMmaThreads / chunks_per_row;
  constexpr int words_per_chunk = chunk * bits / 32;
  static_assert(
      BK == chunk * chunks_per_row && BN == chunk * chunks_per_row,
      "tile width");
  static_assert(
      BN == rows_per_pass && BK == rows_per_pass, "one pass per weight tile");

  Operands<T> op = FPQMM_OPERANDS(T, tgid.z);
  const int row0 = int(tgid.y) * BM;
  const int col0 = int(tgid.x) * BN;
  const int load_row = thread_index / chunks_per_row;
  const int load_chunk = thread_index % chunks_per_row;

  // Fragments holding any valid output; the others are never computed, so
  // a tiny M or an N tail costs no wasted simdgroup-matrix work. The x rows
  // those fragments read, past M, are zeroed.
  const int sg_row = (simdgroup / 2) * simdgroup_rows;
  const int sg_col = (simdgroup % 2) * simdgroup_cols;
  const int active_m = clamp((M - row0 - sg_row + 7) / 8, 0, fragments_m);
  const int active_n = clamp((N - col0 - sg_col + 7) / 8, 0, fragments_n);
  const int x_rows_used = min(BM, (M - row0 + 7) / 8 * 8);
  const bool x_rows_aligned = K % 4 == 0;  // vec<T, 4> loads

  const int w_rows = transpose ? N : K;
  const int w_row_codes = transpose ? K : N;
  const int words_per_row = w_row_codes * bits / 32;
  const int groups_per_row = w_row_codes / group_size;
  // The four chunk-loaders of a row are adjacent lanes; the first one of
  // each group reads its scale and hands it to the others.
  const int chunks_per_group = min(group_size / chunk, chunks_per_row);
  const ushort scale_leader = lane - load_chunk % chunks_per_group;

  const ushort2 position = fragment_position(lane);
  simdgroup_matrix<float, 8, 8> acc[fragments_m][fragments_n];
  for (int i = 0; i < fragments_m; ++i) {
    for (int j = 0; j < fragments_n; ++j) {
      acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }

  float scale = 0.0f;
  for (int k0 = 0; k0 < K; k0 += BK) {
    const int w_row = transpose ? col0 + load_row : k0 + load_row;
    const int code0 = (transpose ? k0 : col0) + load_chunk * chunk;
    const bool w_valid = w_row < w_rows && code0 < w_row_codes;
    // With transpose a thread keeps its row of W, so a group wider than the
    // block keeps its scale across blocks.
    if (!transpose || k0 % group_size < BK) {
      float leader_scale = 0.0f;
      if (w_valid && lane == scale_leader) {
        leader_scale =
            op.scales[int64_t(w_row) * groups_per_row + code0 / group_size];
      }
      scale = simd_shuffle(leader_scale, scale_leader);
    }

    threadgroup_barrier(
        mem_flags::mem_threadgroup);  // last block's MMAs are done
    for (int r = load_row; r < x_rows_used; r += rows_per_pass) {
      const int row = row0 + r;
      const int k = k0 + load_chunk * chunk;
      const device T* source = op.x + int64_t(row) * K + k;
      threadgroup T* destination = x_tile + r * x_stride + load_chunk * chunk;
      if (row < M && k + chunk <= K && x_rows_aligned) {
        for (int i = 0; i < chunk; i += 4) {
          *(threadgroup vec<T, 4>*)(destination + i) =
              *(const device vec<T, 4>*)(source + i);
        }
      } else {
        for (int i = 0; i < chunk; ++i) {
          destination[i] = row < M && k + i < K ? source[i] : T(0);
        }
      }
    }
    uint32_t packed[words_per_chunk] = {};
    if (w_valid) {
      load_words<words_per_chunk>(
          op.w + int64_t(w_row) * words_per_row + code0 * bits / 32, packed);
    }
    threadgroup T* w_destination =
        w_tile + load_row * w_stride + load_chunk * chunk;
    for (int i = 0; i < chunk; i += 4) {
      vec<T, 4> values;
      for (int j = 0; j < 4; ++j) {
        values[j] = static_cast<T>(
            float(decode_code<bits>(code_at<bits>(packed, i + j))) * scale);
      }
      *(threadgroup vec<T, 4>*)(w_destination + i) = values;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const int k_extent = min(BK, K - k0);  // zero-padded up to a multiple of 8
    for (int kk = 0; kk < k_extent; kk += 8) {
      simdgroup_matrix<float, 8, 8> a[fragments_m];
      simdgroup_matrix<float, 8, 8> b[fragments_n];
      for (int i = 0; i < fragments_m; ++i) {
        if (i < active_m) {
          const threadgroup T* source =
              x_tile + (sg_row + 8 * i + position.y) * x_stride + kk +
              position.x;
          a[i].thread_elements()[0] = float(source[0]);
          a[i].thread_elements()[1] = float(source[1]);
        }
      }
      for (int j = 0; j < fragments_n; ++j) {
        if (j < active_n) {
          const int k = kk + position.y;
          const int n = sg_col + 8 * j + position.x;
          for (int e = 0; e < 2; ++e) {
            b[j].thread_elements()[e] = float(
                transpose ? w_tile[(n + e) * w_stride + k]
                          : w_tile[k * w_stride + n + e]);
          }
        }
      }
      for (int i = 0; i < fragments_m; ++i) {
        for (int j = 0; j < fragments_n; ++j) {
          if (i < active_m && j < active_n) {
            simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
          }
        }
      }
    }
  }

  for (int i = 0; i < fragments_m; ++i) {
    for (int j = 0; j < fragments_n; ++j) {
      const int row = row0 + sg_row + 8 * i + position.y;
      const int col = col0 + sg_col + 8 * j + position.x;
      if (i >= active_m || j >= active_n || row >= M) {
        continue;
      }
      for (int e = 0; e < 2; ++e) {
        if (col + e < N) {
          op.y[int64_t(row) * N + col + e] =
              static_cast<T>(acc[i][j].thread_elements()[e]);
        }
      }
    }
  }
}

}  // namespace fpqmm
