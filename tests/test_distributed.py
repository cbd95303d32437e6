"""Tensor-parallel layers on MLX's ring backend, with two real processes on 127.0.0.1.

Each test starts one pair of ranks (tests/distributed_worker.py) that runs every case of
the test and reports relative errors against the unsharded model; a rank that fails or a
pair that hangs fails the test with the ranks' stderr within ``TIMEOUT`` seconds.
"""

import json
import os
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
TIMEOUT = 90.0
TOL = 1e-5


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


def run_ranks(case: str, tmp_path: Path, n: int = 2, timeout: float = TIMEOUT) -> list[dict]:
    """Run the worker's ``case`` on ``n`` ring ranks; their JSON results, by rank."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(n)]))
    procs, logs = [], []
    for rank in range(n):
        env = dict(os.environ, MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile))
        log = open(tmp_path / f"rank{rank}.log", "w+")
        logs.append(log)
        out = tmp_path / f"rank{rank}.json"
        cmd = [sys.executable, str(WORKER), case, str(out)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))

    def stderr_of(rank: int) -> str:
        logs[rank].flush()
        logs[rank].seek(0)
        return logs[rank].read()[-3000:]

    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                time.sleep(0.5)  # let the other ranks notice and write their errors
                codes = [p.poll() for p in procs]
                raise RankFailed(
                    f"rank {failed[0]} exited with code {codes[failed[0]]}; exit codes {codes}:\n"
                    + "\n".join(f"--- rank {r}:\n{stderr_of(r)}" for r in range(n))
                )
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                waiting = [r for r, c in enumerate(codes) if c is None]
                raise RankFailed(
                    f"ranks {waiting} still running after {timeout:.0f} s:\n"
                    + "\n".join(f"--- rank {r}:\n{stderr_of(r)}" for r in range(n))
                )
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in logs:
            log.close()
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


def check(results: list[dict], expected_cases: int) -> None:
    for rank, res in enumerate(results):
        assert (res["rank"], res["size"]) == (rank, 2)
        cases = {k: v for k, v in res.items() if isinstance(v, dict)}
        assert len(cases) == expected_cases, sorted(cases)
        for name, info in cases.items():
            assert info["out"] <= TOL, (rank, name, info)
            assert info.get("grad", 0.0) <= TOL, (rank, name, info)
            assert info.get("global_scale_kept", True), (rank, name, info)


@pytest.mark.slow
def test_layers_two_ranks(tmp_path):
    results = run_ranks("layers", tmp_path)
    check(results, expected_cases=len(ALL_MODES) * 3 + 1)
    cases = results[0]
    assert cases["fp8/all-to-sharded/segments=1"]["class"] == "QuantizedAllToShardedLinear"
    assert cases["fp4/sharded-to-all/segments=1"]["class"] == "QuantizedShardedToAllLinear"
    assert cases["switch/nvfp4-global-scale"]["class"] == "QuantizedSwitchLinear"


@pytest.mark.slow
def test_models_two_ranks(tmp_path):
    results = run_ranks("llama", tmp_path)
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
