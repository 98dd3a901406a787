"""The printed tables of a benchmark run: rates, ratios and the extras, as Markdown.

The suites print these on stdout and write them beside their JSON; ``doc_tables`` builds
the documents' tables from the same functions, so a run's text and the docs read alike.
"""

from __future__ import annotations

from typing import Any

from benchmarks._common.timing import median

LABELS = {
    "serial": "serial",
    "ceiling": "ceiling",
    "lockstep": "lock-step",
    "sync": "Sync",
    "async": "Async",
    "envmgr": "envmgr",
    "envmgr-nocopy": "envmgr copy=False",
    "envmgr-firstready": "envmgr first-ready",
    "envmgr-caller": "envmgr caller_envs",
    "envmgr-hosted": "envmgr hosted",
    "envmgr-hosted-caller": "envmgr hosted, caller_envs",
    "vector": "VectorEnv in-process",
    "envpool": "envpool",
}


def fmt_rate(x: float | None) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:,.0f}"


def fmt_ratio(x: float | None) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:.2f}x"


def fmt_spread(s: dict[str, float] | None, digits: int = 0) -> str:
    """``median (min-max)`` of a :func:`benchmarks._common.timing.spread`; ``-`` if none."""
    if not s or s["median"] != s["median"]:
        return "-"
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f}-{s['max']:,.{digits}f})"


def padded_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines with every column padded to its widest cell (for a
    terminal and a ``.txt``; rows shorter than ``head`` are padded with empty cells)."""
    rows = [r + [""] * (len(head) - len(r)) for r in rows]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]


def targets_table(heading: str, targets: list[dict[str, Any]]) -> list[str]:
    """A suite's targets as lines: ``heading``, then target, measured value and verdict."""
    rows = [
        [t["target"], t["shown"], "-" if t["met"] is None else ("met" if t["met"] else "missed")]
        for t in targets
    ]
    body = padded_table(["target", "measured", ""], rows) if rows else ["(none measured)"]
    return ["", heading, *body]


def markdown_table(
    configs: list[dict[str, Any]], impls: list[str], ratio_pairs: list[tuple[str, str]]
) -> str:
    """Median env-steps/s per implementation and the per-round ratios ``mine/peer``.

    Only the implementations and ratios that some configuration has are shown.
    """
    shown = [i for i in impls if any(i in c["median_steps_per_second"] for c in configs)]
    pairs = [f"{a}/{b}" for a, b in ratio_pairs if any(f"{a}/{b}" in c["ratios"] for c in configs)]
    head = ["env", "n_envs", *[f"{LABELS[i]} steps/s" for i in shown], *pairs]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|",
    ]
    for c in configs:
        med = c["median_steps_per_second"]
        row = [c["env"], str(c["n_envs"])]
        row += [fmt_rate(med.get(i)) for i in shown]
        row += [fmt_ratio(c["ratios"].get(p, {}).get("median")) for p in pairs]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def overhead_text(overhead: list[dict[str, Any]]) -> str:
    lines = [
        "envmgr per-batch-step cost on the no-op env (median over rounds; the envs do nothing, "
        "so this is the manager's own cost):",
        "",
        "| layout | variant | wall µs/batch | parent CPU µs/batch | wall µs per env-step |",
        "|---|---|---:|---:|---:|",
    ]
    for o in overhead:
        layout = f"{o['n_workers']} workers x {o['envs_per_worker']} envs ({o['n_envs']} total)"
        for k, wall in o["median_us_per_batch"].items():
            cpu = o["median_parent_cpu_us_per_batch"][k]
            lines.append(
                f"| {layout} | {k} | {wall:,.1f} | {cpu:,.1f} | {wall / o['n_envs']:.2f} |"
            )
    return "\n".join(lines)


def scaling_text(scaling: dict[str, Any]) -> str:
    """The parent-CPU-per-batch series over worker counts."""
    epw = scaling["envs_per_worker"]
    lines = [
        f"Parent CPU per batch step over worker counts (no-op env, {epw} envs per worker, "
        "default checks; median over rounds):",
        "",
        "| workers | envs | parent CPU µs/batch | wall µs/batch |",
        "|---:|---:|---:|---:|",
    ]
    for w in scaling["workers"]:
        cpu = scaling["median_parent_cpu_us_per_batch"][str(w)]
        wall = scaling["median_us_per_batch"][str(w)]
        lines.append(f"| {w} | {w * epw} | {cpu:,.1f} | {wall:,.1f} |")
    lines.append("")
    lines.append(
        "least-squares slope: "
        f"{scaling['slope_parent_cpu_us_per_worker']:.2f} µs of parent CPU per added worker"
    )
    return "\n".join(lines)


def floor_text(floor: dict[str, Any]) -> str:
    """envmgr's one-batch no-op round trip against the wake-up floor."""
    lines = [
        "One-batch round trip: envmgr on the no-op env (1 env per worker) against the wake-up "
        "floor (the same doorbell, nothing else); median over rounds:",
        "",
        "| workers | envmgr µs/batch | floor µs/batch | envmgr/floor | envmgr parent CPU µs "
        "| floor parent CPU µs |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for e in floor["layouts"]:
        wall, cpu = e["median_us_per_batch"], e["median_parent_cpu_us_per_batch"]
        ratio = (e.get("ratio_envmgr_over_floor") or {}).get("median")
        lines.append(
            f"| {e['n_workers']} | {wall.get('envmgr', float('nan')):,.1f} "
            f"| {wall.get('floor', float('nan')):,.1f} | {fmt_ratio(ratio)} "
            f"| {cpu.get('envmgr', float('nan')):,.1f} | {cpu.get('floor', float('nan')):,.1f} |"
        )
        if "error" in e:
            lines.append(f"\n{e['error']}")
    return "\n".join(lines)


def setup_text(setup: dict[str, Any]) -> str:
    lines = [
        f"envmgr set-up time, {setup['n_workers']} workers x {setup['envs_per_worker']} envs "
        f"CartPole-v1: construct + first reset + close "
        f"(median of {len(next(iter(setup['samples'].values())))}; "
        "all samples in order):",
        "",
        "| start method | median total | construct | reset | close | samples (total) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for m, ss in setup["samples"].items():
        totals = ", ".join(f"{s['total'] * 1e3:,.0f}" for s in ss)
        lines.append(
            f"| {m} | {median([s['total'] for s in ss]) * 1e3:,.0f} ms "
            f"| {median([s['construct'] for s in ss]) * 1e3:,.0f} ms "
            f"| {median([s['reset'] for s in ss]) * 1e3:,.1f} ms "
            f"| {median([s['close'] for s in ss]) * 1e3:,.0f} ms "
            f"| {totals} ms |"
        )
    return "\n".join(lines)


def _config_ratio(report: dict[str, Any], env: str, n: int, key: str) -> float | None:
    for c in report.get("configs", []):
        if c["env"] == env and c["n_envs"] == n:
            return c["ratios"].get(key, {}).get("median")  # type: ignore[no-any-return]
    return None


def goals_text(report: dict[str, Any]) -> str:
    """The project's throughput goals that this run measured, one row each ("" for none).

    Ratios are medians of per-round ones; a goal the run did not measure is left out.
    """
    rows: list[tuple[str, float, str, bool | None]] = []

    def add(what: str, value: float | None, goal: str, met: bool | None) -> None:
        if value is not None and value == value:
            rows.append((what, value, goal, met))

    def at_least(what: str, value: float | None, goal: float) -> None:
        add(what, value, f">= {goal:g}", None if value is None else value >= goal)

    def at_most(what: str, value: float | None, goal: float) -> None:
        add(what, value, f"<= {goal:g}", None if value is None else value <= goal)

    variants = ("envmgr", "envmgr-nocopy", "envmgr-firstready", "envmgr-caller")

    def best(env: str, n: int) -> tuple[float | None, str]:
        found = [(_config_ratio(report, env, n, f"{m}/ceiling"), m) for m in variants]
        found = [(r, m) for r, m in found if r is not None]
        return max(found) if found else (None, "")

    for env, label, n, default_goal, best_goal in (
        ("compute", "compute", 16, 0.9, 0.9),
        ("cartpole", "CartPole", 64, 0.7, 0.8),
    ):
        layout = f"{label} 2 x {n // 2}"
        r = _config_ratio(report, env, n, "envmgr/ceiling")
        at_least(f"{layout}: envmgr (default) / ceiling", r, default_goal)
        b, m = best(env, n)
        at_least(f"{layout}: best layout ({m}) / ceiling", b, best_goal)
        r = _config_ratio(report, env, n, "lockstep/ceiling")
        add(f"(for scale) bare lock-step {layout} / ceiling", r, "–", None)
    cpu = None
    for o in report.get("overhead", []):
        if (o["n_workers"], o["envs_per_worker"]) == (2, 64):
            cpu = o["median_parent_cpu_us_per_batch"].get("envmgr")
    at_most("no-op 2 x 64: parent CPU µs per batch", cpu, 10)
    slope = report.get("scaling", {}).get("slope_parent_cpu_us_per_worker")
    at_most("no-op: parent CPU µs per added worker", slope, 1)
    for e in report.get("floor", {}).get("layouts", []):
        f = (e.get("ratio_envmgr_over_floor") or {}).get("median")
        at_most(f"{e['n_workers']} worker(s): round trip / floor", f, 2)
    for mine, how in (("envmgr-hosted", "2 workers"), ("envmgr-hosted-caller", "caller_envs")):
        r = _config_ratio(report, "cartpole-vector", 2048, f"{mine}/ceiling")
        at_least(f"CartPole vector 2 x 1,024: hosted ({how}) / ceiling", r, 0.8)
        r = _config_ratio(report, "cartpole-vector", 2048, f"{mine}/envpool")
        at_least(f"CartPole vector 2 x 1,024: hosted ({how}) / EnvPool", r, 15)
    r = _config_ratio(report, "cartpole-vector", 2048, "lockstep/ceiling")
    add("(for scale) bare lock-step 2 x 1,024 / ceiling", r, "–", None)
    if not rows:
        return ""
    lines = [
        "Throughput goals this run measured (one run; the training-loop and Ray goals are "
        "measured by policy_loop.py and ray_throughput.py):",
        "",
        "| goal | this run | wanted | met |",
        "|---|---:|---:|---|",
    ]
    for what, value, goal, met in rows:
        verdict = "–" if met is None else ("yes" if met else "no")
        lines.append(f"| {what} | {value:,.2f} | {goal} | {verdict} |")
    return "\n".join(lines)
