// Metal math, common, integer, relational and geometric functions for
// scalars and vectors. half/bfloat functions evaluate in float and round once.
#pragma once

#include <cmath>

#include "types.h"

namespace metal {

namespace math_detail {

template <class T>
using element_t = typename vec_info<T>::element;

// Result element type of a mixed scalar operation (`max(x, 0)`, `min(h, 1.0f)`).
template <class A, class B>
using scalar_result_t = conditional_t<
    is_same_v<A, B>, A,
    conditional_t<is_floating_point_v<A> != is_floating_point_v<B>,
                  conditional_t<is_floating_point_v<A>, A, B>,
                  conditional_t<is_floating_point_v<A>, float, std::common_type_t<A, B>>>>;

template <class A, class B>
using result_t = conditional_t<
    (vec_info<A>::size > 1), A,
    conditional_t<(vec_info<B>::size > 1), B, scalar_result_t<A, B>>>;

template <class V>
METAL_FUNC auto component(V x, int i) {
  if constexpr (vec_info<V>::size == 1)
    return x;
  else
    return x[i];
}

// Applies `f` component-wise; scalar arguments broadcast against vectors.
template <class R, class F, class... A>
METAL_FUNC R map(F f, A... args) {
  using E = element_t<R>;
  if constexpr (vec_info<R>::size == 1) {
    return convert_element<E>(f(args...));
  } else {
    R out;
    for (int i = 0; i < vec_info<R>::size; ++i)
      out[i] = convert_element<E>(f(component(args, i)...));
    return out;
  }
}

template <class T>
METAL_FUNC auto widen(T x) {
  if constexpr (is_floating_point_v<T> && sizeof(T) < sizeof(float))
    return static_cast<float>(x);
  else
    return x;
}

// fmin/fmax semantics for floats (a NaN operand yields the other); exact for integers.
template <class T>
METAL_FUNC T minimum(T x, T y) {
  if constexpr (is_floating_point_v<T>)
    return std::fmin(x, y);
  else
    return y < x ? y : x;
}
template <class T>
METAL_FUNC T maximum(T x, T y) {
  if constexpr (is_floating_point_v<T>)
    return std::fmax(x, y);
  else
    return x < y ? y : x;
}

template <class T>
concept floating = is_floating_point_v<element_t<T>>;
template <class T>
concept arithmetic = is_arithmetic_v<element_t<T>>;

}  // namespace math_detail

#define MSIM_FLOAT_UNARY(name, expression)                                       \
  template <math_detail::floating T>                                             \
  METAL_FUNC T name(T x) {                                                       \
    return math_detail::map<T>([](auto e) { auto v = math_detail::widen(e); return expression; }, x); \
  }
MSIM_FLOAT_UNARY(exp, std::exp(v))
MSIM_FLOAT_UNARY(exp2, std::exp2(v))
MSIM_FLOAT_UNARY(exp10, std::pow(decltype(v)(10), v))
MSIM_FLOAT_UNARY(log, std::log(v))
MSIM_FLOAT_UNARY(log2, std::log2(v))
MSIM_FLOAT_UNARY(log10, std::log10(v))
MSIM_FLOAT_UNARY(sqrt, std::sqrt(v))
MSIM_FLOAT_UNARY(rsqrt, decltype(v)(1) / std::sqrt(v))
MSIM_FLOAT_UNARY(sin, std::sin(v))
MSIM_FLOAT_UNARY(cos, std::cos(v))
MSIM_FLOAT_UNARY(tan, std::tan(v))
MSIM_FLOAT_UNARY(asin, std::asin(v))
MSIM_FLOAT_UNARY(acos, std::acos(v))
MSIM_FLOAT_UNARY(atan, std::atan(v))
MSIM_FLOAT_UNARY(sinh, std::sinh(v))
MSIM_FLOAT_UNARY(cosh, std::cosh(v))
MSIM_FLOAT_UNARY(tanh, std::tanh(v))
MSIM_FLOAT_UNARY(asinh, std::asinh(v))
MSIM_FLOAT_UNARY(acosh, std::acosh(v))
MSIM_FLOAT_UNARY(atanh, std::atanh(v))
MSIM_FLOAT_UNARY(floor, std::floor(v))
MSIM_FLOAT_UNARY(ceil, std::ceil(v))
MSIM_FLOAT_UNARY(round, std::round(v))
MSIM_FLOAT_UNARY(rint, std::rint(v))
MSIM_FLOAT_UNARY(trunc, std::trunc(v))
MSIM_FLOAT_UNARY(fract, std::fmin(v - std::floor(v), decltype(v)(0x1.fffffep-1)))
MSIM_FLOAT_UNARY(fabs, std::fabs(v))
MSIM_FLOAT_UNARY(saturate, std::fmin(std::fmax(v, decltype(v)(0)), decltype(v)(1)))
MSIM_FLOAT_UNARY(sign, v > 0 ? decltype(v)(1) : v < 0 ? decltype(v)(-1) : v == 0 ? decltype(v)(0) : v)
#undef MSIM_FLOAT_UNARY

template <math_detail::arithmetic T>
METAL_FUNC T abs(T x) {
  return math_detail::map<T>([](auto e) { return e < 0 ? decltype(e)(-e) : e; }, x);
}

#define MSIM_BINARY(name, expression)                                            \
  template <math_detail::arithmetic A, math_detail::arithmetic B>                \
  METAL_FUNC math_detail::result_t<A, B> name(A a, B b) {                        \
    using R = math_detail::result_t<A, B>;                                       \
    using E = math_detail::element_t<R>;                                         \
    return math_detail::map<R>(                                                  \
        [](auto p, auto q) {                                                     \
          auto x = math_detail::widen(convert_element<E>(p));                    \
          auto y = math_detail::widen(convert_element<E>(q));                    \
          return expression;                                                     \
        },                                                                       \
        a, b);                                                                   \
  }
MSIM_BINARY(min, math_detail::minimum(x, y))
MSIM_BINARY(max, math_detail::maximum(x, y))
MSIM_BINARY(fmin, std::fmin(x, y))
MSIM_BINARY(fmax, std::fmax(x, y))
MSIM_BINARY(pow, std::pow(x, y))
MSIM_BINARY(powr, std::pow(x, y))
MSIM_BINARY(atan2, std::atan2(x, y))
MSIM_BINARY(fmod, std::fmod(x, y))
MSIM_BINARY(copysign, std::copysign(x, y))
MSIM_BINARY(step, (y < x ? decltype(x)(0) : decltype(x)(1)))
#undef MSIM_BINARY

template <math_detail::arithmetic A, math_detail::arithmetic B, math_detail::arithmetic C>
METAL_FUNC auto clamp(A x, B lo, C hi) {
  return min(max(x, lo), hi);
}

template <math_detail::floating A, class B, class C>
METAL_FUNC A fma(A a, B b, C c) {
  using E = math_detail::element_t<A>;
  return math_detail::map<A>(
      [](auto x, auto y, auto z) {
        return std::fma(math_detail::widen(x), math_detail::widen(convert_element<E>(y)),
                        math_detail::widen(convert_element<E>(z)));
      },
      a, b, c);
}

template <math_detail::floating A, class B, class C>
METAL_FUNC A mix(A x, B y, C t) {
  using E = math_detail::element_t<A>;
  return math_detail::map<A>(
      [](auto p, auto q, auto s) {
        auto u = math_detail::widen(p);
        return u + (math_detail::widen(convert_element<E>(q)) - u) * math_detail::widen(convert_element<E>(s));
      },
      x, y, t);
}

// select(a, b, c) is `c ? b : a` per component.
template <class T, class C>
METAL_FUNC T select(T a, T b, C c) {
  return math_detail::map<T>([](auto p, auto q, auto s) { return s ? q : p; }, a, b, c);
}

#define MSIM_PREDICATE(name, expression)                                         \
  template <math_detail::floating T>                                             \
  METAL_FUNC auto name(T x) {                                                    \
    using R = conditional_t<(vec_info<T>::size > 1), vec<bool, vec_info<T>::size>, bool>; \
    return math_detail::map<R>([](auto e) { auto v = math_detail::widen(e); return bool(expression); }, x); \
  }
MSIM_PREDICATE(isnan, std::isnan(v))
MSIM_PREDICATE(isinf, std::isinf(v))
MSIM_PREDICATE(isfinite, std::isfinite(v))
MSIM_PREDICATE(signbit, std::signbit(v))
#undef MSIM_PREDICATE

template <class V>
METAL_FUNC bool all(V v) {
  for (int i = 0; i < vec_info<V>::size; ++i)
    if (!math_detail::component(v, i)) return false;
  return true;
}

template <class V>
METAL_FUNC bool any(V v) {
  for (int i = 0; i < vec_info<V>::size; ++i)
    if (math_detail::component(v, i)) return true;
  return false;
}

template <math_detail::floating V>
METAL_FUNC math_detail::element_t<V> dot(V a, V b) {
  auto sum = math_detail::widen(a[0] * b[0]);
  for (int i = 1; i < vec_info<V>::size; ++i)
    sum += math_detail::widen(a[i]) * math_detail::widen(b[i]);
  return static_cast<math_detail::element_t<V>>(sum);
}

template <math_detail::floating V>
METAL_FUNC math_detail::element_t<V> length(V v) {
  return sqrt(dot(v, v));
}

template <class T>
  requires is_integral_v<math_detail::element_t<T>>
METAL_FUNC T popcount(T x) {
  return math_detail::map<T>([](auto e) { return __builtin_popcountll(make_unsigned_t<decltype(e)>(e)); }, x);
}

// Fast and precise variants share the accurate implementation.
namespace fast {
using metal::cos;
using metal::exp;
using metal::exp2;
using metal::log;
using metal::log2;
using metal::max;
using metal::min;
using metal::pow;
using metal::rsqrt;
using metal::sin;
using metal::sqrt;
using metal::tanh;
}  // namespace fast
namespace precise {
using namespace metal::fast;
}  // namespace precise

}  // namespace metal
