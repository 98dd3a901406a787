"""The local backend: worker processes, shared memory and a doorbell.

* :mod:`~envmgr.backends.local.process` - :class:`ProcessBackend`, the parent side.
* :mod:`~envmgr.backends.local.pool` - the worker processes: start, start-up answers,
  why one was lost, shutdown.
* :mod:`~envmgr.backends.local.collect` - the parent's waits for answers, and reading them.
* :mod:`~envmgr.backends.local.worker` - the worker process's loop around ``serve``.
* :mod:`~envmgr.backends.local.doorbell` - command and done words in shared memory, the
  parent's side of them; :mod:`~envmgr.backends.local.worker_doorbell` the worker's.
* :mod:`~envmgr.backends.local.wait` - the one wait both sides use: spin, then sleep.
* :mod:`~envmgr.backends.local.caller_group` - the last envs stepped in the calling process.
* :mod:`~envmgr.backends.local.fork_safety` - which threads make ``fork`` unsafe.
"""
