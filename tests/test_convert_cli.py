"""The mlx-lm workflow: `python -m mlx_fpqmm.convert`, `mlx_fpqmm.load`, `python -m
mlx_fpqmm.generate`, offline on tiny random Hugging Face-format checkpoints."""

import importlib
import os
import runpy
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

pytest.importorskip("mlx_lm")
from mlx_lm.models import llama, qwen3_moe  # noqa: E402
from mlx_lm.utils import load_model, save_config, save_model  # noqa: E402

import mlx_fpqmm  # noqa: E402
import mlx_fpqmm.nn  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
WORDS = ["<unk>", "</s>"] + [f"w{i}" for i in range(62)]

TINY = {
    "llama": dict(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=128,
        tie_word_embeddings=True,
        eos_token_id=1,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        moe_intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        vocab_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=1,
    ),
}
MODULES = {"llama": llama, "qwen3_moe": qwen3_moe}
TOKENS = mx.array([[2, 5, 9, 17, 33, 40, 3, 7]])


def save_tokenizer(path: Path) -> None:
    """A tiny word-level tokenizer, built offline with `tokenizers`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")
    fast.save_pretrained(path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A float checkpoint per model type: config.json, safetensors, tokenizer."""
    root = tmp_path_factory.mktemp("hf")
    paths = {}
    for name, config in TINY.items():
        mx.random.seed(1)
        module = MODULES[name]
        model = module.Model(module.ModelArgs.from_dict(config))
        path = root / name
        save_model(path, model)
        save_config(dict(config), path / "config.json")
        save_tokenizer(path)
        paths[name] = path
    return paths


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", module, *args], env=ENV, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result


def reference_logits(hf_path: Path, mode: str, global_scale: bool = False) -> mx.array:
    """The float model quantized in-process by mlx_fpqmm.nn.quantize (routers as mlx-lm)."""
    model, _ = load_model(hf_path)
    own = getattr(model, "quant_predicate", None)
    mlx_fpqmm.nn.quantize(
        model,
        mode=mode,
        global_scale=global_scale,
        class_predicate=lambda p, m: hasattr(m, "to_quantized") and (own(p, m) if own else True),
    )
    return model(TOKENS)


CASES = [
    ("llama", "mxfp4", ()),
    ("llama", "nvfp4", ()),
    ("llama", "mxfp8", ()),
    ("llama", "fp4", ()),
    ("llama", "fp8", ()),
    ("qwen3_moe", "mxfp4", ()),
    ("qwen3_moe", "nvfp4", ("--global-scale",)),
]


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory) -> dict:
    out_root = tmp_path_factory.mktemp("mlx")
    return {"root": out_root, "checkpoints": checkpoints}


@pytest.mark.parametrize(("name", "mode", "extra"), CASES)
@pytest.mark.slow  # subprocesses
def test_convert_load_logits(converted, name, mode, extra):
    import mlx_lm

    hf_path = converted["checkpoints"][name]
    out = converted["root"] / f"{name}-{mode}"
    run(
        "mlx_fpqmm.convert",
        "--hf-path",
        str(hf_path),
        "--mlx-path",
        str(out),
        "--mode",
        mode,
        *extra,
    )
    assert (out / "tokenizer.json").exists() and list(out.glob("model*.safetensors"))

    model, tokenizer = mlx_fpqmm.load(str(out))
    assert tokenizer.encode("w1 w2", add_special_tokens=False) == [3, 4]
    layers = {m.mode: type(m).__module__ for _, m in model.named_modules() if "scales" in m}
    assert layers.pop(mode).startswith("mlx_fpqmm")
    assert set(layers) <= {"affine"}  # qwen3_moe's gates, 8-bit affine as mlx-lm leaves them
    if name == "qwen3_moe":
        assert layers == {"affine": "mlx.nn.layers.quantized"}
        assert type(model.layers[0].mlp.switch_mlp.up_proj).__module__ == "mlx_fpqmm._switch"
    logits = model(TOKENS)
    expected = reference_logits(hf_path, mode, global_scale=bool(extra))
    assert mx.array_equal(logits, expected).item()

    if mode in ("mxfp4", "nvfp4", "mxfp8") and not extra:
        lm_model, _ = mlx_lm.load(str(out))
        assert mx.allclose(lm_model(TOKENS), logits, rtol=1e-4, atol=1e-4).item()
    else:
        with pytest.raises(ValueError, match=r"mlx_fpqmm\.load"):
            mlx_lm.load(str(out))


@pytest.mark.parametrize("mode", ["mxfp8", "affine"])
def test_load_mlx_lm_saved(converted, tmp_path, mode):
    """A model written by mlx-lm's own quantize_model/save: MLX-mode layers on mlx_fpqmm."""
    import mlx_lm
    from mlx_lm.utils import quantize_model

    hf_path = converted["checkpoints"]["qwen3_moe"]
    model, config = load_model(hf_path)
    model, config = quantize_model(model, config, None, None, mode=mode)
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    save_tokenizer(tmp_path)
    ours, _ = mlx_fpqmm.load(str(tmp_path))
    theirs, _ = mlx_lm.load(str(tmp_path))
    kinds = {(m.mode, type(m).__module__) for _, m in ours.named_modules() if "scales" in m}
    if mode == "affine":
        assert kinds == {
            ("affine", "mlx.nn.layers.quantized"),
            ("affine", "mlx_lm.models.switch_layers"),
        }
    else:
        assert kinds == {("affine", "mlx.nn.layers.quantized"), ("mxfp8", "mlx_fpqmm.nn"),
                         ("mxfp8", "mlx_fpqmm._switch")}  # fmt: skip
    assert mx.allclose(ours(TOKENS), theirs(TOKENS), rtol=1e-4, atol=1e-4).item()
    # mlx-lm's activation-quantized layers are refused, not replaced by weight-only ones.
    with pytest.raises(ValueError, match="quantize_activations.*mlx_lm.load"):
        mlx_fpqmm.load(str(tmp_path), model_config={"quantize_activations": True})


@pytest.mark.slow  # subprocesses
def test_config_entry(converted):
    import json

    hf_path = converted["checkpoints"]["llama"]
    out = converted["root"] / "llama-fp8-g64"
    run("mlx_fpqmm.convert", "--hf-path", str(hf_path), "--mlx-path", str(out), "--mode", "fp8",
        "--group-size", "64")  # fmt: skip
    quantization = json.loads((out / "config.json").read_text())["quantization"]
    assert quantization["mode"] == "fp8 (load with mlx_fpqmm.load)"
    assert (quantization["group_size"], quantization["bits"]) == (64, 8)
    assert quantization["model.layers.0.self_attn.q_proj"]["mode"].startswith("fp8 ")
    model, _ = mlx_fpqmm.load(str(out))
    assert model.layers[0].self_attn.q_proj.group_size == 64


def test_convert_partly_quantized(converted, tmp_path):
    """A checkpoint with mxfp4 MLPs (as mlx-lm wrote it): the rest in fp8, entries per layer."""
    import mlx_lm
    from mlx_lm.utils import quantize_model

    from mlx_fpqmm._lm import convert_checkpoint

    src = tmp_path / "src"
    model, config = load_model(converted["checkpoints"]["llama"])
    config = quantize_model(model, config, None, None, mode="mxfp4",
                            quant_predicate=lambda p, _: "mlp" in p)[1]  # fmt: skip
    save_model(src, model)
    save_config(config, src / "config.json")
    save_tokenizer(src)
    convert_checkpoint(str(src), tmp_path / "out", mode="fp8", verbose=False)
    model, _ = mlx_fpqmm.load(str(tmp_path / "out"))
    assert model.layers[0].mlp.up_proj.mode == "mxfp4"
    assert model.layers[0].self_attn.q_proj.mode == "fp8"
    assert model.model.embed_tokens.mode == "fp8"
    with pytest.raises(ValueError, match=r"mlx_fpqmm\.load"):
        mlx_lm.load(str(tmp_path / "out"))


def test_quant_predicate_recipe(converted):
    """mlx-lm's recipe: high-bit layers in the 8-bit sibling, gates as the model says."""
    import json

    from mlx_fpqmm._lm import convert_checkpoint

    out = converted["root"] / "moe-recipe"
    hf_path = converted["checkpoints"]["qwen3_moe"]
    convert_checkpoint(str(hf_path), out, mode="fp4", quant_predicate="mixed_3_6", verbose=False)
    quantization = json.loads((out / "config.json").read_text())["quantization"]
    assert quantization["model.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8}
    assert quantization["model.layers.1.self_attn.v_proj"]["mode"].startswith("fp8 ")
    assert quantization["model.layers.0.self_attn.v_proj"]["mode"].startswith("fp4 ")
    model, _ = mlx_fpqmm.load(str(out))
    assert model.layers[1].self_attn.v_proj.mode == "fp8"
    assert model.layers[0].mlp.switch_mlp.down_proj.mode == "fp4"


@pytest.mark.slow  # subprocesses
def test_generate_cli(converted):
    hf_path = converted["checkpoints"]["llama"]
    out = converted["root"] / "llama-gen"
    run("mlx_fpqmm.convert", "--hf-path", str(hf_path), "--mlx-path", str(out), "--mode", "fp4")
    command = ["mlx_fpqmm.generate", "--model", str(out), "--prompt", "w1 w2 w3"]
    result = run(*command, "--max-tokens", "5")
    assert "Generation:" in result.stdout and "tokens-per-sec" in result.stdout
    # Greedy: the same text with the projections fused.
    plain, fused = (
        run(*command, "--max-tokens", "8", "--verbose", "False", *flag)
        for flag in ([], ["--fuse-projections"])
    )
    # Two layers of q/k/v and gate/up each.
    assert "10 layers fused" in fused.stderr and "fused" not in plain.stderr
    assert plain.stdout.strip() and fused.stdout == plain.stdout


@pytest.mark.slow  # subprocesses
def test_generate_cli_as_mlx_lm(converted):
    """A seeded sampled generation of an mxfp4 MoE model (mlx-lm can load it) gives
    mlx_lm.generate's text: loading draws from MLX's random sequence as mlx-lm's does;
    a draft model of the same weights (speculative decoding) keeps the greedy text."""
    hf_path = converted["checkpoints"]["qwen3_moe"]
    out = converted["root"] / "moe-sampled"
    run("mlx_fpqmm.convert", "--hf-path", str(hf_path), "--mlx-path", str(out), "--mode", "mxfp4")
    common = ["--model", str(out), "--prompt", "w1 w2 w3 w4 w5 w6", "--verbose", "False"]
    sampled = [*common, "--max-tokens", "12", "--temp", "0.8", "--seed", "3"]
    ours, mlx_lm = run("mlx_fpqmm.generate", *sampled), run("mlx_lm", "generate", *sampled)
    assert ours.stdout.strip() and ours.stdout == mlx_lm.stdout
    greedy = [*common, "--max-tokens", "8"]
    drafted = run("mlx_fpqmm.generate", *greedy, "--draft-model", str(out))
    assert drafted.stdout == run("mlx_fpqmm.generate", *greedy).stdout


def test_convert_name_stays_the_function(monkeypatch):
    """`python -m mlx_fpqmm.convert` exists without clobbering the function."""
    assert mlx_fpqmm.convert is mlx_fpqmm.nn.convert
    monkeypatch.setattr(sys, "argv", ["mlx_fpqmm.convert", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("mlx_fpqmm.convert", run_name="__main__")
    assert exit_info.value.code == 0
    assert mlx_fpqmm.convert is mlx_fpqmm.nn.convert
    assert importlib.import_module("mlx_fpqmm.convert") is mlx_fpqmm.nn.convert
    __import__("mlx_fpqmm.convert")  # `import mlx_fpqmm.convert`
    assert mlx_fpqmm.convert is mlx_fpqmm.nn.convert
    assert callable(mlx_fpqmm.convert)


@pytest.mark.slow  # subprocesses
def test_cli_mistakes_are_one_line_errors(converted, tmp_path):
    """A user's mistake is the parser's error (exit status 2, no traceback): an output that
    exists, a path that is neither a directory nor a repository, a model with nothing left
    to quantize; mlx_lm.generate's options that this path does not take are refused and
    not offered."""

    def fails(module: str, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", module, *args], env=ENV, capture_output=True, text=True
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        return result.stderr.splitlines()[-1]

    hf_path = str(converted["checkpoints"]["llama"])
    out = tmp_path / "fp8"
    run("mlx_fpqmm.convert", "--hf-path", hf_path, "--mlx-path", str(out), "--mode", "fp8")
    assert "already exists" in fails(
        "mlx_fpqmm.convert", "--hf-path", hf_path, "--mlx-path", str(out)
    )
    missing = str(tmp_path / "missing")
    assert f"{missing} is not a local directory either" in fails(
        "mlx_fpqmm.convert", "--hf-path", missing, "--mlx-path", str(tmp_path / "o")
    )
    assert "quantized already (fp8): no float layer" in fails(
        "mlx_fpqmm.convert", "--hf-path", str(out), "--mlx-path", str(tmp_path / "o"), "--mode",
        "mxfp8",
    )  # fmt: skip
    assert "group_size=48 is not supported for mode 'fp8'; expected one of: 16, 32, 64" in fails(
        "mlx_fpqmm.convert", "--hf-path", hf_path, "--mlx-path", str(tmp_path / "o"), "--mode",
        "fp8", "--group-size", "48",
    )  # fmt: skip
    assert not (tmp_path / "o").exists()
    assert "Mode 'mxfp4' stores 4-bit codes but bits=8" in fails(
        "mlx_fpqmm.convert", "--hf-path", hf_path, "--mlx-path", str(tmp_path / "o"), "-q",
        "--q-mode", "mxfp4", "--q-bits", "8",
    )  # fmt: skip
    assert "--prompt-cache-file: use mlx_lm.generate" in fails(
        "mlx_fpqmm.generate", "--model", str(out), "--prompt-cache-file", str(out)
    )
    assert "--prompt-cache-file" not in run("mlx_fpqmm.generate", "--help").stdout
    missing_adapter = str(tmp_path / "no-adapter")
    assert missing_adapter in fails(
        "mlx_fpqmm.generate", "--model", str(out), "--adapter-path", missing_adapter
    )


def test_convert_keeps_the_scales_of_layers_quantized_already(converted, tmp_path):
    """A checkpoint whose experts are quantized already (nvfp4 with tensor scales, as
    gpt-oss ships mxfp4 experts) and whose other layers are float, converted with a
    dtype: the float layers are cast and quantized, the experts' scales keep their types
    (the op takes float32 tensor scales only)."""
    from mlx_fpqmm import _lm

    model, config = load_model(converted["checkpoints"]["qwen3_moe"])
    experts = {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    model, config = _lm.quantize_model(
        model,
        dict(config),
        None,
        "nvfp4",
        True,
        lambda path, module: experts if "switch_mlp" in path else False,
        verbose=False,
    )
    partly = tmp_path / "partly"
    save_model(partly, model)
    save_config(config, partly / "config.json")
    save_tokenizer(partly)
    reference = model(TOKENS)
    out = tmp_path / "converted"
    _lm.convert_checkpoint(str(partly), out, mode="mxfp8", dtype="bfloat16", verbose=False)
    loaded, _ = mlx_fpqmm.load(str(out))
    scales = [m.global_scale for _, m in loaded.named_modules() if "global_scale" in m]
    assert scales and all(s.dtype == mx.float32 for s in scales)
    logits = loaded(TOKENS)
    assert mx.isfinite(logits).all().item()
    assert (mx.abs(logits - reference).max() / mx.abs(reference).max()).item() < 0.1
