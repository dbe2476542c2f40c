"""storage-latency, storage-error, storage-timeout, storage-partial, storage-miss: the engine's
L3 storage. Existence queries go through the `storage_exists` seam (half, or pages=N fewer);
reads and errors act at the engine's named storage functions (engine.lab POINTS), one
mechanism with delay/raise (the engine's StorageIO takes an OSError from its backend as a miss)."""

from __future__ import annotations

from hctool.agent.faults.common import FaultClock, on_entry, raise_for, sleep_ms
from hctool.agent.hooks import when_imported
from hctool.protocol.faults import Fault

KINDS = ("storage-latency", "storage-error", "storage-timeout", "storage-partial", "storage-miss")
SEAMS_MODULE = "engine.lab.seams"


def install(clock: FaultClock, faults: list[Fault]) -> None:
    def storage_exists(n: int) -> int:
        n = n // 2 if clock.firing(("storage-partial",), faults) else n
        return max(0, n - int(clock.total_ms(("storage-miss",), faults)))

    when_imported(SEAMS_MODULE, lambda seams: seams.SEAMS.install(storage_exists=storage_exists))
    from engine.lab.seams import POINTS  # a plain module: no torch, no engine state

    get, query = POINTS["storage_get"], POINTS["storage_query"]
    for f in faults:
        if f.kind == "storage-latency":
            on_entry(clock, f, get, lambda f=f: sleep_ms(f.ms))
        elif f.kind == "storage-timeout":
            on_entry(clock, f, get, lambda f=f: (sleep_ms(f.ms), raise_for(TimeoutError, f)))
        elif f.kind == "storage-error":
            for target in (get, query):
                on_entry(clock, f, target, lambda f=f: raise_for(OSError, f))
