"""Run mlx_fpqmm's Metal kernels anywhere, through the Metal simulator.

The simulator (the ``metal_sim`` package, ``tools/metal_sim`` in mlx_fpqmm's
source tree: ``pip install -e tools/metal_sim``) compiles the unmodified
``csrc/backend/metal/kernels/*.metal`` kernels for the CPU of an x86-64 Linux
machine. The kernel sources ship inside the mlx_fpqmm package
(``mlx_fpqmm/include``); an editable install uses the source checkout's
``csrc/``. Each call is planned by the same C++ code as the GPU evaluation
(``kernel_path``), then dispatched with that plan's kernel, grid, threadgroup
memory, function constants and buffers.

``dequantize_on_cpu()`` builds on the CPU the graphs that the CUDA plan builds
instead of the product primitive, to test them without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from . import _ext

PACKAGE_DIR = Path(__file__).resolve().parent


@contextlib.contextmanager
def dequantize_on_cpu() -> Iterator[None]:
    """Within the block, the ops on CPU streams (of this thread) build the graph that
    the CUDA plan builds for many rows of x: ``FpDequantize`` (here its CPU kernel),
    then MLX's ``matmul``, or for ``gather_qmm`` without ``lhs_indices`` MLX's
    ``gather_mm``, whatever the number of rows. Slower than the CPU path: it lets
    the tests check that graph without a GPU."""
    _ext._set_dequantize_on_cpu(True)
    try:
        yield
    finally:
        _ext._set_dequantize_on_cpu(False)


def find_kernel_root(package_dir: Path = PACKAGE_DIR) -> Path:
    """The include root of the kernel sources (``common/`` and
    ``backend/metal/kernels/`` below it): beside the installed module (a wheel
    ships them as ``mlx_fpqmm/include``), else the source checkout's ``csrc/``
    (an editable install, whose module is the checkout's own)."""
    installed = package_dir / "include"
    if any((installed / METAL_KERNELS).glob("*.metal")):
        return installed
    return package_dir.parent / "csrc"


METAL_KERNELS = Path("backend", "metal", "kernels")
KERNEL_ROOT = find_kernel_root()
METAL_DIR = KERNEL_ROOT / METAL_KERNELS

# Buffer contents as NumPy sees them (bfloat16 travels as its raw bits).
_NUMPY_TYPES = {
    mx.float32: np.float32,
    mx.float16: np.float16,
    mx.bfloat16: np.uint16,
    mx.uint32: np.uint32,
    mx.uint8: np.uint8,
}
_NAN_BITS_BFLOAT16 = 0x7FC0


# Each metallib (as the plan names it): the directory of its .metal files and
# the Metal language version CMake compiles it at (its deployment target's,
# cmake/sources.cmake).
LIBRARIES = {"mlx_fpqmm": (METAL_DIR, "3.1"), "mlx_fpqmm_nax": (METAL_DIR / "nax", "4.0")}


def kernel_sources(name: str = "mlx_fpqmm") -> list[Path]:
    """The .metal files of a metallib (what CMake compiles on macOS)."""
    return sorted(LIBRARIES[name][0].glob("*.metal"))


def check_simulator() -> None:
    """Raises a RuntimeError (wrong machine) or ImportError (metal_sim not
    installed) saying what the simulator needs."""
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux") or machine not in ("x86_64", "amd64"):
        raise RuntimeError(
            "mlx_fpqmm.testing runs the Metal kernels through the metal_sim simulator, which "
            "needs an x86-64 Linux machine (its threads are fibers with hand-written x86-64 "
            f"context switches); this machine is {sys.platform} {platform.machine()}. "
            "On a Mac, run the kernels on the GPU (mlx_fpqmm's ops with mx.gpu)."
        )
    try:
        import metal_sim  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "mlx_fpqmm.testing needs the Metal simulator, the metal_sim package: install it "
            "from mlx_fpqmm's source tree with `pip install -e tools/metal_sim` "
            "(tools/setup does)."
        ) from e


def library(name: str = "mlx_fpqmm"):
    """The simulator's build of the metallib ``name``: every kernel in its sources.

    Each metallib is a library of its own, as on the GPU (the function constants
    of ``backend/metal/kernels/fp_common.h`` are defined once per library).
    """
    check_simulator()
    if not kernel_sources(name):
        raise RuntimeError(
            f"mlx_fpqmm.testing: the Metal kernel sources of {name} were not found in "
            f"{LIBRARIES[name][0]} (a wheel ships them in mlx_fpqmm/include; reinstall mlx_fpqmm)."
        )
    return _build_library(name)


@functools.cache
def _build_library(name: str):
    from metal_sim import Library

    return Library(
        kernel_sources(name), include_dirs=[KERNEL_ROOT], metal_version=LIBRARIES[name][1]
    )


@dataclass
class MetalRun:
    """One simulated call: its output, the plan it ran and the simulator's counters
    (with split K, both dispatches' added up; each one's under ``"dispatches"``)."""

    y: np.ndarray
    plan: dict[str, Any]
    counters: dict[str, Any]


def _as_mlx(a):
    return a if a is None or isinstance(a, mx.array) else mx.array(a)


def _buffer(contents: bytes, dtype: mx.Dtype) -> np.ndarray:
    return np.frombuffer(contents, dtype=_NUMPY_TYPES[dtype]).copy()


def _bind(bindings: dict[int, tuple[str, Any]], operands: dict[str, np.ndarray]) -> dict:
    """A plan's buffer bindings as the simulator takes them."""
    vectors = {"int32[]": np.int32, "int64[]": np.int64}
    buffers: dict[int, Any] = {}
    for index, (kind, value) in bindings.items():
        if kind == "operand":
            buffers[index] = operands[value]
        elif kind == "int32":
            buffers[index] = np.int32(value)
        else:
            buffers[index] = np.array(value, dtype=vectors[kind]).tobytes()
    return buffers


def _combined_counters(dispatches: list[dict[str, Any]]) -> dict[str, Any]:
    """The counters of consecutive dispatches as one call's: counts added, and
    per buffer slot (the dispatches of a plan bind an operand at the same slot)
    the bytes added; each dispatch's own under ``"dispatches"``."""
    combined: dict[str, Any] = {"buffers": {}, "dispatches": dispatches}
    for counters in dispatches:
        for key, value in counters.items():
            if key == "buffers":
                for index, counted in value.items():
                    slot = combined["buffers"].setdefault(index, dict.fromkeys(counted, 0))
                    for field, amount in counted.items():
                        combine = max if field == "size" else sum
                        slot[field] = combine((slot[field], amount))
            elif key == "instructions":
                into = combined.setdefault(key, dict.fromkeys(value, 0))
                for kind, count in value.items():
                    into[kind] += count
            elif isinstance(value, (int, float)):
                combined[key] = combined.get(key, 0) + value
    return combined


def run_metal(
    x,
    w,
    scales,
    *,
    mode: str,
    transpose: bool = True,
    group_size: int | None = None,
    global_scale=None,
    lhs_indices=None,
    rhs_indices=None,
    sorted_indices: bool = False,
    device: str = "applegpu_g16s",
    macos: str | None = None,
    kernel: str = "auto",
) -> MetalRun:
    """Plans the call as the GPU evaluation would on ``device`` and simulates it.

    With ``lhs_indices`` or ``rhs_indices`` the call is :func:`mlx_fpqmm.gather_qmm`'s.
    The simulator builds the NAX kernels from their sources, so the plan may pick
    them wherever the device and macOS version allow.
    """
    x, w, scales, global_scale, lhs_indices, rhs_indices = map(
        _as_mlx, (x, w, scales, global_scale, lhs_indices, rhs_indices)
    )
    plan = _ext._metal_plan(
        x,
        w,
        scales,
        global_scale,
        lhs_indices,
        rhs_indices,
        sorted_indices,
        mode,
        group_size,
        transpose,
        device,
        macos,
        kernel,
        True,
        True,
    )
    output_shape = plan["output_shape"]
    out_type = _NUMPY_TYPES[x.dtype]
    # NaN everywhere, so an output element the kernel never writes shows.
    nan = _NAN_BITS_BFLOAT16 if x.dtype == mx.bfloat16 else np.nan
    y = np.full(math.prod(output_shape), nan, dtype=out_type)
    counters: dict[str, Any] = {}
    if y.size > 0:
        operand_types = {
            "x": x.dtype,
            "w": mx.uint32,
            "scales": scales.dtype,
            "global_scale": mx.float32,
            "lhs_indices": mx.uint32,
            "rhs_indices": mx.uint32,
        }
        operands = {
            name: _buffer(data, operand_types[name]) for name, data in plan["operands"].items()
        }
        operands["y"] = y
        if plan["reduction"] is not None:
            # Split K's float32 partial sums, NaN until the kernel writes them.
            operands["partials"] = np.full(plan["partials_elements"], np.nan, np.float32)
        # The kernel, then split K's reduction: the same operands, each its slots.
        dispatches = [plan] if plan["reduction"] is None else [plan, plan["reduction"]]
        results = [
            library(d["library"])
            .dispatch(
                d["kernel"],
                buffers=_bind(d["buffers"], operands),
                grid=d["grid"],
                threadgroup=d["threadgroup"],
                threadgroup_memory=d.get("threadgroup_memory"),
                constants=d.get("constants"),
            )
            .counters
            for d in dispatches
        ]
        counters = results[0] if len(results) == 1 else _combined_counters(results)
    y = y.reshape(output_shape)
    if x.dtype == mx.bfloat16:
        y = np.array(mx.array(y).view(mx.bfloat16).astype(mx.float32))
    return MetalRun(y, plan, counters)


def metal_gather_qmm(
    x,
    w,
    scales,
    lhs_indices=None,
    rhs_indices=None,
    *,
    mode: str,
    transpose: bool = True,
    group_size: int | None = None,
    global_scale=None,
    sorted_indices: bool = False,
    device: str = "applegpu_g16s",
    kernel: str = "auto",
) -> np.ndarray:
    """``gather_qmm`` as mlx_fpqmm's Metal kernels compute it, simulated on the CPU.

    Args:
        x, w, scales, lhs_indices, rhs_indices, mode, transpose, group_size,
          global_scale, sorted_indices: as for :func:`mlx_fpqmm.gather_qmm` (NumPy or
          MLX arrays; at least one of the indices).
        device (str): the GPU architecture to plan for, e.g. ``"applegpu_g13s"``.
        kernel (str): ``"auto"`` (the plan's choice), or force ``"qmv"``, ``"mma"``
          or ``"nax"``.

    Returns:
        np.ndarray: the result, float32 or float16 as ``x`` (float32 for bfloat16 ``x``).
    """
    if lhs_indices is None and rhs_indices is None:
        raise ValueError("metal_gather_qmm needs lhs_indices or rhs_indices (or both).")
    return run_metal(
        x,
        w,
        scales,
        mode=mode,
        transpose=transpose,
        group_size=group_size,
        global_scale=global_scale,
        lhs_indices=lhs_indices,
        rhs_indices=rhs_indices,
        sorted_indices=sorted_indices,
        device=device,
        kernel=kernel,
    ).y


def metal_qmm(
    x,
    w,
    scales,
    *,
    mode: str,
    transpose: bool = True,
    group_size: int | None = None,
    global_scale=None,
    device: str = "applegpu_g16s",
    kernel: str = "auto",
) -> np.ndarray:
    """``quantized_matmul`` as mlx_fpqmm's Metal kernels compute it, simulated on the CPU.

    Args:
        x, w, scales, mode, transpose, group_size, global_scale: as for
          :func:`mlx_fpqmm.fp4_qmm` / :func:`mlx_fpqmm.fp8_qmm` (NumPy or MLX arrays).
        device (str): the GPU architecture to plan for, e.g. ``"applegpu_g13s"``.
        kernel (str): ``"auto"`` (the plan's choice), or force ``"qmv"``,
          ``"mma"`` or ``"nax"``; a forced kernel the plan cannot use raises.

    Returns:
        np.ndarray: the result, float32 or float16 as ``x`` (float32 for bfloat16 ``x``,
        holding the bfloat16 values exactly).
    """
    return run_metal(
        x,
        w,
        scales,
        mode=mode,
        transpose=transpose,
        group_size=group_size,
        global_scale=global_scale,
        device=device,
        kernel=kernel,
    ).y
