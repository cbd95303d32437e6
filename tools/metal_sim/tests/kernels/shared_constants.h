// Included by shared_constants_a.metal and shared_constants_b.metal, which
// form ONE Library: program-scope constants, function constants and a
// non-inline function defined here must not collide when linked.
#pragma once
#include <metal_stdlib>
using namespace metal;

constant int shared_scale [[function_constant(10)]];
constant bool has_bias [[function_constant(11)]];
// clang-format puts a long declaration's attribute on the next line:
constant float shared_bias_value_with_a_long_name_that_does_not_fit_on_one_line
    [[function_constant(12)]];
constant float shared_bias =
    has_bias ? shared_bias_value_with_a_long_name_that_does_not_fit_on_one_line : 0.0f;
constant float shared_table[4] = {1.0f, 10.0f, 100.0f, 1000.0f};

float scaled(float x, uint i) {
  return x * shared_scale * shared_table[i % 4] + shared_bias;
}
