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

from hctool.protocol.faults import BY_NAME, FAULT_KINDS, Fault, parse_fault
from hctool.protocol.limits import bounded
from hctool.protocol.safefile import read_named, why

# Kinds explore draws by default: all but rank-kill (a killed rank ends the run;
# ask for it with --kinds). Magnitude ranges (ms or n) per kind.
DEFAULT_KINDS = (
    "h2d-sleep",
    "d2h-sleep",
    "free-delay",
    "storage-latency",
    "storage-error",
    "storage-timeout",
    "storage-partial",
    "clock-skew",
    "clock-jump",
    "rank-pause",
    "request-burst",
    "request-cancel",
)
# Against a command (the user's program) explore draws the generic kinds: no knowledge of the
# program is needed (io-delay acts on every file the program opens: path="*").
COMMAND_KINDS = (
    "clock-skew",
    "clock-jump",
    "clock-jitter",
    "thread-slow",
    "collective-delay",
    "io-delay",
    "rank-pause",
)
MAGNITUDE = {
    "thread-slow": (10, 300),
    "collective-delay": (5, 400),
    "io-delay": (5, 200),
    "cuda-sleep": (5, 200),
    "h2d-sleep": (5, 200),
    "d2h-sleep": (5, 200),
    "free-delay": (20, 600),
    "storage-latency": (5, 120),
    "storage-timeout": (50, 1500),
    "clock-skew": (50, 500),
    "clock-jump": (500, 8000),
    "rank-pause": (100, 2000),
    "request-cancel": (50, 500),
    "clock-jitter": (5, 100),
    "host-pool-shrink": (1, 4),
    "storage-miss": (1, 4),
}  # the last two: pages
COUNTS = {"request-burst": (2, 12), "request-cancel": (1, 6)}
# The bug class is decisions made from rank-local timing, so faults that make
# one rank's copies, frees or storage slower than its peers' are drawn more often.
CERTAIN = ("rank-pause", "rank-kill", "request-burst", "request-cancel")  # one-shot: no p, no window
WEIGHT = {"free-delay": 3, "d2h-sleep": 2, "h2d-sleep": 2, "storage-latency": 3}


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
            if self.heal_s is not None and f.kind not in CERTAIN:
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
        lines = [f"seed = {self.seed}"] + ([] if self.heal_s is None else [f"heal_s = {self.heal_s:g}"])
        for f in self.faults:
            lines.append("\n[[faults]]")
            for k, v in f.to_dict().items():
                if v is None:
                    continue
                lines.append(
                    f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}"
                )
        return "\n".join(lines).replace("'", '"') + "\n"

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
    named = [k for k in kinds if k in BY_NAME]  # generate() cannot make up a function of the program
    if named:
        raise ScheduleError(
            f"fault kind {named[0]} needs fn=pkg.mod:Qual.name, which exploration cannot draw; "
            "put it in a schedule file for chaos run"
        )
    return kinds


def generate(
    seed: int,
    index: int,
    world_size: int,
    kinds=DEFAULT_KINDS,
    horizon_s: float = 20.0,
    max_faults: int = 4,
    early: bool = True,
) -> Schedule:
    """Schedule `index` of exploration `seed`: 1..max_faults faults, each with a
    kind, target, magnitude, probability and window (within horizon_s) drawn from
    one RNG; the heal comes when the workload is done. `early`: windows open in the
    first part of the horizon (the engine: asymmetry matters while requests queue);
    otherwise anywhere in it (a program whose interesting part may come late)."""
    rng = random.Random(f"hctool-chaos/{seed}/{index}")
    faults = []
    for _ in range(rng.randint(1, max_faults)):
        kind = rng.choices(kinds, weights=[WEIGHT.get(k, 1) for k in kinds])[0]
        if kind in ("rank-pause", "rank-kill"):
            target = f"rank:{rng.randrange(world_size)}"
        elif kind in ("request-burst", "request-cancel"):
            target = "all"  # the client side has no rank
        else:
            target = rng.choice(["all", "one", *[f"rank:{r}" for r in range(world_size)]])
        lo, hi = MAGNITUDE.get(kind, (0, 0))
        ms = float(round(rng.uniform(lo, hi))) if hi else 0.0
        n = rng.randint(*COUNTS[kind]) if kind in COUNTS else 0
        p = (
            1.0
            if rng.random() < 0.6 or kind in CERTAIN or kind.startswith("clock")
            else round(rng.uniform(0.1, 1.0), 2)
        )
        # Rank asymmetry matters while requests queue, so windows start early and
        # mostly last until the heal; one-shot faults land anywhere before it.
        start = round(rng.uniform(0, horizon_s * ((0.75 if kind in CERTAIN else 0.3) if early else 0.9)), 1)
        duration = None if rng.random() < 0.6 or kind in CERTAIN else round(rng.uniform(2.0, horizon_s), 1)
        extra = {"path": "*"} if kind == "io-delay" else {}
        faults.append(Fault(kind, ms=ms, target=target, p=p, start_s=start, duration_s=duration, n=n, **extra))
    return Schedule(tuple(faults), heal_s=None, seed=seed, index=index)
