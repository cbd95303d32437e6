// Python bindings of the GPU plans: kernel_path() for users (the Metal plan
// or the CUDA plan, by device), and the private _metal_plan() /
// _metal_choose_path() behind mlx_fpqmm.testing and the tests.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <stdexcept>

#include "mlx/backend/gpu/device_info.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"

#include "backend/common/problem.h"
#include "backend/cuda/device.h"
#include "backend/cuda/plan.h"
#include "backend/metal/plan.h"
#include "ops/ops.h"
#include "ops/qmm.h"
#include "primitives/primitives.h"
#include "python/kernel_path.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx_fpqmm::metal {

namespace {

constexpr std::string_view kNewestMacos = "26.2";
// MLX's Metal wheels need macOS 14.
constexpr int kOldestMacos = 14;

GpuDevice device_description(
    const std::optional<std::string>& architecture,
    const std::optional<std::string>& macos) {
  GpuDevice device;
  if (architecture) {
    device.architecture = *architecture;
    if (device.generation() == 0) {
      throw std::invalid_argument(
          "device='" + *architecture +
          "' is not a GPU name; expected 'cuda', a compute capability "
          "such as 'sm_90', or an Apple GPU architecture "
          "'applegpu_g<generation><size class>' such as 'applegpu_g16s'.");
    }
  } else if (mx::gpu::is_available()) {
    device.architecture =
        std::get<std::string>(mx::gpu::device_info().at("architecture"));
  } else {
    throw std::invalid_argument(
        "No GPU here (neither Metal nor CUDA): pass device=, e.g. "
        "device='sm_90' or device='applegpu_g16s'.");
  }
  auto running = running_macos_version();
  auto version = macos ? parse_os_version(*macos)
                 : running.first > 0
                     ? running
                     : parse_os_version(std::string(kNewestMacos));
  if (macos && version.first < kOldestMacos) {
    throw std::invalid_argument(
        "macos='" + *macos + "' is older than MLX's oldest macOS, " +
        std::to_string(kOldestMacos) + ".0.");
  }
  device.macos_major = version.first;
  device.macos_minor = version.second;
  return device;
}

KernelRequest request_from(const std::optional<std::string>& kernel) {
  if (!kernel) {
    return kernel_request_from_env();
  }
  auto request = kernel_request_from_name(*kernel);
  if (!request) {
    throw std::invalid_argument(
        "kernel='" + *kernel + "' is not one of 'auto', 'qmv', 'mma', 'nax'.");
  }
  return *request;
}

// The FpQuantizedMatmul node the validated op builds for this call.
mx::array primitive_node(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::string& mode,
    std::optional<int> group_size,
    bool transpose) {
  auto out = global_scale ? mlx_fpqmm::fp4_qmm(
                                x,
                                w,
                                scales,
                                transpose,
                                group_size,
                                mode,
                                global_scale,
                                mx::Device::cpu)
                          : mlx_fpqmm::quantized_matmul(
                                x,
                                w,
                                scales,
                                std::nullopt,
                                transpose,
                                group_size,
                                std::nullopt,
                                mode,
                                mx::Device::cpu);
  // A 1-D x adds a squeeze after the primitive.
  while (out.has_primitive() &&
         dynamic_cast<FpQuantizedMatmul*>(&out.primitive()) == nullptr) {
    out = out.inputs()[0];
  }
  return out;
}

// The bytes a kernel can reach through `a`'s data pointer, shape and strides.
nb::bytes reachable_bytes(const mx::array& a) {
  int64_t extent = a.size() == 0 ? 0 : 1;
  for (size_t axis = 0; axis < a.ndim() && a.size() > 0; ++axis) {
    extent += (a.shape(axis) - 1) * a.strides()[axis];
  }
  return nb::bytes(a.data<char>(), extent * a.itemsize());
}

nb::object binding_value(const BufferBinding& binding) {
  return std::visit(
      [&](const auto& value) -> nb::object {
        using V = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<V, Operand>) {
          return nb::make_tuple(
              "operand",
              std::string(kOperandNames[static_cast<size_t>(value)]));
        } else if constexpr (std::is_same_v<V, int32_t>) {
          return nb::make_tuple("int32", value);
        } else if constexpr (std::is_same_v<V, std::vector<int32_t>>) {
          return nb::make_tuple("int32[]", nb::cast(value));
        } else {
          return nb::make_tuple("int64[]", nb::cast(value));
        }
      },
      binding.value);
}

nb::dict plan_dict(const KernelPlan& plan) {
  nb::dict result;
  result["path"] = std::string(path_name(plan.path));
  result["requested"] = std::string(request_name(plan.requested));
  result["note"] = plan.note;
  result["library"] = plan.library;
  result["kernel"] = plan.kernel;
  result["pipeline"] = plan.pipeline_name();
  result["grid"] = nb::make_tuple(plan.grid[0], plan.grid[1], plan.grid[2]);
  result["block_m"] = plan.block_m;
  result["block_n"] = plan.block_n;
  result["threadgroup"] = nb::make_tuple(
      plan.threadgroup[0], plan.threadgroup[1], plan.threadgroup[2]);
  nb::dict memory;
  for (auto [index, bytes] : plan.threadgroup_memory) {
    memory[nb::int_(index)] = bytes;
  }
  result["threadgroup_memory"] = memory;
  nb::dict constants;
  for (const auto& constant : plan.constants) {
    constants[nb::int_(constant.index)] =
        std::visit([](auto value) { return nb::cast(value); }, constant.value);
  }
  result["constants"] = constants;
  nb::dict buffers;
  for (const auto& binding : plan.buffers) {
    buffers[nb::int_(binding.index)] = binding_value(binding);
  }
  result["buffers"] = buffers;
  result["split_k"] = plan.split_k;
  result["partials_elements"] = plan.partials_elements;
  if (plan.reduction) {
    const auto& sum = *plan.reduction;
    nb::dict reduction;
    reduction["library"] = sum.library;
    reduction["kernel"] = sum.kernel;
    reduction["grid"] = nb::make_tuple(sum.grid[0], sum.grid[1], sum.grid[2]);
    reduction["threadgroup"] = nb::make_tuple(
        sum.threadgroup[0], sum.threadgroup[1], sum.threadgroup[2]);
    nb::dict sum_buffers;
    for (const auto& binding : sum.buffers) {
      sum_buffers[nb::int_(binding.index)] = binding_value(binding);
    }
    reduction["buffers"] = sum_buffers;
    result["reduction"] = reduction;
  } else {
    result["reduction"] = nb::none();
  }
  return result;
}

// The FpGatherQuantizedMatmul node the validated op builds for this call.
mx::array gather_node(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices,
    bool sorted_indices,
    const std::optional<mx::array>& global_scale,
    const std::string& mode,
    std::optional<int> group_size,
    bool transpose) {
  return mlx_fpqmm::gather_qmm(
      x,
      w,
      scales,
      std::nullopt,
      lhs_indices,
      rhs_indices,
      transpose,
      group_size,
      std::nullopt,
      mode,
      global_scale,
      sorted_indices,
      mx::Device::cpu);
}

// "cuda" (this machine's NVIDIA GPU) or a compute capability ("sm_90");
// nothing for a name of neither kind.
std::optional<cuda::CudaDevice> cuda_device_named(
    const std::optional<std::string>& name) {
  if (!name) {
    return cuda::running_device();
  }
  if (*name == "cuda") {
    auto here = cuda::running_device();
    if (!here) {
      throw std::invalid_argument(
          "device='cuda' but this build of mlx_fpqmm sees no CUDA GPU; name a "
          "compute capability instead, e.g. device='sm_90'.");
    }
    return here;
  }
  return cuda::device_from_name(*name);
}

nb::tuple triple(const std::array<int, 3>& v) {
  return nb::make_tuple(v[0], v[1], v[2]);
}

nb::dict launch_dict(const cuda::Launch& launch) {
  nb::dict result;
  result["kernel"] = launch.kernel;
  result["grid"] = triple(launch.grid);
  result["block"] = triple(launch.block);
  result["shared_bytes"] = launch.shared_bytes;
  return result;
}

// Why the CUDA plan dequantizes W and multiplies with MLX's matmul (or, for
// `gather`, gather_mm).
std::string dequantize_note(
    const QmmProblem& problem,
    const std::optional<cuda::GatherRows>& gather,
    const cuda::CudaDevice& device,
    cuda::KernelRequest request) {
  const std::string then =
      gather ? "every expert dequantized in x's type, then MLX's gather_mm"
             : "W dequantized in x's type, then MLX's matmul";
  if (request == cuda::KernelRequest::dequantize) {
    return "dequantize requested: " + then;
  }
  if (gather) {
    return std::to_string(gather->rows) + " rows over " +
           std::to_string(gather->experts) + " experts (at least " +
           std::to_string(cuda::gather_rows_per_expert(*gather)) +
           " an expert" + (gather->in_order ? "" : ", sorted first") +
           "): " + then;
  }
  return "M=" + std::to_string(problem.M) + " is above " +
         std::to_string(cuda::primitive_rows(problem, device)) +
         " rows: " + then;
}

// Whether the op builds dequantize + matmul (ops/qmm.cpp) or, for a gather
// without lhs_indices (`gather`), dequantize + gather_mm (ops/gather.cpp).
bool op_dequantizes(
    const QmmProblem& problem,
    const std::optional<cuda::GatherRows>& gather,
    const cuda::CudaDevice& device,
    cuda::KernelRequest request) {
  const bool empty = problem.M == 0 || problem.N == 0 || problem.K == 0 ||
                     problem.batch_count() == 0 ||
                     (problem.gather && problem.w_matrices == 0);
  if (empty || (problem.gather && !gather)) {
    return false;
  }
  return gather ? cuda::gather_dequantize_then_matmul(*gather, request)
                : cuda::dequantize_then_matmul(problem, device, request);
}

nb::dict cuda_plan_dict(
    const QmmProblem& problem,
    const std::optional<cuda::GatherRows>& gather_without_lhs,
    const cuda::CudaDevice& device,
    const std::optional<std::string>& kernel) {
  auto named = kernel ? cuda::kernel_request_from_name(*kernel) : std::nullopt;
  if (kernel && !named) {
    throw std::invalid_argument(
        "kernel='" + *kernel + "' is not one of " + cuda::request_names() +
        ".");
  }
  // MLX_FPQMM_KERNEL only where kernel= is not given (it is not read then).
  auto request = named ? *named : cuda::kernel_request_from_env();
  nb::dict result;
  result["backend"] = "cuda";
  result["device"] =
      "sm_" + std::to_string(device.major) + std::to_string(device.minor);
  result["sm_count"] = device.sm_count;
  if (op_dequantizes(problem, gather_without_lhs, device, request)) {
    result["path"] =
        std::string(cuda::path_name(cuda::KernelPath::dequantize_matmul));
    result["requested"] = std::string(cuda::request_name(request));
    result["note"] =
        dequantize_note(problem, gather_without_lhs, device, request);
    // FpDequantize's launch over every matrix of W (every expert).
    int64_t w_matrices = problem.gather ? problem.w_matrices : 1;
    for (size_t axis = 0; !problem.gather && axis < problem.batch_shape.size();
         ++axis) {
      if (problem.w_batch_strides[axis] != 0) {
        w_matrices *= problem.batch_shape[axis];
      }
    }
    const int w_rows = problem.transpose ? problem.N : problem.K;
    const int w_columns = problem.transpose ? problem.K : problem.N;
    auto dequantize = cuda::plan_dequantize(
        w_matrices * w_rows,
        w_columns,
        format_for(problem.mode).bits,
        scale_encoding(problem.mode, problem.scale_type),
        problem.x_type,
        device);
    result["kernel"] = dequantize.launch.kernel;
    result["grid"] = triple(dequantize.launch.grid);
    result["block"] = triple(dequantize.launch.block);
    result["shared_bytes"] = dequantize.launch.shared_bytes;
    result["batch_count"] = problem.batch_count();
    return result;
  }
  auto plan = cuda::plan(problem, device, request);
  result["path"] = std::string(cuda::path_name(plan.path));
  result["requested"] = std::string(cuda::request_name(plan.requested));
  result["note"] = plan.note;
  result["kernel"] = plan.main.kernel;
  result["grid"] = triple(plan.main.grid);
  result["block"] = triple(plan.main.block);
  result["shared_bytes"] = plan.main.shared_bytes;
  result["split_k"] = plan.split_k;
  result["splits_in_cluster"] = plan.splits_in_cluster;
  result["x_in_shared"] = plan.x_in_shared;
  result["partials_bytes"] = plan.partials_bytes;
  result["reduction"] =
      plan.reduction ? nb::object(launch_dict(*plan.reduction)) : nb::none();
  result["grouping"] =
      plan.grouping ? nb::object(launch_dict(*plan.grouping)) : nb::none();
  result["grouping_bytes"] = plan.grouping_bytes;
  result["tile_major_shares"] = plan.tile_major_shares;
  result["x_tiles"] =
      plan.x_tiles ? nb::object(launch_dict(*plan.x_tiles)) : nb::none();
  result["x_tiles_bytes"] = plan.x_tiles_bytes;
  result["x_split"] =
      plan.x_split ? nb::object(launch_dict(*plan.x_split)) : nb::none();
  result["x_split_bytes"] = plan.x_split_bytes;
  result["batch_count"] = plan.batch_count;
  return result;
}

nb::dict metal_plan_dict(
    const QmmProblem& problem,
    const std::optional<std::string>& device,
    const std::optional<std::string>& macos,
    const std::optional<std::string>& kernel,
    std::optional<bool> nax_kernels_built) {
  // By default: on a Mac, whether this build installed the NAX library;
  // elsewhere the device is hypothetical, built with an SDK that has Metal 4.
  if (!nax_kernels_built) {
    nax_kernels_built =
        running_macos_version().first == 0 || nax_library_installed();
  }
  auto result = plan_dict(plan(
      problem,
      device_description(device, macos),
      request_from(kernel),
      *nax_kernels_built));
  result["backend"] = "metal";
  return result;
}

// Turns dequantize_on_cpu() off while it lives: kernel_path describes the
// primitive's node.
struct PrimitiveNodes {
  PrimitiveNodes() : restore(dequantize_on_cpu()) {
    set_dequantize_on_cpu(false);
  }
  ~PrimitiveNodes() {
    set_dequantize_on_cpu(restore);
  }
  bool restore;
};

nb::dict plan_call(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices,
    bool sorted_indices,
    const std::string& mode,
    std::optional<int> group_size,
    bool transpose,
    const std::optional<std::string>& device,
    const std::optional<std::string>& macos,
    const std::optional<std::string>& kernel,
    std::optional<bool> nax_kernels_built,
    bool with_operands) {
  if (mode == "affine") {
    throw std::invalid_argument(
        "mode 'affine' runs on MLX's own kernels, not mlx_fpqmm's.");
  }
  // With indices, the gather primitive (mixture of experts). The primitive
  // itself, also inside mlx_fpqmm.testing.dequantize_on_cpu().
  bool gather = lhs_indices || rhs_indices;
  const PrimitiveNodes primitive_nodes;
  auto node =
      gather ? gather_node(
                   x,
                   w,
                   scales,
                   lhs_indices,
                   rhs_indices,
                   sorted_indices,
                   global_scale,
                   mode,
                   group_size,
                   transpose)
             : primitive_node(
                   x, w, scales, global_scale, mode, group_size, transpose);
  auto inputs = node.inputs();
  if (with_operands) {
    // What eval_gpu receives: evaluated inputs, readable in place.
    mx::eval(inputs);
    if (!gather) {
      check_readable_in_place(inputs);
    }
  }
  QmmProblem problem;
  if (gather) {
    problem = describe_gather_problem(
        static_cast<FpGatherQuantizedMatmul&>(node.primitive()),
        inputs,
        node.shape());
  } else {
    auto [primitive_mode, primitive_group_size, primitive_transpose] =
        static_cast<FpQuantizedMatmul&>(node.primitive()).state();
    problem = describe_problem(
        inputs,
        node.shape(),
        primitive_mode,
        primitive_group_size,
        primitive_transpose,
        with_operands);
  }
  nb::dict result;
  // A named CUDA device anywhere; the running one off macOS.
  std::optional<cuda::CudaDevice> cuda_device;
  if (device || running_macos_version().first == 0) {
    cuda_device = cuda_device_named(device);
  }
  if (cuda_device) {
    std::optional<cuda::GatherRows> gather_without_lhs;
    if (gather && !lhs_indices) {
      // As the op sees it (ops/gather.cpp).
      gather_without_lhs = cuda::gather_rows(
          problem,
          cuda::sorted_pairs(
              problem.right_sorted, rhs_indices->size(), problem.batch_count()),
          *cuda_device);
    }
    result = cuda_plan_dict(problem, gather_without_lhs, *cuda_device, kernel);
  } else {
    result = metal_plan_dict(problem, device, macos, kernel, nax_kernels_built);
  }
  // The op's shape: a 1-D x gives a 1-D row of y.
  auto shape = node.shape();
  if (x.ndim() == 1) {
    shape.erase(shape.end() - 2);
  }
  nb::list output_shape;
  for (int size : shape) {
    output_shape.append(size);
  }
  result["output_shape"] = nb::tuple(output_shape);
  if (with_operands) {
    nb::dict operands;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto name = gather ? kGatherInputNames[i] : kInputNames[i];
      operands[nb::str(name.data(), name.size())] = reachable_bytes(inputs[i]);
    }
    result["operands"] = operands;
  }
  return result;
}

}  // namespace

void register_metal_bindings(nb::module_& m) {
  m.def(
      "kernel_path",
      [](const mx::array& x,
         const mx::array& w,
         const mx::array& scales,
         bool transpose,
         std::optional<int> group_size,
         const std::string& mode,
         const std::optional<mx::array>& global_scale,
         const std::optional<mx::array>& lhs_indices,
         const std::optional<mx::array>& rhs_indices,
         bool sorted_indices,
         const std::optional<std::string>& device,
         const std::optional<std::string>& macos,
         const std::optional<std::string>& kernel) {
        return plan_call(
            x,
            w,
            scales,
            global_scale,
            lhs_indices,
            rhs_indices,
            sorted_indices,
            mode,
            group_size,
            transpose,
            device,
            macos,
            kernel,
            std::nullopt,
            false);
      },
      nb::arg(),
      nb::arg(),
      "scales"_a,
      "transpose"_a = true,
      "group_size"_a = nb::none(),
      "mode"_a = "mxfp4",
      nb::kw_only(),
      "global_scale"_a = nb::none(),
      "lhs_indices"_a = nb::none(),
      "rhs_indices"_a = nb::none(),
      "sorted_indices"_a = false,
      "device"_a = nb::none(),
      "macos"_a = nb::none(),
      "kernel"_a = nb::none(),
      nb::sig(
          "def kernel_path(x: mlx.core.array, w: mlx.core.array, /, scales: "
          "mlx.core.array, "
          "transpose: bool = True, group_size: typing.Optional[int] = None, "
          "mode: str = 'mxfp4', *, global_scale: "
          "typing.Optional[mlx.core.array] = None, "
          "lhs_indices: typing.Optional[mlx.core.array] = None, "
          "rhs_indices: typing.Optional[mlx.core.array] = None, "
          "sorted_indices: bool = False, "
          "device: typing.Optional[str] = None, macos: typing.Optional[str] = "
          "None, "
          "kernel: typing.Optional[str] = None) -> dict"),
      R"pbdoc(
        Which GPU kernel a call with these arguments runs, and why.

        Plans the call exactly as the GPU evaluation does, without running
        it. The arrays only lend their shapes and dtypes.

        Args:
            x, w, scales, transpose, group_size, mode, global_scale: as for
              :func:`quantized_matmul` / :func:`fp4_qmm`.
            lhs_indices, rhs_indices, sorted_indices: as for
              :func:`gather_qmm`: plan that call (the mixture-of-experts
              kernels) instead.
            device (str, optional): ``"cuda"`` (this machine's NVIDIA GPU),
              a compute capability such as ``"sm_90"`` (planned with that
              part's usual SM count, no GPU needed), or an Apple GPU
              architecture name such as ``"applegpu_g16s"`` (generation 16,
              size class ``s``). Default: this machine's GPU.
            macos (str, optional): Metal only: the macOS version such as
              ``"26.2"`` (14.0 or newer, as MLX needs). Default: this
              machine's, or the newest known elsewhere. Off macOS the device
              is hypothetical, with the NAX metallib installed; on a Mac, NAX
              needs this build to have installed it.
            kernel (str, optional): Metal: ``"auto"``, ``"qmv"``, ``"mma"``
              or ``"nax"``; CUDA: ``"auto"``, ``"qmv"``, ``"simple"``,
              ``"qmv_staged"``, ``"dequantize"``, ``"grouped"``, ``"tiled"``
              or ``"wgmma"``.
              Default: ``MLX_FPQMM_KERNEL`` or ``"auto"``.

        Returns:
            dict: ``backend`` (``"metal"`` or ``"cuda"``), ``path``,
            ``note`` (why), ``kernel`` and ``output_shape``. Metal adds
            ``library`` (the metallib), ``grid``, ``threadgroup``,
            ``block_m`` and ``block_n`` (the tile; 0 for the decode
            kernels), ``threadgroup_memory``, ``constants``, ``buffers``,
            ``split_k`` and ``partials_elements`` (the float32 partial sums
            that the ``reduction`` dispatch adds; else ``None``). CUDA adds
            ``device``, ``sm_count``, ``grid``, ``block``, ``shared_bytes``,
            ``split_k``, ``splits_in_cluster`` (the splits of K add up in a
            thread block cluster, sm_90 and later), ``x_in_shared`` (the
            decode kernel's wide blocks copy x into shared memory: float
            scales and up to 32 KB of 16-bit x on sm_90),
            ``partials_bytes``, ``reduction`` (the split-K sum launch, or
            ``None``), ``grouping`` and ``grouping_bytes`` (path
            ``"grouped"``: the launch that groups the pairs by expert
            before the main kernel, and its scratch; ``None`` and 0 where
            the main kernel's blocks group them, up to 32 pairs, and off
            that path), ``tile_major_shares`` (path ``"grouped"`` with the
            decode kernel: its blocks take the runs' tiles tile by tile
            where the experts average a run of pairs or more, else run by
            run),
            ``x_tiles`` and ``x_tiles_bytes`` (path ``"wgmma"``: the launch
            that lays x out in the kernel's tiles first, and their bytes;
            else ``None`` and 0), ``x_split`` and ``x_split_bytes`` (float32
            x of up to 8 rows times 8 MiB of W or more, or past 8 rows
            where ``"wgmma"`` or ``"tiled"`` takes it: the launch that
            splits x into bfloat16 high and low parts for a kernel of
            twice the rows, and their bytes; else ``None`` and 0) and
            ``batch_count``; for path ``"dequantize_matmul"``
            (many rows of x: W dequantized in x's type by ``kernel``, then
            MLX's matmul) ``path``, ``requested``, ``note``, ``kernel``,
            ``output_shape``, and of the CUDA keys only ``device``,
            ``sm_count``, ``grid``, ``block``, ``shared_bytes`` and
            ``batch_count``.
      )pbdoc");

  m.def(
      "_metal_plan",
      &plan_call,
      "x"_a,
      "w"_a,
      "scales"_a,
      "global_scale"_a.none(),
      "lhs_indices"_a.none(),
      "rhs_indices"_a.none(),
      "sorted_indices"_a,
      "mode"_a,
      "group_size"_a.none(),
      "transpose"_a,
      "device"_a,
      "macos"_a.none(),
      "kernel"_a,
      "nax_kernels_built"_a.none(),
      "with_operands"_a,
      "The plan of a call plus the bytes of its evaluated operands.");

  m.def(
      "_metal_choose_path",
      [](int M,
         int N,
         int K,
         bool transpose,
         const std::string& device,
         const std::string& macos,
         const std::string& kernel,
         bool nax_kernels_built) {
        QmmProblem problem{
            Mode::mxfp4, 32, transpose, M, N, K, FloatType::float16};
        auto choice = choose_path(
            problem,
            device_description(device, macos),
            request_from(kernel),
            nax_kernels_built);
        return nb::make_tuple(std::string(path_name(choice.path)), choice.note);
      },
      "M"_a,
      "N"_a,
      "K"_a,
      "transpose"_a,
      "device"_a,
      "macos"_a,
      "kernel"_a,
      "nax_kernels_built"_a,
      "The path choice alone, with a stand-in for whether NAX kernels exist.");
}

}  // namespace mlx_fpqmm::metal
