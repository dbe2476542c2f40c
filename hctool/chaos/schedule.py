"""Chaos schedules: a list of faults with windows, ending in a heal.

A schedule file is TOML:

    seed = 3                 # salt for `target = "one"` and the faults' RNGs
    heal_s = 12.0            # every fault is off from here on (default: when the workload is done)
    [[faults]]
    kind = "free-delay"
    target = "rank:1"
    ms = 300
    start_s = 0.5
    duration_s = 8

`generate()` draws random schedules from the vocabulary, seeded, so schedule i
of seed N is the same on every machine (that is what makes `--shard` work).
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import tomli_w

from hctool.protocol.faults import FAULT_KINDS, KIND, Acts, Fault, Scope, drawn_for, parse_fault
from hctool.protocol.limits import bounded
from hctool.protocol.safefile import read_named, why

# Kinds explore draws by default (the rows' drawn_for: all but rank-kill against the engine, a
# killed rank ends the run; the generic kinds against a command: they need no knowledge of the
# program), and every kind's magnitude range, count range and weight: protocol/faults.py's rows.
DEFAULT_KINDS = drawn_for(Scope.ENGINE)
COMMAND_KINDS = drawn_for(Scope.ANY)


class ScheduleError(ValueError):
    """A schedule file or option that cannot be used; the message says where."""


@dataclass(frozen=True)
class Schedule:
    faults: tuple[Fault, ...]
    heal_s: float | None = None  # None: heal when the workload is done
    seed: int = 0
    index: int = field(default=0, compare=False)  # its number within an exploration

    def __post_init__(self) -> None:
        if self.heal_s is not None:  # nan passed `<= 0` and failed after the baseline had run
            try:
                bounded("heal_s", self.heal_s)
            except ValueError as exc:
                raise ScheduleError(str(exc)) from None
            if self.heal_s <= 0:
                raise ScheduleError("heal_s must be positive")

    def healed(self, world_size: int) -> list[Fault]:
        """Every fault clipped to end by heal_s (the ranks are also told when the
        heal happens), `one` resolved with the seed."""
        out = []
        for f in (f.resolved(world_size, self.seed) for f in self.faults):
            # an anchored window counts from the rank's K-th collective, not the workload's start:
            # the heal (told to the ranks too) ends it where it stands
            if self.heal_s is not None and KIND[f.kind].window and f.at_call is None:
                if f.start_s >= self.heal_s:
                    continue
                end = self.heal_s if f.duration_s is None else min(self.heal_s, f.start_s + f.duration_s)
                f = replace(f, duration_s=end - f.start_s)
            out.append(f)
        return out

    def specs(self) -> list[str]:
        return [f.spec() for f in self.faults]

    def to_dict(self) -> dict:
        return {"seed": self.seed, "heal_s": self.heal_s, "faults": [f.to_dict() for f in self.faults]}

    def to_toml(self) -> str:
        """The schedule file's text (tomli-w escapes what tomllib reads back: a path with a quote)."""
        data: dict = {"seed": self.seed}
        if self.heal_s is not None:
            data["heal_s"] = self.heal_s
        data["faults"] = [{k: v for k, v in f.to_dict().items() if v is not None} for f in self.faults]
        return tomli_w.dumps(data)

    def with_faults(self, faults) -> Schedule:
        return replace(self, faults=tuple(faults))


def schedule_from_dict(data: dict, where: str = "schedule") -> Schedule:
    unknown = set(data) - {"seed", "heal_s", "faults"}
    if unknown:
        raise ScheduleError(f"{where}: unknown fields {sorted(unknown)}; known: seed, heal_s, faults")
    faults = []
    for i, f in enumerate(data.get("faults", [])):
        try:
            faults.append(parse_fault(f) if isinstance(f, str) else Fault.from_dict(f))
        except (ValueError, TypeError) as exc:
            raise ScheduleError(f"{where}: faults[{i}]: {exc}") from None
    try:
        heal = data.get("heal_s")
        seed = data.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        return Schedule(tuple(faults), None if heal is None else bounded("heal_s", heal), seed)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{where}: {exc}") from None


MAX_SCHEDULE_BYTES = 1 << 20  # a schedule is a few faults; the same cap as a scenario file


def load_schedule(path: Path) -> Schedule:
    """The schedule in the file the user named, read through the safe reader: a FIFO is refused
    at once (it hung `chaos run`), a link to /dev/zero is not a regular file, a size is capped."""
    try:
        data = tomllib.loads(read_named(path, MAX_SCHEDULE_BYTES).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ScheduleError(f"{path}: not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise ScheduleError(why(exc, path)) from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ScheduleError(f"{path}: {exc or 'nested too deeply'}") from None
    if not isinstance(data.get("faults", []), list):
        raise ScheduleError(f"{path}: faults must be a list of fault tables")
    return schedule_from_dict(data, str(path))


def parse_kinds(text: str | None, default: tuple[str, ...] = DEFAULT_KINDS) -> tuple[str, ...]:
    if not text:
        return default
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad or not kinds:
        raise ScheduleError(f"unknown fault kind {bad[0] if bad else text!r}; known: {', '.join(FAULT_KINDS)}")
    named = [k for k in kinds if KIND[k].draw is None]  # generate() cannot make up a function of the program
    if named:
        raise ScheduleError(
            f"fault kind {named[0]} needs fn=pkg.mod:Qual.name, which exploration cannot draw; "
            "put it in a schedule file for chaos run"
        )
    return kinds


class Activity(NamedTuple):
    """What the fault-free run did: each rank's number of recorded collectives, and the seconds
    (after launch) of the first and the last of them: the program's active window."""

    calls: dict[int, int]
    first_s: float
    last_s: float

    def calls_of(self, target: str, world_size: int) -> int:
        """Collectives the fault's rank made (every rank's fewest for `all`/`one`)."""
        if target.startswith("rank:"):
            return self.calls.get(int(target[5:]), 0)
        return min((self.calls.get(r, 0) for r in range(world_size)), default=0)


def generate(
    seed: int,
    index: int,
    world_size: int,
    kinds=DEFAULT_KINDS,
    horizon_s: float = 20.0,
    max_faults: int = 4,
    early: bool = True,
    activity: Activity | None = None,
) -> Schedule:
    """Schedule `index` of exploration `seed`: 1..max_faults faults, each with a
    kind, target, magnitude, probability and window (within horizon_s) drawn from
    one RNG; the heal comes when the workload is done. `early`: windows open in the
    first part of the horizon (the engine: asymmetry matters while requests queue);
    otherwise anywhere in it (a program whose interesting part may come late).

    With the fault-free run's `activity` (a command's), faults land where the program works:
    a fault is anchored to one of its rank's collectives (at_call=K, K drawn over the calls that
    rank made; half of them start some way into the step after it), so a replay hits the same
    step however long the start took (a supervisor's fault too: the rank waits at that call);
    windows last to the end half the time (a loader that falls behind must stay behind for some
    steps), else a share of the run."""
    rng = random.Random(f"hctool-chaos/{seed}/{index}")
    faults = []
    for _ in range(rng.randint(1, max_faults)):
        kind = KIND[rng.choices(kinds, weights=[KIND[k].weight for k in kinds])[0]]
        if kind.acts is Acts.SUPERVISOR:
            target = f"rank:{rng.randrange(world_size)}"  # a signal goes to one process
        elif kind.acts is Acts.WORKLOAD:
            target = "all"  # the client side has no rank
        else:
            target = rng.choice(["all", "one", *[f"rank:{r}" for r in range(world_size)]])
        lo, hi = kind.draw or (0, 0)  # parse_kinds refused kinds without a range
        ms = float(round(rng.uniform(lo, hi))) if hi else 0.0
        n = rng.randint(*kind.count) if kind.count else 0
        p = 1.0 if rng.random() < 0.6 or not kind.window or not kind.draw_p else round(rng.uniform(0.1, 1.0), 2)
        # Rank asymmetry matters while requests queue, so windows start early and
        # mostly last until the heal; one-shot faults land anywhere before it.
        at_call = None
        if activity is not None:
            active_s = max(0.2, activity.last_s - activity.first_s)
            calls = activity.calls_of(target, world_size)
            if kind.acts is not Acts.WORKLOAD and calls:
                # at the call, or some way into the step after it: a clock jumped right at a call
                # is read by both sides of what the step measures, and cancels out
                step_s = active_s / max(1, calls - 1)
                at_call = rng.randint(1, calls)
                start = 0.0 if rng.random() < 0.5 else round(rng.uniform(0, step_s), 3)
            else:
                start = round(rng.uniform(activity.first_s, max(activity.first_s, activity.last_s)), 2)
            duration = None if rng.random() < 0.5 or not kind.window else round(rng.uniform(0.1, 1.0) * active_s, 2)
        else:
            start = round(rng.uniform(0, horizon_s * ((0.3 if kind.window else 0.75) if early else 0.9)), 1)
            duration = None if rng.random() < 0.6 or not kind.window else round(rng.uniform(2.0, horizon_s), 1)
        faults.append(
            Fault(
                kind.name,
                ms=ms,
                target=target,
                p=p,
                start_s=start,
                duration_s=duration,
                n=n,
                at_call=at_call,
                **dict(kind.draw_keys),
            )
        )
    return Schedule(tuple(faults), heal_s=None, seed=seed, index=index)
