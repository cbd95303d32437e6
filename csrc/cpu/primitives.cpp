// FpQuantizedMatmul on the CPU: lays the inputs out as the kernels expect and
// runs one kernel call per batch element.
#include <cstring>
#include <memory>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"

#include "cpu/qmm.h"
#include "primitives.h"

namespace mlx_fpqmm {

namespace {

// Element offset of batch element `index` of a (..., rows, cols) array.
int64_t batch_offset(const mx::array& a, int64_t index) {
  int64_t offset = 0;
  for (int axis = static_cast<int>(a.ndim()) - 3; axis >= 0; --axis) {
    offset += (index % a.shape(axis)) * a.strides()[axis];
    index /= a.shape(axis);
  }
  return offset;
}

bool matrices_row_contiguous(const mx::array& a) {
  int rows = a.shape(-2);
  int cols = a.shape(-1);
  return (cols <= 1 || a.strides()[a.ndim() - 1] == 1) &&
         (rows <= 1 || a.strides()[a.ndim() - 2] == cols);
}

// A row-contiguous copy of a strided array, made inside the dispatched task.
std::shared_ptr<std::vector<char>> row_contiguous_copy(const mx::array& a) {
  size_t item = a.itemsize();
  auto copy = std::make_shared<std::vector<char>>(a.size() * item);
  const char* src = a.data<char>();
  std::vector<int> index(a.ndim(), 0);
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < a.ndim(); ++axis) {
      offset += index[axis] * a.strides()[axis];
    }
    std::memcpy(copy->data() + i * item, src + offset * item, item);
    for (int axis = static_cast<int>(a.ndim()) - 1; axis >= 0; --axis) {
      if (++index[axis] < a.shape(axis)) {
        break;
      }
      index[axis] = 0;
    }
  }
  return copy;
}

// Where a kernel reads one input from: the array's own buffer when its
// matrices are row-contiguous (batch strides may be anything, broadcasts
// included), otherwise a row-contiguous copy.
struct MatrixSource {
  explicit MatrixSource(const mx::array& a, bool fold_rows)
      : array(a),
        contiguous(
            fold_rows ? a.flags().row_contiguous : matrices_row_contiguous(a)) {
    if (!contiguous) {
      copy = row_contiguous_copy(a);
    }
  }

  const char* matrix(int64_t batch_index) const {
    int64_t matrix_size = array.shape(-1) * int64_t(array.shape(-2));
    int64_t offset = contiguous ? batch_offset(array, batch_index)
                                : batch_index * matrix_size;
    const char* base = contiguous ? array.data<char>() : copy->data();
    return base + offset * array.itemsize();
  }

  mx::array array;
  bool contiguous;
  std::shared_ptr<std::vector<char>> copy;
};

}  // namespace

void FpQuantizedMatmul::eval_cpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& input : inputs) {
    encoder.set_input_array(input);
  }
  encoder.set_output_array(out);

  encoder.dispatch([inputs,
                    out = mx::array::unsafe_weak_copy(out),
                    mode = mode_,
                    group_size = group_size_,
                    transpose = transpose_]() mutable {
    if (out.size() == 0) {
      return;
    }
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    // With unbatched weights all leading dimensions of x fold into M.
    bool fold = w.ndim() == 2;
    int64_t K = x.shape(-1);
    int64_t N = out.shape(-1);
    int64_t leading = 1;
    for (int axis = 0; axis + 2 < static_cast<int>(out.ndim()); ++axis) {
      leading *= out.shape(axis);
    }
    int64_t M = fold ? leading * out.shape(-2) : out.shape(-2);
    int64_t batches = fold ? 1 : leading;
    MatrixSource x_source(x, fold);
    MatrixSource w_source(w, false);
    MatrixSource scales_source(scales, false);
    float global_factor = 1.0f;
    if (inputs.size() > 3) {
      global_factor = *inputs[3].data<float>() / kNvfp4GlobalScaleDivisor;
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
        scales.dtype(),
        global_factor,
        nullptr};
    char* out_data = out.data<char>();
    for (int64_t b = 0; b < batches; ++b) {
      args.x = x_source.matrix(b);
      args.w = reinterpret_cast<const uint32_t*>(w_source.matrix(b));
      args.scales = scales_source.matrix(b);
      args.out = out_data + b * M * N * out.itemsize();
      cpu::qmm(args);
    }
  });
}

}  // namespace mlx_fpqmm
