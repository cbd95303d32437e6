// What every kernel shares: the matrices of one product of a batch or a
// gather pair, and the copies from device memory into shared memory.
#pragma once

#include <cuda_pipeline_primitives.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels/fp_decode.cuh"
#include "backend/cuda/kernels/params.h"

namespace fpqmm::cuda {

// The matrices of one product: y (M x N) = x (M x K) times W (N x K with
// transpose, K x N without). `valid` false: a gather index is out of range
// and the product's outputs are NaN (nothing else is read).
template <typename T, int encoding>
struct Operands {
  const uint32_t* w;
  const typename ScaleStorage<encoding>::type* scales;
  const T* x;
  float factor;  // nvfp4's global-scale factor (1 without)
  bool valid;
};

// One matrix of W, in 32-bit words of codes, and of its scales (groups
// along K: N x K / group_size either way round).
struct MatrixSizes {
  int64_t w_words;
  int64_t scales;
};

template <int bits>
__device__ __forceinline__ MatrixSizes matrix_sizes(const QmmArgs& args) {
  return {
      int64_t(args.N) * args.K * bits / 32,
      int64_t(args.N) * args.K / args.group_size};
}

// W matrix `expert` of a gather, with x at `x`; `valid` false: its outputs
// are NaN (expert 0 stands in, so that nothing is read out of range).
template <typename T, int encoding>
__device__ __forceinline__ Operands<T, encoding> expert_operands(
    const QmmArgs& args,
    const MatrixSizes& sizes,
    int64_t expert,
    const T* x,
    bool valid) {
  using S = typename ScaleStorage<encoding>::type;
  const int64_t e = valid ? expert : 0;
  return {
      args.w + e * sizes.w_words,
      static_cast<const S*>(args.scales) + e * sizes.scales,
      x,
      global_factor(args.global_scale, e),
      valid};
}

// Gather pair `pair`'s x matrix (QmmArgs::lhs_divisor).
__device__ __forceinline__ uint32_t
lhs_index(const uint32_t* lhs_indices, int lhs_divisor, int64_t pair) {
  return lhs_divisor != 0 ? uint32_t(pair / lhs_divisor) : lhs_indices[pair];
}

// The operands of batch element (or gather pair) `batch`. Without gather, x,
// w and scales move by their strides (broadcast axes have stride 0); with
// it, whole row-contiguous matrices are picked by the indices.
template <typename T, int encoding>
__device__ __forceinline__ Operands<T, encoding> batch_operands(
    const QmmArgs& args, int64_t batch, const MatrixSizes& sizes) {
  using S = typename ScaleStorage<encoding>::type;
  const auto* x = static_cast<const T*>(args.x);
  const auto* scales = static_cast<const S*>(args.scales);
  if (args.lhs_indices) {
    const uint32_t lhs = lhs_index(args.lhs_indices, args.lhs_divisor, batch);
    const uint32_t rhs = args.rhs_indices[batch];
    const bool valid =
        lhs < uint32_t(args.x_matrices) && rhs < uint32_t(args.w_matrices);
    return expert_operands<T, encoding>(
        args,
        sizes,
        rhs,
        x + (valid ? lhs : 0) * (int64_t(args.M) * args.K),
        valid);
  }
  int64_t x_offset = 0;
  int64_t w_offset = 0;
  int64_t scales_offset = 0;
  int64_t rest = batch;
  for (int axis = args.batch_ndims - 1; axis >= 0; --axis) {
    const int64_t index = rest % args.batch_shape[axis];
    rest /= args.batch_shape[axis];
    x_offset += index * args.x_batch_strides[axis];
    w_offset += index * args.w_batch_strides[axis];
    scales_offset += index * args.scales_batch_strides[axis];
  }
  return {
      args.w + w_offset,
      scales + scales_offset,
      x + x_offset,
      global_factor(args.global_scale, 0),
      true};
}

// Where the rows of a block's x and y are: ContiguousRows, row m of the
// product's matrices; GatheredRows, a run of gather pairs of one row each
// (pair order[m]: x row lhs_index(pair), y row pair), whose outputs are NaN
// where that is out of range.
struct ContiguousRows {
  __device__ __forceinline__ int64_t x(int m) const {
    return m;
  }
  __device__ __forceinline__ int64_t y(int m) const {
    return m;
  }
  __device__ __forceinline__ bool valid(int) const {
    return true;
  }
};

struct GatheredRows {
  const uint32_t* order;
  const uint32_t* lhs_indices;
  int lhs_divisor;
  uint32_t x_matrices;

  __device__ __forceinline__ int64_t x(int m) const {
    return valid(m) ? lhs_index(lhs_indices, lhs_divisor, order[m]) : 0;
  }
  __device__ __forceinline__ int64_t y(int m) const {
    return order[m];
  }
  __device__ __forceinline__ bool valid(int m) const {
    return lhs_index(lhs_indices, lhs_divisor, order[m]) < x_matrices;
  }
};

// W and its scales are read once: loads that leave them out of L1, which
// keeps x (read by every block).
__device__ __forceinline__ uint4 load_streaming(const uint4* from) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(from));
  return v;
}

template <typename S>
__device__ __forceinline__ S load_streaming(const S* from) {
  if constexpr (sizeof(S) == 1) {
    uint16_t v;
    asm("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=h"(v) : "l"(from));
    return static_cast<S>(v);
  } else if constexpr (sizeof(S) == 2) {
    uint16_t v;
    asm("ld.global.nc.L1::no_allocate.b16 %0, [%1];" : "=h"(v) : "l"(from));
    return *reinterpret_cast<const S*>(&v);
  } else {
    static_assert(sizeof(S) == 4);
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(from));
    return *reinterpret_cast<const S*>(&v);
  }
}

__device__ __forceinline__ float quiet_nan() {
  return __uint_as_float(0x7FC00000u);
}

// Copies `rows` rows of `row_bytes` bytes (valid_bytes of each from
// device memory, the rest zero-filled) from src (row stride src_stride
// bytes) to shared dst (16-byte aligned, row stride dst_stride), spread
// over a warp's lanes. Rows at or past `valid_rows` are zero-filled.
// cp.async pieces of 16, 8 or 4 bytes, the widest that the addresses
// allow; byte by byte (synchronous) for anything narrower. The caller
// commits the cp.async group.
__device__ __forceinline__ void warp_copy_rows(
    void* dst,
    int dst_stride,
    const uint8_t* src,
    int64_t src_stride,
    int rows,
    int valid_rows,
    int row_bytes,
    int valid_bytes,
    int lane) {
  const uint64_t alignment = reinterpret_cast<uint64_t>(src) |
                             uint64_t(src_stride) | uint64_t(dst_stride) |
                             uint64_t(row_bytes) | uint64_t(valid_bytes);
  auto* out = static_cast<uint8_t*>(dst);
  auto copy = [&](auto width_constant) {
    constexpr int width = decltype(width_constant)::value;
    const int per_row = row_bytes / width;
    for (int piece = lane; piece < rows * per_row; piece += kWarpSize) {
      const int row = piece / per_row;
      const int offset = piece % per_row * width;
      const int available =
          row < valid_rows ? max(0, min(width, valid_bytes - offset)) : 0;
      // A zero-length copy still takes a readable address.
      const uint8_t* from =
          available > 0 ? src + row * src_stride + offset : src;
      uint8_t* to = out + row * dst_stride + offset;
      if constexpr (width >= 4) {
        __pipeline_memcpy_async(to, from, width, width - available);
      } else {
        *to = available > 0 ? *from : 0;
      }
    }
  };
  if (alignment % 16 == 0) {
    copy(std::integral_constant<int, 16>{});
  } else if (alignment % 8 == 0) {
    copy(std::integral_constant<int, 8>{});
  } else if (alignment % 4 == 0) {
    copy(std::integral_constant<int, 4>{});
  } else {
    copy(std::integral_constant<int, 1>{});
  }
}

}  // namespace fpqmm::cuda
