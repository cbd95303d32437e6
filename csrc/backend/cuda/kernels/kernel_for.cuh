// The kernel instantiations of one x type and code width, as function
// pointers: kernel_for<T, bits> is explicitly instantiated once per pair in
// backend/cuda/instantiations/ (six translation units that compile in
// parallel), and table.cu picks among them.
#pragma once

#include <type_traits>

#include "backend/cuda/kernels/fp_dequantize.cuh"
#include "backend/cuda/kernels/fp_qmm.cuh"
#include "backend/cuda/kernels/fp_qmm_wgmma.cuh"
#include "backend/cuda/kernels/fp_qmv.cuh"
#include "backend/cuda/kernels/fp_qmv_staged.cuh"
#include "backend/cuda/kernels/fp_qvm.cuh"
#include "backend/cuda/table.h"

namespace fpqmm::cuda {

template <int value>
using Int = std::integral_constant<int, value>;

template <typename F>
void with_encoding(ScaleEncoding encoding, F&& f) {
  switch (encoding) {
    case ScaleEncoding::e8m0:
      return f(Int<kScaleE8M0>{});
    case ScaleEncoding::e4m3:
      return f(Int<kScaleE4M3>{});
    case ScaleEncoding::float32:
      return f(Int<kScaleFloat32>{});
    case ScaleEncoding::float16:
      return f(Int<kScaleFloat16>{});
    case ScaleEncoding::bfloat16:
      return f(Int<kScaleBFloat16>{});
  }
}

// The decode kernels' x blocks: 1 or kMaxXBlocks, and kSimpleXBlocks where
// `simple` (fp_qmv and fp_qmv_cluster for x of one part; nothing is called
// for others).
template <bool simple = false, typename F>
void with_qmv_x_blocks(int x_blocks, F&& f) {
  if (x_blocks == 1) {
    f(Int<1>{});
  } else if (x_blocks == kMaxXBlocks) {
    f(Int<kMaxXBlocks>{});
  } else if constexpr (simple) {
    if (x_blocks == kSimpleXBlocks) {
      f(Int<kSimpleXBlocks>{});
    }
  }
}

// fp_qmm's x blocks: 4 or 8 (nothing is called for others).
template <typename F>
void with_qmm_x_blocks(int x_blocks, F&& f) {
  if (x_blocks == kQmmSmallXBlocks) {
    f(Int<kQmmSmallXBlocks>{});
  } else if (x_blocks == kQmmLargeXBlocks) {
    f(Int<kQmmLargeXBlocks>{});
  }
}

// fp_qmm_wgmma's tiles of 64 W rows per warpgroup: 1 or 2.
template <typename F>
void with_wgmma_tiles(int tiles, F&& f) {
  if (tiles == 1) {
    f(Int<1>{});
  } else if (tiles == 2) {
    f(Int<2>{});
  }
}

// fp_qmm_wgmma's rows of x a block (x_blocks of 8): kWgmmaFewestXRows,
// kWgmmaFewXRows or kWgmmaXRows, and kWgmmaWideXRows with one tile of W.
template <int tiles, typename F>
void with_wgmma_x_rows(int x_blocks, F&& f) {
  if (x_blocks * kXBlockRows == kWgmmaFewestXRows) {
    f(Int<kWgmmaFewestXRows>{});
  } else if (x_blocks * kXBlockRows == kWgmmaFewXRows) {
    f(Int<kWgmmaFewXRows>{});
  } else if (x_blocks * kXBlockRows == kWgmmaXRows) {
    f(Int<kWgmmaXRows>{});
  } else if constexpr (tiles == 1) {
    if (x_blocks * kXBlockRows == kWgmmaWideXRows) {
      f(Int<kWgmmaWideXRows>{});
    }
  }
}

// fp_qmv, fp_qmv_wide, fp_qmv_cluster, fp_qmv_grouped, fp_qmv_staged,
// fp_qvm, fp_qmm, fp_qmm_grouped, fp_qmm_wgmma(_grouped) or fp_dequantize
// for `key` (of x type T and `bits`-wide codes); null for E4M3 scales with E4M3
// codes, which no format has, for fp_qmm_wgmma with float16 x, for fp_qmm and
// fp_qmm_wgmma with float32 x and float scales, and for fp_qmm_grouped and
// fp_qmm_wgmma_grouped with float32 x. fp_qmm and fp_qmm_wgmma for float32 x
// multiply its bfloat16 parts (plan_x_parts) and add each row's two as they
// store y.
template <typename T, int bits>
const void* kernel_for(const mlx_fpqmm::cuda::KernelKey& key) {
  const void* kernel = nullptr;
  with_encoding(key.encoding, [&](auto encoding) {
    if constexpr (bits == 4 || encoding != kScaleE4M3) {
      using mlx_fpqmm::cuda::KernelFamily;
      switch (key.family) {
        case KernelFamily::qvm:
          kernel = reinterpret_cast<const void*>(&fp_qvm<T, bits, encoding>);
          break;
        case KernelFamily::qmv_staged:
          with_qmv_x_blocks(key.x_blocks, [&](auto x_blocks) {
            kernel = reinterpret_cast<const void*>(
                &fp_qmv_staged<T, bits, encoding, x_blocks>);
          });
          break;
        case KernelFamily::qmv:
          with_qmv_x_blocks<kOneXPart<T, bits, encoding>>(
              key.x_blocks, [&](auto x_blocks) {
                kernel = reinterpret_cast<const void*>(
                    &fp_qmv<T, bits, encoding, x_blocks>);
              });
          break;
        case KernelFamily::qmv_wide:
          with_qmv_x_blocks(key.x_blocks, [&](auto x_blocks) {
            kernel = reinterpret_cast<const void*>(
                &fp_qmv_wide<T, bits, encoding, x_blocks>);
          });
          break;
        case KernelFamily::qmv_grouped:
          with_qmv_x_blocks(key.x_blocks, [&](auto x_blocks) {
            kernel = reinterpret_cast<const void*>(
                &fp_qmv_grouped<T, bits, encoding, x_blocks>);
          });
          break;
        case KernelFamily::dequantize:
          kernel =
              reinterpret_cast<const void*>(&fp_dequantize<T, bits, encoding>);
          break;
        case KernelFamily::qmm:
        case KernelFamily::qmm_grouped:
          if constexpr (!std::is_same_v<T, float>) {
            with_qmm_x_blocks(key.x_blocks, [&](auto x_blocks) {
              kernel = key.family == KernelFamily::qmm
                           ? reinterpret_cast<const void*>(
                                 &fp_qmm<T, bits, encoding, x_blocks>)
                           : reinterpret_cast<const void*>(
                                 &fp_qmm_grouped<T, bits, encoding, x_blocks>);
            });
          } else if constexpr (kMlxScales<encoding>) {
            if (key.family == KernelFamily::qmm) {
              with_qmm_x_blocks(key.x_blocks, [&](auto x_blocks) {
                kernel = reinterpret_cast<const void*>(
                    &fp_qmm<__nv_bfloat16, bits, encoding, x_blocks, true>);
              });
            }
          }
          break;
        case KernelFamily::qmm_wgmma:
        case KernelFamily::qmm_wgmma_grouped:
          if constexpr (
              std::is_same_v<T, __nv_bfloat16> ||
              (std::is_same_v<T, float> && kMlxScales<encoding>)) {
            constexpr bool x_parts = std::is_same_v<T, float>;
            if (key.family == KernelFamily::qmm_wgmma_grouped) {
              if constexpr (!x_parts) {
                kernel = reinterpret_cast<const void*>(
                    &fp_qmm_wgmma_grouped<bits, encoding, 2>);
              }
            } else {
              with_wgmma_tiles(key.w_tiles, [&](auto tiles) {
                with_wgmma_x_rows<tiles>(key.x_blocks, [&](auto x_rows) {
                  kernel = reinterpret_cast<const void*>(
                      &fp_qmm_wgmma<bits, encoding, tiles, x_rows, x_parts>);
                });
              });
            }
          }
          break;
        case KernelFamily::qmv_cluster:
          with_qmv_x_blocks<kOneXPart<T, bits, encoding>>(
              key.x_blocks, [&](auto x_blocks) {
                kernel = reinterpret_cast<const void*>(
                    &fp_qmv_cluster<T, bits, encoding, x_blocks>);
              });
          break;
      }
    }
  });
  return kernel;
}

}  // namespace fpqmm::cuda
