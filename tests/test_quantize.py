"""quantize / dequantize for all five modes."""

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest
from reference import MLX_MODES, codes_of, dequantize_reference

import mlx_fpqmm


@pytest.mark.parametrize("mode", MLX_MODES)
def test_mlx_modes_are_bit_identical(mode):
    w = mx.random.normal((32, 128))
    ours = mlx_fpqmm.quantize(w, mode=mode)
    theirs = mx.quantize(w, mode=mode)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and mx.array_equal(a, b).item()
    d_ours = mlx_fpqmm.dequantize(*ours, mode=mode)
    d_theirs = mx.dequantize(*theirs, mode=mode)
    assert d_ours.dtype == mx.bfloat16 and mx.array_equal(d_ours, d_theirs).item()


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_nvfp4_global_scale_round_trip(shape):
    w = mx.random.normal((16, 64))
    g = mx.abs(w).max().reshape(shape)  # one value of any shape, as MLX takes it
    ours = mlx_fpqmm.quantize(w, mode="nvfp4", global_scale=g)
    theirs = mx.quantize(w, mode="nvfp4", global_scale=g)
    assert all(mx.array_equal(a, b).item() for a, b in zip(ours, theirs, strict=True))
    d = mlx_fpqmm.dequantize(*ours, mode="nvfp4", global_scale=g, dtype=mx.float32)
    ref = mx.dequantize(*theirs, mode="nvfp4", global_scale=g, dtype=mx.float32)
    assert mx.array_equal(d, ref).item()
    x = mx.random.normal((3, 64))
    y = mlx_fpqmm.fp4_qmm(x, *ours, mode="nvfp4", global_scale=g)
    assert mx.allclose(y, x @ ref.T, rtol=1e-5, atol=1e-5).item()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("group_size", [16, 32, 64, 128])
def test_fp4_scales_and_codes(dtype, group_size):
    w = mx.random.normal((8, 256)).astype(dtype)
    w_q, scales = mlx_fpqmm.quantize(w, group_size, mode="fp4")
    assert w_q.shape == (8, 32) and w_q.dtype == mx.uint32
    assert scales.shape == (8, 256 // group_size) and scales.dtype == dtype
    grouped = np.array(w.astype(mx.float32)).reshape(8, -1, group_size)
    expected_scales = mx.array(np.abs(grouped).max(-1)).astype(dtype) / mx.array(6.0, dtype=dtype)
    assert mx.array_equal(scales, expected_scales).item()
    # Each code is the nearest E2M1 value to w / scale.
    table = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)
    table = table.astype(np.float32)
    codes = codes_of(np.array(w_q), 4).reshape(grouped.shape)
    scaled = grouped / np.array(scales.astype(mx.float32))[..., None]
    chosen = table[codes]
    best = np.abs(scaled[..., None] - table).min(-1)
    assert (np.abs(scaled - chosen) <= best + 1e-6).all()


def test_fp4_ties_round_to_even():
    # Scale 1 (amax 6): each value sits halfway between two codes.
    group = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0] + [6.0] + [0.0] * 23
    w_q, scales = mlx_fpqmm.quantize(mx.array([group]), mode="fp4")
    assert scales.item() == 1.0
    decoded = mlx_fpqmm.dequantize(w_q, scales, mode="fp4")[0, :9]
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0]
    assert decoded.tolist() == expected


def test_fp8_codes_match_ml_dtypes_rounding():
    w = mx.random.normal((4, 128)) * 3
    w_q, scales = mlx_fpqmm.quantize(w, mode="fp8")
    scaled = np.array(w).reshape(4, 4, 32) / np.array(scales)[..., None]
    expected = scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(4, 128)
    np.testing.assert_array_equal(codes_of(np.array(w_q), 8), expected)


@pytest.mark.parametrize("mode", ["fp4", "fp8"])
def test_zero_group_and_round_trip(mode):
    w = mx.random.normal((4, 64))
    w = w.at[1, :32].multiply(0.0)
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    d = mlx_fpqmm.dequantize(w_q, scales, mode=mode)
    assert d.dtype == mx.float32
    assert (d[1, :32] == 0).all().item()
    np.testing.assert_array_equal(np.array(d), dequantize_reference(w_q, scales, mode))
    # fp8 keeps 3 mantissa bits, fp4 one: bound the round-trip error.
    bound = {"fp4": 0.25, "fp8": 1 / 16}[mode]
    grouped_max = np.abs(np.array(w)).reshape(4, 2, 32).max(-1, keepdims=True)
    err = np.abs(np.array(d - w)).reshape(4, 2, 32)
    assert (err <= bound * grouped_max + 1e-7).all()


def test_dequantize_dtype_argument():
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((4, 64)), mode="fp8")
    assert mlx_fpqmm.dequantize(w_q, scales, mode="fp8", dtype=mx.float16).dtype == (mx.float16)


@pytest.mark.parametrize("mode", ["fp4", "fp8"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_weights_make_their_group_nan(mode, value):
    w = mx.random.normal((2, 64))
    w = w.at[0, 3].add(value)
    d = np.array(mlx_fpqmm.dequantize(*mlx_fpqmm.quantize(w, mode=mode), mode=mode))
    assert np.isnan(d[0, :32]).all()
    assert np.isfinite(d[0, 32:]).all() and np.isfinite(d[1]).all()
