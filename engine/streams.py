"""SGLang: none (stands in for the torch.cuda streams of srt/managers/cache_controller.py on CPU).

Copy streams and events with one interface on CUDA and on CPU.

On CUDA these are real `torch.cuda.Stream`/`Event`. On CPU a worker thread per
stream runs submitted copies in order and an event completes when the worker
passes it, so "rank 1's H2D stream is 30 ms late" means the same on both, and
`Event.query()` is as rank-local as it is on a GPU.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable

import torch

from engine.lab.seams import SEAMS

EVENT_WAIT_TIMEOUT_S = 120.0  # a copy that never completes is a bug, not a wait


class CpuEvent:
    def __init__(self) -> None:
        self._done = threading.Event()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        if not self._done.wait(EVENT_WAIT_TIMEOUT_S):
            raise TimeoutError("copy stream event did not complete")


class DoneEvent:
    """An event that has already completed (nothing was submitted)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class CpuStream:
    """Runs submitted work in submission order on one worker thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"stream-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            item()

    def submit_copy(self, fn: Callable[[], None]) -> None:
        delay = SEAMS.copy_delay_ms(self.name)  # a fault: this rank's copies start late

        def op() -> None:
            if delay:
                time.sleep(delay / 1000.0)
            fn()

        self._queue.put(op)

    def record_event(self) -> CpuEvent:
        ev = CpuEvent()
        self._queue.put(ev._done.set)
        return ev

    def wait_event(self, ev) -> None:
        self._queue.put(ev.synchronize)

    def synchronize(self) -> None:
        self.record_event().synchronize()

    def close(self) -> None:
        self._queue.put(None)


class CudaStream:
    """A real CUDA stream; copies are enqueued at once and run asynchronously."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.stream = torch.cuda.Stream(device=device)
        self.index = device.index if device.index is not None else torch.cuda.current_device()

    def submit_copy(self, fn: Callable[[], None]) -> None:
        # Copies read pages the forward just wrote / write pages it just released.
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        delay = SEAMS.copy_delay_ms(self.name)  # a fault: the copy starts late on the GPU
        with torch.cuda.stream(self.stream):
            if delay:
                torch.cuda._sleep(int(delay * sleep_cycles_per_ms(self.index)))
            fn()

    def record_event(self):
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def wait_event(self, ev) -> None:
        self.stream.wait_event(ev)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        pass


@functools.cache
def sleep_cycles_per_ms(device_index: int) -> float:
    """torch.cuda._sleep spins for GPU clock cycles, and the clock differs by GPU and
    clock state, so time one known spin with CUDA events, once per device."""
    cycles = 20_000_000  # ~10 ms at 2 GHz: long enough to time, short enough at start
    with torch.cuda.device(device_index):
        torch.cuda._sleep(cycles // 10)  # warm-up (first launch, clock ramp)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / max(start.elapsed_time(end), 1e-3)


class TimedEvent:
    """Completes `delay_ms` after its base event does (the free-delay fault)."""

    def __init__(self, base, delay_ms: float) -> None:
        self.base = base
        self.delay_s = delay_ms / 1000.0
        self.created = time.monotonic()

    def query(self) -> bool:
        return self.base.query() and time.monotonic() >= self.created + self.delay_s

    def synchronize(self) -> None:
        self.base.synchronize()
        left = self.created + self.delay_s - time.monotonic()
        if left > 0:
            time.sleep(left)


def wall_clock() -> float:
    """This rank's wall clock, as read by wall-clock bookkeeping (the wall-clock LRU, waiting
    timeouts). hctool's clock faults act on `time` itself, so they reach this too."""
    return time.time()


def make_stream(name: str, device: torch.device):
    return CudaStream(name, device) if device.type == "cuda" else CpuStream(name)


def compute_wait(event) -> None:
    """Make the compute side wait for a copy: a stream wait on CUDA, a blocking
    wait on CPU (the forward runs on the calling thread)."""
    if isinstance(event, (CpuEvent, DoneEvent, TimedEvent)):
        event.synchronize()
    else:
        torch.cuda.current_stream().wait_event(event)
