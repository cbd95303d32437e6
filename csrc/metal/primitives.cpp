// FpQuantizedMatmul on Apple GPUs. The Metal kernels land with the Metal
// kernel issue; until then a GPU stream gets an error that names the way out.
#include <stdexcept>

#include "primitives.h"

namespace mlx_fpqmm {

void FpQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error(
      "[FpQuantizedMatmul] The Metal kernels of mlx_fpqmm are not available "
      "in this build; run the op on the CPU with stream=mx.cpu (or "
      "mx.set_default_device(mx.cpu)).");
}

}  // namespace mlx_fpqmm
