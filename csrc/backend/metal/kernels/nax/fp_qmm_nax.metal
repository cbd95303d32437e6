// The NAX metallib, mlx_fpqmm_nax.metallib (Metal 4: built only where the
// SDK allows it, see CMakeLists.txt), as fpqmm_nax_t_bm<rows>_<codes>_<type>:
//   nax_t_bm32, _bm64  matmul2d tiles, y = x @ W^T
//   nax_t_split_k_bm32, _bm64  the same over a slice of K per grid z, float
//                      partial sums (the base library's split_k_sum adds them)
// and their gather (mixture-of-experts) variants, fpqmm_gather_nax_t_... and
// the sorted-runs fpqmm_gather_rhs_nax_t_bm32_...
// codes: e2m1 (fp4 modes) or e4m3 (fp8 modes); type: float32, float16,
// bfloat16. A library of its own, so it defines fp_common.h's function
// constants once.
#include "backend/metal/kernels/nax/fp_qmm_nax.h"

namespace fpqmm {

// clang-format off
#define FPQMM_INSTANTIATE_NAX(type_name, T, codes, bits)                                         \
  FPQMM_INSTANTIATE("fpqmm_nax_t_bm32_" #codes "_" #type_name, fp_qmm_nax, T, bits, 32)         \
  FPQMM_INSTANTIATE("fpqmm_nax_t_bm64_" #codes "_" #type_name, fp_qmm_nax, T, bits, 64)         \
  FPQMM_INSTANTIATE("fpqmm_nax_t_split_k_bm32_" #codes "_" #type_name, fp_qmm_nax_split_k, T, bits, 32) \
  FPQMM_INSTANTIATE("fpqmm_nax_t_split_k_bm64_" #codes "_" #type_name, fp_qmm_nax_split_k, T, bits, 64) \
  FPQMM_INSTANTIATE("fpqmm_gather_nax_t_bm32_" #codes "_" #type_name, fp_gather_qmm_nax, T, bits, 32) \
  FPQMM_INSTANTIATE("fpqmm_gather_nax_t_bm64_" #codes "_" #type_name, fp_gather_qmm_nax, T, bits, 64) \
  FPQMM_INSTANTIATE("fpqmm_gather_rhs_nax_t_bm32_" #codes "_" #type_name, fp_gather_rhs_qmm_nax, T, bits, 32)

FPQMM_FOR_TYPES_AND_CODES(FPQMM_INSTANTIATE_NAX)
// clang-format on

}  // namespace fpqmm
