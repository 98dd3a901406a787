"""``envmgr.make``: a registered env id -> a :class:`SubprocessEnvManager`.

It is made as ``gymnasium.make_vec`` makes a ``SyncVectorEnv`` or ``AsyncVectorEnv``.

The arguments are ``make_vec``'s: env keyword arguments go to the env, the manager's options
go in ``vector_kwargs``, and ``n_workers`` (how many processes share the envs) is a keyword of
its own.

The id is resolved to its :class:`gymnasium.envs.registration.EnvSpec` here, in the parent, and
the spec itself travels to the workers (with cloudpickle). Workers therefore never look the id up
in their own registry, which under ``spawn`` / ``forkserver`` starts out with only Gymnasium's
built-in envs: an env registered by your script (even from ``__main__``) or your test module
works under every start method.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, VectorizeMode, load_env_creator

from envmgr.frontend.options import FrontEndOptions, count
from envmgr.managers.local import SubprocessEnvManager

__all__ = [
    "make",
    "SpecEnvFactory",
    "SpecVectorEnvFactory",
    "check_env_kwargs",
    "resolve_spec",
]

#: ``gymnasium.make_vec``'s arguments, which a vector env's spec records in its kwargs.
_MAKE_VEC_ARGUMENTS = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers")

# Manager arguments that make() fills in itself.
_SET_BY_MAKE = ("env_fns", "n_workers", "envs_per_worker", "num_envs", "vector_fn")

Wrapper = Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]


class SpecEnvFactory:
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
        """Build the env from its spec, applying the wrappers in order."""
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
        return f"SpecEnvFactory({self.spec.id!r}, env_kwargs={self.env_kwargs!r})"


class SpecVectorEnvFactory:
    """Factory of one batched env per worker, made with ``gymnasium.make_vec``.

    It is ``n -> gymnasium.make_vec(spec, n, mode, wrappers=..., **env_kwargs)``, for
    ``vectorization_mode="sync"`` or ``"vector_entry_point"``.

    A plain class (not a closure) so its repr says what it builds and it pickles small.
    """

    def __init__(
        self,
        spec: EnvSpec,
        mode: str,
        env_kwargs: dict[str, Any],
        wrappers: tuple[Wrapper, ...],
    ) -> None:
        self.spec = spec
        self.mode = mode
        self.env_kwargs = env_kwargs
        self.wrappers = wrappers

    def __call__(self, num_envs: int) -> gym.vector.VectorEnv[Any, Any, Any]:
        """Build ``num_envs`` envs as one VectorEnv with ``gymnasium.make_vec``."""
        envs = gym.make_vec(
            self.spec,
            num_envs=num_envs,
            vectorization_mode=self.mode,
            wrappers=list(self.wrappers) or None,  # type: ignore[arg-type]
            **self.env_kwargs,
        )
        _make_spec_picklable(envs)  # make_vec records the wrappers (lambdas) in the spec
        return envs

    def __repr__(self) -> str:
        return (
            f"SpecVectorEnvFactory({self.spec.id!r}, vectorization_mode={self.mode!r}, "
            f"env_kwargs={self.env_kwargs!r})"
        )


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:
        return False
    return True


def _make_spec_picklable(env: gym.Env[Any, Any] | gym.vector.VectorEnv[Any, Any, Any]) -> None:
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
    elif isinstance(env, gym.vector.VectorEnv):
        env.unwrapped.spec = fixed  # where make_vec put it
    else:
        env.spec = fixed


def resolve_spec(env_id: str | EnvSpec) -> EnvSpec:
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


def _vectorization_mode(mode: Any, spec: EnvSpec, wrappers: tuple[Wrapper, ...]) -> str:
    """``mode`` as ``"async"``, ``"sync"`` or ``"vector_entry_point"``, checked against the spec."""
    if mode is None:
        return "async"
    try:
        value = VectorizeMode(mode).value
    except ValueError:
        valid = ", ".join(repr(m.value) for m in VectorizeMode)
        raise ValueError(
            f"vectorization_mode must be one of {valid} or None, got {mode!r}"
        ) from None
    if value == "vector_entry_point":
        if spec.vector_entry_point is None:
            raise ValueError(
                f"vectorization_mode='vector_entry_point', but {spec.id!r} is registered without "
                "a vector_entry_point; use 'async' (one env per slot) or 'sync'"
            )
        if wrappers:
            raise ValueError(
                "wrappers cannot be used with vectorization_mode='vector_entry_point' (as in "
                "gymnasium.make_vec): the envs are built by the vector entry point"
            )
    return str(value)


def _env_parameters(spec: EnvSpec) -> set[str] | None:
    """Keyword names the env's entry point takes; ``None`` if it takes any (or is unknown)."""
    entry = spec.entry_point
    try:
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        params = inspect.signature(creator).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError, ImportError, AttributeError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def check_env_kwargs(spec: EnvSpec, env_kwargs: Mapping[str, Any]) -> None:
    """Refuse, with the fix, manager arguments and the old ``env_kwargs=`` given as env kwargs."""
    if "env_kwargs" in env_kwargs:
        raise TypeError(
            "make() passes its keyword arguments to the env, as gymnasium.make_vec does: write "
            "make(id, num_envs, g=9.0) instead of env_kwargs={'g': 9.0}"
        )
    manager_args = (
        set(inspect.signature(SubprocessEnvManager).parameters)
        | set(FrontEndOptions.__annotations__)
        | set(_SET_BY_MAKE)
    )
    suspicious = sorted(set(env_kwargs) & manager_args)
    accepted = _env_parameters(spec) if suspicious else None
    if accepted is None:
        return  # nothing suspicious, or the env takes **kwargs: they may well be its own
    misplaced = [k for k in suspicious if k not in accepted]
    for key in misplaced:
        if key in _SET_BY_MAKE:
            raise TypeError(
                f"{key} is not an argument of {spec.id!r}, and make() sets it itself: give the "
                "number of worker processes as n_workers=N (num_envs is split over them)"
            )
    if misplaced:
        shown = ", ".join(f"{k!r}: {env_kwargs[k]!r}" for k in misplaced)
        what = "is a manager option" if len(misplaced) == 1 else "are manager options"
        raise TypeError(
            f"{', '.join(misplaced)} {what}, not an argument of {spec.id!r}: "
            f"pass vector_kwargs={{{shown}}}"
        )


def _check_vector_kwargs(vector_kwargs: Any) -> dict[str, Any]:
    if vector_kwargs is None:
        return {}
    if not isinstance(vector_kwargs, Mapping):
        raise ValueError(f"vector_kwargs must be a dict of manager options, got {vector_kwargs!r}")
    for key in _SET_BY_MAKE:
        if key in vector_kwargs:
            hint = "pass n_workers=... to make()" if key != "env_fns" else "make() builds them"
            raise TypeError(f"vector_kwargs may not contain {key!r}: {hint}")
    return dict(vector_kwargs)


def _check_wrappers(wrappers: Any) -> tuple[Wrapper, ...]:
    if wrappers is None:
        return ()
    if isinstance(wrappers, (str, bytes)) or not isinstance(wrappers, Sequence):
        raise ValueError(f"wrappers must be a list of callables env -> env, got {wrappers!r}")
    for i, wrap in enumerate(wrappers):
        if not callable(wrap):
            raise ValueError(f"wrappers[{i}] is {wrap!r}, not a callable env -> env")
    return tuple(wrappers)


def make(
    env_id: str | EnvSpec,
    num_envs: int = 1,
    *,
    n_workers: int | None = None,
    vectorization_mode: str | VectorizeMode | None = None,
    vector_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[Wrapper] | None = None,
    **env_kwargs: Any,
) -> SubprocessEnvManager:
    """Creates ``num_envs`` copies of a registered env in worker processes.

    A drop-in for ``gymnasium.make_vec(env_id, num_envs, ...)``; the result is a
    :class:`SubprocessEnvManager` (batched workers, shared memory, merged timers)::

        envs = envmgr.make("Pendulum-v1", num_envs=8, n_workers=2, g=9.0,
                           vector_kwargs={"context": "spawn"})

    The spec is looked up in this process's registry and shipped to the workers, so envs
    registered by your own code work under every start method: ``gymnasium.register`` with a
    class or function entry point (pickled by value if it lives in ``__main__``, else imported
    by module name in the worker), or with a ``"module:Class"`` string (imported here first,
    so a wrong entry point fails at once; ``"__main__:Class"`` is replaced by the class).

    Args:
        env_id: A registered id such as ``"CartPole-v1"`` (``"module:Env-v0"`` imports
            ``module`` first, as ``gymnasium.make`` does), or an ``EnvSpec``.
        num_envs: Total number of envs.
        n_workers: Worker processes; default ``min(num_envs, os.cpu_count())``. Any
            ``n_workers <= num_envs`` works: worker ``w`` gets ``num_envs // n_workers``
            envs, or one more (the first workers first).
        vectorization_mode: What each worker hosts. ``None`` or ``"async"``: its share of
            single envs (``gymnasium.make`` each), like ``AsyncVectorEnv``. ``"sync"``: one
            ``gymnasium.make_vec(..., vectorization_mode="sync")`` of its share.
            ``"vector_entry_point"``: one env from the spec's own vector entry point (e.g. a
            numpy-batched CartPole), built with the worker's share as ``num_envs``.
        vector_kwargs: Options for :class:`SubprocessEnvManager` (``context``, ``copy``,
            ``autoreset_mode``, ``check_actions``, ``step_timeout``, ...), as
            ``make_vec`` passes them to ``AsyncVectorEnv``.
        wrappers: Callables ``env -> env`` applied in order to each single env after
            ``gymnasium.make`` (e.g. ``gymnasium.wrappers.RecordEpisodeStatistics``); they
            are pickled with cloudpickle, so lambdas are fine. Not with
            ``"vector_entry_point"``, as in ``make_vec``.
        **env_kwargs: Keyword arguments for ``gymnasium.make`` in each worker: env
            constructor arguments (``g=9.0``), or ``max_episode_steps``, ``render_mode``,
            ``disable_env_checker``.

    Returns:
        The started manager; use it as a context manager or ``close()`` it.

    Raises:
        gymnasium.error.Error: If ``env_id`` is not registered (``NameNotFound``,
            ``VersionNotFound``, ...).
        ValueError: A count that is not a positive int, more workers than envs, an unknown
            ``vectorization_mode``, or ``vector_kwargs`` / ``wrappers`` of the wrong type.
        TypeError: A manager option passed as an env keyword (the message says to use
            ``vector_kwargs``), or ``vector_kwargs`` holding what make() sets itself.
        ImportError, AttributeError: If a string entry point cannot be imported.
    """
    spec = resolve_spec(env_id)
    # A spec from a vector env (envs.spec of make_vec) records make_vec's own arguments
    # among its kwargs: they are taken out and used, as make_vec does (the spec's win).
    recorded = {k: spec.kwargs[k] for k in _MAKE_VEC_ARGUMENTS if k in spec.kwargs}
    if recorded:
        kept = {k: v for k, v in spec.kwargs.items() if k not in recorded}
        spec = dataclasses.replace(spec, kwargs=kept)
        num_envs = recorded.get("num_envs", num_envs)
        vectorization_mode = recorded.get("vectorization_mode", vectorization_mode)
        vector_kwargs = recorded.get("vector_kwargs", vector_kwargs)
        wrappers = recorded.get("wrappers", wrappers)
    num_envs = count("num_envs", num_envs)
    n_workers = count("n_workers", n_workers)
    # No n_workers: the manager's own default (min(num_envs, cores), split unevenly).
    if n_workers is not None and n_workers > num_envs:
        raise ValueError(
            f"n_workers={n_workers} is more than num_envs={num_envs}: every worker needs an env"
        )
    manager_kwargs = _check_vector_kwargs(vector_kwargs)
    wrapper_tuple = _check_wrappers(wrappers)
    check_env_kwargs(spec, env_kwargs)
    mode = _vectorization_mode(vectorization_mode, spec, wrapper_tuple)
    if mode == "async":
        factory = SpecEnvFactory(spec, dict(env_kwargs), wrapper_tuple)
        envs = SubprocessEnvManager(factory, n_workers, num_envs=num_envs, **manager_kwargs)
    else:
        vector_fn = SpecVectorEnvFactory(spec, mode, dict(env_kwargs), wrapper_tuple)
        envs = SubprocessEnvManager(
            None, n_workers, num_envs=num_envs, vector_fn=vector_fn, **manager_kwargs
        )
    # As make_vec records its arguments in the spec, so that make(envs.spec) builds the
    # same manager again (the workers' own spec gave one worker's share).
    recorded = {"num_envs": num_envs, "vectorization_mode": mode, "wrappers": wrapper_tuple}
    recorded["vector_kwargs"] = manager_kwargs
    reported = envs.spec or spec  # the workers' (plain-picklable) spec, with the env kwargs
    envs.spec = dataclasses.replace(reported, kwargs={**reported.kwargs, **recorded})
    return envs
