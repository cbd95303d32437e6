// User-facing ops: every check on arguments happens here, before a primitive
// is built.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/utils.h"

#include "common/formats.h"

namespace mlx_fpqmm {

namespace mx = mlx::core;

mx::array fp4_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    bool transpose = true,
    std::optional<int> group_size = std::nullopt,
    const std::string& mode = "mxfp4",
    const std::optional<mx::array>& global_scale = std::nullopt,
    mx::StreamOrDevice s = {});

mx::array fp8_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    bool transpose = true,
    std::optional<int> group_size = std::nullopt,
    const std::string& mode = "mxfp8",
    mx::StreamOrDevice s = {});

// Same signature and results as mx::quantized_matmul; fp modes run on our
// primitive, "affine" is MLX's own op.
mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases = std::nullopt,
    bool transpose = true,
    std::optional<int> group_size = std::nullopt,
    std::optional<int> bits = std::nullopt,
    const std::string& mode = "affine",
    mx::StreamOrDevice s = {});

// Same signature and results as mx::gather_qmm; fp modes run on our
// primitive (global_scale of shape (E,) on every device), "affine" is MLX's.
mx::array gather_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases = std::nullopt,
    const std::optional<mx::array>& lhs_indices = std::nullopt,
    const std::optional<mx::array>& rhs_indices = std::nullopt,
    bool transpose = true,
    std::optional<int> group_size = std::nullopt,
    std::optional<int> bits = std::nullopt,
    const std::string& mode = "affine",
    const std::optional<mx::array>& global_scale = std::nullopt,
    bool sorted_indices = false,
    mx::StreamOrDevice s = {});

// Same signatures as mx::quantize / mx::dequantize; the float-scale modes
// (fp4, fp8) are ours, MLX's modes ("affine" included) are MLX's own ops.
std::vector<mx::array> quantize(
    const mx::array& w,
    std::optional<int> group_size = std::nullopt,
    std::optional<int> bits = std::nullopt,
    const std::string& mode = "affine",
    const std::optional<mx::array>& global_scale = std::nullopt,
    mx::StreamOrDevice s = {});

mx::array dequantize(
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases = std::nullopt,
    std::optional<int> group_size = std::nullopt,
    std::optional<int> bits = std::nullopt,
    const std::string& mode = "affine",
    const std::optional<mx::array>& global_scale = std::nullopt,
    std::optional<mx::Dtype> dtype = std::nullopt,
    mx::StreamOrDevice s = {});

// Builds the primitive on already validated and broadcast inputs, w and
// scales readable in place (the primitive's transforms: x is a cotangent or
// tangent, copied here where needed).
mx::array fp_qmm_unchecked(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    Mode mode,
    int group_size,
    bool transpose,
    mx::Stream stream);

// The lhs_indices that gather_qmm's default means: x's batch (0, 1, ...)
// broadcast to the shape of the pairs' rhs_indices.
mx::array default_lhs_indices(
    const mx::array& x, const mx::array& pair_rhs, mx::Stream stream);

// Builds the gather primitive on validated inputs: x (..., M, K), w and
// scales (..., R, C) with E matrices, rhs_indices uint32 of the pairs'
// shape, global_scale (E,), and lhs_indices uint32 of that shape or none,
// x's batch then being of implicit_lhs_axes' form (primitives.h).
mx::array fp_gather_qmm_unchecked(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& lhs_indices,
    const mx::array& rhs_indices,
    const std::optional<mx::array>& global_scale,
    Mode mode,
    int group_size,
    bool transpose,
    bool right_sorted,
    mx::Stream stream);

}  // namespace mlx_fpqmm
