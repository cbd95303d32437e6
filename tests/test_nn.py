"""mlx_fpqmm.nn: drop-in layers, model quantization and conversion, on tiny mlx-lm models."""

import inspect
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models import llama, mla, qwen3
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import dequantize_model, load_model, quantize_model, save_config, save_model
from reference import ALL_MODES, MLX_MODES, TOLERANCE, qmm_reference, relative_error

import mlx_fpqmm
from mlx_fpqmm.nn import QuantizedEmbedding, QuantizedLinear, convert, quantize

CONFIGS = {
    # Untied output head: 15 QuantizedLinear + 1 QuantizedEmbedding.
    "llama": dict(
        model_type="llama",
        hidden_size=256,
        num_hidden_layers=2,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=1024,
        tie_word_embeddings=False,
    ),
    # Tied head: the logits come from QuantizedEmbedding.as_linear.
    "qwen3": dict(
        model_type="qwen3",
        hidden_size=256,
        num_hidden_layers=2,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=1024,
        max_position_embeddings=512,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    ),
}
ARCHS = {"llama": llama, "qwen3": qwen3}
TOKENS = mx.array([[1, 5, 9, 200, 31, 7, 1000, 4], [3, 3, 17, 512, 8, 99, 2, 640]])
PROMPT = mx.array([1, 2, 3, 4])
OURS = {nn.QuantizedLinear: QuantizedLinear, nn.QuantizedEmbedding: QuantizedEmbedding}


def make_model(arch: str, seed: int = 0) -> nn.Module:
    """A float32 model with random weights, the same for the same seed."""
    mx.random.seed(seed)
    module = ARCHS[arch]
    return module.Model(module.ModelArgs.from_dict(CONFIGS[arch]))


def mlx_quantized(arch: str, mode: str) -> nn.Module:
    model = make_model(arch)
    nn.quantize(model, mode=mode)
    return model


def logits_error(y: mx.array, ref: mx.array) -> float:
    return (mx.abs(y - ref).max() / mx.abs(ref).max()).item()


def greedy(model: nn.Module) -> list[int]:
    return [int(t) for t, _ in generate_step(PROMPT, model, max_tokens=16)]


def quantized_leaves(model: nn.Module) -> dict[str, nn.Module]:
    return {
        k: m
        for k, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
        if "scales" in m
    }


def dtypes(model: nn.Module) -> dict:
    return {k: (v.dtype, v.shape) for k, v in tree_flatten(model.parameters())}


# ---------------------------------------------------------------- layers


def test_package_exports():
    assert mlx_fpqmm.convert is convert
    assert mlx_fpqmm.nn.QuantizedLinear is QuantizedLinear
    assert mlx_fpqmm.quantize is not quantize  # the array-level op stays at top level
    assert "convert" in mlx_fpqmm.__all__ and "nn" in mlx_fpqmm.__all__


def signature_pairs():
    """(ours, MLX's or mlx-lm's) for every constructor of our layers, and nn.quantize."""
    fnn = mlx_fpqmm.nn
    pairs = [
        (QuantizedLinear.__init__, nn.QuantizedLinear.__init__),
        (QuantizedLinear.from_linear, nn.QuantizedLinear.from_linear),
        (QuantizedEmbedding.__init__, nn.QuantizedEmbedding.__init__),
        (QuantizedEmbedding.from_embedding, nn.QuantizedEmbedding.from_embedding),
        (fnn.QuantizedSwitchLinear.__init__, QuantizedSwitchLinear.__init__),
        (fnn.QuantizedSwitchLinear.from_switch_linear, SwitchLinear.to_quantized),
        (fnn.QuantizedMultiLinear.__init__, mla.QuantizedMultiLinear.__init__),
        (fnn.QuantizedMultiLinear.from_multi_linear, mla.MultiLinear.to_quantized),
        (quantize, nn.quantize),
    ]
    for name in ("QuantizedAllToShardedLinear", "QuantizedShardedToAllLinear"):
        ours, theirs = getattr(fnn, name), getattr(nn, name)
        pairs += [
            (ours.__init__, theirs.__init__),
            (ours.from_quantized_linear, theirs.from_quantized_linear),
        ]
    return pairs


@pytest.mark.parametrize("ours, theirs", signature_pairs(), ids=lambda f: f.__qualname__)
def test_signatures_follow_mlx(ours, theirs):
    """Every call of MLX's (or mlx-lm's) layer works on ours: the same positional
    parameters in the same order, the same keyword-only ones; ours' extras (such as
    ``global_scale`` where the parent has none) are keyword-only. The first parameter
    (self, cls's argument, the float layer, the model) is left out."""
    mine = list(inspect.signature(ours).parameters.values())[1:]
    parent = list(inspect.signature(theirs).parameters.values())[1:]
    positional = [p for p in parent if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.kind) for p in mine[: len(positional)]] == [
        (p.name, p.kind) for p in positional
    ]
    keyword_only = {p.name for p in mine if p.kind is p.KEYWORD_ONLY}
    assert {p.name for p in parent if p.kind is p.KEYWORD_ONLY} <= keyword_only
    extras = [p.name for p in mine if p.name not in {q.name for q in parent}]
    assert set(extras) <= keyword_only, extras


@pytest.mark.parametrize("mode", ALL_MODES)
def test_linear_from_linear(mode):
    linear = nn.Linear(128, 48)
    layer = QuantizedLinear.from_linear(linear, mode=mode)
    assert isinstance(layer, nn.QuantizedLinear)
    assert layer.mode == mode and layer.bits == mlx_fpqmm.FORMATS[mode]["bits"]
    assert layer.weight.dtype == mx.uint32
    assert sorted(layer.trainable_parameters()) == ["bias"]  # as MLX: bias trainable
    assert layer.biases is None
    x = mx.random.normal((2, 3, 128))
    y = layer(x)
    assert y.shape == (2, 3, 48)
    ref = qmm_reference(x, layer.weight, layer.scales, mode)
    assert relative_error(y - layer.bias, ref) < TOLERANCE[mx.float32]
    if mode in MLX_MODES:
        theirs = nn.QuantizedLinear.from_linear(linear, mode=mode)
        assert dtypes(layer) == dtypes(theirs)
        assert mx.array_equal(layer.weight, theirs.weight)
        assert mx.array_equal(layer.scales, theirs.scales)
        assert mx.allclose(y, theirs(x), atol=1e-5)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_constructor(mode):
    layer = QuantizedLinear(64, 32, bias=False, mode=mode)
    assert "bias" not in layer and layer.trainable_parameters() == {}
    assert layer(mx.ones((64,))).shape == (32,)
    assert "mode=" + mode in repr(layer)


def test_float_scale_group_size():
    layer = QuantizedLinear.from_linear(nn.Linear(256, 16), group_size=128, mode="fp8")
    assert layer.scales.shape == (16, 2) and layer.scales.dtype == mx.float32
    x = mx.random.normal((5, 256))
    ref = qmm_reference(x, layer.weight, layer.scales, "fp8", group_size=128)
    assert relative_error(layer(x) - layer.bias, ref) < TOLERANCE[mx.float32]


def test_bad_modes():
    with pytest.raises(ValueError, match="affine"):
        QuantizedLinear(64, 32, mode="affine")
    with pytest.raises(ValueError, match="8-bit codes but bits=4"):
        QuantizedLinear(64, 32, bits=4, mode="mxfp8")
    with pytest.raises(ValueError, match="global_scale"):
        QuantizedLinear.from_linear(nn.Linear(64, 32), mode="mxfp4", global_scale=True)


def test_nvfp4_global_scale():
    linear = nn.Linear(128, 40)
    layer = QuantizedLinear.from_linear(linear, mode="nvfp4", global_scale=True)
    gs = layer.global_scale
    assert gs.dtype == mx.float32 and gs.shape == ()
    assert gs.item() == mx.abs(linear.weight).max().item()
    assert sorted(layer.trainable_parameters()) == ["bias"]
    expected_w, expected_s = mx.quantize(linear.weight, mode="nvfp4", global_scale=gs)
    assert mx.array_equal(layer.weight, expected_w) and mx.array_equal(layer.scales, expected_s)
    x = mx.random.normal((3, 128))
    ref = qmm_reference(x, layer.weight, layer.scales, "nvfp4", global_scale=gs)
    assert relative_error(layer(x) - layer.bias, ref) < TOLERANCE[mx.float32]

    emb = QuantizedEmbedding.from_embedding(nn.Embedding(64, 128), mode="nvfp4", global_scale=True)
    w = mx.dequantize(emb.weight, emb.scales, mode="nvfp4", global_scale=emb.global_scale)
    assert mx.array_equal(emb(mx.array([3, 0, 63])), w[mx.array([3, 0, 63])])


def test_global_scale_after_set_dtype():
    # Module.set_dtype casts global_scale with the other float parameters (as it would cast
    # mlx-lm's); the layers then multiply with the cast value in float32, as the ops need.
    from mlx_fpqmm.nn import QuantizedSwitchLinear

    layers = {
        "linear": QuantizedLinear(128, 40, mode="nvfp4", global_scale=True),
        "embedding": QuantizedEmbedding(64, 128, mode="nvfp4", global_scale=True),
        "switch": QuantizedSwitchLinear(128, 40, 4, mode="nvfp4", global_scale=True),
    }
    x = mx.random.normal((3, 128)).astype(mx.bfloat16)
    ids = mx.array([3, 0, 1])
    calls = {
        "linear": lambda m: [m(x)],
        "embedding": lambda m: [m(ids), m.as_linear(x)],
        "switch": lambda m: [m(x[:, None, None], ids[:, None])],
    }
    for name, layer in layers.items():
        before = calls[name](layer)
        layer.set_dtype(mx.bfloat16)
        assert layer.global_scale.dtype == mx.bfloat16, name
        after = calls[name](layer)
        layer.global_scale = layer.global_scale.astype(mx.float32)
        for got, same, old in zip(after, calls[name](layer), before, strict=True):
            assert mx.array_equal(got, same), name
            assert (mx.abs(got - old).max() / mx.abs(old).max()).item() < 2**-6, name


@pytest.mark.parametrize("mode", ALL_MODES)
def test_embedding(mode):
    embedding = nn.Embedding(64, 128)
    emb = QuantizedEmbedding.from_embedding(embedding, mode=mode)
    assert isinstance(emb, nn.QuantizedEmbedding)
    assert (emb.num_embeddings, emb.dims) == (64, 128) and emb.trainable_parameters() == {}
    ids = mx.array([[0, 5], [63, 5]])
    rows = emb(ids)
    w = mlx_fpqmm.dequantize(emb.weight, emb.scales, mode=mode)
    assert rows.shape == (2, 2, 128) and mx.array_equal(rows, w[ids])
    x = mx.random.normal((3, 128))
    ref = qmm_reference(x, emb.weight, emb.scales, mode)
    assert relative_error(emb.as_linear(x), ref) < TOLERANCE[mx.float32]
    if mode in MLX_MODES:
        theirs = nn.QuantizedEmbedding.from_embedding(embedding, mode=mode)
        assert dtypes(emb) == dtypes(theirs)
        assert mx.array_equal(rows, theirs(ids))  # same dtype (bfloat16) and values


@pytest.mark.parametrize("mode", MLX_MODES)
def test_grad_through_x_matches_mlx(mode):
    linear = nn.Linear(128, 64)
    ours = QuantizedLinear.from_linear(linear, mode=mode)
    theirs = nn.QuantizedLinear.from_linear(linear, mode=mode)
    x = mx.random.normal((4, 128))
    cot = mx.random.normal((4, 64))

    def grads(layer):
        return mx.grad(lambda x, b: ((layer(x) + b) * cot).sum(), argnums=(0, 1))(x, layer.bias)

    for g_ours, g_theirs in zip(grads(ours), grads(theirs), strict=True):
        assert mx.allclose(g_ours, g_theirs, atol=1e-5)


# ---------------------------------------------------------------- quantize(model)


def test_quantize_predicate_contract():
    model = make_model("llama")
    seen = []

    def predicate(path, m):
        seen.append(path)
        if path.endswith("q_proj"):
            return {"mode": "fp8", "group_size": 64}
        if path.endswith("k_proj"):
            return {"group_size": 64, "bits": 8}  # no mode: affine, as in mlx.nn.quantize
        if path.endswith("v_proj"):
            return {"mode": "nvfp4", "quantize_input": False}
        if path == "model.embed_tokens":
            return False
        return hasattr(m, "to_quantized")

    quantize(model, mode="fp4", class_predicate=predicate)
    assert "model.layers.1.mlp.down_proj" in seen and "model.norm" in seen  # leaves, dotted
    attn = model.layers[0].self_attn
    assert (type(attn.q_proj), attn.q_proj.mode, attn.q_proj.group_size) == (
        QuantizedLinear,
        "fp8",
        64,
    )
    assert type(attn.k_proj) is nn.QuantizedLinear and attn.k_proj.mode == "affine"
    assert type(attn.v_proj) is QuantizedLinear and attn.v_proj.mode == "nvfp4"
    assert type(attn.o_proj) is QuantizedLinear and attn.o_proj.mode == "fp4"
    assert type(model.model.embed_tokens) is nn.Embedding
    assert model(TOKENS).shape == (2, 8, 1024)


class OwnQuantized(nn.Linear):
    """A Linear with its own to_quantized (as mlx-lm's afm7.FusedLinear): left to it."""

    def to_quantized(self, **kwargs):
        return nn.QuantizedLinear.from_linear(self, **kwargs)


class PlainSubclass(nn.Linear):
    pass


def test_quantize_defaults_and_errors():
    model = make_model("qwen3")
    quantize(model)  # mxfp4 by default
    assert {type(m).__name__ + m.mode for m in quantized_leaves(model).values()} == {
        "QuantizedLinearmxfp4",
        "QuantizedEmbeddingmxfp4",
    }

    affine = make_model("llama")
    quantize(affine, mode="affine")  # left to MLX
    assert {type(m) for m in quantized_leaves(affine).values()} == {
        nn.QuantizedLinear,
        nn.QuantizedEmbedding,
    }

    with pytest.raises(ValueError, match="must return a bool or a dict"):
        quantize(make_model("llama"), class_predicate=lambda p, m: "yes")
    with pytest.raises(ValueError, match="Unable to quantize"):
        quantize(make_model("llama"), class_predicate=lambda p, m: True)  # RMSNorm
    with pytest.raises(ValueError, match="OwnQuantized with its own to_quantized"):
        quantize(nn.Sequential(OwnQuantized(64, 32)), mode="fp8")
    layers = nn.Sequential(OwnQuantized(64, 32), PlainSubclass(64, 32))
    quantize(layers)
    assert [type(m) for m in layers.layers] == [nn.QuantizedLinear, QuantizedLinear]
    # mlx-lm's experts become mlx_fpqmm's switch layer, in every mode.
    for mode in ("fp4", "nvfp4"):
        experts = nn.Sequential(SwitchLinear(64, 32, 4))
        quantize(experts, mode=mode, global_scale=mode == "nvfp4")
        assert type(experts.layers[0]) is mlx_fpqmm.nn.QuantizedSwitchLinear
        assert isinstance(experts.layers[0], QuantizedSwitchLinear)
    assert experts.layers[0].global_scale.shape == (4,)


def test_quantize_takes_mlx_s_arguments():
    """bits and quantize_input as nn.quantize takes them: bits checked against an fp mode
    and passed to affine, quantize_input left to MLX (its QQLinear)."""
    eights = nn.Sequential(nn.Linear(64, 32))
    quantize(eights, None, 8, mode="mxfp8")
    assert type(eights.layers[0]) is QuantizedLinear and eights.layers[0].bits == 8
    with pytest.raises(ValueError, match="bits=4 was given"):
        quantize(nn.Sequential(nn.Linear(64, 32)), bits=4, mode="mxfp8")
    affine = nn.Sequential(nn.Linear(64, 32))
    quantize(affine, 32, 8, mode="affine")
    assert type(affine.layers[0]) is nn.QuantizedLinear
    assert (affine.layers[0].group_size, affine.layers[0].bits) == (32, 8)
    activations = nn.Sequential(nn.Linear(64, 32, bias=False))
    quantize(activations, mode="nvfp4", quantize_input=True)
    assert type(activations.layers[0]) is nn.QQLinear


def gaussian_weights(model: nn.Module) -> nn.Module:
    """Normal weights, like trained ones (the uniform init's power-of-two bound flatters E8M0)."""
    model.update(
        tree_map(
            lambda w: mx.random.normal(w.shape) * w.shape[-1] ** -0.5 if w.ndim == 2 else w,
            model.parameters(),
        )
    )
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_float_scale_modes_error(arch):
    def model():
        return gaussian_weights(make_model(arch))

    tokens = mx.random.randint(0, 1024, (2, 32))
    ref = model()(tokens)
    errors = {}
    for mode in ("fp4", "mxfp4", "fp8", "mxfp8"):
        m = model()
        quantize(m, mode=mode)
        y = m(tokens)
        errors[mode] = (mx.sqrt(mx.mean((y - ref) ** 2) / mx.mean(ref**2))).item()
    assert errors["fp4"] < 0.5 and errors["fp8"] < 0.15, errors
    assert errors["fp4"] < 0.97 * errors["mxfp4"], errors
    assert errors["fp8"] < 0.97 * errors["mxfp8"], errors


# ---------------------------------------------------------------- convert


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", MLX_MODES)
def test_convert_matches_mlx(arch, mode):
    model = mlx_quantized(arch, mode)
    before = quantized_leaves(model)
    ref = model(TOKENS)
    ref_tokens = greedy(model)

    report = convert(model)

    assert report.converted == {k: mode for k in before} and report.skipped == {}
    after = quantized_leaves(model)
    for path, old in before.items():
        new = after[path]
        assert type(new) is OURS[type(old)]
        assert new.weight is old.weight and new.scales is old.scales  # shared, not copied
    assert logits_error(model(TOKENS), ref) < TOLERANCE[mx.float32]
    assert greedy(model) == ref_tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_convert_bfloat16_model(arch):
    """In bfloat16 both differ from float32 compute; ours (fp32 accumulation) no more than MLX."""
    model = make_model(arch)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, mode="mxfp4")
    theirs = model(TOKENS)
    model.set_dtype(mx.float32)  # the same quantized weights, float32 activations
    ref = model(TOKENS)
    convert(model)
    model.set_dtype(mx.bfloat16)
    ours = model(TOKENS)
    assert ours.dtype == mx.bfloat16
    assert logits_error(ours, ref) <= min(logits_error(theirs, ref), TOLERANCE[mx.bfloat16])


def test_convert_keeps_state_and_reports():
    model = mlx_quantized("llama", "mxfp4")
    model.model.layers[0].self_attn.q_proj.unfreeze(keys=["scales"])
    model.eval()
    model.model.layers[1].mlp.up_proj = nn.QuantizedLinear(256, 512, False, mode="affine")
    model.model.layers[1].mlp.down_proj = nn.QQLinear(512, 256)
    model.model.layers[1].mlp.down_proj.eval()  # quantized weights and scales

    report = convert(model)

    q = model.model.layers[0].self_attn.q_proj
    assert type(q) is QuantizedLinear and sorted(q.trainable_parameters()) == ["scales"]
    assert not q.training
    assert report.skipped == {
        "model.layers.1.mlp.up_proj": "affine mode",
        "model.layers.1.mlp.down_proj": "QQLinear not handled",
    }
    assert len(report.converted) == 14
    assert str(report) == (
        "converted 14 layers (14 x mxfp4); left 2 quantized layers alone "
        "(1 x QQLinear not handled, 1 x affine mode)"
    )
    again = convert(model)
    assert again.converted == {} and len(again.skipped) == 16


def test_mlx_lm_utilities_see_our_layers():
    model = mlx_quantized("llama", "mxfp8")
    ref = model(TOKENS)
    convert(model)
    dequantize_model(model)  # isinstance(m, nn.QuantizedLinear) holds for ours
    assert not quantized_leaves(model)
    assert logits_error(model(TOKENS), ref) < 1e-5


@pytest.mark.parametrize("mode", MLX_MODES)
def test_save_load_convert(tmp_path, mode):
    model = make_model("qwen3")
    config = dict(CONFIGS["qwen3"])

    def predicate(path, m):  # mixed modes, as model-specific predicates produce
        if path == "model.layers.0.self_attn.o_proj":
            return {"group_size": 64, "bits": 8}  # affine, like gpt_oss's routers
        if path == "model.layers.1.self_attn.v_proj":
            return {"group_size": 32, "bits": 8, "mode": "mxfp8"}
        return True

    model, config = quantize_model(model, config, None, None, mode=mode, quant_predicate=predicate)
    ref = model(TOKENS)
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")

    loaded, _ = load_model(tmp_path)
    report = convert(loaded)

    assert report.skipped == {"model.layers.0.self_attn.o_proj": "affine mode"}
    assert report.converted["model.layers.1.self_attn.v_proj"] == "mxfp8"
    assert report.converted["model.embed_tokens"] == mode and len(report.converted) == 14
    assert logits_error(loaded(TOKENS), ref) < TOLERANCE[mx.float32]


@pytest.mark.parametrize("mode", MLX_MODES)
def test_strict_load_both_ways(tmp_path, mode):
    theirs = mlx_quantized("llama", mode)
    ref = theirs(TOKENS)
    theirs.save_weights(str(tmp_path / "mlx.safetensors"))

    ours = make_model("llama", seed=1)
    quantize(ours, mode=mode)
    assert dtypes(ours) == dtypes(theirs)  # load_weights checks shapes, not dtypes
    ours.load_weights(str(tmp_path / "mlx.safetensors"), strict=True)
    assert logits_error(ours(TOKENS), ref) < TOLERANCE[mx.float32]

    ours.save_weights(str(tmp_path / "ours.safetensors"))
    back = make_model("llama", seed=2)
    nn.quantize(back, mode=mode)
    back.load_weights(str(tmp_path / "ours.safetensors"), strict=True)
    assert mx.array_equal(back(TOKENS), ref)


@pytest.mark.parametrize(
    "kwargs", [{"mode": "fp4"}, {"mode": "fp8"}, {"mode": "nvfp4", "global_scale": True}]
)
def test_weights_round_trip_of_our_modes(tmp_path, kwargs):
    model = make_model("qwen3")
    quantize(model, **kwargs)
    ref = model(TOKENS)
    model.save_weights(str(tmp_path / "w.safetensors"))
    again = make_model("qwen3", seed=1)
    quantize(again, **kwargs)
    again.load_weights(str(tmp_path / "w.safetensors"), strict=True)
    assert dtypes(again) == dtypes(model)
    assert mx.array_equal(again(TOKENS), ref)


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4"])
def test_lora_step_matches_mlx(mode):
    lora_config = {"rank": 4, "scale": 10.0, "dropout": 0.0}

    def lora_model(convert_first):
        model = mlx_quantized("llama", mode)
        if convert_first:
            convert(model)
        model.freeze()
        mx.random.seed(3)
        linear_to_lora_layers(model, 2, lora_config)
        # A nonzero lora_b, so that every adapter gets a gradient.
        adapters = tree_map(
            lambda p: mx.random.normal(p.shape) * 0.01, model.trainable_parameters()
        )
        model.update(adapters)
        return model

    inputs, targets = TOKENS[:, :-1], TOKENS[:, 1:]

    def loss_fn(model):
        return nn.losses.cross_entropy(model(inputs), targets).mean()

    results = []
    for convert_first in (False, True):
        model = lora_model(convert_first)
        loss, grads = nn.value_and_grad(model, loss_fn)(model)
        optim.SGD(learning_rate=0.1).update(model, grads)
        results.append((loss, grads, loss_fn(model)))

    (loss_a, grads_a, after_a), (loss_b, grads_b, after_b) = results
    grads_a, grads_b = dict(tree_flatten(grads_a)), dict(tree_flatten(grads_b))
    assert len(grads_a) == 2 * 7 * 2 and grads_a.keys() == grads_b.keys()
    assert abs(loss_a.item() - loss_b.item()) < 1e-5
    for key, g in grads_a.items():
        assert mx.abs(g).max().item() > 0, key
        assert mx.allclose(grads_b[key], g, rtol=1e-4, atol=1e-6), key
    assert abs(after_a.item() - after_b.item()) < 1e-5
