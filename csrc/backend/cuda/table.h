// The kernel instantiation a plan names (KernelPlan::main, ::reduction,
// ::grouping, ::x_tiles, ::x_split), as a function pointer (eval_gpu turns
// it into a CUfunction with cudaGetFuncBySymbol): the one place that turns a
// KernelKey into template arguments, for eval_gpu and the test harness
// alike. Plain C++.
#pragma once

#include "backend/cuda/plan.h"

namespace fpqmm::cuda {

// Throws std::invalid_argument for a key no format has.
const void* main_kernel(const mlx_fpqmm::cuda::KernelKey& key);
const void* split_k_sum_kernel(mlx_fpqmm::FloatType type);
const void* group_pairs_kernel();
// fp_wgmma_tile_x (or, for the grouped gather, fp_wgmma_tile_x_grouped)
// for `bits`-wide codes (KernelPlan::x_tiles).
const void* wgmma_tile_x_kernel(int bits, bool grouped);
// fp_split_x, float32 x's split (KernelPlan::x_split).
const void* split_x_kernel();
// fp_strided_copy for elements of `itemsize` bytes (2 or 4).
const void* strided_copy_kernel(int itemsize);

}  // namespace fpqmm::cuda
