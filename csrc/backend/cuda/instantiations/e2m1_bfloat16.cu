// The kernels for bfloat16 x and e2m1 codes.
#include "backend/cuda/kernels/kernel_for.cuh"

namespace fpqmm::cuda {

template const void* kernel_for<__nv_bfloat16, 4>(
    const mlx_fpqmm::cuda::KernelKey&);

}  // namespace fpqmm::cuda
