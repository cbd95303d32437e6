"""The instruction counters (counters["instructions"]) on kernels whose
instructions per thread are known (tests/kernels/instruction_counts.metal).

The integer counts are address arithmetic: one zero-extension of the thread
index and one getelementptr per device array indexed with it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from metal_sim import Library
from metal_sim.instrument import CLASSES

KERNELS = Path(__file__).parent / "kernels"
THREADS = 64


@pytest.fixture(scope="module")
def counting() -> Library:
    return Library([KERNELS / "instruction_counts.metal"])


def per_thread(lib: Library, name: str, buffers: dict) -> dict[str, float]:
    result = lib.dispatch(name, buffers, grid=(2, 1, 1), threadgroup=(THREADS // 2, 1, 1))
    counts = result.counters["instructions"]
    assert set(counts) == set(CLASSES)
    return {c: counts[c] / THREADS for c in CLASSES}


def expected(**counts: float) -> dict[str, float]:
    return {c: counts.get(c, 0) for c in CLASSES}


def test_scalar_float_ops(counting: Library) -> None:
    x = np.arange(THREADS, dtype=np.float32)
    y = np.zeros(THREADS, np.float32)
    counts = per_thread(counting, "scale_and_shift", {0: x, 1: y})
    np.testing.assert_array_equal(y, x * 3 + 1)
    assert counts == expected(float=2, integer=3, memory=2)


def test_vector_ops_count_each_lane(counting: Library) -> None:
    x = np.arange(4 * THREADS, dtype=np.float32)
    y = np.zeros(4 * THREADS, np.float32)
    counts = per_thread(counting, "vector_lanes", {0: x, 1: y})
    np.testing.assert_array_equal(y, x * x + 1)
    assert counts == expected(float=8, integer=3, memory=2)


def test_conversions(counting: Library) -> None:
    x = np.linspace(-3, 3, THREADS).astype(np.float16)
    y = np.zeros(THREADS, np.float32)
    counts = per_thread(counting, "conversions", {0: x, 1: y})
    np.testing.assert_array_equal(y, np.trunc(x.astype(np.float32) * 2))
    assert counts == expected(float=1, integer=3, conversion=3, memory=2)


@pytest.mark.parametrize("n", [0, 5, 37])
def test_loops_count_every_iteration(counting: Library, n: int) -> None:
    x = np.full(THREADS, 0.5, np.float32)
    y = np.zeros(THREADS, np.float32)
    counts = per_thread(counting, "float_loop", {0: x, 1: y, 2: np.int32(n)})
    assert counts["float"] == 2 * n
    assert counts["memory"] == 3
    assert counts["conversion"] == counts["other"] == 0
    # the loop (unrolled by 8) branches at least once per unrolled step
    assert n // 8 <= counts["control"] <= n + 2


def test_sanitizer_checks_are_not_counted(counting: Library) -> None:
    x = np.arange(THREADS, dtype=np.uint32)
    y = np.zeros(THREADS, np.uint32)
    counts = per_thread(counting, "shift_and_xor", {0: x, 1: y, 2: np.uint32(3)})
    np.testing.assert_array_equal(y, (x << 3) ^ x)
    assert counts == expected(integer=5, memory=3)
