"""Gymnasium's AsyncVectorEnv tests and SB3's SubprocVecEnv tests, run with envmgr in place.

Run (from the repository root, with the project's virtualenv)::

    python -m benchmarks.probes.compat_suites --gymnasium PATH --sb3 PATH [--out FILE]

``PATH`` is a Gymnasium or Stable-Baselines3 checkout (or an unpacked sdist that ships
``tests/``) of the version installed here; either may be left out. Nothing is fetched:
get the sources yourself, e.g. ``git archive v1.4.0 tests | tar x -C /tmp/gym`` in a
Gymnasium clone, ``pip download --no-deps --no-binary :all: stable-baselines3==X`` and
unpack. Never copy them into this repository.

How envmgr is put in place: this file is also a pytest plugin. Each suite runs as
``python -m pytest -p compat_suites ...`` from the checkout, with this directory on
``PYTHONPATH``; the plugin's ``pytest_configure`` runs before the test modules are
imported and replaces

* ``gymnasium.vector.AsyncVectorEnv`` with a function building
  ``envmgr.SubprocessEnvManager(env_fns, n_workers=len(env_fns), **kwargs)`` (one env
  per worker, as ``AsyncVectorEnv`` has; its keyword arguments have the same names);
* ``stable_baselines3.common.vec_env.SubprocVecEnv`` with
  ``envmgr.integrations.sb3.EnvmgrVecEnv`` (same constructor).

Gymnasium's render and call tests need pygame (``gymnasium[classic-control]``); without it
they fail in AsyncVectorEnv too. SB3's ``test_render`` skips without ``DISPLAY``, and with
one it needs an OpenCV built with a GUI (headless OpenCV fails it under ``DummyVecEnv``
as well). A ``pip install --target DIR pygame`` and ``DIR`` on ``PYTHONPATH`` is enough.

It prints each suite's counts, then every failure with its reason and, for the failures
issue 23 lists as deliberate differences, which one (``EXPECTED``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The Gymnasium tests: AsyncVectorEnv's own file.
GYMNASIUM_TESTS = ["tests/vector/test_async_vector_env.py"]

#: SB3's tests that build a SubprocVecEnv; in the other files only the cases that do.
SB3_TESTS = [
    "tests/test_vec_envs.py",
    "tests/test_utils.py::test_make_vec_env",
    "tests/test_utils.py::test_custom_vec_env",
    "tests/test_utils.py::test_evaluate_policy_monitors",
    "tests/test_dict_env.py::test_multiprocessing",
    "tests/test_her.py::test_multiprocessing",
]

#: Failures that are envmgr's documented differences (README, "Differences from
#: AsyncVectorEnv"), by test name: why the test cannot pass with envmgr in place.
EXPECTED = {
    "test_async_vector_subenv_error": "an env error keeps its worker alive: envmgr logs no "
    "'Shutting it down' warnings (the error itself is raised, with worker and env named)",
    "test_custom_space_async_vector_env_shared_memory": "a custom space travels pickled "
    "beside the shared arrays instead of refusing shared_memory=True",
    "test_step_timeout_async_vector_env": "actions reach the env in the action space's dtype: "
    "SlowEnv's float32 Box gets np.float32(0.1), not the float64 it was passed, and "
    "time.sleep(np.float32) raises TypeError before the timeout can happen",
}

#: Per-test time limit (pytest-timeout): a hung worker fails one test, not the run.
TIMEOUT_S = 300


# ------------------------------------------------------------------ the pytest plugin


def _async_vector_env(env_fns: Any, **kwargs: Any) -> Any:
    """``AsyncVectorEnv(env_fns, **kwargs)`` built as an envmgr manager, one env per worker."""
    from envmgr import SubprocessEnvManager

    env_fns = list(env_fns)
    return SubprocessEnvManager(env_fns, n_workers=len(env_fns), **kwargs)


#: Managers built during the run: the report shows it, so a swap that did not take shows.
_built = [0]


def pytest_configure(config: Any) -> None:
    """Put envmgr in place of AsyncVectorEnv / SubprocVecEnv before any test module imports."""
    import gymnasium.vector
    import gymnasium.vector.async_vector_env

    from envmgr import SubprocessEnvManager

    init = SubprocessEnvManager.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        _built[0] += 1
        init(self, *args, **kwargs)

    SubprocessEnvManager.__init__ = counted  # type: ignore[method-assign]

    gymnasium.vector.AsyncVectorEnv = _async_vector_env  # type: ignore[assignment,misc]
    gymnasium.vector.async_vector_env.AsyncVectorEnv = _async_vector_env  # type: ignore[misc]
    try:
        import stable_baselines3.common.vec_env as sb3_vec_env
    except ImportError:
        return
    from envmgr.integrations.sb3 import EnvmgrVecEnv

    sb3_vec_env.SubprocVecEnv = EnvmgrVecEnv  # type: ignore[misc]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"envmgr managers built: {_built[0]}")


# ------------------------------------------------------------------ the runner


def run_suite(name: str, checkout: Path, tests: list[str]) -> list[str]:
    """Run ``tests`` in ``checkout`` with the plugin; return the report's lines."""
    here = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(here.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    cmd = [
        sys.executable, "-m", "pytest", "-p", "compat_suites", "-p", "no:cacheprovider",
        "-q", "-rfEs", "--tb=line", f"--timeout={TIMEOUT_S}", *tests,
    ]  # fmt: skip
    env["COLUMNS"] = "400"  # pytest cuts the short summary's reasons to the terminal's width
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    out = proc.stdout.splitlines()
    summary = next((ln for ln in reversed(out) if re.search(r"\d+ (passed|failed)", ln)), "")
    lines = [f"## {name} ({checkout.name})", f"$ cd {checkout} && python {' '.join(cmd[1:])}"]
    lines.append(f"result: {summary.strip('= ') or 'no summary: ' + proc.stderr[-500:]}")
    lines += [ln for ln in out if ln.startswith("envmgr managers built:")]
    lines += [f"  {ln}" for ln in out if ln.startswith("SKIPPED")]
    for ln in out:
        match = re.match(r"(FAILED|ERROR) (\S+)(?: - (.*))?", ln)
        if not match:
            continue
        test_id, reason = match.group(2), (match.group(3) or "").strip()
        base = test_id.split("::")[-1].split("[")[0]
        why = EXPECTED.get(base)
        label = f"EXPECTED ({why})" if why else "UNEXPECTED"
        lines.append(f"  {match.group(1)} {test_id}: {label}\n      {reason[:300]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gymnasium", type=Path, help="a Gymnasium checkout")
    parser.add_argument("--sb3", type=Path, help="a Stable-Baselines3 checkout")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.gymnasium is None and args.sb3 is None:
        parser.error("give --gymnasium and/or --sb3")

    import gymnasium

    lines = [f"python {sys.version.split()[0]}, gymnasium {gymnasium.__version__}"]
    if importlib.util.find_spec("pygame") is not None:
        lines[0] += ", pygame importable"
    else:
        lines[0] += ", no pygame (Gymnasium's render/call tests fail for that alone)"
    if args.sb3 is not None:
        import stable_baselines3

        lines[0] += f", stable-baselines3 {stable_baselines3.__version__}"
    if args.gymnasium is not None:
        lines += run_suite("Gymnasium AsyncVectorEnv", args.gymnasium, GYMNASIUM_TESTS)
    if args.sb3 is not None:
        lines += run_suite("SB3 SubprocVecEnv", args.sb3, SB3_TESTS)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
