"""Device-memory traffic of the Metal kernels, from the simulator's counters.

``python -m fpqmm_dev.bench_metal`` (needs the Metal simulator, ``metal_sim``)
runs each kernel family at a few shapes and prints, per buffer, the bytes read
and written beside the compulsory bytes (each of w, scales, x and y moved
once), and the multiply-accumulates the matrix units issue per output element
(K of them are useful; the rest is zero padding of partial tiles).

What to expect: the decode kernels read every weight and scale byte once
(x once per simdgroup of 4 output rows: caches absorb it on hardware); an MMA
kernel reads W ceil(M / BM) times and x ceil(N / 32) times, a NAX kernel
(generation-17 GPU) W ceil(M / BM) times and x ceil(N / 64) times, nothing
twice inside a tile. Where the plan splits K (few tiles for the GPU's cores),
the float32 partial sums are written once and read back once (``partials``).

``python -m fpqmm_dev.bench_metal --vs-mlx`` runs MLX's own fp-quantized kernels
(fpqmm_dev.mlx_metal: its headers from the mlx-metal wheel, its host code's
choice of kernel) and mlx_fpqmm's on the same problems, each planned as its
library plans it for the device (default a generation-17 GPU on macOS 26.2,
where both have NAX kernels), and prints the simulator's counters per output
element side by side; ``--json FILE`` saves every row. The default set takes a
few minutes; ``--full`` (or ``--modes``, ``--dtypes``, ``--m``, ``--sizes``)
widens it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_fpqmm import quantize
from mlx_fpqmm.testing import run_metal

from . import mlx_metal

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
        if name == "partials":  # split K's float32 temporary: written, then read back
            moved = counted["bytes_written"] + counted["bytes_read"]
        else:
            moved = counted["bytes_written"] if name == "y" else counted["bytes_read"]
        rows.append((name, moved, counted, compulsory.get(name)))
    return run, rows


def expected_multiple(plan, name, M, N):
    """How many times the tiling says a buffer moves (None: not a tiling bound)."""
    if name == "y":
        return 1
    if name == "partials":
        return None
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
            ratio = f"{moved / compulsory:.2f}" if compulsory else ""
            lines.append(
                f"{name if i == 0 else '':34} {M:>4} {N:>4} {K:>5}  {buffer:7} {moved:>9} "
                f"{unique:>9} {compulsory or '':>10} {ratio:>6} "
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


# The side-by-side problems: decode and prefill rows, N x K. 2560 x 2560 stands
# in for 4096 x 4096 at 0.39 of its work (4096^2 at M = 512 takes the simulator
# about 2.5 minutes for the two sides): K and N are above 2048 as there (MLX's
# decode limit is the 4096 class's) and keep every alignment (K % 512, N % 64).
DECODE_M = (1, 4, 8)
PREFILL_M = (32, 64, 128, 512)
SIZES = ((512, 512), (2560, 2560), (2112, 512))
DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16}
DEFAULT_SET = {
    "modes": tuple(mlx_metal.MLX_MODES),
    "dtypes": ("float16",),
    "ms": (1, 8, 64, 512),
    "sizes": ((512, 512), (2112, 512)),
}
FULL_SET = {
    "modes": tuple(mlx_metal.MLX_MODES),
    "dtypes": tuple(DTYPES),
    "ms": DECODE_M + PREFILL_M,
    "sizes": SIZES,
}
OPERANDS = ("w", "scales", "x")
INSTRUCTION_CLASSES = ("float", "integer", "conversion", "memory", "control", "other")


def sum_counters(dispatches: list[tuple[dict[str, Any], dict[int, str]]]) -> dict[str, Any]:
    """Counters of one call summed over its dispatches, buffers by operand name
    (each dispatch's counters with its buffer index -> operand name)."""
    total: dict[str, Any] = {"buffers": {}, "instructions": dict.fromkeys(INSTRUCTION_CLASSES, 0)}
    for counters, names in dispatches:
        for key, value in counters.items():
            if key == "buffers":
                for index, counted in value.items():
                    if index not in names:
                        continue
                    into = total["buffers"].setdefault(names[index], dict.fromkeys(counted, 0))
                    for k, v in counted.items():
                        into[k] = v if k == "size" else into[k] + v
            elif key == "instructions":
                for k, v in value.items():
                    total["instructions"][k] += v
            else:
                total[key] = total.get(key, 0) + value
    return total


def per_output(counters: dict[str, Any], outputs: int) -> dict[str, float]:
    """The report's measures per output element (threadgroups: the total)."""
    buffers = counters["buffers"]
    row = {}
    for name in OPERANDS:
        row[f"{name}_read"] = buffers[name]["bytes_read"] / outputs
        row[f"{name}_unique"] = buffers[name]["unique_bytes_read"] / outputs
    row["y_written"] = buffers["y"]["bytes_written"] / outputs
    row["y_unique"] = buffers["y"]["unique_bytes_written"] / outputs
    partials = buffers.get("partials", {"bytes_read": 0, "bytes_written": 0})
    row["partials"] = (partials["bytes_read"] + partials["bytes_written"]) / outputs
    row["threadgroup_bytes"] = (
        counters["threadgroup_bytes_read"] + counters["threadgroup_bytes_written"]
    ) / outputs
    for key in ("threadgroup_barriers", "simdgroup_barriers", "simd_collectives"):
        row[key] = counters[key] / outputs
    row["matrix_macs"] = sum(counters[op] * n for op, n in MACS.items()) / outputs
    row["threadgroups"] = counters["threadgroups"]
    for name, count in counters["instructions"].items():
        row[name] = count / outputs
    row["instructions"] = sum(counters["instructions"].values()) / outputs
    return row


def relative_error(y: np.ndarray, x: mx.array, w_q: mx.array, scales: mx.array, mode: str) -> float:
    """max |y - x W^T| / max_i sum_k |x_ik W_jk|, W decoded by mx.dequantize."""
    w = np.array(mx.dequantize(w_q, scales, mode=mode, dtype=mx.float32)).astype(np.float64)
    xf = np.array(x.astype(mx.float32)).astype(np.float64)
    reference, magnitude = xf @ w.T, np.abs(xf) @ np.abs(w.T)
    return float(np.abs(y.astype(np.float64) - reference).max() / magnitude.max())


def mlx_row(x, w_q, scales, mode: str, device: mlx_metal.Device, kernel: str) -> dict[str, Any]:
    """MLX's kernels on one problem (``kernel``: "auto", MLX's pick, or "nax")."""
    run = mlx_metal.run_mlx(x, w_q, scales, mode=mode, device=device, kernel=kernel)
    names = [
        {i: v for i, v in d.buffers.items() if isinstance(v, str)} for d in run.plan.dispatches
    ]
    # the family, and what varies within it: split, rows per tile, vectors per tile
    label = run.plan.kernel
    if run.plan.partials:
        label += f" x{run.plan.partials[0]} +accum"
    detail = re.search(r"_(bm\d+|nv_\d+)_", run.plan.dispatches[0].host_name)
    if detail:
        label += " " + detail.group(1).replace("_", "")
    return {
        "side": "MLX",
        "kernel": label,
        "nax": run.plan.kernel == "qmm_t_nax",
        "y": run.y,
        "counters": sum_counters(list(zip(run.counters, names, strict=True))),
    }


def our_row(x, w_q, scales, mode: str, device: mlx_metal.Device, kernel: str) -> dict[str, Any]:
    """mlx_fpqmm's kernel on one problem (``kernel``: "auto", its pick, or "nax")."""
    macos = ".".join(map(str, device.macos))
    run = run_metal(
        x, w_q, scales, mode=mode, device=device.architecture, macos=macos, kernel=kernel
    )
    bindings = [run.plan["buffers"]]
    if run.plan["reduction"] is not None:
        bindings.append(run.plan["reduction"]["buffers"])
    names = [{i: name for i, (kind, name) in b.items() if kind == "operand"} for b in bindings]
    dispatches = run.counters.get("dispatches", [run.counters])
    # the family and tile; the row already names the format and dtype
    kernel = re.sub(r"^fpqmm_|_e(2m1|4m3)_\w+$", "", run.plan["kernel"])
    if run.plan["reduction"] is not None:
        kernel += f" x{run.plan['split_k']} +sum"
    return {
        "side": "ours",
        "kernel": kernel,
        "nax": run.plan["path"] == "nax",
        "y": run.y,
        "counters": sum_counters(list(zip(dispatches, names, strict=True))),
    }


SIDES = (mlx_row, our_row)


def vs_mlx_rows(modes, dtypes, ms, sizes, device: mlx_metal.Device) -> list[dict[str, Any]]:
    """Both libraries' picks for each problem, and on a NAX device each side's
    NAX kernel for prefill problems where its pick is another kernel."""
    rows = []
    for mode in modes:
        for dtype_name in dtypes:
            for N, K in sizes:
                w_q, scales = mx.quantize(mx.random.normal((N, K)), mode=mode)
                for M in ms:
                    x = mx.random.normal((M, K)).astype(DTYPES[dtype_name])
                    problem = {"mode": mode, "dtype": dtype_name, "M": M, "N": N, "K": K}
                    picks = [side(x, w_q, scales, mode, device, "auto") for side in SIDES]
                    runs = [{**run, "choice": "pick"} for run in picks]
                    prefill = M >= mlx_metal.qmv_batch_limit(K, N, device)
                    if device.has_nax and prefill and K % 64 == 0:
                        runs += [
                            {**side(x, w_q, scales, mode, device, "nax"), "choice": "nax"}
                            for side, pick in zip(SIDES, picks, strict=True)
                            if not pick["nax"]
                        ]
                    for run in runs:
                        error = relative_error(run.pop("y"), x, w_q, scales, mode)
                        rows.append(
                            {
                                **problem,
                                "device": device.architecture,
                                **run,
                                "error": error,
                                "per_output": per_output(run["counters"], M * N),
                            }
                        )
    return rows


# (header, per_output key) of the table's measure columns.
COLUMNS = [
    ("W rd", "w_read"), ("W uq", "w_unique"), ("S rd", "scales_read"),
    ("S uq", "scales_unique"), ("X rd", "x_read"), ("X uq", "x_unique"),
    ("Y wr", "y_written"), ("tmp", "partials"), ("tg B", "threadgroup_bytes"),
    ("tgbar", "threadgroup_barriers"), ("sgbar", "simdgroup_barriers"),
    ("simd", "simd_collectives"), ("MAC", "matrix_macs"), ("TGs", "threadgroups"),
    ("fp", "float"), ("int", "integer"), ("cvt", "conversion"), ("mem", "memory"),
    ("ctl", "control"), ("oth", "other"), ("instr", "instructions"),
]  # fmt: skip


def vs_mlx_report(rows: list[dict[str, Any]]) -> str:
    head = f"{'mode':6} {'dtype':8} {'M':>4} {'N x K':>11} {'side':4} {'kernel':36}"
    lines = [head + "".join(f" {h:>7}" for h, _ in COLUMNS) + f" {'error':>8}"]
    for r in rows:
        label = r["kernel"] + (" (forced)" if r["choice"] == "nax" else "")
        cells = "".join(f" {r['per_output'][key]:>7.3g}" for _, key in COLUMNS)
        lines.append(
            f"{r['mode']:6} {r['dtype']:8} {r['M']:>4} {r['N']:>5} x{r['K']:>5} "
            f"{r['side']:4} {label[:36]:36}{cells} {r['error']:>8.1e}"
        )
    lines.append(
        f"Per output element on {rows[0]['device'] if rows else '-'} (simulator counts): "
        "bytes read (rd) and distinct bytes read (uq) of W, scales and x; bytes of y "
        "written; tmp: split-K partials written and read; tg B: threadgroup bytes read and "
        "written; tgbar/sgbar: threadgroup/simdgroup barriers completed (one per group); "
        "simd: SIMD-group collectives; MAC: simdgroup-matrix and matmul2d multiply-adds; "
        "TGs: threadgroups launched (total); fp/int/cvt/mem/ctl/oth: instructions executed "
        "by class (all threads), instr: their sum; error: max |y - ref| / max sum |x w|. "
        "Each side's pick as its library plans it; (forced): its NAX kernel where it picked "
        "another."
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vs-mlx",
        action="store_true",
        help="MLX's kernels beside mlx_fpqmm's, per output element (needs the mlx-metal wheel)",
    )
    parser.add_argument("--json", metavar="FILE", help="with --vs-mlx: save the rows as JSON")
    parser.add_argument("--full", action="store_true", help="with --vs-mlx: every problem")
    parser.add_argument("--modes", nargs="+", choices=tuple(mlx_metal.MLX_MODES))
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES))
    parser.add_argument("--m", nargs="+", type=int, help="rows of x")
    parser.add_argument("--sizes", nargs="+", metavar="NxK", help="e.g. 512x512 2112x512")
    parser.add_argument("--device", default="applegpu_g17s", help="GPU architecture")
    parser.add_argument("--macos", default="26.2", help="macOS version (NAX from 26.2)")
    args = parser.parse_args(argv)
    mx.random.seed(0)
    if not args.vs_mlx:
        print(report(CASES))
        print()
        print(moe_report())
        return
    chosen = dict(FULL_SET if args.full else DEFAULT_SET)
    if args.modes:
        chosen["modes"] = tuple(args.modes)
    if args.dtypes:
        chosen["dtypes"] = tuple(args.dtypes)
    if args.m:
        chosen["ms"] = tuple(args.m)
    if args.sizes:
        chosen["sizes"] = tuple(tuple(int(v) for v in s.lower().split("x")) for s in args.sizes)
    macos = tuple(int(v) for v in args.macos.split("."))
    device = mlx_metal.Device(args.device, macos)
    rows = vs_mlx_rows(**chosen, device=device)
    print(vs_mlx_report(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
