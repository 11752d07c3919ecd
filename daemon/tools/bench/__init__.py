"""The benchmarks behind `edge-inferd bench` (e2e, its phases, load generation, the report, the plan, model)."""
