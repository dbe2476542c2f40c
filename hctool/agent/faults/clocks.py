"""clock-skew, clock-jump, clock-jitter: time.time/monotonic/perf_counter (and _ns) of the whole
rank gain the skew and jumps (never going back; after the heal the clock keeps what it gained);
time.time also gets the jitter. The agent itself reads REAL clocks."""

from __future__ import annotations

import os
import random
import time

from hctool.agent import counts
from hctool.agent.clock import REAL
from hctool.agent.faults.common import FaultClock
from hctool.protocol.faults import Fault

KINDS = ("clock-skew", "clock-jump", "clock-jitter")


def install(clock: FaultClock, faults: list[Fault]) -> None:
    skews = [f for f in faults if f.kind in ("clock-skew", "clock-jump")]
    jitters = [f for f in faults if f.kind == "clock-jitter"]
    took_effect: set[Fault] = set()

    def offset() -> float:
        now, off = clock.now(), 0.0
        if clock.heal is not None:
            now = min(now, clock.heal)
        for f in skews:
            t = clock.since(f, now)
            if t is None or t < f.start_s:
                continue
            if f not in took_effect:  # a clock fault "fires" once: when it starts to act
                took_effect.add(f)
                counts.fired(f)
            active = (t if f.duration_s is None else min(t, f.start_s + f.duration_s)) - f.start_s
            off += f.ms / 1000.0 if f.kind == "clock-jump" else f.ms / 1000.0 * active
        return off

    rng = random.Random(f"jitter#{os.environ.get('RANK', '0')}")

    def jitter() -> float:
        total = clock.total_ms(("clock-jitter",), jitters) if jitters else 0.0
        return rng.uniform(-total, total) / 1000.0 if total else 0.0

    if skews:
        time.monotonic = lambda: REAL.monotonic() + offset()
        time.perf_counter = lambda: REAL.perf_counter() + offset()
        time.monotonic_ns = lambda: REAL.monotonic_ns() + int(offset() * 1e9)
        time.perf_counter_ns = lambda: REAL.perf_counter_ns() + int(offset() * 1e9)
    if skews or jitters:
        time.time = lambda: REAL.time() + offset() + jitter()
        time.time_ns = lambda: REAL.time_ns() + int((offset() + jitter()) * 1e9)
