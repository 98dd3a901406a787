"""Numeric info values travel in shared memory, and the infos equal SyncVectorEnv's.

Bit for bit (keys, values, dtypes, ``_key`` masks) over episodes with autoresets, in
all three autoreset modes, on a MuJoCo env, an Atari env, an env whose info keys come
and go and change type halfway, single envs in ``RecordEpisodeStatistics``, hosted
VectorEnvs, ``caller_envs`` and Ray. Then the promises behind it: a MuJoCo step pickles
nothing (the workers write no bytes), a replaced worker's envs come back truncated
with their note, and a column layout lost with an answer is sent again.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from support.envs import assert_same
from support.equivalence import compare, local_only, sample_actions
from support.helpers import traffic

from envmgr import SubprocessEnvManager
from envmgr.envside.info_writer import InfoWriter
from envmgr.frontend.infos import InfoColumns, merge
from envmgr.frontend.results import RESTARTED_INFO_KEY
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.layout import Layout

pytestmark = pytest.mark.timeout(120)

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def mode_kwargs(mode: AutoresetMode) -> dict[str, Any]:
    # Disabled: the rollout resets finished envs itself.
    return {"autoreset_mode": mode, "reset_done_envs": mode == AutoresetMode.DISABLED}


class ShiftingInfoEnv(gym.Env):  # type: ignore[type-arg]
    """Infos that test every path: keys that come and go, a key that changes type halfway
    through an episode (so envs out of phase disagree in one batch), a key first seen
    late, Python and numpy scalars, arrays, ``np.bool_`` (an object array under
    ``_add_info``), strings and nested dicts (these pickle). A shape that changes is
    left to the writer's own test: SyncVectorEnv itself cannot batch two shapes."""

    observation_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, flip: bool = True) -> None:
        self.flip = flip
        self.t = 0
        self.length = 5

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(4, 10))  # envs fall out of phase
        return self._obs(), {"length": self.length, "x": float(self.np_random.uniform())}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.length], dtype=np.float64)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        t = self.t
        info: dict[str, Any] = {"t": t, "x": float(self.np_random.uniform()), "a": int(action)}
        if t % 2 == 0:
            info["even"] = True  # comes and goes
        if t >= 4:
            info["late"] = np.float32(t / 3)  # first seen late
        if self.flip:
            info["flip"] = t if t < 3 else t + 0.5  # int, then float
        info["vec"] = np.arange(3, dtype=np.int32) * t
        info["npbool"] = np.bool_(t % 3 == 0)
        if t % 3 == 0:
            info["name"] = f"s{t}"
        if t % 4 == 0:
            info["nested"] = {"deep": t, "half": t / 2}
        return self._obs(), float(action) - 0.5, t >= self.length, False, info


def half_cheetah() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("HalfCheetah-v5", max_episode_steps=12)


def pong() -> gym.Env:  # type: ignore[type-arg]
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", frameskip=1, max_episode_steps=9, obs_type="grayscale")


class _Timeless(gym.wrappers.RecordEpisodeStatistics):  # type: ignore[type-arg]
    """``RecordEpisodeStatistics`` whose ``episode["t"]`` (wall-clock seconds, never the
    same twice) is the episode's length instead; ``r`` and ``l`` are the wrapper's own."""

    def step(self, action: Any) -> Any:
        obs, reward, term, trunc, info = super().step(action)
        if "episode" in info:
            info["episode"]["t"] = float(info["episode"]["l"])
        return obs, reward, term, trunc, info


def cartpole_stats() -> gym.Env:  # type: ignore[type-arg]
    return _Timeless(gym.make("CartPole-v1", max_episode_steps=8))


# ------------------------------------------------------------------ equal to SyncVectorEnv


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_infos_that_come_go_and_change_type_match_sync(backend: Backend, mode: Any) -> None:
    expected = compare(backend, ShiftingInfoEnv, 2, 2, steps=30, **mode_kwargs(mode))
    steps = [r[5] for r in expected if r[0] == "step"]
    # The run really mixes an int and a float of "flip" in one batch, and masks "even".
    assert any(i["flip"].dtype == np.int64 and "_flip" in i and i["_flip"].all() for i in steps)
    assert any(i["flip"].dtype == np.float64 for i in steps)
    assert any(0 < i["_even"].sum() < 4 for i in steps if "_even" in i)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_mujoco_infos_match_sync(mode: Any) -> None:
    pytest.importorskip("mujoco")
    compare(Backend("local"), half_cheetah, 2, 2, steps=30, **mode_kwargs(mode))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_atari_infos_match_sync(mode: Any) -> None:
    pytest.importorskip("ale_py")
    compare(Backend("local"), pong, 2, 2, steps=22, **mode_kwargs(mode))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_record_episode_statistics_infos_match_sync(mode: Any) -> None:
    expected = compare(Backend("local"), cartpole_stats, 2, 2, steps=30, **mode_kwargs(mode))
    # At an episode's end (SameStep: inside final_info).
    steps = [r[5] for r in expected if r[0] == "step"]
    assert any("episode" in i or "episode" in i.get("final_info", {}) for i in steps)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_caller_envs_infos_match_sync(backend: Backend, mode: Any) -> None:
    local_only(backend, "caller_envs is the local manager's")
    compare(backend, [ShiftingInfoEnv] * 4, 2, None, steps=30, caller_envs=1, **mode_kwargs(mode))


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_hosted_vector_env_infos_match_a_flat_sync_vector_env(mode: AutoresetMode) -> None:
    """Hosted SyncVectorEnvs' infos (numeric arrays into columns, the rest per env) equal
    one flat SyncVectorEnv's: bools stay bool arrays, absent keys stay absent."""
    env = functools.partial(ShiftingInfoEnv, flip=False)
    n = 4
    flat = SyncVectorEnv([env] * n, autoreset_mode=mode)
    rng = np.random.default_rng(5)
    actions = [rng.integers(0, 2, n) for _ in range(30)]
    expected = [flat.reset(seed=3)] + [flat.step(a) for a in actions]
    flat.close()

    def blocks(k: int) -> SyncVectorEnv:
        return SyncVectorEnv([env] * k, autoreset_mode=mode)

    with SubprocessEnvManager(None, 2, vector_fn=blocks, num_envs=n) as envs:
        got = [envs.reset(seed=3)] + [envs.step(a) for a in actions]
    for t, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(tuple(g), tuple(e), path=f"result {t}")
    assert any(r[-1]["even"].dtype == np.bool_ for r in expected[1:] if "even" in r[-1])


def _with_masks(infos: dict[str, Any]) -> dict[str, Any]:
    """A vector info dict whose keys have no ``_key`` masks, with an all-set one each."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        out[key] = value
        out.setdefault(f"_{key}", np.ones(len(value), np.bool_))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_hosted_ale_vector_env_keeps_its_infos(workers: int) -> None:
    """ale-py's own batched Atari env (``vectorization_mode="vector_entry_point"``) gives
    its infos (``lives``, ``frame_number``, ...) as arrays without ``_key`` masks; the
    hosted path dropped every one of them. Hosted in envmgr, each group's batch equals
    the same env run alone (seeded as envmgr seeds the group), infos with a mask of all
    envs added, concatenated in env order."""
    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)
    n, per = 4, 4 // workers
    steps = 25

    def native(k: int) -> Any:
        return gym.make_vec("ALE/Pong-v5", num_envs=k, vectorization_mode="vector_entry_point")

    alone = [native(per) for _ in range(workers)]
    actions = [np.random.default_rng(t).integers(0, 6, n) for t in range(steps)]
    try:
        parts = [[env.reset(seed=7 + g * per)] for g, env in enumerate(alone)]
        for a in actions:
            for g, env in enumerate(alone):
                parts[g].append(env.step(a[g * per : (g + 1) * per]))
    finally:
        for env in alone:
            env.close()
    with envmgr_make_vec(n, workers) as envs:
        got = [envs.reset(seed=7)] + [envs.step(a) for a in actions]
    for t, result in enumerate(got):
        rows = [p[t] for p in parts]
        for j in range(len(result) - 1):  # observations, rewards, terminations, truncations
            alone_j = np.concatenate([r[j] for r in rows])
            if j == 1:  # ale-py's rewards are int32; a batch's rewards are float64, as Sync's
                alone_j = alone_j.astype(np.float64)
            assert_same(result[j], alone_j, path=f"{t}[{j}]")
        infos = [_with_masks(r[-1]) for r in rows]
        want = {k: np.concatenate([i[k] for i in infos]) for k in infos[0]}
        assert_same(result[-1], want, path=f"{t} infos")
    assert {"lives", "frame_number", "_lives"} <= got[-1][-1].keys()


def envmgr_make_vec(n: int, workers: int) -> Any:
    from envmgr import make

    mode = "vector_entry_point"
    return make("ALE/Pong-v5", num_envs=n, n_workers=workers, vectorization_mode=mode)


def _rows_of(infos: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """A vector info dict cut down to envs ``ids``: the keys one of them has."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos[f"_{key}"][ids]
        if mask.any():
            out[key] = _rows_of(value, ids) if isinstance(value, dict) else value[ids]
            out[f"_{key}"] = mask
    return out


@pytest.mark.parametrize("env", ["shifting", "mujoco"])
def test_recv_of_one_worker_gives_its_rows_of_the_sync_infos(backend: Backend, env: str) -> None:
    """First-ready: each ``recv`` of one worker's envs gives the infos SyncVectorEnv gives
    those envs, the keys one of them has and no others (columns read for that worker
    alone; steps where an env pickles a string or a nested dict take the general way)."""
    if env == "mujoco":
        pytest.importorskip("mujoco")
    fn = half_cheetah if env == "mujoco" else functools.partial(ShiftingInfoEnv, flip=False)
    n = 4
    sync = SyncVectorEnv([fn] * n)
    try:
        actions = sample_actions(sync.single_action_space, n, 24)
        sync.reset(seed=3)
        expected = [sync.step(a)[4] for a in actions]
    finally:
        sync.close()
    seen: set[str] = set()
    with backend([fn] * n, 2) as envs:
        envs.reset(seed=3)
        for t, a in enumerate(actions):
            envs.send(a)
            for _ in range(2):
                *_, infos, ids = envs.recv(batch_size=2)
                assert ids.tolist() in ([0, 1], [2, 3])
                assert_same(infos, _rows_of(expected[t], ids), path=f"step {t} envs {ids}")
                seen |= set(infos)
    if env == "shifting":  # keys came and went between the two workers' rows
        assert {"even", "late", "name", "nested"} <= seen


# ------------------------------------------------------------------ the promises behind it


def test_a_mujoco_step_pickles_nothing() -> None:
    """Four numeric info keys every step, and the workers write nothing per step but the
    one-byte wake-up of a sleeping parent: the values are in shared memory (pickled,
    each worker's answer was about 400 bytes a step)."""
    pytest.importorskip("mujoco")
    with SubprocessEnvManager(half_cheetah, 2, 2, context="fork", timer_interval=1e9) as envs:
        envs.reset(seed=0)
        actions = [envs.action_space.sample() for _ in range(40)]
        for a in actions[:5]:  # layouts settle (reset and first step add keys)
            _, _, _, _, infos = envs.step(a)
        _, written = traffic(envs, actions[5:])
        _, _, _, _, infos = envs.step(actions[0])
    # Two workers finishing together may both ring: at most a byte per worker per step.
    assert written <= 2 * 35, f"workers wrote {written} bytes in 35 steps"
    assert {"x_position", "x_velocity", "reward_forward", "reward_ctrl"} <= infos.keys()
    assert infos["reward_ctrl"].dtype == np.float32  # the env's own np.float32


def test_a_replaced_worker_comes_back_truncated_and_its_columns_start_afresh(
    backend: Backend,
) -> None:
    with backend(ShiftingInfoEnv, 2, 2, max_restarts=1) as envs:
        envs.reset(seed=0)
        for _ in range(6):
            envs.step(np.ones(4, dtype=np.int64))
        backend.kill(envs, 1)
        _, _, _, trunc, infos = envs.step(np.ones(4, dtype=np.int64))
        assert trunc[2:].all()
        assert infos[f"_{RESTARTED_INFO_KEY}"].tolist() == [False, False, True, True]
        # The replacement was reset: its envs report their reset info (no "t"); worker 0's
        # envs a step's or an autoreset's; nothing of the dead worker's columns is read.
        assert infos["_t"][2:].tolist() == [False, False]
        assert infos["_length"][2:].tolist() == [True, True]
        assert (infos["_t"][:2] ^ infos["_length"][:2]).all()
        # Next-step mode: truncated envs reset at the next step, then step afresh.
        envs.step(np.ones(4, dtype=np.int64))
        _, _, _, _, infos = envs.step(np.ones(4, dtype=np.int64))
        assert infos["t"][2:].tolist() == [1, 1]
        assert infos["_t"][2:].all()


def test_a_column_layout_lost_with_an_answer_is_sent_again() -> None:
    """The writer keeps saying its layout until the parent acknowledges that version in
    shared memory: an answer dropped (Ctrl-C) cannot leave the parent reading stale."""
    arena = np.zeros((4, ROW_BYTES), dtype=np.uint8)
    layout = Layout.of([2, 2])
    reader = InfoColumns(arena, layout)
    writer = InfoWriter(arena[2:4])  # group 1
    assert writer.unacked  # a fresh group: not yet read with its (empty) layout
    reader.update(1, writer.schema())
    assert not writer.unacked
    assert writer.split([(0, {"x": 1.5}), (1, {"x": 2.5, "s": "text"})]) == [(1, {"s": "text"})]
    assert writer.unacked  # "x" got a column: the answer carrying it is dropped ...
    assert writer.split([(1, {"x": 4.0})]) == []
    assert writer.unacked  # ... so the next answer carries it again
    reader.update(1, writer.schema())
    assert not writer.unacked
    columns, python, mixed = reader.read_columns(None)
    assert columns["x"][0].tolist() == [0.0, 0.0, 0.0, 4.0]
    assert columns["x"][1].tolist() == [False, False, False, True]
    assert python == {"x": True} and mixed == {}
    # A key whose type changes pickles from then on, and the layout changes again.
    assert writer.split([(0, {"x": "now a string"})]) == [(0, {"x": "now a string"})]
    assert writer.unacked
    reader.update(1, writer.schema())
    assert reader.read_columns(None)[0] == {}
    assert writer.split([(1, {"x": 3.0})]) == [(1, {"x": 3.0})]  # and stays pickled
    # So does an array whose shape changes.
    v = np.arange(3)
    assert writer.split([(0, {"v": v})]) == []
    assert writer.split([(0, {"v": np.arange(4)})])[0][1]["v"].shape == (4,)
    assert "v" not in [c.key for c in writer.schema().columns]


def test_a_row_too_full_for_a_key_pickles_it() -> None:
    arena = np.zeros((2, ROW_BYTES), dtype=np.uint8)
    writer = InfoWriter(arena)
    big = np.zeros(ROW_BYTES // 8, dtype=np.float64)  # cannot fit beside the ack word
    small = np.zeros(3, dtype=np.float64)
    left = writer.split([(0, {"big": big, "small": small}), (1, {"small": small})])
    assert [(i, sorted(d)) for i, d in left] == [(0, ["big"])]
    assert [c.key for c in writer.schema().columns] == ["small"]


def test_vector_infos_without_masks_belong_to_every_env() -> None:
    """A hosted VectorEnv's key without its ``_key`` mask (ale-py, EnvPool) is every env's,
    in shared memory and pickled alike: a numeric array with a row per env takes a
    column with every mask byte set, any other array is split by rows, a nested dict
    recursed, and a value with no row per env is the same for each env. A masked key
    beside them is read as before."""
    from envmgr.protocol.trees import unbatch_infos

    lives = np.array([3, 2, 1], np.int32)
    names = np.array(["a", "b", "c"], dtype=object)
    infos = {
        "lives": lives,
        "names": names,
        "players": {"id": np.array([0.5, 1.5, 2.5])},
        "level": "one",
        "hit": np.array([1.0, 0.0, 2.0]),
        "_hit": np.array([True, False, True]),
    }
    arena = np.zeros((3, ROW_BYTES), dtype=np.uint8)
    writer = InfoWriter(arena)
    left = writer.split_vector(infos)
    assert [c.key for c in writer.schema().columns] == ["lives", "hit"]
    assert _read_back(arena, writer) == {
        "lives": ([3, 2, 1], [True] * 3),
        "hit": ([1.0, 0.0, 2.0], [True, False, True]),
    }
    expected = [
        (i, {"names": names[i], "players": {"id": [0.5, 1.5, 2.5][i]}, "level": "one"})
        for i in range(3)
    ]
    assert left == expected
    # Without shared memory (no writer), every key is split per env the same way.
    pickled = unbatch_infos(infos, 3)
    assert [sorted(d) for d in pickled] == [
        ["hit", "level", "lives", "names", "players"],
        ["level", "lives", "names", "players"],
        ["hit", "level", "lives", "names", "players"],
    ]
    assert [d["lives"] for d in pickled] == [3, 2, 1]
    assert [d["players"] for d in pickled] == [{"id": 0.5}, {"id": 1.5}, {"id": 2.5}]


def _read_back(arena: np.ndarray, writer: InfoWriter) -> dict[str, tuple[list[Any], list[bool]]]:
    reader = InfoColumns(arena, Layout.of([arena.shape[0]]))
    reader.update(0, writer.schema())
    columns, _, _ = reader.read_columns(None)
    return {k: (v.tolist(), m.tolist()) for k, (v, m) in columns.items()}


def test_whole_batches_of_the_same_keys_and_any_change_from_them_read_back_alike() -> None:
    """Every env saying the same keys is written a key at a time; a batch that differs in
    any way (an env without a key, a changed type for some or all envs, an int beyond
    int64) is written env by env, with the same result a fresh writer would give."""
    arena = np.zeros((3, ROW_BYTES), dtype=np.uint8)
    writer = InfoWriter(arena)
    same = [(i, {"x": float(i), "n": np.int32(i)}) for i in range(3)]
    assert writer.split(same) == []  # lays out the columns
    assert writer.split([(i, {"x": 10.0 + i, "n": np.int32(7)}) for i in range(3)]) == []
    assert _read_back(arena, writer) == {
        "x": ([10.0, 11.0, 12.0], [True] * 3),
        "n": ([7] * 3, [True] * 3),
    }
    # One env without "n": its row reads zero and unmasked.
    gap = [(0, {"x": 1.0, "n": np.int32(1)}), (1, {"x": 2.0}), (2, {"x": 3.0, "n": np.int32(3)})]
    assert writer.split(gap) == []
    assert _read_back(arena, writer)["n"] == ([1, 0, 3], [True, False, True])
    # Back to whole batches: the mask is set again.
    assert writer.split(same) == []
    assert _read_back(arena, writer)["n"] == ([0, 1, 2], [True] * 3)
    # Every env changes "x"'s type at once: it pickles from then on.
    ints = [(i, {"x": i, "n": np.int32(i)}) for i in range(3)]
    assert writer.split(ints) == [(i, {"x": i}) for i in range(3)]
    assert "x" not in [c.key for c in writer.schema().columns]
    # Python ints in a column, then one beyond int64 in every env: pickled, intact.
    writer = InfoWriter(arena)
    assert writer.split([(i, {"k": i}) for i in range(3)]) == []
    huge = [(i, {"k": 2**70 + i}) for i in range(3)]
    assert writer.split(huge) == huge
    assert [c.key for c in writer.schema().columns] == []


def test_a_batch_written_in_one_go_falls_back_on_any_difference_a_key_at_a_time() -> None:
    """Scalar columns are written for the whole batch at once; an env that swaps a key for
    another (same count), adds one, or gives one value of another type is written the
    general way, with the same result."""
    arena = np.zeros((2, ROW_BYTES), dtype=np.uint8)
    writer = InfoWriter(arena)
    assert writer.split([(i, {"a": float(i), "b": i, "c": np.int32(i)}) for i in range(2)]) == []
    assert (
        writer.split([(i, {"a": 5.0 + i, "b": 7 * i, "c": np.int32(-i)}) for i in range(2)]) == []
    )
    assert _read_back(arena, writer) == {
        "a": ([5.0, 6.0], [True, True]),
        "b": ([0, 7], [True, True]),
        "c": ([0, -1], [True, True]),
    }
    # Env 1 says "d" in place of "c": "d" gets a column, env 1's "c" reads zero, unmasked.
    swapped = [(0, {"a": 1.0, "b": 1, "c": np.int32(1)}), (1, {"a": 2.0, "b": 2, "d": 2.5})]
    assert writer.split(swapped) == []
    got = _read_back(arena, writer)
    assert got["c"] == ([1, 0], [True, False]) and got["d"] == ([0.0, 2.5], [False, True])
    # One value of another type: that key pickles from then on, the others stay columns.
    odd = [
        (0, {"a": 3.0, "b": 3, "c": np.int32(3), "d": 0.5}),
        (1, {"a": 4, "b": 4, "c": np.int32(4), "d": 1.5}),
    ]
    assert writer.split(odd) == [(0, {"a": 3.0}), (1, {"a": 4})]
    assert _read_back(arena, writer) == {
        "b": ([3, 4], [True, True]),
        "c": ([3, 4], [True, True]),
        "d": ([0.5, 1.5], [True, True]),
    }
    # A single column is a block too.
    one = InfoWriter(np.zeros((2, ROW_BYTES), dtype=np.uint8))
    assert one.split([(0, {"lives": 3}), (1, {"lives": 5})]) == []
    assert one.split([(0, {"lives": 2}), (1, {"lives": 4})]) == []
    assert _read_back(one.arena, one) == {"lives": ([2, 4], [True, True])}


class _Batch(gym.vector.VectorEnv):  # type: ignore[type-arg]
    """Just enough of a VectorEnv for its ``_add_info`` (which reads ``num_envs``)."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


def test_groups_that_lay_out_their_columns_apart_read_back_as_add_info() -> None:
    """Two groups that met the same keys in another order (so at other offsets) cannot
    share one whole-batch view per key; the parent then reads each group's rows through
    the group's own views, and gets what ``_add_info`` builds for the same values."""
    layout = Layout.of([2, 3])
    arena = np.zeros((layout.num_envs, ROW_BYTES), dtype=np.uint8)
    reader = InfoColumns(arena, layout)
    pairs: list[tuple[int, dict[str, Any]]] = []
    for g, keys in enumerate([("a", "b"), ("b", "a", "c")]):
        start, size = layout.starts[g], layout.sizes[g]
        writer = InfoWriter(arena[start : start + size])
        local = [
            (i, {k: np.float64(10 * (start + i) + j) for j, k in enumerate(keys)})
            for i in range(size)
        ]
        if g == 1:
            del local[1][1]["c"]  # a gap: that row reads zero, unmasked
        assert writer.split(local) == []
        reader.update(g, writer.schema())
        pairs += [(start + i, info) for i, info in local]
    assert reader._plan is None  # the offsets differ: this is the per-group path
    add_info = _Batch(layout.num_envs)._add_info
    expected: dict[str, Any] = {}
    for env, info in pairs:
        add_info(expected, info, env)
    got = merge(reader.read_columns(None), (), layout.num_envs, add_info)
    assert_same(got, expected)
    # One group's rows alone, zero elsewhere (as for first-ready's recv of some groups).
    alone = merge(reader.read_columns([1]), (), layout.num_envs, add_info)
    assert alone["_a"].tolist() == [False, False, True, True, True]
    assert alone["c"].tolist() == [0.0, 0.0, 22.0, 0.0, 42.0]
