# What the extension compiles, per platform. CMakeLists.txt builds from these
# lists and tests/test_macos_build.py type-checks the macOS build from them, so
# a new source cannot escape the check. Keep each set() a plain list.

set(FPQMM_SOURCES
  csrc/python/bindings.cpp
  csrc/python/kernel_path.cpp
  csrc/ops/checks.cpp
  csrc/ops/gather.cpp
  csrc/ops/qmm.cpp
  csrc/ops/quantize.cpp
  csrc/primitives/primitives.cpp
  csrc/backend/common/problem.cpp
  csrc/backend/cuda/plan.cpp
  csrc/backend/cpu/blas.cpp
  csrc/backend/cpu/gather.cpp
  csrc/backend/cpu/in_flight.cpp
  csrc/backend/cpu/kernels.cpp
  csrc/backend/cpu/primitives.cpp
  csrc/backend/cpu/qmm.cpp
  csrc/backend/cpu/thread_pool.cpp
  csrc/backend/metal/device.cpp
  csrc/backend/metal/plan.cpp
  csrc/backend/metal/primitives.cpp
  csrc/backend/no_gpu/primitives.cpp)
set(FPQMM_INCLUDE_DIRS csrc)
set(FPQMM_COMPILE_OPTIONS -fopenmp-simd)

# CPU kernels: one file per ISA with its own flags; the code picks one at run
# time from the CPU's features. NEON is part of the arm64 baseline.
set(FPQMM_X86_64_SOURCES csrc/backend/cpu/avx2.cpp csrc/backend/cpu/avx512.cpp)
set(FPQMM_ARM64_SOURCES csrc/backend/cpu/neon.cpp)

# macOS: Accelerate's CBLAS (the ILP32 interface of macOS 13.3+).
set(FPQMM_APPLE_DEFINITIONS MLX_FPQMM_ACCELERATE ACCELERATE_NEW_LAPACK)

# The metallibs' deployment targets: 14.0 is MLX's floor and gives Metal 3.1
# (bfloat); the NAX kernels need Metal 4.0 (macOS 26.2).
set(FPQMM_METAL_DEPLOYMENT_TARGET 14.0)
set(FPQMM_NAX_DEPLOYMENT_TARGET 26.2)

# CUDA (an MLX built for CUDA, cmake/cuda.cmake): eval_gpu and its kernels.
# tests/test_cuda_build.py compiles each with nvcc against MLX's CUDA headers
# (the mlx-cuda-13 wheel) where no GPU is, with these flags. MLX's CUDA
# headers include <fmt/format.h>, which no wheel ships: a stand-in.
set(FPQMM_CUDA_SOURCES
  csrc/backend/cuda/primitives.cu
  csrc/backend/cuda/device_memory.cu
  csrc/backend/cuda/table.cu
  csrc/backend/cuda/instantiations/e2m1_bfloat16.cu
  csrc/backend/cuda/instantiations/e2m1_float16.cu
  csrc/backend/cuda/instantiations/e2m1_float32.cu
  csrc/backend/cuda/instantiations/e4m3_bfloat16.cu
  csrc/backend/cuda/instantiations/e4m3_float16.cu
  csrc/backend/cuda/instantiations/e4m3_float32.cu)
# sm_80 (Ampere, Ada) and sm_90a (Hopper) machine code, and compute_90 PTX
# that the driver compiles for newer GPUs (Blackwell: sm_100, sm_120, GB10's
# sm_121).
set(FPQMM_CUDA_ARCHITECTURES 80-real 90a-real 90-virtual)
set(FPQMM_CUDA_FLAGS --expt-relaxed-constexpr --diag-suppress=997)
set(FPQMM_CUDA_FMT_SHIM csrc/backend/cuda/fmt_shim)
