// Every kernel of the base metallib, as fpqmm_<kernel>_bm<rows>_<codes>_<type>
// and, for the gather (mixture-of-experts) variants, fpqmm_gather_<kernel>...
// and the sorted-runs fpqmm_gather_rhs_mma_{t,n}_bm32_...:
//   qmv_bm8            decode, y = x @ W^T (8 rows of x per block)
//   qvm_bm4            decode, y = x @ W
//   mma_t_bm32, _bm64  simdgroup-matrix tiles, y = x @ W^T
//   mma_n_bm32         simdgroup-matrix tiles, y = x @ W
//   mma_t_split_k_bm32, _bm64  mma_t over a slice of K per grid z, float
//                      partial sums; then fpqmm_split_k_sum_<type> adds them
// codes: e2m1 (fp4 modes) or e4m3 (fp8 modes); type: float32, float16,
// bfloat16. One file: the function constants of fp_common.h are defined once.
#include "backend/metal/kernels/fp_mma.h"
#include "backend/metal/kernels/fp_qmv.h"

namespace fpqmm {

// clang-format off
#define FPQMM_INSTANTIATE_FAMILIES(prefix, qmv, qvm, qmm, type_name, T, codes, bits)                  \
  FPQMM_INSTANTIATE(prefix "qmv_bm8_" #codes "_" #type_name, qmv, T, bits, kQmvRows, kQmvOutputs)  \
  FPQMM_INSTANTIATE(prefix "qvm_bm4_" #codes "_" #type_name, qvm, T, bits)                           \
  FPQMM_INSTANTIATE(prefix "mma_t_bm32_" #codes "_" #type_name, qmm, T, bits, 32, true)              \
  FPQMM_INSTANTIATE(prefix "mma_t_bm64_" #codes "_" #type_name, qmm, T, bits, 64, true)              \
  FPQMM_INSTANTIATE(prefix "mma_n_bm32_" #codes "_" #type_name, qmm, T, bits, 32, false)

#define FPQMM_INSTANTIATE_ALL(type_name, T, codes, bits)                                              \
  FPQMM_INSTANTIATE_FAMILIES("fpqmm_", fp_qmv, fp_qvm, fp_qmm, type_name, T, codes, bits)             \
  FPQMM_INSTANTIATE_FAMILIES(                                                                        \
      "fpqmm_gather_", fp_gather_qmv, fp_gather_qvm, fp_gather_qmm, type_name, T, codes, bits)       \
  FPQMM_INSTANTIATE("fpqmm_gather_rhs_mma_t_bm32_" #codes "_" #type_name,                            \
                    fp_gather_rhs_qmm, T, bits, 32, true)                                            \
  FPQMM_INSTANTIATE("fpqmm_gather_rhs_mma_n_bm32_" #codes "_" #type_name,                            \
                    fp_gather_rhs_qmm, T, bits, 32, false)                                           \
  FPQMM_INSTANTIATE("fpqmm_mma_t_split_k_bm32_" #codes "_" #type_name, fp_qmm_split_k, T, bits, 32)  \
  FPQMM_INSTANTIATE("fpqmm_mma_t_split_k_bm64_" #codes "_" #type_name, fp_qmm_split_k, T, bits, 64)

FPQMM_FOR_TYPES_AND_CODES(FPQMM_INSTANTIATE_ALL)
FPQMM_INSTANTIATE("fpqmm_split_k_sum_float32", fp_split_k_sum, float)
FPQMM_INSTANTIATE("fpqmm_split_k_sum_float16", fp_split_k_sum, half)
FPQMM_INSTANTIATE("fpqmm_split_k_sum_bfloat16", fp_split_k_sum, bfloat)
// clang-format on

}  // namespace fpqmm
