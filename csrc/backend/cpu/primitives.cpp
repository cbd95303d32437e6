// FpQuantizedMatmul on the CPU: one kernel call per batch element, on inputs
// the op has made readable in place (readable_in_place in primitives.h); and
// FpDequantize.
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/qmm.h"
#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace {

// Element offset in `a` of batch element `index` of the product, whose batch
// axes are out's leading ones; a's broadcast to them (it may lack leading
// axes or have 1 where out has more).
int64_t batch_offset(const mx::array& a, const mx::array& out, int64_t index) {
  int64_t offset = 0;
  const int extra = static_cast<int>(out.ndim()) - static_cast<int>(a.ndim());
  for (int axis = static_cast<int>(out.ndim()) - 3; axis >= 0; --axis) {
    const int64_t position = index % out.shape(axis);
    index /= out.shape(axis);
    if (axis >= extra && a.shape(axis - extra) != 1) {
      offset += position * a.strides()[axis - extra];
    }
  }
  return offset;
}

// Batch element `index` of a, whose matrices are row-contiguous.
const char* matrix(const mx::array& a, const mx::array& out, int64_t index) {
  return a.data<char>() + batch_offset(a, out, index) * a.itemsize();
}

}  // namespace

void FpQuantizedMatmul::eval_cpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  if (out.size() != 0) {
    check_readable_in_place(inputs);
  }
  cpu::dispatch(
      stream(),
      inputs,
      out,
      [mode = mode_, group_size = group_size_, transpose = transpose_](
          const std::vector<mx::array>& inputs, mx::array& out) {
        const auto& x = input(inputs, Input::x);
        const auto& w = input(inputs, Input::w);
        const auto& scales = input(inputs, Input::scales);
        bool fold = folds_rows(inputs);
        int64_t K = x.shape(-1);
        int64_t N = out.shape(-1);
        int64_t leading = 1;
        for (int axis = 0; axis + 2 < static_cast<int>(out.ndim()); ++axis) {
          leading *= out.shape(axis);
        }
        int64_t M = fold ? leading * out.shape(-2) : out.shape(-2);
        int64_t batches = fold ? 1 : leading;
        float global_factor = 1.0f;
        if (has_global_scale(inputs)) {
          global_factor = *input(inputs, Input::global_scale).data<float>() /
                          kNvfp4GlobalScaleDivisor;
        }
        cpu::QmmArgs args{
            &format_for(mode),
            group_size,
            transpose,
            M,
            N,
            K,
            x.dtype(),
            nullptr,
            nullptr,
            nullptr,
            scale_encoding(mode, scales),
            global_factor,
            nullptr};
        char* out_data = out.data<char>();
        for (int64_t b = 0; b < batches; ++b) {
          args.x = fold ? x.data<char>() : matrix(x, out, b);
          args.w = reinterpret_cast<const uint32_t*>(matrix(w, out, b));
          args.scales = matrix(scales, out, b);
          args.out = out_data + b * M * N * out.itemsize();
          cpu::qmm(args);
        }
      });
}

void FpDequantize::eval_cpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  cpu::dispatch(
      stream(),
      inputs,
      out,
      [mode = mode_, group_size = group_size_](
          const std::vector<mx::array>& inputs, mx::array& out) {
        const auto& w = inputs[0];
        const auto& scales = inputs[1];
        const int64_t cols = out.shape(-1);
        const int64_t rows = static_cast<int64_t>(out.size()) / cols;
        std::vector<float> factors(FpDequantize::global_scales(inputs), 1.0f);
        if (inputs.size() > 2) {
          for (size_t i = 0; i < factors.size(); ++i) {
            factors[i] = inputs[2].data<float>()[i] / kNvfp4GlobalScaleDivisor;
          }
        }
        cpu::dequantize(
            cpu::DequantizeArgs{
                &format_for(mode),
                group_size,
                rows,
                cols,
                w.data<uint32_t>(),
                scales.data<void>(),
                static_cast<int>(scales.itemsize()),
                scale_encoding(mode, scales),
                factors.data(),
                static_cast<int64_t>(factors.size()),
                out.dtype(),
                out.data<void>()});
      });
}

}  // namespace mlx_fpqmm
