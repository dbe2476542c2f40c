"""SGLang: srt/managers/cache_controller.py.

HiCacheController: the copy engine between L1 (device) and L2 (host).

`write()`/`load()` queue copies; `start_writing()`/`start_loading()` submit them
on the D2H/H2D stream and append an ack (with the copy's event) to
`ack_write_queue`/`ack_load_queue`. Whether an ack is ready is rank-local
(`event.query()`, counted by `ready_counts()`); how many acks every rank pops
(`pop_acks(kind, n)`) is agreed by the packed MIN all_reduce in
`HiRadixCache.check_hicache_events`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from engine import page_transfer, streams
from engine.mem_cache.memory_pool import KVPool, copy_pages


@dataclass
class CacheOperation:
    src_pages: list[int]
    dst_pages: list[int]
    nodes: list = field(default_factory=list)


@dataclass
class Ack:
    event: object
    nodes: list
    tokens: int


class LayerDoneCounter:
    """A ring of `num_counters` producer slots, each holding one event per layer of
    the load-back it carries; the forward waits on its slot's layer events."""

    def __init__(self, num_layers: int, num_counters: int = 3):
        self.num_layers = num_layers
        self.num_counters = num_counters
        self.events: list[list | None] = [None] * num_counters
        self.producer_index = -1

    def next_producer(self) -> int:
        self.producer_index = (self.producer_index + 1) % self.num_counters
        old = self.events[self.producer_index]
        if old is not None:  # slot reuse: its previous load must be finished
            old[-1].synchronize()
        return self.producer_index

    def wait_until(self, consumer_index: int, layer: int) -> None:
        if consumer_index < 0:
            return
        streams.compute_wait(self.events[consumer_index][layer])


class HiCacheController:
    def __init__(self, device_pool: KVPool, host_pool: KVPool, device: torch.device, num_counters: int = 3):
        self.device_pool, self.host_pool = device_pool, host_pool
        self.write_stream = streams.make_stream("d2h", device)
        self.load_stream = streams.make_stream("h2d", device)
        self.write_queue: list[CacheOperation] = []
        self.load_queue: list[CacheOperation] = []
        self.ack_write_queue: deque[Ack] = deque()
        self.ack_load_queue: deque[Ack] = deque()
        self.layer_done_counter = LayerDoneCounter(device_pool.num_layers, num_counters)
        page_transfer.warm_up(device_pool, host_pool)  # no compile stall at the first load-back

    # -- device -> host ---------------------------------------------------------------
    def write(self, device_pages: list[int], host_pages: list[int], node) -> None:
        self.write_queue.append(CacheOperation(device_pages, host_pages, [node]))

    def start_writing(self) -> object | None:
        """Submit all queued writes as one copy; returns its finish event."""
        if not self.write_queue:
            return None
        ops, self.write_queue = self.write_queue, []
        src = [p for op in ops for p in op.src_pages]
        dst = [p for op in ops for p in op.dst_pages]
        self.write_stream.submit_copy(lambda: copy_pages(self.device_pool, self.host_pool, src, dst))
        event = self.write_stream.record_event()
        nodes = [n for op in ops for n in op.nodes]
        self.ack_write_queue.append(Ack(event, nodes, len(src) * self.device_pool.page_size))
        return event

    # -- host -> device ---------------------------------------------------------------
    def load(self, host_pages: list[int], device_pages: list[int], node) -> None:
        self.load_queue.append(CacheOperation(host_pages, device_pages, [node]))

    def start_loading(self) -> int:
        """Submit queued loads layer by layer into the next producer slot; returns the
        slot the forward must wait on, or -1 when nothing was queued."""
        if not self.load_queue:
            return -1
        ops, self.load_queue = self.load_queue, []
        src = [p for op in ops for p in op.src_pages]
        dst = [p for op in ops for p in op.dst_pages]
        slot = self.layer_done_counter.next_producer()
        events = []
        for layer in range(self.device_pool.num_layers):
            self.load_stream.submit_copy(
                lambda layer=layer: copy_pages(self.host_pool, self.device_pool, src, dst, layer=layer)
            )
            events.append(self.load_stream.record_event())
        self.layer_done_counter.events[slot] = events
        nodes = [n for op in ops for n in op.nodes]
        self.ack_load_queue.append(Ack(events[-1], nodes, len(src) * self.device_pool.page_size))
        return slot

    # -- acks -------------------------------------------------------------------------
    def ready_counts(self) -> tuple[int, int]:
        """(write, load) acks whose copies finished on this rank (rank-local: the
        cache agrees on them before popping)."""
        return self._ready(self.ack_write_queue), self._ready(self.ack_load_queue)

    def pop_acks(self, kind: str, n: int) -> list[Ack]:
        """Pop the agreed number of `kind` ("write" or "load") acks; every rank pops the same n."""
        queue = {"write": self.ack_write_queue, "load": self.ack_load_queue}[kind]
        out = []
        for _ in range(n):
            ack = queue.popleft()
            ack.event.synchronize()
            out.append(ack)
        return out

    @staticmethod
    def _ready(queue: deque[Ack]) -> int:
        """Leading acks whose copy finished on this rank."""
        n = 0
        for ack in queue:
            if not ack.event.query():
                break
            n += 1
        return n

    def synchronize(self) -> None:
        """Wait for every submitted copy on this rank (flush, before pages are freed)."""
        self.write_stream.synchronize()
        self.load_stream.synchronize()

    def close(self) -> None:
        self.write_stream.close()
        self.load_stream.close()
