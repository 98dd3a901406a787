"""What ``envmgr tune`` found: each layout's samples, the winner, and the printout."""

from __future__ import annotations

import dataclasses
import statistics
import textwrap
from collections.abc import Sequence
from typing import Any

from envmgr.tune.diagnose import Reading
from envmgr.tune.layouts import Layout

__all__ = ["Measurement", "TuneResult", "fastest", "format_result"]


@dataclasses.dataclass
class Measurement:
    """One layout's samples, its ratios to the ceiling of the same round, and its timers.

    Attributes:
        layout: The layout measured.
        label: Its name in the table.
        call: The ``envmgr.make(...)`` line that builds it.
        rates: Env-steps per second, one per round.
        ratios: ``rates[r]`` over the ceiling's rate in round ``r``.
        reading: What its timer tree says (the parent's wait, each worker's time).
        findings: What stands out in that tree, one sentence each.
    """

    layout: Layout
    label: str
    call: str
    rates: list[float]
    ratios: list[float]
    reading: Reading | None = None
    findings: list[str] = dataclasses.field(default_factory=list)

    @property
    def rate(self) -> float:
        """Median env-steps per second over the rounds."""
        return statistics.median(self.rates)

    @property
    def ratio(self) -> float:
        """Median share of the ceiling over the rounds."""
        return statistics.median(self.ratios)


@dataclasses.dataclass
class TuneResult:
    """What :func:`tune` measured and what it recommends.

    Attributes:
        env_id: The env measured.
        num_envs: Envs in every layout.
        cores: Cores this process could use (one ceiling process each).
        rounds: Interleaved rounds; every figure is a median over them.
        sample_seconds: Stepping time of one layout in one round.
        ceiling: The ceiling's env-steps per second, per round (single envs).
        vector_ceiling: The same for the id's batched env, when hosted layouts were measured.
        measurements: Every layout measured, in table order.
        best: The fastest layout (highest median rate).
        why: Why it wins, read from the timers: sentences with their numbers.
        tree: The merged timer tree of the measured runs (one node per layout).
        load: The 1-minute load average when the rounds ended (``None`` where unknown):
            other processes competing for the cores move every figure.
        skipped: Layouts that apply but could not be measured here, with the reason.
        agent_slots: Agent rows per env of a PettingZoo env (``None``: a single-agent env);
            its agent-steps per second are the env-steps times these.
        imports: Lines to run before :attr:`call` (the factory's module).
    """

    env_id: str
    num_envs: int
    cores: int
    rounds: int
    sample_seconds: float
    ceiling: list[float]
    vector_ceiling: list[float] | None
    measurements: list[Measurement]
    best: Measurement
    why: list[str]
    tree: dict[str, Any]
    load: float | None = None
    skipped: list[str] = dataclasses.field(default_factory=list)
    agent_slots: int | None = None
    imports: list[str] = dataclasses.field(default_factory=list)

    @property
    def call(self) -> str:
        """The constructor call of the winning layout, to copy."""
        return self.best.call

    def format(self) -> str:
        """The table, the call to copy and why it wins, as printed by ``envmgr tune``."""
        return format_result(self)

    def __str__(self) -> str:
        return self.format()


def fastest(measurements: Sequence[Measurement]) -> Measurement:
    """The layout to recommend: the highest median rate over the rounds.

    The default layout or not; the first measured among equal medians.

    Raises:
        ValueError: ``measurements`` is empty.
    """
    if not measurements:
        raise ValueError("no layout was measured")
    return max(measurements, key=lambda m: m.rate)


#: A runner-up this close to the winner (or within the winner's spread over the rounds)
#: is called a tie.
_TIE = 0.05
#: A ratio above this says the ceiling was not one: the machine is shared.
_ABOVE_CEILING = 1.05
_WIDTH = 100


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else ""


def _row(
    label: str, rates: tuple[float, ...], ratio: str, spread: str = "", mark: str = " "
) -> str:
    figures = "".join(f" {rate:>13,.0f}" for rate in rates)
    return f"{mark} {label:<34}{figures} {ratio:>9} {spread:>11}"


def _bullet(text: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent="  - ", subsequent_indent="    ")


def format_result(result: TuneResult) -> str:
    """Renders a :class:`TuneResult` as ``envmgr tune`` prints it."""
    r = result
    processes = max(1, min(r.num_envs, r.cores))
    slots = r.agent_slots

    def rates(rate: float) -> tuple[float, ...]:
        return (rate,) if slots is None else (rate, rate * slots)

    if slots is None:
        what, columns = f"{r.env_id}: {r.num_envs} envs", f"{'env-steps/s':>13}"
    else:
        what = f"--parallel {r.env_id}: {r.num_envs} envs x {slots} agent rows"
        columns = f"{'env-steps/s':>13} {'agent-steps/s':>13}"
    ceiling = statistics.median(r.ceiling)
    lines = [
        f"envmgr tune {what} on {r.cores} cores; {r.rounds} "
        f"interleaved round(s) of {r.sample_seconds:.2f} s per layout, medians",
        "",
        f"  {'layout':<34} {columns} {'/ ceiling':>9} {'per round':>11}",
        _row(f"ceiling ({processes} processes, no hand-off)", rates(ceiling), "1.00"),
    ]
    if r.vector_ceiling is not None:
        vc = statistics.median(r.vector_ceiling)
        lines.append(_row("ceiling, batched envs", rates(vc), f"{vc / ceiling:.2f}"))
    for m in r.measurements:
        label = m.label + (" (default)" if m.layout.default else "")
        mark = "*" if m is r.best else " "
        lines.append(_row(label, rates(m.rate), f"{m.ratio:.2f}", _spread(m.ratios), mark))
    share = "the envs" if slots is None else "the envs, packing their agents' dicts into rows"
    notes = [
        "* fastest. / ceiling: the layout's rate over the ceiling's in the same round; "
        f"ceiling: one process per core stepping its share of {share}, no communication."
    ]
    if slots is not None:
        notes.append(f"Agent-steps: rows stepped, {slots} per env, empty rows included.")
    if r.vector_ceiling is not None:
        notes.append("Hosted layouts and the batched ceiling run the id's vector entry point.")
    notes += [f"Not measured: {what}." for what in r.skipped]
    if r.load is not None:
        notes.append(f"Load average {r.load:.2f} on {r.cores} cores while measuring.")
    if any(m.ratio > _ABOVE_CEILING for m in r.measurements):
        notes.append(
            "Above 1.00: other processes took part of the cores, and the ceiling's busy loops "
            "lost more to them than envmgr's workers, which sleep and wake; rerun on a quieter "
            "machine for figures that transfer."
        )
    lines += textwrap.wrap(" ".join(notes), _WIDTH, initial_indent="", subsequent_indent="  ")
    lines += ["", "Use:", *(f"    {line}" for line in r.imports), f"    {r.call}"]
    layout = r.best.layout
    usage = layout.usage(-(-(r.num_envs - layout.caller_envs) // layout.n_workers))
    if usage:
        lines += textwrap.wrap(
            f"({usage})", _WIDTH, initial_indent="    ", subsequent_indent="     "
        )
    lines += ["", "Why:"]
    for line in _why(r):
        lines += _bullet(line)
    shown = [m for m in r.measurements if m.layout.default or m is r.best]
    noted = [(m, finding) for m in shown for finding in m.findings]
    if noted:
        lines.append("From the timers, per batch over the measured runs:")
        for m, finding in noted:
            lines += _bullet(f"{m.label}: {finding}")
    return "\n".join(lines)


def _why(r: TuneResult) -> list[str]:
    best = r.best
    default = next(m for m in r.measurements if m.layout.default)
    out = []
    rate = f"{best.rate:,.0f} env-steps/s"
    if r.agent_slots is not None:
        rate += f" ({best.rate * r.agent_slots:,.0f} agent-steps/s)"
    if best is default:
        out.append(
            f"the default layout is the fastest here: {rate}, {best.ratio:.2f} of the ceiling"
        )
    else:
        out.append(
            f"{best.label} ran {rate}, {best.ratio:.2f} of the ceiling: "
            f"{best.rate / default.rate:.2f}x the default layout ({default.label}, "
            f"{default.rate:,.0f}, {default.ratio:.2f})"
        )
    out += r.why
    runner_up = _runner_up(r.measurements, best)
    if runner_up is not None:
        tie = max(_TIE, _relative_spread(best))
        if runner_up.rate >= best.rate * (1.0 - tie):
            out.append(
                f"{runner_up.label} is within {100 * tie:.0f}% ({runner_up.rate:,.0f}): the "
                "rounds cannot tell them apart; either will do"
            )
        else:
            out.append(
                f"the next best, {runner_up.label}, ran {runner_up.rate / best.rate:.2f}x as fast"
            )
    return out


def _runner_up(measurements: list[Measurement], best: Measurement) -> Measurement | None:
    others = [m for m in measurements if m is not best]
    return max(others, key=lambda m: m.rate) if others else None


def _relative_spread(m: Measurement) -> float:
    """Half the range of the per-round ratios, relative to their median."""
    if len(m.ratios) < 2 or m.ratio <= 0:
        return 0.0
    return (max(m.ratios) - min(m.ratios)) / (2 * m.ratio)
