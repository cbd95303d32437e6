"""The CPU kernels: every ISA this machine runs, both paths, tails and scales.

MLX_FPQMM_CPU_ISA picks the ISA and MLX_FPQMM_CPU_GEMM_MIN_M the M from which
the GEMM path runs; the CPU code reads both on every call.
"""

import os
import platform
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from reference import BITS, DEFAULT_GROUP_SIZE, TOLERANCE, qmm_reference, relative_error

import mlx_fpqmm

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
DTYPE_NAMES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}
ALL_MODES = ("mxfp4", "nvfp4", "mxfp8", "fp4", "fp8")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runnable_isas() -> list[str]:
    """The ISAs whose kernels this machine runs (the CPU code's own check)."""
    isas = ["portable"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags = cpu_flags()
        if {"avx2", "fma"} <= flags:
            isas.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            isas.append("avx512")
    elif platform.machine() in ("arm64", "aarch64"):
        isas.append("neon")
    return isas


ISAS = runnable_isas()
PATHS = {"fused": "1000000000", "gemm": "1"}


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    monkeypatch.setenv("MLX_FPQMM_CPU_ISA", request.param)
    return request.param


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch):
    monkeypatch.setenv("MLX_FPQMM_CPU_GEMM_MIN_M", PATHS[request.param])
    return request.param


def op_for(mode):
    return mlx_fpqmm.qmm_for_mode(mode)


def check(x, w_q, scales, mode, transpose, group_size=None, global_scale=None):
    kwargs = {"group_size": group_size, "mode": mode}
    if global_scale is not None:
        kwargs["global_scale"] = global_scale
    y = op_for(mode)(x, w_q, scales, transpose=transpose, **kwargs)
    reference = qmm_reference(x, w_q, scales, mode, transpose, group_size, global_scale)
    err = relative_error(y, reference)
    assert err < TOLERANCE[x.dtype], err


# K crosses the GEMM's 2048-deep panels and leaves a tail after every SIMD
# step (32, 64 and 128 elements); N leaves a tail after every row block.
def quantized_length(mode):
    return 2048 + 256 + 32 + (16 if mode == "nvfp4" else 0)


def check_isa_and_path(path, mode, dtype, transpose):
    K, N = quantized_length(mode), 38
    rows = (1, 13) if path == "gemm" else (1, 6)
    shape = (N, K) if transpose else (K, N)
    if not transpose:  # quantized along N instead
        K, N = N, K
        shape = (K, N)
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal(shape), mode=mode)
    for M in rows:
        x = mx.random.normal((M, K)).astype(dtype)
        check(x, w_q, scales, mode, transpose)


# float16 x is converted to float32 before any kernel runs (csrc/backend/cpu/qmm.cpp),
# so the ISAs see float32 and bfloat16 x only; float16 runs on the default ISA.
@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_isa_and_path_match_reference(isa, path, mode, dtype, transpose):
    check_isa_and_path(path, mode, dtype, transpose)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_float16_x_matches_reference(path, mode, transpose):
    check_isa_and_path(path, mode, mx.float16, transpose)


def check_float_scales(mode, group_size, scale_dtype, dtype):
    K = 4 * 128 + group_size
    w = mx.random.normal((21, K)).astype(scale_dtype)
    w_q, scales = mlx_fpqmm.quantize(w, group_size, mode=mode)
    for M in (1, 5, 14):
        x = mx.random.normal((M, K)).astype(dtype)
        check(x, w_q, scales, mode, True, group_size)
        xt = mx.random.normal((M, 21)).astype(dtype)
        check(xt, w_q, scales, mode, False, group_size)


# Float scales are decoded to float32 by one scalar routine that every ISA
# shares (decode_float_scales in csrc/backend/cpu/kernels.cpp); the ISAs differ in how
# groups map onto SIMD steps. So group sizes cross the ISAs with float32 scales,
# and the float16 / bfloat16 scales run on the default ISA.
@pytest.mark.parametrize("mode", ["fp4", "fp8"])
@pytest.mark.parametrize("group_size", [16, 64, 128])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=DTYPE_NAMES.get)
def test_float_scale_group_sizes(isa, path, mode, group_size, dtype):
    check_float_scales(mode, group_size, mx.float32, dtype)


@pytest.mark.parametrize("mode", ["fp4", "fp8"])
@pytest.mark.parametrize("group_size", [16, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16], ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=DTYPE_NAMES.get)
def test_float_scale_dtypes(path, mode, group_size, scale_dtype, dtype):
    check_float_scales(mode, group_size, scale_dtype, dtype)


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=DTYPE_NAMES.get)
def test_nvfp4_global_scale(isa, path, dtype):
    w = mx.random.normal((40, 160)) * 1e-3
    global_scale = mx.abs(w).max()
    w_q, scales = mx.quantize(w, mode="nvfp4", global_scale=global_scale)
    for M in (1, 14):
        x = mx.random.normal((M, 160)).astype(dtype)
        check(x, w_q, scales, "nvfp4", True, global_scale=global_scale)


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("byte", [0, 1, 127, 200])
def test_e8m0_scale_bytes(isa, path, mode, byte):
    """Every group scaled by 2^(byte - 127), byte 0 being 2^-127 as in MLX."""
    K = 4 * DEFAULT_GROUP_SIZE[mode] * 4
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((24, K)), mode=mode)
    scales = mx.full(scales.shape, byte, dtype=mx.uint8)
    # x scaled the other way (within float32's range for the unscaled sums)
    # keeps the products normal floats.
    x = mx.random.uniform(-1, 1, (5, K)) * 2.0 ** min(max(127 - byte, -100), 100)
    check(x, w_q, scales, mode, True)


def test_unaligned_and_strided_x(isa):
    """Row offsets that break every vector alignment."""
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((33, 320)), mode="mxfp4")
    base = mx.random.normal((7, 323))
    x = base[:, 3:]
    check(x, w_q, scales, "mxfp4", True)


# The small-M dot path at every K tail the SIMD steps leave (the last step,
# partial, decoded from a zero-padded copy; gpt-oss's K = 2880 among them),
# K shorter than one step, and every M from 1 to 17 in float32 and bfloat16:
# blocks of up to 8 rows of x share each decoded vector of W, with blocks of
# every size, and 11 rows of W end in a block of one; K = 8192 takes 2 rows of
# float32 x in chunks (3 rows from K = 2848).
DOT_TAIL_LENGTHS = (2816, 2848, 2880, 2944, 3008, 3072)


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8", "fp4"])
def test_dot_tails_and_row_counts(isa, monkeypatch, mode):
    monkeypatch.setenv("MLX_FPQMM_CPU_GEMM_MIN_M", PATHS["fused"])
    group_size = 64 if mode == "fp4" else DEFAULT_GROUP_SIZE[mode]
    for K in (*DOT_TAIL_LENGTHS, 32, 96, 192, 8192):
        if K % group_size:
            continue
        w_q, scales = mlx_fpqmm.quantize(mx.random.normal((11, K)), group_size, mode=mode)
        rows = range(1, 18) if K in (2848, 2880) else (1, 2, 9, 17)
        for M in rows:
            x = mx.random.normal((M, K))
            check(x, w_q, scales, mode, True, group_size)
            check(x.astype(mx.bfloat16), w_q, scales, mode, True, group_size)


@pytest.mark.parametrize("gemm_min_m", ["1000", "1"], ids=["fused", "sgemm"])
def test_thread_count_does_not_change_results(gemm_min_m):
    """One thread runs the whole product on the caller, several split it: the same sums.
    1000 columns are several blocks of each kernel's grain; 16-bit x goes through the
    float32 output buffer a block at a time."""
    script = """
import mlx.core as mx, mlx_fpqmm, numpy as np, sys
mx.random.seed(1)
w_q, s = mlx_fpqmm.quantize(mx.random.normal((1000, 512)), mode="mxfp4")
ys = [
    mlx_fpqmm.fp4_qmm(mx.random.normal((m, K)).astype(dtype), w_q, s, transpose=K == 512)
    for m in (1, 7, 40, 200)
    for dtype in (mx.float32, mx.bfloat16, mx.float16)
    for K in (512, 1000)
]
np.save(sys.argv[1], np.concatenate([np.array(y.astype(mx.float32)).ravel() for y in ys]))
"""
    results = []
    for threads in ("1", "3"):
        out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fpqmm_threads_{threads}.npy")
        env = dict(os.environ, MLX_FPQMM_NUM_THREADS=threads, MLX_FPQMM_CPU_GEMM_MIN_M=gemm_min_m)
        subprocess.run([sys.executable, "-c", script, out], check=True, env=env)
        results.append(np.load(out))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS (Linux)")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_new_streams_keep_no_product_sized_buffer(dtype):
    """A one-thread pool runs the whole product on the stream's own thread (so does a pool
    busy with another stream's product), and each MLX stream is a thread of its own: a
    thread-local output buffer of M x N floats (32 MiB here) stayed behind in every new
    stream. A small mmap threshold keeps glibc from keeping freed x-sized blocks in each
    thread's arena, so that the growth is ours: under half the old buffer a stream."""
    script = """
import mlx.core as mx, mlx_fpqmm, sys
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
w, s = mlx_fpqmm.quantize(mx.random.normal((16384, 1024)), mode="mxfp4")
x = mx.random.normal((512, 1024)).astype(getattr(mx, sys.argv[1]))
mx.eval(w, s, x)
seen = []
for _ in range(4):
    mx.eval(mlx_fpqmm.fp4_qmm(x, w, s, stream=mx.new_stream(mx.cpu)))
    mx.clear_cache()
    seen.append(rss())
print((seen[-1] - seen[1]) // (len(seen) - 2))
"""
    env = dict(os.environ, MLX_FPQMM_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
    env.pop("MLX_FPQMM_CPU_GEMM_MIN_M", None)
    run = subprocess.run([sys.executable, "-c", script, dtype], check=True, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert int(run.stdout) < 16 << 20


# Non-finite scales and NaN codes. The reference dequantizes element by
# element (code * scale), so an infinite scale gives ±inf for nonzero codes
# and NaN for ±0 codes, and a NaN scale or code gives NaN, whatever x.
# Each case: mode, what is made non-finite ("scale" or "code"), the values
# the affected groups' scales take (bytes for mxfp/nvfp, floats otherwise),
# and the scales' dtype for fp4/fp8.
INF, NAN = float("inf"), float("nan")
NONFINITE_CASES = {
    "mxfp4-e8m0-255": ("mxfp4", "scale", [255], None),
    "mxfp8-e8m0-255": ("mxfp8", "scale", [255], None),
    "nvfp4-e4m3-nan": ("nvfp4", "scale", [0x7F, 0xFF], None),
    "fp4-f32-inf": ("fp4", "scale", [INF, -INF], mx.float32),
    "fp4-f16-inf-nan": ("fp4", "scale", [INF, NAN], mx.float16),
    "fp8-bf16-inf-nan": ("fp8", "scale", [-INF, NAN], mx.bfloat16),
    "mxfp8-nan-code": ("mxfp8", "code", [127, 0, 255], None),
    "fp8-nan-code": ("fp8", "code", [1.0, 0.0, INF, NAN], mx.float32),
}


def nonfinite_case(case, seed=0):
    """Codes, scales (quantized orientation: 14 rows) and the mode of a case.

    Rows r > 0 have one group affected, the first, fourth or last (in the
    tail after the last SIMD step), with codes by r % 6: mixed signs, all
    positive, all negative, positive with a +0, positive with a -0; with
    positive, negative and zero-holding rows of x this gives finite, +inf,
    -inf and NaN outputs.
    """
    mode, kind, values, scale_dtype = NONFINITE_CASES[case]
    rng = np.random.default_rng(seed)
    bits, group_size = BITS[mode], DEFAULT_GROUP_SIZE[mode]
    rows, cols = 14, quantized_length(mode) - 2048
    groups = cols // group_size
    sign = 8 if bits == 4 else 0x80
    # Small nonzero magnitudes: E2M1 codes 1-7, E4M3 up to 3.75.
    codes = rng.integers(1, 8 if bits == 4 else 0x48, (rows, cols))
    codes |= rng.integers(0, 2, (rows, cols)) * sign
    if mode in ("mxfp4", "mxfp8"):
        scales = rng.integers(120, 134, (rows, groups)).astype(np.uint8)
    elif mode == "nvfp4":
        scales = rng.integers(0x30, 0x40, (rows, groups)).astype(np.uint8)
    else:
        scales = rng.uniform(0.5, 2.0, (rows, groups)).astype(np.float32)
    for r in range(1, rows):
        g = (0, 3, groups - 1)[r % 3]
        block = codes[r, g * group_size : (g + 1) * group_size]
        pattern = r % 6
        if pattern in (1, 3, 4):
            block &= ~sign
        elif pattern == 2:
            block |= sign
        if pattern == 3:
            block[3] = 0
        elif pattern == 4:
            block[group_size - 1] = sign
        if kind == "code":
            block[r % group_size] = 0x7F | (r % 2) * sign
        scales[r, g] = values[r % len(values)]
    if bits == 4:
        shifts = np.arange(8, dtype=np.uint32) * 4
        words = (codes.reshape(rows, -1, 8).astype(np.uint32) << shifts).sum(-1)
    else:
        words = codes.astype(np.uint8).view(np.uint32)
    w_q = mx.array(words.astype(np.uint32))
    scales = mx.array(scales)
    if scale_dtype is not None:
        scales = scales.astype(scale_dtype)
    return w_q, scales, mode


def nonfinite_x(M, K, dtype, seed=1):
    """Rows of x: positive, negative, positive with zeros, mixed, positive."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.5, (M, K)).astype(np.float32)
    x[1] *= -1
    x[2, ::7] = 0
    x[3] *= rng.choice([-1, 1], K)
    return mx.array(x).astype(dtype)


def assert_same_values(y, reference):
    """NaN and ±inf where the reference has them, the finite values close."""
    ref, magnitude = reference
    y = np.array(mx.array(y).astype(mx.float32)).astype(np.float64)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    for kind in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(kind(y), kind(ref), kind.__name__)
    finite = np.isfinite(ref)
    assert finite.any() and not finite.all()  # the case tests both
    scale = max(float(magnitude[finite].max()), 1e-30)
    assert float(np.abs(y[finite] - ref[finite]).max()) / scale < TOLERANCE[mx.bfloat16]


@pytest.mark.parametrize("case", list(NONFINITE_CASES))
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
def test_nonfinite_scales_and_codes(isa, path, case, dtype, transpose):
    w_q, scales, mode = nonfinite_case(case)
    rows, cols = w_q.shape[0], w_q.shape[1] * 32 // BITS[mode]
    # M = 1 and 2: W decoded per step for the rows of x; 5: panels; 14: panels
    # or sgemm, by ISA.
    for M in (1, 2, 5, 14):
        x = nonfinite_x(max(M, 5), cols if transpose else rows, dtype)[-M:]
        with np.errstate(invalid="ignore"):
            reference = qmm_reference(x, w_q, scales, mode, transpose)
        y = op_for(mode)(x, w_q, scales, transpose=transpose, mode=mode)
        assert_same_values(y, reference)


@pytest.mark.parametrize("case", list(NONFINITE_CASES))
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("transpose", [True, False], ids=["t", "n"])
@pytest.mark.parametrize("kernel", ["qmv", "mma"])
def test_nonfinite_metal_kernels_agree(case, dtype, transpose, kernel):
    """The Metal kernels (simulated) follow the same per-element rule."""
    from mlx_fpqmm.testing import metal_qmm

    w_q, scales, mode = nonfinite_case(case)
    rows, cols = w_q.shape[0], w_q.shape[1] * 32 // BITS[mode]
    x = nonfinite_x(5, cols if transpose else rows, dtype)
    with np.errstate(invalid="ignore"):
        reference = qmm_reference(x, w_q, scales, mode, transpose)
    y = metal_qmm(x, w_q, scales, mode=mode, transpose=transpose, kernel=kernel)
    assert_same_values(y, reference)
