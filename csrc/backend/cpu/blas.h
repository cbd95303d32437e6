// The float32 GEMM library behind the large-M path: OpenBLAS from the
// scipy-openblas32 wheel on Linux, Accelerate on macOS.
#pragma once

#include <cstdint>

namespace mlx_fpqmm::cpu {

// Whether a GEMM library was linked into this build.
bool has_sgemm();

// Row-major C (M x N) = A (M x K) . B + beta * C, with B stored (N x K) when
// b_transposed, (K x N) otherwise. Runs on the calling thread only: the
// library's own threads are switched off so that it never competes with the
// thread pool that calls it.
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
    int64_t ldc);

}  // namespace mlx_fpqmm::cpu
