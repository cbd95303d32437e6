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
  // E4M3 from its bits (kernels.h's e4m3_from_top): the code in the top
  // byte of each lane, lower bits ignored; NaN comes out finite.
  static F e4m3_top(I top) {
    const uint32x4_t bits = vandq_u32(
        vreinterpretq_u32_s32(
            vshrq_n_s32(vreinterpretq_s32_u32(top), kE4M3TopShift)),
        vdupq_n_u32(kE4M3TopMask));
    return vmulq_n_f32(vreinterpretq_f32_u32(bits), kE4M3TopFactor);
  }
  // The low byte of each lane as E4M3, NaN included: magnitude 0x7F sets all
  // bits.
  static F e4m3(I v) {
    const uint32x4_t top = vshlq_n_u32(v, 24);
    const uint32x4_t magnitude = vdupq_n_u32(0x7F000000u);
    const uint32x4_t nan = vceqq_u32(vandq_u32(top, magnitude), magnitude);
    return vreinterpretq_f32_u32(
        vorrq_u32(vreinterpretq_u32_f32(e4m3_top(top)), nan));
  }
  // A dot step of 16 E4M3 codes (4 words) as four vectors, vector i holding
  // byte i of each word (the default order), without the NaN test: NaN codes
  // come out finite and the kernels redo the rows that hold them
  // (simd::has_nan_codes). Written out: NEON's shift counts are immediates.
  static void decode_e4m3_step(const uint8_t* p, F* d) {
    const uint32x4_t words = load_words(p);
    d[0] = e4m3_top(vshlq_n_u32(words, 24));
    d[1] = e4m3_top(vshlq_n_u32(words, 16));
    d[2] = e4m3_top(vshlq_n_u32(words, 8));
    d[3] = e4m3_top(words);
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
    uint32_t word;
    std::memcpy(&word, p, sizeof(word));
    return e4m3(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(word)))));
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
