// Backend-independent parts of FpQuantizedMatmul: shapes, equivalence and
// transforms (written with ops, on the primitive's stream).
#include "primitives.h"

#include <stdexcept>

#include "ops.h"

namespace mlx_fpqmm {

namespace {

std::optional<mx::array> global_scale_input(
    const std::vector<mx::array>& inputs) {
  if (inputs.size() > 3) {
    return inputs[3];
  }
  return std::nullopt;
}

}  // namespace

std::vector<mx::Shape> FpQuantizedMatmul::output_shapes(
    const std::vector<mx::array>& inputs) {
  const auto& w = inputs[1];
  int n = transpose_ ? w.shape(-2)
                     : w.shape(-1) * format_for(mode_).elements_per_word();
  auto shape = inputs[0].shape();
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
    if (argnum != 0) {
      throw std::invalid_argument(
          "[FpQuantizedMatmul::vjp] No gradient with respect to the "
          "quantized weights, scales or global scale (argument " +
          std::to_string(argnum) + "); only x is differentiable.");
    }
    // d(x @ W^T)/dx = cotangent @ W: the same weights with transpose flipped.
    grads.push_back(fp_qmm_unchecked(
        cotangents[0],
        primals[1],
        primals[2],
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
    if (argnum != 0) {
      throw std::invalid_argument(
          "[FpQuantizedMatmul::jvp] No derivative with respect to the "
          "quantized weights, scales or global scale (argument " +
          std::to_string(argnum) + "); only x is differentiable.");
    }
  }
  return {fp_qmm_unchecked(
      tangents[0],
      primals[1],
      primals[2],
      global_scale_input(primals),
      mode_,
      group_size_,
      transpose_,
      stream())};
}

}  // namespace mlx_fpqmm
