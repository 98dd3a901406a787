"""What the README and the docs tell a reader to run works: the demo, the examples, and every
Python block of README.md and docs/**/*.md (each run in a fresh interpreter, or compiled only
where ``COMPILE_ONLY`` says why)."""

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


# ------------------------------------------------------------------ the examples

#: Each example a reader runs, its tiny run's arguments, the package it needs, and a line its
#: output must hold. ENVMGR_EXAMPLE_TINY=1 makes every one a few seconds' run.
EXAMPLES = {
    "ppo_torch.py": ("torch", "env-steps/s"),
    "first_ready.py": (None, "env steps through send/recv"),
    "ray_cartpole.py": ("ray", "envs on Ray:"),
    "tune_layout.py": (None, "envs stepped with the fastest layout"),
    "pettingzoo_shared_policy.py": ("mpe2", "mean reward per agent-step"),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_at_a_tiny_size(name: str, tmp_path: Path) -> None:
    needs, expected = EXAMPLES[name]
    if needs is not None:
        pytest.importorskip(needs, reason=f"examples/{name} needs {needs}")
    env = {**os.environ, "ENVMGR_EXAMPLE_TINY": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / name)],
        cwd=tmp_path, capture_output=True, text=True, timeout=110, env=env,
    )  # fmt: skip
    _assert_clean(proc)
    assert expected in proc.stdout, proc.stdout


def test_examples_import_only_envmgrs_public_names() -> None:
    """A reader copies an example's imports: they name only what ``envmgr`` makes public
    (``envmgr.__all__``, its public subpackages and the integrations)."""
    public = ("envmgr.timers", "envmgr.tune", "envmgr.integrations.sb3")
    for path in sorted((REPO / "examples").glob("*.py")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith(("from envmgr", "import envmgr")):
                module = line.split()[1]
                assert module == "envmgr" or module.startswith(public), f"{path.name}: {line}"


# ------------------------------------------------------------------ the docs' Python blocks

#: README.md and every page of the docs site.
DOCS = [
    REPO / "README.md",
    *sorted(p for p in (REPO / "docs").rglob("*.md") if "_build" not in p.parts),
]
#: Blocks that are compiled only, by their page and first line, and why they are not run.
COMPILE_ONLY = {
    ("docs/guide/ray-errors.md", "import sys"): "my_envs stands for a module of the "
    "reader's next to their script; tests/on_ray/test_ray_errors.py builds one and checks the fix",
    ("README.md", "# envs = gym.vector.AsyncVectorEnv"): "a one-line change to the reader's "
    "script (make_env is theirs); tests/contract runs AsyncVectorEnv code on envmgr",
    ("README.md", "# env = SubprocVecEnv"): "a one-line change to the reader's SB3 script; "
    "docs/migration/from-sb3.md runs the same swap",
    ("README.md", "# envs = concat_vec_envs_v1"): "a one-line change (env_fn is the reader's); "
    "docs/migration/from-supersuit.md runs make_parallel",
    ("docs/guide/batched-envs.md", "import envmgr"): "MyVectorEnv stands for the reader's own "
    "VectorEnv (examples/batched_env.py runs one)",
    ("docs/guide/multi-agent.md", "from stable_baselines3 import PPO"): "10,000 PPO steps "
    "(tests/unit/integrations/test_sb3_agents.py trains through AgentsVecEnv)",
    ("docs/guide/ray.md", "from envmgr import RayEnvManager"): "a one-line change to the "
    "reader's script, on a running cluster (examples/ray_cartpole.py runs a local one)",
    ("docs/guide/sb3.md", "from stable_baselines3 import PPO"): "a one-line change to the "
    "reader's SB3 script (make_env is theirs); docs/migration/from-sb3.md runs the swap",
    ("docs/guide/tune.md", "from envmgr.tune import tune"): "a 50 s measurement "
    "(examples/tune_layout.py runs tune small)",
}
#: What a block that runs needs beyond the test extra, by the first import it names.
NEEDS = {"stable_baselines3": "stable_baselines3", "mpe2": "mpe2"}


def _python_blocks() -> list[tuple[str, str, str]]:
    """``(page, line, code)`` for every Python block of the README and the docs' pages."""
    blocks = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        page = path.relative_to(REPO).as_posix()
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            blocks.append((page, str(text.count("\n", 0, m.start()) + 1), m.group(1)))
    return blocks


def _reason(page: str, code: str) -> str | None:
    return next(
        (why for (p, start), why in COMPILE_ONLY.items() if p == page and code.startswith(start)),
        None,
    )


def test_every_compile_only_entry_names_a_block() -> None:
    blocks = _python_blocks()
    for page, start in COMPILE_ONLY:
        assert any(p == page and c.startswith(start) for p, _, c in blocks), (page, start)


@pytest.mark.parametrize(
    "page,line,code", [pytest.param(*b, id=f"{b[0]}:{b[1]}") for b in _python_blocks()]
)
def test_python_block_runs_as_written(page: str, line: str, code: str, tmp_path: Path) -> None:
    """Pasted into a fresh interpreter, the block runs and leaves nothing behind, even where
    it never closes its manager (interpreter exit does). Compile-only blocks compile."""
    compile(code, f"{page}:{line}", "exec")
    why = _reason(page, code)
    if why is not None:
        return  # compiled above; COMPILE_ONLY says why it does not run here
    for module, package in NEEDS.items():
        if module in code:
            pytest.importorskip(package, reason=f"{page}:{line} needs {package}")
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    created = tmp_path / "segments.txt"
    proc = _run(["-c", RUN_RECORDING_SEGMENTS, str(script), str(created)], tmp_path)
    _assert_clean(proc)
    names = created.read_text(encoding="utf-8").split()
    left = [n for n in names if Path("/dev/shm", n).exists()]
    assert left == [], f"{page}:{line}: shared memory left behind"


#: Runs a block as ``__main__`` and, once everything else has exited (its atexit hook is
#: registered first, so it runs last), writes the names of the segments the block created.
RUN_RECORDING_SEGMENTS = """
import atexit, runpy, sys
from envmgr.protocol.shared_memory import SharedBuffers
created = []
original = SharedBuffers.__dict__["create"].__func__
def create(cls, *args, **kwargs):
    buffers = original(cls, *args, **kwargs)
    created.append(buffers.name)
    return buffers
SharedBuffers.create = classmethod(create)
atexit.register(lambda: open(sys.argv[2], "w").write("\\n".join(created)))
runpy.run_path(sys.argv[1], run_name="__main__")
"""
