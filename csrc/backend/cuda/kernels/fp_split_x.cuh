// fp_split_x: float32 x split once into the bfloat16 high and low parts of
// fp_qmv's two-part steps (split_pair), for a kernel of bfloat16 x to
// multiply as twice the rows (QmmArgs::x_parts): rather than every block
// splitting its chunks of x again. Row m's parts are rows 2m and 2m + 1,
// whose sums a lane holds side by side (an mma's columns 2t and 2t + 1).
#pragma once

#include "backend/cuda/kernels/fp_qmv.cuh"
#include "backend/cuda/kernels/grid_stride.cuh"

namespace fpqmm::cuda {

// x (M / 2 rows of K, one matrix) into args.x_tiles: each row's high part,
// then its low part, as bfloat16; a pair of values a thread and step.
__global__ void __launch_bounds__(kSplitXThreads)
    fp_split_x(const QmmArgs args) {
  const auto* x = static_cast<const float*>(args.x);
  auto* parts = static_cast<uint32_t*>(args.x_tiles);
  const int64_t row_pairs = args.K / 2;
  const int64_t pairs = int64_t(args.M / 2) * row_pairs;
  for_each_in_grid(pairs, [&](int64_t i) {
    uint32_t high_low[2];
    split_pair(x[2 * i], x[2 * i + 1], high_low);
    const int64_t high = i / row_pairs * 2 * row_pairs + i % row_pairs;
    parts[high] = high_low[0];
    parts[high + row_pairs] = high_low[1];
  });
}

}  // namespace fpqmm::cuda
