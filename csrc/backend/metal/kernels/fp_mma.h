// The prefill kernel: a BM x 32 tile of y per threadgroup from 8x8
// simdgroup_matrix products with fp32 accumulation. Per block of 32 along K,
// the threadgroup stages x (wide loads) and the dequantized weights in
// threadgroup memory, then each of its 2 x 2 simdgroups multiplies its
// (BM / 2) x 16 corner.
#pragma once

#include <metal_simdgroup_matrix>
#include <metal_stdlib>

#include "backend/metal/kernels/fp_loaders.h"

namespace fpqmm {

using namespace metal;

// Where a lane's two elements sit in an 8x8 simdgroup_matrix: (column, row)
// of the first; the second is one column right.
inline ushort2 fragment_position(ushort lane) {
  ushort quad = lane / 4;
  return ushort2((quad & 2) * 2 + (lane % 2) * 2, (quad & 4) + (lane / 2) % 4);
}

// The 8x8 fragment at `tile` (rows of `stride` elements) as a lane holds it;
// `transposed` reads it from a tile stored column-major (W stored as
// (N, K) for y = x @ W^T).
template <bool transposed, typename T>
inline simdgroup_matrix<float, 8, 8> load_fragment(
    const threadgroup T* tile, int stride, ushort2 position) {
  simdgroup_matrix<float, 8, 8> fragment;
  for (int e = 0; e < 2; ++e) {
    const int row = position.y;
    const int col = position.x + e;
    fragment.thread_elements()[e] =
        float(transposed ? tile[col * stride + row] : tile[row * stride + col]);
  }
  return fragment;
}

// A lane's elements of an accumulator fragment at (row, col) of y, those
// inside M x N.
template <typename T>
inline void store_fragment(
    simdgroup_matrix<float, 8, 8> fragment,
    device T* y,
    int M,
    int N,
    int row,
    int col) {
  for (int e = 0; e < 2; ++e) {
    if (row < M && col + e < N) {
      y[int64_t(row) * N + col + e] =
          static_cast<T>(fragment.thread_elements()[e]);
    }
  }
}

// One BM x 32 tile of y at `tile` (column block, row block), summed over
// k_begin <= k < k_end (a multiple of the group size and of 32, and K) and
// stored to `y` (M x N) as U: op.y, or a split-K slice of float partials.
// transpose: y = x @ W^T with W (N, K) grouped along K.
// Otherwise: y = x @ W with W (K, N) grouped along N.
template <typename T, int bits, int BM, bool transpose, typename U = T>
inline void fp_qmm_impl(
    Operands<T> op,
    device U* y,
    int k_begin,
    int k_end,
    threadgroup T* x_tile,
    threadgroup T* w_tile,
    uint2 tile,
    ushort thread_index,
    ushort simdgroup,
    ushort lane) {
  constexpr int BN = kMmaBlockN;
  constexpr int BK = kMmaBlockK;
  constexpr int x_stride = padded_row(BK, sizeof(T));
  // The weight tile is stored as W is: rows of n (transpose) or of k.
  constexpr int w_rows = transpose ? BN : BK;
  constexpr int w_cols = transpose ? BK : BN;
  constexpr int w_stride = padded_row(w_cols, sizeof(T));
  constexpr int simdgroup_rows = BM / 2;
  constexpr int simdgroup_cols = BN / 2;
  constexpr int fragments_m = simdgroup_rows / 8;
  constexpr int fragments_n = simdgroup_cols / 8;
  constexpr int chunk = 8;

  const int M = op.M;
  const int N = op.N;
  const int K = op.K;
  const int row0 = int(tile.y) * BM;
  const int col0 = int(tile.x) * BN;
  XTileLoader<T, BM, BK, kMmaThreads, chunk, x_stride> x_loader(thread_index);
  QuantizedTileLoader<T, bits, w_rows, w_cols, kMmaThreads, chunk, w_stride>
      w_loader(
          op.w,
          op.scales,
          transpose ? N : K,
          transpose ? K : N,
          thread_index,
          lane);

  // Fragments holding any valid output; the others are never computed, so
  // a tiny M or an N tail costs no wasted simdgroup-matrix work. The x rows
  // those fragments read, past M, are zeroed.
  const int sg_row = (simdgroup / 2) * simdgroup_rows;
  const int sg_col = (simdgroup % 2) * simdgroup_cols;
  const int active_m = clamp((M - row0 - sg_row + 7) / 8, 0, fragments_m);
  const int active_n = clamp((N - col0 - sg_col + 7) / 8, 0, fragments_n);
  const int x_rows_used = min(BM, (M - row0 + 7) / 8 * 8);

  const ushort2 position = fragment_position(lane);
  simdgroup_matrix<float, 8, 8> acc[fragments_m][fragments_n];
  for (int i = 0; i < fragments_m; ++i) {
    for (int j = 0; j < fragments_n; ++j) {
      acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }

  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
    const int w_row0 = transpose ? col0 : k0;
    const int w_col0 = transpose ? k0 : col0;
    // With transpose a thread keeps its rows of W, so a group wider than the
    // block keeps its scales across blocks.
    if (!transpose || k0 % group_size < BK) {
      w_loader.load_scales(w_row0, w_col0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // last block's MMAs
    x_loader.load(x_tile, op.x, M, K, row0, k0, x_rows_used);
    w_loader.load(w_tile, w_row0, w_col0);
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const int k_extent = min(BK, K - k0);  // zero-padded up to a multiple of 8
    for (int kk = 0; kk < k_extent; kk += 8) {
      simdgroup_matrix<float, 8, 8> a[fragments_m];
      simdgroup_matrix<float, 8, 8> b[fragments_n];
      for (int i = 0; i < fragments_m; ++i) {
        if (i < active_m) {
          a[i] = load_fragment<false>(
              x_tile + (sg_row + 8 * i) * x_stride + kk, x_stride, position);
        }
      }
      for (int j = 0; j < fragments_n; ++j) {
        if (j < active_n) {
          const int n = sg_col + 8 * j;
          b[j] = load_fragment<transpose>(
              w_tile + (transpose ? n * w_stride + kk : kk * w_stride + n),
              w_stride,
              position);
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

  for (int i = 0; i < active_m; ++i) {
    for (int j = 0; j < active_n; ++j) {
      store_fragment(
          acc[i][j],
          y,
          M,
          N,
          row0 + sg_row + 8 * i + position.y,
          col0 + sg_col + 8 * j + position.x);
    }
  }
}

template <typename T, int bits, int BM, bool transpose>
[[kernel]] void fp_qmm(
    FPQMM_BUFFERS(T),
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup T* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const Operands<T> op = batch_operands<T>(FPQMM_BUFFER_NAMES, tgid.z);
  fp_qmm_impl<T, bits, BM, transpose>(
      op, op.y, 0, op.K, x_tile, w_tile, FPQMM_TILE_THREAD(tgid.xy));
}

// Split K (y = x @ W^T with few tiles): threadgroup z sums K from
// z * split_k_step and stores its float partial tile in slice z of
// `partials` (split x M x N); fp_split_k_sum adds the slices up.
template <typename T, int bits, int BM>
[[kernel]] void fp_qmm_split_k(
    FPQMM_BUFFERS(T),
    device float* partials [[buffer(FPQMM_BUFFER_PARTIALS)]],
    constant int& split_k_step [[buffer(FPQMM_BUFFER_SPLIT_K_STEP)]],
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup T* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const Operands<T> op = batch_operands<T>(FPQMM_BUFFER_NAMES, 0);
  const int k_begin = int(tgid.z) * split_k_step;
  fp_qmm_impl<T, bits, BM, true>(
      op,
      partials + int64_t(tgid.z) * M * N,
      k_begin,
      min(K, k_begin + split_k_step),
      x_tile,
      w_tile,
      FPQMM_TILE_THREAD(tgid.xy));
}

// y = the sum of the `splits` slices of `partials`, cast to T: one output per
// thread, the slices added in order.
template <typename T>
[[kernel]] void fp_split_k_sum(
    const device float* partials [[buffer(FPQMM_BUFFER_PARTIALS)]],
    device T* y [[buffer(FPQMM_BUFFER_Y)]],
    constant int& M [[buffer(FPQMM_BUFFER_M)]],
    constant int& N [[buffer(FPQMM_BUFFER_N)]],
    constant int& splits [[buffer(FPQMM_BUFFER_SPLITS)]],
    uint index [[thread_position_in_grid]]) {
  const int64_t outputs = int64_t(M) * N;
  if (index >= outputs) {
    return;
  }
  float total = 0.0f;
  for (int s = 0; s < splits; ++s) {
    total += partials[s * outputs + index];
  }
  y[index] = static_cast<T>(total);
}

template <typename T, int bits, int BM, bool transpose>
[[kernel]] void fp_gather_qmm(
    FPQMM_BUFFERS(T),
    FPQMM_GATHER_BUFFERS,
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup T* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const Operands<T> op = gather_operands<T, bits>(FPQMM_GATHER_NAMES, tgid.z);
  fp_qmm_impl<T, bits, BM, transpose>(
      op, op.y, 0, op.K, x_tile, w_tile, FPQMM_TILE_THREAD(tgid.xy));
}

// The sorted gather kernel (mixture of experts, one row of x per pair with
// the pairs sorted by expert, as mlx-lm sorts many tokens): x and y are
// x_matrices rows (M = 1 each), pair r's expert is rhs_indices[r]. A
// threadgroup walks the runs of equal experts inside its BM rows and
// computes its tile once per run, so an expert's weights are read once per
// tile of rows routed to it. Unsorted
// indices give shorter runs: slower, still right.
template <typename T, int bits, int BM, bool transpose>
[[kernel]] void fp_gather_rhs_qmm(
    FPQMM_BUFFERS(T),
    FPQMM_GATHER_BUFFERS,
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup T* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const int rows_end = min(int(tgid.y + 1) * BM, x_matrices);
  for (int first = int(tgid.y) * BM; first < rows_end;) {
    const int end = expert_run_end(rhs_indices, first, rows_end);
    const Operands<T> op = run_operands<T, bits>(FPQMM_RUN_NAMES, first, end);
    fp_qmm_impl<T, bits, BM, transpose>(
        op, op.y, 0, K, x_tile, w_tile, FPQMM_TILE_THREAD(uint2(tgid.x, 0)));
    first = end;
  }
}

}  // namespace fpqmm
