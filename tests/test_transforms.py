"""Gradients, jvp and compilation of the ops."""

import mlx.core as mx
import numpy as np
import pytest
from reference import ALL_MODES, BITS, DEFAULT_GROUP_SIZE, qmm_reference

import mlx_fpqmm


def qmm(mode):
    return mlx_fpqmm.qmm_for_mode(mode)


def weights(mode, rows=24, cols=None):
    cols = cols or 2 * DEFAULT_GROUP_SIZE[mode] * 2
    return mlx_fpqmm.quantize(mx.random.normal((rows, cols)), mode=mode)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_grad_matches_finite_differences(mode, transpose):
    w_q, scales = weights(mode)
    K = w_q.shape[1] * 32 // BITS[mode] if transpose else w_q.shape[0]
    x = mx.random.normal((3, K))
    y0 = qmm(mode)(x, w_q, scales, transpose=transpose, mode=mode)
    cotangent = mx.random.normal(y0.shape)

    def loss(x):
        return (qmm(mode)(x, w_q, scales, transpose=transpose, mode=mode) * cotangent).sum()

    grad = np.array(mx.grad(loss)(x))
    # The loss is linear in x: central differences are exact up to rounding.
    rng = np.random.default_rng(0)
    for _ in range(4):
        direction = mx.array(rng.standard_normal(x.shape).astype(np.float32))
        h = 1e-2
        numeric = (loss(x + h * direction) - loss(x - h * direction)).item() / (2 * h)
        analytic = float((grad * np.array(direction)).sum())
        assert abs(numeric - analytic) <= 1e-3 * max(1.0, abs(analytic))


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
def test_grad_matches_mlx(mode):
    w_q, scales = weights(mode)
    x = mx.random.normal((2, 5, w_q.shape[1] * 32 // BITS[mode]))

    def ours(x):
        return qmm(mode)(x, w_q, scales, mode=mode).square().sum()

    def theirs(x):
        return mx.quantized_matmul(x, w_q, scales, mode=mode).square().sum()

    np.testing.assert_allclose(
        np.array(mx.grad(ours)(x)), np.array(mx.grad(theirs)(x)), rtol=1e-4, atol=1e-4
    )


def test_grad_through_broadcast_batch():
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((3, 16, 64)), mode="mxfp4")
    x = mx.random.normal((1, 4, 64))  # broadcast against 3 weight matrices

    def loss(x):
        return mlx_fpqmm.fp4_qmm(x, w_q, scales).sum()

    grad = mx.grad(loss)(x)
    assert grad.shape == x.shape
    dense = mx.dequantize(w_q, scales, mode="mxfp4", dtype=mx.float32)
    expected = dense.sum(axis=(0, 1))  # d/dx sum(x @ W_b.T) summed over b
    np.testing.assert_allclose(np.array(grad[0, 0]), np.array(expected), rtol=1e-4, atol=1e-4)


def test_jvp():
    w_q, scales = weights("fp8")
    x = mx.random.normal((3, 128))
    tangent = mx.random.normal((3, 128))

    def f(x):
        return mlx_fpqmm.fp8_qmm(x, w_q, scales, mode="fp8")

    _, (jvp_out,) = mx.jvp(f, [x], [tangent])
    np.testing.assert_allclose(np.array(jvp_out), np.array(f(tangent)), rtol=1e-6)


def test_no_gradient_for_weights_or_scales():
    w_q, scales = weights("fp4")
    x = mx.random.normal((2, 128))
    scales_grad = mx.grad(lambda s: mlx_fpqmm.fp4_qmm(x, w_q, s, mode="fp4").sum())
    with pytest.raises(ValueError, match="only x is differentiable"):
        scales_grad(scales)


@pytest.mark.parametrize("shapeless", [False, True])
def test_compile(shapeless):
    w_q, scales = weights("mxfp4", cols=128)

    @mx.compile
    def plain(x):
        return mlx_fpqmm.fp4_qmm(x, w_q, scales) * 2.0

    f = mx.compile(lambda x: mlx_fpqmm.fp4_qmm(x, w_q, scales) * 2.0, shapeless=shapeless)
    for batch in (1, 3, 7):
        x = mx.random.normal((batch, 128))
        ref, _ = qmm_reference(x, w_q, scales, "mxfp4")
        np.testing.assert_allclose(np.array(f(x)), 2 * ref, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(np.array(plain(x)), 2 * ref, rtol=1e-5, atol=1e-4)


def test_compile_with_repeated_and_reversed_calls():
    w_q, scales = weights("mxfp4", cols=128)
    x = mx.random.normal((2, 128))

    def f(x):
        a = mlx_fpqmm.fp4_qmm(x, w_q, scales)
        b = mlx_fpqmm.fp4_qmm(x, w_q, scales)
        c = mlx_fpqmm.fp4_qmm(x[:, ::-1], w_q, scales)
        return a + b + c

    np.testing.assert_allclose(np.array(mx.compile(f)(x)), np.array(f(x)), rtol=1e-6, atol=1e-6)
