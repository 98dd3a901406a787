"""Small helpers shared by the manager tests: a CartPole factory, an exception's full
text, batches of sampled actions, and whether a process is alive.

Ray workers cannot import this module by name: ``conftest.py``'s ``backend``
fixture ships it by value, as it does ``envs`` and ``fault_envs``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector.utils import batch_space


def cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def full_text(exc: BaseException) -> str:
    """The message of an exception together with its notes."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


def batch_actions(envs: gym.vector.VectorEnv, steps: int, seed: int = 0) -> list[Any]:
    """``steps`` batches of actions sampled (reproducibly, from ``seed``) for ``envs``."""
    space = batch_space(envs.single_action_space, envs.num_envs)
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


def pid_exists(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def io_bytes(pid: int) -> tuple[int, int]:
    """``(rchar, wchar)``: bytes process ``pid`` has read and written through syscalls."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def traffic(envs: Any, actions: list[Any]) -> tuple[int, int]:
    """Bytes all workers read and wrote while ``actions`` were stepped (summed)."""
    before = [io_bytes(p) for p in envs.worker_pids]
    for a in actions:
        envs.step(a)
    after = [io_bytes(p) for p in envs.worker_pids]
    read = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    written = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return read, written


def run_quick_suite(suite: str, out: Path, *args: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m benchmarks.suites.<suite> --quick ... --out out`` as a user would,
    from the repository root; the report it wrote, after checking it wrote only that."""
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", f"benchmarks.suites.{suite}", "--quick", *args]
    proc = subprocess.run(
        [*command, "--out", str(out)],
        cwd=repo, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["quick.json", "quick.txt"]
    report: dict[str, Any] = json.loads((out / "quick.json").read_text())
    assert {"cpu_model", "date", "git_commit"} <= set(report["machine"])
    return report
