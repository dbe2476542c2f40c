"""The real clocks and file opener, captured before any fault patches them: the agent's own
timing (fault windows, the recorder's stamps, the lifeline) must not follow a skewed clock."""

from __future__ import annotations

import builtins
import time
from types import SimpleNamespace

REAL = SimpleNamespace(
    time=time.time,
    time_ns=time.time_ns,
    monotonic=time.monotonic,
    monotonic_ns=time.monotonic_ns,
    perf_counter=time.perf_counter,
    perf_counter_ns=time.perf_counter_ns,
    sleep=time.sleep,
    open=builtins.open,
)
