// fp_group_pairs: the pairs of a gather of one row each, grouped by expert
// for fp_qmv_grouped or fp_qmm_grouped (params.h has the layout). One block:
// the pairs are counted per expert in shared memory, the counts and the runs
// they make are scanned, and each pair takes the next place of its expert (in
// no set order within it: every row's sums are the same wherever it sits in a
// run).
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/params.h"

namespace fpqmm::cuda {

__global__ void __launch_bounds__(kGroupThreads)
    fp_group_pairs(const QmmArgs args) {
  extern __shared__ uint64_t group_shared[];
  auto* scan = group_shared;
  auto* counts = reinterpret_cast<uint32_t*>(group_shared + kGroupThreads);
  uint32_t* starts = counts + kGroupMaxExperts + 1;
  const int thread = threadIdx.x;
  const int threads = blockDim.x;
  const uint32_t experts = uint32_t(args.w_matrices);
  const int bins = args.w_matrices + 1;  // the last: out of range
  const int64_t pairs = args.batch_count;
  const uint32_t run_rows = uint32_t(args.run_rows);

  for (int b = thread; b < bins; b += threads) {
    counts[b] = 0;
  }
  __syncthreads();
  for (int64_t p = thread; p < pairs; p += threads) {
    atomicAdd(&counts[min(args.rhs_indices[p], experts)], 1u);
  }
  __syncthreads();

  // Each thread's bins are a contiguous share: their pairs (high word) and
  // runs (low word), scanned over the threads.
  const int per_thread = (bins + threads - 1) / threads;
  const int b_begin = min(bins, thread * per_thread);
  const int b_end = min(bins, b_begin + per_thread);
  uint64_t own = 0;
  for (int b = b_begin; b < b_end; ++b) {
    own += (uint64_t(counts[b]) << 32) + (counts[b] + run_rows - 1) / run_rows;
  }
  scan[thread] = own;
  __syncthreads();
  for (int offset = 1; offset < threads; offset *= 2) {
    const uint64_t before = thread >= offset ? scan[thread - offset] : 0;
    __syncthreads();
    scan[thread] += before;
    __syncthreads();
  }
  uint32_t first = uint32_t((scan[thread] - own) >> 32);
  uint32_t run = uint32_t(scan[thread] - own);
  for (int b = b_begin; b < b_end; ++b) {
    starts[b] = first;
    for (uint32_t done = 0; done < counts[b]; done += run_rows) {
      args.pair_runs[run++] = PairRun{
          first + done, min(run_rows, counts[b] - done), uint32_t(b), 0};
    }
    first += counts[b];
  }
  if (thread == threads - 1) {
    *args.run_count = run;
  }
  __syncthreads();
  for (int64_t p = thread; p < pairs; p += threads) {
    const uint32_t b = min(args.rhs_indices[p], experts);
    args.pair_order[atomicAdd(&starts[b], 1u)] = uint32_t(p);
  }
}

}  // namespace fpqmm::cuda
