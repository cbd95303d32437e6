// y = x @ W^T for the decode range (and, tiled over M, beyond it): W (N, K)
// grouped along K, on the tensor cores. Each mma step multiplies 16 rows of
// W by 16 consecutive codes of K (so one group: every group size is a
// multiple of 16) with 8 rows of x, in float32: the group's partial sums
// are scaled in float32 once per group and row, as mx.dequantize then a
// float32 matmul would.
#pragma once

#include "backend/cuda/kernels/fp_mma.cuh"

namespace fpqmm::cuda {

// This thread's four codes of a step, as a word whose pairs 0 and 1 (codes
// 16 bits apart) are codes {0, 2} and {1, 3}. `row` is the step's first
// byte in a staged row of W.
template <int bits>
__device__ __forceinline__ uint32_t
step_codes(const uint8_t* row, FragmentLane lane) {
  if constexpr (bits == 4) {
    const uint32_t piece =
        *reinterpret_cast<const uint16_t*>(row + 2 * lane.thread);
    return __byte_perm(piece, 0, 0x4140);
  } else {
    return *reinterpret_cast<const uint32_t*>(row + 4 * lane.thread);
  }
}

// B fragments of one step for x rows [row, row + 8): the pairs of x at this
// thread's codes. float32 x is split into bfloat16 high and low parts, two
// mma steps whose sum keeps 16 of x's 24 significant bits (the codes are
// exact in bfloat16, the products and sums are float32); an infinite x has
// no low part.
template <typename T>
struct XFragment {
  static constexpr int parts = std::is_same_v<T, float> ? 2 : 1;
  uint32_t b[parts][2];
};

// Four values of x as loaded (one vector load), zero past M.
template <typename T>
using XLoad = std::conditional_t<std::is_same_v<T, float>, float4, uint2>;

template <typename T>
__device__ __forceinline__ XLoad<T> load_x(const T* x_row, bool valid) {
  return valid ? *reinterpret_cast<const XLoad<T>*>(x_row) : XLoad<T>{};
}

template <typename T>
__device__ __forceinline__ XFragment<T> x_fragment(const XLoad<T>& v) {
  XFragment<T> f;
  if constexpr (std::is_same_v<T, float>) {
    const float values[4] = {v.x, v.y, v.z, v.w};
    float low[4];
    __nv_bfloat16 high[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      high[i] = __float2bfloat16_rn(values[i]);
      const float rest = __bfloat162float(high[i]);
      low[i] = values[i] == rest ? 0.0f : values[i] - rest;
    }
    f.b[0][0] = bits_of(__halves2bfloat162(high[0], high[2]));
    f.b[0][1] = bits_of(__halves2bfloat162(high[1], high[3]));
    f.b[1][0] = bits_of(__floats2bfloat162_rn(low[0], low[2]));
    f.b[1][1] = bits_of(__floats2bfloat162_rn(low[1], low[3]));
  } else {
    f.b[0][0] = __byte_perm(v.x, v.y, 0x5410);
    f.b[0][1] = __byte_perm(v.x, v.y, 0x7632);
  }
  return f;
}

// A warp's staged block of W: kStagedRowsPerBlock rows of one stage's codes,
// then their scales.
template <int bits, typename S>
struct StageLayout {
  static constexpr int row_bytes = kStageCodes * bits / 8;
  static constexpr int row_stride = staged_row_bytes(bits);
  static constexpr int scales_offset = kStagedRowsPerBlock * row_stride;
  static constexpr int scales_stride = kStageGroups * sizeof(S);
  static constexpr int bytes = staged_stage_bytes(bits, sizeof(S));
};

// y rows [m0, m0 + x_blocks * 8) and W rows [n0, n0 + kStagedRowsPerBlock) over
// K range [k_begin, k_end) of one product; every warp of the block calls it
// and the block's partial sums end in `out` (y, or float32 partials with
// split K).
template <typename T, int bits, int encoding, int x_blocks>
__device__ __forceinline__ void fp_qmv_staged_impl(
    const QmmArgs& args,
    const Operands<T, encoding>& op,
    uint8_t* shared,
    int m0,
    int n0,
    int k_begin,
    int k_end,
    T* y,
    float* partials) {
  using H = typename MmaType<T>::type;
  using P = typename Pair<H>::type;
  using S = typename ScaleStorage<encoding>::type;
  using Layout = StageLayout<bits, S>;
  constexpr int tiles = kStagedTilesPerWarp;

  const int M = args.M;
  const int N = args.N;
  const int K = args.K;
  const int group_size = args.group_size;
  const int warp = threadIdx.x / kWarpSize;
  const int lane_index = threadIdx.x % kWarpSize;
  const FragmentLane lane = fragment_lane(lane_index);
  const int64_t w_row_bytes = int64_t(K) * bits / 8;
  const int64_t scales_per_row = K / group_size;
  uint8_t* stages = shared + warp * kStages * Layout::bytes;

  const int stage_count = (k_end - k_begin + kStageCodes - 1) / kStageCodes;
  const int my_stages =
      op.valid && warp < stage_count
          ? (stage_count - warp + kStagedWarps - 1) / kStagedWarps
          : 0;

  auto issue = [&](int j) {
    const int k0 = k_begin + (warp + j * kStagedWarps) * kStageCodes;
    const int codes = min(kStageCodes, k_end - k0);
    uint8_t* stage = stages + j % kStages * Layout::bytes;
    warp_copy_rows(
        stage,
        Layout::row_stride,
        reinterpret_cast<const uint8_t*>(op.w) + n0 * w_row_bytes +
            int64_t(k0) * bits / 8,
        w_row_bytes,
        kStagedRowsPerBlock,
        N - n0,
        Layout::row_bytes,
        codes * bits / 8,
        lane_index);
    warp_copy_rows(
        stage + Layout::scales_offset,
        Layout::scales_stride,
        reinterpret_cast<const uint8_t*>(
            op.scales + n0 * scales_per_row + k0 / group_size),
        scales_per_row * sizeof(S),
        kStagedRowsPerBlock,
        N - n0,
        kStageCodes / group_size * int(sizeof(S)),
        codes / group_size * int(sizeof(S)),
        lane_index);
  };

  float acc[tiles][x_blocks][4];
  fill_sums(acc, op.valid ? 0.0f : quiet_nan());

#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < my_stages) {
      issue(j);
    }
    __pipeline_commit();
  }
  const int steps_per_group = group_size / kStepCodes;
  for (int j = 0; j < my_stages; ++j) {
    if (j + kStages - 1 < my_stages) {
      issue(j + kStages - 1);
    }
    __pipeline_commit();
    const int k0 = k_begin + (warp + j * kStagedWarps) * kStageCodes;
    const int steps = min(kStageCodes, k_end - k0) / kStepCodes;
    // The stage's x, loaded while its W and scales arrive: one wait for
    // all its steps.
    XLoad<T> x_loads[kStageCodes / kStepCodes][x_blocks];
#pragma unroll
    for (int s = 0; s < kStageCodes / kStepCodes; ++s) {
#pragma unroll
      for (int b = 0; b < x_blocks; ++b) {
        const int m = m0 + b * kXBlockRows + lane.group;
        x_loads[s][b] = load_x(
            op.x + int64_t(m) * K + k0 + s * kStepCodes + 4 * lane.thread,
            m < M && s < steps);
      }
    }
    __pipeline_wait_prior(kStages - 1);
    __syncwarp();

    const uint8_t* stage = stages + j % kStages * Layout::bytes;
    // Per row of this thread: the group's scale, applied to the float32
    // partial sums (outside), or, when it is not finite, multiplied into
    // the codes (inside) so that zeros and opposite infinities give NaN
    // element by element.
    float outside[tiles][2];
    P inside[tiles][2];
    bool scale_inside = false;
    float sums[tiles][x_blocks][4];
#pragma unroll
    for (int s = 0; s < kStageCodes / kStepCodes; ++s) {
      if (s >= steps) {
        break;
      }
      if (s % steps_per_group == 0) {
        bool nonfinite = false;
#pragma unroll
        for (int t = 0; t < tiles; ++t) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = t * kTileRows + h * 8 + lane.group;
            const S stored = reinterpret_cast<const S*>(
                stage + Layout::scales_offset +
                row * Layout::scales_stride)[s / steps_per_group];
            const float scale = decode_scale<encoding>(stored) * op.factor;
            const bool finite = isfinite(scale);
            nonfinite |= !finite;
            outside[t][h] = finite ? scale : 1.0f;
            inside[t][h] = splat<P>(finite ? 1.0f : scale);
          }
        }
        scale_inside = __any_sync(0xFFFFFFFFu, nonfinite);
        fill_sums(sums, 0.0f);
      }

      XFragment<T> x_fragments[x_blocks];
#pragma unroll
      for (int b = 0; b < x_blocks; ++b) {
        x_fragments[b] = x_fragment<T>(x_loads[s][b]);
      }
#pragma unroll
      for (int t = 0; t < tiles; ++t) {
        uint32_t a[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = t * kTileRows + h * 8 + lane.group;
          const uint32_t codes = step_codes<bits>(
              stage + row * Layout::row_stride + s * kStepCodes * bits / 8,
              lane);
          P low = decode_pair<H, bits>(codes, 0);
          P high = decode_pair<H, bits>(codes, 1);
          if (scale_inside) {
            low = __hmul2(low, inside[t][h]);
            high = __hmul2(high, inside[t][h]);
          }
          a[h] = bits_of(low);
          a[2 + h] = bits_of(high);
        }
#pragma unroll
        for (int b = 0; b < x_blocks; ++b) {
#pragma unroll
          for (int part = 0; part < XFragment<T>::parts; ++part) {
            mma_step<H>(sums[t][b], a, x_fragments[b].b[part]);
          }
        }
      }

      if ((s + 1) % steps_per_group == 0) {
#pragma unroll
        for (int t = 0; t < tiles; ++t) {
#pragma unroll
          for (int b = 0; b < x_blocks; ++b) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc[t][b][i] =
                  fmaf(sums[t][b][i], outside[t][i / 2], acc[t][b][i]);
            }
          }
        }
      }
    }
    __syncwarp();
  }

  // The stages are done with: the warps' sums meet in their memory.
  store_block_sums<kStagedWarps>(
      acc, reinterpret_cast<float*>(shared), M, N, m0, n0, 1.0f, y, partials);
}

template <typename T, int bits, int encoding, int x_blocks>
__global__ void __launch_bounds__(kStagedWarps* kWarpSize)
    fp_qmv_staged(const QmmArgs args) {
  extern __shared__ uint4 shared_words[];
  auto* shared = reinterpret_cast<uint8_t*>(shared_words);
  transposed_grid<T, bits, encoding, x_blocks>(
      args,
      kStagedRowsPerBlock,
      [&](const auto& op,
          int m0,
          int n0,
          int k_begin,
          int k_end,
          T* y,
          float* partials) {
        fp_qmv_staged_impl<T, bits, encoding, x_blocks>(
            args, op, shared, m0, n0, k_begin, k_end, y, partials);
      });
}

}  // namespace fpqmm::cuda
