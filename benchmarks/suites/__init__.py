"""Suites: envmgr against its peers and yardsticks (``throughput`` is ``envmgr bench``)."""
