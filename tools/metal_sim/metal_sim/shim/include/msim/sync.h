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

template <class T, bool Inclusive>
void prefix_sum(void* const* lanes, uint) {
  T running = T(0);
  for (uint i = 0; i < kWidth; ++i) {
    if (!lanes[i]) continue;
    auto* slot = static_cast<Slot<T>*>(lanes[i]);
    T value = slot->value;
    slot->value = Inclusive ? running + value : running;
    running += value;
  }
}

struct Sum {
  template <class T>
  T operator()(T a, T b) const { return a + b; }
};
struct Product {
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
struct And {
  template <class T>
  T operator()(T a, T b) const { return a & b; }
};
struct Or {
  template <class T>
  T operator()(T a, T b) const { return a | b; }
};
struct Xor {
  template <class T>
  T operator()(T a, T b) const { return a ^ b; }
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

template <class T>
METAL_FUNC T simd_prefix_inclusive_sum(T x, msim::SourceLoc where = msim::SourceLoc::current()) {
  simd_detail::Slot<T> slot{x, 0};
  msim::synchronize(msim::Scope::simdgroup_wide, "simd_prefix_inclusive_sum", simd_detail::prefix_sum<T, true>, &slot, where);
  return slot.value;
}

template <class T>
METAL_FUNC T simd_prefix_exclusive_sum(T x, msim::SourceLoc where = msim::SourceLoc::current()) {
  simd_detail::Slot<T> slot{x, 0};
  msim::synchronize(msim::Scope::simdgroup_wide, "simd_prefix_exclusive_sum", simd_detail::prefix_sum<T, false>, &slot, where);
  return slot.value;
}

METAL_FUNC bool simd_all(bool x, msim::SourceLoc where = msim::SourceLoc::current()) {
  return simd_detail::reduction<32, simd_detail::And>(x, "simd_all", where);
}

METAL_FUNC bool simd_any(bool x, msim::SourceLoc where = msim::SourceLoc::current()) {
  return simd_detail::reduction<32, simd_detail::Or>(x, "simd_any", where);
}

}  // namespace metal

// MLX reads the lane index through this compiler intrinsic.
template <class T>
METAL_FUNC T __metal_get_thread_index_in_simdgroup(T) {
  return static_cast<T>(msim::simd_lane());
}
