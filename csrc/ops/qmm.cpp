#include "ops/ops.h"

#include <memory>
#include <stdexcept>

#include "mlx/ops.h"

#include "backend/common/problem.h"
#include "backend/cuda/device.h"
#include "ops/checks.h"
#include "ops/qmm.h"
#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace {

// Where the CUDA plan multiplies many rows of x by dequantize + matmul: that
// graph, W dequantized in x's type by our kernel (FpDequantize), the product
// by MLX's matmul (which broadcasts batches: w is best passed before any
// broadcast, so that each matrix is dequantized once).
std::optional<mx::array> dequantized_product(
    const std::vector<mx::array>& inputs,
    Mode mode,
    int group_size,
    bool transpose,
    mx::Stream stream) {
  const auto& x = input(inputs, Input::x);
  if (x.size() == 0 || input(inputs, Input::w).size() == 0) {
    return std::nullopt;
  }
  if (!builds_dequantize(stream, [&](cuda::KernelRequest request) {
        // Neither the problem nor the device in the decode range (a decoding
        // model calls this for every product).
        if (request != cuda::KernelRequest::dequantize &&
            problem_rows(inputs) <= cuda::kSimpleRows) {
          return false;
        }
        // The problem as the primitive's plan would see it: a batched
        // product takes neither wgmma nor tiled's row range.
        FpQuantizedMatmul product(stream, mode, group_size, transpose);
        const auto problem = describe_problem(
            inputs,
            product.output_shapes(inputs)[0],
            mode,
            group_size,
            transpose,
            false);
        const auto device = cuda::running_device();
        return device &&
               cuda::dequantize_then_matmul(problem, *device, request);
      })) {
    return std::nullopt;
  }
  std::optional<mx::array> global_scale;
  if (has_global_scale(inputs)) {
    global_scale = input(inputs, Input::global_scale);
  }
  auto dense = dequantized_weights(
      input(inputs, Input::w),
      input(inputs, Input::scales),
      global_scale,
      mode,
      group_size,
      x.dtype(),
      stream);
  return mx::matmul(
      x, transpose ? mx::swapaxes(dense, -1, -2, stream) : dense, stream);
}

// The primitive on inputs readable in place, in the primitive's order.
mx::array make_fp_qmm(
    std::vector<mx::array> inputs,
    Mode mode,
    int group_size,
    bool transpose,
    mx::Stream stream) {
  auto primitive =
      std::make_shared<FpQuantizedMatmul>(stream, mode, group_size, transpose);
  auto shape = primitive->output_shapes(inputs)[0];
  auto dtype = input(inputs, Input::x).dtype();
  return mx::array(std::move(shape), dtype, primitive, std::move(inputs));
}

thread_local bool dequantize_on_cpu_requested = false;

}  // namespace

bool dequantize_on_cpu() {
  return dequantize_on_cpu_requested;
}

void set_dequantize_on_cpu(bool on) {
  dequantize_on_cpu_requested = on;
}

mx::array dequantized_weights(
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    Mode mode,
    int group_size,
    mx::Dtype dtype,
    mx::Stream stream) {
  std::vector<mx::array> operands = {
      readable_in_place_copy(w, stream),
      readable_in_place_copy(scales, stream)};
  if (global_scale) {
    operands.push_back(readable_in_place_copy(*global_scale, stream));
  }
  auto primitive =
      std::make_shared<FpDequantize>(stream, mode, group_size, dtype);
  auto shape = primitive->output_shapes(operands)[0];
  return mx::array(
      std::move(shape), dtype, std::move(primitive), std::move(operands));
}

mx::array fp_qmm_checked(
    std::string_view op,
    mx::array x,
    mx::array w,
    mx::array scales,
    const std::optional<mx::array>& global_scale,
    const Format& format,
    std::optional<int> group_size,
    bool transpose,
    mx::StreamOrDevice s) {
  int resolved_group_size = resolve_group_size(op, format, group_size);
  int quantized_length =
      check_packed_weights(op, format, resolved_group_size, w, scales);
  check_x(op, x, w, quantized_length, transpose);
  if (x.ndim() == 0) {
    fail(op, "x must have at least 1 dimension but received a 0-d array.");
  }
  check_global_scale(op, format, global_scale);

  auto stream = mx::to_stream(s);
  bool vector_input = x.ndim() == 1;
  if (vector_input) {
    x = mx::expand_dims(x, 0, stream);
  }
  x = x_for_product(x, static_cast<int>(w.ndim()), stream);
  w = readable_in_place_copy(w, stream);
  scales = readable_in_place_copy(scales, stream);
  if (w.ndim() > 2) {
    try {
      mx::broadcast_shapes(batch_shape(x), batch_shape(w));
    } catch (const std::invalid_argument&) {
      fail(
          op,
          "The batch dimensions of x " + shape_string(batch_shape(x)) +
              " and w " + shape_string(batch_shape(w)) +
              " cannot be broadcast.");
    }
  }
  // The batches broadcast in the product (primitive or matmul): each
  // matrix of W dequantized once.
  auto inputs = make_inputs(x, w, scales, global_scale);
  auto out = dequantized_product(
      inputs, format.mode, resolved_group_size, transpose, stream);
  if (!out) {
    out = make_fp_qmm(
        std::move(inputs), format.mode, resolved_group_size, transpose, stream);
  }
  return vector_input ? mx::squeeze(*out, -2, stream) : *out;
}

mx::array fp_qmm_unchecked(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    Mode mode,
    int group_size,
    bool transpose,
    mx::Stream stream) {
  // w and scales are the primitive's own inputs, readable in place (the op
  // made them so); x is a cotangent or tangent, e.g. a broadcast.
  if (auto product = dequantized_product(
          make_inputs(x, w, scales, global_scale),
          mode,
          group_size,
          transpose,
          stream)) {
    return *product;
  }
  return make_fp_qmm(
      make_inputs(readable_in_place_copy(x, stream), w, scales, global_scale),
      mode,
      group_size,
      transpose,
      stream);
}

mx::array fp4_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    bool transpose,
    std::optional<int> group_size,
    const std::string& mode,
    const std::optional<mx::array>& global_scale,
    mx::StreamOrDevice s) {
  constexpr std::string_view op = "fp4_qmm";
  const auto& format =
      resolve_format(op, mode, {Mode::mxfp4, Mode::nvfp4, Mode::fp4});
  return fp_qmm_checked(
      op, x, w, scales, global_scale, format, group_size, transpose, s);
}

mx::array fp8_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    bool transpose,
    std::optional<int> group_size,
    const std::string& mode,
    mx::StreamOrDevice s) {
  constexpr std::string_view op = "fp8_qmm";
  const auto& format = resolve_format(op, mode, {Mode::mxfp8, Mode::fp8});
  return fp_qmm_checked(
      op, x, w, scales, std::nullopt, format, group_size, transpose, s);
}

mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    bool transpose,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    mx::StreamOrDevice s) {
  if (mode == "affine") {
    return mx::quantized_matmul(
        x, w, scales, biases, transpose, group_size, bits, mode, s);
  }
  constexpr std::string_view op = "quantized_matmul";
  const auto& format = resolve_format(op, mode, kAllModes, true);
  check_biases_and_bits(op, format, biases, bits);
  return fp_qmm_checked(
      op, x, w, scales, std::nullopt, format, group_size, transpose, s);
}

}  // namespace mlx_fpqmm
