"""What a decoding MoE product costs through MLX on the GPU, beside its parts.

On a CUDA machine with mlx_fpqmm installed (tools/gpu/check build): per product
of a graph of 64, ``mlx_fpqmm.gather_qmm`` against ``mx.gather_qmm`` for one
token routed to 4 of 32 experts of 2880 x 2880 (mxfp4, bfloat16 x, 4 copies of
the experts: 532 MB), in mlx-lm's unsorted and sorted layouts, and graphs of
only the index nodes the op built for the unsorted layout until it read x's
matrices as pair / divisor (arange, reshape, broadcast, contiguous) and of an
arange alone. Then the kernel path of each layout. Run:
``python3 tools/gpu/gather_overhead.py``.
"""

import mlx.core as mx
import numpy as np

import mlx_fpqmm
from mlx_fpqmm._bench_gpu import time_graph

EXPERTS, N, K, TOP_K, TOKENS, PRODUCTS, COPIES = 32, 2880, 2880, 4, 1, 64, 4


def main() -> None:
    w = mx.random.normal((EXPERTS, N, K)).astype(mx.bfloat16)
    w_q, scales = mx.quantize(w, mode="mxfp4")[:2]
    weights = [(w_q, scales)] + [(w_q + 0, scales + 0) for _ in range(COPIES - 1)]
    rng = np.random.default_rng(0)
    routes = [
        np.stack([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(TOKENS)])
        for _ in range(PRODUCTS)
    ]
    x = mx.random.normal((TOKENS, 1, 1, K)).astype(mx.bfloat16)
    x_sorted = mx.random.normal((TOKENS * TOP_K, 1, K)).astype(mx.bfloat16)
    unsorted = [mx.array(r.astype(np.uint32)) for r in routes]
    in_order = [mx.array(np.sort(r.reshape(-1)).astype(np.uint32)) for r in routes]
    mx.eval(weights, x, x_sorted, unsorted, in_order)

    def row(name: str, product) -> None:
        timing = time_graph([lambda i=i: product(i) for i in range(PRODUCTS)], 5)
        print(f"{name:44s} {timing.median * 1e6:8.1f} us")

    def gather(op, is_sorted: bool):
        xs, indices = (x_sorted, in_order) if is_sorted else (x, unsorted)
        return lambda i: op(
            xs,
            *weights[i % COPIES],
            rhs_indices=indices[i],
            mode="mxfp4",
            sorted_indices=is_sorted,
        )

    def index_nodes(i: int) -> mx.array:
        rows = mx.reshape(mx.arange(TOKENS, dtype=mx.uint32), (TOKENS, 1))
        return mx.contiguous(mx.broadcast_to(rows, (TOKENS, TOP_K))) + i

    for name, op in (
        ("mlx_fpqmm.gather_qmm", mlx_fpqmm.gather_qmm),
        ("mx.gather_qmm", mx.gather_qmm),
    ):
        for is_sorted in (False, True):
            row(f"{name}, {'sorted' if is_sorted else 'unsorted'}", gather(op, is_sorted))
    row("arange + reshape + broadcast + contiguous", index_nodes)
    row("arange alone", lambda i: mx.arange(TOKENS * TOP_K, dtype=mx.uint32) + i)
    for indices, xs, is_sorted in ((unsorted[0], x, False), (in_order[0], x_sorted, True)):
        path = mlx_fpqmm.kernel_path(
            xs, w_q, scales, mode="mxfp4", rhs_indices=indices,
            sorted_indices=is_sorted, device="cuda",
        )  # fmt: skip
        print(path["kernel"], path["note"])


if __name__ == "__main__":
    main()
