"""SGLang: srt/mem_cache/base_prefix_cache.py.

What the scheduler may ask of a prefix cache. The HiCache hooks are no-ops
here, so the scheduler calls them unconditionally and never asks which cache it
has; `HiRadixCache` overrides them. The storage-prefetch polls (`check_prefetch_progress`
and its variants) exist on HiRadixCache only: as in SGLang, admission asks them only when
a storage tier is configured (`enable_hicache_storage`). Every method that mutates the tree must be
called at the same point of the replicated schedule on every rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable


class BasePrefixCache(ABC):
    def __init__(self) -> None:
        # Cumulative counters behind /metrics; tiers a cache lacks stay 0.
        self.evicted_tokens_total = 0
        self.load_back_tokens_total = 0
        self.backup_tokens_total = 0
        self.prefetched_tokens_total = 0
        self.storage_corrupt_pages = 0  # most L3 pages any rank found damaged (agreed each tick)
        self.storage_writes_enabled = False  # L3 writes on (a storage backend that has not failed)
        self.ongoing_prefetch: dict = {}  # rid -> live storage prefetch (insertion order is replicated)

    # -- the radix interface ---------------------------------------------------------
    @abstractmethod
    def match_prefix(self, key): ...
    @abstractmethod
    def peek_prefix(self, key) -> tuple[int, int, int]: ...
    @abstractmethod
    def insert(self, key, pages: list[int]): ...
    @abstractmethod
    def inc_lock_ref(self, node) -> None: ...
    @abstractmethod
    def dec_lock_ref(self, node) -> None: ...
    @abstractmethod
    def evict(self, num_tokens: int) -> int: ...
    @abstractmethod
    def evictable_size(self) -> int: ...
    @abstractmethod
    def alloc_pages(self, num_pages: int) -> list[int] | None: ...
    @abstractmethod
    def check_integrity(self, pages_in_use: int) -> None: ...
    @abstractmethod
    def flush(self) -> None:
        """Mutates: everything. Callers ensure no request is running or waiting."""

    # -- HiCache hooks (no-ops without the host tier) ----------------------------------
    def check_hicache_events(self, state_digest: int = 0) -> None:  # noqa: B027  (an optional hook: the base cache has no events)
        """Once per tick on every rank: apply the agreed copy / IO completions (and
        agree on the scheduler's state digest, --state-digest)."""

    def init_load_back(self, last_host_node, extra_pages: int = 0):
        """Load a host-only prefix back to L1; a cache without a host tier never
        reports a host hit, so this is never reached there."""
        raise NotImplementedError(f"{type(self).__name__} has no host tier")

    def should_load_back(self, device_node, pages: int) -> bool:
        """Whether a host hit of `pages` (plus the request's own) is loaded back."""
        return True

    def ready_to_load_host_cache(self) -> Callable[[int], None] | None:
        """Start the queued load-backs; returns the forward's per-layer wait, if any."""
        return None

    def prefetch_kvcache(self, rid: str, key) -> None:  # noqa: B027  (optional: no tier to prefetch from)
        """Start fetching the prefix of a new request from storage (L3 -> L2)."""

    def pop_prefetched_tokens(self, rid: str) -> int:
        """Tokens `rid`'s storage prefetch put in the tree (0 after the first call)."""
        return 0

    def close(self) -> None:  # noqa: B027  (optional: nothing to release)
        """Stop copy streams and IO threads."""
