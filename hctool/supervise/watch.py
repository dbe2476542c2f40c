"""The one watch loop of a supervised job: check-consensus, the pytest plugin and command chaos
(a command job), repro and engine chaos (a topology) all wait on a job through it.

Each pass: the caller's tick (a progress line, chaos hooks), the fault controller on the ranks'
live pids, the first death, the live check of the traces; then the job ends on a finding (when
`abort`), on a death after its grace (the dead rank's last records reach the traces; its peers
can only block on it, as torchrun knows), when it is done, when nothing progressed for `stall_s`,
or at the deadline. Every wait is bounded by the deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

POLL_S = 0.2


class Job(Protocol):
    """What the supervisor needs of a running job; a command job (supervise/job.py), a TP
    topology and a PD topology (hctool/launch) each have it."""

    def pids_by_rank(self) -> dict[int, int]: ...  # the live ranks' pids

    def rank_exit_codes(self) -> dict[int, int | None]: ...  # None: still running

    def first_death(self) -> Any | None: ...  # the first process that failed (its .message())


@dataclass
class Watched:
    outcome: str  # finding | death | done | stalled | deadline
    finding: Any | None  # the live check's Report, if it found one
    latency: float | None  # seconds from the first divergent call to its detection
    death: Any | None


def watch(
    job: Job,
    watcher,
    *,
    deadline: float,
    done: Callable[[], bool],
    faults=None,
    on_tick: Callable[[], None] | None = None,
    abort: bool = True,
    death_grace_s: float = 0.5,
    codes_to_watcher: bool = True,
    last_progress: Callable[[], float] | None = None,
    stall_s: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Watched:
    """`deadline`: monotonic time; `done()`: the job's own end (everything exited, the workload
    answered); `codes_to_watcher`: the live check may read the ranks' exit codes (not under a
    wrapper command, whose ranks are not ours: their traces say how they ended)."""
    finding = latency = death = None
    death_at = 0.0
    while True:
        if on_tick is not None:
            on_tick()
        if faults is not None:
            faults.tick(job.pids_by_rank())
        if death is None:
            death = job.first_death()
            death_at = time.monotonic()
            if death is not None and log is not None:
                log(f"{death.message()}: ending the job in {death_grace_s:g} s")
        codes = job.rank_exit_codes()
        live = watcher.check(codes if codes_to_watcher else None)
        if live is not None and finding is None:
            finding, latency = live, watcher.latency_s()
            if log is not None:
                log(live.headline())
            if abort and death is None:
                return Watched("finding", finding, latency, None)
        if death is not None:
            if time.monotonic() - death_at >= death_grace_s:  # what the traces say now, exit codes known
                return Watched("death", watcher.check(job.rank_exit_codes()) or finding, latency, death)
        elif done():
            return Watched("done", finding, latency, None)
        now = time.monotonic()
        if stall_s is not None and last_progress is not None and now - last_progress() > stall_s:
            return Watched("stalled", finding, latency, None)
        if now > deadline:
            if log is not None:
                log("timeout: the job ran past its deadline")
            return Watched("deadline", finding, latency, death)
        time.sleep(POLL_S)
