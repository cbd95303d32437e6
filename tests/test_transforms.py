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


# x's batch against 4 weight matrices, traced with the first shape and called
# with the others: broadcasting (x's batch of 1, a 2-D x) and M change.
SHAPELESS_BATCHES = [
    [(4, 3), (1, 3), (4, 5), (1, 7)],
    [(1, 3), (1, 5), (4, 2)],
    [(3,), (5,)],
    [(2, 4, 3), (2, 1, 3), (1, 4, 6)],
]


@pytest.mark.parametrize("shapes", SHAPELESS_BATCHES, ids=lambda s: "-".join(map(str, s)))
def test_shapeless_compile_follows_batch_broadcast(shapes):
    w = mx.random.normal((4, 16, 64)) if len(shapes[0]) < 3 else mx.random.normal((1, 4, 16, 64))
    w_q, scales = mlx_fpqmm.quantize(w, mode="mxfp4")
    mx.eval(w_q, scales)  # constants of the compiled graphs, not their inputs

    def product(x):
        return mlx_fpqmm.quantized_matmul(x, w_q, scales, mode="mxfp4")

    def loss(x):
        return (product(x) * mx.arange(16)).sum()

    def broadcast_axes(shape):
        return [size == 1 for size in shape[:-1]]

    f = mx.compile(product, shapeless=True)
    grad = mx.compile(mx.grad(loss), shapeless=True)
    for shape in shapes:
        x = mx.random.normal((*shape, 64))
        eager = product(x)
        got = f(x)
        assert got.shape == eager.shape
        np.testing.assert_allclose(np.array(got), np.array(eager), rtol=1e-5, atol=1e-5)
        # The gradient's sum over x's broadcast axes is traced once: as with
        # MLX's own product, it holds while they stay those of the trace.
        if broadcast_axes(shape) == broadcast_axes(shapes[0]):
            got_grad = grad(x)
            assert got_grad.shape == x.shape
            np.testing.assert_allclose(
                np.array(got_grad), np.array(mx.grad(loss)(x)), rtol=1e-5, atol=1e-5
            )


def test_grad_of_broadcast_x_matches_mlx():
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((2, 3, 16, 64)), mode="mxfp4")
    x = mx.random.normal((1, 3, 5, 64))  # broadcast along the first batch axis

    def ours(x):
        return (mlx_fpqmm.quantized_matmul(x, w_q, scales, mode="mxfp4") ** 2).sum()

    def theirs(x):
        return (mx.quantized_matmul(x, w_q, scales, mode="mxfp4") ** 2).sum()

    np.testing.assert_allclose(
        np.array(mx.grad(ours)(x)), np.array(mx.grad(theirs)(x)), rtol=1e-4, atol=1e-4
    )


def test_shapeless_compiled_grad_of_sorted_gather():
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((3, 16, 64)), mode="mxfp4")
    mx.eval(w_q, scales)

    def loss(x, experts):
        y = mlx_fpqmm.gather_qmm(
            x, w_q, scales, rhs_indices=experts, mode="mxfp4", sorted_indices=True
        )
        return (y**2).sum()

    grad = mx.compile(mx.grad(loss), shapeless=True)
    for experts in ([0, 0, 1, 2, 2], [0, 1, 1, 2, 2, 2, 2]):
        experts = mx.array(experts, mx.uint32)
        x = mx.random.normal((experts.size, 1, 64))  # mlx-lm's sorted layout
        np.testing.assert_allclose(
            np.array(grad(x, experts)), np.array(mx.grad(loss)(x, experts)), rtol=1e-5, atol=1e-5
        )


def test_compile_with_repeated_and_reversed_calls():
    w_q, scales = weights("mxfp4", cols=128)
    x = mx.random.normal((2, 128))

    def f(x):
        a = mlx_fpqmm.fp4_qmm(x, w_q, scales)
        b = mlx_fpqmm.fp4_qmm(x, w_q, scales)
        c = mlx_fpqmm.fp4_qmm(x[:, ::-1], w_q, scales)
        return a + b + c

    np.testing.assert_allclose(np.array(mx.compile(f)(x)), np.array(f(x)), rtol=1e-6, atol=1e-6)
