"""Run the project's Metal kernels on the CPU (see README.md in this directory)."""

from .library import DispatchResult, KernelError, Library, MetalCompileError
from .toolchain import CompilerNotFoundError

__all__ = ["CompilerNotFoundError", "DispatchResult", "KernelError", "Library", "MetalCompileError"]
