"""The bulk-variant stall of issue #12, in-process on the real HiRadixCache
(TP=1, a gloo world of one): every device node counted by evictable_size()
must be freeable by evict(). A node whose write-through backup failed (host
full) must never end up above host-only children, or it is counted evictable
forever and admission (budget = free + evictable) admits requests that
_prepare_extend can never place: waiting > 0, running 0, nothing changes."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from engine.mem_cache.hiradix_cache import HiRadixCache
from engine.mem_cache.memory_pool import KVPool, PagedAllocator
from engine.server_args import ServerArgs
from hctool.supervise.procs import free_port

PAGE = 16


@pytest.fixture(scope="module")
def group():
    created = not dist.is_initialized()
    if created:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield dist.new_group(backend="gloo")
    if created:
        dist.destroy_process_group()


def _tree(group, device_pages=8, host_pages=4):
    args = ServerArgs(
        page_size=PAGE,
        max_total_tokens=device_pages * PAGE,
        enable_hierarchical_cache=True,
        hicache_write_policy="write_through",
    )
    cfg = args.model
    pool = KVPool(device_pages, PAGE, cfg.num_layers, cfg.num_heads, cfg.head_dim, torch.device("cpu"))
    host = KVPool(host_pages, PAGE, cfg.num_layers, cfg.num_heads, cfg.head_dim, torch.device("cpu"))
    return HiRadixCache(
        args,
        PagedAllocator(device_pages, PAGE, "device"),
        pool,
        host,
        PagedAllocator(host_pages, PAGE, "host"),
        group,
        torch.device("cpu"),
    )


def _settle(tree):
    deadline = time.monotonic() + 30
    while tree.cache_controller.ack_write_queue:
        tree.check_hicache_events()
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_everything_counted_evictable_can_be_evicted(group):
    tree = _tree(group)
    try:
        key = list(range(1, 4 * PAGE + 1))
        reserved = tree.host_allocator.alloc(4)  # the host pool is full (prefetches hold it)
        tree.insert(key[: 2 * PAGE], tree.alloc_pages(2))  # hot prefix: its backup fails
        tree.host_allocator.free(reserved)  # the prefetches end
        res = tree.insert(key, tree.alloc_pages(4))  # a longer prompt through the prefix
        tree.allocator.free(res.duplicate_pages)
        _settle(tree)
        counted = tree.evictable_size()
        freed = tree.evict(10**6)
        assert freed == counted and tree.evictable_size() == 0, (
            f"evictable_size() counted {counted} tokens, evict() freed {freed}; "
            f"{tree.evictable_size()} tokens are counted evictable and can never be freed"
        )
        tree.check_integrity(0)
    finally:
        tree.cache_controller.close()
