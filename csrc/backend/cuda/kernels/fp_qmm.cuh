// y = x @ W^T above the decode range, and the grouped gather's runs: W (N, K)
// grouped along K, in block tiles on the tensor cores. The block's rows of
// W (codes and scales) and of x go through a ring of shared-memory stages
// filled by cp.async, so that several stages of loads are in flight without
// holding registers; each warp decodes its rows of W once a stage and
// multiplies them with every row of x of the block. The mma steps, the
// order of K within them and the scales multiplied into the bfloat16 code
// pairs are fp_qmv's (fp_qmv.cuh).
#pragma once

#include <utility>

#include "backend/cuda/kernels/fp_qmv.cuh"

namespace fpqmm::cuda {

// One stage in shared memory: the block's rows of W (codes: the two 64-byte
// rows that a quarter warp reads together fill the 32 banks), the 4-byte
// words that hold their scales, then the block's rows of x, whose 16-byte
// units are placed so that the lanes of a quarter warp read distinct banks
// (and put in pair order, paired_x_unit, once they have landed).
template <typename T, int bits, int encoding, int x_blocks>
struct QmmStage {
  using S = typename ScaleStorage<encoding>::type;
  static constexpr int codes = qmm_stage_codes(bits);
  static constexpr int w_row_units = kQmmWRowBytes / 16;
  static constexpr int scale_words = qmm_scale_words(bits, sizeof(S));
  static constexpr int scales_offset = kQmmRowsPerBlock * kQmmWRowBytes;
  static constexpr int x_offset =
      scales_offset + kQmmRowsPerBlock * scale_words * 4;
  static constexpr int x_row_bytes = qmm_x_row_bytes(bits, sizeof(T));
  static constexpr int x_row_units = x_row_bytes / 16;
  static constexpr int bytes = x_offset + x_blocks * kXBlockRows * x_row_bytes;
  static_assert(bytes == qmm_stage_bytes(bits, sizeof(T), sizeof(S), x_blocks));
  // A lane's 16 bytes of codes (a chunk) cover this many units of x: 4 for
  // E2M1, 2 for E4M3.
  static constexpr int x_chunk_units = 128 / bits * int(sizeof(T)) / 16;

  // Lane (row r, thread t) reads unit t * x_chunk_units + v; the units of a
  // 128-byte line are permuted by the line and the row's parity, so that
  // rows r, r + 1 and threads 0..3 read eight distinct 16-byte banks.
  __device__ static int x_unit(int row, int unit) {
    constexpr int half = x_chunk_units / 2;
    return unit ^ (((unit >> 3) & (half - 1)) | ((row & 1) * half));
  }
};

// `bytes` (0 to size) of the `size` bytes at `global` (aligned to them) to
// shared memory, the rest zero-filled: 16 bytes past L1, 4 through it.
template <int size>
__device__ __forceinline__ void copy_async(
    void* shared, const void* global, int bytes) {
  const auto to = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  if constexpr (size == 16) {
    asm volatile(
        "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to),
        "l"(global),
        "r"(bytes));
  } else {
    static_assert(size == 4);
    asm volatile(
        "cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to),
        "l"(global),
        "r"(bytes));
  }
}

__device__ __forceinline__ void commit_async() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int pending>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// W rows [n0, n0 + kQmmRowsPerBlock) times the M rows of x from m0 (up to
// x_blocks * 8) over K range [k_begin, k_end) of one product; every thread of
// the block calls it, and the sums go to y, or to float32 partials with
// split K. `rows` says where x's and y's rows are. W, x and the scales are
// 16-, 16- and 4-byte aligned, rows of W whole 16-byte vectors (the plan's
// rules). Every block of 8 rows of x is multiplied, those past M too (zeros,
// their sums never stored): testing each against M cost more instructions
// and registers than their mma steps. The ring has `stages` slots of this
// x_blocks' stages (fewer blocks than the kernel's fit its kernel's ring).
template <
    typename T,
    int bits,
    int encoding,
    int x_blocks,
    int stages = qmm_stages(bits, x_blocks),
    bool x_parts = false,
    typename Rows = ContiguousRows>
__device__ __forceinline__ void fp_qmm_impl(
    const QmmArgs& args,
    const Operands<T, encoding>& op,
    uint8_t* shared,
    int M,
    int m0,
    int n0,
    int k_begin,
    int k_end,
    T* y,
    float* partials,
    const Rows& rows = {}) {
  using Stage = QmmStage<T, bits, encoding, x_blocks>;
  using S = typename Stage::S;
  constexpr int tiles = kQmmTilesPerWarp;
  constexpr int groups = kChunkGroups<bits, encoding>;
  constexpr int chunk_codes = 128 / bits;
  constexpr int word_codes = 32 / bits;
  constexpr int x_word_words = word_codes * int(sizeof(T)) / 4;
  constexpr int words_per_unit = 4 / x_word_words;
  constexpr int unit_codes = 16 / int(sizeof(T));

  const int N = args.N;
  const int K = args.K;
  const int warp = threadIdx.x / kWarpSize;
  const FragmentLane lane = fragment_lane(threadIdx.x % kWarpSize);
  const int group_shift = __ffs(args.group_size) - 1;
  const int64_t w_row_bytes = int64_t(K) * bits / 8;
  const int64_t scales_per_row = K >> group_shift;
  const int stage_count =
      op.valid ? (k_end - k_begin + Stage::codes - 1) / Stage::codes : 0;
  const auto* w_bytes = reinterpret_cast<const uint8_t*>(op.w);
  const auto* scale_bytes = reinterpret_cast<const uint8_t*>(op.scales);

  // The copies of this thread: one unit of a row of W and of x each, every
  // so many rows, and words of the rows' scales. Each copy's source moves
  // along its row by a stage a stage (W's by kQmmWRowBytes, x's by
  // Stage::codes values), so the sources are kept as they are at k_begin.
  constexpr int w_row_step = kQmmThreads / Stage::w_row_units;
  constexpr int w_copies = kQmmRowsPerBlock / w_row_step;
  const int w_unit_index = threadIdx.x % Stage::w_row_units;
  const int w_first_row = threadIdx.x / Stage::w_row_units;
  const int w_first_k = k_begin + w_unit_index * (128 / bits);
  const int w_rows_left = N - n0 - w_first_row;
  const int64_t w_first =
      (n0 + w_first_row) * w_row_bytes + int64_t(w_first_k) * bits / 8;
  const int64_t w_copy_step = w_row_step * w_row_bytes;
  constexpr int x_row_step = kQmmThreads / Stage::x_row_units;
  constexpr int x_copies =
      (x_blocks * kXBlockRows + x_row_step - 1) / x_row_step;
  const int x_unit_index = threadIdx.x % Stage::x_row_units;
  const int x_first_row = threadIdx.x / Stage::x_row_units;
  const int x_first_k = k_begin + x_unit_index * unit_codes;
  // Whether copy c of this thread is a row of the stage (x_blocks * 8 rows
  // need not be a whole number of steps).
  auto x_copy_in_stage = [&](int c) {
    return (x_blocks * kXBlockRows) % x_row_step == 0 ||
           x_first_row + c * x_row_step < x_blocks * kXBlockRows;
  };
  const T* x_first[x_copies];
  bool x_row_in[x_copies];
#pragma unroll
  for (int c = 0; c < x_copies; ++c) {
    const int m = m0 + x_first_row + c * x_row_step;
    x_row_in[c] = m < M && x_copy_in_stage(c);
    x_first[c] = x_row_in[c] ? op.x + rows.x(m) * K + x_first_k : op.x;
  }
  constexpr int scale_copies =
      (kQmmRowsPerBlock * Stage::scale_words + kQmmThreads - 1) / kQmmThreads;
  // Scale copy c: word `word` of block row index / scale_words, whose scales
  // start at scale_rows[c] (-1 past N, or past the block's rows).
  int64_t scale_rows[scale_copies];
#pragma unroll
  for (int c = 0; c < scale_copies; ++c) {
    const int index = threadIdx.x + c * kQmmThreads;
    const int row = index / Stage::scale_words;
    scale_rows[c] = row < kQmmRowsPerBlock && n0 + row < N
                        ? (n0 + row) * scales_per_row * int64_t(sizeof(S))
                        : -1;
  }

  // Where this thread's copy c of a unit of x goes in a stage's slot.
  auto x_copy_at = [&](uint8_t* slot, int c) {
    const int row = x_first_row + c * x_row_step;
    return slot + Stage::x_offset + row * Stage::x_row_bytes +
           Stage::x_unit(row, x_unit_index) * 16;
  };

  auto issue = [&](int stage) {
    const int k0 = k_begin + stage * Stage::codes;
    uint8_t* slot = shared + stage % stages * Stage::bytes;
    const bool w_k_in = w_first_k + stage * Stage::codes < k_end;
    const int64_t w_stage = w_first + int64_t(stage) * kQmmWRowBytes;
#pragma unroll
    for (int c = 0; c < w_copies; ++c) {
      const bool in = w_k_in && c * w_row_step < w_rows_left;
      copy_async<16>(
          slot + (w_first_row + c * w_row_step) * kQmmWRowBytes +
              w_unit_index * 16,
          in ? w_bytes + w_stage + c * w_copy_step : w_bytes,
          in ? 16 : 0);
    }
    const bool x_k_in = x_first_k + stage * Stage::codes < k_end;
#pragma unroll
    for (int c = 0; c < x_copies; ++c) {
      const bool in = x_row_in[c] && x_k_in;
      if (x_copy_in_stage(c)) {
        copy_async<16>(
            x_copy_at(slot, c),
            in ? x_first[c] + stage * Stage::codes : op.x,
            in ? 16 : 0);
      }
    }
    // The words over each row's groups of the stage, bytes past them (the
    // next row's, or past K) zero-filled.
    const int first_group = k0 >> group_shift;
    const int end_group =
        ((min(k0 + Stage::codes, k_end) - 1) >> group_shift) + 1;
    const int group_bytes = (end_group - first_group) * int(sizeof(S));
#pragma unroll
    for (int c = 0; c < scale_copies; ++c) {
      const int index = threadIdx.x + c * kQmmThreads;
      const int word = index % Stage::scale_words;
      if ((kQmmRowsPerBlock * Stage::scale_words) % kQmmThreads == 0 ||
          index < kQmmRowsPerBlock * Stage::scale_words) {
        const uintptr_t begin = reinterpret_cast<uintptr_t>(scale_bytes) +
                                scale_rows[c] + first_group * int(sizeof(S));
        const int lead = int(begin & 3);
        const int bytes = scale_rows[c] < 0
                              ? 0
                              : max(0, min(4, group_bytes + lead - 4 * word));
        copy_async<4>(
            slot + Stage::scales_offset + index * 4,
            bytes > 0 ? reinterpret_cast<const void*>(
                            (begin & ~uintptr_t(3)) + 4 * word)
                      : static_cast<const void*>(args.scales),
            bytes);
      }
    }
  };

  float sums[tiles][x_blocks][4];
  fill_sums(sums, op.valid ? 0.0f : quiet_nan());

  // This lane's rows of W in the block, and where their scales start in
  // their first word.
  int w_rows[tiles][2];
  int scale_leads[tiles][2];
#pragma unroll
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w_rows[t][h] = (warp * tiles + t) * kTileRows + h * 8 + lane.group;
      scale_leads[t][h] =
          int(reinterpret_cast<uintptr_t>(
                  scale_bytes +
                  (n0 + w_rows[t][h]) * scales_per_row * int64_t(sizeof(S))) &
              3);
    }
  }

  // This lane's scale of group g of tile t's row h in the slot of the stage
  // from k0. A row's words start at its first scale's word, `scale_leads`
  // bytes before it. Where the encoding fixes the group size, which divides
  // a stage (and k_begin, a whole number of stages), a lane's groups are the
  // same in every stage and its rows (8 apart) share their lead.
  constexpr int fixed_group = kEncodingGroupSize<encoding>;
  auto scale_of = [&](const uint8_t* slot, int k0, int t, int h, int g) {
    const int lane_code =
        lane.thread * chunk_codes + g * (chunk_codes / groups);
    int at;
    if constexpr (fixed_group > 0) {
      static_assert(Stage::codes % fixed_group == 0);
      at = ((scale_leads[0][0] + int(unsigned(k0) / fixed_group * sizeof(S))) &
            3) +
           lane_code / fixed_group * int(sizeof(S));
    } else {
      const int first_group = k0 >> group_shift;
      at = ((scale_leads[t][h] + first_group * int(sizeof(S))) & 3) +
           (((k0 + lane_code) >> group_shift) - first_group) * int(sizeof(S));
    }
    return group_scale<encoding>(*reinterpret_cast<const S*>(
        slot + Stage::scales_offset + w_rows[t][h] * Stage::scale_words * 4 +
        at));
  };

  auto compute = [&](const uint8_t* slot, int k0) {
    uint4 codes[tiles][2];
    GroupScale<encoding> scales[tiles][2][groups];
    bool two_steps = false;
#pragma unroll
    for (int t = 0; t < tiles; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = w_rows[t][h];
        codes[t][h] = *reinterpret_cast<const uint4*>(
            slot + row * kQmmWRowBytes + lane.thread * 16);
#pragma unroll
        for (int g = 0; g < groups; ++g) {
          scales[t][h][g] = scale_of(slot, k0, t, h, g);
          two_steps |= needs_two_steps<bits, encoding>(scales[t][h][g]);
        }
      }
    }
    uint4 x_units[x_blocks];
    multiply_chunk<T, bits, encoding, true>(
        sums, codes, scales, two_steps, [&](int word, auto& x_word) {
          const int unit = word / words_per_unit;
#pragma unroll
          for (int b = 0; b < x_blocks; ++b) {
            if (word % words_per_unit == 0) {
              const int row = b * kXBlockRows + lane.group;
              x_units[b] = *reinterpret_cast<const uint4*>(
                  slot + Stage::x_offset + row * Stage::x_row_bytes +
                  Stage::x_unit(
                      row, lane.thread * Stage::x_chunk_units + unit) *
                      16);
            }
            x_word[b] = reinterpret_cast<const uint32_t*>(&x_units[b]) +
                        word % words_per_unit * x_word_words;
          }
        });
  };

#pragma unroll
  for (int s = 0; s < stages - 1; ++s) {
    if (s < stage_count) {
      issue(s);
    }
    commit_async();
  }
  for (int s = 0; s < stage_count; ++s) {
    wait_async<stages - 2>();
    // This thread's units of x of stage s have landed: in pair order once,
    // for every warp that reads them.
    uint8_t* slot = shared + s % stages * Stage::bytes;
#pragma unroll
    for (int c = 0; c < x_copies; ++c) {
      if (x_copy_in_stage(c)) {
        auto* unit = reinterpret_cast<uint4*>(x_copy_at(slot, c));
        *unit = paired_x_unit<bits>(*unit);
      }
    }
    // Stage s has landed for every thread, and every warp is done with
    // stage s - 1, whose slot the next copies fill.
    __syncthreads();
    if (s + stages - 1 < stage_count) {
      issue(s + stages - 1);
    }
    commit_async();
    compute(slot, k_begin + s * Stage::codes);
  }
  wait_async<0>();

  const float factor = op.factor * power_of_two(scale_shift<encoding>());
  // x in parts (fp_split_x's rows 2m and 2m + 1: sums i and i + 1 of a lane)
  // straight into row m of y (of M / 2), float32 like x; into partials, the
  // reduction adds them.
#pragma unroll
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int b = 0; b < x_blocks; ++b) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m0 + b * kXBlockRows + 2 * lane.thread + i % 2;
        const int n = n0 + w_rows[t][i / 2];
        if (!x_parts || partials) {
          store_output(
              sums[t][b][i] * factor, m, n, M, args.N, y, partials, rows);
        } else if (i % 2 == 0) {
          store_output(
              (sums[t][b][i] + sums[t][b][i + 1]) * factor,
              m / 2,
              n,
              M / 2,
              args.N,
              reinterpret_cast<float*>(y),
              partials,
              rows);
        }
      }
    }
  }
}

// x_parts: x is float32's bfloat16 parts (QmmArgs::x_parts), y float32.
template <
    typename T,
    int bits,
    int encoding,
    int x_blocks,
    bool x_parts = false>
__global__ void __launch_bounds__(kQmmThreads, qmm_min_blocks(x_blocks))
    fp_qmm(const QmmArgs args) {
  extern __shared__ uint4 shared_words[];
  auto* shared = reinterpret_cast<uint8_t*>(shared_words);
  transposed_grid<T, bits, encoding, x_blocks>(
      args,
      kQmmRowsPerBlock,
      [&](const auto& op,
          int m0,
          int n0,
          int k_begin,
          int k_end,
          T* y,
          float* partials) {
        fp_qmm_impl<
            T,
            bits,
            encoding,
            x_blocks,
            qmm_stages(bits, x_blocks),
            x_parts>(
            args, op, shared, args.M, m0, n0, k_begin, k_end, y, partials);
      });
}

// f(blocks) for the blocks of 8 rows that `rows` rows of x fill, as a
// constant (one instantiation each): a multiple of x_blocks / 4 up to
// x_blocks (rows <= x_blocks * 8).
template <int x_blocks, typename F>
__device__ __forceinline__ void with_live_blocks(int rows, F&& f) {
  constexpr int step = x_blocks / 4;
  const int steps = (rows + step * kXBlockRows - 1) / (step * kXBlockRows);
  [&]<int... i>(std::integer_sequence<int, i...>) {
    ((steps == i + 1 ? f(std::integral_constant<int, (i + 1) * step>{})
                     : void()),
     ...);
  }(std::make_integer_sequence<int, 4>{});
}

// fp_qmm over the runs of fp_group_pairs (grid y walks them): each block
// multiplies a run's rows of x, gathered, by its expert's rows of W, in the
// blocks of 8 rows that the run fills: a run of 16 in a kernel of 32 rows
// copies and multiplies 16 (in as many slots as the kernel's ring).
template <typename T, int bits, int encoding, int x_blocks>
__global__ void __launch_bounds__(kQmmThreads, qmm_min_blocks(x_blocks))
    fp_qmm_grouped(const QmmArgs args) {
  extern __shared__ uint4 shared_words[];
  auto* shared = reinterpret_cast<uint8_t*>(shared_words);
  const int n0 = blockIdx.x * kQmmRowsPerBlock;
  grouped_runs<T, bits, encoding>(
      args, [&](const auto& op, const GatheredRows& rows, int count, uint32_t) {
        with_live_blocks<x_blocks>(count, [&](auto live_blocks) {
          fp_qmm_impl<
              T,
              bits,
              encoding,
              live_blocks,
              qmm_stages(bits, x_blocks)>(
              args,
              op,
              shared,
              count,
              0,
              n0,
              0,
              args.K,
              static_cast<T*>(args.y),
              nullptr,
              rows);
        });
      });
}

}  // namespace fpqmm::cuda
