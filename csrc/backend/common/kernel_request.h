// A GPU plan's kernel requests by name (MLX_FPQMM_KERNEL, kernel_path's
// kernel=): each plan has its table of names; the lookups are shared. And
// MLX's switch that the plans follow (MLX_ENABLE_TF32).
#pragma once

#include <array>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace mlx_fpqmm {

template <typename Request, size_t N>
using RequestNames = std::array<std::pair<std::string_view, Request>, N>;

template <typename Request, size_t N>
std::optional<Request> request_from_name(
    const RequestNames<Request, N>& names, std::string_view name) {
  for (auto [candidate, request] : names) {
    if (name == candidate) {
      return request;
    }
  }
  return std::nullopt;
}

template <typename Request, size_t N>
std::string_view name_of(
    const RequestNames<Request, N>& names, Request request) {
  for (auto [name, candidate] : names) {
    if (request == candidate) {
      return name;
    }
  }
  return {};
}

// "auto, qmv, mma": the names, for messages.
template <typename Request, size_t N>
std::string listed(const RequestNames<Request, N>& names) {
  std::string text;
  for (auto [name, request] : names) {
    text += (text.empty() ? "" : ", ") + std::string(name);
  }
  return text;
}

// MLX_FPQMM_KERNEL's request (the first name's when unset or empty); throws
// std::invalid_argument for a name not in `names`.
template <typename Request, size_t N>
Request request_from_env(
    const RequestNames<Request, N>& names, std::string_view kernels) {
  const char* value = std::getenv("MLX_FPQMM_KERNEL");
  if (value == nullptr || *value == '\0') {
    return names.front().second;
  }
  auto request = request_from_name(names, value);
  if (!request) {
    throw std::invalid_argument(
        "MLX_FPQMM_KERNEL='" + std::string(value) + "' is not one of " +
        listed(names) + " for the " + std::string(kernels) + " kernels.");
  }
  return *request;
}

// MLX_ENABLE_TF32 (MLX's switch, default on; as MLX reads it, any value but
// a nonzero number turns it off): whether float32 x may be multiplied at
// reduced precision (Apple's neural accelerators; on CUDA, bfloat16 parts
// past the simple path's rows, as MLX's matmul takes TF32).
inline bool tf32_enabled_from_env() {
  const char* value = std::getenv("MLX_ENABLE_TF32");
  return value == nullptr || std::atoi(value) != 0;
}

}  // namespace mlx_fpqmm
