// Decoding W into vectors over an ISA's vector traits V (simd_kernels.h):
// scales, codes in element order (for dequantizing) and in a dot step's order
// (for the dots), and x arranged to match a dot step.
#pragma once

#include <algorithm>
#include <bit>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_loops.h"

namespace mlx_fpqmm::cpu::simd {
namespace {  // see simd_loops.h

// ---------------------------------------------------------------------------
// Scales.

// dst[g] for groups g in [g0, g1) of one row: the float scales, times the
// global factor when asked.
template <class V>
inline void decode_scales(
    const QuantizedMatrix& w,
    int64_t row,
    float* dst,
    int64_t g0,
    int64_t g1,
    bool with_global_factor = true) {
  const auto* bytes = static_cast<const uint8_t*>(w.scales) + row * w.groups();
  if (w.scale_encoding == ScaleEncoding::e8m0) {
    for (int64_t g = g0; g < g1; ++g) {
      dst[g] = decode_e8m0(bytes[g]);
    }
  } else if (w.scale_encoding == ScaleEncoding::e4m3) {
    int64_t g = g0;
    for (; g + V::kLanes <= g1; g += V::kLanes) {
      V::store(dst + g, V::decode_e4m3(bytes + g));
    }
    for (; g < g1; ++g) {
      dst[g] = kE4M3Values[bytes[g]];
    }
  } else {
    decode_float_scales(w, row, dst, g0, g1);
    return;
  }
  if (with_global_factor && w.global_factor != 1.0f) {
    for (int64_t g = g0; g < g1; ++g) {
      dst[g] *= w.global_factor;
    }
  }
}

// The scales of rows [n, n + R) of W, `stride` floats per row, for the
// dot kernels: the padded last step's groups scale zeros, kept finite.
template <class V>
inline void decode_row_scales(
    const QuantizedMatrix& w, int64_t n, int R, float* scales, int64_t stride) {
  for (int r = 0; r < R; ++r) {
    decode_scales<V>(w, n + r, scales + r * stride, 0, w.groups());
    std::fill_n(scales + r * stride + w.groups(), kScalePadding, 0.0f);
  }
}

// log2 of the group size (a power of two): shifts, not divisions, in the
// inner loops.
inline int group_shift(const QuantizedMatrix& w) {
  return std::countr_zero(static_cast<unsigned>(w.group_size));
}

// ---------------------------------------------------------------------------
// Codes in element order.

// Elements one decode step covers and the vectors it yields.
template <class V, int kBits>
constexpr int kStep = kBits == 4 ? 2 * V::kLanes : V::kLanes;
template <int kBits>
constexpr int kVecs = kBits == 4 ? 2 : 1;

// The scales of the elements of a step starting at column c, lane by lane.
// Only 32 E2M1 codes (AVX-512) in groups of 16 span two groups (kSplit);
// their lower lanes hold the first 16 elements.
template <class V, bool kSplit>
inline typename V::F step_scale(const float* scales, int64_t c, int shift) {
  int64_t g = c >> shift;
  if constexpr (kSplit) {
    return V::set2(scales[g], scales[g + 1]);
  } else {
    return V::set1(scales[g]);
  }
}

template <class V, int kBits>
inline bool split(const QuantizedMatrix& w) {
  return kStep<V, kBits> > w.group_size;
}

template <class V, int kBits>
inline void decode(const uint8_t* row, int64_t c, typename V::F* v) {
  if constexpr (kBits == 4) {
    V::decode_e2m1(row + c / 2, v[0], v[1]);
  } else {
    v[0] = V::decode_e4m3(row + c);
  }
}

// ---------------------------------------------------------------------------
// Codes in a dot step's order.

// A dot step decodes kLanes 32-bit words of codes (kDotStep elements) into
// kPerWord vectors. By default vector i holds, in lane j, the code of
// element j * kPerWord + i (one shift and one table lookup per vector); an
// ISA may decode a whole E2M1 step its own way (V::decode_e2m1_step, lanes
// ordered by V::e2m1_step_element). x is arranged to match once per product
// (arrange).
template <int kBits>
constexpr int kPerWord = 32 / kBits;
template <class V, int kBits>
constexpr int kDotStep = V::kLanes * kPerWord<kBits>;
template <class V, int kBits>
constexpr int64_t kDotStepBytes = kDotStep<V, kBits> * kBits / 8;
template <class V>
constexpr bool kOwnE2M1Step =
    requires(const uint8_t* p, typename V::F* d) { V::decode_e2m1_step(p, d); };
// An ISA may also decode a whole E4M3 step its own way, in the default
// order, decoding NaN codes as finite values (see has_nan_codes).
template <class V>
constexpr bool kOwnE4M3Step =
    requires(const uint8_t* p, typename V::F* d) { V::decode_e4m3_step(p, d); };

// The element (from the step's first) that lane `lane` of vector v holds.
template <class V, int kBits>
constexpr int step_element(int v, int lane) {
  if constexpr (kBits == 4 && kOwnE2M1Step<V>) {
    return V::e2m1_step_element(v, lane);
  } else {
    return lane * kPerWord<kBits> + v;
  }
}

template <class V, int kBits>
inline void decode_step(const uint8_t* codes, typename V::F* d) {
  if constexpr (kBits == 4 && kOwnE2M1Step<V>) {
    V::decode_e2m1_step(codes, d);
  } else if constexpr (kBits == 8 && kOwnE4M3Step<V>) {
    V::decode_e4m3_step(codes, d);
  } else {
    auto words = V::load_words(codes);
    MLX_FPQMM_UNROLL
    for (int i = 0; i < kPerWord<kBits>; ++i) {
      if constexpr (kBits == 4) {
        d[i] = V::e2m1(V::shift_right(words, 4 * i));
      } else {
        d[i] = V::e4m3(V::shift_right(words, 8 * i));
      }
    }
  }
}

// Calls step(codes, c) for every dot step of row r of W in [c0, c1) (c0 a
// multiple of kDotStep): the last, partial step of the row from a
// zero-padded copy.
template <class V, int kBits, typename Step>
inline void for_row_steps(
    const QuantizedMatrix& w, int64_t r, int64_t c0, int64_t c1, Step&& step) {
  int64_t K = w.cols;
  int64_t full = std::min(c1, K - K % kDotStep<V, kBits>);
  const uint8_t* row = w.row(r);
  int64_t c = c0;
  for (; c < full; c += kDotStep<V, kBits>) {
    const uint8_t* codes = row + c * kBits / 8;
    __builtin_prefetch(codes + kPrefetchDistance, 0, 2);
    step(codes, c);
  }
  if (c < c1 && c < K) {
    alignas(64) uint8_t tail[kDotStepBytes<V, kBits>] = {};
    std::copy_n(row + c * kBits / 8, (K - c) * kBits / 8, tail);
    step(tail, c);
  }
}

// ---------------------------------------------------------------------------
// The scales of a dot step.

// Groups of 16 elements may differ between the vectors of a step: vectors
// then fall in two scale classes, by the 16-element half of 32 that their
// lane 0 reads. Every lane of the vectors of a class has the same group as
// the class's first vector, for groups of 16 and wider (checked by
// load_lane_groups for every ISA's order).
template <class V, int kBits>
constexpr int scale_class(int v) {
  return (step_element<V, kBits>(v, 0) >> 4) & 1;
}
template <class V, int kBits>
constexpr int class_vector(int c) {
  for (int v = 0; v < kPerWord<kBits>; ++v) {
    if (scale_class<V, kBits>(v) == c) {
      return v;
    }
  }
  return 0;
}
template <class V, int kBits>
constexpr bool classes_share_groups() {
  for (int shift = 4; shift <= 5; ++shift) {
    for (int v = 0; v < kPerWord<kBits>; ++v) {
      int first =
          class_vector<V, kBits>(shift == 4 ? scale_class<V, kBits>(v) : 0);
      for (int lane = 0; lane < V::kLanes; ++lane) {
        if (step_element<V, kBits>(v, lane) >> shift !=
            step_element<V, kBits>(first, lane) >> shift) {
          return false;
        }
      }
    }
  }
  return true;
}

// An ISA may pick a step's scales from the four floats at p
// (V::scale_lanes(p, index)) instead of permuting a whole vector: on AVX2 a
// 128-bit broadcast load and an in-lane permute, not a cross-lane one.
template <class V>
constexpr bool kScaleLanes =
    requires(const float* p, typename V::I index) { V::scale_lanes(p, index); };
// Whether every lane of a step falls in its first four groups, for groups
// of 16 (the smallest any format has) and wider.
template <class V, int kBits>
constexpr bool step_spans_four_groups() {
  for (int v = 0; v < kPerWord<kBits>; ++v) {
    for (int lane = 0; lane < V::kLanes; ++lane) {
      if (step_element<V, kBits>(v, lane) >> 4 >= 4) {
        return false;
      }
    }
  }
  return true;
}

// Lane j's group in scale class c, relative to the step's first group.
template <class V, int kBits, int kClasses>
inline void load_lane_groups(int shift, typename V::I* groups) {
  static_assert(classes_share_groups<V, kBits>());
  static_assert(!kScaleLanes<V> || step_spans_four_groups<V, kBits>());
  alignas(64) int32_t lane_groups[kClasses][V::kLanes];
  for (int c = 0; c < kClasses; ++c) {
    for (int j = 0; j < V::kLanes; ++j) {
      lane_groups[c][j] =
          step_element<V, kBits>(class_vector<V, kBits>(c), j) >> shift;
    }
  }
  for (int c = 0; c < kClasses; ++c) {
    groups[c] = V::load_index(lane_groups[c]);
  }
}

// The scales of each class's lanes for the step at column c.
template <class V, int kClasses>
inline void step_scales(
    const float* scales,
    int64_t c,
    int shift,
    const typename V::I* groups,
    typename V::F* s) {
  MLX_FPQMM_UNROLL
  for (int k = 0; k < kClasses; ++k) {
    if constexpr (kScaleLanes<V>) {
      s[k] = V::scale_lanes(scales + (c >> shift), groups[k]);
    } else {
      s[k] = V::permute(V::load(scales + (c >> shift)), groups[k]);
    }
  }
}

// ---------------------------------------------------------------------------
// x in a dot step's order.

// x in step order, zero-padded to whole steps (the last, partial step of W
// is decoded from a zero-padded copy, so zeros meet zeros).
template <class V, int kBits>
inline int64_t padded_length(int64_t K) {
  return (K + kDotStep<V, kBits> - 1) / kDotStep<V, kBits> * kDotStep<V, kBits>;
}
template <class V, int kBits>
inline void arrange(const float* x, int64_t K, float* dst) {
  constexpr int kLanes = V::kLanes;
  int64_t full = K - K % kDotStep<V, kBits>;
  for (int64_t k = 0; k < full; k += kDotStep<V, kBits>) {
    MLX_FPQMM_UNROLL
    for (int v = 0; v < kPerWord<kBits>; ++v) {
      MLX_FPQMM_UNROLL
      for (int lane = 0; lane < kLanes; ++lane) {
        dst[k + v * kLanes + lane] = x[k + step_element<V, kBits>(v, lane)];
      }
    }
  }
  if (full < K) {
    for (int v = 0; v < kPerWord<kBits>; ++v) {
      for (int lane = 0; lane < kLanes; ++lane) {
        int64_t element = full + step_element<V, kBits>(v, lane);
        dst[full + v * kLanes + lane] = element < K ? x[element] : 0.0f;
      }
    }
  }
}

}  // namespace
}  // namespace mlx_fpqmm::cpu::simd
