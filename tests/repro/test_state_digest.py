"""--state-digest in one process: identical replicated state digests identically on
every "rank"; a reordered wall-clock LRU does not, and hctool names the field."""

from __future__ import annotations

import pytest
import torch

from engine.lab.seams import SEAMS
from engine.lab.snapshot import cache_state
from engine.lab.variants import Variants
from engine.managers.state_digest import StateDigest
from engine.mem_cache.cache_factory import create_tree_cache, host_pool_pages
from engine.mem_cache.memory_pool import KVPool, PagedAllocator
from engine.server_args import ServerArgs
from hctool.repro.state import find_state_divergence

P = 16
PROMPTS = [[7] * 32 + [i] * 16 for i in range(1, 5)]


def _tree(args: ServerArgs):
    cfg = args.model
    pages = args.max_total_tokens // P
    allocator = PagedAllocator(pages, P, "device")
    pool = KVPool(pages, P, cfg.num_layers, cfg.num_heads, cfg.head_dim, torch.device("cpu"))
    return create_tree_cache(args, allocator, pool, None, None, 0, 1, torch.device("cpu"))


def _rank(args, order):
    tree = _tree(args)
    for ids in PROMPTS:
        tree.insert(ids, tree.alloc_pages(len(ids) // P))
    for i in order:  # the accesses of one tick, stamped in this order
        tree.match_prefix(PROMPTS[i])
    return tree


def test_same_state_same_digest_and_a_reordered_lru_is_named(tmp_path, monkeypatch):
    logical = ServerArgs(enable_hierarchical_cache=True, max_total_tokens=1024, state_digest=True)
    a, b = _rank(logical, [0, 1, 2, 3]), _rank(logical, [0, 1, 2, 3])
    da, db = StateDigest(str(tmp_path / "x"), 0), StateDigest(str(tmp_path / "x"), 1)
    assert da.digest(cache_state(a)[0]) == db.digest(cache_state(b)[0])

    wall = ServerArgs(
        enable_hierarchical_cache=True, max_total_tokens=1024, variants=Variants(lru_clock="wall"), state_digest=True
    )
    a = _rank(wall, [0, 1, 2, 3])
    b = _rank(wall, [0, 2, 1, 3])  # rank 1's noisy clock ordered two accesses the other way
    da, db = StateDigest(str(tmp_path), 0), StateDigest(str(tmp_path), 1)
    assert da.digest(cache_state(a)[0]) != db.digest(cache_state(b)[0])
    da.dump(7), db.dump(7)
    sd = find_state_divergence(tmp_path / "state")
    assert sd["field"].startswith("lru_order[") and sd["differing_fields"] == ["lru_order"] and sd["tick"] == 7
    for t in (a, b):
        t.close()


def test_state_digest_needs_the_host_tier_and_faults_shrink_the_host_pool(monkeypatch):
    with pytest.raises(ValueError, match="--state-digest needs --enable-hierarchical-cache"):
        ServerArgs(state_digest=True)
    args = ServerArgs(enable_hierarchical_cache=True, max_total_tokens=1024)
    pool = KVPool(4, P, args.model.num_layers, args.model.num_heads, args.model.head_dim, torch.device("cpu"))
    full = host_pool_pages(args, pool)
    SEAMS.install(host_pool_pages=lambda pages: pages - 1)
    try:
        assert host_pool_pages(args, pool) == full - 1
    finally:
        SEAMS.reset()
