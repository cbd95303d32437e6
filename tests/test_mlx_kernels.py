"""MLX's own fp-quantized Metal kernels (the mlx-metal wheel's headers) in the
simulator, planned and dispatched as MLX's host code does (fpqmm_dev.mlx_metal),
against the NumPy reference. Keeps the simulator able to run them.

Every kernel family MLX's quantized_matmul picks (qmv_quad, qmv_fast, qmv,
qmv_wide, qmm_t, qmm_t_splitk with gemm_splitk_accum, qmm_t_nax) runs at least
once, each mode and each dtype several times: a representative matrix, not the
cross product (each kernel is a build of MLX's headers, about 2 s cold).
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from fpqmm_dev import bench_metal, mlx_metal
from fpqmm_dev.mlx_metal import Device, mlx_plan, qmv_batch_limit, run_mlx
from metal_sim import KernelError
from reference import qmm_reference, relative_error

G16 = Device("applegpu_g16s")
G17 = Device("applegpu_g17s")
# Tighter than the suite's TOLERANCE: MLX accumulates in float and rounds once.
TOLERANCE = {mx.float32: 1e-6, mx.float16: 2.5e-4, mx.bfloat16: 2e-3}


@pytest.fixture(scope="module", autouse=True)
def mlx_headers():
    try:
        return mlx_metal.mlx_metal_wheel()
    except mlx_metal.MlxMetalUnavailable as e:
        pytest.skip(str(e))


# (mode, dtype, M, N, K, device, forced kernel, the family MLX runs)
CASES = [
    ("mxfp4", mx.float16, 1, 64, 512, G17, "auto", "qmv_fast"),
    ("nvfp4", mx.bfloat16, 1, 40, 1024, G16, "auto", "qmv_fast"),
    ("mxfp8", mx.float32, 1, 24, 256, G17, "auto", "qmv_fast"),
    ("mxfp4", mx.bfloat16, 1, 20, 320, G17, "auto", "qmv"),  # N % 8, K % 512
    ("mxfp8", mx.float16, 3, 64, 128, G17, "auto", "qmv_quad"),
    ("nvfp4", mx.float16, 7, 36, 256, G17, "auto", "qmv_wide"),
    ("mxfp8", mx.bfloat16, 4, 64, 512, G16, "auto", "qmv_wide"),
    ("mxfp4", mx.float16, 40, 96, 512, G17, "auto", "qmm_t_splitk"),
    ("nvfp4", mx.bfloat16, 20, 64, 256, G16, "auto", "qmm_t_splitk"),
    ("mxfp8", mx.float16, 33, 80, 256, G16, "qmm_t", "qmm_t"),  # partial tiles
    ("mxfp4", mx.float32, 40, 64, 512, G16, "qmm_t", "qmm_t"),
    ("mxfp4", mx.bfloat16, 20, 128, 256, G17, "nax", "qmm_t_nax"),  # bm 32
    ("mxfp8", mx.float32, 70, 64, 128, G17, "nax", "qmm_t_nax"),  # bm 64, M tail
    ("nvfp4", mx.float16, 64, 96, 256, G17, "nax", "qmm_t_nax"),  # N tail
]


@pytest.mark.parametrize(
    ("mode", "dtype", "M", "N", "K", "device", "kernel", "family"),
    CASES,
    ids=[f"{c[7]}-{c[0]}-{str(c[1]).split('.')[-1]}-M{c[2]}" for c in CASES],
)
def test_mlx_kernel_matches_reference(mode, dtype, M, N, K, device, kernel, family):
    w_q, scales = mx.quantize(mx.random.normal((N, K)), mode=mode)
    x = mx.random.normal((M, K)).astype(dtype)
    run = run_mlx(x, w_q, scales, mode=mode, device=device, kernel=kernel)
    assert run.plan.kernel == family
    error = relative_error(mx.array(run.y), qmm_reference(x, w_q, scales, mode))
    assert error < TOLERANCE[dtype], (run.plan.dispatches[-1].host_name, error)
    # The last dispatch writes each output element exactly once.
    y_index = next(i for i, v in run.plan.dispatches[-1].buffers.items() if v == "y")
    written = run.counters[-1]["buffers"][y_index]
    assert written["unique_bytes_written"] == written["bytes_written"] == M * N * x.itemsize


def test_qmv_quad_reads_scales_past_n():
    """MLX 0.32.4's qmv_quad reads the scale of each of its 64 rows before its
    row bound check (fp_quantized.h, fp_qmv_quad_impl): past N when N % 64 != 0."""
    w_q, scales = mx.quantize(mx.random.normal((32, 128)), mode="mxfp8")
    x = mx.random.normal((1, 128)).astype(mx.float16)
    out_of_bounds = r"fp_quantized\.h:\d+: out-of-bounds read .* of buffer\(1\)"
    with pytest.raises(KernelError, match=out_of_bounds):
        run_mlx(x, w_q, scales, mode="mxfp8", device=G17)


def test_qmv_batch_limit_follows_mlx():
    assert [qmv_batch_limit(k, k, G17) for k in (2048, 4096, 8192)] == [33, 25, 13]
    assert [qmv_batch_limit(k, k, G16) for k in (2048, 4096, 8192)] == [13, 15, 13]
    assert qmv_batch_limit(512, 512, Device("applegpu_g15d")) == 32
    assert qmv_batch_limit(4096, 512, Device("applegpu_g14g")) == 10


def test_plan_follows_mlx_choice():
    # Decode below the limit; qmv_wide's tiles of at most five vectors.
    assert mlx_plan("mxfp4", mx.float16, 32, 512, 512, G17).kernel == "qmv_wide"
    wide = mlx_plan("mxfp4", mx.float16, 8, 512, 512, G17).dispatches[0]
    assert wide.host_name == "mxfp4_qmv_wide_float16_t_gs_32_b_4_nv_4_kl_16_batch_0"
    assert wide.grid == (2, 128, 1)
    # Split-K first: 512 // tiles, capped by K / 32 and K's divisibility.
    split = mlx_plan("mxfp4", mx.float16, 64, 512, 512, G17)
    assert split.kernel == "qmm_t_splitk" and split.partials == (16, 64, 512)
    assert split.dispatches[0].buffers[7] == 32 and split.dispatches[1].threads == (512, 64, 1)
    assert mlx_plan("mxfp8", mx.bfloat16, 64, 512, 96, G16).partials == (3, 64, 512)
    # Too many tiles to split: NAX on generation 17 (bm 64 above M = 32), else qmm_t.
    nax = mlx_plan("mxfp4", mx.float16, 512, 2112, 512, G17)
    assert nax.kernel == "qmm_t_nax"
    assert nax.dispatches[0].host_name.endswith("_bm64_bn64_bk64_wm2_wn2_alN_true_batch_0")
    assert nax.dispatches[0].grid == (33, 8, 1)
    assert mlx_plan("mxfp4", mx.float16, 512, 2112, 512, G16).kernel == "qmm_t"
    assert mlx_plan("mxfp4", mx.float16, 512, 2112, 512, Device("applegpu_g17p")).kernel == (
        "qmm_t"
    )
    assert (
        mlx_plan("nvfp4", mx.float16, 1, 4096, 4096, G17).dispatches[0].host_name
        == "nvfp4_qmv_fast_float16_t_gs_16_b_4_batch_0_pr_0_hgs_0_r_2"
    )
    with pytest.raises(ValueError, match="NAX"):
        mlx_plan("mxfp4", mx.float16, 64, 512, 512, G16, kernel="nax")


def test_vs_mlx_report_on_a_tiny_problem(tmp_path, capsys):
    """python -m fpqmm_dev.bench_metal --vs-mlx: one prefill problem on a
    generation-17 GPU gives MLX's pick (split-K), ours and MLX's NAX kernel,
    each matching the reference, with every measure per output element."""
    rows_file = tmp_path / "rows.json"
    bench_metal.main(["--vs-mlx", "--m", "64", "--sizes", "64x256", "--json", str(rows_file)])
    rows = json.loads(rows_file.read_text())
    assert [(r["side"], r["choice"]) for r in rows][:2] == [("MLX", "pick"), ("ours", "pick")]
    assert rows[0]["kernel"] == "qmm_t_splitk x8 +accum"
    assert any(r["side"] == "MLX" and r["kernel"] == "qmm_t_nax bm64" for r in rows)
    table = capsys.readouterr().out
    for r in rows:
        assert r["error"] < TOLERANCE[mx.float16], r
        measures = r["per_output"]
        assert set(measures) >= {"w_read", "x_unique", "threadgroup_barriers", "float", "memory"}
        assert measures["matrix_macs"] == 256  # K multiply-adds per output: whole tiles
        assert measures["y_written"] == 2  # each float16 output once
        assert measures["float"] > 0 and measures["integer"] > 0
        assert r["kernel"] in table
    split_k = rows[0]["per_output"]
    assert split_k["partials"] == 8 * 4 * 2  # 8 float partials written and read
