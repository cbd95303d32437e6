// Every decision of the CUDA path in plain C++ (built and tested on Linux
// without a GPU): which kernel instantiation a call runs, on what grid, with
// how much shared memory, split K and scratch. eval_gpu only carries a plan
// out.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/problem.h"
#include "backend/cuda/kernels/params.h"
#include "common/formats.h"

namespace mlx_fpqmm::cuda {

// What the plan needs to know about the GPU.
struct CudaDevice {
  int major = 0;  // compute capability
  int minor = 0;
  int sm_count = 0;
  bool operator==(const CudaDevice&) const = default;
};

// "sm_90", "sm_90a", "sm_121": the capability, with the SM count of the
// usual part of that capability (H100/H200: 132); nothing for other names.
std::optional<CudaDevice> device_from_name(std::string_view name);

// The kernels need mma.sync on bfloat16 and cp.async: sm_80 and later.
inline constexpr int kMinimumMajor = 8;

// qmv / qvm: the decode kernels (x @ W^T / x @ W) for M up to kDecodeRows;
// tiled: x @ W^T above the decode range by fp_qmm (block tiles of W and x
// staged in shared memory), where it runs (tiled_reason);
// simple: the decode kernels tiled over M, above the decode range where
// fp_qmm does not run, and on sm_90 up to 32 rows where fp_qmm_wgmma's
// blocks would not half fill the GPU (x of one part: in blocks of 32 rows);
// dequantize_matmul: above primitive_rows (kTiledRows, kSimpleRows where
// fp_qmm does not run, wgmma's and the float32 parts' own limits) the op
// builds x @ dequantize(w) instead of the primitive: W in x's type by our
// FpDequantize, the product by MLX's matmul (cuBLAS).
// grouped: a gather of one row per pair, the pairs grouped by expert first
// (fp_group_pairs) and each expert's run multiplied by fp_qmv_grouped, or
// by fp_qmm_grouped from kTiledGroupRows rows an expert.
// wgmma: x @ W^T with bfloat16 x on sm_90 (Hopper) by fp_qmm_wgmma, past
// kWgmmaMinRows rows up to wgmma_max_rows, where it runs (wgmma_reason);
// fp_wgmma_tile_x lays x out for it first. float32 x with the MLX formats'
// scales takes it, or tiled elsewhere, as bfloat16 parts of twice the rows
// (float32_parts_rows).
enum class KernelPath {
  qmv,
  qvm,
  simple,
  dequantize_matmul,
  grouped,
  tiled,
  wgmma
};
enum class KernelRequest {
  automatic,
  decode,
  simple,
  staged,
  dequantize,
  grouped,
  tiled,
  wgmma
};

inline constexpr int kDecodeRows =
    fpqmm::cuda::kMaxXBlocks * fpqmm::cuda::kXBlockRows;
// The most rows of x per W matrix that the simple path takes by default: past
// it dequantizing W once (FpDequantize) and a dense GEMM cost less. Measured
// on the H200 (docs/cuda-log.md), 14336 x 4096, simple / dequantize +
// matmul: M = 32 mxfp4 64.6 / 89.8 us, nvfp4 71.7 / 93.4, mxfp8 91.2 /
// 130.5; M = 48 98.7 / 88.9, 99.5 / 100.4, 131.6 / 121.1.
inline constexpr int kSimpleRows = 40;
// float32 x split once into bfloat16 parts (plan_x_parts) for the decode
// kernels up to kXPartsMaxRows rows, where W has at least
// kXPartsMinWeightBytes (past them fp_qmm_wgmma and fp_qmm take parts: see
// plan_x_parts): measured
// on the H200 (docs/cuda-log.md), M = 1, it takes 14336 x 4096 mxfp4 from 24.1
// to 20.0 us and 4096 x 4096 from 15.4 to 12.8, but 1024 x 4096 (2 MiB)
// from 7.7 to 10.7 (two more launches). At M = 8 (two x blocks of parts) it
// was slower while the parts went to partial sums (31.5 to 38.9); with each
// row's parts added as y is stored and wide blocks of two x blocks, an H100
// measured 14336 x 4096 from 31.8 to 24.8 and 4096 x 4096 from 20.1 to 12.9
// ("Fourth session of 2026-12-07").
inline constexpr int kXPartsMaxRows = fpqmm::cuda::kXBlockRows;
inline constexpr int64_t kXPartsMinWeightBytes = int64_t(8) << 20;
// The same for the tiled path (fp_qmm).
inline constexpr int kTiledRows = 128;
static_assert(kTiledRows >= kSimpleRows);
// fp_qmm takes 32 rows of x a block up to kQmmSmallRows rows per W matrix,
// 64 above, and in the grouped gather 64 from kQmmGroupedLargeRows rows an
// expert on average. Measured on the H200 (docs/cuda-log.md), 14336 x 4096
// mxfp4, 32 / 64 rows: M = 64 63.4 / 64.8 us, M = 128 124.8 / 95.5; gather, 32
// experts of 2880 x 2880, 128 tokens (16 an expert) 120 / 172, 512 tokens (64)
// 274 / 255.
inline constexpr int kQmmSmallRows = 64;
inline constexpr int kQmmGroupedLargeRows = 64;

// Why fp_qmm cannot take `problem` (x @ W^T, bfloat16 or float16 x, rows of
// W whole 16-byte vectors, x and w 16-byte and the scales 4-byte aligned);
// empty when it can.
std::string tiled_reason(const QmmProblem& problem);

// The rows of x per W matrix from which (above kWgmmaMinRows: every row
// count past the decode range) and up to which (wgmma_max_rows) fp_qmm_wgmma
// takes a product where it runs (more rows: dequantize + matmul). Measured
// on the H200 through MLX (docs/cuda-log.md, "Fourth session of
// 2026-12-04"): with its blocks of 64 rows of x, fp_qmm_wgmma beats fp_qmm
// from 24 rows at 14336 x 4096 and 4096 x 4096 (at 17 to 23 rows both take
// as long as at 24). Since its blocks of 256 rows of x, it beats dequantize
// + matmul up to 1024 rows with E2M1 codes and 768 with E4M3 (H100 through
// MLX, mxfp4 and mxfp8 at 768, 1024 and 2048 rows: docs/cuda-log.md, "Third
// session of 2026-12-06").
inline constexpr int kWgmmaMinRows = kDecodeRows;
constexpr int wgmma_max_rows(int bits) {
  return bits == 4 ? 1024 : 768;
}
// Why fp_qmm_wgmma cannot take `problem` on `device` (sm_90, x @ W^T of one
// matrix of W, bfloat16 x, K a multiple of the stage, N of 8, and what
// fp_qmm needs of W and its alignment); empty when it can.
std::string wgmma_reason(const QmmProblem& problem, const CudaDevice& device);

// A gather whose pairs are one row each takes the grouped path from this
// many pairs (below it the experts seldom repeat: the per-pair decode
// kernels read the same bytes without the grouping kernel).
inline constexpr int64_t kGroupedMinPairs = 8;
// The grouped path multiplies with fp_qmm_grouped (runs of up to 32 or 64
// pairs) from this many pairs an expert, on average, where fp_qmm runs.
// Measured on an H100 (docs/cuda-log.md, "Fourth session of 2026-12-06"),
// 32 experts of 2880 x 2880, top 4, kernels alone, unsorted, fp_qmv_grouped
// in runs of 8 / fp_qmm_grouped: 64 tokens (8 pairs an expert) 87.4 / 114.9
// us, 128 tokens (16) 140.5 / 120.5; the lines cross near 12.
inline constexpr int kTiledGroupRows = 12;
// ... and with fp_qmm_wgmma_grouped (runs of up to 128 pairs) from this
// many on sm_90 where it runs (bfloat16 x). Measured on the H200
// (docs/cuda-log.md), 32 experts of 2880 x 2880, kernels alone, fp_qmm_grouped
// / fp_qmm_wgmma_grouped: 128 tokens (16 pairs an expert) 121.2 / 192.6 us, 512
// tokens (64) 263.9 / 181.8; between them not measured. Where it runs, the op
// never takes dequantize + gather_mm by default: through MLX,
// fp_qmm_wgmma_grouped took 3.8-4.5x less time at 2,048 and 8,192 tokens
// than dequantize + gather_mm had in an earlier session (not side by side).
inline constexpr int kWgmmaGroupRows = 48;

// Whether the op multiplies the M rows of x per W matrix of `problem` (not
// a gather) by dequantize + matmul rather than with the primitive: above
// primitive_rows, when automatic (or grouped requested: it runs only for
// gathers), or on request (any M).
bool dequantize_then_matmul(
    const QmmProblem& problem, const CudaDevice& device, KernelRequest request);
// The most rows per W matrix that the primitive takes for `problem` on
// `device` when automatic: for float32 x in bfloat16 parts (twice the rows)
// float32_parts_rows where MLX_ENABLE_TF32 allows reduced precision (the
// parts keep 16 significant bits of x, TF32 11), else kSimpleRows.
int primitive_rows(const QmmProblem& problem, const CudaDevice& device);
// The most rows of float32 x that fp_qmm_wgmma or else fp_qmm take in
// bfloat16 parts for `problem` on `device` (half their rows; plan_x_parts),
// 0 where neither takes them.
int float32_parts_rows(const QmmProblem& problem, const CudaDevice& device);

// A gather (mixture of experts) without lhs_indices, as the choice of
// dequantize + gather_mm sees it: every expert dequantized in x's type, then
// MLX's gather_mm. Its grouped GEMM (CUTLASS) takes pairs of one row each,
// sorted by expert with x in pair order (the op sorts the pairs on the
// device when they do not come so), up to kGroupedGemmMaxExperts experts,
// and offsets its pointers in 32-bit arithmetic: an expert's start in
// signed, a pair's row of x and of y in unsigned bytes. Its other kernels
// put the pairs on a grid axis (at most kMaxGridZ of them) and offset y by
// pairs in signed, x and W by matrices in unsigned 32-bit elements.
struct GatherRows {
  int64_t rows;         // pairs times M
  int64_t experts;      // matrices of W
  int64_t dense_bytes;  // the experts dequantized
  bool grouped;         // the grouped GEMM takes it
  bool in_order;        // sorted pairs, x in pair order: no sort needed
  bool other_kernels;   // MLX's other gather_mm kernels take it
  bool grouped_path;    // our grouped path would take it (else per pair)
  bool tiled;           // ... with fp_qmm_grouped
  bool wgmma;           // ... with fp_qmm_wgmma_grouped (never dequantized)
};
// The gather `problem` (the primitive's, x row-contiguous and 16-byte
// aligned unless its pointer_alignment says otherwise) as that choice sees
// it. sorted_pairs: the caller says the pairs' indices are sorted (sorted
// indices that no broadcast repeats).
// `device`: the GPU (by default none that runs fp_qmm_wgmma_grouped).
GatherRows gather_rows(
    const QmmProblem& problem,
    bool sorted_pairs,
    const CudaDevice& device = {});
// Sorted rhs_indices make sorted pairs unless a broadcast repeats them:
// `rhs_given` indices were given for `pairs` pairs.
inline bool sorted_pairs(bool right_sorted, int64_t rhs_given, int64_t pairs) {
  return right_sorted && rhs_given == pairs;
}

// Whether the primitive's plan takes the gather `problem` by the grouped
// path when automatic.
bool grouped_gather(const QmmProblem& problem);

inline constexpr int kGroupedGemmMaxExperts = 1024;
inline constexpr int64_t kMaxGridZ = 65535;
// Measured on the H200 (docs/cuda-log.md; both paths forced, one device run),
// 32 experts of 2880 x 2880, top 4, mxfp4, sorted, the grouped path /
// dequantize + gather_mm: 1,024 tokens (128 rows an expert) 1218 / 1274 us,
// 1,536 tokens (192) 1833 / 1415.
inline constexpr int kGatherRowsPerExpert = 192;
// Against the per-pair kernels (gathers the grouped path does not take), the
// same run, the per-pair x @ W^T kernel (the simple request at one row a
// pair) / dequantize + gather_mm, sorted: 64 tokens (8 rows an expert) 848 /
// 1070 us, 96 tokens (12) 1222 / 1098. Not measured for x @ W or the staged
// kernel.
inline constexpr int kGatherRowsPerExpertPerPair = 12;
// Against the grouped path with fp_qmm_grouped.
inline constexpr int kGatherRowsPerExpertTiled = 2048;
// The transient copy of the experts stays below this (a DeepSeek-V3 layer's
// 256 experts of 7168 x 2048 would take 7.5 GB), which also keeps the
// grouped GEMM's expert offsets within 2^31 bytes.
inline constexpr int64_t kGatherMaxDenseBytes = int64_t(1) << 31;

// Whether such a gather takes dequantize + gather_mm: pairs the grouped GEMM
// takes, from kGatherRowsPerExpert rows per expert (kGatherRowsPerExpertPerPair
// where our grouped path does not run), within the bytes above, when
// automatic (or grouped requested where the grouped path does not run); or
// on request (any layout MLX's kernels take).
bool gather_dequantize_then_matmul(
    const GatherRows& gather, KernelRequest request);
// The rows per expert from which the automatic choice takes it.
int64_t gather_rows_per_expert(const GatherRows& gather);

std::string_view path_name(KernelPath path);
std::optional<KernelRequest> kernel_request_from_name(std::string_view name);
std::string_view request_name(KernelRequest request);  // "auto", ...
std::string request_names();  // "auto, qmv, ...", for messages
// MLX_FPQMM_KERNEL=auto|qmv|simple|qmv_staged|dequantize|grouped|tiled|wgmma
// (unset: auto; qmv asks for the decode kernels of either orientation, per
// gather pair, qmv_staged for x @ W^T's kernel that stages W in shared
// memory, grouped for the grouped gather where it runs, tiled for fp_qmm
// at any M, and in the grouped gather, where it runs, wgmma for
// fp_qmm_wgmma at any M where it runs); throws on other values.
KernelRequest kernel_request_from_env();

// The main kernel and its template arguments: fp_qmv<T, bits, encoding,
// x_blocks> (x_blocks 1, kMaxXBlocks or kSimpleXBlocks), fp_qmv_wide<T,
// bits, encoding, x_blocks> (fp_qmv in wide blocks, x_blocks 1 or
// kMaxXBlocks), fp_qmv_staged<...>,
// fp_qvm<T, bits, encoding> (x_blocks 0), fp_qmv_cluster<T, bits, encoding,
// x_blocks> (fp_qmv with K split over a thread block cluster, sm_90; as
// fp_qmv), fp_qmv_grouped<T, bits, encoding, x_blocks> (x_blocks 1 or
// kMaxXBlocks), fp_qmm<T, bits, encoding> and fp_qmm_grouped<T,
// bits, encoding> (x_blocks kQmmSmallXBlocks or kQmmLargeXBlocks; T bfloat16 or
// float16), fp_qmm_wgmma<bits, encoding, w_tiles, x_rows> (w_tiles 1 or 2,
// x_blocks x_rows / 8: wgmma_x_rows of M, or kWgmmaWideXRows with w_tiles
// 1) and fp_qmm_wgmma_grouped<bits,
// encoding, 2> (x_blocks kWgmmaXRows / 8; bfloat16 x) or FpDequantize's
// fp_dequantize<T, bits, encoding> (T the output's type, x_blocks 0).
enum class KernelFamily {
  qmv,
  qmv_staged,
  qvm,
  qmv_cluster,
  dequantize,
  qmv_grouped,
  qmm,
  qmm_grouped,
  qmm_wgmma,
  qmm_wgmma_grouped,
  qmv_wide
};

struct KernelKey {
  KernelFamily family;
  int bits;
  ScaleEncoding encoding;
  FloatType x_type;
  int x_blocks;
  int w_tiles = 0;  // qmm_wgmma: tiles of 64 W rows per warpgroup
};

struct Launch {
  std::string kernel;
  std::array<int, 3> grid;
  std::array<int, 3> block;
  int shared_bytes = 0;  // dynamic
};

struct KernelPlan {
  KernelRequest requested;
  KernelPath path;
  std::string note;  // why, including why not the requested path
  KernelKey key;
  Launch main;
  // Split K: the main kernel writes split_k float32 slices of partial sums
  // (partials_bytes of scratch) and `reduction` (fp_split_k_sum<T>) adds
  // them into y; or, splits_in_cluster (fp_qmv_cluster), the
  // fpqmm::cuda::kClusterSplits splits of a cluster add up in its shared
  // memory and the main kernel writes y. split_k 1: the main kernel writes
  // y.
  int split_k = 1;
  bool splits_in_cluster = false;
  int split_k_step = 0;  // codes of K per split
  int64_t partials_bytes = 0;
  std::optional<Launch> reduction;
  // The grouped path: `grouping` (fp_group_pairs) runs first and writes
  // grouping_bytes of scratch (fpqmm::cuda::place_grouping_scratch's layout,
  // room for max_runs runs); none where fp_qmv_grouped's blocks group the
  // pairs themselves (up to kBlockGroupMaxPairs).
  std::optional<Launch> grouping;
  int64_t grouping_bytes = 0;
  int max_runs = 0;
  int run_rows = 0;  // pairs per run at most
  // fp_qmv_grouped's shares tile by tile over every run (QmmArgs's rule).
  bool tile_major_shares = false;
  // The wgmma path: `x_tiles` (fp_wgmma_tile_x) runs first and writes x in
  // its tiles into x_tiles_bytes of scratch.
  std::optional<Launch> x_tiles;
  int64_t x_tiles_bytes = 0;
  // x split into parts (x_parts 2: float32 x, plan_x_parts's rule):
  // `x_split` (fp_split_x) runs first and writes x's
  // bfloat16 high and low parts, x_split_bytes of scratch (passed as
  // QmmArgs::x_tiles), which the main kernel (a bfloat16 decode kernel, or
  // fp_qmm's and fp_qmm_wgmma's instantiations for float32 x's key)
  // multiplies as twice the rows, adding each row's two as it stores y (with
  // K split, into partials that `reduction` adds up).
  std::optional<Launch> x_split;
  int64_t x_split_bytes = 0;
  int x_parts = 1;
  // fp_qmv_wide with float scales: x copied into the block's shared memory
  // (counted in main.shared_bytes), W held further ahead.
  bool x_in_shared = false;
  // The batch axes the kernels walk: the problem's, with axes that are
  // contiguous in x, w and scales alike folded together.
  std::vector<int> batch_shape;
  std::vector<int64_t> x_batch_strides;
  std::vector<int64_t> w_batch_strides;
  std::vector<int64_t> scales_batch_strides;
  int64_t batch_count = 1;
};

// The primitive's plan (never dequantize_matmul: a dequantize request or
// an M that dequantize_then_matmul takes plans as automatic, for a primitive
// made elsewhere, e.g. by a vjp). Throws std::invalid_argument for a device
// the kernels do not run on.
KernelPlan plan(
    const QmmProblem& problem, const CudaDevice& device, KernelRequest request);
// plan(), made once per problem, device and request on this thread and then
// looked up: a decoding step multiplies the same shapes at every token, and
// making a plan (its names and notes) costs the host more than the lookup.
// The reference is valid until a later call on this thread makes a plan
// while kCachedPlans are kept (it then starts afresh).
const KernelPlan& cached_plan(
    const QmmProblem& problem, const CudaDevice& device, KernelRequest request);
// The plans that cached_plan keeps on a thread at most (past them it starts
// afresh).
inline constexpr size_t kCachedPlans = 256;

// FpDequantize's launch: `rows` rows of K codes (every matrix of W) into
// `out_type`.
struct DequantizePlan {
  KernelKey key;
  Launch launch;
};
DequantizePlan plan_dequantize(
    int64_t rows,
    int K,
    int bits,
    ScaleEncoding encoding,
    FloatType out_type,
    const CudaDevice& device);

// fp_strided_copy's launch for `elements` elements.
Launch plan_strided_copy(int64_t elements, const CudaDevice& device);

// The kernel argument block of a plan, without the pointers (the caller
// fills w, scales, global_scale, x, y, partials and, for gather, the
// indices).
fpqmm::cuda::QmmArgs kernel_args(
    const QmmProblem& problem, const KernelPlan& plan);

}  // namespace mlx_fpqmm::cuda
