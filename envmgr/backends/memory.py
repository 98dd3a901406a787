"""A process's resident set size, read from ``/proc`` (what recycling by memory compares).

Both backends read it the same way: the local backend for each worker's pid from the
parent, a Ray actor for itself (``/proc/self``), as it may run on another node.
"""

from __future__ import annotations

import os

__all__ = ["resident_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int | str = "self") -> int | None:
    """Return process ``pid``'s resident set size in bytes.

    It is ``statm``'s second field times the page size; ``None`` where there is no ``/proc`` or
    the process is gone.
    """
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None
