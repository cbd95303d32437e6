# What the extension compiles, per platform. CMakeLists.txt builds from these
# lists and tests/test_macos_build.py type-checks the macOS build from them, so
# a new source cannot escape the check. Keep each set() a plain list.

set(FPQMM_SOURCES
  csrc/bindings.cpp
  csrc/ops.cpp
  csrc/primitives.cpp
  csrc/cpu/blas.cpp
  csrc/cpu/gather.cpp
  csrc/cpu/kernels.cpp
  csrc/cpu/primitives.cpp
  csrc/cpu/qmm.cpp
  csrc/cpu/thread_pool.cpp
  csrc/metal/bindings.cpp
  csrc/metal/plan.cpp
  csrc/metal/primitives.cpp
  csrc/metal/problem.cpp)
set(FPQMM_INCLUDE_DIRS csrc metal)
set(FPQMM_COMPILE_OPTIONS -fopenmp-simd)

# CPU kernels: one file per ISA with its own flags; the code picks one at run
# time from the CPU's features. NEON is part of the arm64 baseline.
set(FPQMM_X86_64_SOURCES csrc/cpu/avx2.cpp csrc/cpu/avx512.cpp)
set(FPQMM_ARM64_SOURCES csrc/cpu/neon.cpp)

# macOS: Accelerate's CBLAS (the ILP32 interface of macOS 13.3+).
set(FPQMM_APPLE_DEFINITIONS MLX_FPQMM_ACCELERATE ACCELERATE_NEW_LAPACK)

# The metallibs' deployment targets: 14.0 is MLX's floor and gives Metal 3.1
# (bfloat); the NAX kernels need Metal 4.0 (macOS 26.2).
set(FPQMM_METAL_DEPLOYMENT_TARGET 14.0)
set(FPQMM_NAX_DEPLOYMENT_TARGET 26.2)
