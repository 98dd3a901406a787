"""How a test builds a manager of the backend under test (local, local with
``caller_envs``, Ray) and hurts one of its groups, and ``on_backends``, the
parametrization that runs a test over every backend or says why one cannot apply.

``conftest.py`` holds the fixtures that use these (``ray_session``, ``backend``) and
re-exports the names, so test modules import them from ``conftest``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import pytest

from support.fault_envs import process_token, wait_gone

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
            token = process_token(pid)
            os.kill(pid, signal.SIGKILL)
            # Dead (a zombie until the manager reaps it); 10 s is a liveness bound.
            wait_gone([token], timeout=10.0, zombie_ok=True)
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
