"""Tensor-parallel layers on MLX distributed, with real processes as the ranks.

Each two-rank test starts one group of processes (tests/distributed_worker.py, or
examples/sharded_generate.py) on MLX's ring backend over 127.0.0.1 (the CPUs) and, where MLX's
CUDA build sees two GPUs, on its NCCL backend (one GPU per rank); a rank that fails or a group
that hangs fails the test with the ranks' output within ``TIMEOUT`` seconds.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from reference import ALL_MODES

import mlx_fpqmm
from mlx_fpqmm.nn import (
    QuantizedAllToShardedLinear,
    QuantizedLinear,
    QuantizedShardedToAllLinear,
    shard_inplace,
    shard_linear,
)

WORKER = Path(__file__).with_name("distributed_worker.py")
EXAMPLE = Path(__file__).parents[1] / "examples" / "sharded_generate.py"
TIMEOUT = 90.0
TOL = 1e-5
TOL_BF16 = 2**-5  # bfloat16: each rank rounds its partial sums (a few ulps apart; measured 0.0065)
TWO_GPUS = mx.distributed.is_available(backend="nccl") and mx.device_count(mx.gpu) >= 2
BACKENDS = [
    "ring",
    pytest.param(
        "nccl",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not TWO_GPUS, reason="NCCL: MLX's CUDA build sees fewer than 2 GPUs"
            ),
        ],
    ),
]


class RankFailed(RuntimeError):
    pass


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Ranks:
    """``python argv...`` started as the ranks of one group of ``n`` on ``backend``.

    Each rank gets MLX's environment for the backend (as ``mlx.launch`` sets it: a hostfile
    on 127.0.0.1 for ``ring``; ``MLX_WORLD_SIZE``, ``NCCL_HOST_IP``, ``NCCL_PORT`` and one GPU
    per rank for ``nccl``) and writes its stdout and stderr to ``tmp_path/rank<r>.log``.
    Only the ranks in ``start`` are started (the others never join). Each rank leads a
    process group of its own (with the example's watchdog process); use as a context manager:
    the groups are killed at the end.
    """

    def __init__(
        self,
        argv: list[str],
        tmp_path: Path,
        backend: str = "ring",
        n: int = 2,
        start: list[int] | None = None,
    ) -> None:
        if backend == "ring":
            hostfile = tmp_path / "hosts.json"
            hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(n)]))
            common = {"MLX_HOSTFILE": str(hostfile)}
        else:
            common = {
                "MLX_WORLD_SIZE": str(n),
                "NCCL_HOST_IP": "127.0.0.1",
                "NCCL_PORT": str(free_ports(1)[0]),
            }
        self.logs = {r: open(tmp_path / f"rank{r}.log", "w+") for r in start or range(n)}
        self.procs = {}
        for rank, log in self.logs.items():
            env = dict(os.environ, **common, MLX_RANK=str(rank))
            if backend == "nccl":
                env["CUDA_VISIBLE_DEVICES"] = str(rank)
            self.procs[rank] = subprocess.Popen(
                [sys.executable, *map(str, argv)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group: the rank and its children
            )

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for log in self.logs.values():
            log.close()

    def output(self, rank: int) -> str:
        self.logs[rank].flush()
        self.logs[rank].seek(0)
        return self.logs[rank].read()

    def report(self) -> str:
        return "\n".join(f"--- rank {r}:\n{self.output(r)[-3000:]}" for r in self.logs)

    def wait_for(self, rank: int, text: str, timeout: float = TIMEOUT) -> None:
        """Until ``text`` is in the output of ``rank``."""
        deadline = time.monotonic() + timeout
        while text not in self.output(rank):
            if self.procs[rank].poll() is not None or time.monotonic() > deadline:
                raise RankFailed(f"rank {rank} never printed {text!r}:\n{self.report()}")
            time.sleep(0.01)

    def wait(self, timeout: float = TIMEOUT) -> list[str]:
        """The outputs, by rank, once every rank has exited with 0; else :class:`RankFailed`."""
        deadline = time.monotonic() + timeout
        while True:
            codes = {r: p.poll() for r, p in self.procs.items()}
            failed = [r for r, c in codes.items() if c not in (None, 0)]
            if failed:
                time.sleep(0.5)  # let the other ranks notice and write their errors
                codes = {r: p.poll() for r, p in self.procs.items()}
                raise RankFailed(
                    f"rank {failed[0]} exited with code {codes[failed[0]]}; exit codes "
                    f"{list(codes.values())}:\n{self.report()}"
                )
            if all(c == 0 for c in codes.values()):
                return [self.output(r) for r in self.logs]
            if time.monotonic() > deadline:
                waiting = [r for r, c in codes.items() if c is None]
                raise RankFailed(
                    f"ranks {waiting} still running after {timeout:.0f} s:\n{self.report()}"
                )
            time.sleep(0.05)


def run_ranks(
    case: str, tmp_path: Path, backend: str = "ring", timeout: float = TIMEOUT
) -> list[dict]:
    """Run the worker's ``case`` on two ranks of ``backend``; their JSON results, by rank."""
    with Ranks([WORKER, case, tmp_path, backend], tmp_path, backend) as ranks:
        ranks.wait(timeout)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def check(results: list[dict], expected_cases: int) -> None:
    for rank, res in enumerate(results):
        assert (res["rank"], res["size"]) == (rank, 2)
        cases = {k: v for k, v in res.items() if isinstance(v, dict)}
        assert len(cases) == expected_cases, sorted(cases)
        for name, info in cases.items():
            tol = TOL_BF16 if name.endswith("bfloat16") else TOL
            assert info["out"] <= tol, (rank, name, info)
            assert info.get("grad", 0.0) <= tol, (rank, name, info)
            assert info.get("global_scale_kept", True), (rank, name, info)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_layers_two_ranks(backend, tmp_path):
    results = run_ranks("layers", tmp_path, backend)
    assert results[0]["device"] == ("Device(cpu, 0)" if backend == "ring" else "Device(gpu, 0)")
    check(results, expected_cases=len(ALL_MODES) * 5 + 1)
    cases = results[0]
    for mode in ALL_MODES:
        for name in ("all-to-sharded/segments=1", "all-to-sharded/segments=3"):
            assert cases[f"{mode}/{name}"]["class"] == "QuantizedAllToShardedLinear"
        assert cases[f"{mode}/all-to-sharded/bfloat16"]["class"] == "QuantizedAllToShardedLinear"
        for name in ("sharded-to-all/segments=1", "sharded-to-all/bfloat16"):
            assert cases[f"{mode}/{name}"]["class"] == "QuantizedShardedToAllLinear"
    assert cases["switch/nvfp4-global-scale"]["class"] == "QuantizedSwitchLinear"


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_models_two_ranks(backend, tmp_path):
    results = run_ranks("llama", tmp_path, backend)
    check(results, expected_cases=5)
    llama = ("mxfp4-convert", "mxfp4-shard-then-convert", "nvfp4-global-scale", "fp8")
    for res in results:
        for name in llama:
            assert res[f"llama/{name}"]["class"] == (
                "mlx_fpqmm._sharded.QuantizedAllToShardedLinear,QuantizedShardedToAllLinear"
            )
            assert res[f"llama/{name}"]["same_greedy"], name
        assert res["qwen3_moe/nvfp4-global-scale"]["class"] == "QuantizedSwitchLinear"


@pytest.mark.slow
def test_dead_rank_fails_fast(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank \d exited with code") as failure:
        run_ranks("die", tmp_path, timeout=30)
    assert "rank 1 exits on purpose" in str(failure.value)
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_hung_rank_times_out(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"ranks \[0, 1\] still running after 5 s"):
        run_ranks("hang", tmp_path, timeout=5)
    assert time.monotonic() - start < 15


# ------------------------------------------------------ examples/sharded_generate.py

LINE = re.compile(
    r"^rank (\d) of 2: (unsharded|sharded over 2 \((?P<layer>[\w.]+), q_proj weight "
    r"(?P<shape>\(\d+, \d+\))\)): (?P<rate>[\d.]+) tokens/s, tokens (?P<tokens>\[[\d, ]*\])",
    re.M,
)


def generated(outputs: list[str]) -> list[dict]:
    """Per rank, the example's lines: ``{"unsharded": match, "sharded": match}``."""
    ranks = []
    for rank, text in enumerate(outputs):
        lines = {m[2].split(" ")[0]: m for m in LINE.finditer(text) if int(m[1]) == rank}
        assert set(lines) == {"unsharded", "sharded"}, text
        ranks.append(lines)
    return ranks


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_generate_two_ranks(backend, tmp_path):
    with Ranks([EXAMPLE, "--backend", backend], tmp_path, backend) as ranks:
        outputs = ranks.wait()
    lines = generated(outputs)
    tokens = json.loads(lines[0]["unsharded"]["tokens"])
    assert len(tokens) == 16
    for rank, out in enumerate(lines):
        assert json.loads(out["unsharded"]["tokens"]) == tokens, rank
        assert json.loads(out["sharded"]["tokens"]) == tokens, rank
        assert out["sharded"]["layer"] == "mlx_fpqmm._sharded.QuantizedAllToShardedLinear"
        assert out["sharded"]["shape"] == "(128, 32)"  # half of 256 rows, 256 fp4 / 32 words
        assert f"rank {rank} of 2: {backend}, " in outputs[rank]
        assert "same as unsharded: True (16/16 leading tokens)" in outputs[rank]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS[1:])  # the CPUs quantize 8B too slowly
def test_sharded_generate_llama3_8b_shapes(backend, tmp_path):
    argv = [EXAMPLE, "--backend", backend, "--model", "llama-3-8b", "--tokens", "16"]
    with Ranks(argv, tmp_path, backend) as ranks:
        outputs = ranks.wait(600)
    lines = generated(outputs)
    for out in lines:
        assert out["sharded"]["shape"] == "(2048, 512)"  # 4096 rows over 2, 4096 fp4 / 32
        assert float(out["sharded"]["rate"]) > 0 and float(out["unsharded"]["rate"]) > 0
    # all_sum gives every rank the same bits: the ranks' sharded tokens agree.
    assert lines[0]["sharded"]["tokens"] == lines[1]["sharded"]["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_generate_through_mlx_launch(backend, tmp_path):
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    launcher = shutil.which("mlx.launch", path=path)
    assert launcher, f"no mlx.launch beside {sys.executable} or on PATH"
    port = ["--starting-port" if backend == "ring" else "--nccl-port", str(free_ports(1)[0])]
    cmd = [launcher, "--backend", backend, "-n", "2", *port, "--python", sys.executable]
    done = subprocess.run(
        [*cmd, "--", EXAMPLE, "--backend", backend],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    # mlx.launch exits with 0 whatever the ranks did: only their output tells.
    assert "[WARN]" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.stdout.count("same as unsharded: True (16/16 leading tokens)") == 2, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_sharded_generate_dead_rank(backend, how, tmp_path):
    """Rank 1 is killed (or stopped) once it has generated unsharded: rank 0, in the sharded
    model's collectives, ends with a message naming itself and the step, within a bound."""
    argv = [EXAMPLE, "--backend", backend, "--tokens", "32", "--timeout", "3"]
    with Ranks(argv, tmp_path, backend) as ranks:
        ranks.wait_for(1, "rank 1 of 2: unsharded:")
        # The whole process group: a stopped rank's own watchdog must not end it.
        os.killpg(ranks.procs[1].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        start = time.monotonic()
        code = ranks.procs[0].wait(15)
        elapsed = time.monotonic() - start
        output = ranks.output(0)
    step = r"in the sharded model's all_sum(, warm-up)? \(token \d+ of (4|32)\)"
    lost = r"rank 0 of 2: lost another rank " + step
    stuck = r"rank 0 of 2: no progress for 3 s " + step + "; another rank is dead or stuck"
    if how == "killed" and backend == "ring" and code == 1:
        # The ring backend sees the closed connection and raises.
        assert re.search(lost + r": \[ring\] connection to a peer was lost", output), output
        assert elapsed < 5
    elif how == "killed" and backend == "ring":
        # Or (MLX 0.32.4, now and then) it fails its pending tasks without raising, and the
        # step hangs: the watchdog ends rank 0.
        assert code == -signal.SIGKILL and re.search(stuck, output), output
        assert "[ring] Too many send/recv errors" in output, output
        assert elapsed < 3 + 5
    elif how == "killed":  # NCCL: its error or the watchdog, whichever comes first
        assert code in (1, -signal.SIGKILL) and re.search(f"{lost}|{stuck}", output), output
        assert elapsed < 3 + 5
    else:  # a stopped peer never answers: the watchdog ends rank 0
        assert code == -signal.SIGKILL and re.search(stuck, output), output
        assert elapsed < 3 + 5


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_generate_missing_rank(backend, tmp_path):
    """Rank 1 never starts: rank 0 waits in mx.distributed.init (which holds the GIL) until
    the watchdog ends it."""
    argv = [EXAMPLE, "--backend", backend, "--timeout", "2"]
    with Ranks(argv, tmp_path, backend, start=[0]) as ranks:
        code = ranks.procs[0].wait(30)
        output = ranks.output(0)
    assert code == -signal.SIGKILL, output
    message = f"rank 0: no progress for 2 s in mx.distributed.init(backend='{backend}')"
    assert message in output, output


# ---------------------------------------------------------------- one process


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("sharding", ["all-to-sharded", "sharded-to-all"])
def test_world_of_one_is_unsharded(mode, sharding):
    group = mx.distributed.init()
    assert group.size() == 1
    layer = QuantizedLinear(128, 96, mode=mode, global_scale=mode == "nvfp4")
    layer.bias = mx.random.normal((96,))
    x = mx.random.normal((3, 128))
    sharded = shard_linear(layer, sharding, segments=3 if sharding == "all-to-sharded" else 1)
    cls = {"all-to-sharded": QuantizedAllToShardedLinear}.get(sharding, QuantizedShardedToAllLinear)
    assert type(sharded) is cls
    base = {"all-to-sharded": nn.QuantizedAllToShardedLinear}.get(
        sharding, nn.QuantizedShardedToAllLinear
    )
    assert isinstance(sharded, base)
    for key in ("weight", "scales", "bias") + (("global_scale",) if mode == "nvfp4" else ()):
        assert mx.array_equal(sharded[key], layer[key]), key
    assert mx.array_equal(sharded(x), layer(x))
    g = mx.grad(lambda x: sharded(x).sum())(x)
    assert mx.array_equal(g, mx.grad(lambda x: layer(x).sum())(x))
    assert not sharded.trainable_parameters()
    assert f"mode={mode}" in repr(sharded)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_constructors(mode):
    a = QuantizedAllToShardedLinear(128, 64, mode=mode, global_scale=mode == "nvfp4")
    b = QuantizedShardedToAllLinear(64, 128, bias=False, mode=mode)
    y = b(a(mx.random.normal((2, 128))))
    assert y.shape == (2, 128)
    assert ("global_scale" in a) == (mode == "nvfp4")
    if mode == "nvfp4":
        assert a.global_scale.shape == () and a.global_scale.dtype == mx.float32
    assert "bias" not in b and a.bias.shape == (64,)


def test_delegates_to_mlx():
    lin = nn.Linear(64, 32)
    assert type(shard_linear(lin, "all-to-sharded")) is nn.AllToShardedLinear
    affine = nn.QuantizedLinear(64, 32)
    assert type(shard_linear(affine, "sharded-to-all")) is nn.QuantizedShardedToAllLinear
    with pytest.raises(ValueError, match="not supported"):
        shard_linear(QuantizedLinear(64, 32), "rows")
    with pytest.raises(ValueError, match="fp mode"):
        QuantizedAllToShardedLinear.from_quantized_linear(affine)


class _TwoRanks:
    """A group's size and rank, for the checks made before any sharding."""

    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 0


def test_unequal_shards_are_refused():
    two = _TwoRanks()
    by_group = r"input of size 96 across 2 devices: .*multiples of 64 \(2 devices x group size 32\)"
    with pytest.raises(ValueError, match=by_group):
        QuantizedShardedToAllLinear(96, 64, mode="mxfp4", group=two)
    with pytest.raises(ValueError, match=by_group):
        shard_linear(QuantizedLinear(96, 64, mode="mxfp4"), "sharded-to-all", group=two)
    with pytest.raises(ValueError, match=r"output of size 64 in 3 segments across 2 devices"):
        shard_linear(QuantizedLinear(64, 64), "all-to-sharded", segments=3, group=two)
    with pytest.raises(ValueError, match=r"output of size 65 across 2 devices"):
        QuantizedAllToShardedLinear(64, 65, group=two)
    layer = QuantizedLinear(128, 8, mode="nvfp4")
    with pytest.raises(ValueError, match=r"input of size 128 in 2 segments"):
        shard_linear(layer, "sharded-to-all", segments=[0.375], group=two)
    layer = QuantizedShardedToAllLinear(128, 64, mode="mxfp4", group=two)
    assert layer.weight.shape == (64, 64 * 4 // 32)


def test_shard_inplace_keeps_global_scales():
    layer = QuantizedLinear(64, 32, mode="nvfp4", global_scale=True)
    gs = layer.global_scale
    shard_inplace(layer, "all-to-sharded")  # MLX's raises IndexError on the 0-d scale
    assert layer.global_scale is gs or mx.array_equal(layer.global_scale, gs)
    seen = []
    shard_inplace(layer, lambda path, w: seen.append(path) or None)
    assert "global_scale" not in seen and "weight" in seen


def test_sharding_context_routes_mlx_lm():
    from mlx.nn.layers import distributed
    from mlx_lm.models import llama

    mlx_fn = distributed.shard_linear
    with mlx_fpqmm.nn.sharding():
        assert llama.shard_linear is shard_linear
        assert distributed.shard_linear is shard_linear
    assert llama.shard_linear is mlx_fn and distributed.shard_linear is mlx_fn


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
def test_convert_maps_mlx_sharded_layers(mode):
    from mlx.nn.layers import distributed

    model = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 128), nn.Linear(128, 32))
    nn.quantize(model, mode=mode, class_predicate=lambda p, m: p != "layers.2")
    model.layers[2] = nn.QuantizedLinear.from_linear(model.layers[2])  # affine: left alone
    model.layers[0] = distributed.shard_linear(model.layers[0], "all-to-sharded")
    model.layers[1] = distributed.shard_linear(model.layers[1], "sharded-to-all")
    x = mx.random.normal((2, 128))
    ref = model(x)
    report = mlx_fpqmm.convert(model)
    assert report.converted == {"layers.0": mode, "layers.1": mode}
    assert type(model.layers[0]) is QuantizedAllToShardedLinear
    assert type(model.layers[1]) is QuantizedShardedToAllLinear
    assert model.layers[0].group is not None
    assert mx.allclose(model(x), ref, rtol=1e-5, atol=1e-5)
    assert mlx_fpqmm.convert(model).skipped["layers.0"] == "already mlx_fpqmm"
