"""Smoke test of examples/train_cartpole.py with a tiny budget (the full run solves CartPole;
that takes seconds to minutes, so it is not part of the test suite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envmgr.timers.format import load_tree

pytestmark = pytest.mark.timeout(90)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_cartpole.py"
TINY = ["--budget-steps", "1500", "--workers", "2", "--envs-per-worker", "2", "--seed", "1"]


def _check(proc: subprocess.CompletedProcess[str], out: Path) -> None:
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert "episodes" in proc.stdout and "env steps" in proc.stdout and "SPS" in proc.stdout
    assert "not solved within the budget" in proc.stdout  # 1500 steps are far too few
    assert "|| worker_root" in proc.stdout  # format_tree
    assert "straggler: " in proc.stdout  # worker_summary (a straggler only past the noise)
    tree = load_tree(out)
    training = tree["children"]["training"]["children"]
    assert {"policy", "env_step", "bookkeeping"} <= set(training)
    assert training["env_step"]["children"]["workers"]["children"]["worker_1"]["is_parallel"]


def test_train_example_smoke(tmp_path: Path) -> None:
    out = tmp_path / "timers.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=80,
        cwd=tmp_path,
    )
    _check(proc, out)


def test_train_example_runs_without_tqdm(tmp_path: Path) -> None:
    out = tmp_path / "timers.json"
    code = (
        "import runpy, sys\n"
        "sys.modules['tqdm'] = None  # as if tqdm were not installed\n"
        f"sys.argv = [{str(SCRIPT)!r}, *{TINY!r}, '--out', {str(out)!r}]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=80, cwd=tmp_path
    )
    _check(proc, out)
