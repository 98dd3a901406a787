"""What travels outside the shared-memory arrays: observations of spaces without a
fixed shape (pickled, and still equal to SyncVectorEnv's), and the doorbell's raw
wake-up bytes on a worker's pipe.

(envmgr.protocol.trees, envmgr.backends.local.doorbell)
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from support.envs import TextObsEnv, assert_same
from support.helpers import batch_actions

from envmgr import SubprocessEnvManager
from envmgr.protocol.shared_memory import fits_shared_memory

pytestmark = pytest.mark.timeout(60)


def test_text_observations_use_the_fallback_and_match_sync() -> None:
    n_workers, epw = 2, 2
    fns = [TextObsEnv] * (n_workers * epw)
    assert not fits_shared_memory(TextObsEnv().observation_space)
    sync = SyncVectorEnv(fns)
    actions = batch_actions(sync, 30, seed=4)
    mask = np.array([False, True, True, False])

    def run(venv: gym.vector.VectorEnv) -> list[Any]:
        out: list[Any] = [venv.reset(seed=2)]
        for t, a in enumerate(actions):
            if t == 10:
                out.append(venv.reset(seed=50, options={"reset_mask": mask.copy()}))
            out.append(venv.step(a))
        return out

    try:
        expected = run(sync)
    finally:
        sync.close()
    with SubprocessEnvManager(fns, n_workers=n_workers) as envs:
        got = run(envs)
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert_same(g, e, path=f"result {i}")
    assert sum(int(r[2].sum()) for r in expected if len(r) == 5) >= 3


def test_the_doorbell_wake_up_is_an_empty_message_of_multiprocessing_pipes() -> None:
    """The parent wakes a sleeping worker with raw bytes, not ``send_bytes``: they must be
    what ``Connection.recv_bytes`` reads as an empty message on this Python."""

    from envmgr.backends.local import doorbell as signalling

    reader, writer = mp.Pipe(duplex=False)
    try:
        os.write(writer.fileno(), signalling._EMPTY_MESSAGE)
        writer.send_bytes(b"next")
        assert reader.recv_bytes() == b""
        assert reader.recv_bytes() == b"next"
    finally:
        reader.close()
        writer.close()
