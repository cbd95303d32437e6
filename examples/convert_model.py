"""Run an mlx-lm model's quantized matmuls on mlx_fpqmm.

python examples/convert_model.py              # offline, on a tiny random llama and a
                                              # tiny random gpt-oss (mixture of experts)
python examples/convert_model.py MODEL        # an mlx-lm model (mxfp4/nvfp4/mxfp8) or one
                                              # written by `python -m mlx_fpqmm.convert`
                                              # (any mode): directory or Hugging Face repo
"""

import argparse
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.models import gpt_oss, llama
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

import mlx_fpqmm

TINY_LLAMA = dict(
    model_type="llama",
    hidden_size=256,
    num_hidden_layers=2,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=1024,
    tie_word_embeddings=True,
)


# gpt-oss keeps its weights in mxfp4 experts; its routers stay affine 8-bit.
TINY_GPT_OSS = dict(
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
)


def save_tiny_checkpoint(path: Path, mode: str) -> None:
    """What `mlx_lm.convert --quantize --q-mode MODE` writes, for a tiny random llama."""
    model = llama.Model(llama.ModelArgs.from_dict(TINY_LLAMA))
    model, config = quantize_model(model, TINY_LLAMA, None, None, mode=mode)
    save_model(path, model)
    save_config(config, path / "config.json")


def timed_forward(model: nn.Module, tokens: mx.array) -> tuple[mx.array, float]:
    """The logits and the best of 5 forward times in ms."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        logits = model(tokens)
        mx.eval(logits)
        times.append((time.perf_counter() - start) * 1e3)
    return logits, min(times)


def tiny_demo() -> None:
    mx.set_default_device(mx.cpu)
    mx.random.seed(0)
    tokens = mx.random.randint(0, TINY_LLAMA["vocab_size"], (1, 64))
    prompt = tokens[0, :4]
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_checkpoint(Path(tmp), "mxfp4")
        model, _ = load_model(Path(tmp))  # what mlx_lm.load does, minus the tokenizer

    before, ms_before = timed_forward(model, tokens)
    greedy_before = [int(t) for t, _ in generate_step(prompt, model, max_tokens=16)]

    report = mlx_fpqmm.convert(model)  # swaps the layers in place, sharing their arrays
    print(report)

    after, ms_after = timed_forward(model, tokens)
    greedy_after = [int(t) for t, _ in generate_step(prompt, model, max_tokens=16)]
    print(
        f"max |logits diff| {mx.abs(after - before).max().item():.2e}, "
        f"same greedy tokens: {greedy_after == greedy_before}"
    )
    print(f"forward of 64 tokens: {ms_before:.1f} ms in MLX, {ms_after:.1f} ms on mlx_fpqmm")

    # Float-scale modes, which MLX has no layers for: quantize a float model directly.
    float_model = llama.Model(llama.ModelArgs.from_dict(TINY_LLAMA))
    reference = float_model(tokens)
    mlx_fpqmm.nn.quantize(float_model, mode="fp8")
    err = mx.abs(float_model(tokens) - reference).max() / mx.abs(reference).max()
    print(f"fp8 model: max |logits error| / max |logits| = {err.item():.3f}")


def tiny_moe_demo() -> None:
    """The experts of a mixture-of-experts model (mlx-lm's QuantizedSwitchLinear)."""
    model = gpt_oss.Model(gpt_oss.ModelArgs.from_dict(TINY_GPT_OSS))

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if not hasattr(module, "to_quantized"):
            return False
        if path.endswith("router"):
            return {"group_size": 64, "bits": 8}
        return {"group_size": 32, "bits": 4, "mode": "mxfp4"}

    nn.quantize(model, class_predicate=predicate)
    tokens = mx.array([[(7 * i + 1) % TINY_GPT_OSS["vocab_size"] for i in range(48)]])
    before, ms_before = timed_forward(model, tokens)
    print(mlx_fpqmm.convert(model))
    after, ms_after = timed_forward(model, tokens)
    print(
        f"gpt-oss: max |logits diff| {mx.abs(after - before).max().item():.2e}; forward of "
        f"48 tokens: {ms_before:.1f} ms in MLX, {ms_after:.1f} ms on mlx_fpqmm"
    )


def real_model(path: str) -> None:
    from mlx_lm import generate

    # mlx_lm.load, building mlx_fpqmm's layers (fp4, fp8 and global scales included).
    model, tokenizer = mlx_fpqmm.load(path)
    modes = sorted({m.mode for _, m in model.named_modules() if "scales" in m})
    print(f"loaded {path}: quantized layers in {', '.join(modes) or 'no mode'}")
    generate(model, tokenizer, prompt="Write a haiku about matrices.", max_tokens=64, verbose=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model", nargs="?", help="a model directory or Hugging Face repository (default: "
        "the offline demo on tiny random models)",
    )  # fmt: skip
    model = parser.parse_args().model
    if model:
        try:
            real_model(model)
        except (ValueError, OSError) as error:  # not found, or not a model mlx-lm loads
            parser.error(str(error))
    else:
        tiny_demo()
        tiny_moe_demo()
