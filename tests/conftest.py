"""Shared fixtures: a leak check around every test, the start-method parameter, the
Ray session, and the ``backend`` parameter (the contract every backend keeps; how it
builds each backend's manager, and ``on_backends``, are in ``backend_cases.py``).

The leak check runs after each test (and fails it, as a teardown error, with a
message naming what leaked):

* shared memory: no ``/dev/shm/envmgr_*`` entry created by this test process
  may remain. Names are attributed through a spy on ``SharedBuffers.create``,
  so segments of other people's concurrent runs on this machine never count.
* processes: no child of the test process may be left alive or as a zombie,
  and neither may a child of multiprocessing's forkserver (forkserver workers
  are its children, not ours). multiprocessing's own helpers (the
  resource_tracker and the forkserver, recognised by their command line) are
  not leaks: they live as long as the test session by design. One that died is
  reported, but left for multiprocessing to reap and start again.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Re-exported (test modules import them from conftest) as well as used here.
from support.backend_cases import (  # noqa: F401
    BACKENDS,
    DEFAULT_BACKENDS,
    NODE_IP,
    RAY_REASON,
    Backend,
    LocalRay,
    on_backends,
)

from envmgr import timers
from envmgr.protocol.shared_memory import SEGMENT_PREFIX, SharedBuffers

SHM_DIR = Path("/dev/shm")
START_METHODS = [m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()]
_HELPER_MARKERS = ("resource_tracker", "forkserver")
#: How long a test's processes may take to disappear after it ends (a forkserver
#: reaps its children asynchronously); leaks are reported only after this.
_GRACE_SECONDS = 3.0

# ------------------------------------------------------------------ shared-memory spy

_created_segments: set[str] = set()
_original_create = SharedBuffers.__dict__["create"].__func__


def _recording_create(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
    buffers = _original_create(cls, *args, **kwargs)
    _created_segments.add(buffers.name)
    return buffers


SharedBuffers.create = classmethod(_recording_create)  # type: ignore[method-assign,assignment]


def shm_entries() -> set[str]:
    """Names of every ``envmgr_*`` entry currently in ``/dev/shm``."""
    try:
        return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SEGMENT_PREFIX)}
    except FileNotFoundError:  # pragma: no cover - not Linux
        return set()


# ------------------------------------------------------------------ process inspection


def _status(pid: int) -> dict[str, str] | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def children_of(ppid: int) -> dict[int, tuple[int, str, str]]:
    """``{pid: (ppid, state, cmdline)}`` of every process whose parent is ``ppid``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _status(int(entry))
        if st is None or st.get("PPid") != str(ppid):
            continue
        found[int(entry)] = (ppid, st.get("State", "?"), _cmdline(int(entry)))
    return found


def is_mp_helper(cmdline: str) -> bool:
    """multiprocessing's resource_tracker or forkserver process (by command line)."""
    return any(marker in cmdline for marker in _HELPER_MARKERS)


def _mp_helper_pids() -> set[int]:
    """The pids multiprocessing holds for its forkserver and resource_tracker (a zombie's
    command line is empty, so a dead one is known by its pid alone)."""
    from multiprocessing import forkserver, resource_tracker

    held = (
        getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None),
        getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None),
    )
    return {pid for pid in held if pid is not None}


def _process_snapshot() -> dict[int, tuple[int, str, str]]:
    """Our children, plus the children of our forkserver (the forkserver's workers)."""
    mine = children_of(os.getpid())
    found = dict(mine)
    for pid, (_, state, cmd) in mine.items():
        if "forkserver" in cmd and not state.startswith("Z"):
            found.update(children_of(pid))
    return found


def _leaked_processes(before: dict[int, tuple[int, str, str]]) -> dict[int, tuple[str, str]]:
    leaked = {}
    me = os.getpid()
    for pid, (ppid, state, cmd) in _process_snapshot().items():
        zombie = state.startswith("Z")
        if zombie:
            leaked[pid] = (state, cmd)  # nobody reaped it: always a leak
        elif ppid == me and is_mp_helper(cmd):
            continue  # the resource_tracker / forkserver themselves
        elif pid not in before:
            # A new live child of ours, or a worker forked by the forkserver
            # (whose command line is the forkserver's: fork copies it).
            leaked[pid] = (state, cmd)
    return leaked


# ------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if it leaves shared memory or processes behind."""
    shm_before = shm_entries()
    created_before = set(_created_segments)
    procs_before = _process_snapshot()
    active_before = {p.pid for p in mp.active_children()}
    yield

    deadline = time.monotonic() + _GRACE_SECONDS
    while True:
        ours = _created_segments - created_before
        shm_leaked = sorted((shm_entries() - shm_before) & ours)
        proc_leaked = _leaked_processes(procs_before)
        if (not shm_leaked and not proc_leaked) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # After the /proc check: active_children() reaps zombies as a side effect.
    active_leaked = [p for p in mp.active_children() if p.pid not in active_before]

    if not (shm_leaked or proc_leaked or active_leaked):
        return
    lines = [f"{request.node.nodeid} leaked resources:"]
    for name in shm_leaked:
        lines.append(f"  shared memory /dev/shm/{name} still exists")
    for pid, (state, cmd) in sorted(proc_leaked.items()):
        lines.append(f"  process {pid} left behind, state {state!r}: {cmd.strip()[:160]}")
    for p in active_leaked:
        lines.append(f"  multiprocessing child still alive: {p!r}")
    # Clean up so one leak does not cascade into every later test.
    for name in shm_leaked:
        try:
            (SHM_DIR / name).unlink()
        except OSError:
            pass
    for pid, (state, _) in proc_leaked.items():
        if not state.startswith("Z"):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for p in active_leaked:
        p.kill()
        p.join(5)
    helpers = _mp_helper_pids()
    for pid in proc_leaked:
        if pid in helpers:
            # A dead forkserver or resource_tracker is multiprocessing's to reap: its next
            # start waits on the pid, sees it dead and starts a new one. Reaped here, that
            # wait raises ChildProcessError in every later test that starts a process.
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    pytest.fail("\n".join(lines), pytrace=False)


def _sigint_state() -> tuple[bool, bool]:
    """Whether SIGINT is ignored, and whether it is blocked, in this thread."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    return ignored, signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.fixture(autouse=True)
def ctrl_c_still_reaches_this_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test after which SIGINT is ignored or blocked here and was not before.

    Nothing envmgr does may take Ctrl-C away from its user, and a disposition leaked
    here is inherited by every process the later tests start. (pytest itself may have
    been started with SIGINT ignored: a non-interactive shell does that to a command
    it runs in the background. That is no test's doing, so only a change counts.)
    """
    before = _sigint_state()
    yield
    ignored, blocked = after = _sigint_state()
    if after == before or not (ignored or blocked):
        return
    if ignored and not before[0]:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if blocked and not before[1]:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    how = " and ".join(w for w, on in (("ignored", ignored), ("blocked", blocked)) if on)
    pytest.fail(f"{request.node.nodeid} left SIGINT {how} in the test process", pytrace=False)


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    """Each multiprocessing start method in turn (fork, forkserver, spawn)."""
    return str(request.param)


@pytest.fixture
def fresh_timers() -> Iterator[None]:
    """Reset the main thread's timers around a test."""
    timers.reset_timers()
    yield
    timers.reset_timers()


TESTS_DIR = Path(__file__).resolve().parent


def _run_python(code: str, timeout: float = 50.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(TESTS_DIR),
    )


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a code snippet in a fresh interpreter (``tests/`` importable); for checks that
    could crash the interpreter or that need a process with no history."""
    return _run_python


# ------------------------------------------------------------------ Ray and the backend parameter


@pytest.fixture(scope="session")
def ray_session() -> Iterator[LocalRay]:
    if os.environ.get("ENVMGR_REQUIRE_RAY") == "1":  # CI: a missing extra fails, never skips
        import ray
    else:
        ray = pytest.importorskip("ray", reason=RAY_REASON)
    local = LocalRay(ray)
    local.ensure()
    yield local
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module", params=DEFAULT_BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each manager in turn: local worker processes, then Ray actors; with
    ``on_backends``, also local workers with the last group's envs stepped in this
    process (``caller_envs``), between the two.

    Module scope, so a Ray instance started here is up before the leak check's
    snapshot of the first test (Ray's processes are not that test's leak).
    """
    if request.param in ("local", "caller"):
        return Backend(request.param)
    import cloudpickle

    ray = request.getfixturevalue("ray_session").ensure()
    # Ray's workers cannot import the test modules: ship their envs by value.
    shipped = (
        "support.envs",
        "support.fault_envs",
        "support.helpers",
        "support.ragged_envs",
        "support.agent_envs",
        "support.equivalence",
    )
    for name in (*shipped, request.module.__name__):
        if name in sys.modules:
            cloudpickle.register_pickle_by_value(sys.modules[name])
    return Backend("ray", ray)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the Ray tests last.

    Ray leaves native threads in the test process after ``ray.shutdown()``, and
    forking a process with live native threads can crash the child (seen: fork
    workers dying of SIGSEGV in tests that ran after the Ray modules). Every
    fork-based test therefore runs before Ray is ever started.
    """

    def ray_order(item: pytest.Item) -> tuple[bool, bool]:
        """(whether it uses Ray, whether it starts a cluster of its own)."""
        params = getattr(item, "callspec", None)
        on_ray = params is not None and params.params.get("backend") == "ray"
        # The cluster module shuts the session's Ray down for a cluster of its own:
        # last, so the session's instance starts once (a start costs seconds).
        own_cluster = item.path.name == "test_ray_cluster.py"
        return on_ray or item.path.name.startswith("test_ray"), own_cluster

    items.sort(key=ray_order)
    if not RUN_CI_ONLY:
        skip = pytest.mark.skip(reason=CI_ONLY_REASON)
        for item in items:
            if item.get_closest_marker("ci_only"):
                item.add_marker(skip)


#: Slow system tests (soaks, large model-based runs, long benchmark smokes) run where
#: ``CI`` is set, as ``.ci/run`` has it, or with ``ENVMGR_CI_ONLY_TESTS=1``; elsewhere they
#: skip, so the README's test command stays under ten minutes on two cores.
RUN_CI_ONLY = bool(os.environ.get("CI")) or os.environ.get("ENVMGR_CI_ONLY_TESTS") == "1"
CI_ONLY_REASON = "a slow system test: runs in CI (CI=true) or with ENVMGR_CI_ONLY_TESTS=1"
