#include "backend/cuda/table.h"

#include <stdexcept>

#include "backend/cuda/kernels/fp_group_pairs.cuh"
#include "backend/cuda/kernels/fp_qmm_wgmma.cuh"
#include "backend/cuda/kernels/fp_split_x.cuh"
#include "backend/cuda/kernels/fp_strided_copy.cuh"
#include "backend/cuda/kernels/kernel_for.cuh"

namespace fpqmm::cuda {

// Defined in backend/cuda/instantiations/.
extern template const void* kernel_for<float, 4>(
    const mlx_fpqmm::cuda::KernelKey&);
extern template const void* kernel_for<float, 8>(
    const mlx_fpqmm::cuda::KernelKey&);
extern template const void* kernel_for<__half, 4>(
    const mlx_fpqmm::cuda::KernelKey&);
extern template const void* kernel_for<__half, 8>(
    const mlx_fpqmm::cuda::KernelKey&);
extern template const void* kernel_for<__nv_bfloat16, 4>(
    const mlx_fpqmm::cuda::KernelKey&);
extern template const void* kernel_for<__nv_bfloat16, 8>(
    const mlx_fpqmm::cuda::KernelKey&);

namespace {

template <typename F>
void with_x_type(mlx_fpqmm::FloatType type, F&& f) {
  switch (type) {
    case mlx_fpqmm::FloatType::float16:
      return f(__half{});
    case mlx_fpqmm::FloatType::bfloat16:
      return f(__nv_bfloat16{});
    case mlx_fpqmm::FloatType::float32:
      return f(float{});
  }
}

}  // namespace

const void* main_kernel(const mlx_fpqmm::cuda::KernelKey& key) {
  const void* kernel = nullptr;
  with_x_type(key.x_type, [&](auto x) {
    using T = decltype(x);
    kernel = key.bits == 4 ? kernel_for<T, 4>(key) : kernel_for<T, 8>(key);
  });
  if (!kernel) {
    throw std::invalid_argument("[cuda] no kernel for this key.");
  }
  return kernel;
}

const void* split_k_sum_kernel(mlx_fpqmm::FloatType type) {
  const void* kernel = nullptr;
  with_x_type(type, [&](auto x) {
    kernel = reinterpret_cast<const void*>(&fp_split_k_sum<decltype(x)>);
  });
  return kernel;
}

const void* split_x_kernel() {
  return reinterpret_cast<const void*>(&fp_split_x);
}

const void* strided_copy_kernel(int itemsize) {
  switch (itemsize) {
    case 2:
      return reinterpret_cast<const void*>(&fp_strided_copy<uint16_t>);
    case 4:
      return reinterpret_cast<const void*>(&fp_strided_copy<uint32_t>);
  }
  throw std::invalid_argument("[cuda] no copy kernel for this element size.");
}

const void* wgmma_tile_x_kernel(int bits, bool grouped) {
  if (grouped) {
    return bits == 4
               ? reinterpret_cast<const void*>(&fp_wgmma_tile_x_grouped<4>)
               : reinterpret_cast<const void*>(&fp_wgmma_tile_x_grouped<8>);
  }
  return bits == 4 ? reinterpret_cast<const void*>(&fp_wgmma_tile_x<4>)
                   : reinterpret_cast<const void*>(&fp_wgmma_tile_x<8>);
}

const void* group_pairs_kernel() {
  return reinterpret_cast<const void*>(&fp_group_pairs);
}

}  // namespace fpqmm::cuda
