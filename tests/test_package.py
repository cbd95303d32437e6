"""The Python package's shape: no import cycle, and ``import mlx_fpqmm`` loads only the library."""

import ast
import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

import mlx_fpqmm

PACKAGE = Path(mlx_fpqmm.__file__).resolve().parent
NAME = "mlx_fpqmm"


def module_names() -> dict[str, Path]:
    """Every Python module of the package by dotted name (``mlx_fpqmm`` is its __init__)."""
    modules = {}
    for path in sorted(PACKAGE.glob("*.py")):
        modules[NAME if path.stem == "__init__" else f"{NAME}.{path.stem}"] = path
    return modules


def is_module(name: str, modules: dict[str, Path]) -> bool:
    """A module of the package: a source file, or built (the extension, the build info)."""
    parent, _, child = name.rpartition(".")
    return name in modules or (parent == NAME and find_spec(name) is not None)


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports, at any depth (lazy imports in functions
    count too: a cycle through one is still a cycle, only later)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                raise AssertionError(f"{path.name}: the package has no subpackages to go up from")
            if node.level == 0:
                base = node.module
            else:
                base = f"{NAME}.{node.module}" if node.module else NAME
            # `from pkg import sub` loads the submodule; `from pkg import name` runs pkg.
            names = [
                f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}", modules) else base
                for alias in node.names
            ]
        else:
            continue
        found.update(name for name in names if is_module(name, modules))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports; built modules import none of them."""
    modules = module_names()
    graph = {name: imported_modules(path, modules) - {name} for name, path in modules.items()}
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_import_graph_is_read_from_the_sources():
    """The graph holds the edges it should (so an empty graph cannot pass the next test)."""
    graph = import_graph()
    assert {f"{NAME}._ext", f"{NAME}._formats", f"{NAME}.nn"} <= graph[NAME]
    assert f"{NAME}._layers" in graph[f"{NAME}._sharded"]
    assert f"{NAME}._switch" in graph[f"{NAME}.nn"]  # a lazy import, inside a function


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_leaf_modules_import_no_public_module():
    """The helpers under the public modules import only the extension and each other."""
    graph = import_graph()
    leaves = {f"{NAME}._formats", f"{NAME}._layers"}
    allowed = leaves | {f"{NAME}._ext"}
    for leaf in leaves:
        assert graph[leaf] <= allowed, (leaf, graph[leaf] - allowed)


# Modules that only the project's development needs (benchmarks, the Metal simulator, the
# ggml glue, the test helpers) and mlx-lm, an optional dependency.
NOT_AT_IMPORT = (
    f"{NAME}.bench",
    f"{NAME}.testing",
    "fpqmm_dev",
    "metal_sim",
    "ggml",
    "mlx_lm",
    "matplotlib",
)


@pytest.mark.parametrize("statement", ["import mlx_fpqmm", "import mlx_fpqmm.nn"])
def test_import_loads_no_development_module(statement):
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert f"{NAME}._ext" in loaded
    unwanted = [m for m in loaded if m.startswith(NOT_AT_IMPORT)]
    assert not unwanted, unwanted
