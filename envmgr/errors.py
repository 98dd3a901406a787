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
import traceback
from collections.abc import Sequence
from types import FrameType
from typing import Any

from gymnasium import error as gym_error

__all__ = [
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
    "format_remote_exception",
    "add_note",
]


class EnvMgrError(Exception):
    """Base class of every error envmgr raises itself."""


class UsageError(EnvMgrError):
    """The manager was used wrongly (closed, or called out of order)."""


class ClosedManagerError(UsageError, gym_error.ClosedEnvironmentError):
    """A call reached a manager that the user closed."""

    @classmethod
    def on(cls, owner: str, call: str) -> ClosedManagerError:
        """``AsyncVectorEnv``'s message (``owner``: the class name), then the call refused."""
        return cls(
            f"Trying to operate on `{owner}`, after a call to `close()`. "
            f"(cannot {call}: the manager is closed)"
        )


class AlreadyPendingCallError(UsageError, gym_error.AlreadyPendingCallError):
    """A new asynchronous call was started while another one is pending."""

    def __init__(self, message: str, name: str = "") -> None:
        # Gymnasium's class takes (message, name); keep that signature.
        gym_error.AlreadyPendingCallError.__init__(self, message, name)

    @classmethod
    def on(cls, call: str, pending: str) -> AlreadyPendingCallError:
        """Return the error for starting ``call`` while a call to ``pending`` waits.

        The message is ``AsyncVectorEnv``'s to the letter (its ``reset_async`` one has no full
        stop), then what to do; the error's ``name`` is the pending call, as there.
        """
        stop = "" if call == "reset_async" else "."
        return cls(
            f"Calling `{call}` while waiting for a pending call to `{pending}` to "
            f"complete{stop} (call {pending}_wait() first)",
            pending,
        )


class NoAsyncCallError(UsageError, gym_error.NoAsyncCallError):
    """A ``*_wait`` call came without its matching ``*_async`` call."""

    def __init__(self, message: str, name: str = "") -> None:
        gym_error.NoAsyncCallError.__init__(self, message, name)

    @classmethod
    def on(cls, kind: str, pending: str | None) -> NoAsyncCallError:
        """``AsyncVectorEnv``'s message for ``<kind>_wait``, then what is pending instead."""
        other = "" if pending is None else f" (a {pending} call is pending)"
        return cls(f"Calling `{kind}_wait` without any prior call to `{kind}_async`.{other}", kind)


class BusyManagerError(UsageError):
    """A call came from one thread while another thread was inside a call to the manager.

    A manager steps one batch at a time: two threads stepping it at once would each
    read the other's batch. Like trio's ``BusyResourceError``, the second caller is
    refused rather than queued, since two threads stepping one manager is a bug in the
    calling code, not a wait. :meth:`~envmgr.frontend.vector_env.BatchedVectorEnv.close`
    is never refused.
    """

    @classmethod
    def on(cls, owner: str, call: str, busy: str) -> BusyManagerError:
        """Refuse ``call`` of manager class ``owner``; ``busy``: the other thread's call."""
        return cls(
            f"cannot {call}: another thread is inside {busy}() of this {owner}; call a "
            "manager from one thread at a time (or give each thread a manager of its own)"
        )


class SpaceMismatchError(EnvMgrError, ValueError, RuntimeError):
    """The envs' observation or action spaces differ; the message names both sides.

    A ``RuntimeError``, which ``AsyncVectorEnv`` raises for this, and a ``ValueError``,
    since what was wrong is the input: the env factories given.
    """


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


# The file name cloudpickle gives every code object it ships by value (functions and classes
# from __main__, or from modules registered with register_pickle_by_value): it keeps the
# line numbers but drops the file, to make its output deterministic.
_DYNAMIC_CODE = "<dynamic-code>"


def format_remote_exception(exc: BaseException) -> str:
    """Format ``exc`` with its traceback, as ``traceback.format_exception`` does.

    The text is for :class:`RemoteTraceback`; frames of code shipped by value keep their file
    and source line.

    Env code defined in the user's script reaches a worker by value (cloudpickle), with every
    code object's file name replaced by ``"<dynamic-code>"``; a plain traceback then reads
    ``File "<dynamic-code>", line 6, in step`` with no source. The line numbers are intact,
    and the function's globals still carry the defining module's ``__file__`` (cloudpickle
    ships it with them), so such frames are shown with that file and, when the file is
    readable here (the same machine, or a shared file system), its source line. Chained
    exceptions (``__cause__``, ``__context__``) and exception groups are treated alike.

    Args:
        exc: The exception, caught in the worker (its ``__traceback__`` still attached).

    Returns:
        The text, ending in a newline.
    """
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _restore_file_names(te, exc, set())
    return "".join(te.format())


def _restore_file_names(te: traceback.TracebackException, exc: Any, seen: set[int]) -> None:
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    if len(frames) == len(te.stack):  # always, unless a traceback limit cut the stack short
        for k, (frame, summary) in enumerate(zip(frames, te.stack, strict=True)):
            if summary.filename == _DYNAMIC_CODE:
                te.stack[k] = _with_file(summary, frame)
    for attr in ("__cause__", "__context__"):
        nested = getattr(te, attr, None)
        if nested is not None:
            _restore_file_names(nested, getattr(exc, attr, None), seen)
    # An exception group's formatter may show fewer members than it has (max_group_width).
    members = zip(
        getattr(te, "exceptions", None) or (), getattr(exc, "exceptions", ()), strict=False
    )
    for nested, sub in members:
        _restore_file_names(nested, sub, seen)


def _with_file(summary: traceback.FrameSummary, frame: FrameType) -> traceback.FrameSummary:
    """``summary`` pointing at the file its code came from, if the frame's globals know it."""
    path = frame.f_globals.get("__file__")
    if not isinstance(path, str) or not path:
        return summary
    # Column positions (Python 3.11+) keep the ^^^ markers under the failing expression.
    positions = {
        key: getattr(summary, key)
        for key in ("end_lineno", "colno", "end_colno")
        if hasattr(summary, key)
    }
    return traceback.FrameSummary(
        path, summary.lineno, summary.name, lookup_line=True, locals=summary.locals, **positions
    )


class RayActorDiedError(WorkerDiedError):
    """A Ray actor of the manager died: its process was killed or its node was lost.

    Attributes:
        worker_index: Index of the actor in the manager (``actor_index`` too).
        env_indices: Global indices of the envs the actor owned.
        node_ip: IP address of the node the actor ran on.
        node_id: Ray node id (hex) of that node.
        actor_id: Ray actor id (hex).
        pid: The actor's process id on its node.
        node_alive: Whether Ray still listed the node as alive when the death was
            noticed (``False``: the whole node was lost; ``None``: unknown).
        reason: Ray's own account of the death.
    """

    def __init__(
        self,
        message: str,
        worker_index: int,
        env_indices: Sequence[int] = (),
        *,
        node_ip: str | None = None,
        node_id: str | None = None,
        actor_id: str | None = None,
        pid: int | None = None,
        node_alive: bool | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message, worker_index, env_indices, None)
        self.node_ip = node_ip
        self.node_id = node_id
        self.actor_id = actor_id
        self.pid = pid
        self.node_alive = node_alive
        self.reason = reason

    @property
    def actor_index(self) -> int:
        return self.worker_index


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (which has no ``add_note``)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: keep the information reachable all the same
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
