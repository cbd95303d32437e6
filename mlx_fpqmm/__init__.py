"""Fast fp4 (E2M1) and fp8 (E4M3) quantized matrix multiplication for MLX."""

from collections.abc import Callable

import mlx.core as mx  # loads libmlx and registers its types before _ext

from ._build_info import MLX_VERSION as _BUILT_WITH_MLX

if mx.__version__ != _BUILT_WITH_MLX:
    raise ImportError(
        f"mlx_fpqmm was built against mlx {_BUILT_WITH_MLX} but mlx "
        f"{mx.__version__} is installed; reinstall one of them so they match, "
        f"e.g. `pip install 'mlx=={_BUILT_WITH_MLX}'` or rebuild mlx_fpqmm with "
        "`pip install --force-reinstall --no-cache-dir mlx-fpqmm`."
    )

from ._ext import (  # noqa: E402
    dequantize,
    formats,
    fp4_qmm,
    fp8_qmm,
    gather_qmm,
    kernel_path,
    quantize,
    quantized_matmul,
)

FORMATS: dict[str, dict] = {entry["mode"]: entry for entry in formats()}
"""The format table, keyed by mode (codes, bits, group sizes, scale kind, the
largest code value and whether scaled codes are exact in bfloat16)."""


def qmm_for_mode(mode: str) -> Callable[..., mx.array]:
    """The op for ``mode``'s codes: :func:`fp4_qmm` (E2M1) or :func:`fp8_qmm` (E4M3)."""
    fmt = FORMATS.get(mode)
    if fmt is None:
        raise ValueError(f"Invalid mode '{mode}'; expected one of: {', '.join(FORMATS)}.")
    return fp4_qmm if fmt["codes"] == "e2m1" else fp8_qmm


from ._lm import load  # noqa: E402  (imports mlx-lm on first call only)
from .nn import convert  # noqa: E402  (also binds the mlx_fpqmm.nn submodule)

__all__ = [
    "FORMATS",
    "convert",
    "dequantize",
    "fp4_qmm",
    "fp8_qmm",
    "formats",
    "gather_qmm",
    "kernel_path",
    "load",
    "nn",
    "qmm_for_mode",
    "quantize",
    "quantized_matmul",
]
