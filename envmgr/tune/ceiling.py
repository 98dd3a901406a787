"""The ceiling ``envmgr tune`` compares every layout with, and the processes it runs in.

One process per core, each stepping its share of the same envs in a plain loop at the same
time, with nothing passing between them: the most any design built from processes can reach
on this machine. A layout's throughput over the ceiling's, timed in the same round, is the
share of the machine it delivers (1.0: nothing lost to hand-offs, wake-ups or barriers).

The processes live for the whole tuning run, so the ceiling is timed in the same interleaved
rounds as the layouts. Each steps a *block* of envs: single envs with next-step autoreset
(:class:`SingleBlock`), one env from the id's vector entry point over its share for the
hosted layouts (:class:`VectorBlock`), or PettingZoo envs packed into agent rows
(:class:`envmgr.tune.serial_agents.AgentBlock`).

:class:`BlockProcesses` is the shell around them, written once for the tuner and the
benchmarks (``benchmarks/_common/ceiling.py``)::

    parent                                   process p
    BlockProcesses(ctx, builders) --start--> block = builders[p]()   ("ok" once built)
    post(method, *args) / send(p, ...) ----> getattr(block, method)(*args)
    gather() <------------------------------ ("ok", result) | ("error", traceback)
    close() ---------------------------------> None: block.close(), exit
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from functools import partial
from multiprocessing.connection import Connection
from time import perf_counter
from typing import Any

import cloudpickle

from envmgr.backends.local.pool import ctrl_c_held, main_module_hidden
from envmgr.errors import EnvMgrError, RemoteTraceback

__all__ = ["BlockProcesses", "Ceiling", "SingleBlock", "TuneError", "VectorBlock", "run_for"]

#: Longest wait for a ceiling process to build its envs.
START_TIMEOUT = 120.0
#: Margin over the asked seconds before a ceiling process that has not answered is given up.
RUN_MARGIN = 60.0
_N_ACTIONS = 64


class TuneError(EnvMgrError):
    """A ceiling process could not start, failed, or did not answer in time."""


def run_for(
    step: Callable[[Any], Any], actions: Sequence[Any], k: int, seconds: float
) -> tuple[int, float]:
    """Call ``step`` on ``actions[k]``, ``actions[k + 1]``, ... (cyclically) for ``seconds``.

    The least a timed loop of batches can add. Returns:
        The batches stepped and the seconds they took.
    """
    m = len(actions)
    batches = 0
    t0 = perf_counter()
    deadline = t0 + seconds
    while True:
        step(actions[(k + batches) % m])
        batches += 1
        now = perf_counter()
        if now >= deadline:
            return batches, now - t0


class SingleBlock:
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
        """Step for ``seconds``; returns the env steps and the seconds they took."""
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

    def spaces(self) -> tuple[Any, Any]:
        """One env's observation and action spaces."""
        return self.envs[0].observation_space, self.envs[0].action_space

    def close(self) -> None:
        """Close the envs."""
        for env in self.envs:
            env.close()


class VectorBlock:
    """One batched env of ``n`` envs (the id's vector entry point); it autoresets itself."""

    def __init__(self, factory: Callable[[int], Any], n: int, seed: int) -> None:
        self.env = factory(n)
        self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        self.actions = [self.env.action_space.sample() for _ in range(_N_ACTIONS)]
        self.n = n
        self.k = 0

    def run(self, seconds: float) -> tuple[int, float]:
        """Step for ``seconds``; returns the env steps and the seconds they took."""
        batches, elapsed = run_for(self.env.step, self.actions, self.k, seconds)
        self.k += batches
        return batches * self.n, elapsed

    def spaces(self) -> tuple[Any, Any]:
        """One env's observation and action spaces."""
        return self.env.single_observation_space, self.env.single_action_space

    def close(self) -> None:
        """Close the env."""
        self.env.close()


def _child(conn: Connection, builder: bytes) -> None:
    """A block process: build the block, then call its methods as told until closed."""
    block: Any = None
    try:
        block = cloudpickle.loads(builder)()
        conn.send(("ok", None))
        while True:
            message = conn.recv()
            if message is None:
                break
            method, args = message
            conn.send(("ok", getattr(block, method)(*args)))
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


class BlockProcesses:
    """One process per builder, each building a block and calling its methods when told.

    Args:
        ctx: A multiprocessing context.
        builders: Zero-argument callables (cloudpickle carries them); process ``p`` calls
            ``builders[p]()`` once for its block, an object with ``close()`` and the
            methods it is told to call.
        name: The processes' name, numbered (``name-0``, ...).
        start_timeout: Longest wait for a process to build its block.

    Raises:
        TuneError: If a process fails to build its block or does not answer in time.
    """

    def __init__(
        self,
        ctx: Any,
        builders: Sequence[Callable[[], Any]],
        name: str = "envmgr-tune-ceiling",
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        try:
            for p, builder in enumerate(builders):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(
                    target=_child,
                    args=(theirs, cloudpickle.dumps(builder)),
                    name=f"{name}-{p}",
                    daemon=True,
                )
                with ctrl_c_held():  # as for the workers: recorded before Ctrl-C lands
                    with main_module_hidden():  # and no guard needed in scripts
                        proc.start()
                    self.conns.append(mine)
                    self.procs.append(proc)
                theirs.close()
            self.gather(start_timeout, "build its envs")
        except BaseException:
            self.close()
            raise

    def send(self, p: int, method: str, *args: Any) -> None:
        """Tell process ``p`` to call ``method(*args)`` on its block (answer: :meth:`gather`)."""
        self.conns[p].send((method, args))

    def post(self, method: str, *args: Any) -> None:
        """Tell every process to call ``method(*args)`` on its block."""
        for p in range(len(self.conns)):
            self.send(p, method, *args)

    def gather(self, timeout: float | None, doing: str) -> list[Any]:
        """Every process's answer to what it was last told, in order.

        Args:
            timeout: Longest wait for each process (``None``: no limit).
            doing: What the processes were told, for the error ("build its envs").
        """
        out = []
        for p, conn in enumerate(self.conns):
            if timeout is not None and not conn.poll(timeout):
                # Stuck: killed now, not after close()'s wait for a clean exit it cannot make.
                self.procs[p].kill()
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


class Ceiling:
    """Processes stepping ``sizes[p]`` envs each, independently.

    Args:
        ctx: A multiprocessing context (the managers' start method).
        block: ``(n, seed) -> block``, picklable (cloudpickle): what one process steps, such
            as ``partial(SingleBlock, env_factory)``; a block has ``run(seconds) -> (env
            steps, seconds)`` and ``close()``.
        sizes: Envs per process; env ``i`` of the whole set is seeded ``seed + i``.
        seed: The first env's seed.

    Raises:
        TuneError: If a process fails to build its envs or does not answer in time.
    """

    def __init__(
        self, ctx: Any, block: Callable[[int, int], Any], sizes: Sequence[int], seed: int = 0
    ) -> None:
        self.sizes = list(sizes)
        starts = [seed + sum(self.sizes[:p]) for p in range(len(self.sizes))]
        self.processes = BlockProcesses(
            ctx, [partial(block, n, s) for n, s in zip(self.sizes, starts, strict=True)]
        )

    def spaces(self) -> tuple[Any, Any]:
        """One env's observation and action spaces."""
        self.processes.post("spaces")
        return self.processes.gather(START_TIMEOUT, "say its spaces")[0]  # type: ignore[no-any-return]

    def run(self, seconds: float) -> float:
        """Every process steps for ``seconds`` at once; returns the sum of their env-steps/s."""
        self.processes.post("run", seconds)
        results = self.processes.gather(seconds + RUN_MARGIN, "step")
        return sum(steps / elapsed for steps, elapsed in results)

    def close(self) -> None:
        """Stops the processes."""
        self.processes.close()
