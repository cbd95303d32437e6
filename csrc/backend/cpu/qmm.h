// CPU kernels for one (M, K) x quantized (N, K) matrix product, and for W
// dequantized.
#pragma once

#include <cstdint>

#include "mlx/dtype.h"

#include "common/formats.h"

namespace mlx_fpqmm::cpu {

namespace mx = mlx::core;

struct QmmArgs {
  const Format* format;
  int group_size;
  // true: out = x @ W^T with W stored (N, K) and grouped along K.
  // false: out = x @ W with W stored (K, N) and grouped along N.
  bool transpose;
  int64_t M, N, K;
  mx::Dtype dtype;     // of x and out
  const void* x;       // M x K, row-major
  const uint32_t* w;   // rows of packed codes, row-major
  const void* scales;  // one per group, row-major
  ScaleEncoding scale_encoding;
  float global_factor;  // multiplies every scale (nvfp4 global scale)
  void* out;            // M x N, row-major
};

void qmm(const QmmArgs& args);

// Every matrix of W, folded into `rows` rows of `cols` codes (row-major, as
// are the scales), dequantized into `out` (rows x cols of `dtype`): the rows
// of matrix i (rows / matrices of them) scaled by global_factors[i], or by
// global_factors[0] for all when there is one factor.
struct DequantizeArgs {
  const Format* format;
  int group_size;
  int64_t rows, cols;
  const uint32_t* w;
  const void* scales;
  int scale_itemsize;
  ScaleEncoding scale_encoding;
  const float* global_factors;
  int64_t factor_count;  // 1 or the number of matrices
  mx::Dtype dtype;
  void* out;
};

void dequantize(const DequantizeArgs& args);

}  // namespace mlx_fpqmm::cpu
