// MSL idioms MLX's kernel headers use (one kernel per idiom); the tests
// compare each with NumPy.
#include <metal_stdlib>
#include <metal_simdgroup>
using namespace metal;

// MLX's steel/utils/type_traits.h defines this (Metal's library has no void_t).
namespace metal {
template <typename... Ts>
struct make_void {
  typedef void type;
};
template <typename... Ts>
using void_t = typename make_void<Ts...>::type;
}  // namespace metal

// MLX's utils.h defines these globally (Metal has neither).
inline float log1p(float x) {
  float xp1 = 1.0f + x;
  return xp1 == 1.0f ? x : x * (metal::log(xp1) / (xp1 - 1.0f));
}
inline float hypot(float x, float y) {
  return metal::sqrt(x * x + y * y);
}

typedef half float16_t;
typedef bfloat bfloat16_t;

// Metal's private builtins, as MLX's bf16_math.h calls them.
[[kernel]] void private_builtins(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint lane [[thread_index_in_simdgroup]]) {
  const float x = in[lane];
  const uint n = 32;
  out[0 * n + lane] = __metal_fabs(x, __METAL_MAYBE_FAST_MATH__);
  out[1 * n + lane] = __metal_fmax3(x, 0.5f, -x, __METAL_FAST_MATH__);
  out[2 * n + lane] = __metal_fma(x, x, 1.0f);
  out[3 * n + lane] = __metal_simd_sum(x);
  out[4 * n + lane] = __metal_simd_shuffle_down(x, ushort(1));
  out[5 * n + lane] = __metal_simd_prefix_exclusive_sum(x);
  out[6 * n + lane] = __metal_ldexp(x, 3, __METAL_PRECISE_MATH__);
  out[7 * n + lane] = __metal_get_simdgroup_size(ushort());
  out[8 * n + lane] = __metal_simd_xor(x);  // bf16_math.h's simd_xor: on the bits
}

// Public MSL: M_PI_F, is_convertible_v, frexp, ldexp, cospi, the three-operand
// median, fill shuffles and prefix products.
[[kernel]] void public_functions(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint lane [[thread_index_in_simdgroup]]) {
  const float x = in[lane];
  const float fill = -in[lane];
  const uint n = 32;
  int exponent = 0;
  out[0 * n + lane] = frexp(x, exponent);
  out[1 * n + lane] = exponent;
  out[2 * n + lane] = ldexp(x, -2);
  out[3 * n + lane] = M_PI_F * x;
  out[4 * n + lane] = cospi(x);
  out[5 * n + lane] = median3(x, 0.25f, -0.25f);
  out[6 * n + lane] = simd_shuffle_and_fill_down(x, fill, ushort(3));
  out[7 * n + lane] = simd_shuffle_and_fill_up(x, fill, ushort(5), ushort(16));
  out[8 * n + lane] = simd_prefix_inclusive_product(x);
  out[9 * n + lane] = simd_prefix_exclusive_product(x);
  out[10 * n + lane] = is_convertible_v<int, float> && !is_convertible_v<thread int*, float>;
}

// complex.h's pattern: constructors and conversions for each address space.
template <typename T>
struct pair_t {
  T first;
  T second;

  constexpr pair_t(T a, T b) thread : first(a), second(b) {};
  constexpr pair_t(T a, T b) device : first(a), second(b) {};
  constexpr pair_t(vec<T, 2> v) thread : first(v.x), second(v.y) {};
  constexpr pair_t(vec<T, 2> v) threadgroup : first(v.x), second(v.y) {};

  constexpr operator vec<T, 2>() const thread {
    return vec<T, 2>(first, second);
  }
  constexpr operator vec<T, 2>() const constant {
    return vec<T, 2>(first, second);
  }
  // Only for objects in device memory on Metal: loses its qualifier here.
  T sum() const device {
    return first + second;
  }
};

[[kernel]] void space_qualified_members(
    const device float2* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  pair_t<float> p(in[i]);
  pair_t<float> q(p.second, p.first);
  out[i] = q.sum() * 10.0f + q.first;
}

// Conversion functions to a vector and to half: declared as written, and used
// by implicit conversions and by the `float2(object)` constructor syntax.
struct halves_t {
  half low, high;
  operator vec<half, 2>() const thread {
    return vec<half, 2>(low, high);
  }
  operator half() const thread {
    return low + high;
  }
};

[[kernel]] void conversion_functions(
    const device half2* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  halves_t h{in[i].x, in[i].y};
  half2 v = h;
  half sum = h;
  out[3 * i] = float2(v).y;
  out[3 * i + 1] = float(half2(h).x);
  out[3 * i + 2] = float(sum);
}

// Metal's constant memory is read-only: `constant int&` and
// `const constant int&` are one type (MLX's fp_qmv_quad_impl relies on it).
inline int twice(constant int& n) {
  return 2 * n;
}

[[kernel]] void constant_is_const(const constant int& n [[buffer(0)]], device int* out [[buffer(1)]]) {
  out[0] = twice(n);
}

// utils.h's elem_to_loc: a constant array parameter is a pointer.
inline long location(uint2 element, constant const int64_t strides[2]) {
  return element.x * strides[1] + element.y * strides[0];
}

[[kernel]] void array_parameter(
    constant const int64_t* strides [[buffer(0)]],
    device long* out [[buffer(1)]],
    uint2 position [[thread_position_in_grid]],
    uint2 size [[threads_per_grid]]) {
  out[position.y * size.x + position.x] = location(position, strides);
}

// Globals that share their names with the host's libm.
[[kernel]] void global_math_names(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  out[2 * i] = log1p(in[i]);
  out[2 * i + 1] = hypot(in[i], 2.0f);
}

[[kernel]] void void_t_from_the_kernel(device int* out [[buffer(0)]]) {
  out[0] = is_same_v<metal::void_t<int, float>, void>;
}

// fp8.h's pattern: a conversion through float16_t to bfloat16_t.
struct code_t {
  uchar bits;
  operator float16_t() const thread {
    return as_type<float16_t>(ushort(bits << 8));
  }
  operator bfloat16_t() const thread {
    return static_cast<bfloat16_t>(this->operator float16_t());
  }
};

[[kernel]] void half_to_bfloat_through_typedefs(
    const device uchar* codes [[buffer(0)]],
    device bfloat16_t* out [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  code_t code{codes[i]};
  out[i] = bfloat16_t(code);
}

// steel/gemm/loader.h's pattern: a class template whose default argument has
// parentheses, with a nested alignas(expression) struct copied from device
// to threadgroup memory.
template <
    typename T,
    short columns,
    short threads,
    short alignment = 1,
    short reads = (columns * 4) / (threads)>
struct RowLoader {
  struct alignas(alignment * sizeof(T)) ReadVector {
    uint8_t v[sizeof(T) * reads];
  };

  static void load(const device T* src, threadgroup T* dst, uint t) {
    *((threadgroup ReadVector*)(&dst[t * reads])) = *((const device ReadVector*)(&src[t * reads]));
  }
};

[[kernel]] void nested_aligned_struct_copy(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float staged[32];
  RowLoader<float, 8, 8, 4>::load(in, staged, t);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[t] = staged[31 - t];
}

// dispatch_threads: the grid's far threadgroups are smaller.
[[kernel]] void grid_of_threads(
    device uint4* out [[buffer(0)]],
    uint2 position [[thread_position_in_grid]],
    uint2 group_size [[threads_per_threadgroup]],
    uint2 grid_size [[threads_per_grid]],
    uint index [[thread_index_in_threadgroup]]) {
  out[position.y * grid_size.x + position.x] = uint4(group_size, index, grid_size.x * grid_size.y);
}
