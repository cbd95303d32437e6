"""mlx_fpqmm in a few lines: quantize a weight, multiply, check against MLX."""

import time

import mlx.core as mx

import mlx_fpqmm

mx.set_default_device(mx.cpu)
mx.random.seed(0)

N, K = 4096, 4096
w = mx.random.normal((N, K)) / K**0.5

print(f"x @ W.T with W {N}x{K}, on {mx.default_device()}")
print(f"{'mode':6} {'M':>4} {'max |err| vs MLX':>17} {'mlx_fpqmm ms':>13} {'mx.quantized_matmul ms':>23}")
for mode in ("mxfp4", "nvfp4", "mxfp8", "fp4", "fp8"):
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    op = mlx_fpqmm.fp8_qmm if mode in ("mxfp8", "fp8") else mlx_fpqmm.fp4_qmm
    w_ref = mlx_fpqmm.dequantize(w_q, scales, mode=mode, dtype=mx.float32)
    for M in (1, 32):
        x = mx.random.normal((M, K))
        y = op(x, w_q, scales, mode=mode)
        err = mx.abs(y - x @ w_ref.T).max().item()

        def timed(f):
            mx.eval(f())
            start = time.perf_counter()
            mx.eval(f())
            return (time.perf_counter() - start) * 1e3

        ours = timed(lambda: op(x, w_q, scales, mode=mode))
        if mode in ("fp4", "fp8"):
            theirs = "(not an MLX mode)"
        else:
            ms = timed(lambda: mx.quantized_matmul(x, w_q, scales, mode=mode))
            theirs = f"{ms:.2f}"
        print(f"{mode:6} {M:>4} {err:>17.2e} {ours:>13.2f} {theirs:>23}")
