// Metal scalar and vector types, as_type, type traits and numeric limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "runtime_api.h"

#define METAL_FUNC inline __attribute__((always_inline))

// Native clang types give IEEE binary16 (with subnormals) and bfloat16; the
// driver rounds every operation (-f[b]float16-excess-precision=none).
typedef _Float16 half;
typedef __bf16 bfloat;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

namespace metal {

template <class T, int N>
using vec = T __attribute__((ext_vector_type(N)));

template <class V>
struct vec_info {
  static constexpr int size = 1;
  using element = V;
};
template <class T, int N>
struct vec_info<vec<T, N>> {
  static constexpr int size = N;
  using element = T;
};

}  // namespace metal

#define MSIM_VECTOR_TYPES(S)                \
  typedef metal::vec<S, 2> S##2;            \
  typedef metal::vec<S, 3> S##3;            \
  typedef metal::vec<S, 4> S##4;            \
  namespace metal { using ::S##2; using ::S##3; using ::S##4; } \
  typedef S packed_##S##2 __attribute__((ext_vector_type(2), aligned(sizeof(S)))); \
  typedef S packed_##S##3 __attribute__((ext_vector_type(3), aligned(sizeof(S)))); \
  typedef S packed_##S##4 __attribute__((ext_vector_type(4), aligned(sizeof(S))));
MSIM_VECTOR_TYPES(bool)
MSIM_VECTOR_TYPES(char)
MSIM_VECTOR_TYPES(uchar)
MSIM_VECTOR_TYPES(short)
MSIM_VECTOR_TYPES(ushort)
MSIM_VECTOR_TYPES(int)
MSIM_VECTOR_TYPES(uint)
MSIM_VECTOR_TYPES(long)
MSIM_VECTOR_TYPES(ulong)
MSIM_VECTOR_TYPES(half)
MSIM_VECTOR_TYPES(bfloat)
MSIM_VECTOR_TYPES(float)
#undef MSIM_VECTOR_TYPES

namespace metal {

using ::bfloat;
using ::half;
using ::uchar;
using ::uint;
using ::ulong;
using ::ushort;

using std::conditional;
using std::conditional_t;
using std::declval;
using std::decay;
using std::decay_t;
using std::enable_if;
using std::enable_if_t;
using std::false_type;
using std::integral_constant;
using std::is_const;
using std::is_const_v;
using std::is_convertible;
using std::is_convertible_v;
using std::is_integral;
using std::is_integral_v;
using std::is_pointer;
using std::is_pointer_v;
using std::is_same;
using std::is_same_v;
using std::is_signed;
using std::is_signed_v;
using std::is_unsigned;
using std::is_unsigned_v;
using std::make_signed;
using std::make_signed_t;
using std::make_unsigned;
using std::make_unsigned_t;
using std::remove_const;
using std::remove_const_t;
using std::remove_cv;
using std::remove_cv_t;
using std::remove_pointer;
using std::remove_pointer_t;
using std::remove_reference;
using std::remove_reference_t;
using std::true_type;
template <bool B>
using bool_constant = std::integral_constant<bool, B>;

// libc++ does not classify half and bfloat as floating point.
template <class T>
struct is_floating_point : bool_constant<__is_floating_point(remove_cv_t<T>)> {};
template <class T>
constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T>
struct is_arithmetic : bool_constant<is_integral_v<T> || is_floating_point_v<T>> {};
template <class T>
constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T>
struct is_scalar : bool_constant<is_arithmetic_v<T> || std::is_pointer_v<T> || std::is_enum_v<T>> {};
template <class T>
constexpr bool is_scalar_v = is_scalar<T>::value;

// msim/address_spaces.h (force-included first) holds the rule.
template <class T>
struct remove_addrspace : msim::object_in_space<T> {};
template <class T>
using remove_addrspace_t = typename remove_addrspace<T>::type;

// Element conversion as Metal's explicit casts do it; clang refuses a
// direct half <-> bfloat cast, so those go through float (exact).
template <class To, class From>
METAL_FUNC constexpr To convert_element(From x) {
  if constexpr ((is_same_v<To, bfloat> && is_same_v<From, half>) ||
                (is_same_v<To, half> && is_same_v<From, bfloat>))
    return static_cast<To>(static_cast<float>(x));
  else
    return static_cast<To>(x);
}

template <class V, class A>
METAL_FUNC void append_components(thread V& out, thread int& next, A arg) {
  using E = typename vec_info<V>::element;
  if constexpr (vec_info<A>::size == 1) {
    out[next++] = convert_element<E>(arg);
  } else {
    for (int i = 0; i < vec_info<A>::size; ++i)
      out[next++] = convert_element<E>(arg[i]);
  }
}

// `float4(...)`-style construction: a splat, an element-type conversion, a
// class's conversion to the vector, or a concatenation of scalars and vectors
// (the rewriter maps the syntax here).
template <class V, class... A>
METAL_FUNC V make_vec(A... args) {
  constexpr int n = vec_info<V>::size;
  V out{};
  if constexpr (sizeof...(A) == 1 && (std::is_class_v<A> && ...)) {
    return V(args...);  // a class's conversion function (`operator float2()`)
  } else if constexpr (sizeof...(A) == 1 && (vec_info<A>::size + ...) == 1) {
    for (int i = 0; i < n; ++i)
      out[i] = convert_element<typename vec_info<V>::element>(args...);
  } else if constexpr (sizeof...(A) > 0) {
    static_assert((vec_info<A>::size + ...) == n, "vector constructor: wrong number of components");
    int next = 0;
    (append_components(out, next, args), ...);
  }
  return out;
}

template <class To, class From>
METAL_FUNC To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  return __builtin_bit_cast(To, x);
}

template <class T>
struct numeric_limits : std::numeric_limits<T> {};

template <class T, ushort Bits>
struct float16_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr T from_bits(ushort b) { return __builtin_bit_cast(T, b); }
  static constexpr T min() { return from_bits(ushort(1) << Bits); }
  static constexpr T denorm_min() { return from_bits(1); }
  static constexpr T max() { return from_bits(ushort(0x7fff - (ushort(1) << Bits))); }
  static constexpr T lowest() { return from_bits(ushort(0xffff - (ushort(1) << Bits))); }
  static constexpr T epsilon() { return from_bits(ushort((15 + (Bits == 10 ? 0 : 112) - Bits) << Bits)); }
  static constexpr T infinity() { return from_bits(ushort(0x7fff - ((ushort(1) << Bits) - 1))); }
  static constexpr T quiet_NaN() { return from_bits(ushort(0x7fff - ((ushort(1) << (Bits - 1)) - 1))); }
};
// Mantissa widths: half has 10 explicit bits, bfloat 7.
template <>
struct numeric_limits<half> : float16_limits<half, 10> {};
template <>
struct numeric_limits<bfloat> : float16_limits<bfloat, 7> {};

}  // namespace metal

using metal::as_type;
