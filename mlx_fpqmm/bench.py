"""CPU benchmark: mlx_fpqmm against the alternatives, measured in one run.

``python -m mlx_fpqmm.bench`` times, for each shape, mode and dtype, our op,
``mx.quantized_matmul`` on the CPU, dequantize + matmul in MLX and a dense
float32 matmul in NumPy of the same shape, next to two limits measured in the
same run: the memory read bandwidth (a streaming read on every core) and the
NumPy sgemm rate. Slow MLX baselines are measured where they fit a time budget
and extrapolated linearly in M beyond it (marked ``~``).

``--vs-ggml`` adds ggml's CPU backend (the engine of llama.cpp) for the modes
ggml has (mxfp4, nvfp4), with the same threads: its plain kernels and its
repacked weights (the CPU_REPACK buffer type llama.cpp loads weights into).
ggml rounds the activations to 8 bits, so its columns are inexact in x. The
glue to ggml is one of mlx_fpqmm's development tools, not part of the
library: it needs ``pip install -e 'tools/fpqmm_dev[ggml]'`` from the source
checkout (``fpqmm_dev.ggml_glue``, with ggml-python); without it the ggml
columns are left out, saying why.

``--tails`` times M = 1 products over a set of K (the K-tail table): time per
weight byte and its ratio to the best K of the set.

``--moe`` times the mixture-of-experts product instead: ``gather_qmm`` against
``mx.gather_qmm`` for one expert projection (a gpt-oss-20b-like one by
default: 32 experts of 2880 x 2880, top 4), with fresh random routing on every
call so that the experts' weights come from memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

import mlx.core as mx
import numpy as np

import mlx_fpqmm

from . import _bench_gpu, _ext
from ._formats import FORMATS, MLX_MODES

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))
ROWS = (1, 2, 4, 8, 16, 32, 128, 512)
SMALL_M = 16  # rows up to this many are compared with M = 1 and cycle their weights
MODES = ("mxfp4", "nvfp4", "mxfp8")
DTYPES = ("float32", "bfloat16")
L3_BYTES = 32 << 20
MAX_REPS = 1000  # timed calls of ours or ggml within --min-time
TAIL_N = 2048
TAIL_KS = (2816, 2848, 2880, 2944, 3008, 3072)


@dataclass
class Timing:
    best: float  # seconds
    median: float
    estimated: bool = False  # extrapolated, not measured

    def ms(self) -> str:
        return f"{'~' if self.estimated else ''}{self.best * 1e3:.3g}"


@dataclass
class GgmlTimes:
    """ggml's time for one product, plain and with repacked weights (None: not run)."""

    plain: Timing | None
    repacked: Timing | None
    notes: list[str] = field(default_factory=list)  # why a column is missing


@dataclass
class Row:
    M: int
    N: int
    K: int
    mode: str
    dtype: str
    weight_bytes: int
    ours: Timing
    mlx_qmm: Timing | None
    mlx_dequant_matmul: Timing | None
    numpy_f32: Timing
    derived: dict[str, float] = field(default_factory=dict)
    after_idle: Timing | None = None  # M = 1: the first call after a pause
    ggml: GgmlTimes | None = None


def measure(
    run: Callable[[int], object], reps: int, min_time: float = 0.2, max_reps: int = 50
) -> Timing:
    """Best and median of at least `reps` timed calls (more while under min_time)."""
    return measure_rounds([run], reps, min_time, max_reps)[0]


def measure_rounds(
    runs: list[Callable[[int], object]], reps: int, min_time: float, max_reps: int
) -> list[Timing]:
    """`measure` for several products taking turns, one call each per round: a
    slow moment of the machine then weighs on all of them alike."""
    for run in runs:
        run(0)  # warm up: first-call allocations and dispatch
    times: list[list[float]] = [[] for _ in runs]
    start = time.perf_counter()
    while len(times[0]) < reps or (
        time.perf_counter() - start < min_time and len(times[0]) < max_reps
    ):
        for run, taken in zip(runs, times, strict=True):
            t = time.perf_counter()
            run(len(taken) + 1)
            taken.append(time.perf_counter() - t)
    return [Timing(min(t), statistics.median(t)) for t in times]


def read_bandwidth(threads: int, size: int = 1 << 30, reps: int = 5) -> Timing:
    """Seconds per GiB of a streaming read, one NumPy reduction per thread."""
    data = np.ones(size // 8, dtype=np.uint64)
    chunks = np.array_split(data, threads)

    def read_all() -> None:
        workers = [threading.Thread(target=np.bitwise_or.reduce, args=(c,)) for c in chunks]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return measure(lambda _: read_all(), reps)


def sgemm_time(n: int = 4096, reps: int = 5) -> Timing:
    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    return measure(lambda _: a @ b, reps)


class Extrapolator:
    """Times a slow baseline while it fits the budget, then extrapolates linearly in M."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.points: dict[tuple, list[tuple[int, float]]] = {}

    def __call__(self, key: tuple, M: int, run: Callable[[], object]) -> Timing | None:
        points = self.points.setdefault(key, [])
        estimate = self.estimate(points, M)
        if estimate is None or estimate < self.budget:
            t = time.perf_counter()
            run()
            elapsed = time.perf_counter() - t
            points.append((M, elapsed))
            return Timing(elapsed, elapsed)
        return Timing(estimate, estimate, estimated=True)

    @staticmethod
    def estimate(points: list[tuple[int, float]], M: int) -> float | None:
        if not points:
            return None
        if len(points) == 1:
            return points[0][1] * M / points[0][0]
        (m0, t0), (m1, t1) = points[-2:]
        slope = (t1 - t0) / (m1 - m0)
        return t1 + slope * (M - m1)


def threads_used() -> int:
    """The threads our CPU kernels run on (MLX_FPQMM_NUM_THREADS, else every core)."""
    return _ext._cpu_threads()


def copies_to_cycle(M: int, weight_bytes: int, args: argparse.Namespace) -> int:
    """Copies of the weights that small-M products cycle through so they read them
    from memory, not from the last-level cache (--cycle-bytes in all)."""
    if M > SMALL_M:
        return 1
    return max(1, -(-args.cycle_bytes // weight_bytes))


@dataclass
class Weights:
    """One float matrix, quantized by us, with copies to cycle through."""

    float32: np.ndarray  # N x K, what every library quantizes itself
    mode: str
    copies: list[tuple[mx.array, mx.array]]
    weight_bytes: int


def make_weights(M: int, N: int, K: int, mode: str, args: argparse.Namespace) -> Weights:
    w = mx.random.normal((N, K))
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    weight_bytes = w_q.nbytes + scales.nbytes
    copies = copies_to_cycle(M, weight_bytes, args)
    cycled = [(mx.array(np.array(w_q)), mx.array(np.array(scales))) for _ in range(copies)]
    mx.eval(cycled)
    return Weights(np.array(w), mode, cycled, weight_bytes)


def time_ours(x: mx.array, weights: Weights) -> Callable[[int], None]:
    """A call of our op for `measure`: call i uses weight copy i (cycling)."""
    op = mlx_fpqmm.qmm_for_mode(weights.mode)
    copies = weights.copies

    def ours(i: int) -> None:
        w, s = copies[i % len(copies)]
        mx.eval(op(x, w, s, mode=weights.mode))

    return ours


def after_idle(run: Callable[[int], object], call: int, pause: float) -> Timing:
    """One call after `pause` seconds of idling (threads asleep, clocks down)."""
    time.sleep(pause)
    t = time.perf_counter()
    run(call)
    elapsed = time.perf_counter() - t
    return Timing(elapsed, elapsed)


GGML_GLUE_HINT = "pip install -e 'tools/fpqmm_dev[ggml]' from mlx_fpqmm's source checkout"


def ggml_glue() -> ModuleType:
    """The glue to ggml (``fpqmm_dev.ggml_glue``, mlx_fpqmm's development tools), imported
    for ``--vs-ggml`` only; ImportError where those tools are not installed."""
    from fpqmm_dev import ggml_glue

    return ggml_glue


def bench_ggml(M: int, weights: Weights, args: argparse.Namespace) -> GgmlTimes:
    """ggml's plain and repacked products on the same float matrix, quantized by
    ggml's own quantizer, with as many weight copies as ours cycles through."""
    glue = ggml_glue()
    times = GgmlTimes(None, None)
    try:
        quantized = glue.quantize(weights.float32, weights.mode)
    except glue.GgmlUnavailable as error:
        times.notes.append(str(error))
        return times
    copies = copies_to_cycle(M, quantized.nbytes, args)
    x = np.random.default_rng(0).standard_normal((M, weights.float32.shape[1]), np.float32)
    for repack in (False, True):
        try:
            matmul = glue.GgmlMatmul(
                weights.float32,
                weights.mode,
                rows=M,
                threads=threads_used(),
                repack=repack,
                copies=copies,
                quantized=quantized,
            )
        except glue.GgmlUnavailable as error:
            times.notes.append(str(error))
            continue
        with matmul:
            matmul.set_x(x)
            timing = measure(matmul.run, args.reps, args.min_time, MAX_REPS)
        if repack:
            times.repacked = timing
        else:
            times.plain = timing
    # ggml's OpenMP threads spin for a while after a product: let them sleep.
    time.sleep(0.2)
    return times


def bench_row(
    M: int,
    N: int,
    K: int,
    mode: str,
    dtype_name: str,
    args: argparse.Namespace,
    slow: Extrapolator,
    ggml_cache: dict[tuple, GgmlTimes] | None = None,
) -> Row:
    dtype = getattr(mx, dtype_name)
    weights = make_weights(M, N, K, mode, args)
    w_q, scales = weights.copies[0]
    x = mx.random.normal((M, K)).astype(dtype)
    mx.eval(x)
    ours = time_ours(x, weights)
    result = measure(ours, args.reps, args.min_time, MAX_REPS)
    idle = after_idle(ours, 1, args.idle) if M == 1 and args.idle > 0 else None

    def mlx_qmm() -> None:
        mx.eval(mx.quantized_matmul(x, w_q, scales, mode=mode, stream=mx.cpu))

    def mlx_dequant_matmul() -> None:
        w = mx.dequantize(w_q, scales, mode=mode, dtype=dtype, stream=mx.cpu)
        mx.eval(mx.matmul(x, w.T, stream=mx.cpu))

    key = (N, K, mode, dtype_name)
    # MLX's baselines in its modes (fp4 and fp8 are ours alone).
    baselines = args.mlx_budget > 0 and mode in MLX_MODES
    qmm_time = slow(("qmm", *key), M, mlx_qmm) if baselines else None
    dm_time = slow(("dm", *key), M, mlx_dequant_matmul) if baselines else None

    # ggml takes float32 x whatever our dtype: one measurement serves both.
    ggml_times = None
    if ggml_cache is not None and mode in ggml_glue().GGML_TYPES:
        if (M, N, K, mode) not in ggml_cache:
            ggml_cache[M, N, K, mode] = bench_ggml(M, weights, args)
        ggml_times = ggml_cache[M, N, K, mode]

    x_np = np.random.rand(M, K).astype(np.float32)
    w_np = np.random.rand(N, K).astype(np.float32)
    numpy_time = measure(lambda _: x_np @ w_np.T, args.reps)
    # OpenBLAS's threads spin for a while after a call: let them go idle
    # before the next row times anything.
    time.sleep(0.2)
    return Row(
        M,
        N,
        K,
        mode,
        dtype_name,
        weights.weight_bytes,
        result,
        qmm_time,
        dm_time,
        numpy_time,
        after_idle=idle,
        ggml=ggml_times,
    )


def derive(row: Row, bandwidth: float, sgemm: float, single: Row | None = None) -> None:
    """Rates and ratios of `row`; `single` is the M = 1 row of the same product."""
    flops = 2 * row.M * row.N * row.K
    d = row.derived
    d["gbps"] = row.weight_bytes / row.ours.best / 1e9
    d["gflops"] = flops / row.ours.best / 1e9
    d["bandwidth_fraction"] = row.weight_bytes / row.ours.best / bandwidth
    d["sgemm_fraction"] = flops / row.ours.best / sgemm
    d["vs_numpy_same_shape"] = row.numpy_f32.best / row.ours.best
    if row.mlx_qmm:
        d["speedup_vs_mx_qmm"] = row.mlx_qmm.best / row.ours.best
    if row.mlx_dequant_matmul:
        d["speedup_vs_mlx_dequant_matmul"] = row.mlx_dequant_matmul.best / row.ours.best
    if single is not None and row.M <= SMALL_M:
        d["time_vs_m1"] = row.ours.best / single.ours.best
    if row.after_idle:
        d["after_idle_vs_steady"] = row.after_idle.best / row.ours.best
    if row.ggml and row.ggml.plain:
        d["speedup_vs_ggml_plain"] = row.ggml.plain.best / row.ours.best
    if row.ggml and row.ggml.repacked:
        d["speedup_vs_ggml_repacked"] = row.ggml.repacked.best / row.ours.best


def header(vs_ggml: bool) -> str:
    ggml = f" | {'ggml* ms':>8} {'x':>5} {'ggml-rp* ms':>11} {'x':>5}" if vs_ggml else ""
    return (
        f"{'M':>4} {'N x K':>12} {'mode':>6} {'dtype':>8} | {'ours ms':>8} {'spread':>6} "
        f"{'GB/s':>6} {'GFLOP/s':>8} {'t/t1':>5} {'idle':>5}{ggml} | {'mx.qmm ms':>10} "
        f"{'x':>6} | {'deq+mm ms':>10} {'np f32 ms':>9} {'ours/np':>7}"
    )


def ratio_text(value: float) -> str:
    # Fewer decimals for large ratios (a tiny product's first call after a pause can take
    # hundreds of times its steady time), so that the column keeps its width.
    return f"{value:.{2 if value < 10 else 1 if value < 100 else 0}f}"


def ratio(d: dict[str, float], key: str) -> str:
    return ratio_text(d[key]) if key in d else "-"


def format_row(row: Row, vs_ggml: bool = False) -> str:
    d = row.derived

    def optional(t: Timing | None) -> str:
        return t.ms() if t else "-"

    ggml = ""
    if vs_ggml:
        times = row.ggml or GgmlTimes(None, None)
        ggml = (
            f" | {optional(times.plain):>8} {ratio(d, 'speedup_vs_ggml_plain'):>5} "
            f"{optional(times.repacked):>11} {ratio(d, 'speedup_vs_ggml_repacked'):>5}"
        )
    return (
        f"{row.M:>4} {f'{row.N}x{row.K}':>12} {row.mode:>6} {row.dtype:>8} | "
        f"{row.ours.best * 1e3:>8.3g} {row.ours.median / row.ours.best:>6.2f} "
        f"{d['gbps']:>6.1f} {d['gflops']:>8.1f} {ratio(d, 'time_vs_m1'):>5} "
        f"{ratio(d, 'after_idle_vs_steady'):>5}{ggml} | {optional(row.mlx_qmm):>10} "
        f"{ratio(d, 'speedup_vs_mx_qmm'):>6} | {optional(row.mlx_dequant_matmul):>10} "
        f"{row.numpy_f32.best * 1e3:>9.3g} {d['vs_numpy_same_shape']:>7.2f}"
    )


def legend(vs_ggml: bool, min_time: float = 1.0) -> str:
    text = (
        f"ms: best of the calls in {min_time:g} s (ours, ggml; at least --reps calls); "
        "spread: median / best; GB/s: quantized weight bytes per second; t/t1: time / the "
        "M=1 time (M <= 16); idle: the first call after a pause / the steady best (M=1); "
        "x: speedup of ours over the baseline on its left; ~: extrapolated in M; ours/np: "
        "NumPy float32 dense time / ours"
    )
    if vs_ggml:
        text += (
            "\nggml*: ggml's CPU backend with inexact activations (it rounds x to 8 bits, "
            "q8_0, and takes float32 x for every dtype), same threads; plain: its vec_dot "
            "kernels; rp: weights in its CPU_REPACK buffer type, as llama.cpp loads them. "
            "Each library quantized the same float matrix with its own quantizer."
        )
    return text


def worst(
    rows: list[Row], value: Callable[[Row], float | None], largest: bool = False
) -> tuple[float, Row] | None:
    """The smallest (or largest) value over the rows that have one, with its row."""
    found = [(v, r) for r in rows if (v := value(r)) is not None]
    if not found:
        return None
    return (max if largest else min)(found, key=lambda pair: pair[0])


def where(r: Row) -> str:
    return f"{r.mode} {r.N}x{r.K}"


def targets(rows: list[Row], bandwidth: float, sgemm: float) -> list[str]:
    """The issues' targets, each with the measured ratio."""
    lines = []
    for r in rows:
        d = r.derived
        if r.M == 1 and r.mode == "mxfp4" and (r.N, r.K) == (14336, 4096):
            ok = d["bandwidth_fraction"] >= 0.85
            lines.append(
                f"M=1 mxfp4 14336x4096 {r.dtype}: {d['bandwidth_fraction']:.0%} of read "
                f"bandwidth (target 85%) {'met' if ok else 'MISSED'}"
            )
        if r.M >= 128 and (r.N, r.K) in ((4096, 4096), (14336, 4096)):
            if r.dtype == "float32":
                ok = d["sgemm_fraction"] >= 0.7
                goal = "70%"
            elif r.dtype == "bfloat16" and r.mode in MODES:
                ok = d["sgemm_fraction"] >= 1.4
                goal = "140%"
            else:
                continue
            lines.append(
                f"M={r.M} {r.mode} {r.N}x{r.K} {r.dtype}: {d['sgemm_fraction']:.1%} of the "
                f"NumPy sgemm rate (target {goal}) {'met' if ok else 'MISSED'}"
            )
    for dtype, goal in (("bfloat16", 100), ("float32", 20)):
        speedups = [
            r.derived["speedup_vs_mx_qmm"]
            for r in rows
            if r.dtype == dtype and "speedup_vs_mx_qmm" in r.derived
        ]
        if speedups:
            ok = min(speedups) >= goal
            lines.append(
                f"{dtype}: at least {min(speedups):.1f}x mx.quantized_matmul in every row "
                f"(target {goal}x) {'met' if ok else 'MISSED'}"
            )
    # Issue #13's targets, each as the worst row measured.
    for dtype in sorted({r.dtype for r in rows}):
        same = [r for r in rows if r.dtype == dtype]
        goal = 0.90 if dtype == "bfloat16" else 0.85
        found = worst(same, lambda r: r.derived["bandwidth_fraction"] if r.M == 1 else None)
        if found:
            value, r = found
            lines.append(
                f"M=1 {dtype}: at least {value:.1%} of read bandwidth in every row "
                f"(worst {where(r)}; target {goal:.0%}) {'met' if value >= goal else 'MISSED'}"
            )
        found = worst(same, lambda r: r.derived.get("time_vs_m1") if r.M == 8 else None, True)
        if found:
            value, r = found
            lines.append(
                f"M=8 {dtype}: at most {value:.2f}x the M=1 time in every product "
                f"(worst {where(r)}; target 2.6x) {'met' if value <= 2.6 else 'MISSED'}"
            )
        goal = 100 if dtype == "bfloat16" else 20
        found = worst(same, lambda r: r.derived.get("speedup_vs_mx_qmm") if r.M == 1 else None)
        if found:
            value, r = found
            lines.append(
                f"M=1 {dtype}: at least {value:.1f}x mx.quantized_matmul (worst {where(r)}; "
                f"target {goal}x) {'met' if value >= goal else 'MISSED'}"
            )
    return lines


def plot(path: str, rows: list[Row], bandwidth: float, sgemm: float) -> None:
    import matplotlib  # parse_args checked that it is there

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    intensity = np.logspace(-1, 4, 200)
    ax.plot(intensity, np.minimum(bandwidth * intensity, sgemm) / 1e9, "k-", lw=1)
    ax.plot(intensity, np.minimum(bandwidth * intensity, 2 * sgemm) / 1e9, "k:", lw=1)
    ax.text(0.15, bandwidth * 0.15 / 1e9 * 1.3, f"read {bandwidth / 1e9:.0f} GB/s", rotation=35)
    ax.text(600, sgemm / 1e9 * 1.05, f"NumPy sgemm {sgemm / 1e9:.0f} GFLOP/s")
    ax.text(600, 2 * sgemm / 1e9 * 1.05, "2x sgemm (bf16 dots)")
    series = [
        ("ours", lambda r: r.ours, "o"),
        ("mx.quantized_matmul", lambda r: r.mlx_qmm, "x"),
        ("MLX dequantize + matmul", lambda r: r.mlx_dequant_matmul, "+"),
    ]
    for dtype, color in (
        ("float32", "tab:blue"),
        ("float16", "tab:green"),
        ("bfloat16", "tab:red"),
    ):
        for label, get, marker in series:
            points = [
                (2 * r.M * r.N * r.K / r.weight_bytes, 2 * r.M * r.N * r.K / get(r).best / 1e9)
                for r in rows
                if r.dtype == dtype and get(r) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.scatter(xs, ys, marker=marker, color=color, label=f"{label}, {dtype}", s=18)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte of quantized weights")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"fp-quantized matmul on the CPU ({os.cpu_count()} cores)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@dataclass
class MoeRow:
    tokens: int
    mode: str
    dtype: str
    expert_bytes: int
    ours: Timing
    mlx: Timing | None
    distinct_experts: float  # per call, on average


def bench_moe_row(
    tokens: int, mode: str, dtype_name: str, args: argparse.Namespace, slow: Extrapolator
) -> MoeRow:
    experts, (N, K), top_k = args.experts, args.moe_shape, args.top_k
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((experts, N, K)) * 0.02, mode=mode)
    x = mx.random.normal((tokens, 1, 1, K)).astype(getattr(mx, dtype_name))
    rng = np.random.default_rng(0)
    # Fresh routing per call: each token picks top_k distinct experts.
    routes = [
        mx.array(np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k])
        for _ in range(max(args.reps, 8) + 60)
    ]
    mx.eval(w_q, scales, x, routes)
    distinct = statistics.mean(len(set(np.array(r).ravel().tolist())) for r in routes)

    def ours(i: int) -> None:
        indices = routes[i % len(routes)]
        mx.eval(mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=indices, mode=mode))

    def mlx() -> None:
        indices = routes[0]
        mx.eval(mx.gather_qmm(x, w_q, scales, rhs_indices=indices, mode=mode, stream=mx.cpu))

    result = measure(ours, args.reps, args.min_time, MAX_REPS)
    mlx_time = (
        slow(("moe", mode, dtype_name), tokens, mlx)
        if args.mlx_budget > 0 and mode in MLX_MODES
        else None
    )
    expert_bytes = (w_q.nbytes + scales.nbytes) // experts
    return MoeRow(tokens, mode, dtype_name, expert_bytes, result, mlx_time, distinct)


def moe_main(args: argparse.Namespace, bandwidth: float, out) -> list[MoeRow]:
    N, K = args.moe_shape
    print(
        f"mixture of experts: {args.experts} experts of {N}x{K}, top {args.top_k}, "
        "fresh routing per call",
        file=out,
    )
    print(
        f"{'tokens':>6} {'mode':>6} {'dtype':>8} | {'ours ms':>8} {'spread':>6} {'GB/s':>6} "
        f"{'of bw':>6} | {'mx.gather_qmm ms':>16} {'x':>6}",
        file=out,
    )
    slow = Extrapolator(args.mlx_budget)
    rows = []
    for mode in args.modes:
        for dtype in args.dtypes:
            for tokens in args.tokens:
                row = bench_moe_row(tokens, mode, dtype, args, slow)
                rows.append(row)
                rate = row.distinct_experts * row.expert_bytes / row.ours.best
                speedup = row.mlx.best / row.ours.best if row.mlx else None
                print(
                    f"{tokens:>6} {mode:>6} {dtype:>8} | {row.ours.best * 1e3:>8.3g} "
                    f"{row.ours.median / row.ours.best:>6.2f} {rate / 1e9:>6.1f} "
                    f"{rate / bandwidth:>6.0%} | {row.mlx.ms() if row.mlx else '-':>16} "
                    f"{ratio_text(speedup) if speedup else '-':>6}",
                    file=out,
                    flush=True,
                )
                if tokens == 1:
                    ok = rate / bandwidth >= 0.8
                    print(f"  target: one token at 80% of read bandwidth "
                          f"{'met' if ok else 'MISSED'}", file=out)  # fmt: skip
                if tokens == 128 and speedup:
                    goal = 100 if dtype == "bfloat16" else 20
                    ok = speedup >= goal
                    print(f"  target: {goal}x mx.gather_qmm {'met' if ok else 'MISSED'}",
                          file=out)  # fmt: skip
    print(
        "GB/s: the routed experts' weight bytes per second; of bw: of the read bandwidth; "
        "x: speedup over mx.gather_qmm (~: extrapolated in tokens)",
        file=out,
    )
    return rows


@dataclass
class TailRow:
    K: int
    mode: str
    dtype: str
    weight_bytes: int
    ours: Timing
    ggml: GgmlTimes | None = None
    derived: dict[str, float] = field(default_factory=dict)


def ggml_best(times: GgmlTimes | None) -> Timing | None:
    """ggml's faster way (repacked or plain) for one product."""
    found = [t for t in (times.plain, times.repacked) if t] if times else []
    return min(found, key=lambda t: t.best) if found else None


def tail_rows(
    mode: str, dtype: str, args: argparse.Namespace, ggml_cache: dict[tuple, GgmlTimes] | None
) -> list[TailRow]:
    """M = 1 over args.tail_ks for one mode and dtype, each against the best K."""
    N = args.tail_n
    products = []
    for K in args.tail_ks:
        x = mx.random.normal((1, K)).astype(getattr(mx, dtype))
        products.append((make_weights(1, N, K, mode, args), x))
    timings = measure_rounds(
        [time_ours(x, weights) for weights, x in products],
        args.reps,
        args.min_time,
        MAX_REPS,
    )
    rows = []
    for (weights, x), timing in zip(products, timings, strict=True):
        K = x.shape[1]
        row = TailRow(K, mode, dtype, weights.weight_bytes, timing)
        if ggml_cache is not None and mode in ggml_glue().GGML_TYPES:
            if (1, N, K, mode) not in ggml_cache:
                ggml_cache[1, N, K, mode] = bench_ggml(1, weights, args)
            row.ggml = ggml_cache[1, N, K, mode]
        rows.append(row)
    best = min(r.ours.best / r.weight_bytes for r in rows)
    ggml_rates = [t.best / r.weight_bytes for r in rows if (t := ggml_best(r.ggml))]
    for r in rows:
        r.derived["ns_per_byte"] = r.ours.best / r.weight_bytes * 1e9
        r.derived["vs_best_k"] = r.ours.best / r.weight_bytes / best
        if theirs := ggml_best(r.ggml):
            r.derived["ggml_ns_per_byte"] = theirs.best / r.weight_bytes * 1e9
            r.derived["ggml_vs_best_k"] = theirs.best / r.weight_bytes / min(ggml_rates)
    return rows


def format_tail_row(r: TailRow, vs_ggml: bool) -> str:
    d = r.derived
    ggml = ""
    if vs_ggml:
        rate = f"{d['ggml_ns_per_byte']:.3f}" if "ggml_ns_per_byte" in d else "-"
        ggml = f" | {rate:>10} {ratio(d, 'ggml_vs_best_k'):>6}"
    return (
        f"{r.mode:>6} {r.dtype:>8} {r.K:>5} | {r.ours.best * 1e3:>8.3g} "
        f"{d['ns_per_byte']:>6.3f} {d['vs_best_k']:>6.2f}{ggml}"
    )


def tails_main(
    args: argparse.Namespace, out, ggml_cache: dict[tuple, GgmlTimes] | None
) -> tuple[list[TailRow], list[str]]:
    """The K-tail table, and a target line for each mode and dtype."""
    vs_ggml = ggml_cache is not None
    print(f"K tails: M=1, N={args.tail_n}, K in {', '.join(map(str, args.tail_ks))}", file=out)
    ggml = f" | {'ggml* ns/B':>10} {'/best':>6}" if vs_ggml else ""
    head = f"{'mode':>6} {'dtype':>8} {'K':>5} | {'ours ms':>8} {'ns/B':>6} {'/best':>6}{ggml}"
    print(head, file=out)
    rows: list[TailRow] = []
    lines = []
    for mode in args.modes:
        for dtype in args.dtypes:
            group = tail_rows(mode, dtype, args, ggml_cache)
            for r in group:
                print(format_tail_row(r, vs_ggml), file=out, flush=True)
            rows.extend(group)
            slowest = max(group, key=lambda r: r.derived["vs_best_k"])
            excess = slowest.derived["vs_best_k"] - 1
            lines.append(
                f"tails {mode} {dtype}: every K within {excess:.1%} of the best K per "
                f"weight byte (worst K={slowest.K}; target 10%) "
                f"{'met' if excess <= 0.10 else 'MISSED'}"
            )
    text = (
        "ns/B: best time per quantized weight byte; /best: over the best K of the set "
        "(weights cycled beyond the L3)"
    )
    if vs_ggml:
        text += "; ggml*: ggml's faster way (repacked or plain), inexact activations"
    print(text, file=out)
    return rows, lines


# The options that only one device's benchmark reads.
CPU_OPTIONS = ("--mlx-budget", "--vs-ggml", "--min-time", "--tails", "--tail-n", "--tail-ks",
               "--idle", "--cycle-bytes", "--plot")  # fmt: skip
GPU_OPTIONS = ("--graph-bytes", "--graph-products", "--chain", "--no-mlx", "--no-dense")


def named_options(argv: list[str]) -> set[str]:
    """The options a command line names (abbreviations are off)."""
    return {a.split("=")[0] for a in argv if a.startswith("--")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mlx_fpqmm.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # gpu_defaults reads which options the command line names
    )

    def ints(text: str) -> list[int]:
        """Positive integers, each once, in the order given."""
        values = [int(v) for v in text.split(",")]
        if any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"{text}: positive integers expected")
        return list(dict.fromkeys(values))

    def shapes(text: str) -> list[tuple[int, int]]:
        found = [tuple(int(v) for v in s.split("x")) for s in text.split(",")]
        if any(len(shape) != 2 or min(shape) < 1 for shape in found):
            raise argparse.ArgumentTypeError(f"{text}: N x K of positive integers expected")
        return found  # type: ignore[return-value]

    parser.add_argument("--rows", type=ints, default=list(ROWS), help="values of M")
    parser.add_argument(
        "--shapes", type=shapes, default=list(SHAPES), help="N x K of the weights, e.g. 4096x4096"
    )

    def names(allowed: Sequence[str]) -> Callable[[str], list[str]]:
        def parse(text: str) -> list[str]:
            values = text.split(",")
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise argparse.ArgumentTypeError(
                    f"{', '.join(unknown)}: not one of {', '.join(allowed)}"
                )
            return values

        return parse

    parser.add_argument(
        "--modes",
        type=names(list(FORMATS)),
        default=list(MODES),
        help=f"comma-separated modes, of {', '.join(FORMATS)} (MLX's baselines in MLX's)",
    )
    parser.add_argument(
        "--dtypes",
        type=names(["float32", "float16", "bfloat16"]),
        default=list(DTYPES),
        help="comma-separated types of x: float32, float16, bfloat16",
    )
    parser.add_argument("--reps", type=int, default=5, help="timed calls per measurement (min)")
    parser.add_argument(
        "--mlx-budget",
        type=float,
        default=3.0,
        help="seconds one call of a slow MLX baseline may take before it is "
        "extrapolated in M instead (0 skips them)",
    )
    parser.add_argument(
        "--moe", action="store_true", help="time the mixture-of-experts product (gather_qmm)"
    )
    parser.add_argument(
        "--tokens", type=ints, default=list(_bench_gpu.MOE_TOKENS), help="--moe: numbers of tokens"
    )
    parser.add_argument("--experts", type=int, default=32, help="--moe: experts")
    parser.add_argument("--top-k", type=int, default=4, help="--moe: experts per token")
    parser.add_argument(
        "--moe-shape",
        type=lambda text: shapes(text)[0],
        default=(2880, 2880),
        help="--moe: N x K of each expert",
    )
    parser.add_argument(
        "--vs-ggml",
        action="store_true",
        help="also time ggml's CPU backend (mxfp4, nvfp4; needs ggml-python: "
        "pip install -e 'tools/fpqmm_dev[ggml]' from the source checkout)",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=1.0,
        help=f"seconds of timed calls (up to {MAX_REPS}) that ours and ggml's best are taken "
        "from: on a busy machine, more calls find a quiet moment",
    )
    parser.add_argument(
        "--tails", action="store_true", help="time the K-tail table (M=1) instead of the rows"
    )
    parser.add_argument("--tail-n", type=int, default=TAIL_N, help="--tails: N")
    parser.add_argument("--tail-ks", type=ints, default=list(TAIL_KS), help="--tails: values of K")
    parser.add_argument(
        "--idle",
        type=float,
        default=1.0,
        help="seconds to idle before timing one M=1 call after a pause (0 skips it)",
    )
    parser.add_argument(
        "--cycle-bytes",
        type=int,
        default=3 * L3_BYTES,
        help=f"weight bytes that rows with M <= {SMALL_M} cycle through (beyond the L3)",
    )
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw a roofline-style picture")
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="gpu" if mx.cuda.is_available() else "cpu",
        help="gpu: the GPU benchmark (MLX's CUDA build; see mlx_fpqmm._bench_gpu)",
    )
    _bench_gpu.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.device == "gpu" and not mx.cuda.is_available():
        parser.error("--device gpu needs MLX's CUDA build and an NVIDIA GPU")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install 'mlx-fpqmm[bench]')")
    if args.plot and (args.moe or args.tails or args.device == "gpu"):
        parser.error("--plot draws the CPU rows' table, not --moe, --tails or --device gpu")
    given = named_options(sys.argv[1:] if argv is None else argv)
    refused = sorted(given.intersection({"cpu": GPU_OPTIONS, "gpu": CPU_OPTIONS}[args.device]))
    if refused:
        parser.error(f"{', '.join(refused)}: not an option of --device {args.device}")
    if args.reps < 1 or args.experts < 1 or not 1 <= args.top_k <= args.experts:
        parser.error("--reps and --experts: at least 1; --top-k: from 1 to --experts")
    # Every K must be whole groups of every mode asked for.
    group = max(FORMATS[mode]["default_group_size"] for mode in args.modes)
    ks = [K for _, K in args.shapes] + args.tail_ks + [args.moe_shape[1]]
    if any(K % group for K in ks):
        parser.error(f"K of --shapes, --tail-ks and --moe-shape: multiples of {group} "
                     f"(the group size of {', '.join(args.modes)})")  # fmt: skip
    if args.device == "gpu" and args.chain:
        shapes = [args.moe_shape] if args.moe else args.shapes
        narrow = [f"{N}x{K}" for N, K in shapes if N < K]
        if narrow:
            parser.error(
                "--chain: each x is a view of the output before, so every N x K needs "
                f"N >= K; {'--moe-shape' if args.moe else '--shapes'} has {', '.join(narrow)}"
            )
    if args.json not in (None, "-") and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"--json {args.json}: no such directory")
    return args


def ggml_setup(args: argparse.Namespace, out) -> dict[tuple, GgmlTimes] | None:
    """A cache for ggml's timings when --vs-ggml can run, else None (said why)."""
    if not args.vs_ggml:
        return None
    try:
        glue = ggml_glue()
    except ImportError as error:
        print(
            f"ggml rows skipped: --vs-ggml needs mlx_fpqmm's development tools ({error}); "
            f"{GGML_GLUE_HINT}",
            file=out,
        )
        return None
    try:
        ggml = glue.load()
    except glue.GgmlUnavailable as error:
        print(f"ggml rows skipped: {error}", file=out)
        return None
    extra = ", ".join(glue.extra_buffer_types(ggml)) or "none"
    print(
        f"ggml: ggml-python {ggml.__version__} (native build of its vendored ggml), "
        f"{threads_used()} threads, CPU extra buffer types: {extra}; modes "
        f"{', '.join(m for m in args.modes if m in glue.GGML_TYPES) or 'none of those asked'}",
        file=out,
    )
    return {}


def gpu_defaults(args: argparse.Namespace, argv: list[str]) -> None:
    """The GPU benchmark's defaults where the command line sets none."""
    given = named_options(argv)
    for option, value in (
        ("--rows", list(_bench_gpu.ROWS)),
        ("--modes", list(_bench_gpu.MODES)),
        ("--dtypes", list(_bench_gpu.DTYPES)),
    ):
        if option not in given:
            setattr(args, option[2:], value)


def write_json(args: argparse.Namespace, document: dict) -> None:
    if args.json == "-":
        json.dump(document, sys.stdout, indent=1)
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "gpu":
        gpu_defaults(args, sys.argv[1:] if argv is None else argv)
        write_json(args, _bench_gpu.main(args, sys.stderr if args.json == "-" else sys.stdout))
        return
    mx.set_default_device(mx.cpu)
    threads = threads_used()
    progress = sys.stderr
    progress.write("measuring limits...\r")
    # The best of several runs: the highest rate seen is the limit.
    read_time, sgemm_timing = read_bandwidth(os.cpu_count() or 1), sgemm_time()
    bandwidth, sgemm = (1 << 30) / read_time.best, 2 * 4096**3 / sgemm_timing.best
    if args.moe:
        out = sys.stderr if args.json == "-" else sys.stdout
        print(
            f"{time.strftime('%Y-%m-%d')}  {platform.machine()}, {threads} threads, "
            f"mlx {mx.__version__}; read bandwidth {bandwidth / 1e9:.1f} GB/s",
            file=out,
        )
        rows = moe_main(args, bandwidth, out)
        write_json(
            args,
            {
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "machine": platform.machine(),
                "threads": threads,
                "limits": {"read_bandwidth": bandwidth},
                "moe": [asdict(row) for row in rows],
            },
        )
        return
    out = sys.stderr if args.json == "-" else sys.stdout
    print(
        f"{time.strftime('%Y-%m-%d')}  {platform.machine()}, {threads} threads, "
        f"mlx {mx.__version__}, numpy {np.__version__}",
        file=out,
    )
    print(
        f"limits: read bandwidth {bandwidth / 1e9:.1f} GB/s ({os.cpu_count()} threads; median "
        f"{(1 << 30) / read_time.median / 1e9:.1f}), NumPy sgemm 4096^3 {sgemm / 1e9:.0f} "
        f"GFLOP/s (median {2 * 4096**3 / sgemm_timing.median / 1e9:.0f})",
        file=out,
    )
    ggml_cache = ggml_setup(args, out)
    document = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": platform.machine(),
        "threads": threads,
        "limits": {"read_bandwidth": bandwidth, "numpy_sgemm_flops": sgemm},
    }
    if args.tails:
        tail_rows, lines = tails_main(args, out, ggml_cache)
        for line in lines:
            print(line, file=out)
        write_json(args, {**document, "tails": [asdict(r) for r in tail_rows]})
        return
    cases = [
        (M, N, K, mode, dtype)
        for N, K in args.shapes
        for mode in args.modes
        for dtype in args.dtypes
        for M in sorted(args.rows)
    ]
    slow = Extrapolator(args.mlx_budget)
    rows: list[Row] = []
    single: dict[tuple, Row] = {}  # the M = 1 row of each product
    vs_ggml = ggml_cache is not None
    print(header(vs_ggml), file=out)
    for i, (M, N, K, mode, dtype) in enumerate(cases):
        progress.write(f"\x1b[2K[{i + 1}/{len(cases)}] M={M} {N}x{K} {mode} {dtype}\r")
        progress.flush()
        row = bench_row(M, N, K, mode, dtype, args, slow, ggml_cache)
        if M == 1:
            single[N, K, mode, dtype] = row
        derive(row, bandwidth, sgemm, single.get((N, K, mode, dtype)))
        rows.append(row)
        progress.write("\x1b[2K")
        print(format_row(row, vs_ggml), file=out, flush=True)
    print(legend(vs_ggml, args.min_time), file=out)
    for line in targets(rows, bandwidth, sgemm):
        print(line, file=out)
    write_json(args, {**document, "rows": [asdict(r) for r in rows]})
    if args.plot:
        plot(args.plot, rows, bandwidth, sgemm)


if __name__ == "__main__":
    main()
