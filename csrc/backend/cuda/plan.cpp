#include "backend/cuda/plan.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "backend/common/kernel_request.h"

namespace mlx_fpqmm::cuda {

namespace fc = fpqmm::cuda;

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t round_up(int64_t value, int64_t multiple) {
  return ceil_div(value, multiple) * multiple;
}

constexpr int kMaxGridYZ = 65535;

std::string_view codes_name(int bits) {
  return bits == 4 ? "e2m1" : "e4m3";
}

std::string_view encoding_name(ScaleEncoding encoding) {
  constexpr std::array<std::string_view, 5> names = {
      "e8m0", "e4m3", "float32", "float16", "bfloat16"};
  return names[static_cast<size_t>(encoding)];
}

std::string kernel_name(const KernelKey& key) {
  constexpr std::array<std::string_view, 11> families = {
      "qmv",
      "qmv_staged",
      "qvm",
      "qmv_cluster",
      "dequantize",
      "qmv_grouped",
      "qmm",
      "qmm_grouped",
      "qmm_wgmma",
      "qmm_wgmma_grouped",
      "qmv_wide"};
  std::string name = "fpqmm_" +
                     std::string(families[static_cast<size_t>(key.family)]) +
                     "_" + std::string(codes_name(key.bits)) + "_" +
                     std::string(encoding_name(key.encoding)) + "_" +
                     std::string(type_name(key.x_type));
  if (key.x_blocks > 0) {
    name += "_x" + std::to_string(key.x_blocks * fc::kXBlockRows);
  }
  if (key.w_tiles > 0) {
    name += "_w" + std::to_string(fc::wgmma_rows_per_block(key.w_tiles));
  }
  return name;
}

// The batch axes with runs contiguous in all three arrays folded into one.
void fold_batch(const QmmProblem& p, KernelPlan& plan) {
  plan.batch_count = p.batch_count();
  if (p.gather) {
    plan.batch_shape = {static_cast<int>(plan.batch_count)};
    plan.x_batch_strides = {0};
    plan.w_batch_strides = {0};
    plan.scales_batch_strides = {0};
    return;
  }
  for (size_t axis = 0; axis < p.batch_shape.size(); ++axis) {
    const int size = p.batch_shape[axis];
    if (size == 1) {
      continue;
    }
    const bool folds =
        !plan.batch_shape.empty() &&
        plan.x_batch_strides.back() == p.x_batch_strides[axis] * size &&
        plan.w_batch_strides.back() == p.w_batch_strides[axis] * size &&
        plan.scales_batch_strides.back() == p.scales_batch_strides[axis] * size;
    if (folds) {
      plan.batch_shape.back() *= size;
      plan.x_batch_strides.back() = p.x_batch_strides[axis];
      plan.w_batch_strides.back() = p.w_batch_strides[axis];
      plan.scales_batch_strides.back() = p.scales_batch_strides[axis];
    } else {
      plan.batch_shape.push_back(size);
      plan.x_batch_strides.push_back(p.x_batch_strides[axis]);
      plan.w_batch_strides.push_back(p.w_batch_strides[axis]);
      plan.scales_batch_strides.push_back(p.scales_batch_strides[axis]);
    }
  }
  if (plan.batch_shape.size() > static_cast<size_t>(fc::kMaxBatchDims)) {
    throw std::invalid_argument(
        "[cuda::plan] " + std::to_string(plan.batch_shape.size()) +
        " batch axes that do not fold; the kernels walk at most " +
        std::to_string(fc::kMaxBatchDims) + ".");
  }
}

// Split K in `splits` of `step` codes: the float32 partials and the kernel
// that adds them into y.
void set_split_k(const QmmProblem& p, int splits, int step, KernelPlan& plan) {
  plan.split_k = splits;
  plan.split_k_step = step;
  const int64_t outputs = plan.batch_count * int64_t(p.M) * p.N;
  plan.partials_bytes = splits * outputs * int64_t(sizeof(float));
  plan.reduction = Launch{
      "fpqmm_split_k_sum_" + std::string(type_name(p.x_type)),
      {static_cast<int>(std::min<int64_t>(
           ceil_div(outputs, fc::kSplitKSumThreads), 1 << 20)),
       1,
       1},
      {fc::kSplitKSumThreads, 1, 1},
      0};
}

// The blocks that run at once, `resident` of them an SM.
int64_t resident_slots(const CudaDevice& device, int resident) {
  return int64_t(device.sm_count) * resident;
}

// Whether `blocks` blocks take at least half those slots: where K stays
// unsplit and the wider blocks pay.
bool half_fills(int64_t blocks, int resident, const CudaDevice& device) {
  return 2 * blocks >= resident_slots(device, resident);
}

// Split K where the blocks alone would not fill the GPU: where fewer than
// half the blocks that run at once (`resident` per SM), up to about that
// many (`one_wave`: no more than run at once), each split at least
// `min_step` codes of K (a multiple of `step_multiple`). The partial sums cost
// 8 bytes per output and split (written, read back) and a second kernel, so
// fuller grids are not split (measured on the H200: fp_qmv on 448 blocks of
// 14336 x 4096 takes longer split in 4 than not, on 256 of 4096 x 4096 9.1 us
// unsplit against 12.8 split in 3).
void plan_split_k(
    const QmmProblem& p,
    const CudaDevice& device,
    int64_t blocks,
    int resident,
    int step_multiple,
    int min_step,
    KernelPlan& plan,
    bool one_wave = false) {
  plan.split_k = 1;
  plan.split_k_step = p.K;
  if (blocks == 0 || half_fills(blocks, resident, device) ||
      p.K < 2 * min_step) {
    return;
  }
  const int64_t slots = resident_slots(device, resident);
  const int64_t wanted = one_wave ? slots / blocks : ceil_div(slots, blocks);
  const int64_t splits = std::min(wanted, int64_t(p.K / min_step));
  const int64_t step = round_up(ceil_div(p.K, splits), step_multiple);
  const int64_t actual = ceil_div(p.K, step);
  if (actual < 2) {
    return;
  }
  set_split_k(p, static_cast<int>(actual), static_cast<int>(step), plan);
  plan.note += "; split_k=" + std::to_string(actual) + ": " +
               std::to_string(blocks) + " blocks for " +
               std::to_string(device.sm_count) + " SMs";
}

// The bytes of x that a block of fp_qmv_wide copies into its shared memory
// (x_in_shared).
int64_t qmv_wide_x_bytes(const QmmProblem& p) {
  return std::min<int64_t>(p.M, fc::kXBlockRows) * p.K * itemsize(p.x_type);
}

// Whether fp_qmv's wide blocks (kQmvWideMinBlocks an SM) of x_blocks x
// blocks half fill the GPU, where they were measured faster than the narrow
// ones: on the H200 at M = 1 and 8, on an H100 at 16 (docs/cuda-log.md,
// "Fourth session of 2026-12-07": 14336 x 4096 mxfp4 22.6 us against 34.2);
// other GPUs take the same rule unmeasured.
bool qmv_wide_blocks_fill(
    const QmmProblem& p,
    const CudaDevice& device,
    int64_t batch_count,
    int x_blocks) {
  const int64_t blocks = ceil_div(p.N, fc::kQmvWideRowsPerBlock) *
                         ceil_div(p.M, x_blocks * fc::kXBlockRows) *
                         batch_count;
  return half_fills(blocks, fc::kQmvWideMinBlocks, device);
}

// From sm_90 a split of K in up to kMaxClusterSplit becomes
// fp_qmv_cluster's kClusterSplits splits, which add up in the distributed
// shared memory of a thread block cluster: one kernel and no partials,
// faster than the partials and their kernel where the split is small (more
// splits keep the partials), but for float16 and float32 x split fewer ways
// than the cluster (the partials' fewer splits win there). The cluster's shape
// is the kernel's own
// (__cluster_dims__), not a launch attribute: MLX's graph cache updates
// executable graphs in place, which leaves launch attributes as they were.
inline constexpr int kMaxClusterSplit = 8;

std::string cluster_note() {
  return "; instead " + std::to_string(fc::kClusterSplits) +
         " splits adding up in a thread block cluster";
}

void split_in_cluster(
    const QmmProblem& p, int step_multiple, KernelPlan& plan) {
  const int64_t step =
      round_up(ceil_div(p.K, fc::kClusterSplits), step_multiple);
  if (ceil_div(p.K, step) != fc::kClusterSplits) {
    return;
  }
  plan.split_k = fc::kClusterSplits;
  plan.split_k_step = static_cast<int>(step);
  plan.partials_bytes = 0;
  plan.reduction.reset();
  plan.splits_in_cluster = true;
  plan.key.family = KernelFamily::qmv_cluster;
  plan.main.kernel = kernel_name(plan.key);
  plan.note += cluster_note();
}

// A kernel that loops over `items` (a thread each per step): blocks of
// `threads`, up to blocks_per_sm per SM.
Launch grid_stride_launch(
    std::string kernel,
    int64_t items,
    int threads,
    int blocks_per_sm,
    const CudaDevice& device) {
  return Launch{
      std::move(kernel),
      {static_cast<int>(std::min<int64_t>(
           ceil_div(items, threads), int64_t(device.sm_count) * blocks_per_sm)),
       1,
       1},
      {threads, 1, 1},
      0};
}

// Blocks per SM of the kernels without launch bounds' minimum (about what
// their shared memory and registers allow).
constexpr int kStagedResident = 2;
constexpr int kQvmResident = 2;

// Whether W's scales are floats (the fp4 and fp8 modes), not the MLX
// formats' E8M0 or E4M3 bytes.
bool float_scales(const QmmProblem& p) {
  return format_for(p.mode).scales == ScaleKind::floating;
}

// Why fp_qmv (W loaded straight into registers, code times scale rounded
// to bfloat16, or in a high and a low part for float32 x with float
// scales) cannot take a transposed problem; empty when it can.
std::string staged_reason(const QmmProblem& p, const Format& format) {
  if (int64_t(p.K) * format.bits % 128 != 0) {
    return "K=" + std::to_string(p.K) +
           " leaves rows of W that are not whole 16-byte vectors";
  }
  bool aligned = p.pointer_alignment % 16 == 0;
  for (size_t axis = 0; axis < p.x_batch_strides.size(); ++axis) {
    aligned = aligned &&
              p.x_batch_strides[axis] * itemsize(p.x_type) % 16 == 0 &&
              p.w_batch_strides[axis] % 4 == 0;
  }
  if (!aligned) {
    return "x or w is not 16-byte aligned";
  }
  if (float_scales(p) && format.bits == 4 && p.group_size < 32) {
    return "E2M1 groups of 16 with float scales";
  }
  return "";
}

// Why the grouped path cannot take a problem; empty when it can.
std::string grouped_reason(
    const QmmProblem& p, const Format& format, int64_t pairs) {
  if (!p.gather) {
    return "not a gather";
  }
  if (!p.transpose) {
    return "x @ W (the grouped kernel is x @ W^T's)";
  }
  if (p.M != 1) {
    return "M=" + std::to_string(p.M) + " rows per pair";
  }
  if (p.w_matrices > fc::kGroupMaxExperts) {
    return std::to_string(p.w_matrices) + " experts (at most " +
           std::to_string(fc::kGroupMaxExperts) + ")";
  }
  if (pairs > fc::kGroupMaxPairs) {
    return std::to_string(pairs) + " pairs (at most 2^28)";
  }
  return staged_reason(p, format);
}

// Whether qmv multiplies a pair of p's x values in one mma step.
bool one_x_part(const QmmProblem& p) {
  return fc::qmv_one_x_part(
      p.x_type == FloatType::bfloat16,
      p.x_type == FloatType::float16,
      format_for(p.mode).bits,
      static_cast<int>(scale_encoding(p.mode, p.scale_type)));
}

// fp_qmm's dynamic shared memory for `p`.
int qmm_shared_bytes(const QmmProblem& p, const Format& format, int x_blocks) {
  return fc::qmm_shared_bytes(
      format.bits,
      itemsize(p.x_type),
      scale_itemsize(scale_encoding(p.mode, p.scale_type)),
      x_blocks);
}

// fp_qmm's x blocks for `rows` rows of x per W matrix (per expert, on
// average, for the `grouped` gather).
int qmm_x_blocks(int64_t rows, bool grouped) {
  const bool large =
      grouped ? rows >= kQmmGroupedLargeRows : rows > kQmmSmallRows;
  return large ? fc::kQmmLargeXBlocks : fc::kQmmSmallXBlocks;
}

// fp_qmm_wgmma's tiles of 64 W rows per warpgroup: two (256 rows a block)
// where those blocks would half fill the GPU, else one (and split K where
// even those would not). Measured on the H200 in the wgmma lab (which
// 4f09d3e removed; these rows are not in docs/cuda-log.md), 256 / 128 rows:
// 14336 x 4096, M = 128 (56 blocks of 256) 65.5 / 39.7 us, M = 256 (112) 66.3
// / 78.2; 4096 x 4096, M = 512 (64) 65.5 / 39.6, M = 1024 (128) 65.8 / 77.2.
int wgmma_tiles(const QmmProblem& p, const CudaDevice& device) {
  const int64_t wide_blocks = ceil_div(p.N, fc::wgmma_rows_per_block(2)) *
                              ceil_div(p.M, fc::wgmma_x_rows(p.M));
  return half_fills(wide_blocks, 1, device) ? 2 : 1;
}
// Whether fp_qmm_wgmma's blocks take kWgmmaWideXRows rows of x (one tile of
// W a warpgroup, each W code decoded once for 256 rows: half the decoding
// of the blocks of 128 rows, which at 512 rows costs about as many issue
// slots as the MMA takes cycles with E4M3 codes): past 128 rows, where
// those blocks are at least as many as the blocks of 128 rows would be, or
// fill the GPU. Measured on an H100, kernels alone (docs/cuda-log.md, "Ninth
// session of 2026-12-05"): 14336 x 4096 at 256 and 512 rows 18-28% faster.
bool wgmma_wide_x(const QmmProblem& p, const CudaDevice& device) {
  if (p.M <= fc::kWgmmaXRows) {
    return false;
  }
  const int64_t wide = ceil_div(p.N, fc::wgmma_rows_per_block(1)) *
                       ceil_div(p.M, fc::kWgmmaWideXRows);
  const int64_t narrow =
      ceil_div(p.N, fc::wgmma_rows_per_block(wgmma_tiles(p, device))) *
      ceil_div(p.M, fc::kWgmmaXRows);
  return wide >= std::min(narrow, resident_slots(device, 1));
}
// Whether fp_qmm_wgmma's blocks of 128 W rows (of one block of x rows) half
// fill the GPU.
bool wgmma_narrow_blocks_fill(const QmmProblem& p, const CudaDevice& device) {
  return half_fills(ceil_div(p.N, fc::wgmma_rows_per_block(1)), 1, device);
}
// Whether rows of x past the decode range that fp_qmm_wgmma would take go
// to the simple path instead, in fp_qmv's blocks of 32 rows (one pass over
// W): up to 32 rows of one-part x, where wgmma's blocks of 128 W rows would
// not half fill the GPU. Measured on an H100, kernels alone, 32 rows,
// fp_qmv / fp_qmm_wgmma (docs/cuda-log.md, "Sixth session of 2026-12-05"),
// us: mxfp4 4096 x 4096 15.9 / 17.2, 1024 x 4096 13.8 / 15.2; mxfp8 14.2 /
// 20.5, 13.0 / 15.6; but 14336 x 4096 (112 blocks of 128 rows) 55.3 / 28.8,
// mxfp8 47.4 / 42.4.
bool simple_before_wgmma(
    const QmmProblem& p, const Format& format, const CudaDevice& device) {
  return p.M > kDecodeRows && p.M <= fc::kSimpleXBlocks * fc::kXBlockRows &&
         one_x_part(p) && staged_reason(p, format).empty() &&
         !wgmma_narrow_blocks_fill(p, device);
}
// A split of K takes at least this many stages.
constexpr int kWgmmaMinSplitStages = 8;
// fp_wgmma_tile_x_grouped's blocks per SM (its grid loops over the tiles).
constexpr int kWgmmaTileXBlocksPerSm = 4;

// fp_wgmma_tile_x's tiles of `tiles` blocks of 128 rows of x.
int64_t wgmma_x_tiles_bytes(const QmmProblem& p, int64_t tiles) {
  const int bits = format_for(p.mode).bits;
  return tiles * ceil_div(p.K, fc::wgmma_stage_codes(bits)) *
         fc::wgmma_x_tile_bytes(bits);
}

// What fp_qmm_wgmma and fp_qmm_wgmma_grouped need alike, x's tiles taking
// `x_tiles_bytes` (an array of 32-bit words: 2^31 at most).
std::string wgmma_common_reason(
    const QmmProblem& p, const CudaDevice& device, int64_t x_tiles_bytes) {
  if (device.major != 9) {
    return "not sm_90 (wgmma is Hopper's)";
  }
  if (p.x_type != FloatType::bfloat16) {
    return std::string(type_name(p.x_type)) + " x";
  }
  if (p.N % 8 != 0) {
    return "N=" + std::to_string(p.N) + " is not a multiple of 8";
  }
  if (x_tiles_bytes >= int64_t(1) << 33) {
    return "x is too large for its tiles";
  }
  return tiled_reason(p);
}

// Whether the grouped path multiplies with fp_qmm_grouped.
bool grouped_tiled(const QmmProblem& p, KernelRequest request) {
  return tiled_reason(p).empty() &&
         (request == KernelRequest::tiled ||
          p.batch_count() >= int64_t(kTiledGroupRows) * p.w_matrices);
}

// The grouped path's first launch: fp_group_pairs, with room for `runs` runs.
void add_grouping(int64_t runs, KernelPlan& plan) {
  plan.grouping = Launch{
      "fpqmm_group_pairs",
      {1, 1, 1},
      {fc::kGroupThreads, 1, 1},
      fc::kGroupSharedBytes};
  plan.grouping_bytes = fc::grouping_scratch_bytes(runs, plan.batch_count);
}

// Whether the grouped path multiplies with fp_qmm_wgmma_grouped (runs of
// kWgmmaXRows pairs): on sm_90 from kWgmmaGroupRows rows an expert, or on
// request, where it runs.
bool grouped_wgmma(
    const QmmProblem& p, const CudaDevice& device, KernelRequest request) {
  const int64_t pairs = p.batch_count();
  const int64_t runs = fc::max_pair_runs(pairs, p.w_matrices, fc::kWgmmaXRows);
  return wgmma_common_reason(p, device, wgmma_x_tiles_bytes(p, runs)).empty() &&
         (request == KernelRequest::wgmma ||
          (request != KernelRequest::tiled &&
           pairs >= int64_t(kWgmmaGroupRows) * p.w_matrices));
}

// The grouped path by fp_qmm_wgmma_grouped: fp_group_pairs, fp_wgmma_tile_x
//_grouped (x's rows of each run in tiles), then a block per tile of W rows
// and run.
void plan_grouped_wgmma(
    const QmmProblem& p,
    const Format& format,
    const CudaDevice& device,
    KernelPlan& plan) {
  plan.run_rows = fc::kWgmmaXRows;
  const int64_t runs =
      fc::max_pair_runs(plan.batch_count, p.w_matrices, plan.run_rows);
  plan.max_runs = static_cast<int>(runs);
  plan.key = KernelKey{
      KernelFamily::qmm_wgmma_grouped,
      format.bits,
      scale_encoding(p.mode, p.scale_type),
      p.x_type,
      plan.run_rows / fc::kXBlockRows};
  // Blocks of 256 W rows: at kWgmmaGroupRows pairs an expert or more, the
  // runs make enough blocks (and one kernel fewer to build).
  plan.key.w_tiles = 2;
  plan.main = Launch{
      kernel_name(plan.key),
      {static_cast<int>(
           ceil_div(p.N, fc::wgmma_rows_per_block(plan.key.w_tiles))),
       static_cast<int>(std::min<int64_t>(runs, kMaxGridYZ)),
       1},
      {fc::kWgmmaThreads, 1, 1},
      fc::wgmma_shared_bytes(format.bits, plan.key.w_tiles, fc::kWgmmaXRows)};
  add_grouping(runs, plan);
  plan.x_tiles = grid_stride_launch(
      "fpqmm_wgmma_tile_x_grouped_" + std::string(codes_name(format.bits)),
      runs * ceil_div(p.K, fc::wgmma_stage_codes(format.bits)) *
          fc::kWgmmaTileXThreads,
      fc::kWgmmaTileXThreads,
      kWgmmaTileXBlocksPerSm,
      device);
  plan.x_tiles_bytes = wgmma_x_tiles_bytes(p, runs);
  plan.split_k_step = p.K;
}

// The grouped path's launches and scratch: fp_group_pairs, then
// fp_qmm_grouped (where `tiled`: a block per tile of W rows and run, the
// grid's y looping past its limit) or fp_qmv_grouped (the blocks that run at
// once, or fewer, walking the tiles of every run; up to kBlockGroupMaxPairs
// pairs, grouped by each of its blocks instead of fp_group_pairs).
void plan_grouped(
    const QmmProblem& p,
    const Format& format,
    const CudaDevice& device,
    bool tiled,
    KernelPlan& plan) {
  const int64_t pairs_per_expert = plan.batch_count / std::max(p.w_matrices, 1);
  const int qmm_blocks = qmm_x_blocks(pairs_per_expert, true);
  // fp_qmv_grouped: runs of up to 8 pairs (one x block, more blocks an SM)
  // where the experts average fewer than kTiledGroupRows (measured faster at
  // 1, 4 and 8 pairs an expert; the bound is fp_qmm_grouped's, below which
  // this kernel takes bfloat16 and float16 x); runs of 16 past it (float32
  // x), which read each expert's W half as often.
  const int qmv_blocks =
      pairs_per_expert < kTiledGroupRows ? 1 : fc::kMaxXBlocks;
  plan.key = KernelKey{
      tiled ? KernelFamily::qmm_grouped : KernelFamily::qmv_grouped,
      format.bits,
      scale_encoding(p.mode, p.scale_type),
      p.x_type,
      tiled ? qmm_blocks : qmv_blocks};
  plan.run_rows = plan.key.x_blocks * fc::kXBlockRows;
  // fp_qmv_grouped's shares tile by tile where the experts average a run or
  // more (several runs for many of them), else run by run. Measured on an
  // H100 (docs/cuda-log.md, "Fifth session of 2026-12-06"), runs of 8,
  // kernels alone, run by run / tile by tile: 64 tokens (8 pairs an expert)
  // 87.2 / 83.8 us unsorted, 88.9 / 84.6 sorted; 32 tokens (4) 67.4 / 68.7;
  // 8 tokens (1) 46.4 / 47.2. Runs of 16 (float32 x) follow the same rule,
  // not timed.
  plan.tile_major_shares = !tiled && pairs_per_expert >= plan.run_rows;
  const int64_t runs =
      fc::max_pair_runs(plan.batch_count, p.w_matrices, plan.run_rows);
  plan.max_runs = static_cast<int>(runs);
  const int64_t row_blocks =
      ceil_div(p.N, tiled ? fc::kQmmRowsPerBlock : fc::kQmvGroupedRowsPerBlock);
  // fp_qmm_grouped: a block per tile and run (y loops past its limit);
  // fp_qmv_grouped: the blocks that run at once, or fewer where the tiles
  // and runs are fewer.
  std::array<int, 3> grid{
      static_cast<int>(row_blocks),
      static_cast<int>(std::min<int64_t>(runs, kMaxGridYZ)),
      1};
  if (!tiled) {
    const int64_t blocks_at_once =
        int64_t(device.sm_count) *
        fc::qmv_grouped_min_blocks(plan.key.x_blocks);
    grid = {
        static_cast<int>(std::min(row_blocks * runs, blocks_at_once)), 1, 1};
  }
  plan.main = Launch{
      kernel_name(plan.key),
      grid,
      {tiled ? fc::kQmmThreads : fc::kQmvGroupedWarps * fc::kWarpSize, 1, 1},
      tiled ? qmm_shared_bytes(p, format, qmm_blocks)
            : fc::qmv_shared_bytes(
                  fc::kQmvGroupedWarps, fc::kQmvGroupedTiles, qmv_blocks)};
  if (tiled || plan.batch_count > fc::kBlockGroupMaxPairs) {
    add_grouping(runs, plan);
  }
  plan.split_k_step = p.K;
}

// The problem of float32 x's bfloat16 high and low parts: twice the rows.
QmmProblem float32_parts(const QmmProblem& p) {
  QmmProblem parts = p;
  parts.x_type = FloatType::bfloat16;
  parts.M = 2 * p.M;
  return parts;
}

// float32 x times one matrix of W with the MLX formats' scales (x @ W^T):
// split once by fp_split_x into bfloat16 high and low parts, which the
// bfloat16 plan of twice the rows multiplies, adding each row's parts as it
// stores y (or, with K split, into partials that the reduction adds up; not
// a cluster's sums), rather than every block splitting its chunks of x
// again: up to kXPartsMaxRows rows where W has at least
// kXPartsMinWeightBytes and that plan is fp_qmv's, wherever that plan is
// fp_qmm_wgmma's, and past the decode range where it is fp_qmm's (the
// float32 kernels would pass over W once for every 16 rows). Empty for an empty
// x, for float scales (only the float32 decode kernels split code times a
// float scale into parts as well), where the bfloat16 plan is another, or on
// the simple and staged requests (grouped plans a product that is not a gather
// as automatic). (float16 x with float scales gained little for E2M1 codes and
// lost for E4M3: it keeps its own kernel.)
std::optional<KernelPlan> plan_x_parts(
    const QmmProblem& p, const CudaDevice& device, KernelRequest request) {
  if (!p.transpose || p.gather || p.batch_count() != 1 || p.M == 0 ||
      p.K == 0 || p.x_type != FloatType::float32 || float_scales(p) ||
      !staged_reason(p, format_for(p.mode)).empty() ||
      (request != KernelRequest::automatic &&
       request != KernelRequest::decode && request != KernelRequest::wgmma &&
       request != KernelRequest::tiled && request != KernelRequest::grouped)) {
    return std::nullopt;
  }
  const QmmProblem parts = float32_parts(p);
  KernelPlan plan = cuda::plan(parts, device, request);
  const auto family = plan.key.family;
  const int64_t w_bytes = int64_t(p.N) * p.K * format_for(p.mode).bits / 8;
  const bool decode =
      (family == KernelFamily::qmv || family == KernelFamily::qmv_wide ||
       family == KernelFamily::qmv_cluster) &&
      p.M <= kXPartsMaxRows && w_bytes >= kXPartsMinWeightBytes;
  // E4M3 codes by wgmma: only past the decode rows, and past the simple
  // path's rows where wgmma's blocks of 128 W rows would not half fill the
  // GPU. Measured on an H100, kernels alone, the float32 kernels / the
  // parts by wgmma, mxfp8 (docs/cuda-log.md, "Fifth session of 2026-12-07"):
  // 14336 x 4096 at 16 rows 43.0 / 46.3 us, at 32 rows 79.0 / 51.6; 4096 x
  // 4096 at 32 rows 23.6 / 26.3 (E2M1 codes 31.4 / 23.0). A wgmma or tiled
  // request takes the parts at any rows.
  const bool requested =
      request == KernelRequest::wgmma || request == KernelRequest::tiled;
  const bool wgmma =
      family == KernelFamily::qmm_wgmma &&
      (requested || format_for(p.mode).bits == 4 ||
       (p.M > kDecodeRows &&
        (p.M > kSimpleRows || wgmma_narrow_blocks_fill(p, device))));
  const bool tiled =
      family == KernelFamily::qmm && (requested || p.M > kDecodeRows);
  if (!decode && !tiled && !wgmma) {
    return std::nullopt;
  }
  if (!decode) {
    // Their own instantiations, which add each row's parts as they store y
    // (a test of QmmArgs::x_parts in the bfloat16 kernels, as the decode
    // kernels have, changed their machine code: 1-8% slower at 32 rows).
    plan.key.x_type = FloatType::float32;
    plan.main.kernel = kernel_name(plan.key);
  }
  if (plan.splits_in_cluster) {
    // The cluster's splits, in partial sums.
    plan.splits_in_cluster = false;
    plan.key.family = KernelFamily::qmv;
    plan.main.kernel = kernel_name(plan.key);
    plan.note.replace(
        plan.note.find(cluster_note()),
        cluster_note().size(),
        "; " + std::to_string(plan.split_k) +
            " splits (a cluster's) in partial sums");
  }
  plan.x_parts = 2;
  if (plan.split_k == 1) {
    // The main kernel adds each row's parts and stores y.
    plan.reduction.reset();
    plan.partials_bytes = 0;
  } else {
    set_split_k(p, plan.split_k, plan.split_k_step, plan);
    plan.partials_bytes *= plan.x_parts;  // the main kernel's rows: the parts'
  }
  plan.x_split = grid_stride_launch(
      "fpqmm_split_x_float32",
      int64_t(p.M) * p.K / 2,
      fc::kSplitXThreads,
      fc::kSplitXBlocksPerSm,
      device);
  plan.x_split_bytes = int64_t(parts.M) * p.K * 2;
  plan.note = std::string(type_name(p.x_type)) +
              " x split once into bfloat16 high and low parts, multiplied as " +
              std::to_string(parts.M) + " rows of bfloat16 x: " + plan.note;
  return plan;
}

// The automatic choice of the grouped path, given why it cannot run.
bool grouped_by_default(int64_t pairs, const std::string& why_not) {
  return pairs >= kGroupedMinPairs && why_not.empty();
}

}  // namespace

std::string tiled_reason(const QmmProblem& p) {
  if (!p.transpose) {
    return "x @ W (fp_qmm is x @ W^T's)";
  }
  if (p.x_type == FloatType::float32) {
    return "float32 x";
  }
  if (p.scales_alignment % 4 != 0) {
    return "the scales are not 4-byte aligned";
  }
  return staged_reason(p, format_for(p.mode));
}

bool grouped_gather(const QmmProblem& problem) {
  const int64_t pairs = problem.batch_count();
  return grouped_by_default(
      pairs, grouped_reason(problem, format_for(problem.mode), pairs));
}

std::string wgmma_reason(const QmmProblem& p, const CudaDevice& device) {
  if (p.gather) {
    return "a gather (the grouped path's)";
  }
  if (p.batch_count() != 1) {
    return "more than one matrix of W or x";
  }
  return wgmma_common_reason(
      p, device, wgmma_x_tiles_bytes(p, ceil_div(p.M, fc::kWgmmaXRows)));
}

int float32_parts_rows(const QmmProblem& p, const CudaDevice& device) {
  if (p.x_type != FloatType::float32 || p.gather || p.batch_count() != 1 ||
      float_scales(p) || !staged_reason(p, format_for(p.mode)).empty()) {
    return 0;
  }
  const QmmProblem parts = float32_parts(p);
  return wgmma_reason(parts, device).empty()
             ? wgmma_max_rows(format_for(p.mode).bits) / 2
         : tiled_reason(parts).empty() ? kTiledRows / 2
                                       : 0;
}

std::string_view path_name(KernelPath path) {
  constexpr std::array<std::string_view, 7> names = {
      "qmv", "qvm", "simple", "dequantize_matmul", "grouped", "tiled", "wgmma"};
  return names[static_cast<size_t>(path)];
}

int primitive_rows(const QmmProblem& problem, const CudaDevice& device) {
  const int parts_rows = float32_parts_rows(problem, device);
  return wgmma_reason(problem, device).empty()
             ? wgmma_max_rows(format_for(problem.mode).bits)
         : parts_rows > 0 && tf32_enabled_from_env() ? parts_rows
         : tiled_reason(problem).empty()             ? kTiledRows
                                                     : kSimpleRows;
}

bool dequantize_then_matmul(
    const QmmProblem& problem,
    const CudaDevice& device,
    KernelRequest request) {
  return request == KernelRequest::dequantize ||
         ((request == KernelRequest::automatic ||
           request == KernelRequest::grouped) &&
          problem.M > kSimpleRows &&
          problem.M > primitive_rows(problem, device));
}

GatherRows gather_rows(
    const QmmProblem& p, bool sorted_pairs, const CudaDevice& device) {
  constexpr int64_t k2to31 = int64_t(1) << 31;
  constexpr int64_t k2to32 = int64_t(1) << 32;
  const int64_t pairs = p.batch_count();
  const int64_t M = p.M;
  const int64_t N = p.N;
  const int64_t K = p.K;
  const bool grouped_path = grouped_gather(p);
  const int64_t experts = p.w_matrices;
  const int64_t x_bytes = itemsize(p.x_type);
  const int64_t dense_bytes = experts * N * K * x_bytes;
  const int64_t row_bytes = std::max(N, K) * x_bytes;
  return GatherRows{
      pairs * M,
      experts,
      dense_bytes,
      M == 1 && experts <= kGroupedGemmMaxExperts &&
          dense_bytes <= kGatherMaxDenseBytes && pairs * row_bytes <= k2to32,
      sorted_pairs && p.x_matrices == pairs,
      pairs <= kMaxGridZ && pairs * M * N < k2to31 &&
          p.x_matrices * M * K < k2to32 && experts * N * K < k2to32,
      grouped_path,
      grouped_path && grouped_tiled(p, KernelRequest::automatic),
      grouped_path && grouped_wgmma(p, device, KernelRequest::automatic)};
}

bool gather_dequantize_then_matmul(
    const GatherRows& gather, KernelRequest request) {
  if (request == KernelRequest::dequantize) {
    return gather.grouped || gather.other_kernels;
  }
  const bool automatic =
      request == KernelRequest::automatic ||
      (request == KernelRequest::grouped && !gather.grouped_path);
  return automatic && gather.grouped && !gather.wgmma &&
         gather.rows >= gather_rows_per_expert(gather) * gather.experts;
}

int64_t gather_rows_per_expert(const GatherRows& gather) {
  return gather.tiled          ? kGatherRowsPerExpertTiled
         : gather.grouped_path ? kGatherRowsPerExpert
                               : kGatherRowsPerExpertPerPair;
}

namespace {

constexpr RequestNames<KernelRequest, 8> kRequestNames = {
    {{"auto", KernelRequest::automatic},
     {"qmv", KernelRequest::decode},
     {"simple", KernelRequest::simple},
     {"qmv_staged", KernelRequest::staged},
     {"dequantize", KernelRequest::dequantize},
     {"grouped", KernelRequest::grouped},
     {"tiled", KernelRequest::tiled},
     {"wgmma", KernelRequest::wgmma}}};

}  // namespace

std::optional<KernelRequest> kernel_request_from_name(std::string_view name) {
  return request_from_name(kRequestNames, name);
}

std::string_view request_name(KernelRequest request) {
  return name_of(kRequestNames, request);
}

std::string request_names() {
  return listed(kRequestNames);
}

KernelRequest kernel_request_from_env() {
  return request_from_env(kRequestNames, "CUDA");
}

std::optional<CudaDevice> device_from_name(std::string_view name) {
  std::string_view digits;
  if (name.starts_with("sm_")) {
    digits = name.substr(3);
    if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f')) {
      digits.remove_suffix(1);
    }
  } else {
    return std::nullopt;
  }
  int number = 0;
  auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), number);
  if (error != std::errc() || end != digits.data() + digits.size() ||
      digits.size() < 2 || digits.size() > 3) {
    return std::nullopt;
  }
  // The SM counts of the usual part of each capability: A100, A10/RTX 30,
  // L40S/RTX 40, H100/H200, B200, RTX 50, GB10.
  struct Part {
    int capability;
    int sm_count;
  };
  constexpr std::array<Part, 7> kParts = {{
      {80, 108},
      {86, 84},
      {89, 142},
      {90, 132},
      {100, 148},
      {120, 170},
      {121, 48},
  }};
  Part found = kParts.front();
  for (auto part : kParts) {
    if (part.capability <= number) {
      found = part;
    }
  }
  return CudaDevice{number / 10, number % 10, found.sm_count};
}

KernelPlan plan(
    const QmmProblem& problem,
    const CudaDevice& device,
    KernelRequest request) {
  if (device.major < kMinimumMajor) {
    throw std::invalid_argument(
        "[cuda::plan] the kernels need compute capability 8.0 or later "
        "(mma.sync on bfloat16, cp.async); this GPU is " +
        std::to_string(device.major) + "." + std::to_string(device.minor) +
        ".");
  }
  if (auto split = plan_x_parts(problem, device, request)) {
    return *split;
  }
  const auto& p = problem;
  const Format& format = format_for(p.mode);
  KernelPlan plan{};
  plan.requested = request;
  plan.split_k_step = p.K;  // unsplit unless a split rule says otherwise
  fold_batch(p, plan);

  const std::string rows = "M=" + std::to_string(p.M);
  const bool decode_rows = p.M <= kDecodeRows;
  const std::string why_not_grouped =
      grouped_reason(p, format, plan.batch_count);
  const std::string why_not_tiled = tiled_reason(p);
  const std::string why_not_wgmma = wgmma_reason(p, device);
  const bool grouped_requested =
      request == KernelRequest::grouped ||
      ((request == KernelRequest::tiled || request == KernelRequest::wgmma) &&
       p.gather);
  if (grouped_requested
          ? why_not_grouped.empty()
          : request == KernelRequest::automatic &&
                grouped_by_default(plan.batch_count, why_not_grouped)) {
    const bool wgmma = grouped_wgmma(p, device, request);
    const bool tiled = !wgmma && grouped_tiled(p, request);
    plan.path = KernelPath::grouped;
    plan.note = grouped_requested
                    ? std::string(request_name(request)) + " requested"
                    : std::to_string(plan.batch_count) +
                          " pairs of one row (at least " +
                          std::to_string(kGroupedMinPairs) +
                          "): grouped by expert";
    if (wgmma) {
      plan_grouped_wgmma(p, format, device, plan);
    } else {
      plan_grouped(p, format, device, tiled, plan);
    }
    plan.note += ", W read once per run of " + std::to_string(plan.run_rows) +
                 (wgmma   ? " by fp_qmm_wgmma_grouped"
                  : tiled ? " by fp_qmm_grouped"
                          : "") +
                 (plan.grouping ? "" : " (the pairs grouped in each block)");
    return plan;
  }
  switch (request) {
    case KernelRequest::decode:
    case KernelRequest::staged:
      plan.path = p.transpose ? KernelPath::qmv : KernelPath::qvm;
      plan.note = std::string(request_name(request)) + " requested";
      break;
    case KernelRequest::simple:
      plan.path = KernelPath::simple;
      plan.note = "simple requested";
      break;
    case KernelRequest::tiled:
      if (why_not_tiled.empty()) {
        plan.path = KernelPath::tiled;
        plan.note = "tiled requested";
        break;
      }
      [[fallthrough]];
    case KernelRequest::wgmma:
      if (request == KernelRequest::wgmma && why_not_wgmma.empty()) {
        plan.path = KernelPath::wgmma;
        plan.note = "wgmma requested";
        break;
      }
      [[fallthrough]];
    case KernelRequest::automatic:
    case KernelRequest::dequantize:
    case KernelRequest::grouped: {
      const bool wgmma_rows = why_not_wgmma.empty() && p.M > kWgmmaMinRows;
      const bool simple_first =
          wgmma_rows && simple_before_wgmma(p, format, device);
      plan.path = decode_rows ? p.transpose ? KernelPath::qmv : KernelPath::qvm
                  : wgmma_rows && !simple_first            ? KernelPath::wgmma
                  : why_not_tiled.empty() && !simple_first ? KernelPath::tiled
                                                           : KernelPath::simple;
      plan.note =
          decode_rows ? rows + " is in the decode range (at most " +
                            std::to_string(kDecodeRows) + ")"
          : plan.path == KernelPath::wgmma
              ? rows + " is above " + std::to_string(kWgmmaMinRows) +
                    " rows: Hopper's warpgroup MMA"
          : simple_first
              ? rows + " is above the decode range: the decode kernels in " +
                    "blocks of 32 rows of x (wgmma's blocks of 128 W rows " +
                    "would not half fill the GPU)"
          : why_not_tiled.empty()
              ? rows + " is above the decode range: block tiles of W and x " +
                    "in shared memory"
              : rows + " is above the decode range: the decode kernels tiled " +
                    "over M (not block tiles: " + why_not_tiled + ")";
      if (request == KernelRequest::grouped) {
        plan.note = "grouped requested, not taken: " + why_not_grouped + "; " +
                    plan.note;
      }
      if (request == KernelRequest::tiled) {
        plan.note =
            "tiled requested, not taken: " + why_not_tiled + "; " + plan.note;
      }
      if (request == KernelRequest::wgmma) {
        plan.note =
            "wgmma requested, not taken: " + why_not_wgmma + "; " + plan.note;
      }
      if (!p.gather && dequantize_then_matmul(p, device, request)) {
        plan.note +=
            " (the op multiplies by dequantize + matmul here; this "
            "primitive was made elsewhere)";
      }
      break;
    }
  }

  // x @ W^T by the decode kernels: fp_qmv, or fp_qmv_staged for this reason.
  const bool qmv_family = p.transpose && plan.path != KernelPath::wgmma &&
                          plan.path != KernelPath::tiled;
  const std::string staged_why = !qmv_family ? ""
                                 : request == KernelRequest::staged
                                     ? "requested"
                                     : staged_reason(p, format);
  // The simple path's rows of one-part x in fp_qmv's blocks of 32 (simple
  // request, float32 and float16 x of two parts in blocks of 16): one pass
  // over W where blocks of 16 made two, measured faster at 24 and 32 rows
  // on an H100 at every size (docs/cuda-log.md, "Sixth session of
  // 2026-12-05": mxfp8 4096 x 4096 21.5 / 14.2 us, 14336 x 4096 72.4 / 47.4,
  // mxfp4 57.2 / 55.3).
  const bool simple_x_blocks = plan.path == KernelPath::simple && qmv_family &&
                               p.M > kDecodeRows && one_x_part(p) &&
                               staged_why.empty();
  const int x_blocks = plan.path == KernelPath::tiled ? qmm_x_blocks(p.M, false)
                       : plan.path == KernelPath::qmv && p.M <= fc::kXBlockRows
                           ? 1
                       : simple_x_blocks ? fc::kSimpleXBlocks
                                         : fc::kMaxXBlocks;
  KernelFamily family = KernelFamily::qvm;
  if (plan.path == KernelPath::wgmma) {
    family = KernelFamily::qmm_wgmma;
  } else if (plan.path == KernelPath::tiled) {
    family = KernelFamily::qmm;
  } else if (qmv_family) {
    family = staged_why.empty() ? KernelFamily::qmv : KernelFamily::qmv_staged;
    if (!staged_why.empty()) {
      plan.note += "; W staged in shared memory: " + staged_why;
    }
    if (family == KernelFamily::qmv && plan.path == KernelPath::qmv &&
        p.M <= kDecodeRows &&
        qmv_wide_blocks_fill(p, device, plan.batch_count, x_blocks)) {
      family = KernelFamily::qmv_wide;
      plan.note += "; wide blocks (they half fill the GPU)";
    }
  }
  const bool transposed_decode = family == KernelFamily::qmv ||
                                 family == KernelFamily::qmv_wide ||
                                 family == KernelFamily::qmv_staged;
  plan.key = KernelKey{
      family,
      format.bits,
      scale_encoding(p.mode, p.scale_type),
      p.x_type,
      family == KernelFamily::qmm_wgmma
          ? (wgmma_wide_x(p, device) ? fc::kWgmmaWideXRows
                                     : fc::wgmma_x_rows(p.M)) /
                fc::kXBlockRows
      : family == KernelFamily::qmm || transposed_decode ? x_blocks
                                                         : 0};
  if (family == KernelFamily::qmm_wgmma) {
    plan.key.w_tiles =
        plan.key.x_blocks * fc::kXBlockRows == fc::kWgmmaWideXRows
            ? 1
            : wgmma_tiles(p, device);
  }
  plan.main.kernel = kernel_name(plan.key);

  int64_t column_blocks;
  int64_t m_blocks;
  switch (family) {
    case KernelFamily::qmv:
    case KernelFamily::qmv_cluster: {
      column_blocks = ceil_div(p.N, fc::qmv_rows_per_block(one_x_part(p)));
      m_blocks = ceil_div(p.M, x_blocks * fc::kXBlockRows);
      plan.main.block = {fc::kQmvWarps * fc::kWarpSize, 1, 1};
      plan.main.shared_bytes = fc::qmv_shared_bytes(one_x_part(p), x_blocks);
      break;
    }
    case KernelFamily::qmv_wide:
      column_blocks = ceil_div(p.N, fc::kQmvWideRowsPerBlock);
      m_blocks = ceil_div(p.M, x_blocks * fc::kXBlockRows);
      plan.main.block = {fc::kQmvWideWarps * fc::kWarpSize, 1, 1};
      plan.main.shared_bytes =
          fc::qmv_shared_bytes(fc::kQmvWideWarps, fc::kQmvWideTiles, x_blocks);
      if (device.major == 9 && x_blocks == 1 &&
          fc::qmv_wide_may_share_x(
              scale_itemsize(scale_encoding(p.mode, p.scale_type)),
              itemsize(p.x_type)) &&
          qmv_wide_x_bytes(p) <= fc::kQmvWideMaxXBytes) {
        plan.x_in_shared = true;
        plan.main.shared_bytes += static_cast<int>(qmv_wide_x_bytes(p));
        plan.note += "; x in shared memory";
      }
      break;
    case KernelFamily::qmv_staged:
      column_blocks = ceil_div(p.N, fc::kStagedRowsPerBlock);
      m_blocks = ceil_div(p.M, x_blocks * fc::kXBlockRows);
      plan.main.block = {fc::kStagedWarps * fc::kWarpSize, 1, 1};
      plan.main.shared_bytes = fc::staged_shared_bytes(
          format.bits, scale_itemsize(plan.key.encoding));
      break;
    case KernelFamily::qmm_wgmma: {
      const int x_rows = plan.key.x_blocks * fc::kXBlockRows;
      const int64_t x_tiles = ceil_div(p.M, fc::kWgmmaXRows);
      column_blocks = ceil_div(p.N, fc::wgmma_rows_per_block(plan.key.w_tiles));
      m_blocks = ceil_div(p.M, x_rows);
      plan.main.block = {fc::kWgmmaThreads, 1, 1};
      plan.main.shared_bytes =
          fc::wgmma_shared_bytes(format.bits, plan.key.w_tiles, x_rows);
      plan.x_tiles = Launch{
          "fpqmm_wgmma_tile_x_" + std::string(codes_name(format.bits)),
          {static_cast<int>(
               x_tiles * ceil_div(p.K, fc::wgmma_stage_codes(format.bits))),
           1,
           1},
          {fc::kWgmmaTileXThreads, 1, 1},
          0};
      plan.x_tiles_bytes = wgmma_x_tiles_bytes(p, x_tiles);
      break;
    }
    case KernelFamily::qmm:
      column_blocks = ceil_div(p.N, fc::kQmmRowsPerBlock);
      m_blocks = ceil_div(p.M, x_blocks * fc::kXBlockRows);
      plan.main.block = {fc::kQmmThreads, 1, 1};
      plan.main.shared_bytes = qmm_shared_bytes(p, format, x_blocks);
      break;
    default:
      column_blocks = ceil_div(p.N, fc::kQvmColumnsPerBlock);
      m_blocks = ceil_div(p.M, fc::kQvmRows);
      plan.main.block = {fc::kQvmWarps * fc::kWarpSize, 1, 1};
      plan.main.shared_bytes = fc::kQvmSharedBytes;
      break;
  }
  const int64_t blocks = column_blocks * m_blocks * plan.batch_count;
  switch (family) {
    case KernelFamily::qmv:
    case KernelFamily::qmv_cluster: {
      const int pass = fc::qmv_pass_codes(format.bits);
      const std::string note = plan.note;
      const auto split = [&](int resident) {
        plan.note = note;
        plan_split_k(
            p, device, blocks, resident, pass, fc::kQmvWarps * pass, plan);
      };
      split(fc::qmv_split_resident(one_x_part(p), x_blocks));
      // x split into two parts (two tiles a warp) keeps a split smaller
      // than the cluster's in partial sums: measured faster on the H200
      // (docs/cuda-log.md), where the cluster's more splits cost more than the
      // partials' kernel.
      const bool cluster_pays =
          one_x_part(p) || plan.split_k >= fc::kClusterSplits;
      const bool cluster_fits = device.major >= 9 && plan.split_k > 1 &&
                                plan.split_k <= kMaxClusterSplit;
      if (cluster_fits && cluster_pays) {
        split_in_cluster(p, pass, plan);
      }
      // fp_qmv's own blocks an SM, where they are fewer than the cluster's.
      if (!plan.splits_in_cluster &&
          fc::qmv_one_block_an_sm(itemsize(p.x_type), x_blocks, format.bits)) {
        split(1);
      }
      if (cluster_fits && !cluster_pays && plan.split_k > 1) {
        plan.note += "; partial sums, not a cluster's " +
                     std::to_string(fc::kClusterSplits) +
                     " splits (measured faster for " +
                     std::string(type_name(p.x_type)) + " x)";
      }
      break;
    }
    case KernelFamily::qmv_wide:  // its blocks half fill the GPU: unsplit
      break;
    case KernelFamily::qmv_staged:
      plan_split_k(
          p,
          device,
          blocks,
          kStagedResident,
          fc::kStageCodes,
          fc::kStagedWarps * fc::kStageCodes,
          plan);
      break;
    case KernelFamily::qmm_wgmma:
      // Whole waves: a wgmma block's splits are long, and a second wave's
      // few blocks would take as long as the first.
      plan_split_k(
          p,
          device,
          blocks,
          1,
          fc::wgmma_stage_codes(format.bits),
          kWgmmaMinSplitStages * fc::wgmma_stage_codes(format.bits),
          plan,
          true);
      break;
    case KernelFamily::qmm:
      plan_split_k(
          p,
          device,
          blocks,
          fc::qmm_min_blocks(x_blocks),
          fc::qmm_stage_codes(format.bits),
          4 * fc::qmm_stage_codes(format.bits),
          plan);
      break;
    default:
      plan_split_k(
          p, device, blocks, kQvmResident, fc::kQvmChunk, fc::kQvmChunk, plan);
      break;
  }
  plan.main.grid = {
      static_cast<int>(column_blocks),
      // A multiple of split_k: the blocks of a y index share their split.
      static_cast<int>(std::min<int64_t>(
          m_blocks * plan.split_k, kMaxGridYZ / plan.split_k * plan.split_k)),
      static_cast<int>(std::min<int64_t>(plan.batch_count, kMaxGridYZ))};
  if (blocks == 0) {
    plan.note += "; empty output: nothing to launch";
  }
  if (plan.main.shared_bytes > fc::kDefaultSharedLimit) {
    plan.note += "; " + std::to_string(plan.main.shared_bytes) +
                 " bytes of shared memory (opt-in)";
  }
  return plan;
}

namespace {

struct PlanKey {
  QmmProblem problem;
  CudaDevice device;
  KernelRequest request;
  bool operator==(const PlanKey&) const = default;
};

// Over the fields that tell a decoding step's products apart; equal keys
// compare every field.
struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    const QmmProblem& p = key.problem;
    size_t hash = 0;
    for (int64_t value :
         {int64_t(p.mode),
          int64_t(p.x_type),
          int64_t(p.M),
          int64_t(p.N),
          int64_t(p.K),
          int64_t(p.transpose),
          p.batch_count(),
          int64_t(p.pointer_alignment),
          int64_t(key.request),
          int64_t(key.device.sm_count)}) {
      hash = hash * 1000003u ^ std::hash<int64_t>{}(value);
    }
    return hash;
  }
};

}  // namespace

const KernelPlan& cached_plan(
    const QmmProblem& problem,
    const CudaDevice& device,
    KernelRequest request) {
  thread_local std::unordered_map<PlanKey, KernelPlan, PlanKeyHash> plans;
  PlanKey key{problem, device, request};
  if (auto it = plans.find(key); it != plans.end()) {
    return it->second;
  }
  auto made = plan(problem, device, request);
  if (plans.size() >= kCachedPlans) {
    plans.clear();
  }
  return plans.emplace(std::move(key), std::move(made)).first->second;
}

DequantizePlan plan_dequantize(
    int64_t rows,
    int K,
    int bits,
    ScaleEncoding encoding,
    FloatType out_type,
    const CudaDevice& device) {
  if (device.major < kMinimumMajor) {
    throw std::invalid_argument(
        "[cuda::plan_dequantize] the kernels need compute capability 8.0 or "
        "later.");
  }
  DequantizePlan plan;
  plan.key = KernelKey{KernelFamily::dequantize, bits, encoding, out_type, 0};
  plan.launch = grid_stride_launch(
      kernel_name(plan.key),
      rows * K / (32 / bits),
      fc::kDequantizeThreads,
      fc::kDequantizeBlocksPerSm,
      device);
  return plan;
}

Launch plan_strided_copy(int64_t elements, const CudaDevice& device) {
  return grid_stride_launch(
      "fpqmm_strided_copy",
      elements,
      fc::kCopyThreads,
      fc::kCopyBlocksPerSm,
      device);
}

fpqmm::cuda::QmmArgs kernel_args(
    const QmmProblem& problem, const KernelPlan& plan) {
  fc::QmmArgs args{};
  args.M = problem.M * plan.x_parts;
  args.x_parts = plan.x_parts;
  args.N = problem.N;
  args.K = problem.K;
  args.group_size = problem.group_size;
  args.batch_ndims = static_cast<int>(plan.batch_shape.size());
  for (size_t axis = 0; axis < plan.batch_shape.size(); ++axis) {
    args.batch_shape[axis] = plan.batch_shape[axis];
    args.x_batch_strides[axis] = plan.x_batch_strides[axis];
    args.w_batch_strides[axis] = plan.w_batch_strides[axis];
    args.scales_batch_strides[axis] = plan.scales_batch_strides[axis];
  }
  args.batch_count = plan.batch_count;
  args.x_matrices = problem.x_matrices;
  args.lhs_divisor = problem.lhs_divisor;
  args.w_matrices = problem.w_matrices;
  args.split_k = plan.split_k;
  args.split_k_step = plan.split_k_step;
  args.run_rows = plan.run_rows;
  args.tile_major_shares = plan.tile_major_shares;
  args.x_in_shared = plan.x_in_shared;
  return args;
}

}  // namespace mlx_fpqmm::cuda
