"""The CUDA plan's C++ unit test (csrc/backend/cuda/testing/plan_test.cpp),
built with g++ and run: no GPU, no CUDA toolkit; MLX's headers for
QmmProblem (from the installed mlx package, or MLX_INCLUDE_DIR)."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"


def mlx_include_dir():
    if os.environ.get("MLX_INCLUDE_DIR"):
        return Path(os.environ["MLX_INCLUDE_DIR"])
    spec = importlib.util.find_spec("mlx")
    for location in (spec.submodule_search_locations or []) if spec else []:
        include = Path(location) / "include"
        if (include / "mlx" / "array.h").exists():
            return include
    return None


def test_cuda_plan(tmp_path):
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    include = mlx_include_dir()
    if compiler is None:
        pytest.skip("no C++ compiler")
    if include is None:
        pytest.skip("no MLX headers (install mlx or set MLX_INCLUDE_DIR)")
    binary = tmp_path / "plan_test"
    subprocess.run(
        [
            compiler,
            "-std=c++20",
            "-O1",
            f"-I{CSRC}",
            f"-I{include}",
            str(CSRC / "backend/cuda/testing/plan_test.cpp"),
            str(CSRC / "backend/cuda/plan.cpp"),
            "-o",
            str(binary),
        ],
        check=True,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MLX_FPQMM_KERNEL", "MLX_ENABLE_TF32")}
    result = subprocess.run([str(binary)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
