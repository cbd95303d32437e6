// From FpQuantizedMatmul's inputs to the plan's QmmProblem; shared by
// eval_gpu and the Python bindings so both plan the same call the same way.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mlx/array.h"

#include "metal/plan.h"

namespace mlx_fpqmm::metal {

namespace mx = mlx::core;

// Whether the kernels can read input `index` in place: matrices must be
// row-contiguous (all of x when its rows fold into M, with 2-D weights);
// batch strides may be anything.
bool readable_in_place(const std::vector<mx::array>& inputs, int index);

// `inputs` are the primitive's (x, w, scales[, global_scale]), already
// readable in place. Without `strides_known` (unevaluated arrays) the batch
// strides are those of row-contiguous arrays.
QmmProblem describe_problem(
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    Mode mode,
    int group_size,
    bool transpose,
    bool strides_known);

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
