"""The graphs that the CUDA plan builds instead of the product primitive (many
rows of x: dequantize + matmul; a gather of many rows: dequantize every expert
+ gather_mm), built on the CPU by mlx_fpqmm.testing.dequantize_on_cpu, with
FpDequantize's CPU kernel: W dequantized exactly, the products against the
float64 reference, gather's clamped indices, NaN pairs and per-expert scales.
No GPU needed; the CUDA tests run the same graphs
with FpDequantize's CUDA kernel."""

import mlx.core as mx
import numpy as np
import pytest
from reference import (
    ALL_MODES,
    DEFAULT_GROUP_SIZE,
    FLOAT_SCALE_MODES,
    TOLERANCE,
    gather_reference,
    graph_nodes,
    qmm_reference,
    quantized_experts,
    relative_error,
)

import mlx_fpqmm
from mlx_fpqmm.testing import dequantize_on_cpu

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def product(mode, x, w_q, scales, **kwargs):
    return mlx_fpqmm.qmm_for_mode(mode)(x, w_q, scales, mode=mode, stream=mx.cpu, **kwargs)


def dequantized_by_graph(mode, w_q, scales, dtype, **kwargs):
    """W (N, K) as FpDequantize writes it, read back by an identity x: each output
    of I @ W.T has one nonzero term, so it is W's value, exactly."""
    K = w_q.shape[-1] * 32 // (4 if mode in ("mxfp4", "nvfp4", "fp4") else 8)
    with dequantize_on_cpu():
        y = product(mode, mx.eye(K, dtype=dtype), w_q, scales, **kwargs)
    return np.array(y.T.astype(mx.float32))


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_dequantized_weights_are_exact(mode, dtype):
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((48, 256)) * 3, mode=mode)
    expected = mlx_fpqmm.dequantize(w_q, scales, mode=mode, dtype=dtype)
    np.testing.assert_array_equal(
        dequantized_by_graph(mode, w_q, scales, dtype), np.array(expected.astype(mx.float32))
    )


@pytest.mark.parametrize("mode", FLOAT_SCALE_MODES)
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("group_size", [16, 64])
def test_dequantized_float_scales_are_exact(mode, scale_dtype, group_size):
    w = (mx.random.normal((40, 256)) * 5).astype(scale_dtype)
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode, group_size=group_size)
    expected = mlx_fpqmm.dequantize(w_q, scales, mode=mode, group_size=group_size, dtype=mx.float32)
    got = dequantized_by_graph(mode, w_q, scales, mx.float32, group_size=group_size)
    np.testing.assert_array_equal(got, np.array(expected.astype(mx.float32)))


def test_dequantized_nvfp4_global_scale():
    w = mx.random.normal((32, 128)) * 40
    global_scale = mx.max(mx.abs(w)).astype(mx.float32)
    w_q, scales = mlx_fpqmm.quantize(w, mode="nvfp4", global_scale=global_scale)
    expected = mx.dequantize(w_q, scales, mode="nvfp4", global_scale=global_scale, dtype=mx.float32)
    got = dequantized_by_graph("nvfp4", w_q, scales, mx.float32, global_scale=global_scale)
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
@pytest.mark.parametrize("M", [1, 33])
def test_product_matches_reference(mode, dtype, transpose, M):
    free, quantized = 72, 4 * DEFAULT_GROUP_SIZE[mode]
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((free, quantized)), mode=mode)
    x = mx.random.normal((2, M, quantized if transpose else free)).astype(dtype)
    with dequantize_on_cpu():
        y = product(mode, x, w_q, scales, transpose=transpose)
    assert "FpDequantize" in graph_nodes(y)
    assert y.dtype == dtype and y.shape == (2, M, free if transpose else quantized)
    reference = qmm_reference(x, w_q, scales, mode, transpose)
    assert relative_error(y, reference) < TOLERANCE[dtype]


@pytest.mark.parametrize("w_batch", [(3,), (1,)], ids=["batched", "broadcast"])
def test_batched_weights_and_global_scale(w_batch):
    w = mx.random.normal((*w_batch, 64, 128))
    global_scale = mx.array(7.5)
    w_q, scales = mlx_fpqmm.quantize(w, mode="nvfp4", global_scale=global_scale)
    x = mx.random.normal((2, 3, 5, 128))
    with dequantize_on_cpu():
        y = mlx_fpqmm.fp4_qmm(
            x, w_q, scales, mode="nvfp4", global_scale=global_scale, stream=mx.cpu
        )
    on_cpu_path = mlx_fpqmm.fp4_qmm(
        x, w_q, scales, mode="nvfp4", global_scale=global_scale, stream=mx.cpu
    )
    assert "FpDequantize" in graph_nodes(y) and "FpDequantize" not in graph_nodes(on_cpu_path)
    reference = qmm_reference(x, w_q, scales, "nvfp4", global_scale=global_scale)
    assert relative_error(y, reference) < TOLERANCE[mx.float32]
    assert relative_error(on_cpu_path, reference) < TOLERANCE[mx.float32]


def gather(x, w_q, scales, mode="mxfp4", **kwargs):
    return mlx_fpqmm.gather_qmm(x, w_q, scales, mode=mode, stream=mx.cpu, **kwargs)


def check_gather(x, w_q, scales, rhs, mode="mxfp4", transpose=True, global_scale=None, **kwargs):
    """The graph's gather against the primitive's (NaN pairs alike) and, on the
    pairs in range, against the float64 reference. MLX's CPU gather_mm takes
    float32 only."""
    arguments = dict(
        rhs_indices=rhs, mode=mode, transpose=transpose, global_scale=global_scale, **kwargs
    )
    with dequantize_on_cpu():
        y = gather(x, w_q, scales, **arguments)
    nodes = graph_nodes(y)
    assert "FpDequantize" in nodes and "GatherMM" in nodes
    primitive = np.array(gather(x, w_q, scales, **arguments))
    y = np.array(y)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(primitive))
    E = w_q.shape[0]
    pairs_shape = y.shape[:-2]
    x_matrices = x.reshape(-1, *x.shape[-2:]).shape[0]
    lhs = np.broadcast_to(np.arange(x_matrices).reshape(x.shape[:-2]), pairs_shape)
    rhs = np.broadcast_to(np.array(rhs), pairs_shape)
    valid = rhs < E
    assert np.isnan(y[~valid]).all() and not np.isnan(y[valid]).any()
    reference = gather_reference(
        x, w_q, scales, lhs[valid], rhs[valid], mode, transpose, global_scale=global_scale
    )
    assert relative_error(mx.array(y[valid]), reference) < TOLERANCE[mx.float32]


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_gather_sorted_mlx_lm_layout(mode, transpose):
    """x (pairs, 1, K), indices (pairs,) sorted, the last ones past the experts."""
    E, free, quantized = 5, 48, 4 * DEFAULT_GROUP_SIZE[mode]
    N, K = (free, quantized) if transpose else (quantized, free)
    w_q, scales, _ = quantized_experts(mode, E, *((N, K) if transpose else (K, N)))
    rhs = mx.array([0, 0, 1, 2, 2, 2, 4, 5, 9], dtype=mx.uint32)
    x = mx.random.normal((rhs.size, 1, K))
    check_gather(x, w_q, scales, rhs, mode, transpose, sorted_indices=True)


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "fp8"])
def test_gather_unsorted_routes(mode):
    """x (tokens, 1, 1, K) broadcast over (tokens, top_k) routes, some out of range."""
    E, N, K, tokens = 6, 40, 128, 9
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    rhs = np.stack([np.random.default_rng(t).permutation(E + 2)[:3] for t in range(tokens)])
    x = mx.random.normal((tokens, 1, 1, K))
    check_gather(x, w_q, scales, mx.array(rhs.astype(np.uint32)), mode)


def test_gather_sorted_expanded_x():
    """x from expand_dims, its axis of 1 of stride 1 (the graph gives x fresh
    strides for MLX's grouped GEMM)."""
    E, N, K = 4, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.expand_dims(mx.random.normal((7, K)), 1)
    mx.eval(x)
    rhs = mx.array([0, 0, 1, 2, 3, 3, 5], dtype=mx.uint32)
    check_gather(x, w_q, scales, rhs, sorted_indices=True)


def test_gather_sorted_indices_repeated_by_x_batch():
    """x's batch (2, 5) against sorted indices (5,): not sorted pairs, so sorted
    first."""
    E, N, K = 4, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    rhs = mx.array([0, 1, 1, 3, 6], dtype=mx.uint32)
    check_gather(mx.random.normal((2, 5, 1, K)), w_q, scales, rhs, sorted_indices=True)


def test_gather_rows_per_pair():
    E, N, K = 4, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    rhs = mx.array([3, 1, 0, 4], dtype=mx.uint32)
    check_gather(mx.random.normal((4, 3, K)), w_q, scales, rhs)


def test_gather_nvfp4_scale_per_expert():
    """Each expert's own tensor scale, from 1 to 40: a wrong expert's scale is off
    by at least 2x."""
    E, N, K = 4, 64, 128
    w = mx.random.normal((E, N, K)) * mx.array([1.0, 5.0, 13.0, 40.0]).reshape(E, 1, 1)
    expert_scales = mx.max(mx.abs(w), axis=(1, 2)).astype(mx.float32)
    parts = [
        mlx_fpqmm.quantize(w[e], mode="nvfp4", global_scale=expert_scales[e]) for e in range(E)
    ]
    w_q, scales = mx.stack([p[0] for p in parts]), mx.stack([p[1] for p in parts])
    rhs = mx.array([0, 1, 1, 2, 3, 3, 3], dtype=mx.uint32)
    x = mx.random.normal((rhs.size, 1, K))
    check_gather(x, w_q, scales, rhs, "nvfp4", global_scale=expert_scales, sorted_indices=True)


def test_gather_with_lhs_indices_keeps_the_primitive():
    E, N, K = 3, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((4, 1, K))
    with dequantize_on_cpu():
        y = gather(
            x,
            w_q,
            scales,
            lhs_indices=mx.array([0, 1, 2, 3]),
            rhs_indices=mx.array([0, 1, 2, 0]),
        )
    assert "FpGatherQuantizedMatmul" in graph_nodes(y)


def test_kernel_path_inside_the_block_describes_the_primitive():
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((64, 128)), mode="mxfp4")
    with dequantize_on_cpu():
        plan = mlx_fpqmm.kernel_path(mx.zeros((2000, 128)), w_q, scales, device="sm_90")
        y = product("mxfp4", mx.zeros((2, 128)), w_q, scales)
    assert plan["path"] == "dequantize_matmul"
    assert "FpDequantize" in graph_nodes(y)


@pytest.mark.parametrize("sorted_indices", [True, False], ids=["sorted", "unsorted"])
def test_gather_gradient_with_respect_to_x(sorted_indices):
    """Fine-tuning through the graph: d/dx as through the primitive's vjp."""
    E, N, K = 4, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    rhs = mx.array([0, 0, 1, 3, 3, 2] if sorted_indices else [3, 0, 1, 0, 2, 3])
    x = mx.random.normal((6, 1, K))
    cotangent = mx.random.normal((6, 1, N))

    def loss(x):
        y = gather(x, w_q, scales, rhs_indices=rhs, sorted_indices=sorted_indices)
        return mx.sum(y * cotangent)

    expected = mx.grad(loss)(x)
    with dequantize_on_cpu():
        y = gather(x, w_q, scales, rhs_indices=rhs, sorted_indices=sorted_indices)
        got = mx.grad(loss)(x)
    assert "GatherMM" in graph_nodes(y)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5, atol=1e-5)


def test_mlx_lm_moe_prefill_through_the_graph():
    """A Qwen3-MoE prompt of 48 tokens (mlx-lm sorts its 96 pairs): the graph's
    logits as the primitive's."""
    qwen3_moe = pytest.importorskip("mlx_lm.models.qwen3_moe")
    args = qwen3_moe.ModelArgs(
        model_type="qwen3_moe", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=256,
        head_dim=32, rope_theta=10000.0, tie_word_embeddings=False,
        max_position_embeddings=512, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=64,
        norm_topk_prob=True,
    )  # fmt: skip
    model = qwen3_moe.Model(args)
    mlx_fpqmm.nn.quantize(
        model,
        mode="mxfp4",
        class_predicate=lambda path, m: hasattr(m, "to_quantized") and not path.endswith(".gate"),
    )
    mx.eval(model.parameters())
    prompt = mx.array(np.random.default_rng(0).integers(0, 256, (1, 48)))
    expected = model(prompt)
    with dequantize_on_cpu():
        logits = model(prompt)
    assert "GatherMM" in graph_nodes(logits)
    scale = float(mx.abs(expected).max())
    assert float(mx.abs(logits - expected).max()) < 1e-5 * scale
