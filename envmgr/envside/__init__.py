"""The env side: the stepper that a worker process, a Ray actor and the caller group all run.

* :mod:`~envmgr.envside.group` - :class:`EnvGroup`, single envs with autoreset.
* :mod:`~envmgr.envside.vector_group` - one hosted gymnasium ``VectorEnv``.
* :mod:`~envmgr.envside.serve` - one command in, one answer out.

It knows nothing of pipes, shared-memory doorbells or Ray.
"""
