// Backend-independent parts of FpQuantizedMatmul: shapes, equivalence and
// transforms (written with ops, on the primitive's stream).
#include "primitives/primitives.h"

#include <limits>
#include <stdexcept>

#include "mlx/ops.h"

#include "ops/checks.h"
#include "ops/ops.h"

namespace mlx_fpqmm {

namespace {

// The optional global scale, the last input of either primitive.
template <typename Which>
std::optional<mx::array> global_scale_input(
    const std::vector<mx::array>& inputs, Which which) {
  if (inputs.size() > static_cast<size_t>(which)) {
    return input(inputs, which);
  }
  return std::nullopt;
}

// `a` @ W^T (`transpose`) or `a` @ W, with W, its scales and global scale of
// FpQuantizedMatmul's `primals`.
mx::array times_weights(
    const mx::array& a,
    const std::vector<mx::array>& primals,
    Mode mode,
    int group_size,
    bool transpose,
    mx::Stream s) {
  return fp_qmm_unchecked(
      a,
      input(primals, Input::w),
      input(primals, Input::scales),
      global_scale_input(primals, Input::global_scale),
      mode,
      group_size,
      transpose,
      s);
}

// Whether `shape` broadcasts to `to` (as x's batch to a product's).
bool broadcasts_to(const mx::Shape& shape, const mx::Shape& to) {
  const int extra =
      static_cast<int>(to.size()) - static_cast<int>(shape.size());
  if (extra < 0) {
    return false;
  }
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (shape[axis] != 1 && shape[axis] != to[axis + extra]) {
      return false;
    }
  }
  return true;
}

// `a` summed to `shape`, which broadcasts to a's shape: over a's leading
// axes that `shape` lacks and the axes where it has 1. Reductions only (no
// reshape), which a graph compiled shapeless re-infers.
mx::array sum_to_shape(mx::array a, const mx::Shape& shape, mx::Stream s) {
  const int extra = static_cast<int>(a.ndim()) - static_cast<int>(shape.size());
  std::vector<int> leading;
  for (int axis = 0; axis < extra; ++axis) {
    leading.push_back(axis);
  }
  if (!leading.empty()) {
    a = mx::sum(a, leading, false, s);
  }
  std::vector<int> ones;
  for (int axis = 0; axis < static_cast<int>(shape.size()); ++axis) {
    if (shape[axis] == 1 && a.shape(axis) != 1) {
      ones.push_back(axis);
    }
  }
  if (!ones.empty()) {
    a = mx::sum(a, ones, true, s);
  }
  return a;
}

}  // namespace

bool readable_in_place(const std::vector<mx::array>& inputs, Input which) {
  const auto& a = input(inputs, which);
  if (which == Input::global_scale) {
    return true;  // one float
  }
  if (which == Input::x && folds_rows(inputs)) {
    return a.flags().row_contiguous;
  }
  int rows = a.shape(-2);
  int cols = a.shape(-1);
  return (cols <= 1 || a.strides()[a.ndim() - 1] == 1) &&
         (rows <= 1 || a.strides()[a.ndim() - 2] == cols);
}

void check_readable_in_place(const std::vector<mx::array>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!readable_in_place(inputs, static_cast<Input>(i))) {
      throw std::logic_error(
          "[FpQuantizedMatmul] The kernels need row-contiguous matrices, and "
          "the op did not make " +
          std::string(kInputNames[i]) + " so.");
    }
  }
}

FloatType float_type(mx::Dtype dtype) {
  if (dtype == mx::float32) {
    return FloatType::float32;
  }
  if (dtype == mx::float16) {
    return FloatType::float16;
  }
  if (dtype == mx::bfloat16) {
    return FloatType::bfloat16;
  }
  throw std::invalid_argument(
      "[FpQuantizedMatmul] x and float scales must be floats.");
}

ScaleEncoding scale_encoding(Mode mode, const mx::array& scales) {
  std::optional<FloatType> type;
  if (format_for(mode).scales == ScaleKind::floating) {
    type = float_type(scales.dtype());
  }
  return mlx_fpqmm::scale_encoding(mode, type);
}

std::vector<mx::Shape> FpQuantizedMatmul::output_shapes(
    const std::vector<mx::array>& inputs) {
  const auto& x = input(inputs, Input::x);
  const auto& w = input(inputs, Input::w);
  auto shape = x.shape();
  if (!folds_rows(inputs)) {
    // The batches broadcast here, not by nodes in the graph, so that a graph
    // compiled shapeless follows a new batch of x (MLX's own product does so
    // through BroadcastAxes nodes, which libmlx does not export).
    shape = mx::broadcast_shapes(batch_shape(x), batch_shape(w));
    shape.push_back(x.shape(-2));
    shape.push_back(0);
  }
  shape.back() = output_columns(w);
  return {shape};
}

bool FpQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& rhs = static_cast<const FpQuantizedMatmul&>(other);
  return state() == rhs.state();
}

std::vector<mx::array> FpQuantizedMatmul::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  std::vector<mx::array> grads;
  for (int argnum : argnums) {
    if (argnum != static_cast<int>(Input::x)) {
      throw std::invalid_argument(
          "[FpQuantizedMatmul::vjp] No gradient with respect to the "
          "quantized weights, scales or global scale (argument " +
          std::to_string(argnum) + "); only x is differentiable.");
    }
    // d(x @ W^T)/dx = cotangent @ W: the same weights with transpose flipped,
    // summed over the batch axes along which x was broadcast.
    grads.push_back(sum_to_shape(
        times_weights(
            cotangents[0], primals, mode_, group_size_, !transpose_, stream()),
        input(primals, Input::x).shape(),
        stream()));
  }
  return grads;
}

std::vector<mx::array> FpQuantizedMatmul::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  for (int argnum : argnums) {
    if (argnum != static_cast<int>(Input::x)) {
      throw std::invalid_argument(
          "[FpQuantizedMatmul::jvp] No derivative with respect to the "
          "quantized weights, scales or global scale (argument " +
          std::to_string(argnum) + "); only x is differentiable.");
    }
  }
  return {times_weights(
      tangents[0], primals, mode_, group_size_, transpose_, stream())};
}

namespace {

void check_gather_argnums(
    const char* transform, const std::vector<int>& argnums) {
  for (int argnum : argnums) {
    if (argnum != 0) {
      throw std::invalid_argument(
          std::string("[FpGatherQuantizedMatmul::") + transform +
          "] No derivative with respect to the quantized weights, scales, "
          "indices or global scale (argument " +
          std::to_string(argnum) + "); only x is differentiable.");
    }
  }
}

}  // namespace

int64_t FpGatherQuantizedMatmul::lhs_divisor(
    const std::vector<mx::array>& inputs) const {
  if (!implicit_lhs_) {
    return 0;
  }
  const auto& x = input(inputs, GatherInput::x);
  const auto& pairs = input(inputs, GatherInput::rhs_indices).shape();
  const auto axes = implicit_lhs_axes(batch_shape(x), pairs);
  if (!axes) {
    throw std::invalid_argument(
        "[gather_qmm] x of shape " + shape_string(x.shape()) +
        " no longer broadcasts against rhs_indices of shape " +
        shape_string(pairs) +
        " as the graph was built for (x's batch the indices' leading axes, "
        "1 on the others): compile without shapeless, or pass "
        "lhs_indices.");
  }
  int64_t divisor = 1;
  for (size_t axis = *axes; axis < pairs.size(); ++axis) {
    divisor *= pairs[axis];
  }
  return divisor;
}

std::vector<mx::Shape> FpGatherQuantizedMatmul::output_shapes(
    const std::vector<mx::array>& inputs) {
  lhs_divisor(inputs);  // checks the shapes of a shapeless graph
  auto shape = input(inputs, GatherInput::lhs_indices).shape();
  shape.push_back(input(inputs, GatherInput::x).shape(-2));
  shape.push_back(output_columns(input(inputs, GatherInput::w)));
  return {shape};
}

bool FpGatherQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& rhs = static_cast<const FpGatherQuantizedMatmul&>(other);
  return state() == rhs.state();
}

std::vector<mx::array> FpGatherQuantizedMatmul::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  check_gather_argnums("vjp", argnums);
  const auto& x = input(primals, GatherInput::x);
  const auto& rhs = input(primals, GatherInput::rhs_indices);
  const auto& cotangent = cotangents[0];
  auto s = stream();
  if (x.size() == 0) {
    return {mx::zeros_like(x, s)};
  }
  const auto lhs = implicit_lhs_ ? default_lhs_indices(x, rhs, s)
                                 : input(primals, GatherInput::lhs_indices);
  // Per pair, cotangent @ W (the same weights with transpose flipped; pair p
  // reads cotangent matrix p), then summed into the x matrices the pairs
  // read.
  auto per_pair = fp_gather_qmm_unchecked(
      cotangent,
      input(primals, GatherInput::w),
      input(primals, GatherInput::scales),
      std::nullopt,
      rhs,
      global_scale_input(primals, GatherInput::global_scale),
      mode_,
      group_size_,
      !transpose_,
      false,
      s);
  // mlx-lm's layouts: pair b reads x matrix b / lhs_divisor, so x's batch
  // broadcasts to the pairs' and each x matrix sums its pairs' products
  // (a reduction, which a graph compiled shapeless re-infers, as it does
  // not a scatter).
  if (implicit_lhs_ && broadcasts_to(x.shape(), per_pair.shape())) {
    return {sum_to_shape(per_pair, x.shape(), s)};
  }
  int x_matrices = static_cast<int>(matrix_count(x));
  // A pair whose x index is out of range (its output was NaN) adds NaN to
  // matrix 0 rather than writing out of bounds.
  auto flat_lhs = mx::flatten(lhs, s);
  auto valid = mx::less(flat_lhs, mx::array(x_matrices, mx::uint32), s);
  auto rows = mx::where(valid, flat_lhs, mx::array(0, mx::uint32), s);
  auto updates = mx::where(
      mx::reshape(valid, {-1, 1, 1, 1}, s),
      mx::reshape(per_pair, {-1, 1, x.shape(-2), x.shape(-1)}, s),
      mx::array(std::numeric_limits<float>::quiet_NaN(), per_pair.dtype()),
      s);
  auto x_shape = x.shape();
  auto grad = mx::scatter_add(
      mx::zeros({x_matrices, x.shape(-2), x.shape(-1)}, x.dtype(), s),
      {rows},
      updates,
      {0},
      s);
  return {mx::reshape(grad, x_shape, s)};
}

std::vector<mx::array> FpGatherQuantizedMatmul::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  check_gather_argnums("jvp", argnums);
  return {fp_gather_qmm_unchecked(
      tangents[0],
      input(primals, GatherInput::w),
      input(primals, GatherInput::scales),
      implicit_lhs_ ? std::nullopt
                    : std::optional(input(primals, GatherInput::lhs_indices)),
      input(primals, GatherInput::rhs_indices),
      global_scale_input(primals, GatherInput::global_scale),
      mode_,
      group_size_,
      transpose_,
      right_sorted_,
      stream())};
}

bool FpDequantize::is_equivalent(const mx::Primitive& other) const {
  return state() == static_cast<const FpDequantize&>(other).state();
}

int64_t FpDequantize::global_scales(const std::vector<mx::array>& inputs) {
  if (inputs.size() < 3) {
    return 1;
  }
  const int64_t count = inputs[2].size();
  if (count != 1 && count != matrix_count(inputs[0])) {
    throw std::logic_error(
        "[FpDequantize] one global scale, or one per matrix of w.");
  }
  return count;
}

std::vector<mx::Shape> FpDequantize::output_shapes(
    const std::vector<mx::array>& inputs) {
  global_scales(inputs);
  auto shape = inputs[0].shape();
  shape.back() *= format_for(mode_).elements_per_word();
  return {shape};
}

#if !defined(MLX_FPQMM_CUDA)
void FpDequantize::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::logic_error(
      "[FpDequantize] runs on the CPU and on CUDA streams only and this build "
      "has no CUDA kernels.");
}
#endif

}  // namespace mlx_fpqmm
