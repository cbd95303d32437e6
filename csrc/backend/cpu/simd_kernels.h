// The float32 kernels, written once over an ISA's vector traits V and
// instantiated in each ISA's own translation unit (compiled with its flags).
//
// V provides: F (a vector of V::kLanes floats), zero, set1, set2 (lower half
// of the lanes one value, upper half another), load, store, fma(a, b, c) =
// a * b + c, mul, add, sum (horizontal); for the dot kernels an integer vector
// I with load_words (kLanes 32-bit words), shift_right, e2m1 / e4m3 (the
// values of the low 4 / 8 bits of each lane; e2m1 not needed with
// decode_e2m1_step and e2m1_step_element, which decode a whole step),
// load_index and permute (lanes of a float vector picked by index),
// optionally scale_lanes (see kScaleLanes); for dequantizing,
// decode_e2m1(bytes, even, odd) (2 * kLanes E2M1 codes from kLanes bytes:
// elements 0, 2, 4, ... and 1, 3, 5, ...), decode_e4m3(bytes) (kLanes E4M3
// codes) and store_interleaved(dst, even, odd) (2 * kLanes floats back in
// element order). Decoding uses the tables of formats.h; tails shorter than
// one vector go through code_value().
#pragma once

#include <algorithm>
#include <bit>

#include "backend/cpu/kernels.h"

// Inner loops inline every trait call so that their small fixed-count loops
// unroll and the accumulators stay in registers.
#define MLX_FPQMM_FLATTEN [[gnu::flatten]]
#define MLX_FPQMM_UNROLL _Pragma("GCC unroll 16")

namespace mlx_fpqmm::cpu {

// How far ahead of its reads a streaming kernel prefetches W (into L2):
// measured best between 4 and 8 KiB on Zen 4.
inline constexpr int64_t kPrefetchDistance = 4096;

// Scratch slots (thread_scratch) the kernels hold at once: 0 for x (the
// AVX-512 bf16 dots), 1 for scales, 2 for decoded rows and panels.
template <class V>
struct SimdKernels {
  using F = typename V::F;
  static constexpr int kLanes = V::kLanes;

  // Elements one decode step covers and the vectors it yields.
  template <int kBits>
  static constexpr int kStep = kBits == 4 ? 2 * kLanes : kLanes;
  template <int kBits>
  static constexpr int kVecs = kBits == 4 ? 2 : 1;

  // dst[g] for groups g in [g0, g1) of one row: the float scales, times the
  // global factor when asked.
  static void decode_scales(
      const QuantizedMatrix& w,
      int64_t row,
      float* dst,
      int64_t g0,
      int64_t g1,
      bool with_global_factor = true) {
    const auto* bytes =
        static_cast<const uint8_t*>(w.scales) + row * w.groups();
    if (w.scale_encoding == ScaleEncoding::e8m0) {
      for (int64_t g = g0; g < g1; ++g) {
        dst[g] = decode_e8m0(bytes[g]);
      }
    } else if (w.scale_encoding == ScaleEncoding::e4m3) {
      int64_t g = g0;
      for (; g + kLanes <= g1; g += kLanes) {
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
  static void decode_row_scales(
      const QuantizedMatrix& w,
      int64_t n,
      int R,
      float* scales,
      int64_t stride) {
    for (int r = 0; r < R; ++r) {
      decode_scales(w, n + r, scales + r * stride, 0, w.groups());
      std::fill_n(scales + r * stride + w.groups(), kScalePadding, 0.0f);
    }
  }

  // log2 of the group size (a power of two): shifts, not divisions, in the
  // inner loops.
  static int group_shift(const QuantizedMatrix& w) {
    return std::countr_zero(static_cast<unsigned>(w.group_size));
  }

  // Calls body.template operator()<R>(n) over blocks of R rows of W in
  // [n0, n1): kRowBlock rows at a time when several x rows, or one x row
  // larger than L1 (32 KiB on current x86 and arm64 cores), are read for
  // each row of W, so that each load of x serves several rows; otherwise
  // one row at a time (measured best either way on Zen 4).
  static constexpr int kRowBlock = 4;
  template <typename Body>
  static void for_w_rows(
      int64_t M, int64_t x_row_bytes, int64_t n0, int64_t n1, Body&& body) {
    constexpr int64_t kL1Bytes = 32 << 10;
    int64_t n = n0;
    if (M > 1 || x_row_bytes > kL1Bytes) {
      for (; n + kRowBlock <= n1; n += kRowBlock) {
        body.template operator()<kRowBlock>(n);
      }
    }
    for (; n < n1; ++n) {
      body.template operator()<1>(n);
    }
  }

  // Calls body.template operator()<MB>(m) over blocks of up to 4 rows of x.
  template <typename Body>
  static void for_row_blocks(int64_t M, Body&& body) {
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

  // The scales of the elements of a step starting at column c, lane by lane.
  // Only 32 E2M1 codes (AVX-512) in groups of 16 span two groups (kSplit);
  // their lower lanes hold the first 16 elements.
  template <bool kSplit>
  static F step_scale(const float* scales, int64_t c, int shift) {
    int64_t g = c >> shift;
    if constexpr (kSplit) {
      return V::set2(scales[g], scales[g + 1]);
    } else {
      return V::set1(scales[g]);
    }
  }

  template <int kBits>
  static bool split(const QuantizedMatrix& w) {
    return kStep<kBits> > w.group_size;
  }

  template <int kBits>
  static void decode(const uint8_t* row, int64_t c, F* v) {
    if constexpr (kBits == 4) {
      V::decode_e2m1(row + c / 2, v[0], v[1]);
    } else {
      v[0] = V::decode_e4m3(row + c);
    }
  }

  // A dot step decodes kLanes 32-bit words of codes (kDotStep elements) into
  // kPerWord vectors. By default vector i holds, in lane j, the code of
  // element j * kPerWord + i (one shift and one table lookup per vector); an
  // ISA may decode a whole E2M1 step its own way (V::decode_e2m1_step, lanes
  // ordered by V::e2m1_step_element). x is arranged to match once per product
  // (arrange_x).
  template <int kBits>
  static constexpr int kPerWord = 32 / kBits;
  template <int kBits>
  static constexpr int kDotStep = kLanes * kPerWord<kBits>;
  template <int kBits>
  static constexpr int64_t kDotStepBytes = kDotStep<kBits> * kBits / 8;
  static constexpr bool kOwnE2M1Step =
      requires(const uint8_t* p, F* d) { V::decode_e2m1_step(p, d); };
  // An ISA may also decode a whole E4M3 step its own way, in the default
  // order, decoding NaN codes as finite values (see has_nan_codes).
  static constexpr bool kOwnE4M3Step =
      requires(const uint8_t* p, F* d) { V::decode_e4m3_step(p, d); };

  // The element (from the step's first) that lane `lane` of vector v holds.
  template <int kBits>
  static constexpr int step_element(int v, int lane) {
    if constexpr (kBits == 4 && kOwnE2M1Step) {
      return V::e2m1_step_element(v, lane);
    } else {
      return lane * kPerWord<kBits> + v;
    }
  }

  template <int kBits>
  static void decode_step(const uint8_t* codes, F* d) {
    if constexpr (kBits == 4 && kOwnE2M1Step) {
      V::decode_e2m1_step(codes, d);
    } else if constexpr (kBits == 8 && kOwnE4M3Step) {
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

  // Groups of 16 elements may differ between the vectors of a step: vectors
  // then fall in two scale classes, by the 16-element half of 32 that their
  // lane 0 reads. Every lane of the vectors of a class has the same group as
  // the class's first vector, for groups of 16 and wider (checked here for
  // every ISA's order).
  template <int kBits>
  static constexpr int scale_class(int v) {
    return (step_element<kBits>(v, 0) >> 4) & 1;
  }
  template <int kBits>
  static constexpr int class_vector(int c) {
    for (int v = 0; v < kPerWord<kBits>; ++v) {
      if (scale_class<kBits>(v) == c) {
        return v;
      }
    }
    return 0;
  }
  template <int kBits>
  static constexpr bool classes_share_groups() {
    for (int shift = 4; shift <= 5; ++shift) {
      for (int v = 0; v < kPerWord<kBits>; ++v) {
        int first = class_vector<kBits>(shift == 4 ? scale_class<kBits>(v) : 0);
        for (int lane = 0; lane < kLanes; ++lane) {
          if (step_element<kBits>(v, lane) >> shift !=
              step_element<kBits>(first, lane) >> shift) {
            return false;
          }
        }
      }
    }
    return true;
  }
  static_assert(classes_share_groups<4>() && classes_share_groups<8>());

  // x in step order, zero-padded to whole steps (the last, partial step of W
  // is decoded from a zero-padded copy, so zeros meet zeros).
  template <int kBits>
  static int64_t padded_length(int64_t K) {
    return (K + kDotStep<kBits> - 1) / kDotStep<kBits> * kDotStep<kBits>;
  }
  template <int kBits>
  static void arrange(const float* x, int64_t K, float* dst) {
    int64_t full = K - K % kDotStep<kBits>;
    for (int64_t k = 0; k < full; k += kDotStep<kBits>) {
      MLX_FPQMM_UNROLL
      for (int v = 0; v < kPerWord<kBits>; ++v) {
        MLX_FPQMM_UNROLL
        for (int lane = 0; lane < kLanes; ++lane) {
          dst[k + v * kLanes + lane] = x[k + step_element<kBits>(v, lane)];
        }
      }
    }
    if (full < K) {
      for (int v = 0; v < kPerWord<kBits>; ++v) {
        for (int lane = 0; lane < kLanes; ++lane) {
          int64_t element = full + step_element<kBits>(v, lane);
          dst[full + v * kLanes + lane] = element < K ? x[element] : 0.0f;
        }
      }
    }
  }

  // f(i, j, k) for every index of an A x B x C block of registers, unrolled.
  template <int A, int B, int C, typename Fn>
  static void for_each_index(Fn&& f) {
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

  // Lane j's group in scale class c, relative to the step's first group.
  template <int kBits, int kClasses>
  static void load_lane_groups(int shift, typename V::I* groups) {
    alignas(64) int32_t lane_groups[kClasses][kLanes];
    for (int c = 0; c < kClasses; ++c) {
      for (int j = 0; j < kLanes; ++j) {
        lane_groups[c][j] =
            step_element<kBits>(class_vector<kBits>(c), j) >> shift;
      }
    }
    for (int c = 0; c < kClasses; ++c) {
      groups[c] = V::load_index(lane_groups[c]);
    }
  }

  // An ISA may pick a step's scales from the four floats at p
  // (V::scale_lanes(p, index)) instead of permuting a whole vector: on AVX2 a
  // 128-bit broadcast load and an in-lane permute, not a cross-lane one (Zen
  // 3: mxfp4 M = 1 5% faster).
  static constexpr bool kScaleLanes = requires(
      const float* p, typename V::I index) { V::scale_lanes(p, index); };
  // Whether every lane of a step falls in its first four groups, for groups
  // of 16 (the smallest any format has) and wider.
  template <int kBits>
  static constexpr bool step_spans_four_groups() {
    for (int v = 0; v < kPerWord<kBits>; ++v) {
      for (int lane = 0; lane < kLanes; ++lane) {
        if (step_element<kBits>(v, lane) >> 4 >= 4) {
          return false;
        }
      }
    }
    return true;
  }
  static_assert(
      !kScaleLanes ||
      (step_spans_four_groups<4>() && step_spans_four_groups<8>()));

  // The scales of each class's lanes for the step at column c.
  template <int kClasses>
  static void step_scales(
      const float* scales,
      int64_t c,
      int shift,
      const typename V::I* groups,
      F* s) {
    MLX_FPQMM_UNROLL
    for (int k = 0; k < kClasses; ++k) {
      if constexpr (kScaleLanes) {
        s[k] = V::scale_lanes(scales + (c >> shift), groups[k]);
      } else {
        s[k] = V::permute(V::load(scales + (c >> shift)), groups[k]);
      }
    }
  }

  // Calls step(codes, c) for every dot step of row r of W in [c0, c1) (c0 a
  // multiple of kDotStep): the last, partial step of the row from a
  // zero-padded copy.
  template <int kBits, typename Step>
  static void for_row_steps(
      const QuantizedMatrix& w,
      int64_t r,
      int64_t c0,
      int64_t c1,
      Step&& step) {
    int64_t K = w.cols;
    int64_t full = std::min(c1, K - K % kDotStep<kBits>);
    const uint8_t* row = w.row(r);
    int64_t c = c0;
    for (; c < full; c += kDotStep<kBits>) {
      const uint8_t* codes = row + c * kBits / 8;
      __builtin_prefetch(codes + kPrefetchDistance, 0, 2);
      step(codes, c);
    }
    if (c < c1 && c < K) {
      alignas(64) uint8_t tail[kDotStepBytes<kBits>] = {};
      std::copy_n(row + c * kBits / 8, (K - c) * kBits / 8, tail);
      step(tail, c);
    }
  }

  // Up to this many rows of x, W is decoded in registers for each step and
  // every row of x multiplies it (dot_block); from here on, panels (measured
  // on Zen 3 with AVX2: mxfp4 14336 x 4096 and 4096 x 14336, M = 2 17-20%
  // and M = 3 3-7% faster than panels, M = 4 8-9% slower).
  static constexpr int kFusedRows = 3;

  // R consecutive rows of W (codes and decoded scales, `stride` floats per
  // row) against MB rows of arranged x (`ldx` floats apart), all of K: each
  // class's products are summed in chains and scaled once per step; R rows
  // of W share each load of x (see for_w_rows), or MB rows of x each decoded
  // vector (one or the other).
  template <int kBits, int R, int MB, int kClasses>
  MLX_FPQMM_FLATTEN static void dot_block(
      const QuantizedMatrix& w,
      int64_t row,
      const float* scales,
      int64_t stride,
      const float* xa,
      int64_t ldx,
      float* out,
      int64_t ldo) {
    static_assert(R == 1 || MB == 1);
    constexpr int P = kPerWord<kBits>;
    // Independent accumulator chains per row of W: enough to hide the FMA
    // latency, few enough to stay in registers. Each product chain costs an
    // FMA per step to scale: two scale classes make two chains already (Zen
    // 3, nvfp4 M = 1: 4% faster than four; mxfp4: one chain 3% slower).
    constexpr int kChains = R == 1 && MB == 1 ? 2 : 1;
    constexpr int kPChains = MB == 1 && kClasses == 1 ? 2 : 1;
    int shift = group_shift(w);
    typename V::I groups[kClasses];
    load_lane_groups<kBits, kClasses>(shift, groups);
    F acc[R][MB][kChains];
    for_each_index<R, MB, kChains>(
        [&](int r, int m, int k) { acc[r][m][k] = V::zero(); });
    auto step = [&](int r, const uint8_t* codes, int64_t c) {
      F d[P];
      decode_step<kBits>(codes, d);
      F s[kClasses];
      step_scales<kClasses>(scales + r * stride, c, shift, groups, s);
      const float* xs = xa + c;
      F p[kClasses][MB][kPChains];
      for_each_index<kClasses, MB, kPChains>(
          [&](int k, int m, int i) { p[k][m][i] = V::zero(); });
      MLX_FPQMM_UNROLL
      for (int v = 0; v < P; ++v) {
        MLX_FPQMM_UNROLL
        for (int m = 0; m < MB; ++m) {
          F& chain = p[scale_class<kBits>(v) % kClasses][m][v % kPChains];
          chain = V::fma(d[v], V::load(xs + m * ldx + v * kLanes), chain);
        }
      }
      for_each_index<kClasses, MB, kPChains>([&](int k, int m, int i) {
        F& sum = acc[r][m][i % kChains];
        sum = V::fma(p[k][m][i], s[k], sum);
      });
    };
    if constexpr (R == 1) {
      for_row_steps<kBits>(
          w, row, 0, w.cols, [&](const uint8_t* codes, int64_t c) {
            step(0, codes, c);
          });
    } else {
      // The rows' steps interleaved, so that they share each load of x.
      int64_t K = w.cols;
      int64_t full = K - K % kDotStep<kBits>;
      for (int64_t c = 0; c < full; c += kDotStep<kBits>) {
        MLX_FPQMM_UNROLL
        for (int r = 0; r < R; ++r) {
          const uint8_t* codes = w.row(row + r) + c * kBits / 8;
          __builtin_prefetch(codes + kPrefetchDistance, 0, 2);
          step(r, codes, c);
        }
      }
      for (int r = 0; r < R; ++r) {
        for_row_steps<kBits>(
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
        out[m * ldo + r] = V::sum(total);
      }
    }
  }

  // Several rows of x: kPanelRows rows of W are decoded, scaled, a chunk of
  // kPanelChunk columns at a time into a panel that stays in L1, and every
  // block of kPanelXRows rows of x is multiplied with it, each (x row, W
  // row) pair summing in its own register: W is decoded once for all rows of
  // x, and each load of x serves kPanelRows rows of W (decoding in registers
  // per step instead made every row of x reload its chunk for each row of W,
  // bound by the L2). The sums carry over chunks in a small buffer.
  static constexpr int kPanelRows = 6;
  static constexpr int kPanelXRows = 2;
  static constexpr int64_t kPanelChunk = 512;
  // Panel rows are this many floats longer than a chunk, so that rows read
  // together do not fall in the same L1 sets (4 KiB apart).
  static constexpr int64_t kPanelSkew = 16;
  static constexpr int64_t kPanelStride = kPanelChunk + kPanelSkew;
  static_assert(
      kPanelChunk % kDotStep<4> == 0 && kPanelChunk % kDotStep<8> == 0);

  // Independent sums per (x row, W row) pair: two for a single row of x,
  // whose kPanelRows pairs would otherwise leave the FMAs waiting on their
  // latency. Not a function of the rows of W, so that a row of W sums the
  // same way whichever block (and thread) it falls in.
  template <int MB>
  static constexpr int kPanelChains = MB == 1 ? 2 : 1;
  static constexpr int kPanelSums = 12;  // most kPanelChains * MB * R
  static_assert(kPanelChains<1> * kPanelRows <= kPanelSums);
  static_assert(
      kPanelChains<kPanelXRows> * kPanelXRows * kPanelRows <= kPanelSums);
  // Where chain i of pair (m, r) keeps its sum between chunks.
  template <int R, int MB>
  static constexpr int64_t sum_offset(int i, int m, int r) {
    return ((i * MB + m) * R + r) * kLanes;
  }

  // v, held in a register: x86 compilers otherwise fold the load that made
  // it into every FMA that reads it, loading a panel vector once per row of
  // x instead of once.
  static F in_register(F v) {
#if defined(__x86_64__)
    asm("" : "+x"(v));
#endif
    return v;
  }

  // Rows [n, n + R) of W, columns [c0, c1), scaled by their decoded scales
  // (`stride` floats per row), into the panel in arranged order.
  template <int kBits, int kClasses>
  MLX_FPQMM_FLATTEN static void decode_panel(
      const QuantizedMatrix& w,
      int64_t n,
      int R,
      int64_t c0,
      int64_t c1,
      const float* scales,
      int64_t stride,
      const typename V::I* groups,
      float* panel) {
    constexpr int P = kPerWord<kBits>;
    int shift = group_shift(w);
    for (int r = 0; r < R; ++r) {
      float* dst = panel + r * kPanelStride - c0;
      for_row_steps<kBits>(
          w, n + r, c0, c1, [&](const uint8_t* codes, int64_t c) {
            F d[P];
            decode_step<kBits>(codes, d);
            F s[kClasses];
            step_scales<kClasses>(scales + r * stride, c, shift, groups, s);
            MLX_FPQMM_UNROLL
            for (int v = 0; v < P; ++v) {
              V::store(
                  dst + c + v * kLanes,
                  V::mul(d[v], s[scale_class<kBits>(v) % kClasses]));
            }
          });
    }
  }

  // The sums of MB rows of arranged x (`ldx` apart) times R panel rows over
  // `length` columns, added to the sums in `sums` (zero when `first`).
  template <int R, int MB>
  MLX_FPQMM_FLATTEN static void panel_dot(
      const float* panel,
      const float* xa,
      int64_t ldx,
      int64_t length,
      bool first,
      float* sums) {
    constexpr int kChains = kPanelChains<MB>;
    F acc[kChains][MB][R];
    for_each_index<kChains, MB, R>([&](int i, int m, int r) {
      acc[i][m][r] =
          first ? V::zero() : V::load(sums + sum_offset<R, MB>(i, m, r));
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
              in_register(V::load(panel + r * kPanelStride + k + i * kLanes));
          MLX_FPQMM_UNROLL
          for (int m = 0; m < MB; ++m) {
            acc[i][m][r] = V::fma(row, xv[m], acc[i][m][r]);
          }
        }
      }
    }
    for_each_index<kChains, MB, R>([&](int i, int m, int r) {
      V::store(sums + sum_offset<R, MB>(i, m, r), acc[i][m][r]);
    });
  }

  template <int R, int MB>
  static void panel_sums_out(const float* sums, float* out, int64_t ldo) {
    constexpr int kChains = kPanelChains<MB>;
    for (int m = 0; m < MB; ++m) {
      for (int r = 0; r < R; ++r) {
        F total = V::load(sums + sum_offset<R, MB>(0, m, r));
        for (int i = 1; i < kChains; ++i) {
          total = V::add(total, V::load(sums + sum_offset<R, MB>(i, m, r)));
        }
        out[m * ldo + r] = V::sum(total);
      }
    }
  }

  // x @ W^T for M rows of x (and of arranged x, `ldx` floats apart), output
  // columns [n0, n1). Each element is scaled before its products, as the
  // reference does, so non-finite scales would need no second pass here;
  // NaN codes an ISA's own step decodes as finite do.
  template <int kBits, int kClasses>
  static void dot_panels(
      const QuantizedMatrix& w,
      const float* x,
      const float* xa,
      int64_t ldx,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
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
    load_lane_groups<kBits, kClasses>(group_shift(w), lane_groups);
    for (int64_t n = n0; n < n1; n += kPanelRows) {
      int R = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - n));
      decode_row_scales(w, n, R, scales, stride);
      with_count<kPanelRows>(R, [&]<int PR>() {
        for (int64_t c0 = 0; c0 < ldx; c0 += kPanelChunk) {
          int64_t c1 = std::min(ldx, c0 + kPanelChunk);
          decode_panel<kBits, kClasses>(
              w, n, PR, c0, c1, scales, stride, lane_groups, panel);
          int64_t block = 0;
          for_x_blocks<kPanelXRows>(M, [&]<int MB>(int64_t m) {
            panel_dot<PR, MB>(
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
          panel_sums_out<PR, MB>(
              sums + block++ * kPanelSums * kLanes,
              out + m * ldo + n - n0,
              ldo);
        });
      });
      redo_nonfinite_rows(w, n, R, scales, stride, x, M, out + n - n0, ldo);
    }
  }

  // Whether row r of W holds a NaN code (magnitude 0x7F, the largest) that
  // the ISA's own E4M3 step decodes as a finite value. A max-reduction, so
  // that it vectorizes.
  static bool has_nan_codes(const QuantizedMatrix& w, int64_t r) {
    if (!kOwnE4M3Step || w.bits != 8) {
      return false;
    }
    const uint8_t* codes = w.row(r);
    uint8_t largest = 0;
    for (int64_t k = 0; k < w.cols; ++k) {
      largest = std::max<uint8_t>(largest, codes[k] & 0x7F);
    }
    return largest == 0x7F;
  }

  // The dot kernels scale each group's sum of x * code, which matches the
  // reference's sum of x * (code * scale) only for finite scales (an infinite
  // scale times a ±0 code is NaN there). Rows of W [n, n + R) holding a
  // non-finite scale, or a NaN code decoded as finite, rare, are redone
  // element by element.
  // On the exponent bits, as a max-reduction: it vectorizes (the check runs
  // for every row of W) and survives -ffinite-math-only.
  static bool all_finite(const float* scales, int64_t count) {
    constexpr uint32_t kExponent = 0x7F800000u;
    uint32_t largest = 0;
    for (int64_t g = 0; g < count; ++g) {
      largest =
          std::max(largest, std::bit_cast<uint32_t>(scales[g]) & kExponent);
    }
    return largest != kExponent;
  }

  template <typename X>
  static void redo_nonfinite_rows(
      const QuantizedMatrix& w,
      int64_t n,
      int R,
      const float* scales,
      int64_t stride,
      const X* x,
      int64_t M,
      float* out,
      int64_t ldo) {
    for (int r = 0; r < R; ++r) {
      const float* row_scales = scales + r * stride;
      if (all_finite(row_scales, w.groups()) && !has_nan_codes(w, n + r)) {
        continue;
      }
      for (int64_t m = 0; m < M; ++m) {
        out[m * ldo + r] = dot_by_element(w, n + r, row_scales, x + m * w.cols);
      }
    }
  }

  // Calls body.template operator()<MB>(m) over blocks of up to kMax rows of
  // x, as evenly sized as possible.
  template <int kMax, typename Body>
  static void for_x_blocks(int64_t M, Body&& body) {
    int64_t blocks = (M + kMax - 1) / kMax;
    for (int64_t m = 0, b = 0; b < blocks; ++b) {
      int64_t rows = (M - m) / (blocks - b);
      with_count<kMax>(
          rows, [&]<int MB>() { body.template operator()<MB>(m); });
      m += rows;
    }
  }

  template <int kMax, typename Body>
  static void with_count(int64_t count, Body&& body) {
    if constexpr (kMax > 1) {
      if (count < kMax) {
        with_count<kMax - 1>(count, body);
        return;
      }
    }
    body.template operator()<kMax>();
  }

  // x for dot: `rows` rows in step order, arranged_length(w) floats each.
  static int64_t arranged_length(const QuantizedMatrix& w) {
    return w.bits == 4 ? padded_length<4>(w.cols) : padded_length<8>(w.cols);
  }
  static void arrange_x(
      const QuantizedMatrix& w, const float* x, int64_t rows, float* arranged) {
    with_code_bits(w.bits, [&](auto bits) {
      int64_t ldx = padded_length<bits>(w.cols);
      for (int64_t m = 0; m < rows; ++m) {
        arrange<bits>(x + m * w.cols, w.cols, arranged + m * ldx);
      }
    });
  }

  template <int kBits, int kClasses>
  static void dot_impl(
      const QuantizedMatrix& w,
      const float* x,
      const float* xa,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
    int64_t K = w.cols;
    int64_t ldx = padded_length<kBits>(K);
    if (M <= kFusedRows) {
      int64_t stride = w.groups() + kScalePadding;
      float* scales = scratch<float>(1, kRowBlock * stride);
      auto rows = [&]<int R, int MB>(int64_t n) {
        decode_row_scales(w, n, R, scales, stride);
        dot_block<kBits, R, MB, kClasses>(
            w, n, scales, stride, xa, ldx, out + n - n0, ldo);
        redo_nonfinite_rows(w, n, R, scales, stride, x, M, out + n - n0, ldo);
      };
      if (M == 1) {
        for_w_rows(1, K * sizeof(float), n0, n1, [&]<int R>(int64_t n) {
          rows.template operator()<R, 1>(n);
        });
      } else {
        with_count<kFusedRows>(M, [&]<int MB>() {
          for (int64_t n = n0; n < n1; ++n) {
            rows.template operator()<1, MB>(n);
          }
        });
      }
      return;
    }
    dot_panels<kBits, kClasses>(w, x, xa, ldx, M, n0, n1, out, ldo);
  }
  static void dot(
      const QuantizedMatrix& w,
      const float* x,
      const float* arranged_x,
      int64_t M,
      int64_t n0,
      int64_t n1,
      float* out,
      int64_t ldo) {
    with_code_bits(w.bits, [&](auto bits) {
      if (w.group_size < 32) {
        dot_impl<bits, 2>(w, x, arranged_x, M, n0, n1, out, ldo);
      } else {
        dot_impl<bits, 1>(w, x, arranged_x, M, n0, n1, out, ldo);
      }
    });
  }

  // Decodes columns [c0, c1) of row r, scaled, into dst in element order.
  template <int kBits>
  MLX_FPQMM_FLATTEN static void dequantize_row(
      const QuantizedMatrix& w,
      int64_t r,
      int64_t c0,
      int64_t c1,
      const float* scales,
      float* dst) {
    const uint8_t* row = w.row(r);
    int shift = group_shift(w);
    int64_t c = c0;
    bool two_groups = split<kBits>(w);
    for (; c + kStep<kBits> <= c1; c += kStep<kBits>) {
      F s = two_groups ? step_scale<true>(scales, c, shift)
                       : step_scale<false>(scales, c, shift);
      F d[kVecs<kBits>];
      decode<kBits>(row, c, d);
      if constexpr (kBits == 4) {
        V::store_interleaved(dst + c - c0, V::mul(d[0], s), V::mul(d[1], s));
      } else {
        V::store(dst + c - c0, V::mul(d[0], s));
      }
    }
    for (; c < c1; ++c) {
      dst[c - c0] = code_value(w, r, c) * scales[c / w.group_size];
    }
  }

  template <int kBits>
  static void dequantize_impl(
      const QuantizedMatrix& w,
      int64_t r0,
      int64_t r1,
      int64_t c0,
      int64_t c1,
      float* dst,
      int64_t ld) {
    float* scales = scratch<float>(1, w.groups() + kScalePadding);
    for (int64_t r = r0; r < r1; ++r) {
      decode_scales(
          w,
          r,
          scales,
          c0 / w.group_size,
          (c1 + w.group_size - 1) / w.group_size);
      dequantize_row<kBits>(w, r, c0, c1, scales, dst + (r - r0) * ld);
    }
  }

  static void dequantize(
      const QuantizedMatrix& w,
      int64_t r0,
      int64_t r1,
      int64_t c0,
      int64_t c1,
      float* dst,
      int64_t ld) {
    with_code_bits(w.bits, [&](auto bits) {
      dequantize_impl<bits>(w, r0, r1, c0, c1, dst, ld);
    });
  }

  // x @ W with W (K, N): each row of W is decoded once, in blocks of columns
  // that stay in L1, and added into every x row's accumulators.
  MLX_FPQMM_FLATTEN static void axpy(
      const QuantizedMatrix& w,
      const float* x,
      int64_t M,
      int64_t c0,
      int64_t c1,
      float* out,
      int64_t ldo) {
    constexpr int64_t kBlock = 256;
    float* w_row = scratch<float>(2, kBlock);
    float* scales = scratch<float>(1, w.groups() + kScalePadding);
    int64_t K = w.rows;
    for (int64_t b0 = c0; b0 < c1; b0 += kBlock) {
      int64_t b1 = std::min(c1, b0 + kBlock);
      int64_t width = b1 - b0;
      for (int64_t m = 0; m < M; ++m) {
        std::fill_n(out + m * ldo + b0 - c0, width, 0.0f);
      }
      for (int64_t k = 0; k < K; ++k) {
        decode_scales(
            w,
            k,
            scales,
            b0 / w.group_size,
            (b1 + w.group_size - 1) / w.group_size);
        with_code_bits(w.bits, [&](auto bits) {
          dequantize_row<bits>(w, k, b0, b1, scales, w_row);
        });
        for (int64_t m = 0; m < M; ++m) {
          F xk = V::set1(x[m * K + k]);
          float* o = out + m * ldo + b0 - c0;
          int64_t j = 0;
          for (; j + kLanes <= width; j += kLanes) {
            V::store(o + j, V::fma(V::load(w_row + j), xk, V::load(o + j)));
          }
          for (; j < width; ++j) {
            o[j] += w_row[j] * x[m * K + k];
          }
        }
      }
    }
  }
};

}  // namespace mlx_fpqmm::cpu
