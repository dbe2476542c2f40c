"""In-rank faults: hooks on the engine's copy streams, allocator, storage backend
and clock that consult the active faults at every operation.

Time runs from the workload's start, which the chaos runner writes to the file
named by HCTOOL_FAULTS_T0 (until it exists, or without it, the clock reads 0,
so faults starting at 0 are on from launch); at the heal it adds the heal's
second, and from then on no fault fires. Probabilities draw from a
rank-local RNG seeded from the fault and the rank, so a replay draws alike.
Nothing here issues a collective or touches replicated state directly.
"""

from __future__ import annotations

import os
import random
import sys
import time

from hctool.inject.faults import Fault, when_imported

DELAY_KEYS = {"h2d-sleep": "h2d", "d2h-sleep": "d2h", "free-delay": "free", "storage-latency": "storage",
              "kv-send-delay": "kv_send", "kv-drop": "kv_drop", "bootstrap-delay": "bootstrap",
              "clock-jitter": "clock_jitter", "host-pool-shrink": "host_pool_shrink", "storage-miss": "storage_miss"}
# Where the engine keeps each part.
STREAMS = ("engine.streams",)
STORAGE = ("engine.mem_cache.hicache_storage",)
# Module -> the attribute through which it reads the clock (streams.wall_clock() reads `clock`).
CLOCK_USERS = {"engine.mem_cache.hiradix_cache": "time", "engine.mem_cache.hicache_storage": "time",
               "engine.streams": "clock"}


class FaultClock:
    """Seconds since the workload started (0 before), and which faults are on."""

    def __init__(self, faults: list[Fault], rank: int):
        self.faults = faults
        self.path = os.environ.get("HCTOOL_FAULTS_T0")
        self.t0: float | None = None if self.path else time.time()
        self._next_look = 0.0
        self.heal: float | None = None
        self.rng = {f: random.Random(f"{f.spec()}#{rank}") for f in faults}

    def now(self) -> float:
        """Seconds since the workload started; the file holds "T0 [HEAL_S]" and is
        re-read every 0.1 s until the heal is known."""
        if self.path and self.heal is None:
            mono = time.monotonic()
            if mono >= self._next_look:
                self._next_look = mono + 0.1
                try:
                    with open(self.path) as fh:
                        parts = [float(x) for x in fh.read().split()]
                    self.t0 = parts[0]
                    self.heal = parts[1] if len(parts) > 1 else None
                except (OSError, ValueError, IndexError):
                    pass
        return 0.0 if self.t0 is None else max(0.0, time.time() - self.t0)

    def firing(self, kinds) -> list[Fault]:
        """Active faults of these kinds that fire for this operation (probability p)."""
        t = self.now()
        if self.heal is not None and t >= self.heal:
            return []
        return [f for f in self.faults if f.kind in kinds and f.active(t)
                and (f.p >= 1.0 or self.rng[f].random() < f.p)]


class LiveDelays(dict):
    """Stands in for the engine's FAULT_DELAYS_MS: get() answers from the active faults."""

    def __init__(self, clock: FaultClock, base: dict):
        super().__init__(base)
        self.clock = clock

    def get(self, key, default=None):
        kinds = [k for k, v in DELAY_KEYS.items() if v == key]
        total = (dict.get(self, key) or 0.0) + sum(f.ms for f in self.clock.firing(kinds))
        return total if total else default


class SkewedTime:
    """The `time` module as the engine's clock readers see it: monotonic() and time()
    gain the active skew and jumps (never go back)."""

    def __init__(self, clock: FaultClock, faults: list[Fault]):
        self.clock, self.faults = clock, faults

    def offset(self) -> float:
        t, off = self.clock.now(), 0.0
        if self.clock.heal is not None:
            t = min(t, self.clock.heal)  # the clock keeps what it gained, and gains no more
        for f in self.faults:
            if t < f.start_s:
                continue
            active = (t if f.duration_s is None else min(t, f.start_s + f.duration_s)) - f.start_s
            off += f.ms / 1000.0 if f.kind == "clock-jump" else f.ms / 1000.0 * active
        return off

    def monotonic(self) -> float:
        return time.monotonic() + self.offset()

    def time(self) -> float:
        return time.time() + self.offset()

    def __getattr__(self, name):
        return getattr(time, name)


def _patch_streams(mod, live: LiveDelays) -> None:
    for cls_name in ("CpuStream", "CudaStream"):
        cls = getattr(mod, cls_name, None)
        if cls is not None:  # the stream's delay is read at each copy, not fixed at creation
            cls.delay_ms = property(lambda self: live.get(self.name, 0.0) or 0.0, lambda self, v: None)
    mod.FAULT_DELAYS_MS = live


def _patch_storage(mod, clock: FaultClock) -> None:
    cls = getattr(mod, "HiCacheFile", None)
    if cls is None:
        return
    get, exists = cls.batch_get, cls.batch_exists

    def batch_get(self, keys, host_pool, host_pages):
        for f in clock.firing(("storage-timeout",)):
            time.sleep(f.ms / 1000.0)
            return 0
        if clock.firing(("storage-error",)):
            return 0
        return get(self, keys, host_pool, host_pages)

    def batch_exists(self, keys):
        if clock.firing(("storage-error",)):
            return 0
        n = exists(self, keys)
        return n // 2 if clock.firing(("storage-partial",)) else n
    cls.batch_get, cls.batch_exists = batch_get, batch_exists


def install(faults: list[Fault], rank: int) -> None:
    clock = FaultClock(faults, rank)
    kinds = {f.kind for f in faults}
    if kinds & set(DELAY_KEYS):
        for name in STREAMS:
            when_imported(name, lambda mod: _patch_streams(mod, LiveDelays(clock, getattr(mod, "FAULT_DELAYS_MS", {}))))
    if kinds & {"storage-error", "storage-timeout", "storage-partial"}:
        for name in STORAGE:
            when_imported(name, lambda mod: _patch_storage(mod, clock))
    skews = [f for f in faults if f.kind in ("clock-skew", "clock-jump")]
    if skews:
        shim = SkewedTime(clock, skews)
        for name, attr in CLOCK_USERS.items():
            when_imported(name, lambda mod, attr=attr: setattr(mod, attr, shim) if hasattr(mod, attr) else None)
    print(f"hctool: rank {rank}: faults {'; '.join(f.spec() for f in faults)}", file=sys.stderr, flush=True)
