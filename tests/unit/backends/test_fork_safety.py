"""The fork warning names threads known to make fork unsafe, and only those."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from envmgr.backends.local.fork_safety import describe, fork_unsafe_threads, library_of

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(
    ("name", "library"),
    [
        ("grpc_global_tim", "gRPC"),
        ("default-executo", "gRPC"),
        ("worker.io", "Ray"),
        ("client.poll0", "Ray"),
        ("gcs_client_io_s", "Ray"),
        ("pt_autograd_0", "PyTorch"),
        ("cuda-EvtHandlr", "CUDA"),
        ("python", None),  # OpenBLAS / OpenMP workers carry the process's own name
        ("python3.11", None),
        ("envmgr-watchdog", None),
    ],
)
def test_threads_are_classified_by_name(name: str, library: str | None) -> None:
    assert library_of(name) == library


def test_describe_groups_by_library() -> None:
    found = [("client.poll0", "Ray"), ("event_engine", "gRPC"), ("worker.io", "Ray")] * 2
    text = describe(sorted(found))
    assert text == "Ray (client.poll0 x2, worker.io x2), gRPC (event_engine x2)"


_MANAGER = """
import warnings
import gymnasium as gym
from envmgr import SubprocessEnvManager

def start():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SubprocessEnvManager(lambda: gym.make("CartPole-v1"), 2, 1, context="fork") as envs:
            envs.reset(seed=0)
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
"""


def test_a_numpy_process_with_openblas_threads_gets_no_fork_warning(
    run_python: Callable[..., Any],
) -> None:
    proc = run_python(
        _MANAGER
        + """
import os
import numpy as np
a = np.random.default_rng(0).random((400, 400))
for _ in range(5):
    a @ a  # starts OpenBLAS's thread pool
print("threads", len(os.listdir("/proc/self/task")))
print("warnings", start())
"""
    )
    assert proc.returncode == 0, proc.stderr
    assert "warnings []" in proc.stdout, proc.stdout
    threads = int(proc.stdout.split("threads ")[1].split()[0])
    if threads < 2:
        pytest.skip("numpy started no extra thread here (one core, or OPENBLAS_NUM_THREADS=1)")


def test_a_known_unsafe_thread_is_named_in_the_warning(run_python: Callable[..., Any]) -> None:
    proc = run_python(
        _MANAGER
        + """
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
named, done = threading.Event(), threading.Event()

def grpc_like():
    libc.prctl(15, b"grpc_global_tim", 0, 0, 0)  # PR_SET_NAME, as gRPC names its timer thread
    named.set()
    done.wait()

t = threading.Thread(target=grpc_like, daemon=True)
t.start()
named.wait()
print("warnings", start())
done.set()
t.join()
# join() returns when the Python thread is done; the OS thread (and its
# /proc/self/task entry) may linger a moment longer on a loaded machine.
import os, time

def named_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # exited while we looked
    return names

deadline = time.monotonic() + 30
while "grpc_global_tim" in named_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
print("after", start())
"""
    )
    assert proc.returncode == 0, proc.stderr
    during, after = proc.stdout.split("after")
    assert "known to make fork unsafe: gRPC (grpc_global_tim)" in during, proc.stdout
    assert "context='forkserver'" in during
    assert "[]" in after, proc.stdout  # gone with the thread


def test_this_process_lists_only_threads_it_has() -> None:
    # Whatever the test session started, every entry is a known name with its library.
    for name, library in fork_unsafe_threads():
        assert library_of(name) == library
