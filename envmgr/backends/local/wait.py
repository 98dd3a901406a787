"""The local backend's one way to wait: spin on shared memory, then sleep with a deadline.

Every wait of the local backend, the parent's and the worker's, has the same shape::

    ready()?                         -> READY (the fast path; skipped if the caller looked)
    spin: sched_yield, ready()?      -> READY            for up to ``spin_seconds``
    loop:
        sleeper.mark_sleeping()              "I am about to sleep": a store, then a fence
        ready()?                     -> withdraw, READY  the load that pairs with it
        what = sleeper.sleep(t)         blocks up to t, then withdraws the announcement
        what is not None             -> what             a dead worker's sentinel, a
                                                         message, the parent gone...
        past the deadline            -> DEADLINE
        t doubles, up to ``longest_sleep``

:func:`wait_until` is that loop, written once. What differs between the waits is
only what "ready" means (every worker finished, at least ``k`` of some, a command
word changed, a pipe holds bytes) and how a side sleeps (``poll`` on the wake-up
pipe and the process sentinels, or on one worker pipe): the ``ready`` callable and
the :class:`Sleeper`. The other side wakes the sleeper only when it sees the
announcement; the fence after the announcement (a Dekker pair with the other side's
store, fence, look) means at least one of the two sees the other's store, so no
wake-up is lost. The sleep's timeout bounds what a lost one could cost all the same.

``sched_yield`` on every spin turn hands the core to a process that needs it (the
other side, another worker): spinning without it starves them when processes
outnumber cores.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from time import monotonic, perf_counter
from typing import Final, Generic, Protocol, TypeVar

__all__ = ["WaitEnd", "READY", "DEADLINE", "Sleeper", "UnrungSleeper", "wait_until"]

E = TypeVar("E")
E_co = TypeVar("E_co", covariant=True)


class WaitEnd(enum.Enum):
    """How a wait ended when nothing else happened."""

    #: ``ready()`` held: the answers (or the command) are in shared memory.
    READY = "ready"
    #: The deadline passed first.
    DEADLINE = "deadline"


#: The members, bound once: a module global is read faster than an enum attribute, and
#: the batch step's wait compares with :data:`READY` on every step.
READY: Final = WaitEnd.READY
DEADLINE: Final = WaitEnd.DEADLINE


class Sleeper(Protocol[E_co]):
    """How one side sleeps, and tells the other side that it does."""

    def mark_sleeping(self) -> None:
        """Say "I am about to sleep", so that the other side wakes us (may do nothing).

        Ends with a full fence after the store: the look at ``ready()`` that follows
        must not be ordered before it.
        """
        ...

    def withdraw(self) -> None:
        """Take the announcement back (``ready()`` held after all)."""
        ...

    def sleep(self, seconds: float) -> E_co | None:
        """Block for up to ``seconds`` or until woken, then withdraw the announcement.

        Returns:
            ``None`` for a wake-up or a timeout (the wait looks at ``ready()`` again),
            else what happened instead, which ends the wait.
        """
        ...


class UnrungSleeper(Generic[E]):
    """A sleeper that announces nothing (nobody rings: a pipe or a process wakes it).

    Args:
        block: Blocks for up to its argument in seconds; returns as
            :meth:`Sleeper.sleep` does.
    """

    def __init__(self, block: Callable[[float], E | None]) -> None:
        self.sleep = block

    def mark_sleeping(self) -> None:
        """Nothing to store: nobody rings."""

    def withdraw(self) -> None:
        """Nothing to take back."""


def wait_until(
    ready: Callable[[], bool],
    sleeper: Sleeper[E],
    *,
    spin_seconds: float = 0.0,
    deadline: float | None = None,
    first_sleep: float = 0.005,
    longest_sleep: float = 0.1,
    looked: bool = False,
) -> WaitEnd | E:
    """Spin, then sleep, until ``ready()``, something else happens, or ``deadline``.

    Args:
        ready: Whether the wait is over; cheap, called on every turn.
        sleeper: Announces the sleep and blocks (see :class:`Sleeper`).
        spin_seconds: How long to spin (yielding the core) before the first sleep.
        deadline: A :func:`time.monotonic` time; ``None`` waits for ever.
        first_sleep: The first sleep's timeout; each one after doubles it.
        longest_sleep: The longest single sleep.
        looked: The caller has just seen ``ready()`` false: skip the first look (the
            hot paths look before they build a wait; a second look there is waste).

    Returns:
        :attr:`WaitEnd.READY`, :attr:`WaitEnd.DEADLINE`, or what ``sleeper.sleep``
        reported instead (returned as is, so the caller handles it once, without
        waiting again first).
    """
    if not looked and ready():
        return READY
    if spin_seconds > 0.0:
        spin_end = perf_counter() + spin_seconds
        while True:
            os.sched_yield()
            if ready():
                return READY
            if perf_counter() > spin_end:
                break
    timeout = first_sleep
    while True:
        if deadline is not None:
            left = deadline - monotonic()
            if left <= 0.0:
                return READY if ready() else DEADLINE
            timeout = min(timeout, left)
        sleeper.mark_sleeping()
        if ready():
            sleeper.withdraw()
            return READY
        what = sleeper.sleep(timeout)
        if what is not None:
            return what
        if ready():
            return READY
        timeout = min(timeout * 2, longest_sleep)
