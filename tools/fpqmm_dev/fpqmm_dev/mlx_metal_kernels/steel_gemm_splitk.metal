// MLX's split-K accumulation (steel_gemm_splitk.h of the mlx-metal wheel),
// which sums qmm_t_splitk's partial products, instantiated as MLX's
// steel_gemm_splitk.metal does. The build defines the host name, the kernel
// template and its arguments.
// clang-format off
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_splitk.h"

instantiate_kernel(MLX_HOST_NAME, MLX_KERNEL, MLX_TEMPLATE_ARGUMENTS)
