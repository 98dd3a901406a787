"""A group hosting one batched env: a ``gymnasium.vector.VectorEnv`` owning all its envs.

One ``step`` call per batch; the hosted env does its own autoreset (the manager
takes the mode from its ``metadata["autoreset_mode"]``), and its vector infos are
split per env so the front end places them at the group's rows. Used by the Ray
backend's ``workers_per_actor > 1`` (the hosted env is a
:class:`~envmgr.SubprocessEnvManager`) and for user batched envs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.envside.group import BuildFailed, EnvGroup, GroupSpec, Infos, unbatched, write_batch
from envmgr.protocol.ragged import row_of
from envmgr.protocol.trees import tree_map

__all__ = [
    "VectorEnvGroup",
]


class VectorEnvGroup(EnvGroup):
    """One hosted ``VectorEnv`` of ``spec.size`` envs, built by ``spec.vector_fn(size)``."""

    # Its step and reset put their infos in the columns themselves (already batched).
    writes_info_columns = True

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        assert spec.vector_fn is not None
        env: Any = None
        try:
            env = spec.vector_fn(self.n)
            if not isinstance(env, gym.vector.VectorEnv):
                raise TypeError(
                    f"the vector env factory returned {type(env).__name__}, "
                    "not a gymnasium.vector.VectorEnv"
                )
            if env.num_envs != self.n:
                raise ValueError(
                    f"the vector env factory was asked for {self.n} envs but returned a "
                    f"VectorEnv with num_envs={env.num_envs}"
                )
        except BaseException as exc:
            _close(env)
            raise BuildFailed(None, exc) from exc
        self.env: Any = env
        if hasattr(env, "first_env_index"):
            # A hosted env that names its envs in messages names them as the manager does.
            env.first_env_index = spec.offset
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.metadata = dict(env.metadata)
        self.render_mode = env.render_mode
        self.env_spec = env.spec
        self._obs: Any = None
        self._observes_views = False
        self._reset_next = False
        # One step call steps every env: its time is shared out per env when published.
        self._seconds = 0.0
        self._calls = 0

    def attach(self, views: dict[str, Any]) -> None:
        """Write results into ``views``; a hosted env that can packs observations there itself.

        Such an env has ``observe_into(arrays) -> bool``; its batches then *are* the views,
        and the copy into them is skipped.
        """
        super().attach(views)
        obs = views.get("observations")
        observe_into = getattr(self.env, "observe_into", None)
        self._observes_views = (
            self.ragged is None and obs is not None and callable(observe_into) and observe_into(obs)
        )

    def step(self, actions: Any) -> Infos:
        """Step the hosted VectorEnv with ``actions``; results go to ``views``."""
        n = self.n
        t0 = perf_counter()
        if self._reset_next:
            # A replacement group in next-step mode: the step after the truncation
            # starts new episodes, as it would after any truncation.
            self._reset_next = False
            obs, vinfos = self.env.reset()
            zeros = np.zeros(n, dtype=np.bool_)
            rewards: Any = np.zeros(n)
            terms, truncs = zeros, zeros
        else:
            if actions is self.views.get("actions"):
                # The parent overwrites the shared actions next step: the env gets its own.
                actions = tree_map(np.array, actions)
            obs, rewards, terms, truncs, vinfos = self.env.step(actions)
        dt = perf_counter() - t0
        self._store(obs)
        for name, got in (("rewards", rewards), ("terminations", terms), ("truncations", truncs)):
            if np.shape(got) != (self.n,):  # numpy would broadcast one value to every env
                raise ValueError(
                    f"the VectorEnv returned {name} of shape {np.shape(got)}, "
                    f"expected ({self.n},): one per env"
                )
        self._publish(rewards, terms, truncs)
        self._seconds += dt
        self._calls += 1
        self.timers.step_env.add_time(dt, 1)
        self.timers.step.add_time(perf_counter() - t0)
        return self._infos(vinfos)

    def _publish_env_times(self, views: dict[str, Any]) -> None:
        views["env_seconds"][:] = self._seconds / self.n
        views["env_steps"][:] = self._calls

    def _store(self, obs: Any) -> None:
        if self.ragged is not None:
            self._obs = obs
            self._write_ragged(self._rows(obs))
        elif self.shared_obs:
            if not (self._observes_views and obs is self.views["observations"]):
                write_batch(self.views, obs)
        else:
            self._obs = obs

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        mask: Sequence[bool] | None,
        autoreset_next: bool = False,
    ) -> Infos:
        """Reset the hosted VectorEnv (its envs in ``mask``); observations go to ``views``."""
        t0 = perf_counter()
        opts = dict(options) if options else {}
        if mask is not None:
            opts["reset_mask"] = np.asarray(mask, dtype=np.bool_)
        obs, vinfos = self.env.reset(seed=_seed_of(seeds), options=opts or None)
        self._reset_next = autoreset_next
        self._store(obs)
        views = self.views
        rows = slice(None) if mask is None else np.asarray(mask, dtype=np.bool_)
        views["rewards"][rows] = 0.0
        views["terminations"][rows] = False
        views["truncations"][rows] = False
        dt = perf_counter() - t0
        self.timers.reset_env.add_time(dt, 1)
        self.timers.reset.add_time(dt)
        return self._infos(vinfos)

    def call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], ids: Sequence[int] | None
    ) -> tuple[Any, ...]:
        """Return the hosted env's ``call(name)``: one result per env, as ``SyncVectorEnv``'s.

        For a VectorEnv without ``call``, ``name`` of the hosted env itself, once per env.
        """
        env = self.env
        if hasattr(env, "call"):
            results = tuple(env.call(name, *args, **kwargs))
        else:
            attr = getattr(env, name)
            results = (attr(*args, **kwargs) if callable(attr) else attr,) * self.n
        return results if ids is None else tuple(results[i] for i in ids)

    def set_attr(self, name: str, values: Sequence[Any], ids: Sequence[int] | None) -> None:
        """Set attributes through the hosted env's ``set_attr``.

        Without one, ``name`` of the hosted env itself is set (all values must then be equal).
        """
        env = self.env
        if not hasattr(env, "set_attr"):
            if len({repr(v) for v in values}) > 1:
                raise ValueError(
                    f"{type(env).__name__} has no set_attr: it takes one {name!r} for all its "
                    "envs, but different values were given"
                )
            setattr(env, name, values[0])
            return
        if ids is None:
            env.set_attr(name, list(values))
            return
        current = list(env.get_attr(name))
        for i, v in zip(ids, values, strict=True):
            current[i] = v
        env.set_attr(name, current)

    def apply(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ids: Sequence[int] | None,
    ) -> tuple[Any, ...]:
        """Refuse: ``apply`` runs a function on single envs, and this group hosts one VectorEnv."""
        raise TypeError(
            "apply() runs a function on single envs; this group hosts one VectorEnv: "
            "use call() to reach it"
        )

    def _infos(self, vinfos: dict[str, Any]) -> Infos:
        """The hosted env's vector infos: numeric arrays into columns, the rest per env."""
        if not isinstance(vinfos, Mapping):
            raise TypeError(
                f"the VectorEnv returned infos of type {type(vinfos).__name__}: a VectorEnv's "
                "infos are one dict"
            )
        writer = self.info_writer
        return unbatched(vinfos, self.n) if writer is None else writer.split_vector(vinfos)

    def _rows(self, obs: Any) -> list[Any]:
        space = self.single_observation_space
        return [row_of(space, obs, i) for i in range(self.n)]

    def latest_observations(self) -> list[Any] | None:
        """The latest observation of each env, or ``None`` before the first reset."""
        return None if self._obs is None else self._rows(self._obs)

    def observations(self) -> Any:
        """Each env's latest observation; with a ragged store, what it could not hold."""
        if self.ragged is not None:
            return self.ragged_spill()
        from gymnasium.vector.utils import batch_space, iterate

        return tuple(iterate(batch_space(self.single_observation_space, self.n), self._obs))

    def close(self) -> None:
        """Close the hosted VectorEnv."""
        _close(getattr(self, "env", None))
        self.env = None


def _seed_of(seeds: Sequence[int | None]) -> int | list[int | None] | None:
    """One seed for the hosted env when the per-env seeds are ``s, s+1, ...`` (or all None)."""
    first = seeds[0]
    if all(s is None for s in seeds):
        return None
    if isinstance(first, int) and all(s == first + i for i, s in enumerate(seeds)):
        return first
    return list(seeds)


def _close(env: Any) -> None:
    if env is None:
        return
    try:
        env.close()
    except Exception:
        pass
