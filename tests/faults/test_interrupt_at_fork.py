"""Ctrl-C at the worst moment of a worker's start: the process exists, nobody has it yet.

A real SIGINT is sent to the manager's process right after the call that creates a
worker returns (``os.fork`` for fork, the fork and exec for spawn, the forkserver's
answer for forkserver), before multiprocessing hands the process to envmgr. Before
envmgr held Ctrl-C back across that window, the interrupt left the new process
unrecorded: a zombie until the manager's process exited (fork, spawn), and, for spawn
and forkserver, a child that died printing ``EOFError`` because its start-up data never
came. Each start method runs in a fresh interpreter, so the forkserver and its children
print where this test reads, and no history of other tests is in the way.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import START_METHODS

from envmgr.backends.local.pool import ctrl_c_held

pytestmark = pytest.mark.timeout(120)

SCRIPT = r"""
import json, os, signal, sys, time
import gymnasium as gym
import numpy as np
from conftest import _process_snapshot, is_mp_helper
from support.fault_envs import wait_gone, process_token
from envmgr import SubprocessEnvManager

# A background shell may have started us with SIGINT ignored: take Python's default.
signal.signal(signal.SIGINT, signal.default_int_handler)
CONTEXT = {context!r}
ME = os.getpid()


def make_cartpole():
    return gym.make("CartPole-v1")


class SigintAfterStart:
    # Sends this process SIGINT once the nth worker process exists (counting from 0).
    def __init__(self, nth):
        self.nth, self.seen, self.sent = nth, 0, False

    def __call__(self, frame, event, arg):
        if os.getpid() != ME:  # a forked child inherits the hook
            sys.setprofile(None)
            return
        if not created(frame, event, arg):
            return
        if self.seen == self.nth:
            sys.setprofile(None)
            self.sent = True
            os.kill(ME, signal.SIGINT)
        self.seen += 1


def created(frame, event, arg):
    name = getattr(arg, "__name__", "")
    back = frame.f_back.f_code.co_filename if frame.f_back else ""
    if event == "c_return" and name == "fork":
        return frame.f_code.co_filename.endswith("popen_fork.py")
    if event == "c_return" and name == "fork_exec":
        return back.endswith("popen_spawn_posix.py")
    if event == "return" and frame.f_code.co_name == "connect_to_new_process":
        return back.endswith("popen_forkserver.py")
    return False


def left_behind():
    # Workers still there 5 s on (zombies never go): ours and the forkserver's.
    deadline = time.monotonic() + 5.0
    while True:
        left = sorted(
            (pid, state) for pid, (ppid, state, cmd) in _process_snapshot().items()
            if not (ppid == ME and is_mp_helper(cmd) and not state.startswith("Z"))
        )
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def interrupted(call, hook):
    sys.setprofile(hook)
    try:
        call()
    except KeyboardInterrupt:
        return True
    finally:
        sys.setprofile(None)
    return False


results = {{}}
for nth in (0, 1):
    hook = SigintAfterStart(nth)
    got = interrupted(lambda: SubprocessEnvManager(make_cartpole, 2, 2, context=CONTEXT), hook)
    results[f"build, worker {{nth}}"] = [got, hook.sent, left_behind()]

# A replacement's start: worker 1 is killed, the next step starts its replacement.
envs = SubprocessEnvManager(make_cartpole, 2, 2, context=CONTEXT, max_restarts=2)
actions = np.zeros(4, dtype=np.int64)
envs.reset(seed=0)
token = process_token(envs.worker_pids[1])
os.kill(envs.worker_pids[1], signal.SIGKILL)
# Dead, a zombie until the manager reaps it; 10 s is a liveness bound.
assert not wait_gone([token], timeout=10.0, zombie_ok=True), "worker 1 outlived SIGKILL"
hook = SigintAfterStart(0)
got = interrupted(lambda: envs.step(actions), hook)
envs.step(actions)  # the cut-off restart is redone
restarts = list(envs.restarts)
envs.close()
results["restart"] = [got, hook.sent, left_behind(), restarts]
print(json.dumps(results))
"""


@pytest.mark.parametrize("context", START_METHODS)
def test_ctrl_c_right_after_a_worker_is_created_leaves_nothing(
    context: str, run_python: Callable[..., Any]
) -> None:
    proc = run_python(SCRIPT.format(context=context), timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The children's tracebacks (EOFError: their start-up data never came) land here.
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, (got, sent, left, *_) in results.items():
        assert sent, f"{case}: the hook never saw the worker start"
        assert got, f"{case}: the SIGINT did not come out as KeyboardInterrupt"
        assert left == [], f"{case}: processes left behind (pid, state): {left}"
    assert results["restart"][3] == [0, 1]


@contextmanager
def sigint_handler(handler: Any) -> Iterator[None]:
    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _sigint_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # Python runs a handler between bytecodes: give it the chance


def test_a_held_ctrl_c_reaches_the_handler_once_the_block_ends() -> None:
    calls: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        calls.append(f"handler {signal.Signals(signum).name}")

    with sigint_handler(handler):
        with ctrl_c_held():
            _sigint_self()
            calls.append("block ends")
        assert calls == ["block ends", "handler SIGINT"]
        assert signal.getsignal(signal.SIGINT) is handler
        _sigint_self()  # and Ctrl-C is the caller's again, at once
        assert calls[-1] == "handler SIGINT" and len(calls) == 3


def test_a_held_ctrl_c_with_the_default_action_ends_the_process_after_the_block(
    run_python: Callable[..., Any],
) -> None:
    proc = run_python(
        """
        import os, signal, time
        from envmgr.backends.local.pool import ctrl_c_held
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        with ctrl_c_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            print("the block ran to its end", flush=True)
        print("after the block")
        """
    )
    assert proc.stdout == "the block ran to its end\n", (proc.stdout, proc.stderr)
    assert proc.returncode == -signal.SIGINT


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    with sigint_handler(signal.SIG_IGN):
        with ctrl_c_held():
            _sigint_self()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_off_the_main_thread_nothing_is_held_or_swapped() -> None:
    seen: list[Any] = []

    def body() -> None:
        with ctrl_c_held():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10.0)
    assert seen == [before]
