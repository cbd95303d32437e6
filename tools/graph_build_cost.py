"""Host time to build one decoding step's graph, per token, through mlx-lm.

    python tools/graph_build_cost.py [--layers 32] [--steps 50] [--moe]

A Llama model of Llama-3-8B's depth but small widths (the graph is the same
size; the arrays are small, so evaluating each step stays cheap; ``--moe``: a
Qwen3-MoE model of 8 experts, top 2, whose SwitchGLU fuses too), with
bfloat16 weights (float32 with ``--moe``), MLX's mxfp4 layers (``mlx.nn.quantize``), mlx_fpqmm's
(``mlx_fpqmm.convert`` of the same) and those fused (``mlx_fpqmm.nn.fuse_projections``: q/k/v
and gate/up as one product each), each called on one token with a KV cache:
the median time of the call alone, before its graph is evaluated. Where a
decoding GPU waits on the host, this bounds the tokens per second.

On a CPU stream MLX's fast ops (``mx.fast.rope``, ``rms_norm``,
``scaled_dot_product_attention``) build their fallback graphs of several ops;
on a GPU stream each is one primitive. The second pair of rounds therefore
stands in for each with one primitive (a negation or a product: the graph's
size, not its values, is timed), which is the host's work on a GPU.
"""

import argparse
import statistics
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama, qwen3_moe

import mlx_fpqmm

# The decoding step's timing loop, shared with the end-to-end example.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from decode_speed import step_times  # noqa: E402


def small_model(layers: int, moe: bool) -> nn.Module:
    mx.random.seed(0)
    common = dict(
        hidden_size=256,
        num_hidden_layers=layers,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=1024,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    )
    if moe:
        module = qwen3_moe
        config = dict(
            common,
            model_type="qwen3_moe",
            head_dim=64,
            max_position_embeddings=512,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            moe_intermediate_size=256,
            norm_topk_prob=True,
        )
    else:
        module, config = llama, dict(common, model_type="llama")
    model = module.Model(module.ModelArgs.from_dict(config))
    # MLX's CPU gather_mm takes float32 only (the graph's size is the same).
    model.set_dtype(mx.float32 if moe else mx.bfloat16)
    mx.eval(model.parameters())
    return model


def quantized(layers: int, moe: bool, ours: bool, fused: bool = False) -> nn.Module:
    model = small_model(layers, moe)
    nn.quantize(model, group_size=32, bits=4, mode="mxfp4")
    if ours:
        mlx_fpqmm.convert(model)
    if fused:
        mlx_fpqmm.nn.fuse_projections(model)
    mx.eval(model.parameters())
    return model


def build_us(model: nn.Module, steps: int) -> float:
    """Median microseconds to build one token's graph."""
    return statistics.median(build for build, _, _ in step_times(model, steps)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--moe", action="store_true", help="a Qwen3-MoE model instead")
    args = parser.parse_args()
    models = {
        "float32" if args.moe else "bfloat16": small_model(args.layers, args.moe),
        "MLX mxfp4": quantized(args.layers, args.moe, ours=False),
        "mlx_fpqmm mxfp4": quantized(args.layers, args.moe, ours=True),
        "fused": quantized(args.layers, args.moe, ours=True, fused=True),
    }

    def rounds(label: str) -> None:
        for round_ in (1, 2):
            cells = (f"{name} {build_us(model, args.steps):.0f}" for name, model in models.items())
            print(f"{label}, round {round_}, us a token:", ", ".join(cells))

    rounds("fast ops as on this stream")
    mx.fast.rope = lambda x, *args, **kwargs: mx.negative(x)
    mx.fast.rms_norm = lambda x, weight, eps: mx.multiply(x, weight)
    mx.fast.scaled_dot_product_attention = lambda q, k, v, **kwargs: mx.negative(q)
    rounds("fast ops as one primitive each")


if __name__ == "__main__":
    main()
