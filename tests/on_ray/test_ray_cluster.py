"""RayEnvManager on a real two-node Ray cluster (``ray.cluster_utils.Cluster``).

A head node and one worker node run on this machine, each a full Ray node
(raylet, object store, workers) with a custom resource naming it (``node_a`` /
``node_b``), all on the loopback address 127.0.0.2 (Ray rewrites 127.0.0.1 to
the host's external address). The managers connect the driver themselves
(``address=cluster.address``), as a user's script would with ``address="auto"``,
and disconnect on close.

A driver talks to one Ray at a time: the module fixture first shuts down the
local instance ``tests/test_ray.py`` may have left running in this process (that
module restarts it if it needs it again), and its teardown checks that every
process of the cluster is gone. No wall-clock thresholds: the machine is shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest

ray = pytest.importorskip(
    "ray", reason='ray is not installed: pip install "envmgr[ray]" to run the Ray cluster tests'
)

from envmgr import SubprocessEnvManager, timers  # noqa: E402
from envmgr.errors import BrokenManagerError, BrokenWorkerError, RayActorDiedError  # noqa: E402
from envmgr.frontend.results import RESTARTED_INFO_KEY  # noqa: E402
from envmgr.managers.ray import RayEnvManager  # noqa: E402

pytestmark = pytest.mark.timeout(90)

# Ray's workers cannot import this test module: its factories travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NODE_IP = "127.0.0.2"


def make_cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


@dataclass
class TwoNodes:
    cluster: Any
    address: str
    node_a: str  # head node id
    node_b: str  # worker node id
    worker_node: Any
    seen_pids: set[int]  # every process of the cluster seen so far, checked gone at teardown

    def snapshot(self) -> None:
        self.seen_pids |= _node_pids([self.worker_node, *self.cluster.list_all_nodes()])

    def connect_kwargs(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "ray_init_kwargs": {"_node_ip_address": NODE_IP, "log_to_driver": False},
        }


def _ps() -> dict[int, tuple[int, str]]:
    out = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True
    ).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2:
            table[int(parts[0])] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
    return table


def _node_pids(nodes: list[Any]) -> set[int]:
    """Every process of the given Ray nodes: their services and all their descendants."""
    pids: set[int] = set()
    for node in nodes:
        for infos in getattr(node, "all_processes", {}).values():
            for info in infos:
                proc = getattr(info, "process", None)
                if proc is not None and proc.pid:
                    pids.add(proc.pid)
    table = _ps()
    grew = True
    while grew:
        kids = {pid for pid, (ppid, _) in table.items() if ppid in pids} - pids
        grew = bool(kids)
        pids |= kids
    return pids


def _alive(pids: set[int]) -> dict[int, str]:
    table = _ps()
    return {pid: table[pid][1] for pid in pids if pid in table and "<defunct>" not in table[pid][1]}


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # the local instance of test_ray.py: one Ray per driver
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no reporting over the network
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "node_ip_address": NODE_IP,
            "num_cpus": 1,
            "resources": {"node_a": 1},
            "include_dashboard": False,
        },
    )
    pids: set[int] = set()
    try:
        worker = cluster.add_node(node_ip_address=NODE_IP, num_cpus=1, resources={"node_b": 1})
        cluster.wait_for_nodes()
        nodes = TwoNodes(
            cluster, cluster.address, cluster.head_node.node_id, worker.node_id, worker, pids
        )
        nodes.snapshot()
        yield nodes
    finally:
        pids |= _node_pids(cluster.list_all_nodes())
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        deadline = time.monotonic() + 20
        left = _alive(pids)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _alive(pids)
        assert not left, f"processes of the Ray cluster left behind: {left}"


@pytest.fixture(autouse=True)
def _fresh_timers(two_nodes: TwoNodes) -> Iterator[None]:
    timers.reset_timers()
    yield
    timers.reset_timers()
    two_nodes.snapshot()  # the actors' worker processes, for the teardown check


def _kill(envs: Any, k: int) -> None:
    """Kill actor ``k`` and wait until Ray reports it dead (ray.kill is asynchronous) and
    its process is gone: the GCS may say DEAD while the process still answers a call
    sent straight to it (a step then succeeds on the "dead" actor)."""
    from ray._private import state
    from support.fault_envs import process_token, wait_gone

    actor_id = envs.actor_info[k].actor_id
    token = process_token(envs.actor_info[k].pid)
    assert token is not None, "the actor's process (on this machine) is not found"
    ray.kill(envs.actor_handles[k], no_restart=True)
    deadline = time.monotonic() + 20
    while state.actors().get(actor_id, {}).get("State") != "DEAD":
        assert time.monotonic() < deadline, f"actor {actor_id} not dead after ray.kill"
        time.sleep(0.1)
    assert not wait_gone([token], timeout=20, zombie_ok=True), "the killed actor's process lives"


def _same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(90)
def test_actors_on_both_nodes_match_the_local_manager(two_nodes: TwoNodes) -> None:
    n_actors, per_actor = 2, 4
    n = n_actors * per_actor
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, size=n) for _ in range(150)]
    with SubprocessEnvManager(make_cartpole, n_actors, per_actor) as local:
        want = [local.reset(seed=21)] + [local.step(a) for a in actions]

    envs = RayEnvManager(
        make_cartpole,
        n_actors,
        per_actor,
        resources_per_actor=[{"node_a": 0.1}, {"node_b": 0.1}],
        **two_nodes.connect_kwargs(),
    )
    with envs:
        assert [a.node_id for a in envs.actor_info] == [two_nodes.node_a, two_nodes.node_b]
        assert {a.node_ip for a in envs.actor_info} == {NODE_IP}
        with timers.hierarchical_timer("rollout"):
            got = [envs.reset(seed=21)] + [envs.step(a) for a in actions]
        tree = timers.get_timer_tree()
    assert not ray.is_initialized(), "the manager connected the driver, so it disconnects it"
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    assert sum(int((s[2] | s[3]).sum()) for s in got[1:]) > 0, "no autoreset exercised"

    # One parallel subtree per actor, each on its own node, adding up to worker_root.
    kids = tree["children"]["rollout"]["children"]["workers"]["children"]
    names = [f"actor_{k}@{NODE_IP}" for k in range(n_actors)]
    assert set(kids) == {"worker_root", *names}
    for name in names:
        assert kids[name]["is_parallel"] and kids[name]["children"]["step"]["count"] == 150
        assert kids[name]["children"]["reset"]["count"] == 1
    root = kids["worker_root"]["children"]
    assert root["step"]["count"] == 2 * 150
    assert root["step"]["children"]["env.step"]["count"] == sum(
        kids[name]["children"]["step"]["children"]["env.step"]["count"] for name in names
    )


@pytest.mark.timeout(90)
def test_placement_one_actor_per_node_or_by_node_id(two_nodes: TwoNodes) -> None:
    # Default: one actor per alive node.
    with RayEnvManager(make_cartpole, envs_per_actor=2, **two_nodes.connect_kwargs()) as envs:
        assert envs.n_actors == 2 and envs.num_envs == 4
        assert {a.node_id for a in envs.actor_info} == {two_nodes.node_a, two_nodes.node_b}
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
    # Pinned by node id (NodeAffinitySchedulingStrategy), in the order given.
    with RayEnvManager(
        make_cartpole,
        2,
        2,
        node_ids=[two_nodes.node_b, two_nodes.node_a],
        **two_nodes.connect_kwargs(),
    ) as envs:
        assert [a.node_id for a in envs.actor_info] == [two_nodes.node_b, two_nodes.node_a]
        envs.reset(seed=0)
        assert envs.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)


@pytest.mark.timeout(90)
def test_killed_actor_on_one_node_is_replaced_there(two_nodes: TwoNodes) -> None:
    per_actor = 3
    envs = RayEnvManager(
        make_cartpole,
        2,
        per_actor,
        resources_per_actor=[{"node_a": 0.1}, {"node_b": 0.1}],
        max_restarts=1,
        **two_nodes.connect_kwargs(),
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(6, dtype=np.int64))
        _kill(envs, 1)
        obs, rew, term, trunc, infos = envs.step(np.zeros(6, dtype=np.int64))
        victims = np.arange(6) >= per_actor
        np.testing.assert_array_equal(trunc, victims)
        np.testing.assert_array_equal(infos[f"_{RESTARTED_INFO_KEY}"], victims)
        reason = infos[RESTARTED_INFO_KEY][per_actor]
        assert "ray actor 1" in reason and f"on node {NODE_IP}" in reason
        assert two_nodes.node_b[:12] in reason  # names the node by id too
        (failure,) = envs.failures
        assert isinstance(failure, RayActorDiedError) and failure.node_id == two_nodes.node_b
        # The replacement asks for the same resource, so it lands on node_b again.
        assert envs.actor_info[1].node_id == two_nodes.node_b and envs.restarts == [0, 1]
        for _ in range(3):
            _, _, _, _, infos = envs.step(np.zeros(6, dtype=np.int64))
        assert RESTARTED_INFO_KEY not in infos

        # A second death is beyond max_restarts=1: the manager breaks and closes.
        _kill(envs, 1)
        with pytest.raises(BrokenWorkerError, match="max_restarts=1 is spent") as err:
            envs.step(np.zeros(6, dtype=np.int64))
        assert isinstance(err.value.__cause__, RayActorDiedError)
        assert err.value.__cause__.node_ip == NODE_IP
        with pytest.raises(BrokenManagerError):
            envs.step(np.zeros(6, dtype=np.int64))
        assert not ray.is_initialized(), "a broken manager releases the connection it opened"
    finally:
        envs.close()


@pytest.mark.timeout(90)
def test_lost_node_is_detected_and_its_actor_replaced(two_nodes: TwoNodes) -> None:
    # Runs last: it removes the worker node from the cluster.
    per_actor = 2
    with RayEnvManager(
        make_cartpole,
        envs_per_actor=per_actor,
        num_cpus_per_actor=0.5,  # so the head node can take the replacement
        max_restarts=1,
        **two_nodes.connect_kwargs(),
    ) as envs:
        envs.reset(seed=0)
        victim = next(a.index for a in envs.actor_info if a.node_id == two_nodes.node_b)
        two_nodes.snapshot()
        two_nodes.cluster.remove_node(two_nodes.worker_node)
        _, _, _, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        lost = np.zeros(4, dtype=np.bool_)
        lost[victim * per_actor : (victim + 1) * per_actor] = True
        np.testing.assert_array_equal(trunc, lost)
        (failure,) = envs.failures
        assert isinstance(failure, RayActorDiedError)
        assert failure.node_id == two_nodes.node_b and failure.node_alive is False
        assert "lost with its node" in str(failure)
        assert "lost with its node" in infos[RESTARTED_INFO_KEY][victim * per_actor]
        assert envs.actor_info[victim].node_id == two_nodes.node_a
        assert envs.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)
