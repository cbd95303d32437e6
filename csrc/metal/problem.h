// From FpQuantizedMatmul's inputs to the plan's QmmProblem; shared by
// eval_gpu and the Python bindings so both plan the same call the same way.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mlx/array.h"

#include "metal/plan.h"
#include "primitives.h"

namespace mlx_fpqmm::metal {

namespace mx = mlx::core;

// The primitive's input a kernel operand other than y binds.
Input input_of(Operand operand);
// The same for FpGatherQuantizedMatmul.
GatherInput gather_input_of(Operand operand);

// `inputs` are the primitive's (Input in primitives.h), already readable in
// place (readable_in_place). Without `strides_known` (unevaluated arrays) the
// batch strides are those of row-contiguous arrays.
QmmProblem describe_problem(
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    Mode mode,
    int group_size,
    bool transpose,
    bool strides_known);

// The same for FpGatherQuantizedMatmul's inputs (GatherInput in
// primitives.h), row-contiguous as the op makes them.
QmmProblem describe_gather_problem(
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    Mode mode,
    int group_size,
    bool transpose,
    bool right_sorted);

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
