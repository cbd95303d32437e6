// The contract between the CUDA kernels and the host plan (backend/cuda/
// plan.cpp): tile geometry and the one argument struct every kernel takes.
// Plain C++ as well as CUDA, so that the plan is built and tested without
// CUDA headers.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "common/scale_encoding.h"

namespace fpqmm::cuda {

inline constexpr int kWarpSize = 32;

// Batch axes the kernels walk (the plan folds contiguous axes first).
inline constexpr int kMaxBatchDims = 6;

// The mma.sync m16n8k16 steps of the transposed kernels take W as the A
// operand (16 rows of W per tile) and x as B (8 rows of x per block).
inline constexpr int kTileRows = 16;
inline constexpr int kXBlockRows = 8;  // the N of one mma step
inline constexpr int kMaxXBlocks = 2;  // rows of x per pass: 16
// fp_qmv and fp_qmv_cluster also take 32 rows of x a pass: the simple
// path's blocks for x of one part (plan.cpp, simple_x_blocks).
inline constexpr int kSimpleXBlocks = 4;

// qmv (x @ W^T, W (N, K) grouped along K), fed from device memory straight
// into registers: each lane loads 16 bytes of each of its two rows of a
// tile, a pass of the lanes over K, one pass ahead; a warp owns qmv_tiles
// tiles (two where x's values, converted to bfloat16 high and low parts,
// serve two tiles: !one_x_part), and the kQmvWarps warps of a block take turns
// over the passes and add up in shared memory. qmv_min_blocks blocks per
// SM (fp_qmv: qmv_plain_min_blocks; the registers of a thread follow: 64 for
// E2M1 codes with bfloat16 x). Rows of W must be whole 16-byte vectors (K *
// bits a multiple of 128).
inline constexpr int kQmvWarps = 8;
// float16 x with E8M0 scales, or E4M3 scales of E2M1 codes (the MLX
// formats), multiplies in float16 codes (fp_decode.cuh's HalfWindow), x as
// it is.
constexpr bool qmv_half_codes(bool float16_x, int bits, int encoding) {
  return float16_x &&
         (encoding == kScaleE8M0 || (encoding == kScaleE4M3 && bits == 4));
}
// Whether a pair of x values is one mma step: bfloat16 x and float16 x in
// float16 codes; other x is split into two parts.
constexpr bool qmv_one_x_part(
    bool bfloat16_x, bool float16_x, int bits, int encoding) {
  return bfloat16_x || qmv_half_codes(float16_x, bits, encoding);
}
constexpr int qmv_tiles(bool one_x_part) {
  return one_x_part ? 1 : 2;
}
constexpr int qmv_rows_per_block(bool one_x_part) {
  return kTileRows * qmv_tiles(one_x_part);
}
// The blocks an SM that the split of K counts as running at once: the
// kernel's own but for E2M1, whose threshold was measured at 3 (4096 x 4096,
// 256 blocks, is faster unsplit).
constexpr int qmv_split_resident(bool one_x_part, int x_blocks) {
  return one_x_part && x_blocks == 1 ? 3 : 2;
}
constexpr int qmv_min_blocks(bool one_x_part, int x_blocks, int bits) {
  return bits == 4 && one_x_part && x_blocks == 1
             ? 4
             : qmv_split_resident(one_x_part, x_blocks);
}
// fp_qmv (not fp_qmv_cluster) with float32 x in two x blocks of E2M1 codes:
// one block an SM, with the registers it asks for (248 with float scales;
// held to 128 for two they spilled up to 284 bytes). E4M3's two blocks spill
// a tenth of that and lose more by running one.
constexpr bool qmv_one_block_an_sm(int x_itemsize, int x_blocks, int bits) {
  return x_itemsize == 4 && x_blocks == 2 && bits == 4;
}
constexpr int qmv_plain_min_blocks(
    bool one_x_part, int x_blocks, int bits, int x_itemsize) {
  return qmv_one_block_an_sm(x_itemsize, x_blocks, bits)
             ? 1
             : qmv_min_blocks(one_x_part, x_blocks, bits);
}
constexpr int qmv_pass_codes(int bits) {
  return 4 * 128 / bits;  // a quad of lanes, 16 bytes each
}
// The warps' partial sums at the end (of `warps` warps of `tiles` tiles).
constexpr int qmv_shared_bytes(int warps, int tiles, int x_blocks) {
  return warps * tiles * x_blocks * 4 * kWarpSize * 4;
}
constexpr int qmv_shared_bytes(bool one_x_part, int x_blocks) {
  return qmv_shared_bytes(kQmvWarps, qmv_tiles(one_x_part), x_blocks);
}
// fp_qmv_wide: qmv in wide blocks, kQmvWideWarps warps of kQmvWideTiles
// tiles for every x type (one or two x blocks), kQmvWideMinBlocks an SM. Fewer,
// longer-lived warps with two tiles' loads in flight are faster where these
// blocks half fill the GPU; where they would not, the narrow blocks (twice
// as many with bfloat16 x) or split K are.
inline constexpr int kQmvWideWarps = 4;
inline constexpr int kQmvWideTiles = 2;
inline constexpr int kQmvWideMinBlocks = 4;
inline constexpr int kQmvWideRowsPerBlock = kTileRows * kQmvWideTiles;
// With float scales, whose registers leave none for x a pass ahead,
// fp_qmv_wide copies its rows of 16-bit x into shared memory where they take
// at most kQmvWideMaxXBytes (QmmArgs::x_in_shared, the plan's choice on
// sm_90, whose 4 blocks an SM that leaves room for) and holds W
// kQmvWideSharedXAhead passes ahead in the registers that frees: measured
// faster for those scales only (docs/cuda-log.md, "Eighth session of
// 2026-12-05"). float32 x is not copied (measured for 16-bit x only).
constexpr bool qmv_wide_may_share_x(int scale_itemsize, int x_itemsize) {
  return scale_itemsize != 1 && x_itemsize == 2;
}
inline constexpr int kQmvWideMaxXBytes = 32 << 10;
inline constexpr int kQmvWideSharedXAhead = 2;
// fp_qmv_grouped (one run of up to 8 or 16 gathered x rows per block: one
// or two x blocks): qmv's wide blocks, as many an SM with one x block, 2 with
// two (which take more registers).
inline constexpr int kQmvGroupedWarps = kQmvWideWarps;
inline constexpr int kQmvGroupedTiles = kQmvWideTiles;
inline constexpr int kQmvGroupedTwoXBlocksMinBlocks = 2;
constexpr int qmv_grouped_min_blocks(int x_blocks) {
  return x_blocks == 1 ? kQmvWideMinBlocks : kQmvGroupedTwoXBlocksMinBlocks;
}
inline constexpr int kQmvGroupedRowsPerBlock = kQmvWideRowsPerBlock;

// qmv_staged (x @ W^T for any K and alignment, the group scales applied to
// float32 sums): the same mma steps, W staged in shared memory by cp.async,
// kStages deep. Each warp owns kStagedTilesPerWarp tiles of W rows; the
// warps of a block share those rows and take turns over stages of
// kStageCodes codes of K.
inline constexpr int kStagedWarps = 4;
inline constexpr int kStagedTilesPerWarp = 2;
inline constexpr int kStagedRowsPerBlock = kTileRows * kStagedTilesPerWarp;
inline constexpr int kStepCodes = 16;    // the K of one mma step
inline constexpr int kStageCodes = 128;  // a multiple of every group size
inline constexpr int kStages = 3;
// Shared-memory rows are padded by 16 bytes, so that the 8 rows a warp's
// lanes read at once fall in distinct banks.
inline constexpr int kSmemRowPadding = 16;
// A stage's scales per row: up to kStageCodes / 16 groups.
inline constexpr int kStageGroups = kStageCodes / 16;

constexpr int staged_row_bytes(int bits) {
  return kStageCodes * bits / 8 + kSmemRowPadding;
}
constexpr int staged_stage_bytes(int bits, int scale_itemsize) {
  return kStagedRowsPerBlock *
         (staged_row_bytes(bits) + kStageGroups * scale_itemsize);
}
// Dynamic shared memory of one qmv_staged block (its warps' stages; reused for
// the warps' partial sums at the end). Above 48 KiB the launch needs
// cudaFuncAttributeMaxDynamicSharedMemorySize.
constexpr int staged_shared_bytes(int bits, int scale_itemsize) {
  return kStagedWarps * kStages * staged_stage_bytes(bits, scale_itemsize);
}
inline constexpr int kDefaultSharedLimit = 48 * 1024;
// The dynamic shared memory a kernel with `static_bytes` of its own takes
// without opting in: the default limit bounds the two together.
constexpr int default_dynamic_shared_limit(int static_bytes) {
  return kDefaultSharedLimit - static_bytes;
}
// fp_qmv_cluster's blocks per cluster: its splits of K.
inline constexpr int kClusterSplits = 4;

// qmm (x @ W^T above the decode range, and the grouped gather's runs): a
// block multiplies kQmmRowsPerBlock rows of W with x_blocks * 8 rows of x
// (x_blocks 4 or 8), both staged in shared memory by cp.async,
// qmm_stages(bits, x_blocks) stages in flight, each a pass of fp_qmv's lanes
// over K (qmv_pass_codes: 64 bytes of a row of W). Each of the kQmmWarps
// warps owns kQmmTilesPerWarp tiles of the block's W rows and multiplies
// them with all of its x rows, so W is decoded once per block. bfloat16 and
// float16 x.
inline constexpr int kQmmWarps = 4;
inline constexpr int kQmmThreads = kQmmWarps * kWarpSize;
inline constexpr int kQmmTilesPerWarp = 2;
inline constexpr int kQmmRowsPerBlock =
    kQmmWarps * kQmmTilesPerWarp * kTileRows;
inline constexpr int kQmmWRowBytes = 64;
inline constexpr int kQmmSmallXBlocks = 4;
inline constexpr int kQmmLargeXBlocks = 8;
constexpr int qmm_stage_codes(int bits) {
  return qmv_pass_codes(bits);
}
// Blocks per SM (the launch bounds): the registers of 32 x rows allow 3.
constexpr int qmm_min_blocks(int x_blocks) {
  return x_blocks == 4 ? 3 : 2;
}
// 64 rows of E2M1 stages hold the most x: fewer of them fit the 99 KiB of
// shared memory a block gets on sm_86, sm_89 and sm_12x.
constexpr int qmm_stages(int bits, int x_blocks) {
  return bits == 4 && x_blocks == 8 ? 3 : 4;
}
constexpr int qmm_x_row_bytes(int bits, int x_itemsize) {
  return qmm_stage_codes(bits) * x_itemsize;
}
// A row's scales of one stage (groups of 16 codes or more) as the 4-byte
// words that hold them: one word more, as the first may start mid-word.
constexpr int qmm_scale_words(int bits, int scale_itemsize) {
  return (qmm_stage_codes(bits) / 16 * scale_itemsize + 3) / 4 + 1;
}
constexpr int qmm_stage_bytes(
    int bits, int x_itemsize, int scale_itemsize, int x_blocks) {
  return kQmmRowsPerBlock *
             (kQmmWRowBytes + 4 * qmm_scale_words(bits, scale_itemsize)) +
         x_blocks * kXBlockRows * qmm_x_row_bytes(bits, x_itemsize);
}
constexpr int qmm_shared_bytes(
    int bits, int x_itemsize, int scale_itemsize, int x_blocks) {
  return qmm_stages(bits, x_blocks) *
         qmm_stage_bytes(bits, x_itemsize, scale_itemsize, x_blocks);
}

// qmm_wgmma (sm_90a: x @ W^T with bfloat16 x, many rows): Hopper's
// warpgroup MMA (wgmma m64nXk16, A = W decoded into registers, B = x in
// shared memory). A block of kWgmmaWarpgroups warpgroups multiplies
// wgmma_rows_per_block(tiles) rows of W (tiles of 64 rows a warpgroup)
// with x_rows rows of x (wgmma's N: kWgmmaXRows, or fewer for few rows,
// kWgmmaFewXRows or kWgmmaFewestXRows, where the MMA would otherwise
// multiply rows that are not there; or kWgmmaWideXRows, two tiles of x that
// each decoded A multiplies in turn, so that a W code is decoded once for
// twice the rows). A stage is 64 bytes of each W row
// (wgmma_stage_codes), staged by cp.async, and x's values over the same codes,
// which a first kernel (fp_wgmma_tile_x) has laid out in device memory as the
// stage's shared-memory tile of kWgmmaXRows rows (in groups of 8 rows, so that
// the first x_rows of a tile are a tile of x_rows), so that one bulk copy loads
// it.
inline constexpr int kWgmmaWarpgroups = 2;
inline constexpr int kWgmmaThreads = kWgmmaWarpgroups * 128;
inline constexpr int kWgmmaTileRows = 64;  // wgmma's M
inline constexpr int kWgmmaXRows = 128;    // wgmma's N, and x's tiles
inline constexpr int kWgmmaFewXRows = 64;
inline constexpr int kWgmmaWideXRows = 2 * kWgmmaXRows;  // one tile of W only
inline constexpr int kWgmmaFewestXRows = 32;
inline constexpr int kWgmmaWRowBytes = 64;
inline constexpr int kWgmmaSharedBudget = 200 * 1024;
// The wide blocks' budget: three stages of E2M1 codes (72 KiB each).
inline constexpr int kWgmmaWideSharedBudget = 224 * 1024;
inline constexpr int kWgmmaTileXThreads =
    256;  // fp_wgmma_tile_x, a tile a block
constexpr int wgmma_rows_per_block(int tiles) {
  return kWgmmaWarpgroups * tiles * kWgmmaTileRows;
}
constexpr int wgmma_stage_codes(int bits) {
  return kWgmmaWRowBytes * 8 / bits;
}
constexpr int wgmma_x_tile_bytes(int bits, int x_rows = kWgmmaXRows) {
  return x_rows * wgmma_stage_codes(bits) * 2;
}
constexpr int wgmma_stage_bytes(int bits, int tiles, int x_rows) {
  return wgmma_x_tile_bytes(bits, x_rows) +
         wgmma_rows_per_block(tiles) * kWgmmaWRowBytes;
}
constexpr int wgmma_stages(int bits, int tiles, int x_rows) {
  const int budget =
      x_rows > kWgmmaXRows ? kWgmmaWideSharedBudget : kWgmmaSharedBudget;
  const int fit = budget / wgmma_stage_bytes(bits, tiles, x_rows);
  return fit < 8 ? fit : 8;
}
// The output tile, staged for whole 16-byte rows of y (rows padded by 16
// bytes against bank conflicts).
constexpr int wgmma_out_pitch(int tiles) {
  return wgmma_rows_per_block(tiles) * 2 + 16;
}
constexpr int wgmma_shared_bytes(int bits, int tiles, int x_rows) {
  const int stages = wgmma_stages(bits, tiles, x_rows) *
                     (wgmma_stage_bytes(bits, tiles, x_rows) + 8);
  const int out = x_rows * wgmma_out_pitch(tiles);
  return stages > out ? stages : out;
}
// Every block of fp_qmm_wgmma fits the shared memory that sm_90 grants a
// block (227 KiB), with at least three stages (one in flight).
inline constexpr int kSm90SharedBytes = 227 * 1024;
constexpr bool wgmma_blocks_fit() {
  for (int bits : {4, 8}) {
    for (int tiles : {1, 2}) {
      for (int x_rows :
           {kWgmmaFewestXRows, kWgmmaFewXRows, kWgmmaXRows, kWgmmaWideXRows}) {
        if (x_rows == kWgmmaWideXRows && tiles != 1) {
          continue;
        }
        if (wgmma_stages(bits, tiles, x_rows) < 3 ||
            wgmma_shared_bytes(bits, tiles, x_rows) > kSm90SharedBytes) {
          return false;
        }
      }
    }
  }
  return true;
}
static_assert(wgmma_blocks_fit());
// The rows of x of fp_qmm_wgmma's blocks for M rows.
constexpr int wgmma_x_rows(int M) {
  return M <= kWgmmaFewestXRows ? kWgmmaFewestXRows
         : M <= kWgmmaFewXRows  ? kWgmmaFewXRows
                                : kWgmmaXRows;
}

// qvm (x @ W, W (K, N) grouped along N): each lane owns kQvmColumns
// adjacent outputs (one or two packed words per row of W) for up to
// kQvmRows rows of x; the warps of a block take turns over the rows of K of
// each chunk of kQvmChunk rows, whose x the block stages in shared memory.
inline constexpr int kQvmWarps = 4;
inline constexpr int kQvmColumns = 8;
inline constexpr int kQvmColumnsPerBlock = kWarpSize * kQvmColumns;
inline constexpr int kQvmRows = 8;
inline constexpr int kQvmChunk = 256;
inline constexpr int kQvmSharedBytes =
    kQvmRows * kQvmChunk * 4 + kQvmWarps * kQvmRows * kQvmColumnsPerBlock * 4;

// Split K: the partial sums of split s are float32 at partials + s * batch *
// M * N; fp_split_k_sum adds them, kSplitKSumThreads threads per block.
inline constexpr int kSplitKSumThreads = 256;
// fp_split_x: a pair of x's values a thread and step of a grid of
// kSplitXThreads-thread blocks, up to kSplitXBlocksPerSm blocks per SM.
inline constexpr int kSplitXThreads = 256;
inline constexpr int kSplitXBlocksPerSm = 8;

// Grouped gather (pairs of one row each): fp_group_pairs, one block of
// kGroupThreads threads, counts the pairs of each expert (up to
// kGroupMaxExperts, plus one bin for indices out of range), orders the pairs
// by expert and cuts each expert's pairs into runs of up to run_rows (the
// x rows of a block of the grouped kernel); fp_qmv_grouped or fp_qmm_grouped
// then multiplies each run's rows of x, gathered, with its expert's tiles
// of W, read once per run instead of once per pair.
inline constexpr int kGroupThreads = 1024;
inline constexpr int kGroupMaxExperts = 4096;
// Keeps the scratch (about 5 bytes a pair) within an array of 2^31 words.
inline constexpr int64_t kGroupMaxPairs = int64_t(1) << 28;
// fp_group_pairs's shared memory: a count and a start per bin, and the
// block's scan (pairs and runs, 64 bits a thread).
inline constexpr int kGroupSharedBytes =
    2 * (kGroupMaxExperts + 1) * 4 + kGroupThreads * 8;

// Up to this many pairs (a warp's lanes) fp_qmv_grouped groups them itself,
// once a block, without fp_group_pairs (QmmArgs::pair_runs null), which
// spares that launch and the wait for it.
inline constexpr int kBlockGroupMaxPairs = kWarpSize;

// A run of pairs of one expert: order[first, first + count) are the pairs,
// `expert` their W matrix (w_matrices or more: out of range).
struct PairRun {
  uint32_t first;
  uint32_t count;
  uint32_t expert;
  uint32_t unused;
};
// At most this many runs of up to run_rows pairs: a run per run_rows pairs,
// and one more per bin that has pairs.
constexpr int64_t max_pair_runs(int64_t pairs, int64_t experts, int run_rows) {
  const int64_t bins = experts + 1 < pairs ? experts + 1 : pairs;
  return (pairs + run_rows - 1) / run_rows + bins;
}

// fp_dequantize: a 32-bit word of codes per thread, kDequantizeThreads
// threads per block, up to kDequantizeBlocksPerSm blocks per SM (the grid
// loops past that).
inline constexpr int kDequantizeThreads = 256;
inline constexpr int kDequantizeBlocksPerSm = 16;

// fp_strided_copy: x made row-contiguous inside eval_gpu (where the op left
// it as it came, to spare each product a node in the graph), an element per
// thread and step of a grid of kCopyThreads-thread blocks, up to
// kCopyBlocksPerSm blocks per SM; x of up to kMaxCopyDims axes (the op
// copies others itself).
inline constexpr int kMaxCopyDims = 8;
inline constexpr int kCopyThreads = 256;
inline constexpr int kCopyBlocksPerSm = 8;

struct StridedCopyArgs {
  const void* src;
  void* dst;
  int64_t elements;
  int ndim;
  int shape[kMaxCopyDims];
  int64_t strides[kMaxCopyDims];  // in elements
};

// Every kernel's one parameter. Pointers are device pointers; element
// strides per batch axis (w in uint32 words, scales in scale elements).
// Gather: pair z multiplies x matrix lhs_indices[z] (z / lhs_divisor where
// that is not 0: the gather has no lhs_indices) with W matrix rhs_indices[z]
// of row-contiguous matrices; an index out of range makes the pair's outputs
// NaN. global_scale: nvfp4's global scale (null without),
// one value, or with gather one per W matrix.
struct QmmArgs {
  const uint32_t* w;
  const void* scales;
  const float* global_scale;
  const void* x;
  void* y;
  float* partials;              // split K only
  const uint32_t* lhs_indices;  // gather only
  const uint32_t* rhs_indices;
  int M, N, K;
  int group_size;
  int batch_ndims;
  int batch_shape[kMaxBatchDims];
  int64_t x_batch_strides[kMaxBatchDims];
  int64_t w_batch_strides[kMaxBatchDims];
  int64_t scales_batch_strides[kMaxBatchDims];
  int64_t batch_count;  // pairs with gather
  // Gather; fp_dequantize: w_matrices global scales (1: one for all).
  int x_matrices, w_matrices;
  int lhs_divisor;
  int split_k;       // 1: no split
  int split_k_step;  // codes of K per split, a multiple of the stage
  // Grouped gather's scratch, written by fp_group_pairs: the pairs in order
  // of their experts, the runs (of up to run_rows pairs) and their number;
  // null where fp_qmv_grouped's blocks group the pairs themselves.
  int run_rows;
  // fp_qmv_grouped: its shares ordered tile by tile over every run (1), not
  // run by run (0), so that the runs of one expert read a tile at about the
  // same time, the later ones from L2.
  int tile_major_shares;
  uint32_t* pair_order;
  PairRun* pair_runs;
  uint32_t* run_count;
  // qmm_wgmma: x in fp_wgmma_tile_x's layout; x split into parts: the parts
  // (fp_split_x's output, the main kernel's x).
  void* x_tiles;
  // 2: x split into bfloat16 high and low parts (row m's as rows 2m and
  // 2m + 1), which the main kernel multiplies as M rows of bfloat16 x and
  // adds in pairs as it stores y (with K split, into partials that
  // fp_split_k_sum adds up). 0 or 1: x as it is.
  int x_parts;
  // fp_qmv_wide: a block's rows of x copied into its shared memory
  // (qmv_wide_may_share_x), after the warps' sums.
  int x_in_shared;
};

// The grouped path's scratch, 32-bit words from a 16-byte aligned start:
// the run count (in 16 bytes, so that the runs stay aligned), room for
// max_runs runs, then the pairs' order.
inline constexpr int64_t kRunCountWords = 4;
constexpr int64_t grouping_scratch_bytes(int64_t max_runs, int64_t pairs) {
  return 4 * kRunCountWords + max_runs * int64_t(sizeof(PairRun)) + 4 * pairs;
}
inline void place_grouping_scratch(
    QmmArgs& args, uint32_t* scratch, int64_t max_runs) {
  args.run_count = scratch;
  args.pair_runs = reinterpret_cast<PairRun*>(scratch + kRunCountWords);
  args.pair_order =
      scratch + kRunCountWords + max_runs * int64_t(sizeof(PairRun)) / 4;
}

}  // namespace fpqmm::cuda
