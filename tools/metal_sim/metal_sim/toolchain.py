"""Compilers and the build cache of the Metal simulator.

Kernels are compiled by clang (the `ziglang` wheel's `zig c++`) because only
clang has address spaces and load/store instrumentation; the runtime is
compiled and everything is linked by the system g++, so zig never needs to
build its own C++ standard library.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SHIM_INCLUDE = PACKAGE_DIR / "shim" / "include"
RUNTIME_DIR = PACKAGE_DIR / "runtime"
CACHE_ENV = "METAL_SIM_CACHE_DIR"

# Metal's predefined macros, as Apple's compiler sets them at -std=metal4.0.
METAL_DEFINES = {
    "__METAL__": "1",
    "__METAL_VERSION__": "400",
    "__METAL_MACOS__": "1",
    "__HAVE_BFLOAT__": "1",
    "__HAVE_TENSOR__": "1",
}

# Kernels are compiled for a fixed CPU, not the host's, so cached objects are
# right on any x86-64 machine and no AVX-512 gathers or masked accesses (which
# the tracing would have to understand) appear.
TARGET_FLAGS = ["-mcpu=baseline"]
KERNEL_FLAGS = [
    *TARGET_FLAGS,
    "-std=c++23",  # explicit object parameters (MSIM_CROSS_SPACE_ASSIGNMENT)
    "-O1",
    "-gline-tables-only",
    "-fno-exceptions",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    # Round every half/bfloat operation, as the GPU does.
    "-Xclang",
    "-ffloat16-excess-precision=none",
    "-Xclang",
    "-fbfloat16-excess-precision=none",
    "-fsanitize=shift-exponent,integer-divide-by-zero",
    "-fno-sanitize-recover=all",
    "-Wno-unknown-attributes",
    "-Wno-duplicate-decl-specifier",  # `const constant T`: constant implies const
    "-Wno-unknown-pragmas",
    "-Wno-unused-command-line-argument",
]
# Compiling the instrumented IR: machine code only, no further IR passes
# (they could merge or move the traced accesses).
CODEGEN_FLAGS = [
    *TARGET_FLAGS,
    "-O1",
    "-Xclang",
    "-disable-llvm-passes",
    "-Wno-unused-command-line-argument",
]
INSTRUMENT_PY = PACKAGE_DIR / "instrument.py"
RUNTIME_FLAGS = ["-std=c++20", "-O2", "-g", "-Wall", "-Wextra"]
LINK_FLAGS = ["-no-pie", "-lm"]


class CompilerNotFoundError(RuntimeError):
    """The simulator's compilers are not installed."""


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mlx_fpqmm_metal_sim"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:32]


@cache
def clang() -> list[str]:
    if importlib.util.find_spec("ziglang") is None:
        raise CompilerNotFoundError(
            "the Metal simulator needs clang from the `ziglang` package: pip install ziglang"
        )
    return [sys.executable, "-m", "ziglang", "c++"]


@cache
def gxx() -> str:
    path = shutil.which("g++")
    if path is None:
        raise CompilerNotFoundError("the Metal simulator needs g++ (e.g. apt-get install g++)")
    return path


@cache
def addr2line() -> str:
    path = shutil.which("addr2line")
    if path is None:
        raise CompilerNotFoundError(
            "the Metal simulator needs addr2line (binutils) to locate errors"
        )
    return path


def clang_env() -> dict[str, str]:
    zig_cache = str(cache_dir() / "zig")
    return {**os.environ, "ZIG_GLOBAL_CACHE_DIR": zig_cache, "ZIG_LOCAL_CACHE_DIR": zig_cache}


@cache
def clang_version() -> str:
    out = subprocess.run(
        [*clang(), "--version"], capture_output=True, text=True, env=clang_env(), check=True
    )
    return out.stdout


def run_compiler(
    command: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, env=env)


def cached_build(key: str, suffix: str, build: Callable[[Path], None]) -> Path:
    """Returns the cached artifact for `key`, building it on a miss (atomically)."""
    target = cache_dir() / f"{key}{suffix}"
    if not target.exists():
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        build(partial)
        partial.replace(target)
    return target


# The runtime's files, compiled by g++ (runtime.h lists what each holds).
RUNTIME_SOURCES = ("io.cpp", "memory.cpp", "fibers.cpp", "signals.cpp", "dispatch.cpp")
RUNTIME_HEADERS = (RUNTIME_DIR / "runtime.h", SHIM_INCLUDE / "msim" / "runtime_api.h")


@cache
def runtime_objects() -> tuple[Path, ...]:
    """The runtime (g++) and the bfloat conversion helpers (clang), cached."""
    headers = [header.read_bytes() for header in RUNTIME_HEADERS]

    def runtime_object(name: str) -> Path:
        source = RUNTIME_DIR / name
        key = digest("runtime", name, source.read_bytes(), *headers, *RUNTIME_FLAGS)

        def build(output: Path) -> None:
            command = [
                gxx(),
                *RUNTIME_FLAGS,
                f"-I{SHIM_INCLUDE}",
                "-c",
                str(source),
                "-o",
                str(output),
            ]
            check(run_compiler(command))

        return cached_build(key, ".o", build)

    bfloat_src = RUNTIME_DIR / "bfloat_conversions.cpp"
    bfloat_key = digest("bfloat", bfloat_src.read_bytes(), clang_version())

    def build_bfloat(output: Path) -> None:
        command = [*clang(), "-O2", "-c", str(bfloat_src), "-o", str(output)]
        check(run_compiler(command, clang_env()))

    return (
        *(runtime_object(name) for name in RUNTIME_SOURCES),
        cached_build(bfloat_key, ".o", build_bfloat),
    )


def check(result: subprocess.CompletedProcess[str]) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"simulator build step failed:\n{result.stderr}")
