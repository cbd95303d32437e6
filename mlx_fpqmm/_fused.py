"""Sibling projections that read the same x, multiplied as one product (:func:`fuse`).

A model's attention calls ``q_proj``, ``k_proj`` and ``v_proj`` on one x, and its MLP
``gate_proj`` and ``up_proj``. Their W rows and scales concatenated (the groups run along
K, so nothing is requantized) make one product with N the sum of theirs: fewer launches a
token, which a decoding step pays for on the host, and no small products that leave the
GPU half idle. The layers stay where the model has them; the first one called on an x
computes the product for all, and each returns its slice of it.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import mlx.nn as nn

from ._formats import qmm_for_mode
from ._layers import wrap
from ._linear import QuantizedLinear

__all__ = ["FusedQuantizedLinear", "fuse"]

# The names of sibling layers that models call on one x: most of mlx-lm's attentions and
# MLPs (Llama, Mistral, Qwen, Gemma, ...); w1 / w3 in InternLM2's and LFM2's MLPs.
_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"))


class _Siblings:
    """The layers' W rows and scales side by side, and the last x's product of them."""

    def __init__(self, layers: list[QuantizedLinear]):
        first = layers[0]
        self.mode, self.group_size = first.mode, first.group_size
        self.weight = mx.concatenate([layer.weight for layer in layers])
        self.scales = mx.concatenate([layer.scales for layer in layers])
        ends = list(itertools.accumulate(layer.weight.shape[0] for layer in layers))
        self.rows = list(zip([0, *ends[:-1]], ends, strict=True))
        self.weights = [self.weight[start:end] for start, end in self.rows]
        self.scale_rows = [self.scales[start:end] for start, end in self.rows]
        self._x: mx.array | None = None
        self._y: mx.array | None = None
        self._left = 0

    def output(self, index: int, layer: QuantizedLinear, x: mx.array) -> mx.array | None:
        """Layer ``index``'s slice of the product of ``x``; ``None`` where the layer's
        arrays are no longer the rows it was given (it then multiplies on its own)."""
        if layer["weight"] is not self.weights[index] or (
            layer["scales"] is not self.scale_rows[index]
        ):
            return None
        if x is not self._x:
            qmm = qmm_for_mode(self.mode)
            self._x, self._y = x, qmm(x, self.weight, self.scales, True, self.group_size, self.mode)
            self._left = len(self.rows)
        start, end = self.rows[index]
        y = self._y[..., start:end]
        self._left -= 1
        if self._left == 0:  # every sibling has its slice: let x and the product go
            self._x = self._y = None
        return y


class FusedQuantizedLinear(QuantizedLinear):
    """A :class:`QuantizedLinear` whose product comes from one shared with its siblings.

    Made by :func:`fuse`. Its ``weight`` and ``scales`` are its rows of the siblings'
    concatenated arrays (views: no copy), so it saves, loads and multiplies on its own as
    a :class:`QuantizedLinear` does. Called on the x its siblings are called on, the first
    call computes the product of all of them and each returns its slice (plus its bias).
    """

    __module__ = "mlx_fpqmm.nn"

    def __call__(self, x: mx.array) -> mx.array:
        y = self._siblings.output(self._index, self, x)
        if y is None:
            return super().__call__(x)
        if "bias" in self:
            y = y + self["bias"]
        return y


def _fusable(layers: list[nn.Module]) -> bool:
    first = layers[0]
    return all(
        type(layer) is QuantizedLinear
        and "global_scale" not in layer
        and layer.mode == first.mode
        and layer.group_size == first.group_size
        and layer.weight.shape[1] == first.weight.shape[1]
        and layer.scales.dtype == first.scales.dtype
        for layer in layers
    )


def fuse(model: nn.Module) -> list[str]:
    """Let sibling projections that read the same x run as one product.

    In every module of ``model`` that holds all the layers of a group (``q_proj``,
    ``k_proj``, ``v_proj``; ``gate_proj``, ``up_proj``; ``w1``, ``w3``), each a
    :class:`QuantizedLinear` of one mode and group size over the same input dimension and
    without a ``global_scale``, the layers become :class:`FusedQuantizedLinear`: their W
    rows and scales are concatenated once (the old arrays are released), each keeps its
    rows as a view, and the first of them called on an x multiplies it by all of their
    rows in one product. Called on other inputs, or after its ``weight`` or ``scales`` was
    replaced, a layer multiplies on its own. The outputs are those of the separate layers,
    up to float rounding. Apply it after :func:`convert` or :func:`quantize`.

    Args:
        model (mlx.nn.Module): The model, updated in place.

    Returns:
        list[str]: The dotted paths of the fused layers, each group's side by side.

    Example:
        >>> import mlx_fpqmm
        >>> model, tokenizer = mlx_fpqmm.load("path/or/hf-repo")  # doctest: +SKIP
        >>> fused = mlx_fpqmm.nn.fuse(model)  # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fuse expects an mlx.nn.Module but received {type(model).__name__}.")
    fused: list[str] = []
    for path, module in model.named_modules():
        for names in _GROUPS:
            if not all(name in module for name in names):
                continue
            layers = [module[name] for name in names]
            if not _fusable(layers):
                continue
            siblings = _Siblings(layers)
            # Each group in turn, so that its old arrays go before the next is copied.
            mx.eval(siblings.weight, siblings.scales, siblings.weights, siblings.scale_rows)
            for index, (name, layer) in enumerate(zip(names, layers, strict=True)):
                sibling = wrap(FusedQuantizedLinear, layer)
                sibling.weight = siblings.weights[index]
                sibling.scales = siblings.scale_rows[index]
                sibling._siblings, sibling._index = siblings, index
                setattr(module, name, sibling)
                fused.append(f"{path}.{name}" if path else name)
    return fused
