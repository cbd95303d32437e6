"""Builds the extension with AddressSanitizer and UndefinedBehaviorSanitizer and
runs the CPU tests against that build in a child process.

The build is cached (keyed on the C++ sources and flags) under
$MLX_FPQMM_SANITIZER_CACHE, default ~/.cache/mlx_fpqmm_sanitized.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SANITIZER_FLAGS = (
    "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
)
# The CPU tests that run under the sanitizers (the rest spawn processes or
# compile Metal kernels, which the sanitizers do not look at).
CPU_TESTS = [
    "test_qmm.py",
    "test_formats.py",
    "test_quantize.py",
    "test_transforms.py",
    "test_validation.py",
    "test_properties.py",
]
LAUNCHER = """
import sys
# An editable install redirects `import mlx_fpqmm` to the regular build.
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
import mlx_fpqmm._ext
assert mlx_fpqmm._ext.__file__.startswith(sys.argv[1]), mlx_fpqmm._ext.__file__
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


def source_digest() -> str:
    digest = hashlib.sha256(SANITIZER_FLAGS.encode())
    for path in sorted([*ROOT.glob("csrc/**/*"), ROOT / "CMakeLists.txt"]):
        if path.is_file():
            digest.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def build_sanitized_package() -> Path:
    cache = Path(
        os.environ.get("MLX_FPQMM_SANITIZER_CACHE", Path.home() / ".cache/mlx_fpqmm_sanitized")
    )
    prefix = cache / source_digest()
    if (prefix / "mlx_fpqmm").is_dir():
        return prefix
    build = cache / "build"
    shutil.rmtree(build, ignore_errors=True)
    for command in (
        [
            "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
            "-DSKBUILD_PROJECT_NAME=mlx_fpqmm", f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Debug", f"-DCMAKE_CXX_FLAGS={SANITIZER_FLAGS}",
        ],
        ["cmake", "--build", str(build), "--parallel", "2"],
        ["cmake", "--install", str(build), "--prefix", str(prefix)],
    ):  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for source in (ROOT / "mlx_fpqmm").glob("*.py"):
        shutil.copy(source, prefix / "mlx_fpqmm")
    return prefix


def library_dirs_of_regular_build() -> str:
    """Where the installed extension finds its shared libraries (MLX, BLAS):
    the sanitized copy lives elsewhere, so its relative RPATHs miss them."""
    import mlx_fpqmm._ext

    ldd = subprocess.run(["ldd", mlx_fpqmm._ext.__file__], capture_output=True, text=True)
    dirs = {
        str(Path(line.split("=>")[1].split("(")[0].strip()).parent)
        for line in ldd.stdout.splitlines()
        if "=>" in line and "/" in line.split("=>")[1]
    }
    return ":".join(sorted(dirs))


def test_cpu_tests_pass_under_asan_and_ubsan(tmp_path):
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.fail("cmake and ninja are needed (pip install -e '.[test]' installs them)")
    prefix = build_sanitized_package()
    # ASan first; libstdc++ too, or ASan cannot intercept C++ throws from a
    # Python that does not link libstdc++ itself.
    preload = " ".join(
        subprocess.run(
            ["g++", f"-print-file-name={lib}"], capture_output=True, text=True
        ).stdout.strip()
        for lib in ("libasan.so", "libstdc++.so")
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(prefix),
        "LD_LIBRARY_PATH": library_dirs_of_regular_build(),
        "LD_PRELOAD": preload,
        # Python's own allocations are not leaks of ours.
        "ASAN_OPTIONS": f"detect_leaks=0:abort_on_error=1:log_path={tmp_path}/asan",
        "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:log_path={tmp_path}/ubsan",
    }
    result = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(prefix), "-q", "-x", "-p", "no:cacheprovider",
         *CPU_TESTS],
        cwd=ROOT / "tests", env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    sanitizer_reports = "".join(log.read_text() for log in sorted(tmp_path.glob("*san.*")))
    assert not sanitizer_reports, sanitizer_reports[:6000]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout
