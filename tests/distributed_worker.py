"""One rank of tests/test_distributed.py: ``python distributed_worker.py CASE OUT_DIR BACKEND``.

Run with MLX's environment for ``BACKEND``: ``MLX_RANK`` and ``MLX_HOSTFILE`` for ``ring``
(on the CPU), ``MLX_RANK``, ``MLX_WORLD_SIZE``, ``NCCL_HOST_IP`` and ``NCCL_PORT`` for
``nccl`` (on the GPU), as ``mlx.launch`` sets them. Every rank builds the same unsharded
layers from the same seed, shards them across the group and writes, per check, the relative
error of the sharded result against the unsharded one to ``OUT_DIR/rank<r>.json``.
"""

import os

# Before MLX starts CUDA: NVLink multicast off, and one GPU per rank (see sharded_generate.py).
os.environ["NCCL_NVLS_ENABLE"] = "0"
if "MLX_RANK" in os.environ:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", os.environ["MLX_RANK"])

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

import mlx_fpqmm
from mlx_fpqmm.nn import QuantizedLinear, shard_inplace, shard_linear

MODES = ("mxfp4", "nvfp4", "mxfp8", "fp4", "fp8")


def rel(a: mx.array, b: mx.array) -> float:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return (mx.abs(a - b).max() / mx.abs(b).max()).item()


def my_part(y: mx.array, group, segments: int = 1, axis: int = -1) -> mx.array:
    """This rank's slice of ``y`` along ``axis``, segment by segment (as MLX shards)."""
    n, r = group.size(), group.rank()
    return mx.concatenate(
        [mx.split(p, n, axis=axis)[r] for p in mx.split(y, segments, axis=axis)], axis=axis
    )


def grad_x(layer: nn.Module, x: mx.array, cotangent: mx.array) -> mx.array:
    """The gradient of ``sum(layer(x) * cotangent)`` with respect to ``x``."""
    return mx.grad(lambda x: (layer(x) * cotangent).sum())(x)


def layer_cases(group) -> dict:
    out = {}
    for mode in MODES:
        for sharding, segments, dtype in (
            ("all-to-sharded", 1, mx.float32),
            ("sharded-to-all", 1, mx.float32),
            ("all-to-sharded", 3, mx.float32),
            ("all-to-sharded", 1, mx.bfloat16),
            ("sharded-to-all", 1, mx.bfloat16),
        ):
            mx.random.seed(1)
            layer = QuantizedLinear(256, 384, mode=mode, global_scale=mode == "nvfp4")
            layer.bias = mx.random.normal((384,)).astype(dtype)
            x = mx.random.normal((2, 3, 256)).astype(dtype)
            cot = mx.random.normal((2, 3, 384)).astype(dtype)
            ref = layer(x)

            ref_grad = grad_x(layer, x, cot)
            sharded = shard_linear(layer, sharding, segments=segments, group=group)
            name = f"{mode}/{sharding}/" + (
                f"segments={segments}" if dtype == mx.float32 else "bfloat16"
            )
            info = {"class": type(sharded).__name__}
            if "global_scale" in layer:
                info["global_scale_kept"] = bool(
                    sharded.global_scale.shape == ()
                    and (sharded.global_scale == layer.global_scale).item()
                )
            if sharding == "all-to-sharded":
                my_cot = my_part(cot, group, segments)
                y = sharded(x)
                info["out"] = rel(y, my_part(ref, group, segments))
                grad = grad_x(sharded, x, my_cot)
                info["grad"] = rel(grad, ref_grad)
            else:
                x_mine = my_part(x, group)
                y = sharded(x_mine)
                info["out"] = rel(y, ref)
                grad = grad_x(sharded, x_mine, cot)
                info["grad"] = rel(grad, my_part(ref_grad, group))
            out[name] = info

    # Experts: shard_inplace keeps the per-expert (E,) global scale whole.
    from mlx_fpqmm.nn import QuantizedSwitchLinear

    mx.random.seed(2)
    up = QuantizedSwitchLinear(128, 256, 4, mode="nvfp4", global_scale=True)
    up.bias = mx.random.normal((4, 256))
    down = QuantizedSwitchLinear(256, 128, 4, bias=False, mode="nvfp4", global_scale=True)
    x = mx.random.normal((5, 1, 1, 128))
    idx = mx.array([[0, 1], [2, 3], [1, 1], [3, 0], [2, 2]])
    ref = down(nn.silu(up(x, idx)), idx)
    gs = (up.global_scale, down.global_scale)
    shard_inplace(up, "all-to-sharded", group=group)
    shard_inplace(down, "sharded-to-all", group=group)
    y = mx.distributed.all_sum(down(nn.silu(up(x, idx)), idx), group=group)
    out["switch/nvfp4-global-scale"] = {
        "class": type(up).__name__,
        "out": rel(y, ref),
        "global_scale_kept": bool(mx.array_equal(up.global_scale, gs[0]).item())
        and bool(mx.array_equal(down.global_scale, gs[1]).item()),
    }
    return out


def llama_cases(group) -> dict:
    from mlx_lm.generate import generate_step, generation_stream
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=256,
        head_dim=32,
        tie_word_embeddings=False,
        rope_theta=10000.0,
    )
    tokens = mx.array([[1, 5, 9, 200, 31, 7], [3, 3, 17, 100, 8, 99]])
    out = {}
    prompt = mx.array([1, 2, 3, 4])

    def greedy(model) -> list[int]:
        tokens = [int(t) for t, _ in generate_step(prompt, model, max_tokens=8)]
        # generate_step leaves one more step (its all_sums included) running on its own
        # stream, and MLX's ring backend cannot run two collectives at once: the next
        # case's all_sum on the default stream would mix with it (a wrong sum, 1 run in 60).
        mx.synchronize(generation_stream)
        return tokens

    for how in ("mxfp4-convert", "mxfp4-shard-then-convert", "nvfp4-global-scale", "fp8"):
        mx.random.seed(0)
        model = llama.Model(args)
        if how.startswith("mxfp4"):
            nn.quantize(model, mode="mxfp4")  # MLX's layers, as mlx-lm loads them
        else:
            mode = how.split("-")[0]
            mlx_fpqmm.nn.quantize(model, mode=mode, global_scale=mode == "nvfp4")
        ref, ref_tokens = model(tokens), greedy(model)
        if how == "mxfp4-shard-then-convert":
            model.shard(group)  # MLX's sharded classes, then ours
            mlx_fpqmm.convert(model)
        else:
            if how == "mxfp4-convert":
                mlx_fpqmm.convert(model)
            with mlx_fpqmm.nn.sharding():
                model.shard(group)
        q = model.model.layers[0].self_attn.q_proj
        o = model.model.layers[0].self_attn.o_proj
        out[f"llama/{how}"] = {
            "class": f"{type(q).__module__}.{type(q).__name__},{type(o).__name__}",
            "out": rel(model(tokens), ref),
            "same_greedy": greedy(model) == ref_tokens,
        }

    # Mixture of experts: model.shard calls shard_inplace on the experts.
    from mlx_lm.models import qwen3_moe

    moe_args = qwen3_moe.ModelArgs(
        model_type="qwen3_moe", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=256,
        head_dim=32, rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=512,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
        moe_intermediate_size=64, norm_topk_prob=True,
    )  # fmt: skip
    mx.random.seed(0)
    model = qwen3_moe.Model(moe_args)
    mlx_fpqmm.nn.quantize(
        model,
        mode="nvfp4",
        global_scale=True,
        class_predicate=lambda p, m: hasattr(m, "to_quantized") and not p.endswith(".gate"),
    )
    ref = model(tokens)
    experts = model.model.layers[0].mlp.switch_mlp.up_proj
    gs = experts.global_scale
    with mlx_fpqmm.nn.sharding():
        model.shard(group)
    out["qwen3_moe/nvfp4-global-scale"] = {
        "class": type(experts).__name__,
        "out": rel(model(tokens), ref),
        "global_scale_kept": bool(mx.array_equal(experts.global_scale, gs).item()),
    }
    return out


def main() -> None:
    case, out_dir, backend = sys.argv[1:4]
    if backend == "ring":
        mx.set_default_device(mx.cpu)
    group = mx.distributed.init(strict=True, backend=backend)
    if case == "die" and group.rank() == 1:
        print("rank 1 exits on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    if case == "hang" and group.rank() == 1:
        time.sleep(600)
    if case in ("die", "hang"):
        mx.eval(mx.distributed.all_sum(mx.ones(4), group=group))
    results = {"rank": group.rank(), "size": group.size(), "device": str(mx.default_device())}
    results.update({"layers": layer_cases, "llama": llama_cases}[case](group))
    (Path(out_dir) / f"rank{group.rank()}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
