// Kernels with one bug each; the simulator must report every one of them
// with this file's name and the line of the bug.
#include <metal_stdlib>
using namespace metal;

[[kernel]] void divergent_barrier(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  if (tid < 32) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // BUG: divergent barrier
  }
  out[tid] = tid;
}

[[kernel]] void divergent_collective(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  float x = lane;
  if (lane < 16) {
    x = simd_sum(x);  // BUG: divergent collective
  }
  out[lane] = x;
}

[[kernel]] void out_of_bounds_read(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    constant uint& n [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  out[i] = in[i] + in[i + 1];  // BUG: the last thread reads in[n]
}

[[kernel]] void unbound_buffer(device float* out [[buffer(0)]], device float* missing [[buffer(1)]]) {
  out[0] = missing[0];  // BUG: buffer(1) is not bound
}

[[kernel]] void uninitialized_threadgroup(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float staging[64];
  if (tid != 5) {
    staging[tid] = tid;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = staging[63 - tid];  // BUG: staging[5] was never written
}

[[kernel]] void too_much_threadgroup_memory(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float big[8192];  // BUG: 32 KiB plus the next array exceed the limit
  threadgroup float more[16];
  big[tid] = 1;
  more[tid] = 2;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = big[tid] + more[tid];
}

[[kernel]] void shift_too_far(device uint* out [[buffer(0)]], constant uint& shift [[buffer(1)]]) {
  out[0] = 1u << shift;  // BUG when shift >= 32
}

[[kernel]] void divide_by_zero(device int* out [[buffer(0)]], constant int& d [[buffer(1)]]) {
  out[0] = 100 / d;  // BUG when d == 0
}

[[kernel]] void wild_pointer(device float* out [[buffer(0)]], constant ulong& address [[buffer(1)]]) {
  *(device float*)address = 1;  // BUG: writes to an arbitrary address
}

[[kernel]] void data_race(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]], uint n [[threads_per_threadgroup]]) {
  threadgroup float ring[64];
  ring[tid] = 0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  ring[tid] = tid;
  out[tid] = ring[(tid + n - 1) % n];  // BUG: no barrier since the neighbour's store
}
