// The kernels for float16 x and e4m3 codes.
#include "backend/cuda/kernels/kernel_for.cuh"

namespace fpqmm::cuda {

template const void* kernel_for<__half, 8>(const mlx_fpqmm::cuda::KernelKey&);

}  // namespace fpqmm::cuda
