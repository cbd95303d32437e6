#include <metal_stdlib>
using namespace metal;

// One threadgroup sums a row of `n` floats: per-thread partial sums, a
// simd_sum per simdgroup, then the simdgroup leaders combine through
// threadgroup memory.
template <typename T>
[[kernel]] void row_sum(
    const device T* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    constant int& n [[buffer(2)]],
    uint row [[threadgroup_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint simd_id [[simdgroup_index_in_threadgroup]],
    uint threads [[threads_per_threadgroup]]) {
  threadgroup float partial[32];
  float sum = 0.0;
  for (int i = tid; i < n; i += threads) {
    sum += float(in[row * n + i]);
  }
  sum = simd_sum(sum);
  if (lane == 0) {
    partial[simd_id] = sum;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simd_id == 0) {
    float total = lane < (threads + 31) / 32 ? partial[lane] : 0.0;
    total = simd_sum(total);
    if (lane == 0) {
      out[row] = total;
    }
  }
}

#define instantiate_row_sum(name, type) \
  template [[host_name("row_sum_" #name)]] [[kernel]] decltype(row_sum<type>) row_sum<type>;

instantiate_row_sum(float32, float)
instantiate_row_sum(float16, half)
instantiate_row_sum(bfloat16, bfloat)
