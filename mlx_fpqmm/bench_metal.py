"""Device-memory traffic of the Metal kernels, from the simulator's counters.

``python -m mlx_fpqmm.bench_metal`` (needs the Metal simulator, ``metal_sim``)
runs each kernel family at a few shapes and prints, per buffer, the bytes read
and written beside the compulsory bytes (each of w, scales, x and y moved
once), and the multiply-accumulates the matrix units issue per output element
(K of them are useful; the rest is zero padding of partial tiles).

What to expect: the decode kernels read every weight and scale byte once
(x is re-read by every simdgroup: caches absorb it on hardware); an MMA
kernel reads W ceil(M / BM) times and x ceil(N / 32) times, a NAX kernel
(generation-17 GPU) W ceil(M / BM) times and x ceil(N / 64) times, nothing
twice inside a tile.
"""

from __future__ import annotations

import argparse
import math

import mlx.core as mx

from . import quantize
from .testing import run_metal

# (mode, transpose, kernel, M, N, K)
CASES = [
    ("mxfp4", True, "qmv", 1, 256, 1024),
    ("mxfp4", True, "qmv", 8, 256, 1024),
    ("mxfp4", True, "qmv", 32, 256, 1024),
    ("mxfp8", True, "qmv", 8, 256, 1024),
    ("mxfp4", False, "qmv", 3, 256, 1024),
    ("mxfp4", True, "mma", 32, 256, 1024),
    ("mxfp4", True, "mma", 64, 256, 1024),
    ("mxfp4", True, "mma", 128, 256, 1024),
    ("mxfp8", True, "mma", 128, 256, 1024),
    ("mxfp4", False, "mma", 128, 256, 1024),
    ("mxfp4", True, "nax", 32, 256, 1024),
    ("mxfp4", True, "nax", 64, 256, 1024),
    ("mxfp4", True, "nax", 128, 256, 1024),
    ("mxfp8", True, "nax", 128, 256, 1024),
    ("mxfp4", True, "nax", 100, 200, 1024),
]
# Multiply-accumulates per matrix-unit operation: an 8x8x8 simdgroup_matrix
# product, a (16, 32, 16) matmul2d step.
MACS = {"simdgroup_matrix_ops": 8 * 8 * 8, "matmul2d_runs": 16 * 32 * 16}


def measure(mode, transpose, kernel, M, N, K):
    w = mx.random.normal((N, K) if transpose else (K, N))
    w_q, scales = quantize(w, mode=mode)
    x = mx.random.normal((M, K)).astype(mx.float16)
    device = "applegpu_g17s" if kernel == "nax" else "applegpu_g16s"
    run = run_metal(
        x, w_q, scales, mode=mode, transpose=transpose, kernel=kernel, device=device, macos="26.2"
    )
    compulsory = {
        "w": w_q.nbytes,
        "scales": scales.nbytes,
        "x": x.nbytes,
        "y": M * N * x.itemsize,
    }
    rows = []
    for index, (kind, name) in run.plan["buffers"].items():
        if kind != "operand":
            continue
        counted = run.counters["buffers"][index]
        moved = counted["bytes_written"] if name == "y" else counted["bytes_read"]
        rows.append((name, moved, counted, compulsory[name]))
    return run, rows


def expected_multiple(plan, name, M, N):
    """How many times the tiling says a buffer moves (None: not a tiling bound)."""
    if name == "y":
        return 1
    if not plan["block_m"]:  # the decode kernels: every weight byte once
        return 1 if name in ("w", "scales") else None
    if name in ("w", "scales"):
        return math.ceil(M / plan["block_m"])
    return math.ceil(N / plan["block_n"])


def report(cases) -> str:
    lines = [
        f"{'kernel':34} {'M':>4} {'N':>4} {'K':>5}  {'buffer':7} {'moved':>9} "
        f"{'unique':>9} {'compulsory':>10} {'ratio':>6} {'tiling':>6}  MAC/output"
    ]
    for mode, transpose, kernel, M, N, K in cases:
        run, rows = measure(mode, transpose, kernel, M, N, K)
        name = run.plan["kernel"]
        macs = sum(run.counters[op] * count for op, count in MACS.items()) / (M * N)
        for i, (buffer, moved, counted, compulsory) in enumerate(rows):
            unique = counted["unique_bytes_written" if buffer == "y" else "unique_bytes_read"]
            expected = expected_multiple(run.plan, buffer, M, N)
            lines.append(
                f"{name if i == 0 else '':34} {M:>4} {N:>4} {K:>5}  {buffer:7} {moved:>9} "
                f"{unique:>9} {compulsory:>10} {moved / compulsory:>6.2f} "
                f"{'' if expected is None else expected:>6}"
                + (f"  {macs:.0f}" if i == 0 and macs else "")
            )
    lines.append(
        "moved: bytes read (written for y); ratio: moved / compulsory; tiling: the "
        "multiple the tiling implies (W: ceil(M/BM), x: ceil(N/BN), BN 32 for mma, 64 for "
        "nax); MAC/output: multiply-accumulates issued per output (K = 1024 useful)."
    )
    lines.append(
        "Tile choice: at M = 128, N = 256 a 32-row tile would read W 4x; the 64-row "
        "tile reads it 2x for the same x traffic (8x), so the plan takes BM = 64 above M = 32. "
        "NAX, the same rule (MLX's): up to M = 32 both tiles move the same device bytes and "
        "the 32-row one keeps all four simdgroups busy; above it the 64-row tile reads W half "
        "as often (N = 4096, K = 1024: M = 40 moves 7.8 MB instead of 10.0, M = 128 22.3 "
        "instead of 26.7). Its 64-wide N tile halves the x traffic of the MMA kernel's 32."
    )
    return "\n".join(lines)


def moe_report(experts: int = 8, pairs: int = 128, N: int = 256, K: int = 1024) -> str:
    """Weight traffic of gather_qmm with one row per pair (mlx-lm's token layout):
    per-pair kernels against the sorted-runs kernel."""
    w_q, scales = quantize(mx.random.normal((experts, N, K)), mode="mxfp4")
    x = mx.random.normal((pairs, 1, K)).astype(mx.float16)
    sorted_rhs = mx.array([e * experts // pairs for e in range(pairs)], dtype=mx.uint32)
    expert_bytes = w_q[0].nbytes
    lines = [
        f"mixture of experts, mxfp4, {experts} experts of {N}x{K}, {pairs} pairs of one row",
        f"{'kernel':40} {'indices':>8} {'W moved':>10} {'experts x W':>11} {'ratio':>6}",
    ]
    for label, sorted_indices in (("sorted", True), ("as given", False)):
        run = run_metal(
            x, w_q, scales, mode="mxfp4", rhs_indices=sorted_rhs, sorted_indices=sorted_indices
        )
        moved = run.counters["buffers"][0]["bytes_read"]
        compulsory = experts * expert_bytes
        lines.append(
            f"{run.plan['kernel']:40} {label:>8} {moved:>10} {compulsory:>11} "
            f"{moved / compulsory:>6.1f}"
        )
    lines.append(
        "W moved: weight bytes read; experts x W: every routed expert once. Sorted runs "
        "read each expert once per 32-row tile routed to it; per-pair kernels once per pair."
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    mx.random.seed(0)
    print(report(CASES))
    print()
    print(moe_report())


if __name__ == "__main__":
    main()
