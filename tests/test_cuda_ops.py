"""The ops on an NVIDIA GPU (MLX's CUDA backend) against the float64 reference
of mx.dequantize and against our CPU path: every mode, dtype and orientation,
odd shapes, batches and broadcasts, nvfp4's global scale, the gather product
with random, sorted and out-of-range indices, empty shapes, large weights, bad
input and memory over many calls; for many rows the dequantize + matmul and
dequantize + gather_mm graphs, and each path forced. Skipped where MLX sees no
CUDA GPU."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from reference import (
    ALL_MODES,
    DEFAULT_GROUP_SIZE,
    TOLERANCE,
    gather_reference,
    graph_nodes,
    qmm_reference,
    quantized_experts,
    relative_error,
)

import mlx_fpqmm
from mlx_fpqmm import _ext

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not mx.cuda.is_available(), reason="no CUDA GPU: MLX's CUDA build sees none"
    ),
]

GPU = mx.gpu
DTYPES = (mx.float32, mx.float16, mx.bfloat16)
DTYPE_NAMES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}


def quantized(mode, rows, cols, dtype=mx.float32):
    w = mx.random.normal((rows, cols)).astype(dtype)
    return mlx_fpqmm.quantize(w, mode=mode)


def product(mode, x, w_q, scales, stream, **kwargs):
    return mlx_fpqmm.qmm_for_mode(mode)(x, w_q, scales, mode=mode, stream=stream, **kwargs)


# Float32 x that the plan multiplies by dequantize + matmul (past kSimpleRows
# rows, or past the float32 parts' rows) goes through MLX's float32 matmul, which
# on CUDA multiplies in TF32 (10 mantissa bits) unless MLX_ENABLE_TF32=0: MLX's
# rule, so the bound is two TF32 roundings per product term.
TF32_TOLERANCE = 2e-3


def tf32_enabled():
    """MLX_ENABLE_TF32 as MLX (and our plans) read it: on unless set to something
    other than a nonzero number."""
    value = os.environ.get("MLX_ENABLE_TF32")
    number = re.match(r"\s*[+-]?\d+", value or "")
    return value is None or (number is not None and int(number.group()) != 0)


def bound(dtype, planned_dequantize):
    """The error bound of a product of x in `dtype`, given whether the plan (when
    MLX_FPQMM_KERNEL does not force a path) takes dequantize + matmul."""
    tf32 = tf32_enabled()
    kernel = os.environ.get("MLX_FPQMM_KERNEL", "auto")
    dequantized = kernel == "dequantize" or (kernel == "auto" and planned_dequantize)
    if dtype == mx.float32 and tf32 and dequantized:
        return TF32_TOLERANCE
    return TOLERANCE[dtype]


def tolerance(mode, x, w_q, scales, transpose=True, **kwargs):
    """The error bound of the product by the path that the CUDA plan takes."""
    plan = mlx_fpqmm.kernel_path(
        x, w_q, scales, mode=mode, transpose=transpose, device="cuda", **kwargs
    )
    return bound(x.dtype, plan["path"] == "dequantize_matmul")


def gather_tolerance(x, w_q, scales, rhs, mode, **kwargs):
    """The error bound of a gather without lhs_indices, from the path that the CUDA
    plan takes for it (dequantize + gather_mm multiplies float32 x in TF32)."""
    plan = mlx_fpqmm.kernel_path(
        x, w_q, scales, rhs_indices=rhs, mode=mode, device="cuda", **kwargs
    )
    tf32 = tf32_enabled()
    if x.dtype == mx.float32 and tf32 and plan["path"] == "dequantize_matmul":
        return TF32_TOLERANCE
    return TOLERANCE[x.dtype]


def check(mode, x, w_q, scales, transpose=True, global_scale=None):
    """Ours on the GPU against the float64 reference and against ours on the CPU,
    within the bound of the path that the plan takes (float32 x of many rows by
    dequantize + matmul in TF32, or in bfloat16 parts by our kernels)."""
    kwargs = {"transpose": transpose}
    if global_scale is not None:
        kwargs["global_scale"] = global_scale
    y = product(mode, x, w_q, scales, GPU, **kwargs)
    assert y.dtype == x.dtype
    reference = qmm_reference(x, w_q, scales, mode, transpose, global_scale=global_scale)
    bound_ = tolerance(mode, x, w_q, scales, transpose)
    assert relative_error(y, reference) < bound_
    on_cpu = product(mode, x, w_q, scales, mx.cpu, **kwargs)
    assert relative_error(y, (np.array(on_cpu.astype(mx.float32)), reference[1])) < bound_
    return y


# The decode rows (1-16), the first rows past them, a whole block of 32 (the
# simple path's, bfloat16 x on sm_90: N = 200 makes too few wgmma blocks), the
# simple path's last and dequantize + matmul's (past kSimpleRows = 40; float32 x
# of the MLX formats takes bfloat16 parts there on sm_90, E2M1 codes from 17); N and K
# not multiples of the kernels' tiles, K with whole groups only where the format
# needs them (nvfp4: a multiple of 16, not of 32).
@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
@pytest.mark.parametrize("M", [1, 3, 8, 16, 17, 32, 40, 100])
def test_matches_reference(mode, dtype, transpose, M):
    group_size = DEFAULT_GROUP_SIZE[mode]
    free, quantized_axis = 200, 9 * group_size
    N, K = (free, quantized_axis) if transpose else (quantized_axis, free)
    w_q, scales = quantized(mode, *((N, K) if transpose else (K, N)))
    x = mx.random.normal((M, K)).astype(dtype)
    check(mode, x, w_q, scales, transpose)


def x_view(view, dtype, K):
    """x of the given kind of strides (rows of K values)."""
    if view == "transposed":  # (5, K), column-major
        return mx.random.normal((K, 5)).astype(dtype).T
    if view == "every_other_row":  # (2, 3, K): rows 2K apart
        return mx.random.normal((2, 6, K)).astype(dtype)[:, ::2]
    if view == "broadcast":  # (4, K): rows of stride 0
        return mx.broadcast_to(mx.random.normal((1, K)).astype(dtype), (4, K))
    if view == "reversed":  # negative strides
        return mx.random.normal((2, 3, K)).astype(dtype)[::-1, :, ::-1]
    if view == "strided_k":  # (3, K): K of stride 2
        return mx.random.normal((3, K, 2)).astype(dtype)[..., 0]
    return mx.random.normal((6, K)).astype(dtype)[2:]  # row_slice: readable as it is


@pytest.mark.parametrize(
    "view",
    ["transposed", "every_other_row", "broadcast", "reversed", "strided_k", "row_slice"],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("evaluated", [True, False], ids=["evaluated", "lazy"])
def test_x_of_any_strides(view, dtype, evaluated):
    """On the GPU the op passes x on as it comes and eval_gpu copies what the
    kernels cannot read in place (our strided copy): every kind of view, built
    lazily or evaluated first."""
    N, K = 96, 256
    w_q, scales = quantized("mxfp4", N, K)
    x = x_view(view, dtype, K)
    if evaluated:
        mx.eval(x)
    check("mxfp4", x, w_q, scales)
    # With batched W, x's batch axes (of stride 0 for a 2-D view) are read in
    # place where its matrices are.
    w_b, scales_b = quantized("mxfp4", 2 * N, K)
    x3 = mx.broadcast_to(x, (2, *x.shape)) if x.ndim == 2 else x
    check("mxfp4", x3, w_b.reshape(2, N, -1), scales_b.reshape(2, N, -1))


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("shape", [(4096, 4096), (64, 14336), (14336, 512)], ids=str)
@pytest.mark.parametrize("M", [1, 8, 64])
def test_model_shapes(mode, shape, M):
    """The decode kernels' real sizes, split K among them (few rows, long K); at
    64 rows dequantize + matmul, whose grid loops over 4096 x 4096's 2M words."""
    N, K = shape
    w_q, scales = quantized(mode, N, K)
    x = mx.random.normal((M, K)).astype(mx.bfloat16)
    check(mode, x, w_q, scales)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("M", [1, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("N, K", [(4096, 4096), (14336, 4096), (3072, 8192)], ids=str)
def test_float32_decode_of_large_weights(mode, M, N, K):
    """float32 x of up to 8 rows times 8 MiB of W or more: the MLX formats split x
    once into bfloat16 high and low parts (the plan's x_split) for bfloat16's
    kernel (in its narrow blocks, its wide ones at 14336 rows, K split into partial
    sums at 3072 x 8192 up to 4 rows); 9 rows only where wgmma takes the parts (14336
    rows of E2M1 codes on sm_90). The float-scale formats multiply x as it is, with
    W in two parts as well."""
    w_q, scales = quantized(mode, N, K)
    x = mx.random.normal((M, K))
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode=mode, device="cuda")
    by_wgmma = N == 14336 and on_hopper() and mode != "mxfp8"
    split = (M <= 8 or by_wgmma) and mode in ("mxfp4", "nvfp4", "mxfp8")
    assert (plan["x_split"] is not None) == split, plan["note"]
    check(mode, x, w_q, scales)


# Rows of W past the last block (8456), K split (1024 x 16384 and 8192: the
# parts' sums in the partials), blocks of 32, 128 and 256 rows of parts, and the
# most rows: 512 with E2M1 codes, while mxfp8 (E4M3: 384) takes dequantize +
# matmul there.
@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize(
    "M, N, K",
    [
        (9, 8456, 2048),
        (16, 14336, 4096),
        (20, 1024, 16384),
        (48, 1024, 8192),
        (61, 2056, 2048),
        (300, 2056, 512),
        (512, 4096, 1024),
    ],
    ids=str,
)
def test_float32_in_parts_by_wgmma(mode, M, N, K):
    """float32 x past 8 rows on sm_90 where bfloat16's plan of twice the rows is
    fp_qmm_wgmma's: split once into bfloat16 high and low parts, whose two rows the
    kernel adds as it stores y, up to half wgmma's rows rather than dequantize +
    matmul; with E4M3 codes past 16 rows where wgmma's blocks of 128 W rows half
    fill the GPU, else past 40. The float-scale modes multiply float32 x as it is."""
    w_q, scales = quantized(mode, N, K)
    x = mx.random.normal((M, K))
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode=mode, device="cuda")
    e4m3 = mode == "mxfp8" and 16 < M <= 384 and (N > 8320 or M > 40)
    tf32 = tf32_enabled()
    parts = on_hopper() and (mode in ("mxfp4", "nvfp4") or e4m3) and (tf32 or M <= 40)
    assert (plan["path"] == "wgmma" and plan["x_split"] is not None) == parts, plan["note"]
    check(mode, x, w_q, scales)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("M, N, K", [(20, 1024, 4096), (61, 2056, 2048), (40, 14336, 512)], ids=str)
def test_float32_in_parts_by_tiled(mode, M, N, K, monkeypatch):
    """fp_qmm's parts (the plan's past 16 rows on GPUs before sm_90, forced here):
    each row's two added as y is stored (14336 rows: K unsplit), or in the partials
    where K is split."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "tiled")
    w_q, scales = quantized(mode, N, K)
    x = mx.random.normal((M, K))
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode=mode, device="cuda")
    parts = mode in ("mxfp4", "nvfp4", "mxfp8")
    assert (plan["path"] == "tiled" and plan["x_split"] is not None) == parts, plan["note"]
    check(mode, x, w_q, scales)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32], ids=str)
@pytest.mark.parametrize("M", [9, 16])
def test_decode_of_two_x_blocks_in_wide_blocks(mode, dtype, M):
    """9 to 16 rows of x where the decode kernel's wide blocks half fill the
    GPU (9000 rows of W on 132 SMs): two blocks of 8 rows of x in each, for
    every x type (on sm_90 float32 x of the MLX formats goes in parts to wgmma;
    that of the float-scale modes stays, with W in two parts)."""
    N, K = 9000, 16 * DEFAULT_GROUP_SIZE[mode]
    w_q, scales = quantized(mode, N, K)
    x = mx.random.normal((M, K)).astype(dtype)
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode=mode, device="cuda")
    kernel = plan["kernel"]
    if on_hopper() and plan["x_split"] is None:
        assert kernel.startswith("fpqmm_qmv_wide_") and kernel.endswith("_x16"), kernel
    check(mode, x, w_q, scales)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("kernel", ["simple", "tiled", "wgmma", "dequantize", "auto"])
def test_many_rows_each_path(mode, kernel, monkeypatch):
    """Past the decode rows: the simple kernels, fp_qmm's block tiles, Hopper's
    warpgroup MMA (where the GPU is sm_90) and dequantize + matmul, forced and as
    the plan picks them, batched x."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", kernel)
    N, K = 136, 12 * DEFAULT_GROUP_SIZE[mode]
    w_q, scales = quantized(mode, N, K)
    x = mx.random.normal((3, 100, K)).astype(mx.bfloat16)
    check(mode, x, w_q, scales)


def on_hopper():
    x, w_q, scales = mx.zeros((256, 512), mx.bfloat16), *quantized("mxfp4", 256, 512)
    return mlx_fpqmm.kernel_path(x, w_q, scales, device="cuda")["device"] == "sm_90"


# fp_qmm_wgmma: x rows past M in the last tile of 128, W rows past N in the last
# block, K split over a small grid, blocks of 256 W rows over a large one, K with
# a partial last stage (2912: 22.75 stages of 128 E2M1 codes, 45.5 of 64 E4M3),
# and 1,000 rows (the plan's most with E2M1 codes is 1,024): four blocks of 256
# rows of x, the last one partly past M.
@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize(
    "shape",
    [(200, 136, 512), (128, 256, 8192), (512, 4352, 256), (130, 136, 2912), (1000, 4352, 256)],
    ids=str,
)
def test_wgmma(mode, shape, monkeypatch):
    """Hopper's warpgroup MMA, forced, against the reference and the CPU path."""
    if not on_hopper():
        pytest.skip("fp_qmm_wgmma runs on sm_90 (Hopper) only")
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "wgmma")
    M, N, K = shape
    w_q, scales = quantized(mode, N, K)
    x = mx.random.normal((M, K)).astype(mx.bfloat16)
    assert mlx_fpqmm.kernel_path(x, w_q, scales, mode=mode, device="cuda")["path"] == "wgmma"
    check(mode, x, w_q, scales)


@pytest.mark.parametrize("mode", ["fp4", "fp8"])
@pytest.mark.parametrize("scale_dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("group_size", [16, 64, 128])
@pytest.mark.parametrize("M", [5, 200])
def test_float_scales(mode, scale_dtype, group_size, M):
    w = mx.random.normal((96, 512)).astype(scale_dtype)
    w_q, scales = mlx_fpqmm.quantize(w, group_size, mode=mode)
    x = mx.random.normal((M, 512))
    y = product(mode, x, w_q, scales, GPU, group_size=group_size)
    reference = qmm_reference(x, w_q, scales, mode, group_size=group_size)
    assert relative_error(y, reference) < tolerance(mode, x, w_q, scales, group_size=group_size)


@pytest.mark.parametrize("M", [1, 8, 64, 200])
def test_nvfp4_global_scale_is_read_by_the_kernel(M):
    w = mx.random.normal((300, 256)) * 1e-3
    global_scale = mx.abs(w).max()
    w_q, scales = mx.quantize(w, mode="nvfp4", global_scale=global_scale)
    x = mx.random.normal((M, 256))
    check("nvfp4", x, w_q, scales, global_scale=global_scale)
    plain = product("nvfp4", x, w_q, scales, GPU)
    reference = qmm_reference(x, w_q, scales, "nvfp4", global_scale=global_scale)
    assert relative_error(plain, reference) > 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
@pytest.mark.parametrize("w_batch", [(3,), (1,), (2, 3)], ids=str)
@pytest.mark.parametrize("x_batch", [(2, 3), (2, 1), (3,), (1,), ()], ids=str)
@pytest.mark.parametrize("M", [5, 64, 200])
def test_batched_and_broadcast_weights(dtype, transpose, w_batch, x_batch, M):
    """x's and w's batches broadcast against each other (by the product's
    batch strides: 0 along an axis that one lacks or has as 1), through the
    decode, tiled and simple kernels and dequantize + matmul."""
    mode, N, K = "mxfp4", 96, 256
    w = mx.random.normal((*w_batch, N, K) if transpose else (*w_batch, K, N))
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    x = mx.random.normal((*x_batch, M, K)).astype(dtype)
    batch = np.broadcast_shapes(x_batch, w_batch)
    y = product(mode, x, w_q, scales, GPU, transpose=transpose)
    assert y.shape == (*batch, M, N)
    x_b = mx.broadcast_to(x, (*batch, M, K))
    w_q_b = mx.broadcast_to(w_q, (*batch, *w_q.shape[-2:]))
    s_b = mx.broadcast_to(scales, (*batch, *scales.shape[-2:]))
    for index in np.ndindex(batch):
        reference = qmm_reference(x_b[index], w_q_b[index], s_b[index], mode, transpose)
        bound_ = tolerance(mode, x, w_q, scales, transpose)
        assert relative_error(y[index], reference) < bound_, index


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize(
    "x_shape, w_batch",
    [
        ((1, 256), ()),
        ((40, 256), ()),
        ((41, 256), ()),
        ((600, 256), ()),
        ((2, 300, 256), ()),
        ((64, 256), (3,)),
        ((200, 256), (2,)),
        ((1, 200, 256), (2,)),
        ((2, 200, 256), (1,)),
        ((2, 600, 256), (2,)),
    ],
    ids=str,
)
def test_the_op_builds_the_path_that_kernel_path_shows(x_shape, w_batch, dtype):
    """The op's choice of dequantize + matmul over the primitive is the plan's
    for the primitive's problem, batches included (kernel_path)."""
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((*w_batch, 96, 256)), mode="mxfp4")
    x = mx.random.normal(x_shape).astype(dtype)
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode="mxfp4", device="cuda")
    y = product("mxfp4", x, w_q, scales, GPU)
    nodes = graph_nodes(y)
    assert ("FpDequantize" in nodes) == (plan["path"] == "dequantize_matmul"), plan
    assert ("FpQuantizedMatmul" in nodes) != ("FpDequantize" in nodes), nodes


def test_kernels_one_after_another_in_any_order():
    """Products that run different kernels and launch sequences, each evaluated
    on its own, in three orders: each must match the reference whatever ran
    before it. MLX reuses an executable CUDA graph of the same key (the kinds
    of its nodes and their edges) for the next product and updates its kernel
    nodes in place, so one kernel's node becomes another's, and a sequence of
    two kernels another sequence of two. Single kernels: the decode kernel
    with bfloat16, float16 and float32 x, its wide blocks (of one and two
    blocks of 8 rows of x) and its blocks of 32
    rows of x, x @ W, the staged kernel, an empty K; a cluster split of K; two:
    wgmma's blocks of 32, 64, 128 and 256 rows after their x tiles, float32 x split
    into bfloat16 parts before the decode kernel, x copied from a transpose
    before it, a split of K into partial sums and their sum, the pairs'
    grouping before the grouped kernel; three: float32 x split, then a split of
    K and its sum, float32 x split into wgmma's parts, their tiles and wgmma;
    four: the same with wgmma's split of K and its sum."""
    cases = [
        ("mxfp4", mx.bfloat16, 1, 200, 1152, True),
        ("nvfp4", mx.float32, 1, 200, 1152, True),
        ("mxfp4", mx.float16, 1, 64, 8192, True),
        ("mxfp8", mx.float32, 4, 128, 512, True),
        ("mxfp4", mx.bfloat16, 1, 9000, 512, True),
        ("mxfp4", mx.bfloat16, 16, 9000, 512, True),
        ("mxfp4", mx.bfloat16, 32, 256, 512, True),
        ("mxfp4", mx.bfloat16, 32, 9000, 512, True),
        ("fp4", mx.float32, 1, 96, 512, True),
        ("mxfp4", mx.bfloat16, 64, 256, 512, True),
        ("mxfp4", mx.bfloat16, 3, 256, 192, False),
        ("mxfp8", mx.bfloat16, 200, 256, 512, True),
        ("mxfp4", mx.bfloat16, 300, 8448, 256, True),
        ("mxfp4", mx.float32, 4, 64, 0, True),
        ("mxfp4", mx.float32, 1, 4096, 4096, True),
        ("mxfp4", mx.float32, 1, 3072, 8192, True),
        ("mxfp4", mx.float32, 1, 3072, 2048, True),
        ("mxfp4", mx.float32, 32, 9000, 512, True),
        ("nvfp4", mx.float32, 20, 1024, 4096, True),
        ("mxfp4", mx.bfloat16, 4, 256, 512, "x columns"),
        ("mxfp4", mx.bfloat16, 16, 64, 256, "gather"),
    ]
    for order in (cases, cases[::-1], cases[::2] + cases[1::2]):
        for mode, dtype, M, N, K, layout in order:
            case = (mode, dtype, M, N, K, layout)
            if layout == "gather":
                # M pairs of one row over 4 experts: grouped by expert.
                w_q, scales, _ = quantized_experts(mode, 4, N, K)
                x = mx.random.normal((M, 1, K)).astype(dtype)
                rhs = mx.array(np.random.default_rng(M).integers(0, 4, M).astype(np.uint32))
                y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=rhs, mode=mode, stream=GPU)
                lhs = mx.arange(M, dtype=mx.uint32)
                reference = gather_reference(x, w_q, scales, lhs, rhs, mode)
                assert relative_error(y, reference) < TOLERANCE[dtype], case
                continue
            # "x columns": x a transpose, copied row-contiguous first.
            x = mx.random.normal((K, M) if layout == "x columns" else (M, K)).astype(dtype)
            x = x.T if layout == "x columns" else x
            if K == 0:
                w_q = mx.zeros((N, 0), dtype=mx.uint32)
                scales = mx.zeros((N, 0), dtype=mx.uint8)
                y = product(mode, x, w_q, scales, GPU)
                assert not np.array(y).any(), case
                continue
            transpose = layout is not False
            rows, cols = (N, K) if transpose else (K, N)
            w_dtype = mx.float16 if mode == "fp4" else mx.float32
            w_q, scales = quantized(mode, rows, cols, dtype=w_dtype)
            y = product(mode, x, w_q, scales, GPU, transpose=transpose)
            reference = qmm_reference(x, w_q, scales, mode, transpose)
            error = relative_error(y, reference)
            assert error < TOLERANCE[dtype], (case, error)


@pytest.mark.parametrize("shape", [(0, 64, 64), (4, 0, 64), (4, 64, 0)], ids=str)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_empty_shapes(shape, transpose):
    M, N, K = shape
    rows, cols = (N, K) if transpose else (K, N)
    w_q = mx.zeros((rows, cols // 8), dtype=mx.uint32)
    scales = mx.full((rows, cols // 32), 127, dtype=mx.uint8)
    y = mlx_fpqmm.fp4_qmm(mx.ones((M, K)), w_q, scales, transpose=transpose, stream=GPU)
    assert y.shape == (M, N)
    assert not np.array(y).any()
    # An empty x that the kernels cannot read in place as it is (a transpose).
    y = mlx_fpqmm.fp4_qmm(mx.ones((K, M)).T, w_q, scales, transpose=transpose, stream=GPU)
    assert y.shape == (M, N)
    assert not np.array(y).any()


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
@pytest.mark.parametrize("tokens", [1, 8, 40])
def test_gather_random_routes(mode, transpose, tokens):
    E, N, K, top_k = 8, 96, 256, 2
    w_q, scales, _ = quantized_experts(mode, E, *((N, K) if transpose else (K, N)))
    x = mx.random.normal((tokens, 1, 1, K)).astype(mx.bfloat16)
    rng = np.random.default_rng(tokens)
    rhs = mx.array(np.argsort(rng.random((tokens, E)), axis=1)[:, :top_k].astype(np.uint32))
    y = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=rhs, transpose=transpose, mode=mode, stream=GPU
    )
    lhs = mx.arange(tokens, dtype=mx.uint32)[:, None]
    reference = gather_reference(x.reshape(tokens, 1, K), w_q, scales, lhs, rhs, mode, transpose)
    assert relative_error(y.reshape(reference[0].shape), reference) < TOLERANCE[mx.bfloat16]


@pytest.mark.parametrize("pairs", [4, 64, 300])
def test_gather_sorted_mlx_lm_layout(pairs):
    """mlx-lm's sorted layout: x (pairs, 1, K), sorted indices (pairs,)."""
    mode, E, N, K = "mxfp4", 16, 128, 512
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    x = mx.random.normal((pairs, 1, K)).astype(mx.bfloat16)
    rhs = mx.array(np.sort(np.random.default_rng(pairs).integers(0, E, pairs)).astype(np.uint32))
    y = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=rhs, mode=mode, sorted_indices=True, stream=GPU
    )
    assert y.shape == (pairs, 1, N)
    lhs = mx.arange(pairs, dtype=mx.uint32)
    reference = gather_reference(x, w_q, scales, lhs, rhs, mode)
    assert relative_error(y, reference) < TOLERANCE[mx.bfloat16]


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
@pytest.mark.parametrize("kernel", ["auto", "simple", "dequantize", "grouped", "tiled", "wgmma"])
def test_gather_sorted_many_rows_each_path(mode, dtype, transpose, kernel, monkeypatch):
    """256 sorted pairs over 8 experts (dequantize + gather_mm by default), the
    last two past the experts: NaN rows, the others against the reference."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", kernel)
    E, free, quantized = 8, 96, 4 * DEFAULT_GROUP_SIZE[mode]
    N, K = (free, quantized) if transpose else (quantized, free)
    w_q, scales, _ = quantized_experts(mode, E, *((N, K) if transpose else (K, N)))
    rng = np.random.default_rng(7)
    rhs = np.concatenate([np.sort(rng.integers(0, E, 254)), [E, E + 5]]).astype(np.uint32)
    x = mx.random.normal((rhs.size, 1, K)).astype(dtype)
    y = mlx_fpqmm.gather_qmm(
        x,
        w_q,
        scales,
        rhs_indices=mx.array(rhs),
        transpose=transpose,
        mode=mode,
        sorted_indices=True,
        stream=GPU,
    )
    y = np.array(y.astype(mx.float32))
    assert np.isnan(y[-2:]).all() and not np.isnan(y[:-2]).any()
    lhs = mx.arange(254, dtype=mx.uint32)
    reference = gather_reference(x[:-2], w_q, scales, lhs, rhs[:-2], mode, transpose)
    limit = gather_tolerance(
        x, w_q, scales, mx.array(rhs), mode, transpose=transpose, sorted_indices=True
    )
    assert relative_error(mx.array(y[:-2]), reference) < limit


@pytest.mark.parametrize("layout", ["strided", "expanded", "repeated"])
def test_gather_sorted_unusual_layouts(layout):
    """Sorted indices with x a strided view (every other row of a larger x), x
    from expand_dims (its axis of 1 has stride 1), or sorted indices repeated by
    x's batch (2, 128) broadcast against them: not the grouped GEMM's contiguous,
    sorted rows as they come."""
    E, N, K = 8, 64, 256
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    rhs = mx.array(np.sort(np.random.default_rng(5).integers(0, E, 128)).astype(np.uint32))
    if layout == "strided":
        x = mx.random.normal((256, 1, K)).astype(mx.bfloat16)[::2]
        lhs = mx.arange(128, dtype=mx.uint32)
        pairs_rhs = rhs
    elif layout == "expanded":
        x = mx.expand_dims(mx.random.normal((128, K)).astype(mx.bfloat16), 1)
        mx.eval(x)
        lhs = mx.arange(128, dtype=mx.uint32)
        pairs_rhs = rhs
    else:
        x = mx.random.normal((2, 128, 1, K)).astype(mx.bfloat16)
        lhs = mx.arange(256, dtype=mx.uint32)
        pairs_rhs = mx.concatenate([rhs, rhs])
    y = mlx_fpqmm.gather_qmm(
        x, w_q, scales, rhs_indices=rhs, mode="mxfp4", sorted_indices=True, stream=GPU
    )
    reference = gather_reference(x, w_q, scales, lhs, pairs_rhs, "mxfp4")
    assert relative_error(y.reshape(reference[0].shape), reference) < TOLERANCE[mx.bfloat16]


@pytest.mark.parametrize("pairs", [6, 64])
@pytest.mark.parametrize("kernel", ["auto", "dequantize"])
def test_gather_nvfp4_expert_scales(pairs, kernel, monkeypatch):
    """Each expert's own tensor scale (1 to 40 times apart), in the kernels (per
    pair at 6 pairs, grouped at 64) and in the dequantized experts (forced)."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", kernel)
    E, N, K = 4, 64, 128
    w = mx.random.normal((E, N, K)) * mx.array([1.0, 5.0, 13.0, 40.0]).reshape(E, 1, 1)
    global_scale = mx.max(mx.abs(w), axis=(1, 2)).astype(mx.float32)
    parts = [mlx_fpqmm.quantize(w[e], mode="nvfp4", global_scale=global_scale[e]) for e in range(E)]
    w_q, scales = mx.stack([p[0] for p in parts]), mx.stack([p[1] for p in parts])
    x = mx.random.normal((pairs, 1, K))
    rhs = mx.array(np.sort(np.random.default_rng(pairs).integers(0, E, pairs)).astype(np.uint32))
    y = mlx_fpqmm.gather_qmm(
        x,
        w_q,
        scales,
        rhs_indices=rhs,
        mode="nvfp4",
        global_scale=global_scale,
        sorted_indices=True,
        stream=GPU,
    )
    lhs = mx.arange(pairs, dtype=mx.uint32)
    reference = gather_reference(x, w_q, scales, lhs, rhs, "nvfp4", global_scale=global_scale)
    limit = gather_tolerance(
        x, w_q, scales, rhs, "nvfp4", global_scale=global_scale, sorted_indices=True
    )
    assert relative_error(y, reference) < limit


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
def test_gather_unsorted_routes_dequantize_request(dtype, monkeypatch):
    """Forced, dequantize + gather_mm takes any layout: (tokens, 1, 1, K) over
    (tokens, top_k) routes, some out of range."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "dequantize")
    E, N, K, tokens = 6, 80, 256, 33
    w_q, scales, _ = quantized_experts("mxfp8", E, N, K)
    rng = np.random.default_rng(3)
    rhs = np.stack([rng.permutation(E + 2)[:3] for _ in range(tokens)]).astype(np.uint32)
    x = mx.random.normal((tokens, 1, 1, K)).astype(dtype)
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=mx.array(rhs), mode="mxfp8", stream=GPU)
    y = np.array(y.astype(mx.float32))
    valid = rhs < E
    assert np.isnan(y[~valid]).all() and not np.isnan(y[valid]).any()
    lhs = np.broadcast_to(np.arange(tokens)[:, None], rhs.shape)
    reference = gather_reference(
        x.reshape(tokens, 1, K), w_q, scales, lhs[valid], rhs[valid], "mxfp8"
    )
    assert relative_error(mx.array(y[valid]), reference) < bound(dtype, True)


@pytest.mark.parametrize("kernel", ["auto", "simple", "grouped", "tiled", "wgmma"])
def test_gather_16384_tokens_top_4(kernel, monkeypatch):
    """65,536 sorted pairs: more than a grid axis of the per-pair kernels holds."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", kernel)
    E, N, K, pairs = 32, 64, 128, 16384 * 4
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    rhs = mx.array(np.sort(np.random.default_rng(1).integers(0, E, pairs)).astype(np.uint32))
    x = mx.random.normal((pairs, 1, K)).astype(mx.bfloat16)

    def gather(stream):
        y = mlx_fpqmm.gather_qmm(
            x, w_q, scales, rhs_indices=rhs, mode="mxfp4", sorted_indices=True, stream=stream
        )
        return y.astype(mx.float32)

    y, on_cpu = gather(GPU), gather(mx.cpu)
    magnitude = float(mx.max(mx.abs(on_cpu)))
    assert float(mx.max(mx.abs(y - on_cpu))) < TOLERANCE[mx.bfloat16] * magnitude


@pytest.mark.parametrize(
    "kernel", ["auto", "simple", "dequantize", "grouped", "tiled", "wgmma", "qmv"]
)
def test_gather_unsorted_layout_many_tokens(kernel, monkeypatch):
    """mlx-lm's unsorted layout, x (tokens, 1, 1, K) and indices (tokens, 4): pair p reads
    x's matrix p / 4 (no index array) in every path, against the CPU."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", kernel)
    E, N, K, tokens = 32, 64, 128, 1024
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    rng = np.random.default_rng(2)
    rhs = mx.array(np.stack([rng.permutation(E)[:4] for _ in range(tokens)]).astype(np.uint32))
    x = mx.random.normal((tokens, 1, 1, K)).astype(mx.bfloat16)

    def gather(stream):
        y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=rhs, mode="mxfp4", stream=stream)
        return y.astype(mx.float32)

    y, on_cpu = gather(GPU), gather(mx.cpu)
    assert y.shape == (tokens, 4, 1, N)
    magnitude = float(mx.max(mx.abs(on_cpu)))
    assert float(mx.max(mx.abs(y - on_cpu))) < TOLERANCE[mx.bfloat16] * magnitude


@pytest.mark.parametrize("kernel", ["auto", "dequantize"])
def test_gather_out_of_range_indices_give_nan_rows(kernel, monkeypatch):
    """With lhs_indices the primitive runs, whatever is requested."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", kernel)
    E, N, K = 4, 64, 128
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((3, 2, K))
    lhs = mx.array([0, 7, 2, 1], dtype=mx.uint32)
    rhs = mx.array([1, 0, 9, 3], dtype=mx.uint32)

    def gather(stream):
        y = mlx_fpqmm.gather_qmm(
            x, w_q, scales, lhs_indices=lhs, rhs_indices=rhs, mode="mxfp4", stream=stream
        )
        return np.array(y)

    y, on_cpu = gather(GPU), gather(mx.cpu)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(on_cpu))
    np.testing.assert_allclose(y[[0, 3]], on_cpu[[0, 3]], rtol=1e-4, atol=1e-4)


def check_routed_gather(x, w_q, scales, rhs, mode, tol):
    """gather_qmm on the GPU of x (tokens, 1, 1, K) routed by rhs (tokens, top
    k), whose indices past the experts make NaN rows, against the reference."""
    tokens, K = x.shape[0], x.shape[-1]
    y = mlx_fpqmm.gather_qmm(x, w_q, scales, rhs_indices=mx.array(rhs), mode=mode, stream=GPU)
    y = np.array(y.astype(mx.float32))
    valid = rhs < w_q.shape[0]
    assert np.isnan(y[~valid]).all() and not np.isnan(y[valid]).any()
    lhs = np.broadcast_to(np.arange(tokens)[:, None], rhs.shape)
    reference = gather_reference(x.reshape(tokens, 1, K), w_q, scales, lhs[valid], rhs[valid], mode)
    assert relative_error(mx.array(y[valid]), reference) < tol


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("kernel", ["grouped", "qmv"])
def test_gather_grouped_unsorted_routes(mode, dtype, kernel, monkeypatch):
    """Unsorted routes of 37 tokens, top 3 of 6 experts, some out of range (NaN
    rows): grouped by expert (block tiles for bfloat16 and float16 x, runs of
    16 for float32 x, and a partial run per expert) and per pair; N not a
    multiple of a block's W rows."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", kernel)
    E, N, K, tokens = 6, 200, 8 * DEFAULT_GROUP_SIZE[mode], 37
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    rng = np.random.default_rng(11)
    rhs = np.stack([rng.permutation(E + 1)[:3] for _ in range(tokens)]).astype(np.uint32)
    x = mx.random.normal((tokens, 1, 1, K)).astype(dtype)
    grouped = kernel == "grouped"
    plan = mlx_fpqmm.kernel_path(
        x, w_q, scales, rhs_indices=mx.array(rhs), mode=mode, device="cuda", kernel=kernel
    )
    assert (plan["path"] == "grouped") == grouped, plan["note"]
    # Where the grouped path does not run, a grouped request is automatic:
    # 18.5 rows an expert take dequantize + gather_mm (MLX's TF32 for float32).
    dequantized = plan["path"] == "dequantize_matmul"
    tol = TF32_TOLERANCE if dequantized and dtype == mx.float32 else TOLERANCE[dtype]
    check_routed_gather(x, w_q, scales, rhs, mode, tol)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("tokens", [16, 32])
def test_gather_grouped_blocks_take_several_shares(mode, dtype, tokens):
    """fp_qmv_grouped's blocks walk more tiles of W rows times runs than run at
    once, each share's first loads in flight while the one before is stored:
    16 or 32 tokens, top 4 of 16 experts and an out-of-range index (NaN runs
    among the others), 4096 W rows. At 32 tokens (8 pairs an expert, many in
    two runs) the shares go tile by tile over the runs, at 16 run by run."""
    E, N, K = 16, 4096, 512
    w_q, scales, _ = quantized_experts(mode, E, N, K)
    rng = np.random.default_rng(5)
    rhs = np.stack([rng.permutation(E + 1)[:4] for _ in range(tokens)]).astype(np.uint32)
    x = mx.random.normal((tokens, 1, 1, K)).astype(dtype)
    plan = mlx_fpqmm.kernel_path(
        x, w_q, scales, rhs_indices=mx.array(rhs), mode=mode, device="cuda"
    )
    assert plan["kernel"].startswith("fpqmm_qmv_grouped"), plan["note"]
    assert plan["grid"][0] < N // 32 * E, plan
    assert plan["tile_major_shares"] == (tokens == 32), plan
    check_routed_gather(x, w_q, scales, rhs, mode, TOLERANCE[dtype])


def test_gather_grouped_out_of_range_lhs_indices(monkeypatch):
    """lhs_indices past x's matrices make NaN rows inside a run of an expert."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "grouped")
    E, N, K = 4, 64, 128
    w_q, scales, _ = quantized_experts("mxfp4", E, N, K)
    x = mx.random.normal((5, 1, K))
    lhs = mx.array([0, 7, 2, 1, 4, 4, 9, 3, 2, 0], dtype=mx.uint32)
    rhs = mx.array([1, 1, 9, 3, 2, 1, 1, 0, 1, 1], dtype=mx.uint32)

    def gather(stream):
        y = mlx_fpqmm.gather_qmm(
            x, w_q, scales, lhs_indices=lhs, rhs_indices=rhs, mode="mxfp4", stream=stream
        )
        return np.array(y)

    y, on_cpu = gather(GPU), gather(mx.cpu)
    nan_rows = np.isnan(y).all(axis=(1, 2))
    np.testing.assert_array_equal(nan_rows, [0, 1, 1, 0, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(np.isnan(y), np.isnan(on_cpu))
    np.testing.assert_allclose(y[~nan_rows], on_cpu[~nan_rows], rtol=1e-4, atol=1e-4)
    # No matrices of x at all: every row NaN, nothing of x read.
    x = mx.zeros((0, 1, K))
    assert np.isnan(gather(GPU)).all()


@pytest.mark.parametrize("tokens", [1, 8, 40])
def test_fused_experts_on_the_gpu(tokens):
    """fuse_projections's gate/up gather of a gpt-oss model (expert biases, 40 tokens
    sorted by mlx-lm) on the GPU equals the separate layers' on the GPU, and after the
    fallback (each layer's rows copied out of the strided view) still does."""
    pytest.importorskip("mlx_lm", reason="the models come from mlx-lm")
    from test_fused import max_error, moe_model

    from mlx_fpqmm.nn import fuse_projections

    with mx.stream(GPU):
        separate = moe_model("gpt_oss", "mxfp4")
        model = moe_model("gpt_oss", "mxfp4")
        assert fuse_projections(model)
        x = mx.random.randint(0, 256, (1, tokens), key=mx.random.key(tokens))
        expected = separate(x)
        assert max_error(model(x), expected) <= 1e-5
        experts = model.layers[0].mlp.experts
        h = mx.random.normal((tokens, 1, 1, 128))
        indices = mx.array(np.random.default_rng(tokens).integers(0, 4, (tokens, 2)), mx.uint32)
        experts.up_proj(h, indices)
        experts.up_proj(h, indices)  # called again alone: separate products from now on
        assert max_error(model(x), expected) <= 1e-5
        # Each took its rows of every expert as its own (a contiguous copy) when next called.
        assert experts.up_proj._siblings is None and experts.gate_proj._siblings is None


@pytest.mark.parametrize("mode", ALL_MODES)
def test_fused_projections_on_the_gpu(mode):
    """fuse_projections's q/k/v and gate/up products of a Llama model on the GPU equal
    the separate layers' on the GPU."""
    pytest.importorskip("mlx_lm", reason="the models come from mlx-lm")
    from test_fused import TOKENS, max_error, quantized_model

    from mlx_fpqmm.nn import fuse_projections

    with mx.stream(GPU):
        separate = quantized_model("llama", mode)
        model = quantized_model("llama", mode)
        assert fuse_projections(model)
        assert max_error(model(TOKENS), separate(TOKENS)) <= 1e-5


def close_outputs(y, expected, dtype=mx.bfloat16):
    """Two products of the same terms: within a rounding of the output type (one
    bfloat16 step; float32 x's two bfloat16 parts keep 16 bits, and a lost low part
    is 1e-3 of the largest output)."""
    bound = 8e-3 if dtype == mx.bfloat16 else 1e-4
    return (mx.abs(y - expected).max() / mx.abs(expected).max()).item() <= bound


@pytest.fixture(scope="module")
def gpt_oss_experts():
    """A gpt-oss MLP's gate and up experts (32 of 2880 x 2880, mxfp4), quantized on the
    GPU once for the token counts."""
    with mx.stream(GPU):
        experts = [quantized_experts("mxfp4", 32, 2880, 2880)[:2] for _ in range(2)]
        mx.eval(experts)
    return experts


@pytest.mark.parametrize("tokens", [1, 8, 128])
def test_fused_expert_rows_equal_two_gathers(gpt_oss_experts, tokens):
    """fuse_projections's layout of a gpt-oss MLP at its real size: one gather over 32
    experts' gate and up rows side by side (5760 x 2880) equals the two gathers of 2880
    rows (per pair at 1 token, grouped at 8, tiled or wgmma at 128), each part."""
    E, N, K, top_k = 32, 2880, 2880, 4
    (gate_w, gate_s), (up_w, up_s) = gpt_oss_experts
    w, scales = mx.concatenate([gate_w, up_w], axis=1), mx.concatenate([gate_s, up_s], axis=1)
    x = mx.random.normal((tokens, 1, 1, K)).astype(mx.bfloat16)
    rng = np.random.default_rng(tokens)
    rhs = mx.array(np.stack([rng.permutation(E)[:top_k] for _ in range(tokens)]), mx.uint32)

    def gather(w, scales):
        return mlx_fpqmm.gather_qmm(
            x, w, scales, rhs_indices=rhs, transpose=True, mode="mxfp4", stream=GPU
        )

    gate, up = mx.split(gather(w, scales), [N], axis=-1)
    assert close_outputs(gate, gather(gate_w, gate_s))
    assert close_outputs(up, gather(up_w, up_s))


@pytest.mark.parametrize("M", [1, 8, 32])
def test_fused_attention_rows_equal_three_products(M):
    """Llama-3-8B's q/k/v side by side (6144 x 4096: narrow blocks, where k and v alone
    split K in a cluster; float32 x at one row split into parts, as for q alone)
    against the three products."""
    K, rows = 4096, (4096, 1024, 1024)
    parts = [quantized("mxfp4", n, K) for n in rows]
    w = mx.concatenate([p[0] for p in parts])
    scales = mx.concatenate([p[1] for p in parts])
    for dtype in (mx.bfloat16, mx.float32):
        x = mx.random.normal((M, K)).astype(dtype)
        fused = mx.split(product("mxfp4", x, w, scales, GPU), [4096, 5120], axis=-1)
        for y, (w_q, s) in zip(fused, parts, strict=True):
            assert close_outputs(y, product("mxfp4", x, w_q, s, GPU), dtype)


def test_more_than_2_to_the_31_weight_elements():
    """A weight of 2^31 + 2^20 codes: 64-bit offsets in the kernels."""
    N, K = 2**16 + 32, 2**15
    rng = np.random.default_rng(0)
    w_q = mx.array(rng.integers(0, 2**32, size=(N, K // 8), dtype=np.uint32))
    scales = mx.array(rng.integers(120, 130, size=(N, K // 32), dtype=np.uint8))
    x = mx.array(rng.standard_normal((2, K), np.float32))
    y = mlx_fpqmm.fp4_qmm(x, w_q, scales, stream=GPU)
    for rows in (slice(0, 8), slice(2**16 - 8, 2**16 + 8), slice(N - 8, N)):
        reference = qmm_reference(x, w_q[rows], scales[rows], "mxfp4")
        assert relative_error(y[:, rows], reference) < 1e-5


def test_memory_is_flat_over_many_calls():
    w_q, scales = quantized("mxfp4", 512, 512)
    x = mx.random.normal((4, 512))
    mx.eval(mlx_fpqmm.fp4_qmm(x, w_q, scales, stream=GPU))
    mx.synchronize()
    before = mx.get_active_memory()
    ours_before = _ext._cuda_device_bytes()
    for i in range(10_000):
        y = mlx_fpqmm.fp4_qmm(x, w_q, scales, stream=GPU)
        if i % 100 == 0:
            mx.eval(y)
    mx.eval(y)
    del y
    mx.synchronize()
    assert mx.get_active_memory() - before < 1 << 20
    assert _ext._cuda_device_bytes() - ours_before < 1 << 20


def test_kernel_path_on_this_gpu():
    w_q, scales = quantized("mxfp4", 4096, 4096)
    plan = mlx_fpqmm.kernel_path(mx.zeros((1, 4096)), w_q, scales, mode="mxfp4", device="cuda")
    assert plan["backend"] == "cuda"
    assert plan["path"] == "qmv"
    many = mlx_fpqmm.kernel_path(mx.zeros((4096, 4096)), w_q, scales, mode="mxfp4", device="cuda")
    assert many["path"] == "dequantize_matmul"


def test_fuzz_on_the_gpu_stream_never_crashes():
    tests = Path(__file__).resolve().parent
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(tests / "fuzz_ops.py"), "1000"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tests,
        env={**os.environ, "MLX_FPQMM_FUZZ_DEVICE": "gpu"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    outcomes = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert set(outcomes) <= {"ok", "ValueError", "TypeError"}
    assert outcomes.get("ok", 0) > 20
