"""Tests of the Metal simulator (metal_sim) on kernels written for it (tests/kernels)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from metal_sim import KernelError, Library, MetalCompileError, toolchain
from metal_sim.instrument import instrument
from metal_sim.rewrite import TranslationUnit

KERNELS = Path(__file__).parent / "kernels"
BUGS = str(KERNELS / "bugs.metal")
RNG = np.random.default_rng(0)


def library(name: str, **defines: int) -> Library:
    return Library([KERNELS / f"{name}.metal"], defines=defines)


@pytest.fixture(scope="module")
def primitives() -> Library:
    return library("primitives")


@pytest.fixture(scope="module")
def bugs() -> Library:
    return library("bugs")


@pytest.fixture(scope="module")
def reduce() -> Library:
    return library("simd_reduce")


def line_of(path: str, marker: str) -> int:
    lines = Path(path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def assert_reported(
    error: pytest.ExceptionInfo[KernelError], path: str, marker: str, what: str
) -> None:
    """The error names `path`, the line containing `marker`, and matches `what`."""
    message = str(error.value)
    assert f"{path}:{line_of(path, marker)}" in message, message
    assert re.search(what, message), message


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize(
    ("host_name", "dtype", "tolerance"),
    [
        ("row_sum_float32", np.float32, 1e-4),
        ("row_sum_float16", np.float16, 1e-3),
        ("row_sum_bfloat16", ml_dtypes.bfloat16, 1e-3),
    ],
)
def test_simd_sum_reduction(reduce: Library, host_name: str, dtype: type, tolerance: float) -> None:
    rows, n = 6, 1000
    x = RNG.standard_normal((rows, n)).astype(dtype)
    out = np.full(rows, np.nan, np.float32)
    result = reduce.dispatch(
        host_name, {0: x, 1: out, 2: np.int32(n)}, grid=(rows, 1, 1), threadgroup=(256, 1, 1)
    )
    np.testing.assert_allclose(
        out, x.astype(np.float32).sum(axis=1), rtol=tolerance, atol=tolerance
    )
    counters = result.counters
    assert counters["buffers"][0]["unique_bytes_read"] == x.nbytes
    assert counters["buffers"][1]["unique_bytes_written"] == out.nbytes
    assert counters["threadgroup_barriers"] == rows
    assert counters["threads"] == rows * 256


def test_divergent_collective_mutant_is_caught(bugs: Library) -> None:
    with pytest.raises(KernelError) as error:
        bugs.dispatch(
            "divergent_collective",
            {0: np.zeros(32, np.float32)},
            grid=(1, 1, 1),
            threadgroup=(32, 1, 1),
        )
    assert_reported(
        error,
        BUGS,
        "BUG: divergent collective",
        r"divergent simdgroup operation.*exited the kernel",
    )


def test_out_of_bounds_read_mutant_is_caught(bugs: Library) -> None:
    n = 100
    buffers = {0: np.ones(n, np.float32), 1: np.zeros(n, np.float32), 2: np.uint32(n)}
    with pytest.raises(KernelError) as error:
        bugs.dispatch("out_of_bounds_read", buffers, grid=(1, 1, 1), threadgroup=(n, 1, 1))
    assert_reported(
        error,
        BUGS,
        "BUG: the last thread",
        r"out-of-bounds read of 4 bytes at byte offset 400 of buffer\(0\)",
    )


# ---------------------------------------------------------------- tiled GEMM


def run_gemm(lib: Library, dtype: type, b_transposed: bool, m: int = 64, n: int = 96, k: int = 48):
    a = RNG.standard_normal((m, k)).astype(dtype)
    b = RNG.standard_normal((k, n)).astype(dtype)
    c = np.full((m, n), np.nan, np.float32)
    name = {
        np.float32: "gemm_float32",
        np.float16: "gemm_float16",
        ml_dtypes.bfloat16: "gemm_bfloat16",
    }[dtype]
    buffers = {
        0: a,
        1: b.T.copy() if b_transposed else b,
        2: c,
        3: np.array([m, n, k, 0], np.int32).tobytes(),
    }
    result = lib.dispatch(
        name,
        buffers,
        grid=(n // 32, m // 32, 1),
        threadgroup=(128, 1, 1),
        constants={0: b_transposed},
    )
    return a.astype(np.float32) @ b.astype(np.float32), c, result


@pytest.fixture(scope="module")
def gemm() -> Library:
    return library("tiled_gemm")


@pytest.mark.parametrize("b_transposed", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_tiled_gemm(gemm: Library, dtype: type, b_transposed: bool) -> None:
    expected, c, result = run_gemm(gemm, dtype, b_transposed)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)
    counters = result.counters
    m, n, k = 64, 96, 48
    tiles = (m // 32) * (n // 32)
    assert counters["simdgroup_matrix_ops"] == tiles * 4 * 4 * (k // 8)
    assert counters["threadgroup_barriers"] == tiles * 2 * (k // 16)
    itemsize = np.dtype(dtype).itemsize
    assert counters["buffers"][0]["unique_bytes_read"] == m * k * itemsize
    assert counters["buffers"][0]["bytes_read"] == (n // 32) * m * k * itemsize
    assert counters["buffers"][2]["unique_bytes_written"] == c.nbytes
    assert counters["threadgroup_bytes_written"] == tiles * (k // 16) * 2 * 32 * 16 * itemsize


def test_wrong_fragment_lane_formula_mutant_is_caught() -> None:
    with pytest.raises(KernelError, match=r"tiled_gemm.metal:\d+: out-of-bounds write"):
        run_gemm(library("tiled_gemm", MUTANT_LANE_FORMULA=1), np.float32, False)


def test_wrong_transpose_flag_mutant_is_caught() -> None:
    expected, c, _ = run_gemm(library("tiled_gemm", MUTANT_TRANSPOSE_FLAG=1), np.float32, True)
    assert not np.allclose(c, expected, atol=1e-2)


def test_missing_barrier_mutant_is_caught() -> None:
    path = str(KERNELS / "tiled_gemm.metal")
    with pytest.raises(KernelError) as error:
        run_gemm(library("tiled_gemm", MUTANT_MISSING_BARRIER=1), np.float32, False)
    assert_reported(
        error,
        path,
        "simdgroup_load(af[i]",
        r"read of uninitialized threadgroup array declared at .*tiled_gemm.metal:41",
    )


def test_unwritten_output_element_mutant_is_caught() -> None:
    _, c, result = run_gemm(library("tiled_gemm", MUTANT_UNWRITTEN_ELEMENT=1), np.float32, False)
    assert np.isnan(c).sum() == c.size // 2
    assert result.counters["buffers"][2]["unique_bytes_written"] == c.nbytes // 2


# ---------------------------------------------------------------- primitives


def test_simd_collectives_match_lane_semantics(primitives: Library) -> None:
    x = RNG.integers(-50, 50, 64).astype(np.float32)  # integers: sums are exact in any order
    out = np.full((12, 64), np.nan, np.float32)
    primitives.dispatch("collectives", {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(64, 1, 1))
    lanes = np.arange(32)
    simd = x.reshape(2, 32)

    def per_simdgroup(f) -> np.ndarray:
        return np.concatenate([f(s) for s in simd])

    np.testing.assert_array_equal(out[0], per_simdgroup(lambda s: np.full(32, s.sum())))
    np.testing.assert_array_equal(out[1], per_simdgroup(lambda s: np.full(32, s.max())))
    np.testing.assert_array_equal(out[2], per_simdgroup(lambda s: np.full(32, s.min())))
    np.testing.assert_array_equal(out[3], per_simdgroup(lambda s: s[(lanes * 7) % 32]))
    np.testing.assert_array_equal(out[4], per_simdgroup(lambda s: s[lanes ^ 5]))
    np.testing.assert_array_equal(
        out[5], per_simdgroup(lambda s: np.where(lanes + 3 < 32, s[np.minimum(lanes + 3, 31)], s))
    )
    np.testing.assert_array_equal(
        out[6], per_simdgroup(lambda s: np.where(lanes >= 2, s[np.maximum(lanes - 2, 0)], s))
    )
    np.testing.assert_array_equal(out[7], per_simdgroup(np.cumsum))
    np.testing.assert_array_equal(out[8], per_simdgroup(lambda s: np.cumsum(s) - s))
    np.testing.assert_array_equal(out[9], np.repeat(x.reshape(16, 4).sum(1), 4))
    np.testing.assert_array_equal(out[10], per_simdgroup(lambda s: np.full(32, s[9])))
    np.testing.assert_array_equal(out[11], x.reshape(16, 4)[:, ::-1].reshape(-1))


def test_half_subnormals_fp4_decode(primitives: Library) -> None:
    codes = np.arange(16, dtype=np.uint8)
    out = np.full(16, np.nan, np.float16)
    primitives.dispatch("fp4_decode", {0: codes, 1: out}, grid=(1, 1, 1), threadgroup=(16, 1, 1))
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    np.testing.assert_array_equal(out, np.array(e2m1 + [-v for v in e2m1], np.float16))


def test_literals_vectors_half_and_bfloat(primitives: Library) -> None:
    v = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    out = np.full(8, np.nan, np.float32)
    halves = np.full(2, np.nan, np.float16)
    bfloats = np.full(2, np.nan, ml_dtypes.bfloat16)
    primitives.dispatch(
        "scalars_and_vectors",
        {0: out, 1: halves, 2: bfloats, 3: v.tobytes()},
        grid=(1, 1, 1),
        threadgroup=(1, 1, 1),
    )
    assert out[0] == np.float32(1) / np.float32(3)
    assert out[1] == 4  # an unsuffixed literal is a float
    np.testing.assert_array_equal(out[2:6], [3, 4, 1.5, 2])
    assert out[6] == 0.5 + 10
    assert halves[0] == np.float16(1) / np.float16(3)
    assert halves[1] == np.float16(6e-8) != 0
    assert bfloats[0] == (ml_dtypes.bfloat16(1) / ml_dtypes.bfloat16(3)).astype(ml_dtypes.bfloat16)
    assert bfloats[1] == ml_dtypes.bfloat16(np.float32(np.float16(1) / np.float16(3)))
    assert out[7] == 1 + 1 + 1


@pytest.mark.parametrize(
    ("constants", "expected"),
    [({1: 3, 2: 0.25, 3: False}, [3, 0.25, 3]), ({1: 5, 3: True}, [5, -1, -5])],
)
def test_function_constants(primitives: Library, constants: dict, expected: list[float]) -> None:
    out = np.full(3, np.nan, np.float32)
    primitives.dispatch(
        "function_constants", {0: out}, grid=(1, 1, 1), threadgroup=(1, 1, 1), constants=constants
    )
    np.testing.assert_array_equal(out, expected)


def test_threadgroup_memory_argument_and_unused_unbound_buffer(primitives: Library) -> None:
    x = RNG.standard_normal(128).astype(np.float32)
    out = np.full(128, np.nan, np.float32)
    result = primitives.dispatch(
        "reverse_through_threadgroup",
        {0: x, 1: out},
        grid=(1, 1, 1),
        threadgroup=(128, 1, 1),
        threadgroup_memory={0: 512},
    )
    np.testing.assert_array_equal(out, x[::-1])
    assert (
        result.counters["threadgroup_bytes_read"]
        == result.counters["threadgroup_bytes_written"]
        == 512
    )


def test_implicit_buffer_indices(primitives: Library) -> None:
    x = RNG.standard_normal(8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    buffers = {0: np.float32(2.0), 1: x, 2: out}
    primitives.dispatch("implicit_buffer_indices", buffers, grid=(1, 1, 1), threadgroup=(8, 1, 1))
    np.testing.assert_array_equal(out, 2 * x)


def test_dispatch_of_tens_of_thousands_of_threads_is_fast(reduce: Library) -> None:
    rows, n = 128, 512
    x = RNG.standard_normal((rows, n)).astype(np.float32)
    out = np.full(rows, np.nan, np.float32)
    start = time.perf_counter()
    result = reduce.dispatch(
        "row_sum_float32",
        {0: x, 1: out, 2: np.int32(n)},
        grid=(rows, 1, 1),
        threadgroup=(256, 1, 1),
    )
    elapsed = time.perf_counter() - start
    assert result.counters["threads"] == 32768
    assert elapsed < 1.0, f"{elapsed:.2f} s"


# ---------------------------------------------------------------- bug reports


# (kernel, buffers, threads, the marker on the buggy line, what the report says)
BUG_CASES = [
    (
        "divergent_barrier",
        {0: np.zeros(64, np.float32)},
        64,
        "BUG: divergent barrier",
        r"divergent threadgroup barrier.*threads 32\.\.63 \(32\) exited",
    ),
    (
        "unbound_buffer",
        {0: np.zeros(1, np.float32)},
        1,
        "BUG: buffer(1) is not bound",
        r"read through buffer\(1\), which is not bound",
    ),
    (
        "uninitialized_threadgroup",
        {0: np.zeros(64, np.float32)},
        64,
        "BUG: staging[5]",
        r"read of uninitialized threadgroup array .* at byte offset 20",
    ),
    (
        "data_race",
        {0: np.zeros(64, np.float32)},
        64,
        "BUG: no barrier since",
        r"data race .* thread 1 reads what thread 0 wrote",
    ),
    (
        "too_much_threadgroup_memory",
        {0: np.zeros(16, np.float32)},
        16,
        "threadgroup float more[16]",
        r"exceeds the 32 KiB limit",
    ),
    (
        "shift_too_far",
        {0: np.zeros(1, np.uint32), 1: np.uint32(32)},
        1,
        "BUG when shift",
        r"shift amount",
    ),
    (
        "divide_by_zero",
        {0: np.zeros(1, np.int32), 1: np.int32(0)},
        1,
        "BUG when d == 0",
        r"division by zero",
    ),
    (
        "wild_pointer",
        {0: np.zeros(1, np.float32), 1: np.uint64(16)},
        1,
        "BUG: writes to an arbitrary",
        r"crashed",
    ),
]


@pytest.mark.parametrize(
    ("kernel", "buffers", "threads", "marker", "what"),
    BUG_CASES,
    ids=[case[0] for case in BUG_CASES],
)
def test_bugs_are_reported_at_their_line(
    bugs: Library, kernel: str, buffers: dict, threads: int, marker: str, what: str
) -> None:
    with pytest.raises(KernelError) as error:
        bugs.dispatch(kernel, buffers, grid=(1, 1, 1), threadgroup=(threads, 1, 1))
    assert_reported(error, BUGS, marker, what)


def test_integer_ops_without_ub_run(bugs: Library) -> None:
    out = np.zeros(1, np.uint32)
    bugs.dispatch(
        "shift_too_far", {0: out, 1: np.uint32(31)}, grid=(1, 1, 1), threadgroup=(1, 1, 1)
    )
    assert out[0] == 1 << 31


def test_address_spaces_are_enforced() -> None:
    path = KERNELS / "address_space_error.metal"
    with pytest.raises(MetalCompileError) as error:
        Library([path])
    assert f"{path}:{line_of(str(path), 'store_one(local)')}" in str(error.value)
    assert "from 'threadgroup float[4]' to 'device float *'" in str(error.value)


def test_missing_compiler_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain.importlib.util, "find_spec", lambda name: None)
    toolchain.clang.cache_clear()
    try:
        with pytest.raises(toolchain.CompilerNotFoundError, match="pip install ziglang"):
            toolchain.clang()
    finally:
        toolchain.clang.cache_clear()


# ---------------------------------------------------------------- matmul2d


def run_matmul2d(lib: Library, m: int = 32, n: int = 64, k: int = 48):
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((n, k)).astype(ml_dtypes.bfloat16)
    c = np.full((m, n), np.nan, np.float32)
    buffers = {0: a, 1: b, 2: c, 3: np.int32(n), 4: np.int32(k)}
    result = lib.dispatch(
        "matmul_bt_float16", buffers, grid=(n // 32, m // 16, 1), threadgroup=(32, 1, 1)
    )
    return a.astype(np.float32) @ b.astype(np.float32).T, c, result


def test_matmul2d_cooperative_tensors() -> None:
    expected, c, result = run_matmul2d(library("matmul2d"))
    np.testing.assert_allclose(c, expected, rtol=1e-6, atol=1e-5)
    assert result.counters["matmul2d_runs"] == (64 // 32) * (32 // 16) * (48 // 16)


def test_matmul2d_wrong_lane_formula_mutant_is_caught() -> None:
    expected, c, _ = run_matmul2d(library("matmul2d", MUTANT_LANE_FORMULA=1))
    assert not np.allclose(c, expected, atol=1e-2)


def test_matmul2d_shared_by_two_simdgroups() -> None:
    a = RNG.standard_normal((32, 16)).astype(np.float32)
    b = RNG.standard_normal((16, 32)).astype(np.float32)
    c = np.full((32, 32), np.nan, np.float32)
    lib = library("matmul2d")
    result = lib.dispatch(
        "matmul_two_simdgroups", {0: a, 1: b, 2: c}, grid=(1, 1, 1), threadgroup=(64, 1, 1)
    )
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    assert result.counters["matmul2d_runs"] == 1


# ---------------------------------------------------------------- multi-file libraries


@pytest.mark.parametrize(
    ("constants", "bias"), [({10: 3, 11: False}, 0.0), ({10: 2, 11: True, 12: 0.5}, 0.5)]
)
def test_two_files_sharing_a_header_of_function_constants(constants: dict, bias: float) -> None:
    """Each .metal file is its own translation unit: header globals do not collide."""
    lib = Library(
        [KERNELS / "shared_constants_a.metal", KERNELS / "shared_constants_b.metal"],
        include_dirs=[KERNELS],
    )
    assert lib.names == ["scale_a", "scale_b"]
    x = RNG.standard_normal(8).astype(np.float32)
    expected = x * np.float32(constants[10]) * np.tile([1, 10, 100, 1000], 2) + np.float32(bias)
    for name, sign in (("scale_a", 1), ("scale_b", -1)):
        out = np.full(8, np.nan, np.float32)
        lib.dispatch(
            name, {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(8, 1, 1), constants=constants
        )
        np.testing.assert_allclose(out, sign * expected.astype(np.float32), rtol=1e-6)


def test_function_constant_attribute_on_the_next_line() -> None:
    source = (KERNELS / "shared_constants.h").read_text()
    assert re.search(r"\w\n\s+\[\[function_constant\(12\)\]\];", source)  # the split layout
    unit = TranslationUnit(
        '# 1 "k.metal"\nconstant float long_name\n    [[function_constant(12)]];\nint x;\n'
    )
    lines = unit.text.split("\n")
    assert "function_constant<decltype(long_name)>(12)" in lines[1]
    assert lines[3] == "int x;"  # line structure kept: diagnostics name the right line


# ---------------------------------------------------------------- access widths


@pytest.fixture(scope="module")
def wide() -> Library:
    return library("wide_access")


RECORD = np.dtype(
    {
        "names": ["weight", "low", "values"],
        "formats": ["<f4", "<f2", ("<f4", 4)],
        "offsets": [0, 4, 16],
        "itemsize": 32,
    }
)


def test_32_byte_vectors_and_struct_copies_are_traced_exactly(wide: Library) -> None:
    n = 64
    halves = RNG.standard_normal((n, 8)).astype(np.float16)
    floats = RNG.standard_normal((n, 8)).astype(np.float32)
    records = np.zeros(n, RECORD)
    records["weight"] = RNG.standard_normal(n)
    records["low"] = RNG.standard_normal(n)
    records["values"] = RNG.standard_normal((n, 4))
    outs = [np.full_like(halves, np.nan), np.full_like(floats, np.nan), np.zeros(n, RECORD)]
    result = wide.dispatch(
        "reverse_wide",
        {0: halves, 1: outs[0], 2: floats, 3: outs[1], 4: records, 5: outs[2]},
        grid=(1, 1, 1),
        threadgroup=(n, 1, 1),
    )
    np.testing.assert_array_equal(outs[0], halves[::-1])
    np.testing.assert_array_equal(outs[1], floats[::-1])
    for field in RECORD.names:
        np.testing.assert_array_equal(outs[2][field], records[field][::-1])
    counters = result.counters
    for index, array in enumerate([halves, outs[0], floats, outs[1], records, outs[2]]):
        buffer = counters["buffers"][index]
        moved = ("bytes_written", "unique_bytes_written") if index % 2 else ("bytes_read",)
        for key in moved:
            assert buffer[key] == array.nbytes, (index, key, buffer)
        assert buffer["bytes_read" if index % 2 else "bytes_written"] == 0
    total = halves.nbytes + floats.nbytes + records.nbytes  # struct copies include padding
    assert counters["threadgroup_bytes_written"] == counters["threadgroup_bytes_read"] == total


def test_vector_component_writes_are_exact_and_uninitialized_components_caught(
    wide: Library,
) -> None:
    x = RNG.standard_normal(256).astype(np.float32)
    out = np.full((32, 8), np.nan, np.float32)
    result = wide.dispatch(
        "vector_components", {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(32, 1, 1)
    )
    np.testing.assert_array_equal(out, x.reshape(32, 8)[::-1])
    # One write per component, no read of the rest of the vector.
    assert result.counters["threadgroup_bytes_written"] == 32 * 32
    assert result.counters["threadgroup_bytes_read"] == 32 * 32
    path = str(KERNELS / "wide_access.metal")
    with pytest.raises(KernelError) as error:
        library("wide_access", MUTANT_MISSING_COMPONENT=1).dispatch(
            "vector_components", {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(32, 1, 1)
        )
    # Thread 0 reads t[31]; its component 7 is bytes 28..31 of the 32-byte vector.
    assert_reported(
        error,
        path,
        "BUG when component 7",
        rf"read of uninitialized .* byte offset {31 * 32 + 28}\b",
    )


def test_struct_copy_of_padding_written_field_by_field_is_no_error(wide: Library) -> None:
    records = np.zeros(32, RECORD)
    records["weight"] = np.arange(32)
    records["values"] = RNG.standard_normal((32, 4))
    out = np.zeros(32, RECORD)
    result = wide.dispatch(
        "records_by_field", {0: records, 1: out}, grid=(1, 1, 1), threadgroup=(32, 1, 1)
    )
    np.testing.assert_array_equal(out["weight"], records["weight"][::-1])
    np.testing.assert_array_equal(out["values"], records["values"][::-1])
    assert result.counters["threadgroup_bytes_written"] == 32 * (4 + 2 + 16)  # no padding
    assert result.counters["buffers"][1]["unique_bytes_written"] == out.nbytes


def test_wide_out_of_bounds_read_is_caught(wide: Library) -> None:
    x = np.zeros((8, 8), np.float32)
    out = np.zeros((8, 8), np.float32)
    with pytest.raises(KernelError) as error:
        wide.dispatch("wide_out_of_bounds", {0: x, 1: out}, grid=(1, 1, 1), threadgroup=(8, 1, 1))
    assert_reported(
        error,
        str(KERNELS / "wide_access.metal"),
        "BUG: the last thread reads past",
        r"out-of-bounds read of 32 bytes at byte offset 256 of buffer\(0\)",
    )


def test_traced_access_widths_in_ir() -> None:
    """3-, 6- and 12-byte values, 32-byte vectors and aggregates: one hook per run of bytes."""
    module = "\n".join(
        [
            "%struct.R = type { float, half, <4 x float> }",
            "define void @f(ptr addrspace(1) %p, ptr addrspace(3) %t) {",
            "  %a = load <3 x float>, ptr addrspace(1) %p, align 4, !dbg !7",
            "  %b = load i48, ptr addrspace(1) %p, align 2",
            "  %c = load i24, ptr addrspace(3) %t, align 1",
            "  store <8 x float> zeroinitializer, ptr addrspace(3) %t, align 32",
            "  %r = load %struct.R, ptr addrspace(1) %p, align 16",
            "  %s = load float, ptr %q, align 4",
            "  call void @llvm.memcpy.p3.p1.i64(ptr addrspace(3) align 4 %t, "
            "ptr addrspace(1) align 4 %p, i64 12, i1 false)",
            "  ret void",
            "}",
        ]
    )
    out = instrument(module)
    calls = re.findall(r"call void @(__msim_\w+)\(([^)]*)\)", out)
    sizes = [(hook, args.split(", ")[-1]) for hook, args in calls]
    assert sizes == [
        ("__msim_load", "i64 12"),
        ("__msim_load", "i64 6"),
        ("__msim_load", "i64 3"),
        ("__msim_store", "i64 32"),
        ("__msim_load", "i64 6"),  # float and half; then 2 bytes of padding
        ("__msim_load", "i64 16"),
        ("__msim_copy", "i64 12"),
    ]
    assert "call void @__msim_load(i64 %msim.1, i64 12), !dbg !7" in out
    assert "define internal void @f(" in out


def test_direct_half_bfloat_conversions(primitives: Library) -> None:
    h = np.array([1 / 3, 6e-8, -65504, 1.5], np.float16)
    b = np.array([1 / 3, 1e-30, 1e4, -2.5], ml_dtypes.bfloat16)
    to_bfloat = np.zeros(8, ml_dtypes.bfloat16)
    to_half = np.zeros(8, np.float16)
    primitives.dispatch(
        "half_bfloat_conversions",
        {0: h, 1: b, 2: to_bfloat, 3: to_half},
        grid=(1, 1, 1),
        threadgroup=(4, 1, 1),
    )
    np.testing.assert_array_equal(to_bfloat, np.repeat(h.astype(ml_dtypes.bfloat16), 2))
    np.testing.assert_array_equal(to_half, np.repeat(b.astype(np.float32).astype(np.float16), 2))


CONFORMANCE_KERNEL = """
#include <metal_stdlib>
using namespace metal;
{helpers}
[[kernel]] void probe(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {{
  {body}
}}
"""
# (helpers, body, Metal versions that reject it, what the report says)
CONFORMANCE_CASES = {
    "structured_binding": (
        "struct P { float a; float b; };",
        "P p = {1.0f, 2.0f}; auto [a, b] = p; out[i] = a + b;",
        ["3.1"],
        "structured binding declarations",
    ),
    "fold_expression": (
        "template <typename... T> float total(T... v) { return (v + ...); }",
        "out[i] = total(1.0f, 2.0f);",
        ["3.1"],
        "pack fold expression",
    ),
    "designated_initializer": (
        "struct P { float a; float b; };",
        "P p = {.a = 1.0f, .b = 2.0f}; out[i] = p.a;",
        ["3.1", "4.0"],
        "designated initializers",
    ),
    "goto": ("", "if (i) goto done; out[i] = 1.0f; done: return;", ["3.1", "4.0"], "goto"),
    "double": ("", "double d = out[i]; out[i] = float(d);", ["3.1", "4.0"], "double"),
    "std": ("", "out[i] = std::fmax(out[i], 0.0f);", ["3.1", "4.0"], "std::"),
    "function_pointer": (
        "float twice(float v) { return 2 * v; }",
        "float (*f)(float) = twice; out[i] = f(out[i]);",
        ["3.1", "4.0"],
        "function pointers",
    ),
    "virtual": (
        "struct B { virtual float f() const { return 1; } };",
        "out[i] = 1.0f;",
        ["3.1", "4.0"],
        "virtual functions",
    ),
    "recursion": (
        "uint steps(uint n) { return n < 2 ? n : steps(n / 2) + 1; }",
        "out[i] = float(steps(i));",
        ["3.1", "4.0"],
        "recursion",
    ),
    "if_constexpr_and_deleted_functions": (
        "struct N { N() = default; N(const N&) = delete; };",
        "if constexpr (sizeof(float) == 4) { out[i] = 1.0f; }",
        [],
        "",
    ),
}


@pytest.mark.parametrize("case", list(CONFORMANCE_CASES))
@pytest.mark.parametrize("version", ["3.1", "4.0"])
def test_metal_language_conformance(tmp_path: Path, case: str, version: str) -> None:
    """What Apple's compiler rejects at a metallib's Metal version fails the
    simulator's compile too, though clang at C++23 accepts it."""
    helpers, body, rejected_by, report = CONFORMANCE_CASES[case]
    source = tmp_path / f"{case}.metal"
    source.write_text(CONFORMANCE_KERNEL.format(helpers=helpers, body=body))
    if version not in rejected_by:
        out = np.zeros(4, np.float32)
        Library([source], metal_version=version).dispatch(
            "probe", {0: out}, grid=(1, 1, 1), threadgroup=(4, 1, 1)
        )
        return
    with pytest.raises(MetalCompileError) as error:
        Library([source], metal_version=version)
    assert f"is not Metal {version}" in str(error.value)
    assert report in str(error.value)
    assert str(source) in str(error.value) or case == "recursion"


def test_unknown_metal_version_is_rejected() -> None:
    with pytest.raises(ValueError, match="metal_version must be one of"):
        Library([KERNELS / "primitives.metal"], metal_version="2.4")
