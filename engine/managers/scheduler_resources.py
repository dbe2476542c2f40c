"""SGLang: srt/managers/schedule_batch.py (prepare_for_extend) and the cache_*_req of srt/mem_cache/radix_cache.py.

A request's resources: its req_to_token row, its own L1 pages and its lock on
the tree's prefix; taken at prefill, grown by decode, handed to the tree when it
finishes, given back when it is retracted. Every decision here reads logical
(replicated) counts, so every rank takes and frees the same pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.managers.schedule_batch import Req
from engine.managers.schedule_policy import ceil_pages
from engine.mem_cache.base_prefix_cache import BasePrefixCache
from engine.model_executor.model import ForwardItem
from engine.model_executor.model_runner import ModelRunner


@dataclass
class TokenCounters:
    """Cumulative totals behind /metrics (replicated; rank 0 reports them)."""

    cached_tokens: dict = field(default_factory=lambda: {"device": 0, "host": 0, "storage": 0})
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0


class ReqResources:
    def __init__(self, runner: ModelRunner, tree_cache: BasePrefixCache, page_size: int, counters: TokenCounters):
        self.runner, self.tree_cache, self.page_size, self.counters = runner, tree_cache, page_size, counters
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.token_to_kv_pool_allocator

    def prepare_extend(self, req: Req) -> ForwardItem | None:
        """Mutates: tree (match, load-back, locks), allocators, req. None when L1 has no
        room even after eviction (a replicated decision: logical counts)."""
        tree, p = self.tree_cache, self.page_size
        fill = req.fill_ids
        m = tree.match_prefix(fill[:-1])
        prefix_pages, last, host_tokens = list(m.device_pages), m.last_device_node, 0
        if m.host_hit_length and tree.should_load_back(last, ceil_pages(len(fill), p) - len(prefix_pages)):
            loaded = tree.init_load_back(
                m.last_host_node, ceil_pages(len(fill), p) - len(prefix_pages) - m.host_hit_length // p
            )
            if loaded is None:
                return None
            chain, own = loaded
            prefix_pages += [pg for n in chain for pg in n.value]
            last, host_tokens = m.last_host_node, m.host_hit_length
            tree.inc_lock_ref(last)  # the loaded nodes stay until this request ends
        else:
            tree.inc_lock_ref(last)
            own = tree.alloc_pages(ceil_pages(len(fill), p) - len(prefix_pages))
            if own is None:
                tree.dec_lock_ref(last)
                return None
        req.req_pool_idx = self.req_to_token_pool.alloc()
        req.pages, req.tree_pages, req.last_node = prefix_pages + own, len(prefix_pages), last
        self.runner.write_req_to_token(req.req_pool_idx, req.pages)
        prefix_len = len(prefix_pages) * p
        if req.cached is None:
            storage = min(tree.pop_prefetched_tokens(req.rid), host_tokens)
            req.cached = {"device": prefix_len - host_tokens, "host": host_tokens - storage, "storage": storage}
            for k, v in req.cached.items():
                self.counters.cached_tokens[k] += v
        return ForwardItem(fill[prefix_len:], prefix_len, self.runner.token_slots(req.req_pool_idx, len(fill)))

    def cache_unfinished_req(self, req: Req) -> None:
        """Insert the request's prefilled KV so later requests share it; the request
        then reads the tree's pages (duplicates of them are freed)."""
        tree = self.tree_cache
        key = req.fill_ids[: req.kv_len]
        res = tree.insert(key, req.pages)
        self.allocator.free(res.duplicate_pages)
        m = tree.match_prefix(key)
        aligned = len(m.device_pages)
        req.pages[:aligned] = m.device_pages
        tree.inc_lock_ref(m.last_device_node)
        tree.dec_lock_ref(req.last_node)
        req.last_node, req.tree_pages = m.last_device_node, aligned
        self.runner.write_req_to_token(req.req_pool_idx, req.pages)

    def cache_finished_req(self, req: Req) -> None:
        """Mutates: tree (insert), allocator, req pool: the request's KV goes to the tree."""
        tree = self.tree_cache
        key = req.fill_ids[: req.kv_len]
        aligned = req.kv_len // self.page_size
        res = tree.insert(key, req.pages)
        self.allocator.free(res.duplicate_pages + req.pages[max(aligned, req.tree_pages) :])
        tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)

    def grow_for_decode(self, req: Req) -> bool:
        """Mutates: gives req one more L1 page when its next token starts a page;
        False when there is no room even after eviction."""
        if req.kv_len // self.page_size < len(req.pages):
            return True
        page = self.tree_cache.alloc_pages(1)
        if page is None:
            return False
        req.pages.extend(page)
        self.runner.write_req_to_token(req.req_pool_idx, req.pages)
        return True

    def release_retracted(self, req: Req) -> None:
        """Mutates: frees the request's own pages and lock; it restarts from its fill ids."""
        self.allocator.free(req.pages[req.tree_pages :])
        self.tree_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.pages, req.tree_pages, req.last_node, req.kv_len, req.req_pool_idx = [], 0, None, 0, None

    def reserved_decode_tokens(self, running: list[Req]) -> int:
        p = self.page_size
        return sum(ceil_pages(r.kv_len + r.remaining_tokens, p) * p - len(r.pages) * p for r in running)

    @staticmethod
    def pages_in_use(running: list[Req]) -> int:
        return sum(len(r.pages) - r.tree_pages for r in running)
