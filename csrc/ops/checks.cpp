#include "ops/checks.h"

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>

#include "mlx/ops.h"

#include "backend/cuda/device.h"

namespace mlx_fpqmm {

// Without iostreams: in the CUDA build the extension's own instantiation of
// basic_ostream's number output crashes (SIGSEGV, seen on an H200).
std::string shape_string(const mx::Shape& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? "," : "") + std::to_string(shape[i]);
  }
  return text + ")";
}

std::string dtype_string(mx::Dtype dtype) {
  constexpr std::array<std::string_view, 14> names = {
      "bool",
      "uint8",
      "uint16",
      "uint32",
      "uint64",
      "int8",
      "int16",
      "int32",
      "int64",
      "float16",
      "float32",
      "float64",
      "bfloat16",
      "complex64"};
  return std::string(names[static_cast<size_t>(dtype.val())]);
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
    std::initializer_list<Mode> allowed,
    bool affine_accepted) {
  auto parsed = mode_from_name(mode);
  for (Mode candidate : allowed) {
    if (parsed == candidate) {
      return format_for(candidate);
    }
  }
  std::string names = affine_accepted ? "affine" : "";
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
    const std::optional<mx::Shape>& experts) {
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
  // As MLX's dequantize: one value, of any shape.
  bool one_value = global_scale->size() == 1;
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
        "global_scale must hold one value but received shape " +
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

// The kernels of every device read their inputs in place (readable_in_place
// in primitives.h); this makes an array so, with a copy only where needed.
// Applied to the inputs as given: the product broadcasts their batches
// itself, so that a copy is never of a broadcast. (On GPU streams it must
// happen here: libmlx does not export its GPU copy to eval_gpu.)
mx::array readable_in_place_copy(const mx::array& a, mx::Stream stream) {
  // Evaluated row-contiguous arrays (a model's weights and scales) need
  // neither a copy nor a node in the graph.
  if (a.is_available() && a.flags().row_contiguous) {
    return a;
  }
  return mx::contiguous(a, false, stream);
}

mx::array x_for_product(const mx::array& x, int w_ndim, mx::Stream stream) {
#if defined(MLX_FPQMM_CUDA)
  // Once: this runs for every product of a decoding model.
  static const bool cuda_gpu = cuda::running_device().has_value();
  // x's axes after the broadcast against W's batch.
  const int ndim = std::max(static_cast<int>(x.ndim()), w_ndim);
  if (cuda_gpu && stream.device == mx::Device::gpu &&
      ndim <= fpqmm::cuda::kMaxCopyDims) {
    return x;
  }
#endif
  return readable_in_place_copy(x, stream);
}

}  // namespace mlx_fpqmm
