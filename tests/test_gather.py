"""gather_qmm (the mixture-of-experts product) against a per-pair float64 reference."""

import re

import mlx.core as mx
import numpy as np
import pytest
from reference import (
    ALL_MODES,
    DEFAULT_GROUP_SIZE,
    MLX_MODES,
    TOLERANCE,
    gather_reference,
    quantized_experts,
    relative_error,
)

import mlx_fpqmm

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def routed(tokens, E, top_k):
    """Expert indices as a router gives them: (tokens, top_k), distinct per token."""
    return mx.array(np.stack([np.random.permutation(E)[:top_k] for _ in range(tokens)]))


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_rhs_indices_match_reference(mode, dtype, transpose):
    np.random.seed(0)
    E, free = 5, 40
    quantized = 2 * DEFAULT_GROUP_SIZE[mode] * 2
    N, K = (free, quantized) if transpose else (quantized, free)
    w_q, scales, _ = quantized_experts(mode, E, *((N, K) if transpose else (K, N)))
    indices = routed(7, E, 3)
    x = mx.random.normal((7, 1, 2, K)).astype(dtype)  # M = 2 rows per pair
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=indices, transpose=transpose, mode=mode)
    assert y.shape == (7, 3, 2, N) and y.dtype == dtype
    lhs = np.arange(7).reshape(7, 1)
    reference = gather_reference(x, w_q, scales, lhs, indices, mode, transpose)
    assert relative_error(y, reference) < TOLERANCE[dtype]


@pytest.mark.parametrize("mode", ["mxfp4", "fp8"])
@pytest.mark.parametrize("index_dtype", [mx.int32, mx.int64, mx.uint32, mx.uint8])
def test_lhs_rhs_and_broadcast_indices(mode, index_dtype):
    E, N, K = 3, 24, 64
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    x = mx.random.normal((4, 3, K))
    cases = {
        "lhs only": (mx.array([3, 0, 0, 2]), None),
        "rhs only": (None, mx.array([[2], [0], [1]])),
        "both": (mx.array([1, 3, 2]), mx.array([0, 0, 2])),
        "broadcast": (mx.array([[0], [3]]), mx.array([[2, 1, 0]])),
    }
    for name, (lhs, rhs) in cases.items():
        cast = [None if i is None else i.astype(index_dtype) for i in (lhs, rhs)]
        if lhs is not None and rhs is None:
            # Without rhs_indices, w's batch pairs with the lhs indices.
            w_case, s_case = w_q[:1], scales[:1]
        else:
            w_case, s_case = w_q, scales
        y = mlx_fpqmm.gather_qmm(
            x, w_case, s_case, lhs_indices=cast[0], rhs_indices=cast[1], mode=mode
        )
        lhs_ref = np.arange(4) if lhs is None else np.array(lhs)
        rhs_ref = np.arange(w_case.shape[0]) if rhs is None else np.array(rhs)
        reference = gather_reference(x, w_case, s_case, lhs_ref, rhs_ref, mode)
        assert relative_error(y, reference) < 1e-5, name


# x's shape and rhs_indices' shape without lhs_indices: x's batch broadcast against the
# indices as mlx-lm's layers call gather_qmm (the primitive then reads pair p's x matrix
# as p / divisor, the named divisor), and a layout that needs an index array.
DEFAULT_LHS_LAYOUTS = {
    "unsorted, divisor 2": ((5, 1, 1, 64), (5, 2)),
    "sorted, divisor 1": ((7, 1, 64), (7,)),
    "x of one matrix, divisor 8": ((3, 64), (4, 2)),
    "rows of 3, divisor 2": ((4, 1, 3, 64), (4, 2)),
    "divisor 6": ((2, 1, 1, 1, 64), (2, 3, 2)),
    "divisor 2 of 3 axes": ((2, 3, 1, 1, 64), (2, 3, 2)),
    "an index array": ((1, 2, 3, 64), (4, 2)),
}


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "fp8"])
@pytest.mark.parametrize("layout", DEFAULT_LHS_LAYOUTS.values(), ids=DEFAULT_LHS_LAYOUTS.keys())
def test_default_lhs_indices(mode, layout):
    """Without lhs_indices, pair p multiplies x's matrix of p's position in the
    broadcast batch, as the default lhs_indices (x's batch, 0, 1, ...) given explicitly."""
    np.random.seed(4)
    x_shape, rhs_shape = layout
    E, N, K = 6, 24, x_shape[-1]
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    x = mx.random.normal(x_shape)
    rhs = mx.array(np.random.randint(0, E, rhs_shape))
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=rhs, mode=mode)
    x_batch = x_shape[:-2]
    lhs = np.broadcast_to(np.arange(int(np.prod(x_batch))).reshape(x_batch), rhs_shape)
    reference = gather_reference(x, w_q, scales, lhs, rhs, mode)
    assert relative_error(y, reference) < 1e-5
    explicit = mlx_fpqmm.gather_qmm(
        x, w_q, scales, lhs_indices=mx.array(lhs), rhs_indices=rhs, mode=mode
    )
    np.testing.assert_array_equal(np.array(y), np.array(explicit))
    grad = mx.grad(lambda x: mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=rhs, mode=mode).sum())
    grad_explicit = mx.grad(
        lambda x: mlx_fpqmm.gather_qmm(
            x, w_q, scales, lhs_indices=mx.array(lhs), rhs_indices=rhs, mode=mode
        ).sum()
    )
    np.testing.assert_allclose(np.array(grad(x)), np.array(grad_explicit(x)), rtol=1e-5, atol=1e-5)


def graph_nodes(y, path):
    mx.export_to_dot(str(path), y)
    return sorted(re.findall(r'label ="(\w+)"', path.read_text()))


@pytest.mark.parametrize(
    "layout", [((3, 1, 1, 64), (3, 2)), ((6, 1, 64), (6,))], ids=["unsorted", "sorted"]
)
def test_default_lhs_indices_add_no_nodes(layout, tmp_path):
    """mlx-lm's layouts on evaluated operands: the product is one node (no arange,
    reshape, broadcast or copy of x's indices), which a decoding model builds for every
    expert product."""
    x_shape, rhs_shape = layout
    w_q, scales, _ = quantized_experts("mxfp4", 4, 32, 64)
    x = mx.random.normal(x_shape)
    rhs = mx.array(np.random.randint(0, 4, rhs_shape).astype(np.uint32))
    mx.eval(w_q, scales, x, rhs)
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=rhs, mode="mxfp4")
    assert graph_nodes(y, tmp_path / "graph.dot") == ["FpGatherQuantizedMatmul"]


@pytest.mark.parametrize("first_tokens", [1, 3])
def test_compile_shapeless_without_lhs_indices(first_tokens):
    """Compiled without shapes on mlx-lm's layout at one number of tokens, then run on
    others: x's matrices follow the tokens (a traced index array would pin them)."""
    w_q, scales, _ = quantized_experts("mxfp4", 4, 32, 64)
    mx.eval(w_q, scales)

    def f(x, rhs):
        return mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=rhs, mode="mxfp4")

    compiled = mx.compile(f, shapeless=True)
    for tokens in (first_tokens, 4, 2):
        x = mx.random.normal((tokens, 1, 1, 64))
        rhs = routed(tokens, 4, 2)
        y = compiled(x, rhs)
        assert y.shape == (tokens, 2, 1, 32)
        np.testing.assert_array_equal(np.array(y), np.array(f(x, rhs)))


def test_compile_shapeless_one_x_matrix():
    """Traced where x's one matrix and the one pair line up (x (1, 1, K), indices (1,)),
    then run on 3 pairs: each reads x's one matrix, as without compile. An x of 3 matrices
    against one index, which that graph cannot take, is an error, not a wrong shape."""
    w_q, scales, _ = quantized_experts("mxfp4", 4, 32, 64)
    mx.eval(w_q, scales)

    def f(x, rhs):
        return mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=rhs, mode="mxfp4")

    compiled = mx.compile(f, shapeless=True)
    x = mx.random.normal((1, 1, 64))
    for pairs in (1, 3):
        rhs = mx.array(np.arange(pairs, dtype=np.uint32))
        np.testing.assert_array_equal(np.array(compiled(x, rhs)), np.array(f(x, rhs)))
    with pytest.raises(ValueError, match="no longer broadcasts"):
        compiled(mx.random.normal((3, 1, 64)), mx.array([1], dtype=mx.uint32))


@pytest.mark.parametrize("mode", MLX_MODES)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_same_as_mlx_gather_qmm(mode, transpose):
    np.random.seed(1)
    E, N, K = 6, 64, 96 if mode != "nvfp4" else 80
    w_q, scales, _ = quantized_experts(mode, E, *((N, K) if transpose else (K, N)))
    x = mx.random.normal((9, 1, 1, K))
    indices = routed(9, E, 2)
    kwargs = dict(rhs_indices=indices, transpose=transpose, mode=mode)
    ours = mlx_fpqmm.gather_qmm(x, w_q, scales, **kwargs)
    theirs = mx.gather_qmm(x, w_q, scales, **kwargs)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sorted_indices", [True, False])
def test_sorted_flag_is_a_hint(sorted_indices):
    """Sorted runs are read in place; unsorted indices with the flag still give
    right results."""
    E, N, K = 4, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((12, 1, K))
    indices = mx.array([0, 0, 1, 1, 1, 2, 3, 3, 0, 2, 1, 3])
    if sorted_indices:
        indices = mx.sort(indices)
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=indices, mode="mxfp4", sorted_indices=True)
    reference = gather_reference(x, w_q, scales, np.arange(12), indices, "mxfp4")
    assert relative_error(y, reference) < 1e-5


def test_per_expert_global_scale():
    """nvfp4 with one tensor scale per expert, on the CPU too (MLX raises there)."""
    E, N, K = 4, 32, 64
    w_q, scales, global_scale = quantized_experts("nvfp4", E, N, K, global_scale=True)
    x = mx.random.normal((5, 1, 1, K))
    indices = routed(5, E, 2)
    y = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=indices, mode="nvfp4", global_scale=global_scale
    )
    reference = gather_reference(
        x, w_q, scales, np.arange(5).reshape(5, 1), indices, "nvfp4", global_scale=global_scale
    )
    assert relative_error(y, reference) < 1e-5
    # A wrong expert's scale is far outside the tolerance.
    shifted = mx.concatenate([global_scale[1:], global_scale[:1]])
    wrong = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=indices, mode="nvfp4", global_scale=shifted
    )
    assert relative_error(wrong, reference) > 1e-2


@pytest.mark.parametrize("x_batch", [(4,), (2, 1)], ids=str)
def test_per_expert_global_scale_without_indices(x_batch):
    """Without indices a global scale per matrix of w multiplies each matrix's
    product, batches broadcast as in quantized_matmul (MLX takes no global scale
    without indices)."""
    E, N, K = 4, 16, 64
    w_q, scales, global_scale = quantized_experts("nvfp4", E, N, K, global_scale=True)
    x = mx.random.normal((*x_batch, 3, K))
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, mode="nvfp4", global_scale=global_scale)
    lhs = np.arange(np.prod(x_batch)).reshape(x_batch)
    rhs = mx.arange(E)
    reference = gather_reference(x, w_q, scales, lhs, rhs, "nvfp4", global_scale=global_scale)
    assert y.shape == (*np.broadcast_shapes(x_batch, (E,)), 3, N)
    assert relative_error(y, reference) < 1e-5
    explicit = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=rhs, mode="nvfp4", global_scale=global_scale
    )
    np.testing.assert_array_equal(np.array(y), np.array(explicit))


def test_wrong_expert_scales_are_caught():
    """The check this file relies on fails when one expert's scales are another's."""
    E, N, K = 3, 16, 64
    w_q, scales, _ = quantized_experts("mxfp8", E, N, K)
    x = mx.random.normal((4, 1, 1, K))
    indices = mx.array([[0, 1], [1, 2], [2, 0], [1, 1]])
    reference = gather_reference(x, w_q, scales, np.arange(4).reshape(4, 1), indices, "mxfp8")
    swapped = mx.concatenate([scales[1:2], scales[0:1], scales[2:]])
    y = mlx_fpqmm.gather_qmm(x, w_q, swapped, rhs_indices=indices, mode="mxfp8")
    assert relative_error(y, reference) > 1e-2


def test_out_of_range_indices_give_nan_rows():
    E, N, K = 3, 16, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((4, 1, K))
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=mx.array([0, 3, -1, 2]), mode="mxfp4")
    rows = np.isnan(np.array(y)).all(axis=(1, 2))
    assert rows.tolist() == [False, True, True, False]
    reference = gather_reference(x, w_q, scales, [0, 3], [0, 2], "mxfp4")
    assert relative_error(y[mx.array([0, 3])], reference) < 1e-5


@pytest.mark.parametrize("dtype", [mx.int64, mx.uint64])
def test_64_bit_indices_past_uint32_give_nan_rows(dtype):
    # Cast to uint32 as MLX casts them, 2^32 + 1 would wrap onto expert 1.
    E, N, K = 3, 16, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((4, 1, K))
    past = [2**32 + 1, 2**40] if dtype == mx.uint64 else [2**32 + 1, -(2**32) + 2]
    y = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=mx.array([2, past[0], past[1], 1], dtype), mode="mxfp4"
    )
    rows = np.isnan(np.array(y)).all(axis=(1, 2))
    assert rows.tolist() == [False, True, True, False]
    reference = gather_reference(x, w_q, scales, [0, 3], [2, 1], "mxfp4")
    assert relative_error(y[mx.array([0, 3])], reference) < 1e-5


def test_empty_indices():
    w_q, scales, _ = quantized_experts("mxfp4", 3, 16, 64)
    x = mx.random.normal((1, 2, 64))
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=mx.zeros((0,), mx.int32), mode="mxfp4")
    assert y.shape == (0, 2, 16)
    y = mlx_fpqmm.gather_qmm(
        mx.zeros((4, 0, 64)), w_q, scales, rhs_indices=mx.array([0, 1, 2, 0]), mode="mxfp4"
    )
    assert y.shape == (4, 0, 16)


def test_empty_matrices():
    """K = 0 (zero outputs), N = 0 and M = 0, also through the gradient."""
    x = mx.random.normal((3, 2, 0))
    w_q, scales = mx.zeros((4, 16, 0), mx.uint32), mx.zeros((4, 16, 0), mx.uint8)
    indices = mx.array([3, 0, 1])
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=indices, mode="mxfp4")
    assert y.shape == (3, 2, 16) and not mx.any(y).item()
    w_q, scales, _ = quantized_experts("mxfp4", 4, 16, 64)
    y = mlx_fpqmm.gather_qmm(mx.zeros((3, 0, 64)), w_q, scales, rhs_indices=indices, mode="mxfp4")
    assert y.shape == (3, 0, 16)
    grad = mx.grad(
        lambda x: mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=indices, mode="mxfp4").sum()
    )(mx.zeros((3, 0, 64)))
    assert grad.shape == (3, 0, 64)


def test_without_indices_is_quantized_matmul():
    w_q, scales, _ = quantized_experts("fp4", 2, 16, 64)
    x = mx.random.normal((2, 3, 64))
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, mode="fp4")
    expected = mlx_fpqmm.quantized_matmul(x, w_q, scales, mode="fp4")
    np.testing.assert_array_equal(np.array(y), np.array(expected))


def test_affine_is_mlx():
    w = mx.random.normal((3, 32, 64))
    w_q, scales, biases = mx.quantize(w)
    x = mx.random.normal((4, 1, 1, 64))
    indices = mx.array([[0], [2], [1], [1]])
    ours = mlx_fpqmm.gather_qmm(x, w_q, scales, biases, rhs_indices=indices)
    theirs = mx.gather_qmm(x, w_q, scales, biases, rhs_indices=indices)
    np.testing.assert_array_equal(np.array(ours), np.array(theirs))


@pytest.mark.parametrize("shapeless", [False, True])
def test_compile(shapeless):
    """Compiled, also shapeless over the number of tokens. As with mx.gather_qmm, a
    default (arange) index pins the shapes it is made from, so both are given."""
    w_q, scales, _ = quantized_experts("mxfp4", 4, 32, 64)
    mx.eval(w_q, scales)

    def f(x, lhs, rhs):
        return mlx_fpqmm.gather_qmm(x, w_q, scales, lhs_indices=lhs, rhs_indices=rhs, mode="mxfp4")

    compiled = mx.compile(f, shapeless=shapeless)
    for tokens in (3, 5):
        x = mx.random.normal((tokens, 1, 64))
        lhs = mx.arange(tokens)[:, None]
        rhs = routed(tokens, 4, 2)
        y = compiled(x, lhs, rhs)
        assert y.shape == (tokens, 2, 1, 32)
        np.testing.assert_array_equal(np.array(y), np.array(f(x, lhs, rhs)))


@pytest.mark.parametrize("mode", MLX_MODES)
@pytest.mark.parametrize("lhs", [False, True])
def test_grad_matches_mlx(mode, lhs):
    E, N, K = 4, 32, 64
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    x = mx.random.normal((3, 2, K))
    rhs = mx.array([2, 0, 3, 0])
    lhs_indices = mx.array([1, 1, 0, 2]) if lhs else None
    rhs_indices = rhs if lhs else rhs[:3]

    def loss(op):
        def f(x):
            y = op(x, w_q, scales, lhs_indices=lhs_indices, rhs_indices=rhs_indices, mode=mode)
            return (y * mx.arange(y.size).reshape(y.shape) / y.size).sum()

        return f

    ours = mx.grad(loss(mlx_fpqmm.gather_qmm))(x)
    theirs = mx.grad(loss(mx.gather_qmm))(x)
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-4, atol=1e-5)


def test_jvp_is_linear_in_x():
    w_q, scales, _ = quantized_experts("fp8", 3, 16, 64)
    x = mx.random.normal((2, 1, 64))
    t = mx.random.normal((2, 1, 64))
    indices = mx.array([[2, 0], [1, 1]]).reshape(2, 2)

    def f(x):
        return mlx_fpqmm.gather_qmm(x[:, None], w_q, scales, rhs_indices=indices, mode="fp8")

    _, (tangent,) = mx.jvp(f, (x,), (t,))
    np.testing.assert_allclose(np.array(tangent), np.array(f(t)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rhs_indices=mx.array([0.0, 1.0])), "rhs_indices must be an integer array"),
        (dict(lhs_indices=mx.array([0.5])), "lhs_indices must be an integer array"),
        (
            dict(rhs_indices=mx.array([0, 1, 2])),
            r"x's batch shape \(4\) and rhs_indices of shape \(3\) cannot be broadcast",
        ),
        (
            dict(lhs_indices=mx.array([0, 1])),
            r"lhs_indices of shape \(2\) and w's batch shape \(3\) cannot be broadcast",
        ),
        (
            dict(lhs_indices=mx.array([0, 1]), rhs_indices=mx.array([0, 1, 2])),
            r"lhs_indices of shape \(2\) and rhs_indices of shape \(3\) cannot be broadcast",
        ),
        (dict(rhs_indices=mx.array([0]), mode="int4"), "Invalid mode 'int4'"),
        (
            dict(rhs_indices=mx.array([0]), global_scale=mx.ones((2,))),
            "global_scale is only supported for mode 'nvfp4'",
        ),
        (dict(rhs_indices=mx.array([0]), bits=8), "bits=8 is not supported for mode 'mxfp4'"),
    ],
)
def test_bad_arguments(kwargs, message):
    w_q, scales, _ = quantized_experts("mxfp4", 3, 16, 64)
    x = mx.random.normal((4, 1, 64))
    kwargs = {"mode": "mxfp4", **kwargs}
    with pytest.raises(ValueError, match=message):
        mlx_fpqmm.gather_qmm(x, w_q, scales, **kwargs)


def test_bad_global_scale_shape():
    w_q, scales, _ = quantized_experts("nvfp4", 3, 16, 64)
    x = mx.random.normal((4, 1, 64))
    with pytest.raises(ValueError, match=r"global_scale must hold one value or have w's batch"):
        mlx_fpqmm.gather_qmm(
            x, w_q, scales, rhs_indices=mx.array([0]), mode="nvfp4", global_scale=mx.ones((2,))
        )


def test_swap_into_mx():
    """Assigning mx.gather_qmm = mlx_fpqmm.gather_qmm routes MLX's callers here."""
    w_q, scales, _ = quantized_experts("mxfp4", 3, 16, 64)
    x = mx.random.normal((2, 1, 1, 64))
    indices = mx.array([[0, 2], [1, 0]])
    expected = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=indices, mode="mxfp4")
    original = mx.gather_qmm
    try:
        mx.gather_qmm = mlx_fpqmm.gather_qmm
        from mlx_lm.models.switch_layers import QuantizedSwitchLinear

        layer = QuantizedSwitchLinear(64, 16, 3, bias=False, group_size=32, bits=4, mode="mxfp4")
        layer.weight, layer.scales = w_q, scales
        y = layer(x, indices)
    finally:
        mx.gather_qmm = original
    np.testing.assert_array_equal(np.array(y), np.array(expected))
