// Interface between simulated kernels (compiled by clang against the shim)
// and the simulator runtime (runtime/*.cpp, compiled by g++).
// Plain C++ only: no address-space qualifiers, no shim types.
#pragma once

#include <cstddef>
#include <cstdint>

namespace msim {

// Call-site location of a synchronisation point, captured through default
// arguments so divergence reports name the kernel's own source line.
struct SourceLoc {
  const char* file;
  unsigned line;
  static constexpr SourceLoc current(
      const char* file = __builtin_FILE(),
      unsigned line = __builtin_LINE()) {
    return {file, line};
  }
};

enum class Builtin : unsigned {
  thread_position_in_grid,
  thread_position_in_threadgroup,
  threadgroup_position_in_grid,
  threads_per_threadgroup,
  threadgroups_per_grid,
  threads_per_grid,
  thread_index_in_threadgroup,
  thread_index_in_simdgroup,
  simdgroup_index_in_threadgroup,
  threads_per_simdgroup,
  simdgroups_per_threadgroup,
  thread_index_in_quadgroup,
  quadgroup_index_in_threadgroup,
};

enum class Scope : unsigned { simdgroup_wide, threadgroup_wide };

enum class Counter : unsigned { simdgroup_matrix_ops, matmul2d_runs };

// Runs once, when every participant of a scope has arrived at the same
// collective; participant_data[i] is what participant i (lane or thread
// index within the scope) passed, or nullptr for lanes that do not exist.
using CollectiveFn = void (*)(void* const* participant_data, unsigned count);

struct Kernel {
  const char* host_name;
  void (*entry)();
};

void register_kernel(const Kernel& kernel);

// Unbound indices yield a guard address: harmless until dereferenced.
void* buffer_address(unsigned index);
void* threadgroup_buffer_address(unsigned index);
void* threadgroup_array(const void* key, size_t size, size_t align, SourceLoc where);
void builtin_value(Builtin builtin, unsigned value[3]);
unsigned simd_lane();

// `collective == nullptr` makes a barrier: it also orders memory.
void synchronize(Scope scope, const char* what, CollectiveFn collective, void* data, SourceLoc where);
void count(Counter counter);
[[noreturn]] void fail(const char* message, SourceLoc where);

// Text of a function constant set for this dispatch, or nullptr.
const char* function_constant_text(unsigned index);

}  // namespace msim
