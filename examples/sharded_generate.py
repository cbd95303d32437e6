"""Tensor-parallel generation with mlx_fpqmm layers on MLX distributed.

Two processes on one machine, ring backend:

    mlx.launch --backend ring -n 2 --python .venv/bin/python examples/sharded_generate.py

or by hand, with hosts.json = [["127.0.0.1:5000"], ["127.0.0.1:5001"]]:

    MLX_RANK=0 MLX_HOSTFILE=hosts.json .venv/bin/python examples/sharded_generate.py &
    MLX_RANK=1 MLX_HOSTFILE=hosts.json .venv/bin/python examples/sharded_generate.py

Every rank builds the same tiny random llama (same seed), quantizes it in mxfp4 on
mlx_fpqmm's layers, generates greedily unsharded, then shards it over the group and
generates again: both ranks print the same tokens as the unsharded model.
"""

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models import llama

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
    tie_word_embeddings=False,
)


def greedy(model, prompt: mx.array) -> list[int]:
    return [int(t) for t, _ in generate_step(prompt, model, max_tokens=16)]


def main() -> None:
    mx.set_default_device(mx.cpu)
    group = mx.distributed.init(backend="ring")  # a world of one without a hostfile
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(TINY_LLAMA))
    mlx_fpqmm.nn.quantize(model, mode="mxfp4")
    prompt = mx.array([1, 2, 3, 4])
    unsharded = greedy(model, prompt)

    with mlx_fpqmm.nn.sharding():
        model.shard(group)
    sharded = greedy(model, prompt)
    layer = model.layers[0].self_attn.q_proj
    print(
        f"rank {group.rank()} of {group.size()}: {type(layer).__module__}.{type(layer).__name__}, "
        f"weight {tuple(layer.weight.shape)}; tokens {sharded}; "
        f"same as unsharded: {sharded == unsharded}",
        flush=True,
    )


if __name__ == "__main__":
    main()
