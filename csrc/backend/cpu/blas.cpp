#include "backend/cpu/blas.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>

#if defined(MLX_FPQMM_OPENBLAS)
#include <cblas.h>
#define MLX_FPQMM_SGEMM scipy_cblas_sgemm
#elif defined(MLX_FPQMM_ACCELERATE)
#include <Accelerate/Accelerate.h>
#define MLX_FPQMM_SGEMM cblas_sgemm
#endif

namespace mlx_fpqmm::cpu {

#if defined(MLX_FPQMM_SGEMM)
namespace {

// OpenBLAS frees its buffers in its library destructor at exit, while a
// product of a daemon thread (or of a stream thread MLX never joins) may still
// be inside sgemm. Exit therefore waits for the calls in flight, and a call
// that starts after that multiplies with plain loops instead.
std::atomic<int> calls_in_flight{0};
std::atomic<bool> exiting{false};

void wait_for_calls_in_flight() {
  exiting = true;
  while (calls_in_flight > 0) {
    std::this_thread::yield();
  }
}

}  // namespace
#endif

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
  static std::once_flag first_call;
  std::call_once(first_call, [] {
#if defined(MLX_FPQMM_OPENBLAS)
    // This private copy of OpenBLAS serves only this extension.
    scipy_openblas_set_num_threads(1);
#endif
    std::atexit(wait_for_calls_in_flight);
  });
  ++calls_in_flight;
  if (exiting) {
    --calls_in_flight;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          sum +=
              A[m * lda + k] * (b_transposed ? B[n * ldb + k] : B[k * ldb + n]);
        }
        C[m * ldc + n] = beta == 0.0f ? sum : sum + beta * C[m * ldc + n];
      }
    }
    return;
  }
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
  --calls_in_flight;
#else
  throw std::logic_error("[mlx_fpqmm] built without a GEMM library");
#endif
}

}  // namespace mlx_fpqmm::cpu
