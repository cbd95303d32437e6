"""The arithmetic of fp_qmv's bfloat16 decode (csrc/backend/cuda/kernels/fp_qmv.cuh
and fp_decode.cuh), modelled in numpy with ml_dtypes' bfloat16: code bits
placed in a bfloat16 (code_pair_bits), then one bfloat16 multiply by the scale
times the layout's fixup, or two where that product leaves bfloat16's range
(needs_two_steps; never for E4M3 scales). An E8M0 scale's multiplier is its
byte plus the fixup's exponent put in the exponent field (e8m0_pair), up to
the largest byte that one step holds (kE8M0LargestPairByte); an E4M3 scale's
is the float product rounded to bfloat16 (one_step_multiplier). For the MLX
formats every code times every scale comes out exactly (decode_test checks the
float16 decode, the CUDA tests the kernels themselves on a GPU)."""

import ml_dtypes
import numpy as np
import pytest
from reference import E2M1_TABLE, E4M3_TABLE

BF16 = ml_dtypes.bfloat16
# CodeLayout<__nv_bfloat16, bits>: where the magnitude bits go, and 2^fixup.
MAGNITUDE_BIT = {4: 6, 8: 4}
FIXUP_EXPONENT = {4: 126, 8: 120}
# kE4M3ScaleShift: E4M3 scales (nvfp4) multiply 2^-8 smaller.
SHIFT = {"e8m0": 0, "e4m3": 8}
# kE4M3ScaleExponentBound: every finite E4M3 scale is below 2^9.
E4M3_SCALE_EXPONENT_BOUND = 9
# Floats from halfway past bfloat16's largest value round to infinity.
BF16_OVERFLOW = np.uint32(0x7F7F8000).view(np.float32)


def code_pair_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """The bfloat16 bits of each code as code_pair_bits builds them."""
    codes = codes.astype(np.uint32)
    shift = MAGNITUDE_BIT[bits]
    magnitude = (codes & ((1 << (bits - 1)) - 1)) << shift
    sign = ((codes >> (bits - 1)) & 1) << 15
    if bits == 8:
        carry_bit = shift + 7
        carry = (magnitude + (1 << shift)) & (1 << carry_bit)
        magnitude |= carry * ((1 << (15 - carry_bit)) - 1)
    return (sign | magnitude).astype(np.uint16)


def bf16_of_bits(bits16: np.ndarray) -> np.ndarray:
    return bits16.view(BF16)


def times_bf16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A bfloat16 multiply (exact in float32, then rounded once)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (a.astype(np.float32) * b.astype(np.float32)).astype(BF16)


def fold_e8m0(raw: np.ndarray, byte: np.ndarray, bits: int) -> np.ndarray:
    """raw (bfloat16) times E8M0 scale `byte` as fp_qmv multiplies it."""
    fixup = FIXUP_EXPONENT[bits]
    one_step = byte.astype(np.int64) <= 254 - fixup
    field = np.where(one_step, byte.astype(np.uint32) + fixup, 0)
    one = times_bf16(raw, bf16_of_bits((field << 7).astype(np.uint16)))
    first = times_bf16(raw, bf16_of_bits(np.uint16((fixup + 127) << 7)))
    two = times_bf16(first, bf16_of_bits((byte.astype(np.uint32) << 7).astype(np.uint16)))
    return np.where(one_step, one, two).astype(np.float32)


def fold(raw: np.ndarray, scale: np.ndarray, bits: int, scales: str) -> np.ndarray:
    """raw (bfloat16) times a float-decoded scale as fp_qmv multiplies it, as
    float32: E4M3 scales in one step always (kMayNeedTwoSteps)."""
    fixup = np.float32(2.0 ** (FIXUP_EXPONENT[bits] - SHIFT[scales]))
    with np.errstate(over="ignore", invalid="ignore"):
        product = scale.astype(np.float32) * fixup
        two_steps = (np.abs(product) >= BF16_OVERFLOW) & np.isfinite(scale)
    if scales == "e4m3":
        two_steps[...] = False
    one = times_bf16(raw, product.astype(BF16))
    two = times_bf16(times_bf16(raw, fixup.astype(BF16)), scale.astype(BF16))
    return np.where(two_steps, two, one).astype(np.float32)


def e8m0(byte: np.ndarray) -> np.ndarray:
    """MLX's E8M0: byte 0 is 2^-127, 255 is +inf."""
    exponent = byte.astype(np.float64) - 127
    return np.where(byte == 255, np.inf, np.exp2(exponent)).astype(np.float32)


@pytest.mark.parametrize("bits", [4, 8])
def test_code_bits_are_the_code_over_the_fixup(bits):
    codes = np.arange(1 << bits)
    table = E2M1_TABLE if bits == 4 else E4M3_TABLE
    raw = bf16_of_bits(code_pair_bits(codes, bits)).astype(np.float64)
    expected = table.astype(np.float64) * 2.0 ** -FIXUP_EXPONENT[bits]
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(raw), nan)
    assert np.array_equal(raw[~nan], expected[~nan])


@pytest.mark.parametrize(
    "bits, scales",
    [
        (4, "e8m0"),  # mxfp4
        (4, "e4m3"),  # nvfp4
        (8, "e8m0"),  # mxfp8
    ],
)
def test_scale_folds_exactly(bits, scales):
    codes = np.arange(1 << bits)
    table = (E2M1_TABLE if bits == 4 else E4M3_TABLE).astype(np.float64)
    stored = np.arange(256, dtype=np.uint8)
    scale = e8m0(stored) if scales == "e8m0" else E4M3_TABLE.astype(np.float32)
    raw = bf16_of_bits(code_pair_bits(codes, bits))
    if scales == "e8m0":
        got = fold_e8m0(raw[:, None], stored[None, :], bits).astype(np.float64)
    else:
        got = fold(raw[:, None], scale[None, :], bits, scales).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = table[:, None] * scale[None, :].astype(np.float64) * 2.0 ** -SHIFT[scales]
    # Exact wherever bfloat16 holds the product as a normal number; NaN and
    # infinity (0 x inf, NaN codes and scales, overflow) as dequantize gives.
    normal = np.isfinite(want) & ((want == 0) | (np.abs(want) >= 2.0**-126))
    normal &= np.abs(want) < 2.0**128 * (1 - 2.0**-9)
    assert np.array_equal(got[normal], want[normal])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.all(np.isinf(got[np.isinf(want)]))
    assert normal.sum() > 0.8 * normal.size


def test_e4m3_scales_are_below_their_bound():
    finite = E4M3_TABLE[np.isfinite(E4M3_TABLE)]
    assert np.abs(finite).max() < 2.0**E4M3_SCALE_EXPONENT_BOUND
    assert np.abs(finite).max() >= 2.0 ** (E4M3_SCALE_EXPONENT_BOUND - 1)


def test_a_swapped_layout_is_caught():
    """The model is strict: code bits one place off do not pass."""
    codes = np.arange(16)
    wrong = bf16_of_bits((code_pair_bits(codes, 4).astype(np.uint32) << 1).astype(np.uint16))
    expected = E2M1_TABLE.astype(np.float64) * 2.0**-126
    assert not np.array_equal(wrong.astype(np.float64), expected)
