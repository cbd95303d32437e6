"""The benchmark's options, rows, tables and targets (the GPU benchmark's graphs too), on
tiny shapes (fast)."""

import json
import sys
import types
from dataclasses import asdict

import mlx.core as mx
import numpy as np
import pytest
from fpqmm_dev import ggml_glue

import mlx_fpqmm
from mlx_fpqmm import bench


@pytest.fixture(autouse=True)
def cpu_benchmark(monkeypatch):
    """The CPU benchmark's tables and options, also where a GPU would make --device gpu
    the default (the GPU tests patch it back)."""
    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)


TINY = ["--reps", "1", "--mlx-budget", "0", "--idle", "0.01", "--cycle-bytes", "65536"]
TINY += ["--min-time", "0.01"]


def columns(line: str) -> list[int]:
    """Where a table line's column separators are."""
    return [i for i, c in enumerate(line) if c == "|"]


def test_defaults_cover_issue_13():
    args = bench.parse_args([])
    assert {1, 2, 4, 8, 16}.issubset(args.rows) and {128, 512}.issubset(args.rows)
    assert args.tail_ks == [2816, 2848, 2880, 2944, 3008, 3072] and args.tail_n == 2048
    assert args.cycle_bytes == 3 * bench.L3_BYTES and not args.vs_ggml and not args.tails
    args = bench.parse_args(["--rows", "1,3", "--shapes", "64x256,32x128", "--vs-ggml"])
    assert args.rows == [1, 3] and args.shapes == [(64, 256), (32, 128)] and args.vs_ggml


def test_small_rows_cycle_weights_beyond_the_cache():
    args = bench.parse_args([])
    weight_bytes = 4096 * 4096 * 17 // 32  # mxfp4 4096 x 4096
    copies = bench.copies_to_cycle(1, weight_bytes, args)
    assert copies * weight_bytes >= 3 * bench.L3_BYTES > (copies - 1) * weight_bytes
    assert bench.copies_to_cycle(bench.SMALL_M, weight_bytes, args) == copies
    assert bench.copies_to_cycle(bench.SMALL_M + 1, weight_bytes, args) == 1


@pytest.mark.parametrize("vs_ggml", [False, True])
def test_rows_format_under_the_header(vs_ggml):
    args = bench.parse_args([*TINY, "--modes", "mxfp4"])
    slow = bench.Extrapolator(args.mlx_budget)
    single = bench.bench_row(1, 32, 128, "mxfp4", "float32", args, slow)
    double = bench.bench_row(2, 32, 128, "mxfp4", "float32", args, slow)
    # 32 x 128 mxfp4 is 2176 bytes: M <= 16 cycles through 65536 / 2176 -> 31 copies.
    assert single.after_idle is not None and double.after_idle is None
    bench.derive(single, bandwidth=1e10, sgemm=1e11, single=single)
    bench.derive(double, bandwidth=1e10, sgemm=1e11, single=single)
    assert single.derived["time_vs_m1"] == 1.0
    assert double.derived["time_vs_m1"] == double.ours.best / single.ours.best
    assert single.derived["after_idle_vs_steady"] == single.after_idle.best / single.ours.best
    head = bench.header(vs_ggml)
    for row in (single, double):
        line = bench.format_row(row, vs_ggml)
        assert columns(line) == columns(head), (head, line)
        assert line.split()[:4] == [str(row.M), "32x128", "mxfp4", "float32"]
    assert ("ggml*" in bench.legend(vs_ggml)) == vs_ggml
    json.dumps(asdict(single))


def row_with(M: int, dtype: str, **derived: float) -> bench.Row:
    timing = bench.Timing(1e-3, 1e-3)
    row = bench.Row(M, 4096, 4096, "mxfp4", dtype, 1, timing, None, None, timing)
    row.derived.update(derived)
    return row


def test_targets_name_the_worst_row_and_the_verdict():
    rows = [
        row_with(1, "bfloat16", bandwidth_fraction=0.91, speedup_vs_mx_qmm=120),
        row_with(1, "float32", bandwidth_fraction=0.84, speedup_vs_mx_qmm=25),
        row_with(8, "bfloat16", bandwidth_fraction=0.1, time_vs_m1=2.5),
        row_with(8, "float32", bandwidth_fraction=0.1, time_vs_m1=2.7),
    ]
    lines = bench.targets(rows, bandwidth=1e10, sgemm=1e11)
    expected = [
        "M=1 bfloat16: at least 91.0% of read bandwidth in every row (worst mxfp4 "
        "4096x4096; target 90%) met",
        "M=8 bfloat16: at most 2.50x the M=1 time in every product (worst mxfp4 "
        "4096x4096; target 2.6x) met",
        "M=1 bfloat16: at least 120.0x mx.quantized_matmul (worst mxfp4 4096x4096; "
        "target 100x) met",
        "M=1 float32: at least 84.0% of read bandwidth in every row (worst mxfp4 "
        "4096x4096; target 85%) MISSED",
        "M=8 float32: at most 2.70x the M=1 time in every product (worst mxfp4 "
        "4096x4096; target 2.6x) MISSED",
        "M=1 float32: at least 25.0x mx.quantized_matmul (worst mxfp4 4096x4096; target 20x) met",
    ]
    assert [line for line in lines if line.startswith("M=")] == expected


def test_tails_table(capsys):
    args = bench.parse_args(
        [*TINY, "--modes", "mxfp4,nvfp4", "--dtypes", "bfloat16", "--tail-n", "32"]
        + ["--tail-ks", "256,288,320"]
    )
    rows, lines = bench.tails_main(args, None, None)
    assert [(r.mode, r.K) for r in rows] == [
        (mode, K) for mode in ("mxfp4", "nvfp4") for K in (256, 288, 320)
    ]
    for mode in ("mxfp4", "nvfp4"):
        group = [r for r in rows if r.mode == mode]
        assert min(r.derived["vs_best_k"] for r in group) == 1.0
        for r in group:
            assert r.derived["ns_per_byte"] == pytest.approx(r.ours.best / r.weight_bytes * 1e9)
    assert [line.split(":")[0] for line in lines] == [
        "tails mxfp4 bfloat16",
        "tails nvfp4 bfloat16",
    ]
    table = capsys.readouterr().out.splitlines()
    assert len([line for line in table if line.split()[:1] in (["mxfp4"], ["nvfp4"])]) == 6


def test_ggml_missing_is_skipped_with_the_reason(monkeypatch, capsys):
    def missing():
        raise ggml_glue.GgmlUnavailable("ggml-python is not importable (test)")

    monkeypatch.setattr(ggml_glue, "load", missing)
    assert bench.ggml_setup(bench.parse_args(["--vs-ggml"]), None) is None
    assert capsys.readouterr().out == "ggml rows skipped: ggml-python is not importable (test)\n"
    assert bench.ggml_setup(bench.parse_args([]), None) is None


def test_ggml_glue_missing_is_skipped_with_the_reason(monkeypatch, capsys):
    """Without the development tools (an installed wheel), --vs-ggml says what to install."""
    monkeypatch.setitem(sys.modules, "fpqmm_dev", None)  # imports of it now fail
    assert bench.ggml_setup(bench.parse_args(["--vs-ggml"]), None) is None
    out = capsys.readouterr().out
    assert out.startswith("ggml rows skipped: --vs-ggml needs mlx_fpqmm's development tools")
    assert "pip install -e 'tools/fpqmm_dev[ggml]'" in out


def test_ggml_columns_when_installed():
    try:
        ggml_glue.load()
    except ggml_glue.GgmlUnavailable as error:
        pytest.skip(str(error))
    args = bench.parse_args([*TINY, "--modes", "mxfp4,nvfp4"])
    weights = bench.make_weights(1, 32, 128, "mxfp4", args)
    times = bench.bench_ggml(1, weights, args)
    assert times.plain is not None and times.repacked is not None and not times.notes
    weights = bench.make_weights(1, 32, 128, "nvfp4", args)
    times = bench.bench_ggml(1, weights, args)
    assert times.plain is not None and times.repacked is None
    assert "repacked" in times.notes[0]
    assert np.isfinite(times.plain.best)


def test_gpu_bench_times_every_column_over_graphs_of_the_same_size(monkeypatch):
    """Ours, MLX's and the dense product (or ``mx.gather_qmm``) are each timed over a graph
    of at least ``--graph-products`` products: dense bfloat16 timed over fewer (as many as
    1 GB of its larger copies held) once made our speed-ups over it look larger."""
    from mlx_fpqmm import _bench_gpu

    sizes, chains = [], []

    def record(products, x, reps, chained=False):
        sizes.append(len(products))
        chains.append(chained)
        mx.eval(products[-1](x))  # the last one cycles back through the copies
        return _bench_gpu.Timing(1e-6, 1e-6)

    monkeypatch.setattr(_bench_gpu, "time_graph", record)
    # The GPU benchmark's options, set past parse_args (which refuses them on the CPU).
    args = bench.parse_args([])
    args.graph_bytes, args.graph_products = 20000, 7
    row = _bench_gpu.bench_row(1, 64, 128, "mxfp4", "bfloat16", args)
    assert row.mlx is not None and row.dense is not None
    # Copies: 64 x 128 mxfp4 is 4,352 bytes (5 copies), bfloat16 16,384 (2).
    assert sizes == [7, 7, 7]
    assert chains == [False] * 3
    sizes.clear()
    chains.clear()
    moe = ["--moe-shape", "64x64", "--experts", "4", "--top-k", "2"]
    args = bench.parse_args(moe)
    args.graph_bytes, args.graph_products, args.chain = 1, 5, True
    rows = _bench_gpu.bench_moe(3, "mxfp4", "bfloat16", args)
    assert [r.layout for r in rows] == ["unsorted", "sorted"] and sizes == [5, 5, 5, 5]
    # --chain reaches every column's graphs.
    assert chains == [True] * 4
    assert _bench_gpu.cycled([1, 2, 3], 2) == [1, 2, 3]
    assert _bench_gpu.cycled([1, 2], 5) == [1, 2, 1, 2, 1]


def test_gpu_bench_chains_products_through_views():
    """--chain: each product reads, as its x, a view of the output before (so that the
    GPU runs them in order), in both MoE layouts too; an output smaller than x is refused."""
    from mlx_fpqmm import _bench_gpu

    x = mx.random.normal((3, 64))
    w, s = _bench_gpu.quantized_weights(96, 64, "mxfp4")
    products = [lambda x, w=w, s=s: mlx_fpqmm.quantized_matmul(x, w, s, mode="mxfp4")] * 3
    outputs = _bench_gpu.graph_outputs(products, x, chained=True)
    for before, after in zip(outputs[:-1], outputs[1:], strict=True):
        first_values = mx.array(np.array(before).ravel()[: x.size].reshape(x.shape))
        expected = mlx_fpqmm.quantized_matmul(first_values, w, s, mode="mxfp4")
        assert mx.array_equal(after, expected)
    independent = _bench_gpu.graph_outputs(products, x, chained=False)
    assert all(mx.array_equal(y, independent[0]) for y in independent)
    assert not mx.array_equal(outputs[1], outputs[0])
    experts = mlx_fpqmm.quantize(_bench_gpu.random_weights((4, 64, 64)), mode="mxfp4")
    chosen = _bench_gpu.routes(5, 4, 2, 2, seed=0)
    for xs, indices, is_sorted in _bench_gpu.moe_layouts(chosen, 64, mx.float32).values():
        cases = [(experts, i) for i in indices]
        products = _bench_gpu.gather_products(mlx_fpqmm.gather_qmm, cases, "mxfp4", is_sorted)
        first, second = _bench_gpu.graph_outputs(products, xs, chained=True)
        first_values = np.array(first).ravel()[: xs.size].reshape(xs.shape)
        assert mx.array_equal(second, products[1](mx.array(first_values)))
    with pytest.raises(ValueError, match="--chain needs N >= K"):
        _bench_gpu.view_as(mx.zeros((1, 32)), mx.zeros((1, 64)))


def test_float_scale_modes_and_moe_json(tmp_path, capsys):
    """fp4 / fp8 rows have no MLX baseline (MLX lacks the modes) instead of failing the
    run, and --moe writes its rows to --json."""
    rows = tmp_path / "rows.json"
    bench.main([*TINY, "--mlx-budget", "1", "--shapes", "64x128", "--rows", "1", "--modes",
                "mxfp4,fp8", "--dtypes", "float32", "--json", str(rows)])  # fmt: skip
    by_mode = {row["mode"]: row for row in json.loads(rows.read_text())["rows"]}
    assert by_mode["mxfp4"]["mlx_qmm"] is not None and by_mode["fp8"]["mlx_qmm"] is None
    moe = tmp_path / "moe.json"
    bench.main([*TINY, "--moe", "--moe-shape", "64x128", "--experts", "4", "--top-k", "2",
                "--modes", "mxfp4", "--dtypes", "float32", "--tokens", "1,3", "--json",
                str(moe)])  # fmt: skip
    assert [row["tokens"] for row in json.loads(moe.read_text())["moe"]] == [1, 3]
    for bad in (
        ["--rows", "0"],
        ["--moe", "--tokens", "0"],
        ["--shapes", "64x100"],
        ["--top-k", "40"],
        ["--moe-shape", "64"],
        ["--json", str(tmp_path / "missing" / "x.json")],
        ["--moe", "--plot", "x.png"],
        ["--no-mlx"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert bench.parse_args(["--rows", "1,1,8"]).rows == [1, 8]
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "int4"])
    assert "int4: not one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--graph-products=8", "--no-dense"])
    assert "--graph-products, --no-dense: not an option of --device cpu" in capsys.readouterr().err


def test_cpu_options_are_refused_on_the_gpu(monkeypatch, capsys):
    """The GPU benchmark does not read the CPU's options: naming one is an error, not a
    table that silently ignores it."""
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    assert bench.parse_args(["--device", "gpu", "--moe", "--tokens", "1,8"]).tokens == [1, 8]
    assert bench.parse_args(["--device", "gpu", "--chain", "--shapes", "4096x4096"]).chain
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "gpu", "--chain", "--shapes", "4096x4096,4096x14336"])
    error = capsys.readouterr().err
    assert "--chain: each x is a view of the output before" in error
    assert "N >= K; --shapes has 4096x14336\n" in error
    for option in (o for o in bench.CPU_OPTIONS if o != "--plot"):
        value = {"--vs-ggml": [], "--tails": []}.get(option, ["1"])
        with pytest.raises(SystemExit):
            bench.parse_args(["--device", "gpu", option, *value])
        assert f"{option}: not an option of --device gpu" in capsys.readouterr().err


def test_plot_draws_every_dtype(monkeypatch):
    """--plot draws a series per x dtype the rows have (float16 rows were left out)."""
    drawn = []
    axes = types.SimpleNamespace(
        scatter=lambda *args, label, **kwargs: drawn.append(label),
        **{name: lambda *a, **k: None for name in
           ("plot", "text", "set_xscale", "set_yscale", "set_xlabel", "set_ylabel",
            "set_title", "legend", "grid")},
    )  # fmt: skip
    figure = types.SimpleNamespace(tight_layout=lambda: None, savefig=lambda *a, **k: None)
    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda **kwargs: (figure, axes)
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use, matplotlib.pyplot = lambda backend: None, pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    timing = bench.Timing(1e-3, 1e-3)
    rows = [
        bench.Row(1, 64, 64, "mxfp4", dtype, 2048, timing, timing, None, timing)
        for dtype in ("float32", "float16", "bfloat16")
    ]
    bench.plot("unused.png", rows, 1e10, 1e11)
    assert drawn == [
        f"{label}, {dtype}"
        for dtype in ("float32", "float16", "bfloat16")
        for label in ("ours", "mx.quantized_matmul")
    ]
