"""h2d-sleep, d2h-sleep: the engine's copy streams wait ms before the next host->device
(load-back) or device->host (backup) copy, through the `copy_delay_ms` seam."""

from __future__ import annotations

from hctool.agent.faults.common import FaultClock
from hctool.agent.hooks import when_imported
from hctool.protocol.faults import Fault

KINDS = ("h2d-sleep", "d2h-sleep")
SEAMS_MODULE = "engine.lab.seams"


def install(clock: FaultClock, faults: list[Fault]) -> None:
    by_stream = {"h2d": ("h2d-sleep",), "d2h": ("d2h-sleep",)}
    when_imported(
        SEAMS_MODULE,
        lambda seams: seams.SEAMS.install(
            copy_delay_ms=lambda stream: clock.total_ms(by_stream.get(stream, ()), faults)
        ),
    )
