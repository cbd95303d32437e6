// Small kernels exercising one simulator feature each; the tests compare
// them with NumPy.
#include <metal_stdlib>
#include <metal_simdgroup>
using namespace metal;

constant int scale [[function_constant(1)]];
constant float offset [[function_constant(2)]];
constant bool negate [[function_constant(3)]];
constant bool has_offset = is_function_constant_defined(offset);
constant float signed_scale = negate ? -scale : scale;

// out[i][lane] for i = 0..10: one collective per row.
[[kernel]] void collectives(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint gid [[thread_position_in_grid]],
    ushort lane [[thread_index_in_simdgroup]]) {
  const float x = in[gid];
  const uint n = 64;
  out[0 * n + gid] = simd_sum(x);
  out[1 * n + gid] = simd_max(x);
  out[2 * n + gid] = simd_min(x);
  out[3 * n + gid] = simd_shuffle(x, (lane * 7) % 32);
  out[4 * n + gid] = simd_shuffle_xor(x, 5);
  out[5 * n + gid] = simd_shuffle_down(x, 3);
  out[6 * n + gid] = simd_shuffle_up(x, 2);
  out[7 * n + gid] = simd_prefix_inclusive_sum(x);
  out[8 * n + gid] = simd_prefix_exclusive_sum(x);
  out[9 * n + gid] = quad_sum(x);
  out[10 * n + gid] = simd_broadcast(x, 9);
  out[11 * n + gid] = quad_shuffle(x, 3 - lane % 4);
}

// Decodes fp4 (E2M1) codes with the half-subnormal trick MLX-style kernels use.
[[kernel]] void fp4_decode(
    const device uchar* codes [[buffer(0)]],
    device half* out [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  const ushort code = codes[i];
  half magnitude = as_type<half>(ushort((code & 7) << 9)) * 16384.0h;
  out[i] = (code & 8) ? -magnitude : magnitude;
}

// Literal typing, vector construction and swizzles, half and bfloat rounding.
[[kernel]] void scalars_and_vectors(
    device float* out [[buffer(0)]],
    device half* halves [[buffer(1)]],
    device bfloat* bfloats [[buffer(2)]],
    constant float4& v [[buffer(3)]]) {
  auto third = 1.0 / 3.0;  // float, not double, in Metal
  out[0] = third;
  out[1] = sizeof(third);
  float4 w = float4(v.zw, 1.5h, 2);
  out[2] = w.x;
  out[3] = w.y;
  out[4] = w.z;
  out[5] = w.w;
  half2 h = half2(v.xy) * 0.5h;
  out[6] = dot(float2(h), float2(1.0f, 10.0f));
  halves[0] = half(v.x) / half(3);
  halves[1] = half(6.0e-8f);  // the smallest half subnormal is 5.96e-8
  bfloats[0] = bfloat(v.x) / bfloat(3.0f);
  bfloats[1] = bfloat(float(halves[0]));
  out[7] = max(v.x, 0) + clamp(v.y, 0.0f, 1.0f) + select(0.0f, 1.0f, v.z > 0);
}

[[kernel]] void function_constants(device float* out [[buffer(0)]]) {
  out[0] = scale;
  out[1] = has_offset ? offset : -1.0f;
  out[2] = signed_scale;
}

// Reverses 128 floats through dynamically sized threadgroup memory.
[[kernel]] void reverse_through_threadgroup(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    device float* never_used [[buffer(2)]],
    threadgroup float* scratch [[threadgroup(0)]],
    uint tid [[thread_index_in_threadgroup]],
    uint n [[threads_per_threadgroup]]) {
  scratch[tid] = in[tid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = scratch[n - 1 - tid];
}

// Buffers without [[buffer(n)]] take the next free index, as in Metal.
[[kernel]] void implicit_buffer_indices(
    const device float* in,
    device float* out,
    constant float& factor [[buffer(0)]],
    uint i [[thread_position_in_grid]]) {
  out[i] = in[i] * factor;
}

// Direct half <-> bfloat conversions, as Metal allows them.
[[kernel]] void half_bfloat_conversions(
    const device half* h [[buffer(0)]],
    const device bfloat* b [[buffer(1)]],
    device bfloat* to_bfloat [[buffer(2)]],
    device half* to_half [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
  to_bfloat[2 * i] = bfloat(h[i]);
  to_bfloat[2 * i + 1] = static_cast<bfloat>(h[i]);
  to_half[2 * i] = half(b[i]);
  to_half[2 * i + 1] = static_cast<metal::half>(b[i]);
}
