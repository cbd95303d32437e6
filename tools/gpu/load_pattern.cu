// The memory ceiling of the decode kernel's access pattern on the GPU at hand:
// fp_qmv's loads of W (blocks of 16 rows, 8 warps taking turns over passes of
// 64 bytes of a row per quad of lanes, 1, 2 or 4 passes in flight) with no
// arithmetic, beside the same bytes read row-major per block and streamed
// over the whole matrix; 1 GiB of copies back to back, CUDA events, median
// of 7. Built and run on the GPU machine (README, "What limits qmv"):
//   nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a \
//     tools/gpu/load_pattern.cu -o /tmp/load_pattern && /tmp/load_pattern
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(call)                                                              \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                           \
    }                                                                         \
  } while (0)

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// fp_qmv's pattern: block = 16 rows, 8 warps take every 8th pass of a quad
// per row (lane g, t: rows g and g + 8, chunk 4 * pass + t).
template <int ahead>
__global__ void __launch_bounds__(256, 3) qmv_pattern(const uint4* w, int row_chunks, uint32_t* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint4* r0 = w + int64_t(blockIdx.x * 16 + g) * row_chunks + t;
  const uint4* r1 = r0 + int64_t(8) * row_chunks;
  const int passes = row_chunks / 4;
  uint32_t acc = 0;
  uint4 buf[ahead][2];
#pragma unroll
  for (int j = 0; j < ahead; ++j) {
    const int p = warp + j * 8;
    if (p < passes) {
      buf[j][0] = ld_stream(r0 + 4 * p);
      buf[j][1] = ld_stream(r1 + 4 * p);
    }
  }
  for (int p0 = warp; p0 < passes; p0 += 8 * ahead) {
#pragma unroll
    for (int j = 0; j < ahead; ++j) {
      const int p = p0 + j * 8;
      if (p < passes) {
        acc ^= buf[j][0].x ^ buf[j][0].y ^ buf[j][0].z ^ buf[j][0].w ^ buf[j][1].x ^ buf[j][1].w;
        const int q = p + 8 * ahead;
        if (q < passes) {
          buf[j][0] = ld_stream(r0 + 4 * q);
          buf[j][1] = ld_stream(r1 + 4 * q);
        }
      }
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

// The same block of 16 rows read row-major: each warp instruction 512
// contiguous bytes of one row.
__global__ void __launch_bounds__(256, 3) row_pattern(const uint4* w, int row_chunks, uint32_t* out) {
  const uint4* block = w + int64_t(blockIdx.x * 16) * row_chunks;
  const int total = 16 * row_chunks;
  uint32_t acc = 0;
  for (int i = threadIdx.x; i < total; i += 512) {
    const uint4 a = ld_stream(block + i);
    uint4 b = make_uint4(0, 0, 0, 0);
    if (i + 256 < total) b = ld_stream(block + i + 256);
    acc ^= a.x ^ a.w ^ b.x ^ b.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__global__ void stream_all(const uint4* d, int64_t n, uint32_t* out) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = ld_stream(d + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
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
    auto report = [&](const char* name, double us) {
      std::printf("%5d rows x %5d B  %-22s %8.2f us  %6.0f GB/s\n", N, row_bytes, name, us, bytes / us / 1e3);
    };
    report("qmv pattern, 1 ahead", time_us([&] { for (int i = 0; i < copies; ++i) qmv_pattern<1><<<N / 16, 256>>>((const uint4*)(pool + i * bytes), row_chunks, out); }, copies));
    report("qmv pattern, 2 ahead", time_us([&] { for (int i = 0; i < copies; ++i) qmv_pattern<2><<<N / 16, 256>>>((const uint4*)(pool + i * bytes), row_chunks, out); }, copies));
    report("qmv pattern, 4 ahead", time_us([&] { for (int i = 0; i < copies; ++i) qmv_pattern<4><<<N / 16, 256>>>((const uint4*)(pool + i * bytes), row_chunks, out); }, copies));
    report("row-major blocks", time_us([&] { for (int i = 0; i < copies; ++i) row_pattern<<<N / 16, 256>>>((const uint4*)(pool + i * bytes), row_chunks, out); }, copies));
    report("stream, grid 8/SM", time_us([&] { for (int i = 0; i < copies; ++i) stream_all<<<sms * 8, 256>>>((const uint4*)(pool + i * bytes), bytes / 16, out); }, copies));
    report("stream, 1 thread/16B", time_us([&] { for (int i = 0; i < copies; ++i) stream_all<<<int(bytes / 16 / 256), 256>>>((const uint4*)(pool + i * bytes), bytes / 16, out); }, copies));
  }
  return 0;
}
