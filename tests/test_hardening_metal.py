"""The Metal plan's index arithmetic for buffers beyond 2^31 elements.

Planning only reads shapes, so these arrays are never materialised. A
simulator dispatch over buffers this large would need several GB of shared
memory and minutes of simulated threads, so the kernels' 64-bit offset
arithmetic is checked through the batch strides the plan hands them.
"""

import mlx.core as mx

import mlx_fpqmm


def test_batch_strides_beyond_2_to_the_31_are_64_bit():
    N, K, batch = 2**16 + 32, 2**15, 9
    w = mx.zeros((batch, N, K // 8), dtype=mx.uint32)
    scales = mx.zeros((batch, N, K // 32), dtype=mx.uint8)
    x = mx.zeros((batch, 1, K), dtype=mx.float16)
    for kernel in ("qmv", "mma"):
        plan = mlx_fpqmm.kernel_path(x, w, scales, device="applegpu_g16s", kernel=kernel)
        strides = {
            value[1][0]
            for value in plan["buffers"].values()
            if isinstance(value, tuple) and value[0] == "int64[]"
        }
        # w's stride in words, scales' in bytes, x's in elements: exact, and
        # the last batch element of w starts past 2^31 words.
        assert strides == {N * K // 8, N * K // 32, K}
        assert (batch - 1) * (N * K // 8) > 2**31
        assert plan["grid"][2] == batch


def test_kernel_path_rejects_unknown_devices_and_versions():
    import pytest

    w, scales = mlx_fpqmm.quantize(mx.zeros((16, 64)), mode="mxfp4")
    x = mx.zeros((2, 64))
    with pytest.raises(
        ValueError, match="device='nonsense' is not a GPU name; expected 'cuda', a compute cap"
    ):
        mlx_fpqmm.kernel_path(x, w, scales, device="nonsense")
    with pytest.raises(ValueError, match="macOS version 'abc'"):
        mlx_fpqmm.kernel_path(x, w, scales, device="applegpu_g16s", macos="abc")
    with pytest.raises(ValueError, match="kernel='fast'"):
        mlx_fpqmm.kernel_path(x, w, scales, device="applegpu_g16s", kernel="fast")


def test_plan_of_an_empty_reduction():
    """K = 0 (x is (M, 0)): the plan must not divide by K."""
    w = mx.zeros((8, 0), dtype=mx.uint32)
    scales = mx.zeros((8, 0), dtype=mx.uint8)
    plan = mlx_fpqmm.kernel_path(mx.ones((4, 0)), w, scales, device="applegpu_g16s")
    assert plan["output_shape"] == (4, 8)
