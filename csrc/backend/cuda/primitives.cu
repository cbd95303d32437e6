// FpQuantizedMatmul and FpGatherQuantizedMatmul on NVIDIA GPUs: carry out the
// plan of backend/cuda/plan.h with the kernels of backend/cuda/kernels/,
// recorded on the stream's command encoder as MLX's own CUDA ops are (no
// launch of ours, no synchronisation, no host read of device data).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "mlx/allocator.h"
#include "mlx/backend/cuda/cuda.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"

#include "backend/common/problem.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/plan.h"
#include "backend/cuda/table.h"
#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace fc = fpqmm::cuda;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(
        std::string("[mlx_fpqmm::cuda] ") + what + ": " +
        cudaGetErrorString(status));
  }
}

cuda::CudaDevice device_of(mx::cu::Device& d) {
  static std::mutex mutex;
  static std::unordered_map<int, int> sm_counts;
  std::lock_guard lock(mutex);
  auto [it, fresh] = sm_counts.try_emplace(d.cuda_device(), 0);
  if (fresh) {
    check(
        cudaDeviceGetAttribute(
            &it->second, cudaDevAttrMultiProcessorCount, d.cuda_device()),
        "cudaDeviceGetAttribute");
  }
  return {
      d.compute_capability_major(), d.compute_capability_minor(), it->second};
}

// libmlx.so links its own (static) CUDA runtime, which does not know this
// module's kernels: the encoder gets them as driver functions, looked up
// once per kernel and device by this module's runtime, which also raises
// the kernel's dynamic shared memory limit once, where a plan needs more
// than the default leaves beside the kernel's static shared memory (the
// default bounds the two together).
CUfunction driver_function(
    mx::cu::Device& d, const void* kernel, int shared_bytes) {
  struct Function {
    CUfunction function;
    int shared_limit;
  };
  static std::mutex mutex;
  static std::unordered_map<const void*, std::unordered_map<int, Function>>
      functions;
  std::lock_guard lock(mutex);
  auto& per_device = functions[kernel];
  auto it = per_device.find(d.cuda_device());
  if (it == per_device.end()) {
    d.make_current();
    cudaFunction_t f;
    check(cudaGetFuncBySymbol(&f, kernel), "cudaGetFuncBySymbol");
    cudaFuncAttributes attributes;
    check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
    it = per_device
             .emplace(
                 d.cuda_device(),
                 Function{
                     reinterpret_cast<CUfunction>(f),
                     fc::default_dynamic_shared_limit(
                         static_cast<int>(attributes.sharedSizeBytes))})
             .first;
  }
  if (shared_bytes > it->second.shared_limit) {
    d.make_current();
    check(
        cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes),
        "cudaFuncSetAttribute");
    it->second.shared_limit = shared_bytes;
  }
  return it->second.function;
}

// Whether MLX records kernels into CUDA graphs: MLX_USE_CUDA_GRAPHS, read as
// MLX reads it (an integer, 1 when unset).
bool recording_graphs() {
  static const bool graphs = [] {
    const char* value = std::getenv("MLX_USE_CUDA_GRAPHS");
    return value == nullptr || std::atoi(value) != 0;
  }();
  return graphs;
}

// MLX keys its cached executable graphs by the kinds of their nodes ("K"
// for any kernel, whichever it is) and updates a cached one in place for the
// next graph of the same key (cudaGraphExecUpdate). An update keeps a node's
// thread block cluster shape, which fp_qmv_cluster has compiled in: updated
// into or out of that kernel's node, a kernel ran with the wrong shape or
// not at all (docs/cuda-log.md, "Graph updates"). So that kernel's node is
// followed by an empty child graph whose key names it, and graphs share a key
// only where it sits in the same places. It must follow the node: added before,
// it would take the kernel's inputs and outputs in MLX's dependency tracking.
void add_kernel_key(mx::cu::CommandEncoder& encoder, const void* kernel) {
  // One empty graph, never destroyed; the encoder adds a copy of it, and a
  // graph is not safe to read from two threads at once. Each kernel's key is
  // made once (never destroyed, as the graph).
  static std::mutex mutex;
  static const cudaGraph_t empty = [] {
    cudaGraph_t graph;
    check(cudaGraphCreate(&graph, 0), "cudaGraphCreate");
    return graph;
  }();
  static auto* keys = new std::unordered_map<const void*, std::string>;
  std::lock_guard lock(mutex);
  auto [it, fresh] = keys->try_emplace(kernel);
  if (fresh) {
    it->second =
        "(F" + std::to_string(reinterpret_cast<uintptr_t>(kernel)) + ")";
  }
  encoder.add_graph_node(empty, it->second, true);
}

// Records `launch` of `kernel`; `compiled_cluster`: the kernel's cluster
// shape is compiled in (see add_kernel_key).
template <typename Args>
void add_launch(
    mx::cu::CommandEncoder& encoder,
    const cuda::Launch& launch,
    const void* kernel,
    Args args,
    bool compiled_cluster = false) {
  auto f = driver_function(encoder.device(), kernel, launch.shared_bytes);
  // The encoder copies the arguments through non-const pointers.
  encoder.add_kernel_node_ex(
      f,
      dim3(launch.grid[0], launch.grid[1], launch.grid[2]),
      dim3(launch.block[0], launch.block[1], launch.block[2]),
      dim3(),
      static_cast<uint32_t>(launch.shared_bytes),
      args);
  if (compiled_cluster && recording_graphs()) {
    add_kernel_key(encoder, kernel);
  }
}

// The bytes that every one of `arrays`' data pointers is a multiple of (at
// most 256).
int pointer_alignment(std::initializer_list<const mx::array*> arrays) {
  uint64_t bits = 256;
  for (const auto* a : arrays) {
    bits |= reinterpret_cast<uint64_t>(mx::gpu_ptr<void>(*a));
  }
  return static_cast<int>(bits & (~bits + 1));
}

// A new row-contiguous array in device memory for the kernels recorded
// next, which the encoder keeps until they are done.
mx::array device_temporary(
    mx::Shape shape, mx::Dtype dtype, mx::cu::CommandEncoder& encoder) {
  mx::array a(std::move(shape), dtype, nullptr, {});
  a.set_data(cuda::device_malloc(a.nbytes(), encoder));
  encoder.add_temporary(a);
  return a;
}

// Records `launch` of `kernel`, which fills a new scratch array of `bytes`
// (placed in `args` by place(pointer)) that the kernels recorded after it
// read.
template <typename Place>
void launch_into_scratch(
    mx::cu::CommandEncoder& encoder,
    int64_t bytes,
    const cuda::Launch& launch,
    const void* kernel,
    fc::QmmArgs& args,
    Place&& place) {
  auto scratch = device_temporary(
      {static_cast<int>(bytes / sizeof(uint32_t))}, mx::uint32, encoder);
  place(mx::gpu_ptr<uint32_t>(scratch));
  encoder.set_output_array(scratch);
  add_launch(encoder, launch, kernel, args);
  encoder.set_input_array(scratch);
}

// `x` (float32, float16 or bfloat16, of any strides) copied on the stream
// into a new row-contiguous array, which the encoder keeps until the kernels
// that read it are done.
mx::array row_contiguous_copy(
    const mx::array& x, mx::cu::CommandEncoder& encoder) {
  if (x.ndim() > fc::kMaxCopyDims) {
    throw std::logic_error(
        "[FpQuantizedMatmul] the op copies x of more than " +
        std::to_string(fc::kMaxCopyDims) + " axes itself.");
  }
  if (x.size() == 0) {
    mx::array empty(x.shape(), x.dtype(), nullptr, {});
    empty.set_data(mx::allocator::malloc(0));
    return empty;
  }
  auto copy = device_temporary(x.shape(), x.dtype(), encoder);
  fc::StridedCopyArgs args{};
  args.src = mx::gpu_ptr<void>(x);
  args.dst = mx::gpu_ptr<void>(copy);
  args.elements = static_cast<int64_t>(x.size());
  args.ndim = static_cast<int>(x.ndim());
  for (int axis = 0; axis < args.ndim; ++axis) {
    args.shape[axis] = x.shape(axis);
    args.strides[axis] = x.strides(axis);
  }
  encoder.set_input_array(x);
  encoder.set_output_array(copy);
  add_launch(
      encoder,
      cuda::plan_strided_copy(args.elements, device_of(encoder.device())),
      fc::strided_copy_kernel(static_cast<int>(x.itemsize())),
      args);
  return copy;
}

// The pointers of x, W, its scales and the global scale in the kernel
// arguments; `Index` names the primitive's inputs (Input or GatherInput).
template <typename Index>
void bind_matrices(fc::QmmArgs& args, const std::vector<mx::array>& inputs) {
  args.w = mx::gpu_ptr<uint32_t>(input(inputs, Index::w));
  args.scales = mx::gpu_ptr<void>(input(inputs, Index::scales));
  args.x = mx::gpu_ptr<void>(input(inputs, Index::x));
  if (inputs.size() > static_cast<size_t>(Index::global_scale)) {
    args.global_scale = mx::gpu_ptr<float>(input(inputs, Index::global_scale));
  }
}

template <typename Index>
int matrices_alignment(const std::vector<mx::array>& inputs) {
  return pointer_alignment(
      {&input(inputs, Index::x), &input(inputs, Index::w)});
}

// Records `problem` on the stream into `out` (allocated here): `inputs` in
// the order of `names`, the pointers set by `bind` into the kernel
// arguments.
template <typename Bind>
void run(
    mx::Stream s,
    const QmmProblem& problem,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    Bind&& bind) {
  auto& encoder = mx::cu::get_command_encoder(s);
  out.set_data(cuda::device_malloc(out.nbytes(), encoder));
  const auto& plan = cuda::cached_plan(
      problem, device_of(encoder.device()), cuda::kernel_request_from_env());
  auto args = cuda::kernel_args(problem, plan);
  bind(args);
  args.y = mx::gpu_ptr<void>(out);
  for (const auto& a : inputs) {
    encoder.set_input_array(a);
  }
  const void* main = fc::main_kernel(plan.key);
  auto place_x_tiles = [&](uint32_t* scratch) { args.x_tiles = scratch; };
  if (plan.grouping) {
    launch_into_scratch(
        encoder,
        plan.grouping_bytes,
        *plan.grouping,
        fc::group_pairs_kernel(),
        args,
        [&](uint32_t* scratch) {
          fc::place_grouping_scratch(args, scratch, plan.max_runs);
        });
  }
  if (plan.x_split) {
    launch_into_scratch(
        encoder,
        plan.x_split_bytes,
        *plan.x_split,
        fc::split_x_kernel(),
        args,
        place_x_tiles);
    args.x = args.x_tiles;
  }
  if (plan.x_tiles) {
    launch_into_scratch(
        encoder,
        plan.x_tiles_bytes,
        *plan.x_tiles,
        fc::wgmma_tile_x_kernel(plan.key.bits, plan.grouping.has_value()),
        args,
        place_x_tiles);
  }
  const bool cluster = plan.key.family == cuda::KernelFamily::qmv_cluster;
  if (!plan.reduction) {
    encoder.set_output_array(out);
    add_launch(encoder, plan.main, main, args, cluster);
    return;
  }
  auto partials = device_temporary(
      {static_cast<int>(plan.partials_bytes / sizeof(float))},
      mx::float32,
      encoder);
  args.partials = mx::gpu_ptr<float>(partials);
  encoder.set_output_array(partials);
  add_launch(encoder, plan.main, main, args, cluster);
  encoder.set_input_array(partials);
  encoder.set_output_array(out);
  add_launch(
      encoder, *plan.reduction, fc::split_k_sum_kernel(problem.x_type), args);
}

}  // namespace

std::optional<cuda::CudaDevice> cuda::running_device() {
  if (!mx::cu::is_available()) {
    return std::nullopt;
  }
  auto stream = mx::default_stream(mx::Device::gpu);
  return device_of(mx::cu::device(stream.device));
}

void FpQuantizedMatmul::eval_gpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  if (out.size() == 0) {
    out.set_data(mx::allocator::malloc(0));
    return;
  }
  // On NVIDIA GPUs the op leaves x as it comes (no copy node in the graph
  // for each product): what the kernels cannot read in place is copied here.
  std::vector<mx::array> operands = inputs;
  if (!readable_in_place(operands, Input::x)) {
    operands[static_cast<size_t>(Input::x)] = row_contiguous_copy(
        input(inputs, Input::x), mx::cu::get_command_encoder(stream()));
  }
  check_readable_in_place(operands);
  auto problem = describe_problem(
      operands, out.shape(), mode_, group_size_, transpose_, true);
  problem.pointer_alignment = matrices_alignment<Input>(operands);
  problem.scales_alignment =
      pointer_alignment({&input(operands, Input::scales)});
  run(stream(), problem, operands, out, [&](fc::QmmArgs& args) {
    bind_matrices<Input>(args, operands);
  });
}

void FpGatherQuantizedMatmul::eval_gpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  if (out.size() == 0) {
    out.set_data(mx::allocator::malloc(0));
    return;
  }
  auto problem = describe_gather_problem(*this, inputs, out.shape());
  problem.pointer_alignment = matrices_alignment<GatherInput>(inputs);
  problem.scales_alignment =
      pointer_alignment({&input(inputs, GatherInput::scales)});
  run(stream(), problem, inputs, out, [&](fc::QmmArgs& args) {
    bind_matrices<GatherInput>(args, inputs);
    args.lhs_indices =
        mx::gpu_ptr<uint32_t>(input(inputs, GatherInput::lhs_indices));
    args.rhs_indices =
        mx::gpu_ptr<uint32_t>(input(inputs, GatherInput::rhs_indices));
  });
}

void FpDequantize::eval_gpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  if (out.size() == 0) {
    out.set_data(mx::allocator::malloc(0));
    return;
  }
  const auto& w = inputs[0];
  const auto& scales = inputs[1];
  if (!w.flags().row_contiguous || !scales.flags().row_contiguous) {
    throw std::logic_error("[FpDequantize] w and scales must be contiguous.");
  }
  const int K = out.shape(-1);
  const int64_t rows = out.size() / K;
  if (rows > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(
        "[FpDequantize] " + std::to_string(rows) +
        " rows of W; the kernel takes at most 2^31 - 1.");
  }
  auto& encoder = mx::cu::get_command_encoder(stream());
  out.set_data(cuda::device_malloc(out.nbytes(), encoder));
  auto plan = cuda::plan_dequantize(
      rows,
      K,
      format_for(mode_).bits,
      scale_encoding(mode_, scales),
      float_type(out.dtype()),
      device_of(encoder.device()));
  fc::QmmArgs args{};
  args.w = mx::gpu_ptr<uint32_t>(w);
  args.scales = mx::gpu_ptr<void>(scales);
  args.w_matrices = static_cast<int>(global_scales(inputs));
  if (inputs.size() > 2) {
    args.global_scale = mx::gpu_ptr<float>(inputs[2]);
  }
  args.y = mx::gpu_ptr<void>(out);
  args.N = static_cast<int>(rows);
  args.K = K;
  args.group_size = group_size_;
  args.batch_count = 1;
  args.split_k = 1;
  for (const auto& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  add_launch(encoder, plan.launch, fc::main_kernel(plan.key), args);
}

}  // namespace mlx_fpqmm
