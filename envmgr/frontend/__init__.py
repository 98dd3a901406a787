"""The front end: the ``VectorEnv`` API over any :class:`~envmgr.backends.base.Backend`.

* :mod:`~envmgr.frontend.vector_env` - :class:`BatchedVectorEnv`, the public API.
* :mod:`~envmgr.frontend.state` - the one state (idle, pending, in flight, broken, closed).
* :mod:`~envmgr.frontend.session` - that state with the waits, restarts and timers the
  parts below share.
* :mod:`~envmgr.frontend.calls` - per-env calls; :mod:`~envmgr.frontend.first_ready` -
  ``send``/``recv``.
* :mod:`~envmgr.frontend.action_checks`, :mod:`~envmgr.frontend.validation`,
  :mod:`~envmgr.frontend.resets` - what is checked before anything is sent.
* :mod:`~envmgr.frontend.results` - a call's results read out of the batch arrays.
* :mod:`~envmgr.frontend.restarts`, :mod:`~envmgr.frontend.options` - restart budget, options.
"""
