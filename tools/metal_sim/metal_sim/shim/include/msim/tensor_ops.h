// Metal 4 MetalPerformancePrimitives: mpp::tensor_ops::matmul2d on
// cooperative tensors (the surface MLX's NAX kernels use).
//
// Cooperative-tensor layout (what MLX hard-codes, see README.md): an operand
// tile of R x C elements, in its stored orientation, is cut into 16 x 16
// fragments numbered row-major; fragment g belongs to simdgroup g % S of the
// S simdgroups in the scope, as its local fragment g / S. Local element
// i = 8 * (local fragment) + e of lane l sits in its fragment at
//   row = ((l >> 2) & 4 | (l >> 1) & 3) + 8 * (e >> 2)
//   col = 4 * ((l >> 2) & 2 | l & 1) + (e & 3).
#pragma once

#include "sync.h"

namespace metal {

template <class T, size_t N>
struct array {
  T elements[N];
  METAL_FUNC thread T& operator[](size_t i) thread { return elements[i]; }
  METAL_FUNC const thread T& operator[](size_t i) const thread { return elements[i]; }
  static constexpr size_t size() { return N; }
};

constexpr size_t dynamic_extent = size_t(-1);

struct execution_thread {};
template <int N>
struct execution_simdgroups {
  static constexpr int simdgroups = N;
};
using execution_simdgroup = execution_simdgroups<1>;

// Element type, stored shape and scope size of a cooperative tensor.
template <class T, int Rows, int Cols, int SimdGroups>
struct cooperative_tensor {
  static_assert(Rows % 16 == 0 && Cols % 16 == 0, "cooperative tensors are made of 16 x 16 fragments");
  static constexpr int fragments = Rows / 16 * (Cols / 16);
  static_assert(fragments % SimdGroups == 0, "fragments must split evenly over the scope's simdgroups");
  static constexpr int capacity = fragments / SimdGroups * 8;
  using element_type = T;
  using value_type = T;
  static constexpr int rows = Rows;
  static constexpr int cols = Cols;
  static constexpr int simdgroups = SimdGroups;

  T elements[capacity];

  METAL_FUNC thread T& operator[](int i) thread { return elements[i]; }
  METAL_FUNC const thread T& operator[](int i) const thread { return elements[i]; }
  METAL_FUNC T get(int i) const thread { return elements[i]; }
  METAL_FUNC void set(int i, T value) thread { elements[i] = value; }
  static constexpr int get_capacity() { return capacity; }
  static constexpr bool is_valid_element(int) { return true; }

  // Row and column of local element `i` of `lane` in simdgroup `simdgroup` of the scope.
  static METAL_FUNC array<int, 2> coordinate(uint simdgroup, uint lane, int i) {
    int fragment = i / 8 * SimdGroups + int(simdgroup), e = i % 8;
    int row = int(((lane >> 2) & 4) | ((lane >> 1) & 3)) + 8 * (e >> 2);
    int col = 4 * int(((lane >> 2) & 2) | (lane & 1)) + (e & 3);
    return {{fragment / (Cols / 16) * 16 + row, fragment % (Cols / 16) * 16 + col}};
  }

  // Metal's convention: index 0 is the column, index 1 the row.
  METAL_FUNC array<int, 2> get_multidimensional_index(int i) const thread {
    uint thread_index = msim::simd_lane();
    uint simdgroup = 0;
    if constexpr (SimdGroups > 1) {
      unsigned index[3];
      msim::builtin_value(msim::Builtin::simdgroup_index_in_threadgroup, index);
      simdgroup = index[0];
    }
    array<int, 2> rc = coordinate(simdgroup, thread_index, i);
    return {{rc[1], rc[0]}};
  }
};

}  // namespace metal

namespace mpp::tensor_ops {

constexpr int dynamic_length_v = int(metal::dynamic_extent);

struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };
  int m, n, k;
  bool transpose_left, transpose_right, relaxed_precision;
  mode matmul_mode;

  constexpr matmul2d_descriptor(int m, int n, int k = dynamic_length_v, bool transpose_left = false,
                                bool transpose_right = false, bool relaxed_precision = false,
                                mode matmul_mode = mode::multiply)
      : m(m), n(n), k(k), transpose_left(transpose_left), transpose_right(transpose_right),
        relaxed_precision(relaxed_precision), matmul_mode(matmul_mode) {}
};

namespace detail {

template <class Scope>
constexpr int simdgroups_of = Scope::simdgroups;

enum Operand { left, right, destination };

// What each participating thread hands to the collective `run`.
struct RunOperands {
  const void* tensors[3];  // indexed by Operand
  uint simdgroup;
  uint lane;
};

// Collects every thread's elements of one operand into its stored R x C tile.
template <class Tensor>
void gather(void* const* threads, uint count, Operand which, float (&tile)[Tensor::rows][Tensor::cols]) {
  for (uint t = 0; t < count; ++t) {
    const auto* operands = static_cast<const RunOperands*>(threads[t]);
    const auto& ct = *static_cast<const Tensor*>(operands->tensors[which]);
    for (int i = 0; i < Tensor::capacity; ++i) {
      metal::array<int, 2> rc = Tensor::coordinate(operands->simdgroup, operands->lane, i);
      tile[rc[0]][rc[1]] = float(ct.elements[i]);
    }
  }
}

// destination (M x N) = left (M x K) * right (K x N) [+ destination], in
// float, k in order, rounded once to the destination's element type.
template <matmul2d_descriptor Desc, class Left, class Right, class Destination>
void run(void* const* threads, uint count) {
  for (uint t = 0; t < count; ++t)
    if (!threads[t]) msim::fail("matmul2d::run: not every thread of the execution scope called run", {nullptr, 0});
  float a[Left::rows][Left::cols], b[Right::rows][Right::cols], c[Desc.m][Desc.n];
  gather<Left>(threads, count, Operand::left, a);
  gather<Right>(threads, count, Operand::right, b);
  gather<Destination>(threads, count, Operand::destination, c);
  for (uint t = 0; t < count; ++t) {
    auto* operands = static_cast<RunOperands*>(threads[t]);
    auto& ct = *static_cast<Destination*>(const_cast<void*>(operands->tensors[Operand::destination]));
    for (int i = 0; i < Destination::capacity; ++i) {
      metal::array<int, 2> rc = Destination::coordinate(operands->simdgroup, operands->lane, i);
      const int m = rc[0], n = rc[1];
      float sum = Desc.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate ? c[m][n] : 0.0f;
      for (int k = 0; k < Desc.k; ++k)
        sum += (Desc.transpose_left ? a[k][m] : a[m][k]) * (Desc.transpose_right ? b[n][k] : b[k][n]);
      ct.elements[i] = static_cast<typename Destination::element_type>(sum);
    }
  }
  msim::count(msim::Counter::matmul2d_runs);
}

}  // namespace detail

template <matmul2d_descriptor Desc, class Scope, class... Args>
struct matmul2d {
  static_assert(Desc.k != dynamic_length_v, "the simulator needs a static K for cooperative-tensor operands");
  static constexpr matmul2d_descriptor descriptor = Desc;
  using scope = Scope;
  static constexpr int simdgroups = detail::simdgroups_of<Scope>;

  template <class LeftElement, class RightElement, class Element>
  using left_t = metal::cooperative_tensor<LeftElement, Desc.transpose_left ? Desc.k : Desc.m,
                                           Desc.transpose_left ? Desc.m : Desc.k, simdgroups>;
  template <class LeftElement, class RightElement, class Element>
  using right_t = metal::cooperative_tensor<RightElement, Desc.transpose_right ? Desc.n : Desc.k,
                                            Desc.transpose_right ? Desc.k : Desc.n, simdgroups>;

  template <class LeftElement, class RightElement, class Element, class Coord = int>
  METAL_FUNC left_t<LeftElement, RightElement, Element> get_left_input_cooperative_tensor() const thread {
    return {};
  }
  template <class LeftElement, class RightElement, class Element, class Coord = int>
  METAL_FUNC right_t<LeftElement, RightElement, Element> get_right_input_cooperative_tensor() const thread {
    return {};
  }
  template <class Left, class Right, class Element, class Coord = int>
  METAL_FUNC metal::cooperative_tensor<Element, Desc.m, Desc.n, simdgroups> get_destination_cooperative_tensor()
      const thread {
    return {};
  }

  template <class Left, class Right, class Destination>
  METAL_FUNC void run(const thread Left& left, const thread Right& right, thread Destination& destination,
                      msim::SourceLoc where = msim::SourceLoc::current()) const thread {
    unsigned simdgroup[3];
    msim::builtin_value(msim::Builtin::simdgroup_index_in_threadgroup, simdgroup);
    detail::RunOperands operands{{&left, &right, &destination}, simdgroup[0], msim::simd_lane()};
    if constexpr (simdgroups == 1) {
      operands.simdgroup = 0;
      msim::synchronize(msim::Scope::simdgroup_wide, "matmul2d::run", detail::run<Desc, Left, Right, Destination>,
                        &operands, where);
    } else {
      msim::synchronize(msim::Scope::threadgroup_wide, "matmul2d::run", detail::run<Desc, Left, Right, Destination>,
                        &operands, where);
    }
  }
};

}  // namespace mpp::tensor_ops
