// y = x @ W^T for many rows of bfloat16 x on Hopper's warpgroup MMA
// (sm_90a): W's codes decoded into the A registers with fp_qmv's bit
// operations and scale folding, x (B) read by the MMA from shared memory.
//
// The decode pairs codes p and p + 16 / bits of a 32-bit word (decode_pair),
// so the K order of the A fragments is not the natural one. x is therefore
// laid out once per product in that order by fp_wgmma_tile_x, as the
// shared-memory image of each (128 rows of x, stage) tile: one bulk copy
// per stage loads it, and the MMA reads plain K-major core matrices.
#pragma once

#include "backend/cuda/kernels/fp_qmm.cuh"
#include "backend/cuda/kernels/sm90.cuh"

namespace fpqmm::cuda {

// The natural code (within a stage) at position k (0..15) of wgmma step
// `step`: the A fragment of lane (g, t) holds k = 2t + h + 8q (h = 0, 1,
// the pair's halves; q = 0, 1, its two pairs of a row), which the lane
// decodes from its 16 bytes of the row: word step / steps_per_word, pair
// 2 (step % steps_per_word) + q, half h.
template <int bits>
__host__ __device__ constexpr int wgmma_natural_code(int step, int k) {
  constexpr int word_codes = 32 / bits;
  constexpr int steps_per_word = word_codes / 4;
  constexpr int lane_codes = wgmma_stage_codes(bits) / 4;
  return lane_codes * (k % 8 / 2) + word_codes * (step / steps_per_word) +
         2 * (step % steps_per_word) + k / 8 + word_codes / 2 * (k % 2);
}

// Unit u (8 values, 16 bytes) of a tile: x row 8 (u / (8 row_units)) + u % 8
// of the tile, 16-byte column u / 8 % row_units; core matrices (8 rows x one
// column) of 128 bytes, each 8 rows' core matrices in a row.
template <int bits>
struct WgmmaXTile {
  static constexpr int codes = wgmma_stage_codes(bits);
  static constexpr int row_units = codes / 8;
  static constexpr int units = kWgmmaXRows * row_units;
  static constexpr int bytes = wgmma_x_tile_bytes(bits);
  static constexpr int sbo = 8 * codes * 2;  // next 8 rows
  static constexpr int lbo = 128;            // next core matrix along K
};

// The bytes of a tile that hold its rows [0, rows): whole groups of 8 rows,
// which the tile lays out one after another. Only they are written, copied
// and read where fewer rows of x are left (a run of few pairs, a small M):
// the others would only feed outputs that are not stored. A block of
// x_rows rows starting at row r of a tile finds its rows at prefix(r).
template <int bits>
__host__ __device__ constexpr int wgmma_x_tile_prefix(
    int rows, int x_rows = kWgmmaXRows) {
  constexpr int group_bytes = WgmmaXTile<bits>::bytes / (kWgmmaXRows / 8);
  return ((rows < x_rows ? rows : x_rows) + 7) / 8 * group_bytes;
}

// The stages of K (the last one partial where K is not a multiple).
template <int bits>
__host__ __device__ constexpr int wgmma_stage_count(int K) {
  return (K + wgmma_stage_codes(bits) - 1) / wgmma_stage_codes(bits);
}

// One tile of x (K values a row, bfloat16) at `out`: the stage from code k0
// of the 128 rows that x_row(m) names (-1: a row of zeros), values past K
// zero, written for its first `count` rows (wgmma_x_tile_prefix). Every
// thread of the block calls it: the rows' values are read whole into shared
// memory, then each thread writes units in the tile's order.
template <int bits, typename XRow>
__device__ __forceinline__ void wgmma_tile_x_impl(
    const __nv_bfloat16* x,
    int K,
    int k0,
    int count,
    XRow&& x_row,
    uint4* out) {
  using Tile = WgmmaXTile<bits>;
  __shared__ uint4 rows[Tile::units];
  const int units = wgmma_x_tile_prefix<bits>(count) / 16;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const int64_t row = x_row(u / Tile::row_units);
    const int k = k0 + u % Tile::row_units * 8;
    rows[u] = row >= 0 && k < K
                  ? *reinterpret_cast<const uint4*>(x + row * K + k)
                  : uint4{0, 0, 0, 0};
  }
  __syncthreads();
  const auto* values = reinterpret_cast<const __nv_bfloat16*>(rows);
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const int row = 8 * (u / (8 * Tile::row_units)) + u % 8;
    const int column = u / 8 % Tile::row_units;
    alignas(16) __nv_bfloat16 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = values
          [row * Tile::codes +
           wgmma_natural_code<bits>(column / 2, 8 * (column % 2) + i)];
    }
    out[u] = *reinterpret_cast<const uint4*>(v);
  }
}

// x (M x K, row-contiguous) into args.x_tiles: tile (m block b, stage s) at
// (b * stage count + s) * bytes, rows past M zero; a block per tile.
template <int bits>
__global__ void __launch_bounds__(kWgmmaTileXThreads)
    fp_wgmma_tile_x(const QmmArgs args) {
  using Tile = WgmmaXTile<bits>;
  const int stage_count = wgmma_stage_count<bits>(args.K);
  const int m0 = blockIdx.x / stage_count * kWgmmaXRows;
  wgmma_tile_x_impl<bits>(
      static_cast<const __nv_bfloat16*>(args.x),
      args.K,
      blockIdx.x % stage_count * Tile::codes,
      args.M - m0,
      [&](int m) { return m0 + m < args.M ? int64_t(m0 + m) : int64_t(-1); },
      static_cast<uint4*>(args.x_tiles) + int64_t(blockIdx.x) * Tile::units);
}

// The grouped gather's x (pairs of one row) into args.x_tiles: run r's rows
// (fp_group_pairs's runs of up to 128 pairs), gathered, as the tiles of m
// block r; rows past the run's pairs, and pairs whose x index is out of
// range, zero. A block per tile (the grid's x loops past the runs' count).
template <int bits>
__global__ void __launch_bounds__(kWgmmaTileXThreads)
    fp_wgmma_tile_x_grouped(const QmmArgs args) {
  using Tile = WgmmaXTile<bits>;
  const int stage_count = wgmma_stage_count<bits>(args.K);
  const uint32_t runs = *args.run_count;
  for (int64_t tile = blockIdx.x; tile < int64_t(runs) * stage_count;
       tile += gridDim.x) {
    const PairRun run = args.pair_runs[tile / stage_count];
    wgmma_tile_x_impl<bits>(
        static_cast<const __nv_bfloat16*>(args.x),
        args.K,
        int(tile % stage_count) * Tile::codes,
        int(run.count),
        [&](int m) {
          const GatheredRows rows{
              args.pair_order + run.first,
              args.lhs_indices,
              args.lhs_divisor,
              uint32_t(args.x_matrices)};
          return m < int(run.count) && rows.valid(m) ? rows.x(m) : int64_t(-1);
        },
        static_cast<uint4*>(args.x_tiles) + tile * Tile::units);
    __syncthreads();
  }
}

// The wgmma steps whose A fragments a warpgroup decodes at once, then
// multiplies in one commit group while it decodes the next batch: half a
// stage for one tile of W (more independent decodes for the schedulers to
// interleave), one step for two tiles (whose registers the accumulators of
// 128 rows of x fill).
template <int bits>
__host__ __device__ constexpr int wgmma_batch_steps(int tiles) {
  return tiles == 1 ? wgmma_stage_codes(bits) / kStepCodes / 2 : 1;
}

// W rows [n0, n0 + wgmma_rows_per_block(tiles)) times x rows [m0, m0 +
// x_rows) of M (x's tiles: those of m block x_tile, from its row x_first,
// and of the next m block for the wide blocks)
// over K range [k_begin, k_end) (k_begin a multiple of the stage) of one
// product; every thread of the block calls it. `ring` counts the stages that
// earlier calls of the block passed through the shared-memory ring (the
// mbarriers' phases); `rows` says where y's rows are (and which are NaN).
template <
    int bits,
    int encoding,
    int tiles,
    int x_rows,
    bool x_parts = false,
    typename Rows = ContiguousRows>
__device__ __forceinline__ void fp_qmm_wgmma_impl(
    const QmmArgs& args,
    const Operands<__nv_bfloat16, encoding>& op,
    uint8_t* shared,
    int& ring,
    int64_t x_tile,
    int x_first,
    int M,
    int m0,
    int n0,
    int k_begin,
    int k_end,
    __nv_bfloat16* y,
    float* partials,
    const Rows& rows = {}) {
  using T = __nv_bfloat16;
  using S = typename ScaleStorage<encoding>::type;
  using Tile = WgmmaXTile<bits>;
  constexpr int codes = Tile::codes;
  constexpr int steps = codes / kStepCodes;
  constexpr int word_codes = 32 / bits;
  constexpr int steps_per_word = word_codes / 4;
  constexpr int lane_codes = codes / 4;
  constexpr int groups = kChunkGroups<bits, encoding>;
  constexpr int stages = wgmma_stages(bits, tiles, x_rows);
  constexpr int ahead = stages - 2;
  constexpr int block_rows = wgmma_rows_per_block(tiles);
  constexpr int stage_bytes = wgmma_stage_bytes(bits, tiles, x_rows);
  constexpr int x_bytes_max = wgmma_x_tile_bytes(bits, x_rows);
  constexpr int accumulators = x_rows / 2;
  // wgmma's N, and the x tiles that each decoded A multiplies in turn.
  constexpr int mma_rows = x_rows < kWgmmaXRows ? x_rows : kWgmmaXRows;
  constexpr int x_tile_count = x_rows / mma_rows;
  constexpr int batch = wgmma_batch_steps<bits>(tiles);
  static_assert(steps / batch % 2 == 0 && ahead >= 1);
  static_assert(block_rows * 4 % kWgmmaThreads == 0);
  static_assert(x_rows * wgmma_out_pitch(tiles) <= stages * stage_bytes);

  const int N = args.N;
  const int K = args.K;
  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / kWarpSize % 4;
  const FragmentLane lane = fragment_lane(threadIdx.x % kWarpSize);
  const int group_shift = __ffs(args.group_size) - 1;
  const int64_t w_row_bytes = int64_t(K) * bits / 8;
  const int64_t scales_per_row = K >> group_shift;
  const int first_stage = k_begin / codes;
  const int stage_count = op.valid ? (k_end - k_begin + codes - 1) / codes : 0;
  const auto* w_bytes = reinterpret_cast<const uint8_t*>(op.w);
  const int x_stage_count = wgmma_stage_count<bits>(K);
  const auto* x_tiles = static_cast<const uint8_t*>(args.x_tiles) +
                        x_tile * x_stage_count * Tile::bytes +
                        wgmma_x_tile_prefix<bits>(x_first);
  const uint32_t barriers = sm90::shared_address(shared + stages * stage_bytes);
  const uint32_t x_bytes = wgmma_x_tile_prefix<bits>(M - m0, x_rows);

  // This lane's W rows in the block: tile i, half h.
  auto w_row = [&](int i, int h) {
    return (warpgroup * tiles + i) * kWgmmaTileRows + warp * kTileRows + h * 8 +
           lane.group;
  };
  auto slot_of = [&](int s) { return (ring + s) % stages; };

  // This thread's 16-byte units of W in the block's rows: their bytes in the
  // first stage (stage s is s kWgmmaWRowBytes on), and their first code,
  // k_end for rows past N (never in).
  constexpr int units = block_rows * 4 / kWgmmaThreads;
  const uint8_t* w_unit[units];
  int unit_k[units];
#pragma unroll
  for (int c = 0; c < units; ++c) {
    const int u = threadIdx.x + c * kWgmmaThreads;
    const int n = n0 + u / 4;
    const int k = k_begin + u % 4 * lane_codes;
    unit_k[c] = n < N ? k : k_end;
    w_unit[c] = w_bytes + (n < N ? n * w_row_bytes + k * bits / 8 : 0);
  }

  // Stage s's x tiles (a bulk copy each, the wide blocks' second one after
  // the first in shared memory, where the MMA's rows 128 on are) and rows of
  // W (a 16-byte unit each per thread and copy, rows past N and codes past
  // k_end zero).
  auto issue = [&](int s) {
    const int slot = slot_of(s);
    uint8_t* at = shared + slot * stage_bytes;
    if (threadIdx.x == 0) {
      const uint32_t barrier = barriers + 8 * slot;
      sm90::barrier_expect(barrier, x_bytes);
#pragma unroll
      for (int t = 0; t < x_tile_count; ++t) {
        const int bytes = min(int(x_bytes) - t * Tile::bytes, Tile::bytes);
        if (bytes > 0) {
          sm90::bulk_copy(
              sm90::shared_address(at + t * Tile::bytes),
              x_tiles +
                  (t * int64_t(x_stage_count) + first_stage + s) * Tile::bytes,
              bytes,
              barrier);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < units; ++c) {
      const bool in = unit_k[c] + s * codes < k_end;
      copy_async<16>(
          at + x_bytes_max + 16 * (threadIdx.x + c * kWgmmaThreads),
          in ? w_unit[c] + s * kWgmmaWRowBytes : w_bytes,
          in ? 16 : 0);
    }
  };

  // The scales of this lane's codes of stage s, loaded a stage ahead; zero
  // past k_end, where the codes are zero (a lane's codes are all in or all
  // out: rows of W are whole 16-byte vectors).
  const S* scale_rows[tiles][2];
#pragma unroll
  for (int i = 0; i < tiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      scale_rows[i][h] =
          op.scales + min(n0 + w_row(i, h), N - 1) * scales_per_row;
    }
  }
  S stored[tiles][2][groups];
  auto load_scales = [&](int s) {
    const int k = k_begin + s * codes + lane.thread * lane_codes;
#pragma unroll
    for (int i = 0; i < tiles; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int g = 0; g < groups; ++g) {
          stored[i][h][g] =
              k < k_end
                  ? scale_rows[i][h]
                              [(k + g * lane_codes / groups) >> group_shift]
                  : S{};
        }
      }
    }
  };

  // Set by the first wgmma (accumulate false): defining them with other
  // instructions would make ptxas serialize the wgmmas (C7515). Batches of
  // steps alternate between the two halves of a.
  float acc[tiles][accumulators];
  uint32_t a[2][batch][tiles][4];

  load_scales(0);
#pragma unroll
  for (int s = 0; s < ahead; ++s) {
    if (s < stage_count) {
      issue(s);
    }
    commit_async();
  }
  for (int s = 0; s < stage_count; ++s) {
    wait_async<ahead - 1>();
    // Stage s's W has landed for every thread, and every warpgroup has at
    // most one batch (of at most half a stage) of stage s - 1 in flight,
    // hence is done with stage s - 2, whose slot the next copies fill.
    __syncthreads();
    if (s + ahead < stage_count) {
      issue(s + ahead);
    }
    commit_async();

    const int slot = slot_of(s);
    const uint8_t* at = shared + slot * stage_bytes;
    uint4 words[tiles][2];
    GroupScale<encoding> scales[tiles][2][groups];
    bool two = false;
#pragma unroll
    for (int i = 0; i < tiles; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        words[i][h] = *reinterpret_cast<const uint4*>(
            at + x_bytes_max + w_row(i, h) * kWgmmaWRowBytes +
            lane.thread * 16);
#pragma unroll
        for (int g = 0; g < groups; ++g) {
          scales[i][h][g] = group_scale<encoding>(stored[i][h][g]);
          two |= needs_two_steps<bits, encoding>(scales[i][h][g]);
        }
      }
    }
    if (s + 1 < stage_count) {
      load_scales(s + 1);
    }
    // The warp decodes in two multiplies where any of its lanes needs them
    // (warp-uniform; the wgmma stays outside the branch).
    two = kMayNeedTwoSteps<encoding> && __any_sync(0xFFFFFFFFu, two);
    Multipliers multipliers[tiles][2][groups];
    for_each_group<tiles, groups>([&](int i, int h, int g) {
      multipliers[i][h][g] =
          two ? multipliers_for<__nv_bfloat16, bits, encoding, true>(
                    scales[i][h][g])
              : multipliers_for<__nv_bfloat16, bits, encoding, false>(
                    scales[i][h][g]);
    });
    sm90::barrier_wait(barriers + 8 * slot, (ring + s) / stages % 2);
    const uint64_t descriptor =
        sm90::kmajor_descriptor(sm90::shared_address(at), Tile::lbo, Tile::sbo);

#pragma unroll
    for (int b = 0; b < steps / batch; ++b) {
      uint32_t(&ab)[batch][tiles][4] = a[b % 2];
      auto decode = [&](auto two_constant) {
        constexpr bool two_steps = decltype(two_constant)::value;
#pragma unroll
        for (int jb = 0; jb < batch; ++jb) {
          const int j = b * batch + jb;
          const int word = j / steps_per_word;
#pragma unroll
          for (int i = 0; i < tiles; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const Multipliers& m = multipliers[i][h][word * groups / 4];
              const uint32_t code_word =
                  reinterpret_cast<const uint32_t*>(&words[i][h])[word];
#pragma unroll
              for (int q = 0; q < 2; ++q) {
                Bf16Pair pair = __hmul2(
                    pair_from_bits<Bf16Pair>(code_pair_bits<T, bits>(
                        code_word, 2 * (j % steps_per_word) + q)),
                    pair_from_bits<Bf16Pair>(m.first));
                if constexpr (two_steps) {
                  pair = __hmul2(pair, pair_from_bits<Bf16Pair>(m.second));
                }
                ab[jb][i][2 * q + h] = bits_of(pair);
              }
            }
          }
        }
      };
      if (two) {
        decode(std::true_type{});
      } else {
        decode(std::false_type{});
      }
      // Step j's x: core-matrix columns 2j, 2j + 1 (256 bytes on), in x
      // tile t (its accumulators from t * mma_rows / 2 on).
      sm90::wgmma_fence();
#pragma unroll
      for (int jb = 0; jb < batch; ++jb) {
#pragma unroll
        for (int i = 0; i < tiles; ++i) {
#pragma unroll
          for (int t = 0; t < x_tile_count; ++t) {
            const int j = b * batch + jb;
            auto& tile_acc = *reinterpret_cast<float(*)[mma_rows / 2]>(
                &acc[i][t * mma_rows / 2]);
            sm90::fence_registers(acc[i]);
            sm90::wgmma_m64nk16<mma_rows>(
                tile_acc,
                ab[jb][i],
                descriptor + uint64_t(16 * j + t * (Tile::bytes >> 4)),
                s > 0 || j > 0);
            sm90::fence_registers(acc[i]);
          }
        }
      }
      sm90::wgmma_commit();
      // The batch before is done, and its A registers free. The last batch
      // waits for every wgmma: ptxas moved the epilogue's reads of the
      // accumulators above a wait that followed the loop.
      if (s == stage_count - 1 && b == steps / batch - 1) {
        sm90::wgmma_wait<0>();
      } else {
        sm90::wgmma_wait<1>();
      }
      // The next batch's registers stay allocated until the wait that
      // retires the wgmmas that read them.
#pragma unroll
      for (int jb = 0; jb < batch; ++jb) {
#pragma unroll
        for (int i = 0; i < tiles; ++i) {
          sm90::fence_registers(a[(b + 1) % 2][jb][i]);
        }
      }
    }
  }
  // (Done by the loop's last step; without it ptxas adds a wait of its own
  // for the epilogue, C7517, and schedules the loop differently.)
  sm90::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < tiles; ++i) {
    sm90::fence_registers(acc[i]);
  }
  wait_async<0>();
  ring += stage_count;
  __syncthreads();

  // Accumulator e of tile i: W row w_row(i, e % 4 / 2), x row e / 4 * 8 +
  // 2 t + e % 2 of the block (NaN where W's index was out of range).
  const float factor = op.factor * power_of_two(scale_shift<encoding>());
  auto total = [&](int i, int e) {
    return op.valid ? acc[i][e] * factor : quiet_nan();
  };
  if (partials) {
#pragma unroll
    for (int i = 0; i < tiles; ++i) {
#pragma unroll
      for (int e = 0; e < accumulators; ++e) {
        store_output(
            total(i, e),
            m0 + e / 4 * 8 + 2 * lane.thread + e % 2,
            n0 + w_row(i, e % 4 / 2),
            M,
            N,
            y,
            partials,
            rows);
      }
    }
    return;
  }
  // Through shared memory, for whole 16-byte units of y's rows (the plan
  // takes N a multiple of 8): y's values, or with x in parts (fp_split_x's
  // rows 2m and 2m + 1: accumulators e and e + 1 of a lane) the float32 sum
  // of each row's two, row m of y (of M / 2), which is float32 like x.
  constexpr int pitch = wgmma_out_pitch(tiles);
  constexpr int parts = x_parts ? 2 : 1;
  if constexpr (x_parts) {
    auto* out = reinterpret_cast<float*>(shared);
#pragma unroll
    for (int i = 0; i < tiles; ++i) {
#pragma unroll
      for (int e = 0; e < accumulators; e += 2) {
        out[(e / 4 * 4 + lane.thread) * (pitch / 2) + w_row(i, e % 4 / 2)] =
            total(i, e) + total(i, e + 1);
      }
    }
  } else {
    auto* out = reinterpret_cast<T*>(shared);
#pragma unroll
    for (int i = 0; i < tiles; ++i) {
#pragma unroll
      for (int e = 0; e < accumulators; ++e) {
        out[(e / 4 * 8 + 2 * lane.thread + e % 2) * (pitch / 2) +
            w_row(i, e % 4 / 2)] = static_cast<T>(total(i, e));
      }
    }
  }
  __syncthreads();
  // A unit: 8 values of y's 16-bit type, or 4 float32 sums of parts (whose
  // rows in shared memory are twice as long).
  constexpr int unit_values = 8 / parts;
  constexpr int value_bytes = 2 * parts;
  constexpr int row_units = block_rows / unit_values;
  const int y_m0 = m0 / parts;
  for (int u = threadIdx.x; u < x_rows / parts * row_units;
       u += kWgmmaThreads) {
    const int m = u / row_units;
    const int n = u % row_units * unit_values;
    if (y_m0 + m < M / parts && n0 + n < N) {
      const uint32_t nan = x_parts ? __float_as_uint(quiet_nan())
                                   : bits_of(__float2bfloat162_rn(quiet_nan()));
      const uint4 nans = {nan, nan, nan, nan};
      *reinterpret_cast<uint4*>(
          reinterpret_cast<uint8_t*>(y) +
          (rows.y(y_m0 + m) * N + n0 + n) * value_bytes) =
          rows.valid(y_m0 + m)
              ? *reinterpret_cast<const uint4*>(
                    shared + m * pitch * parts + n * value_bytes)
              : nans;
    }
  }
  // A block's next tile of the grid bulk-copies x over `out`.
  sm90::fence_proxy_async();
}

// The block's mbarriers (one a slot of the ring), before its first stage.
template <int bits, int tiles, int x_rows>
__device__ __forceinline__ void init_wgmma_barriers(uint8_t* shared) {
  constexpr int stages = wgmma_stages(bits, tiles, x_rows);
  if (threadIdx.x == 0) {
    const uint32_t barriers = sm90::shared_address(
        shared + stages * wgmma_stage_bytes(bits, tiles, x_rows));
    for (int slot = 0; slot < stages; ++slot) {
      sm90::barrier_init(barriers + 8 * slot, 1);
    }
    sm90::barrier_init_fence();
  }
  __syncthreads();
}

// x_parts: x is float32's bfloat16 parts (QmmArgs::x_parts), y float32.
template <int bits, int encoding, int tiles, int x_rows, bool x_parts = false>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    fp_qmm_wgmma(const QmmArgs args) {
#if FPQMM_SM90A
  extern __shared__ uint4 shared_words[];
  auto* shared = reinterpret_cast<uint8_t*>(shared_words);
  init_wgmma_barriers<bits, tiles, x_rows>(shared);
  int ring = 0;
  transposed_grid<__nv_bfloat16, bits, encoding, x_rows / kXBlockRows>(
      args,
      wgmma_rows_per_block(tiles),
      [&](const auto& op,
          int m0,
          int n0,
          int k_begin,
          int k_end,
          __nv_bfloat16* y,
          float* partials) {
        fp_qmm_wgmma_impl<bits, encoding, tiles, x_rows, x_parts>(
            args,
            op,
            shared,
            ring,
            m0 / kWgmmaXRows,
            m0 % kWgmmaXRows,
            args.M,
            m0,
            n0,
            k_begin,
            k_end,
            y,
            partials);
      });
#else
  // wgmma is sm_90a's: the plan takes this kernel only there.
  __trap();
#endif
}

// fp_qmm_wgmma over the runs of fp_group_pairs (grid y walks them), whose x
// fp_wgmma_tile_x_grouped has gathered into tiles: each block multiplies a
// run's rows of x by its expert's rows of W. (Blocks of 64 rows of x, in
// runs of up to 64 pairs, were measured slower at 64 pairs an expert: more
// experts take two runs.)
template <int bits, int encoding, int tiles>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    fp_qmm_wgmma_grouped(const QmmArgs args) {
#if FPQMM_SM90A
  extern __shared__ uint4 shared_words[];
  auto* shared = reinterpret_cast<uint8_t*>(shared_words);
  init_wgmma_barriers<bits, tiles, kWgmmaXRows>(shared);
  int ring = 0;
  const int n0 = blockIdx.x * wgmma_rows_per_block(tiles);
  grouped_runs<__nv_bfloat16, bits, encoding>(
      args,
      [&](const auto& op, const GatheredRows& rows, int count, uint32_t run) {
        fp_qmm_wgmma_impl<bits, encoding, tiles, kWgmmaXRows>(
            args,
            op,
            shared,
            ring,
            run,
            0,
            count,
            0,
            n0,
            0,
            args.K,
            static_cast<__nv_bfloat16*>(args.y),
            nullptr,
            rows);
      });
#else
  __trap();
#endif
}

}  // namespace fpqmm::cuda
