"""The public managers: a front end put on a backend.

* :mod:`~envmgr.managers.local` - :class:`SubprocessEnvManager` (worker processes).
* :mod:`~envmgr.managers.ray` - :class:`RayEnvManager` (Ray actors; Ray imported lazily).
* :mod:`~envmgr.managers.make` - :func:`make`, by env id.
* :mod:`~envmgr.managers.arguments` - constructor arguments to factories, layout and specs.
"""
