"""The layouts ``envmgr tune`` measures, how each is built, and how each is stepped.

A layout is one way of spreading ``num_envs`` envs over this machine's cores: how many
worker processes, whether the caller steps a block itself (``caller_envs``), whether each
worker hosts the id's batched env (``vectorization_mode="vector_entry_point"``), and whether
the loop steps the whole batch (``step``) or each worker as soon as it is ready
(``send``/``recv``, first-ready). Each layout knows the keyword arguments of
``envmgr.make`` and ``envmgr.make_parallel`` that build it, so the winner can be printed as a
line to copy; a target (:mod:`envmgr.tune.targets`) builds it for a Gymnasium id or a
PettingZoo factory, and :class:`LayoutRunner` steps it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from time import perf_counter
from typing import Any, Protocol

import numpy as np

from envmgr.protocol.info_columns import HEADER_BYTES, ROW_BYTES
from envmgr.protocol.trees import take_rows

__all__ = [
    "Layout",
    "LayoutRunner",
    "Target",
    "call_text",
    "candidate_layouts",
    "python_literal",
]

#: Action batches drawn once per layout and walked cyclically: sampling stays out of the timing.
N_ACTION_BATCHES = 64


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to run the envs.

    Attributes:
        n_workers: Worker processes.
        caller_envs: Envs the calling process steps itself (0: none).
        hosted: Each worker (and the caller's block) is one env from the id's vector entry
            point instead of single envs.
        first_ready: Stepped through ``send``/``recv``, one worker at a time, instead of
            ``step``.
        default: The layout ``envmgr.make(env_id, num_envs)`` gives without options.
    """

    n_workers: int
    caller_envs: int = 0
    hosted: bool = False
    first_ready: bool = False
    default: bool = False

    def label(self, num_envs: int) -> str:
        """Return a short name for the table.

        Such as ``step 2x4``, ``first-ready 2x4``, ``hosted 1x4 + caller 4`` (workers x envs per
        worker, then the caller's block).
        """
        kind = "hosted" if self.hosted else ("first-ready" if self.first_ready else "step")
        share = num_envs - self.caller_envs
        if share % self.n_workers == 0:
            shape = f"{self.n_workers}x{share // self.n_workers}"
        else:
            shape = f"{self.n_workers} workers, {share} envs"
        caller = f" + caller {self.caller_envs}" if self.caller_envs else ""
        return f"{kind} {shape}{caller}"

    def make_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``envmgr.make`` that build this layout (beyond the count)."""
        kwargs: dict[str, Any] = {"n_workers": self.n_workers}
        if self.hosted:
            kwargs["vectorization_mode"] = "vector_entry_point"
        if self.caller_envs:
            kwargs["vector_kwargs"] = {"caller_envs": self.caller_envs}
        return kwargs

    def make_parallel_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``envmgr.make_parallel`` that build this layout."""
        if self.hosted:
            raise ValueError("make_parallel hosts its envs' agent rows: no hosted layout")
        kwargs: dict[str, Any] = {"n_workers": self.n_workers}
        if self.caller_envs:
            kwargs["caller_envs"] = self.caller_envs
        return kwargs

    def call(self, env_id: str, num_envs: int, env_kwargs: Mapping[str, Any]) -> str:
        """The ``envmgr.make(...)`` line that builds this layout, to copy into a script."""
        kwargs = {**self.make_kwargs(), **env_kwargs}
        return call_text("envmgr.make", python_literal(env_id), num_envs, kwargs)

    def usage(self, largest: int) -> str:
        """How to step it, when that is not plain ``envs.step(actions)``."""
        if not self.first_ready:
            return ""
        return (
            "step it first-ready: envs.send(actions) once, then in the loop "
            f"obs, rew, term, trunc, info, ids = envs.recv(batch_size={largest}) and "
            "envs.send(actions_for_ids, ids)"
        )


def call_text(function: str, first: str, num_envs: int, kwargs: Mapping[str, Any]) -> str:
    """``function(first, num_envs=..., k=v, ...)``, the values written as Python literals."""
    parts = [
        first,
        f"num_envs={num_envs}",
        *(f"{k}={python_literal(v)}" for k, v in kwargs.items()),
    ]
    return f"{function}({', '.join(parts)})"


def python_literal(value: Any) -> str:
    """``repr``, but strings in double quotes, as a formatter would write the call."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items())
            + "}"
        )
    return repr(value)


def _fits_a_column(batch: Any) -> bool:
    """Whether a merged info value could have come through info columns.

    Numbers of one dtype whose per-env value fits a row can; strings and dicts merge into object
    arrays.
    """
    if not isinstance(batch, np.ndarray) or batch.dtype.kind not in "biufc" or not len(batch):
        return False
    return bool(batch[0].nbytes + 1 <= ROW_BYTES - HEADER_BYTES)


def candidate_layouts(
    num_envs: int, cores: int, has_vector_entry_point: bool, first_ready: bool = True
) -> list[Layout]:
    """The layouts worth measuring for ``num_envs`` envs on ``cores`` cores.

    One worker per core is ``envmgr.make``'s default; twice that many gives smaller blocks
    (more overlap, more wake-ups); half as many only where that still leaves two or more.
    First-ready and ``caller_envs`` are measured at one process per core, the ``caller_envs``
    layouts with one worker fewer (the caller takes a block of the same size), as in the
    README's performance table. Hosted layouts only where the id has a vector entry point;
    first-ready only where the envs offer ``send``/``recv`` (``first_ready``).
    """
    per_core = max(1, min(num_envs, cores))
    layouts = [Layout(per_core, default=True)]
    for n in (per_core // 2, per_core * 2):
        if 2 <= n <= num_envs and n != per_core:
            layouts.append(Layout(n))
    caller = num_envs // per_core
    if per_core >= 2:
        if first_ready:
            layouts.append(Layout(per_core, first_ready=True))
        layouts.append(Layout(per_core - 1, caller_envs=caller))
    if has_vector_entry_point:
        layouts.append(Layout(per_core, hosted=True))
        if per_core >= 2:
            layouts.append(Layout(per_core - 1, caller_envs=caller, hosted=True))
    return layouts


class Target(Protocol):
    """What :class:`LayoutRunner` needs of the envs it builds (:mod:`envmgr.tune.targets`)."""

    def build(self, layout: Layout, num_envs: int) -> Any:
        """The layout's envs."""

    def action_space(self, envs: Any) -> Any:
        """The space of one batch of actions."""

    def manager(self, envs: Any) -> Any:
        """The manager under the envs."""

    def rows_of(self, env_ids: np.ndarray) -> np.ndarray:
        """The action rows of the envs ``env_ids``."""

    def step_infos(self, infos: dict[str, Any]) -> dict[str, Any]:
        """A step's infos, one level: key -> batch."""


class LayoutRunner:
    """One built layout, stepped for a given time on pre-drawn actions.

    Args:
        layout: What to build.
        target: What to build it of (:mod:`envmgr.tune.targets`).
        num_envs: Envs in all.
        seed: Seeds the envs (``reset(seed=seed)``) and the action draws.
    """

    def __init__(
        self,
        layout: Layout,
        target: Target,
        num_envs: int,
        seed: int = 0,
    ) -> None:
        self.layout = layout
        self.target = target
        self.num_envs = num_envs
        self.envs = target.build(layout, num_envs)
        try:
            self.space = target.action_space(self.envs)
            self.space.seed(seed)
            self.actions = [self.space.sample() for _ in range(N_ACTION_BATCHES)]
            self.envs.reset(seed=seed)
            # One step to learn what infos this env returns and which of them pickle: the
            # timers can then tell an answer that carries them from one that only wakes
            # the parent.
            *_, infos = self.envs.step(self.actions[0])
        except BaseException:
            self.envs.close()
            raise
        infos = target.step_infos(infos)
        #: The keys of a step's infos, and those that travel pickled (no info column).
        self.info_keys = sorted(k for k in infos if not k.startswith("_"))
        self.pickled_keys = [k for k in self.info_keys if not _fits_a_column(infos[k])]
        self.largest = max(target.manager(self.envs).worker_sizes)
        self.cursor = 1
        #: Totals over every :meth:`run`: env steps, batches (``step`` calls or ``recv``
        #: calls) and wall seconds.
        self.env_steps = 0
        self.batches = 0
        self.seconds = 0.0

    def run(self, seconds: float) -> float:
        """Steps for about ``seconds``; returns env-steps per second over that time."""
        if self.layout.first_ready:
            steps, batches, elapsed = self._run_first_ready(seconds)
        else:
            steps, batches, elapsed = self._run_step(seconds)
        self.env_steps += steps
        self.batches += batches
        self.seconds += elapsed
        return steps / elapsed

    def _run_step(self, seconds: float) -> tuple[int, int, float]:
        envs, actions, m, k = self.envs, self.actions, len(self.actions), self.cursor
        batches = 0
        t0 = perf_counter()
        deadline = t0 + seconds
        while True:
            envs.step(actions[k % m])
            k += 1
            batches += 1
            now = perf_counter()
            if now >= deadline:
                break
        self.cursor = k
        return batches * self.num_envs, batches, now - t0

    def _run_first_ready(self, seconds: float) -> tuple[int, int, float]:
        # Every worker is sent its actions, then each one that finishes is sent its next;
        # at the deadline the workers still in flight are collected, so none is left busy
        # while the next layout is timed.
        envs, actions, m, k = self.envs, self.actions, len(self.actions), self.cursor
        space, size, rows_of = envs.single_action_space, self.largest, self.target.rows_of
        steps = batches = 0
        t0 = perf_counter()
        deadline = t0 + seconds
        envs.send(actions[k % m])
        pending = self.num_envs  # envs still to collect once the deadline has passed
        while True:
            *_, ids = envs.recv(batch_size=size)
            steps += len(ids)
            batches += 1
            if perf_counter() >= deadline:
                pending -= len(ids)
                if not pending:
                    break
                continue
            k += 1
            envs.send(take_rows(space, actions[k % m], rows_of(ids)), ids)
        self.cursor = k
        return steps, batches, perf_counter() - t0

    def close(self) -> None:
        """Stops the workers."""
        self.envs.close()
