// C = A * B^T with Metal 4 matmul2d on cooperative tensors, the way MLX's
// NAX kernels drive it: fragments filled by hand from the lane layout, one
// 16 x 32 x 16 op per step. A is M x K, B is N x K (weights layout), C is
// M x N float. One simdgroup per threadgroup computes a 16 x 32 tile.
#include <metal_stdlib>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;

// Row and first column of a lane's elements 0..3 in a 16 x 16 fragment
// (elements 4..7 sit 8 rows further down).
short2 nax_coordinate() {
  const ushort lane = __metal_get_thread_index_in_simdgroup(ushort());
  const short q = lane >> 2;
#ifdef MUTANT_LANE_FORMULA
  return short2(((q & 2) | (lane & 1)) * 4, (q & 4) | ((lane >> 2) & 3));
#else
  return short2(((q & 2) | (lane & 1)) * 4, (q & 4) | ((lane >> 1) & 3));
#endif
}

template <typename T>
[[kernel]] void matmul_bt(
    const device T* a [[buffer(0)]],
    const device bfloat* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant int& N [[buffer(3)]],
    constant int& K [[buffer(4)]],
    uint2 tile [[threadgroup_position_in_grid]]) {
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
      16, 32, 16, false, true, true, mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroup> op;
  auto ct_a = op.template get_left_input_cooperative_tensor<T, bfloat, float>();
  auto ct_b = op.template get_right_input_cooperative_tensor<T, bfloat, float>();
  auto ct_c = op.template get_destination_cooperative_tensor<
      remove_addrspace_t<decltype(ct_a)>, remove_addrspace_t<decltype(ct_b)>, float>();
  for (int i = 0; i < ct_c.get_capacity(); ++i) {
    ct_c[i] = 0.0f;
  }

  const short2 at = nax_coordinate();
  const int m0 = tile.y * 16;
  const int n0 = tile.x * 32;
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int e = 0; e < 8; ++e) {
      const int r = at.y + 8 * (e >> 2);
      const int col = at.x + (e & 3);
      ct_a[e] = a[(m0 + r) * K + k0 + col];
      // The right operand is stored N x K (transpose_right): two 16 x 16 fragments.
      ct_b[e] = b[(n0 + r) * K + k0 + col];
      ct_b[8 + e] = b[(n0 + 16 + r) * K + k0 + col];
    }
    op.run(ct_a, ct_b, ct_c);
  }
  for (int i = 0; i < ct_c.get_capacity(); ++i) {
    const auto index = ct_c.get_multidimensional_index(i);
    c[(m0 + index[1]) * N + n0 + index[0]] = ct_c[i];
  }
}

template [[host_name("matmul_bt_float16")]] [[kernel]] decltype(matmul_bt<half>) matmul_bt<half>;
template [[host_name("matmul_bt_float32")]] [[kernel]] decltype(matmul_bt<float>) matmul_bt<float>;

// C (32 x 32) = A (32 x 16) * B (16 x 32) by two simdgroups sharing one
// op (execution_simdgroups<2>); operands filled and read back through
// get_multidimensional_index, the layout-independent way.
[[kernel]] void matmul_two_simdgroups(
    const device float* a [[buffer(0)]],
    const device float* b [[buffer(1)]],
    device float* c [[buffer(2)]]) {
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(32, 32, 16);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroups<2>> op;
  auto ct_a = op.get_left_input_cooperative_tensor<float, float, float>();
  auto ct_b = op.get_right_input_cooperative_tensor<float, float, float>();
  auto ct_c = op.get_destination_cooperative_tensor<decltype(ct_a), decltype(ct_b), float>();
  for (int i = 0; i < ct_a.get_capacity(); ++i) {
    const auto at = ct_a.get_multidimensional_index(i);
    ct_a[i] = a[at[1] * 16 + at[0]];
  }
  for (int i = 0; i < ct_b.get_capacity(); ++i) {
    const auto at = ct_b.get_multidimensional_index(i);
    ct_b[i] = b[at[1] * 32 + at[0]];
  }
  op.run(ct_a, ct_b, ct_c);
  for (int i = 0; i < ct_c.get_capacity(); ++i) {
    const auto at = ct_c.get_multidimensional_index(i);
    c[at[1] * 32 + at[0]] = ct_c[i];
  }
}
