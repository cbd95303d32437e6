"""Where a decoding step's time goes on the GPU, through mlx-lm.

    python3 tools/gpu/step_profile.py [--mode mxfp4] [--steps 32] [--layers N]
        [--model llama-3-8b|gpt-oss-20b]

Llama-3-8B's (or gpt-oss-20b's) shapes with random weights (as
examples/decode_speed.py): the bfloat16 model, MLX's quantized model and the
same on mlx_fpqmm's layers. For each, a decoding step (one token, with a KV
cache) split into the host's time to build its graph, to encode it
(``mx.async_eval``: every primitive's ``eval_gpu``) and the wait for the GPU
after that (medians); then tokens per second of greedy decoding pipelined as
mlx-lm's ``generate_step`` does it (the next step built and encoded before the
last token is read), on the default stream and on a thread-local stream as
mlx-lm's. Then the step's linear products alone (each layer's product of one
token, in the step's order, in one graph), the mlx_fpqmm model's steps with
every quantized product (the experts' gathers too) replaced by a view of x of
the product's shape (what the rest of a step costs), and the model fused
(``mlx_fpqmm.nn.fuse_projections``: q/k/v and gate/up as one product each).
Where the wait is short, the host's build and encode bound the tokens per
second.
"""

import argparse
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import cache

import mlx_fpqmm
from mlx_fpqmm._linear import QuantizedLinear
from mlx_fpqmm._switch import QuantizedSwitchLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from decode_speed import (  # noqa: E402
    MODELS,
    build_encode_wait,
    medians_ms,
    random_model,
    step_times,
)


def step_parts(model: nn.Module, steps: int) -> list[float]:
    """Median milliseconds to build, encode and wait for a decoding step."""
    return medians_ms(step_times(model, steps))


def pipelined_rate(model: nn.Module, steps: int, stream: mx.Stream) -> float:
    """Greedy tokens per second, each step built and encoded before the last
    token is read (mlx-lm's ``generate_step``)."""
    kv = cache.make_prompt_cache(model)

    def step(tokens: mx.array) -> mx.array:
        return mx.argmax(model(tokens, cache=kv)[:, -1, :], axis=-1)

    with mx.stream(stream):
        y = step(mx.array([[1, 2, 3, 4]]))
        mx.async_eval(y)
        for i in range(steps + 4):
            if i == 4:
                start = time.perf_counter()
            following = step(y[:, None])
            mx.async_eval(following)
            y.item()
            y = following
        y.item()
    return steps / (time.perf_counter() - start)


def report(label: str, model: nn.Module, steps: int) -> None:
    build, encode, wait = step_parts(model, steps)
    rates = (
        pipelined_rate(model, steps, mx.default_stream(mx.gpu)),
        pipelined_rate(model, steps, mx.new_thread_local_stream(mx.gpu)),
    )
    print(
        f"{label:<32} build {build:5.2f}  encode {encode:5.2f}  wait {wait:5.2f} ms;"
        f" pipelined {rates[0]:6.1f} / {rates[1]:6.1f} tokens/s",
        flush=True,
    )


def products_alone(model: nn.Module, reps: int) -> tuple[list[float], int]:
    """Median milliseconds to build, encode and wait for one token's product through
    every quantized linear layer of ``model`` (one graph), and how many that is."""
    layers = [m for _, m in model.named_modules() if isinstance(m, QuantizedLinear)][::-1]
    inputs = [
        mx.random.normal((1, 1, layer.weight.shape[1] * 32 // layer.bits)).astype(mx.bfloat16)
        for layer in layers
    ]
    mx.eval(inputs)
    runs = [
        build_encode_wait(lambda: [layer(x) for layer, x in zip(layers, inputs, strict=True)])
        for _ in range(reps + 1)
    ]
    return medians_ms(runs[1:]), len(layers)  # the first is a warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="mxfp4")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--layers", type=int, help="default: the model's")
    parser.add_argument("--model", choices=list(MODELS), default="llama-3-8b")
    args = parser.parse_args()
    layers = args.layers or MODELS[args.model][2]["num_hidden_layers"]
    print(f"{mx.device_info().get('device_name', mx.default_device())}, mlx {mx.__version__}")
    print(f"{MODELS[args.model][0]} shapes, {layers} layers")
    print("a decoding step: host build, encode (mx.async_eval), wait; tokens/s pipelined on")
    print("the default stream / a thread-local stream")
    model = random_model(layers, args.model)
    report("bfloat16", model, args.steps)
    nn.quantize(model, mode=args.mode)
    mx.eval(model.parameters())
    report(f"{args.mode}, MLX's layers", model, args.steps)
    mlx_fpqmm.convert(model)
    report(f"{args.mode}, mlx_fpqmm's layers", model, args.steps)
    (build, encode, wait), count = products_alone(model, args.steps)
    print(
        f"{'  its ' + str(count) + ' products alone':<32} build {build:5.2f}  encode {encode:5.2f}"
        f"  wait {wait:5.2f} ms"
    )
    calls = QuantizedLinear.__call__, QuantizedSwitchLinear.__call__
    QuantizedLinear.__call__ = lambda self, x: mx.broadcast_to(
        x[..., :1], (*x.shape[:-1], self.weight.shape[-2])
    )
    # A switch layer's x is (..., 1, 1, K) against indices (..., k) at a decoding step.
    QuantizedSwitchLinear.__call__ = lambda self, x, indices, sorted_indices=False: mx.broadcast_to(
        x[..., :1], (*indices.shape, 1, self.weight.shape[-2])
    )
    report("  its steps, products as views", model, args.steps)
    QuantizedLinear.__call__, QuantizedSwitchLinear.__call__ = calls
    mlx_fpqmm.nn.fuse_projections(model)
    report("  fused (q/k/v, gate/up)", model, args.steps)


if __name__ == "__main__":
    main()
