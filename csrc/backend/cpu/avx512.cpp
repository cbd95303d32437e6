// AVX-512 kernels (F, BW, VL, DQ, and BF16 for the bf16 kernels: Zen 4,
// Sapphire Rapids and later): the float32 kernels over the traits of
// avx512_vec.h, and the bf16 kernels of avx512_bf16_dot.h and
// avx512_bf16_gemm.h. This file alone is compiled with those flags and only
// called after a CPU feature check.
//
// One translation unit, not one per kernel family: GCC's inlining budget
// grows with the unit, and the float32 kernels inline as they were measured
// only beside the bf16 ones.
#include "backend/cpu/avx512_bf16_dot.h"
#include "backend/cpu/avx512_bf16_gemm.h"
#include "backend/cpu/avx512_vec.h"
#include "backend/cpu/simd_kernels.h"

namespace mlx_fpqmm::cpu {

const IsaKernels* avx512_kernels() {
  using K = SimdKernels<Avx512Vec>;
  static const IsaKernels kernels{
      "avx512",
      96,  // Zen 4, both orientations
      96,
      K::arranged_length,
      K::arrange_x,
      K::dot,
      K::axpy,
      K::dequantize,
      dot_bf16_entry,
      arrange_x_bf16_entry,
      gemm_bf16_entry,
  };
  return &kernels;
}

}  // namespace mlx_fpqmm::cpu
