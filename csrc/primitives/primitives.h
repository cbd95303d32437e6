// FpQuantizedMatmul: x @ dequant(w).T (or x @ dequant(w)) for the fp formats,
// and FpGatherQuantizedMatmul, its mixture-of-experts (gather) form.
#pragma once

#include <algorithm>
#include <array>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "mlx/primitives.h"

#include "common/formats.h"

namespace mlx_fpqmm {

namespace mx = mlx::core;

// The primitive's inputs, in this order: x, w, scales and, for nvfp4 with a
// global scale, global_scale.
enum class Input { x, w, scales, global_scale };

inline constexpr std::array<std::string_view, 4> kInputNames = {
    "x", "w", "scales", "global_scale"};

// The inputs in that order (global_scale last, when there is one).
inline std::vector<mx::array> make_inputs(
    mx::array x,
    mx::array w,
    mx::array scales,
    const std::optional<mx::array>& global_scale) {
  std::vector<mx::array> inputs = {
      std::move(x), std::move(w), std::move(scales)};
  if (global_scale) {
    inputs.push_back(*global_scale);
  }
  return inputs;
}
static_assert(
    static_cast<int>(Input::x) == 0 && static_cast<int>(Input::w) == 1 &&
    static_cast<int>(Input::scales) == 2 &&
    static_cast<int>(Input::global_scale) == 3);

inline const mx::array& input(
    const std::vector<mx::array>& inputs, Input which) {
  return inputs[static_cast<size_t>(which)];
}

inline bool has_global_scale(const std::vector<mx::array>& inputs) {
  return inputs.size() > static_cast<size_t>(Input::global_scale);
}

// With 2-D weights every leading dimension of x folds into M.
inline bool folds_rows(const std::vector<mx::array>& inputs) {
  return input(inputs, Input::w).ndim() == 2;
}

// The one layout rule of both backends: the kernels read an input in place
// when its matrices are row-contiguous (all of x when its rows fold into M);
// batch strides may be anything, broadcasts included. The ops establish it
// for every device (fp_qmm_unchecked in ops.cpp); eval_cpu and eval_gpu
// check it.
bool readable_in_place(const std::vector<mx::array>& inputs, Input which);

// Throws std::logic_error unless every input is readable in place.
void check_readable_in_place(const std::vector<mx::array>& inputs);

// The float type of x or of float scales; throws for other dtypes.
FloatType float_type(mx::Dtype dtype);

// How the kernels read the scales input of a `mode` call.
ScaleEncoding scale_encoding(Mode mode, const mx::array& scales);

// What both primitives hold: the format, the group size and w's orientation.
class FpPrimitive : public mx::UnaryPrimitive {
 public:
  FpPrimitive(mx::Stream stream, Mode mode, int group_size, bool transpose)
      : mx::UnaryPrimitive(stream),
        mode_(mode),
        group_size_(group_size),
        transpose_(transpose) {}

 protected:
  // Columns of the output: w's rows (transpose) or its unpacked row length.
  int output_columns(const mx::array& w) const {
    return transpose_ ? w.shape(-2)
                      : w.shape(-1) * format_for(mode_).elements_per_word();
  }

  Mode mode_;
  int group_size_;
  bool transpose_;
};

class FpQuantizedMatmul : public FpPrimitive {
 public:
  using FpPrimitive::FpPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>& outputs) override;
  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>& argnums) override;

  const char* name() const override {
    return "FpQuantizedMatmul";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override;

  auto state() const {
    return std::make_tuple(mode_, group_size_, transpose_);
  }
};

// FpGatherQuantizedMatmul's inputs, in this order: x, w, scales,
// lhs_indices, rhs_indices and, for nvfp4 with global scales, global_scale
// (one per expert).
enum class GatherInput { x, w, scales, lhs_indices, rhs_indices, global_scale };

inline constexpr std::array<std::string_view, 6> kGatherInputNames = {
    "x", "w", "scales", "lhs_indices", "rhs_indices", "global_scale"};

inline const mx::array& input(
    const std::vector<mx::array>& inputs, GatherInput which) {
  return inputs[static_cast<size_t>(which)];
}

// The matrices of a (..., rows, cols) array: the product of its leading
// dimensions (a gather input is indexed by this flattened batch).
inline int64_t matrix_count(const mx::array& a) {
  int64_t count = 1;
  for (int axis = 0; axis + 2 < static_cast<int>(a.ndim()); ++axis) {
    count *= a.shape(axis);
  }
  return count;
}

inline bool has_expert_scales(const std::vector<mx::array>& inputs) {
  return inputs.size() > static_cast<size_t>(GatherInput::global_scale);
}

// The gather inputs in that order (global_scale last, when there is one).
inline std::vector<mx::array> make_gather_inputs(
    mx::array x,
    mx::array w,
    mx::array scales,
    mx::array lhs_indices,
    mx::array rhs_indices,
    const std::optional<mx::array>& global_scale) {
  auto inputs =
      make_inputs(std::move(x), std::move(w), std::move(scales), std::nullopt);
  inputs.push_back(std::move(lhs_indices));
  inputs.push_back(std::move(rhs_indices));
  if (global_scale) {
    inputs.push_back(*global_scale);
  }
  return inputs;
}
static_assert(
    static_cast<int>(GatherInput::lhs_indices) == 3 &&
    static_cast<int>(GatherInput::rhs_indices) == 4 &&
    static_cast<int>(GatherInput::global_scale) == 5);

// A gather without lhs_indices, x's batch broadcast against the pairs'
// shape: the pairs' leading axes that x's batch has as they are, where it
// is 1 on the others (as mlx-lm's layers call gather_qmm); pair p then reads
// x matrix p / the product of the other axes. Axes of size 1 in both count
// as x's own, axes x lacks (broadcasting aligns on the right) as broadcast.
// None where x's batch broadcasts otherwise.
inline std::optional<int> implicit_lhs_axes(
    const mx::Shape& x_batch, const mx::Shape& pairs) {
  const int rank = static_cast<int>(pairs.size());
  const int missing = rank - static_cast<int>(x_batch.size());
  int axes = 0;
  while (missing == 0 && axes < rank && x_batch[axes] == pairs[axes]) {
    ++axes;
  }
  for (int axis = std::max(axes, missing); axis < rank; ++axis) {
    if (x_batch[axis - missing] != 1) {
      return std::nullopt;
    }
  }
  return axes;
}

// FpGatherQuantizedMatmul: for each pair b, y[b] = x[lhs[b]] @ dequant(
// w[rhs[b]]).T (or without .T), the mixture-of-experts product behind
// mx.gather_qmm. Inputs, all row-contiguous: x (..., M, K) and w, scales
// (..., R, C), indexed by their flattened batch; lhs_indices and rhs_indices
// uint32 of one shape (the pairs); for nvfp4 with global scales,
// global_scale (E,). Output: the pairs' shape + (M, N). A pair with an index
// out of range gets NaN rows. With `implicit_lhs` there is no lhs array
// (no index nodes in a decoding model's graph): lhs[b] is b / lhs_divisor,
// from the shapes at evaluation (a graph compiled without shapes may change
// them), and the lhs_indices input is rhs_indices again.
class FpGatherQuantizedMatmul : public FpPrimitive {
 public:
  FpGatherQuantizedMatmul(
      mx::Stream stream,
      Mode mode,
      int group_size,
      bool transpose,
      bool right_sorted,
      bool implicit_lhs)
      : FpPrimitive(stream, mode, group_size, transpose),
        right_sorted_(right_sorted),
        implicit_lhs_(implicit_lhs) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>& outputs) override;
  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>& argnums) override;

  const char* name() const override {
    return "FpGatherQuantizedMatmul";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override;

  auto state() const {
    return std::make_tuple(
        mode_, group_size_, transpose_, right_sorted_, implicit_lhs_);
  }

  // 0 where lhs_indices is an array, else the divisor for these inputs'
  // shapes (std::invalid_argument where they lost implicit_lhs_axes' form).
  int64_t lhs_divisor(const std::vector<mx::array>& inputs) const;

 private:
  bool right_sorted_;
  bool implicit_lhs_;
};

// FpDequantize: W dequantized in `dtype`, the first half of the ops'
// dequantize + matmul (ops/qmm.cpp builds it for CUDA streams, where the
// CUDA plan takes that path, and for the CPU in tests; there is no Metal
// kernel). Inputs, row-contiguous: w, scales and, for nvfp4 with a global
// scale, global_scale (one value, or one per matrix of w, as gather's
// experts have). Output: w's shape with its rows unpacked to K codes. The
// dtype is part of the state: MLX's compile merges nodes of equivalent
// primitives on the same inputs.
class FpDequantize : public mx::UnaryPrimitive {
 public:
  FpDequantize(mx::Stream stream, Mode mode, int group_size, mx::Dtype dtype)
      : mx::UnaryPrimitive(stream),
        mode_(mode),
        group_size_(group_size),
        dtype_(dtype) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "FpDequantize";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override;

  auto state() const {
    return std::make_tuple(mode_, group_size_, dtype_);
  }

  // The global scales among `inputs` (1 without any: a factor of 1): one
  // for all of w, or one per matrix of w; throws std::logic_error otherwise.
  static int64_t global_scales(const std::vector<mx::array>& inputs);

 private:
  Mode mode_;
  int group_size_;
  mx::Dtype dtype_;
};

}  // namespace mlx_fpqmm
