"""The exceptions envmgr raises.

Two families, kept apart on purpose (the way trio separates them):

* :class:`UsageError` -- the caller did something out of order or on a closed
  manager. Retrying the same call will fail the same way; the fix is in the
  calling code. These subclass Gymnasium's own errors where one exists, so
  ``except`` clauses written for ``gymnasium.vector.AsyncVectorEnv`` keep working.
* :class:`WorkerFailure` -- something went wrong on the other side of a process
  boundary: a worker died, hung, or its environment raised something that could
  not be carried back as its own type. They name the worker and its envs.

An exception raised by an environment inside a worker is *not* wrapped: it is
re-raised in the parent as its own type, with the worker's traceback chained as
``__cause__`` (a :class:`RemoteTraceback`), like ``concurrent.futures`` does.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence

from gymnasium import error as gym_error

__all__ = [
    "EnvMgrError",
    "UsageError",
    "ClosedManagerError",
    "AlreadyPendingCallError",
    "NoAsyncCallError",
    "WorkerFailure",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "WorkerError",
    "BrokenWorkerError",
    "BrokenManagerError",
    "RemoteTraceback",
]


class EnvMgrError(Exception):
    """Base class of every error envmgr raises itself."""


class UsageError(EnvMgrError):
    """The manager was used wrongly (closed, or called out of order)."""


class ClosedManagerError(UsageError, gym_error.ClosedEnvironmentError):
    """A call reached a manager that the user closed."""


class AlreadyPendingCallError(UsageError, gym_error.AlreadyPendingCallError):
    """A new asynchronous call was started while another one is pending."""

    def __init__(self, message: str, name: str = "") -> None:
        # Gymnasium's class takes (message, name); keep that signature.
        gym_error.AlreadyPendingCallError.__init__(self, message, name)


class NoAsyncCallError(UsageError, gym_error.NoAsyncCallError):
    """A ``*_wait`` call came without its matching ``*_async`` call."""

    def __init__(self, message: str, name: str = "") -> None:
        gym_error.NoAsyncCallError.__init__(self, message, name)


class WorkerFailure(EnvMgrError):
    """A worker process failed; names the worker and the envs it owns.

    Attributes:
        worker_index: Index of the failed worker.
        env_indices: Global indices of the envs the worker owns.
    """

    def __init__(self, message: str, worker_index: int, env_indices: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.env_indices = tuple(env_indices)


class WorkerDiedError(WorkerFailure):
    """A worker process exited (crash, signal, ``os._exit``) while it owed an answer.

    Attributes:
        exitcode: The process exit code; negative ``-N`` means killed by signal ``N``.
    """

    def __init__(
        self,
        message: str,
        worker_index: int,
        env_indices: Sequence[int] = (),
        exitcode: int | None = None,
    ) -> None:
        super().__init__(message, worker_index, env_indices)
        self.exitcode = exitcode


class WorkerTimeoutError(WorkerFailure, mp.TimeoutError, TimeoutError):
    """A worker did not answer within the manager's timeout.

    Also a ``multiprocessing.TimeoutError``, which ``AsyncVectorEnv`` raises, so
    code written for it catches this too.
    """


class WorkerError(WorkerFailure):
    """An exception raised in a worker that could not be re-created in the parent.

    Attributes:
        remote_type: Qualified name of the exception type raised in the worker.
        env_index: Global index of the env that raised, if known.
    """

    def __init__(
        self,
        message: str,
        worker_index: int,
        env_indices: Sequence[int] = (),
        remote_type: str = "",
        env_index: int | None = None,
    ) -> None:
        super().__init__(message, worker_index, env_indices)
        self.remote_type = remote_type
        self.env_index = env_index


class BrokenWorkerError(WorkerFailure):
    """A worker failed beyond its restart budget; the manager is now unusable."""


class BrokenManagerError(WorkerFailure, gym_error.ClosedEnvironmentError):
    """A call reached a manager broken by an earlier worker failure (``__cause__``: that one).

    Distinct from :class:`ClosedManagerError`, which only a manager the user closed
    raises. Also a Gymnasium ``ClosedEnvironmentError``: the manager cannot be used.
    """


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a re-raised error."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'
