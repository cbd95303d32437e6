// Standalone test and benchmark of the CUDA kernels (no MLX library: only
// its headers, for the plan's QmmProblem). Every case runs through the plan
// and the kernel table as eval_gpu will, and is compared with a reference
// written here from the decode tables of common/formats.h.
//
//   harness [--test] [--bench] [--only SUBSTRING]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels/fp_decode.cuh"
#include "backend/cuda/table.h"
#include "backend/cuda/plan.h"

namespace {

using mlx_fpqmm::FloatType;
using mlx_fpqmm::Mode;
using mlx_fpqmm::QmmProblem;
using mlx_fpqmm::ScaleEncoding;
namespace cu = mlx_fpqmm::cuda;
namespace fc = fpqmm::cuda;

#define CHECK_CUDA(call)                                                   \
  do {                                                                     \
    cudaError_t error_ = (call);                                           \
    if (error_ != cudaSuccess) {                                           \
      std::fprintf(                                                        \
          stderr, "%s:%d %s\n", __FILE__, __LINE__,                        \
          cudaGetErrorString(error_));                                     \
      std::exit(2);                                                        \
    }                                                                      \
  } while (0)

// Host conversions, round to nearest even (subnormals, inf and NaN kept).
float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << 16);
}
uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return uint16_t((bits >> 16) | 0x40);
  }
  return uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const int exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(float(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(float(mantissa | 0x400), exponent - 25);
  }
  return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
}
uint16_t float_to_half(float value) {
  return std::bit_cast<uint16_t>(__half(value));
}

int x_itemsize(FloatType type) {
  return type == FloatType::float32 ? 4 : 2;
}

float load_float(const std::vector<uint8_t>& bytes, FloatType type, int64_t i) {
  if (type == FloatType::float32) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
  uint16_t v;
  std::memcpy(&v, bytes.data() + 2 * i, 2);
  return type == FloatType::float16 ? half_to_float(v) : bf16_to_float(v);
}

void store_float(std::vector<uint8_t>& bytes, FloatType type, int64_t i, float v) {
  if (type == FloatType::float32) {
    std::memcpy(bytes.data() + 4 * i, &v, 4);
    return;
  }
  uint16_t h = type == FloatType::float16 ? float_to_half(v) : float_to_bf16(v);
  std::memcpy(bytes.data() + 2 * i, &h, 2);
}

float scale_value(const std::vector<uint8_t>& scales, ScaleEncoding e, int64_t i) {
  switch (e) {
    case ScaleEncoding::e8m0:
      return mlx_fpqmm::decode_e8m0(scales[i]);
    case ScaleEncoding::e4m3:
      return mlx_fpqmm::kE4M3Values[scales[i]];
    case ScaleEncoding::float32:
      return load_float(scales, FloatType::float32, i);
    case ScaleEncoding::float16:
      return load_float(scales, FloatType::float16, i);
    case ScaleEncoding::bfloat16:
      return load_float(scales, FloatType::bfloat16, i);
  }
  return 0;
}

struct Case {
  std::string name;
  Mode mode;
  int group_size;
  FloatType x_type;
  std::optional<FloatType> scale_type;
  bool transpose;
  int M, N, K;
  std::vector<int> batch_shape;  // x batch; w broadcast over axis 0 if set
  bool broadcast_w = false;
  // Gather: pairs, x matrices, w matrices, index style.
  int pairs = 0, x_matrices = 0, w_matrices = 0;
  enum class Indices { random, sorted, out_of_range } indices = Indices::random;
  bool global_scale = false;
  bool nonfinite = false;  // inf / NaN scales, NaN codes, zero x
  // x @ W^T with positive x, +inf in every other row of x (in the first
  // group), and, with float scales, a few later groups of +inf or 1e38
  // scales over positive codes: y is +inf there, or a sum of infinities.
  bool infinities = false;
  // E8M0 scales at the float16 windows' edges (HalfWindow) and float16
  // subnormals among x.
  bool window_edges = false;
  std::optional<cu::KernelRequest> request;
  bool as_sm80 = false;  // planned as for sm_80 (split K through partials)
  int as_sms = 0;        // planned as for a GPU of this many SMs (0: this one's)
  // The main launch's grid y cut to the plan's splits of K, so that each
  // block loops over the row blocks of x (as grids past 65,535 blocks do).
  bool looped_grid = false;
};

struct HostProblem {
  QmmProblem problem;
  std::vector<uint8_t> w, scales, x;
  std::vector<float> global_scale;
  std::vector<uint32_t> lhs, rhs;
  int64_t w_matrices, x_matrices;  // stored
};

// Code value of element `col` of row `row` of a packed matrix.
float code_value(const uint8_t* w, int bits, int64_t row_bytes, int64_t row, int64_t col) {
  const uint8_t* r = w + row * row_bytes;
  if (bits == 4) {
    return mlx_fpqmm::kE2M1Values[(r[col / 2] >> (col % 2 * 4)) & 0xF];
  }
  return mlx_fpqmm::kE4M3Values[r[col]];
}

// An E8M0 byte at an edge of the float16 window of `bits`-wide codes: its
// lowest or highest scale, or one step past either.
uint8_t window_edge_byte(int bits, std::mt19937& rng) {
  const int lowest = bits == 4 ? fpqmm::cuda::HalfWindow<4>::lowest
                               : fpqmm::cuda::HalfWindow<8>::lowest;
  const int highest = bits == 4 ? fpqmm::cuda::HalfWindow<4>::highest
                                : fpqmm::cuda::HalfWindow<8>::highest;
  const int step = int(rng() % 4);
  return uint8_t(127 + (step < 2 ? lowest - 1 + step : highest + step - 2));
}

HostProblem make_problem(const Case& c, std::mt19937& rng) {
  const auto& format = mlx_fpqmm::format_for(c.mode);
  HostProblem h;
  QmmProblem& p = h.problem;
  p.mode = c.mode;
  p.group_size = c.group_size;
  p.transpose = c.transpose;
  p.M = c.M;
  p.N = c.N;
  p.K = c.K;
  p.x_type = c.x_type;
  p.scale_type = c.scale_type;
  p.has_global_scale = c.global_scale;
  const int64_t rows = c.transpose ? c.N : c.K;
  const int64_t cols = c.transpose ? c.K : c.N;
  const int64_t w_bytes = rows * cols * format.bits / 8;
  const int64_t groups = rows * (cols / c.group_size);
  const auto encoding = mlx_fpqmm::scale_encoding(c.mode, c.scale_type);
  const int scale_bytes = mlx_fpqmm::scale_itemsize(encoding);
  int64_t x_count = 1;
  int64_t w_count = 1;
  if (c.pairs > 0) {
    p.gather = true;
    p.batch_shape = {c.pairs};
    p.x_matrices = c.x_matrices;
    p.w_matrices = c.w_matrices;
    x_count = c.x_matrices;
    w_count = c.w_matrices;
    std::uniform_int_distribution<int> expert(0, c.w_matrices - 1);
    std::uniform_int_distribution<int> xm(0, c.x_matrices - 1);
    for (int i = 0; i < c.pairs; ++i) {
      h.lhs.push_back(xm(rng));
      h.rhs.push_back(expert(rng));
    }
    if (c.indices == Case::Indices::sorted) {
      std::sort(h.rhs.begin(), h.rhs.end());
    }
    if (c.indices == Case::Indices::out_of_range) {
      h.rhs[0] = c.w_matrices;
      h.lhs[c.pairs / 2] = c.x_matrices + 7;
      h.rhs[c.pairs - 1] = 0xFFFFFFFFu;
    }
  } else if (!c.batch_shape.empty()) {
    p.batch_shape = c.batch_shape;
    int64_t batch = 1;
    for (int s : c.batch_shape) batch *= s;
    x_count = batch;
    w_count = c.broadcast_w ? batch / c.batch_shape[0] : batch;
    // Row-contiguous x; w broadcast over axis 0 (stride 0) when asked.
    const int nd = static_cast<int>(c.batch_shape.size());
    p.x_batch_strides.assign(nd, 0);
    p.w_batch_strides.assign(nd, 0);
    p.scales_batch_strides.assign(nd, 0);
    int64_t xs = int64_t(c.M) * c.K, ws = w_bytes / 4, ss = groups;
    for (int a = nd - 1; a >= 0; --a) {
      p.x_batch_strides[a] = xs;
      xs *= c.batch_shape[a];
      const bool broadcast = c.broadcast_w && a == 0;
      p.w_batch_strides[a] = broadcast ? 0 : ws;
      p.scales_batch_strides[a] = broadcast ? 0 : ss;
      if (!broadcast) {
        ws *= c.batch_shape[a];
        ss *= c.batch_shape[a];
      }
    }
  }
  h.w_matrices = w_count;
  h.x_matrices = x_count;
  h.w.resize(w_count * w_bytes);
  for (auto& b : h.w) {
    b = uint8_t(rng());
    // NaN codes only where the case asks for them (a NaN row hides the rest).
    if (format.bits == 8 && (b & 0x7F) == 0x7F && !c.nonfinite) {
      b ^= 1;
    }
  }
  h.scales.resize(w_count * groups * scale_bytes);
  // E8M0 scales from 2^-9 to 2^1, and one group in 500 up to 2^9: passes
  // of float16 x in float16 and in bfloat16, of bfloat16 x in one step and
  // in two.
  std::uniform_int_distribution<int> e8m0(118, 128);
  std::uniform_int_distribution<int> large_e8m0(129, 136);
  std::uniform_int_distribution<int> e4m3(0x20, 0x5F);
  std::uniform_real_distribution<float> uniform(0.25f, 2.0f);
  for (int64_t i = 0; i < w_count * groups; ++i) {
    switch (encoding) {
      case ScaleEncoding::e8m0:
        h.scales[i] = c.window_edges ? window_edge_byte(format.bits, rng)
            : rng() % 500            ? uint8_t(e8m0(rng))
                                     : uint8_t(large_e8m0(rng));
        break;
      case ScaleEncoding::e4m3:
        h.scales[i] = uint8_t(e4m3(rng));
        break;
      default:
        store_float(h.scales, *c.scale_type, i,
                    uniform(rng) * (rng() % 2 ? 1.0f : -1.0f));
    }
  }
  h.x.resize(x_count * int64_t(c.M) * c.K * x_itemsize(c.x_type));
  std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
  for (int64_t i = 0; i < x_count * int64_t(c.M) * c.K; ++i) {
    const bool subnormal = c.window_edges && i % 5 == 0;
    store_float(h.x, c.x_type, i, subnormal ? std::ldexp(xd(rng), -15) : xd(rng));
  }
  if (c.global_scale) {
    for (int64_t i = 0; i < (c.pairs > 0 ? w_count : 1); ++i) {
      h.global_scale.push_back(500.0f + 100.0f * float(i));
    }
  }
  if (c.nonfinite) {
    // A few groups with inf / NaN scales (byte 255 is E8M0's inf, 0x7F
    // E4M3's NaN), zero x elements, and one NaN-code row (fp8).
    for (int64_t i = 3; i < w_count * groups; i += 97) {
      if (encoding == ScaleEncoding::e8m0) {
        h.scales[i] = 255;
      } else if (encoding == ScaleEncoding::e4m3) {
        h.scales[i] = 0x7F;
      } else {
        store_float(h.scales, *c.scale_type, i, i % 2 ? INFINITY : -INFINITY);
      }
    }
    for (int64_t i = 5; i < x_count * int64_t(c.M) * c.K; i += 13) {
      store_float(h.x, c.x_type, i, 0.0f);
    }
  }
  if (c.infinities) {
    std::uniform_real_distribution<float> positive(0.25f, 1.0f);
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t k = 0; k < c.K; ++k) {
        const bool infinite = m % 2 == 1 && k == m / 2 % c.group_size;
        store_float(h.x, c.x_type, m * c.K + k, infinite ? INFINITY : positive(rng));
      }
    }
    const int64_t groups_per_row = cols / c.group_size;
    const bool float_scales =
        mlx_fpqmm::format_for(c.mode).scales == mlx_fpqmm::ScaleKind::floating;
    for (int64_t i = 0; float_scales && i < groups; ++i) {
      if (i % groups_per_row == 0 || i % 37 != 5) {
        continue;
      }
      const bool huge = i % 2 == 0 && c.scale_type != FloatType::float16;
      store_float(h.scales, *c.scale_type, i, huge ? 1e38f : INFINITY);
      // The group's codes positive and nonzero (never E4M3's NaN 0x7F).
      const int64_t first = i / groups_per_row * cols + i % groups_per_row * c.group_size;
      for (int64_t b = first * format.bits / 8; b < (first + c.group_size) * format.bits / 8; ++b) {
        h.w[b] = format.bits == 4 ? (h.w[b] & 0x77) | 0x11 : (h.w[b] & 0x76) | 0x08;
      }
    }
  }
  return h;
}

// y (float) of every batch element or pair, element by element: code times
// scale in float, times x, summed in double. NaN rows for bad gather pairs.
std::vector<float> reference(const Case& c, const HostProblem& h,
                             std::vector<double>& magnitude) {
  const auto& format = mlx_fpqmm::format_for(c.mode);
  const auto encoding = mlx_fpqmm::scale_encoding(c.mode, c.scale_type);
  const int64_t rows = c.transpose ? c.N : c.K;
  const int64_t cols = c.transpose ? c.K : c.N;
  const int64_t row_bytes = cols * format.bits / 8;
  const int64_t groups_per_row = cols / c.group_size;
  const int64_t w_bytes = rows * row_bytes;
  int64_t batch = 1;
  for (int s : h.problem.batch_shape) batch *= s;
  std::vector<float> y(batch * c.M * c.N);
  magnitude.assign(y.size(), 0.0);
  std::vector<float> weights(rows * cols);
  int64_t cached = -1;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t wm = 0, xm = 0;
    bool valid = true;
    if (h.problem.gather) {
      valid = h.lhs[b] < uint32_t(c.x_matrices) && h.rhs[b] < uint32_t(c.w_matrices);
      wm = valid ? h.rhs[b] : 0;
      xm = valid ? h.lhs[b] : 0;
    } else if (!h.problem.batch_shape.empty()) {
      int64_t rest = b;
      for (int a = int(h.problem.batch_shape.size()) - 1; a >= 0; --a) {
        const int64_t i = rest % h.problem.batch_shape[a];
        rest /= h.problem.batch_shape[a];
        xm += i * h.problem.x_batch_strides[a] / (int64_t(c.M) * c.K);
        wm += i * h.problem.w_batch_strides[a] / (w_bytes / 4);
      }
    }
    if (!valid) {
      std::fill(y.begin() + b * c.M * c.N, y.begin() + (b + 1) * c.M * c.N, NAN);
      continue;
    }
    if (wm != cached) {
      const float factor = c.global_scale
          ? h.global_scale[h.problem.gather ? wm : 0] / fpqmm::kNvfp4GlobalScaleDivisor
          : 1.0f;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < cols; ++k) {
          const float s =
              scale_value(h.scales, encoding, wm * rows * groups_per_row +
                              r * groups_per_row + k / c.group_size) * factor;
          weights[r * cols + k] =
              code_value(h.w.data() + wm * w_bytes, format.bits, row_bytes, r, k) * s;
        }
      }
      cached = wm;
    }
    for (int m = 0; m < c.M; ++m) {
      for (int n = 0; n < c.N; ++n) {
        double sum = 0, mag = 0;
        for (int k = 0; k < c.K; ++k) {
          const float xv = load_float(h.x, c.x_type, (xm * c.M + m) * int64_t(c.K) + k);
          const float wv = c.transpose ? weights[int64_t(n) * cols + k]
                                       : weights[int64_t(k) * cols + n];
          const float term = wv * xv;
          sum += term;
          mag += std::fabs(double(term));
        }
        y[(b * c.M + m) * c.N + n] = float(sum);
        magnitude[(b * c.M + m) * c.N + n] = mag;
      }
    }
  }
  return y;
}

struct DeviceProblem {
  void* w = nullptr;
  void* scales = nullptr;
  void* x = nullptr;
  void* y = nullptr;
  float* global_scale = nullptr;
  uint32_t* lhs = nullptr;
  uint32_t* rhs = nullptr;
  float* partials = nullptr;
  uint32_t* scratch = nullptr;  // the grouped path's (plan.grouping_bytes)
  void* x_tiles = nullptr;      // the wgmma path's (plan.x_tiles_bytes)
  void* x_parts = nullptr;      // split x's (plan.x_split_bytes)
};

template <typename T>
T* upload(const std::vector<T>& host) {
  T* device = nullptr;
  if (host.empty()) {
    return nullptr;
  }
  CHECK_CUDA(cudaMalloc(&device, host.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return device;
}

void launch(const cu::Launch& l, const void* kernel, const fc::QmmArgs& args,
            cudaStream_t stream = 0) {
  if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0) {
    return;
  }
  cudaFuncAttributes attributes;
  CHECK_CUDA(cudaFuncGetAttributes(&attributes, kernel));
  if (l.shared_bytes > fc::default_dynamic_shared_limit(int(attributes.sharedSizeBytes))) {
    CHECK_CUDA(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, l.shared_bytes));
  }
  void* params[] = {const_cast<fc::QmmArgs*>(&args)};
  CHECK_CUDA(cudaLaunchKernel(
      kernel, dim3(l.grid[0], l.grid[1], l.grid[2]),
      dim3(l.block[0], l.block[1], l.block[2]), params, l.shared_bytes, stream));
}

cu::CudaDevice this_device() {
  int device = 0;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return {prop.major, prop.minor, prop.multiProcessorCount};
}

// Runs `plan` on the device operands.
void run_plan(const cu::KernelPlan& plan, const QmmProblem& problem,
              const DeviceProblem& d, cudaStream_t stream = 0) {
  fc::QmmArgs args = cu::kernel_args(problem, plan);
  args.w = static_cast<const uint32_t*>(d.w);
  args.scales = d.scales;
  args.global_scale = d.global_scale;
  args.x = d.x;
  args.y = d.y;
  args.partials = plan.reduction ? d.partials : nullptr;
  args.lhs_indices = d.lhs;
  args.rhs_indices = d.rhs;
  if (plan.grouping) {
    fc::place_grouping_scratch(args, d.scratch, plan.max_runs);
    launch(*plan.grouping, fc::group_pairs_kernel(), args, stream);
  }
  if (plan.x_split) {
    args.x_tiles = d.x_parts;
    launch(*plan.x_split, fc::split_x_kernel(), args, stream);
    args.x = d.x_parts;
  }
  if (plan.x_tiles) {
    args.x_tiles = d.x_tiles;
    launch(*plan.x_tiles, fc::wgmma_tile_x_kernel(plan.key.bits, plan.grouping.has_value()),
           args, stream);
  }
  launch(plan.main, fc::main_kernel(plan.key), args, stream);
  if (plan.reduction) {
    launch(*plan.reduction, fc::split_k_sum_kernel(problem.x_type), args, stream);
  }
}

// The device that `c` is planned for: this one, or as the case says.
cu::CudaDevice planned_device(const Case& c) {
  auto device = this_device();
  if (c.as_sm80) {
    device.major = 8;
    device.minor = 0;
  }
  if (c.as_sms) {
    device.sm_count = c.as_sms;
  }
  return device;
}

cu::KernelPlan plan_case(const Case& c, const QmmProblem& problem) {
  return cu::plan(
      problem, planned_device(c), c.request.value_or(cu::KernelRequest::automatic));
}

// The kernel family that `c` plans (its operands' values aside).
cu::KernelFamily planned_family(const Case& c) {
  std::mt19937 values(0);
  return plan_case(c, make_problem(c, values).problem).key.family;
}

bool run_case(const Case& c, std::mt19937& rng) {
  HostProblem h = make_problem(c, rng);
  cu::KernelPlan plan = plan_case(c, h.problem);
  if (c.looped_grid) {
    plan.main.grid[1] = plan.split_k;
  }
  DeviceProblem d;
  d.w = upload(h.w);
  d.scales = upload(h.scales);
  d.x = upload(h.x);
  d.global_scale = upload(h.global_scale);
  d.lhs = upload(h.lhs);
  d.rhs = upload(h.rhs);
  std::vector<double> magnitude;
  const std::vector<float> expected = reference(c, h, magnitude);
  const int64_t y_bytes = int64_t(expected.size()) * x_itemsize(c.x_type);
  CHECK_CUDA(cudaMalloc(&d.y, std::max<int64_t>(y_bytes, 1)));
  CHECK_CUDA(cudaMemset(d.y, 0x7F, std::max<int64_t>(y_bytes, 1)));
  if (plan.partials_bytes > 0) {
    CHECK_CUDA(cudaMalloc(&d.partials, plan.partials_bytes));
  }
  if (plan.grouping_bytes > 0) {
    CHECK_CUDA(cudaMalloc(&d.scratch, plan.grouping_bytes));
  }
  if (plan.x_tiles_bytes > 0) {
    CHECK_CUDA(cudaMalloc(&d.x_tiles, plan.x_tiles_bytes));
  }
  if (plan.x_split_bytes > 0) {
    CHECK_CUDA(cudaMalloc(&d.x_parts, plan.x_split_bytes));
  }
  run_plan(plan, h.problem, d);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> y(y_bytes);
  CHECK_CUDA(cudaMemcpy(y.data(), d.y, y_bytes, cudaMemcpyDeviceToHost));
  // Output rounding of y's type, plus the float32 sums (and float32 x's
  // bfloat16 split, 2^-17 per term) against the sum of |terms|.
  const double out_eps = c.x_type == FloatType::float32 ? 0x1p-23
      : c.x_type == FloatType::float16                  ? 0x1p-11
                                                         : 0x1p-8;
  // fp_qmv rounds code times a float scale to bfloat16 (but for float32 x,
  // whose W is in two parts).
  const bool rounded_w = (plan.key.family == cu::KernelFamily::qmv ||
                          plan.key.family == cu::KernelFamily::qmv_wide ||
                          plan.key.family == cu::KernelFamily::qmv_cluster ||
                          plan.key.family == cu::KernelFamily::qmv_grouped ||
                          plan.key.family == cu::KernelFamily::qmm ||
                          plan.key.family == cu::KernelFamily::qmm_grouped ||
                          plan.key.family == cu::KernelFamily::qmm_wgmma ||
                          plan.key.family == cu::KernelFamily::qmm_wgmma_grouped) &&
      mlx_fpqmm::format_for(c.mode).scales == mlx_fpqmm::ScaleKind::floating &&
      c.x_type != FloatType::float32;
  const double term_eps = rounded_w ? 0x1p-8
      : c.x_type == FloatType::float32 ? 0x1p-15
                                       : 0x1p-18;
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const float got = load_float(y, c.x_type, i);
    const float want = expected[i];
    bool ok;
    if (std::isnan(want) || std::isnan(got)) {
      ok = std::isnan(want) && std::isnan(got);
    } else if (std::isinf(want) || std::isinf(got)) {
      // float16 y overflows where the float32 sum does not.
      ok = got == want ||
           (c.x_type == FloatType::float16 && std::fabs(want) > 65504.0f);
    } else {
      const double error = std::fabs(double(got) - double(want));
      const double bound = out_eps * std::fabs(double(want)) +
          term_eps * magnitude[i] + 1e-30;
      worst = std::max(worst, error / bound);
      ok = error <= bound;
    }
    if (!ok && bad++ < 3) {
      std::printf("    [%zu] got %g want %g (|terms| %g)\n", i, got, want, magnitude[i]);
    }
  }
  std::printf("%s %-60s %-44s split=%d%s grid=(%d,%d,%d) worst=%.2f\n",
              bad ? "FAIL" : "ok  ", c.name.c_str(), plan.main.kernel.c_str(),
              plan.split_k, plan.splits_in_cluster ? " (cluster)" : "",
              plan.main.grid[0], plan.main.grid[1],
              plan.main.grid[2], worst);
  for (void* p : {d.w, d.scales, d.x, d.y, (void*)d.global_scale, (void*)d.lhs,
                  (void*)d.rhs, (void*)d.partials, (void*)d.scratch, d.x_tiles,
                  d.x_parts}) {
    cudaFree(p);
  }
  return bad == 0;
}

struct ModeSpec {
  Mode mode;
  int group_size;
  std::optional<FloatType> scale_type;
  const char* name;
};

const std::vector<ModeSpec> kModes = {
    {Mode::mxfp4, 32, std::nullopt, "mxfp4"},
    {Mode::nvfp4, 16, std::nullopt, "nvfp4"},
    {Mode::mxfp8, 32, std::nullopt, "mxfp8"},
    {Mode::fp4, 64, FloatType::bfloat16, "fp4/g64/bf16"},
    {Mode::fp8, 32, FloatType::float32, "fp8/g32/f32"},
};

const std::vector<std::pair<FloatType, const char*>> kTypes = {
    {FloatType::bfloat16, "bf16"},
    {FloatType::float16, "f16"},
    {FloatType::float32, "f32"},
};

std::vector<Case> test_cases() {
  std::vector<Case> cases;
  auto name = [](const ModeSpec& m, const char* t, bool tr, int M, int N, int K,
                 const std::string& extra) {
    return std::string(m.name) + " " + t + (tr ? " T" : " N") + " M" +
           std::to_string(M) + " " + std::to_string(N) + "x" +
           std::to_string(K) + extra;
  };
  // Every mode x dtype x orientation on odd shapes and M across the decode
  // range and above it (K = 1024 and 1536: whole 256-byte stages of every
  // code width, with odd M and N).
  const std::vector<std::array<int, 3>> shapes = {
      {1, 100, 256}, {3, 33, 160}, {8, 64, 4096}, {11, 300, 544}, {16, 40, 96}, {37, 72, 192},
      {1, 100, 1024}, {13, 40, 1536}};
  for (const auto& m : kModes) {
    for (const auto& [type, tname] : kTypes) {
      for (bool transpose : {true, false}) {
        for (auto [M, N, K] : shapes) {
          if (transpose) {
            K = (K + m.group_size - 1) / m.group_size * m.group_size;
          } else {
            // x @ W: N is the grouped axis.
            N = (N + 127) / 128 * 128 + (m.group_size <= 32 ? 32 : 0);
            K = K / 2 + 3;
          }
          Case c{name(m, tname, transpose, M, N, K, ""), m.mode, m.group_size,
                 type, m.scale_type, transpose, M, N, K};
          c.global_scale = m.mode == Mode::nvfp4;
          cases.push_back(c);
        }
      }
    }
  }
  // Every float-scale group size and scale type, K tails of one group.
  for (Mode mode : {Mode::fp4, Mode::fp8}) {
    for (int g : {16, 32, 64, 128}) {
      for (FloatType st : {FloatType::float32, FloatType::float16, FloatType::bfloat16}) {
        const ModeSpec m{mode, g, st, mode == Mode::fp4 ? "fp4" : "fp8"};
        const std::string extra = " g" + std::to_string(g) + " s" +
                                  std::string(mlx_fpqmm::type_name(st));
        Case c{name(m, "bf16", true, 5, 70, 3 * g + 128, extra), mode, g,
               FloatType::bfloat16, st, true, 5, 70, 3 * g + 128};
        cases.push_back(c);
        Case whole{name(m, "bf16", true, 5, 70, 1024, extra), mode, g,
                   FloatType::bfloat16, st, true, 5, 70, 1024};
        cases.push_back(whole);
        Case n{name(m, "bf16", false, 5, 2 * g + 256, 77, extra), mode, g,
               FloatType::bfloat16, st, false, 5, 2 * g + 256, 77};
        cases.push_back(n);
        // float32 x: W's two parts (fp_qmv), every scale type.
        for (Case f : {c, whole}) {
          f.name.replace(f.name.find(" bf16 "), 6, " f32 ");
          f.x_type = FloatType::float32;
          cases.push_back(f);
        }
      }
    }
  }
  // nvfp4 K = 16 mod 32 (8-byte rows: the 8-byte copies), and split K.
  for (bool transpose : {true, false}) {
    Case c{name(kModes[1], "bf16", transpose, 2, 48, 48, " narrow"), Mode::nvfp4,
           16, FloatType::bfloat16, std::nullopt, transpose, 2, 48, 48};
    cases.push_back(c);
  }
  for (const auto& m : kModes) {
    Case c{name(m, "bf16", true, 4, 256, 8192, " split"), m.mode, m.group_size,
           FloatType::bfloat16, m.scale_type, true, 4, 256, 8192};
    cases.push_back(c);
    Case n{name(m, "f16", false, 2, 512, 3000, " split"), m.mode, m.group_size,
           FloatType::float16, m.scale_type, false, 2, 512, 3000};
    cases.push_back(n);
  }
  // Non-finite scales, NaN codes and zero x, element by element.
  for (const auto& m : kModes) {
    for (bool transpose : {true, false}) {
      for (const auto& [type, tname] : {std::pair{FloatType::float32, "f32"},
                                        std::pair{FloatType::float16, "f16"}}) {
        Case c{name(m, tname, transpose, 3, 256, 512, " nonfinite"), m.mode,
               m.group_size, type, m.scale_type, transpose, 3, 256, 512};
        c.nonfinite = true;
        cases.push_back(c);
      }
    }
  }
  // Infinities of float32 x (every mode) and of W (float scales), through the
  // decode kernels (one and two x blocks) and x split once (8 MiB of W).
  for (const auto& m : kModes) {
    for (auto [M, N, K] : {std::tuple{1, 256, 512}, {4, 256, 512}, {12, 256, 512},
                           {3, 16384, 1024}}) {
      Case c{name(m, "f32", true, M, N, K, " infinities"), m.mode, m.group_size,
             FloatType::float32, m.scale_type, true, M, N, K};
      c.global_scale = m.mode == Mode::nvfp4;
      c.infinities = true;
      cases.push_back(c);
    }
  }
  // float32 x of up to 8 rows times 8 MiB of W or more (the plan's x parts:
  // x split once into bfloat16 high and low parts), rows of W past the last
  // whole tile, K split (E4M3 at 2052 x 4096, E2M1 at 2052 x 8192) or not
  // (E2M1 at 4100 x 4096), odd and even M both ways, non-finite values too
  // (at K = 512, where most rows hold no non-finite scale).
  for (const auto& m : kModes) {
    const bool bytes = m.mode == Mode::fp8 || m.mode == Mode::mxfp8;
    for (auto [M, nonfinite, wide_k] :
         {std::tuple{1, false, false}, {2, false, false}, {3, true, false},
          {3, false, false}, {4, false, false}, {2, false, true},
          {3, false, true}, {5, false, false}, {8, false, false},
          {7, true, false}, {6, false, true}}) {
      if (wide_k && bytes) {
        continue;
      }
      const int N = nonfinite ? (bytes ? 16384 : 32768)
                              : (bytes || wide_k ? 2052 : 4100);
      const int K = nonfinite ? 512 : (wide_k ? 8192 : 4096);
      Case c{name(m, "f32", true, M, N, K, " x parts"), m.mode, m.group_size,
             FloatType::float32, m.scale_type, true, M, N, K};
      c.global_scale = m.mode == Mode::nvfp4;
      c.nonfinite = nonfinite;
      cases.push_back(c);
    }
  }
  // float32 x in parts past 8 rows where bfloat16's plan of twice the rows is
  // fp_qmm_wgmma's (sm_90; fp_qmm's on sm_80 past 16 rows; with float scales
  // the float32 kernels): rows of W past the last block (8456), a partial last stage
  // (2912), K split (1024 x 16384 and 8192), blocks of 32, 128 and 256 rows of parts,
  // non-finite values.
  for (const auto& m : kModes) {
    const int partial_k = m.group_size == 64 ? 2880 : 2912;
    for (auto [M, N, K, nonfinite] :
         {std::tuple{9, 8456, partial_k, false}, {16, 8456, 2048, false},
          {20, 1024, 16384, false}, {48, 1024, 8192, false},
          {61, 2056, 2048, false},
          {300, 2056, 512, false}, {13, 16384, 512, true}}) {
      Case c{name(m, "f32", true, M, N, K, " x parts wgmma"), m.mode,
             m.group_size, FloatType::float32, m.scale_type, true, M, N, K};
      c.global_scale = m.mode == Mode::nvfp4;
      c.nonfinite = nonfinite;
      cases.push_back(c);
      // fp_qmm's parts, as planned for sm_80 (17 to 64 rows).
      if (M > 16 && M <= 64) {
        c.name = name(m, "f32", true, M, N, K, " x parts tiled sm_80");
        c.as_sm80 = true;
        cases.push_back(c);
      }
    }
  }
  // E8M0 scales at the float16 windows' edges and float16 subnormal x
  // (qmv, and tiled at 24 rows).
  for (const auto& m : {kModes[0], kModes[2]}) {
    for (int M : {1, 16, 24}) {
      Case c{name(m, "f16", true, M, 256, 1024, " window edges"), m.mode,
             m.group_size, FloatType::float16, m.scale_type, true, M, 256, 1024};
      c.window_edges = true;
      cases.push_back(c);
    }
  }
  // Batch with broadcast w; gather with random, sorted, out-of-range indices.
  for (bool transpose : {true, false}) {
    Case b{name(kModes[0], "bf16", transpose, 3, 256, 320, " batch 2x3 bw"),
           Mode::mxfp4, 32, FloatType::bfloat16, std::nullopt, transpose, 3, 256, 320};
    b.batch_shape = {2, 3};
    b.broadcast_w = true;
    cases.push_back(b);
    Case whole = b;
    whole.name = name(kModes[0], "bf16", transpose, 3, 256, 1024, " batch 2x3 bw");
    whole.K = 1024;
    cases.push_back(whole);
    Case float_scales{name(kModes[4], "bf16", transpose, 3, 256, 1024, " batch 2x3 bw"),
                      Mode::fp8, 32, FloatType::bfloat16, FloatType::float32, transpose,
                      3, 256, 1024};
    float_scales.batch_shape = {2, 3};
    float_scales.broadcast_w = true;
    cases.push_back(float_scales);
    for (auto style : {Case::Indices::random, Case::Indices::sorted,
                       Case::Indices::out_of_range}) {
      const char* sname = style == Case::Indices::random ? " gather random"
          : style == Case::Indices::sorted               ? " gather sorted"
                                                         : " gather out-of-range";
      for (const auto& m : {kModes[0], kModes[1], kModes[4]}) {
        Case g{name(m, "bf16", transpose, 1, 256, 512, sname), m.mode,
               m.group_size, FloatType::bfloat16, m.scale_type, transpose, 1, 256, 512};
        g.pairs = 12;
        g.x_matrices = 3;
        g.w_matrices = 8;
        g.indices = style;
        g.global_scale = m.mode == Mode::nvfp4;
        cases.push_back(g);
        // Fewer pairs than the grouped path takes: the decode kernel per
        // pair.
        Case few = g;
        few.name += " few";
        few.pairs = 5;
        cases.push_back(few);
      }
    }
  }
  // A gather of 300 pairs of one row of 576 over 8 experts (x's 50
  // matrices, or one a pair where sorted).
  auto gather_300 = [&](const ModeSpec& m,
                       const std::pair<FloatType, const char*>& type,
                       const std::string& label, Case::Indices style) {
    Case g{name(m, type.second, true, 1, 300, 576, label + std::to_string(int(style))),
           m.mode, m.group_size, type.first, m.scale_type, true, 1, 300, 576};
    g.pairs = 300;
    g.x_matrices = style == Case::Indices::sorted ? 300 : 50;
    g.w_matrices = 8;
    g.indices = style;
    g.global_scale = m.mode == Mode::nvfp4;
    return g;
  };
  // fp_qmm's block tiles: several blocks of x rows, K with a partial stage,
  // x rows past M in the last block; split K; gathers of many pairs an
  // expert (fp_qmm_grouped).
  for (const auto& m : kModes) {
    for (const auto& [type, tname] : {kTypes[0], kTypes[1]}) {
      const int K = m.group_size == 64 ? 2880 + 64 : 2880;  // whole groups
      Case c{name(m, tname, true, 100, 300, K, " tiles"), m.mode, m.group_size,
             type, m.scale_type, true, 100, 300, K};
      c.global_scale = m.mode == Mode::nvfp4;
      cases.push_back(c);
    }
    Case split{name(m, "bf16", true, 20, 128, 8192, " tiles split"), m.mode,
               m.group_size, FloatType::bfloat16, m.scale_type, true, 20, 128, 8192};
    split.request = cu::KernelRequest::tiled;
    cases.push_back(split);
    for (auto style : {Case::Indices::random, Case::Indices::sorted,
                       Case::Indices::out_of_range}) {
      cases.push_back(gather_300(m, kTypes[0], " gather tiles ", style));
    }
  }
  // fp_qmv_grouped in runs of 16 (float32 x, which fp_qmm does not take,
  // from 8 pairs an expert).
  for (const auto& m : {kModes[0], kModes[1], kModes[2]}) {
    for (auto style : {Case::Indices::random, Case::Indices::sorted}) {
      cases.push_back(gather_300(m, kTypes[2], " gather runs of 16 ", style));
    }
  }
  // fp_qmv_grouped's blocks walking several shares each (runs times tiles of
  // 32 W rows past the blocks that run at once), NaN runs among the others,
  // float scales and float16 x too.
  for (const auto& m : kModes) {
    for (auto style : {Case::Indices::random, Case::Indices::out_of_range}) {
      for (const auto& type : {kTypes[0], kTypes[1]}) {
        Case g = gather_300(m, type, " gather shares ", style);
        g.name = name(m, type.second, true, 1, 4096, 512,
                      " gather shares " + std::to_string(int(style)));
        g.N = 4096;
        g.K = 512;
        g.pairs = 64;
        g.x_matrices = 16;
        g.w_matrices = 16;
        cases.push_back(g);
      }
    }
  }
  // Up to kBlockGroupMaxPairs pairs each block of fp_qmv_grouped groups them
  // itself: all 32 over 1, 2 or 4 experts (an expert's pairs in several runs
  // of 8, or of 16 with float32 x), out-of-range ones among them, several
  // shares a block.
  for (const int experts : {1, 2, 4}) {
    for (auto style : {Case::Indices::random, Case::Indices::sorted,
                       Case::Indices::out_of_range}) {
      for (const auto& type : {kTypes[0], kTypes[2]}) {
        Case g = gather_300(kModes[0], type, " gather", style);
        g.name = name(kModes[0], type.second, true, 1, 4096, 256,
                      " gather 32 pairs " + std::to_string(experts) + " " +
                          std::to_string(int(style)));
        g.N = 4096;
        g.K = 256;
        g.pairs = fpqmm::cuda::kBlockGroupMaxPairs;
        g.x_matrices = 5;
        g.w_matrices = experts;
        cases.push_back(g);
      }
    }
  }
  // fp_qmm_wgmma (sm_90): x rows past M in the last tile of 128, W rows past
  // N, K split over a small grid, blocks of 256 W rows on a large one (over
  // two blocks of rows of x at 200 x 8576); blocks
  // of 256 rows of x (two tiles of x: both full, the second partial, the
  // second absent in the last block); and blocks of 64 rows of x (up to 64
  // rows) and of 32 (up to 32), past M and split.
  for (const auto& m : kModes) {
    for (auto [M, N, K] : {std::array<int, 3>{200, 136, 512},
                           std::array<int, 3>{128, 256, 8192},
                           std::array<int, 3>{100, 16896, 256},
                           std::array<int, 3>{200, 8576, 256},
                           std::array<int, 3>{512, 4352, 256},
                           std::array<int, 3>{140, 8448, 256},
                           std::array<int, 3>{300, 8448, 256},
                           std::array<int, 3>{40, 136, 512},
                           std::array<int, 3>{64, 256, 8192},
                           std::array<int, 3>{24, 136, 512},
                           std::array<int, 3>{32, 256, 8192}}) {
      Case c{name(m, "bf16", true, M, N, K, " wgmma"), m.mode, m.group_size,
             FloatType::bfloat16, m.scale_type, true, M, N, K};
      c.global_scale = m.mode == Mode::nvfp4;
      c.request = cu::KernelRequest::wgmma;
      cases.push_back(c);
      // Blocks that take several row blocks of x in turn (the ring's stages
      // and barrier phases carried over, the output staging reused).
      if (M > 128) {
        c.name += " looped";
        c.looped_grid = true;
        cases.push_back(c);
      }
    }
    // K with a partial last stage (128 E2M1 or 64 E4M3 codes a stage), in
    // blocks of 128 and of 256 rows of x, and the grouped gather: several runs
    // of 128 pairs an expert.
    const int K = m.group_size == 64 ? 2880 : 2912;
    for (auto [M, N] : {std::array<int, 2>{200, 136}, std::array<int, 2>{300, 8448}}) {
      Case partial{name(m, "bf16", true, M, N, K, " wgmma"), m.mode,
                   m.group_size, FloatType::bfloat16, m.scale_type, true, M, N, K};
      partial.global_scale = m.mode == Mode::nvfp4;
      partial.request = cu::KernelRequest::wgmma;
      cases.push_back(partial);
    }
    for (auto style : {Case::Indices::random, Case::Indices::sorted,
                       Case::Indices::out_of_range}) {
      Case g{name(m, "bf16", true, 1, 136, K, " gather wgmma " +
                  std::to_string(int(style))), m.mode, m.group_size,
             FloatType::bfloat16, m.scale_type, true, 1, 136, K};
      g.pairs = 600;
      g.x_matrices = style == Case::Indices::sorted ? 600 : 50;
      g.w_matrices = 2;
      g.indices = style;
      g.global_scale = m.mode == Mode::nvfp4;
      g.request = cu::KernelRequest::wgmma;
      cases.push_back(g);
    }
  }
  // The simple path forced on a decode shape, the decode path on M > 16.
  Case s{name(kModes[0], "bf16", true, 4, 96, 256, " simple"), Mode::mxfp4, 32,
         FloatType::bfloat16, std::nullopt, true, 4, 96, 256};
  s.request = cu::KernelRequest::simple;
  cases.push_back(s);
  Case q{name(kModes[2], "bf16", false, 20, 256, 100, " qmv requested"), Mode::mxfp8, 32,
         FloatType::bfloat16, std::nullopt, false, 20, 256, 100};
  q.request = cu::KernelRequest::decode;
  cases.push_back(q);
  // Every x @ W^T kernel on every transposed case, fp_qmv as planned for
  // sm_80 (its splits of K add up through partials, not in clusters) and,
  // where that plans fp_qmv_wide, for one SM (which its blocks half fill
  // from two).
  const size_t planned = cases.size();
  for (size_t i = 0; i < planned; ++i) {
    if (cases[i].transpose && !cases[i].request) {
      // Not the infinities: qmv_staged multiplies a group's float sum by its
      // scale, so a scale of 1e38 over codes whose products pass float's
      // largest gives the finite sum where the reference's products overflow.
      if (!cases[i].infinities) {
        Case staged = cases[i];
        staged.name += " staged";
        staged.request = cu::KernelRequest::staged;
        cases.push_back(staged);
      }
      if (cases[i].x_type != FloatType::float32 || cases[i].nonfinite) {
        Case tiled = cases[i];
        tiled.name += " tiled";
        tiled.request = cu::KernelRequest::tiled;
        if (tiled.x_type == FloatType::float32) {
          tiled.x_type = FloatType::bfloat16;
          tiled.name += " bf16";
        }
        cases.push_back(tiled);
        Case wgmma = tiled;
        wgmma.name.replace(wgmma.name.rfind(" tiled"), 6, " wgmma");
        wgmma.request = cu::KernelRequest::wgmma;
        wgmma.x_type = FloatType::bfloat16;
        cases.push_back(wgmma);
      }
      Case ampere = cases[i];
      ampere.name += " sm_80";
      ampere.as_sm80 = true;
      cases.push_back(ampere);
      Case wide = cases[i];
      wide.name += " one SM";
      wide.as_sms = 1;
      if (planned_family(wide) == cu::KernelFamily::qmv_wide) {
        cases.push_back(wide);
      }
    }
  }
  return cases;
}

// ---- Benchmark ----

// The same reads in fp_qmv_wide's order: a block of 4 warps per 32 rows, each
// lane's 4 rows (lane / 4 + 8 i) 16 bytes at a time, a warp's pass 64 bytes
// of each row, the warps' passes interleaved.
__global__ void read_rows_kernel(const uint4* data, int rows, int row_vectors, uint32_t* out) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint32_t acc = 0;
  for (int pass = warp; pass * 4 < row_vectors; pass += 4) {
    for (int i = 0; i < 4; ++i) {
      const int row = blockIdx.x * 32 + lane / 4 + 8 * i;
      if (row < rows) {
        const uint4 v = __ldcs(data + int64_t(row) * row_vectors + pass * 4 + lane % 4);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
  }
  if (acc == 0x12345678u) {
    out[0] = acc;
  }
}

__global__ void read_bandwidth_kernel(const uint4* data, int64_t count, uint32_t* out) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) {
    out[0] = acc;
  }
}

__global__ void fill_kernel(uint32_t* data, int64_t count, uint32_t seed, uint32_t mask,
                            uint32_t value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    data[i] = (h & mask) | value;
  }
}

// Best of `repeats` of f() (which runs `products` products), per product.
template <typename F>
double time_us(F&& f, int products, int repeats = 5) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  f();  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    CHECK_CUDA(cudaEventRecord(start));
    f();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, double(ms) * 1000.0 / products);
  }
  CHECK_CUDA(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

void bench(const std::string& only) {
  const auto device = this_device();
  constexpr int64_t kPool = int64_t(1) << 30;  // weight copies: 1 GiB
  uint8_t* pool = nullptr;
  uint8_t* scale_pool = nullptr;
  CHECK_CUDA(cudaMalloc(&pool, kPool + (64 << 20)));
  CHECK_CUDA(cudaMalloc(&scale_pool, kPool / 4));
  // Codes random (E4M3 magnitudes below 0x7F); scales finite: every byte
  // 0x3C is finite in each encoding, and small where a float (so that the
  // multipliers take one step). E8M0 scales are 0x78 instead (2^-7: an
  // mxfp4 group whose largest |w| is about 0.05; inside HalfWindow), set per
  // case.
  fill_kernel<<<1024, 256>>>((uint32_t*)pool, (kPool + (64 << 20)) / 4, 1, 0xFFFFFFFFu, 0);
  constexpr int kScaleByte = 0x3C;
  constexpr int kE8M0ScaleByte = 0x78;
  uint32_t* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, 4));
  const double read_us = time_us(
      [&] { read_bandwidth_kernel<<<device.sm_count * 8, 512>>>((const uint4*)pool, kPool / 16, sink); }, 1);
  const double read_gbs = kPool / read_us / 1e3;
  std::printf("read bandwidth (1 GiB, streaming uint4 loads): %.0f GB/s\n", read_gbs);
  std::printf("%-44s %10s %9s %6s  %s\n", "case", "us", "GB/s", "%read", "kernel");

  void* x = nullptr;
  void* y = nullptr;
  float* partials = nullptr;
  float* global_scale = nullptr;
  CHECK_CUDA(cudaMalloc(&x, 256 << 20));
  CHECK_CUDA(cudaMalloc(&y, 256 << 20));
  CHECK_CUDA(cudaMalloc(&partials, 256 << 20));
  CHECK_CUDA(cudaMalloc(&global_scale, 1024));
  fill_kernel<<<256, 256>>>((uint32_t*)x, (256 << 20) / 4, 7, 0x3F1F3F1Fu, 0x3C003C00u);
  fill_kernel<<<1, 256>>>((uint32_t*)global_scale, 256, 0, 0, 0x44FA0000u);  // 2000.0

  // Best time (us) of `count` launches, launch(i) each, per launch.
  auto time_copies = [](int count, auto&& launch) {
    return time_us(
        [&] {
          for (int i = 0; i < count; ++i) {
            launch(i);
          }
        },
        count);
  };
  // A bench row: `bytes` read in `us`, beside the read bandwidth.
  auto print_row = [&](const std::string& label, double us, int64_t bytes,
                       const std::string& kernel) {
    const double gbs = bytes / us / 1e3;
    std::printf("%-44s %10.2f %9.0f %5.0f%%  %s\n", label.c_str(), us, gbs,
                100.0 * gbs / read_gbs, kernel.c_str());
  };

  auto run_dense = [&](const std::string& label, QmmProblem problem,
                       const std::vector<uint32_t>* lhs, const std::vector<uint32_t>* rhs,
                       int64_t weight_bytes, int64_t scale_bytes, int64_t set_w, int64_t set_s,
                       cu::CudaDevice as = {},
                       cu::KernelRequest request = cu::KernelRequest::automatic) {
    if (!only.empty() && label.find(only) == std::string::npos) {
      return;
    }
    const auto plan = cu::plan(problem, as.major ? as : device, request);
    const int copies = int(std::max<int64_t>(2, kPool / set_w));
    const bool e8m0 = mlx_fpqmm::scale_encoding(problem.mode, problem.scale_type) ==
                      ScaleEncoding::e8m0;
    if (set_s * copies > kPool / 4) {
      std::printf("%s: the scales' copies exceed their pool\n", label.c_str());
      std::exit(1);
    }
    CHECK_CUDA(cudaMemset(scale_pool, e8m0 ? kE8M0ScaleByte : kScaleByte, set_s * copies));
    DeviceProblem d;
    d.x = x;
    d.y = y;
    d.partials = partials;
    d.global_scale = problem.has_global_scale ? global_scale : nullptr;
    uint32_t* indices = nullptr;
    if (lhs) {
      CHECK_CUDA(cudaMalloc(&indices, 8 * lhs->size()));
      CHECK_CUDA(cudaMemcpy(indices, lhs->data(), 4 * lhs->size(), cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(indices + lhs->size(), rhs->data(), 4 * rhs->size(), cudaMemcpyHostToDevice));
      d.lhs = indices;
      d.rhs = indices + lhs->size();
    }
    if (plan.grouping_bytes > 0) {
      CHECK_CUDA(cudaMalloc(&d.scratch, plan.grouping_bytes));
    }
    if (plan.x_tiles_bytes > 0) {
      CHECK_CUDA(cudaMalloc(&d.x_tiles, plan.x_tiles_bytes));
    }
    if (plan.x_split_bytes > 0) {
      CHECK_CUDA(cudaMalloc(&d.x_parts, plan.x_split_bytes));
    }
    const double us = time_copies(copies, [&](int i) {
      d.w = pool + i * set_w;
      d.scales = scale_pool + i * set_s;
      run_plan(plan, problem, d);
    });
    print_row(label, us, weight_bytes + scale_bytes,
              plan.main.kernel + " split=" + std::to_string(plan.split_k) +
                  (plan.splits_in_cluster ? " (cluster)" : ""));
    cudaFree(indices);
    cudaFree(d.scratch);
    cudaFree(d.x_tiles);
    cudaFree(d.x_parts);
    if (as.major != 0 || request != cu::KernelRequest::automatic) {
      return;
    }
    // The floor beside the plan's kernel: a streaming read of as many bytes
    // (W's and its scales' together) from as many copies of them in the
    // pool, none overlapping the next, each read by one launch.
    const int64_t floor_vectors = (weight_bytes + scale_bytes + 15) / 16;
    const int64_t floor_set = (16 * floor_vectors + 255) / 256 * 256;
    const int floor_copies = int((kPool + (64 << 20)) / floor_set);
    if (floor_copies < 2) {
      return;
    }
    const int floor_blocks =
        int(std::min<int64_t>(device.sm_count * 8, (floor_vectors + 511) / 512));
    const double floor_us = time_copies(floor_copies, [&](int i) {
      read_bandwidth_kernel<<<floor_blocks, 512>>>(
          (const uint4*)(pool + i * floor_set), floor_vectors, sink);
    });
    print_row(label + " floor", floor_us, weight_bytes + scale_bytes, "read_bandwidth_kernel");
    const int64_t row_vectors = weight_bytes / problem.N / 16;
    if (lhs || !problem.transpose || problem.batch_count() != 1 || row_vectors % 4 != 0) {
      return;
    }
    const double rows_us = time_copies(copies, [&](int i) {
      read_rows_kernel<<<(problem.N + 31) / 32, 128>>>(
          (const uint4*)(pool + i * set_w), problem.N, int(row_vectors), sink);
    });
    print_row(label + " floor rows", rows_us, weight_bytes, "read_rows_kernel");
  };

  // fp_qmv's narrow blocks beside the wide ones that the plan takes: planned
  // as for twice the SMs, where the wide blocks do not half fill those.
  const cu::CudaDevice twice_the_sms{device.major, device.minor, 2 * device.sm_count};
  auto wide_planned = [&](const QmmProblem& problem) {
    auto family = [&](const cu::CudaDevice& as) {
      return cu::plan(problem, as, cu::KernelRequest::automatic).key.family;
    };
    return family(device) == cu::KernelFamily::qmv_wide &&
           family(twice_the_sms) == cu::KernelFamily::qmv;
  };

  // Decode (M up to 16: every x type, the automatic plan) and prefill (the
  // simple path, fp_qmv tiled over M, and fp_qmm side by side); 4096 x 14336
  // (long rows, few of them) in decode only.
  struct BenchShape {
    int N;
    int K;
    bool decode_only;
  };
  const std::vector<BenchShape> shapes = {
      {14336, 4096, false}, {4096, 4096, false}, {1024, 4096, false}, {4096, 14336, true}};
  for (const auto& m : kModes) {
    const auto& format = mlx_fpqmm::format_for(m.mode);
    const ModeSpec spec = m.mode == Mode::fp4 ? ModeSpec{Mode::fp4, 32, FloatType::bfloat16, "fp4"}
        : m.mode == Mode::fp8 ? ModeSpec{Mode::fp8, 32, FloatType::bfloat16, "fp8"} : m;
    for (auto [N, K, decode_only] : shapes) {
      for (int M : {1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512, 1024, 4096}) {
        for (const auto& [type, tname] : kTypes) {
          const bool decode = M <= 16;
          if (!decode && (type == FloatType::float16 || decode_only)) {
            continue;
          }
          QmmProblem p{};
          p.mode = spec.mode;
          p.group_size = spec.group_size;
          p.transpose = true;
          p.M = M;
          p.N = N;
          p.K = K;
          p.x_type = type;
          p.scale_type = spec.scale_type;
          p.has_global_scale = spec.mode == Mode::nvfp4;
          const int64_t wb = int64_t(N) * K * format.bits / 8;
          const int64_t sb = int64_t(N) * (K / spec.group_size) *
              mlx_fpqmm::scale_itemsize(mlx_fpqmm::scale_encoding(spec.mode, spec.scale_type));
          const int64_t set_w = (wb + 255) / 256 * 256;
          const int64_t set_s = (sb + 255) / 256 * 256;
          const std::string shape = std::string(spec.name) + " " + std::to_string(N) + "x" +
              std::to_string(K);
          if (decode) {
            const std::string label = shape + " M=" + std::to_string(M) + " " + tname;
            run_dense(label, p, nullptr, nullptr, wb, sb, set_w, set_s);
            if (N == 1024 || M == 1) {
              run_dense(label + " sm_80 plan", p, nullptr, nullptr, wb, sb, set_w, set_s,
                        {8, 0, device.sm_count});
            }
            if (wide_planned(p)) {
              run_dense(label + " narrow", p, nullptr, nullptr, wb, sb, set_w, set_s,
                        twice_the_sms);
            }
            continue;
          }
          if (type == FloatType::float32) {
            // In parts by wgmma (fp_qmm as planned for sm_80) beside the
            // float32 kernels of the simple path (one pass over W per 16 rows).
            for (auto request : {cu::KernelRequest::automatic, cu::KernelRequest::simple}) {
              if (M > 512 || (request == cu::KernelRequest::simple && M > 64)) {
                continue;
              }
              const std::string label = shape + " prefill M=" + std::to_string(M) + " f32 " +
                  std::string(cu::request_name(request));
              run_dense(label, p, nullptr, nullptr, wb, sb, set_w, set_s, {}, request);
              if (M <= 64) {
                run_dense(label + " sm_80 plan", p, nullptr, nullptr, wb, sb, set_w, set_s,
                          {8, 0, device.sm_count}, request);
              }
            }
            continue;
          }
          for (auto request : {cu::KernelRequest::simple, cu::KernelRequest::tiled,
                               cu::KernelRequest::wgmma}) {
            if (request == cu::KernelRequest::simple && M > 128) {
              continue;
            }
            run_dense(shape + " prefill M=" + std::to_string(M) + " " +
                          std::string(cu::request_name(request)),
                      p, nullptr, nullptr, wb, sb, set_w, set_s, {}, request);
          }
        }
      }
    }
  }
  // gpt-oss layer: 32 experts of 2880 x 2880 mxfp4, top 4.
  std::mt19937 rng(5);
  for (int tokens : {1, 8, 32, 64, 128, 512, 2048, 8192}) {
    for (bool sorted : {false, true}) {
      std::vector<uint32_t> lhs, rhs;
      for (int t = 0; t < tokens; ++t) {
        std::vector<uint32_t> experts(32);
        for (int e = 0; e < 32; ++e) experts[e] = e;
        std::shuffle(experts.begin(), experts.end(), rng);
        for (int j = 0; j < 4; ++j) {
          lhs.push_back(t);
          rhs.push_back(experts[j]);
        }
      }
      if (sorted) {
        std::vector<int> order(rhs.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return rhs[a] < rhs[b]; });
        std::vector<uint32_t> l2, r2;
        for (int i : order) {
          l2.push_back(uint32_t(i));  // mlx-lm's layout: x (pairs, 1, K)
          r2.push_back(rhs[i]);
        }
        lhs = l2;
        rhs = r2;
      }
      QmmProblem p{};
      p.mode = Mode::mxfp4;
      p.group_size = 32;
      p.transpose = true;
      p.M = 1;
      p.N = 2880;
      p.K = 2880;
      p.x_type = FloatType::bfloat16;
      p.gather = true;
      p.batch_shape = {int(lhs.size())};
      p.x_matrices = sorted ? int(lhs.size()) : tokens;
      p.w_matrices = 32;
      p.right_sorted = sorted;
      const int64_t wb = 2880LL * 2880 / 2;
      const int64_t sb = 2880LL * 90;
      std::vector<uint32_t> distinct(rhs);
      std::sort(distinct.begin(), distinct.end());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      const std::string label = "gather mxfp4 32x2880^2 top4 T=" + std::to_string(tokens) +
          (sorted ? " sorted" : "");
      auto run_gather = [&](cu::KernelRequest request, cu::CudaDevice as,
                            const std::string& suffix) {
        run_dense(label + " " + std::string(cu::request_name(request)) + suffix, p, &lhs,
                  &rhs, wb * int64_t(distinct.size()), sb * int64_t(distinct.size()),
                  wb * 32, sb * 32, as, request);
      };
      for (auto request : {cu::KernelRequest::automatic, cu::KernelRequest::grouped,
                           cu::KernelRequest::tiled, cu::KernelRequest::wgmma}) {
        run_gather(request, {}, "");
      }
      for (auto request : {cu::KernelRequest::automatic, cu::KernelRequest::grouped}) {
        run_gather(request, {8, 0, device.sm_count}, " sm_80 plan");
      }
      if (wide_planned(p)) {
        run_gather(cu::KernelRequest::automatic, twice_the_sms, " narrow");
      }
    }
  }
  cudaFree(pool);
  cudaFree(scale_pool);
  cudaFree(x);
  cudaFree(y);
  cudaFree(partials);
  cudaFree(global_scale);
  cudaFree(sink);
}

}  // namespace

int main(int argc, char** argv) {
  bool test = false, run_bench = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--test") test = true;
    if (a == "--bench") run_bench = true;
    if (a == "--only" && i + 1 < argc) only = argv[++i];
  }
  if (!test && !run_bench) {
    test = run_bench = true;
  }
  int failures = 0;
  if (test) {
    std::mt19937 rng(1234);
    int count = 0;
    for (const auto& c : test_cases()) {
      if (!only.empty() && c.name.find(only) == std::string::npos) {
        continue;
      }
      ++count;
      failures += run_case(c, rng) ? 0 : 1;
    }
    std::printf("%d of %d cases failed\n", failures, count);
  }
  if (run_bench) {
    bench(only);
  }
  return failures ? 1 : 0;
}
