"""kv-send-delay, kv-drop, bootstrap-delay: PD disaggregation through the engine's seams: a
prefill rank's KV pushes start ms late or are lost; a decode rank registers ms late."""

from __future__ import annotations

from hctool.agent.faults.common import FaultClock
from hctool.agent.hooks import when_imported
from hctool.protocol.faults import Fault

KINDS = ("kv-send-delay", "kv-drop", "bootstrap-delay")
SEAMS_MODULE = "engine.lab.seams"


def install(clock: FaultClock, faults: list[Fault]) -> None:
    when_imported(
        SEAMS_MODULE,
        lambda seams: seams.SEAMS.install(
            kv_send_delay_ms=lambda *_: clock.total_ms(("kv-send-delay",), faults),
            kv_dropped=lambda: bool(clock.firing(("kv-drop",), faults)),
            bootstrap_delay_ms=lambda *_: clock.total_ms(("bootstrap-delay",), faults),
        ),
    )
