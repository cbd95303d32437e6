"""The README's Python examples that need neither a model download nor several
processes run as they are pasted, and print what their comments say."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
# A model to download, or a distributed group of processes.
NEEDS_MORE = ("path/or/hf-repo", "mx.distributed.init")
SELF_CONTAINED = [b for b in BLOCKS if not any(marker in b for marker in NEEDS_MORE)]


def test_readme_has_self_contained_examples():
    assert len(SELF_CONTAINED) >= 3 and len(BLOCKS) > len(SELF_CONTAINED)


@pytest.mark.parametrize("block", SELF_CONTAINED, ids=lambda b: b.splitlines()[-1][:40])
def test_readme_example_runs(block, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # The one-line prints whose comment says what they print printed exactly that, in
    # that order, among the block's output lines.
    expected = [
        line.split("#", 1)[1].strip()
        for line in block.splitlines()
        if line.startswith("print(")
        and line.split("#", 1)[0].rstrip().endswith(")")
        and "#" in line
    ]
    printed = iter(line.strip() for line in done.stdout.splitlines())
    for value in expected:
        assert any(line == value for line in printed), (value, done.stdout)
