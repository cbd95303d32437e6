// One of MLX's fp-quantized kernels (fp_quantized.h of the mlx-metal wheel),
// instantiated as MLX's fp_quantized.metal does. The build defines the host
// name, the kernel template and its arguments (fpqmm_dev.mlx_metal plans them).
// clang-format off
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/quantized_utils.h"
#include "mlx/backend/metal/kernels/fp_quantized.h"

instantiate_kernel(MLX_HOST_NAME, MLX_KERNEL, MLX_TEMPLATE_ARGUMENTS)
