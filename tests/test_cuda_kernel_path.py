"""The CUDA plan as kernel_path shows it for a named compute capability: no GPU
needed. Which rows take the decode kernels, the simple path and dequantize +
matmul (or, for a gather, the pairs grouped by expert or dequantize +
gather_mm), and what forcing a path does."""

import sys

import mlx.core as mx
import pytest

import mlx_fpqmm

pytestmark = pytest.mark.skipif(
    sys.platform == "darwin", reason="on a Mac kernel_path plans for Metal"
)

N, K = 4096, 4096


@pytest.fixture(autouse=True)
def tf32_as_by_default(monkeypatch):
    """The plans below are those of MLX_ENABLE_TF32's default (on)."""
    monkeypatch.delenv("MLX_ENABLE_TF32", raising=False)


def path(
    x_shape, kernel=None, w_batch=(), dtype=mx.float32, device="sm_90", mode="mxfp4", **kwargs
):
    """The plan of x (zeros of x_shape) times an N x K W of `mode` (mxfp4 or mxfp8)."""
    bits = 8 if mode == "mxfp8" else 4
    w = mx.zeros((*w_batch, N, K * bits // 32), mx.uint32)
    scales = mx.zeros((*w_batch, N, K // 32), mx.uint8)
    return mlx_fpqmm.kernel_path(
        mx.zeros(x_shape, dtype), w, scales, mode=mode, device=device, kernel=kernel, **kwargs
    )


@pytest.mark.parametrize(
    "x_shape, expected",
    [
        ((1, K), "qmv"),
        ((16, K), "qmv"),
        ((17, K), "tiled"),
        ((64, K), "tiled"),
        ((65, K), "dequantize_matmul"),
        ((4096, K), "dequantize_matmul"),
        # With 2-D weights every leading axis of x counts as rows.
        ((2, 33, K), "dequantize_matmul"),
    ],
)
def test_rows_choose_the_path(x_shape, expected):
    """float32 x on sm_80: past the decode rows split once into bfloat16 parts of
    twice the rows for fp_qmm's block tiles, up to 64 rows (half its 128; on sm_90
    fp_qmm_wgmma takes them: below)."""
    plan = path(x_shape, device="sm_80")
    assert plan["path"] == expected, plan["note"]
    if expected == "tiled":
        assert plan["x_split"] is not None and plan["kernel"].endswith(
            "_float32_x32" if x_shape[0] <= 32 else "_float32_x64"
        )
    if expected == "dequantize_matmul":
        assert plan["kernel"] == "fpqmm_dequantize_e2m1_e8m0_float32"
        # A word of 8 codes per thread over W's 4096 x 4096 codes, up to 16
        # blocks per SM of the A100's 108.
        assert plan["grid"] == (108 * 16, 1, 1)
        assert plan["block"] == (256, 1, 1)


@pytest.mark.parametrize(
    "M, expected",
    [
        (9, "qmv"),
        (17, "wgmma"),
        (40, "wgmma"),
        (41, "wgmma"),
        (512, "wgmma"),
        (513, "dequantize_matmul"),
    ],
)
def test_hopper_float32_rows_take_wgmma_in_parts(M, expected, monkeypatch):
    """float32 x past the decode rows on sm_90: split once into bfloat16 high and
    low parts, twice the rows, for fp_qmm_wgmma up to 512 rows (half its 1,024
    with E2M1 codes); not at 9 rows of 4096 x 4096 (its 18 rows of parts are the
    simple path's) nor past 512. With MLX_ENABLE_TF32=0, dequantize + matmul in
    float32 past the simple path's 40 rows."""
    plan = path((M, K))
    assert plan["path"] == expected, plan["note"]
    assert (plan.get("x_split") is not None) == (expected == "wgmma")
    if expected == "wgmma":
        assert plan["kernel"].startswith("fpqmm_qmm_wgmma_e2m1_e8m0_float32_")
        assert plan["x_split_bytes"] == 2 * M * K * 2
        assert "split once into bfloat16 high and low parts" in plan["note"]
    monkeypatch.setenv("MLX_ENABLE_TF32", "0")
    assert path((M, K))["path"] == ("dequantize_matmul" if M > 40 else expected)


def test_hopper_float32_e4m3_rows_take_wgmma_to_384():
    assert path((384, K), mode="mxfp8")["path"] == "wgmma"
    assert path((385, K), mode="mxfp8")["path"] == "dequantize_matmul"


@pytest.mark.parametrize(
    "M, expected, kernel",
    [
        (17, "tiled", "fpqmm_qmm_e2m1_e8m0_bfloat16_x32"),
        (64, "tiled", "fpqmm_qmm_e2m1_e8m0_bfloat16_x32"),
        (65, "tiled", "fpqmm_qmm_e2m1_e8m0_bfloat16_x64"),
        (128, "tiled", "fpqmm_qmm_e2m1_e8m0_bfloat16_x64"),
        (129, "dequantize_matmul", "fpqmm_dequantize_e2m1_e8m0_bfloat16"),
    ],
)
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bf16", "f16"])
def test_rows_take_block_tiles_before_hopper(M, expected, kernel, dtype):
    """bfloat16 and float16 x above the decode rows on sm_80 (and float16 x on
    sm_90): fp_qmm's block tiles of 32 or 64 rows of x up to 128 rows,
    dequantize + matmul past them."""
    plan = path((M, K), dtype=dtype, device="sm_80" if dtype == mx.bfloat16 else "sm_90")
    name = "float16" if dtype == mx.float16 else "bfloat16"
    assert plan["path"] == expected, plan["note"]
    assert plan["kernel"] == kernel.replace("bfloat16", name)
    if expected == "tiled":
        assert plan["block"] == (128, 1, 1)
        assert plan["grid"][0] == N // 128


@pytest.mark.parametrize(
    "rows, n, kernel, grid, block",
    [
        (1, 8417, "fpqmm_qmv_wide_e2m1_e8m0_bfloat16_x8", 264, 128),
        (1, 8416, "fpqmm_qmv_e2m1_e8m0_bfloat16_x8", 526, 256),
        (16, 8417, "fpqmm_qmv_wide_e2m1_e8m0_bfloat16_x16", 264, 128),
        (9, 8416, "fpqmm_qmv_e2m1_e8m0_bfloat16_x16", 526, 256),
    ],
)
def test_decode_takes_wide_blocks_where_they_half_fill_the_gpu(rows, n, kernel, grid, block):
    """Up to 8 rows of x (one x block) or 16 (two) on the H200's 132 SMs: 4-warp
    blocks of 32 W rows from 264 of them (half its 528 slots), else 8-warp blocks
    of 16 rows; never split."""
    w = mx.zeros((n, K // 8), mx.uint32)
    scales = mx.zeros((n, K // 32), mx.uint8)
    x = mx.zeros((rows, K), mx.bfloat16)
    plan = mlx_fpqmm.kernel_path(x, w, scales, mode="mxfp4", device="sm_90")
    assert plan["path"] == "qmv", plan["note"]
    assert plan["kernel"] == kernel
    assert plan["grid"] == (grid, 1, 1) and plan["block"] == (block, 1, 1)
    assert plan["split_k"] == 1


@pytest.mark.parametrize(
    "mode, rows, dtype, device, shared",
    [
        ("fp8", 1, mx.bfloat16, "sm_90", True),
        ("fp8", 4, mx.float16, "sm_90", True),
        ("fp4", 1, mx.bfloat16, "sm_90", True),
        ("fp8", 5, mx.bfloat16, "sm_90", False),
        ("fp4", 5, mx.float16, "sm_90", False),
        ("fp8", 1, mx.bfloat16, "sm_80", False),
        ("mxfp8", 1, mx.bfloat16, "sm_90", False),
    ],
)
def test_wide_decode_blocks_take_x_in_shared_memory(mode, rows, dtype, device, shared):
    """The wide decode blocks of float-scale weights copy x into shared memory on
    sm_90 (up to 32 KB of 16-bit x: 4 rows of 4096), never with byte scales."""
    n, bits = 9000, 8 if mode.endswith("8") else 4
    w = mx.zeros((n, K * bits // 32), mx.uint32)
    scale_type = mx.float16 if mode in ("fp4", "fp8") else mx.uint8
    scales = mx.zeros((n, K // 32), scale_type)
    plan = mlx_fpqmm.kernel_path(mx.zeros((rows, K), dtype), w, scales, mode=mode, device=device)
    assert plan["kernel"].startswith("fpqmm_qmv_wide_"), plan["kernel"]
    assert plan["x_in_shared"] == shared, plan["note"]
    assert ("x in shared memory" in plan["note"]) == shared


@pytest.mark.parametrize(
    "M, expected, kernel",
    [
        (16, "qmv", "fpqmm_qmv_e2m1_e8m0_bfloat16_x16"),
        (17, "simple", "fpqmm_qmv_e2m1_e8m0_bfloat16_x32"),
        (32, "simple", "fpqmm_qmv_e2m1_e8m0_bfloat16_x32"),
        (33, "wgmma", "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x64_w128"),
        (64, "wgmma", "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x64_w128"),
        (65, "wgmma", "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x128_w128"),
        (512, "wgmma", "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x128_w128"),
        (1024, "wgmma", "fpqmm_qmm_wgmma_e2m1_e8m0_bfloat16_x256_w128"),
        (1025, "dequantize_matmul", "fpqmm_dequantize_e2m1_e8m0_bfloat16"),
    ],
)
def test_hopper_rows_take_wgmma(M, expected, kernel):
    """bfloat16 x on sm_90: Hopper's warpgroup MMA past the decode rows up to 1024 with E2M1
    codes (blocks of 64 rows of x up to 64 rows, then 128 or 256), after a launch that lays x
    out in its tiles of 128 rows; dequantize + matmul past them. Up to 32 rows of a W whose
    4096 rows make too few of wgmma's blocks, the decode kernel in blocks of 32 rows of x."""
    plan = path((M, K), dtype=mx.bfloat16)
    assert plan["path"] == expected, plan["note"]
    assert plan["kernel"] == kernel
    if expected == "wgmma":
        assert plan["block"] == (256, 1, 1)
        assert plan["x_tiles"]["kernel"] == "fpqmm_wgmma_tile_x_e2m1"
        assert plan["x_tiles_bytes"] == -(-M // 128) * 128 * K * 2
    else:
        assert plan.get("x_tiles") is None


@pytest.mark.parametrize("M, expected", [(768, "wgmma"), (769, "dequantize_matmul")])
def test_hopper_e4m3_rows_take_wgmma_to_768(M, expected):
    """With E4M3 codes (mxfp8) dequantize + matmul takes over from 769 rows."""
    plan = path((M, K), dtype=mx.bfloat16, mode="mxfp8")
    assert plan["path"] == expected, plan["note"]


def test_wgmma_request():
    assert path((4096, K), kernel="wgmma", dtype=mx.bfloat16)["path"] == "wgmma"
    plan = path((256, K), kernel="wgmma", dtype=mx.float16)
    assert plan["path"] == "tiled"
    assert "wgmma requested, not taken: float16 x" in plan["note"]
    plan = path((256, K), kernel="wgmma", dtype=mx.bfloat16, device="sm_80")
    assert "wgmma requested, not taken: not sm_90" in plan["note"]


def test_tiled_request():
    """float32 x takes fp_qmm in bfloat16 parts, but not with batched weights."""
    assert path((4096, K), kernel="tiled", dtype=mx.bfloat16)["path"] == "tiled"
    plan = path((4096, K), kernel="tiled")
    assert plan["path"] == "tiled" and plan["x_split"] is not None
    plan = path((2, 64, K), w_batch=(2,), kernel="tiled")
    assert plan["path"] == "simple"
    assert "tiled requested, not taken: float32 x" in plan["note"]


def test_batched_weights_count_rows_per_matrix():
    assert path((2, 30, K), w_batch=(2,))["path"] == "simple"
    assert path((2, 50, K), w_batch=(2,))["path"] == "dequantize_matmul"


def test_kernel_argument_overrides_the_environment(monkeypatch):
    """kernel= is the request; MLX_FPQMM_KERNEL (here a Metal name) is not read then."""
    monkeypatch.setenv("MLX_FPQMM_KERNEL", "mma")
    assert path((4096, K), kernel="simple")["path"] == "simple"
    with pytest.raises(ValueError, match="MLX_FPQMM_KERNEL='mma'"):
        path((4096, K))


def test_vector_x_gives_a_vector_row():
    assert path((K,))["output_shape"] == (N,)
    assert path((3, K))["output_shape"] == (3, N)


def test_requests_force_the_path():
    assert path((4096, K), kernel="simple")["path"] == "simple"
    assert path((1, K), kernel="dequantize")["path"] == "dequantize_matmul"
    assert path((4096, K), kernel="qmv")["path"] == "qmv"
    with pytest.raises(ValueError, match="dequantize"):
        path((1, K), kernel="nax")


def gather_path(
    pairs,
    experts=32,
    M=1,
    sorted_indices=True,
    kernel=None,
    lhs=False,
    NK=(2880, 2880),
    mode="mxfp4",
    dtype=mx.float32,
    device="sm_90",
):
    """A gather over `experts` (N, K) experts, mxfp4 (or fp4 with float16 scales
    in groups of 16): x (pairs, M, K) in `dtype`, indices (pairs,)."""
    n, k = NK
    group_size, scale_dtype = (32, mx.uint8) if mode == "mxfp4" else (16, mx.float16)
    w = mx.zeros((experts, n, k // 8), mx.uint32)
    scales = mx.zeros((experts, n, k // group_size), scale_dtype)
    extra = {"lhs_indices": mx.arange(pairs)} if lhs else {}
    return mlx_fpqmm.kernel_path(
        mx.zeros((pairs, M, k), dtype),
        w,
        scales,
        mode=mode,
        group_size=group_size,
        rhs_indices=mx.zeros((pairs,), mx.uint32),
        sorted_indices=sorted_indices,
        device=device,
        kernel=kernel,
        **extra,
    )


@pytest.mark.parametrize("pairs, expected", [(6143, "grouped"), (6144, "dequantize_matmul")])
@pytest.mark.parametrize("sorted_indices", [True, False], ids=["sorted", "unsorted"])
def test_gather_dequantizes_from_192_rows_an_expert(pairs, expected, sorted_indices):
    plan = gather_path(pairs, sorted_indices=sorted_indices)
    assert plan["path"] == expected, plan["note"]
    if expected == "dequantize_matmul":
        assert "gather_mm" in plan["note"]
        assert ("sorted first" in plan["note"]) == (not sorted_indices)
        assert plan["kernel"] == "fpqmm_dequantize_e2m1_e8m0_float32"
        assert plan["grid"] == (132 * 16, 1, 1)


@pytest.mark.parametrize(
    "pairs, kernel",
    [
        (32 * 12 - 1, "fpqmm_qmv_grouped_e2m1_e8m0_bfloat16_x8"),
        (32 * 12, "fpqmm_qmm_grouped_e2m1_e8m0_bfloat16_x32"),
        (32 * 64, "fpqmm_qmm_grouped_e2m1_e8m0_bfloat16_x64"),
        (32 * 2048 - 1, "fpqmm_qmm_grouped_e2m1_e8m0_bfloat16_x64"),
    ],
)
def test_bfloat16_gather_takes_block_tiles(pairs, kernel):
    """bfloat16 x before Hopper: the grouped runs by fp_qmm_grouped from 12 pairs an
    expert (runs of 64 from 64 an expert), dequantize + gather_mm only from 2048 an
    expert."""
    plan = gather_path(pairs, dtype=mx.bfloat16, device="sm_80")
    assert plan["path"] == "grouped", plan["note"]
    assert plan["kernel"] == kernel
    plan = gather_path(32 * 2048, dtype=mx.bfloat16, device="sm_80")
    assert plan["path"] == "dequantize_matmul"


@pytest.mark.parametrize(
    "pairs, kernel",
    [
        (32 * 48 - 1, "fpqmm_qmm_grouped_e2m1_e8m0_bfloat16_x32"),
        (32 * 48, "fpqmm_qmm_wgmma_grouped_e2m1_e8m0_bfloat16_x128_w256"),
        (32 * 2048 * 4, "fpqmm_qmm_wgmma_grouped_e2m1_e8m0_bfloat16_x128_w256"),
    ],
)
def test_bfloat16_gather_takes_wgmma_on_hopper(pairs, kernel):
    """bfloat16 x on sm_90: Hopper's warpgroup MMA over runs of up to 128 pairs from
    48 pairs an expert, whose x a first launch gathers into tiles; never dequantize +
    gather_mm by default."""
    plan = gather_path(pairs, dtype=mx.bfloat16)
    assert plan["path"] == "grouped", plan["note"]
    assert plan["kernel"] == kernel
    assert (plan["x_tiles"] is not None) == ("wgmma" in kernel)


@pytest.mark.parametrize(
    "case",
    [
        dict(M=2),  # the grouped GEMM takes one row per pair
        dict(lhs=True),  # the op keeps the primitive with lhs_indices
        dict(experts=1025, pairs=1025 * 192),  # past MLX's grouped GEMM's 1024 groups
        # Every expert dequantized would be 160 * 1536 * 5120 * 2 bytes: past the
        # grouped GEMM's 2 GiB.
        dict(experts=160, pairs=160 * 192, NK=(1536, 5120)),
    ],
    ids=["rows", "lhs", "experts", "bytes"],
)
def test_gather_keeps_the_kernels(case):
    case = {"pairs": 8192, **case}  # 256 rows an expert: dequantized otherwise
    assert gather_path(8192)["path"] == "dequantize_matmul"
    assert gather_path(**case)["path"] != "dequantize_matmul"


def test_sorted_indices_repeated_by_a_broadcast_are_sorted_first():
    """x's batch (2, 4096) against sorted indices (4096,): the pairs' indices run
    through them twice, so they are not sorted pairs."""
    w = mx.zeros((32, 2880, 2880 // 8), mx.uint32)
    scales = mx.zeros((32, 2880, 2880 // 32), mx.uint8)
    plan = mlx_fpqmm.kernel_path(
        mx.zeros((2, 4096, 1, 2880)),
        w,
        scales,
        mode="mxfp4",
        rhs_indices=mx.sort(mx.arange(4096) % 32).astype(mx.uint32),
        sorted_indices=True,
        device="sm_90",
    )
    assert plan["path"] == "dequantize_matmul" and "sorted first" in plan["note"]


def test_gather_dequantize_request():
    assert gather_path(8, M=3, kernel="dequantize")["path"] == "dequantize_matmul"
    assert gather_path(8, lhs=True, kernel="dequantize")["path"] != "dequantize_matmul"
    # Past a grid axis of pairs MLX's gather_mm takes only the grouped GEMM.
    big = gather_path(65536, M=2, kernel="dequantize", NK=(64, 64))
    assert big["path"] != "dequantize_matmul"
    assert gather_path(4096, kernel="simple")["path"] != "dequantize_matmul"


@pytest.mark.parametrize(
    "pairs, expected",
    [
        (4, "qmv"),
        (7, "qmv"),
        (8, "grouped"),
        (32, "grouped"),
        (33, "grouped"),
        (64, "grouped"),
        (255, "grouped"),
        (256, "grouped"),
        (384, "grouped"),
        (512, "grouped"),
    ],
)
def test_gather_groups_pairs_by_expert_from_8_pairs(pairs, expected):
    """Pairs of one row each: below 8 the per-pair decode kernels, then grouped
    by expert: the grouping launch first (up to 32 pairs, none: each block
    groups them), then blocks of 4 warps that walk the tiles of 32 W rows of
    every run of up to 8 pairs (16 from 12 pairs an expert), run by run, or
    tile by tile where the experts average a run of pairs or more."""
    plan = gather_path(pairs, sorted_indices=False)
    assert plan["path"] == expected, plan["note"]
    if expected == "qmv":
        assert plan["grouping"] is None and plan["grouping_bytes"] == 0
        return
    run_rows = 16 if pairs >= 12 * 32 else 8
    assert plan["kernel"] == f"fpqmm_qmv_grouped_e2m1_e8m0_float32_x{run_rows}"
    runs = -(-pairs // run_rows) + min(33, pairs)
    # The blocks that run at once (4 an SM, 2 with runs of 16), or one per
    # tile of 32 W rows and run where those are fewer.
    blocks_at_once = 132 * (4 if run_rows == 8 else 2)
    assert plan["grid"] == (min(2880 // 32 * runs, blocks_at_once), 1, 1)
    assert plan["block"] == (128, 1, 1)
    assert plan["tile_major_shares"] == (pairs >= run_rows * 32)
    if pairs <= 32:
        # A warp of each block groups them: no grouping launch, no scratch.
        assert plan["grouping"] is None and plan["grouping_bytes"] == 0
        assert "grouped in each block" in plan["note"]
        return
    assert plan["grouping"]["kernel"] == "fpqmm_group_pairs"
    assert plan["grouping"]["grid"] == (1, 1, 1)
    assert plan["grouping_bytes"] == 16 + 16 * runs + 4 * pairs


def test_gather_grouped_requests():
    assert gather_path(64, kernel="qmv")["path"] == "qmv"
    assert gather_path(4, kernel="grouped")["path"] == "grouped"
    # Two rows a pair: the grouped kernel takes one.
    plan = gather_path(64, M=2, kernel="grouped")
    assert plan["path"] == "qmv"
    assert plan["note"].startswith("grouped requested, not taken: M=2 rows per pair")
    assert gather_path(64, kernel="grouped", lhs=True)["path"] == "grouped"


@pytest.mark.parametrize("pairs, expected", [(383, "qmv"), (384, "dequantize_matmul")])
def test_gather_without_the_grouped_path_dequantizes_from_12_rows_an_expert(pairs, expected):
    """fp4's float scales in groups of 16: the per-pair kernels (W staged),
    against which dequantize + gather_mm wins from 12 rows an expert; a grouped
    request plans as automatic there."""
    for kernel in (None, "grouped"):
        plan = gather_path(pairs, kernel=kernel, mode="fp4")
        assert plan["path"] == expected, plan["note"]
    if expected == "dequantize_matmul":
        assert "at least 12 an expert" in plan["note"]


def test_decode_splits_float32_x_in_two_parts_once():
    """float32 x of up to 8 rows times 8 MiB of W or more: split once into
    bfloat16 high and low parts (fp_split_x), which bfloat16's kernel
    multiplies as twice the rows, adding each row's two as it stores y (with K
    split, into partials that the reduction adds up); more rows, less W, or
    float16 x with float scales: each pass splits its chunk of x."""
    w = mx.zeros((N, K // 8), mx.uint32)
    scales = mx.zeros((N, K // 32), mx.uint8)
    for M in (1, 4, 5, 8):
        plan = mlx_fpqmm.kernel_path(mx.zeros((M, K)), w, scales, mode="mxfp4", device="sm_90")
        assert plan["path"] == "qmv", plan["note"]
        assert plan["kernel"].endswith("_bfloat16_x8" if M <= 4 else "_bfloat16_x16")
        assert plan["x_split"]["kernel"] == "fpqmm_split_x_float32"
        assert plan["x_split_bytes"] == 2 * M * K * 2
        assert plan["split_k"] == 1
        assert plan["reduction"] is None and plan["partials_bytes"] == 0
        assert "split once into bfloat16 high and low parts" in plan["note"]
    plan = mlx_fpqmm.kernel_path(mx.zeros((9, K)), w, scales, mode="mxfp4", device="sm_90")
    assert plan["x_split"] is None and plan["kernel"].endswith("_float32_x16")
    small = mlx_fpqmm.kernel_path(
        mx.zeros((1, K)), w[:1024], scales[:1024], mode="mxfp4", device="sm_90"
    )
    assert small["x_split"] is None and small["kernel"].endswith("_float32_x8")
    half = mlx_fpqmm.kernel_path(
        mx.zeros((1, K), mx.float16),
        w,
        mx.zeros((N, K // 32), mx.float16),
        mode="fp4",
        device="sm_90",
    )
    assert half["x_split"] is None and half["kernel"].endswith("_float16_x8")
    # K split (mxfp8 1024 x 8192, 8 MiB): the parts' partials, which the
    # reduction adds up.
    long = mlx_fpqmm.kernel_path(
        mx.zeros((1, 8192)),
        mx.zeros((1024, 8192 // 4), mx.uint32),
        mx.zeros((1024, 8192 // 32), mx.uint8),
        mode="mxfp8",
        device="sm_90",
    )
    assert long["x_split"]["kernel"] == "fpqmm_split_x_float32" and long["split_k"] > 1
    assert long["reduction"]["kernel"] == "fpqmm_split_k_sum_float32"
    assert long["partials_bytes"] == long["split_k"] * 2 * 1024 * 4
