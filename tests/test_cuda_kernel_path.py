"""The CUDA plan as kernel_path shows it for a named compute capability: no GPU
needed. Which rows take the decode kernels, the simple path and dequantize +
matmul, and what forcing a path does."""

import sys

import mlx.core as mx
import pytest

import mlx_fpqmm

pytestmark = pytest.mark.skipif(
    sys.platform == "darwin", reason="on a Mac kernel_path plans for Metal"
)

N, K = 4096, 4096


def path(x_shape, kernel=None, w_batch=(), **kwargs):
    w = mx.zeros((*w_batch, N, K // 8), mx.uint32)
    scales = mx.zeros((*w_batch, N, K // 32), mx.uint8)
    return mlx_fpqmm.kernel_path(
        mx.zeros(x_shape), w, scales, mode="mxfp4", device="sm_90", kernel=kernel, **kwargs
    )


@pytest.mark.parametrize(
    "x_shape, expected",
    [
        ((1, K), "qmv"),
        ((16, K), "qmv"),
        ((17, K), "simple"),
        ((40, K), "simple"),
        ((41, K), "dequantize_matmul"),
        ((4096, K), "dequantize_matmul"),
        # With 2-D weights every leading axis of x counts as rows.
        ((2, 30, K), "dequantize_matmul"),
    ],
)
def test_rows_choose_the_path(x_shape, expected):
    plan = path(x_shape)
    assert plan["path"] == expected, plan["note"]
    if expected == "dequantize_matmul":
        assert plan["kernel"] == "fpqmm_dequantize_e2m1_e8m0_float32"
        # A word of 8 codes per thread over W's 4096 x 4096 codes, up to 16
        # blocks per SM of the H100/H200's 132.
        assert plan["grid"] == (132 * 16, 1, 1)
        assert plan["block"] == (256, 1, 1)


def test_batched_weights_count_rows_per_matrix():
    assert path((2, 30, K), w_batch=(2,))["path"] == "simple"
    assert path((2, 50, K), w_batch=(2,))["path"] == "dequantize_matmul"


def test_requests_force_the_path():
    assert path((4096, K), kernel="simple")["path"] == "simple"
    assert path((1, K), kernel="dequantize")["path"] == "dequantize_matmul"
    assert path((4096, K), kernel="qmv")["path"] == "qmv"
    with pytest.raises(ValueError, match="dequantize"):
        path((1, K), kernel="nax")


def test_gather_never_dequantizes():
    w = mx.zeros((8, N, K // 8), mx.uint32)
    scales = mx.zeros((8, N, K // 32), mx.uint8)
    x = mx.zeros((512, 1, K))
    indices = mx.zeros((512,), mx.uint32)
    plan = mlx_fpqmm.kernel_path(
        x, w, scales, mode="mxfp4", rhs_indices=indices, sorted_indices=True, device="sm_90"
    )
    assert plan["path"] != "dequantize_matmul"
