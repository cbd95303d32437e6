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

#include "formats.h"

namespace mlx_fpqmm::metal {

// FloatType, type_name and float_type_from_name are formats.h's.
int itemsize(FloatType type);

// What the plan needs to know about the GPU.
struct GpuDevice {
  std::string architecture;  // MTLDevice architecture name, "applegpu_g16s"
  int macos_major = 0;
  int macos_minor = 0;

  // The two digits after "applegpu_g" (0 when the name has another form).
  int generation() const;
  // The size class after the generation: 'p' phone, 'g' base/Pro,
  // 's' Max, 'd' Ultra (0 when absent).
  char size_class() const;
};

enum class KernelPath { qmv, mma, nax };
enum class KernelRequest { automatic, qmv, mma, nax };

std::string_view path_name(KernelPath path);
std::optional<KernelRequest> kernel_request_from_name(std::string_view name);
std::string_view request_name(KernelRequest request);  // "auto", "qmv", ...
// MLX_FPQMM_KERNEL=auto|qmv|mma|nax (unset: auto); throws on other values.
KernelRequest kernel_request_from_env();

// One FpQuantizedMatmul call as the kernels see it: x is (batch..., M, K),
// w and scales are (batch..., N or K, ...), y is (batch..., M, N) contiguous.
// With 2-D weights every leading dimension of x is folded into M.
struct QmmProblem {
  Mode mode;
  int group_size;
  bool transpose;
  int M, N, K;
  FloatType x_type;
  std::optional<FloatType> scale_type;  // float-scale modes only
  bool has_global_scale = false;
  std::vector<int> batch_shape;  // empty: one matrix product
  // Per batch axis, in elements of each buffer (uint32 words for w).
  std::vector<int64_t> x_batch_strides;
  std::vector<int64_t> w_batch_strides;
  std::vector<int64_t> scales_batch_strides;
  // Gather (mixture of experts): batch_shape holds the number of index
  // pairs; pair z multiplies x matrix lhs_indices[z] with W matrix
  // rhs_indices[z], out of x_matrices and w_matrices row-contiguous ones.
  bool gather = false;
  int x_matrices = 0;
  int w_matrices = 0;
  // The caller says rhs_indices are sorted (mlx-lm's sorted tokens).
  bool right_sorted = false;

  int64_t batch_count() const;
};

// Whether a gather call runs the sorted-runs kernels (MLX's rule for its
// "rhs" path: one row per pair, sorted experts, at least 16 pairs and 4 per
// expert, x matrix = pair), unless the decode kernels are requested.
bool uses_sorted_runs(const QmmProblem& problem, KernelRequest request);

// The published GPU core counts of the parts of a generation and size class
// (a range: a class covers several chips and their binned variants).
struct CoreRange {
  int fewest, most;
};
CoreRange gpu_core_range(const GpuDevice& device);

// Below this many rows of x the decode (matrix-vector) kernels beat the MMA
// kernels; MLX's table for transpose=True, by GPU generation and size class.
int decode_row_limit(const QmmProblem& problem, const GpuDevice& device);

// MLX_ENABLE_TF32 (MLX's switch, default on): whether float32 x may run on
// the neural accelerators, which multiply float32 at reduced precision.
bool tf32_enabled_from_env();

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

// The metallibs, installed beside the module as <name>.metallib. The NAX
// kernels have their own: it needs Metal 4, which not every SDK builds.
inline constexpr std::string_view kBaseLibrary = "mlx_fpqmm";
inline constexpr std::string_view kNaxLibrary = "mlx_fpqmm_nax";

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
