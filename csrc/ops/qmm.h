// The validated product that fp4_qmm, fp8_qmm, quantized_matmul and
// gather_qmm without indices share, and the dequantize + matmul graph that
// replaces the product primitive where the CUDA plan says so.
#pragma once

#include <optional>
#include <string_view>

#include "mlx/array.h"
#include "mlx/utils.h"

#include "backend/cuda/device.h"
#include "backend/cuda/plan.h"
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

// Tests: the ops build dequantize + matmul (and dequantize + gather_mm) on
// CPU streams too, with FpDequantize's CPU kernel, to check those graphs
// without a GPU (mlx_fpqmm.testing.dequantize_on_cpu). Per thread, off by
// default.
bool dequantize_on_cpu();
void set_dequantize_on_cpu(bool on);

// Whether the op builds dequantize + matmul on `stream` instead of the
// product primitive: on an NVIDIA GPU where planned(MLX_FPQMM_KERNEL's
// request) says so (tested first: it runs on every call of a decoding
// model), on the CPU where tests ask for it, nowhere else (Metal: the
// environment's request is the Metal plan's).
template <typename Planned>
bool builds_dequantize(mx::Stream stream, Planned&& planned) {
  if (stream.device == mx::Device::cpu) {
    return dequantize_on_cpu();
  }
#if defined(MLX_FPQMM_CUDA)
  return planned(cuda::kernel_request_from_env()) &&
         cuda::running_device().has_value();
#else
  return false;
#endif
}

// W (every matrix) dequantized in `dtype` by FpDequantize: the first half of
// dequantize + matmul. global_scale: one value, or one per matrix of W.
mx::array dequantized_weights(
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    Mode mode,
    int group_size,
    mx::Dtype dtype,
    mx::Stream stream);

}  // namespace mlx_fpqmm
