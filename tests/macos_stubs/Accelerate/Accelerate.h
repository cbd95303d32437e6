// Accelerate's CBLAS sgemm as macOS 13.3+ declares it under
// ACCELERATE_NEW_LAPACK (32-bit integers unless ACCELERATE_LAPACK_ILP64).
#pragma once
#ifndef ACCELERATE_NEW_LAPACK
#error "mlx_fpqmm uses Accelerate's new LAPACK interface (ACCELERATE_NEW_LAPACK)"
#endif
#ifdef ACCELERATE_LAPACK_ILP64
typedef long __LAPACK_int;
#else
typedef int __LAPACK_int;
#endif
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
extern "C" void cblas_sgemm(
    const enum CBLAS_ORDER order,
    const enum CBLAS_TRANSPOSE trans_a,
    const enum CBLAS_TRANSPOSE trans_b,
    const __LAPACK_int m,
    const __LAPACK_int n,
    const __LAPACK_int k,
    const float alpha,
    const float* a,
    const __LAPACK_int lda,
    const float* b,
    const __LAPACK_int ldb,
    const float beta,
    float* c,
    const __LAPACK_int ldc)
    __attribute__((availability(macos, introduced = 13.3)));
