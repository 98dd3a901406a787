"""What the suites and probes share: envs, implementations, the ceiling, timing, run context."""
