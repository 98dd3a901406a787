"""Transports: where the groups run and how commands reach them.

* :mod:`~envmgr.backends.base` - the :class:`Backend` protocol the front end drives.
* :mod:`~envmgr.backends.local` - worker processes on this machine.
* :mod:`~envmgr.backends.ray` - Ray actors (``pip install "envmgr[ray]"``).
"""
