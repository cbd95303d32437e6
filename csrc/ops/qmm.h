// The validated product that fp4_qmm, fp8_qmm, quantized_matmul and
// gather_qmm without indices share.
#pragma once

#include <optional>
#include <string_view>

#include "mlx/array.h"
#include "mlx/utils.h"

#include "common/formats.h"

namespace mlx_fpqmm {

namespace mx = mlx::core;

// x @ dequantize(w).T (or x @ dequantize(w)) in `format`, resolved by the
// caller; checks everything else.
mx::array fp_qmm_checked(
    std::string_view op,
    mx::array x,
    mx::array w,
    mx::array scales,
    const std::optional<mx::array>& global_scale,
    const Format& format,
    std::optional<int> group_size,
    bool transpose,
    mx::StreamOrDevice s);

}  // namespace mlx_fpqmm
