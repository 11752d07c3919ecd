"""Not the daemon: the private broker, the demo, the baselines and the benchmarks. Only `daemon.cli`
imports this wing."""
