"""Acting on a function by its qualified name, `pkg.mod:Qual.name`, inside a rank.

`on_call(target, before, after)` wraps that function (a module function, a method, a static
or class method) as soon as its module has been executed (agent/hooks.py), so every later
caller gets the wrapper. `__main__:name` names a function of the script being run: the
script's module is executed by runpy, not imported, so a trace function watches only the
script's top-level frame and wraps the name once its `def` has run, then stops tracing.
Several users of one target share one wrapper; `resolved(target)` says whether it was found.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable

from hctool.agent.hooks import when_imported

# before(frame_of_caller, args, kwargs) -> None; after(frame_of_caller, result) -> None
Before = Callable[[object, tuple, dict], None]
After = Callable[[object, object], None]

_lock = threading.RLock()
_hooks: dict[str, tuple[list[Before], list[After]]] = {}
_state: dict[str, str] = {}  # target -> "pending" | "wrapped" | "missing: why"


def split(target: str) -> tuple[str, list[str]]:
    module, _, qual = target.partition(":")
    return module, qual.split(".")


def state_of(target: str) -> str:
    return _state.get(target, "pending")


def on_call(target: str, before: Before | None = None, after: After | None = None) -> None:
    with _lock:
        first = target not in _hooks
        befores, afters = _hooks.setdefault(target, ([], []))
        if before is not None:
            befores.append(before)
        if after is not None:
            afters.append(after)
        if not first:
            return
        _state[target] = "pending"
    module, qual = split(target)
    if module == "__main__":
        _watch_main(target, qual)
    else:
        when_imported(module, lambda mod: _wrap_in(target, mod, qual))


# hctool's own code (the recorder writing its side table calls json.dumps, os.path.basename...):
# a probe or a fault on a function it uses acts on the program's calls only, never on hctool's,
# so it cannot blind the recorder or fire inside it.
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _wrapper(target: str, fn):
    befores, afters = _hooks[target]

    @functools.wraps(fn)
    def called(*args, **kwargs):
        caller = sys._getframe(1)
        if caller.f_code.co_filename.startswith(_OWN):
            return fn(*args, **kwargs)
        for b in befores:
            b(caller, args, kwargs)
        result = fn(*args, **kwargs)
        for a in afters:
            a(caller, result)
        return result

    called.__hctool_original__ = fn
    return called


def _wrap_in(target: str, holder, qual: list[str]) -> None:
    """Replace holder.<qual...> by the wrapper; records why not in _state."""
    parent = holder
    for name in qual[:-1]:
        parent = getattr(parent, name, None)
        if parent is None:
            _state[target] = f"missing: no {name!r} in {getattr(holder, '__name__', holder)!r}"
            return
    name = qual[-1]
    raw = parent.__dict__.get(name) if isinstance(parent, type) else getattr(parent, name, None)
    if raw is None and isinstance(parent, type):
        raw = getattr(parent, name, None)  # inherited: wrap it on this class
    if raw is None:
        _state[target] = f"missing: no {'.'.join(qual)!r} in {getattr(holder, '__name__', holder)!r}"
        return
    if getattr(raw, "__hctool_original__", None) is not None:
        _state[target] = "wrapped"
        return
    if isinstance(raw, (staticmethod, classmethod)):
        wrapped = type(raw)(_wrapper(target, raw.__func__))
    elif callable(raw):
        wrapped = _wrapper(target, raw)
    else:
        _state[target] = f"missing: {'.'.join(qual)} is not callable"
        return
    setattr(parent, name, wrapped)
    _state[target] = "wrapped"


def _watch_main(target: str, qual: list[str]) -> None:
    """Trace only the __main__ module's own top-level frame: each line of the script's body,
    once the named object exists in its globals, wrap it; stop tracing when all are wrapped
    (or the body ends)."""
    waiting = _main_targets()
    waiting[target] = qual
    if len(waiting) > 1:
        return

    def local(frame, event, arg):
        if event in ("line", "return"):
            for t, q in list(waiting.items()):
                if q[0] in frame.f_globals:
                    _wrap_in(t, _Globals(frame.f_globals), q)
                    del waiting[t]
            if not waiting or event == "return":
                for t in waiting:
                    _state[t] = f"missing: the script defined no {'.'.join(waiting[t])!r} at top level"
                sys.settrace(None)
                return None
        return local

    def global_trace(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return local
        return None

    sys.settrace(global_trace)


def _main_targets(_cache={}) -> dict[str, list[str]]:  # noqa: B006 - one table per process
    return _cache


class _Globals:
    """A module-like view of a globals dict (the script's __main__ namespace)."""

    def __init__(self, d: dict) -> None:
        object.__setattr__(self, "_d", d)
        object.__setattr__(self, "__name__", "__main__")

    def __getattr__(self, name):
        try:
            return self._d[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value) -> None:
        self._d[name] = value


def reset() -> None:
    """Forget every hook (tests; a rank installs its hooks once). Wrapped functions stay
    wrapped until their owner restores them."""
    with _lock:
        _hooks.clear()
        _state.clear()
        _main_targets().clear()
