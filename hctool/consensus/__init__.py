"""check-consensus: record every collective on every rank, name the first divergence.

Modules: recorder (inside ranks: record_collective/record_complete), tracefile
(its files and interned names), wrappers (the torch.distributed capture route),
capture_c10d (C++-issued and functional collectives), records (the trace format),
trace (reading traces), flight_recorder (reading FR dumps safely), align
(per-group alignment and the first divergence), pattern and locate (cross-site
pairings: evidence only when calls of one line meet out of step, else where a
divergence is located), waits (who waits for whom, wait cycles), live (the
supervisor's incremental watcher), report (rich rendering).

Public API (kept light to import: the analyzer loads on first use):
  analyze_dir(path, exit_codes=None, stacks=None) -> report dict (docs/contracts.md)
  assert_same(label, value)        record a value that must agree across ranks
  @rank_consensus(same_params=..., same_results=...)
"""

from __future__ import annotations

import functools
import inspect


def analyze_dir(path, exit_codes=None, stacks=None, command_exit=None, ended_at=None) -> dict:
    """Raises hctool.consensus.trace.TraceError (a ValueError) for a folder hctool cannot read."""
    from hctool.consensus.analyze import analyze_dir as _analyze

    return _analyze(path, exit_codes=exit_codes, stacks=stacks, command_exit=command_exit, ended_at=ended_at)


def assert_same(label: str, value) -> None:
    """Record `value` under `label`; the analyzer checks every rank recorded the
    same digest at the same position of the "labels" sequence. Issues no collective;
    a no-op unless the recorder is installed (HCTOOL_TRACE_DIR)."""
    from hctool.consensus import recorder

    recorder.record_label(label, value, depth=2)


def rank_consensus(same_params=True, same_results=False):
    """Decorator: record the call's parameters (True, or an iterable of parameter
    names) and/or its result as labelled events named after the function."""
    def decorate(fn):
        sig = inspect.signature(fn)
        name = fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from hctool.consensus import recorder

            if recorder.enabled() and same_params:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                params = {k: v for k, v in bound.arguments.items() if k not in ("self", "cls")}
                if same_params is not True:
                    params = {k: params[k] for k in same_params}
                recorder.record_label(f"{name}(params)", params, depth=2)
            result = fn(*args, **kwargs)
            if recorder.enabled() and same_results:
                recorder.record_label(f"{name}(result)", result, depth=2)
            return result

        return wrapper

    return decorate
