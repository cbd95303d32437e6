"""The mixture-of-experts layer: mlx-lm's ``QuantizedSwitchLinear`` on mlx_fpqmm's ops.

Imported on first use of :obj:`mlx_fpqmm.nn.QuantizedSwitchLinear`, so mlx-lm stays an
optional dependency of mlx_fpqmm.
"""

from __future__ import annotations

import math
from typing import ClassVar

import mlx.core as mx
from mlx_lm.models import switch_layers

from ._ext import gather_qmm
from ._fused import _Siblings, shared_output, switch_product
from ._layers import draw_as_constructed, quantize_weight, setup, tensor_scale, wrap

__all__ = ["FusedQuantizedSwitchLinear", "QuantizedSwitchLinear"]


class QuantizedSwitchLinear(switch_layers.QuantizedSwitchLinear):
    """mlx-lm's ``QuantizedSwitchLinear`` (the experts of ``SwitchGLU`` / ``SwitchMLP``)
    multiplying on :func:`mlx_fpqmm.gather_qmm`.

    Same parameters as mlx-lm's layer (``weight`` (E, N, K * bits / 32) uint32, ``scales``,
    optional ``bias`` (E, N), optional ``global_scale`` (E,)) and the same
    ``__call__(x, indices, sorted_indices=False)``, in all five modes; ``nvfp4`` with
    ``global_scale=True`` gives each expert its own tensor scale.

    Args:
        input_dims (int): The dimensionality of the input features.
        output_dims (int): The dimensionality of the output features.
        num_experts (int): The number of experts.
        bias (bool, optional): Give each expert a bias. Default: ``True``.
        group_size (Optional[int]): The group size. Default: ``None`` (the mode's).
        bits (Optional[int]): The bit width, implied by ``mode``. Default: ``None``.
        mode (str): One of ``"mxfp4"``, ``"nvfp4"``, ``"mxfp8"``, ``"fp4"``, ``"fp8"``.
            Default: ``"mxfp4"``.
        global_scale (bool): ``nvfp4`` only: a tensor scale per expert. Default: ``False``.
    """

    # Whether an nvfp4 layer may hold a tensor scale (nn.quantize's global_scale).
    takes_global_scale: ClassVar[bool] = True

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        num_experts: int,
        bias: bool = True,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        global_scale: bool = False,
    ) -> None:
        scale = math.sqrt(1 / input_dims)
        weight = mx.random.uniform(
            low=-scale, high=scale, shape=(num_experts, output_dims, input_dims)
        )
        self._setup(weight, group_size, bits, mode, global_scale)
        if bias:
            self.bias = mx.zeros((num_experts, output_dims))
        self.freeze()  # as mlx-lm's layer: every parameter, the bias included

    def _setup(
        self,
        weight: mx.array,
        group_size: int | None,
        bits: int | None,
        mode: str,
        global_scale: bool,
    ) -> None:
        setup(self, mode, group_size, bits)
        self._quantize(weight, global_scale)
        self.freeze()

    def _quantize(self, weight: mx.array, global_scale: bool = False) -> None:
        # mlx-lm's layer: a tensor scale per expert, and a global_scale attribute either way.
        self.global_scale = None
        quantize_weight(self, weight, global_scale, per_matrix=True)

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        x = gather_qmm(
            x,
            self["weight"],
            self["scales"],
            rhs_indices=indices,
            transpose=True,
            group_size=self.group_size,
            mode=self.mode,
            global_scale=tensor_scale(self),
            sorted_indices=sorted_indices,
        )
        return self._biased(x, indices)

    def _biased(self, y: mx.array, indices: mx.array) -> mx.array:
        """``y`` plus each pair's expert's bias, where the layer has biases."""
        if "bias" in self:
            y = y + mx.expand_dims(self["bias"][indices], -2)
        return y

    @classmethod
    def from_switch_linear(
        cls,
        layer: switch_layers.SwitchLinear,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        global_scale: bool = False,
    ) -> QuantizedSwitchLinear:
        """Quantize a float ``SwitchLinear`` (its experts and bias)."""
        draw_as_constructed()
        quantized = cls.__new__(cls)
        quantized._setup(layer.weight, group_size, bits, mode, global_scale)
        if "bias" in layer:
            quantized.bias = layer.bias
        return quantized

    @classmethod
    def from_quantized(cls, layer: switch_layers.QuantizedSwitchLinear) -> QuantizedSwitchLinear:
        """The same layer on mlx_fpqmm's op, sharing ``layer``'s arrays."""
        quantized = wrap(cls, layer)
        if "global_scale" not in quantized:
            quantized.global_scale = None
        return quantized


class FusedQuantizedSwitchLinear(QuantizedSwitchLinear):
    """A :class:`QuantizedSwitchLinear` whose product comes from one shared with its
    siblings (``SwitchGLU``'s ``gate_proj`` and ``up_proj``).

    Made by :func:`mlx_fpqmm.nn.fuse_projections`. Its ``weight`` and ``scales`` are its
    rows of each expert in the siblings' concatenated arrays (views: no copy), so it saves,
    loads and multiplies on its own as a :class:`QuantizedSwitchLinear` does. Called on the
    x and indices its siblings are called on, the first call computes one ``gather_qmm`` of
    all of them and each returns its part (plus its experts' bias).
    """

    __module__ = "mlx_fpqmm.nn"

    _siblings: _Siblings | None = None
    _index = 0
    _product = staticmethod(switch_product)

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        y = shared_output(self, x, indices, sorted_indices)
        if y is None:
            return super().__call__(x, indices, sorted_indices)
        return self._biased(y, indices)
