"""Explore (random schedules until an anomaly or the budget), shrink (fewest
faults, smallest magnitudes that still fail) and replay (how often it fails)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from hctool.chaos.runner import ChaosRunner, RunResult
from hctool.chaos.schedule import DEFAULT_KINDS, Schedule, generate
from hctool.console import log as hlog
from hctool.protocol.faults import Fault


def log(msg: str) -> None:
    hlog.info(msg)


class Exploration(NamedTuple):
    runs: list[tuple[Schedule, RunResult]]
    first_anomaly_s: float | None  # seconds from the start to the first anomalous run's end
    seconds: float
    interrupted: bool = False  # Ctrl-C (or SIGTERM): `runs` is what had finished by then


def shard_indices(shard: tuple[int, int]):
    """Shard i/N takes schedule indices i-1, i-1+N, ...: N machines, no coordinator."""
    i, n = shard
    k = i - 1
    while True:
        yield k
        k += n


def explore(
    runner: ChaosRunner,
    seed: int,
    budget_s: float,
    shard: tuple[int, int] = (1, 1),
    kinds=DEFAULT_KINDS,
    max_schedules: int | None = None,
    keep_going: bool = False,
    progress: Callable[[int, float, str], None] | None = None,
) -> Exploration:
    t0 = time.monotonic()
    runs: list[tuple[Schedule, RunResult]] = []
    first = None
    try:
        runner.prepare()  # setup and reference count against the budget too
        first = _explore(runner, seed, budget_s, shard, kinds, max_schedules, keep_going, progress, t0, runs)
    except KeyboardInterrupt:  # the run under way was stopped and reaped by its own supervisor
        log(f"chaos: interrupted after {len(runs)} schedule(s)")
        return Exploration(runs, None, time.monotonic() - t0, interrupted=True)
    return Exploration(runs, first, time.monotonic() - t0)


def _explore(runner, seed, budget_s, shard, kinds, max_schedules, keep_going, progress, t0, runs) -> float | None:
    first = None
    for count, index in enumerate(shard_indices(shard)):
        elapsed = time.monotonic() - t0
        if elapsed >= budget_s or (max_schedules is not None and count >= max_schedules):
            break
        sched = generate(
            seed,
            index,
            runner.world_size,
            kinds,
            horizon_s=runner.horizon_s,
            early=runner.early_windows,
            activity=runner.activity,
        )
        log(f"chaos: schedule {index} (seed {seed}): {'; '.join(sched.specs())}")
        res = runner.run(sched, f"s{seed}-{index}")
        runs.append((sched, res))
        log(
            f"chaos: schedule {index}: {res.verdict}"
            + "".join(f"; {a.invariant}" for a in res.anomalies)
            + f" in {res.seconds:.0f} s; {max(0.0, budget_s - (time.monotonic() - t0)):.0f} s of the budget left"
        )
        if progress:
            progress(len(runs), time.monotonic() - t0, res.verdict)
        if res.anomalies and first is None:
            first = time.monotonic() - t0
            if not keep_going:
                break
    return first


class Verdict(NamedTuple):
    reproduced: bool
    hits: int
    runs: int


def _in_time(deadline: float | None) -> bool:
    return deadline is None or time.monotonic() < deadline


def reproduces(
    runner: ChaosRunner,
    sched: Schedule,
    invariant: str,
    need: int,
    tries: int,
    name: str,
    deadline: float | None = None,
) -> Verdict:
    """Does `sched` reproduce `invariant` reliably: in at least `need` of `tries` runs?
    Stops as soon as the answer is known (`need` hits, or too many misses to get
    there), so a reduction that fires only sometimes costs one or two runs and is
    rejected: a shrunk schedule that replays 2 in 10 is a lucky draw, not a finding.
    Past `deadline` (monotonic) it runs nothing more: an answer not reached is a no."""
    hits = runs = 0
    while runs < tries and hits < need and need - hits <= tries - runs and _in_time(deadline):
        res = runner.run(sched, f"{name}-try{runs + 1}")
        runs += 1
        hits += any(a.invariant == invariant for a in res.anomalies)
    return Verdict(hits >= need, hits, runs)


def _smaller(f: Fault) -> list[Fault]:
    """Candidates one step smaller than f: certain instead of probable, half the
    magnitude, half the count, no end (a shorter window is not simpler to read)."""
    out = []
    if f.p < 1.0:
        out.append(replace(f, p=1.0))
    if f.ms >= 10:
        out.append(replace(f, ms=float(round(f.ms / 2))))
    if f.n > 1:
        out.append(replace(f, n=f.n // 2))
    if f.start_s > 0:
        out.append(replace(f, start_s=0.0))
    return out


class Shrunk(NamedTuple):
    schedule: Schedule
    attempts: int
    trail: list[Schedule]  # the input, then every accepted reduction in order


def shrink(
    runner: ChaosRunner,
    sched: Schedule,
    invariant: str,
    budget_s: float,
    need: int = 5,
    tries: int = 5,
    predicate: Callable[[Schedule, str], bool] | None = None,
) -> Shrunk:
    """Greedy delta debugging to a fixpoint: drop faults one at a time while it still
    fails, then make each remaining fault one step smaller; repeat both while either
    changed something (a fault made smaller may become droppable). Returns (schedule,
    attempts). `predicate(schedule, name)` decides "still fails" (default: it
    reproduces in `need` of `tries` runs, see `reproduces`), so "smallest" means the
    smallest magnitude that still reproduces at that rate. No candidate is run twice."""
    t0, attempts, tried = time.monotonic(), 0, set()
    end = t0 + budget_s
    still = predicate or (lambda s, name: reproduces(runner, s, invariant, need, tries, name, end).reproduced)
    faults, trail = list(sched.faults), [sched]

    def left() -> bool:
        return time.monotonic() - t0 < budget_s

    def accept(cand: list[Fault]) -> bool:
        nonlocal attempts
        if tuple(cand) in tried or not left():
            return False
        tried.add(tuple(cand))
        attempts += 1
        if not still(sched.with_faults(cand), f"shrink{attempts}"):
            return False
        trail.append(sched.with_faults(cand))
        return True

    changed = True
    while changed and left():
        changed, i = False, 0
        while i < len(faults) and len(faults) > 1:
            cand = faults[:i] + faults[i + 1 :]
            if accept(cand):
                faults, changed = cand, True
            else:
                i += 1
        for i in range(len(faults)):
            for smaller in _smaller(faults[i]):
                cand = faults[:i] + [smaller] + faults[i + 1 :]
                if accept(cand):
                    faults, changed = cand, True
                    break
    return Shrunk(sched.with_faults(faults), attempts, trail)


class Replayed(NamedTuple):
    schedule: Schedule
    hits: int
    runs: int  # fewer than asked where the deadline came first


def replay_trail(
    runner: ChaosRunner,
    trail: list[Schedule],
    invariant: str,
    times: int,
    min_hits: int,
    deadline: float | None = None,
) -> list[Replayed]:
    """Replay the last reduction `times` times; while it reproduces fewer than
    `min_hits`, step back along the trail (the acceptance rule passes a schedule at
    the edge of its rate by luck now and then). Returns every schedule replayed with its
    hits and runs, the one to report last; nothing more starts past `deadline`."""
    out: list[Replayed] = []
    for k, sched in enumerate(reversed(trail)):
        if not _in_time(deadline):
            break
        hits, runs = replay(runner, sched, invariant, times, f"replay-{k}-" if k else "replay", deadline)
        out.append(Replayed(sched, hits, runs))
        if hits >= min_hits:
            break
    return out


def replay(
    runner: ChaosRunner,
    sched: Schedule,
    invariant: str,
    times: int,
    name: str = "replay",
    deadline: float | None = None,
) -> tuple[int, int]:
    """(hits, runs) of up to `times` runs; none starts past `deadline`."""
    hits = 0
    for k in range(times):
        if not _in_time(deadline):
            log(f"chaos: {name}: the budget ran out after {k} replay(s)")
            return hits, k
        res = runner.run(sched, f"{name}{k + 1}")
        hits += any(a.invariant == invariant for a in res.anomalies)
        log(
            f"chaos: {name} {k + 1}/{times}: "
            + ("reproduced" if any(a.invariant == invariant for a in res.anomalies) else "not reproduced")
        )
    return hits, times
