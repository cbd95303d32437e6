"""Tensor-parallel generation with mlx_fpqmm layers on MLX distributed.

Two processes on one machine, ring backend (the CPUs):

    .venv/bin/mlx.launch --backend ring -n 2 --python .venv/bin/python examples/sharded_generate.py

or by hand, with hosts.json = [["127.0.0.1:5000"], ["127.0.0.1:5001"]]:

    MLX_RANK=0 MLX_HOSTFILE=hosts.json .venv/bin/python examples/sharded_generate.py &
    MLX_RANK=1 MLX_HOSTFILE=hosts.json .venv/bin/python examples/sharded_generate.py

Two NVIDIA GPUs of one host, NCCL backend (one GPU per rank, NVLink multicast off):

    mlx.launch --backend nccl -n 2 --python python3 examples/sharded_generate.py --backend nccl

(by hand: ``MLX_RANK=r MLX_WORLD_SIZE=2 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=12345`` for each rank).

Every rank builds the same random llama (same seed: ``--model tiny``, or ``--model llama-3-8b``
for Llama-3-8B's shapes), quantizes it in mxfp4 on mlx_fpqmm's layers, generates greedily
unsharded (on its own device), then shards it over the group and generates again. Each rank
prints both token lists and their decode tokens per second (the tokens after the first, over
their time): the unsharded line is one device's rate, the sharded line the group's.

A rank whose peer dies or stops does not hang: every step that talks to the other ranks
(``mx.distributed.init``, a barrier, each sharded token) runs under a watchdog that kills the
process after ``--timeout`` seconds, and an error from the backend (the ring backend's
"connection to a peer was lost") ends it with exit code 1; both print the rank and the step on
stderr. (MLX 0.32.4's ring backend now and then fails its pending tasks without raising: then
the watchdog ends the rank.) (``mlx.launch`` then ends the other ranks, but exits with 0
whatever the ranks did.)
"""

import os

# Before MLX starts CUDA: NVLink multicast stays off (NCCL_NVLS_ENABLE=0; it can take a shared
# host's GPUs out of service), and a rank started by hand on one host gets the GPU of its rank
# (mlx.launch --backend nccl sets CUDA_VISIBLE_DEVICES itself).
os.environ["NCCL_NVLS_ENABLE"] = "0"
if "MLX_RANK" in os.environ:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", os.environ["MLX_RANK"])

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.models import llama

import mlx_fpqmm

MODELS = {
    "tiny": dict(
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
    "llama-3-8b": dict(
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
    ),
}

# The watchdog's own process: reads "<seconds>\t<message>" (a step starts) or "" (it ended)
# lines; when a step outlives its seconds, prints the message and kills the rank (argv[1]).
# A process of its own, as mx.distributed.init holds the GIL while it waits for the peers.
WATCHER = """
import os, select, signal, sys, time
rank_pid, deadline, message, pending = int(sys.argv[1]), None, "", b""
while True:
    wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    if select.select([0], [], [], wait)[0]:
        data = os.read(0, 1 << 16)
        if not data:
            sys.exit(0)  # the rank has exited
        *lines, pending = (pending + data).split(b"\\n")
        if lines:
            seconds, _, message = lines[-1].decode().partition("\\t")
            deadline = time.monotonic() + float(seconds) if seconds else None
    else:
        print(message, file=sys.stderr, flush=True)
        os.kill(rank_pid, signal.SIGKILL)
        sys.exit(0)
"""


class Watchdog:
    """Ends this rank when a step that talks to the other ranks takes too long.

    MLX's ring backend raises when a peer's connection closes but waits forever for a peer
    that is alive and stuck (or never started), and NCCL may wait forever for a dead one.
    While a :meth:`step` runs, a watcher process (``mx.distributed.init`` holds the GIL, so
    no thread of this one could) prints ``"<rank>: no progress for <timeout> s in <step>"``
    on stderr and kills this process (SIGKILL) once ``timeout`` seconds have passed. A
    ``RuntimeError`` raised in the step (the backend's error for a lost peer) exits with
    code 1 and a message naming the rank and the step.

    Args:
        timeout (float): The seconds one step may take.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.name = f"rank {os.environ.get('MLX_RANK', 0)}"
        self._watcher = subprocess.Popen(
            [sys.executable, "-c", WATCHER, str(os.getpid())], stdin=subprocess.PIPE
        )

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Watch the block as the step ``what`` (named in the messages)."""
        self._send(
            f"{self.timeout}\t{self.name}: no progress for {self.timeout:g} s in {what}; "
            "another rank is dead or stuck, ending this one"
        )
        try:
            yield
        except RuntimeError as e:
            sys.exit(f"{self.name}: lost another rank in {what}: {e}")
        finally:
            self._send("")

    def _send(self, line: str) -> None:
        self._watcher.stdin.write(line.encode() + b"\n")
        self._watcher.stdin.flush()


def random_model(name: str, layers: int | None) -> nn.Module:
    """The same random mxfp4 llama on every rank (seed 0), on mlx_fpqmm's layers."""
    config = dict(MODELS[name])
    if layers is not None:
        config["num_hidden_layers"] = layers
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    if name != "tiny":
        model.set_dtype(mx.bfloat16)
    mlx_fpqmm.nn.quantize(model, mode="mxfp4")
    mx.eval(model.parameters())
    return model


def decode(
    model: nn.Module,
    prompt: mx.array,
    tokens: int,
    watch: Watchdog | None = None,
    label: str = "",
) -> tuple[list[int], float]:
    """Greedy tokens and decode tokens per second (after the first token).

    With ``watch``, every token is a watched step named after ``label`` and its number.
    """
    out, start = [], 0.0
    steps = generate_step(prompt, model, max_tokens=tokens)
    for i in range(1, tokens + 1):
        with watch.step(f"{label} (token {i} of {tokens})") if watch else contextlib.nullcontext():
            token, _ = next(steps)
        out.append(int(token))
        if i == 1:
            start = time.perf_counter()
    return out, (len(out) - 1) / max(time.perf_counter() - start, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("ring", "nccl"), default="ring")
    parser.add_argument("--model", choices=tuple(MODELS), default="tiny")
    parser.add_argument("--tokens", type=int, default=None, help="default: 16 tiny, 128 8B")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers, to try 8B")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a step with collectives may take"
    )
    args = parser.parse_args()
    tokens = args.tokens or (16 if args.model == "tiny" else 128)

    watch = Watchdog(args.timeout)
    if args.backend == "ring":
        mx.set_default_device(mx.cpu)
    with watch.step(f"mx.distributed.init(backend={args.backend!r})"):
        # A world of one without MLX_HOSTFILE (ring) or NCCL_HOST_IP (nccl).
        group = mx.distributed.init(backend=args.backend)
    watch.name = f"rank {group.rank()} of {group.size()}"
    if args.backend == "nccl" and not mx.cuda.is_available():
        sys.exit("--backend nccl needs MLX's CUDA build (mlx[cuda13]) and NVIDIA GPUs")
    if args.backend == "nccl" and mx.device_count(mx.gpu) != 1:
        sys.exit(
            f"{watch.name}: sees {mx.device_count(mx.gpu)} GPUs; each rank needs its own "
            "(CUDA_VISIBLE_DEVICES=<one GPU>, as mlx.launch --backend nccl sets it)"
        )
    with watch.step("the all_sum barrier after init"):
        mx.eval(mx.distributed.all_sum(mx.ones(1), group=group))

    model = random_model(args.model, args.layers)
    if args.model == "tiny":
        prompt = mx.array([1, 2, 3, 4])
    else:
        prompt = mx.random.randint(0, MODELS[args.model]["vocab_size"], (16,), key=mx.random.key(1))
    name = f"{watch.name}:"
    print(
        f"{name} {args.backend}, {mx.default_device()}, mlx {mx.__version__}; {args.model} llama"
        f" ({len(model.layers)} layers, random weights, mxfp4), greedy, {tokens} tokens from a "
        f"{prompt.size}-token prompt",
        flush=True,
    )
    decode(model, prompt, 4)  # warm-up
    unsharded, rate = decode(model, prompt, tokens)
    print(f"{name} unsharded: {rate:.1f} tokens/s, tokens {unsharded}", flush=True)

    with mlx_fpqmm.nn.sharding():
        model.shard(group)
    mx.eval(model.parameters())
    decode(model, prompt, 4, watch, "the sharded model's all_sum, warm-up")
    sharded, rate = decode(model, prompt, tokens, watch, "the sharded model's all_sum")
    layer = model.layers[0].self_attn.q_proj
    leading = next(
        (i for i, (a, b) in enumerate(zip(sharded, unsharded, strict=True)) if a != b), tokens
    )
    print(
        f"{name} sharded over {group.size()} ({type(layer).__module__}.{type(layer).__name__}, "
        f"q_proj weight {tuple(layer.weight.shape)}): {rate:.1f} tokens/s, tokens {sharded}; "
        f"same as unsharded: {sharded == unsharded} ({leading}/{tokens} leading tokens)",
        flush=True,
    )


if __name__ == "__main__":
    main()
