"""The multi-agent headline of README.md, read from benchmarks/suites/multiagent.py's JSON
(benchmarks/results/record/multiagent/multiagent.json).

Registered with ``doc_tables.table``; see that module for the markers and the check. Every
figure is the run's own summary: the median over its rounds of agent-steps/s, and of each
round's ratio to the ceiling timed in the same round::

    multiagent.json configs[(env, n)].summary[impl].agent_steps_per_second.median
                                                   .of_ceiling.median
                    configs[(env, n)].errors[impl] / .skipped[impl]  -> the cell says so
"""

from __future__ import annotations

from typing import Any

from benchmarks._common.paths import RECORD
from benchmarks.report.tables import load_json, markdown, public_command, rel, table
from benchmarks.report.text import fmt_rate

MULTIAGENT = RECORD / "multiagent" / "multiagent.json"

#: The cases of the README's multi-agent headline: (env, envs), with the label of its row.
#: (The benchmark's own labels live with its envs, which the doc tables do not import.)
HEADLINE = [
    ("spread-3", 16, "MPE2 simple_spread_v3, 3 agents"),
    ("battle", 8, "MAgent2 battle_v4, 162 agents, deaths"),
    ("synthetic", 8, "synthetic, 16 agents, a few µs a step"),
]
#: PufferLib's settings in the run; the table gives the best of them.
PUFFER = {
    "puffer": "2 workers",
    "puffer-async": "2 workers, half batches",
    "puffer-1w": "1 worker",
    "puffer-copy": "half batches, copies",
}


def _median(config: dict[str, Any], impl: str, key: str) -> float | None:
    got = config["summary"].get(impl, {}).get(key)
    return None if got is None else float(got["median"])


def _cell(config: dict[str, Any], impl: str, note: str = "") -> str:
    """``rate (fraction of the ceiling[, note])``, or what stopped the implementation."""
    if impl in config["errors"]:
        return f"failed: {config['errors'][impl]}"
    if impl in config["skipped"]:
        return f"skipped: {config['skipped'][impl]}"
    rate = _median(config, impl, "agent_steps_per_second")
    ratio = _median(config, impl, "of_ceiling")
    if rate is None or ratio is None:
        return "–"
    return f"{fmt_rate(rate)} ({ratio:.2f}{', ' + note if note else ''})"


def _best_puffer(config: dict[str, Any]) -> str | None:
    """PufferLib's setting with the highest median agent-steps/s in this config."""
    rates = {
        impl: rate
        for impl in PUFFER
        if (rate := _median(config, impl, "agent_steps_per_second")) is not None
    }
    return max(rates, key=lambda impl: rates[impl]) if rates else None


@table("headline-multiagent")
def headline_multiagent() -> str:
    """agent-steps/s of make_parallel's default layout, SuperSuit and PufferLib's best."""
    report = load_json(MULTIAGENT)
    configs = {(c["env"], c["n_envs"]): c for c in report["configs"]}
    rows = []
    for env, n, label in HEADLINE:
        c = configs[(env, n)]
        puffer = _best_puffer(c)
        rows.append(
            [
                f"{label}, n={n}",
                fmt_rate(_median(c, "ceiling", "agent_steps_per_second")),
                _cell(c, "envmgr"),
                _cell(c, "supersuit"),
                _cell(c, puffer, PUFFER[puffer]) if puffer else "–",
            ]
        )
    m = report.get("machine", {})
    cpus = m.get("usable_cpus") or m.get("nproc")
    python = str(m.get("python", "?")).split()[0]
    args = report.get("args", {})
    head = [
        "agent-steps/s",
        "ceiling (2 processes)",
        "envmgr `make_parallel` (default)",
        "SuperSuit",
        "PufferLib (its best)",
    ]
    return (
        "PettingZoo envs, one batch row per agent: "
        "`envmgr.make_parallel(env_fn, n)` as it comes, against SuperSuit's "
        "`concat_vec_envs_v1` (2 CPUs, `black_death_v3` where agents die) and the best of "
        "PufferLib's settings.\n\n"
        f"*{cpus}-vCPU VM ({m.get('cpu_model', '?')}), Python {python}, "
        f"{str(report.get('started', ''))[:10]}; medians of {args.get('rounds', '?')} "
        "interleaved rounds, each measurement in a fresh interpreter; in brackets, the median "
        "ratio to the ceiling of the same round (two processes packing the same envs' agents "
        f"into rows, no communication). From `{rel(MULTIAGENT)}` "
        f"(`{public_command(report['command'])}`).*\n\n"
        + markdown(head, rows, "l" + "r" * (len(head) - 1))
    )
