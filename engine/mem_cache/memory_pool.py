"""SGLang: srt/mem_cache/memory_pool.py (+ allocator.py, memory_pool_host.py: the host pool is a KVPool on CPU).

L1 and L2 memory: request slots, paged KV pools and their allocators.

Device frees may be deferred until a copy's event completes (a page being read
by a D2H copy must not be reused). So the device allocator has two counts:
`available_size()` (pages free *now*: rank-local, drifts with copy timing, like
a GPU's) and `logical_available_size()` (free + pending frees: the same on every
rank, because every alloc and free happens at the same point of the replicated
schedule). Decisions that mutate replicated state must use the logical count.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from engine import page_transfer, streams
from engine.lab.seams import SEAMS

PENDING_FREE_TIMEOUT_S = 120.0


class ReqToTokenPool:
    """Request slots; row r maps a request's positions to L1 token slots."""

    def __init__(self, size: int, max_context_len: int, device: torch.device):
        self.size = size
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.long, device=device)
        self.free_slots = list(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        return self.free_slots.pop(0) if self.free_slots else None

    def free(self, slot: int) -> None:
        self.free_slots.append(slot)


class PagedAllocator:
    """Whole-page allocator. Mutates only its free list and pending-free queue."""

    def __init__(self, num_pages: int, page_size: int, name: str):
        self.num_pages, self.page_size, self.name = num_pages, page_size, name
        self.free_pages: deque[int] = deque(range(num_pages))
        self.pending: deque[tuple[object, list[int]]] = deque()  # (event, pages)
        self.pending_pages = 0

    # -- counts -------------------------------------------------------------------
    def _collect(self) -> None:
        """Return pages whose copy has finished (rank-local timing)."""
        kept: deque = deque()
        while self.pending:
            ev, pages = self.pending.popleft()
            if ev.query():
                self.free_pages.extend(pages)
                self.pending_pages -= len(pages)
            else:
                kept.append((ev, pages))
        self.pending = kept

    def available_size(self) -> int:
        """Tokens allocatable right now on this rank (may lag other ranks)."""
        self._collect()
        return len(self.free_pages) * self.page_size

    def logical_available_size(self) -> int:
        """Tokens free once in-flight copies finish; identical on every rank."""
        return (len(self.free_pages) + self.pending_pages) * self.page_size

    # -- mutation -------------------------------------------------------------------
    def alloc(self, num_pages: int) -> list[int] | None:
        """Take pages, waiting for pending frees if needed; None if even the logical
        count is too small (the caller must evict first)."""
        if num_pages > len(self.free_pages) + self.pending_pages:
            return None
        deadline = time.monotonic() + PENDING_FREE_TIMEOUT_S
        while len(self.free_pages) < num_pages:
            self._collect()
            if len(self.free_pages) >= num_pages:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: pending frees did not complete in time")
            self.pending[0][0].synchronize()
        return [self.free_pages.popleft() for _ in range(num_pages)]

    def free(self, pages: list[int], after=None) -> None:
        """Free pages now, or once `after` (an event) completes."""
        if not pages:
            return
        delay = SEAMS.free_delay_ms() if self.name == "device" else 0.0  # a fault: frees lag on this rank
        if delay:
            after = streams.TimedEvent(after or streams.DoneEvent(), delay)
        if after is None:
            self.free_pages.extend(pages)
        else:
            self.pending.append((after, list(pages)))
            self.pending_pages += len(pages)


class KVPool:
    """Per-layer K and V buffers of `num_pages * page_size` token slots."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_layers: int,
        heads: int,
        head_dim: int,
        device: torch.device,
        pin_memory: bool = False,
    ):
        slots = num_pages * page_size
        shape = (num_layers, slots, heads, head_dim)
        self.k_buffer = torch.zeros(shape, dtype=torch.float32, device=device, pin_memory=pin_memory)
        self.v_buffer = torch.zeros(shape, dtype=torch.float32, device=device, pin_memory=pin_memory)
        self.page_size = page_size
        self.num_layers = num_layers

    def page_bytes(self) -> int:
        per_token = self.k_buffer[0, 0].numel() * self.k_buffer.element_size()
        return 2 * self.num_layers * per_token * self.page_size

    def page_slots(self, pages: list[int]) -> torch.Tensor:
        p = self.page_size
        base = torch.tensor(pages, dtype=torch.long)[:, None] * p
        return (base + torch.arange(p)[None, :]).reshape(-1)

    def read_page(self, page: int) -> torch.Tensor:
        """One page of every layer as [2, layers, page_size, heads, head_dim] (for L3)."""
        s = slice(page * self.page_size, (page + 1) * self.page_size)
        return torch.stack([self.k_buffer[:, s], self.v_buffer[:, s]]).cpu()

    def write_page(self, page: int, data: torch.Tensor) -> None:
        s = slice(page * self.page_size, (page + 1) * self.page_size)
        self.k_buffer[:, s].copy_(data[0])
        self.v_buffer[:, s].copy_(data[1])


def page_runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """Merge (src, dst) page pairs into runs (src_start, dst_start, length) so a copy
    moves contiguous blocks instead of single pages."""
    runs: list[list[int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1][2] += 1
        else:
            runs.append([s, d, 1])
    return [tuple(r) for r in runs]


def copy_pages(src: KVPool, dst: KVPool, src_pages: list[int], dst_pages: list[int], layer: int | None = None) -> None:
    """Copy whole pages (all layers, or one layer) from one pool to another: host<->device
    pages in short runs by one kernel launch (engine/page_transfer.py), else run by run."""
    if page_transfer.transfer_pages(src, dst, src_pages, dst_pages, layer):
        return
    p = src.page_size
    layers = range(src.num_layers) if layer is None else (layer,)
    for s, d, n in page_runs(src_pages, dst_pages):
        ss, ds = slice(s * p, (s + n) * p), slice(d * p, (d + n) * p)
        for li in layers:
            dst.k_buffer[li, ds].copy_(src.k_buffer[li, ss], non_blocking=True)
            dst.v_buffer[li, ds].copy_(src.v_buffer[li, ss], non_blocking=True)
