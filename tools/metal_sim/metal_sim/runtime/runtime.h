// The simulator runtime's shared state: one dispatch of one kernel, run by
// one process (see dispatch.cpp). Internal to the runtime's files:
//   io.cpp        the request on stdin, the JSON report on stdout
//   memory.cpp    the buffers' memory, the checks and counters of every access
//   fibers.cpp    one fiber per simulated thread, barriers and collectives
//   signals.cpp   kernel crashes (signals) and integer UB (UBSan traps)
//   dispatch.cpp  the dispatch itself and the kernel-facing API
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "msim/runtime_api.h"

namespace msim::detail {

constexpr unsigned kSimdWidth = 32;
constexpr unsigned kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kThreadgroupMemoryLimit = 32 * 1024;
constexpr size_t kThreadgroupAlignment = 16;
constexpr size_t kDeviceGuard = 64 * 1024;
constexpr size_t kThreadgroupGap = 1024;
constexpr size_t kFiberStack = 256 * 1024;
constexpr uint16_t kUninitialized = 0xffff;

struct BufferBinding {
  unsigned index;
  bool is_bytes;  // set_bytes value: read-only, not copied back
  size_t offset;
  size_t size;
};

struct Request {
  std::string kernel;
  std::string data_path;
  unsigned grid[3] = {1, 1, 1};  // threadgroups
  unsigned threadgroup[3] = {1, 1, 1};
  // dispatch_threads: the grid in threads; edge threadgroups hold only the
  // threads inside it (Metal's non-uniform threadgroups).
  bool grid_in_threads = false;
  unsigned threads[3] = {0, 0, 0};
  std::vector<BufferBinding> buffers;
  std::map<unsigned, size_t> threadgroup_memory;
  std::map<unsigned, std::string> constants;
};


// The dispatch's request, read from stdin before main (io.cpp).
inline Request& request() {
  static Request instance;
  return instance;
}

enum class RegionKind { device, bytes, unbound_device, threadgroup, unbound_threadgroup };

// Per byte of threadgroup memory: who wrote it last and in which barrier
// epochs, to find reads of uninitialized memory and unsynchronized reads.
struct WriteRecord {
  uint16_t writer = kUninitialized;
  uint32_t threadgroup_epoch = 0;
  uint32_t simdgroup_epoch = 0;
};

struct Region {
  RegionKind kind;
  unsigned index;
  std::string label;
  uintptr_t begin, end;              // valid bytes
  uintptr_t guard_begin, guard_end;  // accesses here belong to this region
  std::vector<uint8_t> touched;      // bit 0: read, bit 1: written
  std::vector<WriteRecord> writes;   // threadgroup regions only
  uint64_t bytes_read = 0, bytes_written = 0;
};

// Instruction classes, as instrument.py's CLASSES orders __msim_count's array.
constexpr const char* kInstructionClasses[] = {"float", "integer", "conversion", "memory", "control", "other"};
constexpr size_t kInstructionClassCount = std::size(kInstructionClasses);

struct Counters {
  uint64_t instructions[kInstructionClassCount] = {};
  uint64_t threadgroup_bytes_read = 0, threadgroup_bytes_written = 0;
  uint64_t threadgroup_barriers = 0, simdgroup_barriers = 0, simd_collectives = 0;
  uint64_t simdgroup_matrix_ops = 0, matmul2d_runs = 0;
  uint64_t threadgroups = 0, threads = 0;
};

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;
  unsigned index = 0;  // thread_index_in_threadgroup
  bool done = false, waiting = false;
  Scope scope = Scope::simdgroup_wide;
  const char* what = nullptr;
  CollectiveFn collective = nullptr;
  void* data = nullptr;
  SourceLoc where{nullptr, 0};
};


struct State {
  std::vector<std::unique_ptr<Region>> device_regions;  // bound + unbound, live for the dispatch
  std::vector<std::unique_ptr<Region>> threadgroup_regions;  // reset per threadgroup
  std::map<unsigned, Region*> device_by_index;
  std::map<const void*, Region*> threadgroup_arrays;
  std::map<unsigned, Region*> threadgroup_buffers;
  char* arena = nullptr;
  size_t arena_size = 0, arena_used = 0, threadgroup_bytes = 0;
  Counters counters;
  unsigned threadgroup_position[3] = {0, 0, 0};
  unsigned threads_per_threadgroup = 0;  // of the current threadgroup
  unsigned group_size[3] = {0, 0, 0};    // its extent (smaller at a dispatch_threads edge)
  std::vector<Fiber> fibers;             // its threads are the first threads_per_threadgroup
  Fiber* current = nullptr;
  void* scheduler_sp = nullptr;
  uint32_t threadgroup_epoch = 0;
  std::vector<uint32_t> simdgroup_epochs;
  bool checking = false;  // memory callbacks are live only while kernels run
};


inline State& state() {
  static State instance;
  return instance;
}

// io.cpp
std::string describe(SourceLoc where);
// Reports a kernel bug and ends the dispatch. `pc` (if set) is symbolized by
// the Python side; otherwise `where` already names the source line.
[[noreturn]] void report_error(const std::string& message, SourceLoc where, const void* pc);
[[noreturn]] void report_error(const std::string& message);
void write_counters(std::ostream& out);

// memory.cpp
char* map_guarded(size_t size, size_t guard);
Region* add_region(std::vector<std::unique_ptr<Region>>& list, RegionKind kind, unsigned index, std::string label,
                   char* begin, size_t size, size_t guard);
Region* allocate_threadgroup(size_t size, size_t align, const std::string& label, SourceLoc where);
Region* unbound_region(RegionKind kind, unsigned index);

// fibers.cpp
extern void (*g_entry)();  // the kernel every fiber runs
void run_threadgroup();

// signals.cpp
void install_signal_handlers();

}  // namespace msim::detail
