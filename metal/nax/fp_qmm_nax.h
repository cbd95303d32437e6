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

#include "fp_common.h"

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

// y = x @ W^T with W (N, K) grouped along K; K a multiple of 16.
template <typename T, int bits, int BM>
[[kernel]] void fp_qmm_nax(
    FPQMM_BUFFERS(T),
    threadgroup T* x_tile [[threadgroup(0)]],
    threadgroup bfloat* w_tile [[threadgroup(1)]],
    uint3 tgid [[threadgroup_position_in_grid]],
    ushort thread_index [[thread_index_in_threadgroup]],
    ushort simdgroup [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  constexpr int BN = kNaxBlockN;
  constexpr int BK = kNaxBlockK;
  constexpr int x_stride = padded_row(BK, sizeof(T));
  constexpr int w_stride = padded_row(BK, kNaxWeightItemsize);
  constexpr int simdgroup_rows = BM / 2;
  constexpr int fragments_m = simdgroup_rows / 16;
  constexpr int simdgroup_cols = BN / 2;
  static_assert(simdgroup_cols == 32, "one matmul2d step spans the columns");
  // x loader: thread i moves chunk i % 8 (8 values) of rows i / 8, + 16, ...
  constexpr int x_chunk = 8;
  constexpr int x_chunks_per_row = BK / x_chunk;
  constexpr int x_rows_per_pass = kNaxThreads / x_chunks_per_row;
  // W loader: thread i dequantizes codes [32 (i % 2), + 32) of tile row
  // i / 2, in units of 16 (K, and so a block's extent, is a multiple of 16).
  constexpr int w_threads_per_row = kNaxThreads / BN;
  constexpr int w_codes_per_thread = BK / w_threads_per_row;
  constexpr int unit = 16;
  constexpr int units = w_codes_per_thread / unit;
  constexpr int words_per_unit = unit * bits / 32;
  static_assert(w_threads_per_row * BN == kNaxThreads, "one pass per W tile");

  Operands<T> op = FPQMM_OPERANDS(T, tgid.z);
  const int row0 = int(tgid.y) * BM;
  const int col0 = int(tgid.x) * BN;

  // Row fragments holding any valid output; the others are never computed,
  // so small M and N tails cost no wasted matmul2d steps. The x rows those
  // fragments read, past M, are zeroed.
  const int sg_row = (simdgroup / 2) * simdgroup_rows;
  const int sg_col = (simdgroup % 2) * simdgroup_cols;
  const int active_m = clamp((M - row0 - sg_row + 15) / 16, 0, fragments_m);
  const bool active = active_m > 0 && col0 + sg_col < N;
  const int x_rows_used = min(BM, (M - row0 + 15) / 16 * 16);
  const int x_row = thread_index / x_chunks_per_row;
  const int x_k = thread_index % x_chunks_per_row * x_chunk;

  // Rows of W past N are zeroed in the tile (their codes stay 0).
  const int w_tile_row = thread_index / w_threads_per_row;
  const int w_row = col0 + w_tile_row;
  const bool w_row_valid = w_row < N;
  const int w_first_code =
      thread_index % w_threads_per_row * w_codes_per_thread;
  const int words_per_row = K * bits / 32;
  const int groups_per_row = K / group_size;

  const ushort2 origin = nax_fragment_origin(lane);
  float acc[fragments_m][16] = {};
  float unit_scales[units] = {};

  for (int k0 = 0; k0 < K; k0 += BK) {
    const int k_extent = min(BK, K - k0);
    // Each scale is read once per tile: by the thread whose unit starts its
    // group; units of the same group copy it, and a group wider than a
    // thread's codes is handed to the row's other thread (or kept across
    // blocks).
    if (k0 % group_size < BK) {
      for (int u = 0; u < units; ++u) {
        const int code = k0 + w_first_code + u * unit;
        if (code % group_size == 0) {
          if (w_row_valid && code < K) {
            unit_scales[u] =
                op.scales[int64_t(w_row) * groups_per_row + code / group_size];
          }
        } else if (u > 0) {
          unit_scales[u] = unit_scales[u - 1];
        }
      }
      if (group_size > w_codes_per_thread) {
        const float shared =
            simd_shuffle(unit_scales[0], lane - lane % w_threads_per_row);
        for (int u = 0; u < units; ++u) {
          unit_scales[u] = shared;
        }
      }
    }

    threadgroup_barrier(mem_flags::mem_threadgroup);  // last block's steps
    if (x_k < k_extent) {
      for (int r = x_row; r < x_rows_used; r += x_rows_per_pass) {
        const int row = row0 + r;
        threadgroup T* destination = x_tile + r * x_stride + x_k;
        for (int i = 0; i < x_chunk; i += 4) {
          *(threadgroup vec<T, 4>*)(destination + i) =
              row < M ? *(const device vec<T, 4>*)(op.x + int64_t(row) * K +
                                                   k0 + x_k + i)
                      : vec<T, 4>(T(0));
        }
      }
    }
    for (int u = 0; u < units; ++u) {
      const int k = w_first_code + u * unit;
      if (k >= k_extent) {
        break;
      }
      uint32_t packed[words_per_unit] = {};
      if (w_row_valid) {
        load_words<words_per_unit>(
            op.w + int64_t(w_row) * words_per_row + (k0 + k) * bits / 32,
            packed);
      }
      threadgroup bfloat* destination = w_tile + w_tile_row * w_stride + k;
      for (int i = 0; i < unit; i += 4) {
        vec<bfloat, 4> values;
        for (int j = 0; j < 4; ++j) {
          values[j] = bfloat(
              float(decode_code<bits>(code_at<bits>(packed, i + j))) *
              unit_scales[u]);
        }
        *(threadgroup vec<bfloat, 4>*)(destination + i) = values;
      }
    }
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
        for (int i = 0; i < fragments_m; ++i) {
          if (i < active_m) {
            T a[8];
            load_fragment(
                a,
                x_tile + (sg_row + 16 * i) * x_stride + kk,
                x_stride,
                origin);
            nax_multiply_accumulate(acc[i], a, b);
          }
        }
      }
    }
  }

  // Destination element 8 f + 4 r + j: row 8 r, column 16 f + j from origin.
  // Fragments that were never computed lie wholly past M or N.
  const bool vector_store = N % 4 == 0;
  for (int i = 0; i < fragments_m; ++i) {
    for (int f = 0; f < 2; ++f) {
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + sg_row + 16 * i + origin.y + 8 * r;
        const int col = col0 + sg_col + 16 * f + origin.x;
        if (row >= M) {
          continue;
        }
        vec<T, 4> values;
        for (int j = 0; j < 4; ++j) {
          values[j] = static_cast<T>(acc[i][8 * f + 4 * r + j]);
        }
        device T* destination = op.y + int64_t(row) * N + col;
        if (vector_store && col + 4 <= N) {
          *(device vec<T, 4>*)destination = values;
        } else {
          for (int j = 0; j < 4 && col + j < N; ++j) {
            destination[j] = values[j];
          }
        }
      }
    }
  }
}

}  // namespace fpqmm
