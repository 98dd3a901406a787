"""The front end's one state: what a manager is doing between two public calls.

Like Gymnasium's ``AsyncState``, one value says what may come next, and like trio's
``BrokenResourceError`` versus ``ClosedResourceError``, a manager a failure broke is
told apart from one the user closed::

    IDLE ──*_async──> PENDING(call) ──*_wait──> IDLE
    IDLE ──send / async_reset──> IN_FLIGHT(group -> seq) ──recv (the last)──> IDLE
    any ──failure not recovered──> BROKEN(cause) ──close──> CLOSED
    any ──close──> CLOSED
    any ──os.fork(), in the child──> CLOSED(forked copy): the parent's, never stopped here

:class:`State` is frozen: a transition builds a new one, so no reader ever sees
half of one. The hot path compares the state with :data:`IDLE` by identity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    ClosedManagerError,
    NoAsyncCallError,
)

__all__ = [
    "Phase",
    "CallKind",
    "PendingCall",
    "State",
    "IDLE",
    "CLOSED",
    "IN_FLIGHT_PHASE",
    "CLOSED_PHASE",
]


class Phase(Enum):
    """Which of the five states a manager is in."""

    IDLE = "idle"
    PENDING = "pending"
    IN_FLIGHT = "in flight"
    BROKEN = "broken"
    CLOSED = "closed"


class CallKind(Enum):
    """What a call to the groups was; it decides what a lost group costs.

    A step or a reset replaces a lost group under the restart budget; a per-env
    call breaks the manager; a timer flush leaves the group lost for the next step
    or reset to replace. The values are Gymnasium's ``AsyncState`` names, so
    messages read as ``AsyncVectorEnv``'s.
    """

    RESET = "reset"
    STEP = "step"
    CALL = "call"
    FLUSH = "flush_timers"

    @property
    def replaces_lost(self) -> bool:
        """Whether a group lost during this call is replaced (steps and resets)."""
        return self is CallKind.STEP or self is CallKind.RESET


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call sent to some groups whose answers are not read yet.

    Attributes:
        kind: What the call was.
        seqs: Sequence number each group's answer will echo, by group.
        ship: Whether the groups ship their timer trees with the answers.
        commands: The command sent to each group, to send again to a replacement
            (resets only).
        label: How messages name the call (``"step"``, ``"call('render')"``).
        order: For calls: ``(group, position in the group's answer)`` per result.
    """

    kind: CallKind
    seqs: Mapping[int, int]
    ship: bool = False
    commands: Mapping[int, Any] | None = None
    label: str = ""
    order: tuple[tuple[int, int], ...] = ()

    @property
    def name(self) -> str:
        """The label, or the kind's name when no label was given."""
        return self.label or self.kind.value


_NOTHING: MappingProxyType[int, int] = MappingProxyType({})
#: The phases send/recv compare with, bound once: ``Phase.X`` goes through
#: ``EnumType.__getattr__`` on Python 3.11 (as dear as a dict copy), a module global
#: does not.
IN_FLIGHT_PHASE: Final = Phase.IN_FLIGHT
CLOSED_PHASE: Final = Phase.CLOSED


@dataclass(frozen=True, slots=True)
class State:
    """One of idle, pending(call), in flight(groups), broken(cause) or closed.

    Attributes:
        phase: Which state this is.
        call: The pending call (``PENDING`` only).
        in_flight: Group -> seq of its ``send()`` step or ``async_reset`` (``IN_FLIGHT``
            only; never empty there).
        cause: The failure that broke the manager (``BROKEN``), or why a manager closed
            without a ``close()`` (``CLOSED`` in a forked child).
    """

    phase: Phase
    call: PendingCall | None = None
    in_flight: MappingProxyType[int, int] = field(default_factory=lambda: _NOTHING)
    cause: BaseException | None = None

    @staticmethod
    def pending(call: PendingCall) -> State:
        """The state while ``call``'s answers are awaited."""
        return State(Phase.PENDING, call=call)

    @staticmethod
    def flying(seqs: Mapping[int, int]) -> State:
        """The state with the groups of ``seqs`` stepping; :data:`IDLE` if none is."""
        return _flying(dict(seqs))

    @staticmethod
    def forked_copy(owner: str, pid: int) -> State:
        """Closed in a child that process ``pid`` forked: the manager is the parent's."""
        why = (
            f"this process is a fork of process {pid}, whose {owner} this is: its workers "
            "answer that process only (build a manager in this one)"
        )
        return State(Phase.CLOSED, cause=ClosedManagerError(why))

    @staticmethod
    def broken(cause: BaseException) -> State:
        """The state after ``cause``, a failure that was not recovered."""
        return State(Phase.BROKEN, cause=cause)

    @property
    def closed(self) -> bool:
        """Whether the manager takes no more calls (broken or closed)."""
        return self.phase is Phase.BROKEN or self.phase is Phase.CLOSED

    def check_usable(self, owner: str, name: str) -> None:
        """Refuse call ``name`` of manager class ``owner`` if closed or broken.

        Raises:
            ClosedManagerError: The user closed the manager (or it never opened).
            BrokenManagerError: A failure broke it; caused by that failure.
        """
        if self.phase is CLOSED_PHASE:
            if self.cause is not None:  # closed for a reason of its own (a forked copy)
                raise ClosedManagerError(f"cannot {name}: {self.cause}") from None
            raise ClosedManagerError.on(owner, name)
        failure = self.cause
        if failure is not None:
            w = getattr(failure, "worker_index", -1)
            envs = getattr(failure, "env_indices", ())
            # str() of a KeyboardInterrupt (an interrupted restart) is empty: name its type.
            why = str(failure) or type(failure).__name__
            raise BrokenManagerError(
                f"cannot {name}: the manager is broken ({why})", w, envs
            ) from failure

    def check_idle(self, owner: str, nouns: str, name: str) -> None:
        """Refuse a new call ``name`` unless idle (``nouns``: what groups are called).

        Raises:
            AlreadyPendingCallError: A call is pending, or ``send()`` steps are in flight.
        """
        self.check_usable(owner, name)
        if self.call is not None:
            raise AlreadyPendingCallError.on(name, self.call.kind.value)
        if self.in_flight:
            raise AlreadyPendingCallError(
                f"cannot {name} while {nouns} {sorted(self.in_flight)} have send() "
                "steps in flight: recv() them first",
                "send",
            )

    def check_pending(self, owner: str, kind: CallKind) -> PendingCall:
        """The pending call, if it is a ``kind`` call (``<kind>_wait`` may end it).

        Raises:
            NoAsyncCallError: No ``kind`` call is pending.
        """
        self.check_usable(owner, f"{kind.value}_wait")
        call = self.call
        if call is None or call.kind is not kind:
            raise NoAsyncCallError.on(kind.value, None if call is None else call.kind.value)
        return call

    def landed(self, groups: Iterable[int]) -> State:
        """This state with ``groups`` no longer in flight (other states are kept)."""
        if self.phase is not IN_FLIGHT_PHASE:
            return self
        left = self.in_flight.copy()  # a dict: the proxy copies what it wraps
        for g in groups:
            left.pop(g, None)
        return _flying(left)

    def joined(self, seqs: Mapping[int, int]) -> State:
        """This state's groups in flight and those of ``seqs`` (group -> seq) too."""
        both = self.in_flight.copy()
        both.update(seqs)
        return _flying(both)


def _flying(seqs: dict[int, int]) -> State:
    """Return :meth:`State.flying` of a dict nobody else holds, wrapped, not copied again.

    Send and recv make a transition each, on the hot path.
    """
    return State(IN_FLIGHT_PHASE, in_flight=MappingProxyType(seqs)) if seqs else IDLE


#: The state between calls; compared by identity on the hot path.
IDLE = State(Phase.IDLE)
#: The state after ``close()``, and before a manager is open.
CLOSED = State(Phase.CLOSED)
