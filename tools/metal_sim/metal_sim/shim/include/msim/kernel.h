// Glue used by the code the rewriter generates: binding kernel parameters,
// function constants and threadgroup arrays declared inside functions.
#pragma once

#include <cstdlib>

#include "types.h"

namespace msim {

template <class F, size_t I>
struct parameter;
template <class R, class... A, size_t I>
struct parameter<R(A...), I> {
  using type = __type_pack_element<I, A...>;
};
template <class F, size_t I>
using parameter_t = typename parameter<F, I>::type;

// A buffer parameter is a pointer (`device T*`) or a reference (`constant T&`).
template <class P>
METAL_FUNC P bind_buffer(void* address) {
  if constexpr (std::is_pointer_v<P>)
    return (P)address;
  else
    return *(std::remove_reference_t<P>*)address;
}

template <class P>
METAL_FUNC P bind_builtin(Builtin builtin) {
  using T = std::remove_cv_t<P>;
  unsigned value[3];
  builtin_value(builtin, value);
  if constexpr (metal::vec_info<T>::size == 1) {
    return static_cast<T>(value[0]);
  } else {
    T out{};
    for (int i = 0; i < metal::vec_info<T>::size; ++i) out[i] = value[i];
    return out;
  }
}

struct KernelRegistration {
  KernelRegistration(const char* host_name, void (*entry)()) { register_kernel({host_name, entry}); }
};

template <class Declared>
auto function_constant(unsigned index) {
  using T = std::remove_cv_t<metal::remove_addrspace_t<Declared>>;
  const char* text = function_constant_text(index);
  if (!text) return T{};
  if constexpr (std::is_same_v<T, bool>)
    return text[0] == '1';
  else if constexpr (metal::is_floating_point_v<T>)
    return static_cast<T>(std::strtod(text, nullptr));
  else
    return static_cast<T>(std::strtoll(text, nullptr, 0));
}

inline bool function_constant_defined(unsigned index) { return function_constant_text(index) != nullptr; }

// One shared array per declaration and template instantiation (the lambda
// type `Key` is unique to each), allocated per threadgroup by the runtime.
template <class Array, class Key>
METAL_FUNC threadgroup Array& threadgroup_array(Key, SourceLoc where = SourceLoc::current()) {
  static const char key = 0;
  return *(threadgroup Array*)threadgroup_array(&key, sizeof(Array), alignof(Array), where);
}

}  // namespace msim
