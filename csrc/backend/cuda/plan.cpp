#include "backend/cuda/plan.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <stdexcept>

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
  std::string name = std::string(key.transpose ? "fpqmm_qmv_" : "fpqmm_qvm_") +
                     std::string(codes_name(key.bits)) + "_" +
                     std::string(encoding_name(key.encoding)) + "_" +
                     std::string(type_name(key.x_type));
  if (key.transpose) {
    name += "_x" + std::to_string(key.x_blocks * fc::kQmvXBlockRows);
  }
  return name;
}

// The batch axes with runs contiguous in all three arrays folded into one.
void fold_batch(const QmmProblem& p, KernelPlan& plan) {
  plan.batch_count = 1;
  for (int size : p.batch_shape) {
    plan.batch_count *= size;
  }
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

// Split K where the blocks alone would not fill the GPU: up to about two
// blocks per SM, each split at least `min_step` codes of K (a multiple of
// `step_multiple`). The partial sums cost 8 bytes per output and split
// (written, read back) and a second kernel, so a grid of a block per SM or
// more is not split.
void plan_split_k(
    const QmmProblem& p,
    const CudaDevice& device,
    int64_t blocks,
    int step_multiple,
    int min_step,
    KernelPlan& plan) {
  plan.split_k = 1;
  plan.split_k_step = p.K;
  if (blocks == 0 || blocks >= device.sm_count || p.K < 2 * min_step) {
    return;
  }
  const int64_t wanted = ceil_div(2 * int64_t(device.sm_count), blocks);
  const int64_t splits = std::min(wanted, int64_t(p.K / min_step));
  const int64_t step = round_up(ceil_div(p.K, splits), step_multiple);
  const int64_t actual = ceil_div(p.K, step);
  if (actual < 2) {
    return;
  }
  plan.split_k = static_cast<int>(actual);
  plan.split_k_step = static_cast<int>(step);
  plan.partials_bytes =
      actual * plan.batch_count * int64_t(p.M) * p.N * int64_t(sizeof(float));
  plan.note += "; split_k=" + std::to_string(actual) + ": " +
               std::to_string(blocks) + " blocks for " +
               std::to_string(device.sm_count) + " SMs";
  const int64_t outputs = plan.batch_count * int64_t(p.M) * p.N;
  plan.reduction = Launch{
      "fpqmm_split_k_sum_" + std::string(type_name(p.x_type)),
      {static_cast<int>(std::min<int64_t>(
           ceil_div(outputs, fc::kSplitKSumThreads), 1 << 20)),
       1,
       1},
      {fc::kSplitKSumThreads, 1, 1},
      0};
}

}  // namespace

std::string_view path_name(KernelPath path) {
  constexpr std::array<std::string_view, 3> names = {"qmv", "qvm", "simple"};
  return names[static_cast<size_t>(path)];
}

namespace {

constexpr RequestNames<KernelRequest, 3> kRequestNames = {
    {{"auto", KernelRequest::automatic},
     {"qmv", KernelRequest::decode},
     {"simple", KernelRequest::simple}}};

}  // namespace

std::optional<KernelRequest> kernel_request_from_name(std::string_view name) {
  return request_from_name(kRequestNames, name);
}

std::string_view request_name(KernelRequest request) {
  return name_of(kRequestNames, request);
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
  int sm_count = 0;
  for (auto part : kParts) {
    if (part.capability <= number) {
      sm_count = part.sm_count;
    }
  }
  if (sm_count == 0) {
    sm_count = kParts.front().sm_count;
  }
  return CudaDevice{number / 10, number % 10, sm_count};
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
  const auto& p = problem;
  const Format& format = format_for(p.mode);
  KernelPlan plan{};
  plan.requested = request;
  fold_batch(p, plan);

  const std::string rows = "M=" + std::to_string(p.M);
  const bool decode_rows = p.M <= kDecodeRows;
  switch (request) {
    case KernelRequest::decode:
      plan.path = p.transpose ? KernelPath::qmv : KernelPath::qvm;
      plan.note = std::string(path_name(plan.path)) + " requested";
      break;
    case KernelRequest::simple:
      plan.path = KernelPath::simple;
      plan.note = "simple requested";
      break;
    case KernelRequest::automatic:
      plan.path = !decode_rows  ? KernelPath::simple
                  : p.transpose ? KernelPath::qmv
                                : KernelPath::qvm;
      plan.note =
          decode_rows
              ? rows + " is in the decode range (at most " +
                    std::to_string(kDecodeRows) + ")"
              : rows + " is above the decode range: the decode kernels tiled " +
                    "over M (no prefill kernels yet)";
      break;
  }

  const int x_blocks = p.transpose && plan.path != KernelPath::simple &&
                               p.M <= fc::kQmvXBlockRows
                           ? 1
                           : fc::kQmvMaxXBlocks;
  plan.key = KernelKey{
      p.transpose,
      format.bits,
      scale_encoding(p.mode, p.scale_type),
      p.x_type,
      p.transpose ? x_blocks : 0};
  plan.main.kernel = kernel_name(plan.key);

  int64_t column_blocks;
  int64_t m_blocks;
  if (p.transpose) {
    column_blocks = ceil_div(p.N, fc::kQmvRowsPerBlock);
    m_blocks = ceil_div(p.M, x_blocks * fc::kQmvXBlockRows);
    plan.main.block = {fc::kQmvWarps * fc::kWarpSize, 1, 1};
    plan.main.shared_bytes =
        fc::qmv_shared_bytes(format.bits, scale_itemsize(plan.key.encoding));
  } else {
    column_blocks = ceil_div(p.N, fc::kQvmColumnsPerBlock);
    m_blocks = ceil_div(p.M, fc::kQvmRows);
    plan.main.block = {fc::kQvmWarps * fc::kWarpSize, 1, 1};
    plan.main.shared_bytes = fc::kQvmSharedBytes;
  }
  const int64_t blocks = column_blocks * m_blocks * plan.batch_count;
  if (p.transpose) {
    plan_split_k(
        p,
        device,
        blocks,
        fc::kQmvStageCodes,
        fc::kQmvWarps * fc::kQmvStageCodes,
        plan);
  } else {
    plan_split_k(p, device, blocks, fc::kQvmChunk, fc::kQvmChunk, plan);
  }
  plan.main.grid = {
      static_cast<int>(column_blocks),
      static_cast<int>(std::min<int64_t>(m_blocks * plan.split_k, kMaxGridYZ)),
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

fpqmm::cuda::QmmArgs kernel_args(
    const QmmProblem& problem, const KernelPlan& plan) {
  fc::QmmArgs args{};
  args.M = problem.M;
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
  args.w_matrices = problem.w_matrices;
  args.split_k = plan.split_k;
  args.split_k_step = plan.split_k_step;
  return args;
}

}  // namespace mlx_fpqmm::cuda
