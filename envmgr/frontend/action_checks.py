"""The front end's action check.

One :class:`~envmgr.frontend.validation.ActionChecker` per batch size.

``check_actions`` picks the mode (``"safe"``, ``"strict"``, ``"off"``); a checker
is compiled once per batch size (the whole batch for ``step``, a few groups for
``send``) and names the env and group of a bad action.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.frontend.validation import ActionChecker, check_mode
from envmgr.protocol.layout import Layout

__all__ = ["ActionChecks"]


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
        full = None if self.mode == "off" else self._new(layout.num_envs)
        self._full = full
        if full is not None:
            self._checkers[layout.num_envs] = full
            # The checker's own shortcut, read here: the usual step costs no call.
            self._plain_shape = full._plain_shape
            self._plain_ok = full._plain_ok

    def check_batch(self, actions: Any) -> None:
        """:meth:`check` of a whole batch (``step``), the usual batch passing in one test."""
        full = self._full
        if full is None or (
            type(actions) is np.ndarray
            and actions.shape == self._plain_shape
            and actions.dtype in self._plain_ok
        ):
            return
        full.check(actions, None)

    def check(self, actions: Any, ids: np.ndarray | None) -> None:
        """Raise ``ValueError`` naming the env if ``actions`` (rows for ``ids``) do not fit."""
        if self.mode == "off":
            return
        n = self.layout.num_envs if ids is None else len(ids)
        checker = self._checkers.get(n)
        if checker is None:
            checker = self._checkers[n] = self._new(n)
        if (
            type(actions) is np.ndarray
            and actions.shape == checker._plain_shape
            and actions.dtype in checker._plain_ok
        ):
            return  # the checker's own shortcut, without the call
        checker.check(actions, ids)

    def where(self, i: int) -> str:
        """``"env 9 (worker 1)"``: how messages name global env ``i``."""
        g = int(self.layout.group_of(np.asarray([i]))[0])
        return f"env {i} ({self.noun} {g})"

    def _new(self, n: int) -> ActionChecker:
        return ActionChecker(self.space, n, self.where, self.mode)
