// y = x @ W^T for the decode range: W (N, K) grouped along K, on the tensor
// cores, fed from device memory straight into registers. A lane loads 16
// bytes of each of its two rows of a tile (a quad of lanes: 64 contiguous
// bytes of a row) and takes them apart into mma steps together with the same
// codes of x. A step's codes then span the groups of the quad's lanes, so
// the scale cannot wait for the float32 sums: it is multiplied into the
// 16-bit pairs of codes, exactly for the MLX formats (a power of two or an
// E4M3 scale times an E2M1 or E4M3 code fits bfloat16's 8 significant
// bits). Codes are bfloat16 pairs, and float32 x enters as bfloat16 high
// and low parts; float16 x too, unless the warp's scales of a pass fold
// into float16 codes exactly (HalfWindow), where codes and x multiply in
// float16. With float32 x a float scale's product keeps 16 significant bits
// as x does: W enters as high and low parts too (kWParts).
#pragma once

#include "backend/cuda/kernels/fp_mma.cuh"

namespace fpqmm::cuda {

// The mma steps of one pair of x values in the 16-bit type H of the codes:
// one where x is of that type, else a high and a low bfloat16 part (16 of
// x's significant bits, all of float16's).
template <typename T, typename H>
inline constexpr int kXParts = std::is_same_v<T, H> ? 1 : 2;

// The MLX formats' scales (E8M0, E4M3), whose products with codes fit
// bfloat16, and whose float32 x the plan may split into bfloat16 parts for
// fp_qmm and fp_qmm_wgmma.
template <int encoding>
inline constexpr bool kMlxScales =
    encoding == kScaleE8M0 || encoding == kScaleE4M3;

// W's parts: code times scale as a bfloat16 high part and the low part it
// leaves, where float32 x meets float scales, so that W keeps 16 of its
// significant bits as x does (the MLX formats' products fit one part).
template <typename T, int encoding>
inline constexpr int kWParts =
    std::is_same_v<T, float> && !kMlxScales<encoding> ? 2 : 1;

using Bf16Pair = __nv_bfloat162;

__device__ __forceinline__ float power_of_two(int exponent) {
  return __int_as_float((127 + exponent) << 23);
}

// A lane's codes of a pass: 16 bytes of a row (32 E2M1 or 16 E4M3 codes),
// one group of them, or two of nvfp4's groups of 16.
template <int bits, int encoding>
inline constexpr int kChunkGroups = bits == 4 && encoding == kScaleE4M3 ? 2 : 1;

// The group size that the scales' encoding fixes; 0 for float scales, whose
// group size is the product's.
template <int encoding>
inline constexpr int kEncodingGroupSize =
    encoding == kScaleE8M0 ? kE8M0GroupSize
                           : (encoding == kScaleE4M3 ? kE4M3GroupSize : 0);

// A group's scale as the multipliers are made from it: E8M0 scales stay
// bytes (their multipliers are exponent fields, integer arithmetic), the
// others are decoded to float.
template <int encoding>
using GroupScale = std::conditional_t<encoding == kScaleE8M0, uint32_t, float>;

template <int encoding>
__device__ __forceinline__ GroupScale<encoding> group_scale(
    typename ScaleStorage<encoding>::type stored) {
  if constexpr (encoding == kScaleE8M0) {
    return stored;
  } else {
    return decode_scale<encoding>(stored);
  }
}

template <int bits>
inline constexpr int kBfloat16FixupExponent =
    CodeLayout<__nv_bfloat16, bits>::fixup_exponent;

// Whether float16 x multiplies in float16 codes where its scales allow
// (params.h's qmv_half_codes), and whether a pair of x is one mma step.
template <typename T, int bits, int encoding>
inline constexpr bool kHalfCodes =
    qmv_half_codes(std::is_same_v<T, __half>, bits, encoding);
template <typename T, int bits, int encoding>
inline constexpr bool kOneXPart = qmv_one_x_part(
    std::is_same_v<T, __nv_bfloat16>,
    std::is_same_v<T, __half>,
    bits,
    encoding);

// A group's scale times its bfloat16 multiplier's power of two: where that
// product leaves bfloat16's range (a finite scale of 4 or more with E2M1
// codes) the fixup alone multiplies first and the scale second
// (`two_steps`).
template <int bits, int encoding>
__device__ __forceinline__ float scaled_fixup(float scale) {
  return scale *
         power_of_two(kMultiplierExponent<__nv_bfloat16, bits, encoding>);
}

// E4M3 scales (below 2^kE4M3ScaleExponentBound) times their scaled fixup
// stay in bfloat16's range: one step always.
template <int encoding>
inline constexpr bool kMayNeedTwoSteps = encoding != kScaleE4M3;
static_assert(
    kE4M3ScaleExponentBound + kBfloat16FixupExponent<4> - kE4M3ScaleShift <=
    FloatFormat<__nv_bfloat16>::bias);

template <int bits, int encoding, int w_parts = 1>
__device__ __forceinline__ bool needs_two_steps(GroupScale<encoding> scale) {
  if constexpr (!kMayNeedTwoSteps<encoding>) {
    return false;
  } else if constexpr (w_parts == 2) {
    // Also a scale that is not finite: two steps move the halves of W past
    // bfloat16's range into the low part (multiply_word).
    return fabsf(scaled_fixup<bits, encoding>(scale)) >=
               __uint_as_float(0x7F7F8000u) ||
           !isfinite(scale);
  } else if constexpr (encoding == kScaleE8M0) {
    // Past that byte the pair's exponent field leaves bfloat16's (byte 255,
    // +inf, too: two steps give the same inf or NaN).
    return scale > kE8M0LargestPairByte<kBfloat16FixupExponent<bits>>;
  } else {
    // Floats from halfway past bfloat16's largest value round to infinity.
    return fabsf(scaled_fixup<bits, encoding>(scale)) >=
               __uint_as_float(0x7F7F8000u) &&
           isfinite(scale);
  }
}

struct Multipliers {
  uint32_t first;
  uint32_t second;
  // W's low parts (kWParts): the last multiplier's low bfloat16 part (none
  // of a high part that is not finite).
  uint32_t low = 0;
};

// The first multiplier of a group in one step, a pair of H.
template <typename H, int bits, int encoding>
__device__ __forceinline__ uint32_t
one_step_multiplier(GroupScale<encoding> scale) {
  constexpr int exponent = kMultiplierExponent<H, bits, encoding>;
  if constexpr (encoding == kScaleE8M0) {
    return e8m0_pair<H, exponent>(scale);
  } else {
    return bits_of(
        splat<typename Pair<H>::type>(scale * power_of_two(exponent)));
  }
}

template <int bits, int encoding>
__device__ __forceinline__ Multipliers
two_step_multipliers(GroupScale<encoding> scale) {
  constexpr uint32_t kOne = 0x3F803F80u;
  if (!needs_two_steps<bits, encoding>(scale)) {
    return {one_step_multiplier<__nv_bfloat16, bits, encoding>(scale), kOne};
  }
  if constexpr (encoding == kScaleE8M0) {
    return {
        CodeLayout<__nv_bfloat16, bits>::fixup,
        e8m0_pair<__nv_bfloat16, 0>(scale)};
  } else {
    return {
        bits_of(__float2bfloat162_rn(
            power_of_two(kMultiplierExponent<__nv_bfloat16, bits, encoding>))),
        bits_of(__float2bfloat162_rn(scale))};
  }
}

// 0xFFFF in each half of a bfloat16 pair that is finite, 0 in the others.
__device__ __forceinline__ uint32_t finite_halves(uint32_t pair) {
  return __vcmpne2(pair & 0x7F807F80u, 0x7F807F80u);
}

// Two float values as the mma's bfloat16 high and low parts. A value whose
// high part is not finite (infinite, NaN, past bfloat16's largest) goes
// whole into the low part, its high part zero: the low part meets W's high
// part only, so a zero part of W (the low part of an exact product) never
// meets an infinity of x.
__device__ __forceinline__ void split_pair(
    float a, float b, uint32_t (&parts)[2]) {
  const uint32_t rounded = bits_of(__floats2bfloat162_rn(a, b));
  parts[0] = rounded & finite_halves(rounded);
  const Bf16Pair high = pair_from_bits<Bf16Pair>(parts[0]);
  parts[1] = bits_of(
      __floats2bfloat162_rn(a - __low2float(high), b - __high2float(high)));
}

// 16-bit x's values of codes p and p + 16 / bits of a word of codes (as
// decode_pair pairs the codes) as one word: `words` are x's words over the
// word's codes, as loaded.
template <int bits>
__device__ __forceinline__ uint32_t x_pair_word(const uint32_t* words, int p) {
  constexpr int stride = 16 / bits;
  return __byte_perm(
      words[p / 2], words[(p + stride) / 2], p % 2 ? 0x7632 : 0x5410);
}

// A 16-byte unit of 16-bit x in pair order: word p of each word of codes'
// words is its pair p (x_pair_word), so that x_pair reads it as it is.
template <int bits>
__device__ __forceinline__ uint4 paired_x_unit(uint4 unit) {
  constexpr int pairs = 16 / bits;
  const auto* words = reinterpret_cast<const uint32_t*>(&unit);
  uint4 paired;
  auto* to = reinterpret_cast<uint32_t*>(&paired);
#pragma unroll
  for (int first = 0; first < 4; first += pairs) {
#pragma unroll
    for (int p = 0; p < pairs; ++p) {
      to[first + p] = x_pair_word<bits>(words + first, p);
    }
  }
  return paired;
}

// Pair p of x's values of a word of codes (the values of codes p and p +
// 16 / bits, as decode_pair pairs the codes), as the mma's B halves of type
// H: `words` are x's 32-bit words over the word's codes, as loaded, or in
// pair order (`paired`: paired_x_unit's).
template <typename T, typename H, int bits, bool paired = false>
__device__ __forceinline__ void x_pair(
    const uint32_t* words, int p, uint32_t (&parts)[kXParts<T, H>]) {
  constexpr int stride = 16 / bits;
  static_assert(!paired || !std::is_same_v<T, float>);
  if constexpr (std::is_same_v<T, float>) {
    split_pair(
        __uint_as_float(words[p]), __uint_as_float(words[p + stride]), parts);
  } else {
    const uint32_t pair = paired ? words[p] : x_pair_word<bits>(words, p);
    if constexpr (std::is_same_v<T, H>) {
      parts[0] = pair;
    } else {
      const float2 v = __half22float2(pair_from_bits<__half2>(pair));
      split_pair(v.x, v.y, parts);
    }
  }
}

// The multipliers of W's two parts: the high part of `value` (the scale, or
// the scale times the fixup in one step) and the low part it leaves.
template <int bits, int encoding, bool two>
__device__ __forceinline__ Multipliers w_parts_multipliers(float scale) {
  constexpr uint32_t kOne = 0x3F803F80u;
  const float fixup =
      power_of_two(kMultiplierExponent<__nv_bfloat16, bits, encoding>);
  const float value = two ? scale : scale * fixup;
  const Bf16Pair high = __float2bfloat162_rn(value);
  const bool finite = isfinite(__low2float(high));
  return {
      two ? bits_of(__float2bfloat162_rn(fixup)) : bits_of(high),
      two ? bits_of(high) : kOne,
      finite ? bits_of(__float2bfloat162_rn(value - __low2float(high))) : 0u};
}

// The multipliers (pairs of H) of a group's code pairs for the `two`-step
// multiply (first only otherwise; two steps are bfloat16's), and for W's
// low parts where `w_parts`.
template <typename H, int bits, int encoding, bool two, int w_parts = 1>
__device__ __forceinline__ Multipliers
multipliers_for(GroupScale<encoding> scale) {
  if constexpr (w_parts == 2) {
    return w_parts_multipliers<bits, encoding, two>(scale);
  } else if constexpr (two) {
    return two_step_multipliers<bits, encoding>(scale);
  } else {
    return {one_step_multiplier<H, bits, encoding>(scale), 0};
  }
}

// The mma steps, in H, of one 32-bit word of codes of each of a lane's
// rows: codes[t][h] is tile t's row h's word, its pairs times
// multipliers[t][h] (both of them where `two`), and x_words[b] x's words
// over the same codes in x block b, as loaded or, where `x_paired`, in pair
// order. With W in two parts, the low part is the exact product (the code,
// or the code times the power of two of a first step, times the last
// multiplier) less its rounding, plus the code times the multiplier's low
// part; x's low part meets W's high part only. As x's (split_pair), a
// product past bfloat16's range (in two steps only) goes whole into W's
// low part, which meets x's high part only.
template <
    typename T,
    typename H,
    int bits,
    bool two,
    bool x_paired,
    int w_parts,
    int tiles,
    int x_blocks>
__device__ __forceinline__ void multiply_word(
    float (&sums)[tiles][x_blocks][4],
    const uint32_t (&codes)[tiles][2],
    const Multipliers (&multipliers)[tiles][2],
    const uint32_t* const (&x_words)[x_blocks]) {
  constexpr int steps_per_word = 32 / bits / 4;
#pragma unroll
  for (int s = 0; s < steps_per_word; ++s) {
    using P = typename Pair<H>::type;
    uint32_t b_parts[x_blocks][2][kXParts<T, H>];
#pragma unroll
    for (int b = 0; b < x_blocks; ++b) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        x_pair<T, H, bits, x_paired>(x_words[b], 2 * s + q, b_parts[b][q]);
      }
    }
#pragma unroll
    for (int t = 0; t < tiles; ++t) {
      uint32_t a[w_parts][4];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Multipliers& m = multipliers[t][h];
          const P code = pair_from_bits<P>(
              code_pair_bits<H, bits>(codes[t][h], 2 * s + q));
          P exact = code;
          P last = pair_from_bits<P>(m.first);
          if constexpr (two) {
            exact = __hmul2(code, last);
            last = pair_from_bits<P>(m.second);
          }
          const P pair = __hmul2(exact, last);
          a[0][2 * q + h] = bits_of(pair);
          if constexpr (w_parts == 2) {
            const uint32_t low = bits_of(__hfma2(
                exact,
                pair_from_bits<P>(m.low),
                __hfma2(exact, last, __hneg2(pair))));
            if constexpr (two) {
              const uint32_t finite = finite_halves(a[0][2 * q + h]);
              a[0][2 * q + h] &= finite;
              a[1][2 * q + h] = (low & finite) | (bits_of(pair) & ~finite);
            } else {
              a[1][2 * q + h] = low;
            }
          }
        }
      }
#pragma unroll
      for (int b = 0; b < x_blocks; ++b) {
#pragma unroll
        for (int part = 0; part < kXParts<T, H>; ++part) {
          const uint32_t b_fragment[2] = {
              b_parts[b][0][part], b_parts[b][1][part]};
#pragma unroll
          for (int w_part = 0; w_part + part < 2 && w_part < w_parts;
               ++w_part) {
            mma_step<H>(sums[t][b], a[w_part], b_fragment);
          }
        }
      }
    }
  }
}

// f(t, h, g) for group g of each of a lane's chunks: tile t's row h.
template <int tiles, int groups, typename F>
__device__ __forceinline__ void for_each_group(F&& f) {
#pragma unroll
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int g = 0; g < groups; ++g) {
        f(t, h, g);
      }
    }
  }
}

// The mma steps of a lane's 16-byte chunks of codes, codes[t][h] of tile
// t's row h (four words), whose groups' scales are `scales`: the scales are
// multiplied into the code pairs, in float16 where x is float16 and every
// lane's scales allow it (kHalfCodes: E4M3 scales always, E8M0 ones in
// their HalfWindow), else in bfloat16, in two steps where any lane of the
// warp needs them (`two_steps` is this lane's say). x_words(word, x_word)
// points x_word[b] at x's words over word `word`'s codes in x block b, so
// that a kernel can load them as it goes, in pair order where `x_paired`.
template <
    typename T,
    int bits,
    int encoding,
    bool x_paired = false,
    int tiles,
    int x_blocks,
    int groups,
    typename XWords>
__device__ __forceinline__ void multiply_chunk(
    float (&sums)[tiles][x_blocks][4],
    const uint4 (&codes)[tiles][2],
    const GroupScale<encoding> (&scales)[tiles][2][groups],
    bool two_steps,
    XWords&& x_words) {
  auto multiply = [&](auto code_type, auto two_steps_constant) {
    using H = typename decltype(code_type)::type;
    constexpr bool two = decltype(two_steps_constant)::value;
    constexpr int w_parts = kWParts<T, encoding>;
    Multipliers multipliers[tiles][2][groups];
    for_each_group<tiles, groups>([&](int t, int h, int g) {
      multipliers[t][h][g] =
          multipliers_for<H, bits, encoding, two, w_parts>(scales[t][h][g]);
    });
#pragma unroll
    for (int word = 0; word < 4; ++word) {
      uint32_t words[tiles][2];
      Multipliers word_multipliers[tiles][2];
#pragma unroll
      for (int t = 0; t < tiles; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          words[t][h] = reinterpret_cast<const uint32_t*>(&codes[t][h])[word];
          word_multipliers[t][h] = multipliers[t][h][word * groups / 4];
        }
      }
      const uint32_t* x_word[x_blocks];
      x_words(word, x_word);
      multiply_word<T, H, bits, two, x_paired, w_parts>(
          sums, words, word_multipliers, x_word);
    }
  };
  constexpr std::type_identity<__half> half_codes;
  if constexpr (kHalfCodes<T, bits, encoding> && encoding == kScaleE4M3) {
    multiply(half_codes, std::false_type{});
    return;
  } else if constexpr (kHalfCodes<T, bits, encoding>) {
    bool in_window = true;
    for_each_group<tiles, groups>([&](int t, int h, int g) {
      in_window &= e8m0_in_half_window<bits>(scales[t][h][g]);
    });
    if (__all_sync(0xFFFFFFFFu, in_window)) {
      multiply(half_codes, std::false_type{});
      return;
    }
  }
  constexpr std::type_identity<__nv_bfloat16> bfloat16_codes;
  if (kMayNeedTwoSteps<encoding> && __any_sync(0xFFFFFFFFu, two_steps)) {
    multiply(bfloat16_codes, std::true_type{});
  } else {
    multiply(bfloat16_codes, std::false_type{});
  }
}

// A block's share of a product: W rows [n0, n0 + tiles * 16) times x rows
// [m0, m0 + x_blocks * 8) over K range [k_begin, k_end); `rows` says where
// x's and y's rows are, M is their number, and the sums go to y, or to
// float32 partials with split K.
template <typename T, int encoding, typename Rows>
struct QmvShare {
  Operands<T, encoding> op;
  Rows rows;
  int M;
  int m0;
  int n0;
  int k_begin;
  int k_end;
  T* y;
  float* partials;
};

// fp_qmv_impl's shares after the first: none.
struct NoNextShare {
  template <typename Share>
  __device__ __forceinline__ bool operator()(Share&) const {
    return false;
  }
};

// The block's share `share`, then each share that next_share(share) gives
// while it returns true: every warp of the block calls it, taking every
// warps-th pass of the quads over K, and each share's sums end in y, in its
// partials, or in the sums of the other splits of its cluster
// (splits_in_cluster). A next share's first loads of W are in flight while
// the block adds up and stores the sums of the one before.
template <
    typename T,
    int bits,
    int encoding,
    int x_blocks,
    bool splits_in_cluster,
    int tiles,
    int warps,
    typename Rows = ContiguousRows,
    bool x_shared = false,
    int w_ahead = 1,
    typename NextShare = NoNextShare>
__device__ __forceinline__ void fp_qmv_impl(
    const QmmArgs& args,
    float* reduction,
    QmvShare<T, encoding, Rows> share,
    NextShare&& next_share = {}) {
  using S = typename ScaleStorage<encoding>::type;
  using Share = QmvShare<T, encoding, Rows>;
  static_assert(
      !x_shared || std::is_same_v<std::decay_t<NextShare>, NoNextShare>,
      "x is copied into shared memory for one share");
  constexpr int groups = kChunkGroups<bits, encoding>;
  constexpr int chunk_codes = 128 / bits;
  constexpr int word_codes = 32 / bits;
  constexpr int pass_codes = 4 * chunk_codes;
  // x's 32-bit words over a chunk and over a word of codes.
  constexpr int x_chunk_words = chunk_codes * int(sizeof(T)) / 4;
  constexpr int x_word_words = word_codes * int(sizeof(T)) / 4;

  const int N = args.N;
  const int K = args.K;
  const int warp = threadIdx.x / kWarpSize;
  const FragmentLane lane = fragment_lane(threadIdx.x % kWarpSize);
  const uint32_t row_chunks = K / chunk_codes;
  const uint32_t scales_per_row = K / args.group_size;
  // Group sizes are powers of two: a shift, not a division, per pass.
  const int group_shift = __ffs(args.group_size) - 1;

  // The share whose W is loaded: its passes (those whose every lane's
  // chunk lies before k_end take no predicate; past them, codes and x past
  // k_end are zeros), this lane's rows of W (rows past N read row 0: their
  // sums are never stored) as offsets from the matrix in vectors and in
  // scales, and this lane's row of x in each block of 8 (rows past M read
  // row 0, as those of W).
  int passes;
  int full_passes;
  uint32_t w_offsets[tiles][2];
  uint32_t scale_offsets[tiles][2];
  int64_t x_offsets[x_blocks];
  // x_shared: the block's rows of x over [k_begin, k_end), copied once into
  // shared memory after the reduction's floats (the registers that held x a
  // pass ahead then hold W further ahead).
  const int x_span = share.k_end - share.k_begin;
  T* const x_copy =
      x_shared ? reinterpret_cast<T*>(
                     reduction + qmv_shared_bytes(warps, tiles, x_blocks) / 4)
               : nullptr;
  auto begin_loads = [&](const Share& at) {
    const int span = at.k_end - at.k_begin;
    passes = at.op.valid ? (span + pass_codes - 1) / pass_codes : 0;
    full_passes = at.op.valid ? span / pass_codes : 0;
#pragma unroll
    for (int t = 0; t < tiles; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = at.n0 + t * kTileRows + h * 8 + lane.group;
        w_offsets[t][h] = n < N ? n * row_chunks : 0;
        scale_offsets[t][h] = n < N ? n * scales_per_row : 0;
      }
    }
#pragma unroll
    for (int b = 0; b < x_blocks; ++b) {
      const int m = at.m0 + b * kXBlockRows + lane.group;
      if constexpr (x_shared) {
        x_offsets[b] =
            m < at.M ? (m - at.m0) * x_span - at.k_begin : -at.k_begin;
      } else {
        x_offsets[b] = m < at.M ? at.rows.x(m) * K : 0;
      }
    }
  };

  // x's chunk of a pass, read by every block (from the caches, or from the
  // block's copy: x_shared): loaded with W's one pass ahead where the
  // registers allow and it was measured faster (two tiles, one x block of
  // 16-bit values, byte scales), else when the pass starts.
  constexpr bool x_ahead = !x_shared && tiles == 2 && x_blocks == 1 &&
                           sizeof(T) == 2 && sizeof(S) == 1;
  struct XChunk {
    uint32_t words[x_blocks][x_chunk_words];
  };
  struct NoXChunk {};
  auto load_x = [&](const Share& at, int k, bool in, XChunk& to) {
#pragma unroll
    for (int b = 0; b < x_blocks; ++b) {
      const T* base = x_shared ? x_copy : at.op.x;
      const auto* from =
          reinterpret_cast<const uint4*>(base + (in ? x_offsets[b] + k : 0));
#pragma unroll
      for (int v = 0; v < x_chunk_words / 4; ++v) {
        uint4 loaded{0, 0, 0, 0};
        if (in) {
          if constexpr (x_shared) {
            loaded = from[v];
          } else {
            loaded = __ldg(from + v);
          }
        }
        to.words[b][4 * v] = loaded.x;
        to.words[b][4 * v + 1] = loaded.y;
        to.words[b][4 * v + 2] = loaded.z;
        to.words[b][4 * v + 3] = loaded.w;
      }
    }
  };
  // A pass's codes and scales (as stored): loaded one pass ahead of the
  // multiplies, so that a warp's loads of W are in flight while it
  // computes.
  struct Pass {
    uint4 codes[tiles][2];
    S scales[tiles][2][groups];
    std::conditional_t<x_ahead, XChunk, NoXChunk> x;
  };
  // Pass `pass`'s loads of share `at`, whose begin_loads ran (none past its
  // last pass: a prefetch never used).
  auto load = [&](const Share& at, int pass, Pass& to) {
    const int k = at.k_begin + pass * pass_codes + lane.thread * chunk_codes;
    const auto* w_vectors = reinterpret_cast<const uint4*>(at.op.w);
    auto load_rows = [&](bool in) {
#pragma unroll
      for (int t = 0; t < tiles; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          to.codes[t][h] =
              in ? load_streaming(w_vectors + w_offsets[t][h] + k / chunk_codes)
                 : uint4{0, 0, 0, 0};
#pragma unroll
          for (int g = 0; g < groups; ++g) {
            const int group = (k + g * (chunk_codes / groups)) >> group_shift;
            to.scales[t][h][g] =
                in ? load_streaming(at.op.scales + scale_offsets[t][h] + group)
                   : S(0);
          }
        }
      }
      if constexpr (x_ahead) {
        load_x(at, k, in, to.x);
      }
    };
    if (pass < full_passes) {
      load_rows(true);
    } else if (pass < passes) {
      load_rows(k < at.k_end);
    }
  };
  // W's passes in flight: w_ahead of them a warp.
  Pass next[w_ahead];
  auto first_loads = [&](const Share& at) {
    begin_loads(at);
#pragma unroll
    for (int a = 0; a < w_ahead; ++a) {
      load(at, warp + a * warps, next[a]);
    }
  };

  first_loads(share);
  // The copy of x after W's first loads, which do not wait for it.
  if constexpr (x_shared) {
    const int rows_here = min(x_blocks * kXBlockRows, share.M - share.m0);
    const int row_vectors = x_span * int(sizeof(T)) / 16;
    for (int i = threadIdx.x; share.op.valid && i < rows_here * row_vectors;
         i += blockDim.x) {
      const int r = i / row_vectors;
      const int v = i % row_vectors;
      reinterpret_cast<uint4*>(x_copy + r * x_span)[v] = __ldg(
          reinterpret_cast<const uint4*>(
              share.op.x + share.rows.x(share.m0 + r) * K + share.k_begin) +
          v);
    }
    __syncthreads();
  }
  while (true) {
    float sums[tiles][x_blocks][4];
    fill_sums(sums, share.op.valid ? 0.0f : quiet_nan());
    for (int pass = warp; pass < passes; pass += warps) {
      const Pass current = next[0];
#pragma unroll
      for (int a = 0; a + 1 < w_ahead; ++a) {
        next[a] = next[a + 1];
      }
      load(share, pass + w_ahead * warps, next[w_ahead - 1]);
      const auto& codes = current.codes;
      XChunk x_now;
      if constexpr (x_ahead) {
        x_now = current.x;
      } else {
        const int k =
            share.k_begin + pass * pass_codes + lane.thread * chunk_codes;
        if (pass < full_passes) {
          load_x(share, k, true, x_now);
        } else {
          load_x(share, k, k < share.k_end, x_now);
        }
      }
      GroupScale<encoding> scales[tiles][2][groups];
      bool two_steps = false;
      for_each_group<tiles, groups>([&](int t, int h, int g) {
        scales[t][h][g] = group_scale<encoding>(current.scales[t][h][g]);
        two_steps |= needs_two_steps<bits, encoding, kWParts<T, encoding>>(
            scales[t][h][g]);
      });

      multiply_chunk<T, bits, encoding>(
          sums, codes, scales, two_steps, [&](int word, auto& x_word) {
#pragma unroll
            for (int b = 0; b < x_blocks; ++b) {
              x_word[b] = x_now.words[b] + word * x_word_words;
            }
          });
    }

    Share following;
    const bool more = next_share(following);
    if (more) {
      first_loads(following);
    }
    store_block_sums<warps>(
        sums,
        reduction,
        share.M,
        N,
        share.m0,
        share.n0,
        share.op.factor * power_of_two(scale_shift<encoding>()),
        share.y,
        share.partials,
        splits_in_cluster,
        share.rows,
        args.x_parts == 2);
    if (!more) {
      return;
    }
    share = following;
  }
}

// Blocks of `warps` warps of `tiles` tiles of W rows (qmv's narrow blocks
// by default).
template <
    typename T,
    int bits,
    int encoding,
    int x_blocks,
    bool splits_in_cluster,
    int warps = kQmvWarps,
    int tiles = qmv_tiles(kOneXPart<T, bits, encoding>),
    bool x_shared = false,
    int w_ahead = 1>
__device__ __forceinline__ void fp_qmv_grid(const QmmArgs& args) {
  extern __shared__ float4 shared_floats[];
  auto* reduction = reinterpret_cast<float*>(shared_floats);
  transposed_grid<T, bits, encoding, x_blocks>(
      args,
      tiles * kTileRows,
      [&](const auto& op,
          int m0,
          int n0,
          int k_begin,
          int k_end,
          T* y,
          float* partials) {
        fp_qmv_impl<
            T,
            bits,
            encoding,
            x_blocks,
            splits_in_cluster,
            tiles,
            warps,
            ContiguousRows,
            x_shared,
            w_ahead>(
            args,
            reduction,
            QmvShare<T, encoding, ContiguousRows>{
                op, {}, args.M, m0, n0, k_begin, k_end, y, partials});
      });
}

template <typename T, int bits, int encoding, int x_blocks>
__global__ void __launch_bounds__(
    kQmvWarps* kWarpSize,
    qmv_plain_min_blocks(
        kOneXPart<T, bits, encoding>, x_blocks, bits, sizeof(T)))
    fp_qmv(const QmmArgs args) {
  fp_qmv_grid<T, bits, encoding, x_blocks, false>(args);
}

// fp_qmv in wide blocks (one or kMaxXBlocks x blocks), where they half fill
// the GPU; with float scales x of one block may sit in shared memory
// (args.x_in_shared).
template <typename T, int bits, int encoding, int x_blocks>
__global__ void __launch_bounds__(kQmvWideWarps* kWarpSize, kQmvWideMinBlocks)
    fp_qmv_wide(const QmmArgs args) {
  constexpr bool may_share_x =
      x_blocks == 1 &&
      qmv_wide_may_share_x(
          sizeof(typename ScaleStorage<encoding>::type), sizeof(T));
  if constexpr (may_share_x) {
    if (args.x_in_shared) {
      fp_qmv_grid<
          T,
          bits,
          encoding,
          1,
          false,
          kQmvWideWarps,
          kQmvWideTiles,
          true,
          kQmvWideSharedXAhead>(args);
      return;
    }
  }
  fp_qmv_grid<T, bits, encoding, x_blocks, false, kQmvWideWarps, kQmvWideTiles>(
      args);
}

// Clusters need sm_90; the kernel of other architectures is never launched.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FPQMM_SPLITS_CLUSTER
#else
#define FPQMM_SPLITS_CLUSTER __cluster_dims__(1, kClusterSplits, 1)
#endif

// fp_qmv with K split over the blocks of a cluster (grid y), which add up
// their sums in distributed shared memory.
template <typename T, int bits, int encoding, int x_blocks>
__global__ void __launch_bounds__(
    kQmvWarps* kWarpSize,
    qmv_min_blocks(kOneXPart<T, bits, encoding>, x_blocks, bits))
    FPQMM_SPLITS_CLUSTER fp_qmv_cluster(const QmmArgs args) {
  fp_qmv_grid<T, bits, encoding, x_blocks, true>(args);
}

#undef FPQMM_SPLITS_CLUSTER

// Up to kBlockGroupMaxPairs pairs grouped by one warp, a pair a lane, into
// `runs` (each expert's lanes, or the bin past the experts, cut into runs of
// up to run_rows in the order of the bins' first lanes) and `order` (the
// pairs of a bin together); the run count goes to `run_count`.
__device__ __forceinline__ void group_pairs_in_warp(
    const QmmArgs& args, PairRun* runs, uint32_t* order, uint32_t* run_count) {
  constexpr uint32_t all = 0xFFFFFFFFu;
  const uint32_t lane = threadIdx.x % kWarpSize;
  const uint32_t run_rows = uint32_t(args.run_rows);
  const uint32_t bin = lane < args.batch_count ? min(args.rhs_indices[lane],
                                                     uint32_t(args.w_matrices))
                                               : ~0u;
  const uint32_t peers = __match_any_sync(all, bin);
  const uint32_t leader = __ffs(peers) - 1;
  const bool leads = bin != ~0u && leader == lane;
  const uint32_t pairs = leads ? __popc(peers) : 0;
  const uint32_t bin_runs = (pairs + run_rows - 1) / run_rows;
  // The leaders' pairs and runs before each lane (inclusive scans, minus its
  // own).
  uint32_t pairs_through = pairs;
  uint32_t runs_through = bin_runs;
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const uint32_t pairs_before = __shfl_up_sync(all, pairs_through, offset);
    const uint32_t runs_before = __shfl_up_sync(all, runs_through, offset);
    if (lane >= offset) {
      pairs_through += pairs_before;
      runs_through += runs_before;
    }
  }
  const uint32_t first_pair = __shfl_sync(all, pairs_through - pairs, leader);
  if (bin != ~0u) {
    order[first_pair + __popc(peers & ((1u << lane) - 1))] = lane;
  }
  const uint32_t first_run = runs_through - bin_runs;
  for (uint32_t r = 0; r < bin_runs; ++r) {
    runs[first_run + r] = PairRun{
        first_pair + r * run_rows, min(run_rows, pairs - r * run_rows), bin, 0};
  }
  if (lane == kWarpSize - 1) {
    *run_count = runs_through;
  }
}

// fp_qmv over the runs of fp_group_pairs (or, up to kBlockGroupMaxPairs
// pairs, of the block's own grouping): each share multiplies a run's rows
// of x (up to x_blocks * 8), gathered, by a tile of its expert's rows of W.
// The blocks run at once (the plan's grid), each taking every gridDim.x-th
// share, so that a share's first loads are in flight while the block
// stores the one before (the runs are few passes long).
template <typename T, int bits, int encoding, int x_blocks>
__global__ void __launch_bounds__(
    kQmvGroupedWarps* kWarpSize, qmv_grouped_min_blocks(x_blocks))
    fp_qmv_grouped(const QmmArgs args) {
  using Share = QmvShare<T, encoding, GatheredRows>;
  extern __shared__ float4 shared_floats[];
  auto* reduction = reinterpret_cast<float*>(shared_floats);
  // At most a run a pair.
  __shared__ PairRun block_runs[kBlockGroupMaxPairs];
  __shared__ uint32_t block_order[kBlockGroupMaxPairs];
  __shared__ uint32_t block_run_count;
  const bool grouped_here = args.pair_runs == nullptr;
  if (grouped_here) {
    if (threadIdx.x < kWarpSize) {
      group_pairs_in_warp(args, block_runs, block_order, &block_run_count);
    }
    __syncthreads();
  }
  const PairRun* runs = grouped_here ? block_runs : args.pair_runs;
  const uint32_t* order = grouped_here ? block_order : args.pair_order;
  const MatrixSizes sizes = matrix_sizes<bits>(args);
  const uint64_t row_blocks =
      (args.N + kQmvGroupedRowsPerBlock - 1) / kQmvGroupedRowsPerBlock;
  const uint64_t run_count = grouped_here ? block_run_count : *args.run_count;
  const uint64_t shares = run_count * row_blocks;
  uint64_t index = blockIdx.x;
  auto share_at = [&](uint64_t i) {
    const bool tile_major = args.tile_major_shares;
    const PairRun run = runs[tile_major ? i % run_count : i / row_blocks];
    const uint64_t tile = tile_major ? i / run_count : i % row_blocks;
    return Share{
        run_operands<T, encoding>(args, sizes, run),
        run_rows(args, order, run),
        int(run.count),
        0,
        int(tile) * kQmvGroupedRowsPerBlock,
        0,
        args.K,
        static_cast<T*>(args.y),
        nullptr};
  };
  if (index >= shares) {
    return;
  }
  fp_qmv_impl<
      T,
      bits,
      encoding,
      x_blocks,
      false,
      kQmvGroupedTiles,
      kQmvGroupedWarps,
      GatheredRows>(args, reduction, share_at(index), [&](Share& following) {
    index += gridDim.x;
    if (index >= shares) {
      return false;
    }
    following = share_at(index);
    return true;
  });
}

}  // namespace fpqmm::cuda
