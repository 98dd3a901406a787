"""``envmgr tune --parallel module:factory``, run as a user would, on a real PettingZoo env."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from envmgr.tune.layouts import candidate_layouts
from envmgr.tune.run import usable_cores

pytestmark = pytest.mark.timeout(300)

SPREAD = "mpe2.simple_spread_v3:parallel_env"


def _tune(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envmgr", "tune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_parallel_prints_agent_steps_and_the_make_parallel_call() -> None:
    proc = _tune("--parallel", SPREAD, "--num-envs", "2", "--seconds", "0.6", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"envmgr tune --parallel {SPREAD}: 2 envs x 3 agent rows on "), out
    for layout in candidate_layouts(2, usable_cores(), has_vector_entry_point=False):
        assert layout.label(2) in out, (layout, out)
    assert "env-steps/s agent-steps/s / ceiling" in out
    assert "\nUse:\n    import mpe2.simple_spread_v3\n" in out
    assert "    envmgr.make_parallel(mpe2.simple_spread_v3.parallel_env, num_envs=2, " in out
    assert "\nWhy:\n  - " in out
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert all(line.startswith("envmgr tune: ") for line in proc.stderr.splitlines())
    assert "(3 agent rows each)" in proc.stderr


BAD = [
    ("mpe2.simple_spread_v3", "give a ParallelEnv factory as module:factory"),
    ("no_such_module_x:parallel_env", "cannot import it: No module named 'no_such_module_x'"),
    ("mpe2.simple_spread_v3:raw_env", "a PettingZoo AEC env"),
    ("gymnasium.envs.classic_control:CartPoleEnv", "without --parallel"),
]


def test_what_is_not_a_parallel_env_factory_is_a_one_line_usage_error() -> None:
    with ThreadPoolExecutor(2) as pool:  # the interpreters start faster side by side
        procs = list(pool.map(lambda case: _tune("--parallel", case[0], timeout=60), BAD))
    for (env, says), proc in zip(BAD, procs, strict=True):
        assert proc.returncode == 2, (env, proc.stderr)
        assert proc.stdout == ""
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"envmgr tune: error: --parallel {env}"), lines[0]
        assert says in lines[0] and lines[0].endswith("(see 'envmgr tune --help')"), lines[0]
