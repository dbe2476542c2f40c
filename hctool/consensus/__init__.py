"""check-consensus: name the first divergent collective of a job from every rank's trace.

The analyzer lives here (supervisor side): trace (reading traces), flight_recorder (reading
FR dumps safely), align (channels and the evidence that they disagree), blame (the cause:
sequences aligned, and the rank whose path deviated), structure (the program's loops and
branches, from its source), waits (who waits for whom, wait cycles), analyze (the report),
model (the typed report), live (the incremental watcher), report (rich rendering), run
(supervising a job), kernel_build (the C++ capture kernel). The recorder runs inside the
ranks: hctool/agent/capture.
Cross-site pairings (pattern) are never evidence by themselves (docs/consensus.md
"Evidence, cause and culprit").

Public API (light to import):
  analyze_dir(path, exit_codes=None, stacks=None, command_exit=None, ended_at=None)
                                   -> consensus.model.Report (its to_json(): docs/contracts.md)
  assert_same(label, value)        record a value that must agree across ranks (in a rank)
  @rank_consensus(same_params=..., same_results=...)
"""

from __future__ import annotations


def analyze_dir(path, exit_codes=None, stacks=None, command_exit=None, ended_at=None):
    """Raises hctool.consensus.trace.TraceError (a ValueError) for a folder hctool cannot read."""
    from hctool.consensus.analyze import analyze_dir as _analyze

    return _analyze(path, exit_codes=exit_codes, stacks=stacks, command_exit=command_exit, ended_at=ended_at)


def __getattr__(name: str):
    if name in ("assert_same", "rank_consensus"):  # in-rank API, implemented by the agent
        from hctool.agent import api

        return getattr(api, name)
    raise AttributeError(f"module 'hctool.consensus' has no attribute {name!r}")
