"""The variable-size benchmark runs end to end at its smoke size and writes what it promises.

It runs as a user would, ``python -m benchmarks.suites.ragged`` from the repository root in
a subprocess, on both configurations (the synthetic entity env and KAZ vector-sequence) with
every implementation. Only the structure of the results is checked, never a speed; and the
serial packer its KAZ rows compare with keeps every element past its starting capacity.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces
from support.helpers import run_quick_suite

from benchmarks._common.padded_slots import PaddedSlots

pytestmark = pytest.mark.timeout(300)

ENTITY_IMPLS = {"ceiling", "envmgr", "envmgr-caller", "envmgr-pickled", "async", "sb3"}
KAZ_IMPLS = {"serial", "ceiling", "envmgr", "envmgr-caller", "envmgr-padded"}


@pytest.mark.ci_only  # a long benchmark smoke: 11 fresh interpreters, about 25 s
def test_quick_run_reports_both_envs_layouts_spreads_bytes_and_targets(tmp_path: Path) -> None:
    report = run_quick_suite("ragged", tmp_path, timeout=280)
    printed = (tmp_path / "quick.txt").read_text()  # the table the run printed
    entities, kaz = report["configs"]
    assert (entities["env"], entities["n_envs"], kaz["env"], kaz["n_envs"]) == (
        "entities", 4, "kaz-sequence", 4,
    )  # fmt: skip
    assert entities["errors"] == {} and kaz["errors"] == {}
    assert set(entities["samples"]) == ENTITY_IMPLS and set(kaz["samples"]) == KAZ_IMPLS

    (ceiling,) = entities["samples"]["ceiling"]
    assert [p["n_envs"] for p in ceiling["per_process"]] == [2, 2]
    (ceiling,) = kaz["samples"]["ceiling"]
    assert [p["rows"] for p in ceiling["per_process"]] == [8, 8]  # 2 envs x 4 agents each

    # The caller_envs layout: one worker, the parent stepping the other half.
    for config in (entities, kaz):
        samples = config["samples"]
        assert samples["envmgr"][0]["n_workers"] == 2
        assert samples["envmgr-caller"][0]["n_workers"] == 1
    for impl in ("envmgr", "envmgr-caller", "envmgr-padded"):
        (sample,) = kaz["samples"][impl]
        assert sample["agent_steps_per_second"] == pytest.approx(4 * sample["env_steps_per_second"])

    # The bytes window sees pickles where they are: every observation of 4 envs, each
    # of at least 8 entities x 16 float32 (512 bytes), travels pickled.
    (pickled,) = entities["samples"]["envmgr-pickled"]
    assert pickled["pickled_bytes_per_batch"] > 4 * 512
    for config in (entities, kaz):
        for impl, row in config["summary"].items():
            for key, s in row.items():
                if s["median"] == s["median"]:  # measured: a spread over the rounds
                    assert s["min"] <= s["median"] <= s["max"], (config["env"], impl, key)
            assert row["of_ceiling"]["median"] > 0
        assert config["summary"]["ceiling"]["of_ceiling"]["median"] == 1.0

    targets = {t["target"] for t in report["targets"]}
    assert {
        "entities n=4 envmgr / ceiling >= 0.75",
        "entities n=4 envmgr / async >= 2",
        "entities n=4 envmgr bytes pickled per step = 0",
        "entities n=4 envmgr-caller bytes pickled per step = 0",
        "kaz-sequence n=4 envmgr / ceiling >= 0.8",
        "kaz-sequence n=4 envmgr bytes pickled per step = 0",
        "kaz-sequence n=4 envmgr-caller bytes pickled per step = 0",
    } <= targets
    assert all(t["met"] in (True, False) for t in report["targets"])
    for heading in ("entities 8-64 x 16 float32", "KAZ v11 obs_method=vector-sequence", "Targets"):
        assert heading in printed
    assert "| envmgr-caller " in printed and "agent-steps/s" in printed


def test_serial_packer_grows_past_its_capacity_and_keeps_every_element() -> None:
    space = spaces.Sequence(spaces.Box(-1, 1, (3,), np.float32), stack=True)
    slots = PaddedSlots(space, n=2, slots=2, capacity=2)
    first = np.full((2, 3), 0.5, np.float32)
    longer = np.arange(15, dtype=np.float32).reshape(5, 3) / 15
    slots[0, 1] = first
    slots[1, 0] = longer  # over capacity: grows to 8, the first observation kept
    data, lengths = slots.batch()
    assert data.shape == (4, 8, 3) and lengths.tolist() == [0, 2, 5, 0]
    assert np.array_equal(data[1, :2], first) and np.array_equal(data[2, :5], longer)
    assert not data[2, 5:].any()
    slots[1] = 0  # env 1 emptied, env 0 untouched
    data, lengths = slots.batch()
    assert lengths.tolist() == [0, 2, 0, 0] and not data[2:].any()
    assert np.array_equal(data[1, :2], first)
