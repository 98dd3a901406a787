"""The managers' constructor arguments turned into a plan: factories, layout, group specs."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import cloudpickle
import gymnasium as gym
from gymnasium.vector import AutoresetMode

from envmgr.envside.group import GroupSpec
from envmgr.envside.registrations import registrations
from envmgr.frontend.options import FrontEndOptions, count
from envmgr.protocol.layout import Layout

__all__ = [
    "check_caller_envs",
    "check_env_fns",
    "default_group_count",
    "group_specs",
    "hosted_layout",
    "resolve_layout",
    "split_caller",
    "split_counts",
]

EnvFactory = Callable[[], gym.Env[Any, Any]]
VectorEnvFactory = Callable[[int], gym.vector.VectorEnv]  # type: ignore[type-arg]
_F = TypeVar("_F", bound=Callable[..., Any])


def default_group_count(num_envs: int | None, default_groups: int | None = None) -> int:
    """Return the one default group count: ``min(num_envs, G)``.

    ``G`` is the core count (or ``default_groups``: Ray's alive nodes); ``G`` alone when
    ``num_envs`` is not known yet (a single factory given only a group size).
    """
    limit = max(1, default_groups or os.cpu_count() or 1)
    return limit if num_envs is None else min(num_envs, limit)


def split_counts(
    num_envs: int,
    n_groups: int | None,
    per_group: int | None,
    *,
    default_groups: int | None = None,
    names: tuple[str, str] = ("n_workers", "envs_per_worker"),
    what: str = "num_envs={n}",
) -> Layout:
    """The layout of ``num_envs`` envs given a group count and/or a group size.

    ``per_group`` asks for an even split; otherwise the split may be uneven (the
    first groups one env more), over ``n_groups`` or :func:`default_group_count`.
    """
    g_name, e_name = names
    n_groups, per_group = count(g_name, n_groups), count(e_name, per_group)
    label = what.format(n=num_envs)
    if per_group is not None:
        if n_groups is not None and n_groups * per_group != num_envs:
            raise ValueError(
                f"{g_name} * {e_name} = {n_groups} * {per_group} = "
                f"{n_groups * per_group} does not match {label}"
            )
        if num_envs % per_group:
            raise ValueError(f"{label}, which cannot be split into groups of {e_name}={per_group}")
        return Layout.of([per_group] * (num_envs // per_group))
    if n_groups is None:
        n_groups = default_group_count(num_envs, default_groups)
    if n_groups > num_envs:
        raise ValueError(f"{label}, fewer than {g_name}={n_groups}: every group needs an env")
    return Layout.split(num_envs, n_groups)


def resolve_layout(
    env_fns: _F | Sequence[_F],
    n_groups: int | None,
    per_group: int | None,
    *,
    num_envs: int | None = None,
    default_groups: int | None = None,
    names: tuple[str, str] = ("n_workers", "envs_per_worker"),
) -> tuple[list[_F], Layout]:
    """The constructor's arguments as (one factory per env, layout).

    Args:
        env_fns: One factory (called once per env) or one per env.
        n_groups: Worker processes (or actors).
        per_group: Envs per group (an even split).
        num_envs: Total envs, with a single factory (else implied by the sequence).
        default_groups: What caps the default group count instead of the core count
            (Ray: the alive nodes); see :func:`default_group_count`.
        names: The caller's argument names, for messages.

    Raises:
        TypeError: A single factory and no size at all (nothing says how many envs).
    """
    n_groups, per_group = count(names[0], n_groups), count(names[1], per_group)
    checked: Any = check_env_fns(env_fns)  # a factory, or a list of them
    if callable(checked):
        if num_envs is None:
            if n_groups is None and per_group is None:
                g_name, e_name = names
                cap = "alive nodes" if default_groups else "cores"
                raise TypeError(
                    f"one env factory and no size: pass num_envs=N ({g_name} then defaults "
                    f"to min(N, {cap})), or {g_name} and/or {e_name} ({g_name} * {e_name} "
                    "envs), or one factory per env"
                )
            g = n_groups if n_groups is not None else default_group_count(None, default_groups)
            layout = Layout.of([per_group or 1] * g)
        else:
            num_envs = count("num_envs", num_envs)
            layout = split_counts(
                num_envs, n_groups, per_group, names=names, default_groups=default_groups
            )
        return [checked] * layout.num_envs, layout
    fns: list[_F] = checked
    if num_envs is not None and num_envs != len(fns):
        raise ValueError(f"num_envs={num_envs}, but {len(fns)} env factories were given")
    layout = split_counts(
        len(fns),
        n_groups,
        per_group,
        default_groups=default_groups,
        names=names,
        what="{n} env factories were given",
    )
    return fns, layout


def _factory_hint(obj: Any) -> str:
    """A factory expression that would build ``obj``, for messages."""
    spec = getattr(obj, "spec", None)
    env_id = getattr(spec, "id", None)
    if isinstance(obj, str):
        env_id = obj
    if env_id:
        return f"lambda: gym.make({env_id!r})"
    unwrapped = getattr(obj, "unwrapped", obj)
    return f"lambda: {type(unwrapped).__name__}(...)"


def _not_a_factory(name: str, obj: Any) -> TypeError:
    if isinstance(obj, (gym.Env, gym.vector.VectorEnv)):
        what = f"an env instance ({obj})"
    elif isinstance(obj, str):
        what = f"the string {obj!r}"
    else:
        return TypeError(f"{name} is {obj!r}, not a zero-argument callable that returns an env")
    return TypeError(
        f"{name} is {what}, not an env factory: pass a function that builds the env, e.g. "
        f"{_factory_hint(obj)}, so that each worker process builds its own"
        + (" (or envmgr.make(id, num_envs=...))" if isinstance(obj, str) else "")
    )


def check_env_fns(env_fns: Any) -> EnvFactory | list[EnvFactory]:
    """Check the manager's ``env_fns`` argument; return it as a factory or a list of them.

    A factory is a zero-argument callable returning an env (``lambda: gym.make(...)``, an env
    class, a ``functools.partial``). An env *instance* cannot be shipped to a worker and
    stepped there, so it is refused with a hint rather than failing later as
    ``'TimeLimit' object is not iterable``. The result is a list when ``env_fns`` is a
    sequence (an iterator is read once, here), the factory itself otherwise.

    Raises:
        TypeError: ``env_fns``, or one of its items, is not callable (an env instance, an
            env id string, ...); the message says what to pass instead.
        ValueError: An empty sequence.
    """
    if isinstance(env_fns, (gym.Env, gym.vector.VectorEnv, str)):
        raise _not_a_factory("env_fns", env_fns)
    if callable(env_fns):
        return env_fns  # type: ignore[no-any-return]
    if not isinstance(env_fns, Iterable):
        raise TypeError(
            "env_fns must be a zero-argument env factory or a sequence of them, "
            f"got {type(env_fns).__name__} {env_fns!r}"
        )
    fns = list(env_fns)
    if not fns:
        raise ValueError("env_fns is an empty sequence: need at least one env factory")
    for i, fn in enumerate(fns):
        if not callable(fn) or isinstance(fn, (gym.Env, gym.vector.VectorEnv)):
            raise _not_a_factory(f"env_fns[{i}]", fn)
    return fns


def check_caller_envs(k: Any, num_envs: int | None) -> int:
    """``caller_envs`` as an int, or a clear error naming what is wrong with it."""
    num_envs = count("num_envs", num_envs)  # a bad num_envs is named as itself first
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"caller_envs must be an int >= 0, got {k!r}")
    if num_envs is not None and k >= num_envs:
        raise ValueError(
            f"caller_envs={k} leaves no env for the workers (num_envs={num_envs}): "
            "use gymnasium.vector.SyncVectorEnv to step every env in this process"
        )
    return k


def split_caller(
    env_fns: Any, options: Mapping[str, Any], k: int
) -> tuple[Any, dict[str, Any], tuple[Any, ...] | None]:
    """The workers' ``env_fns`` and options, and the caller's factories (the last ``k``).

    ``num_envs`` counts every env, so the workers get ``num_envs - k``; without
    it, the workers' envs follow ``n_workers``/``envs_per_worker`` and the
    caller's ``k`` come on top. A ``vector_fn`` is called with ``k`` for the
    caller group (the caller's factories are then ``None``).
    """
    opts = dict(options)
    num_envs = opts.get("num_envs")
    check_caller_envs(k, num_envs)
    if k == 0:
        return env_fns, opts, None
    if num_envs is not None:
        opts["num_envs"] = num_envs - k
    if env_fns is None:
        return None, opts, None
    checked = check_env_fns(env_fns)
    if callable(checked):
        return checked, opts, (checked,) * k
    check_caller_envs(k, len(checked))
    return checked[:-k], opts, tuple(checked[-k:])


def group_specs(
    layout: Layout,
    fns: Sequence[EnvFactory] | None,
    vector_fn: VectorEnvFactory | None,
    autoreset_mode: str,
    noun: str,
    ragged: Any = None,
) -> list[bytes]:
    """Each group's cloudpickled :class:`GroupSpec`; an unpicklable factory fails here."""
    payloads = []
    known = registrations()  # once: every group gets the same bytes
    for g in range(layout.n_groups):
        r = layout.range(g)
        spec = GroupSpec(
            g,
            r.start,
            len(r),
            autoreset_mode,
            None if fns is None else tuple(fns[r.start : r.stop]),
            vector_fn,
            known,
            ragged,
        )
        try:
            payloads.append(cloudpickle.dumps(spec))
        except Exception as exc:
            raise ValueError(
                f"env factory for {noun} {g} (envs {r.start}-{r.stop - 1}) cannot be pickled: {exc}"
            ) from exc
    return payloads


def hosted_layout(
    env_fns: Any,
    n_groups: int | None,
    per_group: int | None,
    options: FrontEndOptions,
    names: tuple[str, str] = ("n_workers", "envs_per_worker"),
    default_groups: int | None = None,
) -> tuple[list[EnvFactory] | None, Layout, str]:
    """The factories, layout and autoreset mode (value) of a manager's arguments.

    ``default_groups`` (Ray: the node count) replaces the core count when nothing
    says how many groups.
    """
    default_groups = max(1, default_groups) if default_groups is not None else None
    vector_fn, num_envs = options.get("vector_fn"), options.get("num_envs")
    mode = AutoresetMode(options.get("autoreset_mode") or AutoresetMode.NEXT_STEP).value
    if (env_fns is None) == (vector_fn is None):
        raise TypeError("pass exactly one of env_fns (one env per slot) and vector_fn")
    if vector_fn is None:
        fns, layout = resolve_layout(
            env_fns,
            n_groups,
            per_group,
            num_envs=num_envs,
            default_groups=default_groups,
            names=names,
        )
        return fns, layout, mode
    if not callable(vector_fn):
        raise TypeError(f"vector_fn must be a callable num_envs -> VectorEnv, got {vector_fn!r}")
    if num_envs is None:
        raise TypeError("vector_fn needs num_envs (the total over all groups)")
    _, layout = resolve_layout(
        vector_fn,
        n_groups,
        per_group,
        num_envs=num_envs,
        default_groups=default_groups,
        names=names,
    )
    return None, layout, mode
