// The kernels for float32 x and e2m1 codes.
#include "backend/cuda/kernels/kernel_for.cuh"

namespace fpqmm::cuda {

template const void* kernel_for<float, 4>(const mlx_fpqmm::cuda::KernelKey&);

}  // namespace fpqmm::cuda
