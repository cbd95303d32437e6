"""The MSL idioms MLX's kernel headers use (tests/kernels/mlx_idioms.metal), each
against NumPy: without its shim or rewriter support the file does not compile."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from metal_sim import Library

KERNELS = Path(__file__).parent / "kernels"
RNG = np.random.default_rng(1)
LANES = np.arange(32)


@pytest.fixture(scope="module")
def idioms() -> Library:
    return Library([KERNELS / "mlx_idioms.metal"])


def run_lanes(lib: Library, name: str, x: np.ndarray, rows: int) -> np.ndarray:
    """`rows` results per lane of one simdgroup given `x` (one float per lane)."""
    out = np.full((rows, 32), np.nan, np.float32)
    lib.dispatch(name, {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(32, 1, 1))
    return out


def test_private_builtins_and_math_modes(idioms: Library) -> None:
    x = RNG.integers(-40, 40, 32).astype(np.float32) / 8  # sums exact in any order
    out = run_lanes(idioms, "private_builtins", x, 9)
    np.testing.assert_array_equal(out[0], np.abs(x))
    np.testing.assert_array_equal(out[1], np.maximum(np.abs(x), 0.5))
    np.testing.assert_array_equal(out[2], x * x + 1)
    np.testing.assert_array_equal(out[3], np.full(32, x.sum()))
    np.testing.assert_array_equal(out[4], np.where(LANES < 31, x[np.minimum(LANES + 1, 31)], x))
    np.testing.assert_array_equal(out[5], np.cumsum(x) - x)
    np.testing.assert_array_equal(out[6], x * 8)
    np.testing.assert_array_equal(out[7], np.full(32, 32))
    bits = np.bitwise_xor.reduce(x.view(np.uint32))
    np.testing.assert_array_equal(out[8].view(np.uint32), np.full(32, bits))


def test_public_functions_fill_shuffles_and_prefix_products(idioms: Library) -> None:
    signs = RNG.choice([-1.0, 1.0], 32)
    x = (signs * RNG.uniform(0.7, 1.3, 32)).astype(np.float32)
    out = run_lanes(idioms, "public_functions", x, 11)
    mantissa, exponent = np.frexp(x)
    np.testing.assert_array_equal(out[0], mantissa)
    np.testing.assert_array_equal(out[1], exponent)
    np.testing.assert_array_equal(out[2], x / 4)
    np.testing.assert_array_equal(out[3], np.float32(np.pi) * x)
    np.testing.assert_allclose(out[4], np.cos(np.pi * x.astype(np.float64)), atol=1e-6)
    np.testing.assert_array_equal(out[5], np.median([x, np.full(32, 0.25), np.full(32, -0.25)], 0))
    # down by 3: the top 3 lanes read the bottom 3 lanes of the filling (-x)
    np.testing.assert_array_equal(out[6], np.where(LANES < 29, x[(LANES + 3) % 32], -x[LANES - 29]))
    # up by 5 in groups of 16: each group's bottom 5 lanes read its top 5 filling lanes
    offset, base = LANES % 16, LANES // 16 * 16
    up = np.where(offset >= 5, x[LANES - 5], -x[base + 11 + np.minimum(offset, 4)])
    np.testing.assert_array_equal(out[7], up)
    inclusive = np.cumprod(x.astype(np.float64))
    np.testing.assert_allclose(out[8], inclusive, rtol=1e-5)
    np.testing.assert_allclose(out[9], np.concatenate([[1.0], inclusive[:-1]]), rtol=1e-5)
    np.testing.assert_array_equal(out[10], np.ones(32))


def test_members_qualified_by_address_space(idioms: Library) -> None:
    pairs = RNG.standard_normal((16, 2)).astype(np.float32)
    out = np.full(16, np.nan, np.float32)
    idioms.dispatch(
        "space_qualified_members", {0: pairs, 1: out}, grid=(1, 1, 1), threadgroup=(16, 1, 1)
    )
    a, b = pairs[:, 0], pairs[:, 1]
    np.testing.assert_array_equal(out, (b + a) * np.float32(10) + b)


def test_conversion_functions(idioms: Library) -> None:
    pairs = RNG.standard_normal((16, 2)).astype(np.float16)
    out = np.full((16, 3), np.nan, np.float32)
    idioms.dispatch(
        "conversion_functions", {0: pairs, 1: out}, grid=(1, 1, 1), threadgroup=(16, 1, 1)
    )
    np.testing.assert_array_equal(out[:, 0], pairs[:, 1])
    np.testing.assert_array_equal(out[:, 1], pairs[:, 0])
    np.testing.assert_array_equal(out[:, 2], pairs[:, 0] + pairs[:, 1])


def test_constant_implies_const(idioms: Library) -> None:
    out = np.zeros(1, np.int32)
    idioms.dispatch(
        "constant_is_const", {0: np.int32(21), 1: out}, grid=(1, 1, 1), threadgroup=(1, 1, 1)
    )
    assert out[0] == 42


def test_constant_array_parameter(idioms: Library) -> None:
    strides = np.array([100, 3], np.int64)
    out = np.full((6, 8), -1, np.int64)
    idioms.dispatch(
        "array_parameter", {0: strides.tobytes(), 1: out}, grid=(2, 3, 1), threadgroup=(4, 2, 1)
    )
    y, x = np.indices((6, 8))
    np.testing.assert_array_equal(out, x * 3 + y * 100)


def test_kernel_globals_named_like_libm(idioms: Library) -> None:
    x = RNG.uniform(-0.5, 2, 16).astype(np.float32)
    out = np.full((16, 2), np.nan, np.float32)
    idioms.dispatch("global_math_names", {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(16, 1, 1))
    np.testing.assert_allclose(out[:, 0], np.log1p(x), rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], np.hypot(x, 2), rtol=1e-6)


def test_void_t_defined_by_the_kernel(idioms: Library) -> None:
    out = np.zeros(1, np.int32)
    idioms.dispatch("void_t_from_the_kernel", {0: out}, grid=(1, 1, 1), threadgroup=(1, 1, 1))
    assert out[0] == 1


def test_half_to_bfloat_through_typedefs(idioms: Library) -> None:
    codes = np.arange(256, dtype=np.uint8)
    out = np.zeros(256, ml_dtypes.bfloat16)
    idioms.dispatch(
        "half_to_bfloat_through_typedefs",
        {0: codes, 1: out},
        grid=(1, 1, 1),
        threadgroup=(256, 1, 1),
    )
    # every half with a zero low byte is a bfloat (NaNs compare as NaNs)
    halves = (codes.astype(np.uint16) << 8).view(np.float16)
    np.testing.assert_array_equal(out.astype(np.float32), halves.astype(np.float32))


def test_nested_aligned_struct_copied_across_address_spaces(idioms: Library) -> None:
    x = RNG.standard_normal(32).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    result = idioms.dispatch(
        "nested_aligned_struct_copy", {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(8, 1, 1)
    )
    np.testing.assert_array_equal(out, x[::-1][:8])
    assert result.counters["threadgroup_bytes_written"] == x.nbytes
    assert result.counters["buffers"][0]["bytes_read"] == x.nbytes


def test_dispatch_threads_runs_smaller_edge_threadgroups(idioms: Library) -> None:
    out = np.zeros((3, 10, 4), np.uint32)
    result = idioms.dispatch("grid_of_threads", {0: out}, threads=(10, 3, 1), threadgroup=(4, 2, 1))
    y, x = np.indices((3, 10))
    width = np.minimum(4, 10 - x // 4 * 4)
    height = np.minimum(2, 3 - y // 2 * 2)
    np.testing.assert_array_equal(out[..., 0], width)
    np.testing.assert_array_equal(out[..., 1], height)
    np.testing.assert_array_equal(out[..., 2], x % 4 + y % 2 * width)
    np.testing.assert_array_equal(out[..., 3], np.full((3, 10), 30))
    assert result.counters["threads"] == 30
    assert result.counters["threadgroups"] == 6


def test_dispatch_takes_a_grid_or_threads(idioms: Library) -> None:
    with pytest.raises(ValueError, match="either grid"):
        idioms.dispatch("void_t_from_the_kernel", {}, grid=(1, 1, 1), threads=(1, 1, 1))
