#include "ops/ops.h"

#include <limits>
#include <memory>
#include <stdexcept>

#include "mlx/ops.h"

#include "backend/common/problem.h"
#include "ops/checks.h"
#include "ops/qmm.h"
#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace {

// The batch of `operand`'s matrices: 0, 1, ... in its batch shape.
mx::array batch_indices(const mx::array& operand, mx::Stream s) {
  auto range =
      mx::arange(static_cast<int>(matrix_count(operand)), mx::uint32, s);
  return mx::reshape(range, batch_shape(operand), s);
}

// The indices as uint32 (as MLX casts them), or an arange over the batch of
// `operand` when absent. 64-bit indices past uint32 are clipped to its
// largest value first, so that they stay out of range (NaN rows) instead of
// wrapping onto an expert.
mx::array index_array(
    std::string_view op,
    std::string_view name,
    const std::optional<mx::array>& indices,
    const mx::array& operand,
    mx::Stream s) {
  if (!indices) {
    return batch_indices(operand, s);
  }
  if (!mx::issubdtype(indices->dtype(), mx::integer)) {
    fail(
        op,
        std::string(name) + " must be an integer array but received " +
            dtype_string(indices->dtype()) + ".");
  }
  if (indices->itemsize() < 8) {
    return mx::astype(*indices, mx::uint32, s);
  }
  constexpr auto largest = std::numeric_limits<uint32_t>::max();
  const bool is_signed = mx::issubdtype(indices->dtype(), mx::signedinteger);
  // A negative index is out of range too: -1 becomes the largest uint32.
  auto clipped = mx::clip(
      *indices,
      mx::array(is_signed ? -1 : 0, indices->dtype()),
      mx::array(largest, indices->dtype()),
      s);
  return mx::astype(clipped, mx::uint32, s);
}

// gather_mm(x, w, lhs_indices, rhs_indices) for pairs of one row (x (...,
// 1, K)) as MLX's grouped GEMM: on the pairs sorted by expert.
mx::array sorted_gather_mm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& lhs_indices,
    const mx::array& rhs_indices,
    mx::Stream stream) {
  const auto pairs_shape = rhs_indices.shape();
  auto x_rows = mx::reshape(x, {-1, 1, x.shape(-1)}, stream);
  auto experts = mx::flatten(rhs_indices, stream);
  auto order = mx::argsort(experts, stream);
  auto rows = mx::take(
      x_rows,
      mx::take(mx::flatten(lhs_indices, stream), order, stream),
      0,
      stream);
  auto sorted_products = mx::gather_mm(
      rows, w, std::nullopt, mx::take(experts, order, stream), true, stream);
  auto products =
      mx::take(sorted_products, mx::argsort(order, stream), 0, stream);
  auto shape = pairs_shape;
  shape.insert(shape.end(), {1, w.shape(-1)});
  return mx::reshape(products, shape, stream);
}

// Where the CUDA plan takes a gather of many rows without lhs_indices
// (mlx-lm's layouts) by dequantize + gather_mm: every expert dequantized in
// x's type, then MLX's gather_mm. Its grouped GEMM needs pairs of one row
// sorted by expert with x in pair order: pairs that do not come so are
// sorted here (on the device), x's rows taken in that order and the products
// put back. Pairs with an index out of range are NaN, as the primitive makes
// them; the product runs on indices clamped to the last expert, so that
// nothing reads past the arrays and sorted indices stay sorted.
// rhs_indices: broadcast to the pairs' shape; N: the product's.
std::optional<mx::array> dequantized_gather(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& rhs_indices,
    int N,
    const std::optional<mx::array>& expert_scales,
    Mode mode,
    int group_size,
    bool transpose,
    bool sorted_pairs,
    mx::Stream stream) {
  const int64_t pairs = rhs_indices.size();
  if (x.size() == 0 || w.size() == 0 || pairs == 0) {
    return std::nullopt;
  }
  const int64_t experts = matrix_count(w);
  // The gather as the primitive's plan would see it (shapes and types).
  const auto problem = describe_gather_problem(
      {x, w, scales, rhs_indices, rhs_indices},
      {N},
      mode,
      group_size,
      transpose,
      sorted_pairs);
  const auto gather = cuda::gather_rows(problem, sorted_pairs);
  if (!builds_dequantize(stream, [&](cuda::KernelRequest request) {
        // Without the device first (a decoding model calls this for every
        // product): the device can only take the dequantize away
        // (fp_qmm_wgmma_grouped on sm_90).
        if (!cuda::gather_dequantize_then_matmul(gather, request)) {
          return false;
        }
        const auto device = cuda::running_device();
        return device &&
               cuda::gather_dequantize_then_matmul(
                   cuda::gather_rows(problem, sorted_pairs, *device), request);
      })) {
    return std::nullopt;
  }
  auto dense = dequantized_weights(
      w, scales, expert_scales, mode, group_size, x.dtype(), stream);
  // Row-contiguous with the strides of a fresh array (a reshape's): MLX's
  // grouped GEMM takes x's batch stride to be K and its stride over M (an
  // axis of 1, which expand_dims gives stride 1) to be the rows' stride.
  auto x_rows = mx::reshape(
      mx::flatten(readable_in_place_copy(x, stream), -2, -1, stream),
      x.shape(),
      stream);
  if (transpose) {
    dense = mx::swapaxes(dense, -1, -2, stream);
  }
  auto last = mx::array(static_cast<uint32_t>(experts - 1), mx::uint32);
  auto clamped = mx::minimum(rhs_indices, last, stream);
  mx::array y =
      gather.grouped && !gather.in_order
          ? sorted_gather_mm(
                x_rows,
                dense,
                default_lhs_indices(x, rhs_indices, stream),
                clamped,
                stream)
          : mx::gather_mm(
                x_rows, dense, std::nullopt, clamped, gather.grouped, stream);
  auto valid = mx::less_equal(rhs_indices, last, stream);
  return mx::where(
      mx::expand_dims(valid, {-2, -1}, stream),
      y,
      mx::array(std::numeric_limits<float>::quiet_NaN(), x.dtype()),
      stream);
}

}  // namespace

mx::array gather_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices,
    bool transpose,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    const std::optional<mx::array>& global_scale,
    bool sorted_indices,
    mx::StreamOrDevice s) {
  if (mode == "affine") {
    return mx::gather_qmm(
        x,
        w,
        scales,
        biases,
        lhs_indices,
        rhs_indices,
        transpose,
        group_size,
        bits,
        mode,
        global_scale,
        sorted_indices,
        s);
  }
  constexpr std::string_view op = "gather_qmm";
  const auto& format = resolve_format(op, mode, kAllModes, true);
  check_biases_and_bits(op, format, biases, bits);
  // Without indices the product is quantized_matmul's, but for a global
  // scale per matrix of w, which the gather of every matrix reads.
  if (!lhs_indices && !rhs_indices &&
      (!global_scale || global_scale->size() <= 1)) {
    return fp_qmm_checked(
        op, x, w, scales, global_scale, format, group_size, transpose, s);
  }
  int resolved_group_size = resolve_group_size(op, format, group_size);
  int quantized_length =
      check_packed_weights(op, format, resolved_group_size, w, scales);
  check_x(op, x, w, quantized_length, transpose);
  if (x.ndim() < 2) {
    fail(
        op,
        "x must have at least 2 dimensions (..., M, K) but received shape " +
            shape_string(x.shape()) + ".");
  }
  check_global_scale(op, format, global_scale, batch_shape(w));
  int64_t experts = matrix_count(w);

  auto stream = mx::to_stream(s);
  auto rhs = index_array(op, "rhs_indices", rhs_indices, w, stream);
  const auto lhs_shape = lhs_indices ? lhs_indices->shape() : batch_shape(x);
  mx::Shape pairs;
  try {
    pairs = mx::broadcast_shapes(lhs_shape, rhs.shape());
  } catch (const std::invalid_argument&) {
    // An index not given is the batch of its operand.
    fail(
        op,
        (lhs_indices ? "lhs_indices of shape " : "x's batch shape ") +
            shape_string(lhs_shape) +
            (rhs_indices ? " and rhs_indices of shape "
                         : " and w's batch shape ") +
            shape_string(rhs.shape()) + " cannot be broadcast.");
  }
  std::optional<mx::array> expert_scales;
  if (global_scale) {
    expert_scales = mx::broadcast_to(
        mx::flatten(*global_scale, stream),
        {static_cast<int>(experts)},
        stream);
  }
  const bool right_sorted = sorted_indices && !lhs_indices;
  // mlx-lm's layouts (rhs_indices of the pairs' shape, x's matrices in
  // order) need no index array for x's matrices.
  const bool implicit_lhs = !lhs_indices && rhs.shape() == pairs &&
                            implicit_lhs_axes(lhs_shape, pairs);
  // broadcast_arrays (not broadcast_to): shapeless compilation re-infers it.
  auto indices =
      implicit_lhs
          ? std::vector<mx::array>{rhs, rhs}
          : mx::broadcast_arrays(
                {index_array(op, "lhs_indices", lhs_indices, x, stream), rhs},
                stream);
  if (!lhs_indices) {
    const bool sorted_pairs =
        cuda::sorted_pairs(right_sorted, rhs.size(), indices[1].size());
    if (auto product = dequantized_gather(
            x,
            w,
            scales,
            indices[1],
            transpose ? w.shape(-2) : quantized_length,
            expert_scales,
            format.mode,
            resolved_group_size,
            transpose,
            sorted_pairs,
            stream)) {
      return *product;
    }
  }
  return fp_gather_qmm_unchecked(
      x,
      w,
      scales,
      implicit_lhs ? std::nullopt : std::optional(indices[0]),
      indices[1],
      expert_scales,
      format.mode,
      resolved_group_size,
      transpose,
      right_sorted,
      stream);
}

mx::array default_lhs_indices(
    const mx::array& x, const mx::array& pair_rhs, mx::Stream stream) {
  return mx::broadcast_arrays({batch_indices(x, stream), pair_rhs}, stream)[0];
}

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
    mx::Stream stream) {
  // Row-contiguous arrays: a pair's operands are then whole matrices at
  // index * matrix size, and the indices are read in order (evaluated ones,
  // such as a model's weights, without a node in the graph).
  auto contiguous = [&](const mx::array& a) {
    return readable_in_place_copy(a, stream);
  };
  auto rhs = contiguous(rhs_indices);
  auto inputs = make_gather_inputs(
      contiguous(x),
      contiguous(w),
      contiguous(scales),
      lhs_indices ? contiguous(*lhs_indices) : rhs,
      rhs,
      global_scale ? std::optional(contiguous(*global_scale)) : std::nullopt);
  auto primitive = std::make_shared<FpGatherQuantizedMatmul>(
      stream, mode, group_size, transpose, right_sorted, !lhs_indices);
  auto shape = primitive->output_shapes(inputs)[0];
  return mx::array(std::move(shape), x.dtype(), primitive, std::move(inputs));
}

}  // namespace mlx_fpqmm
