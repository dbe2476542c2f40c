"""cuda-sleep: a ms sleep on the rank's current CUDA stream, before each recorded collective
(op=/group= narrowing which) or at the entry of fn=. torch.cuda._sleep spins for GPU cycles;
the rate is timed once per device, as the engine's streams do (engine/streams.py)."""

from __future__ import annotations

from hctool.agent.faults import collectives
from hctool.agent.faults.common import FaultClock, on_entry
from hctool.protocol.faults import Fault

KINDS = ("cuda-sleep",)
_cycles_per_ms: dict[int, float] = {}


def cuda_sleep(ms: float) -> None:
    if ms <= 0:
        return
    import torch

    if not torch.cuda.is_available():
        return
    index = torch.cuda.current_device()
    rate = _cycles_per_ms.get(index)
    if rate is None:
        cycles = 20_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles // 10)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rate = _cycles_per_ms[index] = cycles / max(start.elapsed_time(end), 1e-3)
    torch.cuda._sleep(int(ms * rate))


def install(clock: FaultClock, faults: list[Fault]) -> None:
    at_calls = [f for f in faults if f.fn is None]
    if at_calls:
        collectives.before_each_call(
            lambda op, group: cuda_sleep(clock.total_ms(KINDS, collectives.matching(at_calls, op, group)))
        )
    for f in faults:
        if f.fn is not None:
            on_entry(clock, f, f.fn, lambda f=f: cuda_sleep(f.ms))
