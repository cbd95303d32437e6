// Registers the Metal plan's Python functions on the extension module.
#pragma once

#include <nanobind/nanobind.h>

namespace mlx_fpqmm::metal {

void register_metal_bindings(nanobind::module_& m);

}  // namespace mlx_fpqmm::metal
