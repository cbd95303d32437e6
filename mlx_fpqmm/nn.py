"""Drop-in quantized layers for ``mlx.nn`` and mlx-lm models, running on mlx_fpqmm's ops.

:class:`QuantizedLinear` and :class:`QuantizedEmbedding` subclass MLX's own layers (so every
``isinstance`` check in mlx-lm keeps working), keep their parameter names and dtypes, and
compute with :func:`mlx_fpqmm.fp4_qmm` / :func:`mlx_fpqmm.fp8_qmm`. :func:`quantize` is the
model-level twin of :func:`mlx.nn.quantize`; :func:`convert` swaps the layers of a model that
is already quantized (e.g. one loaded by mlx-lm).
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from . import FORMATS, qmm_for_mode
from ._ext import dequantize as _dequantize
from ._ext import quantize as _quantize

__all__ = [
    "ConversionReport",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "convert",
    "quantize",
]

# mlx-lm's switch layers, where mlx-lm is imported (a model holding them implies it is).
_SWITCH_LAYERS = "mlx_lm.models.switch_layers"


def __getattr__(name: str):
    # QuantizedSwitchLinear subclasses mlx-lm's layer: importing it imports mlx-lm (so it
    # is not in __all__, where a star import would need mlx-lm).
    if name == "QuantizedSwitchLinear":
        from ._switch import QuantizedSwitchLinear

        return QuantizedSwitchLinear
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _switch_layer_classes() -> tuple[type, type] | None:
    """mlx-lm's ``(SwitchLinear, QuantizedSwitchLinear)`` if mlx-lm is loaded."""
    module = sys.modules.get(_SWITCH_LAYERS)
    if module is None:
        return None
    return module.SwitchLinear, module.QuantizedSwitchLinear


def _resolve_mode(mode: str, group_size: int | None, bits: int | None) -> tuple[int, int]:
    """Return ``(group_size, bits)`` for ``mode``, filling in the format's defaults."""
    fmt = FORMATS.get(mode)
    if fmt is None:
        raise ValueError(
            f"Invalid quantization mode '{mode}'. Valid modes are: {', '.join(FORMATS)} "
            "(use mlx.nn's layers for 'affine')."
        )
    if bits is not None and bits != fmt["bits"]:
        raise ValueError(f"Mode '{mode}' stores {fmt['bits']}-bit codes but bits={bits} was given.")
    return group_size or fmt["default_group_size"], fmt["bits"]


def _quantize_weight(layer: nn.Module, weight: mx.array, global_scale: bool) -> None:
    """Quantize ``weight`` into ``layer.weight``/``layer.scales`` (and ``global_scale``)."""
    gs = mx.max(mx.abs(weight)).astype(mx.float32) if global_scale else None
    layer.weight, layer.scales = _quantize(
        weight, layer.group_size, mode=layer.mode, global_scale=gs
    )
    layer.biases = None  # MLX's fp-mode layers carry this attribute too
    if gs is not None:
        layer.global_scale = gs


def _matmul(layer: nn.Module, x: mx.array) -> mx.array:
    """``x @ dequantize(layer.weight).T`` on mlx_fpqmm's ops."""
    op = qmm_for_mode(layer.mode)
    global_scale = layer.get("global_scale")
    extra = {} if global_scale is None else {"global_scale": global_scale}
    return op(x, layer["weight"], layer["scales"], True, layer.group_size, layer.mode, **extra)


_Layer = TypeVar("_Layer", bound=nn.Module)


def _wrap(cls: type[_Layer], source: nn.Module) -> _Layer:
    """An instance of ``cls`` sharing ``source``'s arrays, frozen state and training mode."""
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.group_size, layer.bits = _resolve_mode(source.mode, source.group_size, source.bits)
    layer.mode = source.mode
    layer.biases = None
    for key, value in source.items():
        if isinstance(value, mx.array):
            layer[key] = value
    layer.freeze()
    layer.unfreeze(keys=list(source.trainable_parameters()))
    layer.train(source.training)
    return layer


class QuantizedLinear(nn.QuantizedLinear):
    """A :class:`mlx.nn.QuantizedLinear` that multiplies on mlx_fpqmm's ops.

    It has the same parameters as MLX's layer (``weight`` uint32, ``scales``, optional
    ``bias``), so weights saved from one load into the other with ``strict=True``. Besides
    MLX's ``mxfp4``, ``nvfp4`` and ``mxfp8`` it supports the float-scale ``fp4`` and ``fp8``
    modes, and ``nvfp4`` with a ``global_scale`` parameter (the float32 tensor scale
    ``max|w|``, applied inside the op).

    Note:
        Code that calls ``mx.dequantize`` with the layer's attributes (mlx-lm's
        ``dequantize_model``, LoRA ``fuse``) handles MLX's modes, but not ``fp4``/``fp8``
        (unknown to MLX) nor ``global_scale`` (which it does not pass).

    Args:
        input_dims (int): The dimensionality of the input features.
        output_dims (int): The dimensionality of the output features.
        bias (bool, optional): If set to ``False`` then the layer will not use
            a bias. Default: ``True``.
        group_size (Optional[int]): The group size to use for the quantized
            weight. See :data:`mlx_fpqmm.FORMATS`. Default: ``None`` (the mode's).
        bits (Optional[int]): The bit width, implied by ``mode``; if given it must
            match. Default: ``None``.
        mode (str): One of ``"mxfp4"``, ``"nvfp4"``, ``"mxfp8"``, ``"fp4"``,
            ``"fp8"``. Default: ``"mxfp4"``.
        global_scale (bool): ``nvfp4`` only: quantize with a tensor scale and keep
            it as the ``global_scale`` parameter. Default: ``False``.
    """

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        *,
        global_scale: bool = False,
    ):
        # MLX's constructor only knows MLX's modes, so set the layer up here.
        nn.Module.__init__(self)
        self.group_size, self.bits = _resolve_mode(mode, group_size, bits)
        self.mode = mode
        scale = math.sqrt(1 / input_dims)
        weight = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        _quantize_weight(self, weight, global_scale)
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        x = _matmul(self, x)
        if "bias" in self:
            x = x + self["bias"]
        return x

    @classmethod
    def from_linear(
        cls,
        linear_layer: nn.Module,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        *,
        global_scale: bool = False,
    ) -> QuantizedLinear:
        """Create a :obj:`QuantizedLinear` from an :obj:`mlx.nn.Linear` layer.

        As with MLX's ``from_linear``, the weight is frozen and a copied ``bias``
        stays trainable.
        """
        output_dims, input_dims = linear_layer.weight.shape
        ql = cls(input_dims, output_dims, False, group_size, bits, mode)
        _quantize_weight(ql, linear_layer.weight, global_scale)
        ql.freeze()
        if "bias" in linear_layer:
            ql.bias = linear_layer.bias
        return ql

    @classmethod
    def from_quantized(cls, layer: nn.QuantizedLinear) -> QuantizedLinear:
        """Wrap an fp-mode :obj:`mlx.nn.QuantizedLinear`, sharing its arrays (no copy)."""
        return _wrap(cls, layer)


class QuantizedEmbedding(nn.QuantizedEmbedding):
    """A :class:`mlx.nn.QuantizedEmbedding` whose :meth:`as_linear` runs on mlx_fpqmm.

    Models with tied input and output embeddings call :meth:`as_linear` for their
    output head, so with this layer they run every quantized matmul on mlx_fpqmm.
    Parameters, modes and ``global_scale`` are as for :class:`QuantizedLinear`.

    Args:
        num_embeddings (int): How many possible discrete tokens can we embed.
        dims (int): The dimensionality of the embeddings.
        group_size (Optional[int]): The group size to use for the quantized
            weight. Default: ``None`` (the mode's).
        bits (Optional[int]): The bit width, implied by ``mode``. Default: ``None``.
        mode (str): One of ``"mxfp4"``, ``"nvfp4"``, ``"mxfp8"``, ``"fp4"``,
            ``"fp8"``. Default: ``"mxfp4"``.
        global_scale (bool): ``nvfp4`` only: quantize with a tensor scale and keep
            it as the ``global_scale`` parameter. Default: ``False``.
    """

    def __init__(
        self,
        num_embeddings: int,
        dims: int,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        *,
        global_scale: bool = False,
    ):
        nn.Module.__init__(self)
        self.group_size, self.bits = _resolve_mode(mode, group_size, bits)
        self.mode = mode
        weight = mx.random.normal(shape=(num_embeddings, dims), scale=math.sqrt(1 / dims))
        _quantize_weight(self, weight, global_scale)
        self.num_embeddings = num_embeddings
        self.dims = dims
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        return _dequantize(
            self["weight"][x],
            self["scales"][x],
            self.group_size,
            mode=self.mode,
            global_scale=self.get("global_scale"),
        )

    def as_linear(self, x: mx.array) -> mx.array:
        """Call the embedding as a quantized linear layer (e.g. a tied output head)."""
        return _matmul(self, x)

    @classmethod
    def from_embedding(
        cls,
        embedding_layer: nn.Module,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        *,
        global_scale: bool = False,
    ) -> QuantizedEmbedding:
        """Create a :obj:`QuantizedEmbedding` from an :obj:`mlx.nn.Embedding` layer."""
        num_embeddings, dims = embedding_layer.weight.shape
        ql = cls(num_embeddings, dims, group_size, bits, mode)
        _quantize_weight(ql, embedding_layer.weight, global_scale)
        ql.freeze()
        return ql

    @classmethod
    def from_quantized(cls, layer: nn.QuantizedEmbedding) -> QuantizedEmbedding:
        """Wrap an fp-mode :obj:`mlx.nn.QuantizedEmbedding`, sharing its arrays (no copy)."""
        ql = _wrap(cls, layer)
        ql.num_embeddings, ql.dims = layer.num_embeddings, layer.dims
        return ql


_FROM_FLOAT = {
    nn.Linear.to_quantized: QuantizedLinear.from_linear,
    nn.Embedding.to_quantized: QuantizedEmbedding.from_embedding,
}


def quantize(
    model: nn.Module,
    group_size: int | None = None,
    *,
    mode: str = "mxfp4",
    global_scale: bool = False,
    class_predicate: Callable[[str, nn.Module], bool | dict] | None = None,
) -> None:
    """Quantize the sub-modules of a module according to a predicate, in place.

    The model-level twin of :func:`mlx.nn.quantize` (:func:`mlx_fpqmm.quantize` is the
    array-level twin of :func:`mlx.core.quantize`), with the same predicate contract:
    ``class_predicate(path, module)`` is called for every leaf module with its dotted
    path and returns ``False`` (leave it), ``True`` (quantize with ``group_size``,
    ``mode`` and ``global_scale``) or a dict of ``to_quantized`` keyword arguments
    (``group_size``, ``bits``, ``mode``, ``global_scale``; as in MLX, a dict without
    ``mode`` means ``"affine"``).

    :obj:`mlx.nn.Linear` and :obj:`mlx.nn.Embedding` layers and mlx-lm's ``SwitchLinear``
    experts (and subclasses that keep their ``to_quantized``) in an fp mode become
    :class:`QuantizedLinear`, :class:`QuantizedEmbedding` and :class:`QuantizedSwitchLinear`.
    Everything else (``affine``, quantized activations, other layer types) is left to the
    module's own ``to_quantized``.

    Args:
        model (mlx.nn.Module): The model whose leaf modules may be quantized.
        group_size (Optional[int]): The group size. Default: ``None`` (the mode's).
        mode (str): The quantization mode. Default: ``"mxfp4"``.
        global_scale (bool): ``nvfp4`` only: give each layer a tensor scale.
            Default: ``False``.
        class_predicate (Optional[Callable]): Decides, per leaf module, whether and
            how to quantize it. Default: every module with a ``to_quantized`` method.

    Example:
        >>> import mlx.nn as nn
        >>> import mlx_fpqmm
        >>> model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
        >>> mlx_fpqmm.nn.quantize(model, mode="fp8")
    """
    if mode != "affine":
        _resolve_mode(mode, group_size, None)
    class_predicate = class_predicate or (lambda _, m: hasattr(m, "to_quantized"))

    switch = _switch_layer_classes()

    def _maybe_quantize(path: str, m: nn.Module) -> nn.Module:
        params = class_predicate(path, m)
        if not params:
            return m
        if isinstance(params, bool):
            params = {"group_size": group_size, "mode": mode}
            if global_scale:
                params["global_scale"] = True
        elif isinstance(params, dict):
            params = dict(params)
            if not params.get("quantize_input", True):
                del params["quantize_input"]
        else:
            raise ValueError(
                "``class_predicate`` must return a bool"
                " or a dict of parameters to pass to ``to_quantized``"
            )
        if not hasattr(m, "to_quantized"):
            raise ValueError(f"Unable to quantize model of type {type(m)}")
        layer_mode = params.get("mode", "affine")
        if layer_mode in FORMATS and "quantize_input" not in params:
            # Only where MLX's own to_quantized would build an nn.QuantizedLinear/Embedding.
            from_float = _FROM_FLOAT.get(getattr(type(m), "to_quantized", None))
            if from_float is None and switch and type(m).to_quantized is switch[0].to_quantized:
                from ._switch import QuantizedSwitchLinear

                from_float = QuantizedSwitchLinear.from_switch_linear
            if from_float is not None:
                return from_float(m, **params)
            if FORMATS[layer_mode]["scales"] == "float":
                raise ValueError(
                    f"Mode '{layer_mode}' is only supported for nn.Linear and nn.Embedding, "
                    f"but {path or 'the model'} is a {type(m).__name__} with its own "
                    "to_quantized."
                )
        return m.to_quantized(**params)

    leaves = tree_map_with_path(_maybe_quantize, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)


@dataclass
class ConversionReport:
    """What :func:`convert` did.

    Attributes:
        converted (dict[str, str]): Dotted path to mode of every layer that now runs on
            mlx_fpqmm.
        skipped (dict[str, str]): Dotted path to the reason, for every quantized layer
            (a leaf with ``scales``) that was left as it was.
    """

    converted: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        def summary(entries: dict[str, str]) -> str:
            counts = Counter(entries.values())
            return ", ".join(f"{n} x {what}" for what, n in counts.items()) or "none"

        return (
            f"converted {len(self.converted)} layers ({summary(self.converted)}); "
            f"left {len(self.skipped)} quantized layers alone ({summary(self.skipped)})"
        )


def convert(model: nn.Module) -> ConversionReport:
    """Swap the fp-mode quantized layers of an already quantized model for mlx_fpqmm's.

    Every :obj:`mlx.nn.QuantizedLinear`, :obj:`mlx.nn.QuantizedEmbedding` and mlx-lm
    ``QuantizedSwitchLinear`` (the experts of mixture-of-experts models; exactly those
    classes, not subclasses) in mode ``mxfp4``, ``nvfp4`` or ``mxfp8`` becomes a
    :class:`QuantizedLinear`, :class:`QuantizedEmbedding` or :class:`QuantizedSwitchLinear`
    that shares its arrays (nothing is copied) and keeps its frozen parameters and training
    mode. MLX's tensor-parallel ``nn.QuantizedAllToShardedLinear`` and
    ``nn.QuantizedShardedToAllLinear`` in those modes become
    :class:`QuantizedAllToShardedLinear` and :class:`QuantizedShardedToAllLinear` (same
    group). ``affine`` layers and other quantized layers (e.g. ``nn.QQLinear``) are left
    alone. The
    model is updated in place; the outputs stay the same up to float rounding.

    Args:
        model (mlx.nn.Module): A model, e.g. one returned by ``mlx_lm.load``.

    Returns:
        ConversionReport: The converted layers and the quantized layers left alone.

    Example:
        >>> from mlx_lm import load
        >>> import mlx_fpqmm
        >>> model, tokenizer = load("path/or/hf-repo/of/an-mxfp4-model")  # doctest: +SKIP
        >>> print(mlx_fpqmm.convert(model))  # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert expects an mlx.nn.Module but received {type(model).__name__}.")
    report = ConversionReport()
    ours = {nn.QuantizedLinear: QuantizedLinear, nn.QuantizedEmbedding: QuantizedEmbedding}
    switch = _switch_layer_classes()
    if switch:
        from ._switch import QuantizedSwitchLinear

        ours[switch[1]] = QuantizedSwitchLinear
    ours.update(_MLX_SHARDED)  # MLX's tensor-parallel layers: mlx_fpqmm/_sharded.py

    def _maybe_convert(path: str, m: nn.Module) -> nn.Module:
        cls = ours.get(type(m))
        if cls is not None and m.mode in FORMATS:
            report.converted[path] = m.mode
            return cls.from_quantized(m)
        if "scales" in m:
            if type(m) in ours.values():
                report.skipped[path] = "already mlx_fpqmm"
            elif cls is not None:
                report.skipped[path] = f"{m.mode} mode"
            else:
                report.skipped[path] = f"{type(m).__name__} not handled"
        return m

    leaves = tree_map_with_path(_maybe_convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    return report


# Tensor parallelism (MLX distributed): mlx_fpqmm/_sharded.py.
from ._sharded import MLX_SHARDED as _MLX_SHARDED  # noqa: E402
from ._sharded import (  # noqa: E402
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    shard_inplace,
    shard_linear,
    sharding,
)

__all__ += [
    "QuantizedAllToShardedLinear",
    "QuantizedShardedToAllLinear",
    "shard_inplace",
    "shard_linear",
    "sharding",
]
