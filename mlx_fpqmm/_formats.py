"""The format table and the facts derived from it: which op takes a mode, a mode's defaults.

A leaf module (it imports only the extension), so that every other module of the package can
use it without importing the package's ``__init__``.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from ._ext import formats, fp4_qmm, fp8_qmm

__all__ = ["FORMATS", "MLX_MODES", "qmm_for_mode", "resolve_mode"]

FORMATS: dict[str, dict] = {entry["mode"]: entry for entry in formats()}
"""The format table, keyed by mode (codes, bits, group sizes, scale kind, the
largest code value and whether scaled codes are exact in bfloat16)."""

MLX_MODES = ("mxfp4", "nvfp4", "mxfp8")
"""The modes MLX (and so mlx-lm) knows; the others are mlx_fpqmm's alone."""


_QMM_BY_MODE = {
    mode: fp4_qmm if entry["codes"] == "e2m1" else fp8_qmm for mode, entry in FORMATS.items()
}


def qmm_for_mode(mode: str) -> Callable[..., mx.array]:
    """The op for ``mode``'s codes: :func:`fp4_qmm` (E2M1) or :func:`fp8_qmm` (E4M3)."""
    op = _QMM_BY_MODE.get(mode)
    if op is None:
        raise ValueError(f"Invalid mode '{mode}'; expected one of: {', '.join(FORMATS)}.")
    return op


def resolve_mode(mode: str, group_size: int | None, bits: int | None) -> tuple[int, int]:
    """Return ``(group_size, bits)`` for a layer in ``mode``, filling in the format's defaults."""
    fmt = FORMATS.get(mode)
    if fmt is None:
        raise ValueError(
            f"Invalid quantization mode '{mode}'. Valid modes are: {', '.join(FORMATS)} "
            "(use mlx.nn's layers for 'affine')."
        )
    if bits is not None and bits != fmt["bits"]:
        raise ValueError(f"Mode '{mode}' stores {fmt['bits']}-bit codes but bits={bits} was given.")
    if group_size is not None and group_size not in fmt["group_sizes"]:
        sizes = ", ".join(map(str, fmt["group_sizes"]))
        raise ValueError(
            f"group_size={group_size} is not supported for mode '{mode}'; expected one of: {sizes}."
        )
    return group_size or fmt["default_group_size"], fmt["bits"]
