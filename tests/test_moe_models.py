"""Mixture-of-experts models (tiny random configs of real mlx-lm classes) on mlx_fpqmm."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models import deepseek_v3, gpt_oss, mla, phixtral, qwen3_moe
from mlx_lm.models.switch_layers import QuantizedSwitchLinear as MlxLmSwitch
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load_model, save_config, save_model
from reference import ALL_MODES, MLX_MODES, TOLERANCE, qmm_reference, relative_error

import mlx_fpqmm
from mlx_fpqmm.nn import QuantizedMultiLinear, QuantizedSwitchLinear, convert

CONFIGS = {
    # Biased experts, affine routers (as mlx-lm quantizes gpt-oss).
    "gpt_oss": (
        gpt_oss,
        dict(
            model_type="gpt_oss",
            num_hidden_layers=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            vocab_size=256,
            hidden_size=128,
            intermediate_size=128,
            head_dim=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=8,
            rope_theta=150000,
            rope_scaling=None,
            layer_types=None,
        ),
    ),
    "qwen3_moe": (
        qwen3_moe,
        dict(
            model_type="qwen3_moe",
            hidden_size=128,
            num_hidden_layers=2,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            vocab_size=256,
            head_dim=32,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            max_position_embeddings=512,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            moe_intermediate_size=64,
            norm_topk_prob=True,
        ),
    ),
    # Shared experts beside the routed ones, a dense first layer.
    "deepseek_v3": (
        deepseek_v3,
        dict(
            model_type="deepseek_v3",
            vocab_size=256,
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=4,
            routed_scaling_factor=2.5,
            kv_lora_rank=32,
            q_lora_rank=64,
            qk_rope_head_dim=16,
            v_head_dim=32,
            qk_nope_head_dim=32,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            norm_topk_prob=True,
            n_group=1,
            topk_group=1,
            num_experts_per_tok=2,
            moe_layer_freq=1,
            first_k_dense_replace=1,
            max_position_embeddings=512,
            rms_norm_eps=1e-6,
            rope_theta=10000,
            rope_scaling=None,
            attention_bias=False,
        ),
    ),
    # SwitchMLP (not SwitchGLU) experts.
    "phixtral": (
        phixtral,
        dict(
            model_type="phixtral",
            num_vocab=256,
            model_dim=128,
            num_heads=4,
            num_layers=2,
            rotary_dim=16,
            num_experts_per_tok=2,
            num_local_experts=4,
        ),
    ),
}
# T = 1 runs the pairs as they come; at T = 40 (80 pairs) SwitchGLU sorts them.
SHORT = mx.array([[7]])
LONG = mx.array([[(5 * i + 3) % 256 for i in range(40)]])
PROMPT = mx.array([1, 2, 3, 4])


def routers(path: str, module: nn.Module) -> bool:
    return path.split(".")[-1] in ("router", "gate")


def make_model(arch: str, seed: int = 0) -> nn.Module:
    mx.random.seed(seed)
    module, config = CONFIGS[arch]
    return module.Model(module.ModelArgs.from_dict(config))


def mlx_quantized(arch: str, mode: str) -> nn.Module:
    """Quantized by MLX (experts included), routers affine 8-bit as mlx-lm keeps them."""
    model = make_model(arch)

    def predicate(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        if routers(path, module):
            return {"group_size": 64, "bits": 8}
        fmt = mlx_fpqmm.FORMATS[mode]
        return {"mode": mode, "group_size": fmt["default_group_size"], "bits": fmt["bits"]}

    nn.quantize(model, class_predicate=predicate)
    return model


def dequantized(model: nn.Module, arch: str) -> nn.Module:
    """A float model of the same class holding ``model``'s dequantized weights."""
    params = dict(tree_flatten(model.parameters()))
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if "scales" not in m:
            continue
        for key in ("scales", "global_scale"):
            params.pop(f"{path}.{key}", None)
        global_scale = m.get("global_scale")
        matrices = m.weight if m.weight.ndim == 3 else m.weight[None]
        scales = m.scales if m.scales.ndim == 3 else m.scales[None]
        per_matrix = [
            mlx_fpqmm.dequantize(
                matrices[e],
                scales[e],
                group_size=m.group_size,
                mode=m.mode,
                global_scale=global_scale
                if global_scale is None or global_scale.ndim == 0
                else global_scale[e],  # fmt: skip
            )
            for e in range(matrices.shape[0])
        ]
        params[f"{path}.weight"] = mx.stack(per_matrix).reshape(*m.weight.shape[:-1], -1)
    float_model = make_model(arch, seed=2)
    float_model.load_weights(list(params.items()), strict=True)
    return float_model


def logits_error(y: mx.array, ref: mx.array) -> float:
    return (mx.abs(y - ref).max() / mx.abs(ref).max()).item()


def greedy(model: nn.Module) -> list[int]:
    return [int(t) for t, _ in generate_step(PROMPT, model, max_tokens=16)]


# Every architecture in mxfp4; one covers MLX's other modes.
@pytest.mark.parametrize(
    "arch, mode",
    [(arch, "mxfp4") for arch in CONFIGS] + [("qwen3_moe", "nvfp4"), ("qwen3_moe", "mxfp8")],
)
def test_convert_matches_mlx(arch, mode):
    model = mlx_quantized(arch, mode)
    references = [model(tokens) for tokens in (SHORT, LONG)]
    tokens = greedy(model)
    before = dict(tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    report = convert(model)
    after = dict(tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    switch = [p for p, m in before.items() if isinstance(m, MlxLmSwitch)]
    multi = [p for p, m in before.items() if isinstance(m, mla.QuantizedMultiLinear)]
    assert switch and all(report.converted[p] == mode for p in switch + multi)
    assert bool(multi) == (arch == "deepseek_v3")  # its attention's embed_q / unembed_out
    # Left on MLX: only the affine routers.
    assert set(report.skipped.values()) <= {"affine mode"}
    assert all(type(after[p]) is QuantizedSwitchLinear for p in switch)
    assert all(type(after[p]) is QuantizedMultiLinear for p in multi)
    for tokens_in, reference in zip((SHORT, LONG), references, strict=True):
        assert logits_error(model(tokens_in), reference) < 1e-5
    assert greedy(model) == tokens


def multi_linear_calls(dtype: mx.Dtype) -> list[tuple[mx.array, bool]]:
    """``(x, transpose)`` as DeepSeek-V3's attention calls ``embed_q``: a query per head
    (x @ W[h].T), and the latent that the heads share (a head axis of 1: x @ W[h])."""
    query = mx.random.normal((2, 4, 1, 64)).astype(dtype)
    latent = mx.random.normal((2, 1, 7, 32)).astype(dtype)
    return [(query, True), (latent, False)]


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=str)
@pytest.mark.parametrize("mode", MLX_MODES)
def test_multi_linear_matches_mlx_lm(mode, dtype):
    mx.random.seed(0)
    fmt = mlx_fpqmm.FORMATS[mode]
    theirs = mla.MultiLinear(64, 32, 4).to_quantized(fmt["default_group_size"], fmt["bits"], mode)
    ours = QuantizedMultiLinear.from_quantized(theirs)
    assert ours["weight"] is theirs["weight"] and ours["scales"] is theirs["scales"]
    assert isinstance(ours, mla.QuantizedMultiLinear) and not ours.trainable_parameters()
    for x, transpose in multi_linear_calls(dtype):
        y, expected = ours(x, transpose=transpose), theirs(x, transpose=transpose)
        assert y.dtype == expected.dtype and y.shape == expected.shape
        ref = qmm_reference(x, ours.weight, ours.scales, mode, transpose=transpose)
        assert relative_error(y, ref) < TOLERANCE[dtype]
        # Each within TOLERANCE of the exact product, so within twice that of each other.
        assert logits_error(y, expected) < 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_multi_linear_quantized_by_mlx_fpqmm(mode):
    mx.random.seed(1)
    heads = nn.Sequential(mla.MultiLinear(64, 32, 4))
    mlx_fpqmm.nn.quantize(heads, mode=mode)
    layer = heads.layers[0]
    assert type(layer) is QuantizedMultiLinear and layer.mode == mode
    assert layer.weight.shape == (4, 32, 64 * mlx_fpqmm.FORMATS[mode]["bits"] // 32)
    for x, transpose in multi_linear_calls(mx.float32):
        ref = qmm_reference(x, layer.weight, layer.scales, mode, transpose=transpose)
        assert relative_error(layer(x, transpose=transpose), ref) < TOLERANCE[mx.float32]
    fresh = QuantizedMultiLinear(64, 32, 4, mode=mode)
    assert fresh.weight.shape == layer.weight.shape and fresh.scales.shape == layer.scales.shape


def test_multi_linear_has_no_global_scale():
    """The model-wide global_scale passes over the heads (as mlx-lm's does, its
    MultiLinear taking none); a predicate that asks one for them is refused."""
    heads = nn.Sequential(mla.MultiLinear(64, 32, 4), nn.Linear(64, 32))
    mlx_fpqmm.nn.quantize(heads, mode="nvfp4", global_scale=True)
    multi, linear = heads.layers
    assert type(multi) is QuantizedMultiLinear and "global_scale" not in multi
    assert linear.global_scale.shape == ()
    with pytest.raises(ValueError, match="QuantizedMultiLinear has no global_scale"):
        mlx_fpqmm.nn.quantize(
            nn.Sequential(mla.MultiLinear(64, 32, 4)),
            class_predicate=lambda p, m: {"mode": "nvfp4", "global_scale": True},
        )


def test_deepseek_v3_nvfp4_global_scale_quantizes_and_loads(tmp_path):
    """What `python -m mlx_fpqmm.convert --mode nvfp4 --global-scale` does to a model with
    multi-head latent attention: tensor scales everywhere but the heads, whose config
    entries say so, and mlx_fpqmm.load's loader rebuilds the same model."""
    from mlx_fpqmm import _lm

    model = make_model("deepseek_v3")
    _, config = CONFIGS["deepseek_v3"]
    model, config = _lm.quantize_model(
        model, dict(config, model_type="deepseek_v3"), None, "nvfp4", True, verbose=False
    )
    layers = dict(tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    heads = [p for p, m in layers.items() if isinstance(m, QuantizedMultiLinear)]
    scaled = [p for p, m in layers.items() if "global_scale" in m]
    assert heads and scaled
    assert not set(heads) & set(scaled)
    assert all("global_scale" not in config["quantization"][p] for p in heads)
    reference = model(LONG)
    assert logits_error(reference, dequantized(model, "deepseek_v3")(LONG)) < 1e-5
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    loaded, _ = _lm.load_model(tmp_path)  # mlx_fpqmm.load's model
    assert logits_error(loaded(LONG), reference) < 1e-6


@pytest.mark.parametrize("arch", ["gpt_oss", "deepseek_v3"])
def test_save_load_with_mlx_lm_then_convert(tmp_path, arch):
    model = mlx_quantized(arch, "mxfp4")
    reference = model(LONG)
    module, config = CONFIGS[arch]
    config = dict(config, quantization={"group_size": 32, "bits": 4, "mode": "mxfp4"})
    # mlx-lm's loader rebuilds every quantized layer from this entry; the routers
    # are affine, so say so per layer.
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if getattr(m, "mode", None) == "affine":
            config["quantization"][path] = {"group_size": 64, "bits": 8, "mode": "affine"}
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    loaded, _ = load_model(tmp_path)
    assert logits_error(loaded(LONG), reference) < 1e-6
    convert(loaded)
    assert logits_error(loaded(LONG), reference) < 1e-5
    # A strict round trip of the converted model's weights.
    loaded.save_weights(str(tmp_path / "converted.safetensors"))
    fresh = mlx_quantized(arch, "mxfp4")
    convert(fresh)
    fresh.load_weights(str(tmp_path / "converted.safetensors"), strict=True)
    assert logits_error(fresh(LONG), reference) < 1e-5


@pytest.mark.parametrize("mode", ["fp4", "fp8", "nvfp4"])
def test_mlx_fpqmm_quantized_moe_runs_and_round_trips(tmp_path, mode):
    """fp4/fp8 (and nvfp4 with per-expert global scales) MoE models, which MLX
    cannot build, quantized by mlx_fpqmm.nn.quantize."""
    model = make_model("qwen3_moe")
    mlx_fpqmm.nn.quantize(
        model,
        mode=mode,
        global_scale=mode == "nvfp4",
        class_predicate=lambda p, m: hasattr(m, "to_quantized") and not routers(p, m),
    )
    switch = [m for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
              if isinstance(m, MlxLmSwitch)]  # fmt: skip
    assert switch and all(type(m) is QuantizedSwitchLinear and m.mode == mode for m in switch)
    if mode == "nvfp4":
        assert all(m.global_scale.shape == (4,) for m in switch)
    y = model(LONG)
    assert logits_error(y, dequantized(model, "qwen3_moe")(LONG)) < 1e-5
    model.save_weights(str(tmp_path / "model.safetensors"))
    other = make_model("qwen3_moe", seed=1)
    mlx_fpqmm.nn.quantize(
        other,
        mode=mode,
        global_scale=mode == "nvfp4",
        class_predicate=lambda p, m: hasattr(m, "to_quantized") and not routers(p, m),
    )
    other.load_weights(str(tmp_path / "model.safetensors"), strict=True)
    assert logits_error(other(LONG), y) < 1e-6


def test_lora_training_step():
    """mlx-lm's LoRA wraps our switch layers (isinstance holds) and trains."""
    model = mlx_quantized("qwen3_moe", "mxfp4")
    convert(model)
    model.freeze()
    linear_to_lora_layers(
        model, 2, {"rank": 4, "scale": 10.0, "dropout": 0.0, "keys": ["mlp.switch_mlp.up_proj"]}
    )
    trainable = tree_flatten(model.trainable_parameters())
    assert trainable and all("switch_mlp.up_proj" in k for k, _ in trainable)

    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1])
        return nn.losses.cross_entropy(logits, tokens[:, 1:]).mean()

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    optimizer = optim.SGD(learning_rate=0.5)
    before, grads = loss_and_grad(model, LONG)
    optimizer.update(model, grads)
    after, _ = loss_and_grad(model, LONG)
    assert mx.isfinite(before).item() and after.item() < before.item()
