"""envmgr: step many gymnasium environments in worker processes as one batch.

Every worker owns a batch of envs, steps them when told, and reports its own
timer tree, which the parent merges into its own: one JSON document shows the
training loop and, beneath it, where every worker spent its time.
"""

from __future__ import annotations

from typing import Any

from envmgr import timers
from envmgr.envside.agent_layout import AgentSpaceError
from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    BrokenWorkerError,
    BusyManagerError,
    ClosedManagerError,
    EnvMgrError,
    NoAsyncCallError,
    RemoteTraceback,
    SpaceMismatchError,
    UsageError,
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
    WorkerTimeoutError,
)
from envmgr.frontend.agents import AgentGroupsVectorEnv, AgentVectorEnv
from envmgr.managers.local import SubprocessEnvManager, default_start_method
from envmgr.managers.make import make
from envmgr.managers.parallel import make_parallel
from envmgr.protocol.messages import StepResponse

__version__ = "0.1.0"

__all__ = [
    "SubprocessEnvManager",
    "RayEnvManager",
    "make",
    "make_parallel",
    "AgentVectorEnv",
    "AgentGroupsVectorEnv",
    "AgentSpaceError",
    "StepResponse",
    "default_start_method",
    "timers",
    "EnvMgrError",
    "UsageError",
    "ClosedManagerError",
    "AlreadyPendingCallError",
    "NoAsyncCallError",
    "BusyManagerError",
    "SpaceMismatchError",
    "WorkerFailure",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "WorkerError",
    "BrokenWorkerError",
    "BrokenManagerError",
    "RemoteTraceback",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # RayEnvManager is exported lazily: `import envmgr` must not import Ray, an
    # optional extra (pip install "envmgr[ray]").
    if name == "RayEnvManager":
        from envmgr.managers.ray import RayEnvManager

        return RayEnvManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
