"""Decoding speed of a Llama-3-8B-shaped (or gpt-oss-20b-shaped) model with random
weights: bfloat16, MLX's own quantized model and the same model on mlx_fpqmm's layers.

    python examples/decode_speed.py [--modes mxfp4,mxfp8,nvfp4] [--tokens 128] [--prefill 2048]
        [--model llama-3-8b|gpt-oss-20b] [--runs 3]

``--modes`` may name ``fp4`` and ``fp8`` too (float scales, which MLX lacks): those
models are quantized by ``mlx_fpqmm.nn.quantize`` and printed without an MLX row.

``--model gpt-oss-20b`` takes gpt-oss-20b's shapes instead (24 layers, 32 experts of
2880 x 2880 a projection, top 4: mlx-lm's ``SwitchGLU``, whose gate and up projections
fuse into one gather). For each mode the bfloat16 model (the same seed every time, so the same
weights) is quantized by ``mlx.nn.quantize`` (MLX's kernels) and then converted
with ``mlx_fpqmm.convert`` (ours: the arrays are shared, nothing is requantized),
then fused with ``mlx_fpqmm.nn.fuse_projections`` (q/k/v and gate/up as one product each).
Each model generates greedily from the same random prompt with mlx-lm; the line
printed per model gives decode tokens per second (the tokens after the first,
over their time; the median of ``--runs`` runs, and their range) and, for ours,
how many leading tokens equal MLX's own model's.
Random weights leave near-ties among 128K logits, so the check is on MLX's own
sequence, one forward pass of each model: the positions where the greedy tokens
differ and, of those, the ones MLX's logits separate by more than two bfloat16
ulps (a real disagreement, not a tie).
With ``--prefill N`` each model's line also gives prefill tokens per second: one
forward pass over an N-token prompt (the best of three). Each line also splits a
decoding step (one token, with a KV cache; medians of 16): the host's time to build
its graph and to encode it (every primitive's ``eval_gpu``), and the wait for the GPU
after that. mlx-lm's decoding overlaps the host's work with the GPU's, so a short wait
says that the host bounds the tokens per second.
Meant for a GPU (``--model gpt-oss-20b`` runs on one only: MLX's CPU ``gather_mm`` takes
float32 alone). On a CPU ``--layers 2 --modes ""`` runs the bfloat16 Llama model alone:
``mlx.nn.quantize`` of even two layers (with the 128K-token embedding and head) took more
than the 24 GB of this project's CPU machine.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.models import cache, gpt_oss, llama

import mlx_fpqmm

LLAMA_3_8B = dict(
    model_type="llama",
    hidden_size=4096,
    num_hidden_layers=32,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    vocab_size=128256,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)


GPT_OSS_20B = dict(
    model_type="gpt_oss",
    num_hidden_layers=24,
    num_local_experts=32,
    num_experts_per_tok=4,
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    head_dim=64,
    num_attention_heads=64,
    num_key_value_heads=8,
    sliding_window=128,
    rope_theta=150000,
)
# The modes MLX's own layers have (the others: mlx_fpqmm's alone).
MLX_MODES = ("mxfp4", "nvfp4", "mxfp8")
# The name, mlx-lm's module and the config of each model.
MODELS = {
    "llama-3-8b": ("Llama-3-8B", llama, LLAMA_3_8B),
    "gpt-oss-20b": ("gpt-oss-20b", gpt_oss, GPT_OSS_20B),
}


def random_model(layers: int, model: str = "llama-3-8b", **overrides) -> nn.Module:
    """``model``'s shapes with ``layers`` layers (and ``overrides`` of its config), random
    bfloat16 weights, the same every time."""
    _, module, config = MODELS[model]
    config = {**config, **overrides, "num_hidden_layers": layers}
    if module is gpt_oss:  # sliding and full attention by turns, as gpt-oss has them
        config["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2)
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model


def decode(model: nn.Module, prompt: mx.array, tokens: int) -> tuple[list[int], float]:
    """Greedy tokens and decode tokens per second (after the first token)."""
    out, start = [], 0.0
    for token, _ in generate_step(prompt, model, max_tokens=tokens):
        out.append(int(token))
        if len(out) == 1:
            start = time.perf_counter()
    return out, (len(out) - 1) / (time.perf_counter() - start)


def decode_rates(
    model: nn.Module, prompt: mx.array, tokens: int, runs: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens (of the first run) and decode tokens per second of ``runs`` runs, after
    a warm-up: a step is bound by the host, whose rate scatters from run to run."""
    decode(model, prompt, 8)
    results = [decode(model, prompt, tokens) for _ in range(runs)]
    return results[0][0], [rate for _, rate in results]


def prefill_rate(model: nn.Module, length: int) -> str:
    """Prompt tokens per second of one forward pass over ``length`` tokens (best of 3),
    as text for the model's line; empty without a length."""
    if length == 0:
        return ""
    prompt = mx.random.randint(0, model.args.vocab_size, (1, length), key=mx.random.key(2))
    mx.eval(model(prompt))  # warm-up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        mx.eval(model(prompt))
        best = min(best, time.perf_counter() - start)
    return f"  prefill {length / best:8.0f} tokens/s"


def build_encode_wait(build: Callable[[], object]) -> tuple[float, float, float]:
    """Seconds to build a graph (``build()``, its outputs) on the host, to encode it
    (``mx.async_eval``: every primitive's ``eval_gpu``) and to wait for it after that."""
    mx.synchronize()
    start = time.perf_counter()
    outputs = build()
    built = time.perf_counter()
    mx.async_eval(outputs)
    encoded = time.perf_counter()
    mx.synchronize()
    return built - start, encoded - built, time.perf_counter() - encoded


def medians_ms(runs: list[tuple[float, ...]]) -> list[float]:
    """The median of each part of ``runs`` (seconds), in milliseconds."""
    return [statistics.median(part) * 1e3 for part in zip(*runs, strict=True)]


def step_times(model: nn.Module, steps: int) -> list[tuple[float, float, float]]:
    """Build, encode and wait seconds (:func:`build_encode_wait`) of each of ``steps``
    decoding steps (one token, with a KV cache)."""
    kv = cache.make_prompt_cache(model)
    mx.eval(model(mx.array([[1, 2, 3, 4]]), cache=kv))
    token = mx.array([[5]])
    return [build_encode_wait(lambda: model(token, cache=kv)) for _ in range(steps)]


def step_split(model: nn.Module, steps: int = 16) -> str:
    """Median host time to build a decoding step's graph and to encode it, and the wait
    for its evaluation after that, as text for the model's line."""
    build, encode, wait = medians_ms(step_times(model, steps))
    return f"  step: build {build:.2f} ms, encode {encode:.2f} ms, wait {wait:.2f} ms"


def logits(model: nn.Module, tokens: list[int]) -> mx.array:
    """The float32 logits of every position of ``tokens`` (one forward pass)."""
    return model(mx.array(tokens)[None])[0].astype(mx.float32)


def disagreements(reference: mx.array, ours: mx.array) -> tuple[int, int]:
    """Positions whose greedy token differs, and those of them where the reference's
    own logits separate the two tokens by more than two bfloat16 ulps (not a tie)."""
    theirs_top, ours_top = mx.argmax(reference, axis=-1), mx.argmax(ours, axis=-1)
    rows = mx.arange(reference.shape[0])
    top = reference[rows, theirs_top]
    gap = top - reference[rows, ours_top]
    differ = theirs_top != ours_top
    beyond_tie = differ & (gap > 2 * mx.abs(top) * 2.0**-8)
    return int(differ.sum()), int(beyond_tie.sum())


def weight_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in nn.utils.tree_flatten(model.parameters()))


def row(
    mode: str, kind: str, model: nn.Module, rates: list[float], prefill: int, note: str = ""
) -> str:
    """A model's line: its weights, decode rate (the median of its runs, and their range),
    prefill rate and step split, and a note."""
    spread = f" ({min(rates):.1f}-{max(rates):.1f})" if len(rates) > 1 else ""
    return (
        f"{mode:>8} {kind:>10} {weight_bytes(model) / 1e9:6.2f} GB "
        f"{statistics.median(rates):8.1f} tokens/s{spread}"
        f"{prefill_rate(model, prefill)}{step_split(model)}" + (f"  ({note})" if note else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="mxfp4,mxfp8,nvfp4")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3, help="decode runs a model (median)")
    parser.add_argument("--model", choices=list(MODELS), default="llama-3-8b")
    parser.add_argument("--layers", type=int, help="default: the model's")
    parser.add_argument(
        "--prefill", type=int, default=0, help="prompt length for prefill tokens/s (0: none)"
    )
    args = parser.parse_args()
    name, module, config = MODELS[args.model]
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers {args.layers}: at least 1")
    if args.layers is None and mx.default_device() == mx.cpu:
        parser.error("on a CPU, name --layers (e.g. --layers 2 --modes ''): the whole "
                     "bfloat16 model and its quantizing take tens of GB")  # fmt: skip
    layers = args.layers or config["num_hidden_layers"]
    if module is gpt_oss and (layers < 2 or layers % 2):
        parser.error("--layers of gpt-oss-20b: an even number (sliding and full attention)")
    if module is gpt_oss and mx.default_device() == mx.cpu:
        parser.error("--model gpt-oss-20b needs a GPU: its bfloat16 experts' gather_mm is "
                     "float32 only on MLX's CPU")  # fmt: skip
    prompt = mx.random.randint(0, config["vocab_size"], (16,), key=mx.random.key(1))
    print(
        f"{time.strftime('%Y-%m-%d')} {mx.device_info().get('device_name', mx.default_device())}"
        f", mlx {mx.__version__}: {name} shapes ({layers} layers), random weights, "
        f"greedy, {args.tokens} tokens from a 16-token prompt"
    )
    model = random_model(layers, args.model)
    _, rates = decode_rates(model, prompt, args.tokens, args.runs)
    print(row("bfloat16", "", model, rates, args.prefill))
    del model
    for mode in filter(None, args.modes.split(",")):
        model = random_model(layers, args.model)
        if mode in MLX_MODES:
            nn.quantize(model, mode=mode)
            mx.eval(model.parameters())
            theirs, rates = decode_rates(model, prompt, args.tokens, args.runs)
            print(row(mode, "MLX", model, rates, args.prefill))
            sequence = [*prompt.tolist(), *theirs]
            reference, whose = logits(model, sequence), "MLX's"
            report = mlx_fpqmm.convert(model)
            ours, rates = decode_rates(model, prompt, args.tokens, args.runs)
            differ, beyond_tie = disagreements(reference, logits(model, sequence))
            prefix = next(
                i
                for i, (a, b) in enumerate(zip([*ours, None], [*theirs, -1], strict=True))
                if a != b
            )
            note = (
                f"{prefix}/{len(ours)} leading tokens equal MLX's; on MLX's sequence the greedy "
                f"token differs at {differ}/{len(sequence)} positions, {beyond_tie} beyond a "
                f"bfloat16 tie; {report}"
            )
        else:  # float scales (fp4, fp8), which MLX does not have: ours alone
            mlx_fpqmm.nn.quantize(model, mode=mode)
            mx.eval(model.parameters())
            ours, rates = decode_rates(model, prompt, args.tokens, args.runs)
            # The fused model is checked against this one, on its own sequence.
            sequence = [*prompt.tolist(), *ours]
            reference, whose = logits(model, sequence), "the unfused model's"
            note = "quantized by mlx_fpqmm.nn.quantize; MLX has no such mode"
        print(row(mode, "mlx_fpqmm", model, rates, args.prefill, note))
        fused = len(mlx_fpqmm.nn.fuse_projections(model))
        _, rates = decode_rates(model, prompt, args.tokens, args.runs)
        differ, beyond_tie = disagreements(reference, logits(model, sequence))
        note = (
            f"{fused} layers in groups of one product; the greedy token differs at "
            f"{differ}/{len(sequence)} of {whose} positions, {beyond_tie} beyond a tie"
        )
        print(row(mode, "fused", model, rates, args.prefill, note))
        del model


if __name__ == "__main__":
    main()
