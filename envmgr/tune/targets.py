"""What ``envmgr tune`` measures: a registered Gymnasium env, or a PettingZoo ``ParallelEnv``.

A target knows everything that differs between the two; the rounds, the ceiling's
processes, the table and the reading of the timers are the same for both::

    tune("CartPole-v1")                    tune("mpe2.simple_spread_v3:parallel_env", parallel=True)
      EnvIdTarget                            ParallelEnvTarget
        build:   envmgr.make(id, n, ...)       envmgr.make_parallel(env_fn, n, ...)
        ceiling: SingleBlock (+ VectorBlock)   AgentBlock (SerialAgentRows)
        call:    'envmgr.make("id", ...)'      'envmgr.make_parallel(module.factory, ...)'
        rows:    one per env                   one per env and agent slot
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector.utils import batch_space

from envmgr.envside.agent_layout import AgentLayout, describe_agents
from envmgr.managers.make import (
    SpecEnvFactory,
    SpecVectorEnvFactory,
    check_env_kwargs,
    make,
    resolve_spec,
)
from envmgr.managers.parallel import make_parallel
from envmgr.tune.ceiling import SingleBlock, VectorBlock
from envmgr.tune.layouts import Layout, call_text, python_literal
from envmgr.tune.serial_agents import AgentBlock

__all__ = ["EnvIdTarget", "ParallelEnvTarget", "import_factory"]

#: The name a factory without an importable one gets in the printed call.
PLACEHOLDER = "env_fn"


class EnvIdTarget:
    """A registered Gymnasium env id (or its spec), built with :func:`envmgr.make`.

    Args:
        env_id: The id (``"package:Id-v0"`` imports the package first) or its ``EnvSpec``.
        env_kwargs: Keyword arguments for every env, as ``envmgr.make`` passes them.

    Raises:
        gymnasium.error.Error: If the id is not registered.
        TypeError: If ``env_kwargs`` holds a manager option.
    """

    #: Agent rows per env: ``None``, a single-agent env.
    agent_slots: int | None = None
    #: Lines to run before the printed call.
    imports: tuple[str, ...] = ()
    first_ready = True

    def __init__(self, env_id: str | EnvSpec, env_kwargs: Mapping[str, Any] | None = None) -> None:
        self.spec = resolve_spec(env_id)
        self.env_kwargs = dict(env_kwargs or {})
        check_env_kwargs(self.spec, self.env_kwargs)  # in the parent, not in a process
        # The id as given ("ale_py:ALE/Pong-v5" imports what registers it) names it in the
        # call printed to copy, which must work in a fresh script too.
        self.name = env_id if isinstance(env_id, str) else self.spec.id
        self.has_vector_entry_point = self.spec.vector_entry_point is not None

    def block(self) -> Callable[[int, int], Any]:
        """What one ceiling process steps: single envs."""
        return partial(SingleBlock, SpecEnvFactory(self.spec, self.env_kwargs, ()))

    def vector_block(self) -> Callable[[int, int], Any]:
        """What one ceiling process of the hosted layouts steps: the vector entry point's env."""
        factory = SpecVectorEnvFactory(self.spec, "vector_entry_point", self.env_kwargs, ())
        return partial(VectorBlock, factory)

    def build(self, layout: Layout, num_envs: int) -> Any:
        """The layout's envs."""
        return make(self.spec, num_envs, **layout.make_kwargs(), **self.env_kwargs)

    def call(self, layout: Layout, num_envs: int) -> str:
        """The ``envmgr.make(...)`` line that builds the layout."""
        return layout.call(self.name, num_envs, self.env_kwargs)

    def action_space(self, envs: Any) -> gym.Space[Any]:
        """The space of one batch of actions."""
        return envs.action_space  # type: ignore[no-any-return]

    def manager(self, envs: Any) -> Any:
        """The manager under the envs."""
        return envs

    def rows_of(self, env_ids: np.ndarray) -> np.ndarray:
        """The action rows of the envs ``env_ids``."""
        return env_ids

    def step_infos(self, infos: dict[str, Any]) -> dict[str, Any]:
        """A step's infos, one level: key -> batch."""
        return infos


class ParallelEnvTarget:
    """A factory of PettingZoo ``ParallelEnv`` envs, built with :func:`envmgr.make_parallel`.

    One env is built here and closed, to check it and read its agents.

    Args:
        env: ``"module:factory"`` (imported here), or the factory itself.
        env_kwargs: Keyword arguments for the factory (``None``: it is called without).

    Raises:
        ValueError: ``env`` is not of the form ``module:factory``, names nothing, or builds
            something that is not a ``ParallelEnv`` with ``possible_agents``.
        ImportError: Its module cannot be imported.
        TypeError: The factory is not callable.
    """

    has_vector_entry_point = False

    def __init__(self, env: str | Callable[..., Any], env_kwargs: Mapping[str, Any] | None) -> None:
        self.env_kwargs = dict(env_kwargs or {})
        factory, self.name, expression, module = import_factory(env)
        self.imports: tuple[str, ...] = (f"import {module}",) if module else ()
        self.env_fn = partial(factory, **self.env_kwargs) if self.env_kwargs else factory
        if self.env_kwargs:
            arguments = ", ".join(f"{k}={python_literal(v)}" for k, v in self.env_kwargs.items())
            expression = f"lambda: {expression}({arguments})"
        self.expression = expression
        self.agent_layout = _probe(self.env_fn, self.name)
        self.agent_slots = sum(len(g.slots) for g in self.agent_layout.groups)
        # send/recv is offered for one group, the VectorEnv of rows.
        self.first_ready = len(self.agent_layout.groups) == 1

    def block(self) -> Callable[[int, int], Any]:
        """What one ceiling process steps: the envs packed into agent rows."""
        return partial(AgentBlock, self.env_fn)

    def vector_block(self) -> None:
        """No vector entry point."""
        return None

    def build(self, layout: Layout, num_envs: int) -> Any:
        """The layout's envs."""
        return make_parallel(self.env_fn, num_envs, **layout.make_parallel_kwargs())

    def call(self, layout: Layout, num_envs: int) -> str:
        """The ``envmgr.make_parallel(...)`` line that builds the layout."""
        return call_text(
            "envmgr.make_parallel", self.expression, num_envs, layout.make_parallel_kwargs()
        )

    def action_space(self, envs: Any) -> gym.Space[Any]:
        """The space of one batch of actions: the rows', or a dict of each group's rows."""
        if self.first_ready:
            return envs.action_space  # type: ignore[no-any-return]
        return gym.spaces.Dict(
            {g: batch_space(envs.single_action_spaces[g], envs.num_envs[g]) for g in envs.num_envs}
        )

    def manager(self, envs: Any) -> Any:
        """The manager under the agent rows."""
        return envs.manager

    def rows_of(self, env_ids: np.ndarray) -> np.ndarray:
        """The agent rows of the envs ``env_ids`` (one group): ``e * S + s`` for each."""
        slots = self.agent_slots
        return (np.asarray(env_ids)[:, None] * slots + np.arange(slots)).reshape(-1)

    def step_infos(self, infos: dict[str, Any]) -> dict[str, Any]:
        """A step's infos, one level: ``group/key`` -> batch where there are several groups."""
        if self.first_ready:
            return infos
        return {f"{g}/{k}": v for g, by_key in infos.items() for k, v in by_key.items()}


def import_factory(env: str | Callable[..., Any]) -> tuple[Callable[..., Any], str, str, str]:
    """The factory ``env`` names, its name, the expression and the module that reach it.

    ``"mpe2.simple_spread_v3:parallel_env"`` gives the function, that text,
    ``"mpe2.simple_spread_v3.parallel_env"`` and ``"mpe2.simple_spread_v3"``. A callable
    given itself is named by its module and qualified name when importing them gives it
    back; otherwise the expression is ``env_fn`` and the module empty.

    Raises:
        ValueError: ``env`` is not ``module:attribute``, or the module has no such attribute.
        ImportError: The module cannot be imported.
        TypeError: What it names is not callable.
    """
    if not isinstance(env, str):
        if not callable(env):
            raise TypeError(f"a ParallelEnv factory must be callable, got {env!r}")
        module = getattr(env, "__module__", None) or ""
        qualname = getattr(env, "__qualname__", None) or ""
        if module and module != "__main__" and "<" not in qualname:
            try:
                if _attribute(importlib.import_module(module), qualname) is env:
                    return env, f"{module}:{qualname}", f"{module}.{qualname}", module
            except (ImportError, AttributeError):
                pass
        return env, getattr(env, "__name__", repr(env)), PLACEHOLDER, ""
    module, colon, attribute = env.partition(":")
    if not (module and colon and attribute):
        raise ValueError(
            f"{env}: give a ParallelEnv factory as module:factory, such as "
            "mpe2.simple_spread_v3:parallel_env"
        )
    factory = _attribute(importlib.import_module(module), attribute, env)
    if not callable(factory):
        raise TypeError(f"{env}: {attribute} is {type(factory).__name__}, not a factory")
    return factory, env, f"{module}.{attribute}", module


def _attribute(module: Any, dotted: str, where: str | None = None) -> Any:
    value = module
    for part in dotted.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            if where is None:
                raise
            raise ValueError(
                f"{where}: module {module.__name__} has no attribute {dotted}"
            ) from None
    return value


def _probe(env_fn: Callable[[], Any], name: str) -> AgentLayout:
    """The slots and groups of one env built here, checked and closed.

    Raises:
        ValueError: The factory raised, or built no ``ParallelEnv`` with ``possible_agents``.
    """
    try:
        env = env_fn()
    except Exception as exc:
        raise ValueError(
            f"{name}: building one env raised {type(exc).__name__}: {exc}; envmgr tune calls "
            "the factory without arguments"
        ) from exc
    try:
        kind = type(env).__name__
        if isinstance(env, gym.Env):
            raise ValueError(
                f"{name} built {kind}, a Gymnasium env, not a PettingZoo ParallelEnv: tune its "
                "registered id without --parallel"
            )
        if hasattr(env, "agent_selection") or hasattr(env, "last"):
            raise ValueError(
                f"{name} built {kind}, a PettingZoo AEC env: tune a factory that wraps it with "
                "pettingzoo.utils.conversions.aec_to_parallel (turn_based_aec_to_parallel for "
                "turn-based games)"
            )
        missing = [m for m in ("reset", "step", "observation_space", "action_space")
                   if not callable(getattr(env, m, None))]  # fmt: skip
        if missing:
            raise ValueError(
                f"{name} built {kind}, not a PettingZoo ParallelEnv (no {', '.join(missing)})"
            )
        if not getattr(env, "possible_agents", None):
            raise ValueError(
                f"{name} built {kind}, which has no possible_agents: envmgr tune sizes the "
                "agent rows of the layouts and the ceiling from them"
            )
        return describe_agents(env)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
