"""Library: compile .metal sources for the simulator and dispatch kernels."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import conformance, toolchain
from .instrument import InstrumentError, instrument
from .rewrite import RewriteError, TranslationUnit

BufferValue = np.ndarray | np.generic | bytes
ALIGNMENT = 64
DEFAULT_TIMEOUT = 120.0
SYMBOLIZE_LOOKBACK = 48  # bytes of code searched backwards for a line number


class KernelError(Exception):
    """A bug the simulator detected while running a kernel; names file:line."""


class MetalCompileError(Exception):
    """A .metal source did not compile (message holds clang's diagnostics)."""


@dataclass(frozen=True)
class DispatchResult:
    counters: dict[str, Any]


def _constant_text(value: bool | int | float | np.generic) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    raise TypeError(
        f"function constant values must be bool, int or float, not {type(value).__name__}"
    )


def _buffer_bytes(index: int, value: BufferValue) -> tuple[bool, memoryview]:
    """(is set_bytes, contents) of one binding."""
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise ValueError(f"buffer {index}: device buffers must be C-contiguous arrays")
        return False, memoryview(value.reshape(-1).view(np.uint8))
    if isinstance(value, np.generic):
        return True, memoryview(value.tobytes())
    if isinstance(value, (bytes, bytearray)):
        return True, memoryview(bytes(value))
    raise TypeError(
        f"buffer {index}: pass a NumPy array (device buffer), a NumPy scalar or bytes (set_bytes), "
        f"not {type(value).__name__}"
    )


class Library:
    """The kernels instantiated in `sources`, compiled for the CPU simulator."""

    def __init__(
        self,
        sources: Sequence[str | os.PathLike[str]],
        include_dirs: Sequence[str | os.PathLike[str]] = (),
        defines: Mapping[str, str | int] | None = None,
        metal_version: str = "3.1",
    ) -> None:
        self.sources = [Path(s).resolve() for s in sources]
        self.include_dirs = [Path(d).resolve() for d in include_dirs]
        self.metal_version = metal_version
        self.defines = {
            **toolchain.METAL_DEFINES,
            "__METAL_VERSION__": conformance.language(metal_version)[2],
            **{k: str(v) for k, v in (defines or {}).items()},
        }
        units = [self._translate(source) for source in self.sources]
        self.names: list[str] = [name for unit in units for name in unit.kernels]
        objects = [
            self._compile(source, unit) for source, unit in zip(self.sources, units, strict=True)
        ]
        self.executable = self._link([*objects, *toolchain.runtime_objects()])

    def _translate(self, source: Path) -> TranslationUnit:
        command = [
            *toolchain.clang(),
            "-E",
            "-x",
            "c++",
            "-std=c++23",
            f"-isystem{toolchain.SHIM_INCLUDE}",
            *(f"-I{d}" for d in self.include_dirs),
            *(f"-D{k}={v}" for k, v in self.defines.items()),
            str(source),
        ]
        result = toolchain.run_compiler(command, toolchain.clang_env())
        if result.returncode != 0:
            raise MetalCompileError(f"{source}: preprocessing failed:\n{result.stderr}")
        try:
            unit = TranslationUnit(result.stdout)
        except RewriteError as error:
            raise MetalCompileError(f"{source}: {error}") from error
        problems = conformance.check(unit.text, result.stdout, self.metal_version)
        if problems:
            raise MetalCompileError(
                f"{source} is not Metal {self.metal_version}:\n" + "\n".join(problems)
            )
        return unit

    def _compile(self, source: Path, unit: TranslationUnit) -> Path:
        """Source -> optimised IR -> traced IR (instrument.py) -> object."""
        flags = [
            *toolchain.KERNEL_FLAGS,
            f"-isystem{toolchain.SHIM_INCLUDE}",
            "-include",
            "msim/address_spaces.h",
        ]
        address_spaces = (toolchain.SHIM_INCLUDE / "msim" / "address_spaces.h").read_bytes()
        key = toolchain.digest(
            "kernels",
            unit.text,
            address_spaces,
            *flags,
            *toolchain.CODEGEN_FLAGS,
            toolchain.INSTRUMENT_PY.read_bytes(),
            toolchain.clang_version(),
        )

        def build(output: Path) -> None:
            rewritten = output.with_suffix(".cpp")
            ir = output.with_suffix(".ll")
            rewritten.write_text(unit.text)
            command = [*toolchain.clang(), *flags, "-x", "c++", "-S", "-emit-llvm"]
            result = toolchain.run_compiler(
                [*command, str(rewritten), "-o", str(ir)], toolchain.clang_env()
            )
            rewritten.unlink()
            if result.returncode != 0:
                raise MetalCompileError(
                    f"{source} does not compile for the simulator:\n{result.stderr}"
                )
            try:
                ir.write_text(instrument(ir.read_text(), str(toolchain.SHIM_INCLUDE)))
            except InstrumentError as error:
                raise MetalCompileError(f"{source}: {error}") from error
            command = [*toolchain.clang(), *toolchain.CODEGEN_FLAGS, "-c", str(ir)]
            result = toolchain.run_compiler([*command, "-o", str(output)], toolchain.clang_env())
            ir.unlink()
            toolchain.check(result)

        return toolchain.cached_build(key, ".o", build)

    def _link(self, objects: list[Path]) -> Path:
        key = toolchain.digest("executable", *(o.name for o in objects), *toolchain.LINK_FLAGS)

        def build(output: Path) -> None:
            command = [
                toolchain.gxx(),
                *map(str, objects),
                "-o",
                str(output),
                *toolchain.LINK_FLAGS,
            ]
            toolchain.check(toolchain.run_compiler(command))

        return toolchain.cached_build(key, "", build)

    def dispatch(
        self,
        name: str,
        buffers: Mapping[int, BufferValue],
        grid: tuple[int, int, int] | None = None,
        threadgroup: tuple[int, int, int] = (1, 1, 1),
        threadgroup_memory: Mapping[int, int] | None = None,
        constants: Mapping[int, bool | int | float | np.generic] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        threads: tuple[int, int, int] | None = None,
    ) -> DispatchResult:
        """Runs `name` over `grid` threadgroups of `threadgroup` threads
        (dispatch_threadgroups), or over `threads` threads in threadgroups of at
        most `threadgroup` (dispatch_threads: the threadgroups at the grid's far
        edges are smaller).

        NumPy arrays are device buffers and receive the kernel's writes;
        NumPy scalars and bytes are set_bytes values (read-only).
        """
        if name not in self.names:
            raise KeyError(f"no kernel {name!r}; the library has {self.names}")
        if (grid is None) == (threads is None):
            raise ValueError("dispatch takes either grid (threadgroups) or threads")
        bindings = {index: _buffer_bytes(index, value) for index, value in sorted(buffers.items())}
        offsets, total = {}, 0
        for index, (_, contents) in bindings.items():
            offsets[index] = total
            total += (contents.nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        request = [
            f"kernel {name}",
            "grid {} {} {}".format(*grid) if grid else "threads {} {} {}".format(*threads),
            "threadgroup {} {} {}".format(*threadgroup),
        ]
        for index, (is_bytes, contents) in bindings.items():
            kind = "bytes" if is_bytes else "device"
            request.append(f"buffer {index} {kind} {offsets[index]} {contents.nbytes}")
        request += [f"threadgroup_memory {i} {n}" for i, n in (threadgroup_memory or {}).items()]
        request += [f"constant {i} {_constant_text(v)}" for i, v in (constants or {}).items()]

        shm = Path("/dev/shm")
        with tempfile.NamedTemporaryFile(
            dir=shm if shm.is_dir() else None, prefix="metal_sim_"
        ) as data:
            data.truncate(max(total, 1))
            with mmap.mmap(data.fileno(), max(total, 1)) as view:
                for index, (_, contents) in bindings.items():
                    view[offsets[index] : offsets[index] + contents.nbytes] = contents
                report = self._run("\n".join([*request, f"data {data.name}", ""]), timeout)
                for index, (is_bytes, contents) in bindings.items():
                    if not is_bytes:
                        contents[:] = view[offsets[index] : offsets[index] + contents.nbytes]
        return DispatchResult(report["counters"])

    def _run(self, request: str, timeout: float) -> dict[str, Any]:
        try:
            result = subprocess.run(
                [str(self.executable)],
                input=request,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as error:
            raise KernelError(
                f"dispatch timed out after {timeout} s: does a thread spin on memory that "
                "the rest of its threadgroup only writes after a barrier (deadlock)?"
            ) from error
        lines = result.stdout.strip().splitlines()
        if not lines:
            raise KernelError(
                f"simulator died without a report (exit {result.returncode}):\n{result.stderr}"
            )
        report = json.loads(lines[-1])
        if report["status"] != "ok":
            raise KernelError(self._describe(report))
        counters = report["counters"]
        counters["buffers"] = {int(k): v for k, v in counters["buffers"].items()}
        return report

    def _describe(self, report: dict[str, Any]) -> str:
        location = f"{report['file']}:{report['line']}" if "file" in report else None
        if "pc" in report:
            location = self._symbolize(report["pc"])
        return f"{location}: {report['message']}" if location else report["message"]

    def _symbolize(self, pc: int) -> str:
        """file:line of `pc`, skipping frames inlined from the shim and libc++.

        Accesses the optimizer merged (two adjacent stores become one) carry
        line 0; the nearest preceding instruction with a line stands in.
        """
        addresses = [hex(pc - back) for back in range(SYMBOLIZE_LOOKBACK)]
        result = subprocess.run(
            [toolchain.addr2line(), "-i", "-a", "-e", str(self.executable), *addresses],
            capture_output=True,
            text=True,
        )
        shim = str(toolchain.SHIM_INCLUDE)
        for block in result.stdout.split("0x")[1:]:
            frames = [line.split(" (discriminator")[0] for line in block.splitlines()[1:]]
            user = [f for f in frames if not f.startswith(shim) and "/libcxx/" not in f]
            if user and not user[0].endswith((":?", ":0")):
                return user[0]
        return "<unknown location>"
