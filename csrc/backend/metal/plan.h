// Every decision of the Metal path in plain C++ (built and tested on Linux):
// which kernel a call runs, on what grid, with which threadgroup memory,
// function constants and buffer bindings. eval_gpu only carries a plan out.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "backend/metal/device.h"

namespace mlx_fpqmm::metal {

enum class KernelPath { qmv, mma, nax };
enum class KernelRequest { automatic, qmv, mma, nax };

std::string_view path_name(KernelPath path);
std::optional<KernelRequest> kernel_request_from_name(std::string_view name);
std::string_view request_name(KernelRequest request);  // "auto", "qmv", ...
// MLX_FPQMM_KERNEL=auto|qmv|mma|nax (unset: auto); throws on other values.
KernelRequest kernel_request_from_env();

// Whether a gather call runs the sorted-runs kernels (MLX's rule for its
// "rhs" path: one row per pair, sorted experts, at least 16 pairs and 4 per
// expert, x matrix = pair), unless the decode kernels are requested.
bool uses_sorted_runs(const QmmProblem& problem, KernelRequest request);

// Why the NAX kernels cannot run this problem on this device, or nothing.
// `nax_kernels_built`: the NAX metallib is there to load.
std::optional<std::string> nax_unavailable_reason(
    const QmmProblem& problem, const GpuDevice& device, bool nax_kernels_built);

struct PathChoice {
  KernelPath path;
  std::string note;  // why, including why not the requested path
};

// Throws std::runtime_error when NAX is requested and cannot run.
PathChoice choose_path(
    const QmmProblem& problem,
    const GpuDevice& device,
    KernelRequest request,
    bool nax_kernels_built);

// `partials` is no input: a float32 scratch array of
// KernelPlan::partials_elements that eval_gpu allocates for split K.
enum class Operand {
  w,
  scales,
  global_scale,
  x,
  y,
  lhs_indices,
  rhs_indices,
  partials
};

inline constexpr std::array<std::string_view, 8> kOperandNames = {
    "w",
    "scales",
    "global_scale",
    "x",
    "y",
    "lhs_indices",
    "rhs_indices",
    "partials"};

// The primitive's input a kernel operand other than y binds.
Input input_of(Operand operand);
// The same for FpGatherQuantizedMatmul.
GatherInput gather_input_of(Operand operand);

struct BufferBinding {
  int index;
  std::variant<Operand, int32_t, std::vector<int32_t>, std::vector<int64_t>>
      value;
};

struct FunctionConstant {
  int index;
  std::variant<bool, int32_t> value;
};

// A dispatch after the main one (split K's sum of the partials): no
// threadgroup memory, no function constants.
struct FollowUpDispatch {
  std::string library;  // kBaseLibrary
  std::string kernel;
  std::array<int, 3> grid;         // threadgroups
  std::array<int, 3> threadgroup;  // threads
  std::vector<BufferBinding> buffers;
};

struct KernelPlan {
  KernelRequest requested;
  KernelPath path;
  std::string note;
  std::string library;             // kBaseLibrary or kNaxLibrary
  std::string kernel;              // host_name in the library
  std::array<int, 3> grid;         // threadgroups
  std::array<int, 3> threadgroup;  // threads
  // Rows of x and columns of y per threadgroup tile (0 for the decode
  // kernels, which have no tiles): W moves ceil(M / block_m) times, x
  // ceil(N / block_n) times.
  int block_m = 0;
  int block_n = 0;
  std::vector<std::pair<int, int>> threadgroup_memory;  // index, bytes
  std::vector<FunctionConstant> constants;
  std::vector<BufferBinding> buffers;
  // Split K: the main dispatch writes split_k float32 slices of partial sums
  // (Operand::partials, partials_elements in all) and `reduction` adds them
  // into y. split_k 1: the main dispatch writes y, no reduction.
  int split_k = 1;
  int64_t partials_elements = 0;
  std::optional<FollowUpDispatch> reduction;

  // The kernel name with its function-constant values: the pipeline cache key.
  std::string pipeline_name() const;
};

KernelPlan plan(
    const QmmProblem& problem,
    const GpuDevice& device,
    KernelRequest request,
    bool nax_kernels_built);

}  // namespace mlx_fpqmm::metal
