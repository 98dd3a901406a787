"""The half of the Stable-Baselines3 adapter that runs inside envmgr's workers.

Kept apart from :mod:`envmgr.integrations.sb3` because that module subclasses
SB3's ``VecEnv`` and so imports SB3 and PyTorch; everything here is pickled by
reference into the workers, which must not pay for importing PyTorch.

Each env is wrapped in :class:`SB3Shim`, outermost, whose only job is to carry
SB3's per-env info dicts through the manager untouched. The manager merges infos
into Gymnasium's vector dict (one array per key), which would turn ``1.0`` into
``np.float64(1.0)`` and nested dicts into dicts of arrays. So the shim splits each
info: a number (what an info column holds: MuJoCo's every key) travels under a key
that names its exact type (:func:`numeric_key`), so every value of that key is of
one type and comes back as such (:func:`decode`); the rest travels as one dict in an
:class:`Opaque` holder, stored in an object array as is. The parent gets back
exactly what the env returned, and a MuJoCo step pickles nothing. Everything else
(episode ends, the reset in the same step, ``final_obs``) is the manager's own
``SameStep`` autoreset.

The functions at the bottom run against the user's env (the shim's inner env),
as ``SubprocVecEnv``'s worker does, for ``get_attr``, ``env_method`` and friends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

__all__ = ["INFO_KEY", "NUMERIC_PREFIX", "Opaque", "SB3Shim", "ShimFactory", "decode", "pack"]

#: Key of the packed info (step or reset) in the manager's vector infos, and of the
#: per-env reset options in the options the manager passes to every env.
INFO_KEY = "envmgr_sb3"
#: Keys of numeric values: ``NUMERIC_PREFIX + "<type>:" + the env's key``.
NUMERIC_PREFIX = INFO_KEY + ":"
_INT64 = range(-(2**63), 2**63)


class Opaque:
    """A value Gymnasium's vector-info merge stores as an object, without looking inside."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[type[Opaque], tuple[Any]]:
        return Opaque, (self.value,)


def numeric_key(key: Any, value: Any) -> str | None:
    """The key ``value`` travels under as a number of its exact type, or ``None``."""
    if not isinstance(key, str):
        return None
    kind = type(value)
    if kind is float or kind is bool or (kind is int and value in _INT64):
        return f"{NUMERIC_PREFIX}py-{kind.__name__}:{key}"
    if isinstance(value, np.number):
        return f"{NUMERIC_PREFIX}np-{value.dtype.str}:{key}"
    if kind is np.ndarray and value.dtype.kind in "biufc":
        return f"{NUMERIC_PREFIX}arr-{value.dtype.str}{value.shape}:{key}"
    return None


def pack(info: dict[str, Any]) -> dict[str, Any]:
    """An env's info as the shim hands it on: numbers by type, the rest opaque."""
    out: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in info.items():
        name = numeric_key(key, value)
        if name is None:
            rest[key] = value
        else:
            out[name] = value
    if rest:
        out[INFO_KEY] = Opaque(rest)
    return out


def decode(vinfos: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Return each env's info dict, as its env returned it, from the manager's vector infos.

    Only envs that have one are in the result.

    Runs every step of an SB3 rollout: each key's values are taken out of their array
    at once (``tolist`` gives Python scalars, iterating gives numpy ones), not one
    indexing at a time.
    """
    out: dict[int, dict[str, Any]] = {}
    packed = vinfos.get(INFO_KEY)
    if packed is not None:
        for i in np.flatnonzero(vinfos[f"_{INFO_KEY}"]).tolist():
            out[i] = packed[i].value
    for name, values in vinfos.items():
        if not name.startswith(NUMERIC_PREFIX):
            continue
        kind, key = _kind_and_key(name)
        mask = vinfos[f"_{name}"].tolist()
        envs = range(len(mask)) if all(mask) else [i for i, has in enumerate(mask) if has]
        if kind.startswith("py-"):
            items = values.tolist()  # every value of this key was a Python scalar
        elif kind.startswith("arr-"):
            items = {i: values[i].copy() for i in envs}  # not views of one array
        else:
            items = list(values)
        for i in envs:
            info = out.get(i)
            if info is None:
                out[i] = info = {}
            info[key] = items[i]
    return out


@functools.lru_cache(maxsize=1024)
def _kind_and_key(name: str) -> tuple[str, str]:
    """``(type, the env's key)`` of a numeric key (see :func:`numeric_key`)."""
    kind, key = name[len(NUMERIC_PREFIX) :].split(":", 1)
    return kind, key


class SB3Shim(gym.Wrapper):  # type: ignore[type-arg]
    """Wraps one user env in a worker: packs its infos, picks its own reset options.

    Args:
        env: The env the user's factory built.
        index: Its global env index (which entry of per-env reset options is its own).
    """

    def __init__(self, env: gym.Env[Any, Any], index: int) -> None:
        super().__init__(env)
        self._envmgr_index = index

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step the env, packing its info: numbers by type, the rest opaque."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        # An empty info stays empty, so a plain CartPole step still pickles nothing.
        return obs, reward, terminated, truncated, (pack(info) if info else {})

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the env with its own entry of per-env reset options, packing its info."""
        if options is not None and INFO_KEY in options:
            options = options[INFO_KEY][self._envmgr_index]
        # As SubprocVecEnv's worker: options are passed only when there are some.
        extra = {"options": options} if options else {}
        obs, info = self.env.reset(seed=seed, **extra)
        return obs, (pack(info) if info else {})


class ShimFactory:
    """The factory the workers call: the user's factory, then :class:`SB3Shim` around it.

    Args:
        env_fn: The user's zero-argument factory.
        index: Global index of the env it builds.
    """

    def __init__(self, env_fn: Callable[[], Any], index: int) -> None:
        self.env_fn = env_fn
        self.index = index

    def __call__(self) -> SB3Shim:
        """Build the env (patching an old gym env as SB3 does) and wrap it in ``SB3Shim``."""
        env = self.env_fn()
        if not isinstance(env, gym.Env):
            # An old gym env: SB3 converts it with shimmy, as SubprocVecEnv's worker
            # does. Imported only here, since it pulls in SB3 (and PyTorch).
            from stable_baselines3.common.vec_env.patch_gym import _patch_env

            env = _patch_env(env)
        return SB3Shim(env, self.index)


# ---------------------------------------------------------------- per-env requests
# Each takes the shim (what the manager hands to applied functions) and acts on the
# user's env inside it, exactly as SubprocVecEnv's worker acts on its env.


def on_user_env(shim: SB3Shim, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(user env, *args)``: the shim stays invisible to every request."""
    return fn(shim.env, *args)


def get_attr(env: gym.Env[Any, Any], name: str) -> Any:
    return env.get_wrapper_attr(name)


def has_attr(env: gym.Env[Any, Any], name: str) -> bool:
    try:
        env.get_wrapper_attr(name)
    except AttributeError:
        return False
    return True


def set_attr(env: gym.Env[Any, Any], name: str, value: Any) -> None:
    # Plain setattr on the outermost user env, as SubprocVecEnv (not set_wrapper_attr).
    setattr(env, name, value)


def env_method(
    env: gym.Env[Any, Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return env.get_wrapper_attr(name)(*args, **kwargs)


def class_ref(cls: type) -> str | bytes:
    """What :func:`is_wrapped` is sent for ``cls``: its import path, if it has one.

    Sending the class would make each worker import its module to unpickle it, and
    SB3's ``Monitor`` (what SB3 asks about) imports PyTorch with it: seconds and
    hundreds of MB per worker. An env wrapped in the class has it imported already;
    one that is not needs no import to say so. A class without an import path (made
    in ``__main__`` or in a function) travels by value with cloudpickle, which hands a
    worker the very class the env factories brought it.
    """
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        return cloudpickle.dumps(cls)
    return _path(cls)


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_wrapped(env: gym.Env[Any, Any], wrapper: str | bytes) -> bool:
    """Whether the class ``wrapper`` names (:func:`class_ref`) is in the env's wrapper chain.

    As SB3's ``is_wrapped``, but by path: a wrapper whose class or one of its bases has that
    path; a virtual subclass registered with an ABC is not seen.
    """
    cls = cloudpickle.loads(wrapper) if isinstance(wrapper, bytes) else None
    current: Any = env
    while isinstance(current, gym.Wrapper):
        if cls is not None:
            if isinstance(current, cls):
                return True
        elif any(_path(c) == wrapper for c in type(current).__mro__):
            return True
        current = current.env
    return False


def render(env: gym.Env[Any, Any]) -> Any:
    return env.render()
