"""Tensor-parallel layers and sharding helpers on mlx_fpqmm's ops (MLX distributed).

:class:`QuantizedAllToShardedLinear` and :class:`QuantizedShardedToAllLinear` subclass MLX's
layers of the same names, communicate where MLX's do (``sum_gradients`` on the input of an
all-to-sharded layer, ``all_sum`` on the output of a sharded-to-all layer), and multiply with
:func:`mlx_fpqmm.fp4_qmm` / :func:`mlx_fpqmm.fp8_qmm` in all five modes. A layer's
``global_scale`` (a 0-d tensor scale, or the (E,) per-expert scales of
``QuantizedSwitchLinear``) is replicated on every rank, never split.

Re-exported from :mod:`mlx_fpqmm.nn`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from fractions import Fraction

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers import distributed as _mlx_dist

from ._formats import FORMATS
from ._layers import matmul, quantize_weight, setup, wrap
from ._linear import QuantizedLinear

__all__ = [
    "QuantizedAllToShardedLinear",
    "QuantizedShardedToAllLinear",
    "shard_inplace",
    "shard_linear",
    "sharding",
]

# MLX's functions, kept before sharding() can patch them.
_MLX_SHARD_LINEAR = _mlx_dist.shard_linear
_MLX_SHARD_INPLACE = _mlx_dist.shard_inplace

Sharding = str | Callable[[str, mx.array], int | tuple | None]


def _predicate(
    sharding: str, segments: int | list
) -> Callable[[str, mx.array], int | tuple | None]:
    """MLX's predicates for ``"all-to-sharded"`` / ``"sharded-to-all"``."""
    if sharding not in ("all-to-sharded", "sharded-to-all"):
        raise ValueError(
            f"Sharding type sharding={sharding!r} not supported, "
            "choose one of 'all-to-sharded' or 'sharded-to-all'"
        )
    if sharding == "all-to-sharded":

        def all_to_sharded(path: str, weight: mx.array):
            if path.endswith("bias"):
                return -1, segments
            return max(weight.ndim - 2, 0), segments

        return all_to_sharded

    def sharded_to_all(path: str, weight: mx.array):
        if path.endswith("bias"):
            return None
        return -1, segments

    return sharded_to_all


def _keep_global_scales(sharding: Sharding, segments: int | list) -> Callable:
    """``sharding`` as a predicate that never splits a ``global_scale``.

    With a string sharding every ``global_scale`` is replicated; a callable decides for
    itself, except that a 0-d array (which cannot be split) is always replicated.
    """
    if isinstance(sharding, str):
        inner = _predicate(sharding, segments)

        def predicate(path: str, weight: mx.array):
            if path == "global_scale" or path.endswith(".global_scale"):
                return None
            return inner(path, weight)

        return predicate

    def guarded(path: str, weight: mx.array):
        return None if weight.ndim == 0 else sharding(path, weight)

    return guarded


def _check_divisible(layer: nn.Module, axis_dims: int, what: str, segments: int | list = 1) -> None:
    """Refuse a split that MLX's sharding would fail on: each of the ``segments`` in
    ``n`` equal parts, along the input whole groups of codes (its scales are split too)."""
    n = layer.group.size()
    unit = n * (layer.group_size if what == "input" else 1)
    if isinstance(segments, int):
        sizes = [Fraction(axis_dims, segments)] * segments
    elif all(isinstance(s, float) for s in segments):  # fractions of the axis, as MLX's
        bounds = [0, *(int(s * axis_dims) for s in segments), axis_dims]
        sizes = [end - start for start, end in itertools.pairwise(bounds)]
    else:  # split indices: MLX applies them to each packed array as it is
        return
    if any(size % unit for size in sizes):
        in_segments = f" in {len(sizes)} segments" if len(sizes) > 1 else ""
        need = f"multiples of {unit}" + (
            f" ({n} devices x group size {layer.group_size})" if what == "input" else ""
        )
        raise ValueError(
            f"Cannot shard the {what} of size {axis_dims}{in_segments} across {n} devices: "
            f"the parts to split must be {need}."
        )


class _ShardedMixin:
    """Construction shared by the two layers (MLX's constructors only know MLX's modes)."""

    _sharding: str

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        group: mx.distributed.Group | None = None,
        *,
        global_scale: bool = False,
    ) -> None:
        setup(self, mode, group_size, bits)
        self.group = group or mx.distributed.init()
        n = self.group.size()
        if self._sharding == "all-to-sharded":
            _check_divisible(self, output_dims, "output")
            shape = (output_dims // n, input_dims)
            bias_dims = output_dims // n
        else:
            _check_divisible(self, input_dims, "input")
            shape = (output_dims, input_dims // n)
            bias_dims = output_dims
        scale = math.sqrt(1 / input_dims)
        weight = mx.random.uniform(low=-scale, high=scale, shape=shape)
        # The uniform's bound is >= max|w| and the same on every rank: a replicated tensor scale.
        tensor_scale = mx.array(scale, dtype=mx.float32) if global_scale else False
        quantize_weight(self, weight, tensor_scale)
        if bias:
            self.bias = mx.zeros((bias_dims,))
        self.freeze()

    @classmethod
    def from_quantized_linear(
        cls,
        quantized_linear_layer: nn.Module,
        *,
        segments: int | list = 1,
        group: mx.distributed.Group | None = None,
    ):
        """Shard an fp-mode quantized linear layer (mlx_fpqmm's or MLX's) without re-quantizing.

        The packed ``weight``, ``scales`` and ``bias`` are split as MLX splits them (with
        ``segments`` for fused layers, e.g. 3 for a fused QKV projection); a
        ``global_scale`` is replicated.
        """
        source = quantized_linear_layer
        mode = getattr(source, "mode", "affine")
        if mode not in FORMATS:
            raise ValueError(
                f"mlx_fpqmm's sharded layers need an fp mode ({', '.join(FORMATS)}) but the "
                f"layer's mode is '{mode}'; use mlx.nn.shard_linear for it."
            )
        layer = wrap(cls, source)
        layer.group = group or mx.distributed.init()
        out_dims, packed = source["weight"].shape
        in_dims = packed * 32 // layer.bits
        if cls._sharding == "all-to-sharded":
            _check_divisible(layer, out_dims, "output", segments)
        else:
            _check_divisible(layer, in_dims, "input", segments)
        _MLX_SHARD_INPLACE(layer, _keep_global_scales(cls._sharding, segments), group=layer.group)
        layer.freeze()  # as MLX's sharded layers: every parameter
        return layer

    @classmethod
    def from_quantized(cls, layer: nn.Module):
        """Wrap one of MLX's sharded layers in an fp mode, sharing its arrays (no copy)."""
        ours = wrap(cls, layer)  # keeps its frozen state and training mode
        ours.group = layer.group
        return ours


class QuantizedAllToShardedLinear(_ShardedMixin, nn.QuantizedAllToShardedLinear):
    """MLX's :class:`mlx.nn.QuantizedAllToShardedLinear` on mlx_fpqmm's ops.

    Each rank holds a slice of the output rows and returns its slice of the output; the
    gradient of the input is summed over the group (MLX's ``sum_gradients``). Modes
    ``mxfp4``, ``nvfp4`` (optionally with a replicated ``global_scale``), ``mxfp8``,
    ``fp4`` and ``fp8``. Build one from a :class:`mlx_fpqmm.nn.QuantizedLinear` with
    :meth:`from_quantized_linear` or :func:`mlx_fpqmm.nn.shard_linear`.

    Args:
        input_dims (int): The dimensionality of the input features.
        output_dims (int): The (unsharded) dimensionality of the output features.
        bias (bool, optional): Use a bias. Default: ``True``.
        group_size (Optional[int]): The group size. Default: ``None`` (the mode's).
        bits (Optional[int]): The bit width, implied by ``mode``. Default: ``None``.
        mode (str): The mode. Default: ``"mxfp4"``.
        group (Optional[mx.distributed.Group]): The group. Default: the global group.
        global_scale (bool): ``nvfp4`` only: a tensor scale. Default: ``False``.
    """

    _sharding = "all-to-sharded"

    def __call__(self, x: mx.array) -> mx.array:
        x = _mlx_dist.sum_gradients(self.group)(x)
        x = matmul(self, x)
        if "bias" in self:
            x = x + self["bias"]
        return x


class QuantizedShardedToAllLinear(_ShardedMixin, nn.QuantizedShardedToAllLinear):
    """MLX's :class:`mlx.nn.QuantizedShardedToAllLinear` on mlx_fpqmm's ops.

    Each rank holds a slice of the input columns, multiplies its slice of the input and the
    partial results are summed over the group (``all_sum``) before the bias is added, so
    every rank returns the full output. Modes and arguments as for
    :class:`QuantizedAllToShardedLinear` (``input_dims`` is the unsharded input size).
    """

    _sharding = "sharded-to-all"

    def __call__(self, x: mx.array) -> mx.array:
        x = matmul(self, x)
        x = mx.distributed.all_sum(x, group=self.group)
        if "bias" in self:
            x = x + self["bias"]
        return x


_SHARDED = {
    "all-to-sharded": QuantizedAllToShardedLinear,
    "sharded-to-all": QuantizedShardedToAllLinear,
}


def shard_linear(
    module: nn.Module,
    sharding: str,
    *,
    segments: int | list = 1,
    group: mx.distributed.Group | None = None,
) -> nn.Module:
    """:func:`mlx.nn.layers.distributed.shard_linear` that keeps mlx_fpqmm layers on mlx_fpqmm.

    A :class:`mlx_fpqmm.nn.QuantizedLinear` becomes a :class:`QuantizedAllToShardedLinear`
    or :class:`QuantizedShardedToAllLinear` (its ``global_scale`` replicated); any other
    module goes to MLX's ``shard_linear``.

    Args:
        module (mlx.nn.Module): The linear layer to shard.
        sharding (str): ``"all-to-sharded"`` or ``"sharded-to-all"``.
        segments (int or list): The segments of a fused layer (e.g. 3 for QKV). Default: 1.
        group (Optional[mx.distributed.Group]): The group. Default: the global group.
    """
    if isinstance(module, QuantizedLinear):
        _predicate(sharding, segments)  # MLX's error for an unknown sharding
        return _SHARDED[sharding].from_quantized_linear(module, segments=segments, group=group)
    return _MLX_SHARD_LINEAR(module, sharding, segments=segments, group=group)


def shard_inplace(
    module: nn.Module,
    sharding: Sharding,
    *,
    segments: int | list = 1,
    group: mx.distributed.Group | None = None,
) -> None:
    """:func:`mlx.nn.layers.distributed.shard_inplace` that never splits a global scale.

    With ``"all-to-sharded"`` / ``"sharded-to-all"`` every parameter named
    ``global_scale`` is replicated (the 0-d scale of ``QuantizedLinear`` and the per-expert
    (E,) scales of ``QuantizedSwitchLinear``, which MLX would split as if they were
    weights); everything else is split as MLX splits it. A callable ``sharding`` decides
    for itself, except that 0-d arrays are never split.
    """
    _MLX_SHARD_INPLACE(module, _keep_global_scales(sharding, segments), group=group)


@contextlib.contextmanager
def sharding() -> Iterator[None]:
    """Route MLX's ``shard_linear`` / ``shard_inplace`` to mlx_fpqmm's while in the block.

    mlx-lm's model files import them with ``from mlx.nn.layers.distributed import
    shard_linear, shard_inplace``, so ``model.shard(group)`` calls the names bound in its
    model module: the context manager rebinds them in ``mlx.nn.layers.distributed``,
    ``mlx.nn`` and every loaded ``mlx_lm`` module that holds MLX's functions, and restores
    them on exit. (A module first imported inside the block keeps mlx_fpqmm's functions,
    which hand everything that is not an mlx_fpqmm layer to MLX's.)

    Example:
        >>> with mlx_fpqmm.nn.sharding():  # doctest: +SKIP
        ...     model.shard(group)
    """
    replacements = {_MLX_SHARD_LINEAR: shard_linear, _MLX_SHARD_INPLACE: shard_inplace}
    patched = []
    modules = [_mlx_dist, nn] + [
        m
        for name, m in list(sys.modules.items())
        if m is not None and (name == "mlx_lm" or name.startswith("mlx_lm."))
    ]
    for module in modules:
        for name in ("shard_linear", "shard_inplace"):
            current = getattr(module, name, None)
            if current is not None and current in replacements:
                patched.append((module, name, current))
                setattr(module, name, replacements[current])
    try:
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)


MLX_SHARDED = {
    nn.QuantizedAllToShardedLinear: QuantizedAllToShardedLinear,
    nn.QuantizedShardedToAllLinear: QuantizedShardedToAllLinear,
}
"""MLX's sharded quantized layers and ours, for :func:`mlx_fpqmm.convert`."""
