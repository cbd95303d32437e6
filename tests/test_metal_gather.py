"""gather_qmm on the Metal kernels (through the simulator), planned as on the GPU."""

import mlx.core as mx
import numpy as np
import pytest
from reference import TOLERANCE, gather_reference, quantized_experts, relative_error

import mlx_fpqmm
from mlx_fpqmm.testing import metal_gather_qmm, run_metal


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8", "fp4", "fp8"])
@pytest.mark.parametrize("tokens", [1, 40])
def test_router_shaped_calls(mode, tokens):
    """mlx-lm's call: x (tokens, 1, 1, K), rhs_indices (tokens, top_k)."""
    E, N, K = 4, 48, 128
    w_q, scales, global_scale = quantized_experts(mode, E, N, K, global_scale=mode == "nvfp4")
    x = mx.random.normal((tokens, 1, 1, K)).astype(mx.float16)
    rhs = mx.array(np.random.default_rng(tokens).integers(0, E, (tokens, 2)))
    y = metal_gather_qmm(x, w_q, scales, rhs_indices=rhs, mode=mode, global_scale=global_scale)
    assert y.shape == (tokens, 2, 1, N)
    lhs = np.arange(tokens).reshape(tokens, 1)
    reference = gather_reference(x, w_q, scales, lhs, rhs, mode, global_scale=global_scale)
    assert relative_error(mx.array(y), reference) < TOLERANCE[mx.float16]
    cpu = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=rhs, mode=mode, global_scale=global_scale
    )
    assert relative_error(cpu, reference) < TOLERANCE[mx.float16]


def test_many_rows_per_pair_take_the_mma_kernel():
    E, N, K = 3, 64, 96
    w_q, scales, _ = quantized_experts("mxfp8", E, N, K)
    x = mx.random.normal((2, 50, K))
    lhs, rhs = mx.array([0, 1, 1]), mx.array([2, 2, 0])
    run = run_metal(x, w_q, scales, mode="mxfp8", lhs_indices=lhs, rhs_indices=rhs)
    assert run.plan["kernel"] == "fpqmm_gather_mma_t_bm64_e4m3_float32"
    assert run.plan["grid"][2] == 3  # one z per pair
    reference = gather_reference(x, w_q, scales, lhs, rhs, "mxfp8")
    assert relative_error(mx.array(run.y), reference) < 1e-5
    # Each pair's tile reads its expert's weights once: 3 pairs, ceil(50 / 64) row blocks.
    assert run.counters["buffers"][0]["bytes_read"] == 3 * w_q[0].nbytes


def test_out_of_range_indices_give_nan_rows():
    E, N, K = 3, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((4, 1, K))
    y = metal_gather_qmm(x, w_q, scales, rhs_indices=mx.array([0, 3, 2, 7]), mode="mxfp4")
    assert np.isnan(y).all(axis=(1, 2)).tolist() == [False, True, False, True]


def test_kernel_path_names_the_gather_kernel():
    w_q, scales, _ = quantized_experts("mxfp4", 4, 64, 128)
    x = mx.zeros((8, 1, 1, 128))
    rhs = mx.zeros((8, 2), mx.int32)
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, rhs_indices=rhs, device="applegpu_g16s")
    assert plan["kernel"] == "fpqmm_gather_qmv_bm8_e2m1_float32"
    assert plan["grid"][2] == 16
    buffers = plan["buffers"]
    assert buffers[13] == ("operand", "lhs_indices")
    assert buffers[14] == ("operand", "rhs_indices")
    assert buffers[15] == ("int32", 8) and buffers[16] == ("int32", 4)
    plain = mlx_fpqmm.kernel_path(x[0, 0], w_q[0], scales[0], device="applegpu_g16s")
    assert plain["kernel"] == "fpqmm_qmv_bm8_e2m1_float32"


def test_metal_gather_qmm_needs_indices():
    w_q, scales, _ = quantized_experts("mxfp4", 2, 32, 64)
    with pytest.raises(ValueError, match="needs lhs_indices or rhs_indices"):
        metal_gather_qmm(mx.zeros((1, 64)), w_q, scales, mode="mxfp4")


SORTED_RUN_KERNELS = [
    (codes, type_name, transpose)
    for codes in ("e2m1", "e4m3")
    for type_name in ("float32", "float16", "bfloat16")
    for transpose in (True, False)
]


@pytest.mark.parametrize("codes, type_name, transpose", SORTED_RUN_KERNELS)
def test_sorted_runs_kernel(codes, type_name, transpose):
    """mlx-lm's sorted path: one row per pair, experts sorted. Each expert's
    weights are read once per tile of rows routed to it."""
    mode = "fp4" if codes == "e2m1" else "fp8"
    E, pairs = 4, 64
    N, K = (40, 96) if transpose else (64, 37)
    w_q, scales, _ = quantized_experts(mode, E, *((N, K) if transpose else (K, N)))
    dtype = getattr(mx, type_name)
    x = mx.random.normal((pairs, 1, K)).astype(dtype)
    rhs = mx.array(np.repeat(np.arange(E), pairs // E))  # 16 rows per expert
    run = run_metal(
        x, w_q, scales, mode=mode, transpose=transpose, rhs_indices=rhs, sorted_indices=True
    )
    direction = "t" if transpose else "n"
    assert run.plan["kernel"] == f"fpqmm_gather_rhs_mma_{direction}_bm32_{codes}_{type_name}"
    reference = gather_reference(x, w_q, scales, np.arange(pairs), rhs, mode, transpose)
    assert relative_error(mx.array(run.y), reference) < TOLERANCE[dtype]
    # 32-row tiles hold two runs each, and each column block reads its own slice
    # of W: every expert's weights once in all.
    assert run.counters["buffers"][0]["bytes_read"] == E * w_q[0].nbytes


@pytest.mark.parametrize("codes", ["e2m1", "e4m3"])
@pytest.mark.parametrize("type_name", ["float32", "float16", "bfloat16"])
def test_sorted_runs_on_nax(codes, type_name):
    """Where NAX runs (generation 17, macOS 26.2), the sorted runs take its tiles."""
    mode = "nvfp4" if codes == "e2m1" else "mxfp8"  # exact in bfloat: any x
    E, pairs, N, K = 4, 64, 72, 96
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    dtype = getattr(mx, type_name)
    x = mx.random.normal((pairs, 1, K)).astype(dtype)
    rhs = mx.array(np.repeat(np.arange(E), pairs // E))
    run = run_metal(
        x, w_q, scales, mode=mode, rhs_indices=rhs, sorted_indices=True,
        device="applegpu_g17s", macos="26.2",
    )  # fmt: skip
    assert run.plan["kernel"] == f"fpqmm_gather_rhs_nax_t_bm32_{codes}_{type_name}"
    assert run.plan["path"] == "nax" and run.plan["grid"] == (2, 2, 1)
    reference = gather_reference(x, w_q, scales, np.arange(pairs), rhs, mode)
    assert relative_error(mx.array(run.y), reference) < TOLERANCE[dtype]
    # Two runs per 32-row tile, two 64-column blocks: every expert once in all.
    assert run.counters["buffers"][0]["bytes_read"] == E * w_q[0].nbytes


def test_sorted_runs_stay_right_on_unsorted_indices():
    E, pairs, N, K = 4, 40, 32, 64
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((pairs, 1, K))
    rhs = mx.array(np.random.default_rng(3).integers(0, E, pairs))
    rhs_with_bad = mx.concatenate([rhs[:-1], mx.array([E])])  # last expert out of range
    run = run_metal(x, w_q, scales, mode="mxfp4", rhs_indices=rhs_with_bad, sorted_indices=True)
    assert "rhs_mma" in run.plan["kernel"]
    reference = gather_reference(x[:-1], w_q, scales, np.arange(pairs - 1), rhs[:-1], "mxfp4")
    assert relative_error(mx.array(run.y[:-1]), reference) < 1e-5
    assert np.isnan(run.y[-1]).all()


def test_sorted_runs_rule():
    """MLX's rule: one row per pair, >= 16 pairs and >= 4 per expert; else the
    per-pair gather kernels."""
    w_q, scales, _ = quantized_experts("mxfp4", 8, 64, 128)

    def kernel(pairs, rows=1, sorted_indices=True, **kwargs):
        x = mx.zeros((pairs, rows, 128))
        rhs = mx.zeros((pairs,), mx.uint32)
        return mlx_fpqmm.kernel_path(
            x, w_q, scales, rhs_indices=rhs, sorted_indices=sorted_indices,
            device="applegpu_g16s", **kwargs,
        )["kernel"]  # fmt: skip

    assert kernel(32) == "fpqmm_gather_rhs_mma_t_bm32_e2m1_float32"
    assert kernel(31).startswith("fpqmm_gather_qmv")  # fewer than 4 pairs per expert
    assert kernel(32, sorted_indices=False).startswith("fpqmm_gather_qmv")
    assert kernel(32, rows=2).startswith("fpqmm_gather_qmv")
    assert kernel(32, kernel="qmv").startswith("fpqmm_gather_qmv")
