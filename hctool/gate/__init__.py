"""`hctool gate`: one command for a CI job.

config (the [tool.hctool.gate] table) -> steps (lint, tests, repro, chaos; each a
subprocess with a deadline, reaped on every path) -> cases (one per lint finding,
multi-rank test, repro variant, chaos anomaly) -> junit / sarif / output
(summary table, GitHub annotations).
"""
