"""The README's runnable entry points work: examples/quickstart.py and ``python -m envmgr demo``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd is a scratch directory: nothing the run writes lands in the repository,
    # and envmgr is imported the way a user's script would import it.
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=80
    )


def _assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr  # e.g. resource_tracker warnings


def test_quickstart_runs(tmp_path: Path) -> None:
    proc = _run([str(REPO / "examples" / "quickstart.py"), "--steps", "20"], tmp_path)
    _assert_clean(proc)
    assert "worker_root" in proc.stdout
    assert "20 batch steps of 16 envs" in proc.stdout


def test_demo_runs(tmp_path: Path) -> None:
    proc = _run(["-m", "envmgr", "demo", "--seconds", "0.5"], tmp_path)
    _assert_clean(proc)
    assert "env-steps/s" in proc.stdout
    assert "worker_root" in proc.stdout


# ------------------------------------------------------------------ the docs' Python blocks

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Blocks a reader can paste and run as they stand, by their first line.
RUNNABLE = {
    "quick_start": "import gymnasium as gym",
    "make": "import envmgr\n\nenvs = envmgr.make(",
}
#: Blocks that are parts of a larger script, and why they are not run here.
FRAGMENTS = {
    "import envmgr\nfrom envmgr import SubprocessEnvManager": "MyVectorEnv stands for the "
    "reader's own VectorEnv",
    "from envmgr.tune import tune": "a 50 s measurement (tests/test_tune.py runs tune small)",
    "from envmgr import RayEnvManager": "a one-line change to the reader's script, on a running "
    "cluster (tests/test_ray*.py start one)",
    "from stable_baselines3 import PPO": "a one-line change to the reader's SB3 script "
    "(tests/test_sb3.py trains through it)",
}


def _python_blocks() -> list[tuple[str, str]]:
    """``(where, code)`` for every Python block of the README and docs/."""
    blocks = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            blocks.append((f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1)))
    return blocks


def test_every_python_block_in_the_docs_is_run_or_said_to_be_a_fragment() -> None:
    for where, code in _python_blocks():
        kinds = [k for k in (*RUNNABLE.values(), *FRAGMENTS) if code.startswith(k)]
        assert len(kinds) == 1, f"{where}: classify this block in RUNNABLE or FRAGMENTS"


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_runnable_python_blocks_run_as_written(name: str, tmp_path: Path) -> None:
    """Pasted into a fresh interpreter, the block runs and leaves nothing behind, even where
    it never closes its manager (interpreter exit does)."""
    start = RUNNABLE[name]
    found = [(w, c) for w, c in _python_blocks() if c.startswith(start)]
    assert found, f"no block starts with {start!r}"
    for where, code in found:
        script = tmp_path / "block.py"
        script.write_text(code, encoding="utf-8")
        before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        proc = _run([str(script)], tmp_path)
        _assert_clean(proc)
        assert proc.stderr == "", f"{where}: {proc.stderr}"
        if os.path.isdir("/dev/shm"):
            assert set(os.listdir("/dev/shm")) - before == set(), where
    if name == "quick_start":  # its last line writes the merged tree
        assert "worker_root" in (tmp_path / "timers.json").read_text()
