"""``EnvmgrVecEnv``: envmgr as a drop-in for Stable-Baselines3's ``SubprocVecEnv``.

Migration is the class name::

    # env = SubprocVecEnv([make_env(i) for i in range(8)])
    env = EnvmgrVecEnv([make_env(i) for i in range(8)])

or ``make_vec_env(env_id, n_envs=8, vec_env_cls=EnvmgrVecEnv)``. Underneath is a
:class:`~envmgr.SubprocessEnvManager` that batches the envs over a few worker
processes, so SB3 gets shared memory, step timeouts, restarts, merged timer trees
and envmgr's error reports.

How SB3's semantics are met (``SubprocVecEnv``'s, checked against its source):

* The manager runs in Gymnasium's ``SameStep`` autoreset mode, which is SB3's: a
  finished env is reset (``env.reset()``, no seed, no options) in the step that
  finished it, its terminal observation is kept as ``final_obs``, the reward and
  flags are the finishing step's. ``step_wait`` turns that into SB3's
  ``(obs, rewards, dones, infos)`` with ``terminal_observation`` and
  ``TimeLimit.truncated`` in the info and the reset info in ``reset_infos``.
* Info dicts arrive exactly as the env returned them (see
  :mod:`envmgr.integrations.sb3_shim`), not as Gymnasium's per-key arrays.
* ``seed()`` / ``set_options()`` apply at the next ``reset()``; env ``i`` gets
  ``seed + i``; options are per env.
* ``get_attr`` / ``set_attr`` / ``env_method`` / ``env_is_wrapped`` / ``has_attr``
  / ``get_images`` run in the workers against the user's env, for the chosen
  ``indices`` only.

Requires ``pip install "envmgr[sb3]"``.
"""

from __future__ import annotations

import multiprocessing as mp
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from envmgr.frontend.results import RESTARTED_INFO_KEY
from envmgr.integrations import sb3_shim as remote
from envmgr.integrations.sb3_shim import INFO_KEY, ShimFactory
from envmgr.managers.local import SubprocessEnvManager

__all__ = ["EnvmgrVecEnv"]

#: Manager arguments the adapter sets itself.
_RESERVED = ("context", "autoreset_mode", "envs_per_worker")


class EnvmgrVecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` whose envs run in envmgr's batched workers.

    Constructed as ``SubprocVecEnv`` is, so swapping the class name is the whole
    migration; it behaves as ``SubprocVecEnv`` does, step for step.

    Args:
        env_fns: One zero-argument env factory per env (lambdas and closures are
            fine: they travel with cloudpickle).
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default
            ``forkserver`` where it exists, else ``spawn`` (as ``SubprocVecEnv``).
        n_workers: Worker processes; default ``min(len(env_fns), cpu_count)``.
            Envs are split in order, the first workers taking one more when the
            split is uneven.
        **manager_kwargs: Passed to :class:`~envmgr.SubprocessEnvManager`
            (``step_timeout``, ``max_restarts``, ``check_actions``,
            ``spin_seconds``, ...). Keep the default ``copy=True``: SB3 keeps the
            previous observation across a step.

    Raises:
        ValueError: ``env_fns`` is empty, ``start_method`` is not a start method
            here, or ``n_workers`` is not in ``1..len(env_fns)``.
        TypeError: ``manager_kwargs`` sets what the adapter must set itself.

    Attributes:
        manager: The :class:`~envmgr.SubprocessEnvManager` underneath (restarts,
            per-env step times, worker pids).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        start_method: str | None = None,
        *,
        n_workers: int | None = None,
        **manager_kwargs: Any,
    ) -> None:
        fns = list(env_fns)
        if not fns:
            raise ValueError("env_fns is empty: EnvmgrVecEnv needs at least one env factory")
        if start_method is not None:
            try:
                mp.get_context(start_method)
            except ValueError as exc:
                # multiprocessing's own words first ("cannot find context for ..."), as
                # SubprocVecEnv raises them and SB3's tests match them; then the choices.
                raise ValueError(
                    f"{exc}: start_method must be one of {mp.get_all_start_methods()}"
                ) from None
        clash = [k for k in _RESERVED if k in manager_kwargs]
        if clash:
            raise TypeError(
                f"EnvmgrVecEnv sets {clash[0]!r} itself (start_method= is the start method; "
                "autoreset is SB3's same-step mode; n_workers= splits the envs)"
            )
        workers = _worker_count(len(fns), n_workers)
        self.closed = True
        self.manager = SubprocessEnvManager(
            [ShimFactory(fn, i) for i, fn in enumerate(fns)],
            n_workers=workers,
            context=start_method,
            autoreset_mode=AutoresetMode.SAME_STEP,
            **manager_kwargs,
        )
        self.closed = False
        try:
            super().__init__(
                len(fns), self.manager.single_observation_space, self.manager.single_action_space
            )
        except BaseException:
            self.close()
            raise
        space = self.action_space
        self._structured_actions = isinstance(space, (spaces.Dict, spaces.Tuple))

    # ---------------------------------------------------------------- stepping

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds and options set since the last reset."""
        if len(self._options) != self.num_envs:
            raise ValueError(
                f"set_options() got {len(self._options)} option dicts for {self.num_envs} envs: "
                "pass one per env, or a single dict for all"
            )
        options = None
        if any(self._options):
            options = {INFO_KEY: tuple(self._options)}  # each shim takes its own
        obs, infos = self.manager.reset(seed=list(self._seeds), options=options)
        reset_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, info in remote.decode(infos).items():
            reset_infos[i] = info
        self.reset_infos = reset_infos
        # Seeds and options are used once, as in SB3.
        self._reset_seeds()
        self._reset_options()
        return obs  # type: ignore[no-any-return]

    def step_async(self, actions: np.ndarray) -> None:
        """Send the actions (first axis: env) to the workers."""
        self.manager.step_async(self._batched(actions))

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step; ``(obs, rewards, dones, infos)`` as ``SubprocVecEnv`` returns them."""
        # No timer of its own here: the manager merges worker trees under the
        # context current at step_async, which must be the one its wait is timed in.
        obs, rewards, terminated, truncated, infos = self.manager.step_wait()
        dones = terminated | truncated
        return obs, rewards, dones, self._sb3_infos(infos, terminated, truncated, dones)

    def _sb3_infos(
        self,
        infos: dict[str, Any],
        terminated: np.ndarray,
        truncated: np.ndarray,
        dones: np.ndarray,
    ) -> list[dict[str, Any]]:
        """SB3's per-env info list from the manager's vector infos (same-step mode).

        Only envs that said something or finished are looked at one by one: this
        runs every step, and most steps of most envs have nothing to say.
        """
        out: list[dict[str, Any]] = [{"TimeLimit.truncated": False} for _ in range(self.num_envs)]
        if not infos:  # nothing said and nobody done: the common step
            return out
        own = remote.decode(infos)
        for i, info in own.items():
            if not dones[i]:  # the step's own info
                info["TimeLimit.truncated"] = False
                out[i] = info
        if dones.any():
            final = remote.decode(infos.get("final_info", {}))
            with_final_obs = set(_rows(infos, "final_obs"))
            for i in np.flatnonzero(dones).tolist():
                # The top-level info is the reset's; the step's is under final_info.
                info = final.get(i, {})
                info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
                if i in with_final_obs:
                    info["terminal_observation"] = infos["final_obs"][i]
                out[i] = info
                self.reset_infos[i] = own.get(i, {})
        for i in _rows(infos, RESTARTED_INFO_KEY):
            # The worker was replaced: the episode is cut short (truncated, no
            # terminal observation); say why.
            out[i][RESTARTED_INFO_KEY] = infos[RESTARTED_INFO_KEY][i]
        return out

    def _batched(self, actions: Any) -> Any:
        """Actions in the manager's batched layout.

        SB3 hands over one array whose first axis is the env, or a list with one
        action per env; for Dict and Tuple spaces a per-env list is batched into
        Gymnasium's layout (a dict or tuple of arrays).
        """
        if not self._structured_actions:
            return np.asarray(actions)
        if isinstance(actions, (list, np.ndarray)) and len(actions) == self.num_envs:
            space = self.manager.single_action_space
            out = create_empty_array(space, self.num_envs)
            return concatenate(space, list(actions), out)  # type: ignore[arg-type]
        return actions

    def close(self) -> None:
        """Close the manager: workers stopped and joined, shared memory released."""
        if self.closed:
            return
        self.closed = True
        self.manager.close()

    def __enter__(self) -> EnvmgrVecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- per-env requests

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attribute ``attr_name`` of each chosen env (``env.get_wrapper_attr``)."""
        return self._run(indices, remote.get_attr, attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` to ``value`` on each chosen env (plain ``setattr``, as SB3)."""
        self._run(indices, remote.set_attr, attr_name, value)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call method ``method_name`` of each chosen env; one result per env."""
        return self._run(indices, remote.env_method, method_name, method_args, method_kwargs)

    def env_is_wrapped(
        self,
        wrapper_class: type[gym.Wrapper],  # type: ignore[type-arg]
        indices: VecEnvIndices = None,
    ) -> list[bool]:
        """Whether each chosen env has ``wrapper_class`` in its wrapper chain.

        Asked by import path, so the workers need not import it: ``sb3_shim.class_ref``.
        """
        return self._run(indices, remote.is_wrapped, remote.class_ref(wrapper_class))

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has attribute ``attr_name``."""
        return all(self._run(None, remote.has_attr, attr_name))

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` image (``render_mode="rgb_array"`` only, as SB3)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is "
                "`rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return self._run(None, remote.render)

    def _run(self, indices: VecEnvIndices, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(env, *args)`` in the workers for each env of ``indices``, in that order.

        Indices may be negative (Python's meaning) or repeated: a repeated env is
        visited once per mention, in order, as SubprocVecEnv does (``env_method("bump",
        indices=[0, 0])`` bumps twice).
        """
        n = self.num_envs
        chosen = []
        for i in self._get_indices(indices):
            i = operator.index(i)  # a float index is a TypeError, as in SubprocVecEnv
            if not -n <= i < n:
                raise IndexError(f"env index {i} is out of range for {n} envs")
            chosen.append(i % n)
        if not chosen:
            return []
        return _targets(self.manager, chosen, fn, args)


def _rows(infos: dict[str, Any], key: str, among: np.ndarray | None = None) -> list[int]:
    """Envs whose info has ``key`` in Gymnasium's vector infos (its ``_key`` mask)."""
    mask = infos.get(f"_{key}")
    if mask is None:
        return []
    if among is not None:
        mask = mask & among
    return np.flatnonzero(mask).tolist()  # type: ignore[no-any-return]


def _targets(
    manager: SubprocessEnvManager,
    env_ids: list[int],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> list[Any]:
    """Run ``fn(user env, *args)`` for envs ``env_ids``, in that order; return the results.

    An env named twice runs twice; only the workers owning those envs are contacted.
    """
    return list(manager.apply(remote.on_user_env, fn, *args, env_ids=env_ids))


def _worker_count(num_envs: int, n_workers: int | None) -> int | None:
    """Return ``n_workers`` checked against ``num_envs``.

    ``None`` leaves the manager's default (``min(num_envs, cpu_count)``).
    """
    if n_workers is None:
        return None
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers must be a positive int, got {n_workers!r}")
    if n_workers > num_envs:
        raise ValueError(f"n_workers={n_workers} is more than the {num_envs} envs given")
    return n_workers
