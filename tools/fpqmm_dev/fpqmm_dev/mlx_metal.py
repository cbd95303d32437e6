"""MLX's own fp-quantized Metal kernels, planned as MLX plans them, in the simulator.

MLX's Linux wheels carry no Metal kernels; its macOS headers come from the
``mlx-metal`` macOS wheel of the MLX version mlx_fpqmm is built against, which
``python -m fpqmm_dev.mlx_metal fetch`` downloads once with pip (``tools/setup``
runs it) into ``~/.cache/mlx_fpqmm`` (or ``$MLX_FPQMM_CACHE_DIR``); nothing else
here downloads anything. :func:`mlx_metal_wheel` finds those headers (the macOS
build check type-checks against them too); :func:`mlx_plan` is MLX's choice of
kernel, grid and buffers for a ``quantized_matmul`` (its host code, mirrored);
:func:`run_mlx` runs that plan in the Metal simulator (``metal_sim``) on the
kernels instantiated by the short ``mlx_metal_kernels/*.metal`` files, so MLX's
kernels and mlx_fpqmm's can be compared on the same problem.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_fpqmm import FORMATS
from mlx_fpqmm._formats import MLX_MODES
from mlx_fpqmm.testing import check_simulator

KERNEL_SOURCES = Path(__file__).resolve().parent / "mlx_metal_kernels"
CACHE_ENV = "MLX_FPQMM_CACHE_DIR"
MLX_VERSION = mx.__version__  # the one mlx_fpqmm is built against (its import checks)
FETCH_COMMAND = "python -m fpqmm_dev.mlx_metal fetch"

# MLX's two spellings of a dtype: get_type_string (kernel names and template
# arguments) and type_to_name (the steel kernels' names).
TYPE_STRINGS = {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t"}
TYPE_NAMES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}
KERNELS = ("auto", "qmv", "qmm_t", "splitk", "nax")
NUMPY_TYPES = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16}


class MlxMetalUnavailable(RuntimeError):
    """The mlx-metal wheel's headers are not here (not fetched, or the download failed)."""


def cache_dir() -> Path:
    """Where downloads and unpacked headers are kept."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mlx_fpqmm")


def _unpacked(version: str) -> Path:
    return cache_dir() / f"mlx-metal-{version}"


@functools.cache
def mlx_metal_wheel(version: str = MLX_VERSION) -> Path:
    """MLX's macOS headers: the ``mlx-metal`` wheel of ``version``, unpacked
    (``mlx/include`` and ``mlx/share``) by :func:`fetch_mlx_metal_wheel`.

    Raises:
        MlxMetalUnavailable: they were not fetched (the message says how to).
    """
    target = _unpacked(version)
    if not (target / "mlx" / "include" / "mlx" / "backend" / "metal" / "device.h").exists():
        raise MlxMetalUnavailable(
            f"the headers of mlx-metal=={version} are not in {target}: fetch them once with "
            f"`{FETCH_COMMAND}{'' if version == MLX_VERSION else f' --version {version}'}` "
            "(tools/setup does)"
        )
    return target


def fetch_mlx_metal_wheel(version: str = MLX_VERSION) -> Path:
    """Download the ``mlx-metal`` macOS wheel of ``version`` from PyPI (pip) and unpack
    its headers where :func:`mlx_metal_wheel` finds them; nothing when they are there.

    Raises:
        MlxMetalUnavailable: pip could not download the wheel (offline?).
    """
    target = _unpacked(version)
    try:
        return mlx_metal_wheel(version)
    except MlxMetalUnavailable:
        pass
    download = cache_dir() / "downloads"
    download.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--platform", "macosx_14_0_arm64",
        "--python-version", "3.11", f"mlx-metal=={version}", "-d", str(download),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(download.glob(f"mlx_metal-{version}-*macosx*arm64.whl"))
    if result.returncode != 0 or not wheels:
        raise MlxMetalUnavailable(
            f"cannot download mlx-metal=={version} from PyPI:\n{result.stderr[-2000:]}"
        )
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        members = [n for n in wheel.namelist() if n.startswith(("mlx/include/", "mlx/share/"))]
        wheel.extractall(partial, members)
    partial.replace(target)
    return target


# ---------------------------------------------------------------- MLX's plan


@dataclass(frozen=True)
class Device:
    """An Apple GPU as MLX's host code sees it (``Device::get_architecture``)."""

    architecture: str  # e.g. "applegpu_g17s"
    macos: tuple[int, int] = (26, 2)

    @property
    def generation(self) -> int:
        return int(re.search(r"(\d+)", self.architecture).group(1))

    @property
    def size(self) -> str:
        return self.architecture[-1]

    @property
    def has_nax(self) -> bool:
        """``metal::is_nax_available()``: macOS 26.2 and generation 17 (18 for 'p')."""
        return self.macos >= (26, 2) and self.generation >= (18 if self.size == "p" else 17)


@dataclass(frozen=True)
class Dispatch:
    """One kernel launch: what to instantiate, what to bind, how to launch."""

    source: str  # mlx_metal_kernels/<source>.metal
    host_name: str
    kernel: str  # the kernel template
    template_arguments: tuple[str, ...]
    buffers: dict[int, str | int]  # buffer index -> operand name, or an int set_bytes value
    grid: tuple[int, int, int] | None  # in threadgroups (dispatch_threadgroups)
    threadgroup: tuple[int, int, int]
    threads: tuple[int, int, int] | None = None  # dispatch_threads


@dataclass(frozen=True)
class MlxPlan:
    """MLX's plan for one ``quantized_matmul``: a kernel family and its launches."""

    kernel: str  # qmv_quad, qmv_fast, qmv, qmv_wide, qmm_t, qmm_t_splitk or qmm_t_nax
    dispatches: tuple[Dispatch, ...]
    partials: tuple[int, ...] = ()  # shape of qmm_t_splitk's float partial products


def qmv_batch_limit(K: int, N: int, device: Device) -> int:
    """``get_qmv_batch_limit``: below this many rows MLX runs a matrix-vector kernel."""
    small, medium = K <= 2048 and N <= 2048, K <= 4096 and N <= 4096
    if device.size == "d":
        limits = (32, 18, 12)
    elif device.generation >= 17:
        limits = (33, 25, 13)
    elif device.generation >= 15:
        limits = (13, 15, 13)
    elif device.generation >= 13:
        limits = (14, 10, 6)
    else:
        limits = (18, 12, 10)
    return limits[0] if small else limits[1] if medium else limits[2]


def block_dims(dim0: int, dim1: int, dim2: int, pow2: int = 10) -> tuple[int, int, int]:
    """``get_block_dims``: a power-of-two threadgroup of at most 2**pow2 threads."""
    pows, total = [0, 0, 0], 0
    while True:
        before = total
        for axis, dim in enumerate((dim0, dim1, dim2)):
            if dim >= 1 << (pows[axis] + 1):
                pows[axis] += 1
                total += 1
            if total == 10:
                return (1 << pows[0], 1 << pows[1], 1 << pows[2])
        if total in (before, pow2):
            return (1 << pows[0], 1 << pows[1], 1 << pows[2])


def mlx_plan(
    mode: str,
    dtype: mx.Dtype,
    M: int,
    N: int,
    K: int,
    device: Device,
    kernel: str = "auto",
) -> MlxPlan:
    """MLX's kernel for ``quantized_matmul(x, w, scales, transpose=True, mode=mode)``
    with x of ``dtype`` and shape (M, K), 2-D w (N, K), on ``device``.

    Mirrors ``QuantizedMatmul::eval_gpu`` of mlx/backend/metal/quantized.cpp
    (ml-explore/mlx, 0.32.x: ``get_qmv_batch_limit``, ``dispatch_qmv``, ``qmv``,
    ``qmv_quad``, ``qmv_wide``, ``qmm_splitk``, ``qmm``, ``qmm_nax``), with the
    0.32.4 kernels' signatures (a global-scale slot at buffer 2 of
    qmv/qmm_t/NAX, float split-K partials summed by ``gemm_splitk_accum``).
    ``kernel`` forces a family: "qmv" (what ``dispatch_qmv`` picks), "qmm_t",
    "splitk" or "nax"; "auto" is MLX's choice.
    """
    if mode not in MLX_MODES:
        raise ValueError(f"mode must be one of {', '.join(MLX_MODES)}, got {mode!r}.")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}.")
    group_size, bits = FORMATS[mode]["default_group_size"], FORMATS[mode]["bits"]
    type_string = TYPE_STRINGS[dtype]
    name = f"{type_string}_gs_{group_size}_b_{bits}"
    args = (type_string, str(group_size), str(bits))
    sizes = {"K": K, "N": N, "M": M}

    def launch(source, host, template, arguments, buffers, grid, threadgroup) -> Dispatch:
        # "K", "N", "M" bind those sizes (set_bytes); other names are operands
        bound = {i: sizes.get(v, v) for i, v in buffers.items()}
        return Dispatch(source, host, template, (*args, *arguments), bound, grid, threadgroup)

    if kernel == "auto":
        if M < qmv_batch_limit(K, N, device):
            kernel = "qmv"
        else:
            kernel = "splitk"  # tried first for an unbatched transposed product
    if kernel == "splitk":
        n_tiles, m_tiles = math.ceil(N / 32), math.ceil(M / 32)
        k_align = max(group_size, 32)
        split = min(max(1, 512 // (n_tiles * m_tiles)), K // k_align)
        while split > 1 and K % (split * k_align) != 0:
            split -= 1
        if split > 1:
            aligned = "true" if N % 32 == 0 else "false"
            qmm = launch(
                "fp_quantized",
                f"{mode}_qmm_t_splitk_{name}_alN_{aligned}",
                "fp_qmm_t_splitk",
                (aligned,),
                {
                    0: "w",
                    1: "scales",
                    2: "x",
                    3: "partials",
                    4: "K",
                    5: "N",
                    6: "M",
                    7: K // split,
                    8: M * N,
                },
                (n_tiles, m_tiles, split),
                (32, 2, 2),
            )
            accumulate = Dispatch(
                "steel_gemm_splitk",
                f"steel_gemm_splitk_accum_{TYPE_NAMES[dtype]}_float32",
                "gemm_splitk_accum",
                ("float", type_string),
                {0: "partials", 1: "y", 2: split, 3: M * N, 4: N},
                None,
                block_dims(N, M, 1),
                threads=(N, M, 1),
            )
            return MlxPlan("qmm_t_splitk", (qmm, accumulate), (split, M, N))
        # qmm() prefers NAX (float32 x too: TF32 is on by default)
        kernel = "nax" if device.has_nax and K % 64 == 0 else "qmm_t"
    if kernel == "nax":
        if not device.has_nax or K % 64:
            raise ValueError(
                f"MLX has no NAX kernel for K = {K} on {device.architecture} with macOS "
                f"{'.'.join(map(str, device.macos))} (needs K % 64 == 0, generation 17, 26.2)."
            )
        bm = 32 if M <= 32 else 64
        aligned = "true" if N % 64 == 0 else "false"
        dispatch = launch(
            "fp_quantized_nax",
            f"{mode}_qmm_t_nax_{name}_bm{bm}_bn64_bk64_wm2_wn2_alN_{aligned}_batch_0",
            "fp_qmm_t_nax",
            (aligned, "false", str(bm), "64", "64", "2", "2"),
            {0: "w", 1: "scales", 3: "x", 4: "y", 5: "K", 6: "N", 7: "M"},
            (math.ceil(N / 64), math.ceil(M / bm), 1),
            (32, 2, 2),
        )
        return MlxPlan("qmm_t_nax", (dispatch,))
    if kernel == "qmm_t":
        aligned = "true" if N % 32 == 0 else "false"
        dispatch = launch(
            "fp_quantized",
            f"{mode}_qmm_t_{name}_alN_{aligned}_batch_0",
            "fp_qmm_t",
            (aligned, "false"),
            {0: "w", 1: "scales", 3: "x", 4: "y", 5: "K", 6: "N", 7: "M"},
            (math.ceil(N / 32), math.ceil(M / 32), 1),
            (32, 2, 2),
        )
        return MlxPlan("qmm_t", (dispatch,))
    # dispatch_qmv
    if K in (64, 128):
        dispatch = launch(
            "fp_quantized",
            f"{mode}_qmv_quad_{name}_d_{K}_batch_0",
            "fp_qmv_quad",
            (str(K), "false"),
            {0: "w", 1: "scales", 2: "x", 3: "y", 4: "K", 5: "N"},
            (M, math.ceil(N / 64), 1),
            (32, 1, 1),
        )
        return MlxPlan("qmv_quad", (dispatch,))
    if M >= 2:  # fp modes take qmv_wide on every generation
        tiles = math.ceil(M / 5)
        vectors = math.ceil(M / tiles)
        dispatch = launch(
            "fp_quantized",
            f"{mode}_qmv_wide_{name}_nv_{vectors}_kl_16_batch_0",
            "fp_qmv_wide",
            (str(vectors), "16", "false"),
            {0: "w", 1: "scales", 2: "x", 3: "y", 4: "K", 5: "N", 6: "M"},
            (math.ceil(M / vectors), math.ceil(N / 4), 1),
            (32, 2, 1),
        )
        return MlxPlan("qmv_wide", (dispatch,))
    fast = N % 8 == 0 and K % ((32 // bits) * 2 * 32) == 0
    narrow = (
        fast and N >= 4096 and device.generation == 17 and device.size == "s" and mode == "nvfp4"
    )
    results = 2 if narrow else 4
    family = "qmv_fast" if fast else "qmv"
    dispatch = launch(
        "fp_quantized",
        f"{mode}_{family}_{name}_batch_0_pr_0_hgs_0_r_{results}",
        f"fp_{family}",
        ("false", "false", "false", str(results)),
        {0: "w", 1: "scales", 3: "x", 4: "y", 5: "K", 6: "N"},
        (M, math.ceil(N / (2 * results)), 1),
        (32, 2, 1),
    )
    return MlxPlan(family, (dispatch,))


# ---------------------------------------------------------------- running it


@dataclass
class MlxRun:
    """One simulated ``quantized_matmul`` by MLX's kernels."""

    y: np.ndarray  # float32 for bfloat16 x (its values exactly), else x's dtype
    plan: MlxPlan
    counters: list[dict[str, Any]] = field(default_factory=list)  # one per dispatch


@functools.cache
def _library(source: str, host_name: str, kernel: str, template_arguments: tuple[str, ...]):
    from metal_sim import Library

    include = mlx_metal_wheel() / "mlx" / "include"
    return Library(
        [KERNEL_SOURCES / f"{source}.metal"],
        include_dirs=[include],
        defines={
            "MLX_HOST_NAME": f'"{host_name}"',
            "MLX_KERNEL": kernel,
            "MLX_TEMPLATE_ARGUMENTS": ",".join(template_arguments),
        },
        metal_version="4.0",
    )


def _device_array(a: mx.array) -> np.ndarray:
    """A buffer's contents as NumPy holds them (bfloat16 as its bits)."""
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.ascontiguousarray(np.array(a))


def run_mlx(
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    *,
    mode: str,
    device: Device,
    kernel: str = "auto",
) -> MlxRun:
    """``quantized_matmul(x, w, scales, transpose=True, mode=mode)`` by MLX's
    Metal kernels as MLX plans it on ``device``, simulated on the CPU.

    ``x`` is (M, K) of float32, float16 or bfloat16; ``w``, ``scales`` come from
    ``mx.quantize(..., mode=mode)``.
    """
    check_simulator()
    M, K = x.shape
    N = w.shape[0]
    plan = mlx_plan(mode, x.dtype, M, N, K, device, kernel)
    # NaN everywhere, so an output element no kernel writes shows.
    nan = np.uint16(0x7FC0) if x.dtype == mx.bfloat16 else np.nan
    y = np.full((M, N), nan, dtype=NUMPY_TYPES[x.dtype])
    operands = {
        "w": _device_array(w),
        "scales": _device_array(scales),
        "x": _device_array(x),
        "y": y,
        "partials": np.full(plan.partials, np.nan, np.float32),
    }
    counters = []
    for d in plan.dispatches:
        buffers = {
            i: np.int32(v) if isinstance(v, int) else operands[v] for i, v in d.buffers.items()
        }
        library = _library(d.source, d.host_name, d.kernel, d.template_arguments)
        result = library.dispatch(
            d.host_name, buffers, grid=d.grid, threadgroup=d.threadgroup, threads=d.threads
        )
        counters.append(result.counters)
    if x.dtype == mx.bfloat16:
        y = np.array(mx.array(y).view(mx.bfloat16).astype(mx.float32))
    return MlxRun(y, plan, counters)


def main(argv: list[str] | None = None) -> None:
    """``python -m fpqmm_dev.mlx_metal fetch [--version V]``: fetch MLX's macOS headers."""
    parser = argparse.ArgumentParser(prog="python -m fpqmm_dev.mlx_metal")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="download and unpack the mlx-metal wheel")
    fetch.add_argument("--version", default=MLX_VERSION, help="default: the installed MLX's")
    args = parser.parse_args(argv)
    try:
        print(fetch_mlx_metal_wheel(args.version))
    except MlxMetalUnavailable as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
