// A lab, not a product kernel: y = x @ W^T for many rows of x (prefill)
// with W mxfp4 and bfloat16 x, on Hopper's warpgroup MMA (wgmma.mma_async,
// sm_90a), W decoded into the A registers ("RS": A from registers, B = x
// from shared memory). Correct (--test); its speed is in the README
// ("A wgmma lab"): not yet faster than the kernels the plan runs.
//
// Built and run on the GPU machine, from the repository root:
//   nvcc -O3 -std=c++20 -Icsrc -gencode arch=compute_90a,code=sm_90a \
//     tools/gpu/wgmma_lab.cu -o /tmp/wgmma_lab
//   /tmp/wgmma_lab --test && /tmp/wgmma_lab --bench [--no-decode]
//
// The decode is the project's (fp_decode.cuh, fp_qmv.cuh): a quad of lanes
// holds 64 contiguous bytes (128 codes) of each of a warp's W rows, lane t
// bytes [16t, 16t + 16), and step s of word w of that chunk feeds the A
// fragment with code pairs (p, p + 4) of the word exactly as multiply_word
// does. The K order this gives the mma is not the natural one; x is permuted
// once in device memory (permute_x) into that order, so that the B tiles
// can be plain K-major tiles in shared memory.
//
// K order (within each stage of 128 codes; the stages keep their order):
// step j = 2 w + s (w: word of the lane's 16 bytes, s: step of the word)
// takes the 16 codes k = 0..15 of the mma, where the A fragment of lane
// (g, t) holds k = 2t, 2t + 1 (registers a0, a1: rows g, g + 8) and
// 2t + 8, 2t + 9 (a2, a3). Lane t decodes its word w, pair p = 2s + q
// (q = k / 8) as codes p (low half, k even) and p + 4 (high half, k odd),
// natural codes 32t + 8w + p (+ 4).
// So permuted position 16 j + k holds natural code
//   natural_code(j, k) = 32 (k % 8 / 2) + 8 (j / 2) + 2 (j % 2) + k / 8
//                        + 4 (k % 2).
//
// x's tile in shared memory: K-major without swizzle, core matrices of 8 x
// rows x 8 values (128 contiguous bytes), the 16 core matrices of a stage's
// 8 rows 2 KiB contiguous: descriptor LBO (next core matrix along K) 128
// bytes, SBO (next 8 rows) 2048 bytes; step j starts 256 j bytes in.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/kernels/fp_qmm.cuh"

namespace lab {

using namespace fpqmm::cuda;
using fpqmm::kScaleE8M0;
using bf16 = __nv_bfloat16;

// A stage: a quad of lanes' 64 bytes of a W row, in wgmma k16 steps.
constexpr int kPassCodes = 128;
constexpr int kSteps = kPassCodes / 16;
constexpr int kWRowBytes = kPassCodes / 2;
// wgmma steps in flight, each with its A fragments in registers: 2 is what
// the README's timings ran; 4 and 8 compile without ptxas serializing the
// wgmmas (not yet run).
constexpr int kInFlight = 2;
static_assert(kSteps % kInFlight == 0);

__host__ __device__ constexpr int natural_code(int step, int k) {
  return 32 * (k % 8 / 2) + 8 * (step / 2) + 2 * (step % 2) + k / 8 +
         4 * (k % 2);
}

// ---------------------------------------------------------------------------
// wgmma and its shared-memory descriptor.

// A K-major tile without swizzle: 8 rows x 16 bytes "core matrices", each
// 128 contiguous bytes; `lbo` is the distance between core matrices
// adjacent in K, `sbo` between core matrices adjacent in rows (N). Bits:
// start >> 4 at 0, lbo >> 4 at 16, sbo >> 4 at 32, layout type 0 (no
// swizzle) at 62, base offset 0.
__device__ __forceinline__ uint64_t
kmajor_descriptor(uint32_t shared_address, uint32_t lbo, uint32_t sbo) {
  return uint64_t((shared_address >> 4) & 0x3FFF) |
         uint64_t((lbo >> 4) & 0x3FFF) << 16 |
         uint64_t((sbo >> 4) & 0x3FFF) << 32;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}
// Keeps the compiler from moving accesses of accumulators across the
// asynchronous wgmma region (the asm statements claim them as done).
template <int n>
__device__ __forceinline__ void fence_registers(float (&d)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) {
    asm volatile("" : "+f"(d[i])::"memory");
  }
}
// cp.async's writes (generic proxy) made visible to wgmma's reads of shared
// memory (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d (64 x 128, float32) = a (64 x 16 bfloat16, registers) * b (16 x 128,
// K-major in shared memory at descriptor `b`) + (accumulate ? d : 0). One
// shape only: inline asm takes its operand lists as literal strings.
struct Wgmma {
  __device__ __forceinline__ static void mma(
      float (&d)[64], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63"
        "}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]),
          "+f"(d[1]),
          "+f"(d[2]),
          "+f"(d[3]),
          "+f"(d[4]),
          "+f"(d[5]),
          "+f"(d[6]),
          "+f"(d[7]),
          "+f"(d[8]),
          "+f"(d[9]),
          "+f"(d[10]),
          "+f"(d[11]),
          "+f"(d[12]),
          "+f"(d[13]),
          "+f"(d[14]),
          "+f"(d[15]),
          "+f"(d[16]),
          "+f"(d[17]),
          "+f"(d[18]),
          "+f"(d[19]),
          "+f"(d[20]),
          "+f"(d[21]),
          "+f"(d[22]),
          "+f"(d[23]),
          "+f"(d[24]),
          "+f"(d[25]),
          "+f"(d[26]),
          "+f"(d[27]),
          "+f"(d[28]),
          "+f"(d[29]),
          "+f"(d[30]),
          "+f"(d[31]),
          "+f"(d[32]),
          "+f"(d[33]),
          "+f"(d[34]),
          "+f"(d[35]),
          "+f"(d[36]),
          "+f"(d[37]),
          "+f"(d[38]),
          "+f"(d[39]),
          "+f"(d[40]),
          "+f"(d[41]),
          "+f"(d[42]),
          "+f"(d[43]),
          "+f"(d[44]),
          "+f"(d[45]),
          "+f"(d[46]),
          "+f"(d[47]),
          "+f"(d[48]),
          "+f"(d[49]),
          "+f"(d[50]),
          "+f"(d[51]),
          "+f"(d[52]),
          "+f"(d[53]),
          "+f"(d[54]),
          "+f"(d[55]),
          "+f"(d[56]),
          "+f"(d[57]),
          "+f"(d[58]),
          "+f"(d[59]),
          "+f"(d[60]),
          "+f"(d[61]),
          "+f"(d[62]),
          "+f"(d[63])
        : "r"(a[0]),
          "r"(a[1]),
          "r"(a[2]),
          "r"(a[3]),
          "l"(b),
          "r"(int(accumulate)));
  }
};

// ---------------------------------------------------------------------------
// The kernel.

// A block: `warpgroups` warpgroups, each owning `tiles` tiles of 64 W rows
// (rows = 64 * warpgroups * tiles), times bn = 128 rows of x (Wgmma's N);
// `stages` slots of shared memory, loads kept `stages - 2` stages ahead (one
// slot of slack: the last wgmma of the previous stage may still read its slot).
template <int warpgroups_, int tiles_, int stages_>
struct Config {
  static constexpr int warpgroups = warpgroups_;
  static constexpr int tiles = tiles_;
  static constexpr int bn = 128;
  static constexpr int stages = stages_;
  static constexpr int ahead = stages - 2;
  static constexpr int threads = 128 * warpgroups;
  static constexpr int bm = 64 * warpgroups * tiles;
  // Stage: x (bn rows x 128 values: 16-byte units, 8 rows of a unit
  // column = a core matrix, the 16 columns of 8 rows = 2 KiB contiguous),
  // W (bm rows x 64 bytes), scales (bm words: a row's 4 group bytes).
  static constexpr int x_group_bytes = 8 * kPassCodes * 2;  // sbo
  static constexpr int x_bytes = bn * kPassCodes * 2;
  static constexpr int w_offset = x_bytes;
  static constexpr int scales_offset = w_offset + bm * kWRowBytes;
  static constexpr int stage_bytes = scales_offset + bm * 4;
  // The output tile, staged for coalesced stores: bn rows of bm values,
  // padded by 16 bytes against bank conflicts.
  static constexpr int out_pitch = bm * 2 + 16;
  static constexpr int out_bytes = bn * out_pitch;
  static constexpr int shared_bytes = std::max(stages * stage_bytes, out_bytes);
  static constexpr int acc = bn / 2;  // accumulators per thread and tile
  static_assert(ahead >= 1);
  static_assert(shared_bytes <= 227 * 1024);
  static_assert(bm <= threads);  // a thread copies a row's scale word
};

// y (M x N) = x (M x K, permuted by permute_x) @ W^T, W (N x K) mxfp4 with
// E8M0 scales (N x K / 32). K a multiple of 128, N of 8; x, W 16-byte
// aligned. Block (blockIdx.x, blockIdx.y): W rows from blockIdx.x * bm,
// x rows from blockIdx.y * bn. decode_w false (an instrument): the A
// fragments are W's code words as they are (masked to finite bfloat16
// values), no decode, to time the rest of the kernel.
template <typename C>
__global__ void __launch_bounds__(C::threads, 1) wg_qmm(
    const uint32_t* __restrict__ w,
    const uint8_t* __restrict__ scales,
    const bf16* __restrict__ xp,
    bf16* __restrict__ y,
    int M,
    int N,
    int K,
    bool decode_w) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // wgmma is sm_90a's: other targets (the CUDA build test compiles them all)
  // get a kernel that traps: the lab runs only from an sm_90a build.
  __trap();
#else
  extern __shared__ __align__(128) uint8_t shared[];
  const int n0 = blockIdx.x * C::bm;
  const int m0 = blockIdx.y * C::bn;
  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32 % 4;  // in the warpgroup
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int stage_count = K / kPassCodes;
  const int64_t w_row_bytes = K / 2;
  const int scales_per_row = K / 32;
  const auto* w_bytes = reinterpret_cast<const uint8_t*>(w);

  // Copies: unit u of a stage's x is row 8 (u / 128) + u % 8, column
  // u / 8 % 16, at byte 16 u (core-matrix order); unit u of W is row u / 4,
  // bytes 16 (u % 4).
  auto issue = [&](int stage) {
    uint8_t* slot = shared + stage % C::stages * C::stage_bytes;
    const int k0 = stage * kPassCodes;
#pragma unroll
    for (int c = 0; c < C::bn * 16 / C::threads; ++c) {
      const int u = threadIdx.x + c * C::threads;
      const int m = m0 + u / 128 * 8 + u % 8;
      const bool in = m < M;
      copy_async<16>(
          slot + 16 * u,
          in ? xp + int64_t(m) * K + k0 + u / 8 % 16 * 8 : xp,
          in ? 16 : 0);
    }
#pragma unroll
    for (int c = 0; c < C::bm * 4 / C::threads; ++c) {
      const int u = threadIdx.x + c * C::threads;
      const int n = n0 + u / 4;
      const bool in = n < N;
      copy_async<16>(
          slot + C::w_offset + 16 * u,
          in ? w_bytes + n * w_row_bytes + k0 / 2 + u % 4 * 16 : w_bytes,
          in ? 16 : 0);
    }
    if (threadIdx.x < C::bm) {
      const int n = n0 + threadIdx.x;
      const bool in = n < N;
      copy_async<4>(
          slot + C::scales_offset + 4 * threadIdx.x,
          in ? scales + int64_t(n) * scales_per_row + k0 / 32 : scales,
          in ? 4 : 0);
    }
  };

  // Set by the first wgmma (scale-d 0): defining them with other
  // instructions would make ptxas serialize the wgmmas (C7515).
  float acc[C::tiles][C::acc];
  // The A fragments of kInFlight steps: those of the wgmmas in flight and
  // the one being decoded.
  uint32_t a[kInFlight][C::tiles][4];
  // This lane's W rows in the block: tile i, half h.
  auto w_row = [&](int i, int h) {
    return (warpgroup * C::tiles + i) * 64 + warp * 16 + h * 8 + g;
  };

#pragma unroll
  for (int s = 0; s < C::ahead; ++s) {
    if (s < stage_count) {
      issue(s);
    }
    commit_async();
  }
  for (int s = 0; s < stage_count; ++s) {
    wait_async<C::ahead - 1>();
    fence_proxy_async();
    // Stage s has landed for every thread, and every warpgroup has at most
    // kInFlight - 1 (< kSteps) steps of stage s - 1 in flight, hence is done
    // with stage s - 2, whose slot the next copies fill.
    __syncthreads();
    if (s + C::ahead < stage_count) {
      issue(s + C::ahead);
    }
    commit_async();

    const uint8_t* slot = shared + s % C::stages * C::stage_bytes;
    uint4 codes[C::tiles][2];
    Multipliers multipliers[C::tiles][2];
    bool two = false;
#pragma unroll
    for (int i = 0; i < C::tiles; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = w_row(i, h);
        codes[i][h] = *reinterpret_cast<const uint4*>(
            slot + C::w_offset + row * kWRowBytes + t * 16);
        // The lane's 32 codes are group t of the stage.
        const float scale = decode_e8m0(slot[C::scales_offset + row * 4 + t]);
        two |= needs_two_steps<4, kScaleE8M0>(scale);
        multipliers[i][h] = two_step_multipliers<4, kScaleE8M0>(scale);
      }
    }
    // The warp decodes in two multiplies where any of its lanes needs them
    // (warp-uniform; the wgmma stays outside the branch).
    two = __any_sync(0xFFFFFFFFu, two);

    const uint64_t descriptor = kmajor_descriptor(
        static_cast<uint32_t>(__cvta_generic_to_shared(slot)),
        128,
        C::x_group_bytes);
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      uint32_t(&aj)[C::tiles][4] = a[j % kInFlight];
      auto decode = [&](auto two_constant) {
        constexpr bool two_steps = decltype(two_constant)::value;
#pragma unroll
        for (int i = 0; i < C::tiles; ++i) {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t word =
                  reinterpret_cast<const uint32_t*>(&codes[i][h])[j / 2];
              Bf16Pair pair = __hmul2(
                  pair_from_bits<Bf16Pair>(
                      code_pair_bits<bf16, 4>(word, 2 * (j % 2) + q)),
                  pair_from_bits<Bf16Pair>(multipliers[i][h].first));
              if constexpr (two_steps) {
                pair = __hmul2(
                    pair, pair_from_bits<Bf16Pair>(multipliers[i][h].second));
              }
              aj[i][2 * q + h] = bits_of(pair);
            }
          }
        }
      };
      if (!decode_w) {
#pragma unroll
        for (int i = 0; i < C::tiles; ++i) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            aj[i][r] =
                reinterpret_cast<const uint32_t*>(&codes[i][r / 2])[j / 2] &
                0x3F803F80u;
          }
        }
      } else if (two) {
        decode(std::true_type{});
      } else {
        decode(std::false_type{});
      }
      // Step j's x: core-matrix columns 2j, 2j + 1 (256 bytes on).
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < C::tiles; ++i) {
        fence_registers(acc[i]);
        Wgmma::mma(
            acc[i], aj[i], descriptor + uint64_t(16 * j), s > 0 || j > 0);
        fence_registers(acc[i]);
      }
      wgmma_commit();
      // Step j + 1 - kInFlight is done: its A registers (decoded next)
      // are free. The last step waits for every wgmma: ptxas moved the
      // epilogue's reads of the accumulators above a wait that followed the
      // loop.
      if (s == stage_count - 1 && j == kSteps - 1) {
        wgmma_wait<0>();
      } else {
        wgmma_wait<kInFlight - 1>();
      }
      // That step's A registers stay allocated until the wait that retires
      // its wgmma: the compiler cannot know that the wgmma reads them late.
#pragma unroll
      for (int i = 0; i < C::tiles; ++i) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          asm volatile("" : "+r"(a[(j + 1) % kInFlight][i][r])::"memory");
        }
      }
    }
  }
  // (Already done by the loop's last step. Without this wait ptxas injects
  // one of its own for the epilogue's reads, C7517, and schedules the loop
  // differently from the code that was timed.)
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < C::tiles; ++i) {
    fence_registers(acc[i]);
  }
  wait_async<0>();
  __syncthreads();

  // Epilogue: accumulator e = 4 c8 + r of tile i is W row w_row(i, r / 2),
  // x row 8 c8 + 2t + r % 2; through shared memory for whole 16-byte rows
  // of y.
  auto* out = reinterpret_cast<bf16*>(shared);
#pragma unroll
  for (int i = 0; i < C::tiles; ++i) {
#pragma unroll
    for (int e = 0; e < C::acc; ++e) {
      const int m = e / 4 * 8 + 2 * t + e % 2;
      const int n = w_row(i, e % 4 / 2);
      out[m * (C::out_pitch / 2) + n] = __float2bfloat16_rn(acc[i][e]);
    }
  }
  __syncthreads();
  constexpr int row_units = C::bm / 8;
  for (int u = threadIdx.x; u < C::bn * row_units; u += C::threads) {
    const int m = u / row_units;
    const int n = u % row_units * 8;
    if (m0 + m < M) {
      const uint4 v = *reinterpret_cast<const uint4*>(
          reinterpret_cast<const uint8_t*>(out) + m * C::out_pitch + n * 2);
      bf16* to = y + int64_t(m0 + m) * N + n0 + n;
      if (n0 + n + 8 <= N) {
        *reinterpret_cast<uint4*>(to) = v;
      }
    }
  }
#endif
}

// x (M x K) -> xp in the mma's K order: a block of 256 threads permutes 16
// chunks of 128 values (a thread one 16-byte unit in, one out).
__global__ void __launch_bounds__(256) permute_x(
    const bf16* __restrict__ x, bf16* __restrict__ xp, int64_t chunks) {
  __shared__ uint4 tile[256];
  const int64_t first_chunk = int64_t(blockIdx.x) * 16;
  const int64_t unit = first_chunk * 16 + threadIdx.x;
  const bool in = first_chunk + threadIdx.x / 16 < chunks;
  if (in) {
    tile[threadIdx.x] = reinterpret_cast<const uint4*>(x)[unit];
  }
  __syncthreads();
  if (in) {
    const auto* values =
        reinterpret_cast<const bf16*>(tile) + threadIdx.x / 16 * 128;
    const int j = threadIdx.x % 16 / 2;
    const int k8 = threadIdx.x % 2 * 8;
    alignas(16) bf16 v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[k] = values[natural_code(j, k8 + k)];
    }
    reinterpret_cast<uint4*>(xp)[unit] = *reinterpret_cast<const uint4*>(v);
  }
}

}  // namespace lab

// ---------------------------------------------------------------------------
// Host.

using namespace lab;

#define CHECK(call)                \
  do {                             \
    cudaError_t e_ = (call);       \
    if (e_ != cudaSuccess) {       \
      std::fprintf(                \
          stderr,                  \
          "%s:%d: %s: %s\n",       \
          __FILE__,                \
          __LINE__,                \
          #call,                   \
          cudaGetErrorString(e_)); \
      std::exit(2);                \
    }                              \
  } while (0)

namespace {

float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
double e2m1_value(int code) {
  static const double magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8 ? -1 : 1) * magnitudes[code & 7];
}
double e8m0_value(int byte) {
  return byte == 0     ? std::ldexp(1.0, -127)
         : byte == 255 ? INFINITY
                       : std::ldexp(1.0, byte - 127);
}

// The permutation on the CPU, checked against the fragment layout itself:
// each lane's A values (multiply_word's decode: word w, pair p = 2s + q,
// low/high = codes p, p + 4) times the B values at the lane's k slots of
// permuted x must add up to the natural dot product.
bool check_permutation() {
  // A bijection on each stage.
  std::vector<int> seen(kPassCodes, 0);
  for (int j = 0; j < kSteps; ++j) {
    for (int k = 0; k < 16; ++k) {
      ++seen[natural_code(j, k)];
    }
  }
  for (int c = 0; c < kPassCodes; ++c) {
    if (seen[c] != 1) {
      std::printf("permutation: code %d taken %d times\n", c, seen[c]);
      return false;
    }
  }
  std::mt19937 rng(7);
  const int K = 512;
  std::vector<double> w(K), x(K), xp(K);
  for (int k = 0; k < K; ++k) {
    w[k] = e2m1_value(rng() % 16) * (1 + k % 3);
    x[k] = std::ldexp(double(rng() % 2001) - 1000, -(k % 7));
  }
  for (int k = 0; k < K; ++k) {
    xp[k] =
        x[k / kPassCodes * kPassCodes +
          natural_code(k % kPassCodes / 16, k % 16)];
  }
  double natural = 0, fragments = 0;
  for (int k = 0; k < K; ++k) {
    natural += w[k] * x[k];
  }
  for (int stage = 0; stage < K / kPassCodes; ++stage) {
    for (int j = 0; j < kSteps; ++j) {
      const int word = j / 2, s = j % 2;
      for (int t = 0; t < 4; ++t) {
        for (int q = 0; q < 2; ++q) {
          for (int half = 0; half < 2; ++half) {
            const int code = 32 * t + 8 * word + 2 * s + q + 4 * half;
            const int k = 2 * t + half + 8 * q;  // A/B fragment slot
            fragments += w[stage * kPassCodes + code] *
                         xp[stage * kPassCodes + 16 * j + k];
          }
        }
      }
    }
  }
  if (natural != fragments) {
    std::printf("permutation: dot %.17g vs %.17g\n", natural, fragments);
    return false;
  }
  return true;
}

struct Product {
  int M, N, K;
};

template <typename C>
void launch_qmm(
    const uint32_t* w,
    const uint8_t* s,
    const bf16* xp,
    bf16* y,
    int M,
    int N,
    int K,
    bool decode_w) {
  if (K <= 0 || K % kPassCodes != 0 || N % 8 != 0) {
    std::fprintf(
        stderr, "wg_qmm: K must be a positive multiple of 128, N of 8\n");
    std::exit(2);
  }
  static bool configured = false;
  if (!configured) {
    CHECK(cudaFuncSetAttribute(
        wg_qmm<C>,
        cudaFuncAttributeMaxDynamicSharedMemorySize,
        C::shared_bytes));
    configured = true;
  }
  const dim3 grid((N + C::bm - 1) / C::bm, (M + C::bn - 1) / C::bn);
  wg_qmm<C>
      <<<grid, C::threads, C::shared_bytes>>>(w, s, xp, y, M, N, K, decode_w);
}

void launch_permute(const bf16* x, bf16* xp, int M, int K) {
  const int64_t chunks = int64_t(M) * K / kPassCodes;
  permute_x<<<unsigned((chunks + 15) / 16), 256>>>(x, xp, chunks);
}

using Cfg128x128 = Config<2, 1, 5>;  // 128 W rows x 128 x rows
using Cfg256x128 = Config<2, 2, 4>;  // 256 W rows x 128 x rows

struct Kernel {
  const char* name;
  void (*launch)(
      const uint32_t*, const uint8_t*, const bf16*, bf16*, int, int, int, bool);
};
const Kernel kKernels[] = {
    {"wg 128x128 s5", launch_qmm<Cfg128x128>},
    {"wg 256x128 s4", launch_qmm<Cfg256x128>},
};

// ---- --test

bool run_test(const Product& p, std::mt19937_64& rng) {
  const int M = p.M, N = p.N, K = p.K;
  const int groups = K / 32;
  std::vector<uint32_t> w(size_t(N) * K / 8);
  std::vector<uint8_t> scales(size_t(N) * groups);
  std::vector<uint16_t> x(size_t(M) * K);
  for (auto& word : w) {
    word = uint32_t(rng());
  }
  for (auto& b : scales) {
    b = uint8_t(120 + rng() % 15);
  }
  // Extreme scales in some rows (one group each): tiny ones, and huge ones
  // whose codes are kept small enough for the sums to stay finite.
  const int extremes[4] = {0, 1, 250, 254};
  for (int n = 3; n < N; n += 37) {
    const int group = int(rng() % groups);
    const int byte = extremes[rng() % 4];
    scales[size_t(n) * groups + group] = uint8_t(byte);
    for (int c = 0; c < 32; ++c) {
      const size_t k = size_t(group) * 32 + c;
      uint32_t& word = w[(size_t(n) * K + k) / 8];
      const int shift = 4 * (k % 8);
      int code = (word >> shift) & 15;
      if (byte == 250) {
        code &= 0b1001;  // magnitudes 0, 0.5 -> |w| <= 2^122
      } else if (byte == 254) {
        code = c < 4 ? (code & 8) | 1 : 0;  // four codes of 0.5
      }
      word = (word & ~(15u << shift)) | uint32_t(code) << shift;
    }
  }
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (auto& v : x) {
    v = float_to_bf16(uniform(rng));
  }

  uint32_t* d_w;
  uint8_t* d_s;
  bf16 *d_x, *d_xp, *d_y;
  CHECK(cudaMalloc(&d_w, w.size() * 4));
  CHECK(cudaMalloc(&d_s, scales.size()));
  CHECK(cudaMalloc(&d_x, x.size() * 2));
  CHECK(cudaMalloc(&d_xp, x.size() * 2));
  CHECK(cudaMalloc(&d_y, size_t(M) * N * 2));
  CHECK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_s, scales.data(), scales.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  launch_permute(d_x, d_xp, M, K);
  CHECK(cudaGetLastError());

  // The device's permutation against the CPU's.
  std::vector<uint16_t> xp(x.size());
  CHECK(cudaMemcpy(xp.data(), d_xp, xp.size() * 2, cudaMemcpyDeviceToHost));
  size_t permute_errors = 0;
  for (size_t m = 0; m < size_t(M); ++m) {
    for (int k = 0; k < K; ++k) {
      const int natural = k / kPassCodes * kPassCodes +
                          natural_code(k % kPassCodes / 16, k % 16);
      permute_errors += xp[m * K + k] != x[m * K + natural];
    }
  }

  // Reference: float64 sums of the dequantized product.
  std::vector<double> wd(size_t(N) * K), xd(x.size());
  for (size_t n = 0; n < size_t(N); ++n) {
    for (int k = 0; k < K; ++k) {
      const int code = (w[(n * K + k) / 8] >> (4 * (k % 8))) & 15;
      wd[n * K + k] =
          e2m1_value(code) * e8m0_value(scales[n * groups + k / 32]);
    }
  }
  for (size_t i = 0; i < x.size(); ++i) {
    xd[i] = bf16_to_float(x[i]);
  }
  std::vector<double> ref(size_t(M) * N), bound(size_t(M) * N);
  {
    const int threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (int id = 0; id < threads; ++id) {
      pool.emplace_back([&, id] {
        for (int m = id; m < M; m += threads) {
          const double* xr = &xd[size_t(m) * K];
          for (int n = 0; n < N; ++n) {
            const double* wr = &wd[size_t(n) * K];
            double sum = 0, magnitude = 0;
            for (int k = 0; k < K; ++k) {
              sum += wr[k] * xr[k];
              magnitude += std::fabs(wr[k] * xr[k]);
            }
            ref[size_t(m) * N + n] = sum;
            bound[size_t(m) * N + n] = magnitude;
          }
        }
      });
    }
    for (auto& th : pool) {
      th.join();
    }
  }

  bool ok = permute_errors == 0;
  std::printf(
      "(M,N,K)=(%d,%d,%d): permute mismatches %zu\n", M, N, K, permute_errors);
  std::vector<uint16_t> y(size_t(M) * N);
  for (const Kernel& kernel : kKernels) {
    CHECK(cudaMemset(d_y, 0xFF, y.size() * 2));  // NaN: catches unwritten
    kernel.launch(d_w, d_s, d_xp, d_y, M, N, K, true);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(y.data(), d_y, y.size() * 2, cudaMemcpyDeviceToHost));
    size_t failures = 0;
    double max_error = 0, max_relative = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double got = bf16_to_float(y[i]);
      const double error = std::fabs(got - ref[i]);
      const double tolerance = std::ldexp(std::fabs(ref[i]), -7) +
                               1e-3 * bound[i] / std::sqrt(double(K));
      if (!(error <= tolerance)) {
        if (failures < 5) {
          std::printf(
              "  %s: y[%zu][%zu] = %g, reference %g\n",
              kernel.name,
              i / N,
              i % N,
              got,
              ref[i]);
        }
        ++failures;
      }
      if (error == error) {
        max_error = std::max(max_error, error);
        max_relative =
            std::max(max_relative, error / std::max(std::fabs(ref[i]), 1e-30));
      }
    }
    std::printf(
        "  %-14s max |error| %.3g, max relative %.3g, failures %zu\n",
        kernel.name,
        max_error,
        max_relative,
        failures);
    ok &= failures == 0;
  }
  CHECK(cudaFree(d_w));
  CHECK(cudaFree(d_s));
  CHECK(cudaFree(d_x));
  CHECK(cudaFree(d_xp));
  CHECK(cudaFree(d_y));
  return ok;
}

// ---- --bench

// Device-side random fill (hash of the index), so that a GiB of W is quick.
__global__ void fill_words(uint32_t* words, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h =
        uint32_t(i) * 0x9E3779B1u ^ seed ^ uint32_t(i >> 32) * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    words[i] = h;
  }
}
// Scale bytes 117..127 (scales below 1, as trained weights have them: the
// one-multiply decode).
__global__ void fill_scales(uint8_t* bytes, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 13;
    h *= 0x5BD1E995u;
    h ^= h >> 15;
    bytes[i] = uint8_t(117 + h % 11);
  }
}
// bfloat16 values in [-1, 1).
__global__ void fill_x(uint16_t* x, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    const float v = float(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    x[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}

template <typename Launch>
double median_us(int launches, Launch&& launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < std::min(launches, 3); ++i) {
    launch(i);  // warm-up
  }
  std::vector<double> times;
  for (int r = 0; r < 7; ++r) {
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < launches; ++i) {
      launch(i);
    }
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1000.0 * ms / launches);
  }
  CHECK(cudaGetLastError());
  std::sort(times.begin(), times.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return times[times.size() / 2];
}

void run_bench(bool decode_w) {
  const int shapes[][2] = {{14336, 4096}, {4096, 14336}, {4096, 4096}};
  const int rows[] = {128, 256, 512, 1024, 4096};
  std::printf(
      "%-14s %6s %6s %6s %10s %9s\n", "kernel", "M", "N", "K", "us", "TFLOP/s");
  for (const auto& shape : shapes) {
    const int N = shape[0], K = shape[1];
    const int64_t w_words = int64_t(N) * K / 8;
    const int64_t scale_bytes = int64_t(N) * K / 32;
    const int64_t copy_bytes = w_words * 4 + scale_bytes;
    const int copies = int((int64_t(1) << 30) / copy_bytes + 1);
    // One allocation per array: copy c at offset c * size (256-byte aligned
    // sizes here).
    uint32_t* d_w;
    uint8_t* d_s;
    CHECK(cudaMalloc(&d_w, w_words * 4 * copies));
    CHECK(cudaMalloc(&d_s, scale_bytes * copies));
    fill_words<<<1024, 256>>>(d_w, w_words * copies, 1234);
    fill_scales<<<1024, 256>>>(d_s, scale_bytes * copies, 99);
    for (int M : rows) {
      bf16 *d_x, *d_xp, *d_y;
      CHECK(cudaMalloc(&d_x, size_t(M) * K * 2));
      CHECK(cudaMalloc(&d_xp, size_t(M) * K * 2));
      CHECK(cudaMalloc(&d_y, size_t(M) * N * 2));
      fill_x<<<1024, 256>>>(
          reinterpret_cast<uint16_t*>(d_x), int64_t(M) * K, 5);
      CHECK(cudaDeviceSynchronize());
      const double flops = 2.0 * M * N * K;
      const double permute =
          median_us(20, [&](int) { launch_permute(d_x, d_xp, M, K); });
      std::printf(
          "%-14s %6d %6d %6d %10.1f %9s  (x %.1f MB)\n",
          "permute_x",
          M,
          N,
          K,
          permute,
          "-",
          M * K * 2 / 1e6);
      for (const Kernel& kernel : kKernels) {
        const double us = median_us(copies, [&](int i) {
          const int c = i % copies;
          kernel.launch(
              d_w + c * w_words,
              d_s + c * scale_bytes,
              d_xp,
              d_y,
              M,
              N,
              K,
              decode_w);
        });
        std::printf(
            "%-14s %6d %6d %6d %10.1f %9.1f\n",
            kernel.name,
            M,
            N,
            K,
            us,
            flops / us * 1e-6);
      }
      CHECK(cudaFree(d_x));
      CHECK(cudaFree(d_xp));
      CHECK(cudaFree(d_y));
    }
    CHECK(cudaFree(d_w));
    CHECK(cudaFree(d_s));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "--test";
  cudaDeviceProp properties;
  CHECK(cudaGetDeviceProperties(&properties, 0));
  if (properties.major != 9) {
    std::fprintf(stderr, "wgmma_lab needs an sm_90 GPU (Hopper)\n");
    return 2;
  }
  if (mode == "--test") {
    bool ok = check_permutation();
    std::printf("CPU permutation check: %s\n", ok ? "ok" : "FAILED");
    std::mt19937_64 rng(2024);
    const Product products[] = {
        {128, 256, 512},
        {200, 384, 1024},
        {64, 128, 128},
        {1, 136, 256},
        {4096, 1024, 4096}};
    for (const Product& p : products) {
      ok &= run_test(p, rng);
    }
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  }
  if (mode == "--bench") {
    run_bench(!(argc > 2 && std::string(argv[2]) == "--no-decode"));
    return 0;
  }
  std::fprintf(stderr, "usage: %s --test | --bench [--no-decode]\n", argv[0]);
  return 2;
}
