"""The mlx-lm workflow in every mode: convert a checkpoint, load it, generate.

:func:`convert_checkpoint` is ``mlx_lm.convert --quantize`` with :func:`mlx_fpqmm.nn.quantize`
doing the quantizing (all five modes, experts included); :func:`load` is ``mlx_lm.load``
building mlx_fpqmm's layers. Both reuse mlx-lm's own loading and saving code, so mlx-lm is
imported on first use only (it stays an optional dependency of mlx_fpqmm).

Models in ``mxfp4``, ``nvfp4`` and ``mxfp8`` are written exactly as mlx-lm writes them, and
``mlx_lm.load`` reads them. Layers that mlx-lm cannot rebuild (``fp4``, ``fp8``, and any
layer with an ``nvfp4`` global scale) are recorded in ``config.json`` under a tagged mode
name, e.g. ``"fp4 (load with mlx_fpqmm.load)"``: ``mlx_lm.load`` stops on it with MLX's
``Invalid quantization mode 'fp4 (load with mlx_fpqmm.load)'``, and :func:`load` reads the
mode before the tag.
"""

from __future__ import annotations

import copy
import glob
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from . import nn as fpnn
from ._formats import FORMATS, MLX_MODES, resolve_mode

__all__ = ["MLX_MODES", "convert_checkpoint", "load", "load_model", "quantize_model"]

TAG = " (load with mlx_fpqmm.load)"
"""Appended to the mode names in ``config.json`` that mlx-lm cannot load."""

# mlx-lm's mixed recipes give some layers more bits; here those layers get the 8-bit
# format of the same family.
_WIDER = {"mxfp4": "mxfp8", "nvfp4": "mxfp8", "fp4": "fp8"}


def config_mode(mode: str) -> str:
    """The mode named by a ``config.json`` entry (which may carry :data:`TAG`)."""
    return mode[: -len(TAG)] if mode.endswith(TAG) else mode


def _tagged(params: dict) -> dict:
    """``params`` as ``config.json`` records it: tagged when mlx-lm cannot build the layer."""
    mode = params.get("mode", "affine")
    if mode in FORMATS and (mode not in MLX_MODES or params.get("global_scale")):
        # No global_scale key (MLX's to_quantized would fail on it before reading the mode):
        # the saved global_scale array says it.
        params = {k: v for k, v in params.items() if k != "global_scale"}
        params["mode"] = mode + TAG
    return params


def _recipe_predicate(recipe: str, model: nn.Module, mode: str, group_size: int) -> Callable:
    """mlx-lm's ``--quant-predicate`` recipe in ``mode``: its high-bit layers get the 8-bit
    format of the family (``mxfp8`` for ``mxfp4``/``nvfp4``, ``fp8`` for ``fp4``). Layers the
    model's own ``quant_predicate`` sets apart (routers, gates) stay as it says."""
    from mlx_lm.convert import mixed_quant_predicate_builder

    wider = _WIDER.get(mode)
    if wider is None:
        raise ValueError(f"Quant predicates need a 4-bit mode ({', '.join(_WIDER)}), not {mode}.")
    affine = mixed_quant_predicate_builder(recipe, model, group_size)
    low_bits = min(affine(p, m)["bits"] for p, m in model.named_modules())
    own = getattr(model, "quant_predicate", None)

    def predicate(path: str, module: nn.Module) -> bool | dict:
        # The model's own choices (e.g. 8-bit affine routers) come first.
        if own is not None and (chosen := own(path, module)) is not True:
            return chosen
        if affine(path, module)["bits"] > low_bits:
            # fp8 takes fp4's group sizes; mxfp8 has its one.
            wide_group = group_size if wider == "fp8" else FORMATS[wider]["default_group_size"]
            return {"group_size": wide_group, "mode": wider}
        return {"group_size": group_size, "mode": mode}

    return predicate


def quantize_model(
    model: nn.Module,
    config: dict,
    group_size: int | None = None,
    mode: str = "mxfp4",
    global_scale: bool = False,
    quant_predicate: Callable[[str, nn.Module], bool | dict] | None = None,
    verbose: bool = True,
) -> tuple[nn.Module, dict]:
    """``mlx_lm.utils.quantize_model`` on :func:`mlx_fpqmm.nn.quantize`.

    Same rules as mlx-lm's: the model's own ``quant_predicate`` (e.g. 8-bit affine routers
    and gates) unless ``quant_predicate`` is given, layers whose input size the group size
    does not divide stay in float, and every layer quantized differently from the top-level
    entry gets an entry of its own in ``config["quantization"]``. Layers mlx-lm cannot build
    (see the module docstring) get a tagged entry each.

    Returns:
        The model (quantized in place) and the new config.
    """
    group_size, bits = resolve_mode(mode, group_size, None)
    quant_params = {"group_size": group_size, "bits": bits, "mode": mode}
    if global_scale:
        quant_params["global_scale"] = True
    quantized_config = copy.deepcopy(config)
    quant_predicate = quant_predicate or getattr(model, "quant_predicate", None)
    # A model that is already partly quantized (e.g. a checkpoint with mxfp4 experts) keeps
    # its entry, and every layer quantized here gets one of its own, as in mlx-lm.
    fine_grained = "quantization" in quantized_config
    if fine_grained:
        entries: dict[str, Any] = dict(quantized_config["quantization"])
    else:
        entries = dict(_tagged(quant_params))

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if not hasattr(module, "to_quantized"):
            return False
        params = quant_predicate(path, module) if quant_predicate else True
        if not params:
            return False
        takes_global_scale = fpnn._takes_global_scale(module)
        if params is True:
            params = dict(quant_params)
            if not takes_global_scale:
                params.pop("global_scale", None)
        else:
            params = dict(params)
            if params.get("mode", "affine") in FORMATS:
                params["group_size"], params["bits"] = resolve_mode(
                    params["mode"], params.get("group_size"), params.get("bits")
                )
        # Layers whose input size the (layer's) group size does not divide stay float.
        if module.weight.shape[-1] % params.get("group_size", group_size) != 0:
            return False
        if global_scale and params.get("mode") == "nvfp4" and takes_global_scale:
            params["global_scale"] = True
        # mlx-lm infers MLX's modes from the weights; everything else is written down.
        recorded = _tagged(params)
        # A tagged layer always gets its entry (``recorded`` differs from the untagged
        # ``quant_params``): mlx-lm reads a layer's mode from its entry, and stops on the
        # tag, but takes a layer without one for affine (a missing-biases error).
        if fine_grained or recorded != quant_params:
            entries[path] = recorded
        return params

    fpnn.quantize(
        model, group_size, mode=mode, global_scale=global_scale, class_predicate=predicate
    )
    # The quantization runs here, layer by layer, with a progress bar (MLX is lazy: it
    # would otherwise all happen at save time).
    from tqdm import tqdm  # an mlx-lm dependency

    layers = [m for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)]
    for layer in tqdm(layers, desc="quantizing", unit="layer", disable=not (verbose and layers)):
        mx.eval(layer.parameters())
    quantized_config["quantization"] = entries
    quantized_config["quantization_config"] = entries
    from mlx_lm.utils import compute_bits_per_weight

    if verbose:
        print(f"[INFO] Quantized model with {compute_bits_per_weight(model):.3f} bits per weight.")
    return model, quantized_config


def convert_checkpoint(
    hf_path: str,
    mlx_path: str | Path = "mlx_model",
    mode: str = "mxfp4",
    group_size: int | None = None,
    global_scale: bool = False,
    dtype: str | None = None,
    quant_predicate: str | Callable | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    verbose: bool = True,
) -> None:
    """``mlx_lm.convert(hf_path, mlx_path, quantize=True, q_mode=mode, ...)`` for all five modes.

    Loads with :func:`load` (a model that is partly quantized already, such as gpt-oss's
    mxfp4 experts, keeps those layers), casts as mlx-lm does (``dtype``, else the config's
    ``torch_dtype``), quantizes with :func:`quantize_model` and writes with mlx-lm's ``save``
    (safetensors shards, ``config.json``, tokenizer files, model card).

    Raises:
        ValueError: ``mode`` or ``group_size`` is invalid, ``mlx_path`` exists, or the
            model has no float layer left to quantize.
    """
    from mlx_lm.convert import MODEL_CONVERSION_DTYPES
    from mlx_lm.utils import save

    group_size, _ = resolve_mode(mode, group_size, None)  # before anything loads
    mlx_path = Path(mlx_path)
    if mlx_path.exists():
        raise ValueError(
            f"Cannot save to the path {mlx_path} as it already exists."
            " Please delete the file/directory or specify a new path to save to."
        )
    say = print if verbose else (lambda *_: None)
    say("[INFO] Loading")
    model, tokenizer, config = load(
        hf_path,
        revision=revision,
        return_config=True,
        tokenizer_config={"trust_remote_code": trust_remote_code},
        lazy=True,
        trust_remote_code=trust_remote_code,
    )
    layers = [m for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)]
    if not any(hasattr(m, "to_quantized") for m in layers):
        modes = sorted({m.mode for m in layers if "scales" in m})
        raise ValueError(
            f"{hf_path} is quantized already ({', '.join(modes)}): no float layer is left "
            f"to quantize in {mode}; convert its float checkpoint instead."
        )
    if isinstance(quant_predicate, str):
        quant_predicate = _recipe_predicate(quant_predicate, model, mode, group_size)
    if dtype is None:
        dtype = config.get("torch_dtype", None)
    if dtype is None and (text_config := config.get("text_config", None)):
        dtype = text_config.get("dtype", None)
    if dtype in MODEL_CONVERSION_DTYPES:
        say("[INFO] Using dtype:", dtype)
        dtype = getattr(mx, dtype)
        cast_predicate = getattr(model, "cast_predicate", lambda _: True)

        def set_dtype(k, v):
            # The layers quantized already keep their scales' types (float scales, and
            # nvfp4's float32 tensor scale, which the op requires).
            if k.endswith((".scales", ".global_scale")):
                return v
            if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating):
                return v.astype(dtype)
            return v

        model.update(tree_map_with_path(set_dtype, model.parameters()))
    say(f"[INFO] Quantizing ({mode})")
    model, config = quantize_model(
        model, config, group_size, mode, global_scale, quant_predicate, verbose
    )
    save(mlx_path, hf_path, model, tokenizer, config)
    say(f"[INFO] Saved to {mlx_path}")


def _load_predicate(quantization: dict, weights: dict) -> Callable:
    """mlx-lm's ``load_model`` predicate, reading tagged modes and float-scale formats."""
    from mlx_lm.utils import infer_quant_config

    default_mode = config_mode(quantization.get("mode", "affine"))

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if path in quantization:
            params = quantization[path]
            if isinstance(params, dict):
                params = {**params, "mode": config_mode(params.get("mode", "affine"))}
                if f"{path}.global_scale" in weights:
                    params["global_scale"] = True
            return params
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        if default_mode in FORMATS and FORMATS[default_mode]["scales"] == "float":
            # Float scales read as affine to mlx-lm; the entry names the mode.
            in_dims = module.weight.shape[-1]
            params = {
                "group_size": in_dims // weights[f"{path}.scales"].shape[-1],
                "mode": default_mode,
            }
        else:
            params = infer_quant_config(path, module, weights)
        if f"{path}.global_scale" in weights:
            params["global_scale"] = True
        return params

    return predicate


def load_model(
    model_path: Path,
    lazy: bool = False,
    strict: bool = True,
    model_config: dict | None = None,
    trust_remote_code: bool = False,
) -> tuple[nn.Module, dict]:
    """``mlx_lm.utils.load_model`` building mlx_fpqmm's layers, in every mode.

    A config with a ``quantization`` entry (what mlx-lm and :func:`convert_checkpoint` write)
    is read here: the model class comes from mlx-lm, the layers from
    :func:`mlx_fpqmm.nn.quantize`, and the weights load strictly. Anything else (float
    models, Hugging Face ``quantization_config`` formats) goes through mlx-lm's
    ``load_model``. Either way, MLX-mode layers end up on mlx_fpqmm
    (:func:`mlx_fpqmm.convert`).

    Raises:
        ValueError: The config (or ``model_config``) asks for ``quantize_activations``,
            mlx-lm's activation-quantized layers, which run on MLX's kernels.
    """
    from mlx_lm import utils as lm_utils

    model_path = Path(model_path)
    config = lm_utils.load_config(model_path)
    if model_config is not None:
        config.update(model_config)
    if config.get("quantize_activations", False):
        raise ValueError(
            "quantize_activations: mlx_fpqmm's layers quantize the weights only; mlx-lm's "
            "QQLinear (activations quantized too) runs on MLX's kernels: load this model "
            "with mlx_lm.load."
        )
    quantization = config.get("quantization")
    if quantization is None or config.get("model_file") is not None:
        model, config = lm_utils.load_model(
            model_path,
            lazy,
            strict,
            model_config=model_config,
            trust_remote_code=trust_remote_code,
        )
        fpnn.convert(model)
        return model, config

    weight_files = glob.glob(str(model_path / "model*.safetensors"))
    if not weight_files and strict:
        raise FileNotFoundError(f"No safetensors found in {model_path}")
    weights = {}
    for wf in weight_files:
        weights.update(mx.load(wf))
    model_class, model_args_class = lm_utils._get_classes(config=config)
    model = model_class(model_args_class.from_dict(config))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    fpnn.quantize(
        model,
        quantization.get("group_size"),
        mode=config_mode(quantization.get("mode", "affine")),
        class_predicate=_load_predicate(quantization, weights),
    )
    fpnn.convert(model)
    model.eval()
    model.load_weights(list(weights.items()), strict=strict)
    if not lazy:
        mx.eval(model.parameters())
    return model, config


def load(
    path_or_hf_repo: str,
    tokenizer_config: dict | None = None,
    model_config: dict | None = None,
    adapter_path: str | None = None,
    lazy: bool = False,
    return_config: bool = False,
    revision: str | None = None,
    trust_remote_code: bool = False,
):
    """``mlx_lm.load`` for models in any of mlx_fpqmm's modes: ``(model, tokenizer)``.

    Same arguments and return value as ``mlx_lm.load``. The quantized layers are
    mlx_fpqmm's: ``fp4``, ``fp8`` and ``nvfp4`` with a global scale (which mlx-lm cannot
    build) as well as the MLX modes of models saved by mlx-lm. ``affine`` layers (e.g.
    routers) stay MLX's.
    """
    from mlx_lm import utils as lm_utils

    model_path = lm_utils._download(path_or_hf_repo, revision=revision)
    model, config = load_model(
        model_path, lazy, model_config=model_config, trust_remote_code=trust_remote_code
    )
    if adapter_path is not None:
        model = lm_utils.load_adapters(model, adapter_path)
        model.eval()
    tokenizer = lm_utils.load_tokenizer(
        model_path, tokenizer_config, eos_token_ids=config.get("eos_token_id", None)
    )
    if return_config:
        return model, tokenizer, config
    return model, tokenizer
