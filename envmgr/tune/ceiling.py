"""The ceiling ``envmgr tune`` compares every layout with.

One process per core, each stepping its share of the same envs in a plain loop at the same
time, with nothing passing between them: the most any design built from processes can reach
on this machine. A layout's throughput over the ceiling's, timed in the same round, is the
share of the machine it delivers (1.0: nothing lost to hand-offs, wake-ups or barriers).

The processes live for the whole tuning run, so the ceiling is timed in the same interleaved
rounds as the layouts. Each steps single envs with next-step autoreset, or, for the hosted
layouts, one env from the id's vector entry point over its share.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from time import perf_counter
from typing import Any

import cloudpickle

from envmgr.backends.local.pool import _main_module_hidden, ctrl_c_held
from envmgr.errors import EnvMgrError, RemoteTraceback

__all__ = ["Ceiling", "TuneError"]

#: Longest wait for a ceiling process to build its envs.
START_TIMEOUT = 120.0
#: Margin over the asked seconds before a ceiling process that has not answered is given up.
RUN_MARGIN = 60.0
_N_ACTIONS = 64


class TuneError(EnvMgrError):
    """A ceiling process could not start, failed, or did not answer in time."""


class _SingleBlock:
    """``n`` single envs stepped one after another, next-step autoreset, results dropped."""

    def __init__(self, factory: Callable[[], Any], n: int, seed: int) -> None:
        self.envs = [factory() for _ in range(n)]
        self.actions = []
        for i, env in enumerate(self.envs):
            env.reset(seed=seed + i)
            env.action_space.seed(seed + i)
            self.actions.append([env.action_space.sample() for _ in range(_N_ACTIONS)])
        self.done = [False] * n
        self.k = 0

    def run(self, seconds: float) -> tuple[int, float]:
        envs, actions, done, k = self.envs, self.actions, self.done, self.k
        steps = 0
        t0 = perf_counter()
        deadline = t0 + seconds
        while True:
            j = k % _N_ACTIONS
            for i, env in enumerate(envs):
                if done[i]:
                    env.reset()
                    done[i] = False
                else:
                    _, _, term, trunc, _ = env.step(actions[i][j])
                    done[i] = term or trunc
            k += 1
            steps += len(envs)
            now = perf_counter()
            if now >= deadline:
                break
        self.k = k
        return steps, now - t0

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _VectorBlock:
    """One batched env of ``n`` envs (the id's vector entry point); it autoresets itself."""

    def __init__(self, factory: Callable[[int], Any], n: int, seed: int) -> None:
        self.env = factory(n)
        self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        self.actions = [self.env.action_space.sample() for _ in range(_N_ACTIONS)]
        self.n = n
        self.k = 0

    def run(self, seconds: float) -> tuple[int, float]:
        step, actions, k = self.env.step, self.actions, self.k
        batches = 0
        t0 = perf_counter()
        deadline = t0 + seconds
        while True:
            step(actions[k % _N_ACTIONS])
            k += 1
            batches += 1
            now = perf_counter()
            if now >= deadline:
                break
        self.k = k
        return batches * self.n, now - t0

    def close(self) -> None:
        self.env.close()


def _child(conn: Connection, payload: bytes, n: int, vector: bool, seed: int) -> None:
    """A ceiling process: build the block, then run it for the seconds asked until closed."""
    block: _SingleBlock | _VectorBlock | None = None
    try:
        factory = cloudpickle.loads(payload)
        block = _VectorBlock(factory, n, seed) if vector else _SingleBlock(factory, n, seed)
        conn.send(("ok", None))
        while True:
            seconds = conn.recv()
            if seconds is None:
                break
            conn.send(("ok", block.run(seconds)))
    except (EOFError, KeyboardInterrupt):
        pass  # the parent went away or was interrupted: nothing to report to
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
    finally:
        if block is not None:
            block.close()


class Ceiling:
    """Processes stepping ``sizes[p]`` envs each, independently.

    Args:
        ctx: A multiprocessing context (the managers' start method).
        factory: A picklable (cloudpickle) env factory: ``() -> Env``, or ``n -> VectorEnv``
            when ``vector``.
        sizes: Envs per process; env ``i`` of the whole set is seeded ``seed + i``.
        vector: Whether ``factory`` builds one batched env per process.
        seed: The first env's seed.

    Raises:
        TuneError: If a process fails to build its envs or does not answer in time.
    """

    def __init__(
        self, ctx: Any, factory: Any, sizes: Sequence[int], vector: bool, seed: int = 0
    ) -> None:
        payload = cloudpickle.dumps(factory)
        self.sizes = list(sizes)
        self.vector = vector
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        start = seed
        try:
            for size in self.sizes:
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(
                    target=_child,
                    args=(theirs, payload, size, vector, start),
                    name=f"envmgr-tune-ceiling-{len(self.procs)}",
                    daemon=True,
                )
                with ctrl_c_held():  # as for the workers: recorded before Ctrl-C lands
                    with _main_module_hidden():  # and no guard needed in scripts
                        proc.start()
                    self.conns.append(mine)
                    self.procs.append(proc)
                theirs.close()
                start += size
            self._gather(START_TIMEOUT, "build its envs")
        except BaseException:
            self.close()
            raise

    def _gather(self, timeout: float, doing: str) -> list[Any]:
        out = []
        for p, conn in enumerate(self.conns):
            if not conn.poll(timeout):
                raise TuneError(f"ceiling process {p} did not {doing} within {timeout:g} s")
            try:
                status, value = conn.recv()
            except EOFError:
                raise TuneError(
                    f"ceiling process {p} exited while trying to {doing} "
                    f"(exit code {self.procs[p].exitcode})"
                ) from None
            if status != "ok":
                # The message ends with the exception line; the whole traceback is the cause.
                last = value.strip().splitlines()[-1]
                raise TuneError(f"ceiling process {p} failed to {doing}: {last}") from (
                    RemoteTraceback(value)
                )
            out.append(value)
        return out

    def run(self, seconds: float) -> float:
        """Every process steps for ``seconds`` at once; returns the sum of their env-steps/s."""
        for conn in self.conns:
            conn.send(seconds)
        results = self._gather(seconds + RUN_MARGIN, "step")
        return sum(steps / elapsed for steps, elapsed in results)

    def close(self) -> None:
        """Stops the processes (asked first, then terminated if they do not leave)."""
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []
