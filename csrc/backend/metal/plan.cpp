#include "backend/metal/plan.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include "backend/common/kernel_request.h"
#include "backend/metal/kernels/fp_params.h"

namespace mlx_fpqmm::metal {

namespace {

int ceil_div(int64_t a, int64_t b) {
  return static_cast<int>((a + b - 1) / b);
}

int round_up(int value, int multiple) {
  return ceil_div(value, multiple) * multiple;
}

// Threadgroup memory lengths must be multiples of 16 bytes.
std::pair<int, int> threadgroup_buffer(int index, int bytes) {
  return {index, round_up(bytes, 16)};
}

constexpr int kMaxThreadgroupMemory = 32 * 1024;

// "e2m1" / "e4m3": the code format the kernel template is instantiated for.
std::string_view codes_name(Mode mode) {
  return format_for(mode).codes == CodeKind::e2m1 ? "e2m1" : "e4m3";
}

std::string kernel_name(
    std::string_view kernel, int block_m, const QmmProblem& problem) {
  return std::string(problem.gather ? "fpqmm_gather_" : "fpqmm_") +
         std::string(kernel) + "_bm" + std::to_string(block_m) + "_" +
         std::string(codes_name(problem.mode)) + "_" +
         std::string(type_name(problem.x_type));
}

// The kernel, grid and threadgroup memory of each family.
void plan_qmv(const QmmProblem& p, KernelPlan& plan) {
  plan.kernel = kernel_name("qmv", fpqmm::kQmvRows, p);
  plan.threadgroup = {fpqmm::kSimdSize * fpqmm::kQmvSimdgroups, 1, 1};
  plan.grid = {
      ceil_div(p.M, fpqmm::kQmvRows),
      ceil_div(p.N, fpqmm::kQmvSimdgroups * fpqmm::kQmvOutputs),
      1};
}

void plan_qvm(const QmmProblem& p, KernelPlan& plan) {
  constexpr int columns = fpqmm::kSimdSize * fpqmm::kQvmColumnsPerLane;
  plan.kernel = kernel_name("qvm", fpqmm::kQvmRows, p);
  plan.threadgroup = {fpqmm::kSimdSize * fpqmm::kQvmSimdgroups, 1, 1};
  plan.grid = {ceil_div(p.N, columns), ceil_div(p.M, fpqmm::kQvmRows), 1};
  // Partial sums of all simdgroups but the first, reduced by the first.
  plan.threadgroup_memory = {threadgroup_buffer(
      0,
      (fpqmm::kQvmSimdgroups - 1) * fpqmm::kQvmRows * columns *
          int(sizeof(float)))};
}

void plan_mma(const QmmProblem& p, KernelPlan& plan) {
  // 64-row tiles halve the weight traffic once x has more than 32 rows.
  int block_m = p.transpose && p.M > 32 ? 64 : 32;
  int item = itemsize(p.x_type);
  int x_tile = block_m * fpqmm::padded_row(fpqmm::kMmaBlockK, item) * item;
  int w_tile = p.transpose
                   ? fpqmm::kMmaBlockN *
                         fpqmm::padded_row(fpqmm::kMmaBlockK, item) * item
                   : fpqmm::kMmaBlockK *
                         fpqmm::padded_row(fpqmm::kMmaBlockN, item) * item;
  plan.kernel = kernel_name(p.transpose ? "mma_t" : "mma_n", block_m, p);
  plan.block_m = block_m;
  plan.block_n = fpqmm::kMmaBlockN;
  plan.threadgroup = {fpqmm::kMmaThreads, 1, 1};
  plan.grid = {ceil_div(p.N, fpqmm::kMmaBlockN), ceil_div(p.M, block_m), 1};
  plan.threadgroup_memory = {
      threadgroup_buffer(0, x_tile), threadgroup_buffer(1, w_tile)};
}

void plan_nax(const QmmProblem& p, KernelPlan& plan) {
  // MLX's choice: 32-row tiles up to M = 32 (no steps on zero rows), 64 rows
  // above (half the weight traffic).
  int block_m = p.M > 32 ? 64 : 32;
  int item = itemsize(p.x_type);
  int x_tile = block_m * fpqmm::padded_row(fpqmm::kNaxBlockK, item) * item;
  int w_tile = fpqmm::kNaxBlockN *
               fpqmm::padded_row(fpqmm::kNaxBlockK, fpqmm::kNaxWeightItemsize) *
               fpqmm::kNaxWeightItemsize;
  plan.library = kNaxLibrary;
  plan.kernel = kernel_name("nax_t", block_m, p);
  plan.block_m = block_m;
  plan.block_n = fpqmm::kNaxBlockN;
  plan.threadgroup = {fpqmm::kNaxThreads, 1, 1};
  plan.grid = {ceil_div(p.N, fpqmm::kNaxBlockN), ceil_div(p.M, block_m), 1};
  plan.threadgroup_memory = {
      threadgroup_buffer(0, x_tile), threadgroup_buffer(1, w_tile)};
}

// Split K where the MMA or NAX tiles alone would leave most of the GPU idle:
// fewer threadgroups than twice the cores of the largest part of the
// device's class (two per core hide each other's barriers and loads). Each
// split covers a multiple of the K block and of the group size, at least
// kSplitKMinStep; W and x still move once per tile, the partial sums add
// 2 x 4 bytes per output and split (written, read back), so the split stays
// the smallest that reaches the target. As MLX: transpose only, one matrix.
void plan_split_k(
    const QmmProblem& p, const GpuDevice& device, KernelPlan& plan) {
  if (!p.transpose || p.gather || p.batch_count() != 1) {
    return;
  }
  int tiles = plan.grid[0] * plan.grid[1];
  int target = 2 * gpu_core_range(device).most;
  if (tiles == 0 || tiles >= target) {  // no tiles: an empty output
    return;
  }
  bool nax = plan.path == KernelPath::nax;
  int step_multiple =
      std::max(nax ? fpqmm::kNaxBlockK : fpqmm::kMmaBlockK, p.group_size);
  int max_splits = p.K / round_up(fpqmm::kSplitKMinStep, step_multiple);
  int wanted = std::min(ceil_div(target, tiles), max_splits);
  if (wanted < 2) {
    return;
  }
  int step = round_up(ceil_div(p.K, wanted), step_multiple);
  int splits = ceil_div(p.K, step);
  if (splits < 2) {
    return;
  }
  plan.kernel =
      kernel_name(nax ? "nax_t_split_k" : "mma_t_split_k", plan.block_m, p);
  plan.grid[2] = splits;
  plan.split_k = splits;
  plan.partials_elements = int64_t(splits) * p.M * p.N;
  plan.note += "; split_k=" + std::to_string(splits) + ": " +
               std::to_string(tiles) + " tiles for about " +
               std::to_string(target) + " threadgroups (2 per core)";
  plan.buffers.push_back({FPQMM_BUFFER_PARTIALS, Operand::partials});
  plan.buffers.push_back({FPQMM_BUFFER_SPLIT_K_STEP, int32_t(step)});
  FollowUpDispatch sum;
  sum.library = kBaseLibrary;
  sum.kernel = "fpqmm_split_k_sum_" + std::string(type_name(p.x_type));
  sum.grid = {ceil_div(int64_t(p.M) * p.N, fpqmm::kSplitKSumThreads), 1, 1};
  sum.threadgroup = {fpqmm::kSplitKSumThreads, 1, 1};
  sum.buffers = {
      {FPQMM_BUFFER_PARTIALS, Operand::partials},
      {FPQMM_BUFFER_Y, Operand::y},
      {FPQMM_BUFFER_M, int32_t(p.M)},
      {FPQMM_BUFFER_N, int32_t(p.N)},
      {FPQMM_BUFFER_SPLITS, int32_t(splits)}};
  plan.reduction = std::move(sum);
}

// The sorted-runs gather kernels: the pairs are the rows of x (one each),
// 32 rows per threadgroup, one MMA or NAX tile per run of equal experts.
void plan_sorted_runs(const QmmProblem& p, KernelPlan& plan) {
  if (plan.path == KernelPath::nax) {
    plan_nax(p, plan);
  } else {
    plan_mma(p, plan);
  }
  bool nax = plan.path == KernelPath::nax;
  plan.kernel = kernel_name(
      nax           ? "rhs_nax_t"
      : p.transpose ? "rhs_mma_t"
                    : "rhs_mma_n",
      plan.block_m,
      p);
  plan.grid = {
      ceil_div(p.N, plan.block_n), ceil_div(p.batch_count(), plan.block_m), 1};
}

void bind_buffers(const QmmProblem& p, KernelPlan& plan) {
  auto& b = plan.buffers;
  b.push_back({FPQMM_BUFFER_W, Operand::w});
  b.push_back({FPQMM_BUFFER_SCALES, Operand::scales});
  if (p.has_global_scale) {
    b.push_back({FPQMM_BUFFER_GLOBAL_SCALE, Operand::global_scale});
  }
  b.push_back({FPQMM_BUFFER_X, Operand::x});
  b.push_back({FPQMM_BUFFER_Y, Operand::y});
  b.push_back({FPQMM_BUFFER_M, int32_t(p.M)});
  b.push_back({FPQMM_BUFFER_N, int32_t(p.N)});
  b.push_back({FPQMM_BUFFER_K, int32_t(p.K)});
  b.push_back({FPQMM_BUFFER_BATCH_NDIMS, int32_t(p.batch_shape.size())});
  // Metal needs some bytes behind every bound slot, even when unused.
  auto nonempty = [](auto values) {
    if (values.empty()) {
      values.push_back(0);
    }
    return values;
  };
  b.push_back({FPQMM_BUFFER_BATCH_SHAPE, nonempty(p.batch_shape)});
  b.push_back({FPQMM_BUFFER_X_BATCH_STRIDES, nonempty(p.x_batch_strides)});
  b.push_back({FPQMM_BUFFER_W_BATCH_STRIDES, nonempty(p.w_batch_strides)});
  b.push_back(
      {FPQMM_BUFFER_SCALES_BATCH_STRIDES, nonempty(p.scales_batch_strides)});
  if (p.gather) {
    b.push_back({FPQMM_BUFFER_LHS_INDICES, Operand::lhs_indices});
    b.push_back({FPQMM_BUFFER_RHS_INDICES, Operand::rhs_indices});
    b.push_back({FPQMM_BUFFER_X_MATRICES, int32_t(p.x_matrices)});
    b.push_back({FPQMM_BUFFER_W_MATRICES, int32_t(p.w_matrices)});
    b.push_back({FPQMM_BUFFER_LHS_DIVISOR, int32_t(p.lhs_divisor)});
  }
}

}  // namespace

Input input_of(Operand operand) {
  switch (operand) {
    case Operand::w:
      return Input::w;
    case Operand::scales:
      return Input::scales;
    case Operand::global_scale:
      return Input::global_scale;
    case Operand::x:
      return Input::x;
    case Operand::y:
    case Operand::lhs_indices:
    case Operand::rhs_indices:
    case Operand::partials:
      break;
  }
  throw std::invalid_argument(
      "[metal] " + std::string(kOperandNames[static_cast<int>(operand)]) +
      " is not an input of FpQuantizedMatmul.");
}

GatherInput gather_input_of(Operand operand) {
  switch (operand) {
    case Operand::lhs_indices:
      return GatherInput::lhs_indices;
    case Operand::rhs_indices:
      return GatherInput::rhs_indices;
    case Operand::global_scale:
      return GatherInput::global_scale;
    default:
      // x, w and scales lead both input lists.
      return static_cast<GatherInput>(input_of(operand));
  }
}

std::string_view path_name(KernelPath path) {
  constexpr std::array<std::string_view, 3> names = {"qmv", "mma", "nax"};
  return names[static_cast<size_t>(path)];
}

namespace {

constexpr RequestNames<KernelRequest, 4> kRequestNames = {
    {{"auto", KernelRequest::automatic},
     {"qmv", KernelRequest::qmv},
     {"mma", KernelRequest::mma},
     {"nax", KernelRequest::nax}}};

}  // namespace

std::optional<KernelRequest> kernel_request_from_name(std::string_view name) {
  return request_from_name(kRequestNames, name);
}

std::string_view request_name(KernelRequest request) {
  return name_of(kRequestNames, request);
}

KernelRequest kernel_request_from_env() {
  return request_from_env(kRequestNames, "Metal");
}

bool uses_sorted_runs(const QmmProblem& problem, KernelRequest request) {
  int64_t pairs = problem.batch_count();
  return problem.gather && problem.right_sorted && problem.M == 1 &&
         pairs >= 16 && pairs >= 4 * int64_t(problem.w_matrices) &&
         problem.x_matrices == pairs && request != KernelRequest::qmv;
}

std::optional<std::string> nax_unavailable_reason(
    const QmmProblem& problem,
    const GpuDevice& device,
    bool nax_kernels_built) {
  int needed_generation = device.size_class() == 'p' ? 18 : 17;
  if (device.generation() < needed_generation) {
    return "the GPU (" + device.architecture + ") is older than generation " +
           std::to_string(needed_generation);
  }
  if (device.macos_major < 26 ||
      (device.macos_major == 26 && device.macos_minor < 2)) {
    return "macOS " + std::to_string(device.macos_major) + "." +
           std::to_string(device.macos_minor) + " is older than 26.2";
  }
  if (!nax_kernels_built) {
    return std::string("this build has no NAX kernels");
  }
  if (!problem.transpose) {
    return std::string("there is no NAX kernel for transpose=False");
  }
  // W is staged in bfloat: exact for the formats whose scaled codes are
  // (Format::bf16_exact), rounded for the others and for nvfp4's global
  // scale, a rounding that only bfloat16 x's own precision absorbs.
  bool weights_exact_in_bfloat =
      format_for(problem.mode).bf16_exact && !problem.has_global_scale;
  if (!weights_exact_in_bfloat && problem.x_type != FloatType::bfloat16) {
    return "the NAX kernels round these weights to bfloat, beyond what " +
           std::string(type_name(problem.x_type)) + " x tolerates";
  }
  // Any K: the kernel steps through K by 16, and every group size is a
  // multiple of 16.
  if (problem.x_type == FloatType::float32 && !tf32_enabled_from_env()) {
    return std::string(
        "float32 x runs at reduced precision there and MLX_ENABLE_TF32=0");
  }
  return std::nullopt;
}

PathChoice choose_path(
    const QmmProblem& problem,
    const GpuDevice& device,
    KernelRequest request,
    bool nax_kernels_built) {
  auto nax_blocker = nax_unavailable_reason(problem, device, nax_kernels_built);
  switch (request) {
    case KernelRequest::qmv:
      return {KernelPath::qmv, "qmv requested"};
    case KernelRequest::mma:
      return {KernelPath::mma, "mma requested"};
    case KernelRequest::nax:
      if (nax_blocker) {
        throw std::runtime_error(
            "The NAX kernel was requested (MLX_FPQMM_KERNEL=nax or "
            "kernel='nax') but cannot run: " +
            *nax_blocker + ".");
      }
      return {KernelPath::nax, "nax requested"};
    case KernelRequest::automatic:
      break;
  }
  int limit = decode_row_limit(problem, device);
  std::string rows = "M=" + std::to_string(problem.M);
  if (problem.M < limit) {
    return {
        KernelPath::qmv,
        rows + " is below the decode limit " + std::to_string(limit)};
  }
  std::string at_limit =
      rows + " reaches the decode limit " + std::to_string(limit);
  if (nax_blocker) {
    return {KernelPath::mma, at_limit + "; no NAX: " + *nax_blocker};
  }
  return {KernelPath::nax, at_limit};
}

std::string KernelPlan::pipeline_name() const {
  std::string name = kernel;
  for (const auto& constant : constants) {
    name += "_c" + std::to_string(constant.index) + "_";
    name += std::visit(
        [](auto value) { return std::to_string(int(value)); }, constant.value);
  }
  return name;
}

KernelPlan plan(
    const QmmProblem& problem,
    const GpuDevice& device,
    KernelRequest request,
    bool nax_kernels_built) {
  bool sorted_runs = uses_sorted_runs(problem, request);
  auto choice = choose_path(problem, device, request, nax_kernels_built);
  if (sorted_runs) {
    // On the NAX tiles where they may run, else on the MMA tiles.
    bool nax = request != KernelRequest::mma &&
               !nax_unavailable_reason(problem, device, nax_kernels_built);
    choice = {
        nax ? KernelPath::nax : KernelPath::mma,
        "one row per pair with sorted experts: one tile per run of an "
        "expert (MLX's rule for its rhs kernel)"};
  }
  KernelPlan plan{request, choice.path, std::move(choice.note)};
  plan.library = kBaseLibrary;
  if (sorted_runs) {
    plan_sorted_runs(problem, plan);
  } else if (choice.path == KernelPath::nax) {
    plan_nax(problem, plan);
    plan_split_k(problem, device, plan);
  } else if (choice.path == KernelPath::mma) {
    plan_mma(problem, plan);
    plan_split_k(problem, device, plan);
  } else if (problem.transpose) {
    plan_qmv(problem, plan);
  } else {
    plan_qvm(problem, plan);
  }
  if (!sorted_runs && plan.split_k == 1) {
    plan.grid[2] = static_cast<int>(problem.batch_count());
  }
  int threadgroup_bytes = 0;
  for (auto [index, bytes] : plan.threadgroup_memory) {
    threadgroup_bytes += bytes;
  }
  if (threadgroup_bytes > kMaxThreadgroupMemory) {
    throw std::logic_error(
        "[metal::plan] " + plan.kernel + " needs " +
        std::to_string(threadgroup_bytes) + " bytes of threadgroup memory.");
  }
  plan.constants = {
      {FPQMM_CONSTANT_GROUP_SIZE, int32_t(problem.group_size)},
      {FPQMM_CONSTANT_SCALE_ENCODING,
       static_cast<int32_t>(scale_encoding(problem.mode, problem.scale_type))},
      {FPQMM_CONSTANT_HAS_GLOBAL_SCALE, problem.has_global_scale}};
  bind_buffers(problem, plan);
  return plan;
}

}  // namespace mlx_fpqmm::metal
