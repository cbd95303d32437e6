"""The CUDA backend compiles, checked where no GPU is: every CUDA source that
CMake builds against an MLX built for CUDA (``FPQMM_CUDA_SOURCES`` of
cmake/sources.cmake) is compiled by nvcc (the ``nvidia-cuda-nvcc`` wheel of the
test dependencies, or the toolkit's on PATH) for every architecture CMake builds,
against MLX's own CUDA headers: the ``mlx-cuda-13`` wheel of the pinned version,
downloaded once and unpacked (its ``libmlx.so`` is never loaded, so no driver is
needed), and so is the standalone kernel harness. A CUDA compile error cannot
land."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from build_lists import cmake_lists, pinned_mlx_version

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("MLX_FPQMM_CACHE_DIR") or Path.home() / ".cache" / "mlx_fpqmm")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="MLX's CUDA build is Linux-only"
)


def nvcc() -> str:
    """The nvcc of the test dependencies' nvidia-cuda-nvcc wheel, else PATH's."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec else []:
        candidate = Path(base) / "cu13" / "bin" / "nvcc"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("nvcc")
    if found is None:
        pytest.fail("nvcc not found: `pip install -e '.[test]'` installs nvidia-cuda-nvcc")
    return found


def mlx_cuda_headers(version: str) -> Path:
    """``mlx/include`` of the mlx-cuda-13 wheel of ``version``, cached."""
    target = CACHE / f"mlx-cuda-13-{version}"
    include = target / "mlx" / "include"
    if (include / "mlx" / "backend" / "cuda" / "device.h").exists():
        return include
    download = CACHE / "downloads"
    download.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--platform", "manylinux_2_35_x86_64",
        "--python-version", "3.12", f"mlx-cuda-13=={version}", "-d", str(download),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(download.glob(f"mlx_cuda_13-{version}-*.whl"))
    assert result.returncode == 0 and wheels, (
        f"cannot download mlx-cuda-13=={version}:\n" + (result.stderr[-2000:])
    )
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(partial, [n for n in wheel.namelist() if n.startswith("mlx/include/")])
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return include


def gencode(architecture: str) -> str:
    """CMake's CUDA_ARCHITECTURES entry as nvcc's -gencode."""
    number, kind = architecture.split("-")
    if kind == "virtual":
        return f"-gencode=arch=compute_{number},code=compute_{number}"
    return f"-gencode=arch=compute_{number},code=sm_{number}"


def nvcc_command(root: Path) -> list[str]:
    lists = cmake_lists()
    return [
        nvcc(), "-c", "-std=c++20", "-DMLX_FPQMM_CUDA",
        *(f"-I{root / d}" for d in lists["FPQMM_INCLUDE_DIRS"]),
        f"-I{root / lists['FPQMM_CUDA_FMT_SHIM'][0]}",
        f"-I{mlx_cuda_headers(pinned_mlx_version())}",
        *lists["FPQMM_CUDA_FLAGS"],
        *(gencode(a) for a in lists["FPQMM_CUDA_ARCHITECTURES"]),
        "--threads", "0",  # the architectures in parallel: no idle core at the end
        # Whether it compiles, not how fast it runs: the device optimisers
        # take most of the compile time, and errors come without them.
        "-Xcicc", "-O0", "-Xptxas", "-O0",
    ]  # fmt: skip


def compile_sources(root: Path, sources: list[str], out: Path):
    command = nvcc_command(root)

    def build(source: str) -> subprocess.CompletedProcess[str]:
        obj = out / (source.replace("/", "_") + ".o")
        return subprocess.run(
            [*command, source, "-o", str(obj)], cwd=root, capture_output=True, text=True
        )

    # The kernel instantiations, the longest, first.
    ordered = sorted(sources, key=lambda source: "instantiations" not in source)
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        return dict(zip(ordered, pool.map(build, ordered), strict=True))


# The standalone harness (csrc/backend/cuda/testing/build.sh builds it on a
# GPU machine) and the GPU tools compile here too, with the extension's flags.
HARNESSES = [
    "csrc/backend/cuda/testing/harness.cu",
    "tools/gpu/load_pattern.cu",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    sources = cmake_lists()["FPQMM_CUDA_SOURCES"] + HARNESSES
    return compile_sources(ROOT, sources, tmp_path_factory.mktemp("cuda"))


def test_source_list_covers_the_cuda_sources():
    """Every .cu file under csrc/ is built (but the standalone harnesses)."""
    listed = set(cmake_lists()["FPQMM_CUDA_SOURCES"])
    on_disk = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "csrc").rglob("*.cu")
        if "testing" not in p.relative_to(ROOT).parts
    }
    assert listed == on_disk


@pytest.mark.parametrize("source", cmake_lists()["FPQMM_CUDA_SOURCES"] + HARNESSES)
def test_cuda_compiles(results, source):
    result = results[source]
    if result.returncode != 0:
        pytest.fail(f"{source} does not compile:\n{result.stderr[-6000:]}", pytrace=False)


def test_decoded_code_pairs_are_mlx_values(tmp_path):
    """The kernels' bit decoding of code pairs (code_pair_bits of fp_decode.cuh),
    built and run on the host: every pair laid out for half and bfloat16 is MLX's
    value of its codes (common/formats.h)."""
    compiler = Path(nvcc())
    library = compiler.parent.parent / "lib"
    command = [
        str(compiler), "-std=c++20", "-O2", f"-I{ROOT / 'csrc'}", "--expt-relaxed-constexpr",
        "-diag-suppress", "997", *([f"-L{library}"] if library.is_dir() else []),
        "csrc/backend/cuda/testing/decode_test.cu", "-o", str(tmp_path / "decode_test"),
    ]  # fmt: skip
    built = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-6000:]
    ran = subprocess.run([str(tmp_path / "decode_test")], capture_output=True, text=True)
    assert ran.returncode == 0 and "every decoded pair matches" in ran.stdout, ran.stdout[-3000:]


def test_compile_check_reports_a_wrong_encoder_call(tmp_path):
    """A planted defect in eval_gpu (a CommandEncoder call MLX does not have)
    fails the check with nvcc's message."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "csrc", tree / "csrc")
    source = "csrc/backend/cuda/primitives.cu"
    text = (tree / source).read_text()
    planted = text.replace("set_output_array(", "set_output_arrays(", 1)
    assert planted != text
    (tree / source).write_text(planted)
    result = compile_sources(tree, [source], tmp_path)[source]
    assert result.returncode != 0
    assert "set_output_arrays" in result.stderr
