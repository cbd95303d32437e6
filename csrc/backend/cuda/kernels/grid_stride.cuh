// The grid-stride loop of the elementwise kernels.
#pragma once

#include <cstdint>

namespace fpqmm::cuda {

// f(i) for every i below `count`, each thread of the grid taking every
// (gridDim.x * blockDim.x)-th from its own index.
template <typename F>
__device__ __forceinline__ void for_each_in_grid(int64_t count, F&& f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    f(i);
  }
}

}  // namespace fpqmm::cuda
