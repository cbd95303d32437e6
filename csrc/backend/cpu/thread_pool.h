// A persistent pool of worker threads for the CPU kernels.
#pragma once

#include <cstdint>
#include <functional>

namespace mlx_fpqmm::cpu {

// Number of threads the pool runs work on (the calling thread included):
// MLX_FPQMM_NUM_THREADS if set (at most 256), otherwise the hardware
// concurrency, fewer where the system refuses to start more. The first call
// starts the pool; it throws std::invalid_argument where
// MLX_FPQMM_NUM_THREADS is not a positive integer.
int num_threads();

// Calls body(begin, end) on disjoint chunks covering [0, n), in parallel.
// Chunks are `grain` long (the last one may be shorter). Re-entrant and
// concurrent calls run serially on the calling thread instead of waiting.
void parallel_for(
    int64_t n,
    int64_t grain,
    const std::function<void(int64_t, int64_t)>& body);

}  // namespace mlx_fpqmm::cpu
