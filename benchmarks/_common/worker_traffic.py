"""What envmgr's workers move through system calls: bytes pickled per batch in steady state.

envmgr's workers answer through shared memory; what they write to their pipes is one
wake-up byte per batch and, otherwise, pickles (an observation that did not fit, a timer
shipment, a reply to a command). So the workers' written bytes over a window of steps,
minus the wake-ups, are the bytes pickled per batch::

    timer flush (caller: timers.get_timer_tree)       no shipment is due for timer_interval
    SETTLE_BATCHES steps                              the flush's own traffic ends
    io_bytes(pids)  ...steps for `seconds`...  io_bytes(pids)
      -> written - 1 byte per batch = pickled bytes    (/proc/<pid>/io wchar)
         read                                         (rchar: counts file reads too)

Two workers finishing at once may both write a wake-up byte, so up to one byte per batch
is wake-ups, never a pickle (tens of bytes at the least).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

__all__ = ["SETTLE_BATCHES", "io_bytes", "traffic_window"]

#: Steps after a timer flush before bytes are counted: the flush's own traffic (the next
#: command after it travels by pipe) is over by then.
SETTLE_BATCHES = 3


def io_bytes(pids: Sequence[int]) -> tuple[int, int]:
    """``(rchar, wchar)`` summed over ``pids``: bytes they moved through system calls."""
    read = written = 0
    for pid in pids:
        fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        read += int(fields["rchar"])
        written += int(fields["wchar"])
    return read, written


def traffic_window(
    step: Callable[[int], Any], pids: Sequence[int], seconds: float
) -> dict[str, float]:
    """Bytes per batch the workers ``pids`` pickled, wrote and read while ``step(b)`` ran
    batch ``b = 0, 1, ...`` for ``seconds`` (at least ``2 * SETTLE_BATCHES`` batches).

    Start it right after a timer flush, with ``seconds`` under the manager's
    ``timer_interval``, so that no timer shipment falls in the window.

    Returns:
        ``batches`` (all steps taken), ``pickled_bytes_per_batch``,
        ``written_bytes_per_batch`` and ``read_bytes_per_batch`` (over the counted ones).
    """
    io0 = (0, 0)
    batches = 0
    deadline = perf_counter() + seconds
    while batches < 2 * SETTLE_BATCHES or perf_counter() < deadline:
        if batches == SETTLE_BATCHES:
            io0 = io_bytes(pids)
        step(batches)
        batches += 1
    read, written = (b - a for a, b in zip(io0, io_bytes(pids), strict=True))
    counted = batches - SETTLE_BATCHES
    return {
        "batches": batches,
        "pickled_bytes_per_batch": max(0, written - counted) / counted,
        "written_bytes_per_batch": written / counted,
        "read_bytes_per_batch": read / counted,
    }
