"""mlx_fpqmm in a few lines: quantize a weight, multiply, check against MLX."""

import time

import mlx.core as mx

import mlx_fpqmm

mx.set_default_device(mx.cpu)
mx.random.seed(0)


def milliseconds(op, *args, **kwargs) -> float:
    """Wall time of one evaluated call, after a warm-up call."""
    mx.eval(op(*args, **kwargs))
    start = time.perf_counter()
    mx.eval(op(*args, **kwargs))
    return (time.perf_counter() - start) * 1e3


N, K = 4096, 4096
w = mx.random.normal((N, K)) / K**0.5

print(f"x @ W.T with W {N}x{K}, on {mx.default_device()}")
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
