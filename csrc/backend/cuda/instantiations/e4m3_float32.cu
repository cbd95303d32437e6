// The kernels for float32 x and e4m3 codes.
#include "backend/cuda/kernels/kernel_for.cuh"

namespace fpqmm::cuda {

template const void* kernel_for<float, 8>(const mlx_fpqmm::cuda::KernelKey&);

}  // namespace fpqmm::cuda
