// fp_strided_copy: an array of any strides (up to kMaxCopyDims axes) copied
// into row-contiguous memory, for eval_gpu (params.h).
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/grid_stride.cuh"
#include "backend/cuda/kernels/params.h"

namespace fpqmm::cuda {

// E: an unsigned integer of the element's size.
template <typename E>
__global__ void __launch_bounds__(kCopyThreads)
    fp_strided_copy(const StridedCopyArgs args) {
  const auto* src = static_cast<const E*>(args.src);
  auto* dst = static_cast<E*>(args.dst);
  for_each_in_grid(args.elements, [&](int64_t i) {
    int64_t rest = i;
    int64_t offset = 0;
    for (int axis = args.ndim - 1; axis >= 0; --axis) {
      offset += rest % args.shape[axis] * args.strides[axis];
      rest /= args.shape[axis];
    }
    dst[i] = src[offset];
  });
}

}  // namespace fpqmm::cuda
