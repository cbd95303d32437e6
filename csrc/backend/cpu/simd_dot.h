// The fused dots x @ W^T for few rows of x, over an ISA's vector traits V
// (simd_kernels.h): W decoded in registers for each dot step and every row
// of x multiplying it.
#pragma once

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_decode.h"
#include "backend/cpu/simd_loops.h"

namespace mlx_fpqmm::cpu::simd {
namespace {  // see simd_loops.h

// Up to this many rows of x, W is decoded in registers for each step and
// every row of x multiplies it (dot_block); from here on, panels
// (simd_panels.h): measured on Zen 3 with AVX2, the fused dots win for two
// and three rows of x and lose from four on.
constexpr int kFusedRows = 3;

// Where the rows of x outgrow L1 (32 KiB), the fused dots take K in chunks
// whose rows of x fit in kFusedXBytes, for kChunkRows rows of W at a time
// (measured on Zen 4: 3 rows of x at K = 4096 took 2.2x the time of 2).
inline constexpr int64_t kL1Bytes = 32 << 10;
inline constexpr int64_t kFusedXBytes = 24 << 10;
inline constexpr int kChunkRows = 16;

// R consecutive rows of W (codes and decoded scales, `stride` floats per
// row) against MB rows of arranged x (`ldx` floats apart), all of K: each
// class's products are summed in chains and scaled once per step; R rows
// of W share each load of x (see for_w_rows), or MB rows of x each decoded
// vector (one or the other).
// With R == 1, columns [c0, c1) alone (c0 a multiple of kDotStep), their
// sums added to out's where c0 > 0.
template <class V, int kBits, int R, int MB, int kClasses>
MLX_FPQMM_FLATTEN inline void dot_block(
    const QuantizedMatrix& w,
    int64_t row,
    const float* scales,
    int64_t stride,
    const float* xa,
    int64_t ldx,
    float* out,
    int64_t ldo,
    int64_t c0 = 0,
    int64_t c1 = -1) {
  using F = typename V::F;
  static_assert(R == 1 || MB == 1);
  constexpr int P = kPerWord<kBits>;
  // Independent accumulator chains per row of W: enough to hide the FMA
  // latency, few enough to stay in registers. Each product chain costs an
  // FMA per step to scale: two scale classes make two chains already, and
  // one class takes two (both measured best on Zen 3).
  constexpr int kChains = R == 1 && MB == 1 ? 2 : 1;
  constexpr int kPChains = MB == 1 && kClasses == 1 ? 2 : 1;
  int shift = group_shift(w);
  typename V::I groups[kClasses];
  load_lane_groups<V, kBits, kClasses>(shift, groups);
  F acc[R][MB][kChains];
  for_each_index<R, MB, kChains>(
      [&](int r, int m, int k) { acc[r][m][k] = V::zero(); });
  auto step = [&](int r, const uint8_t* codes, int64_t c) {
    F d[P];
    decode_step<V, kBits>(codes, d);
    F s[kClasses];
    step_scales<V, kClasses>(scales + r * stride, c, shift, groups, s);
    const float* xs = xa + c;
    F p[kClasses][MB][kPChains];
    for_each_index<kClasses, MB, kPChains>(
        [&](int k, int m, int i) { p[k][m][i] = V::zero(); });
    MLX_FPQMM_UNROLL
    for (int v = 0; v < P; ++v) {
      MLX_FPQMM_UNROLL
      for (int m = 0; m < MB; ++m) {
        F& chain = p[scale_class<V, kBits>(v) % kClasses][m][v % kPChains];
        chain = V::fma(d[v], V::load(xs + m * ldx + v * V::kLanes), chain);
      }
    }
    for_each_index<kClasses, MB, kPChains>([&](int k, int m, int i) {
      F& sum = acc[r][m][i % kChains];
      sum = V::fma(p[k][m][i], s[k], sum);
    });
  };
  if constexpr (R == 1) {
    for_row_steps<V, kBits>(
        w, row, c0, c1 < 0 ? w.cols : c1, [&](const uint8_t* codes, int64_t c) {
          step(0, codes, c);
        });
  } else {
    // The rows' steps interleaved, so that they share each load of x.
    int64_t K = w.cols;
    int64_t full = K - K % kDotStep<V, kBits>;
    for (int64_t c = 0; c < full; c += kDotStep<V, kBits>) {
      MLX_FPQMM_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* codes = w.row(row + r) + c * kBits / 8;
        __builtin_prefetch(codes + kPrefetchDistance, 0, 2);
        step(r, codes, c);
      }
    }
    for (int r = 0; r < R; ++r) {
      for_row_steps<V, kBits>(
          w, row + r, full, K, [&](const uint8_t* codes, int64_t c) {
            step(r, codes, c);
          });
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < MB; ++m) {
      F total = acc[r][m][0];
      for (int k = 1; k < kChains; ++k) {
        total = V::add(total, acc[r][m][k]);
      }
      out[m * ldo + r] = (c0 > 0 ? out[m * ldo + r] : 0.0f) + V::sum(total);
    }
  }
}

}  // namespace
}  // namespace mlx_fpqmm::cpu::simd
