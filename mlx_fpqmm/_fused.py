"""Sibling projections that read the same x, multiplied as one product (:func:`fuse_projections`).

A model's attention calls ``q_proj``, ``k_proj`` and ``v_proj`` on one x, and its MLP
``gate_proj`` and ``up_proj``. Their W rows and scales concatenated (the groups run along
K, so nothing is requantized) make one product with N the sum of theirs: fewer launches a
token, which a decoding step pays for on the host, and no small products that leave the
GPU half idle. The layers stay where the model has them; the first one called on an x
computes the product for all, and each returns its part of it. The experts of a
mixture-of-experts MLP (``SwitchGLU``'s ``gate_proj`` and ``up_proj``, called on one x and
one set of indices) are fused the same way, expert by expert, into one ``gather_qmm``.
"""

from __future__ import annotations

import itertools
import operator
import sys
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from ._ext import gather_qmm
from ._formats import qmm_for_mode
from ._layers import wrap
from ._linear import QuantizedLinear

__all__ = ["FusedQuantizedLinear", "fuse_projections"]

# The names of sibling layers that models call on one x: most of mlx-lm's attentions and
# MLPs (Llama, Mistral, Qwen, Gemma, ...); w1 / w3 in InternLM2's and LFM2's MLPs; the
# query (low-rank or not: q_lora_rank None) and the compressed key-value projections of
# DeepSeek's attention (MLA).
_GROUPS = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("w1", "w3"),
    ("q_a_proj", "kv_a_proj_with_mqa"),
    ("q_proj", "kv_a_proj_with_mqa"),
)


class _Siblings:
    """The layers' W rows and scales side by side, and the last inputs' product of them.

    A product is shared only as the layers of a model's attention or MLP use it: each
    layer once on the same inputs (x, and a switch layer's indices), the others on the same
    inputs before the next. Anything else (a layer called twice or alone, a layer's
    ``weight`` or ``scales`` replaced, as by ``load_weights``, or traced by a transform such
    as ``mx.grad`` of the model) ends the sharing for good: the concatenated arrays are
    released and each layer multiplies on its own rows from then on. Like mlx-lm's models,
    it is not for calls from several threads at once.
    """

    def __init__(self, layers: list[nn.Module], multiply: Callable[..., mx.array]):
        first = layers[0]
        self.mode, self.group_size = first.mode, first.group_size
        # Rows are the last axis but one: a Linear's (N, K), a switch layer's (E, N, K).
        self.weight = mx.concatenate([layer.weight for layer in layers], axis=-2)
        self.scales = mx.concatenate([layer.scales for layer in layers], axis=-2)
        ends = list(itertools.accumulate(layer.weight.shape[-2] for layer in layers))
        rows = list(zip([0, *ends[:-1]], ends, strict=True))
        self.weights = [self.weight[..., start:end, :] for start, end in rows]
        self.scale_rows = [self.scales[..., start:end, :] for start, end in rows]
        self._multiply = multiply
        self._splits = ends[:-1]
        self._inputs: tuple = ()
        self._parts: list[mx.array] = []
        self._taken = 0  # a bit a layer that has its part of the product of the inputs
        self._everyone = (1 << len(layers)) - 1

    @property
    def shared(self) -> bool:
        """Whether the layers still share products (until ``_stop``)."""
        return self.weight is not None

    def output(self, index: int, layer: nn.Module, *inputs) -> mx.array | None:
        """Layer ``index``'s part of the product of ``inputs``, or ``None``: the layer then
        multiplies on its own."""
        if not self.shared:
            return None
        if layer["weight"] is not self.weights[index] or (
            layer["scales"] is not self.scale_rows[index]
        ):
            return self._stop()
        bit = 1 << index
        same = len(inputs) == len(self._inputs) and all(map(operator.is_, inputs, self._inputs))
        if not same or self._taken & bit:
            if self._taken:  # a sibling missed the last inputs: not used together
                return self._stop()
            y = self._multiply(self, *inputs)
            # One split for all (a graph op of views), cheaper to build than slices.
            self._inputs, self._parts = inputs, mx.split(y, self._splits, axis=-1)
        self._taken |= bit
        part = self._parts[index]
        if self._taken == self._everyone:  # all taken: let the inputs and product go
            self._inputs, self._parts, self._taken = (), [], 0
        return part

    def release(self, index: int, layer: nn.Module) -> None:
        """Layer ``index`` multiplies on its own from now on. A switch layer's rows of every
        expert are a strided view of the concatenation, which each of its products would
        copy whole: where it still holds them, they become its own, once."""
        for name, views in (("weight", self.weights), ("scales", self.scale_rows)):
            if views[index].ndim > 2 and layer[name] is views[index]:
                setattr(layer, name, mx.contiguous(views[index]))

    def _stop(self) -> None:
        # The views stay until each layer has released its own (``release``).
        self.weight = self.scales = None
        self._inputs, self._parts = (), []


def shared_output(layer: nn.Module, *inputs) -> mx.array | None:
    """A fused layer's part of its siblings' product of ``inputs``, or ``None``: the layer
    then multiplies on its own, from now on."""
    siblings = layer._siblings
    if siblings is None:
        return None
    y = siblings.output(layer._index, layer, *inputs)
    if y is None:
        siblings.release(layer._index, layer)
        layer._siblings = None
    return y


def _linear_product(siblings: _Siblings, x: mx.array) -> mx.array:
    qmm = qmm_for_mode(siblings.mode)
    return qmm(x, siblings.weight, siblings.scales, True, siblings.group_size, siblings.mode)


def switch_product(
    siblings: _Siblings, x: mx.array, indices: mx.array, sorted_indices: bool
) -> mx.array:
    """The product of fused switch layers (the experts' rows side by side)."""
    return gather_qmm(
        x,
        siblings.weight,
        siblings.scales,
        rhs_indices=indices,
        transpose=True,
        group_size=siblings.group_size,
        mode=siblings.mode,
        sorted_indices=sorted_indices,
    )


class FusedQuantizedLinear(QuantizedLinear):
    """A :class:`QuantizedLinear` whose product comes from one shared with its siblings.

    Made by :func:`fuse_projections`. Its ``weight`` and ``scales`` are its rows of the siblings'
    concatenated arrays (views: no copy), so it saves, loads and multiplies on its own as
    a :class:`QuantizedLinear` does. Called on the x its siblings are called on, the first
    call computes the product of all of them and each returns its part (plus its bias).
    Made by its constructors rather than :func:`fuse_projections`, it is a :class:`QuantizedLinear`.
    """

    __module__ = "mlx_fpqmm.nn"

    _siblings: _Siblings | None = None
    _index = 0
    _product = staticmethod(_linear_product)

    def __call__(self, x: mx.array) -> mx.array:
        y = shared_output(self, x)
        if y is None:
            return super().__call__(x)
        if "bias" in self:
            y = y + self["bias"]
        return y


def _fused_class(layers: list[nn.Module]) -> type[nn.Module] | None:
    """The fused layers' class where ``layers`` can share one product, else ``None``."""
    first = layers[0]
    fused = None
    if type(first) is QuantizedLinear:
        fused = FusedQuantizedLinear
    # Only where mlx-lm's layers were imported can a layer be a switch layer of ours.
    switch = sys.modules.get(f"{__package__}._switch")
    if switch is not None and type(first) is switch.QuantizedSwitchLinear:
        fused = switch.FusedQuantizedSwitchLinear
    same = all(
        type(layer) is type(first)
        and layer.get("global_scale") is None
        and layer.mode == first.mode
        and layer.group_size == first.group_size
        and layer.weight.shape[:-2] == first.weight.shape[:-2]
        and layer.weight.shape[-1] == first.weight.shape[-1]
        and layer.scales.dtype == first.scales.dtype
        for layer in layers
    )
    return fused if same else None


def _fuse_group(module: nn.Module, names: tuple[str, ...]) -> bool:
    """Fuse ``module``'s layers ``names`` where they can be; whether they were. Its old
    layers, and their arrays, go when it returns, before the next group is copied."""
    layers = [module[name] for name in names]
    fused = _fused_class(layers)
    if fused is None:
        return False
    siblings = _Siblings(layers, fused._product)
    mx.eval(siblings.weight, siblings.scales, siblings.weights, siblings.scale_rows)
    for index, (name, layer) in enumerate(zip(names, layers, strict=True)):
        sibling = wrap(fused, layer)
        sibling.weight = siblings.weights[index]
        sibling.scales = siblings.scale_rows[index]
        sibling._siblings, sibling._index = siblings, index
        setattr(module, name, sibling)
    return True


def fuse_projections(model: nn.Module) -> list[str]:
    """Let sibling projections that read the same x run as one product.

    In every module of ``model`` that holds all the layers of a group (``q_proj``,
    ``k_proj``, ``v_proj``; ``gate_proj``, ``up_proj``; ``w1``, ``w3``; DeepSeek's
    ``q_a_proj`` or ``q_proj`` with ``kv_a_proj_with_mqa``), each a
    :class:`QuantizedLinear` of one mode and group size over the same input dimension and
    without a ``global_scale``, the layers become :class:`FusedQuantizedLinear`: their W
    rows and scales are concatenated once (the old arrays are released), each keeps its
    rows as a view, and the first of them called on an x multiplies it by all of their
    rows in one product. The experts of mlx-lm's ``SwitchGLU`` (``gate_proj`` and
    ``up_proj``, each a ``QuantizedSwitchLinear`` of the same experts) become
    ``FusedQuantizedSwitchLinear`` alike, their rows concatenated expert by expert, and
    multiply in one ``gather_qmm`` for the x and indices they are called on. The layers
    of a group must be called on the same inputs, unchanged between their calls (as
    models call them); a group used otherwise (a layer called
    twice or alone, its ``weight`` or ``scales`` replaced, its arrays traced by a
    transform such as training's ``nn.value_and_grad``) goes back to separate products
    for good, releasing the concatenated arrays (switch layers then copy their experts'
    rows once, which would be a strided view). Replace a layer's arrays by assigning new
    ones, as ``load_weights`` does: an array changed in place (``layer.scales *= 2``) keeps
    its identity, which is all the sharing checks. The outputs are those of the separate
    layers, up to float rounding. Apply it after :func:`convert` or :func:`quantize`, for
    inference. A fused model does not compile with ``mx.compile(shapeless=True)``: MLX
    cannot infer the shapes of the parts cut from the product, and the call raises.

    Args:
        model (mlx.nn.Module): The model, updated in place.

    Returns:
        list[str]: The dotted paths of the fused layers, each group's side by side.

    Example:
        >>> import mlx_fpqmm
        >>> model, tokenizer = mlx_fpqmm.load("path/or/hf-repo")  # doctest: +SKIP
        >>> fused = mlx_fpqmm.nn.fuse_projections(model)  # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"fuse_projections expects an mlx.nn.Module but received {type(model).__name__}."
        )
    # The modules that hold a group, listed first: a list of every module would keep each
    # group's old layers, and their arrays, until the last group is fused.
    holders = [
        (path, module)
        for path, module in model.named_modules()
        if any(all(name in module for name in names) for names in _GROUPS)
    ]
    fused: list[str] = []
    for path, module in holders:
        for names in _GROUPS:
            if all(name in module for name in names) and _fuse_group(module, names):
                fused += [f"{path}.{name}" if path else name for name in names]
    return fused
