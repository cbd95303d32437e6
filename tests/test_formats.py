"""The decode rules, checked code by code through the op against ml_dtypes."""

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest

import mlx_fpqmm


def one_hot_product(words_per_row, codes, bits, scales, mode, group_size):
    """Row n of w holds codes[n] as element 0; x = e_0 reads it out."""
    n = len(codes)
    w = np.zeros((n, words_per_row), dtype=np.uint32)
    w[:, 0] = np.asarray(codes, dtype=np.uint32)
    K = words_per_row * 32 // bits
    x = mx.zeros((1, K)).at[0, 0].add(1.0)
    op = mlx_fpqmm.qmm_for_mode(mode)
    y = op(x, mx.array(w), scales, group_size=group_size, mode=mode)
    return np.array(y)[0]


def test_e2m1_codes():
    codes = np.arange(16)
    scales = mx.ones((16, 1), dtype=mx.float32)
    y = one_hot_product(4, codes, 4, scales, "fp4", 32)
    expected = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(y, expected)
    # A dot product loses the sign of zero; dequantize keeps code 8 as -0.
    words = mx.array(np.array([[0x76543210, 0xFEDCBA98, 0, 0]], dtype=np.uint32))
    decoded = np.array(mlx_fpqmm.dequantize(words, scales[:1], mode="fp4"))[0, :16]
    np.testing.assert_array_equal(decoded, expected)
    np.testing.assert_array_equal(np.signbit(decoded), np.signbit(expected))


def test_e4m3_codes():
    codes = np.arange(256)
    scales = mx.ones((256, 1), dtype=mx.float32)
    y = one_hot_product(8, codes, 8, scales, "fp8", 32)
    expected = codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.isnan(expected[[0x7F, 0xFF]]).all()
    np.testing.assert_array_equal(y, expected)


def test_e4m3_scales_of_nvfp4():
    scale_bytes = np.arange(256, dtype=np.uint8)
    scales = mx.array(scale_bytes[:, None])
    # E2M1 code 2 is 1.0, so the output is the decoded scale itself.
    y = one_hot_product(2, np.full(256, 2), 4, scales, "nvfp4", 16)
    expected = scale_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("byte", [0, 1, 126, 127, 128, 254])
def test_e8m0_scales(byte):
    scales = mx.array(np.array([[byte]], dtype=np.uint8))
    # E4M3 0x38 is 1.0.
    y = one_hot_product(8, [0x38], 8, scales, "mxfp8", 32)
    expected = np.array([byte], dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    assert y[0] == expected.astype(np.float32)[0]


def test_e8m0_byte_255_is_infinity_as_in_mlx():
    """ml_dtypes reads 0xFF as NaN; MLX (and so mlx_fpqmm) as +inf."""
    scales = mx.array(np.array([[255]], dtype=np.uint8))
    w = mx.array(np.full((1, 8), 0x38383838, dtype=np.uint32))  # all 1.0
    x = mx.ones((1, 32))
    y = mlx_fpqmm.fp8_qmm(x, w, scales, mode="mxfp8")
    theirs = mx.quantized_matmul(x, w, scales, mode="mxfp8")
    assert y.item() == np.inf and theirs.item() == np.inf


def test_format_table():
    table = mlx_fpqmm.FORMATS
    assert list(table) == ["mxfp4", "nvfp4", "mxfp8", "fp4", "fp8"]
    assert table["mxfp4"]["group_sizes"] == (32,)
    assert table["nvfp4"]["scales"] == "e4m3"
    assert table["mxfp8"]["bits"] == 8 and table["mxfp8"]["codes"] == "e4m3"
    assert table["fp4"]["group_sizes"] == (16, 32, 64, 128)
    assert table["fp8"]["scales"] == "float"
