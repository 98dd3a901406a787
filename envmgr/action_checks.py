"""The front end's action check: one :class:`~envmgr.validation.ActionChecker` per batch size.

``check_actions`` picks the mode (``"safe"``, ``"strict"``, ``"off"``); a checker
is compiled once per batch size (the whole batch for ``step``, a few groups for
``send``) and names the env and group of a bad action.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.layout import Layout
from envmgr.validation import ActionChecker

__all__ = ["ActionChecks", "check_mode"]


def check_mode(check_actions: str | bool) -> str:
    """``check_actions`` as a mode: ``"safe"``, ``"strict"`` or ``"off"`` (``True`` / ``False``
    mean safe / off)."""
    if check_actions is True or check_actions is False:
        return "safe" if check_actions else "off"
    if check_actions not in ("safe", "strict", "off"):
        raise ValueError(f"check_actions must be 'safe', 'strict' or 'off', got {check_actions!r}")
    return check_actions


class ActionChecks:
    """Checks batches of actions for a manager.

    Args:
        space: The single-env action space.
        layout: The manager's groups, to name the group of a bad env.
        noun: What a group is called (``"worker"``, ``"actor"``).
        check_actions: The manager's ``check_actions`` argument.
    """

    def __init__(
        self, space: gym.Space[Any], layout: Layout, noun: str, check_actions: str | bool
    ) -> None:
        self.space = space
        self.layout = layout
        self.noun = noun
        self.mode = check_mode(check_actions)
        self._checkers: dict[int, Any] = {}

    def check(self, actions: Any, ids: np.ndarray | None) -> None:
        """Raise ``ValueError`` naming the env if ``actions`` (rows for ``ids``) do not fit."""
        if self.mode == "off":
            return
        n = self.layout.num_envs if ids is None else len(ids)
        checker = self._checkers.get(n)
        if checker is None:
            checker = self._checkers[n] = self._new(n)
        checker.check(actions, ids)

    def where(self, i: int) -> str:
        """``"env 9 (worker 1)"``: how messages name global env ``i``."""
        g = int(self.layout.group_of(np.asarray([i]))[0])
        return f"env {i} ({self.noun} {g})"

    def _new(self, n: int) -> Any:
        # The new signature is ActionChecker(space, n, where, mode). Until it lands
        # (issue 12), the old one takes the group size, so adapt it.
        try:
            return ActionChecker(self.space, n, self.where, self.mode)  # type: ignore[arg-type,call-arg]
        except TypeError:
            return self._old(n)

    def _old(self, n: int) -> ActionChecker:
        checker = ActionChecker(self.space, n, max(self.layout.sizes))
        if not self.layout.even:

            def where(i: int) -> str:
                ids = checker._env_ids
                return self.where(int(i if ids is None else ids[i]))

            checker._where = where  # type: ignore[method-assign,assignment]
        return checker
