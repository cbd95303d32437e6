#include "cpu/qmm.h"

#include <algorithm>
#include <array>
#include <span>
#include <vector>

#include "mlx/types/half_types.h"

#include "cpu/thread_pool.h"

namespace mlx_fpqmm::cpu {

namespace {

template <typename T>
void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

template <typename T>
void from_float(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<T>(src[i]);
  }
}

template <typename F>
void dispatch_float(mx::Dtype dtype, F&& f) {
  switch (dtype) {
    case mx::float16:
      f(mx::float16_t{});
      break;
    case mx::bfloat16:
      f(mx::bfloat16_t{});
      break;
    default:
      f(float{});
  }
}

void convert_to_float(mx::Dtype dtype, const void* src, float* dst, int64_t n) {
  dispatch_float(dtype, [&](auto tag) {
    to_float(static_cast<const decltype(tag)*>(src), dst, n);
  });
}

void convert_from_float(
    mx::Dtype dtype, const float* src, void* dst, int64_t n) {
  dispatch_float(dtype, [&](auto tag) {
    from_float(src, static_cast<decltype(tag)*>(dst), n);
  });
}

// Decodes packed rows group by group into scaled float values.
class RowDecoder {
 public:
  explicit RowDecoder(const QmmArgs& args)
      : args_(args), values_(code_values(args.format->codes)) {}

  // The scaled values of groups [first_group, first_group + groups).
  void decode(
      const uint32_t* row,
      const void* row_scales,
      int64_t first_group,
      int64_t groups,
      float* dst) const {
    int64_t group_size = args_.group_size;
    const auto* bytes = reinterpret_cast<const uint8_t*>(row);
    std::vector<float> group_scales(groups);
    scales(row_scales, first_group, groups, group_scales.data());
    if (args_.format->bits == 4) {
      // The 16 scaled values of the group, then one lookup per nibble.
      std::array<float, 16> scaled;
      for (int64_t g = 0; g < groups; ++g) {
        float s = group_scales[g];
        for (int code = 0; code < 16; ++code) {
          scaled[code] = values_[code] * s;
        }
        const uint8_t* group_bytes = bytes + (first_group + g) * group_size / 2;
        float* out = dst + g * group_size;
        for (int64_t i = 0; i < group_size / 2; ++i) {
          out[2 * i] = scaled[group_bytes[i] & 0xF];
          out[2 * i + 1] = scaled[group_bytes[i] >> 4];
        }
      }
      return;
    }
    for (int64_t g = 0; g < groups; ++g) {
      float s = group_scales[g];
      const uint8_t* group_bytes = bytes + (first_group + g) * group_size;
      float* out = dst + g * group_size;
      for (int64_t i = 0; i < group_size; ++i) {
        out[i] = values_[group_bytes[i]] * s;
      }
    }
  }

  // sum_i x[i] * code_i over one group, unscaled, without storing the codes.
  float group_dot(const float* x, const uint32_t* row, int64_t group) const {
    int64_t group_size = args_.group_size;
    const auto* bytes = reinterpret_cast<const uint8_t*>(row);
    // Four named partial sums stay in registers and hide the add latency.
    const float* values = values_.data();
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    if (args_.format->bits == 4) {
      const uint8_t* group_bytes = bytes + group * group_size / 2;
      for (int64_t i = 0; i < group_size / 2; i += 2) {
        s0 += x[2 * i] * values[group_bytes[i] & 0xF];
        s1 += x[2 * i + 1] * values[group_bytes[i] >> 4];
        s2 += x[2 * i + 2] * values[group_bytes[i + 1] & 0xF];
        s3 += x[2 * i + 3] * values[group_bytes[i + 1] >> 4];
      }
    } else {
      const uint8_t* group_bytes = bytes + group * group_size;
      for (int64_t i = 0; i < group_size; i += 4) {
        s0 += x[i] * values[group_bytes[i]];
        s1 += x[i + 1] * values[group_bytes[i + 1]];
        s2 += x[i + 2] * values[group_bytes[i + 2]];
        s3 += x[i + 3] * values[group_bytes[i + 3]];
      }
    }
    return (s0 + s1) + (s2 + s3);
  }

  // The float scales of groups [first_group, first_group + groups).
  void scales(
      const void* row_scales,
      int64_t first_group,
      int64_t groups,
      float* dst) const {
    if (args_.format->scales == ScaleKind::floating) {
      convert_to_float(
          args_.scales_dtype,
          static_cast<const char*>(row_scales) +
              first_group * mx::size_of(args_.scales_dtype),
          dst,
          groups);
    } else {
      const auto* bytes = static_cast<const uint8_t*>(row_scales) + first_group;
      for (int64_t g = 0; g < groups; ++g) {
        dst[g] = decode_scale_byte(args_.format->scales, bytes[g]);
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      dst[g] *= args_.global_factor;
    }
  }

 private:
  const QmmArgs& args_;
  std::span<const float> values_;
};

float dot(const float* a, const float* b, int64_t n) {
  // Independent partial sums hide the add latency; `omp simd` (with
  // -fopenmp-simd) lets the compiler keep them in vector registers.
  constexpr int kLanes = 16;
  float partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      partial[l] += a[i + l] * b[i + l];
    }
  }
  float sum = 0.0f;
  for (; i < n; ++i) {
    sum += a[i] * b[i];
  }
  for (float p : partial) {
    sum += p;
  }
  return sum;
}

int64_t words_per_row(const QmmArgs& args, int64_t elements) {
  return elements / args.format->elements_per_word();
}

const void* scales_row(const QmmArgs& args, int64_t row, int64_t groups) {
  return static_cast<const char*>(args.scales) +
         row * groups * mx::size_of(args.scales_dtype);
}

// out = x @ W^T. Few rows of x: each group of a W row is decoded into a small
// buffer and dotted with every x row. Many rows: each task dequantizes a block
// of W rows once and reuses it for every x row.
void qmm_transposed(const QmmArgs& args, const std::vector<float>& x) {
  constexpr int64_t kRowsPerBlock = 16;
  constexpr int64_t kMaxFusedRows = 8;
  int64_t K = args.K;
  int64_t words = words_per_row(args, K);
  int64_t groups = K / args.group_size;
  int64_t group_size = args.group_size;
  RowDecoder decoder(args);
  auto store = [&](int64_t m, int64_t n0, const float* values, int64_t count) {
    convert_from_float(
        args.dtype,
        values,
        static_cast<char*>(args.out) +
            (m * args.N + n0) * mx::size_of(args.dtype),
        count);
  };
  if (args.M <= kMaxFusedRows) {
    parallel_for(args.N, kRowsPerBlock, [&](int64_t n0, int64_t n1) {
      std::vector<float> out(args.M * (n1 - n0));
      std::vector<float> row_scales(groups);
      for (int64_t n = n0; n < n1; ++n) {
        const uint32_t* row = args.w + n * words;
        decoder.scales(
            scales_row(args, n, groups), 0, groups, row_scales.data());
        for (int64_t g = 0; g < groups; ++g) {
          float s = row_scales[g];
          for (int64_t m = 0; m < args.M; ++m) {
            out[m * (n1 - n0) + n - n0] +=
                s * decoder.group_dot(&x[m * K + g * group_size], row, g);
          }
        }
      }
      for (int64_t m = 0; m < args.M; ++m) {
        store(m, n0, &out[m * (n1 - n0)], n1 - n0);
      }
    });
    return;
  }
  parallel_for(args.N, kRowsPerBlock, [&](int64_t n0, int64_t n1) {
    std::vector<float> w_block((n1 - n0) * K);
    for (int64_t n = n0; n < n1; ++n) {
      decoder.decode(
          args.w + n * words,
          scales_row(args, n, groups),
          0,
          groups,
          &w_block[(n - n0) * K]);
    }
    std::vector<float> out_row(n1 - n0);
    for (int64_t m = 0; m < args.M; ++m) {
      for (int64_t n = n0; n < n1; ++n) {
        out_row[n - n0] = dot(&x[m * K], &w_block[(n - n0) * K], K);
      }
      store(m, n0, out_row.data(), n1 - n0);
    }
  });
}

// out = x @ W with W (K, N) grouped along N: each task owns a block of output
// columns, dequantizes that column block of every W row and accumulates.
void qmm_normal(const QmmArgs& args, const std::vector<float>& x) {
  constexpr int64_t kColumnsPerBlock = 128;  // a multiple of every group size
  constexpr int64_t kRowsPerChunk = 256;     // bounds the accumulator size
  int64_t N = args.N;
  int64_t words = words_per_row(args, N);
  int64_t groups = N / args.group_size;
  RowDecoder decoder(args);
  parallel_for(N, kColumnsPerBlock, [&](int64_t n0, int64_t n1) {
    int64_t width = n1 - n0;
    std::vector<float> w_row(width);
    for (int64_t m0 = 0; m0 < args.M; m0 += kRowsPerChunk) {
      int64_t m1 = std::min(args.M, m0 + kRowsPerChunk);
      std::vector<float> acc((m1 - m0) * width, 0.0f);
      for (int64_t k = 0; k < args.K; ++k) {
        decoder.decode(
            args.w + k * words,
            scales_row(args, k, groups),
            n0 / args.group_size,
            width / args.group_size,
            w_row.data());
        for (int64_t m = m0; m < m1; ++m) {
          float xk = x[m * args.K + k];
          float* acc_row = &acc[(m - m0) * width];
          for (int64_t j = 0; j < width; ++j) {
            acc_row[j] += xk * w_row[j];
          }
        }
      }
      for (int64_t m = m0; m < m1; ++m) {
        convert_from_float(
            args.dtype,
            &acc[(m - m0) * width],
            static_cast<char*>(args.out) +
                (m * N + n0) * mx::size_of(args.dtype),
            width);
      }
    }
  });
}

}  // namespace

void qmm(const QmmArgs& args) {
  if (args.M == 0 || args.N == 0) {
    return;
  }
  std::vector<float> x(args.M * args.K);
  convert_to_float(args.dtype, args.x, x.data(), x.size());
  if (args.transpose) {
    qmm_transposed(args, x);
  } else {
    qmm_normal(args, x);
  }
}

}  // namespace mlx_fpqmm::cpu
