"""The benchmark's ggml baseline computes the same product as ours.

ggml quantizes the activations to q8_0 (int8 with a float16 scale per 32), so
its result is compared with a float64 product of ggml's own dequantized
weights, within the error that rounding x to q8_0 can cause in each output.
Runs only where ggml-python is installed (the ``ggml`` extra of tools/fpqmm_dev).
"""

import numpy as np
import pytest
from fpqmm_dev import ggml_glue as _ggml

try:
    _ggml.load()
except _ggml.GgmlUnavailable as error:
    pytest.skip(str(error), allow_module_level=True)

BLOCK = _ggml.ACTIVATION_BLOCK


def q8_error_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Largest |y - x @ w.T| that q8_0 activations can cause, per output (M x N).

    Each x in a block of 32 moves by at most half a step, d / 2 with
    d = max|x| / 127, plus 127 steps' worth of the float16 rounding of d
    (relative 2^-11); float32 accumulation adds a little on top.
    """
    M, K = x.shape
    steps = np.abs(x.reshape(M, K // BLOCK, BLOCK)).max(axis=2) / 127
    per_element = np.repeat(steps * (0.5 + 127 * 2.0**-11), BLOCK, axis=1)
    return per_element @ np.abs(w).T + 1e-5 * (np.abs(x) @ np.abs(w).T)


@pytest.mark.parametrize(("mode", "repack"), [("mxfp4", False), ("mxfp4", True), ("nvfp4", False)])
@pytest.mark.parametrize("M", [1, 5])
def test_ggml_product_matches_float_reference(mode, repack, M):
    rng = np.random.default_rng(1)
    N, K = 40, 256
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    # Outliers so that the per-block scales (of x and of w) differ.
    w[3, 70] = 40.0
    x[:, 200] *= 30.0
    try:
        matmul = _ggml.GgmlMatmul(w, mode, rows=M, threads=2, repack=repack, copies=2)
    except _ggml.GgmlUnavailable as error:
        pytest.skip(str(error))
    with matmul:
        w_deq = _ggml.dequantize(matmul.quantized, mode).astype(np.float64)
        # ggml's own quantizer really quantized: codes differ from the floats.
        assert 0 < np.abs(w_deq - w).max() < 0.5 * np.abs(w).max()
        matmul.set_x(x)
        reference = x.astype(np.float64) @ w_deq.T
        bound = q8_error_bound(x.astype(np.float64), w_deq)
        for copy in range(2):
            matmul.run(copy)
            y = matmul.output(copy)
            assert y.shape == (M, N)
            np.testing.assert_array_less(np.abs(y - reference), bound)
        # The bound is tight enough to tell: activations rounded to 4 bits fail it.
        coarse = np.round(x * 7 / np.abs(x).max()) * np.abs(x).max() / 7
        assert (np.abs(coarse @ w_deq.T - reference) > bound).any()


def test_ggml_rejects_what_it_lacks():
    w = np.ones((8, 64), dtype=np.float32)
    with pytest.raises(_ggml.GgmlUnavailable, match="no type for mode 'mxfp8'"):
        _ggml.GgmlMatmul(w, "mxfp8", rows=1, threads=1)
    with pytest.raises(_ggml.GgmlUnavailable, match="K divisible by 64"):
        _ggml.quantize(np.ones((8, 96), dtype=np.float32), "nvfp4")
    # ggml's repacking has no nvfp4 layout in this version: it says so.
    with pytest.raises(_ggml.GgmlUnavailable, match="repacked"):
        _ggml.GgmlMatmul(w, "nvfp4", rows=1, threads=1, repack=True)
    with _ggml.GgmlMatmul(w, "mxfp4", rows=2, threads=1) as matmul:
        with pytest.raises(ValueError, match=r"x: expected shape \(2, 64\)"):
            matmul.set_x(np.ones((1, 64), dtype=np.float32))
