// What the mma.sync kernels share: the m16n8k16 step, the lanes' places in
// its fragments, and the end of a block whose warps hold partial sums of the
// same outputs.
#pragma once

#include <cooperative_groups.h>

#include "backend/cuda/kernels/fp_operands.cuh"

namespace fpqmm::cuda {

// One mma.sync m16n8k16 step, float32 accumulation: c += a * b.
template <typename H>
__device__ __forceinline__ void mma_step(
    float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<H, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// The lanes of a warp in the mma fragments: lane = 4 * group + thread. In a
// step the thread holds, as two pairs, four codes of K of W rows `group` and
// `group + 8` (the A fragment) and the same four of x row `group` (the B
// fragment); c[i] is W row group + 8 * (i / 2), x row 2 * thread + i % 2.
// Which four codes of K a step takes is the kernel's choice: any order of K
// is the same sum.
struct FragmentLane {
  int group;   // 0..7
  int thread;  // 0..3
};

__device__ __forceinline__ FragmentLane fragment_lane(int lane) {
  return {lane / 4, lane % 4};
}

// The sums of a cluster's blocks, `count` floats at `sums` in the shared
// memory of each, added up in the order of the blocks' ranks and handed to
// store(e, total), the elements spread over the cluster's threads (sm_90).
template <typename Store>
__device__ __forceinline__ void add_up_in_cluster(
    float* sums, int count, Store&& store) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  auto cluster = cg::this_cluster();
  cluster.sync();
  const int ranks = static_cast<int>(cluster.num_blocks());
  for (int e =
           static_cast<int>(cluster.block_rank()) * blockDim.x + threadIdx.x;
       e < count;
       e += ranks * blockDim.x) {
    float total = 0.0f;
    for (int r = 0; r < ranks; ++r) {
      total += cluster.map_shared_rank(sums, r)[e];
    }
    store(e, total);
  }
  // Shared memory lives as long as its block: none leaves before all have
  // read.
  cluster.sync();
#else
  __trap();
#endif
}

// Every one of a lane's sums (tiles of W rows by blocks of x rows) set to
// `value`.
template <int tiles, int x_blocks>
__device__ __forceinline__ void fill_sums(
    float (&sums)[tiles][x_blocks][4], float value) {
#pragma unroll
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int b = 0; b < x_blocks; ++b) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sums[t][b][i] = value;
      }
    }
  }
}

// Output (x row m, W row n) of M x N, `total`, to y or to the float32
// partials; `rows` places x row m in y (and makes it NaN where not valid).
template <typename T, typename Rows>
__device__ __forceinline__ void store_output(
    float total,
    int m,
    int n,
    int M,
    int N,
    T* y,
    float* partials,
    const Rows& rows) {
  if (m < M && n < N) {
    const int64_t r = rows.y(m);
    if (!rows.valid(m)) {
      total = quiet_nan();
    }
    if (partials) {
      partials[r * N + n] = total;
    } else {
      y[r * N + n] = static_cast<T>(total);
    }
  }
}

// The end of a block whose `warps` warps each hold sums[tiles][x_blocks][4]
// of the same outputs (tiles of 16 W rows from n0, blocks of 8 x rows from
// m0): they meet in shared memory `reduction` (warps * tiles * x_blocks * 4
// * 32 floats, free for this use), and the totals, times `factor`, go to y
// or, with split K, to the float32 partials or (splits_in_cluster) to the
// other splits of the block's cluster, which add up into y; `rows` places
// x row m in y (and makes it NaN where not valid).
template <
    int warps,
    int tiles,
    int x_blocks,
    typename T,
    typename Rows = ContiguousRows>
__device__ __forceinline__ void store_block_sums(
    const float (&sums)[tiles][x_blocks][4],
    float* reduction,
    int M,
    int N,
    int m0,
    int n0,
    float factor,
    T* y,
    float* partials,
    bool splits_in_cluster = false,
    const Rows& rows = {},
    bool x_pairs = false) {
  constexpr int values = tiles * x_blocks * 4;
  constexpr int totals = values * kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();
#pragma unroll
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int b = 0; b < x_blocks; ++b) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int v = (t * x_blocks + b) * 4 + i;
        reduction[(warp * values + v) * kWarpSize + lane] = sums[t][b][i];
      }
    }
  }
  __syncthreads();
  // Where element e of the sums goes: x row m (of M) and W row n.
  struct Place {
    int m, n;
  };
  auto place = [&](int e) {
    const int v = e / kWarpSize;
    const FragmentLane owner = fragment_lane(e % kWarpSize);
    const int i = v % 4;
    const int b = v / 4 % x_blocks;
    const int t = v / 4 / x_blocks;
    return Place{
        m0 + b * kXBlockRows + 2 * owner.thread + i % 2,
        n0 + t * kTileRows + i / 2 * 8 + owner.group};
  };
  auto store = [&](int e, float total) {
    const Place at = place(e);
    store_output(total, at.m, at.n, M, N, y, partials, rows);
  };
  // Element e summed over the warps, with its next value's (`pairs`).
  auto warps_total = [&](int e, bool pairs) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < warps; ++w) {
      total += pairs ? reduction[w * totals + e] +
                           reduction[w * totals + e + kWarpSize]
                     : reduction[w * totals + e];
    }
    return total;
  };
  // x in parts (fp_split_x's rows 2m and 2m + 1) straight into y: the
  // element of the even row adds its odd neighbour's (the next value, the
  // same lane) and stores row m of y (of M / 2), which is float32 like x
  // (T is the parts' bfloat16; one matrix, so y is the output's start).
  // Into partials, the reduction adds them.
  if (x_pairs && !partials) {
    for (int e = threadIdx.x; e < totals; e += blockDim.x) {
      if (e / kWarpSize % 2 == 0) {
        const Place at = place(e);
        store_output(
            warps_total(e, true) * factor,
            at.m / 2,
            at.n,
            M / 2,
            N,
            reinterpret_cast<float*>(y),
            partials,
            rows);
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < totals; e += blockDim.x) {
    const float total = warps_total(e, false);
    // Element e of warp 0's sums is read by this thread alone.
    if (splits_in_cluster) {
      reduction[e] = total;
    } else {
      store(e, total * factor);
    }
  }
  if (splits_in_cluster) {
    add_up_in_cluster(reduction, totals, [&](int e, float total) {
      store(e, total * factor);
    });
  }
}

// The grid of the transposed kernels: x walks blocks of `rows_per_block`
// rows of W, y the blocks of x rows (x_blocks * 8 each) times the splits of
// K, z the batch (looping past the grid's limit). body(op, m0, n0, k_begin,
// k_end, y, partials) runs one block's share.
template <typename T, int bits, int encoding, int x_blocks, typename Body>
__device__ __forceinline__ void transposed_grid(
    const QmmArgs& args, int rows_per_block, Body&& body) {
  constexpr int m_step = x_blocks * kXBlockRows;
  const int m_blocks = (args.M + m_step - 1) / m_step;
  const MatrixSizes sizes = matrix_sizes<bits>(args);
  const int n0 = blockIdx.x * rows_per_block;
  for (int64_t batch = blockIdx.z; batch < args.batch_count;
       batch += gridDim.z) {
    const auto op = batch_operands<T, encoding>(args, batch, sizes);
    T* y = static_cast<T*>(args.y) + batch * args.M * args.N;
    for (int yb = blockIdx.y; yb < m_blocks * args.split_k; yb += gridDim.y) {
      const int split = yb % args.split_k;
      const int m0 = yb / args.split_k * m_step;
      const int k_begin = split * args.split_k_step;
      const int k_end = min(args.K, k_begin + args.split_k_step);
      float* partials =
          args.partials ? args.partials + (split * args.batch_count + batch) *
                                              args.M * args.N
                        : nullptr;
      body(op, m0, n0, k_begin, k_end, y, partials);
      __syncthreads();
    }
  }
}

// A run's matrices: its expert's (without matrices of x every row is NaN
// and nothing of x is read).
template <typename T, int encoding>
__device__ __forceinline__ Operands<T, encoding> run_operands(
    const QmmArgs& args, const MatrixSizes& sizes, const PairRun& run) {
  return expert_operands<T, encoding>(
      args,
      sizes,
      run.expert,
      static_cast<const T*>(args.x),
      run.expert < uint32_t(args.w_matrices) && args.x_matrices > 0);
}

// A run's rows of x and y: its pairs, order[run.first, ...).
__device__ __forceinline__ GatheredRows
run_rows(const QmmArgs& args, const uint32_t* order, const PairRun& run) {
  return {
      order + run.first,
      args.lhs_indices,
      args.lhs_divisor,
      uint32_t(args.x_matrices)};
}

// The runs of fp_group_pairs that a block of the grouped kernels takes
// (grid y walks them): body(op, rows, count, r) multiplies run r's `count`
// rows of x, gathered (`rows`), by its expert's matrices `op`.
template <typename T, int bits, int encoding, typename Body>
__device__ __forceinline__ void grouped_runs(const QmmArgs& args, Body&& body) {
  const MatrixSizes sizes = matrix_sizes<bits>(args);
  const uint32_t runs = *args.run_count;
  for (uint32_t r = blockIdx.y; r < runs; r += gridDim.y) {
    const PairRun run = args.pair_runs[r];
    body(
        run_operands<T, encoding>(args, sizes, run),
        run_rows(args, args.pair_order, run),
        int(run.count),
        r);
    __syncthreads();
  }
}

}  // namespace fpqmm::cuda
