// Runs one ISA's float32 kernels on a case read from stdin and writes the
// result to stdout, so that tests can check kernels this machine cannot run
// natively (tests/test_cpu_neon.py builds it for arm64 and runs it under
// qemu-user). Input, little-endian: the mode's name and the scales' dtype
// name ("uint8", "float32", ...), 8 bytes each, NUL-padded; int32 group size,
// op (0 dot: x @ W^T, 1 axpy: x @ W, 2 dequantize); float global factor;
// int64 rows, cols, M; then the codes, the scales and (ops 0, 1) x as
// float32. Output: float32 results. Formats and scale encodings come from
// formats.h, as in the extension.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/kernels.h"

using namespace mlx_fpqmm;
using namespace mlx_fpqmm::cpu;

namespace {

template <typename T>
T read() {
  T value;
  if (std::fread(&value, sizeof(T), 1, stdin) != 1) {
    throw std::runtime_error("short input");
  }
  return value;
}

std::string read_name() {
  char name[8];
  if (std::fread(name, 1, sizeof(name), stdin) != sizeof(name)) {
    throw std::runtime_error("short input");
  }
  return std::string(name, strnlen(name, sizeof(name)));
}

std::vector<char> read_bytes(size_t count) {
  std::vector<char> bytes(count);
  if (count && std::fread(bytes.data(), 1, count, stdin) != count) {
    throw std::runtime_error("short input");
  }
  return bytes;
}

const IsaKernels* kernels_named(std::string_view name) {
#if defined(__aarch64__)
  if (name == "neon") {
    return neon_kernels();
  }
#endif
  return name == "portable" ? portable_kernels() : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const IsaKernels* kernels = argc > 1 ? kernels_named(argv[1]) : nullptr;
  if (kernels == nullptr) {
    std::fprintf(stderr, "usage: kernel_harness neon|portable < case\n");
    return 2;
  }
  auto mode = mode_from_name(read_name());
  if (!mode) {
    throw std::runtime_error("unknown mode");
  }
  const Format& format = format_for(*mode);
  auto scale_type = float_type_from_name(read_name());
  ScaleEncoding encoding = scale_encoding(*mode, scale_type);
  int bits = format.bits;
  int group_size = read<int32_t>();
  int op = read<int32_t>();
  float global_factor = read<float>();
  int64_t rows = read<int64_t>();
  int64_t cols = read<int64_t>();
  int64_t M = read<int64_t>();
  auto data = read_bytes(rows * cols * bits / 8);
  auto scales = read_bytes(rows * cols / group_size * scale_itemsize(encoding));
  QuantizedMatrix w{
      bits,
      group_size,
      rows,
      cols,
      reinterpret_cast<const uint8_t*>(data.data()),
      scales.data(),
      encoding,
      global_factor};
  std::vector<float> out;
  if (op == 2) {
    out.resize(rows * cols);
    kernels->dequantize(w, 0, rows, 0, cols, out.data(), cols);
  } else {
    int64_t K = op == 0 ? cols : rows;
    int64_t N = op == 0 ? rows : cols;
    auto x = read_bytes(M * K * sizeof(float));
    out.resize(M * N);
    const auto* xf = reinterpret_cast<const float*>(x.data());
    if (op == 0) {
      std::vector<float> arranged(M * kernels->arranged_length(w));
      kernels->arrange_x(w, xf, M, arranged.data());
      kernels->dot(w, xf, arranged.data(), M, 0, N, out.data(), N);
    } else {
      kernels->axpy(w, xf, M, 0, N, out.data(), N);
    }
  }
  std::fwrite(out.data(), sizeof(float), out.size(), stdout);
  return 0;
}
