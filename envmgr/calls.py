"""The state of a manager's pending call, as a typed value (like Gymnasium's ``AsyncState``).

A manager has at most one pending ``*_async`` call, described by a
:class:`PendingCall`; ``send()`` steps in flight are tracked per group apart
from it (a group -> sequence number map), since several may be outstanding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["CallKind", "PendingCall"]


class CallKind(Enum):
    """What a pending ``*_async`` call was."""

    RESET = "reset"
    STEP = "step"
    CALL = "call"


@dataclass
class PendingCall:
    """A call sent to some groups whose answers are not read yet.

    Attributes:
        kind: What the call was.
        seqs: Sequence number each group's answer will echo, by group.
        ship: Whether the groups ship their timer trees with the answers.
        commands: The command sent to each group, to send again to a replacement
            (resets only).
        phase: How messages name the call (``"step"``, ``"call('render')"``).
        order: For calls: ``(group, position in the group's answer)`` per result.
    """

    kind: CallKind
    seqs: dict[int, int]
    ship: bool = False
    commands: dict[int, Any] = field(default_factory=dict)
    phase: str = ""
    order: list[tuple[int, int]] = field(default_factory=list)
