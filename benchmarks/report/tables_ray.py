"""The Ray tables of docs/ray.md and docs/performance.md, read from the text that
``suites.ray_throughput`` and ``probes.probe ray-graph`` print (kept in results/record/).

Registered with ``doc_tables.table``; see that module for the markers and the check.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks._common.paths import RECORD
from benchmarks.report.tables import caption, markdown, rel, table
from benchmarks.report.text import fmt_rate, fmt_ratio

RAY_TEXT = RECORD / "ray_throughput.txt"
RAY_GRAPH_TEXT = RECORD / "ray_graph.txt"
_RAY_ROW = re.compile(
    r"^(?P<name>\S.*?)\s{2,}(?P<envs>\d+)\s+(?P<rate>[\d,]+)(?:\s+(?P<x>[\d.]+)x)?$"
)
_SECONDS_ROW = re.compile(r"^(?P<name>\S.*?)\s{2,}(?P<s>\d+\.\d+)$")
_US = re.compile(r"(?P<what>[\w -]+): (?P<us>[\d,]+) µs")
_BARE_TRIP = re.compile(r"Ray round trip alone \(.*?\): (?P<us>[\d,]+) µs")


def _ray_rows() -> list[tuple[str, int, float, float | None]]:
    """(configuration, envs, env-steps/s, Ray / local as printed) from ray_throughput.txt."""
    rows = []
    for line in RAY_TEXT.read_text(encoding="utf-8").splitlines():
        m = _RAY_ROW.match(line.rstrip())
        if m:
            x = m["x"]
            rows.append(
                (m["name"], int(m["envs"]), float(m["rate"].replace(",", "")), x and float(x))
            )
    return rows  # type: ignore[return-value]


def _microseconds(path: Path) -> dict[str, float]:
    """Every ``what: 1,234 µs`` figure printed in ``path``, by its label."""
    text = path.read_text(encoding="utf-8")
    return {m["what"].strip(): float(m["us"].replace(",", "")) for m in _US.finditer(text)}


@table("ray-local")
def ray_local() -> str:
    """RayEnvManager against the local manager, and what that says about one machine."""
    rows, ratios = [], []
    for name, envs, rate, x in _ray_rows():
        rows.append([name, f"{envs:,}", fmt_rate(rate), fmt_ratio(x) if x is not None else ""])
        if x is not None:
            ratios.append(x)
    header = RAY_TEXT.read_text(encoding="utf-8").strip().splitlines()[0]
    more = (
        f"`python -m benchmarks.suites.ray_throughput`: {header}; vs local: median of the "
        "per-round ratios to the local manager with as many envs, so it can differ by a point "
        "from the ratio of the two medians"
    )
    head = ["configuration (actors/workers x envs each)", "envs", "env-steps/s", "vs local"]
    text = caption(RAY_TEXT, None, more) + markdown(head, rows, "lrrr")
    return text + (
        f"\n\nIn this run the local manager was {1 / max(ratios):.0f}-{1 / min(ratios):.0f}x "
        "faster than Ray on one machine."
    )


@table("ray-startup")
def ray_startup() -> str:
    rows = []
    for line in RAY_TEXT.read_text(encoding="utf-8").splitlines():
        m = _SECONDS_ROW.match(line.rstrip())
        if m:
            rows.append([m["name"], m["s"]])
    return caption(RAY_TEXT) + markdown(["Ray start / stop", "seconds"], rows, "lr")


@table("ray-round-trip")
def ray_round_trip() -> str:
    """The two Ray round trips measured, and why they differ."""
    alone = _microseconds(RAY_TEXT)
    graph = _microseconds(RAY_GRAPH_TEXT)
    bare_trip = _BARE_TRIP.search(RAY_TEXT.read_text(encoding="utf-8"))
    if bare_trip is None:
        raise ValueError(f"{RAY_TEXT} has no 'Ray round trip alone' line")
    bare = float(bare_trip["us"].replace(",", ""))
    local = alone["the local hosted batch step"]
    plain, compiled = graph["plain actor calls"], graph["compiled graph"]
    block = graph["in-process step of one block"]
    rows = [
        ["2 bare actors (no envs) answering a hosted step's arrays; two-node cluster, "
         "`ray_throughput.py`", f"{bare / 1e3:,.2f}"],
        ["local hosted batch step, 2 x 2,048 (same rounds)", f"{local / 1e3:,.2f}"],
        ["2 actors each stepping 2,048 envs, plain actor calls; one-node Ray, "
         "`probe.py ray-graph`", f"{plain / 1e3:,.2f}"],
        ["the same through a Ray compiled graph (`ray.dag`)", f"{compiled / 1e3:,.2f}"],
        ["one 2,048-env block stepped in-process", f"{block / 1e3:,.2f}"],
    ]  # fmt: skip
    head = (
        f"*From `{rel(RAY_TEXT)}` and `{rel(RAY_GRAPH_TEXT)}`: two sittings and two set-ups, "
        "hence two round trips.*\n\n"
    )
    text = head + markdown(["what", "ms per batch step"], rows, "lr")
    return text + (
        f"\n\nA backend built on actor calls can reach at most about {local / (local + bare):.2f}x "
        f"the local manager here (local step / (local step + bare round trip)); a compiled "
        f"graph takes {compiled / plain:.2f}x the plain calls' time, still "
        f"{compiled / block:.0f}x one in-process block step."
    )
