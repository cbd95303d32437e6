#include "ops/ops.h"

#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "mlx/ops.h"

#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace {

std::string shape_string(const mx::Shape& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    os << (i ? "," : "") << shape[i];
  }
  os << ")";
  return os.str();
}

std::string dtype_string(mx::Dtype dtype) {
  std::ostringstream os;
  os << dtype;
  return os.str();
}

[[noreturn]] void fail(std::string_view op, const std::string& message) {
  throw std::invalid_argument("[" + std::string(op) + "] " + message);
}

bool is_supported_float(mx::Dtype dtype) {
  return dtype == mx::float32 || dtype == mx::float16 || dtype == mx::bfloat16;
}

const Format& resolve_format(
    std::string_view op,
    const std::string& mode,
    std::initializer_list<Mode> allowed) {
  auto parsed = mode_from_name(mode);
  for (Mode candidate : allowed) {
    if (parsed == candidate) {
      return format_for(candidate);
    }
  }
  std::string names;
  for (Mode candidate : allowed) {
    names +=
        (names.empty() ? "" : ", ") + std::string(format_for(candidate).name);
  }
  fail(op, "Invalid mode '" + mode + "'; expected one of: " + names + ".");
}

int resolve_group_size(
    std::string_view op, const Format& format, std::optional<int> group_size) {
  int resolved = group_size.value_or(format.default_group_size);
  if (!format.allows_group_size(resolved)) {
    std::string allowed;
    for (int size : format.group_sizes) {
      allowed += (allowed.empty() ? "" : ", ") + std::to_string(size);
    }
    fail(
        op,
        "group_size=" + std::to_string(resolved) +
            " is not supported for mode '" + std::string(format.name) +
            "'; expected one of: " + allowed + ".");
  }
  return resolved;
}

void check_scales_dtype(
    std::string_view op, const Format& format, const mx::array& scales) {
  if (format.scales == ScaleKind::floating) {
    if (!is_supported_float(scales.dtype())) {
      fail(
          op,
          "scales for mode '" + std::string(format.name) +
              "' must be float32, float16 or bfloat16 but received " +
              dtype_string(scales.dtype()) + ".");
    }
  } else if (scales.dtype() != mx::uint8) {
    fail(
        op,
        "scales for mode '" + std::string(format.name) +
            "' must be uint8 but received " + dtype_string(scales.dtype()) +
            ".");
  }
}

// Checks w and scales against each other; returns the length of w's quantized
// (last) axis in elements.
int check_packed_weights(
    std::string_view op,
    const Format& format,
    int group_size,
    const mx::array& w,
    const mx::array& scales) {
  if (w.dtype() != mx::uint32) {
    fail(
        op,
        "w must be uint32 (packed codes) but received " +
            dtype_string(w.dtype()) + ".");
  }
  if (w.ndim() < 2) {
    fail(
        op,
        "w must have at least 2 dimensions but received shape " +
            shape_string(w.shape()) + ".");
  }
  check_scales_dtype(op, format, scales);
  int64_t packed_length =
      static_cast<int64_t>(w.shape(-1)) * format.elements_per_word();
  if (packed_length > std::numeric_limits<int>::max()) {
    fail(
        op,
        "The quantized axis of w would hold " + std::to_string(packed_length) +
            " elements; at most " +
            std::to_string(std::numeric_limits<int>::max()) +
            " are supported.");
  }
  int quantized_length = static_cast<int>(packed_length);
  if (quantized_length % group_size != 0) {
    fail(
        op,
        "The quantized axis of w has " + std::to_string(quantized_length) +
            " elements, which is not a multiple of group_size=" +
            std::to_string(group_size) + ".");
  }
  auto expected = w.shape();
  expected.back() = quantized_length / group_size;
  if (scales.shape() != expected) {
    fail(
        op,
        "scales must have shape " + shape_string(expected) +
            " for w of shape " + shape_string(w.shape()) +
            " with group_size=" + std::to_string(group_size) + " and mode '" +
            std::string(format.name) + "' but received " +
            shape_string(scales.shape()) + ".");
  }
  return quantized_length;
}

mx::Shape batch_shape(const mx::array& a) {
  return mx::Shape(a.shape().begin(), a.shape().end() - 2);
}

// One value, or with `experts` (w's batch shape, for gather_qmm) one per
// matrix of w.
void check_global_scale(
    std::string_view op,
    const Format& format,
    const std::optional<mx::array>& global_scale,
    const std::optional<mx::Shape>& experts = std::nullopt) {
  if (!global_scale) {
    return;
  }
  if (format.mode != Mode::nvfp4) {
    fail(
        op,
        "global_scale is only supported for mode 'nvfp4' but mode is '" +
            std::string(format.name) + "'.");
  }
  if (global_scale->dtype() != mx::float32) {
    fail(
        op,
        "global_scale must be float32 but received " +
            dtype_string(global_scale->dtype()) + ".");
  }
  bool one_value = global_scale->ndim() <= 1 && global_scale->size() == 1;
  if (experts && !one_value && global_scale->shape() != *experts) {
    fail(
        op,
        "global_scale must hold one value or have w's batch shape " +
            shape_string(*experts) + " but received shape " +
            shape_string(global_scale->shape()) + ".");
  }
  if (!experts && !one_value) {
    fail(
        op,
        "global_scale must hold one value (shape () or (1,)) but received "
        "shape " +
            shape_string(global_scale->shape()) + ".");
  }
}

// x's dtype and its last dimension against w's K; returns K.
int check_x(
    std::string_view op,
    const mx::array& x,
    const mx::array& w,
    int quantized_length,
    bool transpose) {
  if (!is_supported_float(x.dtype())) {
    fail(
        op,
        "x must be float32, float16 or bfloat16 but received " +
            dtype_string(x.dtype()) + ".");
  }
  int K = transpose ? quantized_length : w.shape(-2);
  if (x.ndim() > 0 && x.shape(-1) != K) {
    fail(
        op,
        "The last dimension of x (" + std::to_string(x.shape(-1)) +
            ") must equal K=" + std::to_string(K) + " of w with shape " +
            shape_string(w.shape()) +
            " (transpose=" + (transpose ? "True" : "False") + ").");
  }
  return K;
}

// MLX's biases and bits arguments, which the fp modes fix.
void check_biases_and_bits(
    std::string_view op,
    const Format& format,
    const std::optional<mx::array>& biases,
    std::optional<int> bits) {
  if (biases) {
    fail(
        op,
        "biases must be None for quantization mode '" +
            std::string(format.name) + "'.");
  }
  if (bits && *bits != format.bits) {
    fail(
        op,
        "bits=" + std::to_string(*bits) + " is not supported for mode '" +
            std::string(format.name) + "'; expected " +
            std::to_string(format.bits) + ".");
  }
}

mx::Shape with_batch(const mx::Shape& batch, const mx::array& a) {
  mx::Shape shape = batch;
  shape.insert(shape.end(), a.shape().end() - 2, a.shape().end());
  return shape;
}

// The kernels of every device read their inputs in place (readable_in_place
// in primitives.h); this makes an array so, with a copy only where needed.
// Applied before any batch broadcast, so that broadcasts stay views. (On GPU
// streams it must happen here: libmlx does not export its GPU copy to
// eval_gpu.)
mx::array readable_in_place_copy(const mx::array& a, mx::Stream stream) {
  return mx::contiguous(a, false, stream);
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
  x = readable_in_place_copy(x, stream);
  w = readable_in_place_copy(w, stream);
  scales = readable_in_place_copy(scales, stream);
  if (w.ndim() > 2) {
    mx::Shape batch;
    try {
      batch = mx::broadcast_shapes(batch_shape(x), batch_shape(w));
    } catch (const std::invalid_argument&) {
      fail(
          op,
          "The batch dimensions of x " + shape_string(batch_shape(x)) +
              " and w " + shape_string(batch_shape(w)) +
              " cannot be broadcast.");
    }
    x = mx::broadcast_to(x, with_batch(batch, x), stream);
    w = mx::broadcast_to(w, with_batch(batch, w), stream);
    scales = mx::broadcast_to(scales, with_batch(batch, scales), stream);
  }
  auto out = make_fp_qmm(
      make_inputs(x, w, scales, global_scale),
      format.mode,
      resolved_group_size,
      transpose,
      stream);
  return vector_input ? mx::squeeze(out, -2, stream) : out;
}

}  // namespace

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
  const auto& format = resolve_format(
      op, mode, {Mode::mxfp4, Mode::nvfp4, Mode::mxfp8, Mode::fp4, Mode::fp8});
  check_biases_and_bits(op, format, biases, bits);
  return fp_qmm_checked(
      op, x, w, scales, std::nullopt, format, group_size, transpose, s);
}

namespace {

const std::initializer_list<Mode> kAllModes = {
    Mode::mxfp4, Mode::nvfp4, Mode::mxfp8, Mode::fp4, Mode::fp8};

// Nearest E2M1 code with ties to even: each threshold that |v| passes adds one
// to the magnitude code (0, 0.5, 1, 1.5, 2, 3, 4, 6); the comparison is strict
// where the tie must round down to the even code.
mx::array e2m1_codes(const mx::array& v, mx::Stream s) {
  struct Threshold {
    float value;
    bool inclusive;
  };
  constexpr Threshold thresholds[] = {
      {0.25f, false},
      {0.75f, true},
      {1.25f, false},
      {1.75f, true},
      {2.5f, false},
      {3.5f, true},
      {5.0f, false}};
  auto magnitude = mx::abs(v, s);
  auto codes = mx::zeros(v.shape(), mx::uint8, s);
  for (auto [value, inclusive] : thresholds) {
    auto passed = inclusive ? mx::greater_equal(magnitude, mx::array(value), s)
                            : mx::greater(magnitude, mx::array(value), s);
    codes = mx::add(codes, mx::astype(passed, mx::uint8, s), s);
  }
  auto sign = mx::astype(mx::less(v, mx::array(0.0f), s), mx::uint8, s);
  return mx::add(codes, mx::multiply(sign, mx::array(8, mx::uint8), s), s);
}

std::vector<mx::array> quantize_float_scales(
    const mx::array& w, const Format& format, int group_size, mx::Stream s) {
  constexpr std::string_view op = "quantize";
  if (!is_supported_float(w.dtype())) {
    fail(
        op,
        "w must be float32, float16 or bfloat16 but received " +
            dtype_string(w.dtype()) + ".");
  }
  if (w.ndim() < 2) {
    fail(
        op,
        "w must have at least 2 dimensions but received shape " +
            shape_string(w.shape()) + ".");
  }
  int K = w.shape(-1);
  if (K % group_size != 0) {
    fail(
        op,
        "The last dimension of w (" + std::to_string(K) +
            ") must be a multiple of group_size=" + std::to_string(group_size) +
            ".");
  }
  auto grouped_shape = w.shape();
  grouped_shape.back() = K / group_size;
  grouped_shape.push_back(group_size);
  auto grouped = mx::reshape(w, grouped_shape, s);
  auto scales = mx::divide(
      mx::max(mx::abs(grouped, s), -1, true, s),
      mx::array(format.code_max, w.dtype()),
      s);
  auto scales_f32 = mx::astype(scales, mx::float32, s);
  auto divisor = mx::where(
      mx::equal(scales_f32, mx::array(0.0f), s),
      mx::array(1.0f),
      scales_f32,
      s);
  auto scaled = mx::reshape(
      mx::divide(mx::astype(grouped, mx::float32, s), divisor, s),
      w.shape(),
      s);

  mx::array bytes = scaled;
  if (format.codes == CodeKind::e2m1) {
    auto codes = e2m1_codes(scaled, s);
    auto pair_shape = w.shape();
    pair_shape.back() = K / 2;
    pair_shape.push_back(2);
    auto pairs = mx::split(mx::reshape(codes, pair_shape, s), 2, -1, s);
    bytes = mx::squeeze(
        mx::bitwise_or(
            pairs[0], mx::left_shift(pairs[1], mx::array(4, mx::uint8), s), s),
        -1,
        s);
  } else {
    // A non-finite value (its group's scale is then inf or NaN too) becomes
    // the E4M3 NaN code; to_fp8 would saturate it to +-448.
    bytes = mx::where(
        mx::isfinite(scaled, s),
        mx::to_fp8(scaled, s),
        mx::array(0x7F, mx::uint8),
        s);
  }
  auto packed = mx::view(mx::contiguous(bytes, false, s), mx::uint32, s);
  return {packed, mx::squeeze(scales, -1, s)};
}

mx::array dequantize_float_scales(
    const mx::array& w,
    const mx::array& scales,
    const Format& format,
    int group_size,
    std::optional<mx::Dtype> dtype,
    mx::Stream s) {
  constexpr std::string_view op = "dequantize";
  int K = check_packed_weights(op, format, group_size, w, scales);
  auto out_dtype = dtype.value_or(scales.dtype());
  if (!is_supported_float(out_dtype)) {
    fail(
        op,
        "dtype must be float32, float16 or bfloat16 but received " +
            dtype_string(out_dtype) + ".");
  }
  auto bytes = mx::view(w, mx::uint8, s);
  mx::array codes = bytes;
  if (format.codes == CodeKind::e2m1) {
    auto low = mx::bitwise_and(bytes, mx::array(0xF, mx::uint8), s);
    auto high = mx::right_shift(bytes, mx::array(4, mx::uint8), s);
    auto shape = w.shape();
    shape.back() = K;
    codes = mx::reshape(mx::stack({low, high}, -1, s), shape, s);
  }
  auto table = code_values(format.codes);
  auto values = mx::take(
      mx::array(table.data(), {static_cast<int>(table.size())}, mx::float32),
      codes,
      s);
  auto grouped_shape = w.shape();
  grouped_shape.back() = K / group_size;
  grouped_shape.push_back(group_size);
  auto scaled = mx::multiply(
      mx::reshape(values, grouped_shape, s),
      mx::expand_dims(mx::astype(scales, mx::float32, s), -1, s),
      s);
  auto shape = w.shape();
  shape.back() = K;
  return mx::astype(mx::reshape(scaled, shape, s), out_dtype, s);
}

}  // namespace

std::vector<mx::array> quantize(
    const mx::array& w,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    const std::optional<mx::array>& global_scale,
    mx::StreamOrDevice s) {
  if (mode == "affine") {
    return mx::quantize(w, group_size, bits, mode, global_scale, s);
  }
  constexpr std::string_view op = "quantize";
  const auto& format = resolve_format(op, mode, kAllModes);
  check_biases_and_bits(op, format, std::nullopt, bits);
  int resolved_group_size = resolve_group_size(op, format, group_size);
  check_global_scale(op, format, global_scale);
  if (format.scales != ScaleKind::floating) {
    return mx::quantize(
        w, resolved_group_size, format.bits, mode, global_scale, s);
  }
  return quantize_float_scales(
      w, format, resolved_group_size, mx::to_stream(s));
}

mx::array dequantize(
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    std::optional<int> group_size,
    std::optional<int> bits,
    const std::string& mode,
    const std::optional<mx::array>& global_scale,
    std::optional<mx::Dtype> dtype,
    mx::StreamOrDevice s) {
  if (mode == "affine") {
    return mx::dequantize(
        w, scales, biases, group_size, bits, mode, global_scale, dtype, s);
  }
  constexpr std::string_view op = "dequantize";
  const auto& format = resolve_format(op, mode, kAllModes);
  check_biases_and_bits(op, format, biases, bits);
  int resolved_group_size = resolve_group_size(op, format, group_size);
  check_global_scale(op, format, global_scale);
  if (format.scales != ScaleKind::floating) {
    return mx::dequantize(
        w,
        scales,
        std::nullopt,
        resolved_group_size,
        format.bits,
        mode,
        global_scale,
        dtype,
        s);
  }
  return dequantize_float_scales(
      w, scales, format, resolved_group_size, dtype, mx::to_stream(s));
}

namespace {

// The indices as uint32 (as MLX casts them), or an arange over the batch of
// `operand` when absent.
mx::array index_array(
    std::string_view op,
    std::string_view name,
    const std::optional<mx::array>& indices,
    const mx::array& operand,
    mx::Stream s) {
  if (!indices) {
    auto range =
        mx::arange(static_cast<int>(matrix_count(operand)), mx::uint32, s);
    return mx::reshape(range, batch_shape(operand), s);
  }
  if (!mx::issubdtype(indices->dtype(), mx::integer)) {
    fail(
        op,
        std::string(name) + " must be an integer array but received " +
            dtype_string(indices->dtype()) + ".");
  }
  return mx::astype(*indices, mx::uint32, s);
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
  const auto& format = resolve_format(op, mode, kAllModes);
  check_biases_and_bits(op, format, biases, bits);
  if (!lhs_indices && !rhs_indices) {
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
  auto lhs = index_array(op, "lhs_indices", lhs_indices, x, stream);
  auto rhs = index_array(op, "rhs_indices", rhs_indices, w, stream);
  std::vector<mx::array> indices;
  try {
    // broadcast_arrays (not broadcast_to): shapeless compilation re-infers it.
    indices = mx::broadcast_arrays({lhs, rhs}, stream);
  } catch (const std::invalid_argument&) {
    fail(
        op,
        "lhs_indices of shape " + shape_string(lhs.shape()) +
            " and rhs_indices of shape " + shape_string(rhs.shape()) +
            " cannot be broadcast.");
  }
  std::optional<mx::array> expert_scales;
  if (global_scale) {
    expert_scales = mx::broadcast_to(
        mx::flatten(*global_scale, stream),
        {static_cast<int>(experts)},
        stream);
  }
  return fp_gather_qmm_unchecked(
      x,
      w,
      scales,
      indices[0],
      indices[1],
      expert_scales,
      format.mode,
      resolved_group_size,
      transpose,
      sorted_indices && !lhs_indices,
      stream);
}

mx::array fp_gather_qmm_unchecked(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& lhs_indices,
    const mx::array& rhs_indices,
    const std::optional<mx::array>& global_scale,
    Mode mode,
    int group_size,
    bool transpose,
    bool right_sorted,
    mx::Stream stream) {
  // Row-contiguous arrays: a pair's operands are then whole matrices at
  // index * matrix size, and the indices are read in order.
  auto contiguous = [&](const mx::array& a) {
    return mx::contiguous(a, false, stream);
  };
  auto inputs = make_gather_inputs(
      contiguous(x),
      contiguous(w),
      contiguous(scales),
      contiguous(lhs_indices),
      contiguous(rhs_indices),
      global_scale ? std::optional(contiguous(*global_scale)) : std::nullopt);
  auto primitive = std::make_shared<FpGatherQuantizedMatmul>(
      stream, mode, group_size, transpose, right_sorted);
  auto shape = primitive->output_shapes(inputs)[0];
  return mx::array(std::move(shape), x.dtype(), primitive, std::move(inputs));
}

}  // namespace mlx_fpqmm
