// Barriers and SIMD-group / quad-group collectives. Each is a
// synchronisation point: the runtime runs the collective once all 32 lanes
// (the lanes that exist) have reached the same call site.
#pragma once

#include "math.h"

namespace metal {

enum class mem_flags : uint {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
METAL_FUNC constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }

METAL_FUNC void threadgroup_barrier(mem_flags, msim::SourceLoc where = msim::SourceLoc::current()) {
  msim::synchronize(msim::Scope::threadgroup_wide, "threadgroup_barrier", nullptr, nullptr, where);
}

METAL_FUNC void simdgroup_barrier(mem_flags, msim::SourceLoc where = msim::SourceLoc::current()) {
  msim::synchronize(msim::Scope::simdgroup_wide, "simdgroup_barrier", nullptr, nullptr, where);
}

namespace simd_detail {

constexpr uint kWidth = 32;

template <class T>
struct Slot {
  T value;
  uint source;  // lane whose value this lane receives (shuffles)
};

// Sends every lane the value of lane `source` (within its `group` lanes);
// a lane whose source is outside the group keeps its own value.
template <class T, uint Group>
void exchange(void* const* lanes, uint) {
  T values[kWidth];
  for (uint i = 0; i < kWidth; ++i)
    if (lanes[i]) values[i] = static_cast<Slot<T>*>(lanes[i])->value;
  for (uint i = 0; i < kWidth; ++i) {
    if (!lanes[i]) continue;
    auto* slot = static_cast<Slot<T>*>(lanes[i]);
    uint source = slot->source;
    if (source / Group == i / Group && lanes[source]) slot->value = values[source];
  }
}

enum class Pattern { index, xor_mask, down, up, rotate_down, rotate_up };

// Lane read by `lane`; a lane outside the caller's group of `Group` lanes
// means "keep your own value" (the edges of shuffle_down/up).
template <uint Group>
METAL_FUNC uint source_lane(Pattern pattern, uint lane, uint argument) {
  uint base = lane / Group * Group, offset = lane - base;
  switch (pattern) {
    case Pattern::index: return base + argument % Group;
    case Pattern::xor_mask: return lane ^ argument;
    case Pattern::down: return lane + argument;
    case Pattern::up: return offset >= argument ? lane - argument : ~0u;
    case Pattern::rotate_down: return base + (offset + argument) % Group;
    case Pattern::rotate_up: return base + (offset + Group - argument % Group) % Group;
  }
  return lane;
}

template <uint Group, class T>
METAL_FUNC T shuffle(T x, uint source, const char* what, msim::SourceLoc where) {
  Slot<T> slot{x, source};
  msim::synchronize(msim::Scope::simdgroup_wide, what, exchange<T, Group>, &slot, where);
  return slot.value;
}

// Tree reduction over each aligned group of `Group` lanes, pairing lanes
// i and i ^ d for d = 1, 2, 4, ... as a butterfly of shuffles would.
template <class T, uint Group, class Op>
void reduce(void* const* lanes, uint) {
  T values[kWidth];
  bool present[kWidth];
  for (uint i = 0; i < kWidth; ++i) {
    present[i] = lanes[i] != nullptr;
    if (present[i]) values[i] = static_cast<Slot<T>*>(lanes[i])->value;
  }
  for (uint d = 1; d < Group; d *= 2)
    for (uint i = 0; i < kWidth; ++i)
      if ((i & d) == 0 && present[i | d]) {
        values[i] = present[i] ? Op{}(values[i], values[i | d]) : values[i | d];
        present[i] = true;
      }
  for (uint i = 0; i < kWidth; ++i)
    if (lanes[i]) static_cast<Slot<T>*>(lanes[i])->value = values[i / Group * Group];
}

template <uint Group, class Op, class T>
METAL_FUNC T reduction(T x, const char* what, msim::SourceLoc where) {
  Slot<T> slot{x, 0};
  msim::synchronize(msim::Scope::simdgroup_wide, what, reduce<T, Group, Op>, &slot, where);
  return slot.value;
}

// Running `Op` over the lanes in order, starting from `Op`'s identity.
template <class T, bool Inclusive, class Op>
void prefix(void* const* lanes, uint) {
  T running = T(Op::identity);
  for (uint i = 0; i < kWidth; ++i) {
    if (!lanes[i]) continue;
    auto* slot = static_cast<Slot<T>*>(lanes[i]);
    T value = slot->value;
    T next = Op{}(running, value);
    slot->value = Inclusive ? next : running;
    running = next;
  }
}

// simd_shuffle_and_fill_down/up: lane l of each aligned group of `modulo`
// lanes reads lane l + delta (l - delta) of `data`; past the group's end
// (start) it reads the wrapped-around lane of `filling`.
template <class T>
struct FillSlot {
  T value, filling;
  uint source;
  bool from_filling;
};

template <class T>
void exchange_and_fill(void* const* lanes, uint) {
  T values[kWidth], fillings[kWidth];
  for (uint i = 0; i < kWidth; ++i)
    if (lanes[i]) {
      auto* slot = static_cast<FillSlot<T>*>(lanes[i]);
      values[i] = slot->value, fillings[i] = slot->filling;
    }
  for (uint i = 0; i < kWidth; ++i) {
    if (!lanes[i]) continue;
    auto* slot = static_cast<FillSlot<T>*>(lanes[i]);
    if (lanes[slot->source]) slot->value = (slot->from_filling ? fillings : values)[slot->source];
  }
}

template <class T>
METAL_FUNC T shuffle_and_fill(T data, T filling, int delta, uint modulo, const char* what, msim::SourceLoc where) {
  uint lane = msim::simd_lane();
  uint base = lane / modulo * modulo;
  int offset = int(lane - base) + delta;
  bool from_filling = offset < 0 || offset >= int(modulo);
  FillSlot<T> slot{data, filling, base + uint((offset + int(modulo)) % int(modulo)), from_filling};
  msim::synchronize(msim::Scope::simdgroup_wide, what, exchange_and_fill<T>, &slot, where);
  return slot.value;
}

struct Sum {
  static constexpr int identity = 0;
  template <class T>
  T operator()(T a, T b) const { return a + b; }
};
struct Product {
  static constexpr int identity = 1;
  template <class T>
  T operator()(T a, T b) const { return a * b; }
};
struct Max {
  template <class T>
  T operator()(T a, T b) const { return metal::max(a, b); }
};
struct Min {
  template <class T>
  T operator()(T a, T b) const { return metal::min(a, b); }
};
// Bitwise operations; on floating-point values (MLX's bfloat simd_xor passes
// float) they act on the representation.
template <class T, class F>
METAL_FUNC T bitwise(T a, T b, F f) {
  if constexpr (is_floating_point_v<T>) {
    using Bits = conditional_t<sizeof(T) == 2, ushort, conditional_t<sizeof(T) == 4, uint, ulong>>;
    return as_type<T>(Bits(f(as_type<Bits>(a), as_type<Bits>(b))));
  } else {
    return f(a, b);
  }
}
struct And {
  template <class T>
  T operator()(T a, T b) const { return bitwise(a, b, [](auto x, auto y) { return x & y; }); }
};
struct Or {
  template <class T>
  T operator()(T a, T b) const { return bitwise(a, b, [](auto x, auto y) { return x | y; }); }
};
struct Xor {
  template <class T>
  T operator()(T a, T b) const { return bitwise(a, b, [](auto x, auto y) { return x ^ y; }); }
};

}  // namespace simd_detail

#define MSIM_REDUCTION(prefix, group, name, op)                                             \
  template <class T>                                                                        \
  METAL_FUNC T prefix##_##name(T x, msim::SourceLoc where = msim::SourceLoc::current()) {   \
    return simd_detail::reduction<group, simd_detail::op>(x, #prefix "_" #name, where);      \
  }
#define MSIM_REDUCTIONS(prefix, group)        \
  MSIM_REDUCTION(prefix, group, sum, Sum)     \
  MSIM_REDUCTION(prefix, group, product, Product) \
  MSIM_REDUCTION(prefix, group, max, Max)     \
  MSIM_REDUCTION(prefix, group, min, Min)     \
  MSIM_REDUCTION(prefix, group, and, And)     \
  MSIM_REDUCTION(prefix, group, or, Or)       \
  MSIM_REDUCTION(prefix, group, xor, Xor)
MSIM_REDUCTIONS(simd, 32)
MSIM_REDUCTIONS(quad, 4)
#undef MSIM_REDUCTIONS
#undef MSIM_REDUCTION

#define MSIM_SHUFFLE(prefix, group, name, pattern)                                                \
  template <class T>                                                                              \
  METAL_FUNC T prefix##_##name(T x, ushort argument, msim::SourceLoc where = msim::SourceLoc::current()) { \
    uint source = simd_detail::source_lane<group>(simd_detail::Pattern::pattern, msim::simd_lane(), argument); \
    return simd_detail::shuffle<group>(x, source, #prefix "_" #name, where);                      \
  }
#define MSIM_SHUFFLES(prefix, group)                                  \
  MSIM_SHUFFLE(prefix, group, shuffle, index)                         \
  MSIM_SHUFFLE(prefix, group, broadcast, index)                       \
  MSIM_SHUFFLE(prefix, group, shuffle_xor, xor_mask)                  \
  MSIM_SHUFFLE(prefix, group, shuffle_down, down)                     \
  MSIM_SHUFFLE(prefix, group, shuffle_up, up)                         \
  MSIM_SHUFFLE(prefix, group, shuffle_rotate_down, rotate_down)       \
  MSIM_SHUFFLE(prefix, group, shuffle_rotate_up, rotate_up)
MSIM_SHUFFLES(simd, 32)
MSIM_SHUFFLES(quad, 4)
#undef MSIM_SHUFFLES
#undef MSIM_SHUFFLE

template <class T>
METAL_FUNC T simd_broadcast_first(T x, msim::SourceLoc where = msim::SourceLoc::current()) {
  return simd_detail::shuffle<32>(x, 0, "simd_broadcast_first", where);
}

#define MSIM_PREFIX(kind, inclusive, name, op)                                                  \
  template <class T>                                                                          \
  METAL_FUNC T simd_prefix_##kind##_##name(T x, msim::SourceLoc where = msim::SourceLoc::current()) { \
    simd_detail::Slot<T> slot{x, 0};                                                          \
    msim::synchronize(msim::Scope::simdgroup_wide, "simd_prefix_" #kind "_" #name,            \
                      simd_detail::prefix<T, inclusive, simd_detail::op>, &slot, where);      \
    return slot.value;                                                                        \
  }
MSIM_PREFIX(inclusive, true, sum, Sum)
MSIM_PREFIX(exclusive, false, sum, Sum)
MSIM_PREFIX(inclusive, true, product, Product)
MSIM_PREFIX(exclusive, false, product, Product)
#undef MSIM_PREFIX

template <class T>
METAL_FUNC T simd_shuffle_and_fill_down(T data, T filling, ushort delta, ushort modulo = 32,
                                        msim::SourceLoc where = msim::SourceLoc::current()) {
  return simd_detail::shuffle_and_fill(data, filling, delta, modulo, "simd_shuffle_and_fill_down", where);
}

template <class T>
METAL_FUNC T simd_shuffle_and_fill_up(T data, T filling, ushort delta, ushort modulo = 32,
                                      msim::SourceLoc where = msim::SourceLoc::current()) {
  return simd_detail::shuffle_and_fill(data, filling, -int(delta), modulo, "simd_shuffle_and_fill_up", where);
}

METAL_FUNC bool simd_all(bool x, msim::SourceLoc where = msim::SourceLoc::current()) {
  return simd_detail::reduction<32, simd_detail::And>(x, "simd_all", where);
}

METAL_FUNC bool simd_any(bool x, msim::SourceLoc where = msim::SourceLoc::current()) {
  return simd_detail::reduction<32, simd_detail::Or>(x, "simd_any", where);
}

}  // namespace metal
