// Metal's address spaces as clang address spaces, so mixing them is a
// compile error as with Apple's compiler. `thread` is the default space.
// Force-included after preprocessing (see rewrite.py): the keywords stay
// plain tokens while the rewriter looks at the source.
#pragma once

#define device __attribute__((address_space(1)))
// Metal's constant memory is read-only: `constant int&` is `const constant int&`.
#define constant const __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define threadgroup_imageblock __attribute__((address_space(3)))
#define thread

// Assignment of a class object across address spaces (`tg[i] = in[i]` for a
// struct in device and threadgroup memory): C++ only generates it for the
// generic space, so the rewriter puts MSIM_CROSS_SPACE_ASSIGNMENT into every
// class the kernels define. A template, so the class stays an aggregate and
// trivially copyable; the copy is a memcpy, traced byte for byte.
namespace msim {
template <class T>
struct object_in_space {
  using type = T;
};
template <class T>
struct object_in_space<device T> {
  using type = T;
};
template <class T>
struct object_in_space<constant T> {
  using type = T;
};
template <class T>
struct object_in_space<threadgroup T> {
  using type = T;
};
template <class T>
using object_t = __remove_cv(typename object_in_space<__remove_cvref(T)>::type);
template <class T>
constexpr bool in_generic_space = __is_same(__remove_cvref(T), object_t<T>);
template <class Self, class Other>
concept cross_space_assignable =
    __is_lvalue_reference(Self) && !__is_const(__remove_reference_t(Self)) &&
    __is_same(object_t<Self>, object_t<Other>) &&
    !(in_generic_space<Self> && in_generic_space<Other>);
}  // namespace msim

#define MSIM_CROSS_SPACE_ASSIGNMENT                                                        \
  template <class MsimSelf, class MsimOther>                                               \
    requires ::msim::cross_space_assignable<MsimSelf, MsimOther>                           \
  __attribute__((always_inline)) MsimSelf&& operator=(this MsimSelf&& msim_self,           \
                                                      MsimOther&& msim_other) {            \
    __builtin_memcpy(&msim_self, &msim_other, sizeof(::msim::object_t<MsimSelf>));        \
    return static_cast<MsimSelf&&>(msim_self);                                             \
  }
