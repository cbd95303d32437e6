"""CPU benchmark: mlx_fpqmm against the alternatives, measured in one run.

``python -m mlx_fpqmm.bench`` times, for each shape, mode and dtype, our op,
``mx.quantized_matmul`` on the CPU, dequantize + matmul in MLX and a dense
float32 matmul in NumPy of the same shape, next to two limits measured in the
same run: the memory read bandwidth (a streaming read on every core) and the
NumPy sgemm rate. Slow MLX baselines are measured where they fit a time budget
and extrapolated linearly in M beyond it (marked ``~``).

``--moe`` times the mixture-of-experts product instead: ``gather_qmm`` against
``mx.gather_qmm`` for one expert projection (a gpt-oss-20b-like one by
default: 32 experts of 2880 x 2880, top 4), with fresh random routing on every
call so that the experts' weights come from memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import mlx.core as mx
import numpy as np

import mlx_fpqmm

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))
ROWS = (1, 8, 32, 128, 512)
MODES = ("mxfp4", "nvfp4", "mxfp8")
DTYPES = ("float32", "bfloat16")
L3_BYTES = 32 << 20


@dataclass
class Timing:
    best: float  # seconds
    median: float
    estimated: bool = False  # extrapolated, not measured

    def ms(self) -> str:
        return f"{'~' if self.estimated else ''}{self.best * 1e3:.3g}"


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


def measure(
    run: Callable[[int], object], reps: int, min_time: float = 0.2, max_reps: int = 50
) -> Timing:
    """Best and median of at least `reps` timed calls (more while under min_time)."""
    run(0)  # warm up: first-call allocations and dispatch
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - start < min_time and len(times) < max_reps):
        t = time.perf_counter()
        run(len(times) + 1)
        times.append(time.perf_counter() - t)
    return Timing(min(times), statistics.median(times))


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


def bench_row(
    M: int,
    N: int,
    K: int,
    mode: str,
    dtype_name: str,
    args: argparse.Namespace,
    slow: Extrapolator,
) -> Row:
    dtype = getattr(mx, dtype_name)
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((N, K)), mode=mode)
    weight_bytes = w_q.nbytes + scales.nbytes
    # Matrix-vector products read the weights from memory, not from L3.
    copies = max(1, -(-3 * L3_BYTES // weight_bytes)) if M <= 8 else 1
    weights = [(mx.array(np.array(w_q)), mx.array(np.array(scales))) for _ in range(copies)]
    x = mx.random.normal((M, K)).astype(dtype)
    mx.eval(x, weights)
    op = mlx_fpqmm.qmm_for_mode(mode)

    def ours(i: int) -> None:
        w, s = weights[i % copies]
        mx.eval(op(x, w, s, mode=mode))

    result = measure(ours, args.reps)

    def mlx_qmm() -> None:
        mx.eval(mx.quantized_matmul(x, w_q, scales, mode=mode, stream=mx.cpu))

    def mlx_dequant_matmul() -> None:
        w = mx.dequantize(w_q, scales, mode=mode, dtype=dtype, stream=mx.cpu)
        mx.eval(mx.matmul(x, w.T, stream=mx.cpu))

    key = (N, K, mode, dtype_name)
    qmm_time = slow(("qmm", *key), M, mlx_qmm) if args.mlx_budget > 0 else None
    dm_time = slow(("dm", *key), M, mlx_dequant_matmul) if args.mlx_budget > 0 else None

    x_np = np.random.rand(M, K).astype(np.float32)
    w_np = np.random.rand(N, K).astype(np.float32)
    numpy_time = measure(lambda _: x_np @ w_np.T, args.reps)
    # OpenBLAS's threads spin for a while after a call: let them go idle
    # before the next row times anything.
    time.sleep(0.2)
    return Row(M, N, K, mode, dtype_name, weight_bytes, result, qmm_time, dm_time, numpy_time)


def derive(row: Row, bandwidth: float, sgemm: float) -> None:
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


HEADER = (
    f"{'M':>4} {'N x K':>12} {'mode':>6} {'dtype':>8} | {'ours ms':>8} {'spread':>6} "
    f"{'GB/s':>6} {'GFLOP/s':>8} | {'mx.qmm ms':>10} {'x':>6} | {'deq+mm ms':>10} "
    f"{'np f32 ms':>9} {'ours/np':>7}"
)


def format_row(row: Row) -> str:
    d = row.derived

    def optional(t: Timing | None) -> str:
        return t.ms() if t else "-"

    speedup = f"{d['speedup_vs_mx_qmm']:.0f}" if "speedup_vs_mx_qmm" in d else "-"
    return (
        f"{row.M:>4} {f'{row.N}x{row.K}':>12} {row.mode:>6} {row.dtype:>8} | "
        f"{row.ours.best * 1e3:>8.3g} {row.ours.median / row.ours.best:>6.2f} "
        f"{d['gbps']:>6.1f} {d['gflops']:>8.1f} | {optional(row.mlx_qmm):>10} {speedup:>6} | "
        f"{optional(row.mlx_dequant_matmul):>10} {row.numpy_f32.best * 1e3:>9.3g} "
        f"{d['vs_numpy_same_shape']:>7.2f}"
    )


def targets(rows: list[Row], bandwidth: float, sgemm: float) -> list[str]:
    """The issue's targets, each with the measured ratio."""
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
                f"M={r.M} {r.mode} {r.N}x{r.K} {r.dtype}: {d['sgemm_fraction']:.0%} of the "
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
                f"{dtype}: at least {min(speedups):.0f}x mx.quantized_matmul in every row "
                f"(target {goal}x) {'met' if ok else 'MISSED'}"
            )
    return lines


def plot(path: str, rows: list[Row], bandwidth: float, sgemm: float) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise SystemExit("--plot needs matplotlib (pip install 'mlx-fpqmm[bench]')") from error
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
    for dtype, color in (("float32", "tab:blue"), ("bfloat16", "tab:red")):
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


MOE_TOKENS = (1, 8, 128)


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

    result = measure(ours, args.reps)
    mlx_time = slow(("moe", mode, dtype_name), tokens, mlx) if args.mlx_budget > 0 else None
    expert_bytes = (w_q.nbytes + scales.nbytes) // experts
    return MoeRow(tokens, mode, dtype_name, expert_bytes, result, mlx_time, distinct)


def moe_main(args: argparse.Namespace, bandwidth: float, out) -> None:
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
            for tokens in MOE_TOKENS:
                row = bench_moe_row(tokens, mode, dtype, args, slow)
                rows.append(row)
                rate = row.distinct_experts * row.expert_bytes / row.ours.best
                speedup = row.mlx.best / row.ours.best if row.mlx else None
                print(
                    f"{tokens:>6} {mode:>6} {dtype:>8} | {row.ours.best * 1e3:>8.3g} "
                    f"{row.ours.median / row.ours.best:>6.2f} {rate / 1e9:>6.1f} "
                    f"{rate / bandwidth:>6.0%} | {row.mlx.ms() if row.mlx else '-':>16} "
                    f"{f'{speedup:.0f}' if speedup else '-':>6}",
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mlx_fpqmm.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )

    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",")]

    def shapes(text: str) -> list[tuple[int, int]]:
        return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]  # type: ignore[misc]

    parser.add_argument("--rows", type=ints, default=list(ROWS), help="values of M")
    parser.add_argument(
        "--shapes", type=shapes, default=list(SHAPES), help="N x K of the weights, e.g. 4096x4096"
    )
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=list(DTYPES))
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
    parser.add_argument("--experts", type=int, default=32, help="--moe: experts")
    parser.add_argument("--top-k", type=int, default=4, help="--moe: experts per token")
    parser.add_argument(
        "--moe-shape",
        type=lambda t: tuple(int(v) for v in t.split("x")),
        default=(2880, 2880),
        help="--moe: N x K of each expert",
    )
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw a roofline-style picture")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    mx.set_default_device(mx.cpu)
    threads = os.cpu_count() or 1
    progress = sys.stderr
    progress.write("measuring limits...\r")
    # The best of several runs: the highest rate seen is the limit.
    read_time, sgemm_timing = read_bandwidth(threads), sgemm_time()
    bandwidth, sgemm = (1 << 30) / read_time.best, 2 * 4096**3 / sgemm_timing.best
    if args.moe:
        out = sys.stdout
        print(
            f"{time.strftime('%Y-%m-%d')}  {platform.machine()}, {threads} threads, "
            f"mlx {mx.__version__}; read bandwidth {bandwidth / 1e9:.1f} GB/s",
            file=out,
        )
        moe_main(args, bandwidth, out)
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
    out = sys.stderr if args.json == "-" else sys.stdout
    print(
        f"{time.strftime('%Y-%m-%d')}  {platform.machine()}, {threads} threads, "
        f"mlx {mx.__version__}, numpy {np.__version__}",
        file=out,
    )
    print(
        f"limits: read bandwidth {bandwidth / 1e9:.1f} GB/s ({threads} threads; median "
        f"{(1 << 30) / read_time.median / 1e9:.1f}), NumPy sgemm 4096^3 {sgemm / 1e9:.0f} "
        f"GFLOP/s (median {2 * 4096**3 / sgemm_timing.median / 1e9:.0f})",
        file=out,
    )
    print(HEADER, file=out)
    for i, (M, N, K, mode, dtype) in enumerate(cases):
        progress.write(f"\x1b[2K[{i + 1}/{len(cases)}] M={M} {N}x{K} {mode} {dtype}\r")
        progress.flush()
        row = bench_row(M, N, K, mode, dtype, args, slow)
        derive(row, bandwidth, sgemm)
        rows.append(row)
        progress.write("\x1b[2K")
        print(format_row(row), file=out, flush=True)
    print(
        "ms: best of the timed calls; spread: median / best; GB/s: quantized weight bytes "
        "per second; x: speedup over mx.quantized_matmul; ~: extrapolated in M; "
        "ours/np: NumPy float32 dense time / ours",
        file=out,
    )
    for line in targets(rows, bandwidth, sgemm):
        print(line, file=out)
    if args.json:
        document = {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "machine": platform.machine(),
            "threads": threads,
            "limits": {"read_bandwidth": bandwidth, "numpy_sgemm_flops": sgemm},
            "rows": [asdict(r) for r in rows],
        }
        if args.json == "-":
            json.dump(document, sys.stdout, indent=1)
        else:
            with open(args.json, "w") as f:
                json.dump(document, f, indent=1)
    if args.plot:
        plot(args.plot, rows, bandwidth, sgemm)


if __name__ == "__main__":
    main()
