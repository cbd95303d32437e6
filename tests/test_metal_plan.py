"""The Metal plan (csrc/backend/metal/plan.cpp) on fake devices: path choice by GPU
generation, NAX gating, the MLX_FPQMM_KERNEL override and the dispatch shapes."""

import sys

import mlx.core as mx
import pytest

import mlx_fpqmm
from mlx_fpqmm import _ext


def problem(M, N=256, K=256, mode="mxfp4", transpose=True, dtype=mx.float16, batch=()):
    w = mx.zeros((*batch, N, K) if transpose else (*batch, K, N), dtype=mx.float32)
    w_q, scales = mlx_fpqmm.quantize(w, mode=mode)
    x = mx.zeros((*batch, M, K), dtype=dtype)
    return x, w_q, scales


def path_of(M, N, K, device, transpose=True, macos="26.2", kernel="auto", nax_built=False):
    return _ext._metal_choose_path(M, N, K, transpose, device, macos, kernel, nax_built)[0]


# (device, K = N, the decode limit MLX's table gives): decode below it, MMA from it.
DECODE_LIMITS = [
    ("applegpu_g13s", 2048, 14),
    ("applegpu_g13s", 4096, 10),
    ("applegpu_g13s", 8192, 6),
    ("applegpu_g14g", 8192, 6),
    ("applegpu_g13d", 2048, 32),
    ("applegpu_g13d", 4096, 18),
    ("applegpu_g16s", 2048, 13),
    ("applegpu_g16s", 4096, 15),
    ("applegpu_g16s", 8192, 13),
    ("applegpu_g17s", 2048, 33),
    ("applegpu_g17s", 4096, 25),
    ("applegpu_g17s", 8192, 13),
    ("applegpu_g18p", 4096, 25),
    ("applegpu_g12g", 2048, 18),
]


@pytest.mark.parametrize("device,size,limit", DECODE_LIMITS)
def test_decode_below_the_generation_limit(device, size, limit):
    assert path_of(limit - 1, size, size, device) == "qmv"
    assert path_of(limit, size, size, device) == "mma"


def test_decode_limit_uses_the_larger_of_k_and_n():
    assert path_of(20, 2048, 8192, "applegpu_g17s") == "mma"  # limit 13
    assert path_of(20, 2048, 2048, "applegpu_g17s") == "qmv"  # limit 33


def test_transpose_false_decodes_below_four_rows():
    assert path_of(3, 256, 256, "applegpu_g17s", transpose=False) == "qmv"
    assert path_of(4, 256, 256, "applegpu_g17s", transpose=False) == "mma"


@pytest.mark.parametrize(
    "device,macos,expected",
    [
        ("applegpu_g17s", "26.2", "nax"),
        ("applegpu_g17g", "27.0", "nax"),
        ("applegpu_g17s", "26.1", "mma"),
        ("applegpu_g17s", "15.7", "mma"),
        ("applegpu_g16s", "26.2", "mma"),
        ("applegpu_g13s", "26.2", "mma"),
        ("applegpu_g17p", "26.2", "mma"),  # phone-class GPUs need generation 18
        ("applegpu_g18p", "26.2", "nax"),
    ],
)
def test_nax_gate_by_generation_and_os(device, macos, expected):
    assert path_of(64, 4096, 4096, device, macos=macos, nax_built=True) == expected


def test_nax_needs_built_kernels_and_transpose_but_no_k_multiple_of_64():
    assert path_of(64, 4096, 4096, "applegpu_g17s") == "mma"  # not built
    assert path_of(64, 4096, 4096, "applegpu_g17s", transpose=False, nax_built=True) == "mma"
    # K tails of 16, 32 or 48: the kernel steps through K by 16.
    assert path_of(64, 4096, 4096 + 16, "applegpu_g17s", nax_built=True) == "nax"


def test_float32_takes_nax_only_with_tf32(monkeypatch):
    args = dict(device="applegpu_g17s", macos="26.2")
    plan = mlx_fpqmm.kernel_path(*problem(64, dtype=mx.float32), **args)
    assert plan["path"] == "nax" and plan["kernel"] == "fpqmm_nax_t_split_k_bm64_e2m1_float32"
    monkeypatch.setenv("MLX_ENABLE_TF32", "0")
    plan = mlx_fpqmm.kernel_path(*problem(64, dtype=mx.float32), **args)
    assert plan["path"] == "mma" and "MLX_ENABLE_TF32=0" in plan["note"]
    assert mlx_fpqmm.kernel_path(*problem(64), **args)["path"] == "nax"  # float16
    with pytest.raises(RuntimeError, match="cannot run: float32 x"):
        mlx_fpqmm.kernel_path(*problem(64, dtype=mx.float32), kernel="nax", **args)


def test_kernel_path_assumes_a_nax_build_off_macos():
    # On a Mac the installed metallibs decide; elsewhere the device is hypothetical.
    plan = mlx_fpqmm.kernel_path(*problem(64), device="applegpu_g17s", macos="26.2")
    if sys.platform == "darwin" and plan["path"] == "mma":
        assert "no NAX kernels" in plan["note"]
    else:
        assert plan["path"] == "nax" and plan["library"] == "mlx_fpqmm_nax"
        assert plan["kernel"] == "fpqmm_nax_t_split_k_bm64_e2m1_float16"


@pytest.mark.parametrize("kernel", ["qmv", "mma"])
def test_forced_kernel(kernel):
    for M in (1, 100):
        plan = mlx_fpqmm.kernel_path(*problem(M), device="applegpu_g16s", kernel=kernel)
        assert plan["path"] == kernel and plan["requested"] == kernel


@pytest.mark.parametrize(
    "device,macos,transpose,reason",
    [
        ("applegpu_g16s", "26.2", True, "older than generation 17"),
        ("applegpu_g17p", "26.2", True, "older than generation 18"),
        ("applegpu_g17s", "26.1", True, "macOS 26.1 is older than 26.2"),
        ("applegpu_g17s", "26.2", False, "no NAX kernel for transpose=False"),
    ],
)
def test_forced_nax_errors_where_it_cannot_run(monkeypatch, device, macos, transpose, reason):
    x, w_q, scales = problem(64, transpose=transpose)
    args = dict(transpose=transpose, device=device, macos=macos)
    with pytest.raises(RuntimeError, match=f"requested .* cannot run: .*{reason}"):
        mlx_fpqmm.kernel_path(x, w_q, scales, kernel="nax", **args)
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "nax")
    with pytest.raises(RuntimeError, match=reason):
        mlx_fpqmm.kernel_path(x, w_q, scales, **args)


def test_forced_nax_runs_below_the_decode_limit():
    plan = mlx_fpqmm.kernel_path(
        *problem(1, K=128), device="applegpu_g18p", macos="26.2", kernel="nax"
    )
    assert plan["path"] == "nax" and plan["kernel"] == "fpqmm_nax_t_bm32_e2m1_float16"


def test_environment_override(monkeypatch):
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "mma")
    assert mlx_fpqmm.kernel_path(*problem(1), device="applegpu_g16s")["path"] == "mma"
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "qmv")
    assert mlx_fpqmm.kernel_path(*problem(500), device="applegpu_g16s")["path"] == "qmv"
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "auto")
    assert mlx_fpqmm.kernel_path(*problem(1), device="applegpu_g16s")["path"] == "qmv"
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "fast")
    with pytest.raises(ValueError, match="MLX_FPQMM_KERNEL='fast'"):
        mlx_fpqmm.kernel_path(*problem(1), device="applegpu_g16s")


def test_bad_arguments():
    with pytest.raises(ValueError, match="kernel='gemv'"):
        mlx_fpqmm.kernel_path(*problem(1), device="applegpu_g16s", kernel="gemv")
    with pytest.raises(ValueError, match="macOS version"):
        mlx_fpqmm.kernel_path(*problem(1), device="applegpu_g16s", macos="tahoe")
    with pytest.raises(ValueError, match="macos='13.5' is older than MLX's oldest macOS, 14.0"):
        mlx_fpqmm.kernel_path(*problem(1), device="applegpu_g16s", macos="13.5")
    x, w_q, scales = problem(1)
    with pytest.raises(ValueError, match="scales must have shape"):
        mlx_fpqmm.kernel_path(x, w_q, scales[:, :1], device="applegpu_g16s")


# N = 256 and K as given (K = 256: two splits of K at most, 128 none).
@pytest.mark.parametrize(
    "M,transpose,kernel,name,grid,K",
    [
        (1, True, "auto", "fpqmm_qmv_bm8_e2m1_float16", (1, 32, 1), 256),
        (8, True, "auto", "fpqmm_qmv_bm8_e2m1_float16", (1, 32, 1), 256),
        (9, True, "qmv", "fpqmm_qmv_bm8_e2m1_float16", (2, 32, 1), 256),
        (40, True, "qmv", "fpqmm_qmv_bm8_e2m1_float16", (5, 32, 1), 256),
        (2, False, "auto", "fpqmm_qvm_bm4_e2m1_float16", (1, 1, 1), 256),
        (20, True, "mma", "fpqmm_mma_t_split_k_bm32_e2m1_float16", (8, 1, 2), 256),
        (33, True, "mma", "fpqmm_mma_t_split_k_bm64_e2m1_float16", (8, 1, 2), 256),
        (200, True, "mma", "fpqmm_mma_t_split_k_bm64_e2m1_float16", (8, 4, 2), 256),
        (200, True, "mma", "fpqmm_mma_t_bm64_e2m1_float16", (8, 4, 1), 128),
        (200, False, "mma", "fpqmm_mma_n_bm32_e2m1_float16", (8, 7, 1), 256),
        (20, True, "nax", "fpqmm_nax_t_split_k_bm32_e2m1_float16", (4, 1, 2), 256),
        (20, True, "nax", "fpqmm_nax_t_bm32_e2m1_float16", (4, 1, 1), 128),
        (33, True, "nax", "fpqmm_nax_t_split_k_bm64_e2m1_float16", (4, 1, 2), 256),
        (200, True, "auto", "fpqmm_nax_t_split_k_bm64_e2m1_float16", (4, 4, 2), 256),
    ],
)
def test_kernel_and_grid(M, transpose, kernel, name, grid, K):
    device = "applegpu_g17s" if "nax" in name else "applegpu_g16s"
    plan = mlx_fpqmm.kernel_path(
        *problem(M, K=K, transpose=transpose),
        transpose=transpose,
        device=device,
        macos="26.2",
        kernel=kernel,
    )
    assert plan["kernel"] == name
    assert plan["grid"] == grid
    assert plan["library"] == ("mlx_fpqmm_nax" if "nax" in name else "mlx_fpqmm")


@pytest.mark.parametrize(
    "device,M,N,K,group_size,splits",
    [
        # 16 tiles against 2 x 40 cores: 5 wanted, 4 fit K = 512 (128 each).
        ("applegpu_g16s", 64, 512, 512, 32, 4),
        # 2 x 16 cores of the largest base/Pro M1: 2 splits of 256.
        ("applegpu_g13g", 64, 512, 512, 32, 2),
        ("applegpu_g13d", 64, 512, 4096, 32, 8),
        # Group size 128: splits are whole groups (3 of 128, 128 and 128).
        ("applegpu_g16s", 64, 512, 384, 128, 3),
        # K = 1008 over 5: steps of 224 (a multiple of 32), the last 112.
        ("applegpu_g16s", 64, 512, 1008, 16, 5),
        # Enough tiles (8 x 16 = 128 >= 80), or K too short to split.
        ("applegpu_g16s", 512, 1024, 4096, 32, 1),
        ("applegpu_g16s", 64, 512, 224, 32, 1),
    ],
)
def test_split_k_fills_the_cores(device, M, N, K, group_size, splits):
    mode = "mxfp4" if group_size == 32 else "fp4"
    w_q, scales = mlx_fpqmm.quantize(mx.zeros((N, K)), group_size, mode=mode)
    x = mx.zeros((M, K), dtype=mx.float16)
    plan = mlx_fpqmm.kernel_path(
        x, w_q, scales, group_size=group_size, mode=mode, device=device, kernel="mma"
    )
    assert plan["split_k"] == splits
    assert plan["grid"][2] == splits
    if splits == 1:
        assert "split_k" not in plan["kernel"] and plan["reduction"] is None
        return
    assert plan["kernel"] == "fpqmm_mma_t_split_k_bm64_e2m1_float16"
    assert f"split_k={splits}" in plan["note"]
    assert plan["partials_elements"] == splits * M * N
    step = dict((index, value) for index, (kind, value) in plan["buffers"].items())[18]
    assert (splits - 1) * step < K <= splits * step
    assert step % max(32, group_size) == 0
    reduction = plan["reduction"]
    assert reduction["kernel"] == "fpqmm_split_k_sum_float16"
    assert reduction["buffers"][19] == ("int32", splits)


@pytest.mark.parametrize("device", ["applegpu_g13s", "applegpu_g17s"])
@pytest.mark.parametrize("N,K", [(0, 0), (0, 64)])
def test_empty_output_plans_no_split(device, N, K):
    # Enough rows for the MMA and NAX tiles, no output columns: no tiles to
    # split (a division by their count crashed the process, found by
    # tests/fuzz_ops.py).
    w = mx.zeros((N, K // 8), mx.uint32)
    scales = mx.zeros((N, K // 32), mx.uint8)
    x = mx.zeros((72, K), mx.float16)
    plan = mlx_fpqmm.kernel_path(x, w, scales, mode="mxfp4", device=device)
    assert plan["path"] in ("mma", "nax")
    assert plan["grid"][0] == 0 and plan["split_k"] == 1 and plan["reduction"] is None


def test_split_k_only_for_one_transposed_matrix():
    for transpose, batch in ((False, ()), (True, (2,))):
        plan = mlx_fpqmm.kernel_path(
            *problem(64, 512, 512, transpose=transpose, batch=batch),
            transpose=transpose,
            device="applegpu_g16s",
            kernel="mma",
        )
        assert plan["split_k"] == 1 and plan["reduction"] is None


def test_threadgroup_memory_fits_and_is_aligned():
    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        for M, transpose, kernel in [
            (200, True, "mma"),
            (200, False, "mma"),
            (2, False, "qmv"),
            (200, True, "nax"),
        ]:
            plan = mlx_fpqmm.kernel_path(
                *problem(M, transpose=transpose, dtype=dtype),
                transpose=transpose,
                device="applegpu_g17s",
                macos="26.2",
                kernel=kernel,
            )
            sizes = plan["threadgroup_memory"].values()
            assert sizes and all(size % 16 == 0 for size in sizes)
            assert sum(sizes) <= 32 * 1024


def test_constants_and_bindings():
    x, w_q, scales = problem(4, mode="nvfp4")
    plan = mlx_fpqmm.kernel_path(
        x, w_q, scales, mode="nvfp4", global_scale=mx.array(3.0), device="applegpu_g16s"
    )
    assert plan["constants"] == {100: 16, 101: 1, 102: True}
    assert plan["pipeline"] == plan["kernel"] + "_c100_16_c101_1_c102_1"
    buffers = plan["buffers"]
    assert [buffers[i] for i in range(5)] == [
        ("operand", "w"),
        ("operand", "scales"),
        ("operand", "global_scale"),
        ("operand", "x"),
        ("operand", "y"),
    ]
    assert (buffers[5], buffers[6], buffers[7]) == (
        ("int32", 4),
        ("int32", 256),
        ("int32", 256),
    )
    w = mx.zeros((256, 256), dtype=mx.bfloat16)
    w_q, scales = mlx_fpqmm.quantize(w, mode="fp8", group_size=64)
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, mode="fp8", group_size=64, device="applegpu_g16s")
    assert plan["constants"] == {100: 64, 101: 4, 102: False}
    assert 2 not in plan["buffers"]


def test_batched_plan_folds_or_batches():
    # 2-D weights: every leading dimension of x folds into M.
    x = mx.zeros((2, 3, 5, 256), dtype=mx.float16)
    _, w_q, scales = problem(1)
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, device="applegpu_g16s")
    assert plan["buffers"][5] == ("int32", 30) and plan["buffers"][8] == ("int32", 0)
    # Batched weights broadcast against x's leading dimensions.
    _, w_q, scales = problem(1, batch=(3,))
    plan = mlx_fpqmm.kernel_path(x, w_q, scales, device="applegpu_g16s")
    assert plan["grid"][2] == 6
    assert plan["buffers"][8] == ("int32", 2)
    assert plan["buffers"][9] == ("int32[]", [2, 3])
