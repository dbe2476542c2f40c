"""What every family of in-rank faults shares: the fault clock, sleeping, and acting at the
entry of a named function."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from pathlib import Path

from hctool.agent import counts, names
from hctool.agent.clock import REAL
from hctool.protocol import env as protocol_env
from hctool.protocol.faults import Fault, anchor_file
from hctool.protocol.safefile import read_regular, write_atomic


class FaultClock:
    """Seconds since the workload started (0 before), and which faults fire now.

    A fault with at_call=K keeps its window on its own clock, which starts when the rank enters
    its K-th recorded collective: the same step of the program in every replay, however long
    the ranks took to start.

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
        self.calls = itertools.count(1)  # this rank's recorded collectives, numbered from 1
        self.anchored_at: dict[int, float] = {}  # K -> now() when the rank entered its K-th collective
        self.anchors = {f.at_call for f in faults if f.at_call is not None}
        self.rank = rank
        self.handoffs: set[int] = set()  # K: a supervisor's fault acts at this rank's K-th call

    def on_call(self) -> None:
        """Before each of the rank's recorded collectives (faults/__init__ registers it first, so a
        fault anchored at this very call acts on it)."""
        k = next(self.calls)
        if k in self.anchors:
            self.anchored_at[k] = self.now()
        if k in self.handoffs:
            self.hand_off(k)

    def hand_off(self, k: int) -> None:
        """A supervisor's fault (rank-pause) anchored at this call: say so in a file beside the
        fault clock, then wait until the supervisor has acted (it stops this process and writes
        `.done`), so the pause lands at this call and not wherever the rank got to before the
        supervisor's next look. The wait has a deadline: a supervisor that never answers costs
        a few seconds, never a hang."""
        if not self.path:
            return
        mark = anchor_file(self.path, self.rank, k)
        try:  # never through a link planted in the run folder
            write_atomic(Path(mark), f"{REAL.time()!r}".encode())
        except OSError:
            return
        give_up = REAL.monotonic() + HANDOFF_S
        while not os.path.exists(mark + ".done") and REAL.monotonic() < give_up:
            REAL.sleep(0.002)

    def since(self, f: Fault, t: float | None = None) -> float | None:
        """Seconds on f's own clock: from the workload's start, or for at_call=K from the rank's
        K-th collective (None until the rank gets there)."""
        t = self.now() if t is None else t
        if f.at_call is None:
            return t
        anchor = self.anchored_at.get(f.at_call)
        return None if anchor is None else t - anchor

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
        out = []
        for f in faults if faults is not None else self.faults:
            own = self.since(f, t) if f.kind in kinds else None
            if own is not None and f.active(own) and (f.p >= 1.0 or self.rng[f].random() < f.p):
                out.append(f)
        for f in out:
            counts.fired(f)
        return out

    def total_ms(self, kinds, faults=None) -> float:
        """The summed magnitude of the faults of these kinds that fire now."""
        return sum(f.ms for f in self.firing(kinds, faults))


HANDOFF_S = 5.0  # how long a rank waits at an anchored call for the supervisor to act


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
