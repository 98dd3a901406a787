"""Multi-agent envs side by side: envmgr's ``make_parallel`` against the serial loop, the
machine's ceiling, SuperSuit and PufferLib, on PettingZoo ``ParallelEnv``s.

Usage (from the repository root)::

    python -m benchmarks.suites.multiagent                   # the full run, about 15 minutes
    python -m benchmarks.suites.multiagent --quick           # smoke run: 1 round, 0.3 s each
    python -m benchmarks.suites.multiagent --envs battle --n-envs 8 --impls serial,ceiling,envmgr

The envs (``--envs``), each at 8 and 32 envs (``spread-3`` also at 16) unless ``--n-envs``:

* ``spread-3``, ``spread-10``: MPE2 ``simple_spread_v3`` with ``N=3`` / ``N=10`` agents;
* ``battle``: MAgent2 ``battle_v4`` at ``map_size=45``: 162 agents, 13x13x5 float32
  observations, agents die;
* ``kaz``: PettingZoo's Knights Archers Zombies (v11, ``obs_method="vector"``), agents die;
* ``synthetic``: :class:`CheapAgents` below, 16 agents and a few microseconds per step.

The implementations (``--impls``), ``n`` envs in all:

* ``serial``: :class:`SerialRows`, one process stepping every env and packing its agent
  dicts into arrays as envmgr does (an obs row per agent slot, rewards, flags, zeros for
  absent agents, next-step autoreset);
* ``ceiling``: the same loop over ``n / 2`` envs in each of two processes at once, with no
  communication; its rate is their summed rate (the most two processes can do here);
* ``supersuit``: ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), n, num_cpus=2,
  base_class="gymnasium")``, with ``black_death_v3`` first where agents die;
* ``puffer``, ``puffer-async``: PufferLib's ``Multiprocessing`` backend over
  ``PettingZooPufferEnv``, 2 workers, whole batches (``batch_size=n``), or half batches
  (``batch_size=n/2``: one worker's envs are handed back while the other steps);
  ``puffer-1w``: one worker, whole batches (its workers and its parent all spin, so on
  2 cores one worker may beat two); ``puffer-copy`` (not run by default): the half
  batches with ``zero_copy=False``;
* ``envmgr``: ``make_parallel(env_fn, n)`` (its default workers);
  ``envmgr-caller``: ``make_parallel(env_fn, n, n_workers=1, caller_envs=n // 2)``.

The method: every measurement runs in a fresh interpreter (this module with ``--child``),
built, reset with seed 0, warmed up and then timed for ``--seconds`` of random actions
drawn once per configuration. Rounds are interleaved (each round measures every
implementation once per configuration, in an order that rotates), and ratios are taken
within a round: reported are the median over ``--rounds`` and the min-max. A peer that
raises is a row with its error; one that crashes is a row with the signal. Agent-steps are
agent rows per batch (dead agents' rows included, as every implementation here keeps them).

For envmgr, after the timed window and outside it, a short window (under the manager's
``timer_interval``, starting at a timer flush, so no timer shipment falls in it; bytes are
counted from the third step after the flush, once the flush's own traffic is over) measures:

* the workers' packing per live agent-step: the ``agents.pack`` node under
  ``step/env.step`` of the merged timer tree (``workers/worker_root``);
* the parent's unpacking per live agent-step: ``AgentVectorEnv.step`` minus the
  ``manager.step`` inside it;
* bytes pickled per batch: the workers' ``/proc/<pid>/io`` ``wchar`` minus one wake-up
  byte per batch (two workers finishing at once may both write it, so up to one byte per
  batch is wake-ups, never a pickle of tens of bytes), and ``rchar`` per batch (which
  counts file reads too: KAZ loads sprites as zombies appear); beside them, the bytes
  written per batch over the whole timed window, timer shipments included.

Writes ``multiagent.json`` and ``multiagent.txt`` (``quick.*`` with ``--quick``) to
``--out`` (default ``benchmarks/results/multiagent/``) with the machine and commit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

import numpy as np
from pettingzoo import ParallelEnv

#: The repository root (found, not counted: this file may move within benchmarks/).
REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())

ENVS = ["spread-3", "spread-10", "battle", "kaz", "synthetic"]
#: Envs whose agents die before the episode ends (SuperSuit needs ``black_death_v3``).
DYING = {"battle", "kaz"}
ENV_LABELS = {
    "spread-3": "MPE2 simple_spread_v3 N=3",
    "spread-10": "MPE2 simple_spread_v3 N=10",
    "battle": "MAgent2 battle_v4 map_size=45",
    "kaz": "KAZ v11 obs_method=vector",
    "synthetic": "synthetic, 16 agents",
}
DEFAULT_N_ENVS = {"spread-3": [8, 16, 32]}
IMPLS = [
    "serial",
    "ceiling",
    "supersuit",
    "puffer",
    "puffer-async",
    "puffer-1w",
    "puffer-copy",
    "envmgr",
    "envmgr-caller",
]
DEFAULT_IMPLS = [i for i in IMPLS if i != "puffer-copy"]
ENVMGR_IMPLS = {"envmgr", "envmgr-caller"}
PUFFER_IMPLS = {"puffer", "puffer-async", "puffer-1w", "puffer-copy"}
#: Action batches drawn per configuration, walked cyclically.
N_ACTION_BATCHES = 64
#: Longest a child may take beyond its warm-up and timed seconds.
CHILD_OVERHEAD_TIMEOUT = 240.0
QUICK = {"rounds": 1, "seconds": 0.3, "warmup": 0.1, "profile": 0.1}
QUICK_N_ENVS = [4]


# ============================================================================ the envs


class CheapAgents(ParallelEnv):  # type: ignore[misc]
    """16 agents, an 8-float observation each, 4 actions, 64-step episodes; numpy only.

    A step costs a few microseconds (five dicts of 16 entries), so what a benchmark
    measures on it is the vectorization's own cost per agent.
    """

    metadata = {"name": "cheap_agents_v0"}
    render_mode = None

    def __init__(self, n_agents: int = 16, episode: int = 64) -> None:
        import gymnasium as gym

        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self._obs_space = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
        self._act_space = gym.spaces.Discrete(4)
        self._state = np.zeros((n_agents, 8), np.float32)
        self._episode = episode
        self._t = 0
        self._zeros = dict.fromkeys(self.possible_agents, 0.0)
        self._false = dict.fromkeys(self.possible_agents, False)
        self._true = dict.fromkeys(self.possible_agents, True)
        self._no_info: dict[str, dict[str, Any]] = {a: {} for a in self.possible_agents}

    def observation_space(self, agent: str) -> Any:
        return self._obs_space

    def action_space(self, agent: str) -> Any:
        return self._act_space

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.agents = list(self.possible_agents)
        self._t = 0
        self._state[:] = 0.0 if seed is None else (seed % 7) / 7.0
        return dict(zip(self.agents, self._state.copy(), strict=True)), dict(self._no_info)

    def step(self, actions: dict[str, Any]) -> Any:
        self._t += 1
        self._state[:, 0] = self._t / self._episode
        obs = dict(zip(self.agents, self._state.copy(), strict=True))
        done = self._t >= self._episode
        if done:
            self.agents = []
        trunc = self._true if done else self._false
        return obs, dict(self._zeros), dict(self._false), dict(trunc), dict(self._no_info)


def make_env(name: str) -> Any:
    """One ``ParallelEnv`` of benchmark env ``name``."""
    if name.startswith("spread-"):
        from mpe2 import simple_spread_v3

        return simple_spread_v3.parallel_env(N=int(name.split("-")[1]))
    if name == "battle":
        from magent2.environments import battle_v4

        return battle_v4.parallel_env(map_size=45)
    if name == "kaz":
        from pettingzoo.butterfly import knights_archers_zombies_v11

        return knights_archers_zombies_v11.parallel_env(obs_method="vector")
    if name == "synthetic":
        return CheapAgents()
    raise ValueError(f"unknown env {name!r}; choose from {', '.join(ENVS)}")


def sample_actions(name: str, n: int, seed: int) -> np.ndarray:
    """``(N_ACTION_BATCHES, n * agents)`` random actions, rows env-major, slots in
    ``possible_agents`` order (every env here has one Discrete action space)."""
    env = make_env(name)
    agents = list(env.possible_agents)
    space = env.action_space(agents[0])
    env.close()
    rng = np.random.default_rng(seed)
    return rng.integers(0, int(space.n), size=(N_ACTION_BATCHES, n * len(agents)))


# ============================================================================ the serial loop


class SerialRows:
    """``n`` ParallelEnvs stepped in this process, packed as envmgr packs them.

    Row ``k * S + s`` is env ``k``'s agent ``possible_agents[s]``: its observation,
    reward and flags when it is live or ended on this step, zeros otherwise; an env
    whose agents are all gone is reset at its next step. Infos are dropped.
    """

    def __init__(self, env_fn: Callable[[], Any], n: int) -> None:
        self.envs = [env_fn() for _ in range(n)]
        agents = list(self.envs[0].possible_agents)
        self.slot = {a: s for s, a in enumerate(agents)}
        space = self.envs[0].observation_space(agents[0])
        s = len(agents)
        self.obs = np.zeros((n, s, *space.shape), space.dtype)
        self.rewards = np.zeros((n, s))
        self.terms = np.zeros((n, s), np.bool_)
        self.truncs = np.zeros((n, s), np.bool_)
        self.active = np.zeros((n, s), np.bool_)
        self.ended = [False] * n
        self.rows = n * s

    def reset(self, seed: int | None = None) -> None:
        for k, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + k)
            self._write_reset(k, obs)

    def _write_reset(self, k: int, obs: dict[str, Any]) -> None:
        self._clear(k)
        for a, o in obs.items():
            s = self.slot[a]
            self.obs[k, s] = o
            self.active[k, s] = True
        self.ended[k] = False

    def _clear(self, k: int) -> None:
        self.obs[k] = 0
        self.rewards[k] = 0.0
        self.terms[k] = False
        self.truncs[k] = False
        self.active[k] = False

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        per_env = actions.reshape(len(self.envs), -1)
        slot, obs_rows, rewards = self.slot, self.obs, self.rewards
        for k, env in enumerate(self.envs):
            if self.ended[k]:
                self._write_reset(k, env.reset()[0])
                continue
            row = per_env[k]
            obs, rew, term, trunc, _ = env.step({a: row[slot[a]] for a in env.agents})
            self._clear(k)
            live = set(env.agents)
            for a, o in obs.items():
                t, u = term.get(a, False), trunc.get(a, False)
                if not (t or u or a in live):
                    continue
                s = slot[a]
                obs_rows[k, s] = o
                rewards[k, s] = rew.get(a, 0.0)
                self.terms[k, s], self.truncs[k, s], self.active[k, s] = t, u, True
            self.ended[k] = not live
        n = self.rows
        shape = (n, *self.obs.shape[2:])
        flags = (self.terms.reshape(n), self.truncs.reshape(n), self.active.reshape(n))
        return (self.obs.reshape(shape), rewards.reshape(n), *flags)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class CeilingShare:
    """One ceiling process: a :class:`SerialRows` over its share, its own action columns."""

    def __init__(self, env: str, n: int, seed: int, actions: np.ndarray) -> None:
        self.loop = SerialRows(partial(make_env, env), n)
        self.loop.reset(seed=seed)
        self.actions = actions
        self.k = 0

    def run(self, seconds: float) -> dict[str, float]:
        from envmgr.tune.ceiling import run_for

        batches, elapsed = run_for(self.loop.step, list(self.actions), self.k, seconds)
        self.k += batches
        return {"batches": batches, "seconds": elapsed, "rows": self.loop.rows}

    def close(self) -> None:
        self.loop.close()


class Ceiling:
    """Two processes (``processes``), each :class:`CeilingShare` of the envs, run at once."""

    def __init__(self, env: str, n: int, actions: np.ndarray, processes: int = 2) -> None:
        from envmgr.tune.ceiling import BlockProcesses

        sizes = [n // processes + (1 if p < n % processes else 0) for p in range(processes)]
        per_env = actions.shape[1] // n
        starts = np.cumsum([0, *sizes])
        builders = [
            partial(CeilingShare, env, size, int(a), actions[:, a * per_env : (a + size) * per_env])
            for a, size in zip(starts, sizes, strict=False)
        ]
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self.processes = BlockProcesses(mp.get_context(method), builders, name="ma-ceiling")
        self.envs_per_batch = n
        self.rows_per_batch = actions.shape[1]

    def timed(self, seconds: float) -> dict[str, Any]:
        self.processes.post("run", seconds)
        results = self.processes.gather(seconds + 60.0, "step")
        rows = sum(r["batches"] * r["rows"] / r["seconds"] for r in results)
        per_env = self.rows_per_batch / self.envs_per_batch
        return {
            "agent_steps_per_second": rows,
            "env_steps_per_second": rows / per_env,
            "batches": min(r["batches"] for r in results),
            "seconds": max(r["seconds"] for r in results),
            "per_process": results,
        }

    def close(self) -> None:
        self.processes.close()


# ============================================================================ the peers


class SuperSuitVec:
    """SuperSuit's concatenated vector env of ``n`` copies, two processes."""

    def __init__(self, env: str, n: int) -> None:
        import supersuit as ss

        one = make_env(env)
        if env in DYING:
            one = ss.black_death_v3(one)
        self.vec = ss.concat_vec_envs_v1(
            ss.pettingzoo_env_to_vec_env_v1(one), n, num_cpus=2, base_class="gymnasium"
        )

    def reset(self, seed: int) -> None:
        self.vec.reset(seed=seed)

    def step(self, actions: np.ndarray) -> Any:
        return self.vec.step(actions)

    def close(self) -> None:
        self.vec.close()


class PufferVec:
    """PufferLib's ``Multiprocessing`` backend over ``PettingZooPufferEnv``.

    With ``batch_size < n`` a step hands the actions of the envs it last returned and
    takes the next ready ones (PufferLib's ``send``/``recv``).
    """

    def __init__(self, env: str, n: int, workers: int, batch_size: int, zero_copy: bool) -> None:
        import pufferlib.emulation
        import pufferlib.vector

        def creator(buf: Any = None, seed: int = 0) -> Any:
            return pufferlib.emulation.PettingZooPufferEnv(
                env_creator=partial(make_env, env), buf=buf, seed=seed
            )

        # overwork=True: PufferLib refuses more workers than physical cores, and a
        # 2-vCPU VM may report one.
        self.vec = pufferlib.vector.make(
            creator,
            backend=pufferlib.vector.Multiprocessing,
            num_envs=n,
            num_workers=workers,
            batch_size=batch_size,
            zero_copy=zero_copy,
            overwork=True,
        )
        self.rows = int(self.vec.agents_per_batch)
        self.dtype = self.vec.action_space.dtype
        self.envs_per_batch = batch_size

    def reset(self, seed: int) -> None:
        self.vec.async_reset(seed)
        self.vec.recv()

    def step(self, actions: np.ndarray) -> Any:
        self.vec.send(actions[: self.rows].astype(self.dtype, copy=False))
        return self.vec.recv()

    def close(self) -> None:
        self.vec.close()


def build(impl: str, env: str, n: int, actions: np.ndarray) -> Any:
    """Implementation ``impl`` over ``n`` copies of ``env``."""
    if impl == "serial":
        return SerialRows(partial(make_env, env), n)
    if impl == "ceiling":
        return Ceiling(env, n, actions)
    if impl == "supersuit":
        return SuperSuitVec(env, n)
    if impl in PUFFER_IMPLS:
        workers = 1 if impl == "puffer-1w" else 2
        batch = n // 2 if impl in ("puffer-async", "puffer-copy") else n
        return PufferVec(env, n, workers, batch, zero_copy=impl != "puffer-copy")
    import envmgr

    if impl == "envmgr":
        return envmgr.make_parallel(partial(make_env, env), n)
    if impl == "envmgr-caller":
        return envmgr.make_parallel(partial(make_env, env), n, n_workers=1, caller_envs=n // 2)
    raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}")


def skip_reason(impl: str, n: int) -> str | None:
    """Why ``impl`` cannot run ``n`` envs, or ``None``."""
    if impl in ("ceiling", "envmgr-caller", "puffer", "puffer-async", "puffer-copy") and n % 2:
        return "needs an even number of envs (two processes)"
    if impl in ("puffer-async", "puffer-copy") and n % 4:
        return "half batches over 2 workers need n a multiple of 4"
    return None


# ============================================================================ one measurement


def io_bytes(pids: Sequence[int]) -> tuple[int, int]:
    """``(rchar, wchar)`` summed over ``pids``: bytes they moved through system calls."""
    read = written = 0
    for pid in pids:
        fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        read += int(fields["rchar"])
        written += int(fields["wchar"])
    return read, written


def pack_seconds() -> float:
    """Flush every worker's timers; the merged ``agents.pack`` seconds so far."""
    from envmgr import timers

    node: dict[str, Any] | None = timers.get_timer_tree()
    for name in ("workers", "worker_root", "step", "env.step", "agents.pack"):
        node = (node or {}).get("children", {}).get(name)
    return float(node["total"]) if node else 0.0


#: Steps after a timer flush before bytes are counted: the flush's own traffic (the next
#: command after it travels by pipe) is over by then.
SETTLE_BATCHES = 3


def profile_envmgr(vec: Any, actions: np.ndarray, k: int, seconds: float) -> dict[str, Any]:
    """Packing per live agent and bytes per batch, over ``seconds`` of steps (see the module
    docstring); the steps here are outside the timed window."""
    manager = vec.manager
    pids = list(manager.worker_pids)
    inner = [0.0]
    manager_step = manager.step

    def timed_manager_step(a: Any) -> Any:
        t0 = perf_counter()
        try:
            return manager_step(a)
        finally:
            inner[0] += perf_counter() - t0

    outer = 0.0
    live = batches = 0
    io0 = (0, 0)
    pack0 = pack_seconds()  # a flush: no timer shipment is due for timer_interval from here
    deadline = perf_counter() + seconds
    manager.step = timed_manager_step  # the instance attribute shadows the method
    try:
        while batches < 2 * SETTLE_BATCHES or perf_counter() < deadline:
            if batches == SETTLE_BATCHES:
                io0 = io_bytes(pids)
            t0 = perf_counter()
            out = vec.step(actions[(k + batches) % len(actions)])
            outer += perf_counter() - t0
            live += int(np.count_nonzero(out[4]["active"]))
            batches += 1
    finally:
        del manager.step
    read, written = (b - a for a, b in zip(io0, io_bytes(pids), strict=True))
    pack = pack_seconds() - pack0
    counted = batches - SETTLE_BATCHES
    return {
        "profile_batches": batches,
        "live_agents_per_batch": live / batches,
        "worker_pack_us_per_agent": pack / max(live, 1) * 1e6,
        "parent_unpack_us_per_agent": (outer - inner[0]) / max(live, 1) * 1e6,
        "pickled_bytes_per_batch": max(0, written - counted) / counted,
        "written_bytes_per_batch": written / counted,
        "read_bytes_per_batch": read / counted,
        "n_workers": len(pids),
    }


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, reset, warm up and time one implementation: the body of a ``--child`` run."""
    from envmgr.tune.ceiling import run_for

    env, n, impl, seconds = spec["env"], spec["n_envs"], spec["impl"], spec["seconds"]
    actions = sample_actions(env, n, 1000 + n)
    t0 = perf_counter()
    vec = build(impl, env, n, actions)
    try:
        if impl == "ceiling":
            vec.timed(spec["warmup"])
            sample = vec.timed(seconds)
            sample["build_seconds"] = perf_counter() - t0
            return sample
        vec.reset(seed=0)
        sample = {"build_seconds": perf_counter() - t0}
        deadline = perf_counter() + spec["warmup"]
        k = 0
        while k < 5 or perf_counter() < deadline:
            vec.step(actions[k % len(actions)])
            k += 1
        pids = list(vec.manager.worker_pids) if impl in ENVMGR_IMPLS else []
        io0 = io_bytes(pids)
        c0 = process_time()
        batches, elapsed = run_for(vec.step, list(actions), k, seconds)
        cpu = process_time() - c0
        io1 = io_bytes(pids)
        envs_per_batch = getattr(vec, "envs_per_batch", n)
        rows_per_batch = actions.shape[1] * envs_per_batch // n
        sample.update(
            batches=batches,
            seconds=elapsed,
            envs_per_batch=envs_per_batch,
            agent_steps_per_second=batches * rows_per_batch / elapsed,
            env_steps_per_second=batches * envs_per_batch / elapsed,
            # Per n env-steps, so that half batches compare with whole ones.
            parent_cpu_ms_per_batch=cpu / (batches * envs_per_batch / n) * 1e3,
        )
        if impl in ENVMGR_IMPLS:
            sample["timed_written_bytes_per_batch"] = (io1[1] - io0[1]) / batches
            sample.update(profile_envmgr(vec, actions, k + batches, spec["profile"]))
        return sample
    finally:
        vec.close()


def describe_exit(code: int) -> str:
    """``exit 1`` or ``killed by SIGSEGV``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``measure(spec)`` in a fresh interpreter; the sample, or ``{"error": why}``.

    The child leads its own process group, so whatever it leaves behind (a peer's workers
    after a crash) is killed with it.
    """
    module = __spec__.name if __spec__ is not None else None
    entry = ["-m", module] if module and module != "__main__" else [str(Path(__file__))]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sample.json"
        cmd = [sys.executable, *entry, "--child", json.dumps(spec), "--child-out", str(out)]
        limit = CHILD_OVERHEAD_TIMEOUT + spec["warmup"] + spec["seconds"] + spec["profile"]
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": path},  # this checkout's envmgr, however started
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        t0 = perf_counter()
        try:
            _, stderr = proc.communicate(timeout=limit)
            error = None
        except subprocess.TimeoutExpired:
            error = f"no result within {limit:.0f} s"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if proc.returncode is None:
                _, stderr = proc.communicate()
        wall = perf_counter() - t0
        if error is not None:
            return {"error": error}
        if not out.exists():
            tail = " | ".join((stderr or "").strip().splitlines()[-2:])
            return {"error": f"{describe_exit(proc.returncode)}: {tail}".rstrip(": ")}
        sample: dict[str, Any] = json.loads(out.read_text())
    sample["child_wall_seconds"] = wall
    return sample


def child_main(spec: dict[str, Any], out: Path) -> int:
    """Measure; an exception is the sample's ``error`` (its last line) and ``traceback``."""
    try:
        sample = measure(spec)
    except Exception as exc:
        text = traceback.format_exc()
        sample = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300], "traceback": text}
    out.write_text(json.dumps(sample, default=float))
    return 0


# ============================================================================ the run


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, min and max of ``xs``."""
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": median(xs), "min": float(min(xs)), "max": float(max(xs))}


def per_round(samples: dict[str, list[dict[str, Any]]], mine: str, base: str) -> list[float]:
    """``mine / base`` agent-steps/s within each round both were measured in."""
    if mine not in samples or base not in samples:
        return []
    a = {s["round"]: s["agent_steps_per_second"] for s in samples[mine]}
    b = {s["round"]: s["agent_steps_per_second"] for s in samples[base]}
    return [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r]]


def summarize(config: dict[str, Any]) -> None:
    """Each implementation's medians and spreads, and its per-round ratio to the ceiling."""
    rows: dict[str, Any] = {}
    for impl, ss in config["samples"].items():
        row: dict[str, Any] = {
            "agent_steps_per_second": spread([s["agent_steps_per_second"] for s in ss]),
            "env_steps_per_second": spread([s["env_steps_per_second"] for s in ss]),
            "of_ceiling": spread(per_round(config["samples"], impl, "ceiling")),
        }
        for key in (
            "parent_cpu_ms_per_batch",
            "worker_pack_us_per_agent",
            "parent_unpack_us_per_agent",
            "pickled_bytes_per_batch",
            "read_bytes_per_batch",
            "timed_written_bytes_per_batch",
            "live_agents_per_batch",
        ):
            values = [s[key] for s in ss if s.get(key) is not None]
            if values:
                row[key] = spread(values)
        rows[impl] = row
    config["summary"] = rows


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every configuration, ``args.rounds`` interleaved rounds; saved after every round."""
    configs = [
        {"env": e, "n_envs": n, "samples": {}, "errors": {}, "skipped": {}}
        for e in args.envs
        for n in (args.n_envs or DEFAULT_N_ENVS.get(e, [8, 32]))
    ]
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.suites.multiagent", *args.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "argv", "child")},
        "machine": machine_info(),
        "configs": configs,
    }
    t_start = perf_counter()
    total = args.rounds * len(configs) * len(args.impls)
    done = 0
    for r in range(args.rounds):
        for c in configs:
            order = args.impls[r % len(args.impls) :] + args.impls[: r % len(args.impls)]
            for impl in order:
                done += 1
                reason = skip_reason(impl, c["n_envs"])
                if reason is not None:
                    c["skipped"][impl] = reason
                    continue
                if impl in c["errors"]:
                    continue  # failed once: it would again, and each try costs a start-up
                spec = {
                    "env": c["env"],
                    "n_envs": c["n_envs"],
                    "impl": impl,
                    "seconds": args.seconds,
                    "warmup": args.warmup,
                    "profile": args.profile,
                }
                sample = run_child(spec)
                tag = f"[{done}/{total}] round {r + 1} {c['env']} n={c['n_envs']} {impl}"
                if "error" in sample:
                    c["errors"][impl] = sample["error"]
                    if "traceback" in sample:
                        c.setdefault("tracebacks", {})[impl] = sample["traceback"]
                    print(f"{tag}: FAILED {sample['error']}", file=sys.stderr, flush=True)
                    continue
                sample["round"] = r
                c["samples"].setdefault(impl, []).append(sample)
                print(
                    f"{tag}: {sample['agent_steps_per_second']:,.0f} agent-steps/s "
                    f"({sample['child_wall_seconds']:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            summarize(c)
        report["wall_seconds"] = perf_counter() - t_start
        save(report)
    report["targets"] = targets(report)
    save(report)
    return report


def machine_info() -> dict[str, Any]:
    """The CPU, the date, the commit and the versions of everything compared."""
    from importlib import metadata

    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
            )
            return done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in (
        "envmgr", "numpy", "gymnasium", "pettingzoo", "mpe2", "magent2", "pygame-ce",
        "SuperSuit", "pufferlib-core",
    ):  # fmt: skip
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    status = git("status", "--porcelain")
    return {
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "versions": versions,
    }


# ============================================================================ report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The lead's targets, each with what was measured and whether it was met."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float, met: bool, shown: str) -> None:
        met_or_none = None if np.isnan(value) else met
        out.append({"target": name, "value": value, "shown": shown, "met": met_or_none})

    def at_least(name: str, value: float, bound: float) -> None:
        add(f"{name} >= {bound:g}", value, value >= bound, f"{value:.2f}")

    for c in report["configs"]:
        env, n, samples = c["env"], c["n_envs"], c["samples"]
        own = c.get("summary", {}).get("envmgr")
        if own is None:
            continue
        ratio = own["of_ceiling"]["median"]
        if env == "spread-3" and n == 16:
            at_least("spread-3 n=16 envmgr / ceiling", ratio, 0.8)
        if env == "battle":
            at_least(f"battle n={n} envmgr / ceiling", ratio, 0.75)
        if env == "synthetic" and "supersuit" in samples:
            at_least(
                f"synthetic n={n} envmgr / SuperSuit",
                median(per_round(samples, "envmgr", "supersuit")),
                2.0,
            )
        puffers = [median(per_round(samples, "envmgr", p)) for p in PUFFER_IMPLS if p in samples]
        if env == "synthetic" and puffers:
            at_least(f"synthetic n={n} envmgr / best PufferLib", min(puffers), 1.0)
        pickled = own.get("pickled_bytes_per_batch")
        if pickled is not None:  # the worst round; under a byte per batch is wake-ups
            worst = pickled["max"]
            add(
                f"{env} n={n} envmgr bytes pickled per step = 0",
                worst,
                worst < 1.0,
                f"{worst:.1f} B",
            )
    return out


def _fmt_rate(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"


def _fmt_ratio(s: dict[str, float] | None) -> str:
    if not s or np.isnan(s["median"]):
        return "-"
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]


def tables(report: dict[str, Any]) -> str:
    """The throughput table, envmgr's packing and traffic, and the targets."""
    m = report["machine"]
    lines = [
        f"Multi-agent benchmark, {m['date']}, commit {m['git_commit']}"
        + (" (dirty)" if m["git_dirty"] else ""),
        f"{m['cpu_model']}, {m['usable_cpus']} usable CPUs, Python {m['python']}",
        f"{report['args']['rounds']} interleaved rounds x {report['args']['seconds']:g} s; "
        "median (min-max) over rounds; ratios within a round",
        "",
        "Throughput",
    ]
    head = ["env", "n", "impl", "agent-steps/s", "env-steps/s", "/ ceiling", "parent ms/batch"]
    rows = []
    for c in report["configs"]:
        label = ENV_LABELS[c["env"]]
        for impl in report["args"]["impls"]:
            s = c.get("summary", {}).get(impl)
            base = [label, str(c["n_envs"]), impl]
            if s is not None:
                cpu = s.get("parent_cpu_ms_per_batch")
                rows.append(
                    base
                    + [
                        _fmt_rate(s["agent_steps_per_second"]),
                        _fmt_rate(s["env_steps_per_second"]),
                        "1" if impl == "ceiling" else _fmt_ratio(s["of_ceiling"]),
                        "-" if cpu is None else f"{cpu['median']:.3f}",
                    ]
                )
            elif impl in c["errors"]:
                rows.append(base + [f"FAILED: {c['errors'][impl]}", "", "", ""])
            elif impl in c["skipped"]:
                rows.append(base + [f"skipped: {c['skipped'][impl]}", "", "", ""])
    lines += _table(head, rows)
    lines += ["", "envmgr: packing per live agent-step, bytes per batch (outside the timed window)"]
    head = [
        "env", "n", "impl", "live agents", "worker pack us/agent", "parent unpack us/agent",
        "pickled B/step", "read B/step", "written B/step incl. timers",
    ]  # fmt: skip
    rows = []
    for c in report["configs"]:
        for impl in ("envmgr", "envmgr-caller"):
            s = c.get("summary", {}).get(impl)
            if s is None or "worker_pack_us_per_agent" not in s:
                continue
            rows.append(
                [
                    ENV_LABELS[c["env"]],
                    str(c["n_envs"]),
                    impl,
                    f"{s['live_agents_per_batch']['median']:.0f}",
                    _fmt_ratio(s["worker_pack_us_per_agent"]),
                    _fmt_ratio(s["parent_unpack_us_per_agent"]),
                    f"{s['pickled_bytes_per_batch']['max']:.1f}",
                    f"{s['read_bytes_per_batch']['median']:.1f}",
                    f"{s['timed_written_bytes_per_batch']['median']:.1f}",
                ]
            )
    lines += _table(head, rows)
    lines += ["", "Targets (envmgr = make_parallel's default layout)"]
    rows = [
        [t["target"], t["shown"], "-" if t["met"] is None else ("met" if t["met"] else "missed")]
        for t in report.get("targets", [])
    ]
    lines += _table(["target", "measured", ""], rows) if rows else ["(none measured)"]
    return "\n".join(lines) + "\n"


# ============================================================================ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.multiagent",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--envs", default=",".join(ENVS), help="(default: %(default)s)")
    p.add_argument(
        "--n-envs", default=None, help="envs per configuration (default: 8,32; spread-3 8,16,32)"
    )
    p.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help="(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument(
        "--seconds", type=float, default=1.0, help="timed seconds per measurement (default: 1)"
    )
    p.add_argument("--warmup", type=float, default=0.3, help="untimed seconds before timing")
    p.add_argument(
        "--profile", type=float, default=0.3, help="envmgr's packing/bytes window, seconds"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks" / "results" / "multiagent",
        help="output directory (multiagent.json/.txt; quick.* with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="1 round, 0.3 s, 4 envs: a smoke run")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw)
    args.argv = raw
    if args.child is not None:
        return args
    given = {a.split("=")[0] for a in raw}
    if args.quick:
        for name, value in QUICK.items():
            if "--" + name not in given:
                setattr(args, name, value)
        if args.n_envs is None:
            args.n_envs = ",".join(map(str, QUICK_N_ENVS))
    args.envs = [e for e in str(args.envs).split(",") if e]
    args.impls = [i for i in str(args.impls).split(",") if i]
    args.n_envs = [int(n) for n in args.n_envs.split(",") if n] if args.n_envs else None
    for e in args.envs:
        if e not in ENVS:
            p.error(f"unknown env {e!r}; choose from {','.join(ENVS)}")
    for i in args.impls:
        if i not in IMPLS:
            p.error(f"unknown implementation {i!r}; choose from {','.join(IMPLS)}")
    if args.n_envs is not None and any(n < 1 for n in args.n_envs):
        p.error("every --n-envs must be positive")
    if args.seconds <= 0 or args.rounds < 1 or args.profile <= 0:
        p.error("--seconds and --profile must be > 0 and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(json.loads(args.child), args.child_out)
    stem = "quick" if args.quick else "multiagent"
    args.out.mkdir(parents=True, exist_ok=True)
    out_json = args.out / f"{stem}.json"

    def save(report: dict[str, Any]) -> None:
        out_json.write_text(json.dumps(report, indent=1, default=str))

    report = run(args, save)
    text = tables(report)
    out_json.with_suffix(".txt").write_text(text)
    print(text)
    print(f"wrote {out_json} and {out_json.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
