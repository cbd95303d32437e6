"""Kernels alone, side by side: the standalone CUDA harness
(csrc/backend/cuda/testing) of several git revisions in one device call.

Here:    python3 tools/gpu/harness_ab.py prepare main xahead=main+PATCH ...
         exports each revision's tree to .gpu/ab/<name>/ (a revision's name
         with "/" as "-", or name=REV), with the patches after "+" applied
         (tools/gpu/experiments), and MLX's CUDA headers (those that
         tests/test_cuda_build.py caches) to .gpu/ab/include; --keep adds the
         trees beside those already there (replacing any of the same name)
         instead of starting afresh.
Here:    python3 tools/gpu/harness_ab.py build [NAME...] (optional) builds each
         tree's harness here, one at a time, into .gpu/ab/<name>/bin/harness.xz,
         so that the device call spends no time building (nvcc from $NVCC or
         PATH). A translation unit whose sources and flags an earlier tree
         compiled alike is copied from the object cache instead (`nvcc`
         below): trees that differ in a few files build those alone.
Here:    python3 tools/gpu/harness_ab.py slim (optional, after build) leaves of
         each built tree its harness alone (and drops MLX's headers once every
         tree is built), so that the trees fit a call's carry beside MLX's
         wheels (a tree's sources are twice its harness).
Device:  python3 tools/gpu/harness_ab.py run --only "14336x4096 M=1 bf16" ...
         (carry .gpu/ab) builds every tree that has no prebuilt harness, in
         parallel, runs `harness --test` of each unless --no-test (each stopped
         after --test-timeout seconds, its cases so far counted; --test-only
         FILTER: the cases whose names hold FILTER), then --rounds
         rounds of `harness --bench --only FILTER` of every tree (or of those
         --trees names) in turn, until --until seconds, and prints one row a
         case: each tree's times (us) and the first tree's kernel. Logs go to
         $OUT/harness_ab (or /tmp/harness_ab).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / ".gpu" / "ab"
CACHE = Path(os.environ.get("MLX_FPQMM_CACHE_DIR") or Path.home() / ".cache" / "mlx_fpqmm")
OBJECTS = CACHE / "harness_objects"
# A bench row: the case, its time (us), GB/s, % of the read bandwidth, the kernel.
ROW = re.compile(r"^(\S.*?)\s+([0-9.]+)\s+\S+\s+\S+%\s\s(.*)$")
# Seconds a `harness --bench --only FILTER` call may take (its rows so far are kept).
BENCH_TIMEOUT = 120.0


def mlx_version() -> str:
    pin = re.search(r'mlx[^"]*==([0-9.]+)', (ROOT / "pyproject.toml").read_text())
    return pin.group(1) if pin else "0.32.4"


def prepare(revisions: list[str], keep: bool) -> None:
    headers = CACHE / f"mlx-cuda-13-{mlx_version()}" / "mlx" / "include" / "mlx"
    if not keep:
        shutil.rmtree(AB, ignore_errors=True)
    AB.mkdir(parents=True, exist_ok=True)
    if not (AB / "include" / "mlx").is_dir():
        if not headers.is_dir():
            sys.exit(
                f'{headers} is missing: `.venv/bin/python -c "import sys; sys.path.insert(0, '
                f"'tests'); import test_cuda_build as t; t.mlx_cuda_headers('{mlx_version()}')\"` "
                "fetches it once"
            )
        shutil.copytree(headers, AB / "include" / "mlx")
    for revision in revisions:
        name, _, spec = revision.rpartition("=")
        rev, *patches = spec.split("+")
        tree = AB / (name or rev.replace("/", "-"))
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        subprocess.run(f"git archive {rev} | tar -x -C {tree}", shell=True, cwd=ROOT, check=True)
        for patch in patches:
            with open(ROOT / patch) as diff:
                subprocess.run(["patch", "-s", "-p1", "-d", str(tree)], stdin=diff, check=True)
        print(f"{tree.relative_to(ROOT)}: {spec}")
    grep = "grep -qxF '/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude"
    subprocess.run(grep, shell=True, cwd=ROOT, check=True)


def trees() -> list[Path]:
    return sorted(p for p in AB.iterdir() if (p / "csrc").is_dir())


def packed_harness(tree: Path) -> Path:
    """Where `build` here leaves a tree's harness, compressed."""
    return tree / "bin" / "harness.xz"


def slim() -> None:
    """Each built tree down to its harness (and an empty csrc/, which marks a tree); MLX's
    headers too once no tree needs building."""
    for tree in trees():
        if not packed_harness(tree).is_file():
            print(f"{tree.name}: not built, kept whole")
            continue
        for path in tree.iterdir():
            if path.is_dir() and path.name != "bin":
                shutil.rmtree(path)
            elif not path.is_dir():
                path.unlink()
        (tree / "csrc").mkdir()
    if all(packed_harness(tree).is_file() for tree in trees()):
        shutil.rmtree(AB / "include", ignore_errors=True)


def build(tree: Path) -> tuple[Path, int]:
    out = Path("/tmp/harness_ab") / tree.name
    prebuilt = packed_harness(tree)
    if prebuilt.is_file():
        out.mkdir(parents=True, exist_ok=True)
        # Unpacked beside and renamed: a harness of an earlier, killed run may still be
        # running from the old file ("Text file busy" on writing into it).
        unpacked = out / "harness.new"
        with open(unpacked, "wb") as binary:
            done = subprocess.run(["xz", "-dc", str(prebuilt)], stdout=binary)
        unpacked.chmod(0o755)
        unpacked.replace(out / "harness")
        return out / "harness", done.returncode
    script = tree / "csrc" / "backend" / "cuda" / "testing" / "build.sh"
    with open(log_dir() / f"build_{tree.name}.log", "w") as log:
        done = subprocess.run(
            ["sh", str(script), str(out), str(AB / "include")],
            stdout=log,
            stderr=log,
            env={
                **link_environment(),
                "FPQMM_REAL_NVCC": os.environ.get("NVCC", "nvcc"),
                "NVCC": f"{sys.executable} {Path(__file__).resolve()} nvcc",
            },
        )
    return out / "harness", done.returncode


def cached_nvcc(args: list[str]) -> int:
    """`nvcc ARGS`, as build.sh calls it through $NVCC; a compile (`-c SOURCE -o OBJECT`)
    whose flags and files (`nvcc -M`: the source and every header it reads), with the
    tree's own path left out, match an earlier one's takes that object from OBJECTS."""
    nvcc = shutil.which(os.environ.get("FPQMM_REAL_NVCC", "nvcc"))
    if nvcc is None:
        sys.exit("nvcc is not on PATH")
    source = next((a for a in args if a.endswith(".cu")), "")
    if "-c" not in args or "-o" not in args or "/csrc/" not in source:
        return subprocess.run([nvcc, *args]).returncode
    out = args.index("-o")
    flags = [a for a in args[:out] + args[out + 2 :] if a != "-c"]
    tree = source.partition("/csrc/")[0] + "/"
    listed = subprocess.run([nvcc, "-M", *flags], capture_output=True, text=True)
    if listed.returncode != 0 or ":" not in listed.stdout:
        return subprocess.run([nvcc, *args]).returncode
    files = listed.stdout.split(":", 1)[1].replace("\\\n", " ").split()
    # The compiler too: another nvcc must not take this one's objects.
    key = hashlib.sha256(Path(nvcc).resolve().as_posix().encode() + b"\0")
    for flag in flags:
        key.update(flag.replace(tree, "<tree>/").encode() + b"\0")
    for name, path in sorted((name.replace(tree, "<tree>/"), name) for name in files):
        key.update(name.encode() + b"\0" + Path(path).read_bytes())
    cached = OBJECTS / f"{key.hexdigest()}.o"
    if cached.is_file():
        shutil.copyfile(cached, args[out + 1])
        print(f"{source}: cached", file=sys.stderr)
        return 0
    code = subprocess.run([nvcc, *args]).returncode
    if code == 0:
        OBJECTS.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}")
        shutil.copyfile(args[out + 1], partial)
        partial.replace(cached)
    return code


def link_environment() -> dict[str, str]:
    """The environment with the CUDA runtime's static libraries on the link path.

    nvcc from PyPI (nvidia-cuda-nvcc) finds libcudart_static.a and libcudadevrt.a
    only where nvidia-cuda-runtime puts them, next to its bin folder.
    """
    env = dict(os.environ)
    nvcc = shutil.which(env.get("NVCC", "nvcc"))
    lib = Path(nvcc).resolve().parents[1] / "lib" if nvcc else None
    if lib and (lib / "libcudart_static.a").is_file():
        env["LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), env.get("LIBRARY_PATH")]))
    return env


def log_dir() -> Path:
    path = Path(os.environ.get("OUT", "/tmp")) / "harness_ab"
    path.mkdir(parents=True, exist_ok=True)
    return path


def bounded(command: list[str], timeout: float) -> tuple[str, bool]:
    """The command's stdout and stderr, and whether it finished within timeout seconds
    (else it is killed, and what it printed until then is returned)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        return done.stdout + done.stderr, True
    except subprocess.TimeoutExpired as stopped:
        parts = (stopped.stdout or "", stopped.stderr or "")
        text = (p.decode(errors="replace") if isinstance(p, bytes) else p for p in parts)
        return "".join(text), False


def run(
    filters: list[str],
    rounds: int,
    until: float,
    test: bool,
    test_timeout: float,
    test_only: str,
    only_trees: str,
) -> None:
    start = time.monotonic()
    # The trees in --trees's order (its first is the one whose kernels the rows name), else
    # in their names' order.
    by_name = {tree.name: tree for tree in trees()}
    named = [name for name in only_trees.split(",") if name]
    chosen = [by_name[n] for n in named if n in by_name] if named else list(by_name.values())
    unknown = set(named) - set(by_name)
    if unknown or not chosen:
        sys.exit(f"--trees: no tree named {', '.join(sorted(unknown)) or only_trees} in {AB}")
    names = [tree.name for tree in chosen]
    with ThreadPoolExecutor(len(names)) as pool:
        built = dict(zip(names, pool.map(build, chosen), strict=True))
    for name, (_, code) in built.items():
        print(f"build {name}: {'ok' if code == 0 else f'failed ({code}), see its log'}")
    binaries = {name: binary for name, (binary, code) in built.items() if code == 0}
    if test:
        with ThreadPoolExecutor(len(binaries)) as pool:
            # Line-buffered, so that a run stopped at test_timeout keeps its lines.
            command = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
            results = pool.map(
                lambda binary: bounded(
                    [
                        *command,
                        str(binary),
                        "--test",
                        *(["--only", test_only] if test_only else []),
                    ],
                    test_timeout,
                ),
                binaries.values(),
            )
            for name, (output, finished) in zip(binaries, results, strict=True):
                (log_dir() / f"test_{name}.log").write_text(output)
                lines = output.strip().splitlines()
                failed = [line for line in lines if line.startswith("FAIL")]
                cases = sum(line.startswith(("ok ", "FAIL ")) for line in lines)
                summary = (
                    (lines[-1] if lines else "no output")
                    if finished
                    else f"stopped at {test_timeout:.0f} s: {len(failed)} of {cases} cases failed"
                )
                print(f"test {name}: {summary}", *failed[:10], sep="\n  ", flush=True)
    times: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    kernels: dict[str, str] = {}
    done_rounds = 0
    for _ in range(rounds):
        if time.monotonic() - start > until:
            break
        for name, binary in binaries.items():
            for only in filters:
                output, finished = bounded([str(binary), "--bench", "--only", only], BENCH_TIMEOUT)
                if not finished:
                    print(f"bench {name} {only!r}: stopped at {BENCH_TIMEOUT:.0f} s, rows kept")
                with open(log_dir() / "bench.log", "a") as log:
                    log.write(f"### {name} {only}\n{output}")
                for line in output.splitlines():
                    row = ROW.match(line.rstrip())
                    if row:
                        times[row.group(1)][name].append(float(row.group(2)))
                        kernels.setdefault(row.group(1), row.group(3))
        done_rounds += 1
    print(f"{done_rounds} rounds in {time.monotonic() - start:.0f} s; us, each run:")
    print("case".ljust(52), *(name.rjust(24) for name in binaries), " kernel")
    for case, by_tree in times.items():
        cells = ("/".join(f"{t:.2f}" for t in by_tree.get(name, [])) for name in binaries)
        print(case[:52].ljust(52), *(cell.rjust(24) for cell in cells), "", kernels[case][:40])


def main() -> None:
    # build.sh's $NVCC during `build`: its arguments are nvcc's, not ours to parse.
    if sys.argv[1:2] == ["nvcc"]:
        sys.exit(cached_nvcc(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="export revisions' trees and MLX's headers")
    prep.add_argument("revisions", nargs="+", help="git revisions: [name=]revision[+patch...]")
    prep.add_argument("--keep", action="store_true", help="keep the trees already prepared")
    here = commands.add_parser("build", help="here: build each tree's harness into its bin/")
    here.add_argument("names", nargs="*", help="these trees, in this order (default: all)")
    commands.add_parser("slim", help="here, after build: leave each built tree its harness")
    bench = commands.add_parser("run", help="on the GPU machine: build, test, bench")
    bench.add_argument("--only", action="append", required=True, help="a bench filter")
    bench.add_argument("--rounds", type=int, default=3)
    bench.add_argument("--until", type=float, default=480.0, help="no new round after this")
    bench.add_argument("--no-test", dest="test", action="store_false")
    bench.add_argument(
        "--test-timeout",
        type=float,
        default=240.0,
        help="stop each tree's `harness --test` after this (a fresh machine's are slow)",
    )
    bench.add_argument(
        "--test-only", default="", help="`harness --test --only` this filter (default: every case)"
    )
    bench.add_argument(
        "--trees", default="", help="comma-separated tree names, the columns' order (default: all)"
    )
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.revisions, args.keep)
    elif args.command == "slim":
        slim()
    elif args.command == "build":
        for tree in [AB / name for name in args.names] or trees():
            start = time.monotonic()
            packed_harness(tree).unlink(missing_ok=True)
            binary, code = build(tree)
            if code == 0:
                # Compressed, a harness is a fifteenth of its size: trees travel.
                (tree / "bin").mkdir(exist_ok=True)
                with open(packed_harness(tree), "wb") as packed:
                    subprocess.run(["xz", "-T2", "-c", str(binary)], stdout=packed, check=True)
                shutil.rmtree(binary.parent)
            print(f"build {tree.name}: {code} in {time.monotonic() - start:.0f} s", flush=True)
    else:
        run(
            args.only,
            args.rounds,
            args.until,
            args.test,
            args.test_timeout,
            args.test_only,
            args.trees,
        )


if __name__ == "__main__":
    main()
