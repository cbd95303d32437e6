// Hopper (sm_90a) instructions that the wgmma kernel composes: warpgroup
// MMA with A from registers, shared-memory matrix descriptors, mbarriers
// and bulk copies. Only sm_90a has wgmma; other targets compile the
// callers' traps instead (FPQMM_SM90A).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FPQMM_SM90A 1
#else
#define FPQMM_SM90A 0
#endif

namespace fpqmm::cuda::sm90 {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A K-major tile without swizzle: "core matrices" of 8 rows x 16 bytes,
// each 128 contiguous bytes; `lbo` is the distance between core matrices
// adjacent in K, `sbo` between core matrices adjacent in rows. Bits: start
// >> 4 at 0, lbo >> 4 at 16, sbo >> 4 at 32, layout 0 (no swizzle) at 62.
__device__ __forceinline__ uint64_t
kmajor_descriptor(uint32_t address, uint32_t lbo, uint32_t sbo) {
  return uint64_t((address >> 4) & 0x3FFF) |
         uint64_t((lbo >> 4) & 0x3FFF) << 16 |
         uint64_t((sbo >> 4) & 0x3FFF) << 32;
}

__device__ __forceinline__ void wgmma_fence() {
#if FPQMM_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if FPQMM_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int pending>
__device__ __forceinline__ void wgmma_wait() {
#if FPQMM_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
#endif
}

// Keeps the compiler from moving accesses of registers across the
// asynchronous wgmma (which reads A and accumulates into d after the
// instruction issues).
template <int n>
__device__ __forceinline__ void fence_registers(float (&d)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) {
    asm volatile("" : "+f"(d[i])::"memory");
  }
}
template <int n>
__device__ __forceinline__ void fence_registers(uint32_t (&a)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) {
    asm volatile("" : "+r"(a[i])::"memory");
  }
}

// d (64 x n float32, the warpgroup's fragments) += a (64 x 16 bfloat16,
// registers) * b (16 x n bfloat16, K-major in shared memory), or = when
// `accumulate` is false; n is 32, 64 or 128. Inline asm takes its operands as a
// literal list: FPQMM_WGMMA_D8 names 8 of d, FPQMM_WGMMA_IN the inputs.
#define FPQMM_WGMMA_D8(i)                                                     \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FPQMM_WGMMA_IN \
  "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate))
template <int n>
__device__ __forceinline__ void wgmma_m64nk16(
    float (&d)[n / 2], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  static_assert(n == 32 || n == 64 || n == 128);
#if FPQMM_SM90A
  if constexpr (n == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
        "%15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "
        "%29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
        "%57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : FPQMM_WGMMA_D8(0),
          FPQMM_WGMMA_D8(8),
          FPQMM_WGMMA_D8(16),
          FPQMM_WGMMA_D8(24),
          FPQMM_WGMMA_D8(32),
          FPQMM_WGMMA_D8(40),
          FPQMM_WGMMA_D8(48),
          FPQMM_WGMMA_D8(56)
        : FPQMM_WGMMA_IN);
  } else if constexpr (n == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
        "%15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "
        "%29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : FPQMM_WGMMA_D8(0),
          FPQMM_WGMMA_D8(8),
          FPQMM_WGMMA_D8(16),
          FPQMM_WGMMA_D8(24)
        : FPQMM_WGMMA_IN);
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
        "%15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : FPQMM_WGMMA_D8(0), FPQMM_WGMMA_D8(8)
        : FPQMM_WGMMA_IN);
  }
#endif
}
#undef FPQMM_WGMMA_IN
#undef FPQMM_WGMMA_D8

// An mbarrier that one arrival (with the bytes it expects) and the bulk
// copies' completed bytes complete, phase by phase.
__device__ __forceinline__ void barrier_init(uint32_t barrier, int arrivals) {
#if FPQMM_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier),
               "r"(arrivals)
               : "memory");
#endif
}
__device__ __forceinline__ void barrier_init_fence() {
#if FPQMM_SM90A
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void barrier_expect(
    uint32_t barrier, uint32_t bytes) {
#if FPQMM_SM90A
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier),
      "r"(bytes)
      : "memory");
#endif
}
__device__ __forceinline__ void barrier_wait(
    uint32_t barrier, uint32_t parity) {
#if FPQMM_SM90A
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
#endif
}

// Orders this thread's earlier accesses of shared memory before later
// accesses by the async proxy (bulk copies, wgmma) of the same bytes.
__device__ __forceinline__ void fence_proxy_async() {
#if FPQMM_SM90A
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// `bytes` (a multiple of 16) from device memory to shared memory, both
// 16-byte aligned, by the copy engine; completes on `barrier`.
__device__ __forceinline__ void bulk_copy(
    uint32_t to, const void* from, uint32_t bytes, uint32_t barrier) {
#if FPQMM_SM90A
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1], %2, [%3];\n" ::"r"(to),
      "l"(from),
      "r"(bytes),
      "r"(barrier)
      : "memory");
#endif
}

}  // namespace fpqmm::cuda::sm90
