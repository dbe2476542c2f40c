"""delay, raise: at the entry (delay with when=exit: the return) of the function fn= names
(pkg.mod:Qual.name, `__main__:fn` for the script run; agent/names.py wraps it)."""

from __future__ import annotations

import builtins
import importlib

from hctool.agent import counts, names
from hctool.agent.faults.common import FaultClock, on_entry, raise_for, sleep_ms
from hctool.protocol.faults import Fault

KINDS = ("delay", "raise")


def exception(name: str) -> type[BaseException]:
    value = getattr(builtins, name, None)
    if isinstance(value, type) and issubclass(value, BaseException):
        return value
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def install(clock: FaultClock, faults: list[Fault]) -> None:
    for f in faults:
        if f.kind == "raise":
            on_entry(clock, f, f.fn, lambda f=f: raise_for(exception(f.exc), f))
        elif f.when == "exit":
            counts.track_target(f, f.fn)
            names.on_call(f.fn, after=lambda caller, result, f=f: sleep_ms(clock.total_ms(("delay",), [f])))
        else:
            on_entry(clock, f, f.fn, lambda f=f: sleep_ms(f.ms))
