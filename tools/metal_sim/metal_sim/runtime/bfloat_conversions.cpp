// Float -> bfloat conversions that clang emits as library calls on CPUs
// without native bf16 instructions; libgcc 12 does not provide them.
// Round to nearest even, NaNs stay (quiet) NaNs.
#include <cstdint>

extern "C" __bf16 __truncsfbf2(float value) {
  uint32_t bits = __builtin_bit_cast(uint32_t, value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return __builtin_bit_cast(__bf16, static_cast<uint16_t>((bits >> 16) | 0x40));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return __builtin_bit_cast(__bf16, static_cast<uint16_t>(bits >> 16));
}

// Double to bfloat through float would round twice: narrow to float with
// round-to-odd (truncate, then mark inexact results odd) first.
extern "C" __bf16 __truncdfbf2(double value) {
  float narrowed = static_cast<float>(value);
  if (static_cast<double>(narrowed) != value && narrowed == narrowed) {
    if (__builtin_fabs(static_cast<double>(narrowed)) > __builtin_fabs(value))
      narrowed = __builtin_nextafterf(narrowed, 0.0f);
    narrowed = __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, narrowed) | 1u);
  }
  return __truncsfbf2(narrowed);
}
