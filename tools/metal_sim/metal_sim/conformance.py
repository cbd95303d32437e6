"""What Apple's Metal compiler rejects but the simulator's C++23 build accepts.

The simulator compiles kernels as C++23; Apple's compiler builds a metallib at a
Metal language version based on an older C++: Metal 3.1 (deployment target
14.0) on C++14, plus `if constexpr` (MLX's own kernels use it; its build passes
-Wno-c++17-extensions), Metal 4.0 (26.2) on C++17. Two checks per source:

* language level: the rewritten source compiled with -pedantic and clang's
  -Wpre-c++NN-compat-pedantic warnings (the shim is a system header, so only
  the project's code is judged); a warning about a feature newer than the
  version's C++, or any other pedantic warning, is a problem;
* what MSL forbids at any version, read from the project's own preprocessed
  text (comments gone, literals blanked) and from the call graph: goto,
  new/delete, exceptions, virtual functions, RTTI, thread_local, function
  pointers, std::, double, recursion.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import toolchain
from .rewrite import LINE_MARKER, STRING_OR_CHAR

# Metal language version -> (the C++ standard it is based on, C++17 features it
# allows anyway, as clang words them, and __METAL_VERSION__).
LANGUAGES: dict[str, tuple[int, tuple[str, ...], str]] = {
    "3.1": (14, ("constexpr if",), "310"),
    "4.0": (17, (), "400"),
}
NEWER_STANDARDS = (17, 20, 23, 26)
FLAGS = [
    "-pedantic",
    *(f"-Wpre-c++{n}-compat-pedantic" for n in NEWER_STANDARDS),
    "-Wno-gnu-line-marker",  # the line markers of the preprocessed source
]
DIAGNOSTIC = re.compile(
    r"^(?P<where>[^\s:][^:]*:\d+):\d+: warning: (?P<what>.*) \[(?P<flag>-W[^\]]+)\]$"
)
NEWER_THAN = re.compile(r"-Wpre-c\+\+(\d+)-compat")

FORBIDDEN = [
    (re.compile(r"\bgoto\b"), "goto"),
    (re.compile(r"(?<!=)(?<!=\s)\b(?:new|delete)\b(?!\s*;)"), "new/delete"),
    (re.compile(r"\b(?:throw|try|catch|noexcept\s*\(\s*false)\b"), "exceptions"),
    (re.compile(r"\bvirtual\b"), "virtual functions"),
    (re.compile(r"\b(?:typeid|dynamic_cast)\b"), "RTTI"),
    (re.compile(r"\bthread_local\b"), "thread_local"),
    (re.compile(r"\(\s*(?:\w+\s*::\s*)*\*\s*\w*\s*\)\s*\("), "function pointers"),
    (re.compile(r"\bstd\s*::"), "std:: (MSL's library is metal::)"),
    (re.compile(r"\bdouble\b"), "double"),
]
DELETED_FUNCTION = re.compile(r"=\s*delete\s*;")
DEFINE = re.compile(r"^define\b[^@]*@(\"[^\"]+\"|[\w.$]+)\(")
CALL = re.compile(r"\b(?:call|invoke)\b[^@]*?@(\"[^\"]+\"|[\w.$]+)\(")


def language(version: str) -> tuple[int, tuple[str, ...], str]:
    if version not in LANGUAGES:
        raise ValueError(f"metal_version must be one of {sorted(LANGUAGES)}, not {version!r}")
    return LANGUAGES[version]


def language_problems(diagnostics: str, version: str) -> list[str]:
    """The pedantic warnings that Metal `version` makes errors."""
    base, allowed, _ = language(version)
    problems = []
    for line in diagnostics.splitlines():
        m = DIAGNOSTIC.match(line)
        if m is None:
            continue
        newer = NEWER_THAN.match(m.group("flag"))
        if newer and (int(newer.group(1)) <= base or any(a in m.group("what") for a in allowed)):
            continue
        problems.append(f"{m.group('where')}: {m.group('what')} (not in Metal {version})")
    return problems


def forbidden_constructs(preprocessed: str) -> list[str]:
    """MSL-forbidden constructs in the project's lines of a `clang -E` output."""
    problems = []
    where: tuple[str, int] | None = None
    for line in preprocessed.split("\n"):
        marker = LINE_MARKER.match(line)
        if marker:
            name, flags = marker.group(2), marker.group(3).split()
            user = "3" not in flags and not name.startswith("<")
            where = (name, int(marker.group(1))) if user else None
            continue
        if where is None:
            continue
        code = DELETED_FUNCTION.sub(";", STRING_OR_CHAR.sub('""', line))
        for pattern, what in FORBIDDEN:
            if pattern.search(code):
                problems.append(f"{where[0]}:{where[1]}: {what} (Metal has none)")
        where = (where[0], where[1] + 1)
    return problems


def recursion(ir: str) -> list[str]:
    """Functions of an LLVM module that can call themselves (Metal forbids it)."""
    calls: dict[str, set[str]] = {}
    current = None
    for line in ir.split("\n"):
        m = DEFINE.match(line)
        if m:
            current = m.group(1)
            calls[current] = set()
        elif line.startswith("}"):
            current = None
        elif current is not None:
            calls[current].update(CALL.findall(line))
    recursive = []
    for start in calls:
        seen, stack = set(), list(calls[start])
        while stack:
            callee = stack.pop()
            if callee == start:
                recursive.append(start)
                break
            if callee in calls and callee not in seen:
                seen.add(callee)
                stack.extend(calls[callee])
    return [f"{name}: recursion (Metal has none)" for name in recursive]


def check(unit_text: str, preprocessed: str, version: str) -> list[str]:
    """Everything in a rewritten source that Metal `version` would reject (cached)."""
    flags = [*toolchain.KERNEL_FLAGS, f"-isystem{toolchain.SHIM_INCLUDE}"]
    flags += ["-include", "msim/address_spaces.h", "-O0", *FLAGS]
    key = toolchain.digest("conformance", unit_text, *flags, toolchain.clang_version())

    def build(output: Path) -> None:
        rewritten = output.with_suffix(".cpp")
        ir = output.with_suffix(".ll")
        rewritten.write_text(unit_text)
        command = [*toolchain.clang(), *flags, "-x", "c++", "-S", "-emit-llvm"]
        result = subprocess.run(
            [*command, str(rewritten), "-o", str(ir)],
            capture_output=True,
            text=True,
            env=toolchain.clang_env(),
        )
        rewritten.unlink()
        # A source that does not compile is reported by the simulator's own build.
        found = "\n".join(recursion(ir.read_text())) if result.returncode == 0 else ""
        ir.unlink(missing_ok=True)
        output.write_text(result.stderr + "\n" + found)

    report = toolchain.cached_build(key, ".conformance", build).read_text()
    problems = language_problems(report, version)
    problems += [line for line in report.splitlines() if line.endswith("(Metal has none)")]
    return problems + forbidden_constructs(preprocessed)
