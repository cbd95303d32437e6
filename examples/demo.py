"""mlx_fpqmm in a few lines: quantize a weight, multiply, check against MLX."""

import statistics
import time

import mlx.core as mx

import mlx_fpqmm

mx.set_default_device(mx.cpu)
mx.random.seed(0)


def milliseconds(op, *args, **kwargs) -> float:
    """Median wall time of an evaluated call, after a warm-up call: of 9 calls, or of those
    in about a second but at least 3 (one call alone is at the mercy of whatever else the
    machine does at that moment)."""
    mx.eval(op(*args, **kwargs))
    times = []
    while len(times) < 9 and (len(times) < 3 or sum(times) < 1.0):
        start = time.perf_counter()
        mx.eval(op(*args, **kwargs))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


N, K = 4096, 4096
w = mx.random.normal((N, K)) / K**0.5

print(f"x @ W.T with W {N}x{K}, on {mx.default_device()} (ms: the median of 3 to 9 calls)")
print(f"{'mode':6} {'M':>4} {'max |err|':>10} {'mlx_fpqmm ms':>13} {'mx.quantized_matmul ms':>23}")
for mode in ("mxfp4", "nvfp4", "mxfp8", "fp4", "fp8"):
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    op = mlx_fpqmm.qmm_for_mode(mode)
    w_ref = mlx_fpqmm.dequantize(w_q, scales, mode=mode, dtype=mx.float32)
    for M in (1, 32):
        x = mx.random.normal((M, K))
        err = mx.abs(op(x, w_q, scales, mode=mode) - x @ w_ref.T).max().item()
        ours = milliseconds(op, x, w_q, scales, mode=mode)
        if mode in ("fp4", "fp8"):
            theirs = "(not an MLX mode)"
        else:
            theirs = f"{milliseconds(mx.quantized_matmul, x, w_q, scales, mode=mode):.2f}"
        print(f"{mode:6} {M:>4} {err:>10.2e} {ours:>13.2f} {theirs:>23}")
