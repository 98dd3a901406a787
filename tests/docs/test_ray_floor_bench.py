"""The Ray floor benchmark runs end to end at its smoke size and writes what it promises.

It runs as a user would, ``python -m benchmarks.suites.ray_floor`` from the repository root
in a subprocess (which starts and shuts down a Ray of its own on loopback), on CartPole
with one actor. Only the structure of the results is checked, never a speed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray", reason='ray is not installed: pip install "envmgr[ray]"')

from support.helpers import run_quick_suite  # noqa: E402

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_reports_round_trip_step_timers_and_local(tmp_path: Path) -> None:
    report = run_quick_suite(
        "ray_floor", tmp_path, "--envs", "cartpole", "--actors", "1", timeout=220
    )
    printed = (tmp_path / "quick.txt").read_text()  # the table the run printed
    (config,) = report["configs"]
    assert (config["env"], config["n_actors"], config["envs_per_actor"]) == ("cartpole", 1, 8)
    assert config["errors"] == {}
    assert config["skipped"] == {"first-ready": "needs 2 actors or more"}
    assert set(config["samples"]) == {"bare", "bare-packed", "step", "local"}
    for kind, (sample,) in config["samples"].items():
        assert sample["batches"] > 0 and sample["us_per_batch"] > 0, kind
    (step,) = config["samples"]["step"]
    # The timers saw every timed step on both sides, and the parts add up to the step.
    assert step["actor_calls"] >= step["batches"]
    assert 0 < step["driver_own_us"] and 0 < step["driver_wait_us"]
    assert step["driver_own_us"] + step["driver_wait_us"] <= step["us_per_batch"]
    assert 0 < step["actor_own_us"] < step["driver_wait_us"]
    assert step["env_us_per_step"] > 0
    ray_child = next(c for c in config["children"] if c["side"] == "ray")
    # 8 envs: 4 float32 observations, a float64 reward and two bool flags each.
    assert ray_child["answer_bytes_per_actor"] == 8 * (16 + 8 + 2)
    ratio = config["summary"]["step_over_bare"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["median"] > 0
    (target,) = report["targets"]
    assert target["target"] == "cartpole 1x8 envmgr step / bare round trip <= 1.2"
    assert target["met"] == (target["value"] <= 1.2)
    for heading in ("Ray's round trip", "envmgr's own time", "First-ready", "Targets"):
        assert heading in printed
    assert "| CartPole-v1 | 1 x 8" in printed
