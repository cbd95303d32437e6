// Simulator runtime: runs one dispatch of one kernel, then exits.
//
// The Python side starts this executable once per dispatch (crash isolation),
// writes the request to stdin and the buffer contents to a data file, and
// reads a one-line JSON report from stdout. Every simulated thread of a
// threadgroup is a fiber on one OS thread; fibers switch only at barriers and
// collectives. Memory checks and counters come from the __msim_load/store/copy
// calls instrument.py puts before every device/constant/threadgroup access.
// runtime.h lists the runtime's files.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "runtime.h"

namespace msim::detail {
namespace {

std::vector<Kernel>& kernels() {
  static std::vector<Kernel> instance;
  return instance;
}

int run() {
  install_signal_handlers();
  State& s = state();
  Request& r = request();
  auto kernel = std::find_if(kernels().begin(), kernels().end(),
                             [&](const Kernel& k) { return r.kernel == k.host_name; });
  if (kernel == kernels().end()) report_error("no kernel named " + r.kernel);
  g_entry = kernel->entry;

  unsigned threads = r.threadgroup[0] * r.threadgroup[1] * r.threadgroup[2];
  if (threads == 0 || threads > kMaxThreadsPerThreadgroup)
    report_error("threadgroup size " + std::to_string(threads) + " is not in 1..1024");
  if (r.grid_in_threads)
    for (int i = 0; i < 3; ++i) r.grid[i] = (r.threads[i] + r.threadgroup[i] - 1) / r.threadgroup[i];

  FILE* data = fopen(r.data_path.c_str(), "r+b");
  if (!data) report_error("simulator: cannot open " + r.data_path);
  std::vector<std::pair<const BufferBinding*, char*>> copies;
  for (const BufferBinding& b : r.buffers) {
    char* memory = map_guarded(b.size, kDeviceGuard);
    if (fseek(data, static_cast<long>(b.offset), SEEK_SET) != 0 || fread(memory, 1, b.size, data) != b.size)
      report_error("simulator: short read of buffer data");
    std::string label = (b.is_bytes ? "set_bytes buffer(" : "buffer(") + std::to_string(b.index) + ")";
    s.device_by_index[b.index] = add_region(s.device_regions, b.is_bytes ? RegionKind::bytes : RegionKind::device,
                                            b.index, label, memory, b.size, kDeviceGuard);
    copies.push_back({&b, memory});
  }

  s.arena_size = kThreadgroupMemoryLimit * 4 + 64 * kThreadgroupGap;
  s.arena = map_guarded(s.arena_size, kDeviceGuard);
  s.fibers.resize(threads);
  char* stacks = map_guarded(threads * (kFiberStack + 4096), 0);
  for (unsigned i = 0; i < threads; ++i) {
    s.fibers[i].index = i;
    // The lowest page of each stack is a guard so overflow faults.
    s.fibers[i].stack = stacks + i * (kFiberStack + 4096) + 4096;
    mprotect(s.fibers[i].stack - 4096, 4096, PROT_NONE);
  }
  s.simdgroup_epochs.assign((threads + kSimdWidth - 1) / kSimdWidth, 0);

  s.checking = true;
  for (unsigned z = 0; z < r.grid[2]; ++z)
    for (unsigned y = 0; y < r.grid[1]; ++y)
      for (unsigned x = 0; x < r.grid[0]; ++x) {
        s.threadgroup_position[0] = x, s.threadgroup_position[1] = y, s.threadgroup_position[2] = z;
        s.threads_per_threadgroup = 1;
        for (int i = 0; i < 3; ++i) {
          unsigned extent = r.threadgroup[i];
          if (r.grid_in_threads) extent = std::min(extent, r.threads[i] - s.threadgroup_position[i] * extent);
          s.group_size[i] = extent;
          s.threads_per_threadgroup *= extent;
        }
        run_threadgroup();
      }
  s.checking = false;

  for (auto& [binding, memory] : copies) {
    if (binding->is_bytes) continue;
    if (fseek(data, static_cast<long>(binding->offset), SEEK_SET) != 0 ||
        fwrite(memory, 1, binding->size, data) != binding->size)
      report_error("simulator: short write of buffer data");
  }
  fclose(data);
  write_counters(std::cout);
  return 0;
}

}  // namespace

}  // namespace msim::detail

namespace msim {

using namespace detail;

void register_kernel(const Kernel& kernel) { kernels().push_back(kernel); }

void* buffer_address(unsigned index) {
  State& s = state();
  auto it = s.device_by_index.find(index);
  if (it == s.device_by_index.end())
    it = s.device_by_index.emplace(index, unbound_region(RegionKind::unbound_device, index)).first;
  return reinterpret_cast<void*>(it->second->begin);
}

void* threadgroup_buffer_address(unsigned index) {
  State& s = state();
  auto it = s.threadgroup_buffers.find(index);
  if (it == s.threadgroup_buffers.end()) {
    auto length = request().threadgroup_memory.find(index);
    std::string label = "threadgroup(" + std::to_string(index) + ")";
    Region* region = length == request().threadgroup_memory.end()
                         ? unbound_region(RegionKind::unbound_threadgroup, index)
                         : allocate_threadgroup(length->second, kThreadgroupAlignment, label, {nullptr, 0});
    it = s.threadgroup_buffers.emplace(index, region).first;
  }
  return reinterpret_cast<void*>(it->second->begin);
}

void* threadgroup_array(const void* key, size_t size, size_t align, SourceLoc where) {
  State& s = state();
  auto it = s.threadgroup_arrays.find(key);
  if (it == s.threadgroup_arrays.end())
    it = s.threadgroup_arrays.emplace(key, allocate_threadgroup(size, align, "threadgroup array declared at " + describe(where), where)).first;
  return reinterpret_cast<void*>(it->second->begin);
}

void builtin_value(Builtin builtin, unsigned value[3]) {
  State& s = state();
  const Request& r = request();
  const unsigned* tg = r.threadgroup;
  const unsigned* size = s.group_size;
  unsigned index = s.current->index;
  unsigned local[3] = {index % size[0], index / size[0] % size[1], index / (size[0] * size[1])};
  auto set = [&](unsigned x, unsigned y, unsigned z) { value[0] = x, value[1] = y, value[2] = z; };
  const unsigned* group = s.threadgroup_position;
  switch (builtin) {
    case Builtin::thread_position_in_grid:
      set(group[0] * tg[0] + local[0], group[1] * tg[1] + local[1], group[2] * tg[2] + local[2]);
      break;
    case Builtin::thread_position_in_threadgroup: set(local[0], local[1], local[2]); break;
    case Builtin::threadgroup_position_in_grid: set(group[0], group[1], group[2]); break;
    case Builtin::threads_per_threadgroup: set(size[0], size[1], size[2]); break;
    case Builtin::threadgroups_per_grid: set(r.grid[0], r.grid[1], r.grid[2]); break;
    case Builtin::threads_per_grid:
      if (r.grid_in_threads)
        set(r.threads[0], r.threads[1], r.threads[2]);
      else
        set(r.grid[0] * tg[0], r.grid[1] * tg[1], r.grid[2] * tg[2]);
      break;
    case Builtin::thread_index_in_threadgroup: set(index, 0, 0); break;
    case Builtin::thread_index_in_simdgroup: set(index % kSimdWidth, 0, 0); break;
    case Builtin::simdgroup_index_in_threadgroup: set(index / kSimdWidth, 0, 0); break;
    case Builtin::threads_per_simdgroup: set(kSimdWidth, 0, 0); break;
    case Builtin::simdgroups_per_threadgroup: set((s.threads_per_threadgroup + kSimdWidth - 1) / kSimdWidth, 0, 0); break;
    case Builtin::thread_index_in_quadgroup: set(index % 4, 0, 0); break;
    case Builtin::quadgroup_index_in_threadgroup: set(index / 4, 0, 0); break;
  }
}

unsigned simd_lane() { return state().current->index % kSimdWidth; }

void count(Counter counter) {
  Counters& c = state().counters;
  (counter == Counter::simdgroup_matrix_ops ? c.simdgroup_matrix_ops : c.matmul2d_runs) += 1;
}

void fail(const char* message, SourceLoc where) { report_error(message, where, nullptr); }

const char* function_constant_text(unsigned index) {
  auto it = request().constants.find(index);
  return it == request().constants.end() ? nullptr : it->second.c_str();
}

}  // namespace msim

int main() { return msim::detail::run(); }
