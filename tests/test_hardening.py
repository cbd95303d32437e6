"""Crash resistance: fuzzing in a child process, concurrency, fork, shutdown and
shapes beyond 2^31 elements."""

import ast
import os
import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from reference import qmm_reference, relative_error

import mlx_fpqmm

TESTS = Path(__file__).parent


def run_child(code_or_args, timeout=600, env=None):
    args = code_or_args if isinstance(code_or_args, list) else ["-c", code_or_args]
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TESTS,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_fuzz_random_arguments_never_crash():
    result = run_child([str(TESTS / "fuzz_ops.py"), "3000"])
    assert result.returncode == 0, result.stderr[-4000:]
    outcomes = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    # Only clean results and ValueError / TypeError are allowed, and the
    # generator must reach the kernels, not only the argument checks.
    assert set(outcomes) <= {"ok", "ValueError", "TypeError"}
    assert outcomes.get("ok", 0) > 50 and outcomes.get("ValueError", 0) > 1000


def problem(seed, M=9, N=200, K=256, mode="mxfp4"):
    rng = np.random.default_rng(seed)
    w_q, scales = mlx_fpqmm.quantize(mx.array(rng.standard_normal((N, K), np.float32)), mode=mode)
    x = mx.array(rng.standard_normal((M, K), np.float32))
    return x, w_q, scales


def test_many_threads_and_streams_match_serial():
    problems = [problem(seed, M=1 + seed % 12) for seed in range(12)]
    serial = [np.array(mlx_fpqmm.fp4_qmm(*p)) for p in problems]
    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []

    def worker(thread):
        try:
            # MLX streams belong to the thread that made them.
            streams = [mx.new_stream(mx.cpu) for _ in range(2)] + [None]
            for repeat in range(5):
                for i, p in enumerate(problems):
                    stream = streams[(thread + i) % len(streams)]
                    y = mlx_fpqmm.fp4_qmm(*p, stream=stream)
                    results[(thread, i, repeat)] = np.array(y)
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 8 * 5 * len(problems)
    for (_, i, _), y in results.items():
        np.testing.assert_array_equal(y, serial[i])


FORK_SCRIPT = """
import multiprocessing as mp, os, numpy as np, mlx.core as mx, mlx_fpqmm
mx.set_default_device(mx.cpu)
w_q, s = mlx_fpqmm.quantize(mx.ones((512, 256)), mode="mxfp4")
x = mx.ones((4, 256))

def use_op(_=None):
    mx.set_default_device(mx.cpu)
    return float(np.array(mlx_fpqmm.fp4_qmm(x, w_q, s)).sum())

def pid(_):
    return os.getpid()

if __name__ == "__main__":
    before = use_op()  # starts the pool
    with mp.get_context("fork").Pool(2) as pool:
        assert os.getpid() not in pool.map(pid, range(2))
    assert use_op() == before
    with mp.get_context("spawn").Pool(2) as pool:
        assert pool.map(use_op, range(2)) == [before, before]
    print("ok")
"""


def test_thread_pool_survives_fork(tmp_path):
    """The pool works in the parent after a fork and in spawned children.

    MLX itself cannot evaluate in a child forked after it ran (its stream
    threads are gone), so forked children here do not call MLX.
    """
    script = tmp_path / "fork_script.py"
    script.write_text(FORK_SCRIPT)
    result = run_child([str(script)], timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


@pytest.mark.slow
def test_pool_works_during_and_after_interpreter_shutdown():
    """The op runs from an atexit handler and the process exits cleanly.

    (Exiting while another thread is inside mx.eval aborts in MLX itself,
    with or without mlx_fpqmm, so that case is not tested.)
    """
    code = """
import atexit, mlx.core as mx, mlx_fpqmm
mx.set_default_device(mx.cpu)
w_q, s = mlx_fpqmm.quantize(mx.ones((4096, 1024)), mode="mxfp8")
x = mx.ones((64, 1024))
expected = mlx_fpqmm.fp8_qmm(x, w_q, s).sum().item()

def at_exit():
    assert mlx_fpqmm.fp8_qmm(x, w_q, s).sum().item() == expected
    print("at exit")

atexit.register(at_exit)
print("exiting")
"""
    for _ in range(3):
        result = run_child(code, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split() == ["exiting", "at", "exit"]


def test_more_than_2_to_the_31_weight_elements():
    """A dequantized weight of 2^31 + 2^20 elements: 64-bit index arithmetic."""
    N, K = 2**16 + 32, 2**15
    assert N * K > 2**31
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, size=(N, K // 8), dtype=np.uint32)
    scales = rng.integers(120, 130, size=(N, K // 32), dtype=np.uint8)
    w_q, s = mx.array(words), mx.array(scales)
    del words
    x = mx.array(rng.standard_normal((1, K), np.float32))
    y = mlx_fpqmm.fp4_qmm(x, w_q, s, mode="mxfp4")
    # Rows at the start, around 2^31 / K, and at the very end.
    for rows in (slice(0, 8), slice(2**16 - 8, 2**16 + 8), slice(N - 8, N)):
        reference = qmm_reference(x, w_q[rows], s[rows], "mxfp4")
        assert relative_error(y[:, rows], reference) < 1e-5


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_values_propagate_as_in_mlx(value):
    x, w_q, scales = problem(0, M=3, N=16, K=64)
    x = x.at[1, 5].add(value)
    ours = np.array(mlx_fpqmm.fp4_qmm(x, w_q, scales))
    theirs = np.array(mx.quantized_matmul(x, w_q, scales, mode="mxfp4"))
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-5, atol=1e-5)
