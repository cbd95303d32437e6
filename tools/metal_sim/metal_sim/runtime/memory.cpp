// The dispatch's memory: buffers and threadgroup memory in guarded mappings,
// and the checks and counters of every access (bounds, uninitialised reads,
// data races), called through the hooks instrument.py puts before every
// device, constant and threadgroup access.
#include <sys/mman.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime.h"

namespace msim::detail {
namespace {

Region* find_region(uintptr_t address) {
  State& s = state();
  for (auto* list : {&s.threadgroup_regions, &s.device_regions})
    for (auto& r : *list)
      if (address >= r->guard_begin && address < r->guard_end) return r.get();
  return nullptr;
}

// set) may read uninitialised threadgroup bytes: they are flagged there
// instead, so the copy's destination stays uninitialised in those bytes.
void check_access(uintptr_t address, size_t size, bool is_write, const void* pc,
                  std::vector<uint8_t>* uninitialized = nullptr) {
  State& s = state();
  if (!s.checking) return;
  Region* r = find_region(address);
  if (!r) return;
  const char* verb = is_write ? "write" : "read";
  if (r->kind == RegionKind::unbound_device || r->kind == RegionKind::unbound_threadgroup)
    report_error(std::string(verb) + " through " + r->label + ", which is not bound", {nullptr, 0}, pc);
  if (address < r->begin || address + size > r->end) {
    long long offset = static_cast<long long>(address) - static_cast<long long>(r->begin);
    report_error("out-of-bounds " + std::string(verb) + " of " + std::to_string(size) + " bytes at byte offset " +
                     std::to_string(offset) + " of " + r->label + " (" + std::to_string(r->end - r->begin) +
                     " bytes)",
                 {nullptr, 0}, pc);
  }
  if (r->kind == RegionKind::bytes && is_write) report_error("write to set_bytes " + r->label, {nullptr, 0}, pc);
  size_t first = address - r->begin;
  uint8_t mark = is_write ? 2 : 1;
  for (size_t i = first; i < first + size; ++i) r->touched[i] |= mark;
  (is_write ? r->bytes_written : r->bytes_read) += size;
  if (r->kind != RegionKind::threadgroup) return;

  (is_write ? s.counters.threadgroup_bytes_written : s.counters.threadgroup_bytes_read) += size;
  const unsigned me = s.current->index;
  const unsigned my_simdgroup = me / kSimdWidth;
  for (size_t i = first; i < first + size; ++i) {
    WriteRecord& w = r->writes[i];
    if (is_write) {
      bool copies_uninitialized = uninitialized && (*uninitialized)[i - first];
      w = {copies_uninitialized ? kUninitialized : static_cast<uint16_t>(me), s.threadgroup_epoch,
           s.simdgroup_epochs[my_simdgroup]};
      continue;
    }
    if (w.writer == kUninitialized && uninitialized) {
      (*uninitialized)[i - first] = 1;
      continue;
    }
    if (w.writer == kUninitialized)
      report_error("read of uninitialized " + r->label + " at byte offset " + std::to_string(i) +
                       " (missing barrier or missing store?)",
                   {nullptr, 0}, pc);
    bool same_simdgroup = w.writer / kSimdWidth == my_simdgroup;
    bool synchronized = w.writer == me || w.threadgroup_epoch != s.threadgroup_epoch ||
                        (same_simdgroup && w.simdgroup_epoch != s.simdgroup_epochs[my_simdgroup]);
    if (!synchronized)
      report_error("data race on " + r->label + " at byte offset " + std::to_string(i) + ": thread " +
                       std::to_string(me) + " reads what thread " + std::to_string(w.writer) +
                       " wrote without a barrier in between",
                   {nullptr, 0}, pc);
  }
}

}  // namespace

char* map_guarded(size_t size, size_t guard) {
  size_t pages = (size + 4095) & ~size_t(4095);
  void* base = mmap(nullptr, pages + 2 * guard, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) report_error("simulator: out of address space");
  char* data = static_cast<char*>(base) + guard;
  if (pages && mprotect(data, pages, PROT_READ | PROT_WRITE) != 0) report_error("simulator: mprotect failed");
  return data;
}

Region* add_region(std::vector<std::unique_ptr<Region>>& list, RegionKind kind, unsigned index, std::string label,
                   char* begin, size_t size, size_t guard) {
  auto region = std::make_unique<Region>();
  region->kind = kind;
  region->index = index;
  region->label = std::move(label);
  region->begin = reinterpret_cast<uintptr_t>(begin);
  region->end = region->begin + size;
  region->guard_begin = region->begin - guard;
  region->guard_end = region->end + guard;
  region->touched.assign(size, 0);
  if (kind == RegionKind::threadgroup) region->writes.assign(size, WriteRecord{});
  list.push_back(std::move(region));
  return list.back().get();
}

Region* allocate_threadgroup(size_t size, size_t align, const std::string& label, SourceLoc where) {
  State& s = state();
  size_t rounded = (size + kThreadgroupAlignment - 1) / kThreadgroupAlignment * kThreadgroupAlignment;
  s.threadgroup_bytes += rounded;
  if (s.threadgroup_bytes > kThreadgroupMemoryLimit)
    report_error("threadgroup memory exceeds the 32 KiB limit (" + std::to_string(s.threadgroup_bytes) +
                     " bytes) when allocating " + label,
                 where, nullptr);
  align = std::max(align, kThreadgroupAlignment);
  size_t offset = (s.arena_used + align - 1) & ~(align - 1);
  s.arena_used = offset + rounded + kThreadgroupGap;
  return add_region(s.threadgroup_regions, RegionKind::threadgroup, 0, label, s.arena + offset, size,
                    kThreadgroupGap / 2);
}

Region* unbound_region(RegionKind kind, unsigned index) {
  State& s = state();
  bool device = kind == RegionKind::unbound_device;
  std::string label = (device ? "buffer(" : "threadgroup(") + std::to_string(index) + ")";
  char* guard = map_guarded(0, kDeviceGuard);
  auto& list = device ? s.device_regions : s.threadgroup_regions;
  return add_region(list, kind, index, label, guard, 0, kDeviceGuard);
}

}  // namespace msim::detail

// Memory hooks: calls to these precede every load, store and memcpy/memset
// through a device, constant or threadgroup pointer (see instrument.py).
extern "C" void __msim_load(uintptr_t address, size_t size) {
  msim::detail::check_access(address, size, false, __builtin_return_address(0));
}

extern "C" void __msim_store(uintptr_t address, size_t size) {
  msim::detail::check_access(address, size, true, __builtin_return_address(0));
}

// memcpy/memmove: copying uninitialised threadgroup bytes is no error (struct
// padding); the destination's copies of them stay uninitialised.
extern "C" void __msim_copy(uintptr_t destination, uintptr_t source, size_t size) {
  std::vector<uint8_t> uninitialized(size, 0);
  msim::detail::check_access(source, size, false, __builtin_return_address(0), &uninitialized);
  msim::detail::check_access(destination, size, true, __builtin_return_address(0), &uninitialized);
}

// Instructions of one executed basic block, by class (see instrument.py).
extern "C" void __msim_count(const uint64_t* counts) {
  msim::detail::State& s = msim::detail::state();
  if (!s.checking) return;
  for (size_t i = 0; i < msim::detail::kInstructionClassCount; ++i) s.counters.instructions[i] += counts[i];
}
