"""What a decoding product costs through MLX on the GPU, by rows of x.

On a CUDA machine with mlx_fpqmm installed (tools/gpu/check build): per product
of a graph over >= 1 GB of copies of an N x K mxfp4 matrix (bfloat16 x,
evaluated first; ``--shape``, default 14336x4096), the host's time to build the
graph, to encode it (``mx.async_eval``: each primitive's ``eval_gpu``) and the
wait for the GPU after that, ``mlx_fpqmm.quantized_matmul`` beside
``mx.quantized_matmul``, for M = 8, 1, 2, 4 and again 1 and 8 (order effects),
then x of shape (K,) and (1, 1, K), and the kernel each runs. Compare with the
kernel alone (the harness). A small matrix (``--shape 1024x4096``) leaves the
GPU waiting on the host, whose encoding is then what a product costs. Run with
and without MLX's CUDA graphs: ``python3 tools/gpu/decode_overhead.py;
MLX_USE_CUDA_GRAPHS=0 python3 tools/gpu/decode_overhead.py``.
"""

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

import mlx_fpqmm
from mlx_fpqmm._bench_gpu import copies, count_for, quantized_weights

# The timing of a graph's build, encoding and wait, shared with the end-to-end example.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from decode_speed import build_encode_wait, medians_ms  # noqa: E402

REPS = 5

Product = Callable[[mx.array, mx.array], mx.array]


def build_encode_wait_us(product: Product, pairs: list[tuple[mx.array, mx.array]]) -> list[float]:
    """Median per-product microseconds to build the graph, encode it and wait."""
    runs = [build_encode_wait(lambda: [product(w, s) for w, s in pairs]) for _ in range(REPS + 1)]
    return [ms * 1e3 / len(pairs) for ms in medians_ms(runs[1:])]  # the first is a warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="14336x4096", help="N x K of W")
    N, K = map(int, parser.parse_args().shape.split("x"))
    start = time.perf_counter()
    w_q, scales = quantized_weights(N, K, "mxfp4")
    count = count_for(w_q.nbytes + scales.nbytes, 1 << 30)
    pairs = list(zip(copies(w_q, count), copies(scales, count), strict=True))
    mx.eval(pairs)
    # A fresh machine's first process compiles MLX's own kernels as it meets them: the
    # seconds show it.
    print(
        f"{N} x {K}, MLX_USE_CUDA_GRAPHS={os.environ.get('MLX_USE_CUDA_GRAPHS')}, "
        f"{count} products a graph (weights ready in {time.perf_counter() - start:.1f} s); "
        "build / encode / wait, us a product",
        flush=True,
    )
    for shape in [(8, K), (1, K), (2, K), (4, K), (1, K), (8, K), (K,), (1, 1, K)]:
        x = (mx.random.normal(shape) * 0.5).astype(mx.bfloat16)
        mx.eval(x)
        ours = build_encode_wait_us(
            lambda w, s, x=x: mlx_fpqmm.quantized_matmul(x, w, s, mode="mxfp4"), pairs
        )
        try:
            mlx = build_encode_wait_us(
                lambda w, s, x=x: mx.quantized_matmul(x, w, s, mode="mxfp4"), pairs
            )
            theirs = "{:5.1f} / {:5.1f} / {:6.1f}".format(*mlx)
        except (IndexError, ValueError, RuntimeError) as error:
            # MLX 0.32.4's CUDA kernel raises "SmallVector out of range" on x of shape (K,).
            theirs = f"fails ({type(error).__name__}: {error})"
        plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode="mxfp4", device="cuda")
        print(
            f"x {str(shape):12s} ours: {ours[0]:5.1f} / {ours[1]:5.1f} / {ours[2]:6.1f} | "
            f"mx.quantized_matmul: {theirs} | {plan['kernel']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
