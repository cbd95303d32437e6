"""What a decoding MoE product costs through MLX on the GPU, by layout.

On a CUDA machine with mlx_fpqmm installed (tools/gpu/check build): per product
of a graph of 64, ``mlx_fpqmm.gather_qmm`` against ``mx.gather_qmm`` for
1 and 8 tokens routed to 4 of 32 experts of 2880 x 2880 (mxfp4,
bfloat16 x, 4 copies of the experts: 532 MB), in mlx-lm's unsorted layout
(x (T, 1, 1, K), indices (T, 4)) and sorted layout (x (pairs, 1, K), sorted
indices (pairs,)), each timed twice in alternating order (so that an order
effect shows), then the kernel path of each layout. Run with and without
MLX's CUDA graphs: ``python3 tools/gpu/gather_overhead.py;
MLX_USE_CUDA_GRAPHS=0 python3 tools/gpu/gather_overhead.py``.
"""

import os

import mlx.core as mx

import mlx_fpqmm
from mlx_fpqmm._bench_gpu import copies, gather_products, moe_layouts, routes, time_graph

EXPERTS, N, K, TOP_K, PRODUCTS, COPIES = 32, 2880, 2880, 4, 64, 4


def main() -> None:
    print(f"MLX_USE_CUDA_GRAPHS={os.environ.get('MLX_USE_CUDA_GRAPHS')}")
    w_q, scales = mx.quantize(mx.random.normal((EXPERTS, N, K)).astype(mx.bfloat16), mode="mxfp4")[
        :2
    ]
    weights = list(zip(copies(w_q, COPIES), copies(scales, COPIES), strict=True))
    for tokens in (1, 8):
        chosen = routes(tokens, EXPERTS, TOP_K, PRODUCTS, seed=tokens)
        layouts = moe_layouts(chosen, K, mx.bfloat16)
        mx.eval(layouts)
        for round_ in range(2):
            for layout, (xs, indices, is_sorted) in layouts.items():
                cases = [(weights[i % COPIES], indices[i]) for i in range(PRODUCTS)]
                for name, op in (
                    ("mlx_fpqmm.gather_qmm", mlx_fpqmm.gather_qmm),
                    ("mx.gather_qmm", mx.gather_qmm),
                ):
                    timing = time_graph(gather_products(op, cases, "mxfp4", is_sorted), xs, 5)
                    label = f"{tokens} tokens, {layout}, {name} (round {round_ + 1})"
                    print(f"{label:58s} {timing.median * 1e6:8.1f} us")
        for layout, (xs, indices, is_sorted) in layouts.items():
            path = mlx_fpqmm.kernel_path(
                xs, w_q, scales, mode="mxfp4", rhs_indices=indices[0],
                sorted_indices=is_sorted, device="cuda",
            )  # fmt: skip
            print(layout, path["kernel"], path["grid"], path["note"])


if __name__ == "__main__":
    main()
