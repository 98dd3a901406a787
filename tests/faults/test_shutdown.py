"""Shutdown: the parent killed outright, Ctrl-C, and close() in awkward states.

The parent-death and Ctrl-C tests run the manager in a child interpreter (a
"parent" of its own workers), started in a new session so that signals meant
for it never reach pytest. Each asserts that the workers, the helper processes
multiprocessing started for that interpreter (resource tracker, forkserver) and
the shared-memory segment all disappear within a polling bound. A finally block
SIGKILLs anything left over, so a failing test never leaves processes behind on
this shared machine.

Time bounds are polling deadlines (``within 5 s``), never speed expectations.
Each way a worker notices its manager's death (pipe end-of-file, watchdog
thread, parent-death signal) is also shown to work with the other two taken
out of play.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from support.fault_envs import (
    fault_env_fns,
    process_token,
    segment_of,
    segment_path,
    wait_gone,
    wait_unlinked,
)

from envmgr import ClosedManagerError, SubprocessEnvManager

pytestmark = pytest.mark.timeout(60)

TESTS_DIR = Path(__file__).resolve().parents[1]
GONE_WITHIN = 5.0  # seconds for workers to disappear once their manager is gone
UNLINKED_WITHIN = 10.0  # seconds for the resource tracker to unlink an orphaned segment

# The child interpreter: builds a manager (2 workers x 2 envs, env 3 may hang at
# its first step), prints its worker pids and segment as one JSON line, then
# idles, steps into the hang, or steps in a loop until interrupted. An optional
# JSON argument holds extra FaultEnv arguments for every env (e.g. to take one of
# the workers' exit paths out of play).
CHILD = r"""
import faulthandler, json, os, signal, sys, time
faulthandler.register(signal.SIGUSR2, all_threads=True)  # Child.line's stack dump on a hang
# Ctrl-C as in a Python started from a terminal: pytest may run with SIGINT ignored (a
# non-interactive shell ignores it in a command it puts in the background), and this
# interpreter would inherit that.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
import gymnasium as gym
import numpy as np
from support.fault_envs import fault_env_fns, segment_of
from envmgr import SubprocessEnvManager

context, mode, state_dir = sys.argv[1], sys.argv[2], sys.argv[3]
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
kind = {"busy": "hang", "spin": "spin", "hold_gil": "hold_gil"}.get(mode, "none")
fns = fault_env_fns(kind, 4, 3, at_step=1, state_dir=state_dir,
                    ready_file=os.path.join(state_dir, "hanging"), **extra)
envs = SubprocessEnvManager(fns, 2, 2, context=context)
envs.reset(seed=0)
zeros = np.zeros(4, dtype=np.int64)
print(json.dumps({"pids": envs.worker_pids, "segment": segment_of(envs.worker_pids)}), flush=True)
if mode == "idle":
    time.sleep(600)
elif mode in ("busy", "spin", "hold_gil"):
    envs.step(zeros)  # worker 1 never answers
elif mode == "loop":
    steps = 0
    try:
        with envs:
            while True:
                envs.step(zeros)
                steps += 1
                if steps == 10:
                    print("looping", flush=True)
    except KeyboardInterrupt:
        alive = [p for p in envs.worker_pids if os.path.exists(f"/proc/{p}")]
        print(json.dumps({"closed": envs.closed, "steps": steps, "alive": alive}), flush=True)
        raise
elif mode == "exit":
    pass  # leave without close(): the atexit hook must clean up
elif mode == "exit_pending":
    envs.step_async(zeros)  # leave with a step in flight: cleaned up at exit, quietly
"""


# ------------------------------------------------------------------ helpers


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, grandchildren...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Child:
    """The child interpreter, with its stdout read line by line in a thread."""

    def __init__(
        self, context: str, mode: str, state_dir: Path, extra: dict[str, Any] | None = None
    ) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, context, mode, str(state_dir), json.dumps(extra or {})],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(TESTS_DIR),
            start_new_session=True,  # its own process group: Ctrl-C for it alone
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stderr = ""
        self.tokens: list[Any] = []  # every process of its tree we have seen

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def line(self, timeout: float = 40.0) -> str:
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no output from the child within {timeout} s; {self.post_mortem()}"
            ) from None
        if got is None:
            self.finish(5.0)
            raise AssertionError(f"the child exited ({self.proc.returncode}): {self.stderr}")
        return got

    def note_tree(self) -> None:
        """Remember the child's whole process tree (workers, tracker, forkserver)."""
        for pid in descendants(self.proc.pid):
            tok = process_token(pid)
            if tok is not None and tok not in self.tokens:
                self.tokens.append(tok)

    def post_mortem(self) -> str:
        """What the silent child was doing: its signal masks (a SIGINT it ignores, say,
        inherited from whoever started pytest) and every thread's stack, then its stderr
        (the child is stopped by it)."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                masks = " ".join(line.strip() for line in f if line.startswith("Sig"))
        except OSError:
            masks = "(no /proc status)"
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR2)  # faulthandler writes the stacks
            time.sleep(1.0)
        self.finish(5.0)
        return f"signal masks: {masks}; its stderr:\n{self.stderr}"

    def finish(self, timeout: float) -> int:
        """Wait for (and reap) the child; returns its exit code.

        The exit code comes first: the child's pipes stay open as long as any of
        its descendants (a worker that failed to exit) holds them, and waiting for
        them here would turn that failure into a hang instead of a message.
        """
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            _, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stderr = "(stderr is still held open by a descendant of the child)"
        self._reader.join(5.0)
        return self.proc.returncode

    def kill_everything(self) -> None:
        """Last resort after a failure: SIGKILL the child and everything it started."""
        self.note_tree()
        if self.proc.poll() is None:
            self.proc.kill()
        for tok in self.tokens:
            if wait_gone([tok], timeout=0):
                try:
                    os.kill(tok[0], signal.SIGKILL)
                except OSError:
                    pass
        self.finish(10.0)


@contextmanager
def child(
    context: str, mode: str, state_dir: Path, extra: dict[str, Any] | None = None
) -> Iterator[Child]:
    c = Child(context, mode, state_dir, extra)
    try:
        yield c
    finally:
        c.kill_everything()


def wait_for_file(path: Path, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)


def assert_tree_gone(c: Child, worker_tokens: list[Any], segment: str) -> None:
    """Workers gone within GONE_WITHIN s, the rest of the tree soon after, segment unlinked.

    The workers are orphans once the child is dead; their new parent (init here)
    reaps them, which is outside envmgr's control, so an orphan that has exited but
    is not yet reaped (a zombie) counts as gone.
    """
    left = wait_gone(worker_tokens, timeout=GONE_WITHIN, zombie_ok=True)
    assert not left, f"workers still running {GONE_WITHIN} s after their manager died: {left}"
    left = wait_gone(c.tokens, timeout=GONE_WITHIN, zombie_ok=True)
    assert not left, f"helper processes of the dead manager still running: {left}"
    assert wait_unlinked(segment, timeout=UNLINKED_WITHIN), f"/dev/shm/{segment} was never unlinked"


# ------------------------------------------------------------------ the parent is killed


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("context", "mode"),
    [(m, "idle") for m in ("fork", "forkserver", "spawn")]
    + [(m, "busy") for m in ("fork", "forkserver", "spawn")]
    + [("forkserver", "spin")],
)
def test_workers_exit_when_the_parent_is_sigkilled(context: str, mode: str, tmp_path: Path) -> None:
    """``idle``: workers wait for a command. ``busy``: worker 1 is inside a step that
    sleeps for an hour; ``spin``: one that spins in Python code for an hour (the
    death signal or the watchdog thread must end it)."""
    with child(context, mode, tmp_path) as c:
        info = json.loads(c.line())
        worker_tokens = [process_token(p) for p in info["pids"]]
        assert all(worker_tokens), info
        assert segment_path(info["segment"]).exists()
        if mode in ("busy", "spin"):
            wait_for_file(tmp_path / "hanging")
        c.note_tree()
        assert {t[0] for t in worker_tokens} <= {t[0] for t in c.tokens}

        os.kill(c.proc.pid, signal.SIGKILL)
        assert c.finish(10.0) == -signal.SIGKILL
        assert_tree_gone(c, worker_tokens, info["segment"])


# Each of the three ways a worker learns that its manager died, shown to work alone
# (README: "end-of-file on their pipe, a watchdog thread, and ... the kernel's
# parent-death signal"). The other two are taken out of play from inside the env:
# ``no_death_signal`` cancels the death signal with prctl; ``mute_watchdog`` makes
# the watchdog thread's os._exit block; a worker busy in a step never reads its
# pipe; one asleep in C code holding the GIL runs no Python thread at all.
LAYERS = {
    # layer: (mode, FaultEnv arguments for every env)
    "pipe-eof": ("idle", {"no_death_signal": True, "mute_watchdog": True}),
    "watchdog": ("spin", {"no_death_signal": True}),
    "death-signal": ("hold_gil", {}),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("layer", "context"),
    [
        ("pipe-eof", "fork"),
        ("pipe-eof", "forkserver"),
        ("pipe-eof", "spawn"),
        ("watchdog", "fork"),
        ("watchdog", "forkserver"),
        ("watchdog", "spawn"),
        ("death-signal", "fork"),
        ("death-signal", "spawn"),
    ],
)
def test_each_parent_death_layer_works_alone(layer: str, context: str, tmp_path: Path) -> None:
    mode, extra = LAYERS[layer]
    with child(context, mode, tmp_path, extra) as c:
        info = json.loads(c.line())
        worker_tokens = [process_token(p) for p in info["pids"]]
        if mode != "idle":
            wait_for_file(tmp_path / "hanging")
        c.note_tree()
        os.kill(c.proc.pid, signal.SIGKILL)
        assert c.finish(10.0) == -signal.SIGKILL
        assert_tree_gone(c, worker_tokens, info["segment"])


# ------------------------------------------------------------------ Ctrl-C


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("context", "target"),
    [("fork", "group"), ("fork", "parent"), ("forkserver", "group"), ("spawn", "group")],
)
def test_ctrl_c_closes_the_manager_cleanly(context: str, target: str, tmp_path: Path) -> None:
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) or to the
    parent alone: KeyboardInterrupt in the parent's loop, the ``with`` block closes
    the manager, and the interpreter exits as for any uncaught KeyboardInterrupt."""
    with child(context, "loop", tmp_path) as c:
        info = json.loads(c.line())
        worker_tokens = [process_token(p) for p in info["pids"]]
        assert c.line().strip() == "looping"
        c.note_tree()
        if target == "group":
            os.killpg(c.proc.pid, signal.SIGINT)
        else:
            os.kill(c.proc.pid, signal.SIGINT)
        report = json.loads(c.line())
        code = c.finish(30.0)
        stderr = c.stderr
        assert code == -signal.SIGINT, (code, stderr)
        assert report["closed"] is True and report["steps"] >= 10
        assert report["alive"] == [], "close() returned with workers alive"
        # The workers were the child's to reap, and it did (close joins them).
        assert not wait_gone(worker_tokens, timeout=GONE_WITHIN)
        assert wait_unlinked(info["segment"], timeout=0.0), "close() did not unlink the segment"
        # One traceback, the parent's; nothing from workers or the resource tracker.
        assert stderr.count("Traceback (most recent call last)") == 1, stderr
        assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
        for noise in ("worker_main", "envmgr-worker", "Process ", "leaked", "resource_tracker"):
            assert noise not in stderr, stderr
        assert_tree_gone(c, worker_tokens, info["segment"])


@pytest.mark.parametrize(
    ("context", "mode"),
    [("fork", "exit"), ("forkserver", "exit"), ("spawn", "exit"), ("forkserver", "exit_pending")],
)
def test_exit_without_close_cleans_up_at_exit(context: str, mode: str, tmp_path: Path) -> None:
    """A script that ends without close() (with a step in flight, too) exits cleanly:
    the exit hook ends the workers and unlinks the segment, and prints nothing. A warning
    about the pending call would point at envmgr's exit hook, not at the user's code."""
    with child(context, mode, tmp_path) as c:
        info = json.loads(c.line())
        worker_tokens = [process_token(p) for p in info["pids"]]
        c.note_tree()
        assert c.finish(30.0) == 0, c.stderr
        assert "leaked" not in c.stderr and "Traceback" not in c.stderr, c.stderr
        assert "Calling `close`" not in c.stderr, c.stderr
        assert wait_unlinked(info["segment"], timeout=0.0), "atexit did not unlink the segment"
        assert_tree_gone(c, worker_tokens, info["segment"])


# ------------------------------------------------------------------ close()


def _manager(kind: str, tmp_path: Path, **kwargs: Any) -> SubprocessEnvManager:
    fns = fault_env_fns(
        kind, 4, 3, at_step=1, state_dir=tmp_path, ready_file=str(tmp_path / "hanging")
    )
    return SubprocessEnvManager(fns, 2, 2, **kwargs)


def _tokens_and_segment(envs: SubprocessEnvManager) -> tuple[list[Any], str]:
    return [process_token(p) for p in envs.worker_pids], segment_of(envs.worker_pids)


@pytest.mark.timeout(30)
def test_close_is_idempotent() -> None:
    envs = SubprocessEnvManager(fault_env_fns("none", 4, 3), 2, 2, context="fork")
    tokens, segment = _tokens_and_segment(envs)
    envs.reset(seed=0)
    envs.step(np.zeros(4, dtype=np.int64))
    for _ in range(3):
        envs.close()
        assert envs.closed
        assert not wait_gone(tokens, timeout=0.0)  # close() returns after reaping them
        assert not segment_path(segment).exists()
    with pytest.raises(ClosedManagerError):
        envs.reset()
    envs.__exit__(None, None, None)
    del envs  # __del__ after close is harmless too


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kind", "context"),
    [
        ("hang", "fork"),
        ("hang", "forkserver"),
        ("hang", "spawn"),
        ("hang_noterm", "fork"),
        ("hang_noterm", "forkserver"),
        ("hang_noterm", "spawn"),
    ],
)
def test_close_with_a_hung_worker_returns_within_close_timeout(
    kind: str, context: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Worker 1 sleeps inside a step nobody waits for. ``hang`` dies of SIGTERM after
    close_timeout; ``hang_noterm`` ignores SIGTERM, so close() must go on to SIGKILL.

    Time is checked from below only (close() gave the worker its ``close_timeout``
    to exit cleanly before terminating it), which no load can break; that it
    returns at all is bounded by the test's timeout."""
    close_timeout = 1.0
    envs = _manager(kind, tmp_path, context=context, close_timeout=close_timeout)
    tokens, segment = _tokens_and_segment(envs)
    envs.reset(seed=0)
    envs.step_async(np.zeros(4, dtype=np.int64))
    wait_for_file(tmp_path / "hanging")
    t0 = time.monotonic()
    with pytest.warns(UserWarning, match="Calling `close` while waiting for a pending call to"):
        envs.close()
    elapsed = time.monotonic() - t0
    # close() waits close_timeout for a clean exit, then SIGTERM (+1 s), then SIGKILL.
    assert elapsed >= close_timeout, f"close() gave the worker only {elapsed:.2f} s"
    assert envs.closed
    assert not wait_gone(tokens, timeout=0.0), "close() returned before the hung worker was gone"
    assert not segment_path(segment).exists()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["step_async", "send", "reset_async"])
def test_close_with_a_call_pending(how: str) -> None:
    envs = SubprocessEnvManager(fault_env_fns("none", 4, 3), 2, 2, context="fork")
    tokens, segment = _tokens_and_segment(envs)
    envs.reset(seed=0)
    zeros = np.zeros(4, dtype=np.int64)
    if how == "step_async":
        envs.step_async(zeros)
    elif how == "send":
        envs.send(zeros[:2], [2, 3])
    else:
        envs.reset_async(seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs.close()
    # As AsyncVectorEnv: a pending call is named; send() steps in flight are not one.
    said = [str(w.message) for w in caught]
    if how == "send":
        assert said == []
    else:
        pending = how.removesuffix("_async")
        assert len(said) == 1 and f"pending call to `{pending}` to complete" in said[0], said
    assert envs.closed
    assert not wait_gone(tokens, timeout=0.0)
    assert not segment_path(segment).exists()
    with pytest.raises(ClosedManagerError):
        envs.step_wait()
    envs.close()


@pytest.mark.timeout(60)
def test_close_reaches_workers_that_spin_on_their_command_word() -> None:
    """A worker spinning for its next command watches its command word, not its pipe:
    ``close()`` flags its Close message there, so the workers leave at once instead of
    when their spin budget (here 10 minutes) runs out. Both the spin budget and
    ``close_timeout`` outlast this test's time limit, so only a prompt exit passes."""
    envs = SubprocessEnvManager(
        lambda: gym.make("CartPole-v1"),
        2,
        2,
        context="fork",
        spin_seconds=600.0,
        close_timeout=600.0,
    )
    pids = list(envs.worker_pids)
    envs.reset(seed=0)
    envs.step(np.zeros(4, dtype=np.int64))
    envs.close()
    for pid in pids:  # reaped by close(): gone, not left spinning
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
