"""What every mlx_fpqmm layer does the same way: set up a mode, quantize, multiply, wrap.

MLX's layer constructors only know MLX's modes, so each layer starts with :func:`setup`,
quantizes with :func:`quantize_weight` (the one place a tensor scale is chosen), multiplies
with :func:`matmul`, and :func:`wrap` turns one of MLX's (or mlx-lm's) layers into ours,
sharing its arrays.
"""

from __future__ import annotations

from typing import TypeVar

import mlx.core as mx
import mlx.nn as nn

from ._ext import quantize as _quantize
from ._formats import qmm_for_mode, resolve_mode

__all__ = ["matmul", "quantize", "quantize_weight", "setup", "wrap"]

_Layer = TypeVar("_Layer", bound=nn.Module)


def setup(layer: nn.Module, mode: str, group_size: int | None, bits: int | None) -> None:
    """Start ``layer`` as an empty module in ``mode`` (its ``group_size``, ``bits``, ``mode``)."""
    nn.Module.__init__(layer)
    layer.group_size, layer.bits = resolve_mode(mode, group_size, bits)
    layer.mode = mode


def draw_as_constructed() -> None:
    """Take one key from MLX's global random sequence, as a layer's constructor does.

    mlx-lm quantizes a float layer by constructing the quantized one, whose random
    placeholder weight takes a key; a layer quantized here without its constructor takes
    the same key, so that loading a model leaves the random sequence where ``mlx_lm.load``
    leaves it (a seeded generation then samples as mlx-lm's does).
    """
    mx.random.uniform(shape=())  # never evaluated


def quantize(
    weight: mx.array, group_size: int, mode: str, global_scale: mx.array | None
) -> tuple[mx.array, mx.array]:
    """``weight`` quantized along its last axis: ``(weight, scales)``.

    ``global_scale`` is ``None``, a 0-d tensor scale, or one tensor scale per matrix of a
    stacked weight (shape ``weight.shape[:1]``, e.g. one per expert).
    """
    if global_scale is None or global_scale.ndim == 0:
        return _quantize(weight, group_size, mode=mode, global_scale=global_scale)
    # The op takes one tensor scale: quantize the matrices one by one.
    pairs = [quantize(weight[i], group_size, mode, global_scale[i]) for i in range(len(weight))]
    return mx.stack([w for w, _ in pairs]), mx.stack([s for _, s in pairs])


def quantize_weight(
    layer: nn.Module,
    weight: mx.array,
    global_scale: bool | mx.array,
    *,
    per_matrix: bool = False,
) -> None:
    """Quantize the float ``weight`` into ``layer.weight`` and ``layer.scales``.

    Args:
        layer (mlx.nn.Module): A layer set up by :func:`setup` (its mode and group size).
        weight (array): The float weight, quantized along its last axis.
        global_scale (bool or array): ``False``: no tensor scale. ``True``: the float32
            ``max|weight|``, of the whole weight or, with ``per_matrix``, of each matrix of
            a stacked weight. An array: that tensor scale. A tensor scale is kept as the
            ``global_scale`` parameter.
        per_matrix (bool): With ``global_scale=True``, one scale per matrix.
    """
    if global_scale is True:
        axes = (-2, -1) if per_matrix else None
        global_scale = mx.max(mx.abs(weight), axis=axes).astype(mx.float32)
    elif global_scale is False:
        global_scale = None
    layer.weight, layer.scales = quantize(weight, layer.group_size, layer.mode, global_scale)
    layer.biases = None  # MLX's fp-mode layers carry this attribute too
    if global_scale is not None:
        layer.global_scale = global_scale


def tensor_scale(layer: nn.Module) -> mx.array | None:
    """The layer's ``global_scale`` as the ops take it (float32), or ``None``.

    ``Module.set_dtype`` casts it with the other float parameters; the ops multiply in float32.
    """
    global_scale = layer.get("global_scale")
    if global_scale is None or global_scale.dtype == mx.float32:
        return global_scale
    return global_scale.astype(mx.float32)


def matmul(layer: nn.Module, x: mx.array, transpose: bool = True) -> mx.array:
    """``x @ dequantize(layer.weight).T`` (``transpose=False``: without the ``.T``)."""
    mode = layer.mode
    op = qmm_for_mode(mode)
    args = (x, layer["weight"], layer["scales"], transpose, layer.group_size, mode)
    global_scale = tensor_scale(layer)
    # fp8_qmm takes no global_scale (only nvfp4 has one).
    return op(*args) if global_scale is None else op(*args, global_scale=global_scale)


def wrap(cls: type[_Layer], source: nn.Module) -> _Layer:
    """An instance of ``cls`` sharing ``source``'s arrays, frozen state and training mode."""
    layer = cls.__new__(cls)
    setup(layer, source.mode, source.group_size, source.bits)
    layer.biases = None
    for key, value in source.items():
        if isinstance(value, mx.array):
            layer[key] = value
    layer.freeze()
    layer.unfreeze(keys=list(source.trainable_parameters()))
    layer.train(source.training)
    return layer
