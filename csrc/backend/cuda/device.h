// The NVIDIA GPU this process runs on, as the CUDA plan describes it.
#pragma once

#include <optional>

#include "backend/cuda/plan.h"

namespace mlx_fpqmm::cuda {

// The GPU of MLX's default GPU stream; nothing in a build without the CUDA
// backend or where MLX sees no CUDA GPU.
std::optional<CudaDevice> running_device();

}  // namespace mlx_fpqmm::cuda
