"""A job's faults seen from the supervisor: the fault clock the agents read (HCTOOL_FAULTS_T0:
"T0", then "T0 HEAL_S" at the heal), and the controller kinds carried out from outside the
ranks (rank-pause: SIGSTOP for ms, then SIGCONT; rank-kill: SIGKILL), on the ranks' pids as
the traces name them. Every stopped rank is continued on every path (release())."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from hctool.protocol import env as protocol_env
from hctool.protocol.faults import CONTROLLER, Fault
from hctool.protocol.safefile import write_atomic


class JobController:
    def __init__(self, faults: list[Fault], folder: Path, heal_s: float | None = None, seed: int = 0, history=None):
        self.controller = [f for f in faults if f.kind in CONTROLLER]
        self.clock_file = Path(folder) / "fault-clock"
        self.heal_s, self.history = heal_s, history
        self.rng = random.Random(f"hctool-control/{seed}")
        self.t0 = self.t0_wall = None
        self.pending = sorted(self.controller, key=lambda f: f.start_s)
        self.paused: dict[int, float] = {}  # pid -> when to continue (seconds after t0)
        self.killed: list[int] = []  # ranks
        self.fired: dict[str, dict[str, int]] = {f.spec(): {} for f in self.controller}
        self.healed = False

    def env(self) -> dict[str, str]:
        return {protocol_env.FAULTS_T0: str(self.clock_file.resolve())}

    def started(self) -> None:
        self.t0, self.t0_wall = time.monotonic(), time.time()
        self._write(f"{self.t0_wall!r}")
        self._note("workload-start")

    def tick(self, pids: dict[int, int]) -> None:
        if self.t0 is None:
            return
        now = time.monotonic() - self.t0
        if self.heal_s is not None and now >= self.heal_s and not self.healed:
            self.heal(now)
        while self.pending and self.pending[0].start_s <= now and not self.healed:
            f = self.pending[0]
            if f.rank is not None and f.rank not in pids:
                break  # its rank has not recorded its pid yet: try on the next tick
            self.pending.pop(0)
            if f.p < 1.0 and self.rng.random() >= f.p:
                continue
            self._act(f, now, pids)
        for pid, until in list(self.paused.items()):
            if now >= until:
                _signal(pid, signal.SIGCONT)
                del self.paused[pid]
                self._note("rank-continue", pid=pid, at_s=round(now, 2))

    def _act(self, f: Fault, now: float, pids: dict[int, int]) -> None:
        for rank in [f.rank] if f.rank is not None else sorted(pids):
            pid = pids.get(rank)
            if pid is None:
                continue
            if f.kind == "rank-pause":
                _signal(pid, signal.SIGSTOP)
                self.paused[pid] = now + f.ms / 1000.0
            elif f.kind == "rank-kill":
                self.killed.append(rank)
                _signal(pid, signal.SIGKILL)
            else:
                continue  # request kinds need the engine's workload
            self.fired[f.spec()][str(rank)] = self.fired[f.spec()].get(str(rank), 0) + 1
            self._note("fault-on", fault=f.spec(), rank=rank, at_s=round(now, 2))

    def heal(self, now: float | None = None) -> None:
        """No fault fires from now on (the agents read it from the clock file)."""
        if self.healed or self.t0 is None:
            return
        now = time.monotonic() - self.t0 if now is None else now
        self.healed = True
        self._write(f"{self.t0_wall!r} {now:.3f}")
        self._note("heal", at_s=round(now, 2))

    def release(self) -> None:
        for pid in list(self.paused):
            _signal(pid, signal.SIGCONT)
        self.paused.clear()

    def counts(self) -> list[dict]:
        return [{"spec": s, "fired": dict(c), "total": sum(c.values())} for s, c in self.fired.items()]

    def _write(self, text: str) -> None:
        write_atomic(self.clock_file, text.encode())  # never through a link planted in the folder

    def _note(self, what: str, **kw) -> None:
        if self.history is not None:
            self.history.add(what, **kw)


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
