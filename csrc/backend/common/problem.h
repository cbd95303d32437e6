// One quantized product as every GPU backend's plan sees it, and how it is
// described from the primitives' inputs (shared by eval_gpu and the Python
// bindings, so both plan the same call the same way).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mlx/array.h"

#include "common/formats.h"
#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace mx = mlx::core;

// One FpQuantizedMatmul (or gather) call as the kernels see it: x is (batch...,
// M, K), w and scales are (batch..., N or K, ...), each broadcast to y's
// batch (stride 0 along the axes it lacks or has as 1), y is (batch..., M, N)
// contiguous. With 2-D weights every leading dimension of x is folded into M.
struct QmmProblem {
  Mode mode;
  int group_size;
  bool transpose;
  int M, N, K;
  FloatType x_type;
  std::optional<FloatType> scale_type;  // float-scale modes only
  bool has_global_scale = false;
  std::vector<int> batch_shape;  // empty: one matrix product
  // Per batch axis, in elements of each buffer (uint32 words for w).
  std::vector<int64_t> x_batch_strides;
  std::vector<int64_t> w_batch_strides;
  std::vector<int64_t> scales_batch_strides;
  // Gather (mixture of experts): batch_shape holds the number of index
  // pairs; pair z multiplies x matrix lhs_indices[z] with W matrix
  // rhs_indices[z], out of x_matrices and w_matrices row-contiguous ones.
  bool gather = false;
  int x_matrices = 0;
  int w_matrices = 0;
  // Not 0: there are no lhs_indices, pair z reads x matrix z / lhs_divisor.
  int lhs_divisor = 0;
  // The caller says rhs_indices are sorted (mlx-lm's sorted tokens).
  bool right_sorted = false;
  // The CUDA plan's: the bytes that both x's and w's data pointers are a
  // multiple of (known at evaluation; 16 when the plan is only inspected).
  int pointer_alignment = 16;
  // The same for the scales' data pointer.
  int scales_alignment = 16;

  bool operator==(const QmmProblem&) const = default;

  int64_t batch_count() const {
    int64_t count = 1;
    for (int size : batch_shape) {
      count *= size;
    }
    return count;
  }
};

// The plan's M of the primitive's `inputs`: every row of x where x's rows
// fold into one matrix (folds_rows; K may be 0), else the rows of one of x's
// matrices.
int64_t problem_rows(const std::vector<mx::array>& inputs);

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
    bool right_sorted,
    int64_t lhs_divisor = 0);

// The same for the inputs of `primitive`'s node, with its state.
QmmProblem describe_gather_problem(
    const FpGatherQuantizedMatmul& primitive,
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape);

}  // namespace mlx_fpqmm
