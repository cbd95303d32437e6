"""Property tests: random shapes, modes, dtypes, transposes, batches and strides
against the MLX reference. `pytest --hypothesis-profile=long` runs thousands."""

import mlx.core as mx
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from reference import ALL_MODES, TOLERANCE, qmm_reference, relative_error

import mlx_fpqmm

GROUP_SIZES = {
    "mxfp4": [32],
    "nvfp4": [16],
    "mxfp8": [32],
    "fp4": [16, 32, 64, 128],
    "fp8": [16, 32, 64, 128],
}
DTYPES = [mx.float32, mx.float16, mx.bfloat16]


@st.composite
def problems(draw):
    mode = draw(st.sampled_from(ALL_MODES))
    group_size = draw(st.sampled_from(GROUP_SIZES[mode]))
    transpose = draw(st.booleans())
    M = draw(st.integers(0, 40))
    free = draw(st.integers(1, 70))
    if mode == "nvfp4":
        free *= 2  # MLX's CPU quantize needs w.size to be a multiple of 32
    quantized = group_size * draw(st.integers(1, 3))
    N, K = (free, quantized) if transpose else (quantized, free)
    batch = draw(st.sampled_from([(), (2,), (3, 1)]))
    w_batch = draw(st.sampled_from([(), (1,), (2,)] if batch else [(), (2,)]))
    dtype = draw(st.sampled_from(DTYPES))
    scale_dtype = draw(st.sampled_from(DTYPES))
    strided_x = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return mode, group_size, transpose, M, N, K, batch, w_batch, dtype, scale_dtype, strided_x, seed


@given(problems())
def test_random_problems_match_reference(problem):
    (mode, group_size, transpose, M, N, K, batch, w_batch, dtype, scale_dtype, strided_x, seed) = (
        problem
    )
    mx.random.seed(seed)
    rows, cols = (N, K) if transpose else (K, N)
    w = mx.random.normal(w_batch + (rows, cols)).astype(scale_dtype)
    if mode in ("mxfp4", "nvfp4", "mxfp8") and not w_batch:
        w = w.astype(mx.float32)
    w_q, scales = mlx_fpqmm.quantize(w, group_size, mode=mode)
    x_shape = batch + (M, K)
    if strided_x:
        x = mx.random.normal(x_shape[:-1] + (2 * K,)).astype(dtype)[..., ::2]
    else:
        x = mx.random.normal(x_shape).astype(dtype)
    op = mlx_fpqmm.qmm_for_mode(mode)
    y = op(x, w_q, scales, transpose=transpose, group_size=group_size, mode=mode)
    expected_batch = np.broadcast_shapes(batch, w_batch) if w_batch else batch
    assert y.shape == expected_batch + (M, N) and y.dtype == dtype
    if M == 0:
        return
    xb = mx.broadcast_to(x, expected_batch + (M, K)) if w_batch else x
    reference = qmm_reference(xb, w_q, scales, mode, transpose, group_size)
    assert relative_error(y, reference) < TOLERANCE[dtype]
