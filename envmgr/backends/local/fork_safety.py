"""Which of this process's threads make ``fork`` unsafe, by the names the kernel shows.

A forked child gets a copy of every lock, but only the forking thread: a lock
another thread held at that moment stays held forever in the child, and the
first call into that library there deadlocks or crashes. Whether that matters
depends on the thread. OpenBLAS's (and OpenMP's) worker threads are fork-safe:
they are unnamed (the kernel shows the process's own name for them) and the
libraries reset their pools in the child. Ray's core worker, gRPC and PyTorch's
autograd, distributed and device threads are not, and they name themselves;
so a thread is reported only when its name is on :data:`FORK_UNSAFE_THREADS`.

Linux only (``/proc/self/task/*/comm``); elsewhere nothing is reported.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

__all__ = ["FORK_UNSAFE_THREADS", "library_of", "fork_unsafe_threads", "describe"]

#: Name prefixes of threads known to make fork unsafe, and the library that starts them.
#: The kernel keeps a thread's first 15 characters, so prefixes are at most that long.
FORK_UNSAFE_THREADS: dict[str, str] = {
    # gRPC core and C++ (also what Ray's core worker talks through)
    "grpc_global_tim": "gRPC",
    "grpcpp_sync_ser": "gRPC",
    "event_engine": "gRPC",
    "default-executo": "gRPC",
    "resolver-execut": "gRPC",
    "timer_manager": "gRPC",
    "lifeguard": "gRPC",
    # Ray's core worker (a driver after ray.init, or a Ray worker process)
    "worker.io": "Ray",
    "worker.user_obj": "Ray",
    "gcs_client_io_s": "Ray",
    "client.poll": "Ray",
    "server.poll": "Ray",
    "task_event_buff": "Ray",
    "global.accessor": "Ray",
    "ray::": "Ray",
    # PyTorch (autograd per device, distributed, RPC)
    "pt_autograd": "PyTorch",
    "pt_dist_engine": "PyTorch",
    "pt_gloo": "PyTorch",
    "pt_tcpstore": "PyTorch",
    "pt_workerserver": "PyTorch",
    # CUDA's driver and runtime
    "cuda-EvtHandlr": "CUDA",
    "cuda0": "CUDA",
    # TensorFlow / XLA
    "tf_": "TensorFlow",
}


def library_of(thread_name: str) -> str | None:
    """The library a thread of this name belongs to if it is known to make fork unsafe."""
    for prefix, library in FORK_UNSAFE_THREADS.items():
        if thread_name.startswith(prefix):
            return library
    return None


def _thread_names() -> list[str]:
    """The kernel's name of every thread of this process but the calling one."""
    names = []
    me = str(threading.get_native_id())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                names.append(f.read().rstrip("\n"))
        except OSError:
            continue  # the thread ended meanwhile
    return names


def fork_unsafe_threads() -> list[tuple[str, str]]:
    """``(thread name, library)`` of each thread known to make fork unsafe, sorted."""
    found = []
    for name in _thread_names():
        library = library_of(name)
        if library is not None:
            found.append((name, library))
    return sorted(found)


def describe(found: list[tuple[str, str]]) -> str:
    """``found`` in a few words: ``"Ray (worker.io, client.poll0 x2), gRPC (event_engine)"``."""
    by_library: dict[str, Counter[str]] = {}
    for name, library in found:
        by_library.setdefault(library, Counter())[name] += 1
    parts = []
    for library, names in by_library.items():
        listed = ", ".join(n if k == 1 else f"{n} x{k}" for n, k in sorted(names.items()))
        parts.append(f"{library} ({listed})")
    return ", ".join(parts)
