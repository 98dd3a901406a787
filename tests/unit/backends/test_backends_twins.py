"""The local backend's hand-inlined shortcuts, each held to its general path.

* The doorbells' fences: ``with fence_lock: pass`` written out where a step passes,
  instead of a call to :func:`~envmgr.backends.local.doorbell.fence`. Each must take the
  very lock ``fence()`` takes (else it orders nothing against the other side's fence),
  and must still get through in a child forked while another thread held it (the
  after-fork release must reach every module that holds the lock by name).
* The wait's outcomes bound as module globals (``READY``, ``DEADLINE``): each must be its
  ``WaitEnd`` member, in every module that compares with it.

These tests reach internals on purpose (docs/architecture.md, "Hand-inlined shortcuts").
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import Pipe
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from envmgr.backends.local import collect, process, wait, worker_doorbell
from envmgr.backends.local import doorbell as signalling
from envmgr.backends.local.worker_doorbell import WorkerDoorbell

pytestmark = pytest.mark.timeout(60)

#: How long a call gets to pass a fence whose lock another thread holds. A call that
#: takes the lock stays blocked however long this is; only a call that skips it could
#: be missed, on a machine that stalls this whole time.
_GRACE = 0.5


@pytest.fixture
def sites() -> Iterator[dict[str, Callable[[], Any]]]:
    """Every place a step fences, over one control block with no processes: two workers,
    every batch already done (nothing here waits)."""
    n = 2
    control = np.zeros((n + 1, signalling._ROW), dtype=np.int64)
    control[-1, signalling.ALL_DONE] = 1 << 40
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    pipes = [Pipe() for _ in range(n)]  # a sleeping worker's pipe is rung
    bell = signalling.ParentDoorbell(control, [a for a, _ in pipes], wake_r, poller)
    sleeper = signalling.ParentSleeper(bell, poller, signalling.WAIT_ALL)
    worker = WorkerDoorbell(
        control,
        0,
        None,  # type: ignore[arg-type]
        wake_w,
        spin_seconds=0.0,
        parent_alive=lambda: True,
    )
    seqs = iter(range(1, 1 << 30))
    yield {
        "fence()": signalling.fence,
        "ParentDoorbell.post_command": lambda: bell.post_command(
            [0, 1], next(seqs), signalling.KIND_STEP
        ),
        "ParentDoorbell.wait_all": lambda: bell.wait_all(next(seqs)),
        "ParentSleeper.mark_sleeping": sleeper.mark_sleeping,
        "WorkerDoorbell.step_done": lambda: worker.step_done(next(seqs), False),
        "WorkerDoorbell.mark_sleeping": worker.mark_sleeping,
    }
    os.close(wake_r)
    os.close(wake_w)
    for a, b in pipes:
        a.close()
        b.close()


def test_every_inlined_fence_takes_the_lock_fence_takes(
    sites: dict[str, Callable[[], Any]],
) -> None:
    # While the lock is held, every site (fence() too) must wait for it; once released,
    # every one gets through. All run at once, so the grace is waited once.
    done = {name: threading.Event() for name in sites}
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        try:
            sites[name]()
        except BaseException as exc:
            errors[name] = exc
        done[name].set()

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in sites]
    with signalling.fence_lock:
        for t in threads:
            t.start()
        time.sleep(_GRACE)
        passed = sorted(name for name, event in done.items() if event.is_set())
    for t in threads:
        t.join(10.0)
    assert not errors
    assert passed == [], f"these passed a fence without its lock: {passed}"
    assert all(event.is_set() for event in done.values()), "a site never got through"


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_the_fence_is_held_passes_every_inlined_fence(
    sites: dict[str, Callable[[], Any]],
) -> None:
    held, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with signalling.fence_lock:
            held.set()
            leave.wait(30.0)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10.0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: every site once, its name written as it gets through
            try:
                os.close(r)
                for name, site in sites.items():
                    site()
                    os.write(w, f"{name}\n".encode())
            finally:
                os._exit(0)
        os.close(w)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = None
        with os.fdopen(r) as out:
            through = out.read().split()
        blocked = [name for name in sites if name not in through]
        assert not blocked, f"the forked child blocked in {blocked[0]}: it inherited a held lock"
        assert status is not None and os.waitstatus_to_exitcode(status) == 0
    finally:
        leave.set()
        holder.join(10.0)


@pytest.mark.parametrize("module", [wait, collect, signalling, worker_doorbell, process])
def test_the_wait_outcomes_bound_as_globals_are_the_until_members(module: ModuleType) -> None:
    bound = {name: getattr(module, name) for name in ("READY", "DEADLINE") if hasattr(module, name)}
    assert bound, f"{module.__name__} compares with no wait outcome: drop it from this test"
    for name, value in bound.items():
        assert value is wait.WaitEnd[name], f"{module.__name__}.{name}"
