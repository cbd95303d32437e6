#include "backend/metal/device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "backend/metal/kernels/fp_params.h"

#ifdef __APPLE__
#include <sys/sysctl.h>
#endif

namespace mlx_fpqmm::metal {

int GpuDevice::generation() const {
  constexpr std::string_view prefix = "applegpu_g";
  if (!architecture.starts_with(prefix)) {
    return 0;
  }
  int generation = 0;
  for (size_t i = prefix.size();
       i < architecture.size() &&
       std::isdigit(static_cast<unsigned char>(architecture[i]));
       ++i) {
    generation = generation * 10 + (architecture[i] - '0');
  }
  return generation;
}

char GpuDevice::size_class() const {
  if (generation() == 0 ||
      std::isdigit(static_cast<unsigned char>(architecture.back()))) {
    return 0;
  }
  return architecture.back();
}

CoreRange gpu_core_range(const GpuDevice& device) {
  // Apple's published GPU core counts (apple.com tech specs), fewest to
  // most per generation and MLX's size classes: 'g' base and Pro chips,
  // 's' Max, 'd' Ultra, 'p' the iPhone/iPad A-series (4 to 6 cores).
  //   g13 M1 7-8, M1 Pro 14-16, M1 Max 24-32, M1 Ultra 48-64
  //   g14 M2 8-10, M2 Pro 16-19, M2 Max 30-38, M2 Ultra 60-76
  //   g15 M3 8-10, M3 Pro 14-18, M3 Max 30-40, M3 Ultra 60-80
  //   g16 M4 8-10, M4 Pro 16-20, M4 Max 32-40 (no M4 Ultra: twice the Max)
  //   g17 M5 10; its larger parts and later generations take M4's counts.
  struct Row {
    int generation;
    CoreRange base, max, ultra, phone;
  };
  constexpr std::array<Row, 5> kCores = {{
      {13, {7, 16}, {24, 32}, {48, 64}, {4, 4}},
      {14, {8, 19}, {30, 38}, {60, 76}, {4, 5}},
      {15, {8, 18}, {30, 40}, {60, 80}, {5, 5}},
      {16, {8, 20}, {32, 40}, {64, 80}, {5, 6}},
      {17, {10, 20}, {32, 40}, {64, 80}, {5, 6}},
  }};
  int generation = std::clamp(
      device.generation(), kCores.front().generation, kCores.back().generation);
  const Row& row = kCores[generation - kCores.front().generation];
  switch (device.size_class()) {
    case 's':
      return row.max;
    case 'd':
      return row.ultra;
    case 'p':
      return row.phone;
    default:
      return row.base;
  }
}

int decode_row_limit(const QmmProblem& problem, const GpuDevice& device) {
  if (!problem.transpose) {
    return fpqmm::kQvmRows;  // MLX's limit for x @ W, one qvm row block
  }
  // Columns: K and N both <= 2048, both <= 4096, larger.
  struct Row {
    int small, medium, large;
  };
  int generation = device.generation();
  Row row = device.size_class() == 'd' ? Row{32, 18, 12}
            : generation >= 17         ? Row{33, 25, 13}
            : generation >= 15         ? Row{13, 15, 13}
            : generation >= 13         ? Row{14, 10, 6}
                                       : Row{18, 12, 10};
  int extent = std::max(problem.K, problem.N);
  return extent <= 2048 ? row.small : extent <= 4096 ? row.medium : row.large;
}

std::pair<int, int> parse_os_version(const std::string& version) {
  int major = 0;
  int minor = 0;
  const char* end = version.data() + version.size();
  auto [after_major, major_error] = std::from_chars(version.data(), end, major);
  bool valid = major_error == std::errc();
  if (valid && after_major != end) {
    valid = *after_major == '.';
    auto [after_minor, minor_error] =
        std::from_chars(after_major + 1, end, minor);
    valid = valid && minor_error == std::errc() &&
            (after_minor == end || *after_minor == '.');
  }
  if (!valid) {
    throw std::invalid_argument(
        "macOS version '" + version + "' is not of the form '26.2'.");
  }
  return {major, minor};
}

std::pair<int, int> running_macos_version() {
#ifdef __APPLE__
  char version[64] = {};
  size_t length = sizeof(version) - 1;
  if (sysctlbyname("kern.osproductversion", version, &length, nullptr, 0) ==
      0) {
    return parse_os_version(version);
  }
#endif
  return {0, 0};
}

const std::string& module_directory() {
  static const std::string directory = [] {
    // The metallibs are installed beside this module.
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&module_directory), &info) == 0 ||
        info.dli_fname == nullptr) {
      throw std::runtime_error(
          "[mlx_fpqmm] Could not locate the extension module (dladdr failed), "
          "so its Metal libraries cannot be found.");
    }
    return std::filesystem::path(info.dli_fname).parent_path().string();
  }();
  return directory;
}

bool nax_library_installed() {
  static const bool installed = std::filesystem::exists(
      std::filesystem::path(module_directory()) /
      (std::string(kNaxLibrary) + ".metallib"));
  return installed;
}

}  // namespace mlx_fpqmm::metal
