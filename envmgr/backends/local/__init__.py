"""The local backend: worker processes, shared memory and a doorbell.

* :mod:`~envmgr.backends.local.process` - :class:`ProcessBackend`, the parent side.
* :mod:`~envmgr.backends.local.worker` - the worker process's loop around ``serve``.
* :mod:`~envmgr.backends.local.doorbell` - command and done words in shared memory, and
  how each side sleeps and is woken.
* :mod:`~envmgr.backends.local.caller_group` - the last envs stepped in the calling process.
* :mod:`~envmgr.backends.local.fork_safety` - which threads make ``fork`` unsafe.
"""
