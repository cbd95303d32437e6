// Metal's private builtins (`__metal_fabs(x, mode)`, `__metal_simd_sum(x)`, ...)
// and the math-mode macros Apple's compiler predefines: MLX's bf16_math.h
// builds its bfloat overloads on them. Each forwards to the public function;
// the mode argument is ignored (the shim's fast and precise math are one).
#pragma once

#include "sync.h"

#define __METAL_MAYBE_FAST_MATH__ false
#define __METAL_FAST_MATH__ true
#define __METAL_PRECISE_MATH__ false

#define MSIM_PRIVATE_UNARY(name)                \
  template <class T>                            \
  METAL_FUNC T __metal_##name(T x, bool) {      \
    return metal::name(x);                      \
  }
MSIM_PRIVATE_UNARY(acos)
MSIM_PRIVATE_UNARY(acosh)
MSIM_PRIVATE_UNARY(asin)
MSIM_PRIVATE_UNARY(asinh)
MSIM_PRIVATE_UNARY(atan)
MSIM_PRIVATE_UNARY(atanh)
MSIM_PRIVATE_UNARY(ceil)
MSIM_PRIVATE_UNARY(cos)
MSIM_PRIVATE_UNARY(cosh)
MSIM_PRIVATE_UNARY(cospi)
MSIM_PRIVATE_UNARY(exp)
MSIM_PRIVATE_UNARY(exp10)
MSIM_PRIVATE_UNARY(exp2)
MSIM_PRIVATE_UNARY(fabs)
MSIM_PRIVATE_UNARY(floor)
MSIM_PRIVATE_UNARY(fract)
MSIM_PRIVATE_UNARY(log)
MSIM_PRIVATE_UNARY(log10)
MSIM_PRIVATE_UNARY(log2)
MSIM_PRIVATE_UNARY(rint)
MSIM_PRIVATE_UNARY(round)
MSIM_PRIVATE_UNARY(rsqrt)
MSIM_PRIVATE_UNARY(sin)
MSIM_PRIVATE_UNARY(sinh)
MSIM_PRIVATE_UNARY(sinpi)
MSIM_PRIVATE_UNARY(sqrt)
MSIM_PRIVATE_UNARY(tan)
MSIM_PRIVATE_UNARY(tanh)
MSIM_PRIVATE_UNARY(tanpi)
MSIM_PRIVATE_UNARY(trunc)
#undef MSIM_PRIVATE_UNARY

#define MSIM_PRIVATE_BINARY(name)                 \
  template <class T>                              \
  METAL_FUNC T __metal_##name(T x, T y, bool) {   \
    return metal::name(x, y);                     \
  }
MSIM_PRIVATE_BINARY(atan2)
MSIM_PRIVATE_BINARY(divide)
MSIM_PRIVATE_BINARY(fmax)
MSIM_PRIVATE_BINARY(fmin)
MSIM_PRIVATE_BINARY(fmod)
MSIM_PRIVATE_BINARY(pow)
MSIM_PRIVATE_BINARY(powr)
#undef MSIM_PRIVATE_BINARY

#define MSIM_PRIVATE_TERNARY(name)                     \
  template <class T>                                   \
  METAL_FUNC T __metal_##name(T x, T y, T z, bool) {   \
    return metal::name(x, y, z);                       \
  }
MSIM_PRIVATE_TERNARY(fmax3)
MSIM_PRIVATE_TERNARY(fmedian3)
MSIM_PRIVATE_TERNARY(fmin3)
#undef MSIM_PRIVATE_TERNARY

template <class T>
METAL_FUNC T __metal_fma(T x, T y, T z) {
  return metal::fma(x, y, z);
}
template <class T>
METAL_FUNC T __metal_nextafter(T x, T y) {
  return metal::nextafter(x, y);
}
template <class T>
METAL_FUNC T __metal_frexp(T x, thread int* exponent) {
  return metal::frexp(x, *exponent);
}
template <class T>
METAL_FUNC T __metal_ldexp(T x, int exponent, bool) {
  return metal::ldexp(x, exponent);
}

// SIMD-group builtins. They report divergence at the line of the call in
// the header that wraps them (bf16_math.h), not the kernel's.
#define MSIM_PRIVATE_SIMD(name)                       \
  template <class T>                                  \
  METAL_FUNC T __metal_simd_##name(T x) {             \
    return metal::simd_##name(x);                     \
  }
MSIM_PRIVATE_SIMD(max)
MSIM_PRIVATE_SIMD(min)
MSIM_PRIVATE_SIMD(prefix_exclusive_product)
MSIM_PRIVATE_SIMD(prefix_exclusive_sum)
MSIM_PRIVATE_SIMD(prefix_inclusive_product)
MSIM_PRIVATE_SIMD(prefix_inclusive_sum)
MSIM_PRIVATE_SIMD(product)
MSIM_PRIVATE_SIMD(sum)
MSIM_PRIVATE_SIMD(xor)
#undef MSIM_PRIVATE_SIMD

#define MSIM_PRIVATE_SHUFFLE(name)                              \
  template <class T>                                            \
  METAL_FUNC T __metal_simd_##name(T x, ushort argument) {      \
    return metal::simd_##name(x, argument);                     \
  }
MSIM_PRIVATE_SHUFFLE(broadcast)
MSIM_PRIVATE_SHUFFLE(shuffle)
MSIM_PRIVATE_SHUFFLE(shuffle_down)
MSIM_PRIVATE_SHUFFLE(shuffle_rotate_down)
MSIM_PRIVATE_SHUFFLE(shuffle_rotate_up)
MSIM_PRIVATE_SHUFFLE(shuffle_up)
MSIM_PRIVATE_SHUFFLE(shuffle_xor)
#undef MSIM_PRIVATE_SHUFFLE

template <class T>
METAL_FUNC T __metal_simd_shuffle_and_fill_down(T data, T filling, ushort delta, ushort modulo) {
  return metal::simd_shuffle_and_fill_down(data, filling, delta, modulo);
}
template <class T>
METAL_FUNC T __metal_simd_shuffle_and_fill_up(T data, T filling, ushort delta, ushort modulo) {
  return metal::simd_shuffle_and_fill_up(data, filling, delta, modulo);
}

// MLX reads the lane index and the SIMD-group width through these.
template <class T>
METAL_FUNC T __metal_get_thread_index_in_simdgroup(T) {
  return static_cast<T>(msim::simd_lane());
}
template <class T>
METAL_FUNC T __metal_get_simdgroup_size(T) {
  return static_cast<T>(metal::simd_detail::kWidth);
}
