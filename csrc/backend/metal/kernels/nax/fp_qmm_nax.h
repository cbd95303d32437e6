// The NAX prefill kernel (Metal 4 tensor operations on the neural
// accelerators of Apple GPUs from generation 17): y = x @ W^T as (16, 32, 16)
// mpp::tensor_ops::matmul2d steps on cooperative tensors, fp32 accumulation.
// Per block of 64 along K the threadgroup stages x and the weights,
// dequantized to bfloat, in threadgroup memory; then each of its 2 x 2
// simdgroups multiplies its (BM / 2) x 32 corner. Only the API surface MLX
// ships (and the macOS 26.2 SDK supports) is used, with the lane layout MLX
// hard-codes.
#pragma once

#if __METAL_VERSION__ < 400
#error "NAX kernels need Metal 4: SDK and deployment target macOS 26.2"
#endif

#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
#include <metal_stdlib>

#include "backend/metal/kernels/fp_loaders.h"

namespace fpqmm {

using namespace metal;

// A 16 x 16 operand fragment in a simdgroup's cooperative tensor: lane l
// holds 8 elements, element e at (row, column) origin(l).yx + (8 (e / 4),
// e % 4).
inline ushort2 nax_fragment_origin(ushort lane) {
  return ushort2(
      4 * (((lane >> 2) & 2) | (lane & 1)),
      ((lane >> 2) & 4) | ((lane >> 1) & 3));
}

// A lane's 8 elements of the fragment at `tile` (rows of `stride` elements).
template <typename T>
inline void load_fragment(
    thread T* elements, const threadgroup T* tile, int stride, ushort2 origin) {
  for (int r = 0; r < 2; ++r) {
    vec<T, 4> values =
        *(const threadgroup vec<T, 4>*)(tile + (origin.y + 8 * r) * stride +
                                        origin.x);
    for (int j = 0; j < 4; ++j) {
      elements[4 * r + j] = values[j];
    }
  }
}

// c (16 x 32) += a (16 x 16) @ b^T with b (32 x 16) as two fragments (rows
// 0-15, 16-31), on one simdgroup: MLX's descriptor and operand types.
template <typename T>
inline void nax_multiply_accumulate(
    thread float (&c)[16],
    const thread T (&a)[8],
    const thread bfloat (&b)[16]) {
  constexpr auto descriptor = mpp::tensor_ops::matmul2d_descriptor(
      16,
      32,
      16,
      false,
      true,
      true,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<descriptor, execution_simdgroup> op;
  auto left = op.template get_left_input_cooperative_tensor<T, bfloat, float>();
  auto right =
      op.template get_right_input_cooperative_tensor<T, bfloat, float>();
  auto destination = op.template get_destination_cooperative_tensor<
      remove_addrspace_t<decltype(left)>,
      remove_addrspace_t<decltype(right)>,
      float>();
  for (int i = 0; i < 8; ++i) {
    left[i] = a[i];
  }
  for (int i = 0; i < 16; ++i) {
    right[i] = b[i];
    destination[i] = c[i];
  }
  op.run(left, right, destination);
  for (int i = 0; i < 16; ++i) {
    c[i] = destination[i];
  }
}

// A lane's elements of accumulator fragment c (16 x 32) at (row, col) of y,
// those inside M x N: element 8 f + 4 r + j sits at row 8 r, column
// 16 f + j from the lane's origin.
template <typename T>
inline void nax_store_accumulator(
    const thread float (&c)[16],
    device T* y,
    int M,
    int N,
    int row,
    int col,
    ushort2 origin) {
  const bool vector_store = N % 4 == 0;
  for (int f = 0; f < 2; ++f) {
    for (int r = 0; r < 2; ++r) {
      const int element_row = row + origin.y + 8 * r;
      const int element_col = col + 16 * f + origin.x;
      if (element_row >= M) {
        continue;
      }
      vec<T, 4> values;
      for (int j = 0; j < 4; ++j) {
        values[j] = static_cast<T>(c[8 * f + 4 * r + j]);
      }
      device T* destination = y + int64_t(element_row) * N + element_col;
      if (vector_store && element_col + 4 <= N) {
        *(device vec<T, 4>*)destination = values;
      } else {
        for (int j = 0; j < 4 && element_col + j < N; ++j) {
          destination[j] = values[j];
        }
      }
    }
  }
}

// One BM x 64 tile of y = x @ W^T at `tile` (column block, row block), with W
// (N, K) grouped along K; K a multiple of 16. Sums k_begin <= k < k_end (a
// multiple of the group size and of 64, and K) and stores to `y` (M x N) as
// U: op.y, or a split-K slice of float partials.
template <typename T, int bits, int BM, typename U = T>
inline void fp_qmm_nax_impl(
    Operands<T> op,
    device U* y,
    int k_begin,
    int k_end,
    threadgroup T* x_tile,
    threadgroup bfloat* w_tile,
    uint2 tile,
    ushort thread_index,
    ushort simdgroup,
    ushort lane) {
  constexpr int BN = kNaxBlockN;
  constexpr int BK = kNaxBlockK;
  constexpr int x_stride = padded_row(BK, sizeof(T));
  constexpr int w_stride = padded_row(BK, kNaxWeightItemsize);
  constexpr int simdgroup_rows = BM / 2;
  constexpr int fragments_m = simdgroup_rows / 16;
  constexpr int simdgroup_cols = BN / 2;
  static_assert(simdgroup_cols == 32, "one matmul2d step spans the columns");

  const int M = op.M;
  const int N = op.N;
  const int K = op.K;
  const int row0 = int(tile.y) * BM;
  const int col0 = int(tile.x) * BN;
  XTileLoader<T, BM, BK, kNaxThreads, 8, x_stride> x_loader(thread_index);
  // Units of 16 codes: K, and so a block's extent, is a multiple of 16.
  QuantizedTileLoader<bfloat, bits, BN, BK, kNaxThreads, 16, w_stride> w_loader(
      op.w, op.scales, N, K, thread_index, lane);

  // Row fragments holding any valid output; the others are never computed,
  // so small M and N tails cost no wasted matmul2d steps. The x rows those
  // fragments read, past M, are zeroed.
  const int sg_row = (simdgroup / 2) * simdgroup_rows;
  const int sg_col = (simdgroup % 2) * simdgroup_cols;
  const int active_m = clamp((M - row0 - sg_row + 15) / 16, 0, fragments_m);
  const bool active = active_m > 0 && col0 + sg_col < N;
  const int x_rows_used = min(BM, (M - row0 + 15) / 16 * 16);

  const ushort2 origin = nax_fragment_origin(lane);
  float acc[fragments_m][16] = {};

  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
    const int k_extent = min(BK, K - k0);
    // A thread keeps its rows of W, so a group wider than the block keeps
    // its scales across blocks.
    if (k0 % group_size < BK) {
      w_loader.load_scales(col0, k0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // last block's steps
    x_loader.load(x_tile, op.x, M, K, row0, k0, x_rows_used);
    w_loader.load(w_tile, col0, k0, k_extent);
    threadgroup_barrier(mem_flags::mem_threadgroup);

    if (active) {
      for (int kk = 0; kk < k_extent; kk += 16) {
        bfloat b[16];
        for (int f = 0; f < 2; ++f) {
          load_fragment(
              b + 8 * f,
              w_tile + (sg_col + 16 * f) * w_stride + kk,
              w_stride,
              origin);
        }
        for (int i = 0; i < active_m; ++i) {
          T a[8];
          load_fragment(
              a, x_tile + (sg_row + 16 * i) * x_stride + kk, x_stride, origin);
          nax_multiply_accumulate(acc[i], a, b);
        }
      }
    }
  }

  // Fragments that were never computed lie wholly past M or N.
  for (int i = 0; i < fragments_m; ++i) {
    nax_store_accumulator(
        acc[i], y, M, N, row0 + sg_row + 16 * i, col0 + sg_col, origin);
  }
}

template <typename T, int bits, int BM>
[[kernel]] void fp_qmm_nax(
    FPQMM_BUFFERS(T),
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup bfloat* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const Operands<T> op = batch_operands<T>(FPQMM_BUFFER_NAMES, tgid.z);
  fp_qmm_nax_impl<T, bits, BM>(
      op, op.y, 0, op.K, x_tile, w_tile, FPQMM_TILE_THREAD(tgid.xy));
}

// Split K on the NAX tiles, as fp_qmm_split_k on the MMA ones; the base
// library's fp_split_k_sum adds the slices up.
template <typename T, int bits, int BM>
[[kernel]] void fp_qmm_nax_split_k(
    FPQMM_BUFFERS(T),
    device float* partials [[buffer(FPQMM_BUFFER_PARTIALS)]],
    constant int& split_k_step [[buffer(FPQMM_BUFFER_SPLIT_K_STEP)]],
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup bfloat* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const Operands<T> op = batch_operands<T>(FPQMM_BUFFER_NAMES, 0);
  const int k_begin = int(tgid.z) * split_k_step;
  fp_qmm_nax_impl<T, bits, BM>(
      op,
      partials + int64_t(tgid.z) * M * N,
      k_begin,
      min(K, k_begin + split_k_step),
      x_tile,
      w_tile,
      FPQMM_TILE_THREAD(tgid.xy));
}

template <typename T, int bits, int BM>
[[kernel]] void fp_gather_qmm_nax(
    FPQMM_BUFFERS(T),
    FPQMM_GATHER_BUFFERS,
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup bfloat* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const Operands<T> op = gather_operands<T, bits>(FPQMM_GATHER_NAMES, tgid.z);
  fp_qmm_nax_impl<T, bits, BM>(
      op, op.y, 0, op.K, x_tile, w_tile, FPQMM_TILE_THREAD(tgid.xy));
}

// The sorted-runs gather kernel on the NAX tiles (see fp_gather_rhs_qmm).
template <typename T, int bits, int BM>
[[kernel]] void fp_gather_rhs_qmm_nax(
    FPQMM_BUFFERS(T),
    FPQMM_GATHER_BUFFERS,
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup bfloat* w_tile [[threadgroup(1)]],
    FPQMM_TILE_POSITION) {
  const int rows_end = min(int(tgid.y + 1) * BM, x_matrices);
  for (int first = int(tgid.y) * BM; first < rows_end;) {
    const int end = expert_run_end(rhs_indices, first, rows_end);
    const Operands<T> op = run_operands<T, bits>(FPQMM_RUN_NAMES, first, end);
    fp_qmm_nax_impl<T, bits, BM>(
        op, op.y, 0, K, x_tile, w_tile, FPQMM_TILE_THREAD(uint2(tgid.x, 0)));
    first = end;
  }
}

}  // namespace fpqmm
