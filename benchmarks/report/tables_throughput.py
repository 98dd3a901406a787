"""The throughput tables of README.md and docs/performance.md, from the newest full run's
``throughput.json`` and ``policy_loop.json`` under benchmarks/results/record/ (by ``started_at``).

Registered with ``tables.table``; ``doc_tables`` puts them into the documents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.report.tables import caption, load_json, markdown, newest, rel, table
from benchmarks.report.text import floor_text, fmt_rate, fmt_ratio, scaling_text, setup_text


def _ratio(config: dict[str, Any], key: str) -> float | None:
    return (config["ratios"].get(key) or {}).get("median")  # type: ignore[no-any-return]


def _configs(report: dict[str, Any], env: str) -> list[dict[str, Any]]:
    return sorted((c for c in report["configs"] if c["env"] == env), key=lambda c: c["n_envs"])


def _config(report: dict[str, Any], env: str, n: int) -> dict[str, Any]:
    for c in _configs(report, env):
        if c["n_envs"] == n:
            return c
    raise KeyError(f"the run has no {env} at {n} envs")


ENV_LABELS = {
    "compute": "compute-bound",
    "cartpole": "CartPole-v1",
    "image": "image 84x84x4",
    "straggler": "straggler, uneven step times",
}
#: envmgr's layouts on single envs, compared with one another in each row.
LAYOUTS = ("envmgr", "envmgr-firstready", "envmgr-caller", "envmgr-nocopy")


def _throughput_caption(path: Path, report: dict[str, Any], note: str = "") -> str:
    cfg = report["config"]
    cost = report["env_step_cost_us"].get("cartpole")
    more = (
        f"median of {cfg['repeats']} interleaved rounds x {cfg['seconds']:g} s; "
        "ratios: median of per-round ratios"
    )
    if cost is not None:
        more += f"; a CartPole step cost {cost:.1f} µs in-process"
    return caption(path, report, more + (f"; {note}" if note else ""))


@table("single-env")
def single_env() -> str:
    """Every single-env configuration: envmgr's layouts against the yardsticks and peers."""
    path = newest("throughput.json")
    report = load_json(path)
    w = report["config"]["workers"]
    rows = []
    for env, label in ENV_LABELS.items():
        cost = report["env_step_cost_us"].get(env)
        for c in _configs(report, env):
            mine = {k: _ratio(c, f"{k}/ceiling") for k in LAYOUTS}
            best = max((r, k) for k, r in mine.items() if r is not None)[1]

            def cell(k: str, mine: dict[str, float | None] = mine, best: str = best) -> str:
                text = fmt_ratio(mine[k])
                return f"**{text}**" if k == best else text

            step = cell("envmgr")
            if mine["envmgr-nocopy"] is not None:
                step += f" ({cell('envmgr-nocopy')} `copy=False`)"
            name = label if cost is None else f"{label} ({cost:,.1f} µs/step)"
            rows.append(
                [
                    f"{name}, {w} x {c['n_envs'] // w}",
                    fmt_ratio(_ratio(c, "ceiling/serial")),
                    fmt_ratio(_ratio(c, "lockstep/ceiling")),
                    step,
                    cell("envmgr-firstready"),
                    cell("envmgr-caller"),
                    fmt_ratio(_ratio(c, "envmgr/serial")),
                    fmt_ratio(_ratio(c, "envmgr/async")),
                ]
            )
    head = [
        f"env, {w} x n",
        "ceiling / serial",
        "lock-step / ceiling",
        "envmgr `step` / ceiling",
        "first-ready / ceiling",
        "`caller_envs` / ceiling",
        "envmgr `step` / serial",
        "envmgr `step` / Async",
    ]
    note = "bold: the best of envmgr's layouts in the row"
    return _throughput_caption(path, report, note) + markdown(head, rows, "lrrrrrrr")


@table("batched")
def batched() -> str:
    """Hosted vector envs (CartPoleVectorEnv) at every size of the run, M env-steps/s."""
    path = newest("throughput.json")
    report = load_json(path)
    impls = ("vector", "ceiling", "lockstep", "envmgr-hosted", "envmgr-hosted-caller", "envpool")
    ratios = (
        "envmgr-hosted/ceiling",
        "envmgr-hosted-caller/ceiling",
        "envmgr-hosted-caller/lockstep",
        "envmgr-hosted/envpool",
        "envmgr-hosted-caller/envpool",
    )
    rows = []
    for c in _configs(report, "cartpole-vector"):
        med = c["median_steps_per_second"]
        rates = [f"{med[i] / 1e6:,.2f}" if i in med else "–" for i in impls]
        rows.append([f"{c['n_envs']:,}", *rates, *(fmt_ratio(_ratio(c, k)) for k in ratios)])
    head = [
        "n_envs",
        "in-process VectorEnv",
        "ceiling",
        "lock-step",
        "envmgr hosted, 2 workers",
        "hosted, 1 worker + `caller_envs`",
        "EnvPool",
        "hosted / ceiling",
        "caller / ceiling",
        "caller / lock-step",
        "hosted / EnvPool",
        "caller / EnvPool",
    ]
    return _throughput_caption(path, report) + markdown(head, rows, "r" * len(head))


@table("throughput-plot-docs")
def throughput_plot_docs() -> str:
    """The newest run's plot, linked from docs/performance.md."""
    png = newest("throughput.json").with_suffix(".png")
    return f"![env-steps/s of every implementation in that run](../{rel(png)})"


YARDSTICK_ROWS = {
    "lockstep": "lock-step (bare barrier)",
    "envmgr-caller": "envmgr, 1 worker + `caller_envs`",
    "envmgr-firstready": "envmgr first-ready (`send`/`recv` one worker at a time)",
    "envmgr": "envmgr `step`, 2 workers (the default)",
}


def _yardsticks(env: str, n: int) -> str:
    """One configuration's layouts against the ceiling, best first."""
    path = newest("throughput.json")
    report = load_json(path)
    c = _config(report, env, n)
    w = report["config"]["workers"]
    got = [(_ratio(c, f"{k}/ceiling"), label) for k, label in YARDSTICK_ROWS.items()]
    rows = [[label, fmt_ratio(r)] for r, label in sorted(got, key=lambda x: -(x[0] or 0.0))]
    head = [f"{ENV_LABELS[env]}, {w} x {n // w}", "/ ceiling"]
    return _throughput_caption(path, report) + markdown(head, rows, "lr")


@table("yardsticks-cartpole")
def yardsticks_cartpole() -> str:
    return _yardsticks("cartpole", 64)


@table("yardsticks-compute")
def yardsticks_compute() -> str:
    return _yardsticks("compute", 16)


@table("batched-2048")
def batched_2048() -> str:
    """The 2 x 1,024 hosted case against its yardsticks (ratios of the medians)."""
    path = newest("throughput.json")
    report = load_json(path)
    med = _config(report, "cartpole-vector", 2048)["median_steps_per_second"]
    labels = {
        "ceiling": "ceiling: 2 processes, each its 1,024 envs, no communication",
        "lockstep": "lock-step: the same 2 processes, a bare shared-memory barrier per step",
        "vector": "in-process `CartPoleVectorEnv` of 2,048 envs",
        "envmgr-hosted-caller": "envmgr, 1 worker + the caller hosting a block "
        "(`caller_envs=1024`)",
        "envmgr-hosted": "envmgr, 2 workers hosting a block each",
        "envpool": "EnvPool C++ CartPole, 2 threads, 2,048 envs",
    }
    rows = [
        [label, f"{med[k] / 1e6:,.2f}", fmt_ratio(med[k] / med["ceiling"])]
        for k, label in sorted(labels.items(), key=lambda kv: -med.get(kv[0], 0.0))
        if k in med
    ]
    head = ["CartPole vector env, 2 x 1,024", "M env-steps/s", "/ ceiling"]
    more = "here / ceiling is the ratio of the medians"
    return caption(path, report, more) + markdown(head, rows, "lrr")


@table("parent-cpu")
def parent_cpu() -> str:
    path = newest("throughput.json")
    return caption(path, load_json(path)) + scaling_text(load_json(path)["scaling"])


@table("floor")
def floor() -> str:
    path = newest("throughput.json")
    return caption(path, load_json(path)) + floor_text(load_json(path)["floor"])


@table("setup")
def setup() -> str:
    path = newest("throughput.json")
    return caption(path, load_json(path)) + setup_text(load_json(path)["setup"])


# ----------------------------------------------------------------- policy_loop.json


@table("policy-loop")
def policy_loop() -> str:
    """Each training loop's rate against the serial loop with the same policy."""
    path = newest("policy_loop.json")
    report = load_json(path)
    rates, ratios = report["median_steps_per_second"], report["ratios"]
    rows = []
    for name, rate in rates.items():
        mode, policy = name.split("/")
        vs_sync = (ratios.get(f"{name} / sync") or {}).get("median")
        rows.append(
            [
                mode,
                policy,
                fmt_rate(rate),
                fmt_ratio((ratios.get(f"{name} / serial") or {}).get("median")),
                fmt_ratio(vs_sync) if vs_sync is not None else "",
            ]
        )
    n = report["config"]["n_envs"]
    costs = "; ".join(
        f"{policy}: {by_rows[str(n)]:,.0f} µs per {n}-row batch"
        for policy, by_rows in report["policy_cost_us"].items()
    )
    cfg = report["config"]
    more = (
        f"median of {cfg['repeats']} interleaved rounds x {cfg['seconds']:g} s, ratios: median "
        f"of per-round ratios; policy cost {costs}"
    )
    head = ["loop", "policy", "env-steps/s", "/ serial", "pool / sync"]
    return caption(path, report, more) + markdown(head, rows, "llrrr")
