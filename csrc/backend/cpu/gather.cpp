// FpGatherQuantizedMatmul on the CPU: the pairs are grouped by expert, so
// each expert's weights are read once per call. The rows of x routed to an
// expert form one panel, multiplied through FpQuantizedMatmul's kernels
// (cpu::qmm, parallel over output columns), and the results go back to their
// pairs. Runs of pairs that are already adjacent (sorted indices) are read and
// written in place.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "mlx/types/half_types.h"

#include "backend/cpu/dispatch.h"
#include "backend/cpu/qmm.h"
#include "primitives/primitives.h"

namespace mlx_fpqmm {

namespace {

void fill_nan(char* data, int64_t count, mx::Dtype dtype) {
  auto fill = [&](auto nan) {
    auto* values = reinterpret_cast<decltype(nan)*>(data);
    std::fill(values, values + count, nan);
  };
  switch (dtype) {
    case mx::float16:
      fill(static_cast<mx::float16_t>(std::numeric_limits<float>::quiet_NaN()));
      break;
    case mx::bfloat16:
      fill(
          static_cast<mx::bfloat16_t>(std::numeric_limits<float>::quiet_NaN()));
      break;
    default:
      fill(std::numeric_limits<float>::quiet_NaN());
  }
}

// True when `value(order[i])` counts up by one from `value(order[0])`.
template <typename Value>
bool consecutive(const Value& value, const int64_t* order, int64_t count) {
  for (int64_t i = 1; i < count; ++i) {
    if (value(order[i]) != value(order[0]) + i) {
      return false;
    }
  }
  return true;
}

}  // namespace

void FpGatherQuantizedMatmul::eval_cpu(
    const std::vector<mx::array>& inputs, mx::array& out) {
  cpu::dispatch(
      stream(),
      inputs,
      out,
      [mode = mode_,
       group_size = group_size_,
       transpose = transpose_,
       divisor = lhs_divisor(inputs)](
          const std::vector<mx::array>& inputs, mx::array& out) {
        const auto& x = input(inputs, GatherInput::x);
        const auto& w = input(inputs, GatherInput::w);
        const auto& scales = input(inputs, GatherInput::scales);
        const auto& rhs_indices = input(inputs, GatherInput::rhs_indices);
        const uint32_t* lhs_data =
            input(inputs, GatherInput::lhs_indices).data<uint32_t>();
        const uint32_t* rhs = rhs_indices.data<uint32_t>();
        auto lhs = [&](int64_t pair) -> int64_t {
          return divisor ? pair / divisor : lhs_data[pair];
        };
        const float* expert_scales =
            has_expert_scales(inputs)
                ? input(inputs, GatherInput::global_scale).data<float>()
                : nullptr;
        const int64_t pairs = rhs_indices.size();
        const int64_t M = out.shape(-2);
        const int64_t N = out.shape(-1);
        const int64_t K = x.shape(-1);
        const int64_t x_size = M * K * x.itemsize();
        const int64_t out_size = M * N * out.itemsize();
        const int64_t w_size =
            w.shape(-2) * int64_t(w.shape(-1)) * w.itemsize();
        const int64_t scales_size =
            scales.shape(-2) * int64_t(scales.shape(-1)) * scales.itemsize();
        const int64_t x_matrices = matrix_count(x);
        const int64_t experts = matrix_count(w);
        const char* x_data = x.data<char>();
        char* out_data = out.data<char>();

        // Pairs by expert (a stable counting sort); pairs with an index out of
        // range get NaN rows.
        std::vector<int64_t> starts(experts + 1, 0);
        for (int64_t b = 0; b < pairs; ++b) {
          if (lhs(b) < x_matrices && rhs[b] < experts) {
            ++starts[rhs[b] + 1];
          } else {
            fill_nan(out_data + b * out_size, M * N, out.dtype());
          }
        }
        for (int64_t e = 0; e < experts; ++e) {
          starts[e + 1] += starts[e];
        }
        std::vector<int64_t> order(starts.back());
        std::vector<int64_t> next(starts.begin(), starts.end() - 1);
        for (int64_t b = 0; b < pairs; ++b) {
          if (lhs(b) < x_matrices && rhs[b] < experts) {
            order[next[rhs[b]]++] = b;
          }
        }

        const ScaleEncoding encoding = scale_encoding(mode, scales);
        std::vector<char> x_panel;
        std::vector<char> out_panel;
        for (int64_t e = 0; e < experts; ++e) {
          const int64_t* run = order.data() + starts[e];
          const int64_t count = starts[e + 1] - starts[e];
          if (count == 0) {
            continue;
          }
          // In place when the run's x matrices and outputs are adjacent.
          const bool x_in_place = consecutive(lhs, run, count);
          const bool out_in_place =
              run[count - 1] - run[0] == count - 1;  // run is increasing
          const char* panel = x_data + lhs(run[0]) * x_size;
          if (!x_in_place) {
            x_panel.resize(count * x_size);
            for (int64_t i = 0; i < count; ++i) {
              std::memcpy(
                  x_panel.data() + i * x_size,
                  x_data + lhs(run[i]) * x_size,
                  x_size);
            }
            panel = x_panel.data();
          }
          char* result = out_data + run[0] * out_size;
          if (!out_in_place) {
            out_panel.resize(count * out_size);
            result = out_panel.data();
          }
          float global_factor =
              expert_scales ? expert_scales[e] / kNvfp4GlobalScaleDivisor
                            : 1.0f;
          cpu::qmm(
              {&format_for(mode),
               group_size,
               transpose,
               count * M,
               N,
               K,
               x.dtype(),
               panel,
               reinterpret_cast<const uint32_t*>(w.data<char>() + e * w_size),
               scales.data<char>() + e * scales_size,
               encoding,
               global_factor,
               result});
          if (!out_in_place) {
            for (int64_t i = 0; i < count; ++i) {
              std::memcpy(
                  out_data + run[i] * out_size,
                  out_panel.data() + i * out_size,
                  out_size);
            }
          }
        }
      });
}

}  // namespace mlx_fpqmm
