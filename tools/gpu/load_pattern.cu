// The memory ceiling of the decode kernel's access pattern on the GPU at hand:
// fp_qmv's loads of W (blocks of 16 rows, 8 warps taking turns over passes of
// 64 bytes of a row per quad of lanes, 1, 2 or 4 passes in flight) with no
// arithmetic, beside the same bytes read row-major per block and streamed
// over the whole matrix; 1 GiB of copies back to back, CUDA events, median
// of 7. Built and run on the GPU machine (docs/cuda-log.md, "What limits qmv"):
//   nvcc -O3 -std=c++20 -Icsrc -gencode arch=compute_90a,code=sm_90a \
//     tools/gpu/load_pattern.cu -o /tmp/load_pattern && /tmp/load_pattern
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/kernels/fp_operands.cuh"

using fpqmm::cuda::kQmvWarps;
using fpqmm::cuda::kTileRows;
using fpqmm::cuda::kWarpSize;
using fpqmm::cuda::load_streaming;

#define CK(call)                                                              \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                           \
    }                                                                         \
  } while (0)

constexpr int kThreads = kQmvWarps * kWarpSize;

__device__ __forceinline__ uint32_t fold(uint4 v) {
  return v.x ^ v.y ^ v.z ^ v.w;
}

// fp_qmv's pattern: a block takes kTileRows rows, its kQmvWarps warps every
// kQmvWarps-th pass of a quad of lanes over each row (lane g, t: rows g and
// g + 8, 16-byte chunk 4 * pass + t), `ahead` passes in flight.
template <int ahead>
__global__ void __launch_bounds__(kThreads, 3)
    qmv_pattern(const uint4* w, int row_chunks, uint32_t* out) {
  const int warp = threadIdx.x / kWarpSize;
  const int g = threadIdx.x % kWarpSize / 4;
  const int t = threadIdx.x % 4;
  const uint4* r0 = w + int64_t(blockIdx.x * kTileRows + g) * row_chunks + t;
  const uint4* r1 = r0 + int64_t(kTileRows / 2) * row_chunks;
  const int passes = row_chunks / 4;
  uint32_t acc = 0;
  uint4 buf[ahead][2];
#pragma unroll
  for (int j = 0; j < ahead; ++j) {
    const int p = warp + j * kQmvWarps;
    if (p < passes) {
      buf[j][0] = load_streaming(r0 + 4 * p);
      buf[j][1] = load_streaming(r1 + 4 * p);
    }
  }
  for (int p0 = warp; p0 < passes; p0 += kQmvWarps * ahead) {
#pragma unroll
    for (int j = 0; j < ahead; ++j) {
      const int p = p0 + j * kQmvWarps;
      if (p < passes) {
        acc ^= fold(buf[j][0]) ^ fold(buf[j][1]);
        const int q = p + kQmvWarps * ahead;
        if (q < passes) {
          buf[j][0] = load_streaming(r0 + 4 * q);
          buf[j][1] = load_streaming(r1 + 4 * q);
        }
      }
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

// The same block of rows read row-major: each warp instruction 512
// contiguous bytes of one row, two loads in flight a thread.
__global__ void __launch_bounds__(kThreads, 3)
    row_pattern(const uint4* w, int row_chunks, uint32_t* out) {
  const uint4* block = w + int64_t(blockIdx.x * kTileRows) * row_chunks;
  const int total = kTileRows * row_chunks;
  uint32_t acc = 0;
  for (int i = threadIdx.x; i < total; i += 2 * kThreads) {
    acc ^= fold(load_streaming(block + i));
    if (i + kThreads < total) {
      acc ^= fold(load_streaming(block + i + kThreads));
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

// The whole matrix streamed by a grid-stride loop.
__global__ void stream_all(const uint4* d, int64_t n, uint32_t* out) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    acc ^= fold(load_streaming(d + i));
  }
  if (acc == 0x12345678u) out[0] = acc;
}

template <typename F>
double time_us(F&& f, int products, int repeats = 7) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0 / products);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t pool_bytes = int64_t(1) << 30;
  uint8_t* pool;
  uint32_t* out;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMalloc(&out, 4));
  CK(cudaMemset(pool, 1, pool_bytes));
  for (auto [N, row_bytes] : {std::pair{14336, 2048}, {4096, 2048}, {4096, 7168}, {14336, 4096}}) {
    const int64_t bytes = int64_t(N) * row_bytes;
    const int copies = int(pool_bytes / bytes);
    const int row_chunks = row_bytes / 16;
    const int blocks = N / kTileRows;
    const int64_t vectors = bytes / 16;
    // Per product: `launch(weights)` over every copy of the pool, back to back.
    auto report = [&](const char* name, auto launch) {
      const double us = time_us(
          [&] {
            for (int i = 0; i < copies; ++i) {
              launch(reinterpret_cast<const uint4*>(pool + i * bytes));
            }
          },
          copies);
      std::printf("%5d rows x %5d B  %-22s %8.2f us  %6.0f GB/s\n", N, row_bytes, name, us,
                  bytes / us / 1e3);
    };
    report("qmv pattern, 1 ahead",
           [&](const uint4* w) { qmv_pattern<1><<<blocks, kThreads>>>(w, row_chunks, out); });
    report("qmv pattern, 2 ahead",
           [&](const uint4* w) { qmv_pattern<2><<<blocks, kThreads>>>(w, row_chunks, out); });
    report("qmv pattern, 4 ahead",
           [&](const uint4* w) { qmv_pattern<4><<<blocks, kThreads>>>(w, row_chunks, out); });
    report("row-major blocks",
           [&](const uint4* w) { row_pattern<<<blocks, kThreads>>>(w, row_chunks, out); });
    report("stream, grid 8/SM",
           [&](const uint4* w) { stream_all<<<sms * 8, 256>>>(w, vectors, out); });
    report("stream, 1 thread/16B", [&](const uint4* w) {
      stream_all<<<int(vectors / 256), 256>>>(w, vectors, out);
    });
  }
  return 0;
}
