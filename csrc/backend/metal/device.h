// The Apple GPU as the Metal plan models it: its architecture name, macOS
// version and core counts, and where this module's metallibs are.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "backend/common/problem.h"

namespace mlx_fpqmm::metal {

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

// The published GPU core counts of the parts of a generation and size class
// (a range: a class covers several chips and their binned variants).
struct CoreRange {
  int fewest, most;
};
CoreRange gpu_core_range(const GpuDevice& device);

// Below this many rows of x the decode (matrix-vector) kernels beat the MMA
// kernels; MLX's table for transpose=True, by GPU generation and size class.
int decode_row_limit(const QmmProblem& problem, const GpuDevice& device);

// The metallibs, installed beside the module as <name>.metallib. The NAX
// kernels have their own: it needs Metal 4, which not every SDK builds.
inline constexpr std::string_view kBaseLibrary = "mlx_fpqmm";
inline constexpr std::string_view kNaxLibrary = "mlx_fpqmm_nax";

// "26.2" -> {26, 2}; throws on anything else.
std::pair<int, int> parse_os_version(const std::string& version);

// The running macOS version ({0, 0} elsewhere).
std::pair<int, int> running_macos_version();

// The directory of this extension module, where the metallibs are installed
// (MLX's own current_binary_dir() would name libmlx's).
const std::string& module_directory();

// Whether the build installed the NAX metallib (only SDKs with Metal 4 can).
bool nax_library_installed();

}  // namespace mlx_fpqmm::metal
