"""What every family of in-rank faults shares: the fault clock, sleeping, and acting at the
entry of a named function."""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from hctool.agent import counts, names
from hctool.agent.clock import REAL
from hctool.protocol import env as protocol_env
from hctool.protocol.faults import Fault
from hctool.protocol.safefile import read_regular


class FaultClock:
    """Seconds since the workload started (0 before), and which faults fire now.

    A supervisor writes the workload's start to the file named by HCTOOL_FAULTS_T0 (until it
    exists, or without it, the clock reads 0, so faults starting at 0 are on from launch); at
    the heal it adds the heal's second, and from then on no fault fires. Probabilities draw
    from a rank-local RNG seeded from the fault and the rank, so a replay draws alike."""

    def __init__(self, faults: list[Fault], rank: int):
        self.faults = faults
        self.path = os.environ.get(protocol_env.FAULTS_T0)
        self.t0: float | None = None if self.path else REAL.time()
        self._next_look = 0.0
        self.heal: float | None = None
        self.rng = {f: random.Random(f"{f.spec()}#{rank}") for f in faults}

    def now(self) -> float:
        """Seconds since the workload started; the file holds "T0 [HEAL_S]" and is re-read
        every 0.1 s until the heal is known."""
        if self.path and self.heal is None:
            mono = REAL.monotonic()
            if mono >= self._next_look:
                self._next_look = mono + 0.1
                try:  # the run folder may be shared: never block on a FIFO or follow a link there
                    parts = [float(x) for x in read_regular(self.path, 4096).split()]
                    self.t0 = parts[0]
                    self.heal = parts[1] if len(parts) > 1 else None
                except (OSError, ValueError, IndexError):
                    pass
        return 0.0 if self.t0 is None else max(0.0, REAL.time() - self.t0)

    def firing(self, kinds, faults=None) -> list[Fault]:
        """Active faults of these kinds that fire for this operation (probability p); each
        one returned is counted as fired."""
        t = self.now()
        if self.heal is not None and t >= self.heal:
            return []
        out = [
            f
            for f in (faults if faults is not None else self.faults)
            if f.kind in kinds and f.active(t) and (f.p >= 1.0 or self.rng[f].random() < f.p)
        ]
        for f in out:
            counts.fired(f)
        return out

    def total_ms(self, kinds, faults=None) -> float:
        """The summed magnitude of the faults of these kinds that fire now."""
        return sum(f.ms for f in self.firing(kinds, faults))


def sleep_ms(ms: float) -> None:
    if ms > 0:
        REAL.sleep(ms / 1000.0)


def on_entry(clock: FaultClock, f: Fault, target: str, act: Callable[[], object]) -> None:
    """At each entry of target (pkg.mod:Qual.name), if f fires: act()."""
    counts.track_target(f, target)

    def before(caller, args, kwargs):
        if clock.firing((f.kind,), [f]):
            act()

    names.on_call(target, before=before)


def raise_for(exc: type[BaseException], f: Fault):
    raise exc(f"hctool fault {f.spec()}")
