"""What a decoding product costs through MLX on the GPU, by rows of x.

On a CUDA machine with mlx_fpqmm installed (tools/gpu/check build): per product
of a graph over >= 1 GB of copies of a 14336 x 4096 mxfp4 matrix (bfloat16 x,
evaluated first), the host time to build the graph and the time to evaluate it,
``mlx_fpqmm.quantized_matmul`` beside ``mx.quantized_matmul``, for M = 8, 1, 2,
4 and again 1 and 8 (order effects), then x of shape (K,) and (1, 1, K), and
the kernel each runs. Compare with the kernel alone (the harness). Run with
and without MLX's CUDA graphs:
``python3 tools/gpu/decode_overhead.py; MLX_USE_CUDA_GRAPHS=0 python3
tools/gpu/decode_overhead.py``.
"""

import os
import statistics
import time
from collections.abc import Callable

import mlx.core as mx

import mlx_fpqmm
from mlx_fpqmm._bench_gpu import copies, count_for, quantized_weights

N, K, REPS = 14336, 4096, 5

Product = Callable[[mx.array, mx.array], mx.array]


def build_and_eval_us(
    product: Product, pairs: list[tuple[mx.array, mx.array]]
) -> tuple[float, float]:
    """Median per-product microseconds to build the graph and to evaluate it."""
    build, evaluate = [], []
    for _ in range(REPS + 1):  # the first is a warm-up
        mx.synchronize()
        start = time.perf_counter()
        outputs = [product(w, s) for w, s in pairs]
        built = time.perf_counter()
        mx.eval(outputs)
        mx.synchronize()
        done = time.perf_counter()
        build.append((built - start) / len(pairs) * 1e6)
        evaluate.append((done - built) / len(pairs) * 1e6)
    return statistics.median(build[1:]), statistics.median(evaluate[1:])


def main() -> None:
    w_q, scales = quantized_weights(N, K, "mxfp4")
    count = count_for(w_q.nbytes + scales.nbytes, 1 << 30)
    pairs = list(zip(copies(w_q, count), copies(scales, count), strict=True))
    print(f"MLX_USE_CUDA_GRAPHS={os.environ.get('MLX_USE_CUDA_GRAPHS')}, {count} products a graph")
    for shape in [(8, K), (1, K), (2, K), (4, K), (1, K), (8, K), (K,), (1, 1, K)]:
        x = (mx.random.normal(shape) * 0.5).astype(mx.bfloat16)
        mx.eval(x)
        ours = build_and_eval_us(
            lambda w, s, x=x: mlx_fpqmm.quantized_matmul(x, w, s, mode="mxfp4"), pairs
        )
        try:
            mlx = build_and_eval_us(
                lambda w, s, x=x: mx.quantized_matmul(x, w, s, mode="mxfp4"), pairs
            )
            theirs = f"build {mlx[0]:5.1f}, eval {mlx[1]:6.1f}"
        except (IndexError, ValueError, RuntimeError) as error:
            # MLX 0.32.4's CUDA kernel raises "SmallVector out of range" on x of shape (K,).
            theirs = f"fails ({type(error).__name__}: {error})"
        plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode="mxfp4", device="cuda")
        print(
            f"x {str(shape):12s} ours: build {ours[0]:5.1f} us, eval {ours[1]:6.1f} us | "
            f"mx.quantized_matmul: {theirs} | {plan['kernel']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
