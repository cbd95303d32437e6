"""The NAX kernels (csrc/backend/metal/kernels/nax/, Metal 4 matmul2d on cooperative
tensors) through the simulator, planned for a generation-17 GPU on macOS 26.2 exactly
as eval_gpu plans them."""

import math

import mlx.core as mx
import numpy as np
import pytest
from test_metal_kernels import MODES, NAX_DEVICE, TYPES, check, check_nax, quantized, traffic

import mlx_fpqmm
from mlx_fpqmm.testing import metal_qmm


def test_metal_qmm_runs_the_nax_path():
    w_q, scales = quantized((64, 128), "mxfp8")
    x = np.random.default_rng(0).standard_normal((24, 128), dtype=np.float32)
    y = metal_qmm(x, w_q, scales, mode="mxfp8", device="applegpu_g17s", kernel="nax")
    expected = x @ np.array(mx.dequantize(w_q, scales, mode="mxfp8", dtype=mx.float32)).T
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", TYPES.values(), ids=TYPES.keys())
def test_modes_and_dtypes(mode, dtype):
    # Float-scale modes get scales of x's dtype from a w of that dtype.
    w_q, scales = quantized((72, 128), mode, dtype=dtype)
    x = mx.random.normal((40, 128)).astype(dtype)
    if mode in ("fp4", "fp8") and dtype != mx.bfloat16:
        # NAX would round these weights to bfloat: the plan keeps them on MMA.
        assert check(x, w_q, scales, mode, device=NAX_DEVICE).plan["path"] == "mma"
        with pytest.raises(RuntimeError, match="round these weights to bfloat"):
            check(x, w_q, scales, mode, device=NAX_DEVICE, kernel="nax")
        return
    check_nax(x, w_q, scales, mode)


@pytest.mark.parametrize(
    "M,N,K,block_m,mode",
    [
        (64, 128, 128, 64, "mxfp4"),  # full tiles
        (128, 64, 256, 64, "mxfp4"),  # full tiles, several row blocks
        (5, 64, 64, 32, "mxfp4"),  # M below BM
        (32, 64, 64, 32, "mxfp4"),  # exactly one 32-row tile
        (33, 64, 64, 64, "mxfp4"),  # the first M on 64-row tiles
        (100, 70, 128, 64, "mxfp4"),  # M and N tails
        (17, 33, 192, 32, "mxfp4"),  # M and N tails, N below one simdgroup's columns
        (40, 96, 96, 64, "mxfp4"),  # a K tail of 32
        (40, 96, 80, 64, "nvfp4"),  # a K tail of 16
        (20, 64, 4096 + 48, 32, "nvfp4"),  # long K with a 48-wide tail
    ],
)
def test_shapes(M, N, K, block_m, mode):
    w_q, scales = quantized((N, K), mode)
    x = mx.random.normal((M, K)).astype(mx.float16)
    run = check_nax(x, w_q, scales, mode)
    assert run.plan["block_m"] == block_m
    split = "split_k_" if run.plan["split_k"] > 1 else ""
    assert run.plan["kernel"] == f"fpqmm_nax_t_{split}bm{block_m}_e2m1_float16"


@pytest.mark.parametrize("mode", ["fp4", "fp8"])
@pytest.mark.parametrize("group_size", [16, 64, 128])
def test_group_sizes_and_scale_dtypes(mode, group_size):
    # Groups narrower than, as wide as and wider than a thread's 32 codes and
    # the 64-wide K block (a 128 group spans two blocks).
    scale_dtype = {16: mx.float16, 64: mx.bfloat16, 128: mx.float32}[group_size]
    w_q, scales = quantized((96, 384), mode, group_size, dtype=scale_dtype)
    x = mx.random.normal((40, 384)).astype(mx.bfloat16)
    check_nax(x, w_q, scales, mode, group_size=group_size)


def test_global_scale():
    w = mx.random.normal((64, 96))
    global_scale = mx.abs(w).max()
    w_q, scales = mlx_fpqmm.quantize(w, mode="nvfp4", global_scale=global_scale)
    x = mx.random.normal((40, 96))
    run = check(x, w_q, scales, "nvfp4", global_scale=global_scale, device=NAX_DEVICE)
    assert run.plan["path"] == "mma"  # the global scale makes W inexact in bfloat
    check_nax(x.astype(mx.bfloat16), w_q, scales, "nvfp4", global_scale=global_scale)


def test_batched():
    w_q, scales = quantized((3, 64, 96), "mxfp8")  # one matrix per batch element
    x = mx.random.normal((2, 1, 40, 96)).astype(mx.bfloat16)  # broadcast against w's batch
    run = check_nax(x, w_q, scales, "mxfp8")
    assert run.y.shape == (2, 3, 40, 64) and run.plan["grid"] == (1, 1, 6)


def test_auto_path_picks_nax_from_the_decode_limit():
    w_q, scales = quantized((64, 128), "mxfp4")
    x = mx.random.normal((40, 128)).astype(mx.float16)
    for device, path in [
        ("applegpu_g17s", "nax"),
        ("applegpu_g18p", "nax"),
        ("applegpu_g16s", "mma"),
    ]:
        assert check(x, w_q, scales, "mxfp4", device=device).plan["path"] == path
    run = check(x[:20], w_q, scales, "mxfp4", device="applegpu_g17s")
    assert run.plan["path"] == "qmv"  # below generation 17's decode limit, 33


def test_float32_needs_tf32(monkeypatch):
    w_q, scales = quantized((64, 128), "mxfp4")
    x = mx.random.normal((40, 128))
    monkeypatch.setenv("MLX_ENABLE_TF32", "0")
    assert check(x, w_q, scales, "mxfp4", device="applegpu_g17s").plan["path"] == "mma"
    check_nax(x.astype(mx.float16), w_q, scales, "mxfp4")
    monkeypatch.setenv("MLX_ENABLE_TF32", "1")
    check_nax(x, w_q, scales, "mxfp4")


@pytest.mark.parametrize("M,N,block_m", [(20, 96, 32), (100, 160, 64)])
@pytest.mark.parametrize("K,splits", [(256, 2), (128, 1)])
def test_traffic_follows_the_tiling(M, N, block_m, K, splits):
    """As the MMA tiles (tests/test_metal_kernels.py): split K or not, W and x
    move once per tile, the partial sums once each way."""
    w_q, scales = quantized((N, K), "mxfp4")
    x = mx.random.normal((M, K)).astype(mx.float16)
    run = check_nax(x, w_q, scales, "mxfp4")
    assert run.plan["block_m"] == block_m and run.plan["split_k"] == splits
    if splits > 1:
        partials = traffic(run, "partials")
        assert partials["bytes_written"] == partials["unique_bytes_written"] == splits * M * N * 4
        assert partials["bytes_read"] == splits * M * N * 4
    m_tiles, n_tiles = math.ceil(M / block_m), math.ceil(N / 64)
    assert traffic(run, "w")["bytes_read"] == w_q.nbytes * m_tiles
    assert traffic(run, "scales")["bytes_read"] == scales.nbytes * m_tiles
    assert traffic(run, "x")["bytes_read"] == x.nbytes * n_tiles
    assert traffic(run, "y")["bytes_written"] == M * N * x.itemsize
    # (16, 32, 16) steps: one per (16-row, 32-column, 16-deep) block of valid output.
    assert run.counters["matmul2d_runs"] == math.ceil(M / 16) * math.ceil(N / 32) * (K // 16)
    assert run.counters["simdgroup_matrix_ops"] == 0
