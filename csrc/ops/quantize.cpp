#include "ops/ops.h"

#include <memory>
#include <stdexcept>

#include "mlx/ops.h"

#include "ops/checks.h"
#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace {

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
  const auto& format = resolve_format(op, mode, kAllModes, true);
  check_biases_and_bits(op, format, std::nullopt, bits);
  int resolved_group_size = resolve_group_size(op, format, group_size);
  check_global_scale(op, format, global_scale);
  if (format.scales != ScaleKind::floating) {
    // Nothing to compute in an empty w, which MLX's CUDA quantize divides by.
    return mx::quantize(
        w,
        resolved_group_size,
        format.bits,
        mode,
        global_scale,
        w.size() == 0 ? mx::StreamOrDevice(mx::Device::cpu) : s);
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
  const auto& format = resolve_format(op, mode, kAllModes, true);
  check_biases_and_bits(op, format, biases, bits);
  int resolved_group_size = resolve_group_size(op, format, group_size);
  check_global_scale(op, format, global_scale);
  if (format.scales != ScaleKind::floating) {
    // As in quantize: an empty w on the CPU, where MLX handles it.
    return mx::dequantize(
        w,
        scales,
        std::nullopt,
        resolved_group_size,
        format.bits,
        mode,
        global_scale,
        dtype,
        w.size() == 0 ? mx::StreamOrDevice(mx::Device::cpu) : s);
  }
  return dequantize_float_scales(
      w, scales, format, resolved_group_size, dtype, mx::to_stream(s));
}

}  // namespace mlx_fpqmm
