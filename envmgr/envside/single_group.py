"""Single envs, one per slot, stepped in a loop with autoreset done here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, iterate

from envmgr.envside.group import (
    BuildFailed,
    EnvGroup,
    GroupSpec,
    Infos,
)
from envmgr.protocol.ragged import RaggedStore
from envmgr.protocol.trees import tree_map

__all__ = ["SingleEnvGroup"]

NEXT_STEP, SAME_STEP, DISABLED = (
    AutoresetMode.NEXT_STEP,
    AutoresetMode.SAME_STEP,
    AutoresetMode.DISABLED,
)


class SingleEnvGroup(EnvGroup):
    """One ``gymnasium.Env`` per slot, stepped in a loop; autoreset is done here."""

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        assert spec.env_fns is not None
        self.envs: list[gym.Env[Any, Any]] = []
        try:
            for k, fn in enumerate(spec.env_fns):
                self.current_env = k
                env = fn()
                if not isinstance(env, gym.Env):
                    # A VectorEnv is no gym.Env: it belongs in vector_fn=, not env_fns.
                    hint = (
                        " (a VectorEnv: pass vector_fn= instead)"
                        if hasattr(env, "num_envs")
                        else ""
                    )
                    raise TypeError(
                        f"env {self.offset + k}'s factory returned {type(env).__name__}, "
                        f"not a gymnasium.Env{hint}"
                    )
                self.envs.append(env)
                for kind in ("observation_space", "action_space"):
                    if k and getattr(env, kind) != getattr(self.envs[0], kind):
                        raise ValueError(
                            f"env {self.offset + k} has {kind.replace('_', ' ')} "
                            f"{getattr(env, kind)}, "
                            f"but env {self.offset} has {getattr(self.envs[0], kind)}"
                        )
        except BaseException as exc:
            failed = self.current_env
            self.close()
            raise BuildFailed(failed, exc) from exc
        self.current_env = None
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.metadata = dict(first.metadata)
        self.render_mode = first.render_mode
        self.env_spec = first.spec
        # Compared by identity on every env step: an enum member, not its string value.
        self.mode = AutoresetMode(spec.autoreset_mode)
        self.autoreset = [False] * self.n
        # Last results per env, kept between commands so a partial reset can
        # republish the observations of the envs it did not touch.
        self._obs: list[Any] = [None] * self.n
        self._rew: list[Any] = [0.0] * self.n
        self._term: list[Any] = [False] * self.n
        self._trunc: list[Any] = [False] * self.n
        self._discrete = isinstance(first.action_space, gym.spaces.Discrete)
        self._array_actions = isinstance(
            first.action_space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
        )
        self._batch_action_space = batch_space(first.action_space, self.n)
        self._write_obs: Callable[[list[Any]], None] | None = None

    def attach(self, views: dict[str, Any]) -> None:
        """Write results into ``views`` from now on, with the observation writer that fits them."""
        super().attach(views)
        obs = views.get("observations")
        if self.ragged is not None:
            self._write_obs = self._write_ragged
        else:
            self._write_obs = None if obs is None else _make_writer(obs)

    def attach_ragged(self, store: RaggedStore) -> None:
        """Write observations into ``store`` (a re-laid, larger one) from now on."""
        self._write_obs = self._write_ragged
        super().attach_ragged(store)

    def latest_observations(self) -> list[Any] | None:
        """The latest observation of each env, or ``None`` before every env has one."""
        return None if any(o is None for o in self._obs) else self._obs

    def _actions(self, actions: Any) -> Any:
        """Per-env private copies of the group's batch of actions.

        Copies, because an env may keep its action and the parent overwrites the
        shared array on the next step. Discrete actions are the array's numpy scalars
        (each holds its own value), as ``SyncVectorEnv`` hands them out: not Python
        ints, which ``tolist`` would make faster but which cost the env more
        (gymnasium's ``Discrete.contains`` looks up ``np.iinfo`` for an int, which
        slows a CartPole step measurably). Gymnasium's ``iterate`` splits
        everything else exactly as ``SyncVectorEnv`` does.
        """
        if self._discrete and isinstance(actions, np.ndarray):
            return list(actions)
        if self._array_actions and isinstance(actions, np.ndarray):
            # What iterate does for these spaces (rows of the batch), without its dispatch.
            shared = actions is self.views.get("actions")
            return list(actions.copy() if shared else actions)
        if actions is self.views.get("actions"):
            actions = tree_map(np.array, actions)  # else it came pickled: private already
        return list(iterate(self._batch_action_space, actions))

    def step(self, actions: Any) -> Infos:
        """Step every env with its row of ``actions``; results go to ``views``."""
        t_start = perf_counter()
        actions = self._actions(actions)
        envs, mode, autoreset = self.envs, self.mode, self.autoreset
        obs_list, rewards, terms, truncs = self._obs, self._rew, self._term, self._trunc
        env_sec, env_cnt = self.env_sec, self.env_cnt
        infos: Infos = []
        t_env = t_reset = 0.0
        n_resets = 0
        i = 0
        # Results go into plain lists and are written to the views once per batch:
        # one numpy assignment per array instead of one per env. The loop body is
        # kept lean on purpose: it runs once per env step.
        try:
            for i in range(self.n):
                env = envs[i]
                if autoreset[i]:
                    if mode is NEXT_STEP:
                        t0 = perf_counter()
                        obs, info = env.reset()
                        t_reset += perf_counter() - t0
                        n_resets += 1
                        if info.__class__ is not dict:
                            self._check_info(i, info)
                        obs_list[i], rewards[i], terms[i], truncs[i] = obs, 0.0, False, False
                        autoreset[i] = False
                        if info:
                            infos.append((i, info))
                        continue
                    if mode is DISABLED:
                        raise RuntimeError(
                            f"env {self.offset + i} finished its episode and autoreset_mode "
                            "is 'Disabled': reset it (reset(options={'reset_mask': ...})) "
                            "before stepping it again"
                        )
                t0 = perf_counter()
                obs, reward, term, trunc, info = env.step(actions[i])
                dt = perf_counter() - t0
                t_env += dt
                env_sec[i] += dt
                env_cnt[i] += 1
                if info.__class__ is not dict:
                    self._check_info(i, info)
                if (term or trunc) and mode is SAME_STEP:
                    t0 = perf_counter()
                    final = {"final_obs": obs, "final_info": info}
                    obs, info = env.reset()
                    if info.__class__ is not dict:
                        self._check_info(i, info)
                    info = {**info, **final} if info else final
                    t_reset += perf_counter() - t0
                    n_resets += 1
                    done = False
                else:
                    done = term or trunc
                obs_list[i], rewards[i], terms[i], truncs[i] = obs, reward, term, trunc
                autoreset[i] = done
                if info:
                    infos.append((i, info))
        except BaseException:
            self.current_env = i
            raise
        self._publish_all()
        t = self.timers
        t.step_env.add_time(t_env, self.n - n_resets if mode is NEXT_STEP else self.n)
        if n_resets:
            t.step_autoreset.add_time(t_reset, n_resets)
        t.step.add_time(perf_counter() - t_start)
        return infos

    def _check_info(self, i: int, info: Any) -> None:
        """Refuse an info that is no mapping here, where the env is known.

        Written to the batch, it would fail in the parent or the info columns, naming no env.
        """
        if not isinstance(info, Mapping):
            raise TypeError(
                f"env {self.offset + i} returned an info of type {type(info).__name__}: "
                "an env's info is a dict"
            )

    def _publish_all(self) -> None:
        try:
            self._publish(self._rew, self._term, self._trunc)
        except (ValueError, TypeError) as exc:
            self._explain_bad_scalar(exc)
        if self._write_obs is None:
            return
        try:
            self._write_obs(self._obs)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            if self.ragged is not None:  # its message names the env and the path
                self.current_env = self.ragged.failed_row
                raise
            self._explain_bad_observation(exc)

    def _explain_bad_observation(self, exc: Exception) -> None:
        """Name the env whose observation does not fit the observation space."""
        space = self.single_observation_space
        for i, obs in enumerate(self._obs):
            if obs not in space:
                shape = getattr(obs, "shape", None)
                self.current_env = i
                raise ValueError(
                    f"env {self.offset + i} returned an observation that is not in its "
                    f"observation space {space}: got {type(obs).__name__}"
                    + (f" of shape {shape}" if shape is not None else "")
                    + f" ({exc})"
                ) from exc
        raise exc

    def _explain_bad_scalar(self, exc: Exception) -> None:
        """Name the env whose reward or flag is not one number (numpy's message names none).

        Raised as numpy's own error type, which ``SyncVectorEnv`` would raise too.
        """
        rows = (("reward", self._rew), ("terminated", self._term), ("truncated", self._trunc))
        for what, values in rows:
            for i, value in enumerate(values):
                try:
                    fits = np.ndim(value) == 0 and np.float64(value) is not None
                except (ValueError, TypeError):
                    fits = False
                if not fits:
                    self.current_env = i
                    raise type(exc)(
                        f"env {self.offset + i} returned {what} {value!r} of type "
                        f"{type(value).__name__}: one number per env ({exc})"
                    ) from exc
        raise exc

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        mask: Sequence[bool] | None,
        autoreset_next: bool = False,
    ) -> Infos:
        """Reset the envs (those in ``mask``); observations go to ``views``."""
        t_start = perf_counter()
        infos: Infos = []
        t_env = 0.0
        count = 0
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue  # keeps its last observation and flags, as SyncVectorEnv does
            self.current_env = i
            t0 = perf_counter()
            obs, info = env.reset(seed=seeds[i], options=options)
            t_env += perf_counter() - t0
            if info.__class__ is not dict:
                self._check_info(i, info)
            count += 1
            self._obs[i] = obs
            self._rew[i] = 0.0
            self._term[i] = self._trunc[i] = False
            self.autoreset[i] = autoreset_next
            if info:
                infos.append((i, info))
        self.current_env = None
        self._publish_all()
        self.timers.reset_env.add_time(t_env, count)
        self.timers.reset.add_time(perf_counter() - t_start)
        return infos

    def call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], ids: Sequence[int] | None
    ) -> tuple[Any, ...]:
        """Call method (or read attribute) ``name`` of the envs ``ids``, through their wrappers."""
        results = []
        for i in self._ids(ids):
            self.current_env = i
            attr = self.envs[i].get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        self.current_env = None
        return tuple(results)

    def set_attr(self, name: str, values: Sequence[Any], ids: Sequence[int] | None) -> None:
        """Set attribute ``name`` of the envs ``ids``, one value each, through wrappers."""
        for i, value in zip(self._ids(ids), values, strict=True):
            self.current_env = i
            self.envs[i].set_wrapper_attr(name, value)
        self.current_env = None

    def apply(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ids: Sequence[int] | None,
    ) -> tuple[Any, ...]:
        """Return ``fn(env, *args, **kwargs)`` for each env ``ids``."""
        results = []
        for i in self._ids(ids):
            self.current_env = i
            results.append(fn(self.envs[i], *args, **kwargs))
        self.current_env = None
        return tuple(results)

    def observations(self) -> Any:
        """Each env's latest observation; with a ragged store, what it could not hold."""
        if self.ragged is not None:
            return self.ragged_spill()
        return tuple(self._obs)

    def close(self) -> None:
        """Close every env once, ignoring errors from ``close``."""
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass
        self.envs = []


def _make_writer(out: Any) -> Callable[[list[Any]], None]:
    """A function writing a list of per-env observations into the batch views."""
    if isinstance(out, np.ndarray):
        # numpy's own instance of the dtype: the views' may be an unpickled copy, which
        # an env's arrays never are, so "is" would always fail (and did: the slow path
        # ran every step and cost CartPole 2 x 32 about a fifth of its rate).
        dtype = np.dtype(out.dtype.str)

        def write(values: list[Any]) -> None:
            # Refuse what the dtype would change, as SyncVectorEnv's np.stack does (an
            # int64 300 must not arrive as uint8 44); values already of the dtype, the
            # usual case, take the one-pass copy.
            for v in values:
                if getattr(v, "dtype", None) is not dtype:
                    np.copyto(out, values, casting="same_kind")
                    return
            out[:] = values

        return write
    if isinstance(out, dict):
        writers = {k: _make_writer(v) for k, v in out.items()}

        def write_dict(values: list[Any]) -> None:
            for k, w in writers.items():
                w([v[k] for v in values])

        return write_dict
    parts = [_make_writer(v) for v in out]

    def write_tuple(values: list[Any]) -> None:
        for j, w in enumerate(parts):
            w([v[j] for v in values])

    return write_tuple
