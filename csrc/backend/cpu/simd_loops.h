// What every float32 SIMD kernel (simd_*.h) shares: the inlining macros, the
// prefetch distance and the loops over blocks of rows, unrolled by count.
//
// The simd_*.h headers define their functions in an unnamed namespace: each
// ISA's file compiles them with its own flags, and a shared inline copy could
// be linked into another ISA's callers (an AVX2 instruction on a CPU without
// AVX2). They are declared inline as the class members they were: GCC's
// inliner allows declared-inline functions more growth.
#pragma once

#include <cstdint>

// Inner loops inline every trait call so that their small fixed-count loops
// unroll and the accumulators stay in registers.
#define MLX_FPQMM_FLATTEN [[gnu::flatten]]
#define MLX_FPQMM_UNROLL _Pragma("GCC unroll 16")

namespace mlx_fpqmm::cpu::simd {
namespace {

// How far ahead of its reads a streaming kernel prefetches W (into L2):
// measured best between 4 and 8 KiB on Zen 4.
inline constexpr int64_t kPrefetchDistance = 4096;

// Scratch slots (thread_scratch) the kernels hold at once: 0 for x (the
// AVX-512 bf16 dots), 1 for scales, 2 for decoded rows and panels.

// Calls body.template operator()<kMax>() with kMax lowered to `count` when
// count < kMax: a runtime count as a compile-time one.
template <int kMax, typename Body>
inline void with_count(int64_t count, Body&& body) {
  if constexpr (kMax > 1) {
    if (count < kMax) {
      with_count<kMax - 1>(count, body);
      return;
    }
  }
  body.template operator()<kMax>();
}

// f(i, j, k) for every index of an A x B x C block of registers, unrolled.
template <int A, int B, int C, typename Fn>
inline void for_each_index(Fn&& f) {
  MLX_FPQMM_UNROLL
  for (int i = 0; i < A; ++i) {
    MLX_FPQMM_UNROLL
    for (int j = 0; j < B; ++j) {
      MLX_FPQMM_UNROLL
      for (int k = 0; k < C; ++k) {
        f(i, j, k);
      }
    }
  }
}

// Calls body.template operator()<R>(n) over blocks of R rows of W in
// [n0, n1): kRows rows at a time when several x rows, or one x row larger
// than L1 (32 KiB on current x86 and arm64 cores), are read for each row of
// W, so that each load of x serves several rows; otherwise one row at a
// time (measured best either way on Zen 4).
inline constexpr int kRowBlock = 4;
template <int kRows = kRowBlock, typename Body>
inline void for_w_rows(
    int64_t M, int64_t x_row_bytes, int64_t n0, int64_t n1, Body&& body) {
  constexpr int64_t kL1Bytes = 32 << 10;
  int64_t n = n0;
  if (M > 1 || x_row_bytes > kL1Bytes) {
    for (; n + kRows <= n1; n += kRows) {
      body.template operator()<kRows>(n);
    }
  }
  for (; n < n1; ++n) {
    body.template operator()<1>(n);
  }
}

// Calls body.template operator()<MB>(m) over blocks of up to 4 rows of x.
template <typename Body>
inline void for_row_blocks(int64_t M, Body&& body) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {
    body.template operator()<4>(m);
  }
  switch (M - m) {
    case 3:
      body.template operator()<3>(m);
      break;
    case 2:
      body.template operator()<2>(m);
      break;
    case 1:
      body.template operator()<1>(m);
      break;
  }
}

// Calls body.template operator()<MB>(m) over blocks of up to kMax rows of
// x, as evenly sized as possible.
template <int kMax, typename Body>
inline void for_x_blocks(int64_t M, Body&& body) {
  int64_t blocks = (M + kMax - 1) / kMax;
  for (int64_t m = 0, b = 0; b < blocks; ++b) {
    int64_t rows = (M - m) / (blocks - b);
    with_count<kMax>(rows, [&]<int MB>() { body.template operator()<MB>(m); });
    m += rows;
  }
}

}  // namespace
}  // namespace mlx_fpqmm::cpu::simd
