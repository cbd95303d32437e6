// Device memory for the arrays our CUDA primitives write.
#pragma once

#include <cstddef>

#include "mlx/allocator.h"
#include "mlx/backend/cuda/device.h"

namespace mlx_fpqmm::cuda {

// `bytes` of device memory, ordered on `encoder`'s stream, as MLX's own ops
// get from cu::malloc_async (which libmlx.so does not export). MLX's
// exported allocator::malloc hands out managed memory, and where its cache
// returns a device buffer it first copies that buffer to managed memory,
// synchronously: several microseconds of host time per product. Released
// buffers are kept for reuse (up to a bound) rather than freed; MLX's
// memory counters do not include them.
mlx::core::allocator::Data device_malloc(
    size_t bytes, mlx::core::cu::CommandEncoder& encoder);

}  // namespace mlx_fpqmm::cuda
