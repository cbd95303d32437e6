// The simulated threads of a threadgroup: one fiber each on one OS thread,
// switching only at barriers and collectives, which are released once
// every thread of their simdgroup or threadgroup waits at the same point
// (anything else is divergence).
#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "runtime.h"

namespace msim::detail {
namespace {

extern "C" void msim_switch(void** save_sp, void* load_sp);

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, swaps stacks,
// restores the other fiber's registers and returns into it.
asm(R"(
  .text
  .globl msim_switch
  .type msim_switch, @function
msim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size msim_switch, .-msim_switch
)");
#else
#error "the Metal simulator's fiber switch supports x86-64 only"
#endif

[[noreturn]] void fiber_main();

void start_fiber(Fiber& f) {
  // Stack image that msim_switch pops: six registers, then fiber_main as the
  // return address, then a null return address for fiber_main itself.
  auto* top = reinterpret_cast<void**>((reinterpret_cast<uintptr_t>(f.stack) + kFiberStack) & ~uintptr_t(15));
  *--top = nullptr;
  *--top = reinterpret_cast<void*>(&fiber_main);
  for (int i = 0; i < 6; ++i) *--top = nullptr;
  f.sp = top;
  f.done = f.waiting = false;
}

void switch_to_scheduler() {
  State& s = state();
  msim_switch(&s.current->sp, s.scheduler_sp);
}

[[noreturn]] void fiber_main() {
  g_entry();
  state().current->done = true;
  switch_to_scheduler();
  __builtin_unreachable();
}

bool same_point(const Fiber& a, const Fiber& b) {
  return a.scope == b.scope && a.collective == b.collective && a.where.line == b.where.line &&
         std::strcmp(a.what, b.what) == 0 && std::strcmp(a.where.file, b.where.file) == 0;
}

std::string point_name(const Fiber& f) {
  if (f.done) return "exited the kernel";
  return std::string(f.what) + " at " + describe(f.where);
}

// Lists which threads stand where, grouping equal positions.
[[noreturn]] void report_divergence(const char* kind, const std::vector<Fiber*>& group) {
  std::vector<std::pair<std::string, std::vector<unsigned>>> positions;
  for (Fiber* f : group) {
    std::string name = point_name(*f);
    auto it = std::find_if(positions.begin(), positions.end(), [&](auto& p) { return p.first == name; });
    if (it == positions.end()) positions.push_back({name, {}}), it = positions.end() - 1;
    it->second.push_back(f->index);
  }
  std::string message = std::string("divergent ") + kind + " (threadgroup " +
                        std::to_string(state().threadgroup_position[0]) + "," +
                        std::to_string(state().threadgroup_position[1]) + "," +
                        std::to_string(state().threadgroup_position[2]) + "):";
  for (auto& [name, threads] : positions) {
    message += " threads " + std::to_string(threads.front());
    if (threads.size() > 1) message += ".." + std::to_string(threads.back());
    message += " (" + std::to_string(threads.size()) + ") " + name + ";";
  }
  const Fiber* located = nullptr;
  for (Fiber* f : group)
    if (!f->done) located = f;
  report_error(message, located ? located->where : SourceLoc{nullptr, 0}, nullptr);
}

// Completes the synchronisation point every member of `group` waits at.
void release(std::vector<Fiber*>& group, const char* kind) {
  for (Fiber* f : group)
    if (f->done || !same_point(*f, *group.front())) report_divergence(kind, group);
  State& s = state();
  Fiber& first = *group.front();
  if (first.collective) {
    void* data[kMaxThreadsPerThreadgroup] = {};
    unsigned base = first.scope == Scope::simdgroup_wide ? first.index / kSimdWidth * kSimdWidth : 0;
    unsigned count = first.scope == Scope::simdgroup_wide ? kSimdWidth : s.threads_per_threadgroup;
    for (Fiber* f : group) data[f->index - base] = f->data;
    first.collective(data, count);
    ++s.counters.simd_collectives;
  } else if (first.scope == Scope::simdgroup_wide) {
    ++s.simdgroup_epochs[first.index / kSimdWidth];
    ++s.counters.simdgroup_barriers;
  } else {
    ++s.threadgroup_epoch;
    ++s.counters.threadgroup_barriers;
  }
  for (Fiber* f : group) f->waiting = false;
}

std::span<Fiber> threadgroup_fibers() {
  State& s = state();
  return {s.fibers.data(), s.threads_per_threadgroup};
}

// Called when no fiber can run: releases whole simdgroups first, then a
// threadgroup-wide point; anything else is divergence.
void resolve() {
  State& s = state();
  bool released = false;
  for (unsigned begin = 0; begin < s.threads_per_threadgroup; begin += kSimdWidth) {
    std::vector<Fiber*> lanes;
    bool simd_wait = false;
    for (unsigned i = begin; i < std::min(begin + kSimdWidth, s.threads_per_threadgroup); ++i) {
      lanes.push_back(&s.fibers[i]);
      simd_wait |= !s.fibers[i].done && s.fibers[i].scope == Scope::simdgroup_wide;
    }
    if (!simd_wait) continue;
    release(lanes, "simdgroup operation");
    released = true;
  }
  if (released) return;
  std::vector<Fiber*> all;
  for (Fiber& f : threadgroup_fibers()) all.push_back(&f);
  release(all, "threadgroup barrier");
}

}  // namespace

void (*g_entry)() = nullptr;

void run_threadgroup() {
  State& s = state();
  s.threadgroup_regions.clear();
  s.threadgroup_arrays.clear();
  s.threadgroup_buffers.clear();
  s.arena_used = kThreadgroupGap;
  s.threadgroup_bytes = 0;
  s.threadgroup_epoch = 0;
  std::fill(s.simdgroup_epochs.begin(), s.simdgroup_epochs.end(), 0);
  for (Fiber& f : threadgroup_fibers()) start_fiber(f);
  for (;;) {
    bool any_waiting = false;
    for (Fiber& f : threadgroup_fibers()) {
      if (f.done || f.waiting) continue;
      s.current = &f;
      msim_switch(&s.scheduler_sp, f.sp);
    }
    for (Fiber& f : threadgroup_fibers()) any_waiting |= !f.done;
    if (!any_waiting) break;
    resolve();
  }
  ++s.counters.threadgroups;
  s.counters.threads += s.threads_per_threadgroup;
}

}  // namespace msim::detail

namespace msim {

void synchronize(Scope scope, const char* what, CollectiveFn collective, void* data, SourceLoc where) {
  detail::Fiber& f = *detail::state().current;
  f.scope = scope;
  f.what = what;
  f.collective = collective;
  f.data = data;
  f.where = where;
  f.waiting = true;
  detail::switch_to_scheduler();
}

}  // namespace msim
