"""Reference results for the tests, sharing no code with mlx_fpqmm.

MLX's own modes are decoded by ``mx.dequantize``; the float-scale modes by a
decoder built here from MLX ops and ml_dtypes' code tables. Also: the
primitives of a graph, as MLX writes them.
"""

import tempfile
from pathlib import Path

import ml_dtypes
import mlx.core as mx
import numpy as np

MLX_MODES = ("mxfp4", "nvfp4", "mxfp8")
FLOAT_SCALE_MODES = ("fp4", "fp8")
ALL_MODES = MLX_MODES + FLOAT_SCALE_MODES
BITS = {"mxfp4": 4, "nvfp4": 4, "mxfp8": 8, "fp4": 4, "fp8": 8}
DEFAULT_GROUP_SIZE = {"mxfp4": 32, "nvfp4": 16, "mxfp8": 32, "fp4": 32, "fp8": 32}
TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1e-2}

E2M1_TABLE = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
E4M3_TABLE = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def codes_of(w_q: np.ndarray, bits: int) -> np.ndarray:
    """Unpacks uint32 words into codes, least significant first."""
    words = np.asarray(w_q, dtype=np.uint32)
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    codes = (words[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*words.shape[:-1], words.shape[-1] * per_word)


def dequantize_reference(w_q, scales, mode, group_size=None, global_scale=None):
    """The float32 matrix that w_q, scales encode (same orientation as w_q)."""
    group_size = group_size or DEFAULT_GROUP_SIZE[mode]
    if mode in MLX_MODES:
        return np.array(
            mx.dequantize(
                w_q,
                scales,
                group_size=group_size,
                mode=mode,
                global_scale=global_scale,
                dtype=mx.float32,
            )
        )
    codes = codes_of(np.array(w_q), BITS[mode])
    table = E2M1_TABLE if BITS[mode] == 4 else E4M3_TABLE
    values = table[codes]
    scale = np.array(scales.astype(mx.float32))
    values = values.reshape(*scale.shape, group_size) * scale[..., None]
    return values.reshape(codes.shape)


def qmm_reference(x, w_q, scales, mode, transpose=True, group_size=None, global_scale=None):
    """x @ W.T (or x @ W) in float64 from the float32-decoded W."""
    w = dequantize_reference(w_q, scales, mode, group_size, global_scale)
    w = w.astype(np.float64)
    if transpose:
        w = np.swapaxes(w, -1, -2)
    xf = np.array(x.astype(mx.float32)).astype(np.float64)
    return xf @ w, np.abs(xf) @ np.abs(w)


def relative_error(y, reference) -> float:
    """max|y - ref| / max over outputs of sum_k |x_k w_k|."""
    ref, magnitude = reference
    y = np.array(y.astype(mx.float32)).astype(np.float64)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    scale = max(float(magnitude.max(initial=0.0)), 1e-30)
    return float(np.abs(y - ref).max(initial=0.0)) / scale


def gather_reference(
    x, w_q, scales, lhs, rhs, mode, transpose=True, group_size=None, global_scale=None
):
    """Per pair: x[lhs] @ W[rhs].T (or W[rhs]) in float64, and the magnitudes."""
    E = w_q.shape[0]
    w = np.stack(
        [
            dequantize_reference(
                w_q[e],
                scales[e],
                mode,
                group_size,
                None if global_scale is None else global_scale[e],
            )
            for e in range(E)
        ]
    ).astype(np.float64)
    if transpose:
        w = np.swapaxes(w, -1, -2)
    xs = np.array(x.astype(mx.float32)).astype(np.float64)
    xs = xs.reshape(-1, *xs.shape[-2:])
    lhs, rhs = np.broadcast_arrays(np.array(lhs), np.array(rhs))
    ref = np.stack([xs[i] @ w[j] for i, j in zip(lhs.ravel(), rhs.ravel(), strict=True)])
    mag = np.stack(
        [np.abs(xs[i]) @ np.abs(w[j]) for i, j in zip(lhs.ravel(), rhs.ravel(), strict=True)]
    )
    shape = (*lhs.shape, *ref.shape[-2:])
    return ref.reshape(shape), mag.reshape(shape)


def quantized_experts(mode, E, rows, cols, global_scale=False):
    """E quantized (rows, cols) matrices (along cols) by mlx_fpqmm.quantize, with one
    nvfp4 tensor scale per expert when asked: (w_q, scales, global_scale or None)."""
    import mlx_fpqmm

    w = mx.random.normal((E, rows, cols))
    if not global_scale:
        return (*mlx_fpqmm.quantize(w, mode=mode), None)
    scales = mx.max(mx.abs(w), axis=(1, 2)).astype(mx.float32)
    parts = [mlx_fpqmm.quantize(w[e], mode=mode, global_scale=scales[e]) for e in range(E)]
    return mx.stack([p[0] for p in parts]), mx.stack([p[1] for p in parts]), scales


def graph_nodes(y) -> str:
    """The DOT text of y's unevaluated graph (its primitives' names)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "graph.dot"
        mx.export_to_dot(str(path), y)
        return path.read_text()
