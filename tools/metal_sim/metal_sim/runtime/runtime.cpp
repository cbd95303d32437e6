// Simulator runtime: runs one dispatch of one kernel, then exits.
//
// The Python side starts this executable once per dispatch (crash isolation),
// writes the request to stdin and the buffer contents to a data file, and
// reads a one-line JSON report from stdout. Every simulated thread of a
// threadgroup is a fiber on one OS thread; fibers switch only at barriers and
// collectives. Memory checks and counters come from the __msim_load/store/copy
// calls instrument.py puts before every device/constant/threadgroup access.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "msim/runtime_api.h"

namespace msim {
namespace {

constexpr unsigned kSimdWidth = 32;
constexpr unsigned kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kThreadgroupMemoryLimit = 32 * 1024;
constexpr size_t kThreadgroupAlignment = 16;
constexpr size_t kDeviceGuard = 64 * 1024;
constexpr size_t kThreadgroupGap = 1024;
constexpr size_t kFiberStack = 256 * 1024;
constexpr uint16_t kUninitialized = 0xffff;

// ---------------------------------------------------------------- reporting

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Reports a kernel bug and ends the dispatch. `pc` (if set) is symbolized by
// the Python side; otherwise `where` already names the source line.
[[noreturn]] void report_error(const std::string& message, SourceLoc where, const void* pc) {
  std::ostringstream out;
  out << "{\"status\": \"error\", \"message\": " << json_string(message);
  if (where.file) out << ", \"file\": " << json_string(where.file) << ", \"line\": " << where.line;
  if (pc) out << ", \"pc\": " << reinterpret_cast<uintptr_t>(pc);
  out << "}\n";
  std::cout << out.str() << std::flush;
  _exit(2);
}

[[noreturn]] void report_error(const std::string& message) { report_error(message, {nullptr, 0}, nullptr); }

std::string describe(SourceLoc where) { return std::string(where.file) + ":" + std::to_string(where.line); }

// ---------------------------------------------------------------- request

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

Request& request() {
  static Request instance;
  return instance;
}

// Runs before the kernels' dynamic initializers so that function constants
// (and globals computed from them) see this dispatch's values. C stdio only:
// iostreams are not initialised yet at this priority.
__attribute__((constructor(101))) void read_request() {
  Request& r = request();
  char line[4096];
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = 0;
    char key[32];
    int consumed = 0;
    if (sscanf(line, "%31s %n", key, &consumed) != 1) continue;
    const char* rest = line + consumed;
    std::string name = key;
    if (name == "kernel") {
      r.kernel = rest;
    } else if (name == "data") {
      r.data_path = rest;
    } else if (name == "grid") {
      sscanf(rest, "%u %u %u", &r.grid[0], &r.grid[1], &r.grid[2]);
    } else if (name == "threadgroup") {
      sscanf(rest, "%u %u %u", &r.threadgroup[0], &r.threadgroup[1], &r.threadgroup[2]);
    } else if (name == "threads") {
      sscanf(rest, "%u %u %u", &r.threads[0], &r.threads[1], &r.threads[2]);
      r.grid_in_threads = true;
    } else if (name == "buffer") {
      BufferBinding b{};
      char kind[16];
      sscanf(rest, "%u %15s %zu %zu", &b.index, kind, &b.offset, &b.size);
      b.is_bytes = std::strcmp(kind, "bytes") == 0;
      r.buffers.push_back(b);
    } else if (name == "threadgroup_memory") {
      unsigned index;
      size_t size;
      sscanf(rest, "%u %zu", &index, &size);
      r.threadgroup_memory[index] = size;
    } else if (name == "constant") {
      unsigned index;
      int value_at = 0;
      sscanf(rest, "%u %n", &index, &value_at);
      r.constants[index] = rest + value_at;
    }
  }
}

// ---------------------------------------------------------------- memory

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

struct Fiber;

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

State& state() {
  static State instance;
  return instance;
}

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

Region* find_region(uintptr_t address) {
  State& s = state();
  for (auto* list : {&s.threadgroup_regions, &s.device_regions})
    for (auto& r : *list)
      if (address >= r->guard_begin && address < r->guard_end) return r.get();
  return nullptr;
}

// ---------------------------------------------------------------- fibers

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

// Checks and counts one access of `size` bytes. A copy's read (`uninitialized`
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

void (*g_entry)() = nullptr;

[[noreturn]] void fiber_main() {
  g_entry();
  state().current->done = true;
  switch_to_scheduler();
  __builtin_unreachable();
}

// ---------------------------------------------------------------- scheduling

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

// ---------------------------------------------------------------- crashes

void on_signal(int signal, siginfo_t* info, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
  auto pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const char* message = signal == SIGSEGV || signal == SIGBUS
                            ? "kernel crashed: invalid memory access (far out of bounds, or fiber stack overflow)"
                            : "kernel crashed";
  char line[512];
  int n = snprintf(line, sizeof line,
                   "{\"status\": \"error\", \"message\": \"%s (signal %d, address 0x%" PRIxPTR ")\", \"pc\": %" PRIuPTR "}\n",
                   message, signal, reinterpret_cast<uintptr_t>(info->si_addr), pc);
  (void)!write(1, line, n);
  _exit(3);
}

void install_signal_handlers() {
  static char alternate_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alternate_stack;
  ss.ss_size = sizeof alternate_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction action{};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigaction(signal, &action, nullptr);
}

// ---------------------------------------------------------------- dispatch

std::vector<Kernel>& kernels() {
  static std::vector<Kernel> instance;
  return instance;
}

void write_counters(std::ostream& out) {
  State& s = state();
  const Counters& c = s.counters;
  out << "{\"status\": \"ok\", \"counters\": {\"buffers\": {";
  bool first = true;
  for (auto& r : s.device_regions) {
    if (r->kind == RegionKind::unbound_device) continue;
    uint64_t unique_read = 0, unique_written = 0;
    for (uint8_t t : r->touched) unique_read += t & 1, unique_written += t >> 1;
    out << (first ? "" : ", ") << "\"" << r->index << "\": {\"bytes_read\": " << r->bytes_read
        << ", \"bytes_written\": " << r->bytes_written << ", \"unique_bytes_read\": " << unique_read
        << ", \"unique_bytes_written\": " << unique_written << ", \"size\": " << r->touched.size() << "}";
    first = false;
  }
  out << "}, \"threadgroup_bytes_read\": " << c.threadgroup_bytes_read
      << ", \"threadgroup_bytes_written\": " << c.threadgroup_bytes_written
      << ", \"threadgroup_barriers\": " << c.threadgroup_barriers
      << ", \"simdgroup_barriers\": " << c.simdgroup_barriers << ", \"simd_collectives\": " << c.simd_collectives
      << ", \"simdgroup_matrix_ops\": " << c.simdgroup_matrix_ops << ", \"matmul2d_runs\": " << c.matmul2d_runs
      << ", \"threadgroups\": " << c.threadgroups << ", \"threads\": " << c.threads << ", \"instructions\": {";
  for (size_t i = 0; i < kInstructionClassCount; ++i)
    out << (i ? ", " : "") << "\"" << kInstructionClasses[i] << "\": " << c.instructions[i];
  out << "}}}\n";
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

}  // namespace

// ---------------------------------------------------------------- kernel API

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

void synchronize(Scope scope, const char* what, CollectiveFn collective, void* data, SourceLoc where) {
  Fiber& f = *state().current;
  f.scope = scope;
  f.what = what;
  f.collective = collective;
  f.data = data;
  f.where = where;
  f.waiting = true;
  switch_to_scheduler();
}

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

// Memory hooks: calls to these precede every load, store and memcpy/memset
// through a device, constant or threadgroup pointer (see instrument.py).
extern "C" void __msim_load(uintptr_t address, size_t size) {
  msim::check_access(address, size, false, __builtin_return_address(0));
}

extern "C" void __msim_store(uintptr_t address, size_t size) {
  msim::check_access(address, size, true, __builtin_return_address(0));
}

// memcpy/memmove: copying uninitialised threadgroup bytes is no error (struct
// padding); the destination's copies of them stay uninitialised.
extern "C" void __msim_copy(uintptr_t destination, uintptr_t source, size_t size) {
  std::vector<uint8_t> uninitialized(size, 0);
  msim::check_access(source, size, false, __builtin_return_address(0), &uninitialized);
  msim::check_access(destination, size, true, __builtin_return_address(0), &uninitialized);
}

// Instructions of one executed basic block, by class (see instrument.py).
extern "C" void __msim_count(const uint64_t* counts) {
  msim::State& s = msim::state();
  if (!s.checking) return;
  for (size_t i = 0; i < msim::kInstructionClassCount; ++i) s.counters.instructions[i] += counts[i];
}

// -fsanitize=shift-exponent,integer-divide-by-zero handlers (clang's UBSan
// ABI): every check data record starts with the source location.
struct UbsanLocation {
  const char* file;
  uint32_t line;
  uint32_t column;
};

extern "C" void __ubsan_handle_shift_out_of_bounds_abort(const UbsanLocation* at, uintptr_t, uintptr_t) {
  msim::fail("integer UB: shift amount negative or >= the operand's bit width", {at->file, at->line});
}

extern "C" void __ubsan_handle_divrem_overflow_abort(const UbsanLocation* at, uintptr_t, uintptr_t) {
  msim::fail("integer UB: division by zero (or INT_MIN / -1)", {at->file, at->line});
}

int main() { return msim::run(); }
