#include "formats.h"

#include <algorithm>

namespace mlx_fpqmm {

bool Format::allows_group_size(int group_size) const {
  return std::ranges::find(group_sizes, group_size) != group_sizes.end();
}

const Format& format_for(Mode mode) {
  return kFormats[static_cast<size_t>(mode)];
}

std::optional<Mode> mode_from_name(std::string_view name) {
  for (const auto& format : kFormats) {
    if (format.name == name) {
      return format.mode;
    }
  }
  return std::nullopt;
}

}  // namespace mlx_fpqmm
