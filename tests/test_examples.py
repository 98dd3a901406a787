"""The README's runnable entry points work: examples/quickstart.py and ``python -m envmgr demo``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parent.parent


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
