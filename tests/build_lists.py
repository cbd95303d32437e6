"""What the build lists: the set() lists of cmake/sources.cmake and the pinned
MLX version, read by the macOS type-check and the CUDA compile check."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cmake_lists(root: Path = ROOT) -> dict[str, list[str]]:
    """The set() lists of cmake/sources.cmake."""
    text = re.sub(r"#.*", "", (root / "cmake" / "sources.cmake").read_text())
    return {name: values.split() for name, values in re.findall(r"set\((\w+)\s+([^)]*)\)", text)}


def pinned_mlx_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    versions = set(re.findall(r'"mlx(?:\[cpu\])?==([0-9.]+)', text))
    assert len(versions) == 1, f"pyproject.toml pins several MLX versions: {versions}"
    return versions.pop()
