"""The env side's hand-inlined shortcut: ``serve_step`` opens the ``step`` timer itself.

``serve_step`` inlines ``_within(group, "step", group.step, actions)`` and the usual step's
"nothing to say" test of ``_answer``; the general path is what ``serve`` does for a reset:
``_within`` around the group's call, then ``_answer``. Two groups built from one spec
take the same commands, one through each path; their answers, the rows they wrote and
their timer trees must agree (docs/architecture.md, "Hand-inlined shortcuts").
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from support.envs import assert_same

from envmgr import timers
from envmgr.envside.build import build_group
from envmgr.envside.group import EnvGroup, GroupSpec
from envmgr.envside.serve import _answer, _within, serve, serve_step
from envmgr.protocol.info_columns import HEADER_BYTES, ack_word
from envmgr.protocol.messages import Reset, StepResponse
from envmgr.protocol.shared_memory import SharedBuffers

N_ENVS, STEPS = 3, 12


class TimedEnv(gym.Env):  # type: ignore[type-arg]
    """Times its own work with envmgr's timers (nested under the group's ``step`` node),
    says a number on every step and a string on every third, ends episodes every 4 steps;
    ``text``: observations without a fixed shape (carried in the answer)."""

    action_space = spaces.Discrete(3)

    def __init__(self, text: bool) -> None:
        self.text = text
        self.observation_space = (
            spaces.Text(max_length=4, charset="ab")
            if text
            else spaces.Box(-np.inf, np.inf, (2,), np.float64)
        )
        self.t = 0

    def _obs(self) -> Any:
        if self.text:
            return "ab"[: int(self.np_random.integers(0, 3))]
        return self.np_random.standard_normal(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        with timers.hierarchical_timer("physics"):
            self.t += 1
            obs = self._obs()
        info: dict[str, Any] = {"t": self.t}
        if self.t % 3 == 0:
            info["note"] = f"step {self.t}"
        return obs, float(action) * self.t, self.t % 4 == 0, False, info


class Built:
    """One group of ``TimedEnv``, built and always run in its own timer stack (the stack a
    worker process has to itself), over private batch arrays."""

    def __init__(self, text: bool, columns: bool) -> None:
        self.stack = timers.TimerStack()
        spec = GroupSpec(0, 0, N_ENVS, "NextStep", env_fns=(lambda: TimedEnv(text),) * N_ENVS)
        self.group: EnvGroup = self.run(build_group, spec)
        group = self.group
        self.buffers = SharedBuffers.private(
            group.single_observation_space, group.single_action_space, N_ENVS
        )
        views = self.buffers.slice(0, N_ENVS)
        if not columns:
            views["info_arena"] = None  # as a Ray actor has it: every info in the answer
        group.attach(views)

    def run(self, fn: Any, *args: Any) -> Any:
        return timers.run_in_stack(self.stack, fn, *args)

    def ack(self, answer: Any) -> None:
        """Acknowledge the column layout an answer carries, as the parent does on reading it."""
        arena = self.group.views["info_arena"]
        schema = getattr(answer, "info_schema", None)
        if schema is not None and arena is not None:
            ack_word(arena, 0)[0] = schema.version


def general_step(
    group: EnvGroup, seq: int, ship_timers: bool, actions: Any, with_arrays: bool
) -> StepResponse | None:
    """A step the way ``serve`` carries out a reset: ``_within``, then ``_answer``."""
    group.timers.calls += 1
    if actions is None:
        actions = group.views["actions"]
    infos = _within(group, "step", group.step, actions)
    writer = group.info_writer
    if writer is not None and not group.writes_info_columns:
        infos = writer.split(infos)
    return _answer(group, seq, infos, ship_timers, with_arrays)


def counts(node: timers.TimerNode | None) -> Any:
    """A timer tree's shape and call counts (times differ from run to run)."""
    if node is None:
        return None
    return node.count, {name: counts(child) for name, child in node.children.items()}


def comparable(answer: Any) -> Any:
    """An answer without what differs between two groups alike: its timer tree as counts,
    its per-env seconds as their shape, its column layout without its (random) version."""
    if not isinstance(answer, StepResponse):
        return answer
    arrays = answer.arrays
    if arrays is not None and arrays[4] is not None:
        arrays = (*arrays[:4], arrays[4].shape, arrays[5])
    schema = answer.info_schema
    return (
        answer.worker_index,
        answer.seq,
        answer.infos,
        answer.observations,
        counts(answer.timer_root),
        sorted(answer.gauges or ()),
        arrays,
        None if schema is None else schema.columns,
    )


def rows(group: EnvGroup) -> dict[str, Any]:
    """The group's rows of the batch arrays as they stand (copied), without what differs
    between two groups alike: the seconds, the ack word (a random layout version)."""
    out = {}
    for k, v in group.views.items():
        if k == "info_arena" and v is not None:
            out[k] = v[:, HEADER_BYTES:].copy()
        elif isinstance(v, np.ndarray) and k != "env_seconds":
            out[k] = v.copy()
    return out


@pytest.mark.parametrize("with_arrays", [False, True], ids=["shared-memory", "with-arrays"])
@pytest.mark.parametrize("columns", [True, False], ids=["info-columns", "no-columns"])
@pytest.mark.parametrize("text", [False, True], ids=["box-obs", "text-obs"])
def test_serve_step_answers_writes_and_times_as_the_general_path(
    text: bool, columns: bool, with_arrays: bool
) -> None:
    fast, slow = Built(text, columns), Built(text, columns)
    reset = Reset(1, (5, 6, 7), None, None, False)
    answers = [built.run(serve, built.group, reset, with_arrays) for built in (fast, slow)]
    assert_same(comparable(answers[0]), comparable(answers[1]), "reset")
    for built, answer in zip((fast, slow), answers, strict=True):
        built.ack(answer)
    rng = np.random.default_rng(0)
    answered = 0
    for t in range(STEPS):
        seq = t + 2
        ship = t % 5 == 4
        actions = rng.integers(0, 3, N_ENVS)
        # As a worker is handed them: in its rows of the actions array (None), or in the
        # command (the Ray actor).
        in_views = t % 2 == 0
        for built in (fast, slow):
            built.group.views["actions"][:] = actions
        sent = None if in_views else actions.copy()
        got = fast.run(serve_step, fast.group, seq, ship, sent, with_arrays)
        want = slow.run(general_step, slow.group, seq, ship, sent, with_arrays)
        answered += got is not None
        for built, answer in ((fast, got), (slow, want)):
            built.ack(answer)
        assert_same(comparable(got), comparable(want), f"answer to step {t}")
        assert_same(rows(fast.group), rows(slow.group), f"rows after step {t}")
        assert fast.group.timers.calls == slow.group.timers.calls
    # Both kinds of answer met where both can be: "nothing to say" (None) needs the
    # observations and the numeric infos in the arrays, and no rows asked for.
    assert answered > 0
    if columns and not text and not with_arrays:
        assert answered < STEPS
    fast_root, _ = fast.run(fast.group.take_timers)
    slow_root, _ = slow.run(slow.group.take_timers)
    assert counts(fast_root) == counts(slow_root)
    assert counts(fast_root)[1]["step"][1]["physics"][0] > 0  # env timers nest under step
