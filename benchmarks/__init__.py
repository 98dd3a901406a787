"""envmgr's benchmarks, run from the repository root as ``python -m benchmarks.<folder>.<name>``.

Nothing here is installed or imported by ``envmgr``. The folders, lowest first (a module
imports only from its own folder or a lower one)::

    _common   the harness: benchmark envs, implementations, the ceiling, timing, run context
    report    tables, plots and the documents' generated blocks, from results/
    probes    one question each (a cost, a floor, a timeline, a soak)
    suites    what a user runs to compare envmgr with its peers and its yardsticks

``benchmarks/README.md`` says what each one answers and its command.
"""
