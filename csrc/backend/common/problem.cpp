#include "backend/common/problem.h"

namespace mlx_fpqmm {

namespace {

// The strides of a's matrices along the out batch axes `batch`, to which
// a's batch broadcasts: 0 along the axes that a lacks or has as 1.
std::vector<int64_t> batch_strides(
    const mx::array& a, const std::vector<int>& batch, bool strides_known) {
  const int batch_ndims = static_cast<int>(batch.size());
  const int own_ndims = static_cast<int>(a.ndim()) - 2;
  std::vector<int64_t> strides(batch_ndims, 0);
  int64_t contiguous = int64_t(a.shape(-1)) * a.shape(-2);
  for (int axis = own_ndims - 1; axis >= 0; --axis) {
    if (a.shape(axis) != 1) {
      strides[axis + batch_ndims - own_ndims] =
          strides_known ? a.strides()[axis] : contiguous;
    }
    contiguous *= a.shape(axis);
  }
  return strides;
}

}  // namespace

int64_t problem_rows(const std::vector<mx::array>& inputs) {
  const auto& x = input(inputs, Input::x);
  if (!folds_rows(inputs)) {
    return x.shape(-2);
  }
  int64_t rows = 1;
  for (int axis = 0; axis + 1 < static_cast<int>(x.ndim()); ++axis) {
    rows *= x.shape(axis);
  }
  return rows;
}

QmmProblem describe_problem(
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    Mode mode,
    int group_size,
    bool transpose,
    bool strides_known) {
  const auto& x = input(inputs, Input::x);
  const auto& scales = input(inputs, Input::scales);
  QmmProblem problem{
      mode,
      group_size,
      transpose,
      0,
      out_shape.back(),
      x.shape(-1),
      float_type(x.dtype())};
  if (format_for(mode).scales == ScaleKind::floating) {
    problem.scale_type = float_type(scales.dtype());
  }
  problem.has_global_scale = has_global_scale(inputs);
  problem.M = static_cast<int>(problem_rows(inputs));
  if (folds_rows(inputs)) {
    return problem;
  }
  problem.batch_shape.assign(out_shape.begin(), out_shape.end() - 2);
  problem.x_batch_strides =
      batch_strides(x, problem.batch_shape, strides_known);
  problem.w_batch_strides = batch_strides(
      input(inputs, Input::w), problem.batch_shape, strides_known);
  problem.scales_batch_strides =
      batch_strides(scales, problem.batch_shape, strides_known);
  return problem;
}

QmmProblem describe_gather_problem(
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    Mode mode,
    int group_size,
    bool transpose,
    bool right_sorted,
    int64_t lhs_divisor) {
  const auto& x = input(inputs, GatherInput::x);
  const auto& w = input(inputs, GatherInput::w);
  const auto& scales = input(inputs, GatherInput::scales);
  QmmProblem problem{
      mode,
      group_size,
      transpose,
      x.shape(-2),
      out_shape.back(),
      x.shape(-1),
      float_type(x.dtype())};
  if (format_for(mode).scales == ScaleKind::floating) {
    problem.scale_type = float_type(scales.dtype());
  }
  problem.has_global_scale = has_expert_scales(inputs);
  problem.gather = true;
  problem.right_sorted = right_sorted;
  problem.x_matrices = static_cast<int>(matrix_count(x));
  problem.w_matrices = static_cast<int>(matrix_count(w));
  problem.lhs_divisor = static_cast<int>(lhs_divisor);
  problem.batch_shape = {
      static_cast<int>(input(inputs, GatherInput::rhs_indices).size())};
  return problem;
}

QmmProblem describe_gather_problem(
    const FpGatherQuantizedMatmul& primitive,
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape) {
  const auto [mode, group_size, transpose, right_sorted, implicit_lhs] =
      primitive.state();
  return describe_gather_problem(
      inputs,
      out_shape,
      mode,
      group_size,
      transpose,
      right_sorted,
      primitive.lhs_divisor(inputs));
}

}  // namespace mlx_fpqmm
