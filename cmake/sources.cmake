# What the extension compiles, per platform. CMakeLists.txt builds from these
# lists and tests/test_macos_build.py type-checks the macOS build from them, so
# a new source cannot escape the check. Keep each set() a plain list.

set(FPQMM_SOURCES
  csrc/python/bindings.cpp
  csrc/python/kernel_path.cpp
  csrc/ops/ops.cpp
  csrc/primitives/primitives.cpp
  csrc/backend/common/problem.cpp
  csrc/backend/cpu/blas.cpp
  csrc/backend/cpu/gather.cpp
  csrc/backend/cpu/kernels.cpp
  csrc/backend/cpu/primitives.cpp
  csrc/backend/cpu/qmm.cpp
  csrc/backend/cpu/thread_pool.cpp
  csrc/backend/metal/device.cpp
  csrc/backend/metal/plan.cpp
  csrc/backend/metal/primitives.cpp)
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
