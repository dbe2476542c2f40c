"""io-delay: each read and write of a file whose absolute path matches path=GLOB takes ms longer
(`open()` returns a wrapper for those files only)."""

from __future__ import annotations

import builtins
import io
import os

from hctool.agent.faults.common import FaultClock, sleep_ms
from hctool.protocol.faults import Fault

KINDS = ("io-delay",)


class SlowFile:
    """A file object whose reads and writes take ms longer; everything else is the file's."""

    def __init__(self, f, delay) -> None:
        object.__setattr__(self, "_f", f)
        object.__setattr__(self, "_delay", delay)

    def __getattr__(self, name):
        value = getattr(self._f, name)
        if name in ("read", "read1", "readinto", "readline", "readlines", "write", "writelines"):
            delay = self._delay

            def slowed(*a, **kw):
                delay()
                return value(*a, **kw)

            return slowed
        return value

    def __setattr__(self, name, value) -> None:
        setattr(self._f, name, value)

    def __iter__(self):
        return iter(self.readline, "" if "b" not in getattr(self._f, "mode", "") else b"")

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def install(clock: FaultClock, faults: list[Fault]) -> None:
    real_open = builtins.open

    def slow_open(file, *args, **kwargs):
        f = real_open(file, *args, **kwargs)
        try:
            path = os.path.abspath(os.fsdecode(file)) if not isinstance(file, int) else ""
        except (TypeError, ValueError):
            return f
        mine = [x for x in faults if x.matches_path(path)]
        if not mine:
            return f
        return SlowFile(f, lambda: sleep_ms(clock.total_ms(KINDS, mine)))

    builtins.open = slow_open
    io.open = slow_open
