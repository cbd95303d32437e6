// The format facts every kernel reads, whatever its language: how scales are
// stored and nvfp4's global scale. Compiled as C++, as MSL (the Metal
// kernels) and as CUDA.
#pragma once

#ifdef __METAL_VERSION__
#define FPQMM_CONST constant constexpr
#else
#define FPQMM_CONST inline constexpr
#endif

namespace fpqmm {

// nvfp4's global scale g multiplies every decoded value by g / 2688
// (448 * 6, the E4M3 times the E2M1 maximum), as mx.dequantize does.
FPQMM_CONST float kNvfp4GlobalScaleDivisor = 2688.0f;

// How a weight matrix's scales are stored: E8M0 or E4M3 bytes, or floats.
// The one definition for the Metal kernels (the value of the scale-encoding
// function constant), the CPU kernels and the host code that picks it
// (mlx_fpqmm::scale_encoding in common/formats.h).
enum class ScaleEncoding : int {
  e8m0 = 0,
  e4m3 = 1,
  float32 = 2,
  float16 = 3,
  bfloat16 = 4,
};

// The same values as ints: function constants are ints, and the kernels
// compare the scale-encoding constant with these.
FPQMM_CONST int kScaleE8M0 = static_cast<int>(ScaleEncoding::e8m0);
FPQMM_CONST int kScaleE4M3 = static_cast<int>(ScaleEncoding::e4m3);
FPQMM_CONST int kScaleFloat32 = static_cast<int>(ScaleEncoding::float32);
FPQMM_CONST int kScaleFloat16 = static_cast<int>(ScaleEncoding::float16);
FPQMM_CONST int kScaleBFloat16 = static_cast<int>(ScaleEncoding::bfloat16);

// The group sizes that byte scales fix: E8M0 scales (the mx formats) cover 32
// codes, E4M3 scales (nvfp4) 16. Float scales take the product's.
FPQMM_CONST int kE8M0GroupSize = 32;
FPQMM_CONST int kE4M3GroupSize = 16;

}  // namespace fpqmm
