"""Fast fp4 (E2M1) and fp8 (E4M3) quantized matrix multiplication for MLX."""

import atexit

from . import _version_check  # noqa: F401  (first: an MLX mismatch stops the import here)
from ._ext import (
    _wait_for_cpu_tasks,
    dequantize,
    formats,
    fp4_qmm,
    fp8_qmm,
    gather_qmm,
    kernel_path,
    quantize,
    quantized_matmul,
)
from ._formats import FORMATS, qmm_for_mode
from ._lm import load  # imports mlx-lm on first call only
from .nn import convert  # also binds the mlx_fpqmm.nn submodule

# MLX never joins its stream threads: exit waits for our queued CPU products
# (while they progress) before the interpreter and the libraries tear down.
atexit.register(_wait_for_cpu_tasks, 30_000)

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
