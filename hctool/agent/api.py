"""The in-rank API: labelled values that must agree across ranks, recorded without any
collective of the program's own (public as hctool.consensus.assert_same / rank_consensus)."""

from __future__ import annotations

import functools
import inspect


def assert_same(label: str, value) -> None:
    """Record `value` under `label`; the analyzer checks every rank recorded the
    same digest at the same position of the "labels" sequence. Issues no collective;
    a no-op unless the recorder is installed (HCTOOL_TRACE_DIR)."""
    from hctool.agent.capture import recorder

    recorder.record_label(label, value, depth=2)


def rank_consensus(same_params=True, same_results=False):
    """Decorator: record the call's parameters (True, or an iterable of parameter
    names) and/or its result as labelled events named after the function."""

    def decorate(fn):
        sig = inspect.signature(fn)
        name = fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from hctool.agent.capture import recorder

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
