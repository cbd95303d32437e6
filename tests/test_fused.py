"""mlx_fpqmm.nn.fuse_projections: sibling projections (q/k/v, gate/up) as one product."""

import os
import pickle

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download

import mlx.core as mx
import mlx.nn as nn
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models import llama, qwen3
from reference import ALL_MODES

import mlx_fpqmm
from mlx_fpqmm import _fused, _layers
from mlx_fpqmm.nn import FusedQuantizedLinear, QuantizedLinear, fuse_projections, quantize

COMMON = dict(
    hidden_size=256,
    num_hidden_layers=2,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    tie_word_embeddings=False,
)
ARCHS = {
    "llama": (llama, dict(model_type="llama", rms_norm_eps=1e-5, **COMMON)),
    "qwen3": (
        qwen3,
        dict(
            model_type="qwen3",
            rms_norm_eps=1e-6,
            head_dim=64,
            max_position_embeddings=512,
            rope_theta=10000.0,
            **COMMON,
        ),
    ),
}
TOKENS = mx.array([[1, 5, 9, 200, 31, 7, 1000, 4], [3, 3, 17, 512, 8, 99, 2, 640]])


def quantized_model(arch: str, mode: str, **kwargs) -> nn.Module:
    module, config = ARCHS[arch]
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(config))
    quantize(model, mode=mode, **kwargs)
    return model


def max_error(y: mx.array, ref: mx.array) -> float:
    return (mx.abs(y - ref).max() / mx.abs(ref).max()).item()


class Products:
    """Counts the products run by fused groups and by layers on their own."""

    def __init__(self, monkeypatch):
        self.fused = self.separate = 0

        def counting(module, field):
            def qmm_for_mode(mode):
                op = mlx_fpqmm.qmm_for_mode(mode)

                def counted(*args, **kwargs):
                    setattr(self, field, getattr(self, field) + 1)
                    return op(*args, **kwargs)

                return counted

            monkeypatch.setattr(module, "qmm_for_mode", qmm_for_mode)

        counting(_fused, "fused")
        counting(_layers, "separate")


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_model_matches_separate_layers(arch, mode, monkeypatch):
    separate = quantized_model(arch, mode)
    model = quantized_model(arch, mode)
    paths = fuse_projections(model)
    assert sorted(paths) == sorted(
        f"model.layers.{i}.{name}"
        for i in range(2)
        for name in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
            "mlp.up_proj",
        )
    )  # fmt: skip
    attention = model.layers[0].self_attn
    assert isinstance(attention.q_proj, FusedQuantizedLinear)
    assert isinstance(attention.q_proj, QuantizedLinear)  # mlx-lm's checks still hold
    assert attention.k_proj.weight.shape == separate.layers[0].self_attn.k_proj.weight.shape

    products = Products(monkeypatch)
    y = model(TOKENS)
    # One product a group and layer; o_proj, down_proj and the head on their own.
    assert (products.fused, products.separate) == (2 * 2, 2 * 2 + 1)
    assert max_error(y, separate(TOKENS)) <= 1e-6


def test_parameters_and_weights_stay_those_of_the_separate_layers(tmp_path):
    separate = quantized_model("llama", "mxfp4")
    model = quantized_model("llama", "mxfp4")
    fuse_projections(model)
    shapes = {k: (v.shape, v.dtype) for k, v in tree_flatten(model.parameters())}
    assert shapes == {k: (v.shape, v.dtype) for k, v in tree_flatten(separate.parameters())}
    trainable = [k for k, _ in tree_flatten(model.trainable_parameters())]
    assert trainable == [k for k, _ in tree_flatten(separate.trainable_parameters())]
    assert not any(k.endswith(("weight", "scales")) and "proj" in k for k in trainable)

    model.save_weights(str(tmp_path / "fused.safetensors"))
    plain = quantized_model("llama", "mxfp4")
    plain.load_weights(str(tmp_path / "fused.safetensors"), strict=True)
    assert max_error(plain(TOKENS), separate(TOKENS)) == 0.0


def test_groups_used_otherwise_go_back_to_separate_products(monkeypatch):
    separate = quantized_model("llama", "mxfp4")
    x, other = (mx.random.normal((3, 256), key=mx.random.key(k)) for k in (1, 2))
    reference = separate.layers[1].mlp
    expected = {
        (name, id(v)): getattr(reference, name)(v)
        for name in ("gate_proj", "up_proj")
        for v in (x, other)
    }

    def check(mlp, calls):
        for name, v in calls:
            assert max_error(getattr(mlp, name)(v), expected[name, id(v)]) <= 1e-6

    model = quantized_model("llama", "mxfp4")
    fuse_projections(model)
    mlp = model.layers[1].mlp
    products = Products(monkeypatch)
    check(mlp, [("gate_proj", x), ("up_proj", x), ("up_proj", other), ("gate_proj", other)])
    assert (products.fused, products.separate) == (2, 0)
    # A layer called again before its sibling took the last product: shared no more.
    check(mlp, [("up_proj", x), ("up_proj", other), ("gate_proj", other), ("gate_proj", x)])
    assert (products.fused, products.separate) == (3, 3)
    assert mlp.up_proj._siblings is None and mlp.gate_proj._siblings is None

    # A replaced weight is the layer's own again, and its sibling multiplies on its own.
    model = quantized_model("llama", "mxfp4")
    fuse_projections(model)
    mlp = model.layers[1].mlp
    mlp.up_proj.weight = reference.up_proj.weight + 0
    mlp.up_proj.scales = reference.up_proj.scales + 0
    products = Products(monkeypatch)
    check(mlp, [("up_proj", x), ("gate_proj", x), ("gate_proj", other)])
    assert (products.fused, products.separate) == (0, 3)


def test_training_runs_on_separate_products():
    separate = quantized_model("llama", "mxfp4")
    model = quantized_model("llama", "mxfp4")
    fuse_projections(model)

    def loss(m):
        return m(TOKENS).astype(mx.float32).square().mean()

    value, grads = nn.value_and_grad(model, loss)(model)
    expected_value, expected_grads = nn.value_and_grad(separate, loss)(separate)
    assert abs(value.item() - expected_value.item()) <= 1e-6 * abs(expected_value.item())
    for (k, g), (k2, g2) in zip(tree_flatten(grads), tree_flatten(expected_grads), strict=True):
        assert k == k2 and max_error(g, g2) <= 1e-5, k
    assert max_error(model(TOKENS), separate(TOKENS)) <= 1e-6


def test_biases_are_each_layers_own():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = QuantizedLinear(256, 128, bias=True, mode="mxfp8")
            self.k_proj = QuantizedLinear(256, 64, bias=True, mode="mxfp8")
            self.v_proj = QuantizedLinear(256, 64, bias=False, mode="mxfp8")
            for layer in (self.q_proj, self.k_proj):
                layer.bias = mx.random.normal(layer.bias.shape)

        def __call__(self, x):
            return [self.q_proj(x), self.k_proj(x), self.v_proj(x)]

    block = Attention()
    x = mx.random.normal((2, 5, 256))
    before = block(x)
    assert fuse_projections(block) == ["q_proj", "k_proj", "v_proj"]
    for y, ref in zip(block(x), before, strict=True):
        assert y.shape == ref.shape and max_error(y, ref) <= 1e-6


def test_what_is_not_fused():
    # A tensor scale per layer: one product cannot apply three.
    assert fuse_projections(quantized_model("llama", "nvfp4", global_scale=True)) == []

    class Mixed(nn.Module):
        def __init__(self, modes, dims):
            super().__init__()
            self.gate_proj = QuantizedLinear(dims[0], 64, bias=False, mode=modes[0])
            self.up_proj = QuantizedLinear(dims[1], 64, bias=False, mode=modes[1])

    assert fuse_projections(Mixed(("mxfp4", "mxfp8"), (256, 256))) == []
    assert fuse_projections(Mixed(("mxfp4", "mxfp4"), (256, 512))) == []
    assert fuse_projections(Mixed(("mxfp4", "mxfp4"), (256, 256))) == ["gate_proj", "up_proj"]

    with pytest.raises(TypeError, match="expects an mlx.nn.Module but received dict"):
        fuse_projections({})


def test_constructed_fused_layer_and_convert_of_a_fused_model():
    layer = FusedQuantizedLinear(256, 64, bias=False, mode="mxfp4")
    plain = QuantizedLinear(256, 64, bias=False, mode="mxfp4")
    plain.update(layer.parameters())
    x = mx.random.normal((2, 256))
    assert max_error(layer(x), plain(x)) == 0.0

    model = quantized_model("llama", "mxfp8")
    fuse_projections(model)
    report = mlx_fpqmm.convert(model)
    assert report.converted == {} and set(report.skipped.values()) == {"already mlx_fpqmm"}


def test_greedy_decoding_unchanged():
    separate = quantized_model("qwen3", "mxfp4")
    model = quantized_model("qwen3", "mxfp4")
    fuse_projections(model)
    prompt = mx.array([1, 2, 3, 4])

    def greedy(m):
        return [int(t) for t, _ in generate_step(prompt, m, max_tokens=12)]

    assert greedy(model) == greedy(separate)


def test_each_groups_old_arrays_go_before_the_next_is_copied():
    module, _ = ARCHS["llama"]
    mx.random.seed(0)
    config = dict(ARCHS["llama"][1], hidden_size=1024, intermediate_size=4096)
    model = module.Model(module.ModelArgs.from_dict({**config, "num_hidden_layers": 6}))
    quantize(model, mode="mxfp4")
    mx.eval(model.parameters())
    groups = [
        sum(m[n].weight.nbytes + m[n].scales.nbytes for n in names)
        for _, m in model.named_modules()
        for names in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
        if all(n in m for n in names)
    ]
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    fuse_projections(model)
    # A second copy of one group at a time, not of all twelve.
    assert mx.get_peak_memory() - base <= 1.5 * max(groups) < sum(groups)
    assert mx.get_active_memory() <= base


class GatherProducts:
    """Counts the expert products run by fused switch layers and by layers on their own."""

    def __init__(self, monkeypatch):
        from mlx_fpqmm import _switch

        self.fused = self.separate = 0
        for module, field in ((_fused, "fused"), (_switch, "separate")):
            op = module.gather_qmm

            def counted(*args, _op=op, _field=field, **kwargs):
                setattr(self, _field, getattr(self, _field) + 1)
                return _op(*args, **kwargs)

            monkeypatch.setattr(module, "gather_qmm", counted)


def moe_model(arch: str, mode: str, config: dict | None = None, **kwargs) -> nn.Module:
    """A tiny mlx-lm MoE model (its config updated by ``config``), quantized; its experts'
    biases (gpt-oss) random, each layer's its own (mlx-lm's start at zero, which would
    hide a bias taken wrongly)."""
    from test_moe_models import CONFIGS

    from mlx_fpqmm.nn import QuantizedSwitchLinear

    module, base = CONFIGS[arch]
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict({**base, **(config or {})}))
    quantize(model, mode=mode, **kwargs)
    switches = [m for _, m in model.named_modules() if isinstance(m, QuantizedSwitchLinear)]
    for seed, layer in enumerate(switches):
        if "bias" in layer:
            layer.bias = mx.random.normal(layer.bias.shape, key=mx.random.key(seed))
    mx.eval(model.parameters())
    return model


# gpt-oss: biased experts (SwitchGLU's bias); Qwen3-MoE: none. 3 tokens of top 2 pair
# each token with its experts as they come; 40 tokens (80 pairs) make mlx-lm sort them.
@pytest.mark.parametrize("tokens", [3, 40])
@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("arch, experts", [("gpt_oss", "experts"), ("qwen3_moe", "switch_mlp")])
def test_fused_experts_match_separate_layers(arch, experts, mode, tokens, monkeypatch):
    from mlx_fpqmm.nn import FusedQuantizedSwitchLinear, QuantizedSwitchLinear

    separate = moe_model(arch, mode)
    model = moe_model(arch, mode)
    paths = fuse_projections(model)
    assert {p for p in paths if experts in p} == {
        f"model.layers.{i}.mlp.{experts}.{name}"
        for i in range(2)
        for name in ("gate_proj", "up_proj")
    }
    switch = getattr(model.layers[0].mlp, experts)
    assert type(switch.gate_proj) is FusedQuantizedSwitchLinear
    assert isinstance(switch.up_proj, QuantizedSwitchLinear)
    reference = getattr(separate.layers[0].mlp, experts)
    assert switch.up_proj.weight.shape == reference.up_proj.weight.shape

    x = mx.random.randint(0, 256, (1, tokens), key=mx.random.key(tokens))
    products = GatherProducts(monkeypatch)
    y = model(x)
    # gate/up as one gather a layer; down_proj on its own.
    assert (products.fused, products.separate) == (2, 2)
    assert switch.gate_proj._siblings.shared
    assert max_error(y, separate(x)) <= 1e-6


def test_fused_experts_alone_save_and_decode(tmp_path, monkeypatch):
    separate = moe_model("gpt_oss", "mxfp4")
    model = moe_model("gpt_oss", "mxfp4")
    fuse_projections(model)
    experts, reference = model.layers[1].mlp.experts, separate.layers[1].mlp.experts
    x = mx.random.normal((3, 1, 1, 128))
    indices = mx.array([[0, 2], [3, 3], [1, 0]])

    # The experts' rows stay each layer's own: saved, loaded and multiplied alone.
    model.save_weights(str(tmp_path / "fused.safetensors"))
    plain = moe_model("gpt_oss", "mxfp4")
    plain.load_weights(str(tmp_path / "fused.safetensors"), strict=True)
    prompt = mx.array([1, 2, 3, 4])

    def greedy(m):
        return [int(t) for t, _ in generate_step(prompt, m, max_tokens=8)]

    assert greedy(model) == greedy(separate) == greedy(plain)

    up, gate = reference.up_proj(x, indices), reference.gate_proj(x, indices)
    products = GatherProducts(monkeypatch)
    assert max_error(experts.up_proj(x, indices), up) <= 1e-6
    assert max_error(experts.gate_proj(x, indices), gate) <= 1e-6
    assert (products.fused, products.separate) == (1, 0)
    # A layer called again before its sibling: shared no more, each on its own from then on.
    for _ in range(2):
        assert max_error(experts.up_proj(x, indices), up) <= 1e-6
    assert max_error(experts.gate_proj(x, indices), gate) <= 1e-6
    assert experts.up_proj._siblings is None and experts.gate_proj._siblings is None
    assert (products.fused, products.separate) == (2, 2)
    # Each took its experts' rows as its own once: no copy of them a call from then on.
    mx.eval(experts.up_proj.parameters())
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    mx.eval(experts.up_proj(x, indices))
    assert mx.get_peak_memory() - base < experts.up_proj.weight.nbytes


@pytest.mark.parametrize("mode", ["mxfp4", "fp8"])
def test_deepseek_attention_experts_and_shared_experts_fuse(mode, monkeypatch):
    """DeepSeek-V3: MLA's q_a_proj and kv_a_proj_with_mqa, the dense first layer's and the
    shared experts' gate/up, and the routed experts' gate/up."""
    separate = moe_model("deepseek_v3", mode)
    model = moe_model("deepseek_v3", mode)
    paths = set(fuse_projections(model))
    for i in range(2):
        assert {
            f"model.layers.{i}.self_attn.q_a_proj",
            f"model.layers.{i}.self_attn.kv_a_proj_with_mqa",
        } <= paths
    assert {"model.layers.0.mlp.gate_proj", "model.layers.1.mlp.switch_mlp.gate_proj"} <= paths
    assert "model.layers.1.mlp.shared_experts.up_proj" in paths
    xs = [mx.random.randint(0, 256, (1, t), key=mx.random.key(t)) for t in (3, 40)]
    expected = [separate(x) for x in xs]
    products, gathers = Products(monkeypatch), GatherProducts(monkeypatch)
    for x, y in zip(xs, expected, strict=True):
        assert max_error(model(x), y) <= 1e-6
    # A pass: MLA and the dense MLP (layer 0), MLA and the shared experts (layer 1) fused;
    # the routed experts' gate/up one gather, their down_proj its own.
    assert products.fused == 2 * 4 and (gathers.fused, gathers.separate) == (2, 2)


def test_deepseek_attention_without_a_low_rank_query_fuses(monkeypatch):
    """MLA with q_lora_rank None (DeepSeek-V2-Lite): q_proj and kv_a_proj_with_mqa."""
    separate = moe_model("deepseek_v3", "mxfp4", config={"q_lora_rank": None})
    model = moe_model("deepseek_v3", "mxfp4", config={"q_lora_rank": None})
    paths = set(fuse_projections(model))
    assert {"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.kv_a_proj_with_mqa"} <= (
        paths
    )
    x = mx.random.randint(0, 256, (1, 5), key=mx.random.key(5))
    expected = separate(x)
    products = Products(monkeypatch)
    assert max_error(model(x), expected) <= 1e-6
    assert products.fused == 4  # MLA twice, the dense MLP, the shared experts


def test_a_fused_model_pickles():
    separate = quantized_model("llama", "mxfp4")
    model = quantized_model("llama", "mxfp4")
    fuse_projections(model)
    copy = pickle.loads(pickle.dumps(model))
    assert max_error(copy(TOKENS), separate(TOKENS)) <= 1e-6


def test_a_fused_model_goes_with_its_last_reference():
    """No reference cycle: the arrays go when the model does, before any garbage collection."""
    import gc

    gc.collect()
    gc.disable()
    try:
        base = mx.get_active_memory()
        model = moe_model("gpt_oss", "mxfp4")
        fuse_projections(model)
        mx.eval(model.parameters())
        held = mx.get_active_memory() - base
        del model
        # What stays is the random state's few bytes, as for an unfused model.
        assert mx.get_active_memory() - base < held / 100
    finally:
        gc.enable()


def test_experts_with_a_tensor_scale_each_are_not_fused():
    model = moe_model("qwen3_moe", "nvfp4", global_scale=True)
    assert "global_scale" in model.layers[0].mlp.switch_mlp.up_proj
    assert not [p for p in fuse_projections(model) if "switch_mlp" in p]


class QKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = QuantizedLinear(64, 64, bias=False, mode="mxfp4")
        self.k_proj = QuantizedLinear(64, 32, bias=True, mode="mxfp4")
        self.v_proj = QuantizedLinear(64, 32, bias=False, mode="mxfp4")
        self.k_proj.bias = mx.random.normal((32,), key=mx.random.key(7))


XS = [mx.random.normal((2, 64), key=mx.random.key(k)) for k in range(3)]
NAMES = ("q_proj", "k_proj", "v_proj")


@given(
    st.lists(
        st.tuples(st.sampled_from(NAMES), st.integers(0, len(XS) - 1)), min_size=1, max_size=12
    ),
    st.sampled_from([(), ("weight",), ("scales",), ("weight", "scales")]),
)
def test_any_order_of_calls_gives_each_layers_own_product(calls, replaced):
    """Whatever the order of the siblings' calls and their inputs (used together, used
    otherwise, a layer's weight, scales or both replaced midway), every call returns that
    layer's own product."""
    separate, block = QKV(), QKV()
    block.update(separate.parameters())
    fuse_projections(block)
    for step, (name, i) in enumerate(calls):
        if replaced and step == len(calls) // 2:
            # New values in both (as load_weights of other weights would bring).
            rows = getattr(separate, name).weight.shape[0]
            new = dict(
                zip(
                    ("weight", "scales"),
                    mx.quantize(
                        mx.random.normal((rows, 64), key=mx.random.key(step)), mode="mxfp4"
                    ),
                    strict=True,
                )
            )
            for model in (block, separate):
                getattr(model, name).update({k: new[k] for k in replaced})
        y, expected = getattr(block, name)(XS[i]), getattr(separate, name)(XS[i])
        assert max_error(y, expected) <= 1e-6, (step, name, i)


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.sampled_from(("gate_proj", "up_proj")), st.integers(0, 2)),
        min_size=1,
        max_size=8,
    )
)
def test_any_order_of_expert_calls_gives_each_layers_own_product(calls):
    """The same for SwitchGLU's experts: inputs are x and indices together (the third
    pairs the first x with other indices)."""
    separate = moe_model("gpt_oss", "mxfp4")
    model = moe_model("gpt_oss", "mxfp4")
    fuse_projections(model)
    block, reference = model.layers[0].mlp.experts, separate.layers[0].mlp.experts
    x = [mx.random.normal((3, 1, 1, 128), key=mx.random.key(k)) for k in range(2)]
    indices = [mx.array([[0, 2], [3, 3], [1, 0]]), mx.array([[1, 3], [2, 0], [0, 2]])]
    inputs = [(x[0], indices[0]), (x[1], indices[1]), (x[0], indices[1])]
    for step, (name, i) in enumerate(calls):
        y, expected = getattr(block, name)(*inputs[i]), getattr(reference, name)(*inputs[i])
        assert max_error(y, expected) <= 1e-6, (step, name, i)
