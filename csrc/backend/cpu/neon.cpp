// NEON kernels (arm64: Apple silicon, Graviton, ...). NEON is part of the
// arm64 baseline, so this file needs no flags and no run-time check.
#include <arm_neon.h>

#include <cstring>

#include "backend/cpu/simd_kernels.h"

namespace mlx_fpqmm::cpu {

namespace {

struct NeonVec {
  using F = float32x4_t;
  using I = uint32x4_t;
  static constexpr int kLanes = 4;

  static F zero() {
    return vdupq_n_f32(0.0f);
  }
  static F set1(float v) {
    return vdupq_n_f32(v);
  }
  static F set2(float lo, float hi) {
    return vcombine_f32(vdup_n_f32(lo), vdup_n_f32(hi));
  }
  static F load(const float* p) {
    return vld1q_f32(p);
  }
  static void store(float* p, F v) {
    vst1q_f32(p, v);
  }
  static F fma(F a, F b, F c) {
    return vfmaq_f32(c, a, b);
  }
  static F mul(F a, F b) {
    return vmulq_f32(a, b);
  }
  static F add(F a, F b) {
    return vaddq_f32(a, b);
  }
  static float sum(F v) {
    return vaddvq_f32(v);
  }
  static I load_words(const uint8_t* p) {
    return vreinterpretq_u32_u8(vld1q_u8(p));
  }
  static I shift_right(I v, int bits) {
    return vshlq_u32(v, vdupq_n_s32(-bits));
  }
  // A byte lookup in the 64-byte float table: lane code c reads bytes
  // 4c .. 4c + 3.
  static F e2m1(I v) {
    uint8x16x4_t table;
    std::memcpy(&table, kE2M1Values.data(), sizeof(table));
    uint32x4_t first = vshlq_n_u32(vandq_u32(v, vdupq_n_u32(0xF)), 2);
    uint32x4_t bytes =
        vaddq_u32(vmulq_n_u32(first, 0x01010101), vdupq_n_u32(0x03020100));
    return vreinterpretq_f32_u8(vqtbl4q_u8(table, vreinterpretq_u8_u32(bytes)));
  }
  static F e4m3(I v) {
    float values[4] = {
        kE4M3Values[vgetq_lane_u32(v, 0) & 0xFF],
        kE4M3Values[vgetq_lane_u32(v, 1) & 0xFF],
        kE4M3Values[vgetq_lane_u32(v, 2) & 0xFF],
        kE4M3Values[vgetq_lane_u32(v, 3) & 0xFF]};
    return vld1q_f32(values);
  }
  static I load_index(const int32_t* p) {
    return vreinterpretq_u32_s32(vld1q_s32(p));
  }
  static F permute(F table, I index) {
    float lanes[4];
    vst1q_f32(lanes, table);
    float values[4] = {
        lanes[vgetq_lane_u32(index, 0)],
        lanes[vgetq_lane_u32(index, 1)],
        lanes[vgetq_lane_u32(index, 2)],
        lanes[vgetq_lane_u32(index, 3)]};
    return vld1q_f32(values);
  }
  // 8 codes from 4 bytes: lookups in kernels.h's bf16 byte tables give the
  // two upper bytes of each float, zipped into halfwords and widened.
  static void decode_e2m1(const uint8_t* p, F& even, F& odd) {
    uint32_t word;
    std::memcpy(&word, p, sizeof(word));
    uint8x8_t bytes = vreinterpret_u8_u32(vdup_n_u32(word));
    uint8x8_t lo = vand_u8(bytes, vdup_n_u8(0x0F));
    uint8x8_t hi = vshr_n_u8(bytes, 4);
    uint8x8_t codes = vext_u8(lo, hi, 4);  // lo[0..3], hi[0..3]
    uint8x8_t low = vqtbl1_u8(vld1q_u8(kE2M1Bf16Bytes[0].data()), codes);
    uint8x8_t high = vqtbl1_u8(vld1q_u8(kE2M1Bf16Bytes[1].data()), codes);
    uint16x8_t halves = vreinterpretq_u16_u8(
        vcombine_u8(vzip1_u8(low, high), vzip2_u8(low, high)));
    even = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(halves), 16));
    odd = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(halves), 16));
  }
  static F decode_e4m3(const uint8_t* p) {
    float values[4] = {
        kE4M3Values[p[0]],
        kE4M3Values[p[1]],
        kE4M3Values[p[2]],
        kE4M3Values[p[3]]};
    return vld1q_f32(values);
  }
  static void store_interleaved(float* dst, F even, F odd) {
    // A named pair: in clang's arm_neon.h vst2q_f32 is a macro, and a braced
    // initialiser's comma would split its arguments.
    float32x4x2_t pair = {{even, odd}};
    vst2q_f32(dst, pair);
  }
};

}  // namespace

const IsaKernels* neon_kernels() {
  using K = SimdKernels<NeonVec>;
  static const IsaKernels kernels{
      "neon",
      96,  // not measured: the Zen 4 values
      96,
      K::arranged_length,
      K::arrange_x,
      K::dot,
      K::axpy,
      K::dequantize,
      nullptr,
      nullptr,
      nullptr,
  };
  return &kernels;
}

}  // namespace mlx_fpqmm::cpu
