// The argument checks every op shares: formats and group sizes, w and scales
// against each other, x, the global scale, MLX's biases and bits, and the one
// rule that makes inputs readable in place. A failed check throws
// std::invalid_argument (ValueError in Python) naming the op, the argument,
// the expected and the received.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "mlx/array.h"

#include "common/formats.h"

namespace mlx_fpqmm {

namespace mx = mlx::core;

inline const std::initializer_list<Mode> kAllModes = {
    Mode::mxfp4, Mode::nvfp4, Mode::mxfp8, Mode::fp4, Mode::fp8};

std::string shape_string(const mx::Shape& shape);

std::string dtype_string(mx::Dtype dtype);

[[noreturn]] void fail(std::string_view op, const std::string& message);

bool is_supported_float(mx::Dtype dtype);

// The format of `mode`, one of `allowed`; `affine_accepted`: the op passes
// MLX's affine mode to MLX before this check, so the error lists it too.
const Format& resolve_format(
    std::string_view op,
    const std::string& mode,
    std::initializer_list<Mode> allowed,
    bool affine_accepted = false);

int resolve_group_size(
    std::string_view op, const Format& format, std::optional<int> group_size);

void check_scales_dtype(
    std::string_view op, const Format& format, const mx::array& scales);

// Checks w and scales against each other; returns the length of w's quantized
// (last) axis in elements.
int check_packed_weights(
    std::string_view op,
    const Format& format,
    int group_size,
    const mx::array& w,
    const mx::array& scales);

mx::Shape batch_shape(const mx::array& a);

// One value, or with `experts` (w's batch shape, for gather_qmm) one per
// matrix of w.
void check_global_scale(
    std::string_view op,
    const Format& format,
    const std::optional<mx::array>& global_scale,
    const std::optional<mx::Shape>& experts = std::nullopt);

// x's dtype and its last dimension against w's K; returns K.
int check_x(
    std::string_view op,
    const mx::array& x,
    const mx::array& w,
    int quantized_length,
    bool transpose);

// MLX's biases and bits arguments, which the fp modes fix.
void check_biases_and_bits(
    std::string_view op,
    const Format& format,
    const std::optional<mx::array>& biases,
    std::optional<int> bits);

// The kernels of every device read their inputs in place (readable_in_place
// in primitives.h); this makes an array so, with a copy only where needed.
// Applied to the inputs as given: the product broadcasts their batches
// itself, so that a copy is never of a broadcast. (On GPU streams it must
// happen here: libmlx does not export its GPU copy to eval_gpu.)
mx::array readable_in_place_copy(const mx::array& a, mx::Stream stream);

// x as the product primitive takes it on `stream`, with W of `w_ndim` axes:
// on an NVIDIA GPU as it comes (eval_gpu copies what its kernels cannot
// read in place, up to its copy's axes, which spares each product of a
// model a node in the graph), elsewhere readable_in_place_copy.
mx::array x_for_product(const mx::array& x, int w_ndim, mx::Stream stream);

}  // namespace mlx_fpqmm
