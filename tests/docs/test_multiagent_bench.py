"""The multi-agent benchmark runs end to end at its smoke size and writes what it promises.

It runs as a user would, ``python -m benchmarks.suites.multiagent`` from the repository
root in a subprocess, on the synthetic env with the ceiling and envmgr's default layout.
Only the structure of the results is checked, never a speed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import run_quick_suite

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_reports_ratios_packing_bytes_and_targets(tmp_path: Path) -> None:
    report = run_quick_suite(
        "multiagent", tmp_path, "--envs", "synthetic", "--impls", "envmgr,ceiling", timeout=100
    )
    printed = (tmp_path / "quick.txt").read_text()  # the table the run printed
    (config,) = report["configs"]
    assert (config["env"], config["n_envs"]) == ("synthetic", 4)
    assert config["errors"] == {}
    assert set(config["samples"]) == {"envmgr", "ceiling"}
    (ceiling,) = config["samples"]["ceiling"]
    assert [p["rows"] for p in ceiling["per_process"]] == [32, 32]  # 2 envs x 16 agents each
    (sample,) = config["samples"]["envmgr"]
    assert sample["agent_steps_per_second"] == pytest.approx(16 * sample["env_steps_per_second"])
    assert sample["live_agents_per_batch"] == 4 * 16  # every agent lives until the episode ends
    assert sample["worker_pack_us_per_agent"] > 0 and sample["parent_unpack_us_per_agent"] > 0
    assert sample["pickled_bytes_per_batch"] >= 0 and sample["n_workers"] == 2
    ratio = config["summary"]["envmgr"]["of_ceiling"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["median"] > 0
    (target,) = report["targets"]  # only the bytes target applies to this run
    assert target["target"] == "synthetic n=4 envmgr bytes pickled per step = 0"
    assert target["met"] in (True, False)
    for heading in ("Throughput", "packing per live agent-step", "Targets"):
        assert heading in printed
    assert "| synthetic, 16 agents | 4 | envmgr" in printed
