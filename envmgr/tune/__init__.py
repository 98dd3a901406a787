"""``envmgr tune ENV_ID``: which layout to use for this env on this machine, and why.

envmgr can run the same envs in several layouts: more or fewer worker processes, the whole
batch per ``step`` or each worker as soon as it is ready (``send``/``recv``), a block stepped
by the caller itself (``caller_envs``), and one batched env per worker where the id has a
vector entry point. Which is fastest depends on the env and the machine. :func:`tune` builds
each one that applies, times them in interleaved rounds side by side with the machine's
ceiling, and returns the table, the ``envmgr.make(...)`` call of the fastest, and why it wins,
read from the merged timer tree of the measured runs. With ``parallel=True`` (``envmgr tune
--parallel module:factory``) it does the same for a PettingZoo ``ParallelEnv`` factory and
:func:`envmgr.make_parallel`, in agent-steps/s as well as env-steps/s.

* :mod:`envmgr.tune.targets` - what is tuned: a Gymnasium id, or a PettingZoo factory;
* :mod:`envmgr.tune.layouts` - the layouts, their calls, stepping one for a while;
* :mod:`envmgr.tune.ceiling` - the ceiling: one process per core, no communication;
* :mod:`envmgr.tune.serial_agents` - the multi-agent ceiling's loop, agents packed in rows;
* :mod:`envmgr.tune.run` - the rounds; :mod:`envmgr.tune.result` - the result, printed;
* :mod:`envmgr.tune.diagnose` - reading the timer tree.

Example::

    from envmgr.tune import tune
    result = tune("CartPole-v1", num_envs=8, seconds=50)
    print(result)        # the table, the call, why
    result.call          # 'envmgr.make("CartPole-v1", num_envs=8, ...)'
    tune("mpe2.simple_spread_v3:parallel_env", num_envs=16, parallel=True)
"""

from __future__ import annotations

from envmgr.tune.ceiling import TuneError
from envmgr.tune.layouts import Layout
from envmgr.tune.result import Measurement, TuneResult
from envmgr.tune.run import tune

__all__ = ["Layout", "Measurement", "TuneError", "TuneResult", "tune"]
