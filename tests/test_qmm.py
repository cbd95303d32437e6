"""fp4_qmm / fp8_qmm / quantized_matmul against the MLX reference."""

import mlx.core as mx
import numpy as np
import pytest
from reference import (
    ALL_MODES,
    BITS,
    DEFAULT_GROUP_SIZE,
    MLX_MODES,
    TOLERANCE,
    qmm_reference,
    relative_error,
)

import mlx_fpqmm

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
DTYPE_NAMES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}


def qmm(mode):
    return mlx_fpqmm.qmm_for_mode(mode)


def make_weights(mode, rows, cols, group_size=None, dtype=mx.float32):
    """Quantizes a random (rows, cols) matrix along cols."""
    w = mx.random.normal((rows, cols)).astype(dtype)
    return mlx_fpqmm.quantize(w, group_size, mode=mode)


def shape_for(transpose, M, N, K):
    """w's logical shape: (N, K) quantized along K, or (K, N) along N."""
    return (N, K) if transpose else (K, N)


# N and K not multiples of 32 wherever the format allows it: the quantized
# axis must be a multiple of the group size, the other axis is free.
@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
@pytest.mark.parametrize("M", [1, 3, 32, 33, 100])
def test_matches_reference(mode, dtype, transpose, M):
    group_size = DEFAULT_GROUP_SIZE[mode]
    free, quantized = 72, 4 * group_size + (group_size if mode == "nvfp4" else 0)
    N, K = (free, quantized) if transpose else (quantized, free)
    w_q, scales = make_weights(mode, *shape_for(transpose, M, N, K))
    x = mx.random.normal((M, K)).astype(dtype)
    y = qmm(mode)(x, w_q, scales, transpose=transpose, mode=mode)
    assert y.dtype == dtype and y.shape == (M, N)
    err = relative_error(y, qmm_reference(x, w_q, scales, mode, transpose))
    assert err < TOLERANCE[dtype]


@pytest.mark.parametrize("mode", ["fp4", "fp8"])
@pytest.mark.parametrize("group_size", [16, 64, 128])
@pytest.mark.parametrize("scale_dtype", DTYPES, ids=DTYPE_NAMES.get)
def test_float_scale_group_sizes_and_dtypes(mode, group_size, scale_dtype):
    w_q, scales = make_weights(mode, 40, 256, group_size, dtype=scale_dtype)
    assert scales.dtype == scale_dtype
    x = mx.random.normal((5, 256))
    y = qmm(mode)(x, w_q, scales, group_size=group_size, mode=mode)
    reference = qmm_reference(x, w_q, scales, mode, group_size=group_size)
    assert relative_error(y, reference) < TOLERANCE[mx.float32]


def test_nvfp4_global_scale():
    w = mx.random.normal((48, 64)) * 1e-3
    global_scale = mx.abs(w).max()
    w_q, scales = mx.quantize(w, mode="nvfp4", global_scale=global_scale)
    x = mx.random.normal((7, 64))
    y = mlx_fpqmm.fp4_qmm(x, w_q, scales, mode="nvfp4", global_scale=global_scale)
    reference = qmm_reference(x, w_q, scales, "nvfp4", global_scale=global_scale)
    assert relative_error(y, reference) < TOLERANCE[mx.float32]
    # Without it the result is off by 2688 / global_scale: the scale is applied.
    plain = mlx_fpqmm.fp4_qmm(x, w_q, scales, mode="nvfp4")
    assert relative_error(plain, reference) > 1.0


@pytest.mark.parametrize("mode", ALL_MODES)
def test_metric_catches_one_wrong_nibble_or_scale_group(mode):
    """A single corrupted code or scale group must exceed every tolerance."""
    group_size = DEFAULT_GROUP_SIZE[mode]
    w_q, scales = make_weights(mode, 16, 4 * group_size)
    x = mx.random.normal((4, 4 * group_size))
    y = qmm(mode)(x, w_q, scales, mode=mode)
    loosest = max(TOLERANCE.values())

    # Corrupt the code with the largest contribution: flip its sign bit.
    words = np.array(w_q)
    k = int(np.abs(np.array(x)).sum(0).argmax())
    per_word = 32 // BITS[mode]
    sign_bit = np.uint32(1 << (k % per_word * BITS[mode] + BITS[mode] - 1))
    words[3, k // per_word] ^= sign_bit
    wrong_code = qmm_reference(x, mx.array(words), scales, mode)
    assert relative_error(y, wrong_code) > loosest

    # Use the neighbouring group's scale for one group.
    s = np.array(scales)
    s[5, 1] = s[5, 0] if s[5, 0] != s[5, 1] else s[5, 1] // 2
    wrong_scale = qmm_reference(x, w_q, mx.array(s), mode)
    assert relative_error(y, wrong_scale) > loosest


@pytest.mark.parametrize("mode", ALL_MODES)
def test_batched(mode):
    group_size = DEFAULT_GROUP_SIZE[mode]
    K, N = 2 * group_size, 24
    w = mx.random.normal((4, N, K))
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    op = qmm(mode)
    cases = [
        mx.random.normal((4, 3, K)),  # one x matrix per w matrix
        mx.random.normal((2, 4, 3, K)),  # extra leading batch on x
        mx.random.normal((1, 3, K)),  # x broadcast over the batch of w
        mx.random.normal((3, K)),  # 2-D x against every w
        mx.random.normal((K,)),  # a vector against every w
    ]
    for x in cases:
        y = op(x, w_q, scales, mode=mode)
        expected = np.broadcast_shapes(x.shape[:-2], (4,)) + x.shape[-2:-1] + (N,)
        if x.ndim == 1:
            expected = (4, N)
        assert y.shape == expected
        xb = x[None] if x.ndim == 1 else x
        reference = qmm_reference(xb, w_q, scales, mode)
        ref, magnitude = reference
        if x.ndim == 1:
            reference = (ref[:, 0], magnitude[:, 0])
        assert relative_error(y, reference) < TOLERANCE[mx.float32]


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "fp4"])
def test_leading_dims_fold_into_rows(mode):
    w_q, scales = make_weights(mode, 20, 64)
    x = mx.random.normal((2, 5, 7, 64))
    y = qmm(mode)(x, w_q, scales, mode=mode)
    assert y.shape == (2, 5, 7, 20)
    reference = qmm_reference(x, w_q, scales, mode)
    assert relative_error(y, reference) < TOLERANCE[mx.float32]
    v = mx.random.normal((64,))
    assert qmm(mode)(v, w_q, scales, mode=mode).shape == (20,)


@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_strided_inputs(transpose):
    mode = "mxfp4"
    w_q, scales = make_weights(mode, 64, 128)
    K = 128 if transpose else 64
    base = mx.random.normal((K, 40))
    x = base.T[::2]  # transposed and sliced: not row-contiguous
    w_rows = w_q[::2], scales[::2]  # every other row of w
    if not transpose:
        w_rows = w_q, scales
    y = mlx_fpqmm.fp4_qmm(x, *w_rows, transpose=transpose, mode=mode)
    reference = qmm_reference(x, *w_rows, mode, transpose)
    assert relative_error(y, reference) < TOLERANCE[mx.float32]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_empty_inputs(mode):
    w_q, scales = make_weights(mode, 8, 64)
    y = qmm(mode)(mx.zeros((0, 64)), w_q, scales, mode=mode)
    assert y.shape == (0, 8)
    y = qmm(mode)(mx.zeros((2, 0, 64)), w_q, scales, mode=mode)
    assert y.shape == (2, 0, 8)
    mx.eval(y)


@pytest.mark.parametrize("mode", MLX_MODES)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_quantized_matmul_matches_mlx(mode, transpose):
    w_q, scales = make_weights(mode, 64, 128)
    K = 128 if transpose else 64
    x = mx.random.normal((3, K))
    ours = mlx_fpqmm.quantized_matmul(x, w_q, scales, transpose=transpose, mode=mode)
    theirs = mx.quantized_matmul(x, w_q, scales, transpose=transpose, mode=mode)
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-5, atol=1e-5)


def test_quantized_matmul_affine_is_mlx():
    w = mx.random.normal((32, 64))
    w_q, scales, biases = mx.quantize(w)
    x = mx.random.normal((3, 64))
    ours = mlx_fpqmm.quantized_matmul(x, w_q, scales, biases)
    theirs = mx.quantized_matmul(x, w_q, scales, biases)
    assert mx.array_equal(ours, theirs).item()


def test_quantized_matmul_swaps_into_mlx(monkeypatch):
    import mlx.nn as nn

    layer = nn.QuantizedLinear(64, 32, mode="mxfp4")
    x = mx.random.normal((5, 64))
    before = layer(x)
    monkeypatch.setattr(mx, "quantized_matmul", mlx_fpqmm.quantized_matmul)
    after = layer(x)
    np.testing.assert_allclose(np.array(after), np.array(before), rtol=1e-5, atol=1e-5)


def test_streams():
    w_q, scales = make_weights("mxfp4", 16, 64)
    x = mx.random.normal((2, 64))
    stream = mx.new_stream(mx.cpu)
    for s in (mx.cpu, stream, mx.Device(mx.cpu)):
        y = mlx_fpqmm.fp4_qmm(x, w_q, scales, stream=s)
        assert relative_error(y, qmm_reference(x, w_q, scales, "mxfp4")) < 1e-5
    with pytest.raises(TypeError):
        mlx_fpqmm.fp4_qmm(x, w_q, scales, True, None, "mxfp4", None, mx.cpu)
    with pytest.raises(TypeError):
        mlx_fpqmm.fp4_qmm(x=x, w=w_q, scales=scales)
