"""The Ray backend: each group is a Ray actor running the same env-side stepper.

* :mod:`~envmgr.backends.ray.backend` - :class:`RayBackend`, the driver side.
* :mod:`~envmgr.backends.ray.actor` - the actor around ``serve``.

Importing this package never imports Ray; it is imported when a manager is built.
"""
