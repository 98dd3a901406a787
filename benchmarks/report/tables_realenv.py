"""The real-env tables (Pong, HalfCheetah, Humanoid) of README.md and docs/performance.md,
read from benchmarks/suites/realenv.py's JSON (benchmarks/results/record/realenv/realenv.json).

Registered with ``doc_tables.table``; see that module for the markers and the check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common.paths import RECORD
from benchmarks.report import repeats
from benchmarks.report.tables import load_json, markdown, public_command, rel, table
from benchmarks.report.text import fmt_rate

REALENV = RECORD / "realenv" / "realenv.json"

#: envmgr's layouts, in table order (realenv_peers.ENVMGR_LAYOUTS, without importing the
#: benchmark harness and its envs into the doc tables).
LAYOUTS = ("envmgr", "envmgr-firstready", "envmgr-caller")
ENV_LABELS = {"pong": "Pong", "halfcheetah": "HalfCheetah-v5", "humanoid": "Humanoid-v5"}
#: Columns as fractions of the ceiling, in table order.
COLUMNS = [
    ("lockstep", "lock-step bound"),
    ("doorbell", "lock-step, sleeping parent"),
    ("envmgr", "envmgr `step`"),
    ("envmgr-firstready", "first-ready"),
    ("envmgr-caller", "`caller_envs`"),
    ("async", "AsyncVectorEnv"),
    ("subproc", "SB3 SubprocVecEnv"),
    ("puffer-2", "PufferLib 2 w"),
    ("puffer-1", "PufferLib 1 w"),
    ("envpool", "EnvPool (own C++ port)"),
]


def _spread(config: dict[str, Any], key: str) -> str:
    """``median (min-max)`` of a ratio over the rounds, or a dash."""
    got = config["ratios"].get(key)
    if not got:
        return "–"
    rounds = got["per_round"]
    text = f"{got['median']:.2f}"
    if len(rounds) > 1:
        text += f" ({min(rounds):.2f}-{max(rounds):.2f})"
    return text


def _configs(report: dict[str, Any]) -> list[dict[str, Any]]:
    order = list(ENV_LABELS)
    return sorted(report["configs"], key=lambda c: (order.index(c["env"]), c["n_envs"]))


def _caption(report: dict[str, Any], path: Path = REALENV, cells: str = "") -> str:
    args = report.get("args", {})
    rounds = args.get("rounds", "?")
    seconds = args.get("seconds", "?")
    cells = cells or "each cell is the median ratio to the same round's ceiling"
    return (
        f"*From `{rel(path)}` (`{public_command(report['command'])}`, "
        f"{str(report.get('started', ''))[:10]}); {rounds} interleaved rounds x {seconds} s, "
        f"every measurement in a fresh interpreter; {cells}, (min-max) over the rounds.*\n\n"
    )


@table("realenv")
def realenv() -> str:
    """Real envs against the ceiling: envmgr's layouts and the peers."""
    report = load_json(REALENV)
    rows = []
    for c in _configs(report):
        med = c["median_steps_per_second"]
        rows.append(
            [
                f"{ENV_LABELS[c['env']]}, n={c['n_envs']}",
                fmt_rate(med.get("serial")),
                fmt_rate(med.get("ceiling")),
                *(_spread(c, f"{impl}/ceiling") for impl, _ in COLUMNS),
            ]
        )
    head = ["env", "serial steps/s", "ceiling steps/s", *(label for _, label in COLUMNS)]
    return _caption(report) + markdown(head, rows, "l" + "r" * (len(head) - 1))


ALE_VECTOR = RECORD / "realenv" / "ale_vector" / "realenv.json"


#: The ``realenv-ale-vector`` table's columns after the env's: head, and the cell of a config
#: (a rate, or a ratio ``impl/base`` as its spread over rounds), kept side by side so a
#: column's head cannot drift from its cells.
ALE_VECTOR_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    (
        "Python envs: ceiling steps/s",
        lambda c: fmt_rate(c["median_steps_per_second"].get("ceiling")),
    ),
    ("envmgr `step`", lambda c: _spread(c, "envmgr/ceiling")),
    ("`caller_envs`", lambda c: _spread(c, "envmgr-caller/ceiling")),
    (
        "ale-py vector: ceiling steps/s",
        lambda c: fmt_rate(c["median_steps_per_second"].get("ale-vector-ceiling")),
    ),
    ("its ceiling / the Python one", lambda c: _spread(c, "ale-vector-ceiling/ceiling")),
    ("ale-py vector alone, 2 threads", lambda c: _spread(c, "ale-vector/ale-vector-ceiling")),
    (
        "envmgr hosting it, 2 workers",
        lambda c: _spread(c, "envmgr-ale-vector/ale-vector-ceiling"),
    ),
    (
        "hosting it, 1 worker + `caller_envs`",
        lambda c: _spread(c, "envmgr-ale-vector-caller/ale-vector-ceiling"),
    ),
    ("EnvPool (own C++ port), 2 threads", lambda c: _spread(c, "envpool/ale-vector-ceiling")),
]


@table("realenv-ale-vector")
def realenv_ale_vector() -> str:
    """Pong as Python envs and as ale-py's own batched env, each against its own ceiling."""
    report = load_json(ALE_VECTOR)
    rows = [
        [f"Pong, n={c['n_envs']}", *(cell(c) for _, cell in ALE_VECTOR_COLUMNS)]
        for c in _configs(report)
    ]
    head = ["env", *(label for label, _ in ALE_VECTOR_COLUMNS)]
    cells = (
        "the envmgr `step` and `caller_envs` cells are ratios to the Python envs' ceiling, "
        "the last four to the ale-py vector ceiling, each the median over rounds of the "
        "ratio within a round"
    )
    return _caption(report, ALE_VECTOR, cells) + markdown(head, rows, "l" + "r" * (len(head) - 1))


@table("realenv-peers")
def realenv_peers() -> str:
    """envmgr's best layout against each peer, and the parent's CPU per batch."""
    report = load_json(REALENV)
    rows = []
    for c in _configs(report):
        med = c["median_steps_per_second"]
        best = max((med[k], k) for k in LAYOUTS if k in med)[1]

        def over(peer: str, config: dict[str, Any] = c) -> str:
            got = target_value(config, f"best/{peer}")  # the targets table's reading too
            return f"{got[0]:.2f}x" if got else "–"

        cpu = c.get("median_parent_cpu_us_per_batch", {})
        rows.append(
            [
                f"{ENV_LABELS[c['env']]}, n={c['n_envs']}",
                f"`{best}`",
                over("serial"),
                over("async"),
                over("subproc"),
                over("puffer-2")
                if med.get("puffer-2", 0) >= med.get("puffer-1", 0)
                else over("puffer-1"),
                over("envpool"),
                " / ".join(f"{cpu[k]:,.0f}" if k in cpu else "–" for k in LAYOUTS),
            ]
        )
    head = [
        "env",
        "envmgr's best layout",
        "/ serial",
        "/ AsyncVectorEnv",
        "/ SB3 SubprocVecEnv",
        "/ PufferLib (its best)",
        "/ EnvPool (own C++ port)",
        "parent CPU µs per batch (`step` / first-ready / `caller_envs`)",
    ]
    return (
        f"*From `{rel(REALENV)}`: median env-steps/s of envmgr's fastest layout over each "
        "peer's.*\n\n" + markdown(head, rows, "ll" + "r" * (len(head) - 2))
    )


#: The README's headline: the cases a newcomer compares first.
HEADLINE = [("pong", 8), ("halfcheetah", 8)]
HEADLINE_PEERS = [
    ("async", "AsyncVectorEnv"),
    ("subproc", "SB3 SubprocVecEnv"),
    ("puffer", "PufferLib"),
    ("envpool", "EnvPool (own C++ port)"),
]


@table("headline")
def headline() -> str:
    """env-steps/s of envmgr's fastest layout and of each peer on Pong and HalfCheetah, n=8."""
    report = load_json(REALENV)
    configs = {(c["env"], c["n_envs"]): c for c in report["configs"]}
    rows = []
    for env, n in HEADLINE:
        c = configs[(env, n)]
        med = c["median_steps_per_second"]
        rate, best = max((med[k], k) for k in LAYOUTS if k in med)
        cells = [f"{ENV_LABELS[env]}, n={n}", f"{fmt_rate(rate)} (`{SHORT[best]}`)"]
        for peer, _ in HEADLINE_PEERS:
            if peer == "puffer":  # PufferLib's better layout of its two
                peer = max(("puffer-1", "puffer-2"), key=lambda k: med.get(k, 0.0))
            theirs = med.get(peer)
            cells.append(f"{fmt_rate(theirs)} ({rate / theirs:.2f}x)" if theirs else "–")
        rows.append(cells)
    m = report.get("machine", {})
    cpus = m.get("usable_cpus") or m.get("nproc")
    head = ["env-steps/s", "envmgr (its fastest layout)", *(name for _, name in HEADLINE_PEERS)]
    python = str(m.get("python", "?")).split()[0]
    return (
        f"*{cpus}-vCPU VM ({m.get('cpu_model', '?')}), Python {python}"
        f", {str(report.get('started', ''))[:10]}; medians of "
        f"{report.get('args', {}).get('rounds', '?')} interleaved rounds; in brackets, envmgr's "
        f"rate over the peer's. From `{rel(REALENV)}`.*\n\n"
        + markdown(head, rows, "l" + "r" * (len(head) - 1))
    )


#: Repeat runs of the same benchmark, kept as rows beside the run of record: the targets
#: are read over all of them, since one run moves a ratio by 0.1-0.2 on this VM.
REPEATS = repeats.REPEATS
#: The performance targets: label, env, n, what, threshold. ``what`` is an envmgr layout's ratio to
#: the ceiling, ``best`` (the best of envmgr's layouts by that ratio), or ``best/PEER``
#: (envmgr's fastest layout's median env-steps/s over the peer's, as ``realenv-peers``).
TARGETS = [
    ("HalfCheetah-v5, n=8: default `step` / ceiling", "halfcheetah", 8, "envmgr", 0.7),
    ("HalfCheetah-v5, n=8: best layout / ceiling", "halfcheetah", 8, "best", 0.8),
    ("HalfCheetah-v5, n=32: best layout / ceiling", "halfcheetah", 32, "best", 0.85),
    ("Pong, n=8: default `step` / ceiling", "pong", 8, "envmgr", 0.8),
    ("Pong, n=8: best layout / ceiling", "pong", 8, "best", 0.9),
    ("HalfCheetah-v5, n=8: fastest / AsyncVectorEnv", "halfcheetah", 8, "best/async", 2.0),
    ("HalfCheetah-v5, n=8: fastest / SB3 SubprocVecEnv", "halfcheetah", 8, "best/subproc", 3.0),
    ("Pong, n=8: fastest / AsyncVectorEnv", "pong", 8, "best/async", 1.3),
    ("Pong, n=8: fastest / SB3 SubprocVecEnv", "pong", 8, "best/subproc", 1.5),
]
SHORT = {"envmgr": "step", "envmgr-firstready": "first-ready", "envmgr-caller": "caller"}
#: The floor each layout's structure sets, measured in the same run: the default's two
#: workers and a sleeping parent ("doorbell"), or two processes behind a bare barrier.
BOUNDS = {"envmgr": "doorbell", "envmgr-firstready": "lockstep", "envmgr-caller": "lockstep"}
BOUND_NAMES = {"doorbell": "its bound", "lockstep": "lock-step"}


def target_value(config: dict[str, Any], what: str) -> tuple[float, str] | None:
    """One target's value in one run's config, and the layout it was read from."""
    ratios, med = config["ratios"], config["median_steps_per_second"]
    if what in LAYOUTS:
        got = ratios.get(f"{what}/ceiling")
        return None if not got else (got["median"], what)
    if what == "best":
        found = [(ratios[f"{k}/ceiling"]["median"], k) for k in LAYOUTS if f"{k}/ceiling" in ratios]
        return max(found) if found else None
    peer = what.split("/", 1)[1]
    mine = [(med[k], k) for k in LAYOUTS if k in med]
    if not mine or not med.get(peer):
        return None
    rate, best = max(mine)
    return rate / med[peer], best


def realenv_runs() -> list[dict[str, Any]]:
    """The run of record and its repeats, oldest first."""
    runs = [load_json(REALENV), *(repeats.runs(REPEATS) if REPEATS.is_file() else [])]
    return sorted(runs, key=lambda run: str(run.get("started", "")))


def _digits(value: float, needs: float) -> int:
    """Two decimals, or as many more as it takes for the rounded value not to flip the
    verdict (0.698, 0.8997)."""
    digits = 2
    while (round(value, digits) >= needs) != (value >= needs) and digits < 6:
        digits += 1
    return digits


def _target_cell(config: dict[str, Any], what: str, needs: float) -> tuple[str, float] | None:
    """One target read in one run: its text (value, layout, bound) and its value."""
    got = target_value(config, what)
    if got is None:
        return None
    value, layout = got
    text = f"{value:.{_digits(value, needs)}f}" + ("x" if "/" in what else "")
    notes = [] if what in LAYOUTS else [SHORT[layout]]
    bound = config["ratios"].get(f"{BOUNDS[layout]}/ceiling") if "/" not in what else None
    if bound:
        notes.append(f"{BOUND_NAMES[BOUNDS[layout]]} {bound['median']:.2f}")
    return (f"{text} ({'; '.join(notes)})" if notes else text), value


@table("realenv-targets")
def realenv_targets() -> str:
    """The performance targets: the run of record's reading, and over every recorded run
    the lowest and highest value and how many runs meet each one."""
    record = {(c["env"], c["n_envs"]): c for c in load_json(REALENV)["configs"]}
    runs = [{(c["env"], c["n_envs"]): c for c in r["configs"]} for r in realenv_runs()]
    rows = []
    for label, env, n, what, needs in TARGETS:
        unit = "x" if "/" in what else ""
        mine = record.get((env, n))
        cell = None if mine is None else _target_cell(mine, what, needs)
        values = [
            got[1]
            for configs in runs
            if (env, n) in configs and (got := _target_cell(configs[(env, n)], what, needs))
        ]
        spread = "–"
        if values:
            lo, hi = min(values), max(values)
            spread = f"{lo:.{_digits(lo, needs)}f}-{hi:.{_digits(hi, needs)}f}{unit}"
        met = sum(v >= needs for v in values)
        rows.append(
            [
                label,
                f">= {needs:g}{unit}",
                cell[0] if cell else "–",
                spread,
                f"{met} of {len(values)}",
            ]
        )
    head = ["target", "needs", "run of record", "every recorded run", "met in"]
    return (
        f"*From `{rel(REALENV)}` (the run of record) and `{rel(REPEATS)}` (its repeats, "
        f"{len(runs)} runs in all, hours or days apart): each value is a run's median over "
        "its rounds, with the layout it came from and, for a ratio to the ceiling, the bound "
        "that layout's structure sets in the same run: the lock-step bound, or for the default "
        "`step` the sleeping-parent bound (two workers stepping on envmgr's doorbell and a "
        "parent asleep, nothing crossing).*\n\n" + markdown(head, rows, "llrrr")
    )


TUNE_TEXT = RECORD / "tune_halfcheetah.txt"


@table("tune-output")
def tune_output() -> str:
    """One saved run of ``envmgr tune``, as it printed."""
    return "```text\n" + TUNE_TEXT.read_text(encoding="utf-8").rstrip() + "\n```"
