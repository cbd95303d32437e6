"""The Metal kernels, run through the simulator exactly as the plan dispatches
them, against the same MLX reference as the CPU tests."""

import math
import shutil

import mlx.core as mx
import numpy as np
import pytest
from fpqmm_dev import bench_metal, mlx_metal
from reference import (
    BITS,
    TOLERANCE,
    gather_reference,
    qmm_reference,
    relative_error,
)
from test_cpu_kernels import NONFINITE_CASES, assert_same_values, nonfinite_case, nonfinite_x

import mlx_fpqmm
from mlx_fpqmm.testing import (
    KERNEL_ROOT,
    LIBRARIES,
    METAL_KERNELS,
    kernel_sources,
    library,
    metal_qmm,
    run_metal,
)

TYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# Group size 16 in both, so K % 32 == 16 is allowed.
MODE_OF_CODES = {"e2m1": ("fp4", 16), "e4m3": ("fp8", 16)}
# NAX stages W in bfloat, exact (so planned for any x) only with MLX's scales.
NAX_MODE_OF_CODES = {"e2m1": ("nvfp4", 16), "e4m3": ("mxfp8", 32)}

# Per kernel family: (transpose, forced path, M) that the plan sends to it.
FAMILIES = {
    "qmv_bm8": (True, "qmv", 20),  # three blocks of x rows
    "qvm_bm4": (False, "qmv", 3),
    "mma_t_bm32": (True, "mma", 20),
    "mma_t_bm64": (True, "mma", 40),
    "mma_n_bm32": (False, "mma", 20),
    "mma_t_split_k_bm32": (True, "mma", 20),
    "mma_t_split_k_bm64": (True, "mma", 40),
    "nax_t_bm32": (True, "nax", 20),
    "nax_t_bm64": (True, "nax", 40),
    "nax_t_split_k_bm32": (True, "nax", 20),
    "nax_t_split_k_bm64": (True, "nax", 40),
}
NAX_DEVICE = "applegpu_g17s"
# Every family also has a gather (mixture-of-experts) variant; the MMA tiles a
# sorted-runs one too (tests/test_metal_gather.py runs those).
SORTED_RUN_FAMILIES = ("rhs_mma_t_bm32", "rhs_mma_n_bm32", "rhs_nax_t_bm32")
# Split K runs on one matrix only (no gather variant), its sum per x type.
GATHER_FAMILIES = [family for family in FAMILIES if "split_k" not in family]
SPLIT_K_SUMS = [f"fpqmm_split_k_sum_{type_name}" for type_name in TYPES]
EXPECTED_KERNELS = [
    f"fpqmm_{variant}{family}_{codes}_{type_name}"
    for variant, families in (("", FAMILIES), ("gather_", (*GATHER_FAMILIES, *SORTED_RUN_FAMILIES)))
    for family in families
    for codes in MODE_OF_CODES
    for type_name in TYPES
] + SPLIT_K_SUMS


def quantized(shape, mode, group_size=None, dtype=mx.float32):
    w = mx.random.normal(shape).astype(dtype)
    return mlx_fpqmm.quantize(w, group_size, mode=mode)


def check(x, w_q, scales, mode, *, transpose=True, group_size=None, global_scale=None, **kwargs):
    run = run_metal(
        x,
        w_q,
        scales,
        mode=mode,
        transpose=transpose,
        group_size=group_size,
        global_scale=global_scale,
        **kwargs,
    )
    reference = qmm_reference(x, w_q, scales, mode, transpose, group_size, global_scale)
    error = relative_error(mx.array(run.y), reference)
    assert error < TOLERANCE[x.dtype], (run.plan["kernel"], error)
    return run


def test_instantiated_kernels_are_the_tested_ones():
    # Every metallib: the base one and the NAX one.
    names = [name for library_name in LIBRARIES for name in library(library_name).names]
    assert sorted(names) == sorted(EXPECTED_KERNELS)


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_metallib_sources_are_their_metal_version(name):
    """Every .metal file CMake compiles passes the simulator's Metal language
    check at its metallib's version (library() raises otherwise)."""
    assert kernel_sources(name)
    assert library(name).metal_version == LIBRARIES[name][1]


def test_metal_language_check_covers_the_kernels(tmp_path):
    """A construct Metal 3.1 lacks, planted in a shared kernel header, fails."""
    from metal_sim import Library, MetalCompileError

    shutil.copytree(KERNEL_ROOT, tmp_path / "root")
    kernels = tmp_path / "root" / METAL_KERNELS
    header = kernels / "fp_common.h"
    text = header.read_text()
    header.write_text(
        text.replace("#pragma once", "#pragma once\ninline double wide(float v) { return v; }", 1)
    )
    with pytest.raises(MetalCompileError, match=r"fp_common.h:4: double"):
        Library([kernels / "fp_qmm.metal"], include_dirs=[tmp_path / "root"])


@pytest.mark.parametrize(
    "host_name", [k for k in EXPECTED_KERNELS if "gather" not in k and k not in SPLIT_K_SUMS]
)
def test_every_kernel_runs(host_name):
    family, codes, type_name = host_name.removeprefix("fpqmm_").rsplit("_", 2)
    transpose, kernel, M = FAMILIES[family]
    mode, group_size = (NAX_MODE_OF_CODES if kernel == "nax" else MODE_OF_CODES)[codes]
    # N and K tails against every tile width (K % 32 == 16 where K is grouped
    # by 16); split K needs K of at least two splits (three here, the last
    # one short).
    N, K = (40, 5 * group_size) if transpose else (48, 37)
    if "split_k" in family:
        K = 25 * group_size if group_size == 16 else 13 * group_size
    w_q, scales = quantized((N, K) if transpose else (K, N), mode, group_size)
    x = mx.random.normal((M, K)).astype(TYPES[type_name])
    device = NAX_DEVICE if kernel == "nax" else "applegpu_g16s"
    check_kernel = check_nax if kernel == "nax" else check
    run = check_kernel(
        x,
        w_q,
        scales,
        mode,
        transpose=transpose,
        group_size=group_size,
        kernel=kernel,
        device=device,
    )
    assert run.plan["kernel"] == host_name
    if "split_k" in family:
        assert run.plan["split_k"] == 3
        assert run.plan["reduction"]["kernel"] == f"fpqmm_split_k_sum_{type_name}"


@pytest.mark.parametrize(
    "host_name", [k for k in EXPECTED_KERNELS if "gather" in k and "rhs" not in k]
)
def test_every_gather_kernel_runs(host_name):
    """Pairs of (x matrix, expert), repeated and out of order, with the same
    tails as the plain kernels."""
    family, codes, type_name = host_name.removeprefix("fpqmm_gather_").rsplit("_", 2)
    transpose, kernel, M = FAMILIES[family]
    mode, group_size = (NAX_MODE_OF_CODES if kernel == "nax" else MODE_OF_CODES)[codes]
    N, K = (40, 5 * group_size) if transpose else (48, 37)
    w_q, scales = quantized((3, N, K) if transpose else (3, K, N), mode, group_size)
    x = mx.random.normal((2, M, K)).astype(TYPES[type_name])
    lhs, rhs = mx.array([1, 0, 1, 1]), mx.array([2, 0, 2, 1])
    run = run_metal(
        x,
        w_q,
        scales,
        mode=mode,
        transpose=transpose,
        group_size=group_size,
        lhs_indices=lhs,
        rhs_indices=rhs,
        kernel=kernel,
        device=NAX_DEVICE if kernel == "nax" else "applegpu_g16s",
    )
    assert run.plan["kernel"] == host_name
    reference = gather_reference(x, w_q, scales, lhs, rhs, mode, transpose, group_size)
    assert relative_error(mx.array(run.y), reference) < TOLERANCE[x.dtype]


MODES = ["mxfp4", "nvfp4", "mxfp8", "fp4", "fp8"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", TYPES.values(), ids=TYPES.keys())
@pytest.mark.parametrize("kernel", ["qmv", "mma"])
@pytest.mark.parametrize("transpose", [True, False], ids=["x@W.T", "x@W"])
def test_modes_and_dtypes(mode, dtype, kernel, transpose):
    # Float-scale modes get scales of x's dtype from a w of that dtype.
    w_q, scales = quantized((64, 96), mode, dtype=dtype)
    K = 96 if transpose else 64
    x = mx.random.normal((5, K)).astype(dtype)
    check(x, w_q, scales, mode, transpose=transpose, kernel=kernel)


@pytest.mark.parametrize("mode", ["fp4", "fp8"])
@pytest.mark.parametrize("group_size", [16, 64, 128])
@pytest.mark.parametrize("kernel", ["qmv", "mma"])
@pytest.mark.parametrize("transpose", [True, False], ids=["x@W.T", "x@W"])
def test_group_sizes_and_scale_dtypes(mode, group_size, kernel, transpose):
    scale_dtype = {16: mx.float16, 64: mx.bfloat16, 128: mx.float32}[group_size]
    w_q, scales = quantized((128, 256), mode, group_size, dtype=scale_dtype)
    K = 256 if transpose else 128
    x = mx.random.normal((6, K))
    check(x, w_q, scales, mode, transpose=transpose, group_size=group_size, kernel=kernel)


@pytest.mark.parametrize(
    "M,N,K",
    [
        (64, 64, 128),  # full tiles
        (1, 64, 128),  # one row
        (33, 45, 96),  # M and N tails
        (70, 33, 512),  # 64-row tiles with a tail, decode steps past K
    ],
)
@pytest.mark.parametrize("kernel", ["qmv", "mma"])
def test_shapes(M, N, K, kernel):
    w_q, scales = quantized((N, K), "mxfp4")
    x = mx.random.normal((M, K)).astype(mx.float16)
    check(x, w_q, scales, "mxfp4", kernel=kernel)


@pytest.mark.parametrize("mode,K", [("mxfp4", 1088), ("nvfp4", 544), ("mxfp8", 1056)])
@pytest.mark.parametrize("M", [1, 7, 12])
def test_decode_lanes_wrap_past_32_groups(mode, K, M):
    """The decode lanes take whole groups, lane l groups l, l + 32, ...: K of
    33 or 34 groups wraps one or two lanes and leaves the rest one group;
    N = 21 leaves a part-filled simdgroup of outputs."""
    w_q, scales = quantized((21, K), mode)
    x = mx.random.normal((M, K)).astype(mx.float16)
    run = check(x, w_q, scales, mode, kernel="qmv")
    assert traffic(run, "scales")["bytes_read"] == scales.nbytes * math.ceil(M / 8)


@pytest.mark.parametrize("case", list(NONFINITE_CASES))
@pytest.mark.parametrize("transpose", [True, False], ids=["x@W.T", "x@W"])
def test_decode_nonfinite_scales_and_codes(case, transpose):
    """The CPU path's cases: the decode kernels scale a chunk's sum by a finite
    scale but each code by a non-finite one, so NaN and ±inf land where
    dequantize-then-matmul puts them. M = 9 takes two blocks of x rows."""
    w_q, scales, mode = nonfinite_case(case)
    rows, cols = w_q.shape[0], w_q.shape[1] * 32 // BITS[mode]
    x = nonfinite_x(9, cols if transpose else rows, mx.float16)
    run = run_metal(x, w_q, scales, mode=mode, transpose=transpose, kernel="qmv")
    with np.errstate(invalid="ignore"):
        reference = qmm_reference(x, w_q, scales, mode, transpose)
    assert_same_values(run.y, reference)


@pytest.mark.parametrize("kernel", ["qmv", "mma"])
@pytest.mark.parametrize("transpose", [True, False], ids=["x@W.T", "x@W"])
def test_batched(kernel, transpose):
    w_q, scales = quantized((3, 64, 96), "mxfp8")  # one matrix per batch element
    K = 96 if transpose else 64
    x = mx.random.normal((2, 1, 5, K))  # broadcast against w's batch
    run = check(x, w_q, scales, "mxfp8", transpose=transpose, kernel=kernel)
    assert run.y.shape[:2] == (2, 3)
    assert run.plan["buffers"][10] == ("int64[]", [5 * K, 0])  # x: broadcast along axis 1


def test_broadcast_weights():
    w_q, scales = quantized((1, 64, 96), "mxfp4")
    x = mx.random.normal((4, 7, 96))
    run = check(x, w_q, scales, "mxfp4", kernel="mma")
    assert run.plan["buffers"][11] == ("int64[]", [0])


def test_vector_x_and_folded_rows():
    w_q, scales = quantized((40, 64), "fp8")
    check(mx.random.normal((64,)), w_q, scales, "fp8")
    check(mx.random.normal((2, 3, 4, 64)), w_q, scales, "fp8", kernel="mma")


@pytest.mark.parametrize("kernel", ["qmv", "mma"])
@pytest.mark.parametrize("transpose", [True, False], ids=["x@W.T", "x@W"])
def test_global_scale(kernel, transpose):
    w = mx.random.normal((64, 96))
    global_scale = mx.abs(w).max()
    w_q, scales = mlx_fpqmm.quantize(w, mode="nvfp4", global_scale=global_scale)
    K = 96 if transpose else 64
    x = mx.random.normal((3, K)).astype(mx.bfloat16)
    check(x, w_q, scales, "nvfp4", transpose=transpose, global_scale=global_scale, kernel=kernel)


def check_nax(x, w_q, scales, mode, *, group_size=None, global_scale=None, **kwargs):
    """check() for the NAX path (its plan must choose NAX), against the same
    MLX reference and tolerances as every other path."""
    kwargs.setdefault("device", NAX_DEVICE)
    kwargs.setdefault("kernel", "nax")
    assert kwargs.pop("transpose", True), "the NAX kernels compute x @ W.T"
    run = check(x, w_q, scales, mode, group_size=group_size, global_scale=global_scale, **kwargs)
    assert run.plan["path"] == "nax"
    return run


def test_auto_path_on_each_generation():
    w_q, scales = quantized((64, 128), "mxfp4")
    x = mx.random.normal((16, 128))
    paths = {
        device: check(x, w_q, scales, "mxfp4", device=device).plan["path"]
        for device in ("applegpu_g13s", "applegpu_g16s", "applegpu_g17s", "applegpu_g18p")
    }
    assert paths == {
        "applegpu_g13s": "mma",
        "applegpu_g16s": "mma",
        "applegpu_g17s": "qmv",
        "applegpu_g18p": "qmv",
    }


def test_metal_qmm_returns_numpy_and_refuses_missing_kernels():
    w_q, scales = quantized((32, 64), "mxfp4")
    x = np.random.default_rng(0).standard_normal((2, 64), dtype=np.float32)
    y = metal_qmm(x, w_q, scales, mode="mxfp4")
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 32)
    with pytest.raises(RuntimeError, match="NAX kernel was requested .* cannot run"):
        metal_qmm(x, w_q, scales, mode="mxfp4", device="applegpu_g16s", kernel="nax")


def test_empty_x():
    w_q, scales = quantized((32, 64), "mxfp4")
    assert metal_qmm(mx.zeros((0, 64)), w_q, scales, mode="mxfp4").shape == (0, 32)


# Device traffic from the simulator's counters against the compulsory bytes.
def traffic(run, name):
    buffers = run.plan["buffers"]
    index = next(i for i, value in buffers.items() if value == ("operand", name))
    return run.counters["buffers"][index]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("M,transpose", [(1, True), (8, True), (20, True), (1, False), (3, False)])
def test_decode_reads_weights_and_scales_once(mode, M, transpose):
    """Once per block of x rows (8 for x @ W.T; x @ W takes up to 3 in one),
    x once per simdgroup's 4 outputs (x @ W.T)."""
    w_q, scales = quantized((48, 256), mode)
    x = mx.random.normal((M, 256 if transpose else 48))
    run = check(x, w_q, scales, mode, transpose=transpose, kernel="qmv")
    blocks = math.ceil(M / 8) if transpose else 1
    for name, array in (("w", w_q), ("scales", scales)):
        counted = traffic(run, name)
        assert counted["unique_bytes_read"] == array.nbytes, name
        assert counted["bytes_read"] == array.nbytes * blocks, name
    if transpose:
        assert traffic(run, "x")["bytes_read"] == x.nbytes * 48 // 4
    y = traffic(run, "y")
    assert y["bytes_written"] == y["unique_bytes_written"] == run.y.size * x.itemsize


def test_decode_runs_fewer_instructions_than_mlx():
    """Issue #14: per output element, the decode kernel executes no more
    instructions than the kernel MLX 0.32.4 picks (qmv_fast at M = 1,
    qmv_wide at M = 8), measured side by side in the simulator, and reads no
    more device bytes and runs no more SIMD collectives."""
    try:
        mlx_metal.mlx_metal_wheel()
    except mlx_metal.MlxMetalUnavailable as e:
        pytest.skip(str(e))
    rows = bench_metal.vs_mlx_rows(
        ["mxfp4"], ["float16"], [1, 8], [(512, 512)], mlx_metal.Device("applegpu_g16s")
    )
    for M, (theirs, ours) in zip((1, 8), zip(rows[::2], rows[1::2], strict=True), strict=True):
        assert (theirs["side"], ours["side"], ours["M"]) == ("MLX", "ours", M)
        assert theirs["kernel"] == ("qmv_fast" if M == 1 else "qmv_wide nv4")
        for measure in ("instructions", "w_read", "scales_read", "x_read", "simd_collectives"):
            assert ours["per_output"][measure] <= theirs["per_output"][measure], (M, measure)


@pytest.mark.parametrize("M,block_m", [(20, 32), (100, 64)])
@pytest.mark.parametrize("K,splits", [(256, 2), (128, 1)])
def test_mma_traffic_follows_the_tiling(M, block_m, K, splits):
    """W moves once per row tile and x once per column tile, split K or not
    (K = 128 is too short to split); split K adds its float32 partial sums,
    once each way."""
    N = 96
    w_q, scales = quantized((N, K), "mxfp4")
    x = mx.random.normal((M, K)).astype(mx.float16)
    run = check(x, w_q, scales, "mxfp4", kernel="mma")
    assert run.plan["block_m"] == block_m and run.plan["split_k"] == splits
    m_tiles, n_tiles = math.ceil(M / block_m), math.ceil(N / 32)
    assert traffic(run, "w")["bytes_read"] == w_q.nbytes * m_tiles
    assert traffic(run, "scales")["bytes_read"] == scales.nbytes * m_tiles
    assert traffic(run, "x")["bytes_read"] == x.nbytes * n_tiles
    assert traffic(run, "y")["bytes_written"] == M * N * x.itemsize
    if splits > 1:
        partials = traffic(run, "partials")
        assert partials["bytes_written"] == partials["unique_bytes_written"] == splits * M * N * 4
        assert partials["bytes_read"] == splits * M * N * 4
    # 8x8x8 products: one per (8-row, 8-column, 8-deep) block of valid output.
    assert run.counters["simdgroup_matrix_ops"] == math.ceil(M / 8) * (N // 8) * (K // 8)


@pytest.mark.parametrize(
    "mode,group_size,K,scale_dtype",
    [
        ("mxfp4", None, 1056, None),  # 33 groups over 4 splits of 288
        ("nvfp4", None, 544, None),  # 4 splits of 160, the last 64
        ("mxfp8", None, 672, None),
        ("fp4", 128, 640, mx.bfloat16),  # splits of whole 128-groups
        ("fp8", 16, 400, mx.float16),  # the last split ends inside a K block
    ],
)
@pytest.mark.parametrize("dtype", TYPES.values(), ids=TYPES.keys())
def test_split_k_sums_every_slice(mode, group_size, K, scale_dtype, dtype):
    """Split K against the reference: every split's K slice lands in its own
    partial sums and each is added once (a wrong slice offset, a skipped or
    doubled split, a tail past K all show)."""
    w_q, scales = quantized((72, K), mode, group_size, dtype=scale_dtype or mx.float32)
    x = mx.random.normal((40, K)).astype(dtype)
    run = check(x, w_q, scales, mode, group_size=group_size, kernel="mma")
    assert run.plan["split_k"] > 2
    assert run.plan["kernel"].startswith("fpqmm_mma_t_split_k_bm64_")


def test_split_k_global_scale():
    w_q, scales = quantized((64, 512), "nvfp4")
    x = mx.random.normal((64, 512)).astype(mx.float16)
    run = check(x, w_q, scales, "nvfp4", global_scale=mx.array(3.5), kernel="mma")
    assert run.plan["split_k"] > 1


def test_traffic_report():
    from fpqmm_dev.bench_metal import measure, report

    cases = [
        ("mxfp4", True, "qmv", 2, 64, 256),
        ("mxfp8", True, "mma", 40, 64, 128),
        ("mxfp4", True, "nax", 40, 64, 128),
        ("mxfp4", True, "mma", 64, 64, 512),  # few tiles, K long enough: split K
    ]
    text = report(cases)
    for kernel in ("qmv_bm8_e2m1", "mma_t_bm64_e4m3", "nax_t_bm64_e2m1", "mma_t_split_k_bm64_e2m1"):
        assert f"fpqmm_{kernel}_float16" in text
    # the split's float32 partials: each written once and read back once
    run, _ = measure("mxfp4", True, "mma", 64, 64, 512)
    split_k = run.plan["split_k"]
    assert split_k > 1
    partials = next(line for line in text.splitlines() if "partials" in line).split()
    assert int(partials[partials.index("partials") + 1]) == 2 * 4 * 64 * 64 * split_k
