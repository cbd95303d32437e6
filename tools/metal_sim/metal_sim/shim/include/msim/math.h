// Metal math, common, integer, relational and geometric functions for
// scalars and vectors. half/bfloat functions evaluate in float and round once.
#pragma once

#include "types.h"

// The host's libm through clang's builtins, so that no C library name
// (::log1p, ::hypot, ...) enters the kernels' global namespace, which in
// Metal holds none of them (MLX defines its own global log1p and hypot).
namespace msim::libm {
#define MSIM_LIBM(name)                                                                  \
  template <class... A>                                                                  \
  METAL_FUNC float name(float x, A... rest) { return __builtin_##name##f(x, rest...); }   \
  template <class... A>                                                                  \
  METAL_FUNC double name(double x, A... rest) { return __builtin_##name(x, rest...); }
MSIM_LIBM(acos)
MSIM_LIBM(acosh)
MSIM_LIBM(asin)
MSIM_LIBM(asinh)
MSIM_LIBM(atan)
MSIM_LIBM(atan2)
MSIM_LIBM(atanh)
MSIM_LIBM(ceil)
MSIM_LIBM(copysign)
MSIM_LIBM(cos)
MSIM_LIBM(cosh)
MSIM_LIBM(exp)
MSIM_LIBM(exp2)
MSIM_LIBM(fabs)
MSIM_LIBM(fdim)
MSIM_LIBM(floor)
MSIM_LIBM(fma)
MSIM_LIBM(fmax)
MSIM_LIBM(fmin)
MSIM_LIBM(fmod)
MSIM_LIBM(frexp)
MSIM_LIBM(ldexp)
MSIM_LIBM(log)
MSIM_LIBM(log10)
MSIM_LIBM(log2)
MSIM_LIBM(nextafter)
MSIM_LIBM(pow)
MSIM_LIBM(rint)
MSIM_LIBM(round)
MSIM_LIBM(sin)
MSIM_LIBM(sinh)
MSIM_LIBM(sqrt)
MSIM_LIBM(tan)
MSIM_LIBM(tanh)
MSIM_LIBM(trunc)
#undef MSIM_LIBM
// Exact for half and bfloat through float.
template <class T>
  requires(sizeof(T) == 2)
METAL_FUNC T fmin(T x, T y) { return T(fmin(float(x), float(y))); }
template <class T>
  requires(sizeof(T) == 2)
METAL_FUNC T fmax(T x, T y) { return T(fmax(float(x), float(y))); }
template <class T>
METAL_FUNC bool isnan(T x) { return __builtin_isnan(x); }
template <class T>
METAL_FUNC bool isinf(T x) { return __builtin_isinf(x); }
template <class T>
METAL_FUNC bool isfinite(T x) { return __builtin_isfinite(x); }
template <class T>
METAL_FUNC bool signbit(T x) { return __builtin_signbit(x); }
}  // namespace msim::libm

// MSL's math constants, as float (_F) and half (_H) values.
#define MSIM_MATH_CONSTANT(name, value) \
  constexpr float name##_F = value;     \
  constexpr half name##_H = half(value);
MSIM_MATH_CONSTANT(M_E, 2.71828182845904523536f)
MSIM_MATH_CONSTANT(M_LOG2E, 1.44269504088896340736f)
MSIM_MATH_CONSTANT(M_LOG10E, 0.434294481903251827651f)
MSIM_MATH_CONSTANT(M_LN2, 0.693147180559945309417f)
MSIM_MATH_CONSTANT(M_LN10, 2.30258509299404568402f)
MSIM_MATH_CONSTANT(M_PI, 3.14159265358979323846f)
MSIM_MATH_CONSTANT(M_PI_2, 1.57079632679489661923f)
MSIM_MATH_CONSTANT(M_PI_4, 0.785398163397448309616f)
MSIM_MATH_CONSTANT(M_1_PI, 0.318309886183790671538f)
MSIM_MATH_CONSTANT(M_2_PI, 0.636619772367581343076f)
MSIM_MATH_CONSTANT(M_2_SQRTPI, 1.12837916709551257390f)
MSIM_MATH_CONSTANT(M_SQRT2, 1.41421356237309504880f)
MSIM_MATH_CONSTANT(M_SQRT1_2, 0.707106781186547524401f)
#undef MSIM_MATH_CONSTANT

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
    return msim::libm::fmin(x, y);
  else
    return y < x ? y : x;
}
template <class T>
METAL_FUNC T maximum(T x, T y) {
  if constexpr (is_floating_point_v<T>)
    return msim::libm::fmax(x, y);
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
MSIM_FLOAT_UNARY(exp, msim::libm::exp(v))
MSIM_FLOAT_UNARY(exp2, msim::libm::exp2(v))
MSIM_FLOAT_UNARY(exp10, msim::libm::pow(decltype(v)(10), v))
MSIM_FLOAT_UNARY(log, msim::libm::log(v))
MSIM_FLOAT_UNARY(log2, msim::libm::log2(v))
MSIM_FLOAT_UNARY(log10, msim::libm::log10(v))
MSIM_FLOAT_UNARY(sqrt, msim::libm::sqrt(v))
MSIM_FLOAT_UNARY(rsqrt, decltype(v)(1) / msim::libm::sqrt(v))
MSIM_FLOAT_UNARY(sin, msim::libm::sin(v))
MSIM_FLOAT_UNARY(cos, msim::libm::cos(v))
MSIM_FLOAT_UNARY(tan, msim::libm::tan(v))
MSIM_FLOAT_UNARY(asin, msim::libm::asin(v))
MSIM_FLOAT_UNARY(acos, msim::libm::acos(v))
MSIM_FLOAT_UNARY(atan, msim::libm::atan(v))
MSIM_FLOAT_UNARY(sinh, msim::libm::sinh(v))
MSIM_FLOAT_UNARY(cosh, msim::libm::cosh(v))
MSIM_FLOAT_UNARY(tanh, msim::libm::tanh(v))
MSIM_FLOAT_UNARY(asinh, msim::libm::asinh(v))
MSIM_FLOAT_UNARY(acosh, msim::libm::acosh(v))
MSIM_FLOAT_UNARY(atanh, msim::libm::atanh(v))
MSIM_FLOAT_UNARY(floor, msim::libm::floor(v))
MSIM_FLOAT_UNARY(ceil, msim::libm::ceil(v))
MSIM_FLOAT_UNARY(round, msim::libm::round(v))
MSIM_FLOAT_UNARY(rint, msim::libm::rint(v))
MSIM_FLOAT_UNARY(trunc, msim::libm::trunc(v))
MSIM_FLOAT_UNARY(fract, msim::libm::fmin(v - msim::libm::floor(v), decltype(v)(0x1.fffffep-1)))
MSIM_FLOAT_UNARY(fabs, msim::libm::fabs(v))
MSIM_FLOAT_UNARY(saturate, msim::libm::fmin(msim::libm::fmax(v, decltype(v)(0)), decltype(v)(1)))
MSIM_FLOAT_UNARY(sign, v > 0 ? decltype(v)(1) : v < 0 ? decltype(v)(-1) : v == 0 ? decltype(v)(0) : v)
// cos(pi x) etc., with pi x formed in double so it is the float of the exact product.
MSIM_FLOAT_UNARY(cospi, decltype(v)(msim::libm::cos(3.14159265358979323846 * double(v))))
MSIM_FLOAT_UNARY(sinpi, decltype(v)(msim::libm::sin(3.14159265358979323846 * double(v))))
MSIM_FLOAT_UNARY(tanpi, decltype(v)(msim::libm::tan(3.14159265358979323846 * double(v))))
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
MSIM_BINARY(fmin, msim::libm::fmin(x, y))
MSIM_BINARY(fmax, msim::libm::fmax(x, y))
MSIM_BINARY(pow, msim::libm::pow(x, y))
MSIM_BINARY(powr, msim::libm::pow(x, y))
MSIM_BINARY(atan2, msim::libm::atan2(x, y))
MSIM_BINARY(fmod, msim::libm::fmod(x, y))
MSIM_BINARY(copysign, msim::libm::copysign(x, y))
MSIM_BINARY(step, (y < x ? decltype(x)(0) : decltype(x)(1)))
MSIM_BINARY(fdim, msim::libm::fdim(x, y))
MSIM_BINARY(divide, x / y)
MSIM_BINARY(nextafter, msim::libm::nextafter(x, y))
#undef MSIM_BINARY

// Three-operand min/max/median; the f-forms and the plain forms agree (as min/max do).
#define MSIM_TERNARY(name, expression)                                           \
  template <math_detail::arithmetic T>                                           \
  METAL_FUNC T name(T x, T y, T z) {                                             \
    return expression;                                                           \
  }
MSIM_TERNARY(fmax3, max(max(x, y), z))
MSIM_TERNARY(fmin3, min(min(x, y), z))
MSIM_TERNARY(fmedian3, max(min(x, y), min(max(x, y), z)))
MSIM_TERNARY(max3, max(max(x, y), z))
MSIM_TERNARY(min3, min(min(x, y), z))
MSIM_TERNARY(median3, max(min(x, y), min(max(x, y), z)))
#undef MSIM_TERNARY

// frexp(x, exponent) and ldexp(x, exponent): the mantissa in [0.5, 1) times 2^exponent.
template <math_detail::floating T, class E>
METAL_FUNC T frexp(T x, thread E& exponent) {
  if constexpr (vec_info<T>::size == 1) {
    int e = 0;
    T mantissa = static_cast<T>(msim::libm::frexp(math_detail::widen(x), &e));
    exponent = e;
    return mantissa;
  } else {
    T out;
    for (int i = 0; i < vec_info<T>::size; ++i) {
      int e = 0;
      out[i] = static_cast<math_detail::element_t<T>>(msim::libm::frexp(math_detail::widen(x[i]), &e));
      exponent[i] = e;
    }
    return out;
  }
}
template <math_detail::floating T, class E>
METAL_FUNC T ldexp(T x, E exponent) {
  return math_detail::map<T>([](auto m, auto e) { return msim::libm::ldexp(math_detail::widen(m), int(e)); }, x, exponent);
}

template <math_detail::arithmetic A, math_detail::arithmetic B, math_detail::arithmetic C>
METAL_FUNC auto clamp(A x, B lo, C hi) {
  return min(max(x, lo), hi);
}

template <math_detail::floating A, class B, class C>
METAL_FUNC A fma(A a, B b, C c) {
  using E = math_detail::element_t<A>;
  return math_detail::map<A>(
      [](auto x, auto y, auto z) {
        return msim::libm::fma(math_detail::widen(x), math_detail::widen(convert_element<E>(y)),
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
MSIM_PREDICATE(isnan, msim::libm::isnan(v))
MSIM_PREDICATE(isinf, msim::libm::isinf(v))
MSIM_PREDICATE(isfinite, msim::libm::isfinite(v))
MSIM_PREDICATE(signbit, msim::libm::signbit(v))
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
