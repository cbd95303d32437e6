// Unit test of the CUDA plan (plain C++, no GPU): built and run by
// tests/test_cuda_plan.py. Prints each failed check; exits 1 on any.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>

#include "backend/cuda/plan.h"

namespace {

using mlx_fpqmm::FloatType;
using mlx_fpqmm::Mode;
using mlx_fpqmm::QmmProblem;
using mlx_fpqmm::ScaleEncoding;
namespace cu = mlx_fpqmm::cuda;

int failures = 0;

void check(bool condition, const std::string& what) {
  if (!condition) {
    std::printf("FAIL: %s\n", what.c_str());
    ++failures;
  }
}

QmmProblem problem(Mode mode, bool transpose, int M, int N, int K) {
  QmmProblem p{};
  p.mode = mode;
  p.group_size = mlx_fpqmm::format_for(mode).default_group_size;
  p.transpose = transpose;
  p.M = M;
  p.N = N;
  p.K = K;
  p.x_type = FloatType::bfloat16;
  if (mlx_fpqmm::format_for(mode).scales == mlx_fpqmm::ScaleKind::floating) {
    p.scale_type = FloatType::float16;
  }
  return p;
}

// x @ W^T with float32 x.
QmmProblem float32_problem(Mode mode, int M, int N, int K) {
  QmmProblem p = problem(mode, true, M, N, K);
  p.x_type = FloatType::float32;
  return p;
}

// A gather of `pairs` pairs over x_matrices matrices of x (M x K) and
// `experts` mxfp4 experts (N x K), x @ W^T (or x @ W).
QmmProblem gather_problem(
    int pairs,
    int M,
    int N,
    int K,
    int x_matrices,
    int experts,
    FloatType x_type = FloatType::bfloat16,
    bool transpose = true) {
  QmmProblem p = problem(Mode::mxfp4, transpose, M, N, K);
  p.x_type = x_type;
  p.gather = true;
  p.batch_shape = {pairs};
  p.x_matrices = x_matrices;
  p.w_matrices = experts;
  return p;
}

// The automatic plan of `p` on `device`.
cu::KernelPlan auto_plan(const QmmProblem& p, const cu::CudaDevice& device) {
  return cu::plan(p, device, cu::KernelRequest::automatic);
}

// The kernel family the automatic plan picks on an H200.
cu::KernelFamily family_on_h200(const QmmProblem& p) {
  return auto_plan(p, *cu::device_from_name("sm_90")).key.family;
}

template <typename F>
bool throws(F&& f) {
  try {
    f();
  } catch (const std::exception&) {
    return true;
  }
  return false;
}

}  // namespace

int main() {
  const auto h200 = *cu::device_from_name("sm_90");
  check(h200.major == 9 && h200.minor == 0 && h200.sm_count == 132, "sm_90");
  const auto a100 = cu::CudaDevice{8, 0, 108};
  check(cu::device_from_name("sm_90a")->sm_count == 132, "sm_90a");
  const auto gb10 = cu::device_from_name("sm_121");
  check(gb10 && gb10->major == 12 && gb10->minor == 1, "sm_121");
  check(
      !cu::device_from_name("gfx90a") && !cu::device_from_name("sm_9"),
      "other names");
  check(
      throws([&] {
        auto_plan(problem(Mode::mxfp4, true, 1, 64, 64), {7, 5, 40});
      }),
      "sm_75 is refused");

  // Decode: 448 wide blocks of 32 rows half fill the GPU (at least 264 of
  // its 528 slots): fp_qmv_wide, never split.
  auto big = auto_plan(problem(Mode::mxfp4, true, 1, 14336, 4096), h200);
  check(big.path == cu::KernelPath::qmv, "14336x4096 qmv");
  check(
      big.main.kernel == "fpqmm_qmv_wide_e2m1_e8m0_bfloat16_x8",
      big.main.kernel);
  check(big.main.grid == std::array<int, 3>{448, 1, 1}, "14336 grid");
  check(big.main.block == std::array<int, 3>{128, 1, 1}, "block");
  check(
      big.key.family == cu::KernelFamily::qmv_wide &&
          big.main.shared_bytes == 4 * 2 * 4 * 32 * 4,
      "wide blocks' sums");
  check(
      big.split_k == 1 && big.split_k_step == 4096 && !big.reduction &&
          big.partials_bytes == 0,
      "no split");
  check(
      !big.x_in_shared &&
          !cu::kernel_args(problem(Mode::mxfp4, true, 1, 14336, 4096), big)
               .x_in_shared,
      "byte scales: x a pass ahead in registers");
  // Float scales: x copied into shared memory while it takes at most
  // kQmvWideMaxXBytes (4 rows of 4096 bfloat16 values), not at 8 rows.
  for (int M : {1, 4, 8}) {
    const auto float_scales = problem(Mode::fp8, true, M, 14336, 4096);
    const auto plan = auto_plan(float_scales, h200);
    const bool shared = M <= 4;
    check(
        plan.key.family == cu::KernelFamily::qmv_wide &&
            plan.x_in_shared == shared &&
            cu::kernel_args(float_scales, plan).x_in_shared == shared &&
            plan.main.shared_bytes ==
                4 * 2 * 4 * 32 * 4 + (shared ? M * 4096 * 2 : 0),
        "float scales, M = " + std::to_string(M) + ": x in shared memory " +
            std::to_string(plan.main.shared_bytes));
  }
  // Two x blocks keep x in registers, though 12 rows of 1024 would fit.
  const auto two_blocks = problem(Mode::fp8, true, 12, 14336, 1024);
  const auto two_blocks_plan = auto_plan(two_blocks, h200);
  check(
      two_blocks_plan.key.family == cu::KernelFamily::qmv_wide &&
          two_blocks_plan.key.x_blocks == 2 && !two_blocks_plan.x_in_shared &&
          two_blocks_plan.main.shared_bytes == 4 * 2 * 2 * 4 * 32 * 4,
      "float scales, two x blocks: x in registers");
  // Measured on sm_90 only, whose shared memory holds 4 such blocks an SM.
  const auto float_scales_elsewhere =
      auto_plan(problem(Mode::fp8, true, 1, 14336, 4096), *gb10);
  check(
      float_scales_elsewhere.key.family == cu::KernelFamily::qmv_wide &&
          !float_scales_elsewhere.x_in_shared,
      "float scales on sm_121: x in registers");
  // float32 x of up to 8 rows and 8 MiB of W or more: split once into
  // bfloat16 high and low parts, multiplied by bfloat16's kernel as twice
  // the rows, which adds each row's two as it stores y (no partials).
  auto big_f32 = problem(Mode::mxfp8, true, 4, 14336, 4096);
  big_f32.x_type = FloatType::float32;
  const auto big_f32_plan = auto_plan(big_f32, h200);
  check(
      big_f32_plan.main.kernel == "fpqmm_qmv_wide_e4m3_e8m0_bfloat16_x8" &&
          big_f32_plan.x_parts == 2 && big_f32_plan.split_k == 1,
      "float32 x in parts: " + big_f32_plan.main.kernel);
  check(
      big_f32_plan.x_split &&
          big_f32_plan.x_split->kernel == "fpqmm_split_x_float32" &&
          big_f32_plan.x_split_bytes == 8 * 4096 * 2 &&
          !big_f32_plan.reduction && big_f32_plan.partials_bytes == 0,
      "float32 x in parts: the split, no partials");
  check(
      cu::kernel_args(big_f32, big_f32_plan).M == 8 &&
          cu::kernel_args(big_f32, big_f32_plan).x_parts == 2,
      "float32 x in parts: the kernels' rows");
  auto empty_k = big_f32;
  empty_k.K = 0;
  check(!auto_plan(empty_k, h200).x_split, "float32 x, K = 0: nothing split");
  big_f32.M = 8;
  const auto eight_f32_plan = auto_plan(big_f32, h200);
  check(
      eight_f32_plan.x_parts == 2 &&
          eight_f32_plan.main.kernel ==
              "fpqmm_qmv_wide_e4m3_e8m0_bfloat16_x16" &&
          eight_f32_plan.x_split_bytes == 16 * 4096 * 2 &&
          !eight_f32_plan.reduction,
      "8 rows of float32 x: parts in wide blocks of two x blocks");
  // Past 8 rows, the parts where bfloat16's plan of twice the rows is
  // fp_qmm_wgmma's (18 rows of 14336: its blocks of 128 W rows half fill the
  // GPU), in its float32 kernel, which adds each row's two as it stores y;
  // else float32 x split in each pass (bfloat16's 18 rows of 4096 are the
  // simple path's). E4M3 codes: parts by wgmma only past the decode rows, and
  // past 40 where its blocks would not half fill the GPU.
  const auto nine_f32 = float32_problem(Mode::mxfp4, 9, 14336, 4096);
  const auto nine_f32_plan = auto_plan(nine_f32, h200);
  check(
      nine_f32_plan.path == cu::KernelPath::wgmma &&
          nine_f32_plan.x_parts == 2 &&
          nine_f32_plan.main.kernel ==
              "fpqmm_qmm_wgmma_e2m1_e8m0_float32_x32_w128" &&
          nine_f32_plan.x_split &&
          nine_f32_plan.x_split_bytes == 18 * 4096 * 2 &&
          nine_f32_plan.x_tiles &&
          nine_f32_plan.x_tiles_bytes == 128 * 4096 * 2 &&
          !nine_f32_plan.reduction &&
          cu::kernel_args(nine_f32, nine_f32_plan).M == 18,
      "9 rows of float32 x: parts by wgmma, " + nine_f32_plan.main.kernel);
  auto e4m3_f32_kernel = [&](int M, int N) {
    return auto_plan(float32_problem(Mode::mxfp8, M, N, 4096), h200)
        .main.kernel;
  };
  check(
      e4m3_f32_kernel(16, 14336) == "fpqmm_qmv_wide_e4m3_e8m0_float32_x16" &&
          e4m3_f32_kernel(17, 14336) ==
              "fpqmm_qmm_wgmma_e4m3_e8m0_float32_x64_w128" &&
          e4m3_f32_kernel(40, 4096) == "fpqmm_qmv_e4m3_e8m0_float32_x16" &&
          e4m3_f32_kernel(41, 4096).starts_with(
              "fpqmm_qmm_wgmma_e4m3_e8m0_float32_"),
      "float32 x with E4M3 codes: parts by wgmma past 16 rows where its "
      "blocks half fill the GPU, else past 40");
  big_f32.M = 9;
  big_f32.N = 4096;
  check(
      !auto_plan(big_f32, h200).x_split &&
          auto_plan(big_f32, h200).main.kernel ==
              "fpqmm_qmv_e4m3_e8m0_float32_x16",
      "9 rows of float32 x, 4096 x 4096: split in each pass");
  // fp_qmv of two x blocks of float32 x and E2M1 codes runs one block an SM:
  // 4096 x 4096's 256 blocks fill the GPU unsplit, while 1024 x 4096 keeps
  // the cluster's splits (fp_qmv_cluster's blocks as for 16-bit x) and E4M3
  // codes their two blocks an SM (K split in three).
  const auto e4m3_sixteen =
      auto_plan(float32_problem(Mode::mxfp8, 16, 4096, 4096), h200);
  const auto e2m1_sixteen =
      auto_plan(float32_problem(Mode::mxfp4, 16, 4096, 4096), h200);
  const auto e2m1_short =
      auto_plan(float32_problem(Mode::mxfp4, 16, 1024, 4096), h200);
  check(
      e2m1_sixteen.main.kernel == "fpqmm_qmv_e2m1_e8m0_float32_x16" &&
          e2m1_sixteen.split_k == 1 && e2m1_short.splits_in_cluster &&
          e2m1_short.split_k == fpqmm::cuda::kClusterSplits &&
          e4m3_sixteen.main.kernel == "fpqmm_qmv_e4m3_e8m0_float32_x16" &&
          e4m3_sixteen.split_k == 3,
      "16 rows of float32 x, E2M1: 4096 x 4096 unsplit, 1024 x 4096 in a "
      "cluster; E4M3 split");
  check(
      !auto_plan(big_f32, a100).x_split &&
          auto_plan(big_f32, a100).key.x_type == FloatType::float32,
      "9 rows of float32 x on sm_80: split in each pass");
  // Where wgmma splits K (8 blocks of 40 rows of parts), each row's parts
  // go to the partials, which the float32 reduction adds up.
  const auto split_f32_plan =
      auto_plan(float32_problem(Mode::mxfp4, 20, 1024, 16384), h200);
  check(
      split_f32_plan.path == cu::KernelPath::wgmma &&
          split_f32_plan.x_parts == 2 && split_f32_plan.split_k > 1 &&
          split_f32_plan.reduction &&
          split_f32_plan.reduction->kernel == "fpqmm_split_k_sum_float32" &&
          split_f32_plan.partials_bytes ==
              int64_t(split_f32_plan.split_k) * 40 * 1024 * 4,
      "float32 x in parts by wgmma, K split: " + split_f32_plan.note);
  // 264 wide blocks half fill it; 263 do not, and the narrow blocks run.
  check(
      auto_plan(problem(Mode::mxfp4, true, 1, 264 * 32, 4096), h200)
              .key.family == cu::KernelFamily::qmv_wide,
      "264 wide blocks");
  auto below = auto_plan(problem(Mode::mxfp4, true, 1, 263 * 32, 4096), h200);
  check(
      below.key.family == cu::KernelFamily::qmv && below.split_k == 1 &&
          below.main.grid[0] == 263 * 2 &&
          below.main.block == std::array<int, 3>{256, 1, 1},
      "263 wide blocks: narrow ones");
  // Two x blocks in wide blocks where those half fill the GPU.
  const auto nine = auto_plan(problem(Mode::mxfp4, true, 9, 14336, 4096), h200);
  check(
      nine.key.family == cu::KernelFamily::qmv_wide &&
          nine.main.kernel == "fpqmm_qmv_wide_e2m1_e8m0_bfloat16_x16" &&
          nine.main.grid[0] == 448 && nine.split_k == 1,
      "9 rows: wide blocks of two x blocks, " + nine.main.kernel);
  check(
      auto_plan(problem(Mode::mxfp4, true, 16, 263 * 32, 4096), h200)
              .key.family == cu::KernelFamily::qmv,
      "16 rows, 263 wide blocks: narrow ones");
  check(
      cu::plan(
          problem(Mode::mxfp4, true, 40, 14336, 4096),
          h200,
          cu::KernelRequest::decode)
              .key.family == cu::KernelFamily::qmv,
      "the decode kernel requested past 16 rows: narrow blocks");
  // 256 blocks of 4096 x 4096 stay unsplit (measured faster than split),
  // though E2M1's 4 blocks an SM leave half the slots empty.
  auto square = auto_plan(problem(Mode::mxfp4, true, 1, 4096, 4096), h200);
  check(
      square.key.family == cu::KernelFamily::qmv && square.split_k == 1 &&
          square.main.grid[0] == 256,
      "4096x4096 unsplit, split_k " + std::to_string(square.split_k));
  // 64 row blocks: split K. On sm_90 the splits add up in a cluster; on
  // sm_80 in partial sums and their reduction.
  auto small = auto_plan(problem(Mode::mxfp4, true, 1, 1024, 4096), h200);
  check(
      small.split_k >= 2 && small.split_k_step % 128 == 0 &&
          small.split_k_step * (small.split_k - 1) < 4096 &&
          small.split_k_step * small.split_k >= 4096,
      "1024 rows split " + std::to_string(small.split_k));
  check(
      small.splits_in_cluster && !small.reduction &&
          small.partials_bytes == 0 &&
          small.split_k == fpqmm::cuda::kClusterSplits &&
          small.key.family == cu::KernelFamily::qmv_cluster &&
          small.main.kernel == "fpqmm_qmv_cluster_e2m1_e8m0_bfloat16_x8",
      "sm_90: splits in a cluster, " + small.main.kernel);
  check(small.main.grid[1] == small.split_k, "splits on grid y");
  // mxfp8's 7 splits become a cluster's 4.
  auto small8 = auto_plan(problem(Mode::mxfp8, true, 1, 1024, 4096), h200);
  check(
      small8.splits_in_cluster && small8.split_k == 4 &&
          small8.split_k_step == 1024,
      "mxfp8 1024 x 4096 in a cluster");
  // float32 x in two parts takes bfloat16's plan of twice the rows (4096 x
  // 4096: unsplit), its sums in partials; float16 x with float scales keeps
  // its own kernel (3 splits in partials); float16 x in float16 codes is
  // blocked as bfloat16 x (256 blocks: unsplit).
  auto square32 = problem(Mode::mxfp4, true, 1, 4096, 4096);
  square32.x_type = FloatType::float32;
  const auto square32_plan = auto_plan(square32, h200);
  check(
      square32_plan.split_k == 1 && square32_plan.x_parts == 2 &&
          !square32_plan.reduction && square32_plan.main.grid[0] == 256 &&
          square32_plan.key.family == cu::KernelFamily::qmv,
      "float32 4096 x 4096: parts, split " +
          std::to_string(square32_plan.split_k));
  auto square_fp4 = problem(Mode::fp4, true, 1, 4096, 4096);
  square_fp4.x_type = FloatType::float16;
  square_fp4.scale_type = FloatType::float16;
  const auto square_fp4_plan = auto_plan(square_fp4, h200);
  check(
      square_fp4_plan.x_parts == 1 && square_fp4_plan.split_k == 3 &&
          !square_fp4_plan.splits_in_cluster,
      "float16 fp4 4096 x 4096: partials, split " +
          std::to_string(square_fp4_plan.split_k));
  auto square16 = square32;
  square16.x_type = FloatType::float16;
  const auto square16_plan = auto_plan(square16, h200);
  check(
      square16_plan.split_k == 1 && square16_plan.main.grid[0] == 256,
      "float16 mxfp4 4096 x 4096: split " +
          std::to_string(square16_plan.split_k) + ", " +
          std::to_string(square16_plan.main.grid[0]) + " blocks");
  // Below 8 MiB of W the two more launches cost more than the split saves.
  auto small32 = problem(Mode::mxfp4, true, 1, 1024, 4096);
  small32.x_type = FloatType::float32;
  const auto small32_plan = auto_plan(small32, h200);
  check(
      !small32_plan.x_split && small32_plan.splits_in_cluster,
      "float32 1024 x 4096 in a cluster");
  // In parts, bfloat16's split of K (a cluster's for mxfp8 1024 x 8192, 8
  // MiB) becomes partial sums of its splits, both parts in each.
  auto long32 = problem(Mode::mxfp8, true, 1, 1024, 8192);
  long32.x_type = FloatType::float32;
  const auto long32_plan = auto_plan(long32, h200);
  check(
      long32_plan.x_parts == 2 && !long32_plan.splits_in_cluster &&
          long32_plan.split_k > 1 &&
          long32_plan.key.family == cu::KernelFamily::qmv &&
          long32_plan.partials_bytes ==
              int64_t(long32_plan.split_k) * 2 * 1024 * 4 &&
          long32_plan.note.find("cluster's) in partial sums") !=
              std::string::npos &&
          long32_plan.note.find("adding up in a thread block cluster") ==
              std::string::npos,
      "float32 mxfp8 1024 x 8192 in parts: splits in partials, split " +
          std::to_string(long32_plan.split_k));
  // Few rows and a long K: more splits than a cluster's, with partials.
  auto narrow = auto_plan(problem(Mode::mxfp4, true, 1, 64, 14336), h200);
  check(
      narrow.split_k > 8 && !narrow.splits_in_cluster && narrow.reduction &&
          narrow.key.family == cu::KernelFamily::qmv,
      "64 x 14336 split " + std::to_string(narrow.split_k));
  auto ampere = auto_plan(problem(Mode::mxfp4, true, 1, 1024, 4096), a100);
  check(
      ampere.split_k >= 2 && !ampere.splits_in_cluster &&
          ampere.partials_bytes == int64_t(ampere.split_k) * 1024 * 4 &&
          ampere.reduction &&
          ampere.reduction->kernel == "fpqmm_split_k_sum_bfloat16",
      "sm_80: partials and their reduction");
  // x rows: 9..16 take two x blocks, more (where wgmma does not run: sm_80)
  // fp_qmm's block tiles (128 W rows by 32 x rows, 64 past kQmmSmallRows), or
  // where fp_qmm does not run (float32 x) the simple path.
  auto m12 = auto_plan(problem(Mode::nvfp4, true, 12, 14336, 4096), h200);
  check(
      m12.main.kernel == "fpqmm_qmv_wide_e2m1_e4m3_bfloat16_x16",
      m12.main.kernel);
  auto m40 = auto_plan(problem(Mode::mxfp8, true, 40, 14336, 4096), a100);
  check(
      m40.path == cu::KernelPath::tiled &&
          m40.main.kernel == "fpqmm_qmm_e4m3_e8m0_bfloat16_x32" &&
          m40.main.grid[0] == 112 && m40.main.grid[1] == 2 * m40.split_k &&
          m40.main.block[0] == fpqmm::cuda::kQmmThreads &&
          m40.main.shared_bytes == 4 * (128 * (64 + 4 * 2) + 32 * 64 * 2),
      "M=40 tiled: " + m40.main.kernel);
  check(
      auto_plan(problem(Mode::mxfp4, true, cu::kQmmSmallRows, 4096, 4096), a100)
              .main.kernel.ends_with("_x32") &&
          auto_plan(
              problem(Mode::mxfp4, true, cu::kQmmSmallRows + 1, 4096, 4096),
              a100)
              .main.kernel.ends_with("_x64"),
      "tiled: 64 x rows a block past kQmmSmallRows");
  auto f32_problem = problem(Mode::mxfp8, true, 40, 14336, 4096);
  f32_problem.x_type = FloatType::float32;
  auto f32_m40 = cu::plan(f32_problem, a100, cu::KernelRequest::simple);
  check(
      f32_m40.path == cu::KernelPath::simple &&
          f32_m40.main.grid[1] == 3 * f32_m40.split_k &&
          f32_m40.key.x_type == FloatType::float32,
      "M=40 float32 x, simple requested: over 3 x blocks");
  auto f32_m40_tiled = auto_plan(f32_problem, a100);
  check(
      f32_m40_tiled.path == cu::KernelPath::tiled &&
          f32_m40_tiled.x_parts == 2 &&
          f32_m40_tiled.main.kernel == "fpqmm_qmm_e4m3_e8m0_float32_x64" &&
          f32_m40_tiled.x_split_bytes == 80 * 4096 * 2,
      "M=40 float32 x on sm_80: parts by fp_qmm, " + f32_m40_tiled.main.kernel);
  auto f32_m40_hopper = auto_plan(f32_problem, h200);
  check(
      f32_m40_hopper.path == cu::KernelPath::wgmma &&
          f32_m40_hopper.x_parts == 2 &&
          f32_m40_hopper.main.kernel.starts_with(
              "fpqmm_qmm_wgmma_e4m3_e8m0_float32_"),
      "M=40 float32 x on sm_90: parts by wgmma");
  auto scales_unaligned = problem(Mode::mxfp4, true, 64, 4096, 4096);
  scales_unaligned.scales_alignment = 2;
  check(
      auto_plan(scales_unaligned, h200).path == cu::KernelPath::simple,
      "tiled needs 4-byte aligned scales");
  // A small grid splits K; a tiled request at a decode M.
  auto few_tiles = auto_plan(problem(Mode::mxfp4, true, 64, 256, 8192), a100);
  check(
      few_tiles.path == cu::KernelPath::tiled && few_tiles.split_k > 1 &&
          few_tiles.split_k_step % fpqmm::cuda::qmm_stage_codes(4) == 0 &&
          few_tiles.reduction,
      "tiled split K");
  check(
      cu::plan(
          problem(Mode::nvfp4, true, 1, 4096, 4096),
          h200,
          cu::KernelRequest::tiled)
              .key.family == cu::KernelFamily::qmm,
      "tiled requested at M=1");
  check(
      cu::plan(
          problem(Mode::nvfp4, false, 64, 4096, 4096),
          h200,
          cu::KernelRequest::tiled)
          .note.starts_with("tiled requested, not taken: x @ W"),
      "tiled not taken for x @ W");
  // What fp_qmv cannot take goes to fp_qmv_staged.
  auto odd_k = auto_plan(problem(Mode::nvfp4, true, 40, 14336, 4112), h200);
  check(
      odd_k.key.family == cu::KernelFamily::qmv_staged &&
          odd_k.main.kernel == "fpqmm_qmv_staged_e2m1_e4m3_bfloat16_x16" &&
          odd_k.note.find("16-byte vectors") != std::string::npos,
      odd_k.main.kernel);
  auto fp8_unaligned = problem(Mode::mxfp8, true, 40, 14336, 4096);
  fp8_unaligned.pointer_alignment = 8;
  auto fp8_staged = auto_plan(fp8_unaligned, h200);
  check(
      fp8_staged.main.shared_bytes > 48 * 1024 &&
          fp8_staged.note.find("opt-in") != std::string::npos,
      "fp8 staged shared memory is opt-in");
  auto unaligned = problem(Mode::mxfp4, true, 1, 4096, 4096);
  unaligned.pointer_alignment = 8;
  check(
      family_on_h200(unaligned) == cu::KernelFamily::qmv_staged,
      "8-byte aligned pointers");
  auto float_scales = problem(Mode::fp4, true, 1, 4096, 4096);
  check(
      family_on_h200(float_scales) == cu::KernelFamily::qmv,
      "float scales, bfloat16 x");
  // float32 x with float scales: fp_qmv's W in two parts, x split by each
  // pass (the split once is bfloat16's kernels', whose W is one part).
  float_scales.x_type = FloatType::float32;
  for (int M : {1, 8, 40}) {
    float_scales.M = M;
    const auto parts = auto_plan(float_scales, h200);
    check(
        parts.key.family == cu::KernelFamily::qmv && parts.x_parts == 1 &&
            parts.key.x_type == FloatType::float32 && !parts.x_split,
        "float scales, float32 x at M=" + std::to_string(M) + ": " +
            parts.main.kernel + " " + parts.note);
  }
  float_scales.M = 1;
  float_scales.x_type = FloatType::float16;
  float_scales.group_size = 16;
  check(
      family_on_h200(float_scales) == cu::KernelFamily::qmv_staged,
      "E2M1 float scales in groups of 16");
  auto nvfp4 = problem(Mode::nvfp4, true, 1, 4096, 4096);
  check(family_on_h200(nvfp4) == cu::KernelFamily::qmv, "nvfp4's groups of 16");
  // x @ W.
  auto qvm = auto_plan(problem(Mode::fp4, false, 1, 4096, 14336), h200);
  check(
      qvm.path == cu::KernelPath::qvm &&
          qvm.main.kernel == "fpqmm_qvm_e2m1_float16_bfloat16" &&
          qvm.main.grid[0] == 16,
      qvm.main.kernel);
  check(qvm.split_k > 1 && qvm.split_k_step % 256 == 0, "qvm split");
  // Requests.
  auto simple = cu::plan(
      problem(Mode::mxfp4, true, 1, 14336, 4096),
      h200,
      cu::KernelRequest::simple);
  check(
      simple.path == cu::KernelPath::simple &&
          simple.main.kernel.ends_with("_x16"),
      "simple requested");
  auto decode = cu::plan(
      problem(Mode::mxfp4, false, 64, 4096, 4096),
      h200,
      cu::KernelRequest::decode);
  check(decode.path == cu::KernelPath::qvm, "qmv requested for x @ W");
  // Many rows: the op's dequantize + matmul, unless another path is asked
  // for; the primitive itself (a vjp's) plans them as simple.
  using cu::KernelRequest;
  auto rows = [](int M, FloatType x_type = FloatType::bfloat16) {
    auto p = problem(Mode::mxfp4, true, M, 4096, 4096);
    p.x_type = x_type;
    return p;
  };
  auto deq = [&](const QmmProblem& p, KernelRequest request) {
    return cu::dequantize_then_matmul(p, a100, request);
  };
  check(
      !deq(rows(cu::kTiledRows), KernelRequest::automatic) &&
          deq(rows(cu::kTiledRows + 1), KernelRequest::automatic) &&
          !deq(
              rows(cu::kTiledRows / 2, FloatType::float32),
              KernelRequest::automatic) &&
          deq(rows(cu::kTiledRows / 2 + 1, FloatType::float32),
              KernelRequest::automatic) &&
          !deq(rows(4096), KernelRequest::simple) &&
          !deq(rows(4096), KernelRequest::decode) &&
          !deq(rows(4096), KernelRequest::tiled) &&
          deq(rows(1), KernelRequest::dequantize),
      "dequantize + matmul above the tiled rows (float32 x's parts: half)");
  // On sm_90 float32 x's parts by wgmma up to half its rows (E2M1 1024, E4M3
  // 768), unless MLX_ENABLE_TF32=0 asks for float32's precision past the
  // simple path's rows; float scales keep float32 x.
  auto hopper_rows = [&](Mode mode, int M) {
    return cu::dequantize_then_matmul(
        float32_problem(mode, M, 4096, 4096), h200, KernelRequest::automatic);
  };
  check(
      !hopper_rows(Mode::mxfp4, 512) && hopper_rows(Mode::mxfp4, 513) &&
          !hopper_rows(Mode::mxfp8, 384) && hopper_rows(Mode::mxfp8, 385) &&
          !hopper_rows(Mode::fp4, cu::kSimpleRows) &&
          hopper_rows(Mode::fp4, cu::kSimpleRows + 1),
      "float32 x on sm_90: the primitive up to half wgmma's rows");
  // grouped plans a product that is not a gather as automatic: the parts.
  check(
      cu::plan(
          float32_problem(Mode::mxfp4, 300, 4096, 4096),
          h200,
          KernelRequest::grouped)
              .x_parts == 2,
      "grouped requested, float32 x of 300 rows: the parts by wgmma");
  // A wgmma or tiled request takes the parts below the automatic rows too.
  check(
      cu::plan(
          float32_problem(Mode::mxfp8, 16, 14336, 4096),
          h200,
          KernelRequest::wgmma)
                  .main.kernel ==
              "fpqmm_qmm_wgmma_e4m3_e8m0_float32_x32_w128" &&
          cu::plan(
              float32_problem(Mode::mxfp4, 9, 4096, 4096),
              a100,
              KernelRequest::tiled)
                  .main.kernel == "fpqmm_qmm_e2m1_e8m0_float32_x32",
      "wgmma and tiled requested, float32 x: the parts at 16 and 9 rows");
  setenv("MLX_ENABLE_TF32", "0", 1);
  check(
      !hopper_rows(Mode::mxfp4, cu::kSimpleRows) &&
          hopper_rows(Mode::mxfp4, cu::kSimpleRows + 1) &&
          !deq(
              rows(cu::kSimpleRows, FloatType::float32),
              KernelRequest::automatic) &&
          deq(rows(cu::kSimpleRows + 1, FloatType::float32),
              KernelRequest::automatic),
      "MLX_ENABLE_TF32=0: float32 x past the simple rows by dequantize + "
      "matmul");
  unsetenv("MLX_ENABLE_TF32");
  // A gather: pairs of one row (sorted here unless sorted with x in pair
  // order) from 192 rows an expert, within MLX's grouped GEMM's 1024 experts
  // and 4 GiB of dequantized experts; any layout on request.
  auto moe = [](int pairs, int M, int x_matrices, bool sorted) {
    return cu::gather_rows(
        gather_problem(pairs, M, 2880, 2880, x_matrices, 32), sorted);
  };
  auto takes = [](const cu::GatherRows& rows) {
    return cu::gather_dequantize_then_matmul(rows, KernelRequest::automatic);
  };
  // fp_qmm_grouped's threshold (bfloat16 x), fp_qmv_grouped's (float32 x).
  const int tiled_rows = cu::kGatherRowsPerExpertTiled * 32;
  auto moe_f32 = [](int pairs, int x_matrices, bool sorted) {
    return cu::gather_rows(
        gather_problem(
            pairs, 1, 2880, 2880, x_matrices, 32, FloatType::float32),
        sorted);
  };
  check(
      moe(256, 1, 256, true).in_order && !moe(256, 1, 32, true).in_order &&
          !moe(256, 1, 256, false).in_order && moe(384, 1, 384, true).tiled &&
          !moe(383, 1, 383, true).tiled &&
          takes(moe(tiled_rows, 1, tiled_rows, true)) &&
          !takes(moe(tiled_rows - 1, 1, tiled_rows - 1, true)) &&
          !moe_f32(6144, 6144, true).tiled &&
          takes(moe_f32(6144, 6144, true)) &&
          !takes(moe_f32(6143, 6143, true)) &&
          takes(moe_f32(8192, 2048, false)) && !takes(moe(8192, 2, 8192, true)),
      "gather: dequantize + gather_mm for single rows from 192 an expert "
      "(fp_qmv_grouped), kGatherRowsPerExpertTiled (fp_qmm_grouped)");
  // Where our grouped path does not run (here x @ W), from 12 rows an
  // expert; a grouped request is automatic there.
  auto per_pair = [](int pairs) {
    return cu::gather_rows(
        gather_problem(
            pairs, 1, 2880, 2880, pairs, 32, FloatType::bfloat16, false),
        true);
  };
  check(
      moe(8192, 1, 8192, true).grouped_path && !per_pair(384).grouped_path &&
          takes(per_pair(384)) && !takes(per_pair(383)) &&
          cu::gather_dequantize_then_matmul(
              per_pair(384), KernelRequest::grouped) &&
          !cu::gather_dequantize_then_matmul(
              moe(8192, 1, 8192, true), KernelRequest::grouped) &&
          deq(rows(cu::kTiledRows + 1), KernelRequest::grouped),
      "gather: dequantize + gather_mm from 12 rows an expert per pair");
  check(
      moe(4096, 1, 4096, true).dense_bytes == int64_t(32) * 2880 * 2880 * 2 &&
          !takes(cu::gather_rows(
              gather_problem(1 << 16, 1, 1536, 5120, 1 << 16, 160), true)) &&
          !cu::gather_rows(
               gather_problem(1 << 20, 1, 64, 64, 1 << 20, 1025), true)
               .grouped &&
          cu::gather_rows(
              gather_problem(
                  1 << 20, 1, 1024, 1024, 1 << 20, 8, FloatType::float32),
              true)
              .grouped &&
          !cu::gather_rows(
               gather_problem(
                   1 << 20, 1, 1024, 1025, 1 << 20, 8, FloatType::float32),
               true)
               .grouped,
      "gather: the grouped GEMM's limits (2 GiB of experts, 4 GiB of x or "
      "y, 1024 experts)");
  check(
      cu::gather_dequantize_then_matmul(
          moe(8, 3, 2, false), KernelRequest::dequantize) &&
          !cu::gather_dequantize_then_matmul(
              moe(4096, 1, 4096, true), KernelRequest::simple) &&
          cu::gather_dequantize_then_matmul(
              moe(65535, 2, 65535, true), KernelRequest::dequantize) &&
          !cu::gather_dequantize_then_matmul(
              moe(65536, 2, 65536, true), KernelRequest::dequantize) &&
          !cu::gather_dequantize_then_matmul(
              cu::gather_rows(
                  gather_problem(65535, 16, 4096, 4096, 65535, 8), false),
              KernelRequest::dequantize),
      "gather: requests, within MLX's other kernels' grid and 32-bit offsets");
  auto many = cu::plan(
      problem(Mode::mxfp4, true, 4096, 4096, 4096),
      a100,
      KernelRequest::dequantize);
  check(
      many.path == cu::KernelPath::tiled &&
          many.note.find("made elsewhere") != std::string::npos,
      "the primitive of many rows plans tiled: " + many.note);
  check(
      cu::plan(
          problem(Mode::mxfp4, true, 4096, 4096, 4096),
          h200,
          KernelRequest::dequantize)
              .path == cu::KernelPath::wgmma,
      "the primitive of many rows plans wgmma on sm_90");

  // wgmma (sm_90, bfloat16 x): above kWgmmaMinRows rows to wgmma_max_rows,
  // then dequantize + matmul; 256 W rows a block where those blocks half
  // fill the GPU, else 128 and split K where even those would not; past 128
  // rows, blocks of 256 rows of x and 128 of W where they are as many or
  // fill the GPU. mxfp4 14336 x 4096 by fp_qmm_wgmma: its kernel, grid, x's
  // tiles (of 128 rows) and shared memory. Up to 64 rows, blocks of 64 rows
  // of x (wgmma's N 64), which read the first half of x's tiles; up to 32,
  // of 32.
  struct WgmmaCase {
    int M;
    std::string kernel;
    int column_blocks, m_blocks, x_tiles, w_tiles, x_rows;
  };
  for (const auto& c : {
           WgmmaCase{
               512,
               "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x256_w128",
               112,
               2,
               4,
               1,
               256},
           WgmmaCase{
               300,
               "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x256_w128",
               112,
               2,
               3,
               1,
               256},
           WgmmaCase{
               256,
               "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x256_w128",
               112,
               1,
               2,
               1,
               256},
           WgmmaCase{
               128,
               "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x128_w128",
               112,
               1,
               1,
               1,
               128},
           WgmmaCase{
               64,
               "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x64_w128",
               112,
               1,
               1,
               1,
               64},
           WgmmaCase{
               32,
               "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x32_w128",
               112,
               1,
               1,
               1,
               32},
       }) {
    auto plan = auto_plan(problem(Mode::mxfp4, true, c.M, 14336, 4096), h200);
    check(
        plan.path == cu::KernelPath::wgmma && plan.main.kernel == c.kernel &&
            plan.main.grid[0] == c.column_blocks &&
            plan.main.grid[1] == c.m_blocks && plan.split_k == 1 &&
            plan.x_tiles && plan.x_tiles->kernel == "fpqmm_wgmma_tile_x_e2m1" &&
            plan.x_tiles->grid[0] == c.x_tiles * 4096 / 128 &&
            plan.x_tiles_bytes == int64_t(c.x_tiles) * 128 * 4096 * 2 &&
            plan.main.shared_bytes ==
                fpqmm::cuda::wgmma_shared_bytes(4, c.w_tiles, c.x_rows) &&
            plan.main.shared_bytes <= 227 * 1024,
        "wgmma " + std::to_string(c.M) + " rows: " + plan.main.kernel);
  }
  auto split = auto_plan(problem(Mode::mxfp8, true, 200, 4096, 4096), h200);
  check(
      split.path == cu::KernelPath::wgmma &&
          split.main.kernel == "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x128_w128" &&
          split.main.grid[1] == 2 * split.split_k &&
          split.x_tiles->grid[0] == 2 * 4096 / 64,
      "wgmma 200 rows: " + split.main.kernel);
  // Blocks of 128 rows of x where the wide ones would be fewer and not fill
  // the GPU: mxfp8 4096 x 4096 at 512 rows (64 wide blocks, 128 narrow).
  auto narrow_x = auto_plan(problem(Mode::mxfp8, true, 512, 4096, 4096), h200);
  check(
      narrow_x.path == cu::KernelPath::wgmma &&
          narrow_x.main.kernel ==
              "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x128_w128" &&
          narrow_x.main.grid[0] == 32 && narrow_x.main.grid[1] == 4 &&
          narrow_x.split_k == 1,
      "wgmma 512 rows of 4096 x 4096: " + narrow_x.main.kernel);
  // The harness's wgmma shapes reach the blocks its cases name.
  for (const auto& [M, N, kernel] :
       std::initializer_list<std::tuple<int, int, std::string>>{
           {100, 16896, "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x128_w256"},
           {200, 8576, "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x128_w256"},
           {140, 8448, "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x256_w128"},
           {300, 8448, "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x256_w128"},
           {512, 4352, "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x256_w128"}}) {
    auto plan = cu::plan(
        problem(Mode::mxfp8, true, M, N, 256), h200, KernelRequest::wgmma);
    check(
        plan.main.kernel == kernel && plan.split_k == 1,
        "harness wgmma " + std::to_string(M) + " x " + std::to_string(N) +
            ": " + plan.main.kernel);
  }
  // Blocks of 256 rows of x are never split: they are planned only where at
  // least as many as the narrow blocks (which, with one tile of W, are more)
  // or half filling the GPU (with two).
  for (int M : {129, 200, 256, 300, 384, 512}) {
    for (int N : {1024, 4096, 8448, 14336, 28672}) {
      for (int K : {256, 4096, 14336}) {
        auto plan = auto_plan(problem(Mode::mxfp8, true, M, N, K), h200);
        if (plan.main.kernel.find("_x256_") != std::string::npos) {
          check(
              plan.split_k == 1,
              "wide wgmma blocks split: " + std::to_string(M) + " x " +
                  std::to_string(N) + " x " + std::to_string(K));
        }
      }
    }
  }
  // Split K in whole waves: 32 blocks of mxfp8 4096 x 4096 in 4 splits (128
  // blocks for 132 SMs), not 5 (160: a second wave of 28).
  auto wave = auto_plan(problem(Mode::mxfp8, true, 48, 4096, 4096), h200);
  check(
      wave.path == cu::KernelPath::wgmma && wave.main.grid[0] == 32 &&
          wave.split_k == 4 && wave.main.grid[1] == 4,
      "wgmma splits in one wave: split_k " + std::to_string(wave.split_k));
  // Past the decode rows, whatever the codes and N.
  auto path_at = [&](Mode mode, int M, int N) {
    return auto_plan(problem(mode, true, M, N, 4096), h200).path;
  };
  check(
      path_at(Mode::mxfp4, 16, 14336) == cu::KernelPath::qmv &&
          path_at(Mode::mxfp4, 17, 14336) == cu::KernelPath::wgmma &&
          path_at(Mode::mxfp8, 16, 14336) == cu::KernelPath::qmv &&
          path_at(Mode::mxfp8, 17, 14336) == cu::KernelPath::wgmma &&
          path_at(Mode::mxfp4, 16, 4096) == cu::KernelPath::qmv &&
          path_at(Mode::mxfp4, 33, 4096) == cu::KernelPath::wgmma,
      "wgmma's first rows");
  // Up to 32 rows, where wgmma's blocks of 128 W rows would not half fill the
  // GPU (N below 8448 on 132 SMs), fp_qmv in blocks of 32 rows of x: one
  // block of rows, K split in a cluster where the blocks would not half fill
  // the GPU; float32 x (two parts) keeps blocks of 16.
  const std::tuple<Mode, int, int, std::string> simple_first[] = {
      {Mode::mxfp4, 17, 4096, "fpqmm_qmv_e2m1_e8m0_bfloat16_x32"},
      {Mode::mxfp8, 32, 8320, "fpqmm_qmv_e4m3_e8m0_bfloat16_x32"},
      {Mode::nvfp4, 32, 1024, "fpqmm_qmv_cluster_e2m1_e4m3_bfloat16_x32"}};
  for (const auto& [mode, M, N, kernel] : simple_first) {
    auto plan = auto_plan(problem(mode, true, M, N, 4096), h200);
    check(
        plan.path == cu::KernelPath::simple && plan.main.kernel == kernel &&
            plan.main.grid[1] == plan.split_k && !plan.x_tiles &&
            plan.note.find("blocks of 32 rows") != std::string::npos,
        "simple before wgmma, " + std::to_string(M) + " x " +
            std::to_string(N) + ": " + plan.main.kernel);
  }
  check(
      path_at(Mode::mxfp4, 32, 8448) == cu::KernelPath::wgmma &&
          cu::plan(
              problem(Mode::mxfp4, true, 32, 4096, 4096),
              h200,
              KernelRequest::wgmma)
                  .path == cu::KernelPath::wgmma &&
          auto_plan(problem(Mode::mxfp4, true, 32, 4096, 4096), a100).path ==
              cu::KernelPath::tiled,
      "wgmma from 8448 rows of W, on request, and tiled on sm_80");
  auto two_parts = problem(Mode::mxfp4, true, 32, 4096, 4096);
  two_parts.x_type = FloatType::float32;
  check(
      cu::plan(two_parts, a100, KernelRequest::simple)
              .main.kernel.ends_with("_x16") &&
          cu::plan(
              problem(Mode::mxfp4, true, 40, 14336, 4096),
              a100,
              KernelRequest::simple)
              .main.kernel.ends_with("_x32"),
      "blocks of 32 rows for one-part x only, on any simple path");
  auto small_grid =
      auto_plan(problem(Mode::mxfp8, true, 128, 4096, 14336), h200);
  check(
      small_grid.path == cu::KernelPath::wgmma &&
          small_grid.main.kernel ==
              "fpqmm_qmm_wgmma_e4m3_e8m0_bfloat16_x128_w128" &&
          small_grid.split_k > 1 &&
          small_grid.split_k_step % fpqmm::cuda::wgmma_stage_codes(8) == 0 &&
          small_grid.main.grid[1] == small_grid.split_k &&
          small_grid.reduction &&
          small_grid.x_tiles_bytes == int64_t(128) * 14336 * 2,
      "wgmma 128 rows, split K: " + small_grid.main.kernel);
  auto partial_stage =
      auto_plan(problem(Mode::mxfp8, true, 256, 4096, 4128), h200);
  check(
      partial_stage.path == cu::KernelPath::wgmma &&
          partial_stage.x_tiles_bytes == int64_t(2) * 65 * 16384 &&
          partial_stage.x_tiles->grid[0] == 2 * 65,
      "wgmma: K with a partial stage");
  auto odd_m = auto_plan(problem(Mode::nvfp4, true, 200, 4096, 4096), h200);
  check(
      odd_m.path == cu::KernelPath::wgmma &&
          odd_m.x_tiles_bytes == int64_t(256) * 4096 * 2 &&
          odd_m.main.grid[1] == 2 * odd_m.split_k,
      "wgmma: x's rows padded to tiles of 128");
  // Up to 1024 rows with E2M1 codes, 768 with E4M3 ones.
  auto mxfp8_rows = [](int M) {
    return problem(Mode::mxfp8, true, M, 4096, 4096);
  };
  check(
      !cu::dequantize_then_matmul(rows(1024), h200, KernelRequest::automatic) &&
          cu::dequantize_then_matmul(
              rows(1025), h200, KernelRequest::automatic) &&
          !cu::dequantize_then_matmul(
              mxfp8_rows(768), h200, KernelRequest::automatic) &&
          cu::dequantize_then_matmul(
              mxfp8_rows(769), h200, KernelRequest::automatic) &&
          cu::primitive_rows(rows(1), h200) == cu::wgmma_max_rows(4) &&
          cu::primitive_rows(mxfp8_rows(1), h200) == cu::wgmma_max_rows(8) &&
          cu::primitive_rows(rows(1, FloatType::float16), h200) ==
              cu::kTiledRows,
      "wgmma's rows, then dequantize + matmul");
  check(
      auto_plan(rows(cu::kWgmmaMinRows), h200).path == cu::KernelPath::qmv &&
          auto_plan(rows(cu::kWgmmaMinRows + 1), h200).path ==
              cu::KernelPath::simple &&
          path_at(Mode::mxfp4, cu::kWgmmaMinRows + 1, 14336) ==
              cu::KernelPath::wgmma &&
          auto_plan(rows(cu::kWgmmaMinRows + 1), a100).path ==
              cu::KernelPath::tiled,
      "wgmma above kWgmmaMinRows rows, on sm_90 only");
  const std::pair<QmmProblem, std::string> not_wgmma[] = {
      {rows(256, FloatType::float16), "float16 x"},
      {problem(Mode::mxfp4, true, 256, 4100, 4096), "N=4100"},
      {problem(Mode::mxfp4, false, 256, 4096, 4096), "x @ W"},
  };
  for (const auto& [p, why] : not_wgmma) {
    const std::string reason = cu::wgmma_reason(p, h200);
    check(reason.find(why) != std::string::npos, "wgmma_reason: " + reason);
  }
  auto two_matrices = problem(Mode::mxfp4, true, 256, 4096, 4096);
  two_matrices.batch_shape = {2};
  two_matrices.x_batch_strides = {256 * 4096};
  two_matrices.w_batch_strides = {0};
  two_matrices.scales_batch_strides = {0};
  check(
      cu::wgmma_reason(two_matrices, h200).find("more than one") !=
          std::string::npos,
      "wgmma: one matrix");
  auto requested = cu::plan(rows(16), h200, KernelRequest::wgmma);
  check(
      requested.path == cu::KernelPath::wgmma &&
          cu::plan(rows(256), a100, KernelRequest::wgmma)
              .note.starts_with("wgmma requested, not taken: not sm_90"),
      "wgmma requested");
  auto dequantize = cu::plan_dequantize(
      14336, 4096, 4, ScaleEncoding::e4m3, FloatType::float16, h200);
  check(
      dequantize.launch.kernel == "fpqmm_dequantize_e2m1_e4m3_float16" &&
          dequantize.launch.grid[0] == 132 * 16 &&
          dequantize.launch.block[0] == 256,
      dequantize.launch.kernel);
  auto small_w = cu::plan_dequantize(
      64, 64, 8, ScaleEncoding::e8m0, FloatType::bfloat16, h200);
  check(small_w.launch.grid[0] == 4, "one word a thread: 1024 words");
  setenv("MLX_FPQMM_KERNEL", "dequantize", 1);
  check(cu::kernel_request_from_env() == KernelRequest::dequantize, "env");
  setenv("MLX_FPQMM_KERNEL", "simple", 1);
  check(cu::kernel_request_from_env() == cu::KernelRequest::simple, "env");
  setenv("MLX_FPQMM_KERNEL", "nax", 1);
  check(throws([] { cu::kernel_request_from_env(); }), "bad env value");
  unsetenv("MLX_FPQMM_KERNEL");
  check(
      cu::kernel_request_from_env() == cu::KernelRequest::automatic,
      "env unset");

  // Batch axes contiguous in x, w and scales fold; a broadcast one does not.
  auto batched = problem(Mode::mxfp4, true, 2, 256, 512);
  batched.batch_shape = {2, 3};
  batched.x_batch_strides = {3 * 2 * 512, 2 * 512};
  batched.w_batch_strides = {3 * 256 * 64, 256 * 64};
  batched.scales_batch_strides = {3 * 256 * 16, 256 * 16};
  auto folded = auto_plan(batched, h200);
  check(
      folded.batch_shape == std::vector<int>{6} && folded.batch_count == 6 &&
          folded.main.grid[2] == 6,
      "contiguous batch folds");
  batched.w_batch_strides = {0, 256 * 64};
  batched.scales_batch_strides = {0, 256 * 16};
  auto broadcast = auto_plan(batched, h200);
  check(
      broadcast.batch_shape == std::vector<int>({2, 3}) &&
          broadcast.w_batch_strides == std::vector<int64_t>({0, 256 * 64}),
      "broadcast w keeps its axes");
  const auto args = cu::kernel_args(batched, broadcast);
  check(
      args.batch_ndims == 2 && args.batch_shape[1] == 3 &&
          args.w_batch_strides[0] == 0 && args.batch_count == 6 &&
          args.M == 2 && args.N == 256 && args.K == 512 &&
          args.group_size == 32,
      "kernel_args");
  auto deep = problem(Mode::mxfp4, true, 1, 64, 64);
  deep.batch_shape.assign(8, 2);
  deep.x_batch_strides.assign(8, 0);
  deep.w_batch_strides = {0, 1, 0, 1, 0, 1, 0, 1};
  deep.scales_batch_strides = deep.w_batch_strides;
  check(throws([&] { auto_plan(deep, h200); }), "too many batch axes");

  // Gather, per pair (the decode kernels): pairs on grid z, capped (the
  // kernels loop past it).
  auto gather = problem(Mode::mxfp4, true, 1, 2880, 2880);
  gather.gather = true;
  gather.batch_shape = {70000};
  gather.x_matrices = 70000;
  gather.w_matrices = 32;
  auto pairs = cu::plan(gather, h200, cu::KernelRequest::decode);
  check(
      pairs.path == cu::KernelPath::qmv && pairs.main.grid[2] == 65535 &&
          pairs.batch_count == 70000 && !pairs.grouping,
      "gather grid z");
  check(cu::kernel_args(gather, pairs).w_matrices == 32, "gather args");

  // Grouped by expert from kGroupedMinPairs pairs of one row: the grouping
  // launch, room for a run per 64 pairs (fp_qmm_grouped, from 8 pairs an
  // expert) or 8 (fp_qmv_grouped, below 8 an expert; 16 from there) and one
  // more per expert (and for the out-of-range bin), the grid's y capped.
  auto grouped = auto_plan(gather, a100);
  const int64_t runs = (70000 + 63) / 64 + 33;
  check(
      grouped.path == cu::KernelPath::grouped &&
          grouped.key.family == cu::KernelFamily::qmm_grouped &&
          grouped.main.kernel == "fpqmm_qmm_grouped_e2m1_e8m0_bfloat16_x64" &&
          grouped.max_runs == runs && grouped.run_rows == 64 &&
          cu::kernel_args(gather, grouped).run_rows == 64 &&
          grouped.main.grid[0] == 23 && grouped.main.grid[1] == runs &&
          grouped.main.grid[2] == 1 && grouped.split_k == 1 &&
          !grouped.reduction && grouped.grouping &&
          grouped.grouping->grid[0] == 1 &&
          grouped.grouping->block[0] == fpqmm::cuda::kGroupThreads &&
          grouped.grouping_bytes == 16 + runs * 16 + 70000 * 4,
      "grouped gather, tiled");
  auto sparse = gather;
  sparse.batch_shape = {200};
  sparse.x_matrices = 200;
  auto per_run = auto_plan(sparse, h200);
  const int64_t sparse_runs = (200 + 7) / 8 + 33;
  check(
      per_run.path == cu::KernelPath::grouped &&
          per_run.key.family == cu::KernelFamily::qmv_grouped &&
          per_run.main.kernel == "fpqmm_qmv_grouped_e2m1_e8m0_bfloat16_x8" &&
          per_run.run_rows == 8 && per_run.max_runs == sparse_runs &&
          cu::kernel_args(sparse, per_run).run_rows == 8 &&
          per_run.main.grid[0] == 132 * fpqmm::cuda::kQmvWideMinBlocks &&
          per_run.main.grid[1] == 1 && per_run.main.block[0] == 128 &&
          per_run.main.shared_bytes == 4 * 2 * 4 * 32 * 4,
      "grouped gather, fewer than 8 pairs an expert");
  // fp_qmv_grouped's blocks run at once, each walking its share of the 32-row
  // tiles of every run; fewer blocks where there are fewer tiles.
  auto few_row_tiles = sparse;
  few_row_tiles.N = 64;
  check(
      auto_plan(few_row_tiles, h200).main.grid[0] == 2 * sparse_runs,
      "grouped gather, fewer tiles than blocks at once");
  // Up to kBlockGroupMaxPairs pairs fp_qmv_grouped's blocks group them: no
  // grouping launch, no scratch; fp_qmm_grouped keeps fp_group_pairs.
  auto few_pairs = sparse;
  few_pairs.batch_shape = {fpqmm::cuda::kBlockGroupMaxPairs};
  few_pairs.x_matrices = fpqmm::cuda::kBlockGroupMaxPairs;
  auto in_block = auto_plan(few_pairs, h200);
  auto past_block = few_pairs;
  past_block.batch_shape = {fpqmm::cuda::kBlockGroupMaxPairs + 1};
  past_block.x_matrices = fpqmm::cuda::kBlockGroupMaxPairs + 1;
  check(
      in_block.key.family == cu::KernelFamily::qmv_grouped &&
          !in_block.grouping && in_block.grouping_bytes == 0 &&
          in_block.note.find("grouped in each block") != std::string::npos &&
          auto_plan(past_block, h200).grouping &&
          cu::plan(few_pairs, h200, cu::KernelRequest::tiled).grouping,
      "grouped gather of up to 32 pairs: grouped in each block");
  // float32 x (no fp_qmm) from 12 pairs an expert: runs of 16.
  auto dense_f32 = sparse;
  dense_f32.x_type = FloatType::float32;
  dense_f32.batch_shape = {384};
  dense_f32.x_matrices = 384;
  auto per_run16 = auto_plan(dense_f32, h200);
  check(
      per_run16.main.kernel == "fpqmm_qmv_grouped_e2m1_e8m0_float32_x16" &&
          per_run16.run_rows == 16 &&
          per_run16.main.shared_bytes == 4 * 2 * 2 * 4 * 32 * 4,
      "grouped gather, float32 x, 12 pairs an expert");
  // fp_qmv_grouped's shares tile by tile where the experts average a run or
  // more: 8 pairs an expert in runs of 8, 16 in runs of 16.
  auto full_runs = sparse;
  full_runs.batch_shape = {8 * 32};
  full_runs.x_matrices = 8 * 32;
  auto full_runs_f32 = dense_f32;
  full_runs_f32.batch_shape = {16 * 32};
  full_runs_f32.x_matrices = 16 * 32;
  const auto tile_major = auto_plan(full_runs, h200);
  check(
      tile_major.tile_major_shares &&
          cu::kernel_args(full_runs, tile_major).tile_major_shares == 1 &&
          auto_plan(full_runs_f32, h200).tile_major_shares &&
          !per_run.tile_major_shares &&
          cu::kernel_args(sparse, per_run).tile_major_shares == 0 &&
          !per_run16.tile_major_shares &&
          !cu::plan(full_runs, h200, cu::KernelRequest::tiled)
               .tile_major_shares,
      "grouped gather: shares tile by tile from a run's pairs an expert");
  check(
      cu::plan(sparse, h200, cu::KernelRequest::tiled).main.kernel ==
          "fpqmm_qmm_grouped_e2m1_e8m0_bfloat16_x32",
      "grouped gather, tiled requested");
  auto below_large = gather;
  below_large.batch_shape = {cu::kQmmGroupedLargeRows * 32 - 1};
  auto at_large = gather;
  at_large.batch_shape = {cu::kQmmGroupedLargeRows * 32};
  check(
      auto_plan(below_large, a100).run_rows == 32 &&
          auto_plan(at_large, a100).run_rows == 64,
      "grouped gather: runs of 64 from kQmmGroupedLargeRows an expert");
  // On sm_90 from kWgmmaGroupRows pairs an expert: fp_qmm_wgmma_grouped,
  // runs of up to 128 pairs, whose x fp_wgmma_tile_x_grouped gathers into
  // tiles first (K = 2880: 23 stages of 128 E2M1 codes, the last partial).
  auto hopper = auto_plan(gather, h200);
  const int64_t wgmma_runs = (70000 + 127) / 128 + 33;
  check(
      hopper.path == cu::KernelPath::grouped &&
          hopper.main.kernel ==
              "fpqmm_qmm_wgmma_grouped_e2m1_e8m0_bfloat16_x128_w256" &&
          hopper.run_rows == 128 && hopper.max_runs == wgmma_runs &&
          hopper.main.grid[0] == 12 && hopper.main.grid[1] == wgmma_runs &&
          hopper.grouping && hopper.x_tiles &&
          hopper.x_tiles->kernel == "fpqmm_wgmma_tile_x_grouped_e2m1" &&
          hopper.x_tiles_bytes == wgmma_runs * 23 * 32768 &&
          hopper.note.find("fp_qmm_wgmma_grouped") != std::string::npos,
      "grouped gather on sm_90: " + hopper.main.kernel);
  auto below_wgmma = gather;
  below_wgmma.batch_shape = {cu::kWgmmaGroupRows * 32 - 1};
  auto at_wgmma = gather;
  at_wgmma.batch_shape = {cu::kWgmmaGroupRows * 32};
  check(
      auto_plan(below_wgmma, h200).key.family ==
              cu::KernelFamily::qmm_grouped &&
          auto_plan(at_wgmma, h200).key.family ==
              cu::KernelFamily::qmm_wgmma_grouped &&
          cu::plan(sparse, h200, cu::KernelRequest::wgmma).key.family ==
              cu::KernelFamily::qmm_wgmma_grouped &&
          cu::plan(gather, h200, cu::KernelRequest::tiled).key.family ==
              cu::KernelFamily::qmm_grouped,
      "grouped gather: fp_qmm_wgmma_grouped from kWgmmaGroupRows an expert");
  auto bf16_moe = [&](int pairs, const cu::CudaDevice& device) {
    return cu::gather_rows(
        gather_problem(pairs, 1, 2880, 2880, pairs, 32), true, device);
  };
  check(
      bf16_moe(16384 * 4, h200).wgmma &&
          !cu::gather_dequantize_then_matmul(
              bf16_moe(16384 * 4, h200), KernelRequest::automatic) &&
          cu::gather_dequantize_then_matmul(
              bf16_moe(16384 * 4, a100), KernelRequest::automatic) &&
          cu::gather_dequantize_then_matmul(
              bf16_moe(16384 * 4, h200), KernelRequest::dequantize),
      "gather: never dequantized where fp_qmm_wgmma_grouped runs");
  auto few = gather;
  few.batch_shape = {cu::kGroupedMinPairs - 1};
  few.x_matrices = 1;
  check(auto_plan(few, h200).path == cu::KernelPath::qmv, "few pairs");
  few.batch_shape = {cu::kGroupedMinPairs};
  check(auto_plan(few, h200).path == cu::KernelPath::grouped, "enough pairs");
  check(
      cu::plan(few, h200, cu::KernelRequest::grouped).max_runs ==
          1 + cu::kGroupedMinPairs,
      "runs: at most one per pair");
  auto huge_grid = gather;
  huge_grid.batch_shape = {8000000};
  check(
      auto_plan(huge_grid, h200).main.grid[1] == 65535,
      "grouped grid y capped");
  // Where it cannot run, a grouped request plans as automatic, saying why.
  auto two_rows = gather;
  two_rows.M = 2;
  auto not_grouped = cu::plan(two_rows, h200, cu::KernelRequest::grouped);
  check(
      not_grouped.path == cu::KernelPath::qmv &&
          not_grouped.note.starts_with(
              "grouped requested, not taken: M=2 rows per pair"),
      "grouped needs one row per pair");
  auto untransposed = gather;
  untransposed.transpose = false;
  check(
      auto_plan(untransposed, h200).path == cu::KernelPath::qvm,
      "grouped needs x @ W^T");
  auto many_experts = gather;
  many_experts.w_matrices = fpqmm::cuda::kGroupMaxExperts + 1;
  check(
      auto_plan(many_experts, h200).path == cu::KernelPath::qmv,
      "grouped experts bound");
  auto unaligned_x = problem(Mode::mxfp4, true, 1, 64, 96);
  unaligned_x.pointer_alignment = 8;
  unaligned_x.gather = true;
  unaligned_x.batch_shape = {64};
  unaligned_x.x_matrices = 64;
  unaligned_x.w_matrices = 4;
  check(
      auto_plan(unaligned_x, h200).key.family == cu::KernelFamily::qmv_staged,
      "grouped needs 16-byte vectors");
  auto not_gather = problem(Mode::mxfp4, true, 1, 64, 64);
  check(
      cu::plan(not_gather, h200, cu::KernelRequest::grouped)
          .note.starts_with("grouped requested, not taken: not a gather"),
      "grouped needs a gather");
  check(
      cu::kernel_request_from_name("grouped") == cu::KernelRequest::grouped,
      "grouped request name");

  // The strided copy of x: a thread an element, the grid capped at 8 blocks
  // an SM (the kernel loops).
  const auto copy = cu::plan_strided_copy(1000, h200);
  check(
      copy.grid[0] == 4 && copy.block[0] == fpqmm::cuda::kCopyThreads,
      "strided copy grid");
  check(
      cu::plan_strided_copy(int64_t(1) << 40, h200).grid[0] == 132 * 8,
      "strided copy grid capped");

  // Empty outputs plan without dividing by zero.
  auto empty = auto_plan(problem(Mode::mxfp4, true, 1, 0, 64), h200);
  check(empty.main.grid[0] == 0 && empty.split_k == 1, "N = 0");
  auto no_rows = auto_plan(problem(Mode::mxfp4, false, 0, 256, 64), h200);
  check(no_rows.main.grid[1] == 0, "M = 0");

  // cached_plan: plan()'s plan, made once per problem, device and request.
  const auto repeated = problem(Mode::mxfp4, true, 1, 4096, 4096);
  const auto& cached =
      cu::cached_plan(repeated, h200, cu::KernelRequest::automatic);
  const auto made = auto_plan(repeated, h200);
  check(
      cached.main.kernel == made.main.kernel &&
          cached.main.grid == made.main.grid && cached.note == made.note,
      "cached plan: " + cached.main.kernel);
  check(
      &cu::cached_plan(repeated, h200, cu::KernelRequest::automatic) == &cached,
      "a plan is made once");
  check(
      cu::cached_plan(repeated, h200, cu::KernelRequest::simple).path ==
          cu::KernelPath::simple,
      "the request is part of the key");
  const auto prefill = problem(Mode::mxfp4, true, 64, 4096, 4096);
  check(
      cu::cached_plan(prefill, h200, cu::KernelRequest::automatic).path ==
              cu::KernelPath::wgmma &&
          cu::cached_plan(prefill, a100, cu::KernelRequest::automatic).path ==
              auto_plan(prefill, a100).path &&
          auto_plan(prefill, a100).path != cu::KernelPath::wgmma,
      "the device is part of the key");
  auto unaligned_prefill = prefill;
  unaligned_prefill.pointer_alignment = 4;
  check(
      cu::cached_plan(unaligned_prefill, h200, cu::KernelRequest::automatic)
                  .path == auto_plan(unaligned_prefill, h200).path &&
          auto_plan(unaligned_prefill, h200).path != cu::KernelPath::wgmma,
      "the alignment is part of the key");
  for (int n = 1; n <= int(cu::kCachedPlans) + 8; ++n) {
    const auto p = problem(Mode::mxfp4, true, 1, 16 * n, 4096);
    if (cu::cached_plan(p, h200, cu::KernelRequest::automatic).main.grid !=
        auto_plan(p, h200).main.grid) {
      check(false, "cached plan of N = " + std::to_string(16 * n));
    }
  }

  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
