# The CUDA backend's toolchain, for an MLX built for CUDA: nvcc (CUDACXX, PATH,
# or the nvidia-cuda-nvcc wheel beside MLX), the CUDA toolkit MLX's CMake
# package finds, and cuDNN's headers, which it asks for (the nvidia-cudnn-cu13
# wheel that mlx[cuda13] installs). Sets FPQMM_BUILD_CUDA.
set(FPQMM_BUILD_CUDA OFF)
if(NOT MLX_FPQMM_CUDA)
  message(STATUS "mlx_fpqmm: MLX_FPQMM_CUDA=OFF, CUDA streams raise an error")
  return()
endif()

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, nvidia; print(';'.join(os.path.join(p, d) for p in nvidia.__path__ for d in ('cu13', 'cudnn')))"
  OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE FPQMM_NVIDIA_WHEEL_DIRS
  ERROR_QUIET)
if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER)
  find_program(FPQMM_NVCC nvcc)
  if(NOT FPQMM_NVCC)
    foreach(dir ${FPQMM_NVIDIA_WHEEL_DIRS})
      if(EXISTS "${dir}/bin/nvcc")
        set(FPQMM_NVCC "${dir}/bin/nvcc")
      endif()
    endforeach()
  endif()
  if(NOT FPQMM_NVCC)
    message(FATAL_ERROR
      "mlx_fpqmm: MLX is its CUDA build but nvcc was not found (PATH, CUDACXX "
      "or the nvidia-cuda-nvcc wheel): install the CUDA 13 toolkit or "
      "`pip install 'nvidia-cuda-nvcc==13.0.*'`, or build without the CUDA "
      "kernels: pip install . -Ccmake.define.MLX_FPQMM_CUDA=OFF")
  endif()
  set(CMAKE_CUDA_COMPILER "${FPQMM_NVCC}")
endif()
foreach(dir ${FPQMM_NVIDIA_WHEEL_DIRS})
  if(EXISTS "${dir}/include/cudnn.h" AND NOT CUDNN_INCLUDE_PATH)
    set(CUDNN_INCLUDE_PATH "${dir}/include")
    set(CUDNN_LIBRARY_PATH "${dir}/lib")
  endif()
endforeach()

if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES ${FPQMM_CUDA_ARCHITECTURES})
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
enable_language(CUDA)
set(FPQMM_BUILD_CUDA ON)
