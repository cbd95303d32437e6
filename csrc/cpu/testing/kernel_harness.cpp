// Runs one ISA's float32 kernels on a case read from stdin and writes the
// result to stdout, so that tests can check kernels this machine cannot run
// natively (tests/test_cpu_neon.py builds it for arm64 and runs it under
// qemu-user). Input, little-endian: int32 bits, code kind (0 E2M1, 1 E4M3),
// group size, scale type (ScaleType), op (0 dot: x @ W^T, 1 axpy: x @ W,
// 2 dequantize); float global factor; int64 rows, cols, M; then the codes,
// the scales and (ops 0, 1) x as float32. Output: float32 results.
#include <cstdio>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "cpu/kernels.h"

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
  int bits = read<int32_t>();
  auto codes = static_cast<CodeKind>(read<int32_t>());
  int group_size = read<int32_t>();
  auto scale_type = static_cast<ScaleType>(read<int32_t>());
  int op = read<int32_t>();
  float global_factor = read<float>();
  int64_t rows = read<int64_t>();
  int64_t cols = read<int64_t>();
  int64_t M = read<int64_t>();
  constexpr size_t kScaleSizes[] = {1, 1, 4, 2, 2};
  auto data = read_bytes(rows * cols * bits / 8);
  auto scales = read_bytes(
      rows * cols / group_size * kScaleSizes[static_cast<int>(scale_type)]);
  QuantizedMatrix w{
      codes,
      bits,
      group_size,
      rows,
      cols,
      reinterpret_cast<const uint8_t*>(data.data()),
      scales.data(),
      scale_type,
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
      kernels->dot(w, xf, M, 0, N, out.data(), N);
    } else {
      kernels->axpy(w, xf, M, 0, N, out.data(), N);
    }
  }
  std::fwrite(out.data(), sizeof(float), out.size(), stdout);
  return 0;
}
