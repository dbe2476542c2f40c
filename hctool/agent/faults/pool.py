"""free-delay, host-pool-shrink: the rank's pools through the engine's seams: freed device pages
return to the free list ms late (`free_delay_ms`); the host pool comes out pages=N smaller
(`host_pool_pages`)."""

from __future__ import annotations

from hctool.agent.faults.common import FaultClock
from hctool.agent.hooks import when_imported
from hctool.protocol.faults import Fault

KINDS = ("free-delay", "host-pool-shrink")
SEAMS_MODULE = "engine.lab.seams"


def install(clock: FaultClock, faults: list[Fault]) -> None:
    def hooks(seams) -> None:
        seams.SEAMS.install(
            free_delay_ms=lambda *_: clock.total_ms(("free-delay",), faults),
            host_pool_pages=lambda pages: pages - int(clock.total_ms(("host-pool-shrink",), faults)),
        )

    when_imported(SEAMS_MODULE, hooks)
