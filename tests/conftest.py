"""Shared fixtures: a leak check around every test, the start-method parameter, the
Ray session, and the ``backend`` parameter (the contract both managers keep).

The leak check runs after each test (and fails it, as a teardown error, with a
message naming what leaked):

* shared memory: no ``/dev/shm/envmgr_*`` entry created by this test process
  may remain. Names are attributed through a spy on ``SharedBuffers.create``,
  so segments of other people's concurrent runs on this machine never count.
* processes: no child of the test process may be left alive or as a zombie,
  and neither may a child of multiprocessing's forkserver (forkserver workers
  are its children, not ours). multiprocessing's own helpers (the
  resource_tracker and the forkserver, recognised by their command line) are
  not leaks: they live as long as the test session by design.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

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
    for pid in proc_leaked:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    pytest.fail("\n".join(lines), pytrace=False)


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

RAY_REASON = 'ray is not installed: pip install "envmgr[ray]" to run the Ray backend tests'
NODE_IP = "127.0.0.2"  # Ray rewrites 127.0.0.1 to the host's external address


class LocalRay:
    """The session's Ray instance: started once, restarted if a module stopped it."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.starts = 0

    def ensure(self) -> Any:
        if not self.ray.is_initialized():
            os.environ["RAY_AUTH_MODE"] = "disabled"
            os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no reporting over the network
            self.ray.init(
                address="local",  # never attach to a stray cluster
                num_cpus=2,
                include_dashboard=False,
                _node_ip_address=NODE_IP,
                log_to_driver=False,
            )
            self.starts += 1
        return self.ray


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


#: Keyword arguments only the local manager (or AsyncVectorEnv) takes.
_LOCAL_ONLY = ("shared_memory", "daemon", "spin_seconds", "parent_spin_seconds", "context")


class Backend:
    """How a test builds a manager of the kind under test, and hurts one of its groups.

    ``backend(env_fns, n_groups, per_group, **kwargs)`` takes the local manager's
    arguments. ``caller``: the same layout, with the last group's envs stepped in this
    process (``caller_envs``) and the others in workers. ``ray``: groups are actors and
    local-only arguments are dropped.
    """

    def __init__(self, name: str, ray: Any = None) -> None:
        self.name = name
        self.ray = ray

    def __call__(
        self, env_fns: Any, n_groups: int | None = None, per_group: int | None = None, **kw: Any
    ) -> Any:
        if self.name == "local":
            from envmgr import SubprocessEnvManager

            return SubprocessEnvManager(env_fns, n_groups, per_group, **kw)
        if self.name == "caller":
            return _with_caller_envs(env_fns, n_groups, per_group, **kw)
        from envmgr import RayEnvManager

        for key in _LOCAL_ONLY:
            kw.pop(key, None)
        kw.setdefault("num_cpus_per_actor", 0.25)
        return RayEnvManager(env_fns, n_groups, per_group, **kw)

    def kill(self, envs: Any, g: int) -> None:
        """Kill group ``g`` (its process, or its actor) and wait until it is gone."""
        if self.name == "caller" and g == envs.n_workers:
            pytest.fail(
                f"group {g} holds the caller_envs, stepped in this process: it cannot be "
                "killed; skip the caller case in the test's parametrization (backends())"
            )
        if self.name in ("local", "caller"):
            pid = envs.worker_pids[g]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (_status(pid) or {}).get("State", "Z")[0] != "Z":
                time.sleep(0.01)
            return
        from ray._private import state

        actor_id = envs.actor_info[g].actor_id
        self.ray.kill(envs.actor_handles[g], no_restart=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if state.actors().get(actor_id, {}).get("State") == "DEAD":
                return
            time.sleep(0.05)

    def __repr__(self) -> str:
        return self.name


def _with_caller_envs(env_fns: Any, n_groups: int | None, per_group: int | None, **kw: Any) -> Any:
    """A local manager with ``backend``'s layout whose last group is the caller's envs."""
    from envmgr import SubprocessEnvManager
    from envmgr.managers.arguments import resolve_layout

    fns, layout = resolve_layout(env_fns, n_groups, per_group, num_envs=kw.pop("num_envs", None))
    if layout.n_groups < 2:
        raise ValueError(f"the caller case needs 2 groups or more (a worker), got {layout.sizes}")
    # The workers split the other envs as the local manager would (larger groups first),
    # so every group keeps its envs and its index.
    return SubprocessEnvManager(fns, layout.n_groups - 1, caller_envs=layout.sizes[-1], **kw)


#: Every backend the ``backend`` fixture can build; a test opts into all of them
#: (``caller`` included) through ``on_backends``.
BACKENDS = ("local", "caller", "ray")
#: The fixture's own parameters, for the modules that do not opt in: their tests pass
#: ``caller_envs`` themselves or kill the last group, which the caller case cannot do.
DEFAULT_BACKENDS = ("local", "ray")


def _case_values(case: Any) -> tuple[tuple[Any, ...], str | None, tuple[Any, ...]]:
    """A parametrize case's values, id and marks (a ``pytest.param`` or the bare values)."""
    if isinstance(case, type(pytest.param(None))):
        return tuple(case.values), case.id if isinstance(case.id, str) else None, tuple(case.marks)
    return (case if isinstance(case, tuple) else (case,)), None, ()


def on_backends(argnames: str = "", **per_backend: str | Sequence[Any]) -> pytest.MarkDecorator:
    """Run a test over every backend in ``BACKENDS``, or say why one cannot apply.

    Without ``argnames``: ``@on_backends(ray="why")`` runs the test on local and caller
    and skips it on Ray with that reason. With ``argnames``, the test's own parameters
    are given per backend: ``local=[cases]`` (ids kept as they are), and for
    ``caller``/``ray`` a list of cases (by default local's), or a reason (one skipped
    case). Ids of the other backends' cases end in ``-caller`` / ``-ray``. Without
    ``argnames``, a list holds one ``pytest.param()`` carrying marks (an xfail, say).
    """
    unknown = set(per_backend) - set(BACKENDS)
    if unknown:
        raise ValueError(f"on_backends(): no backend named {sorted(unknown)}; known: {BACKENDS}")
    names = [n.strip() for n in argnames.split(",") if n.strip()]
    local = per_backend.get("local", [()])
    if isinstance(local, str) or (names and not local):
        raise ValueError("on_backends(): the local backend runs every test: give its cases")
    params = []
    for name in BACKENDS:
        spec = per_backend.get(name, local)
        if isinstance(spec, str):
            values = _case_values(local[0])[0] if names else ()
            skip = pytest.mark.skip(reason=f"{name}: {spec}")
            params.append(pytest.param(name, *values, id=name, marks=skip))
            continue
        for case in spec:
            values, case_id, marks = _case_values(case)
            base = case_id or "-".join(map(str, values))
            if name == "local" and base:
                case_id = base
            else:
                case_id = f"{base}-{name}" if base else name
            params.append(pytest.param(name, *values, id=case_id, marks=marks))
    return pytest.mark.parametrize(["backend", *names], params, indirect=["backend"])


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
    for name in ("envs", "fault_envs", "helpers", request.module.__name__):
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

    def uses_ray(item: pytest.Item) -> bool:
        params = getattr(item, "callspec", None)
        on_ray = params is not None and params.params.get("backend") == "ray"
        return on_ray or item.path.name.startswith("test_ray")

    items.sort(key=uses_ray)
