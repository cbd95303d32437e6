// A stand-in for fmt, which MLX's CUDA headers include (lru_cache.h) but no
// wheel ships. Only MLX's own template code, never instantiated by this
// extension, calls it; a declaration is enough.
#pragma once

#include <string>

namespace fmt {

template <typename... Args>
std::string format(const char* pattern, Args&&... args);

}  // namespace fmt
