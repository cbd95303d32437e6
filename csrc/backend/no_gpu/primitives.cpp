// eval_gpu where this build has no kernels for the GPU backend that MLX was
// built with: a clear error instead of MLX's missing-implementation abort.
// And no CUDA GPU to plan for without the CUDA backend.
#include <stdexcept>
#include <string>

#include "backend/cuda/device.h"
#include "primitives/primitives.h"

#if !defined(MLX_FPQMM_CUDA)

std::optional<mlx_fpqmm::cuda::CudaDevice> mlx_fpqmm::cuda::running_device() {
  return std::nullopt;
}

size_t mlx_fpqmm::cuda::device_bytes_in_use() {
  return 0;
}

#endif

#if !defined(MLX_FPQMM_CUDA) && \
    !(defined(_METAL_) && !defined(MLX_FPQMM_NO_METAL_KERNELS))

namespace mlx_fpqmm {

namespace {

[[noreturn]] void no_gpu_kernels(const std::string& primitive) {
  throw std::runtime_error(
      "[" + primitive +
      "] This build of mlx_fpqmm has no GPU kernels"
#if defined(MLX_FPQMM_NO_METAL_KERNELS)
      " (it was built with MLX_FPQMM_METAL=OFF)"
#elif defined(MLX_FPQMM_NO_CUDA_KERNELS)
      " (it was built with MLX_FPQMM_CUDA=OFF)"
#elif !defined(__APPLE__)
      " (it was built against MLX's CPU build: for NVIDIA GPUs, build it "
      "against mlx[cuda13] with pip install --no-build-isolation .)"
#endif
      "; run the op on the CPU with stream=mx.cpu (or "
      "mx.set_default_device(mx.cpu)).");
}

}  // namespace

void FpQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  no_gpu_kernels(name());
}

void FpGatherQuantizedMatmul::eval_gpu(
    const std::vector<mx::array>&, mx::array&) {
  no_gpu_kernels(name());
}

}  // namespace mlx_fpqmm

#endif
