// The NVIDIA GPU this process runs on, as the CUDA plan describes it.
#pragma once

#include <cstddef>
#include <optional>

#include "backend/cuda/plan.h"

namespace mlx_fpqmm::cuda {

// The GPU of MLX's default GPU stream; nothing in a build without the CUDA
// backend or where MLX sees no CUDA GPU.
std::optional<CudaDevice> running_device();

// The device memory that the outputs of our primitives hold now (not in
// MLX's memory counters); 0 without the CUDA backend.
size_t device_bytes_in_use();

}  // namespace mlx_fpqmm::cuda
