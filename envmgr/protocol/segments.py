"""Naming and mapping envmgr's shared-memory segments (the batch's and the groups' stores)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from multiprocessing import resource_tracker, shared_memory

__all__ = ["SEGMENT_PREFIX", "open_segment"]

#: Every segment envmgr creates is named with this prefix, so leaks are easy to spot.
SEGMENT_PREFIX = "envmgr_"
_TRACK_PARAM = "track" in inspect.signature(shared_memory.SharedMemory).parameters


def _register_all_but_shared_memory(
    register: Callable[[str, str], None],
) -> Callable[[str, str], None]:
    def register_filtered(name: str, rtype: str) -> None:
        if rtype != "shared_memory":
            register(name, rtype)

    return register_filtered


def open_segment(name: str) -> shared_memory.SharedMemory:
    """Map the existing segment ``name`` without tracking it (a worker's side)."""
    # Only the creator may track the segment. A worker that registered it too
    # would, under fork, start a resource tracker of its own that unlinks the
    # segment (with a "leaked" warning) when the worker exits, even while the
    # manager still uses it.
    if _TRACK_PARAM:  # Python >= 3.13
        return shared_memory.SharedMemory(name=name, create=False, track=False)  # type: ignore[call-arg]
    register = resource_tracker.register
    resource_tracker.register = _register_all_but_shared_memory(register)  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name, create=False)
    finally:
        resource_tracker.register = register  # type: ignore[assignment]
