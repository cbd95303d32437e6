"""mlx_fpqmm's :class:`QuantizedLinear` and :class:`QuantizedEmbedding`.

Public as :mod:`mlx_fpqmm.nn`'s, which is the module they name (``__module__``): a module of
their own, so that the sharded layers (:mod:`mlx_fpqmm._sharded`) can build on them while
:mod:`mlx_fpqmm.nn` imports those.
"""

from __future__ import annotations

import math
from typing import ClassVar

import mlx.core as mx
import mlx.nn as nn

from ._ext import dequantize as _dequantize
from ._layers import matmul, quantize_weight, setup, tensor_scale, wrap

__all__ = ["QuantizedEmbedding", "QuantizedLinear"]


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

    # Whether an nvfp4 layer may hold a tensor scale (nn.quantize's global_scale).
    takes_global_scale: ClassVar[bool] = True

    __module__ = "mlx_fpqmm.nn"

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
        setup(self, mode, group_size, bits)
        scale = math.sqrt(1 / input_dims)
        weight = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        quantize_weight(self, weight, global_scale)
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        x = matmul(self, x)
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
        quantize_weight(ql, linear_layer.weight, global_scale)
        ql.freeze()
        if "bias" in linear_layer:
            ql.bias = linear_layer.bias
        return ql

    @classmethod
    def from_quantized(cls, layer: nn.QuantizedLinear) -> QuantizedLinear:
        """Wrap an fp-mode :obj:`mlx.nn.QuantizedLinear`, sharing its arrays (no copy)."""
        return wrap(cls, layer)


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

    # Whether an nvfp4 layer may hold a tensor scale (nn.quantize's global_scale).
    takes_global_scale: ClassVar[bool] = True

    __module__ = "mlx_fpqmm.nn"

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
        setup(self, mode, group_size, bits)
        weight = mx.random.normal(shape=(num_embeddings, dims), scale=math.sqrt(1 / dims))
        quantize_weight(self, weight, global_scale)
        self.num_embeddings = num_embeddings
        self.dims = dims
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        return _dequantize(
            self["weight"][x],
            self["scales"][x],
            group_size=self.group_size,
            mode=self.mode,
            global_scale=tensor_scale(self),
        )

    def as_linear(self, x: mx.array) -> mx.array:
        """Call the embedding as a quantized linear layer (e.g. a tied output head)."""
        return matmul(self, x)

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
        quantize_weight(ql, embedding_layer.weight, global_scale)
        ql.freeze()
        return ql

    @classmethod
    def from_quantized(cls, layer: nn.QuantizedEmbedding) -> QuantizedEmbedding:
        """Wrap an fp-mode :obj:`mlx.nn.QuantizedEmbedding`, sharing its arrays (no copy)."""
        ql = wrap(cls, layer)
        ql.num_embeddings, ql.dims = layer.num_embeddings, layer.dims
        return ql
