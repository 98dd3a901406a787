"""``tune()``: measure every layout that applies here against the ceiling, and pick one.

The env is a target (:mod:`envmgr.tune.targets`): a Gymnasium id, or with ``parallel=True``
a PettingZoo ``ParallelEnv`` factory whose agents are batch rows.

Every layout (:func:`~envmgr.tune.layouts.candidate_layouts`) and the ceiling (one process
per core stepping its share with no communication; a second one of batched envs when hosted
layouts are measured) is built once and kept alive. Then, in each of ``rounds`` rounds, each
of them steps for the same short time, in an order that rotates from round to round, so a
burst of load on a shared machine lands on all of them alike. A layout's figure is its median
over the rounds; its ratio is the median of its rate over the ceiling's in the same round.

The layouts are stepped in a timer stack of their own (the caller's timers are untouched),
under one node per layout, so the merged tree of the measured runs says where each one's time
went (:mod:`envmgr.tune.diagnose`).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gymnasium.envs.registration import EnvSpec

from envmgr import timers
from envmgr.managers.local import default_start_method
from envmgr.protocol.layout import Layout as Split
from envmgr.tune.ceiling import Ceiling, TuneError
from envmgr.tune.diagnose import explain, findings, read_layout
from envmgr.tune.layouts import Layout, LayoutRunner, candidate_layouts
from envmgr.tune.result import Measurement, TuneResult, fastest
from envmgr.tune.targets import EnvIdTarget, ParallelEnvTarget

__all__ = ["tune", "usable_cores"]

#: Warm-up before the first round, as a share of one sample.
_WARM_UP = 0.2


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _rotate(items: list[Any], r: int) -> list[Any]:
    k = r % len(items)
    return items[k:] + items[:k]


def tune(
    env: str | EnvSpec | Callable[..., Any],
    num_envs: int = 8,
    seconds: float = 50.0,
    *,
    rounds: int = 3,
    env_kwargs: Mapping[str, Any] | None = None,
    parallel: bool = False,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Measures the layouts that apply to ``env`` on this machine and picks the fastest.

    Args:
        env: A registered env id (or its ``EnvSpec``), as for :func:`envmgr.make`; with
            ``parallel``, a PettingZoo ``ParallelEnv`` factory, as ``"module:factory"``
            (``"mpe2.simple_spread_v3:parallel_env"``) or the callable itself.
        num_envs: Envs in every layout.
        seconds: Stepping time in all, shared evenly by every layout and ceiling over the
            rounds; start-up (processes, envs) comes on top.
        rounds: Interleaved rounds (at least 1); figures are medians over them.
        env_kwargs: Keyword arguments for every env, as ``envmgr.make`` passes them; with
            ``parallel``, for the factory.
        parallel: Measure :func:`envmgr.make_parallel`'s layouts of ``env``'s agent rows,
            against a ceiling that packs the agents' dicts into rows as envmgr does.
        log: Called with a line of progress now and then (e.g. ``print``).

    Returns:
        The table's figures, the winner, its call and why it wins.

    Raises:
        gymnasium.error.Error: If ``env_id`` is not registered.
        ValueError: If ``num_envs``, ``seconds`` or ``rounds`` is out of range, or with
            ``parallel`` if ``env`` names nothing or builds no ``ParallelEnv``.
        ImportError: With ``parallel``, if the factory's module cannot be imported.
        TypeError: If ``env_kwargs`` holds a manager option (as ``envmgr.make`` refuses it).
        TuneError: If a ceiling process fails; envmgr's own errors if a layout does.
    """
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    target: EnvIdTarget | ParallelEnvTarget
    if parallel:
        target = ParallelEnvTarget(env, env_kwargs)  # type: ignore[arg-type]
    elif callable(env):
        raise TypeError(
            f"{env!r}: a callable is tuned as a PettingZoo ParallelEnv factory: pass "
            "parallel=True, or give a registered env id"
        )
    else:
        target = EnvIdTarget(env, env_kwargs)
    cores = usable_cores()
    run = _Run(target, num_envs, log or (lambda line: None))
    try:
        sizes = Split.split(num_envs, max(1, min(num_envs, cores))).sizes
        hosted = run.start_ceilings(sizes)
        layouts = candidate_layouts(num_envs, cores, hosted, target.first_ready)
        sample = seconds / (rounds * (len(layouts) + len(run.ceilings)))
        # A timer stack of our own: the caller's timers stay as they were, and the tree
        # holds nothing but the measured layouts, one node each.
        tree = timers.run_in_stack(timers.TimerStack(), run.measure, layouts, rounds, sample)
    finally:
        run.close_ceilings()
    return run.result(cores, rounds, sample, tree)


def _differ(single: tuple[Any, Any], batched: tuple[Any, Any]) -> str | None:
    """Why the vector entry point's envs are not the id's single envs, or ``None``."""
    for kind, one, other in zip(("observation", "action"), single, batched, strict=True):
        if one != other:
            return f"the vector entry point's {kind} space is {other}, the env's {one}"
    return None


class _Run:
    """The processes of one tuning run: the ceilings, the layouts, their rates per round."""

    def __init__(
        self,
        target: EnvIdTarget | ParallelEnvTarget,
        num_envs: int,
        say: Callable[[str], None],
    ) -> None:
        self.target, self.num_envs, self.say = target, num_envs, say
        self.ceilings: list[Ceiling] = []
        self.runners: list[LayoutRunner] = []
        self.rates: dict[object, list[float]] = {}
        self.skipped: list[str] = []

    def start_ceilings(self, sizes: Sequence[int]) -> bool:
        """Start a ceiling of the target's envs, and one of batched envs for a vector entry point.

        The batched one is started if the id has a vector entry point. Returns whether that one
        runs: if its envs cannot be built here (say, a library it needs is missing), the hosted
        layouts are left out, with the reason.
        """
        ctx = mp.get_context(default_start_method())
        target = self.target
        rows = f" ({target.agent_slots} agent rows each)" if target.agent_slots else ""
        self.say(
            f"starting the ceiling: {len(sizes)} processes, {self.num_envs} x {target.name}{rows}"
        )
        self.ceilings.append(Ceiling(ctx, target.block(), sizes))
        vector = target.vector_block() if target.has_vector_entry_point else None
        if vector is None:
            return False
        try:
            self.ceilings.append(Ceiling(ctx, vector, sizes))
            why = _differ(self.ceilings[0].spaces(), self.ceilings[1].spaces())
        except TuneError as exc:
            why = str(exc)
        if why is not None:
            # Such a layout would be faster at stepping other envs than the ones asked for:
            # ALE's vector entry point gives stacked 84x84 grey frames, its single env RGB.
            if len(self.ceilings) > 1:
                self.ceilings.pop().close()
            self.skipped.append(f"hosted layouts ({why})")
            self.say(f"not measuring {self.skipped[-1]}")
            return False
        return True

    def close_ceilings(self) -> None:
        for ceiling in self.ceilings:
            ceiling.close()

    def measure(self, layouts: list[Layout], rounds: int, sample: float) -> dict[str, Any]:
        """Build the layouts, step them in interleaved rounds, and return the timer tree.

        Each round is ``sample`` seconds long; the layouts are closed before returning (in the
        timer stack this runs in, so nothing of theirs lands in the caller's).
        """
        try:
            for layout in layouts:
                label = layout.label(self.num_envs)
                self.say(f"starting {label}")
                # Start-up and the first reset under a node of their own: the layout's own
                # node then holds its steps only.
                with timers.hierarchical_timer(label), timers.hierarchical_timer("start"):
                    self.runners.append(LayoutRunner(layout, self.target, self.num_envs))
            entries: list[object] = [*self.ceilings, *self.runners]
            self.rates = {e: [] for e in entries}
            # A warm-up (caches, allocators); it stays in the timers and in the runners'
            # totals alike, so their per-batch figures agree.
            for entry in entries:
                self._one(entry, _WARM_UP * sample)
            for r in range(rounds):
                self.say(f"round {r + 1} of {rounds}: {len(entries)} x {sample:.2f} s")
                for entry in _rotate(entries, r):
                    self.rates[entry].append(self._one(entry, sample))
            return timers.get_timer_tree()
        finally:
            for runner in self.runners:
                runner.close()

    def _one(self, entry: object, seconds: float) -> float:
        if isinstance(entry, Ceiling):
            return entry.run(seconds)
        assert isinstance(entry, LayoutRunner)
        with timers.hierarchical_timer(entry.layout.label(self.num_envs)):
            return entry.run(seconds)

    def result(self, cores: int, rounds: int, sample: float, tree: dict[str, Any]) -> TuneResult:
        """The table's figures, the readings of the tree, the winner and why."""
        ceiling = self.rates[self.ceilings[0]]
        vector = self.rates[self.ceilings[1]] if len(self.ceilings) > 1 else None
        nodes = tree.get("children") or {}
        target, n = self.target, self.num_envs
        measurements = []
        for runner in self.runners:
            layout = runner.layout
            label = layout.label(n)
            reading = read_layout(nodes.get(label) or {}, runner.batches, runner.seconds)
            rates = self.rates[runner]
            measurements.append(
                Measurement(
                    layout,
                    label,
                    target.call(layout, n),
                    rates,
                    [x / c for x, c in zip(rates, ceiling, strict=True)],
                    reading,
                    findings(layout, reading, cores, runner.pickled_keys),
                )
            )
        best = fastest(measurements)
        default = next(m for m in measurements if m.layout.default)
        readings = {m.layout: m.reading for m in measurements if m.reading is not None}
        why = explain(best.layout, default.layout, readings, n)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return TuneResult(
            target.name,
            n,
            cores,
            rounds,
            sample,
            ceiling,
            vector,
            measurements,
            best,
            why,
            tree,
            load,
            self.skipped,
            target.agent_slots,
            list(target.imports),
        )
