// The panel dots x @ W^T for several rows of x, over an ISA's vector traits
// V (simd_kernels.h): kPanelRows rows of W are decoded, scaled, a chunk of
// kPanelChunk columns at a time into a panel that stays in L1, and every
// block of kPanelXRows rows of x is multiplied with it, each (x row, W row)
// pair summing in its own register: W is decoded once for all rows of x,
// and each load of x serves kPanelRows rows of W (decoding in registers per
// step instead makes every row of x reload its chunk for each row of W,
// bound by the L2). The sums carry over chunks in a small buffer.
#pragma once

#include <algorithm>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_decode.h"
#include "backend/cpu/simd_loops.h"
#include "backend/cpu/simd_nonfinite.h"

namespace mlx_fpqmm::cpu::simd {
namespace {  // see simd_loops.h

constexpr int kPanelRows = 6;
constexpr int kPanelXRows = 2;
constexpr int64_t kPanelChunk = 512;
// Panel rows are this many floats longer than a chunk, so that rows read
// together do not fall in the same L1 sets (4 KiB apart).
constexpr int64_t kPanelSkew = 16;
constexpr int64_t kPanelStride = kPanelChunk + kPanelSkew;

// Independent sums per (x row, W row) pair: two for a single row of x,
// whose kPanelRows pairs would otherwise leave the FMAs waiting on their
// latency. Not a function of the rows of W, so that a row of W sums the
// same way whichever block (and thread) it falls in.
template <int MB>
constexpr int kPanelChains = MB == 1 ? 2 : 1;
constexpr int kPanelSums = 12;  // most kPanelChains * MB * R
static_assert(kPanelChains<1> * kPanelRows <= kPanelSums);
static_assert(
    kPanelChains<kPanelXRows> * kPanelXRows * kPanelRows <= kPanelSums);
// Where chain i of pair (m, r) keeps its sum between chunks.
template <class V, int R, int MB>
constexpr int64_t sum_offset(int i, int m, int r) {
  return ((i * MB + m) * R + r) * V::kLanes;
}

// v, held in a register: x86 compilers otherwise fold the load that made
// it into every FMA that reads it, loading a panel vector once per row of
// x instead of once.
template <class V>
inline typename V::F in_register(typename V::F v) {
#if defined(__x86_64__)
  asm("" : "+x"(v));
#endif
  return v;
}

// Rows [n, n + R) of W, columns [c0, c1), scaled by their decoded scales
// (`stride` floats per row), into the panel in arranged order.
template <class V, int kBits, int kClasses>
MLX_FPQMM_FLATTEN inline void decode_panel(
    const QuantizedMatrix& w,
    int64_t n,
    int R,
    int64_t c0,
    int64_t c1,
    const float* scales,
    int64_t stride,
    const typename V::I* groups,
    float* panel) {
  using F = typename V::F;
  static_assert(
      kPanelChunk % kDotStep<V, kBits> == 0, "chunks hold whole dot steps");
  constexpr int P = kPerWord<kBits>;
  int shift = group_shift(w);
  for (int r = 0; r < R; ++r) {
    float* dst = panel + r * kPanelStride - c0;
    for_row_steps<V, kBits>(
        w, n + r, c0, c1, [&](const uint8_t* codes, int64_t c) {
          F d[P];
          decode_step<V, kBits>(codes, d);
          F s[kClasses];
          step_scales<V, kClasses>(scales + r * stride, c, shift, groups, s);
          MLX_FPQMM_UNROLL
          for (int v = 0; v < P; ++v) {
            V::store(
                dst + c + v * V::kLanes,
                V::mul(d[v], s[scale_class<V, kBits>(v) % kClasses]));
          }
        });
  }
}

// The sums of MB rows of arranged x (`ldx` apart) times R panel rows over
// `length` columns, added to the sums in `sums` (zero when `first`).
template <class V, int R, int MB>
MLX_FPQMM_FLATTEN inline void panel_dot(
    const float* panel,
    const float* xa,
    int64_t ldx,
    int64_t length,
    bool first,
    float* sums) {
  using F = typename V::F;
  constexpr int kLanes = V::kLanes;
  constexpr int kChains = kPanelChains<MB>;
  F acc[kChains][MB][R];
  for_each_index<kChains, MB, R>([&](int i, int m, int r) {
    acc[i][m][r] =
        first ? V::zero() : V::load(sums + sum_offset<V, R, MB>(i, m, r));
  });
  // length is a whole number of dot steps, each an even number of vectors.
  for (int64_t k = 0; k < length; k += kChains * kLanes) {
    MLX_FPQMM_UNROLL
    for (int i = 0; i < kChains; ++i) {
      // x in registers, each panel vector loaded once for all MB rows.
      F xv[MB];
      MLX_FPQMM_UNROLL
      for (int m = 0; m < MB; ++m) {
        xv[m] = V::load(xa + m * ldx + k + i * kLanes);
      }
      MLX_FPQMM_UNROLL
      for (int r = 0; r < R; ++r) {
        F row =
            in_register<V>(V::load(panel + r * kPanelStride + k + i * kLanes));
        MLX_FPQMM_UNROLL
        for (int m = 0; m < MB; ++m) {
          acc[i][m][r] = V::fma(row, xv[m], acc[i][m][r]);
        }
      }
    }
  }
  for_each_index<kChains, MB, R>([&](int i, int m, int r) {
    V::store(sums + sum_offset<V, R, MB>(i, m, r), acc[i][m][r]);
  });
}

template <class V, int R, int MB>
inline void panel_sums_out(const float* sums, float* out, int64_t ldo) {
  using F = typename V::F;
  constexpr int kChains = kPanelChains<MB>;
  for (int m = 0; m < MB; ++m) {
    for (int r = 0; r < R; ++r) {
      F total = V::load(sums + sum_offset<V, R, MB>(0, m, r));
      for (int i = 1; i < kChains; ++i) {
        total = V::add(total, V::load(sums + sum_offset<V, R, MB>(i, m, r)));
      }
      out[m * ldo + r] = V::sum(total);
    }
  }
}

// x @ W^T for M rows of x (and of arranged x, `ldx` floats apart), output
// columns [n0, n1). Each element is scaled before its products, as the
// reference does, so non-finite scales would need no second pass here;
// NaN codes an ISA's own step decodes as finite do.
template <class V, int kBits, int kClasses>
inline void dot_panels(
    const QuantizedMatrix& w,
    const float* x,
    const float* xa,
    int64_t ldx,
    int64_t M,
    int64_t n0,
    int64_t n1,
    float* out,
    int64_t ldo) {
  constexpr int kLanes = V::kLanes;
  if (ldx == 0) {  // K = 0: empty sums
    for (int64_t m = 0; m < M; ++m) {
      std::fill_n(out + m * ldo, n1 - n0, 0.0f);
    }
    return;
  }
  int64_t stride = w.groups() + kScalePadding;
  float* scales = scratch<float>(1, kPanelRows * stride);
  int64_t blocks = (M + kPanelXRows - 1) / kPanelXRows;
  float* panel = scratch<float>(
      2, kPanelRows * kPanelStride + blocks * kPanelSums * kLanes);
  float* sums = panel + kPanelRows * kPanelStride;
  typename V::I lane_groups[kClasses];
  load_lane_groups<V, kBits, kClasses>(group_shift(w), lane_groups);
  for (int64_t n = n0; n < n1; n += kPanelRows) {
    int R = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - n));
    decode_row_scales<V>(w, n, R, scales, stride);
    with_count<kPanelRows>(R, [&]<int PR>() {
      for (int64_t c0 = 0; c0 < ldx; c0 += kPanelChunk) {
        int64_t c1 = std::min(ldx, c0 + kPanelChunk);
        decode_panel<V, kBits, kClasses>(
            w, n, PR, c0, c1, scales, stride, lane_groups, panel);
        int64_t block = 0;
        for_x_blocks<kPanelXRows>(M, [&]<int MB>(int64_t m) {
          panel_dot<V, PR, MB>(
              panel,
              xa + m * ldx + c0,
              ldx,
              c1 - c0,
              c0 == 0,
              sums + block++ * kPanelSums * kLanes);
        });
      }
      int64_t block = 0;
      for_x_blocks<kPanelXRows>(M, [&]<int MB>(int64_t m) {
        panel_sums_out<V, PR, MB>(
            sums + block++ * kPanelSums * kLanes, out + m * ldo + n - n0, ldo);
      });
    });
    redo_nonfinite_rows<V>(w, n, R, scales, stride, x, M, out + n - n0, ldo);
  }
}

}  // namespace
}  // namespace mlx_fpqmm::cpu::simd
