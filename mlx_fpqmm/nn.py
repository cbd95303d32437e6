"""Drop-in quantized layers for ``mlx.nn`` and mlx-lm models, running on mlx_fpqmm's ops.

:class:`QuantizedLinear` and :class:`QuantizedEmbedding` subclass MLX's own layers (so every
``isinstance`` check in mlx-lm keeps working), keep their parameter names and dtypes, and
compute with :func:`mlx_fpqmm.fp4_qmm` / :func:`mlx_fpqmm.fp8_qmm`. :func:`quantize` is the
model-level twin of :func:`mlx.nn.quantize`; :func:`convert` swaps the layers of a model that
is already quantized (e.g. one loaded by mlx-lm); :func:`fuse_projections` lets the projections
that read the same x (q/k/v, gate/up) run as one product.
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.nn as nn
from mlx.utils import tree_map_with_path

from ._formats import FORMATS, resolve_mode
from ._fused import FusedQuantizedLinear, fuse_projections
from ._linear import QuantizedEmbedding, QuantizedLinear
from ._sharded import MLX_SHARDED as _MLX_SHARDED
from ._sharded import (
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    shard_inplace,
    shard_linear,
    sharding,
)

__all__ = [
    "ConversionReport",
    "FusedQuantizedLinear",
    "QuantizedAllToShardedLinear",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "QuantizedShardedToAllLinear",
    "convert",
    "fuse_projections",
    "quantize",
    "shard_inplace",
    "shard_linear",
    "sharding",
]

# mlx-lm's modules of layers that have a twin here; ours import mlx-lm, so they are loaded
# only where mlx-lm's module is (a model holding its layers implies it is).
_SWITCH_LAYERS = "mlx_lm.models.switch_layers"
_MLA = "mlx_lm.models.mla"


def __getattr__(name: str):
    # These subclass mlx-lm's layers: importing them imports mlx-lm (so they are not in
    # __all__, where a star import would need mlx-lm).
    if name in ("QuantizedSwitchLinear", "FusedQuantizedSwitchLinear"):
        from . import _switch

        return getattr(_switch, name)
    if name == "QuantizedMultiLinear":
        from ._multi import QuantizedMultiLinear

        return QuantizedMultiLinear
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _takes_global_scale(
    module: nn.Module, from_float_layers: dict[Callable, Callable] | None = None
) -> bool:
    """Whether ``module`` quantized in ``nvfp4`` may hold a tensor scale: the layer of ours
    that it becomes says (mlx-lm's ``MultiLinear`` heads have none), another layer takes
    one where its own ``to_quantized`` does (mlx-lm's rule).

    Args:
        module (mlx.nn.Module): A float layer.
        from_float_layers (Optional[dict]): :func:`_layer_tables`' first table, where the
            caller has it. Default: ``None`` (looked up).
    """
    if from_float_layers is None:
        from_float_layers, _ = _layer_tables()
    from_float = from_float_layers.get(getattr(type(module), "to_quantized", None))
    if from_float is not None:
        return from_float.__self__.takes_global_scale
    to_quantized = getattr(module, "to_quantized", None)
    return to_quantized is not None and "global_scale" in inspect.signature(to_quantized).parameters


def _layer_tables() -> tuple[dict[Callable, Callable], dict[type, type]]:
    """The layers that have a twin here, as :func:`quantize` and :func:`convert` look them up.

    Returns:
        ``to_quantized`` of a float layer -> the constructor of ours from it; and a
        quantized layer of MLX or mlx-lm -> ours. mlx-lm's are in where their module is
        loaded.
    """
    from_float = {
        nn.Linear.to_quantized: QuantizedLinear.from_linear,
        nn.Embedding.to_quantized: QuantizedEmbedding.from_embedding,
    }
    ours = {
        nn.QuantizedLinear: QuantizedLinear,
        nn.QuantizedEmbedding: QuantizedEmbedding,
        **_MLX_SHARDED,
    }
    if _SWITCH_LAYERS in sys.modules:
        from mlx_lm.models import switch_layers

        from ._switch import QuantizedSwitchLinear

        from_float[switch_layers.SwitchLinear.to_quantized] = (
            QuantizedSwitchLinear.from_switch_linear
        )
        ours[switch_layers.QuantizedSwitchLinear] = QuantizedSwitchLinear
    if _MLA in sys.modules:
        from mlx_lm.models import mla

        from ._multi import QuantizedMultiLinear

        from_float[mla.MultiLinear.to_quantized] = QuantizedMultiLinear.from_multi_linear
        ours[mla.QuantizedMultiLinear] = QuantizedMultiLinear
    return from_float, ours


def quantize(
    model: nn.Module,
    group_size: int | None = None,
    bits: int | None = None,
    *,
    mode: str = "mxfp4",
    quantize_input: bool = False,
    class_predicate: Callable[[str, nn.Module], bool | dict] | None = None,
    global_scale: bool = False,
) -> None:
    """Quantize the sub-modules of a module according to a predicate, in place.

    The model-level twin of :func:`mlx.nn.quantize`, with its signature (plus
    ``global_scale``; the default mode is ``"mxfp4"``) and its predicate contract:
    ``class_predicate(path, module)`` is called for every leaf module with its dotted
    path and returns ``False`` (leave it), ``True`` (quantize with ``group_size``,
    ``bits``, ``mode``, ``quantize_input`` and ``global_scale``) or a dict of
    ``to_quantized`` keyword arguments (``group_size``, ``bits``, ``mode``,
    ``global_scale``, ...; as in MLX, a dict without ``mode`` means ``"affine"``).
    (:func:`mlx_fpqmm.quantize` is the array-level twin of :func:`mlx.core.quantize`.)

    :obj:`mlx.nn.Linear` and :obj:`mlx.nn.Embedding` layers, mlx-lm's ``SwitchLinear``
    experts and ``MultiLinear`` attention heads (and subclasses that keep their
    ``to_quantized``) in an fp mode become :class:`QuantizedLinear`,
    :class:`QuantizedEmbedding`, :class:`QuantizedSwitchLinear` and
    :class:`QuantizedMultiLinear`.
    Everything else (``affine``, quantized activations, other layer types) is left to the
    module's own ``to_quantized``.

    Args:
        model (mlx.nn.Module): The model whose leaf modules may be quantized.
        group_size (Optional[int]): The group size. Default: ``None`` (the mode's).
        bits (Optional[int]): The bits per element. In an fp mode it is the mode's, and
            may only be given as that. Default: ``None`` (the mode's).
        mode (str): The quantization mode. Default: ``"mxfp4"``.
        quantize_input (bool): Quantize the activations too (MLX's ``nn.QQLinear``, for
            ``nvfp4`` and ``mxfp8`` ``nn.Linear`` layers; left to MLX). Default: ``False``.
        class_predicate (Optional[Callable]): Decides, per leaf module, whether and
            how to quantize it. Default: every module with a ``to_quantized`` method.
        global_scale (bool): ``nvfp4`` only: give each layer that may hold one a tensor
            scale (every layer of ours but ``QuantizedMultiLinear``, whose op takes one
            scale a call, not one a head). Default: ``False``.

    Example:
        >>> import mlx.nn as nn
        >>> import mlx_fpqmm
        >>> model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
        >>> mlx_fpqmm.nn.quantize(model, mode="fp8")
    """
    if mode != "affine":
        resolve_mode(mode, group_size, bits)
    class_predicate = class_predicate or (lambda _, m: hasattr(m, "to_quantized"))
    from_float_layers, _ = _layer_tables()

    def _maybe_quantize(path: str, m: nn.Module) -> nn.Module:
        params = class_predicate(path, m)
        if not params:
            return m
        if isinstance(params, bool):
            params = {"group_size": group_size, "bits": bits, "mode": mode}
            if quantize_input:
                params["quantize_input"] = True
            if global_scale and _takes_global_scale(m, from_float_layers):
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
            # Only where the layer's own to_quantized would build one of the layers we have.
            from_float = from_float_layers.get(getattr(type(m), "to_quantized", None))
            if from_float is not None:
                return from_float(m, **params)
            if FORMATS[layer_mode]["scales"] == "float":
                raise ValueError(
                    f"Mode '{layer_mode}' is only supported for nn.Linear, nn.Embedding and "
                    "mlx-lm's SwitchLinear and MultiLinear, "
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

    Every :obj:`mlx.nn.QuantizedLinear`, :obj:`mlx.nn.QuantizedEmbedding`, mlx-lm
    ``QuantizedSwitchLinear`` (the experts of mixture-of-experts models) and mlx-lm
    ``QuantizedMultiLinear`` (the per-head matrices of DeepSeek-V3's attention) in mode
    ``mxfp4``, ``nvfp4`` or ``mxfp8`` (exactly those classes, not subclasses) becomes a
    :class:`QuantizedLinear`, :class:`QuantizedEmbedding`, :class:`QuantizedSwitchLinear`
    or :class:`QuantizedMultiLinear` that shares its arrays (nothing is copied) and keeps
    its frozen parameters and training mode. MLX's tensor-parallel
    ``nn.QuantizedAllToShardedLinear`` and ``nn.QuantizedShardedToAllLinear`` in those modes
    become :class:`QuantizedAllToShardedLinear` and :class:`QuantizedShardedToAllLinear`
    (same group). ``affine`` layers and other quantized layers (e.g. ``nn.QQLinear``) are left
    alone. The model is updated in place; the outputs stay the same up to float rounding.

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
    _, ours = _layer_tables()

    def _maybe_convert(path: str, m: nn.Module) -> nn.Module:
        cls = ours.get(type(m))
        if cls is not None and m.mode in FORMATS:
            report.converted[path] = m.mode
            return cls.from_quantized(m)
        if "scales" in m:
            if isinstance(m, tuple(ours.values())):
                report.skipped[path] = "already mlx_fpqmm"
            elif cls is not None:
                report.skipped[path] = f"{m.mode} mode"
            else:
                report.skipped[path] = f"{type(m).__name__} not handled"
        return m

    leaves = tree_map_with_path(_maybe_convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    return report
