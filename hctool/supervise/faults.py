"""A job's faults seen from the supervisor: one controller for every road (check-consensus,
chaos on a command or on the engine, repro, `launch --inject`).

It keeps the fault clock the agents read (HCTOOL_FAULTS_T0: "T0", then "T0 HEAL_S" at the heal),
notes every fault's window in the history (fault-on, fault-off, fault-skipped, heal), and carries
out the kinds whose row says they act outside the ranks (`ACTIONS`): rank-pause (SIGSTOP for ms,
then SIGCONT) and rank-kill (SIGKILL) on the ranks' pids, the workload kinds through the caller's
workload. A fault with a rank acts on that rank (waiting until its pid is known), one without on
every rank; `p` is drawn per fault from the seed, so a replay acts alike. Every stopped rank is
continued on every path (release())."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hctool.protocol import env as protocol_env
from hctool.protocol.faults import KIND, Acts, Fault, anchor_file
from hctool.protocol.safefile import write_atomic

CLIENT = "client"  # the key a workload fault's firings are counted under (no rank sends them)


class FaultController:
    # What the supervisor does for each kind that does not act inside a rank (its row's `acts`);
    # tests/chaos/test_kinds.py holds every such row to an entry here.
    ACTIONS: dict[str, str] = {
        "rank-pause": "_pause",
        "rank-kill": "_kill",
        "request-burst": "_workload",
        "request-cancel": "_workload",
    }

    def __init__(
        self,
        faults: Sequence[Fault],
        clock_file: Path,
        *,
        heal_s: float | None = None,
        seed: int = 0,
        history=None,
        workload: Callable[[Fault], None] | None = None,
        on_heal: Callable[[], None] | None = None,
    ):
        self.faults = list(faults)
        self.clock_file = Path(clock_file)
        self.heal_s, self.history = heal_s, history
        self.workload, self.on_heal = workload, on_heal
        self.rng = random.Random(f"hctool-control/{seed}")
        self.t0: float | None = None
        self.t0_wall: float | None = None
        self.outside = [f for f in self.faults if KIND[f.kind].acts is not Acts.RANK]
        self.events: list[tuple[float, str, Fault]] = []
        self.paused: dict[int, float] = {}  # pid -> when to continue (seconds after t0)
        self.killed: list[int] = []  # ranks
        self.fired: dict[str, dict[str, int]] = {f.spec(): {} for f in self.outside}
        self.healed = False
        self.anchors_done: set[tuple[str, int]] = set()  # (fault, rank) acted at its anchored call
        self.anchored_due: list[tuple[float, Fault, int]] = []  # (when, fault, rank): start_s after the call

    def env(self) -> dict[str, str]:
        return {protocol_env.FAULTS_T0: str(self.clock_file.resolve())}

    def started(self, t0_wall: float | None = None, **note) -> None:
        """The workload starts now: the fault clock's zero (`note`: what the history says of it)."""
        self.t0, self.t0_wall = time.monotonic(), time.time() if t0_wall is None else t0_wall
        self.clock_file.parent.mkdir(parents=True, exist_ok=True)
        self._write(f"{self.t0_wall!r}")
        for f in self.faults:
            if f.at_call is not None:
                continue  # it waits for its rank's call (tick: _anchored), not for a second
            self.events.append((f.start_s, "on", f))
            if f.duration_s is not None and KIND[f.kind].window:
                self.events.append((f.start_s + f.duration_s, "off", f))
        self.events.sort(key=lambda e: e[0])
        self._note("workload-start", **note)

    def now(self) -> float:
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def tick(self, pids: dict[int, int]) -> None:
        """Carry out what is due by now on the ranks' live pids; continue paused ranks whose time is up."""
        if self.t0 is None:
            return
        now = self.now()
        # faults already due fire before a heal due at the same tick: a workload that ends between
        # two ticks must not skip a fault whose window had opened
        while self.events and self.events[0][0] <= now and not self.healed:
            at, what, f = self.events[0]
            if what == "on" and f in self.outside and not self._can_act(f, pids):
                break  # its rank has not recorded its pid yet: try on the next tick
            self.events.pop(0)
            self._note(f"fault-{what}", at_s=round(now, 2), fault=f.spec())
            if what == "on" and f in self.outside:
                if f.p < 1.0 and self.rng.random() >= f.p:
                    continue
                getattr(self, self.ACTIONS[f.kind])(f, now, pids)
        if not self.healed:
            self._anchored(now, pids)
        if self.heal_s is not None and now >= self.heal_s:
            self.heal(now)
        for pid, until in list(self.paused.items()):
            if now >= until:
                _signal(pid, signal.SIGCONT)
                del self.paused[pid]
                self._note("rank-continue", pid=pid, at_s=round(now, 2))

    def _anchored(self, now: float, pids: dict[int, int]) -> None:
        """Act on each rank that has reached the call an anchored fault waits for (its file beside
        the clock), then let it go on (`.done`): a pause then stops it at that very call."""
        for f in self.outside:
            if f.at_call is None or KIND[f.kind].acts is not Acts.SUPERVISOR:
                continue
            for rank in self._ranks(f, pids):
                mark = anchor_file(str(self.clock_file), rank, f.at_call)
                if (f.spec(), rank) in self.anchors_done or not os.path.exists(mark) or rank not in pids:
                    continue
                self.anchors_done.add((f.spec(), rank))
                if f.start_s > 0:  # some way into the step after the call: the rank goes on meanwhile
                    write_atomic(Path(mark + ".done"), b"")
                    self.anchored_due.append((now + f.start_s, f, rank))
                    continue
                self._act_anchored(f, rank, now, pids)
                write_atomic(Path(mark + ".done"), b"")
        for due in [d for d in self.anchored_due if d[0] <= now]:
            self.anchored_due.remove(due)
            _, f, rank = due
            if rank in pids:
                self._act_anchored(f, rank, now, pids)

    def _act_anchored(self, f: Fault, rank: int, now: float, pids: dict[int, int]) -> None:
        self._note("fault-on", at_s=round(now, 2), fault=f.spec(), rank=rank, at_call=f.at_call)
        if f.p >= 1.0 or self.rng.random() < f.p:
            getattr(self, self.ACTIONS[f.kind])(f, now, {rank: pids[rank]})

    def _can_act(self, f: Fault, pids: dict[int, int]) -> bool:
        if KIND[f.kind].acts is Acts.WORKLOAD:
            return True
        return f.rank in pids if f.rank is not None else bool(pids)

    def _ranks(self, f: Fault, pids: dict[int, int]) -> list[int]:
        return [f.rank] if f.rank is not None else sorted(pids)

    def _pause(self, f: Fault, now: float, pids: dict[int, int]) -> None:
        for rank in self._ranks(f, pids):
            if rank in pids:
                _signal(pids[rank], signal.SIGSTOP)
                self.paused[pids[rank]] = now + f.ms / 1000.0
                self._fired(f, str(rank), now)

    def _kill(self, f: Fault, now: float, pids: dict[int, int]) -> None:
        for rank in self._ranks(f, pids):
            if rank in pids:
                self.killed.append(rank)
                _signal(pids[rank], signal.SIGKILL)
                self._fired(f, str(rank), now)

    def _workload(self, f: Fault, now: float, pids: dict[int, int]) -> None:
        if self.workload is not None:  # without a workload (a command job) the kind was refused earlier
            self.workload(f)
            self._fired(f, CLIENT, now)

    def _fired(self, f: Fault, who: str, now: float) -> None:
        self.fired[f.spec()][who] = self.fired[f.spec()].get(who, 0) + 1
        self._note("fault-acted", fault=f.spec(), rank=who, at_s=round(now, 2))

    def heal(self, now: float | None = None) -> None:
        """No fault fires from now on (the agents read it from the clock file); faults that had
        not started never will."""
        if self.healed or self.t0 is None:
            return
        now = self.now() if now is None else now
        self.healed = True
        self._write(f"{self.t0_wall!r} {now:.3f}")
        self._note("heal", at_s=round(now, 2))
        for _, what, f in self.events:
            if what == "on":
                self._note("fault-skipped", fault=f.spec())
        self.events = []
        if self.on_heal is not None:
            self.on_heal()

    def idle(self) -> bool:
        """Nothing is paused (a stopped rank would read as a stall or a hang)."""
        return not self.paused

    def release(self) -> None:
        """Never leave a stopped rank behind, whatever happened."""
        for pid in list(self.paused):
            _signal(pid, signal.SIGCONT)
        self.paused.clear()

    def counts(self) -> list[dict]:
        """Per fault carried out here: {"spec", "fired": {rank or "client": n}, "total"}, as the agents' files."""
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
