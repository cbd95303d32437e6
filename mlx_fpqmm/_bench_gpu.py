"""GPU benchmark: mlx_fpqmm against MLX's own kernels and dense bfloat16, one run.

``python -m mlx_fpqmm.bench --device gpu`` (the default where MLX sees a CUDA
GPU) times, per shape, mode, dtype and M, our op, ``mx.quantized_matmul`` on
the GPU (MLX's modes) and the dense product ``x @ w.T`` in bfloat16, beside the
GPU's read bandwidth measured in the same run (``mx.sum`` over 4 GiB).

Launch overhead is amortised as a model amortises it: each measurement
evaluates one graph of R products (at least ``--graph-products``, 64 by
default) that cycle through copies of the weights together larger than the
GPU's cache (``--graph-bytes``, 1 GB by default, far beyond an H200's 60 MB
L2), so every product reads its weights from memory; the time per product is
the graph's time over R, the median of ``--reps`` graphs. The products of a
graph are independent, and the GPU may overlap one's last blocks with the next
one's first; ``--chain`` makes each product's x a view of the output of the
one before (no copy: shapes with N >= K), so that they run one after another
as a model's layers do.

``--moe`` times ``gather_qmm`` (32 experts of 2880 x 2880, top 4 by default)
against ``mx.gather_qmm``, fresh routing for every product, in both of
mlx-lm's layouts: x (T, 1, 1, K) with indices (T, top_k), and the sorted
layout x (pairs, 1, K) with sorted indices (pairs,).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import mlx.core as mx
import numpy as np

import mlx_fpqmm

from ._formats import MLX_MODES, qmm_for_mode

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))
ROWS = (1, 8, 16)
MODES = ("mxfp4", "nvfp4", "mxfp8", "fp4", "fp8")
DTYPES = ("bfloat16", "float16", "float32")
MOE_TOKENS = (1, 8)


@dataclass
class Timing:
    """Seconds per product: the median and best of the timed graphs."""

    median: float
    best: float

    def us(self) -> str:
        return f"{self.median * 1e6:.1f}"


# A product of the timed graphs: its output from its x.
Product = Callable[[mx.array], mx.array]


def view_as(y: mx.array, x: mx.array) -> mx.array:
    """The first ``x.size`` values of ``y`` in ``x``'s shape: a view, no copy,
    through which the product that reads it waits for the one that wrote ``y``."""
    if y.size < x.size or y.dtype != x.dtype:
        raise ValueError(
            f"chained products: an output of {y.size} {y.dtype} values cannot be the next x "
            f"({x.size} {x.dtype} values); --chain needs N >= K"
        )
    return y.reshape(-1)[: x.size].reshape(x.shape)


def graph_outputs(products: Sequence[Product], x: mx.array, chained: bool) -> list[mx.array]:
    """The outputs of ``products`` on ``x``, or, ``chained``, each product after the
    first on a view of the output of the one before."""
    outputs: list[mx.array] = []
    for product in products:
        outputs.append(product(view_as(outputs[-1], x) if chained and outputs else x))
    return outputs


def time_graph(
    products: Sequence[Product], x: mx.array, reps: int, chained: bool = False
) -> Timing:
    """The time per product of evaluating all of ``products`` on ``x`` as one graph
    (``chained``: graph_outputs's chain)."""
    # Warm-up, twice: the first graph of a layout measured slower in the bench
    # than in tools/gpu/gather_overhead.py, which alternates the layouts.
    for _ in range(2):
        mx.eval(graph_outputs(products, x, chained))
        mx.synchronize()
    times = []
    for _ in range(reps):
        outputs = graph_outputs(products, x, chained)
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(outputs)
        mx.synchronize()
        times.append((time.perf_counter() - start) / len(products))
        del outputs
    return Timing(statistics.median(times), min(times))


def read_bandwidth(reps: int) -> float:
    """Bytes per second of a full read of 4 GiB (``mx.sum``), the best of ``reps``."""
    a = mx.ones((1 << 30,), dtype=mx.float32)
    mx.eval(a)
    best = float("inf")
    for _ in range(reps):
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(mx.sum(a))
        mx.synchronize()
        best = min(best, time.perf_counter() - start)
    return a.nbytes / best


def copies(array: mx.array, count: int) -> list[mx.array]:
    """``count`` arrays equal to ``array``, each in memory of its own."""
    result = [array] + [array + mx.array(0, dtype=array.dtype) for _ in range(count - 1)]
    mx.eval(result)
    return result


def count_for(bytes_each: int, graph_bytes: int) -> int:
    return max(2, -(-int(graph_bytes) // bytes_each))


def cycled(items: list, products: int) -> list:
    """``items`` repeated in order to at least ``products`` entries."""
    return [items[i % len(items)] for i in range(max(products, len(items)))]


@dataclass
class Row:
    M: int
    N: int
    K: int
    mode: str
    dtype: str
    weight_bytes: int
    ours: Timing
    mlx: Timing | None
    dense: Timing | None

    def rate(self) -> float:
        return self.weight_bytes / self.ours.median


def random_weights(shape: tuple[int, ...]) -> mx.array:
    """Normal weights of standard deviation K^-1/2: a product keeps x's scale, so that
    chained products stay finite."""
    return mx.random.normal(shape, dtype=mx.bfloat16) * shape[-1] ** -0.5


def quantized_weights(N: int, K: int, mode: str) -> tuple[mx.array, mx.array]:
    return mlx_fpqmm.quantize(random_weights((N, K)), mode=mode)


def bench_row(M: int, N: int, K: int, mode: str, dtype_name: str, args: argparse.Namespace) -> Row:
    dtype = getattr(mx, dtype_name)
    x = (mx.random.normal((M, K)) * 0.5).astype(dtype)
    w_q, scales = quantized_weights(N, K, mode)
    weight_bytes = w_q.nbytes + scales.nbytes
    count = count_for(weight_bytes, args.graph_bytes)
    pairs = cycled(
        list(zip(copies(w_q, count), copies(scales, count), strict=True)), args.graph_products
    )
    op = qmm_for_mode(mode)
    ours = time_graph(
        [lambda x, w=w, s=s: op(x, w, s, mode=mode) for w, s in pairs], x, args.reps, args.chain
    )
    mlx = None
    if mode in MLX_MODES and not args.no_mlx:
        mlx = time_graph(
            [lambda x, w=w, s=s: mx.quantized_matmul(x, w, s, mode=mode) for w, s in pairs],
            x,
            args.reps,
            args.chain,
        )
    del pairs
    dense = None
    if not args.no_dense and dtype_name == "bfloat16":
        w = random_weights((N, K))
        dense_copies = cycled(copies(w, count_for(w.nbytes, args.graph_bytes)), args.graph_products)
        dense = time_graph([lambda x, w=w: x @ w.T for w in dense_copies], x, args.reps, args.chain)
        del dense_copies
    return Row(M, N, K, mode, dtype_name, weight_bytes, ours, mlx, dense)


def header() -> str:
    return (
        f"{'M':>4} {'N x K':>12} {'mode':>6} {'dtype':>9} | {'ours us':>8} {'TB/s':>5} "
        f"{'of bw':>6} {'t/t1':>5} | {'mx.qmm us':>9} {'x':>5} | {'dense us':>8} {'x':>5}"
    )


def format_row(row: Row, bandwidth: float, single: Row | None) -> str:
    rate = row.rate()
    t1 = f"{row.ours.median / single.ours.median:.2f}" if single else "-"
    mlx = row.mlx.us() if row.mlx else "-"
    vs_mlx = f"{row.mlx.median / row.ours.median:.1f}" if row.mlx else "-"
    dense = row.dense.us() if row.dense else "-"
    vs_dense = f"{row.dense.median / row.ours.median:.1f}" if row.dense else "-"
    return (
        f"{row.M:>4} {f'{row.N}x{row.K}':>12} {row.mode:>6} {row.dtype:>9} | "
        f"{row.ours.us():>8} {rate / 1e12:>5.2f} {rate / bandwidth:>6.0%} {t1:>5} | "
        f"{mlx:>9} {vs_mlx:>5} | {dense:>8} {vs_dense:>5}"
    )


@dataclass
class MoeRow:
    tokens: int
    layout: str
    mode: str
    dtype: str
    routed_bytes: float  # the distinct routed experts' weight bytes, on average
    ours: Timing
    mlx: Timing | None
    mlx_error: str | None = None  # MLX's kernels refused the call

    def rate(self) -> float:
        return self.routed_bytes / self.ours.median


def routes(tokens: int, experts: int, top_k: int, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k] for _ in range(count)]


# A layout's x, its indices per product, and whether they are sorted.
Layout = tuple[mx.array, list[mx.array], bool]


def moe_layouts(chosen: list[np.ndarray], K: int, dtype: mx.Dtype) -> dict[str, Layout]:
    """mlx-lm's layouts of the routes ``chosen`` (each (T, top_k)): x (T, 1, 1, K)
    with the indices as they are; sorted, x (pairs, 1, K) with the sorted indices
    (pairs,)."""
    tokens, top_k = chosen[0].shape
    return {
        "unsorted": (
            (mx.random.normal((tokens, 1, 1, K)) * 0.5).astype(dtype),
            [mx.array(r.astype(np.uint32)) for r in chosen],
            False,
        ),
        "sorted": (
            (mx.random.normal((tokens * top_k, 1, K)) * 0.5).astype(dtype),
            [mx.array(np.sort(r.ravel()).astype(np.uint32)) for r in chosen],
            True,
        ),
    }


def gather_products(
    qmm: Callable[..., mx.array],
    cases: list[tuple[tuple[mx.array, mx.array], mx.array]],
    mode: str,
    is_sorted: bool,
) -> list[Product]:
    """One product per weight copy and its routing."""
    return [
        lambda x, w=w, s=s, i=i: qmm(x, w, s, rhs_indices=i, mode=mode, sorted_indices=is_sorted)
        for (w, s), i in cases
    ]


def bench_moe(tokens: int, mode: str, dtype_name: str, args: argparse.Namespace) -> list[MoeRow]:
    experts, (N, K), top_k = args.experts, args.moe_shape, args.top_k
    w = random_weights((experts, N, K))
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    del w
    expert_bytes = (w_q.nbytes + scales.nbytes) / experts
    count = count_for(w_q.nbytes + scales.nbytes, args.graph_bytes)
    weights = cycled(
        list(zip(copies(w_q, count), copies(scales, count), strict=True)), args.graph_products
    )
    dtype = getattr(mx, dtype_name)
    chosen = routes(tokens, experts, top_k, len(weights), seed=tokens)
    routed = statistics.mean(len(np.unique(r)) for r in chosen) * expert_bytes
    rows = []
    for layout, (xs, indices, is_sorted) in moe_layouts(chosen, K, dtype).items():
        mx.eval(xs, indices)
        cases = list(zip(weights, indices, strict=True))

        ours = time_graph(
            gather_products(mlx_fpqmm.gather_qmm, cases, mode, is_sorted), xs, args.reps, args.chain
        )
        mlx, mlx_error = None, None
        if mode in MLX_MODES and not args.no_mlx:
            try:
                mlx = time_graph(
                    gather_products(mx.gather_qmm, cases, mode, is_sorted),
                    xs,
                    args.reps,
                    args.chain,
                )
            except (RuntimeError, ValueError) as error:  # e.g. MLX's grid limit on pairs
                mlx_error = str(error)
        rows.append(MoeRow(tokens, layout, mode, dtype_name, routed, ours, mlx, mlx_error))
    return rows


def moe_main(args: argparse.Namespace, bandwidth: float, out) -> list[MoeRow]:
    N, K = args.moe_shape
    print(
        f"mixture of experts: {args.experts} experts of {N}x{K}, top {args.top_k}, "
        "fresh routing per product",
        file=out,
    )
    print(
        f"{'tokens':>6} {'layout':>8} {'mode':>6} {'dtype':>9} | {'ours us':>8} "
        f"{'TB/s':>5} {'of bw':>6} | {'mx.gather_qmm us':>16} {'x':>5}",
        file=out,
    )
    rows = []
    for mode in args.modes:
        for dtype in args.dtypes:
            for tokens in args.tokens:
                for row in bench_moe(tokens, mode, dtype, args):
                    rows.append(row)
                    rate = row.rate()
                    vs = f"{row.mlx.median / row.ours.median:.1f}" if row.mlx else "-"
                    theirs = row.mlx.us() if row.mlx else "fails" if row.mlx_error else "-"
                    print(
                        f"{tokens:>6} {row.layout:>8} {mode:>6} {dtype:>9} | "
                        f"{row.ours.us():>8} {rate / 1e12:>5.2f} {rate / bandwidth:>6.0%} | "
                        f"{theirs:>16} {vs:>5}",
                        file=out,
                        flush=True,
                    )
    print(
        "TB/s: the routed experts' weight bytes (distinct experts per product) per second",
        file=out,
    )
    for error in sorted({row.mlx_error for row in rows if row.mlx_error}):
        print(f"fails: mx.gather_qmm raised: {error}", file=out)
    return rows


def main(args: argparse.Namespace, out) -> dict:
    """Runs the GPU benchmark that ``args`` asks for; returns its JSON document."""
    mx.set_default_device(mx.gpu)
    bandwidth = read_bandwidth(args.reps)
    info = mx.device_info()
    print(
        f"{time.strftime('%Y-%m-%d')}  {info.get('device_name', 'GPU')}, mlx {mx.__version__}; "
        f"read bandwidth {bandwidth / 1e12:.2f} TB/s (mx.sum over 4 GiB, best of {args.reps}); "
        f"per product: median of {args.reps} graphs of >= {args.graph_products} products over "
        f">= {args.graph_bytes / 1e9:.1f} GB of weight copies, "
        + ("chained (each x a view of the output before)" if args.chain else "independent"),
        file=out,
    )
    document = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": info.get("device_name", "GPU"),
        "read_bandwidth": bandwidth,
        "chained": args.chain,
    }
    if args.moe:
        rows = moe_main(args, bandwidth, out)
        document["moe"] = [asdict(r) for r in rows]
        return document
    print(header(), file=out)
    rows, single = [], {}
    for N, K in args.shapes:
        for mode in args.modes:
            for dtype in args.dtypes:
                for M in sorted(args.rows):
                    row = bench_row(M, N, K, mode, dtype, args)
                    if M == 1:
                        single[N, K, mode, dtype] = row
                    rows.append(row)
                    print(
                        format_row(row, bandwidth, single.get((N, K, mode, dtype))),
                        file=out,
                        flush=True,
                    )
    print(
        "TB/s, of bw: our weight bytes (codes and scales) per second and its share of the "
        "read bandwidth; t/t1: time over the M = 1 time; x: speed-up of ours over "
        "mx.quantized_matmul and over the dense bfloat16 x @ w.T",
        file=out,
    )
    document["rows"] = [asdict(r) for r in rows]
    return document


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The GPU benchmark's options (beside the shared --rows/--shapes/--modes/...)."""
    parser.add_argument(
        "--graph-bytes",
        type=float,
        default=1e9,
        help="--device gpu: weight bytes each timed graph cycles through",
    )
    parser.add_argument(
        "--graph-products",
        type=int,
        default=64,
        help="--device gpu: the fewest products in each timed graph",
    )
    parser.add_argument(
        "--chain",
        action="store_true",
        help="--device gpu: each product's x a view of the output before (N >= K), so that "
        "a graph's products run one after another as a model's layers do",
    )
    parser.add_argument(
        "--no-mlx",
        action="store_true",
        help="--device gpu: leave out MLX's kernels",
    )
    parser.add_argument(
        "--no-dense",
        action="store_true",
        help="--device gpu: leave out the dense bfloat16 product",
    )
