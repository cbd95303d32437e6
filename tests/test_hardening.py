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


def test_exit_with_products_still_queued():
    """The interpreter exits while two CPU streams still run queued products:
    exit waits for them (MLX never joins its stream threads, and a product
    running under the static destructors corrupted the heap in 2 of 40 exits),
    so no task of ours is in flight when the later atexit handlers run."""
    code = """
import atexit, sys
import mlx.core as mx
# Registered before mlx_fpqmm's handler, so it runs after it.
atexit.register(lambda: print(sys.modules["mlx_fpqmm"]._ext._cpu_tasks_in_flight()))
import mlx_fpqmm
mx.set_default_device(mx.cpu)
w_q, s = mlx_fpqmm.quantize(mx.random.normal((4096, 4096)), mode="mxfp4")
x = mx.random.normal((4, 4096))
mx.eval(w_q, s, x)
other = mx.new_stream(mx.cpu)
mx.async_eval(
    *[mlx_fpqmm.fp4_qmm(x + i, w_q, s, stream=other if i % 2 else None) for i in range(200)]
)
print("exiting", mlx_fpqmm._ext._cpu_tasks_in_flight() > 0)
"""
    for _ in range(3):
        result = run_child(code, timeout=120)
        assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
        assert result.stdout.split() == ["exiting", "True", "0"], result.stdout


FAIL_THREAD_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
// Once FAIL_ARM is set, the FAIL_NTH-th thread creation fails (EAGAIN, as a process
// or cgroup limit makes it), once.
static atomic_int armed_calls;
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg) {
  static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  if (!real) real = dlsym(RTLD_NEXT, "pthread_create");
  if (getenv("FAIL_ARM") && atomic_fetch_add(&armed_calls, 1) + 1 == atoi(getenv("FAIL_NTH")))
    return EAGAIN;
  return real(t, a, f, arg);
}
"""


@pytest.mark.skipif(sys.platform != "linux", reason="an LD_PRELOAD shim of pthread_create")
@pytest.mark.parametrize("nth", [1, 3, 7])
def test_pool_runs_on_the_threads_the_system_lets_start(tmp_path, nth):
    """A refused thread while the pool starts leaves a smaller pool: right results,
    no hang (it left workers on freed memory: a garbage product, then a deadlock)."""
    shim = tmp_path / "fail_thread.so"
    source = tmp_path / "fail_thread.c"
    source.write_text(FAIL_THREAD_SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", shim, source, "-ldl"], check=True)
    code = """
import os, numpy as np, mlx.core as mx, mlx_fpqmm
mx.set_default_device(mx.cpu)
rng = np.random.default_rng(0)
w_q, s = mlx_fpqmm.quantize(mx.array(rng.standard_normal((4096, 1024), np.float32)), mode="mxfp4")
x = mx.array(rng.standard_normal((4, 1024), np.float32))
dense = mx.dequantize(w_q, s, mode="mxfp4", dtype=mx.float32)
expected = np.array(x, np.float64) @ np.array(dense, np.float64).T
os.environ["FAIL_ARM"] = "1"
for _ in range(10):
    y = np.array(mlx_fpqmm.fp4_qmm(x, w_q, s))
    assert np.abs(y - expected).max() < 1e-3 * np.abs(expected).max()
print(mlx_fpqmm._ext._cpu_threads())
"""
    env = {"LD_PRELOAD": str(shim), "FAIL_NTH": str(nth), "MLX_FPQMM_NUM_THREADS": "8"}
    result = run_child(code, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout) == min(nth, 8)  # the caller and the workers started first


@pytest.mark.parametrize(
    "value, threads",
    [("3", 3), ("100000", 256), ("99999999999", 256), ("abc", None), ("7abc", None),
     ("1e9", None), ("0", None), ("-2", None), ("-99999999999", None)],
)  # fmt: skip
def test_num_threads_setting(value, threads):
    """MLX_FPQMM_NUM_THREADS: a positive integer, at most 256 threads; anything else is
    a ValueError from the evaluation that starts the pool, product after product."""
    code = """
import mlx.core as mx, mlx_fpqmm
mx.set_default_device(mx.cpu)
w_q, s = mlx_fpqmm.quantize(mx.random.normal((256, 128)), mode="mxfp4")
for _ in range(2):
    try:
        mx.eval(mlx_fpqmm.fp4_qmm(mx.random.normal((4, 128)), w_q, s))
        print(mlx_fpqmm._ext._cpu_threads())
    except ValueError as e:
        print("ValueError", e)
"""
    result = run_child(code, timeout=120, env={"MLX_FPQMM_NUM_THREADS": value})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    if threads is None:
        message = f"ValueError MLX_FPQMM_NUM_THREADS='{value}' is not a positive integer"
        assert len(lines) == 2 and all(line.startswith(message) for line in lines), lines
    else:
        assert lines == [str(threads)] * 2


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
