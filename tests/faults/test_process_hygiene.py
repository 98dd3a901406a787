"""What a manager leaves in the operating system: no resource_tracker started by fork
workers, and no worker or segment outliving a parent killed with SIGKILL.

(envmgr.backends.local.process, envmgr.protocol.shared_memory)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from time import monotonic
from typing import Any

import pytest
from support.helpers import pid_exists

pytestmark = pytest.mark.timeout(60)


def test_fork_workers_do_not_start_their_own_resource_trackers(run_python: Any) -> None:
    """In a fresh interpreter, a fork-context manager must not make its workers start
    resource_tracker processes of their own: those warn about "leaked" segments at
    exit and unlink the manager's live segment when a worker dies."""
    proc = run_python(
        """
        import numpy as np
        from support.envs import DictObsEnv
        from envmgr import SubprocessEnvManager

        with SubprocessEnvManager(DictObsEnv, 2, 2, context="fork") as envs:
            envs.reset(seed=0)
            envs.step(np.zeros((4, 2), dtype=np.int64))
        print("done")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    assert "resource_tracker" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("caller_envs", [0, 1], ids=["workers", "caller_envs"])
def test_a_forked_child_leaves_the_parents_manager_alone(run_python: Any, caller_envs: int) -> None:
    """A plain os.fork() child inherits the manager. Its calls are refused, its close() is
    a no-op, and its normal exit (atexit: envmgr's close, and multiprocessing's handler,
    which terminated every daemon process on the list of children it inherited) leaves
    the parent's workers and segment as they were: the parent steps on."""
    proc = run_python(
        f"""
        import os, sys
        import numpy as np
        from support.envs import DictObsEnv
        from support.fault_envs import segment_of
        from envmgr import ClosedManagerError, SubprocessEnvManager

        envs = SubprocessEnvManager(DictObsEnv, 2, 2, caller_envs={caller_envs})
        envs.reset(seed=0)
        actions = np.zeros((envs.num_envs, 2), dtype=np.int64)
        envs.step(actions)
        shm = segment_of(envs.worker_pids)
        pid = os.fork()
        if pid == 0:
            try:
                envs.step(actions)
                print("child stepped")
            except ClosedManagerError as exc:
                print("child refused:", exc)
            envs.close()
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child exit status", os.waitstatus_to_exitcode(status))
        envs.step(actions)
        print("workers alive", all(os.path.exists(f"/proc/{{p}}") for p in envs.worker_pids))
        print("segment there", os.path.exists(f"/dev/shm/{{shm}}"))
        envs.close()
        print("segment after close", os.path.exists(f"/dev/shm/{{shm}}"))
        """
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "child refused: cannot step: this process is a fork of process " in out, out
    assert "whose SubprocessEnvManager this is" in out
    assert "child exit status 0" in out
    assert "workers alive True" in out and "segment there True" in out, out
    assert "segment after close False" in out
    assert "Error" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_and_segment_go_when_the_parent_is_killed(context: str) -> None:
    """A manager process killed with SIGKILL cannot close anything: its workers must
    notice and exit, and its segment must not stay in /dev/shm."""
    code = textwrap.dedent(
        f"""
        import json, os, signal, sys
        from support.envs import DictObsEnv
        from support.fault_envs import segment_of
        from envmgr import SubprocessEnvManager

        envs = SubprocessEnvManager(DictObsEnv, 2, 1, context={context!r})
        envs.reset(seed=0)
        shm = segment_of(envs.worker_pids)
        print(json.dumps({{"pids": envs.worker_pids, "shm": shm}}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = dict(os.environ)
    tests_dir = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=tests_dir,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    started = json.loads(proc.stdout.splitlines()[0])
    pids, shm = started["pids"], Path("/dev/shm") / started["shm"]
    try:
        deadline = monotonic() + 30  # a liveness bound, not a performance threshold
        while monotonic() < deadline and (any(map(pid_exists, pids)) or shm.exists()):
            time.sleep(0.05)
        alive = [pid for pid in pids if pid_exists(pid)]
        assert not alive, f"workers {alive} outlived their killed manager"
        assert not shm.exists(), f"{shm} outlived its killed manager"
    finally:
        for pid in pids:  # never leave orphans behind on a shared machine
            if pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
        if shm.exists():
            shm.unlink()
