#include "backend/cpu/blas.h"

#include <mutex>
#include <stdexcept>

#if defined(MLX_FPQMM_OPENBLAS)
#include <cblas.h>
#define MLX_FPQMM_SGEMM scipy_cblas_sgemm
#elif defined(MLX_FPQMM_ACCELERATE)
#include <Accelerate/Accelerate.h>
#define MLX_FPQMM_SGEMM cblas_sgemm
#endif

namespace mlx_fpqmm::cpu {

bool has_sgemm() {
#if defined(MLX_FPQMM_SGEMM)
  return true;
#else
  return false;
#endif
}

void sgemm(
    bool b_transposed,
    int64_t M,
    int64_t N,
    int64_t K,
    const float* A,
    int64_t lda,
    const float* B,
    int64_t ldb,
    float beta,
    float* C,
    int64_t ldc) {
#if defined(MLX_FPQMM_SGEMM)
#if defined(MLX_FPQMM_OPENBLAS)
  // This private copy of OpenBLAS serves only this extension.
  static std::once_flag single_threaded;
  std::call_once(single_threaded, [] { scipy_openblas_set_num_threads(1); });
#endif
  MLX_FPQMM_SGEMM(
      CblasRowMajor,
      CblasNoTrans,
      b_transposed ? CblasTrans : CblasNoTrans,
      M,
      N,
      K,
      1.0f,
      A,
      lda,
      B,
      ldb,
      beta,
      C,
      ldc);
#else
  throw std::logic_error("[mlx_fpqmm] built without a GEMM library");
#endif
}

}  // namespace mlx_fpqmm::cpu
