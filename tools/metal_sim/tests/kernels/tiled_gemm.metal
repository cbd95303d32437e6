// C = A * B with simdgroup_matrix fragments and threadgroup tiles.
// A is M x K row-major; B is K x N row-major, or N x K when the function
// constant `b_transposed` is set. One threadgroup (4 simdgroups, 2 x 2)
// computes a 32 x 32 tile of C; each simdgroup a 16 x 16 quarter (2 x 2
// fragments). M, N and K must be multiples of 32, 32 and 16.
//
// MUTANT_* macros inject the bugs the simulator's tests must catch.
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

constant bool b_transposed [[function_constant(0)]];

constant constexpr int BM = 32;
constant constexpr int BN = 32;
constant constexpr int BK = 16;
constant constexpr int PAD = 4;

// Where a lane's two accumulator elements live in an 8 x 8 fragment.
short2 fragment_origin(ushort lane) {
  const short q = lane / 4;
#ifdef MUTANT_LANE_FORMULA
  return short2((q & 2) * 2 + (lane % 4), (q & 4) + (lane / 2) % 4);
#else
  return short2((q & 2) * 2 + (lane % 2) * 2, (q & 4) + (lane / 2) % 4);
#endif
}

template <typename T>
[[kernel]] void gemm(
    const device T* a [[buffer(0)]],
    const device T* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant int3& mnk [[buffer(3)]],
    uint2 tile [[threadgroup_position_in_grid]],
    ushort tid [[thread_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]],
    ushort simd_id [[simdgroup_index_in_threadgroup]]) {
  const int N = mnk.y;
  const int K = mnk.z;
  threadgroup T as[BM][BK + PAD];
  // Stored as the device layout is: K x N, or N x K when transposed.
  threadgroup T bs[BM * (BK + PAD)];

  const int row0 = tile.y * BM;
  const int col0 = tile.x * BN;
  const int sm = (simd_id / 2) * 16;
  const int sn = (simd_id % 2) * 16;

  simdgroup_matrix<float, 8, 8> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  for (int k0 = 0; k0 < K; k0 += BK) {
    // 128 threads load the 32 x 16 tiles, 4 elements each.
    for (int e = tid; e < BM * BK; e += 128) {
      const int r = e / BK, k = e % BK;
      as[r][k] = a[(row0 + r) * K + k0 + k];
      if (b_transposed) {
        bs[r * (BK + PAD) + k] = b[(col0 + r) * K + k0 + k];
      } else {
        const int kk = e / BN, n = e % BN;
        bs[kk * (BN + PAD) + n] = b[(k0 + kk) * N + col0 + n];
      }
    }
#ifndef MUTANT_MISSING_BARRIER
    threadgroup_barrier(mem_flags::mem_threadgroup);
#endif
    for (int kk = 0; kk < BK; kk += 8) {
      simdgroup_matrix<T, 8, 8> af[2], bf[2];
      for (int i = 0; i < 2; ++i)
        simdgroup_load(af[i], &as[0][0], BK + PAD, ulong2(kk, sm + 8 * i));
      for (int j = 0; j < 2; ++j) {
        if (b_transposed) {
#ifdef MUTANT_TRANSPOSE_FLAG
          simdgroup_load(bf[j], bs, BK + PAD, ulong2(kk, sn + 8 * j), false);
#else
          simdgroup_load(bf[j], bs, BK + PAD, ulong2(kk, sn + 8 * j), true);
#endif
        } else {
          simdgroup_load(bf[j], bs, BN + PAD, ulong2(sn + 8 * j, kk));
        }
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
          simdgroup_multiply_accumulate(acc[i][j], af[i], bf[j], acc[i][j]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  const short2 origin = fragment_origin(lane);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      const thread auto& pair = acc[i][j].thread_elements();
      const int r = row0 + sm + 8 * i + origin.y;
      const int col = col0 + sn + 8 * j + origin.x;
      c[r * N + col] = pair[0];
#ifndef MUTANT_UNWRITTEN_ELEMENT
      c[r * N + col + 1] = pair[1];
#endif
    }
  }
}

template [[host_name("gemm_float32")]] [[kernel]] decltype(gemm<float>) gemm<float>;
template [[host_name("gemm_float16")]] [[kernel]] decltype(gemm<half>) gemm<half>;
template [[host_name("gemm_bfloat16")]] [[kernel]] decltype(gemm<bfloat>) gemm<bfloat>;
