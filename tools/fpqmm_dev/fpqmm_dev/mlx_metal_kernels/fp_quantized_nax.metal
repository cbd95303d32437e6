// One of MLX's NAX fp-quantized kernels (fp_quantized_nax.h of the mlx-metal
// wheel), instantiated as MLX's fp_quantized_nax.metal does. The build defines
// the host name, the kernel template and its arguments.
// clang-format off
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/quantized_utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/nax.h"
#include "mlx/backend/metal/kernels/fp_quantized_nax.h"

instantiate_kernel(MLX_HOST_NAME, MLX_KERNEL, MLX_TEMPLATE_ARGUMENTS)
