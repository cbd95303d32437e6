#include "metal/problem.h"

#include <dlfcn.h>

#include <charconv>
#include <filesystem>
#include <stdexcept>

#ifdef __APPLE__
#include <sys/sysctl.h>
#endif

namespace mlx_fpqmm::metal {

namespace {

std::vector<int64_t> batch_strides(const mx::array& a, bool strides_known) {
  int batch_ndims = static_cast<int>(a.ndim()) - 2;
  std::vector<int64_t> strides(batch_ndims);
  int64_t contiguous = int64_t(a.shape(-1)) * a.shape(-2);
  for (int axis = batch_ndims - 1; axis >= 0; --axis) {
    strides[axis] = strides_known ? a.strides()[axis] : contiguous;
    contiguous *= a.shape(axis);
  }
  return strides;
}

}  // namespace

Input input_of(Operand operand) {
  switch (operand) {
    case Operand::w:
      return Input::w;
    case Operand::scales:
      return Input::scales;
    case Operand::global_scale:
      return Input::global_scale;
    case Operand::x:
      return Input::x;
    case Operand::y:
    case Operand::lhs_indices:
    case Operand::rhs_indices:
    case Operand::partials:
      break;
  }
  throw std::invalid_argument(
      "[metal] " + std::string(kOperandNames[static_cast<int>(operand)]) +
      " is not an input of FpQuantizedMatmul.");
}

GatherInput gather_input_of(Operand operand) {
  switch (operand) {
    case Operand::lhs_indices:
      return GatherInput::lhs_indices;
    case Operand::rhs_indices:
      return GatherInput::rhs_indices;
    case Operand::global_scale:
      return GatherInput::global_scale;
    default:
      // x, w and scales lead both input lists.
      return static_cast<GatherInput>(input_of(operand));
  }
}

QmmProblem describe_problem(
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    Mode mode,
    int group_size,
    bool transpose,
    bool strides_known) {
  const auto& x = input(inputs, Input::x);
  const auto& scales = input(inputs, Input::scales);
  QmmProblem problem{
      mode,
      group_size,
      transpose,
      0,
      out_shape.back(),
      x.shape(-1),
      float_type(x.dtype())};
  if (format_for(mode).scales == ScaleKind::floating) {
    problem.scale_type = float_type(scales.dtype());
  }
  problem.has_global_scale = has_global_scale(inputs);
  if (folds_rows(inputs)) {
    // The product of x's leading dimensions (K may be 0).
    int64_t rows = 1;
    for (int axis = 0; axis + 1 < static_cast<int>(x.ndim()); ++axis) {
      rows *= x.shape(axis);
    }
    problem.M = static_cast<int>(rows);
    return problem;
  }
  problem.M = x.shape(-2);
  problem.batch_shape.assign(out_shape.begin(), out_shape.end() - 2);
  problem.x_batch_strides = batch_strides(x, strides_known);
  problem.w_batch_strides =
      batch_strides(input(inputs, Input::w), strides_known);
  problem.scales_batch_strides = batch_strides(scales, strides_known);
  return problem;
}

QmmProblem describe_gather_problem(
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    Mode mode,
    int group_size,
    bool transpose,
    bool right_sorted) {
  const auto& x = input(inputs, GatherInput::x);
  const auto& w = input(inputs, GatherInput::w);
  const auto& scales = input(inputs, GatherInput::scales);
  QmmProblem problem{
      mode,
      group_size,
      transpose,
      x.shape(-2),
      out_shape.back(),
      x.shape(-1),
      float_type(x.dtype())};
  if (format_for(mode).scales == ScaleKind::floating) {
    problem.scale_type = float_type(scales.dtype());
  }
  problem.has_global_scale = has_expert_scales(inputs);
  problem.gather = true;
  problem.right_sorted = right_sorted;
  problem.x_matrices = static_cast<int>(matrix_count(x));
  problem.w_matrices = static_cast<int>(matrix_count(w));
  problem.batch_shape = {
      static_cast<int>(input(inputs, GatherInput::lhs_indices).size())};
  return problem;
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
