// simdgroup_matrix<T, 8, 8>: each lane holds two elements in Apple's layout,
// so kernels that index fragments through thread_elements() see exactly the
// values they would on hardware.
#pragma once

#include "sync.h"

namespace metal {

// Row and column of element 0 of `lane`'s pair; element 1 is one column right.
// With q = lane / 4: row = (q & 4) + (lane / 2) % 4, col = (q & 2) * 2 + (lane % 2) * 2.
METAL_FUNC constexpr ushort2 simdgroup_matrix_coordinate(uint lane) {
  uint q = lane / 4;
  return ushort2{ushort((q & 2) * 2 + (lane % 2) * 2), ushort((q & 4) + (lane / 2) % 4)};
}

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "only 8x8 simdgroup matrices exist");
  vec<T, 2> elements;

  simdgroup_matrix() thread = default;
  METAL_FUNC simdgroup_matrix(T value) thread : elements(make_vec<vec<T, 2>>(value)) {}

  METAL_FUNC thread vec<T, 2>& thread_elements() thread { return elements; }
  METAL_FUNC const thread vec<T, 2>& thread_elements() const thread { return elements; }
};

typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;

template <class T, int Cols, int Rows>
METAL_FUNC simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
  return simdgroup_matrix<T, Cols, Rows>(value);
}

namespace matrix_detail {

// Memory index of logical element (row, col): origin is (x = column,
// y = row); a transposed matrix reads element (row, col) from memory row col.
METAL_FUNC ulong element_offset(ushort row, ushort col, ulong elements_per_row, ulong2 origin, bool transpose) {
  ulong base = origin.y * elements_per_row + origin.x;
  return transpose ? base + col * elements_per_row + row : base + row * elements_per_row + col;
}

template <class T, class Pointer>
METAL_FUNC void load(thread vec<T, 2>& d, Pointer src, ulong elements_per_row, ulong2 origin, bool transpose) {
  ushort2 rc = simdgroup_matrix_coordinate(msim::simd_lane());
  for (ushort e = 0; e < 2; ++e)
    d[e] = src[element_offset(rc.y, rc.x + e, elements_per_row, origin, transpose)];
}

template <class T, class Pointer>
METAL_FUNC void store(const thread vec<T, 2>& s, Pointer dst, ulong elements_per_row, ulong2 origin, bool transpose) {
  ushort2 rc = simdgroup_matrix_coordinate(msim::simd_lane());
  for (ushort e = 0; e < 2; ++e)
    dst[element_offset(rc.y, rc.x + e, elements_per_row, origin, transpose)] = s[e];
}

// Per lane: pointers to d, a, b, c (c null for simdgroup_multiply).
struct MultiplyOperands {
  void* d;
  const void* a;
  const void* b;
  const void* c;
};

template <class T>
METAL_FUNC void gather_matrix(void* const* lanes, const void* MultiplyOperands::*which, float (&tile)[8][8]) {
  for (uint lane = 0; lane < 32; ++lane) {
    const auto* operands = static_cast<const MultiplyOperands*>(lanes[lane]);
    const auto& elements = static_cast<const vec<T, 2>*>(operands->*which)[0];
    ushort2 rc = simdgroup_matrix_coordinate(lane);
    tile[rc.y][rc.x] = float(elements[0]);
    tile[rc.y][rc.x + 1] = float(elements[1]);
  }
}

// D = A * B (+ C), accumulated in float in k order, rounded once to D's type.
template <class TD, class TA, class TB, class TC>
void multiply(void* const* lanes, uint count) {
  for (uint lane = 0; lane < count; ++lane)
    if (!lanes[lane]) msim::fail("simdgroup_matrix operation in a simdgroup with fewer than 32 threads", {nullptr, 0});
  float a[8][8], b[8][8], c[8][8] = {};
  gather_matrix<TA>(lanes, &MultiplyOperands::a, a);
  gather_matrix<TB>(lanes, &MultiplyOperands::b, b);
  if (static_cast<const MultiplyOperands*>(lanes[0])->c) gather_matrix<TC>(lanes, &MultiplyOperands::c, c);
  for (uint lane = 0; lane < 32; ++lane) {
    auto& d = *static_cast<vec<TD, 2>*>(static_cast<MultiplyOperands*>(lanes[lane])->d);
    ushort2 rc = simdgroup_matrix_coordinate(lane);
    for (ushort e = 0; e < 2; ++e) {
      float sum = c[rc.y][rc.x + e];
      for (int k = 0; k < 8; ++k) sum += a[rc.y][k] * b[k][rc.x + e];
      d[e] = static_cast<TD>(sum);
    }
  }
  msim::count(msim::Counter::simdgroup_matrix_ops);
}

}  // namespace matrix_detail

#define MSIM_MATRIX_MEMORY_OPS(space)                                                               \
  template <class T, int Cols, int Rows>                                                            \
  METAL_FUNC void simdgroup_load(thread simdgroup_matrix<T, Cols, Rows>& d, const space T* src,     \
                                 ulong elements_per_row = Cols, ulong2 matrix_origin = ulong2{0, 0},   \
                                 bool transpose_matrix = false) {                                   \
    matrix_detail::load<T>(d.elements, src, elements_per_row, matrix_origin, transpose_matrix);     \
  }                                                                                                 \
  template <class T, int Cols, int Rows>                                                            \
  METAL_FUNC void simdgroup_store(const thread simdgroup_matrix<T, Cols, Rows>& s, space T* dst,    \
                                  ulong elements_per_row = Cols, ulong2 matrix_origin = ulong2{0, 0},  \
                                  bool transpose_matrix = false) {                                  \
    matrix_detail::store<T>(s.elements, dst, elements_per_row, matrix_origin, transpose_matrix);    \
  }
MSIM_MATRIX_MEMORY_OPS(device)
MSIM_MATRIX_MEMORY_OPS(threadgroup)
#undef MSIM_MATRIX_MEMORY_OPS

template <class TD, class TA, class TB, class TC>
METAL_FUNC void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, 8, 8>& d,
                                              const thread simdgroup_matrix<TA, 8, 8>& a,
                                              const thread simdgroup_matrix<TB, 8, 8>& b,
                                              const thread simdgroup_matrix<TC, 8, 8>& c,
                                              msim::SourceLoc where = msim::SourceLoc::current()) {
  matrix_detail::MultiplyOperands operands{&d.elements, &a.elements, &b.elements, &c.elements};
  msim::synchronize(msim::Scope::simdgroup_wide, "simdgroup_multiply_accumulate",
                    matrix_detail::multiply<TD, TA, TB, TC>, &operands, where);
}

template <class TD, class TA, class TB>
METAL_FUNC void simdgroup_multiply(thread simdgroup_matrix<TD, 8, 8>& d, const thread simdgroup_matrix<TA, 8, 8>& a,
                                   const thread simdgroup_matrix<TB, 8, 8>& b,
                                   msim::SourceLoc where = msim::SourceLoc::current()) {
  matrix_detail::MultiplyOperands operands{&d.elements, &a.elements, &b.elements, nullptr};
  msim::synchronize(msim::Scope::simdgroup_wide, "simdgroup_multiply", matrix_detail::multiply<TD, TA, TB, TD>, &operands,
                    where);
}

}  // namespace metal
