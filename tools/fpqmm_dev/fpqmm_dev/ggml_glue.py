"""ggml's CPU backend (the engine of llama.cpp) as a baseline for the benchmark.

``python -m mlx_fpqmm.bench --vs-ggml`` imports this module. ggml comes from the
``ggml-python`` package (the ``ggml`` extra of these development tools:
``pip install -e 'tools/fpqmm_dev[ggml]'``), which builds ggml's vendored
sources natively (``-march=native``, OpenMP, the CPU repack buffer type compiled
in) and binds its C API with ctypes.

Two ways of running ``ggml_mul_mat`` are offered:

- plain: the weights live in the CPU backend's ordinary buffer and the
  product runs ggml's ``vec_dot`` kernels row by row, as
  ``ggml_graph_compute_with_ctx`` does;
- repacked: the weights are allocated in the CPU backend's extra buffer
  type ``CPU_REPACK`` (reached through the CPU registry's
  ``ggml_backend_dev_get_extra_bufts``), which interleaves rows at load
  time for its gemv/gemm kernels, the way llama.cpp loads weights.

Either way ggml quantizes the float32 activations to 8 bits (q8_0) before
the dot products, so its results are inexact in the activations.
"""

from __future__ import annotations

import ctypes
import sys
from types import ModuleType

import numpy as np

INSTALL_HINT = "pip install -e 'tools/fpqmm_dev[ggml]' (builds ggml-python from source)"
GGML_TYPES = {"mxfp4": "GGML_TYPE_MXFP4", "nvfp4": "GGML_TYPE_NVFP4"}
"""Our modes that ggml has, with the name of ggml's type for each."""
ACTIVATION_BLOCK = 32  # q8_0: one float16 scale per 32 activations


_log_callback = None  # ggml's log callback, kept alive while ggml may call it


class GgmlUnavailable(RuntimeError):
    """ggml-python is missing, or cannot run the requested product."""


def load() -> ModuleType:
    """The ``ggml`` module of ggml-python, or GgmlUnavailable saying why not."""
    try:
        import ggml
    except (ImportError, OSError) as error:
        raise GgmlUnavailable(f"ggml-python is not importable ({error}); {INSTALL_HINT}") from None
    # PyPI's unrelated "ggml" package shares the import name.
    if not hasattr(ggml, "ggml_backend_cpu_init") or not hasattr(ggml, "GGML_TYPE_NVFP4"):
        raise GgmlUnavailable(f"the importable 'ggml' is not ggml-python 0.0.45; {INSTALL_HINT}")
    global _log_callback
    if _log_callback is None:
        # ggml logs every tensor it repacks; keep only its warnings and errors.
        def log(level: int, text: bytes, _: object) -> None:
            if level in (ggml.GGML_LOG_LEVEL_WARN, ggml.GGML_LOG_LEVEL_ERROR):
                sys.stderr.write(text.decode(errors="replace"))

        _log_callback = ggml.ggml_log_callback(log)
        ggml.ggml_log_set(_log_callback, None)
    return ggml


def ggml_type(ggml: ModuleType, mode: str) -> int:
    if mode not in GGML_TYPES:
        raise GgmlUnavailable(
            f"ggml has no type for mode '{mode}' (it has {', '.join(GGML_TYPES)})"
        )
    return getattr(ggml, GGML_TYPES[mode])


def quantize(weights: np.ndarray, mode: str) -> np.ndarray:
    """``weights`` (N x K float32) quantized by ggml's own quantizer, as raw row bytes."""
    ggml = load()
    kind = ggml_type(ggml, mode)
    N, K = weights.shape
    block = ggml.ggml_blck_size(kind)
    if K % block:
        raise GgmlUnavailable(f"ggml's {mode} needs K divisible by {block}; received K={K}")
    src = np.ascontiguousarray(weights, dtype=np.float32)
    out = np.empty((N, ggml.ggml_row_size(kind, K)), dtype=np.uint8)
    written = ggml.ggml_quantize_chunk(
        kind, src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data, 0, N, K, None
    )
    assert written == out.nbytes
    return out


def dequantize(quantized: np.ndarray, mode: str) -> np.ndarray:
    """ggml's own decoding of :func:`quantize`'s bytes (N x K float32)."""
    ggml = load()
    kind = ggml_type(ggml, mode)
    N = quantized.shape[0]
    K = quantized.shape[1] // ggml.ggml_type_size(kind) * ggml.ggml_blck_size(kind)
    out = np.empty((N, K), dtype=np.float32)
    to_float = ggml.ggml_get_type_traits(kind).contents.to_float
    src = np.ascontiguousarray(quantized)
    to_float(
        ctypes.c_void_p(src.ctypes.data), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), N * K
    )
    return out


def extra_buffer_types(ggml: ModuleType) -> dict[str, int]:
    """The CPU device's extra (repacking) buffer types by name, e.g. ``CPU_REPACK``."""
    device = ggml.ggml_backend_dev_by_type(ggml.GGML_BACKEND_DEVICE_TYPE_CPU)
    registry = ggml.ggml_backend_dev_backend_reg(device)
    address = ggml.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return {}
    get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
    listed = get(device)
    found = {}
    i = 0
    while listed[i]:
        found[ggml.ggml_backend_buft_name(listed[i]).decode()] = listed[i]
        i += 1
    return found


class GgmlMatmul:
    """``x @ W.T`` by ggml's CPU backend for a fixed shape, timed by :meth:`run`.

    ``weights`` is an N x K float32 matrix that ggml quantizes itself to
    ``mode``; ``copies`` copies of it are loaded (one graph each) so that a
    caller can cycle through more weight bytes than the last-level cache.
    With ``repack`` the weights go to the ``CPU_REPACK`` buffer type;
    GgmlUnavailable is raised when ggml's repacking has no layout for this
    type and shape on this CPU (it then runs the plain kernels only).
    """

    def __init__(
        self,
        weights: np.ndarray,
        mode: str,
        rows: int,
        threads: int,
        repack: bool = False,
        copies: int = 1,
        quantized: np.ndarray | None = None,
    ) -> None:
        ggml = self.ggml = load()
        kind = ggml_type(ggml, mode)
        N, K = weights.shape
        self.quantized = quantize(weights, mode) if quantized is None else quantized
        self.shape = (rows, N, K)
        self.copies = copies
        self.contexts: list = []
        self.buffers: list = []
        self.backend = ggml.ggml_backend_cpu_init()
        ggml.ggml_backend_cpu_set_n_threads(self.backend, threads)
        device = ggml.ggml_backend_dev_by_type(ggml.GGML_BACKEND_DEVICE_TYPE_CPU)
        if repack:
            buffer_type = extra_buffer_types(ggml).get("CPU_REPACK")
            if buffer_type is None:
                self.close()
                raise GgmlUnavailable("this ggml build has no CPU_REPACK buffer type")
        else:
            buffer_type = ggml.ggml_backend_dev_buffer_type(device)
        w_ctx = self._context(copies)
        self.w = [ggml.ggml_new_tensor_2d(w_ctx, kind, K, N) for _ in range(copies)]
        self._allocate(ggml.ggml_backend_alloc_ctx_tensors_from_buft(w_ctx, buffer_type))
        x_ctx = self._context(1 + 2 * copies, graphs=copies)
        self.x = ggml.ggml_new_tensor_2d(x_ctx, ggml.GGML_TYPE_F32, K, rows)
        self.out = [ggml.ggml_mul_mat(x_ctx, w, self.x) for w in self.w]
        # As llama.cpp does: the device decides from the weights' buffer type
        # whether the (repacked) kernels take this product.
        if not ggml.ggml_backend_dev_supports_op(device, self.out[0]):
            self.close()
            raise GgmlUnavailable(
                f"ggml's {'repacked ' if repack else ''}CPU kernels do not take {mode} "
                f"{N}x{K} on this CPU"
            )
        self.graphs = []
        for out in self.out:
            graph = ggml.ggml_new_graph(x_ctx)
            ggml.ggml_build_forward_expand(graph, out)
            self.graphs.append(graph)
        self._allocate(ggml.ggml_backend_alloc_ctx_tensors(x_ctx, self.backend))
        # Repacking happens here, in tensor_set: load time, not timed.
        for w in self.w:
            ggml.ggml_backend_tensor_set(w, self.quantized.ctypes.data, 0, self.quantized.nbytes)

    def _context(self, tensors: int, graphs: int = 0):
        ggml = self.ggml
        size = ggml.ggml_tensor_overhead() * tensors + ggml.ggml_graph_overhead() * graphs
        params = ggml.ggml_init_params(mem_size=size, mem_buffer=None, no_alloc=True)
        context = ggml.ggml_init(params)
        self.contexts.append(context)
        return context

    def _allocate(self, buffer) -> None:
        if not buffer:
            self.close()
            raise GgmlUnavailable("ggml could not allocate its buffers")
        self.buffers.append(buffer)

    def set_x(self, x: np.ndarray) -> None:
        """Load the activations (M x K; ggml reads them as float32)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape != (self.shape[0], self.shape[2]):
            raise ValueError(f"x: expected shape {self.shape[0::2]}, received {x.shape}")
        self.ggml.ggml_backend_tensor_set(self.x, x.ctypes.data, 0, x.nbytes)

    def run(self, i: int = 0) -> None:
        """Compute the product with weight copy ``i`` (modulo the copies)."""
        self.ggml.ggml_backend_graph_compute(self.backend, self.graphs[i % self.copies])

    def output(self, i: int = 0) -> np.ndarray:
        """The M x N result of the last :meth:`run` with copy ``i``."""
        M, N, _ = self.shape
        y = np.empty((M, N), dtype=np.float32)
        self.ggml.ggml_backend_tensor_get(self.out[i % self.copies], y.ctypes.data, 0, y.nbytes)
        return y

    def close(self) -> None:
        ggml = self.ggml
        for buffer in self.buffers:
            ggml.ggml_backend_buffer_free(buffer)
        for context in self.contexts:
            ggml.ggml_free(context)
        if self.backend:
            ggml.ggml_backend_free(self.backend)
        self.buffers, self.contexts, self.backend = [], [], None

    def __enter__(self) -> GgmlMatmul:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
