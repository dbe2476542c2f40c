"""Timing faults for engine ranks, from `--inject` specs or a repro scenario.

A fault perturbs timing or rank-local resources only (a late copy stream, a
late free, slow storage); it never issues a collective, so any divergence it
provokes is the program's own.

Spec: `KIND:key=value,...`, e.g. `h2d-sleep:rank=1,ms=30`; without `rank=` the
fault applies to every rank. Passed to ranks as HCTOOL_FAULTS (';'-joined).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from dataclasses import dataclass

# kind -> the engine.streams.FAULT_DELAYS_MS key it sets
FAULT_KINDS = {
    "h2d-sleep": "h2d",          # sleep before each host->device copy (load-back)
    "d2h-sleep": "d2h",          # sleep before each device->host copy (backup)
    "free-delay": "free",        # device pages return to the free list this much later
    "storage-latency": "storage",  # each L3 page read takes this much longer
    "clock-jitter": "clock_jitter",  # each wall-clock reading is off by up to +-ms
    "clock-skew": "clock_skew",      # the engine's wall clock gains ms per second
    "host-pool-shrink": "host_pool_shrink",  # the host (L2) pool has `pages` fewer pages
    "storage-miss": "storage_miss",  # L3 existence queries report `pages` fewer pages
}
BY_PAGES = {"host-pool-shrink", "storage-miss"}  # magnitude in pages=N instead of ms=N


@dataclass(frozen=True)
class Fault:
    kind: str
    ms: float
    rank: int | None = None

    def spec(self) -> str:
        rank = "" if self.rank is None else f"rank={self.rank},"
        unit = "pages" if self.kind in BY_PAGES else "ms"
        return f"{self.kind}:{rank}{unit}={self.ms:g}"

    def applies_to(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank


def parse_fault(spec: str) -> Fault:
    """Parse one spec; ValueError with a one-line reason on bad input."""
    kind, _, params = spec.strip().partition(":")
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault {kind!r} in {spec!r}; known: {', '.join(FAULT_KINDS)}")
    values: dict[str, str] = {}
    for item in filter(None, params.split(",")):
        key, eq, value = item.partition("=")
        unit = "pages" if kind in BY_PAGES else "ms"
        if not eq or key not in ("rank", unit):
            raise ValueError(f"bad parameter {item!r} in {spec!r}; expected rank=N and {unit}=N")
        values["ms" if key == "pages" else key] = value
    if "ms" not in values:
        raise ValueError(f"fault {spec!r} needs {'pages' if kind in BY_PAGES else 'ms'}=N")
    try:
        ms = float(values["ms"])
        rank = int(values["rank"]) if "rank" in values else None
    except ValueError:
        raise ValueError(f"fault {spec!r}: rank must be an integer and ms a number") from None
    if ms < 0 or (rank is not None and rank < 0):
        raise ValueError(f"fault {spec!r}: rank and ms must not be negative")
    return Fault(kind, ms, rank)


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
    """Apply HCTOOL_FAULTS for this process's RANK to the engine once it loads."""
    faults = parse_faults(os.environ.get("HCTOOL_FAULTS", ""))
    rank = int(os.environ.get("RANK", "0"))
    delays = {FAULT_KINDS[f.kind]: f.ms for f in faults if f.applies_to(rank)}
    if delays:
        when_imported("engine.streams", lambda mod: mod.FAULT_DELAYS_MS.update(delays))
    return faults
