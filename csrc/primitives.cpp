// Backend-independent parts of FpQuantizedMatmul: shapes, equivalence and
// transforms (written with ops, on the primitive's stream).
#include "primitives.h"

#include <stdexcept>

#include "ops.h"

namespace mlx_fpqmm {

namespace {

std::optional<mx::array> global_scale_input(
    const std::vector<mx::array>& inputs) {
  if (has_global_scale(inputs)) {
    return input(inputs, Input::global_scale);
  }
  return std::nullopt;
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
  const auto& w = input(inputs, Input::w);
  int n = transpose_ ? w.shape(-2)
                     : w.shape(-1) * format_for(mode_).elements_per_word();
  auto shape = input(inputs, Input::x).shape();
  shape.back() = n;
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
    // d(x @ W^T)/dx = cotangent @ W: the same weights with transpose flipped.
    grads.push_back(fp_qmm_unchecked(
        cotangents[0],
        input(primals, Input::w),
        input(primals, Input::scales),
        global_scale_input(primals),
        mode_,
        group_size_,
        !transpose_,
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
  return {fp_qmm_unchecked(
      tangents[0],
      input(primals, Input::w),
      input(primals, Input::scales),
      global_scale_input(primals),
      mode_,
      group_size_,
      transpose_,
      stream())};
}

}  // namespace mlx_fpqmm
