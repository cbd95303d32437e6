"""The macOS build, type-checked on Linux.

Every C++ source that CMake compiles on arm64 macOS (cmake/sources.cmake) is
compiled with -fsyntax-only by clang (the ziglang wheel's) for
arm64-apple-macos14.0, with the defines, include directories and -std that
CMake uses there, against:
- MLX's macOS headers and Apple's metal-cpp from the `mlx-metal` macOS wheel of
  the pinned MLX version (downloaded once, cached);
- the Darwin libc and libc++ headers that ziglang ships, with libc++'s
  availability annotations on, so an API newer than macOS 14 fails as on a Mac;
- stubs for the three frameworks Linux lacks (tests/macos_stubs).
The sources come from an sdist built from this tree, so a file the sdist misses
fails here too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from build_lists import cmake_lists, pinned_mlx_version
from fpqmm_dev import mlx_metal

ROOT = Path(__file__).resolve().parent.parent
STUBS = Path(__file__).resolve().parent / "macos_stubs"
TARGET = "arm64-apple-macos14.0"

# libc++'s configuration, which `zig c++` would otherwise pass itself; the last
# one turns on the macOS availability annotations.
LIBCXX_DEFINES = [
    "_LIBCPP_ABI_VERSION=1",
    "_LIBCPP_ABI_NAMESPACE=__1",
    "_LIBCPP_HAS_THREADS=1",
    "_LIBCPP_HAS_MONOTONIC_CLOCK=1",
    "_LIBCPP_HAS_TERMINAL=1",
    "_LIBCPP_HAS_MUSL_LIBC=0",
    "_LIBCPP_HAS_FILESYSTEM=1",
    "_LIBCPP_HAS_RANDOM_DEVICE=1",
    "_LIBCPP_HAS_LOCALIZATION=1",
    "_LIBCPP_HAS_UNICODE=1",
    "_LIBCPP_HAS_WIDE_CHARACTERS=1",
    "_LIBCPP_HAS_NO_STD_MODULES",
    "_LIBCPP_PSTL_BACKEND_SERIAL",
    "_LIBCPP_HARDENING_MODE=_LIBCPP_HARDENING_MODE_NONE",
    "_LIBCPP_ASSERTION_SEMANTIC_DEFAULT=_LIBCPP_ASSERTION_SEMANTIC_IGNORE",
    "_LIBCPP_HAS_VENDOR_AVAILABILITY_ANNOTATIONS=1",
]


def macos_sources(root: Path = ROOT) -> list[str]:
    lists = cmake_lists(root)
    return lists["FPQMM_SOURCES"] + lists["FPQMM_ARM64_SOURCES"]


def mlx_metal_wheel() -> Path:
    """MLX's macOS headers: the mlx-metal wheel of the pinned version, unpacked
    (``python -m fpqmm_dev.mlx_metal fetch`` fetches it, as tools/setup does; skipped
    when it was not fetched)."""
    try:
        return mlx_metal.mlx_metal_wheel(pinned_mlx_version())
    except mlx_metal.MlxMetalUnavailable as e:
        pytest.skip(str(e))


def mlx_interface(wheel: Path) -> tuple[list[str], list[Path]]:
    """The compile definitions and include directories MLX's CMake package gives
    its users on macOS (MLXConfig.cmake)."""
    config = (wheel / "mlx" / "share" / "cmake" / "MLX" / "MLXConfig.cmake").read_text()
    defines = re.findall(r"set\(MLX_CXX_FLAGS \$\{MLX_CXX_FLAGS\} -D(\S+)\)", config)
    include = wheel / "mlx" / "include"
    includes = [include, include / "metal_cpp", include / "mlx/backend/metal/kernels/metal_3_1"]
    return defines, includes


def zig_lib() -> Path:
    import ziglang

    return Path(ziglang.__file__).resolve().parent / "lib"


def clang_command(root: Path, wheel: Path) -> list[str]:
    import nanobind

    lib = zig_lib()
    mlx_defines, mlx_includes = mlx_interface(wheel)
    lists = cmake_lists(root)
    system = [
        lib / "libcxx" / "include",
        lib / "libcxxabi" / "include",
        lib / "include",
        lib / "libc" / "include" / "any-darwin-any",
        STUBS,
        *mlx_includes,
        Path(nanobind.include_dir()),
        Path(sysconfig.get_paths()["include"]),
    ]
    defines = [*LIBCXX_DEFINES, *mlx_defines, "NB_DOMAIN=mlx", *lists["FPQMM_APPLE_DEFINITIONS"]]
    return [
        sys.executable, "-m", "ziglang", "clang", "-target", TARGET, "-fsyntax-only",
        "-x", "c++", "-std=gnu++20", "-fPIC", "-nostdinc", "-nostdinc++",
        *lists["FPQMM_COMPILE_OPTIONS"],
        *(f"-I{root / d}" for d in lists["FPQMM_INCLUDE_DIRS"]),
        *(f"-isystem{d}" for d in system),
        *(f"-D{d}" for d in defines),
    ]  # fmt: skip


def typecheck(root: Path, sources: list[str]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Type-checks `sources` (relative to `root`) for macOS, in parallel."""
    command = clang_command(root, mlx_metal_wheel())
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(mlx_metal.cache_dir() / "zig")}

    def check(source: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, source], cwd=root, capture_output=True, text=True, env=env)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        return dict(zip(sources, pool.map(check, sources), strict=True))


@pytest.fixture(scope="module")
def sdist_tree(tmp_path_factory) -> Path:
    """This tree's sdist, built and unpacked."""
    out = tmp_path_factory.mktemp("sdist")
    command = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(out), "."]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (archive,) = out.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    (tree,) = [p for p in out.iterdir() if p.is_dir()]
    return tree


@pytest.fixture(scope="module")
def macos_results(sdist_tree) -> dict[str, subprocess.CompletedProcess[str]]:
    return typecheck(sdist_tree, macos_sources(sdist_tree))


def test_source_lists_cover_csrc():
    """Every C++ and CUDA source under csrc/ is built on some platform (but the
    standalone harnesses of the testing/ folders)."""
    lists = cmake_lists()
    listed = {s for name, values in lists.items() if name.endswith("SOURCES") for s in values}
    on_disk = {
        str(p.relative_to(ROOT))
        for pattern in ("*.cpp", "*.cu")
        for p in (ROOT / "csrc").rglob(pattern)
        if "testing" not in p.relative_to(ROOT).parts
    }
    assert on_disk - listed == set()
    assert listed <= on_disk


def test_sdist_holds_the_macos_build(sdist_tree):
    needed = ["CMakeLists.txt", "pyproject.toml", "cmake/sources.cmake", *macos_sources()]
    needed += [str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.h")]
    needed += [str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.metal")]
    missing = [path for path in needed if not (sdist_tree / path).is_file()]
    assert not missing, f"the sdist lacks {missing}"


@pytest.mark.parametrize("source", macos_sources())
def test_macos_typecheck(macos_results, source):
    result = macos_results[source]
    if result.returncode != 0:
        pytest.fail(f"{source} does not compile for {TARGET}:\n{result.stderr}", pytrace=False)


def test_typecheck_reports_a_wrong_metal_call(tmp_path):
    """A planted defect in eval_gpu (a CommandEncoder call MLX does not have)
    fails the check with clang's message."""
    (tmp_path / "cmake").symlink_to(ROOT / "cmake")
    for path in (ROOT / "csrc").rglob("*.h"):
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(path)
    source = "csrc/backend/metal/primitives.cpp"
    text = (ROOT / source).read_text()
    planted = text.replace(
        "encoder.set_threadgroup_memory_length(bytes, index);",
        "encoder.set_threadgroup_memory_length(index);",
    )
    assert planted != text
    (tmp_path / source).write_text(planted)
    result = typecheck(tmp_path, [source])[source]
    assert result.returncode != 0
    assert "set_threadgroup_memory_length" in result.stderr


def test_typecheck_reports_an_api_newer_than_macos_14(tmp_path):
    """libc++'s availability annotations are on: an API macOS 14 lacks fails."""
    (tmp_path / "cmake").symlink_to(ROOT / "cmake")
    source = "new_api.cpp"
    (tmp_path / source).write_text(
        "#include <charconv>\n"
        "double parse(const char* p) { double v = 0; std::from_chars(p, p + 3, v); return v; }\n"
    )
    result = typecheck(tmp_path, [source])[source]
    assert result.returncode != 0
    assert "from_chars" in result.stderr and "macOS" in result.stderr


def test_type_stub_names_every_binding():
    """The build ships mlx_fpqmm/_ext.pyi (nanobind's stubgen): every binding,
    with MLX's types imported so type checkers resolve them."""
    import ast

    from mlx_fpqmm import _ext

    stub = Path(_ext.__file__).with_name("_ext.pyi")
    tree = ast.parse(stub.read_text())
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    bindings = {name for name in dir(_ext) if not name.startswith("_")}
    assert defined == bindings
    imported = {alias.name for node in tree.body if isinstance(node, ast.Import)
                for alias in node.names}  # fmt: skip
    assert "mlx.core" in imported
    fp4_qmm = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fp4_qmm")
    assert ast.unparse(fp4_qmm.returns) == "mlx.core.array"
    assert ast.get_docstring(fp4_qmm).startswith("Multiply ``x`` with an fp4")
