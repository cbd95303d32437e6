// FpQuantizedMatmul: x @ dequant(w).T (or x @ dequant(w)) for the fp formats.
// Inputs: x, w, scales and, for nvfp4 with a global scale, global_scale.
#pragma once

#include "mlx/primitives.h"

#include "formats.h"

namespace mlx_fpqmm {

namespace mx = mlx::core;

class FpQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  FpQuantizedMatmul(
      mx::Stream stream, Mode mode, int group_size, bool transpose)
      : mx::UnaryPrimitive(stream),
        mode_(mode),
        group_size_(group_size),
        transpose_(transpose) {}

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

 private:
  Mode mode_;
  int group_size_;
  bool transpose_;
};

}  // namespace mlx_fpqmm

namespace mlx_fpqmm {

// FpGatherQuantizedMatmul: for each pair b, y[b] = x[lhs[b]] @ dequant(
// w[rhs[b]]).T (or without .T), the mixture-of-experts product behind
// mx.gather_qmm. Inputs, all row-contiguous: x (..., M, K) and w, scales
// (..., R, C), indexed by their flattened batch; lhs_indices and rhs_indices
// uint32 of one shape (the pairs); for nvfp4 with global scales,
// global_scale (E,). Output: the pairs' shape + (M, N). A pair with an index
// out of range gets NaN rows.
class FpGatherQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  FpGatherQuantizedMatmul(
      mx::Stream stream,
      Mode mode,
      int group_size,
      bool transpose,
      bool right_sorted)
      : mx::UnaryPrimitive(stream),
        mode_(mode),
        group_size_(group_size),
        transpose_(transpose),
        right_sorted_(right_sorted) {}

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
    return std::make_tuple(mode_, group_size_, transpose_, right_sorted_);
  }

 private:
  Mode mode_;
  int group_size_;
  bool transpose_;
  bool right_sorted_;
};

}  // namespace mlx_fpqmm
