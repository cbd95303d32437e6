"""The multi-head layer of multi-head latent attention: mlx-lm's ``QuantizedMultiLinear`` on
mlx_fpqmm's ops.

Imported on first use of :obj:`mlx_fpqmm.nn.QuantizedMultiLinear`, so mlx-lm stays an
optional dependency of mlx_fpqmm.
"""

from __future__ import annotations

import math
from typing import ClassVar

import mlx.core as mx
from mlx_lm.models import mla

from ._layers import draw_as_constructed, matmul, quantize_weight, setup, wrap

__all__ = ["QuantizedMultiLinear"]


class QuantizedMultiLinear(mla.QuantizedMultiLinear):
    """mlx-lm's ``QuantizedMultiLinear`` (DeepSeek-V3's ``embed_q`` / ``unembed_out``: one
    matrix per attention head) multiplying on :func:`mlx_fpqmm.fp4_qmm` /
    :func:`mlx_fpqmm.fp8_qmm`.

    Same parameters as mlx-lm's layer (``weight`` (heads, N, K * bits / 32) uint32,
    ``scales``) and the same ``__call__(x, transpose=True)``: ``x @ W[h].T`` per head ``h``
    (``transpose=False``: ``x @ W[h]``), the heads broadcast against ``x``'s leading
    dimensions as in ``mx.matmul``. In all five modes; no ``global_scale`` (the op takes one
    tensor scale per call, and mlx-lm's layer has none).

    Args:
        input_dims (int): The dimensionality of the input features.
        output_dims (int): The dimensionality of the output features.
        num_heads (int): The number of heads (matrices).
        group_size (Optional[int]): The group size. Default: ``None`` (the mode's).
        bits (Optional[int]): The bit width, implied by ``mode``. Default: ``None``.
        mode (str): One of ``"mxfp4"``, ``"nvfp4"``, ``"mxfp8"``, ``"fp4"``, ``"fp8"``.
            Default: ``"mxfp4"``.
    """

    # No tensor scale: the op takes one a call, not one a head.
    takes_global_scale: ClassVar[bool] = False

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        num_heads: int,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
    ) -> None:
        setup(self, mode, group_size, bits)
        scale = math.sqrt(1 / input_dims)
        weight = mx.random.uniform(
            low=-scale, high=scale, shape=(num_heads, output_dims, input_dims)
        )
        quantize_weight(self, weight, False)
        self.freeze()

    def __call__(self, x: mx.array, transpose: bool = True) -> mx.array:
        return matmul(self, x, transpose)

    @classmethod
    def from_multi_linear(
        cls,
        layer: mla.MultiLinear,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "mxfp4",
        *,
        global_scale: bool = False,
    ) -> QuantizedMultiLinear:
        """Quantize a float ``MultiLinear`` (``MultiLinear.to_quantized``'s arguments).

        Raises:
            ValueError: ``global_scale=True`` (this layer has no tensor scale).
        """
        if global_scale:
            raise ValueError(
                "QuantizedMultiLinear has no global_scale (mlx_fpqmm's op takes one tensor "
                "scale, not one per head); leave its layers out of the global scale with "
                "class_predicate."
            )
        draw_as_constructed()
        quantized = cls.__new__(cls)
        setup(quantized, mode, group_size, bits)
        quantize_weight(quantized, layer.weight, False)
        quantized.freeze()
        return quantized

    @classmethod
    def from_quantized(cls, layer: mla.QuantizedMultiLinear) -> QuantizedMultiLinear:
        """The same layer on mlx_fpqmm's ops, sharing ``layer``'s arrays (no copy)."""
        return wrap(cls, layer)
