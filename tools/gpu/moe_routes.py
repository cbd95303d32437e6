"""Where a quantized gpt-oss model on mlx_fpqmm's layers parts from MLX's own, layer by layer.

    python3 tools/gpu/moe_routes.py [--mode mxfp4] [--layers 24] [--tokens 48] [--experts 32]
        [--vocab 201088]

gpt-oss-20b's shapes with random weights (examples/decode_speed.py's random_model), quantized by
``mlx.nn.quantize`` (MLX's layers) and a copy converted by ``mlx_fpqmm.convert`` (ours, the
same arrays). One forward pass of a random prompt through MLX's model records each MoE
block's input and routes; then each of our blocks takes MLX's input for its layer. Per layer
it prints how many positions route to another set of experts (the router is a quantized
linear layer too), the largest difference of the block's outputs (over the largest output),
the same over the positions whose routes agree, and how far the input of that block in our
own whole forward pass is from MLX's; then the final logits' greedy tokens. A control
column runs MLX's model once more with each value of each MoE block's output moved one
bfloat16 step (up or down at random: a perturbation of the size of our blocks' differences,
applied everywhere): how far MLX's own hidden states drift from such steps alone, against
which ours are read.
Routes that flip on a bfloat16 rounding step change a position's experts, so that its
output differs by far more than a kernel's rounding: the per-layer rows tell such flips from
a kernel error (which shows at positions whose routes agree). Meant for the GPU; on a CPU
``--layers 2 --experts 8 --vocab 4096`` fits in 24 GB.
"""

import argparse
import copy
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gpt_oss

import mlx_fpqmm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from decode_speed import GPT_OSS_20B, random_model  # noqa: E402


def routes(block: nn.Module, x: mx.array) -> mx.array:
    """The block's experts for each position of ``x``, sorted (as MLPBlock picks them)."""
    g = block.router(x)
    _, indices = gpt_oss.mlx_topk(g, k=block.num_experts_per_tok, axis=-1)
    return mx.sort(indices, axis=-1)


def rounding_step(y: mx.array, key: mx.array) -> mx.array:
    """Each nonzero value of bfloat16 ``y`` one step up or down (at random) in magnitude."""
    if y.dtype != mx.bfloat16:
        raise TypeError(f"rounding_step: y must be bfloat16, got {y.dtype}.")
    step = mx.where(mx.random.bernoulli(key=key, shape=y.shape), 1, -1).astype(mx.int16)
    moved = (y.view(mx.int16) + step).view(y.dtype)
    return mx.where(y == 0, y, moved)


def recorded_inputs(
    model: nn.Module, prompt: mx.array, perturbed: bool = False
) -> tuple[list[mx.array], mx.array]:
    """Each MoE block's input in one forward pass of ``prompt``, and the logits; each
    block's output a rounding step off where ``perturbed``."""
    inputs = []
    call = gpt_oss.MLPBlock.__call__

    def recording(block: nn.Module, x: mx.array) -> mx.array:
        inputs.append(x)
        y = call(block, x)
        return rounding_step(y, mx.random.key(len(inputs))) if perturbed else y

    gpt_oss.MLPBlock.__call__ = recording
    try:
        logits = model(prompt)
        mx.eval(inputs, logits)
    finally:
        gpt_oss.MLPBlock.__call__ = call
    return inputs, logits


def relative(a: mx.array, b: mx.array) -> float:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return (mx.abs(a - b).max() / mx.maximum(mx.abs(a).max(), 1e-30)).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="mxfp4", choices=["mxfp4", "nvfp4", "mxfp8"])
    parser.add_argument("--layers", type=int, default=GPT_OSS_20B["num_hidden_layers"])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--experts", type=int, default=GPT_OSS_20B["num_local_experts"])
    parser.add_argument("--vocab", type=int, default=GPT_OSS_20B["vocab_size"])
    args = parser.parse_args()
    if args.layers < 2 or args.layers % 2:
        parser.error("--layers: an even number (sliding and full attention)")
    theirs = random_model(
        args.layers, "gpt-oss-20b", num_local_experts=args.experts, vocab_size=args.vocab
    )
    nn.quantize(theirs, mode=args.mode)
    mx.eval(theirs.parameters())
    ours = copy.deepcopy(theirs)
    print(mlx_fpqmm.convert(ours))
    prompt = mx.random.randint(0, args.vocab, (1, args.tokens), key=mx.random.key(1))
    inputs, reference = recorded_inputs(theirs, prompt)
    hidden, logits = recorded_inputs(ours, prompt)
    control, control_logits = recorded_inputs(theirs, prompt, perturbed=True)
    print(
        f"{mx.default_device()}, mlx {mx.__version__}: gpt-oss-20b shapes, {args.layers} layers, "
        f"{args.experts} experts, {args.mode}, {args.tokens} positions"
    )
    print(
        "layer  routes that differ  block output diff  where routes agree  hidden state diff"
        "  control"
    )
    for layer, (x, x_ours, x_control) in enumerate(zip(inputs, hidden, control, strict=True)):
        block, block_ours = theirs.model.layers[layer].mlp, ours.model.layers[layer].mlp
        y, y_ours = block(x), block_ours(x)
        agree = mx.all(routes(block, x) == routes(block_ours, x), axis=-1)
        same = mx.expand_dims(agree, -1)
        print(
            f"{layer:5d}  {int((~agree).sum().item()):18d}  {relative(y, y_ours):17.2e}"
            f"  {relative(mx.where(same, y, 0), mx.where(same, y_ours, 0)):18.2e}"
            f"  {relative(x, x_ours):17.2e}  {relative(x, x_control):7.2e}"
        )
    for name, other in (("ours", logits), ("control", control_logits)):
        greedy = mx.argmax(reference, axis=-1) == mx.argmax(other, axis=-1)
        print(
            f"{name}: greedy tokens equal to MLX's at {int(greedy.sum().item())} of "
            f"{args.tokens} positions; logits diff {relative(reference, other):.2e}"
        )


if __name__ == "__main__":
    main()
