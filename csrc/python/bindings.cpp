// Python bindings of the ops (module mlx_fpqmm._ext).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "backend/cpu/in_flight.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cuda/device.h"
#include "ops/ops.h"
#include "ops/qmm.h"
#include "python/kernel_path.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

nb::list format_table() {
  nb::list table;
  for (const auto& format : mlx_fpqmm::kFormats) {
    nb::list group_sizes;
    for (int size : format.group_sizes) {
      group_sizes.append(size);
    }
    nb::dict entry;
    entry["mode"] = std::string(format.name);
    entry["codes"] =
        format.codes == mlx_fpqmm::CodeKind::e2m1 ? "e2m1" : "e4m3";
    entry["bits"] = format.bits;
    entry["default_group_size"] = format.default_group_size;
    entry["group_sizes"] = nb::tuple(group_sizes);
    entry["scales"] = format.scales == mlx_fpqmm::ScaleKind::e8m0   ? "e8m0"
                      : format.scales == mlx_fpqmm::ScaleKind::e4m3 ? "e4m3"
                                                                    : "float";
    entry["code_max"] = format.code_max;
    entry["bf16_exact"] = format.bf16_exact;
    table.append(entry);
  }
  return table;
}

}  // namespace

NB_MODULE(_ext, m) {
  // MLX's types must be registered before signatures name them.
  nb::module_::import_("mlx.core");
  m.doc() = "fp4 / fp8 quantized matrix multiplication for MLX";

  m.def("formats", &format_table, "The format table: one dict per mode.");
  m.def(
      "_cpu_threads",
      &mlx_fpqmm::cpu::num_threads,
      "The threads the CPU kernels run on (MLX_FPQMM_NUM_THREADS, else every "
      "core; starts their pool).");
  m.def(
      "_cpu_tasks_in_flight",
      &mlx_fpqmm::cpu::tasks_in_flight,
      "Our CPU tasks queued or running on MLX's streams.");
  m.def(
      "_wait_for_cpu_tasks",
      &mlx_fpqmm::cpu::wait_for_tasks,
      "patience_ms"_a,
      nb::call_guard<nb::gil_scoped_release>(),
      "Waits until no CPU task of ours is in flight, or none has finished "
      "for patience_ms (the interpreter's exit).");
  m.def(
      "_cuda_device_bytes",
      &mlx_fpqmm::cuda::device_bytes_in_use,
      "Device memory held by the outputs of our CUDA primitives (bytes).");
  mlx_fpqmm::metal::register_metal_bindings(m);

  m.def(
      "fp4_qmm",
      &mlx_fpqmm::fp4_qmm,
      nb::arg(),
      nb::arg(),
      "scales"_a,
      "transpose"_a = true,
      "group_size"_a = nb::none(),
      "mode"_a = "mxfp4",
      nb::kw_only(),
      "global_scale"_a = nb::none(),
      "stream"_a = nb::none(),
      nb::sig(
          "def fp4_qmm(x: mlx.core.array, w: mlx.core.array, /, scales: "
          "mlx.core.array, "
          "transpose: bool = True, group_size: typing.Optional[int] = None, "
          "mode: str = 'mxfp4', *, global_scale: "
          "typing.Optional[mlx.core.array] = None, "
          "stream: typing.Union[None, mlx.core.Stream, mlx.core.Device] = "
          "None) -> mlx.core.array"),
      R"pbdoc(
        Multiply ``x`` with an fp4 (E2M1) quantized matrix ``w``.

        Computes ``x @ dequantize(w).T`` (or ``x @ dequantize(w)`` when
        ``transpose`` is ``False``) without materialising the dequantized
        matrix. The result has the dtype of ``x``.

        Args:
            x (array): Input of float32, float16 or bfloat16 with any number
              of leading dimensions.
            w (array): Packed uint32 codes, 8 per word, as produced by
              :func:`quantize` or ``mx.quantize``.
            scales (array): One scale per group: uint8 E8M0 (``mxfp4``),
              uint8 E4M3 (``nvfp4``) or a float dtype (``fp4``).
            transpose (bool, optional): Multiply with the transpose of ``w``.
              Default: ``True``.
            group_size (int, optional): Elements per scale. Default: the
              mode's (32 for ``mxfp4`` and ``fp4``, 16 for ``nvfp4``).
            mode (str, optional): ``"mxfp4"``, ``"nvfp4"`` or ``"fp4"``.
              Default: ``"mxfp4"``.
            global_scale (array, optional): ``nvfp4`` only: the float32 tensor
              scale used at quantization; the result is multiplied by
              ``global_scale / 2688`` as ``mx.dequantize`` does.
            stream (Stream, optional): Stream or device to run on.

        Returns:
            array: ``x.shape[:-1] + (N,)``.
      )pbdoc");

  m.def(
      "fp8_qmm",
      &mlx_fpqmm::fp8_qmm,
      nb::arg(),
      nb::arg(),
      "scales"_a,
      "transpose"_a = true,
      "group_size"_a = nb::none(),
      "mode"_a = "mxfp8",
      nb::kw_only(),
      "stream"_a = nb::none(),
      nb::sig(
          "def fp8_qmm(x: mlx.core.array, w: mlx.core.array, /, scales: "
          "mlx.core.array, "
          "transpose: bool = True, group_size: typing.Optional[int] = None, "
          "mode: str = 'mxfp8', *, "
          "stream: typing.Union[None, mlx.core.Stream, mlx.core.Device] = "
          "None) -> mlx.core.array"),
      R"pbdoc(
        Multiply ``x`` with an fp8 (E4M3) quantized matrix ``w``.

        Computes ``x @ dequantize(w).T`` (or ``x @ dequantize(w)`` when
        ``transpose`` is ``False``). The result has the dtype of ``x``.

        Args:
            x (array): Input of float32, float16 or bfloat16.
            w (array): Packed uint32 codes, 4 per word.
            scales (array): One scale per group: uint8 E8M0 (``mxfp8``) or a
              float dtype (``fp8``).
            transpose (bool, optional): Multiply with the transpose of ``w``.
              Default: ``True``.
            group_size (int, optional): Elements per scale. Default: 32.
            mode (str, optional): ``"mxfp8"`` or ``"fp8"``. Default:
              ``"mxfp8"``.
            stream (Stream, optional): Stream or device to run on.

        Returns:
            array: ``x.shape[:-1] + (N,)``.
      )pbdoc");

  m.def(
      "quantized_matmul",
      &mlx_fpqmm::quantized_matmul,
      nb::arg(),
      nb::arg(),
      "scales"_a,
      "biases"_a = nb::none(),
      "transpose"_a = true,
      "group_size"_a = nb::none(),
      "bits"_a = nb::none(),
      "mode"_a = "affine",
      nb::kw_only(),
      "stream"_a = nb::none(),
      nb::sig(
          "def quantized_matmul(x: mlx.core.array, w: mlx.core.array, /, "
          "scales: mlx.core.array, "
          "biases: typing.Optional[mlx.core.array] = None, transpose: bool = "
          "True, "
          "group_size: typing.Optional[int] = None, bits: typing.Optional[int] "
          "= None, "
          "mode: str = 'affine', *, "
          "stream: typing.Union[None, mlx.core.Stream, mlx.core.Device] = "
          "None) -> mlx.core.array"),
      R"pbdoc(
        Drop-in replacement for ``mx.quantized_matmul``.

        The fp modes (``mxfp4``, ``nvfp4``, ``mxfp8``, ``fp4``, ``fp8``) run
        on mlx_fpqmm's kernels; ``affine`` is passed to MLX unchanged. One
        difference from MLX: a 2-D ``x`` against a batch of weight matrices
        is multiplied with every matrix (matmul broadcasting), where
        ``mx.quantized_matmul`` uses the first matrix only.
      )pbdoc");

  m.def(
      "gather_qmm",
      &mlx_fpqmm::gather_qmm,
      nb::arg(),
      nb::arg(),
      "scales"_a,
      "biases"_a = nb::none(),
      "lhs_indices"_a = nb::none(),
      "rhs_indices"_a = nb::none(),
      "transpose"_a = true,
      "group_size"_a = nb::none(),
      "bits"_a = nb::none(),
      "mode"_a = "affine",
      "global_scale"_a = nb::none(),
      nb::kw_only(),
      "sorted_indices"_a = false,
      "stream"_a = nb::none(),
      nb::sig(
          "def gather_qmm(x: mlx.core.array, w: mlx.core.array, /, "
          "scales: mlx.core.array, "
          "biases: typing.Optional[mlx.core.array] = None, "
          "lhs_indices: typing.Optional[mlx.core.array] = None, "
          "rhs_indices: typing.Optional[mlx.core.array] = None, "
          "transpose: bool = True, group_size: typing.Optional[int] = None, "
          "bits: typing.Optional[int] = None, mode: str = 'affine', "
          "global_scale: typing.Optional[mlx.core.array] = None, *, "
          "sorted_indices: bool = False, "
          "stream: typing.Union[None, mlx.core.Stream, mlx.core.Device] = "
          "None) -> mlx.core.array"),
      R"pbdoc(
        Drop-in replacement for ``mx.gather_qmm``: quantized matmul with
        matrix-level gather (the mixture-of-experts product).

        For each index pair, ``x[lhs_indices] @ dequantize(w[rhs_indices]).T``
        (without ``.T`` when ``transpose`` is ``False``). The indices are
        cast to uint32 and broadcast together; a missing one is an arange
        over the batch of ``x`` or ``w``; with neither this is
        :func:`quantized_matmul`. The result has shape
        ``broadcast(lhs_indices, rhs_indices).shape + (M, N)`` and ``x``'s
        dtype. The fp modes run on mlx_fpqmm's kernels, ``affine`` on
        MLX's. Beyond MLX: ``global_scale`` (one per expert, nvfp4) works
        on the CPU too, ``transpose=False`` is supported, and
        ``sorted_indices`` is only a speed hint (unsorted indices still
        give right results). A pair whose index is out of range gets NaN
        rows.

        Args:
            x (array): Input of float32, float16 or bfloat16, ``(..., M, K)``.
            w (array): Packed codes ``(..., N, K * bits / 32)``: one matrix
              per expert.
            scales (array): Their group scales.
            biases (array, optional): Must be ``None`` in fp modes.
            lhs_indices (array, optional): Integer indices into the batch of
              ``x``.
            rhs_indices (array, optional): Integer indices into the batch of
              ``w`` (the experts).
            transpose (bool, optional): Multiply with the transpose of each
              matrix. Default: ``True``.
            group_size (int, optional): Default: the mode's.
            bits (int, optional): Checked against the mode when given.
            mode (str, optional): Default: ``"affine"``.
            global_scale (array, optional): ``nvfp4`` only: float32, one value
              per expert (``w``'s batch shape) or one for all.
            sorted_indices (bool, optional): ``rhs_indices`` are sorted.

        Returns:
            array: The products, one ``(M, N)`` matrix per index pair.
      )pbdoc");

  m.def(
      "quantize",
      &mlx_fpqmm::quantize,
      nb::arg(),
      "group_size"_a = nb::none(),
      "bits"_a = nb::none(),
      "mode"_a = "affine",
      nb::kw_only(),
      "global_scale"_a = nb::none(),
      "stream"_a = nb::none(),
      nb::sig(
          "def quantize(w: mlx.core.array, /, group_size: typing.Optional[int] "
          "= None, bits: typing.Optional[int] = None, mode: str = 'affine', *, "
          "global_scale: typing.Optional[mlx.core.array] = None, "
          "stream: typing.Union[None, mlx.core.Stream, mlx.core.Device] = "
          "None) -> list[mlx.core.array]"),
      R"pbdoc(
        Drop-in replacement for ``mx.quantize``: quantize ``w`` along its
        last axis.

        MLX's modes (``affine``, ``mxfp4``, ``nvfp4``, ``mxfp8``) are
        ``mx.quantize``. For ``fp4`` and ``fp8`` each group's scale is
        ``max|w| / 6`` (fp4) or ``max|w| / 448`` (fp8) in ``w``'s dtype and
        ``w / scale`` is rounded to the nearest code, ties to even; a group
        holding a non-finite value dequantizes to NaN.

        Args:
            w (array): The float matrix to quantize along its last axis.
            group_size (int, optional): Elements per scale. Default: the
              mode's.
            bits (int, optional): Bits per element. In the fp modes it is
              the mode's (4 or 8) and may only be given as that. Default:
              the mode's.
            mode (str, optional): ``"affine"``, ``"mxfp4"``, ``"nvfp4"``,
              ``"mxfp8"``, ``"fp4"`` or ``"fp8"``. Default: ``"affine"``.
            global_scale (array, optional): ``nvfp4`` only: a float32 tensor
              scale, conventionally ``max|w|``; pass the same value to
              :func:`dequantize` and :func:`fp4_qmm`.

        Returns:
            list(array): ``[w_q, scales]`` (``affine``: ``[w_q, scales,
            biases]``).
      )pbdoc");

  m.def(
      "dequantize",
      &mlx_fpqmm::dequantize,
      nb::arg(),
      "scales"_a,
      "biases"_a = nb::none(),
      "group_size"_a = nb::none(),
      "bits"_a = nb::none(),
      "mode"_a = "affine",
      "global_scale"_a = nb::none(),
      "dtype"_a = nb::none(),
      nb::kw_only(),
      "stream"_a = nb::none(),
      nb::sig(
          "def dequantize(w: mlx.core.array, /, scales: mlx.core.array, "
          "biases: typing.Optional[mlx.core.array] = None, "
          "group_size: typing.Optional[int] = None, "
          "bits: typing.Optional[int] = None, mode: str = 'affine', "
          "global_scale: typing.Optional[mlx.core.array] = None, "
          "dtype: typing.Optional[mlx.core.Dtype] = None, *, "
          "stream: typing.Union[None, mlx.core.Stream, mlx.core.Device] = "
          "None) -> mlx.core.array"),
      R"pbdoc(
        Drop-in replacement for ``mx.dequantize``: the inverse of
        :func:`quantize`.

        MLX's modes are ``mx.dequantize`` (default dtype bfloat16 in the fp
        modes); for ``fp4`` and ``fp8`` the default dtype is that of
        ``scales``. In the fp modes ``biases`` must be ``None`` and
        ``bits``, when given, the mode's.

        Args:
            w (array): The packed codes.
            scales (array): Their group scales.
            biases (array, optional): ``affine`` only. Default: ``None``.
            group_size (int, optional): Default: the mode's.
            bits (int, optional): Default: the mode's.
            mode (str, optional): As for :func:`quantize`. Default:
              ``"affine"``.
            global_scale (array, optional): ``nvfp4`` only: the tensor scale
              given to :func:`quantize`.
            dtype (Dtype, optional): The result's dtype.

        Returns:
            array: The dequantized ``w``.
      )pbdoc");

  m.def(
      "_set_dequantize_on_cpu",
      &mlx_fpqmm::set_dequantize_on_cpu,
      "on"_a,
      "Tests: build dequantize + matmul on CPU streams (this thread).");
}
