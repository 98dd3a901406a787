"""Adapters that put envmgr under other RL libraries.

Each integration lives in its own module and imports its library only when that
module is imported, so ``import envmgr`` never needs them:

* :mod:`envmgr.integrations.sb3`: ``EnvmgrVecEnv``, a Stable-Baselines3 ``VecEnv``
  (``pip install "envmgr[sb3]"``).
"""
