// FpQuantizedMatmul and FpGatherQuantizedMatmul on Apple GPUs: carry out the
// plan of backend/metal/plan.h (kernel, grid, threadgroup memory, function
// constants, buffers) with the project's own metallibs, installed beside
// this module.
#include <stdexcept>
#include <string>

#include "primitives/primitives.h"

#if defined(_METAL_) && !defined(MLX_FPQMM_NO_METAL_KERNELS)

#include <array>
#include <string>
#include <variant>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/metal/device.h"

#include "backend/common/problem.h"
#include "backend/metal/plan.h"

namespace mlx_fpqmm {

namespace {

metal::GpuDevice gpu_device(mx::metal::Device& d) {
  static const auto macos = metal::running_macos_version();
  return {d.get_architecture(), macos.first, macos.second};
}

// Binds `buffers` (operand `written` as the output, the other operands from
// `array_for`) and dispatches the encoder's pipeline.
template <typename ArrayFor>
void bind_and_dispatch(
    mx::metal::CommandEncoder& encoder,
    const std::vector<metal::BufferBinding>& buffers,
    const std::array<int, 3>& grid,
    const std::array<int, 3>& threadgroup,
    mx::array& written_array,
    metal::Operand written,
    ArrayFor&& array_for) {
  for (const auto& binding : buffers) {
    std::visit(
        [&](const auto& value) {
          using V = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<V, metal::Operand>) {
            if (value == written) {
              encoder.set_output_array(written_array, binding.index);
            } else {
              encoder.set_input_array(array_for(value), binding.index);
            }
          } else if constexpr (std::is_same_v<V, int32_t>) {
            encoder.set_bytes(value, binding.index);
          } else {
            encoder.set_vector_bytes(value, binding.index);
          }
        },
        binding.value);
  }
  encoder.dispatch_threadgroups(
      MTL::Size(grid[0], grid[1], grid[2]),
      MTL::Size(threadgroup[0], threadgroup[1], threadgroup[2]));
}

// Carries out `plan` on stream `s`: `input_for` gives the array an operand
// binds. With split K, the main dispatch writes float32 partial sums to a
// temporary and the reduction adds them into `out`.
template <typename InputFor>
void run_plan(
    const metal::KernelPlan& plan,
    mx::Stream s,
    mx::array& out,
    InputFor&& input_for) {
  auto& d = mx::metal::device(s.device);
  mx::metal::MTLFCList constants;
  for (const auto& constant : plan.constants) {
    bool is_bool = std::holds_alternative<bool>(constant.value);
    constants.emplace_back(
        std::visit(
            [](const auto& v) -> const void* { return &v; }, constant.value),
        is_bool ? MTL::DataType::DataTypeBool : MTL::DataType::DataTypeInt,
        constant.index);
  }
  auto* library = d.get_library(plan.library, metal::module_directory());
  auto* kernel =
      d.get_kernel(plan.kernel, library, plan.pipeline_name(), constants);

  auto& encoder = mx::metal::get_command_encoder(s);
  // Split K's float32 partial sums (no data without a reduction).
  mx::array partials(
      {plan.reduction ? static_cast<int>(plan.partials_elements) : 0},
      mx::float32,
      nullptr,
      {});
  // Arrays are handles: returning one by value copies no data.
  auto array_for = [&](metal::Operand o) -> mx::array {
    if (o == metal::Operand::partials) {
      return partials;
    }
    return o == metal::Operand::y ? out : input_for(o);
  };
  encoder.set_compute_pipeline_state(kernel);
  for (auto [index, bytes] : plan.threadgroup_memory) {
    encoder.set_threadgroup_memory_length(bytes, index);
  }
  if (!plan.reduction) {
    bind_and_dispatch(
        encoder,
        plan.buffers,
        plan.grid,
        plan.threadgroup,
        out,
        metal::Operand::y,
        array_for);
    return;
  }
  partials.set_data(mx::allocator::malloc(partials.nbytes()));
  encoder.add_temporary(partials);
  bind_and_dispatch(
      encoder,
      plan.buffers,
      plan.grid,
      plan.threadgroup,
      partials,
      metal::Operand::partials,
      array_for);
  const auto& sum = *plan.reduction;
  encoder.set_compute_pipeline_state(d.get_kernel(
      sum.kernel, d.get_library(sum.library, metal::module_directory())));
  bind_and_dispatch(
      encoder,
      sum.buffers,
      sum.grid,
      sum.threadgroup,
      out,
      metal::Operand::y,
      array_for);
}

// The plan of `problem` on the stream's GPU. The NAX library is loaded only
// where the plan chose it, so only on GPUs and macOS versions that pass its
// rule.
metal::KernelPlan plan_on(const QmmProblem& problem, mx::Stream s) {
  return metal::plan(
      problem,
      gpu_device(mx::metal::device(s.device)),
      metal::kernel_request_from_env(),
      metal::nax_library_installed());
}

}  // namespace

void FpQuantizedMatmul::eval_gpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) {
    return;
  }
  // The ops copy inputs where needed (libmlx's GPU copy is not exported to
  // eval_gpu), so a failure here is a bug.
  check_readable_in_place(inputs);
  auto problem = describe_problem(
      inputs, out.shape(), mode_, group_size_, transpose_, true);
  run_plan(plan_on(problem, stream()), stream(), out, [&](metal::Operand o) {
    return input(inputs, metal::input_of(o));
  });
}

void FpGatherQuantizedMatmul::eval_gpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) {
    return;
  }
  // Every input is row-contiguous (fp_gather_qmm_unchecked makes it so).
  auto problem = describe_gather_problem(*this, inputs, out.shape());
  run_plan(plan_on(problem, stream()), stream(), out, [&](metal::Operand o) {
    return input(inputs, metal::gather_input_of(o));
  });
}

}  // namespace mlx_fpqmm

#endif
