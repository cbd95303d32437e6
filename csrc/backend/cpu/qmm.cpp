// Picks the ISA and the path for one product and splits it over the pool:
// - small M: decode fused into SIMD dot products (or axpy for x @ W);
// - large M: W dequantized panel by panel into cache-sized blocks that feed a
//   GEMM (the BLAS sgemm for float32, our bf16 dot-product kernel for
//   bfloat16 x where the scaled codes are exact in bf16).
#include "backend/cpu/qmm.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "mlx/types/half_types.h"

#include "backend/cpu/blas.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"

namespace mlx_fpqmm::cpu {

namespace {

// Output columns per task: rows of W on the small-M path, columns of W for
// x @ W and per GEMM panel (multiples of 128, so of every group size and
// SIMD step, as the kernels need for column blocks).
constexpr int64_t kDotGrain = 64;
constexpr int64_t kAxpyGrain = 256;
constexpr int64_t kPanelRows = 128;
// The bf16 GEMM: two of its 32-column panels per task, enough tasks to
// balance two busy cores.
constexpr int64_t kGemmBf16Grain = 64;
// x is arranged for the dots and the bf16 GEMM once per product, in
// parallel blocks of rows.
constexpr int64_t kArrangeGrain = 16;
// Columns of a dequantized panel: 128 x 2048 floats is 1 MiB.
constexpr int64_t kPanelDepth = 2048;
// Rows of W per task of a dequantize.
constexpr int64_t kDequantizeGrain = 16;
// The small-M x @ W^T kernels' tasks are longer for large N, as many as
// kDotTasksPerThread per thread to balance the pool: each task decodes its
// rows' scales, and the AVX-512 bf16 dots arrange x, afresh, which short
// tasks would repeat often enough to show in the M = 1 times.
constexpr int64_t kDotTasksPerThread = 8;
// From this many rows of bfloat16 x on, the bf16 GEMM kernel beats the bf16
// dots (measured on Zen 4); float32 x has its threshold per ISA
// (IsaKernels::sgemm_min_rows_dot / _axpy).
constexpr int64_t kGemmMinRowsBf16 = 12;

// `count` elements of `storage`, 64-byte aligned: the dots' vector loads of
// arranged x then never straddle cache lines, which M = 1 feels.
template <typename T>
T* aligned_elements(std::vector<std::byte>& storage, int64_t count) {
  return static_cast<T*>(aligned_bytes(storage, count * sizeof(T)));
}

int64_t dot_grain(int64_t N) {
  return std::max(kDotGrain, N / (num_threads() * kDotTasksPerThread));
}

bool cpu_has_avx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

// The kernels of every ISA this CPU runs, best first.
std::vector<const IsaKernels*> supported_kernels() {
  std::vector<const IsaKernels*> kernels;
#if defined(__x86_64__)
  if (cpu_has_avx512()) {
    if (__builtin_cpu_supports("avx512bf16")) {
      kernels.push_back(avx512_kernels());
    } else {
      static IsaKernels without_bf16 = [] {
        IsaKernels k = *avx512_kernels();
        k.dot_bf16 = nullptr;
        k.gemm_bf16 = nullptr;
        return k;
      }();
      kernels.push_back(&without_bf16);
    }
  }
  if (cpu_has_avx2()) {
    kernels.push_back(avx2_kernels());
  }
#elif defined(__aarch64__)
  kernels.push_back(neon_kernels());
#endif
  kernels.push_back(portable_kernels());
  return kernels;
}

// MLX_FPQMM_CPU_ISA (avx512, avx2, neon or portable) picks an ISA when this
// CPU runs it; otherwise, and by default, the best one is used. Read on
// every call so that tests can switch.
const IsaKernels& select_kernels() {
  // Never destroyed: at exit, MLX's stream threads may still run tasks that
  // call this after static destructors have run.
  static const auto* kernels =
      new std::vector<const IsaKernels*>(supported_kernels());
  if (const char* requested = std::getenv("MLX_FPQMM_CPU_ISA")) {
    for (const IsaKernels* k : *kernels) {
      if (std::string_view(k->name) == requested) {
        return *k;
      }
    }
  }
  return *kernels->front();
}

// MLX_FPQMM_CPU_GEMM_MIN_M overrides both thresholds (tests use it to run
// both paths on the same shapes).
int64_t gemm_min_rows(int64_t default_rows) {
  if (const char* value = std::getenv("MLX_FPQMM_CPU_GEMM_MIN_M")) {
    return std::max(1ll, std::atoll(value));
  }
  return default_rows;
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

// Writes rows of float32 results into `out` (M x N of out_dtype) at column n0.
void store_rows(
    const QmmArgs& args,
    const float* values,
    int64_t ld,
    int64_t n0,
    int64_t count) {
  dispatch_float(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(args.out);
    for (int64_t m = 0; m < args.M; ++m) {
      for (int64_t j = 0; j < count; ++j) {
        out[m * args.N + n0 + j] = static_cast<T>(values[m * ld + j]);
      }
    }
  });
}

// Runs body(n0, n1, out, ldo) over blocks of output columns in parallel;
// float32 outputs are written in place, others through a float32 buffer.
template <typename Body>
void for_output_blocks(const QmmArgs& args, int64_t grain, Body&& body) {
  parallel_for(args.N, grain, [&](int64_t n0, int64_t n1) {
    if (args.dtype == mx::float32) {
      body(n0, n1, static_cast<float*>(args.out) + n0, args.N);
      return;
    }
    // A busy pool runs the whole product here, on the calling stream's
    // thread, which keeps its thread_locals for good (a thread per MLX
    // stream): `grain` columns at a time keep the buffer M x grain, not M x N.
    thread_local std::vector<float> buffer;
    for (int64_t b0 = n0; b0 < n1; b0 += grain) {
      int64_t b1 = std::min(n1, b0 + grain);
      buffer.resize(args.M * (b1 - b0));
      body(b0, b1, buffer.data(), b1 - b0);
      store_rows(args, buffer.data(), b1 - b0, b0, b1 - b0);
    }
  });
}

// Output columns [n0, n1) of x @ W^T or x @ W: W dequantized into a panel
// kPanelDepth deep at a time, each feeding sgemm.
void gemm_panel(
    const QmmArgs& args,
    const QuantizedMatrix& w,
    const float* x,
    int64_t n0,
    int64_t n1,
    float* out,
    int64_t ldo) {
  const IsaKernels& kernels = select_kernels();
  int64_t K = args.K;
  thread_local std::vector<float> panel;
  int64_t width = n1 - n0;
  panel.resize(width * std::min(K, kPanelDepth));
  for (int64_t k0 = 0; k0 < K; k0 += kPanelDepth) {
    int64_t k1 = std::min(K, k0 + kPanelDepth);
    // The panel holds W's block in its own orientation: (n, k) rows for
    // x @ W^T, (k, n) rows for x @ W.
    int64_t ld = args.transpose ? k1 - k0 : width;
    if (args.transpose) {
      kernels.dequantize(w, n0, n1, k0, k1, panel.data(), ld);
    } else {
      kernels.dequantize(w, k0, k1, n0, n1, panel.data(), ld);
    }
    sgemm(
        args.transpose,
        args.M,
        width,
        k1 - k0,
        x + k0,
        K,
        panel.data(),
        ld,
        k0 == 0 ? 0.0f : 1.0f,
        out,
        ldo);
  }
}

// x @ W^T or x @ W through a float32 GEMM on dequantized panels of W, each
// kPanelRows output columns from a multiple of kPanelRows however the pool
// splits the columns (a busy pool runs them all in one block): the panels
// stay in cache, and sgemm sees the same shapes, so gives the same sums, on
// any number of threads.
void gemm_f32(const QmmArgs& args, const QuantizedMatrix& w, const float* x) {
  for_output_blocks(
      args, kPanelRows, [&](int64_t n0, int64_t n1, float* out, int64_t ldo) {
        for (int64_t p0 = n0; p0 < n1; p0 += kPanelRows) {
          int64_t p1 = std::min(n1, p0 + kPanelRows);
          gemm_panel(args, w, x, p0, p1, out + (p0 - n0), ldo);
        }
      });
}

void qmm_bf16(
    const QmmArgs& args, const IsaKernels& kernels, const QuantizedMatrix& w) {
  const auto* x = static_cast<const bf16_bits*>(args.x);
  if (args.M >= gemm_min_rows(kGemmMinRowsBf16) && kernels.gemm_bf16 &&
      args.format->bf16_exact) {
    // x is arranged once for all tasks, then each task packs its panels.
    std::vector<std::byte> storage;
    auto* arranged = aligned_elements<bf16_bits>(storage, args.M * args.K);
    parallel_for(args.M, kArrangeGrain, [&](int64_t m0, int64_t m1) {
      kernels.arrange_x_bf16(
          w, x + m0 * args.K, m1 - m0, arranged + m0 * args.K);
    });
    for_output_blocks(
        args,
        kGemmBf16Grain,
        [&](int64_t n0, int64_t n1, float* out, int64_t ldo) {
          kernels.gemm_bf16(w, arranged, args.M, n0, n1, out, ldo);
        });
    return;
  }
  for_output_blocks(
      args,
      dot_grain(args.N),
      [&](int64_t n0, int64_t n1, float* out, int64_t ldo) {
        kernels.dot_bf16(w, x, args.M, n0, n1, out, ldo);
      });
}

}  // namespace

void qmm(const QmmArgs& args) {
  if (args.M == 0 || args.N == 0) {
    return;
  }
  const IsaKernels& kernels = select_kernels();
  QuantizedMatrix w{
      args.format->bits,
      args.group_size,
      args.transpose ? args.N : args.K,
      args.transpose ? args.K : args.N,
      reinterpret_cast<const uint8_t*>(args.w),
      args.scales,
      args.scale_encoding,
      args.global_factor};
  if (args.dtype == mx::bfloat16 && args.transpose && kernels.dot_bf16) {
    qmm_bf16(args, kernels, w);
    return;
  }
  std::vector<float> converted;
  const float* x = static_cast<const float*>(args.x);
  if (args.dtype != mx::float32) {
    converted.resize(args.M * args.K);
    dispatch_float(args.dtype, [&](auto tag) {
      const auto* src = static_cast<const decltype(tag)*>(args.x);
      std::copy(src, src + converted.size(), converted.begin());
    });
    x = converted.data();
  }
  int64_t sgemm_min_rows =
      args.transpose ? kernels.sgemm_min_rows_dot : kernels.sgemm_min_rows_axpy;
  if (args.M >= gemm_min_rows(sgemm_min_rows) && has_sgemm()) {
    gemm_f32(args, w, x);
  } else if (args.transpose) {
    int64_t length = kernels.arranged_length(w);
    std::vector<std::byte> storage;
    auto* arranged = aligned_elements<float>(storage, args.M * length);
    parallel_for(args.M, kArrangeGrain, [&](int64_t m0, int64_t m1) {
      kernels.arrange_x(w, x + m0 * args.K, m1 - m0, arranged + m0 * length);
    });
    for_output_blocks(
        args,
        dot_grain(args.N),
        [&](int64_t n0, int64_t n1, float* out, int64_t ldo) {
          kernels.dot(w, x, arranged, args.M, n0, n1, out, ldo);
        });
  } else {
    for_output_blocks(
        args, kAxpyGrain, [&](int64_t n0, int64_t n1, float* out, int64_t ldo) {
          kernels.axpy(w, x, args.M, n0, n1, out, ldo);
        });
  }
}

void dequantize(const DequantizeArgs& args) {
  if (args.rows == 0 || args.cols == 0) {
    return;
  }
  const IsaKernels& kernels = select_kernels();
  const int64_t matrix_rows = args.rows / args.factor_count;
  const int64_t row_bytes = args.cols * args.format->bits / 8;
  const int64_t row_scale_bytes =
      args.cols / args.group_size * args.scale_itemsize;
  parallel_for(args.rows, kDequantizeGrain, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> row;
    row.resize(args.cols);
    for (int64_t r = r0; r < r1; ++r) {
      // Row r as row 0 of a one-row matrix with its matrix's global factor.
      QuantizedMatrix w{
          args.format->bits,
          args.group_size,
          1,
          args.cols,
          reinterpret_cast<const uint8_t*>(args.w) + r * row_bytes,
          static_cast<const std::byte*>(args.scales) + r * row_scale_bytes,
          args.scale_encoding,
          args.global_factors[r / matrix_rows]};
      kernels.dequantize(w, 0, 1, 0, args.cols, row.data(), args.cols);
      dispatch_float(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        std::transform(
            row.begin(),
            row.end(),
            static_cast<T*>(args.out) + r * args.cols,
            [](float value) { return static_cast<T>(value); });
      });
    }
  });
}

}  // namespace mlx_fpqmm::cpu
