"""The restart budget: how many times each group may be replaced, within a window."""

from __future__ import annotations

from time import monotonic

__all__ = ["RestartBudget"]


class RestartBudget:
    """Counts replacements per group against ``max_restarts`` (per ``window`` seconds).

    Args:
        n_groups: Number of groups.
        max_restarts: Replacements allowed per group (``0``: none).
        window: Count only replacements within this many seconds; ``None``: ever.
    """

    def __init__(self, n_groups: int, max_restarts: int, window: float | None) -> None:
        if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        self.max_restarts = max_restarts
        self.window = window
        #: Replacements so far, per group.
        self.restarts = [0] * n_groups
        self._times: list[list[float]] = [[] for _ in range(n_groups)]

    def charge(self, g: int) -> str | None:
        """Record a replacement of group ``g``; or, if the budget is spent, say why not.

        Returns:
            ``None`` (go ahead), or the end of the message explaining the refusal
            (``"after 2 restarts; max_restarts=2 is spent"``).
        """
        now = monotonic()
        history = self._times[g]
        if self.window is not None:
            history[:] = [t for t in history if now - t < self.window]
        if len(history) >= self.max_restarts:
            within = "" if self.window is None else f" within {self.window:g} s"
            return (
                f"after {len(history)} restarts{within}; max_restarts={self.max_restarts} is spent"
            )
        history.append(now)
        return None

    def done(self, g: int) -> None:
        """A replacement of group ``g`` was made (it may still fail)."""
        self.restarts[g] += 1
