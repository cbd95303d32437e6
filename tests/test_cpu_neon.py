"""The arm64 NEON kernels, cross-compiled and run under qemu-user.

csrc/backend/cpu/testing/kernel_harness.cpp runs one ISA's kernels on a case given on
stdin; here it is built for arm64 twice, by Debian's g++-aarch64-linux-gnu and
by clang (the ziglang wheel's, with clang's own arm_neon.h, where several
intrinsics are macros) against the same cross libstdc++, and run with
qemu-aarch64 (tools/setup installs the cross toolchain and qemu); the results
are checked against the same reference as every other kernel.
"""

import os
import platform
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from reference import BITS, TOLERANCE, dequantize_reference, qmm_reference, relative_error
from test_cpu_kernels import NONFINITE_CASES, assert_same_values, nonfinite_case, nonfinite_x

import mlx_fpqmm

# Two cross builds and a qemu process per case.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
COMPILER = "aarch64-linux-gnu-g++"
EMULATOR = "qemu-aarch64"
SOURCES = [
    "csrc/backend/cpu/testing/kernel_harness.cpp",
    "csrc/backend/cpu/kernels.cpp",
    "csrc/backend/cpu/neon.cpp",
]
OPS = {"dot": 0, "axpy": 1, "dequantize": 2}


FLAGS = ["-std=c++20", "-O2", "-I", "csrc"]


def clang_objects(directory: Path) -> list[str]:
    """The harness's sources compiled by clang for aarch64 Linux (Debian's cross
    libstdc++, clang's intrinsics headers), to be linked by g++."""
    import ziglang

    command = [
        sys.executable, "-m", "ziglang", "clang", "-x", "c++", "-target", "aarch64-linux-gnu",
        "--gcc-toolchain=/usr", f"-resource-dir={Path(ziglang.__file__).parent / 'lib'}",
        *FLAGS, "-c",
    ]  # fmt: skip
    objects = []
    for source in SOURCES:
        output = directory / (Path(source).stem + ".o")
        subprocess.run([*command, source, "-o", str(output)], cwd=ROOT, check=True)
        objects.append(str(output))
    return objects


@pytest.fixture(scope="module", params=["g++", "clang"])
def harness(request, tmp_path_factory) -> Path:
    if platform.system() != "Linux":
        pytest.skip("the cross toolchain is Debian's")
    if not (shutil.which(COMPILER) and shutil.which(EMULATOR)):
        message = f"{COMPILER} and {EMULATOR} missing: run tools/setup"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    directory = tmp_path_factory.mktemp(f"neon-{request.param}")
    binary = directory / "kernel_harness"
    inputs = SOURCES if request.param == "g++" else clang_objects(directory)
    command = [COMPILER, *FLAGS, "-static", "-o", str(binary), *inputs]
    subprocess.run(command, cwd=ROOT, check=True)
    return binary


def run(harness, isa, mode, op, w_q, scales, x=None, global_factor=1.0, group_size=None):
    group_size = group_size or mlx_fpqmm.FORMATS[mode]["default_group_size"]
    rows, words = w_q.shape
    cols = words * 32 // BITS[mode]
    # The harness maps the names to its format and scale encoding (formats.h).
    scales_dtype = str(scales.dtype).removeprefix("mlx.core.")
    M = 0 if x is None else x.shape[0]
    header = struct.pack(
        "<8s8s2if3q", mode.encode(), scales_dtype.encode(), group_size, OPS[op],
        global_factor, rows, cols, M,
    )  # fmt: skip
    payload = header + np.array(w_q).tobytes() + np.array(scales.view(mx.uint8)).tobytes()
    if x is not None:
        payload += np.array(x, dtype=np.float32).tobytes()
    result = subprocess.run(
        [EMULATOR, str(harness), isa], input=payload, capture_output=True, check=True
    )
    values = np.frombuffer(result.stdout, dtype=np.float32)
    if op == "dequantize":
        return values.reshape(rows, cols)
    return values.reshape(M, -1)


MODES = ["mxfp4", "nvfp4", "mxfp8", "fp4", "fp8"]


@pytest.mark.parametrize("isa", ["neon", "portable"])
@pytest.mark.parametrize("mode", MODES)
def test_kernels_match_reference(harness, isa, mode):
    cols = 256 + 32 + (16 if mode == "nvfp4" else 0)  # tails after every step
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((38, cols)), mode=mode)
    expected = dequantize_reference(w_q, scales, mode)
    dequantized = run(harness, isa, mode, "dequantize", w_q, scales)
    np.testing.assert_array_equal(dequantized, expected)
    for M in (1, 6, 17):  # 17: blocks of 5 and 6 rows of x share decoded W
        x = mx.random.normal((M, cols))
        y = run(harness, isa, mode, "dot", w_q, scales, x)
        reference = qmm_reference(x, w_q, scales, mode, transpose=True)
        assert relative_error(mx.array(y), reference) < TOLERANCE[mx.float32]
        x = mx.random.normal((M, 38))
        y = run(harness, isa, mode, "axpy", w_q, scales, x)
        reference = qmm_reference(x, w_q, scales, mode, transpose=False)
        assert relative_error(mx.array(y), reference) < TOLERANCE[mx.float32]


@pytest.mark.parametrize("group_size", [16, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16], ids=["float16", "bfloat16"])
def test_float_scales(harness, group_size, scale_dtype):
    w = mx.random.normal((20, 512)).astype(scale_dtype)
    w_q, scales = mlx_fpqmm.quantize(w, group_size, mode="fp4")
    x = mx.random.normal((3, 512))
    y = run(harness, "neon", "fp4", "dot", w_q, scales, x, group_size=group_size)
    reference = qmm_reference(x, w_q, scales, "fp4", group_size=group_size)
    assert relative_error(mx.array(y), reference) < TOLERANCE[mx.float32]


def test_nvfp4_global_factor(harness):
    w_q, scales = mx.quantize(mx.random.normal((16, 128)), mode="nvfp4")
    x = mx.random.normal((2, 128))
    y = run(harness, "neon", "nvfp4", "dot", w_q, scales, x, global_factor=0.25)
    ref, magnitude = qmm_reference(x, w_q, scales, "nvfp4")
    assert relative_error(mx.array(y), (ref * 0.25, magnitude * 0.25)) < 1e-5


@pytest.mark.parametrize("isa", ["neon", "portable"])
@pytest.mark.parametrize("case", list(NONFINITE_CASES))
def test_nonfinite_scales_and_codes(harness, isa, case):
    w_q, scales, mode = nonfinite_case(case)
    for op, transpose in (("dot", True), ("axpy", False)):
        x = nonfinite_x(
            5, w_q.shape[1] * 32 // BITS[mode] if transpose else w_q.shape[0], mx.float32
        )
        with np.errstate(invalid="ignore"):
            reference = qmm_reference(x, w_q, scales, mode, transpose)
        assert_same_values(run(harness, isa, mode, op, w_q, scales, x), reference)
