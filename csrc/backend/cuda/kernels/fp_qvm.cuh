// y = x @ W for the decode range (and, tiled over M, beyond it): W (K, N)
// grouped along N. Each lane owns kQvmColumns adjacent outputs, inside one
// group (every group size is a multiple of 8), so it reads one scale per
// row of W; its codes are decoded and scaled in float32 (code times scale,
// then times x, element by element as mx.dequantize then a matmul would).
#pragma once

#include "backend/cuda/kernels/fp_operands.cuh"
#include "backend/cuda/kernels/grid_stride.cuh"

namespace fpqmm::cuda {

// The kQvmColumns codes of one lane in one row of W, unscaled, in order.
template <int bits>
__device__ __forceinline__ void decode_columns(
    const uint32_t* row, float (&codes)[kQvmColumns]) {
  constexpr int words = kQvmColumns * bits / 32;
  constexpr int per_word = 32 / bits;
  constexpr int pairs = per_word / 2;
#pragma unroll
  for (int i = 0; i < words; ++i) {
    const uint32_t word = row[i];
#pragma unroll
    for (int p = 0; p < pairs; ++p) {
      const float2 pair = __half22float2(decode_pair<__half, bits>(word, p));
      codes[i * per_word + p] = pair.x;
      codes[i * per_word + p + pairs] = pair.y;
    }
  }
}

// y rows [m0, m0 + kQvmRows) and columns [column block, + kQvmColumnsPerBlock)
// over K range [k_begin, k_end): the block stages x a chunk of K at a time,
// its warps take turns over the chunk's rows of W and add their sums in
// shared memory at the end.
template <typename T, int bits, int encoding>
__device__ __forceinline__ void fp_qvm_impl(
    const QmmArgs& args,
    const Operands<T, encoding>& op,
    float* shared,
    int m0,
    int k_begin,
    int k_end,
    T* y,
    float* partials) {
  constexpr int rows = kQvmRows;
  constexpr int columns = kQvmColumns;
  constexpr int k_per_warp = kQvmChunk / kQvmWarps;
  constexpr int unroll = 4;
  const int M = args.M;
  const int N = args.N;
  const int K = args.K;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int column = blockIdx.x * kQvmColumnsPerBlock + lane * columns;
  const bool column_valid = column < N;
  const int valid_rows = min(rows, M - m0);
  const int64_t words_per_row = int64_t(N) * bits / 32;
  const int64_t scales_per_row = N / args.group_size;
  float* x_chunk = shared;  // rows x kQvmChunk
  float* reduction = shared + rows * kQvmChunk;

  float acc[rows][columns];
#pragma unroll
  for (int r = 0; r < rows; ++r) {
#pragma unroll
    for (int c = 0; c < columns; ++c) {
      acc[r][c] = op.valid ? 0.0f : quiet_nan();
    }
  }

  for (int chunk = k_begin; op.valid && chunk < k_end; chunk += kQvmChunk) {
    __syncthreads();
    for (int e = threadIdx.x; e < rows * kQvmChunk; e += blockDim.x) {
      const int r = e / kQvmChunk;
      const int k = chunk + e % kQvmChunk;
      x_chunk[e] = r < valid_rows && k < k_end
                       ? static_cast<float>(op.x[int64_t(m0 + r) * K + k])
                       : 0.0f;
    }
    __syncthreads();
    const int first = chunk + warp * k_per_warp;
    const int last = min(k_end, first + k_per_warp);
    for (int k = first; column_valid && k < last; k += unroll) {
      uint32_t packed[unroll][columns * bits / 32];
      float scales[unroll];
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        const bool inside = k + u < last;
        const int64_t row = inside ? k + u : k;
        const uint32_t* words = op.w + row * words_per_row + column * bits / 32;
#pragma unroll
        for (int i = 0; i < columns * bits / 32; ++i) {
          packed[u][i] = words[i];
        }
        scales[u] =
            inside
                ? decode_scale<encoding>(
                      op.scales
                          [row * scales_per_row + column / args.group_size]) *
                      op.factor
                : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        if (k + u >= last) {
          break;
        }
        float weights[columns];
        decode_columns<bits>(packed[u], weights);
#pragma unroll
        for (int c = 0; c < columns; ++c) {
          weights[c] *= scales[u];
        }
        const int kk = k + u - chunk;
#pragma unroll
        for (int r = 0; r < rows; ++r) {
          if (r == valid_rows) {
            break;
          }
          const float xv = x_chunk[r * kQvmChunk + kk];
#pragma unroll
          for (int c = 0; c < columns; ++c) {
            acc[r][c] = fmaf(weights[c], xv, acc[r][c]);
          }
        }
      }
    }
  }

  __syncthreads();
#pragma unroll
  for (int r = 0; r < rows; ++r) {
#pragma unroll
    for (int c = 0; c < columns; ++c) {
      reduction[(warp * rows + r) * kQvmColumnsPerBlock + lane * columns + c] =
          acc[r][c];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < rows * kQvmColumnsPerBlock; e += blockDim.x) {
    const int r = e / kQvmColumnsPerBlock;
    const int n = blockIdx.x * kQvmColumnsPerBlock + e % kQvmColumnsPerBlock;
    if (r >= valid_rows || n >= N) {
      continue;
    }
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kQvmWarps; ++w) {
      total += reduction[w * rows * kQvmColumnsPerBlock + e];
    }
    const int64_t out = int64_t(m0 + r) * N + n;
    if (partials) {
      partials[out] = total;
    } else {
      y[out] = static_cast<T>(total);
    }
  }
}

// The grid: x walks blocks of kQvmColumnsPerBlock columns, y the blocks of
// kQvmRows rows of x times the splits of K, z the batch (looping past the
// grid's limit).
template <typename T, int bits, int encoding>
__device__ __forceinline__ void fp_qvm_grid(const QmmArgs& args) {
  extern __shared__ float4 shared_floats[];
  auto* shared = reinterpret_cast<float*>(shared_floats);
  const int m_blocks = (args.M + kQvmRows - 1) / kQvmRows;
  const MatrixSizes sizes = matrix_sizes<bits>(args);
  for (int64_t batch = blockIdx.z; batch < args.batch_count;
       batch += gridDim.z) {
    const auto op = batch_operands<T, encoding>(args, batch, sizes);
    T* y = static_cast<T*>(args.y) + batch * args.M * args.N;
    for (int yb = blockIdx.y; yb < m_blocks * args.split_k; yb += gridDim.y) {
      const int split = yb % args.split_k;
      const int m0 = yb / args.split_k * kQvmRows;
      const int k_begin = split * args.split_k_step;
      const int k_end = min(args.K, k_begin + args.split_k_step);
      float* partials =
          args.partials ? args.partials + (split * args.batch_count + batch) *
                                              args.M * args.N
                        : nullptr;
      fp_qvm_impl<T, bits, encoding>(
          args, op, shared, m0, k_begin, k_end, y, partials);
      __syncthreads();
    }
  }
}

template <typename T, int bits, int encoding>
__global__ void __launch_bounds__(kQvmWarps* kWarpSize)
    fp_qvm(const QmmArgs args) {
  fp_qvm_grid<T, bits, encoding>(args);
}

// Split K's second pass: y = the sum of the splits' float32 partials (and
// of x's parts: args.x_parts rows for each row of y, fp_split_x's order).
template <typename T>
__global__ void fp_split_k_sum(const QmmArgs args) {
  const int parts = args.x_parts > 1 ? args.x_parts : 1;
  const int64_t rows = args.M / parts;
  const int64_t part_outputs = rows * args.N;
  const int64_t outputs = args.batch_count * part_outputs;
  for_each_in_grid(outputs, [&](int64_t i) {
    const int64_t batch = i / part_outputs;
    const int64_t row = i % part_outputs / args.N;
    const int64_t column = i % args.N;
    float total = 0.0f;
    for (int s = 0; s < args.split_k; ++s) {
      const float* slice =
          args.partials + (s * args.batch_count + batch) * parts * part_outputs;
      for (int part = 0; part < parts; ++part) {
        total += slice[(row * parts + part) * args.N + column];
      }
    }
    static_cast<T*>(args.y)[i] = static_cast<T>(total);
  });
}

}  // namespace fpqmm::cuda
