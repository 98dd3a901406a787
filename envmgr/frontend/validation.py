"""Checks on the manager's input, done in the parent before anything reaches a worker.

* :class:`ActionChecker` - a batch of actions against the action space, in one of three
  modes (``check_actions=``):

  - ``"safe"`` (the default): only what is needed to place the actions in the batch
    arrays without changing them - the structure (dict keys, tuple length), the shape
    ``(num_envs,) + space.shape``, and a dtype whose values survive the cast to the
    space's dtype (``2.0`` for a ``Discrete`` is fine, ``2.5`` or ``nan`` is not). Values
    are *not* checked against the space: a Box action outside its bounds or a Discrete
    value outside ``range(n)`` reaches the env, as with ``AsyncVectorEnv`` (Pendulum
    clips its torque; CartPole asserts). A wrong number of actions raises ``ValueError``
    and a single value where a batch belongs raises ``TypeError``, the types
    ``AsyncVectorEnv`` raises for those mistakes.
  - ``"strict"``: everything ``space.contains`` would check, per env, with the env and
    its worker named: bounds, Discrete ranges, NaN/inf, exact dict keys. A debugging aid.
  - ``"off"``: nothing; a malformed batch fails wherever numpy or the env notices.

  Every check is compiled once per manager into one small function per leaf of the
  space, so the per-step cost of ``"safe"`` is a shape comparison and a dtype lookup
  for the usual integer or float batch.

``reset``'s arguments are checked in :mod:`envmgr.frontend.resets`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.protocol.trees import ARRAY_SPACES

__all__ = [
    "ACTION_CHECK_MODES",
    "ActionChecker",
    "check_mode",
]

ACTION_CHECK_MODES = ("safe", "strict", "off")

_LeafCheck = Callable[[Any, str], None]
_UNSIGNED = {k: np.dtype(f"u{k}") for k in (1, 2, 4, 8)}


def check_mode(mode: Any) -> str:
    """``mode`` as one of :data:`ACTION_CHECK_MODES`; ``True``/``False`` are the old flag."""
    if mode is True:
        return "safe"
    if mode is False:
        return "off"
    if mode not in ACTION_CHECK_MODES:
        raise ValueError(
            f"check_actions must be one of {', '.join(map(repr, ACTION_CHECK_MODES))}, got {mode!r}"
        )
    return str(mode)


class ActionChecker:
    """Validates batched actions against a single-env action space.

    Args:
        space: The single-env action space.
        num_envs: Batch size.
        where: ``where(global_env_index)`` names the env and its worker in messages, e.g.
            ``"env 9 (worker 1)"``.
        mode: ``"safe"`` (default), ``"strict"`` or ``"off"``; see the module docstring.
            ``True``/``False`` (the old ``check_actions`` flag) mean ``"safe"``/``"off"``.

    Raises:
        ValueError: If ``mode`` is not one of the above.
    """

    def __init__(
        self,
        space: gym.Space[Any],
        num_envs: int,
        where: Callable[[int], str],
        mode: str | bool = "safe",
    ) -> None:
        self.space = space
        self.num_envs = num_envs
        self.mode = check_mode(mode)
        self._name = where
        self._env_ids: Any = None
        # A batch of one array whose check depends on its shape and dtype alone (safe
        # mode) passes at once once its dtype has passed: the usual step's check is a
        # type, a dtype and a shape comparison.
        self._plain_shape = (
            (num_envs, *(space.shape or ())) if isinstance(space, ARRAY_SPACES) else None
        )
        self._plain_ok: set[np.dtype[Any]] = set()
        self._check: _LeafCheck = (
            _nothing if self.mode == "off" else self._compile(space, "actions")
        )

    def check(self, actions: Any, env_ids: Any = None) -> None:
        """Raise if ``actions`` cannot be (or, when strict, should not be) sent to the envs.

        Args:
            actions: The batch.
            env_ids: Global env index of each row, when the batch is a subset of
                the envs (``send``); messages name those envs.

        Raises:
            TypeError: A single value (or ``None``) where a batch of actions belongs.
            ValueError: Anything else, naming the path in the space (``actions['aim']``),
                and the env and worker where a single action is to blame.
        """
        if (
            type(actions) is np.ndarray
            and actions.dtype in self._plain_ok
            and actions.shape == self._plain_shape
        ):
            return
        self._env_ids = env_ids
        try:
            self._check(actions, "actions")
        finally:
            self._env_ids = None

    # ------------------------------------------------------------------ compile

    @property
    def _strict(self) -> bool:
        return self.mode == "strict"

    def _where(self, row: int) -> str:
        index = int(self._env_ids[row]) if self._env_ids is not None else row
        return self._name(index)

    def _compile(self, space: gym.Space[Any], path: str) -> _LeafCheck:
        if isinstance(space, gym.spaces.Dict):
            return self._dict_node(space, path)
        if isinstance(space, gym.spaces.Tuple):
            return self._tuple_node(space, path)
        if isinstance(space, gym.spaces.Discrete):
            return self._integer_leaf(space, (), int(space.start), int(space.start + space.n) - 1)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return self._integer_leaf(space, space.shape, space.start, space.start + space.nvec - 1)
        if isinstance(space, gym.spaces.MultiBinary):
            return self._integer_leaf(space, space.shape, 0, 1)
        if isinstance(space, gym.spaces.Box):
            return self._box_leaf(space)
        # Text, Graph, Sequence, custom: no batch array to check cheaply; they travel
        # pickled, so only the count matters for placing them.
        return self._generic_leaf(space)

    def _dict_node(self, space: gym.spaces.Dict, path: str) -> _LeafCheck:
        parts = {k: self._compile(s, f"{path}[{k!r}]") for k, s in space.spaces.items()}
        keys = parts.keys()
        strict = self._strict

        def check_dict(x: Any, p: str) -> None:
            # Extra keys are harmless to placing the batch (AsyncVectorEnv ignores them too);
            # strict mode reports them, as space.contains would.
            if not isinstance(x, Mapping) or (x.keys() != keys if strict else keys - x.keys()):
                raise ValueError(_dict_mismatch(x, p, keys, strict))
            for k, c in parts.items():
                c(x[k], f"{p}[{k!r}]")

        return check_dict

    def _tuple_node(self, space: gym.spaces.Tuple, path: str) -> _LeafCheck:
        items = [self._compile(s, f"{path}[{i}]") for i, s in enumerate(space.spaces)]

        def check_tuple(x: Any, p: str) -> None:
            if not isinstance(x, (tuple, list)) or len(x) != len(items):
                got = f"{len(x)} items" if isinstance(x, (tuple, list)) else type(x).__name__
                raise ValueError(f"{p} must be a tuple of {len(items)} batches, got {got}")
            for i, (c, v) in enumerate(zip(items, x, strict=True)):
                c(v, f"{p}[{i}]")

        return check_tuple

    def _batch_array(
        self, x: Any, p: str, shape: tuple[int, ...], space: gym.Space[Any]
    ) -> np.ndarray:
        """Return ``x`` as an array of shape ``(num_envs,) + shape``.

        Otherwise raise the error AsyncVectorEnv's type would: ``TypeError`` for a single value,
        ``ValueError`` for a wrong count.
        """
        try:
            a = x if type(x) is np.ndarray else np.asarray(x)
        except ValueError as exc:  # ragged nested lists
            raise ValueError(f"{p} is not a rectangular batch: {exc}") from None
        expected = (self.num_envs, *shape)
        if a.shape != expected:
            if a.ndim == 0:
                raise TypeError(
                    f"{p} is a single value ({a.tolist()!r}), not a batch: expected an array of "
                    f"shape {expected}, one action per env (num_envs={self.num_envs})"
                )
            raise ValueError(
                f"{p} has shape {a.shape}, expected {expected} = (num_envs,) + shape of {space}"
            )
        return a

    def _first_bad(self, bad: np.ndarray) -> int:
        flat = np.flatnonzero(bad.reshape(self.num_envs, -1).any(axis=1))
        return int(flat[0])

    def _castable(self, space: gym.Space[Any], shape: tuple[int, ...]) -> _LeafCheck:
        """Safe mode's leaf: right shape, and values the space's dtype holds unchanged."""
        target = np.dtype(space.dtype)
        if target.kind == "f":

            def check_float(x: Any, p: str) -> None:
                a = self._batch_array(x, p, shape, space)
                if a.dtype.kind not in "biuf":
                    raise ValueError(f"{p} has dtype {a.dtype}, expected numbers for {space}")
                self._plain_ok.add(a.dtype)

            return check_float
        info = np.iinfo(target)
        exact: dict[np.dtype[Any], bool] = {}  # source dtype -> every value fits the target

        def check_int(x: Any, p: str) -> None:
            a = self._batch_array(x, p, shape, space)
            fits = exact.get(a.dtype)
            if fits:
                return
            if fits is None:
                if a.dtype.kind not in "biuf":
                    raise ValueError(f"{p} has dtype {a.dtype}, expected integers for {space}")
                fits = exact[a.dtype] = bool(np.can_cast(a.dtype, target))
                if fits:
                    self._plain_ok.add(a.dtype)
                    return
            if not a.size:
                return
            if a.dtype.kind == "f":
                # Written into an integer array, 2.5 would become 2 and NaN garbage.
                with np.errstate(invalid="ignore"):
                    bad = ~np.isfinite(a) | (a != np.round(a)) | (a < info.min) | (a > info.max)
            elif a.min() >= info.min and a.max() <= info.max:
                return
            else:
                bad = (a < info.min) | (a > info.max)
            if bad.any():
                i = self._first_bad(bad)
                raise ValueError(
                    f"{p} has dtype {a.dtype}: the action for {self._where(i)} is "
                    f"{a[i].tolist()}, which {space} (dtype {target}) cannot hold unchanged"
                )

        return check_int

    def _integer_leaf(
        self, space: gym.Space[Any], shape: tuple[int, ...], low: Any, high: Any
    ) -> _LeafCheck:
        if not self._strict:
            return self._castable(space, shape)
        lo, hi = np.asarray(low), np.asarray(high)
        scalar = lo.ndim == 0 and hi.ndim == 0
        span = int(hi - lo) if scalar else 0

        def check(x: Any, p: str) -> None:
            a = self._batch_array(x, p, shape, space)
            if a.dtype.kind not in "iub":
                where = ""
                if a.dtype.kind == "f" and a.size:
                    fractional = ~np.isfinite(a) | (a != np.round(a))
                    first = self._first_bad(fractional) if fractional.any() else 0
                    where = f"; the action for {self._where(first)} is {a[first].tolist()}"
                raise ValueError(f"{p} has dtype {a.dtype}, expected integers for {space}{where}")
            if scalar:
                if not a.size:
                    return
                if a.dtype.kind == "i":
                    # One reduction instead of min() and max(): shifted to start at
                    # 0 and read as unsigned, a value below the range wraps to a
                    # huge one, so max() alone finds both kinds of offender.
                    shifted = a - lo if lo else a
                    if shifted.view(_UNSIGNED[shifted.dtype.itemsize]).max() <= span:
                        return
                elif a.min() >= lo and a.max() <= hi:
                    return
                bad = (a < lo) | (a > hi)
            else:
                bad = (a < lo) | (a > hi)
                if not bad.any():
                    return
            i = self._first_bad(bad)
            raise ValueError(
                f"{p}: the action for {self._where(i)} is {a[i].tolist()}, outside {space}"
            )

        return check

    def _box_leaf(self, space: gym.spaces.Box) -> _LeafCheck:
        if not self._strict:
            return self._castable(space, space.shape)
        lo, hi = space.low, space.high
        bounded = bool(np.any(np.isfinite(lo)) or np.any(np.isfinite(hi)))
        is_float = np.issubdtype(space.dtype, np.floating)

        def check(x: Any, p: str) -> None:
            a = self._batch_array(x, p, space.shape, space)
            if a.dtype.kind not in "iufb":
                raise ValueError(f"{p} has dtype {a.dtype}, expected numbers for {space}")
            if not is_float and a.dtype.kind == "f":
                # Written into an integer array, 2.5 would become 2 and NaN garbage.
                fractional = ~np.isfinite(a) | (a != np.round(a))
                if fractional.any():
                    i = self._first_bad(fractional)
                    raise ValueError(
                        f"{p} has dtype {a.dtype}: the action for {self._where(i)} is "
                        f"{a[i].tolist()}, not an integer for {space}"
                    )
            if is_float and a.dtype.kind == "f" and not np.isfinite(a).all():
                i = self._first_bad(~np.isfinite(a))
                raise ValueError(
                    f"{p}: the action for {self._where(i)} is {a[i].tolist()}, not finite"
                )
            if bounded:
                bad = (a < lo) | (a > hi)
                if bad.any():
                    i = self._first_bad(bad)
                    raise ValueError(
                        f"{p}: the action for {self._where(i)} is {a[i].tolist()}, outside {space} "
                        "(clip actions to the bounds, or use check_actions='safe', which lets "
                        "the env decide)"
                    )

        return check

    def _generic_leaf(self, space: gym.Space[Any]) -> _LeafCheck:
        strict = self._strict

        def check(x: Any, p: str) -> None:
            try:
                # A str or a dict iterates too (into characters, keys): not a batch.
                if isinstance(x, (str, bytes, Mapping)):
                    raise TypeError
                items = x if isinstance(x, (tuple, list)) else list(x)
            except TypeError:
                raise TypeError(
                    f"{p} is a single {type(x).__name__}, not a batch: expected one action "
                    f"per env (num_envs={self.num_envs})"
                ) from None
            if len(items) != self.num_envs:
                raise ValueError(f"{p} has {len(items)} entries, expected num_envs={self.num_envs}")
            if strict:
                for i, item in enumerate(items):
                    if not space.contains(item):
                        raise ValueError(
                            f"{p}: the action for {self._where(i)} is {item!r}, outside {space}"
                        )

        return check


def _nothing(x: Any, p: str) -> None:
    """The ``"off"`` mode's check."""


def _dict_mismatch(x: Any, p: str, keys: Any, strict: bool) -> str:
    """What is wrong with ``x`` where a dict batch with ``keys`` belongs, naming the paths."""
    if not isinstance(x, Mapping):
        return f"{p} must be a dict with keys {sorted(keys)}, got {type(x).__name__}"
    missing = [f"{p}[{k!r}]" for k in keys if k not in x]
    extra = [f"{p}[{k!r}]" for k in x if k not in keys] if strict else []
    said = [f"{', '.join(missing)} missing"] if missing else []
    said += [f"{', '.join(extra)} not in the space"] if extra else []
    got = sorted(map(str, x))
    return f"{p} must be a dict with keys {sorted(keys)}, got {got}: {'; '.join(said)}"
