"""The fault vocabulary: timing and rank-local faults for engine runs, from
`--inject` specs, a repro scenario or a chaos schedule.

A fault perturbs timing or rank-local resources only (a late copy stream, a late
free, slow or failing storage, a skewed clock, a paused rank, extra client
load); it never issues a collective, so any divergence it provokes is the
program's own.

Text form: `KIND:key=value,...`, e.g. `h2d-sleep:rank=1,ms=30` or
`storage-error:target=one,p=0.3,start_s=2,duration_s=5`. Keys: `rank=K` (same as
`target=rank:K`), `target=all|one|rank:K` (default all), `ms` (magnitude),
`p` (probability per operation, default 1), `start_s` and `duration_s` (the
active window, seconds after the workload starts; no duration: until the
heal), `pages` (the magnitude of host-pool-shrink and storage-miss), `n` (requests, for bursts and cancellations), `role=prefill|decode` (in a
PD topology, the side; each side numbers its ranks from 0, e.g.
`h2d-sleep:role=decode,rank=1,ms=30`). In-rank kinds travel to
the ranks as HCTOOL_FAULTS (';'-joined) and are applied by fault_hooks.py;
controller kinds are carried out by the chaos runner from outside the ranks.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import zlib
from dataclasses import asdict, dataclass, replace

# kind -> (what it does, its magnitude's meaning). In-rank kinds first.
IN_RANK = {
    "h2d-sleep": "sleep ms before a host->device copy (load-back)",
    "d2h-sleep": "sleep ms before a device->host copy (backup)",
    "free-delay": "device pages return to the free list ms later",
    "storage-latency": "each L3 page read takes ms longer",
    "storage-error": "an L3 read or existence query fails (a miss)",
    "storage-timeout": "an L3 read hangs ms, then fails as timed out",
    "storage-partial": "an L3 existence query reports only half of the pages",
    "clock-skew": "the rank's engine clock gains ms per second while active",
    "clock-jump": "the rank's engine clock jumps ms ahead when the fault starts",
    "clock-jitter": "each wall-clock reading on the rank is off by up to +-ms",
    "host-pool-shrink": "the rank's host (L2) pool comes out pages=N pages smaller",
    "storage-miss": "the rank's L3 existence queries report pages=N fewer pages",
    "kv-send-delay": "PD prefill rank: each KV push starts ms later",
    "kv-drop": "PD prefill rank: its KV parts are never sent",
    "bootstrap-delay": "PD decode rank: each bootstrap registration is ms late",
}
CONTROLLER = {
    "rank-pause": "SIGSTOP the rank for ms, then SIGCONT",
    "rank-kill": "SIGKILL the rank",
    "request-burst": "send n extra workload requests at once",
    "request-cancel": "send n workload requests and disconnect after ms",
}
FAULT_KINDS = {**IN_RANK, **CONTROLLER}
NEEDS_MS = {"h2d-sleep", "d2h-sleep", "free-delay", "storage-latency", "storage-timeout", "clock-skew",
            "clock-jump", "rank-pause", "request-cancel", "kv-send-delay", "bootstrap-delay", "clock-jitter",
            "host-pool-shrink", "storage-miss"}
BY_PAGES = {"host-pool-shrink", "storage-miss"}  # magnitude written pages=N; held in ms
NEEDS_N = {"request-burst", "request-cancel"}
PER_RANK = set(IN_RANK) | {"rank-pause", "rank-kill"}   # kinds a target applies to
_KEYS = ("rank", "target", "ms", "p", "start_s", "duration_s", "n", "role")
ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Fault:
    kind: str
    ms: float = 0.0
    rank: int | None = None          # None: see target
    target: str = "all"              # all | one | rank:K  (rank=K sets target rank:K)
    p: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None  # None: until the schedule's heal
    n: int = 0
    role: str | None = None          # PD: only this side's ranks (None: every side)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        if self.rank is not None:
            object.__setattr__(self, "target", f"rank:{self.rank}")
        elif self.target.startswith("rank:"):
            object.__setattr__(self, "rank", _int(self.target[5:], "target rank"))
        elif self.target not in ("all", "one"):
            raise ValueError(f"fault {self.kind}: target must be all, one or rank:K, got {self.target!r}")
        if self.ms < 0 or (self.rank is not None and self.rank < 0) or self.n < 0 or self.start_s < 0:
            raise ValueError(f"fault {self.kind}: rank, ms, n and start_s must not be negative")
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"fault {self.kind}: p must be within [0, 1], got {self.p:g}")
        if self.role not in (None, *ROLES):
            raise ValueError(f"fault {self.kind}: role must be prefill or decode, got {self.role!r}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"fault {self.kind}: duration_s must be positive")

    def spec(self) -> str:
        """The text form; defaults are left out, so old specs print as they were written."""
        parts = [] if self.role is None else [f"role={self.role}"]
        parts += [] if self.target == "all" else [f"rank={self.rank}" if self.rank is not None else "target=one"]
        if self.ms or self.kind in NEEDS_MS:
            parts.append(f"{'pages' if self.kind in BY_PAGES else 'ms'}={self.ms:g}")
        for key, default in (("p", 1.0), ("start_s", 0.0), ("duration_s", None), ("n", 0)):
            value = getattr(self, key)
            if value != default:
                parts.append(f"{key}={value:g}")
        return f"{self.kind}:{','.join(parts)}" if parts else self.kind

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("rank")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Fault:
        unknown = set(d) - set(_KEYS) - {"kind"}
        if unknown or "kind" not in d:
            raise ValueError(f"bad fault {d!r}: needs kind; known keys: {', '.join(_KEYS)}")
        unit = "pages" if d["kind"] in BY_PAGES else "ms"
        return parse_fault(f"{d['kind']}:" + ",".join(f"{unit if k == 'ms' else k}={v}" for k, v in d.items()
                                                     if k != "kind" and v is not None))

    def applies_to(self, rank: int, role: str | None = None) -> bool:
        return (self.rank is None or self.rank == rank) and (self.role is None or self.role == role)

    def resolved(self, world_size: int, salt: int = 0) -> Fault:
        """`one` becomes a concrete rank, chosen from the fault's text and a salt (a
        schedule's seed), so a replay hits the same rank."""
        if self.target != "one":
            return self
        return replace(self, target="all", rank=(zlib.crc32(self.spec().encode()) + salt) % max(1, world_size))

    def active(self, t: float) -> bool:
        return self.start_s <= t and (self.duration_s is None or t < self.start_s + self.duration_s)


def _keys(kind: str) -> tuple[str, ...]:
    """The text form's keys; a page-count kind writes its magnitude pages=N (kept in .ms)."""
    return tuple("pages" if k == "ms" and kind in BY_PAGES else k for k in _KEYS)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None


def parse_fault(spec: str) -> Fault:
    """Parse one spec; ValueError with a one-line reason on bad input."""
    kind, _, params = spec.strip().partition(":")
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault {kind!r} in {spec!r}; known: {', '.join(FAULT_KINDS)}")
    values: dict = {}
    for item in filter(None, params.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in _keys(kind):
            raise ValueError(f"bad parameter {item!r} in {spec!r}; keys: {', '.join(_keys(kind))}")
        values["ms" if key == "pages" else key] = value.strip()
    if kind == "kv-drop":  # no magnitude: any positive value means "drop"
        values.setdefault("ms", "1")
    if kind in NEEDS_MS and "ms" not in values:
        raise ValueError(f"fault {spec!r} needs {'pages' if kind in BY_PAGES else 'ms'}=N")
    if kind in NEEDS_N and "n" not in values:
        raise ValueError(f"fault {spec!r} needs n=N")
    try:
        kw = {k: (float(v) if k in ("ms", "p", "start_s", "duration_s") else int(v) if k in ("rank", "n") else v)
              for k, v in values.items()}
    except ValueError:
        raise ValueError(f"fault {spec!r}: rank and n must be integers, ms, p, start_s, duration_s numbers") from None
    try:
        return Fault(kind, **kw)
    except ValueError as exc:
        raise ValueError(f"{exc} (in {spec!r})") from None


def parse_faults(text: str) -> list[Fault]:
    return [parse_fault(s) for s in text.split(";") if s.strip()]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after one module is executed (without importing it early)."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            self.callback(module)
        spec.loader.exec_module = exec_module
        return spec


def when_imported(name: str, callback) -> None:
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


def install_from_env() -> list[Fault]:
    """Apply the in-rank faults of HCTOOL_FAULTS for this process's RANK."""
    faults = parse_faults(os.environ.get("HCTOOL_FAULTS", ""))
    rank, role = int(os.environ.get("RANK", "0")), os.environ.get("HCTOOL_ROLE")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mine = [f for f in (f.resolved(world) for f in faults) if f.kind in IN_RANK and f.applies_to(rank, role)]
    if mine:
        from hctool.inject import fault_hooks
        fault_hooks.install(mine, rank)
    return faults
