"""``envmgr.make``: a registered env id -> a :class:`SubprocessEnvManager`, like
``gymnasium.make_vec``.

The id is resolved to its :class:`gymnasium.envs.registration.EnvSpec` here, in the parent, and
the spec itself travels to the workers (with cloudpickle). Workers therefore never look the id up
in their own registry, which under ``spawn`` / ``forkserver`` starts out with only Gymnasium's
built-in envs: an env registered by your script (even from ``__main__``) or your test module
works under every start method.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, load_env_creator

from envmgr.layout import split_counts
from envmgr.manager import SubprocessEnvManager
from envmgr.vectorgroup import MakeVec

__all__ = ["make"]

Wrapper = Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]


class _SpecEnvFactory:
    """Zero-argument env factory: ``gym.make(spec, **kwargs)``, then the wrappers in order.

    A plain class (not a closure) so its repr says what it builds and it pickles small.
    """

    def __init__(
        self, spec: EnvSpec, env_kwargs: dict[str, Any], wrappers: tuple[Wrapper, ...]
    ) -> None:
        self.spec = spec
        self.env_kwargs = env_kwargs
        self.wrappers = wrappers

    def __call__(self) -> gym.Env[Any, Any]:
        env = gym.make(self.spec, **self.env_kwargs)
        for wrap in self.wrappers:
            wrapped = wrap(env)
            if not isinstance(wrapped, gym.Env):
                raise TypeError(
                    f"wrapper {wrap!r} returned {type(wrapped).__name__}, not a gymnasium.Env"
                )
            env = wrapped
        _make_spec_picklable(env)
        return env

    def __repr__(self) -> str:
        return f"_SpecEnvFactory({self.spec.id!r}, env_kwargs={self.env_kwargs!r})"


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:
        return False
    return True


def _make_spec_picklable(env: gym.Env[Any, Any]) -> None:
    """Give the env a ``spec`` that plain ``pickle`` can carry back to the parent.

    A worker reports its first env's ``spec`` to the parent with plain pickle. Parts that only
    cloudpickle can carry are replaced by descriptions: an entry point that came by value (a
    class from the user's ``__main__``) by its ``"module:name"``, wrapper kwargs holding
    lambdas by ``None`` (gymnasium's "not recorded"), env kwargs holding lambdas by their repr.
    The env itself is untouched; only what ``env.spec`` reports changes.
    """
    spec = env.spec
    if spec is None or _picklable(spec):
        return
    entry = spec.entry_point
    if callable(entry) and not _picklable(entry):
        module = getattr(entry, "__module__", "?")
        entry = f"{module}:{getattr(entry, '__qualname__', repr(entry))}"
    fixed = dataclasses.replace(
        spec,
        entry_point=entry,
        kwargs={k: v if _picklable(v) else repr(v) for k, v in spec.kwargs.items()},
        additional_wrappers=tuple(
            w if _picklable(w.kwargs) else dataclasses.replace(w, kwargs=None)
            for w in spec.additional_wrappers
        ),
    )
    if isinstance(env, gym.Wrapper):
        if hasattr(env, "_cached_spec"):  # where gymnasium's Wrapper.spec keeps its answer
            env._cached_spec = fixed
    else:
        env.spec = fixed


def _resolve_spec(env_id: str | EnvSpec) -> EnvSpec:
    """The spec for ``env_id`` from the parent's registry, ready to ship to a worker."""
    if isinstance(env_id, EnvSpec):
        spec = env_id
    elif isinstance(env_id, str):
        module, _, name = env_id.rpartition(":")
        if module:  # "package.module:Env-v0" registers its envs on import, as in gym.make
            import importlib

            importlib.import_module(module)
        spec = gym.spec(name)
    else:
        raise TypeError(f"env_id must be a registered id (str) or an EnvSpec, got {env_id!r}")
    entry = spec.entry_point
    if entry is None:
        raise ValueError(f"env {spec.id!r} is registered without an entry_point")
    if isinstance(entry, str):
        # Import it here so a typo fails now, in the caller, rather than in every worker.
        creator = load_env_creator(entry)
        if entry.partition(":")[0] == "__main__":
            # A worker's __main__ is not the user's script: ship the class or function itself
            # (cloudpickle carries __main__ objects by value).
            spec = dataclasses.replace(spec, entry_point=creator)  # type: ignore[arg-type]
    return spec


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def make(
    env_id: str | EnvSpec,
    num_envs: int,
    n_workers: int | None = None,
    *,
    envs_per_worker: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[Wrapper] | None = None,
    vectorization_mode: str | None = None,
    vector_kwargs: Mapping[str, Any] | None = None,
    **manager_kwargs: Any,
) -> SubprocessEnvManager:
    """Creates ``num_envs`` copies of a registered env in worker processes.

    Like ``gymnasium.make_vec(env_id, num_envs, vectorization_mode="async")``, but the result is
    a :class:`SubprocessEnvManager` (batched workers, shared memory, merged timers)::

        envs = envmgr.make("CartPole-v1", num_envs=16, n_workers=2)

    The spec is looked up in this process's registry and shipped to the workers, so envs
    registered by your own code work under every start method: ``gymnasium.register`` with a
    class or function entry point (pickled by value if it lives in ``__main__``, else imported
    by module name in the worker), or with a ``"module:Class"`` string (imported here first,
    so a wrong entry point fails at once; ``"__main__:Class"`` is replaced by the class).

    Args:
        env_id: A registered id such as ``"CartPole-v1"`` (``"module:Env-v0"`` imports
            ``module`` first, as ``gymnasium.make`` does), or an ``EnvSpec``.
        num_envs: Total number of envs; worker ``w`` gets ``num_envs // n_workers``, the first
            ``num_envs % n_workers`` workers one more.
        n_workers: Worker processes. Default: ``num_envs / envs_per_worker`` if that is given,
            else the largest divisor of ``num_envs`` not above the number of cores.
        envs_per_worker: Envs per worker (default ``num_envs / n_workers``).
        env_kwargs: Keyword arguments for ``gymnasium.make`` in each worker: env constructor
            arguments, or ``max_episode_steps``, ``render_mode``, ``disable_env_checker``.
        wrappers: Callables ``env -> env`` applied in order to each env after ``gymnasium.make``
            (e.g. ``gymnasium.wrappers.RecordEpisodeStatistics``); they are pickled with
            cloudpickle, so lambdas are fine.
        vectorization_mode: ``None`` (default): one env per slot. ``"vector_entry_point"`` or
            ``"sync"``: each worker hosts ``gymnasium.make_vec(env_id, num_envs=<its share>,
            vectorization_mode=...)`` (see ``vector_fn`` of :class:`SubprocessEnvManager`).
        vector_kwargs: ``make_vec``'s ``vector_kwargs``, with ``vectorization_mode``.
        **manager_kwargs: Passed on to :class:`SubprocessEnvManager` (``context``, ``copy``,
            ``autoreset_mode``, ``step_timeout``, ...).

    Returns:
        The started manager; use it as a context manager or ``close()`` it.

    Raises:
        gymnasium.error.Error: If ``env_id`` is not registered (``NameNotFound``,
            ``VersionNotFound``, ...).
        ValueError: If ``num_envs`` does not split evenly, a count is not a positive int, or
            ``env_kwargs`` / ``wrappers`` have the wrong type.
        ImportError, AttributeError: If a string entry point cannot be imported.
    """
    num_envs = _positive_int("num_envs", num_envs)
    if n_workers is not None:
        _positive_int("n_workers", n_workers)
    if envs_per_worker is not None:
        _positive_int("envs_per_worker", envs_per_worker)
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise ValueError(f"env_kwargs must be a dict of keyword arguments, got {env_kwargs!r}")
    if wrappers is None:
        wrapper_tuple: tuple[Wrapper, ...] = ()
    elif isinstance(wrappers, (str, bytes)) or not isinstance(wrappers, Sequence):
        raise ValueError(f"wrappers must be a list of callables env -> env, got {wrappers!r}")
    else:
        wrapper_tuple = tuple(wrappers)
        for i, wrap in enumerate(wrapper_tuple):
            if not callable(wrap):
                raise ValueError(f"wrappers[{i}] is {wrap!r}, not a callable env -> env")
    if "env_fns" in manager_kwargs:
        raise TypeError("make() got an unexpected keyword argument 'env_fns'")
    layout = split_counts(num_envs, n_workers, envs_per_worker)
    if vectorization_mode is not None:
        vector_fn = MakeVec(
            _resolve_spec(env_id), vectorization_mode, vector_kwargs, env_kwargs, wrapper_tuple
        )
        return SubprocessEnvManager(
            None, layout.n_groups, vector_fn=vector_fn, num_envs=num_envs, **manager_kwargs
        )
    factory = _SpecEnvFactory(_resolve_spec(env_id), dict(env_kwargs or {}), wrapper_tuple)
    return SubprocessEnvManager(factory, layout.n_groups, num_envs=num_envs, **manager_kwargs)
