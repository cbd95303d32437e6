"""mlx_fpqmm.testing outside a source checkout: where it finds the kernel
sources, and the errors it gives where the simulator cannot run."""

import sys
from pathlib import Path

import mlx.core as mx
import pytest

import mlx_fpqmm
from mlx_fpqmm import testing

SOURCE_METAL = Path(__file__).resolve().parent.parent / "metal"


def problem():
    w_q, scales = mlx_fpqmm.quantize(mx.random.normal((8, 64)), mode="mxfp4")
    return mx.random.normal((2, 64)), w_q, scales


@pytest.mark.parametrize(
    ("system", "machine"),
    [("darwin", "arm64"), ("darwin", "x86_64"), ("linux", "aarch64"), ("win32", "AMD64")],
)
def test_simulator_needs_x86_64_linux(monkeypatch, system, machine):
    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(testing.platform, "machine", lambda: machine)
    message = rf"needs an x86-64 Linux machine .*this machine is {system} {machine}"
    with pytest.raises(RuntimeError, match=message):
        testing.library()
    with pytest.raises(RuntimeError, match=message):
        testing.metal_qmm(*problem(), mode="mxfp4")


def test_simulator_must_be_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "metal_sim", None)  # `import metal_sim` fails
    with pytest.raises(ImportError, match=r"metal_sim package.*pip install -e tools/metal_sim"):
        testing.library("mlx_fpqmm_nax")
    with pytest.raises(ImportError, match="metal_sim"):
        testing.metal_qmm(*problem(), mode="mxfp4")


def test_kernel_sources_missing(monkeypatch, tmp_path):
    monkeypatch.setitem(testing.LIBRARIES, "mlx_fpqmm", (tmp_path, "3.1"))
    with pytest.raises(RuntimeError, match=r"kernel sources of mlx_fpqmm were not found"):
        testing.library()


def test_kernel_root_beside_the_module_first(tmp_path):
    package = tmp_path / "site-packages" / "mlx_fpqmm"
    (package / "include" / testing.METAL_KERNELS).mkdir(parents=True)
    (package / "include" / testing.METAL_KERNELS / "fp_qmm.metal").write_text("")
    assert testing.find_kernel_root(package) == package / "include"
    # An editable install: the module is the checkout's, beside csrc/.
    checkout = tmp_path / "checkout" / "mlx_fpqmm"
    checkout.mkdir(parents=True)
    assert testing.find_kernel_root(checkout) == tmp_path / "checkout" / "csrc"


def test_install_ships_the_kernel_sources():
    """CMake installs the kernel sources beside the extension (what the wheel
    holds) in the source tree's layout: the .metal files and headers of both
    metallibs and the format headers they include, nothing else."""
    installed = Path(mlx_fpqmm._ext.__file__).parent / "include"
    assert installed.is_dir(), f"{installed} missing: rerun tools/setup"
    files = {p.relative_to(installed).as_posix() for p in installed.rglob("*") if p.is_file()}
    kernels = testing.METAL_KERNELS.as_posix()
    assert {
        f"{kernels}/fp_qmm.metal",
        f"{kernels}/fp_common.h",
        f"{kernels}/nax/fp_qmm_nax.metal",
        f"{kernels}/nax/fp_qmm_nax.h",
        "common/scale_encoding.h",
    } <= files
    assert all(name.endswith((".metal", ".h")) for name in files), files
    assert testing.find_kernel_root(installed.parent) == installed
