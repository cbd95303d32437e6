// The runtime's I/O: the request on stdin, read before main; the one-line
// JSON report on stdout (the counters, or the first kernel bug found).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "runtime.h"

namespace msim::detail {
namespace {

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

}  // namespace

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

}  // namespace msim::detail
