"""One env's step written into its agent rows with a few numpy calls per group.

:class:`~envmgr.envside.agent_rows.ParallelEnvRows` packs each agent's value into its
slot. For the common case (fixed slots, one array per agent's observation, values that
fit) this module packs a whole group at once, so the Python work per agent is a few
C-level iterations rather than a dozen statements::

    obs, rewards, terminations, truncations    (dicts keyed by agent, one env)
          |  agents in the dicts' order -> slots (one comprehension)
          |  which rows to write: live, or ended on this step (numpy masks)
          v
    group g, env k:  obs[k, :m] = stack(values)     slots 0..m-1 in order: one copy
                     obs[k, slots] = stack(values)  otherwise, the other rows zeroed
                     fields[k, slots] = ...         one assignment per field

Anything else (an agent without a slot, a space that changed, a value of the wrong
shape or dtype, a padded value) returns ``None`` and the caller takes the general path,
which writes the same rows or names what is wrong. ``tests/unit/envside/test_agent_pack.py``
holds the two paths to the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress
from operator import attrgetter, is_
from typing import Any

import numpy as np

from envmgr.envside.agent_layout import AgentLayout

__all__ = [
    "GroupRows",
    "StepWrite",
    "write_step_rows",
]

_shape = attrgetter("shape")
#: Whether env k's episode ended, and the agents whose rows were written, in order.
StepWrite = tuple[bool, list[str]]


class GroupRows:
    """One group's arrays over the envs: its observations and its per-slot fields.

    Attributes:
        obs: ``[envs, slots, *obs shape]``.
        fields: ``rewards``, ``terminations``, ``truncations``, ``active``: ``[envs, slots]``.
        shape: One agent's observation shape.
    """

    def __init__(self, obs: np.ndarray, fields: Sequence[np.ndarray]) -> None:
        self.obs = obs
        self.fields = list(fields)
        self.shape = obs.shape[2:]

    def clear(self, k: int) -> None:
        """Env ``k`` has no agent of this group on this step."""
        self.obs[k] = 0
        for f in self.fields:
            f[k] = 0

    def write(
        self,
        k: int,
        slots: list[int],
        values: list[Any],
        columns: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> bool:
        """Write env ``k``'s rows ``slots``; ``False`` if a value does not fit.

        ``columns`` are the rows' rewards, terminations and truncations. After ``False``
        the caller rewrites all of env ``k``'s rows the general way.
        """
        m = len(slots)
        obs = self.obs[k]
        in_order = slots[-1] == m - 1 and slots == list(range(m))
        try:
            if in_order and self.shape and obs.flags.c_contiguous:
                # One C-level copy: the agents' arrays laid end to end along axis 0.
                if set(map(_shape, values)) != {self.shape}:
                    return False
                np.concatenate(
                    values, out=obs[:m].reshape(-1, *self.shape[1:]), casting="same_kind"
                )
            elif in_order:
                np.stack(values, out=obs[:m], casting="same_kind")
            else:
                stacked = np.stack(values)
                if stacked.shape[1:] != self.shape or not np.can_cast(
                    stacked.dtype, obs.dtype, "same_kind"
                ):
                    return False
        except (ValueError, TypeError, AttributeError):
            return False
        if in_order:
            index: Any = slice(0, m)
            free: Any = slice(m, None) if m < len(obs) else None
        else:
            obs[slots] = stacked
            index = slots
            free = np.ones(len(obs), np.bool_)
            free[slots] = False
        if free is not None:
            obs[free] = 0
        for f, column in zip(self.fields, (*columns, 1), strict=True):
            f[k, index] = column
            if free is not None:
                f[k, free] = 0
        return True


def write_step_rows(
    k: int,
    groups: Sequence[GroupRows],
    layout: AgentLayout,
    live: Sequence[str],
    observation_space: Callable[[str], Any],
    accepted: dict[str, Any],
    step: tuple[dict[str, Any], ...],
    done_on: str,
) -> StepWrite | None:
    """Write env ``k``'s step ``(obs, rewards, terminations, truncations)`` into ``groups``.

    Args:
        k: The env's index in the arrays.
        groups: Each group's arrays, in the layout's order.
        layout: The fixed slots (not given on first sight).
        live: The env's agents after the step (``env.agents``).
        observation_space: The env's ``observation_space(agent)``.
        accepted: The observation space last accepted per agent; a space not in it sends
            the step to the general path, which checks it.
        step: The step's dicts.
        done_on: ``"all"`` or ``"any"``.

    Returns:
        Whether the episode ended and whose rows were written, or ``None`` where the
        general path must write this step (nothing is then half-written that it does
        not overwrite).
    """
    obs, rew, term, trunc = step
    agents = list(obs)
    live_set = set(live)
    if not live_set <= obs.keys():
        return None
    slot_of = layout.slot_of
    try:
        where = [slot_of[a] for a in agents]
    except KeyError:
        return None
    if not all(map(is_, map(observation_space, agents), map(accepted.get, agents))):
        return None
    n = len(agents)
    try:
        terms = np.fromiter(_in_order(term, agents, False), np.bool_, n)
        truncs = np.fromiter(_in_order(trunc, agents, False), np.bool_, n)
        rewards = np.fromiter(_in_order(rew, agents, 0.0), np.float64, n)
    except (TypeError, ValueError):
        return None
    values = list(obs.values())
    if live and len(live_set) == n and not (terms.any() or truncs.any()):
        # Everyone observed is alive and going on (the usual step): every row is written.
        ended = False
        keep: Any = None
    else:
        done = terms | truncs
        keep = done | np.fromiter(map(live_set.__contains__, agents), np.bool_, n)
        ended = not live or (done_on == "any" and bool(done.any()))
        if ended and done_on == "any":
            truncs = truncs | ~terms
    if keep is not None and not keep.all():
        picked = keep.tolist()
        agents = list(compress(agents, picked))
        values = list(compress(values, picked))
        where = list(compress(where, picked))
        terms, truncs, rewards = terms[keep], truncs[keep], rewards[keep]
    if len(groups) == 1:
        rows = groups[0]
        if not agents:
            rows.clear(k)
        elif not rows.write(k, [s for _, s in where], values, (rewards, terms, truncs)):
            return None
        return ended, agents
    of_group = np.fromiter((g for g, _ in where), np.intp, len(where))
    for g, rows in enumerate(groups):
        mine = (of_group == g).tolist()
        slots = [s for (_, s), m in zip(where, mine, strict=True) if m]
        if not slots:
            rows.clear(k)
            continue
        picked = np.asarray(mine)
        if not rows.write(
            k,
            slots,
            list(compress(values, mine)),
            (rewards[picked], terms[picked], truncs[picked]),
        ):
            return None
    return ended, agents


def _in_order(values: dict[str, Any], agents: list[str], default: Any) -> Any:
    """``values[a]`` for each agent (``default`` if absent), without a lookup when in order."""
    if len(values) == len(agents) and list(values) == agents:
        return values.values()
    return (values.get(a, default) for a in agents)
